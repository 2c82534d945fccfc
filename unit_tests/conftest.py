"""Shared fixtures: a host root per test, and fake host tools on PATH.

No GPU, systemd or initramfs exists here, so ``systemctl`` and
``update-initramfs`` are small scripts that record their calls; dpkg and
dpkg-deb are the real ones.
"""

import os
import stat
from pathlib import Path

import pytest

from unit_tests.fakehost import FakeHost

FAKE_SYSTEMCTL = """#!/bin/sh
# Records each call; answers is-active from $FAKE_STATE/<unit> (missing: inactive).
echo "systemctl $*" >> "$FAKE_LOG"
verb="$1"; shift
case "$verb" in
  is-active)
    rc=0
    for unit in "$@"; do
      if [ -f "$FAKE_STATE/$unit" ]; then cat "$FAKE_STATE/$unit"; else echo inactive; rc=3; fi
    done
    exit $rc ;;
  start|restart)
    for unit in "$@"; do
      if [ -f "$FAKE_STATE/$unit.fails" ]; then echo "Job for $unit failed." >&2; exit 1; fi
      echo active > "$FAKE_STATE/$unit"
    done ;;
  stop)
    for unit in "$@"; do echo inactive > "$FAKE_STATE/$unit"; done ;;
esac
exit 0
"""

FAKE_UPDATE_INITRAMFS = """#!/bin/sh
echo "update-initramfs $*" >> "$FAKE_LOG"
"""


class Tools:
    """The fake systemctl / update-initramfs: their call log and unit states."""

    def __init__(self, directory: Path):
        self.bin = directory / "bin"
        self.state = directory / "units"
        self.log = directory / "calls.log"
        self.bin.mkdir(parents=True)
        self.state.mkdir(parents=True)
        self.log.touch()
        for name, text in (("systemctl", FAKE_SYSTEMCTL),
                           ("update-initramfs", FAKE_UPDATE_INITRAMFS)):
            path = self.bin / name
            path.write_text(text)
            path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def calls(self):
        return self.log.read_text().splitlines()

    def set_active(self, unit: str, active: bool = True) -> None:
        (self.state / unit).write_text("active\n" if active else "inactive\n")

    def fail_start(self, unit: str) -> None:
        (self.state / f"{unit}.fails").touch()


@pytest.fixture
def tools(tmp_path, monkeypatch) -> Tools:
    tools = Tools(tmp_path / "tools")
    monkeypatch.setenv("PATH", f"{tools.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(tools.log))
    monkeypatch.setenv("FAKE_STATE", str(tools.state))
    return tools


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """An empty host root, in force through VGPU_HOST_ROOT."""
    path = tmp_path / "host"
    path.mkdir()
    monkeypatch.setenv("VGPU_HOST_ROOT", str(path))
    return path


@pytest.fixture
def fake_host(root) -> FakeHost:
    return FakeHost(root)
