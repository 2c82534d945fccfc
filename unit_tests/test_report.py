"""list-vgpu-types' flavor properties and [pci] aliases, per framework and option."""

import json

import pytest

from unit_tests.fakehost import L40S_TYPES, a100_host, l40s_host, rtx_pro_6000_host
from unit_tests.libvirt import running_guest
from unit_tests.test_readme import nova_aliases
from vgpu import pci, plan, profiles, report


@pytest.fixture
def vfio_host(root):
    l40s_host(root)
    return pci.with_available(pci.discover())


def l40s_12q(results):
    return results["gpu-0"]["types"]["nvidia-1139"]


def test_a_vfio_alias_asks_by_ids_for_a_vf(vfio_host):
    entry = l40s_12q(report.gpu_results(vfio_host))
    assert entry["flavor-property"] == "pci_passthrough:alias=vgpu-l40s-12q:1"
    assert json.loads(entry["pci-alias"]) == {
        "name": "vgpu-l40s-12q", "device_type": "type-VF", "vendor_id": "10de",
        "product_id": "26b9"}  # the VF's own id (on an L40S the GPU's too)
    # What nova-compute 32+ accepts at start, without pci_in_placement on its host.
    nova_aliases([entry["pci-alias"]], pci_in_placement=False)


def test_with_pci_in_placement_the_alias_adds_the_profiles_class(vfio_host):
    entry = l40s_12q(report.gpu_results(vfio_host, pci_in_placement=True))
    alias = json.loads(entry["pci-alias"])
    assert alias["resource_class"] == entry["resource-class"] == "CUSTOM_VGPU_L40S_12Q"
    assert (alias["vendor_id"], alias["product_id"]) == ("10de", "26b9")  # ids stay
    for in_placement in (False, True):  # the computes have no pci_in_placement; controllers do
        nova_aliases([entry["pci-alias"]], pci_in_placement=in_placement)


def test_with_vfio_live_migration_the_alias_asks_for_a_migratable_vf(vfio_host):
    plain = json.loads(l40s_12q(report.gpu_results(vfio_host))["pci-alias"])
    entry = l40s_12q(report.gpu_results(vfio_host, live_migration=True))
    assert json.loads(entry["pci-alias"]) == {**plain, "live_migratable": "yes"}
    assert nova_aliases([entry["pci-alias"]])["vgpu-l40s-12q"][1][0]["live_migratable"] == "yes"


def test_mdev_types_ask_placement_and_need_no_alias(root):
    a100_host(root)
    host = pci.with_available(pci.discover())
    entry = report.gpu_results(host, pci_in_placement=True)["gpu-0"]["types"]["nvidia-475"]
    assert entry["flavor-property"] == "resources:VGPU=1"
    assert "pci-alias" not in entry and "resource-class" not in entry
    entry = report.gpu_results(host, mdev_class=True)["gpu-0"]["types"]["nvidia-475"]
    assert entry["flavor-property"] == "resources:CUSTOM_VGPU_A100_20C=1"
    assert entry["resource-class"] == "CUSTOM_VGPU_A100_20C"
    text = report.types_table(host, mdev_class=True)
    assert "[pci] alias" not in text
    row = next(line for line in text.splitlines() if " nvidia-475 " in line)
    assert row.endswith("  resources:CUSTOM_VGPU_A100_20C=1")


def test_the_table_gives_each_row_its_flavor_and_each_vfio_type_its_alias(vfio_host):
    text = report.types_table(vfio_host, pci_in_placement=True)
    rows, _, aliases = text.partition("\n\n")
    row = next(line for line in rows.splitlines() if " nvidia-1139 " in line)
    assert row.endswith("  pci_passthrough:alias=vgpu-l40s-12q:1")
    lines = aliases.splitlines()
    assert lines[0] == ("[pci] alias of each VFIO type "
                        "(nova-cloud-controller and nova-compute pci-alias):")
    shown = [json.loads(line) for line in lines[1:]]
    assert len(shown) == len({a["name"] for a in shown}) == 11  # 6 L40S, 5 H200 types
    assert {"name": "vgpu-l40s-12q", "device_type": "type-VF", "vendor_id": "10de",
            "product_id": "26b9", "resource_class": "CUSTOM_VGPU_L40S_12Q"} in shown
    nova_aliases(lines[1:], pci_in_placement=False)


def test_aliases_under_the_table_are_bounded(vfio_host, monkeypatch):
    monkeypatch.setattr(report, "ALIASES_SHOWN", 3)
    lines = report.types_table(vfio_host).split("\n\n")[1].splitlines()
    assert len(lines) == 1 + 3 + 1
    assert lines[-1] == "  ... and 8 more; see pci-alias in the nested results"


# -- GPUs grouped by what they offer; counts of VFIO types; types the mapping refuses ---------

RTX = ("0000:42:00.0", "0000:8c:00.0", "0001:04:00.0", "0001:c8:00.0")


def test_gpus_that_offer_the_same_types_are_one_entry_naming_every_address(root):
    rtx_pro_6000_host(root, vfs=8)
    results = report.gpu_results(pci.with_available(pci.discover()))
    assert list(results) == ["gpu-0"]
    assert results["gpu-0"]["addresses"] == ",".join(RTX)
    assert results["gpu-0"]["virtual-functions"].split(",")[8:10] == ["0000:8c:00.2", "0000:8c:00.3"]
    assert len(results["gpu-0"]["types"]) == 15
    text = report.types_table(pci.with_available(pci.discover()))
    rows = text.splitlines()[1:16]
    assert all(row.split()[0] == ",".join(RTX) for row in rows)  # every GPU, on every row
    assert len(text.split("\n\n")[0].splitlines()) == 1 + 15  # one row per type, not per GPU


def test_gpus_whose_counts_differ_are_entries_of_their_own(root):
    rtx_pro_6000_host(root, vfs=8)
    held = root / "sys/bus/pci/devices/0001:04:00.2/nvidia/current_vgpu_type"
    held.write_text("2003\n")  # DC-12Q on one VF: that GPU has less room now
    results = report.gpu_results(pci.with_available(pci.discover()), whole_gb={a: 96 for a in RTX})
    assert [g["addresses"] for g in results.values()] == [
        "0000:42:00.0,0000:8c:00.0,0001:c8:00.0", "0001:04:00.0"]
    assert results["gpu-0"]["types"]["nvidia-2003"]["available-instances"] == "8"
    # The VF that holds DC-12Q is free: a new guest could get it, beside the seven that fit.
    assert results["gpu-1"]["types"]["nvidia-2003"]["available-instances"] == "8"
    running_guest(root, "instance-00000040", "11111111-1111-4111-8111-111111111111",
                  pci_address="0001:04:00.2")
    results = report.gpu_results(pci.with_available(pci.discover()), whole_gb={a: 96 for a in RTX})
    assert results["gpu-1"]["types"]["nvidia-2003"]["available-instances"] == "7"


def test_vfio_time_sliced_types_count_from_the_profile(vfio_host):
    results = report.gpu_results(vfio_host)
    types = results["gpu-0"]["types"]
    # 48 GB: four L40S-12Q, one L40S-48Q, 16 VFs free; 141 GB: seven H200X-18C on 8 VFs.
    assert (types["nvidia-1139"]["max-instances"], types["nvidia-1139"]["available-instances"]) == (
        "4", "4")
    assert (types["nvidia-1142"]["max-instances"], types["nvidia-1142"]["available-instances"]) == (
        "1", "1")
    assert results["gpu-1"]["types"]["nvidia-1281"]["max-instances"] == "7"
    row = next(line for line in report.types_table(vfio_host).splitlines() if " nvidia-1139 " in line)
    assert row.split()[-3:] == ["4", "4", "pci_passthrough:alias=vgpu-l40s-12q:1"]


def test_a_partly_used_vfio_gpu_counts_from_its_whole_framebuffer(root):
    l40s_host(root)
    (root / "sys/bus/pci/devices/0000:81:00.4/nvidia/current_vgpu_type").write_text("1139\n")
    found = pci.with_available(pci.discover())
    # What the charm learnt while the VFs were free (vgpu.catalogue): every L40S type.
    offered = {"0000:81:00.0": tuple(pci.VgpuType(n, name, pci.VFIO)
                                     for n, name in sorted(L40S_TYPES.items()))}
    types = report.gpu_results(found, offered, whole_gb={"0000:81:00.0": 48})["gpu-0"]["types"]
    # The VF that holds 12Q is free (a new guest could get it), and three more fit.
    assert (types["nvidia-1139"]["max-instances"], types["nvidia-1139"]["available-instances"]) == (
        "4", "4")
    assert types["nvidia-1140"]["available-instances"] == "0"  # another size: none beside 12Q
    running_guest(root, "instance-00000040", "11111111-1111-4111-8111-111111111111",
                  pci_address="0000:81:00.4")
    types = report.gpu_results(found, offered, whole_gb={"0000:81:00.0": 48})["gpu-0"]["types"]
    assert types["nvidia-1139"]["available-instances"] == "3"  # a guest holds it now
    # Without the whole GPU's size a partly used GPU's VFs cannot tell: no count is guessed.
    unknown = report.gpu_results(found, offered)["gpu-0"]["types"]["nvidia-1139"]
    assert "max-instances" not in unknown and "available-instances" not in unknown


def test_a_type_the_mapping_refuses_is_offered_no_flavor(root):
    a100_host(root)
    host = pci.with_available(pci.discover())
    refused = plan.build({"A100-4-20C": ["all"]}, host).errors
    for mdev_class in (False, True):
        entry = report.gpu_results(host, mdev_class=mdev_class)["gpu-0"]["types"]["nvidia-699"]
        assert "flavor-property" not in entry and "resource-class" not in entry
        assert refused == (f"A100-4-20C: GRID A100-4-20C (nvidia-699) on 0000:41:00.0 "
                           f"(A100 PCIe 40GB) is {entry['refused']}",)
        row = next(line for line in report.types_table(host, mdev_class=mdev_class).splitlines()
                   if " nvidia-699 " in line)
        assert "resources:" not in row and row.endswith("none (the mapping refuses it)")


def test_an_a100_with_mdevs_on_vfs_counts_what_its_vfs_hold_against_the_type(root):
    """A100-20C fits two: one held on a VF leaves one, though every free VF still lists one."""
    from unit_tests.fakehost import a100_host

    host_tree = a100_host(root, vfs=4)
    host_tree.add_mdev("0000:41:00.5", "nvidia-475", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1")
    running_guest(root, "instance-00000040", "11111111-1111-4111-8111-111111111111",
                  mdev_uuid="0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1")
    host = pci.with_available(pci.discover())
    free = [vf for vf in host.gpus[0].vfs if vf.address != "0000:41:00.5"]
    assert {t.available_instances for vf in free for t in vf.types if t.id == "nvidia-475"} == {1}
    entry = report.gpu_results(host)["gpu-0"]["types"]["nvidia-475"]
    assert (entry["max-instances"], entry["available-instances"]) == ("2", "1")
    # An idle mdev fills the GPU: nothing more can be created, and Nova hands the idle one out.
    host_tree.add_mdev("0000:41:00.6", "nvidia-475", "1b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1")
    entry = report.gpu_results(pci.with_available(pci.discover()))["gpu-0"]["types"]["nvidia-475"]
    assert entry["available-instances"] == "1"
    running_guest(root, "instance-00000041", "22222222-2222-4222-8222-222222222222",
                  mdev_uuid="1b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1")
    entry = report.gpu_results(pci.with_available(pci.discover()))["gpu-0"]["types"]["nvidia-475"]
    assert entry["available-instances"] == "0"


def test_an_unreadable_mdev_count_is_not_guessed_below_what_the_vfs_list(root):
    from unit_tests.fakehost import a100_host

    a100_host(root, vfs=4)
    bus = root / "sys/bus/mdev/devices"
    bus.mkdir(parents=True, exist_ok=True)
    bus.rmdir()
    bus.write_text("")  # the mdev bus cannot be listed: which mdevs exist is unknown
    entry = report.gpu_results(pci.with_available(pci.discover()))["gpu-0"]["types"]["nvidia-475"]
    assert entry["available-instances"] == "2"  # what the type fits, not less, not the 4 VFs


# -- several mdev types behind one resource class ----------------------------------------------

V100_TWO = {"nvidia-108": ("0000:c1:00.0",), "nvidia-109": ("0000:e1:00.0",)}


def _v100(root):
    from unit_tests.fakehost import v100_host

    v100_host(root)
    return pci.with_available(pci.discover())


def _published(mapping, major=29, mdev_class=False):
    from vgpu import novaconf, releases

    out = novaconf.sections(mapping, releases.from_major(major))
    if mdev_class:
        for vgpu_type, name in (("nvidia-108", "GRID V100-8Q"), ("nvidia-109", "GRID V100-16Q")):
            if vgpu_type in mapping:
                out[f"mdev_{vgpu_type}"].append(["mdev_class", novaconf.resource_class(name)])
    return out


def _row(text, type_id):
    return next(line for line in text.splitlines() if f" {type_id} " in line)


def test_two_mdev_types_published_as_vgpu_are_flagged_where_their_flavor_is_printed(root):
    host = _v100(root)
    published = _published(V100_TWO)
    text = report.types_table(host, published=published)
    # The hint alone would let Placement hand either type to the flavor: the row says so...
    for type_id in ("nvidia-108", "nvidia-109"):
        assert _row(text, type_id).endswith("  resources:VGPU=1 (shared: see below)")
    assert _row(text, "nvidia-107").endswith("  resources:VGPU=1")  # not published: no flavor yet
    # ...and under the table, what to do about it.
    note = ("nvidia-108, nvidia-109 are published with one resource class, VGPU: a flavor "
            "with resources:VGPU=1 may get either. Give each type's resource providers a trait "
            "and require it in the flavor (trait:CUSTOM_<NAME>=required), or set "
            "mdev-class-per-profile=true and ask for resources:CUSTOM_VGPU_<PROFILE>=1")
    assert text.endswith("\n\n" + note)
    types = report.gpu_results(host, published=published)["gpu-0"]["types"]
    assert types["nvidia-108"]["flavor-note"] == types["nvidia-109"]["flavor-note"] == note
    assert "flavor-note" not in types["nvidia-107"]


@pytest.mark.parametrize("published", [
    _published(V100_TWO, mdev_class=True),  # a class per profile: Placement tells them apart
    _published({"nvidia-108": V100_TWO["nvidia-108"]}),  # one type
    {},  # nothing published yet
], ids=["mdev-class-per-profile", "one-type", "none"])
def test_types_with_classes_of_their_own_need_no_note(root, published):
    host = _v100(root)
    text = report.types_table(host, published=published)
    assert "shared" not in text and "trait" not in text
    assert all("flavor-note" not in entry
               for entry in report.gpu_results(host, published=published)["gpu-0"]["types"].values())


def test_before_xena_every_published_type_is_vgpu(root):
    host = _v100(root)
    ussuri = _published(V100_TWO, major=21)  # enabled_vgpu_types, [vgpu_<type>]: no mdev_class
    assert "enabled_vgpu_types" in json.dumps(ussuri)
    assert _row(report.types_table(host, published=ussuri), "nvidia-109").endswith(
        "(shared: see below)")


# -- issue 37: whole GPUs, and several vGPUs in one instance ---------------------------------

def test_a_whole_gpu_shows_its_alias_and_flavor_property(root):
    from unit_tests.fakehost import whole_and_vgpu_host

    whole_and_vgpu_host(root)
    host = pci.with_available(pci.discover())
    results = report.gpu_results(host, whole=("0000:c1:00.0",))
    whole = next(g for g in results.values() if g["addresses"] == "0000:c1:00.0")
    assert whole["device-type"] == "type-PF" and "types" not in whole
    alias = json.loads(whole["pci-alias"])
    assert whole["flavor-property"] == f"pci_passthrough:alias={alias['name']}:1"
    assert (alias["product_id"], alias["device_type"]) == ("2335", "type-PF")
    nova_aliases([whole["pci-alias"]], pci_in_placement=False)
    text = report.types_table(host, whole=("0000:c1:00.0",))
    assert f"pci_passthrough:alias={alias['name']}:1" in text and whole["pci-alias"] in text
    assert "[pci] alias of each VFIO type and whole GPU" in text


def test_max_per_instance_and_the_flavor_for_two(vfio_host):
    multi = report.Multi(nova_major=31, fractional={"0000:81:00.0": True})
    results = report.gpu_results(vfio_host, multi=multi)
    types = results["gpu-0"]["types"]
    # Fractional L40S-12Q on a GPU that says Fractional Multi-vGPU: Supported: its 4 VFs.
    assert types["nvidia-1139"]["max-per-instance"] == "4"
    assert types["nvidia-1139"]["flavor-property-for-two"] == "pci_passthrough:alias=vgpu-l40s-12q:2"
    # Without that line (the H200 here): one time-sliced vGPU per instance; a single
    # full-framebuffer GPU: one. Its MIG-backed vGPU for Compute types: one per GPU instance
    # (NVIDIA AI Enterprise 8.1, "Multi-vGPU"), as many as the GPU holds of the type.
    h200 = {e["name"]: e for e in results["gpu-1"]["types"].values() if "flavor-property" in e}
    mig = {name for name in h200 if profiles.mig_profile(name) is not None}
    assert mig and {h200[n]["max-per-instance"] for n in h200 if n not in mig} == {"1"}
    assert all("flavor-property-for-two" not in h200[n] for n in h200 if n not in mig)
    assert {n: h200[n]["max-per-instance"] for n in mig} == {
        n: h200[n]["max-instances"] for n in mig}
    assert all(h200[n]["flavor-property-for-two"].endswith(":2") for n in mig
               if h200[n]["max-instances"] != "1")
    table = report.types_table(vfio_host, multi=multi)
    assert "pci_passthrough:alias=vgpu-l40s-12q:2" in table
    # NVML's answer wins over NVIDIA's rules.
    per_vm = report.Multi(nova_major=31, per_vm={1139: 1}, fractional={"0000:81:00.0": True})
    assert report.gpu_results(vfio_host, multi=per_vm)["gpu-0"]["types"]["nvidia-1139"][
        "max-per-instance"] == "1"


@pytest.mark.parametrize("major,expected", [(32, "1"), (33, "2")])
def test_two_mdev_vgpus_need_nova_33(root, major, expected):
    from unit_tests.fakehost import v100_host

    v100_host(root)
    host = pci.with_available(pci.discover())
    results = report.gpu_results(host, multi=report.Multi(nova_major=major))
    full = next(e for e in results["gpu-0"]["types"].values() if e.get("max-instances") == "1")
    assert full["max-per-instance"] == expected  # a full-framebuffer type: one per GPU, 2 GPUs
    if expected == "2":
        assert full["flavor-property-for-two"] == "resources1:VGPU=1 resources2:VGPU=1 group_policy=isolate"


def test_max_per_instance_counts_only_the_gpus_mapped_to_the_type(root):
    """Issue 41, item 6: a full-framebuffer type mapped to one of two V100s: one per instance."""
    from unit_tests.fakehost import v100_host
    from vgpu import novaconf, releases

    v100_host(root)
    host = pci.with_available(pci.discover())
    multi = report.Multi(nova_major=33)
    every = report.gpu_results(host, multi=multi)
    full_id, full = next((t, e) for t, e in every["gpu-0"]["types"].items()
                         if e.get("max-instances") == "1")
    assert full["max-per-instance"] == "2"  # unmapped: what mapping it on both would give
    published = novaconf.sections({full_id: ("0000:c1:00.0",)}, releases.from_major(33))
    one = report.gpu_results(host, multi=multi, published=published)
    entries = [g["types"][full_id] for g in one.values() if full_id in g.get("types", {})]
    assert {e["max-per-instance"] for e in entries} == {"1"}
    assert all("flavor-property-for-two" not in e for e in entries)


def test_isolate_only_where_each_vgpu_must_come_from_another_gpu_and_the_flavor_says_why(root):
    """group_policy=isolate only for a full-framebuffer type; the flavor says why (issue 41).

    Nova's vGPU guide asks for isolate to take each vGPU from a distinct GPU; NVIDIA
    puts a full-framebuffer type one per GPU. Fractional vGPUs may share their GPU
    (Fractional Multi-vGPU): Placement then needs group_policy=none.
    """
    from unit_tests.fakehost import v100_host

    v100_host(root)
    host = pci.with_available(pci.discover())
    fractional = {g.address: True for g in host.gpus}
    results = report.gpu_results(host, multi=report.Multi(nova_major=33, fractional=fractional))
    types = results["gpu-0"]["types"].values()
    full = next(e for e in types if e.get("max-instances") == "1")
    assert full["flavor-property-for-two"].endswith("group_policy=isolate")
    assert "distinct GPU" in full["flavor-note-for-two"]
    part = next(e for e in types if e.get("max-instances") not in (None, "1")
                and "flavor-property-for-two" in e)
    assert part["flavor-property-for-two"].endswith("group_policy=none")
    assert "same GPU" in part["flavor-note-for-two"]
    table = report.types_table(host, multi=report.Multi(nova_major=33, fractional=fractional))
    assert part["flavor-property-for-two"] in table and full["flavor-property-for-two"] in table
