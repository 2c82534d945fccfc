"""vgpu.upstream: the upstream charm's boot unit and scripts retired, on fixture hosts.

What the upstream charm leaves is built by unit_tests/upstream.py from its revision c87c8bf;
systemctl is the fake one (unit_tests/faketools.py), which records every call.
"""

import json
import logging

import pytest

from unit_tests import upstream as fixture
from vgpu import upstream
from vgpu.errors import ServiceError

UNIT = "systemd-mdev-workaround.service"
RESTORER = "nvidia-vgpu-vfs.service alone restores VFs and mdevs at boot"


@pytest.fixture
def left(root, tools):
    fixture.leave_files(root, {"nvidia-108": ["0000:c1:00.0"]})
    return root


def test_what_the_upstream_charm_leaves_is_found(left):
    assert upstream.found() == [upstream.UNIT_FILE, upstream.WANTS, *upstream.SCRIPTS]


def test_the_upstream_charm_ran_here_by_its_stored_state_or_its_files_not_its_blacklist(root):
    """What the nouveau blacklist's takeover asks (vgpu.kernel): a file of its name proves nothing."""
    stored = fixture.stored_state()
    blacklist = fixture.leave_blacklist(root)  # an operator may have written one of that name
    assert not upstream.ran(lambda key: False)
    assert upstream.ran(stored.__contains__)  # its StoredState, carried over by the switch
    assert set(stored) == set(upstream.STORED_KEYS)
    blacklist.unlink()  # leave_files writes it again
    fixture.leave_files(root, {"nvidia-108": ["0000:c1:00.0"]})
    assert upstream.ran(lambda key: False)  # its unit and scripts, not yet retired


def test_retire_disables_the_unit_before_anything_goes_then_reloads(left, tools, caplog):
    caplog.set_level(logging.INFO, logger="vgpu.upstream")
    notes = upstream.retire(RESTORER, {"nvidia-108": ("0000:c1:00.0",)})
    assert tools.calls() == [f"systemctl disable {UNIT}", "systemctl daemon-reload"]
    assert upstream.found() == []
    assert (left / "etc/systemd/system/multi-user.target.wants").is_dir()  # others' links stay
    said = (f"removed the upstream charm's {UNIT}, /opt/initialise_nova_mdevs.sh, "
            f"/opt/remediate-nova-mdevs: {RESTORER}")
    assert notes == [said]  # nvidia-108: no trait was set
    assert [r.getMessage() for r in caplog.records if r.name == "vgpu.upstream"] == [said]
    assert upstream.retire(RESTORER, {}) == []  # once: nothing left, nothing run
    assert len(tools.calls()) == 2


def test_a_failed_disable_removes_nothing(left, tools):
    tools.fail("disable", UNIT)
    with pytest.raises(ServiceError):
        upstream.retire(RESTORER, {})
    assert upstream.found() == [upstream.UNIT_FILE, upstream.WANTS, *upstream.SCRIPTS]


def test_scripts_left_alone_are_deleted_without_systemctl(root, tools):
    fixture.leave_files(root, {})
    (root / upstream.WANTS).unlink()
    (root / upstream.UNIT_FILE).unlink()
    assert upstream.retire(RESTORER, {}) == [
        f"removed the upstream charm's /opt/initialise_nova_mdevs.sh, /opt/remediate-nova-mdevs: "
        f"{RESTORER}"]
    assert tools.calls() == []
    assert upstream.found() == []


def test_a_dangling_link_goes_without_a_disable_systemctl_would_refuse(root, tools):
    fixture.leave_files(root, {})
    (root / upstream.UNIT_FILE).unlink()
    upstream.retire(RESTORER, {})
    assert tools.calls() == ["systemctl daemon-reload"]
    assert upstream.found() == []


def test_an_opt_that_is_a_link_is_not_followed(left, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    (left / "opt").rename(elsewhere)
    (left / "opt").symlink_to(elsewhere)
    with pytest.raises(OSError, match="symbolic link"):
        upstream.retire(RESTORER, {})
    assert sorted(p.name for p in elsewhere.iterdir()) == ["initialise_nova_mdevs.sh",
                                                           "remediate-nova-mdevs"]


def test_the_trait_is_said_only_where_the_old_script_set_it(root, tools):
    fixture.leave_files(root, {"nvidia-610": ["0000:84:00.0"], "nvidia-108": ["0000:c1:00.0"]})
    notes = upstream.retire(RESTORER, {"nvidia-610": ("0000:84:00.0",)})
    assert notes[1] == (
        "the upstream charm's boot script set trait CUSTOM_VGPU_PLACEMENT on the Placement "
        "providers of nvidia-610 (0000:84:00.0) at every boot; this charm leaves Placement "
        "alone: the trait stays on those providers, a provider made anew gets none "
        "(docs/how-to/switch-from-upstream.md)")
    fixture.leave_files(root, {"nvidia-108": ["0000:c1:00.0"], "nvidia-6100": ["0000:e1:00.0"]})
    assert len(upstream.retire(RESTORER, {"nvidia-610": ("0000:84:00.0",)})) == 1


@pytest.mark.parametrize("before,changed,said", [
    ({"services": json.dumps(["nvidia-vgpu-mgr"])}, {"services": "[]"}, True),
    ({"services": json.dumps(["nvidia-vgpu-mgr"])}, {}, False),  # not changed this hook
    ({"services": "[]"}, {"services": "[]"}, False),
    ({"services": "not json"}, {"services": "[]"}, False),
    ({}, {"services": "[]"}, False),
])
def test_the_service_leaving_nova_computes_list_is_said_when_it_leaves(before, changed, said):
    note = upstream.services_note(before, changed)
    assert (note == "nvidia-vgpu-mgr left nova-compute's services: its pause and "
                    "openstack-upgrade no longer stop it; this unit's pause and resume do") == said
    assert (note is None) != said


def test_left_in_place_the_old_unit_runs_at_boot_with_sriov_manage_on_all(root, tools):
    """What the switch must stop: the stand-ins run as systemd would start the old unit."""
    from unit_tests.fakehost import a100_host

    host = a100_host(root, gpus=2, vfs=4, enabled=False)
    host.install_sriov_manage()
    fixture.leave_files(root, {"nvidia-474": ["0000:41:00.4"]})
    assert [unit for unit, _ in fixture.start_at_boot(root)] == [UNIT]
    assert tools.calls()[:2] == ["initialise_nova_mdevs.sh", "sriov-manage -e srvio-manage -e ALL"]
