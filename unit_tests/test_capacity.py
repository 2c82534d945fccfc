"""vGPUs per GPU and type: how many fit, how many guests hold, how many a new guest could get.

One computation (vgpu.capacity.count) answers list-vgpu-types' max and available
instances, the status line's used and free, and the exporter's
nvidia_vgpu_type_* metrics; vgpu-usage lists the vGPUs it counts as used.
"""

from unit_tests.fakehost import L40S_TYPES, assign_vfio_type, l40s_host
from unit_tests.libvirt import running_guest
from vgpu import capacity, pci, report, usage

L40S = "0000:81:00.0"
L40S_VFS = ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6", "0000:81:00.7")
VM_1 = "11111111-1111-4111-8111-111111111111"
CLASS = "CUSTOM_VGPU_L40S_12Q"


def full_l40s_12q(root):
    """An L40S mapped with L40S-12Q: four VFs hold it (the GPU is full), a guest holds one."""
    host = l40s_host(root)
    for address in L40S_VFS:
        assign_vfio_type(host, address, 1139)
    running_guest(root, "instance-00000040", VM_1, pci_address=L40S_VFS[1])
    return host


def test_vfio_vfs_that_hold_the_type_and_are_free_are_available(root):
    """The issue's host: list-vgpu-types said 0 available while the status said 3 free."""
    full_l40s_12q(root)
    found = pci.with_available(pci.discover())
    offered = {L40S: tuple(pci.VgpuType(n, name, pci.VFIO) for n, name in sorted(L40S_TYPES.items()))}
    entry = report.gpu_results(found, offered, whole_gb={L40S: 48})["gpu-0"]["types"]["nvidia-1139"]
    assert (entry["max-instances"], entry["available-instances"]) == ("4", "3")
    assert capacity.capacity(found, {CLASS: L40S_VFS}) == [capacity.Capacity(CLASS, 1, 3)]
    used = [u for u in usage.in_use(found) if (u.gpu, u.type_id) == (L40S, "nvidia-1139")]
    assert len(used) == 1
