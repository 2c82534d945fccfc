"""What each GPU model's vendor-specific VFIO types are called, learnt while VFs were free.

On NVIDIA's vendor-specific VFIO framework a VF's ``nvidia/creatable_vgpu_types``
lists only what can still be created beside its siblings: once a GPU is full
it lists nothing, and the type a VF holds may appear in no list at all. So the
id <-> name table is learnt whenever a list shows it, and kept.

Where it lives: a JSON file under the host root,
``/var/lib/nova-compute-nvidia-vgpu/vgpu-types.json``, keyed by the GPU's PCI
device id and the loaded driver version (type ids change between driver
releases). It is learnt knowledge about the host's hardware and driver, not
charm state: it stays with the host (a charm refresh or a redeploy of the
unit finds it again), an operator can read it, and ``remove`` deletes it.
Writing it is skipped when nothing new was learnt, so update-status reads one
small file and writes none.
"""

from __future__ import annotations

import json
import logging
from typing import Dict, List, Mapping, Optional, Tuple

from . import files, hostroot, pci, profiles

log = logging.getLogger(__name__)

STATE_DIR = "var/lib/nova-compute-nvidia-vgpu"
FILE = f"{STATE_DIR}/vgpu-types.json"
LIMIT = 1 << 20  # bytes; a real table holds a few kilobytes per GPU model and driver

Table = Dict[str, Dict[str, str]]  # "<device id> <driver version>" -> {"<type id>": name}

# What a GPU model's whole framebuffer is, in GB: the largest time-sliced profile its VFs list
# while none holds a type, recorded under "<device id> whole GPU" -> {"framebuffer-gb": "48"}
# (names and sizes do not change between driver releases, ids do). Once a VF holds a type its
# siblings list only that size, so a partly used GPU no longer shows it.
WHOLE = "whole GPU"
FRAMEBUFFER = "framebuffer-gb"
# The same, for the models the charm knows from public listings of free GPUs, used when none
# was recorded (a lost catalogue on a partly used GPU): L40S-48Q on the L40S (harvester/
# pcidevices' testdata), H200X-141C on the H200 SXM (NVIDIA/kubevirt-gpu-device-plugin PR 192),
# H200-141C on the H200 NVL and DC-96Q on the RTX PRO 6000 Blackwell Server Edition (NVIDIA's
# vGPU type tables; the 141 GB and 96 GB of their product specifications).
WHOLE_GPU_GB = {"0x26b9": 48, "0x2335": 141, "0x233b": 141, "0x2bb5": 96}


def key(gpu: pci.Gpu, driver_version: Optional[str]) -> str:
    """The table key of ``gpu``'s model under ``driver_version``: ``"0x26b9 570.158.02"``."""
    return f"{gpu.device_id} {driver_version or 'unknown'}"


def load() -> Table:
    """The learnt table; empty when missing, unreadable or not a table (it is relearnt).

    The file is read through :func:`files.read` (no link followed, at most
    ``LIMIT`` bytes) and anything JSON cannot parse, nested past Python's
    recursion limit included, counts as absent.
    """
    path = hostroot.path(FILE)
    try:
        raw = files.read(path, LIMIT)
        data = None if raw is None else json.loads(raw.decode("utf-8"))
    except OSError as error:
        log.warning("ignoring /%s: %s", FILE, error.strerror or error)
        return {}
    except (ValueError, RecursionError) as error:
        log.warning("ignoring /%s: not a table of vGPU types (%s)", FILE, type(error).__name__)
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: {n: v for n, v in t.items() if isinstance(v, str)} for k, t in data.items()
            if isinstance(t, dict)}


def learn(host: pci.Host, driver_version: Optional[str], table: Optional[Table] = None,
          problems: Optional[List[str]] = None, save_grown: bool = True) -> Table:
    """The table with every type the host's VFIO GPUs list now; saved when it grew.

    Why it could not be saved joins ``problems`` (once): later hooks, with the
    VFs full, would no longer know the names. ``save_grown=False`` (a preview)
    writes nothing.
    """
    table = load() if table is None else table
    grown = {k: dict(v) for k, v in table.items()}
    for gpu in host.gpus:
        if gpu.framework != pci.VFIO:
            continue
        known = grown.setdefault(key(gpu, driver_version), {})
        for vf in gpu.vfs:
            for vgpu_type in vf.types:
                known[str(vgpu_type.number)] = vgpu_type.name
        if not known:
            del grown[key(gpu, driver_version)]
        whole = listed_whole(gpu)
        if whole is not None:
            grown[whole_key(gpu)] = {FRAMEBUFFER: str(whole)}
    if grown != table and save_grown:
        problem = save(grown)
        if problem and problems is not None and problem not in problems:
            problems.append(problem)
    return grown


def whole_key(gpu: pci.Gpu) -> str:
    """The table key of ``gpu``'s model's whole framebuffer: ``"0x26b9 whole GPU"``."""
    return f"{gpu.device_id} {WHOLE}"


def listed_whole(gpu: pci.Gpu) -> Optional[int]:
    """The GPU's framebuffer in GB as its VFs list it now: only while no VF holds a type."""
    if any(vf.current_type for vf in gpu.vfs):
        return None
    # Each name parsed once: a GPU's VFs list the same few types (discovery shares them).
    names = {t.name for vf in gpu.vfs for t in vf.types}
    sizes = [p.framebuffer_gb for p in map(profiles.profile, names)
             if p is not None and not p.mig]
    return max(sizes) if sizes else None


def _number(value: str) -> bool:
    """Whether ``value`` (from the table, which a hand may have edited) is a number int() reads.

    str.isdigit alone also takes digits int() refuses (``²``): ASCII digits only.
    """
    return value.isascii() and value.isdigit()


def whole_gpus(host: pci.Host, table: Table) -> Dict[str, int]:
    """Per VFIO GPU address, its whole framebuffer in GB when known.

    What its VFs list now while none holds a type, else what was recorded
    for its model, else NVIDIA's size for the models in ``WHOLE_GPU_GB``.
    Never what a partly used GPU still lists.
    """
    out: Dict[str, int] = {}
    for gpu in host.gpus:
        if gpu.framework != pci.VFIO:
            continue
        recorded = table.get(whole_key(gpu), {}).get(FRAMEBUFFER, "")
        size = (listed_whole(gpu) or (int(recorded) if _number(recorded) else None)
                or WHOLE_GPU_GB.get(gpu.device_id))
        if size:
            out[gpu.address] = size
    return out


def save(table: Mapping[str, Mapping[str, str]]) -> Optional[str]:
    """Write the table; a host that refuses it only loses what was learnt (logged, and returned)."""
    target = hostroot.path(FILE)
    try:
        files.write_atomic(target, json.dumps(table, sort_keys=True, indent=1) + "\n")
    except OSError as error:
        why = error.strerror or str(error)
        log.warning("cannot save learnt vGPU types to %s: %s", target, why)
        return f"cannot save learnt vGPU types to /{FILE}: {why}"
    log.info("learnt vGPU types saved to %s", target)
    return None


def forget() -> None:
    """Delete the learnt table and the state directory if that leaves it empty (charm removal).

    Raises OSError when they cannot be removed (a link on the way is not followed).
    """
    files.remove(hostroot.path(FILE))
    files.remove_empty_directory(hostroot.path(STATE_DIR))


def offered(host: pci.Host, driver_version: Optional[str],
            table: Table) -> Dict[str, Tuple[pci.VgpuType, ...]]:
    """Per GPU address, every type it offers.

    mdev types as sysfs lists them; on VFIO GPUs the learnt table joined with
    what the VFs list now, by id, and any type a VF holds (named or not).
    """
    out: Dict[str, Tuple[pci.VgpuType, ...]] = {}
    for gpu in host.gpus:
        if gpu.framework != pci.VFIO:
            out[gpu.address] = gpu.offered_types()
            continue
        seen = {n: pci.VgpuType(number=int(n), name=name, framework=pci.VFIO)
                for n, name in table.get(key(gpu, driver_version), {}).items() if _number(n)}
        for vgpu_type in gpu.offered_types():
            seen[str(vgpu_type.number)] = vgpu_type
        for vf in gpu.vfs:  # a type a VF holds is one the GPU offers, named or not
            if vf.current_type and str(vf.current_type) not in seen:
                seen[str(vf.current_type)] = pci.VgpuType(
                    number=vf.current_type, name=f"nvidia-{vf.current_type}", framework=pci.VFIO)
        out[gpu.address] = tuple(sorted(seen.values()))  # by number first: ids are unique
    return out


def other_drivers(host: pci.Host, driver_version: Optional[str],
                  table: Table) -> Dict[str, Dict[str, str]]:
    """Per VFIO GPU, the profile names (upper-cased) learnt for its model under other drivers.

    ``{GPU address: {"L40S-99Q": "595.10"}}``: what a newer (or older) driver
    offers on this board that the running one may not (a driver rollout).
    """
    out: Dict[str, Dict[str, str]] = {}
    for gpu in host.gpus:
        if gpu.framework != pci.VFIO:
            continue
        mine = key(gpu, driver_version)
        names: Dict[str, str] = {}
        for entry, types in table.items():
            device, _, version = entry.partition(" ")
            if device != gpu.device_id or entry == mine or version == WHOLE:
                continue
            for name in types.values() if isinstance(types, dict) else ():
                names.setdefault(profiles.key_form(profiles.profile_name(str(name))), version)
        if names:
            out[gpu.address] = names
    return out
