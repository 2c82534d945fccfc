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
                    **pci(["device_spec", spec()], ["device_spec", spec(live_migratable="yes")],
                          ["report_in_placement", "True"])})


@pytest.mark.parametrize("value", [
    spec(vendor_id="15b3"),                       # another vendor's device
    spec(managed="yes"),                           # Nova would manage (rebind) the VF
    json.dumps({**SPEC, "physical_network": "physnet1"}),  # an extra key
    json.dumps({k: v for k, v in SPEC.items() if k != "managed"}),  # a missing key
    json.dumps({k: v for k, v in SPEC.items() if k != "resource_class"}),
    spec(live_migratable="no"), spec(live_migratable="true"),  # only ever "yes"
    json.dumps({**SPEC, "live_migratable": "yes", "traits": "X"}),  # the new key and another
    json.dumps(SPEC, indent=1),                    # valid JSON, but over several lines
])
def test_a_device_spec_other_than_the_one_built_is_refused(value):
    with pytest.raises(ValueError) as error:
        novaconf.check(pci(["device_spec", value]))
    assert str(error.value) == f"unexpected device_spec {value!r}"


@pytest.mark.parametrize("field,value", [
    ("address", "0000:81:00.4\n[DEFAULT]"), ("product_id", "26B9"),
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


# -- device_spec, alias and the relation's services ------------------------------------

def assignment(name="NVIDIA L40S-12Q", product_id="26b9"):
    from vgpu import pci, plan
    return plan.Assignment(gpu="0000:81:00.0", address="0000:81:00.4", number=1139, name=name,
                           framework=pci.VFIO, product_id=product_id)


def test_device_spec_gets_live_migratable_only_when_asked():
    assert json.loads(novaconf.device_spec(assignment())) == SPEC
    assert json.loads(novaconf.device_spec(assignment(), live_migratable=True)) == {
        **SPEC, "live_migratable": "yes"}


@pytest.mark.parametrize("live,placement,extra", [
    (False, False, {}),
    (True, False, {"live_migratable": "yes"}),
    (False, True, {"resource_class": "CUSTOM_VGPU_L40S_12Q"}),
    (True, True, {"live_migratable": "yes", "resource_class": "CUSTOM_VGPU_L40S_12Q"}),
])
def test_alias_by_vendor_and_product_with_what_the_options_add(live, placement, extra):
    made = novaconf.alias("NVIDIA L40S-12Q", "26b9", live_migratable=live,
                          pci_in_placement=placement)
    assert made == {"name": "vgpu-l40s-12q", "vendor_id": "10de", "product_id": "26b9",
                    "device_type": "type-VF", **extra}


@pytest.mark.parametrize("product_id", ["26B9", "0x26b9", "26b9\n[DEFAULT]", ""])
def test_alias_refuses_a_product_id_nova_conf_must_not_get(product_id):
    with pytest.raises(ValueError, match="^refusing product_id "):
        novaconf.alias("NVIDIA L40S-12Q", product_id)


def test_no_service_is_ever_published_and_nova_compute_reads_none():
    from unit_tests import principal
    data = novaconf.relation_data({}, packages=["nvidia-vgpu-ubuntu-570"])
    assert data["services"] == "[]"
    assert principal.services(data) == set()
    assert principal.release_packages(data).install == {"nvidia-vgpu-ubuntu-570"}


# -- plan_sections: when report_in_placement is published --------------------------------

def sections_for(assignments, **options):
    from vgpu import plan, releases
    return novaconf.plan_sections(plan.Plan(assignments=tuple(assignments)),
                                  releases.from_major(31), mdev_class=False, **options)


@pytest.mark.parametrize("vfs,options,report", [
    ([assignment()], {}, False),                                 # the default: never
    ([assignment()], {"pci_in_placement": True}, True),
    ([], {"pci_in_placement": True}, False),  # no VF: the principal's own devices stay out of it
    ([assignment()], {"keep_placement_reporting": True}, True),  # published before: kept
    ([], {"keep_placement_reporting": True}, True),              # even with no VF left
])
def test_report_in_placement_only_with_the_option_or_once_published(vfs, options, report):
    out = sections_for(vfs, **options)
    assert novaconf.reports_in_placement(out) is report
    assert [k for k, _ in out.get("pci", [])] == ["device_spec"] * len(vfs) + \
        ["report_in_placement"] * report


def test_live_migratable_reaches_every_spec_and_needs_epoxy():
    from vgpu import plan, releases
    out = sections_for([assignment()], live_migratable=True)
    assert json.loads(out["pci"][0][1])["live_migratable"] == "yes"
    with pytest.raises(ValueError, match=r"^2024\.2 dalmatian \(Nova 30\) does not take "):
        novaconf.plan_sections(plan.Plan(), releases.from_major(30), mdev_class=False,
                               live_migratable=True)
