"""The zaza functional tests (tests/) import, and tests.yaml names what exists.

zaza, zaza-openstack-tests and novaclient are not installed here (they need
a lab), so they are stand-in modules; what is checked is our code: the
modules import, every test class and configure step tests.yaml names is
there, every bundle exists, and the nova.conf helpers read what
nova-compute renders.
"""

import importlib
import sys
import types
import unittest
from pathlib import Path
from unittest import mock

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
STUBS = ("zaza", "zaza.model", "zaza.openstack", "zaza.openstack.charm_tests",
         "zaza.openstack.charm_tests.test_utils", "zaza.openstack.utilities",
         "zaza.openstack.utilities.generic", "zaza.openstack.utilities.openstack",
         "novaclient", "novaclient.client")


@pytest.fixture
def functional(monkeypatch):
    for name in STUBS:
        module = types.ModuleType(name)
        module.__getattr__ = lambda attr, _name=name: mock.MagicMock(name=f"{_name}.{attr}")
        monkeypatch.setitem(sys.modules, name, module)
    sys.modules["zaza.openstack.charm_tests.test_utils"].OpenStackBaseTest = unittest.TestCase
    for name in ("tests", "tests.vgpu_tests", "tests.vgpu_guest_tests"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.syspath_prepend(str(ROOT))
    return {name: importlib.import_module(f"tests.{name}")
            for name in ("vgpu_tests", "vgpu_guest_tests")}


def test_tests_yaml_names_what_exists(functional):
    spec = yaml.safe_load((TESTS / "tests.yaml").read_text())
    for dotted in spec["tests"] + spec["configure"]:
        if not dotted.startswith("tests."):
            continue  # zaza-openstack-tests' own steps
        _, module, name = dotted.split(".")
        assert hasattr(functional[module], name), dotted
    bundles = spec["gate_bundles"] + spec["smoke_bundles"] + spec.get("dev_bundles", [])
    for bundle in bundles:
        assert (TESTS / "bundles" / f"{bundle}.yaml").is_file(), bundle
    assert "noble-epoxy" in spec["gate_bundles"]


def test_the_epoxy_bundle_schedules_pci_aliases():
    bundle = yaml.safe_load((TESTS / "bundles" / "noble-epoxy.yaml").read_text())
    assert bundle["variables"]["openstack-origin"] == "cloud:noble-epoxy"
    filters = bundle["applications"]["nova-cloud-controller"]["options"]["scheduler-default-filters"]
    assert "PciPassthroughFilter" in filters.split(",")


VF_SPEC = ('{"vendor_id": "10de", "product_id": "2238", "address": "0000:81:00.%d", '
           '"managed": "no", "resource_class": "CUSTOM_VGPU_L40S_12Q"}')
NOVA_CONF = """[DEFAULT]
debug = True
[pci]
passthrough_whitelist = {"vendor_id": "15b3", "product_id": "101e", "physical_network": "p1"}
alias = {"name": "nic", "vendor_id": "15b3", "product_id": "101e"}
[libvirt]
virt_type = kvm
[pci]
device_spec = %s
device_spec = %s
report_in_placement = True
""" % (VF_SPEC % 4, VF_SPEC % 5)


def test_pci_entries_are_read_across_repeated_sections(functional):
    helpers = functional["vgpu_guest_tests"]
    specs = helpers.pci_device_specs(NOVA_CONF)
    assert [s.get("address") for s in specs] == [None, "0000:81:00.4", "0000:81:00.5"]
    assert specs[1]["managed"] == "no"
    assert helpers.pci_option(NOVA_CONF, "report_in_placement") == "True"
    assert helpers.pci_option(NOVA_CONF, "nothing") is None


def test_resource_class_follows_nova_normalisation(functional):
    helpers = functional["vgpu_guest_tests"]
    assert helpers.resource_class(helpers.profile_name("NVIDIA L40S-12Q")) == "CUSTOM_VGPU_L40S_12Q"
    assert helpers.resource_class("a100-20c") == "CUSTOM_VGPU_A100_20C"
