"""GPUs given whole to guests (the mapping's ``passthrough`` key): vfio-pci before nvidia.

A whole GPU must be on ``vfio-pci`` when Nova hands it to a guest (its
device spec says ``"managed": "no"`` from Nova 31, so libvirt never rebinds
it) and must never be taken by ``nvidia`` at boot. Two things do that:

* now: its ``driver_override`` is set to ``vfio-pci`` (the kernel then lets
  only that driver probe it: drivers/pci/pci-driver.c,
  ``pci_match_device``); if ``nvidia`` holds it, it is unbound and probed
  again. The nvidia driver's ``unbindLock``
  (``/proc/driver/nvidia/gpus/<address>/unbindLock``, what NVIDIA's
  sriov-manage takes before it unbinds a GPU) is taken first: writing 1
  reads back 1 only when no client holds the GPU. Anything that holds it
  (nvidia-persistenced, DCGM, an exporter, a CUDA process) leaves the lock
  at 0: the GPU is then left on nvidia, untouched, with its
  ``driver_override`` set, and the unit says so (stop what holds it, or
  reboot: the udev rule takes it at the next boot). No service is stopped
  by the charm.
* at every boot, two ways, since either alone can lose to nvidia:

  - a modprobe configuration (:data:`MODPROBE_CONF`): ``softdep nvidia pre:
    vfio-pci`` makes every ``modprobe nvidia`` load vfio-pci first, and
    vfio-pci's ``install`` line sets each whole GPU's ``driver_override``
    before it loads (``modprobe --ignore-install``). So whatever loads nvidia
    first (the udev event of another GPU, a ``modprobe`` in the initramfs or a
    unit), the nvidia driver registers after the overrides are set, and its
    probe passes those GPUs by: with driver_override set only the named driver
    may bind (the kernel's ``driver_override`` ABI, sysfs-bus-pci; the same
    pattern for one GPU of a model on vfio-pci and another on the host driver:
    heiko-sieger.info, "Blacklisting Graphics Driver"; ArchWiki, "PCI
    passthrough via OVMF", driver_override).
  - a udev rule sets ``driver_override`` when the kernel adds the device,
    before 80-drivers.rules loads a driver for it
    (``IMPORT{builtin}="kmod load $env{MODALIAS}"``), and loads vfio-pci,
    which binds it. Alone it races: an nvidia already registered (loaded for
    an earlier GPU) probes a device at its ``add``, before udev's rule runs.

This module never imports ops; every path is under ``VGPU_HOST_ROOT``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, List, Optional

from . import APP, hostroot

logger = logging.getLogger(__name__)

VFIO_PCI = "vfio-pci"
RULES = f"etc/udev/rules.d/70-{APP}-passthrough.rules"
MODPROBE_CONF = f"etc/modprobe.d/{APP}-passthrough.conf"
UNBIND_LOCK = "proc/driver/nvidia/gpus/{address}/unbindLock"
DEVICES = "sys/bus/pci/devices"
DRIVERS = "sys/bus/pci/drivers"
PROBE = "sys/bus/pci/drivers_probe"


def rules(addresses: Iterable[str]) -> str:
    """The udev rules that give each GPU to vfio-pci when the kernel adds it (empty: none)."""
    lines = [f"# Written by the {APP} charm: GPUs given whole to guests (passthrough).",
             "# Each goes to vfio-pci before the nvidia driver can take it."]
    chosen = sorted(set(addresses))
    if not chosen:
        return ""
    for address in chosen:
        lines.append(f'ACTION=="add", SUBSYSTEM=="pci", KERNEL=="{address}", '
                     f'ATTR{{driver_override}}="{VFIO_PCI}", RUN+="/sbin/modprobe -b vfio-pci"')
    return "\n".join(lines) + "\n"


def modprobe_conf(addresses: Iterable[str]) -> str:
    """The modprobe configuration that loads vfio-pci, overrides set, before nvidia ("": none)."""
    chosen = sorted(set(addresses))
    if not chosen:
        return ""
    overrides = "; ".join(f"echo {VFIO_PCI} > /sys/bus/pci/devices/{a}/driver_override"
                          for a in chosen)
    return (f"# Written by the {APP} charm: GPUs given whole to guests (passthrough).\n"
            "# nvidia loads after vfio-pci, and vfio-pci after each whole GPU's driver_override.\n"
            f"softdep nvidia pre: {VFIO_PCI}\n"
            f"install {VFIO_PCI} {{ {overrides}; }} 2>/dev/null; "
            f"/sbin/modprobe --ignore-install {VFIO_PCI} $CMDLINE_OPTS\n")


def current_conf() -> str:
    """The modprobe configuration as it is ("" when absent)."""
    return hostroot.read_text(hostroot.path(MODPROBE_CONF), clean=False) or ""


def current_rules() -> str:
    """The udev rules file as it is ("" when absent): read once per hook."""
    return hostroot.read_text(hostroot.path(RULES), clean=False) or ""


def ensure_rules(addresses: Iterable[str], current: Optional[str] = None) -> bool:
    """The udev rules and the modprobe configuration say exactly ``addresses`` (removed when none).

    True when either changed. ``current``: the rules file's text as
    :func:`current_rules` read it (read here when None).
    """
    addresses = sorted(set(addresses))
    changed = _ensure(hostroot.path(MODPROBE_CONF), modprobe_conf(addresses),
                      current_conf())
    if current is None:
        current = current_rules()
    return _ensure(hostroot.path(RULES), rules(addresses), current) or changed


def _ensure(target: Path, wanted: str, current: str) -> bool:
    from . import files

    if current == wanted:
        return False
    if not wanted:
        return files.remove(target)
    files.write_atomic(target, wanted)
    return True


def take(address: str, driver: Optional[str]) -> Optional[str]:
    """Give the GPU at ``address`` (bound to ``driver`` now, no VFs) to vfio-pci; why not, else None.

    vfio-pci must be loaded first (:func:`load`); whether it took the GPU is
    read back afterwards (:func:`bound`): the probe's write says nothing.
    """
    device = hostroot.path(DEVICES, address)
    try:
        if _read(device / "driver_override") != VFIO_PCI:
            _write(device / "driver_override", VFIO_PCI)
        if driver == VFIO_PCI:
            return None
        if driver is not None:
            if not _unbind_lock(address):
                return (f"GPU {address} is held through the nvidia driver (nvidia-persistenced, "
                        "DCGM, an exporter or a CUDA process: its unbindLock stays 0), so it "
                        "stays on nvidia for now; it goes to vfio-pci once nothing holds it, or "
                        "at the next boot (driver_override and a udev rule are set)")
            _write(hostroot.path(DRIVERS, driver, "unbind"), address)
        _write(hostroot.path(PROBE), address)
    except OSError as error:
        return f"GPU {address}: cannot give it to vfio-pci: {error.strerror or error}"
    logger.info("GPU %s given to vfio-pci (was %s)", address, driver or "unbound")
    return None


def give_back(address: str, driver: Optional[str]) -> Optional[str]:
    """A GPU no longer given whole: its driver_override cleared, vfio-pci left, probed again."""
    device = hostroot.path(DEVICES, address)
    try:
        if _read(device / "driver_override") == VFIO_PCI:
            _write(device / "driver_override", "\n")
        if driver != VFIO_PCI:
            return None
        _write(hostroot.path(DRIVERS, VFIO_PCI, "unbind"), address)
        _write(hostroot.path(PROBE), address)
    except OSError as error:
        return f"GPU {address}: cannot hand it back from vfio-pci: {error.strerror or error}"
    return None


def overridden(text: str) -> List[str]:
    """The GPUs the udev rules ``text`` (:func:`current_rules`) gives to vfio-pci."""
    out = []
    for line in text.splitlines():
        if line.startswith('ACTION=="add"') and 'KERNEL=="' in line:
            out.append(line.split('KERNEL=="', 1)[1].split('"', 1)[0])
    return out


MODPROBE_TIMEOUT = 60  # one modprobe vfio-pci


def load() -> Optional[str]:
    """``modprobe vfio-pci`` (bounded); None once loaded, else why not.

    Writing ``drivers_probe`` loads no module: with driver_override set and
    vfio-pci not loaded the GPU is left unbound. ``nvidia_vgpu_vfio`` loads
    ``vfio_pci_core``, not ``vfio-pci``, so a vGPU host has it only once asked.
    """
    from . import run
    from .errors import CommandError

    try:
        run.run(["modprobe", VFIO_PCI], MODPROBE_TIMEOUT, what=f"modprobe {VFIO_PCI}")
    except CommandError as error:
        return str(error)
    return None


def bound(address: str) -> Optional[str]:
    """The driver holding ``address`` now, read back from sysfs (None: none).

    vfio-pci's directory is listed first: the kernel lists there each device it holds.
    """
    try:
        if address in os.listdir(hostroot.path(DRIVERS, VFIO_PCI)):
            return VFIO_PCI
    except OSError:
        pass
    try:
        return os.path.basename(os.readlink(hostroot.path(DEVICES, address, "driver")))
    except OSError:
        return None


def free(address: str) -> bool:
    """Whether no client holds the GPU through the nvidia driver (its unbindLock), left as it was.

    The lock is taken and given back at once: how the driver answers the
    question (``nv-procfs.c``: 1 reads back only while the GPU's usage count is 0).
    """
    lock = hostroot.path(UNBIND_LOCK.format(address=address))
    if not lock.exists():
        return True
    before = hostroot.read_text(lock, clean=False) or "0\n"
    try:
        taken = _unbind_lock(address)
    except OSError:
        return False
    try:
        _write(lock, before if before.strip() in ("0", "1") else "0\n")
    except OSError:
        pass
    return taken


def _unbind_lock(address: str) -> bool:
    """Take the nvidia driver's unbind lock of ``address``; True when nothing holds the GPU."""
    lock = hostroot.path(UNBIND_LOCK.format(address=address))
    if not lock.exists():
        return True  # a driver without the lock file (not NVIDIA's): the kernel's unbind decides
    _write(lock, "1")
    return _read(lock) == "1"


def _read(path: Path) -> str:
    return (hostroot.read_text(path) or "").strip()


def _write(path: Path, value: str) -> None:
    """One write of ``value`` to a sysfs (or procfs) attribute, as the kernel takes it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
