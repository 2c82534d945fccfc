"""Several vGPUs in one guest: NVIDIA's and Nova's rules, NVML's answer, nvidia-smi -q (issue 37)."""

import pytest

from unit_tests.fake_pynvml import pynvml as fake_nvml
from vgpu import multivgpu, pci

# nvidia-smi -q on a Proxmox VE host (Tesla P40, driver 535.129.03), from the public code
# index: the capability block as the driver prints it, fractional multi-vGPU not supported.
P40 = """==============NVSMI LOG==============

Driver Version                            : 535.129.03
CUDA Version                              : Not Found
vGPU Driver Capability
        Heterogenous Multi-vGPU           : Supported

Attached GPUs                             : 1
GPU 00000000:83:00.0
    Product Name                          : Tesla P40
    Persistence Mode                      : Disabled
    Addressing Mode                       : N/A
    vGPU Device Capability
        Fractional Multi-vGPU             : Not Supported
        Heterogeneous Time-Slice Profiles : Supported
        Heterogeneous Time-Slice Sizes    : Not Supported
    MIG Mode
        Current                           : N/A
"""
# akb486/vgpu README.md (an Ada Lovelace GPU, driver 525.147.01): supported.
ADA = """vGPU Driver Capability
        Heterogenous Multi-vGPU           : Supported

Attached GPUs                             : 1
GPU 00000000:01:00.0
    Product Name                          : NVIDIA GeForce RTX 4088
    Persistence Mode                      : Enabled
    vGPU Device Capability
        Fractional Multi-vGPU             : Supported
        Heterogeneous Time-Slice Profiles : Supported
        Heterogeneous Time-Slice Sizes    : Not Supported
    MIG Mode
        Current                           : N/A
"""


def test_the_capability_lines_are_read_per_gpu_from_real_output():
    assert multivgpu.capabilities(P40) == {"0000:83:00.0": {
        "Fractional Multi-vGPU": "Not Supported", "Heterogeneous Time-Slice Profiles": "Supported",
        "Heterogeneous Time-Slice Sizes": "Not Supported"}}
    assert multivgpu.fractional_support(P40 + ADA.split("Attached GPUs", 1)[1]) == {
        "0000:83:00.0": False, "0000:01:00.0": True}
    # The driver-wide "Heterogenous Multi-vGPU" line is no GPU's capability.
    driver_wide = "vGPU Driver Capability\n  Heterogenous Multi-vGPU : Supported\n"
    assert multivgpu.fractional_support(driver_wide) == {}


def test_only_a_gpu_s_own_unindented_line_starts_its_capabilities():
    """nvidia-smi -q names each GPU at the line's start; above the first, no GPU is named."""
    orphan = "    vGPU Device Capability\n        Fractional Multi-vGPU : Supported\n"
    assert multivgpu.capabilities(orphan + P40) == multivgpu.capabilities(P40)
    assert list(multivgpu.capabilities(orphan)) == []
    # A line that reads like a GPU's, indented, is a field of the GPU above it.
    field = P40.replace("    MIG Mode\n", "    GPU 00000000:84:00.0\n    vGPU Device Capability\n"
                                          "        Fractional Multi-vGPU : Supported\n")
    assert multivgpu.fractional_support(field) == {"0000:83:00.0": True}


def test_a_capability_block_ends_at_its_gpu_s_next_field():
    """The block is the lines indented below its heading; the GPU's next field is not in it."""
    sibling = P40.replace("    MIG Mode\n", "    Accounting Mode                       : Disabled\n")
    assert multivgpu.capabilities(sibling) == multivgpu.capabilities(P40)


def test_a_capability_is_split_at_its_first_colon_and_bounded():
    """Host text is data: a value holding colons is kept whole, a name and a value cut at 64."""
    name = "Heterogeneous Time-Slice Profiles " * 3  # 102 characters
    value = "Supported: placements 0:8, 8:16 " * 3
    text = P40.replace("    MIG Mode\n", f"        {name}: {value}\n    MIG Mode\n")
    said = multivgpu.capabilities(text)["0000:83:00.0"]
    assert said[name.strip()[:64]] == value.strip()[:64]
    assert len(said) == 4 and all(len(k) <= 64 and len(v) <= 64 for k, v in said.items())


def test_nvidia_smi_is_read_up_to_its_first_100_000_lines():
    """A capability on line 100,001 is past the bound: its GPU's block is read, the line not."""
    block = ["GPU 00000000:83:00.0", "    vGPU Device Capability",
             "        Fractional Multi-vGPU             : Supported"]
    at_the_bound = "\n".join([""] * (100_000 - 2) + block) + "\n"  # the line: 100,001
    assert multivgpu.capabilities(at_the_bound) == {"0000:83:00.0": {}}
    within = "\n".join([""] * (100_000 - 3) + block) + "\n"  # the line: 100,000
    assert multivgpu.capabilities(within) == {"0000:83:00.0": {"Fractional Multi-vGPU": "Supported"}}


@pytest.mark.parametrize("framework,major,kw,expected", [
    # Nova before 33 takes one mdev vGPU per instance, whatever NVIDIA allows.
    (pci.MDEV, 32, {"full": True}, 1),
    (pci.MDEV, 33, {"full": True}, 2),                  # one per GPU, each its own provider
    (pci.VFIO, 31, {"full": True}, 2),
    (pci.VFIO, 31, {"fractional": True}, 8),            # what the GPU says allows any count here
    (pci.VFIO, 31, {"fractional": False}, 1),
    (pci.VFIO, 31, {"fractional": None}, 1),            # unknown counts as not supported
    (pci.VFIO, 31, {"fractional": True, "mig": True}, 1),  # a MIG-backed Q, B or A type: one
    # NVIDIA AI Enterprise 8.1, "Multi-vGPU": vGPU for Compute's MIG-backed types, several
    # (each on a GPU instance of its own), capped by what this host holds.
    (pci.VFIO, 31, {"mig": True, "compute": True}, 8),
    (pci.VFIO, 31, {"mig": True, "compute": True, "per_vm": 2}, 2),  # NVML's answer first
    (pci.VFIO, 31, {"per_vm": 4}, 4),                   # NVML's answer first
    (pci.VFIO, 31, {"per_vm": 64}, 8),                  # never more than this host holds
])
def test_most_per_instance_follows_nvidia_then_nova(framework, major, kw, expected):
    args = {"full": False, "mig": False, "fractional": None, "per_vm": None, **kw}
    assert multivgpu.most_per_instance(framework, nova_major=major, gpus=2, functions=8,
                                       **args) == expected


def test_the_flavor_for_two_per_framework():
    assert multivgpu.flavor_for(pci.VFIO, "pci_passthrough:alias=vgpu-l40s-48q:1", 2) == \
        "pci_passthrough:alias=vgpu-l40s-48q:2"
    assert multivgpu.flavor_for(pci.MDEV, "resources:VGPU=1", 2) == \
        "resources1:VGPU=1 resources2:VGPU=1 group_policy=isolate"


def test_nvml_per_vm_where_the_driver_answers():
    fake_nvml.configure({"driver": "570.158.02", "per_vm": {"1155": 2}})
    assert multivgpu.per_vm([1155, 1139], module=fake_nvml) == {1155: 2}
    fake_nvml.configure({"driver": None})
    assert multivgpu.per_vm([1155], module=fake_nvml) == {}


def test_the_stand_in_nvidia_smi_prints_what_the_charm_reads(root, tools):
    from unit_tests.fakehost import l40s_host

    host = l40s_host(root)
    host.install_nvidia_smi({"0000:81:00.0": "Disabled", "0000:c1:00.0": "Disabled"})
    host.set_mig("0000:81:00.0", fractional="Supported")
    assert multivgpu.read_fractional() == {"0000:81:00.0": True, "0000:c1:00.0": False}
