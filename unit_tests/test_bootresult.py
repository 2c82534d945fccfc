"""The boot step's result, GPU by GPU (vgpu.bootresult): written at its end, read by the exporter."""

import json

import pytest

from unit_tests import test_boot
from unit_tests.faketools import stand_in
from unit_tests.test_boot import H200, L40S, data, gpu
from vgpu import boot, bootresult, hostroot, sriov

rebooted = test_boot.rebooted  # the L40S and H200 after a reboot, the vGPU manager up


def test_each_gpu_of_the_data_gets_its_result_and_time(rebooted, root, tools):
    rebooted.fail_sriov_manage(L40S)
    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 2), gpu(H200, ["H200X-35C"])))
    assert boot.main([f"/{boot.DATA_FILE}"]) == 1
    found = bootresult.load()
    assert found is not None and found.status == 1
    assert [(g.address, g.result) for g in found.gpus] == [(L40S, "not restored"), (H200, "restored")]
    assert all(g.seconds >= 0 for g in found.gpus) and found.seconds >= max(g.seconds for g in found.gpus)
    # The next run replaces it whole: the GPUs of its own data only.
    sriov.write_boot_data(data(gpu(H200, ["H200X-35C"])))
    assert boot.main([f"/{boot.DATA_FILE}"]) == 0
    again = bootresult.load()
    assert (again.status, [g.address for g in again.gpus]) == (0, [H200])
    assert again.finished >= found.finished


def test_each_gpus_time_is_the_time_its_own_steps_took(rebooted, root, tools):
    """GPUs are restored side by side: a GPU's seconds are its own steps', not zero, not the sum."""
    real = root / "usr/lib/nvidia/sriov-manage"
    real.rename(real.with_name("sriov-manage.real"))
    stand_in(real, f'#!/bin/sh\ncase "$*" in *{L40S}*) sleep 0.5 ;; esac\n'
                   f'exec "{real.with_name("sriov-manage.real")}" "$@"\n')
    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 2), gpu(H200, ["H200X-35C"])))
    assert boot.main([f"/{boot.DATA_FILE}"]) == 0
    found = {g.address: g.seconds for g in bootresult.load().gpus}
    assert found[L40S] >= 0.5  # its sriov-manage alone slept that long


def test_the_result_says_whether_the_boot_step_or_a_hook_restored(rebooted, root, tools):
    """A hook doing the boot step's work (boot.catch_up) writes the result too: it says so."""
    sriov.write_boot_data(data(gpu(H200, ["H200X-35C"])))
    assert boot.main([f"/{boot.DATA_FILE}"]) == 0
    assert bootresult.load().run_by == "boot_step"
    boot.catch_up(again=True)  # a hook that enabled VFs itself does the work again
    found = bootresult.load()
    assert (found.run_by, found.status, [g.address for g in found.gpus]) == ("hook", 0, [H200])


def test_a_result_written_before_it_said_who_ran_names_nobody(root):
    path = hostroot.path(bootresult.RESULT_FILE)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "finished": 1, "seconds": 1, "status": 0, "gpus": []}))
    assert bootresult.load().run_by == ""  # the exporter's run_by label is then absent


def test_data_that_cannot_be_read_leaves_a_result_without_gpus(root, tools):
    path = root / boot.DATA_FILE
    path.parent.mkdir(parents=True)
    path.write_text("{")
    assert boot.main([f"/{boot.DATA_FILE}"]) == 2
    found = bootresult.load()
    assert (found.status, found.gpus) == (2, ())


def test_without_the_iommu_every_gpu_is_not_restored(rebooted, root, tools):
    (root / "sys/kernel/iommu_groups").rename(root / "sys/kernel/iommu_groups.off")
    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"])))
    assert boot.main([f"/{boot.DATA_FILE}"]) == 1
    assert [(g.address, g.result) for g in bootresult.load().gpus] == [(L40S, "not restored")]


def test_a_result_that_cannot_be_written_changes_nothing_else(rebooted, root, tools, caplog):
    result = root / bootresult.RESULT_FILE
    result.parent.mkdir(parents=True, exist_ok=True)
    result.mkdir()  # a directory where the file goes: it cannot be replaced
    sriov.write_boot_data(data(gpu(H200, ["H200X-35C"])))
    assert boot.main([f"/{boot.DATA_FILE}"]) == 0
    assert "cannot record the result" in caplog.text


def test_no_file_is_no_result_yet(root):
    assert bootresult.load() is None


@pytest.mark.parametrize("content", [
    "{", "[]", '{"version": 2, "gpus": []}',
    '{"version": 1, "finished": 1, "seconds": 1, "status": 0, "gpus": [{"address": "../x"}]}',
    '{"version": 1, "finished": -1, "seconds": 1, "status": 0, "gpus": []}',
    '{"version": 1, "finished": 1, "seconds": 1, "status": true, "gpus": []}',
    '{"version": 1, "finished": 1, "seconds": 1, "status": 0, "gpus": [], "run_by": "cron"}',
    '{"version": 1, "finished": 1, "seconds": 1, "status": 0, "gpus": [{"address": "0000:81:00.0",'
    ' "result": "fine", "seconds": 1}]}',
])
def test_a_file_not_as_written_is_refused(root, content):
    path = hostroot.path(bootresult.RESULT_FILE)
    path.parent.mkdir(parents=True)
    path.write_text(content)
    with pytest.raises(bootresult.ResultError):
        bootresult.load()


def test_a_link_in_its_place_is_not_followed(root, tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"version": 1, "finished": 1, "seconds": 1, "status": 0, "gpus": []}))
    path = hostroot.path(bootresult.RESULT_FILE)
    path.parent.mkdir(parents=True)
    path.symlink_to(target)
    with pytest.raises(bootresult.ResultError):
        bootresult.load()
