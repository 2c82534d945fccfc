"""sriov-manage and systemctl for the boot unit: bounded in time like every host command."""

import os
import time

import pytest

from unit_tests.fakehost import a100_host, l40s_host
from unit_tests.faketools import running, stand_in
from vgpu import services, sriov
from vgpu.errors import SriovError


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
    assert os.path.exists(sriov.unit_path())


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
