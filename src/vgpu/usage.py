"""Who holds which vGPU on this host, and how many are left per type.

Three readers of the same facts:

* ``in_use`` (the ``vgpu-usage`` action): one ``VgpuUse`` per vGPU a guest
  holds, with the Nova instance, its project (from Nova's metadata in the
  libvirt XML), the GPU or VF, the type, the profile, its framebuffer and
  the NVIDIA licence edition the profile needs;
* ``licences`` (the same action): the licences those vGPUs need, counted
  edition by edition the way NVIDIA's licensing guides count them;
* :func:`vgpu.capacity.count` (the status line, ``list-vgpu-types`` and the
  exporter): per GPU and type, vGPUs used and available; the vGPUs it counts
  as used are the ones listed here.

How a vGPU is recognised:

* mediated devices: a ``hostdev`` of type ``mdev`` names an mdev uuid;
  ``sys/bus/mdev/devices/<uuid>`` links to the device under its parent (a
  GPU or VF) and its ``mdev_type`` links to ``mdev_supported_types/<type>``,
  whose ``name`` and ``description`` give the profile and framebuffer;
* vendor-specific VFIO: a ``hostdev`` of type ``pci`` whose address is an
  NVIDIA VF holding a type (``nvidia/current_vgpu_type`` not 0).

Capacity is decided in :mod:`vgpu.capacity` and documented in
docs/explanation/licensing.md: "used" counts vGPUs held by a guest libvirt
knows, running or shut off (Nova keeps a shut-off instance's vGPU and its
Placement allocation). ``vgpu-usage`` shows the state, and its licence counts
take running guests only, since a guest checks its licence out at boot and
returns it at shutdown.
"""

from __future__ import annotations

import os
import re
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import catalogue, guests, hostroot, pci, profiles, text
from .capacity import mdev_device
from .errors import HostReadError
from .record import NamedTuple

EDITIONS = {
    "Q": "RTX Virtual Workstation",
    "B": "Virtual PC",
    "A": "Virtual Applications",
    "C": "Virtual Compute Server",
}


class VgpuUse(NamedTuple):
    """One vGPU a guest holds."""

    instance_uuid: str
    domain: str
    state: str  # guests.RUNNING or guests.SHUT_OFF
    instance_name: str
    project_id: str
    project_name: str
    address: str  # the GPU or VF that hosts the vGPU
    gpu: str  # its physical GPU
    framework: str  # pci.MDEV or pci.VFIO
    type_id: str  # nvidia-<n>
    profile: str  # V100-8Q, L40S-12Q; the type id when the name is unknown
    name_known: bool
    framebuffer_mb: Optional[int]
    edition: str  # EDITIONS value, or "unknown"
    mdev_uuid: str = ""
    mig_slices: int = 0  # a MIG-backed profile's compute slices (H200X-2-35C: 2)
    gpu_instance: str = ""  # its VF's nvidia/gpu_instance_id, where one is held


# -- names -----------------------------------------------------------------------------

def profile_of(name: str) -> Optional[str]:
    """``GRID V100-8Q`` / ``NVIDIA L40S-12Q`` -> ``V100-8Q`` / ``L40S-12Q``; else None."""
    found = profiles.profile(name or "")
    return found.name if found else None


def edition_of(profile: str) -> str:
    """The licence edition a profile needs, from its series letter (``-12Q`` -> Q).

    A MIG-backed media profile (``A100-1-5CME``, ``H200X-1-18CME``: a C-series
    vGPU on a ``+me`` GPU instance) is in its series' edition: the ME says which
    GPU instance it sits on, not what it is licensed as.
    """
    found = profiles.profile(profile or "")
    if found is None:
        return "unknown"
    series = found.series[:-2] if found.mig and found.series.endswith("ME") else found.series
    return EDITIONS.get(series, "unknown")


def framebuffer_of(profile: str) -> Optional[int]:
    """MiB from the profile name: the number is the framebuffer in GB (``L40S-12Q`` -> 12288)."""
    found = profiles.profile(profile or "")
    return found.framebuffer_gb * 1024 if found else None


def vfio_type_name(gpu: pci.Gpu, number: int,
                   learnt: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The driver's name of VFIO type ``number`` on ``gpu``, or None when unknown.

    Only ``creatable_vgpu_types`` lists names, and a full GPU lists none: the
    VF's siblings are searched, then ``learnt`` (the catalogue's names for
    this GPU model and driver, ``{type id: name}``, learnt while VFs were free).
    """
    for function in (gpu,) + tuple(gpu.vfs):
        for vgpu_type in function.types:
            if vgpu_type.number == number and vgpu_type.framework == pci.VFIO:
                return vgpu_type.name
    return (learnt or {}).get(str(number))


# -- the usage report --------------------------------------------------------------------

def in_use(host: pci.Host, domains: Optional[Sequence[guests.Domain]] = None, *,
           learnt: Optional[catalogue.Table] = None, driver_version: Optional[str] = None) -> List[VgpuUse]:
    """Every vGPU held by a guest on this host, running guests first, then by domain name.

    ``learnt`` and ``driver_version`` name the VFIO types a full GPU no longer lists.
    """
    domains = guests.domains() if domains is None else domains
    out: List[VgpuUse] = []
    for domain in domains:
        for uuid in domain.mdevs:
            use = _mdev_use(host, domain, uuid)
            if use is not None:
                out.append(use)
        for address in domain.pci:
            use = _vfio_use(host, domain, address, learnt or {}, driver_version)
            if use is not None:
                out.append(use)
    return sorted(out, key=lambda u: (u.state != guests.RUNNING, u.domain, u.address))


def _use(domain: guests.Domain, **fields) -> VgpuUse:
    return VgpuUse(instance_uuid=domain.uuid, domain=domain.name, state=domain.state,
                   instance_name=domain.nova_name, project_id=domain.project_id,
                   project_name=domain.project_name, **fields)


def _mdev_use(host: pci.Host, domain: guests.Domain, uuid: str) -> Optional[VgpuUse]:
    found = mdev_device(uuid)
    if found is None:
        return None
    parent, type_id, type_dir = found
    gpu = host.gpu(parent)
    if gpu is None:
        return None  # another vendor's mdev (Intel GVT-g)
    name = _read(os.path.join(type_dir, "name"))
    profile = profile_of(name or "")
    framebuffer = (pci.described_framebuffer_mb(_read(os.path.join(type_dir, "description")) or "")
                   or framebuffer_of(profile or ""))
    return _use(domain, address=parent, gpu=gpu.address, framework=pci.MDEV, type_id=type_id,
                profile=profile or name or type_id, name_known=bool(name),
                framebuffer_mb=framebuffer, edition=edition_of(profile or ""), mdev_uuid=uuid)


def _vfio_use(host: pci.Host, domain: guests.Domain, address: str, learnt: catalogue.Table,
              driver_version: Optional[str]) -> Optional[VgpuUse]:
    gpu = host.gpu(address)
    if gpu is None:
        return None
    function = gpu.function(address)
    number = getattr(function, "current_type", None)
    if function is gpu or not number:
        return None  # a whole GPU passed through, or a VF without a vGPU type
    known = learnt.get(catalogue.key(gpu, driver_version))
    name = guests._text(vfio_type_name(gpu, number, known)) or None
    profile = profile_of(name or "")
    return _use(domain, address=address, gpu=gpu.address, framework=pci.VFIO,
                type_id=f"nvidia-{number}", profile=profile or f"nvidia-{number}",
                name_known=bool(name), framebuffer_mb=framebuffer_of(profile or ""),
                edition=edition_of(profile or ""), **_mig_fields(address, profile))


def _mig_fields(address: str, profile: Optional[str]) -> Dict[str, object]:
    """A MIG-backed vGPU's slices and GPU instance (``nvidia/gpu_instance_id``); {} otherwise."""
    named = profiles.mig_profile(profile or "")
    if named is None:
        return {}
    from . import miginstances

    return {"mig_slices": named.slices, "gpu_instance": miginstances.instance_id(address) or ""}


# -- totals ---------------------------------------------------------------------------------

def totals(uses: Iterable[VgpuUse]) -> Tuple[Dict[str, int], Dict[Tuple[str, str], int]]:
    """Running vGPUs per licence edition and per (project id, project name)."""
    editions: Dict[str, int] = {}
    projects: Dict[Tuple[str, str], int] = {}
    for use in uses:
        if use.state != guests.RUNNING:
            continue
        editions[use.edition] = editions.get(use.edition, 0) + 1
        key = _project(use)
        projects[key] = projects.get(key, 0) + 1
    return editions, projects


def _project(use: VgpuUse) -> Tuple[str, str]:
    return use.project_id or "unknown", use.project_name or "unknown"


# -- licences, counted the way NVIDIA counts them --------------------------------------------

# NVIDIA AI Enterprise, "NVIDIA vGPU for Compute Licensing": software enforces one licence per
# vGPU assigned to a VM, each C-series vGPU checking its own out of the NVIDIA License System at
# boot (the licence server's leases); that licence covers up to 16 vGPU instances on a single
# GPU, or one vGPU holding the whole GPU. The NVIDIA Enterprise Licensing Guide ("Licensing")
# sells NVIDIA AI Enterprise per GPU (the entitlement). Two counts, and neither is exact: the
# host cannot see whether a guest is configured to check one out, nor what the subscription
# covers (some GPUs, the H100 PCIe/NVL and H200 NVL, come with one).
VGPUS_PER_GPU_LICENCE = 16
BY_VM, BY_GPU, BY_VGPU = "vms", "gpus", "vgpus"
EXACT, AT_LEAST, GUESS, TWO_COUNTS = "exact", "at least", "guess", "two counts"
MAX_LISTED = 4  # names listed in one open case; the rest are counted


class Rule(NamedTuple):
    """How NVIDIA counts the licences of one edition (docs/explanation/licensing.md)."""

    product: str  # the licence NVIDIA sells for the edition
    basis: str  # BY_VM, BY_GPU or BY_VGPU: what one licence stands for here
    unit: str  # the same in a few words (the table)
    counts: str  # the same in a sentence (the results)
    bound: str  # EXACT, AT_LEAST (the guide's unit is invisible to the host) or GUESS


_CCU = ("concurrent users (CCU), approximated by running VMs: one per running VM, however many "
        "vGPUs it holds")
RULES = {
    EDITIONS["Q"]: Rule("NVIDIA RTX Virtual Workstation", BY_VM, "concurrent user (running VM)",
                        _CCU, EXACT),
    EDITIONS["B"]: Rule("NVIDIA Virtual PC", BY_VM, "concurrent user (running VM)", _CCU, EXACT),
    EDITIONS["A"]: Rule("NVIDIA Virtual Applications", BY_VGPU, "concurrent user (1+ per vGPU)",
                        "concurrent users of the session-based applications, whom the host cannot "
                        "see: running vGPUs, each with at least one user; a lower bound", AT_LEAST),
    EDITIONS["C"]: Rule("NVIDIA AI Enterprise", BY_GPU, "GPU (up to 16 vGPUs each)",
                        "entitlement: physical GPUs that running C-series vGPUs sit on (a vGPU on "
                        "a VF or a MIG slice counts as the GPU it belongs to), one per GPU for up "
                        f"to {VGPUS_PER_GPU_LICENCE} of its vGPUs; leases: one licence server "
                        "lease per running C-series vGPU, checked out at boot", TWO_COUNTS),
}
UNKNOWN_RULE = Rule("unknown edition", BY_VGPU, "vGPU (edition unknown)",
                    "running vGPUs whose profile, and so whose edition, is unknown", GUESS)


class Licence(NamedTuple):
    """The licences the running vGPUs of one edition need on this host."""

    edition: str  # EDITIONS value, or "unknown"
    rule: Rule
    licences: int  # counted by rule.basis
    vgpus: int  # running vGPUs of the edition
    vms: int  # running VMs holding them
    gpus: Tuple[str, ...]  # the physical GPUs they sit on


def licences(uses: Iterable[VgpuUse]) -> List[Licence]:
    """The licences running guests need, per edition, the way NVIDIA's guides count them.

    Shut-off guests need none: a guest checks its licence out at boot and
    returns it at shutdown. vPC (B) and RTX vWS (Q) count concurrent users,
    one per running VM however many vGPUs it holds; vApps (A) counts the
    users of the applications, which the host cannot see, so running vGPUs
    stand in (a lower bound); NVIDIA AI Enterprise (C) counts physical GPUs,
    the GPU a VF or a MIG slice belongs to, one licence per
    ``VGPUS_PER_GPU_LICENCE`` vGPUs on it. An unknown edition counts vGPUs.
    """
    held: Dict[str, List[VgpuUse]] = {}
    for use in uses:
        if use.state == guests.RUNNING:
            held.setdefault(use.edition, []).append(use)
    return [_licence(edition, group) for edition, group in sorted(held.items())]


def _licence(edition: str, group: Sequence[VgpuUse]) -> Licence:
    rule = RULES.get(edition, UNKNOWN_RULE)
    vms = {_vm(use) for use in group}
    per_gpu: Dict[str, int] = {}
    for use in group:
        per_gpu[use.gpu] = per_gpu.get(use.gpu, 0) + 1
    if rule.basis == BY_GPU:
        count = sum(-(-n // VGPUS_PER_GPU_LICENCE) for n in per_gpu.values())
    else:
        count = len(vms) if rule.basis == BY_VM else len(group)
    return Licence(edition, rule, count, len(group), len(vms), tuple(sorted(per_gpu)))


def _vm(use: VgpuUse) -> str:
    return use.instance_uuid or use.domain


def open_cases(uses: Sequence[VgpuUse]) -> List[str]:
    """What the licensing guides leave open on this host, one bounded sentence each."""
    running = [use for use in uses if use.state == guests.RUNNING]
    out: List[str] = []
    stopped = len(uses) - len(running)
    if stopped:
        out.append(f"{_count(stopped, 'vGPU')} held by shut-off instances: no licence counted, "
                   "since a guest checks one out at boot and returns it at shutdown; they need "
                   "licences again when they start")
    apps = [use for use in running if use.edition == EDITIONS["A"]]
    if apps:
        out.append(f"{_count(len(apps), 'running vGPU')} of {EDITIONS['A']}: NVIDIA counts every "
                   "concurrent user of the applications, and a guest serving several users "
                   "needs several licences; the host cannot see them, so one per vGPU is counted")
    unknown = [use for use in running if use.edition not in RULES]
    if unknown:
        out.append(f"{_count(len(unknown), 'running vGPU')} of unknown edition "
                   f"({_listed(sorted({use.profile for use in unknown}))}): the type's name is "
                   "unknown, so its edition is too; counted as vGPUs")
    shared = _shared_gpus(running)
    if shared:
        out.append(f"C-series vGPUs of several projects share {_listed(shared)}: this host's "
                   "total counts each GPU once and each project's count includes it; the guides "
                   "do not split a per-GPU licence between projects")
    return out


def _shared_gpus(running: Sequence[VgpuUse]) -> List[str]:
    """Physical GPUs whose running C-series vGPUs belong to more than one project."""
    projects: Dict[str, set] = {}
    for use in running:
        if RULES.get(use.edition, UNKNOWN_RULE).basis == BY_GPU:
            projects.setdefault(use.gpu, set()).add(use.project_id or use.project_name)
    return sorted(gpu for gpu, owners in projects.items() if len(owners) > 1)


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'s' if number != 1 else ''}"


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:MAX_LISTED])
    return shown + (f" and {len(names) - MAX_LISTED} more" if len(names) > MAX_LISTED else "")


# -- the action's results ---------------------------------------------------------------------

def results(uses: Sequence[VgpuUse]) -> Dict[str, object]:
    """The vgpu-usage action's results: summary, totals, licences, per vGPU, and a table.

    Juju result keys allow only lowercase letters, digits and hyphens, so
    names and ids are values under numbered keys.
    """
    from . import table

    editions, projects = totals(uses)
    running = sum(editions.values())
    found = licences(uses)
    cases = open_cases(uses)
    tail = _licence_table(found, cases) if uses else ""
    by_project: Dict[Tuple[str, str], List[VgpuUse]] = {}
    for use in uses:
        by_project.setdefault(_project(use), []).append(use)
    out: Dict[str, object] = {
        "summary": _summary(uses, running, editions, found),
        "editions": {_slug(name): str(count) for name, count in sorted(editions.items())},
        "licences": {_slug(licence.edition): _licence_entry(licence) for licence in found},
        "open-cases": {f"case-{n}": case for n, case in enumerate(cases)},
        "projects": {f"project-{n}": {"id": pid, "name": pname, "running-vgpus": str(count),
                                      "licences": _project_licences(by_project[(pid, pname)])}
                     for n, ((pid, pname), count) in enumerate(
                         sorted(projects.items(), key=lambda item: (-item[1], item[0][1])))},
        "vgpus": {f"vgpu-{n}": _entry(use) for n, use in enumerate(uses)},
    }
    rows = [[u.project_name or u.project_id or "unknown", u.instance_uuid, u.domain, u.state,
             u.address, u.type_id, u.profile + ("" if u.name_known else "?") + _mig_cell(u),
             f"{u.framebuffer_mb} MiB" if u.framebuffer_mb else "-", u.edition] for u in uses]
    room = table.MAX_TABLE_BYTES - len(tail.encode()) - 2  # the licences follow the vGPUs
    out["table"] = (table.render(["PROJECT", "INSTANCE", "DOMAIN", "STATE", "ADDRESS", "TYPE",
                                  "PROFILE", "FRAMEBUFFER", "EDITION"], rows, what="vGPUs",
                                 max_bytes=room) + "\n\n" + tail
                    if uses else "no vGPU in use on this host")
    return table.fit(out, depth=2, records="vgpus", what="vGPUs")


_EXACT = {EXACT: "yes", AT_LEAST: "no: a lower bound (see open-cases)",
          GUESS: "no: edition unknown (see open-cases)",
          TWO_COUNTS: "no: NVIDIA counts leases on the licence server (one per running vGPU) "
                      "and sells an entitlement per GPU; the host sees neither the guests' "
                      "licensing nor the subscription"}
_MARKED = {EXACT: "{}", AT_LEAST: ">={}", GUESS: "{}?", TWO_COUNTS: "{} GPU, {leases} leases"}
_SAID = {EXACT: "{n} {product}", AT_LEAST: "at least {n} {product}",
         GUESS: "{n} vGPUs of unknown edition",
         TWO_COUNTS: "{product}: {n} GPU entitlement, {leases} licence server leases"}


def _licence_entry(licence: Licence) -> Dict[str, str]:
    entry = {
        "edition": licence.edition,
        "product": licence.rule.product,
        "licences": str(licence.licences),
        "counts": licence.rule.counts,
        "exact": _EXACT[licence.rule.bound],
        "running-vgpus": str(licence.vgpus),
        "running-vms": str(licence.vms),
    }
    if licence.rule.basis == BY_GPU:
        entry["gpus"] = ", ".join(licence.gpus)
        entry["entitlement-gpus"] = str(licence.licences)
        entry["leases"] = str(licence.vgpus)  # one per running vGPU (vGPU for Compute Licensing)
    return entry


def _project_licences(mine: Sequence[VgpuUse]) -> Dict[str, str]:
    """{edition slug: licences} for one project's guests."""
    return {_slug(licence.edition): str(licence.licences) for licence in licences(mine)}


def _licence_table(found: Sequence[Licence], cases: Sequence[str]) -> str:
    """The licences per edition as a small table, then one line per open case."""
    from . import table

    if found:
        rows = [[lic.edition, lic.rule.product,
                 _MARKED[lic.rule.bound].format(lic.licences, leases=lic.vgpus),
                 lic.rule.unit, str(lic.vgpus), str(lic.vms)] for lic in found]
        text = table.render(["EDITION", "LICENCE", "COUNT", "PER", "VGPUS", "VMS"], rows,
                            what="editions")
    else:
        text = "no licence in use: no running guest holds a vGPU"
    return "\n".join([text] + [f"open case: {case}" for case in cases])


def _entry(use: VgpuUse) -> Dict[str, str]:
    entry = {
        "instance": use.instance_uuid or "unknown",
        "domain": use.domain,
        "state": use.state,
        "name": use.instance_name or "unknown",
        "project-id": use.project_id or "unknown",
        "project": use.project_name or "unknown",
        "address": use.address,
        "gpu": use.gpu,
        "framework": use.framework,
        "type": use.type_id,
        "profile": use.profile if use.name_known else f"{use.profile} (name unknown)",
        "framebuffer-mb": str(use.framebuffer_mb) if use.framebuffer_mb else "unknown",
        "edition": use.edition,
    }
    if use.mdev_uuid:
        entry["mdev"] = use.mdev_uuid
    if use.mig_slices:
        entry["mig-slices"] = str(use.mig_slices)
        entry["gpu-instance"] = use.gpu_instance or "unknown"
    return entry


def _mig_cell(use: VgpuUse) -> str:
    """`` (2 slices, GI 3)`` after a MIG-backed vGPU's profile in the table, '' otherwise."""
    if not use.mig_slices:
        return ""
    slices = f"{use.mig_slices} slice{'s' if use.mig_slices != 1 else ''}"
    return f" ({slices}, GI {use.gpu_instance or '?'})"


def _summary(uses: Sequence[VgpuUse], running: int, editions: Mapping[str, int],
             found: Sequence[Licence]) -> str:
    if not uses:
        return "no vGPU in use on this host"
    stopped = len(uses) - running
    parts = ", ".join(f"{count} {name}" for name, count in sorted(editions.items()))
    text = f"{running} vGPU{'s' if running != 1 else ''} in running guests"
    text += f" ({parts})" if parts else ""
    if found:
        text += "; licences: " + ", ".join(
            _SAID[lic.rule.bound].format(n=lic.licences, product=lic.rule.product,
                                         leases=lic.vgpus) for lic in found)
    if stopped:
        text += f"; {stopped} held by shut-off instances (not licensed while off)"
    return text


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


def _read(path) -> Optional[str]:
    """A sysfs attribute as one printable line (at most 255 characters); None if absent or unreadable."""
    try:
        value = hostroot.read_text(path)
    except HostReadError:
        return None
    return text.one_line(value, 255) or None if value is not None else None
