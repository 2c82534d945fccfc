"""preview-mappings: what a vgpu-device-mappings value would do on this host, doing none of it.

The value goes through the very code a config-changed runs (:mod:`vgpu.mappings`,
:mod:`vgpu.plan`, the checks of :mod:`vgpu.reconcile`'s publishing step,
:mod:`vgpu.novaconf`), on a :class:`vgpu.reconcile.Host` read dry: type names
learnt from the VFs are not saved, no VF takes a type, no GPU instance is made,
no MIG mode changes, no apt runs, no relation data or StoredState is set and
the host lock is not taken. The one write is the nvidia driver's unbindLock of a GPU
the value would give whole, taken and given back at once: how that driver says
whether a client holds the GPU (:func:`vgpu.passthrough.free`), as the hook asks
it. Whole GPUs are decided by the hook's own :func:`vgpu.whole.decide`, so the
preview refuses what the hook would refuse. What the hook would do first
and the preview cannot (enable VFs, install the driver, create GPU instances)
leaves the types those GPUs offer "unknown until applied": a VF lists only
what it can take now, so the preview never guesses them.

A refusal is said in the words the unit's status would use.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence

from . import (
    mappings,
    mdevs,
    mig,
    miginstances,
    novaconf,
    pci,
    profiles,
    reconcile,
    sriov,
    status,
    table,
    vfio,
    whole,
)
from . import plan as plans
from .errors import MigError

UNKNOWN = "unknown until applied"
APPLIES = "would apply"
REFUSED = "refused"
NO_CHANGE = "nothing would change"


def preview(text: Optional[str], host: reconcile.Host, given: reconcile.Inputs) -> Dict[str, Any]:
    """The action's results for ``text`` (a vgpu-device-mappings value) on this host.

    ``host`` must be read dry (``reconcile.Host(dry=True)``); ``given`` holds
    the charm's options and relations as a hook gets them. Raises
    HostReadError when the host cannot be read.
    """
    checked = mappings.check_text(text)
    given = given._replace(checked=lambda: checked)
    hook = reconcile._Hook(host, given)  # the publishing step's own checks, run dry
    here = hook.facts()
    in_force = hook.published_mapping()
    if not checked.ok:
        return _refused([status.mapping_message(checked, in_force)])
    if not here.pci.gpus:
        return {"verdict": NO_CHANGE, "summary": "no NVIDIA GPU on this host: nothing would change"}
    first = _prerequisites(here, given)
    if first:
        return _refused(first)
    unknown = _unknown(here, checked)
    validation = hook.mapping()
    plan = reconcile._addressable(hook, validation.plan)
    for address in whole.split_back(here.pci, plan) if plan is not None else ():  # as the hook
        unknown.setdefault(address, "it is handed back from vfio-pci first, then its VFs are "
                                    "enabled (sriov-manage -e)")
    errors = [e for e in validation.errors if not any(a in e for a in unknown)]
    if errors:
        hook.problems.append(status.mapping_message(validation._replace(errors=tuple(errors)),
                                                    in_force))
    decision = sections = None
    if plan is not None and not errors and not hook.problems:
        # The hook's own decisions, in its order: the whole GPUs, nova.conf, the VF types.
        decision = whole.step_decide(hook, plan)
    if decision is not None and not decision.refusals:
        sections = reconcile.plan_sections(hook, plan, here.supported_release())
    changes = vfio.desired(plan, here.pci) if plan is not None else {}
    blocking = vfio.step_holders(hook, plan) if not hook.problems and plan is not None \
        else []
    if sections is not None and not unknown:
        mdevs.step_may_change(hook, sections)
        reconcile._principal_accepts(hook, sections)
        reconcile._mig_ready(hook, plan)
    return _results(hook, plan, sections, changes, unknown, blocking, decision)


def _prerequisites(here, given: reconcile.Inputs) -> List[str]:
    """What the status says before any mapping can be checked: Nova's release, the IOMMU."""
    problem = here.release_problem()
    if problem:
        return [problem]
    if here.release() is None:
        return [f"waiting for {_principal(given)} to install nova-common"]
    iommu = here.iommu_problem()
    return [iommu] if iommu else []


def _principal(given: reconcile.Inputs) -> str:
    relations = given.relations()
    return relations[0].app if relations else reconcile.PRINCIPAL


def _unknown(here, checked: mappings.Validation) -> Dict[str, str]:
    """``{GPU: why}``: GPUs the mapping's types touch whose types on offer only the hook can learn.

    Their VFs are not enabled yet (the hook runs sriov-manage -e first for the
    GPUs it selects), the driver is not installed, or their GPU instances are
    made by the hook before the mapping is checked (a VF lists a MIG-backed
    type only then). A GPU the mapping leaves alone, or gives whole, is never
    unknown: its types play no part.
    """
    out: Dict[str, str] = {}
    installed = here.driver is not None and here.driver.installed
    mapping = checked.mapping
    touched = _touched(here.pci, mapping, checked.passthrough)
    selected = set(sriov.selected(mapping, here.pci, checked.passthrough).wanted)
    for gpu in here.pci.gpus:
        if gpu.address not in touched:
            continue
        if not installed:
            out[gpu.address] = "the vGPU host driver is not installed yet"
        elif gpu.vfs_missing and gpu.driver == "nvidia" and gpu.address in selected:
            out[gpu.address] = "its VFs are not enabled yet (sriov-manage -e runs first)"
    needs = _mig_needs(mapping, here)
    for address, need in needs.items():
        if address not in out and _mig_on(address, needs) and not _instances_in_place(need):
            out[address] = (f"its GPU instances ({need.gis} x {need.instance}) are created "
                            "first, and its VFs list MIG-backed types only then")
    return out


def _touched(host: pci.Host, mapping: Mapping[str, Sequence[str]],
             whole: Sequence[str]) -> set:
    """The GPUs a mapping's type keys may give vGPUs: every one not whole for ``all``, else by address."""
    owners = host.owners()
    out: set = set()
    for addresses in mapping.values():
        if tuple(addresses) == ("all",):
            out.update(g.address for g in host.gpus if g.address not in whole)
            continue
        for address in addresses:
            gpu = owners.get(address)
            if gpu is not None:
                out.add(gpu.address)
            else:  # a VF address of a GPU whose VFs do not exist yet: its bus
                bus = address.rsplit(":", 1)[0]
                out.update(g.address for g in host.gpus if g.address.rsplit(":", 1)[0] == bus)
    return out


def _mig_needs(mapping, here) -> Dict[str, miginstances.Need]:
    if not any(profiles.mig_profile(key) is not None for key in mapping):
        return {}
    return miginstances.mapped(mapping, here.pci)


def _mig_on(address: str, needs: Mapping[str, miginstances.Need]) -> bool:
    """Whether the GPU is in MIG mode (the hook creates GPU instances only then); unknown: no.

    Out of MIG mode the hook refuses the mapping, and so does the preview, in its words.
    """
    try:
        return mig.modes(list(needs))[address].enabled
    except MigError:
        return False


def _instances_in_place(need: miginstances.Need) -> bool:
    """Whether the GPU has the GPU instances ``need`` asks for (read only; unknown: no)."""
    try:
        found = miginstances.instances(need.gpu)
    except MigError:
        return False
    return sum(1 for gi in found if gi.profile == need.instance) >= need.gis


def _refused(problems: Sequence[str]) -> Dict[str, Any]:
    return {"verdict": REFUSED, "refused": "\n".join(dict.fromkeys(problems)),
            "summary": f"refused: {problems[0]}"}


def _results(hook, plan, sections, changes, unknown: Mapping[str, str],
             blocking: List[str], decision=None) -> Dict[str, Any]:
    """The action's results: verdict, per GPU, the VF changes, nova.conf, guests, waits."""
    here = hook.facts()
    out: Dict[str, Any] = {"gpus": _gpus(here, plan, unknown)}
    if changes:
        out["vf-changes"] = table.render(
            ["VF", "holds now", "would hold"],
            [[vf, _type_name(now), _type_name(then, vf, plan)]
             for vf, (now, then) in sorted(changes.items())],
            what="VFs", where="each GPU's would-serve")  # the nested results list no VF
    if hook.problems:
        out.update(_refused(hook.problems))
    elif unknown:
        out.update(verdict=UNKNOWN, summary=f"{UNKNOWN} on {len(unknown)} GPU(s): "
                   + "; ".join(f"GPU {a}: {why}" for a, why in sorted(unknown.items())))
    else:
        moves = decision is not None and decision.moves
        same = not changes and not moves and sections == novaconf.sections_from_relation(
            next(iter(hook.published()), {}))
        served = mappings.summary(novaconf.mapping_from_sections(sections or {}))
        out.update(verdict=NO_CHANGE if same else APPLIES,
                   summary=NO_CHANGE if same else
                   f"{len(changes)} VF(s) would change type; nova-compute would get "
                   f"{served or 'no vGPU devices'}")
    out["nova-conf"] = UNKNOWN if unknown else (
        render(sections) if sections is not None and not hook.problems
        else "nothing new: the last published sections stay")
    if blocking:  # every guest once (the refusal names the first few), as many as fit
        unit = hook.given.unit
        out["guests-blocking"] = table.lines(
            blocking, what="guests",
            where=f"juju run {unit} vgpu-usage" if unit else "the vgpu-usage action")
    if decision is not None and decision.moves:
        out["whole-gpus"] = _lines(decision.lines(here.pci)) or "the udev rule rewritten"
    if hook.waits:
        out["waits"] = _lines(hook.waits)
    if plan.notes:  # a checked value always has a plan: preview() refused it otherwise
        out["notes"] = _lines(plan.notes)
    # A record is a GPU (gpus.gpu-0), its fields one level below.
    return table.fit(out, depth=2, records="gpus", what="GPUs")


def _lines(items: Sequence[str]) -> str:
    """Guests, whole GPUs, waits, notes: one to a line."""
    return "\n".join(items)


def _gpus(here, plan, unknown: Mapping[str, str]) -> Dict[str, Dict[str, str]]:
    """Per GPU: its model and framework, the types on offer, what it would get, MIG."""
    assignments = plan.assignments if plan is not None else ()
    planned: Dict[str, List[plans.Assignment]] = {}
    for a in assignments:
        planned.setdefault(a.gpu, []).append(a)
    needs = miginstances.needs(assignments, here.pci) if profiles.mig_backed(
        a.name for a in assignments) else {}
    out: Dict[str, Dict[str, str]] = {}
    for index, gpu in enumerate(here.pci.gpus):
        entry = {"address": gpu.address, "model": gpu.model or gpu.device_id,
                 "framework": gpu.framework or "unknown",
                 "types-on-offer": _on_offer(gpu, unknown.get(gpu.address)),
                 "would-serve": _served(planned.get(gpu.address, []), unknown.get(gpu.address))}
        entry.update(_mig_entry(gpu, needs.get(gpu.address)))
        out[f"gpu-{index}"] = entry
    return out


def _on_offer(gpu: pci.Gpu, why: Optional[str]) -> str:
    if why:
        return f"{UNKNOWN}: {why}"
    held = sorted({f"nvidia-{vf.current_type}" for vf in gpu.vfs if vf.current_type})
    if gpu.framework == pci.VFIO and held:
        return (f"{UNKNOWN}: its VFs hold {', '.join(held)}, and a VF lists only what it can "
                "take beside them")
    return ", ".join(profiles.profile_name(t.name) for t in gpu.offered_types()) or "none"


def _served(assignments: Sequence[plans.Assignment], why: Optional[str]) -> str:
    if why:
        return UNKNOWN
    if not assignments:
        return "nothing"
    names = sorted({a.name for a in assignments})
    where = "the GPU" if assignments[0].address == assignments[0].gpu else \
        f"{len(assignments)} VF(s)"
    return f"{', '.join(names)} on {where}"


def _mig_entry(gpu: pci.Gpu, need: Optional[miginstances.Need]) -> Dict[str, str]:
    """MIG mode now and the GPU instances the plan needs there ({}: no MIG-backed profile)."""
    if need is None:
        return {}
    try:
        mode = mig.modes([gpu.address])[gpu.address]
        now = "enabled" if mode.enabled else ("enable pending" if mode.enable_pending else "disabled")
    except MigError as error:
        now = f"cannot be read: {error}"
    return {"mig-mode": now, "gpu-instances": f"{need.gis} x {need.instance} for {need.profile}"}


def _type_name(number: int, vf: Optional[str] = None, plan=None) -> str:
    """``none``, ``nvidia-1141``, or with the plan's name for ``vf``: ``L40S-24Q (nvidia-1141)``."""
    if not number:
        return "none"
    for a in plan.assignments if plan is not None else ():
        if a.address == vf:  # the plan's type for vf: the number it would hold
            return f"{profiles.profile_name(a.name)} (nvidia-{number})"
    return f"nvidia-{number}"


def render(sections: Mapping[str, Sequence[Sequence[str]]]) -> str:
    """The sections as nova-compute's template renders them (``[section]``, ``key = value``)."""
    lines: List[str] = []
    for section, pairs in sections.items():
        lines.append(f"[{section}]")
        lines.extend(f"{key} = {value}" for key, value in pairs)
    return "\n".join(lines) or "no vGPU sections"

