"""VFs at every boot: sriov-manage, the systemd unit, the learnt VFIO type names."""

import json
import os
import time

import pytest

from unit_tests.fakehost import FakeHost, a100_host, l40s_host
from unit_tests.faketools import running, stand_in
from vgpu import catalogue, mappings, pci, plan, releases, services, sriov
from vgpu.errors import SriovError


def test_sriov_manage_creates_the_vfs_and_its_calls_are_recorded(root, tools):
    host = a100_host(root, enabled=False)
    host.install_sriov_manage()
    assert pci.discover().gpus[0].vfs_missing
    assert sriov.enable(["0000:41:00.0"]) == {}
    gpu = pci.discover().gpus[0]
    assert len(gpu.vfs) == 16 and not gpu.vfs_missing and gpu.framework == pci.MDEV
    assert tools.calls() == ["sriov-manage -e 0000:41:00.0"]


def test_sriov_manage_failures_are_one_line_each(root, tools):
    host = l40s_host(root, enabled=False)
    assert sriov.enable(["0000:81:00.0"]) == {
        "0000:81:00.0": "/usr/lib/nvidia/sriov-manage not found (is the vGPU host driver installed?)"}
    host.install_sriov_manage()
    host.fail_sriov_manage("0000:c1:00.0")
    assert sriov.enable(["0000:81:00.0", "0000:c1:00.0"]) == {
        "0000:c1:00.0": "sriov-manage -e 0000:c1:00.0 failed: Enabling VFs on 0000:c1:00.0 failed: "
                        "Input/output error"}
    (root / sriov.SRIOV_MANAGE).chmod(0o644)
    assert sriov.enable(["0000:c1:00.0"])["0000:c1:00.0"].startswith(
        "sriov-manage -e 0000:c1:00.0 could not run: Permission denied")


def test_a_failure_said_on_stdout_is_named(root, tools):
    l40s_host(root, enabled=False)
    stand_in(root / sriov.SRIOV_MANAGE, '#!/bin/sh\necho "Cannot enable VFs on $2: device busy"\nexit 1\n')
    assert sriov.enable(["0000:c1:00.0"]) == {
        "0000:c1:00.0": "sriov-manage -e 0000:c1:00.0 failed: Cannot enable VFs on 0000:c1:00.0: "
                        "device busy"}


def test_the_boot_data_keeps_the_selected_gpus_and_each_vfs_profile_by_name(root):
    host = l40s_host(root)
    host.add_gpu("0000:e1:00.0")  # a V100: no SR-IOV, never selected
    found = pci.discover()
    epoxy = releases.from_major(31)
    mapping = mappings.check_text("{L40S-24Q: ['81:00.0']}").mapping
    built = plan.build(mapping, found, epoxy)
    choice = sriov.selected(mapping, found)
    assert choice.wanted == ("0000:81:00.0",) and not choice.refused
    assert sriov.boot_data(found, built, choice.wanted, ["nvidia-vgpu-mgr"]) == {
        "version": 1, "wait_for": ["nvidia-vgpu-mgr"],
        "gpus": [{"address": "0000:81:00.0", "model": "L40S",
                  "vfs": [{"index": 0, "name": "NVIDIA L40S-24Q", "number": 1141},
                          {"index": 1, "name": "NVIDIA L40S-24Q", "number": 1141}]}]}
    assert sriov.write_boot_data({"version": 1}) is True
    assert sriov.write_boot_data({"version": 1}) is False  # unchanged: not written again


def test_all_selects_sriov_gpus_bound_to_nvidia_and_addresses_select_their_gpu(root):
    host = l40s_host(root, enabled=False)
    host.add_gpu("0000:e1:00.0")  # a V100: no SR-IOV
    found = pci.discover()
    assert sriov.selected({"L40S-12Q": ("all",)}, found).wanted == ("0000:81:00.0", "0000:c1:00.0")
    assert sriov.selected({}, found) == sriov.Selection()
    # Before the VFs exist, a VF address selects the GPU without VFs on its bus.
    assert sriov.selected({"L40S-12Q": ("0000:81:00.6",)}, found).wanted == ("0000:81:00.0",)
    assert sriov.selected({"L40S-12Q": ("0000:82:00.4", "0000:e1:00.0")}, found).wanted == ()
    # Left unbound (a failed sriov-manage run): still ours, bound to nvidia again before its run.
    (root / "sys/bus/pci/devices/0000:c1:00.0/driver").unlink()
    found = pci.discover()
    assert sriov.selected({"x": ("all",)}, found) == sriov.Selection(
        ("0000:81:00.0", "0000:c1:00.0"), {})
    assert sriov.selected({"x": ("0000:c1:00.0",)}, found) == sriov.Selection(("0000:c1:00.0",))
    # Given to vfio-pci on purpose (whole-GPU passthrough): left alone, by name or by all.
    host.add_gpu("0000:d1:00.0", device="0x26b9", totalvfs=32, driver="vfio-pci")
    found = pci.discover()
    assert "0000:d1:00.0" not in sriov.selected({"x": ("all",)}, found).addresses
    assert sriov.selected({"x": ("0000:d1:00.0",)}, found).refused == {
        "0000:d1:00.0": "it is bound to vfio-pci, not nvidia"}
    # Two GPUs without VFs on one bus: a VF address there cannot tell which; neither.
    host.add_gpu("0000:a1:00.0", device="0x26b9", totalvfs=32)
    host.add_gpu("0000:a1:00.1", device="0x26b9", totalvfs=32)
    assert sriov.selected({"L40S-12Q": ("0000:a1:00.4",)}, pci.discover()).wanted == ()
    assert sriov.selected({"L40S-12Q": ("0000:a1:00.1",)}, pci.discover()).wanted == ("0000:a1:00.1",)


def test_the_unit_says_what_the_boot_step_does_and_advises_no_gpu_reset():
    """What an operator reads in /etc/systemd/system: VFs first, MIG mode on, no reset.

    A GPU reset is refused once sriov-manage turned persistence mode on
    (NVIDIA/NVSentinel issue 1690): the boot step never runs one (vgpu.miginstances.at_boot).
    """
    comments = " ".join(line.lstrip("# ") for line in sriov.render_unit().splitlines()
                        if line.startswith("#"))
    assert "nvidia-smi -r" not in comments and "reset" not in comments
    assert comments.index("enables the VFs") < comments.index("MIG mode")


def test_the_unit_is_written_and_enabled_only_when_it_changes(root, tools):
    assert sriov.ensure_unit("[Unit]\n") is True
    assert sriov.ensure_unit("[Unit]\n") is False
    assert tools.calls() == ["systemctl daemon-reload", f"systemctl enable {sriov.UNIT}"]
    assert (root / "etc/systemd/system/nvidia-vgpu-vfs.service").read_text() == "[Unit]\n"
    assert sriov.remove_unit() is True and sriov.remove_unit() is False
    sriov.unit_path().symlink_to("/dev/null")  # the operator's mask
    assert sriov.unit_masked() is True
    assert sriov.ensure_unit("[Unit]\n") is False
    assert sriov.remove_unit() is False
    assert str(sriov.unit_path().readlink()) == "/dev/null"
    assert tools.calls()[2:] == [f"systemctl stop {sriov.UNIT}", f"systemctl disable {sriov.UNIT}",
                                 "systemctl daemon-reload"]


def test_type_names_are_learnt_per_model_and_driver_version(root):
    l40s_host(root)
    found = pci.discover()
    table = catalogue.learn(found, "570.158.02")
    assert table["0x26b9 570.158.02"]["1142"] == "NVIDIA L40S-48Q"
    assert table["0x2335 570.158.02"]["1284"] == "NVIDIA H200X-141C"
    saved = json.loads((root / catalogue.FILE).read_text())
    assert saved == table
    # Another driver release may number types differently: learnt separately, the old kept.
    again = catalogue.learn(found, "580.65.05")
    assert set(again) == {"0x26b9 570.158.02", "0x2335 570.158.02",
                          "0x26b9 580.65.05", "0x2335 580.65.05",
                          # each model's whole framebuffer, listed while no VF held a type
                          "0x26b9 whole GPU", "0x2335 whole GPU"}
    assert again["0x26b9 whole GPU"] == {"framebuffer-gb": "48"}
    catalogue.forget()
    assert catalogue.load() == {}


def test_an_unreadable_catalogue_is_relearnt(root):
    l40s_host(root)
    path = root / catalogue.FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("{not json")
    assert catalogue.load() == {}
    assert "0x26b9 x" in catalogue.learn(pci.discover(), "x")


def test_vfs_that_offer_nothing_are_named(root):
    host = FakeHost(root)
    host.add_gpu("0000:41:00.0", device="0x20f1", totalvfs=16)
    host.add_vf("0000:41:00.0", 0, "0000:41:00.4", driver="vfio-pci")
    built = plan.build({"nvidia-474": ("0000:41:00.0",)}, pci.discover(), releases.from_major(29))
    assert built.errors == (
        "nvidia-474: the virtual functions of GPU 0000:41:00.0 (NVIDIA 0x20f1) offer no vGPU types "
        "(are they bound to the nvidia driver, nvidia-vgpu-mgr running?)",)


def test_a_catalogue_that_cannot_be_saved_is_only_logged(root, caplog):
    l40s_host(root)
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    (root / catalogue.STATE_DIR).write_text("a file where a directory belongs")
    table = catalogue.learn(pci.discover(), "570.158.02")
    assert table["0x26b9 570.158.02"]["1139"] == "NVIDIA L40S-12Q"  # still used in this hook
    assert "cannot save learnt vGPU types" in caplog.text


def test_the_learnt_types_are_saved_or_the_reason_logged(root, caplog):
    import logging

    from vgpu import catalogue

    caplog.set_level(logging.INFO, logger="vgpu.catalogue")
    target = root / catalogue.FILE
    catalogue.save({"0x26b9 570.158.02": {"1139": "NVIDIA L40S-12Q"}})
    assert f"learnt vGPU types saved to {target}" in caplog.messages
    target.unlink()
    target.parent.rmdir()
    target.parent.write_text("")  # its directory is a file: nothing can be written below it
    catalogue.save({"0x26b9 570.158.02": {"1139": "NVIDIA L40S-12Q"}})
    assert caplog.messages[-1] == f"cannot save learnt vGPU types to {target}: Not a directory"


# -- sriov-manage and systemctl for the boot unit: bounded in time -----------------------

def test_a_hanging_sriov_manage_is_stopped_with_what_it_started(root, tools, tmp_path, monkeypatch):
    a100_host(root, enabled=False)
    pidfile = tmp_path / "child.pid"
    stand_in(root / sriov.SRIOV_MANAGE, f"#!/bin/sh\nsleep 300 &\necho $! > {pidfile}\nwait\n")
    monkeypatch.setattr(sriov, "TIMEOUT", 1)
    assert sriov.enable(["0000:41:00.0"]) == {
        "0000:41:00.0": "sriov-manage -e 0000:41:00.0 timed out after 1s and was stopped"}
    assert not running(int(pidfile.read_text()))


def test_sriov_manage_failing_silently_still_says_how(root, tools):
    a100_host(root, enabled=False)
    stand_in(root / sriov.SRIOV_MANAGE, "#!/bin/sh\nexit 3\n")
    assert sriov.enable(["0000:41:00.0"]) == {
        "0000:41:00.0": "sriov-manage -e 0000:41:00.0 failed: exit status 3"}


def test_sriov_manage_runs_in_the_c_locale(root, tools, tmp_path, monkeypatch):
    a100_host(root, enabled=False)
    seen = tmp_path / "env"
    stand_in(root / sriov.SRIOV_MANAGE, f"#!/bin/sh\necho \"$LC_ALL\" > {seen}\n")
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    assert sriov.enable(["0000:41:00.0"]) == {}
    assert seen.read_text() == "C\n"


def test_a_hanging_systemctl_fails_the_unit_install_saying_so(root, tools, monkeypatch):
    systemctl = tools.bin / "systemctl"
    systemctl.write_text("#!/bin/sh\nsleep 300 & wait\n")
    monkeypatch.setattr(services, "SWITCH_TIMEOUT", 1)
    with pytest.raises(SriovError) as error:
        sriov.ensure_unit("[Unit]\n")
    assert str(error.value) == "systemctl daemon-reload timed out after 1s and was stopped"
    assert not os.path.exists(sriov.unit_path())  # as it was: the next hook tries it all again


def test_a_unit_systemctl_would_not_enable_is_put_back_as_it_was(root, tools):
    assert sriov.ensure_unit("[Unit]\n# before\n")
    tools.fail("enable", sriov.UNIT)
    with pytest.raises(SriovError, match=f"systemctl enable {sriov.UNIT} failed"):
        sriov.ensure_unit("[Unit]\n# after\n")
    assert sriov.unit_path().read_text() == "[Unit]\n# before\n"
    (tools.state / f"{sriov.UNIT}.fail-enable").unlink()
    assert sriov.ensure_unit("[Unit]\n# after\n")  # not skipped as written already
    assert tools.calls()[-1] == f"systemctl enable {sriov.UNIT}"


def test_one_gpu_whose_sriov_manage_hangs_does_not_stop_the_next(root, tools, tmp_path, monkeypatch):
    l40s_host(root, enabled=False)
    done = tmp_path / "enabled"
    stand_in(root / sriov.SRIOV_MANAGE,
             f"#!/bin/sh\n[ \"$2\" = 0000:81:00.0 ] && exec sleep 300\necho \"$2\" >> {done}\n")
    monkeypatch.setattr(sriov, "TIMEOUT", 1)
    assert sriov.enable(["0000:81:00.0", "0000:c1:00.0"]) == {
        "0000:81:00.0": "sriov-manage -e 0000:81:00.0 timed out after 1s and was stopped"}
    assert done.read_text() == "0000:c1:00.0\n"


def test_every_sriov_manage_run_of_a_hook_fits_in_its_budget(root, tools, tmp_path):
    l40s_host(root, enabled=False)
    tried = tmp_path / "tried"
    stand_in(root / sriov.SRIOV_MANAGE, f'#!/bin/sh\necho "$2" >> {tried}\nexec sleep 300\n')
    started = time.monotonic()
    failures = sriov.enable(["0000:81:00.0", "0000:c1:00.0", "0000:e1:00.0"], budget=2.4)
    assert time.monotonic() - started < 4
    # Each GPU had an even share (0.8 s) of what was left; none waited for the full TIMEOUT.
    assert tried.read_text().split() == ["0000:81:00.0", "0000:c1:00.0", "0000:e1:00.0"]
    assert failures["0000:81:00.0"] == \
        "sriov-manage -e 0000:81:00.0 timed out after 0.8s and was stopped"


def test_gpus_left_without_time_in_a_hook_are_not_tried_and_say_so(root, tools, tmp_path):
    l40s_host(root, enabled=False)
    tried = tmp_path / "tried"
    stand_in(root / sriov.SRIOV_MANAGE, f'#!/bin/sh\necho "$2" >> {tried}\n')
    assert sriov.enable(["0000:81:00.0", "0000:c1:00.0"], budget=0.4) == {
        a: "not tried: this hook's time for sriov-manage was spent; retrying on the next hook"
        for a in ("0000:81:00.0", "0000:c1:00.0")}
    assert not tried.exists()


def test_a_boot_unit_that_cannot_be_replaced_is_named(root):
    target = sriov.unit_path()
    target.mkdir(parents=True)  # a directory where the unit file belongs
    with pytest.raises(SriovError) as error:
        sriov.ensure_unit("[Unit]\n")
    assert str(error.value) == f"cannot write /{sriov.UNIT_FILE}: Is a directory"


@pytest.mark.parametrize("found", [b"[Unit]\nDescription=Fran\xe7ais\n", b"#" * (1 << 17)])
def test_a_boot_unit_in_another_encoding_or_too_large_is_read_as_different(root, tools, found):
    target = sriov.unit_path()
    target.parent.mkdir(parents=True)
    target.write_bytes(found)
    assert sriov.ensure_unit("[Unit]\n")
    assert target.read_bytes() == b"[Unit]\n"
    assert not sriov.ensure_unit("[Unit]\n")



def _imports(module) -> set:
    """Every ``vgpu`` module ``module`` imports, at its top or inside a function."""
    import ast
    import inspect

    found = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module] if node.module else [a.name for a in node.names])
    return found


def test_sriov_and_the_boot_step_share_the_data_files_module_not_each_other():
    from vgpu import boot, bootdata

    assert "boot" not in _imports(sriov)
    assert "bootdata" in _imports(sriov) and "bootdata" in _imports(boot)
    assert not {"boot", "sriov"} & _imports(bootdata)


def test_a_hook_binds_a_gpu_left_unbound_to_nvidia_again_before_its_run(root, tools):
    """Issue 33.1: the next hook recovers it (remove_id, unbind, bind), then runs sriov-manage."""
    from unit_tests.fakehost import _stub_ids

    host = l40s_host(root, enabled=False)
    host.install_sriov_manage()
    host.left_on_stub("0000:81:00.0")
    assert sriov.selected({"x": ("all",)}, pci.discover()).wanted == ("0000:81:00.0", "0000:c1:00.0")
    assert sriov.enable(["0000:81:00.0"]) == {}
    assert sriov.driver_of("0000:81:00.0") == "nvidia" and _stub_ids(root) == []
    assert len(pci.discover().gpu("0000:81:00.0").vfs) == 16
    # One that stays unbound: named, with the commands that recover it; sriov-manage not run.
    host.left_on_stub("0000:c1:00.0")
    (root / "sys/bus/pci/drivers/nvidia/bind").unlink()
    why = sriov.enable(["0000:c1:00.0"])["0000:c1:00.0"]
    assert why.startswith("it is left on pci-pf-stub by a failed sriov-manage run and binding it "
                          "to nvidia failed: ")
    assert why.endswith("recover it with: " + sriov.recover_commands("0000:c1:00.0", "10de 2335"))
    assert tools.calls() == ["sriov-manage -e 0000:81:00.0"]


def test_two_runs_at_once_leave_the_second_gpu_on_the_stub_and_the_retry_recovers_it(root, tools):
    """The stand-in as the real script behaves (StackHPC's nvidia-sriov.service.j2): a race."""
    import threading

    host = l40s_host(root, enabled=False)
    host.install_sriov_manage()
    host.sriov_manage_takes(0.5, "0000:81:00.0")
    first = threading.Thread(target=lambda: sriov._run_once(root / sriov.SRIOV_MANAGE,
                                                            "0000:81:00.0", 10))
    first.start()
    time.sleep(0.2)
    try:
        assert "another sriov-manage is running" in sriov._run_once(
            root / sriov.SRIOV_MANAGE, "0000:c1:00.0", 10)
    finally:
        first.join()
    assert sriov.driver_of("0000:c1:00.0") == "pci-pf-stub"
    assert sriov.enable(["0000:c1:00.0"]) == {}  # through the lock: bound again, then run
    assert sriov.driver_of("0000:c1:00.0") == "nvidia"


def test_an_unbound_gpu_without_the_nvidia_driver_loaded_says_so_and_runs_nothing(root, tools):
    import shutil

    host = a100_host(root, enabled=False)
    host.install_sriov_manage()
    (root / "sys/bus/pci/devices/0000:41:00.0/driver").unlink()
    shutil.rmtree(root / "sys/bus/pci/drivers/nvidia")
    assert sriov.enable(["0000:41:00.0"]) == {"0000:41:00.0": (
        "it is left unbound and the nvidia driver is not loaded (is the vGPU host driver "
        "installed, and the host rebooted since?)")}
    assert tools.calls() == []


def test_a_hostile_device_id_of_an_unbound_gpu_is_never_written_nor_said_raw(root, tools):
    host = l40s_host(root, enabled=False)
    host.install_sriov_manage()
    host.left_on_stub("0000:c1:00.0")
    (root / "sys/bus/pci/devices/0000:c1:00.0/device").write_text("0x2335\n]x=1\n")
    why = sriov.enable(["0000:c1:00.0"])["0000:c1:00.0"]
    assert why.startswith('it is left unbound and its ids read "10de 2335\\n]x=1", not a vendor')
    assert "\n" not in why
    assert (root / "sys/bus/pci/drivers/pci-pf-stub/remove_id").read_text() == ""
    assert tools.calls() == []
def test_all_never_selects_a_gpu_given_whole_for_vfs(root):
    """A whole GPU still on nvidia after a boot (issue 37): `all` gives it no VFs."""
    from unit_tests.fakehost import whole_and_vgpu_host

    whole_and_vgpu_host(root, moved=False)
    host = pci.discover()
    assert "0000:c1:00.0" in sriov.selected({"L40S-12Q": ("all",)}, host).wanted
    choice = sriov.selected({"L40S-12Q": ("all",)}, host, whole=["0000:c1:00.0"])
    assert choice.wanted == ("0000:81:00.0",) and choice.refused == {}
