"""vgpu.releases: the OpenStack release read from nova-common's version."""

import re

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from vgpu import releases
from vgpu.errors import UnsupportedReleaseError


@pytest.mark.parametrize("version,shown", [
    ("2:17.0.13-0ubuntu1", "queens (Nova 17)"),  # series and codename are one word: said once
    ("20.6.0", "train (Nova 20)"),
    ("3:29.0.0-0ubuntu1~cloud0", "2024.1 caracal (Nova 29)"),
    ("3:31.1.0-0ubuntu1", "2025.1 epoxy (Nova 31)"),
    ("3:40.0.0-0ubuntu1", "2026.2 hibiscus (Nova 40)"),  # newer than known: the newest format
])
def test_the_release_is_named_from_nova_commons_version(version, shown):
    release = releases.from_version(version)
    assert str(release) == shown
    assert release.nova_major == int(version.split(":")[-1].split(".")[0])


@pytest.mark.parametrize("version", ["", "garbage", "3:", "3:x.0", "29"])
def test_an_unreadable_version_names_itself(version):
    with pytest.raises(UnsupportedReleaseError) as error:
        releases.from_version(version)
    assert str(error.value) == f"cannot read Nova's release from version {version!r}"


@given(st.text(alphabet="0123456789:.-~+²٣abx ", max_size=12))
@example("1.2:3.4")
@example("²9.0")
@example("3:²9.0")
@example("0:3:29.0")
def test_the_major_is_the_number_after_an_epoch_and_before_the_first_dot(version):
    """As dpkg's ``[epoch:]upstream``: ASCII digits only, the epoch optional."""
    match = re.match(r"(?:[0-9]+:)?([0-9]+)\.", version)
    if match is None:
        with pytest.raises(UnsupportedReleaseError):
            releases.from_version(version)
    elif int(match.group(1)) < releases.OLDEST:
        with pytest.raises(UnsupportedReleaseError, match="older than"):
            releases.from_version(version)
    else:
        assert releases.from_version(version).nova_major == int(match.group(1))


def test_installed_reads_dpkgs_answer_when_not_given_it(root):
    from unit_tests.fakehost import FakeHost
    host = FakeHost(root)
    assert releases.installed() is None  # no nova-common yet
    host.nova("3:29.0.0-0ubuntu1")
    release = releases.installed()
    assert (str(release), release.nova_version) == ("2024.1 caracal (Nova 29)", "3:29.0.0-0ubuntu1")
    host.dpkg_status({"nova-common": "3:31.0.0-0ubuntu1"}, states={"nova-common": "half-configured"})
    assert releases.installed() is None  # mid-upgrade: not a release to configure for yet
    host.dpkg_status({"nova-common": "3:31.0.0-0ubuntu1", "nova-compute": "3:29.0.0-0ubuntu1"})
    assert str(releases.installed()) == "2025.1 epoxy (Nova 31)"  # nova-common's, no other's
