"""What nova-compute's other subordinates lose in nova.conf beside this unit.

charm-nova-compute renders nova.conf from one ``SubordinateConfigContext``
for ``nova-ceilometer`` and ``ephemeral-backend`` and, after it, a second one
for ``nova-vgpu`` (``hooks/nova_compute_utils.py``). charmhelpers merges
contexts with ``dict.update`` (``OSConfigTemplate.context``), and a
subordinate context that found sections returns ``{'sections': ...}``: once
this unit publishes sections, ceilometer-agent's are replaced by ours, and
nova.conf loses its ``[DEFAULT]`` settings (``instance_usage_audit``,
``instance_usage_audit_period``, ``notify_on_state_change``; charm-ceilometer-
agent's ``NOVA_SETTINGS``). Publishing nothing leaves them. The fix belongs
in charm-nova-compute (one context for the three interfaces); until then the
operator is told, and can put them back through nova-compute's
``config-flags``, which its template renders in the same ``[DEFAULT]``.

The loss is reported only when it happened: ceilometer-agent's package is on
the host, this unit publishes sections, and the principal's rendered files
(nova.conf, then nova-compute.conf) lack one of those settings.

The neutron plugin's context (``NeutronPluginSubordinateConfigContext``,
hooks/nova_compute_context.py) comes first in the same list and returns
``sections`` too, so a plugin subordinate that sends nova.conf settings loses
them the same way, as does an ephemeral backend. Which subordinates share the
machine is read from Juju's own agent directories
(``/var/lib/juju/agents/unit-*/charm/metadata.yaml``: only that file of each
unit, never its agent.conf): a charm that provides ``ephemeral-backend`` sends
nova.conf settings by that interface's purpose, and is named while this unit
publishes; of the ``neutron-plugin`` providers only contrail-openstack is
known to send any (:data:`PLUGIN_SENDERS`), and it is named once nova.conf
lacks the setting it always sends. What other plugins send cannot be told
from the host: they are not named (docs/explanation/neighbours.md). Nothing
here imports ops.
"""

from __future__ import annotations

import logging
from typing import Callable, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from . import facts, hostroot, principalconf
from .errors import HostReadError, PrincipalConfigError
from .record import NamedTuple

log = logging.getLogger(__name__)

CEILOMETER_PACKAGE = facts.NEIGHBOURS[0]  # ceilometer-agent-compute: what ceilometer-agent installs
# What ceilometer-agent sends for nova.conf's [DEFAULT] (charm-ceilometer-agent,
# hooks/ceilometer_utils.py NOVA_SETTINGS), in its order.
CEILOMETER_SETTINGS = (("instance_usage_audit", "True"), ("instance_usage_audit_period", "hour"),
                       ("notify_on_state_change", "vm_and_task_state"))
CEILOMETER_FLAGS = ",".join(f"{key}={value}" for key, value in CEILOMETER_SETTINGS)
PACKAGES = facts.NEIGHBOURS  # read from dpkg with the host's other facts

AGENTS = "var/lib/juju/agents"  # unit-<app>-<n>/charm/metadata.yaml: each unit on the machine
METADATA_LIMIT = 1 << 16  # bytes of one charm's metadata.yaml read
MAX_UNITS = 64  # agent directories looked into, at most
EPHEMERAL = "ephemeral-backend"
PLUGIN = "neutron-plugin"
# neutron-plugin subordinates known to send nova.conf settings: charm name -> (the [DEFAULT]
# setting it always sends, what the note says). contrail-openstack: tungstenfabric/tf-charms,
# contrail-openstack/hooks/contrail_openstack_hooks.py (_notify_nova).
PLUGIN_SENDERS = {
    "contrail-openstack": (("firewall_driver", "nova.virt.firewall.NoopFirewallDriver"),
                           "with DPDK also [CONTRAIL] use_userspace_vhost and [libvirt] "
                           "use_huge_pages, which no option of {principal} puts back"),
}


class Neighbour(NamedTuple):
    """Another unit on this machine, as its charm's metadata.yaml describes it."""

    unit: str  # its agent directory's name without ``unit-``: scaleio-openstack-1
    charm: str  # metadata.yaml's name
    provides: FrozenSet[str]  # the interfaces it provides


def ceilometer_missing(conf: Optional[principalconf.Files]) -> List[str]:
    """ceilometer-agent's [DEFAULT] keys the principal's files lack (all of them without nova.conf)."""
    present = {key for _, parsed in conf or [] for key in parsed.get("DEFAULT", {})}
    return [key for key, _ in CEILOMETER_SETTINGS if key not in present]


def notes(installed: Iterable[str], publishing: bool, principal: str,
          load: Callable[[], Optional[principalconf.Files]] = principalconf.load,
          units: Callable[[], List[Neighbour]] = lambda: on_this_machine()) -> List[str]:
    """Active-status notes for neighbours that lost settings; each is logged with the workaround.

    ``installed``: the names of the installed packages among :data:`PACKAGES`;
    ``publishing``: this unit publishes non-empty sections; ``principal``:
    the principal application's name; ``load``: reads the principal's files
    (the charm passes its per-dispatch reading, shared with the check of the
    principal's [pci] rules); ``units``: the other units on this machine
    (:func:`on_this_machine`). Nothing is read unless this unit publishes;
    nova.conf only for a neighbour whose loss it can confirm.
    """
    if not publishing:
        return []
    out = []
    if CEILOMETER_PACKAGE in set(installed):
        out += _ceilometer(principal, load)
    for neighbour in units():
        if EPHEMERAL in neighbour.provides:
            out.append(_ephemeral(neighbour, principal))
        elif PLUGIN in neighbour.provides and neighbour.charm in PLUGIN_SENDERS:
            out += _plugin(neighbour, principal, load)
    return out


def _ceilometer(principal: str, load: Callable[[], Optional[principalconf.Files]]) -> List[str]:
    try:
        missing = ceilometer_missing(load())
    except (HostReadError, PrincipalConfigError) as error:
        log.warning("cannot tell whether ceilometer-agent's nova.conf settings are in force: %s",
                    error)
        return []
    if not missing:
        return []
    workaround = f"juju config {principal} config-flags={CEILOMETER_FLAGS}"
    log.warning(
        "ceilometer-agent's nova.conf settings (%s) are missing: %s renders only one "
        "subordinate's sections once this unit publishes its own (charmhelpers merges "
        "SubordinateConfigContexts with dict.update), so Nova sends no instance usage audit and "
        "no state-change notifications to ceilometer. Workaround: %s (add them to any flags "
        "already set); the fix belongs in charm-nova-compute", ", ".join(missing), principal,
        workaround)
    return [f"ceilometer-agent's nova.conf settings lost beside this unit's ({', '.join(missing)}): "
            f"{workaround}"]


def _plugin(neighbour: Neighbour, principal: str,
            load: Callable[[], Optional[principalconf.Files]]) -> List[str]:
    """A known neutron plugin's loss, once the principal's files lack what it always sends."""
    (key, value), more = PLUGIN_SENDERS[neighbour.charm]
    try:
        conf = load()
    except (HostReadError, PrincipalConfigError) as error:
        log.warning("cannot tell whether %s's nova.conf settings are in force: %s",
                    neighbour.charm, error)
        return []
    if any(key in parsed.get("DEFAULT", {}) for _, parsed in conf or []):
        return []
    workaround = f"juju config {principal} config-flags={key}={value}"
    log.warning(
        "%s (%s) is %s's neutron plugin and its nova.conf settings are missing (%s; %s): "
        "%s renders only one subordinate's sections once this unit publishes its own "
        "(charmhelpers merges SubordinateConfigContexts with dict.update). Workaround for "
        "[DEFAULT]: %s (add it to any flags already set); the fix belongs in "
        "charm-nova-compute", neighbour.charm, neighbour.unit, principal, key,
        more.format(principal=principal), principal, workaround)
    return [f"{neighbour.charm}'s nova.conf settings lost beside this unit's ({key}; "
            f"{more.format(principal=principal)}): {workaround}"]


def _ephemeral(neighbour: Neighbour, principal: str) -> str:
    """An ephemeral backend's loss: what it sends cannot be known, only that it sends some."""
    log.warning(
        "%s (%s) provides ephemeral-backend, whose nova.conf settings %s drops while this unit "
        "publishes its own (charmhelpers merges SubordinateConfigContexts with dict.update): "
        "instances' disks may not go to that backend. Only %s's own options put any back "
        "(libvirt-image-backend for images_type, config-flags for [DEFAULT]); the fix belongs "
        "in charm-nova-compute", neighbour.charm, neighbour.unit, principal, principal)
    return (f"{neighbour.charm}'s nova.conf settings lost beside this unit's (it provides "
            f"{EPHEMERAL}; {principal} renders one subordinate's sections): only {principal}'s "
            "own options put any back (libvirt-image-backend, config-flags)")


def on_this_machine() -> List[Neighbour]:
    """The units on this machine whose charm's metadata.yaml can be read (none: [])."""
    try:
        listed = hostroot.listdir(hostroot.text_path(AGENTS)) or []
    except HostReadError as error:
        log.warning("cannot tell which units share this machine: %s", error)
        return []
    out = []
    for name in sorted(n for n in listed if n.startswith("unit-"))[:MAX_UNITS]:
        try:
            text = hostroot.read_text(hostroot.text_path(AGENTS, name, "charm", "metadata.yaml"),
                                      limit=METADATA_LIMIT)
        except HostReadError as error:
            log.warning("cannot tell which charm %s runs: %s", name, error)
            continue
        charm, provides = metadata(text or "")
        if charm:
            out.append(Neighbour(name.removeprefix("unit-"), charm, provides))
    return out


def metadata(text: str) -> Tuple[str, FrozenSet[str]]:
    """(name, provided interfaces) of a charm's metadata.yaml, written in YAML's block style.

    Read line by line, not parsed (no YAML library on every hook): a top-level
    ``name:``, and each ``interface:`` under the top-level ``provides:``.
    What it cannot read this way (flow style, anchors) names nothing.
    """
    name, provides, block = "", set(), ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        key, _, value = stripped.partition(":")
        value = value.split(" #", 1)[0].strip().strip("'\"")
        if not line[0].isspace():
            block = key
            if key == "name":
                name = value
        elif block == "provides" and key == "interface" and value:
            provides.add(value)
    return name, frozenset(provides)


def installed_of(packages: Mapping[str, object]) -> List[str]:
    """The neighbours' packages dpkg reports installed (``packages``: dpkg.Package by name)."""
    return [name for name in PACKAGES
            if getattr(packages.get(name), "installed", False)]
