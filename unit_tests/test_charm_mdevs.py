"""mdevs after a reboot on Nova before 30, through the charm (ops.testing).

Two V100s with guests holding mdevs: the charm records them on its hooks and
installs the boot unit; a reboot takes them away; the boot step (run here as
systemd would, on the data the charm wrote) creates them again; the next hook
finds everything as it was. On Nova 30 nothing is recorded.
"""

import json
import os
import shutil

from ops import testing

from unit_tests.fakehost import settle_mdevs, v100_host
from unit_tests.faketools import run_script
from unit_tests.libvirt import defined_guest, running_guest
from unit_tests.test_charm import install_driver, nova_conf, state
from vgpu import boot, mdevs, sriov

MGR, VGPUD = "nvidia-vgpu-mgr", "nvidia-vgpud"
C1, E1 = "0000:c1:00.0", "0000:e1:00.0"
M1, M2, M3 = (f"11111111-2222-4333-8444-00000000000{n}" for n in range(1, 4))
HELD = {M1: (C1, "nvidia-108"), M2: (C1, "nvidia-108"), M3: (E1, "nvidia-109")}
MAPPING = {"vgpu-device-mappings": "{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}"}


def guests(root, host):
    for n, (uuid, (parent, type_id)) in enumerate(HELD.items(), 1):
        host.add_mdev(parent, type_id, uuid)
        (defined_guest if n == 2 else running_guest)(
            root, f"instance-0000000{n}", f"aaaaaaaa-bbbb-4ccc-8ddd-00000000000{n}", mdev_uuid=uuid)


def where(root, uuid):
    settle_mdevs()
    device = root / "sys/bus/mdev/devices" / uuid
    if not os.path.lexists(device):
        return None
    real = device.resolve()
    return real.parent.name, (real / "mdev_type").resolve().name


def test_on_caracal_the_held_mdevs_are_recorded_and_come_back_after_a_reboot(
        ctx, v100, root, tools, packages):
    install_driver(root, packages["old"])
    guests(root, v100)
    out = ctx.run(ctx.on.config_changed(), state(MAPPING, resource=packages["old"]))
    assert out.unit_status.name == "active"
    published = nova_conf(out)
    record = json.loads((root / mdevs.FILE).read_text())["mdevs"]
    assert {m["uuid"]: (m["parent"], m["type"]) for m in record} == HELD
    # A V100 has no VFs: the boot unit is installed for the mdevs alone.
    assert sriov.unit_path().exists()
    assert f"systemctl enable {sriov.UNIT}" in tools.calls()
    assert json.loads(sriov.data_path().read_text())["gpus"] == []

    v100.reboot()
    assert [where(root, uuid) for uuid in HELD] == [None, None, None]
    assert boot.main([f"/{sriov.DATA_FILE}"]) == 0  # what the unit runs, before nova-compute
    assert {uuid: where(root, uuid) for uuid in HELD} == HELD
    out = ctx.run(ctx.on.update_status(), testing.State(
        config=MAPPING, relations=out.relations, resources=out.resources,
        stored_states=out.stored_states))
    assert out.unit_status.name == "active"
    assert nova_conf(out) == published
    assert json.loads((root / mdevs.FILE).read_text())["mdevs"] == record


def test_on_dalmatian_nothing_is_recorded_and_a_record_from_before_goes(ctx, root, tools,
                                                                        packages):
    host = v100_host(root, nova="3:30.0.0-0ubuntu1")
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    install_driver(root, packages["old"])
    guests(root, host)
    (root / mdevs.FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / mdevs.FILE).write_text(mdevs.render([mdevs.Mdev(M1, C1, "nvidia-108")]))
    out = ctx.run(ctx.on.config_changed(), state(MAPPING, resource=packages["old"]))
    assert out.unit_status.name == "active"
    assert not (root / mdevs.FILE).exists()
    assert not sriov.unit_path().exists()  # Nova persists the mdevs: nothing to restore


def test_a_record_that_cannot_be_written_blocks_and_says_why(ctx, v100, root, tools, packages):
    install_driver(root, packages["old"])
    guests(root, v100)
    (root / mdevs.FILE).mkdir(parents=True)  # a directory where the record belongs
    out = ctx.run(ctx.on.config_changed(), state(MAPPING, resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(
        f"cannot write /{mdevs.FILE}: Is a directory")
    assert nova_conf(out)  # the principal still gets its sections


def test_remove_deletes_the_record(ctx, v100, root, tools, packages):
    install_driver(root, packages["old"])
    guests(root, v100)
    out = ctx.run(ctx.on.config_changed(), state(MAPPING, resource=packages["old"]))
    assert (root / mdevs.FILE).exists()
    ctx.run(ctx.on.remove(), testing.State(config=MAPPING, relations=out.relations,
                                           stored_states=out.stored_states))
    assert not (root / mdevs.FILE).exists()
    assert not (root / mdevs.FILE).parent.exists()


LIGHT = """
import sys
from ops import testing
from charm import NovaComputeNvidiaVgpuCharm
ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
out = ctx.run(ctx.on.update_status(), testing.State(
    config={"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"},
    relations=[testing.SubordinateRelation("nova-vgpu")],
    resources={testing.Resource(name="nvidia-vgpu-software", path=sys.argv[1])}))
print(out.unit_status.name, "xml.etree.ElementTree" in sys.modules)
"""


def test_update_status_with_guests_holding_no_device_parses_no_xml(v100, root, tools, packages,
                                                                   tmp_path):
    install_driver(root, packages["old"])
    running_guest(root, "instance-00000001", "aaaaaaaa-bbbb-4ccc-8ddd-000000000001")
    result = run_script(tmp_path, LIGHT, str(packages["old"]))
    assert result.stdout.split()[-2:] == ["active", "False"]
    assert not (root / mdevs.FILE).exists()


def test_mdevs_the_boot_step_could_not_restore_are_the_next_hooks_work_or_named(
        ctx, v100, root, tools, packages, monkeypatch):
    """No hook used to create them: a boot step that gave up on the lock left guests unstartable."""
    from unit_tests.faketools import host_lock_held
    from vgpu import hostlock

    install_driver(root, packages["old"])
    guests(root, v100)
    out = ctx.run(ctx.on.config_changed(), state(MAPPING, resource=packages["old"]))
    v100.reboot()
    monkeypatch.setattr(hostlock, "BOOT_WAIT", 0.2)
    with host_lock_held(root / hostlock.FILE):  # a hook held it past the boot step's wait
        assert boot.main([f"/{sriov.DATA_FILE}"]) == 1
    assert [where(root, uuid) for uuid in HELD] == [None, None, None]
    carried = testing.State(config=MAPPING, relations=out.relations, resources=out.resources,
                            stored_states=out.stored_states)
    out = ctx.run(ctx.on.update_status(), carried)
    assert {uuid: where(root, uuid) for uuid in HELD} == HELD  # the hook did the boot step's work
    assert out.unit_status.name == "active", out.unit_status
    # One that cannot come back (its type gone from the parent) is named, on every hook.
    v100.reboot()
    shutil.rmtree(root / "sys/bus/pci/devices" / E1 / "mdev_supported_types/nvidia-109")
    out = ctx.run(ctx.on.update_status(), carried)
    assert where(root, M3) is None
    assert out.unit_status == testing.BlockedStatus(
        f"after this boot, a hook could not create again the mdev {M3} (nvidia-109 on {E1}: {E1} "
        "no longer offers nvidia-109 (it offers nvidia-105, nvidia-106, nvidia-107, nvidia-108)) "
        "that instances hold: they cannot "
        "start until it is there; journalctl -u nvidia-vgpu-vfs.service says why; systemctl "
        "restart nvidia-vgpu-vfs.service tries again")
    out = ctx.run(ctx.on.update_status(), carried)
    assert out.unit_status.name == "blocked"
