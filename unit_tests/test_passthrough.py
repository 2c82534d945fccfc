"""Whole GPUs to vfio-pci: driver_override now, a udev rule for every boot, nvidia's unbind lock."""

import pytest

from unit_tests.fakehost import whole_and_vgpu_host
from vgpu import passthrough

H200 = "0000:c1:00.0"


def test_a_free_gpu_leaves_nvidia_for_vfio_pci(root):
    host = whole_and_vgpu_host(root, moved=False)
    lock = host.unbind_lock(H200)
    assert passthrough.take(H200, "nvidia") is None
    device = root / "sys/bus/pci/devices" / H200
    assert (device / "driver_override").read_text() == "vfio-pci"
    assert lock.read_text() == "1"  # sriov-manage's lock, taken before the unbind
    assert host.pci_writes() == [("sys/bus/pci/drivers/nvidia/unbind", H200),
                                 ("sys/bus/pci/drivers_probe", H200)]


def test_a_gpu_something_holds_stays_on_nvidia_with_its_override_set(root):
    host = whole_and_vgpu_host(root, moved=False)
    host.unbind_lock(H200, held=True)  # nvidia-persistenced, DCGM ...
    why = passthrough.take(H200, "nvidia")
    assert why is not None and "held through the nvidia driver" in why and "next boot" in why
    assert (root / "sys/bus/pci/devices" / H200 / "driver_override").read_text() == "vfio-pci"
    unbind = root / "sys/bus/pci/drivers/nvidia/unbind"
    assert not unbind.exists() or H200 not in unbind.read_text()  # never unbound under a client


def test_a_gpu_on_vfio_pci_is_left_as_it_is(root):
    whole_and_vgpu_host(root)
    assert passthrough.take(H200, "vfio-pci") is None
    assert not (root / "sys/bus/pci/drivers_probe").exists()


def test_the_udev_rule_names_each_whole_gpu_and_goes_with_the_last(root):
    whole_and_vgpu_host(root)
    assert passthrough.ensure_rules([H200])
    text = (root / passthrough.RULES).read_text()
    assert f'KERNEL=="{H200}", ATTR{{driver_override}}="vfio-pci"' in text
    assert passthrough.RULES.startswith("etc/udev/rules.d/70-")  # before 80-drivers.rules
    assert not passthrough.ensure_rules([H200])  # unchanged
    assert passthrough.ensure_rules([])
    assert not (root / passthrough.RULES).exists()


def test_at_boot_vfio_pci_is_loaded_before_nvidia_and_sets_each_whole_gpus_override(root):
    """Whatever loads nvidia first, vfio-pci loads before it, overrides set first.

    A udev event of another GPU or the initramfs may load nvidia: modprobe loads
    vfio-pci before it (softdep), and loading vfio-pci sets each whole GPU's
    driver_override first (install): nvidia's probe passes them by (pci-driver.c).
    """
    whole_and_vgpu_host(root)
    assert passthrough.ensure_rules([H200])
    conf = (root / passthrough.MODPROBE_CONF).read_text()
    lines = [line for line in conf.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "softdep nvidia pre: vfio-pci"
    assert lines[1].startswith("install vfio-pci ")
    assert f"/sys/bus/pci/devices/{H200}/driver_override" in lines[1]
    assert lines[1].endswith("/sbin/modprobe --ignore-install vfio-pci $CMDLINE_OPTS")
    assert passthrough.ensure_rules([])
    assert not (root / passthrough.MODPROBE_CONF).exists()


# -- a GPU no longer given whole: handed back from vfio-pci ---------------------------------

def test_a_gpu_no_longer_whole_leaves_vfio_pci_and_nvidia_takes_it(root):
    host = whole_and_vgpu_host(root)  # the H200 on vfio-pci, its driver_override set
    assert passthrough.give_back(H200, "vfio-pci") is None
    device = root / "sys/bus/pci/devices" / H200
    assert (device / "driver_override").read_text() == "\n"  # the kernel clears it on a newline
    assert host.pci_writes() == [("sys/bus/pci/drivers/vfio-pci/unbind", H200),
                                 ("sys/bus/pci/drivers_probe", H200)]
    assert passthrough.bound(H200) == "nvidia"  # read back: probed with no override, nvidia's


@pytest.mark.parametrize("override", ["vfio-pci\n", "(null)\n"])
def test_a_gpu_vfio_pci_does_not_hold_is_not_unbound_or_probed(root, override):
    """Held through nvidia when it was to go whole, the GPU kept nvidia and got the override."""
    whole_and_vgpu_host(root, moved=False)
    device = root / "sys/bus/pci/devices" / H200
    (device / "driver_override").write_text(override)
    assert passthrough.give_back(H200, "nvidia") is None
    assert (device / "driver_override").read_text() == (
        "\n" if override == "vfio-pci\n" else override)  # only vfio-pci's override is cleared
    assert not (root / "sys/bus/pci/drivers/vfio-pci/unbind").exists()
    assert not (root / "sys/bus/pci/drivers/nvidia/unbind").read_text()
    assert not (root / "sys/bus/pci/drivers_probe").exists()
    assert passthrough.bound(H200) == "nvidia"


def test_a_gpu_that_cannot_be_handed_back_says_why_and_stays(root):
    whole_and_vgpu_host(root)
    (root / "sys/bus/pci/drivers/vfio-pci/unbind").mkdir()  # a write the kernel refuses
    assert passthrough.give_back(H200, "vfio-pci") == (
        f"GPU {H200}: cannot hand it back from vfio-pci: Is a directory")
    assert not (root / "sys/bus/pci/drivers_probe").exists()
    assert passthrough.bound(H200) == "vfio-pci"


def test_only_the_vfs_of_a_gpu_published_whole_are_no_longer_kept_as_vanished(root):
    """The hook disabled them (sriov-manage -d) and publishes the GPU whole: not vanished."""
    from types import SimpleNamespace

    from vgpu import pci, whole

    whole_and_vgpu_host(root)  # the H200 on vfio-pci, no VFs; the L40S's VFs enabled
    host = pci.discover()
    gone = ["0000:c1:00.4", "0000:c1:00.5", "0000:42:00.4"]  # a GPU's VFs, one of no GPU here
    plan = SimpleNamespace(passthrough=(SimpleNamespace(address=H200),))
    assert whole.vanished_vfs(host, plan, gone) == ["0000:42:00.4"]
    assert whole.vanished_vfs(host, SimpleNamespace(passthrough=()), gone) == gone
