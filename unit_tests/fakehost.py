"""Host trees shaped like a real one, for tests and the sample-host demo.

Devices live under ``sys/devices/pci<domain>:00/<bridge>/<address>`` and are
reached through symlinks in ``sys/bus/pci/devices``, with ``driver``,
``virtfnN`` and ``physfn`` links and ``mdev_supported_types`` or
``nvidia/creatable_vgpu_types`` as the kernel lays them out. dpkg's status
file, ``proc/modules`` and ``proc/cmdline`` sit where the charm reads them.

Two pieces of kernel behaviour are modelled, since plain files cannot show them:

* SR-IOV VFs that are not enabled yet (after a reboot): the GPU is recorded
  with its VFs' recipe, and a stand-in ``/usr/lib/nvidia/sriov-manage`` (a
  Python script, :meth:`FakeHost.install_sriov_manage`) records its calls in
  ``$FAKE_LOG`` and creates the VFs in the tree, as the real one makes the
  kernel do.
* NVIDIA's vendor-specific VFIO framework (:class:`VfioModel`): a VF's
  ``nvidia/creatable_vgpu_types`` is recomputed from its siblings'
  ``current_vgpu_type`` whenever it is opened for reading (a Python audit
  hook on ``open``), so it shrinks as siblings take types (the same size
  only, while framebuffer is left) and is empty on a full GPU or on a VF that
  holds a type. A type written to a VF that could not take it reads back as
  ``0``, as the driver refuses the write.
* MIG-backed vGPUs on that framework (:class:`VfioModel` with ``mig``): the
  GPU's MIG mode is what the stand-in nvidia-smi (:func:`faketools.nvidia_smi`)
  keeps in ``<root>.fake/nvidia-smi.json``. With MIG mode on, a VF lists only
  the MIG-backed types that still have room: in a GPU instance of that type
  with a free vGPU, or in a new instance at the lowest free placement; a VF
  given one gets ``nvidia/gpu_instance_id`` (as bigstack-oss/cubecos issue 312
  shows), released with its type. With MIG mode off, MIG-backed types are
  listed as before but refused, as time-sliced ones are with MIG mode on
  (inferred: no transcript shows either write).
* Creating a mediated device: a UUID written to a type's ``create`` becomes
  ``<parent>/<uuid>`` with its ``mdev_type`` link and ``sys/bus/mdev/devices/<uuid>``
  as soon as anything is opened next (an audit hook; :func:`settle_mdevs` at once).
  A VF holds at most one vGPU: its types' ``available_instances`` read 1 while it
  is free and 0 once it holds an mdev (NVIDIA's vGPU user guide, SR-IOV GPUs on
  the mdev framework); a PF's counts are left as they were written.
  :meth:`FakeHost.reboot` takes away what a reboot does: mdevs, VFs (recorded for
  sriov-manage again), running domains; optionally with a new driver's type ids.
* The PCI control files (a driver's ``bind``, ``unbind``, ``new_id``, ``remove_id``,
  ``drivers_probe``): each write is acted on in the order written, as the kernel's
  store callbacks act at the write (:func:`_driver_kernel`), so a hook that moves
  several GPUs writes the same file once per GPU; ``<root>.fake/pci-writes.log``
  records each write (:meth:`FakeHost.pci_writes`).
"""

import json
import os
import re
import shutil
import sys
import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

INTEL = "0x8086"
NVIDIA = "0x10de"
MELLANOX = "0x15b3"


@dataclass(frozen=True)
class MdevType:
    name: str
    framebuffer_mb: int
    max_instance: int
    available: Optional[int] = None

    def description(self) -> str:
        return (f"num_heads=4, frl_config=60, framebuffer={self.framebuffer_mb}M, "
                f"max_resolution=7680x4320, max_instance={self.max_instance}")


V100_TYPES = {
    "nvidia-105": MdevType("GRID V100-1Q", 1024, 16),
    "nvidia-106": MdevType("GRID V100-2Q", 2048, 8),
    "nvidia-107": MdevType("GRID V100-4Q", 4096, 4),
    "nvidia-108": MdevType("GRID V100-8Q", 8192, 2),
    "nvidia-109": MdevType("GRID V100-16Q", 16384, 1),
}
# A100 PCIe 40GB on an mdev-based driver: types on each VF (one vGPU per VF).
A100_TYPES = {
    "nvidia-471": MdevType("GRID A100-4C", 4096, 10),
    "nvidia-472": MdevType("GRID A100-5C", 5120, 8),
    "nvidia-474": MdevType("GRID A100-10C", 10240, 4),
    "nvidia-475": MdevType("GRID A100-20C", 20480, 2),
    "nvidia-476": MdevType("GRID A100-40C", 40960, 1),
    "nvidia-699": MdevType("GRID A100-4-20C", 20480, 1),  # MIG-backed
}
# Vendor-specific VFIO: ids as creatable_vgpu_types lists them on a free GPU. The L40S's ids
# here are inferred, not read from a host: no public transcript of the 570 branch's L40S
# listing was found; the names are NVIDIA's (Ada profiles), the ids only differ from those of
# the one public listing (L40S_TYPES_1153 below), as ids differ between branches.
L40S_TYPES = {1134: "NVIDIA L40S-2B", 1136: "NVIDIA L40S-4Q", 1139: "NVIDIA L40S-12Q",
              1140: "NVIDIA L40S-16Q", 1141: "NVIDIA L40S-24Q", 1142: "NVIDIA L40S-48Q"}
# H200X profiles are the H200 SXM's (the H200 NVL's are H200-*); these ids are the fixture's own.
H200_TYPES = {1281: "NVIDIA H200X-18C", 1282: "NVIDIA H200X-35C", 1283: "NVIDIA H200X-70C",
              1284: "NVIDIA H200X-141C", 1290: "NVIDIA H200X-1-18C"}

# -- Tables from real hosts' transcripts (sources beside each fact; "inferred" = not seen) ------
# L40S, another driver branch: harvester/pcidevices pkg/util/gpuhelper/testdata
# (sys/bus/pci/devices/0000:26:00.4/nvidia/creatable_vgpu_types): L40S-12Q is 1153 there,
# 1139 in L40S_TYPES. Type ids change between branches; names do not.
L40S_TYPES_1153 = {1145: "NVIDIA L40S-1B", 1146: "NVIDIA L40S-2B", 1147: "NVIDIA L40S-1Q",
                   1148: "NVIDIA L40S-2Q", 1149: "NVIDIA L40S-3Q", 1150: "NVIDIA L40S-4Q",
                   1151: "NVIDIA L40S-6Q", 1152: "NVIDIA L40S-8Q", 1153: "NVIDIA L40S-12Q",
                   1154: "NVIDIA L40S-16Q", 1155: "NVIDIA L40S-24Q", 1156: "NVIDIA L40S-48Q",
                   1157: "NVIDIA L40S-1A", 1158: "NVIDIA L40S-2A", 1159: "NVIDIA L40S-3A",
                   1160: "NVIDIA L40S-4A", 1161: "NVIDIA L40S-6A", 1162: "NVIDIA L40S-8A",
                   1163: "NVIDIA L40S-12A", 1164: "NVIDIA L40S-16A", 1165: "NVIDIA L40S-24A",
                   1166: "NVIDIA L40S-48A", 2164: "NVIDIA L40S-3B"}
# One table per driver branch, with the driver version the host reports (both versions
# inferred: the harvester listing names none; 570.158.02 is the other fixtures' driver).
L40S_BRANCHES = {"570": (L40S_TYPES, "570.158.02"), "550": (L40S_TYPES_1153, "550.90.05")}
# H200 SXM 141GB: 1414 and 1428 from NVIDIA/kubevirt-gpu-device-plugin PR 192 (an 8x H200 SXM
# host on 580.159.01; "1428 : NVIDIA H200X-141C", "1414 : NVIDIA H200X-1-18C"); the other
# time-sliced H200X ids are inferred, their names from NVIDIA's Hopper vGPU type table.
H200_SXM_TYPES = {1414: "NVIDIA H200X-1-18C", 1420: "NVIDIA H200X-18C", 1424: "NVIDIA H200X-35C",
                  1426: "NVIDIA H200X-70C", 1428: "NVIDIA H200X-141C"}
# H200 NVL: NVIDIA's Hopper table names its profiles H200-<GB>C (H200-4C fits 32, H200-35C
# fits 4); every id is inferred.
H200_NVL_TYPES = {1500: "NVIDIA H200-4C", 1501: "NVIDIA H200-8C", 1502: "NVIDIA H200-17C",
                  1503: "NVIDIA H200-35C", 1504: "NVIDIA H200-70C", 1505: "NVIDIA H200-141C",
                  1510: "NVIDIA H200-1-18C"}
# RTX PRO 6000 Blackwell Server Edition: the driver's names as bigstack-oss/cubecos issue 312
# lists them ("NVIDIA RTX Pro 6000 Blackwell DC-1-8Q", ... on 580.105.06); NVIDIA's type
# tables call the time-sliced ones DC-<GB><series> (DC-8Q). Every id is inferred, and so are
# the time-sliced sizes (96 GB: DC-96Q is the whole GPU).
RTX_PRO_6000_TYPES = {
    **{2000 + n: f"NVIDIA RTX Pro 6000 Blackwell DC-{gb}Q"
       for n, gb in enumerate((2, 4, 8, 12, 16, 24, 32, 48, 96))},
    2020: "NVIDIA RTX Pro 6000 Blackwell DC-8A", 2021: "NVIDIA RTX Pro 6000 Blackwell DC-8C",
    2022: "NVIDIA RTX Pro 6000 Blackwell DC-96C",
    2030: "NVIDIA RTX Pro 6000 Blackwell DC-1-8Q", 2031: "NVIDIA RTX Pro 6000 Blackwell DC-2-16Q",
    2032: "NVIDIA RTX Pro 6000 Blackwell DC-4-24Q"}
# MIG-backed forms (ids inferred): DC-1-24Q, DC-2-12Q as the brief and cubecos PR 903/1223 name
# the RTX PRO 6000's (DC-1-2Q ... DC-1-24C on its 1g.24gb instance, DC-4-96A); H200X ones from
# NVIDIA's Hopper vGPU table (H200X-1-18C fits 7, -2-35C 3, -3-71C 2, -4-71C and -7-141C 1).
RTX_PRO_6000_MIG_TYPES = {
    **RTX_PRO_6000_TYPES,
    2033: "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q", 2034: "NVIDIA RTX Pro 6000 Blackwell DC-2-12Q",
    2035: "NVIDIA RTX Pro 6000 Blackwell DC-2-48Q", 2036: "NVIDIA RTX Pro 6000 Blackwell DC-4-96Q"}
# No type name carries GFX: every MIG-backed type above sits on +gfx GPU instances only
# (NVIDIA/vgpu-device-manager pkg/vgpu/config.go, main; see MigModel.instance_profile).
H200_SXM_MIG_TYPES = {
    **H200_SXM_TYPES, 1415: "NVIDIA H200X-1-35C", 1416: "NVIDIA H200X-2-35C",
    1417: "NVIDIA H200X-3-71C", 1418: "NVIDIA H200X-4-71C", 1419: "NVIDIA H200X-7-141C"}
# The fixture's own model of MIG geometry, (compute slices, GI GB) -> (memory slices it takes,
# its placements), from NVIDIA's MIG user guide (H200) and the A30-like 4-slice layout
# (RTX PRO 6000, inferred), written apart from vgpu.mig so that tests check one against the other.
H200_GIS = {(1, 18): (1, range(7)), (1, 35): (2, (0, 2, 4, 6)), (2, 35): (2, (0, 2, 4)),
            (3, 71): (4, (0, 4)), (4, 71): (4, (0,)), (7, 141): (8, (0,))}
RTX_PRO_6000_GIS = {(1, 24): (1, range(4)), (2, 48): (2, (0, 2)), (4, 96): (4, (0,))}

PCI_IDS = """\
# List of PCI ID's (sample)
8086  Intel Corporation
\t3e92  CoffeeLake-S GT2 [UHD Graphics 630]
10de  NVIDIA Corporation
\t1db4  GV100GL [Tesla V100 PCIe 16GB]
\t\t10de 1214  Tesla V100 PCIe 16GB
\t20b5  GA100 [A100 PCIe 80GB]
\t20f1  GA100 [A100 PCIe 40GB]
\t2335  GH100 [H200 SXM 141GB]
\t233b  GH100 [H200 NVL]
\t2bb5  GB202GL [RTX PRO 6000 Blackwell Server Edition]
\t26b9  AD102GL [L40S]
\t1eb8  TU104GL [Tesla T4]
15b3  Mellanox Technologies
\t101d  MT2892 Family [ConnectX-6 Dx]
"""


# The shape of the PCI ID database hosts ship (Ubuntu's pci.ids package, hwdata): pciutils/pciids
# at c1c12547 (2026-08-22) has 42,988 lines and 1,659,114 bytes; NVIDIA's block
# ("10de  NVIDIA Corporation") starts at line 10,234 and has 3,464 lines (Emulex's "10df" follows).
REAL_PCI_IDS = {"lines": 42988, "bytes": 1659114, "nvidia_line": 10234, "nvidia_lines": 3464}


def real_shaped_pci_ids(nvidia: str) -> str:
    """A pci.ids of the real one's size and shape (:data:`REAL_PCI_IDS`), ``nvidia`` in its block.

    ``nvidia``: device lines (a tab, the id, two spaces, the name), placed at the start of
    NVIDIA's block. The rest is filler of the real lines' forms and average length: vendors
    below 10de with device lines, subsystem lines (some of NVIDIA's subsystem vendor, 10de, as
    other vendors' boards carry), comments, NVIDIA's filler devices (ids f000 on, which
    NVIDIA has not used), the vendors after it and the device classes that end the file.
    """
    shape = REAL_PCI_IDS
    head = ["#", "#\tList of PCI IDs", "#", "#\tVersion: 2026.08.22 (its shape; filler below)", "#"]
    lines = head + _filler_vendors(0x0001, shape["nvidia_line"] - 1 - len(head), 7, subsystem=3)
    block = ["10de  NVIDIA Corporation"] + nvidia.rstrip("\n").split("\n")
    device = 0xf000
    while len(block) < shape["nvidia_lines"]:
        block.append(f"\t{device:04x}  GF{device % 1000:03d} [Filler GeForce {device:04x}]")
        if device % 4 == 0:
            block.append(f"\t\t10de {device:04x}  Filler GeForce {device:04x} board")
        if device % 50 == 0:
            block.append("# a comment inside the block, as the database has them")
        device += 1
    lines += block[:shape["nvidia_lines"]]
    classes = [f"C {n:02x}  Filler device class {n:02x}" for n in range(40)]  # the file's end
    lines += _filler_vendors(0x10df, shape["lines"] - len(lines) - len(classes), 5)
    return "\n".join(lines + classes) + "\n"


def _filler_vendors(first: int, count: int, devices: int, subsystem: int = -1) -> List[str]:
    """``count`` lines of vendors from id ``first`` on, ``devices`` device lines each.

    ``subsystem``: after that device, a subsystem line of NVIDIA's subsystem vendor id.
    """
    lines: List[str] = []
    vendor = first
    while len(lines) < count:
        lines.append(f"{vendor:04x}  Filler Vendor {vendor:04x} Corporation")
        for device in range(devices):
            lines.append(f"\t{device:04x}  Filler device {device} of vendor {vendor:04x}")
            if device == subsystem:
                lines.append(f"\t\t10de {vendor:04x}  Filler board with NVIDIA's subsystem id")
        vendor += 1
    assert first > 0x10de or vendor <= 0x10de, "the filler before NVIDIA's block sorts before it"
    return lines[:count]


def _gb(name: str) -> int:
    """Framebuffer in GB from a profile name: NVIDIA L40S-12Q -> 12, H200X-1-18C -> 18."""
    digits = "".join(c for c in name.rsplit("-", 1)[-1] if c.isdigit())
    return int(digits) if digits else 0  # a name that is no profile: no size


def _mig(name: str) -> bool:
    """MIG-backed: two numbers after the model (H200X-1-18C, DC-1-8Q; not RTX6000-Ada-12Q)."""
    return re.search(r"-[0-9]+-[0-9]+[A-Za-z]+\Z", name) is not None


def _slices(name: str) -> int:
    """Compute slices of a MIG-backed name: H200X-2-35C -> 2."""
    return int(name.rsplit("-", 2)[-2])


class MigModel:
    """The driver's side of MIG-backed vGPUs on one GPU: GPU instances come from nvidia-smi.

    The GPU instances are the stand-in nvidia-smi's (its state file, shared with it):
    writing a MIG-backed type to a VF never creates one (NVIDIA's vGPU for Compute guide,
    "Configuring a GPU for MIG-Backed vGPUs": on KVM the GPU instances are created first).
    A VF lists a MIG-backed type only while a GPU instance of the profile the type sits on
    has room (one vGPU type per instance, ``GI GB // type GB`` vGPUs); a VF given one
    gets ``nvidia/gpu_instance_id`` (as bigstack-oss/cubecos issue 312 shows).
    """

    def __init__(self, gis: Mapping[tuple, tuple], gfx: bool = False):
        self.gis = dict(gis)
        self.gfx = gfx  # the GPU's MIG-backed types need +gfx instances (RTX PRO 6000)
        self.state: Optional[Path] = None  # the stand-in nvidia-smi's state file
        self.address = ""

    def _gpu(self) -> dict:
        try:
            state = json.loads(self.state.read_text()) if self.state else {}
        except (OSError, ValueError):
            return {}
        return state.get(self.address, {})

    def enabled(self) -> bool:
        return self._gpu().get("current") == "Enabled"

    def instance_profile(self, name: str) -> Optional[str]:
        """The GPU instance profile a MIG-backed type sits on: ``1g.24gb``; None: none.

        On a GPU whose MIG-backed types need the GFX attribute (the RTX PRO 6000),
        every one sits only on a ``+gfx`` instance and a plain one offers it nothing;
        no type name says GFX (NVIDIA/vgpu-device-manager pkg/vgpu/config.go, main).
        """
        slices, gb = _slices(name), _gb(name)
        fitting = sorted(k for k in self.gis if k[0] == slices and k[1] >= gb)
        if not fitting or name.upper().endswith("GFX"):  # no such type name
            return None
        return f"{slices}g.{fitting[0][1]}gb" + ("+gfx" if self.gfx else "")

    def place(self, pf_dir: str, vf_dir: str, number: int, name: str) -> Optional[int]:
        """The GPU instance the VF's vGPU lives in (the lowest with room), or None."""
        wanted = self.instance_profile(name)
        gis = sorted(self._gpu().get("gis", []), key=lambda g: g["id"])
        snap = _siblings(pf_dir)
        mine = _instance(snap, vf_dir)
        if _current_in(snap, vf_dir) == number and any(
                str(g["id"]) == mine and g["profile"] == wanted for g in gis):
            return int(mine)  # read again: where it was placed
        held: Dict[int, List[int]] = {}
        for sibling in snap.vfs:
            if sibling == vf_dir:
                continue
            current = _current_in(snap, sibling)
            gi = _instance(snap, sibling)
            if current and gi.isdigit():
                held.setdefault(int(gi), []).append(current)
        for gi in gis:
            there = held.get(gi["id"], [])
            room = int(gi["profile"].split(".")[1].split("gb")[0]) // max(1, _gb(name))
            if gi["profile"] == wanted and len(there) < room and set(there) <= {number}:
                return gi["id"]
        return None


class VfioModel:
    """What NVIDIA's driver lists in a VF's creatable_vgpu_types, given its siblings."""

    def __init__(self, types: Mapping[int, str], mig: Optional[Mapping[tuple, tuple]] = None,
                 gfx: bool = False):
        self.types = dict(types)
        self.mig = MigModel(mig, gfx) if mig else None
        self.total = max(_gb(n) for n in self.types.values() if not _mig(n))
        # VF addresses whose writes the driver refuses (reads back 0), or (address, type id)
        # pairs: that VF refuses only that type.
        self.refuse: set = set()
        self.written: set = set()  # VFs written since last read (refusals apply to those)
        self.hidden: set = set()  # VF addresses that list nothing creatable (and refuse all)
        self.frozen = False  # True: the VFs' files stay as a test writes them, never recomputed
        self.vf_dirs: Dict[str, str] = {}  # VF address -> its directory, as the hook saw it

    def creatable(self, own: int, siblings: Iterable[int], vf: str = "") -> Dict[int, str]:
        if own or vf in self.hidden:
            return {}
        if self.mig is not None and self.mig.enabled():
            pf_dir = os.path.realpath(os.path.join(self.vf_dirs.get(vf, ""), "physfn"))
            return {n: name for n, name in self.types.items() if _mig(name) and os.path.isdir(pf_dir)
                    and self.mig.place(pf_dir, self.vf_dirs[vf], n, name) is not None}
        held = [t for t in siblings if t]
        sizes = {_gb(self.types[t]) for t in held if t in self.types}
        free = self.total - sum(_gb(self.types[t]) for t in held if t in self.types)
        return {n: name for n, name in self.types.items()
                if _gb(name) <= free and (not held or (not _mig(name) and _gb(name) in sizes))}


_MODELS: Dict[str, VfioModel] = {}  # PF directory (real path) -> model
_HOOK = threading.local()


def _read(path: str) -> str:
    try:
        with open(path) as handle:
            return handle.read().strip()
    except OSError:
        return ""


class _Siblings:
    """What the model last read of one PF's VFs: their directories, types and GPU instances.

    Read once and kept (the model reads them for every open of a VF's file, O(VFs) each:
    the 4 x 48-VF MIG sample took a minute), and dropped by :func:`_vfio_kernel` at
    anything that may change them: a directory created, removed, linked or renamed, a
    process started, the PF's ``virtfn`` links not the ones read, the model's own writes.
    A VF's file opened for writing by anyone else is read anew at every look until that
    thread opens anything next (its write done: ``open``, ``write``, ``close``, as
    vgpu.vfio and ``Path.write_text`` write), then kept again.
    """

    __slots__ = ("links", "vfs", "files")

    def __init__(self, links: List[str], pf_dir: str):
        self.links = links
        self.vfs = [os.path.realpath(os.path.join(pf_dir, n)) for n in links]
        self.files: Dict[tuple, str] = {}  # (VF directory, file name) -> its text


_SIBLINGS: Dict[str, _Siblings] = {}  # PF directory (real path) -> what its VFs held when read
_VOLATILE: set = set()  # VF files (VF directory, name) opened for writing, writers not done
# Audit events after which nothing read of the VFs is kept: the tree changed, or another
# process (which may change it unseen: sriov-manage, the boot step) started.
_CHANGES = frozenset({
    "os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
    "shutil.rmtree", "shutil.move", "shutil.copyfile", "shutil.copytree", "subprocess.Popen",
    "os.posix_spawn", "os.system", "os.fork", "os.forkpty", "os.exec", "os.spawn"})
_KEPT = ("current_vgpu_type", "gpu_instance_id")


def _siblings(pf_dir: str) -> _Siblings:
    links = [n for n in os.listdir(pf_dir) if n.startswith("virtfn")] if os.path.isdir(
        pf_dir) else []
    snap = _SIBLINGS.get(pf_dir)
    if snap is None or snap.links != links:
        snap = _SIBLINGS[pf_dir] = _Siblings(links, pf_dir)
    return snap


def _kept(snap: _Siblings, vf_dir: str, name: str) -> str:
    """VF file ``nvidia/<name>``'s text (stripped; "" unreadable), kept unless being written."""
    key = (vf_dir, name)
    if key in _VOLATILE:
        return _read(os.path.join(vf_dir, "nvidia", name))
    text = snap.files.get(key)
    if text is None:
        text = snap.files[key] = _read(os.path.join(vf_dir, "nvidia", name))
    return text


def _current_in(snap: _Siblings, vf_dir: str) -> int:
    try:
        return int(_kept(snap, vf_dir, "current_vgpu_type") or 0)
    except ValueError:
        return 0


def _instance(snap: _Siblings, vf_dir: str) -> str:
    return _kept(snap, vf_dir, "gpu_instance_id")


def _writers_done() -> None:
    """This thread opens something else: what it opened for writing is written."""
    done = getattr(_HOOK, "writing", None)
    if done:
        _VOLATILE.difference_update(done)
        _HOOK.writing = None


def _being_written(path: str, name: str) -> None:
    key = (os.path.realpath(os.path.dirname(os.path.dirname(path))), name)
    _VOLATILE.add(key)
    _HOOK.writing = (key,)
    for snap in _SIBLINGS.values():
        snap.files.pop(key, None)


def _vfio_kernel(event, args):
    """Audit hook: recompute creatable_vgpu_types (and refuse impossible types) on read."""
    if event in _CHANGES:
        _SIBLINGS.clear()
        return
    if event != "open" or not _MODELS:
        return
    _writers_done()
    path, mode, flags = args
    if isinstance(path, int):
        return
    path = os.fspath(path)
    if isinstance(path, bytes):
        return
    name = os.path.basename(path)
    if name not in ("creatable_vgpu_types",) + _KEPT:
        return
    writing = bool((mode and any(c in mode for c in "wax+")) or
                   (mode is None and flags & (os.O_WRONLY | os.O_RDWR)))
    if getattr(_HOOK, "busy", False):
        return  # the model's own reads and writes (it forgets what it writes)
    if name in _KEPT and writing:
        _being_written(path, name)
    if name == "gpu_instance_id" or (writing and name != "current_vgpu_type"):
        return
    _HOOK.busy = True
    try:
        _answer(path, name, writing)
    finally:
        _HOOK.busy = False


def _answer(path: str, name: str, writing: bool) -> None:
    """What the driver does at an open of a VF's creatable_vgpu_types or current_vgpu_type."""
    vf_dir = os.path.realpath(os.path.dirname(os.path.dirname(path)))
    pf_dir = os.path.realpath(os.path.join(vf_dir, "physfn"))
    model = _MODELS.get(pf_dir)
    if model is None or model.frozen:
        return
    model.vf_dirs[os.path.basename(vf_dir)] = vf_dir
    if writing:  # judged when read back, as the driver answers the write
        model.written.add(os.path.basename(vf_dir))
        return
    snap = _siblings(pf_dir)
    others = [_current_in(snap, d) for d in snap.vfs if d != vf_dir]
    own = _current_in(snap, vf_dir)
    nvidia = os.path.join(vf_dir, "nvidia")
    if name == "current_vgpu_type":
        _read_back(model, vf_dir, own, others)
        return
    rows = ["ID    : vGPU Name"] + [f"{n:<6}: {t}" for n, t in
                                     sorted(model.creatable(own, others,
                                                            os.path.basename(vf_dir)).items())]
    with open(os.path.join(nvidia, "creatable_vgpu_types"), "w") as handle:
        handle.write("\n".join(rows) + "\n")


def _read_back(model: VfioModel, vf_dir: str, own: int, others: List[int]) -> None:
    """A VF's type as the driver answers a write: kept, or 0 when impossible or refused."""
    nvidia = os.path.join(vf_dir, "nvidia")
    if model.mig is not None and _mig_write(model, vf_dir, own, nvidia):
        return
    vf = os.path.basename(vf_dir)
    written = vf in model.written
    model.written.discard(vf)
    if own and (own not in model.creatable(0, others, vf) or (written and (
            vf in model.refuse or (vf, own) in model.refuse))):
        with open(os.path.join(nvidia, "current_vgpu_type"), "w") as handle:
            handle.write("0\n")
        _SIBLINGS.clear()


def _mig_write(model: VfioModel, vf_dir: str, own: int, nvidia: str) -> bool:
    """A VF's type read back on a MIG-capable GPU: placed in a GPU instance, or refused.

    True when handled here: MIG mode on, or a MIG-backed type with MIG mode off.
    """
    mig = model.mig
    name = model.types.get(own, "")
    on = mig.enabled()
    if not on and not _mig(name):
        return False  # time-sliced on a GPU out of MIG mode: the plain model
    instance = os.path.join(nvidia, "gpu_instance_id")
    gi = None
    if own and on and _mig(name) and os.path.basename(vf_dir) not in model.refuse:
        gi = mig.place(os.path.realpath(os.path.join(vf_dir, "physfn")), vf_dir, own, name)
    if gi is None:
        if own:
            with open(os.path.join(nvidia, "current_vgpu_type"), "w") as handle:
                handle.write("0\n")
        if os.path.exists(instance):
            os.unlink(instance)
    else:
        with open(instance, "w") as handle:
            handle.write(f"{gi}\n")
    _SIBLINGS.clear()  # what it wrote is read anew
    return True


def _new_types(pf: Path, types: Mapping[int, str]) -> VfioModel:
    """A GPU's model with a new driver's type ids; what it knows of MIG stays."""
    model = VfioModel(types)
    before = _MODELS.get(os.path.realpath(pf))
    if before is not None:
        model.mig = before.mig
    return model


_PENDING: list = []  # ``create`` files written to, not yet turned into mdevs
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def _mdev_kernel(event, args):
    """Audit hook: a ``create`` opened for writing is settled at the next open (see the doc)."""
    if event != "open" or getattr(_HOOK, "busy", False):
        return
    if _PENDING:
        settle_mdevs()
    path, mode, flags = args
    if isinstance(path, int):
        return
    path = os.fspath(path)
    if isinstance(path, bytes) or os.path.basename(path) != "create" \
            or "mdev_supported_types" not in path:
        return
    if (mode and any(c in mode for c in "wax+")) or \
            (mode is None and flags & (os.O_WRONLY | os.O_RDWR)):
        _PENDING.append(path)


def settle_mdevs() -> None:
    """Turn every UUID written to a ``create`` file into a mediated device, as the kernel does."""
    _HOOK.busy = True
    try:
        while _PENDING:
            create = _PENDING.pop(0)
            try:
                with open(create) as handle:
                    uuid = handle.read().strip()
                with open(create, "w"):
                    pass
            except OSError:  # a tree already removed
                continue
            type_dir = os.path.realpath(os.path.dirname(create))
            parent = os.path.dirname(os.path.dirname(type_dir))
            if _UUID.match(uuid) and not os.path.exists(os.path.join(parent, uuid)):
                root = Path(type_dir[:type_dir.rindex("/sys/devices/")])
                _make_mdev(root, Path(parent), os.path.basename(type_dir), uuid)
    finally:
        _HOOK.busy = False


def _make_mdev(root: Path, parent_dir: Path, type_id: str, uuid: str) -> Path:
    directory = parent_dir / uuid
    directory.mkdir()
    (directory / "mdev_type").symlink_to(
        os.path.relpath(parent_dir / "mdev_supported_types" / type_id, directory))
    bus = root / "sys/bus/mdev/devices"
    bus.mkdir(parents=True, exist_ok=True)
    (bus / uuid).symlink_to(os.path.relpath(directory, bus))
    type_devices = parent_dir / "mdev_supported_types" / type_id / "devices"
    type_devices.mkdir(parents=True, exist_ok=True)  # the kernel lists each mdev of the type here
    (type_devices / uuid).symlink_to(os.path.relpath(directory, type_devices))
    if os.path.lexists(parent_dir / "physfn"):
        _settle_vf_counts((parent_dir / "physfn").resolve())
    return directory


def _held_mdevs(function: Path) -> List[str]:
    """The types of the mdevs created on one PCI function (their ``mdev_type`` links)."""
    return [os.path.basename(os.readlink(entry / "mdev_type")) for entry in function.iterdir()
            if _UUID.match(entry.name) and os.path.lexists(entry / "mdev_type")]


def _settle_vf_counts(pf: Path) -> None:
    """A GPU's VFs' ``available_instances`` as NVIDIA's driver shows them with mdevs on VFs.

    Each VF holds at most one vGPU: one holding it offers none. A time-sliced GPU
    holds vGPUs of one type only, at most ``max_instance`` of them: a free VF
    offers 1 of a type while the GPU has room for it beside what its VFs hold, else 0.
    """
    vfs = [(pf / name).resolve() for name in sorted(os.listdir(pf)) if name.startswith("virtfn")]
    held = [t for vf in vfs for t in _held_mdevs(vf)]
    for vf in vfs:
        mine = _held_mdevs(vf)
        for entry in sorted((vf / "mdev_supported_types").glob("*")):
            most = re.search(r"max_instance=(\d+)", (entry / "description").read_text())
            room = (not mine and all(t == entry.name for t in held)
                    and (most is None or len(held) < int(most.group(1))))
            (entry / "available_instances").write_text("1\n" if room else "0\n")


# -- drivers: bind, unbind, new_id and remove_id, as the kernel answers them ----------------

STUB = "pci-pf-stub"
_CONTROLS = ("bind", "unbind", "new_id", "remove_id")


def _driver_dir(root: Path, name: str) -> Path:
    """``sys/bus/pci/drivers/<name>`` with its control files (the driver's module loaded)."""
    directory = Path(root) / "sys/bus/pci/drivers" / name
    directory.mkdir(parents=True, exist_ok=True)
    for control in _CONTROLS:
        (directory / control).touch()
    if not getattr(sys, "_fake_driver_kernel", False):
        sys.addaudithook(_driver_kernel)
        sys._fake_driver_kernel = True
    return directory


def _driver_of(device: Path) -> Optional[str]:
    settle_pci_writes()  # a readlink raises no audit event
    try:
        return os.path.basename(os.readlink(device / "driver"))
    except OSError:
        return None


def _bind(device: Path, driver: Path) -> None:
    """The device's ``driver`` link, and the driver's link to the device (as sysfs lists it)."""
    device, driver = Path(os.path.realpath(device)), Path(os.path.realpath(driver))
    (device / "driver").symlink_to(os.path.relpath(driver, device))
    if not os.path.lexists(driver / device.name):
        (driver / device.name).symlink_to(os.path.relpath(device, driver))


def _unbind(device: Path) -> None:
    device = Path(os.path.realpath(device))
    link = device / "driver"
    if os.path.lexists(link):
        driver = Path(os.path.realpath(link))
        link.unlink()
        if os.path.lexists(driver / device.name):
            (driver / device.name).unlink()


def _ids(device: Path) -> str:
    """``10de 2335``: what new_id and remove_id take."""
    return " ".join((Path(device) / name).read_text().strip().removeprefix("0x")
                    for name in ("vendor", "device"))


def _stub_ids(root: Path, add: str = "", remove: str = "") -> List[str]:
    """pci-pf-stub's dynamic id table (kept beside the fake host: sysfs cannot show it)."""
    settle_pci_writes()  # new_id and remove_id written before this look
    path = Path(root).parent / f"{Path(root).name}.fake" / "pci-pf-stub-ids.json"
    ids = json.loads(path.read_text()) if path.exists() else []
    if add or remove:
        ids = [i for i in ids if i != remove] + ([add] if add and add not in ids else [])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(ids))
    return ids


_STORES: Dict[int, List[str]] = {}  # thread -> control files it opened for writing, in order
_WRITES = "pci-writes.log"  # beside the fake host: each write the stand-in kernel took, in order


def _driver_kernel(event, args):
    """Audit hook: each write to a PCI control file is acted on in order, as the kernel does.

    The kernel acts on a write as it is made, in the attribute's store callback:
    drivers/base/bus.c ``unbind_store`` (the device let go by that driver only),
    ``bind_store`` (refused while another driver has it, or while its
    driver_override names another driver: ``pci_match_device``) and
    ``drivers_probe_store`` (an unbound device probed: :func:`_probe`);
    drivers/pci/pci-driver.c ``new_id_store`` and ``remove_id_store`` (the driver's
    dynamic id table, kept here for pci-pf-stub only, beside the fake host: an id
    added also binds each unbound device it matches, ``driver_attach``; ENODEV in
    the kernel for an id not there: nothing here). ``driver_override`` needs nothing:
    drivers/pci/pci-sysfs.c ``driver_override_store`` only keeps the string, which
    the file here is (a newline clears it), read when the device is next probed.

    An audit hook on ``open`` cannot see the bytes: a control file opened for writing
    (``bind``, ``unbind``, ``new_id``, ``remove_id`` of a driver, ``drivers_probe``) is
    noted, and what it holds is acted on at that thread's next audited event (the next
    ``open`` of anything, the same file's included, a listing, a process started),
    once per write, in the order written, and the file emptied: before anything can
    read the tree through an ``open`` or a listing. (A bare ``readlink`` or ``stat``
    raises no audit event; a file opened and still empty then, as ``touch`` leaves it,
    was not written.) Each write taken is appended to ``<root>.fake/pci-writes.log``
    (:meth:`FakeHost.pci_writes`): the kernel's control files are write-only, so tests
    read what was written there.
    """
    if _STORES:
        settle_pci_writes()
    if event != "open" or isinstance(args[0], int):
        return
    path = os.fspath(args[0])
    if isinstance(path, bytes) or not _control(path):
        return
    mode, flags = args[1], args[2]
    if (mode and any(c in mode for c in "wax+")) or \
            (mode is None and flags & (os.O_WRONLY | os.O_RDWR)):
        _STORES.setdefault(threading.get_ident(), []).append(path)


def settle_pci_writes() -> None:
    """Act now on what this thread wrote to PCI control files (see :func:`_driver_kernel`).

    For a look that raises no audit event (``os.path.exists``, ``readlink``).
    """
    pending = _STORES.get(threading.get_ident())
    if not pending or getattr(_HOOK, "busy", False):
        return
    _HOOK.busy = True
    try:
        _store(pending)
    finally:
        _HOOK.busy = False


def _control(path: str) -> bool:
    """Whether ``path`` is a PCI control file the kernel acts on at a write."""
    name = os.path.basename(path)
    if name == "drivers_probe":
        return path.endswith("/sys/bus/pci/drivers_probe")
    return name in _CONTROLS and os.path.dirname(os.path.dirname(path)).endswith(
        "/sys/bus/pci/drivers")


def _store(pending: List[str]) -> None:
    """Act on each written control file in ``pending``, in order (see :func:`_driver_kernel`)."""
    _STORES.pop(threading.get_ident(), None)
    for path in pending:
        try:
            with open(path) as handle:
                value = handle.read().strip()
            if value:
                with open(path, "w"):
                    pass  # taken: the next write is read alone
        except OSError:  # a write the kernel refused (no such file, a directory): nothing
            continue
        if value:
            _act(path, value)


def _act(path: str, value: str) -> None:
    """One write to a control file, as its store callback takes it."""
    name = os.path.basename(path)
    root = Path(path[:path.rindex("/sys/bus/pci/")])
    drivers = root / "sys/bus/pci/drivers"
    record = root.parent / f"{root.name}.fake" / _WRITES
    record.parent.mkdir(parents=True, exist_ok=True)
    with open(record, "a") as log:
        log.write(json.dumps([os.path.relpath(path, root), value]) + "\n")
    if name == "drivers_probe":
        _probe(root, drivers, value)
        return
    driver = Path(os.path.dirname(path))
    device = root / "sys/bus/pci/devices" / value
    if name == "remove_id" and driver.name == STUB:
        _stub_ids(root, remove=value)
    elif name == "new_id" and driver.name == STUB:
        _stub_ids(root, add=value)
        for candidate in sorted((root / "sys/bus/pci/devices").iterdir()):
            if (_driver_of(candidate) is None and _override(candidate) in ("", driver.name)
                    and _ids(candidate) == value):
                _bind(candidate, driver)
    elif name == "unbind" and _driver_of(device) == driver.name:
        _unbind(device)
    elif (name == "bind" and os.path.exists(device) and _driver_of(device) is None
          and _override(device) in ("", driver.name)):
        _bind(device, driver)


def _override(device: Path) -> str:
    """The device's driver_override ("" when unset: "(null)", or cleared by a newline)."""
    try:
        text = (device / "driver_override").read_text().strip()
    except OSError:
        return ""
    return "" if text == "(null)" else text


def _probe(root: Path, drivers: Path, address: str) -> None:
    """``drivers_probe``: an unbound device goes to the driver its driver_override names.

    drivers/base/bus.c ``drivers_probe_store`` attaches a driver to the device named
    when it has none; drivers/pci/pci-driver.c (``pci_match_device``): with
    driver_override set, only that driver may probe the device, and only once its
    module is loaded (its directory under ``sys/bus/pci/drivers``); else the device
    stays unbound. Without one (unset, or cleared by writing a newline) the drivers'
    id tables decide: the nvidia driver's (``nv_pci_table``, nv-pci-table.c) takes
    every NVIDIA device of class 0x030000 (VGA) or 0x030200 (3D controller), once loaded.
    """
    device = root / "sys/bus/pci/devices" / address
    if not os.path.exists(device) or _driver_of(device) is not None:
        return
    override = _override(device)
    if override:
        if (drivers / override).is_dir():
            _bind(device, drivers / override)
    elif ((device / "vendor").read_text().strip() == NVIDIA
          and (device / "class").read_text().strip() in ("0x030000", "0x030200")
          and (drivers / "nvidia").is_dir()):
        _bind(device, drivers / "nvidia")


_HELD: set = set()  # unbindLock files of GPUs a client holds (see FakeHost.hold)


def _unbind_lock_kernel(event, args):
    """Audit hook: the nvidia driver's unbindLock reads 0 while a client holds the GPU.

    NVIDIA's procfs unbindLock (nv-procfs.c): writing 1 takes the lock only when
    the GPU's usage count is 0, and the file then reads back 1; else 0.
    """
    if event != "open" or not _HELD or isinstance(args[0], int):
        return
    path = os.fspath(args[0])
    if isinstance(path, bytes) or os.path.basename(path) != "unbindLock":
        return
    mode, flags = args[1], args[2]
    writing = (mode and any(c in mode for c in "wax+")) or \
        (mode is None and flags & (os.O_WRONLY | os.O_RDWR))
    if not writing and os.path.realpath(path) in _HELD:
        with open(os.path.realpath(path) + ".tmp", "w") as handle:
            handle.write("0\n")
        os.replace(os.path.realpath(path) + ".tmp", os.path.realpath(path))


def _install_kernel_model() -> None:
    if not getattr(sys, "_fake_vfio_kernel", False):
        sys.addaudithook(_vfio_kernel)
        sys._fake_vfio_kernel = True


def _vf_address(pf_address: str, index: int, first_function: int = 4, stride: int = 1) -> str:
    """VF ``index`` of a GPU: 0000:81:00.4, .5, .6, .7, then 0000:81:01.0 and on.

    As the kernel places VFs (``pci_iov_virtfn_bus``/``_devfn``, drivers/pci/iov.c): the
    PF's routing ID (bus, device, function) + the offset + ``index`` x the stride.
    """
    domain, bus, slot_function = pf_address.rsplit(":", 2)
    routing = (int(bus, 16) << 8 | int(slot_function[:2], 16) << 3 | int(slot_function[3:])) \
        + first_function + stride * index
    return f"{domain}:{routing >> 8:02x}:{(routing >> 3) & 0x1F:02x}.{routing & 7}"


class FakeHost:
    """Builds a host tree under ``root``; each add_* returns the device directory."""

    def __init__(self, root, write_defaults: bool = True):
        self.root = Path(root)
        self.devices = self.root / "sys/devices/pci0000:00"
        self.bus = self.root / "sys/bus/pci/devices"
        self.recipes = self.root.parent / f"{self.root.name}.fake" / "vfs.json"
        if not write_defaults:
            return
        self.bus.mkdir(parents=True, exist_ok=True)
        (self.root / "proc").mkdir(exist_ok=True)
        self.dpkg_status({})
        self.modules([])
        self.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro intel_iommu=on iommu=pt")

    # -- PCI ---------------------------------------------------------------
    def add_pci(self, address: str, vendor: str, device: str, class_code: str,
                driver: Optional[str] = None, bridge: str = "0000:00:01.0",
                mdev_types: Optional[Mapping[str, MdevType]] = None) -> Path:
        # Each PCI domain has its own root: sys/devices/pci0000:00, sys/devices/pci0001:00.
        directory = self.root / "sys/devices" / f"pci{bridge.rsplit(':', 2)[0]}:00" / bridge / address
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", class_code)):
            (directory / name).write_text(value + "\n")
        # Every PCI function has driver_override; unset, it reads "(null)" (the kernel's
        # driver_override_show prints the NULL pointer with %s: drivers/pci/pci-sysfs.c).
        if not (directory / "driver_override").exists():
            (directory / "driver_override").write_text("(null)\n")
        link = self.bus / address
        if not os.path.lexists(link):
            link.symlink_to(os.path.relpath(directory, self.bus))
        if driver:
            _bind(directory, _driver_dir(self.root, driver))
        if mdev_types:
            self._mdev_types(directory, mdev_types)
        return directory

    def add_gpu(self, address: str, device: str = "0x1db4", class_code: str = "0x030200",
                driver: Optional[str] = "nvidia", mdev_types: Optional[Mapping[str, MdevType]] = None,
                totalvfs: int = 0, bridge: Optional[str] = None) -> Path:
        directory = self.add_pci(address, NVIDIA, device, class_code, driver,
                                 bridge or f"{address[:-8]}:00:{address[-7:-5]}.0", mdev_types)
        if totalvfs:
            (directory / "sriov_totalvfs").write_text(f"{totalvfs}\n")
            (directory / "sriov_numvfs").write_text("0\n")
        return directory

    def vf_placement(self, pf_address: str, offset: int, stride: int = 1) -> None:
        """The SR-IOV capability's First VF Offset and VF Stride, as the kernel shows them.

        ``sriov_offset`` and ``sriov_stride`` (drivers/pci/iov.c, since Linux 4.17): VF N
        is at the PF's routing ID + offset + N x stride. A VF added later where they do
        not put it takes them away again (see :meth:`add_vf`).
        """
        pf = (self.bus / pf_address).resolve()
        (pf / "sriov_offset").write_text(f"{offset}\n")
        (pf / "sriov_stride").write_text(f"{stride}\n")

    def add_placed_vfs(self, pf_address: str, count: int, offset: int, stride: int = 1,
                       **vf) -> List[str]:
        """``count`` VFs where the kernel puts them for ``offset`` and ``stride`` (and says so).

        ``vf``: :meth:`add_vf`'s keywords for each. Returns their addresses, by index.
        """
        addresses = [_vf_address(pf_address, index, offset, stride) for index in range(count)]
        for index, address in enumerate(addresses):
            self.add_vf(pf_address, index, address, **vf)
        self.vf_placement(pf_address, offset, stride)
        return addresses

    def add_vf(self, pf_address: str, index: int, address: str, driver: Optional[str] = "nvidia",
               mdev_types: Optional[Mapping[str, MdevType]] = None,
               vfio_types: Optional[Mapping[int, str]] = None, current_type: int = 0,
               device: Optional[str] = None) -> Path:
        """VF ``index`` of ``pf_address``; each of its mdev types offers one instance (see above)."""
        pf = (self.bus / pf_address).resolve()
        device = device or (pf / "device").read_text().strip()
        if mdev_types:
            mdev_types = {k: t if t.available is not None else replace(t, available=1)
                          for k, t in mdev_types.items()}
        directory = self.add_pci(address, NVIDIA, device, (pf / "class").read_text().strip(),
                                 driver, pf.parent.name, mdev_types)
        (directory / "physfn").symlink_to(os.path.relpath(pf, directory))
        (pf / f"virtfn{index}").symlink_to(os.path.relpath(directory, pf))
        numvfs = len([n for n in os.listdir(pf) if n.startswith("virtfn")])
        (pf / "sriov_numvfs").write_text(f"{numvfs}\n")
        if (pf / "sriov_offset").exists() and address != _vf_address(
                pf.name, index, int((pf / "sriov_offset").read_text()),
                int((pf / "sriov_stride").read_text())):
            # A VF where the kernel would not put it: the tree is no kernel's, so it has
            # no offset and stride either (as before 4.17), and the charm reads the links.
            (pf / "sriov_offset").unlink()
            (pf / "sriov_stride").unlink()
        if vfio_types is not None:
            nvidia = directory / "nvidia"
            nvidia.mkdir(exist_ok=True)
            rows = ["ID    : vGPU Name"] + [f"{n:<6}: {name}" for n, name in sorted(vfio_types.items())]
            (nvidia / "creatable_vgpu_types").write_text("\n".join(rows) + "\n")
            (nvidia / "current_vgpu_type").write_text(f"{current_type}\n")
        return directory

    def add_sriov_gpu(self, address: str, device: str, vf_device: str, count: int,
                      mdev_types: Optional[Mapping[str, MdevType]] = None,
                      vfio_types: Optional[Mapping[int, str]] = None,
                      enabled: bool = True, totalvfs: Optional[int] = None,
                      first_function: int = 4, mig: Optional[Mapping[tuple, tuple]] = None,
                      gfx: bool = False) -> Path:
        """An SR-IOV GPU with ``count`` VFs (device id ``vf_device``) offering mdev or VFIO types.

        ``enabled=False``: the VFs are only recorded, for sriov-manage to create.
        ``first_function``: VF 0's function number (4: <bus>:00.4; the RTX PRO 6000's is 2).
        """
        directory = self.add_gpu(address, device=device, totalvfs=totalvfs or count)
        self.vf_placement(address, first_function)
        if vfio_types:
            _MODELS[os.path.realpath(directory)] = VfioModel(vfio_types, mig, gfx)
            _install_kernel_model()
        recipe = {"count": count, "device": vf_device,
                  "mdev": {k: [t.name, t.framebuffer_mb, t.max_instance]
                           for k, t in (mdev_types or {}).items()},
                  "vfio": {str(k): v for k, v in (vfio_types or {}).items()},
                  "first": first_function}
        recipes = self._recipes()  # kept either way: a reboot takes the VFs away again
        recipes[address] = recipe
        self.recipes.parent.mkdir(parents=True, exist_ok=True)
        self.recipes.write_text(json.dumps(recipes))
        if enabled:
            self._create_vfs(address, recipe)
        return directory

    def bind(self, address: str, driver: Optional[str]) -> None:
        """Bind ``address`` to ``driver`` (None: unbound), as the kernel links it."""
        directory = (self.bus / address).resolve()
        link = directory / "driver"
        if os.path.lexists(link):
            link.unlink()
        if driver:
            drivers = self.root / "sys/bus/pci/drivers" / driver
            drivers.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(drivers, directory))

    def pci_writes(self) -> List[tuple]:
        """Each write the stand-in kernel took to a PCI control file, in order: (file, value).

        ``file`` is relative to the root (``sys/bus/pci/drivers/nvidia/unbind``,
        ``sys/bus/pci/drivers_probe``): see :func:`_driver_kernel`.
        """
        path = self.root.parent / f"{self.root.name}.fake" / _WRITES
        try:
            return [tuple(json.loads(line)) for line in path.read_text().splitlines()]
        except FileNotFoundError:
            return []

    def unbind_lock(self, address: str, held: bool = False) -> Path:
        """The nvidia driver's /proc/driver/nvidia/gpus/<address>/unbindLock (0: not taken)."""
        lock = self.root / "proc/driver/nvidia/gpus" / address / "unbindLock"
        lock.parent.mkdir(parents=True, exist_ok=True)
        lock.write_text("0\n")
        if held:
            _HELD.add(os.path.realpath(lock))
            if not getattr(sys, "_fake_unbind_lock", False):
                sys.addaudithook(_unbind_lock_kernel)
                sys._fake_unbind_lock = True
        return lock

    def vfio_model(self, address: str) -> VfioModel:
        return _MODELS[os.path.realpath(self.bus / address)]

    def _recipes(self) -> dict:
        try:
            return json.loads(self.recipes.read_text())
        except FileNotFoundError:
            return {}

    def _create_vfs(self, address: str, recipe: dict) -> None:
        mdev = {k: MdevType(*v) for k, v in recipe["mdev"].items()} or None
        vfio = {int(k): v for k, v in recipe["vfio"].items()} or None
        for index in range(recipe["count"]):
            self.add_vf(address, index, _vf_address(address, index, recipe.get("first", 4)),
                        mdev_types=mdev,
                        vfio_types=vfio, device=recipe["device"])

    def enable_recorded_vfs(self, args: Sequence[str]) -> int:
        """What sriov-manage does: ``-e <address>`` or ``-e ALL`` creates the recorded VFs.

        ``-d <address>`` disables them: the GPU must be on nvidia, as for ``-e``
        (NVIDIA's script unbinds it, writes 0 to ``sriov_numvfs`` and binds it back).
        """
        if len(args) == 2 and args[0] == "-d":
            return self.disable_vfs(args[1])
        if len(args) != 2 or args[0] != "-e":
            print("usage: sriov-manage -e <address>|ALL", file=sys.stderr)
            return 2
        import fcntl
        import time

        recipes = self._recipes()
        wanted = sorted(recipes) if args[1] == "ALL" else [args[1]]
        with open(self.recipes.with_name("sriov-manage.lock"), "a") as inside:
            try:  # NVIDIA's script takes no lock of its own: a second run races the first
                fcntl.flock(inside, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._raced(wanted)
            for address in wanted:
                recipe = recipes.get(address)
                if recipe is None or os.path.exists(self.bus / address / "virtfn0"):
                    continue
                why = self._unbound(address)
                if why:
                    print(why, file=sys.stderr)
                    return 1
                if recipe.get("fails"):
                    print(f"Enabling VFs on {address} failed: Input/output error", file=sys.stderr)
                    return 1
                time.sleep(recipe.get("takes", 0))  # inside: the PF off nvidia, the stub's id set
                self._create_vfs(address, recipe)
                self._sriov_on_mig(address, recipe.get("wipes_mig", True))
        return 0

    def disable_vfs(self, address: str) -> int:
        """``sriov-manage -d <address>``: the GPU's VFs gone, the GPU back on nvidia."""
        why = self._unbound(address)
        if why:
            print(why.replace("enable", "disable").replace("Enabling", "Disabling"),
                  file=sys.stderr)
            return 1
        if self._recipes().get(address, {}).get("fails"):
            print(f"Disabling VFs on {address} failed: Input/output error", file=sys.stderr)
            self.left_on_stub(address)
            return 1
        self.remove_vfs(address)
        return 0

    def remove_vfs(self, address: str) -> None:
        """What sriov_numvfs=0 does: each VF unbound, its bus and mdev links and directory gone."""
        pf = (self.bus / address).resolve()
        for name in sorted(os.listdir(pf)):
            if name.startswith("virtfn"):
                vf = (pf / name).resolve()
                _unbind(vf)
                for link in (self.bus / vf.name, self.root / "sys/class/mdev_bus" / vf.name):
                    if os.path.lexists(link):
                        link.unlink()
                shutil.rmtree(vf)
                (pf / name).unlink()
        (pf / "sriov_numvfs").write_text("0\n")

    def _raced(self, wanted: Sequence[str]) -> int:
        """A run started while another is inside: its GPU is left on pci-pf-stub, its id registered.

        NVIDIA's sriov-manage unbinds the PF from nvidia, writes its ``vendor device`` to
        pci-pf-stub's ``new_id`` (a table shared by every run), binds the stub, writes
        ``sriov_numvfs``, unbinds, writes ``remove_id`` and binds nvidia again. Two runs at
        once race on that table and the unbind; a run that fails part way leaves its GPU
        unbound, and every later run fails until it is bound to nvidia again (StackHPC,
        stackhpc/ansible-collection-linux ``roles/vgpu/templates/nvidia-sriov.service.j2``:
        each GPU's unit ordered after the previous one, the address written to
        ``/sys/bus/pci/drivers/nvidia/bind`` before every run).
        """
        for address in wanted:
            pf = self.bus / address
            if not os.path.exists(pf / "virtfn0") and _driver_of(pf) == "nvidia":
                _unbind(pf.resolve())
                stub = _driver_dir(self.root, STUB)
                _bind(pf.resolve(), stub)
                _stub_ids(self.root, add=_ids(pf))
            print(f"Enabling VFs on {address} failed: echo: write error: Device or resource busy "
                  "(another sriov-manage is running)", file=sys.stderr)
        return 1

    def _unbound(self, address: str) -> str:
        """Why sriov-manage -e fails on a GPU it cannot take: '' when it can."""
        pf = self.bus / address
        driver = _driver_of(pf)
        if driver != "nvidia":
            return (f"Cannot enable VFs on {address}: it is not bound to the nvidia driver "
                    f"({driver or 'no driver'})")
        if _ids(pf) in _stub_ids(self.root):  # its VFs would be claimed by the stub too
            return f"Enabling VFs on {address} failed: its VFs were claimed by pci-pf-stub"
        return ""

    def sriov_manage_takes(self, seconds: float, address: str = "") -> None:
        """Each stand-in sriov-manage -e run stays inside this long (every GPU's, or one's)."""
        recipes = self._recipes()
        for gpu, recipe in recipes.items():
            if not address or gpu == address:
                recipe["takes"] = seconds
        self.recipes.write_text(json.dumps(recipes))

    def left_on_stub(self, address: str) -> None:
        """What a failed sriov-manage run leaves: the GPU on pci-pf-stub, its id in the stub's table."""
        pf = self.bus / address
        _unbind(pf.resolve())
        _bind(pf.resolve(), _driver_dir(self.root, STUB))
        _stub_ids(self.root, add=_ids(pf))

    def _sriov_on_mig(self, address: str, wipes: bool) -> None:
        """What ``sriov-manage -e`` does to a MIG-capable GPU: persistence mode on, MIG state.

        It unbinds and rebinds the GPU from the nvidia driver and turns persistence mode
        on. Whether that wipes MIG mode and GPU instances, sources differ: Harvester's
        MIG-backed vGPU design note (harvester/harvester, enhancements/20250908-mig-vgpu-
        support.md: disabling the SR-IOV GPU "wipes all MIG information") and StackHPC's
        vgpu role (enabling SR-IOV "wipes out any mig configuration") say it does; no
        source shows it kept. ``wipes`` (a GPU's recipe, see :meth:`sriov_keeps_mig`)
        models either.
        """
        if not self.smi_state.exists():
            return

        def change(gpu: dict) -> None:
            gpu["persistence"] = True
            if wipes:
                gpu.update(current="Disabled", pending="Disabled", gis=[], hold=False)

        self._smi_update(address, change)

    def sriov_keeps_mig(self, address: str) -> None:
        """The stand-in sriov-manage -e leaves this GPU's MIG mode and GPU instances as they are."""
        recipes = self._recipes()
        recipes[address]["wipes_mig"] = False
        self.recipes.write_text(json.dumps(recipes))

    def fail_sriov_manage(self, address: str) -> None:
        """Make the stand-in sriov-manage fail for this GPU (its VFs stay missing)."""
        recipes = self._recipes()
        recipes[address]["fails"] = True
        self.recipes.write_text(json.dumps(recipes))

    def install_nvidia_smi(self, modes: Mapping[str, str], table: str = "") -> Path:
        """The stand-in /usr/bin/nvidia-smi; ``modes``: each MIG-capable GPU's mode.

        A mode is ``Enabled``, ``Disabled``, or ``reset`` (disabled, and ``-mig 1``
        leaves it pending until a reset, as on Ampere when the driver could not reset
        the GPU itself) or ``busy`` (disabled, another client uses the GPU: ``-mig 1``
        leaves it pending until that client stops and ``-mig 1`` runs again).
        ``table``: the GPU model's GPU instance profiles (a key of faketools.MIG_TABLES);
        at a reboot every GPU loses its MIG mode (Hopper, Blackwell with the vGPU host
        driver: NVIDIA/gpu-admin-tools issue 2, cozystack/ansible-cozystack PR 70) unless
        ``set_mig(address, reboot="keeps")`` (Ampere: MIG user guide, "Enable MIG Mode").
        """
        from unit_tests.faketools import nvidia_smi

        state = self.smi_state
        state.parent.mkdir(parents=True, exist_ok=True)
        state.write_text(json.dumps({a: {"current": "Disabled" if m in ("reset", "busy") else m,
                                         "pending": "Disabled" if m in ("reset", "busy") else m,
                                         "hold": m == "reset", "busy": m == "busy",
                                         "persistence": False, "reboot": "loses",
                                         "table": table, "gis": []}
                                     for a, m in modes.items()}))
        for address in modes:
            model = _MODELS.get(os.path.realpath(self.bus / address))
            if model is not None and model.mig is not None:
                model.mig.state, model.mig.address = state, address
        path = self.root / "usr/bin/nvidia-smi"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(nvidia_smi(state, self.bus))
        path.chmod(0o755)
        return path

    def nvml_state(self, driver: str = "580.105.06") -> dict:
        """What NVML says of this host's GPUs and their vGPU types (unit_tests/fake_pynvml).

        Each MIG-backed type's ``nvmlVgpuTypeGetGpuInstanceProfileId`` is the id of the
        GPU instance profile the kernel model puts it on (:meth:`MigModel.instance_profile`),
        as the stand-in nvidia-smi's ``-lgip`` numbers it (faketools.MIG_TABLES).
        """
        from unit_tests.faketools import MIG_TABLES

        state = json.loads(self.smi_state.read_text()) if self.smi_state.exists() else {}
        gpus = []
        for address in sorted(os.listdir(self.bus)):
            model = _MODELS.get(os.path.realpath(self.bus / address))
            if model is None:
                continue
            ids = {row[0]: row[1] for row in MIG_TABLES.get(state.get(address, {}).get("table"), [])}
            types, names = [], {}
            for number, name in sorted(model.types.items()):
                entry = {"id": number, "name": name}
                profile = model.mig.instance_profile(name) if model.mig and _mig(name) else None
                if profile in ids:
                    entry["gi_profile"] = ids[profile]
                    names[str(ids[profile])] = f"MIG {profile}"
                types.append(entry)
            domain, rest = address.split(":", 1)
            gpus.append({"bus_id": f"{int(domain, 16):08X}:{rest.upper()}", "vgpus": [],
                         "vgpu_types": types, "gi_profiles": names})
        return {"driver": driver, "gpus": gpus}

    @property
    def smi_state(self) -> Path:
        """The stand-in nvidia-smi's state: MIG modes and GPU instances, per GPU."""
        return self.recipes.parent / "nvidia-smi.json"

    def set_mig(self, address: str, **values) -> None:
        """Change what the stand-in nvidia-smi holds for a GPU (current, pending, busy, gis...)."""
        self._smi_update(address, lambda gpu: gpu.update(values))

    def _smi_update(self, address: str, change) -> None:
        """Change one GPU's stand-in nvidia-smi state as the stand-in does: locked, replaced whole."""
        import fcntl

        with open(f"{self.smi_state}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            state = json.loads(self.smi_state.read_text())
            if address in state:
                change(state[address])
            fresh = self.smi_state.with_name(self.smi_state.name + ".new")
            fresh.write_text(json.dumps(state))
            os.replace(fresh, self.smi_state)

    def gpu_instances(self, address: str) -> List[str]:
        """The GPU instances nvidia-smi holds for a GPU: ``["1:1g.24gb+gfx@0", ...]``."""
        return [f"{g['id']}:{g['profile']}@{g['start']}"
                for g in sorted(self.mig_mode(address).get("gis", []), key=lambda g: g["id"])]

    def mig_mode(self, address: str) -> dict:
        """What the stand-in nvidia-smi holds for a GPU: current, pending, its GPU instances."""
        return json.loads(self.smi_state.read_text())[address]

    def install_sriov_manage(self) -> Path:
        """The stand-in /usr/lib/nvidia/sriov-manage (after the driver package put its own)."""
        repo = Path(__file__).resolve().parents[1]
        path = self.root / "usr/lib/nvidia/sriov-manage"
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            path.unlink()
        path.write_text(
            f"#!{sys.executable}\n"
            "import os, sys\n"
            f"sys.path.insert(0, {str(repo)!r})\n"
            "from unit_tests.fakehost import FakeHost\n"
            "log = os.environ.get('FAKE_LOG')\n"
            "if log:\n"
            "    with open(log, 'a') as handle:\n"
            "        handle.write('sriov-manage ' + ' '.join(sys.argv[1:]) + '\\n')\n"
            f"sys.exit(FakeHost({str(self.root)!r}, write_defaults=False)"
            ".enable_recorded_vfs(sys.argv[1:]))\n")
        path.chmod(0o755)
        return path

    def add_mdev(self, parent: str, type_id: str, uuid: str) -> Path:
        """A created mediated device: under its parent, linked from sys/bus/mdev/devices."""
        return _make_mdev(self.root, (self.bus / parent).resolve(), type_id, uuid)

    def _remove_mdevs(self) -> None:
        """Every mdev gone, with its bus link and its entry in its type's ``devices/``."""
        bus = self.root / "sys/bus/mdev/devices"
        for link in sorted(bus.iterdir()) if bus.exists() else ():
            listed = (link / "mdev_type").resolve() / "devices" / link.name
            if os.path.lexists(listed):
                listed.unlink()
            shutil.rmtree(link.resolve())
            link.unlink()

    def reboot(self, driver: Optional[str] = None,
               vfio_types: Optional[Mapping[str, Mapping[int, str]]] = None) -> None:
        """What a reboot takes away: every mdev, every VF (and its type), the running domains.

        The VFs are recorded for sriov-manage to create again; ``driver``: the
        version loaded after the reboot; ``vfio_types``: per GPU address, the
        new driver's VFIO types (ids that differ between branches).
        """
        settle_mdevs()
        self._remove_mdevs()
        recipes = self._recipes()
        for address, recipe in recipes.items():
            self.remove_vfs(address)
            pf = (self.bus / address).resolve()
            if vfio_types and address in vfio_types:
                recipe["vfio"] = {str(k): v for k, v in vfio_types[address].items()}
                _MODELS[os.path.realpath(pf)] = _new_types(pf, vfio_types[address])
        if recipes:
            self.recipes.write_text(json.dumps(recipes))
        shutil.rmtree(self.root / "run/libvirt/qemu", ignore_errors=True)
        # /run is a tmpfs, empty at every boot: the host lock and what the boot step left there.
        shutil.rmtree(self.root / "run/nova-compute-nvidia-vgpu", ignore_errors=True)
        self._reboot_mig()
        if driver:
            self.loaded_driver(driver)

    def _reboot_mig(self) -> None:
        """What a reboot does to MIG: every GPU instance gone; the mode lost or kept.

        GPU instances never survive a reboot (NVIDIA/k8s-device-plugin issue 225). With the
        vGPU host driver, Hopper and Blackwell lose MIG mode too ("On H100 the MIG enablement
        is controlled by driver and it's all gone by the time ... GPU resets",
        NVIDIA/gpu-admin-tools issue 2; cozystack/ansible-cozystack PR 70: "On Hopper and
        later MIG mode goes too"); Ampere keeps it, a pending change put in force (MIG user
        guide, "Enable MIG Mode"; an InfoROM bit, NVIDIA/gpu-operator PR 2603). A GPU's
        ``reboot`` (``loses``, ``keeps``) says which. Persistence mode is off again.
        """
        if not self.smi_state.exists():
            return
        state = json.loads(self.smi_state.read_text())
        for gpu in state.values():
            gpu["gis"] = []
            if gpu.get("reboot", "loses") == "keeps":
                gpu["current"] = gpu["pending"]
            else:
                gpu["current"] = gpu["pending"] = "Disabled"
            gpu["hold"] = gpu["busy"] = gpu["persistence"] = False
        self.smi_state.write_text(json.dumps(state))

    def _mdev_types(self, directory: Path, types: Mapping[str, MdevType]) -> None:
        if not getattr(sys, "_fake_mdev_kernel", False):
            sys.addaudithook(_mdev_kernel)
            sys._fake_mdev_kernel = True
        base = directory / "mdev_supported_types"
        for type_id, spec in types.items():
            entry = base / type_id
            (entry / "devices").mkdir(parents=True, exist_ok=True)
            (entry / "name").write_text(spec.name + "\n")
            (entry / "description").write_text(spec.description() + "\n")
            available = spec.max_instance if spec.available is None else spec.available
            (entry / "available_instances").write_text(f"{available}\n")
            (entry / "device_api").write_text("vfio-pci\n")
            (entry / "create").write_text("")
        mdev_bus = self.root / "sys/class/mdev_bus"
        mdev_bus.mkdir(parents=True, exist_ok=True)
        link = mdev_bus / directory.name
        if not os.path.lexists(link):
            link.symlink_to(os.path.relpath(directory, mdev_bus))

    def proc_pci_devices(self) -> Path:
        """``/proc/bus/pci/devices`` as the kernel writes it for the functions sysfs has now.

        ``drivers/pci/proc.c``, ``show_device``: per function ``%02x%02x`` (bus number,
        devfn), a tab, ``%04x%04x`` (vendor, device), a tab, the IRQ in hex, then seven
        BARs' start and seven sizes as tab-separated ``%16llx``, and the bound driver's
        name after a tab. No PCI domain: two domains' functions at one bus, slot and
        function give two lines with the same first field. Written once, when asked:
        like the kernel's, it says what was there when it was read.
        """
        lines = []
        for name in sorted(os.listdir(self.bus)):
            device = self.bus / name
            _, bus, slot_function = name.split(":")
            slot, function = slot_function.split(".")
            devfn = int(slot, 16) << 3 | int(function)
            vendor = (device / "vendor").read_text().strip().removeprefix("0x")
            ident = (device / "device").read_text().strip().removeprefix("0x")
            bars = "\t".join(f"{0:16x}" for _ in range(14))
            driver = _driver_of(device)
            lines.append(f"{bus}{devfn:02x}\t{vendor}{ident}\t0\t{bars}"
                         + (f"\t{driver}" if driver else "\t") + "\n")
        path = self.root / "proc/bus/pci/devices"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(lines))
        return path

    # -- everything else the charm reads ------------------------------------
    def pci_ids(self, text: str = PCI_IDS) -> None:
        path = self.root / "usr/share/misc/pci.ids"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def udev_data(self, address: str, model: str) -> Path:
        """udev's database entry of a PCI function, with the name hwdb gave it.

        systemd writes ``/run/udev/data/+pci:<address>`` (``device_get_device_id``
        in src/libsystemd/sd-device/sd-device.c: ``+<subsystem>:<sysname>``), one
        ``E:<key>=<value>`` line per property (``device_update_db`` in
        device-private.c); hwdb's pci builtin sets ``ID_MODEL_FROM_DATABASE`` from
        its copy of the PCI ID database, which lspci shows too.
        """
        path = self.root / f"run/udev/data/+pci:{address}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("I:5893021\nE:ID_PCI_CLASS_FROM_DATABASE=Display controller\n"
                        "E:ID_PCI_SUBCLASS_FROM_DATABASE=3D controller\n"
                        "E:ID_VENDOR_FROM_DATABASE=NVIDIA Corporation\n"
                        f"E:ID_MODEL_FROM_DATABASE={model}\nV:1\n")
        return path

    def driver_information(self, address: str, model: str) -> Path:
        """The NVIDIA driver's ``/proc/driver/nvidia/gpus/<address>/information``.

        Lines as nv_procfs_read_gpu_info writes them (NVIDIA/open-gpu-kernel-modules,
        kernel-open/nvidia/nv-procfs.c): ``Model:``, two tabs and a space, the name
        the driver knows the board by (``rm_get_device_name``); then IRQ, GPU UUID,
        Video BIOS, ... each ``<key>: <tab> <value>``.
        """
        path = self.root / f"proc/driver/nvidia/gpus/{address}/information"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"Model: \t\t {model}\nIRQ:   \t\t 185\n"
                        "GPU UUID: \t GPU-4a2b7c1e-0d3f-4e59-8a61-9c0b2f7d3e18\n"
                        "Video BIOS: \t 96.00.a5.00.01\nBus Type: \t PCIe\nDMA Size: \t 52 bits\n"
                        f"DMA Mask: \t 0xfffffffffffff\nBus Location: \t {address}\n"
                        "Device Minor: \t 0\nGPU Firmware: \t 580.105.06\nGPU Excluded:\t No\n")
        return path

    def juju_unit(self, unit: str, metadata: str) -> Path:
        """A unit's agent directory, as Juju keeps one per unit on the machine, with its charm.

        ``/var/lib/juju/agents/unit-<app>-<n>/charm`` holds the unpacked charm
        (its ``metadata.yaml`` among it): a ``ps`` on a MySQL machine shows
        ``/var/lib/juju/agents/unit-mysql-1/charm``, and charms' integration tests
        read their files there. Only ``charm/metadata.yaml`` is written here.
        """
        path = self.root / f"var/lib/juju/agents/unit-{unit.replace('/', '-')}/charm/metadata.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(metadata)
        return path

    def dpkg_status(self, packages: Mapping[str, str], arch: str = "amd64",
                    states: Optional[Mapping[str, str]] = None) -> None:
        """Write dpkg's status file: ``{name: version}``, all installed unless ``states`` says."""
        admin = self.root / "var/lib/dpkg"
        for sub in ("info", "updates"):
            (admin / sub).mkdir(parents=True, exist_ok=True)
        stanzas = []
        for name, version in sorted(packages.items()):
            state = (states or {}).get(name, "installed")
            stanzas.append(f"Package: {name}\nStatus: install ok {state}\nPriority: optional\n"
                           f"Section: net\nMaintainer: Ubuntu Developers\nArchitecture: {arch}\n"
                           f"Version: {version}\nDescription: {name}\n long description\n")
        (admin / "status").write_text("\n".join(stanzas))
        (admin / "available").touch()

    def nova(self, version: str) -> None:
        """Install nova-common at ``version`` (e.g. ``3:29.0.0-0ubuntu1``) among other packages.

        nova-common ships /etc/nova/nova.conf and nova-compute renders its own
        there: a host with Nova has one (without a ``[pci]`` of the principal's).
        """
        self.dpkg_status({"adduser": "3.137ubuntu1", "nova-common": version,
                          "nova-compute": version, "python3-nova": version,
                          "zlib1g": "1:1.3.dfsg-3.1ubuntu2"})
        if not (self.root / "etc/nova/nova.conf").exists():
            self.principal_nova_conf()

    def principal_nova_conf(self, whitelist: Optional[str] = None, aliases: Sequence[str] = (),
                            subordinate: str = "", libvirt: str = "") -> Path:
        """nova-compute's /etc/nova/nova.conf, its own ``[pci]`` from ``whitelist`` and ``aliases``.

        ``subordinate``: the subordinates' sections as nova-compute renders them
        (``principal.render_nova_conf``), where its template puts them. ``libvirt``:
        lines its ``[libvirt]`` adds (:data:`LIVE_MIGRATION_ON`: ``enable-live-migration``).
        """
        path = self.root / "etc/nova/nova.conf"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(render_principal_nova_conf(whitelist, aliases, subordinate, libvirt))
        return path

    def modules(self, names: Iterable[str]) -> None:
        rows = [f"{n} 65536 0 - Live 0x0000000000000000" for n in names]
        (self.root / "proc/modules").write_text("".join(r + "\n" for r in rows))

    def loaded_driver(self, version: str) -> None:
        """The loaded ``nvidia`` module's version, as /sys/module/nvidia/version shows it."""
        path = self.root / "sys/module/nvidia/version"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(version + "\n")

    def iommu_groups(self, count: int) -> None:
        """IOMMU groups as the kernel makes them when VT-d / AMD-Vi is on."""
        for n in range(count):
            (self.root / f"sys/kernel/iommu_groups/{n}/devices").mkdir(parents=True, exist_ok=True)

    def cmdline(self, text: str) -> None:
        (self.root / "proc/cmdline").write_text(text + "\n")


# What charm-nova-compute's [libvirt] adds with enable-live-migration (templates/yoga/nova.conf,
# hooks/nova_compute_context.py; its option defaults: completion timeout 800, downtime 500,
# steps 10, delay 75), with live-migration-permit-post-copy=true when ``post_copy``.
def live_migration_lines(post_copy: bool = False) -> str:
    """``[libvirt]`` lines charm-nova-compute renders with ``enable-live-migration``."""
    lines = ("live_migration_scheme = ssh\nlive_migration_inbound_addr = 10.5.0.21\n"
             "live_migration_completion_timeout = 800\nlive_migration_downtime = 500\n"
             "live_migration_downtime_steps = 10\nlive_migration_downtime_delay = 75\n")
    if post_copy:
        lines += "live_migration_permit_post_copy = True\nlive_migration_timeout_action = force_complete\n"
    return lines


def render_principal_nova_conf(whitelist: Optional[str] = None, aliases: Sequence[str] = (),
                               subordinate: str = "", libvirt: str = "") -> str:
    """nova.conf as charm-nova-compute renders it for a libvirt compute host (yoga onwards).

    From charm-nova-compute's ``templates/yoga/nova.conf``: ``[DEFAULT]``, then
    its ``[pci]`` with ``passthrough_whitelist = <pci-passthrough-whitelist>``
    (the option's text as typed, possibly a JSON list) and one ``alias = ...``
    per ``pci-alias`` entry (``json.dumps(alias, sort_keys=True)``,
    ``hooks/nova_compute_context.py``), then the other sections; the
    subordinates' sections come after ``[workarounds]``
    (``templates/parts/section-ephemeral``).
    """
    pci = "".join([f"passthrough_whitelist = {whitelist}\n" if whitelist else "",
                   *(f"alias = {alias}\n" for alias in aliases)])
    return f"""# yoga
###############################################################################
# [ WARNING ]
# Configuration file maintained by Juju. Local changes may be overwritten.
# restart trigger: 9f6c2a34-6f1e-4a39-9c8e-1d7c2b4e5a10
###############################################################################
[DEFAULT]
verbose=False
debug=False
dhcpbridge_flagfile=/etc/nova/nova.conf
dhcpbridge=/usr/bin/nova-dhcpbridge
logdir=/var/log/nova
state_path=/var/lib/nova
force_dhcp_release=True
use_syslog = False
ec2_private_dns_show_ip=True
enabled_apis=osapi_compute,metadata
my_ip = 10.5.0.21
force_raw_images = True

transport_url = rabbit://nova:secret@10.5.0.11:5672/openstack

network_api_class = nova.network.neutronv2.api.API
use_neutron = True
reserved_host_memory_mb = 512
reserved_host_disk_mb = 0

metadata_workers = 4

[pci]
{pci}
[neutron]
url = http://10.5.0.14:9696
region_name = RegionOne
auth_url = http://10.5.0.12:35357
auth_type = password
project_domain_name = service_domain
user_domain_name = service_domain
project_name = services
username = nova
password = secret

[api]
auth_strategy=keystone

[libvirt]
rbd_user = nova-compute
rbd_secret_uuid = 0cd8b3c4-2a5e-4f4b-9d7a-3c1d2b0e6f21
live_migration_uri = qemu+ssh://%s/system
cpu_mode = host-passthrough
{libvirt}
[oslo_concurrency]
lock_path=/var/lock/nova

[workarounds]
disable_libvirt_livesnapshot = False

{subordinate}
[placement]
auth_url = http://10.5.0.12:35357
auth_type = password
project_domain_name = service_domain
user_domain_name = service_domain
project_name = services
username = nova
password = secret
os_region_name = RegionOne
region_name = RegionOne

[vnc]
enabled = False

[wsgi]
api_paste_config=/etc/nova/api-paste.ini
"""


def v100_host(root, count: int = 2, nova: str = "3:29.0.0-0ubuntu1") -> FakeHost:
    """Tesla V100 GPUs on the mdev framework, an Intel GVT-g GPU and a NIC."""
    host = FakeHost(root)
    host.pci_ids()
    if not 1 <= count <= 8:
        raise ValueError(f"v100_host makes 1 to 8 GPUs, not {count}")
    for n in range(count):  # buses c1, e1, then 01, 21 ... a1: below 0x100
        host.add_gpu(f"0000:{(0xc1 + n * 0x20) % 0x100:02x}:00.0", device="0x1db4",
                     class_code="0x030200", mdev_types=V100_TYPES)
    host.add_pci("0000:00:02.0", INTEL, "0x3e92", "0x030000", driver="i915",
                 mdev_types={"i915-GVTg_V5_4": MdevType("GVTg_V5_4", 512, 4)})
    host.add_pci("0000:3b:00.0", MELLANOX, "0x101d", "0x020000", driver="mlx5_core")
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia", "mdev", "vfio"])
    host.loaded_driver("570.158.02")
    return host


def a100_host(root, nova: str = "3:29.0.0-0ubuntu1", gpus: int = 1, vfs: int = 16,
              enabled: bool = True) -> FakeHost:
    """SR-IOV A100 PCIe 40GB GPUs on an mdev-based driver: types are offered by their VFs.

    ``enabled=False`` is the host after a reboot: no VFs until sriov-manage runs.
    """
    host = FakeHost(root)
    host.pci_ids()
    for n in range(gpus):
        host.add_sriov_gpu(f"0000:{0x41 + n * 0x20:02x}:00.0", device="0x20f1", vf_device="0x20f1",
                           count=vfs, mdev_types=A100_TYPES, enabled=enabled)
    host.iommu_groups(4)
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    return host


def l40s_host(root, nova: str = "3:31.0.0-0ubuntu1", enabled: bool = True,
              branch: str = "570") -> FakeHost:
    """An L40S and an H200 SXM on NVIDIA's vendor-specific VFIO framework (no mdev at all).

    Their VFs carry their GPU's device id (0x26b9, 0x2335), as on real hosts (see
    rtx_pro_6000_host); Nova 2025.1 epoxy. ``branch``: the driver branch (L40S_BRANCHES),
    whose L40S type ids and version the host has.
    """
    l40s_types, version = L40S_BRANCHES[branch]
    host = FakeHost(root)
    host.pci_ids()
    # 16 of the L40S's 32 VFs and 8 of the H200's 16 keep the trees small (sysfs-sized
    # trees cost about a millisecond per file); every rule still shows.
    host.add_sriov_gpu("0000:81:00.0", device="0x26b9", vf_device="0x26b9", count=16,
                       vfio_types=l40s_types, enabled=enabled, totalvfs=32)
    host.add_sriov_gpu("0000:c1:00.0", device="0x2335", vf_device="0x2335", count=8,
                       vfio_types=H200_TYPES, enabled=enabled, totalvfs=16)
    host.iommu_groups(8)
    host.nova(nova)
    host.principal_nova_conf()
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    host.loaded_driver(version)
    return host


def whole_and_vgpu_host(root, nova: str = "3:31.0.0-0ubuntu1", moved: bool = True) -> FakeHost:
    """l40s_host with its H200 given whole to guests: no VFs, and (``moved``) on vfio-pci.

    ``moved``: bound to vfio-pci with driver_override set, as the charm leaves it
    (drivers/pci/pci-driver.c: a set driver_override lets only that driver probe
    it); else still on nvidia after a boot, with no VFs, as before the charm took it.
    """
    host = FakeHost(root)
    host.pci_ids()
    l40s_types, version = L40S_BRANCHES["570"]
    host.add_sriov_gpu("0000:81:00.0", device="0x26b9", vf_device="0x26b9", count=16,
                       vfio_types=l40s_types, totalvfs=32)
    host.add_sriov_gpu("0000:c1:00.0", device="0x2335", vf_device="0x2335", count=8,
                       vfio_types=H200_TYPES, enabled=False, totalvfs=16)
    if moved:
        host.bind("0000:c1:00.0", "vfio-pci")
        (host.bus / "0000:c1:00.0" / "driver_override").write_text("vfio-pci\n")
    host.iommu_groups(8)
    host.nova(nova)
    host.principal_nova_conf()
    host.modules(["nvidia_vgpu_vfio", "nvidia", "vfio_pci"])
    host.loaded_driver(version)
    return host


def rtx_pro_6000_host(root, nova: str = "3:31.0.0-0ubuntu1", enabled: bool = True,
                      vfs: int = 48, gpus: int = 4, mig: Optional[str] = None) -> FakeHost:
    """Four RTX PRO 6000 Blackwell Server Editions in PCI domains 0000 and 0001 (VFIO).

    From bigstack-oss/cubecos issue 312: the GPUs at 0000:42:00.0, 0000:8c:00.0,
    0001:04:00.0 and 0001:c8:00.0 ("Enabling VFs on ..."), device 10de:2bb5, class 0302
    (lspci: "3D controller [0302]"); every VF also reads 10de:2bb5 ("set device 10de:2bb5
    at 0000:42:00.2"); VF 0 at function .2 ("virtfn0 -> ../0001:04:00.2", virtfn14 at
    04:02.0); 48 VFs per GPU; nvidia-smi names the GPUs 00000000:42:00.0 and
    00000001:C8:00.0; driver 580.105.06. Types: RTX_PRO_6000_TYPES (ids inferred).
    ``vfs``/``gpus`` shrink the tree for tests that need fewer. ``mig``: the MIG-backed
    form (RTX_PRO_6000_MIG_TYPES, a stand-in nvidia-smi), every GPU's MIG mode that
    (``Enabled``, ``Disabled``, ``reset``, ``busy``: see :meth:`FakeHost.install_nvidia_smi`).
    """
    host = FakeHost(root)
    host.pci_ids()
    addresses = ("0000:42:00.0", "0000:8c:00.0", "0001:04:00.0", "0001:c8:00.0")[:gpus]
    for address in addresses:
        host.add_sriov_gpu(address, device="0x2bb5", vf_device="0x2bb5", count=vfs,
                           vfio_types=RTX_PRO_6000_MIG_TYPES if mig else RTX_PRO_6000_TYPES,
                           enabled=enabled, totalvfs=48, first_function=2,
                           mig=RTX_PRO_6000_GIS if mig else None, gfx=True)
    if mig:
        host.install_nvidia_smi({address: mig for address in addresses}, "RTX PRO 6000")
    host.iommu_groups(8)
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    host.loaded_driver("580.105.06")
    return host


def h200_sxm_host(root, nova: str = "3:31.0.0-0ubuntu1", enabled: bool = True,
                  vfs: int = 8, mig: Optional[str] = None) -> FakeHost:
    """Two H200 SXM 141GB (10de:2335) on the VFIO framework, VFs carrying the GPU's id.

    Addresses: two of the eight in bigstack-oss/cubecos issue 259's lspci ("18:00.0 3D
    controller [0302]: NVIDIA Corporation GH100 [H200 SXM 141GB] [10de:2335]"); the VFs'
    id: NVIDIA/kubevirt-gpu-device-plugin PR 192 ("every VF ... shares the same PCI
    vendor:device id as the whole card") on the host of NVIDIA/gpu-operator issue 2594
    (10de:2335, driver 580.159.01). Inferred: 32 VFs per GPU (``vfs`` of them enabled),
    VF 0 at .4. ``mig``: the MIG-backed form, as for :func:`rtx_pro_6000_host`.
    """
    host = FakeHost(root)
    host.pci_ids()
    for address in ("0000:18:00.0", "0000:2a:00.0"):
        host.add_sriov_gpu(address, device="0x2335", vf_device="0x2335", count=vfs,
                           vfio_types=H200_SXM_MIG_TYPES if mig else H200_SXM_TYPES,
                           enabled=enabled, totalvfs=32, mig=H200_GIS if mig else None)
    if mig:
        host.install_nvidia_smi({a: mig for a in ("0000:18:00.0", "0000:2a:00.0")}, "H200")
    host.iommu_groups(4)
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    host.loaded_driver("580.159.01")
    return host


def h200_nvl_host(root, nova: str = "3:31.0.0-0ubuntu1", enabled: bool = True,
                  vfs: int = 32) -> FakeHost:
    """One H200 NVL (10de:233b) with 32 VFs (apache/cloudstack issue 12960), H200-* types.

    Inferred: the address, the VFs' id (the GPU's, as on the L40S, H200 SXM and RTX PRO
    6000), VF 0 at .4, the type ids (H200_NVL_TYPES) and the driver version.
    """
    host = FakeHost(root)
    host.pci_ids()
    host.add_sriov_gpu("0000:41:00.0", device="0x233b", vf_device="0x233b", count=vfs,
                       vfio_types=H200_NVL_TYPES, enabled=enabled, totalvfs=32)
    host.iommu_groups(4)
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    host.loaded_driver("580.105.06")
    return host


def l40s_branch_host(root, branch: str, nova: str = "3:31.0.0-0ubuntu1",
                     vfs: int = 8) -> FakeHost:
    """One L40S (VF 0 at 0000:26:00.4, as in harvester/pcidevices' testdata) on a driver branch.

    ``branch``: a key of L40S_BRANCHES; the same profile has another type id on each. 32
    VFs per L40S (harvester/harvester issue 6487: "the device and the 32VFs").
    """
    types, driver = L40S_BRANCHES[branch]
    host = FakeHost(root)
    host.pci_ids()
    host.add_sriov_gpu("0000:26:00.0", device="0x26b9", vf_device="0x26b9", count=vfs,
                       vfio_types=types, totalvfs=32)
    host.iommu_groups(4)
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    host.loaded_driver(driver)
    return host


def empty_host(root, nova: str = "3:29.0.0-0ubuntu1") -> FakeHost:
    """A compute host without NVIDIA GPUs (an Intel iGPU and a NIC only)."""
    host = FakeHost(root)
    host.pci_ids()
    host.add_pci("0000:00:02.0", INTEL, "0x3e92", "0x030000", driver="i915")
    host.add_pci("0000:3b:00.0", MELLANOX, "0x101d", "0x020000", driver="mlx5_core")
    host.nova(nova)
    return host


def build(kind: str, root, **kwargs) -> FakeHost:
    hosts = {"v100": v100_host, "a100": a100_host, "l40s": l40s_host, "empty": empty_host,
             "rtxpro6000": rtx_pro_6000_host, "h200sxm": h200_sxm_host, "h200nvl": h200_nvl_host}
    if kind.endswith("-mig"):  # the MIG-backed form, MIG mode on: rtxpro6000-mig, h200sxm-mig
        return hosts[kind[:-len("-mig")]](root, mig="Enabled", **kwargs)
    return hosts[kind](root, **kwargs)


__all__: Sequence[str] = ("FakeHost", "MdevType", "VfioModel", "v100_host", "a100_host",
                          "l40s_host", "empty_host", "build", "V100_TYPES", "A100_TYPES",
                          "L40S_TYPES", "H200_TYPES", "rtx_pro_6000_host", "h200_sxm_host",
                          "h200_nvl_host", "l40s_branch_host", "L40S_TYPES_1153", "L40S_BRANCHES",
                          "H200_SXM_TYPES", "H200_NVL_TYPES", "RTX_PRO_6000_TYPES",
                          "RTX_PRO_6000_MIG_TYPES", "H200_SXM_MIG_TYPES", "MigModel", "settle_mdevs")


def assign_vfio_type(host: FakeHost, vf_address: str, number: int,
                     creatable: Optional[Mapping[int, str]] = None) -> Path:
    """Give a VF on the vendor-specific VFIO framework a vGPU type, as the driver shows it.

    ``current_vgpu_type`` holds the id; ``creatable_vgpu_types`` then lists only
    what still fits (``creatable``; empty by default: a VF holding a type
    offers nothing more, and a full GPU lists nothing anywhere).
    """
    nvidia = (host.bus / vf_address).resolve() / "nvidia"
    nvidia.mkdir(exist_ok=True)
    (nvidia / "current_vgpu_type").write_text(f"{number}\n")
    rows = ["ID    : vGPU Name"] + [f"{n:<6}: {name}" for n, name in sorted((creatable or {}).items())]
    (nvidia / "creatable_vgpu_types").write_text("\n".join(rows) + "\n")
    return nvidia
