"""What the list-vgpu-types action returns: nested results and a readable table.

Each type says how a flavor asks for it, which depends on the framework:

* mediated devices (mdev): ``resources:VGPU=1``, or with
  ``mdev-class-per-profile`` ``resources:CUSTOM_VGPU_<PROFILE>=1``. Where
  several published types share one class (``VGPU`` unless that option is on),
  Placement cannot tell them apart: those rows, and each such type's
  ``flavor-note``, say so and what to add (a trait, or the option);
* vendor-specific VFIO: ``pci_passthrough:alias=<alias>:1``, with the
  ``[pci] alias`` that nova-cloud-controller and nova-compute need. A
  ``resources:`` property creates no PCI request, so on a VFIO host the guest
  would boot without a GPU.

Every alias names ``vendor_id`` and ``product_id``: nova-compute 32 and later
validates ``[pci] alias`` at start and, without ``[filter_scheduler]
pci_in_placement`` on that host, refuses an alias without them
(``nova/pci/request.py``, ``_validate_required_ids``). With
``pci-in-placement`` the alias adds the profile's ``resource_class``.
"""

from __future__ import annotations

import json
from typing import Dict, List, Mapping, Optional, Tuple

from . import capacity, multivgpu, novaconf, profiles, table, text
from .pci import MDEV, VFIO, Gpu, Host, VgpuType
from .profiles import mig_profile

Multi = multivgpu.Multi  # what says how many vGPUs of a type one instance may have
ALIASES_SHOWN = 20  # alias lines under the table at most; all are in the nested results
ALIAS_WHERE = "nova-cloud-controller and nova-compute pci-alias"
SHARED_MARK = " (shared: see below)"  # after the FLAVOR of a type whose resource class others have


def shared_class_notes(published: Optional[novaconf.Sections]) -> Dict[str, str]:
    """``{type: note}`` for each published mdev type whose resource class another one has.

    Placement then offers either type to a flavor that asks for the class: the
    note says so and how to tell them apart (``docs/how-to/flavors.md``).
    """
    by_class: Dict[str, List[str]] = {}
    for vgpu_type, rc in novaconf.mdev_classes(published or {}).items():
        by_class.setdefault(rc, []).append(vgpu_type)
    notes: Dict[str, str] = {}
    for rc, types in by_class.items():
        if len(types) < 2:
            continue
        note = (f"{text.listing(types)} are published with one resource class, {rc}: a flavor "
                f"with resources:{rc}=1 may get either. Give each type's resource providers a "
                "trait and require it in the flavor (trait:CUSTOM_<NAME>=required), or set "
                "mdev-class-per-profile=true and ask for resources:CUSTOM_VGPU_<PROFILE>=1")
        notes.update((vgpu_type, note) for vgpu_type in types)
    return notes


def gpu_results(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]] = None,
                mdev_class: bool = False, pci_in_placement: bool = False,
                live_migration: bool = False,
                whole_gb: Optional[Mapping[str, int]] = None,
                held: Optional[capacity.Held] = None,
                published: Optional[novaconf.Sections] = None,
                multi: Optional[Multi] = None, whole: Tuple[str, ...] = (),
                mig_off: Optional[Mapping[str, str]] = None) -> Dict[str, dict]:
    """Per group of GPUs that offer the same (keys gpu-0, gpu-1, ...): addresses, model, types.

    GPUs of one model that offer the same types with the same counts are one
    entry naming all their addresses (``addresses``, comma-separated), so a
    host of identical GPUs lists its types once and every GPU stays named
    within what ``action-set`` takes; a GPU with other counts (some VFs
    taken) is an entry of its own. Groups are in the order of their first
    address; ``virtual-functions`` and ``gpu-instances`` join the group's.

    Juju result keys allow only lowercase letters, digits and hyphens, so the
    addresses and type names are values, never keys. Each type says the
    flavor property that asks for it (none for a type the mapping refuses:
    ``refused`` says why) and, on vendor-specific VFIO GPUs, the
    ``[pci] alias`` that nova-cloud-controller (and nova-compute) need
    (``pci_in_placement``, ``live_migration``: the charm's options of those
    names, shaping the alias). ``offered``: every type per GPU, learnt ones
    included (a full VFIO GPU lists none in sysfs). ``whole_gb``: each VFIO
    GPU's whole framebuffer in GB where known (:func:`vgpu.catalogue.whole_gpus`),
    which counts a time-sliced profile on a partly used GPU. ``max-instances`` and
    ``available-instances`` are :func:`vgpu.capacity.count`'s, as the status line and
    the exporter count them (``held``: :func:`vgpu.capacity.held`, read here when not given).
    ``published``: the sections nova-compute has now; a type whose resource class another
    published type shares gets a ``flavor-note`` (:func:`shared_class_notes`).
    ``multi``: each type's ``max-per-instance`` and, where above 1, the
    ``flavor-property-for-two`` (see :mod:`vgpu.multivgpu`). ``whole``: the
    GPUs given whole to guests (the mapping's ``passthrough``): their group
    says ``passthrough`` with the alias and flavor property of a whole GPU.
    ``mig_off``: :func:`not_in_mig_mode`; a MIG-backed type there has none available
    and a ``mig-mode`` saying why.
    """
    out: Dict[str, dict] = {}
    notes = shared_class_notes(published)
    limits = per_instance(host, offered, whole_gb, multi, mapped_gpus(host, published)) \
        if multi is not None else {}
    for index, group in enumerate(_groups(host, offered, whole_gb, held, whole, mig_off)):
        gpu, rows = group[0]
        if gpu.address in whole:
            out[f"gpu-{index}"] = _whole_result(group, pci_in_placement)
            continue
        types: Dict[str, dict] = {}
        for vgpu_type, most, available in rows:
            entry = _type_entry(gpu, vgpu_type, mdev_class, pci_in_placement, live_migration)
            entry.update(_mig_entry(gpu, vgpu_type))
            if "mig-slices" in entry and gpu.address in (mig_off or {}):
                entry["mig-mode"] = (mig_off or {})[gpu.address]
            entry.update(_multi_entry(gpu, vgpu_type, entry, limits))
            if vgpu_type.id in notes and "flavor-property" in entry:
                entry["flavor-note"] = notes[vgpu_type.id]
            for key, value in (("framebuffer-mb", vgpu_type.framebuffer_mb),
                               ("max-instances", most), ("available-instances", available)):
                if value is not None:
                    entry[key] = str(value)
            types[vgpu_type.id] = entry
        result = {
            "addresses": ",".join(member.address for member, _ in group),
            "model": gpu.model,
            "device-id": gpu.device_id,
            "driver": gpu.driver or "none",
            "types": types or "none (is the vGPU host driver loaded?)",
        }
        if gpu.sriov:
            result["virtual-functions"] = ",".join(
                vf.address for member, _ in group for vf in member.vfs) or "none enabled"
        result.update(_gpu_instances([member for member, _ in group]))
        out[f"gpu-{index}"] = result
    return out


_Row = Tuple[VgpuType, Optional[int], Optional[int]]  # a type, how many fit, how many are free


def not_in_mig_mode(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]] = None
                    ) -> Dict[str, str]:
    """``{GPU: why}``: GPUs offering MIG-backed types that are not in MIG mode now.

    No vGPU of such a type can be created there until MIG mode is on and its
    GPU instances exist (docs/how-to/mig.md), whatever a VF lists. One
    nvidia-smi run, only where a GPU offers a MIG-backed type; a mode that
    cannot be read counts as not enabled (fail safe).
    """
    wanted = [gpu.address for gpu in host.gpus
              if any(mig_profile(t.name) is not None
                     for t in (offered or {}).get(gpu.address) or gpu.offered_types())]
    if not wanted:
        return {}
    from . import mig
    from .errors import MigError

    try:
        found = mig.modes(wanted)
    except MigError as error:
        return {a: f"not enabled as far as can be told ({error}): none available" for a in wanted}
    return {a: (f"not enabled{' (pending)' if mode.enable_pending else ''}: none available "
                f"until the enable-mig action runs with gpu={a}")
            for a, mode in found.items() if not mode.enabled}


def _groups(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]],
            whole_gb: Optional[Mapping[str, int]],
            held: Optional[capacity.Held],
            given: Tuple[str, ...] = (),
            mig_off: Optional[Mapping[str, str]] = None) -> List[List[Tuple[Gpu, List[_Row]]]]:
    """The host's GPUs with their rows, grouped where all but the address and VFs are the same.

    A GPU given whole (``given``) has no rows and groups only with other whole GPUs.
    A MIG-backed type on a GPU of ``mig_off`` has none available.
    """
    groups: Dict[tuple, List[Tuple[Gpu, List[_Row]]]] = {}
    seen = capacity.held() if held is None and host.gpus else held or capacity.Held()
    for gpu in host.gpus:
        if gpu.address in given:
            groups.setdefault(("whole", gpu.model, gpu.device_id, gpu.sriov), []).append((gpu, []))
            continue
        whole = (whole_gb or {}).get(gpu.address)
        rows = []
        for vgpu_type in (offered or {}).get(gpu.address) or gpu.offered_types():
            most = capacity.most(gpu, vgpu_type, whole)
            found = capacity.count([gpu], vgpu_type.id, seen, whole_gb=whole_gb, fits=most)
            available = found.available
            if gpu.address in (mig_off or {}) and mig_profile(vgpu_type.name) is not None:
                available = 0 if available is not None else None
            rows.append((vgpu_type, most, available))
        # The model's device id fixes what _mig_entry says of a type; the rows, the rest.
        same = (gpu.model, gpu.device_id, gpu.driver, gpu.framework, gpu.sriov, gpu.vfs_missing,
                tuple(rows))
        groups.setdefault(same, []).append((gpu, rows))
    return list(groups.values())


def _type_entry(gpu, vgpu_type: VgpuType, mdev_class: bool, pci_in_placement: bool,
                live_migration: bool) -> Dict[str, str]:
    """id, name, framework, the flavor property and (VFIO) the alias of one type."""
    from .migplan import refused
    from .plan import flavor_property, resource_class

    entry = {"id": vgpu_type.id, "name": vgpu_type.name, "framework": vgpu_type.framework}
    why = refused(gpu, vgpu_type)
    if why:
        entry["refused"] = why  # no flavor can ask for what is never published
        return entry
    entry["flavor-property"] = flavor_property(vgpu_type, gpu.framework, mdev_class)
    if gpu.framework == VFIO and gpu.vfs:
        rc = resource_class(vgpu_type.name)
        entry["resource-class"] = rc
        entry["pci-alias"] = json.dumps(novaconf.alias(
            vgpu_type.name, _product_id(gpu), pci_in_placement=pci_in_placement,
            live_migratable=live_migration), sort_keys=True)
    elif mdev_class:
        entry["resource-class"] = resource_class(vgpu_type.name)
    return entry


def mapped_gpus(host: Host, published: Optional[novaconf.Sections]) -> Dict[int, set]:
    """``{type number: GPU addresses}`` the published sections give the type (mdev and VFIO)."""
    if not published:
        return {}
    owners = host.owners()
    out: Dict[int, set] = {}
    for type_id, addresses in novaconf.mapping_from_sections(
            {k: v for k, v in published.items() if k != "pci"}).items():
        number = type_id.rsplit("-", 1)[-1]
        for address in addresses:
            gpu = owners.get(address)
            if gpu is not None and number.isdigit():
                out.setdefault(int(number), set()).add(gpu.address)
    for address in novaconf.device_classes(published):
        gpu = owners.get(address)
        if gpu is None:
            continue
        vf = next((v for v in gpu.vfs if v.address == address), None)
        if vf is not None and vf.current_type:
            out.setdefault(vf.current_type, set()).add(gpu.address)
    return out


def per_instance(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]],
                 whole_gb: Optional[Mapping[str, int]], multi: Multi,
                 mapped: Optional[Mapping[int, set]] = None) -> Dict[Tuple[str, int], int]:
    """``{(GPU address, type number): most vGPUs of it one instance may have}`` on this host.

    Counted over the GPUs the mapping in force gives the type (``mapped``,
    :func:`mapped_gpus`), or, for a type it gives none, over every GPU here
    offering it: how many GPUs, and how many vGPUs they hold at most (VFIO:
    VFs; mdev: resource providers, the GPU itself or each VF), then
    :func:`vgpu.multivgpu.most_per_instance`.
    """
    gpus: Dict[int, int] = {}
    functions: Dict[int, int] = {}
    fits: Dict[Tuple[str, int], Optional[int]] = {}
    for gpu in host.gpus:
        for vgpu_type in (offered or {}).get(gpu.address) or gpu.offered_types():
            most = capacity.most(gpu, vgpu_type, (whole_gb or {}).get(gpu.address))
            fits[(gpu.address, vgpu_type.number)] = most
            if mapped and vgpu_type.number in mapped and gpu.address not in mapped[
                    vgpu_type.number]:
                continue  # a GPU the mapping does not give this type: no instance gets it here
            gpus[vgpu_type.number] = gpus.get(vgpu_type.number, 0) + 1
            providers = 1 if gpu.framework == MDEV and not gpu.vfs else (most or 1)
            functions[vgpu_type.number] = functions.get(vgpu_type.number, 0) + providers
    out: Dict[Tuple[str, int], int] = {}
    for gpu in host.gpus:
        for vgpu_type in (offered or {}).get(gpu.address) or gpu.offered_types():
            most = fits[(gpu.address, vgpu_type.number)]
            mig = mig_profile(vgpu_type.name)
            out[(gpu.address, vgpu_type.number)] = multivgpu.most_per_instance(
                gpu.framework, full=most == 1, mig=mig is not None,
                compute=mig is not None and mig.series == "C",
                fractional=multi.fractional.get(gpu.address),
                per_vm=multi.per_vm.get(vgpu_type.number), nova_major=multi.nova_major,
                gpus=gpus.get(vgpu_type.number, 1),
                functions=functions.get(vgpu_type.number, 1))
    return out


def _multi_entry(gpu, vgpu_type: VgpuType, entry: Mapping[str, str],
                 limits: Mapping[Tuple[str, int], int]) -> Dict[str, str]:
    """``max-per-instance`` and, above 1, ``flavor-property-for-two`` of one type."""
    most = limits.get((gpu.address, vgpu_type.number))
    if most is None or "flavor-property" not in entry:
        return {}
    out = {"max-per-instance": str(most)}
    if most > 1:
        out["flavor-property-for-two"] = multivgpu.flavor_for(
            gpu.framework, entry["flavor-property"], 2)
        if gpu.framework != VFIO:
            out.update(_group_policy(out["flavor-property-for-two"],
                                     full=capacity.most(gpu, vgpu_type, None) == 1))
    return out


ISOLATE = "group_policy=isolate"


def _group_policy(flavor: str, *, full: bool) -> Dict[str, str]:
    """The flavor for two mdev vGPUs with the group policy the type needs, and why.

    Placement needs a ``group_policy`` once a flavor has numbered resource
    groups. ``isolate`` takes each group from another resource provider (another
    GPU): what Nova's vGPU guide (doc/source/admin/virtual-gpu.rst) asks for
    vGPUs that must be on distinct GPUs, as NVIDIA's full-framebuffer types are
    (one per GPU). Fractional vGPUs of one type may share their GPU (NVIDIA's
    Fractional Multi-vGPU): ``none`` lets Placement take both from one GPU.
    """
    if full:
        return {"flavor-property-for-two": flavor,
                "flavor-note-for-two": f"{ISOLATE}: each vGPU from a distinct GPU (a "
                                       "full-framebuffer type is one per GPU; Nova's vGPU guide)"}
    return {"flavor-property-for-two": flavor.replace(ISOLATE, "group_policy=none"),
            "flavor-note-for-two": "group_policy=none: fractional vGPUs of one type may share "
                                   "the same GPU (NVIDIA's Fractional Multi-vGPU), so Placement "
                                   "may take both from one GPU"}


def _whole_result(group, pci_in_placement: bool) -> Dict[str, str]:
    """A group of GPUs given whole: Nova's device type, the alias and the flavor property."""
    from .plan import whole_gpu

    gpu = group[0][0]
    made = whole_gpu(gpu)
    return {
        "addresses": ",".join(member.address for member, _ in group),
        "model": gpu.model,
        "device-id": gpu.device_id,
        "driver": gpu.driver or "none",
        "passthrough": "whole GPU (no vGPU types)",
        "device-type": made.device_type,
        "resource-class": made.resource_class,
        "flavor-property": f"pci_passthrough:alias={made.alias_name}:1",
        "pci-alias": json.dumps(novaconf.whole_alias(made, pci_in_placement=pci_in_placement),
                                sort_keys=True),
    }


def _product_id(gpu) -> str:
    """The VFs' own device id, as ``[pci]`` wants it: ``26b9``."""
    return gpu.vfs[0].device_id.lower().removeprefix("0x")


def types_table(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]] = None, *,
                mdev_class: bool = False, pci_in_placement: bool = False,
                live_migration: bool = False, whole_gb: Optional[Mapping[str, int]] = None,
                held: Optional[capacity.Held] = None,
                published: Optional[novaconf.Sections] = None,
                multi: Optional[Multi] = None, whole: Tuple[str, ...] = (),
                mig_off: Optional[Mapping[str, str]] = None) -> str:
    """A fixed-width table, one row per group of like GPUs and type, bounded.

    GPUS names every GPU of the group (as :func:`gpu_results` groups them);
    FLAVOR is the flavor property that asks for one vGPU of the type (none
    for a type the mapping refuses); the keyword arguments are as for
    :func:`gpu_results`. Under the table, the ``[pci] alias`` of each VFIO
    type (at most ``ALIASES_SHOWN``; every one is in the nested results), then
    the note on types that share a resource class (their FLAVOR points to it),
    then (``multi``) the flavor for two of each type one instance may have
    several of. GPUs given ``whole`` are a row each group, with their alias.
    """
    from .migplan import refused
    from .plan import alias_name, flavor_property, whole_gpu

    if not host.gpus:
        return "no NVIDIA GPU on this host"
    rows: List[List[str]] = [["GPUS", "MODEL", "TYPE", "NAME", "FRAMEBUFFER", "MAX", "AVAILABLE",
                              "FLAVOR"]]
    aliases: Dict[str, str] = {}
    notes = shared_class_notes(published)
    limits = per_instance(host, offered, whole_gb, multi, mapped_gpus(host, published)) \
        if multi is not None else {}
    several: Dict[str, str] = {}
    for group in _groups(host, offered, whole_gb, held, whole, mig_off):
        gpu, types = group[0]
        addresses = ",".join(member.address for member, _ in group)
        if gpu.address in whole:
            made = whole_gpu(gpu)
            rows.append([addresses, gpu.model, "-", f"whole GPU ({made.device_type})", "-",
                         str(len(group)), "-", f"pci_passthrough:alias={made.alias_name}:1"])
            aliases.setdefault(made.alias_name, json.dumps(novaconf.whole_alias(
                made, pci_in_placement=pci_in_placement), sort_keys=True))
            continue
        if not types:
            why = "no VFs enabled" if gpu.vfs_missing else "driver not loaded?"
            rows.append([addresses, gpu.model, "-", f"no types ({why})", "-", "-", "-", "-"])
        for vgpu_type, most, available in types:
            fb = vgpu_type.framebuffer_mb
            flavor = ("none (the mapping refuses it)" if refused(gpu, vgpu_type)
                      else flavor_property(vgpu_type, gpu.framework, mdev_class)
                      + (SHARED_MARK if vgpu_type.id in notes else ""))
            rows.append([
                addresses, gpu.model, vgpu_type.id, vgpu_type.name,
                f"{fb} MiB" if fb is not None else "-", _text(most), _text(available), flavor,
            ])
            most = limits.get((gpu.address, vgpu_type.number), 1)
            if most > 1 and not refused(gpu, vgpu_type):
                two = multivgpu.flavor_for(gpu.framework, flavor_property(
                    vgpu_type, gpu.framework, mdev_class), 2)
                if gpu.framework != VFIO:  # the group policy the type needs, as the results say
                    two = _group_policy(two, full=capacity.most(gpu, vgpu_type, None) == 1)[
                        "flavor-property-for-two"]
                several.setdefault(vgpu_type.id, f"  {vgpu_type.id} ({vgpu_type.name}), up to "
                                   f"{most}: {two}")
            if gpu.framework == VFIO and gpu.vfs:
                name = alias_name(vgpu_type.name)
                aliases.setdefault(name, json.dumps(novaconf.alias(
                    vgpu_type.name, _product_id(gpu), pci_in_placement=pci_in_placement,
                    live_migratable=live_migration), sort_keys=True))
    footer = _alias_lines(list(aliases.values()), any(g.address in whole for g in host.gpus)) + "".join(
        f"\n\n{note}" for note in dict.fromkeys(notes.values()))
    if several:
        footer += ("\n\nSeveral vGPUs in one instance (the flavor for two):\n"
                   + "\n".join(list(several.values())[:ALIASES_SHOWN]))
    body = table.render(rows[0], rows[1:], what="types",
                        max_bytes=table.MAX_TABLE_BYTES - len(footer.encode()))
    return body + footer


def _mig_entry(gpu, vgpu_type: VgpuType) -> Dict[str, str]:
    """A MIG-backed type's compute slices and the GPU instance profile it sits on (vgpu.mig)."""
    named = mig_profile(vgpu_type.name)
    if named is None:
        return {}

    shape = profiles.geometry(gpu)
    found = profiles.slot(shape, named) if shape is not None else None
    entry = {"mig-slices": str(named.slices)}
    if found is not None:
        entry["gpu-instance-profile"] = (
            f"{profiles.instance_name(found.instance, named, shape)} (at most {found.instance.most}, "
            f"{found.per_instance} vGPU each)")
    if shape is not None and shape.gfx_only and not named.gfx:
        # NVIDIA/vgpu-device-manager's config key for it (pkg/vgpu/config.go): the same type.
        entry["also-mapped-as"] = f"{named.name.split()[-1]}GFX"
    return entry


def _gpu_instances(gpus) -> Dict[str, str]:
    """``gpu-instances``: each VF's GPU instance (``nvidia/gpu_instance_id``), where one is held."""
    if gpus[0].framework != VFIO:
        return {}
    from . import miginstances

    held = [(vf.address, miginstances.instance_id(vf.address))
            for gpu in gpus for vf in gpu.vfs if vf.current_type]
    shown = [f"{address}={gi}" for address, gi in held if gi is not None]
    return {"gpu-instances": ",".join(shown)} if shown else {}


def _alias_lines(aliases: List[str], whole: bool = False) -> str:
    """``[pci] alias`` lines under the table, at most ``ALIASES_SHOWN`` of them."""
    if not aliases:
        return ""
    what = "VFIO type and whole GPU" if whole else "VFIO type"
    lines = [f"\n\n[pci] alias of each {what} ({ALIAS_WHERE}):"]
    lines += [f"  {alias}" for alias in aliases[:ALIASES_SHOWN]]
    if len(aliases) > ALIASES_SHOWN:
        lines.append(f"  ... and {len(aliases) - ALIASES_SHOWN} more; see pci-alias in the "
                     "nested results")
    return "\n".join(lines)


def _text(value) -> str:
    return "-" if value is None else str(value)
