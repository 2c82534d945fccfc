"""The [pci] entries the charm publishes, under Nova's own rules.

Nova itself is too heavy for the unit-test environment (about 400 MB and
2.5 minutes to install, 9 s to import), so:

* nova.conf is parsed by oslo.config, the library Nova reads it with, with
  Nova's option definitions for ``[pci]`` (``device_spec`` is a MultiStrOpt
  whose old name is ``passthrough_whitelist``; ``report_in_placement`` a
  BoolOpt), on a file rendered the way charm-nova-compute renders it: its
  own ``[pci]`` first, then each subordinate section;
* resource classes are normalised by os-resource-classes, the library Nova's
  ``pci_placement_translator`` uses;
* the rest of ``nova/pci/devspec.py`` (hex ids up to ffff, a single full
  address, ``managed`` as yes/no/true/false) and of
  ``pci_placement_translator`` (one resource class per PF) is replicated
  below, from Nova 34's source;
* the tests marked ``nova`` put the entries through Nova's real
  ``PciDeviceSpec`` and ``_normalize_resource_class``: ``make nova-functional``
  runs them against each Nova version it installs.
"""

import json
import re

import os_resource_classes
import pytest
from oslo_config import cfg

from unit_tests import principal
from unit_tests.fakehost import l40s_host
from vgpu import mappings, novaconf, pci, plan, releases

EPOXY = releases.from_major(31)
MAPPING = "{L40S-12Q: all, H200X-35C: all}"

# charm-nova-compute's own [pci] (templates/yoga/nova.conf, used by every later
# release), with a NIC passed through by its pci-passthrough-whitelist option.
PRINCIPAL_PCI = """[DEFAULT]
debug = False

[pci]
passthrough_whitelist = {"vendor_id": "15b3", "product_id": "101e", "physical_network": "physnet1"}
alias = {"name": "nic", "vendor_id": "15b3", "product_id": "101e", "device_type": "type-VF"}

[vnc]
enabled = False

"""


def published(root, **options):
    """The plan for MAPPING and nova-compute's view of it; ``options``: plan_sections' switches."""
    l40s_host(root)
    checked = mappings.check_text(MAPPING)
    built = plan.build(checked.mapping, pci.discover(), EPOXY)
    assert built.ok, built.errors
    data = novaconf.relation_data(novaconf.plan_sections(built, EPOXY, mdev_class=False, **options))
    return built, principal.nova_context(data)


def oslo_conf(path):
    """nova.conf as Nova's [pci] options read it."""
    conf = cfg.ConfigOpts()
    conf.register_opts([
        cfg.MultiStrOpt("device_spec", default=[], deprecated_opts=[
            cfg.DeprecatedOpt("passthrough_whitelist", group="pci"),
            cfg.DeprecatedOpt("pci_passthrough_whitelist", group="DEFAULT")]),
        cfg.MultiStrOpt("alias", default=[]),
        cfg.BoolOpt("report_in_placement", default=False),
    ], group="pci")
    conf(args=[], default_config_files=[str(path)])
    return conf


def nova_devspec(text):
    """nova.pci.devspec.PciDeviceSpec's checks on one JSON entry, replicated."""
    spec = json.loads(text)
    assert isinstance(spec, dict)
    tags = dict(spec)
    for key in ("vendor_id", "product_id"):
        value = tags.pop(key).strip()
        assert int(value, 16) <= 0xFFFF, key            # _set_pci_dev_info
    address = tags.pop("address")
    assert re.fullmatch(r"[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]", address)  # single
    assert tags.pop("managed").lower() in ("yes", "no", "true", "false")  # bool_from_string strict
    # _normalize_device_spec_tag, strict as managed (Nova 31+, nova/pci/devspec.py).
    assert tags.pop("live_migratable", "yes").lower() in ("yes", "no", "true", "false")
    # one_time_use likewise (Nova 32+), only with report_in_placement (checked where published).
    assert tags.pop("one_time_use", "true").lower() in ("yes", "no", "true", "false")
    rc = tags.pop("resource_class")
    assert "devname" not in spec  # refused with report_in_placement
    assert tags == {}, f"unknown tags {tags}"
    return rc


def placement_class(rc):
    """pci_placement_translator._normalize_resource_class."""
    if rc not in os_resource_classes.STANDARDS and not os_resource_classes.is_custom(rc):
        rc = os_resource_classes.normalize_name(rc)
    return rc


def test_the_charms_pci_entries_hold_beside_the_principals_own(root, tmp_path):
    built, context = published(root, pci_in_placement=True)
    conf_path = tmp_path / "nova.conf"
    conf_path.write_text(PRINCIPAL_PCI + principal.render_nova_conf(context))
    assert conf_path.read_text().count("[pci]") == 2
    conf = oslo_conf(conf_path)
    specs = conf.pci.device_spec
    assert any("15b3" in s for s in specs), specs  # the principal's NIC is still there
    ours = [s for s in specs if '"10de"' in s]
    assert [json.loads(s)["address"] for s in ours] == [a.address for a in built.vfio()]
    assert len(ours) == 8
    assert conf.pci.report_in_placement is True
    assert conf.pci.alias == [
        '{"name": "nic", "vendor_id": "15b3", "product_id": "101e", "device_type": "type-VF"}']


def test_every_entry_passes_novas_device_spec_rules_and_keeps_its_class(root):
    built, context = published(root)
    entries = [v for k, v in context["sections"]["pci"] if k == "device_spec"]
    per_pf = {}
    for text, assignment in zip(entries, built.vfio()):
        rc = nova_devspec(text)
        assert placement_class(rc) == rc  # already normalised: what the flavor asks for
        per_pf.setdefault(assignment.gpu, set()).add(rc)
    # PlacementPciMixedResourceClassException: one class per PF.
    assert per_pf == {"0000:81:00.0": {"CUSTOM_VGPU_L40S_12Q"},
                      "0000:c1:00.0": {"CUSTOM_VGPU_H200X_35C"}}


@pytest.mark.parametrize("name", ["L40S-12Q", "vgpu-1139", "H200X-1-18C", "RTX PRO 6000 DC-4Q"])
def test_class_names_are_what_placement_normalises_them_to(name):
    rc = plan.resource_class(name)
    assert placement_class(rc) == rc
    assert os_resource_classes.normalize_name(f"VGPU {name}") == rc


@pytest.mark.nova
def test_nova_itself_accepts_the_entries(root):
    from nova.compute import pci_placement_translator as translator
    from nova.pci import devspec

    built, context = published(root)
    checked = 0
    for key, text in context["sections"]["pci"]:
        if key == "device_spec":
            spec = devspec.PciDeviceSpec(json.loads(text))
            assert spec.get_tags()["managed"] == "false"
            rc = spec.get_tags()["resource_class"]
            assert translator._normalize_resource_class(rc) == rc
            checked += 1
    assert checked == len(built.vfio()) == 8  # every VF's entry went through Nova, none skipped


def test_by_default_reporting_stays_off_and_the_classes_are_inert(root, tmp_path):
    """Without pci-in-placement: no report_in_placement; resource_class is a tag Nova's pools ignore.

    nova/pci/stats.py leaves ``resource_class`` and ``traits`` out of its pools
    (``ignored_pool_tags``) and out of alias matching (``ignored_spec_tags``);
    only the Placement translator reads them, and only with reporting on.
    """
    built, context = published(root)
    conf_path = tmp_path / "nova.conf"
    conf_path.write_text(PRINCIPAL_PCI + principal.render_nova_conf(context))
    conf = oslo_conf(conf_path)
    assert conf.pci.report_in_placement is False
    ours = [s for s in conf.pci.device_spec if '"10de"' in s]
    assert len(ours) == len(built.vfio()) == 8
    for text in ours:
        nova_devspec(text)
        assert "one_time_use" not in json.loads(text)  # Nova refuses it without reporting


def test_live_migratable_entries_pass_novas_device_spec_rules(root):
    _, context = published(root, live_migratable=True)
    entries = [v for k, v in context["sections"]["pci"] if k == "device_spec"]
    assert len(entries) == 8
    for text in entries:
        nova_devspec(text)
        assert json.loads(text)["live_migratable"] == "yes"


# nova/pci/request.py's _ALIAS_SCHEMA (Nova 31+), replicated: no other key is allowed.
ALIAS_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 256},
        "capability_type": {"type": "string", "enum": ["pci"]},
        "product_id": {"type": "string", "pattern": "^([0-9a-fA-F]{4})$"},
        "vendor_id": {"type": "string", "pattern": "^([0-9a-fA-F]{4})$"},
        "device_type": {"type": "string", "enum": ["type-PCI", "type-PF", "type-VF"]},
        "numa_policy": {"type": "string"},
        "resource_class": {"type": "string"},
        "traits": {"type": "string"},
        "live_migratable": {"type": "string"},
    },
}


@pytest.mark.parametrize("live,placement", [(False, False), (True, False), (False, True),
                                            (True, True)])
def test_the_alias_matches_the_specs_and_passes_novas_alias_rules(root, live, placement):
    import jsonschema
    built, context = published(root, live_migratable=live, pci_in_placement=placement)
    specs = [json.loads(v) for k, v in context["sections"]["pci"] if k == "device_spec"]
    first = built.vfio()[0]
    made = novaconf.alias(first.name, first.product_id, live_migratable=live,
                          pci_in_placement=placement)
    jsonschema.validate(made, ALIAS_SCHEMA)
    # _validate_required_ids: without the scheduler's pci_in_placement, vendor and product id.
    assert {"vendor_id", "product_id"} <= set(made)
    matched = [s for s in specs if (s["vendor_id"], s["product_id"]) ==
               (made["vendor_id"], made["product_id"])]
    assert matched and all(s["resource_class"] == plan.resource_class(first.name) for s in matched)
    # Nova live-migrates only when the alias and the device asked for it agree.
    assert {s.get("live_migratable") for s in matched} == {made.get("live_migratable")}
    assert made.get("resource_class") == (plan.resource_class(first.name) if placement else None)


# -- whole GPUs beside vGPUs (issue 37) ------------------------------------------------------

WHOLE = "{L40S-12Q: all, passthrough: [c1:00.0]}"


def published_whole(root, release=EPOXY, **options):
    """The plan for WHOLE (an L40S split, the H200 whole) and nova-compute's view of it."""
    from unit_tests.fakehost import whole_and_vgpu_host

    whole_and_vgpu_host(root)
    checked = mappings.check_text(WHOLE)
    built = plan.build(checked.mapping, pci.discover(), release, passthrough=checked.passthrough,
                       pci_in_placement=options.get("pci_in_placement", False),
                       one_time_use=options.get("one_time_use", False))
    assert built.ok, built.errors
    data = novaconf.relation_data(novaconf.plan_sections(built, release, mdev_class=False, **options))
    return built, principal.nova_context(data)


def test_a_whole_gpu_is_one_device_spec_of_its_pf_in_its_own_class(root):
    built, context = published_whole(root)
    specs = [json.loads(v) for k, v in context["sections"]["pci"] if k == "device_spec"]
    whole = [s for s in specs if s["address"] == "0000:c1:00.0"]
    assert whole == [{"vendor_id": "10de", "product_id": "2335", "address": "0000:c1:00.0",
                      "managed": "no", "resource_class": built.passthrough[0].resource_class}]
    assert len(specs) == 1 + len(built.vfio())
    for spec in specs:
        nova_devspec(json.dumps(spec))
    assert "report_in_placement" not in dict(context["sections"]["pci"])


def test_the_whole_gpu_alias_asks_for_nova_s_device_type_never_the_vfs(root):
    import jsonschema

    built, _ = published_whole(root)
    whole, = built.passthrough
    made = novaconf.whole_alias(whole)
    jsonschema.validate(made, ALIAS_SCHEMA)
    assert made == {"name": whole.alias_name, "vendor_id": "10de", "product_id": "2335",
                    "device_type": "type-PF"}
    # The VF alias of the same model (same product id) asks for type-VF: neither takes the other.
    vf_alias = novaconf.alias("NVIDIA H200-35C", "2335")
    assert vf_alias["product_id"] == made["product_id"] and vf_alias["device_type"] == "type-VF"
    assert novaconf.whole_alias(whole, pci_in_placement=True)["resource_class"] == whole.resource_class


def test_one_time_use_marks_only_the_whole_gpus_and_reports_them(root):
    built, context = published_whole(root, release=releases.from_major(32), pci_in_placement=True,
                                     one_time_use=True)
    pairs = context["sections"]["pci"]
    specs = [json.loads(v) for k, v in pairs if k == "device_spec"]
    assert [s["address"] for s in specs if s.get("one_time_use") == "true"] == ["0000:c1:00.0"]
    assert ["report_in_placement", "True"] in [list(p) for p in pairs]


@pytest.mark.nova
@pytest.mark.parametrize("one_time_use", [False, True])
def test_nova_itself_accepts_the_whole_gpu_entries(root, one_time_use):
    import nova.conf
    from nova.pci import devspec, request

    release = releases.from_major(32) if one_time_use else EPOXY
    built, context = published_whole(root, release=release, pci_in_placement=one_time_use,
                                     one_time_use=one_time_use)
    conf = nova.conf.CONF
    read = getattr(request, "get_alias_from_config", None) or request._get_alias_from_config
    conf.set_override("report_in_placement", one_time_use, group="pci")
    try:
        for key, text in context["sections"]["pci"]:
            if key == "device_spec" and '"0000:c1:00.0"' in text:
                tags = devspec.PciDeviceSpec(json.loads(text)).get_tags()
                assert tags["managed"] == "false"
                assert tags.get("one_time_use", "false") == ("true" if one_time_use else "false")
        whole, = built.passthrough
        conf.set_override("alias", [json.dumps(novaconf.whole_alias(whole))], group="pci")
        getattr(read, "cache_clear", lambda: None)()  # Nova 32+ caches what it read
        aliases = read()
        assert aliases[whole.alias_name][1][0]["dev_type"] == "type-PF"
    finally:
        conf.clear_override("report_in_placement", group="pci")
        conf.clear_override("alias", group="pci")
        getattr(read, "cache_clear", lambda: None)()
