"""vgpu-device-mappings at its limits: sizes, nesting, schema bounds, YAML null.

Each test sits on a boundary (exactly at a limit and one past it), so that
moving the limit by one, in the code or the schema, fails a test.
"""

import pytest

from unit_tests.fakehost import A100_TYPES, FakeHost, MdevType
from vgpu import mappings, pci, releases

CARACAL = releases.from_major(29)
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
