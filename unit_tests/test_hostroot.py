"""vgpu.hostroot: every host path under VGPU_HOST_ROOT, shown as on the host, read in full."""

import errno
import os
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
    # /proc files are regular files that report a size of 0 and are read in pieces: the
    # kernel's own /proc/kallsyms (megabytes) stands for one under the root.
    (root / "proc").mkdir()
    (root / "proc/kallsyms").symlink_to("/proc/kallsyms")
    with open("/proc/kallsyms", "rb") as handle:
        content = handle.read()
    assert os.stat("/proc/kallsyms").st_size == 0 and len(content) > 2 * 65536
    assert hostroot.read_bytes(root / "proc/kallsyms") == content


def test_a_file_past_its_readers_bound_is_refused_having_read_one_byte_more(root):
    status = root / "var/lib/dpkg/status"
    status.parent.mkdir(parents=True)
    status.write_bytes(b"Package: x\n\xff")
    assert hostroot.read_bytes(status, limit=12) == b"Package: x\n\xff"
    with pytest.raises(HostReadError) as error:
        hostroot.read_text(status, limit=11)
    assert str(error.value) == "cannot read /var/lib/dpkg/status: more than 11 bytes"


def test_a_file_that_reports_no_size_is_read_no_further_than_its_bound(root):
    (root / "proc").mkdir()
    (root / "proc/kallsyms").symlink_to("/proc/kallsyms")  # megabytes, reporting a size of 0
    with pytest.raises(HostReadError) as error:
        hostroot.read_bytes(root / "proc/kallsyms", limit=100_000)
    assert str(error.value) == "cannot read /proc/kallsyms: more than 100000 bytes"


def test_a_fifo_where_a_file_belongs_is_refused_without_waiting_for_a_writer(root):
    # Nobody ever opens it for writing: a blocking open would wait forever (issue 34 item 1).
    qemu = root / "etc/libvirt/qemu"
    qemu.mkdir(parents=True)
    os.mkfifo(qemu / "instance-1.xml")
    with pytest.raises(HostReadError) as error:
        hostroot.read_text(qemu / "instance-1.xml")
    assert str(error.value) == "cannot read /etc/libvirt/qemu/instance-1.xml: not a regular file"


@pytest.mark.parametrize("device", ["/dev/kmsg", "/dev/zero", "/dev/null"])
def test_a_link_to_a_device_is_refused_without_reading_it(root, device):
    # /dev/kmsg blocks a reader at the end of the log; /dev/zero never ends.
    run = root / "run/libvirt/qemu"
    run.mkdir(parents=True)
    (run / "instance-2.xml").symlink_to(device)
    with pytest.raises(HostReadError) as error:
        hostroot.read_bytes(run / "instance-2.xml")
    assert str(error.value) == "cannot read /run/libvirt/qemu/instance-2.xml: not a regular file"


def test_a_read_that_outlasts_its_time_is_refused(root, monkeypatch):
    # A regular file whose filesystem answers slowly (a FUSE or network mount): each piece
    # read is checked against the reader's deadline, so a hook or scrape is never held past it.
    (root / "proc").mkdir()
    (root / "proc/kallsyms").symlink_to("/proc/kallsyms")  # read in pieces of 64 KiB
    now = iter(range(0, 1000, 10))  # each look at the clock 10 s later
    monkeypatch.setattr(hostroot, "_clock", lambda: next(now))
    with pytest.raises(HostReadError) as error:
        hostroot.read_bytes(root / "proc/kallsyms")
    assert str(error.value) == (f"cannot read /proc/kallsyms: took more than "
                                f"{hostroot.SECONDS} seconds")


def test_open_regular_says_what_it_refused_and_keeps_no_descriptor(root):
    """A directory is EISDIR, a FIFO EINVAL ("not a regular file"), each closed again unread."""
    (root / "folder").mkdir()
    os.mkfifo(root / "fifo")
    before = sorted(os.listdir("/proc/self/fd"))
    for name, number, words in (("folder", errno.EISDIR, "Is a directory"),
                                ("fifo", errno.EINVAL, "not a regular file")):
        with pytest.raises(OSError) as refused:
            hostroot.open_regular(root / name)
        assert (refused.value.errno, refused.value.strerror) == (number, words)
    assert sorted(os.listdir("/proc/self/fd")) == before
