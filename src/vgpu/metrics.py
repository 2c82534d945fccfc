"""What the exporter reports: every metric, and one reading of the host into samples.

The exporter (``src/vgpu_exporter.py``, run by ``nvidia-vgpu-exporter.service``,
see :mod:`vgpu.exporter`) calls :func:`collect` on each scrape. It reads what
the actions read, the same way: PCI discovery, libvirt's domain files, the
types learnt while VFs were free (:mod:`vgpu.catalogue`), the boot step's data
and result (:mod:`vgpu.bootdata`, :mod:`vgpu.bootresult`) and, where the
driver is, NVML (:mod:`vgpu.nvml`); and what the exporter's
:class:`vgpu.xid.Watch` last read of the kernel's Xid lines. Capacity is :func:`vgpu.capacity.count`,
so the ``nvidia_vgpu_type_*`` series equal ``list-vgpu-types``' max and
available instances and the vGPUs ``vgpu-usage`` lists.

:data:`METRICS` names every metric, its help and its labels, in one place:
docs/reference/metrics.md is checked against it, and the exporter emits
nothing else. Every name has the one prefix ``nvidia_vgpu_``; all are gauges
(an ``_info`` gauge is 1 and carries its facts in labels). A value that
cannot be told is left out (no series), never guessed. The ``nvidia_vgpu_boot_*``
series describe the last restore after a boot, and ``run_by`` says who ran it:
the boot step, or a hook that did its work (:func:`vgpu.boot.catch_up`).

A source that cannot be read is a sample, never a failed scrape:
``nvidia_vgpu_exporter_source_up{source}`` is 0 for it and what depends on
it is left out. Nothing here imports ops, nor prometheus_client.
"""

from __future__ import annotations

import logging
import time
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from . import bootfile, bootresult, capacity, catalogue, guests, kernel, pci, profiles
from .record import NamedTuple

log = logging.getLogger(__name__)

PREFIX = "nvidia_vgpu_"


class Metric(NamedTuple):
    """One metric the exporter emits."""

    name: str
    help: str
    labels: Tuple[str, ...] = ()


METRICS: Tuple[Metric, ...] = (
    Metric("nvidia_vgpu_exporter_source_up",
           "1 when the source was read at this scrape, 0 when it could not be (the exporter's "
           "log says why): pci, guests, boot_data, boot_result, nvml (only where the driver is), "
           "journal (the kernel's messages), and capacity and mapping (the series worked out "
           "from them)", ("source",)),
    Metric("nvidia_vgpu_exporter_scrape_duration_seconds",
           "How long reading the host took at this scrape"),
    Metric("nvidia_vgpu_driver_info",
           "The loaded vGPU host driver (kernel module nvidia), 1; absent when none is loaded",
           ("version",)),
    Metric("nvidia_vgpu_gpu_info",
           "Each NVIDIA GPU, 1: its model, PCI device id, vGPU framework (mdev, vfio or none "
           "while it exposes neither) and the kernel driver it is bound to",
           ("gpu", "model", "device_id", "framework", "driver")),
    Metric("nvidia_vgpu_gpu_virtual_functions",
           "SR-IOV virtual functions enabled on the GPU (0 after a reboot until sriov-manage "
           "runs)", ("gpu",)),
    Metric("nvidia_vgpu_type_info",
           "Each vGPU type a GPU offers, as list-vgpu-types lists it, 1: its name and framework",
           ("gpu", "type", "name", "framework")),
    Metric("nvidia_vgpu_type_max_instances",
           "vGPUs of the type one GPU holds (list-vgpu-types' max-instances); absent when "
           "unknown", ("gpu", "type")),
    Metric("nvidia_vgpu_type_available_instances",
           "vGPUs of the type a new guest could get now (list-vgpu-types' available-instances,"
           " the status line's free); absent when unknown", ("gpu", "type")),
    Metric("nvidia_vgpu_type_used_instances",
           "vGPUs of the type held by running or shut-off guests (what vgpu-usage lists); "
           "what cannot be read counts here", ("gpu", "type")),
    Metric("nvidia_vgpu_type_uncertain_instances",
           "Of the used vGPUs, those counted as used because something could not be read",
           ("gpu", "type")),
    Metric("nvidia_vgpu_guest_info",
           "One series per vGPU a guest holds, 1 (more where as many guests' definitions name "
           "the device): the type and profile, the GPU, the device (VF address or mdev UUID) "
           "and the guest's state (running, shut off); no tenant identity "
           "(nvidia_vgpu_guest_tenant_info)",
           ("type", "profile", "gpu", "device", "state")),
    Metric("nvidia_vgpu_boot_last_run_timestamp_seconds",
           "When the restore after a boot last finished, in seconds since the epoch, and who ran "
           "it: boot_step (nvidia-vgpu-vfs.service) or hook (a hook did the boot step's work); "
           "absent before its first run", ("run_by",)),
    Metric("nvidia_vgpu_boot_duration_seconds",
           "How long the last restore after a boot took, and who ran it", ("run_by",)),
    Metric("nvidia_vgpu_boot_exit_code",
           "The last restore's exit status: 0 all restored, 1 something not, 2 its data "
           "could not be read; and who ran it", ("run_by",)),
    Metric("nvidia_vgpu_boot_gpu_result",
           "Each GPU at the last restore after a boot, 1, with its result: restored, left_alone "
           "(bound to another driver) or not_restored; and who ran it", ("gpu", "result", "run_by")),
    Metric("nvidia_vgpu_boot_gpu_duration_seconds",
           "How long the last restore after a boot took for the GPU, and who ran it",
           ("gpu", "run_by")),
    Metric("nvidia_vgpu_mapping_applied",
           "1 when the host holds what vgpu-device-mappings puts on the GPU (its VFs enabled, "
           "each published VF holding its type), 0 otherwise; SR-IOV GPUs the mapping selects",
           ("gpu",)),
    Metric("nvidia_vgpu_published_vf_holds_type",
           "Each VF published to Nova with a vGPU type: 1 while it holds that type, 0 when it "
           "holds none or another (after a reboot the boot step did not restore)",
           ("gpu", "vf", "profile")),
    Metric("nvidia_vgpu_vgpu_licensed",
           "NVML: 1 when the vGPU's guest holds a licence, 0 when not",
           ("gpu", "vgpu_instance", "vgpu_uuid", "type")),
    Metric("nvidia_vgpu_vgpu_license_state",
           "NVML's licence state of the vGPU: 0 unknown, 1 uninitialized, 2 unlicensed in the "
           "grace period, 3 unlicensed and restricted, 4 unlicensed, 5 licensed",
           ("gpu", "vgpu_instance", "vgpu_uuid", "type")),
    Metric("nvidia_vgpu_vgpu_framebuffer_used_bytes",
           "NVML: framebuffer the vGPU's guest uses", ("gpu", "vgpu_instance", "vgpu_uuid", "type")),
    Metric("nvidia_vgpu_vgpu_utilization_ratio",
           "NVML: the vGPU's latest utilisation sample per engine (sm, memory, encoder, decoder), "
           "0 to 1", ("gpu", "vgpu_instance", "vgpu_uuid", "type", "engine")),
    Metric("nvidia_vgpu_xid_errors",
           "Xid errors the kernel logged for the GPU this boot (NVRM: Xid lines in the journal); "
           "0 from the start for each Xid number the runbook names", ("gpu", "xid")),
    Metric("nvidia_vgpu_xid_last_seen_timestamp_seconds",
           "When the kernel last logged the Xid for the GPU this boot, in seconds since the "
           "epoch; absent while it has not", ("gpu", "xid")),
    Metric("nvidia_vgpu_xid_gpu_instance_errors",
           "Xid errors the kernel logged this boot for a MIG GPU instance of the GPU (NVRM: Xid "
           "(PCI:... GPU-I:n) lines); also counted in nvidia_vgpu_xid_errors",
           ("gpu", "gpu_instance", "xid")),
    Metric("nvidia_vgpu_xid_gpu_lost",
           "1 when the GPU is lost as the source says: kernel (Xid 79 or fallen off the bus), "
           "nvml (GPU is lost) or pci (gone from sysfs); 0 otherwise", ("gpu", "source")),
    Metric("nvidia_vgpu_gpu_unidentified_vgpu_instances",
           "NVML: active vGPUs on the GPU for which NVML gave neither the vGPU's UUID nor its "
           "VM's (each still has its own series by vgpu_instance, NVML's id on the GPU)",
           ("gpu",)),
    Metric("nvidia_vgpu_guest_tenant_info",
           "Only where exporter-tenant-identities is on, and only to a root scraper (the "
           "collector): the Nova instance and project of each vGPU a guest holds, 1, by GPU "
           "and device (as nvidia_vgpu_guest_info)",
           ("gpu", "device", "instance_uuid", "project_id", "project_name")),
    Metric("nvidia_vgpu_vgpu_tenant_info",
           "Only where exporter-tenant-identities is on, and only to a root scraper: the Nova "
           "instance NVML names as each vGPU's VM, 1, by GPU and vgpu_instance (as the "
           "nvidia_vgpu_vgpu_* series)", ("gpu", "vgpu_instance", "instance_uuid")),
)
BY_NAME = {metric.name: metric for metric in METRICS}
# Where a scrape reads, or what it works out, each up or down on its own: capacity (the
# nvidia_vgpu_type_* and guest series) and mapping (whether the host holds the boot data's
# types) are worked out from pci, guests, the learnt types and boot_data.
SOURCES = ("pci", "guests", "capacity", "boot_data", "mapping", "boot_result", "nvml", "journal")
BOOT_RESULTS = {"restored": "restored", "left alone": "left_alone", "not restored": "not_restored"}


class Sample(NamedTuple):
    """One value of one metric: ``labels`` in the order :data:`METRICS` gives them."""

    name: str
    labels: Tuple[str, ...]
    value: float


class _Out:
    """The samples of one scrape, each checked against METRICS."""

    def __init__(self) -> None:
        self.samples: List[Sample] = []

    def add(self, name: str, value: float, /, **labels: str) -> None:
        metric = BY_NAME[name]
        if set(labels) != set(metric.labels):
            raise ValueError(f"{name} takes the labels {metric.labels}, not {tuple(labels)}")
        self.samples.append(Sample(name, tuple(str(labels[k]) for k in metric.labels), float(value)))

    def up(self, source: str, ok: bool) -> None:
        self.add("nvidia_vgpu_exporter_source_up", 1 if ok else 0, source=source)


def collect(nvml_session=None, clock: Callable[[], float] = time.monotonic,
            xid_watch=None, tenants: bool = False) -> List[Sample]:
    """One reading of the host as samples; never raises (module doc).

    ``nvml_session``: a :class:`vgpu.nvml.Session` kept by the exporter (None: NVML not read);
    ``xid_watch``: its :class:`vgpu.xid.Watch` (None: no Xid series).
    ``tenants``: add the ``*_tenant_info`` series (instance and project identities); no
    other series ever carries them.
    """
    started = clock()
    out = _Out()
    driver_version = kernel.loaded_driver_version()  # None, logged, when it cannot be read
    host = _guarded(out, "pci", pci.discover)
    domains: List[guests.Domain] = []
    unread: List[str] = []
    plans = None
    if host is not None:
        _gpus(out, host)
        found = _guarded(out, "guests", lambda: guests.domains(unread), report=False)
        if found is not None:
            domains = found
            out.up("guests", not unread)
            _part(out, "capacity", _capacity, host, driver_version, domains, unread, tenants)
        plans = _guarded(out, "boot_data", _plans)
        if plans is not None:
            _part(out, "mapping", _mapping, host, driver_version, plans)
    _boot(out)
    reading = _nvml(out, nvml_session, [g.address for g in host.gpus] if host else [], tenants)
    if xid_watch is not None:
        _xid(out, xid_watch, host, reading, plans)
    version = driver_version or (reading.driver_version if reading is not None else "")
    if version:
        out.add("nvidia_vgpu_driver_info", 1, version=version)
    out.add("nvidia_vgpu_exporter_scrape_duration_seconds", max(0.0, clock() - started))
    return out.samples


def _guarded(out: _Out, source: str, read: Callable, report: bool = True):
    """``read()``; None with ``source`` down when it fails (whatever it raises).

    ``report``: say the source is up when it worked (else the caller says how it went).
    """
    try:
        value = read()
    except Exception as error:  # a scrape says what failed; it never fails
        log.warning("%s: %s", source, error)
        out.up(source, False)
        return None
    if report:
        out.up(source, True)
    return value


def _part(out: _Out, source: str, fill: Callable[..., None], *args) -> None:
    """``fill(part, *args)``; its samples join ``out`` only whole, with ``source`` up or down."""
    part = _Out()

    def whole() -> bool:
        fill(part, *args)
        return True

    if _guarded(out, source, whole):
        out.samples.extend(part.samples)


def _gpus(out: _Out, host: pci.Host) -> None:
    for gpu in host.gpus:
        out.add("nvidia_vgpu_gpu_info", 1, gpu=gpu.address, model=gpu.model,
                device_id=gpu.device_id, framework=gpu.framework or "none",
                driver=gpu.driver or "none")
        if gpu.sriov:
            out.add("nvidia_vgpu_gpu_virtual_functions", len(gpu.vfs), gpu=gpu.address)


def _capacity(out: _Out, host: pci.Host, driver_version: Optional[str],
              domains: Sequence[guests.Domain], unread: Sequence[str], tenants: bool) -> None:
    """Per GPU and offered type, as list-vgpu-types counts them; one series per vGPU held."""
    from . import usage

    learnt = catalogue.load() if any(g.framework == pci.VFIO for g in host.gpus) else {}
    offered = catalogue.offered(host, driver_version, learnt)
    whole = catalogue.whole_gpus(host, learnt)
    seen = capacity.held(mdevs=any(g.framework != pci.VFIO for g in host.gpus),
                         domains=domains, problems=unread)
    for gpu in host.gpus:
        for vgpu_type in offered.get(gpu.address) or gpu.offered_types():
            labels = {"gpu": gpu.address, "type": vgpu_type.id}
            most = capacity.most(gpu, vgpu_type, whole.get(gpu.address))
            found = capacity.count([gpu], vgpu_type.id, seen, whole_gb=whole, fits=most)
            out.add("nvidia_vgpu_type_info", 1, name=vgpu_type.name,
                    framework=vgpu_type.framework, **labels)
            if most is not None:
                out.add("nvidia_vgpu_type_max_instances", most, **labels)
            if found.available is not None:
                out.add("nvidia_vgpu_type_available_instances", found.available, **labels)
            out.add("nvidia_vgpu_type_used_instances", found.used, **labels)
            out.add("nvidia_vgpu_type_uncertain_instances", found.uncertain, **labels)
    held: Dict[Tuple[str, ...], int] = {}  # one series per device and state, however many name it
    for use in usage.in_use(host, domains, learnt=learnt, driver_version=driver_version):
        device = use.mdev_uuid or use.address
        key = (use.type_id, use.profile, use.gpu, device, use.state)
        held[key] = held.get(key, 0) + 1
        if tenants:
            out.add("nvidia_vgpu_guest_tenant_info", 1, gpu=use.gpu, device=device,
                    instance_uuid=use.instance_uuid, project_id=use.project_id,
                    project_name=use.project_name)
    for series, count in held.items():
        out.add("nvidia_vgpu_guest_info", count,
                **dict(zip(("type", "profile", "gpu", "device", "state"), series)))


def _plans() -> list:
    """The GPUs the boot data names (:mod:`vgpu.bootdata`); none while no mapping is in force."""
    from . import bootdata

    try:
        return bootdata.parse(bootdata.load(f"/{bootfile.DATA_FILE}"))[0]
    except bootdata.DataError as error:
        if "does not exist" in str(error):  # no mapping in force yet: nothing to say
            return []
        raise ValueError(f"/{bootfile.DATA_FILE} {error}") from None


def _mapping(out: _Out, host: pci.Host, driver_version: Optional[str], plans: Sequence) -> None:
    """Whether each GPU the boot data names holds what was published (see METRICS)."""
    learnt: Optional[catalogue.Table] = None
    for plan in plans:
        gpu = host.gpu(plan.address)
        if gpu is None or gpu.address != plan.address:
            out.add("nvidia_vgpu_mapping_applied", 0, gpu=plan.address)
            continue
        if learnt is None and plan.vfs:
            learnt = catalogue.load()
        known = (learnt or {}).get(catalogue.key(gpu, driver_version), {})
        by_index = {vf.index: vf for vf in gpu.vfs}
        applied = bool(gpu.vfs) or not gpu.sriov
        for wanted in plan.vfs:
            vf = by_index.get(wanted.virtfn)
            holds = vf is not None and _holds(gpu, vf, wanted, known)
            applied = applied and holds
            out.add("nvidia_vgpu_published_vf_holds_type", 1 if holds else 0, gpu=gpu.address,
                    vf=vf.address if vf is not None else f"virtfn{wanted.virtfn}",
                    profile=profiles.profile_name(wanted.name))
        out.add("nvidia_vgpu_mapping_applied", 1 if applied else 0, gpu=gpu.address)


def _holds(gpu: pci.Gpu, vf: pci.VirtualFunction, wanted, known: Mapping[str, str]) -> bool:
    """Whether ``vf`` holds the profile the boot data gives it (by name; by id if unnamed)."""
    from .usage import vfio_type_name

    if not vf.current_type:
        return False
    name = vfio_type_name(gpu, vf.current_type, known)
    if name is None:
        return bool(wanted.number) and vf.current_type == wanted.number
    spelt = profiles.key_form
    return spelt(profiles.profile_name(name)) == spelt(profiles.profile_name(wanted.name))


def _boot(out: _Out) -> None:
    result = _guarded(out, "boot_result", bootresult.load)  # None: none yet, or unreadable
    if result is None:
        return
    by = result.run_by  # "" (the label absent) in a result written before it was recorded
    out.add("nvidia_vgpu_boot_last_run_timestamp_seconds", result.finished, run_by=by)
    out.add("nvidia_vgpu_boot_duration_seconds", result.seconds, run_by=by)
    out.add("nvidia_vgpu_boot_exit_code", result.status, run_by=by)
    for gpu in result.gpus:
        out.add("nvidia_vgpu_boot_gpu_result", 1, gpu=gpu.address,
                result=BOOT_RESULTS[gpu.result], run_by=by)
        out.add("nvidia_vgpu_boot_gpu_duration_seconds", gpu.seconds, gpu=gpu.address, run_by=by)


def _nvml(out: _Out, session, addresses: Sequence[str], tenants: bool = False):
    """NVML's per-vGPU figures; nothing (not even the source) where the driver is absent.

    Each vGPU's series are told apart by ``vgpu_instance``, the id NVML lists it by on
    its GPU, which NVML always has: two vGPUs whose UUID and VM NVML cannot give keep
    a series each, and are counted per GPU (``nvidia_vgpu_gpu_unidentified_vgpu_instances``).
    """
    if session is None:
        return None
    try:
        reading = session.read(addresses)
    except Exception as error:  # never a failed scrape
        log.warning("nvml: %s", error)
        out.up("nvml", False)
        return None
    for problem in reading.errors:
        log.warning("nvml: %s", problem)
    if not reading.present:
        return reading
    out.up("nvml", not reading.errors)
    unidentified: Dict[str, int] = {}
    for vgpu in reading.vgpus:
        unidentified.setdefault(vgpu.gpu, 0)
        if not vgpu.uuid and not vgpu.instance_uuid:
            unidentified[vgpu.gpu] += 1
        _vgpu(out, vgpu, tenants)
    for gpu, count in unidentified.items():
        out.add("nvidia_vgpu_gpu_unidentified_vgpu_instances", count, gpu=gpu)
    return reading


def _vgpu(out: _Out, vgpu, tenants: bool) -> None:
    """One vGPU's NVML series, told apart by ``vgpu_instance`` (see :func:`_nvml`)."""
    labels = {"gpu": vgpu.gpu, "vgpu_instance": str(vgpu.instance), "vgpu_uuid": vgpu.uuid,
              "type": vgpu.type_id}
    if tenants and vgpu.instance_uuid:
        out.add("nvidia_vgpu_vgpu_tenant_info", 1, gpu=vgpu.gpu,
                vgpu_instance=str(vgpu.instance), instance_uuid=vgpu.instance_uuid)
    if vgpu.licensed is not None:
        out.add("nvidia_vgpu_vgpu_licensed", 1 if vgpu.licensed else 0, **labels)
    if vgpu.license_state is not None:
        out.add("nvidia_vgpu_vgpu_license_state", vgpu.license_state, **labels)
    if vgpu.framebuffer_bytes is not None:
        out.add("nvidia_vgpu_vgpu_framebuffer_used_bytes", vgpu.framebuffer_bytes, **labels)
    for engine, ratio in vgpu.utilization:
        out.add("nvidia_vgpu_vgpu_utilization_ratio", ratio, engine=engine, **labels)


def _xid(out: _Out, watch, host: Optional[pci.Host], reading, plans) -> None:
    """Xid errors and lost GPUs (:mod:`vgpu.xid`): what the watch's last read of the journal left."""
    up = watch.journal_up()  # None while its first pass runs: said neither way
    if up is not None:
        out.up("journal", up)
    lost = reading.lost if reading is not None and reading.present else None
    for sample in watch.samples(None if host is None else [g.address for g in host.gpus],
                                mapped=[plan.address for plan in plans or ()], nvml_lost=lost):
        out.add(sample.name, sample.value, **dict(sample.labels))


def families(samples: Iterable[Sample]) -> Dict[str, List[Sample]]:
    """Samples by metric, in :data:`METRICS` order (every metric, an empty list when none)."""
    out: Dict[str, List[Sample]] = {metric.name: [] for metric in METRICS}
    for sample in samples:
        out[sample.name].append(sample)
    return out

