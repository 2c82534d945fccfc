"""The charm at the edges the other tests leave.

The upgrade action's cases, the exact wording of status messages, YAML null,
single-type GPUs and framebuffer units.

Each test runs the real charm with ops.testing on a host tree and checks what the
operator sees: the unit status, action results, dpkg's answer, and the relation
data as nova-compute reads it with charmhelpers.
"""

import pytest
from ops import testing

from unit_tests import debs, principal
from unit_tests.fakehost import FakeHost, MdevType, empty_host, v100_host
from unit_tests.libvirt import running_guest
from unit_tests.test_charm import install_driver, ours, state
from unit_tests.test_charm import nova_conf as published

MGR = "nvidia-vgpu-mgr"
VGPUD = "nvidia-vgpud"
OPTION = "vgpu-device-mappings"
GUEST = ("instance-0000002a", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1")
MDEV_UUID = "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f"


# -- the upgrade action -----------------------------------------------------------------

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


# -- status wording ---------------------------------------------------------------------

@pytest.fixture
def ready(v100, root, packages):
    install_driver(root, packages["old"])
    return packages["old"]


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
                                       'address like 0000:c1:00.0; keeping nvidia-108 on 1')


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
    conf = published(out)
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
