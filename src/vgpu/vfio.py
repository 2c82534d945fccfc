"""Give VFs their vGPU types on NVIDIA's vendor-specific VFIO framework.

Each VF of an L40S, H100 or H200 holds at most one vGPU: its type id is
written to ``nvidia/current_vgpu_type`` (``0`` releases it). What a VF can
take depends on its siblings, so ``nvidia/creatable_vgpu_types`` is read
again right before each write, and the file is read back afterwards.

The charm owns the types of every VFIO GPU on its host: VFs the plan does
not name are released. Nothing is changed while a guest holds a VF whose
type would change: a running one, or a shut-off one whose definition keeps it
(Nova keeps a shut-off instance's VF and allocation), see :mod:`vgpu.guests`.
"""

from __future__ import annotations

import errno
import logging
import os
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple

from . import OPTION, hostroot, novaconf, pci, profiles
from .errors import GuestsRunningError, VfTypeError

log = logging.getLogger(__name__)

PCI_DEVICES = pci.PCI_DEVICES


def desired(plan, host: pci.Host) -> Dict[str, Tuple[int, int]]:
    """``{VF address: (current type, wanted type)}`` for every VFIO VF that must change."""
    wanted = {a.address: a.number for a in plan.vfio()}
    out: Dict[str, Tuple[int, int]] = {}
    for gpu in host.gpus:
        if gpu.framework != pci.VFIO:
            continue
        for vf in gpu.vfs:
            current = vf.current_type or 0
            target = wanted.get(vf.address, 0)
            if current != target:
                out[vf.address] = (current, target)
    return out


def ensure_types(plan, host: pci.Host, published: Optional[Mapping[str, str]] = None
                 ) -> List[str]:
    """Write the plan's types to the VFs, releasing the others first; returns what was done.

    All or nothing, as Nova sees it: when a VF refuses a type halfway, every
    VF this call changed gets its previous type back (creatable_vgpu_types read
    again before each write), so the VFs hold what nova.conf still lists.

    A VF without a type that takes the one nova.conf lists for it (``published``:
    ``{VF address: resource class}``) is restored, not changed: no guest guards
    it (a shut-off guest keeps that very VF). Raises GuestsRunningError
    (changing nothing) when guests, running or shut off, hold VFs that would
    really change; VfTypeError when a VF refuses a type, saying whether the
    previous types are back.
    """
    changes = desired(plan, host)
    if not changes:
        return []
    guarded = guarded_changes(plan, changes, published)
    if guarded:
        from . import guests  # XML parsing only when something really changes

        guests.ensure_no_guests(guarded, defined=True)
    return _change(changes, write_order(plan, changes))


def guarded_changes(plan, changes: Mapping[str, Tuple[int, int]],
                    published: Optional[Mapping[str, str]] = None) -> List[str]:
    """The VFs of ``changes`` (:func:`desired`) that no guest may hold: all but restores.

    A VF without a type that takes the class nova.conf lists for it
    (``published``) is a restore, which a shut-off guest keeping it needs.
    """
    classes = {a.address: a.resource_class for a in plan.vfio()}
    return [address for address, (current, _) in changes.items()
            if current or not published or published.get(address) != classes.get(address)]


def restore(host: pci.Host, published: Mapping[str, str]) -> List[str]:
    """Give each VFIO VF without a type the one nova.conf lists for it; returns what was done.

    ``published``: ``{VF address: resource class}`` from nova-compute's device
    specs; the type is the one the VF lists now whose profile has that class
    (a VF listing none is left as it is). No guest guards a restore. Raises
    VfTypeError (what it wrote undone) when a VF refuses its type.
    """
    from .plan import resource_class

    changes: Dict[str, Tuple[int, int]] = {}
    for gpu in host.gpus:
        if gpu.framework != pci.VFIO:
            continue
        for vf in gpu.vfs:
            wanted = published.get(vf.address)
            if vf.current_type or wanted is None:
                continue
            found = [t.number for t in creatable(vf.address) if resource_class(t.name) == wanted]
            if found:
                changes[vf.address] = (0, found[0])
    return _change(changes, sorted(changes)) if changes else []


def _change(changes: Mapping[str, Tuple[int, int]], order: List[str]) -> List[str]:
    """Apply ``{VF: (current, target)}`` in ``order``; on a refusal undo what was written."""
    done: List[str] = []
    written: Set[str] = set()
    try:
        _apply({address: target for address, (_, target) in changes.items()}, order, done,
               written)
    except VfTypeError as error:
        # Only the VFs this hook wrote go back: another VF's type may have been written since
        # the host was read (the boot step, before the host lock existed), and stays.
        previous = {address: current for address, (current, _) in changes.items()
                    if address in written}
        undone: List[str] = []
        try:
            _apply(previous, [a for a in order if a in previous], undone)
        except VfTypeError as again:
            raise VfTypeError(f"{error}; rolling back failed too ({again}): the VFs do not all "
                              "hold what nova.conf lists") from None
        raise VfTypeError(f"{error}; every VF has its previous type back, as nova.conf "
                          "lists them") from None
    return done


def _apply(targets: Dict[str, int], order: List[str], done: List[str],
           written: Optional[Set[str]] = None) -> None:
    """Give each VF its target type (0: none): release what differs, then write, logging each.

    Each VF's current type is read again first, so a half-done change is
    undone by applying the previous targets. Types are written in ``order``
    (see :func:`write_order`); ``done`` collects what was done, ``written`` each
    VF written to (before the write: one that failed may have changed all the same).
    """
    written = set() if written is None else written
    held_now = {address: held(address) for address in targets}
    # Address order is virtfn order: a VF's routing ID is its PF's plus offset + index x stride.
    for address in sorted(targets):
        if held_now[address] and held_now[address] != targets[address]:
            written.add(address)
            _write(address, 0)
            _done(done, f"{address}: released nvidia-{held_now[address]}")
    for address in order:
        target = targets[address]
        if not target or held_now[address] == target:
            continue
        creatable = pci.parse_creatable(_read(address, "creatable_vgpu_types"))
        if target not in {t.number for t in creatable}:
            listed = ", ".join(t.id for t in creatable) or "nothing"
            raise VfTypeError(f"VF {address} cannot take nvidia-{target} now: it lists {listed}")
        written.add(address)
        _write(address, target)
        _done(done, f"{address}: nvidia-{target}")


def _done(done: List[str], line: str) -> None:
    log.info("vGPU type %s", line)
    done.append(line)


def write_order(plan, changes) -> List[str]:
    """The VFs to give types, larger MIG-backed profiles first, then in address order.

    A MIG-backed vGPU goes into a GPU instance the charm created beforehand
    (see :func:`vgpu.miginstances.ensure`; one MIG-backed profile per GPU), so the order
    only matters across GPUs; larger first is kept as harmless. Time-sliced
    types keep address (virtfn) order.
    """
    slices = {a.address: getattr(profiles.profile(a.name), "slices", 0) for a in plan.vfio()}
    return sorted(changes, key=lambda address: (-slices.get(address, 0), address))


def creatable(address: str) -> Tuple[pci.VgpuType, ...]:
    """What the VF at ``address`` lists in ``nvidia/creatable_vgpu_types`` now; VfTypeError if unreadable."""
    return pci.parse_creatable(_read(address, "creatable_vgpu_types"))


def held(address: str) -> int:
    """The type id the VF at ``address`` holds (0: none); VfTypeError if unreadable."""
    value = _read(address, "current_vgpu_type").strip()
    if not value.isdigit():
        raise VfTypeError(f"VF {address} holds {value or 'nothing'} in current_vgpu_type")
    return int(value)


def assign(address: str, number: int) -> None:
    """Write type ``number`` to the VF and read it back; VfTypeError when the VF refuses it."""
    _write(address, number)


def _path(address: str, name: str):
    return hostroot.path(PCI_DEVICES, address, "nvidia", name)


def _read(address: str, name: str) -> str:
    """A VF's ``nvidia/`` file, any bytes (a sysfs page at most); VfTypeError when unreadable."""
    path = _path(address, name)
    try:
        fd = hostroot.open_regular(path)  # never a FIFO or device in sysfs' place
        try:
            data = os.read(fd, _LIMIT + 1)
        finally:
            os.close(fd)
        if len(data) > _LIMIT:
            raise OSError(errno.EFBIG, f"more than {_LIMIT} bytes")
    except OSError as error:
        raise VfTypeError(f"cannot read {name} of VF {address}: {error.strerror or error}") from None
    return data.decode("utf-8", errors="replace")


_LIMIT = 65536  # a sysfs attribute is one page (4 KiB on x86), read in one piece


def _write(address: str, number: int) -> None:
    try:
        with open(_path(address, "current_vgpu_type"), "w", encoding="ascii") as handle:
            handle.write(f"{number}\n")
    except OSError as error:
        what = f"nvidia-{number}" if number else "0 (release)"
        raise VfTypeError(f"writing {what} to VF {address} failed: "
                          f"{error.strerror or error}") from None
    back = _read(address, "current_vgpu_type").strip()
    if back != str(number):
        raise VfTypeError(f"VF {address} holds {back or 'nothing'} after writing {number}")

# -- the hook's VF-type steps (run by vgpu.reconcile and vgpu.preview on its _Hook) --------------

def step_holders(hook, plan) -> List[str]:
    """The guests holding VFs whose type the plan would change (each named): a refusal.

    What :func:`step_give_types`' guard (:func:`ensure_types`) refuses, read only:
    preview-mappings asks it.
    """
    changes = desired(plan, hook.facts().pci)
    guarded = guarded_changes(plan, changes, _published_classes(hook)) if changes else []
    if not guarded:
        return []
    from . import guests

    held = guests.vgpu_guests(guarded, defined=True)
    if held:
        hook.problems.append(f"{OPTION} not applied, no VF changed: "
                             f"{GuestsRunningError(held, hook.given.unit)}; "
                             "move them or restore the mapping")
    return [guest.describe() for guest in held]


def step_give_types(hook, plan) -> bool:
    """Write the plan's types to vendor-specific VFIO VFs; False leaves all as it was."""
    if hook.paused and desired(plan, hook.facts().pci):
        return False  # the vGPU manager is stopped: VF types wait for resume
    published = _published_classes(hook)
    try:
        done = _written(hook, lambda: ensure_types(plan, hook.facts().pci, published))
    except GuestsRunningError as raised:
        error = GuestsRunningError(raised.guests, hook.given.unit)  # naming the unit's juju run
        restored = _restore_step(hook, published)
        if restored is None:
            return False
        hook.problems.append(
            f"{OPTION} not applied: {error}; the {restored} VFs without a type got back the "
            "types nova.conf lists; move them or restore the mapping" if restored else
            f"{OPTION} not applied, no VF changed: {error}; move them or restore the mapping")
        return False
    return done is not None


def _published_classes(hook) -> Dict[str, str]:
    """``{VF address: resource class}``: the VFIO VFs nova-compute has now (first relation)."""
    for ours in hook.published():
        return novaconf.device_classes(novaconf.sections_from_relation(ours))
    return {}


def _restore_step(hook, published: Dict[str, str]) -> Optional[int]:
    """Give VFs without a type the types nova.conf lists, a change being refused; how many.

    None (a problem said) when a VF refused its type.
    """
    done = _written(hook, lambda: restore(hook.facts().pci, published))
    return None if done is None else len(done)


def _written(hook, write: Callable[[], Sequence]) -> Optional[Sequence]:
    """What ``write`` changed on the VFs, the host read again after a change.

    None (the problem said) when a VF refused its type (VfTypeError).
    """
    try:
        done = write()
    except VfTypeError as error:
        hook.problems.append(f"{error}; retrying on the next hook")
        hook.refresh()
        return None
    if done:
        hook.refresh()
    return done
