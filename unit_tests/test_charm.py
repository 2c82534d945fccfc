"""The charm, event by event, with ops.testing on host trees shaped like real hosts.

Each test builds a host root (sysfs, dpkg database, /proc), runs one event
through the real charm and checks the unit status, what reached the host
(dpkg's answer, files, systemctl calls) and the relation data as
nova-compute reads it with charmhelpers.
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from ops import testing

from charm import NovaComputeNvidiaVgpuCharm
from unit_tests import debs, principal
from unit_tests.fakehost import FakeHost, MdevType, empty_host, v100_host
from unit_tests.libvirt import running_guest
from vgpu import kernel, novaconf

MGR = "nvidia-vgpu-mgr"
VGPUD = "nvidia-vgpud"
HOSTILE = '{"nvidia-108\\n[DEFAULT]\\ndebug": ["0000:c1:00.0"]}'


def relation(local=None, remote=None):
    return testing.SubordinateRelation(
        "nova-vgpu", remote_app_name="nova-compute",
        local_unit_data=dict(local or {}), remote_unit_data=dict(remote or {}))


def state(config=None, relations=None, resource=None, paused=False):
    kwargs = {
        "config": dict(config or {}),
        "relations": [relation()] if relations is None else relations,
    }
    if resource is not None:
        kwargs["resources"] = {testing.Resource(name="nvidia-vgpu-software", path=resource)}
    if paused:
        kwargs["stored_states"] = {testing.StoredState(
            owner_path="NovaComputeNvidiaVgpuCharm", name="_stored", content={"paused": True})}
    return testing.State(**kwargs)


def ours(out: testing.State) -> dict:
    """This unit's data in the nova-vgpu relation, without Juju's own keys."""
    rel = out.get_relations("nova-vgpu")[0]
    return {k: v for k, v in rel.local_unit_data.items() if not k.startswith(("egress", "ingress",
                                                                              "private"))}


def nova_conf(out: testing.State) -> str:
    """The nova.conf sections nova-compute renders from this unit's data."""
    return principal.render_nova_conf(principal.nova_context(ours(out)))


def install_driver(root, deb):
    """Put a driver on the host the way the charm does (its own install code)."""
    from vgpu import driver
    driver.install(driver.inspect_deb(deb))


# -- install --------------------------------------------------------------------

def test_install_puts_the_attached_driver_on_a_gpu_host(ctx, v100, root, tools, packages):
    out = ctx.run(ctx.on.install(), state(resource=packages["old"]))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    assert (root / "usr/lib/nvidia/sriov-manage").exists()
    assert kernel.blacklist_path().read_text().count("blacklist nouveau") == 1
    assert "update-initramfs -u" in tools.calls()
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), no vGPU type mapped: set vgpu-device-mappings")
    data = ours(out)
    # No service is listed: nova-compute's pause and upgrade would stop the daemon under guests.
    assert principal.services(data) == set()
    assert principal.release_packages(data).install == {"nvidia-vgpu-ubuntu-570"}
    assert principal.release_packages(data).purge == set()


def test_the_blacklist_written_and_removed_is_named_in_the_log(ctx, v100, root, packages):
    blacklist = "/etc/modprobe.d/nvidia-vgpu-blacklist-nouveau.conf"
    out = ctx.run(ctx.on.install(), state(resource=packages["old"]))
    ctx.run(ctx.on.update_status(), out)  # already there: nothing written, nothing said
    ctx.run(ctx.on.remove(), out)
    assert not kernel.blacklist_path().exists()
    said = [(line.level, line.message) for line in ctx.juju_log if "initramfs" in line.message]
    assert said == [("INFO", f"nouveau blacklisted in {blacklist}; initramfs refreshed"),
                    ("INFO", f"removed {blacklist}; initramfs refreshed")]


def test_after_install_a_reboot_is_asked_for_until_the_module_loads(ctx, v100, root, packages):
    v100.modules(["nouveau", "drm"])
    out = ctx.run(ctx.on.install(), state(resource=packages["old"]))
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith("reboot required: nouveau is loaded")
    v100.modules(["nvidia_vgpu_vfio", "nvidia"])
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status.name == "active"


def test_a_host_write_failure_blocks_instead_of_failing_the_hook(ctx, v100, root, packages):
    (root / "etc").mkdir(exist_ok=True)
    (root / "etc/modprobe.d").write_text("a file where a directory belongs")
    out = ctx.run(ctx.on.install(), state(resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(
        "blacklisting nouveau failed: cannot write /etc/modprobe.d/nvidia-vgpu-blacklist-nouveau.conf: "
        "Not a directory")


def test_a_linked_modprobe_directory_is_not_written_through(ctx, v100, root, packages):
    ssh = root / "etc/ssh"
    ssh.mkdir(parents=True)
    (root / "etc/modprobe.d").symlink_to(ssh)
    out = ctx.run(ctx.on.install(), state(resource=packages["old"]))
    assert list(ssh.iterdir()) == []
    assert out.unit_status == testing.BlockedStatus(
        "blacklisting nouveau failed: cannot write /etc/modprobe.d/nvidia-vgpu-blacklist-nouveau.conf: "
        f"/etc/modprobe.d is a symbolic link (to {ssh}); the charm never writes through a link")

def test_no_gpu_host_installs_nothing_and_says_so(ctx, root, tools, packages):
    empty_host(root)
    out = ctx.run(ctx.on.install(), state(resource=packages["old"],
                                          config={"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}))
    assert out.unit_status == testing.ActiveStatus("no NVIDIA GPU on this host: nothing to do")
    assert debs.dpkg_query(root) == ""
    assert not kernel.blacklist_path().exists()
    assert tools.calls() == []
    assert principal.nova_context(ours(out)) == {}


def test_force_install_switch_installs_without_gpus(ctx, root, tools, packages):
    empty_host(root)
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    out = ctx.run(ctx.on.install(), state(resource=packages["old"],
                                          config={"force-install-nvidia-vgpu": True}))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    # The stand-in host has no vGPU module loaded: the forced install asks for a reboot.
    assert out.unit_status == testing.BlockedStatus("reboot required: nvidia_vgpu_vfio is not loaded")


def test_secure_boot_keeping_the_module_out_is_said_instead_of_waiting_for_a_reboot(
        ctx, root, tools, packages):
    from unit_tests.fakehost import v100_host
    from unit_tests.test_kernel import efi, fake_journal, fake_mokutil

    v100_host(root)
    (root / "proc/modules").write_text("")  # the module did not load at boot
    install_driver(root, packages["old"])
    tools.set_active(MGR)
    efi(root, 1)
    (root / kernel.MOK_KEY).parent.mkdir(parents=True)
    (root / kernel.MOK_KEY).write_bytes(b"0\x82")
    fake_mokutil(tools)
    fake_journal(tools)
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(
        "Secure Boot is on and the NVIDIA modules are not signed by an enrolled key (kernel: "
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service), so no reboot "
        "loads them: enrol DKMS's key (mokutil --import /var/lib/shim-signed/mok/MOK.der, "
        "reboot, confirm it in MOK Manager at the console), sign the modules with an enrolled "
        "key, or turn Secure Boot off in the firmware")
    # Secure Boot off: the reboot is what the host needs.
    (root / kernel.SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00\x00")
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus("reboot required: nvidia_vgpu_vfio is not loaded")


@pytest.mark.parametrize("resource,message", [
    # Charmhub's placeholder is an empty file: the message says how to attach the driver.
    ("empty", "is empty: juju attach-resource nova-compute-nvidia-vgpu "
              "nvidia-vgpu-software=./nvidia-vgpu-ubuntu-<branch>_<version>_"),
    ("garbage", "is not a Debian package"),
    ("guest", 'is the vGPU guest driver "nvidia-linux-grid-570", which belongs in VMs'),
])
def test_missing_or_wrong_resource_blocks_and_installs_nothing(ctx, v100, root, packages,
                                                               resource, message):
    out = ctx.run(ctx.on.install(), state(resource=packages.get(resource)))
    assert out.unit_status.name == "blocked"
    assert message in out.unit_status.message
    assert debs.dpkg_query(root) == ""


def test_a_package_named_like_the_driver_without_the_vgpu_manager_is_refused(ctx, v100, root,
                                                                            packages):
    out = ctx.run(ctx.on.install(), state(resource=packages["hollow"]))
    assert out.unit_status == testing.BlockedStatus(
        'nvidia-vgpu-software "nvidia-vgpu-ubuntu-570" ships no nvidia-vgpu-mgr.service; '
        "need NVIDIA's vGPU Manager package nvidia-vgpu-ubuntu-<branch>")
    assert debs.dpkg_query(root) == ""


def test_wrong_resource_leaves_the_installed_driver_alone(ctx, v100, root, packages):
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.upgrade_charm(), state(resource=packages["guest"]))
    assert "guest driver" in out.unit_status.message
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"


def test_dpkg_failure_blocks_and_is_retried_on_the_next_hook(ctx, v100, root, packages):
    out = ctx.run(ctx.on.install(), state(resource=packages["depends"]))
    assert out.unit_status.name == "blocked"
    assert "retrying on the next hook" in out.unit_status.message
    assert debs.dpkg_query(root).startswith("install ok unpacked 570.172.08")
    # Another version attached meanwhile: a hook does not swap it in by itself.
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert debs.dpkg_query(root) == "install ok unpacked 570.172.08"
    assert out.unit_status == testing.BlockedStatus(
        "nvidia-vgpu-ubuntu-570 570.172.08 is unpacked: dpkg did not finish; "
        "run the upgrade action to install the attached 570.158.02")
    # The same package and version attached (its dependency now met): dpkg is asked again.
    v100.modules(["nvidia_vgpu_vfio", "nvidia"])
    v100.loaded_driver("570.172.08")
    out = ctx.run(ctx.on.update_status(), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == "install ok installed 570.172.08"
    assert out.unit_status.name == "active"


def test_a_newer_attached_driver_is_not_installed_by_itself(ctx, v100, root, packages):
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.upgrade_charm(), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    assert out.unit_status.name == "active"
    assert out.unit_status.message.endswith(
        "driver 570.158.02 installed, 570.172.08 attached: run the upgrade action")


@pytest.mark.parametrize("mgr,vgpud,message", [
    ("active", "inactive", None),   # nvidia-vgpud prepares the GPUs and exits
    ("inactive", "inactive", f"{MGR} not running: check journalctl -u {MGR}"),
    ("active", "failed", f"{VGPUD} not running: check journalctl -u {VGPUD}"),
    ("failed", "failed", f"{MGR}, {VGPUD} not running: check journalctl -u {MGR}"),
])
def test_vgpu_services_that_are_down_are_reported(ctx, v100, root, tools, packages, mgr, vgpud,
                                                  message):
    install_driver(root, packages["old"])
    tools.set_state(MGR, mgr)
    tools.set_state(VGPUD, vgpud)
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    if message is None:
        assert out.unit_status.name == "active"
    else:
        assert out.unit_status == testing.BlockedStatus(message)


# -- vgpu-device-mappings -> nova-vgpu -------------------------------------------

@pytest.fixture
def ready(v100, root, packages):
    install_driver(root, packages["old"])
    return packages["old"]


def test_mapping_reaches_nova_conf(ctx, ready):
    mapping = "{nvidia-108: ['c1:00.0'], nvidia-109: ['00000000:E1:00.0']}"
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": mapping}, resource=ready))
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), nvidia-108 on 1, nvidia-109 on 1; "
        "nvidia-108: 0 used, 2 free; nvidia-109: 0 used, 1 free")
    assert nova_conf(out) == (
        "[devices]\nenabled_mdev_types = nvidia-108,nvidia-109\n"
        "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n"
        "[mdev_nvidia-109]\ndevice_addresses = 0000:e1:00.0\n")
    blob = json.loads(ours(out)["subordinate_configuration"])
    assert list(blob) == ["nova"] and list(blob["nova"]["/etc/nova/nova.conf"]) == ["sections"]


@pytest.mark.parametrize("nova,expected", [
    ("2:17.0.13-0ubuntu5", "[devices]\nenabled_vgpu_types = nvidia-108\n"),
    ("2:20.6.1-0ubuntu1", "[devices]\nenabled_vgpu_types = nvidia-108\n"),
    ("2:21.2.4-0ubuntu2", "[devices]\nenabled_vgpu_types = nvidia-108\n"
                          "[vgpu_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n"),
    ("3:25.2.1-0ubuntu1", "[devices]\nenabled_mdev_types = nvidia-108\n"
                          "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n"),
    ("3:29.0.0-0ubuntu1~cloud0", "[devices]\nenabled_mdev_types = nvidia-108\n"
                                 "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n"),
    # A Nova newer than any release the charm knows gets the newest format.
    ("3:41.0.0-0ubuntu1", "[devices]\nenabled_mdev_types = nvidia-108\n"
                          "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n"),
])
def test_option_names_follow_the_installed_nova(ctx, ready, v100, nova, expected):
    v100.nova(nova)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    assert nova_conf(out) == expected
    # Queens to Train ignore device addresses: the type serves every GPU offering it.
    served = ("nvidia-108 on 1; nvidia-108: 0 used, 2 free" if "device_addresses" in expected
              else "nvidia-108 on every GPU offering it; nvidia-108: 0 used, 4 free")
    assert out.unit_status == testing.ActiveStatus(f"2 GPUs (Tesla V100 PCIe 16GB), {served}")


def test_nova_older_than_queens_blocks(ctx, ready, v100):
    v100.nova("2:16.1.8-0ubuntu1")
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        "Nova 16 is older than queens (Nova 17), the first with vGPU support")
    assert principal.nova_context(ours(out)) == {}


def test_waits_for_nova_before_publishing(ctx, ready, v100):
    v100.dpkg_status({"nvidia-vgpu-ubuntu-570": "570.158.02"})
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    assert out.unit_status == testing.WaitingStatus("waiting for nova-compute to install nova-common")
    assert "subordinate_configuration" not in ours(out)


def test_bad_mapping_blocks_naming_the_entry_and_keeps_the_last_good(ctx, ready):
    good = ctx.run(ctx.on.config_changed(),
                   state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    before = ours(good)
    for text, message in [
        ("{nvidia-108: ['0000:3b:00.0']}", "nvidia-108: 0000:3b:00.0 is not an NVIDIA GPU on this host"),
        ("{nvidia-471: [c1:00.0]}", "nvidia-471: 0000:c1:00.0 (Tesla V100 PCIe 16GB) does not offer"),
        (HOSTILE, 'type "nvidia-108\\n[DEFAULT]\\ndebug" is not a vGPU type id'),
        ("{nvidia-108: [c1:00.0], nvidia-109: [c1:00.0]}", "GPU 0000:c1:00.0 is mapped to both"),
    ]:
        bad = testing.State(config={"vgpu-device-mappings": text},
                            relations=good.relations, resources=good.resources)
        out = ctx.run(ctx.on.config_changed(), bad)
        assert out.unit_status.name == "blocked"
        assert out.unit_status.message.startswith(f"vgpu-device-mappings: {message}")
        assert out.unit_status.message.endswith("; keeping nvidia-108 on 0000:c1:00.0")
        assert "\n" not in out.unit_status.message
        assert ours(out) == before
        assert "debug" not in nova_conf(out)


def test_clearing_the_option_removes_the_sections(ctx, ready):
    good = ctx.run(ctx.on.config_changed(),
                   state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    out = ctx.run(ctx.on.config_changed(), testing.State(
        config={"vgpu-device-mappings": ""}, relations=good.relations, resources=good.resources))
    assert principal.nova_context(ours(out)) == {}
    assert out.unit_status.message.endswith("no vGPU type mapped: set vgpu-device-mappings")


def test_relation_data_is_byte_identical_across_hooks(ctx, ready):
    config = {"vgpu-device-mappings": "{nvidia-109: [e1:00.0], nvidia-108: [c1:00.0]}"}
    first = ctx.run(ctx.on.config_changed(), state(config, resource=ready))
    again = ctx.run(ctx.on.update_status(), state(config, resource=ready))
    reordered = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": '{"nvidia-108": ["0000:C1:00.0"], "nvidia-109": ["e1:00.0"]}'},
        resource=ready))
    assert ours(first) == ours(again) == ours(reordered)


def test_restart_trigger_from_nova_compute_is_not_answered(ctx, ready):
    config = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}
    first = ctx.run(ctx.on.config_changed(), state(config, resource=ready))
    rel = first.get_relations("nova-vgpu")[0]
    triggered = testing.SubordinateRelation(
        "nova-vgpu", remote_app_name="nova-compute", id=rel.id,
        local_unit_data=dict(rel.local_unit_data),
        remote_unit_data={"restart-trigger": "6e3ad1b2-5f0c-4f7b-a0c4-8a6f6d2f3b11"})
    out = ctx.run(ctx.on.relation_changed(triggered),
                  testing.State(config=config, relations=[triggered], resources=first.resources))
    assert out.get_relations("nova-vgpu")[0].local_unit_data == rel.local_unit_data


def test_relation_joined_publishes_what_config_changed_chose(ctx, ready):
    rel = relation()
    out = ctx.run(ctx.on.relation_joined(rel), state(
        {"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, relations=[rel], resource=ready))
    assert "enabled_mdev_types = nvidia-108" in nova_conf(out)


def test_without_the_nova_vgpu_relation_the_operator_is_told_to_add_it(ctx, ready):
    out = ctx.run(ctx.on.config_changed(), state(relations=[], resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        "relate to nova-compute: juju integrate nova-compute:nova-vgpu "
        "nova-compute-nvidia-vgpu:nova-vgpu")


# -- status wording ---------------------------------------------------------------------

OPTION = "vgpu-device-mappings"


def test_one_mapping_error_is_shown_alone(ctx, ready):
    out = ctx.run(ctx.on.config_changed(), state({OPTION: "{nvidia-108: [c1:00.9]}"}, resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        'vgpu-device-mappings: nvidia-108: "c1:00.9" is not a PCI address like 0000:c1:00.0')


def test_more_mapping_errors_are_counted(ctx, ready):
    out = ctx.run(ctx.on.config_changed(),
                  state({OPTION: "{nvidia-108: [c1:00.9], nvidia-109: [e1:00.9], nvidia-107: x}"},
                        resource=ready))
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith("vgpu-device-mappings: nvidia-107: ")
    assert out.unit_status.message.endswith(" (+2 more)")


def test_keeping_names_what_stays_published_and_only_then(ctx, ready):
    good = ctx.run(ctx.on.config_changed(), state({OPTION: "{nvidia-108: [c1:00.0]}"}, resource=ready))
    bad = testing.State(config={OPTION: "{nvidia-108: [c1:00.9]}"}, relations=good.relations,
                        resources=good.resources)
    out = ctx.run(ctx.on.config_changed(), bad)
    assert out.unit_status.message == ('vgpu-device-mappings: nvidia-108: "c1:00.9" is not a PCI '
                                       'address like 0000:c1:00.0; keeping nvidia-108 on '
                                       '0000:c1:00.0')


def test_a_forced_install_without_gpus_says_so_plainly(ctx, root, tools, packages):
    host = empty_host(root)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    out = ctx.run(ctx.on.install(), state({"force-install-nvidia-vgpu": True}, resource=packages["old"]))
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"
    assert out.unit_status == testing.ActiveStatus(
        "no NVIDIA GPU (forced), no vGPU type mapped: set vgpu-device-mappings")


def test_one_gpu_is_not_plural_and_two_models_are_counted(ctx, root, tools, packages):
    host = v100_host(root, count=1)
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert out.unit_status == testing.ActiveStatus(
        "1 GPU (Tesla V100 PCIe 16GB), no vGPU type mapped: set vgpu-device-mappings")
    host.add_gpu("0000:21:00.0", device="0x1eb8",
                 mdev_types={"nvidia-222": MdevType("GRID T4-8Q", 8192, 2)})
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (1 Tesla T4, 1 Tesla V100 PCIe 16GB), no vGPU type mapped: set vgpu-device-mappings")


@pytest.mark.parametrize("null", ["~", "null", "NULL"])
def test_yaml_null_as_the_option_means_nothing_mapped(ctx, ready, null):
    good = ctx.run(ctx.on.config_changed(), state({OPTION: "{nvidia-108: [c1:00.0]}"}, resource=ready))
    out = ctx.run(ctx.on.config_changed(), testing.State(
        config={OPTION: null}, relations=good.relations, resources=good.resources))
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), no vGPU type mapped: set vgpu-device-mappings")
    assert principal.nova_context(ours(out)) == {}


# -- single-type GPUs and framebuffer units ---------------------------------------------

def test_a_gpu_offering_one_type_is_served_through_all(ctx, root, tools, packages):
    host = FakeHost(root)
    host.pci_ids()
    host.add_gpu("0000:c1:00.0", mdev_types={"nvidia-109": MdevType("GRID V100-16Q", 16384, 1)})
    host.nova("3:29.0.0-0ubuntu1")
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.config_changed(), state({OPTION: "{nvidia-109: all}"}, resource=packages["old"]))
    assert out.unit_status.name == "active"
    assert out.unit_status.message.startswith("1 GPU (Tesla V100 PCIe 16GB), nvidia-109 on 1")
    conf = nova_conf(out)
    assert "enabled_mdev_types = nvidia-109\n" in conf
    assert "[mdev_nvidia-109]\ndevice_addresses = 0000:c1:00.0\n" in conf


@pytest.mark.parametrize("written,mib", [
    ("framebuffer=8257536K", 8064),
    ("framebuffer=8455716864", 8064),  # bytes
    ("framebuffer=1T", 1024 * 1024),
    ("framebuffer=8064MB", 8064),
    ("framebuffer = 8064M ", 8064),
])
def test_framebuffer_sizes_in_every_unit(ctx, root, tools, packages, written, mib):
    host = FakeHost(root)
    directory = host.add_gpu("0000:c1:00.0",
                             mdev_types={"nvidia-900": MdevType("GRID X-8Q", 8192, 1)})
    (directory / "mdev_supported_types/nvidia-900/description").write_text(
        f"num_heads=1, {written}, max_instance=1\n")
    ctx.run(ctx.on.action("list-vgpu-types"), state(resource=packages["empty"]))
    assert ctx.action_results["gpus"]["gpu-0"]["types"]["nvidia-900"]["framebuffer-mb"] == str(mib)


def test_a_description_spanning_lines_is_read_whole(ctx, root, tools, packages):
    host = FakeHost(root)
    directory = host.add_gpu("0000:c1:00.0",
                             mdev_types={"nvidia-900": MdevType("GRID X-8Q", 8192, 1)})
    (directory / "mdev_supported_types/nvidia-900/description").write_text(
        "num_heads=4, frl_config=60\nframebuffer=8064M\nmax_resolution=7680x4320\nmax_instance=3\n")
    ctx.run(ctx.on.action("list-vgpu-types"), state(resource=packages["empty"]))
    entry = ctx.action_results["gpus"]["gpu-0"]["types"]["nvidia-900"]
    assert (entry["framebuffer-mb"], entry["max-instances"]) == ("8064", "3")


# -- actions ----------------------------------------------------------------------

def test_list_vgpu_types(ctx, ready):
    ctx.run(ctx.on.action("list-vgpu-types"), state(resource=ready))
    results = ctx.action_results
    gpu = results["gpus"]["gpu-0"]  # both V100s offer the same: one entry names them both
    assert (gpu["addresses"], gpu["model"], gpu["driver"]) == (
        "0000:c1:00.0,0000:e1:00.0", "Tesla V100 PCIe 16GB", "nvidia")
    assert gpu["types"]["nvidia-108"] == {
        "id": "nvidia-108", "name": "GRID V100-8Q", "framework": "mdev",
        "framebuffer-mb": "8192", "max-instances": "2", "available-instances": "2",
        "flavor-property": "resources:VGPU=1",
        "max-per-instance": "1"}  # Nova 29 takes one mdev vGPU per instance (33+: several)
    assert sorted(results["gpus"]) == ["gpu-0"]
    lines = results["table"].splitlines()
    assert lines[0].split() == ["GPUS", "MODEL", "TYPE", "NAME", "FRAMEBUFFER", "MAX", "AVAILABLE",
                                "FLAVOR"]
    assert lines[-1].split() == ["0000:c1:00.0,0000:e1:00.0", "Tesla", "V100", "PCIe", "16GB",
                                 "nvidia-109", "GRID", "V100-16Q", "16384", "MiB", "1", "1",
                                 "resources:VGPU=1"]
    assert len(lines) == 1 + 5  # mdev types need no [pci] alias: nothing under the table


@pytest.mark.parametrize("per_profile", [False, True])
def test_list_vgpu_types_says_when_published_types_share_one_resource_class(ctx, ready, per_profile):
    config = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}",
              "mdev-class-per-profile": per_profile}
    published = ctx.run(ctx.on.config_changed(), state(config, resource=ready))
    ctx.run(ctx.on.action("list-vgpu-types"), published)
    types = ctx.action_results["gpus"]["gpu-0"]["types"]
    table = ctx.action_results["table"]
    if per_profile:  # CUSTOM_VGPU_V100_8Q and CUSTOM_VGPU_V100_16Q: Placement tells them apart
        assert "flavor-note" not in types["nvidia-108"] and "shared" not in table
        return
    note = types["nvidia-108"]["flavor-note"]
    assert note.startswith("nvidia-108, nvidia-109 are published with one resource class, VGPU")
    assert types["nvidia-109"]["flavor-note"] == note and "flavor-note" not in types["nvidia-107"]
    assert table.endswith(note)
    assert table.splitlines()[-3].endswith("resources:VGPU=1 (shared: see below)")  # nvidia-109


def test_list_vgpu_types_without_gpus(ctx, root, tools):
    empty_host(root)
    ctx.run(ctx.on.action("list-vgpu-types"), state())
    assert ctx.action_results == {"gpus": {}, "table": "no NVIDIA GPU on this host"}


def test_pause_stops_services_and_stays_paused_until_resume(ctx, ready, tools):
    published = ctx.run(ctx.on.config_changed(), state(resource=ready))
    tools.log.write_text("")
    out = ctx.run(ctx.on.action("pause"), published)
    # This charm's pause stops the daemon; nova-compute is given none to stop.
    assert ctx.action_results == {"stopped": MGR}
    assert principal.services(ours(out)) == set()
    assert [c for c in tools.calls() if not c.startswith("systemctl is-")] == [
        f"systemctl stop {MGR}", f"systemctl disable {MGR}", f"systemctl mask {MGR}"]
    paused = testing.MaintenanceStatus(
        "paused: vGPU services stopped; juju run nova-compute-nvidia-vgpu/0 resume to start them")
    assert out.unit_status == paused
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status == paused
    out = ctx.run(ctx.on.action("resume"), out)
    assert ctx.action_results == {"started": MGR}
    assert f"systemctl start {MGR}" in tools.calls()
    assert (tools.enabled(MGR), tools.enabled(VGPUD)) == ("enabled", "enabled")
    assert out.unit_status.name == "active"


def test_pause_and_resume_report_each_step_as_they_go(ctx, ready, tools):
    """Progress with event.log (juju run shows it while the action runs; issue 36)."""
    published = ctx.run(ctx.on.config_changed(), state(resource=ready))
    out = ctx.run(ctx.on.action("pause"), published)
    assert ctx.action_logs == ["checking that no running guest uses a vGPU",
                               f"stopping {MGR}", f"disabling {MGR}", f"masking {MGR}"]
    ctx.action_logs.clear()
    ctx.run(ctx.on.action("resume"), out)
    assert ctx.action_logs == [f"unmasking {MGR}", f"enabling {MGR}", f"starting {MGR}"]


@pytest.mark.parametrize("action", ["pause", "upgrade"])
def test_pause_and_upgrade_refuse_while_guests_use_vgpus(ctx, ready, root, tools, packages, action):
    running_guest(root, "instance-0000002a", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1",
                  mdev_uuid="5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f")
    running_guest(root, "instance-0000002b", "3d9f1c52-2a7e-4b5e-8f3a-1c2d3e4f5a6b")  # no vGPU
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action(action), state(resource=packages["new"]))
    # The upgrade names drain-plan: where each guest can go before the driver changes.
    hint = ("; juju run nova-compute-nvidia-vgpu/0 drain-plan says where each guest can go"
            if action == "upgrade" else "")
    assert failure.value.message == (
        f"not {action}d: 1 running guest(s) use vGPUs: "
        "instance-0000002a (vm-instance-0000002a, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1)" + hint)
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    assert not [c for c in tools.calls() if "stop" in c]


@pytest.mark.parametrize("action", ["pause", "upgrade"])
def test_a_refusal_past_three_guests_names_the_command_that_lists_them(ctx, ready, root, packages,
                                                                      action):
    for n in range(4):
        running_guest(root, f"instance-{n:08x}", f"0b7a0f2c-6f2d-4b3c-9b1e-{n:012x}",
                      mdev_uuid=f"5f4b8a3e-2d1c-4b0a-9e8f-{n:012x}")
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action(action), state(resource=packages["new"]))
    message = failure.value.message
    assert message.startswith(f"not {action}d: 4 running guest(s) use vGPUs: instance-00000000 ")
    assert "instance-00000002 (" in message and "instance-00000003" not in message
    assert " and 1 more (juju run nova-compute-nvidia-vgpu/0 vgpu-usage lists the vGPUs " \
        "guests hold)" in message


def test_forced_pause_goes_ahead_with_guests_running(ctx, ready, root, tools):
    running_guest(root, "instance-0000002a", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1",
                  pci_address="0000:c1:00.0")
    out = ctx.run(ctx.on.action("pause", params={"force": True}), state(resource=ready))
    assert f"systemctl stop {MGR}" in tools.calls()
    assert out.unit_status.name == "maintenance"


def test_resume_reports_a_service_that_fails_to_start(ctx, ready, tools):
    tools.fail_start(MGR)
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("resume"), state(resource=ready, paused=True))
    assert failure.value.message.startswith("not resumed: ")
    assert MGR in failure.value.message


def test_upgrade_installs_the_attached_driver_and_says_a_reboot_is_needed(ctx, ready, v100, root,
                                                                         packages):
    out = ctx.run(ctx.on.action("upgrade"), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == "install ok installed 570.172.08"
    results = ctx.action_results
    assert (results["previous"], results["version"], results["reboot-required"]) == (
        "nvidia-vgpu-ubuntu-570 570.158.02", "570.172.08", "yes")
    reason = "NVIDIA driver 570.158.02 is loaded, 570.172.08 installed"
    assert results["message"] == f"nvidia-vgpu-ubuntu-570 570.172.08 installed; {reason}"
    assert out.unit_status == testing.BlockedStatus(f"reboot required: {reason}")
    # After the reboot the new module is loaded and the unit is active again.
    v100.loaded_driver("570.172.08")
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status.name == "active"
    assert "attached" not in out.unit_status.message


def test_upgrade_to_the_installed_version_does_nothing(ctx, ready, root, tools):
    ctx.run(ctx.on.action("upgrade"), state(resource=ready))
    assert ctx.action_results["message"] == "nvidia-vgpu-ubuntu-570 570.158.02 already installed; " \
                                            "no reboot needed"
    assert ctx.action_results["reboot-required"] == "no"


def test_an_older_attached_driver_is_noted_and_only_installed_when_allowed(ctx, v100, root, tools,
                                                                           packages):
    install_driver(root, packages["new"])
    v100.loaded_driver("570.172.08")
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert out.unit_status.message.endswith(
        "driver 570.172.08 installed; the attached 570.158.02 is older")
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("upgrade"), state(resource=packages["old"]))
    assert failure.value.message == ("not upgraded: attached 570.158.02 is older than installed "
                                     "570.172.08; run with allow-downgrade=true to install it")
    assert debs.dpkg_query(root) == "install ok installed 570.172.08"
    ctx.run(ctx.on.action("upgrade", params={"allow-downgrade": True}), state(resource=packages["old"]))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"


def test_upgrade_is_refused_on_a_host_without_gpus(ctx, root, tools, packages):
    empty_host(root)
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("upgrade"), state(resource=packages["new"]))
    assert failure.value.message == ("not upgraded: no NVIDIA GPU on this host, so no vGPU "
                                     "driver belongs here")
    assert debs.dpkg_query(root) == ""


def test_pause_without_a_driver_is_refused_and_records_nothing(ctx, v100, tools, packages):
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("pause"), state(resource=packages["old"]))
    assert failure.value.message == ("not paused: the vGPU host driver is not installed, "
                                     "so no service runs")
    assert tools.calls() == []


def test_a_bad_mapping_is_shown_before_host_states_such_as_reboots(ctx, v100, root, packages):
    v100.modules(["nouveau"])
    out = ctx.run(ctx.on.install(), state({"vgpu-device-mappings": "{nvidia-108: [c1:00.9]}"},
                                          resource=packages["old"]))
    assert out.unit_status.message.startswith('vgpu-device-mappings: nvidia-108: "c1:00.9" is not')


def test_upgrade_without_a_usable_resource_fails_and_changes_nothing(ctx, ready, root, packages):
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("upgrade"), state(resource=packages["guest"]))
    assert "guest driver" in failure.value.message
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"


# -- the upgrade action: forced, paused, half-installed, another branch ------------------

GUEST = ("instance-0000002a", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1")
MDEV_UUID = "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f"


def test_a_forced_upgrade_goes_ahead_with_guests_running(ctx, v100, root, packages):
    install_driver(root, packages["old"])
    running_guest(root, *GUEST, mdev_uuid=MDEV_UUID)
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("upgrade"), state(resource=packages["new"]))
    assert failure.value.message.startswith("not upgraded: 1 running guest(s) use vGPUs")
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"
    ctx.run(ctx.on.action("upgrade", params={"force": True}), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == f"install ok installed {debs.NEW}"
    assert ("WARNING", f"forced past 1 running vGPU guest(s): {GUEST[0]}") in [
        (line.level, line.message) for line in ctx.juju_log]
    assert ctx.action_results["previous"] == f"{debs.HOST} {debs.OLD}"


def test_upgrade_reports_each_step_as_it_goes(ctx, ready, v100, root, packages):
    ctx.run(ctx.on.action("upgrade"), state(resource=packages["new"]))
    assert ctx.action_logs == [
        "checking that no running guest uses a vGPU",
        "taking the host lock (the boot step may hold it)",
        "installing nvidia-vgpu-ubuntu-570 570.172.08 with dpkg",
        "publishing to nova-compute what the host serves now"]
    assert ctx.action_results["message"].startswith(f"{debs.HOST} {debs.NEW} installed; ")


def test_upgrade_while_paused_says_to_resume_first_and_installs_nothing(ctx, v100, root, packages):
    install_driver(root, packages["old"])
    paused = ctx.run(ctx.on.action("pause"), state(resource=packages["new"]))
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("upgrade"), paused)
    assert failure.value.message == (
        "not upgraded: the unit is paused and its services masked, which the driver's install "
        "scripts need; run resume first")
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"


def test_force_false_is_the_same_as_no_force(ctx, v100, root, packages):
    install_driver(root, packages["old"])
    running_guest(root, *GUEST, mdev_uuid=MDEV_UUID)
    with pytest.raises(testing.ActionFailed):
        ctx.run(ctx.on.action("upgrade", params={"force": False}), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"


def test_upgrade_with_no_driver_installed_installs_the_attached_one(ctx, v100, root, packages):
    out = ctx.run(ctx.on.action("upgrade"), state(resource=packages["old"]))
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"
    assert ctx.action_results == {
        "package": debs.HOST, "version": debs.OLD, "previous": "none", "reboot-required": "no",
        "message": f"{debs.HOST} {debs.OLD} installed; no reboot needed"}
    # nova-compute learns of the package at once, and of no service to pause.
    assert principal.services(ours(out)) == set()
    assert principal.release_packages(ours(out)).install == {debs.HOST}


def test_upgrade_over_a_half_installed_driver_of_the_same_version_finishes_it(ctx, v100, root,
                                                                              packages):
    install_driver(root, packages["old"])
    (root / "var/lib/dpkg/updates/0000").write_text(
        f"Package: {debs.HOST}\nStatus: install ok half-configured\n"
        f"Architecture: {debs.machine_arch()}\nVersion: {debs.OLD}\n"
        "Maintainer: Test <test@example.com>\nDescription: test\n")
    assert debs.dpkg_query(root) == f"install ok half-configured {debs.OLD}"
    ctx.run(ctx.on.action("upgrade"), state(resource=packages["old"]))
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"
    assert ctx.action_results["message"] == f"{debs.HOST} {debs.OLD} installed; no reboot needed"
    assert ctx.action_results["previous"] == f"{debs.HOST} {debs.OLD}"


def test_a_same_version_package_of_another_branch_is_an_upgrade(ctx, v100, root, packages):
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.update_status(), state(resource=packages["other-branch"]))
    assert out.unit_status.message.endswith(
        f"driver {debs.OLD} installed, {debs.OLD} attached: run the upgrade action")
    out = ctx.run(ctx.on.action("upgrade"), state(resource=packages["other-branch"]))
    assert debs.dpkg_query(root, "nvidia-vgpu-ubuntu-580") == f"install ok installed {debs.OLD}"
    assert not debs.dpkg_query(root).endswith(f"installed {debs.OLD}")
    assert ctx.action_results["message"] == (f"nvidia-vgpu-ubuntu-580 {debs.OLD} installed; "
                                             "no reboot needed")
    assert principal.release_packages(ours(out)).install == {"nvidia-vgpu-ubuntu-580"}


def test_upgrade_to_the_same_package_and_version_changes_nothing(ctx, v100, root, tools, packages):
    install_driver(root, packages["old"])
    mtime = (root / "var/lib/dpkg/status").stat().st_mtime_ns
    ctx.run(ctx.on.action("upgrade"), state(resource=packages["old"]))
    assert ctx.action_results["message"] == f"{debs.HOST} {debs.OLD} already installed; no reboot needed"
    assert (root / "var/lib/dpkg/status").stat().st_mtime_ns == mtime


def test_an_upgrade_that_leaves_sysfs_unreadable_still_reports_and_logs_why(ctx, v100, root,
                                                                            packages, tmp_path):
    # A package whose install leaves a PCI function the charm cannot read: its `vendor` is a
    # directory. The driver is installed; publishing afterwards cannot read the host.
    files = debs.host_files()
    files["sys/bus/pci/devices/0000:99:00.0/vendor/placeholder"] = ""
    breaking = debs.build(tmp_path, debs.HOST, debs.NEW, debs.machine_arch(), files)
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.action("upgrade"), state(resource=breaking))
    assert debs.dpkg_query(root) == f"install ok installed {debs.NEW}"
    unreadable = "cannot read /sys/bus/pci/devices/0000:99:00.0/vendor: Is a directory"
    assert ctx.action_results == {
        "package": debs.HOST, "version": debs.NEW, "previous": f"{debs.HOST} {debs.OLD}",
        "reboot-required": "unknown",
        "message": f"{debs.HOST} {debs.NEW} installed; cannot tell whether a reboot is needed: "
                   + unreadable}
    assert ("ERROR", unreadable) in [(line.level, line.message) for line in ctx.juju_log]
    assert out.unit_status == testing.BlockedStatus(unreadable)


# -- remove -----------------------------------------------------------------------

def test_remove_deletes_what_the_charm_wrote_and_keeps_the_driver(ctx, ready, root, tools):
    kernel.ensure_nouveau_blacklisted()
    ctx.run(ctx.on.remove(), state(resource=ready))
    assert not kernel.blacklist_path().exists()
    assert tools.calls().count("update-initramfs -u") == 2
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"


def test_remove_while_paused_unmasks_the_services(ctx, ready, tools):
    ctx.run(ctx.on.remove(), state(resource=ready, paused=True))
    assert [c for c in tools.calls() if c.startswith("systemctl unmask")] == [
        f"systemctl unmask {MGR}", f"systemctl unmask {VGPUD}"]


def test_a_half_installed_driver_is_reported_not_taken_for_success(ctx, v100, root, tools, packages):
    v100.dpkg_status({"nova-common": "3:29.0.0-0ubuntu1", "nvidia-vgpu-ubuntu-570": "570.158.02"},
                     states={"nvidia-vgpu-ubuntu-570": "half-configured"})
    # Only Charmhub's empty placeholder is attached: nothing to retry with.
    out = ctx.run(ctx.on.update_status(), state(resource=packages["empty"]))
    assert out.unit_status == testing.BlockedStatus(
        "nvidia-vgpu-ubuntu-570 570.158.02 is half-configured: dpkg did not finish; "
        "retrying on the next hook")
    assert principal.services(ours(out)) == set()


def test_every_event_on_a_host_without_gpus_sets_the_same_status(ctx, root, tools):
    FakeHost(root)
    rel = relation()
    info = testing.SubordinateRelation("juju-info", remote_app_name="nova-compute")
    for event in (ctx.on.install(), ctx.on.start(), ctx.on.update_status(), ctx.on.config_changed(),
                  ctx.on.upgrade_charm(), ctx.on.relation_joined(rel), ctx.on.relation_changed(rel),
                  ctx.on.relation_joined(info)):
        out = ctx.run(event, state(relations=[rel, info]))
        assert out.unit_status == testing.ActiveStatus("no NVIDIA GPU on this host: nothing to do")
        assert principal.nova_context(ours(out)) == {}


# -- update-status stays light -------------------------------------------------------

LIGHT = """
import json
import sys
from ops import testing
from charm import NovaComputeNvidiaVgpuCharm
from vgpu import mappings
config = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}
ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
stored = testing.StoredState(owner_path="NovaComputeNvidiaVgpuCharm", name="_stored", content={
    "paused": False, "checked": {"key": mappings.fingerprint(config["vgpu-device-mappings"]),
                                 "mapping": {"nvidia-108": ["0000:c1:00.0"]}, "errors": []}})
rel = testing.SubordinateRelation("nova-vgpu")
from vgpu import bootfile  # the boot step ran at this boot: no hook does its work again
bootfile.write(bootfile.BY_BOOT, 0, [])
out = ctx.run(ctx.on.update_status(), testing.State(config=config, relations=[rel],
    stored_states={stored}, resources={testing.Resource(name="nvidia-vgpu-software", path=sys.argv[1])}))
kept = out.get_stored_state("_stored", owner_path="NovaComputeNvidiaVgpuCharm").content
# What a steady hook never needs: the schema, MIG's tables, the actions' and the boot step's code
# (the status line's count is vgpu.capacity, not the vgpu-usage action's vgpu.usage).
heavy = ("jsonschema", "vgpu.mig", "vgpu.miginstances", "vgpu.migsteps", "vgpu.migplan", "vgpu.report",
         "vgpu.table", "vgpu.boot", "vgpu.usage", "vgpu.bootdata")
print(json.dumps({"status": out.unit_status.name, "jsonschema": "jsonschema" in sys.modules,
                  "message": out.unit_status.message,
                  "heavy": [m for m in heavy if m in sys.modules],
                  "stored": {k: kept[k] for k in ("paused", "checked")},
                  "same": kept["checked"] == dict(stored.content["checked"])}))
"""


def test_update_status_reuses_the_checked_option_and_imports_nothing_heavy(ready, tmp_path,
                                                                          tools):
    from unit_tests.faketools import run_script

    result = run_script(tmp_path, LIGHT, str(ready))
    answer = json.loads(result.stdout.splitlines()[-1])
    assert (answer["status"], answer["jsonschema"]) == ("active", False)
    assert answer["heavy"] == []  # vgpu.mig only where a MIG-backed profile is mapped
    assert answer["message"].endswith("free"), answer["message"]  # the capacity was counted
    # The stored check was reused as it was, not redone nor rewritten; still not paused.
    assert answer["same"] and answer["stored"]["paused"] is False
    assert answer["stored"]["checked"]["mapping"] == {"nvidia-108": ["0000:c1:00.0"]}
    # Both vGPU services were checked, in one systemctl call.
    assert [c for c in tools.calls() if c.startswith("systemctl")] == [
        f"systemctl is-active {MGR} {VGPUD}"]


def test_a_steady_hook_reads_no_host_file_twice(ctx, ready, root):
    from unit_tests.faketools import OPENED

    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    with OPENED as opened:
        ctx.run(ctx.on.update_status(), carried(first))
    host = {p: n for p, n in opened.reads.items() if p.is_relative_to(root)}
    assert host[root / "var/lib/dpkg/status"] == 1
    assert [p for p, n in host.items() if n > 1] == []


def test_the_option_is_fingerprinted_once_a_dispatch(ctx, ready):
    """Its check is kept by the fingerprint of text, schema and checker: those read once a hook."""
    from unit_tests.faketools import OPENED
    from vgpu import mappings

    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    with OPENED as opened:
        out = ctx.run(ctx.on.update_status(), carried(first))
    assert out.unit_status.name == "active"
    assert opened.reads[mappings.SCHEMA_FILE] == 1
    assert opened.reads[Path(mappings.__file__)] == 1


def test_a_changed_option_is_checked_again(ctx, ready):
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    changed = testing.State(config={"vgpu-device-mappings": "{nvidia-108: [nope]}"},
                            relations=first.relations, resources=first.resources,
                            stored_states=first.stored_states)
    out = ctx.run(ctx.on.update_status(), changed)
    assert out.unit_status.message.startswith('vgpu-device-mappings: nvidia-108: "nope" is not a PCI')


# -- SR-IOV GPUs (mdev framework) --------------------------------------------------------

def test_sriov_gpu_serves_types_through_its_virtual_functions(ctx, root, tools, packages):
    from unit_tests.fakehost import a100_host
    a100_host(root)
    install_driver(root, packages["old"])
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{nvidia-474: ['41:00.4', '41:00.5']}"}, resource=packages["old"]))
    # Each VF holds one vGPU on the mdev framework.
    assert out.unit_status == testing.ActiveStatus(
        "1 GPU (A100 PCIe 40GB), nvidia-474 on 2; nvidia-474: 0 used, 2 free")
    assert nova_conf(out) == ("[devices]\nenabled_mdev_types = nvidia-474\n"
                              "[mdev_nvidia-474]\ndevice_addresses = 0000:41:00.4,0000:41:00.5\n")


def test_sriov_gpu_without_iommu_tells_the_operator_what_to_set(ctx, root, tools, packages):
    from unit_tests.fakehost import a100_host
    a100_host(root)
    (root / "sys/kernel/iommu_groups").rename(root / "iommu_groups_off")
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(
        "IOMMU is off but SR-IOV GPU 0000:41:00.0 needs it: add intel_iommu=on iommu=pt (Intel) "
        "or amd_iommu=on (AMD) to the kernel command line, enable VT-d/AMD-Vi in firmware, reboot")


def test_a_paused_unit_stays_paused_through_other_hooks(ctx, ready, tools):
    for unit in (MGR, VGPUD):
        tools.set_active(unit, False)   # as the pause action left them
    for event in (ctx.on.upgrade_charm(), ctx.on.config_changed(), ctx.on.update_status(),
                  ctx.on.start()):
        out = ctx.run(event, state(resource=ready, paused=True))
        assert out.unit_status.name == "maintenance"
        assert out.unit_status.message.startswith("paused: ")
    assert not [c for c in tools.calls() if c.split()[1] in ("start", "unmask", "enable")]


def test_an_openstack_upgrade_switches_the_option_names_on_the_next_hook(ctx, ready, v100):
    v100.nova("2:23.2.2-0ubuntu1")  # wallaby
    config = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}
    out = ctx.run(ctx.on.config_changed(), state(config, resource=ready))
    assert nova_conf(out) == ("[devices]\nenabled_vgpu_types = nvidia-108\n"
                              "[vgpu_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n")
    v100.nova("3:24.2.0-0ubuntu1")  # nova-compute's openstack-upgrade to xena
    out = ctx.run(ctx.on.update_status(), testing.State(
        config=config, relations=out.relations, resources=out.resources,
        stored_states=out.stored_states))
    assert nova_conf(out) == ("[devices]\nenabled_mdev_types = nvidia-108\n"
                              "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n")


def test_services_started_outside_the_charm_end_the_pause(ctx, ready, tools):
    out = ctx.run(ctx.on.update_status(), state(resource=ready, paused=True))  # they run again
    assert out.unit_status.name == "active"
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status.name == "active"


def test_services_masked_outside_the_charm_block_and_resume_brings_them_back(ctx, ready, tools):
    for unit in (MGR, VGPUD):
        subprocess.run(["systemctl", "stop", unit], check=True)
        subprocess.run(["systemctl", "mask", unit], check=True)
    out = ctx.run(ctx.on.update_status(), state(resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        f"{MGR} stopped and masked outside this charm: juju run nova-compute-nvidia-vgpu/0 resume "
        "to unmask and start it")
    out = ctx.run(ctx.on.action("resume"), out)
    assert tools.enabled(MGR) == "enabled"
    assert out.unit_status.name == "active"


def test_upgrade_is_refused_while_paused(ctx, ready, root, tools, packages):
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("upgrade"), state(resource=packages["new"], paused=True))
    assert failure.value.message.startswith("not upgraded: the unit is paused")
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"


def test_a_failed_upgrade_reports_what_dpkg_left(ctx, ready, root, packages):
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("upgrade"), state(resource=packages["depends"]))
    # The status set in that same dispatch already reads dpkg's answer, not the old driver's.
    assert failure.value.state.unit_status == testing.BlockedStatus(
        "nvidia-vgpu-ubuntu-570 570.172.08 is unpacked: dpkg did not finish; retrying on the next hook")


def test_a_branch_upgrade_republishes_the_package_for_nova_compute(ctx, v100, root, tools, packages,
                                                                    tmp_path):
    install_driver(root, debs.older_branch(tmp_path))
    out = ctx.run(ctx.on.action("upgrade"), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == "install ok installed 570.172.08"
    assert principal.release_packages(ours(out)).install == {"nvidia-vgpu-ubuntu-570"}


def test_relation_values_are_canonical_json(ctx, ready):
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{nvidia-99: [e1:00.0], nvidia-108: [c1:00.0]}"}, resource=ready))
    for value in ours(out).values():
        assert value == json.dumps(json.loads(value), sort_keys=True, separators=(",", ":"))


# -- nova-compute's pause and upgrade leave the vGPU daemon alone -----------------------

def nova_compute_pauses(out):
    """nova-compute's pause action: charmhelpers' service_pause of the published services."""
    for unit in sorted(principal.services(ours(out))):
        for verb in ("stop", "disable", "mask"):
            subprocess.run(["systemctl", verb, unit], check=True)


def test_nova_computes_pause_leaves_the_daemon_running_under_the_guests(ctx, ready, tools):
    # An older revision of this charm listed the daemon: the next hook takes it back.
    older = relation(local={"services": json.dumps([MGR])})
    assert principal.services(older.local_unit_data) == {MGR}
    out = ctx.run(ctx.on.upgrade_charm(), state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"},
                                                relations=[older], resource=ready))
    assert ours(out)["services"] == "[]"
    nova_compute_pauses(out)
    is_active = subprocess.run(["systemctl", "is-active", MGR], capture_output=True, text=True)
    assert (tools.enabled(MGR), is_active.stdout.strip()) == ("enabled", "active")
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status.name == "active"


def test_a_daemon_stopped_under_the_charm_is_its_own_status_to_report(ctx, ready, tools):
    tools.set_active(MGR, False)
    out = ctx.run(ctx.on.update_status(), state(resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        f"{MGR} not running: check journalctl -u {MGR}")


def test_a_pause_that_fails_halfway_is_rolled_back_and_nova_compute_is_not_blamed(ctx, ready, tools):
    tools.fail("mask", MGR)
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("pause"), state(resource=ready))
    assert failure.value.message.startswith(f"not paused: systemctl mask {MGR} failed: ")
    assert failure.value.message.endswith("what it had done was undone")
    assert tools.enabled(MGR) == "enabled"
    assert failure.value.state.unit_status.name == "active"
    out = ctx.run(ctx.on.update_status(), failure.value.state)
    assert out.unit_status.name == "active"


def test_units_a_failed_pause_left_masked_are_the_charms_to_undo(ctx, ready, tools):
    tools.fail("stop", MGR)
    (tools.state / f"{MGR}.enabled").write_text("masked\n")  # masked, and the undo cannot help it
    tools.fail("unmask", MGR)
    tools.set_active(MGR, False)
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("pause"), state(resource=ready))
    # This charm tried to pause: it does not send the operator to nova-compute.
    out = ctx.run(ctx.on.update_status(), failure.value.state)
    assert out.unit_status == testing.BlockedStatus(
        f"{MGR} left stopped and masked by this charm's pause that failed: "
        "juju run nova-compute-nvidia-vgpu/0 resume")


def test_remove_unmasks_what_the_charm_masked(ctx, ready, tools):
    out = ctx.run(ctx.on.action("pause"), state(resource=ready))
    assert tools.enabled(MGR) == "masked"
    ctx.run(ctx.on.remove(), out)
    assert tools.enabled(MGR) == "enabled"
    assert f"systemctl unmask {MGR}" in tools.calls()


# -- host state the charm must not misread ---------------------------------------------

def half_configured(root, version):
    """dpkg killed while configuring ``version``: its journal says so; status does not yet."""
    (root / "var/lib/dpkg/updates/0000").write_text(
        f"Package: {debs.HOST}\nStatus: install ok half-configured\nArchitecture: {debs.machine_arch()}\n"
        f"Version: {version}\nMaintainer: Test <test@example.com>\nDescription: test\n")


@pytest.mark.parametrize("attached,half,level,said", [
    ("garbage", None, "WARNING", "not installing the vGPU host driver: nvidia-vgpu-software is not "
                                 "a Debian package; need nvidia-vgpu-ubuntu-<branch>_<version>_{arch}.deb"),
    ("hollow", None, "ERROR", 'refusing to install nvidia-vgpu-ubuntu-570: nvidia-vgpu-software '
                              '"nvidia-vgpu-ubuntu-570" ships no nvidia-vgpu-mgr.service; need '
                              "NVIDIA's vGPU Manager package nvidia-vgpu-ubuntu-<branch>"),
    ("depends", None, "ERROR", "installing nvidia-vgpu-ubuntu-570 failed: dpkg left "
                               "nvidia-vgpu-ubuntu-570 570.172.08 unpacked: nvidia-vgpu-ubuntu-570 "
                               "depends on some-package-that-does-not-exist; however: Package "
                               "some-package-that-does-not-exist is not installed. "
                               "(dependency problems ..."),
    ("new", debs.OLD, "WARNING", "nvidia-vgpu-ubuntu-570 570.158.02 is half-configured; not installing "
                                 "nvidia-vgpu-ubuntu-570 570.172.08 by itself"),
])
def test_why_the_driver_was_not_installed_is_in_the_log(ctx, v100, root, packages, attached, half,
                                                        level, said):
    if half:
        half_configured(root, half)
    ctx.run(ctx.on.install(), state(resource=packages[attached]))
    logged = [(line.level, line.message) for line in ctx.juju_log if line.level in ("WARNING", "ERROR")]
    assert (level, said.format(arch=debs.machine_arch())) in logged, logged


def test_versions_dpkg_cannot_compare_are_named_in_the_status(ctx, ready, v100, root, packages):
    status_file = root / "var/lib/dpkg/status"
    status_file.write_text(status_file.read_text().replace(f"Version: {debs.OLD}", "Version: r570"))
    v100.loaded_driver("r570")
    out = ctx.run(ctx.on.update_status(), state(resource=packages["new"]))
    # The installed driver serves on; the note says why no upgrade is offered.
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), no vGPU type mapped: set vgpu-device-mappings; "
        "cannot compare the attached driver's version: version \"r570\" does not start with a digit")


def test_a_driver_dpkg_left_half_configured_in_its_journal_is_not_taken_as_installed(
        ctx, v100, root, tools, packages):
    install_driver(root, packages["old"])
    half_configured(root, debs.NEW)
    assert debs.dpkg_query(root) == f"install ok half-configured {debs.NEW}"
    out = ctx.run(ctx.on.update_status(), state(resource=packages["empty"]))
    assert out.unit_status == testing.BlockedStatus(
        f"nvidia-vgpu-ubuntu-570 {debs.NEW} is half-configured: dpkg did not finish; "
        "retrying on the next hook")
    # nova-compute is told of no service to check and no package to carry over an upgrade.
    assert principal.services(ours(out)) == set()
    assert principal.release_packages(ours(out)).install == set()
    # The next hook with that package attached finishes it.
    v100.loaded_driver(debs.NEW)
    out = ctx.run(ctx.on.update_status(), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == f"install ok installed {debs.NEW}"
    assert out.unit_status.name == "active"
    assert principal.release_packages(ours(out)).install == {debs.HOST}


def test_a_held_dpkg_lock_blocks_with_dpkgs_cause_first(ctx, v100, root, packages):
    import fcntl
    (root / "var/lib/dpkg/lock-frontend").touch()
    with open(root / "var/lib/dpkg/lock-frontend", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        out = ctx.run(ctx.on.install(), state(resource=packages["old"]))
    message = out.unit_status.message
    assert message.startswith("dpkg did not install nvidia-vgpu-ubuntu-570 570.158.02: ")
    assert "lock" in message.split(": ", 1)[1].split(";")[0]
    assert message.endswith("; retrying on the next hook") and len(message) < 300
    assert "wiki" not in message


def test_versions_with_a_colon_after_the_epoch_are_compared(ctx, v100, root, tools, tmp_path):
    install_driver(root, debs.host_driver(tmp_path, version="1:570.158:02-1"))
    v100.loaded_driver("570.158:02")
    out = ctx.run(ctx.on.update_status(),
                  state(resource=debs.host_driver(tmp_path, version="1:570.158:02-2")))
    assert out.unit_status.message.endswith(
        "driver 1:570.158:02-1 installed, 1:570.158:02-2 attached: run the upgrade action")


def test_a_loaded_module_must_match_the_installed_version_exactly(ctx, ready, v100):
    v100.loaded_driver("570.158.0")  # a prefix of 570.158.02
    out = ctx.run(ctx.on.update_status(), state(resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        "reboot required: NVIDIA driver 570.158.0 is loaded, 570.158.02 installed")


def test_when_every_gpu_vanishes_the_sections_stay_and_the_status_names_them(ctx, ready, root):
    config = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}"}
    good = ctx.run(ctx.on.config_changed(), state(config, resource=ready))
    before = ours(good)
    for address in ("0000:c1:00.0", "0000:e1:00.0"):  # a driver reload, a bad read
        (root / "sys/bus/pci/devices" / address).unlink()
    out = ctx.run(ctx.on.update_status(), testing.State(
        config=config, relations=good.relations, resources=good.resources,
        stored_states=good.stored_states))
    assert ours(out) == before
    assert out.unit_status == testing.BlockedStatus(
        "published vGPU devices missing: 0000:c1:00.0, 0000:e1:00.0 (no NVIDIA GPU found now: "
        "driver reloading? check lspci and journalctl -k); keeping nvidia-108 on 1, nvidia-109 on 1; "
        "removed for good? juju run nova-compute-nvidia-vgpu/0 forget-gpus "
        "gpus=0000:c1:00.0,0000:e1:00.0")


def test_an_unreadable_nova_version_blocks_the_unit_saying_so(root, tools, tmp_path):
    host = v100_host(root)
    host.nova("3:garbage")
    ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
    out = ctx.run(ctx.on.update_status(), testing.State(relations=[testing.SubordinateRelation("nova-vgpu")],
                      resources={testing.Resource(name="nvidia-vgpu-software",
                                                  path=debs.empty(tmp_path))}))
    assert out.unit_status == testing.BlockedStatus(
        "cannot read Nova's release from version '3:garbage'")


# -- one GPU of several vanishes (issue 15, item 4) -------------------------------

C1, E1 = "0000:c1:00.0", "0000:e1:00.0"
E1_MISSING = (
    "published vGPU devices missing: 0000:e1:00.0 (1 NVIDIA GPU found now: driver reloading? "
    "check lspci and journalctl -k); keeping {kept}; removed for good? juju run "
    "nova-compute-nvidia-vgpu/0 forget-gpus gpus=0000:e1:00.0")


def vanish_gpu(root, address):
    """The GPU falls off the bus; returns what brings it back (its sysfs link)."""
    link = root / "sys/bus/pci/devices" / address
    target = os.readlink(link)
    link.unlink()
    return lambda: link.symlink_to(target)


def after(out, config=None):
    return testing.State(config=dict(out.config) if config is None else config,
                         relations=out.relations, resources=out.resources,
                         stored_states=out.stored_states)


def mdev_sections(out):
    """nova-compute's view of the mdev sections, checked as novaconf checks what it builds."""
    sections = principal.nova_context(ours(out))["sections"]
    novaconf.check(sections)
    served = novaconf.mapping_from_sections(sections)
    everywhere = [a for addresses in served.values() for a in addresses]
    assert len(everywhere) == len(set(everywhere))  # Nova: no address under two types
    return served


@pytest.mark.parametrize("mapping", ["{nvidia-108: all}", "{nvidia-108: [c1:00.0, e1:00.0]}"])
def test_one_v100_vanishing_keeps_its_device_addresses(ctx, ready, root, mapping):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": mapping},
                                                   resource=ready))
    published = ours(first)["subordinate_configuration"]
    vanish_gpu(root, E1)
    out = ctx.run(ctx.on.update_status(), after(first))
    assert ours(out)["subordinate_configuration"] == published  # byte for byte
    assert mdev_sections(out) == {"nvidia-108": (C1, E1)}
    assert out.unit_status == testing.BlockedStatus(E1_MISSING.format(kept="nvidia-108 on 2"))


@pytest.mark.parametrize("mapping", ["{nvidia-109: all}",
                                     "{nvidia-109: [c1:00.0], nvidia-107: [e1:00.0]}"])
def test_a_new_mapping_reaches_the_present_v100_while_the_missing_one_keeps_its_type(
        ctx, ready, root, mapping):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                   resource=ready))
    vanish_gpu(root, E1)
    out = ctx.run(ctx.on.config_changed(), after(first, {"vgpu-device-mappings": mapping}))
    assert mdev_sections(out) == {"nvidia-108": (E1,), "nvidia-109": (C1,)}
    assert nova_conf(out) == (
        "[devices]\nenabled_mdev_types = nvidia-108,nvidia-109\n"
        "[mdev_nvidia-108]\ndevice_addresses = 0000:e1:00.0\n"
        "[mdev_nvidia-109]\ndevice_addresses = 0000:c1:00.0\n")
    assert out.unit_status == testing.BlockedStatus(
        E1_MISSING.format(kept="nvidia-108 on 1, nvidia-109 on 1"))


def test_an_absent_address_never_published_is_still_refused(ctx, ready, root):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                   resource=ready))
    published = ours(first)["subordinate_configuration"]
    vanish_gpu(root, E1)
    out = ctx.run(ctx.on.config_changed(), after(
        first, {"vgpu-device-mappings": "{nvidia-109: [c1:00.0], nvidia-107: [a1:00.0]}"}))
    assert ours(out)["subordinate_configuration"] == published  # refused: nothing changed
    assert mdev_sections(out) == {"nvidia-108": (C1, E1)}


def test_a_guest_on_the_vanished_v100_keeps_its_type_and_holds_up_only_type_changes(
        ctx, ready, v100, root):
    from unit_tests.libvirt import defined_guest
    mdev = "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f"
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                   resource=ready))
    v100.add_mdev(E1, "nvidia-108", mdev)
    defined_guest(root, "instance-0000002b", "3d9f1c52-2a7e-4b5e-8f3a-1c2d3e4f5a6b",
                  mdev_uuid=mdev)
    vanish_gpu(root, E1)
    (root / "sys/bus/mdev/devices" / mdev).unlink()  # its mdevs went with it
    out = ctx.run(ctx.on.update_status(), after(first))
    assert mdev_sections(out) == {"nvidia-108": (C1, E1)}  # nothing taken: no guest consulted
    assert out.unit_status == testing.BlockedStatus(E1_MISSING.format(kept="nvidia-108 on 2"))
    # A type taken from the present GPU waits: the guest's mdev could be anywhere.
    out = ctx.run(ctx.on.config_changed(), after(out, {"vgpu-device-mappings": "{nvidia-109: all}"}))
    assert mdev_sections(out) == {"nvidia-108": (C1, E1)}
    assert out.unit_status.message.startswith(
        "vgpu-device-mappings not applied: instance-0000002b")
    assert "holds mdev 5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f, which is not on this host now" in (
        out.unit_status.message)


def test_forget_gpus_drops_a_vanished_v100_and_refuses_a_present_one(ctx, ready, root):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                   resource=ready))
    vanish_gpu(root, E1)
    kept = ctx.run(ctx.on.update_status(), after(first))
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("forget-gpus", params={"gpus": "c1:00.0"}), after(kept))
    assert failure.value.message == (
        "nothing forgotten: 0000:c1:00.0 is on this host; a GPU present is changed through "
        "vgpu-device-mappings")
    assert mdev_sections(kept) == {"nvidia-108": (C1, E1)}
    out = ctx.run(ctx.on.action("forget-gpus", params={"gpus": "e1:00.0"}), after(kept))
    assert ctx.action_results == {"forgotten": E1}
    assert mdev_sections(out) == {"nvidia-108": (C1,)}
    assert out.unit_status == testing.ActiveStatus(
        "1 GPU (Tesla V100 PCIe 16GB), nvidia-108 on 1; nvidia-108: 0 used, 2 free")
    later = ctx.run(ctx.on.update_status(), after(out))
    assert mdev_sections(later) == {"nvidia-108": (C1,)}
    assert later.unit_status == out.unit_status
    assert ctx.action_logs == [f"dropping the published devices of {E1}",
                               "publishing to nova-compute"]


def test_forget_gpus_refuses_an_address_nothing_published_is_missing_on(ctx, ready, root):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                   resource=ready))
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("forget-gpus", params={"gpus": "a1:00.0"}), after(first))
    assert failure.value.message == (
        "nothing forgotten: 0000:a1:00.0 is no GPU whose published devices are missing "
        "(missing: none)")
    assert mdev_sections(first) == {"nvidia-108": (C1, E1)}


def test_a_v100_coming_back_is_published_as_the_mapping_says_and_the_unit_is_active(
        ctx, ready, root):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                   resource=ready))
    come_back = vanish_gpu(root, E1)
    kept = ctx.run(ctx.on.config_changed(), after(first, {"vgpu-device-mappings": "{nvidia-109: all}"}))
    assert mdev_sections(kept) == {"nvidia-108": (E1,), "nvidia-109": (C1,)}
    come_back()
    out = ctx.run(ctx.on.update_status(), after(kept))
    assert mdev_sections(out) == {"nvidia-109": (C1, E1)}
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), nvidia-109 on 2; nvidia-109: 0 used, 2 free")


def test_hostile_bytes_in_host_files_never_reach_the_status_or_results(ctx, ready, v100, root):
    gpu = (root / "sys/bus/pci/devices/0000:c1:00.0").resolve()
    (gpu / "device").write_bytes(b"0x1db4\x00\xff\n")
    (gpu / "mdev_supported_types/nvidia-108/name").write_bytes(b"GRID V100-8Q\x00\x1b[2J\n")
    v100.loaded_driver("570.158.02\x00")
    (root / "proc/cmdline").write_bytes(b"BOOT_IMAGE=/vmlinuz\x00\xff ro\n")
    out = ctx.run(ctx.on.update_status(), state({"vgpu-device-mappings": "{nvidia-108: [e1:00.0]}"},
                                                resource=ready))
    message = out.unit_status.message
    assert message.isprintable() and "\x00" not in message
    assert all("\x00" not in v and v.isprintable() for v in ours(out).values())
    ctx.run(ctx.on.action("list-vgpu-types"), state(resource=ready))
    assert "\x00" not in json.dumps(ctx.action_results) and "\x1b" not in json.dumps(ctx.action_results)


def loop(path):
    """Make ``path`` a symlink to itself: reading it fails with ELOOP, even as root."""
    import shutil
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.symlink_to(path.name)


def test_an_unreadable_pci_device_list_blocks_naming_it_and_keeps_the_sections(ctx, ready, root):
    config = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}
    good = ctx.run(ctx.on.config_changed(), state(config, resource=ready))
    before = ours(good)
    (root / "sys/bus/pci/devices").rename(root / "sys/bus/pci/devices.saved")
    loop(root / "sys/bus/pci/devices")
    out = ctx.run(ctx.on.update_status(), testing.State(
        config=config, relations=good.relations, resources=good.resources,
        stored_states=good.stored_states))
    assert out.unit_status == testing.BlockedStatus(
        "cannot read /sys/bus/pci/devices: Too many levels of symbolic links")
    assert ours(out) == before
    with pytest.raises(testing.ActionFailed, match="cannot read /sys/bus/pci/devices"):
        ctx.run(ctx.on.action("list-vgpu-types"), state(resource=ready))


def test_an_unreadable_module_version_is_logged_and_blocks_nothing(ctx, ready, root):
    # The modules loaded are known (/proc/modules): only the version check is skipped.
    loop(root / "sys/module/nvidia/version")
    out = ctx.run(ctx.on.update_status(), state(resource=ready))
    assert ("WARNING", "cannot read /sys/module/nvidia/version: Too many levels of symbolic links") in [
        (line.level, line.message) for line in ctx.juju_log]
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), no vGPU type mapped: set vgpu-device-mappings")


def test_an_unreadable_dpkg_status_blocks_naming_it(ctx, v100, root, packages):
    (root / "var/lib/dpkg/status").unlink()
    (root / "var/lib/dpkg/status").mkdir()
    out = ctx.run(ctx.on.update_status(), state(resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus("cannot read /var/lib/dpkg/status: Is a directory")


def test_an_unreadable_driver_file_list_blocks_naming_it(ctx, ready, root):
    listed = root / "var/lib/dpkg/info/nvidia-vgpu-ubuntu-570.list"
    loop(listed)
    out = ctx.run(ctx.on.update_status(), state(resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        "cannot read /var/lib/dpkg/info/nvidia-vgpu-ubuntu-570.list: Too many levels of symbolic links")


def test_an_unreadable_mdev_type_list_lets_no_unverified_type_through(ctx, ready, root):
    types = (root / "sys/bus/pci/devices/0000:c1:00.0").resolve() / "mdev_supported_types"
    loop(types)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-999: [c1:00.0]}"},
                                                 resource=ready))
    assert out.unit_status == testing.BlockedStatus(
        "cannot read /sys/bus/pci/devices/0000:c1:00.0/mdev_supported_types: "
        "Too many levels of symbolic links")
    assert "nvidia-999" not in nova_conf(out)


# -- hook cost: what a steady hook skips, and what is still noticed on the next hook ----------

@pytest.fixture
def fetches(monkeypatch):
    """Each resource-get the charm makes (a hook tool, so a process, under real Juju)."""
    import ops

    calls = []
    real = ops.model.Resources.fetch

    def fetch(self, name):
        calls.append(name)
        return real(self, name)

    monkeypatch.setattr(ops.model.Resources, "fetch", fetch)
    return calls


def carried(out: testing.State, **changes) -> testing.State:
    """The next hook's state: what Juju keeps (relations, stored state, resources), ``changes`` applied."""
    kwargs = {"config": out.config, "relations": out.relations, "resources": out.resources,
              "stored_states": out.stored_states}
    kwargs.update(changes)
    return testing.State(**kwargs)


def test_a_steady_update_status_starts_only_the_service_check(ctx, ready, tools, fetches):
    config = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}
    tools.log_programs()
    first = ctx.run(ctx.on.config_changed(), state(config, resource=ready))
    assert fetches == ["nvidia-vgpu-software"]  # no record yet: inspected once
    assert [c.split()[:2] for c in tools.calls() if c.startswith("dpkg")] == [
        ["dpkg", "--print-architecture"], ["dpkg-deb", "--field"]]
    tools.log.write_text("")
    fetches.clear()
    for event in (ctx.on.update_status(), ctx.on.config_changed()):
        out = ctx.run(event, carried(first))
        assert out.unit_status.name == "active"
        assert ours(out) == ours(first)
    # One program per hook, the service check; no resource-get.
    assert tools.calls() == [f"systemctl is-active {MGR} {VGPUD}"] * 2
    assert fetches == []


def test_a_newly_attached_resource_is_noticed_at_upgrade_charm(ctx, ready, packages, fetches):
    first = ctx.run(ctx.on.config_changed(), state(resource=ready))
    assert "attached" not in first.unit_status.message
    newer = {testing.Resource(name="nvidia-vgpu-software", path=packages["new"])}
    # Juju announces a new revision with upgrade-charm; other hooks keep what it said.
    steady = ctx.run(ctx.on.update_status(), carried(first, resources=newer))
    assert "attached" not in steady.unit_status.message
    fetches.clear()
    out = ctx.run(ctx.on.upgrade_charm(), carried(steady))
    assert fetches == ["nvidia-vgpu-software"]
    assert out.unit_status.message.endswith(
        "driver 570.158.02 installed, 570.172.08 attached: run the upgrade action")
    # ... and the hooks after it still say so without fetching it again.
    fetches.clear()
    out = ctx.run(ctx.on.update_status(), carried(out))
    assert fetches == []
    assert out.unit_status.message.endswith("570.172.08 attached: run the upgrade action")


def test_a_resource_attached_while_the_boot_step_holds_the_host_is_noticed_all_the_same(
        ctx, ready, packages, fetches, monkeypatch):
    """upgrade-charm waits for the host lock in vain: the resource is Juju's, inspected anyway."""
    from vgpu import hostlock, reconcile

    first = ctx.run(ctx.on.config_changed(), state(resource=ready))
    newer = {testing.Resource(name="nvidia-vgpu-software", path=packages["new"])}
    monkeypatch.setattr(hostlock, "HOOK_WAIT", 0.1)
    fetches.clear()
    with hostlock.held(0):  # as the boot step holds it while it restores after a reboot
        busy = ctx.run(ctx.on.upgrade_charm(), carried(first, resources=newer))
    assert busy.unit_status == testing.WaitingStatus(reconcile.BUSY)
    assert fetches == ["nvidia-vgpu-software"]
    out = ctx.run(ctx.on.update_status(), carried(busy))
    assert out.unit_status.message.endswith(
        "driver 570.158.02 installed, 570.172.08 attached: run the upgrade action")

def test_a_resource_detached_to_charmhubs_placeholder_is_noticed_at_upgrade_charm(ctx, ready,
                                                                                  packages):
    first = ctx.run(ctx.on.config_changed(), state(resource=ready))
    empty = {testing.Resource(name="nvidia-vgpu-software", path=packages["empty"])}
    out = ctx.run(ctx.on.upgrade_charm(), carried(first, resources=empty))
    # The installed driver keeps working: nothing blocks, and nothing is noted as attached.
    assert out.unit_status.name == "active" and "attached" not in out.unit_status.message
    with pytest.raises(testing.ActionFailed, match="resource is empty"):
        ctx.run(ctx.on.action("upgrade"), carried(out))


@pytest.mark.parametrize("attached,kind", [("empty", "active"), ("garbage", "blocked")])
def test_an_empty_or_unusable_resource_is_not_fetched_again_while_the_driver_runs(
        ctx, ready, packages, fetches, attached, kind):
    first = ctx.run(ctx.on.install(), state(resource=packages[attached]))
    assert fetches == ["nvidia-vgpu-software"]
    fetches.clear()
    out = ctx.run(ctx.on.update_status(), carried(first))
    assert fetches == []  # what the install hook learnt answers
    assert out.unit_status == first.unit_status
    assert out.unit_status.name == kind  # the installed driver serves; a broken file is named


def test_a_driver_left_half_configured_later_is_retried_with_the_attached_package(
        ctx, v100, root, tools, packages, fetches):
    first = ctx.run(ctx.on.install(), state(resource=packages["new"]))
    v100.loaded_driver(debs.NEW)
    first = ctx.run(ctx.on.update_status(), carried(first))
    assert first.unit_status.name == "active"
    fetches.clear()
    half_configured(root, debs.NEW)  # dpkg killed outside the charm (unattended-upgrades, a person)
    out = ctx.run(ctx.on.update_status(), carried(first))
    assert fetches == ["nvidia-vgpu-software"]  # not fully installed: the package is fetched
    assert debs.dpkg_query(root) == f"install ok installed {debs.NEW}"
    assert out.unit_status.name == "active"


def test_the_upgrade_action_inspects_the_resource_it_installs(ctx, ready, root, packages, fetches):
    first = ctx.run(ctx.on.config_changed(), state(resource=ready))
    newer = {testing.Resource(name="nvidia-vgpu-software", path=packages["new"])}
    fetches.clear()
    out = ctx.run(ctx.on.action("upgrade"), carried(first, resources=newer))
    assert fetches == ["nvidia-vgpu-software"]
    assert debs.dpkg_query(root) == f"install ok installed {debs.NEW}"
    assert ctx.action_results["version"] == debs.NEW
    kept = out.get_stored_state("_stored", owner_path="NovaComputeNvidiaVgpuCharm").content
    assert kept["attached"]["version"] == debs.NEW


def test_a_steady_hook_writes_nothing_to_the_relation(ctx, ready):
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    published = [line.message for line in ctx.juju_log if line.message.startswith("publishing ")]
    assert published == ["publishing releases-packages-map, services, subordinate_configuration "
                         "on nova-vgpu"]
    ctx.run(ctx.on.update_status(), carried(first))
    again = [line.message for line in ctx.juju_log if line.message.startswith("publishing ")]
    assert again == published  # nothing new: unchanged keys are not set again
    ctx.run(ctx.on.config_changed(),
            carried(first, config={"vgpu-device-mappings": "{nvidia-109: [e1:00.0]}"}))
    last = [line.message for line in ctx.juju_log if line.message.startswith("publishing ")]
    assert last == published + ["publishing subordinate_configuration on nova-vgpu"]


def test_a_changed_mapping_is_republished_on_the_next_steady_hook(ctx, ready, tools):
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    changed = carried(first, config={"vgpu-device-mappings": "{nvidia-109: [e1:00.0]}"})
    out = ctx.run(ctx.on.update_status(), changed)
    assert nova_conf(out) == ("[devices]\nenabled_mdev_types = nvidia-109\n"
                              "[mdev_nvidia-109]\ndevice_addresses = 0000:e1:00.0\n")


def test_a_gpu_added_is_published_on_the_next_steady_hook_and_one_gone_when_forgotten(
        ctx, ready, v100, root):
    from unit_tests.fakehost import V100_TYPES
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: all}"}, resource=ready))
    assert "device_addresses = 0000:c1:00.0,0000:e1:00.0\n" in nova_conf(first)
    v100.add_gpu("0000:a1:00.0", device="0x1db4", class_code="0x030200", mdev_types=V100_TYPES)
    out = ctx.run(ctx.on.update_status(), carried(first))
    assert "device_addresses = 0000:a1:00.0,0000:c1:00.0,0000:e1:00.0\n" in nova_conf(out)
    (root / "sys/bus/pci/devices/0000:c1:00.0").unlink()
    out = ctx.run(ctx.on.update_status(), carried(out))  # gone, maybe for a while: kept
    assert "device_addresses = 0000:a1:00.0,0000:c1:00.0,0000:e1:00.0\n" in nova_conf(out)
    out = ctx.run(ctx.on.action("forget-gpus", params={"gpus": "c1:00.0"}), carried(out))
    assert "device_addresses = 0000:a1:00.0,0000:e1:00.0\n" in nova_conf(out)


# -- guests, running or shut off, keep the mdev types they hold ------------------------------

SHUT_OFF = ("instance-0000002b", "3d9f1c52-2a7e-4b5e-8f3a-1c2d3e4f5a6b")
MDEV_108 = "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f"


@pytest.mark.parametrize("running", [False, True], ids=["shut-off", "running"])
def test_a_type_taken_from_a_gpu_while_a_guest_holds_one_of_its_mdevs_is_refused(
        ctx, ready, v100, root, running):
    from unit_tests.libvirt import defined_guest
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    v100.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_108)
    (running_guest if running else defined_guest)(root, *SHUT_OFF, mdev_uuid=MDEV_108)
    out = ctx.run(ctx.on.config_changed(),
                  carried(first, config={"vgpu-device-mappings": "{nvidia-109: [c1:00.0]}"}))
    state_word = "" if running else ", shut off"
    assert out.unit_status == testing.BlockedStatus(
        f"vgpu-device-mappings not applied: {SHUT_OFF[0]} (vm-{SHUT_OFF[0]}, {SHUT_OFF[1]}"
        f"{state_word}) holds an nvidia-108 mdev ({MDEV_108}) on GPU 0000:c1:00.0, which the new "
        "mapping takes away; restore the mapping, or move or delete the instance first; "
        "keeping nvidia-108 on 0000:c1:00.0")
    assert ours(out) == ours(first)
    # Clearing the option takes the type away as well.
    out = ctx.run(ctx.on.config_changed(), carried(first, config={"vgpu-device-mappings": ""}))
    assert out.unit_status.message.startswith(f"vgpu-device-mappings not applied: {SHUT_OFF[0]}")
    assert ours(out) == ours(first)
    # What keeps the guest's type on its GPU goes through.
    out = ctx.run(ctx.on.config_changed(), carried(
        first, config={"vgpu-device-mappings": "{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}"}))
    assert out.unit_status.name == "active"
    assert "[mdev_nvidia-109]\ndevice_addresses = 0000:e1:00.0\n" in nova_conf(out)


def test_a_guest_on_the_other_gpu_does_not_stop_the_change(ctx, ready, v100, root):
    from unit_tests.libvirt import defined_guest
    first = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}"}, resource=ready))
    v100.add_mdev("0000:e1:00.0", "nvidia-109", MDEV_108)
    defined_guest(root, *SHUT_OFF, mdev_uuid=MDEV_108)
    out = ctx.run(ctx.on.config_changed(), carried(
        first, config={"vgpu-device-mappings": "{nvidia-109: [e1:00.0, c1:00.0]}"}))
    assert out.unit_status.name == "active"
    assert nova_conf(out) == ("[devices]\nenabled_mdev_types = nvidia-109\n"
                              "[mdev_nvidia-109]\ndevice_addresses = 0000:c1:00.0,0000:e1:00.0\n")


def test_a_domain_file_that_cannot_be_parsed_stops_a_change_but_not_a_steady_hook(
        ctx, ready, root):
    from unit_tests.libvirt import broken_guest
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    broken_guest(root, "instance-00000009")
    steady = ctx.run(ctx.on.update_status(), carried(first))
    assert steady.unit_status.name == "active"
    out = ctx.run(ctx.on.config_changed(),
                  carried(first, config={"vgpu-device-mappings": "{nvidia-108: [e1:00.0]}"}))
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith(
        "vgpu-device-mappings not applied: /etc/libvirt/qemu/instance-00000009.xml (not XML: ")
    assert out.unit_status.message.endswith("; counted as in use); restore the mapping, or move "
                                            "or delete the instance first; keeping nvidia-108 on "
                                            "0000:c1:00.0")
    assert ours(out) == ours(first)


def test_an_mdev_not_created_since_boot_counts_on_every_gpu(ctx, ready, root):
    from unit_tests.libvirt import defined_guest
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}, resource=ready))
    defined_guest(root, *SHUT_OFF, mdev_uuid=MDEV_108)  # Nova 29 and before: gone at reboot
    out = ctx.run(ctx.on.config_changed(),
                  carried(first, config={"vgpu-device-mappings": "{nvidia-108: [e1:00.0]}"}))
    assert out.unit_status.message.startswith(
        f"vgpu-device-mappings not applied: {SHUT_OFF[0]} (vm-{SHUT_OFF[0]}, {SHUT_OFF[1]}, "
        f"shut off) holds mdev {MDEV_108}, which is not on this host now: its GPU and type are "
        "unknown; ")
    assert ours(out) == ours(first)


def test_on_train_a_type_serves_every_gpu_whatever_the_addresses(ctx, ready, v100, root):
    from unit_tests.libvirt import defined_guest
    v100.nova("2:20.6.1-0ubuntu1")
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: all}"}, resource=ready))
    v100.add_mdev("0000:e1:00.0", "nvidia-108", MDEV_108)
    defined_guest(root, *SHUT_OFF, mdev_uuid=MDEV_108)
    # nova.conf stays the same (Train takes no addresses): nothing is taken from 0000:e1:00.0.
    out = ctx.run(ctx.on.config_changed(),
                  carried(first, config={"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}))
    assert out.unit_status.name == "active"
    assert nova_conf(out) == nova_conf(first) == "[devices]\nenabled_vgpu_types = nvidia-108\n"
    out = ctx.run(ctx.on.config_changed(),
                  carried(first, config={"vgpu-device-mappings": "{nvidia-109: [c1:00.0]}"}))
    assert out.unit_status.message.startswith(
        f"vgpu-device-mappings not applied: {SHUT_OFF[0]} (vm-{SHUT_OFF[0]}, {SHUT_OFF[1]}, "
        f"shut off) holds an nvidia-108 mdev ({MDEV_108}) on GPU 0000:e1:00.0, which")


def test_upgrade_waits_for_the_boot_step_then_installs_nothing(ctx, ready, v100, root, packages,
                                                                monkeypatch):
    """The boot step holds the host lock (here: another process holding it, bounded)."""
    from unit_tests.faketools import host_lock_held
    from vgpu import hostlock

    monkeypatch.setattr(hostlock, "HOOK_WAIT", 0.2)
    with host_lock_held(root / hostlock.FILE), pytest.raises(
            testing.ActionFailed,
            match="not upgraded: /run/nova-compute-nvidia-vgpu/host.lock is held by another process"):
        ctx.run(ctx.on.action("upgrade"), state(resource=packages["new"]))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
