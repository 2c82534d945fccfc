"""The vGPU systemd services, driven with ``systemctl`` through :mod:`vgpu.run`.

``pause`` mirrors charmhelpers' ``service_pause`` (stop, disable, mask) and
``resume`` its ``service_resume`` (unmask, enable, start), one unit at a time
so that a failure names its unit. A pause that fails halfway undoes what it
did, so the host is left as it was found.

Queries get seconds (update-status runs them on every host every few
minutes); stopping and starting gets longer, since stopping
nvidia-vgpu-mgr waits for its GPUs.
"""

from __future__ import annotations

import logging
import re
from typing import Callable, Dict, Iterable, List, Tuple

from . import run, text
from .errors import CommandError, ServiceError

log = logging.getLogger(__name__)

QUERY_TIMEOUT = 10
SWITCH_TIMEOUT = 30   # enable, disable, mask, unmask: unit files only
CHANGE_TIMEOUT = 120  # stop, start
_UNIT = re.compile(r"[A-Za-z0-9:_.@\\][A-Za-z0-9:_.@\\-]*")
_ACTIVE = ("active", "reloading")
_UNDO = {"stop": "start", "disable": "enable", "mask": "unmask"}


def states(names: Iterable[str]) -> Dict[str, str]:
    """Each unit's ActiveState word (active, inactive, failed, ...), from one call."""
    return dict(zip(*_query("is-active", names)))


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
    units, words = _query("is-enabled", names)
    return [name for name, word in zip(units, words) if word.startswith("masked")]


_DOING = {"stop": "stopping", "disable": "disabling", "mask": "masking", "unmask": "unmasking",
          "enable": "enabling", "start": "starting"}


def _quiet(_message: str) -> None:
    """No progress report."""


def pause(names: Iterable[str], progress: Callable[[str], None] = _quiet) -> None:
    """Stop, disable and mask each unit (like charmhelpers' service_pause).

    When a step fails, the steps already done are undone in reverse order
    and ServiceError is raised; its message says whether that worked.
    ``progress`` is told each step before it runs ("stopping nvidia-vgpu-mgr").
    """
    names = _checked(names)
    was_active = active(names)
    done: List[Tuple[str, str]] = []
    try:
        for name in names:
            for verb in ("stop", "disable", "mask"):
                progress(f"{_DOING[verb]} {name}")
                _change(verb, name)
                done.append((verb, name))
    except ServiceError as error:
        left = _undo(done, was_active)
        outcome = (f"; could not undo: {', '.join(left)}" if left
                   else "; what it had done was undone")
        raise ServiceError(f"{error}{outcome}") from None


def resume(names: Iterable[str], progress: Callable[[str], None] = _quiet) -> None:
    """Unmask, enable and start each unit (like charmhelpers' service_resume); ``progress``: see pause."""
    for name in _checked(names):
        for verb in ("unmask", "enable", "start"):
            progress(f"{_DOING[verb]} {name}")
            _change(verb, name)


def unmask(names: Iterable[str]) -> None:
    """Unmask and enable each unit, starting none (the charm's removal)."""
    for name in _checked(names):
        for verb in ("unmask", "enable"):
            _change(verb, name)


def reload_units() -> None:
    """``systemctl daemon-reload``: systemd reads the unit files written since."""
    _change("daemon-reload")


def enable(name: str) -> None:
    """Enable one unit (it starts at the next boot), starting nothing now."""
    _change("enable", name)


def disable(name: str) -> None:
    """Keep one unit from starting at boot, stopping nothing now."""
    _change("disable", name)


def restart(name: str) -> None:
    """Start one unit, or stop and start it when it runs (its new code or unit file in force)."""
    _change("restart", name)


def stop(name: str) -> None:
    """Stop one unit now (it stays enabled)."""
    _change("stop", name)


def start(name: str, wait: bool = True) -> None:
    """Start one unit; ``wait`` False queues the start (``--no-block``) and returns at once.

    The boot step starts units that are ordered after it that way: a blocking
    start would wait for the boot step itself.
    """
    _change("start", name, block=wait)


def stop_and_disable(name: str) -> None:
    """Stop one unit and keep it from starting at boot (what removing it needs first)."""
    for verb in ("stop", "disable"):
        _change(verb, name)


def _undo(done: List[Tuple[str, str]], was_active: Dict[str, bool]) -> List[str]:
    """Reverse ``done`` (a unit is started again only if it ran before); what failed to reverse."""
    left = []
    for verb, name in reversed(done):
        if verb == "stop" and not was_active.get(name):
            continue
        try:
            _change(_UNDO[verb], name)
        except ServiceError as error:
            log.error("could not undo systemctl %s %s: %s", verb, name, error)
            left.append(f"{verb} {name}")
    return left


def _change(verb: str, name: str = "", block: bool = True) -> None:
    """``systemctl [--no-block] <verb> [<name>]``; ServiceError saying what failed, cause first."""
    timeout = CHANGE_TIMEOUT if verb in ("stop", "start", "restart") else SWITCH_TIMEOUT
    cmd = ["systemctl", *(() if block else ("--no-block",)), verb,
           *_checked([name] if name else [])]
    what = " ".join(cmd)
    log.info("%s", what)
    try:
        run.run(cmd, timeout, what=what)
    except CommandError as error:
        raise ServiceError(str(error)) from None


def _query(verb: str, names: Iterable[str]) -> Tuple[List[str], List[str]]:
    """(units, one answer word per unit) from one ``systemctl <verb>`` call."""
    names = _checked(names)
    if not names:
        return [], []
    what = f"systemctl {verb} {' '.join(names)}"
    # is-active and is-enabled exit non-zero when a unit is not active/enabled: still an answer.
    try:
        out = run.run(["systemctl", verb, *names], QUERY_TIMEOUT, check=False, what=what)
    except CommandError as error:
        raise ServiceError(str(error)) from None
    words = out.stdout.split()
    if len(words) != len(names):
        why = text.cause(out.stderr) or f"it answered for {len(words)} of {len(names)} units"
        raise ServiceError(f"{what} failed: {why}")
    return names, words


def _checked(names: Iterable[str]) -> List[str]:
    """Unit names as a list; a name systemctl could take for an option is refused."""
    names = list(names)
    for name in names:
        if not _UNIT.fullmatch(name):
            raise ValueError(f"not a systemd unit name: {name!r}")
    return names
