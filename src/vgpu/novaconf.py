"""The nova.conf sections for a validated mapping, and the nova-vgpu relation data.

nova-compute reads ``subordinate_configuration``, ``services`` and
``releases-packages-map`` from this unit (charmhelpers'
``SubordinateConfigContext``, ``get_subordinate_services`` and
``get_subordinate_release_packages``) and renders every section as
``[section]`` followed by ``key = value`` lines. Everything here is
serialised deterministically: the same mapping and host give byte-identical
relation data, so nova-compute never restarts for nothing.
"""

from __future__ import annotations

import json
import re
from typing import Callable, Collection, Dict, Iterable, List, Mapping, Optional, Set, Tuple

from . import releases

NOVA_CONF = "/etc/nova/nova.conf"
# The oldest release every nova-compute knows: its entry always applies.
PACKAGES_RELEASE_KEY = "queens"

Sections = Dict[str, List[List[str]]]

NVIDIA_VENDOR = "10de"
WHOLE_CLASS = "CUSTOM_GPU_"  # whole GPUs' resource classes (vgpu.plan.WHOLE_PREFIX)
# What may reach nova.conf, key by key: built from sysfs and the release, never
# from the option's text, and checked once more here (the principal renders
# ``key = value`` unescaped). Patterns re compiles when first used: a hook compiles only
# those its framework needs (an mdev host checks no product id).
_SAFE = {
    "section": r"devices|pci|(?:mdev|vgpu)_nvidia-[0-9]{1,6}",
    "type": r"nvidia-[0-9]{1,6}",
    # sysfs's form, which Nova compares as a string with libvirt's: a four-digit domain
    # (never nvidia-smi's zero-padded 00000001:c8:00.0). A domain above ffff (VMD) is
    # refused: Nova's PciAddressGlobSpec refuses it in a device_spec and
    # pci_utils.parse_address in device_addresses; nova-compute would not start.
    "address": r"[0-9a-f]{4}:[0-9a-f]{2}:[0-1][0-9a-f]\.[0-7]",
    "product_id": r"[0-9a-f]{4}",
    "resource_class": r"CUSTOM_[A-Z0-9_]{1,200}",
}


def nova_addressable(address: str) -> bool:
    """Whether Nova takes ``address``'s PCI domain (four hex digits; VMD domains above ffff not)."""
    domain = address.split(":", 1)[0]
    try:
        return int(domain, 16) <= 0xFFFF
    except ValueError:
        return False


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


def plan_sections(plan, release, *, mdev_class: bool, pci_in_placement: bool = False,
                  keep_placement_reporting: bool = False, live_migratable: bool = False,
                  one_time_use: bool = False) -> Sections:
    """nova.conf sections for a :class:`vgpu.plan.Plan` in ``release``'s spelling.

    mdev types become ``[devices]`` and ``[mdev_<type>]`` (with ``mdev_class =
    CUSTOM_VGPU_<PROFILE>`` when ``mdev_class`` is on, Xena onwards); VFs on the
    vendor-specific VFIO framework become one ``[pci] device_spec`` each
    (``live_migratable`` adds ``"live_migratable": "yes"``; raises ValueError
    on a release that does not take it). ``report_in_placement = True`` joins
    them only with ``pci_in_placement``, or with ``keep_placement_reporting``
    (this unit published it before): Nova refuses to start once it is turned
    off after devices were reported, so it stays, with or without VFs.
    """
    for assignment in plan.assignments:  # one by one: a comma would split a joined list
        _checked("address", assignment.address)
    if live_migratable and not release.live_migratable:
        raise ValueError(f"{release} does not take live_migratable in [pci] device_spec")
    out = sections(plan.mdev_mapping(), release)
    if mdev_class and release.config_format == releases.MDEV_GROUPS:
        for vgpu_type, name in plan.mdev_names().items():
            out[f"mdev_{vgpu_type}"].append(["mdev_class", resource_class(name)])
    specs = [["device_spec", device_spec(a, live_migratable=live_migratable)]
             for a in plan.vfio()]
    specs += [["device_spec", whole_spec(w, release, one_time_use=one_time_use)]
              for w in getattr(plan, "passthrough", ())]
    specs.sort(key=lambda pair: _spec_address(pair[1]) or "")
    reporting = (bool(specs) and pci_in_placement) or keep_placement_reporting
    if specs or reporting:
        out["pci"] = specs + ([["report_in_placement", "True"]] if reporting else [])
    check(out)
    return out


def resource_class(name: str) -> str:
    """Placement's resource class for a type name (see plan.resource_class); plan loads only here."""
    from .plan import resource_class as rc

    return rc(name)


def device_spec(assignment, *, live_migratable: bool = False) -> str:
    """One ``[pci] device_spec`` value: the VF by vendor, product and address, unmanaged.

    ``resource_class`` is always there: Nova uses it only while it reports the
    VFs to Placement, and its PCI pools ignore it otherwise
    (``nova/pci/stats.py``, ``ignored_pool_tags``), so turning reporting on
    later finds each VF in its profile's class.
    """
    spec = {
        "vendor_id": NVIDIA_VENDOR,
        "product_id": assignment.product_id,
        "address": assignment.address,
        "managed": "no",
        "resource_class": assignment.resource_class,
    }
    if live_migratable:
        spec["live_migratable"] = "yes"
    for field in ("address", "product_id", "resource_class"):
        _checked(field, spec[field])
    return json.dumps(spec, sort_keys=True)


def whole_spec(whole, release, *, one_time_use: bool = False) -> str:
    """The ``[pci] device_spec`` of a GPU given whole to guests (:class:`vgpu.plan.Whole`).

    Its own function by vendor, product and address, so no VF of another GPU
    of the model matches it; ``"managed": "no"`` from Nova 31 (the charm keeps
    the GPU on vfio-pci: libvirt would hand a managed one back to the host
    driver when a guest stops); its own resource class (CUSTOM_GPU_<MODEL>);
    ``one_time_use`` (Nova 32+, with report_in_placement: checked by
    :func:`vgpu.plan.whole_problems`) when asked.
    """
    spec = {
        "vendor_id": NVIDIA_VENDOR,
        "product_id": whole.product_id,
        "address": whole.address,
        "resource_class": whole.resource_class,
    }
    if release is None or release.managed_no:
        spec["managed"] = "no"
    if one_time_use:
        spec["one_time_use"] = "true"
    for field in ("address", "product_id", "resource_class"):
        _checked(field, spec[field])
    return json.dumps(spec, sort_keys=True)


def whole_alias(whole, *, pci_in_placement: bool = False) -> Dict[str, str]:
    """The ``[pci] alias`` a flavor asks for a whole GPU with: Nova's device type of the GPU.

    ``type-PF`` (SR-IOV-capable) or ``type-PCI`` (nova/virt/libvirt/host.py,
    ``_get_device_type``): the VFs of the same model share its product id
    and are ``type-VF``, so neither alias takes the other's devices.
    """
    out = {
        "name": whole.alias_name,
        "vendor_id": NVIDIA_VENDOR,
        "product_id": _checked("product_id", whole.product_id),
        "device_type": whole.device_type,
    }
    if pci_in_placement:
        out["resource_class"] = whole.resource_class
    return out


def alias(name: str, product_id: str, *, live_migratable: bool = False,
          pci_in_placement: bool = False) -> Dict[str, str]:
    """The ``[pci] alias`` a flavor asks for one VF of type ``name`` with (``pci_passthrough:alias``).

    ``name`` is the driver's name for the type (``NVIDIA L40S-12Q``; the alias is
    ``vgpu-l40s-12q``), ``product_id`` the VF's PCI device id (4 hex digits).
    It matches the device specs published with the same options:
    ``live_migratable`` adds ``"live_migratable": "yes"`` (Nova needs it on
    both for live migration), ``pci_in_placement`` the profile's resource
    class (Nova 32+ refuses an alias without vendor and product id unless the
    scheduler has pci_in_placement, so the ids always stay). Raises
    ValueError for a product id that is not 4 lowercase hex digits.
    """
    from .plan import alias_name

    out = {
        "name": alias_name(name),
        "vendor_id": NVIDIA_VENDOR,
        "product_id": _checked("product_id", product_id),
        "device_type": "type-VF",
    }
    if live_migratable:
        out["live_migratable"] = "yes"
    if pci_in_placement:
        out["resource_class"] = resource_class(name)
    return out


def check(config_sections: Sections) -> None:
    """Raise ValueError unless every section and value is one this module builds."""
    for section, pairs in config_sections.items():
        _checked("section", section)
        for key, value in pairs:
            value_check = _VALUE_CHECKS.get(key)
            if value_check is None:
                raise ValueError(f"unexpected setting {key!r} in [{section}]")
            value_check(value)


def _check_types(value: str) -> None:
    for item in value.split(","):
        _checked("type", item)


def _check_addresses(value: str) -> None:
    for item in value.split(","):
        _checked("address", item)


def _check_resource_class(value: str) -> None:
    _checked("resource_class", value)


def _check_report_in_placement(value: str) -> None:
    if value != "True":
        raise ValueError(f"unexpected report_in_placement {value!r}")


_SPEC_KEYS = frozenset({"vendor_id", "product_id", "address", "managed", "resource_class"})
_WHOLE_KEYS = (frozenset({"vendor_id", "product_id", "address", "resource_class"}),
               frozenset({"vendor_id", "product_id", "address", "resource_class", "managed"}))


def _check_device_spec(value: str) -> None:
    spec = json.loads(value)
    keys = set(spec)
    vf = keys in (_SPEC_KEYS, _SPEC_KEYS | {"live_migratable"}) \
        and not str(spec.get("resource_class")).startswith(WHOLE_CLASS)
    # A whole GPU's (whole_spec): its own class; no managed before Nova 31; one_time_use.
    whole = any(keys in (k, k | {"one_time_use"}) for k in _WHOLE_KEYS) \
        and str(spec.get("resource_class")).startswith(WHOLE_CLASS)
    if not (vf or whole) \
            or spec["vendor_id"] != NVIDIA_VENDOR or spec.get("managed", "no") != "no" \
            or spec.get("live_migratable", "yes") != "yes" \
            or spec.get("one_time_use", "true") != "true" or "\n" in value:
        raise ValueError(f"unexpected device_spec {value!r}")
    for field in ("address", "product_id", "resource_class"):
        _checked(field, spec[field])


# Every setting this module writes, with the check its value must pass.
_VALUE_CHECKS: Dict[str, Callable[[str], None]] = {
    "enabled_mdev_types": _check_types,
    "enabled_vgpu_types": _check_types,
    "device_addresses": _check_addresses,
    "mdev_class": _check_resource_class,
    "report_in_placement": _check_report_in_placement,
    "device_spec": _check_device_spec,
}


def _checked(kind: str, value: str) -> str:
    if not isinstance(value, str) or not re.fullmatch(_SAFE[kind], value):
        raise ValueError(f"refusing {kind} {value!r} for nova.conf")
    return value


def reports_in_placement(config_sections: Sections) -> bool:
    """Whether these (published) sections turn on ``[pci] report_in_placement``."""
    return ["report_in_placement", "True"] in [list(p) for p in config_sections.get("pci", [])]


def relation_data(config_sections: Sections, packages: Iterable[str] = ()) -> Dict[str, str]:
    """The unit databag nova-compute reads, serialised deterministically.

    ``services`` is always an empty list: nova-compute's pause stops and masks
    every service listed there while libvirt and the guests run on, and its
    OpenStack upgrade restarts them, so listing nvidia-vgpu-mgr would take
    running guests' GPUs away. The key stays, well-formed, for charmhelpers'
    ``get_subordinate_services``; this charm's own status watches the daemon.
    """
    subordinate = {"nova": {NOVA_CONF: {"sections": config_sections}}}
    package_map = {PACKAGES_RELEASE_KEY: {"deb": {"install": sorted(set(packages)), "purge": []}}}
    return {
        "subordinate_configuration": _dumps(subordinate),
        "services": _dumps([]),
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
    """Recover ``{type: addresses}`` from published sections (for status messages).

    VFs published as ``[pci] device_spec`` count under their resource class.
    """
    devices = {key: value for key, value in config_sections.get("devices", [])}
    types = (devices.get("enabled_mdev_types") or devices.get("enabled_vgpu_types") or "")
    out = {}
    # oslo.config strips each item of a list option: the upstream charm joined types with ", ".
    for vgpu_type in _items(types):
        pairs = {key: value for key, value in (config_sections.get(f"mdev_{vgpu_type}")
                                               or config_sections.get(f"vgpu_{vgpu_type}") or [])}
        out[vgpu_type] = _items(pairs.get("device_addresses", ""))
    by_class: Dict[str, List[str]] = {}
    for pair in config_sections.get("pci", []):
        if pair[0] != "device_spec":
            continue
        try:
            spec = json.loads(pair[1])
            by_class.setdefault(str(spec["resource_class"]), []).append(str(spec["address"]))
        except (ValueError, KeyError, TypeError):
            continue
    for cls in sorted(by_class):
        out[cls] = tuple(sorted(by_class[cls]))
    return out


def mdev_classes(config_sections: Sections) -> Dict[str, str]:
    """``{type: resource class}`` of each published mdev type: its ``mdev_class``, else ``VGPU``.

    ``VGPU`` is Nova's default, and the only class before Xena (``[vgpu_<type>]``).
    """
    option = _types_option(config_sections)
    types = dict(config_sections.get("devices", [])).get(option, "") if option else ""
    return {vgpu_type: dict(config_sections.get(f"mdev_{vgpu_type}") or []).get("mdev_class", "VGPU")
            for vgpu_type in _items(types)}


def _items(value: str) -> Tuple[str, ...]:
    """A list option's items as oslo.config reads them: split at commas, stripped, none empty."""
    return tuple(item for item in (part.strip() for part in value.split(",")) if item)


def device_classes(config_sections: Sections) -> Dict[str, str]:
    """``{address: resource class}`` of each published ``[pci] device_spec`` (VFIO VFs)."""
    out: Dict[str, str] = {}
    for pair in config_sections.get("pci", []):
        if pair[0] != "device_spec":
            continue
        try:
            spec = json.loads(pair[1])
            out[str(spec["address"])] = str(spec["resource_class"])
        except (ValueError, KeyError, TypeError):
            continue
    return out


def keep_published(new: Sections, published: Sections, functions: Collection[str]) -> Sections:
    """``new`` with ``published``'s entries for ``functions`` added back, exactly as published.

    For functions discovery no longer finds (a GPU fallen off the bus, a driver
    reload, a bad read): Nova would drop their devices under the guests that
    hold them. Each keeps its address in ``device_addresses`` under its type
    (the type's section as published when ``new`` has none, ``mdev_class``
    included) and its ``[pci] device_spec`` line verbatim, in the order the
    plan writes them (types by number, addresses and device specs by
    address): a GPU that comes back with the same types publishes the same
    bytes. Raises ValueError when a kept function is in ``new`` too (under
    two types, or two device specs: Nova refuses both) or the result fails
    :func:`check`.
    """
    keep = set(functions)
    if not keep:
        return new
    out = {section: [list(pair) for pair in pairs] for section, pairs in new.items()}
    _keep_mdev(out, published, keep)
    _keep_specs(out, published, keep)
    check(out)
    return out


def drop_published(published: Sections, functions: Collection[str]) -> Sections:
    """``published`` without ``functions``: their addresses, device specs, and types left empty.

    What the forget-gpus action publishes for GPUs removed for good.
    ``[pci] report_in_placement`` stays (Nova refuses it turned off).
    """
    drop = set(functions)
    out: Sections = {}
    gone: Set[str] = set()
    for section, pairs in published.items():
        kept_pairs = []
        for key, value in pairs:
            if key == "device_addresses":
                value = ",".join(a for a in value.split(",") if a not in drop)
                if not value:
                    gone.add(section.split("_", 1)[1])
                    break
            elif key == "device_spec" and _spec_address(value) in drop:
                continue
            kept_pairs.append([key, value])
        else:
            if kept_pairs:
                out[section] = kept_pairs
    option = _types_option(out)
    if option is not None:
        types = [t for t in _items(dict(out["devices"])[option]) if t not in gone]
        if types:
            _set_types(out, option, types)
        else:
            del out["devices"]
    return out


def _types_option(config_sections: Sections) -> Optional[str]:
    """The ``[devices]`` key that lists the types (``enabled_mdev_types`` or the older name)."""
    keys = [key for key, _ in config_sections.get("devices", [])]
    return next((k for k in ("enabled_mdev_types", "enabled_vgpu_types") if k in keys), None)


def _set_types(out: Sections, option: str, types: Iterable[str]) -> None:
    """``[devices] <option>`` = ``types`` by number; the section's other pairs stay."""
    value = ",".join(sorted(set(types), key=lambda t: int(t.rsplit("-", 1)[1])))
    pairs = [pair for pair in out.get("devices", []) if pair[0] != option]
    out["devices"] = [[option, value]] + pairs


def _keep_mdev(out: Sections, published: Sections, keep: Set[str]) -> None:
    """Add the published ``device_addresses`` of ``keep`` under their types (see keep_published)."""
    kept = {t: [a for a in addresses if a in keep]
            for t, addresses in mapping_from_sections(published).items()
            if re.fullmatch(_SAFE["type"], t)}
    kept = {t: addresses for t, addresses in kept.items() if addresses}
    if not kept:
        return
    taken = {a: t for t, addresses in mapping_from_sections(out).items() for a in addresses}
    option = _types_option(out) or _types_option(published) or "enabled_mdev_types"
    prefix = "mdev_" if option == "enabled_mdev_types" else "vgpu_"
    for vgpu_type, addresses in kept.items():
        for address in addresses:
            if address in taken:
                raise ValueError(f"{address} would be under both {taken[address]} and {vgpu_type}")
        section = f"{prefix}{vgpu_type}"
        source = published.get(f"mdev_{vgpu_type}") or published.get(f"vgpu_{vgpu_type}") or []
        pairs = out.get(section) or [list(pair) for pair in source]
        listed = next((v for k, v in out.get(section, []) if k == "device_addresses"), "")
        joined = ",".join(sorted({*filter(None, listed.split(",")), *addresses}))
        out[section] = [[k, joined if k == "device_addresses" else v] for k, v in pairs]
    listed_types = dict(out.get("devices", [])).get(option, "")
    _set_types(out, option, [*filter(None, listed_types.split(",")), *kept])


def _keep_specs(out: Sections, published: Sections, keep: Set[str]) -> None:
    """Add the published ``[pci] device_spec`` lines of ``keep``, verbatim (see keep_published)."""
    kept = [v for k, v in published.get("pci", []) if k == "device_spec" and _spec_address(v) in keep]
    if not kept:
        return
    pairs = out.get("pci", [])
    specs = [v for k, v in pairs if k == "device_spec"]
    present = {_spec_address(v) for v in specs}
    for value in kept:
        if _spec_address(value) in present:
            raise ValueError(f"two device specs for {_spec_address(value)}")
    ordered = sorted(specs + kept, key=lambda v: _spec_address(v) or "")
    out["pci"] = [["device_spec", v] for v in ordered] + [p for p in pairs if p[0] != "device_spec"]


def _spec_address(value: str) -> Optional[str]:
    """A device spec's address (None when it has none: not one this module builds)."""
    try:
        return str(json.loads(value)["address"])
    except (ValueError, KeyError, TypeError):
        return None


def _dumps(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
