"""Host trees shaped like a real one, for tests and the sample-host demo.

Devices live under ``sys/devices/pci0000:00/<bridge>/<address>`` and are
reached through symlinks in ``sys/bus/pci/devices``, with ``driver``,
``virtfnN`` and ``physfn`` links and ``mdev_supported_types`` or
``nvidia/creatable_vgpu_types`` as the kernel lays them out. dpkg's status
file, ``proc/modules`` and ``proc/cmdline`` sit where the charm reads them.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Optional, Sequence

INTEL = "0x8086"
NVIDIA = "0x10de"
MELLANOX = "0x15b3"


@dataclass(frozen=True)
class MdevType:
    name: str
    framebuffer_mb: int
    max_instance: int
    available: Optional[int] = None

    def description(self) -> str:
        return (f"num_heads=4, frl_config=60, framebuffer={self.framebuffer_mb}M, "
                f"max_resolution=7680x4320, max_instance={self.max_instance}")


V100_TYPES = {
    "nvidia-105": MdevType("GRID V100-1Q", 1024, 16),
    "nvidia-106": MdevType("GRID V100-2Q", 2048, 8),
    "nvidia-107": MdevType("GRID V100-4Q", 4096, 4),
    "nvidia-108": MdevType("GRID V100-8Q", 8192, 2),
    "nvidia-109": MdevType("GRID V100-16Q", 16384, 1),
}
A100_TYPES = {
    "nvidia-471": MdevType("GRID A100-4C", 4096, 10),
    "nvidia-472": MdevType("GRID A100-5C", 5120, 8),
    "nvidia-474": MdevType("GRID A100-10C", 10240, 4),
}
L40S_TYPES = {1139: "NVIDIA L40S-12Q", 1140: "NVIDIA L40S-16Q", 1141: "NVIDIA L40S-24Q"}

PCI_IDS = """\
# List of PCI ID's (sample)
8086  Intel Corporation
\t3e92  CoffeeLake-S GT2 [UHD Graphics 630]
10de  NVIDIA Corporation
\t1db4  GV100GL [Tesla V100 PCIe 16GB]
\t\t10de 1214  Tesla V100 PCIe 16GB
\t20b5  GA100 [A100 PCIe 80GB]
\t26b9  AD102GL [L40S]
\t1eb8  TU104GL [Tesla T4]
15b3  Mellanox Technologies
\t101d  MT2892 Family [ConnectX-6 Dx]
"""


class FakeHost:
    """Builds a host tree under ``root``; each add_* returns the device directory."""

    def __init__(self, root):
        self.root = Path(root)
        self.devices = self.root / "sys/devices/pci0000:00"
        self.bus = self.root / "sys/bus/pci/devices"
        self.bus.mkdir(parents=True, exist_ok=True)
        (self.root / "proc").mkdir(exist_ok=True)
        self.dpkg_status({})
        self.modules([])
        self.cmdline("BOOT_IMAGE=/vmlinuz root=/dev/sda1 ro intel_iommu=on iommu=pt")

    # -- PCI ---------------------------------------------------------------
    def add_pci(self, address: str, vendor: str, device: str, class_code: str,
                driver: Optional[str] = None, bridge: str = "0000:00:01.0",
                mdev_types: Optional[Mapping[str, MdevType]] = None) -> Path:
        directory = self.devices / bridge / address
        directory.mkdir(parents=True, exist_ok=True)
        for name, value in (("vendor", vendor), ("device", device), ("class", class_code)):
            (directory / name).write_text(value + "\n")
        link = self.bus / address
        if not os.path.lexists(link):
            link.symlink_to(os.path.relpath(directory, self.bus))
        if driver:
            drivers = self.root / "sys/bus/pci/drivers" / driver
            drivers.mkdir(parents=True, exist_ok=True)
            (directory / "driver").symlink_to(os.path.relpath(drivers, directory))
        if mdev_types:
            self._mdev_types(directory, mdev_types)
        return directory

    def add_gpu(self, address: str, device: str = "0x1db4", class_code: str = "0x030200",
                driver: Optional[str] = "nvidia", mdev_types: Optional[Mapping[str, MdevType]] = None,
                totalvfs: int = 0, bridge: Optional[str] = None) -> Path:
        directory = self.add_pci(address, NVIDIA, device, class_code, driver,
                                 bridge or f"0000:00:{address[5:7]}.0", mdev_types)
        if totalvfs:
            (directory / "sriov_totalvfs").write_text(f"{totalvfs}\n")
            (directory / "sriov_numvfs").write_text("0\n")
        return directory

    def add_vf(self, pf_address: str, index: int, address: str, driver: Optional[str] = "nvidia",
               mdev_types: Optional[Mapping[str, MdevType]] = None,
               vfio_types: Optional[Mapping[int, str]] = None, current_type: int = 0) -> Path:
        pf = (self.bus / pf_address).resolve()
        vendor = (pf / "device").read_text().strip()
        directory = self.add_pci(address, NVIDIA, vendor, (pf / "class").read_text().strip(),
                                 driver, pf.parent.name, mdev_types)
        (directory / "physfn").symlink_to(os.path.relpath(pf, directory))
        (pf / f"virtfn{index}").symlink_to(os.path.relpath(directory, pf))
        numvfs = len([n for n in os.listdir(pf) if n.startswith("virtfn")])
        (pf / "sriov_numvfs").write_text(f"{numvfs}\n")
        if vfio_types is not None:
            nvidia = directory / "nvidia"
            nvidia.mkdir(exist_ok=True)
            rows = ["ID    : vGPU Name"] + [f"{n:<6}: {name}" for n, name in sorted(vfio_types.items())]
            (nvidia / "creatable_vgpu_types").write_text("\n".join(rows) + "\n")
            (nvidia / "current_vgpu_type").write_text(f"{current_type}\n")
        return directory

    def add_mdev(self, parent: str, type_id: str, uuid: str) -> Path:
        """A created mediated device: under its parent, linked from sys/bus/mdev/devices."""
        parent_dir = (self.bus / parent).resolve()
        directory = parent_dir / uuid
        directory.mkdir()
        (directory / "mdev_type").symlink_to(
            os.path.relpath(parent_dir / "mdev_supported_types" / type_id, directory))
        bus = self.root / "sys/bus/mdev/devices"
        bus.mkdir(parents=True, exist_ok=True)
        (bus / uuid).symlink_to(os.path.relpath(directory, bus))
        return directory

    def _mdev_types(self, directory: Path, types: Mapping[str, MdevType]) -> None:
        base = directory / "mdev_supported_types"
        for type_id, spec in types.items():
            entry = base / type_id
            (entry / "devices").mkdir(parents=True, exist_ok=True)
            (entry / "name").write_text(spec.name + "\n")
            (entry / "description").write_text(spec.description() + "\n")
            available = spec.max_instance if spec.available is None else spec.available
            (entry / "available_instances").write_text(f"{available}\n")
            (entry / "device_api").write_text("vfio-pci\n")
            (entry / "create").write_text("")
        mdev_bus = self.root / "sys/class/mdev_bus"
        mdev_bus.mkdir(parents=True, exist_ok=True)
        link = mdev_bus / directory.name
        if not os.path.lexists(link):
            link.symlink_to(os.path.relpath(directory, mdev_bus))

    # -- everything else the charm reads ------------------------------------
    def pci_ids(self, text: str = PCI_IDS) -> None:
        path = self.root / "usr/share/misc/pci.ids"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def dpkg_status(self, packages: Mapping[str, str], arch: str = "amd64",
                    states: Optional[Mapping[str, str]] = None) -> None:
        """Write dpkg's status file: ``{name: version}``, all installed unless ``states`` says."""
        admin = self.root / "var/lib/dpkg"
        for sub in ("info", "updates"):
            (admin / sub).mkdir(parents=True, exist_ok=True)
        stanzas = []
        for name, version in sorted(packages.items()):
            state = (states or {}).get(name, "installed")
            stanzas.append(f"Package: {name}\nStatus: install ok {state}\nPriority: optional\n"
                           f"Section: net\nMaintainer: Ubuntu Developers\nArchitecture: {arch}\n"
                           f"Version: {version}\nDescription: {name}\n long description\n")
        (admin / "status").write_text("\n".join(stanzas))
        (admin / "available").touch()

    def nova(self, version: str) -> None:
        """Install nova-common at ``version`` (e.g. ``3:29.0.0-0ubuntu1``) among other packages."""
        self.dpkg_status({"adduser": "3.137ubuntu1", "nova-common": version,
                          "nova-compute": version, "python3-nova": version,
                          "zlib1g": "1:1.3.dfsg-3.1ubuntu2"})

    def modules(self, names: Iterable[str]) -> None:
        rows = [f"{n} 65536 0 - Live 0x0000000000000000" for n in names]
        (self.root / "proc/modules").write_text("".join(r + "\n" for r in rows))

    def loaded_driver(self, version: str) -> None:
        """The loaded ``nvidia`` module's version, as /sys/module/nvidia/version shows it."""
        path = self.root / "sys/module/nvidia/version"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(version + "\n")

    def iommu_groups(self, count: int) -> None:
        """IOMMU groups as the kernel makes them when VT-d / AMD-Vi is on."""
        for n in range(count):
            (self.root / f"sys/kernel/iommu_groups/{n}/devices").mkdir(parents=True, exist_ok=True)

    def cmdline(self, text: str) -> None:
        (self.root / "proc/cmdline").write_text(text + "\n")


def v100_host(root, count: int = 2, nova: str = "3:29.0.0-0ubuntu1") -> FakeHost:
    """Tesla V100 GPUs on the mdev framework, an Intel GVT-g GPU and a NIC."""
    host = FakeHost(root)
    host.pci_ids()
    for n in range(count):
        host.add_gpu(f"0000:{0xc1 + n * 0x20:02x}:00.0", device="0x1db4",
                     class_code="0x030200", mdev_types=V100_TYPES)
    host.add_pci("0000:00:02.0", INTEL, "0x3e92", "0x030000", driver="i915",
                 mdev_types={"i915-GVTg_V5_4": MdevType("GVTg_V5_4", 512, 4)})
    host.add_pci("0000:3b:00.0", MELLANOX, "0x101d", "0x020000", driver="mlx5_core")
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia", "mdev", "vfio"])
    host.loaded_driver("570.158.02")
    return host


def a100_host(root, nova: str = "3:29.0.0-0ubuntu1") -> FakeHost:
    """An SR-IOV A100 on the mdev framework: types are offered by its VFs."""
    host = FakeHost(root)
    host.pci_ids()
    host.add_gpu("0000:41:00.0", device="0x20b5", totalvfs=16)
    for index in range(4):
        host.add_vf("0000:41:00.0", index, f"0000:41:00.{4 + index}", mdev_types=A100_TYPES)
    host.iommu_groups(40)
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    return host


def l40s_host(root, nova: str = "3:31.0.0-0ubuntu1") -> FakeHost:
    """An L40S on NVIDIA's vendor-specific VFIO framework (no mdev at all)."""
    host = FakeHost(root)
    host.pci_ids()
    host.add_gpu("0000:81:00.0", device="0x26b9", totalvfs=32)
    host.iommu_groups(40)
    for index in range(4):
        host.add_vf("0000:81:00.0", index, f"0000:81:00.{4 + index}",
                    driver="nvidia", vfio_types=L40S_TYPES)
    host.nova(nova)
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    return host


def empty_host(root, nova: str = "3:29.0.0-0ubuntu1") -> FakeHost:
    """A compute host without NVIDIA GPUs (an Intel iGPU and a NIC only)."""
    host = FakeHost(root)
    host.pci_ids()
    host.add_pci("0000:00:02.0", INTEL, "0x3e92", "0x030000", driver="i915")
    host.add_pci("0000:3b:00.0", MELLANOX, "0x101d", "0x020000", driver="mlx5_core")
    host.nova(nova)
    return host


def build(kind: str, root, **kwargs) -> FakeHost:
    hosts = {"v100": v100_host, "a100": a100_host, "l40s": l40s_host, "empty": empty_host}
    return hosts[kind](root, **kwargs)


__all__: Sequence[str] = ("FakeHost", "MdevType", "v100_host", "a100_host", "l40s_host",
                          "empty_host", "build", "V100_TYPES", "A100_TYPES", "L40S_TYPES")


def assign_vfio_type(host: FakeHost, vf_address: str, number: int,
                     creatable: Optional[Mapping[int, str]] = None) -> Path:
    """Give a VF on the vendor-specific VFIO framework a vGPU type, as the driver shows it.

    ``current_vgpu_type`` holds the id; ``creatable_vgpu_types`` then lists only
    what still fits (``creatable``; empty by default: a VF holding a type
    offers nothing more, and a full GPU lists nothing anywhere).
    """
    nvidia = (host.bus / vf_address).resolve() / "nvidia"
    nvidia.mkdir(exist_ok=True)
    (nvidia / "current_vgpu_type").write_text(f"{number}\n")
    rows = ["ID    : vGPU Name"] + [f"{n:<6}: {name}" for n, name in sorted((creatable or {}).items())]
    (nvidia / "creatable_vgpu_types").write_text("\n".join(rows) + "\n")
    return nvidia
