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
``FAKE_NVML`` names when the exporter runs as its own process::

    {"driver": "570.158.02",            # null: no driver (libnvidia-ml missing)
     "fail": {"nvmlVgpuInstanceGetLicenseInfo_v2": 3},   # calls that fail, NVML code
     "per_vm": {"1155": 4},             # nvmlVgpuTypeGetMaxInstancesPerVm per type id
     "gpus": [{"bus_id": "00000000:81:00.0",
               "vgpus": [{"id": 7, "uuid": "...", "vm": "<instance uuid>", "type": 1139,
                          "licensed": 1, "state": 5, "fb": 2147483648,
                          "util": {"sm": 35, "memory": 20, "encoder": 0, "decoder": 0}}]}]}
"""

import ctypes
import json
import os

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_UNKNOWN = 999
NVML_VGPU_VM_ID_DOMAIN_ID = 0
NVML_VGPU_VM_ID_UUID = 1

_STATE = {"state": None, "initialised": 0, "calls": []}


class NVMLError(Exception):
    """As pynvml's: ``value`` is NVML's return code."""

    def __init__(self, value):
        super().__init__(value)
        self.value = value

    def __str__(self):
        return {1: "Uninitialized", 3: "Not Supported", 9: "Driver Not Loaded",
                12: "NVML Shared Library Not Found", 13: "Function Not Found"}.get(
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
    code = host.get("fail", {}).get(name)
    if code is not None:
        raise NVMLError(code)
    if name != "nvmlInit" and not _STATE["initialised"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return host


def _vgpu(instance):
    number = getattr(instance, "value", instance)
    for gpu in _host().get("gpus", []):
        for vgpu in gpu.get("vgpus", []):
            if vgpu["id"] == number:
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


def nvmlDeviceGetHandleByIndex(index):
    _call("nvmlDeviceGetHandleByIndex")
    return index


def nvmlDeviceGetPciInfo(handle):
    gpu = _call("nvmlDeviceGetPciInfo")["gpus"][handle]
    return _Struct(busId=gpu["bus_id"].encode("ascii"))


def nvmlDeviceGetActiveVgpus(handle):
    gpu = _call("nvmlDeviceGetActiveVgpus")["gpus"][handle]
    return [ctypes.c_uint(vgpu["id"]) for vgpu in gpu.get("vgpus", [])]


def nvmlVgpuInstanceGetUUID(instance):
    _call("nvmlVgpuInstanceGetUUID")
    return _vgpu(instance)["uuid"]


def nvmlVgpuInstanceGetVmID(instance):
    _call("nvmlVgpuInstanceGetVmID")
    vgpu = _vgpu(instance)
    return vgpu["vm"], vgpu.get("vm_type", NVML_VGPU_VM_ID_UUID)


def nvmlVgpuInstanceGetType(instance):
    _call("nvmlVgpuInstanceGetType")
    return _vgpu(instance)["type"]


def nvmlVgpuInstanceGetLicenseInfo_v2(instance):
    _call("nvmlVgpuInstanceGetLicenseInfo_v2")
    vgpu = _vgpu(instance)
    return _Struct(isLicensed=vgpu["licensed"], currentState=vgpu["state"])


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
