"""vgpu.mdevs: the record of the mdevs instances hold, on V100 and A100 fixture hosts."""

import json
import logging

import pytest

from unit_tests.fakehost import a100_host, v100_host
from unit_tests.faketools import OPENED
from unit_tests.libvirt import broken_guest, defined_guest, running_guest
from vgpu import mdevs, pci
from vgpu.errors import HostReadError

C1, E1 = "0000:c1:00.0", "0000:e1:00.0"
IGPU = "0000:00:02.0"
# mdev uuids, and the instances (libvirt <uuid>) holding them
M1, M2, M3 = ("11111111-2222-4333-8444-000000000001", "11111111-2222-4333-8444-000000000002",
              "11111111-2222-4333-8444-000000000003")
GVT = "11111111-2222-4333-8444-0000000000ff"
I1, I2, I3, I4 = (f"aaaaaaaa-bbbb-4ccc-8ddd-00000000000{n}" for n in range(1, 5))


@pytest.fixture
def host(root):
    """Two V100s: two nvidia-108 on c1 (one instance shut off), one nvidia-109 on e1."""
    fake = v100_host(root)
    for parent, type_id, uuid in ((C1, "nvidia-108", M1), (C1, "nvidia-108", M2),
                                  (E1, "nvidia-109", M3), (IGPU, "i915-GVTg_V5_4", GVT)):
        fake.add_mdev(parent, type_id, uuid)
    running_guest(root, "instance-00000001", I1, mdev_uuid=M1)
    defined_guest(root, "instance-00000002", I2, mdev_uuid=M2)  # shut off: keeps its mdev
    running_guest(root, "instance-00000003", I3, mdev_uuid=M3)
    running_guest(root, "instance-00000004", I4, mdev_uuid=GVT)  # Intel GVT-g: not ours
    return fake


def record(root):
    return json.loads((root / mdevs.FILE).read_text())["mdevs"]


EXPECTED = [
    {"uuid": M1, "parent": C1, "type": "nvidia-108", "instance": I1, "domain": "instance-00000001"},
    {"uuid": M2, "parent": C1, "type": "nvidia-108", "instance": I2, "domain": "instance-00000002"},
    {"uuid": M3, "parent": E1, "type": "nvidia-109", "instance": I3, "domain": "instance-00000003"},
]


def test_each_mdev_an_instance_holds_is_recorded_with_its_parent_and_type(host, root):
    assert [m.uuid for m in mdevs.refresh(pci.discover())] == [M1, M2, M3]
    assert record(root) == EXPECTED  # the GVT-g mdev on Intel's iGPU is not ours
    assert mdevs.load() == [mdevs.Mdev(e["uuid"], e["parent"], e["type"], e["instance"],
                                       e["domain"]) for e in EXPECTED]


def test_the_record_is_logged_when_written_and_only_then(host, root, caplog):
    caplog.set_level(logging.INFO, logger="vgpu.mdevs")
    mdevs.refresh(pci.discover())
    mdevs.refresh(pci.discover())  # the same record: not written, not logged again
    assert [r.getMessage() for r in caplog.records if r.name == "vgpu.mdevs"] == [
        f"the boot step's record in /{mdevs.FILE} now holds mdevs: 3"]


def test_mdevs_on_an_a100s_virtual_functions_are_recorded_on_their_vf(root):
    fake = a100_host(root, gpus=2, vfs=4)
    fake.add_mdev("0000:41:00.5", "nvidia-474", M1)
    fake.add_mdev("0000:61:00.4", "nvidia-475", M2)
    running_guest(root, "instance-00000001", I1, mdev_uuid=M1)
    running_guest(root, "instance-00000002", I2, mdev_uuid=M2)
    mdevs.refresh(pci.discover())
    assert [(m["parent"], m["type"]) for m in record(root)] == [
        ("0000:41:00.5", "nvidia-474"), ("0000:61:00.4", "nvidia-475")]


def test_after_a_reboot_an_mdev_not_there_keeps_its_recorded_place(host, root):
    mdevs.refresh(pci.discover())
    host.reboot()  # a hook before (or without) the boot step: no mdev exists
    assert not (root / "sys/bus/mdev/devices").exists() or \
        not list((root / "sys/bus/mdev/devices").iterdir())
    assert [m.parent for m in mdevs.refresh(pci.discover())] == [C1, C1, E1]
    assert record(root) == EXPECTED


def test_an_mdev_held_but_never_recorded_and_gone_is_said(root, caplog):
    v100_host(root)
    running_guest(root, "instance-00000001", I1, mdev_uuid=M1)
    caplog.set_level(logging.WARNING, logger="vgpu.mdevs")
    assert mdevs.refresh(pci.discover()) == []
    assert not (root / mdevs.FILE).exists()
    assert (f"instance-00000001 (vm-instance-00000001, {I1}) holds mdev {M1}, which does not "
            "exist and was never recorded: it cannot be created again at boot") in caplog.messages


def test_an_instance_deleted_leaves_the_record_and_the_last_removes_it(host, root):
    mdevs.refresh(pci.discover())
    for name in ("instance-00000001", "instance-00000003"):
        for directory in ("run/libvirt/qemu", "etc/libvirt/qemu"):
            (root / directory / f"{name}.xml").unlink()
    assert [m.uuid for m in mdevs.refresh(pci.discover())] == [M2]
    assert record(root) == EXPECTED[1:2]
    (root / "etc/libvirt/qemu/instance-00000002.xml").unlink()
    assert mdevs.refresh(pci.discover()) == []
    assert not (root / mdevs.FILE).exists()


def test_while_a_domain_file_cannot_be_read_every_recorded_mdev_is_kept(host, root):
    mdevs.refresh(pci.discover())
    (root / "etc/libvirt/qemu/instance-00000002.xml").unlink()
    broken_guest(root, "instance-00000002")  # what held M2 is not known now
    assert [m.uuid for m in mdevs.refresh(pci.discover())] == [M1, M2, M3]
    assert record(root) == EXPECTED


def test_nothing_is_read_or_written_again_while_nothing_changed(host, root):
    mdevs.refresh(pci.discover())
    written = (root / mdevs.FILE).stat().st_mtime_ns
    found = pci.discover()
    with OPENED as opened:
        assert [m.uuid for m in mdevs.refresh(found)] == [M1, M2, M3]
    assert [p for p in opened.reads if "libvirt" in str(p)] == []
    assert opened.writes == []
    assert (root / mdevs.FILE).stat().st_mtime_ns == written
    # A domain file rewritten (here: its mdev replaced) is read again.
    path = root / "etc/libvirt/qemu/instance-00000002.xml"
    path.write_text(path.read_text().replace(M2, "11111111-2222-4333-8444-000000000009"))
    with OPENED as opened:
        mdevs.refresh(found)
    assert path in opened.reads
    assert [m["uuid"] for m in record(root)] == [M1, M3]  # the new one was never created


def test_a_damaged_record_is_replaced(host, root, caplog):
    (root / mdevs.FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / mdevs.FILE).write_text("{not json")
    caplog.set_level(logging.WARNING, logger="vgpu.mdevs")
    mdevs.refresh(pci.discover())
    assert record(root) == EXPECTED
    assert f"replacing /{mdevs.FILE}: is not JSON" in caplog.messages


@pytest.mark.parametrize("entry", [
    {"uuid": M1, "parent": "../../../etc", "type": "nvidia-108"},
    {"uuid": M1, "parent": C1, "type": "../../remove"},
    {"uuid": "x/../y", "parent": C1, "type": "nvidia-108"},
    "nvidia-108",
])
def test_a_record_entry_that_could_name_another_path_is_refused(root, entry):
    (root / mdevs.FILE).parent.mkdir(parents=True)
    (root / mdevs.FILE).write_text(json.dumps({"version": 1, "mdevs": [entry]}))
    with pytest.raises(mdevs.RecordError, match="an entry is not a uuid, a parent address"):
        mdevs.load()


def test_domains_that_cannot_be_listed_raise_and_keep_the_record(host, root):
    mdevs.refresh(pci.discover())
    before = (root / mdevs.FILE).read_text()
    qemu = root / "etc/libvirt/qemu"
    qemu.rename(root / "etc/libvirt/qemu.moved")
    qemu.write_text("a file where libvirt's directory belongs\n")
    with pytest.raises(HostReadError, match="cannot read /etc/libvirt/qemu"):
        mdevs.refresh(pci.discover())
    assert (root / mdevs.FILE).read_text() == before


@pytest.mark.parametrize("major,recorded", [(17, True), (29, True), (30, False), (34, False)])
def test_only_nova_before_30_loses_mdevs_at_reboot(major, recorded):
    assert mdevs.applies(major) is recorded
    assert mdevs.applies(None) is False


def test_an_mdev_recreated_with_another_type_between_hooks_is_recorded_with_it(host, root):
    """Same uuid, same domain file, another type: the record must follow, or boot makes the old."""
    import shutil

    mdevs.refresh(pci.discover())
    link = root / mdevs.MDEV_DEVICES / M3
    shutil.rmtree(link.resolve())
    link.unlink()
    host.add_mdev(E1, "nvidia-108", M3)
    assert [(m.uuid, m.parent, m.type_id) for m in mdevs.refresh(pci.discover())][2] == (
        M3, E1, "nvidia-108")
    assert record(root)[2]["type"] == "nvidia-108"
