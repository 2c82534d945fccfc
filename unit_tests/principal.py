"""Read this unit's relation data the way nova-compute does, with charmhelpers.

charm-nova-compute builds its nova.conf context with
``SubordinateConfigContext(interface=['nova-vgpu'], service=['nova-compute',
'nova'], config_file='/etc/nova/nova.conf')`` and asks
``get_subordinate_services()`` and ``get_subordinate_release_packages()``
for its pause/resume and upgrade actions. Those run charmhelpers' own code
here; only the Juju hook tools under them (relation-ids, relation-list,
relation-get, and the principal's metadata) answer from the test's data.
"""

import json
import sys
from contextlib import contextmanager
from typing import Mapping
from unittest import mock

import charmhelpers.osplatform


def _ubuntu() -> str:
    return "ubuntu"


def _import_as_on_ubuntu():
    """Import charmhelpers' OpenStack helpers as nova-compute does, on Ubuntu.

    charmhelpers.core.host refuses Debian (this machine, CI) at import time.
    ``get_platform`` answers "ubuntu" only while importing; afterwards it is
    charmhelpers' own again, in osplatform and in every module that took a
    copy of it, so no other test runs under the stand-in.
    """
    original = charmhelpers.osplatform.get_platform
    with mock.patch.object(charmhelpers.osplatform, "get_platform", _ubuntu):
        from charmhelpers.contrib.openstack import context, templating, utils
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "").startswith("charmhelpers")
                and getattr(module, "get_platform", None) is _ubuntu):
            module.get_platform = original
    return context, utils, templating


ch_context, ch_utils, ch_templating = _import_as_on_ubuntu()

RID = "nova-vgpu:7"
UNIT = "nova-compute-nvidia-vgpu/0"
PRINCIPAL_METADATA = {
    "name": "nova-compute",
    "provides": {"cloud-compute": {"interface": "nova-compute"}},
    "requires": {"nova-vgpu": {"interface": "nova-vgpu", "scope": "container"}},
}


# ceilometer-agent's subordinate_configuration on nova-ceilometer (charm-ceilometer-agent's
# hooks/ceilometer_utils.py NOVA_SETTINGS, sent by nova_ceilometer_joined).
CEILOMETER_DATA = {"subordinate_configuration": json.dumps({"nova": {"/etc/nova/nova.conf": {
    "sections": {"DEFAULT": [["instance_usage_audit", "True"],
                             ["instance_usage_audit_period", "hour"],
                             ["notify_on_state_change", "vm_and_task_state"]]}}}})}
CEILOMETER_FLAGS = ("instance_usage_audit=True,instance_usage_audit_period=hour,"
                    "notify_on_state_change=vm_and_task_state")

# contrail-openstack's subordinate_configuration on neutron-plugin (tungstenfabric/tf-charms,
# contrail-openstack/hooks/contrail_openstack_hooks.py, _notify_nova), with dpdk on.
CONTRAIL_DATA = {"subordinate_configuration": json.dumps({"nova-compute": {"/etc/nova/nova.conf": {
    "sections": {"DEFAULT": [["firewall_driver", "nova.virt.firewall.NoopFirewallDriver"]],
                 "CONTRAIL": [["use_userspace_vhost", "True"]],
                 "libvirt": [["use_huge_pages", "True"]]}}}})}
# Their charms' metadata.yaml, as Juju unpacks it in each unit's agent directory: contrail-
# openstack's (tungstenfabric/tf-charms) and scaleio-openstack's (thecodeteam/juju-scaleio at
# 8c59800, the revision that added its ephemeral-backend hooks), abridged to name and relations.
CONTRAIL_METADATA = """name: contrail-openstack
summary: Contrail Connector to OpenStack
subordinate: true
peers:
  cluster:
    interface: contrail-openstack-cluster
provides:
  neutron-api:
    interface: neutron-plugin-api-subordinate
    scope: container
  nova-compute:
    interface: neutron-plugin
    scope: container
  heat-plugin:
    interface: heat-plugin-subordinate
    scope: container
requires:
  contrail-controller:
    interface: contrail-controller
  juju-info:
    interface: juju-info
    scope: container
"""
SCALEIO_METADATA = """name: scaleio-openstack
summary: ScaleIO OpenStack integration charm
description: |
  ScaleIO OpenStack integration charm
tags:
  - storage
  - openstack
subordinate: true
provides:
  storage-backend:
    interface: cinder-backend
    scope: container
  ephemeral-backend:
    interface: ephemeral-backend
    scope: container
requires:
  scaleio-gw:
    interface: scaleio-gw
  juju-info:
    interface: juju-info
    scope: container
"""
# What an ephemeral backend sends (thecodeteam/juju-scaleio, scaleio-openstack's
# hooks/common-nova builds [section] key = value pairs from its nova settings): a sample.
EPHEMERAL_DATA = {"subordinate_configuration": json.dumps({"nova": {"/etc/nova/nova.conf": {
    "sections": {"libvirt": [["images_type", "sio"]]}}}})}


@contextmanager
def _hook_tools(unit_data: Mapping[str, str], others: Mapping[str, Mapping[str, str]] = {},
                config: Mapping[str, str] = {}):
    """Juju's hook tools as nova-compute's hooks see them.

    ``unit_data``: this unit's on nova-vgpu; ``others``: each other
    subordinate's (by interface: ``nova-ceilometer``) on a relation of its
    own; ``config``: nova-compute's options.
    """
    relations = {"nova-vgpu": (RID, UNIT, unit_data)}
    for n, (interface, data) in enumerate(others.items(), 20):
        relations[interface] = (f"{interface}:{n}", f"{interface}-unit/0", data)

    def relation_ids(name=None):
        return [rid for endpoint, (rid, _, _) in relations.items() if name in (None, endpoint)]

    def related_units(rid=None):
        return [unit for r, unit, _ in relations.values() if r == rid]

    def relation_get(attribute=None, unit=None, rid=None, app=None):
        for r, u, data in relations.values():
            if (r, u) == (rid, unit):
                return dict(data) if attribute is None else data.get(attribute)
        return None

    patches = [mock.patch.object(module, name, fn)
               for module in (ch_context, ch_utils)
               for name, fn in (("relation_ids", relation_ids), ("related_units", related_units),
                                ("relation_get", relation_get))]
    patches.append(mock.patch.object(ch_context, "log", lambda *a, **k: None))
    patches.append(mock.patch.object(ch_templating, "log", lambda *a, **k: None))
    patches.append(mock.patch.object(ch_context, "config", lambda key=None: config.get(key)))
    patches.append(mock.patch.object(ch_utils, "metadata", lambda: PRINCIPAL_METADATA))
    for patch in patches:
        patch.start()
    try:
        yield
    finally:
        for patch in patches:
            patch.stop()


def nova_context(unit_data: Mapping[str, str]) -> dict:
    """The template context nova-compute's nova.conf gets from this unit."""
    with _hook_tools(unit_data):
        return ch_context.SubordinateConfigContext(
            interface=["nova-vgpu"], service=["nova-compute", "nova"],
            config_file="/etc/nova/nova.conf")()


def services(unit_data: Mapping[str, str]) -> set:
    with _hook_tools(unit_data):
        return ch_utils.get_subordinate_services()


def release_packages(unit_data: Mapping[str, str], release: str = "yoga"):
    with _hook_tools(unit_data):
        return ch_utils.get_subordinate_release_packages(release)


# The parts of charm-nova-compute's templates/yoga/nova.conf (used by every later
# release) that carry subordinates' settings: its DEFAULT block with config-flags
# (user_config_flags) and the subordinates' DEFAULT pairs, and every other section
# through templates/parts/section-ephemeral, which is copied as it is.
_NOVA_CONF_TEMPLATE = """[DEFAULT]
debug=False
{% if user_config_flags -%}
{% for key, value in user_config_flags.items() -%}
{{ key }} = {{ value }}
{% endfor -%}
{% endif -%}

{% if sections and 'DEFAULT' in sections -%}
{% for key, value in sections['DEFAULT'] -%}
{{ key }} = {{ value }}
{% endfor -%}
{% endif -%}

{% include "parts/section-ephemeral" %}
"""
_SECTION_EPHEMERAL = """{% for section in sections -%}
{% if section != 'DEFAULT' -%}
[{{ section }}]
{% for key, value in sections[section] -%}
{{ key }} = {{ value }}
{% endfor %}
{% endif %}
{%- endfor %}
"""


def render_with_neighbours(unit_data: Mapping[str, str], templates, others=None,
                           config_flags: str = "") -> str:
    """nova.conf as nova-compute renders it with charmhelpers' OSConfigRenderer.

    Its contexts for nova.conf, in its order (hooks/nova_compute_utils.py:
    BASE_RESOURCE_MAP): config-flags, the neutron plugin's (its
    ``NeutronPluginSubordinateConfigContext``, hooks/nova_compute_context.py:
    complete with or without sections), then ``SubordinateConfigContext`` for
    ``nova-ceilometer``/``ephemeral-backend``, then one for ``nova-vgpu``;
    charmhelpers merges them with ``dict.update``. ``others``: the other
    subordinates' data by interface (CEILOMETER_DATA on ``nova-ceilometer``,
    CONTRAIL_DATA on ``neutron-plugin``, EPHEMERAL_DATA on ``ephemeral-backend``);
    ``templates``: an empty directory to write the template parts in.
    """
    (templates / "yoga" / "parts").mkdir(parents=True, exist_ok=True)
    (templates / "yoga" / "nova.conf").write_text(_NOVA_CONF_TEMPLATE)
    (templates / "yoga" / "parts" / "section-ephemeral").write_text(_SECTION_EPHEMERAL)
    with _hook_tools(unit_data, others or {}, {"config-flags": config_flags}):
        renderer = ch_templating.OSConfigRenderer(templates_dir=str(templates),
                                                  openstack_release="yoga")
        renderer.register("/etc/nova/nova.conf", [
            ch_context.OSConfigFlagContext(),
            _NeutronPluginContext(
                interface=["neutron-plugin"], service=["nova-compute", "nova"],
                config_file="/etc/nova/nova.conf"),
            ch_context.SubordinateConfigContext(
                interface=["nova-ceilometer", "ephemeral-backend"],
                service=["nova-compute", "nova"], config_file="/etc/nova/nova.conf"),
            ch_context.SubordinateConfigContext(
                interface=["nova-vgpu"], service=["nova-compute", "nova"],
                config_file="/etc/nova/nova.conf"),
        ])
        return renderer.render("/etc/nova/nova.conf")


class _NeutronPluginContext(ch_context.SubordinateConfigContext):
    """charm-nova-compute's NeutronPluginSubordinateConfigContext: complete once it has sections."""

    def context_complete(self, ctxt):
        return "sections" in ctxt


def render_nova_conf(context: dict) -> str:
    """nova-compute's template: each non-DEFAULT section as [section] and key = value lines."""
    lines = []
    for section, pairs in context.get("sections", {}).items():
        if section == "DEFAULT":
            continue
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value}" for key, value in pairs)
    return "\n".join(lines) + "\n"


def raw(unit_data: Mapping[str, str]) -> dict:
    return {key: json.loads(value) for key, value in unit_data.items()
            if key in ("subordinate_configuration", "services", "releases-packages-map")}
