"""MIG-backed vGPUs on NVIDIA's vendor-specific VFIO framework (Hopper, Blackwell).

A MIG-backed profile names its compute slices: ``H200X-1-18C`` is one slice
with 18 GB, ``NVIDIA RTX Pro 6000 Blackwell DC-2-12Q`` two slices shared by
12 GB vGPUs. Each such vGPU lives in a GPU instance (GI) of the GPU's MIG
geometry; what fits is a property of the GPU model, never of what a VF lists
as still creatable. This module holds:

* the geometry of the GPUs the charm knows (:data:`GEOMETRIES`): their GPU
  instance profiles, the memory slices each takes and where it may start
  (its placements), from NVIDIA's MIG user guide;
* which GI profile a vGPU profile sits on, how many vGPUs one GI holds, how
  many the GPU holds (:func:`fits`), and whether several profiles can share
  one GPU (:func:`arrangement`);
* MIG mode: read with ``nvidia-smi --query-gpu`` (:func:`modes`) only when a
  MIG-backed profile is mapped, and turned on only by the ``enable-mig``
  action (:func:`enable`); hooks never change it.

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

import logging
import re
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from . import hostroot, pci, run, text
from .errors import CommandError, HostReadError, MigError

log = logging.getLogger(__name__)

NVIDIA_SMI = "usr/bin/nvidia-smi"
TIMEOUT = 30  # seconds for one nvidia-smi run; a hung driver must not stall a hook
ENABLED = "Enabled"
# bigstack-oss/cubecos PR 903 reads the mode the same way, per GPU:
# ``nvidia-smi -i <bus id> --query-gpu=mig.mode.current --format=csv,noheader,nounits``.
QUERY = ("--query-gpu=pci.bus_id,mig.mode.current,mig.mode.pending", "--format=csv,noheader")


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


def _hopper(gb: Tuple[int, int, int, int], model: str) -> Geometry:
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
    ))


H200 = _hopper((18, 35, 71, 141), "H200 141GB")
RTX_PRO_6000 = Geometry("RTX PRO 6000 Blackwell Server Edition", 4, 4, (
    GiProfile("1g.24gb", 1, 24, 1, (0, 1, 2, 3)),
    GiProfile("2g.48gb", 2, 48, 2, (0, 2)),
    GiProfile("4g.96gb", 4, 96, 4, (0,)),
))
# By the GPU's PCI device id (pci.ids: 2335 GH100 [H200 SXM 141GB], 233b GH100 [H200 NVL],
# 2bb5 GB202GL [RTX PRO 6000 Blackwell Server Edition]).
GEOMETRIES: Dict[str, Geometry] = {"0x2335": H200, "0x233b": H200, "0x2bb5": RTX_PRO_6000}


class Slot(NamedTuple):
    """Where a MIG-backed vGPU profile lives on a GPU model."""

    instance: GiProfile  # its GPU instance profile
    per_instance: int  # vGPUs of the profile one GI holds

    @property
    def fits(self) -> int:
        """vGPUs of the profile one GPU holds: instances times vGPUs per instance."""
        return self.instance.most * self.per_instance


def geometry(gpu: pci.Gpu) -> Optional[Geometry]:
    """The MIG geometry of ``gpu``'s model, or None when the charm has no table for it."""
    return GEOMETRIES.get(gpu.device_id.lower())


def slot(shape: Geometry, profile: pci.Profile) -> Optional[Slot]:
    """The GI profile a MIG-backed profile sits on and how many one GI holds (None: none fits).

    Inferred (see the module): the smallest GI profile with the profile's compute
    slices whose memory holds its framebuffer; media profiles (CME) on the +me one.
    """
    if not profile.mig or profile.framebuffer_gb <= 0:
        return None
    media = profile.series.endswith("ME")
    candidates = sorted((gi for gi in shape.profiles if gi.slices == profile.slices
                         and gi.media == media and gi.memory_gb >= profile.framebuffer_gb),
                        key=lambda gi: gi.memory_gb)
    if not candidates:
        return None
    gi = candidates[0]
    return Slot(gi, max(1, gi.memory_gb // profile.framebuffer_gb))


def fits(gpu: pci.Gpu, profile: pci.Profile) -> Optional[int]:
    """How many vGPUs of a MIG-backed ``profile`` one GPU of ``gpu``'s model holds; None: unknown."""
    shape = geometry(gpu)
    found = slot(shape, profile) if shape is not None else None
    return found.fits if found is not None else None


# -- MIG mode: nvidia-smi -----------------------------------------------------------------

class Mode(NamedTuple):
    """A GPU's MIG mode as nvidia-smi reports it: ``Enabled``, ``Disabled`` or ``[N/A]``."""

    current: str
    pending: str

    @property
    def enabled(self) -> bool:
        """MIG mode is in force now."""
        return self.current == ENABLED

    @property
    def awaiting_reset(self) -> bool:
        """Enabled, but not in force until the GPU is reset or the host rebooted."""
        return self.pending == ENABLED and not self.enabled


def smi_address(address: str) -> str:
    """sysfs's ``0001:c8:00.0`` as nvidia-smi spells it: ``00000001:C8:00.0``."""
    domain, rest = address.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"


def sysfs_address(bus_id: str) -> Optional[str]:
    """nvidia-smi's ``00000001:C8:00.0`` as sysfs spells it: ``0001:c8:00.0``; None if not one."""
    match = re.fullmatch(r"([0-9A-Fa-f]{4,8}):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])",
                        bus_id.strip())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function}"


def parse_modes(output: str) -> Dict[str, Mode]:
    """``00000000:42:00.0, Enabled, Enabled`` lines as ``{sysfs address: Mode}``."""
    out: Dict[str, Mode] = {}
    for line in output.splitlines():
        fields = [f.strip() for f in line.split(",")]
        address = sysfs_address(fields[0]) if len(fields) == 3 else None
        if address is not None:
            out[address] = Mode(fields[1], fields[2])
    return out


def tool() -> str:
    """nvidia-smi under the host root; MigError when the driver did not install it."""
    path = hostroot.path(NVIDIA_SMI)
    if not path.exists():
        raise MigError(f"/{NVIDIA_SMI} not found (is the vGPU host driver installed?)")
    return str(path)


def modes(addresses: Iterable[str], timeout: float = TIMEOUT) -> Dict[str, Mode]:
    """The MIG mode of each GPU at ``addresses``, from one nvidia-smi run.

    Why the mode is read this way: sysfs has no MIG-mode attribute, and
    ``/proc/driver/nvidia/capabilities/gpu<N>/mig/`` lists the access files of GPU
    instances that exist, keyed by the driver's minor number, not the mode.
    ``nvidia-smi --query-gpu=mig.mode.current`` is NVIDIA's documented query
    (MIG user guide, "Enable MIG Mode"). Raises MigError when nvidia-smi cannot
    run, times out, fails or does not name a GPU asked about.
    """
    wanted = list(addresses)
    try:
        result = run.run([tool(), *QUERY], timeout, what="nvidia-smi --query-gpu=mig.mode.current")
    except CommandError as error:
        raise MigError(str(error)) from None
    found = parse_modes(result.stdout)
    missing = [a for a in wanted if a not in found]
    if missing:
        raise MigError(f"nvidia-smi does not report the MIG mode of GPU {text.listing(missing)}")
    return {a: found[a] for a in wanted}


def enable_command(address: str) -> str:
    """The command that turns MIG mode on for one GPU, as the enable-mig action runs it."""
    return f"nvidia-smi -i {smi_address(address)} -mig 1"


class Enabled(NamedTuple):
    """What ``nvidia-smi -i <GPU> -mig 1`` did."""

    output: str  # what it printed (one line per message)
    mode: Mode  # the mode read back afterwards

    @property
    def reset_needed(self) -> bool:
        """MIG mode is pending: a GPU reset or a reboot puts it in force."""
        return not self.mode.enabled


def pending_warning(output: str) -> bool:
    """Whether nvidia-smi said the change waits for a reset.

    The MIG user guide ("Enable MIG Mode") shows ``Warning: MIG mode is in
    pending enable state for GPU 00000000:07:00.0:In use by another client``
    followed by ``... reboot the system to make MIG mode effective``; the same
    wording for disabling is in NVIDIA/gpu-operator issue 118.
    """
    return re.search(r"pending (?:enable|disable) state|to make MIG mode effective", output,
                     re.IGNORECASE) is not None


def enable(address: str, timeout: float = TIMEOUT) -> Enabled:
    """Run ``nvidia-smi -i <GPU> -mig 1`` and read the mode back; MigError when it fails."""
    command = [tool(), "-i", smi_address(address), "-mig", "1"]
    try:
        result = run.run(command, timeout, check=False, what=enable_command(address))
    except CommandError as error:
        raise MigError(str(error)) from None
    said = "\n".join(line.strip() for line in (result.stdout + "\n" + result.stderr).splitlines()
                     if line.strip())
    if result.returncode != 0:
        why = text.cause(result.stderr or result.stdout) or f"exit status {result.returncode}"
        raise MigError(f"{enable_command(address)} failed: {why}")
    mode = modes([address], timeout)[address]
    if pending_warning(said) and mode.enabled:
        mode = mode._replace(current="Disabled")  # nvidia-smi's word: not in force yet
    log.info("%s: %s", enable_command(address), said or "no output")
    return Enabled(said, mode)


def instance_id(vf_address: str) -> Optional[str]:
    """The GPU instance a VF's MIG-backed vGPU lives in (``nvidia/gpu_instance_id``), or None.

    bigstack-oss/cubecos issue 312 and NVIDIA/gpu-operator issue 2594 show the
    file beside ``current_vgpu_type``; it is read for reports only.
    """
    try:
        value = hostroot.read_text(hostroot.path(pci.PCI_DEVICES, vf_address, "nvidia",
                                                 "gpu_instance_id"))
    except HostReadError:  # a report shows what it can read
        return None
    value = (value or "").strip()
    return value if value.isdigit() else None


def mig_profile(name: str) -> Optional[pci.Profile]:
    """The MIG-backed profile a type name spells, or None for a time-sliced (or no) profile."""
    found = pci.profile(name)
    return found if found is not None and found.mig else None


def by_gpu(assignments: Sequence) -> Dict[str, List[str]]:
    """``{GPU address: [MIG-backed profiles, NVIDIA's short form]}`` of a plan's assignments."""
    out: Dict[str, List[str]] = {}
    for a in assignments:
        found = mig_profile(a.name)
        short = pci.short_name(found.name) if found is not None else ""
        if found is not None and short not in out.setdefault(a.gpu, []):
            out[a.gpu].append(short)
    return out


def mode_problems(wanted: Mapping[str, Sequence[str]], unit: str = "") -> List[str]:
    """Why the MIG-backed profiles ``wanted`` (``{GPU: [profile names]}``) cannot be given now.

    One nvidia-smi run for all of them (:func:`modes`); a GPU out of MIG mode is
    named with the command that turns it on (the ``enable-mig`` action, run by
    the operator: hooks never change MIG mode); one whose mode is pending needs a
    GPU reset or a reboot. What cannot be read counts as not in MIG mode.
    """
    from . import OPTION

    if not wanted:
        return []
    try:
        found = modes(wanted)
    except MigError as error:
        return [f"cannot tell whether GPU {text.listing(sorted(wanted))} is in MIG mode, which "
                f"MIG-backed profiles need: {error}; no VF changed"]
    out = []
    run_it = f"juju run {unit} enable-mig" if unit else "run the enable-mig action with"
    for address, names in sorted(wanted.items()):
        mode = found[address]
        if mode.enabled:
            continue
        head = (f"GPU {address} is not in MIG mode, which MIG-backed {', '.join(names)} "
                f"({OPTION}) need")
        if mode.awaiting_reset:
            out.append(f"{head}: enabling it waits for a reset; reset the GPU (nvidia-smi -r -i "
                       f"{smi_address(address)}, no guest or process on it) or reboot the host")
        else:
            out.append(f"{head}: {run_it} gpu={address} (it runs {enable_command(address)})")
    return out


def enable_results(address: str, done: Optional[Enabled]) -> Dict[str, str]:
    """The enable-mig action's results: what nvidia-smi said, and whether a reset is needed."""
    command = enable_command(address)
    if done is None:
        return {"gpu": address, "command": command, "reset-required": "no",
                "message": f"GPU {address} is in MIG mode already; nothing run"}
    if done.reset_needed:
        message = (f"MIG mode is pending on GPU {address}: reset the GPU (nvidia-smi -r -i "
                   f"{smi_address(address)}, no guest or process on it) or reboot the host")
    else:
        message = f"MIG mode enabled on GPU {address}"
    return {"gpu": address, "command": command, "output": done.output or "(nothing)",
            "reset-required": "yes" if done.reset_needed else "no", "message": message}
