"""The fleet: what each unit tells its peers and the leader's report (the drain plan: vgpu.drain).

Pure functions on plain data (no ops, no host access): the ops-facing helper
``src/fleet.py`` gathers the inputs and sets what these return.

**The record.** Each unit publishes one JSON record under :data:`KEY` in its
own databag of the ``fleet`` peer relation: slow-changing facts only (host
name, charm revision, driver version, each GPU's board, framework, MIG-backed
mapping, mapped type and its maximum, live-migration readiness, boot result,
pause state, NVML's vGPU migration metadata of each GPU). Guest identities and
live capacity never go there: they are the tenants', and counts that change
with every guest would fire relation-changed on every unit all day. The
record is versioned (:data:`SCHEMA`) and bounded (:data:`LIMIT` bytes, every
string cut, at most :data:`MAX_GPUS` GPUs); a record of another schema,
garbage, an empty or oversized databag is a :class:`Peer` with a ``problem``,
counted in the inconsistencies, never an exception.

**Live migration between two hosts** needs, per NVIDIA and Red Hat: the same
vGPU host driver, the same board (device id and memory size: no live
migration between H100 and H200 boards, nor between the 80 GB PCIe and 94 GB
NVL variants), the type mapped at the destination, and both hosts ready
(:class:`Readiness`). Where NVML gave the metadata of the running vGPU and of
the destination's GPU, NVIDIA's own verdict (``nvmlGetVgpuCompatibility``)
decides instead of these rules (:mod:`vgpu.drain` plans the moves).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from .record import NamedTuple

SCHEMA = 1  # the record's version: a reader takes only its own
KEY = "fleet"  # the unit databag key that holds the record
RELATION = "fleet"  # the peer relation (metadata.yaml)
LIMIT = 16_384  # bytes of one unit's record (8 GPUs with metadata take about 6 KiB)
MAX_GPUS = 16
MAX_TEXT = 80  # characters of any one string of the record
MAX_BLOCKERS = 8
MAX_METADATA = 1_024  # characters of one GPU's encoded NVML metadata (380 bytes as base64: 508)

# Running versions below these cannot live-migrate a vGPU (Nova 31's check for VFIO VFs;
# mdevs: libvirt 8.6.0 and QEMU 8.1.0): see docs/how-to/live-migration.md.
MINIMUM = {"vfio": (("libvirt", (10, 0, 0)), ("qemu", (8, 2, 2))),
           "mdev": (("libvirt", (8, 6, 0)), ("qemu", (8, 1, 0)))}
UNREAD = "unknown"

LIVE, NONE = "live", "none"
# Patterns compiled by re when first used (the report, a peer's record), not by every hook.
RESOURCE_CLASS = r"(VGPU|CUSTOM_[A-Z0-9_]{1,248})\Z"  # Placement's class names
HOST_NAME = (r"(?=.{1,253}\Z)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
             r"(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z")


def host_name(value: str) -> bool:
    """Whether ``value`` is a host name (RFC 1123: letters, digits, hyphens, dotted labels)."""
    return bool(re.match(HOST_NAME, value or ""))  # NVIDIA's verdict on a vGPU and a destination GPU


class RecordError(ValueError):
    """A peer's record that cannot be used (absent, garbage, another schema, too big)."""


class Readiness(NamedTuple):
    """Whether this host can live-migrate vGPU guests: the plain input the charm fills.

    The charm knows ``vfio_live_migration`` (its option); the running
    versions, post-copy and further blockers come from the live-migration
    module (``vgpu.livemigration``) where it is wired in; "" and None are unknown.
    """

    libvirt: str = ""
    qemu: str = ""
    vfio_live_migration: bool = False
    post_copy: Optional[bool] = None  # [libvirt] live_migration_permit_post_copy
    blockers: Tuple[str, ...] = ()
    live_migration: Optional[bool] = None  # nova-compute's live migration on; None unknown
    warnings: Tuple[str, ...] = ()  # what does not block but should be changed (downtime)
    source: str = ""  # where libvirt's and QEMU's versions came from (vgpu.livemigration)


class GpuRecord(NamedTuple):
    """One GPU as its peers see it."""

    address: str
    device_id: str
    memory_gb: int = 0  # 0: unknown
    framework: str = ""  # mdev, vfio, "" (none yet)
    mig: bool = False  # a MIG-backed type is mapped (the charm keeps MIG mode on for it)
    type_id: str = ""  # the mapped type, nvidia-<n>; "" when none
    type_name: str = ""  # its name (L40S-12Q) where sysfs says it
    most: int = 0  # how many of that type the GPU holds; 0: unknown
    metadata: str = ""  # nvmlDeviceGetVgpuMetadata, base64; "" where NVML did not give it
    resource_class: str = ""  # what Placement counts the type in (VGPU, CUSTOM_...); "" none
    whole: bool = False  # given whole to guests (passthrough)
    tag: str = ""  # its VFs' device spec live_migratable: "true", "false", "" (not set)

    @property
    def board(self) -> str:
        """Device id and memory size: what NVIDIA calls the same board (``0x2335/141GB``)."""
        return f"{self.device_id}/{self.memory_gb or '?'}GB"


class Record(NamedTuple):
    """What one unit publishes."""

    host: str  # the hypervisor host name (Nova's [DEFAULT] host default)
    revision: str = ""  # the charm's revision; "" unknown
    driver: str = ""  # the vGPU host driver version loaded; "" none
    paused: bool = False
    boot: str = ""  # the boot step's last result: ok, failed <n>, unreadable, "" (never ran)
    readiness: Readiness = Readiness()
    gpus: Tuple[GpuRecord, ...] = ()
    gpu_count: int = 0  # the host's GPUs: more than MAX_GPUS means the record was cut
    tag_since: int = 0  # when its VFs' live_migratable tag last changed (epoch seconds; 0 ever)

    def ready(self) -> bool:
        """Whether this host can live-migrate vGPUs (nothing blocks it)."""
        return not blockers(self)


class Peer(NamedTuple):
    """One unit of the relation: its record, or why it cannot be read."""

    unit: str
    record: Optional[Record] = None
    problem: str = ""


# -- the record -------------------------------------------------------------------------

def blockers(record: Record) -> List[str]:
    """What keeps this host's vGPU guests from live-migrating, from its readiness.

    The host's own blockers (:mod:`vgpu.livemigration`) first; what this module
    derives from the versions and flags is added only where none of them says
    it already (a record of an older unit may carry flags without blockers).
    """
    ready = record.readiness
    out = list(ready.blockers)
    said = " ".join(out).lower()
    frameworks = {gpu.framework for gpu in record.gpus if gpu.framework}
    if "vfio" in frameworks and not ready.vfio_live_migration and "vfio-live-migration" not in said:
        out.append("vfio-live-migration is off")
    if ready.live_migration is False and "live migration off" not in said:
        out.append("nova-compute has live migration off")
    if ready.post_copy and "post-copy" not in said:
        out.append("post-copy is permitted (QEMU refuses VFIO migration with it)")
    for framework in sorted(frameworks):
        for name, least in MINIMUM.get(framework, ()):
            running = _version(getattr(ready, name))
            if running is not None and running < least and name not in said:
                out.append(f"{name} {getattr(ready, name)} is older than "
                           f"{'.'.join(map(str, least))}")
    return list(dict.fromkeys(out))[:MAX_BLOCKERS]


class Published(NamedTuple):
    """What this unit publishes to nova-compute that its record tells (from the published sections)."""

    mdev_classes: Mapping[str, str] = {}  # {mdev type: VGPU or its CUSTOM_VGPU_* mdev_class}
    reporting: bool = False  # [pci] report_in_placement: VFIO VFs and whole GPUs have classes
    tagged: Mapping[str, str] = {}  # {VF address: its device spec's live_migratable, "true"}


def published(sections) -> Published:
    """:class:`Published` from ``vgpu.novaconf`` sections as the relation holds them."""
    from . import novaconf

    tagged = {}
    for key, value in sections.get("pci", []):
        if key != "device_spec":
            continue
        try:
            spec = json.loads(value)
            flag = str(spec.get("live_migratable", "")).strip().lower()
            tagged[str(spec["address"])] = (
                "true" if flag in ("yes", "true", "1", "on") else "false" if flag else "")
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return Published(novaconf.mdev_classes(sections), novaconf.reports_in_placement(sections),
                     tagged)


def gpu_records(host, mapping: Mapping[str, Sequence[str]],
                metadata: Mapping[str, str] = {}, given: Optional[Published] = None, *,
                learnt: Mapping[str, Mapping[str, str]] = {}, driver_version: str = "",
                limit: Optional[int] = MAX_GPUS) -> Tuple[GpuRecord, ...]:
    """Each GPU of ``host`` (a ``pci.Host``) as its peers see it; reads nothing.

    ``mapping``: what nova-compute has, ``{type or resource class: addresses}``
    (mdev types are found there; a VFIO GPU's type is what its VFs hold).
    ``metadata``: NVML's migration metadata per GPU address, encoded.
    ``given``: the published classes and tags. ``learnt``: the catalogue
    (:func:`vgpu.catalogue.load`), which names a VFIO type no VF lists any more
    (every one assigned). ``limit``: the record's bound; None for every GPU
    (this host's own drain plan).
    """
    from . import capacity, catalogue, pci, profiles

    given = given or Published()
    out = []
    for gpu in host.gpus[:limit]:
        functions = {gpu.address, *(vf.address for vf in gpu.vfs)}
        # The GPU's types, then its VFs' in order, the first of each number kept. A GPU's VFs
        # mostly share one listing (discovery keeps one tuple per listing): each walked once.
        offered = {t.number: t for t in gpu.types}
        for listed in {id(vf.types): vf.types for vf in gpu.vfs}.values():
            for known in listed:
                offered.setdefault(known.number, known)
        numbers = sorted({vf.current_type for vf in gpu.vfs if vf.current_type})
        if gpu.framework != pci.VFIO:
            numbers = sorted(int(t.split("-")[1]) for t, addresses in mapping.items()
                             if t.startswith("nvidia-") and t.split("-")[1].isdigit()
                             and functions & set(addresses))
        whole = catalogue.listed_whole(gpu) or catalogue.WHOLE_GPU_GB.get(gpu.device_id)
        if gpu.framework != pci.VFIO:
            sizes = [t.framebuffer_mb for t in offered.values() if t.framebuffer_mb]
            whole = round(max(sizes) / 1024) if sizes else whole
        kind = offered.get(numbers[0]) if numbers else None
        if kind is None and numbers and gpu.framework == pci.VFIO:
            # Every VF of the type assigned: none lists it; the catalogue learnt its name.
            from .usage import vfio_type_name

            name = vfio_type_name(gpu, numbers[0],
                                  learnt.get(catalogue.key(gpu, driver_version or None)))
            kind = pci.VgpuType(numbers[0], name, pci.VFIO) if name else None
        given_whole = any(gpu.address in addresses for c, addresses in mapping.items()
                          if not c.startswith("nvidia-"))
        classes = [c for c, addresses in mapping.items()
                   if not c.startswith("nvidia-") and functions & set(addresses)]
        if gpu.framework == pci.VFIO or given_whole:
            resource_class = classes[0] if classes and given.reporting else ""
        else:
            resource_class = given.mdev_classes.get(f"nvidia-{numbers[0]}", "VGPU") \
                if numbers else ""
        most = capacity.most(gpu, kind, whole) if kind is not None else None
        if kind is not None and most is None and gpu.framework == pci.VFIO and numbers and \
                not any(vf.types for vf in gpu.vfs if not vf.current_type):
            most = sum(1 for vf in gpu.vfs if vf.current_type == numbers[0])  # all assigned
        name = (kind.name.split()[-1] if kind is not None and kind.name else "")
        tags = {given.tagged.get(vf.address, "") for vf in gpu.vfs
                if vf.address in given.tagged}
        out.append(GpuRecord(
            gpu.address, gpu.device_id, int(whole or 0), gpu.framework or "",
            bool(name and profiles.mig_profile(name) is not None),
            f"nvidia-{numbers[0]}" if numbers and not given_whole else "", name, int(most or 0),
            metadata.get(gpu.address, ""), resource_class, given_whole,
            tags.pop() if len(tags) == 1 else ""))
    return tuple(out)


def encode(record: Record) -> str:
    """The record as the databag holds it: compact JSON, bounded (RecordError if it cannot be)."""
    gpus: List[Dict[str, object]] = [
        {"a": _cut(g.address), "dev": _cut(g.device_id), "gb": int(g.memory_gb),
         "fw": _cut(g.framework), "mig": bool(g.mig), "type": _cut(g.type_id),
         "name": _cut(g.type_name), "max": int(g.most),
         "md": g.metadata if len(g.metadata) <= MAX_METADATA else "",
         "rc": _cut(g.resource_class), "w": bool(g.whole), "lmt": _cut(g.tag, 8)}
        for g in record.gpus[:MAX_GPUS]]
    data = {
        "v": SCHEMA, "host": _cut(record.host), "revision": _cut(record.revision),
        "driver": _cut(record.driver), "paused": bool(record.paused), "boot": _cut(record.boot),
        "lm": {"libvirt": _cut(record.readiness.libvirt), "qemu": _cut(record.readiness.qemu),
               "vfio": bool(record.readiness.vfio_live_migration),
               "post-copy": record.readiness.post_copy,
               "blockers": [_cut(b, 200) for b in record.readiness.blockers[:MAX_BLOCKERS]],
               "on": record.readiness.live_migration, "src": _cut(record.readiness.source, 16),
               "warnings": [_cut(w, 400) for w in record.readiness.warnings[:MAX_BLOCKERS]]},
        "gpus": gpus, "n": int(record.gpu_count),
        "since": int(record.tag_since),
    }
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > LIMIT:  # metadata goes first: the rules still work without it
        for gpu in gpus:
            gpu["md"] = ""
        text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    if len(text.encode()) > LIMIT:
        raise RecordError(f"the fleet record takes {len(text.encode())} bytes, above {LIMIT}")
    return text


def decode(text: Optional[str]) -> Record:
    """A peer's record; RecordError says why it cannot be used."""
    if not text:
        raise RecordError("publishes nothing yet")
    if len(text.encode(errors="replace")) > LIMIT:
        raise RecordError(f"publishes {len(text.encode(errors='replace'))} bytes, above {LIMIT}")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        raise RecordError("publishes no JSON") from None
    if not isinstance(data, dict):
        raise RecordError("publishes no record")
    version = data.get("v")
    if version != SCHEMA:
        raise RecordError(f"publishes fleet schema {str(version)[:10]}, this unit reads {SCHEMA}"
                          " (a unit of another charm revision: refresh them to one)")
    try:
        lm = data["lm"]
        readiness = Readiness(_text(lm, "libvirt"), _text(lm, "qemu"), _flag(lm, "vfio"),
                              _maybe_flag(lm, "post-copy"),
                              tuple(_strings(lm.get("blockers"), MAX_BLOCKERS)),
                              _maybe_flag(lm, "on"),
                              tuple(_strings(lm.get("warnings", []), MAX_BLOCKERS, 400)),
                              _text(lm, "src", 16))
        gpus = data["gpus"]
        if not isinstance(gpus, list) or len(gpus) > MAX_GPUS:
            raise RecordError("publishes no GPU list")
        return Record(_text(data, "host"), _text(data, "revision"), _text(data, "driver"),
                      _flag(data, "paused"), _text(data, "boot"), readiness,
                      tuple(_gpu(g) for g in gpus), _number(data, "n"),
                      _number(data, "since", 1 << 40))
    except (KeyError, TypeError, AttributeError):
        raise RecordError("publishes a record that is not shaped as schema "
                          f"{SCHEMA} says") from None


def _gpu(entry: Mapping) -> GpuRecord:
    if not isinstance(entry, dict):
        raise TypeError
    return GpuRecord(_text(entry, "a"), _text(entry, "dev"), _number(entry, "gb"),
                     _text(entry, "fw"), _flag(entry, "mig"), _text(entry, "type"),
                     _text(entry, "name"), _number(entry, "max"),
                     _text(entry, "md", MAX_METADATA), _text(entry, "rc"), _flag(entry, "w"),
                     _text(entry, "lmt", 8))


def peers(data: Mapping[str, Optional[str]]) -> List[Peer]:
    """Every unit's :class:`Peer`, by unit name: ``data`` maps it to what its databag holds."""
    out = []
    for unit in sorted(data, key=unit_order):
        try:
            out.append(Peer(unit, decode(data[unit])))
        except RecordError as error:
            out.append(Peer(unit, problem=str(error)))
    return out


# -- the report and the leader's status -------------------------------------------------

def inconsistencies(units: Sequence[Peer]) -> List[str]:
    """What differs across the fleet that should not, the most important first."""
    readable = [p for p in units if p.record is not None]
    out = _driver_differences(readable)
    out.extend(_board_differences(readable))
    out.extend(_readiness_differences(readable))
    out.extend(f"{p.unit} cannot be read: it {p.problem}" for p in units if p.record is None)
    out.extend(f"{p.unit} publishes {p.record.host!r} as its host, which is not a host name "
               "(RFC 1123): it is no destination of any drain plan"
               for p in readable if p.record and not host_name(p.record.host))
    out.extend(f"{p.unit}'s record was cut: it lists {len(p.record.gpus)} of its "
               f"{p.record.gpu_count} GPUs" for p in readable
               if p.record and p.record.gpu_count > len(p.record.gpus))
    return out


def app_status(units: Sequence[Peer]) -> str:
    """The leader's application status line: the most important inconsistency, or ""."""
    found = inconsistencies(units)
    return found[0] if found else ""


def _driver_differences(units: Sequence[Peer]) -> List[str]:
    with_driver = [p for p in units if p.record and p.record.driver and p.record.gpus]
    versions = Counter(p.record.driver for p in with_driver if p.record)
    if len(versions) < 2:
        return []
    total = len(with_driver)
    ordered = sorted(versions.items(), key=lambda item: (-item[1], item[0]))
    return [f"driver {version} on {count} of {total} hosts: live migration between them fails"
            for version, count in reversed(ordered[1:])]


def _board_differences(units: Sequence[Peer]) -> List[str]:
    boards: Dict[str, Dict[str, List[str]]] = {}
    for peer in units:
        for gpu in peer.record.gpus if peer.record else ():
            if gpu.type_id:
                name = gpu.type_name or gpu.type_id
                boards.setdefault(name, {}).setdefault(gpu.board, []).append(peer.unit)
    out = []
    for name in sorted(boards):
        if len(boards[name]) > 1:
            found = "; ".join(f"{board} on {_listing(sorted(set(us)))}"
                              for board, us in sorted(boards[name].items()))
            out.append(f"type {name} is mapped on different boards ({found}): its guests "
                       "cannot live-migrate between them")
    return out


def _readiness_differences(units: Sequence[Peer]) -> List[str]:
    gpu_units = [p for p in units if p.record and p.record.gpus]
    ready = [p for p in gpu_units if p.record and p.record.ready()]
    if not ready:
        return []
    return [f"{p.unit} is not ready to live-migrate while {len(ready)} of {len(gpu_units)} "
            f"hosts are: {'; '.join(blockers(p.record))}"
            for p in gpu_units if p.record and not p.record.ready()]


def report(units: Sequence[Peer]) -> Dict[str, object]:
    """fleet-report's results: a table, ``units`` as nested keys, inconsistencies, commands."""
    from . import table

    rows, nested = [], {}
    for index, peer in enumerate(units):
        nested[f"unit-{index}"] = _unit_entry(peer)
        record = peer.record
        if record is None:
            rows.append([peer.unit, "-", "-", "-", "-", "-", "cannot be read", "-", "-"])
            continue
        rows.append([peer.unit, record.host, record.driver or "none", str(len(record.gpus)),
                     ", ".join(_boards(record)) or "-", ", ".join(_types(record)) or "-",
                     "ready" if record.ready() else "no: " + "; ".join(blockers(record)),
                     record.boot or "-", "yes" if record.paused else "no"])
    found = inconsistencies(units)
    commands, notes = capacity_commands(units)
    results: Dict[str, object] = {
        "summary": _summary(units, found),
        "inconsistencies": _json_list(found),
        "capacity-commands": _json_list(commands),
        "capacity-notes": _json_list(notes),
        "table": table.render(["unit", "host", "driver", "gpus", "boards", "types",
                               "live migration", "boot", "paused"], rows, what="units"),
        "units": nested,
    }
    return table.fit(results, depth=2, records="units", what="units")


def capacity_commands(units: Sequence[Peer]) -> Tuple[List[str], List[str]]:
    """(Placement's command per resource class, once; what to look at for types it has no class).

    The class each mode really has: ``VGPU`` for mdev types, or the
    ``CUSTOM_VGPU_*`` class of ``mdev_class`` (mdev-class-per-profile); a VFIO
    type's or whole GPU's ``CUSTOM_*`` class only where the host reports PCI
    devices in Placement (pci-in-placement), which the record says by
    publishing a class at all. A class that is not one Placement could have is
    a peer's text: it is left out, never printed into a command.
    """
    classes: Dict[str, set] = {}
    unclassed: set = set()
    for peer in units:
        for gpu in peer.record.gpus if peer.record else ():
            name = gpu.type_name or gpu.type_id or (f"whole GPU {gpu.board}" if gpu.whole else "")
            if not name:
                continue
            if gpu.resource_class and re.match(RESOURCE_CLASS, gpu.resource_class):
                classes.setdefault(gpu.resource_class, set()).add(name)
            elif not gpu.resource_class:
                unclassed.add(name)
    import shlex  # the report's commands only: not a hook's import

    commands = [f"openstack allocation candidate list --resource {shlex.quote(rc)}=1 "
                f"--os-placement-api-version 1.12  # {', '.join(sorted(classes[rc]))}"
                for rc in sorted(classes)]
    notes = [f"{name}: Placement has no class for it (VFIO VFs without pci-in-placement); its "
             "free VFs are in each unit's status and list-vgpu-types, and in Nova's PCI "
             "devices (openstack hypervisor show)" for name in sorted(unclassed)]
    return commands, notes


def _json_list(items: Sequence[str]) -> str:
    """``items`` as a JSON list that fits one action result; what is left out is said last."""
    from .table import MAX_VALUE_BYTES

    kept = list(items)
    text = json.dumps(kept)
    while len(text.encode()) > MAX_VALUE_BYTES and kept:
        kept.pop()
        text = json.dumps(kept + [f"... and {len(items) - len(kept)} more"])
    return text


def _summary(units: Sequence[Peer], found: Sequence[str]) -> str:
    gpus = sum(len(p.record.gpus) for p in units if p.record)
    said = f"{len(units)} units, {gpus} GPUs"
    return f"{said}; {len(found)} inconsistencies, first: {found[0]}" if found else \
        f"{said}; consistent"


def _unit_entry(peer: Peer) -> Dict[str, object]:
    record = peer.record
    if record is None:
        return {"unit": peer.unit, "problem": peer.problem}
    return {"unit": peer.unit, "host": record.host, "revision": record.revision or UNREAD,
            "driver": record.driver or "none", "paused": "yes" if record.paused else "no",
            "boot": record.boot or "none", "live-migration": "ready" if record.ready() else
            "; ".join(blockers(record)),
            **({"live-migration-warnings": "; ".join(record.readiness.warnings)}
               if record.readiness.warnings else {}),
            "gpus": {f"gpu-{i}": {"address": g.address, "board": g.board,
                                  "framework": g.framework or "none",
                                  "type": g.type_name or g.type_id or "none",
                                  "most": str(g.most or UNREAD)}
                     for i, g in enumerate(record.gpus)}}


def _boards(record: Record) -> List[str]:
    return sorted({g.board for g in record.gpus})


def _types(record: Record) -> List[str]:
    return sorted({g.type_name or g.type_id for g in record.gpus if g.type_id})


# -- bounded reading ----------------------------------------------------------------------

def _cut(value: object, limit: int = MAX_TEXT) -> str:
    text = "" if value is None else str(value)
    return "".join(c if c.isprintable() else "?" for c in text[:limit])


def _text(data: Mapping, key: str, limit: int = MAX_TEXT) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise TypeError(key)
    return _cut(value, limit)


def _flag(data: Mapping, key: str) -> bool:
    value = data.get(key, False)
    if not isinstance(value, bool):
        raise TypeError(key)
    return value


def _maybe_flag(data: Mapping, key: str) -> Optional[bool]:
    value = data.get(key)
    if value is not None and not isinstance(value, bool):
        raise TypeError(key)
    return value


def _number(data: Mapping, key: str, most: int = 1 << 20) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < most:
        raise TypeError(key)
    return value


def _strings(value: object, most: int, limit: int = 200) -> Iterable[str]:
    if not isinstance(value, list):
        raise TypeError("list")
    return [_cut(v, limit) for v in value[:most] if isinstance(v, str)]


def _version(text: str) -> Optional[Tuple[int, ...]]:
    parts = []
    for piece in text.split(".")[:3]:
        digits = "".join(c for c in piece if c.isdigit())
        if not digits:
            return None
        parts.append(int(digits))
    return tuple(parts) if parts else None


def _listing(names: Sequence[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def unit_order(unit: str) -> Tuple[str, int]:
    """A unit name's sort key: application, then the unit's number (2 before 10)."""
    app, _, number = unit.rpartition("/")
    return (app, int(number) if number.isdigit() else -1)
