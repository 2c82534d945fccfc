"""The boot step of ``nvidia-vgpu-vfs.service``: VFs, MIG and vGPU types back after a reboot.

systemd runs ``<the charm's python3> <charm>/src/vgpu_boot.py
/var/lib/nova-compute-nvidia-vgpu/boot.json`` after nvidia-vgpu-mgr and before
nova-compute and libvirt (see :mod:`vgpu.sriov`, which writes that file on
hooks). In this order (every working implementation enables the VFs first:
``sriov-manage -e`` rebinds the GPU and may wipe its MIG state, Harvester's
MIG-backed vGPU design note and StackHPC's vgpu role; gpu-operator PR 2603
resets only GPUs without VFs):

1. the units in ``wait_for`` (the vGPU manager) are waited for first, at most
   ``manager`` seconds, then the step goes on regardless; one systemd calls
   ``failed`` ends the wait, and the step does what it can within
   :data:`MANAGER_FAILED_BUDGET`, then fails saying so;
2. one GPU at a time (two ``sriov-manage`` runs at once race on pci-pf-stub's
   id table and leave a GPU unbound: StackHPC's nvidia-sriov.service.j2 orders
   each GPU's unit after the previous one; :func:`vgpu.sriov.enable_one`): a
   GPU bound to another driver than ``nvidia`` is left alone; one a failed run
   left unbound is bound to nvidia again (:func:`vgpu.sriov.rebind`); one
   without VFs gets ``sriov-manage -e``, retried ``attempts`` times with a
   growing pause, within an even share of the time left;
3. then GPUs side by side, at most ``parallel`` at once, each in a thread of
   its own, so that one that fails or hangs never stops or delays another:
   a GPU given a MIG-backed profile (``gpus[].mig``, see :func:`vgpu.miginstances.at_boot`)
   gets its MIG mode turned on, whatever it was (Hopper and Blackwell lose it at
   every reboot with the vGPU host driver; Ampere keeps it), and its GPU
   instances created again (they never survive a reboot). Never a GPU reset:
   one is refused once sriov-manage turned persistence mode on. Each nvidia-smi
   call names its GPU (``-i``), and the charm's exporter (an NVML client) is
   stopped meanwhile (:mod:`vgpu.gpuclients`). When either fails, the GPU's VFs
   get no type now: that is known at once, nothing is waited for;
4. once every GPU is through 2 and 3, each VF gets its profile by name: its id
   is looked up in the VF's ``nvidia/creatable_vgpu_types`` read right before
   the write (the list shrinks as siblings take types, and ids change between
   driver releases). A VF that lists nothing while no sibling holds a type is
   waited for (the manager is still starting); one that holds a type already is
   left alone.

5. on Nova before 30, each mdev an instance held when the charm last looked
   (the record :mod:`vgpu.mdevs` keeps beside the data file, ``mdevs.json``)
   is created again: its UUID written to its parent's
   ``mdev_supported_types/<type>/create``. One whose parent is gone, or whose
   type the parent no longer offers, is logged and skipped; one that exists
   already is left as it is.

Everything takes at most ``total`` seconds. What it does, GPU by GPU and VF by
VF, goes to stdout, which systemd keeps in the journal (``journalctl -u
nvidia-vgpu-vfs``). Then it leaves its mark (:mod:`vgpu.bootfile`): when it
could not run (a hook held the host lock longer than it waits) or left
something undone, the next hook does the work (:func:`catch_up`). Exit status:
0 all restored (by it, or by the hook that held the lock: the mark says so),
1 something was not (the unit shows failed), 2 the data or the mdev record
could not be read (nothing done from it; the other is still used). Whatever
one GPU's steps raise fails that GPU alone, its traceback logged (:func:`_timed`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Sequence, Tuple

from . import (
    bootdata,
    bootfile,
    bootresult,
    catalogue,
    hostlock,
    hostroot,
    kernel,
    mdevs,
    pci,
    profiles,
    services,
    sriov,
    vfio,
)
from .bootdata import DataError, GpuPlan, Limits, VfPlan, load, parse
from .errors import HostBusyError, ServiceError, VfTypeError, VgpuError

if TYPE_CHECKING:
    from . import miginstances

log = logging.getLogger(__name__)

DATA_FILE = bootdata.DATA_FILE
_UNNAMED = re.compile(r"nvidia-[0-9]+\Z")
RESTORED, LEFT_ALONE, FAILED = "restored", "left alone", "not restored"
READY = "ready"  # through VFs and MIG: its VFs get their types next
CREATED, THERE = "created", "there already"
MDEV_DEVICES = mdevs.MDEV_DEVICES
# A hook doing the boot step's work (catch_up) holds the host lock in a hook: shorter bounds,
# no waiting for the vGPU manager (the hook's status names a daemon that is down), one
# sriov-manage run (the hook's own step enabled the VFs just before, see vgpu.reconcile).
HOOK_LIMITS = Limits(total=120, manager=0, call=60, attempts=1, delay=1, poll=1)
# When systemd says the vGPU manager failed (not merely still starting), the boot step does what
# it can within this many seconds, then fails: the unit runs Before= libvirtd and nova-compute,
# and no guest can use a vGPU while the manager is down anyway (issue 33.5).
MANAGER_FAILED_BUDGET = 60.0


def main(argv: Sequence[str]) -> int:
    """Restore what the data file ``argv[0]`` names; every step is logged to stdout."""
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter("%(message)s"))
    package = logging.getLogger("vgpu")
    level = package.level
    package.addHandler(handler)
    package.setLevel(logging.INFO)
    try:
        if len(argv) != 1:
            log.error("usage: vgpu_boot.py <boot data file>")
            return 2
        return run(argv[0])
    finally:
        package.removeHandler(handler)
        package.setLevel(level)


def run(where: str) -> int:
    """The VFs, MIG and types the data file ``where`` names, then the mdevs recorded beside it.

    All of it holding the host lock (:mod:`vgpu.hostlock`): a hook that runs
    meanwhile waits, or leaves its work to the next hook. When the lock cannot
    be had, nothing is done and no mark is left: the hook holding it, or the
    next one, does the work (:func:`catch_up`); the two never wait on each other.
    The exit status is then 0 only when the mark shows that work done since
    this boot with everything restored (:func:`_busy`).
    """
    with contextlib.ExitStack() as lock:
        try:
            lock.enter_context(hostlock.held(hostlock.BOOT_WAIT))
        except HostBusyError as error:
            return _busy(error)
        except OSError as error:  # no lock file (a link on the way): restoring matters more
            log.warning("cannot take the host lock /%s: %s; restoring without it", hostlock.FILE,
                        error.strerror or error)
        return _run(where, bootfile.BY_BOOT)  # once, whatever it raises: never again outside the lock


def _busy(error: HostBusyError) -> int:
    """The exit status when the lock could not be had: 0 once the mark says the work is done."""
    done = bootfile.mark()
    if done is None:
        log.error("%s: a hook of the charm is changing the host; nothing restored here: that "
                  "hook, or the next, does this step's work (VFs, MIG mode, GPU instances, "
                  "types and mdevs)", error)
        return 1
    by, status = done
    if status:
        log.error("%s: %s did this step's work since this boot but could not restore everything: "
                  "the unit's status names what is missing", error, by)
        return 1
    log.info("%s: %s did this step's work since this boot (VFs, MIG mode, GPU instances, types "
             "and mdevs): nothing left to do here", error, by)
    return 0


def catch_up(again: bool = False) -> None:
    """In a hook holding the host lock: the boot step's work, when it was not done since this boot.

    Done when there is no mark (:mod:`vgpu.bootfile`): the boot step could not
    run, has not yet (doing it twice changes nothing), or left something not
    restored (tried once more); ``again``: the hook enabled VFs itself, which
    may have wiped MIG state. VFs are left to the hook's own sriov-manage step,
    the rest (MIG mode, GPU instances, types, mdevs) is done as at boot, within
    :data:`HOOK_LIMITS`; then the mark.
    """
    if bootfile.done() and not again:
        return
    log.info("%s: doing the boot step's work now", "this hook enabled VFs" if again else
             "the boot step's work was not all done since this boot")
    _run(f"/{DATA_FILE}", bootfile.BY_HOOK, HOOK_LIMITS)


def _run(where: str, by: str, limits: Optional[Limits] = None) -> int:
    started = time.monotonic()
    hook = limits is not None
    outcome: List[Tuple[str, str, float]] = []  # per GPU, for the exporter (vgpu.bootresult)
    try:
        data = load(where)
        _, wait_for, given = parse(data)
    except DataError as error:
        if not hook or os.path.lexists(hostroot.path(where)):  # a hook without it: nothing mapped yet
            log.error("%s: %s; nothing restored from it", where, error)
        data, wait_for, given = None, [], Limits()
    bounds = limits or given
    try:
        status = 0 if data is None else restore(data, bounds, enable_vfs=not hook, done=outcome)
    except Exception:  # noqa: BLE001 -- a defect outside any GPU's steps: still the mark and result
        log.exception("the boot step's restore stopped on an unexpected error")
        status = 1
    if data is None and not hook:
        status = 2
    record = os.path.join(os.path.dirname(where), mdevs.NAME)
    left: List[dict] = []
    status = max(status, restore_mdevs(record, [] if hook else wait_for, started + bounds.total,
                                       bounds, left))
    try:
        bootfile.write(by, status, left)
    except OSError as error:  # the next hook does it again: harmless, it changes nothing
        log.warning("cannot leave the mark /%s: %s", bootfile.MARK, error.strerror or error)
    if data is not None or not hook:  # a hook with nothing mapped restored nothing: no result
        bootresult.save(bootresult.Result(time.time(), round(time.monotonic() - started, 3), status,
                                          bootresult.gpu_results(outcome), bootresult.RUN_BY[by]))
    return status


def restore(data: Mapping, limits: Optional[Limits] = None, enable_vfs: bool = True,
            done: Optional[List[Tuple[str, str, float]]] = None) -> int:
    """Enable the VFs, MIG and the types, as :mod:`vgpu.boot` describes; the exit status.

    ``limits``: the data's own when None. ``enable_vfs`` False (a hook): a GPU
    without VFs is not enabled here. ``done`` gets each GPU's (address, result,
    seconds it took).
    """
    gpus, wait_for, given = parse(data)
    limits = limits or given
    done = [] if done is None else done
    if not gpus:
        log.info("no virtual functions to restore: vgpu-device-mappings selects no SR-IOV GPU")
        return 0
    deadline = time.monotonic() + limits.total
    if not kernel.iommu_enabled():
        log.error("IOMMU is off: no virtual function can be enabled; nothing restored "
                  "(see the charm's status)")
        done.extend((gpu.address, FAILED, 0.0) for gpu in gpus)
        return 1
    failed = _wait_for(wait_for, min(deadline, time.monotonic() + limits.manager),
                       limits.poll) if limits.manager else []
    if failed:
        deadline = min(deadline, time.monotonic() + MANAGER_FAILED_BUDGET)
    needs = _mig_needs(data)  # MIG-backed GPUs: mode and GPU instances after their VFs
    took: Dict[str, float] = {}  # seconds per GPU; each thread adds to its own GPU's only
    # sriov-manage one GPU at a time, every GPU's before any MIG step: it races another run on
    # pci-pf-stub's id table and runs nvidia-smi -pm 1 on every GPU (vgpu.sriov.enable_one).
    prepared: Dict[str, str] = {}
    for n, gpu in enumerate(gpus):
        share = time.monotonic() + (deadline - time.monotonic()) / (len(gpus) - n)
        prepared[gpu.address] = _timed(took, gpu, _prepare, gpu, share, limits, enable_vfs)
    with ThreadPoolExecutor(max_workers=min(len(gpus), limits.parallel),
                            thread_name_prefix="vgpu-boot") as pool:
        enabled = [gpu for gpu in gpus if prepared[gpu.address] == READY]
        with _clients_stopped([needs[g.address].gpu for g in enabled if g.address in needs]):
            prepared.update(zip((g.address for g in enabled), pool.map(
                lambda gpu: _timed(took, gpu, _mig_step, gpu, needs.get(gpu.address), deadline,
                                   limits), enabled)))
        ready = [gpu for gpu in gpus if prepared[gpu.address] == READY]
        if any(gpu.vfs for gpu in ready):
            _learn_names()  # once, while the VFs are free: before any type is written
        given_types = dict(zip((g.address for g in ready), pool.map(
            lambda gpu: _timed(took, gpu, _give_types, gpu, deadline, limits.poll), ready)))
    outcome = {a: given_types.get(a, o) for a, o in prepared.items()}
    done.extend((a, o, took.get(a, 0.0)) for a, o in outcome.items())
    summary = f"restored {sum(o == RESTORED for o in outcome.values())} of {len(gpus)} GPUs"
    for kind in (LEFT_ALONE, FAILED):
        named = [a for a, o in outcome.items() if o == kind]
        if named:
            summary += f"; {kind}: {', '.join(named)}"
    if failed:
        summary += (f"; the vGPU manager {', '.join(failed)} failed: "
                    f"journalctl -u {' -u '.join(failed)} says why")
    (log.error if failed else log.info)("%s", summary)
    return 1 if FAILED in outcome.values() or failed else 0


def _mig_needs(data: Mapping) -> Dict[str, "miginstances.Need"]:
    """The data's ``gpus[].mig`` entries; MIG's tables are imported only where there are some."""
    if not any(isinstance(entry, dict) and "mig" in entry for entry in data.get("gpus") or ()):
        return {}
    from . import miginstances

    return miginstances.boot_needs(data)


def _timed(took: Dict[str, float], gpu: GpuPlan, step, *args) -> str:
    """``step(*args)``, what it raised logged as the GPU's failure: the others still get their turn.

    Any exception, not only the expected ones (issue 34.4): one GPU's surprise
    fails that GPU alone, its traceback in the journal, and the other GPUs, the
    mark and the boot result still come. The time it took is added to the GPU's
    in ``took`` (the boot result's seconds).
    """
    began = time.monotonic()
    try:
        return step(*args)
    except (VgpuError, OSError) as error:
        log.error("GPU %s: %s", gpu.address, error)
        return FAILED
    except Exception as error:  # noqa: BLE001 -- a defect of ours: this GPU fails, not the boot
        log.exception("GPU %s: unexpected error: %s: %s", gpu.address, type(error).__name__,
                      error)
        return FAILED
    finally:
        took[gpu.address] = took.get(gpu.address, 0.0) + time.monotonic() - began


def _wait_for(units: Sequence[str], until: float, poll: float) -> List[str]:
    """Wait until every unit is active, or ``until``; either way the boot step goes on.

    A unit systemd calls ``failed`` (not ``activating``: still starting) ends the
    wait at once: the units that failed are returned, and said with how to see why.
    """
    if not units:
        return []
    started = time.monotonic()
    names = ", ".join(units)
    while True:
        try:
            states = services.states(units)
        except (ServiceError, ValueError) as error:
            log.warning("cannot ask systemd about %s: %s", names, error)
            states = {}
        failed = [unit for unit, state in states.items() if state == "failed"]
        if failed:
            log.error("%s failed (systemd says so): no VF can take a vGPU type until it runs; "
                      "journalctl -u %s says why; doing what can be done within %g s, then "
                      "failing", ", ".join(failed), " -u ".join(failed), MANAGER_FAILED_BUDGET)
            return failed
        if states and all(state in ("active", "reloading") for state in states.values()):
            log.info("%s is active after %.1f s", names, time.monotonic() - started)
            return []
        if time.monotonic() + poll > until:
            log.warning("%s not active after %.1f s: going on; sriov-manage may fail until it is",
                        names, time.monotonic() - started)
            return []
        time.sleep(poll)


def _prepare(gpu: GpuPlan, until: float, limits: Limits, enable_vfs: bool) -> str:
    """The GPU's VFs (one GPU at a time): READY, or why its VFs get no type.

    A GPU left unbound (no driver, or pci-pf-stub) by a failed sriov-manage run
    is bound to nvidia again first (:func:`vgpu.sriov.rebind`); one bound to
    another driver (vfio-pci: whole-GPU passthrough) is left alone.
    """
    entry = hostroot.text_path(pci.PCI_DEVICES, gpu.address)
    if not os.path.exists(entry):
        log.error("GPU %s: not found on this host", gpu.address)
        return FAILED
    driver = sriov.driver_of(gpu.address)
    if not sriov.ours(driver):
        log.warning("GPU %s: bound to %s, not nvidia: left alone (whole-GPU passthrough?)",
                    gpu.address, driver)
        return LEFT_ALONE
    if sriov.unbound(driver):
        why = sriov.rebind(gpu.address)
        if why:
            log.error("GPU %s: %s; not restored", gpu.address, why)
            return FAILED
    present = _vf_count(entry)
    if present:
        log.info("GPU %s: %d virtual functions there already", gpu.address, present)
    elif not enable_vfs:
        log.error("GPU %s: no virtual functions (this hook's sriov-manage -e did not make them; "
                  "see the status): its vGPU types are not restored", gpu.address)
        return FAILED
    elif not _enable(gpu.address, entry, until, limits):
        return FAILED
    return READY


def _mig_step(gpu: GpuPlan, need: Optional[miginstances.Need], until: float, limits: Limits) -> str:
    """Once every GPU's VFs are there, side by side: its MIG mode and GPU instances."""
    if need is not None and not _mig_at_boot(need, until, limits):
        log.error("GPU %s: its VFs get no MIG-backed type now: %s needs MIG mode and %d x %s GPU "
                  "instances (nvidia-smi mig -i %s -lgi)", gpu.address, need.profile, need.gis,
                  need.instance, _smi_address(gpu.address))
        return FAILED
    return READY


def _clients_stopped(addresses: Sequence[str]):
    """The charm's exporter stopped while MIG modes change (it holds the GPUs through NVML).

    Only when a GPU given a MIG-backed profile is out of MIG mode (one query of
    every GPU, no ``-i``), or that cannot be told; once for all GPUs, whose MIG
    steps then run side by side. Started again with ``--no-block``: its unit is
    ordered after this one (:mod:`vgpu.gpuclients`).
    """
    if not addresses:
        return contextlib.nullcontext()
    from . import gpuclients, mig

    try:
        if all(mode.enabled for mode in mig.modes(addresses).values()):
            return contextlib.nullcontext()
    except VgpuError:
        pass  # at_boot says why for each GPU; the exporter is stopped all the same
    return gpuclients.ours_stopped(wait=False)


def _mig_at_boot(need: "miginstances.Need", until: float, limits: Limits) -> bool:
    from . import miginstances

    return miginstances.at_boot(need, until, limits.attempts, limits.delay)


def _smi_address(address: str) -> str:
    from . import mig

    return mig.smi_address(address)


def _give_types(gpu: GpuPlan, until: float, poll: float) -> str:
    """Each VF of a READY GPU its profile: RESTORED when all hold one."""
    entry = hostroot.text_path(pci.PCI_DEVICES, gpu.address)
    results = [_give(gpu.address, entry, vf, until, poll) for vf in _mig_first(gpu.vfs)]
    return RESTORED if all(results) else FAILED


def _mig_first(vfs: Sequence[VfPlan]) -> List[VfPlan]:
    """Larger MIG-backed profiles first (their GPU instances have fewer starts), as on hooks.

    See :func:`vgpu.vfio.write_order`; time-sliced profiles keep virtfn order.
    """
    return sorted(vfs, key=lambda vf: (-getattr(profiles.profile(vf.name), "slices", 0), vf.virtfn))


def _mig_hint(gpu: str, name: str) -> str:
    """What a MIG-backed profile that failed needs; '' for a time-sliced one."""
    if profiles.mig_profile(name) is None:
        return ""
    return (f"; MIG-backed {profiles.profile_name(name)} needs MIG mode and a GPU instance with room "
            f"on GPU {gpu} (nvidia-smi mig -i {_smi_address(gpu)} -lgi)")


def _learn_names() -> None:
    """Note what the VFs list now in the charm's table of type names (:mod:`vgpu.catalogue`).

    Right after a reboot the VFs are free and list every type by name: after a
    driver upgrade that renumbered them, the charm's next hook finds the new
    ids' names there even though the VFs, once full, list nothing.
    """
    try:
        catalogue.learn(pci.discover(), kernel.loaded_driver_version())
    except Exception as error:  # noqa: BLE001 -- a bonus: never in the way of restoring
        log.warning("the vGPU type names the VFs list were not noted: %s", error)


def _vf_count(entry: str) -> int:
    try:
        return sum(name.startswith("virtfn") for name in os.listdir(entry))
    except OSError:
        return 0


def _enable(address: str, entry: str, until: float, limits: Limits) -> bool:
    """``sriov-manage -e``, retried with a growing pause; True once the VFs are there."""
    attempt = 0
    while attempt < limits.attempts:
        left = until - time.monotonic()
        if left < sriov.MIN_CALL:
            log.error("GPU %s: no time left for sriov-manage -e", address)
            break
        attempt += 1
        why = sriov.enable_one(address, min(limits.call, left))
        count = _vf_count(entry)
        if not why and count:
            log.info("GPU %s: %d virtual functions enabled by sriov-manage -e (attempt %d)",
                     address, count, attempt)
            return True
        log.warning("GPU %s: sriov-manage -e attempt %d of %d failed: %s", address, attempt,
                    limits.attempts, why or "it succeeded but no virtual function appeared")
        if attempt < limits.attempts:
            time.sleep(max(0.0, min(limits.delay * 2 ** (attempt - 1), until - time.monotonic())))
    log.error("GPU %s: no virtual functions after %d attempt%s; its vGPU types are not restored",
              address, attempt, "" if attempt == 1 else "s")
    return False


def _give(gpu: str, entry: str, vf: VfPlan, until: float, poll: float) -> bool:
    """Give one VF its profile, found by name in what it lists now; True when it holds one."""
    try:
        address = os.path.basename(os.readlink(os.path.join(entry, f"virtfn{vf.virtfn}")))
    except OSError:
        log.error("GPU %s: has no virtfn%d: %s not given", gpu, vf.virtfn, vf.name)
        return False
    where = f"GPU {gpu}: VF {address} (virtfn{vf.virtfn})"
    hint = _mig_hint(gpu, vf.name)
    while True:
        try:
            holds = vfio.held(address)
            listed: Optional[Tuple[pci.VgpuType, ...]] = vfio.creatable(address)
            why = "lists nothing creatable"
        except VfTypeError as error:  # no nvidia/ files yet: the manager is still starting
            holds, listed, why = 0, None, str(error)
        if holds:
            log.info("%s holds nvidia-%d already: left as it is", where, holds)
            return True
        if listed:
            return _write(where, address, vf, listed, hint)
        if (listed is not None and _siblings_hold(entry)) or time.monotonic() + poll > until:
            log.error("%s %s: %s not given%s", where, why, vf.name, hint)
            return False
        time.sleep(poll)


def _write(where: str, address: str, vf: VfPlan, listed: Sequence[pci.VgpuType],
           hint: str = "") -> bool:
    found = named(vf, listed)
    if found is None:
        log.error("%s does not list %s; it lists %s%s", where, vf.name,
                  ", ".join(profiles.profile_name(t.name) for t in listed), hint)
        return False
    try:
        vfio.assign(address, found.number)
    except VfTypeError as error:
        log.error("%s: %s%s", where, error, hint)
        return False
    log.info("%s now holds %s (nvidia-%d)", where, found.name, found.number)
    return True


def named(vf: VfPlan, listed: Sequence[pci.VgpuType]) -> Optional[pci.VgpuType]:
    """The listed type ``vf.name`` names: the driver's name, else the one profile of that name.

    A type the charm never saw named (``nvidia-1139``) is taken by its id, as
    the only thing known of it.
    """
    wanted = " ".join(vf.name.split()).upper()
    for vgpu_type in listed:
        if " ".join(vgpu_type.name.split()).upper() == wanted:
            return vgpu_type
    short = profiles.profile_name(wanted)
    found = [t for t in listed if profiles.profile_name(t.name).upper() == short]
    if len(found) == 1:
        return found[0]
    if _UNNAMED.match(vf.name):
        return next((t for t in listed if t.number == vf.number), None)
    return None


def _siblings_hold(entry: str) -> bool:
    """Whether any VF of the GPU holds a type (then an empty list means full, not starting)."""
    for name in os.listdir(entry):
        if name.startswith("virtfn"):
            try:
                if vfio.held(os.path.basename(os.readlink(os.path.join(entry, name)))):
                    return True
            except (OSError, VfTypeError):
                continue
    return False


def restore_mdevs(where: str, wait_for: Sequence[str], until: float,
                  limits: Optional[Limits] = None, left: Optional[List[dict]] = None) -> int:
    """Create again each mdev the record at host path ``where`` names; the exit status.

    Each one is handled on its own; waiting for the vGPU manager and for a
    parent's types to appear ends at ``until``. No record: nothing to do (0).
    ``left`` collects each one not created (uuid, parent, type, why) for the mark.
    """
    try:
        record = mdevs.load(hostroot.path(where))
    except (OSError, mdevs.RecordError) as error:
        log.error("%s: %s; no mdev created", where, getattr(error, "strerror", None) or error)
        return 2
    limits = limits or Limits()
    missing = [m for m in record if not os.path.lexists(_mdev_device(m.uuid))]
    if missing and _wait_for(wait_for, min(until, time.monotonic() + limits.manager), limits.poll):
        until = min(until, time.monotonic() + MANAGER_FAILED_BUDGET)  # no types will come
    outcome: Dict[str, str] = {}
    for mdev in sorted(record, key=lambda m: (m.parent, m.uuid)):
        try:
            outcome[mdev.uuid], why = _create_mdev(mdev, until, limits.poll)
        except OSError as error:  # whatever it was, the next mdev still gets its turn
            outcome[mdev.uuid], why = _not_created(f"mdev {mdev.describe()}", str(error))
        if outcome[mdev.uuid] == FAILED and left is not None:
            left.append({"uuid": mdev.uuid, "parent": mdev.parent, "type": mdev.type_id,
                         "why": why})
    if not record:
        return 0
    summary = (f"mdevs: created {sum(o == CREATED for o in outcome.values())}, "
               f"there already {sum(o == THERE for o in outcome.values())}, of {len(record)}")
    failed = [uuid for uuid, o in outcome.items() if o == FAILED]
    if failed:
        summary += f"; not created: {', '.join(failed)}"
    log.info("%s", summary)
    return 1 if failed else 0


def _mdev_device(uuid: str) -> str:
    return hostroot.text_path(MDEV_DEVICES, uuid)


def _create_mdev(mdev: mdevs.Mdev, until: float, poll: float) -> Tuple[str, str]:
    """Write the mdev's uuid to its parent's type's ``create``: (CREATED, THERE or FAILED, why)."""
    what = f"mdev {mdev.describe()}"
    device = _mdev_device(mdev.uuid)
    if os.path.lexists(device):
        where = _mdev_where(device)
        if where == (mdev.parent, mdev.type_id):
            log.info("%s is there already on %s as %s", what, mdev.parent, mdev.type_id)
            return THERE, ""
        return _not_created(what, "is there already, on {} as {}, not on {} as {}: left as it is"
                            .format(*(where or ("an unknown parent", "an unknown type")),
                                    mdev.parent, mdev.type_id), f"{what} ")
    parent = hostroot.text_path(pci.PCI_DEVICES, mdev.parent)
    if not os.path.exists(parent):
        return _not_created(what, f"its parent {mdev.parent} is gone")
    types = os.path.join(parent, "mdev_supported_types")
    while not os.path.isdir(types):  # the driver has not registered the parent yet
        if time.monotonic() + poll > until:
            return _not_created(what, f"{mdev.parent} offers no mdev types (is the vGPU manager "
                                      "running?)")
        time.sleep(poll)
    create = os.path.join(types, mdev.type_id, "create")
    if not os.path.exists(create):
        offered = sorted(n for n in os.listdir(types) if _UNNAMED.match(n))
        return _not_created(what, f"{mdev.parent} no longer offers {mdev.type_id} (it offers "
                                  f"{', '.join(offered) or 'none'})")
    try:
        fd = os.open(create, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, mdev.uuid.encode("ascii"))
        finally:
            os.close(fd)
    except OSError as error:
        return _not_created(what, f"{hostroot.shown(create)} refused it: "
                                  f"{error.strerror or error}")
    log.info("%s created on %s as %s", what, mdev.parent, mdev.type_id)
    return CREATED, ""


def _not_created(what: str, why: str, joined: str = "") -> Tuple[str, str]:
    """Log why the mdev ``what`` is not created; (FAILED, why)."""
    if joined:
        log.error("%s%s", joined, why)
    else:
        log.error("%s: %s: not created", what, why)
    return FAILED, why


def _mdev_where(device: str) -> Optional[Tuple[str, str]]:
    """(parent address, type) of an existing mdev; None when sysfs does not say."""
    try:
        real = os.path.realpath(device, strict=True)
        type_dir = os.path.realpath(os.path.join(real, "mdev_type"), strict=True)
    except OSError:
        return None
    return os.path.basename(os.path.dirname(real)), os.path.basename(type_dir)
