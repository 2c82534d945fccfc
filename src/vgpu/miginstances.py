"""MIG GPU instances on a vGPU host: the ones a mapping needs, made and kept with nvidia-smi.

Each MIG-backed vGPU lives in a GPU instance (GI) of its GPU. This module
holds what the GPU instances a plan needs are (:func:`needs`, :func:`mapped`,
:class:`Need`: the profile NVML names for the type where the driver answers,
:func:`driver_profiles`, else the one its name gives, with ``+gfx`` for every
MIG-backed type of the RTX PRO 6000), what a GPU has (:func:`instances`,
:func:`offered`, :func:`used`), the layout that gets there (:func:`layout`)
and the change (:func:`ensure`): created before a VF takes a MIG-backed type,
never destroyed while a VF's vGPU is in one unless no guest holds that VF;
the boot data's part (:func:`boot_needs`) and the boot step's (:func:`at_boot`:
MIG mode on again through :mod:`vgpu.mig`, then the GPU instances).

Below it: :mod:`vgpu.mig` (MIG mode, nvidia-smi) and :mod:`vgpu.profiles`
(the GPU-instance geometry and the profile names).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import time
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import PCI_ADDRESS, hostroot, mig, pci, profiles, run, text
from .errors import CommandError, HostReadError, MigError, MigInUseError
from .record import NamedTuple

log = logging.getLogger(__name__)


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


# -- GPU instances: nvidia-smi mig ---------------------------------------------------------
#
# NVIDIA's vGPU for Compute guide, "Configuring a GPU for MIG-Backed vGPUs": on KVM the host
# enables MIG mode, creates GPU instances and creates compute instances in them before a
# MIG-backed vGPU type is given to a VF (only VMware vSphere creates them itself); writing the
# type places the vGPU in a GPU instance that exists, it creates none. The MIG user guide,
# "Creating GPU Instances" and "Destroying GPU Instances", gives the commands used here:
# ``nvidia-smi mig -lgip`` (profiles, free/total), ``-lgi`` (instances and placements),
# ``-cgi <profile>,... -C`` (GPU instances, each with its default compute instance),
# ``-dci``/``-dgi -gi <id>``.
#
# nvidia-smi rather than NVML (nvidia-ml-py): the charm already runs nvidia-smi through
# vgpu.run, bounded in time in a process group of its own, so a hung driver call ends with
# its process instead of hanging the hook or the boot step (an NVML call in-process cannot
# be stopped); it needs no new dependency in the charm's venv or in the boot step; and a
# stand-in script on PATH tests it the way the other host tools are tested. The cost is
# parsing a table: what cannot be parsed is an error (MigError), never an empty layout.

_LGI = re.compile(r"^\|\s*\d+\s+MIG\s+(\S+)\s+\d+\s+(\d+)\s+(\d+):(\d+)\s*\|$")
_LGIP = re.compile(r"^\|\s*\d+\s+MIG\s+(\S+)\s+(\d+)\s+(\d+)/(\d+)\s")
_NONE = "No GPU instances found"
_PCI = re.compile(PCI_ADDRESS)


class GpuInstance(NamedTuple):
    """One GPU instance as ``nvidia-smi mig -lgi`` lists it."""

    id: int
    profile: str  # 1g.24gb+gfx
    start: int
    size: int


class Offered(NamedTuple):
    """One GPU instance profile as ``nvidia-smi mig -lgip`` lists it."""

    profile: str
    id: int
    free: int
    total: int


class Need(NamedTuple):
    """The GPU instances one GPU's MIG-backed profile needs."""

    gpu: str
    profile: str  # the vGPU profile: H200X-1-18C
    instance: str  # the GPU instance profile: 1g.18gb, 1g.24gb+gfx
    gis: int  # how many GPU instances

    def data(self) -> Dict[str, object]:
        """As the boot data keeps it."""
        return {"profile": self.profile, "instance": self.instance, "count": self.gis}


class Layout(NamedTuple):
    """What one GPU's GPU instances need: instances to destroy, how many to create, or why not."""

    destroy: Tuple[GpuInstance, ...] = ()
    create: int = 0
    problem: str = ""
    held: Tuple[str, ...] = ()  # the VFs whose vGPUs are in GPU instances in the way


_INSTANCE = re.compile(r"[0-9]g\.[0-9]+gb(?:\+[a-z]+)?")  # what the boot data takes (boot_needs)
NVML_TIMEOUT = 20  # seconds for the NVML probe (a Python process); a hung driver must not stall


def driver_profiles(timeout: float = NVML_TIMEOUT) -> Dict[str, Dict[str, str]]:
    """``{GPU: {type name: GPU instance profile}}`` as the driver's NVML says; {} when it cannot.

    ``nvmlVgpuTypeGetGpuInstanceProfileId`` per supported type (:func:`vgpu.nvml.
    gpu_instance_profiles`), asked in a process of its own, bounded in time (an NVML
    call in the hook's process cannot be stopped: the reason this module runs
    nvidia-smi), whose NVML session ends with it. Where it is not answered (no
    libnvidia-ml, a driver without the call, a timeout) the names decide, as
    NVIDIA/vgpu-device-manager's config.go has them (:func:`vgpu.profiles.instance_name`).
    """
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        result = run.run([sys.executable, "-m", "vgpu.nvml"], timeout, env=env,
                         what="NVML: the GPU instance profile of each vGPU type")
        said = json.loads(result.stdout[:1 << 20] or "{}")
    except (CommandError, ValueError) as error:
        log.warning("NVML cannot say which GPU instance profile each vGPU type needs (%s); "
                    "the type names decide", text.cause(str(error)) or error)
        return {}
    out: Dict[str, Dict[str, str]] = {}
    for gpu, types in (said.items() if isinstance(said, dict) else ()):
        if isinstance(gpu, str) and _PCI.fullmatch(gpu) and isinstance(types, dict):
            out[gpu] = {name: found for name, found in types.items() if isinstance(name, str)
                        and isinstance(found, str) and _INSTANCE.fullmatch(found)}
    return out


def _said(driver: Optional[Mapping[str, Mapping[str, str]]], gpu: str, name: str) -> str:
    """The GPU instance profile the driver says type ``name`` needs on ``gpu``; "" when unsaid."""
    wanted = profiles.key_form(name)
    for listed, found in ((driver or {}).get(gpu) or {}).items():
        if wanted in profiles.name_keys(listed):
            return found
    return ""


def _need(address: str, shape: profiles.Geometry, name: str, count: int, per_gpu: bool,
          driver: Optional[Mapping[str, Mapping[str, str]]]) -> Optional[Need]:
    """The GPU instances ``count`` vGPUs of type ``name`` take (``per_gpu``: as many as fit)."""
    named = profiles.profile(profiles.canonical(name) if shape.gfx_only else name)
    found = profiles.slot(shape, named) if named is not None else None
    if found is None or named is None:
        return None
    instance = _said(driver, address, named.name) or profiles.instance_name(found.instance, named, shape)
    base = next((gi for gi in shape.profiles if gi.name == instance.split("+")[0]), None)
    if base is not None and base.name != found.instance.name:  # the driver's, counted by its size
        found = profiles.Slot(base, max(1, base.memory_gb // named.framebuffer_gb))
    count = min(found.fits if per_gpu else count, found.fits)
    return Need(address, profiles.short_name(named.name), instance, -(-count // found.per_instance))


def needs(assignments: Sequence, host: pci.Host,
          driver: Optional[Mapping[str, Mapping[str, str]]] = None) -> Dict[str, Need]:
    """``{GPU: Need}`` for a plan's MIG-backed assignments: enough GPU instances for its VFs.

    ``driver``: what NVML says of each type (:func:`driver_profiles`).
    """
    counts: Dict[str, Dict[str, int]] = {}
    for a in assignments:
        if profiles.mig_profile(a.name) is not None:
            counts.setdefault(a.gpu, {}).setdefault(a.name, 0)
            counts[a.gpu][a.name] += 1
    out: Dict[str, Need] = {}
    for address, named in counts.items():
        gpu = host.gpu(address)
        shape = profiles.geometry(gpu) if gpu is not None else None
        for name, count in named.items():  # one MIG-backed profile per GPU (vgpu.plan)
            found = _need(address, shape, name, count, False, driver) if shape else None
            if found is not None:
                out[address] = found
    return out


def mapped(mapping: Mapping[str, Sequence[str]], host: pci.Host,
           driver: Optional[Mapping[str, Mapping[str, str]]] = None) -> Dict[str, Need]:
    """``{GPU: Need}`` from the mapping itself, before it is checked against what VFs list.

    A VF lists a MIG-backed type only while a GPU instance with room for it
    exists, so the instances come first, from the mapping's MIG-backed keys on
    the VFIO GPUs of a model the charm has a table for (:data:`vgpu.profiles.GEOMETRIES`) whose
    vGPU names the key uses: a GPU mapped whole takes as many as the profile
    fits, VF by VF one per VF. A GPU the mapping gives two MIG-backed profiles
    gets none (:mod:`vgpu.plan` refuses it).
    """
    counts: Dict[str, Dict[str, Tuple[str, int, bool]]] = {}
    for key, where in mapping.items():
        named = profiles.mig_profile(key)
        if named is None:
            continue
        everywhere = tuple(where) == ("all",)
        for gpu in host.gpus:
            shape = profiles.geometry(gpu)
            found = profiles.slot(shape, named) if shape is not None and gpu.framework == pci.VFIO \
                and named.model.upper() in shape.names else None
            if found is None or gpu.vfs_missing:
                continue
            mine = [a for a in where if gpu.function(a) is not None]
            whole = everywhere or gpu.address in mine
            if shape is not None and (whole or mine):  # one entry per type: DC-1-24QGFX is
                # DC-1-24Q on a GPU whose MIG-backed types are all on +gfx instances
                name = profiles.short_name(profiles.canonical(named.name) if shape.gfx_only else named.name)
                _, before, all_of = counts.setdefault(gpu.address, {}).get(name, (key, 0, False))
                counts[gpu.address][name] = (key, before + len(mine), whole or all_of)
    out: Dict[str, Need] = {}
    for address, named_counts in counts.items():
        owner = host.gpu(address)
        shape = profiles.geometry(owner) if owner is not None else None
        if len(named_counts) != 1 or shape is None:
            continue
        (key, count, whole), = named_counts.values()
        need = _need(address, shape, key, count, whole, driver)
        if need is not None:
            out[address] = need
    return out


def parse_instances(output: str) -> List[GpuInstance]:
    """The rows of ``nvidia-smi mig -lgi``."""
    out = []
    for line in output.splitlines():
        match = _LGI.match(line.strip())
        if match:
            name, number, start, size = match.groups()
            out.append(GpuInstance(int(number), name, int(start), int(size)))
    return out


def parse_profiles(output: str) -> Dict[str, Offered]:
    """The rows of ``nvidia-smi mig -lgip`` by profile name."""
    out = {}
    for line in output.splitlines():
        match = _LGIP.match(line.strip())
        if match:
            name, number, free, total = match.groups()
            out[name] = Offered(name, int(number), int(free), int(total))
    return out


def _mig(address: str, args: Sequence[str], timeout: float) -> run.Result:
    command = ["mig", "-i", mig.smi_address(address), *args]
    try:
        return run.run([mig.tool(), *command], timeout, check=False,
                       what="nvidia-smi " + " ".join(command))
    except CommandError as error:
        raise MigError(str(error)) from None


def _failed(address: str, args: Sequence[str], result: run.Result) -> MigError:
    """nvidia-smi's reason, never its "Successfully created ..." lines (``-cgi`` goes on after them)."""
    said = (result.stdout + "\n" + result.stderr).splitlines()
    made = sum(line.strip().startswith("Successfully created GPU instance") for line in said)
    why = text.cause("\n".join(line for line in said if not line.strip().startswith("Successfully"))
                     ) or f"exit status {result.returncode}"
    done = f" ({made} GPU instance{'s' if made != 1 else ''} created before that)" if made else ""
    return MigError(f"nvidia-smi mig -i {mig.smi_address(address)} {' '.join(args)} failed: {why}{done}")


def instances(address: str, timeout: float = mig.TIMEOUT) -> List[GpuInstance]:
    """The GPU instances on ``address`` (``-lgi``); MigError when that cannot be told."""
    result = _mig(address, ["-lgi"], timeout)
    if _NONE in result.stdout + result.stderr:
        return []
    found = parse_instances(result.stdout)
    if result.returncode != 0 or not found:
        raise _failed(address, ["-lgi"], result) if result.returncode else MigError(
            f"nvidia-smi mig -i {mig.smi_address(address)} -lgi listed nothing the charm can read")
    return found


def offered(address: str, timeout: float = mig.TIMEOUT) -> Dict[str, Offered]:
    """The GPU instance profiles ``address`` offers, with how many are creatable now (``-lgip``)."""
    result = _mig(address, ["-lgip"], timeout)
    found = parse_profiles(result.stdout)
    if result.returncode != 0 or not found:
        raise _failed(address, ["-lgip"], result) if result.returncode else MigError(
            f"nvidia-smi mig -i {mig.smi_address(address)} -lgip listed nothing the charm can read")
    return found


def create(address: str, profile: str, count: int, timeout: float = mig.TIMEOUT) -> str:
    """Create ``count`` GPU instances of ``profile``, each with its compute instance (``-C``)."""
    args = ["-cgi", ",".join([profile] * count), "-C"]
    result = _mig(address, args, timeout)
    if result.returncode != 0:
        raise _failed(address, args, result)
    return result.stdout.strip()


def destroy(address: str, gi: int, timeout: float = mig.TIMEOUT) -> None:
    """Destroy a GPU instance's compute instances, then the instance (MIG user guide order)."""
    for args in (["-dci", "-gi", str(gi)], ["-dgi", "-gi", str(gi)]):
        result = _mig(address, args, timeout)
        if result.returncode != 0 and not (args[0] == "-dci" and "Not Found" in result.stdout):
            raise _failed(address, args, result)


def used(address: str) -> Dict[int, List[str]]:
    """``{GPU instance id: [VFs holding a vGPU in it]}`` for the GPU at ``address``, from sysfs.

    A VF that holds a type but whose ``nvidia/gpu_instance_id`` cannot be read
    is a MigError: what cannot be read counts as in use, never as free.
    """
    out: Dict[int, List[str]] = {}
    for _, vf in pci.virtfn_links(hostroot.text_path(pci.PCI_DEVICES, address)):
        try:
            held = (hostroot.read_text(hostroot.path(pci.PCI_DEVICES, vf, "nvidia",
                                                     "current_vgpu_type")) or "").strip()
        except HostReadError as error:  # there but unreadable: in use, never free
            raise MigError(f"VF {vf}: its vGPU type cannot be read ({error}); no GPU instance "
                           "changed") from None
        if held in ("", "0"):  # no nvidia/ files: the VF holds nothing the driver knows
            continue
        gi = instance_id(vf)
        if gi is None:
            raise MigError(f"VF {vf} holds nvidia-{held} but its GPU instance cannot be read "
                           "(nvidia/gpu_instance_id); no GPU instance changed")
        out.setdefault(int(gi), []).append(vf)
    return out


def layout(need: Need, existing: Sequence[GpuInstance], busy: Mapping[int, Sequence[str]],
           offers: Optional[Mapping[str, Offered]] = None) -> Layout:
    """What ``need`` asks of the GPU instances there now (pure; ``busy``: in use, by VF).

    Instances of the needed profile count; others are destroyed only when room is
    needed and no VF's vGPU is in them; one in use that stands in the way is a
    problem with the steps to clear it. ``offers`` (``-lgip``, read before anything
    is destroyed) says whether what is missing can be created: its Free count when
    nothing is to be destroyed; else its Total less the instances of the profile
    kept, since then only those are left and a profile's instances never overlap
    (each sits at one of its placements, and they tile the GPU: the MIG user
    guide's ``-lgipp`` examples).
    """
    same = [g for g in existing if g.profile == need.instance]
    missing = max(0, need.gis - len(same))
    if not missing:
        return Layout()
    other = [g for g in existing if g.profile != need.instance]
    held = [g for g in other if busy.get(g.id)]
    if held:
        gpu = mig.smi_address(need.gpu)
        vfs = sorted(vf for g in held for vf in busy[g.id])
        steps = "; ".join(f"nvidia-smi mig -i {gpu} -dci -gi {g.id}; nvidia-smi mig -i {gpu} "
                          f"-dgi -gi {g.id}" for g in held)
        return Layout(problem=(
            f"GPU {need.gpu}: MIG-backed {need.profile} needs {need.gis} x {need.instance} GPU "
            f"instances, but GPU instance {text.listing([f'{g.id} ({g.profile})' for g in held])} "
            f"holds the vGPUs of VF {text.listing(vfs)}; the charm never destroys a GPU instance "
            "in use. Move or delete the guests on those VFs, release each VF (echo 0 > "
            "/sys/bus/pci/devices/<VF>/nvidia/current_vgpu_type), then run "
            f"{steps}; the next hook creates the rest"), held=tuple(vfs))
    fits = Layout(destroy=tuple(other), create=missing)
    if offers is None:
        return fits
    offer = offers.get(need.instance)
    if offer is None:
        listed = "does not offer it"
    elif other and offer.total - len(same) < missing:
        listed = f"lists {offer.total} in all"  # the others destroyed, only the kept remain
    elif not other and offer.free < missing:
        listed = f"lists {offer.free} creatable"
    else:
        return fits
    return Layout(problem=(
        f"GPU {need.gpu}: MIG-backed {need.profile} needs {need.gis} x {need.instance} GPU "
        f"instances, {len(same)} exist and nvidia-smi mig -lgip {listed}"))


def ensure(need: Need, timeout: float = mig.TIMEOUT, releasable: Iterable[str] = ()) -> List[str]:
    """Give ``need.gpu`` the GPU instances ``need`` asks for; what was done, line by line.

    Only GPU instances no VF's vGPU is in are destroyed, and only when room is
    needed. A VF in ``releasable`` (the caller found no guest holding it, running
    or shut off) has its type released first when its GPU instance stands in the
    way: a type the charm wrote, which nothing uses. Any other instance in use that
    stands in the way raises MigInUseError with the steps (a hook never changes it).
    Nothing is destroyed unless what is missing can be created once they are gone:
    ``-lgip`` is read once, before anything is destroyed (when it cannot be read,
    nothing is), and :func:`layout` tells from it what will be creatable then. A
    second read after destroying would come too late to keep anything; should the
    driver still refuse, ``-cgi`` fails with its own reason.
    """
    existing = instances(need.gpu, timeout)
    busy = used(need.gpu)
    plan = layout(need, existing, busy)
    done: List[str] = []
    free = set(releasable)
    if plan.held and free.issuperset(plan.held):
        done.extend(_release(need, plan.held))
        busy = used(need.gpu)
        plan = layout(need, existing, busy)
    if plan.problem:
        raise MigInUseError(plan.problem, plan.held) if plan.held else MigError(plan.problem)
    if not plan.create:
        return done
    check = layout(need, existing, busy, offered(need.gpu, timeout))
    if check.problem:
        raise MigError(check.problem)
    for gi in plan.destroy:
        destroy(need.gpu, gi.id, timeout)
        done.append(f"GPU instance {gi.id} ({gi.profile}, unused) destroyed")
    create(need.gpu, need.instance, plan.create, timeout)
    done.append(f"{plan.create} x {need.instance} GPU instance{'s' if plan.create > 1 else ''} "
                "created")
    for line in done:
        log.info("GPU %s: %s", need.gpu, line)
    return done


def _release(need: Need, vfs: Sequence[str]) -> List[str]:
    """Release the types of ``vfs`` (no guest holds them) so that their GPU instances can go."""
    from . import vfio
    from .errors import VfTypeError

    done = []
    for vf in sorted(vfs):
        try:
            vfio.assign(vf, 0)
        except VfTypeError as error:
            raise MigError(f"GPU {need.gpu}: {error}; no GPU instance changed") from None
        done.append(f"VF {vf} released (no guest holds it) for MIG-backed {need.profile}")
    return done


def boot_needs(data: Mapping) -> Dict[str, Need]:
    """``{GPU: Need}`` from the boot data's ``gpus[].mig``; an entry not so shaped is skipped."""
    out: Dict[str, Need] = {}
    for entry in data.get("gpus") or []:
        wanted = entry.get("mig") if isinstance(entry, dict) else None
        if not isinstance(wanted, dict):
            continue
        address, profile = entry.get("address"), wanted.get("profile")
        instance, count = wanted.get("instance"), wanted.get("count")
        if isinstance(address, str) and _PCI.fullmatch(address) \
                and isinstance(profile, str) and isinstance(instance, str) \
                and re.fullmatch(r"[0-9]g\.[0-9]+gb(?:\+[a-z]+)?", instance) \
                and isinstance(count, int) and not isinstance(count, bool) and 0 < count <= 8:
            out[address] = Need(address, profile, instance, count)
        else:
            log.error("boot data: GPU entry %s has a mig entry the charm did not write: %s",
                      text.quote(address), text.quote(wanted, 80))
    return out


def at_boot(need: Need, until: float, attempts: int = 3, pause: float = 5) -> bool:
    """After the GPU's VFs are enabled: MIG mode on and the GPU instances back; True when they are.

    The mode is turned on whatever it was (the boot data's ``mig`` entry is the
    charm's intent): Hopper and Blackwell lose it at every reboot with the vGPU
    host driver (NVIDIA/gpu-admin-tools issue 2, cozystack/ansible-cozystack PR
    70), Ampere keeps it (MIG user guide, "Enable MIG Mode"). It comes after
    ``sriov-manage -e``, which rebinds the GPU and may wipe MIG state (Harvester's
    MIG-backed vGPU design note; StackHPC's vgpu role enables SR-IOV first). A mode
    left pending (another client held the GPU) gets ``-mig 1`` again, at most
    ``attempts`` runs with a growing ``pause``, as nvidia-smi's warning asks; never
    a GPU reset, which is refused once sriov-manage turned persistence mode on
    (NVIDIA/NVSentinel issue 1690). A failure is known at once: the caller gives
    the GPU's VFs no MIG-backed type rather than wait for one.
    """
    gpu = need.gpu

    def left() -> float:
        return max(1.0, min(mig.TIMEOUT, until - time.monotonic()))

    try:
        mode = mig.modes([gpu], left(), named=True)[gpu]  # other GPUs' modes may be changing now
        runs = 0
        while not mode.enabled:
            if runs == attempts or time.monotonic() >= until:
                log.error("GPU %s: MIG mode is still pending after %d run%s of %s: another client "
                          "uses the GPU; stop it, then run the charm's enable-mig action (or "
                          "systemctl restart %s); its GPU instances are not created%s", gpu, runs,
                          "" if runs == 1 else "s", mig.enable_command(gpu), "nvidia-vgpu-vfs.service",
                          mig.clients_said(gpu))
                return False
            if runs:
                time.sleep(max(0.0, min(pause * 2 ** (runs - 1), until - time.monotonic())))
            else:
                log.info("GPU %s: MIG mode is %s%s; turning it on for MIG-backed %s (%s): Hopper "
                         "and Blackwell lose it at every reboot", gpu, mode.current,
                         " (enabling pending)" if mode.enable_pending else "", need.profile,
                         mig.enable_command(gpu))
            runs += 1
            mode = mig.enable(gpu, left()).mode
        done = ensure(need, left())
    except MigError as error:
        log.error("GPU %s: %s", gpu, error)
        return False
    if not done:
        log.info("GPU %s: %d x %s GPU instances there already", gpu, need.gis, need.instance)
    return True
