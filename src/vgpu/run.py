"""The one way the charm runs a host command: bounded in time, in a session of its own.

Each command starts in a new session (so its own process group), with stdin
closed and ``LC_ALL=C`` so its messages read the same everywhere. When it
runs past its timeout, the whole group is ended (SIGTERM, then SIGKILL a few
seconds later): a maintainer script that dpkg started never keeps running
after the hook gave up on dpkg, so the next hook cannot start a second one
beside it. A failure becomes :class:`CommandError`, whose message puts the
cause first on one bounded line (see :func:`vgpu.text.cause`).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from typing import Mapping, Optional, Sequence

from . import text
from .errors import CommandError
from .record import NamedTuple

log = logging.getLogger(__name__)

GRACE = 5  # seconds between SIGTERM and SIGKILL for a group that ran out of time


class Result(NamedTuple):
    """What a finished command left: its exit status and its output, decoded and cleaned."""
    returncode: int
    stdout: str
    stderr: str


def run(cmd: Sequence[str], timeout: float, *, check: bool = True, what: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None, stdin: Optional[str] = None) -> Result:
    """Run ``cmd`` and return its output; CommandError when it cannot run or runs too long.

    With ``check`` a non-zero exit is a CommandError too, saying
    ``<what> failed: <cause>``; ``what`` defaults to the program's name.
    ``stdin``: text written to the command's standard input (else it is closed).
    """
    what = what or os.path.basename(cmd[0])
    environ = dict(os.environ if env is None else env, LC_ALL="C")
    try:
        proc = subprocess.Popen(list(cmd), stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                                stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=environ, start_new_session=True)
    except OSError as error:
        why = f"{what} could not run: {error.strerror or error}"
        raise CommandError(why, why) from None
    try:
        out, err = proc.communicate(None if stdin is None else stdin.encode("utf-8"), timeout=timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc, what)
        why = f"{what} timed out after {timeout:g}s and was stopped"
        raise CommandError(why, why) from None
    finally:
        if proc.poll() is None:  # interrupted by anything else: leave nothing behind
            _end_group(proc, what)
    result = Result(proc.returncode, text.decode(out), text.decode(err))
    if check and result.returncode != 0:
        log.warning("%s failed (%d): %s", " ".join(cmd), result.returncode, result.stderr.strip())
        why = text.cause(result.stderr) or f"{what} exited with status {result.returncode}"
        raise CommandError(f"{what} failed: {why}", why, result.returncode, result.stderr)
    return result


def _end_group(proc: subprocess.Popen, what: str) -> None:
    """SIGTERM the command's process group, SIGKILL what is left after GRACE seconds."""
    pgid = proc.pid  # start_new_session: the command leads its own group
    for sig, wait in ((signal.SIGTERM, GRACE), (signal.SIGKILL, GRACE)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            proc.poll()
            if not _group_alive(pgid):
                break
            time.sleep(0.05)
        else:
            continue
        break
    try:
        proc.communicate(timeout=GRACE)
    except subprocess.TimeoutExpired:  # a pipe held open by a process that left the group
        proc.kill()
        log.warning("%s left a process holding its output open", what)


def _group_alive(pgid: int) -> bool:
    """Whether any process of group ``pgid`` still runs (zombies do not count)."""
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        pids = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                fields = handle.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False
