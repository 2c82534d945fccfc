"""The boot step's data file: where it lives, its shape, and its time limits.

The charm's hooks write it (:func:`vgpu.sriov.boot_data`,
:func:`vgpu.sriov.write_boot_data`); the boot step (:mod:`vgpu.boot`) reads it
at boot. Both sides import this module, which imports neither of them; the
hooks only when they read the file back (every hook needs only
:mod:`vgpu.bootfile`: the file's place, version and bounds).
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
from typing import Any, Dict, List, Mapping, Tuple

# The file's place and bounds live in vgpu.bootfile, which every hook imports (not this module).
from . import PCI_ADDRESS, files, hostroot, text
from .bootfile import DATA_FILE, DATA_VERSION, LIMIT, TOTAL  # noqa: F401
from .record import NamedTuple

# Patterns compiled by re when used (the boot step, a changed file): not on every hook.
_ADDRESS = PCI_ADDRESS + r"\Z"
_UNIT = r"[A-Za-z0-9][A-Za-z0-9@._:-]{0,250}\Z"  # a systemd unit name, never an option


class DataError(ValueError):
    """The boot data is missing, not JSON, or not shaped as :func:`vgpu.sriov.boot_data` writes it."""


class Limits(NamedTuple):
    """How long the boot step may take, in seconds (``attempts``: sriov-manage runs per GPU).

    ``parallel``: how many GPUs are restored side by side (each in a thread of its
    own; GPUs are independent, so a host of 8 takes about as long as its slowest).
    """

    total: float = TOTAL  # everything; the unit's TimeoutStartSec is a minute more
    manager: float = 180  # waiting for the vGPU manager, within ``total``
    call: float = 300  # one sriov-manage run
    attempts: int = 3  # sriov-manage runs per GPU, and nvidia-smi -mig 1 runs on a pending mode
    delay: float = 5  # the pause after a failed attempt, doubled each time
    poll: float = 1  # between looks at a VF that lists nothing yet
    parallel: int = 8  # GPUs restored at once (1 to 64)

    @classmethod
    def of(cls, given) -> "Limits":
        """The data's limits (defaults for what it leaves out); ``total`` never above the default."""
        if given is None:
            return cls()
        if not isinstance(given, dict):
            raise DataError("limits is not a JSON object")
        values: Dict[str, Any] = {}
        for field in cls._fields:
            value = given.get(field)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) \
                    or not math.isfinite(value) or value < 0:
                raise DataError(f"limits.{field} is not a number of seconds")
            values[field] = int(value) if field in ("attempts", "parallel") else value
        limits = cls()._replace(**values)
        return limits._replace(total=min(limits.total, cls().total), attempts=max(1, limits.attempts),
                               parallel=min(64, max(1, limits.parallel)))


class VfPlan(NamedTuple):
    """One VF (by its ``virtfn`` index) and the profile it takes."""

    virtfn: int  # a NamedTuple field may not be called index (tuple.index)
    name: str  # the driver's name (NVIDIA L40S-12Q) or the profile (L40S-12Q)
    number: int = 0  # its id when the data was written: used only for a type never named


class GpuPlan(NamedTuple):
    """One GPU whose VFs are enabled, and its VFs' profiles."""

    address: str
    model: str = ""
    vfs: Tuple[VfPlan, ...] = ()


def load(where: str) -> dict:
    """The boot data at host path ``where``; DataError saying why it cannot be used.

    Read as the charm's other state files are (:func:`vgpu.files.read`): a link
    on the way is not followed, and at most :data:`LIMIT` bytes are read. JSON
    constants outside the standard (``NaN``, ``Infinity``) are refused, as is
    nesting too deep for the parser.
    """
    target = hostroot.path(where)
    try:
        raw = files.read(target, LIMIT)
    except OSError as error:  # the reason names the file, which the journal line names already
        why = str(error.strerror or error)
        if error.errno == errno.ELOOP and os.path.islink(target):
            why = "is a symbolic link: not followed (the charm writes a plain file)"
        raise DataError(why.removeprefix(f"{hostroot.shown(target)} ")) from None
    if raw is None:
        raise DataError("does not exist (the charm writes it once a mapping is in force)")
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except RecursionError:
        raise DataError("is nested too deeply to be boot data") from None
    except ValueError as error:
        why = f" ({error.args[0]})" if isinstance(error, _ConstantError) else ""
        raise DataError(f"is not JSON{why}") from None
    if not isinstance(data, dict):
        raise DataError("is not a JSON object")
    return data


class _ConstantError(ValueError):
    """``NaN`` or ``Infinity`` in the data: Python's json reads them, JSON has none."""


def _no_constant(name: str):
    raise _ConstantError(f"{name} is no JSON number")


def _shown(value) -> str:
    """``value`` on one short line for the journal, however it is nested."""
    try:
        return text.one_line(repr(value), 80)
    except RecursionError:
        return f"a {type(value).__name__} nested too deeply"


def parse(data: Mapping) -> Tuple[List[GpuPlan], List[str], Limits]:
    """(GPUs, units to wait for, limits) from the data; DataError when it is not as written."""
    version = data.get("version")
    if version != DATA_VERSION:
        raise DataError(f"version {version} is not one this charm knows")
    gpus = data.get("gpus")
    wait_for = data.get("wait_for", [])
    if not isinstance(gpus, list) or not isinstance(wait_for, list):
        raise DataError("gpus and wait_for must be lists")
    for unit in wait_for:
        if not isinstance(unit, str) or not re.match(_UNIT, unit):
            raise DataError(f"wait_for names no systemd unit: {_shown(unit)}")
    return [_gpu(entry) for entry in gpus], list(wait_for), Limits.of(data.get("limits"))


def _gpu(entry) -> GpuPlan:
    address = entry.get("address") if isinstance(entry, dict) else None
    if not isinstance(address, str) or not re.match(_ADDRESS, address):
        raise DataError(f"an entry names no GPU address: {_shown(entry)}")
    listed, model = entry.get("vfs"), entry.get("model")
    if not isinstance(listed, (list, type(None))) or not isinstance(model, (str, type(None))):
        raise DataError(f"GPU {address}: vfs is not a list or model not text: {_shown(entry)}")
    vfs = []
    for vf in listed or []:
        index, name, number = (vf.get(k) for k in ("index", "name", "number")) \
            if isinstance(vf, dict) else (None, None, None)
        if not (_count(index) and isinstance(name, str) and name and len(name) <= 128
                and (number is None or _count(number))):
            raise DataError(f"GPU {address}: a VF entry is not an index and a name: {_shown(vf)}")
        vfs.append(VfPlan(int(index or 0), name, number or 0))
    return GpuPlan(address, model or "", tuple(sorted(vfs)))


def _count(value) -> bool:
    """A whole number a VF index or a type id can be (not a bool, not negative, not huge)."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 31
