"""Stand-ins for the host tools that need a real systemd or initramfs.

One fake ``systemctl`` for every test: it records each call, answers
``is-active`` and ``is-enabled`` from a state directory, changes that state
on start/stop/mask/..., and fails a verb for a unit on request.
``update-initramfs`` records its call. dpkg and dpkg-deb are always the
real ones; :meth:`Tools.log_programs` puts recording wrappers in front of
them, so that a test can count every program a hook starts.
"""

import collections
import contextlib
import os
import shutil
import stat
import subprocess
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
[ "$1" = --no-block ] && shift  # queued, not waited for: the same state here
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

# virsh -r version --daemon as libvirt's tools/virsh-host.c (cmdVersion) prints it: the library
# virsh uses, then the running hypervisor (virConnectGetVersion) and, with --daemon, the daemon
# (virConnectGetLibVersion). State: $FAKE_STATE/virsh holds "<libvirt> <qemu>" (Ubuntu 24.04's
# 10.0.0 and 8.2.2 when absent) or "down": libvirtd does not answer, as virsh says then.
FAKE_MODPROBE = """#!/bin/sh
# modprobe: a module named with - or _ loads; vfio-pci's driver directory appears (sysfs).
echo "modprobe $*" >> "$FAKE_LOG"
[ -e "$FAKE_STATE/modprobe.fail" ] && { echo "modprobe: FATAL: Module $* not found" >&2; exit 1; }
for last; do :; done
case "$last" in
  vfio-pci|vfio_pci)
    d="$VGPU_HOST_ROOT/sys/bus/pci/drivers/vfio-pci"
    mkdir -p "$d" && touch "$d/bind" "$d/unbind" "$d/new_id" "$d/remove_id" ;;
esac
"""

FAKE_VIRSH = """#!/bin/sh
echo "virsh $*" >> "$FAKE_LOG"
state="$FAKE_STATE/virsh"
if [ -f "$state" ]; then read -r libvirt qemu < "$state"; else libvirt=10.0.0; qemu=8.2.2; fi
if [ "$libvirt" = down ]; then
  echo "error: failed to connect to the hypervisor" >&2
  echo "error: Failed to connect socket to '/var/run/libvirt/libvirt-sock-ro': No such file or directory" >&2
  exit 1
fi
echo "Compiled against library: libvirt $libvirt"
echo "Using library: libvirt $libvirt"
echo "Using API: QEMU $libvirt"
echo "Running hypervisor: QEMU $qemu"
case " $* " in *" --daemon "*) echo "Running against daemon: $libvirt";; esac
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
                           ("update-initramfs", FAKE_UPDATE_INITRAMFS), ("apt-get", FAKE_APT_GET),
                           ("virsh", FAKE_VIRSH), ("modprobe", FAKE_MODPROBE)):
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

    def apt_works(self, package: str) -> None:
        """``apt-get install`` finds ``package`` again (the operator fixed the archive)."""
        (self.state / f"apt-get.fail-{package}").unlink(missing_ok=True)

    def set_virsh(self, libvirt: str, qemu: str = "") -> None:
        """The versions ``virsh version --daemon`` reports; ``down``: libvirtd does not answer."""
        (self.state / "virsh").write_text(f"{libvirt} {qemu}\n")

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


# GPU instance profiles per GPU model, from NVIDIA's Multi-Instance GPU User Guide, "Supported
# MIG Profiles" (H100 80GB: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb;
# H200 141GB: 1g.18gb ... 7g.141gb, at most 7, 4, 3, 2, 1, 1 instances) and its placement
# examples ("Creating GPU Instances", ``nvidia-smi mig -lgipp``: 1g {0..6}:1, 1g x2 {0,2,4,6}:2,
# 2g {0,2,4}:2, 3g {0,4}:4, 4g {0}:4, 7g {0}:8; profile ids 19, 20, 15, 14, 9, 5, 0 as its
# ``-lgip`` example shows for the A100). RTX PRO 6000 Blackwell: "Supported GPUs" (96GB, at most 4
# instances) and aws/sagemaker-hyperpod-cli PR 403 (1g.24gb x4, 2g.48gb x2, 4g.96gb x1); its
# +gfx profiles from NVIDIA/mig-parted; its ids and 4-slice placements are inferred (as the A30).
# Each row: name, id, memory slices, placements, at most (0: one per placement), GiB shown.
MIG_TABLES = {
    "H100": [["1g.10gb", 19, 1, [0, 1, 2, 3, 4, 5, 6], 0, 9.75],
             ["1g.10gb+me", 20, 1, [0, 1, 2, 3, 4, 5, 6], 1, 9.75],
             ["1g.20gb", 15, 2, [0, 2, 4, 6], 0, 19.62], ["2g.20gb", 14, 2, [0, 2, 4], 0, 19.62],
             ["3g.40gb", 9, 4, [0, 4], 0, 39.50], ["4g.40gb", 5, 4, [0], 0, 39.50],
             ["7g.80gb", 0, 8, [0], 0, 79.25]],
    "H200": [["1g.18gb", 19, 1, [0, 1, 2, 3, 4, 5, 6], 0, 16.0],
             ["1g.18gb+me", 20, 1, [0, 1, 2, 3, 4, 5, 6], 1, 16.0],
             ["1g.35gb", 15, 2, [0, 2, 4, 6], 0, 32.5], ["2g.35gb", 14, 2, [0, 2, 4], 0, 32.5],
             ["3g.71gb", 9, 4, [0, 4], 0, 70.0], ["4g.71gb", 5, 4, [0], 0, 70.0],
             ["7g.141gb", 0, 8, [0], 0, 139.0]],
    "RTX PRO 6000": [["1g.24gb", 14, 1, [0, 1, 2, 3], 0, 23.5],
                     ["1g.24gb+gfx", 47, 1, [0, 1, 2, 3], 0, 23.5],
                     ["2g.48gb", 5, 2, [0, 2], 0, 47.5], ["2g.48gb+gfx", 35, 2, [0, 2], 0, 47.5],
                     ["4g.96gb", 0, 4, [0], 0, 95.0], ["4g.96gb+gfx", 32, 4, [0], 0, 95.0]],
}

NVIDIA_SMI = """#!{python}
\"\"\"Stand-in nvidia-smi: MIG mode, GPU reset and GPU instances (only what the charm runs).

State (JSON, the fake host's, so a reboot can wipe it): per GPU address its mode
(current, pending), ``hold`` (enabling waits for a GPU reset: an Ampere GPU whose driver
could not reset it itself, gpu-operator PR 2603), ``busy`` (another client uses the GPU:
``-mig 1`` leaves the mode pending and a reset fails until it stops; then ``-mig 1`` again
puts it in force, as the pending warning says), ``persistence`` (persistence mode on:
sriov-manage -e turns it on), ``reboot`` (``loses``: Hopper and Blackwell with the vGPU
host driver lose MIG mode at a reboot; ``keeps``: Ampere keeps it), ``table`` (a key of
MIG_TABLES) and ``gis`` ([{{id, profile, start, size}}]). A GPU instance is in use while a VF
of the GPU holds a vGPU type in it (``nvidia/gpu_instance_id`` beside a non-zero
``current_vgpu_type``): it cannot be destroyed then. A reset is refused while persistence
mode is on or the GPU has VFs (NVIDIA/NVSentinel issue 1690, NVIDIA/gpu-operator issue 118).
Every run holds a lock on the state and replaces it whole, so that the boot step's
per-GPU threads and sriov-manage never lose each other's changes.
NVML clients: while a unit of HOLDERS is active (the fake systemctl's state), it holds every
GPU. Whether a held GPU leaves ``-mig 1`` pending on Hopper and Blackwell is not settled
(NVIDIA's MIG-backed vGPU guide and MIG user guide: yes; gpu-operator issue 2600 and PR 2603:
no reset is needed there): a GPU's ``held`` says which reading it follows, ``pending``
(the default) or ``applies``.
\"\"\"
import fcntl, json, os, re, sys
STATE = {state!r}
TABLES = {tables!r}
DEVICES = {devices!r}
HOLDERS = ("nvidia-vgpu-exporter.service", "snap.dcgm.nv-hostengine.service",
           "snap.dcgm.dcgm-exporter.service", "nvidia-dcgm.service", "dcgm-exporter.service",
           "nvsm.service")
args = sys.argv[1:]
log = os.environ.get("FAKE_LOG")
if log:
    with open(log, "a") as handle:
        handle.write("nvidia-smi " + " ".join(args) + "\\n")
lock = open(STATE + ".lock", "a")
fcntl.flock(lock, fcntl.LOCK_EX)
with open(STATE) as handle:
    state = json.load(handle)

def smi(address):
    domain, rest = address.split(":", 1)
    return "%08X:%s" % (int(domain, 16), rest.upper())

def sysfs(bus_id):
    m = re.fullmatch(r"([0-9A-Fa-f]{{4,8}}):(..):(..)\\.([0-7])", bus_id)
    return m and "%04x:%s:%s.%s" % (int(m.group(1), 16), m.group(2).lower(), m.group(3).lower(),
                                    m.group(4))

def save():
    with open(STATE + ".new", "w") as handle:
        json.dump(state, handle)
    os.replace(STATE + ".new", STATE)

def has_vfs(address):
    pf = os.path.join(DEVICES, address)
    return os.path.isdir(pf) and any(n.startswith("virtfn") for n in os.listdir(pf))

def gpu_of(bus_id):
    address = sysfs(bus_id or "")
    if address not in state:
        print("No devices were found")
        sys.exit(6)
    gpu = state[address]
    gpu.setdefault("gis", [])
    return address, gpu

def table(gpu):
    return {{row[0]: row for row in TABLES.get(gpu.get("table", ""), [])}}

def used_slices(gpu):
    return {{s for gi in gpu["gis"] for s in range(gi["start"], gi["start"] + gi["size"])}}

def free_starts(gpu, row):
    taken = used_slices(gpu)
    starts = [s for s in row[3] if not taken & set(range(s, s + row[2]))]
    if row[4] and sum(gi["profile"] == row[0] for gi in gpu["gis"]) >= row[4]:
        return []
    return starts

def in_use(address, gi_id):
    pf = os.path.join(DEVICES, address)
    for name in sorted(os.listdir(pf)) if os.path.isdir(pf) else ():
        if not name.startswith("virtfn"):
            continue
        nvidia = os.path.join(pf, name, "nvidia")
        try:
            held = open(os.path.join(nvidia, "current_vgpu_type")).read().strip()
            gi = open(os.path.join(nvidia, "gpu_instance_id")).read().strip()
        except OSError:
            continue
        if held not in ("", "0") and gi == str(gi_id):
            return True
    return False

def holders():
    units = os.environ.get("FAKE_STATE", "")
    out = []
    for unit in HOLDERS:
        try:
            with open(os.path.join(units, unit)) as handle:
                if units and handle.read().strip() == "active":
                    out.append(unit)
        except OSError:
            pass
    return out

def option(flag):
    return args[args.index(flag) + 1] if flag in args and args.index(flag) + 1 < len(args) else None

named = (sysfs(option("-i")) if args[:1] == ["-i"] and len(args) > 2
         and args[2].startswith("--query-gpu=") else None)
if named is not None:
    del args[:2]
if args == ["-q"]:
    # nvidia-smi -q's vGPU capability block per GPU, as a real host prints it (a Proxmox VE
    # host's Tesla P40, driver 535.129.03; akb486/vgpu README.md, driver 525.147.01):
    # ``fractional`` in a GPU's state is its Fractional Multi-vGPU (default Not Supported).
    print("==============NVSMI LOG==============")
    print()
    print("vGPU Driver Capability")
    print("        Heterogenous Multi-vGPU           : Supported")
    print()
    print("Attached GPUs                             : %d" % len(state))
    for address in sorted(state):
        print("GPU " + smi(address))
        print("    Persistence Mode                      : Enabled")
        print("    vGPU Device Capability")
        print("        Fractional Multi-vGPU             : "
              + state[address].get("fractional", "Not Supported"))
        print("        Heterogeneous Time-Slice Profiles : Supported")
        print("        Heterogeneous Time-Slice Sizes    : Not Supported")
        print("    MIG Mode")
        print("        Current                           : " + state[address]["current"])
    sys.exit(0)
if args[:1] and args[0].startswith("--query-gpu=pci.bus_id,mig.mode.current"):
    if named is not None and named not in state:
        print("No devices were found")
        sys.exit(6)
    for address in sorted(state) if named is None else [named]:
        print("%s, %s, %s" % (smi(address), state[address]["current"], state[address]["pending"]))
    sys.exit(0)
if len(args) == 4 and args[0] == "-i" and args[2] == "-mig" and args[3] == "1":
    address, gpu = gpu_of(args[1])
    gpu["pending"] = "Enabled"
    held = holders() and gpu.get("held", "pending") == "pending"
    if gpu.get("hold") or gpu.get("busy") or held:
        # NVIDIA's MIG user guide, "Enable MIG Mode": the pending-state warning.
        why = ":In use by another client" if gpu.get("busy") or held else ""
        print("Warning: MIG mode is in pending enable state for GPU %s%s" % (smi(address), why))
        print("%s is currently being used by one or more other processes (e.g. CUDA application "
              "or a monitoring application such as another instance of nvidia-smi). Please first "
              "kill all processes using the device and retry the command or reboot the system to "
              "make MIG mode effective." % smi(address))
    else:
        gpu["current"] = "Enabled"
        print("Enabled MIG Mode for GPU %s" % smi(address))
    for n in range(gpu.get("noise", 0)):  # a driver that says far too much
        print("Warning: line %d of a very long answer %s" % (n, "." * 60))
    print("All done.")
    save()
    sys.exit(0)
if "-r" in args and "-i" in args and "mig" not in args:
    address, gpu = gpu_of(option("-i"))
    if gpu.get("busy") or gpu.get("persistence") or has_vfs(address):
        # NVIDIA/NVSentinel issue 1690: persistence mode counts as a client of the GPU.
        print("The following GPUs could not be reset:")
        print("  GPU %s: In use by another client" % smi(address))
        print()
        print("1 device is currently being used by one or more other processes (e.g. Fabric "
              "Manager, CUDA application, graphics application such as an X server, or a "
              "monitoring application such as another instance of nvidia-smi). Please first kill "
              "all processes using this device and all compute applications running in the "
              "system.")
        sys.exit(255)
    gpu["current"] = gpu["pending"]  # a reset puts a pending mode in force
    gpu["gis"] = []  # and takes every GPU instance with it
    gpu["hold"] = False
    print("GPU %s was successfully reset." % smi(address))
    print("All done.")
    save()
    sys.exit(0)
if args[:1] == ["mig"]:
    address, gpu = gpu_of(option("-i"))
    rows = table(gpu)
    if gpu["current"] != "Enabled":
        print("No MIG-enabled devices found.")
        sys.exit(6)
    if "-lgip" in args:
        print("+" + "-" * 77 + "+")
        print("| GPU instance profiles:" + " " * 54 + "|")
        print("| GPU   Name             ID    Instances   Memory     P2P    SM    DEC   ENC  |")
        print("|                              Free/Total   GiB              CE    JPEG  OFA  |")
        print("|" + "=" * 77 + "|")
        for name, row in rows.items():
            total = row[4] or len(row[3])
            free = min(total, len(free_starts(gpu, row)))
            print("|   0  MIG %-14s %3d     %d/%-6d %6.2f      No     %-5d %-5d %-3d |"
                  % (name, row[1], free, total, row[5], 16 * row[2], 0, 0))
            print("|" + " " * 61 + "1     0     0   |")
            print("+" + "-" * 77 + "+")
        sys.exit(0)
    if "-lgi" in args:
        if not gpu["gis"]:
            print("No GPU instances found: Not Found")
            sys.exit(6)
        print("+" + "-" * 55 + "+")
        print("| GPU instances:" + " " * 40 + "|")
        print("| GPU   Name             Profile  Instance   Placement  |")
        print("|                          ID       ID       Start:Size |")
        print("|" + "=" * 55 + "|")
        for gi in sorted(gpu["gis"], key=lambda g: g["id"]):
            print("|   0  MIG %-14s %4d     %4d        %d:%d     |"
                  % (gi["profile"], rows[gi["profile"]][1], gi["id"], gi["start"], gi["size"]))
            print("+" + "-" * 55 + "+")
        sys.exit(0)
    if "-cgi" in args:
        status = 0
        for wanted in option("-cgi").split(","):
            row = rows.get(wanted) or next((r for r in rows.values() if str(r[1]) == wanted), None)
            if row is None:
                print("Unable to create a GPU instance on GPU  0 using profile %s: Invalid "
                      "Argument" % wanted)
                status = 2
                continue
            starts = free_starts(gpu, row)
            if not starts:
                print("Unable to create a GPU instance on GPU  0 using profile %s: Insufficient "
                      "Resources" % wanted)
                status = 2
                continue
            ids = {{gi["id"] for gi in gpu["gis"]}}
            new = min(set(range(1, 15)) - ids)
            gpu["gis"].append({{"id": new, "profile": row[0], "start": starts[0], "size": row[2]}})
            print("Successfully created GPU instance ID %2d on GPU  0 using profile MIG %s (ID %2d)"
                  % (new, row[0], row[1]))
            if "-C" in args:
                print("Successfully created compute instance ID  0 on GPU  0 GPU instance ID %2d "
                      "using profile MIG %s (ID  0)" % (new, row[0]))
        save()
        sys.exit(status)
    if "-dci" in args or "-dgi" in args:
        gi_id = int(option("-gi"))
        if not any(gi["id"] == gi_id for gi in gpu["gis"]):
            print("Unable to find GPU instance ID %d on GPU  0: Not Found" % gi_id)
            sys.exit(6)
        if in_use(address, gi_id):
            print("Unable to destroy %s instance ID %d from GPU  0: In use by another client"
                  % ("compute" if "-dci" in args else "GPU", gi_id))
            sys.exit(19)
        if "-dgi" in args:
            gpu["gis"] = [gi for gi in gpu["gis"] if gi["id"] != gi_id]
            print("Successfully destroyed GPU instance ID %2d from GPU  0" % gi_id)
        else:
            print("Successfully destroyed compute instance ID  0 from GPU  0 GPU instance ID %2d"
                  % gi_id)
        save()
        sys.exit(0)
print("nvidia-smi stand-in: not modelled: %s" % " ".join(args), file=sys.stderr)
sys.exit(2)
"""


def nvidia_smi(state: Path, devices: Path) -> str:
    """The stand-in nvidia-smi's text: its state in ``state`` (see its doc), VFs under ``devices``."""
    return NVIDIA_SMI.format(python=sys.executable, state=str(state), tables=MIG_TABLES,
                             devices=str(devices))


@contextlib.contextmanager
def host_lock_held(lock: Path):
    """Another process holding the host lock ``lock`` (as the boot step would) until the block ends."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR | "
         "os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); sys.stdin.read()",
         str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        yield
    finally:
        holder.communicate("", timeout=10)


def run_script(tmp_path: Path, text: str, *args: str, **environ: str) -> subprocess.CompletedProcess:
    """``text`` run as a Python script in a process of its own, with this one's import path.

    What a hook imports and costs shows only in a fresh process; ``environ`` adds variables.
    """
    script = tmp_path / "script.py"
    script.write_text(text)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path), **environ)
    return subprocess.run([sys.executable, str(script), *args], env=env,
                          capture_output=True, text=True, check=True)
