"""The boot step of ``nvidia-vgpu-vfs.service``: VFs and their vGPU types back after a reboot.

systemd runs ``<the charm's python3> <charm>/src/vgpu_boot.py
/var/lib/nova-compute-nvidia-vgpu/boot.json`` after nvidia-vgpu-mgr and before
nova-compute and libvirt (see :mod:`vgpu.sriov`, which writes that file on
hooks). Each GPU is handled on its own, so one that fails never stops the
next:

1. the units in ``wait_for`` (the vGPU manager) are waited for, at most
   ``manager`` seconds, then the step goes on regardless;
2. a GPU given a MIG-backed profile (``gpus[].mig``, see :func:`vgpu.mig.at_boot`)
   first gets its MIG mode in force (a mode still pending after the reboot, as
   seen on Hopper, is put in force with ``nvidia-smi -r -i <GPU>``: nothing can
   use the GPU yet, libvirt and nova-compute start after this unit) and its GPU
   instances created again, as many as the data names: they never survive a
   reboot;
3. a GPU not bound to the ``nvidia`` driver is left alone; one without VFs
   gets ``sriov-manage -e``, retried ``attempts`` times with a growing pause;
4. each VF gets its profile by name: its id is looked up in the VF's
   ``nvidia/creatable_vgpu_types`` read right before the write (the list
   shrinks as siblings take types, and ids change between driver releases).
   A VF that lists nothing while no sibling holds a type is waited for (the
   manager is still starting); one that holds a type already is left alone.

5. on Nova before 30, each mdev an instance held when the charm last looked
   (the record :mod:`vgpu.mdevs` keeps beside the data file, ``mdevs.json``)
   is created again: its UUID written to its parent's
   ``mdev_supported_types/<type>/create``. One whose parent is gone, or whose
   type the parent no longer offers, is logged and skipped; one that exists
   already is left as it is.

Everything takes at most ``total`` seconds; each GPU gets an even share of
what is left. What it does, GPU by GPU and VF by VF, goes to stdout, which
systemd keeps in the journal (``journalctl -u nvidia-vgpu-vfs``). Exit status:
0 all restored, 1 something was not (the unit shows failed), 2 the data or the
mdev record could not be read (nothing done from it; the other is still used).
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sys
import time
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from . import (
    bootdata,
    bootresult,
    catalogue,
    hostlock,
    hostroot,
    kernel,
    mdevs,
    mig,
    pci,
    services,
    sriov,
    vfio,
)
from .bootdata import DataError, GpuPlan, Limits, VfPlan, load, parse
from .errors import HostBusyError, ServiceError, VfTypeError, VgpuError

log = logging.getLogger(__name__)

DATA_FILE = bootdata.DATA_FILE
_UNNAMED = re.compile(r"nvidia-[0-9]+\Z")
RESTORED, LEFT_ALONE, FAILED = "restored", "left alone", "not restored"
CREATED, THERE = "created", "there already"
MDEV_DEVICES = mdevs.MDEV_DEVICES


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
    """The VFs and types the data file ``where`` names, then the mdevs recorded beside it.

    All of it holding the host lock (:mod:`vgpu.hostlock`): a hook that runs
    meanwhile waits, or leaves its work to the next hook.
    """
    with contextlib.ExitStack() as lock:
        try:
            lock.enter_context(hostlock.held(hostlock.BOOT_WAIT))
        except HostBusyError as error:
            log.error("%s: a hook of the charm is changing the VFs; nothing restored (the charm's "
                      "next hook gives the VFs the types nova.conf lists)", error)
            return 1
        except OSError as error:  # no lock file (a link on the way): restoring matters more
            log.warning("cannot take the host lock /%s: %s; restoring without it", hostlock.FILE,
                        error.strerror or error)
        return _run(where)  # once, whatever it raises: never again outside the lock


def _run(where: str) -> int:
    started = time.monotonic()
    outcome: List[Tuple[str, str, float]] = []  # per GPU, for the exporter (vgpu.bootresult)
    try:
        data = load(where)
        _, wait_for, limits = parse(data)
    except DataError as error:
        log.error("%s: %s; nothing restored from it", where, error)
        status, wait_for, limits = 2, [], Limits()
    else:
        status = restore(data, outcome)
    record = os.path.join(os.path.dirname(where), mdevs.NAME)
    status = max(status, restore_mdevs(record, wait_for, started + limits.total, limits))
    took = time.monotonic() - started
    bootresult.save(bootresult.Result(time.time(), round(took, 3), status,
                                      bootresult.gpu_results(outcome)))
    return status


def restore(data: Mapping, done: Optional[List[Tuple[str, str, float]]] = None) -> int:
    """Enable the VFs and give them their types, as :mod:`vgpu.boot` describes; the exit status.

    ``done`` gets each GPU's (address, result, seconds taken).
    """
    gpus, wait_for, limits = parse(data)
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
    _wait_for(wait_for, min(deadline, time.monotonic() + limits.manager), limits.poll)
    outcome = {}
    instances = mig.boot_needs(data)  # MIG-backed GPUs: mode in force, GPU instances first
    for n, gpu in enumerate(gpus):
        began = time.monotonic()
        until = began + (deadline - began) / (len(gpus) - n)
        try:
            ready = gpu.address not in instances or mig.at_boot(instances[gpu.address], until)
            restored = _restore_gpu(gpu, until, limits)  # the VFs are enabled either way
            outcome[gpu.address] = restored if ready else FAILED
        except (VgpuError, OSError) as error:  # whatever it was, the next GPU still gets its turn
            log.error("GPU %s: %s", gpu.address, error)
            outcome[gpu.address] = FAILED
        done.append((gpu.address, outcome[gpu.address], time.monotonic() - began))
    summary = f"restored {sum(o == RESTORED for o in outcome.values())} of {len(gpus)} GPUs"
    for kind in (LEFT_ALONE, FAILED):
        named = [a for a, o in outcome.items() if o == kind]
        if named:
            summary += f"; {kind}: {', '.join(named)}"
    log.info("%s", summary)
    return 1 if FAILED in outcome.values() else 0


def _wait_for(units: Sequence[str], until: float, poll: float) -> None:
    """Wait until every unit is active, or ``until``; either way the boot step goes on."""
    if not units:
        return
    started = time.monotonic()
    names = ", ".join(units)
    while True:
        try:
            up = services.active(units)
        except (ServiceError, ValueError) as error:
            log.warning("cannot ask systemd about %s: %s", names, error)
            up = {}
        if up and all(up.values()):
            log.info("%s is active after %.1f s", names, time.monotonic() - started)
            return
        if time.monotonic() + poll > until:
            log.warning("%s not active after %.1f s: going on; sriov-manage may fail until it is",
                        names, time.monotonic() - started)
            return
        time.sleep(poll)


def _restore_gpu(gpu: GpuPlan, until: float, limits: Limits) -> str:
    entry = hostroot.text_path(pci.PCI_DEVICES, gpu.address)
    if not os.path.exists(entry):
        log.error("GPU %s: not found on this host", gpu.address)
        return FAILED
    try:
        driver: Optional[str] = os.path.basename(os.readlink(os.path.join(entry, "driver")))
    except OSError:
        driver = None
    if driver is None:
        log.error("GPU %s: bound to no driver (is the nvidia module loaded?): not restored",
                  gpu.address)
        return FAILED
    if driver != sriov.NVIDIA_DRIVER:
        log.warning("GPU %s: bound to %s, not nvidia: left alone (whole-GPU passthrough?)",
                    gpu.address, driver)
        return LEFT_ALONE
    present = _vf_count(entry)
    if present:
        log.info("GPU %s: %d virtual functions there already", gpu.address, present)
    elif not _enable(gpu.address, entry, until, limits):
        return FAILED
    if gpu.vfs:
        _learn_names()
    results = [_give(gpu.address, entry, vf, until, limits.poll) for vf in _mig_first(gpu.vfs)]
    return RESTORED if all(results) else FAILED


def _mig_first(vfs: Sequence[VfPlan]) -> List[VfPlan]:
    """Larger MIG-backed profiles first (their GPU instances have fewer starts), as on hooks.

    See :func:`vgpu.vfio.write_order`; time-sliced profiles keep virtfn order.
    """
    return sorted(vfs, key=lambda vf: (-getattr(pci.profile(vf.name), "slices", 0), vf.virtfn))


def _mig_hint(gpu: str, name: str) -> str:
    """What a MIG-backed profile that failed needs; '' for a time-sliced one."""
    if pci.mig_profile(name) is None:
        return ""
    return (f"; MIG-backed {pci.profile_name(name)} needs MIG mode and a GPU instance with room "
            f"on GPU {gpu} (nvidia-smi mig -i {mig.smi_address(gpu)} -lgi)")


def _learn_names() -> None:
    """Note what the VFs list now in the charm's table of type names (:mod:`vgpu.catalogue`).

    Right after a reboot the VFs are free and list every type by name: after a
    driver upgrade that renumbered them, the charm's next hook finds the new
    ids' names there even though the VFs, once full, list nothing.
    """
    try:
        catalogue.learn(pci.discover(), kernel.loaded_driver_version())
    except (VgpuError, OSError) as error:  # a bonus: never in the way of restoring
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
                  ", ".join(pci.profile_name(t.name) for t in listed), hint)
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
    short = pci.profile_name(wanted)
    found = [t for t in listed if pci.profile_name(t.name).upper() == short]
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
                  limits: Optional[Limits] = None) -> int:
    """Create again each mdev the record at host path ``where`` names; the exit status.

    Each one is handled on its own; waiting for the vGPU manager and for a
    parent's types to appear ends at ``until``. No record: nothing to do (0).
    """
    try:
        record = mdevs.load(hostroot.path(where))
    except (OSError, mdevs.RecordError) as error:
        log.error("%s: %s; no mdev created", where, getattr(error, "strerror", None) or error)
        return 2
    limits = limits or Limits()
    missing = [m for m in record if not os.path.lexists(_mdev_device(m.uuid))]
    if missing:
        _wait_for(wait_for, min(until, time.monotonic() + limits.manager), limits.poll)
    outcome: Dict[str, str] = {}
    for mdev in sorted(record, key=lambda m: (m.parent, m.uuid)):
        try:
            outcome[mdev.uuid] = _create_mdev(mdev, until, limits.poll)
        except OSError as error:  # whatever it was, the next mdev still gets its turn
            log.error("mdev %s: %s: not created", mdev.describe(), error)
            outcome[mdev.uuid] = FAILED
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


def _create_mdev(mdev: mdevs.Mdev, until: float, poll: float) -> str:
    """Write the mdev's uuid to its parent's type's ``create``; CREATED, THERE or FAILED."""
    what = f"mdev {mdev.describe()}"
    device = _mdev_device(mdev.uuid)
    if os.path.lexists(device):
        where = _mdev_where(device)
        if where == (mdev.parent, mdev.type_id):
            log.info("%s is there already on %s as %s", what, mdev.parent, mdev.type_id)
            return THERE
        log.error("%s is there already, on %s as %s, not on %s as %s: left as it is", what,
                  *(where or ("an unknown parent", "an unknown type")), mdev.parent, mdev.type_id)
        return FAILED
    parent = hostroot.text_path(pci.PCI_DEVICES, mdev.parent)
    if not os.path.exists(parent):
        log.error("%s: its parent %s is gone: not created", what, mdev.parent)
        return FAILED
    types = os.path.join(parent, "mdev_supported_types")
    while not os.path.isdir(types):  # the driver has not registered the parent yet
        if time.monotonic() + poll > until:
            log.error("%s: %s offers no mdev types (is the vGPU manager running?): not created",
                      what, mdev.parent)
            return FAILED
        time.sleep(poll)
    create = os.path.join(types, mdev.type_id, "create")
    if not os.path.exists(create):
        offered = sorted(n for n in os.listdir(types) if _UNNAMED.match(n))
        log.error("%s: %s no longer offers %s (it offers %s): not created", what, mdev.parent,
                  mdev.type_id, ", ".join(offered) or "none")
        return FAILED
    try:
        fd = os.open(create, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, mdev.uuid.encode("ascii"))
        finally:
            os.close(fd)
    except OSError as error:
        log.error("%s: %s refused it: %s: not created", what, hostroot.shown(create),
                  error.strerror or error)
        return FAILED
    log.info("%s created on %s as %s", what, mdev.parent, mdev.type_id)
    return CREATED


def _mdev_where(device: str) -> Optional[Tuple[str, str]]:
    """(parent address, type) of an existing mdev; None when sysfs does not say."""
    try:
        real = os.path.realpath(device, strict=True)
        type_dir = os.path.realpath(os.path.join(real, "mdev_type"), strict=True)
    except OSError:
        return None
    return os.path.basename(os.path.dirname(real)), os.path.basename(type_dir)
