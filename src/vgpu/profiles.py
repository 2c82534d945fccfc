"""vGPU profile names and the MIG geometry they land on: below vgpu.pci, vgpu.plan and vgpu.mig.

What a vGPU type's name says (:func:`profile`: model, framebuffer, series,
MIG-backed compute slices, a ``GFX`` spelling), every spelling a mapping key may
use (:func:`name_keys`), and, for MIG-backed profiles, the GPU-instance geometry
of the GPUs the charm knows (:data:`GEOMETRIES`: each GPU instance profile, the
memory slices it takes and where it may start), the GPU instance a profile sits
on (:func:`slot`), how many of it one GPU holds (:func:`fits`) and the name
nvidia-smi creates it by (:func:`instance_name`).

One room for the name and the geometry, so that a MIG-backed profile's name is
read in one place: :mod:`vgpu.pci` (the types sysfs lists), :mod:`vgpu.plan`
(which VF gets which type) and :mod:`vgpu.mig` (GPU instances, MIG mode) all
import this module, and it imports none of them. Pure: no host access.

Sources (cited where used):

* NVIDIA Multi-Instance GPU User Guide, "Supported GPUs"
  (docs.nvidia.com/datacenter/tesla/mig-user-guide/supported-gpus.html): at most
  7 instances on H200 SXM5 and H200 NVL (141 GB), 4 on RTX PRO 6000 Blackwell
  Server Edition (96 GB);
* the same guide, "Supported MIG Profiles": H100/H200 GPUs have 7 compute and 8
  memory slices; profiles 1g (7 instances), 1g with twice the memory (4),
  2g (3), 3g (2), 4g (1), 7g (1), with H200 141 GB named 1g.18gb, 1g.35gb,
  2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb; placements (``nvidia-smi mig -lgipp``
  start:size) 1g {0..6}:1, 1g.35gb {0,2,4,6}:2, 2g {0,2,4}:2, 3g {0,4}:4,
  4g {0}:4, 7g {0}:8; one ``+me`` (media extensions) 1g instance per GPU;
* RTX PRO 6000 Blackwell: 1g.24gb (4), 2g.48gb (2), 4g.96gb (1), and 2 x 1g.24gb
  beside 1 x 2g.48gb (aws/sagemaker-hyperpod-cli PR 403, its mig-configs for
  g7e). Inferred, not seen in a table: 4 memory slices with placements
  1g {0,1,2,3}:1, 2g {0,2}:2, 4g {0}:4, as on the A30, NVIDIA's other 4-slice GPU.

Inferred (not in NVIDIA's tables, marked where used): a vGPU profile sits on
the smallest GI profile with its compute slices whose memory holds its
framebuffer (``H200X-1-18C`` on 1g.18gb, ``H200X-1-35C`` on 1g.35gb), and one
GI holds ``GI memory // profile framebuffer`` vGPUs of it (bigstack-oss/cubecos
PR 1223: 48 ``DC-1-2Q`` per RTX PRO 6000, 12 per 1g.24gb instance; one vGPU
type per GI).
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, Optional, Protocol, Tuple

from .record import NamedTuple


class _Board(Protocol):
    """What the geometry reads of a GPU (a :class:`vgpu.pci.Gpu`): its PCI device id."""

    @property
    def device_id(self) -> str: ...


class Profile(NamedTuple):
    """What a vGPU type's name says: ``GRID A100-20C`` is model A100, 20 GB, series C."""

    name: str  # without the driver's GRID/NVIDIA prefix: A100-20C
    model: str  # A100, RTX6000-Ada, RTX Pro 6000 Blackwell DC
    framebuffer_gb: int
    series: str  # Q, B, A, C (and CME on MIG-backed media profiles: A100-1-5CME)
    mig: bool  # MIG-backed (A100-4-20C: 4 compute slices); see :func:`slot`
    slices: int = 0  # a MIG-backed profile's compute slices (H200X-2-35C: 2); 0 when time-sliced
    # Spelt ``...GFX`` (``DC-1-24QGFX``): NVIDIA/vgpu-device-manager's config key for the type
    # without the suffix on a GPU instance with the GFX attribute; no type name of the driver
    # carries it (see without_gfx and instance_name).
    gfx: bool = False


# The one grammar of profile names, in two spellings of the same language: NAME_KEY (what
# a mapping key may be, also the JSON schema's pattern) and _PROFILE (its parts). A model is
# words joined by spaces or hyphens (``L40S``, ``RTX6000-Ada``, ``RTX Pro 6000 Blackwell
# DC``); then ``-<slices>`` on MIG-backed profiles; then ``-<GB><series>``, and ``GFX`` as
# NVIDIA/vgpu-device-manager's configs spell a MIG-backed type on +gfx GPU instances
# (``DC-1-24QGFX``: examples/config-example.yaml; pkg/vgpu/config.go strips the suffix).
_WORDS = r"[A-Za-z0-9]+(?:[ -][A-Za-z0-9]+)*"
_GFX = "[Gg][Ff][Xx]"
NAME_KEY = rf"(?:(?:GRID|NVIDIA|grid|nvidia) )?{_WORDS}-[0-9]+[A-Za-z]{{1,3}}(?:{_GFX})?"
_PREFIX = re.compile(r"(?:GRID|NVIDIA) ", re.IGNORECASE)
_PROFILE = re.compile(rf"(?P<model>{_WORDS}?)(?:-(?P<slices>[0-9]+))?"
                      rf"-(?P<fb>[0-9]+)(?P<series>[A-Za-z]{{1,3}})(?P<gfx>{_GFX})?")


def profile_name(name: str) -> str:
    """``GRID A100-20C`` / ``NVIDIA L40S-12Q`` -> ``A100-20C`` / ``L40S-12Q``."""
    name = " ".join(name.split())
    match = _PREFIX.match(name)
    return name[match.end():] if match else name


def short_name(name: str) -> str:
    """NVIDIA's tables' name for a type: its last word (``DC-8Q`` for ``... Blackwell DC-8Q``).

    The same as :func:`profile_name` for one-word models (``L40S-12Q``, ``RTX6000-Ada-12Q``).
    """
    words = name.split()
    return words[-1] if words else ""


def name_keys(name: str) -> Tuple[str, ...]:
    """Every spelling of a type name a mapping key may use, upper-cased, distinct.

    The driver's full name, the name without its GRID/NVIDIA prefix and the
    short form of NVIDIA's tables (:func:`short_name`). Keys are compared
    upper-cased with single spaces (see :func:`key_form`).
    """
    full = key_form(name)
    return tuple(dict.fromkeys((full, profile_name(full), short_name(full))))


def key_form(key: str) -> str:
    """A key or name as :func:`name_keys` compares it: single spaces, upper case."""
    return " ".join(key.split()).upper()


def profile(name: str) -> Optional[Profile]:
    """The profile a type name describes, or None if it does not read like one."""
    short = profile_name(name)
    match = _PROFILE.fullmatch(short)
    if not match:
        return None
    series = match.group("series").upper()
    return Profile(name=short, model=match.group("model"), framebuffer_gb=int(match.group("fb")),
                   series=series, mig=match.group("slices") is not None,
                   slices=int(match.group("slices") or 0), gfx=match.group("gfx") is not None)


def without_gfx(name: str) -> Optional[str]:
    """A MIG-backed ``...GFX`` spelling without its suffix (``DC-1-24QGFX`` -> ``DC-1-24Q``); else None.

    NVIDIA/vgpu-device-manager ``pkg/vgpu/config.go`` (main): "for RTX Pro 6000
    Blackwell, all the MIG-backed vGPU types are only supported on MIG instances
    created with the GFX attribute, but none of the vGPU type names contain the
    GFX suffix"; its ``DC-1-24QGFX`` key is looked up as given, then, not being a
    type, with the suffix stripped (``stripVGPUConfigSuffix``). The charm takes
    both spellings as the same type, in that order.
    """
    found = profile(name)
    if found is None or not found.mig or not found.gfx:
        return None
    return name.rstrip()[:-3]


def canonical(name: str) -> str:
    """The type a key names: without a MIG-backed ``GFX`` suffix (:func:`without_gfx`)."""
    return without_gfx(name) or name


def mig_profile(name: str) -> Optional[Profile]:
    """The MIG-backed profile a type name spells, or None for a time-sliced (or no) profile.

    Here, below :mod:`vgpu.mig` and :mod:`vgpu.plan`, so that telling whether anything
    is MIG-backed imports neither.
    """
    found = profile(name)
    return found if found is not None and found.mig else None


def mig_backed(names: Iterable[str]) -> bool:
    """Whether any of the type names (mapping keys, planned types) is a MIG-backed profile.

    Each distinct name is parsed once (a plan names one type for each of its many VFs).
    """
    return any(mig_profile(name) is not None for name in set(names))


# -- the GPU-instance geometry -------------------------------------------------------------

class GiProfile(NamedTuple):
    """One GPU instance profile of a GPU model."""

    name: str  # 1g.18gb
    slices: int  # compute slices
    memory_gb: int  # the GB in its name
    size: int  # memory slices it takes
    starts: Tuple[int, ...]  # the memory slices it may start at (its placements)
    limit: int = 0  # at most this many per GPU (+me profiles: 1); 0: one per placement
    media: bool = False  # +me: with media extensions (the CME/ME vGPU series)

    @property
    def most(self) -> int:
        """How many instances of this profile one GPU holds at most."""
        return self.limit or len(self.starts)


class Geometry(NamedTuple):
    """How MIG divides one GPU model."""

    model: str
    compute_slices: int
    memory_slices: int
    profiles: Tuple[GiProfile, ...]
    # It offers GPU instance profiles with the GFX attribute (``+gfx``): the RTX PRO 6000
    # Blackwell (NVIDIA/mig-parted).
    gfx: bool = False
    # The vGPU model names its MIG-backed types use, upper-cased (H200X-1-18C: H200X).
    names: Tuple[str, ...] = ()
    # Every MIG-backed vGPU type sits on a ``+gfx`` GPU instance, though no type name says
    # GFX. NVIDIA/vgpu-device-manager pkg/vgpu/config.go (main, SetVGPUConfig): "for RTX Pro
    # 6000 Blackwell, all the MIG-backed vGPU types are only supported on MIG instances
    # created with the GFX attribute, but none of the vGPU type names contain the GFX
    # suffix"; its ``DC-1-24QGFX`` key is ``DC-1-24Q`` on ``1g.24gb+gfx`` (documentation
    # only: no transcript of such a host). Where the driver answers, NVML says it per type
    # (:func:`driver_profiles`), and its answer is taken over this.
    gfx_only: bool = False


def _hopper(gb: Tuple[int, int, int, int], model: str, names: Tuple[str, ...]) -> Geometry:
    """An H100/H200-shaped GPU: 7 compute, 8 memory slices; ``gb`` of 1g, 1g x2, 3g, 7g."""
    one, two, three, seven = gb
    return Geometry(model, 7, 8, (
        GiProfile(f"1g.{one}gb", 1, one, 1, (0, 1, 2, 3, 4, 5, 6)),
        GiProfile(f"1g.{one}gb+me", 1, one, 1, (0, 1, 2, 3, 4, 5, 6), limit=1, media=True),
        GiProfile(f"1g.{two}gb", 1, two, 2, (0, 2, 4, 6)),
        GiProfile(f"2g.{two}gb", 2, two, 2, (0, 2, 4)),
        GiProfile(f"3g.{three}gb", 3, three, 4, (0, 4)),
        GiProfile(f"4g.{three}gb", 4, three, 4, (0,)),
        GiProfile(f"7g.{seven}gb", 7, seven, 8, (0,)),
    ), names=names)


H200 = _hopper((18, 35, 71, 141), "H200 141GB", ("H200X", "H200"))
# H100 80GB (MIG user guide, "H100 MIG Profiles": 1g.10gb ... 7g.80gb); its vGPU names (H100XM on
# SXM5, H100 on PCIe) from NVIDIA's Hopper vGPU tables; documentation only.
H100 = _hopper((10, 20, 40, 80), "H100 80GB", ("H100XM", "H100"))
RTX_PRO_6000 = Geometry("RTX PRO 6000 Blackwell Server Edition", 4, 4, (
    GiProfile("1g.24gb", 1, 24, 1, (0, 1, 2, 3)),
    GiProfile("2g.48gb", 2, 48, 2, (0, 2)),
    GiProfile("4g.96gb", 4, 96, 4, (0,)),
), gfx=True, names=("DC", "RTX PRO 6000 BLACKWELL DC"), gfx_only=True)
# By the GPU's PCI device id (pci.ids: 2335 GH100 [H200 SXM 141GB], 233b GH100 [H200 NVL],
# 2bb5 GB202GL [RTX PRO 6000 Blackwell Server Edition], 2330 GH100 [H100 SXM5 80GB],
# 2331 GH100 [H100 PCIe]).
GEOMETRIES: Dict[str, Geometry] = {"0x2335": H200, "0x233b": H200, "0x2bb5": RTX_PRO_6000,
                                   "0x2330": H100, "0x2331": H100}


class Slot(NamedTuple):
    """Where a MIG-backed vGPU profile lives on a GPU model."""

    instance: GiProfile  # its GPU instance profile
    per_instance: int  # vGPUs of the profile one GI holds

    @property
    def fits(self) -> int:
        """vGPUs of the profile one GPU holds: instances times vGPUs per instance."""
        return self.instance.most * self.per_instance


def geometry(gpu: _Board) -> Optional[Geometry]:
    """The MIG geometry of ``gpu``'s model, or None when the charm has no table for it."""
    return GEOMETRIES.get(gpu.device_id.lower())


def slot(shape: Geometry, profile: Profile) -> Optional[Slot]:
    """The GI profile a MIG-backed profile sits on and how many one GI holds (None: none fits).

    Inferred (see the module): the smallest GI profile with the profile's compute
    slices whose memory holds its framebuffer; media profiles (CME) on the +me one.
    """
    if not profile.mig or profile.framebuffer_gb <= 0 or (profile.gfx and not shape.gfx):
        return None
    media = profile.series.endswith("ME")
    candidates = sorted((gi for gi in shape.profiles if gi.slices == profile.slices
                         and gi.media == media and gi.memory_gb >= profile.framebuffer_gb),
                        key=lambda gi: gi.memory_gb)
    if not candidates:
        return None
    gi = candidates[0]
    return Slot(gi, max(1, gi.memory_gb // profile.framebuffer_gb))


def fits(gpu: _Board, profile: Profile) -> Optional[int]:
    """How many vGPUs of a MIG-backed ``profile`` one GPU of ``gpu``'s model holds; None: unknown."""
    shape = geometry(gpu)
    found = slot(shape, profile) if shape is not None else None
    return found.fits if found is not None else None


def instance_name(gi: GiProfile, profile: Profile, shape: Optional[Geometry] = None) -> str:
    """The GPU instance profile nvidia-smi creates for ``profile`` on ``gi``: ``1g.24gb+gfx``.

    ``+gfx`` for every MIG-backed type of a GPU whose types all need it
    (:attr:`Geometry.gfx_only`: the RTX PRO 6000, NVIDIA/vgpu-device-manager's
    config.go), and for a type spelt ``...GFX`` as that project's
    ``ToMigConfigSpecSlice`` (api/spec/v1/spec.go) does; :func:`slot` refuses a GFX
    spelling on a GPU without ``+gfx`` profiles.
    """
    gfx = profile.gfx or (shape is not None and shape.gfx_only)
    return gi.name + ("+gfx" if gfx and not gi.media else "")
