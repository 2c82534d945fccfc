"""vgpu.novaconf.check: the last guard before the relation, on plain sections.

The plan only builds what these checks accept; they are here for the day a
host (or a bug) hands over something else. Each refusal names the value, which
the charm shows as ``not publishing: <reason>``.
"""

import json

import pytest

from vgpu import novaconf

SPEC = {"vendor_id": "10de", "product_id": "26b9", "address": "0000:81:00.4",
        "managed": "no", "resource_class": "CUSTOM_VGPU_L40S_12Q"}


def pci(*pairs):
    return {"pci": [list(p) for p in pairs]}


def spec(**changes):
    return json.dumps({**SPEC, **changes}, sort_keys=True)


def test_what_the_plan_builds_passes():
    novaconf.check({"devices": [["enabled_mdev_types", "nvidia-105,nvidia-106"]],
                    "mdev_nvidia-105": [["device_addresses", "0000:41:00.4,0000:41:00.5"],
                                        ["mdev_class", "CUSTOM_VGPU_A100_10C"]],
                    **pci(["device_spec", spec()], ["report_in_placement", "True"])})


@pytest.mark.parametrize("value", [
    spec(vendor_id="15b3"),                       # another vendor's device
    spec(managed="yes"),                           # Nova would manage (rebind) the VF
    json.dumps({**SPEC, "physical_network": "physnet1"}),  # an extra key
    json.dumps({k: v for k, v in SPEC.items() if k != "managed"}),  # a missing key
    json.dumps(SPEC, indent=1),                    # valid JSON, but over several lines
])
def test_a_device_spec_other_than_the_one_built_is_refused(value):
    with pytest.raises(ValueError) as error:
        novaconf.check(pci(["device_spec", value]))
    assert str(error.value) == f"unexpected device_spec {value!r}"


@pytest.mark.parametrize("field,value", [
    ("address", "0000:81:00.4\n[DEFAULT]"), ("product_id", "26BA"),
    ("resource_class", "VGPU"),
])
def test_a_device_spec_field_nova_conf_must_not_get_is_refused(field, value):
    with pytest.raises(ValueError, match=f"^refusing {field} "):
        novaconf.check(pci(["device_spec", spec(**{field: value})]))


@pytest.mark.parametrize("address", ["00000001:c8:00.2", "00001:c8:00.2", "0001:C8:00.2", "1:c8:00.2"])
def test_only_sysfs_spelling_of_an_address_is_published(address):
    """Nova compares addresses as strings with libvirt's (0001:c8:00.2): any other spelling never matches."""
    with pytest.raises(ValueError, match=f"^refusing address '{address}' for nova.conf"):
        novaconf.check(pci(["device_spec", spec(address=address)]))
    for good in ("0001:c8:00.2", "10000:01:00.0"):  # a VMD domain above ffff keeps its digits
        novaconf.check(pci(["device_spec", spec(address=good)]))


@pytest.mark.parametrize("value", ["False", "true", "True\n[DEFAULT]"])
def test_report_in_placement_is_only_ever_true(value):
    with pytest.raises(ValueError) as error:
        novaconf.check(pci(["report_in_placement", value]))
    assert str(error.value) == f"unexpected report_in_placement {value!r}"


@pytest.mark.parametrize("sections,message", [
    ({"DEFAULT": [["debug", "True"]]}, "refusing section 'DEFAULT' for nova.conf"),
    ({"devices": [["debug", "True"]]}, "unexpected setting 'debug' in [devices]"),
    ({"devices": [["enabled_mdev_types", "nvidia-105,x"]]}, "refusing type 'x' for nova.conf"),
    ({"mdev_nvidia-105": [["device_addresses", "0000:41:00.4,41:00.5"]]},
     "refusing address '41:00.5' for nova.conf"),
    ({"mdev_nvidia-105": [["mdev_class", "CUSTOM_A\nB"]]},
     "refusing resource_class 'CUSTOM_A\\nB' for nova.conf"),
])
def test_anything_else_is_refused_by_name(sections, message):
    with pytest.raises(ValueError) as error:
        novaconf.check(sections)
    assert str(error.value) == message
