"""What the list-vgpu-types action returns: nested results and a readable table."""

import json
from typing import Dict, List, Mapping, Optional, Tuple

from . import table
from .pci import VFIO, Host, VgpuType


def gpu_results(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]] = None,
                mdev_class: bool = False) -> Dict[str, dict]:
    """Per GPU (keys gpu-0, gpu-1, ... in address order): address, model, types.

    Juju result keys allow only lowercase letters, digits and hyphens, so the
    addresses and type names are values, never keys. Each type says the
    flavor property that asks for it and, on vendor-specific VFIO GPUs, the
    ``[pci] alias`` that nova-cloud-controller (and nova-compute) need.
    ``offered``: every type per GPU, learnt ones included (a full VFIO GPU
    lists none in sysfs).
    """
    from .plan import alias_name, flavor_property, resource_class

    out: Dict[str, dict] = {}
    for index, gpu in enumerate(host.gpus):
        types: Dict[str, dict] = {}
        for vgpu_type in (offered or {}).get(gpu.address) or gpu.offered_types():
            entry = {
                "id": vgpu_type.id,
                "name": vgpu_type.name,
                "framework": vgpu_type.framework,
                "flavor-property": flavor_property(vgpu_type, gpu.framework, mdev_class),
            }
            if gpu.framework == VFIO and gpu.vfs:
                entry["resource-class"] = resource_class(vgpu_type.name)
                entry["pci-alias"] = json.dumps({
                    "name": alias_name(vgpu_type.name), "device_type": "type-VF",
                    "vendor_id": "10de", "product_id": gpu.vfs[0].device_id.lower().removeprefix("0x"),
                    "resource_class": resource_class(vgpu_type.name)}, sort_keys=True)
            elif mdev_class:
                entry["resource-class"] = resource_class(vgpu_type.name)
            for key, value in (("framebuffer-mb", vgpu_type.framebuffer_mb),
                               ("max-instances", vgpu_type.max_instances),
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
        out[f"gpu-{index}"] = result
    return out


def types_table(host: Host, offered: Optional[Mapping[str, Tuple[VgpuType, ...]]] = None) -> str:
    """A fixed-width table, one row per GPU and type (``offered``: learnt types too), bounded."""
    if not host.gpus:
        return "no NVIDIA GPU on this host"
    rows: List[List[str]] = [["ADDRESS", "MODEL", "TYPE", "NAME", "FRAMEBUFFER", "MAX", "AVAILABLE"]]
    for gpu in host.gpus:
        types = (offered or {}).get(gpu.address) or gpu.offered_types()
        if not types:
            why = "no VFs enabled" if gpu.vfs_missing else "driver not loaded?"
            rows.append([gpu.address, gpu.model, "-", f"no types ({why})", "-", "-", "-"])
        for vgpu_type in types:
            fb = vgpu_type.framebuffer_mb
            rows.append([
                gpu.address, gpu.model, vgpu_type.id, vgpu_type.name,
                f"{fb} MiB" if fb is not None else "-",
                _text(vgpu_type.max_instances), _text(_available(gpu, vgpu_type)),
            ])
    return table.render(rows[0], rows[1:], what="types")


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
