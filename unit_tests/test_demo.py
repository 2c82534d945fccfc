"""tools/demo.py: the sample-host demo, run in this process as `make demo` runs it."""

import os
import shlex
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


def test_two_mdev_types_of_the_default_demo_are_flagged_as_sharing_vgpu(environ, capsys):
    assert demo.main([]) == 0  # nvidia-108 and nvidia-109, both VGPU in Placement
    out = capsys.readouterr().out
    assert "\nnvidia-108, nvidia-109 are published with one resource class, VGPU: " in out
    assert ("  GRID V100-8Q: openstack flavor set <flavor> --property resources:VGPU=1   "
            "(shared: see the note above)\n") in out
    assert demo.main(["--config", "mdev-class-per-profile=true"]) == 0
    out = capsys.readouterr().out
    assert "shared" not in out
    assert "  GRID V100-8Q: openstack flavor set <flavor> --property resources:CUSTOM_VGPU_V100_8Q=1\n" in out


def test_reboot_upgrade_needs_the_host_with_two_driver_branches(environ, capsys):
    with pytest.raises(SystemExit):
        demo.main(["--host", "v100", "--reboot-upgrade"])
    assert "--reboot-upgrade needs --host l40s" in capsys.readouterr().err


# -- the tutorial's demo transcripts are the demo's real output

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial" / "sample-host.md"


def _demo_blocks(text):
    """Each fenced block of the page that starts with a `$ make demo` line: (arguments, shown lines)."""
    blocks, block = [], None
    for line in text.splitlines():
        if line.startswith("```"):
            if block is not None and block[0] is not None:
                blocks.append(block)
            block = [None, []] if block is None else None
            continue
        if block is None:
            continue
        if block[0] is None and not block[1] and line.startswith("$ make demo"):
            args = line[len("$ make demo"):].strip()
            block[0] = shlex.split(shlex.split(args)[0].split("=", 1)[1]) if args else []
        elif block[0] is not None:
            block[1].append(line)
    return blocks


def _shown_in_order(shown, out_lines):
    """The first shown line that the output does not have in this order, or None.

    "..." stands for lines left out; inside a line it stands for a part left out.
    """
    at = 0
    for line in shown:
        if line.strip() in ("", "..."):
            continue
        parts = [part for part in line.split("...") if part]
        while at < len(out_lines):
            candidate, at = out_lines[at], at + 1
            pos = 0
            for part in parts:
                pos = candidate.find(part, pos)
                if pos < 0:
                    break
                pos += len(part)
            else:
                break
        else:
            return line
    return None


def test_the_tutorial_shows_demo_blocks():
    assert len(_demo_blocks(TUTORIAL.read_text())) >= 4


@pytest.mark.parametrize("index", range(4))
def test_each_demo_transcript_in_the_tutorial_is_what_the_demo_prints(environ, capsys, index):
    args, shown = _demo_blocks(TUTORIAL.read_text())[index]
    assert [line for line in shown if line.strip() not in ("", "...")], shown  # something to compare
    try:
        demo.main(args)
    except SystemExit:
        pass  # an invalid mapping's demo exits non-zero, as the page says
    out = capsys.readouterr().out.splitlines()
    assert _shown_in_order(shown, out) is None, "\n".join(out)


def test_a_transcript_line_the_demo_does_not_print_is_found():
    out = ["a", "b 1 c", "d"]
    assert _shown_in_order(["a", "...", "d"], out) is None
    assert _shown_in_order(["b ... c"], out) is None
    assert _shown_in_order(["d", "a"], out) == "a"
    assert _shown_in_order(["x"], out) == "x"
