"""The mediated devices instances hold, recorded so the boot step can create them again (Nova < 30).

Nova defines mdevs as persistent libvirt node devices only from 30.0.0
(Dalmatian). Before that every mdev is gone after a reboot, and an instance
holding one fails to start until it is created again with the same UUID, on
the same parent, with the same type. Nova's own attempt at start
(``_recreate_assigned_mediated_devices``) asks libvirt where a missing mdev
was, which libvirt no longer knows after a reboot.

So on Nova before 30 the charm records, on every hook, each mdev a running or
defined domain holds on one of this host's NVIDIA GPUs or VFs: its UUID, its
parent and type from sysfs (``sys/bus/mdev/devices/<uuid>``), and the
instance. The file, :data:`FILE`, lies beside the boot step's data and is
rewritten only when it changed; domain files are read only when their names,
sizes or times, or the mdevs that exist, changed since (:func:`fingerprint`).
The boot step (:mod:`vgpu.boot`, before nova-compute) writes each UUID to its
parent's ``mdev_supported_types/<type>/create``. On Nova 30 and later nothing is
recorded and a record left from before is deleted: Nova does it.

What is recorded stays fail safe: an mdev a domain holds that does not exist
now (a hook after a reboot that could not restore it) keeps its last recorded
parent and type; while a domain file cannot be read, every recorded mdev is
kept. Domain XML is parsed only for files that name a ``<hostdev``
(:func:`vgpu.guests.held_mdevs`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from typing import Dict, Iterable, List, Optional, Tuple

from . import MDEV_UUID, OPTION, PCI_ADDRESS, files, hostroot, mappings, novaconf, pci
from .errors import HostReadError
from .record import NamedTuple

log = logging.getLogger(__name__)

FILE = "var/lib/nova-compute-nvidia-vgpu/mdevs.json"  # beside sriov.DATA_FILE
NAME = "mdevs.json"
VERSION = 1
LIMIT = 1 << 20  # bytes: about 5000 mdevs
PERSISTENT_MAJOR = 30  # the first Nova that defines mdevs as persistent node devices
# Patterns compiled by re when a record is read: not on every hook.
UUID = MDEV_UUID + r"\Z"
ADDRESS = PCI_ADDRESS + r"\Z"
TYPE = r"nvidia-[0-9]{1,6}\Z"
MDEV_DEVICES = "sys/bus/mdev/devices"


class RecordError(ValueError):
    """The record is not JSON, or not shaped as :func:`render` writes it."""


class Mdev(NamedTuple):
    """One mdev an instance holds: where to create it again."""

    uuid: str
    parent: str  # the GPU or VF address it was created on (0000:c1:00.0)
    type_id: str  # its mdev type (nvidia-108)
    instance: str = ""  # the Nova instance uuid (the domain's <uuid>)
    domain: str = ""  # the libvirt domain name (instance-0000002a)

    def describe(self) -> str:
        """``<uuid> (instance-0000002a, <instance uuid>)``, for the journal."""
        owner = ", ".join(d for d in (self.domain, self.instance) if d)
        return f"{self.uuid} ({owner})" if owner else self.uuid


def applies(nova_major: Optional[int]) -> bool:
    """Whether this Nova loses mdevs at reboot, so the charm records them (None: no Nova yet)."""
    return nova_major is not None and nova_major < PERSISTENT_MAJOR


def uses_mdevs(host: pci.Host) -> bool:
    """Whether any GPU hands out vGPUs as mdevs now (an SR-IOV one only once its VFs exist)."""
    return any(gpu.framework == pci.MDEV for gpu in host.gpus)


def path():
    """Where the record lives under the host root."""
    return hostroot.path(FILE)


def load(where=None) -> List[Mdev]:
    """The record at ``where`` (default :data:`FILE`); [] when there is none.

    Raises RecordError when it is not a record, OSError when it cannot be read
    (a link on the way is not followed).
    """
    return _parse(files.read(where or path(), LIMIT))[0]


def _parse(raw: Optional[bytes]) -> Tuple[List[Mdev], str]:
    """(the record's mdevs, the fingerprint of what it was read from); RecordError."""
    if raw is None:
        return [], ""
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise RecordError("is not JSON") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise RecordError(f"version {data.get('version') if isinstance(data, dict) else None} "
                          "is not one this charm knows")
    entries = data.get("mdevs")
    if not isinstance(entries, list):
        raise RecordError("mdevs is not a list")
    seen = data.get("seen")
    return [_entry(entry) for entry in entries], seen if isinstance(seen, str) else ""


def _entry(entry) -> Mdev:
    values = [entry.get(k) if isinstance(entry, dict) else None
              for k in ("uuid", "parent", "type", "instance", "domain")]
    uuid, parent, type_id = values[:3]
    if not (isinstance(uuid, str) and re.match(UUID, uuid) and isinstance(parent, str)
            and re.match(ADDRESS, parent) and isinstance(type_id, str) and re.match(TYPE, type_id)):
        raise RecordError(f"an entry is not a uuid, a parent address and an nvidia type: "
                          f"{str(entry)[:120]}")
    extra = [v if isinstance(v, str) else "" for v in values[3:]]
    return Mdev(uuid, parent, type_id, extra[0][:64], extra[1][:255])


def render(record: Iterable[Mdev], seen: str = "") -> str:
    """The file's text: the mdevs by parent, then uuid; ``seen``: :func:`fingerprint`."""
    entries = [{"uuid": m.uuid, "parent": m.parent, "type": m.type_id, "instance": m.instance,
                "domain": m.domain} for m in sorted(record, key=lambda m: (m.parent, m.uuid))]
    return json.dumps({"version": VERSION, "seen": seen, "mdevs": entries}, indent=1,
                      sort_keys=True) + "\n"


def fingerprint(host: pci.Host) -> str:
    """What the record depends on, from names and ``stat`` only: no domain file is read.

    The host's GPU and VF addresses, each domain file's name, size and
    modification time, and the mdevs that exist with their parents and types
    (two links each). A domain changes its mdevs only by rewriting its file;
    an mdev's uuid may come back with another type (:func:`_place`).
    """
    from . import guests  # its module imports no XML parser

    parts = [" ".join(host.addresses())]
    for directory in (guests.STATUS_DIR, guests.DEFINED_DIR, MDEV_DEVICES):
        where = hostroot.text_path(directory)
        try:
            names = sorted(os.listdir(where))
        except FileNotFoundError:
            continue
        except OSError as error:
            raise hostroot.unreadable(where, error) from None
        for name in names:
            if directory == MDEV_DEVICES:
                parts.append(f"{name} {_place(os.path.join(where, name))}")
                continue
            try:
                found = os.stat(os.path.join(where, name))
            except FileNotFoundError:
                continue  # gone since it was listed
            except OSError as error:
                raise hostroot.unreadable(os.path.join(where, name), error) from None
            parts.append(f"{directory}/{name} {found.st_size} {found.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode("utf-8", "replace")).hexdigest()


def _place(device: str) -> str:
    """Where the mdev ``device`` (its bus link) is and what type it has, from two links.

    A uuid destroyed and created again with another type, or on another
    parent, between two hooks changes this though no domain file changed.
    """
    try:
        return f"{os.readlink(device)} {os.readlink(os.path.join(device, 'mdev_type'))}"
    except OSError:
        return "?"  # gone since it was listed, or not shaped as the kernel makes it


def current(host: pci.Host, previous: Iterable[Mdev]) -> List[Mdev]:
    """Every mdev held on ``host``'s GPUs and VFs now, merged with ``previous`` (see the module doc).

    Raises HostReadError when a domain directory cannot be listed.
    """
    from . import guests  # parses XML only for domain files that name a <hostdev

    ours = set(host.addresses())
    before = {m.uuid: m for m in previous}
    out: Dict[str, Mdev] = {}
    unreadable = False
    for held in guests.held_mdevs():
        if not held.uuid:
            log.warning("%s: every recorded mdev is kept", held.guest.describe())
            unreadable = True
            continue
        owner = {"instance": held.guest.instance_uuid, "domain": held.guest.name}
        if held.parent is not None and held.type_id is not None:
            if held.parent in ours and re.match(TYPE, held.type_id):
                out[held.uuid] = Mdev(held.uuid, held.parent, held.type_id, **owner)
        elif held.uuid in before:
            out[held.uuid] = before[held.uuid]._replace(**owner)  # gone now: kept where it was
        else:
            log.warning("%s holds mdev %s, which does not exist and was never recorded: it "
                        "cannot be created again at boot", held.guest.describe(), held.uuid)
    if unreadable:
        for uuid, mdev in before.items():
            out.setdefault(uuid, mdev)
    return sorted(out.values(), key=lambda m: (m.parent, m.uuid))


def refresh(host: pci.Host) -> List[Mdev]:
    """The record of the mdevs held on ``host``, written when it changed; what it holds now.

    Domain files are read only when :func:`fingerprint` differs from the one
    recorded. No mdev held: no record (one there is deleted). A record that
    cannot be read is replaced (logged). Raises HostReadError when the domains
    cannot be listed or read, OSError when the record cannot be written.
    """
    target = path()
    try:
        raw = files.read(target, LIMIT)
        previous, seen = _parse(raw)
    except (OSError, RecordError) as error:
        log.warning("replacing /%s: %s", FILE, getattr(error, "strerror", None) or error)
        raw, previous, seen = None, [], ""
    now = fingerprint(host)
    if raw is not None and seen == now:
        return previous
    record = current(host, previous)
    if not record:
        if raw is not None:
            forget()
        return []
    content = render(record, now)
    if raw is None or raw.decode("utf-8", errors="replace") != content:
        files.write_atomic(target, content)
        log.info("the boot step's record in /%s now holds mdevs: %d", FILE, len(record))
    return record


def forget() -> bool:
    """Delete the record (Nova 30 and later, nothing held, charm removal); True when there was one."""
    removed = files.remove(path())
    if removed:
        log.info("removed /%s", FILE)
    return removed


def kept() -> bool:
    """Whether a record exists (the boot unit then has mdevs to create)."""
    return os.path.lexists(path())


# -- the hook's mdev steps (run by vgpu.reconcile and vgpu.preview on its _Hook) -----------------

def step_may_change(hook, sections) -> bool:
    """False (blocked, naming them) when guests hold mdevs of types ``sections`` take away.

    Domain XML is read only when the mdev mapping to publish takes a type
    from a function it is published for now.
    """
    from . import plan as plans

    published = hook.published_mapping()
    wanted = novaconf.mapping_from_sections(sections)
    removed = plans.removed_mdev_types(published, wanted, hook.facts().pci)
    if not removed:
        return True
    from . import guests  # XML parsing only when a type leaves a GPU

    conflicts = plans.mdev_conflicts(removed, guests.held_mdevs(), hook.facts().pci)
    if not conflicts:
        return True
    more = f" (+{len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
    hook.problems.append(
        f"{OPTION} not applied: {conflicts[0]}{more}; restore the mapping, or move or delete "
        f"the instance first; keeping {mappings.kept(published)}")
    return False


def step_record(hook) -> bool:
    """On Nova before 30, record the mdevs instances hold for the boot step; True if one is kept.

    Nova 30 and later persists mdevs itself: nothing is recorded there.
    """
    here = hook.facts()
    release = here.supported_release()
    try:
        if release is not None and not applies(release.nova_major):
            forget()
            return False
        if release is None or not uses_mdevs(here.pci):
            return kept()  # nothing to look at now: the record stays as it was
        return bool(refresh(here.pci))
    except HostReadError as error:
        hook.problems.append(f"cannot record the mdevs instances hold: {error}; "
                             "the last record stays")
    except OSError as error:
        hook.problems.append(f"cannot write /{FILE}: {error.strerror or error}")
    hook.mdevs_unrecorded = True
    return kept()
