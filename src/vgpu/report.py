"""What the list-vgpu-types action returns: nested results and a readable table.

Each type says how a flavor asks for it, which depends on the framework:

* mediated devices (mdev): ``resources:VGPU=1``, or with
  ``mdev-class-per-profile`` ``resources:CUSTOM_VGPU_<PROFILE>=1``;
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

import json
from typing import Dict, List, Mapping, Optional, Tuple

from . import novaconf, table
from .pci import VFIO, Host, VgpuType

ALIASES_SHOWN = 20  # alias lines under the table at most; all are in the nested results
ALIAS_WHERE = "nova-cloud-controller and nova-compute pci-alias"


def gpu_results(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]] = None,
                mdev_class: bool = False, pci_in_placement: bool = False,
                live_migration: bool = False) -> Dict[str, dict]:
    """Per GPU (keys gpu-0, gpu-1, ... in address order): address, model, types.

    Juju result keys allow only lowercase letters, digits and hyphens, so the
    addresses and type names are values, never keys. Each type says the
    flavor property that asks for it and, on vendor-specific VFIO GPUs, the
    ``[pci] alias`` that nova-cloud-controller (and nova-compute) need
    (``pci_in_placement``, ``live_migration``: the charm's options of those
    names, shaping the alias). ``offered``: every type per GPU, learnt ones
    included (a full VFIO GPU lists none in sysfs).
    """
    out: Dict[str, dict] = {}
    for index, gpu in enumerate(host.gpus):
        types: Dict[str, dict] = {}
        for vgpu_type in (offered or {}).get(gpu.address) or gpu.offered_types():
            entry = _type_entry(gpu, vgpu_type, mdev_class, pci_in_placement, live_migration)
            entry.update(_mig_entry(gpu, vgpu_type))
            for key, value in (("framebuffer-mb", vgpu_type.framebuffer_mb),
                               ("max-instances", _most(gpu, vgpu_type)),
                               ("available-instances", _available(gpu, vgpu_type))):
                if value is not None:
                    entry[key] = str(value)
            types[vgpu_type.id] = entry
        result = {
            "address": gpu.address,
            "model": gpu.model,
            "device-id": gpu.device_id,
            "driver": gpu.driver or "none",
            "types": types or "none (is the vGPU host driver loaded?)",
        }
        if gpu.sriov:
            result["virtual-functions"] = ",".join(vf.address for vf in gpu.vfs) or "none enabled"
        result.update(_gpu_instances(gpu))
        out[f"gpu-{index}"] = result
    return out


def _type_entry(gpu, vgpu_type: VgpuType, mdev_class: bool, pci_in_placement: bool,
                live_migration: bool) -> Dict[str, str]:
    """id, name, framework, the flavor property and (VFIO) the alias of one type."""
    from .plan import flavor_property, resource_class

    entry = {
        "id": vgpu_type.id,
        "name": vgpu_type.name,
        "framework": vgpu_type.framework,
        "flavor-property": flavor_property(vgpu_type, gpu.framework, mdev_class),
    }
    if gpu.framework == VFIO and gpu.vfs:
        rc = resource_class(vgpu_type.name)
        entry["resource-class"] = rc
        entry["pci-alias"] = json.dumps(novaconf.alias(
            vgpu_type.name, _product_id(gpu), pci_in_placement=pci_in_placement,
            live_migratable=live_migration), sort_keys=True)
    elif mdev_class:
        entry["resource-class"] = resource_class(vgpu_type.name)
    return entry


def _product_id(gpu) -> str:
    """The VFs' own device id, as ``[pci]`` wants it: ``26b9``."""
    return gpu.vfs[0].device_id.lower().removeprefix("0x")


def types_table(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]] = None, *,
                mdev_class: bool = False, pci_in_placement: bool = False,
                live_migration: bool = False) -> str:
    """A fixed-width table, one row per GPU and type (``offered``: learnt types too), bounded.

    FLAVOR is the flavor property that asks for one vGPU of the type; the
    keyword arguments are the charm's options, as for :func:`gpu_results`.
    Under the table, the ``[pci] alias`` of each VFIO type (at most
    ``ALIASES_SHOWN``; every one is in the nested results).
    """
    from .plan import alias_name, flavor_property

    if not host.gpus:
        return "no NVIDIA GPU on this host"
    rows: List[List[str]] = [["ADDRESS", "MODEL", "TYPE", "NAME", "FRAMEBUFFER", "MAX", "AVAILABLE",
                              "FLAVOR"]]
    aliases: Dict[str, str] = {}
    for gpu in host.gpus:
        types = (offered or {}).get(gpu.address) or gpu.offered_types()
        if not types:
            why = "no VFs enabled" if gpu.vfs_missing else "driver not loaded?"
            rows.append([gpu.address, gpu.model, "-", f"no types ({why})", "-", "-", "-", "-"])
        for vgpu_type in types:
            fb = vgpu_type.framebuffer_mb
            rows.append([
                gpu.address, gpu.model, vgpu_type.id, vgpu_type.name,
                f"{fb} MiB" if fb is not None else "-",
                _text(_most(gpu, vgpu_type)), _text(_available(gpu, vgpu_type)),
                flavor_property(vgpu_type, gpu.framework, mdev_class),
            ])
            if gpu.framework == VFIO and gpu.vfs:
                name = alias_name(vgpu_type.name)
                aliases.setdefault(name, json.dumps(novaconf.alias(
                    vgpu_type.name, _product_id(gpu), pci_in_placement=pci_in_placement,
                    live_migratable=live_migration), sort_keys=True))
    footer = _alias_lines(list(aliases.values()))
    body = table.render(rows[0], rows[1:], what="types",
                        max_bytes=table.MAX_TABLE_BYTES - len(footer.encode()))
    return body + footer


def _mig_entry(gpu, vgpu_type: VgpuType) -> Dict[str, str]:
    """A MIG-backed type's compute slices and the GPU instance profile it sits on (vgpu.mig)."""
    from . import mig

    named = mig.mig_profile(vgpu_type.name)
    if named is None:
        return {}
    shape = mig.geometry(gpu)
    found = mig.slot(shape, named) if shape is not None else None
    entry = {"mig-slices": str(named.slices)}
    if found is not None:
        entry["gpu-instance-profile"] = (f"{found.instance.name} (at most {found.instance.most}, "
                                         f"{found.per_instance} vGPU each)")
    return entry


def _most(gpu, vgpu_type: VgpuType):
    """How many of the type one GPU holds: the mdev description's, or a MIG-backed profile's."""
    if vgpu_type.max_instances is not None:
        return vgpu_type.max_instances
    from . import mig

    named = mig.mig_profile(vgpu_type.name)
    return mig.fits(gpu, named) if named is not None else None


def _gpu_instances(gpu) -> Dict[str, str]:
    """``gpu-instances``: each VF's GPU instance (``nvidia/gpu_instance_id``), where one is held."""
    if gpu.framework != VFIO:
        return {}
    from . import mig

    held = [(vf.address, mig.instance_id(vf.address)) for vf in gpu.vfs if vf.current_type]
    shown = [f"{address}={gi}" for address, gi in held if gi is not None]
    return {"gpu-instances": ",".join(shown)} if shown else {}


def _alias_lines(aliases: List[str]) -> str:
    """``[pci] alias`` lines under the table, at most ``ALIASES_SHOWN`` of them."""
    if not aliases:
        return ""
    lines = [f"\n\n[pci] alias of each VFIO type ({ALIAS_WHERE}):"]
    lines += [f"  {alias}" for alias in aliases[:ALIASES_SHOWN]]
    if len(aliases) > ALIASES_SHOWN:
        lines.append(f"  ... and {len(aliases) - ALIASES_SHOWN} more; see pci-alias in the "
                     "nested results")
    return "\n".join(lines)


def _available(gpu, vgpu_type):
    """Instances still creatable; on SR-IOV GPUs one per free VF, at most what the type fits.

    Each VF holds at most one vGPU, and the GPU holds at most ``max_instance``
    of the type, however many VFs still list it.
    """
    if gpu.types:
        return vgpu_type.available_instances
    counts = [min(t.available_instances, 1) for vf in gpu.vfs for t in vf.types
              if t.number == vgpu_type.number and t.available_instances is not None]
    if not counts:
        return None
    fits = vgpu_type.max_instances
    return sum(counts) if fits is None else min(sum(counts), fits)


def _text(value) -> str:
    return "-" if value is None else str(value)
