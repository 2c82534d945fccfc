"""vgpu.run: every host command is bounded in time and leaves nothing running behind it."""

import os
import sys
import time

import pytest

from unit_tests.faketools import running
from vgpu import run
from vgpu.errors import CommandError


def test_a_command_that_runs_too_long_is_ended_with_everything_it_started(tmp_path):
    pidfile = tmp_path / "child"
    started = time.monotonic()
    with pytest.raises(CommandError, match=r"^sh timed out after 1s and was stopped$"):
        run.run(["sh", "-c", f"sleep 300 & echo $! > {pidfile}; sleep 300"], 1)
    assert time.monotonic() - started < 1 + 2 * run.GRACE
    assert not running(int(pidfile.read_text()))


def test_a_command_ignoring_sigterm_is_killed(tmp_path):
    pidfile = tmp_path / "child"
    with pytest.raises(CommandError, match="timed out"):
        run.run(["sh", "-c", f"trap '' TERM; sleep 300 & echo $! > {pidfile}; wait"], 1)
    assert not running(int(pidfile.read_text()))


def test_a_command_runs_in_a_session_of_its_own():
    # The command leads its own session and process group (sid == pgid == pid):
    # true in any PID namespace, unlike comparing with the caller's session,
    # which is 0 where the caller's session leader lives outside the namespace.
    probe = "import os; print(os.getpid(), os.getsid(0), os.getpgid(0), os.getppid())"
    pid, sid, pgid, parent = map(int, run.run([sys.executable, "-c", probe], 5).stdout.split())
    assert parent == os.getpid()
    assert sid == pgid == pid


def test_failure_says_the_cause_first_on_one_line():
    with pytest.raises(CommandError) as error:
        run.run(["sh", "-c", "echo 'E: it broke' >&2; echo 'N: more' >&2; exit 3"], 5, what="tool")
    assert str(error.value) == "tool failed: it broke"
    assert error.value.cause == "it broke" and error.value.returncode == 3


def test_unchecked_failure_returns_the_answer():
    result = run.run(["sh", "-c", "echo inactive; exit 3"], 5, check=False)
    assert (result.returncode, result.stdout) == (3, "inactive\n")


def test_a_missing_program_is_an_error_not_an_oserror(tmp_path):
    with pytest.raises(CommandError, match="^nope could not run: No such file or directory$"):
        run.run([str(tmp_path / "nope")], 5)


def test_output_with_hostile_bytes_is_cleaned():
    out = run.run(["printf", "a\\000b\\377c"], 5).stdout
    assert "\x00" not in out and out.isprintable()


def test_a_child_that_left_the_group_holding_the_output_is_left_and_logged(tmp_path, caplog):
    import signal

    pidfile = tmp_path / "child"
    escape = f"{sys.executable} -c 'import os, time; os.setpgid(0, 0); time.sleep(300)'"
    started = time.monotonic()
    with pytest.raises(CommandError, match="timed out"):
        run.run(["sh", "-c", f"{escape} & echo $! > {pidfile}; sleep 300"], 1)
    elapsed = time.monotonic() - started
    child = int(pidfile.read_text())
    try:
        # Its own process group (same session): not the command's to end, nor to wait for.
        assert running(child)
        assert elapsed < 1 + 2 * run.GRACE
        assert "sh left a process holding its output open" in caplog.messages
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_failure_logs_the_whole_stderr_while_the_error_keeps_its_cause(caplog):
    script = "echo 'E: first problem' >&2; echo 'detail on a second line' >&2; exit 3"
    with pytest.raises(CommandError) as error:
        run.run(["sh", "-c", script], 10, what="the tool")
    assert str(error.value) == "the tool failed: first problem"
    assert ("WARNING", f"sh -c {script} failed (3): E: first problem\ndetail on a second line") in [
        (r.levelname, r.getMessage()) for r in caplog.records]
