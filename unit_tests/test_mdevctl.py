"""vgpu.mdevctl: present under the host root, or installed with apt (a fake apt-get on PATH)."""

import pytest

from unit_tests.faketools import stand_in
from vgpu import mdevctl
from vgpu.errors import InstallError


def apt_calls(tools):
    return [c for c in tools.calls() if c.startswith("apt-get")]


def test_needed_from_nova_30():
    assert [mdevctl.needed(n) for n in (17, 29, 30, 34)] == [False, False, True, True]


def test_present_is_not_asked_for_again(root, tools):
    stand_in(root / "usr/bin/mdevctl", "#!/bin/sh\n")
    assert mdevctl.present()
    assert mdevctl.ensure() is False
    assert apt_calls(tools) == []


def test_missing_is_installed(root, tools):
    assert not mdevctl.present()
    assert mdevctl.ensure() is True
    assert mdevctl.present()
    assert apt_calls(tools) == ["apt-get install --yes --no-install-recommends mdevctl"]


def test_a_file_that_is_not_executable_is_not_mdevctl(root, tools):
    (root / "usr/sbin").mkdir(parents=True)
    (root / "usr/sbin/mdevctl").write_text("")
    assert not mdevctl.present()


def test_apt_that_says_yes_without_installing_it_is_an_error(root, tools):
    stand_in(tools.bin / "apt-get", "#!/bin/sh\nexit 0\n")
    with pytest.raises(InstallError, match="apt-get installed mdevctl but /usr/sbin/mdevctl is "
                                           "not there"):
        mdevctl.ensure()
