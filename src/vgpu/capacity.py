"""vGPUs used and free per published type: the count at the end of the status line.

Here, not in :mod:`vgpu.usage` (the vgpu-usage action's report: its records,
licence editions and tables), so that every hook's status imports only this.
It reads ``sys/bus/mdev/devices`` and libvirt's XML only when there is
something to count.
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import guests, hostroot, pci, plan
from .record import NamedTuple

MDEV_BUS = "sys/bus/mdev/devices"
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


class Capacity(NamedTuple):
    """How many vGPUs of one published type are held and how many more fit."""
    type_id: str
    used: int
    free: int


def capacity(host: pci.Host, mapping: Mapping[str, Tuple[str, ...]]) -> List[Capacity]:
    """vGPUs used and free per published type or (VFIO) resource class.

    ``mapping`` is what nova-compute was given (``{type: addresses}``, VFIO VFs
    under their ``CUSTOM_VGPU_*`` class); a type without addresses (Queens to
    Train) counts every function offering it.
    Reads ``sys/bus/mdev/devices`` and the libvirt XML only when there is
    something to count.
    """
    if not mapping:
        return []
    held_mdevs, held_pci = guests.held_devices()
    created = None
    out: List[Capacity] = []
    for key, addresses in mapping.items():
        if key.startswith(plan.CLASS_PREFIX):
            # VFs published as PCI devices (vendor-specific VFIO): one vGPU each.
            used = len([a for a in addresses if a in held_pci])
            out.append(Capacity(key, used, len(addresses) - used))
            continue
        if created is None:
            created = _created_mdevs()
        functions = _functions_offering(host, key, addresses)
        # On SR-IOV GPUs each VF holds at most one vGPU, whatever its type says.
        # Read here, for the published functions only: discovery leaves it out.
        free = sum(min(pci.available_instances(address, t.id) or 0, 1 if is_vf else 1 << 30)
                   for address, t, is_vf in functions)
        places = {address for address, _, _ in functions}
        used = 0
        for uuid, (parent, mdev_type) in created.items():
            if mdev_type == key and parent in places:
                if uuid in held_mdevs:
                    used += 1
                else:
                    free += 1  # created but idle: Nova hands it out again
        out.append(Capacity(key, used, free))
    return out


def capacity_text(entries: Sequence[Capacity], limit: int = 3) -> str:
    """``nvidia-108: 1 used, 3 free; nvidia-109: 0 used, 1 free`` (at most ``limit``)."""
    parts = [f"{c.type_id}: {c.used} used, {c.free} free" for c in entries[:limit]]
    if len(entries) > limit:
        parts.append(f"+{len(entries) - limit} more types (vgpu-usage)")
    return "; ".join(parts)


def _functions_offering(host: pci.Host, type_id: str, addresses: Tuple[str, ...]):
    out = []
    for gpu in host.gpus:
        for function in (gpu,) + tuple(gpu.vfs):
            if addresses and function.address not in addresses:
                continue
            for vgpu_type in function.types:
                if vgpu_type.id == type_id and vgpu_type.framework == pci.MDEV:
                    out.append((function.address, vgpu_type, function is not gpu))
    return out


def _created_mdevs() -> Dict[str, Tuple[str, str]]:
    """{mdev uuid: (parent address, type id)} from one listing of sys/bus/mdev/devices."""
    try:
        names = os.listdir(hostroot.path(MDEV_BUS))
    except OSError:
        return {}
    out = {}
    for name in names:
        found = mdev_device(name.lower())
        if found is not None:
            out[name.lower()] = found[:2]
    return out


def mdev_device(uuid: str) -> Optional[Tuple[str, str, str]]:
    """(parent address, type id, type directory) of a created mdev, or None if absent."""
    if not _UUID.match(uuid):
        return None
    entry = hostroot.path(MDEV_BUS, uuid)
    try:
        device = os.path.realpath(entry, strict=True)
        type_dir = os.path.realpath(os.path.join(device, "mdev_type"), strict=True)
    except OSError:
        return None
    return os.path.basename(os.path.dirname(device)), os.path.basename(type_dir), type_dir
