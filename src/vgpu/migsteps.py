"""The hook's MIG steps: the GPU instances MIG-backed profiles need, MIG mode, the boot data.

Imported by :mod:`vgpu.reconcile` only where a MIG-backed profile is mapped
or planned (:func:`vgpu.profiles.mig_backed`), so that a host without one
never loads :mod:`vgpu.mig`. Each step takes the hook's shared state
(reconcile's ``_Hook``: the host's reading, the inputs, the problems said)
and does the MIG work through :mod:`vgpu.mig`:

- :func:`instances`: before the mapping is checked, the GPU instances it needs
  (what nova.conf lists first; a change only where no guest holds a VF);
- :func:`ready`: GPUs given MIG-backed profiles are in MIG mode;
- :func:`with_instances`: the boot data with each MIG-backed GPU's GPU instances.
"""

from __future__ import annotations

from typing import Any, Dict, Mapping, Sequence

from . import OPTION, bootdata, guests, mig, miginstances, sriov
from .errors import GuestsRunningError, MigError, MigInUseError


def instances(hook, mapping: Mapping[str, Sequence[str]]) -> None:
    """The GPU instances the mapping's MIG-backed profiles need, before it is checked.

    A VF lists a MIG-backed type only where a GPU instance has room for it
    (NVIDIA's vGPU for Compute guide, "Configuring a GPU for MIG-Backed
    vGPUs": on KVM the host creates them), so they are created first, on GPUs
    in MIG mode only (the status asks for the mode otherwise). A GPU whose
    profile the mapping changes (from what the boot data says is in force, as
    nova.conf lists it) changes only while no guest, running or shut off, holds
    one of its VFs: then the types the charm wrote there are released when their
    GPU instances stand in the way (see :func:`vgpu.miginstances.ensure`), as a
    time-sliced change goes through by itself. While a guest holds one, the GPU
    instances in force are restored first (after a reboot without the boot step
    the guest's own type must fit again) and the change waits: the VF step says
    which guests hold it. A GPU instance in use is never destroyed.

    Run by the hook (reconcile's ``_mig_instances``) only while the driver is
    installed, the unit is not paused and the mapping, valid, has a MIG-backed key.
    """
    here = hook.facts()
    wanted = miginstances.mapped(mapping, here.pci)
    if not wanted:
        return
    try:
        found = mig.modes(wanted)
    except MigError:
        return  # said by ready, with what MIG-backed profiles need
    hook.mig_modes = found  # what ready asks, read once per dispatch
    wanted = _driver_says(hook, wanted, mapping)
    applied = _applied_mig()
    changed = False
    for need in wanted.values():
        if found[need.gpu].enabled:
            try:
                changed = _gpu_instances(hook, need, applied.get(need.gpu)) or changed
            except MigInUseError as error:
                held = guests.vgpu_guests(error.vfs, defined=True)
                hook.problems.append(f"{error}" + (
                    f"; {GuestsRunningError(held, hook.given.unit)}" if held else ""))
            except MigError as error:
                hook.problems.append(str(error))
    if changed:
        hook.refresh()


def _driver_says(hook, wanted, mapping):
    """``wanted`` with the GPU instance profiles NVML names (on GPUs in MIG mode; see vgpu.mig)."""
    if not any((hook.mig_modes or {})[gpu].enabled for gpu in wanted):
        return wanted  # nothing is created out of MIG mode: the names suffice
    hook.mig_driver = miginstances.driver_profiles()
    return miginstances.mapped(mapping, hook.facts().pci, hook.mig_driver) or wanted


def _gpu_instances(hook, need, before) -> bool:
    """One GPU's part of :func:`instances` (``before``: the Need in force); True if changed."""
    if before is not None and (before.profile, before.instance) == (need.profile, need.instance):
        return bool(miginstances.ensure(need))
    gpu = hook.facts().pci.gpu(need.gpu)
    vfs = [vf.address for vf in gpu.vfs] if gpu is not None else []
    held = guests.vgpu_guests(vfs, defined=True)
    if held:
        hook.problems.append(
            f"{OPTION} not applied on GPU {need.gpu}: MIG-backed {need.profile} takes the place "
            f"of {before.profile if before is not None else 'what its VFs hold'}, and "
            f"{GuestsRunningError(held, hook.given.unit)}; move or delete those instances, or "
            "restore the mapping")
        # What nova.conf lists comes back first (after a reboot the guest's own type must fit).
        return before is not None and bool(miginstances.ensure(before))
    return bool(miginstances.ensure(need, releasable=vfs))


def _applied_mig() -> Dict[str, Any]:
    """``{GPU: miginstances.Need}`` the boot data keeps: the MIG-backed layout in force; {} when unknown.

    Unknown (no data, or data that cannot be read) makes every GPU count as
    changing: guests are asked about before anything is done.
    """
    try:
        return dict(miginstances.boot_needs(bootdata.load(f"/{sriov.DATA_FILE}")))
    except bootdata.DataError:
        return {}


def ready(hook, plan) -> bool:
    """GPUs given MIG-backed profiles are in MIG mode (the plan has some); nvidia-smi asked now."""
    problems = mig.mode_problems(mig.by_gpu(plan.assignments), hook.given.unit,
                                 hook.mig_modes)
    hook.problems.extend(problems)
    return not problems


def with_instances(data: dict, plan, host, driver=None) -> dict:
    """The boot data with each MIG-backed GPU's GPU instances (``gpus[].mig``, see vgpu.mig).

    ``driver``: what NVML said of each type's GPU instance profile in this hook.
    """
    wanted = miginstances.needs(plan.assignments, host, driver)
    for entry in data.get("gpus", []):
        if entry.get("address") in wanted:
            entry["mig"] = wanted[entry["address"]].data()
    return data
