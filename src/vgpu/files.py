"""Replacing host files whole: a reader sees the old content or the new, never half."""

import errno
import os
import tempfile
from pathlib import Path
from typing import Union


def write_atomic(target: Path, content: Union[str, bytes], mode: int = 0o644) -> None:
    """Replace ``target`` with ``content`` through a temporary file in its own directory.

    Text is written as UTF-8, bytes as they are. Missing directories are made;
    a file where a directory belongs is NotADirectoryError (an OSError whose
    strerror says so, for messages).
    """
    data = content.encode("utf-8") if isinstance(content, str) else content
    if target.parent.exists() and not target.parent.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
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
