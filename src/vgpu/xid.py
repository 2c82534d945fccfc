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

# The Xid numbers the runbook (docs/reference/metrics.md, "Xid errors") names: what each is and
# NVIDIA's first action for it (the Xid catalogue's "Resolution Bucket (Immediate Action)").
# RESET: the GPU needs a reset, or the host a reboot (its guests lose their vGPUs);
# GUEST: most often a guest's own application fault: the host is fine unless it repeats.
RESET, GUEST = "reset", "guest"


class Xid(NamedTuple):
    """One Xid number the runbook names."""

    number: int
    meaning: str
    action: str  # RESET or GUEST


RUNBOOK: Tuple[Xid, ...] = (
    Xid(13, "graphics engine exception", GUEST),
    Xid(31, "GPU memory page fault", GUEST),
    Xid(43, "GPU stopped processing (a channel was reset)", GUEST),
    Xid(45, "preemptive cleanup after earlier errors", GUEST),
    Xid(48, "double-bit ECC error", RESET),
    Xid(62, "internal micro-controller halt", RESET),
    Xid(63, "memory row marked for remapping (needs a GPU reset to apply)", RESET),
    Xid(64, "memory row remapping failed", RESET),
    Xid(74, "NVLink error", RESET),
    Xid(79, "GPU has fallen off the bus", RESET),
    Xid(92, "high single-bit ECC error rate", GUEST),
    Xid(94, "contained ECC error (the guest using the memory is hit)", GUEST),
    Xid(95, "uncontained ECC error", RESET),
    Xid(119, "GSP RPC timeout", RESET),
    Xid(120, "GSP error", RESET),
    Xid(154, "GPU recovery action changed (the line says: reset or reboot)", RESET),
)
FALLEN_XID = 79

_XID = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})"
                  r"(?:\.([0-7]))?\): ([0-9]{1,4})\b")
# "NVRM: GPU at PCI:0000:2b:00: GPU-<uuid>", "NVRM: GPU 0000:2b:00.0: ...",
# "NVRM: The NVIDIA GPU 0000:b3:00.0": a line that names a GPU.
_NAMED = re.compile(r"NVRM: (?:The NVIDIA )?GPU (?:at PCI:)?([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):"
                    r"([0-9a-fA-F]{2})(?:\.([0-7]))?")
_FALLEN = "fallen off the bus"


class Event(NamedTuple):
    """One thing the kernel said of a GPU: an Xid (``xid``), or that it fell off the bus (0)."""

    gpu: str  # its PCI address as sysfs writes it: 0000:2b:00.0
    xid: int  # 0: fallen off the bus, said without an Xid line
    when: float  # seconds since the epoch (the journal's time of the message)


class JournalError(Exception):
    """journalctl could not be run or said it failed."""


def address(domain: str, bus: str, device: str, function: Optional[str]) -> str:
    """The GPU's address as sysfs writes it (an Xid line leaves the function out: 0)."""
    return f"{int(domain, 16):04x}:{bus.lower()}:{device.lower()}.{function or 0}"


class Parser:
    """Kernel messages to :class:`Event` s, one message at a time (a GPU named before counts)."""

    def __init__(self) -> None:
        """No GPU named yet."""
        self.named: Optional[str] = None  # the last GPU a message named

    def feed(self, message: str, when: float) -> List[Event]:
        """What ``message`` says: an Xid, a GPU fallen off the bus, both, or nothing."""
        if "NVRM" not in message:
            return []
        out: List[Event] = []
        found = _XID.search(message)
        if found:
            gpu = address(*found.group(1, 2, 3, 4))
            out.append(Event(gpu, int(found.group(5)), when))
            self.named = gpu
        else:
            named = _NAMED.search(message)
            if named:
                self.named = address(*named.group(1, 2, 3, 4))
        if _FALLEN in message and self.named is not None:
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
    """The journalctl run that reads this boot's kernel messages after ``cursor``."""
    cmd = ["journalctl", "--dmesg", "--boot", "--output=json", "--output-fields=MESSAGE",
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
        proc = subprocess.Popen([program, *command(cursor)[1:]], stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
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
            raise JournalError(f"journalctl failed ({status}): {why.splitlines()[-1] if why else ''}")
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
        out.append(Entry(str(cursor), when, _message(fields.get("MESSAGE"))))
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


class Watch:
    """What the kernel said this boot, read from the journal; one per exporter process.

    ``reader``: a function like :func:`read` (the tests give another).
    """

    def __init__(self, reader=None) -> None:
        """Nothing read yet: the first read starts at the boot's first kernel message."""
        self._running: Set[subprocess.Popen] = set()
        self._read = reader or (lambda cursor: read(cursor, running=self._running))
        self._lock = threading.Lock()
        self._parser = Parser()
        self._cursor: Optional[str] = None
        self._counts: Dict[Tuple[str, int], int] = {}
        self._last: Dict[Tuple[str, int], float] = {}
        self._fallen: Set[str] = set()
        self._named: Set[str] = set()  # GPUs the kernel named this boot
        self._seen: Set[str] = set()  # GPUs sysfs listed while this process ran
        self._caught_up = False  # a read reached the journal's end once
        self._ok = True  # the last read worked

    def poll(self) -> bool:
        """One bounded read of the journal; True when it reached the end (nothing more now)."""
        try:
            chunk = self._read(self._cursor)
        except JournalError as error:
            log.warning("journal: %s", error)
            with self._lock:
                self._ok = False
            return True
        with self._lock:
            for entry in chunk.entries:
                for event in self._parser.feed(entry.message, entry.when):
                    self._add(event)
                self._cursor = entry.cursor
            self._ok = True
            self._caught_up = self._caught_up or chunk.complete
        return chunk.complete

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

    def _add(self, event: Event) -> None:
        if event.gpu not in self._named and len(self._named) >= MAX_GPUS:
            return
        self._named.add(event.gpu)
        if event.xid == 0:
            self._fallen.add(event.gpu)
            return
        key = (event.gpu, event.xid)
        if key not in self._counts and len(self._counts) >= MAX_SERIES:
            return
        self._counts[key] = self._counts.get(key, 0) + 1
        self._last[key] = max(event.when, self._last.get(key, 0.0))
        if event.xid == FALLEN_XID:
            self._fallen.add(event.gpu)

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
        with self._lock:
            if now is not None:
                self._seen |= now
            known = self._seen | self._named | set(mapped)
            caught_up = self._caught_up
            counts, last, fallen = dict(self._counts), dict(self._last), set(self._fallen)
        lost = set(nvml_lost) if nvml_lost is not None else None
        known |= lost or set()
        out: List[Sample] = []
        if caught_up:
            runbook = {x.number for x in RUNBOOK}
            for gpu in sorted(known | {g for g, _ in counts}):
                for number in sorted(runbook | {n for g, n in counts if g == gpu}):
                    out.append(_sample("nvidia_vgpu_xid_errors", counts.get((gpu, number), 0),
                                       gpu=gpu, xid=str(number)))
            for (gpu, number), when in sorted(last.items()):
                out.append(_sample("nvidia_vgpu_xid_last_seen_timestamp_seconds", when, gpu=gpu,
                                   xid=str(number)))
        for gpu in sorted(known):
            if caught_up:
                out.append(_sample("nvidia_vgpu_xid_gpu_lost", gpu in fallen, gpu=gpu,
                                   source="kernel"))
            if lost is not None:
                out.append(_sample("nvidia_vgpu_xid_gpu_lost", gpu in lost, gpu=gpu,
                                   source="nvml"))
            if now is not None:
                out.append(_sample("nvidia_vgpu_xid_gpu_lost", gpu not in now, gpu=gpu,
                                   source="pci"))
        return out


def _sample(name: str, value: float, **labels: str) -> Sample:
    return Sample(name, float(value), tuple(labels.items()))


def numbers(action: str) -> Sequence[int]:
    """The runbook's Xid numbers whose first action is ``action`` (RESET or GUEST)."""
    return tuple(x.number for x in RUNBOOK if x.action == action)
