"""The status module on plain inputs: host facts in, (kind, message) pairs out, no ops."""

import subprocess
import sys
from pathlib import Path

import pytest

from vgpu import dpkg, driver, mappings, pci, status
from vgpu.facts import Facts
from vgpu.plan import Plan

L4 = "0000:41:00.0"
NOVA = dpkg.Package("nova-common", "3:29.0.0-0ubuntu1", "all", "install ok installed")
DRIVER = dpkg.Package("nvidia-vgpu-ubuntu-550", "550.90.05", "amd64", "install ok installed")
HALF = DRIVER._replace(status="install ok half-configured")
MODULES = frozenset({"nvidia", "nvidia_vgpu_vfio"})


def deb(package, version):
    return driver.DebInfo(package=package, version=version, path=Path("/var/lib/juju/resource.deb"))


def gpu(address=L4, model="L4", sriov=0, vfs=()):
    return pci.Gpu(address=address, device_id="0x27b8", model=model, driver="nvidia",
                   class_code="0x030200", sriov_totalvfs=sriov, sriov_numvfs=len(vfs), vfs=vfs)


def host(*gpus, driver_package=DRIVER, nova=NOVA, iommu=True):
    packages = {p.name: p for p in (nova, driver_package) if p is not None}
    return Facts(pci=pci.Host(gpus=tuple(gpus)), packages=packages, modules=MODULES,
                 loaded_driver_version="550.90.05", iommu=iommu, driver=driver_package)


def inputs(facts, **changes):
    base = status.Inputs(facts=facts, app="vgpu", unit="vgpu/3", related=True, forced=False,
                         published={},
                         validation=mappings.Validation(mapping={}, plan=Plan()))
    return base._replace(**changes)


def test_never_imports_ops():
    code = "import sys, vgpu.status; print('ops' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd="src")
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("gpus,forced,published,expected", [
    ((), False, {}, False),
    ((), True, {}, True),
    ((), True, {"nvidia-1": (L4,)}, False),
    ((gpu(),), False, {"nvidia-1": (L4,)}, True),
])
def test_checks_host_only_with_gpus_or_forced_without_a_kept_mapping(gpus, forced, published, expected):
    assert status.checks_host(host(*gpus), forced, published) is expected


def test_no_gpu_nothing_to_do_after_the_hooks_problems():
    pairs = status.statuses(inputs(host(), problems=("blacklisting nouveau failed: EROFS",)))
    assert pairs == [("blocked", "blacklisting nouveau failed: EROFS"),
                     ("active", "no NVIDIA GPU on this host: nothing to do")]


def test_gpus_gone_keep_the_published_mapping_and_name_five_missing_addresses():
    addresses = tuple(f"0000:4{n}:00.0" for n in range(5))
    pairs = status.statuses(inputs(host(), published={"nvidia-1": addresses}))
    assert pairs == [("blocked", "published vGPU devices missing: 0000:40:00.0, 0000:41:00.0, "
                                 "0000:42:00.0, 0000:43:00.0 and 1 more (no NVIDIA GPU found now: "
                                 "driver reloading? check lspci and journalctl -k); keeping "
                                 "nvidia-1 on 5; removed for good? juju run vgpu/3 forget-gpus "
                                 "gpus=0000:40:00.0,0000:41:00.0,0000:42:00.0,0000:43:00.0,"
                                 "0000:44:00.0")]


def test_forced_without_gpu_waits_for_nova_and_the_relation():
    pairs = status.statuses(inputs(host(driver_package=None, nova=None), forced=True, related=False))
    assert pairs[:2] == [
        ("waiting", "waiting for nova-compute to install nova-common"),
        ("blocked", "relate to nova-compute: juju integrate nova-compute:nova-vgpu vgpu:nova-vgpu")]
    assert pairs[-1] == ("active", "no NVIDIA GPU (forced), no vGPU type mapped: set vgpu-device-mappings")


def test_nova_too_old_is_blocked():
    old = NOVA._replace(version="2:16.1.0-0ubuntu1")
    pairs = status.statuses(inputs(host(gpu(), nova=old)))
    assert pairs[0][0] == "blocked" and "queens" in pairs[0][1]


def test_iommu_comes_before_the_mapping_error_and_the_error_says_what_is_kept():
    facts = host(gpu(sriov=16, vfs=()), iommu=False)
    bad = mappings.Validation(mapping={}, errors=("first wrong", "second wrong"))
    pairs = status.statuses(inputs(facts, validation=bad, published={"nvidia-1": (L4,)}))
    assert [kind for kind, _ in pairs[:2]] == ["blocked", "blocked"]
    assert pairs[0][1].startswith(f"IOMMU is off but SR-IOV GPU {L4} needs it")
    assert pairs[1][1] == ("vgpu-device-mappings: first wrong (+1 more); "
                           f"keeping nvidia-1 on {L4}")


def test_with_the_iommu_off_missing_vfs_are_not_blamed_on_sriov_manage():
    pairs = status.statuses(inputs(host(gpu(sriov=16), iommu=False)))
    assert [m for _, m in pairs if "virtual functions" in m] == []
    assert pairs[0][1].startswith(f"IOMMU is off but SR-IOV GPU {L4} needs it")


def test_only_selected_gpus_missing_vfs_block_and_refused_ones_say_why():
    gpus = [gpu(address=f"0000:4{n}:00.0", sriov=16) for n in range(3)]
    pairs = status.statuses(inputs(host(*gpus), vf_selected=("0000:41:00.0", "0000:42:00.0"),
                                   vf_refused={"0000:42:00.0": "it is bound to vfio-pci, not nvidia"}))
    assert [p for p in pairs if p[0] == "blocked"] == [
        ("blocked", "SR-IOV GPU 0000:42:00.0 (L4) is bound to vfio-pci, not nvidia: its VFs are left "
                    "alone; bind it to nvidia or leave it out of vgpu-device-mappings"),
        ("blocked", "no virtual functions on SR-IOV GPU 0000:41:00.0 (L4) after sriov-manage -e: "
                    "check journalctl -u nvidia-vgpu-vfs.service and -u nvidia-vgpu-mgr")]


def test_missing_vfs_name_three_gpus_and_the_sriov_manage_failure():
    gpus = [gpu(address=f"0000:4{n}:00.0", sriov=16) for n in range(4)]
    failures = {"0000:40:00.0": "sriov-manage -e 0000:40:00.0 failed: no such device"}
    pairs = status.statuses(inputs(host(*gpus), vf_failures=failures))
    assert ("blocked", "no virtual functions on SR-IOV GPU 0000:40:00.0 (L4), 0000:41:00.0 (L4), "
                       "0000:42:00.0 (L4) and 1 more after sriov-manage -e: "
                       "sriov-manage -e 0000:40:00.0 failed: no such device; the boot step's attempts: "
                           "journalctl -u nvidia-vgpu-vfs.service") in pairs


def test_missing_vfs_without_a_failure_point_at_the_journal():
    pairs = status.statuses(inputs(host(gpu(sriov=16))))
    assert pairs[0] == ("blocked", f"no virtual functions on SR-IOV GPU {L4} (L4) after sriov-manage -e: "
                                   "check journalctl -u nvidia-vgpu-vfs.service and -u nvidia-vgpu-mgr")


def test_missing_vfs_say_nothing_before_the_driver_is_installed():
    pairs = status.statuses(inputs(host(gpu(sriov=16), driver_package=None),
                                   attached_missing="attach the driver"))
    assert pairs == [("blocked", "attach the driver"),
                     ("active", "1 GPU (L4), no vGPU type mapped: set vgpu-device-mappings")]


def test_missing_package_matters_only_while_no_driver_is_installed():
    pairs = status.statuses(inputs(host(gpu()), attached_missing="attach the driver"))
    assert [kind for kind, _ in pairs] == ["active"]


def test_invalid_package_is_blocked_even_with_a_driver_installed():
    pairs = status.statuses(inputs(host(gpu()), attached_invalid="not a vGPU driver"))
    assert pairs[0] == ("blocked", "not a vGPU driver")


@pytest.mark.parametrize("attached,then", [
    (None, "retrying on the next hook"),
    (deb(package=DRIVER.name, version=DRIVER.version), "retrying on the next hook"),
    (deb(package=DRIVER.name, version="550.127.06"),
     "run the upgrade action to install the attached 550.127.06"),
])
def test_half_installed_driver_says_what_happens_next(attached, then):
    pairs = status.statuses(inputs(host(gpu(), driver_package=HALF), attached=attached))
    assert pairs[0] == ("blocked", f"{DRIVER.name} 550.90.05 is half-configured: dpkg did not finish; {then}")


@pytest.mark.parametrize("order,package,note", [
    (1, DRIVER.name, "driver 550.90.05 installed, 550.127.06 attached: run the upgrade action"),
    (0, "nvidia-vgpu-ubuntu-570", "driver 550.90.05 installed, 550.127.06 attached: run the upgrade action"),
    (-1, DRIVER.name, "driver 550.90.05 installed; the attached 550.127.06 is older"),
    (0, DRIVER.name, None),
])
def test_attached_version_notes(order, package, note):
    attached = deb(package=package, version="550.127.06")
    pairs = status.statuses(inputs(host(gpu()), attached=attached, order=order, capacity="x: 1 free"))
    line = "1 GPU (L4), no vGPU type mapped: set vgpu-device-mappings; x: 1 free"
    assert pairs == [("active", f"{line}; {note}" if note else line)]


def test_an_uncomparable_version_is_a_note():
    attached = deb(package=DRIVER.name, version="x1")
    pairs = status.statuses(inputs(host(gpu()), attached=attached, order_error="bad version"))
    assert pairs[-1][1].endswith("; cannot compare the attached driver's version: bad version")


def test_plan_notes_come_before_driver_notes():
    plan = Plan(notes=("nvidia-9 offered by no GPU here",))
    attached = deb(package=DRIVER.name, version="550.127.06")
    pairs = status.statuses(inputs(host(gpu()), validation=mappings.Validation(mapping={}, plan=plan),
                                   attached=attached, order=1, published={"nvidia-1": (L4,)}))
    assert pairs == [("active", "1 GPU (L4), nvidia-1 on 1; nvidia-9 offered by no GPU here; "
                                "driver 550.90.05 installed, 550.127.06 attached: run the upgrade action")]


def test_paused_is_maintenance_and_hides_service_states():
    down = status.Services(down=("nvidia-vgpu-mgr",))
    pairs = status.statuses(inputs(host(gpu()), paused=True, services=down))
    assert pairs[0] == ("maintenance", "paused: vGPU services stopped; juju run vgpu/3 resume to "
                                       "start them")
    assert [kind for kind, _ in pairs] == ["maintenance", "active"]


@pytest.mark.parametrize("package,modules,loaded,expected", [
    # Only an installed driver asks for its module, or for its version to be loaded.
    (HALF, {"nouveau"}, "1.0", ["nouveau is loaded"]),
    (None, {"nouveau"}, None, ["nouveau is loaded"]),
    (None, set(), None, []),
    (DRIVER, {"nvidia"}, "550.90.05", ["nvidia_vgpu_vfio is not loaded"]),
    (DRIVER, MODULES, "550.54.14", ["NVIDIA driver 550.54.14 is loaded, 550.90.05 installed"]),
    (DRIVER, MODULES, "550.90.05", []),
])
def test_reboot_reasons_of_the_host(package, modules, loaded, expected):
    facts = host(gpu(), driver_package=package)._replace(modules=frozenset(modules),
                                                        loaded_driver_version=loaded)
    assert facts.reboot_reasons() == expected


def test_reboot_reasons_are_blocked():
    facts = host(gpu())._replace(modules=frozenset({"nouveau", "nvidia"}))
    pairs = status.statuses(inputs(facts))
    assert ("blocked", "reboot required: nouveau is loaded") in pairs
    assert ("blocked", "reboot required: nvidia_vgpu_vfio is not loaded") in pairs


@pytest.mark.parametrize("answer,masked_by_us,expected", [
    (status.Services(error="systemctl is-active failed: bus"), (),
     ("blocked", "systemctl is-active failed: bus")),
    (status.Services(down=("nvidia-vgpu-mgr",), masked=("nvidia-vgpu-mgr",)), ("nvidia-vgpu-mgr",),
     ("blocked", "nvidia-vgpu-mgr left stopped and masked by this charm's pause that failed: "
                 "juju run vgpu/3 resume")),
    (status.Services(down=("nvidia-vgpu-mgr", "nvidia-vgpud"), masked=("nvidia-vgpu-mgr", "nvidia-vgpud")),
     ("nvidia-vgpu-mgr", "nvidia-vgpud"),
     ("blocked", "nvidia-vgpu-mgr, nvidia-vgpud left stopped and masked by this charm's pause that "
                 "failed: juju run vgpu/3 resume")),
    # nova-compute's pause no longer stops them: masked by anyone else, the guests lost their GPUs.
    (status.Services(down=("nvidia-vgpu-mgr", "nvidia-vgpud"), masked=("nvidia-vgpu-mgr", "nvidia-vgpud")),
     (), ("blocked", "nvidia-vgpu-mgr, nvidia-vgpud stopped and masked outside this charm: "
                     "juju run vgpu/3 resume to unmask and start them")),
    (status.Services(down=("nvidia-vgpu-mgr",), masked=("nvidia-vgpu-mgr",)), (),
     ("blocked", "nvidia-vgpu-mgr stopped and masked outside this charm: juju run vgpu/3 resume "
                 "to unmask and start it")),
    (status.Services(down=("nvidia-vgpu-mgr", "nvidia-vgpud"), masked=("nvidia-vgpu-mgr",)), (),
     ("blocked", "nvidia-vgpu-mgr, nvidia-vgpud not running: check journalctl -u nvidia-vgpu-mgr")),
])
def test_service_states(answer, masked_by_us, expected):
    pairs = status.statuses(inputs(host(gpu()), services=answer, masked_by_us=masked_by_us))
    assert pairs == [expected, ("active", "1 GPU (L4), no vGPU type mapped: set vgpu-device-mappings")]


def test_serving_message_counts_models():
    facts = host(gpu(), gpu(address="0000:42:00.0"), gpu(address="0000:43:00.0", model="A40"))
    line = status.serving_message(inputs(facts, published={"nvidia-1": (L4, "0000:42:00.0")}))
    assert line.startswith("3 GPUs (")
    assert "2 L4" in line and "1 A40" in line and line.endswith("), nvidia-1 on 2")


def test_hints_name_the_application_and_principal_as_deployed():
    facts = host(gpu(), nova=None)
    pairs = status.statuses(inputs(facts, app="gpu-a", principal="compute-gpu", unit="gpu-a/2",
                                   related=False, paused=True))
    assert pairs[:2] == [
        ("waiting", "waiting for compute-gpu to install nova-common"),
        ("blocked", "relate to compute-gpu: juju integrate compute-gpu:nova-vgpu gpu-a:nova-vgpu")]
    assert ("maintenance", "paused: vGPU services stopped; juju run gpu-a/2 resume to start them") \
        in pairs
    assert not [m for _, m in pairs if "nova-compute" in m or "vgpu/3" in m]


def test_without_a_unit_name_the_hint_names_the_action():
    pairs = status.statuses(inputs(host(gpu()), unit="", paused=True))
    assert pairs[0] == ("maintenance", "paused: vGPU services stopped; run the resume action to "
                                       "start them")


def test_placement_reporting_kept_against_the_option_is_a_note_pointing_to_removal():
    plain = status.statuses(inputs(host(gpu()), published={"nvidia-1": (L4,)}))
    kept = status.statuses(inputs(host(gpu()), published={"nvidia-1": (L4,)}, reporting_kept=True))
    assert kept[:-1] == plain[:-1] and kept[-1][0] == "active"
    assert kept[-1][1] == (
        f"{plain[-1][1]}; pci-in-placement is off but [pci] report_in_placement stays True: "
        "Nova refuses to start once it is turned off after devices were reported (README: Removal)")
