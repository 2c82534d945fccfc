"""list-vgpu-types' flavor properties and [pci] aliases, per framework and option."""

import json

import pytest

from unit_tests.fakehost import a100_host, l40s_host
from unit_tests.test_readme import nova_aliases
from vgpu import pci, report


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
