"""Several vGPUs in one guest: how many of a type one instance may have, and the flavor for two.

Two judges must both agree:

* NVIDIA. Where the driver answers, NVML's ``nvmlVgpuTypeGetMaxInstancesPerVm``
  (the NVML API reference, "vGPU Management") says it per type. Else NVIDIA's
  rules (vGPU user guide, "Multiple vGPU Support"): a full-framebuffer type
  (one per GPU) may be combined, one vGPU per physical GPU; a fractional type
  only where the GPU says ``Fractional Multi-vGPU : Supported`` under
  ``vGPU Device Capability`` in ``nvidia-smi -q`` (vGPU 16 and later; NVML's
  ``NVML_DEVICE_VGPU_CAP_FRACTIONAL_MULTI_VGPU``). MIG-backed types of vGPU
  for Compute (series C): several, each on a GPU instance of its own (NVIDIA
  AI Enterprise 8.1, "Multi-vGPU": the devices "may be time-sliced or
  MIG-backed", of one board and one series, e.g. an ``A100-4-20C`` beside an
  ``A100-2-10C``; its support tables give "All NVIDIA vGPU for Compute" for the
  Hopper and Blackwell boards on KVM and Ubuntu,
  docs.nvidia.com/ai-enterprise/release-8/8.1/infra-software/vgpu/features/multi-vgpu.html).
  Other MIG-backed types (the RTX PRO 6000's Q, B and A series): one, unless
  NVML says more. Whatever cannot be read counts as one.
* Nova. VFIO vGPUs are PCI devices: a flavor asks for several through the
  alias count (``pci_passthrough:alias=<alias>:2``). Mediated-device vGPUs:
  Nova 33 (2026.1) and later honour several resource groups
  (``resources1:VGPU=1``, ``resources2:VGPU=1``, each from a distinct
  resource provider: Nova's doc/source/admin/virtual-gpu.rst, bug 1758086);
  before, one vGPU per instance.

No instance gets more than this host holds: the count is capped by the
functions the host gives the type (VFIO: VFs; mdev: resource providers, one
per GPU or, on SR-IOV GPUs, per VF).
"""

from __future__ import annotations

import logging
import re
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from . import hostroot, pci
from . import nvml as nvml_
from .record import NamedTuple

logger = logging.getLogger(__name__)

MDEV_GROUPS_MAJOR = 33  # Nova 2026.1 gazpacho: several resource groups of mdev vGPUs
FRACTIONAL = "Fractional Multi-vGPU"
NVIDIA_SMI = "usr/bin/nvidia-smi"
TIMEOUT = 30  # seconds for nvidia-smi -q
_GPU_LINE = re.compile(r"GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*\Z")
_CAPABILITY = "vGPU Device Capability"


class Multi(NamedTuple):
    """What says how many vGPUs of a type one instance may have on this host."""

    nova_major: Optional[int] = None  # this host's Nova (None: not installed)
    fractional: Mapping[str, bool] = {}  # GPU -> Fractional Multi-vGPU supported (nvidia-smi -q)
    per_vm: Mapping[int, int] = {}  # type number -> NVML's nvmlVgpuTypeGetMaxInstancesPerVm
    nvml: str = ""  # why NVML did not answer ("": it did, or there is none)


def read(host: pci.Host, offered: Optional[Mapping[str, Tuple[pci.VgpuType, ...]]],
         release) -> Multi:
    """This host's answers: Nova's major, nvidia-smi -q's capability, NVML per type offered."""
    numbers = {t.number for gpu in host.gpus
               for t in (offered or {}).get(gpu.address) or gpu.offered_types()}
    if not numbers:
        return Multi(nova_major=release.nova_major if release is not None else None)
    answered, why = _per_vm(numbers)
    return Multi(nova_major=release.nova_major if release is not None else None,
                 fractional=read_fractional(), per_vm=answered, nvml=why)


def most_per_instance(framework: Optional[str], *, full: bool, mig: bool,
                      fractional: Optional[bool], per_vm: Optional[int],
                      nova_major: Optional[int], gpus: int, functions: int,
                      compute: bool = False) -> int:
    """How many vGPUs of one type one instance may have on this host (at least 1).

    ``full``: the type fills its GPU (one per GPU); ``mig``: MIG-backed;
    ``compute``: of vGPU for Compute (series C);
    ``fractional``: the GPU's ``Fractional Multi-vGPU`` (None: unknown);
    ``per_vm``: NVML's answer (None: not asked or no answer); ``gpus``: the
    GPUs here offering the type; ``functions``: the vGPUs of it this host
    holds at most (VFs, or mdev resource providers).
    """
    if framework == pci.MDEV and (nova_major is None or nova_major < MDEV_GROUPS_MAJOR):
        return 1
    if per_vm is not None and per_vm > 0:
        wanted = per_vm
    elif mig:
        wanted = functions if compute else 1  # each vGPU on its own GPU instance
    elif full:
        wanted = gpus
    elif fractional:
        wanted = functions
    else:
        wanted = 1
    return max(1, min(wanted, functions))


def flavor_for(framework: Optional[str], one: str, count: int) -> str:
    """The flavor properties that ask for ``count`` vGPUs, from the one that asks for one.

    VFIO: the alias count (``pci_passthrough:alias=vgpu-l40s-12q:2``); mdev:
    one resource group per vGPU (``resources1:VGPU=1 resources2:VGPU=1``)
    with ``group_policy=isolate``, so that Placement takes each from a
    distinct resource provider (Nova's virtual-gpu.rst), as NVIDIA's rule
    for full-framebuffer types wants (one per GPU).
    """
    if framework == pci.VFIO:
        return one.rsplit(":", 1)[0] + f":{count}"
    resource = one.split(":", 1)[1]
    groups = [f"resources{n}:{resource}" for n in range(1, count + 1)]
    return " ".join(groups + ["group_policy=isolate"])


def capabilities(text: str) -> Dict[str, Dict[str, str]]:
    """``nvidia-smi -q``'s ``vGPU Device Capability`` lines per GPU: {sysfs address: {name: value}}."""
    out: Dict[str, Dict[str, str]] = {}
    gpu: Optional[str] = None
    depth: Optional[int]  # the capability block's indent while in one: set at each GPU's line
    for line in text.splitlines()[:100000]:
        stripped = line.strip()
        match = _GPU_LINE.fullmatch(line)  # at the line's start: an indented one is a field
        if match:
            gpu = nvml_.bus_address(match.group(1))
            depth = None
            continue
        indent = len(line) - len(line.lstrip())
        if stripped == _CAPABILITY and gpu is not None:
            depth = indent
            out.setdefault(gpu, {})
            continue
        if gpu is not None and depth is not None:
            if indent <= depth or ":" not in stripped:
                depth = None
                continue
            name, value = (part.strip() for part in stripped.split(":", 1))
            out[gpu][name[:64]] = value[:64]
    return out


def fractional_support(text: str) -> Dict[str, bool]:
    """{GPU address: whether it says ``Fractional Multi-vGPU : Supported``}."""
    return {gpu: said.get(FRACTIONAL) == "Supported" for gpu, said in capabilities(text).items()}


def read_fractional() -> Dict[str, bool]:
    """What ``nvidia-smi -q`` says of each GPU's fractional multi-vGPU; {} when it cannot be run."""
    from . import run
    from .errors import CommandError

    tool = hostroot.path(NVIDIA_SMI)
    if not tool.exists():
        return {}
    try:
        result = run.run([str(tool), "-q"], TIMEOUT, check=True, what="nvidia-smi -q")
    except CommandError as error:
        logger.warning("%s", error)
        return {}
    return fractional_support(result.stdout)


def per_vm(type_numbers: Iterable[int], module: Any = None) -> Dict[int, int]:
    """NVML's ``nvmlVgpuTypeGetMaxInstancesPerVm`` per type; {} where NVML cannot be asked.

    Asked in the bounded child (``python -m vgpu.nvml per-vm``): a hung driver costs the
    action at most its bound, and then NVIDIA's rules decide (logged). ``module``: a pynvml
    stand-in asked in this process instead (the tests).
    """
    numbers = sorted(set(type_numbers))
    if module is not None:
        return nvml_.once(lambda nvml: nvml_.max_per_vm(nvml, numbers), module) or {}
    return _per_vm(numbers)[0]


def _per_vm(numbers: Iterable[int]) -> Tuple[Dict[int, int], str]:
    """:func:`per_vm` through the bounded child, and why NVML did not answer ("": it did)."""
    try:
        said = nvml_.ask("per-vm", sorted(set(numbers)))
    except nvml_.UnansweredError as error:
        logger.warning("%s: how many vGPUs one instance may have follows NVIDIA's rules", error)
        return {}, str(error)
    out: Dict[int, int] = {}
    for key, value in (said.items() if isinstance(said, dict) else ()):
        if isinstance(key, str) and key.isdigit() and isinstance(value, int):
            out[int(key)] = value
    return out, ""
