"""Stand-ins for the host tools that need a real systemd or initramfs.

One fake ``systemctl`` for every test: it records each call, answers
``is-active`` and ``is-enabled`` from a state directory, changes that state
on start/stop/mask/..., and fails a verb for a unit on request.
``update-initramfs`` records its call. dpkg and dpkg-deb are always the
real ones; :meth:`Tools.log_programs` puts recording wrappers in front of
them, so that a test can count every program a hook starts.
"""

import collections
import os
import shutil
import stat
import sys
import threading
from pathlib import Path

FAKE_SYSTEMCTL = """#!/bin/sh
# Records each call. State: $FAKE_STATE/<unit> (ActiveState, missing: inactive),
# $FAKE_STATE/<unit>.enabled (missing: enabled). $FAKE_STATE/<unit>.fail-<verb> makes
# that verb fail for that unit; $FAKE_STATE/no-bus makes every call fail as without D-Bus.
echo "systemctl $*" >> "$FAKE_LOG"
if [ -e "$FAKE_STATE/no-bus" ]; then
  echo "Failed to connect to bus: No such file or directory" >&2; exit 1
fi
verb="$1"; shift
for unit in "$@"; do
  if [ -e "$FAKE_STATE/$unit.fail-$verb" ]; then
    echo "Failed to $verb $unit.service: Unit $unit.service not loaded." >&2
    echo "See system logs and 'systemctl status $unit.service' for details." >&2
    exit 5
  fi
done
case "$verb" in
  is-active)
    rc=0
    for unit in "$@"; do
      if [ -f "$FAKE_STATE/$unit" ]; then state=$(cat "$FAKE_STATE/$unit"); else state=inactive; fi
      echo "$state"; [ "$state" = active ] || rc=3
    done
    exit $rc ;;
  start|restart)
    for unit in "$@"; do
      if [ "$(cat "$FAKE_STATE/$unit.enabled" 2>/dev/null)" = masked ]; then
        echo "Failed to start $unit.service: Unit $unit.service is masked." >&2; exit 1
      fi
      echo active > "$FAKE_STATE/$unit"
    done ;;
  stop)
    for unit in "$@"; do echo inactive > "$FAKE_STATE/$unit"; done ;;
  is-enabled)
    rc=0
    for unit in "$@"; do
      word=enabled
      [ -f "$FAKE_STATE/$unit.enabled" ] && word=$(cat "$FAKE_STATE/$unit.enabled")
      echo "$word"; [ "$word" = enabled ] || rc=1
    done
    exit $rc ;;
  mask|unmask|enable|disable)
    case "$verb" in mask) word=masked ;; disable) word=disabled ;; *) word=enabled ;; esac
    for unit in "$@"; do
      if [ "$verb" = enable ] && [ "$(cat "$FAKE_STATE/$unit.enabled" 2>/dev/null)" = masked ]; then
        echo "Failed to enable unit: Unit file $unit.service is masked." >&2; exit 1
      fi
      if [ "$verb" = unmask ] && [ "$(cat "$FAKE_STATE/$unit.enabled" 2>/dev/null)" != masked ]; then
        continue
      fi
      echo "$word" > "$FAKE_STATE/$unit.enabled"
    done ;;
esac
exit 0
"""

FAKE_UPDATE_INITRAMFS = """#!/bin/sh
echo "update-initramfs $*" >> "$FAKE_LOG"
"""

# apt-get installs a package by putting its program under the host root (only mdevctl is
# known: /usr/sbin/mdevctl); $FAKE_STATE/apt-get.fail-<package> makes it fail as apt does
# for a package its sources lack.
FAKE_APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$FAKE_LOG"
case " $* " in *" install "*) ;; *) exit 0 ;; esac
for pkg in "$@"; do
  case "$pkg" in -*|install) continue ;; esac
  if [ -e "$FAKE_STATE/apt-get.fail-$pkg" ]; then
    echo "E: Unable to locate package $pkg" >&2; exit 100
  fi
  if [ "$pkg" = mdevctl ] && [ -n "$VGPU_HOST_ROOT" ]; then
    mkdir -p "$VGPU_HOST_ROOT/usr/sbin"
    printf '#!/bin/sh\n' > "$VGPU_HOST_ROOT/usr/sbin/mdevctl"
    chmod 755 "$VGPU_HOST_ROOT/usr/sbin/mdevctl"
  fi
done
"""

LOGGING_WRAPPER = """#!/bin/sh
echo "%s $*" >> "$FAKE_LOG"
exec %s "$@"
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
                           ("update-initramfs", FAKE_UPDATE_INITRAMFS), ("apt-get", FAKE_APT_GET)):
            self._script(name, text)

    def calls(self):
        return self.log.read_text().splitlines()

    def log_programs(self, names=("dpkg", "dpkg-deb", "dpkg-query")) -> None:
        """Record each run of these real programs in the call log too (they still run)."""
        for name in names:
            real = shutil.which(name, path=os.environ.get("PATH", "").replace(
                f"{self.bin}{os.pathsep}", ""))
            assert real, f"{name} not found"
            self._script(name, LOGGING_WRAPPER % (name, real))

    def _script(self, name: str, text: str) -> None:
        path = self.bin / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)

    def set_active(self, unit: str, active: bool = True) -> None:
        self.set_state(unit, "active" if active else "inactive")

    def set_state(self, unit: str, state: str) -> None:
        """What ``systemctl is-active`` answers for ``unit``: active, inactive, failed, ..."""
        (self.state / unit).write_text(state + "\n")

    def enabled(self, unit: str) -> str:
        """What ``systemctl is-enabled`` answers for ``unit``: enabled, disabled, masked."""
        path = self.state / f"{unit}.enabled"
        return path.read_text().strip() if path.exists() else "enabled"

    def fail(self, verb: str, unit: str) -> None:
        """``systemctl <verb> <unit>`` fails from now on."""
        (self.state / f"{unit}.fail-{verb}").touch()

    def fail_start(self, unit: str) -> None:
        self.fail("start", unit)

    def apt_fails(self, package: str) -> None:
        """``apt-get install`` cannot find ``package`` from now on."""
        (self.state / f"apt-get.fail-{package}").touch()

    def no_bus(self) -> None:
        """Every systemctl call fails as it does without D-Bus."""
        (self.state / "no-bus").touch()

    def environ(self) -> dict:
        """The variables that put these tools first on PATH."""
        return {"PATH": f"{self.bin}{os.pathsep}{os.environ.get('PATH', '')}",
                "FAKE_LOG": str(self.log), "FAKE_STATE": str(self.state)}


def running(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie does not count)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            return handle.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        return False


def stand_in(path: Path, script: str) -> Path:
    """An executable shell script at ``path`` (a host tool the test replaces)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(script)
    path.chmod(0o755)
    return path


def shell_tool(bindir: Path, name: str, body: str) -> Path:
    """A /bin/sh stand-in for host tool ``name`` in ``bindir`` (a folder first on PATH)."""
    return stand_in(bindir / name, "#!/bin/sh\n" + body)


HANG = "sleep 300 & wait\n"  # a stand-in's body that never ends on its own


class Opened:
    """Files this process opens while active (a Python audit hook on ``open``, main thread).

    ``writes``: paths opened for writing, in order; ``reads``: how often each
    path was opened for reading. ``with OPENED as opened: ...``
    """

    def __init__(self):
        self.writes: list = []
        self.reads: collections.Counter = collections.Counter()
        self.active = False
        self._hook_installed = False

    def __enter__(self):
        if not self._hook_installed:
            sys.addaudithook(self._hook)  # audit hooks stay for the process: inert when inactive
            self._hook_installed = True
        self.writes, self.reads = [], collections.Counter()
        self.active = True
        return self

    def __exit__(self, *exc):
        self.active = False

    def _hook(self, event, args):
        if not self.active or event != "open" or threading.current_thread() is not threading.main_thread():
            return
        path, mode, flags = args
        if isinstance(path, int) or path is None:
            return
        path = os.fsdecode(path)
        if path == os.devnull:  # a command's stdin
            return
        writing = (mode and any(c in mode for c in "wax+")) or \
            (mode is None and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))
        if writing:
            self.writes.append(Path(path))
        else:
            self.reads[Path(path)] += 1


OPENED = Opened()


NVIDIA_SMI = '''#!{python}
"""Stand-in nvidia-smi: the MIG-mode query and -mig 1 (only what the charm runs)."""
import json, os, re, sys
STATE = {state!r}
args = sys.argv[1:]
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as handle:
        handle.write("nvidia-smi " + " ".join(args) + "\\n")
state = json.load(open(STATE))

def smi(address):
    domain, rest = address.split(":", 1)
    return "%08X:%s" % (int(domain, 16), rest.upper())

def sysfs(bus_id):
    m = re.fullmatch(r"([0-9A-Fa-f]{{4,8}}):(..):(..)\\.([0-7])", bus_id)
    return m and "%04x:%s:%s.%s" % (int(m.group(1), 16), m.group(2).lower(), m.group(3).lower(),
                                    m.group(4))

if args[:1] and args[0].startswith("--query-gpu=pci.bus_id,mig.mode.current"):
    for address in sorted(state):
        print("%s, %s, %s" % (smi(address), state[address]["current"], state[address]["pending"]))
    sys.exit(0)
if len(args) == 4 and args[0] == "-i" and args[2] == "-mig" and args[3] == "1":
    address = sysfs(args[1])
    if address not in state:
        print("No devices were found")
        sys.exit(6)
    gpu = state[address]
    gpu["pending"] = "Enabled"
    if gpu.get("hold"):
        # NVIDIA's MIG user guide, "Enable MIG Mode": the pending-state warning.
        why = ":In use by another client" if gpu.get("busy") else ""
        print("Warning: MIG mode is in pending enable state for GPU %s%s" % (smi(address), why))
        print("%s is currently being used by one or more other processes (e.g. CUDA application "
              "or a monitoring application such as another instance of nvidia-smi). Please first "
              "kill all processes using the device and retry the command or reboot the system to "
              "make MIG mode effective." % smi(address))
    else:
        gpu["current"] = "Enabled"
        print("Enabled MIG Mode for GPU %s" % smi(address))
    print("All done.")
    json.dump(state, open(STATE, "w"))
    sys.exit(0)
print("nvidia-smi stand-in: not modelled: %s" % " ".join(args), file=sys.stderr)
sys.exit(2)
'''


def nvidia_smi(state: Path) -> str:
    """The stand-in nvidia-smi's text: MIG modes in ``state`` (JSON ``{address: {current, pending}}``)."""
    return NVIDIA_SMI.format(python=sys.executable, state=str(state))
