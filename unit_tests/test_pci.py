"""GPU discovery on host trees shaped like real sysfs."""

import os
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from unit_tests.fakehost import (
    INTEL,
    L40S_TYPES,
    NVIDIA,
    PCI_IDS,
    V100_TYPES,
    FakeHost,
    MdevType,
    a100_host,
    h200_nvl_host,
    h200_sxm_host,
    l40s_host,
    rtx_pro_6000_host,
    v100_host,
)
from vgpu import pci, profiles


def test_v100_host_finds_both_gpus_with_types_and_ignores_other_mdev_parents(root):
    v100_host(root)
    host = pci.discover()
    assert [g.address for g in host.gpus] == ["0000:c1:00.0", "0000:e1:00.0"]
    gpu = host.gpus[0]
    assert (gpu.device_id, gpu.model, gpu.driver, gpu.class_code) == (
        "0x1db4", "Tesla V100 PCIe 16GB", "nvidia", "0x030200")
    assert [t.id for t in gpu.types] == ["nvidia-105", "nvidia-106", "nvidia-107",
                                         "nvidia-108", "nvidia-109"]
    v8q = gpu.types[3]
    assert (v8q.name, v8q.framebuffer_mb, v8q.max_instances, v8q.available_instances) == (
        "GRID V100-8Q", 8192, 2, None)  # read on demand only
    assert pci.with_available(host).gpus[0].types[3].available_instances == 2
    assert dict(v8q.properties)["max_resolution"] == "7680x4320"
    assert gpu.framework == pci.MDEV and not gpu.sriov
    # The Intel GVT-g parent offers mdev types too, but is not NVIDIA's.
    assert host.gpu("0000:00:02.0") is None
    assert host.models() == [("Tesla V100 PCIe 16GB", 2)]


def test_vga_and_3d_classes_count_but_audio_and_usb_functions_do_not(root):
    host = FakeHost(root)
    host.add_gpu("0000:01:00.0", device="0x1eb8", class_code="0x030000")   # VGA
    host.add_gpu("0000:02:00.0", device="0x1eb8", class_code="0x030200")   # 3D
    host.add_pci("0000:01:00.1", NVIDIA, "0x10f8", "0x040300")              # HD audio
    host.add_pci("0000:01:00.2", NVIDIA, "0x1ad8", "0x0c0330")              # USB
    host.add_pci("0000:03:00.0", INTEL, "0x3e92", "0x030000")               # other vendor
    assert [g.address for g in pci.discover().gpus] == ["0000:01:00.0", "0000:02:00.0"]


def test_model_falls_back_to_device_id_without_pci_ids(root):
    host = FakeHost(root)
    host.add_gpu("0000:01:00.0", device="0x2330")
    assert pci.discover().gpus[0].model == "NVIDIA 0x2330"


def test_pci_ids_scan_stops_at_the_next_vendor(root):
    host = FakeHost(root)
    host.pci_ids("10de  NVIDIA Corporation\n\t1db4  GV100GL [Tesla V100 PCIe 16GB]\n"
                 "15b3  Mellanox Technologies\n\t2330  Not an NVIDIA device\n")
    host.add_gpu("0000:01:00.0", device="0x2330")
    host.add_gpu("0000:02:00.0", device="0x1db4")
    assert [g.model for g in pci.discover().gpus] == ["NVIDIA 0x2330", "Tesla V100 PCIe 16GB"]


def test_pci_ids_comments_and_blank_lines_inside_the_nvidia_block_are_skipped(root):
    host = FakeHost(root)
    host.pci_ids("10de  NVIDIA Corporation\n\t1db4  GV100GL [Tesla V100 PCIe 16GB]\n"
                 "#\t2330  a commented-out entry\n\n\t26b9  AD102GL [L40S]\n")
    host.add_gpu("0000:01:00.0", device="0x26b9")
    assert pci.discover().gpus[0].model == "L40S"


def test_pci_ids_is_also_found_where_hwdata_keeps_it(root):
    host = FakeHost(root)
    host.pci_ids()
    hwdata = root / "usr/share/hwdata"
    hwdata.mkdir(parents=True)
    (root / "usr/share/misc/pci.ids").rename(hwdata / "pci.ids")
    host.add_gpu("0000:01:00.0", device="0x1db4")
    assert pci.discover().gpus[0].model == "Tesla V100 PCIe 16GB"


# -- a GPU newer than the host's pci.ids: named as the host knows it -----------------------

H200_NVL = "0000:41:00.0"  # h200_nvl_host's GPU, 10de:233b
OLD_PCI_IDS = PCI_IDS.replace("\t233b  GH100 [H200 NVL]\n", "")  # written before the H200 NVL


@pytest.fixture
def newer_than_pci_ids(root):
    host = h200_nvl_host(root)
    host.pci_ids(OLD_PCI_IDS)
    assert pci.discover().gpus[0].model == "NVIDIA 0x233b"
    return host


def test_a_gpu_newer_than_pci_ids_is_named_as_udevs_hwdb_names_it(newer_than_pci_ids):
    newer_than_pci_ids.udev_data(H200_NVL, "GH100 [H200 NVL]")
    newer_than_pci_ids.driver_information(H200_NVL, "NVIDIA H200 NVL from the driver")
    assert pci.discover().gpus[0].model == "H200 NVL"


def test_without_udev_data_the_drivers_own_name_is_used(newer_than_pci_ids):
    newer_than_pci_ids.driver_information(H200_NVL, "NVIDIA H200 NVL")
    assert pci.discover().gpus[0].model == "H200 NVL"


def test_what_the_host_says_of_a_name_is_read_bounded_and_never_fails_discovery(
        newer_than_pci_ids, root):
    udev = newer_than_pci_ids.udev_data(H200_NVL, "GH100 [H200 NVL]")
    udev.write_bytes(b"E:ID_MODEL_FROM_DATABASE=" + b"x" * 70000 + b"\n")  # past its bound
    information = newer_than_pci_ids.driver_information(H200_NVL, "NVIDIA H200 NVL")
    information.write_bytes(b"Model: \t\t NVIDIA H200\x1b[2J NVL \xff\n")
    assert pci.discover().gpus[0].model == "H200\ufffd[2J NVL \ufffd"
    information.unlink()
    information.mkdir()  # unreadable
    assert pci.discover().gpus[0].model == "NVIDIA 0x233b"
    udev.write_text("E:ID_MODEL_FROM_DATABASE=\n")  # nothing said
    assert pci.discover().gpus[0].model == "NVIDIA 0x233b"


def test_pci_ids_is_read_no_further_than_its_bound(root, monkeypatch):
    host = FakeHost(root)
    host.pci_ids("#" * 300 + "\n" + PCI_IDS)
    host.add_gpu("0000:01:00.0", device="0x1db4")
    assert pci.discover().gpus[0].model == "Tesla V100 PCIe 16GB"
    monkeypatch.setattr(pci, "PCI_IDS_LIMIT", 200)
    assert pci.discover().gpus[0].model == "NVIDIA 0x1db4"


L40S_LINE = "\t26b9  AD102GL [L40S]\n"


def test_gpus_are_named_from_a_pci_ids_of_the_real_one_s_size_and_shape(root):
    """NVIDIA's block a quarter of the way into 1.7 MB (pciutils/pciids, see REAL_PCI_IDS)."""
    from unit_tests.fakehost import REAL_PCI_IDS, real_shaped_pci_ids

    text = real_shaped_pci_ids(L40S_LINE + "\t2330  GH100 [H100 SXM5 80GB]\n")
    lines = text.splitlines()
    assert len(lines) == REAL_PCI_IDS["lines"]
    assert lines.index("10de  NVIDIA Corporation") + 1 == REAL_PCI_IDS["nvidia_line"]
    assert abs(len(text.encode()) - REAL_PCI_IDS["bytes"]) < REAL_PCI_IDS["bytes"] * 0.03
    host = FakeHost(root)
    host.pci_ids(text)
    host.add_gpu("0000:01:00.0", device="0x26b9")
    host.add_gpu("0000:02:00.0", device="0x2330")
    host.add_gpu("0000:03:00.0", device="0xf00d")  # a filler id of NVIDIA's block: named too
    host.add_gpu("0000:04:00.0", device="0x0001")  # listed by other vendors only
    assert [g.model for g in pci.discover().gpus] == [
        "L40S", "H100 SXM5 80GB", "Filler GeForce f00d", "NVIDIA 0x0001"]


@pytest.mark.parametrize("text, named", [
    # A device line of another vendor, before NVIDIA's block, is not NVIDIA's.
    ("1002  Advanced Micro Devices\n\t26b9  Navi 99 [not NVIDIA's]\n10de  NVIDIA Corporation\n"
     + L40S_LINE, "L40S"),
    ("1002  Advanced Micro Devices\n\t26b9  Navi 99 [not NVIDIA's]\n", None),
    # Subsystem lines (two tabs) that carry the id are not its device line.
    ("10de  NVIDIA Corporation\n\t2230  GA102GL [RTX A6000]\n\t\t10de 26b9  RTX board\n"
     "\t\t26b9 0001  Another board\n" + L40S_LINE, "L40S"),
    ("10de  NVIDIA Corporation\n\t2230  GA102GL [RTX A6000]\n\t\t10de 26b9  RTX board\n", None),
    # A comment inside the block does not end it; "10de" in a comment does not start it.
    ("# 10de  a comment that names NVIDIA's id\n\t26b9  AD102 [in no block]\n"
     "10de  NVIDIA Corporation\n# a comment\n" + L40S_LINE, "L40S"),
    # The next vendor ends the block, the device classes too.
    ("10de  NVIDIA Corporation\n\t2230  GA102GL [RTX A6000]\n10df  Emulex Corporation\n"
     + L40S_LINE, None),
    ("10de  NVIDIA Corporation\nC 03  Display controller\n" + L40S_LINE, None),
    ("10de  NVIDIA Corporation\n\r\n" + L40S_LINE, None),  # a line of its own, not the block's
    # The file's first line, no newline at its end, Windows line ends, a longer id.
    ("10de  NVIDIA Corporation\n\t26b9  AD102GL [L40S]", "L40S"),
    ("10de  NVIDIA Corporation\r\n\t26b9  AD102GL [L40S]\r\n", "L40S"),
    ("10de  NVIDIA Corporation\n\t26b90  AD102GL [not it]\n", None),
    ("10de  NVIDIA Corporation\n\t26b9  \xff [L40S \xe2\x80]\n", "L40S \ufffd"),
    # A name without brackets is taken whole, from its first letter to its last.
    ("10de  NVIDIA Corporation\n\t26b9  AD102GL L40S 48GB\n", "AD102GL L40S 48GB"),
    ("10de  NVIDIA Corporation\n\t26b9  AD102GL L40S 48GB", "AD102GL L40S 48GB"),
    # The first vendor line of NVIDIA's id starts the block read (a database has one).
    ("10de  NVIDIA Corporation\n" + L40S_LINE + "10df  Emulex Corporation\n"
     "10de  NVIDIA Corporation\n\t26b9  AD102GL [a second block]\n", "L40S"),
    ("# its first line\n10de  NVIDIA Corporation\n" + L40S_LINE + "10df  Emulex Corporation\n"
     "10de  NVIDIA Corporation\n\t26b9  AD102GL [a second block]\n", "L40S"),
])
def test_only_the_device_lines_of_nvidia_s_block_name_a_gpu(root, text, named):
    host = FakeHost(root)
    (root / "usr/share/misc").mkdir(parents=True)
    (root / "usr/share/misc/pci.ids").write_bytes(text.encode("latin-1"))
    host.add_gpu("0000:01:00.0", device="0x26b9")
    assert pci.discover().gpus[0].model == (named or "NVIDIA 0x26b9")


def test_a_device_id_that_is_no_ascii_is_named_by_none_and_fails_nothing(root):
    """Any bytes in the device file: the search for its line neither fails nor finds one."""
    host = FakeHost(root)
    host.pci_ids("10de  NVIDIA Corporation\n" + L40S_LINE + "\t26b?  AD102GL [a question mark]\n")
    host.add_gpu("0000:01:00.0", device="0x26b9")
    host.add_gpu("0000:02:00.0", device="0x26b\u00e9")
    host.add_gpu("0000:03:00.0", device="0x26b9a")  # five digits: no 16-bit id
    assert [g.model for g in pci.discover().gpus] == [
        "L40S", "NVIDIA 0x26b\u00e9", "NVIDIA 0x26b9a"]


def test_a_pci_ids_that_cannot_be_read_gives_way_to_hwdata_s(root):
    host = FakeHost(root)
    (root / "usr/share/misc/pci.ids").mkdir(parents=True)  # not a file
    (root / "usr/share/hwdata").mkdir(parents=True)
    (root / "usr/share/hwdata/pci.ids").write_text("10de  NVIDIA Corporation\n" + L40S_LINE)
    host.add_gpu("0000:01:00.0", device="0x26b9")
    assert pci.discover().gpus[0].model == "L40S"
    (root / "usr/share/hwdata/pci.ids").write_text("10de  NVIDIA Corporation\n")
    assert pci.discover().gpus[0].model == "NVIDIA 0x26b9"


def test_one_type_id_on_two_gpu_models_keeps_each_models_own_definition(root):
    # Definitions are shared per GPU model: another model's type of the same id is its own.
    host = FakeHost(root)
    for address, device, listed in (("0000:01:00.0", "0x1db4", MdevType("GRID V100-8Q", 8192, 2)),
                                    ("0000:02:00.0", "0x1eb8", MdevType("GRID T4-4Q", 4096, 4))):
        host.add_gpu(address, device=device, mdev_types={"nvidia-222": listed})
    assert [(g.types[0].name, g.types[0].max_instances) for g in pci.discover().gpus] == [
        ("GRID V100-8Q", 2), ("GRID T4-4Q", 4)]
    # The same on SR-IOV GPUs, whose VFs list the types.
    for pf, device, name in (("0000:41:00.0", "0x20b5", "NVIDIA A100-20C"),
                             ("0000:42:00.0", "0x20f1", "NVIDIA A100-10C")):
        host.add_gpu(pf, device=device, totalvfs=1)
        host.add_vf(pf, 0, f"{pf[:-1]}4", mdev_types={"nvidia-474": MdevType(name, 10240, 4)})
    found = pci.discover().gpus
    assert [g.vfs[0].types[0].name for g in found if g.vfs] == ["NVIDIA A100-20C", "NVIDIA A100-10C"]


def test_sriov_vfs_belong_to_their_gpu_and_are_not_gpus(root):
    a100_host(root)
    host = pci.discover()
    assert len(host.gpus) == 1
    gpu = host.gpus[0]
    assert (gpu.sriov_totalvfs, gpu.sriov_numvfs) == (16, 16)
    vfs = [f"0000:41:00.{n}" for n in range(4, 8)] + [f"0000:41:01.{n}" for n in range(8)] + \
        [f"0000:41:02.{n}" for n in range(4)]
    assert [vf.address for vf in gpu.vfs] == vfs
    assert [vf.index for vf in gpu.vfs] == list(range(16))
    assert gpu.types == ()  # the PF offers nothing on SR-IOV mdev GPUs
    assert gpu.framework == pci.MDEV and {vf.framework for vf in gpu.vfs} == {pci.MDEV}
    assert {vf.current_type for vf in gpu.vfs} == {None}  # no VFIO type on mdev VFs
    assert [t.id for t in gpu.offered_types()] == ["nvidia-471", "nvidia-472", "nvidia-474",
                                                   "nvidia-475", "nvidia-476", "nvidia-699"]
    assert host.gpu("0000:41:00.5") is gpu and gpu.function("0000:41:00.5").index == 1
    assert host.addresses() == ["0000:41:00.0"] + vfs


def test_owners_names_each_function_s_gpu_as_gpu_finds_it(root):
    a100_host(root)
    host = FakeHost(root)
    host.add_gpu("0000:81:00.0", device="0x1db4")  # a second GPU, without VFs
    found = pci.discover()
    owners = found.owners()
    assert sorted(owners) == found.addresses()
    assert all(owners[a] is found.gpu(a) for a in found.addresses())
    assert owners["0000:41:01.3"].address == "0000:41:00.0"
    assert "0000:81:00.4" not in owners and found.gpu("0000:81:00.4") is None


def test_vendor_specific_vfio_types_come_from_creatable_vgpu_types(root):
    l40s_host(root)
    l40s, h200 = pci.discover().gpus
    assert (l40s.framework, h200.framework) == (pci.VFIO, pci.VFIO)
    vf = l40s.vfs[0]
    assert [(t.id, t.name) for t in vf.types] == [
        ("nvidia-1134", "NVIDIA L40S-2B"), ("nvidia-1136", "NVIDIA L40S-4Q"),
        ("nvidia-1139", "NVIDIA L40S-12Q"), ("nvidia-1140", "NVIDIA L40S-16Q"),
        ("nvidia-1141", "NVIDIA L40S-24Q"), ("nvidia-1142", "NVIDIA L40S-48Q")]
    assert vf.current_type == 0 and vf.framework == pci.VFIO
    # A VF's device id is read from its own device file; on L40S and H200 it is its GPU's.
    assert (l40s.device_id, vf.device_id, h200.device_id, h200.vfs[0].device_id) == (
        "0x26b9", "0x26b9", "0x2335", "0x2335")
    assert (len(l40s.vfs), l40s.sriov_totalvfs, len(h200.vfs)) == (16, 32, 8)
    assert not os.path.exists(root / "sys/class/mdev_bus")


def test_each_vf_has_the_types_its_own_listing_names(root):
    """VFs of one GPU need not list the same types; a VF without a listing lists none."""
    host = l40s_host(root)
    host.vfio_model("0000:81:00.0").frozen = True  # the listings stay as written here
    bus = root / "sys/bus/pci/devices"
    (bus / "0000:81:00.6/nvidia/creatable_vgpu_types").write_text(
        "ID    : vGPU Name\n1134  : NVIDIA L40S-2B\n")
    (bus / "0000:81:00.7/nvidia/creatable_vgpu_types").unlink()
    vfs = pci.discover().gpus[0].vfs
    assert [[t.number for t in vf.types] for vf in vfs[1:4]] == [
        [1134, 1136, 1139, 1140, 1141, 1142], [1134], []]
    assert [vf.framework for vf in vfs[1:4]] == [pci.VFIO] * 3


def test_gpu_without_driver_has_no_types_and_no_driver(root):
    host = FakeHost(root)
    host.add_gpu("0000:01:00.0", driver=None)
    gpu = pci.discover().gpus[0]
    assert (gpu.driver, gpu.types, gpu.framework) == (None, (), None)


def test_devices_are_read_through_bus_links_only(root):
    """A device directory not linked from sys/bus/pci/devices is not found."""
    host = FakeHost(root)
    host.add_gpu("0000:01:00.0")
    stray = root / "sys/devices/pci0000:00/0000:00:09.0/0000:09:00.0"
    stray.mkdir(parents=True)
    for name, value in (("vendor", NVIDIA), ("device", "0x1db4"), ("class", "0x030200")):
        (stray / name).write_text(value)
    assert [g.address for g in pci.discover().gpus] == ["0000:01:00.0"]


def test_no_sysfs_at_all_means_no_gpus(root):
    assert pci.discover().gpus == ()


def test_description_and_framebuffer_units():
    pairs = dict(pci.parse_description("num_heads=4, frl_config=60, framebuffer=2G, max_instance=8"))
    assert pairs == {"num_heads": "4", "frl_config": "60", "framebuffer": "2G", "max_instance": "8"}
    t = pci.VgpuType(1, "x", pci.MDEV, properties=tuple(pairs.items()))
    assert (t.framebuffer_mb, t.max_instances) == (2048, 8)


def test_non_nvidia_type_directories_are_ignored(root):
    host = FakeHost(root)
    host.add_gpu("0000:01:00.0", mdev_types={**V100_TYPES, "i915-GVTg_V5_4": MdevType("x", 1, 1)})
    assert [t.id for t in pci.discover().gpus[0].types] == sorted(V100_TYPES)


def test_each_vf_keeps_its_own_available_instances(root):
    from dataclasses import replace

    from unit_tests.fakehost import A100_TYPES
    host = FakeHost(root)
    host.add_gpu("0000:41:00.0", device="0x20b5", totalvfs=16)
    host.add_vf("0000:41:00.0", 0, "0000:41:00.4", mdev_types=A100_TYPES)
    used = {**A100_TYPES, "nvidia-474": replace(A100_TYPES["nvidia-474"], available=0)}
    host.add_vf("0000:41:00.0", 1, "0000:41:00.5", mdev_types=used)
    first, second = pci.with_available(pci.discover()).gpus[0].vfs
    # A free VF offers one of each type (it holds one vGPU), whatever the GPU fits.
    assert [(t.id, t.available_instances) for t in first.types][:3] == [
        ("nvidia-471", 1), ("nvidia-472", 1), ("nvidia-474", 1)]
    assert [(t.id, t.available_instances) for t in second.types][:3] == [
        ("nvidia-471", 1), ("nvidia-472", 1), ("nvidia-474", 0)]
    assert second.types[2].name == "GRID A100-10C" and second.types[2].max_instances == 4


def test_a_vf_holding_an_mdev_offers_no_more_and_its_siblings_one_each(root):
    """The A100 fixture as a real host shows it: 1 per free VF, 0 on the VF that holds a vGPU.

    Time-sliced vGPUs on one GPU are of one type: beside an A100-20C a free VF offers
    A100-20C only.
    """
    from unit_tests.fakehost import a100_host

    host = a100_host(root, vfs=4)
    host.add_mdev("0000:41:00.5", "nvidia-475", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1")
    vfs = pci.with_available(pci.discover()).gpus[0].vfs
    assert {vf.address: {t.id: t.available_instances for t in vf.types if t.available_instances}
            for vf in vfs} == {"0000:41:00.4": {"nvidia-475": 1}, "0000:41:00.5": {},
                               "0000:41:00.6": {"nvidia-475": 1}, "0000:41:00.7": {"nvidia-475": 1}}


def test_v100_hosts_of_up_to_eight_gpus_have_valid_distinct_addresses(root):
    from unit_tests.fakehost import v100_host

    v100_host(root, count=8)
    addresses = [g.address for g in pci.discover().gpus if g.address != "0000:00:02.0"]
    assert len(set(addresses)) == 8
    assert all(re.fullmatch(r"0000:[0-9a-f]{2}:00\.0", a) for a in addresses), addresses
    assert {"0000:c1:00.0", "0000:e1:00.0", "0000:01:00.0"} <= set(addresses)
    with pytest.raises(ValueError):
        v100_host(root, count=9)


def reads(opened):
    """Every host file opened for reading, once per opening, as strings."""
    return [str(p) for p, n in opened.reads.items() for _ in range(n)]


def test_discovery_reads_each_type_definition_once_and_no_capacity(root):
    from unit_tests.fakehost import A100_TYPES
    from unit_tests.faketools import OPENED

    a100_host(root, gpus=2, vfs=4)
    with OPENED as watched:
        host = pci.discover()
    opened = reads(watched)
    assert [len(g.vfs) for g in host.gpus] == [4, 4]
    assert all(vf.types and vf.framework == pci.MDEV for g in host.gpus for vf in g.vfs)
    names = [p for p in opened if p.endswith("/name")]
    # Same device id on both GPUs: each type's name and description once for the host.
    assert len(names) == len(A100_TYPES)
    assert len([p for p in opened if p.endswith("/description")]) == len(A100_TYPES)
    # Capacity is read on demand; mdev VFs are not probed for VFIO files.
    assert not [p for p in opened if p.endswith(("/available_instances", "current_vgpu_type"))]
    # A VF is found through its GPU's links: its own vendor file is never read.
    assert not [p for p in opened if p.endswith("/vendor") and "00.4" in p]
    vf = host.gpus[1].vfs[2].address
    with OPENED as watched:
        filled = pci.with_available(host, [vf])
    assert len(reads(watched)) == len(A100_TYPES)
    assert all(t.available_instances is not None for t in filled.gpu(vf).function(vf).types)
    assert all(t.available_instances is None for t in filled.gpus[0].vfs[0].types)


def test_vfio_vfs_are_not_probed_for_mdev_types(root, monkeypatch):
    from vgpu import hostroot
    l40s_host(root)
    listed = []
    real = hostroot.listdir
    monkeypatch.setattr(hostroot, "listdir", lambda where: listed.append(str(where)) or real(where))
    host = pci.discover()
    assert {g.framework for g in host.gpus} == {pci.VFIO}
    assert all(vf.current_type is not None for g in host.gpus for vf in g.vfs)
    # Each GPU's first VF decides its framework; its siblings are not asked again.
    probed = [p for p in listed if p.endswith("mdev_supported_types")]
    assert len(probed) == 2 + 2  # each GPU itself, and its first VF


@pytest.mark.parametrize("name,expected", [
    ("GRID A100-20C", ("A100-20C", "A100", 20, "C", False)),
    ("NVIDIA L40S-12Q", ("L40S-12Q", "L40S", 12, "Q", False)),
    ("GRID A100-4-20C", ("A100-4-20C", "A100", 20, "C", True)),  # MIG: 4 slices
    ("NVIDIA A100-1-5CME", ("A100-1-5CME", "A100", 5, "CME", True)),  # MIG with media engines
    ("GRID RTX6000-4Q", ("RTX6000-4Q", "RTX6000", 4, "Q", False)),
    # NVIDIA's docs: hyphens inside the model; the RTX PRO 6000's driver names (cubecos #312).
    ("NVIDIA RTX6000-Ada-12Q", ("RTX6000-Ada-12Q", "RTX6000-Ada", 12, "Q", False)),
    ("NVIDIA RTX Pro 6000 Blackwell DC-8Q",
     ("RTX Pro 6000 Blackwell DC-8Q", "RTX Pro 6000 Blackwell DC", 8, "Q", False)),
    ("NVIDIA RTX Pro 6000 Blackwell DC-1-8Q",
     ("RTX Pro 6000 Blackwell DC-1-8Q", "RTX Pro 6000 Blackwell DC", 8, "Q", True)),
    ("NVIDIA H200X-141C", ("H200X-141C", "H200X", 141, "C", False)),
])
def test_profile_names_are_read_as_nvidia_spells_them(name, expected):
    found = profiles.profile(name)
    assert (found.name, found.model, found.framebuffer_gb, found.series, found.mig) == expected


def test_a_name_that_is_not_a_profile_has_none():
    assert profiles.profile("vfio-pci passthrough") is None


@pytest.mark.parametrize("make", [v100_host, a100_host])
def test_type_names_and_descriptions_are_read_once_per_gpu_model(root, make):
    """Two V100s list the same types on their PFs, an A100's 16 VFs on each VF: read once."""
    from unit_tests.faketools import OPENED

    make(root)
    with OPENED as opened:
        found = pci.discover()
    functions = [gpu for gpu in found.gpus] + [vf for gpu in found.gpus for vf in gpu.vfs]
    offered = {t.id for f in functions for t in f.types}
    assert len([f for f in functions if f.types]) > 1 and len(offered) > 1
    for leaf in ("name", "description"):
        read = [p for p in opened.reads if p.name == leaf and "mdev_supported_types" in p.parts]
        assert sorted(p.parent.name for p in read) == sorted(offered)  # one function's copy of each
        assert set(opened.reads[p] for p in read) == {1}


@pytest.mark.parametrize("name,keys", [
    ("NVIDIA RTX Pro 6000 Blackwell DC-8Q",
     ("NVIDIA RTX PRO 6000 BLACKWELL DC-8Q", "RTX PRO 6000 BLACKWELL DC-8Q", "DC-8Q")),
    ("NVIDIA L40S-12Q", ("NVIDIA L40S-12Q", "L40S-12Q")),
    ("NVIDIA RTX6000-Ada-12Q", ("NVIDIA RTX6000-ADA-12Q", "RTX6000-ADA-12Q")),
    ("GRID  A100-20C", ("GRID A100-20C", "A100-20C")),
])
def test_a_type_name_is_keyed_in_full_without_vendor_and_by_its_short_form(name, keys):
    assert profiles.name_keys(name) == keys


# Strings built from the pieces of profile names (and a few that are not).
_NAMES = st.lists(st.sampled_from(["L40S", "RTX", "6000", "Ada", "DC", "1", "-", " ", "-8Q",
                                   "-1-8Q", "Q", "_", ".", "-48CME"]),
                  min_size=1, max_size=8).map("".join)


@given(_NAMES)
@settings(max_examples=300)
@example("RTX6000-Ada-12Q")
@example("RTX Pro 6000 Blackwell DC-1-8Q")
@example("L40S-48CME")
@example("DC-8")
def test_the_key_pattern_and_the_profile_parser_are_one_grammar(text):
    """What NAME_KEY (mapping keys, the JSON schema) accepts is exactly what profile() reads."""
    if text != " ".join(text.split()) or re.match(r"(?i)(grid|nvidia) ", text):
        return  # profile() normalises spaces and vendors; keys must be written plainly
    assert (re.fullmatch(profiles.NAME_KEY, text) is not None) == (profiles.profile(text) is not None)


# -- hosts as public transcripts show them ----------------------------------------------

def test_rtx_pro_6000_host_in_two_pci_domains_with_48_vfs_from_function_2(root):
    rtx_pro_6000_host(root)
    host = pci.discover()
    assert [g.address for g in host.gpus] == ["0000:42:00.0", "0000:8c:00.0",
                                              "0001:04:00.0", "0001:c8:00.0"]
    gpu = host.gpu("0001:04:00.0")
    assert (gpu.model, gpu.device_id, gpu.class_code, gpu.framework) == (
        "RTX PRO 6000 Blackwell Server Edition", "0x2bb5", "0x030200", pci.VFIO)
    assert (len(gpu.vfs), gpu.sriov_totalvfs, gpu.sriov_numvfs) == (48, 48, 48)
    # virtfn0 -> ../0001:04:00.2, virtfn14 -> ../0001:04:02.0 (cubecos #312).
    assert (gpu.vfs[0].address, gpu.vfs[14].address, gpu.vfs[-1].address) == (
        "0001:04:00.2", "0001:04:02.0", "0001:04:06.1")
    assert [vf.index for vf in gpu.vfs] == list(range(48))
    # Every VF reads the GPU's own id; a VF is a VF by its physfn link, never by id.
    assert {vf.device_id for g in host.gpus for vf in g.vfs} == {"0x2bb5"}
    assert len(host.addresses()) == 4 + 4 * 48
    assert host.gpu("0001:04:00.2") is gpu and gpu.function("0001:04:00.2").index == 0
    assert "NVIDIA RTX Pro 6000 Blackwell DC-8Q" in {t.name for t in gpu.offered_types()}


def test_a_vf_is_known_by_its_physfn_link_not_by_its_device_id(root):
    """Equal ids either way: a PF with an id like a VF's stays a GPU, a VF never becomes one."""
    host = FakeHost(root)
    host.add_sriov_gpu("0000:42:00.0", device="0x2bb5", vf_device="0x2bb5", count=2,
                       vfio_types={2002: "NVIDIA RTX Pro 6000 Blackwell DC-8Q"}, first_function=2)
    host.add_gpu("0000:43:00.0", device="0x2bb5")  # a second GPU, passed through whole
    found = pci.discover()
    assert [(g.address, [vf.address for vf in g.vfs]) for g in found.gpus] == [
        ("0000:42:00.0", ["0000:42:00.2", "0000:42:00.3"]), ("0000:43:00.0", [])]
    assert found.gpus[0].vfs[0].device_id == found.gpus[0].device_id == "0x2bb5"


@pytest.mark.parametrize("make,model,device,count", [
    (h200_sxm_host, "H200 SXM 141GB", "0x2335", 8),
    (h200_nvl_host, "H200 NVL", "0x233b", 32),
])
def test_h200_hosts_vfs_carry_the_gpus_id(root, make, model, device, count):
    make(root)
    gpu = pci.discover().gpus[0]
    assert (gpu.model, gpu.device_id, len(gpu.vfs), gpu.framework) == (model, device, count, pci.VFIO)
    assert {vf.device_id for vf in gpu.vfs} == {device}
    # H200X-* is the SXM's profile family, H200-* the NVL's.
    family = {profiles.profile(t.name).model for t in gpu.offered_types()}
    assert family == ({"H200X"} if "SXM" in model else {"H200"})


@pytest.mark.parametrize("raw, name", [
    (b"GRID V100-8Q\n", "GRID V100-8Q"),  # the usual attribute: one printable line
    (b"  GRID V100-8Q  \n\n", "GRID V100-8Q"),
    (b"GRID V100-8Q\x00\xff\n", "GRID V100-8Q\ufffd\ufffd"),  # NUL, invalid UTF-8
    (b"GRID\x0cV100-8Q\x1f\n", "GRID\ufffdV100-8Q\ufffd"),
    (b"GRID V100-8Q\x1f\n", "GRID V100-8Q\ufffd"),  # a control character str.strip would eat
    (b"GRID V100-8Q\tx\n", "GRID V100-8Q\tx"),
])
def test_an_attribute_is_read_as_clean_text_whatever_its_bytes(root, raw, name):
    v100_host(root)
    (root / "sys/bus/pci/devices/0000:c1:00.0/mdev_supported_types/nvidia-108/name").write_bytes(raw)
    assert pci.discover().gpus[0].types[3].name == name


@pytest.mark.parametrize("rows", [1, 163, 164, 700])  # a header of 18 bytes, rows of 25
def test_a_creatable_list_is_read_whole_below_at_and_past_a_page(root, rows):
    """sysfs' attributes are at most a page (4 KiB, or 64 KiB on such kernels): read whole."""
    host = FakeHost(root)
    host.add_gpu("0000:01:00.0", device="0x26b9", totalvfs=1)
    listed = {900 + n: f"NVIDIA L40S-{n + 1:03d}Q" for n in range(rows)}
    vf = host.add_vf("0000:01:00.0", 0, "0000:01:00.4", vfio_types=listed)
    size = len((vf / "nvidia/creatable_vgpu_types").read_bytes())
    assert size == 18 + 25 * rows and (size > 4096) == (rows > 163)
    types = pci.discover().gpus[0].vfs[0].types
    assert {t.number: t.name for t in types} == listed


# -- /proc/bus/pci/devices: the vendor files it spares -------------------------------------------

def _vendors_read(monkeypatch) -> list:
    """The functions whose ``vendor`` file discovery reads, in order."""
    read = []
    real = pci._read

    def counting(path):
        if str(path).endswith("/vendor"):
            read.append(str(path).split("/")[-2])
        return real(path)

    monkeypatch.setattr(pci, "_read", counting)
    return read


BUILDERS = [v100_host, a100_host, l40s_host, h200_nvl_host, h200_sxm_host, rtx_pro_6000_host]


@pytest.mark.parametrize("build", BUILDERS, ids=lambda b: b.__name__)
def test_the_kernels_list_spares_other_vendors_reads_and_finds_the_same(root, build, monkeypatch):
    """Every fixture host: the same GPUs, VFs and types with the list as without it."""
    host = build(root)
    without = pci.discover()
    read = _vendors_read(monkeypatch)
    pci.discover()
    everything = list(read)
    host.proc_pci_devices()
    read.clear()
    assert pci.discover() == without and without.gpus
    bus = root / "sys/bus/pci/devices"
    nvidia_slots = {a[-7:] for a in os.listdir(bus) if (bus / a / "vendor").read_text().strip() == NVIDIA}
    # Read: each NVIDIA function and each function sharing its bus, slot and function with one
    # in another domain; spared: every other vendor's.
    assert read == [a for a in everything if a[-7:] in nvidia_slots]
    assert {gpu.address for gpu in without.gpus} <= set(read)


def test_two_domains_at_one_bus_slot_and_function_are_both_read(root, monkeypatch):
    """The kernel's list has no domain: an NVIDIA line at 01:00.0 keeps both 01:00.0s read."""
    host = FakeHost(root)
    host.add_gpu("0001:01:00.0", device="0x26b9", bridge="0001:00:01.0")
    host.add_pci("0000:01:00.0", INTEL, "0x1572", "0x020000", driver="i40e")
    host.add_pci("0000:02:00.0", INTEL, "0x1572", "0x020000", driver="i40e")
    host.proc_pci_devices()
    lines = (root / "proc/bus/pci/devices").read_text().splitlines()
    assert [line.split("\t")[:2] for line in lines] == [
        ["0100", "80861572"], ["0200", "80861572"], ["0100", "10de26b9"]]
    read = _vendors_read(monkeypatch)
    assert [g.address for g in pci.discover().gpus] == ["0001:01:00.0"]
    assert sorted(read) == ["0000:01:00.0", "0001:01:00.0"]  # not 0000:02:00.0


def test_a_function_the_list_does_not_name_is_read(root, monkeypatch):
    """A GPU that appeared after the list was written (hot-plug) is still found."""
    host = FakeHost(root)
    host.add_pci("0000:02:00.0", INTEL, "0x1572", "0x020000", driver="i40e")
    host.proc_pci_devices()
    host.add_gpu("0000:41:00.0", device="0x26b9")
    read = _vendors_read(monkeypatch)
    assert [g.address for g in pci.discover().gpus] == ["0000:41:00.0"]
    assert read == ["0000:41:00.0"]


@pytest.mark.parametrize("damage", [
    lambda text: text.replace("\t", " ", 1),  # not the kernel's format
    lambda text: "zz" + text,
    lambda text: text.replace("8086", "80g6", 1),
    lambda text: text + "0300\t10de\n",  # a cut line
    "past its bound",
    "a directory",  # unreadable
])
def test_a_list_that_is_not_the_kernels_leaves_every_vendor_read(root, monkeypatch, damage):
    host = FakeHost(root)
    host.add_pci("0000:02:00.0", INTEL, "0x1572", "0x020000", driver="i40e")
    host.add_gpu("0000:41:00.0", device="0x26b9")
    path = host.proc_pci_devices()
    if damage == "a directory":
        path.unlink()
        path.mkdir()
    elif damage == "past its bound":
        monkeypatch.setattr(pci, "PROC_DEVICES_LIMIT", len(path.read_bytes()) - 1)
    else:
        path.write_text(damage(path.read_text()))
    read = _vendors_read(monkeypatch)
    assert [g.address for g in pci.discover().gpus] == ["0000:41:00.0"]
    assert sorted(read) == ["0000:02:00.0", "0000:41:00.0"]


# -- sriov_offset and sriov_stride: VF addresses without a link read each --------------------------

def _virtfn_links_read(monkeypatch) -> list:
    """The ``virtfn`` links discovery reads, in order."""
    read = []
    real = pci._link_name

    def counting(path):
        if "/virtfn" in str(path):
            read.append(str(path).rsplit("/", 2)[-2:])
        return real(path)

    monkeypatch.setattr(pci, "_link_name", counting)
    return read


def _placement_removed(root) -> None:
    for gpu_dir in (root / "sys/bus/pci/devices").iterdir():
        for name in ("sriov_offset", "sriov_stride"):
            if (gpu_dir / name).exists():
                (gpu_dir / name).unlink()


SRIOV_BUILDERS = [a100_host, l40s_host, h200_nvl_host, h200_sxm_host, rtx_pro_6000_host]


@pytest.mark.parametrize("build", SRIOV_BUILDERS, ids=lambda b: b.__name__)
def test_vf_addresses_are_the_kernels_and_no_link_is_read(root, build, monkeypatch):
    """Every SR-IOV fixture host: each VF where its link says, the same host as by the links."""
    build(root)
    bus = root / "sys/bus/pci/devices"
    read = _virtfn_links_read(monkeypatch)
    found = pci.discover()
    assert read == [] and found.gpus and all(gpu.vfs for gpu in found.gpus)
    for gpu in found.gpus:
        assert [(vf.index, vf.address) for vf in gpu.vfs] == [
            (n, os.path.basename(os.readlink(bus / gpu.address / f"virtfn{n}")))
            for n in range(int((bus / gpu.address / "sriov_numvfs").read_text()))]
    _placement_removed(root)
    assert pci.discover() == found
    assert len(read) == sum(len(gpu.vfs) for gpu in found.gpus)


def test_the_rtx_pro_6000s_vf_14_is_at_the_next_slot(root):
    """cubecos issue 312: VF 0 at function .2, "virtfn14 -> ../0001:04:02.0"."""
    rtx_pro_6000_host(root)
    pf = root / "sys/bus/pci/devices/0001:04:00.0"
    assert (pf / "sriov_offset").read_text() == "2\n"
    gpu = pci.discover().gpu("0001:04:00.0")
    assert gpu is not None and [vf.address for vf in gpu.vfs][:2] == ["0001:04:00.2", "0001:04:00.3"]
    assert gpu.vfs[14].address == "0001:04:02.0"


def _placed(root, pf: str, count: int, offset: int, stride: int = 1) -> tuple:
    """A GPU at ``pf`` whose ``count`` VFs are where the kernel puts them: the host, their addresses."""
    host = FakeHost(root)
    host.add_gpu(pf, device="0x26b9", totalvfs=max(count, 1))
    return host, host.add_placed_vfs(pf, count, offset, stride, vfio_types=L40S_TYPES)


def _links_of(root, pf: str) -> list:
    bus = root / "sys/bus/pci/devices" / pf
    return [os.path.basename(os.readlink(bus / f"virtfn{n}"))
            for n in range(len([n for n in os.listdir(bus) if n.startswith("virtfn")]))]


def test_a_gpu_past_slot_nine_has_vfs_on_the_next_bus_without_a_link_read(root, monkeypatch):
    """0000:41:1c.2, offset 4: VF 0 at 41:1c.6, VF 25 at 41:1f.7, VF 26 on bus 42 (42:00.0)."""
    _, addresses = _placed(root, "0000:41:1c.2", 32, 4)
    assert addresses[:3] == ["0000:41:1c.6", "0000:41:1c.7", "0000:41:1d.0"]
    assert addresses[25:27] == ["0000:41:1f.7", "0000:42:00.0"]
    assert addresses == _links_of(root, "0000:41:1c.2")
    read = _virtfn_links_read(monkeypatch)
    assert [vf.address for vf in pci.discover().gpus[0].vfs] == addresses and read == []


def test_offset_one_at_the_last_slot_with_one_vf_reads_no_link(root, monkeypatch):
    """The smallest offset, the last slot (1f) and a single VF are the kernel's too."""
    assert _placed(root, "0000:41:1f.0", 1, 1)[1] == ["0000:41:1f.1"]
    read = _virtfn_links_read(monkeypatch)
    assert [vf.address for vf in pci.discover().gpus[0].vfs] == ["0000:41:1f.1"] and read == []


@pytest.mark.parametrize("offset", [7, 8])
def test_the_last_bus_is_reached_not_passed(root, monkeypatch, offset):
    """0000:ff:00.0, stride 8, 32 VFs: at offset 7 the last is ff:1f.7, bus ff's last address.

    A bus number has 8 bits: at offset 8 the last VF would be one past it, so the links are
    read instead (and name it wherever a test put it).
    """
    host, addresses = _placed(root, "0000:ff:00.0", 32 if offset == 7 else 31, offset, stride=8)
    if offset == 7:
        assert addresses[0] == "0000:ff:00.7" and addresses[-1] == "0000:ff:1f.7"
    else:  # VF 31 at routing ID 0x10000, as no kernel has it
        assert addresses[0] == "0000:ff:01.0" and addresses[-1] == "0000:ff:1f.0"
        host.add_vf("0000:ff:00.0", 31, "0000:fe:00.1", vfio_types=L40S_TYPES)
        host.vf_placement("0000:ff:00.0", 8, 8)
        addresses = _links_of(root, "0000:ff:00.0")
        assert len(addresses) == 32 and addresses[-1] == "0000:fe:00.1"
    read = _virtfn_links_read(monkeypatch)
    assert [vf.address for vf in pci.discover().gpus[0].vfs] == addresses
    assert len(read) == (0 if offset == 7 else 32)


def test_a_gpus_links_are_listed_in_index_order(root):
    """virtfn10 after virtfn9, not after virtfn1."""
    l40s_host(root)
    links = pci.virtfn_links(str(root / "sys/bus/pci/devices/0000:81:00.0"))
    assert [link for link, _ in links] == [f"virtfn{n}" for n in range(16)]
    assert [address for _, address in links][9:11] == ["0000:81:01.5", "0000:81:01.6"]


def test_a_name_no_kernel_gives_has_its_links_read(root, monkeypatch):
    """Slot 20 is past a PCI slot's five bits: the address is not the kernel's, nor its VFs'."""
    host = FakeHost(root)
    host.add_gpu("0000:41:20.0", device="0x26b9", totalvfs=2)
    for index, address in enumerate(["0000:41:20.4", "0000:41:20.5"]):
        host.add_vf("0000:41:20.0", index, address, vfio_types=L40S_TYPES)
    host.vf_placement("0000:41:20.0", 4)
    read = _virtfn_links_read(monkeypatch)
    assert [vf.address for vf in pci.discover().gpus[0].vfs] == ["0000:41:20.4", "0000:41:20.5"]
    assert len(read) == 2


@pytest.mark.parametrize("damage", ["missing", "not a number", "a zero stride", "a directory",
                                    "past the last bus", "more VFs than links", "no VFs counted"])
def test_a_placement_that_is_not_the_kernels_has_the_links_read(root, monkeypatch, damage):
    """The same VFs as the links give, from the links, whatever is wrong with the numbers."""
    l40s_host(root)
    pf = root / "sys/bus/pci/devices/0000:81:00.0"  # the L40S, first of the two
    links = pci.discover()
    if damage == "missing":
        (pf / "sriov_stride").unlink()
    elif damage == "not a number":
        (pf / "sriov_offset").write_text("four\n")
    elif damage == "a zero stride":
        (pf / "sriov_stride").write_text("0\n")
    elif damage == "a directory":
        (pf / "sriov_offset").unlink()
        (pf / "sriov_offset").mkdir()
    elif damage == "past the last bus":
        (pf / "sriov_offset").write_text("65000\n")
    elif damage == "more VFs than links":  # the kernel's count and links disagree: the links
        (pf / "sriov_numvfs").write_text(f"{int((pf / 'sriov_numvfs').read_text()) + 1}\n")
    else:  # read while the VFs are being disabled: the count is 0, the links still there
        (pf / "sriov_numvfs").write_text("0\n")
    read = _virtfn_links_read(monkeypatch)
    found = pci.discover()
    assert [vf.address for vf in found.gpus[0].vfs] == [vf.address for vf in links.gpus[0].vfs]
    if damage not in ("more VFs than links", "no VFs counted"):
        assert found == links
    assert len(read) == len(links.gpus[0].vfs)


def test_vfs_the_driver_shows_no_framework_on_yet_have_no_types(root):
    """VFs without ``mdev_supported_types`` or ``nvidia/`` (the driver not bound yet) are listed bare."""
    host = FakeHost(root)
    host.add_gpu("0000:41:00.0", device="0x26b9", totalvfs=2)
    host.add_placed_vfs("0000:41:00.0", 2, 4)
    vfs = pci.discover().gpus[0].vfs
    assert [(vf.address, vf.types, vf.current_type, vf.framework, vf.device_id) for vf in vfs] == [
        ("0000:41:00.4", (), None, None, ""), ("0000:41:00.5", (), None, None, "")]


def test_a_vf_device_id_is_read_once_a_gpu_on_vfio_only_and_said_for_vfio_vfs(root, monkeypatch):
    """The first VFIO VF's ``device`` names them all; mdev VFs and bare ones have none."""
    a100_host(root)  # mdev VFs at 0000:41:00.4 and on
    host = FakeHost(root, write_defaults=False)
    host.add_gpu("0000:61:00.0", device="0x26b9", totalvfs=2)
    host.add_vf("0000:61:00.0", 0, "0000:61:00.4", vfio_types=L40S_TYPES)
    host.add_vf("0000:61:00.0", 1, "0000:61:00.5")  # no nvidia/ (another driver holds it)
    read = []
    real = pci._read
    monkeypatch.setattr(pci, "_read", lambda path: read.append(str(path)) or real(path))
    found = {gpu.address: gpu for gpu in pci.discover().gpus}
    assert [vf.device_id for vf in found["0000:61:00.0"].vfs] == ["0x26b9", ""]
    assert found["0000:41:00.0"].framework == pci.MDEV
    assert {vf.device_id for vf in found["0000:41:00.0"].vfs} == {""}
    vf_devices = [p for p in read if p.endswith("/device") and "/virtfn" in p]
    assert vf_devices == [str(root / "sys/bus/pci/devices/0000:61:00.0/virtfn0/device")]


def test_a_vf_device_file_that_is_gone_leaves_the_device_id_empty(root):
    host = l40s_host(root)
    host.vfio_model("0000:81:00.0").frozen = True
    (root / "sys/bus/pci/devices/0000:81:00.4/device").unlink()
    gpu = pci.discover().gpus[0]
    assert gpu.framework == pci.VFIO and {vf.device_id for vf in gpu.vfs} == {""}


def test_an_entry_named_like_a_vf_link_is_not_a_vf(root):
    """Only ``virtfn<N>`` names a VF; anything else in the GPU's directory is passed over."""
    l40s_host(root)
    pf = root / "sys/bus/pci/devices/0000:81:00.0"
    found = pci.discover()
    _placement_removed(root)  # the GPU's directory is listed
    (pf / "virtfn_old").symlink_to("../0000:81:00.4")
    (pf / "virtfn3x").symlink_to("../0000:81:00.5")
    (pf / "virtfn\u0663").symlink_to("../0000:81:00.6")  # ٣, a digit, not an ASCII one
    assert pci.discover() == found
