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

from __future__ import annotations

import errno
import os
import re
from typing import Any, Dict, Iterable, List, Optional, Tuple

from . import PCI_ADDRESS, hostroot, profiles, text
from .errors import HostReadError
from .record import NamedTuple

NVIDIA_VENDOR = "0x10de"
# PCI class: 0x0300xx VGA compatible controller, 0x0302xx 3D controller.
GPU_CLASSES = ("0x0300", "0x0302")
PCI_DEVICES = "sys/bus/pci/devices"
PROC_DEVICES = "proc/bus/pci/devices"  # one line per function: see not_nvidia
PROC_DEVICES_LIMIT = 1 << 22  # bytes; about 150 a function, and a PCI domain has at most 65,536
_HEX_DIGITS = "0123456789abcdef"  # as the kernel's %x writes them
_HEX_DIGITS_SET = frozenset(_HEX_DIGITS)
_SLOT_FUNCTION = tuple(f"{n >> 3:02x}.{n & 7}" for n in range(256))  # devfn -> slot.function
_DEVFN = {f"{n:02x}": _SLOT_FUNCTION[n] for n in range(256)}  # the same, keyed by hex devfn
PCI_IDS = ("usr/share/misc/pci.ids", "usr/share/hwdata/pci.ids")
PCI_IDS_LIMIT = 1 << 24  # bytes of pci.ids read at most (the real one has about 1.7 million)
# What else names a GPU pci.ids does not know (newer than the host's copy): udev's database
# entry (``E:ID_MODEL_FROM_DATABASE=``, from systemd's hwdb, which lspci shows too), then the
# driver's own (``Model:`` in its information file). Read only for such a GPU.
UDEV_DATA = "run/udev/data"  # +pci:<address>: systemd's device_get_device_id
NVIDIA_GPUS = "proc/driver/nvidia/gpus"  # <address>/information: nv-procfs.c

MDEV = "mdev"
VFIO = "vfio"

_ADDRESS = re.compile(PCI_ADDRESS + r"\Z")
_TYPE_DIR = re.compile(r"nvidia-([0-9]+)\Z")
_NEXT_ENTRY = re.compile(rb"\n[^\t#\n]")  # pci.ids: a line that is no device, subsystem or comment
_TYPE_ROW = r"\s*([0-9]+)\s*:\s*(\S.*?)\s*\Z"  # VFIO only: compiled by re when used
_VIRTFN = r"virtfn[0-9]+\Z"  # a VF's link in its GPU's directory: only where its numbers fail


class VgpuType(NamedTuple):
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
    def profile(self) -> Optional[profiles.Profile]:
        """The NVIDIA profile its name spells (``L40S-12Q``), or None for a name that is not one."""
        return profiles.profile(self.name)

    @property
    def max_instances(self) -> Optional[int]:
        """How many of this type one GPU holds, from the description's ``max_instance``."""
        return _int(dict(self.properties).get("max_instance"))


class VirtualFunction:
    """An SR-IOV virtual function of a GPU; immutable, compared by value.

    A plain class: as a NamedTuple its field ``index`` would shadow
    tuple.index, and defining a frozen dataclass costs every hook about 0.35 ms.
    """

    __slots__ = ("address", "index", "types", "current_type", "device_id", "framework")
    address: str
    index: int
    types: Tuple[VgpuType, ...]
    current_type: Optional[int]  # VFIO framework: 0 or None = none
    # VFIO VFs: the device id the VF's own ``device`` file reads, as Nova matches it. On L40S,
    # H200 and RTX PRO 6000 hosts it is the GPU's own id: VFs are known by their physfn link.
    device_id: str
    framework: Optional[str]  # mdev, vfio, or None (neither is exposed yet)

    def __init__(self, address: str, index: int, types: Tuple[VgpuType, ...] = (),
                 current_type: Optional[int] = None, device_id: str = "",
                 framework: Optional[str] = None) -> None:
        """The fields, by name or in this order."""
        init = object.__setattr__
        init(self, "address", address)
        init(self, "index", index)
        init(self, "types", types)
        init(self, "current_type", current_type)
        init(self, "device_id", device_id)
        init(self, "framework", framework)

    def _fields_(self) -> tuple:
        return (self.address, self.index, self.types, self.current_type, self.device_id,
                self.framework)

    def _replace(self, **changes: Any) -> "VirtualFunction":
        """A copy with ``changes`` (field=value), as NamedTuple's ``_replace``."""
        return VirtualFunction(**{**dict(zip(self.__slots__, self._fields_())), **changes})

    def __setattr__(self, name: str, value: Any) -> None:
        """Refused: a VF's reading does not change."""
        raise AttributeError(f"VirtualFunction is immutable: cannot set {name}")

    def __delattr__(self, name: str) -> None:
        """Refused: a VF's reading does not change."""
        raise AttributeError(f"VirtualFunction is immutable: cannot delete {name}")

    def __eq__(self, other: object) -> bool:
        """Equal when every field is."""
        if other.__class__ is not VirtualFunction:
            return NotImplemented
        return self._fields_() == other._fields_()

    def __hash__(self) -> int:
        """From every field, as a tuple's."""
        return hash(self._fields_())

    def __repr__(self) -> str:
        """As a dataclass's: every field by name."""
        return "VirtualFunction(" + ", ".join(
            f"{name}={value!r}" for name, value in zip(self.__slots__, self._fields_())) + ")"


class Gpu(NamedTuple):
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


class Host(NamedTuple):
    """Everything discovery found, in address order."""

    gpus: Tuple[Gpu, ...] = ()

    def gpu(self, address: str) -> Optional[Gpu]:
        """The GPU at ``address``, or whose VF is at ``address``; None when neither is here."""
        for gpu in self.gpus:
            if gpu.function(address) is not None:
                return gpu
        return None

    def owners(self) -> Dict[str, Gpu]:
        """``{GPU or VF address: its GPU}``, as :meth:`gpu` finds each: for many look-ups at once.

        Built anew on each call (the caller keeps it for its loop): a Host keeps no index.
        """
        out: Dict[str, Gpu] = {}
        for gpu in self.gpus:
            out.setdefault(gpu.address, gpu)
            for vf in gpu.vfs:
                out.setdefault(vf.address, gpu)
        return out

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
    """Read the host's PCI devices once and return its NVIDIA GPUs.

    Reads what every hook needs: per PCI function its vendor; per NVIDIA GPU
    its class, ids, driver and VF links; per VF its type ids (directory names
    or ``nvidia/`` files, as its GPU's framework has them). A type's name and
    description are read once per (GPU device id, type id). How many
    instances of an mdev type can still be created is read on demand, for
    the functions that matter (:func:`with_available`).
    """
    # Plain strings, not pathlib: joining paths is a good part of reading sysfs' tiny files.
    devices = hostroot.text_path(PCI_DEVICES)
    listed = hostroot.listdir(devices)  # HostReadError when it cannot be read
    if listed is None:
        return Host()
    physical: Dict[str, str] = {}
    links: Dict[str, List[Tuple[str, str]]] = {}  # GPU -> its (virtfn link, VF address)
    numvfs: Dict[str, int] = {}
    known_vfs: set = set()  # VFs of the GPUs found so far: sorted after their GPU, never read
    others = not_nvidia()  # the kernel's own list: functions whose vendor file needs no read
    for name in sorted(listed):
        if name in known_vfs or name[-7:] in others or not _ADDRESS.match(name):
            continue
        entry = f"{devices}/{name}"
        if _read(f"{entry}/vendor") != NVIDIA_VENDOR:
            continue  # NICs, other vendors' mdev parents (Intel GVT-g): not ours
        if os.path.lexists(f"{entry}/physfn"):
            continue  # a VF: found through its GPU's virtfn links
        class_code = _read(f"{entry}/class") or ""
        if class_code[:6] in GPU_CLASSES:
            physical[name] = class_code
            numvfs[name] = _int(_read(f"{entry}/sriov_numvfs")) or 0
            links[name] = vf_addresses(entry, name, numvfs[name])
            known_vfs.update(address for _, address in links[name])

    ids = {address: _read(f"{devices}/{address}/device") or "" for address in physical}
    names_by_id = model_names(set(ids.values()))
    # (device id, type id) -> its definition; (device id, directory names) -> the types listed;
    # a creatable_vgpu_types listing (bytes, None if absent) -> the types it lists
    definitions: Dict[Any, Any] = {}
    gpus = []
    for address, class_code in physical.items():
        entry = f"{devices}/{address}"
        device_id = ids[address]
        gpus.append(Gpu(
            address=address,
            device_id=device_id,
            model=names_by_id.get(device_id) or host_model(address) or f"NVIDIA {device_id}",
            driver=_link_name(f"{entry}/driver"),
            class_code=class_code,
            sriov_totalvfs=_int(_read(f"{entry}/sriov_totalvfs")) or 0,
            sriov_numvfs=numvfs[address],
            types=_mdev_types(entry, definitions, device_id),
            vfs=_virtual_functions(entry, definitions, device_id, links[address]),
        ))
    return Host(gpus=tuple(gpus))


def not_nvidia() -> frozenset:
    """``bus:slot.function`` of the functions ``/proc/bus/pci/devices`` lists with no NVIDIA one.

    One read instead of a ``vendor`` file per function (a GPU host has hundreds: NICs
    and their VFs, bridges). The kernel's list has no PCI domain (``drivers/pci/proc.c``,
    ``show_device``: bus number, devfn, vendor and device), so a ``bus:slot.function``
    that any domain has an NVIDIA function at, or that is not listed, is not in the set,
    and its vendor is read from sysfs as before. A list that is missing, unreadable,
    past :data:`PROC_DEVICES_LIMIT` or not as the kernel writes it gives the empty set:
    every vendor is read.
    """
    try:
        raw = hostroot.read_bytes(hostroot.text_path(PROC_DEVICES), PROC_DEVICES_LIMIT)
    except HostReadError:
        return frozenset()
    if not raw:
        return frozenset()
    listed, nvidia, heads = set(), set(), []
    for line in raw.decode("ascii", "replace").split("\n"):  # the kernel writes ASCII
        if not line:
            continue
        if line[4:5] != "\t" or line[13:14] != "\t":
            return frozenset()  # not the kernel's format: read every vendor
        key = line[:4]
        heads.append(key + line[5:13])
        listed.add(key)
        if line[5:9] == "10de":
            nvidia.add(key)
    if "".join(heads).strip(_HEX_DIGITS):  # bus, devfn, vendor and device: hex digits only
        return frozenset()
    return frozenset(f"{key[:2]}:{_DEVFN[key[2:]]}" for key in listed - nvidia)


def with_available(host: Host, addresses: Optional[Iterable[str]] = None) -> Host:
    """``host`` with ``available_instances`` of the mdev types of ``addresses`` read (all: None)."""
    wanted = None if addresses is None else set(addresses)

    def filled(address: str, types: Tuple[VgpuType, ...]) -> Tuple[VgpuType, ...]:
        if wanted is not None and address not in wanted:
            return types
        return tuple(t._replace(available_instances=available_instances(address, t.id))
                     if t.framework == MDEV else t for t in types)

    return Host(gpus=tuple(
        gpu._replace(types=filled(gpu.address, gpu.types),
                     vfs=tuple(vf._replace(types=filled(vf.address, vf.types)) for vf in gpu.vfs))
        for gpu in host.gpus))


def available_instances(address: str, type_id: str) -> Optional[int]:
    """How many more mdevs of ``type_id`` the function at ``address`` can create now."""
    return _int(_read(hostroot.text_path(PCI_DEVICES, address, "mdev_supported_types", type_id,
                                         "available_instances")))


def vf_addresses(entry: str, address: str, numvfs: int) -> List[Tuple[str, str]]:
    """The GPU's ``virtfn<N>`` links and the VF address each names, as the kernel names VFs.

    The kernel places VF ``N`` at the PF's routing ID + ``sriov_offset`` + N x
    ``sriov_stride`` (bus and devfn: ``pci_iov_virtfn_bus``/``pci_iov_virtfn_devfn``,
    drivers/pci/iov.c) and names its device, and so its ``virtfn<N>`` link, by that
    address; ``sriov_numvfs`` says how many there are. Three reads per GPU, instead of a
    link per VF (256 on an 8-GPU L40S host). A GPU whose attributes are missing (kernels
    before 4.17), unreadable or not numbers, or that put a VF past the last bus, has its
    links read (:func:`virtfn_links`); so has one whose computed VF has no link
    (:func:`_virtual_functions`).
    """
    if numvfs <= 0:
        return virtfn_links(entry)
    try:
        offset, stride = _int(_read(f"{entry}/sriov_offset")), _int(_read(f"{entry}/sriov_stride"))
    except HostReadError:
        return virtfn_links(entry)  # the links still tell
    # An address discover matched: <domain>:<bus>:<slot>.<function>, the last three fixed.
    slot = int(address[-4:-2], 16)
    first = int(address[-7:-5], 16) << 8 | slot << 3 | int(address[-1])  # the PF's routing ID
    if offset is None or stride is None or offset < 1 or stride < 1 or slot > 0x1F \
            or first + offset + stride * (numvfs - 1) > 0xFFFF:
        return virtfn_links(entry)  # not as the kernel has them (a PCI bus number is 8 bits)
    domain = address[:-7]
    out = []
    for index in range(numvfs):
        routing = first + offset + stride * index
        out.append((f"virtfn{index}", f"{domain}{routing >> 8:02x}:{_SLOT_FUNCTION[routing & 0xFF]}"))
    return out


def virtfn_links(entry) -> List[Tuple[str, str]]:
    """The GPU's ``virtfn<N>`` links and the VF address each names, in index order."""
    try:
        indexes = {n: int(n[6:]) for n in os.listdir(entry) if re.match(_VIRTFN, n)}
    except OSError:
        return []
    out = []
    for link in sorted(indexes, key=indexes.__getitem__):
        address = _link_name(f"{entry}/{link}")
        if address:
            out.append((link, address))
    return out


def _virtual_functions(entry, definitions: Dict[Any, Any], device_id: str,
                       links: Optional[List[Tuple[str, str]]] = None
                       ) -> Tuple[VirtualFunction, ...]:
    """The GPU's VFs (``links``: :func:`vf_addresses`; its links are read when not given).

    The first VF that shows a framework decides it for its GPU: the VFs of one
    GPU share it, so mdev VFs are not probed for ``nvidia/`` files, nor VFIO
    VFs for ``mdev_supported_types/``. A VF that shows neither and has no
    ``virtfn`` link (the addresses were computed, and the kernel's VFs are not
    what ``sriov_numvfs`` says) has the GPU's links read instead.
    """
    vfs = []
    decided: Optional[str] = None  # the GPU's framework, once a VF showed it
    vf_device: Optional[str] = None  # one VF Device ID per PF (its SR-IOV capability)
    for link, address in (virtfn_links(entry) if links is None else links):
        index = int(link[6:])  # virtfn<N>, as both give them
        vf_entry = f"{entry}/{link}"
        framework: Optional[str] = None
        current: Optional[int] = None
        types: Tuple[VgpuType, ...] = ()
        if decided in (None, MDEV):
            listed = _mdev_type_names(vf_entry)
            if listed is not None:
                framework = MDEV
                types = _types_from_names(vf_entry, listed, definitions, device_id)
        if framework is None and decided in (None, VFIO):
            nvidia = f"{vf_entry}/nvidia/"
            current = _int(_read(nvidia + "current_vgpu_type"))
            if current is not None:
                framework = VFIO
                listing = _attribute(nvidia + "creatable_vgpu_types")
                if listing not in definitions:  # free VFs share one listing: parsed once
                    definitions[listing] = parse_creatable(_text(listing)) if listing else ()
                types = definitions[listing]
        if framework is None and not os.path.lexists(vf_entry):
            # An address computed for a VF the kernel has no link for: read the GPU's links
            # instead (they list only VFs that are there, so this ends).
            return _virtual_functions(entry, definitions, device_id)
        decided = decided or framework
        if framework == VFIO and vf_device is None:
            vf_device = _read(f"{vf_entry}/device") or ""
        # Nova's device_spec needs the VF's device id on VFIO only: mdev hosts skip the read.
        vfs.append(VirtualFunction(address, index, types, current,
                                   (vf_device or "") if framework == VFIO else "", framework))
    return tuple(sorted(vfs, key=lambda vf: vf.index))


def _mdev_type_names(entry) -> Optional[List[str]]:
    """The entries of ``mdev_supported_types``; None when there is none.

    Unreadable is not "no types": HostReadError, so no type passes unverified.
    """
    return hostroot.listdir(f"{entry}/mdev_supported_types")


def _mdev_types(entry, definitions: Optional[Dict[tuple, Any]] = None,
                device_id: str = "") -> Tuple[VgpuType, ...]:
    """Types under ``mdev_supported_types``; ``definitions`` shares them between functions."""
    return _types_from_names(entry, _mdev_type_names(entry) or (), definitions, device_id)


def _types_from_names(entry, names: Iterable[str],
                      definitions: Optional[Dict[tuple, Any]],
                      device_id: str) -> Tuple[VgpuType, ...]:
    """Types from the type directories' names; name and description read once per device id."""
    base = f"{entry}/mdev_supported_types"
    definitions = {} if definitions is None else definitions
    names = tuple(names)
    listing = (device_id, names)  # the VFs of one GPU list the same types: sort them once
    if listing in definitions:
        return definitions[listing]
    types = []
    for name in names:
        match = _TYPE_DIR.match(name)
        if not match:
            continue
        number = int(match.group(1))
        key = (device_id, number)
        if key not in definitions:
            definitions[key] = VgpuType(
                number=number,
                name=_read(f"{base}/{name}/name") or name,
                framework=MDEV,
                properties=parse_description(_read(f"{base}/{name}/description") or ""),
            )
        types.append(definitions[key])
    definitions[listing] = tuple(sorted(types, key=lambda t: t.number))
    return definitions[listing]


def parse_creatable(text: str) -> Tuple[VgpuType, ...]:
    """``nvidia/creatable_vgpu_types`` (``ID    : vGPU Name`` rows) as types, by id."""
    types = []
    for line in text.splitlines():
        match = re.match(_TYPE_ROW, line)
        if match:
            types.append(VgpuType(number=int(match.group(1)), name=match.group(2), framework=VFIO))
    return tuple(sorted(types))  # by number first: ids are unique


def described_framebuffer_mb(description: str) -> Optional[int]:
    """The framebuffer an mdev type's ``description`` gives, in MiB; None without one."""
    return _megabytes(dict(parse_description(description)).get("framebuffer"))


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

    Only the NVIDIA block of ``pci.ids`` is searched; ``GV100GL [Tesla V100
    PCIe 16GB]`` gives the bracketed name. Unknown ids are left out. The file
    is read whole, bounded by :data:`PCI_IDS_LIMIT` (the real one is about 1.7 MB,
    NVIDIA's block at line 10,234 of 43,000), and searched as bytes: going through
    it line by line in Python cost about 6 ms a hook. One that cannot be read, or
    is larger than the bound, is passed over for the next (hwdata's copy).
    """
    # A device id is four hex digits (16 bits); what else a device file holds names nothing.
    wanted = {i for i in (d.lower().removeprefix("0x") for d in device_ids)
              if len(i) == 4 and set(i) <= _HEX_DIGITS_SET}
    found: Dict[str, str] = {}
    if not wanted:
        return found
    for candidate in PCI_IDS:
        try:  # a regular file only, non-blocking, bounded (hostroot's module doc)
            data = hostroot.read_bytes(hostroot.text_path(candidate), PCI_IDS_LIMIT)
        except HostReadError:
            data = None
        if data is None:
            continue
        block = _nvidia_block(data)
        for ident in sorted(wanted):
            name = _device_name(block, ident)
            if name is not None:
                found[f"0x{ident}"] = _marketing_name(name)
        return found
    return found


def _nvidia_block(data: bytes) -> bytes:
    """NVIDIA's block of pci.ids: from its vendor line (``10de  NVIDIA Corporation``) to the next.

    The vendor line is the first line that starts with ``10de ``; the block ends
    at the first line after it that starts with anything but a tab or ``#`` (the
    next vendor, or the device classes). Empty when there is none.
    """
    if data.startswith(b"10de "):
        start = 0
    else:
        start = data.find(b"\n10de ") + 1
        if not start:
            return b""
    end = _NEXT_ENTRY.search(data, start)
    return data[start:end.start() + 1 if end else len(data)]


def _device_name(block: bytes, ident: str) -> Optional[str]:
    """The name on the device line (a tab, ``<ident>``, two spaces, the name); None if there is none.

    A device line has one tab; a subsystem line (two tabs) that names the id is not it.
    """
    line = b"\n\t" + ident.encode("ascii") + b" "
    at = block.find(line)
    if at < 0:
        return None
    start = at + len(line)
    end = block.find(b"\n", start)
    return block[start:end if end >= 0 else len(block)].decode(errors="replace").strip()  # UTF-8


def _marketing_name(name: str) -> str:
    """``GV100GL [Tesla V100 PCIe 16GB]``: first "[" to last "]", not empty; else as it is."""
    name = name.strip()
    first, last = name.find("["), name.rfind("]")
    return text.one_line(name[first + 1:last] if -1 < first < last - 1 else name)


def host_model(address: str) -> Optional[str]:
    """What the host calls the GPU at ``address`` (udev's hwdb, then the driver); None if nothing.

    For a GPU the host's pci.ids does not know. Each file is read bounded,
    any bytes; one that cannot be read names nothing (a name is no reason to
    fail discovery). The driver's ``NVIDIA H200 NVL`` loses its vendor, as
    pci.ids' names have none. udev's comes first: reading the driver's file
    takes a runtime power reference on the GPU (nv-procfs.c), udev's is a file.
    """
    said = _said(hostroot.text_path(UDEV_DATA, f"+pci:{address}"), "E:ID_MODEL_FROM_DATABASE=")
    if said:
        return _marketing_name(said)
    said = _said(hostroot.text_path(NVIDIA_GPUS, address, "information"), "Model:")
    if said:
        return text.one_line(said.removeprefix("NVIDIA ").strip()) or None
    return None


def _said(path: str, key: str) -> Optional[str]:
    """The value of the first line of ``path`` that starts with ``key``, stripped; None if none."""
    try:
        content = hostroot.read_text(path, clean=False, limit=_ATTRIBUTE)
    except HostReadError:
        return None
    for line in (content or "").splitlines():
        if line.startswith(key):
            return line[len(key):].strip() or None
    return None


def _read(path) -> Optional[str]:
    """A sysfs attribute, cleaned and stripped; None if absent; HostReadError if unreadable."""
    data = _attribute(path)
    return None if data is None else _text(data)


def _attribute(path) -> Optional[bytes]:
    """A sysfs attribute's bytes; None if absent; HostReadError if unreadable.

    A sysfs attribute is at most a page: one read of :data:`_PAGE_READ` bytes
    takes one of 4 KiB whole (three system calls, not five); a longer file (a
    kernel of 64 KiB pages) is read again, whole.
    """
    try:
        fd = hostroot.open_regular(path)  # never a FIFO or device in sysfs' place
        try:
            data = os.read(fd, _PAGE_READ)
        finally:
            os.close(fd)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):  # as hostroot.read_bytes has it
            return None
        raise hostroot.unreadable(path, error) from None
    if len(data) == _PAGE_READ:
        return hostroot.read_bytes(path)  # the whole of a longer file (None: gone since)
    return data


def _text(data: bytes) -> str:
    """An attribute's bytes as :func:`_read` gives them: decoded, cleaned, stripped."""
    value = data.decode("utf-8", errors="replace")
    line = value[:-1] if value[-1:] == "\n" else value
    if line.isprintable():  # the usual attribute, one line: text.decode would keep it as it is
        return line.strip()
    return text.decode(data).strip()


_ATTRIBUTE = 65536  # bytes of a udev or driver file read for a name
# One byte more than a 4 KiB page: a buffer of 64 KiB for each of a steady hook's ~900
# attributes costs about 1 ms more (bench), for what only 64 KiB-page kernels can hold.
_PAGE_READ = 4097


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
        return int(text, 10)  # counts and ids in sysfs are decimal
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
