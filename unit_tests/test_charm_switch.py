"""``juju refresh --switch`` from the upstream charm, event by event, with ops.testing.

Each host is seeded with what the upstream charm leaves (unit_tests/upstream.py, from
openstack/charm-nova-compute-nvidia-vgpu at c87c8bf): its boot unit and /opt scripts, its
nouveau blacklist, its relation data and its StoredState, with guests running. Juju then runs
upgrade-charm on this charm. test_dispatch.py drives the same switch on the packed charm,
then reboots the host.
"""

import json

import pytest
from ops import testing

from unit_tests import principal, upstream
from unit_tests.fakehost import a100_host
from unit_tests.libvirt import running_guest
from vgpu import kernel, mdevs, sriov
from vgpu import upstream as leftovers

MGR = "nvidia-vgpu-mgr"
DEB = []  # the package the upstream charm installed (set by the fixtures)
C1, E1 = "0000:c1:00.0", "0000:e1:00.0"
MAPPING = {"nvidia-108": [C1], "nvidia-109": [E1]}
OPTION = "{'nvidia-108': ['0000:c1:00.0'], 'nvidia-109': ['0000:e1:00.0']}"
MDEV = "5b1c3e2a-8d4f-4a6b-9c7d-0e1f2a3b4c5d"
VM = "22222222-2222-4222-8222-222222222222"
ACTIVE = ("2 GPUs (Tesla V100 PCIe 16GB), nvidia-108 on 1, nvidia-109 on 1; "
          "nvidia-108: 1 used, 1 free; nvidia-109: 0 used, 1 free")
REMOVED = ("removed the upstream charm's systemd-mdev-workaround.service, "
           "/opt/initialise_nova_mdevs.sh, /opt/remediate-nova-mdevs: nvidia-vgpu-vfs.service "
           "alone restores VFs and mdevs at boot, for the GPUs vgpu-device-mappings selects")
SERVICES = ("nvidia-vgpu-mgr left nova-compute's services: its pause and openstack-upgrade no "
            "longer stop it; this unit's pause and resume do")


def switched(mapping=MAPPING, option=OPTION, paused=False, resource=None):
    """The unit right after ``juju refresh --switch``: upstream's data and StoredState.

    The driver package upstream installed stays attached (``resource``, default the one
    installed by the fixtures below).
    """
    resource = resource or DEB[0]
    return testing.State(
        resources={testing.Resource(name="nvidia-vgpu-software", path=resource)},
        config={"vgpu-device-mappings": option},
        relations=[testing.SubordinateRelation(
            "nova-vgpu", remote_app_name="nova-compute",
            local_unit_data=upstream.relation_data(mapping))],
        stored_states={testing.StoredState(
            owner_path=upstream.CHARM_CLASS, name=upstream.STORED_ATTRIBUTE,
            content=upstream.stored_state(resource, paused=paused))})


def ours(out):
    rel = out.get_relations("nova-vgpu")[0]
    return {k: v for k, v in rel.local_unit_data.items()
            if k in ("subordinate_configuration", "services", "releases-packages-map")}


@pytest.fixture
def old_host(v100, root, packages, tools):
    """Two V100s under the upstream charm: its driver, files, and a guest holding an mdev."""
    from vgpu import driver

    driver.install(driver.inspect_deb(packages["old"]))
    DEB[:] = [packages["old"]]
    upstream.leave_files(root, MAPPING)
    v100.add_mdev(C1, "nvidia-108", MDEV)
    # What the driver shows with one of the two V100-8Q created.
    (root / f"sys/bus/pci/devices/{C1}/mdev_supported_types/nvidia-108/available_instances"
     ).write_text("1\n")
    running_guest(root, "instance-00000007", VM, mdev_uuid=MDEV)
    tools.log.write_text("")
    return v100


def said(ctx, text):
    return [line.message for line in ctx.juju_log if text in line.message]


def test_upgrade_charm_retires_the_old_boot_unit_once_ours_is_in_place(ctx, old_host, root,
                                                                       tools):
    out = ctx.run(ctx.on.upgrade_charm(), switched())
    assert leftovers.found() == []
    assert not (root / "opt/initialise_nova_mdevs.sh").exists()
    calls = tools.calls()
    assert "systemctl disable systemd-mdev-workaround.service" in calls
    assert calls.index("systemctl disable systemd-mdev-workaround.service") > \
        calls.index("systemctl enable nvidia-vgpu-vfs.service")  # ours first, then theirs goes
    assert sriov.unit_path().is_file()
    # The guest's mdev is recorded for the boot step: Nova 29 does not keep it.
    assert [(m.uuid, m.parent, m.type_id) for m in mdevs.load()] == [(MDEV, C1, "nvidia-108")]
    # Said once: in this hook's status and the log.
    assert out.unit_status == testing.ActiveStatus(f"{ACTIVE}; {SERVICES}; {REMOVED}")
    assert said(ctx, "removed the upstream charm's") == [REMOVED]
    again = ctx.run(ctx.on.update_status(), out)
    assert again.unit_status == testing.ActiveStatus(ACTIVE)
    assert len(said(ctx, "removed the upstream charm's")) == 1


def test_nova_compute_gets_this_charms_services_and_packages(ctx, old_host, root):
    before = upstream.relation_data(MAPPING)
    assert principal.services(before) == {MGR}
    assert list(json.loads(before["releases-packages-map"])) == ["caracal"]
    out = ctx.run(ctx.on.upgrade_charm(), switched())
    data = ours(out)
    assert principal.services(data) == set()  # nova-compute's pause leaves the manager alone
    assert json.loads(data["releases-packages-map"]) == {
        "queens": {"deb": {"install": ["nvidia-vgpu-ubuntu-570"], "purge": []}}}
    for release in ("queens", "train", "yoga"):  # what this charmhelpers knows
        assert principal.release_packages(data, release).install == {"nvidia-vgpu-ubuntu-570"}
    conf = principal.render_nova_conf(principal.nova_context(data))
    assert "[devices]\nenabled_mdev_types = nvidia-108,nvidia-109\n" in conf
    assert f"[mdev_nvidia-108]\ndevice_addresses = {C1}\n" in conf


def test_the_old_unit_stays_while_it_is_the_only_restorer(ctx, root, tools, packages):
    """An A100 (SR-IOV) whose VFs must come back at boot, and this charm's unit cannot be written."""
    from vgpu import driver

    host = a100_host(root, vfs=4)
    tools.set_active(MGR)
    driver.install(driver.inspect_deb(packages["old"]))
    DEB[:] = [packages["old"]]
    host.install_sriov_manage()
    vf = "0000:41:00.4"
    upstream.leave_files(root, {"nvidia-474": [vf]})
    sriov.unit_path().mkdir(parents=True)  # a directory where the unit belongs: not written
    option = "{'nvidia-474': ['0000:41:00.4']}"
    out = ctx.run(ctx.on.upgrade_charm(), switched({"nvidia-474": [vf]}, option))
    assert sorted(leftovers.found()) == sorted([leftovers.UNIT_FILE, leftovers.WANTS,
                                                *leftovers.SCRIPTS])
    assert "systemctl disable systemd-mdev-workaround.service" not in tools.calls()
    assert out.unit_status.name == "blocked"
    message = out.unit_status.message  # sriov's words: "cannot read" or "cannot write"
    assert message.startswith("nvidia-vgpu-vfs.service: cannot "), message
    assert message.endswith(" /etc/systemd/system/nvidia-vgpu-vfs.service: Is a directory")
    assert said(ctx, "keeping the upstream charm's") == [
        "keeping the upstream charm's systemd-mdev-workaround.service until "
        "nvidia-vgpu-vfs.service is in place: it is the only unit that restores VFs and mdevs "
        "at boot"]
    sriov.unit_path().rmdir()  # fixed: the next hook writes ours and retires theirs
    out = ctx.run(ctx.on.update_status(), out)
    assert leftovers.found() == []
    assert sriov.unit_path().is_file()
    assert out.unit_status.message.endswith(REMOVED)


def test_the_old_unit_stays_while_the_mdevs_guests_hold_cannot_be_recorded(ctx, old_host, root,
                                                                           tmp_path):
    """V100s (no SR-IOV) on Nova 29: only a record of the guest's mdev brings this charm's unit.

    While the record cannot be written, the old unit is the one thing that creates the
    guest's mdev again at the next boot: it is not removed on the guess that nothing needs it.
    """
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    (root / mdevs.FILE).parent.symlink_to(elsewhere)  # the record cannot be written
    out = ctx.run(ctx.on.upgrade_charm(), switched())
    assert not mdevs.kept() and not sriov.unit_path().exists()
    assert sorted(leftovers.found()) == sorted([leftovers.UNIT_FILE, leftovers.WANTS,
                                                *leftovers.SCRIPTS])
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith(f"cannot write /{mdevs.FILE}: ")
    (root / mdevs.FILE).parent.unlink()  # fixed: the next hook records, writes ours, retires theirs
    out = ctx.run(ctx.on.update_status(), out)
    assert mdevs.kept() and sriov.unit_path().is_file()
    assert leftovers.found() == []
    assert out.unit_status.message.endswith(REMOVED)


def test_the_old_unit_stays_while_ours_cannot_be_enabled(ctx, old_host, root, tools):
    """Ours written but not enabled would not run at boot: it is not in place yet."""
    tools.fail("enable", sriov.UNIT)
    out = ctx.run(ctx.on.upgrade_charm(), switched())
    assert len(leftovers.found()) == 4
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith(f"{sriov.UNIT}: systemctl enable {sriov.UNIT} failed")
    (tools.state / f"{sriov.UNIT}.fail-enable").unlink()  # fixed: the next hook enables ours
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), out)
    assert f"systemctl enable {sriov.UNIT}" in tools.calls()[calls:]
    assert leftovers.found() == []
    assert out.unit_status.message.endswith(REMOVED)


def test_a_failed_disable_leaves_the_old_unit_whole_and_blocks(ctx, old_host, root, tools):
    tools.fail("disable", "systemd-mdev-workaround.service")
    out = ctx.run(ctx.on.upgrade_charm(), switched())
    assert (root / leftovers.UNIT_FILE).is_file() and (root / leftovers.REMEDIATE_SCRIPT).is_file()
    assert out.unit_status == testing.BlockedStatus(
        "cannot remove the upstream charm's systemd-mdev-workaround.service: systemctl disable "
        "systemd-mdev-workaround.service failed: Failed to disable systemd-mdev-workaround.service"
        ".service: Unit systemd-mdev-workaround.service.service not loaded.; at boot it still runs "
        "sriov-manage -e on every GPU and creates mdevs beside this charm; retrying on the next "
        "hook")


def test_a_unit_paused_under_the_upstream_charm_stays_paused_until_resume(ctx, old_host, root,
                                                                            tools):
    tools.set_active(MGR, False)  # its pre-series-upgrade stopped, disabled and masked it
    tools.set_state(f"{MGR}.enabled", "masked")
    out = ctx.run(ctx.on.upgrade_charm(), switched(paused=True))
    assert out.unit_status == testing.MaintenanceStatus(
        "paused: vGPU services stopped; juju run nova-compute-nvidia-vgpu/0 resume to start them")
    assert not [c for c in tools.calls() if c.startswith(("systemctl start", "systemctl unmask"))]
    assert said(ctx, "paused under the upstream charm") == [
        "paused under the upstream charm: nvidia-vgpu-mgr stays stopped until juju run "
        "nova-compute-nvidia-vgpu/0 resume"]
    stored = next(s for s in out.stored_states if s.owner_path == upstream.CHARM_CLASS).content
    assert (stored["paused"], stored["masked"], stored["is_paused"]) == (True, [MGR], False)
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status.name == "maintenance"  # still paused: nothing resumed it
    tools.log.write_text("")
    out = ctx.run(ctx.on.action("resume"), out)
    assert ctx.action_results == {"started": MGR}
    assert f"systemctl unmask {MGR}" in tools.calls()
    assert ctx.run(ctx.on.update_status(), out).unit_status.name == "active"
    assert len(said(ctx, "paused under the upstream charm")) == 1  # read once, then cleared


def test_a_mapping_upstream_took_but_wrong_for_the_host_keeps_its_sections(ctx, old_host, root):
    wrong = {"nvidia-35": [C1], "nvidia-36": [E1]}  # types a V100 does not offer
    before = upstream.relation_data(wrong)
    out = ctx.run(ctx.on.upgrade_charm(),
                  switched(wrong, "{'nvidia-35': ['0000:c1:00.0'], 'nvidia-36': ['0000:e1:00.0']}"))
    assert out.unit_status.name == "blocked"
    message = out.unit_status.message
    assert message.startswith("vgpu-device-mappings: nvidia-35: ")
    assert message.endswith("; keeping nvidia-35 on 0000:c1:00.0, nvidia-36 on 0000:e1:00.0")
    assert ours(out)["subordinate_configuration"] == before["subordinate_configuration"]
    # The rest is this charm's already: no service for nova-compute's pause.
    assert principal.services(ours(out)) == set()


def test_the_trait_the_old_script_set_is_said_before_its_script_goes(ctx, v100, root, packages):
    DEB[:] = [packages["old"]]
    upstream.leave_files(root, {"nvidia-610": ["0000:84:00.0"], "nvidia-108": [C1]})
    ctx.run(ctx.on.upgrade_charm(), switched({"nvidia-610": ["0000:84:00.0"]}))
    assert said(ctx, "CUSTOM_VGPU_PLACEMENT") == [
        "the upstream charm's boot script set trait CUSTOM_VGPU_PLACEMENT on the Placement "
        "providers of nvidia-610 (0000:84:00.0) at every boot; this charm leaves Placement "
        "alone: the trait stays on those providers, a provider made anew gets none "
        "(docs/how-to/switch-from-upstream.md)"]
    assert leftovers.found() == []


def test_one_nouveau_blacklist_and_no_initramfs_rebuild(ctx, old_host, root, tools):
    ctx.run(ctx.on.upgrade_charm(), switched())
    assert not (root / leftovers.BLACKLIST).exists()
    assert kernel.blacklist_path().read_text().count("blacklist nouveau") == 1
    assert "update-initramfs -u" not in tools.calls()


def test_an_operators_own_disable_nouveau_conf_stays_where_the_upstream_charm_never_ran(
        ctx, v100, root, tools, packages):
    """Same name and lines as upstream's, but no StoredState, unit or script of it: not ours."""
    from unit_tests.test_charm import state

    theirs = upstream.leave_blacklist(root)  # the operator's, before this charm came
    out = ctx.run(ctx.on.install(), state(resource=packages["old"]))
    assert theirs.read_text() == upstream.BLACKLIST_TEXT
    assert kernel.blacklist_path().read_text().count("blacklist nouveau") == 1
    assert "update-initramfs -u" not in tools.calls()  # the two say the same: nothing changed
    ctx.run(ctx.on.remove(), out)
    assert theirs.read_text() == upstream.BLACKLIST_TEXT
    assert not kernel.blacklist_path().exists()
    assert "update-initramfs -u" not in tools.calls()  # theirs still says it all


def test_the_upstream_blacklist_is_taken_over_on_its_stored_state_alone(ctx, v100, root, tools,
                                                                        packages):
    """Its unit and scripts gone (retired, or never started), its StoredState says it ran here."""
    theirs = upstream.leave_blacklist(root)
    DEB[:] = [packages["old"]]
    ctx.run(ctx.on.upgrade_charm(), switched())
    assert not theirs.exists()
    assert kernel.blacklist_path().read_text().count("blacklist nouveau") == 1
    assert "update-initramfs -u" not in tools.calls()


def test_remove_takes_what_the_upstream_charm_left_too(ctx, old_host, root, tools):
    """Removed before any hook could retire it: the application's removal takes it all."""
    out = ctx.run(ctx.on.remove(), switched())
    assert out.unit_status.name == "maintenance"
    assert leftovers.found() == []
    assert not (root / leftovers.BLACKLIST).exists()
    assert tools.calls().count("update-initramfs -u") == 1


def test_this_charm_keeps_its_stored_state_where_the_upstream_charm_kept_its(ctx, root):
    """ops keeps StoredState at <charm class>/StoredStateData[<attribute>].

    Both charms name both alike, so the upstream charm's is this charm's (unit_tests/upstream.py
    builds its path with ops' own Handle from upstream's class and attribute names).
    """
    with ctx(ctx.on.update_status(), testing.State()) as manager:
        assert manager.charm._stored._data.handle.path == upstream.handle_path()
    assert upstream.handle_path() == "NovaComputeNvidiaVgpuCharm/StoredStateData[_stored]"


def test_a_type_the_upstream_charm_published_second_is_guarded_under_its_guests(ctx, v100, root,
                                                                                  packages):
    """Its ", " put a space before nvidia-109: read as published, a guest's type is protected."""
    from vgpu import driver

    driver.install(driver.inspect_deb(packages["old"]))
    DEB[:] = [packages["old"]]
    upstream.leave_files(root, MAPPING)
    v100.add_mdev(E1, "nvidia-109", MDEV)
    running_guest(root, "instance-00000007", VM, mdev_uuid=MDEV)
    before = upstream.relation_data(MAPPING)
    out = ctx.run(ctx.on.upgrade_charm(), switched(option="{nvidia-108: [c1:00.0, e1:00.0]}"))
    assert out.unit_status == testing.BlockedStatus(
        f"vgpu-device-mappings not applied: instance-00000007 (vm-instance-00000007, {VM}) holds "
        f"an nvidia-109 mdev ({MDEV}) on GPU {E1}, which the new mapping takes away; restore the "
        "mapping, or move or delete the instance first; keeping nvidia-108 on 0000:c1:00.0, "
        "nvidia-109 on 0000:e1:00.0")
    assert ours(out)["subordinate_configuration"] == before["subordinate_configuration"]
