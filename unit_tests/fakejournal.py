"""A stand-in for ``journalctl`` reading the kernel's messages of a fixture host (vgpu.xid).

It answers the command line vgpu.xid runs as systemd's journalctl (252, Debian 12 and
Ubuntu 24.04's 255 alike; ``man journalctl``) answers it: ``--dmesg`` keeps the kernel's
messages only, ``--boot`` this boot's, ``--output=json`` prints one JSON object per entry and
line, ``--output-fields=MESSAGE,_TRANSPORT`` leaves those and the fields always printed
(``__CURSOR``, ``__REALTIME_TIMESTAMP``, ``__MONOTONIC_TIMESTAMP``, ``_BOOT_ID``), values as
strings; ``--after-cursor=C`` starts after the entry of cursor C and a cursor it cannot parse
fails ("Failed to seek to cursor: Invalid argument", status 1); ``--root=R`` reads R's
journal. A message that is not UTF-8 is printed as a list of byte values. Its options are
checked as journalctl 252 checks them (glibc's getopt_long over journalctl's long options: a
unique prefix is taken, an option it does not have fails with "journalctl: unrecognized
option '--X'", one that needs a value without it or one that takes none given one fail too,
status 1; an argument that is not an option is a match, and one that is not FIELD=VALUE fails,
"Failed to add match 'X': Invalid argument"), so a misspelt option fails here as on a host.

The host's journal is ``<root>/var/log/journal/fake-kernel.jsonl`` (one entry a line:
``{"message", "time", "transport", "boot"}``). Each run is logged in ``<root>/journalctl.log``,
its ``LC_ALL`` and ``PATH`` in ``<root>/journalctl.env``.
``hang`` makes the next runs never end; ``linger``, end only 30 s after closing their output;
``fail`` makes them fail (before any entry), ``corrupt`` after
every entry ("Failed to iterate through journal: %m", journalctl.c, as on a damaged journal
file), ``killed`` ends them by SIGKILL, saying nothing.
"""

import json
import sys
import time
from pathlib import Path

from unit_tests.faketools import stand_in

JOURNAL = "var/log/journal/fake-kernel.jsonl"
BOOT = "3d1b7c0ea1f84b4c9f0e2a6d4e1c2b5a"

SCRIPT = r'''#!{python}
import json, os, sys, time
from pathlib import Path
args = sys.argv[1:]
# journalctl 252's long options (journalctl --help): 0 takes no value, 1 needs one, 2 may take one.
OPTIONS = dict(o.split(":") for o in """after-cursor:1 all:0 boot:2 case-sensitive:2 catalog:0
    cursor:1 cursor-file:1 directory:1 disk-usage:0 dmesg:0 dump-catalog:0 facility:1 field:1
    fields:0 file:1 flush:0 follow:0 force:0 full:0 grep:1 header:0 help:0 identifier:1 image:1
    interval:1 lines:2 list-boots:0 list-catalog:0 machine:1 merge:0 namespace:1 new-id128:0
    no-full:0 no-hostname:0 no-pager:0 no-tail:0 output:1 output-fields:1 pager-end:0 priority:1
    quiet:0 relinquish-var:0 reverse:0 root:1 rotate:0 setup-keys:0 show-cursor:0 since:1
    smart-relinquish-var:0 sync:0 system:0 unit:1 until:1 update-catalog:0 user:0 user-unit:1
    utc:0 vacuum-files:1 vacuum-size:1 vacuum-time:1 verify:0 verify-key:1 version:0""".split())
MODES = """short short-full short-iso short-iso-precise short-precise short-monotonic short-delta
    short-unix verbose export json json-pretty json-sse json-seq cat with-unit""".split()


def refuse(why):
    sys.stderr.write(why + "\n")
    sys.exit(1)


given = {{}}
rest = list(args)
while rest:
    arg = rest.pop(0)
    if arg.startswith("-") and not arg.startswith("--"):
        refuse(f"this stand-in reads journalctl's long options only, not {{arg}}")
    if not arg.startswith("--"):
        if "=" not in arg or not arg.split("=", 1)[0].isupper():
            refuse(f"Failed to add match '{{arg}}': Invalid argument")
        continue  # FIELD=VALUE: a match vgpu.xid never asks for
    name, eq, value = arg[2:].partition("=")
    found = [name] if name in OPTIONS else [o for o in OPTIONS if o.startswith(name)]
    if not found:
        refuse(f"{{sys.argv[0]}}: unrecognized option '{{arg}}'")
    if len(found) > 1:
        refuse(f"{{sys.argv[0]}}: option '{{arg}}' is ambiguous; possibilities: "
               + " ".join(f"'--{{o}}'" for o in found))
    name, kind = found[0], OPTIONS[found[0]]
    if eq and kind == "0":
        refuse(f"{{sys.argv[0]}}: option '--{{name}}' doesn't allow an argument")
    if not eq and kind == "1":
        if not rest:
            refuse(f"{{sys.argv[0]}}: option '--{{name}}' requires an argument")
        value = rest.pop(0)
    given[name] = value
if "output" in given and given["output"] not in MODES:
    refuse(f"Unknown output format '{{given['output']}}'.")
root = Path(given.get("root") or "/")
cursor = given.get("after-cursor")
# --output-fields: those fields and the ones always printed; without it, every field.
fields_wanted = given["output-fields"].split(",") if "output-fields" in given else None
with open(root / "journalctl.log", "a") as log:
    log.write(" ".join(args) + "\n")
with open(root / "journalctl.env", "a") as log:  # the locale it speaks in, and its PATH
    log.write(json.dumps({{"LC_ALL": os.environ.get("LC_ALL"), "PATH": os.environ.get("PATH")}})
              + "\n")
if (root / "journalctl.hang").exists():
    time.sleep(300)
if (root / "journalctl.fail").exists():
    sys.stderr.write("Failed to open journal files: Permission denied\n")
    sys.exit(1)
if (root / "journalctl.killed").exists():  # by the OOM killer, say: no word of its own
    os.kill(os.getpid(), 9)
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
    if "dmesg" in given and entry["transport"] != "kernel":
        continue
    if "boot" in given and entry["boot"] != "{boot}":
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
              "_BOOT_ID": entry["boot"]}}
    for field, value in (("MESSAGE", message), ("_TRANSPORT", entry["transport"])):
        if fields_wanted is None or field in fields_wanted:
            record[field] = value
    out.write(json.dumps(record, separators=(",", ":")) + "\n")
if (root / "journalctl.corrupt").exists():  # a journal file damaged past what it printed
    out.flush()
    sys.stderr.write("Failed to iterate through journal: Bad message\n")
    sys.exit(1)
if (root / "journalctl.linger").exists():  # its output closed, the process not ended (yet)
    out.flush()
    os.close(1)
    time.sleep(30)
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

    def environments(self):
        """Each run's ``LC_ALL`` and ``PATH``."""
        log = self.root / "journalctl.env"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []

    def _flag(self, name: str, on: bool) -> None:
        """The stand-in's ``journalctl.<name>`` switch (see its script above), on or off."""
        flag = self.root / f"journalctl.{name}"
        flag.touch() if on else flag.unlink(missing_ok=True)

    def hang(self, on: bool = True) -> None:
        self._flag("hang", on)

    def linger(self, on: bool = True) -> None:
        self._flag("linger", on)

    def fail(self, on: bool = True) -> None:
        self._flag("fail", on)

    def corrupt(self, on: bool = True) -> None:
        self._flag("corrupt", on)

    def killed(self, on: bool = True) -> None:
        self._flag("killed", on)


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
