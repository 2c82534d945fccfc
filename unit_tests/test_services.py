"""vgpu.services with a fake systemctl on PATH that records its calls."""

import os

import pytest

from vgpu import services
from vgpu.errors import ServiceError

FAKE = """#!/bin/sh
# Record the call; answer is-active from state, fail verbs listed in fail.
echo "$*" >> {d}/calls
verb=$1; shift
if [ "$verb" = is-active ]; then
    [ -e {d}/garble ] && {{ echo "Failed to connect to bus: No such file or directory" >&2; exit 1; }}
    rc=0
    for unit in "$@"; do
        state=$(sed -n "s/^$unit //p" {d}/state)
        echo "${{state:-inactive}}"
        [ "$state" = active ] || rc=3
    done
    exit $rc
fi
if grep -qx "$verb $1" {d}/fail 2>/dev/null; then
    echo "Failed to $verb $1.service: Unit $1.service not loaded." >&2
    echo "See system logs for details." >&2
    exit 5
fi
exit 0
"""


@pytest.fixture
def systemctl(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "systemctl"
    script.write_text(FAKE.format(d=tmp_path))
    script.chmod(0o755)
    (tmp_path / "state").write_text("")
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return tmp_path


def calls(d):
    return (d / "calls").read_text().splitlines() if (d / "calls").exists() else []


def test_active_asks_once_and_parses_each_line(systemctl):
    (systemctl / "state").write_text("nvidia-vgpu-mgr active\nnvidia-vgpud failed\n")
    answer = services.active(["nvidia-vgpu-mgr", "nvidia-vgpud", "nova-compute"])
    assert answer == {"nvidia-vgpu-mgr": True, "nvidia-vgpud": False, "nova-compute": False}
    assert calls(systemctl) == ["is-active nvidia-vgpu-mgr nvidia-vgpud nova-compute"]


@pytest.mark.parametrize("state,down", [
    ("nvidia-vgpu-mgr active\nnvidia-vgpud inactive\n", []),
    ("nvidia-vgpu-mgr activating\nnvidia-vgpud active\n", ["nvidia-vgpu-mgr"]),
    ("nvidia-vgpu-mgr active\nnvidia-vgpud failed\n", ["nvidia-vgpud"]),
    ("", ["nvidia-vgpu-mgr"]),  # unknown units read inactive
])
def test_down_means_a_daemon_not_active_or_any_unit_failed(systemctl, state, down):
    (systemctl / "state").write_text(state)
    assert services.down(["nvidia-vgpu-mgr", "nvidia-vgpud"], daemons=["nvidia-vgpu-mgr"]) == down


def test_active_all_up(systemctl):
    (systemctl / "state").write_text("nvidia-vgpu-mgr active\nnvidia-vgpud active\n")
    assert services.active(("nvidia-vgpu-mgr", "nvidia-vgpud")) == {
        "nvidia-vgpu-mgr": True, "nvidia-vgpud": True}


def test_active_of_nothing_runs_nothing(systemctl):
    assert services.active([]) == {}
    assert calls(systemctl) == []


def test_active_without_an_answer_per_unit_is_an_error(systemctl):
    (systemctl / "garble").touch()
    with pytest.raises(ServiceError, match="^systemctl is-active nvidia-vgpu-mgr failed: "
                                           "Failed to connect to bus: No such file or directory$"):
        services.active(["nvidia-vgpu-mgr"])


def test_stop_and_disable_sequence(systemctl):
    services.stop_and_disable(["nvidia-vgpud", "nvidia-vgpu-mgr"])
    assert calls(systemctl) == [
        "stop nvidia-vgpud", "disable nvidia-vgpud", "mask nvidia-vgpud",
        "stop nvidia-vgpu-mgr", "disable nvidia-vgpu-mgr", "mask nvidia-vgpu-mgr",
    ]


def test_enable_and_start_sequence(systemctl):
    services.enable_and_start(("nvidia-vgpu-mgr", "nvidia-vgpud"))
    assert calls(systemctl) == [
        "unmask nvidia-vgpu-mgr", "enable nvidia-vgpu-mgr", "start nvidia-vgpu-mgr",
        "unmask nvidia-vgpud", "enable nvidia-vgpud", "start nvidia-vgpud",
    ]


def test_failure_names_unit_and_stops_there(systemctl):
    (systemctl / "fail").write_text("start nvidia-vgpu-mgr\n")
    with pytest.raises(ServiceError) as e:
        services.enable_and_start(["nvidia-vgpu-mgr", "nvidia-vgpud"])
    assert str(e.value) == ("systemctl start nvidia-vgpu-mgr failed: Failed to start "
                            "nvidia-vgpu-mgr.service: Unit nvidia-vgpu-mgr.service not loaded.")
    assert calls(systemctl) == ["unmask nvidia-vgpu-mgr", "enable nvidia-vgpu-mgr", "start nvidia-vgpu-mgr"]


def test_stop_failure(systemctl):
    (systemctl / "fail").write_text("disable nvidia-vgpud\n")
    with pytest.raises(ServiceError, match="^systemctl disable nvidia-vgpud failed: Failed to disable"):
        services.stop_and_disable(["nvidia-vgpu-mgr", "nvidia-vgpud"])
    assert calls(systemctl)[-1] == "disable nvidia-vgpud"
    assert "mask nvidia-vgpud" not in calls(systemctl)


def test_missing_systemctl(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ServiceError, match="^systemctl is-active nvidia-vgpu-mgr could not run"):
        services.active(["nvidia-vgpu-mgr"])


@pytest.mark.parametrize("name", ["--now", "-f", "a b", "x;reboot", ""])
def test_option_like_names_are_refused(systemctl, name):
    with pytest.raises(ValueError):
        services.stop_and_disable([name])
    assert calls(systemctl) == []
