"""GPUs given whole to guests: what a mapping would move, decided before anything moves.

:func:`decide` reads the host (GPUs, their drivers and VFs, the guests that
hold their functions, the nvidia driver's unbindLock, the udev rule) and
changes nothing: its :class:`Decision` says what the hook would do and what
refuses the mapping. The hook (:mod:`vgpu.reconcile`) acts on it only once
every other check accepted the mapping (:func:`act`), through the hook's two
whole-GPU steps at the end of this module (:func:`step_decide`,
:func:`step_act`); preview-mappings (:mod:`vgpu.preview`) renders the same
decision from the same step. Either way nothing is half
done: a refused mapping leaves every GPU on the driver it had, with its
driver_override and the udev rule as they were.

A GPU going whole whose VFs no guest holds has them disabled first
(``sriov-manage -d``, :func:`vgpu.sriov.disable_one`, under the host lock the
hook holds); any guest (VFIO or mdev, running or shut off) on its functions
refuses the mapping, named. A GPU something holds through the nvidia driver
(its unbindLock stays 0) refuses it too, naming the NVML clients systemd
says are active. This module never imports ops; every path is under
``VGPU_HOST_ROOT``.
"""

from __future__ import annotations

import logging
from typing import Callable, Dict, List, Mapping, Sequence, Set, Tuple

from . import OPTION, hostroot, novaconf, passthrough, pci, sriov
from .record import NamedTuple

logger = logging.getLogger(__name__)


class Decision(NamedTuple):
    """What the whole GPUs of a plan need, read from the host, nothing changed yet."""

    refusals: Tuple[str, ...] = ()  # each refuses the mapping: the last good one stays
    disable: Tuple[str, ...] = ()  # GPUs whose VFs sriov-manage -d ends first (no guest on them)
    take: Tuple[str, ...] = ()  # GPUs that go to vfio-pci now
    give_back: Tuple[str, ...] = ()  # GPUs the charm gave whole that the mapping no longer does
    whole: Tuple[str, ...] = ()  # every GPU the mapping gives whole (the udev rule's)
    rules_change: bool = False  # the udev rule (and boot configuration) would change

    @property
    def moves(self) -> bool:
        """Whether acting on it changes the host."""
        return bool(self.disable or self.take or self.give_back or self.rules_change)

    def lines(self, host: pci.Host) -> List[str]:
        """What would happen, a line per GPU (preview-mappings' ``whole-gpus``)."""
        out = []
        for address in self.take:
            first = "its VFs disabled (sriov-manage -d), then " if address in self.disable else ""
            out.append(f"GPU {address}{_model(host, address)}: {first}to vfio-pci "
                       "(driver_override, udev rule), published whole once vfio-pci holds it")
        for address in self.give_back:
            out.append(f"GPU {address}{_model(host, address)}: handed back from vfio-pci")
        return out


def _model(host: pci.Host, address: str) -> str:
    gpu = host.gpu(address)
    return f" ({gpu.model})" if gpu is not None and gpu.model else ""


def decide(host: pci.Host, plan, published: Sequence[Mapping[str, str]],
           in_force: Mapping[str, tuple], rules_text: str,
           free: Callable[[str], bool] = passthrough.free, unit: str = "") -> Decision:
    """The whole-GPU part of ``plan`` on ``host`` (read now): what moves, what refuses.

    ``published``: the relation data nova-compute has (its first entry is
    read); ``in_force``: the mapping it serves (``{type: addresses}``);
    ``rules_text``: the udev rule as it is; ``free``: whether nothing holds a
    GPU through the nvidia driver (:func:`vgpu.passthrough.free`); ``unit``:
    this unit's name, for the ``juju run`` that lists the guests a refusal
    does not name (:func:`vgpu.errors.guests_named`).
    """
    before = set(passthrough.overridden(rules_text))
    whole = {w.address for w in plan.passthrough}
    classes = novaconf.device_classes(novaconf.sections_from_relation(published[0])) \
        if published else {}
    was_whole = {a for a, rc in classes.items() if rc.startswith(novaconf.WHOLE_CLASS)} | before
    was_vgpu = {a for addresses in in_force.values() for a in addresses if a not in was_whole}
    refusals: List[str] = []
    guarded: Dict[str, str] = {}  # GPU -> why its functions must be free of guests
    disable, take = [], []
    for w in plan.passthrough:
        gpu = host.gpu(w.address)
        if gpu is None or gpu.driver == passthrough.VFIO_PCI:
            continue
        functions = _functions(gpu)
        if functions & was_vgpu:
            guarded[gpu.address] = "moves between whole (passthrough) and vGPU"
        if gpu.vfs:
            guarded.setdefault(gpu.address, f"goes whole (passthrough) and has {len(gpu.vfs)} VFs "
                                            "enabled")
            if not hostroot.path(sriov.SRIOV_MANAGE).exists():
                refusals.append(f"{OPTION} not applied, no GPU moved: GPU {gpu.address} "
                                f"({gpu.model}) has {len(gpu.vfs)} VFs enabled and "
                                f"/{sriov.SRIOV_MANAGE} is missing to disable them")
            disable.append(gpu.address)
        if gpu.driver == sriov.NVIDIA_DRIVER and not free(gpu.address):
            refusals.append(_held(gpu))
        take.append(gpu.address)
    give_back = []
    for address in sorted(was_whole - whole):
        gpu = host.gpu(address)
        if gpu is None:
            continue
        guarded[address] = "moves between whole (passthrough) and vGPU (or out of the mapping)"
        if address in before:
            give_back.append(address)
    refusals[:0] = _guests(host, guarded, unit)
    rules_change = (passthrough.rules(whole) != rules_text
                    or passthrough.modprobe_conf(whole) != passthrough.current_conf())
    return Decision(tuple(refusals), tuple(disable), tuple(take), tuple(give_back),
                    tuple(sorted(whole)), rules_change)


def split_back(host: pci.Host, plan) -> Tuple[str, ...]:
    """The GPUs ``plan`` wants VFs on that the charm gave whole and ``plan`` no longer does.

    Each is on vfio-pci, named by the charm's udev rule: :func:`decide` hands it back
    (guarded as every move between whole and vGPU), and only then can sriov-manage
    enable its VFs (it takes a GPU on nvidia only).
    """
    if not plan.missing_vfs:
        return ()
    whole = {w.address for w in plan.passthrough}
    given = set(passthrough.overridden(passthrough.current_rules()))
    out = []
    for address in plan.missing_vfs:
        gpu = host.gpu(address)
        if (address in given and address not in whole and gpu is not None
                and gpu.driver == passthrough.VFIO_PCI):
            out.append(address)
    return tuple(out)


def vanished_vfs(host: pci.Host, plan, functions: Sequence[str]) -> List[str]:
    """``functions`` (published, not found now) but the VFs of GPUs ``plan`` publishes whole.

    Those did not vanish: the hook disabled them itself (``sriov-manage -d``, only once
    no guest held one: :func:`decide`) and publishes the GPU whole in their place, so
    their device specs go with them rather than being kept for guests
    (:func:`vgpu.novaconf.keep_published`). A VF is told by its bus: the one GPU here on
    it (as :func:`vgpu.status.present_gpu` tells it).
    """
    whole = {w.address for w in plan.passthrough}
    on_bus: Dict[str, List[str]] = {}
    for gpu in host.gpus:
        on_bus.setdefault(gpu.address.rsplit(":", 1)[0], []).append(gpu.address)
    out = []
    for address in functions:
        gpus = on_bus.get(address.rsplit(":", 1)[0], [])
        if not (len(gpus) == 1 and gpus[0] in whole):
            out.append(address)
    return out


def _functions(gpu: pci.Gpu) -> Set[str]:
    """A GPU's own address and its VFs'."""
    return {gpu.address, *(vf.address for vf in gpu.vfs)}


def _guests(host: pci.Host, guarded: Mapping[str, str], unit: str) -> List[str]:
    """A refusal per GPU whose functions (or mdevs) a guest holds, running or shut off."""
    if not guarded:
        return []
    from . import guests
    from .errors import guests_named

    out = []
    for address, why in sorted(guarded.items()):
        gpu = host.gpu(address)
        functions = _functions(gpu) if gpu is not None else {address}
        held = guests.vgpu_guests(sorted(functions), defined=True)  # mdevs on them too
        if held:
            out.append(f"{OPTION} not applied, no GPU moved: "
                       f"{guests_named(held, unit)} "
                       f"hold{'s' if len(held) == 1 else ''} GPU {address}{_model(host, address)}, "
                       f"which the new mapping {why}; move or delete the instance(s) first, "
                       "or restore the mapping")
    return out


def _held(gpu: pci.Gpu) -> str:
    from . import gpuclients
    from .errors import ServiceError

    try:
        clients = gpuclients.active((gpuclients.OURS, *gpuclients.NEIGHBOURS))
    except ServiceError:
        clients = []
    who = f" (active: {', '.join(clients)})" if clients else ""
    return (f"{OPTION} not applied, no GPU moved: GPU {gpu.address} ({gpu.model}) is held "
            f"through the nvidia driver{who}: its unbindLock stays 0 (nvidia-persistenced, "
            "DCGM, an exporter or a CUDA process); stop what holds it and the next hook moves "
            "it, or restore the mapping")


def _disable(addresses: Sequence[str], host: pci.Host, problems: List[str]) -> Set[str]:
    """``sriov-manage -d`` for each GPU; those whose VFs stay (each problem said)."""
    failed = set()
    for address in addresses:
        why = sriov.disable_one(address)
        if why:
            failed.add(address)
            problems.append(f"GPU {address}{_model(host, address)}: its VFs could not be "
                            f"disabled ({why}): not published whole; retrying on the next hook")
    return failed


def _take(addresses: Sequence[str], problems: List[str]) -> Set[str]:
    """vfio-pci loaded, then each GPU given to it; those it could not be given (problems said)."""
    if not addresses:
        return set()
    why = passthrough.load()
    if why:
        problems.append(f"{passthrough.VFIO_PCI} could not be loaded ({why}): GPU(s) "
                        f"{', '.join(addresses)} not published whole")
        return set(addresses)
    failed = set()
    for address in addresses:
        why = passthrough.take(address, sriov.driver_of(address))
        if why:
            failed.add(address)
            problems.append(why)
    return failed


class Moved(NamedTuple):
    """What :func:`act` did: the GPUs vfio-pci holds now, and why any other is not published."""

    held: Tuple[str, ...] = ()
    problems: Tuple[str, ...] = ()


def act(decision: Decision, host: pci.Host) -> Moved:
    """Carry out an accepted ``decision``: VFs disabled, GPUs to vfio-pci (or back), the rule.

    A GPU is published whole only while vfio-pci holds it, read back from
    sysfs; each other is named with why.
    """
    problems: List[str] = []
    failed = _disable(decision.disable, host, problems)
    failed |= _take([a for a in decision.take if a not in failed], problems)
    for address in decision.give_back:
        why = passthrough.give_back(address, sriov.driver_of(address))
        if why:
            problems.append(why)
    try:
        passthrough.ensure_rules(decision.whole)
    except OSError as error:
        problems.append(f"cannot write /{passthrough.RULES}: {error.strerror or error}")
    held = []
    for address in decision.whole:
        driver = passthrough.bound(address)
        if driver == passthrough.VFIO_PCI:
            held.append(address)
        elif address not in failed:
            problems.append(f"GPU {address}{_model(host, address)} is not held by "
                            f"{passthrough.VFIO_PCI} (bound to {driver or 'no driver'}): not "
                            "published whole; retrying on the next hook")
    if decision.moves:
        logger.info("whole GPUs: %s on vfio-pci", ", ".join(held) or "none")
    return Moved(tuple(held), tuple(problems))


# -- the hook's whole-GPU steps (run by vgpu.reconcile and vgpu.preview on its _Hook) ------------

def step_decide(hook, plan) -> Decision:
    """What the plan's whole GPUs need, read only (:func:`decide`); refusals said on ``hook``."""
    decision = decide(hook.facts().pci, plan, hook.published(), hook.published_mapping(),
                      passthrough.current_rules(), unit=hook.given.unit)
    hook.problems.extend(decision.refusals)
    return decision


def step_act(hook, plan, decision: Decision):
    """``plan`` with only the whole GPUs vfio-pci holds, once ``decision`` was carried out.

    Called only after every check accepted the mapping (:func:`act`); the host is
    read again when a GPU moved.
    """
    moved = act(decision, hook.facts().pci)
    hook.problems.extend(moved.problems)
    if decision.moves:
        hook.refresh()
    return plan._replace(passthrough=tuple(w._replace(driver=passthrough.VFIO_PCI)
                                           for w in plan.passthrough if w.address in moved.held))
