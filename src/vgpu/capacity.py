"""vGPUs per GPU and type: how many fit, how many guests hold, how many a new guest could get.

One computation, :func:`count`, answers all of them: ``list-vgpu-types``'
``max-instances`` and ``available-instances``, the status line's ``used`` and
``free`` (:func:`capacity`, per published type) and the exporter's
``nvidia_vgpu_type_*`` metrics (:mod:`vgpu.metrics`); the ``vgpu-usage``
action lists, one by one, the vGPUs it counts as used. Here, not in
:mod:`vgpu.usage` (the vgpu-usage action's records, licence editions and
tables), so that every hook's status imports only this. It reads
``sys/bus/mdev/devices`` and libvirt's XML only when there is something to count.

* **used**: vGPUs a guest libvirt knows holds, running or shut off (Nova keeps a
  shut-off instance's vGPU and its Placement allocation);
* **available**: what a new guest could get now: vGPUs that exist and no guest
  holds (a VFIO VF that holds the type, an idle mdev: Nova hands them out
  again), plus those that can still be created (a free VF that lists the type,
  ``available_instances`` of an mdev type), at most what the GPU holds less
  what it holds already;
* **most**: how many of the type one GPU holds (:func:`most`).

Fail safe: what cannot be read counts as used, never as free, and the count
says so (``2 used (1 uncertain)``): an mdev whose links cannot be followed
(its type is then unknown: it counts for the type its parent offers, for
every type when its parent is unknown too), a function whose
``available_instances`` cannot be read (one vGPU), the mdev bus that cannot be
listed (one vGPU per type), and, while a libvirt domain file cannot be read,
every mdev and VF no readable file holds (that file may); nothing is then
counted as creatable on a free VFIO VF either.
"""

from __future__ import annotations

import os
import re
from typing import Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from . import MDEV_UUID, guests, hostroot, pci, plan, profiles
from .errors import HostReadError
from .record import NamedTuple

MDEV_BUS = "sys/bus/mdev/devices"
_UUID = re.compile(MDEV_UUID + r"\Z")


class Held(NamedTuple):
    """What guests hold and which mdevs exist, read once for every count of one reading."""

    mdevs: frozenset = frozenset()  # mdev uuids a running or defined domain holds
    pci: frozenset = frozenset()  # PCI addresses (VFIO VFs) a running or defined domain holds
    problems: Tuple[str, ...] = ()  # domain files that could not be read: they may hold anything
    created: Mapping[str, Tuple[str, str]] = {}  # mdev uuid -> (parent address, type id)
    unknown: Tuple[Optional[str], ...] = ()  # the parent of each mdev that cannot be read


def held(mdevs: bool = True, domains: Optional[Sequence[guests.Domain]] = None,
         problems: Sequence[str] = ()) -> Held:
    """Read what guests hold (libvirt's XML) and, with ``mdevs``, the mdev bus.

    ``domains``: :func:`vgpu.guests.domains` read already, with the files it
    could not read in ``problems``; read here when None.
    """
    if domains is None:
        held_mdevs, held_pci, unread = guests.held_devices()
    else:
        held_mdevs = {uuid for domain in domains for uuid in domain.mdevs}
        held_pci = {address for domain in domains for address in domain.pci}
        unread = list(problems)
    created, unknown = _created_mdevs() if mdevs else ({}, [])
    return Held(frozenset(held_mdevs), frozenset(held_pci), tuple(unread), created,
                tuple(unknown))


class Count(NamedTuple):
    """vGPUs of one type on some GPUs (see the module doc)."""

    used: int = 0  # held by a guest; what cannot be read counts here too
    idle: int = 0  # existing vGPUs of the type no guest holds (typed VFs, idle mdevs)
    creatable: Optional[int] = 0  # vGPUs that can still be created now; None: cannot be told
    uncertain: int = 0  # of ``used``: what could not be read

    @property
    def available(self) -> Optional[int]:
        """What a new guest could get now: idle plus creatable; None when that cannot be told."""
        return None if self.creatable is None else self.idle + self.creatable


def count(gpus: Sequence[pci.Gpu], type_id: str, seen: Held,
          within: Optional[Collection[str]] = None,
          whole_gb: Optional[Mapping[str, int]] = None, fits: Optional[int] = None) -> Count:
    """vGPUs of ``type_id`` (``nvidia-<n>``) on ``gpus``, on the functions ``within`` (None: all).

    Each GPU is counted by its own framework. ``seen``: :func:`held`.
    ``whole_gb``: each VFIO GPU's whole framebuffer in GB where known
    (:func:`vgpu.catalogue.whole_gpus`), which counts a time-sliced profile
    on a partly used GPU. ``fits``: :func:`most` of the type on the one GPU
    counted, when the caller has it already (worked out here when needed otherwise).
    """
    total = Count()
    places: set = set()
    mdev = False  # whether any GPU counts mdevs (the mdevs are then counted once, below)
    for gpu in gpus:
        if gpu.framework == pci.VFIO:
            part = _vfio_count(gpu, type_id, seen, within, (whole_gb or {}).get(gpu.address),
                               fits if len(gpus) == 1 else None)
        else:
            part, offering = _mdev_room(gpu, type_id, seen, within)
            places.update(offering)
            mdev = True
        total = _add(total, part)
    return _add(total, _mdevs_of(type_id, places, seen)) if mdev else total


def most(gpu: pci.Gpu, vgpu_type: pci.VgpuType, whole_gb: Optional[int] = None) -> Optional[int]:
    """How many of the type one GPU holds, None where that cannot be told.

    The mdev description's, a MIG-backed profile's, or (VFIO, time-sliced) the
    profile's framebuffer against the whole GPU's (``whole_gb``), as a mapping counts it.
    """
    if vgpu_type.max_instances is not None:
        return vgpu_type.max_instances
    named = profiles.mig_profile(vgpu_type.name)
    if named is not None:

        return profiles.fits(gpu, named)
    if gpu.framework == pci.VFIO and not gpu.types:
        return plan.vfio_fits(gpu, vgpu_type, whole_gb)
    return None


def _add(one: Count, other: Count) -> Count:
    creatable = (None if one.creatable is None or other.creatable is None
                 else one.creatable + other.creatable)
    return Count(one.used + other.used, one.idle + other.idle, creatable,
                 one.uncertain + other.uncertain)


def _vfio_count(gpu: pci.Gpu, type_id: str, seen: Held, within: Optional[Collection[str]],
                whole_gb: Optional[int], fits: Optional[int] = None) -> Count:
    """VFs that hold the type (used or idle), and free VFs that can still take it."""
    number = _number(type_id)
    used = idle = unsure = 0
    candidates: List[pci.VgpuType] = []
    holding = 0  # VFs of the whole GPU that hold the type, counted or not
    for vf in gpu.vfs:
        if vf.current_type == number:
            holding += 1
        if within is not None and vf.address not in within:
            continue
        if vf.current_type == number:
            if vf.address in seen.pci:
                used += 1
            elif seen.problems:  # a domain file that cannot be read may hold it
                used, unsure = used + 1, unsure + 1
            else:
                idle += 1
        elif not vf.current_type and vf.address not in seen.pci:
            candidates += [t for t in vf.types if t.number == number][:1]
    creatable: Optional[int] = 0
    if candidates and not seen.problems:
        fits = most(gpu, candidates[0], whole_gb) if fits is None else fits
        creatable = None if fits is None else max(0, min(len(candidates), fits - holding))
    return Count(used, idle, creatable, unsure)


def _mdev_room(gpu: pci.Gpu, type_id: str, seen: Held, within: Optional[Collection[str]]
               ) -> Tuple[Count, List[str]]:
    """What the GPU's functions offering an mdev type can still create; those functions.

    On SR-IOV GPUs each VF holds at most one vGPU, whatever its type says, and
    the GPU at most what the type fits less the mdevs of the type its VFs hold.
    """
    offering: List[str] = []
    fits: Optional[int] = None
    room = used = 0
    for function in (gpu,) + tuple(gpu.vfs):
        if within is not None and function.address not in within:
            continue
        found = [t for t in function.types if t.id == type_id and t.framework == pci.MDEV]
        if not found:
            continue
        offering.append(function.address)
        fits = found[0].max_instances if function is not gpu else None
        try:
            creatable = pci.available_instances(function.address, type_id) or 0
        except HostReadError:
            used += 1
            continue
        room += min(creatable, 1) if function is not gpu else creatable
    if fits is not None:
        vfs = {vf.address for vf in gpu.vfs}
        if not any(named is None or named in vfs for named in seen.unknown):
            made = sum(1 for parent, kind in seen.created.values() if kind == type_id and parent in vfs)
            room = max(0, min(room, fits - made))
        else:  # mdevs that cannot be read may be this type's: nothing beyond what the type fits
            room = min(room, fits)
    return Count(used, 0, room, used), offering


def _mdevs_of(type_id: str, places: Collection[str], seen: Held) -> Count:
    """Created mdevs of the type on ``places``: held (used) or idle; unreadable ones as used."""
    used = idle = unsure = 0
    for uuid, (parent, mdev_type) in seen.created.items():
        if mdev_type == type_id and parent in places:
            if uuid in seen.mdevs:
                used += 1
            elif seen.problems:  # a domain file that cannot be read may hold it
                used, unsure = used + 1, unsure + 1
            else:
                idle += 1  # created but idle: Nova hands it out again
    for named in seen.unknown:  # its type cannot be told: used, if it may be this type's
        if named is None or named in places:
            used, unsure = used + 1, unsure + 1
    return Count(used, idle, 0, unsure)


def _number(type_id: str) -> Optional[int]:
    digits = type_id.removeprefix("nvidia-")
    return int(digits) if digits.isdigit() else None


# -- the status line: per published type ---------------------------------------------------------

class Capacity(NamedTuple):
    """How many vGPUs of one published type are held and how many more fit."""
    type_id: str
    used: int
    free: int
    uncertain: int = 0  # of ``used``: what could not be read, counted as used (module doc)


def capacity(host: pci.Host, mapping: Mapping[str, Tuple[str, ...]]) -> List[Capacity]:
    """vGPUs used and free per published type or (VFIO) resource class, by :func:`count`.

    ``mapping`` is what nova-compute was given (``{type: addresses}``, VFIO VFs
    under their ``CUSTOM_VGPU_*`` class); a type without addresses (Queens to
    Train) counts every function offering it. A published VF counts under the
    type it holds; one that lost its type (a reboot the boot step did not
    restore yet) as room for the class's type when it lists it.
    Reads ``sys/bus/mdev/devices`` and the libvirt XML only when there is
    something to count. What cannot be read counts as used (see the module doc).
    """
    if not mapping:
        return []
    seen = held(mdevs=any(not key.startswith(plan.CLASS_PREFIX) for key in mapping))
    out: List[Capacity] = []
    for key, addresses in mapping.items():
        if key.startswith(plan.WHOLE_PREFIX):
            found = _whole_count(set(addresses), seen)
        elif key.startswith(plan.CLASS_PREFIX):
            found = _class_count(host, key, set(addresses), seen)
        else:
            found = count(host.gpus, key, seen, set(addresses) if addresses else None)
        free = found.available if found.available is not None else found.idle
        out.append(Capacity(key, found.used, free, found.uncertain))
    return out


def _whole_count(within: Collection[str], seen: Held) -> Count:
    """GPUs given whole (``CUSTOM_GPU_*``): used while a domain holds one, else idle.

    A domain file that cannot be read may hold any of them: those count as used.
    """
    used = sum(1 for address in within if address in seen.pci)
    unsure = len(within) - used if seen.problems else 0
    return Count(used + unsure, len(within) - used - unsure, 0, unsure)


def _class_count(host: pci.Host, key: str, within: Collection[str], seen: Held) -> Count:
    """A resource class's published VFs, counted under each type of the class they hold or list.

    A type whose name no VF lists (a full GPU) counts as the class's: the charm wrote it.
    """
    total = Count()
    for gpu in host.gpus:
        numbers: set = set()
        for vf in gpu.vfs:
            if vf.address in within:  # a type it holds, or (without one) those it can take
                numbers.update([vf.current_type] if vf.current_type else (t.number for t in vf.types))
        for number in sorted(numbers):
            name = next((t.name for vf in gpu.vfs for t in vf.types if t.number == number), None)
            if name is not None and plan.resource_class(name) != key:
                continue  # another profile, not this class's
            total = _add(total, _vfio_count(gpu, f"nvidia-{number}", seen, within, None))
    return total


def capacity_text(entries: Sequence[Capacity], limit: int = 3) -> str:
    """``nvidia-108: 1 used, 3 free; nvidia-109: 2 used (1 uncertain), 0 free`` (at most ``limit``)."""
    parts = [f"{c.type_id}: {c.used} used{f' ({c.uncertain} uncertain)' if c.uncertain else ''}, "
             f"{c.free} free" for c in entries[:limit]]
    if len(entries) > limit:
        parts.append(f"+{len(entries) - limit} more types (vgpu-usage)")
    return "; ".join(parts)


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
