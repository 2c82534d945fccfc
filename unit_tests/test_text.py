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
