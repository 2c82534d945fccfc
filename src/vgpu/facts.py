"""One read of everything the charm needs to know about its host, per hook.

sysfs is read once (through ``sys/bus/pci/devices``), dpkg's status file
once, ``proc/modules`` once. The charm keeps the result for the rest of the
dispatch only; nothing is cached across hooks.
"""

from __future__ import annotations

from typing import List, Mapping, Optional

from . import dpkg, driver, kernel, pci, releases
from .errors import UnsupportedReleaseError
from .record import NamedTuple

# Packages of nova-compute's other subordinates (see vgpu.neighbours.PACKAGES).
NEIGHBOURS = ("ceilometer-agent-compute",)


class Facts(NamedTuple):
    """What one read of the host found; its methods derive answers without reading again."""

    pci: pci.Host  # what PCI discovery found: the GPUs, their VFs and vGPU types
    packages: Mapping[str, dpkg.Package]
    modules: frozenset
    loaded_driver_version: Optional[str] = None
    iommu: bool = False  # the kernel made IOMMU groups (VT-d / AMD-Vi is on)
    driver: Optional[dpkg.Package] = None  # the host driver dpkg knows, in whatever state
    services: tuple = ()  # vGPU services the installed driver ships (dpkg's file list)

    def release(self) -> Optional[releases.Release]:
        """Nova's release, None while nova-common is not installed.

        Raises UnsupportedReleaseError for a Nova older than queens.
        """
        return releases.installed(self.packages)

    def release_problem(self) -> Optional[str]:
        """Why Nova's release cannot be served (too old, unreadable), or None."""
        try:
            self.release()
        except UnsupportedReleaseError as error:
            return str(error)
        return None

    def supported_release(self) -> Optional[releases.Release]:
        """Nova's release, None while it is not installed or too old (see release_problem)."""
        return None if self.release_problem() else self.release()

    def iommu_problem(self) -> Optional[str]:
        """SR-IOV GPUs hand out virtual functions, which need the IOMMU."""
        sriov = [gpu.address for gpu in self.pci.gpus if gpu.sriov]
        if not sriov or self.iommu:
            return None
        return (f"IOMMU is off but SR-IOV GPU {sriov[0]} needs it: add intel_iommu=on iommu=pt "
                "(Intel) or amd_iommu=on (AMD) to the kernel command line, enable VT-d/AMD-Vi "
                "in firmware, reboot")

    def reboot_reasons(self) -> List[str]:
        """Why the host needs a reboot for the installed driver to work."""
        installed = self.driver if self.driver is not None and self.driver.installed else None
        return kernel.reboot_reasons(
            self.modules, driver_installed=installed is not None,
            installed_version=installed.version if installed else None,
            loaded_version=self.loaded_driver_version)


def gather() -> Facts:
    """Read the host once: PCI devices, dpkg's packages, modules, IOMMU, driver services."""
    packages = dpkg.packages(names=[releases.NOVA_PACKAGE, *NEIGHBOURS], prefixes=[driver.PREFIX])
    package = driver.installed_driver(packages)
    return Facts(
        pci=pci.discover(),
        packages=packages,
        modules=kernel.loaded_modules(),
        loaded_driver_version=kernel.loaded_driver_version(),
        iommu=kernel.iommu_enabled(),
        driver=package,
        services=driver.services_of(package.name) if package and package.installed else (),
    )
