"""The fake libvirt host Nova's harness starts, read from a fixture host tree.

Nova's fakelibvirt (``nova.tests.fixtures.libvirt``) answers nova-compute's
node-device calls from a ``HostPCIDevicesInfo``. Its own devices carry fixed
ids and types (nvidia-11, nvidia-12), so here every device of the fixture
host (``unit_tests/fakehost.py``) becomes one with the XML libvirt would give
for it: the address (any PCI domain), vendor and product ids, driver,
``virt_functions``/``phys_function`` from the ``virtfnN``/``physfn`` links and
``mdev_types`` from ``mdev_supported_types`` (id, name, available instances).
The charm and nova-compute thus look at one host.
"""

import os
import re
from pathlib import Path

from nova.tests.fixtures import libvirt as fakelibvirt

DEVICE = """<device>
  <name>{name}</name>
  <path>/sys/devices/pci{domain:04x}:00/{address}</path>
  <parent>computer</parent>
  <driver><name>{driver}</name></driver>
  <capability type='pci'>
    <class>{klass}</class>
    <domain>{domain}</domain>
    <bus>{bus}</bus>
    <slot>{slot}</slot>
    <function>{function}</function>
    <product id='{product}'>{product_name}</product>
    <vendor id='{vendor}'>{vendor_name}</vendor>
{capabilities}
    <iommuGroup number='{group}'>
      <address domain='{domain:#06x}' bus='{bus:#04x}' slot='{slot:#04x}' function='{function:#x}'/>
    </iommuGroup>
    <numa node='0'/>
  </capability>
</device>"""
ADDRESS = "<address domain='{0:#06x}' bus='{1:#04x}' slot='{2:#04x}' function='{3:#x}'/>"
MDEV_TYPE = ("<type id='{id}'><name>{name}</name><deviceAPI>vfio-pci</deviceAPI>"
             "<availableInstances>{available}</availableInstances></type>")


def split(address: str):
    """0000:c1:00.0 -> (0, 0xc1, 0, 0)."""
    domain, bus, rest = address.split(":")
    slot, function = rest.split(".")
    return int(domain, 16), int(bus, 16), int(slot, 16), int(function, 16)


def nodedev_name(address: str) -> str:
    """libvirt's name for a PCI device: pci_0000_c1_00_0."""
    return "pci_" + re.sub(r"[:.]", "_", address)


def _read(path: Path, default: str = "") -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return default


class TreeDevice(fakelibvirt.FakePCIDevice):
    """One PCI device of the fixture tree, as libvirt's node-device XML shows it."""

    def __init__(self, directory: Path, group: int):  # noqa: D107 - fakelibvirt's own interface
        self.address = directory.name
        self.directory = directory
        self.group = group
        self.mac_address = None
        virtfns = sorted((n for n in os.listdir(directory) if n.startswith("virtfn")),
                         key=lambda n: int(n[len("virtfn"):]))
        self.vfs = [os.path.basename(os.path.realpath(directory / n)) for n in virtfns]
        physfn = directory / "physfn"
        self.pf = os.path.basename(os.path.realpath(physfn)) if physfn.exists() else None
        types = directory / "mdev_supported_types"
        self.mdev_types = {t: (_read(types / t / "name"), _read(types / t / "available_instances", "0"))
                           for t in sorted(os.listdir(types))} if types.is_dir() else {}
        self.is_capable_of_mdevs = bool(self.mdev_types)
        # libvirt reports virt_functions for every SR-IOV-capable function, VFs enabled or
        # not (node_device_conf.c: the capability flag is set when sriov_totalvfs or
        # sriov_numvfs is above 0), and Nova's _get_device_type makes it type-PF.
        self.totalvfs = int(_read(directory / "sriov_totalvfs", "0") or 0)
        self.dev_type = "VF" if self.pf else "PF" if self.vfs or self.totalvfs else (
            "MDEV_TYPES" if self.mdev_types else "PCI")
        self.generate_xml()

    @property  # FakePCIDevice's is computed from bus/slot/function in domain 0000
    def address(self):  # noqa: D102
        return self._address

    @address.setter
    def address(self, value):
        self._address = value

    def mdev_created(self, type_id: str) -> None:
        """The driver's counts after an mdev of ``type_id`` is made here: one fewer of it, none of others.

        NVIDIA's time-sliced vGPUs: one type per physical GPU at a time (and a VF of an
        SR-IOV GPU holds one vGPU), so a GPU holding one offers no other type.
        """
        self.mdev_types = {t: (name, str(max(int(available) - 1, 0)) if t == type_id else "0")
                           for t, (name, available) in self.mdev_types.items()}
        self.generate_xml()

    def generate_xml(self, skip_capability=False):  # noqa: D102
        caps = []
        if (self.vfs or self.totalvfs) and not skip_capability:
            caps.append(f"<capability type='virt_functions' maxCount='{self.totalvfs}'>"
                        + "".join(ADDRESS.format(*split(a)) for a in self.vfs) + "</capability>")
        if self.pf:
            caps.append("<capability type='phys_function'>" + ADDRESS.format(*split(self.pf))
                        + "</capability>")
        if self.mdev_types:
            caps.append("<capability type='mdev_types'>" + "".join(
                MDEV_TYPE.format(id=t, name=name, available=available)
                for t, (name, available) in self.mdev_types.items()) + "</capability>")
        domain, bus, slot, function = split(self.address)
        driver = self.directory / "driver"
        self.pci_device = DEVICE.format(
            name=nodedev_name(self.address), address=self.address, domain=domain, bus=bus,
            slot=slot, function=function, klass=_read(self.directory / "class"),
            product=_read(self.directory / "device"), product_name="",
            vendor=_read(self.directory / "vendor"), vendor_name="",
            driver=os.path.basename(os.path.realpath(driver)) if driver.exists() else "pci-stub",
            capabilities="\n".join(caps), group=self.group)


def pci_info(root: Path) -> fakelibvirt.HostPCIDevicesInfo:
    """Every PCI device under ``root``/sys/bus/pci/devices, for ``start_compute(pci_info=...)``."""
    info = fakelibvirt.HostPCIDevicesInfo(num_pfs=0, num_vfs=0)
    bus = root / "sys/bus/pci/devices"
    for group, address in enumerate(sorted(os.listdir(bus))):
        info.devices[nodedev_name(address)] = TreeDevice((bus / address).resolve(), 40 + group)
    return info


def is_physical_function(root: Path):
    """Nova's ``pci.utils.is_physical_function``, asked of the fixture tree instead of /sys."""
    def answer(domain, bus, slot, function):
        path = root / f"sys/bus/pci/devices/{domain}:{bus}:{slot}.{function}/sriov_totalvfs"
        try:
            return int(path.read_text()) > 0
        except (OSError, ValueError):
            return False
    return answer


def typed_vfs_only(root: Path, create):
    """fakelibvirt's ``Domain.createWithFlags``, refusing a VF that holds no vGPU type.

    On NVIDIA's vendor-specific VFIO framework a VF serves a guest only once a
    vGPU type was written to its ``nvidia/current_vgpu_type`` (NVIDIA's guide
    gives the type before the VF is assigned; inferred: no transcript shows the
    start of a VM on an untyped VF). A VF of the fixture tree that reads ``0``
    there stops the domain from starting, as QEMU does when vfio cannot open a
    device ("error getting device from group ...: Input/output error", the form
    mdev users report); any other device starts as fakelibvirt lets it.
    """
    def checked(domain, flags):
        for hostdev in domain._def["devices"].get("hostdevs", []):
            if hostdev.get("type") != "pci" or not hostdev.get("bus"):
                continue
            address = "{:04x}:{:02x}:{:02x}.{:x}".format(
                *(int(hostdev[k], 16) for k in ("domain", "bus", "slot", "function")))
            held = root / "sys/bus/pci/devices" / address / "nvidia" / "current_vgpu_type"
            if held.exists() and held.read_text().strip() in ("", "0"):
                raise fakelibvirt.make_libvirtError(
                    fakelibvirt.libvirtError,
                    f"internal error: qemu unexpectedly closed the monitor: vfio {address}: error "
                    "getting device from group: Input/output error (the VF holds no vGPU type)",
                    error_code=fakelibvirt.VIR_ERR_INTERNAL_ERROR,
                    error_domain=fakelibvirt.VIR_FROM_QEMU)
        return create(domain, flags)
    return checked
