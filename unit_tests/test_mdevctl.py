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


def test_update_status_retries_an_hour_after_the_failure_or_when_the_clock_went_back():
    failed = mdevctl.Failure(at=10_000.0, cause="apt-get install mdevctl failed: no")
    assert not mdevctl.retry_due(failed, 10_000.0)
    assert not mdevctl.retry_due(failed, 10_000.0 + 3599)
    assert mdevctl.retry_due(failed, 10_000.0 + 3600)
    assert mdevctl.retry_due(failed, 9_999.0)  # a failure "in the future" holds nothing off


def test_a_failure_is_kept_as_plain_data_and_an_unreadable_record_means_retry():
    failed = mdevctl.Failure(at=1234.5, cause="apt-get update failed: E: no network")
    assert mdevctl.from_record(mdevctl.to_record(failed)) == failed
    assert mdevctl.to_record(None) == {}
    assert mdevctl.from_record({}) is None
    assert mdevctl.from_record({"at": "yesterday", "cause": "x"}) is None
    assert mdevctl.from_record({"cause": "x"}) is None
