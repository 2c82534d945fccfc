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
        from charmhelpers.contrib.openstack import context, utils
    for module in list(sys.modules.values()):
        if (getattr(module, "__name__", "").startswith("charmhelpers")
                and getattr(module, "get_platform", None) is _ubuntu):
            module.get_platform = original
    return context, utils


ch_context, ch_utils = _import_as_on_ubuntu()

RID = "nova-vgpu:7"
UNIT = "nova-compute-nvidia-vgpu/0"
PRINCIPAL_METADATA = {
    "name": "nova-compute",
    "provides": {"cloud-compute": {"interface": "nova-compute"}},
    "requires": {"nova-vgpu": {"interface": "nova-vgpu", "scope": "container"}},
}


@contextmanager
def _hook_tools(unit_data: Mapping[str, str]):
    def relation_ids(name=None):
        return [RID] if name in (None, "nova-vgpu") else []

    def related_units(rid=None):
        return [UNIT] if rid == RID else []

    def relation_get(attribute=None, unit=None, rid=None, app=None):
        if rid != RID or unit != UNIT:
            return None
        return dict(unit_data) if attribute is None else unit_data.get(attribute)

    patches = [mock.patch.object(module, name, fn)
               for module in (ch_context, ch_utils)
               for name, fn in (("relation_ids", relation_ids), ("related_units", related_units),
                                ("relation_get", relation_get))]
    patches.append(mock.patch.object(ch_context, "log", lambda *a, **k: None))
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
