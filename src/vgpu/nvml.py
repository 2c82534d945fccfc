"""Per-vGPU figures from NVIDIA's NVML, through nvidia-ml-py's ``pynvml``, where the driver is.

NVML is how NVIDIA's host driver tells what the vGPUs on a hypervisor do
("Managing vGPUs on the hypervisor", NVML API reference): per physical GPU
``nvmlDeviceGetActiveVgpus``, per vGPU ``nvmlVgpuInstanceGetUUID``,
``GetVmID`` (the VM's UUID on KVM, which is Nova's instance UUID),
``GetType``, ``GetFbUsage`` and ``GetLicenseInfo_v2``, and per GPU its vGPUs'
utilisation (``nvmlDeviceGetVgpuInstancesUtilizationInfo``, R550 and later;
``nvmlDeviceGetVgpuUtilization`` before).

The exporter keeps one :class:`Session` for its life: NVML is initialised at
the first read and again after a read that failed. A host without the driver
(no ``libnvidia-ml.so.1``, the module not loaded) or without nvidia-ml-py is
no error: :attr:`Reading.present` is False and nothing is read. Every other
failure is caught, said in :attr:`Reading.errors`, and what could be read is
kept: nothing here raises to the exporter.

A GPU that fell off the bus answers ``NVML_ERROR_GPU_IS_LOST`` ("GPU is
lost"; NVML's reference, ``nvmlDeviceGetHandleByIndex``): :attr:`Reading.lost`
names it by the PCI address sysfs gives (the read's ``addresses``, asked of
``nvmlDeviceGetHandleByPciBusId``), and the other GPUs are read as before.

nvidia-ml-py 13.615's ``nvmlVgpuInstanceGetFbUsage`` hands NVML a 32-bit
buffer where ``nvml.h`` declares ``unsigned long long *fbUsage``: the value
above 4 GiB is cut. The framebuffer is read through the same library
function with a 64-bit buffer.
"""

from __future__ import annotations

import ctypes
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .record import NamedTuple

ENGINES = (("sm", "smUtil"), ("memory", "memUtil"), ("encoder", "encUtil"),
           ("decoder", "decUtil"))  # the utilisation a sample gives: our label, NVML's field
# NVML_GRID_LICENSE_STATE_*: what NVML says of a vGPU's licence.
LICENSE_STATES = {0: "unknown", 1: "uninitialized", 2: "unlicensed, unrestricted (grace period)",
                  3: "unlicensed, restricted", 4: "unlicensed", 5: "licensed"}
_ABSENT = (9, 12)  # NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND: no driver here
GPU_IS_LOST = 15  # NVML_ERROR_GPU_IS_LOST: fallen off the bus, or otherwise inaccessible


class Vgpu(NamedTuple):
    """What NVML says of one active vGPU; None where a read failed."""

    gpu: str  # the physical GPU's PCI address, as sysfs names it: 0000:81:00.0
    instance: int  # NVML's vGPU instance id (nvmlDeviceGetActiveVgpus), which it always has
    uuid: str  # the vGPU's own UUID; "" when unread
    instance_uuid: str  # the VM's UUID (Nova's instance UUID on KVM); "" when NVML gives another id
    type_id: str  # nvidia-<n>; "" when unread
    licensed: Optional[bool] = None
    license_state: Optional[int] = None  # a key of LICENSE_STATES
    framebuffer_bytes: Optional[int] = None
    utilization: Tuple[Tuple[str, float], ...] = ()  # (engine, 0..1)


class Reading(NamedTuple):
    """One read of NVML."""

    present: bool  # the driver (and nvidia-ml-py) is there: NVML could be asked
    vgpus: Tuple[Vgpu, ...] = ()
    driver_version: str = ""
    errors: Tuple[str, ...] = ()  # each read that failed, said once
    lost: Tuple[str, ...] = ()  # GPUs NVML says are lost, by PCI address


class Session:
    """NVML for a long-lived reader; ``module``: pynvml, or a stand-in (imported when None)."""

    def __init__(self, module: Any = None) -> None:
        """Nothing is loaded or initialised until the first :meth:`read`."""
        self._module = module
        self._ready = False

    def read(self, addresses: Sequence[str] = ()) -> Reading:
        """Every active vGPU of every GPU; never raises (see the module doc).

        ``addresses``: the GPUs sysfs lists, to name one NVML says is lost.
        """
        nvml = self._load()
        if nvml is None:
            return Reading(present=False)
        if not self._ready:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as error:
                if _code(error) in _ABSENT:
                    return Reading(present=False)
                return Reading(present=True, errors=(f"nvmlInit: {error}",))
            except OSError as error:  # the library itself cannot be loaded
                return Reading(present=False, errors=(f"nvmlInit: {error}",))
            self._ready = True
        errors: List[str] = []
        try:
            reading = _read(nvml, errors, addresses)
        except nvml.NVMLError as error:  # the device list itself: start again next time
            self.close()
            return Reading(present=True, errors=(f"{error}",))
        return reading._replace(errors=tuple(dict.fromkeys(errors)))

    def close(self) -> None:
        """Shut NVML down (it is initialised again at the next read)."""
        if self._ready and self._module is not None:
            try:
                self._module.nvmlShutdown()
            except self._module.NVMLError:
                pass
        self._ready = False

    def _load(self) -> Any:
        if self._module is None:
            try:
                import pynvml  # nvidia-ml-py: only the exporter loads it
            except ImportError:
                return None
            self._module = pynvml
        return self._module


def _read(nvml: Any, errors: List[str], addresses: Sequence[str]) -> Reading:
    version = _try(errors, "driver version", nvml.nvmlSystemGetDriverVersion) or ""
    vgpus: List[Vgpu] = []
    seen: List[str] = []
    lost: List[str] = []
    unnamed = 0  # GPUs lost before NVML gave their address
    for index in range(nvml.nvmlDeviceGetCount()):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            address = bus_address(nvml.nvmlDeviceGetPciInfo(handle).busId)
        except nvml.NVMLError as error:
            if _code(error) != GPU_IS_LOST:
                raise
            unnamed += 1
            continue
        seen.append(address)
        try:
            instances = nvml.nvmlDeviceGetActiveVgpus(handle)
        except nvml.NVMLError as error:
            if _code(error) == GPU_IS_LOST:
                lost.append(address)
            else:
                errors.append(f"GPU {address}: active vGPUs: {error}")
            continue
        if not instances:
            continue
        usage = _utilization(nvml, handle, address, errors)
        for instance in instances:
            vgpus.append(_vgpu(nvml, instance, address, usage.get(_key(instance), ()), errors))
    if unnamed:
        named = _lost(nvml, [a for a in addresses if a not in seen and a not in lost])
        lost.extend(named)
        if len(named) < unnamed:
            errors.append(f"NVML: GPU is lost, for {unnamed - len(named)} GPU whose PCI address "
                          "it does not give")
    return Reading(present=True, vgpus=tuple(vgpus), driver_version=_text(version),
                   lost=tuple(lost))


def _lost(nvml: Any, addresses: Sequence[str]) -> List[str]:
    """Those of ``addresses`` NVML answers "GPU is lost" for, when asked by PCI address."""
    out = []
    for address in addresses:
        try:
            nvml.nvmlDeviceGetHandleByPciBusId(address)
        except nvml.NVMLError as error:
            if _code(error) == GPU_IS_LOST:
                out.append(address)
    return out


INVALID_PROFILE = 0xFFFFFFFF  # NVML's INVALID_GPU_INSTANCE_PROFILE_ID: a time-sliced type


def gpu_instance_profiles(module: Any = None) -> Dict[str, Dict[str, str]]:
    """``{GPU: {vGPU type name: GPU instance profile}}`` for the MIG-backed types NVML names.

    Per GPU its supported types (``nvmlDeviceGetSupportedVgpus``), each type's
    ``nvmlVgpuTypeGetGpuInstanceProfileId`` ("Retrieve the GPU Instance Profile ID
    for the given vGPU type ID ... a valid GPU Instance Profile ID for the MIG
    capable vGPU types, else INVALID_GPU_INSTANCE_PROFILE_ID": NVML API reference,
    "vGPU Management"), named by ``nvmlDeviceGetGpuInstanceProfileInfoById``
    (``MIG 1g.24gb+gfx`` as nvidia-smi mig -lgip lists it, without ``MIG``). A GPU
    whose driver lacks the call has nothing; an id NVML cannot name is left out.
    {} without the driver. NVML is initialised and shut down here: no session is
    left open (an NVML client holding a GPU leaves ``-mig 1`` pending).
    """
    def read(nvml: Any) -> Dict[str, Dict[str, str]]:
        out: Dict[str, Dict[str, str]] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                address = bus_address(nvml.nvmlDeviceGetPciInfo(handle).busId)
                out[address] = _profiles(nvml, handle)
        except nvml.NVMLError:
            pass  # what was read stands; the rest is left to the names
        return out

    return once(read, module) or {}


def _profiles(nvml: Any, handle: Any) -> Dict[str, str]:
    """One GPU's part of :func:`gpu_instance_profiles`."""
    out: Dict[str, str] = {}
    for type_id in nvml.nvmlDeviceGetSupportedVgpus(handle):
        try:
            profile = int(nvml.nvmlVgpuTypeGetGpuInstanceProfileId(type_id))
        except nvml.NVMLError:
            return {}  # a driver without the call (or not for this GPU): the names decide
        if profile == INVALID_PROFILE:
            continue
        try:
            name = _text(nvml.nvmlVgpuTypeGetName(type_id))
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfoById(handle, profile)
        except nvml.NVMLError:
            continue
        found = _text(info.name).strip()
        out[name] = found[4:] if found.startswith("MIG ") else found
    return out


# -- the bounded child: every NVML call of a hook or an action ----------------------------------
#
# NVML is a C library: a call that hangs in the driver (nvmlInit on a wedged GPU) cannot be
# stopped from the process that made it, and Juju runs nothing else on the unit while a hook
# hangs. A hook or an action therefore asks NVML only through ``python -m vgpu.nvml <query>``
# (:func:`ask`), a process of its own that is killed, with its process group, after
# :data:`NVML_TIMEOUT` seconds (vgpu.run), and whose NVML session ends with it. The exporter keeps
# its own :class:`Session` in its own process, which holds no machine lock.

NVML_TIMEOUT = 20.0  # seconds a query may take, NVML's initialisation included
ANSWER_LIMIT = 1 << 22  # bytes of the child's answer read
QUERIES = ("gpu-instance-profiles", "gpu-metadata", "verdicts", "per-vm")


class UnansweredError(Exception):
    """NVML did not answer: the child ran out of time, failed, or said nothing readable."""


def ask(query: str, payload: Any = None, timeout: Optional[float] = None) -> Any:
    """``python -m vgpu.nvml <query>``'s answer (JSON; None: no NVML on this host).

    ``payload`` goes to the child's standard input as JSON. UnansweredError, saying why, when
    the child runs past ``timeout`` (default :data:`NVML_TIMEOUT`), fails or answers
    something that is not JSON.
    """
    import json
    import os
    import sys

    from . import run, text
    from .errors import CommandError

    if query not in QUERIES:
        raise ValueError(f"no NVML query {query!r}")
    bound = NVML_TIMEOUT if timeout is None else timeout
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    try:
        result = run.run([sys.executable, "-m", "vgpu.nvml", query], bound, env=env,
                         what=f"NVML ({query})",
                         stdin=json.dumps(payload) if payload is not None else None)
    except CommandError as error:
        if "timed out" in str(error) or "did not end" in str(error) or "out of time" in str(
                error):
            raise UnansweredError(f"NVML did not answer within {bound:g}s") from None
        raise UnansweredError(f"NVML did not answer: {text.cause(str(error)) or error}") from None
    try:
        return json.loads(result.stdout[:ANSWER_LIMIT] or "null")
    except ValueError:
        raise UnansweredError("NVML's answer could not be read") from None


def main(argv: Optional[Sequence[str]] = None) -> None:
    """``python -m vgpu.nvml [query]``: one of :data:`QUERIES`, its answer as JSON on stdout.

    ``gpu-instance-profiles`` (the default; vgpu.mig): :func:`gpu_instance_profiles`;
    ``gpu-metadata``: :func:`gpu_metadata`; ``verdicts`` (stdin: ``{"instances": [...],
    "targets": [...]}``): :func:`verdicts`; ``per-vm`` (stdin: type numbers):
    :func:`max_per_vm`. ``null`` where NVML cannot be asked.
    """
    import json
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    query = args[0] if args else "gpu-instance-profiles"
    if query == "gpu-instance-profiles":
        answer: Any = gpu_instance_profiles()
    elif query == "gpu-metadata":
        answer = once(gpu_metadata)
    elif query in ("verdicts", "per-vm"):
        payload = json.loads(sys.stdin.read(ANSWER_LIMIT) or "null")
        if query == "verdicts":
            payload = payload if isinstance(payload, dict) else {}
            instances = [str(i) for i in payload.get("instances") or () if isinstance(i, str)]
            targets = [str(t) for t in payload.get("targets") or () if isinstance(t, str)]
            answer = once(lambda module: verdicts(module, instances, targets))
        else:
            numbers = [int(n) for n in payload or () if isinstance(n, int)]
            answer = once(lambda module: {str(k): v for k, v in max_per_vm(module, numbers).items()})
    else:
        sys.stderr.write(f"no NVML query {query!r}: one of {', '.join(QUERIES)}\n")
        sys.exit(2)
    sys.stdout.write(json.dumps(answer, sort_keys=True))


def verdicts(nvml: Any, instances: Sequence[str], targets: Sequence[str]) -> Dict[str, Any]:
    """The running vGPUs' metadata of ``instances`` and NVIDIA's verdict on each of ``targets``.

    ``{"metadata": {instance: encoded}, "answers": [[encoded vGPU, encoded GPU, verdict]]}``.
    """
    running = vgpu_metadata(nvml)
    answers = []
    for instance in instances:
        mine = running.get(instance, "")
        for target in targets if mine else ():
            answers.append([mine, target, compatibility(nvml, mine, target)])
    return {"metadata": {i: running[i] for i in instances if i in running}, "answers": answers}


def max_per_vm(nvml: Any, type_numbers: Sequence[int]) -> Dict[int, int]:
    """``nvmlVgpuTypeGetMaxInstancesPerVm`` per type; a type NVML does not answer for is left out."""
    out: Dict[int, int] = {}
    for number in sorted(set(type_numbers)):
        try:
            out[number] = int(nvml.nvmlVgpuTypeGetMaxInstancesPerVm(number))
        except nvml.NVMLError:
            continue  # this type unknown to NVML, or the call unsupported: NVIDIA's rules
    return out


def _vgpu(nvml: Any, instance: Any, address: str, usage: Tuple[Tuple[str, float], ...],
          errors: List[str]) -> Vgpu:
    where = f"GPU {address}: a vGPU's"
    uuid = _text(_try(errors, f"{where} UUID", nvml.nvmlVgpuInstanceGetUUID, instance) or "")
    vm = _try(errors, f"{where} VM", nvml.nvmlVgpuInstanceGetVmID, instance)
    number = _try(errors, f"{where} type", nvml.nvmlVgpuInstanceGetType, instance)
    licence = _try(errors, f"{where} licence", nvml.nvmlVgpuInstanceGetLicenseInfo_v2, instance)
    framebuffer = _try(errors, f"{where} framebuffer", _framebuffer, nvml, instance)
    instance_uuid = ""
    if vm is not None and vm[1] == getattr(nvml, "NVML_VGPU_VM_ID_UUID", 1):
        instance_uuid = _text(vm[0]).lower()
    return Vgpu(gpu=address, instance=int(_key(instance)), uuid=uuid, instance_uuid=instance_uuid,
                type_id=f"nvidia-{number}" if number is not None else "",
                licensed=bool(licence.isLicensed) if licence is not None else None,
                license_state=int(licence.currentState) if licence is not None else None,
                framebuffer_bytes=framebuffer, utilization=usage)


def _framebuffer(nvml: Any, instance: Any) -> int:
    """``nvmlVgpuInstanceGetFbUsage`` into the 64-bit buffer nvml.h declares (module doc)."""
    used = ctypes.c_ulonglong(0)
    function = nvml._nvmlGetFunctionPointer("nvmlVgpuInstanceGetFbUsage")
    nvml._nvmlCheckReturn(function(instance, ctypes.byref(used)))
    return int(used.value)


def _utilization(nvml: Any, handle: Any, address: str,
                 errors: List[str]) -> Dict[Any, Tuple[Tuple[str, float], ...]]:
    """Each vGPU's latest utilisation sample on one GPU, by instance; {} when none can be read."""
    samples = None
    for name in ("nvmlDeviceGetVgpuInstancesUtilizationInfo", "nvmlDeviceGetVgpuUtilization"):
        function = getattr(nvml, name, None)
        if function is None:
            continue
        try:
            samples = function(handle, 0)
            break
        except nvml.NVMLError as error:
            if _code(error) not in (3, 13):  # NOT_SUPPORTED, FUNCTION_NOT_FOUND: the older one
                errors.append(f"GPU {address}: vGPU utilisation: {error}")
                return {}
    out: Dict[Any, Tuple[int, Tuple[Tuple[str, float], ...]]] = {}
    for sample in samples or ():
        figures = tuple((engine, min(1.0, max(0.0, getattr(sample, field).uiVal / 100)))
                        for engine, field in ENGINES)
        key, stamp = _key(sample.vgpuInstance), int(getattr(sample, "timeStamp", 0))
        if key not in out or stamp >= out[key][0]:
            out[key] = (stamp, figures)
    return {key: figures for key, (_, figures) in out.items()}


def _key(instance: Any) -> Any:
    """A vGPU instance as a dict key (a ctypes c_uint compares by identity: its value)."""
    return getattr(instance, "value", instance)


def bus_address(bus_id: Any) -> str:
    """NVML's ``00000000:81:00.0`` (bytes or text) as sysfs writes it: ``0000:81:00.0``."""
    text = _text(bus_id).strip().lower()
    domain, _, rest = text.partition(":")
    try:
        return f"{int(domain, 16):04x}:{rest}"
    except ValueError:
        return text


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _code(error: Exception) -> Optional[int]:
    return getattr(error, "value", None)


def _try(errors: List[str], what: str, function, *args):
    """``function(*args)``, or None with what failed added to ``errors``."""
    try:
        return function(*args)
    except Exception as error:  # pynvml raises its own classes, one per NVML code
        errors.append(f"{what}: {error}")
        return None


# -- vGPU migration metadata: what NVIDIA's own verdict on a destination needs ------------------
#
# nvmlDeviceGetVgpuMetadata (a physical GPU's, c_nvmlVgpuPgpuMetadata_t), nvmlVgpuInstanceGetMetadata
# (a running vGPU's, c_nvmlVgpuMetadata_t) and nvmlGetVgpuCompatibility (the two against each
# other: live, cold or none, and what limits it). A structure travels as base64 of its bytes,
# read back only when it is exactly the size this module's pynvml defines.

# NVML's verdict is the states a VM may resume on the GPU from (nvml.h: COLD 0x1, HIBERNATE 0x2,
# SLEEP 0x4, LIVE 0x8); only LIVE decides anything (a cold move re-creates the vGPU): the rest
# is "none", not live.
VERDICT_LIVE, VERDICT_NONE = "live", "none"
_LIVE = 0x8  # NVML_VGPU_VM_COMPATIBILITY_LIVE


def once(read, module: Any = None) -> Any:
    """``read(pynvml)`` between nvmlInit and nvmlShutdown; None where NVML or the call fails.

    For a hook or an action: NVML is held only for the call.
    """
    nvml = module if module is not None else Session()._load()
    if nvml is None:
        return None
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError):
        return None
    try:
        return read(nvml)
    except nvml.NVMLError:
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def gpu_metadata(nvml: Any) -> Dict[str, str]:
    """Per GPU address, its vGPU migration metadata (nvmlDeviceGetVgpuMetadata), encoded."""
    out: Dict[str, str] = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        address = bus_address(nvml.nvmlDeviceGetPciInfo(handle).busId)
        try:
            out[address] = _encode(nvml.nvmlDeviceGetVgpuMetadata(handle))
        except nvml.NVMLError:
            continue  # not a vGPU-capable GPU, or a driver without the call
    return out


def vgpu_metadata(nvml: Any) -> Dict[str, str]:
    """Per VM UUID (Nova's instance), its running vGPU's metadata, encoded (the first vGPU)."""
    out: Dict[str, str] = {}
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        for instance in nvml.nvmlDeviceGetActiveVgpus(handle) or ():
            try:
                vm = nvml.nvmlVgpuInstanceGetVmID(instance)
                if vm[1] != getattr(nvml, "NVML_VGPU_VM_ID_UUID", 1):
                    continue
                out.setdefault(_text(vm[0]).lower(),
                               _encode(nvml.nvmlVgpuInstanceGetMetadata(instance)))
            except nvml.NVMLError:
                continue
    return out


def compatibility(nvml: Any, vgpu: str, gpu: str) -> Optional[str]:
    """NVIDIA's verdict on a running vGPU (encoded metadata) on a GPU: live, none (not live), or None."""
    import base64
    import binascii

    try:
        vgpu_raw = base64.b64decode(vgpu, validate=True)
        gpu_raw = base64.b64decode(gpu, validate=True)
    except (binascii.Error, ValueError):
        return None
    vgpu_type, gpu_type = nvml.c_nvmlVgpuMetadata_t, nvml.c_nvmlVgpuPgpuMetadata_t
    if len(vgpu_raw) != ctypes.sizeof(vgpu_type) or len(gpu_raw) != ctypes.sizeof(gpu_type):
        return None  # another pynvml's structure, or not one at all
    try:
        answer = nvml.nvmlGetVgpuCompatibility(vgpu_type.from_buffer_copy(vgpu_raw),
                                               gpu_type.from_buffer_copy(gpu_raw))
    except nvml.NVMLError:
        return None
    return VERDICT_LIVE if int(answer.vgpuVmCompatibility) & _LIVE else VERDICT_NONE


def _encode(structure: Any) -> str:
    import base64

    return base64.b64encode(bytes(structure)).decode("ascii")


if __name__ == "__main__":
    main()
