"""What the unit's status says, from facts gathered beforehand: pure, no ops, no host access.

The charm reads the host, the option, the relation, the attached package and
the services' states first (every command and file read happens there), puts
the answers in :class:`Inputs` and calls :func:`statuses`. What comes back is
a list of ``(kind, message)`` pairs, in order, with ``kind`` one of
``blocked``, ``maintenance``, ``waiting`` or ``active``; the charm turns each
into the matching ops status and Juju shows the most severe.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import List, Mapping, Optional, Tuple

from . import OPTION, PCI_IN_PLACEMENT, RELATION, driver, kernel, mappings, sriov, text
from .facts import Facts
from .record import NamedTuple

BLOCKED = "blocked"
MAINTENANCE = "maintenance"
WAITING = "waiting"
ACTIVE = "active"

Status = Tuple[str, str]  # (kind, message)

# Why [pci] report_in_placement is still published (an active note).
REPORTING_KEPT = (f"{PCI_IN_PLACEMENT} is off but [pci] report_in_placement stays True: Nova "
                  "refuses to start once it is turned off after devices were reported (README: "
                  "Removal)")


class Services(NamedTuple):
    """What ``systemctl`` answered about the driver's services (nothing asked: all empty)."""

    down: Tuple[str, ...] = ()  # not doing their job (see services.down)
    masked: Tuple[str, ...] = ()  # of those, the masked ones
    error: Optional[str] = None  # why systemctl could not answer


class Inputs(NamedTuple):
    """Everything the status depends on, read before :func:`statuses` is called.

    Only ``facts`` to ``problems`` are needed when :func:`checks_host` is False;
    the rest matters only when it is True.
    """

    facts: Facts  # what the host says (devices, packages, modules)
    app: str  # this application's name, as deployed, for the integrate command
    related: bool  # whether the nova-vgpu relation exists
    forced: bool  # force-install-nvidia-vgpu
    published: Mapping[str, Tuple[str, ...]]  # the mapping nova-compute has now
    problems: Tuple[str, ...] = ()  # blocked messages from this hook's work
    principal: str = "nova-compute"  # the principal's application name, as deployed
    unit: str = ""  # this unit's name (gpu-a/0), for the actions to run; "" if unknown
    reporting_kept: bool = False  # report_in_placement published though pci-in-placement is off
    validation: Optional[mappings.Validation] = None
    capacity: str = ""  # usage per published type, "" when nothing to count
    attached: Optional[driver.DebInfo] = None  # the attached driver package
    attached_missing: Optional[str] = None  # why no package is attached
    attached_invalid: Optional[str] = None  # why the attached file is no driver package
    order: Optional[int] = None  # attached vs installed version, as dpkg orders them
    order_error: Optional[str] = None  # why they could not be compared
    paused: bool = False
    masked_by_us: Tuple[str, ...] = ()  # what this charm's pause masked
    services: Services = Services()
    vf_failures: Mapping[str, str] = MappingProxyType({})  # GPU address -> why sriov-manage failed
    vf_selected: Optional[Tuple[str, ...]] = None  # SR-IOV GPUs the mapping selects (None: all)
    vf_refused: Mapping[str, str] = MappingProxyType({})  # selected GPU -> why it is left alone
    boot_unit_masked: bool = False  # the operator masked the boot-time unit
    mapped: Tuple[str, ...] = ()  # the addresses vgpu-device-mappings names (read when one is missing)
    neighbour_notes: Tuple[str, ...] = ()  # what other subordinates lost beside us (vgpu.neighbours)
    secure_boot: Optional[kernel.SecureBoot] = None  # read while the vGPU module is not loaded
    notes: Tuple[str, ...] = ()  # said once, by the hook that did it (the upstream charm taken over)


def checks_host(facts: Facts, forced: bool, published: Mapping[str, Tuple[str, ...]]) -> bool:
    """Whether the status goes past 'nothing to do' or 'keeping'.

    Only then do the mapping, the driver, the services and the capacity
    matter (and get read).
    """
    return bool(facts.pci.gpus) or (forced and not published)


def statuses(inputs: Inputs) -> List[Status]:
    """Every status that applies, in order; Juju shows the most severe, the first of equals."""
    out: List[Status] = [(BLOCKED, problem) for problem in inputs.problems]
    if not checks_host(inputs.facts, inputs.forced, inputs.published):
        out.append(_idle(inputs))
        return out
    out.extend(_prerequisites(inputs))
    vanished = missing_status(inputs)
    if vanished is not None:  # before the mapping's errors: it says why they arise
        out.append(vanished)
    validation = inputs.validation
    if validation is not None and not validation.ok:
        out.append((BLOCKED, mapping_message(validation, inputs.published)))
    notes: List[str] = []
    out.extend(_vf_statuses(inputs))
    if validation is not None and validation.plan is not None:
        notes.extend(validation.plan.notes)
        if not inputs.published and validation.plan.unoffered:  # the serving message says it
            from . import plan as plans  # already imported: the plan was built

            said = {plans.unoffered_note(key) for key in validation.plan.unoffered}
            notes[:] = [n for n in notes if n not in said]
    if inputs.reporting_kept:
        notes.append(REPORTING_KEPT)
    if inputs.boot_unit_masked:
        notes.append(f"{sriov.UNIT} is masked: VFs and vGPU types are not restored at boot")
    notes.extend(inputs.neighbour_notes)
    notes.extend(inputs.notes)
    out.extend(_driver_statuses(inputs, notes))
    out.append((ACTIVE, "; ".join([serving_message(inputs)] + notes)))
    return out


def run_hint(inputs: Inputs, action: str) -> str:
    """``juju run gpu-a/0 resume``, or ``run the resume action`` when the unit is unknown."""
    return f"juju run {inputs.unit} {action}" if inputs.unit else f"run the {action} action"


def _idle(inputs: Inputs) -> Status:
    """No GPU here: the mapping kept for GPUs gone missing (blocked, as for one), or nothing to do."""
    return missing_status(inputs) or (ACTIVE, "no NVIDIA GPU on this host: nothing to do")


def missing_status(inputs: Inputs) -> Optional[Status]:
    """Blocked, naming the published functions discovery no longer finds; None when none is missing.

    One GPU gone or all of them: the same status, never active (Nova still
    has their devices; the published sections stay until the operator runs
    forget-gpus, with one address per missing GPU: the one the option names
    on its bus, else the first function). VFs missing of a GPU that is here
    (sriov-manage failed) are not vanished: :func:`_vf_statuses` names them.
    """
    missing = vanished_gpus(inputs.facts, inputs.published)
    if not missing:
        return None
    found = len(inputs.facts.pci.gpus)
    now = (f"{found} NVIDIA GPU{'s' if found != 1 else ''} found now" if found
           else "no NVIDIA GPU found now")
    buses: dict = {}
    for address in missing:
        buses.setdefault(address.rsplit(":", 1)[0], []).append(address)
    named: List[str] = []
    forget: List[str] = []
    for bus, addresses in buses.items():
        gpu = next((a for a in inputs.mapped if a.rsplit(":", 1)[0] == bus), None)
        if addresses == [gpu] or (gpu is None and addresses[0].endswith(":00.0")):
            named.extend(addresses)  # the GPUs themselves (mdev-based)
        else:
            named.append(f"{'GPU ' + gpu if gpu else 'the GPU on bus ' + bus} with its VFs "
                         f"{text.listing(addresses)}")
        forget.append(gpu or addresses[0])
    hint = run_hint(inputs, f"forget-gpus gpus={','.join(forget)}")
    return BLOCKED, (f"published vGPU devices missing: {text.listing(named)} ({now}: driver "
                     "reloading? check lspci and journalctl -k); keeping "
                     f"{mappings.summary(inputs.published)}; removed for good? {hint}")


def missing_gpus(facts: Facts, published: Mapping[str, Tuple[str, ...]]) -> List[str]:
    """Published addresses whose GPU discovery no longer finds (all of them when none is found)."""
    owners = facts.pci.owners()  # as facts.pci.gpu(address), for every published address
    return sorted({address for addresses in published.values()
                   for address in addresses if address not in owners})


def vanished_gpus(facts: Facts, published: Mapping[str, Tuple[str, ...]]) -> List[str]:
    """:func:`missing_gpus` but the VFs of GPUs here without VFs (sriov-manage failed)."""
    return [a for a in missing_gpus(facts, published) if present_gpu(facts, a) is None]


def present_gpu(facts: Facts, address: str) -> Optional[str]:
    """The GPU here, without its VFs, that the VF ``address`` belongs to (told by its bus)."""
    bus = address.rsplit(":", 1)[0]
    for gpu in facts.pci.gpus:
        if gpu.vfs_missing and gpu.address.rsplit(":", 1)[0] == bus:
            return gpu.address
    return None


def _prerequisites(inputs: Inputs) -> List[Status]:
    """Nova's release, the relation and the IOMMU: what must be in place before the rest."""
    out: List[Status] = []
    release_problem = inputs.facts.release_problem()
    if release_problem:
        out.append((BLOCKED, release_problem))
    elif inputs.facts.release() is None:
        out.append((WAITING, f"waiting for {inputs.principal} to install nova-common"))
    if not inputs.related:
        out.append((BLOCKED, f"relate to {inputs.principal}: juju integrate "
                             f"{inputs.principal}:{RELATION} {inputs.app}:{RELATION}"))
    # With the IOMMU off an SR-IOV GPU has no VFs, so any mapping error about
    # them would send the operator the wrong way: this comes before the mapping.
    iommu = inputs.facts.iommu_problem()
    if iommu:
        out.append((BLOCKED, iommu))
    return out


def mapping_message(validation: mappings.Validation, published: Mapping[str, Tuple[str, ...]]) -> str:
    """The first error of the option, how many more, and what stays in force."""
    first = validation.errors[0]
    more = f" (+{len(validation.errors) - 1} more)" if len(validation.errors) > 1 else ""
    keeping = f"; keeping {mappings.kept(published)}" if published else ""
    return f"{OPTION}: {first}{more}{keeping}"


def _vf_statuses(inputs: Inputs) -> List[Status]:
    """Selected SR-IOV GPUs whose VFs are missing once the driver is installed (IOMMU on)."""
    installed = inputs.facts.driver is not None and inputs.facts.driver.installed
    if not installed or inputs.facts.iommu_problem():
        return []
    gpus = inputs.facts.pci.gpus
    selected = inputs.vf_selected
    published = ({present_gpu(inputs.facts, a) for a in missing_gpus(inputs.facts, inputs.published)}
                 if any(gpu.vfs_missing for gpu in gpus) else set())
    missing = [gpu for gpu in gpus if gpu.vfs_missing and gpu.address not in inputs.vf_refused
               and (selected is None or gpu.address in selected or gpu.address in published)]
    out: List[Status] = [
        (BLOCKED, f"SR-IOV GPU {gpu.address} ({gpu.model}) is {why}: its VFs are left alone; "
                  f"bind it to nvidia or leave it out of {OPTION}")
        for gpu in gpus if gpu.vfs_missing
        for why in [inputs.vf_refused.get(gpu.address, "").removeprefix("it is ")] if why]
    if missing:
        failed = inputs.vf_failures.get(missing[0].address)
        why = (f"{failed}; the boot step's attempts: journalctl -u {sriov.UNIT}" if failed
               else f"check journalctl -u {sriov.UNIT} and -u {driver.DAEMONS[0]}")
        names = text.listing([f"{gpu.address} ({gpu.model})" for gpu in missing], limit=3)
        out.append((BLOCKED, f"no virtual functions on SR-IOV GPU {names} after sriov-manage -e: "
                             f"{why}"))
    return out


def _driver_statuses(inputs: Inputs, notes: List[str]) -> List[Status]:
    """Statuses about the host driver; ``notes`` collects remarks for the active message."""
    installed = inputs.facts.driver
    out: List[Status] = []
    if installed is None and all_whole(inputs):
        notes.append(ALL_WHOLE)
        return out
    if inputs.attached_missing and installed is None:
        out.append((BLOCKED, inputs.attached_missing))
    if inputs.attached_invalid:
        out.append((BLOCKED, inputs.attached_invalid))
    if installed is None:
        return out
    if not installed.installed:
        attached = inputs.attached
        then = ("retrying on the next hook"
                if attached is None or driver.same_package(attached, installed)
                else f"run the upgrade action to install the attached {attached.version}")
        out.append((BLOCKED, f"{installed.name} {installed.version} is {installed.state}: "
                             f"dpkg did not finish; {then}"))
        return out
    notes.extend(_version_notes(inputs))
    if inputs.paused:
        out.append((MAINTENANCE, f"paused: vGPU services stopped; {run_hint(inputs, 'resume')} "
                                 "to start them"))
        return out
    reasons = inputs.facts.reboot_reasons()
    if inputs.secure_boot is not None and inputs.secure_boot.blocks_modules():
        # No reboot loads an unsigned module: say what does instead of waiting for one.
        out.append((BLOCKED, kernel.secure_boot_advice(inputs.secure_boot)))
        reasons = [r for r in reasons if r != kernel.VFIO_NOT_LOADED]
    out.extend((BLOCKED, f"reboot required: {reason}") for reason in reasons)
    out.extend(_service_statuses(inputs))
    return out


ALL_WHOLE = ("every GPU is given whole to guests (passthrough): no vGPU host driver needed "
             "here")


def all_whole(inputs: Inputs) -> bool:
    """Whether the mapping gives every GPU of the host whole to guests (no driver belongs here)."""
    whole = inputs.validation.passthrough if inputs.validation is not None else ()
    gpus = inputs.facts.pci.gpus
    return bool(gpus) and all(g.address in whole for g in gpus) and not inputs.forced


def _version_notes(inputs: Inputs) -> List[str]:
    """How the attached package compares with the installed one, when that asks for action."""
    attached, installed = inputs.attached, inputs.facts.driver
    if attached is None or installed is None:
        return []
    if inputs.order_error is not None:
        return [f"cannot compare the attached driver's version: {inputs.order_error}"]
    order = inputs.order
    if order is None:
        return []
    if order > 0 or (order == 0 and attached.package != installed.name):
        return [f"driver {installed.version} installed, {attached.version} attached: "
                "run the upgrade action"]
    if order < 0:
        return [f"driver {installed.version} installed; the attached {attached.version} is older"]
    return []


def _service_statuses(inputs: Inputs) -> List[Status]:
    """Services down: masked by this charm's failed pause, by someone else, or just not running.

    nova-compute's pause does not touch them (none is published in
    ``services``), so a daemon down is this unit's to report, always blocked:
    guests on its GPUs lose their vGPUs.
    """
    answer = inputs.services
    if answer.error is not None:
        return [(BLOCKED, answer.error)]
    down, masked = list(answer.down), list(answer.masked)
    ours = [name for name in masked if name in inputs.masked_by_us]
    resume = run_hint(inputs, "resume")
    if ours:
        return [(BLOCKED, f"{', '.join(ours)} left stopped and masked by this charm's pause that "
                          f"failed: {resume}")]
    if down and masked == down:
        them = "them" if len(down) > 1 else "it"
        return [(BLOCKED, f"{', '.join(down)} stopped and masked outside this charm: {resume} "
                          f"to unmask and start {them}")]
    if down:
        return [(BLOCKED, f"{', '.join(down)} not running: check journalctl -u {down[0]}")]
    return []


def serving_message(inputs: Inputs) -> str:
    """``2 GPUs (2 L4), nvidia-108 on 2; nvidia-108: 1 used, 3 free``: what this unit serves."""
    host = inputs.facts.pci
    models = host.models()
    if len(models) == 1:
        gpus = f"({models[0][0]})"
    else:
        gpus = "(" + ", ".join(f"{n} {m}" for m, n in models) + ")"
    count = len(host.gpus)
    head = f"{count} GPU{'s' if count != 1 else ''} {gpus}" if count else "no NVIDIA GPU (forced)"
    served = inputs.published
    plan = inputs.validation.plan if inputs.validation is not None else None
    unoffered = plan.unoffered if plan is not None else ()
    if served:
        line = f"{head}, {mappings.summary(served)}"
    elif unoffered:
        line = f"{head}, no vGPU type served: no GPU here offers {', '.join(unoffered)}"
    else:
        line = f"{head}, no vGPU type mapped: set {OPTION}"
    return f"{line}; {inputs.capacity}" if inputs.capacity else line
