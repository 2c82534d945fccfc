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
(nova.conf, then nova-compute.conf) lack one of those settings. Nothing here
imports ops.
"""

from __future__ import annotations

import logging
from typing import Callable, Iterable, List, Mapping, Optional

from . import facts, principalconf
from .errors import HostReadError, PrincipalConfigError

log = logging.getLogger(__name__)

CEILOMETER_PACKAGE = facts.NEIGHBOURS[0]  # ceilometer-agent-compute: what ceilometer-agent installs
# What ceilometer-agent sends for nova.conf's [DEFAULT] (charm-ceilometer-agent,
# hooks/ceilometer_utils.py NOVA_SETTINGS), in its order.
CEILOMETER_SETTINGS = (("instance_usage_audit", "True"), ("instance_usage_audit_period", "hour"),
                       ("notify_on_state_change", "vm_and_task_state"))
CEILOMETER_FLAGS = ",".join(f"{key}={value}" for key, value in CEILOMETER_SETTINGS)
PACKAGES = facts.NEIGHBOURS  # read from dpkg with the host's other facts


def ceilometer_missing(conf: Optional[principalconf.Files]) -> List[str]:
    """ceilometer-agent's [DEFAULT] keys the principal's files lack (all of them without nova.conf)."""
    present = {key for _, parsed in conf or [] for key in parsed.get("DEFAULT", {})}
    return [key for key, _ in CEILOMETER_SETTINGS if key not in present]


def notes(installed: Iterable[str], publishing: bool, principal: str,
          load: Callable[[], Optional[principalconf.Files]] = principalconf.load) -> List[str]:
    """Active-status notes for neighbours that lost settings; each is logged with the workaround.

    ``installed``: the names of the installed packages among :data:`PACKAGES`;
    ``publishing``: this unit publishes non-empty sections; ``principal``:
    the principal application's name; ``load``: reads the principal's files
    (the charm passes its per-dispatch reading, shared with the check of the
    principal's [pci] rules). nova.conf is read only when ceilometer-agent is
    installed and this unit publishes.
    """
    if CEILOMETER_PACKAGE not in set(installed) or not publishing:
        return []
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


def installed_of(packages: Mapping[str, object]) -> List[str]:
    """The neighbours' packages dpkg reports installed (``packages``: dpkg.Package by name)."""
    return [name for name in PACKAGES
            if getattr(packages.get(name), "installed", False)]
