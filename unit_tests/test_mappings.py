"""vgpu-device-mappings: parsing, schema, normalisation and host checks, on plain inputs."""

import configparser
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from unit_tests.fakehost import A100_TYPES, FakeHost, MdevType, a100_host, l40s_host, v100_host
from vgpu import mappings, novaconf, pci, profiles, releases

CARACAL = releases.from_major(29)
TRAIN = releases.from_major(20)


def on_host(text, host, release):
    """The option checked as the charm checks it: its text, then against ``host``."""
    return mappings.against_host(mappings.check_text(text), host, release)


@pytest.mark.parametrize("text,expected", [
    ("", {}),
    ("   \n", {}),
    ("{nvidia-108: ['0000:c1:00.0']}", {"nvidia-108": ("0000:c1:00.0",)}),
    ('{"nvidia-108": ["0000:c1:00.0"]}', {"nvidia-108": ("0000:c1:00.0",)}),
    ("nvidia-108:\n- 0000:e1:00.0\n- 0000:c1:00.0\n", {"nvidia-108": ("0000:c1:00.0", "0000:e1:00.0")}),
    # lspci and nvidia-smi spellings; duplicates after normalisation collapse.
    ("{nvidia-108: [c1:00.0, 00000000:C1:00.0]}", {"nvidia-108": ("0000:c1:00.0",)}),
    # YAML 1.1 would read these as sexagesimal numbers (240.0 and 5040.0).
    ("{nvidia-108: [0000:04:00.0, 84:00.0]}", {"nvidia-108": ("0000:04:00.0", "0000:84:00.0")}),
    # Types come out in numeric order whatever the input order.
    ("{nvidia-1000: [c1:00.0], nvidia-99: [e1:00.0]}",
     {"nvidia-99": ("0000:e1:00.0",), "nvidia-1000": ("0000:c1:00.0",)}),
    # A domain above ffff (VMD) keeps all its digits.
    ("{nvidia-108: ['10000:01:00.0']}", {"nvidia-108": ("10000:01:00.0",)}),
    # nvidia-smi's 8-digit domain (cubecos #312: 00000001:C8:00.0) becomes sysfs's 0001:c8:00.0.
    ("{DC-8Q: ['00000001:C8:00.0', '0001:04:00.0']}", {"DC-8Q": ("0001:04:00.0", "0001:c8:00.0")}),
    # Every name form a key may take: hyphens inside a model, the short form, the full name.
    ("{RTX6000-Ada-12Q: all}", {"RTX6000-Ada-12Q": ("all",)}),
    ("{NVIDIA RTX6000-Ada-12Q: all}", {"NVIDIA RTX6000-Ada-12Q": ("all",)}),
    ("{NVIDIA RTX Pro 6000 Blackwell DC-8Q: all}", {"NVIDIA RTX Pro 6000 Blackwell DC-8Q": ("all",)}),
    ("{RTX Pro 6000 Blackwell DC-8Q: all}", {"RTX Pro 6000 Blackwell DC-8Q": ("all",)}),
])
def test_accepted_forms(text, expected):
    result = mappings.check_text(text)
    assert result.errors == ()
    assert result.mapping == expected
    assert list(result.mapping) == list(expected)


@pytest.mark.parametrize("text,message", [
    ("[1, 2]", "must map vGPU types to lists of PCI addresses"),
    ("nvidia-108", "must map vGPU types to lists of PCI addresses"),
    ("{nvidia-108: c1:00.0}", 'nvidia-108: expected a list of PCI addresses or "all", got "c1:00.0"'),
    ("{nvidia-108: ALL}", 'nvidia-108: expected a list of PCI addresses or "all", got "ALL"'),
    ("{'L40S 12Q': all}", 'type "L40S 12Q" is not a vGPU type id like nvidia-108 or a profile name'),
    ("{'GRID  A100-20C': all}", 'type "GRID  A100-20C" is not a vGPU type id'),
    ("{'RTX6000--Ada-12Q': all}", 'type "RTX6000--Ada-12Q" is not a vGPU type id'),
    ("{'-DC-8Q': all}", 'type "-DC-8Q" is not a vGPU type id'),
    ("{'DC-8': all}", 'type "DC-8" is not a vGPU type id'),
    ("{nvidia-108: []}", "nvidia-108: lists no PCI address"),
    ("{nvidia-108: [c1:00.0], nvidia-108: [e1:00.0]}", 'lists "nvidia-108" twice'),
    ("{vgpu-108: [c1:00.0]}", 'type "vgpu-108" is not a vGPU type id'),
    ("{NVIDIA-108: [c1:00.0]}", 'type "NVIDIA-108" is not a vGPU type id'),
    ("{nvidia-0108: [c1:00.0]}", 'type "nvidia-0108" is not a vGPU type id'),
    ("{nvidia-108: [c1:20.0]}", 'nvidia-108: "c1:20.0" is not a PCI address'),
    ("{nvidia-108: [c1:00.8]}", 'nvidia-108: "c1:00.8" is not a PCI address'),
    ("{nvidia-108: [nonsense]}", 'nvidia-108: "nonsense" is not a PCI address'),
    ("{nvidia-108: [[c1:00.0]]}", "nvidia-108: "),
    ("a: &x [1]\nb: *x\n", "uses a YAML alias"),
    ("{!!merge <<: {nvidia-108: [c1:00.0]}}", "uses a YAML merge key"),
    ("!!python/object/apply:os.system [echo hi]", "is not valid YAML or JSON"),
    ("{nvidia-108: [c1:00.0]", "is not valid YAML or JSON at line 1"),
    ("[" * 20 + "]" * 20, "nested deeper than"),
    ("x: " + "y" * (70 * 1024), "is larger than 64 KiB"),
])
def test_refused_with_a_message_naming_the_entry(text, message):
    result = mappings.check_text(text)
    assert result.mapping == {}
    assert any(message in e for e in result.errors), result.errors


# Each character that would let a value start another nova.conf setting.
HOSTILE = ["\n", "\r", "]", "[", ",", "=", "#", "$", ";", " ", "\t", "\x00", "\u2028", "%"]


@pytest.mark.parametrize("char", HOSTILE)
def test_hostile_characters_in_type_names_are_refused(char):
    text = json.dumps({f"nvidia-108{char}[DEFAULT]": ["0000:c1:00.0"]})
    result = mappings.check_text(text)
    assert not result.ok and result.mapping == {}
    assert "is not a vGPU type id" in result.errors[0]
    assert "\n" not in result.errors[0] and "\r" not in result.errors[0]


@pytest.mark.parametrize("char", HOSTILE)
def test_hostile_characters_in_addresses_are_refused(char):
    text = json.dumps({"nvidia-108": [f"0000:c1:00.0{char}debug=true"]})
    result = mappings.check_text(text)
    assert not result.ok and result.mapping == {}
    assert "is not a PCI address" in result.errors[0]


@pytest.mark.parametrize("suffix", ["\n", "\r\n"])
def test_trailing_newline_is_refused_although_json_schema_dollar_allows_it(suffix):
    # Python's re.search lets "$" match before a final newline: the schema adds "no whitespace".
    assert not mappings.check_text(json.dumps({"nvidia-108" + suffix: ["c1:00.0"]})).ok
    assert not mappings.check_text(json.dumps({"nvidia-108": ["c1:00.0" + suffix]})).ok


def test_all_schema_errors_are_reported_in_entry_order():
    result = mappings.check_text('{"nvidia-1": ["bad1"], "nvidia-2": ["c1:00.0", "bad2"]}')
    assert result.errors == ('nvidia-1: "bad1" is not a PCI address like 0000:c1:00.0',
                             'nvidia-2: "bad2" is not a PCI address like 0000:c1:00.0')


def test_long_values_are_cut_in_messages():
    result = mappings.check_text(json.dumps({"nvidia-108": ["x" * 500]}))
    assert len(result.errors[0]) < 120


def test_normalise_address():
    assert mappings.normalise_address("C1:00.0") == "0000:c1:00.0"
    assert mappings.normalise_address("00000000:c1:1f.7") == "0000:c1:1f.7"
    assert mappings.normalise_address("00000001:C8:00.0") == "0001:c8:00.0"  # nvidia-smi's form
    with pytest.raises(ValueError):
        mappings.normalise_address("0000:c1:00.0\n")


# -- against the host and release ---------------------------------------------

@pytest.fixture
def v100(root):
    v100_host(root)
    return pci.discover()


def test_host_accepts_offered_types_on_its_gpus(v100):
    result = on_host("{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}", v100, CARACAL)
    assert result.ok and result.mapping == {"nvidia-108": ("0000:c1:00.0",),
                                           "nvidia-109": ("0000:e1:00.0",)}


def test_address_that_is_not_a_gpu_here_is_named(v100):
    result = on_host("{nvidia-108: [c1:00.0, '0000:3b:00.0']}", v100, CARACAL)
    assert result.errors == ("nvidia-108: 0000:3b:00.0 is not an NVIDIA GPU on this host "
                             "(found: 0000:c1:00.0, 0000:e1:00.0)",)


def test_type_the_gpu_does_not_offer_is_named_with_what_it_offers(v100):
    result = on_host("{nvidia-471: [c1:00.0]}", v100, CARACAL)
    assert result.errors == (
        "nvidia-471: 0000:c1:00.0 (Tesla V100 PCIe 16GB) does not offer nvidia-471; it offers "
        "nvidia-105, nvidia-106, nvidia-107, nvidia-108 and 1 more",)


def test_one_gpu_under_two_types_is_refused(v100):
    result = on_host("{nvidia-108: [c1:00.0], nvidia-109: ['0000:C1:00.0']}", v100, CARACAL)
    assert result.errors == ("GPU 0000:c1:00.0 is mapped to both nvidia-108 and nvidia-109",)


def test_queens_to_train_take_a_single_type(v100):
    text = "{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}"
    result = on_host(text, v100, TRAIN)
    assert result.errors == ("train (Nova 20) supports one vGPU type; 2 are mapped "
                             "(nvidia-108, nvidia-109)",)
    assert on_host(text, v100, releases.from_major(21)).ok


def test_sriov_gpu_named_by_its_own_address_expands_to_the_vfs_the_type_fits(root):
    a100_host(root)
    host = pci.discover()
    result = on_host("{nvidia-474: ['0000:41:00.0']}", host, CARACAL)
    assert result.ok
    assert result.plan.mdev_mapping() == {"nvidia-474": tuple(f"0000:41:00.{n}" for n in range(4, 8))}
    given = on_host("{nvidia-474: ['41:00.4', '41:00.5']}", host, CARACAL)
    assert given.plan.mdev_mapping() == {"nvidia-474": ("0000:41:00.4", "0000:41:00.5")}


def test_vfs_of_one_gpu_serve_one_type(root):
    a100_host(root)
    result = on_host("{nvidia-471: ['41:00.4'], nvidia-474: ['41:00.5']}", pci.discover(), CARACAL)
    assert result.errors == (
        "GPU 0000:41:00.0 (through 0000:41:00.5) is mapped to both nvidia-471 and nvidia-474",)


def test_no_more_vfs_than_the_type_fits(root):
    from unit_tests.fakehost import A100_TYPES, FakeHost
    host = FakeHost(root)
    host.add_gpu("0000:41:00.0", device="0x20b5", totalvfs=16)
    for index in range(6):
        host.add_vf("0000:41:00.0", index, f"0000:41:0{(4 + index) // 8}.{(4 + index) % 8}",
                    mdev_types=A100_TYPES)
    found = pci.discover()
    five = "['41:00.4', '41:00.5', '41:00.6', '41:00.7', '41:01.0']"
    assert on_host(f"{{nvidia-474: {five}}}", found, CARACAL).errors == (
        "nvidia-474: 5 virtual functions of GPU 0000:41:00.0 are mapped but the type fits 4 per GPU",)
    assert on_host(f"{{nvidia-472: {five}}}", found, CARACAL).ok  # fits 8


def test_vendor_specific_vfio_gpus_need_epoxy(root):
    l40s_host(root)
    result = on_host("{nvidia-1139: ['81:00.0']}", pci.discover(), CARACAL)
    assert result.errors == (
        "GPU 0000:81:00.0 (L40S) uses NVIDIA's vendor-specific VFIO framework, which needs "
        "Nova 31 (2025.1 epoxy) or later; this host runs 2024.1 caracal (Nova 29)",)
    assert on_host("{nvidia-1139: ['81:00.0']}", pci.discover(), releases.from_major(31)).ok


def test_types_are_not_checked_while_the_driver_exposes_none(root):
    from unit_tests.fakehost import FakeHost
    FakeHost(root).add_gpu("0000:c1:00.0", driver=None)
    assert on_host("{nvidia-108: [c1:00.0]}", pci.discover(), CARACAL).ok


# -- at its limits: sizes, nesting, schema bounds, YAML null ---------------------------
# Each test sits on a boundary (exactly at a limit and one past it), so that
# moving the limit by one, in the code or the schema, fails a test.

ONE_TYPE = "{nvidia-108: all}"


def _padded(size: int) -> str:
    """A valid option of exactly ``size`` bytes: one type, then a YAML comment."""
    head = ONE_TYPE + " #"
    return head + "x" * (size - len(head))


def test_an_option_of_exactly_64_kib_is_read():
    text = _padded(64 * 1024)
    assert len(text.encode()) == 65536
    checked = mappings.check_text(text)
    assert checked.errors == ()
    assert checked.mapping == {"nvidia-108": ("all",)}


def test_one_byte_over_64_kib_is_refused_saying_so():
    checked = mappings.check_text(_padded(64 * 1024 + 1))
    assert checked.errors == ("vgpu-device-mappings is larger than 64 KiB",)
    assert checked.mapping == {}


def test_the_size_limit_counts_bytes_not_characters():
    # 2-byte characters in a comment: 32769 characters are 65537 bytes.
    head = ONE_TYPE + " #"
    text = head + "é" * ((64 * 1024 + 1 - len(head)) // 2)
    assert len(text.encode()) == 65537 and len(text) < 65536
    assert mappings.check_text(text).errors == ("vgpu-device-mappings is larger than 64 KiB",)


def _nested(levels: int) -> str:
    """A type whose value is ``levels`` lists deep: the address sits at depth 2 + levels."""
    return "{nvidia-108: " + "[" * levels + "c1:00.0" + "]" * levels + "}"


def test_nesting_up_to_eight_levels_reaches_the_schema():
    # mapping (1) > value lists (2..7) > address (8): read, then refused by the schema.
    assert mappings.check_text(_nested(6)).errors == (
        "nvidia-108: \"[[[[['c1:00.0']]]]]\" is not a PCI address like 0000:c1:00.0",)


def test_nesting_past_eight_levels_is_refused_by_the_reader():
    assert mappings.check_text(_nested(7)).errors == (
        "vgpu-device-mappings is nested deeper than 8 levels",)


def _types(count: int) -> str:
    return "{" + ", ".join(f"nvidia-{n}: all" for n in range(1, count + 1)) + "}"


def test_sixty_four_types_are_accepted():
    assert len(mappings.check_text(_types(64)).mapping) == 64


def test_sixty_five_types_are_refused_naming_the_limit():
    assert mappings.check_text(_types(65)).errors == ("maps 65 vGPU types; at most 64",)


def _addresses(count: int) -> str:
    return "{nvidia-108: [" + ", ".join(
        f"'{n // 256:02x}:{n % 256 // 8:02x}.{n % 8}'" for n in range(count)) + "]}"


def test_a_type_may_list_1024_addresses():
    checked = mappings.check_text(_addresses(1024))
    assert checked.errors == ()
    assert len(checked.mapping["nvidia-108"]) == 1024


def test_a_type_listing_1025_addresses_is_refused_naming_the_type():
    assert mappings.check_text(_addresses(1025)).errors == (
        "nvidia-108: lists more than 1024 addresses",)


@pytest.mark.parametrize("text", ["~", "null", "Null", "NULL", " ~ \n", "---\n~\n", "--- null\n",
                                  "# nothing mapped yet\n~\n"])
def test_yaml_null_as_the_whole_option_means_no_types(text):
    checked = mappings.check_text(text)
    assert checked.errors == ()
    assert checked.mapping == {}


@pytest.mark.parametrize("text", ["'null'", '"~"', "nul", "none"])
def test_a_quoted_null_or_another_word_is_still_refused(text):
    assert mappings.check_text(text).errors == (
        "vgpu-device-mappings must map vGPU types to lists of PCI addresses, "
        "like {nvidia-108: ['0000:c1:00.0']}",)


def test_a_null_value_for_one_type_is_refused_naming_it():
    assert mappings.check_text("{nvidia-108: ~}").errors == (
        'nvidia-108: expected a list of PCI addresses or "all", got "~"',)


# -- how many VFs a type fits --------------------------------------------------------

def _validate(text, host, release):
    """The option checked as the charm checks it: text first, then against the host."""
    return mappings.against_host(mappings.check_text(text), host, release)


def _a100_with_vfs(root, count: int) -> pci.Host:
    host = FakeHost(root)
    host.add_gpu("0000:41:00.0", device="0x20b5", totalvfs=16)
    for index in range(count):
        n = 4 + index
        host.add_vf("0000:41:00.0", index, f"0000:41:{n // 8:02x}.{n % 8}", mdev_types=A100_TYPES)
    return pci.discover()


def test_exactly_as_many_vfs_as_the_type_fits_are_accepted(root):
    found = _a100_with_vfs(root, 5)
    four = "['41:00.4', '41:00.5', '41:00.6', '41:00.7']"  # nvidia-474 (A100-10C) fits 4
    result = _validate(f"{{nvidia-474: {four}}}", found, CARACAL)
    assert result.errors == ()
    assert result.plan.mdev_mapping() == {
        "nvidia-474": ("0000:41:00.4", "0000:41:00.5", "0000:41:00.6", "0000:41:00.7")}


def test_all_on_a_gpu_takes_as_many_vfs_as_the_type_fits(root):
    found = _a100_with_vfs(root, 5)
    for key, fits in (("nvidia-474", 4), ("nvidia-475", 2), ("nvidia-476", 1)):
        result = _validate(f"{{{key}: all}}", found, CARACAL)
        assert result.errors == ()
        assert len(result.plan.mdev_mapping()[key]) == fits


# -- a GPU that offers exactly one type -------------------------------------------------

def test_a_gpu_offering_a_single_type_serves_it(root):
    host = FakeHost(root)
    host.add_gpu("0000:c1:00.0", mdev_types={"nvidia-108": MdevType("GRID V100-8Q", 8192, 2)})
    found = pci.discover()
    for text in ("{nvidia-108: [c1:00.0]}", "{nvidia-108: all}", "{V100-8Q: all}"):
        result = _validate(text, found, CARACAL)
        assert result.errors == ()
        assert result.plan.mdev_mapping() == {"nvidia-108": ("0000:c1:00.0",)}
    assert _validate("{nvidia-109: [c1:00.0]}", found, CARACAL).errors == (
        "nvidia-109: 0000:c1:00.0 (NVIDIA 0x1db4) does not offer nvidia-109; "
        "it offers nvidia-108",)


def test_an_sriov_gpu_whose_vfs_offer_a_single_type_serves_what_it_fits(root):
    only = {"nvidia-476": A100_TYPES["nvidia-476"]}
    host = FakeHost(root)
    host.add_gpu("0000:61:00.0", device="0x20f1", totalvfs=4)
    for index in range(4):
        host.add_vf("0000:61:00.0", index, f"0000:61:00.{4 + index}", mdev_types=only)
    found = pci.discover()
    result = _validate("{nvidia-476: ['61:00.0']}", found, CARACAL)
    assert result.errors == ()
    assert result.plan.mdev_mapping() == {"nvidia-476": ("0000:61:00.4",)}  # A100-40C fits 1


# -- property-based hardening -------------------------------------------------

values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=20), inner, max_size=4),
    max_leaves=12)


FORMATS = (TRAIN, releases.from_major(22), CARACAL)


def _expected_settings(mapping, release):
    """{section: {keys}} the release's spelling allows for ``mapping``; nothing else."""
    if not mapping:
        return {}
    if not release.multiple_types:
        return {"devices": {"enabled_vgpu_types"}}
    option, prefix = (("enabled_vgpu_types", "vgpu_") if release.nova_major < 24
                      else ("enabled_mdev_types", "mdev_"))
    return {"devices": {option}, **{f"{prefix}{t}": {"device_addresses"} for t in mapping}}


def _sections_are_only_ours(result) -> None:
    """Whatever passes renders, in every release's spelling, exactly the expected settings."""
    if not result.ok:
        assert result.mapping == {} and all(result.errors), result
        assert all("\n" not in e and "\r" not in e for e in result.errors)
        return
    from unit_tests import principal
    # Names and `all` are resolved on a host into sysfs type ids first (test_plan.py);
    # what passes here must still be plain text that cannot start another setting.
    for key, addresses in result.mapping.items():
        assert not set(key) & set("\n\r[]=,#;%$\t\x00"), key
        assert addresses == ("all",) or all(re.fullmatch(mappings._ADDRESS, a) for a in addresses)
    direct = {k: v for k, v in result.mapping.items()
              if re.fullmatch(mappings._TYPE, k) and v != ("all",)}
    for release in FORMATS:
        mapping = dict(list(direct.items())[:1]) if not release.multiple_types else direct
        sections = novaconf.sections(mapping, release)
        novaconf.check(sections)
        # nova-compute's own view of the relation data, rendered as its template would.
        context = principal.nova_context(novaconf.relation_data(sections))
        parser = configparser.ConfigParser(interpolation=None, strict=True)
        parser.read_string(principal.render_nova_conf(context) if context else "")
        found = {section: set(parser[section]) for section in parser.sections()}
        assert found == _expected_settings(mapping, release)
        if mapping:
            option = next(iter(found["devices"]))
            assert parser["devices"][option].split(",") == list(mapping)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.text(max_size=20), st.lists(st.text(max_size=24), max_size=4), max_size=4))
def test_any_mapping_of_strings_either_fails_or_renders_only_its_own_settings(data):
    _sections_are_only_ours(mappings.check_text(json.dumps(data)))


@settings(max_examples=300, deadline=None)
@given(values)
def test_any_json_value_either_fails_or_renders_only_its_own_settings(data):
    _sections_are_only_ours(mappings.check_text(json.dumps(data)))


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_any_text_either_fails_or_renders_only_its_own_settings(text):
    _sections_are_only_ours(mappings.check_text(text))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(
    st.integers(0, 999999).map(lambda n: f"nvidia-{n}"),
    st.lists(st.tuples(st.integers(0, 0xffff), st.integers(0, 255), st.integers(0, 31),
                       st.integers(0, 7)).map(lambda t: "%04x:%02x:%02x.%x" % t),
             min_size=1, max_size=5),
    min_size=1, max_size=5))
def test_valid_mappings_always_pass_and_round_trip_through_the_relation(data):
    result = mappings.check_text(json.dumps(data))
    assert result.ok
    assert result.mapping == {k: tuple(sorted(set(v))) for k, v in data.items()}
    sections = novaconf.sections(result.mapping, CARACAL)
    assert novaconf.mapping_from_sections(sections) == result.mapping
    _sections_are_only_ours(result)


def test_control_characters_are_refused_by_the_yaml_reader():
    result = mappings.check_text("{nvidia-108: [c1:00.0]}\x1f")
    assert result.errors == ("vgpu-device-mappings is not valid YAML or JSON: "
                             "special characters are not allowed",)


def test_fingerprint_changes_with_the_text_and_the_schema(tmp_path, monkeypatch):
    text = "{nvidia-108: [c1:00.0]}"
    assert mappings.fingerprint(text) == mappings.fingerprint(text)
    assert mappings.fingerprint(text) != mappings.fingerprint(text + " ")
    before = mappings.fingerprint(text)
    schema = tmp_path / "schema.json"
    schema.write_text(mappings.SCHEMA_FILE.read_text().replace('"maxProperties": 64', '"maxProperties": 8'))
    monkeypatch.setattr(mappings, "SCHEMA_FILE", schema)
    assert mappings.fingerprint(text) != before


def test_checked_text_survives_a_round_trip_through_plain_data():
    for text in ("{nvidia-108: [c1:00.0, e1:00.0]}", "{nvidia-108: [bad]}"):
        checked = mappings.check_text(text)
        assert mappings.from_record(json.loads(json.dumps(mappings.to_record(checked)))) == checked


def test_fingerprint_changes_with_the_validation_code(tmp_path, monkeypatch):
    text = "{nvidia-108: [c1:00.0]}"
    before = mappings.fingerprint(text)
    changed = tmp_path / "mappings.py"
    changed.write_text(open(mappings.__file__).read() + "\n# a later charm revision\n")
    monkeypatch.setattr(mappings, "__file__", str(changed))
    assert mappings.fingerprint(text) != before


@pytest.mark.parametrize("data", [{"nvidia-108\n": ["c1:00.0"]}, {"nvidia-108": ["c1:00.0\n"]},
                                  {"nvidia-108": ["c1:00.0 "]}])
def test_the_schema_alone_refuses_whitespace(data):
    assert mappings.check_schema(data)


def test_the_schema_checks_keys_with_the_profile_grammar_of_pci():
    """One grammar: the schema's name pattern is profiles.NAME_KEY, anchored."""
    schema = json.loads(mappings.SCHEMA_FILE.read_text())
    assert {"pattern": f"^{profiles.NAME_KEY}$"} in schema["propertyNames"]["anyOf"]


def test_what_is_kept_is_named_address_by_address():
    assert mappings.kept({"nvidia-35": ("0000:84:00.0",), "nvidia-36": ("0000:85:00.0",)}) == (
        "nvidia-35 on 0000:84:00.0, nvidia-36 on 0000:85:00.0")
    vfs = tuple(f"0000:41:00.{n}" for n in range(4, 8)) + ("0000:41:01.0",)
    assert mappings.kept({"nvidia-474": vfs}) == (
        "nvidia-474 on 5 (0000:41:00.4, 0000:41:00.5, 0000:41:00.6, 0000:41:00.7 and 1 more)")
    # Queens to Train publish no addresses: Nova gives the type every GPU offering it.
    assert mappings.kept({"nvidia-108": ()}) == "nvidia-108 on every GPU offering it"


# -- passthrough: whole GPUs beside vGPUs (issue 37) ----------------------------------------

def test_passthrough_lists_whole_gpus_apart_from_the_types():
    result = mappings.check_text("{L40S-12Q: [81:00.0], passthrough: [c1:00.0, 00000000:A1:00.0]}")
    assert result.errors == ()
    assert result.mapping == {"L40S-12Q": ("0000:81:00.0",)}
    assert result.passthrough == ("0000:a1:00.0", "0000:c1:00.0")
    # Stored and read back (the charm's record of the checked text) with its whole GPUs.
    assert mappings.from_record(mappings.to_record(result)).passthrough == result.passthrough


def test_passthrough_alone_is_a_mapping():
    result = mappings.check_text("{passthrough: [c1:00.0]}")
    assert result.ok and result.mapping == {} and result.passthrough == ("0000:c1:00.0",)


@pytest.mark.parametrize("text,message", [
    ("{passthrough: all}", "passthrough: expected a list of whole GPUs' PCI addresses"),
    ("{passthrough: []}", "passthrough: lists no PCI address"),
    ("{passthrough: [c1:00.9]}", 'passthrough: "c1:00.9" is not a PCI address'),
    ("{Passthrough: [c1:00.0]}", 'type "Passthrough" is not a vGPU type id'),
])
def test_passthrough_refusals_name_the_entry(text, message):
    result = mappings.check_text(text)
    assert result.mapping == {} and result.passthrough == ()
    assert any(message in e for e in result.errors), result.errors
