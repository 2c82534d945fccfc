"""What dpkg says is installed, read from its database under the host root.

One read of ``var/lib/dpkg/status`` per call; only the stanzas asked for are
kept, so the update-status path stays cheap on hosts with thousands of
packages. What is installed is always dpkg's answer, never a stored copy.
"""

from dataclasses import dataclass
from typing import Dict, Iterable, Optional

from . import hostroot

STATUS = "var/lib/dpkg/status"


@dataclass(frozen=True)
class Package:
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


def admindir() -> str:
    return str(hostroot.path("var/lib/dpkg"))


def packages(names: Iterable[str] = (), prefixes: Iterable[str] = ()) -> Dict[str, Package]:
    """Packages whose name is in ``names`` or starts with one of ``prefixes``."""
    names = frozenset(names)
    prefixes = tuple(prefixes)
    found: Dict[str, Package] = {}
    try:
        text = hostroot.path(STATUS).read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return found
    for stanza in text.split("\n\n"):
        if not stanza.startswith("Package: "):
            stanza = stanza.lstrip("\n")
            if not stanza.startswith("Package: "):
                continue
        name = stanza[len("Package: "):stanza.find("\n") if "\n" in stanza else None].strip()
        if name not in names and not name.startswith(prefixes or ("\0",)):
            continue
        fields = _fields(stanza)
        pkg = Package(
            name=name,
            version=fields.get("Version", ""),
            architecture=fields.get("Architecture", ""),
            status=fields.get("Status", ""),
        )
        if pkg.present:
            found[name] = pkg
    return found


def package(name: str) -> Optional[Package]:
    return packages(names=[name]).get(name)


def compare_versions(a: str, b: str) -> int:
    """-1, 0 or 1 as Debian version ``a`` sorts before, with or after ``b`` (as dpkg does)."""
    ea, ua, ra = _split_version(a)
    eb, ub, rb = _split_version(b)
    return (ea > eb) - (ea < eb) or _compare_part(ua, ub) or _compare_part(ra, rb)


def _split_version(version: str):
    epoch, _, rest = version.strip().rpartition(":") if ":" in version else ("0", "", version.strip())
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
    return int(epoch or 0), upstream, revision


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit runs (with ~ first) and numeric runs."""
    i = j = 0
    while i < len(a) or j < len(b):
        while (i < len(a) and not a[i].isdigit()) or (j < len(b) and not b[j].isdigit()):
            ca = _order(a[i]) if i < len(a) and not a[i].isdigit() else 0
            cb = _order(b[j]) if j < len(b) and not b[j].isdigit() else 0
            if ca != cb:
                return (ca > cb) - (ca < cb)
            i += 1
            j += 1
        na = nb = 0
        while i < len(a) and a[i].isdigit():
            na = na * 10 + int(a[i])
            i += 1
        while j < len(b) and b[j].isdigit():
            nb = nb * 10 + int(b[j])
            j += 1
        if na != nb:
            return (na > nb) - (na < nb)
    return 0


def _fields(stanza: str) -> Dict[str, str]:
    fields = {}
    for line in stanza.splitlines():
        if line[:1] in (" ", "\t") or ":" not in line:
            continue
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return fields
