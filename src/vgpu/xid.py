"""Xid errors and GPUs lost, for the exporter: the kernel's messages in the journal, NVML, sysfs.

NVIDIA's driver reports each GPU error as a kernel line, an "Xid" (NVIDIA's
"Xid Errors" reference and its Xid catalogue, docs.nvidia.com/deploy/xid-errors)::

    NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, reset gpu
    to activate.

(the first from NVIDIA/open-gpu-kernel-modules#1151, the second, one line in
the log, from stas00/ml-engineering's "Troubleshooting NVIDIA GPUs"): ``PCI:`` names the
GPU by domain, bus and device, without the function. Newer drivers also say a
lost GPU without an Xid, over three lines (NVIDIA/NVSentinel#155, 570.158.01;
leptonai/gpud#1209)::

    NVRM: The NVIDIA GPU 0000:b3:00.0
    NVRM: (PCI ID: 10de:26b5) installed in this system has
    NVRM: fallen off the bus and is not responding to commands.

and ``NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.`` (#1151 again).

What is trusted: only entries of the kernel's own transport (``_TRANSPORT=kernel``, as
``journalctl -k`` selects them), and of those only messages every line of which is one of the
driver's, starting with its ``NVRM: `` prefix in a form above (:class:`Parser`). The kernel also
logs text any local user chooses, a crashed process' name and file
(``foo[123]: segfault at 0 ip ... in NVRM: Xid (PCI:0000:01:00): 79, ...``); such a message says
nothing. And only GPUs this host has this boot are counted (:class:`Watch`): what the driver
says of another address waits, bounded, and is never served, so made-up addresses can neither
raise an alert nor take the place of a real GPU's Xid. With MIG on, an Xid line names the GPU
instance too: ``NVRM: Xid (PCI:0000:01:00 GPU-I:05): 95, ...`` (NVIDIA's A100 memory error
management guide, "User Visible Statistics"); it counts for the GPU, and per GPU instance.

The exporter's unit has ``ProtectKernelLogs=`` (no ``/dev/kmsg``): it reads
the kernel's messages as the journal keeps them, ``journalctl -k -b -o json``,
incrementally: each read starts after the cursor of the last entry read, gives
up after :data:`READ_SECONDS` and takes at most :data:`READ_BYTES` of output
(the rest is read next time, from the last whole entry). A :class:`Watch`
lives as long as the exporter process and is read from a thread of its own
(:meth:`Watch.run`), never from a scrape: a scrape takes what the last read
left (:meth:`Watch.samples`) and never waits on the journal. It starts from
the boot's first message, so the counts and the last-seen times are the whole
boot's again after an exporter restart; until that first pass has reached the
journal's end nothing is served (an exporter that just started would
otherwise serve counts that jump).

A GPU is lost (``nvidia_vgpu_xid_gpu_lost``) when the kernel said so (Xid 79
or the lines above), when NVML answers ``NVML_ERROR_GPU_IS_LOST`` for it
(:mod:`vgpu.nvml`; no NVML event session is held open), or when a GPU this
exporter saw, the boot data maps or the kernel named this boot is gone from
sysfs. Every series for the Xid numbers of :data:`RUNBOOK` exists at 0 for
each GPU from the start, so that ``increase()`` sees the first one
(prometheus/prometheus#1673: a series that appears at 1 has no increase).
"""

from __future__ import annotations

import json
import logging
import os
import re
import select
import shutil
import signal
import subprocess
import threading
import time
from typing import Dict, Iterable, List, Optional, Sequence, Set, Tuple

from . import hostroot
from .record import NamedTuple

log = logging.getLogger(__name__)

READ_SECONDS = 10.0  # one journalctl run, at most
READ_BYTES = 1 << 20  # of its output per run; the rest is read at the next run
POLL_SECONDS = 10.0  # between reads once the journal's end was reached
MAX_SERIES = 2048  # (GPU, Xid) pairs kept: a flood of odd lines cannot grow the process
MAX_GPUS = 64  # GPUs named by the kernel that are kept

# The Xid numbers the runbook (docs/reference/metrics.md, "Xid numbers") names: what each is,
# the Xid catalogue's "Resolution Bucket (Immediate Action)" word for word (NVIDIA's catalogue
# for Ampere and later, docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html, as of
# CUDA 12.9 / driver R575), and the class that bucket puts it in, what the operator does:
# RESTART_GUEST: restart the application, here the guest (RESTART_APP);
# RESET_GPU: reset the GPU, or reboot the node (RESET_GPU; the workflows of 48 and NVLink, and
#   154's line, say a reset or a reboot);
# REBOOT_NODE: reboot the node (RESTART_BM);
# CONTACT_SUPPORT: nothing now, the hardware's vendor when it goes on (IGNORE, then the
#   investigatory CONTACT_SUPPORT).
# ``hardware``: the GPU's fault (its memory, bus, firmware), not the guest's application.
RESTART_GUEST, RESET_GPU, REBOOT_NODE, CONTACT_SUPPORT = (
    "restart-guest", "reset-gpu", "reboot-node", "contact-support")
CLASSES = (RESTART_GUEST, RESET_GPU, REBOOT_NODE, CONTACT_SUPPORT)


class Xid(NamedTuple):
    """One Xid number the runbook names."""

    number: int
    meaning: str
    action: str  # one of CLASSES
    bucket: str  # the catalogue's Resolution Bucket (Immediate Action)
    hardware: bool  # the GPU's fault, not the guest's application


RUNBOOK: Tuple[Xid, ...] = (
    Xid(13, "graphics engine exception", RESTART_GUEST, "RESTART_APP", False),
    Xid(31, "GPU memory page fault", RESTART_GUEST, "RESTART_APP", False),
    Xid(43, "GPU stopped processing (the application was stopped)", RESTART_GUEST, "IGNORE",
        False),
    Xid(45, "preemptive cleanup after earlier errors", RESTART_GUEST, "WORKFLOW_XID_45", False),
    Xid(48, "double-bit ECC error", RESET_GPU, "WORKFLOW_XID_48", True),
    Xid(62, "internal micro-controller halt", RESET_GPU, "RESET_GPU", True),
    Xid(63, "memory row marked for remapping (a GPU reset applies it)", RESET_GPU, "IGNORE", True),
    Xid(64, "memory row remapping failed", RESET_GPU, "RESET_GPU", True),
    Xid(74, "NVLink error", RESET_GPU, "WORKFLOW_NVLINK_ERR", True),
    Xid(79, "GPU has fallen off the bus", REBOOT_NODE, "RESTART_BM", True),
    Xid(92, "high single-bit ECC error rate", CONTACT_SUPPORT, "IGNORE", True),
    Xid(94, "contained ECC error (one guest's application is hit)", RESTART_GUEST, "RESTART_APP",
        True),
    Xid(95, "uncontained ECC error", RESET_GPU, "RESET_GPU", True),
    Xid(119, "GSP RPC timeout", RESET_GPU, "RESET_GPU", True),
    Xid(120, "GSP error", RESET_GPU, "RESET_GPU", True),
    Xid(154, "GPU recovery action changed (the line says: reset or reboot)", RESET_GPU, "XID_154",
        True),
)
FALLEN_XID = 79

# Each of the driver's lines starts with its own prefix, "NVRM: ". An Xid line names the GPU as
# "(PCI:dddd:bb:dd)", or with MIG on as "(PCI:dddd:bb:dd GPU-I:nn)" (NVIDIA's "NVIDIA A100 GPU
# Memory Error Management", docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/, "User Visible
# Statistics"): whatever NVIDIA puts before the ")" is taken, the GPU instance kept.
_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
                  r"(?:\.([0-7]))?((?: [^()\n]{1,64})?)\): ([0-9]{1,4})\b")
_INSTANCE = re.compile(r"(?:^| )GPU-I:([0-9]{1,3})(?= |$)")
# "NVRM: GPU at PCI:0000:2b:00: GPU-<uuid>", "NVRM: GPU 0000:2b:00.0: ...",
# "NVRM: The NVIDIA GPU 0000:b3:00.0": a line that names a GPU.
_NAMED = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):"
                    r"([0-9a-fA-F]{2})(?:\.([0-7]))?")
# The other lines of the three-line form (NVIDIA/NVSentinel#155, leptonai/gpud#1209).
_REST = re.compile(r"NVRM: (?:\(PCI ID: [0-9a-fA-F]{4}:[0-9a-fA-F]{4}\) installed in this system"
                   r"|fallen off the bus)")
# The kernel's PCI core adding a GPU at boot ("pci 0000:2b:00.0: [10de:2684] type 00 class
# 0x030000", dev_printk of drivers/pci/probe.c's pci_setup_device): a GPU this host has this boot.
_ENUMERATED = re.compile(r"pci ([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7]): "
                         r"\[10de:[0-9a-fA-F]{4}\] type 00 class 0x03")
_FALLEN = "fallen off the bus"
MAX_INSTANCE = 63  # GPU instance ids kept as a label (an A100 has at most 15); others: unlabelled


class Event(NamedTuple):
    """One thing the kernel said of a GPU: an Xid, it fell off the bus, or it was added.

    ``xid``: the Xid's number; 0 when it fell off the bus; :data:`ENUMERATED` (-1) when the
    kernel's PCI core added it this boot.
    """

    gpu: str  # its PCI address as sysfs writes it: 0000:2b:00.0
    xid: int  # 0: fallen off the bus, said without an Xid line; -1: the GPU was enumerated
    when: float  # seconds since the epoch (the journal's time of the message)
    instance: str = ""  # the MIG GPU instance the Xid line names (GPU-I:nn), "" when none


ENUMERATED = -1


class JournalError(Exception):
    """journalctl could not be run or said it failed."""


def address(domain: str, bus: str, device: str, function: Optional[str]) -> str:
    """The GPU's address as sysfs writes it (an Xid line leaves the function out: 0)."""
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function or 0}"


def _drivers(lines: List[str]) -> bool:
    """Whether every line is one of the driver's own, in a form it writes (module doc)."""
    return all(_XID.match(line) or _NAMED.match(line) or _REST.match(line) for line in lines)


class Parser:
    """Kernel messages to :class:`Event` s, one message at a time (a GPU named before counts).

    Only the driver's own lines count: a message each of whose lines starts with
    ``NVRM: `` in one of the forms above. The kernel also logs text a user chooses (a
    process' name, the file it crashed in: ``foo[123]: segfault at 0 ip ... in NVRM: Xid
    ...``); such a message, or one with such a line, says nothing.
    """

    def __init__(self) -> None:
        """No GPU named yet."""
        self.named: Optional[str] = None  # the last GPU a message named

    def feed(self, message: str, when: float) -> List[Event]:
        """What ``message`` says: an Xid, a GPU fallen off the bus, both, or nothing."""
        lines = message.split("\n")
        if len(lines) == 1:
            found = _ENUMERATED.match(message)
            if found:
                return [Event(address(*found.group(1, 2, 3, 4)), ENUMERATED, when)]
        if not message.startswith("NVRM: ") or not _drivers(lines):
            return []
        out: List[Event] = []
        for line in lines:
            found = _XID.match(line)
            if found:
                gpu = address(*found.group(1, 2, 3, 4))
                said = _INSTANCE.search(found.group(5).strip())
                instance = said.group(1) if said else ""
                instance = str(int(instance)) if instance and int(instance) <= MAX_INSTANCE else ""
                out.append(Event(gpu, int(found.group(6)), when, instance))
                self.named = gpu
            else:
                named = _NAMED.match(line)
                if named:
                    self.named = address(*named.group(1, 2, 3, 4))
            if _FALLEN in line and self.named is not None:
                out.append(Event(self.named, 0, when))
        return out


class Entry(NamedTuple):
    """One journal entry: its cursor, time and message."""

    cursor: str
    when: float
    message: str


class Chunk(NamedTuple):
    """One bounded read of the journal."""

    entries: Tuple[Entry, ...]
    complete: bool  # journalctl reached the journal's end (else: read on from the last cursor)


def command(cursor: Optional[str]) -> List[str]:
    """journalctl's options that read this boot's kernel messages after ``cursor``.

    Without the program: :func:`read` runs the journalctl ``shutil.which`` finds.
    """
    cmd = ["--dmesg", "--boot", "--output=json", "--output-fields=MESSAGE,_TRANSPORT",
           "--no-pager", "--quiet"]
    if not hostroot.is_real_root():
        cmd.append(f"--root={hostroot.root()}")
    if cursor:
        cmd.append(f"--after-cursor={cursor}")
    return cmd


def read(cursor: Optional[str], limit: int = READ_BYTES, seconds: float = READ_SECONDS,
         running: Optional[Set[subprocess.Popen]] = None) -> Chunk:
    """The kernel's messages after ``cursor``, at most ``limit`` bytes and ``seconds``.

    JournalError when journalctl cannot run, fails, or runs out of time having read
    nothing whole; what was read whole before a failure is returned. ``running``
    holds journalctl's process while it runs (for :meth:`Watch.close`).
    """
    program = shutil.which("journalctl")
    if program is None:
        raise JournalError("journalctl not found")
    try:
        # (stdin is the caller's: journalctl reads the journal's files, never its input)
        proc = subprocess.Popen([program, *command(cursor)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE,
                                env=dict(os.environ, LC_ALL="C"), start_new_session=True)
    except OSError as error:
        raise JournalError(f"journalctl could not run: {error.strerror or error}") from None
    running = set() if running is None else running
    running.add(proc)
    try:
        data, ended, timed_out = _bounded(proc, limit, seconds)
        status, why = _ended(proc, seconds) if ended else (None, "")
        ended = status is not None
    finally:
        _stop(proc)
        running.discard(proc)
    entries = _entries(data)
    if timed_out and not entries:
        raise JournalError(f"journalctl gave nothing within {seconds:g}s")
    if status:
        if not entries:
            said = f": {why.splitlines()[-1]}" if why else ""  # killed by a signal: no word
            raise JournalError(f"journalctl failed ({status}){said}")
        log.warning("journalctl failed (%s) after %d entries: %s", status, len(entries), why)
    return Chunk(tuple(entries), complete=ended and not status)


def _bounded(proc: subprocess.Popen, limit: int, seconds: float) -> Tuple[bytes, bool, bool]:
    """``proc``'s output up to ``limit`` bytes or ``seconds``: (data, reached its end, timed out)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + seconds
    parts: List[bytes] = []
    size = 0
    fd = proc.stdout.fileno()
    while size < limit:
        left = deadline - time.monotonic()
        if left <= 0:
            return b"".join(parts), False, True
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            continue
        part = os.read(fd, min(65536, limit - size))
        if not part:
            return b"".join(parts), True, False
        parts.append(part)
        size += len(part)
    return b"".join(parts), False, False


def _ended(proc: subprocess.Popen, seconds: float) -> Tuple[Optional[int], str]:
    """journalctl's exit status (None: it closed its output but did not end) and its stderr."""
    try:
        status = proc.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        return None, ""
    return status, proc.stderr.read(4096).decode("utf-8", "replace").strip() if proc.stderr else ""


def _stop(proc: subprocess.Popen) -> None:
    """End journalctl's process group if it still runs; close its pipes."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            log.warning("journalctl (pid %d) did not end", proc.pid)
    for pipe in (proc.stdout, proc.stderr):
        if pipe is not None:
            pipe.close()


def _entries(data: bytes) -> List[Entry]:
    """Whole JSON lines of ``journalctl -o json`` as entries (a cut last line is left out)."""
    out: List[Entry] = []
    lines = data.split(b"\n")
    for line in lines[:-1]:  # the last is empty after a newline, or cut short
        try:
            fields = json.loads(line)
            cursor = fields["__CURSOR"]
            when = int(fields["__REALTIME_TIMESTAMP"]) / 1e6
        except (ValueError, KeyError, TypeError):
            continue
        # Only the kernel's own (journalctl -k matches _TRANSPORT=kernel; an entry that says
        # another transport, or none, is read past: its cursor counts, its text does not).
        kernel = fields.get("_TRANSPORT") == "kernel"
        out.append(Entry(str(cursor), when, _message(fields.get("MESSAGE")) if kernel else ""))
    return out


def _message(value) -> str:
    """MESSAGE as text: journalctl's JSON gives bytes that are not UTF-8 as a list of numbers."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return bytes(b for b in value if isinstance(b, int) and 0 <= b < 256).decode(
            "utf-8", "replace")
    return ""


class Sample(NamedTuple):
    """One value for vgpu.metrics: a metric's name, its value and its labels."""

    name: str
    value: float
    labels: Tuple[Tuple[str, str], ...]


class _Tally:
    """What the kernel said of one GPU this boot: counts and last times per Xid, lost or not."""

    def __init__(self) -> None:
        self.counts: Dict[int, int] = {}
        self.last: Dict[int, float] = {}
        self.instances: Dict[Tuple[str, int], int] = {}  # (GPU instance, Xid) -> count
        self.fallen = False

    def add(self, event: Event, series: int) -> int:
        """Count ``event``; the (GPU, Xid) and GPU-instance series it added to ``series``."""
        if event.xid == 0:
            self.fallen = True
            return 0
        added = 0
        if event.xid not in self.counts:
            if series >= MAX_SERIES:
                return 0
            added += 1
        self.counts[event.xid] = self.counts.get(event.xid, 0) + 1
        self.last[event.xid] = max(event.when, self.last.get(event.xid, 0.0))
        if event.xid == FALLEN_XID:
            self.fallen = True
        key = (event.instance, event.xid)
        if event.instance and (key in self.instances or series + added < MAX_SERIES):
            added += key not in self.instances
            self.instances[key] = self.instances.get(key, 0) + 1
        return added

    def merge(self, other: "_Tally") -> None:
        for number, count in other.counts.items():
            self.counts[number] = self.counts.get(number, 0) + count
            self.last[number] = max(other.last[number], self.last.get(number, 0.0))
        for key, count in other.instances.items():
            self.instances[key] = self.instances.get(key, 0) + count
        self.fallen = self.fallen or other.fallen


class Watch:
    """What the kernel said this boot, read from the journal; one per exporter process.

    ``reader``: a function like :func:`read` (the tests give another). ``known``: a
    function giving the GPUs this host has now (sysfs, the boot data), asked before each
    read; None: only what :meth:`samples` is given.

    Only GPUs known to this host this boot are counted: those sysfs listed while this
    process ran, the boot data names, NVML answered for, or the kernel's PCI core added
    this boot (a GPU since gone from sysfs, the one that fell off the bus, included).
    What the driver said of another address waits, at most :data:`MAX_GPUS` of them and
    never in a known GPU's place, until that GPU is known; it is never served before.
    """

    def __init__(self, reader=None, known=None) -> None:
        """Nothing read yet: the first read starts at the boot's first kernel message."""
        self._running: Set[subprocess.Popen] = set()
        self._read = reader or (lambda cursor: read(cursor, running=self._running))
        self._known_now = known
        self._lock = threading.Lock()
        self._parser = Parser()
        self._cursor: Optional[str] = None
        self._tallies: Dict[str, _Tally] = {}  # the known GPUs'
        self._waiting: Dict[str, _Tally] = {}  # GPUs not known (yet): bounded, never served
        self._series = 0  # (GPU, Xid) and GPU-instance series counted
        self._known: Set[str] = set()  # GPUs known to this host this boot
        self._seen: Set[str] = set()  # GPUs sysfs listed while this process ran
        self._caught_up = False  # a read reached the journal's end once
        self._ok = True  # the last read worked

    def poll(self) -> bool:
        """One bounded read of the journal; True when it reached the end (nothing more now)."""
        known = self._ask_known()
        try:
            chunk = self._read(self._cursor)
        except JournalError as error:
            log.warning("journal: %s", error)
            with self._lock:
                self._ok = False
            return True
        with self._lock:
            self._learn(known)
            for entry in chunk.entries:
                for event in self._parser.feed(entry.message, entry.when):
                    self._add(event)
                self._cursor = entry.cursor
            self._ok = True
            self._caught_up = self._caught_up or chunk.complete
        return chunk.complete

    def _ask_known(self) -> Set[str]:
        if self._known_now is None:
            return set()
        try:
            return set(self._known_now())
        except Exception as error:  # what cannot be read adds nothing; the rest stands
            log.warning("the GPUs this host has: %s", error)
            return set()

    def run(self, stop: threading.Event, pause: float = POLL_SECONDS) -> None:
        """Read the journal until ``stop`` is set: on at once while more waits, then every ``pause``."""
        while not stop.is_set():
            try:
                complete = self.poll()
            except Exception:  # a defect must not end the thread: said, tried again later
                log.exception("journal: reading failed")
                complete = True
            if complete:
                stop.wait(pause)

    def close(self) -> None:
        """End a journalctl still running (the exporter stops)."""
        for proc in list(self._running):
            _stop(proc)

    def _learn(self, gpus: Iterable[str]) -> None:
        """``gpus`` are this host's: what waited for them is counted now (under the lock)."""
        for gpu in gpus:
            if gpu in self._known:
                continue
            self._known.add(gpu)
            tally = self._tallies.setdefault(gpu, _Tally())
            waited = self._waiting.pop(gpu, None)
            if waited is not None:
                self._series -= len(waited.counts) + len(waited.instances)
                before = len(tally.counts) + len(tally.instances)
                tally.merge(waited)
                self._series += len(tally.counts) + len(tally.instances) - before

    def _add(self, event: Event) -> None:
        if event.xid == ENUMERATED:
            self._learn([event.gpu])
            return
        if event.gpu in self._known:
            tally = self._tallies[event.gpu]
        elif event.gpu in self._waiting or len(self._waiting) < MAX_GPUS:
            tally = self._waiting.setdefault(event.gpu, _Tally())
        else:
            return  # an address this host does not have, beyond the bound: said nowhere
        self._series += tally.add(event, self._series)

    def journal_up(self) -> Optional[bool]:
        """Whether the journal was read (None while the first pass has not ended)."""
        with self._lock:
            if not self._ok:
                return False
            return True if self._caught_up else None

    def samples(self, gpus: Optional[Iterable[str]], mapped: Iterable[str] = (),
                nvml_lost: Optional[Iterable[str]] = None) -> List[Sample]:
        """The Xid and lost-GPU series now; never waits on the journal.

        ``gpus``: the GPUs sysfs lists now (None: it could not be read);
        ``mapped``: those the boot data names; ``nvml_lost``: the GPUs NVML
        answers "GPU is lost" for (None: NVML was not read).
        """
        now = set(gpus) if gpus is not None else None
        lost = set(nvml_lost) if nvml_lost is not None else None
        with self._lock:
            if now is not None:
                self._seen |= now
            self._learn(self._seen | set(mapped) | (lost or set()))
            known = set(self._known)
            caught_up = self._caught_up
            tallies = {gpu: (dict(t.counts), dict(t.last), dict(t.instances), t.fallen)
                       for gpu, t in self._tallies.items()}
        out: List[Sample] = []
        if caught_up:
            for gpu in sorted(known):
                out.extend(_counted(gpu, *tallies[gpu][:3]))
        for gpu in sorted(known):
            if caught_up:
                out.append(_sample("nvidia_vgpu_xid_gpu_lost", tallies[gpu][3], gpu=gpu,
                                   source="kernel"))
            if lost is not None:
                out.append(_sample("nvidia_vgpu_xid_gpu_lost", gpu in lost, gpu=gpu,
                                   source="nvml"))
            if now is not None:
                out.append(_sample("nvidia_vgpu_xid_gpu_lost", gpu not in now, gpu=gpu,
                                   source="pci"))
        return out


def _counted(gpu: str, counts: Dict[int, int], last: Dict[int, float],
             instances: Dict[Tuple[str, int], int]) -> List[Sample]:
    """One known GPU's Xid series: a count for each runbook Xid and each seen, times, instances."""
    out = [_sample("nvidia_vgpu_xid_errors", counts.get(number, 0), gpu=gpu, xid=str(number))
           for number in sorted({x.number for x in RUNBOOK} | set(counts))]
    out += [_sample("nvidia_vgpu_xid_last_seen_timestamp_seconds", when, gpu=gpu,
                    xid=str(number)) for number, when in sorted(last.items())]
    out += [_sample("nvidia_vgpu_xid_gpu_instance_errors", count, gpu=gpu,
                    gpu_instance=instance, xid=str(number))
            for (instance, number), count in sorted(instances.items())]
    return out


def host_gpus() -> List[str]:
    """The GPUs this host has now: those sysfs lists and those the boot data names."""
    from . import bootdata, bootfile

    out = sysfs_gpus()
    try:
        out += [plan.address for plan in bootdata.parse(bootdata.load(f"/{bootfile.DATA_FILE}"))[0]]
    except bootdata.DataError:
        pass  # none in force, or unreadable: sysfs' stand
    return out


def sysfs_gpus() -> List[str]:
    """The NVIDIA GPUs sysfs lists now (display-class functions of vendor 0x10de, not VFs)."""
    from . import pci

    devices = hostroot.text_path(pci.PCI_DEVICES)
    out = []
    for name in hostroot.listdir(devices) or ():
        entry = f"{devices}/{name}"
        if ((hostroot.read_text(f"{entry}/vendor", limit=64) or "").strip() == pci.NVIDIA_VENDOR
                and (hostroot.read_text(f"{entry}/class", limit=64) or "")[:6] in pci.GPU_CLASSES
                and not os.path.lexists(f"{entry}/physfn")):
            out.append(name)
    return out


def _sample(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, float(value), tuple(labels.items()))


def numbers(action: str) -> Sequence[int]:
    """The runbook's Xid numbers of the class ``action`` (one of :data:`CLASSES`)."""
    return tuple(x.number for x in RUNBOOK if x.action == action)
