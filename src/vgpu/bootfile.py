"""Where the boot step's data lives, its bounds, and its mark: what the hooks need of it on every run.

:mod:`vgpu.bootdata` (its shape, the parser the boot step uses) takes these
from here; :mod:`vgpu.sriov` writes the file and renders the unit with them,
and imports the parser only when it has to read the file back.

The mark (:data:`MARK`, in ``/run``, which is empty at every boot) says that
the boot step's work was done since this boot. No mark: the boot step could
not run (it waits for the host lock only so long, :data:`vgpu.hostlock.BOOT_WAIT`,
and a hook may hold it longer), did not finish, or left something not
restored; then the next hook does its work (:func:`vgpu.boot.catch_up`) and
leaves the mark. What was left behind (:data:`LEFT`, only then) is read by
every hook: mdevs no hook creates are named in the status (:func:`left_behind`).
A steady hook only looks whether the two files exist: it opens neither.
"""

import json
import os
from typing import List, Optional, Tuple

from . import files, hostroot, text

DATA_FILE = "var/lib/nova-compute-nvidia-vgpu/boot.json"  # beside catalogue.FILE
DATA_VERSION = 1
LIMIT = 1 << 20  # bytes: far more than 64 GPUs of 64 VFs each take
TOTAL = 600  # seconds for the whole boot step; the unit's TimeoutStartSec is a minute more
MARK = "run/nova-compute-nvidia-vgpu/restored"  # beside the host lock, in /run
LEFT = "run/nova-compute-nvidia-vgpu/restore-left.json"  # what the last run could not restore
LEFT_LIMIT = 1 << 16  # bytes of LEFT, written and read: the mdevs past it are counted ("more")
_FIELD = 200  # characters of each field of an mdev left behind (its why: a tool's message)
BY_BOOT, BY_HOOK = "the boot step", "a hook"
UNIT = "nvidia-vgpu-vfs.service"  # vgpu.sriov.UNIT, named here for messages
_MDEV_DEVICES = "sys/bus/mdev/devices"  # vgpu.mdevs.MDEV_DEVICES


def done() -> bool:
    """Whether the boot step's work was done since this boot (its mark is there)."""
    return os.path.lexists(hostroot.text_path(MARK))


def mark() -> Optional[Tuple[str, int]]:
    """Who did the boot step's work since this boot, and its exit status; None when no mark says.

    A mark that cannot be read as :func:`write` leaves it counts as none.
    """
    try:
        raw = files.read(hostroot.path(MARK), 256)
    except OSError:
        return None
    by, _, status = (raw or b"").decode("utf-8", errors="replace").strip().rpartition(": ")
    if by not in (BY_BOOT, BY_HOOK) or not status.isdigit():
        return None
    return by, int(status)


def write(by: str, status: int, mdevs: List[dict]) -> None:
    """After the boot step's work: the mark, unless the boot step itself left something undone.

    ``mdevs``: those not created (uuid, parent, type, why), kept in :data:`LEFT`
    with ``by`` and ``status`` while there are any, or while the boot step's own
    run was incomplete (then without the mark: the next hook tries once more).
    """
    if mdevs or (by == BY_BOOT and status):
        files.write_atomic(hostroot.path(LEFT), _left_text(by, status, mdevs), mode=0o600)
    else:
        files.remove(hostroot.path(LEFT))
    if by != BY_BOOT or not status:
        files.write_atomic(hostroot.path(MARK), f"{by}: {status}\n", mode=0o600)


def _left_text(by: str, status: int, mdevs: List[dict]) -> str:
    """:data:`LEFT`'s content, at most :data:`LEFT_LIMIT` bytes: the mdevs that fit, the rest counted.

    Each field is bounded; the mdevs past the bound are left out and counted in
    ``more``, so that a reader bounded the same way reads them all as missing.
    """
    kept = [{k: text.one_line(str(v), _FIELD) for k, v in entry.items()} for entry in mdevs]

    def dump(count: int) -> str:
        found = {"by": by, "status": status, "mdevs": kept[:count]}
        if count < len(kept):
            found["more"] = len(kept) - count
        return json.dumps(found, sort_keys=True) + "\n"

    low, high = 0, len(kept)  # the most entries that fit: dump(low) always does
    while low < high:
        middle = (low + high + 1) // 2
        if len(dump(middle).encode("utf-8")) <= LEFT_LIMIT:
            low = middle
        else:
            high = middle - 1
    return dump(low)


def forget() -> None:
    """Delete the mark and what was left behind (charm removal: the lock's directory goes next)."""
    for name in (MARK, LEFT):
        files.remove(hostroot.path(name))


def left() -> Optional[dict]:
    """What the last run left behind (see :func:`write`); None when nothing.

    ``{"unreadable": why}`` when it cannot be read (bounded as it is written) or is not
    what :func:`write` writes: what was left behind cannot be told, and is said.
    """
    if not os.path.lexists(hostroot.text_path(LEFT)):
        return None
    try:
        raw = files.read(hostroot.path(LEFT), LEFT_LIMIT)
        found = json.loads((raw or b"{}").decode("utf-8"))
    except OSError as error:
        return {"unreadable": error.strerror or str(error)}
    except (ValueError, RecursionError):
        return {"unreadable": "not JSON"}
    return found if isinstance(found, dict) else {"unreadable": "not a JSON object"}


def left_behind(found: Optional[dict]) -> List[str]:
    """What :func:`left` says was not restored and is still missing: one blocked message, or none.

    Only mdevs (Nova before 30): no hook creates them, while VFs, their types,
    MIG mode and GPU instances are redone or named by every hook.
    """
    found = found or {}
    if "unreadable" in found:
        return [f"after this boot, the mdevs the boot step could not create again cannot be "
                f"told: /{LEFT} {text.one_line(str(found['unreadable']), 100)}; journalctl -u "
                f"{UNIT} says what was left; systemctl restart {UNIT} tries again"]
    missing = []
    for entry in found.get("mdevs") or []:
        if not isinstance(entry, dict):
            continue
        uuid, parent, kind = (str(entry.get(k, "?")) for k in ("uuid", "parent", "type"))
        if not os.path.lexists(hostroot.text_path(_MDEV_DEVICES, uuid)):
            missing.append(f"{uuid} ({kind} on {parent}: {entry.get('why', 'not created')})")
    more = found.get("more")  # left out of the file (its bound): each counted as still missing
    more = more if isinstance(more, int) and not isinstance(more, bool) and more > 0 else 0
    if not missing and not more:
        return []
    named = text.listing(missing, limit=2)
    if more:
        named = f"{', '.join(missing[:2])} and {len(missing) - len(missing[:2]) + more} more"
    return [f"after this boot, {found.get('by', BY_BOOT)} could not create again the "
            f"mdev{'s' if len(missing) + more > 1 else ''} {named} that "
            f"instances hold: they cannot start until it is there; journalctl -u {UNIT} says "
            f"why; systemctl restart {UNIT} tries again"]
