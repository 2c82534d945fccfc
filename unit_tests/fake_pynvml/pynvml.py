"""A stand-in for nvidia-ml-py's ``pynvml`` on a vGPU host, for the exporter's tests.

It answers the calls vgpu.nvml makes with what NVML answers on a hypervisor
(NVML API reference, "vGPU Management" and "vGPU APIs"; nvidia-ml-py 13.615's
wrappers for the shapes: ``nvmlDeviceGetPciInfo`` returns a structure whose
``busId`` is bytes such as ``b"00000000:81:00.0"``, ``nvmlVgpuInstanceGetVmID``
a ``(vm id, NVML_VGPU_VM_ID_*)`` pair, ``nvmlVgpuInstanceGetLicenseInfo_v2`` a
structure with ``isLicensed`` and ``currentState``, utilisation samples with
``smUtil.uiVal`` ...; ``nvmlVgpuInstanceGetFbUsage`` writes an unsigned long
long, as nvml.h declares it). unit_tests/test_nvml.py checks that every name
here is one the real module has.

What the host holds comes from :func:`configure`, or from the JSON file
``FAKE_NVML`` names when the exporter or the bounded child (``python -m vgpu.nvml``) runs as
its own process (each call is then also appended to ``<FAKE_NVML>.calls``)::

    {"driver": "570.158.02",            # null: no driver (libnvidia-ml missing)
     # per GPU also "vgpu_types": [{"id": 2033, "name": "...", "gi_profile": 47}] (no
     # gi_profile: not MIG-backed) and "gi_profiles": {"47": "MIG 1g.24gb+gfx"}
     "fail": {"nvmlVgpuInstanceGetLicenseInfo_v2": 3},   # calls that fail, NVML code
     "hang": ["nvmlInit"],              # calls that never return (a wedged driver)
     # (a vGPU's own "fail" fails a call for that vGPU alone: NVML answers per instance)
     "per_vm": {"1155": 4},             # nvmlVgpuTypeGetMaxInstancesPerVm per type id
     "gpus": [{"bus_id": "00000000:81:00.0",   # "lost": true: fallen off the bus
               "vgpus": [{"id": 7, "uuid": "...", "vm": "<instance uuid>", "type": 1139,
                          "licensed": 1, "state": 5, "fb": 2147483648,
                          "util": {"sm": 35, "memory": 20, "encoder": 0, "decoder": 0},
                          "metadata": "0x2335/141"}],      # the vGPU's board, for its metadata
               "metadata": "0x2335/141"}]}              # the GPU's board; absent: NOT_SUPPORTED

A GPU that fell off the bus (``"lost": true``) answers ``NVML_ERROR_GPU_IS_LOST`` ("GPU is
lost") to ``nvmlDeviceGetHandleByIndex`` and ``nvmlDeviceGetHandleByPciBusId``, as NVML's
reference says of both ("if the target GPU has fallen off the bus or is otherwise
inaccessible"), and nvidia-smi shows it ("Unable to determine the device handle for GPU
0000:b3:00.0: GPU is lost. Reboot the system to recover this GPU"); with
``"lost": "after_handle"`` it fell while NVML was initialised: its handle is still given and
every call on it answers the same error, its PCI information included.

vGPU migration (NVML API reference, "vGPU Migration"): ``nvmlDeviceGetVgpuMetadata``
and ``nvmlVgpuInstanceGetMetadata`` return structures named and shaped as
nvidia-ml-py's (version, revision, host driver version, opaque data), whose
opaque data here is the board; ``nvmlGetVgpuCompatibility`` answers live and
cold for the same host driver and board, else none with the limit NVIDIA
gives (host driver, or GPU), as NVIDIA's live-migration pages describe it.
"""

import ctypes
import json
import os

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_UNKNOWN = 999
NVML_VGPU_VM_ID_DOMAIN_ID = 0
NVML_VGPU_VM_ID_UUID = 1
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80
NVML_VGPU_METADATA_OPAQUE_DATA_SIZE = ctypes.sizeof(ctypes.c_uint) + 256
NVML_VGPU_PGPU_METADATA_OPAQUE_DATA_SIZE = 256
NVML_VGPU_VM_COMPATIBILITY_NONE = 0x0
NVML_VGPU_VM_COMPATIBILITY_COLD = 0x1
NVML_VGPU_VM_COMPATIBILITY_LIVE = 0x8
NVML_VGPU_COMPATIBILITY_LIMIT_NONE = 0x0
NVML_VGPU_COMPATIBILITY_LIMIT_HOST_DRIVER = 0x1
NVML_VGPU_COMPATIBILITY_LIMIT_GPU = 0x4

_STATE = {"state": None, "initialised": 0, "calls": []}


class NVMLError(Exception):
    """As pynvml's: ``value`` is NVML's return code."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {1: "Uninitialized", 3: "Not Supported", 6: "Not Found", 9: "Driver Not Loaded",
                12: "NVML Shared Library Not Found", 13: "Function Not Found",
                15: "GPU is lost"}.get(
                    self.value, "Unknown Error")


class _Value:
    def __init__(self, value):
        self.uiVal = value


class _Struct:
    def __init__(self, **fields):
        self.__dict__.update(fields)


def configure(state):
    """The host NVML describes from now on (None: read FAKE_NVML at nvmlInit)."""
    _STATE.update(state=state, initialised=0, calls=[])


def calls():
    """The calls made since configure(), by name."""
    return list(_STATE["calls"])


def _host():
    if _STATE["state"] is None and os.environ.get("FAKE_NVML"):
        # Read again when the file changed (a test rewrites it): NVML answers from memory.
        path = os.environ["FAKE_NVML"]
        stamp = os.stat(path).st_mtime_ns
        if _STATE.get("read") != (path, stamp):
            with open(path, encoding="utf-8") as handle:
                _STATE.update(read=(path, stamp), file=json.load(handle))
        return _STATE["file"]
    return _STATE["state"] or {}


def _call(name):
    _STATE["calls"].append(name)
    host = _host()
    if _STATE["state"] is None and os.environ.get("FAKE_NVML"):  # another process may ask
        with open(os.environ["FAKE_NVML"] + ".calls", "a", encoding="utf-8") as log:
            log.write(name + "\n")
    if name in host.get("hang", ()):  # a wedged driver: the call never returns
        import time

        time.sleep(3600)
    code = host.get("fail", {}).get(name)
    if code is not None:
        raise NVMLError(code)
    if name != "nvmlInit" and not _STATE["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return host


def _vgpu(instance, name=None):
    number = getattr(instance, "value", instance)
    for gpu in _host().get("gpus", []):
        for vgpu in gpu.get("vgpus", []):
            if vgpu["id"] == number:
                code = vgpu.get("fail", {}).get(name)
                if code is not None:
                    raise NVMLError(code)
                return vgpu
    raise NVMLError(NVML_ERROR_UNKNOWN)


def nvmlInit():
    host = _call("nvmlInit")
    if host.get("driver") is None:
        raise NVMLError(NVML_ERROR_LIBRARY_NOT_FOUND)
    _STATE["initialised"] += 1


def nvmlShutdown():
    _call("nvmlShutdown")
    _STATE["initialised"] = max(0, _STATE["initialised"] - 1)


def nvmlVgpuTypeGetMaxInstancesPerVm(vgpuTypeId):
    """The host's ``per_vm`` {type id: count}; a type it does not name: NVML_ERROR_NOT_SUPPORTED."""
    answer = _call("nvmlVgpuTypeGetMaxInstancesPerVm").get("per_vm", {}).get(str(vgpuTypeId))
    if answer is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return answer


def nvmlSystemGetDriverVersion():
    return _call("nvmlSystemGetDriverVersion")["driver"]


def nvmlDeviceGetCount():
    return len(_call("nvmlDeviceGetCount").get("gpus", []))


def _gpu(name, handle):
    gpu = _call(name)["gpus"][handle]
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


def nvmlDeviceGetHandleByIndex(index):
    gpu = _call("nvmlDeviceGetHandleByIndex")["gpus"][index]
    if gpu.get("lost") is True:
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return index


def nvmlDeviceGetHandleByPciBusId(pciBusId):
    def key(bus_id):
        domain, _, rest = str(bus_id).lower().partition(":")
        return int(domain, 16), rest

    for index, gpu in enumerate(_call("nvmlDeviceGetHandleByPciBusId")["gpus"]):
        if key(gpu["bus_id"]) == key(pciBusId):
            if gpu.get("lost"):
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            return index
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetPciInfo(handle):
    gpu = _gpu("nvmlDeviceGetPciInfo", handle)  # "after_handle": lost for this call too
    return _Struct(busId=gpu["bus_id"].encode("ascii"))


def nvmlDeviceGetActiveVgpus(handle):
    gpu = _gpu("nvmlDeviceGetActiveVgpus", handle)
    return [ctypes.c_uint(vgpu["id"]) for vgpu in gpu.get("vgpus", [])]


def nvmlVgpuInstanceGetUUID(instance):
    _call("nvmlVgpuInstanceGetUUID")
    return _vgpu(instance, "nvmlVgpuInstanceGetUUID")["uuid"]


def nvmlVgpuInstanceGetVmID(instance):
    _call("nvmlVgpuInstanceGetVmID")
    vgpu = _vgpu(instance, "nvmlVgpuInstanceGetVmID")
    return vgpu["vm"], vgpu.get("vm_type", NVML_VGPU_VM_ID_UUID)


def nvmlVgpuInstanceGetType(instance):
    _call("nvmlVgpuInstanceGetType")
    return _vgpu(instance)["type"]


def nvmlVgpuInstanceGetLicenseInfo_v2(instance):
    _call("nvmlVgpuInstanceGetLicenseInfo_v2")
    vgpu = _vgpu(instance)
    return _Struct(isLicensed=vgpu["licensed"], currentState=vgpu["state"])


# nvmlVgpuTypeGetGpuInstanceProfileId's answer for a type that is not MIG-backed
# (INVALID_GPU_INSTANCE_PROFILE_ID, NVML API reference, "vGPU Management").
_INVALID_PROFILE = 0xFFFFFFFF


def _vgpu_type(type_id):
    number = getattr(type_id, "value", type_id)
    for gpu in _host().get("gpus", []):
        for vgpu_type in gpu.get("vgpu_types", []):
            if vgpu_type["id"] == number:
                return vgpu_type
    raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)


def nvmlDeviceGetSupportedVgpus(handle):
    gpu = _call("nvmlDeviceGetSupportedVgpus")["gpus"][handle]
    return [ctypes.c_uint(t["id"]) for t in gpu.get("vgpu_types", [])]


def nvmlVgpuTypeGetName(vgpuTypeId):
    _call("nvmlVgpuTypeGetName")
    return _vgpu_type(vgpuTypeId)["name"]


def nvmlVgpuTypeGetGpuInstanceProfileId(vgpuTypeId):
    _call("nvmlVgpuTypeGetGpuInstanceProfileId")
    return _vgpu_type(vgpuTypeId).get("gi_profile", _INVALID_PROFILE)


def nvmlDeviceGetGpuInstanceProfileInfoById(device, profileId):
    """The profile's v2 information, ``name`` as bytes (a c_char array), e.g. b"MIG 1g.24gb+gfx"."""
    gpu = _call("nvmlDeviceGetGpuInstanceProfileInfoById")["gpus"][device]
    name = gpu.get("gi_profiles", {}).get(str(profileId))
    if name is None:
        raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
    return _Struct(id=profileId, name=name.encode("ascii"))


def _samples(name, handle):
    gpu = _call(name)["gpus"][handle]
    return [_Struct(vgpuInstance=ctypes.c_uint(v["id"]), timeStamp=1000,
                    smUtil=_Value(v["util"]["sm"]), memUtil=_Value(v["util"]["memory"]),
                    encUtil=_Value(v["util"]["encoder"]), decUtil=_Value(v["util"]["decoder"]))
            for v in gpu.get("vgpus", []) if "util" in v]


def nvmlDeviceGetVgpuInstancesUtilizationInfo(handle, timeStamp):
    if _host().get("old_utilization"):  # a driver before R550
        _STATE["calls"].append("nvmlDeviceGetVgpuInstancesUtilizationInfo")
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)
    return _samples("nvmlDeviceGetVgpuInstancesUtilizationInfo", handle)


def nvmlDeviceGetVgpuUtilization(handle, timeStamp):
    return _samples("nvmlDeviceGetVgpuUtilization", handle)


def _nvmlGetFunctionPointer(name):
    _call(name)
    if name != "nvmlVgpuInstanceGetFbUsage":
        raise NVMLError(NVML_ERROR_FUNCTION_NOT_FOUND)

    def function(instance, pointer):
        target = ctypes.cast(pointer, ctypes.POINTER(ctypes.c_ulonglong))
        target.contents.value = _vgpu(instance)["fb"]
        return NVML_SUCCESS

    return function


def _nvmlCheckReturn(ret):
    if ret != NVML_SUCCESS:
        raise NVMLError(ret)
    return ret


class c_nvmlVgpuMetadata_t(ctypes.Structure):  # noqa: N801 (pynvml's name)
    _fields_ = [("version", ctypes.c_uint), ("revision", ctypes.c_uint),
                ("hostDriverVersion", ctypes.c_char * NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE),
                ("opaqueDataSize", ctypes.c_uint),
                ("opaqueData", ctypes.c_char * NVML_VGPU_METADATA_OPAQUE_DATA_SIZE)]


class c_nvmlVgpuPgpuMetadata_t(ctypes.Structure):  # noqa: N801 (pynvml's name)
    _fields_ = [("version", ctypes.c_uint), ("revision", ctypes.c_uint),
                ("hostDriverVersion", ctypes.c_char * NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE),
                ("opaqueDataSize", ctypes.c_uint),
                ("opaqueData", ctypes.c_char * NVML_VGPU_PGPU_METADATA_OPAQUE_DATA_SIZE)]


class c_nvmlVgpuPgpuCompatibility_t(ctypes.Structure):  # noqa: N801 (pynvml's name)
    _fields_ = [("vgpuVmCompatibility", ctypes.c_uint),
                ("compatibilityLimitCode", ctypes.c_uint)]


def _metadata(structure, board):
    driver = _host()["driver"].encode("ascii")
    return structure(version=1, revision=1, hostDriverVersion=driver,
                     opaqueDataSize=len(board), opaqueData=board.encode("ascii"))


def nvmlDeviceGetVgpuMetadata(handle):
    gpu = _call("nvmlDeviceGetVgpuMetadata")["gpus"][handle]
    if "metadata" not in gpu:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _metadata(c_nvmlVgpuPgpuMetadata_t, gpu["metadata"])


def nvmlVgpuInstanceGetMetadata(vgpuInstance):
    _call("nvmlVgpuInstanceGetMetadata")
    vgpu = _vgpu(vgpuInstance)
    if "metadata" not in vgpu:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return _metadata(c_nvmlVgpuMetadata_t, vgpu["metadata"])


def nvmlGetVgpuCompatibility(vgpuMetadata, pgpuMetadata):
    _call("nvmlGetVgpuCompatibility")
    if vgpuMetadata.hostDriverVersion != pgpuMetadata.hostDriverVersion:
        return c_nvmlVgpuPgpuCompatibility_t(NVML_VGPU_VM_COMPATIBILITY_NONE,
                                             NVML_VGPU_COMPATIBILITY_LIMIT_HOST_DRIVER)
    if vgpuMetadata.opaqueData != pgpuMetadata.opaqueData:
        return c_nvmlVgpuPgpuCompatibility_t(NVML_VGPU_VM_COMPATIBILITY_NONE,
                                             NVML_VGPU_COMPATIBILITY_LIMIT_GPU)
    return c_nvmlVgpuPgpuCompatibility_t(
        NVML_VGPU_VM_COMPATIBILITY_LIVE | NVML_VGPU_VM_COMPATIBILITY_COLD,
        NVML_VGPU_COMPATIBILITY_LIMIT_NONE)
