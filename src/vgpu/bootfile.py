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
        files.write_atomic(hostroot.path(LEFT), json.dumps(
            {"by": by, "status": status, "mdevs": mdevs}, sort_keys=True) + "\n", mode=0o600)
    else:
        files.remove(hostroot.path(LEFT))
    if by != BY_BOOT or not status:
        files.write_atomic(hostroot.path(MARK), f"{by}: {status}\n", mode=0o600)


def forget() -> None:
    """Delete the mark and what was left behind (charm removal: the lock's directory goes next)."""
    for name in (MARK, LEFT):
        files.remove(hostroot.path(name))


def left() -> Optional[dict]:
    """What the last run left behind (see :func:`write`); None when nothing, {} when unreadable."""
    if not os.path.lexists(hostroot.text_path(LEFT)):
        return None
    try:
        raw = files.read(hostroot.path(LEFT), 1 << 16)
        found = json.loads((raw or b"{}").decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return {}
    return found if isinstance(found, dict) else {}


def left_behind(found: Optional[dict]) -> List[str]:
    """What :func:`left` says was not restored and is still missing: one blocked message, or none.

    Only mdevs (Nova before 30): no hook creates them, while VFs, their types,
    MIG mode and GPU instances are redone or named by every hook.
    """
    missing = []
    for entry in (found or {}).get("mdevs") or []:
        if not isinstance(entry, dict):
            continue
        uuid, parent, kind = (str(entry.get(k, "?")) for k in ("uuid", "parent", "type"))
        if not os.path.lexists(hostroot.text_path(_MDEV_DEVICES, uuid)):
            missing.append(f"{uuid} ({kind} on {parent}: {entry.get('why', 'not created')})")
    if not missing:
        return []
    return [f"after this boot, {(found or {}).get('by', BY_BOOT)} could not create again the "
            f"mdev{'s' if len(missing) > 1 else ''} {text.listing(missing, limit=2)} that "
            f"instances hold: they cannot start until it is there; journalctl -u {UNIT} says "
            f"why; systemctl restart {UNIT} tries again"]
