"""vgpu.text: what reaches a status line is printable, on one line, bounded, cause first."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vgpu import text

LOCKED = """\
dpkg: error: dpkg frontend lock was locked by another process with pid 4242
Note: removing the lock file is always wrong, can damage the locked area
and the entire system. See <https://wiki.debian.org/Teams/Dpkg/FAQ#db-lock>.
"""

NO_SPACE = """\
dpkg: warning: files list file for package 'x' missing; assuming package has no files
(Reading database ... 71234 files and directories currently installed.)
dpkg: error processing archive /var/lib/juju/agents/unit-nova-compute-nvidia-vgpu-0/resources/\
nvidia-vgpu-software/nvidia-vgpu-ubuntu-570_570.172.08_amd64.deb (--install):
 cannot copy extracted data for './usr/lib/x86_64-linux-gnu/libnvidia-vgpu.so.570.172.08' to \
'/usr/lib/x86_64-linux-gnu/libnvidia-vgpu.so.570.172.08.dpkg-new': failed to write \
(No space left on device)
dpkg-deb: error: paste subprocess was killed by signal (Broken pipe)
Errors were encountered while processing:
 /var/lib/juju/agents/unit-nova-compute-nvidia-vgpu-0/resources/nvidia-vgpu-software/x.deb
"""


def test_the_cause_comes_before_the_advice():
    cause = text.cause(LOCKED)
    assert cause.startswith("dpkg frontend lock was locked by another process")
    assert "4242" in cause and "wiki" not in cause


def test_an_error_text_of_the_c_library_survives_bounding_and_goes_first():
    cause = text.cause(NO_SPACE, limit=120)
    assert cause.startswith("No space left on device: ")
    assert len(cause) <= 120 and "\n" not in cause
    assert "warning" not in cause


def test_warnings_and_summaries_are_not_causes():
    assert text.cause("dpkg: warning: something odd\nErrors were encountered while processing:\n x\n") == ""
    assert text.cause("W: Possible missing firmware\nE: mkinitramfs failure cpio 141\n") == \
        "mkinitramfs failure cpio 141"


def test_details_under_a_heading_come_first():
    cause = text.cause("dpkg: dependency problems prevent configuration of pkg:\n"
                       " pkg depends on libfoo; however:\n  Package libfoo is not installed.\n")
    assert cause.startswith("pkg depends on libfoo; however: Package libfoo is not installed.")


@given(st.text())
def test_cause_and_one_line_are_always_printable_one_line_and_bounded(value):
    for out in (text.cause(value, 80), text.one_line(value, 80)):
        assert out.isprintable() and len(out) <= 80


@pytest.mark.parametrize("raw", [b"GRID V100\x00-8Q\n", b"\xff\xfe\x01name\n", b"ok\n"])
def test_decode_never_raises_and_leaves_no_control_bytes(raw):
    out = text.decode(raw)
    assert all(c.isprintable() or c in "\n\t" for c in out)


def test_one_line_is_cut_to_exactly_its_limit_with_an_ellipsis():
    assert text.one_line("x" * 50, 50) == "x" * 50
    assert text.one_line("x" * 51, 50) == "x" * 47 + "..."


def test_quote_escapes_and_bounds():
    assert text.quote("nvidia-108") == '"nvidia-108"'
    quoted = text.quote("a\nb\x00" + "x" * 100)
    assert quoted.startswith('"a\\nb\\u0000') and quoted.endswith('..."') and len(quoted) == 40


def test_listing():
    assert text.listing([]) == ""
    assert text.listing(["a", "b"]) == "a, b"
    assert text.listing(list("abcdef")) == "a, b, c, d and 2 more"


def test_an_upper_case_error_prefix_is_dropped_from_a_heading_too():
    assert text.cause("ERROR: cannot enable VFs:\n  IOMMU is off\n") == "IOMMU is off (cannot enable VFs)"


def test_a_c_library_error_said_twice_moves_its_last_mention_to_the_front():
    said = ("dpkg: error: copying a: No space left on device; copying b: No space left on device; "
            + "y" * 300)
    assert text.cause(said).startswith(
        "No space left on device: copying a: No space left on device; copying b: ; yyy")


def test_quote_keeps_a_value_of_exactly_its_limit_and_cuts_one_past_it():
    assert text.quote("x" * 38) == '"' + "x" * 38 + '"'  # 40 with its quotes: kept whole
    assert text.quote("x" * 39) == '"' + "x" * 35 + '..."'
    assert text.quote("x" * 8, limit=10) == '"' + "x" * 8 + '"'


def test_quote_says_a_value_that_is_not_text_as_its_text():
    assert text.quote(1139) == '"1139"'
    assert text.quote(None) == '"None"'
    assert text.quote(["a\nb"]) == '"[\'a\\\\nb\']"'


def test_a_cause_of_exactly_its_limit_is_left_as_it_is():
    said = "writing /var/lib/x: No space left on device"
    assert text.cause(said, limit=len(said)) == said  # nothing to bound: the order stays
    assert text.cause(said, limit=len(said) - 1) == "No space left on device: writing /var/l..."


def test_the_longest_c_library_error_in_a_cause_goes_first_not_one_it_contains():
    """"No such device" is in "No such device or address": the longer, the whole text, moves."""
    said = "opening /dev/vfio/12 for " + "y" * 60 + ": No such device or address"
    assert text.cause(said, limit=60) == (
        "No such device or address: opening /dev/vfio/12 for " + "y" * 5 + "...")
    # Of two errors the longer goes first, whatever their alphabetical order.
    said = "copying a: Permission denied; copying b: No space left on device; " + "y" * 100
    assert text.cause(said, limit=80) == (
        "No space left on device: copying a: Permission denied; copying b: ; " + "y" * 9 + "...")


def test_a_cause_that_starts_with_its_error_is_only_bounded():
    said = "No space left on device: " + "y" * 100
    assert text.cause(said, limit=40) == "No space left on device: " + "y" * 12 + "..."


def test_an_error_one_character_in_still_goes_first():
    said = "(No space left on device) while writing /var/lib/" + "y" * 60
    assert text.cause(said, limit=60).startswith("No space left on device: ")


def test_what_the_error_leaves_behind_loses_only_spaces_colons_and_brackets_at_its_end():
    said = "(writing) /srv/BOX (No space left on device)"  # 44 characters
    assert text.cause(said, limit=43) == "No space left on device: (writing) /srv/BOX"


def test_a_long_cause_without_a_c_library_error_is_cut_to_its_limit():
    assert text.cause("y" * 300, limit=50) == "y" * 47 + "..."
