"""vgpu.hostroot: every host path under VGPU_HOST_ROOT, shown as on the host, read in full."""

import os
import threading
from pathlib import Path

import pytest

from vgpu import hostroot
from vgpu.errors import HostReadError


def test_a_host_path_given_with_a_leading_slash_stays_under_the_root(root):
    assert hostroot.path("/etc/modprobe.d", "/x.conf") == root / "etc/modprobe.d/x.conf"
    assert hostroot.text_path("/sys/bus/pci/devices") == str(root / "sys/bus/pci/devices")
    assert hostroot.shown(hostroot.path("/var/lib/dpkg/status")) == "/var/lib/dpkg/status"


def test_without_a_root_set_the_host_is_the_machine_itself(monkeypatch):
    monkeypatch.delenv(hostroot.ENV, raising=False)
    assert hostroot.path("sys/bus/pci/devices") == Path("/sys/bus/pci/devices")
    assert hostroot.text_path("sys/bus/pci/devices") == "/sys/bus/pci/devices"
    assert hostroot.is_real_root()


def test_a_path_outside_the_root_is_shown_as_it_is(root):
    assert hostroot.shown("/var/lib/juju/agents/unit-x/resources/driver.deb") == \
        "/var/lib/juju/agents/unit-x/resources/driver.deb"


def test_an_unreadable_path_is_named_in_at_most_100_characters(root):
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    with pytest.raises(HostReadError) as error:
        hostroot.read_text(deep)
    shown = str(error.value).removeprefix("cannot read ").removesuffix(": Is a directory")
    assert shown == f"/{'d' * 60}/{'e' * 35}..." and len(shown) == 100


def test_an_error_without_a_reason_is_named_by_its_kind(root):
    error = hostroot.unreadable(root / "proc/cmdline", TimeoutError())
    assert str(error) == "cannot read /proc/cmdline: TimeoutError"


def test_a_file_that_reports_no_size_is_read_whole_past_64_kib(root):
    # /proc files report a size of 0 and are read in pieces: a FIFO behaves the same way.
    fifo = root / "proc/modules"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    content = b"".join(f"module_{n} 16384 0 - Live 0x0\n".encode() for n in range(5000))
    assert len(content) > 2 * 65536

    def write():
        with open(fifo, "wb") as handle:
            for start in range(0, len(content), 4096):
                handle.write(content[start:start + 4096])
                handle.flush()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert hostroot.read_bytes(fifo) == content
    finally:
        writer.join(timeout=10)


def test_a_file_past_its_readers_bound_is_refused_having_read_one_byte_more(root):
    status = root / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_bytes(b"Package: x\n\xff")
    assert hostroot.read_bytes(status, limit=12) == b"Package: x\n\xff"
    with pytest.raises(HostReadError) as error:
        hostroot.read_text(status, limit=11)
    assert str(error.value) == "cannot read /var/lib/dpkg/status: more than 11 bytes"


def test_a_file_that_reports_no_size_is_read_no_further_than_its_bound(root):
    fifo = root / "proc/modules"  # endless, as a misbehaving /proc file could be
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    written = []

    def write():
        try:
            with open(fifo, "wb") as handle:
                while sum(written) < 1 << 22:
                    written.append(handle.write(b"m" * 4096))
                    handle.flush()
        except BrokenPipeError:
            pass  # the reader stopped

    writer = threading.Thread(target=write)
    writer.start()
    try:
        with pytest.raises(HostReadError) as error:
            hostroot.read_bytes(fifo, limit=100_000)
    finally:
        writer.join(timeout=10)
    assert str(error.value) == "cannot read /proc/modules: more than 100000 bytes"
    assert sum(written) < 1 << 22  # the reader stopped it long before
