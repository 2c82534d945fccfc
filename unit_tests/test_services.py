"""vgpu.services with the fake systemctl (unit_tests/faketools.py) on PATH."""

import pytest

from unit_tests.faketools import HANG, shell_tool
from vgpu import services
from vgpu.errors import ServiceError

MGR = "nvidia-vgpu-mgr"
VGPUD = "nvidia-vgpud"


def changes(tools):
    """The calls that change a unit (no queries), without the leading "systemctl"."""
    return [c.split(" ", 1)[1] for c in tools.calls()
            if c.startswith("systemctl ") and not c.startswith("systemctl is-")]


def test_active_asks_once_and_parses_each_line(tools):
    tools.set_state(MGR, "active")
    tools.set_state(VGPUD, "failed")
    answer = services.active([MGR, VGPUD, "nova-compute"])
    assert answer == {MGR: True, VGPUD: False, "nova-compute": False}
    assert tools.calls() == [f"systemctl is-active {MGR} {VGPUD} nova-compute"]


@pytest.mark.parametrize("mgr,vgpud,down", [
    ("active", "inactive", []),
    ("activating", "active", [MGR]),
    ("active", "failed", [VGPUD]),
    (None, None, [MGR]),  # unknown units read inactive
])
def test_down_means_a_daemon_not_active_or_any_unit_failed(tools, mgr, vgpud, down):
    for unit, state in ((MGR, mgr), (VGPUD, vgpud)):
        if state:
            tools.set_state(unit, state)
    assert services.down([MGR, VGPUD], daemons=[MGR]) == down


def test_active_of_nothing_runs_nothing(tools):
    assert services.active([]) == {}
    assert services.masked([]) == []
    assert tools.calls() == []


def test_active_without_an_answer_per_unit_is_an_error(tools):
    tools.no_bus()
    with pytest.raises(ServiceError, match=f"^systemctl is-active {MGR} failed: ") as error:
        services.active([MGR])
    assert "\n" not in str(error.value)


def test_a_short_answer_with_nothing_on_stderr_says_what_was_missing(tools):
    from unit_tests.faketools import stand_in

    stand_in(tools.bin / "systemctl", "#!/bin/sh\necho active\n")
    with pytest.raises(ServiceError) as error:
        services.active([MGR, VGPUD])
    assert str(error.value) == (f"systemctl is-active {MGR} {VGPUD} failed: "
                                "it answered for 1 of 2 units")


def test_masked_reads_is_enabled(tools):
    (tools.state / f"{VGPUD}.enabled").write_text("masked\n")
    assert services.masked([MGR, VGPUD]) == [VGPUD]


def test_pause_sequence(tools):
    services.pause([VGPUD, MGR])
    assert changes(tools) == [
        f"stop {VGPUD}", f"disable {VGPUD}", f"mask {VGPUD}",
        f"stop {MGR}", f"disable {MGR}", f"mask {MGR}",
    ]
    assert tools.enabled(MGR) == tools.enabled(VGPUD) == "masked"


def test_resume_sequence(tools):
    services.resume((MGR, VGPUD))
    assert changes(tools) == [
        f"unmask {MGR}", f"enable {MGR}", f"start {MGR}",
        f"unmask {VGPUD}", f"enable {VGPUD}", f"start {VGPUD}",
    ]


def test_a_failure_names_its_unit_and_stops_there(tools):
    tools.fail("start", MGR)
    with pytest.raises(ServiceError) as e:
        services.resume([MGR, VGPUD])
    message = str(e.value)
    assert message.startswith(f"systemctl start {MGR} failed: ")
    # the cause, not systemctl's advice that follows it
    assert "not loaded" in message and "See system logs" not in message
    assert changes(tools) == [f"unmask {MGR}", f"enable {MGR}", f"start {MGR}"]


def test_a_pause_that_fails_halfway_undoes_what_it_did(tools):
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    tools.fail("mask", VGPUD)
    with pytest.raises(ServiceError, match=f"^systemctl mask {VGPUD} failed: .*; what it had "
                                           "done was undone$"):
        services.pause([MGR, VGPUD])
    assert changes(tools) == [
        f"stop {MGR}", f"disable {MGR}", f"mask {MGR}", f"stop {VGPUD}", f"disable {VGPUD}",
        f"mask {VGPUD}",
        # undone in reverse
        f"enable {VGPUD}", f"start {VGPUD}", f"unmask {MGR}", f"enable {MGR}", f"start {MGR}"]
    assert services.active([MGR, VGPUD]) == {MGR: True, VGPUD: True}
    assert services.masked([MGR, VGPUD]) == []


def test_undoing_a_pause_starts_only_what_ran_before(tools):
    tools.set_active(MGR)
    tools.set_active(VGPUD, False)
    tools.fail("disable", VGPUD)
    with pytest.raises(ServiceError):
        services.pause([MGR, VGPUD])
    assert f"start {VGPUD}" not in changes(tools)
    assert services.active([MGR, VGPUD]) == {MGR: True, VGPUD: False}


def test_a_pause_whose_undo_fails_says_what_is_left(tools):
    tools.set_active(MGR)
    tools.fail("stop", VGPUD)
    tools.fail("unmask", MGR)
    with pytest.raises(ServiceError) as e:
        services.pause([MGR, VGPUD])
    # a masked unit can be neither enabled nor started: the rest of the undo fails with it
    assert str(e.value).startswith(f"systemctl stop {VGPUD} failed: ")
    assert str(e.value).endswith(f"; could not undo: mask {MGR}, disable {MGR}, stop {MGR}")
    assert services.masked([MGR, VGPUD]) == [MGR]


def test_unmask_enables_without_starting(tools):
    (tools.state / f"{MGR}.enabled").write_text("masked\n")
    services.unmask([MGR])
    assert changes(tools) == [f"unmask {MGR}", f"enable {MGR}"]
    assert tools.enabled(MGR) == "enabled"


def test_missing_systemctl(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match=f"^systemctl is-active {MGR} could not run"):
        services.active([MGR])


def test_a_status_query_gets_seconds_not_minutes():
    assert services.QUERY_TIMEOUT <= 15


def test_a_hung_query_is_stopped_within_its_timeout(tools, monkeypatch):
    (tools.bin / "systemctl").write_text("#!/bin/sh\nsleep 30\n")
    monkeypatch.setattr(services, "QUERY_TIMEOUT", 1)
    with pytest.raises(ServiceError, match=f"^systemctl is-active {MGR} timed out after 1s"):
        services.active([MGR])


def test_systemctl_that_hangs_is_reported(bindir, monkeypatch):
    shell_tool(bindir, "systemctl", HANG)
    monkeypatch.setattr(services, "QUERY_TIMEOUT", 1)
    monkeypatch.setattr(services, "CHANGE_TIMEOUT", 1)
    with pytest.raises(ServiceError) as error:
        services.active(["nvidia-vgpu-mgr"])
    assert str(error.value) == "systemctl is-active nvidia-vgpu-mgr timed out after 1s and was stopped"
    with pytest.raises(ServiceError) as error:
        services.pause(["nvidia-vgpu-mgr"])
    assert "timed out after 1s and was stopped" in str(error.value)


@pytest.mark.parametrize("name", ["--now", "-f", "a b", "x;reboot", ""])
def test_option_like_names_are_refused(tools, name):
    with pytest.raises(ValueError):
        services.pause([name])
    assert tools.calls() == []


def test_starting_a_unit_may_take_longer_than_switching_it(tools, monkeypatch):
    from unit_tests.faketools import stand_in

    # A daemon's start (the vGPU manager probing its GPUs) gets the longer limit; enabling does not.
    stand_in(tools.bin / "systemctl", "#!/bin/sh\n[ \"$1\" = start ] && sleep 2\nexit 0\n")
    monkeypatch.setattr(services, "SWITCH_TIMEOUT", 1)
    monkeypatch.setattr(services, "CHANGE_TIMEOUT", 20)
    services.resume(["nvidia-vgpu-mgr"])
