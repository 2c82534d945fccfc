"""The one root under which every host path is read or written, and the one way to read it.

``VGPU_HOST_ROOT`` (default ``/``) lets tests and the sample-host demo point
the charm at a directory tree shaped like a real host: sysfs at
``<root>/sys``, dpkg's database at ``<root>/var/lib/dpkg``, ``/proc`` at
``<root>/proc`` and ``/etc`` at ``<root>/etc``.

Host text is read with :func:`read_text`, which decides once what a file's
bytes may become: invalid UTF-8 and NUL or other control bytes turn into
U+FFFD, so nothing read from the host can break a status line or reach the
relation raw. A path that does not exist reads as None; one that exists but
cannot be read (permissions, a symlink loop, a directory where a file
belongs) or holds more than its reader's bound (:data:`LIMIT` unless it says)
raises HostReadError naming it, never a bare OSError.

Every read is of a regular file only, opened non-blocking, and bounded in
size and in time (:data:`SECONDS`): a FIFO named ``*.xml`` in libvirt's
domain directories, or a link to ``/dev/kmsg``, is refused at once instead of
waited on (a hook, or the exporter's scrape, would hang on it). sysfs
attributes and ``/proc`` files are regular files. :func:`open_regular` is
the one way to open a host file for reading; readers of their own (sysfs
attributes read in one piece) go through it too.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from pathlib import Path
from typing import List, Optional, Union

from . import text
from .errors import HostReadError

ENV = "VGPU_HOST_ROOT"
# Bytes of one host file, unless its reader says less (or more: dpkg's status). A
# sysfs attribute is a page, nova.conf and a domain's XML some kilobytes.
LIMIT = 1 << 24
SECONDS = 10  # to read one host file: a regular file's reads never wait, a slow mount's may
_OPEN = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK  # a FIFO (or device) opens without a writer
_clock = time.monotonic
_FORMAT = 0o170000  # stat.S_IFMT's mask: the file's type


def root() -> Path:
    """The host root now in force."""
    return Path(os.environ.get(ENV) or "/")


def is_real_root() -> bool:
    """True when the charm works on the machine itself, not a fixture tree."""
    return root().resolve() == Path("/")


def path(*parts: str) -> Path:
    """A host path under the root: ``path("sys/bus/pci/devices")``."""
    return root().joinpath(*(str(p).lstrip("/") for p in parts))


def text_path(*parts: str) -> str:
    """``path(...)`` as a plain string, for readers of many small files (no pathlib objects)."""
    return os.path.join(os.environ.get(ENV) or "/", *(str(p).lstrip("/") for p in parts))


def shown(where: Union[str, Path]) -> str:
    """``where`` as the host sees it (``/var/lib/dpkg/status``), for messages."""
    where = Path(where)
    try:
        return "/" + str(where.relative_to(root()))
    except ValueError:
        return str(where)


def unreadable(where: Union[str, Path], error: OSError) -> HostReadError:
    """The HostReadError for ``error`` on ``where``, naming the host path."""
    return HostReadError(f"cannot read {text.one_line(shown(where), 100)}: "
                         f"{error.strerror or type(error).__name__}")


def read_text(where: Union[str, Path], *, clean: bool = True, limit: int = LIMIT) -> Optional[str]:
    """A host file's text, cleaned (see the module doc); None when it does not exist.

    ``clean=False`` keeps every character that decodes (invalid UTF-8 still
    becomes U+FFFD), for a parser that cleans each value it takes out: a
    control character in libvirt's XML must reach the XML parser as it is.
    ``limit``: as :func:`read_bytes` has it.
    """
    data = read_bytes(where, limit)
    if data is None:
        return None
    if not clean:
        return data.decode("utf-8", errors="replace")
    return text.decode(data)


def read_bytes(where: Union[str, Path], limit: int = LIMIT) -> Optional[bytes]:
    """A host file's raw bytes, for a reader that decodes (``text.decode``) only what it keeps.

    None when it does not exist; HostReadError when it cannot be read or
    holds more than ``limit`` bytes (no more than ``limit`` + 1 are read).
    """
    try:
        # os.open/os.read: a third of open()'s cost for sysfs' many tiny files (which
        # report 4096 bytes); a large file (dpkg's status) is read in one piece.
        fd = open_regular(where)
        try:
            deadline = _clock() + SECONDS
            data = os.read(fd, min(max(os.fstat(fd).st_size + 1, 65536), limit + 1))
            chunks = [data]
            size = len(data)
            while data and size <= limit:  # until the end: /proc files report no size
                if _clock() > deadline:
                    raise OSError(errno.ETIMEDOUT, f"took more than {SECONDS} seconds")
                data = os.read(fd, min(65536, limit + 1 - size))
                if data:
                    chunks.append(data)
                    size += len(data)
        finally:
            os.close(fd)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):  # it, or a folder above it, is not there
            return None
        raise unreadable(where, error) from None
    if size > limit:
        raise unreadable(where, OSError(errno.EFBIG, f"more than {limit} bytes"))
    return b"".join(chunks)  # one chunk: returned as it is, not copied


def open_regular(where: Union[str, Path]) -> int:
    """A descriptor of the regular file ``where``, opened non-blocking (links followed).

    OSError for anything else (a FIFO, a socket, a device, a directory): it is
    closed again unread, so nothing can hold the reader (see the module doc).
    """
    fd = os.open(where, _OPEN)
    try:
        mode = os.fstat(fd).st_mode
        if mode & _FORMAT != stat.S_IFREG:  # as stat.S_ISREG, without its call (sysfs: ~900 a hook)
            if stat.S_ISDIR(mode):
                raise OSError(errno.EISDIR, os.strerror(errno.EISDIR))
            raise OSError(errno.EINVAL, "not a regular file")
    except BaseException:
        os.close(fd)
        raise
    return fd


def listdir(where: Union[str, Path]) -> Optional[List[str]]:
    """A host directory's entries; None when it does not exist; HostReadError if unreadable."""
    try:
        return os.listdir(where)
    except OSError as error:
        if error.errno == errno.ENOENT:
            return None
        raise unreadable(where, error) from None
