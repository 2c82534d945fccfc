"""The OpenStack release of the Nova on this host, and how it spells vGPU options.

The release is read from the installed ``nova-common`` version (dpkg's answer)
and mapped from Nova's major version here, not through charmhelpers, whose
table stops long before today's releases. A Nova newer than any release known
here is treated as the newest known one, so new hosts get today's format.
"""

from __future__ import annotations

from typing import Optional

from . import dpkg
from .errors import UnsupportedReleaseError
from .record import NamedTuple

NOVA_PACKAGE = "nova-common"

# Nova major version -> (series, codename)
RELEASES = {
    17: ("queens", "queens"),
    18: ("rocky", "rocky"),
    19: ("stein", "stein"),
    20: ("train", "train"),
    21: ("ussuri", "ussuri"),
    22: ("victoria", "victoria"),
    23: ("wallaby", "wallaby"),
    24: ("xena", "xena"),
    25: ("yoga", "yoga"),
    26: ("zed", "zed"),
    27: ("2023.1", "antelope"),
    28: ("2023.2", "bobcat"),
    29: ("2024.1", "caracal"),
    30: ("2024.2", "dalmatian"),
    31: ("2025.1", "epoxy"),
    32: ("2025.2", "flamingo"),
    33: ("2026.1", "gazpacho"),
    34: ("2026.2", "hibiscus"),
}
OLDEST = min(RELEASES)
NEWEST = max(RELEASES)

# How each range of releases spells the options (see Nova's [devices] docs).
SINGLE_TYPE = "single-type"    # queens..train: enabled_vgpu_types, first type only
VGPU_GROUPS = "vgpu-groups"    # ussuri..wallaby: enabled_vgpu_types + [vgpu_<type>]
MDEV_GROUPS = "mdev-groups"    # xena and later: enabled_mdev_types + [mdev_<type>]

# The first Nova whose device_spec and alias take live_migratable (Nova commit
# "Add live_migratable flag to PCI device specification", first in 31.0.0).
LIVE_MIGRATABLE_MAJOR = 31


class Release(NamedTuple):
    """An OpenStack release as Nova's major version identifies it."""
    nova_major: int
    series: str
    codename: str
    nova_version: str = ""

    @property
    def config_format(self) -> str:
        """Which nova.conf layout for vGPU options this release reads."""
        if self.nova_major <= 20:
            return SINGLE_TYPE
        if self.nova_major <= 23:
            return VGPU_GROUPS
        return MDEV_GROUPS

    @property
    def multiple_types(self) -> bool:
        """Whether this release takes more than one vGPU type (Ussuri and later)."""
        return self.config_format != SINGLE_TYPE

    @property
    def managed_no(self) -> bool:
        """``[pci] device_spec`` accepts ``"managed": "no"`` (epoxy, Nova 31, onwards)."""
        return self.nova_major >= 31

    @property
    def live_migratable(self) -> bool:
        """``[pci] device_spec`` and ``alias`` take ``live_migratable`` (epoxy, Nova 31, onwards)."""
        return self.nova_major >= LIVE_MIGRATABLE_MAJOR

    def __str__(self) -> str:
        """The release as a status message names it: ``2024.1 caracal (Nova 29)``."""
        name = self.series if self.series == self.codename else f"{self.series} {self.codename}"
        return f"{name} (Nova {self.nova_major})"


def from_major(major: int, version: str = "") -> Release:
    """The release of Nova ``major``; one newer than known is named and served as the newest."""
    if major < OLDEST:
        raise UnsupportedReleaseError(
            f"Nova {major} is older than queens (Nova {OLDEST}), the first with vGPU support")
    known = RELEASES[min(major, NEWEST)]
    return Release(nova_major=major, series=known[0], codename=known[1], nova_version=version)


def from_version(version: str) -> Release:
    """``3:29.0.0-0ubuntu1~cloud0`` -> caracal."""
    epoch, colon, rest = (version or "").partition(":")
    upstream = rest if colon and _digits(epoch) else version or ""
    major, dot, _ = upstream.partition(".")
    if not dot or not _digits(major):
        raise UnsupportedReleaseError(f"cannot read Nova's release from version {version!r}")
    return from_major(int(major), version)


def _digits(text: str) -> bool:
    """One or more ASCII digits, nothing else (str.isdigit takes ``²`` too)."""
    return text.isascii() and text.isdigit()


def installed(packages=None) -> Optional[Release]:
    """The release of the installed Nova, or None while nova-common is not installed."""
    if packages is None:
        packages = dpkg.packages(names=[NOVA_PACKAGE])
    package = packages.get(NOVA_PACKAGE)
    if package is None or not package.installed:
        return None
    return from_version(package.version)
