"""Every [pci] alias and device_spec the documentation shows works when typed.

README.md and config.yaml show ``[pci] alias`` and ``[pci] device_spec``
entries that operators paste into nova-cloud-controller's and nova-compute's
``pci-alias`` and read back from ``nova.conf``. Each one is found here (every
JSON object in the text: one with a ``name`` is an alias, one with an
``address`` a device spec) and put through Nova's own rules:

* aliases: the JSON schema ``_ALIAS_SCHEMA``, the parsing of
  ``get_alias_from_config`` (``live_migratable`` as a strict boolean, one
  ``device_type`` and NUMA policy per name) and ``_validate_required_ids`` /
  ``_validate_multispec``, replicated below from ``nova/pci/request.py`` at
  Nova commit 00a030403f672b975364c855b7d25b40ef83e757 (master, 34.x). The id
  check arrived in acc6221660d5113314c66361cace9e3982fa76bf and nova-compute
  runs it at start since ae064caf169b6d5888a5aec692b911c57c439ca4 (both
  32.0.0, 2025.2 Flamingo): without ``[filter_scheduler] pci_in_placement``
  on that host (nova-compute's charm never sets it), an alias without
  ``vendor_id`` and ``product_id`` stops nova-compute;
* device specs: the rules ``unit_tests/test_nova_rules.py`` replicates from
  ``nova/pci/devspec.py``;
* where Nova is importable, both also through Nova's real functions.

Every ``pci_passthrough:alias=NAME:N`` in the README must name an alias the
README defines, and every NVIDIA alias must match, by ids, a device spec the
README shows.
"""

import json
import re
from pathlib import Path

import jsonschema
import pytest

from unit_tests.test_nova_rules import nova_devspec, placement_class

REPO = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "config.yaml")

# nova/pci/request.py _ALIAS_SCHEMA; nova/pci/utils.py PCI_VENDOR_PATTERN;
# nova/objects/fields.py PciDeviceType (vDPA excluded) and PCINUMAAffinityPolicy.
HEX4 = "^([\\da-fA-F]{4})$"
ALIAS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 256},
        "capability_type": {"type": "string", "enum": ["pci"]},
        "product_id": {"type": "string", "pattern": HEX4},
        "vendor_id": {"type": "string", "pattern": HEX4},
        "device_type": {"type": "string", "enum": ["type-PCI", "type-PF", "type-VF"]},
        "numa_policy": {"type": "string",
                        "enum": ["required", "legacy", "preferred", "socket"]},
        "resource_class": {"type": "string"},
        "traits": {"type": "string"},
        "live_migratable": {"type": "string"},
    },
    "required": ["name"],
}
# oslo_utils.strutils.bool_from_string(strict=True)
BOOL_STRINGS = {"1", "t", "true", "on", "y", "yes", "0", "f", "false", "off", "n", "no"}
FLAVOR_ALIAS = re.compile(r"pci_passthrough:alias=([A-Za-z0-9_.-]+):(\d+)")


class InvalidAliasError(ValueError):
    """What nova.exception.PciInvalidAlias stands for here."""


def nova_aliases(texts, pci_in_placement=False):
    """get_alias_from_config and _validate_aliases on ``[pci] alias`` values, replicated.

    Returns ``{name: (numa_policy, [spec, ...])}``; raises InvalidAliasError where
    Nova raises PciInvalidAlias (and nova-compute 32+ does not start).
    """
    aliases = {}
    for text in texts:
        name, policy, spec = _parsed_alias(text)
        if name not in aliases:
            aliases[name] = (policy, [spec])
            continue
        if aliases[name][0] != policy:
            raise InvalidAliasError(f"NUMA policy mismatch for alias '{name}'")
        first = aliases[name][1][0]
        if "dev_type" not in first or "dev_type" not in spec \
                or first["dev_type"] != spec["dev_type"]:
            raise InvalidAliasError(f"Device type mismatch for alias '{name}'")  # or a KeyError
        aliases[name][1].append(spec)
    for name, (_, specs) in aliases.items():
        if pci_in_placement and len(specs) > 1:  # _validate_multispec
            raise InvalidAliasError(f"{name} has multiple specs but pci_in_placement is True")
        for spec in specs:  # _validate_required_ids
            ids = "vendor_id" in spec and "product_id" in spec
            if not ids and not (pci_in_placement and "resource_class" in spec):
                raise InvalidAliasError(f"The PCI alias(es) {name} does not have vendor_id and "
                                        "product_id fields set")
    return aliases


def _parsed_alias(text):
    """One alias as get_alias_from_config reads it: (name, numa_policy, spec)."""
    spec = json.loads(text)
    try:
        jsonschema.validate(spec, ALIAS_SCHEMA)
    except jsonschema.ValidationError as error:
        raise InvalidAliasError(error.message) from None
    name = spec.pop("name").strip()
    policy = spec.pop("numa_policy", None) or "legacy"
    if spec.get("device_type"):
        spec["dev_type"] = spec.pop("device_type")
    if "live_migratable" in spec and spec["live_migratable"].lower() not in BOOL_STRINGS:
        raise InvalidAliasError(f"live_migratable {spec['live_migratable']!r}")
    return name, policy, spec


def json_objects(text):
    """Every JSON object written in ``text`` (outermost ones; lists give their items)."""
    decoder = json.JSONDecoder()
    found, end = [], 0
    for match in re.finditer(r"[\[{]", text):
        if match.start() < end:
            continue
        try:
            value, stop = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        items = value if isinstance(value, list) else [value]
        objects = [item for item in items if isinstance(item, dict)]
        if objects:
            found.extend(json.dumps(item) for item in objects)
            end = stop
    return found


def documented(kind):
    """``[(file, json text)]`` of the aliases (``name``) or device specs (``address``)."""
    key = {"alias": "name", "device_spec": "address"}[kind]
    return [(doc, text) for doc in DOCS
            for text in json_objects((REPO / doc).read_text()) if key in json.loads(text)]


ALIASES = documented("alias")
SPECS = documented("device_spec")


def entry_id(entry):
    """``README.md:vgpu-l40s-12q`` or ``README.md:0000:81:00.4`` for test ids."""
    doc, text = entry
    value = json.loads(text)
    return f"{doc}:{value.get('name') or value.get('address')}"


def test_the_documentation_shows_aliases_and_device_specs():
    # Both files are searched; the README shows aliases and specs of both GPU models.
    names = {json.loads(text)["name"] for _, text in ALIASES}
    assert {"vgpu-l40s-12q", "vgpu-h200x-35c"} <= names, names
    products = {json.loads(text)["product_id"] for _, text in SPECS}
    assert {"26b9", "2335"} <= products, products


@pytest.mark.parametrize("doc,text", ALIASES, ids=[entry_id(e) for e in ALIASES])
def test_every_documented_alias_starts_nova_compute(doc, text):
    # nova-compute's host has no [filter_scheduler] pci_in_placement: ids are required there.
    nova_aliases([text], pci_in_placement=False)
    # The controllers may have it (pci-in-placement): the same alias holds there too.
    nova_aliases([text], pci_in_placement=True)


@pytest.mark.parametrize("doc,text", ALIASES, ids=[entry_id(e) for e in ALIASES])
def test_every_nvidia_alias_asks_for_a_vf_the_documentation_publishes(doc, text):
    alias = json.loads(text)
    if alias.get("vendor_id") != "10de":
        return  # another device's alias (the principal's own NIC)
    assert alias.get("device_type") == "type-VF", text  # the charm publishes VFs only
    specs = [json.loads(spec) for _, spec in SPECS]
    matching = [s for s in specs if s["product_id"] == alias["product_id"]]
    assert matching, f"no device_spec shown for product {alias['product_id']}: {text}"
    if "resource_class" in alias:  # the class the charm gives the alias's profile
        profile = alias["name"].removeprefix("vgpu-")
        assert alias["resource_class"] == "CUSTOM_VGPU_" + profile.upper().replace("-", "_"), text
        assert placement_class(alias["resource_class"]) == alias["resource_class"]


@pytest.mark.parametrize("doc,text", SPECS, ids=[entry_id(e) for e in SPECS])
def test_every_documented_device_spec_passes_novas_rules(doc, text):
    rc = nova_devspec(text)
    assert placement_class(rc) == rc


def test_every_flavor_alias_in_the_readme_is_defined_there():
    readme = (REPO / "README.md").read_text()
    wanted = FLAVOR_ALIAS.findall(readme)
    assert wanted, "the README shows no pci_passthrough:alias flavor"
    defined = {json.loads(text)["name"] for doc, text in ALIASES if doc == "README.md"}
    assert {name for name, _ in wanted} - defined == set()
    # A flavor asks for a positive count.
    assert all(int(count) >= 1 for _, count in wanted)


@pytest.mark.parametrize("text,in_placement,ok", [
    ('{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
     False, True),
    ('{"name": "a", "resource_class": "CUSTOM_VGPU_L40S_12Q"}', False, False),
    ('{"name": "a", "resource_class": "CUSTOM_VGPU_L40S_12Q"}', True, True),
    ('{"name": "a", "vendor_id": "10de"}', True, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "device_type": "type-VDPA"}',
     False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26bag"}', False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "gpu": "yes"}', False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "live_migratable": "maybe"}',
     False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "live_migratable": "yes",'
     ' "resource_class": "CUSTOM_VGPU_L40S_12Q", "device_type": "type-VF"}', True, True),
    ('{"name": "", "vendor_id": "10de", "product_id": "26ba"}', False, False),
])
def test_the_replica_refuses_what_nova_refuses(text, in_placement, ok):
    if ok:
        nova_aliases([text], pci_in_placement=in_placement)
    else:
        with pytest.raises(InvalidAliasError):
            nova_aliases([text], pci_in_placement=in_placement)
    if _nova_request() is not None:
        assert _real_nova_accepts([text], in_placement) == ok


@pytest.mark.parametrize("texts,in_placement,ok", [
    # One name may list several devices (ORed), one device type and NUMA policy for all...
    (['{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "233c"}'],
     False, True),
    # ...but not with pci_in_placement,
    (['{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "233c"}'],
     True, False),
    # and not with different device types or a missing one.
    (['{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "device_type": "type-PF", "vendor_id": "10de", "product_id": "233c"}'],
     False, False),
    (['{"name": "a", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "vendor_id": "10de", "product_id": "233c"}'], False, False),
])
def test_the_replica_joins_aliases_of_one_name_as_nova_does(texts, in_placement, ok):
    if ok:
        assert len(nova_aliases(texts, pci_in_placement=in_placement)["a"][1]) == 2
    else:
        with pytest.raises(InvalidAliasError):
            nova_aliases(texts, pci_in_placement=in_placement)
    if _nova_request() is not None:
        assert _real_nova_accepts(texts, in_placement) == ok


def test_nova_itself_accepts_the_documented_entries_where_it_is_installed():
    request = pytest.importorskip("nova.pci.request")
    devspec = pytest.importorskip("nova.pci.devspec")
    for _, text in ALIASES:
        for in_placement in (False, True):
            assert _real_nova_accepts([text], in_placement), text
    assert isinstance(request.get_alias_from_config(), dict)
    for _, text in SPECS:
        devspec.PciDeviceSpec(json.loads(text))


def _nova_request():
    try:
        from nova.pci import request
    except ImportError:
        return None
    return request


def _real_nova_accepts(texts, pci_in_placement):
    """Whether nova.pci.request.get_alias_from_config accepts these ``[pci] alias`` values."""
    import nova.conf
    from nova import exception

    request = _nova_request()
    conf = nova.conf.CONF
    conf.set_override("alias", list(texts), group="pci")
    conf.set_override("pci_in_placement", pci_in_placement, group="filter_scheduler")
    request.get_alias_from_config.cache_clear()
    try:
        request.get_alias_from_config()
        return True
    except exception.PciInvalidAlias:
        return False
    finally:
        conf.clear_override("alias", group="pci")
        conf.clear_override("pci_in_placement", group="filter_scheduler")
        request.get_alias_from_config.cache_clear()
