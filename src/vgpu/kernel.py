"""Kernel side of a vGPU host: the nouveau blacklist and why a reboot is due.

The blacklist is rendered from ``templates/blacklist-nouveau.conf`` in the
charm and written to ``<root>/etc/modprobe.d/``; every change is followed by
``update-initramfs -u`` so nouveau stays out of the initramfs too. When
``update-initramfs`` is not on PATH, or fails, the file change is undone
(so the next attempt repeats it) and InstallError is raised: keeping nouveau
away is part of preparing the host for the driver.
"""

import logging
import os
import shutil
from pathlib import Path
from string import Template
from typing import FrozenSet, Iterable, List, Optional

from . import APP, dpkg, files, hostroot, run
from .errors import CommandError, HostReadError, InstallError

log = logging.getLogger(__name__)

CHARM_ROOT = Path(__file__).resolve().parents[2]  # src/vgpu/kernel.py -> charm root
TEMPLATE = CHARM_ROOT / "templates" / "blacklist-nouveau.conf"
BLACKLIST = "etc/modprobe.d/nvidia-vgpu-blacklist-nouveau.conf"
INITRAMFS_TIMEOUT = 240


def blacklist_path() -> Path:
    """Where the blacklist lives under the host root."""
    return hostroot.path(BLACKLIST)


def render_blacklist() -> str:
    """The blacklist file's content."""
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(charm=APP)


def ensure_nouveau_blacklisted() -> bool:
    """Write the blacklist if its content differs, then refresh the initramfs.

    Returns True when the file changed (a reboot is then needed for it to
    take effect if nouveau is loaded). Raises InstallError when the file
    cannot be written or the initramfs refreshed; the file is then left as
    it was.
    """
    try:
        return _ensure_blacklisted()
    except HostReadError as error:
        raise InstallError(str(error)) from None
    except OSError as error:
        raise InstallError(f"cannot write /{BLACKLIST}: {error.strerror or error}") from None


def _ensure_blacklisted() -> bool:
    target = blacklist_path()
    content = render_blacklist()
    previous = hostroot.read_bytes(target)  # put back byte for byte should the refresh fail
    if previous == content.encode("utf-8"):
        return False
    files.write_atomic(target, content)
    try:
        update_initramfs()
    except InstallError:
        if previous is None:
            files.remove(target)
        else:
            files.write_atomic(target, previous)
        raise
    return True


def remove_blacklist() -> bool:
    """Delete the blacklist (charm removal); refresh the initramfs if it existed."""
    try:
        return _remove_blacklist()
    except HostReadError as error:
        raise InstallError(str(error)) from None
    except OSError as error:
        raise InstallError(f"cannot remove /{BLACKLIST}: {error.strerror or error}") from None


def _remove_blacklist() -> bool:
    target = blacklist_path()
    previous = hostroot.read_bytes(target)
    if previous is None:
        return False
    files.remove(target)
    try:
        update_initramfs()
    except InstallError:
        files.write_atomic(target, previous)
        raise
    return True


def update_initramfs() -> None:
    """Run ``update-initramfs -u`` from PATH; InstallError if missing or failing."""
    exe = shutil.which("update-initramfs")
    if exe is None:
        raise InstallError("update-initramfs not found; install initramfs-tools")
    try:
        run.run([exe, "-u"], INITRAMFS_TIMEOUT, what="update-initramfs -u")
    except CommandError as error:
        raise InstallError(str(error)) from None


def loaded_modules() -> FrozenSet[str]:
    """Names of the loaded kernel modules (``<root>/proc/modules``); empty if unreadable."""
    try:
        text = hostroot.read_text(hostroot.path("proc/modules")) or ""
    except HostReadError as error:
        log.warning("%s", error)
        return frozenset()
    return frozenset(line.split()[0] for line in text.splitlines() if line.strip())


def iommu_enabled() -> bool:
    """True when the kernel created IOMMU groups (``<root>/sys/kernel/iommu_groups``)."""
    try:
        with os.scandir(hostroot.path("sys/kernel/iommu_groups")) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def loaded_driver_version() -> Optional[str]:
    """Version of the loaded ``nvidia`` module (``<root>/sys/module/nvidia/version``)."""
    try:
        version = hostroot.read_text(hostroot.path("sys/module/nvidia/version"))
    except HostReadError as error:
        log.warning("%s", error)
        return None
    return (version or "").strip() or None


def reboot_reasons(modules: Optional[Iterable[str]] = None,
                   driver_installed: bool = False,
                   installed_version: Optional[str] = None,
                   loaded_version: Optional[str] = None) -> List[str]:
    """Why the host needs a reboot, in words; empty when it does not.

    Pure given ``modules`` (read from ``/proc/modules`` only when None). A
    loaded ``nvidia`` module older or newer than the installed package (after
    an upgrade) also needs a reboot: the module's version must equal the
    package's upstream version exactly (``570.158.0`` is not ``570.158.02``).
    """
    loaded = {m.replace("-", "_") for m in (loaded_modules() if modules is None else modules)}
    reasons = []
    if "nouveau" in loaded:
        reasons.append("nouveau is loaded")
    if driver_installed and "nvidia_vgpu_vfio" not in loaded:
        reasons.append("nvidia_vgpu_vfio is not loaded")
    elif (driver_installed and installed_version and loaded_version
          and dpkg.upstream(installed_version) != loaded_version):
        reasons.append(f"NVIDIA driver {loaded_version} is loaded, {installed_version} installed")
    return reasons

