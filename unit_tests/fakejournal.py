"""A stand-in for ``journalctl`` reading the kernel's messages of a fixture host (vgpu.xid).

It answers the command line vgpu.xid runs as systemd's journalctl (252, Debian 12 and
Ubuntu 24.04's 255 alike; ``man journalctl``) answers it: ``--dmesg`` keeps the kernel's
messages only, ``--boot`` this boot's, ``--output=json`` prints one JSON object per entry and
line, ``--output-fields=MESSAGE,_TRANSPORT`` leaves those and the fields always printed
(``__CURSOR``, ``__REALTIME_TIMESTAMP``, ``__MONOTONIC_TIMESTAMP``, ``_BOOT_ID``), values as
strings; ``--after-cursor=C`` starts after the entry of cursor C and a cursor it cannot parse
fails ("Failed to seek to cursor: Invalid argument", status 1); ``--root=R`` reads R's
journal. A message that is not UTF-8 is printed as a list of byte values.

The host's journal is ``<root>/var/log/journal/fake-kernel.jsonl`` (one entry a line:
``{"message", "time", "transport", "boot"}``). Each run is logged in ``<root>/journalctl.log``.
``hang`` makes the next runs never end; ``fail`` makes them fail.
"""

import json
import sys
import time
from pathlib import Path

from unit_tests.faketools import stand_in

JOURNAL = "var/log/journal/fake-kernel.jsonl"
BOOT = "3d1b7c0ea1f84b4c9f0e2a6d4e1c2b5a"

SCRIPT = r'''#!{python}
import json, sys, time
from pathlib import Path
args = sys.argv[1:]
root = Path("/")
cursor = None
fields_wanted = []
for arg in args:
    if arg.startswith("--output-fields="):
        fields_wanted = arg.split("=", 1)[1].split(",")
    if arg.startswith("--root="):
        root = Path(arg.split("=", 1)[1])
    elif arg.startswith("--after-cursor="):
        cursor = arg.split("=", 1)[1]
with open(root / "journalctl.log", "a") as log:
    log.write(" ".join(args) + "\n")
if (root / "journalctl.hang").exists():
    time.sleep(300)
if (root / "journalctl.fail").exists():
    sys.stderr.write("Failed to open journal files: Permission denied\n")
    sys.exit(1)
after = -1
if cursor is not None:
    try:
        fields = dict(part.split("=", 1) for part in cursor.split(";"))
        after = int(fields["i"], 16)
    except (ValueError, KeyError):
        sys.stderr.write("Failed to seek to cursor: Invalid argument\n")
        sys.exit(1)
path = root / "{journal}"
lines = path.read_text().splitlines() if path.exists() else []
out = sys.stdout
for seq, line in enumerate(lines):
    entry = json.loads(line)
    if seq <= after:
        continue
    if "--dmesg" in args and entry["transport"] != "kernel":
        continue
    if "--boot" in args and entry["boot"] != "{boot}":
        continue
    micros = int(entry["time"] * 1e6)
    message = entry["message"]
    raw = message.encode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        message = list(raw)
    record = {{"__CURSOR": "s=5f0e;i=%x;b={boot};m=%x;t=%x;x=9a" % (seq, seq * 1000, micros),
              "__REALTIME_TIMESTAMP": str(micros), "__MONOTONIC_TIMESTAMP": str(seq * 1000),
              "_BOOT_ID": entry["boot"], "MESSAGE": message}}
    if "_TRANSPORT" in fields_wanted:
        record["_TRANSPORT"] = entry["transport"]
    out.write(json.dumps(record, separators=(",", ":")) + "\n")
'''


class Journal:
    """The fixture host's journal and a journalctl that reads it, first on PATH (``bindir``)."""

    def __init__(self, root: Path, bindir: Path):
        """An empty journal."""
        self.root = root
        self.path = root / JOURNAL
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.touch()
        stand_in(bindir / "journalctl", SCRIPT.format(python=sys.executable, journal=JOURNAL,
                                                      boot=BOOT))

    def add(self, message: str, when: float = 0.0, transport: str = "kernel",
            boot: str = BOOT) -> None:
        """One entry: a kernel message of this boot unless said otherwise."""
        with self.path.open("a") as handle:
            handle.write(json.dumps({"message": message, "time": when or time.time(),
                                     "transport": transport, "boot": boot},
                                    ) + "\n")

    def kernel(self, lines, when: float = 0.0) -> None:
        """Kernel messages, one entry each."""
        for line in lines:
            self.add(line, when)

    def runs(self):
        """The command lines journalctl was run with (without the program)."""
        log = self.root / "journalctl.log"
        return log.read_text().splitlines() if log.exists() else []

    def hang(self, on: bool = True) -> None:
        flag = self.root / "journalctl.hang"
        flag.touch() if on else flag.unlink(missing_ok=True)

    def fail(self, on: bool = True) -> None:
        flag = self.root / "journalctl.fail"
        flag.touch() if on else flag.unlink(missing_ok=True)


# Real kernel lines, as the journal keeps them (MESSAGE, without the "kernel: " of the text
# output). NVIDIA/open-gpu-kernel-modules#1151 (an Xid 79 with no precursor):
XID_79 = ("NVRM: GPU at PCI:0000:2b:00: GPU-0b11d014-1685-04bd-26ed-5fc0bc1c44ae",
          "NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.",
          "NVRM: GPU 0000:2b:00.0: GPU has fallen off the bus.")
# NVIDIA/NVSentinel#155 (570.158.01; dmesg shows it as one message over three lines):
FALLEN_NO_XID = ("NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                 "NVRM: (PCI ID: 10de:26b5) installed in this system has\n"
                 "NVRM: fallen off the bus and is not responding to commands.")
# The same, as a journal that keeps each line as its own entry (leptonai/gpud#1209's grep).
FALLEN_SPLIT = tuple(FALLEN_NO_XID.split("\n"))
# stas00/ml-engineering, "Troubleshooting NVIDIA GPUs" (a row remap on an A100's bus 10):
XID_63 = ("NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for remapping, "
          "reset gpu to activate.")
# NVIDIA/open-gpu-kernel-modules#1045 quotes an Xid 119's text (590.48.01); the address is ours:
XID_119 = ("NVRM: Xid (PCI:0000:01:00): 119, Timeout after 45s of waiting for RPC response "
           "from GPU0 GSP!")
# NVIDIA's Xid reference shows the form of a guest's MMU fault (Xid 31):
XID_31 = ("NVRM: Xid (PCI:0000:03:00): 31, pid=1234, name=python3, Ch 00000010, intr 00000000. "
          "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f5a_1b000000")
# Lines that are not about a GPU's error (#1209's neighbours, the driver's banner).
OTHERS = ("mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE",
          "NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build  "
          "(dvs-builder@U22-I3-B10-02-5)  Mon Jun  2 13:13:04 UTC 2025",
          "NVRM: The NVIDIA probe routine failed for 1 device(s).")
