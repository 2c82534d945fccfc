"""Text that reaches a status line, an action result or the logs: printable, one line, bounded.

Every host file the charm reads goes through :func:`clean` (by way of
``hostroot.read_text``), every value quoted in a message through
:func:`quote`, and every tool's stderr through :func:`cause`. Juju's
``status-set`` refuses a NUL, and a newline would break the one-line status.
"""

from __future__ import annotations

import errno
import json
import os
import re
from typing import Iterable, List

REPLACEMENT = "\ufffd"
STATUS_LIMIT = 160  # a tool's cause, in a status message

_KEEP = "\n\t"
# Paragraphs of tool output that are not the cause of a failure.
# Patterns (IGNORECASE), compiled by ``re`` when a tool failed: not on every hook.
_NOISE = r"(?:dpkg: )?(?:warning|note)\b|W: |N: |Note: |See |\(Reading |Errors were encountered"
_PREFIX = r"^(?:dpkg(?:-deb)?: (?:error: )?|E: |error: )"


def clean(text: str) -> str:
    """``text`` with every unprintable character but newline and tab as U+FFFD."""
    if text.replace("\n", "").replace("\t", "").isprintable():
        return text  # the usual case, at C speed (a dpkg status file is megabytes)
    return "".join(c if c.isprintable() or c in _KEEP else REPLACEMENT for c in text)


def decode(data: bytes) -> str:
    """Bytes from a host file as clean text: invalid UTF-8 and NUL become U+FFFD."""
    return clean(data.decode("utf-8", errors="replace"))


def one_line(text: str, limit: int = STATUS_LIMIT) -> str:
    """``text`` on one line (whitespace runs as one space), printable, at most ``limit`` long."""
    line = " ".join(clean(str(text)).split())
    return line if len(line) <= limit else line[:limit - 3] + "..."


def quote(value, limit: int = 40) -> str:
    """A value as it may appear in a one-line status: JSON-escaped, quoted and bounded."""
    text = json.dumps(str(value))
    return text if len(text) <= limit else text[: limit - 4] + '..."'


def listing(items: Iterable[str], limit: int = 4) -> str:
    """``a, b, c, d and 2 more``: at most ``limit`` items named."""
    items = list(items)
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"


def cause(output: str, limit: int = STATUS_LIMIT) -> str:
    """The cause of a tool's failure from its stderr, first, on one bounded line.

    The cause is the first paragraph (a line and the indented lines under
    it) that is not a warning, a note or dpkg's closing summary: dpkg says
    what went wrong first and then adds advice ("Note: removing the lock
    file is always wrong ..."). A heading that ends in a colon ("error
    processing archive x.deb (--install):") follows the lines under it. When
    the result is longer than ``limit`` and
    ends in an error text of the C library (``No space left on device``),
    that text goes first so bounding never cuts it off.
    """
    for paragraph in _paragraphs(output):
        if re.match(_NOISE, paragraph[0], re.IGNORECASE):
            continue
        head, details = paragraph[0], [" ".join(line.split()) for line in paragraph[1:]]
        if details and head.endswith(":"):
            # "error processing archive x.deb (--install):" then what went wrong: that first.
            text = f"{' '.join(details)} ({re.sub(_PREFIX, '', head, flags=re.IGNORECASE).rstrip(':')})"
        else:
            text = re.sub(_PREFIX, "", " ".join([head, *details]), flags=re.IGNORECASE)
        return _bounded(text, limit)
    return ""


def _paragraphs(output: str) -> Iterable[List[str]]:
    current: List[str] = []
    for line in clean(output).splitlines():
        if not line.strip():
            if current:
                yield current
            current = []
        elif line[:1].isspace() and current:
            current.append(line.strip())
        else:
            if current:
                yield current
            current = [line.strip()]
    if current:
        yield current


def _bounded(text: str, limit: int) -> str:
    text = one_line(text, len(text))  # cleaned, one line: never longer than it was
    if len(text) <= limit:
        return text
    # strerror texts ("No space left on device"): the cause a long line must not lose.
    for error in sorted({os.strerror(n) for n in errno.errorcode}, key=len, reverse=True):
        at = text.rfind(error)
        if at > 0:
            rest = (text[:at] + text[at + len(error):]).rstrip(" :()")
            return one_line(f"{error}: {rest}", limit)
    return one_line(text, limit)
