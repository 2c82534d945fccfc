"""NVIDIA GPUs on this host, their SR-IOV virtual functions and vGPU types.

sysfs is read once per call, through ``sys/bus/pci/devices`` only (never by
walking ``sys/devices``). Both of NVIDIA's host frameworks are understood:

* mediated devices (Maxwell to Ampere, older drivers): types are directories
  under ``mdev_supported_types/`` of the GPU, or of each VF on SR-IOV GPUs;
* vendor-specific VFIO (vGPU 17+ on kernel 6.8+; Ada, Hopper, Blackwell):
  each VF lists its types in ``nvidia/creatable_vgpu_types`` and holds the
  one assigned in ``nvidia/current_vgpu_type``.

A type is named ``nvidia-<id>`` on both, since the mdev directory names and
the VFIO table use the same vGPU type ids.
"""

import os
import re
from dataclasses import dataclass, field, replace
from typing import Dict, Iterable, List, Optional, Tuple

from . import hostroot, text

NVIDIA_VENDOR = "0x10de"
# PCI class: 0x0300xx VGA compatible controller, 0x0302xx 3D controller.
GPU_CLASSES = ("0x0300", "0x0302")
PCI_DEVICES = "sys/bus/pci/devices"
PCI_IDS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids")

MDEV = "mdev"
VFIO = "vfio"

_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_TYPE_DIR = re.compile(r"nvidia-([0-9]+)\Z")
_TYPE_ROW = re.compile(r"\s*([0-9]+)\s*:\s*(\S.*?)\s*\Z")


@dataclass(frozen=True)
class VgpuType:
    """One vGPU type a PCI function offers."""

    number: int
    name: str
    framework: str
    available_instances: Optional[int] = None
    properties: Tuple[Tuple[str, str], ...] = ()

    @property
    def id(self) -> str:
        """The type as Nova names it: ``nvidia-<number>``."""
        return f"nvidia-{self.number}"

    @property
    def framebuffer_mb(self) -> Optional[int]:
        """From the mdev description; on VFIO from the profile name (``L40S-12Q``: 12 GB)."""
        described = _megabytes(dict(self.properties).get("framebuffer"))
        if described is not None:
            return described
        named = self.profile
        return named.framebuffer_gb * 1024 if named is not None else None

    @property
    def profile(self) -> Optional["Profile"]:
        """The NVIDIA profile its name spells (``L40S-12Q``), or None for a name that is not one."""
        return profile(self.name)

    @property
    def max_instances(self) -> Optional[int]:
        """How many of this type one GPU holds, from the description's ``max_instance``."""
        return _int(dict(self.properties).get("max_instance"))


@dataclass(frozen=True)
class VirtualFunction:
    """An SR-IOV virtual function of a GPU."""

    address: str
    index: int
    driver: Optional[str]
    types: Tuple[VgpuType, ...] = ()
    current_type: Optional[int] = None  # VFIO framework: 0 or None = none
    device_id: str = ""  # VFIO VFs: the VF's own PCI device id (differs from its GPU's)
    framework: Optional[str] = None  # mdev, vfio, or None (neither is exposed yet)


@dataclass(frozen=True)
class Gpu:
    """An NVIDIA GPU (physical function) and what it offers."""

    address: str
    device_id: str
    model: str
    driver: Optional[str]
    class_code: str
    sriov_totalvfs: int = 0
    sriov_numvfs: int = 0
    types: Tuple[VgpuType, ...] = ()
    vfs: Tuple[VirtualFunction, ...] = ()

    @property
    def sriov(self) -> bool:
        """Whether the GPU offers SR-IOV virtual functions (its vGPUs then live on VFs)."""
        return self.sriov_totalvfs > 0

    @property
    def framework(self) -> Optional[str]:
        """mdev, vfio, or None while the driver exposes neither.

        SR-IOV GPUs are judged by their VFs' sysfs (``mdev_supported_types/``
        or ``nvidia/current_vgpu_type``), never by model: a full VFIO GPU lists
        no creatable type but is still VFIO. Before its VFs exist, None.
        """
        if self.types:
            return self.types[0].framework
        for vf in self.vfs:
            if vf.framework:
                return vf.framework
        return None

    @property
    def vfs_missing(self) -> bool:
        """An SR-IOV GPU whose virtual functions are not enabled (after a reboot)."""
        return self.sriov and not self.vfs

    def offered_types(self) -> Tuple[VgpuType, ...]:
        """Types of the GPU itself, else the union over its VFs, by id."""
        if self.types:
            return self.types
        seen: Dict[int, VgpuType] = {}
        for vf in self.vfs:
            for vgpu_type in vf.types:
                seen.setdefault(vgpu_type.number, vgpu_type)
        return tuple(seen[n] for n in sorted(seen))

    def function(self, address: str):
        """The GPU or one of its VFs at ``address``, else None."""
        if address == self.address:
            return self
        for vf in self.vfs:
            if vf.address == address:
                return vf
        return None


@dataclass(frozen=True)
class Host:
    """Everything discovery found, in address order."""

    gpus: Tuple[Gpu, ...] = ()
    # Non-NVIDIA functions that are mdev parents (Intel GVT-g, NICs): seen, ignored.
    ignored_mdev_parents: Tuple[str, ...] = field(default=())

    def gpu(self, address: str) -> Optional[Gpu]:
        """The GPU at ``address``, or whose VF is at ``address``; None when neither is here."""
        for gpu in self.gpus:
            if gpu.function(address) is not None:
                return gpu
        return None

    def addresses(self) -> List[str]:
        """Every GPU and VF address, sorted."""
        out = []
        for gpu in self.gpus:
            out.append(gpu.address)
            out.extend(vf.address for vf in gpu.vfs)
        return sorted(out)

    def models(self) -> List[Tuple[str, int]]:
        """(model, count) pairs, most common first."""
        counts: Dict[str, int] = {}
        for gpu in self.gpus:
            counts[gpu.model] = counts.get(gpu.model, 0) + 1
        return sorted(counts.items(), key=lambda item: (-item[1], item[0]))


def discover() -> Host:
    """Read the host's PCI devices once and return its NVIDIA GPUs."""
    devices = hostroot.path(PCI_DEVICES)
    listed = hostroot.listdir(devices)  # HostReadError when it cannot be read
    if listed is None:
        return Host()
    names = sorted(listed)
    nvidia: Dict[str, str] = {}
    ignored = []
    for name in names:
        if not _ADDRESS.match(name):
            continue
        entry = devices / name
        vendor = _read(entry / "vendor")
        if vendor != NVIDIA_VENDOR:
            if os.path.isdir(entry / "mdev_supported_types"):
                ignored.append(name)
            continue
        class_code = _read(entry / "class") or ""
        if class_code[:6] in GPU_CLASSES:
            nvidia[name] = class_code

    physical = [a for a in nvidia if not os.path.lexists(devices / a / "physfn")]
    ids = {_read(devices / a / "device") or "" for a in physical}
    names_by_id = model_names(ids)
    gpus = []
    for address in physical:
        entry = devices / address
        device_id = _read(entry / "device") or ""
        gpus.append(Gpu(
            address=address,
            device_id=device_id,
            model=names_by_id.get(device_id) or f"NVIDIA {device_id}",
            driver=_link_name(entry / "driver"),
            class_code=nvidia[address],
            sriov_totalvfs=_int(_read(entry / "sriov_totalvfs")) or 0,
            sriov_numvfs=_int(_read(entry / "sriov_numvfs")) or 0,
            types=_mdev_types(entry),
            vfs=_virtual_functions(entry),
        ))
    return Host(gpus=tuple(gpus), ignored_mdev_parents=tuple(ignored))


def _virtual_functions(entry) -> Tuple[VirtualFunction, ...]:
    vfs = []
    # The VFs of one GPU define their types identically: read each definition
    # once, and only each VF's available_instances (HGX hosts have 100+ VFs).
    known: Dict[int, VgpuType] = {}
    try:
        links = [n for n in os.listdir(entry) if n.startswith("virtfn")]
    except OSError:
        return ()
    for link in links:
        index = _int(link[len("virtfn"):])
        address = _link_name(entry / link)
        if index is None or not address:
            continue
        vf_entry = entry / link
        current = _int(_read(vf_entry / "nvidia" / "current_vgpu_type"))
        types = _mdev_types(vf_entry, known)
        if types or os.path.isdir(vf_entry / "mdev_supported_types"):
            framework: Optional[str] = MDEV
        else:
            framework = VFIO if current is not None else None
            types = _vfio_types(vf_entry) if current is not None else ()
        vfs.append(VirtualFunction(
            address=address,
            index=index,
            driver=_link_name(vf_entry / "driver"),
            types=types,
            current_type=current,
            # Nova's device_spec needs it on VFIO only: mdev hosts skip the read.
            device_id=(_read(vf_entry / "device") or "") if framework == VFIO else "",
            framework=framework,
        ))
    return tuple(sorted(vfs, key=lambda vf: vf.index))


def _mdev_types(entry, known: Optional[Dict[int, VgpuType]] = None) -> Tuple[VgpuType, ...]:
    """Types under ``mdev_supported_types``; ``known`` shares definitions between VFs."""
    base = entry / "mdev_supported_types"
    # Unreadable is not "no types": HostReadError, so no type passes unverified.
    names = hostroot.listdir(base) or ()
    known = {} if known is None else known
    types = []
    for name in names:
        match = _TYPE_DIR.match(name)
        if not match:
            continue
        number = int(match.group(1))
        available = _int(_read(base / name / "available_instances"))
        if number not in known:
            known[number] = VgpuType(
                number=number,
                name=_read(base / name / "name") or name,
                framework=MDEV,
                properties=parse_description(_read(base / name / "description") or ""),
            )
        types.append(replace(known[number], available_instances=available))
    return tuple(sorted(types, key=lambda t: t.number))


def _vfio_types(entry) -> Tuple[VgpuType, ...]:
    return parse_creatable(_read(entry / "nvidia" / "creatable_vgpu_types") or "")


def parse_creatable(text: str) -> Tuple[VgpuType, ...]:
    """``nvidia/creatable_vgpu_types`` (``ID    : vGPU Name`` rows) as types, by id."""
    types = []
    for line in text.splitlines():
        match = _TYPE_ROW.match(line)
        if match:
            types.append(VgpuType(number=int(match.group(1)), name=match.group(2), framework=VFIO))
    return tuple(sorted(types, key=lambda t: t.number))


@dataclass(frozen=True)
class Profile:
    """What a vGPU type's name says: ``GRID A100-20C`` is model A100, 20 GB, series C."""

    name: str  # without the driver's GRID/NVIDIA prefix: A100-20C
    model: str
    framebuffer_gb: int
    series: str  # Q, B, A, C (and e.g. CME on MIG-backed media profiles)
    mig: bool  # MIG-backed (A100-4-20C: 4 compute slices); not configured by this charm


_PREFIX = re.compile(r"(?:GRID|NVIDIA) ", re.IGNORECASE)
_PROFILE = re.compile(r"(?P<model>[A-Za-z0-9]+(?: [A-Za-z0-9]+)*?)(?:-(?P<slices>[0-9]+))?"
                      r"-(?P<fb>[0-9]+)(?P<series>[A-Za-z]{1,3})")


def profile_name(name: str) -> str:
    """``GRID A100-20C`` / ``NVIDIA L40S-12Q`` -> ``A100-20C`` / ``L40S-12Q``."""
    name = " ".join(name.split())
    match = _PREFIX.match(name)
    return name[match.end():] if match else name


def profile(name: str) -> Optional[Profile]:
    """The profile a type name describes, or None if it does not read like one."""
    short = profile_name(name)
    match = _PROFILE.fullmatch(short)
    if not match:
        return None
    series = match.group("series").upper()
    return Profile(name=short, model=match.group("model"), framebuffer_gb=int(match.group("fb")),
                   series=series, mig=match.group("slices") is not None or series.endswith("ME"))


def parse_description(text: str) -> Tuple[Tuple[str, str], ...]:
    """``num_heads=4, framebuffer=8192M, max_instance=2`` as sorted pairs."""
    pairs = {}
    for item in text.replace("\n", ",").split(","):
        key, sep, value = item.partition("=")
        if sep and key.strip():
            pairs[key.strip()] = value.strip()
    return tuple(sorted(pairs.items()))


def model_names(device_ids: Iterable[str]) -> Dict[str, str]:
    """Marketing names for NVIDIA device ids from the PCI ID database.

    Only the NVIDIA block of ``pci.ids`` is scanned; ``GV100GL [Tesla V100
    PCIe 16GB]`` gives the bracketed name. Unknown ids are left out.
    """
    wanted = {i.lower().removeprefix("0x") for i in device_ids if i}
    found: Dict[str, str] = {}
    if not wanted:
        return found
    for candidate in PCI_IDS:
        try:
            handle = open(hostroot.path(candidate), encoding="utf-8", errors="replace")
        except OSError:
            continue
        with handle:
            inside = False
            for line in handle:
                if line.startswith("10de "):
                    inside = True
                    continue
                if not inside:
                    continue
                if line[:1] not in ("\t", "#", "\n"):
                    break  # the next vendor
                if line.startswith("\t") and not line.startswith("\t\t"):
                    ident, _, name = line.strip().partition(" ")
                    if ident in wanted:
                        name = name.strip()
                        bracket = re.search(r"\[(.+)\]", name)
                        found[f"0x{ident}"] = text.one_line(bracket.group(1) if bracket else name)
        return found
    return found


def _read(path) -> Optional[str]:
    """A sysfs attribute, cleaned and stripped; None if absent; HostReadError if unreadable."""
    content = hostroot.read_text(path)
    return None if content is None else content.strip()


def _link_name(path) -> Optional[str]:
    try:
        return os.path.basename(os.readlink(path))
    except OSError:
        return None


def _int(text) -> Optional[int]:
    if text is None:
        return None
    text = str(text).strip()
    try:
        return int(text, 16) if text[:2].lower() == "0x" else int(text, 10)
    except ValueError:
        return None


def _megabytes(text) -> Optional[int]:
    if not text:
        return None
    match = re.fullmatch(r"\s*([0-9]+)\s*([KMGT]?)B?\s*", text, re.IGNORECASE)
    if not match:
        return None
    scale = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}
    return int(int(match.group(1)) * scale[match.group(2).upper()])
