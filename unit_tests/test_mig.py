"""MIG geometry, counts, placements and MIG mode through the stand-in nvidia-smi."""

import pytest

from unit_tests.fakehost import h200_sxm_host, rtx_pro_6000_host
from vgpu import mig, pci
from vgpu.errors import MigError

H200_GPU = pci.Gpu("0000:18:00.0", "0x2335", "H200 SXM 141GB", "nvidia", "0x030200")
RTX_GPU = pci.Gpu("0000:42:00.0", "0x2bb5", "RTX PRO 6000", "nvidia", "0x030200")


def profile(name):
    return pci.profile(name)


@pytest.mark.parametrize("name, fits, gi", [
    # NVIDIA's Hopper vGPU table: H200X-1-18C 7, -1-35C 4, -2-35C 3, -3-71C 2, -4-71C 1, -7-141C 1.
    ("H200X-1-18C", 7, "1g.18gb"), ("H200X-1-35C", 4, "1g.35gb"), ("H200X-2-35C", 3, "2g.35gb"),
    ("H200X-3-71C", 2, "3g.71gb"), ("H200X-4-71C", 1, "4g.71gb"), ("H200X-7-141C", 1, "7g.141gb"),
    ("H200X-1-18CME", 1, "1g.18gb+me"),
])
def test_h200_counts_come_from_the_profile_and_its_gpu_instance(name, fits, gi):
    found = mig.slot(mig.H200, profile(name))
    assert (found.fits, found.instance.name) == (fits, gi)
    assert mig.fits(H200_GPU, profile(name)) == fits


@pytest.mark.parametrize("name, fits, per", [
    ("DC-1-24Q", 4, 1), ("DC-1-8Q", 12, 3), ("DC-1-2Q", 48, 12),  # cubecos PR 1223: 48 DC-1-2Q
    ("DC-2-48Q", 2, 1), ("DC-2-12Q", 8, 4), ("DC-4-96Q", 1, 1), ("DC-4-24Q", 4, 4),
])
def test_rtx_pro_6000_counts(name, fits, per):
    found = mig.slot(mig.RTX_PRO_6000, profile(f"NVIDIA RTX Pro 6000 Blackwell {name}"))
    assert (found.fits, found.per_instance) == (fits, per)


def test_no_gpu_instance_or_no_table_gives_no_count():
    assert mig.slot(mig.H200, profile("H200X-5-71C")) is None  # no 5g profile
    assert mig.slot(mig.H200, profile("H200X-1-72C")) is None  # more memory than a 1g holds
    assert mig.slot(mig.H200, profile("H200X-18C")) is None  # time-sliced
    assert mig.fits(H200_GPU._replace(device_id="0x20f1"), profile("A100-1-5C")) is None


def test_addresses_in_both_spellings():
    assert mig.smi_address("0001:c8:00.0") == "00000001:C8:00.0"
    assert mig.sysfs_address("00000001:C8:00.0") == "0001:c8:00.0"
    assert mig.enable_command("0000:42:00.0") == "nvidia-smi -i 00000000:42:00.0 -mig 1"
    assert mig.parse_modes("00000000:42:00.0, Enabled, Enabled\n00000000:8C:00.0, [N/A], [N/A]\n"
                           "garbage\n") == {"0000:42:00.0": mig.Mode("Enabled", "Enabled"),
                                            "0000:8c:00.0": mig.Mode("[N/A]", "[N/A]")}


def test_modes_are_read_with_one_nvidia_smi_run(root, tools):
    rtx_pro_6000_host(root, vfs=2, gpus=2, mig="Disabled")
    modes = mig.modes(["0000:42:00.0", "0000:8c:00.0"])
    assert not modes["0000:42:00.0"].enabled
    assert [c for c in tools.calls() if c.startswith("nvidia-smi")] == [
        "nvidia-smi --query-gpu=pci.bus_id,mig.mode.current,mig.mode.pending --format=csv,noheader"]
    with pytest.raises(MigError, match="does not report the MIG mode of GPU 0001:04:00.0"):
        mig.modes(["0001:04:00.0"])


def test_modes_without_nvidia_smi_is_an_error(root, tools):
    h200_sxm_host(root, vfs=1)
    with pytest.raises(MigError, match="usr/bin/nvidia-smi not found"):
        mig.modes(["0000:18:00.0"])


def test_enable_turns_mig_mode_on_or_says_a_reset_is_needed(root, tools):
    host = rtx_pro_6000_host(root, vfs=1, gpus=3, mig="Disabled")
    done = mig.enable("0000:42:00.0")
    assert done.output == "Enabled MIG Mode for GPU 00000000:42:00.0\nAll done."
    assert not done.reset_needed and host.mig_mode("0000:42:00.0")["current"] == "Enabled"
    host.install_nvidia_smi({"0000:8c:00.0": "busy", "0001:04:00.0": "reset"})
    busy = mig.enable("0000:8c:00.0")
    assert busy.reset_needed and mig.pending_warning(busy.output)
    assert busy.mode == mig.Mode("Disabled", "Enabled") and busy.mode.awaiting_reset
    with pytest.raises(MigError, match="nvidia-smi -i 00000000:C8:00.0 -mig 1 failed: "
                                       "No devices were found"):
        mig.enable("0000:c8:00.0")


def test_gpu_instance_id_is_read_for_reports(root):
    host = h200_sxm_host(root, vfs=2, mig="Enabled")
    vf = "0000:18:00.4"
    assert mig.instance_id(vf) is None
    from vgpu import vfio
    vfio.assign(vf, 1414)  # H200X-1-18C
    assert mig.instance_id(vf) == "1"
    vfio.assign(vf, 0)
    assert mig.instance_id(vf) is None
    assert host.vfio_model("0000:18:00.0").mig.instances == {}


def test_mode_problems_count_what_cannot_be_read_as_out_of_mig_mode(root, tools):
    h200_sxm_host(root, vfs=1)  # no nvidia-smi
    assert mig.mode_problems({"0000:18:00.0": ["H200X-1-18C"]}, "gpu/0") == [
        "cannot tell whether GPU 0000:18:00.0 is in MIG mode, which MIG-backed profiles need: "
        "/usr/bin/nvidia-smi not found (is the vGPU host driver installed?); no VF changed"]
    assert mig.mode_problems({}, "gpu/0") == []
