"""vgpu.hostlock: one flock for the boot step and the hooks, and its file gone with the charm.

Removing a lock file is safe only if every holder checks, once it has the
lock, that it locked the file still at the path: a process that opened the
file before it was unlinked would otherwise "hold" a lock no one else sees.
"""

import fcntl
import os
import threading

import pytest

from unit_tests.test_charm_sriov import held_elsewhere
from vgpu import hostlock
from vgpu.errors import HostBusyError


def test_remove_deletes_the_lock_file_and_its_directory(root):
    with hostlock.held(0):
        assert (root / hostlock.FILE).exists()
    assert hostlock.remove()
    assert not (root / hostlock.DIRECTORY).exists()
    assert (root / "run").is_dir()  # /run itself is the host's
    assert not hostlock.remove()  # nothing left to remove


def test_remove_leaves_the_lock_to_a_holder_past_the_wait(root):
    with hostlock.held(0):
        with pytest.raises(HostBusyError):
            hostlock.remove(wait=0.05)
        assert held_elsewhere(root)
    assert hostlock.remove()


def test_a_waiter_on_the_removed_file_takes_the_lock_on_the_file_at_the_path(root, monkeypatch):
    """The boot step opened the file, then the charm's remove unlinked it before it had the lock."""
    opened = threading.Event()
    real = hostlock._open

    def signalling_open():
        fd = real()
        opened.set()
        return fd

    first = real()
    fcntl.flock(first, fcntl.LOCK_EX)  # the remove hook holds the lock
    monkeypatch.setattr(hostlock, "_open", signalling_open)
    seen = []

    def boot_step():
        with hostlock.held(30, poll=0.01):
            seen.append(held_elsewhere(root))

    waiter = threading.Thread(target=boot_step)
    waiter.start()
    try:
        assert opened.wait(30)
        os.unlink(root / hostlock.FILE)  # what remove does while it holds the lock
        os.rmdir(root / hostlock.DIRECTORY)
    finally:
        os.close(first)  # remove's lock released
        waiter.join(30)
    assert seen == [True]  # it holds the lock others see, not one on the unlinked file
