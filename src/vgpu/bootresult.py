"""What the boot step did at the last boot, GPU by GPU: written by it, read by the exporter.

The boot step (:mod:`vgpu.boot`) writes :data:`RESULT_FILE` beside its data
file when it ends: when it finished, how long it took, its exit status, who
ran it (``run_by``: ``boot_step``, or ``hook`` when a hook did the boot step's
work because the boot step could not, :func:`vgpu.boot.catch_up`) and, per GPU
of the data, ``restored``, ``left alone`` or ``not restored`` with the
seconds that GPU took. A result written before ``run_by`` existed names
nobody (``""``). A result that cannot be written is logged and changes
nothing else (the journal keeps the whole story). The exporter
(:mod:`vgpu.metrics`) reads it on each scrape, bounded as every file the
charm reads; a file that is absent (the boot step never ran since the charm
was installed) gives no result, one that cannot be read or parsed a
:class:`ResultError`.
"""

from __future__ import annotations

import json
import logging
import math
import re
from typing import Iterable, Optional, Tuple

from . import PCI_ADDRESS, files, hostroot
from .bootfile import BY_BOOT, BY_HOOK, DATA_FILE
from .record import NamedTuple

log = logging.getLogger(__name__)

RESULT_FILE = DATA_FILE.rsplit("/", 1)[0] + "/boot-result.json"
VERSION = 1
LIMIT = 1 << 20  # bytes: a few dozen per GPU
RESULTS = ("restored", "left alone", "not restored")  # vgpu.boot's RESTORED, LEFT_ALONE, FAILED
RUN_BY = {BY_BOOT: "boot_step", BY_HOOK: "hook"}  # who ran it (vgpu.bootfile's words): its value
_ADDRESS = PCI_ADDRESS + r"\Z"


class ResultError(ValueError):
    """The result file cannot be read, or is not shaped as :func:`save` writes it."""


class GpuResult(NamedTuple):
    """One GPU at the last boot."""

    address: str
    result: str  # one of RESULTS
    seconds: float


class Result(NamedTuple):
    """The boot step's last run."""

    finished: float  # seconds since the epoch
    seconds: float  # how long the whole step took
    status: int  # its exit status: 0 all restored, 1 something not, 2 its data unreadable
    gpus: Tuple[GpuResult, ...] = ()
    run_by: str = ""  # a value of RUN_BY; "" in a result written before it was recorded


def save(result: Result) -> bool:
    """Write ``result`` over the last one; False (logged) when it cannot be written."""
    content = json.dumps({"version": VERSION, "finished": result.finished,
                          "seconds": result.seconds, "status": result.status,
                          "gpus": [g._asdict() for g in result.gpus], "run_by": result.run_by},
                         indent=1, sort_keys=True)
    try:
        files.write_atomic(hostroot.path(RESULT_FILE), content + "\n")
    except OSError as error:
        log.warning("cannot record the result in /%s: %s", RESULT_FILE, error.strerror or error)
        return False
    return True


def forget() -> bool:
    """Delete the result (charm removal); False when there was none. OSError if it cannot be."""
    return files.remove(hostroot.path(RESULT_FILE))


def gpu_results(outcome: Iterable[Tuple[str, str, float]]) -> Tuple[GpuResult, ...]:
    """``(address, result, seconds)`` triples as GpuResults, in address order."""
    return tuple(sorted(GpuResult(a, r, round(max(0.0, s), 3)) for a, r, s in outcome))


def load() -> Optional[Result]:
    """The last result; None when there is none yet; ResultError when it cannot be used."""
    try:
        raw = files.read(hostroot.path(RESULT_FILE), LIMIT)
    except OSError as error:
        raise ResultError(f"/{RESULT_FILE}: {error.strerror or error}") from None
    if raw is None:
        return None
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise ResultError(f"/{RESULT_FILE} is not JSON") from None
    if not isinstance(data, dict) or data.get("version") != VERSION:
        raise ResultError(f"/{RESULT_FILE} is not a result of version {VERSION}")
    gpus = data.get("gpus")
    if not isinstance(gpus, list):
        raise ResultError(f"/{RESULT_FILE}: gpus is not a list")
    run_by = data.get("run_by", "")
    if run_by not in ("", *RUN_BY.values()):
        raise ResultError(f"/{RESULT_FILE}: run_by names neither the boot step nor a hook")
    return Result(_seconds(data.get("finished")), _seconds(data.get("seconds")),
                  _status(data.get("status")), tuple(_gpu(entry) for entry in gpus), run_by)


def _gpu(entry) -> GpuResult:
    if not isinstance(entry, dict):
        raise ResultError(f"/{RESULT_FILE}: a GPU entry is not an object")
    address, result = entry.get("address"), entry.get("result")
    if not isinstance(address, str) or not re.match(_ADDRESS, address) or result not in RESULTS:
        raise ResultError(f"/{RESULT_FILE}: a GPU entry names no GPU address and result")
    return GpuResult(address, result, _seconds(entry.get("seconds")))


def _seconds(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or value < 0:
        raise ResultError(f"/{RESULT_FILE}: a time is not a number of seconds")
    return float(value)


def _status(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 256:
        raise ResultError(f"/{RESULT_FILE}: status is not an exit status")
    return value
