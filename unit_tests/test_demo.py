"""tools/demo.py: the sample-host demo, run in this process as `make demo` runs it."""

import os
import re
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

DOCS = Path(__file__).resolve().parents[1] / "docs"
TUTORIAL = DOCS / "tutorial" / "sample-host.md"


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


# Every page with `$ make demo` transcripts, and each of its transcripts.
DEMO_PAGES = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                    if _demo_blocks(p.read_text()))
DEMO_BLOCKS = [(page, index) for page in DEMO_PAGES
               for index in range(len(_demo_blocks((DOCS / page).read_text())))]


def test_the_tutorials_show_demo_blocks():
    assert len(_demo_blocks(TUTORIAL.read_text())) >= 4
    assert {"tutorial/sample-host.md", "tutorial/first-deployment.md"} <= set(DEMO_PAGES)


def _run_demo(args, capsys):
    try:
        demo.main(args)
    except SystemExit:
        pass  # an invalid mapping's demo exits non-zero, as the page says
    return capsys.readouterr().out.splitlines()


@pytest.mark.parametrize("page,index", DEMO_BLOCKS, ids=[f"{p}:{i}" for p, i in DEMO_BLOCKS])
def test_each_demo_transcript_in_the_documentation_is_what_the_demo_prints(environ, capsys, page,
                                                                           index):
    args, shown = _demo_blocks((DOCS / page).read_text())[index]
    assert [line for line in shown if line.strip() not in ("", "...")], shown  # something to compare
    out = _run_demo(args, capsys)
    assert _shown_in_order(shown, out) is None, "\n".join(out)


# `juju status` lines of this charm's units: workload, agent, [machine,] address, message.
STATUS_LINE = re.compile(r"^\s*nova-compute-nvidia-vgpu/\d+\*?\s+(active|blocked|waiting|maintenance)"
                         r"\s+\S+\s+(?:\d+\s+)?\d+\.\d+\.\d+\.\d+\s+(\S.*)$", re.M)
DEMO_STATUS = re.compile(r"^nova-compute-nvidia-vgpu/0\s+(\w+)\s+(\S.*)$")


def unit_statuses(text):
    """``(workload, message)`` of each unit of this charm in the page's ``juju status`` output."""
    return STATUS_LINE.findall(text)


STATUS_PAGES = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                      if unit_statuses(p.read_text()))


def test_the_tutorial_of_a_deployment_shows_juju_status():
    assert "tutorial/first-deployment.md" in STATUS_PAGES


@pytest.mark.parametrize("page", STATUS_PAGES)
def test_each_unit_status_a_page_shows_is_one_its_demo_transcripts_print(environ, capsys, page):
    """A page shows one host: its `juju status` lines are what the charm said on that host.

    So a page that shows the charm's status in `juju status` shows the demo transcript of the
    same host too (`$ make demo ...`), and what one says the other says.
    """
    text = (DOCS / page).read_text()
    assert _demo_blocks(text), f"{page} shows juju status but no demo transcript of its host"
    printed = set()
    for args, _ in _demo_blocks(text):
        for line in _run_demo(args, capsys):
            printed.update(DEMO_STATUS.findall(line))
    assert set(unit_statuses(text)) <= printed, printed


def test_juju_status_lines_are_read_by_column():
    text = ("nova-compute/0*                active    idle   1        10.5.0.21              Unit is ready\n"
            "  nova-compute-nvidia-vgpu/0*  active    idle            10.5.0.21              2 GPUs (a), b\n"
            "  nova-compute-nvidia-vgpu/1   blocked   idle   3        10.5.0.22              x: y\n")
    assert unit_statuses(text) == [("active", "2 GPUs (a), b"), ("blocked", "x: y")]


def test_a_transcript_line_the_demo_does_not_print_is_found():
    out = ["a", "b 1 c", "d"]
    assert _shown_in_order(["a", "...", "d"], out) is None
    assert _shown_in_order(["b ... c"], out) is None
    assert _shown_in_order(["d", "a"], out) == "a"
    assert _shown_in_order(["x"], out) == "x"


# -- issue 41, item 7: whole GPUs and every action on the sample host ------------------------

def test_a_mapping_with_passthrough_runs_and_shows_the_whole_gpus_flavor(environ, capsys):
    assert demo.main(["--host", "l40s", "--mappings",
                      "{L40S-12Q: all, passthrough: [c1:00.0]}"]) == 0
    out = capsys.readouterr().out
    assert '"address": "0000:c1:00.0"' in out  # published whole
    assert "  H200 SXM 141GB (whole GPU): openstack flavor set <flavor> --property " \
           "pci_passthrough:alias=gpu-h200-sxm-141gb:1\n" in out


@pytest.mark.parametrize("argv, lines", [
    (["--host", "l40s", "--action", "list-vgpu-types"], ["max-per-instance: "]),
    (["--host", "l40s", "--action", "preview-mappings", "--param", "mappings={L40S-24Q: all}"],
     ["verdict: would apply", "vf-changes: |"]),
    (["--host", "l40s", "--action", "vgpu-usage"], ["summary: no vGPU in use on this host"]),
    (["--host", "v100", "--action", "fleet-report"],
     ["table: |", "nova-compute-nvidia-vgpu/0  gpu-host-1  570.158.02",  # the sample's own name
      "gpu-host-3  570.172.08"]),
    (["--host", "v100", "--action", "drain-plan"],
     ["summary: 'no guest on this host''s GPUs: nothing to drain'", "blocks-upgrade"]),
    (["--host", "rtxpro6000", "--action", "enable-mig", "--param", "gpu=0000:8c:00.0"],
     ["nvidia-dcgm.service"]),
])
def test_each_action_is_run_and_printed_as_juju_run_prints_it(environ, capsys, argv, lines):
    demo.main(argv)
    out = capsys.readouterr().out
    name = argv[argv.index("--action") + 1]
    assert f"$ juju run nova-compute-nvidia-vgpu/0 {name}" in out
    after = out.split(f"$ juju run nova-compute-nvidia-vgpu/0 {name}", 1)[1]
    for line in lines:
        assert line in after, after[:2000]


def test_the_demo_names_no_machine_of_the_reader(environ, capsys):
    """Issue 41.7: fleet-report printed this machine's host name for the sample's own unit."""
    import socket

    real = socket.gethostname()
    demo.main(["--host", "v100", "--action", "fleet-report"])
    out = capsys.readouterr().out.split("$ juju run nova-compute-nvidia-vgpu/0 fleet-report", 1)[1]
    rows = {line.split()[0]: line.split()[1] for line in out.splitlines()
            if line.strip().startswith("nova-compute-nvidia-vgpu/")}
    assert rows == {"nova-compute-nvidia-vgpu/0": demo.SAMPLE_HOSTNAME,
                    "nova-compute-nvidia-vgpu/1": "gpu-host-2",
                    "nova-compute-nvidia-vgpu/2": "gpu-host-3"}
    assert socket.gethostname() == real  # the sample's name only while the demo runs
