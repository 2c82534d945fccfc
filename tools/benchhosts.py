"""Generated SR-IOV GPU hosts for tools/bench.py, built with unit_tests/fakehost.py.

Two shapes, both with SR-IOV GPUs whose virtual functions offer the types:

* ``mdev``: A100-like (device 0x20b5), every VF has ``mdev_supported_types/``
  with the same types (on the mediated-device framework each VF holds one
  vGPU, so ``available_instances`` is 1);
* ``vfio``: L40S-like (device 0x26b9) on NVIDIA's vendor-specific VFIO
  framework: every VF has ``nvidia/creatable_vgpu_types`` and
  ``nvidia/current_vgpu_type``; mapped VFs hold their type. (A real VF's
  creatable list shrinks as siblings take types; the benchmark keeps the full
  list so both frameworks offer the same number of types.)

Around the GPUs sit what a compute host also has: other PCI functions (NICs),
a dpkg database with thousands of packages and Nova, loaded modules, IOMMU
groups and pci.ids. Only FakeHost's public methods are used.
"""

import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from unit_tests.fakehost import FakeHost, MdevType, real_shaped_pci_ids

MDEV_TYPES = {
    "nvidia-471": MdevType("GRID A100-4C", 4096, 10, available=1),
    "nvidia-472": MdevType("GRID A100-5C", 5120, 8, available=1),
    "nvidia-473": MdevType("GRID A100-8C", 8192, 5, available=1),
    "nvidia-474": MdevType("GRID A100-10C", 10240, 4, available=1),
    "nvidia-475": MdevType("GRID A100-20C", 20480, 2, available=1),
    "nvidia-476": MdevType("GRID A100-40C", 40960, 1, available=1),
}
# Six of the L40S's time-sliced Q profiles, the whole-GPU 48Q among them: the charm
# takes a GPU's framebuffer from its largest profile, so 12Q fits 4 VFs (and 16Q 3).
VFIO_TYPES = {
    1136: "NVIDIA L40S-4Q", 1138: "NVIDIA L40S-8Q", 1139: "NVIDIA L40S-12Q",
    1140: "NVIDIA L40S-16Q", 1141: "NVIDIA L40S-24Q", 1142: "NVIDIA L40S-48Q",
}
# (type, VFs mapped per GPU): the steady mapping, and the one a config change brings.
MAPPED = {"mdev": ("nvidia-474", 4), "vfio": ("nvidia-1139", 4)}
REMAPPED = {"mdev": ("nvidia-473", 4), "vfio": ("nvidia-1140", 3)}
NOVA = {"mdev": "3:29.0.0-0ubuntu1", "vfio": "3:31.0.0-0ubuntu1"}  # caracal / epoxy
DEVICE = {"mdev": "0x20b5", "vfio": "0x26b9"}
OTHER_FUNCTIONS = 300
PACKAGES = 3000
# The PCI ID database as hosts ship it: the real one's size and shape (about 1.7 MB, NVIDIA's
# block at line 10,234 of 42,988), the bench's GPUs named in NVIDIA's block.
NVIDIA_PCI_IDS = """\
\t20b5  GA100 [A100 PCIe 80GB]
\t26b9  AD102GL [L40S]
"""


def _pf(gpu: int) -> str:
    return f"0000:{0x10 + gpu * 4:02x}:00.0"


def _vf(gpu: int, index: int) -> str:
    devfn = 4 + index  # VFs follow the PF on its bus (function 0 is the PF)
    return f"0000:{0x10 + gpu * 4:02x}:{devfn // 8:02x}.{devfn % 8}"


def mapping_text(framework: str, gpus: int, remap: bool = False) -> str:
    """vgpu-device-mappings for the host: one type, N VFs of every GPU."""
    vgpu_type, per_gpu = (REMAPPED if remap else MAPPED)[framework]
    addresses = [_vf(g, i) for g in range(gpus) for i in range(per_gpu)]
    return "{%s: [%s]}" % (vgpu_type, ", ".join(f"'{a}'" for a in addresses))


def sriov_host(root, framework: str, gpus: int, vfs: int,
               installed: Optional[Path] = None) -> Tuple[FakeHost, Dict[str, int]]:
    """Build the host; returns it and its size: PCI functions, GPU functions, types.

    ``installed``: a root of the same framework (see base_root) where the driver
    was installed with dpkg; its dpkg database and files are copied in, so
    that dpkg runs once per framework and not once per host.
    """
    host = FakeHost(root)
    host.pci_ids(real_shaped_pci_ids(NVIDIA_PCI_IDS))
    mapped_type, per_gpu = MAPPED[framework]
    for g in range(gpus):
        pf = _pf(g)
        host.add_gpu(pf, device=DEVICE[framework], totalvfs=max(vfs, 16))
        for i in range(vfs):
            if framework == "mdev":
                host.add_vf(pf, i, _vf(g, i), mdev_types=MDEV_TYPES)
            else:
                current = int(mapped_type.split("-")[1]) if i < per_gpu else 0
                host.add_vf(pf, i, _vf(g, i), vfio_types=VFIO_TYPES, current_type=current)
        host.vf_placement(pf, 4)  # _vf's: VF N at function 4 + N of the PF's bus
    for n in range(OTHER_FUNCTIONS):
        host.add_pci(f"0000:{0x80 + n // 32:02x}:{n % 32:02x}.0", "0x8086", "0x1572", "0x020000",
                     driver="i40e")
    if installed is None:
        packages = {f"package-{n:04d}": "1.0-1" for n in range(PACKAGES)}
        packages.update({"nova-common": NOVA[framework], "nova-compute": NOVA[framework]})
        host.dpkg_status(packages)
        host.principal_nova_conf()  # nova-compute's own, read before [pci] is published
    host.modules(["nvidia_vgpu_vfio", "nvidia", "vfio_pci", "vfio"] + [f"mod{n}" for n in range(150)])
    host.loaded_driver("570.158.02")
    host.iommu_groups(gpus * (vfs + 1) + OTHER_FUNCTIONS)
    host.proc_pci_devices()  # the kernel's list of every function, as a real host has it
    if installed is not None:
        for part in ("var/lib/dpkg", "usr", "lib", "etc"):
            if (installed / part).exists():
                shutil.copytree(installed / part, Path(root) / part, symlinks=True, dirs_exist_ok=True)
    types = len(MDEV_TYPES if framework == "mdev" else VFIO_TYPES)
    return host, {"functions": gpus * (vfs + 1) + OTHER_FUNCTIONS, "gpu_functions": gpus * (vfs + 1),
                  "types": types}


def base_root(root, framework: str) -> FakeHost:
    """A host without GPUs but with the dpkg database of sriov_host (install the driver there)."""
    host = FakeHost(root)
    packages = {f"package-{n:04d}": "1.0-1" for n in range(PACKAGES)}
    packages.update({"nova-common": NOVA[framework], "nova-compute": NOVA[framework]})
    host.dpkg_status(packages)
    host.principal_nova_conf()  # nova-compute's own, read before [pci] is published
    return host


def sizes(quick: bool) -> List[Tuple[int, int]]:
    """(GPUs, VFs per GPU) for the scaling table."""
    gpus = (1, 4, 16) if quick else (1, 2, 4, 8, 16)
    return [(g, v) for g in gpus for v in (16, 32)]


# -- the boot step after a reboot: H200-like GPUs with MIG-backed profiles ----------------

MIG_PROFILE, MIG_INSTANCE, MIG_VFS = "NVIDIA H200X-1-18C", "1g.18gb", 7


def rebooted_mig_host(root, gpus: int, sriov_s: float, smi_s: float) -> Tuple[FakeHost, dict]:
    """``gpus`` H200 SXM-like GPUs (8 VFs each) just rebooted: no VFs, MIG mode and instances lost.

    The stand-in tools take time as real ones do: ``sriov-manage -e`` ``sriov_s``
    seconds per GPU, each mode or instance change of nvidia-smi (``-mig 1``,
    ``-cgi``) ``smi_s``. Returns the host and the boot data that restores every
    GPU: seven H200X-1-18C VFs in seven 1g.18gb GPU instances each.
    """
    from unit_tests.fakehost import H200_GIS, H200_SXM_MIG_TYPES
    from unit_tests.faketools import stand_in

    host = FakeHost(root)
    host.pci_ids("10de  NVIDIA Corporation\n\t2335  GH100 [H200 SXM 141GB]\n")
    addresses = [f"0000:{0x10 + g * 4:02x}:00.0" for g in range(gpus)]
    for address in addresses:
        host.add_sriov_gpu(address, device="0x2335", vf_device="0x2335", count=8,
                           vfio_types=H200_SXM_MIG_TYPES, enabled=False, totalvfs=32, mig=H200_GIS)
    host.install_nvidia_smi({a: "Enabled" for a in addresses}, "H200")
    host.install_sriov_manage()
    host.iommu_groups(gpus * 9)
    host.loaded_driver("580.159.01")
    host.reboot()  # Hopper: MIG mode goes with the GPU instances
    # Each sriov-manage run records when it started and ended (sriov-times: address start end):
    # the boot step runs them one GPU at a time, and the bench adds them up.
    times = Path(root).parent / f"{Path(root).name}.fake" / "sriov-times"
    for name, delay, after in (
            ("usr/lib/nvidia/sriov-manage", f"s=$(date +%s.%N); sleep {sriov_s}",
             f'rc=$?; echo "$2 $s $(date +%s.%N)" >> "{times}"; exit $rc'),
            ("usr/bin/nvidia-smi", f'case "$*" in *"-mig 1"*|*-cgi*) sleep {smi_s} ;; esac', "")):
        real = Path(root) / name
        real.rename(real.with_name(real.name + ".real"))
        run = f'"{real.with_name(real.name + ".real")}" "$@"'
        stand_in(real, f'#!/bin/sh\n{delay}\n{run}\n{after}\n' if after
                 else f'#!/bin/sh\n{delay}\nexec {run}\n')
    data = {"version": 1, "wait_for": [], "limits": {"poll": 0.1},
            "gpus": [{"address": a, "model": "H200 SXM 141GB",
                      "vfs": [{"index": n, "name": MIG_PROFILE} for n in range(MIG_VFS)],
                      "mig": {"profile": "H200X-1-18C", "instance": MIG_INSTANCE,
                              "count": MIG_VFS}} for a in addresses]}
    return host, data


def add_guests(root, framework: str, gpus: int) -> None:
    """A running guest (its status file and its definition) on every mapped VF, as Nova has them."""
    from unit_tests.libvirt import running_guest

    host = FakeHost(root, write_defaults=False)
    mapped_type, per_gpu = MAPPED[framework]
    n = 0
    for g in range(gpus):
        for i in range(per_gpu):
            uuid = f"{n:08x}-0000-4000-8000-{n:012x}"
            if framework == "mdev":
                mdev = f"{n:08x}-1111-4111-8111-{n:012x}"
                host.add_mdev(_vf(g, i), mapped_type, mdev)
                running_guest(root, f"instance-{n:08x}", uuid, mdev_uuid=mdev)
            else:
                running_guest(root, f"instance-{n:08x}", uuid, pci_address=_vf(g, i))
            n += 1


def monitored(root, framework: str, gpus: int, nvml: Path, vgpus_per_gpu: int) -> Path:
    """What the exporter reads besides sysfs; returns ``nvml``.

    A guest on every mapped VF, the boot step's result, and NVML's stand-in
    state (``nvml``, read by unit_tests/fake_pynvml) with vGPUs on every GPU.
    """
    import json
    import time

    from vgpu import bootresult

    _, per_gpu = MAPPED[framework]
    add_guests(root, framework, gpus)
    bootresult.save(bootresult.Result(time.time(), 12.5, 0, bootresult.gpu_results(
        [(_pf(g), "restored", 1.5) for g in range(gpus)]), run_by="boot_step"))
    def vgpu(g: int, v: int) -> dict:
        vm = g * per_gpu + v
        return {"id": g * 100 + v, "uuid": f"vgpu-{g}-{v}", "vm": f"{vm:08x}-0000-4000-8000-{vm:012x}",
                "type": 1139, "licensed": 1, "state": 5, "fb": 6 << 30,
                "util": {"sm": 30, "memory": 10, "encoder": 0, "decoder": 0}}

    nvml.write_text(json.dumps({"driver": "570.158.02", "gpus": [
        {"bus_id": f"0000{_pf(g)}".upper(), "vgpus": [vgpu(g, v) for v in range(vgpus_per_gpu)]}
        for g in range(gpus)]}))
    return nvml
