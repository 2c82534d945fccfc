"""The vGPU systemd services, driven with ``systemctl``.

``stop_and_disable`` mirrors charmhelpers' ``service_pause`` (stop, disable,
mask) and ``enable_and_start`` its ``service_resume`` (unmask, enable,
start), one unit at a time so that a failure names its unit.
"""

import logging
import re
import subprocess
from typing import Dict, Iterable, List

from .errors import ServiceError

log = logging.getLogger(__name__)

QUERY_TIMEOUT = 60
CHANGE_TIMEOUT = 300  # stopping nvidia-vgpu-mgr can take a while
_UNIT = re.compile(r"[A-Za-z0-9:_.@\\][A-Za-z0-9:_.@\\-]*")
_ACTIVE = ("active", "reloading")


def states(names: Iterable[str]) -> Dict[str, str]:
    """Each unit's ActiveState word (active, inactive, failed, ...), from one call."""
    names = _checked(names)
    if not names:
        return {}
    # is-active exits non-zero when any unit is not active: that is an answer.
    out = _systemctl(["is-active", *names], QUERY_TIMEOUT, names[0], check=False)
    words = out.stdout.split()
    if len(words) != len(names):
        why = _one_line(out.stderr) or f"{len(words)} answers for {len(names)} units"
        raise ServiceError(f"systemctl is-active {' '.join(names)} failed: {why}")
    return dict(zip(names, words))


def active(names: Iterable[str]) -> Dict[str, bool]:
    """Whether each unit is active, from one ``systemctl is-active`` call."""
    return {name: state in _ACTIVE for name, state in states(names).items()}


def down(names: Iterable[str], daemons: Iterable[str]) -> List[str]:
    """Units that are not doing their job: a daemon not active, or any unit failed.

    A unit that initialises the host and exits (nvidia-vgpud) reads
    ``inactive`` when all went well, so only ``failed`` counts against it.
    """
    daemons = set(daemons)
    return [name for name, state in states(names).items()
            if state == "failed" or (name in daemons and state not in _ACTIVE)]


def masked(names: Iterable[str]) -> List[str]:
    """The units ``systemctl is-enabled`` calls masked (as a pause leaves them)."""
    names = _checked(names)
    if not names:
        return []
    out = _systemctl(["is-enabled", *names], QUERY_TIMEOUT, names[0], check=False)
    words = out.stdout.split()
    if len(words) != len(names):
        why = _one_line(out.stderr) or f"{len(words)} answers for {len(names)} units"
        raise ServiceError(f"systemctl is-enabled {' '.join(names)} failed: {why}")
    return [name for name, word in zip(names, words) if word.startswith("masked")]


def stop_and_disable(names: Iterable[str]) -> None:
    """Stop, disable and mask each unit (like charmhelpers' service_pause)."""
    for name in _checked(names):
        for verb in ("stop", "disable", "mask"):
            _change(verb, name)


def enable_and_start(names: Iterable[str]) -> None:
    """Unmask, enable and start each unit (like charmhelpers' service_resume)."""
    for name in _checked(names):
        for verb in ("unmask", "enable", "start"):
            _change(verb, name)


def _change(verb: str, name: str) -> None:
    timeout = CHANGE_TIMEOUT if verb in ("stop", "start") else QUERY_TIMEOUT
    log.info("systemctl %s %s", verb, name)
    _systemctl([verb, name], timeout, name, check=True)


def _systemctl(args: List[str], timeout: int, unit: str, check: bool) -> subprocess.CompletedProcess:
    cmd = ["systemctl", *args]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                             timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ServiceError(f"systemctl {args[0]} {unit} timed out after {timeout}s") from None
    except OSError as e:
        raise ServiceError(f"systemctl {args[0]} {unit} could not run: {e.strerror}") from e
    if check and out.returncode != 0:
        why = _one_line(out.stderr) or f"exit status {out.returncode}"
        raise ServiceError(f"systemctl {args[0]} {unit} failed: {why}")
    return out


def _checked(names: Iterable[str]) -> List[str]:
    """Unit names as a list; a name systemctl could take for an option is refused."""
    names = list(names)
    for name in names:
        if not _UNIT.fullmatch(name):
            raise ValueError(f"not a systemd unit name: {name!r}")
    return names


def _one_line(text: str, limit: int = 120) -> str:
    """systemctl's first stderr line ("Failed to stop x.service: ..."), printable, short."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if not lines:
        return ""
    line = "".join(c if c.isprintable() else "?" for c in lines[0])
    return line if len(line) <= limit else line[:limit - 3] + "..."
