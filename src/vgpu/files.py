"""The charm's own host files: replaced whole, read bounded, and never reached through a link.

A reader sees the old content or the new, never half: the new content goes
to a temporary file in the target's directory, which then replaces it.

Every directory between the host root and the file is entered one at a time,
refusing symbolic links (``O_NOFOLLOW``): a link such as
``/var/lib/nova-compute-nvidia-vgpu -> /etc/ssh`` would otherwise carry the
charm's writes (and removals) out of its own paths. The refusal is an
OSError whose strerror names the link and where it points, for messages.
A link in the target's own place is replaced, not written through. The host
root itself is taken as given.
"""

from __future__ import annotations

import errno
import os
import secrets
import stat
from pathlib import Path
from typing import Optional, Union

from . import hostroot

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(target: Path, content: Union[str, bytes], mode: int = 0o644) -> None:
    """Replace ``target`` with ``content`` through a temporary file in its own directory.

    Text is written as UTF-8, bytes as they are. Missing directories are made
    (0755); a file where a directory belongs is NotADirectoryError, a link
    there an OSError naming it (see the module doc).
    """
    data = content.encode("utf-8") if isinstance(content, str) else content
    directory = _open_directory(target, create=True)
    try:
        temporary, fd = _create_temporary(directory, target.name)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
                os.fchmod(handle.fileno(), mode)
            os.replace(temporary, target.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            try:
                os.unlink(temporary, dir_fd=directory)
            except FileNotFoundError:
                pass
            raise
    finally:
        os.close(directory)


def read(target: Path, limit: int) -> Optional[bytes]:
    """``target``'s bytes, any of them, at most ``limit``; None when it or a directory is missing.

    OSError (never a wait) when a directory on the way or the file itself is a link, when it
    is not a regular file, or when it holds more than ``limit`` bytes.
    """
    try:
        directory = _open_directory(target, create=False)
    except FileNotFoundError:
        return None
    try:
        # O_NONBLOCK: a FIFO in the file's place is refused below instead of waited on.
        fd = os.open(target.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
                     dir_fd=directory)
    except FileNotFoundError:
        return None
    finally:
        os.close(directory)
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, f"{hostroot.shown(target)} is not a regular file")
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise OSError(errno.EFBIG, f"{hostroot.shown(target)} is larger than {limit} bytes")
    return data


def masked(*targets: Path) -> bool:
    """Whether any of ``targets`` is a link to ``/dev/null``: how ``systemctl mask`` masks a unit."""
    for target in targets:
        try:
            if os.readlink(target) == os.devnull:
                return True
        except OSError:
            continue
    return False


def remove(target: Path) -> bool:
    """Delete ``target`` (a file or a link); False when it was not there."""
    try:
        directory = _open_directory(target, create=False)
    except FileNotFoundError:
        return False
    try:
        os.unlink(target.name, dir_fd=directory)
    except FileNotFoundError:
        return False
    finally:
        os.close(directory)
    return True


def remove_empty_directory(target: Path) -> bool:
    """Delete the directory ``target`` if it is empty; False when it is not there or not empty."""
    try:
        directory = _open_directory(target, create=False)
    except FileNotFoundError:
        return False
    try:
        os.rmdir(target.name, dir_fd=directory)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTEMPTY, errno.EEXIST):
            return False
        raise
    finally:
        os.close(directory)
    return True


def _open_directory(target: Path, create: bool) -> int:
    """A descriptor of ``target``'s directory, entered from the host root without following links."""
    base = hostroot.root()
    try:
        parts = target.parent.relative_to(base).parts
    except ValueError:
        raise OSError(errno.EXDEV, f"{target} is outside the host root {base}") from None
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for depth, name in enumerate(parts):
            inner = _enter(fd, name, create, base.joinpath(*parts[:depth + 1]))
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _enter(parent: int, name: str, create: bool, where: Path) -> int:
    """Open the directory ``name`` in ``parent`` (made first when missing and ``create``)."""
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except FileNotFoundError:
        if not create:
            raise
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _not_a_directory(parent, name, where) from None
        raise
    try:
        os.mkdir(name, 0o755, dir_fd=parent)
    except FileExistsError:
        pass  # made meanwhile: it is checked as it is opened
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _not_a_directory(parent, name, where) from None
        raise


def _not_a_directory(parent: int, name: str, where: Path) -> OSError:
    """Why ``name`` cannot be entered: a link (named with its target) or not a directory."""
    try:
        if stat.S_ISLNK(os.lstat(name, dir_fd=parent).st_mode):
            points = os.readlink(name, dir_fd=parent)
            return OSError(errno.ELOOP, f"{hostroot.shown(where)} is a symbolic link (to "
                                        f"{points}); the charm never writes through a link")
    except OSError:
        pass
    return NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))


def _create_temporary(directory: int, name: str):
    """(name, descriptor) of a new hidden file named after ``name`` in ``directory``."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    while True:
        temporary = f".{name}.{secrets.token_hex(4)}"
        try:
            return temporary, os.open(temporary, flags, 0o600, dir_fd=directory)
        except FileExistsError:
            continue
