"""tools/demo.py: the sample-host demo, run in this process as `make demo` runs it."""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))
import demo  # noqa: E402


@pytest.fixture
def environ():
    """The demo points the charm at its own host tree and tools: put the environment back."""
    before = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(before)


def test_reboot_upgrade_restores_the_vf_types_by_name_and_publishes_the_same(environ, capsys):
    assert demo.main(["--host", "l40s", "--reboot-upgrade"]) == 0
    out = capsys.readouterr().out
    assert "  active: 2 GPUs (1 H200 SXM 141GB, 1 L40S)" in out
    assert ("  before the reboot (550.90.05):\n"
            "    GPU 0000:81:00.0: 4 VFs (0000:81:00.4 .. 0000:81:00.7) hold nvidia-1153\n") in out
    assert ("  after the boot step and the hook (570.158.02; none released):\n"
            "    GPU 0000:81:00.0: 4 VFs (0000:81:00.4 .. 0000:81:00.7) hold nvidia-1139\n"
            "    GPU 0000:c1:00.0: 4 VFs (0000:c1:00.4 .. 0000:c1:00.7) hold nvidia-1282\n") in out
    assert "[pci] device_spec published: 8, unchanged:" in out


def test_reboot_upgrade_needs_the_host_with_two_driver_branches(environ, capsys):
    with pytest.raises(SystemExit):
        demo.main(["--host", "v100", "--reboot-upgrade"])
    assert "--reboot-upgrade needs --host l40s" in capsys.readouterr().err
