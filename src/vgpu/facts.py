"""One read of everything the charm needs to know about its host, per hook.

sysfs is read once (through ``sys/bus/pci/devices``), dpkg's status file
once, ``proc/modules`` once. The charm keeps the result for the rest of the
dispatch only; nothing is cached across hooks.
"""

from dataclasses import dataclass
from typing import Mapping, Optional

from . import dpkg, hostroot, pci, releases
from .errors import UnsupportedReleaseError

DRIVER_PREFIX = "nvidia-vgpu-ubuntu-"


@dataclass(frozen=True)
class Facts:
    host: pci.Host
    packages: Mapping[str, dpkg.Package]
    modules: frozenset

    @property
    def driver(self) -> Optional[dpkg.Package]:
        """The vGPU host driver package dpkg knows, in whatever state."""
        found = [p for n, p in sorted(self.packages.items()) if n.startswith(DRIVER_PREFIX)]
        return found[-1] if found else None

    def release(self) -> Optional[releases.Release]:
        """Nova's release, None while nova-common is not installed.

        Raises UnsupportedReleaseError for a Nova older than queens.
        """
        return releases.installed(self.packages)

    def release_problem(self) -> Optional[str]:
        try:
            self.release()
        except UnsupportedReleaseError as error:
            return str(error)
        return None


def loaded_modules() -> frozenset:
    try:
        text = hostroot.path("proc/modules").read_text()
    except OSError:
        return frozenset()
    return frozenset(line.split(" ", 1)[0] for line in text.splitlines() if line)


def gather() -> Facts:
    return Facts(
        host=pci.discover(),
        packages=dpkg.packages(names=[releases.NOVA_PACKAGE], prefixes=[DRIVER_PREFIX]),
        modules=loaded_modules(),
    )
