"""MIG-backed profiles in a plan: which VFs of a GPU each takes, and what refuses them.

:mod:`vgpu.plan` hands this module each MIG-backed profile a mapping key
resolves to (:class:`Claims`) and gets back the VFs each takes, counted from
the GPU model's geometry (:mod:`vgpu.profiles`), never from what the VFs list
as creatable now, or the reasons none can be planned: Nova before 31, a model
without a MIG table, two MIG-backed profiles on one GPU (:func:`one_per_gpu`,
:func:`mixed`), time-sliced and MIG-backed on one GPU, a MIG-backed profile on
mediated devices (:func:`refused`). Pure; imports neither vgpu.plan nor vgpu.mig.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import pci, profiles
from .record import NamedTuple

ALL = "all"  # a mapping's "every GPU" (vgpu.mappings.ALL; mappings sits above plan)


def refused(gpu: pci.Gpu, vgpu_type: pci.VgpuType) -> Optional[str]:
    """Why no mapping of ``vgpu_type`` on ``gpu`` is ever planned, whatever else is mapped; else None.

    A MIG-backed profile on mediated devices (an A100's ``A100-4-20C``): the
    charm configures MIG-backed profiles on the vendor-specific VFIO framework only.
    """
    if profiles.mig_profile(vgpu_type.name) is not None and gpu.framework != pci.VFIO:
        return ("MIG-backed; this charm configures MIG-backed profiles on NVIDIA's "
                "vendor-specific VFIO framework only (Hopper, Blackwell)")
    return None


class Claim(NamedTuple):
    """One MIG-backed profile claimed on one GPU: whole (by the GPU's address) or VF by VF."""

    vgpu_type: pci.VgpuType
    key: str
    whole: bool = False
    vfs: Tuple[str, ...] = ()


class Claims:
    """The MIG-backed profiles each GPU is mapped to; counted from :mod:`vgpu.profiles`' tables.

    A GPU serves time-sliced or MIG-backed profiles, never both, and one
    MIG-backed profile at most: Nova puts all VFs of one PF in one resource
    class (``PlacementPciMixedResourceClassException`` in
    nova/compute/pci_placement_translator.py stops nova-compute otherwise), and
    without Placement it tells VFs apart only by vendor and product id, which
    every VF of a GPU shares. How many VFs a profile takes comes from the
    profile and the GPU's geometry (``H200X-1-18C``: 7), never from what the
    VFs list as creatable now.
    """

    def __init__(self):
        """No claims yet: :meth:`claim` adds them key by key."""
        self.claims: Dict[str, Dict[int, Claim]] = {}

    def claim(self, key: str, gpu: pci.Gpu, address: str, vgpu_type: pci.VgpuType,
              time_sliced: Optional[Tuple[pci.VgpuType, str, str]]) -> Optional[str]:
        """None: not MIG-backed on a GPU without MIG claims; '' claimed; else why refused."""
        mine = self.claims.get(gpu.address, {})
        profile = profiles.mig_profile(vgpu_type.name)
        other = time_sliced[0] if time_sliced is not None else None
        if profile is None and mine:
            other = next(iter(mine.values())).vgpu_type
        if other is not None and (profile is not None or mine):
            timed, backed = (vgpu_type, other) if profile is None else (other, vgpu_type)
            return (f"GPU {gpu.address} is mapped to both time-sliced "
                    f"{profiles.profile_name(timed.name)} and MIG-backed "
                    f"{profiles.profile_name(backed.name)}: one GPU serves either time-sliced or "
                    "MIG-backed profiles, never both")
        if profile is None:
            return None
        why = refused(gpu, vgpu_type)
        if why:
            return f"{key}: {vgpu_type.name} ({vgpu_type.id}) on {gpu.address} ({gpu.model}) is {why}"
        held = mine.get(vgpu_type.number, Claim(vgpu_type, key))
        held = (held._replace(whole=True) if address == gpu.address
                else held._replace(vfs=held.vfs + (address,)))
        self.claims.setdefault(gpu.address, {})[vgpu_type.number] = held
        return ""

    def functions(self, gpu: pci.Gpu, release
                  ) -> Tuple[List[Tuple[pci.VirtualFunction, pci.VgpuType]], List[str]]:
        """The VFs each MIG-backed profile of ``gpu`` takes, with its type, or why they cannot."""
        mine = self.claims.get(gpu.address)
        if not mine:
            return [], []

        claims = [mine[n] for n in sorted(mine)]
        problem = _gpu_problem(gpu, claims, release)
        if problem:
            return [], [problem]
        shape = profiles.geometry(gpu)
        made: List[Tuple[pci.VirtualFunction, pci.VgpuType]] = []
        problems: List[str] = []
        taken: Dict[str, str] = {}
        for held in claims:
            vfs, why = _vfs(gpu, held, shape, taken)
            problems.extend(why)
            made.extend((vf, held.vgpu_type) for vf in vfs)
        return ([] if problems else made), problems


def mixed(mapping: Mapping[str, Sequence[str]], host: pci.Host) -> Dict[str, List[str]]:
    """GPUs whose addresses the mapping gives two MIG-backed profiles or more, with their names."""
    named: Dict[str, Dict[str, None]] = {}
    for key, addresses in mapping.items():
        mine = profiles.mig_profile(key)
        if mine is None or tuple(addresses) == (ALL,):
            continue
        for address in addresses:
            gpu = host.gpu(address)
            if gpu is not None:
                named.setdefault(gpu.address, {})[profiles.short_name(profiles.canonical(mine.name))] = None
    return {gpu: sorted(names) for gpu, names in named.items() if len(names) > 1}


def one_per_gpu(gpu: Optional[pci.Gpu], names: Sequence[str]) -> str:
    """Why one GPU takes one MIG-backed profile at most (Nova's rule, with or without Placement)."""
    where = f"{gpu.address} ({gpu.model})" if gpu is not None else "?"
    return (f"GPU {where} is mapped to MIG-backed {', '.join(names)}: one MIG-backed "
            "profile per GPU. Nova gives all VFs of one GPU one resource class in Placement "
            "(two stop nova-compute: PlacementPciMixedResourceClassException) and, without "
            "pci-in-placement, cannot tell VFs of one product id apart; map one of them")


def _gpu_problem(gpu: pci.Gpu, claims: Sequence[Claim], release) -> str:
    """Why none of ``gpu``'s MIG-backed profiles can be planned: Nova, geometry, sharing."""
    names = ", ".join(profiles.profile_name(c.vgpu_type.name) for c in claims)
    if release is not None and not release.managed_no:
        return (f"GPU {gpu.address} ({gpu.model}) uses NVIDIA's vendor-specific VFIO framework, "
                f"which needs Nova 31 (2025.1 epoxy) or later; this host runs {release}")
    if profiles.geometry(gpu) is None:
        return (f"GPU {gpu.address} ({gpu.model}, device {gpu.device_id}): the charm has no MIG "
                f"table for this model, so MIG-backed {names} cannot be counted")
    if len(claims) > 1:
        return one_per_gpu(gpu, [profiles.profile_name(c.vgpu_type.name) for c in claims])
    return ""


def _vfs(gpu: pci.Gpu, held: Claim, shape, taken: Dict[str, str]):
    """(VFs, problems): the VFs one MIG-backed profile takes; ``taken`` records VF -> profile."""
    name = profiles.profile_name(held.vgpu_type.name)
    named = held.vgpu_type.profile
    found = profiles.slot(shape, named) if named is not None else None
    if found is None:
        return [], [f"{held.key}: {name} fits no GPU instance profile of {shape.model} "
                    f"(GPU {gpu.address})"]
    chosen = [vf for vf in gpu.vfs if vf.address not in taken][:found.fits] if held.whole else []
    chosen += [vf for vf in (gpu.function(a) for a in held.vfs) if vf not in chosen]
    problems = [f"{held.key}: VF {vf.address} is mapped to both {taken[vf.address]} and {name}"
                for vf in chosen if taken.get(vf.address, name) != name]
    taken.update((vf.address, name) for vf in chosen)
    if len(chosen) > found.fits:
        problems.append(
            f"{held.key}: {len(chosen)} virtual functions of GPU {gpu.address} are mapped but "
            f"{name} fits {found.fits} per GPU ({found.instance.most} x {found.instance.name} "
            f"GPU instances, {found.per_instance} each)")
    return sorted(chosen, key=lambda vf: vf.index), problems
