"""vgpu.files: host files replaced whole, never through a link out of the charm's paths.

The host root is a fixture tree; the links point at a directory standing for
``/etc/ssh``, inside the tree or outside it.
"""

import os
from pathlib import Path

import pytest

from unit_tests.faketools import OPENED
from vgpu import files


@pytest.fixture
def ssh(root):
    """``/etc/ssh`` with a file in it: what a link out of the charm's paths would reach."""
    path = root / "etc/ssh"
    path.mkdir(parents=True)
    (path / "sshd_config").write_text("PermitRootLogin no\n")
    return path


def untouched(ssh):
    assert sorted(os.listdir(ssh)) == ["sshd_config"]
    assert (ssh / "sshd_config").read_text() == "PermitRootLogin no\n"


def test_a_file_is_written_whole_and_its_directories_made(root):
    target = root / "var/lib/nova-compute-nvidia-vgpu/vgpu-types.json"
    files.write_atomic(target, "{}\n", mode=0o640)
    assert target.read_text() == "{}\n"
    assert oct(target.stat().st_mode & 0o777) == "0o640"
    assert os.listdir(target.parent) == ["vgpu-types.json"]
    files.write_atomic(target, b"[]\n")
    assert target.read_bytes() == b"[]\n"


@pytest.mark.parametrize("link", ["var/lib/nova-compute-nvidia-vgpu", "var/lib", "var"])
def test_a_linked_directory_on_the_way_is_refused_and_named(root, ssh, link):
    place = root / link
    place.parent.mkdir(parents=True, exist_ok=True)
    place.symlink_to(ssh)  # absolute, as an operator's ln -s would make it
    target = root / "var/lib/nova-compute-nvidia-vgpu/vgpu-types.json"
    with pytest.raises(OSError) as error:
        files.write_atomic(target, "{}\n")
    assert error.value.strerror == (
        f"/{link} is a symbolic link (to {ssh}); the charm never writes through a link")
    untouched(ssh)


def test_a_relative_link_inside_the_root_is_refused_too(root, ssh):
    (root / "etc/systemd").mkdir(parents=True)
    (root / "etc/systemd/system").symlink_to("../ssh")
    with pytest.raises(OSError) as error:
        files.write_atomic(root / "etc/systemd/system/nvidia-vgpu-vfs.service", "[Unit]\n")
    assert error.value.strerror.startswith("/etc/systemd/system is a symbolic link (to ../ssh)")
    untouched(ssh)


def test_a_file_where_a_directory_belongs_is_not_a_directory(root):
    (root / "etc").mkdir()
    (root / "etc/modprobe.d").write_text("a file")
    with pytest.raises(OSError) as error:
        files.write_atomic(root / "etc/modprobe.d/blacklist.conf", "x\n")
    assert error.value.strerror == "Not a directory"


def test_a_linked_target_file_is_replaced_not_written_through(root, ssh):
    target = root / "var/lib/nova-compute-nvidia-vgpu/vgpu-types.json"
    target.parent.mkdir(parents=True)
    target.symlink_to(ssh / "sshd_config")
    files.write_atomic(target, "{}\n")
    assert not target.is_symlink() and target.read_text() == "{}\n"
    untouched(ssh)


def test_a_path_outside_the_host_root_is_refused(root, tmp_path):
    with pytest.raises(OSError) as error:
        files.write_atomic(tmp_path / "elsewhere" / "x", "x")
    assert "outside the host root" in error.value.strerror
    assert not (tmp_path / "elsewhere").exists()


def test_read_is_bounded_and_follows_no_link(root, ssh):
    target = root / "var/lib/nova-compute-nvidia-vgpu/vgpu-types.json"
    assert files.read(target, 10) is None  # no directory yet
    target.parent.mkdir(parents=True)
    assert files.read(target, 10) is None
    target.write_bytes(b"0123456789")
    assert files.read(target, 10) == b"0123456789"
    target.write_bytes(b"0123456789A")
    with pytest.raises(OSError) as error:
        files.read(target, 10)
    assert error.value.strerror == "/var/lib/nova-compute-nvidia-vgpu/vgpu-types.json is larger than 10 bytes"
    target.unlink()
    target.symlink_to(ssh / "sshd_config")
    with pytest.raises(OSError):
        files.read(target, 100)
    target.unlink()
    os.rmdir(target.parent)
    target.parent.symlink_to(ssh)
    with pytest.raises(OSError) as error:
        files.read(target.parent / "sshd_config", 100)
    assert "is a symbolic link" in error.value.strerror



def test_read_takes_any_bytes_and_refuses_a_fifo_without_waiting_for_a_writer(root):
    import signal

    target = root / "etc/systemd/system/nvidia-vgpu-vfs.service"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"Description=Fran\xe7ais\n")
    assert files.read(target, 100) == b"Description=Fran\xe7ais\n"
    target.unlink()
    os.mkfifo(target)

    def stuck(*_):
        raise AssertionError("files.read waited for a writer to open the FIFO")

    previous = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)  # a guard, not a timing: the read returns at once or never
    try:
        with pytest.raises(OSError) as error:
            files.read(target, 100)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert error.value.strerror == "/etc/systemd/system/nvidia-vgpu-vfs.service is not a regular file"

# -- temporary files: beside their target, and gone after a failure --------------------

def test_write_atomic_creates_its_temporary_file_in_the_target_directory(tmp_path, moves):
    target = tmp_path / "etc/systemd/system/unit.service"
    with OPENED as opened:
        files.write_atomic(target, "[Unit]\n")
    # Opened by name in the target's directory (its descriptor), then renamed there.
    (written,) = opened.writes
    assert written == Path(written.name)
    assert moves == [(written.name, "unit.service", str(target.parent), str(target.parent))]
    # Hidden and named after its target: nothing reading the directory takes it for a unit,
    # and one left by a crash says what it was.
    assert written.name.startswith(".unit.service.")
    assert target.read_text() == "[Unit]\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(target.parent) == ["unit.service"]


def test_a_failed_replace_leaves_no_temporary_file_behind(tmp_path):
    target = tmp_path / "etc" / "unit.service"
    (target / "occupied").mkdir(parents=True)  # a directory where the file belongs
    with pytest.raises(OSError):
        files.write_atomic(target, "[Unit]\n")
    assert os.listdir(target.parent) == ["unit.service"]
    assert os.listdir(target) == ["occupied"]


def test_a_failed_write_leaves_no_temporary_file_behind(tmp_path):
    target = tmp_path / "unit.service"
    with pytest.raises(UnicodeEncodeError):
        files.write_atomic(target, "bad \udcff surrogate")
    assert os.listdir(tmp_path) == []


def test_remove_deletes_the_file_and_then_its_empty_directory(root, ssh):
    target = root / "var/lib/nova-compute-nvidia-vgpu/vgpu-types.json"
    assert files.remove(target) is False
    files.write_atomic(target, "{}\n")
    (target.parent / "other").write_text("kept")
    assert files.remove(target) is True
    assert files.remove_empty_directory(target.parent) is False  # not empty: kept
    (target.parent / "other").unlink()
    assert files.remove_empty_directory(target.parent) is True
    assert not target.parent.exists() and (root / "var/lib").is_dir()
    # Through a linked directory nothing is removed.
    target.parent.symlink_to(ssh)
    with pytest.raises(OSError):
        files.remove(target.parent / "sshd_config")
    untouched(ssh)
