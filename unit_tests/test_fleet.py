"""The fleet's record, report and drain plan (vgpu.fleet), on plain data and generated hosts.

NVIDIA's verdict goes through vgpu.nvml and the pynvml stand-in
(unit_tests/fake_pynvml), whose names and structures are checked against
nvidia-ml-py in unit_tests/test_nvml.py.
"""

import ctypes
import json
import re

import pytest

from tools import benchhosts
from unit_tests.fake_pynvml import pynvml as fake
from vgpu import drain, fleet, nvml, pci, table
from vgpu.drain import drain_plan

APP = "nova-compute-nvidia-vgpu"
OLD, NEW = "570.158.02", "570.172.08"
H200 = fleet.GpuRecord("0000:c1:00.0", "0x2335", 141, "vfio", False, "nvidia-1200",
                       "H200X-35C", 4, resource_class="CUSTOM_NVIDIA_1200", tag="true")
READY = fleet.Readiness(vfio_live_migration=True, live_migration=True)


def record(host="gpu-1", driver=OLD, gpus=(H200,), paused=False, readiness=READY):
    return fleet.Record(host, "12", driver, paused, "ok", readiness, tuple(gpus))


def unit(n):
    return f"{APP}/{n}"


def peers(*records):
    return fleet.peers({unit(n): fleet.encode(r) for n, r in enumerate(records)})


# -- the record ----------------------------------------------------------------------------

def test_a_record_reads_back_as_published():
    mine = record(gpus=(H200._replace(metadata="QUJD"), H200._replace(whole=True, tag="")),
                  readiness=fleet.Readiness("10.0.0", "8.2.2", True, False, ("a blocker",),
                                            True, ("a warning",), "running"))
    mine = mine._replace(gpu_count=20, tag_since=1_765_000_000)
    assert fleet.decode(fleet.encode(mine)) == mine


@pytest.mark.parametrize("held, problem", [
    (None, "publishes nothing yet"),
    ("", "publishes nothing yet"),
    ("garbage{", "publishes no JSON"),
    ("[" * 100_000, f"publishes 100000 bytes, above {fleet.LIMIT}"),
    ("[" * 5_000, "publishes no JSON"),  # nested past the recursion limit
    ("[1, 2]", "publishes no record"),
    ('{"host": "old"}', "publishes fleet schema None, this unit reads 1 (a unit of another charm "
                        "revision: refresh them to one)"),
    ('{"v": 2, "host": "new"}', "publishes fleet schema 2, this unit reads 1 (a unit of another "
                                "charm revision: refresh them to one)"),
    ('{"v": 1, "host": "h"}', "publishes a record that is not shaped as schema 1 says"),
    ('{"v": 1, "host": 7, "lm": {"blockers": []}, "gpus": []}',
     "publishes a record that is not shaped as schema 1 says"),
    ('{"v": 1, "lm": {"blockers": []}, "gpus": [{"a": "x", "gb": -1}]}',
     "publishes a record that is not shaped as schema 1 says"),
    ('{"v": 1, "lm": {"blockers": []}, "gpus": {"a": 1}}', "publishes no GPU list"),
])
def test_a_peer_that_cannot_be_read_is_said_never_raised(held, problem):
    found = fleet.peers({unit(0): fleet.encode(record()), unit(1): held})
    assert found[1] == fleet.Peer(unit(1), None, problem)
    assert fleet.inconsistencies(found) == [f"{unit(1)} cannot be read: it {problem}"]


def test_units_are_ordered_by_number_not_text():
    found = fleet.peers({unit(10): None, unit(2): None, unit(1): None})
    assert [p.unit for p in found] == [unit(1), unit(2), unit(10)]


def test_an_eight_gpu_host_publishes_under_16_kib_with_nvidias_metadata(root):
    """The bench's 8 L40S-like GPUs x 32 VFs, every GPU with NVML's metadata at its real size."""
    benchhosts.sriov_host(root, "vfio", 8, 32)
    host = pci.discover()
    import pynvml  # nvidia-ml-py: the real structure's size

    metadata = {g.address: nvml._encode(pynvml.c_nvmlVgpuPgpuMetadata_t()) for g in host.gpus}
    mapping = {"CUSTOM_NVIDIA_1139": [vf.address for g in host.gpus for vf in g.vfs[:4]]}
    gpus = fleet.gpu_records(host, mapping, metadata, fleet.Published(reporting=True))
    assert len(gpus) == 8 and all(g.metadata for g in gpus)
    assert {(g.type_id, g.resource_class, g.most, g.memory_gb) for g in gpus} == {
        ("nvidia-1139", "CUSTOM_NVIDIA_1139", 4, 48)}
    worst = fleet.Record("h" * 500, "9" * 500, OLD, False, "x" * 500, fleet.Readiness(
        "1" * 500, "2" * 500, True, True, tuple("b" * 500 for _ in range(50))), gpus)
    text = fleet.encode(worst)
    assert len(text.encode()) < 16 * 1024
    assert fleet.decode(text).gpus == gpus  # nothing of the GPUs was cut


def test_the_class_each_mode_really_has_and_the_published_tag(root):
    """Issue 40.5: a VFIO class only with pci-in-placement; the VFs' live_migratable tag."""
    benchhosts.sriov_host(root, "vfio", 1, 8)
    host = pci.discover()
    vfs = [vf.address for vf in host.gpus[0].vfs[:4]]
    mapping = {"CUSTOM_NVIDIA_1139": vfs}
    sections = {"pci": [["device_spec", json.dumps({"address": a, "live_migratable": "yes",
                                                    "resource_class": "CUSTOM_NVIDIA_1139"})]
                        for a in vfs]}
    (gpu,) = fleet.gpu_records(host, mapping, given=fleet.published(sections))
    assert (gpu.resource_class, gpu.tag) == ("", "true")
    sections["pci"].append(["report_in_placement", "True"])
    (gpu,) = fleet.gpu_records(host, mapping, given=fleet.published(sections))
    assert gpu.resource_class == "CUSTOM_NVIDIA_1139"


def test_an_mdev_type_with_its_own_class_names_it(root):
    benchhosts.sriov_host(root, "mdev", 1, 16)
    host = pci.discover()
    mapping = {"nvidia-474": [vf.address for vf in host.gpus[0].vfs[:4]]}
    given = fleet.Published(mdev_classes={"nvidia-474": "CUSTOM_VGPU_A100_10C"})
    (gpu,) = fleet.gpu_records(host, mapping, given=given)
    assert gpu.resource_class == "CUSTOM_VGPU_A100_10C"


def test_a_fully_assigned_vfio_type_keeps_its_name_and_maximum(root):
    """Issue 40.7: no VF lists nvidia-1139 once all four hold it; the catalogue learnt its name."""
    from unit_tests.fakehost import FakeHost

    host = FakeHost(root)
    host.add_gpu("0000:c1:00.0", device="0x26b9", totalvfs=16)
    for i in range(4):
        host.add_vf("0000:c1:00.0", i, f"0000:c1:00.{i + 4}", vfio_types={}, current_type=1139)
    found = pci.discover()
    (gpu,) = fleet.gpu_records(found, {})
    assert (gpu.type_id, gpu.type_name, gpu.most) == ("nvidia-1139", "", 0)  # nothing to go by
    learnt = {"0x26b9 570.158.02": {"1139": "NVIDIA L40S-12Q"}}
    (gpu,) = fleet.gpu_records(found, {}, learnt=learnt, driver_version=OLD)
    assert (gpu.type_id, gpu.type_name, gpu.most) == ("nvidia-1139", "L40S-12Q", 4)


def test_a_record_too_big_for_its_metadata_drops_the_metadata_first():
    gpus = tuple(H200._replace(address=f"0000:{n:02x}:00.0", metadata="A" * fleet.MAX_METADATA)
                 for n in range(fleet.MAX_GPUS))
    text = fleet.encode(record(gpus=gpus))
    assert len(text.encode()) <= fleet.LIMIT
    assert {g.metadata for g in fleet.decode(text).gpus} == {""}


def test_an_mdev_host_publishes_its_mapped_type_board_and_maximum(root):
    benchhosts.sriov_host(root, "mdev", 2, 16)
    host = pci.discover()
    mapping = {"nvidia-474": [vf.address for vf in host.gpus[0].vfs[:4]]}
    first, second = fleet.gpu_records(host, mapping)
    assert (first.type_id, first.type_name, first.memory_gb, first.framework, first.most,
            first.resource_class) == ("nvidia-474", "A100-10C", 40, "mdev", 4, "VGPU")
    assert (second.type_id, second.most, second.resource_class) == ("", 0, "")


# -- readiness, inconsistencies and the leader's status ---------------------------------------

def test_what_blocks_live_migration_is_read_from_the_readiness():
    assert fleet.blockers(record()) == []
    assert fleet.blockers(record(readiness=fleet.Readiness())) == ["vfio-live-migration is off"]
    old = fleet.Readiness("9.0.0", "8.2.1", True, True, ("nova-compute 30",))
    assert fleet.blockers(record(readiness=old)) == [
        "nova-compute 30", "post-copy is permitted (QEMU refuses VFIO migration with it)",
        "libvirt 9.0.0 is older than 10.0.0", "qemu 8.2.1 is older than 8.2.2"]


def test_the_leader_names_the_driver_on_fewer_hosts():
    found = peers(record(driver=OLD), record(driver=NEW), record(driver=OLD))
    assert fleet.app_status(found) == (
        "driver 570.172.08 on 1 of 3 hosts: live migration between them fails")


def test_a_consistent_fleet_says_nothing():
    found = peers(record(), record(host="gpu-2"))
    assert fleet.inconsistencies(found) == [] and fleet.app_status(found) == ""


def test_hosts_without_gpus_do_not_count_as_another_driver():
    found = peers(record(), record(driver="", gpus=()))
    assert fleet.inconsistencies(found) == []


def test_one_type_on_different_boards_is_an_inconsistency():
    nvl = H200._replace(device_id="0x233b")
    found = peers(record(), record(gpus=(nvl,)))
    assert fleet.inconsistencies(found) == [
        f"type H200X-35C is mapped on different boards (0x2335/141GB on {unit(0)}; 0x233b/141GB "
        f"on {unit(1)}): its guests cannot live-migrate between them"]


def test_a_unit_not_ready_while_its_peers_are_is_named():
    found = peers(record(), record(readiness=fleet.Readiness()), record())
    assert fleet.inconsistencies(found) == [
        f"{unit(1)} is not ready to live-migrate while 2 of 3 hosts are: "
        "vfio-live-migration is off"]


def test_drivers_come_before_unreadable_units():
    found = fleet.peers({unit(0): fleet.encode(record()), unit(1): "x",
                         unit(2): fleet.encode(record(driver=NEW))})
    assert fleet.app_status(found).startswith("driver 570.172.08 on 1 of 2 hosts")


# -- fleet-report -------------------------------------------------------------------------

JUJU_KEY = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")


def test_the_report_has_a_row_per_unit_and_keys_juju_accepts():
    found = fleet.peers({unit(0): fleet.encode(record()), unit(1): "x",
                         unit(2): fleet.encode(record(driver=NEW, paused=True))})
    results = fleet.report(found)
    for path, _ in table.flatten(results):
        assert all(JUJU_KEY.match(key) for key in path), path
    lines = results["table"].splitlines()
    assert lines[0].split() == ["unit", "host", "driver", "gpus", "boards", "types", "live",
                                "migration", "boot", "paused"]
    assert len(lines) == 4 and "cannot be read" in lines[2] and lines[3].endswith("yes")
    assert json.loads(results["inconsistencies"]) == fleet.inconsistencies(found)
    assert results["units"]["unit-2"]["gpus"]["gpu-0"] == {
        "address": "0000:c1:00.0", "board": "0x2335/141GB", "framework": "vfio",
        "type": "H200X-35C", "most": "4"}
    assert json.loads(results["capacity-commands"]) == [
        "openstack allocation candidate list --resource CUSTOM_NVIDIA_1200=1 "
        "--os-placement-api-version 1.12  # H200X-35C"]


def test_the_report_says_each_cell_and_word():
    """A ready unit, an unreadable one, one with little known, one without GPUs: every cell."""
    bare = fleet.GpuRecord("0000:81:00.0", "0x26b9")  # no framework, type or maximum yet
    other = H200._replace(address="0000:c2:00.0", type_id="nvidia-1201", type_name="H200X-70C")
    blocked = fleet.Readiness(blockers=("nova-compute 30",),
                              warnings=("downtime far from what vGPU guests need", "a second"))
    unknown = fleet.Record("gpu-3", "", "", True, "", blocked,
                           (H200._replace(type_name=""), bare, other))
    found = fleet.peers({unit(0): fleet.encode(record()), unit(1): "x",
                         unit(2): fleet.encode(unknown),
                         unit(3): fleet.encode(record(host="gpu-4", gpus=()))})
    results = fleet.report(found)
    said = "nova-compute 30; vfio-live-migration is off"
    assert results["table"] == table.render(
        ["unit", "host", "driver", "gpus", "boards", "types", "live migration", "boot", "paused"],
        [[unit(0), "gpu-1", OLD, "1", "0x2335/141GB", "H200X-35C", "ready", "ok", "no"],
         [unit(1), "-", "-", "-", "-", "-", "cannot be read", "-", "-"],
         [unit(2), "gpu-3", "none", "3", "0x2335/141GB, 0x26b9/?GB", "H200X-70C, nvidia-1200",
          f"no: {said}", "-", "yes"],
         [unit(3), "gpu-4", OLD, "0", "-", "-", "ready", "ok", "no"]], what="units")
    h200 = {"address": "0000:c1:00.0", "board": "0x2335/141GB", "framework": "vfio",
            "type": "H200X-35C", "most": "4"}
    assert results["units"] == {
        "unit-0": {"unit": unit(0), "host": "gpu-1", "revision": "12", "driver": OLD,
                   "paused": "no", "boot": "ok", "live-migration": "ready",
                   "gpus": {"gpu-0": h200}},
        "unit-1": {"unit": unit(1), "problem": "publishes no JSON"},
        "unit-2": {"unit": unit(2), "host": "gpu-3", "revision": "unknown", "driver": "none",
                   "paused": "yes", "boot": "none", "live-migration": said,
                   "live-migration-warnings": "downtime far from what vGPU guests need; a second",
                   "gpus": {"gpu-0": {**h200, "type": "nvidia-1200"},
                            "gpu-1": {"address": "0000:81:00.0", "board": "0x26b9/?GB",
                                      "framework": "none", "type": "none", "most": "unknown"},
                            "gpu-2": {**h200, "address": "0000:c2:00.0", "type": "H200X-70C"}}},
        "unit-3": {"unit": unit(3), "host": "gpu-4", "revision": "12", "driver": OLD,
                   "paused": "no", "boot": "ok", "live-migration": "ready", "gpus": {}}}
    assert results["summary"] == (
        f"4 units, 4 GPUs; 2 inconsistencies, first: {unit(2)} is not ready to live-migrate "
        f"while 1 of 2 hosts are: {said}")
    assert fleet.report(fleet.peers({unit(0): fleet.encode(record())}))["summary"] == (
        "1 units, 1 GPUs; consistent")


def test_a_record_s_text_left_unset_is_published_empty():
    """src/fleet.py (not type-checked) builds the record: a None there reads back as ""."""
    unset = record()._replace(revision=None, readiness=READY._replace(source=None))
    back = fleet.decode(fleet.encode(unset))
    assert (back.revision, back.readiness.source) == ("", "")


def test_a_type_named_in_several_words_is_published_by_its_last(root):
    """The RTX PRO 6000's "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q": DC-1-24Q, a MIG-backed type."""
    from unit_tests.fakehost import FakeHost

    host = FakeHost(root)
    host.add_gpu("0000:42:00.0", device="0x2bb5", totalvfs=4)
    host.add_vf("0000:42:00.0", 0, "0000:42:00.2", vfio_types={}, current_type=2033)
    host.add_vf("0000:42:00.0", 1, "0000:42:00.3",
                vfio_types={2033: "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q"})
    (gpu,) = fleet.gpu_records(pci.discover(), {})
    assert (gpu.type_id, gpu.type_name, gpu.mig) == ("nvidia-2033", "DC-1-24Q", True)


def test_the_report_of_two_hundred_hosts_stays_within_what_juju_accepts():
    many = fleet.peers({unit(n): fleet.encode(record(host=f"gpu-{n}", gpus=tuple(
        H200._replace(address=f"0000:{g:02x}:00.0") for g in range(8)))) for n in range(200)})
    results = fleet.report(many)
    size = sum(len(".".join(p)) + len(str(v)) + 10 for p, v in table.flatten(results))
    assert size <= table.MAX_RESULTS_BYTES
    assert "truncated" in results and "200 units" in results["summary"]
    shown = len(results["units"])
    assert results["truncated"] == (
        f"{shown} of 200 units shown in the nested results; the rest left out to stay within "
        "what Juju's action-set accepts")
    assert list(results["units"]) == [f"unit-{n}" for n in range(shown)]  # whole units, in order
    assert all(len(entry["gpus"]) == 8 for entry in results["units"].values())
    last = results["table"].splitlines()[-1]
    assert re.fullmatch(r"\.\.\. and \d+ more units; see the nested results", last), last


def test_inconsistencies_of_a_big_fleet_stay_a_json_list_juju_accepts():
    many = fleet.peers({unit(n): "garbage" for n in range(400)})
    text = fleet.report(many)["inconsistencies"]
    found = json.loads(text)  # whole, not cut in the middle
    assert len(text.encode()) <= table.MAX_VALUE_BYTES
    assert found[-1].startswith("... and ") and len(found) < 400


def test_each_placement_class_is_given_once_and_a_type_without_one_gets_a_note():
    """Issue 40.5: VGPU, CUSTOM_VGPU_* (mdev-class-per-profile), PCI classes only when reported."""
    mdev = H200._replace(framework="mdev", type_id="nvidia-474", type_name="A100-10C",
                         resource_class="CUSTOM_VGPU_A100_10C", tag="")
    plain = mdev._replace(type_id="nvidia-475", type_name="A100-20C", resource_class="VGPU")
    unnamed = H200._replace(type_name="")  # a peer that lost the name: the same class
    unreported = H200._replace(type_id="nvidia-1201", type_name="H200X-70C", resource_class="")
    evil = H200._replace(type_id="nvidia-9", resource_class="CUSTOM_X $(reboot)")
    results = fleet.report(peers(record(gpus=(mdev, plain, H200)),
                                 record(gpus=(unnamed, unreported, evil))))
    assert json.loads(results["capacity-commands"]) == [
        "openstack allocation candidate list --resource CUSTOM_NVIDIA_1200=1 "
        "--os-placement-api-version 1.12  # H200X-35C, nvidia-1200",
        "openstack allocation candidate list --resource CUSTOM_VGPU_A100_10C=1 "
        "--os-placement-api-version 1.12  # A100-10C",
        "openstack allocation candidate list --resource VGPU=1 "
        "--os-placement-api-version 1.12  # A100-20C"]
    notes = json.loads(results["capacity-notes"])
    assert len(notes) == 1 and notes[0].startswith("H200X-70C: Placement has no class for it")


def test_the_report_carries_a_units_live_migration_warnings():
    warned = READY._replace(warnings=("downtime far from what vGPU guests need",))
    results = fleet.report(peers(record(readiness=warned), record()))
    assert results["units"]["unit-0"]["live-migration-warnings"] == (
        "downtime far from what vGPU guests need")
    assert "live-migration-warnings" not in results["units"]["unit-1"]


def test_a_cut_record_is_said():
    found = peers(record(gpus=(H200,))._replace(gpu_count=20))
    assert fleet.inconsistencies(found) == [
        f"{unit(0)}'s record was cut: it lists 1 of its 20 GPUs"]


def test_nova_compute_with_live_migration_off_is_not_ready_even_from_an_older_record():
    assert fleet.blockers(record(readiness=READY._replace(live_migration=False))) == [
        "nova-compute has live migration off"]


# -- NVIDIA's verdict --------------------------------------------------------------------------

GUEST = drain.Guest("11111111-1111-4111-8111-111111111111", True, "nvidia-1200", "H200X-35C",
                    "0000:c1:00.0", "vfio", request=drain.TRUE)


def drain(*others, guests=(GUEST,), verdict=None, me=None):
    found = peers(me or record(host="gpu-0"), *others)
    results = drain_plan(unit(0), found, guests, verdict)
    return results, json.loads(results["plan"])


def nvidia_host(driver, board, vgpu_board=None):
    """One H200 as NVML describes it, with a running vGPU of GUEST's instance."""
    gpu = {"bus_id": "00000000:C1:00.0", "metadata": board, "vgpus": []}
    if vgpu_board:
        gpu["vgpus"] = [{"id": 3, "uuid": "u", "vm": GUEST.instance, "type": 1200, "licensed": 1,
                         "state": 5, "fb": 1, "metadata": vgpu_board}]
    fake.configure({"driver": driver, "gpus": [gpu]})


def test_nvidias_verdict_through_nvml():
    nvidia_host(OLD, "0x2335/141", vgpu_board="0x2335/141")
    mine = nvml.once(nvml.vgpu_metadata, fake)[GUEST.instance]
    same = nvml.once(nvml.gpu_metadata, fake)["0000:c1:00.0"]
    nvidia_host(OLD, "0x2335/94")
    other_board = nvml.once(nvml.gpu_metadata, fake)["0000:c1:00.0"]
    nvidia_host(NEW, "0x2335/141")
    other_driver = nvml.once(nvml.gpu_metadata, fake)["0000:c1:00.0"]
    assert len(__import__("base64").b64decode(same)) == ctypes.sizeof(fake.c_nvmlVgpuPgpuMetadata_t)
    verdict = lambda a, b: nvml.once(lambda m: nvml.compatibility(m, a, b), fake)  # noqa: E731
    assert verdict(mine, same) == nvml.VERDICT_LIVE
    assert verdict(mine, other_board) == verdict(mine, other_driver) == nvml.VERDICT_NONE
    assert verdict(mine, "not base64!") is None and verdict(mine, "QUJD") is None
    assert "nvmlGetVgpuCompatibility" in fake.calls()


def test_nvidias_verdict_overrules_the_rules_where_both_sides_gave_metadata():
    nvidia_host(OLD, "0x2335/141", vgpu_board="0x2335/141")
    mine = nvml.once(nvml.vgpu_metadata, fake)[GUEST.instance]
    nvidia_host(OLD, "0x2335/94")  # NVML knows a board the record does not tell apart
    refused = nvml.once(nvml.gpu_metadata, fake)["0000:c1:00.0"]

    def verdict(a, b):
        return nvml.once(lambda m: nvml.compatibility(m, a, b), fake)

    results, plan = drain(record(host="gpu-1", gpus=(H200._replace(metadata=refused),)),
                          guests=(GUEST._replace(metadata=mine),), verdict=verdict)
    assert plan["guests"][0]["move"] == "cold"  # no live destination; cold carries no state
    assert "NVIDIA's verdict: not live" in plan["guests"][0]["why"]
    # The same destination without NVML (no verdict): the rules take it live.
    _, plan = drain(record(host="gpu-1", gpus=(H200._replace(metadata=refused),)),
                    guests=(GUEST._replace(metadata=mine),))
    assert plan["guests"][0]["move"] == "live"
    assert plan["guests"][0]["destinations"] == [unit(1)]


def test_nvml_absent_gives_no_metadata():
    fake.configure({"driver": None})
    assert nvml.once(nvml.gpu_metadata, fake) is None
