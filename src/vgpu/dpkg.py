"""What dpkg says is installed, read from its database under the host root the way dpkg reads it.

dpkg keeps its state in ``var/lib/dpkg/status`` plus a journal: each change
is first written to a numbered file in ``var/lib/dpkg/updates/`` (``0000``,
``0001``, ...) and folded into ``status`` only at the next checkpoint. A dpkg
killed mid-upgrade leaves the journal saying ``half-configured`` while
``status`` still says ``installed``. So, as dpkg and ``dpkg-query`` do, the
journal files whose names are all digits are applied in order after
``status``, each stanza replacing the record of its package (of its
package and architecture for ``Multi-Arch: same`` packages, which dpkg
keeps one instance of per architecture). This happens in Python (no process per hook), and is checked
against ``dpkg-query --admindir`` in the tests.

Only the stanzas asked for are kept, so the update-status path stays cheap
on hosts with thousands of packages. What is installed is always dpkg's
answer, never a stored copy. Versions are ordered by dpkg itself
(``dpkg --compare-versions``), run only when two versions differ.
"""

from __future__ import annotations

from typing import Dict, Iterable, Iterator, Optional, Tuple

from . import hostroot, run, text
from .record import NamedTuple

STATUS = "var/lib/dpkg/status"
UPDATES = "var/lib/dpkg/updates"
COMPARE_TIMEOUT = 10
# Bytes of the status file or a journal file: a host with thousands of packages has a few MB.
LIMIT = 1 << 26


class Package(NamedTuple):
    """A package as dpkg's status file records it, in whatever state it is."""
    name: str
    version: str
    architecture: str
    status: str  # e.g. "install ok installed", "install ok half-configured"

    @property
    def installed(self) -> bool:
        """Fully installed and configured (not half-installed or unpacked)."""
        return self.status.split()[-1:] == ["installed"]

    @property
    def state(self) -> str:
        """dpkg's package state: installed, half-installed, unpacked, ..."""
        return self.status.split()[-1] if self.status else "unknown"

    @property
    def present(self) -> bool:
        """Any state that leaves files on disk (not purged or config-files only)."""
        return self.state not in ("not-installed", "config-files", "unknown")


def packages(names: Iterable[str] = (), prefixes: Iterable[str] = ()) -> Dict[str, Package]:
    """Packages whose name is in ``names`` or starts with one of ``prefixes``, journal applied.

    Raises HostReadError when the status file or a journal file exists but
    cannot be read.
    """
    names = frozenset(names)
    prefixes = tuple(prefixes) or ("\0",)
    records: Dict[Tuple[str, str], Package] = {}
    for source in _sources():
        content = hostroot.read_bytes(source, LIMIT)
        for pkg, same in _stanzas(content or b"", names, prefixes):
            records[(pkg.name, pkg.architecture if same else "")] = pkg
    found: Dict[str, Package] = {}
    for pkg in records.values():
        if pkg.present and (pkg.name not in found or not found[pkg.name].installed):
            found[pkg.name] = pkg
    return found


def package(name: str) -> Optional[Package]:
    """The package ``name`` as dpkg knows it now, or None when dpkg has no record of it."""
    return packages(names=[name]).get(name)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian version ``a`` sorts before, with or after ``b``, as dpkg orders them.

    Equal strings need no process; otherwise ``dpkg --compare-versions``
    decides. Raises ValueError, with dpkg's reason, for a version dpkg
    refuses, and CommandError when dpkg cannot be run.
    """
    if a == b:
        return 0
    for version in (a, b):
        if not (version[:1].isascii() and version[:1].isdigit()):
            # dpkg would warn, or take a leading "-" for one of its options
            raise ValueError(f"version {text.quote(version)} does not start with a digit")
    for op, answer in (("lt", -1), ("gt", 1)):
        result = run.run(["dpkg", "--compare-versions", a, op, b], COMPARE_TIMEOUT, check=False,
                         what="dpkg --compare-versions")
        if result.returncode == 0:
            return answer
        if result.returncode != 1:
            raise ValueError(text.cause(result.stderr) or f"cannot compare {a} with {b}")
    return 0


def upstream(version: str) -> str:
    """The upstream part of a Debian version: no epoch (``1:``), no revision (``-1ubuntu1``)."""
    version = version.strip()
    epoch, colon, rest = version.partition(":")
    if colon and epoch.isdigit():
        version = rest
    head, hyphen, _revision = version.rpartition("-")
    return head if hyphen else version


def _sources() -> Iterator:
    """``status``, then the journal files in the order dpkg applies them."""
    yield hostroot.path(STATUS)
    updates = hostroot.path(UPDATES)
    entries = hostroot.listdir(updates) or []
    # dpkg takes only names made of digits (it writes others, like tmp.i, first).
    journal = sorted((n for n in entries if n.isascii() and n.isdigit()), key=lambda n: (len(n), n))
    for name in journal:
        yield updates / name


def _stanzas(content: bytes, names: frozenset,
             prefixes: Tuple[str, ...]) -> Iterator[Tuple[Package, bool]]:
    """(package, whether it is Multi-Arch: same) for each wanted stanza, in file order.

    The wanted names are searched for as bytes (thousands of other stanzas
    are neither split nor decoded); a hit counts where it is the value of a
    ``Package:`` field, wherever in its stanza that field stands. The stanza
    runs from the blank line before the hit to the blank line after it, and
    only it is decoded (``text.decode``).
    """
    found = {}  # stanza start -> end
    for literal, exact in [(n, True) for n in names] + [(p, False) for p in prefixes if p != "\0"]:
        needle = literal.encode("utf-8")
        at = content.find(needle)
        while at >= 0:
            line = content.rfind(b"\n", 0, at) + 1
            key, colon, gap = content[line:at].partition(b":")
            end_of_line = content.find(b"\n", at)
            end_of_line = len(content) if end_of_line < 0 else end_of_line
            value = content[at:end_of_line].rstrip(b" \t")
            if (colon and key.lower() == b"package" and not gap.strip(b" \t")
                    and (value == needle if exact else not any(c in value for c in b" \t"))):
                start = content.rfind(b"\n\n", 0, line + 1)
                start = 0 if start < 0 else start + 2
                end = content.find(b"\n\n", end_of_line)
                found[start] = len(content) if end < 0 else end
            at = content.find(needle, at + 1)
    for start in sorted(found):
        fields = _fields(text.decode(content[start:found[start]]))
        name = fields.get("package", "")
        if not name or (name not in names and not name.startswith(prefixes)):
            continue
        yield (Package(name=name, version=fields.get("version", ""),
                       architecture=fields.get("architecture", ""), status=fields.get("status", "")),
               fields.get("multi-arch") == "same")


def _fields(stanza: str) -> Dict[str, str]:
    fields = {}
    for line in stanza.splitlines():
        if line[:1] in (" ", "\t") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields

