"""Stand-ins for the host tools that need a real systemd or initramfs.

``systemctl`` records each call and answers ``is-active`` from a state
directory; ``update-initramfs`` records its call. dpkg and dpkg-deb are
always the real ones.
"""

import os
import stat
from pathlib import Path

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
  is-enabled)
    for unit in "$@"; do
      if [ -f "$FAKE_STATE/$unit.enabled" ]; then cat "$FAKE_STATE/$unit.enabled"; else echo enabled; fi
    done ;;
  mask|unmask|enable|disable)
    case "$verb" in mask) word=masked ;; disable) word=disabled ;; *) word=enabled ;; esac
    for unit in "$@"; do echo "$word" > "$FAKE_STATE/$unit.enabled"; done ;;
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
        self.set_state(unit, "active" if active else "inactive")

    def set_state(self, unit: str, state: str) -> None:
        """What ``systemctl is-active`` answers for ``unit``: active, inactive, failed, ..."""
        (self.state / unit).write_text(state + "\n")

    def fail_start(self, unit: str) -> None:
        (self.state / f"{unit}.fails").touch()

    def environ(self) -> dict:
        """The variables that put these tools first on PATH."""
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                "FAKE_LOG": str(self.log), "FAKE_STATE": str(self.state)}
