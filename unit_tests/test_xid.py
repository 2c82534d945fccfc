"""Xid errors and lost GPUs (vgpu.xid): real kernel lines through a journalctl stand-in.

The metrics on a fixture host: test_metrics.py; the exporter's process: test_exporter.py;
Prometheus evaluating the alerts: test_prometheus.py and unit_tests/prometheus/.
"""

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


def test_a_journalctl_that_hangs_is_given_up_and_a_scrape_never_waits(journal):
    journal.kernel([XID_63], T0)
    watch = caught_up(xid.Watch())
    journal.hang()
    stop = threading.Event()
    thread = threading.Thread(target=watch.run, args=(stop,), kwargs={"pause": 0.05})
    xid.READ_SECONDS, saved = 1.0, xid.READ_SECONDS
    try:
        thread.start()
        time.sleep(0.2)  # the thread is inside a read that will not end
        started = time.monotonic()
        samples = watch.samples(["0000:10:1c.0"])
        assert time.monotonic() - started < 0.1
        assert series(samples, "nvidia_vgpu_xid_errors")[("0000:10:1c.0", "63")] == 1
        deadline = time.monotonic() + 10
        while watch.journal_up() is not False and time.monotonic() < deadline:
            time.sleep(0.05)
        assert watch.journal_up() is False  # the read that timed out is said
    finally:
        stop.set()
        journal.hang(False)
        thread.join(timeout=15)
        xid.READ_SECONDS = saved
    assert not thread.is_alive()


def test_a_journalctl_that_fails_is_said_and_what_was_read_stays(journal):
    journal.kernel([XID_63], T0)
    watch = caught_up(xid.Watch())
    journal.fail()
    watch.poll()
    assert watch.journal_up() is False
    assert series(watch.samples([]), "nvidia_vgpu_xid_errors")[("0000:10:1c.0", "63")] == 1
    journal.fail(False)
    watch.poll()
    assert watch.journal_up() is True


def test_without_journalctl_the_journal_is_said_unreadable(root, monkeypatch):
    monkeypatch.setenv("PATH", str(root))  # no journalctl there
    watch = xid.Watch()
    watch.poll()
    assert watch.journal_up() is False


def test_a_message_that_is_not_utf8_is_read(journal):
    journal.add("NVRM: Xid (PCI:0000:03:00): 31, name=\udcff\udcfe, MMU Fault", T0)
    watch = caught_up(xid.Watch())
    assert series(watch.samples([]), "nvidia_vgpu_xid_errors")[("0000:03:00.0", "31")] == 1


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


def test_a_flood_of_lines_cannot_grow_the_process(journal):
    watch = xid.Watch(reader=lambda cursor: xid.Chunk(tuple(
        xid.Entry(f"c{n}", T0, f"NVRM: Xid (PCI:{n:04x}:01:00): {n % 1000}, x")
        for n in range(5000)), complete=True))
    watch.poll()
    assert len({dict(s.labels)["gpu"] for s in watch.samples([])}) == xid.MAX_GPUS


def test_the_runbooks_reset_and_guest_xids_split_the_runbook():
    assert set(xid.numbers(xid.RESET)) | set(xid.numbers(xid.GUEST)) == {
        x.number for x in xid.RUNBOOK}
    assert 79 in xid.numbers(xid.RESET) and 31 in xid.numbers(xid.GUEST)
