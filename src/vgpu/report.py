"""What the list-vgpu-types action returns: nested results and a readable table."""

from typing import Dict, List

from . import table
from .pci import Host


def gpu_results(host: Host) -> Dict[str, dict]:
    """Per GPU (keys gpu-0, gpu-1, ... in address order): address, model, types.

    Juju result keys allow only lowercase letters, digits and hyphens, so the
    addresses and type names are values, never keys.
    """
    out: Dict[str, dict] = {}
    for index, gpu in enumerate(host.gpus):
        types: Dict[str, dict] = {}
        for vgpu_type in gpu.offered_types():
            entry = {
                "id": vgpu_type.id,
                "name": vgpu_type.name,
                "framework": vgpu_type.framework,
            }
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


def types_table(host: Host) -> str:
    """A fixed-width table, one row per GPU and type, bounded (see ``table.render``)."""
    if not host.gpus:
        return "no NVIDIA GPU on this host"
    rows: List[List[str]] = [["ADDRESS", "MODEL", "TYPE", "NAME", "FRAMEBUFFER", "MAX", "AVAILABLE"]]
    for gpu in host.gpus:
        offered = gpu.offered_types()
        if not offered:
            rows.append([gpu.address, gpu.model, "-", "no types (driver not loaded?)", "-", "-", "-"])
        for vgpu_type in offered:
            fb = vgpu_type.framebuffer_mb
            rows.append([
                gpu.address, gpu.model, vgpu_type.id, vgpu_type.name,
                f"{fb} MiB" if fb is not None else "-",
                _text(vgpu_type.max_instances), _text(_available(gpu, vgpu_type)),
            ])
    return table.render(rows[0], rows[1:], what="types")


def _available(gpu, vgpu_type):
    """Instances still creatable: summed over the VFs on SR-IOV GPUs."""
    if gpu.types:
        return vgpu_type.available_instances
    counts = [t.available_instances for vf in gpu.vfs for t in vf.types
              if t.number == vgpu_type.number and t.available_instances is not None]
    return sum(counts) if counts else None


def _text(value) -> str:
    return "-" if value is None else str(value)
