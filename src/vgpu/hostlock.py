"""One lock for every change to VFs, their vGPU types, GPU instances and mdevs.

The boot step (:mod:`vgpu.boot`, run by ``nvidia-vgpu-vfs.service``) and the
charm's hooks both change them; after a reboot the Juju agent may run a hook
while the boot step is still restoring. Both take an exclusive ``flock`` on
:data:`FILE` first: the boot step for its whole run, a hook for all its host
work, each reading the VFs only once it holds the lock. A hook waits at most
:data:`HOOK_WAIT` seconds, then leaves its work to the next hook (the status
says so) rather than read VFs half restored. The lock is the kernel's: it
goes with the process that held it, even one killed; ``/run`` is emptied at
boot. The charm's remove deletes the file while it holds the lock; whoever
then gets the lock on the unlinked file takes it again on a new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from typing import Iterator

from . import files, hostroot
from .errors import HostBusyError

DIRECTORY, NAME = "run/nova-compute-nvidia-vgpu", "host.lock"
FILE = f"{DIRECTORY}/{NAME}"
HOOK_WAIT = 30.0  # seconds a hook waits for the boot step
BOOT_WAIT = 120.0  # seconds the boot step waits for a hook (sriov-manage may be running)
POLL = 0.1


@contextlib.contextmanager
def held(wait: float, poll: float = POLL) -> Iterator[None]:
    """Hold the host lock within the block; HostBusyError when not had within ``wait`` seconds.

    OSError when the lock file cannot be made or opened (a link on the way).
    """
    deadline = time.monotonic() + wait
    while True:
        fd = _open()
        try:
            _take(fd, deadline, wait, poll)
        except BaseException:
            os.close(fd)
            raise
        if os.fstat(fd).st_nlink:
            break
        os.close(fd)  # locked after :func:`remove` unlinked it: the lock is the new file's
    try:
        yield
    finally:
        os.close(fd)  # releases the lock


def _take(fd: int, deadline: float, wait: float, poll: float) -> None:
    """flock ``fd`` by ``deadline``; HostBusyError (naming ``wait``) when it cannot."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            left = deadline - time.monotonic()
            if left <= 0:
                raise HostBusyError(f"/{FILE} is held by another process after "
                                    f"{wait:g} s") from None
            time.sleep(min(poll, left))


def remove(wait: float = HOOK_WAIT) -> bool:
    """Delete the lock file and its directory (charm removal), holding the lock; True if they were there.

    A holder that opened the file before it was unlinked finds it unlinked
    once it has the lock and takes the lock again on a new file (see
    :func:`held`), so no two processes ever both think they hold it.
    HostBusyError when another process holds it past ``wait`` seconds
    (then it stays: ``/run`` is emptied at boot); OSError as :func:`held`.
    """
    if not os.path.lexists(hostroot.text_path(DIRECTORY)):
        return False
    with held(wait):
        directory = hostroot.path(DIRECTORY)
        files.remove(directory / NAME)
        files.remove_empty_directory(directory)
    return True


def _open() -> int:
    """The lock file's descriptor (made 0600, its directory 0700, when missing).

    ``/run`` is taken as given; below it no link is followed (``O_NOFOLLOW``),
    so the lock never creates a file elsewhere.
    """
    base, name = hostroot.text_path(DIRECTORY).rsplit("/", 1)
    os.makedirs(base, 0o755, exist_ok=True)  # always there on a host; not in every fixture tree
    run = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.mkdir(name, 0o700, dir_fd=run)
        except FileExistsError:
            pass
        directory = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                            dir_fd=run)
    finally:
        os.close(run)
    try:
        return os.open(NAME, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                       dir_fd=directory)
    finally:
        os.close(directory)
