"""vGPUs used and free per published type: the count at the end of the status line.

Here, not in :mod:`vgpu.usage` (the vgpu-usage action's report: its records,
licence editions and tables), so that every hook's status imports only this.
It reads ``sys/bus/mdev/devices`` and libvirt's XML only when there is
something to count.

Fail safe: what cannot be read counts as used, never as free, and the count
says so (``2 used (1 uncertain)``): an mdev whose links cannot be followed
(its type is then unknown: it counts for the type its parent is published
with, for every type when its parent is unknown too), a published function
whose ``available_instances`` cannot be read (one vGPU), the mdev bus that
cannot be listed (one vGPU per type), and, while a libvirt domain file cannot
be read, every mdev and VF no readable file holds (that file may).
"""

from __future__ import annotations

import os
import re
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple

from . import MDEV_UUID, guests, hostroot, pci, plan
from .errors import HostReadError
from .record import NamedTuple

MDEV_BUS = "sys/bus/mdev/devices"
_UUID = re.compile(MDEV_UUID + r"\Z")


class Capacity(NamedTuple):
    """How many vGPUs of one published type are held and how many more fit."""
    type_id: str
    used: int
    free: int
    uncertain: int = 0  # of ``used``: what could not be read, counted as used (module doc)


def capacity(host: pci.Host, mapping: Mapping[str, Tuple[str, ...]]) -> List[Capacity]:
    """vGPUs used and free per published type or (VFIO) resource class.

    ``mapping`` is what nova-compute was given (``{type: addresses}``, VFIO VFs
    under their ``CUSTOM_VGPU_*`` class); a type without addresses (Queens to
    Train) counts every function offering it.
    Reads ``sys/bus/mdev/devices`` and the libvirt XML only when there is
    something to count. What cannot be read counts as used (see the module doc).
    """
    if not mapping:
        return []
    held_mdevs, held_pci, problems = guests.held_devices()
    created: Optional[Tuple[Dict[str, Tuple[str, str]], List[Optional[str]]]] = None
    out: List[Capacity] = []
    for key, addresses in mapping.items():
        if key.startswith(plan.CLASS_PREFIX):
            # VFs published as PCI devices (vendor-specific VFIO): one vGPU each.
            used = len([a for a in addresses if a in held_pci])
            unsure = len(addresses) - used if problems else 0  # an unreadable file may hold them
            out.append(Capacity(key, used + unsure, len(addresses) - used - unsure, unsure))
            continue
        if created is None:
            created = _created_mdevs()
        out.append(_mdev_capacity(host, key, addresses, created, held_mdevs, bool(problems)))
    return out


def _mdev_capacity(host: pci.Host, key: str, addresses: Tuple[str, ...],
                   created: Tuple[Dict[str, Tuple[str, str]], List[Optional[str]]],
                   held: Set[str], problems: bool) -> Capacity:
    """One mdev type's count; ``problems``: a domain file could not be read."""
    functions = _functions_offering(host, key, addresses)
    used = free = unsure = 0
    for address, vgpu_type, is_vf in functions:
        try:
            creatable = pci.available_instances(address, vgpu_type.id) or 0
        except HostReadError:
            used, unsure = used + 1, unsure + 1
            continue
        # On SR-IOV GPUs each VF holds at most one vGPU, whatever its type says.
        # Read here, for the published functions only: discovery leaves it out.
        free += min(creatable, 1 if is_vf else 1 << 30)
    places = {address for address, _, _ in functions}
    mdevs, unknown = created
    for uuid, (parent, mdev_type) in mdevs.items():
        if mdev_type == key and parent in places:
            if uuid in held:
                used += 1
            elif problems:  # a domain file that cannot be read may hold it
                used, unsure = used + 1, unsure + 1
            else:
                free += 1  # created but idle: Nova hands it out again
    for named in unknown:  # its type cannot be told: used, if it may be this type's
        if named is None or named in places:
            used, unsure = used + 1, unsure + 1
    return Capacity(key, used, free, unsure)


def capacity_text(entries: Sequence[Capacity], limit: int = 3) -> str:
    """``nvidia-108: 1 used, 3 free; nvidia-109: 2 used (1 uncertain), 0 free`` (at most ``limit``)."""
    parts = [f"{c.type_id}: {c.used} used{f' ({c.uncertain} uncertain)' if c.uncertain else ''}, "
             f"{c.free} free" for c in entries[:limit]]
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


def _created_mdevs() -> Tuple[Dict[str, Tuple[str, str]], List[Optional[str]]]:
    """({mdev uuid: (parent address, type id)}, the parent of each mdev that cannot be read).

    From one listing of sys/bus/mdev/devices. An mdev whose links cannot be
    followed has its parent from its bus link's text, None when that cannot be
    read either; a bus that cannot be listed is one such mdev.
    """
    where = hostroot.path(MDEV_BUS)
    try:
        names = os.listdir(where)
    except FileNotFoundError:
        return {}, []
    except OSError:
        return {}, [None]
    out = {}
    unknown: List[Optional[str]] = []
    for name in names:
        found = mdev_device(name.lower())
        if found is not None:
            out[name.lower()] = found[:2]
        elif _UUID.match(name.lower()) and os.path.lexists(os.path.join(where, name)):
            unknown.append(_named_parent(os.path.join(where, name)))
    return out, unknown


def _named_parent(entry: str) -> Optional[str]:
    """The parent an mdev's bus link names (``.../0000:c1:00.0/<uuid>``), if it is a link."""
    try:
        target = os.readlink(entry)
    except OSError:
        return None
    return os.path.basename(os.path.dirname(target.rstrip("/"))) or None


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
