"""Xid errors and lost GPUs (vgpu.xid): real kernel lines through a journalctl stand-in.

The metrics on a fixture host: test_metrics.py; the exporter's process: test_exporter.py;
Prometheus evaluating the alerts: test_prometheus.py and unit_tests/prometheus/.
"""

import json
import os
import subprocess
import threading
import time

import pytest

from unit_tests.fakejournal import (
    FALLEN_NO_XID,
    FALLEN_SPLIT,
    OTHERS,
    XID_31,
    XID_63,
    XID_79,
    XID_119,
    Journal,
)
from vgpu import xid

T0 = 1_764_000_000.0


@pytest.fixture
def journal(root, bindir):
    return Journal(root, bindir)


def series(samples, name):
    """{label values: value} of one metric's samples."""
    return {tuple(v for _, v in s.labels): s.value for s in samples if s.name == name}


def caught_up(watch):
    for _ in range(100):
        if watch.poll():
            return watch
    raise AssertionError("the journal was never read to its end")


# -- the kernel's lines ------------------------------------------------------------------------

@pytest.mark.parametrize("lines, events", [
    (XID_79, [("0000:2b:00.0", 79), ("0000:2b:00.0", 0), ("0000:2b:00.0", 0)]),
    ((FALLEN_NO_XID,), [("0000:b3:00.0", 0)]),  # one message over three lines
    (FALLEN_SPLIT, [("0000:b3:00.0", 0)]),  # three entries: the GPU named first counts
    ((XID_63,), [("0000:10:1c.0", 63)]),
    ((XID_119, XID_31), [("0000:01:00.0", 119), ("0000:03:00.0", 31)]),
    (OTHERS, []),
])
def test_real_kernel_lines_are_xids_and_gpus_fallen_off_the_bus(lines, events):
    parser = xid.Parser()
    found = [(e.gpu, e.xid) for line in lines for e in parser.feed(line, T0)]
    assert found == events


def test_an_xid_in_another_pci_domain_keeps_it():
    (event,) = xid.Parser().feed("NVRM: Xid (PCI:0001:C8:00): 48, An uncorrectable double bit "
                                 "error (DBE) has been detected on GPU in the framebuffer.", T0)
    assert event == xid.Event("0001:c8:00.0", 48, T0)


# -- only the driver's own lines, of GPUs this host has ----------------------------------------

# The kernel's line for a process that crashed (arch/x86/mm/fault.c's show_signal_msg: "<comm>[<pid>]:
# segfault at <address> ip <ip> sp <sp> error <code> in <file>[<offset>]"): the process' name and
# the file's are the user's to choose, so an unprivileged user can put a driver's words in them.
SEGFAULT = ("foo[123]: segfault at 0 ip 00007f3a1c2b4e10 sp 00007ffd2c1d8e40 error 4 in NVRM: Xid "
            "(PCI:0000:01:00): 79, GPU has fallen off the bus.[7f3a1c2b4000+1000]")
# The same with a newline in the file's name and a process named "NVRM: x": every line starts
# with the driver's prefix, the first is not one of its lines.
SEGFAULT_LINES = ("NVRM: x[123]: segfault at 0 ip 00007f3a1c2b4e10 sp 00007ffd2c1d8e40 error 4 in "
                  "a\nNVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.[7f3a1c2b4000+1000]")
# The kernel's PCI core adding a GPU at boot (drivers/pci/probe.c, pci_setup_device's
# "[%04x:%04x] type %02x class %#08x"; an H100's ids).
ENUMERATED_01 = "pci 0000:01:00.0: [10de:2330] type 00 class 0x030200 PCIe Endpoint"


@pytest.mark.parametrize("message", [
    SEGFAULT, SEGFAULT_LINES,
    "kernel: NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",  # not at the start
    "audit: NVRM: The NVIDIA GPU 0000:01:00.0 has fallen off the bus",
])
def test_text_a_user_chose_in_a_kernel_message_is_no_xid(journal, message):
    journal.kernel([ENUMERATED_01, message], T0)
    watch = caught_up(xid.Watch())
    samples = watch.samples(["0000:01:00.0"])
    counts = series(samples, "nvidia_vgpu_xid_errors")
    assert counts and not any(counts.values())  # the GPU's series, all 0
    assert not series(samples, "nvidia_vgpu_xid_last_seen_timestamp_seconds")
    assert not any(series(samples, "nvidia_vgpu_xid_gpu_lost").values())


def test_only_the_kernels_transport_is_read():
    line = json.dumps({"__CURSOR": "c1", "__REALTIME_TIMESTAMP": "1", "_TRANSPORT": "syslog",
                       "MESSAGE": XID_63}) + "\n"
    kernel = line.replace('"syslog"', '"kernel"').replace("c1", "c2")
    unsaid = line.replace(', "_TRANSPORT": "syslog"', "").replace("c1", "c3")
    entries = xid._entries((line + kernel + unsaid).encode())
    assert [(e.cursor, e.message) for e in entries] == [("c1", ""), ("c2", XID_63), ("c3", "")]
    assert "--output-fields=MESSAGE,_TRANSPORT" in xid.command(None)


def test_a_gpu_the_kernel_added_this_boot_and_since_lost_is_counted(journal):
    """Gone from sysfs before the exporter started: the kernel's own PCI line made it known."""
    journal.kernel([ENUMERATED_01.replace("01:00.0", "2b:00.0"), *XID_79], T0)
    samples = caught_up(xid.Watch()).samples(["0000:81:00.0"])
    assert series(samples, "nvidia_vgpu_xid_errors")[("0000:2b:00.0", "79")] == 1
    lost = series(samples, "nvidia_vgpu_xid_gpu_lost")
    assert lost[("0000:2b:00.0", "kernel")] == 1 and lost[("0000:2b:00.0", "pci")] == 1


def test_an_xid_of_a_gpu_this_host_never_had_is_never_served(journal):
    journal.kernel(XID_79, T0)
    samples = caught_up(xid.Watch()).samples(["0000:81:00.0"])
    assert {dict(s.labels)["gpu"] for s in samples} == {"0000:81:00.0"}


# NVIDIA's "NVIDIA A100 GPU Memory Error Management" (docs.nvidia.com/deploy/a100-gpu-mem-error-
# mgmt/, "User Visible Statistics"): with MIG on the line names the GPU instance in the parentheses.
XID_95_MIG = "NVRM: Xid (PCI:0000:01:00 GPU-I:05): 95, pid=2345, name=qemu-system-x86, Uncontained"
XID_94_MIG = ("NVRM: Xid (PCI:0000:01:00 GPU-I:01): 94, pid=2346, name=qemu-system-x86, Ch "
              "00000008, errorString CTX SWITCH TIMEOUT, Info 0x0")


def test_the_mig_form_counts_for_the_gpu_and_names_its_gpu_instance(journal):
    journal.kernel([XID_95_MIG, XID_94_MIG, XID_95_MIG,
                    "NVRM: Xid (PCI:0000:01:00 GPU-I:999): 95, too big an instance id"], T0)
    samples = caught_up(xid.Watch()).samples(["0000:01:00.0"])
    counts = series(samples, "nvidia_vgpu_xid_errors")
    assert counts[("0000:01:00.0", "95")] == 3 and counts[("0000:01:00.0", "94")] == 1
    assert series(samples, "nvidia_vgpu_xid_gpu_instance_errors") == {
        ("0000:01:00.0", "5", "95"): 2, ("0000:01:00.0", "1", "94"): 1}


# -- reading the journal -----------------------------------------------------------------------

def test_the_journal_is_read_for_this_boots_kernel_messages_then_after_the_last_cursor(journal):
    journal.add(XID_63, T0, boot="an-earlier-boot")  # another boot's Xid is not this boot's
    journal.add("NVRM: Xid (PCI:0000:10:1c): 31, from a service", T0, transport="stdout")
    journal.kernel(OTHERS + (XID_63,), T0 + 5)
    watch = xid.Watch()
    assert watch.poll() is True
    counts = series(watch.samples(["0000:10:1c.0"]), "nvidia_vgpu_xid_errors")
    assert counts[("0000:10:1c.0", "63")] == 1 and counts[("0000:10:1c.0", "31")] == 0
    journal.kernel([XID_63], T0 + 60)
    watch.poll()
    first, second = journal.runs()
    assert "--dmesg" in first and "--boot" in first and "--output=json" in first
    assert "--after-cursor" not in first
    assert second.endswith("--after-cursor=s=5f0e;i=5;b=3d1b7c0ea1f84b4c9f0e2a6d4e1c2b5a;m=1388;"
                           f"t={int((T0 + 5) * 1e6):x};x=9a")  # the last entry read
    samples = watch.samples(["0000:10:1c.0"])
    assert series(samples, "nvidia_vgpu_xid_errors")[("0000:10:1c.0", "63")] == 2
    assert series(samples, "nvidia_vgpu_xid_last_seen_timestamp_seconds") == {
        ("0000:10:1c.0", "63"): T0 + 60}


def test_a_read_takes_a_bounded_output_and_the_next_goes_on_from_the_last_whole_entry(journal):
    journal.kernel([XID_31] * 40, T0)
    chunks = []

    def small(cursor):
        chunks.append(xid.read(cursor, limit=2000))
        return chunks[-1]

    watch = xid.Watch(reader=small)
    assert watch.poll() is False  # more waits
    assert 0 < len(chunks[0].entries) < 40 and not chunks[0].complete
    early = watch.samples(["0000:03:00.0"])  # nothing of the journal until its end was reached
    assert [s.name for s in early] == ["nvidia_vgpu_xid_gpu_lost"]  # sysfs': source pci
    assert watch.journal_up() is None
    caught_up(watch)
    counts = series(watch.samples(["0000:03:00.0"]), "nvidia_vgpu_xid_errors")
    assert counts[("0000:03:00.0", "31")] == 40  # each entry once, none lost at a cut
    assert len(chunks) > 2


def test_a_journalctl_that_hangs_is_given_up_and_a_scrape_never_waits(journal, monkeypatch):
    journal.kernel([XID_63], T0)
    watch = caught_up(xid.Watch())
    journal.hang()
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), kwargs={"pause": 0.05})
    real = xid.read  # bounded at 1 s (read's default, READ_SECONDS, is bound at its definition)
    monkeypatch.setattr(xid, "read", lambda cursor, **bounds: real(cursor, seconds=1.0, **bounds))
    try:
        thread.start()
        time.sleep(0.2)  # the thread is inside a read that will not end
        started = time.monotonic()
        samples = watch.samples(["0000:10:1c.0"])
        assert time.monotonic() - started < 0.1
        assert series(samples, "nvidia_vgpu_xid_errors")[("0000:10:1c.0", "63")] == 1
        deadline = time.monotonic() + 4  # the bound set above, 1 s, not the default 10 s
        while watch.journal_up() is not False and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.journal_up() is False  # the read that timed out is said
    finally:
        stop.set()
        journal.hang(False)
        thread.join(timeout=15)
    assert not thread.is_alive()


def test_journalctl_speaks_in_the_c_locale_whatever_the_exporter_s_and_keeps_its_path(
        journal, monkeypatch):
    """Its words are quoted (a failure's last line): in the words the docs give, not translated."""
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    xid.read(None)
    assert journal.environments() == [{"LC_ALL": "C", "PATH": os.environ["PATH"]}]


def test_a_read_that_hangs_holds_journalctl_only_while_it_runs_and_says_how_long_it_waited(
        journal):
    journal.hang()
    held: set = set()
    during = []
    looker = threading.Timer(0.5, lambda: during.extend(p.poll() for p in list(held)))
    looker.start()
    with pytest.raises(xid.JournalError) as error:
        xid.read(None, seconds=1.5, running=held)
    looker.join()
    assert str(error.value) == "journalctl gave nothing within 1.5s"
    assert during == [None]  # journalctl, running, held while the read waited on it
    assert held == set()  # and let go once the read was over


def test_a_journalctl_that_closes_its_output_but_does_not_end_is_read_and_not_waited_for(
        journal):
    journal.kernel([XID_63], T0)
    journal.linger()
    started = time.monotonic()
    chunk = xid.read(None, seconds=1.0)
    assert time.monotonic() - started < 10  # not the 30 s it lingers
    assert [e.message for e in chunk.entries] == [XID_63]
    assert chunk.complete is False  # its end not seen: the next read goes on from its cursor


def test_closing_the_watch_ends_the_journalctl_it_waits_on(journal):
    """The exporter stops: a read waiting on a hung journalctl ends now, not at its bound."""
    journal.hang()
    watch = xid.Watch()
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), kwargs={"pause": 0.05})
    try:
        thread.start()
        time.sleep(0.5)  # inside a read bounded at READ_SECONDS (10 s)
        stop.set()
        started = time.monotonic()
        watch.close()
        thread.join(timeout=xid.READ_SECONDS + 5)
        assert time.monotonic() - started < xid.READ_SECONDS / 2
    finally:
        stop.set()
        journal.hang(False)
        thread.join(timeout=xid.READ_SECONDS + 5)
    assert not thread.is_alive()


def test_a_journalctl_that_cannot_be_run_is_said_with_the_system_s_reason(tmp_path, monkeypatch):
    """Not a program this machine runs (another architecture's, or cut short): exec refuses it."""
    journalctl = tmp_path / "journalctl"
    journalctl.write_bytes(bytes(64))
    journalctl.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(xid.JournalError) as error:
        xid.read(None)
    assert str(error.value) == "journalctl could not run: Exec format error"


def test_a_journalctl_that_fails_is_said_and_what_was_read_stays(journal):
    journal.kernel([XID_63], T0)
    watch = caught_up(xid.Watch())
    journal.fail()
    watch.poll()
    assert watch.journal_up() is False
    counts = series(watch.samples(["0000:10:1c.0"]), "nvidia_vgpu_xid_errors")
    assert counts[("0000:10:1c.0", "63")] == 1
    journal.fail(False)
    watch.poll()
    assert watch.journal_up() is True


def test_a_journalctl_that_fails_having_read_nothing_is_said_with_its_own_words(journal):
    journal.fail()
    with pytest.raises(xid.JournalError) as error:
        xid.read(None)
    assert str(error.value) == "journalctl failed (1): Failed to open journal files: Permission denied"


def test_a_journalctl_killed_having_said_nothing_is_said_by_its_status(journal):
    journal.killed()
    with pytest.raises(xid.JournalError) as error:
        xid.read(None)
    assert str(error.value) == "journalctl failed (-9)"


def test_a_journalctl_that_fails_after_some_entries_gives_them_and_logs_its_words(journal,
                                                                                   caplog):
    journal.kernel([XID_63, XID_63], T0)
    journal.corrupt()
    with caplog.at_level("WARNING", logger=xid.log.name):
        chunk = xid.read(None)
    assert [e.message for e in chunk.entries] == [XID_63, XID_63]
    assert chunk.complete is False  # read on from the last entry's cursor
    assert caplog.messages == ["journalctl failed (1) after 2 entries: Failed to iterate through "
                               "journal: Bad message"]


# What journalctl 252 (Debian 12, glibc 2.36) says to each, run as `<path> --no-pager <it>`
# (vgpu.xid.read runs it by its path: getopt names the program as it was run).
REFUSED = {
    "--OUTPUT-FIELDS=MESSAGE,_TRANSPORT": "{journalctl}: unrecognized option "
                                          "'--OUTPUT-FIELDS=MESSAGE,_TRANSPORT'",
    "--output=JSON": "Unknown output format 'JSON'.",
    "--out=json": "{journalctl}: option '--out=json' is ambiguous; possibilities: '--output' "
                  "'--output-fields'",
    "--dmesg=yes": "{journalctl}: option '--dmesg' doesn't allow an argument",
    "--output-fields": "{journalctl}: option '--output-fields' requires an argument",
    "XX--output=jsonXX": "Failed to add match 'XX--output=jsonXX': Invalid argument",
}


@pytest.mark.parametrize("given", sorted(REFUSED))
def test_the_stand_in_refuses_what_journalctl_refuses(journal, bindir, given):
    """A misspelt option of vgpu.xid.command fails here as on a host.

    Where this machine has journalctl, it is asked too and must agree.
    """
    env = dict(os.environ, LC_ALL="C")
    ours = subprocess.run([str(bindir / "journalctl"), "--no-pager", given], capture_output=True,
                          text=True, env=env, timeout=30)
    said = REFUSED[given].format(journalctl=bindir / "journalctl")
    assert (ours.returncode, ours.stderr) == (1, said + "\n")
    for real in ("/usr/bin/journalctl", "/bin/journalctl"):
        if os.access(real, os.X_OK):
            theirs = subprocess.run([real, "--no-pager", given], capture_output=True, text=True,
                                    env=env, timeout=30)
            assert theirs.returncode == 1
            assert theirs.stderr.splitlines()[-1] == REFUSED[given].format(journalctl=real)
            break


def test_without_journalctl_the_journal_is_said_unreadable(root, monkeypatch):
    monkeypatch.setenv("PATH", str(root))  # no journalctl there
    watch = xid.Watch()
    watch.poll()
    assert watch.journal_up() is False
    with pytest.raises(xid.JournalError, match=r"\Ajournalctl not found\Z"):
        xid.read(None)


def test_a_message_that_is_not_utf8_is_read(journal):
    journal.add("NVRM: Xid (PCI:0000:03:00): 31, name=\udcff\udcfe, MMU Fault", T0)
    watch = caught_up(xid.Watch())
    counts = series(watch.samples(["0000:03:00.0"]), "nvidia_vgpu_xid_errors")
    assert counts[("0000:03:00.0", "31")] == 1


def test_an_exporter_restarted_reads_the_whole_boot_again(journal):
    journal.kernel(XID_79, T0)
    first = caught_up(xid.Watch()).samples(["0000:2b:00.0"])
    again = caught_up(xid.Watch()).samples(["0000:2b:00.0"])  # a new process: no cursor kept
    assert first == again
    assert series(again, "nvidia_vgpu_xid_last_seen_timestamp_seconds") == {
        ("0000:2b:00.0", "79"): T0}


# -- the series ---------------------------------------------------------------------------------

def test_every_runbook_xid_exists_at_0_for_every_gpu_from_the_start(journal):
    watch = caught_up(xid.Watch())
    samples = watch.samples(["0000:81:00.0", "0000:c1:00.0"])
    counts = series(samples, "nvidia_vgpu_xid_errors")
    assert counts == {(gpu, str(x.number)): 0 for gpu in ("0000:81:00.0", "0000:c1:00.0")
                      for x in xid.RUNBOOK}
    assert {("0000:81:00.0", "79"), ("0000:c1:00.0", "79")} <= set(counts)
    assert not series(samples, "nvidia_vgpu_xid_last_seen_timestamp_seconds")
    assert series(samples, "nvidia_vgpu_xid_gpu_lost") == {
        (gpu, source): 0 for gpu in ("0000:81:00.0", "0000:c1:00.0") for source in ("kernel", "pci")}


def test_an_xid_the_runbook_does_not_name_gets_its_own_series(journal):
    journal.kernel(["NVRM: Xid (PCI:0000:81:00): 137, pid=1, name=qemu, NVLink..."], T0)
    counts = series(caught_up(xid.Watch()).samples(["0000:81:00.0"]), "nvidia_vgpu_xid_errors")
    assert counts[("0000:81:00.0", "137")] == 1


def test_a_gpu_is_lost_as_the_kernel_nvml_or_sysfs_says(journal):
    journal.kernel(XID_79 + (FALLEN_NO_XID,), T0)
    watch = caught_up(xid.Watch())
    gpus = ["0000:2b:00.0", "0000:b3:00.0", "0000:81:00.0", "0000:c1:00.0"]
    watch.samples(gpus)  # sysfs listed them all once
    lost = series(watch.samples(gpus[:3], mapped=["0000:c1:00.0"], nvml_lost=["0000:81:00.0"]),
                  "nvidia_vgpu_xid_gpu_lost")
    assert {k: v for k, v in lost.items() if v} == {
        ("0000:2b:00.0", "kernel"): 1, ("0000:b3:00.0", "kernel"): 1,  # Xid 79; the lines
        ("0000:81:00.0", "nvml"): 1,  # NVML: "GPU is lost"
        ("0000:c1:00.0", "pci"): 1}  # gone from sysfs
    assert len(lost) == 4 * 3


def test_a_gpu_the_boot_data_maps_and_sysfs_never_listed_is_lost(journal):
    watch = caught_up(xid.Watch())
    lost = series(watch.samples(["0000:81:00.0"], mapped=["0000:c1:00.0"]),
                  "nvidia_vgpu_xid_gpu_lost")
    assert lost[("0000:c1:00.0", "pci")] == 1 and lost[("0000:81:00.0", "pci")] == 0


def test_sysfs_unread_says_nothing_of_pci(journal):
    watch = caught_up(xid.Watch())
    watch.samples(["0000:81:00.0"])
    lost = series(watch.samples(None), "nvidia_vgpu_xid_gpu_lost")
    assert lost == {("0000:81:00.0", "kernel"): 0}


def test_a_flood_of_made_up_gpus_takes_no_slot_and_drops_no_real_xid(journal):
    """64 and more driver-shaped lines for GPUs this host lacks, then a real Xid 48: counted."""
    real = "0000:81:00.0"
    flood = [f"NVRM: Xid (PCI:{n:04x}:01:00): 79, GPU has fallen off the bus." for n in range(
        1, 200)]
    journal.kernel(flood + ["NVRM: Xid (PCI:0000:81:00): 48, An uncorrectable double bit "
                            "error (DBE) has been detected on GPU in the framebuffer."], T0)
    watch = caught_up(xid.Watch(known=lambda: [real]))
    samples = watch.samples([real])
    assert {dict(s.labels)["gpu"] for s in samples} == {real}  # no made-up GPU served
    assert series(samples, "nvidia_vgpu_xid_errors")[(real, "48")] == 1
    assert not any(v for (g, src), v in series(samples, "nvidia_vgpu_xid_gpu_lost").items())
    # What waits for addresses not known is bounded: the first MAX_GPUS, no more.
    later = [f"{n:04x}:01:00.0" for n in (1, xid.MAX_GPUS, xid.MAX_GPUS + 1)]
    counts = series(watch.samples([real, *later]), "nvidia_vgpu_xid_errors")
    assert [counts[(gpu, "79")] for gpu in later] == [1, 1, 0]


# NVIDIA's Xid catalogue for Ampere and later, docs.nvidia.com/deploy/xid-errors/analyzing-xid-
# catalog.html (the rows as of CUDA 12.9 / driver R575, its newest "Xid 154 linkage" entries):
# the "Resolution Bucket (Immediate Action)" column, word for word, per Xid the runbook names.
CATALOGUE = {13: "RESTART_APP", 31: "RESTART_APP", 43: "IGNORE", 45: "WORKFLOW_XID_45",
             48: "WORKFLOW_XID_48", 62: "RESET_GPU", 63: "IGNORE", 64: "RESET_GPU",
             74: "WORKFLOW_NVLINK_ERR", 79: "RESTART_BM", 92: "IGNORE", 94: "RESTART_APP",
             95: "RESET_GPU", 119: "RESET_GPU", 120: "RESET_GPU", 154: "XID_154"}


def test_each_runbook_xid_has_the_catalogues_bucket_and_one_of_its_classes():
    assert {x.number: x.bucket for x in xid.RUNBOOK} == CATALOGUE
    classes = {x.number: x.action for x in xid.RUNBOOK}
    assert set(classes.values()) == {xid.RESTART_GUEST, xid.RESET_GPU, xid.REBOOT_NODE,
                                     xid.CONTACT_SUPPORT}
    for number, bucket in CATALOGUE.items():  # the bucket decides where it names one class
        wanted = {"RESTART_APP": xid.RESTART_GUEST, "RESET_GPU": xid.RESET_GPU,
                  "RESTART_BM": xid.REBOOT_NODE}.get(bucket)
        assert wanted is None or classes[number] == wanted, number
    assert classes[79] == xid.REBOOT_NODE and classes[92] == xid.CONTACT_SUPPORT
    # Hardware memory errors, not the guest's fault (the catalogue's rows for 92 and 94).
    hardware = {x.number for x in xid.RUNBOOK if x.hardware}
    assert {92, 94, 48, 63, 64, 95, 79} <= hardware and not {13, 31, 43, 45} & hardware
    assert set(xid.numbers(xid.RESTART_GUEST)) | set(xid.numbers(xid.RESET_GPU)) | set(
        xid.numbers(xid.REBOOT_NODE)) | set(xid.numbers(xid.CONTACT_SUPPORT)) == set(CATALOGUE)


def test_the_exporters_gpus_are_sysfs_gpus_not_their_vfs(root):
    """What the exporter's watch asks before each read (xid.host_gpus): the GPUs, never a VF."""
    from unit_tests.fakehost import l40s_host

    l40s_host(root)  # an L40S and an H200 with their VFs: 26 PCI functions
    assert len(list((root / "sys/bus/pci/devices").iterdir())) == 26
    assert sorted(xid.host_gpus()) == ["0000:81:00.0", "0000:c1:00.0"]


def test_a_gpu_sysfs_lists_before_the_first_read_is_known_to_that_read(journal):
    """The first read runs before any scrape: the watch asks sysfs itself (issue 42, item 1)."""
    flood = [f"NVRM: Xid (PCI:{n:04x}:01:00): 79, x" for n in range(1, xid.MAX_GPUS + 10)]
    journal.kernel(flood + [XID_63], T0)
    watch = caught_up(xid.Watch(known=lambda: ["0000:10:1c.0"]))
    counts = series(watch.samples(None), "nvidia_vgpu_xid_errors")
    assert counts[("0000:10:1c.0", "63")] == 1
    assert {g for g, _ in counts} == {"0000:10:1c.0"}
