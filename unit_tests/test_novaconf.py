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


@pytest.mark.parametrize("address", ["00000001:c8:00.2", "00001:c8:00.2", "0001:C8:00.2", "1:c8:00.2",
                                     "10000:01:00.0"])
def test_only_sysfs_spelling_of_an_address_is_published(address):
    """Nova compares addresses as strings with libvirt's (0001:c8:00.2): any other spelling never matches.

    A domain above ffff (VMD) is refused too: Nova's PciAddressGlobSpec
    refuses it and device_addresses needs a four-digit domain
    (``pci_utils.parse_address``); nova-compute would not start.
    """
    with pytest.raises(ValueError, match=f"^refusing address '{address}' for nova.conf"):
        novaconf.check(pci(["device_spec", spec(address=address)]))
    with pytest.raises(ValueError, match=f"^refusing address '{address}' for nova.conf"):
        novaconf.check({"devices": [["enabled_mdev_types", "nvidia-108"]],
                        "mdev_nvidia-108": [["device_addresses", address]]})
    novaconf.check(pci(["device_spec", spec(address="0001:c8:00.2")]))


@pytest.mark.nova
@pytest.mark.parametrize("address,nova", [("0000:81:00.4", True), ("ffff:01:00.0", True),
                                          ("10000:01:00.0", False), ("1000000:01:00.0", False)])
def test_novas_own_address_rules_agree(address, nova):
    """Nova's parse_address (device_addresses) and PciAddressGlobSpec (device_spec)."""
    from nova import exception
    from nova.pci import devspec, utils

    try:
        utils.parse_address(address)
        devspec.PciAddressGlobSpec(address)
        accepted = True
    except (exception.PciDeviceWrongAddressFormat, exception.PciConfigInvalidSpec):
        accepted = False
    assert accepted is nova
    assert novaconf.nova_addressable(address) is nova


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


# -- what a vanished GPU keeps, and what forget-gpus drops ---------------------------------

C1, E1, A1 = "0000:c1:00.0", "0000:e1:00.0", "0000:a1:00.0"
CLASS_108 = ["mdev_class", "CUSTOM_VGPU_V100_8Q"]


def mdev(option="enabled_mdev_types", prefix="mdev_", **types):
    """``[devices]`` and one section per type: ``nvidia_108=[C1]`` -> nvidia-108 on C1."""
    out = {"devices": [[option, ",".join(t.replace("_", "-") for t in types)]]}
    for name, addresses in types.items():
        out[f"{prefix}{name.replace('_', '-')}"] = [["device_addresses", ",".join(addresses)]]
    return out


def test_a_kept_address_joins_its_type_in_address_order():
    merged = novaconf.keep_published(mdev(nvidia_108=[E1]), mdev(nvidia_108=[C1, E1]), [C1])
    assert merged == mdev(nvidia_108=[C1, E1])


def test_a_kept_type_comes_back_as_published_with_its_class_and_types_by_number():
    published = mdev(nvidia_108=[C1, E1])
    published["mdev_nvidia-108"].append(CLASS_108)
    merged = novaconf.keep_published(mdev(nvidia_1000=[C1]), published, [E1])
    assert merged == {"devices": [["enabled_mdev_types", "nvidia-108,nvidia-1000"]],
                      "mdev_nvidia-108": [["device_addresses", E1], CLASS_108],
                      "mdev_nvidia-1000": [["device_addresses", C1]]}


def test_the_older_spelling_is_kept_in_the_new_sections_spelling():
    old = dict(option="enabled_vgpu_types", prefix="vgpu_")
    merged = novaconf.keep_published(mdev(**old, nvidia_109=[C1]), mdev(**old, nvidia_108=[E1]),
                                     [E1])
    assert merged == mdev(**old, nvidia_108=[E1], nvidia_109=[C1])
    only_kept = novaconf.keep_published({}, mdev(**old, nvidia_108=[E1]), [E1])
    assert only_kept == mdev(**old, nvidia_108=[E1])


def test_nothing_to_keep_leaves_the_new_sections_alone():
    new = mdev(nvidia_109=[C1])
    assert novaconf.keep_published(new, mdev(nvidia_108=[C1, E1]), []) is new
    assert novaconf.keep_published(new, mdev(nvidia_108=[C1]), [E1]) == new


def test_an_address_under_two_types_is_refused():
    with pytest.raises(ValueError, match="0000:c1:00.0 would be under both nvidia-109 and nvidia-108"):
        novaconf.keep_published(mdev(nvidia_109=[C1]), mdev(nvidia_108=[C1]), [C1])


def test_kept_device_specs_stay_verbatim_in_address_order_before_reporting():
    kept = [spec(address="0000:c1:00.4", product_id="2335", resource_class="CUSTOM_VGPU_H200X_35C"),
            spec(address="0000:c1:00.5", product_id="2335", resource_class="CUSTOM_VGPU_H200X_35C")]
    new = pci(["device_spec", spec(address="0000:81:00.4")], ["device_spec", spec(address="0000:e1:00.4")],
              ["report_in_placement", "True"])
    published = pci(["device_spec", spec(address="0000:81:00.5")], *(["device_spec", v] for v in kept))
    merged = novaconf.keep_published(new, published, ["0000:c1:00.4", "0000:c1:00.5"])
    assert merged == pci(["device_spec", spec(address="0000:81:00.4")], *(["device_spec", v] for v in kept),
                         ["device_spec", spec(address="0000:e1:00.4")], ["report_in_placement", "True"])
    assert novaconf.keep_published({}, published, ["0000:c1:00.4"]) == pci(["device_spec", kept[0]])


def test_two_device_specs_for_one_address_are_refused():
    with pytest.raises(ValueError, match="two device specs for 0000:81:00.4"):
        novaconf.keep_published(pci(["device_spec", spec()]), pci(["device_spec", spec()]),
                                ["0000:81:00.4"])


def test_drop_takes_addresses_specs_and_emptied_types_but_keeps_reporting():
    published = {**mdev(nvidia_108=[C1, E1], nvidia_109=[A1]),
                 **pci(["device_spec", spec()], ["device_spec", spec(address="0000:e1:00.4")],
                       ["report_in_placement", "True"])}
    published["mdev_nvidia-108"].append(CLASS_108)
    dropped = novaconf.drop_published(published, [E1, A1, "0000:81:00.4"])
    assert dropped == {"devices": [["enabled_mdev_types", "nvidia-108"]],
                       "mdev_nvidia-108": [["device_addresses", C1], CLASS_108],
                       **pci(["device_spec", spec(address="0000:e1:00.4")],
                             ["report_in_placement", "True"])}
    assert novaconf.drop_published(mdev(nvidia_108=[C1]), [C1]) == {}
    assert novaconf.drop_published(pci(["device_spec", spec()]), ["0000:81:00.4"]) == {}


def test_device_classes_name_each_published_vf_and_skip_what_is_no_spec():
    spec = ('{"address": "0000:81:00.4", "managed": "no", "product_id": "26b5", '
            '"resource_class": "CUSTOM_VGPU_L40S_12Q", "vendor_id": "10de"}')
    sections = {"pci": [["device_spec", spec], ["device_spec", "{not json"],
                        ["device_spec", '{"address": "0000:81:00.5"}'],
                        ["report_in_placement", "True"]]}
    assert novaconf.device_classes(sections) == {"0000:81:00.4": "CUSTOM_VGPU_L40S_12Q"}
    assert novaconf.device_classes({}) == {}


def test_sections_the_upstream_charm_published_read_as_nova_reads_them():
    """It joined the types with ", " (oslo.config strips list items; so must this reading)."""
    from unit_tests import upstream

    published = upstream.sections({"nvidia-35": ["0000:84:00.0"],
                                   "nvidia-36": ["0000:85:00.0", "0000:86:00.0"]})
    assert published["devices"] == [["enabled_mdev_types", "nvidia-35, nvidia-36"]]
    assert novaconf.mapping_from_sections(published) == {
        "nvidia-35": ("0000:84:00.0",), "nvidia-36": ("0000:85:00.0", "0000:86:00.0")}
    kept = novaconf.keep_published({}, published, ["0000:85:00.0"])
    assert kept == {"devices": [["enabled_mdev_types", "nvidia-36"]],
                    "mdev_nvidia-36": [["device_addresses", "0000:85:00.0"]]}
    assert novaconf.drop_published(published, ["0000:84:00.0"]) == {
        "devices": [["enabled_mdev_types", "nvidia-36"]],
        "mdev_nvidia-36": [["device_addresses", "0000:85:00.0,0000:86:00.0"]]}


@pytest.mark.parametrize("value", [
    json.dumps({**SPEC, "one_time_use": "true"}),  # a VF is never one-time-use (Nova refuses it)
    json.dumps({k: v for k, v in {**SPEC, "resource_class": "CUSTOM_GPU_H200"}.items()
                if k != "address"}),  # a whole GPU always by its address
    json.dumps({**SPEC, "resource_class": "CUSTOM_GPU_H200", "one_time_use": "false"}),
    json.dumps({**SPEC, "resource_class": "CUSTOM_GPU_H200", "live_migratable": "yes"}),
])
def test_a_whole_gpu_spec_other_than_the_one_built_is_refused(value):
    with pytest.raises(ValueError, match="unexpected device_spec"):
        novaconf.check(pci(["device_spec", value]))
