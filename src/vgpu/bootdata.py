"""The boot step's data file: where it lives, its shape, and its time limits.

The charm's hooks write it (:func:`vgpu.sriov.boot_data`,
:func:`vgpu.sriov.write_boot_data`); the boot step (:mod:`vgpu.boot`) reads it
at boot. Both sides import this module, which imports neither of them.
"""

import json
import re
from typing import Any, Dict, List, Mapping, NamedTuple, Tuple

from . import hostroot
from .errors import HostReadError

DATA_FILE = "var/lib/nova-compute-nvidia-vgpu/boot.json"  # beside catalogue.FILE
DATA_VERSION = 1
_ADDRESS = re.compile(r"[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")


class DataError(ValueError):
    """The boot data is missing, not JSON, or not shaped as :func:`vgpu.sriov.boot_data` writes it."""


class Limits(NamedTuple):
    """How long the boot step may take, in seconds (``attempts``: sriov-manage runs per GPU)."""

    total: float = 600  # everything; the unit's TimeoutStartSec is a minute more
    manager: float = 180  # waiting for the vGPU manager, within ``total``
    call: float = 300  # one sriov-manage run
    attempts: int = 3
    delay: float = 5  # the pause after a failed attempt, doubled each time
    poll: float = 1  # between looks at a VF that lists nothing yet

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
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise DataError(f"limits.{field} is not a number of seconds")
            values[field] = int(value) if field == "attempts" else value
        limits = cls()._replace(**values)
        return limits._replace(total=min(limits.total, cls().total), attempts=max(1, limits.attempts))


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
    """The boot data at host path ``where``; DataError saying why it cannot be used."""
    try:
        raw = hostroot.read_text(hostroot.path(where))
    except HostReadError as error:
        raise DataError(str(error)) from None
    if raw is None:
        raise DataError("does not exist (the charm writes it once a mapping is in force)")
    try:
        data = json.loads(raw)
    except ValueError:
        raise DataError("is not JSON") from None
    if not isinstance(data, dict):
        raise DataError("is not a JSON object")
    return data


def parse(data: Mapping) -> Tuple[List[GpuPlan], List[str], Limits]:
    """(GPUs, units to wait for, limits) from the data; DataError when it is not as written."""
    version = data.get("version")
    if version != DATA_VERSION:
        raise DataError(f"version {version} is not one this charm knows")
    gpus = data.get("gpus")
    wait_for = data.get("wait_for", [])
    if not isinstance(gpus, list) or not isinstance(wait_for, list) \
            or not all(isinstance(u, str) for u in wait_for):
        raise DataError("gpus and wait_for must be lists")
    return [_gpu(entry) for entry in gpus], list(wait_for), Limits.of(data.get("limits"))


def _gpu(entry) -> GpuPlan:
    address = entry.get("address") if isinstance(entry, dict) else None
    if not isinstance(address, str) or not _ADDRESS.match(address):
        raise DataError(f"an entry names no GPU address: {str(entry)[:80]}")
    vfs = []
    for vf in entry.get("vfs") or []:
        index, name, number = (vf.get(k) for k in ("index", "name", "number")) \
            if isinstance(vf, dict) else (None, None, None)
        if not (isinstance(index, int) and index >= 0 and isinstance(name, str) and name
                and isinstance(number or 0, int)):
            raise DataError(f"GPU {address}: a VF entry is not an index and a name: {str(vf)[:80]}")
        vfs.append(VfPlan(index, name, number or 0))
    return GpuPlan(address, str(entry.get("model") or ""), tuple(sorted(vfs)))
