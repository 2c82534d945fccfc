"""The nova.conf sections for a validated mapping, and the nova-vgpu relation data.

nova-compute reads ``subordinate_configuration``, ``services`` and
``releases-packages-map`` from this unit (charmhelpers'
``SubordinateConfigContext``, ``get_subordinate_services`` and
``get_subordinate_release_packages``) and renders every section as
``[section]`` followed by ``key = value`` lines. Everything here is
serialised deterministically: the same mapping and host give byte-identical
relation data, so nova-compute never restarts for nothing.
"""

import json
from typing import Dict, Iterable, List, Mapping, Tuple

from . import releases

NOVA_CONF = "/etc/nova/nova.conf"
# The oldest release every nova-compute knows: its entry always applies.
PACKAGES_RELEASE_KEY = "queens"

Sections = Dict[str, List[List[str]]]


def sections(mapping: Mapping[str, Tuple[str, ...]], release) -> Sections:
    """nova.conf sections for ``{type: addresses}`` in the spelling ``release`` understands."""
    if not mapping:
        return {}
    types = list(mapping)
    form = release.config_format
    if form == releases.SINGLE_TYPE:
        # Queens to Train use the first type only, on every GPU that offers it.
        return {"devices": [["enabled_vgpu_types", types[0]]]}
    option, prefix = (("enabled_vgpu_types", "vgpu_") if form == releases.VGPU_GROUPS
                      else ("enabled_mdev_types", "mdev_"))
    out: Sections = {"devices": [[option, ",".join(types)]]}
    for vgpu_type in types:
        out[f"{prefix}{vgpu_type}"] = [["device_addresses", ",".join(mapping[vgpu_type])]]
    return out


def relation_data(config_sections: Sections, services: Iterable[str] = (),
                  packages: Iterable[str] = ()) -> Dict[str, str]:
    """The unit databag nova-compute reads, serialised deterministically."""
    subordinate = {"nova": {NOVA_CONF: {"sections": config_sections}}}
    package_map = {PACKAGES_RELEASE_KEY: {"deb": {"install": sorted(set(packages)), "purge": []}}}
    return {
        "subordinate_configuration": _dumps(subordinate),
        "services": _dumps(sorted(set(services))),
        "releases-packages-map": _dumps(package_map),
    }


def sections_from_relation(data: Mapping[str, str]) -> Sections:
    """The sections this unit published earlier (its last good configuration)."""
    try:
        blob = json.loads(data.get("subordinate_configuration") or "{}")
        return blob["nova"][NOVA_CONF]["sections"]
    except (ValueError, KeyError, TypeError):
        return {}


def mapping_from_sections(config_sections: Sections) -> Dict[str, Tuple[str, ...]]:
    """Recover ``{type: addresses}`` from published sections (for status messages)."""
    devices = dict(tuple(pair) for pair in config_sections.get("devices", []))
    types = (devices.get("enabled_mdev_types") or devices.get("enabled_vgpu_types") or "")
    out = {}
    for vgpu_type in filter(None, types.split(",")):
        pairs = dict(tuple(p) for p in (config_sections.get(f"mdev_{vgpu_type}")
                                        or config_sections.get(f"vgpu_{vgpu_type}") or []))
        out[vgpu_type] = tuple(filter(None, pairs.get("device_addresses", "").split(",")))
    return out


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
