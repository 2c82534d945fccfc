"""MIG mode on NVIDIA's vendor-specific VFIO GPUs (Hopper, Blackwell), read and set with nvidia-smi.

A MIG-backed profile names its compute slices: ``H200X-1-18C`` is one slice
with 18 GB, ``NVIDIA RTX Pro 6000 Blackwell DC-2-12Q`` two slices shared by
12 GB vGPUs. Each such vGPU lives in a GPU instance of a GPU in MIG mode. This
module holds the mode:

* read with ``nvidia-smi --query-gpu`` (:func:`modes`) only when a MIG-backed
  profile is mapped, and turned on (:func:`enable`) for a new mapping only by
  the ``enable-mig`` action (:func:`enable_results`); after a reboot, for the
  mapping in force, by the boot step (or the hook that does its work when it
  could not); never a GPU reset (refused with VFs or persistence mode on);
* why MIG-backed profiles cannot be given now (:func:`mode_problems`), naming
  the NVML clients that hold a mode pending (:func:`clients_said`).

Beside it: :mod:`vgpu.profiles` (the names and the GPU-instance geometry: one
MIG-backed profile per GPU, where it sits, how many fit) and
:mod:`vgpu.miginstances` (the GPU instances, and the boot step's MIG part),
which imports this module.
"""

from __future__ import annotations

import logging
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from . import hostroot, profiles, run, text
from .errors import CommandError, MigError
from .record import NamedTuple

log = logging.getLogger(__name__)

NVIDIA_SMI = "usr/bin/nvidia-smi"
TIMEOUT = 30  # seconds for one nvidia-smi run; a hung driver must not stall a hook
ENABLED = "Enabled"
# bigstack-oss/cubecos PR 903 reads the mode the same way, per GPU:
# ``nvidia-smi -i <bus id> --query-gpu=mig.mode.current --format=csv,noheader,nounits``.
QUERY = ("--query-gpu=pci.bus_id,mig.mode.current,mig.mode.pending", "--format=csv,noheader")


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
    def enable_pending(self) -> bool:
        """Enabled, but not in force: another client held the GPU when ``-mig 1`` ran."""
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


def modes(addresses: Iterable[str], timeout: float = TIMEOUT, named: bool = False
          ) -> Dict[str, Mode]:
    """The MIG mode of each GPU at ``addresses``, from one nvidia-smi run.

    ``named`` (one GPU): the run names it (``-i``). Without ``-i`` nvidia-smi
    opens every GPU, a client of any whose MIG mode another thread of the boot
    step changes at that moment; a hook (holding the host lock) asks once for all.

    Why the mode is read this way: sysfs has no MIG-mode attribute, and
    ``/proc/driver/nvidia/capabilities/gpu<N>/mig/`` lists the access files of GPU
    instances that exist, keyed by the driver's minor number, not the mode.
    ``nvidia-smi --query-gpu=mig.mode.current`` is NVIDIA's documented query
    (MIG user guide, "Enable MIG Mode"). Raises MigError when nvidia-smi cannot
    run, times out, fails or does not name a GPU asked about.
    """
    wanted = list(addresses)
    which = ["-i", smi_address(wanted[0])] if named and len(wanted) == 1 else []
    try:
        result = run.run([tool(), *which, *QUERY], timeout,
                         what="nvidia-smi --query-gpu=mig.mode.current")
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
    def pending(self) -> bool:
        """MIG mode is pending: not in force until nothing else uses the GPU and -mig 1 runs again."""
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
    """Run ``nvidia-smi -i <GPU> -mig 1`` and read its mode back (``-i``); MigError when it fails."""
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
    mode = modes([address], timeout, named=True)[address]
    if pending_warning(said) and mode.enabled:
        mode = mode._replace(current="Disabled")  # nvidia-smi's word: not in force yet
    log.info("%s: %s", enable_command(address), bounded(said) or "no output")
    return Enabled(said, mode)


def by_gpu(assignments: Sequence) -> Dict[str, List[str]]:
    """``{GPU address: [MIG-backed profiles, NVIDIA's short form]}`` of a plan's assignments."""
    out: Dict[str, List[str]] = {}
    for a in assignments:
        found = profiles.mig_profile(a.name)
        short = profiles.short_name(found.name) if found is not None else ""
        if found is not None and short not in out.setdefault(a.gpu, []):
            out[a.gpu].append(short)
    return out


def clients_said(gpu: str, unit: str = "") -> str:
    """``; <advice>`` naming the neighbours' NVML clients that are active; '' when none is known."""
    from . import gpuclients
    from .errors import ServiceError

    try:
        clients = gpuclients.active()
    except (ServiceError, ValueError):
        return ""
    return f"; {gpuclients.advice(gpu, clients, unit)}" if clients else ""


def mode_problems(wanted: Mapping[str, Sequence[str]], unit: str = "",
                  found: Optional[Mapping[str, Mode]] = None) -> List[str]:
    """Why the MIG-backed profiles ``wanted`` (``{GPU: [profile names]}``) cannot be given now.

    One nvidia-smi run for all of them (:func:`modes`); a GPU out of MIG mode is
    named with the command that turns it on (the ``enable-mig`` action, run by
    the operator: hooks never turn MIG mode on for a mapping); one whose mode is
    pending needs whatever uses the GPU stopped and the action run again (never a
    GPU reset: see :data:`PENDING_STEPS`). What cannot be read counts as not in MIG mode.
    """
    from . import OPTION

    if not wanted:
        return []
    try:
        found = found if found is not None and set(wanted) <= set(found) else modes(wanted)
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
        if mode.enable_pending:
            out.append(f"{head}: enabling it is pending; "
                       + PENDING_STEPS.format(run=f"{run_it} gpu={address}")
                       + clients_said(address, unit))
        else:
            out.append(f"{head}: {run_it} gpu={address} (it runs {enable_command(address)})")
    return out


OUTPUT_LIMIT = 2000  # characters of nvidia-smi's answer in an action result (action-set is bounded)
# nvidia-smi's own pending warning (MIG user guide, "Enable MIG Mode"; NVIDIA/gpu-operator issue
# 118): "Please first kill all processes using the device and retry the command". No GPU reset:
# sriov-manage turns persistence mode on, and a reset is refused while it is on or the GPU has
# VFs (NVIDIA/NVSentinel issue 1690, NVIDIA/gpu-operator issue 118).
PENDING_STEPS = ("another client uses the GPU: stop it (nvidia-smi lists the processes using the "
                 "GPU), then {run} again, which runs -mig 1 again as nvidia-smi's warning asks "
                 "(no GPU reset: one is refused while the GPU has VFs or persistence mode is on)")
AT_BOOT = ("at every boot, before libvirt and nova-compute start, nvidia-vgpu-vfs.service enables "
           "the VFs of a GPU given a MIG-backed profile, turns its MIG mode on (Hopper and "
           "Blackwell lose it at every reboot; Ampere keeps it), creates its GPU instances again "
           "(they never survive a reboot), then gives the VFs their types")


def bounded(output: str, limit: int = OUTPUT_LIMIT) -> str:
    """A tool's answer for an action result: printable, at most ``limit`` characters, said so."""
    cleaned = text.clean(output).strip()
    if len(cleaned) <= limit:
        return cleaned
    return f"{cleaned[:limit]}\n... ({len(cleaned) - limit} more characters not shown)"


def enable_results(address: str, done: Optional[Enabled]) -> Dict[str, str]:
    """The enable-mig action's results: what nvidia-smi said (bounded), pending or not, the boot step."""
    command = enable_command(address)
    if done is None:
        return {"gpu": address, "command": command, "pending": "no", "at-boot": AT_BOOT,
                "message": f"GPU {address} is in MIG mode already; nothing run"}
    if done.pending:
        message = (f"MIG mode is pending on GPU {address}: "
                   + PENDING_STEPS.format(run="run this action"))
    else:
        message = f"MIG mode enabled on GPU {address}"
    return {"gpu": address, "command": command, "output": bounded(done.output) or "(nothing)",
            "pending": "yes" if done.pending else "no", "at-boot": AT_BOOT, "message": message}
