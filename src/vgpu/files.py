"""Replacing host files whole: a reader sees the old content or the new, never half."""

import errno
import os
import tempfile
from pathlib import Path


def write_atomic(target: Path, content: str, mode: int = 0o644) -> None:
    """Replace ``target`` with ``content`` through a temporary file in its own directory.

    Missing directories are made; a file where a directory belongs is
    NotADirectoryError (an OSError whose strerror says so, for messages).
    """
    if target.parent.exists() and not target.parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
