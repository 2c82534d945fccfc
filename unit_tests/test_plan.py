"""The plan: which function gets which type, for both NVIDIA frameworks, on fixture hosts."""

import json
import os
import re
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from unit_tests import principal
from unit_tests.fakehost import (
    A100_TYPES,
    L40S_BRANCHES,
    L40S_TYPES,
    FakeHost,
    MdevType,
    a100_host,
    h200_nvl_host,
    h200_sxm_host,
    l40s_branch_host,
    l40s_host,
    rtx_pro_6000_host,
    v100_host,
)
from vgpu import catalogue, mappings, novaconf, pci, plan, profiles, releases

CARACAL = releases.from_major(29)
EPOXY = releases.from_major(31)


def build(text, release=CARACAL, offered=None):
    checked = mappings.check_text(text)
    assert checked.ok, checked.errors
    return plan.build(checked.mapping, pci.discover(), release, offered)


def vfs(pf: str, count: int, first: int = 4):
    """The first ``count`` VF addresses of ``pf``, VF 0 at function ``first``."""
    return tuple(f"{pf[:-4]}{(first + n) // 8:02x}.{(first + n) % 8}" for n in range(count))


# -- selectors -----------------------------------------------------------------

@pytest.mark.parametrize("key", ["nvidia-474", "A100-10C", "GRID A100-10C", "grid a100-10c"])
def test_a_type_id_a_profile_and_the_drivers_name_select_the_same_type(root, key):
    a100_host(root)
    built = build(f"{{'{key}': ['41:00.0']}}")
    assert built.errors == ()
    # A100-10C fits 4 on a 40 GB A100: its first four VFs, in virtfn order.
    assert built.mdev_mapping() == {"nvidia-474": vfs("0000:41:00.0", 4)}


def test_a_vf_address_is_taken_as_given(root):
    a100_host(root)
    assert build("{A100-20C: ['41:01.1']}").mdev_mapping() == {"nvidia-475": ("0000:41:01.1",)}


def test_all_selects_every_gpu_offering_the_profile(root):
    a100_host(root, gpus=2)
    built = build("{A100-20C: all}")
    assert built.mdev_mapping() == {"nvidia-475": vfs("0000:41:00.0", 2) + vfs("0000:61:00.0", 2)}
    assert built.notes == ()


def test_all_on_a_host_without_such_a_gpu_publishes_nothing_and_says_so(root):
    v100_host(root)
    built = build("{L40S-12Q: all, nvidia-108: all}")
    assert built.errors == ()
    assert built.notes == ("L40S-12Q: no GPU on this host offers it, nothing published for it",)
    assert built.mdev_mapping() == {"nvidia-108": ("0000:c1:00.0", "0000:e1:00.0")}


def test_a_name_that_matches_nothing_is_named_with_what_the_gpu_offers(root):
    v100_host(root)
    assert build("{A100-20C: [c1:00.0]}").errors == (
        "A100-20C: 0000:c1:00.0 (Tesla V100 PCIe 16GB) offers no vGPU type of that name; it "
        "offers V100-1Q, V100-2Q, V100-4Q, V100-8Q and 1 more",)


def test_a_name_that_matches_two_types_is_refused_and_the_full_name_picks_one(root):
    host = FakeHost(root)
    host.add_gpu("0000:c1:00.0", mdev_types={"nvidia-475": MdevType("GRID A100-20C", 20480, 2),
                                             "nvidia-480": MdevType("NVIDIA A100-20C", 20480, 2)})
    assert build("{A100-20C: [c1:00.0]}").errors == (
        "A100-20C: names 2 types on 0000:c1:00.0 (NVIDIA 0x1db4): nvidia-475 (GRID A100-20C), "
        "nvidia-480 (NVIDIA A100-20C); use the type id or the full name",)
    assert build("{NVIDIA A100-20C: [c1:00.0]}").mdev_mapping() == {"nvidia-480": ("0000:c1:00.0",)}


def test_mig_backed_profiles_on_mediated_devices_are_refused_clearly(root):
    a100_host(root)
    for text in ("{A100-4-20C: ['41:00.0']}", "{nvidia-699: all}"):
        assert build(text).errors == (
            f"{'A100-4-20C' if 'A100' in text else 'nvidia-699'}: GRID A100-4-20C (nvidia-699) on "
            "0000:41:00.0 (A100 PCIe 40GB) is MIG-backed; this charm configures MIG-backed "
            "profiles on NVIDIA's vendor-specific VFIO framework only (Hopper, Blackwell)",)


def test_one_gpu_takes_one_profile(root):
    l40s_host(root)
    assert build("{L40S-12Q: [81:00.0], L40S-24Q: [81:00.6]}", EPOXY).errors == (
        "GPU 0000:81:00.0 (through 0000:81:00.6) is mapped to both L40S-12Q and L40S-24Q; a GPU "
        "takes one profile (mixed-size mode is not supported)",)


def test_more_vfs_than_the_type_fits_are_refused_at_the_boundary(root):
    a100_host(root)
    four, five = vfs("0000:41:00.0", 4), vfs("0000:41:00.0", 5)
    assert build(f"{{nvidia-474: {list(four)}}}").ok
    assert build(f"{{nvidia-474: {list(five)}}}").errors == (
        "nvidia-474: 5 virtual functions of GPU 0000:41:00.0 are mapped but the type fits 4 per GPU",)


# -- vendor-specific VFIO ----------------------------------------------------------

@pytest.mark.parametrize("key,gpu,count", [
    ("L40S-12Q", "0000:81:00.0", 4),    # 48 / 12
    ("L40S-16Q", "0000:81:00.0", 3),
    ("L40S-48Q", "0000:81:00.0", 1),
    ("L40S-2B", "0000:81:00.0", 16),    # 48 / 2 = 24 (the whole framebuffer, not the B
                                        # series' largest), capped by the 16 VFs enabled
    ("H200X-35C", "0000:c1:00.0", 4),   # 141 // 35
    ("H200X-18C", "0000:c1:00.0", 7),
])
def test_vfio_profiles_get_as_many_vfs_as_the_framebuffer_fits(root, key, gpu, count):
    l40s_host(root)
    built = build(f"{{{key}: all}}", EPOXY)
    assert built.errors == ()
    assert [a.address for a in built.vfio()] == list(vfs(gpu, count))
    first = built.vfio()[0]
    assert first.product_id == ("26b9" if gpu == "0000:81:00.0" else "2335")
    assert first.resource_class == "CUSTOM_VGPU_" + key.replace("-", "_")


def test_a_full_vfio_gpu_is_resolved_from_the_learnt_catalogue(root):
    host = l40s_host(root)
    table = catalogue.learn(pci.discover(), "570.158.02")
    for vf in vfs("0000:81:00.0", 4):
        (root / f"sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type").write_text("1139\n")
    found = pci.discover()
    assert found.gpus[0].offered_types() == ()  # full: no VF lists anything
    assert host.vfio_model("0000:81:00.0").total == 48
    offered = catalogue.offered(found, "570.158.02", table)
    checked = mappings.check_text("{L40S-12Q: all}")
    built = plan.build(checked.mapping, found, EPOXY, offered,
                       whole_gpus=catalogue.whole_gpus(found, table))
    assert [a.address for a in built.vfio()] == list(vfs("0000:81:00.0", 4))
    # Without what was learnt, the name cannot be resolved on the full GPU: the GPU may hold
    # it, so it is an error (the last published state stays), never "not offered here".
    built = plan.build(checked.mapping, found, EPOXY)
    assert built.notes == ()
    assert built.errors == (
        "L40S-12Q: cannot tell whether GPU 0000:81:00.0 (L40S) serves it: its VFs hold "
        "nvidia-1139, which no VF lists now (a full GPU lists nothing) and which was not learnt "
        "under this driver; release a VF no guest uses (write 0 to its nvidia/current_vgpu_type) "
        "to let the charm read the name",)


def test_resource_classes_are_distinct_per_profile_after_normalising():
    names = ["NVIDIA L40S-12Q", "NVIDIA L40S-24Q", "GRID A100-20C", "NVIDIA H200X-35C",
             "GRID A100-2-10C"]
    classes = [plan.resource_class(n) for n in names]
    assert classes == ["CUSTOM_VGPU_L40S_12Q", "CUSTOM_VGPU_L40S_24Q", "CUSTOM_VGPU_A100_20C",
                       "CUSTOM_VGPU_H200X_35C", "CUSTOM_VGPU_A100_2_10C"]
    assert len(set(classes)) == len(classes)


def test_profiles_that_would_collide_in_placement_are_refused(root):
    host = FakeHost(root)
    host.add_gpu("0000:c1:00.0", mdev_types={"nvidia-1": MdevType("GRID X-8Q", 8192, 2)})
    host.add_gpu("0000:e1:00.0", mdev_types={"nvidia-2": MdevType("GRID X 8Q", 8192, 2)})
    built = plan.build({"nvidia-1": ("0000:c1:00.0",), "nvidia-2": ("0000:e1:00.0",)},
                       pci.discover(), CARACAL)
    assert built.errors == ("profiles X 8Q, X-8Q would share Placement's resource class "
                            "CUSTOM_VGPU_X_8Q",)


def test_gpus_without_vfs_yet_are_named_not_guessed(root):
    a100_host(root, enabled=False)
    built = build("{A100-20C: all}")
    assert built.missing_vfs == ("0000:41:00.0",)
    assert built.assignments == ()


def test_a100_types_fixture_is_the_40gb_card():
    assert A100_TYPES["nvidia-474"].max_instance == 4


def test_a_held_type_never_seen_free_resolves_by_id_to_the_vfs_that_hold_it(root):
    l40s_host(root)
    for vf in vfs("0000:81:00.0", 4):
        (root / f"sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type").write_text("1139\n")
    found = pci.discover()
    offered = catalogue.offered(found, "570.158.02", {})  # nothing learnt
    checked = mappings.check_text("{nvidia-1139: ['81:00.0'], nvidia-1283: ['c1:00.0']}")
    built = plan.build(checked.mapping, found, EPOXY, offered)
    assert [a.address for a in built.vfio()] == list(vfs("0000:81:00.0", 4)) + \
        list(vfs("0000:c1:00.0", 2))  # the H200 is free: 141 // 70
    # Another id: whether the full GPU offers it cannot be told while its held type has no name.
    checked = mappings.check_text("{nvidia-1142: ['81:00.0']}")
    assert plan.build(checked.mapping, found, EPOXY, offered).errors[0].startswith(
        "nvidia-1142: cannot tell whether GPU 0000:81:00.0 (L40S) serves it: its VFs hold "
        "nvidia-1139, which no VF lists now")


@pytest.mark.parametrize("major,expected", [
    (23, "[vgpu_nvidia-475]\ndevice_addresses = 0000:41:00.4,0000:41:00.5\n"),
    (24, "[mdev_nvidia-475]\ndevice_addresses = 0000:41:00.4,0000:41:00.5\n"
         "mdev_class = CUSTOM_VGPU_A100_20C\n"),
])
def test_mdev_class_is_set_from_xena_on_only(root, major, expected):
    from unit_tests import principal
    from vgpu import novaconf
    a100_host(root)
    release = releases.from_major(major)
    built = build("{A100-20C: all}", release)
    sections = novaconf.plan_sections(built, release, mdev_class=True, keep_placement_reporting=False)
    conf = principal.render_nova_conf(principal.nova_context(novaconf.relation_data(sections)))
    assert conf.endswith(expected)


@pytest.mark.parametrize("field,value", [
    ("address", "0000:81:00.4\n[DEFAULT]"), ("address", "0000:81:00.4,0000:81:00.5"),
    ("product_id", "26b9\ndebug"), ("product_id", "26b9x"),
    ("framework", pci.MDEV),  # the same hostile-free assignment, but as an mdev with a bad address
])
def test_nothing_but_what_novaconf_builds_can_be_published(field, value):
    from vgpu import novaconf
    fields = {"gpu": "0000:81:00.0", "address": "0000:81:00.4", "number": 1139,
              "name": "NVIDIA L40S-12Q", "framework": pci.VFIO, "product_id": "26b9"}
    fields[field] = value
    if field == "framework":
        fields["address"] = "0000:81:00.4,0000:82:00.4"
    with pytest.raises(ValueError):
        novaconf.plan_sections(plan.Plan(assignments=(plan.Assignment(**fields),)),
                               releases.from_major(31), mdev_class=False,
                               keep_placement_reporting=False)


@pytest.mark.parametrize("name,alias,resource_class", [
    ("NVIDIA L40S-12Q", "vgpu-l40s-12q", "CUSTOM_VGPU_L40S_12Q"),
    ("NVIDIA RTX Pro 6000 Blackwell DC-24Q", "vgpu-rtx-pro-6000-blackwell-dc-24q",
     "CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_24Q"),
])
def test_names_with_spaces_give_a_pci_alias_and_class_nova_accepts(name, alias, resource_class):
    assert (plan.alias_name(name), plan.resource_class(name)) == (alias, resource_class)


def test_four_offered_types_are_all_named_without_a_more(root):
    host = FakeHost(root)
    host.add_gpu("0000:c1:00.0", mdev_types={
        f"nvidia-{n}": MdevType(f"GRID V100-{q}Q", q * 1024, 16 // q) for n, q in
        ((105, 1), (106, 2), (107, 4), (108, 8))})
    assert build("{nvidia-109: [c1:00.0]}").errors == (
        "nvidia-109: 0000:c1:00.0 (NVIDIA 0x1db4) does not offer nvidia-109; it offers "
        "nvidia-105, nvidia-106, nvidia-107, nvidia-108",)


# -- taking a type from a GPU while a guest holds one of its mdevs ----------------------

def test_what_a_new_mapping_takes_from_each_function(root):
    v100_host(root)
    host = pci.discover()
    c1, e1 = "0000:c1:00.0", "0000:e1:00.0"
    published = {"nvidia-108": (c1,), "nvidia-109": (e1,), "CUSTOM_VGPU_L40S_12Q": ("x",)}
    assert plan.removed_mdev_types(published, published, host) == {}
    assert plan.removed_mdev_types(published, {"nvidia-108": (c1, e1)}, host) == {
        e1: ("nvidia-109",)}
    assert plan.removed_mdev_types(published, {"nvidia-109": (c1,)}, host) == {
        c1: ("nvidia-108",), e1: ("nvidia-109",)}
    assert plan.removed_mdev_types(published, {}, host) == {c1: ("nvidia-108",), e1: ("nvidia-109",)}
    assert plan.removed_mdev_types({}, {"nvidia-109": (c1,)}, host) == {}
    # Queens to Train: a type without addresses serves every function offering it.
    assert plan.removed_mdev_types({"nvidia-108": ()}, {"nvidia-108": (c1,)}, host) == {
        e1: ("nvidia-108",)}
    assert plan.removed_mdev_types({"nvidia-108": (c1,)}, {"nvidia-108": ()}, host) == {}


def held(name, uuid, parent, type_id, state="shut off", problem=""):
    from vgpu import guests
    guest = guests.Guest(name, "" if problem else "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1",
                         (), state, "" if problem else f"vm-{name}", problem)
    return guests.HeldMdev(guest, uuid, parent, type_id)


MDEV = "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f"


def test_a_guest_holding_an_mdev_of_a_type_taken_from_its_gpu_is_a_conflict(root):
    a100_host(root)
    host = pci.discover()
    vf = vfs("0000:41:00.0", 1)[0]
    removed = {vf: ("nvidia-474",)}
    assert plan.mdev_conflicts(removed, [held("instance-1", MDEV, vf, "nvidia-474")], host) == [
        "instance-1 (vm-instance-1, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1, shut off) holds an "
        f"nvidia-474 mdev ({MDEV}) on VF {vf} of GPU 0000:41:00.0, which the new mapping takes "
        "away"]
    # Another type, another function, another vendor's device: no conflict.
    assert plan.mdev_conflicts(removed, [held("i", MDEV, vf, "nvidia-475"),
                                         held("i", MDEV, vfs("0000:41:00.0", 1, 5)[0], "nvidia-474"),
                                         held("i", MDEV, "0000:00:02.0", "i915-GVTg_V5_4")],
                               host) == []
    # Nothing taken: nothing is a conflict, not even what cannot be known.
    unknown = [held("instance-2", MDEV, None, None), held("/etc/libvirt/qemu/x.xml", "", None,
                                                           None, problem="not XML: oops")]
    assert plan.mdev_conflicts({}, unknown, host) == []
    assert plan.mdev_conflicts(removed, unknown, host) == [
        "instance-2 (vm-instance-2, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1, shut off) holds mdev "
        f"{MDEV}, which is not on this host now: its GPU and type are unknown",
        "/etc/libvirt/qemu/x.xml (not XML: oops; counted as in use)"]


def test_an_mdev_on_a_whole_gpu_names_the_gpu(root):
    v100_host(root)
    found = plan.mdev_conflicts({"0000:c1:00.0": ("nvidia-108",)},
                                [held("instance-1", MDEV, "0000:c1:00.0", "nvidia-108", "running")],
                                pci.discover())
    assert found == ["instance-1 (vm-instance-1, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1) holds an "
                     f"nvidia-108 mdev ({MDEV}) on GPU 0000:c1:00.0, which the new mapping takes away"]


def test_a_type_without_addresses_serves_the_vfs_offering_it(root):
    a100_host(root)
    host = pci.discover()
    first, second = vfs("0000:41:00.0", 2)
    taken = plan.removed_mdev_types({"nvidia-474": ()}, {"nvidia-474": (first,)}, host)
    assert second in taken and first not in taken
    assert taken[second] == ("nvidia-474",)
    assert len(taken) == 15  # the other VFs; the A100 itself offers no type


# -- what the options ask of Nova (plain inputs) ---------------------------------------------

def vfio_on(gpu, name, product_id, number=1):
    return plan.Assignment(gpu=gpu, address=gpu[:-1] + "4", number=number, name=name,
                           framework=pci.VFIO, product_id=product_id)


TWO_L40S = (vfio_on("0000:81:00.0", "NVIDIA L40S-12Q", "26b9", 1139),
            vfio_on("0000:82:00.0", "NVIDIA L40S-24Q", "26b9", 1142))


def test_two_profiles_on_one_vf_product_id_are_refused_without_pci_in_placement():
    assert plan.option_problems(TWO_L40S, EPOXY, pci_in_placement=False, live_migration=False) == [
        "profiles L40S-12Q, L40S-24Q share VF product id 26b9, which a PCI alias by vendor and "
        "product id cannot tell apart: map one profile per GPU model or set pci-in-placement=true"]
    assert plan.option_problems(TWO_L40S, EPOXY, pci_in_placement=True, live_migration=False) == []


@pytest.mark.parametrize("assignments", [
    TWO_L40S[:1] + (vfio_on("0000:82:00.0", "NVIDIA L40S-12Q", "26b9", 1139),),  # one profile
    TWO_L40S[:1] + (vfio_on("0000:c1:00.0", "NVIDIA H200X-35C", "2335", 1282),),  # two models
    TWO_L40S[:1] + (plan.Assignment("0000:41:00.0", "0000:41:00.4", 475, "GRID A100-20C",
                                    pci.MDEV, "26b9"),),  # mdev: Placement's classes tell them apart
])
def test_one_profile_per_vf_product_id_needs_no_placement(assignments):
    assert plan.option_problems(assignments, EPOXY, pci_in_placement=False,
                                live_migration=False) == []


@pytest.mark.parametrize("major,problems", [
    (30, ["vfio-live-migration needs Nova 31 (2025.1 epoxy) or later; this host runs 2024.2 "
          "dalmatian (Nova 30): upgrade Nova or set vfio-live-migration=false"]),
    (31, []),
])
def test_live_migration_needs_the_first_nova_that_takes_live_migratable(major, problems):
    release = releases.from_major(major)
    assert plan.option_problems((), release, pci_in_placement=True, live_migration=True) == problems
    assert plan.option_problems((), release, pci_in_placement=True, live_migration=False) == []
    assert plan.option_problems((), None, pci_in_placement=True, live_migration=True) == []


def test_the_options_reach_the_plans_errors(root):
    host = FakeHost(root)
    host.pci_ids()
    for pf in ("0000:81:00.0", "0000:82:00.0"):
        host.add_sriov_gpu(pf, device="0x26b9", vf_device="0x26b9", count=4,
                           vfio_types=L40S_TYPES, totalvfs=32)
    mapping = {"L40S-12Q": ("0000:81:00.0",), "L40S-24Q": ("0000:82:00.0",)}
    refused = plan.build(mapping, pci.discover(), EPOXY)
    assert refused.errors == ("profiles L40S-12Q, L40S-24Q share VF product id 26b9, which a PCI "
                              "alias by vendor and product id cannot tell apart: map one profile "
                              "per GPU model or set pci-in-placement=true",)
    assert plan.build(mapping, pci.discover(), EPOXY, pci_in_placement=True).errors == ()
    old = releases.from_major(29)
    assert plan.build({}, pci.discover(), old, live_migration=True).errors == (
        "vfio-live-migration needs Nova 31 (2025.1 epoxy) or later; this host runs 2024.1 caracal "
        "(Nova 29): upgrade Nova or set vfio-live-migration=false",)


# -- hosts as public transcripts show them -------------------------------------------------

DC_8Q = "NVIDIA RTX Pro 6000 Blackwell DC-8Q"


def type_id(name, table):
    return next(f"nvidia-{n}" for n, t in table.items() if t == name)


@pytest.mark.parametrize("key", [
    "id", DC_8Q, "RTX Pro 6000 Blackwell DC-8Q", "nvidia rtx pro 6000 blackwell dc-8q", "DC-8Q",
])
def test_every_name_form_selects_the_same_rtx_pro_6000_type(root, key):
    from unit_tests.fakehost import RTX_PRO_6000_TYPES
    rtx_pro_6000_host(root, vfs=16)
    key = type_id(DC_8Q, RTX_PRO_6000_TYPES) if key == "id" else key
    built = build(f"{{'{key}': ['00000001:C8:00.0']}}", EPOXY)
    assert built.errors == ()
    # 96 GB / 8 GB = 12 VFs from function .2 on; the GPU's own id; sysfs's address form.
    assert [a.address for a in built.vfio()] == list(vfs("0001:c8:00.0", 12, first=2))
    assert {(a.name, a.product_id, a.resource_class) for a in built.vfio()} == {
        (DC_8Q, "2bb5", "CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_8Q")}


def test_a_short_form_two_types_share_is_refused_with_both_and_the_full_name_picks_one(root):
    host = FakeHost(root)
    host.add_sriov_gpu("0000:42:00.0", device="0x2bb5", vf_device="0x2bb5", count=4,
                       vfio_types={2002: DC_8Q, 3002: "NVIDIA RTX Pro 4500 Blackwell DC-8Q"},
                       first_function=2)
    assert build("{DC-8Q: all}", EPOXY).errors == (
        "DC-8Q: names 2 types on 0000:42:00.0 (NVIDIA 0x2bb5): "
        f"nvidia-2002 ({DC_8Q}), nvidia-3002 (NVIDIA RTX Pro 4500 Blackwell DC-8Q); "
        "use the type id or the full name",)
    assert {a.number for a in build(f"{{'{DC_8Q}': all}}", EPOXY).vfio()} == {2002}
    assert {a.number for a in build("{RTX Pro 4500 Blackwell DC-8Q: all}", EPOXY).vfio()} == {3002}


@pytest.mark.parametrize("key", ["nvidia-1712", "RTX6000-Ada-12Q", "NVIDIA RTX6000-Ada-12Q"])
def test_a_model_with_hyphens_is_a_profile_by_id_and_by_name(root, key):
    """NVIDIA's docs spell RTX6000-Ada-12Q: its size is read, so the VFs it fits are counted."""
    host = FakeHost(root)
    # RTX 6000 Ada (48 GB); the ids and the device id are the fixture's own.
    host.add_sriov_gpu("0000:61:00.0", device="0x26b1", vf_device="0x26b1", count=8,
                       vfio_types={1710: "NVIDIA RTX6000-Ada-4Q", 1712: "NVIDIA RTX6000-Ada-12Q",
                                   1715: "NVIDIA RTX6000-Ada-48Q"})
    built = build(f"{{'{key}': all}}", EPOXY)
    assert built.errors == ()
    assert [a.address for a in built.vfio()] == list(vfs("0000:61:00.0", 4))  # 48 / 12


def test_a_vfio_type_whose_name_is_no_profile_says_so(root):
    host = FakeHost(root)
    host.add_sriov_gpu("0000:61:00.0", device="0x26b1", vf_device="0x26b1", count=4,
                       vfio_types={1710: "NVIDIA RTX6000-Ada-4Q", 1799: "NVIDIA Custom Profile"})
    assert build("{nvidia-1799: all}", EPOXY).errors == (
        "nvidia-1799: cannot tell how many VFs of GPU 0000:61:00.0 (NVIDIA 0x26b1) nvidia-1799 "
        "fits: its name NVIDIA Custom Profile does not read as a profile "
        "(<model>-<GB><series>, like L40S-12Q)",)


@pytest.mark.parametrize("branch,number", [("570", 1139), ("550", 1153)])
def test_a_mapping_by_name_resolves_on_either_driver_branch(root, branch, number):
    """L40S-12Q is 1139 on one branch and 1153 on another: the name finds each."""
    l40s_branch_host(root, branch)
    built = build("{L40S-12Q: all}", EPOXY)
    assert built.errors == ()
    assert {(a.number, a.product_id, a.resource_class) for a in built.vfio()} == {
        (number, "26b9", "CUSTOM_VGPU_L40S_12Q")}
    assert [a.address for a in built.vfio()] == list(vfs("0000:26:00.0", 4))
    # The id of the other branch is not offered here.
    other = 1153 if number == 1139 else 1139
    assert build(f"{{nvidia-{other}: all}}", EPOXY).notes == (
        f"nvidia-{other}: no GPU on this host offers it, nothing published for it",)
    assert len(L40S_BRANCHES) == 2


def test_published_rtx_pro_6000_addresses_are_sysfs_names_as_nova_derives_them(root):
    """What Nova compares: libvirt's pci_0001_c8_00_2 read as 0001:c8:00.2 (driver.py)."""
    rtx_pro_6000_host(root)
    built = build("{DC-2Q: ['00000001:C8:00.0', '0000:42:00.0']}", EPOXY)
    assert built.errors == ()
    sections = novaconf.plan_sections(built, EPOXY, mdev_class=False, keep_placement_reporting=False)
    specs = [json.loads(v) for k, v in
             principal.nova_context(novaconf.relation_data(sections))["sections"]["pci"]
             if k == "device_spec"]
    addresses = [s["address"] for s in specs]
    # DC-2Q fits 48: every VF of both GPUs, none of the others.
    assert addresses == list(vfs("0000:42:00.0", 48, first=2)) + list(vfs("0001:c8:00.0", 48, 2))
    sysfs = set(os.listdir(root / "sys/bus/pci/devices"))
    assert set(addresses) <= sysfs
    libvirt_names = {"pci_" + a.replace(":", "_").replace(".", "_") for a in sysfs}
    assert set(addresses) <= {"{}:{}:{}.{}".format(*n[4:].split("_")) for n in libvirt_names}
    assert {s["product_id"] for s in specs} == {"2bb5"}


@pytest.mark.parametrize("make,key,count", [
    (h200_sxm_host, "H200X-35C", 4),   # 141 // 35
    (h200_nvl_host, "H200-4C", 32),    # 141 // 4 = 35, capped by the 32 VFs
])
def test_h200_sxm_and_nvl_profiles(root, make, key, count):
    make(root)
    built = build(f"{{{key}: all}}", EPOXY)
    assert built.errors == ()
    gpu = pci.discover().gpus[0]
    assert [a.address for a in built.vfio() if a.gpu == gpu.address] == [
        vf.address for vf in gpu.vfs[:count]]
    assert {a.product_id for a in built.vfio()} == {gpu.device_id[2:]}
    # The other family's name is no type of this GPU.
    other = "H200-35C" if key.startswith("H200X") else "H200X-35C"
    assert build(f"{{{other}: all}}", EPOXY).notes == (
        f"{other}: no GPU on this host offers it, nothing published for it",)


# -- MIG-backed profiles (vendor-specific VFIO) ---------------------------------------------

H200_A, H200_B = "0000:18:00.0", "0000:2a:00.0"


def mig_build(text, pci_in_placement=True):
    """The plan after the GPU instances the mapping needs were created, as the charm does.

    A VF lists a MIG-backed type only where a GPU instance has room for it (see
    vgpu.miginstances.mapped). Several profiles of one model tell apart only by resource
    class: pci-in-placement on.
    """
    from vgpu import mig, miginstances

    checked = mappings.check_text(text)
    assert checked.ok, checked.errors
    for need in miginstances.mapped(checked.mapping, pci.discover()).values():
        if mig.modes([need.gpu])[need.gpu].enabled:
            miginstances.ensure(need)
    return plan.build(checked.mapping, pci.discover(), EPOXY, pci_in_placement=pci_in_placement)


def test_mig_backed_profiles_take_as_many_vfs_as_the_profile_fits(root):
    h200_sxm_host(root, mig="Enabled")  # 8 VFs per GPU
    one = mig_build("{H200X-1-18C: [18:00.0], H200X-3-71C: [2a:00.0]}")
    assert one.errors == ()
    assert [a.address for a in one.assignments if a.gpu == H200_A] == list(vfs(H200_A, 7))
    assert [a.address for a in one.assignments if a.gpu == H200_B] == list(vfs(H200_B, 2))
    assert {a.resource_class for a in one.assignments} == {"CUSTOM_VGPU_H200X_1_18C",
                                                           "CUSTOM_VGPU_H200X_3_71C"}
    assert len(mig_build("{NVIDIA H200X-7-141C: all}").assignments) == 2  # one per GPU


def test_a_gpu_serves_time_sliced_or_mig_backed_profiles_never_both(root):
    h200_sxm_host(root, mig="Disabled")  # out of MIG mode, the fixture lists both kinds
    for text, timed in (("{H200X-18C: [18:00.0], H200X-1-18C: [18:00.5]}", "H200X-18C"),
                        ("{H200X-1-18C: [18:00.4], H200X-35C: [18:00.0]}", "H200X-35C")):
        assert mig_build(text).errors == (
            f"GPU 0000:18:00.0 is mapped to both time-sliced {timed} and MIG-backed H200X-1-18C: "
            "one GPU serves either time-sliced or MIG-backed profiles, never both",)


def one_per_gpu(gpu, model, names):
    return (f"GPU {gpu} ({model}) is mapped to MIG-backed {names}: one MIG-backed profile per "
            "GPU. Nova gives all VFs of one GPU one resource class in Placement (two stop "
            "nova-compute: PlacementPciMixedResourceClassException) and, without "
            "pci-in-placement, cannot tell VFs of one product id apart; map one of them")


@pytest.mark.parametrize("placement", [True, False])
def test_two_mig_backed_profiles_on_one_gpu_are_refused_with_or_without_placement(root, placement):
    """Nova: all VFs of one PF share one resource class; without Placement one product id."""
    h200_sxm_host(root, mig="Enabled")
    a, b, c = vfs(H200_A, 3)
    refused = mig_build(f"{{H200X-1-18C: ['{a}', '{b}'], H200X-2-35C: ['{c}']}}", placement)
    assert one_per_gpu(H200_A, "H200 SXM 141GB", "H200X-1-18C, H200X-2-35C") in refused.errors
    assert refused.assignments == ()
    whole = mig_build(f"{{H200X-4-71C: [18:00.0], H200X-3-71C: ['{vfs(H200_A, 6)[5]}']}}",
                      placement)
    assert one_per_gpu(H200_A, "H200 SXM 141GB", "H200X-3-71C, H200X-4-71C") in whole.errors
    # One profile on each GPU is fine with Placement, each GPU its own class.
    assert mig_build("{H200X-1-18C: [18:00.0], H200X-2-35C: [2a:00.0]}").errors == ()


def test_mig_backed_counts_are_kept(root):
    h200_sxm_host(root, mig="Enabled")
    assert mig_build(f"{{H200X-3-71C: {list(vfs(H200_A, 3))}}}").errors == (
        "H200X-3-71C: 3 virtual functions of GPU 0000:18:00.0 are mapped but H200X-3-71C fits 2 "
        "per GPU (2 x 3g.71gb GPU instances, 1 each)",)
    first = vfs(H200_A, 1)[0]
    assert one_per_gpu(H200_A, "H200 SXM 141GB", "H200X-1-18C, H200X-2-35C") in mig_build(
        f"{{H200X-1-18C: ['{first}'], H200X-2-35C: ['{first}']}}").errors


def test_mig_backed_on_the_rtx_pro_6000_by_nvidia_names(root):
    rtx_pro_6000_host(root, vfs=16, gpus=1, mig="Enabled")
    gpu = "0000:42:00.0"
    first = vfs(gpu, 4, first=2)
    whole = mig_build("{DC-1-24Q: [42:00.0]}")
    assert [a.address for a in whole.assignments] == list(first)
    shared = mig_build(f"{{DC-1-24Q: ['{first[0]}', '{first[1]}'], "
                   f"'NVIDIA RTX Pro 6000 Blackwell DC-2-48Q': ['{first[2]}']}}")
    assert shared.assignments == () and len(shared.errors) == 1
    assert len(mig_build("{DC-1-8Q: all}").assignments) == 12  # 3 per 1g.24gb, 4 instances


def test_mig_backed_profiles_need_a_table_for_the_gpu_model(root):
    host = h200_sxm_host(root, mig="Enabled", vfs=2)
    # The same types on a model the charm has no MIG geometry for (device id changed).
    for address in ("0000:18:00.0", "0000:2a:00.0"):
        (host.bus / address / "device").resolve().write_text("0x2342\n")
    assert mig_build("{H200X-1-18C: [18:00.0]}").errors == (
        "GPU 0000:18:00.0 (NVIDIA 0x2342, device 0x2342): the charm has no MIG table for this "
        "model, so MIG-backed H200X-1-18C cannot be counted",)


# -- counts on a partly used VFIO GPU ---------------------------------------------------

def hold(root, addresses, number):
    for vf in addresses:
        (root / f"sys/bus/pci/devices/{vf}/nvidia/current_vgpu_type").write_text(f"{number}\n")


def test_counts_on_a_partly_used_gpu_come_from_the_profile_not_from_what_is_left(root):
    """Two VFs hold L40S-12Q: the others list only 12 GB types now, yet the GPU holds four."""
    l40s_host(root)
    hold(root, vfs("0000:81:00.0", 2), 1139)
    found = pci.discover()
    assert {t.profile.framebuffer_gb for t in found.gpus[0].offered_types()} == {12}
    table = catalogue.learn(found, "570.158.02", {})  # no catalogue before: learnt now
    checked = mappings.check_text("{L40S-12Q: all, nvidia-1282: ['c1:00.0']}")
    built = plan.build(checked.mapping, found, EPOXY, catalogue.offered(found, "570.158.02", table),
                       whole_gpus=catalogue.whole_gpus(found, table))
    assert built.errors == ()
    assert [a.address for a in built.vfio() if a.gpu == "0000:81:00.0"] == \
        list(vfs("0000:81:00.0", 4))
    assert len([a for a in built.vfio() if a.gpu == "0000:c1:00.0"]) == 4  # 141 // 35


def test_a_partly_used_gpu_of_a_model_never_seen_free_is_not_counted(root):
    """No record, no size known for the model: no count from a partly used GPU's lists."""
    host = FakeHost(root)
    host.add_sriov_gpu("0000:61:00.0", device="0x26b1", vf_device="0x26b1", count=8,
                       vfio_types={1710: "NVIDIA RTX6000-Ada-4Q", 1712: "NVIDIA RTX6000-Ada-12Q",
                                   1715: "NVIDIA RTX6000-Ada-48Q"})
    hold(root, vfs("0000:61:00.0", 1), 1712)
    found = pci.discover()
    checked = mappings.check_text("{RTX6000-Ada-12Q: all}")
    built = plan.build(checked.mapping, found, EPOXY, catalogue.offered(found, "1", {}),
                       whole_gpus=catalogue.whole_gpus(found, {}))
    assert built.errors == (
        "RTX6000-Ada-12Q: cannot tell how many VFs of GPU 0000:61:00.0 (NVIDIA 0x26b1) "
        "nvidia-1712 fits: its VFs hold vGPUs, so they list only what fits beside them, and the "
        "whole GPU's framebuffer was never seen (its VFs were never all free while the charm "
        "looked); nothing is changed until they are",)
    # Seen free once (the record the catalogue keeps for the model), it is counted again.
    hold(root, vfs("0000:61:00.0", 1), 0)
    table = catalogue.learn(pci.discover(), "1", {})
    assert table["0x26b1 whole GPU"] == {"framebuffer-gb": "48"}
    hold(root, vfs("0000:61:00.0", 1), 1712)
    found = pci.discover()
    built = plan.build(checked.mapping, found, EPOXY, catalogue.offered(found, "1", table),
                       whole_gpus=catalogue.whole_gpus(found, table))
    assert [a.address for a in built.vfio()] == list(vfs("0000:61:00.0", 4))


# -- GPUs that vanished after they were published ----------------------------------------

@pytest.mark.parametrize("vanished,errors", [
    (("0000:e1:00.0",), ()),  # the GPU itself, as published (mdev)
    (("0000:e1:00.4", "0000:e1:00.5"), ()),  # its VFs, as published (VFIO): same bus
    (("0000:a1:00.0",), ("nvidia-109: 0000:e1:00.0 is not an NVIDIA GPU on this host (found: "
                         "0000:c1:00.0)",)),  # another GPU's: the address is still a mistake
])
def test_an_address_of_a_vanished_published_gpu_is_no_error_and_gets_nothing(
        root, vanished, errors):
    v100_host(root, count=1)
    checked = mappings.check_text("{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}")
    built = plan.build(checked.mapping, pci.discover(), CARACAL, vanished=vanished)
    assert built.errors == errors
    assert built.mdev_mapping() == {"nvidia-108": ("0000:c1:00.0",)}  # nothing for 0000:e1:00.0


def test_same_gpu_groups_functions_by_bus():
    functions = ["0000:c1:00.5", "0000:c1:00.4", "0000:c1:01.0", "0001:c1:00.4", "0000:c2:00.4"]
    assert plan.same_gpu(functions, ["0000:c1:00.0"]) == ("0000:c1:00.4", "0000:c1:00.5",
                                                         "0000:c1:01.0")
    assert plan.same_gpu(functions, []) == ()


# -- passthrough: whole GPUs beside vGPUs (issue 37) ----------------------------------------

def build_whole(text, release=EPOXY, **options):
    checked = mappings.check_text(text)
    assert checked.ok, checked.errors
    return plan.build(checked.mapping, pci.discover(), release, passthrough=checked.passthrough,
                      **options)


def test_a_whole_gpu_gets_no_vf_and_no_type_and_is_nova_s_type_pf(root):
    l40s_host(root)
    built = build_whole("{L40S-12Q: [81:00.0], passthrough: [c1:00.0]}")
    assert built.errors == ()
    assert {a.gpu for a in built.assignments} == {"0000:81:00.0"}
    whole, = built.passthrough
    # The H200 is SR-IOV-capable: libvirt gives it virt_functions, so Nova calls it type-PF.
    assert (whole.address, whole.product_id, whole.device_type) == ("0000:c1:00.0", "2335", "type-PF")
    assert whole.alias_name.startswith("gpu-h200") and whole.resource_class.startswith("CUSTOM_GPU_H200")


def test_a_gpu_without_sriov_given_whole_is_type_pci(root):
    v100_host(root)
    built = build_whole("{passthrough: [c1:00.0]}", release=CARACAL)
    assert built.errors == ()
    assert [w.device_type for w in built.passthrough] == ["type-PCI"]


def test_all_never_takes_a_whole_gpu(root):
    host = v100_host(root)
    host.bind("0000:e1:00.0", "vfio-pci")  # given whole: no mdev types under vfio-pci
    shutil.rmtree(root / "sys/bus/pci/devices/0000:e1:00.0/mdev_supported_types")
    built = build_whole("{nvidia-108: all, passthrough: [e1:00.0]}", release=CARACAL)
    assert built.errors == ()
    assert built.mdev_mapping() == {"nvidia-108": ("0000:c1:00.0",)}


@pytest.mark.parametrize("key,address", [("L40S-12Q", "c1:00.0"), ("L40S-12Q", "c1:00.5"),
                                         ("H200-18C", "c1:00.0")])
def test_a_gpu_both_whole_and_under_a_type_is_refused_naming_it(root, key, address):
    l40s_host(root)
    checked = mappings.check_text(f"{{'{key}': ['{address}'], passthrough: [c1:00.0]}}")
    built = plan.build(checked.mapping, pci.discover(), EPOXY, passthrough=checked.passthrough)
    assert any("GPU 0000:c1:00.0" in e and "both whole (passthrough)" in e for e in built.errors), \
        built.errors


def test_a_vf_or_a_stranger_is_refused_as_a_whole_gpu(root):
    l40s_host(root)
    built = build_whole("{passthrough: [c1:00.4, 99:00.0]}")
    assert any("0000:c1:00.4 is a virtual function of GPU 0000:c1:00.0" in e for e in built.errors)
    assert any("0000:99:00.0 is not an NVIDIA GPU on this host" in e for e in built.errors)


@pytest.mark.parametrize("major,placement,refusal", [
    (32, False, "needs pci-in-placement=true"),
    (31, True, "needs Nova 32"),
    (32, True, None),
])
def test_one_time_use_needs_nova_32_and_placement(root, major, placement, refusal):
    l40s_host(root)
    built = build_whole("{passthrough: [c1:00.0]}", release=releases.from_major(major),
                        pci_in_placement=placement, one_time_use=True)
    if refusal is None:
        assert built.errors == ()
    else:
        assert any(refusal in e for e in built.errors), built.errors


# -- typos under `all` (issue 41, item 5) ---------------------------------------

@pytest.mark.parametrize("name, board", [
    ("L40S-12Q", "L40S"), ("L40-12Q", "L40"), ("NVIDIA L40S-12Q", "L40S"),
    ("H200X-1-18C", "H200X"), ("A100-4C", "A100"), ("A100D-4C", "A100D"),
    ("GRID A100-1-5CME", "A100"), ("RTX6000-Ada-12Q", "RTX6000-ADA"),
    ("NVIDIA RTX PRO 6000 Blackwell DC-4-24C", "DC"), ("nvidia-1139", None), ("L40S", None),
])
def test_a_names_board_is_the_part_before_its_profile(name, board):
    assert plan.board(name) == board


def test_a_name_of_this_boards_that_it_never_offers_is_refused_under_all(root):
    a100_host(root)
    built = build("{A100-99C: all}")
    assert len(built.errors) == 1
    assert "A100-99C" in built.errors[0] and "A100-20C" in built.errors[0]  # what it offers
    assert built.notes == ()


@pytest.mark.parametrize("key", ["A100D-4C", "L40S-12Q", "A100X-4C"])
def test_another_boards_name_under_all_is_a_note_so_a_mixed_fleets_mapping_applies(root, key):
    a100_host(root)
    built = build(f"{{A100-20C: all, {key}: all}}")
    assert built.errors == ()
    assert built.notes == (f"{key}: no GPU on this host offers it, nothing published for it",)
    assert built.mdev_mapping()


def test_l40_is_not_the_l40s_board(root):
    l40s_host(root)
    assert build("{L40-12Q: all}").errors == ()
    assert "L40S-99Q" in " ".join(build("{L40S-99Q: all}").errors)


def test_a_name_a_newer_driver_offers_on_this_board_is_refused_naming_that_driver(root):
    l40s_host(root)
    checked = mappings.check_text("{L40S-99Q: all}")
    built = plan.build(checked.mapping, pci.discover(), CARACAL,
                       other_drivers={"0000:81:00.0": {"L40S-99Q": "595.10"}})
    assert len(built.errors) == 1
    assert "595.10" in built.errors[0] and "L40S-99Q" in built.errors[0]


@given(st.text(max_size=30))
def test_a_resource_class_keeps_ascii_capitals_and_digits_and_underscores_the_rest(name):
    """Placement's normal form: CUSTOM_ and [A-Z0-9_] only, whatever the driver's name holds."""
    short = profiles.profile_name(name).upper()
    assert plan.resource_class(name) == "CUSTOM_VGPU_" + re.sub(r"[^A-Z0-9]", "_", short)
