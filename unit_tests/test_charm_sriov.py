"""SR-IOV GPUs through the charm (ops.testing), on both NVIDIA frameworks.

Hosts: an A100 with 16 VFs offering mdev types; an L40S plus an H200 on the
vendor-specific VFIO framework (the fixture's kernel model shrinks each VF's
creatable_vgpu_types as siblings take types); and both after a reboot, with no
VFs until the stand-in sriov-manage creates them; then hosts as public
transcripts show them: four RTX PRO 6000 in PCI domains 0000 and 0001, an
L40S on two driver branches. Checked: the relation data as nova-compute
renders it, the current_vgpu_type files, the systemd unit, the sriov-manage
and systemctl calls.
"""

import json
import os
import time

import pytest
from ops import testing

from unit_tests import debs, principal
from unit_tests.fakehost import (
    RTX_PRO_6000_TYPES,
    a100_host,
    l40s_branch_host,
    l40s_host,
    rtx_pro_6000_host,
)
from unit_tests.libvirt import running_guest
from unit_tests.test_charm import install_driver, nova_conf, ours, relation, state
from vgpu import catalogue, sriov

MGR = "nvidia-vgpu-mgr"
RTX_TYPES = {str(n): t for n, t in RTX_PRO_6000_TYPES.items()}
L40S, H200 = "0000:81:00.0", "0000:c1:00.0"


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    return debs.host_driver(tmp_path_factory.mktemp("debs"))


def vfs(pf: str, count: int, first: int = 0):
    return [f"{pf[:-4]}{(4 + n) // 8:02x}.{(4 + n) % 8}" for n in range(first, first + count)]


def current(root, address: str) -> int:
    return int((root / f"sys/bus/pci/devices/{address}/nvidia/current_vgpu_type").read_text())


def types_of(root, pf: str, count: int):
    return [current(root, a) for a in vfs(pf, count)]


def ready(host, root, tools, deb):
    """The driver installed (real dpkg), its daemon up, the stand-in sriov-manage in place."""
    install_driver(root, deb)
    host.install_sriov_manage()
    tools.set_active(MGR)
    tools.set_active("nvidia-vgpud")
    return host


def again(out, config=None):
    """The next hook, with what the last one left."""
    return testing.State(config=config if config is not None else dict(out.config),
                         relations=out.relations, resources=out.resources,
                         stored_states=out.stored_states)


@pytest.fixture
def vfio(root, tools, deb):
    return ready(l40s_host(root), root, tools, deb)


MAPPING = "{L40S-12Q: all, 'NVIDIA H200X-35C': ['c1:00.0']}"


# -- vendor-specific VFIO -------------------------------------------------------------

def test_vfio_types_are_written_and_published_as_pci_devices(ctx, vfio, root, tools, deb):
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (1 H200 SXM 141GB, 1 L40S), CUSTOM_VGPU_H200X_35C on 4, CUSTOM_VGPU_L40S_12Q on 4; "
        "CUSTOM_VGPU_H200X_35C: 0 used, 4 free; CUSTOM_VGPU_L40S_12Q: 0 used, 4 free")
    # 48 GB / 12 GB: four L40S VFs hold L40S-12Q, in virtfn order; the rest stay free.
    assert types_of(root, L40S, 6) == [1139, 1139, 1139, 1139, 0, 0]
    assert types_of(root, H200, 5) == [1282, 1282, 1282, 1282, 0]
    specs = [json.loads(v) for k, v in principal.nova_context(ours(out))["sections"]["pci"]
             if k == "device_spec"]
    assert specs[0] == {"vendor_id": "10de", "product_id": "26b9", "address": "0000:81:00.4",
                        "managed": "no", "resource_class": "CUSTOM_VGPU_L40S_12Q"}
    assert [s["address"] for s in specs] == vfs(L40S, 4) + vfs(H200, 4)
    assert {s["product_id"] for s in specs[4:]} == {"2335"}
    conf = nova_conf(out)
    assert conf.count("device_spec = ") == 8
    # Keys in one order, always: the same host renders the same bytes, so
    # nova-compute never restarts for a reordered line.
    assert ('device_spec = {"address": "0000:81:00.4", "managed": "no", "product_id": "26b9", '
            '"resource_class": "CUSTOM_VGPU_L40S_12Q", "vendor_id": "10de"}\n') in conf
    assert "report_in_placement" not in conf  # pci-in-placement is off by default
    assert "[devices]" not in conf
    # The boot unit brings the VFs and their types back after a reboot.
    unit = sriov.unit_path().read_text()
    boot = json.loads(sriov.data_path().read_text())
    assert [(g["address"], [v["name"] for v in g["vfs"]]) for g in boot["gpus"]] == [
        (L40S, ["NVIDIA L40S-12Q"] * 4), (H200, ["NVIDIA H200X-35C"] * 4)]
    assert "Before=nova-compute.service libvirtd.service virtqemud.service " \
        "libvirt-guests.service" in unit
    assert "After=nvidia-vgpu-mgr.service" in unit
    assert ["systemctl daemon-reload", f"systemctl enable {sriov.UNIT}"] == [
        c for c in tools.calls() if c.startswith(("systemctl daemon", "systemctl enable"))]
    # What was learnt while the VFs were free.
    learnt = json.loads((root / catalogue.FILE).read_text())
    assert learnt["0x26b9 570.158.02"]["1139"] == "NVIDIA L40S-12Q"


def test_a_full_gpu_stays_served_on_later_hooks_without_writing(ctx, vfio, root, tools, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    calls = len(tools.calls())
    unit = sriov.unit_path().stat().st_mtime_ns
    out = ctx.run(ctx.on.update_status(), again(first))
    # The L40S lists nothing creatable now; the learnt names still resolve L40S-12Q.
    assert (root / f"sys/bus/pci/devices/{vfs(L40S, 1, 5)[0]}/nvidia/creatable_vgpu_types"
            ).read_text() == "ID    : vGPU Name\n"
    assert ours(out) == ours(first)
    assert out.unit_status == first.unit_status
    assert sriov.unit_path().stat().st_mtime_ns == unit
    assert [c for c in tools.calls()[calls:] if not c.startswith("systemctl is-")] == []


def test_a_new_profile_releases_the_vfs_first_then_fills_them_again(ctx, vfio, root, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    # 24Q fits twice; it was only creatable once the four 12Q VFs were released.
    assert types_of(root, L40S, 5) == [1141, 1141, 0, 0, 0]
    assert types_of(root, H200, 5) == [0, 0, 0, 0, 0]  # no longer mapped: released
    boot = json.loads(sriov.data_path().read_text())  # the next boot brings back the new plan
    # `all` selects the H200 too (its VFs are enabled at boot), though it offers no L40S-24Q.
    assert [(g["address"], [v["name"] for v in g["vfs"]]) for g in boot["gpus"]] == [
        (L40S, ["NVIDIA L40S-24Q"] * 2), (H200, [])]
    assert [json.loads(v)["resource_class"] for k, v in
            principal.nova_context(ours(out))["sections"]["pci"] if k == "device_spec"] == \
        ["CUSTOM_VGPU_L40S_24Q"] * 2
    # The log says what each hook did to each VF: free VFs are written, never "released" first.
    said = [line.message for line in ctx.juju_log if line.message.startswith("vGPU type ")]
    assert said == (
        [f"vGPU type {a}: nvidia-1139" for a in vfs(L40S, 4)]
        + [f"vGPU type {a}: nvidia-1282" for a in vfs(H200, 4)]
        + [f"vGPU type {a}: released nvidia-1139" for a in vfs(L40S, 4)]
        + [f"vGPU type {a}: released nvidia-1282" for a in vfs(H200, 4)]
        + [f"vGPU type {a}: nvidia-1141" for a in vfs(L40S, 2)])


def test_vfs_held_outside_the_plan_are_released_before_the_writes(ctx, vfio, root, deb):
    first = ctx.run(ctx.on.update_status(), state(resource=deb))  # learns the free lists
    # Someone gave the last L40S VF a 24Q by hand: VF 0 now lists only 24Q.
    (root / f"sys/bus/pci/devices/{vfs(L40S, 1, 15)[0]}/nvidia/current_vgpu_type").write_text("1141\n")
    assert "1139" not in (root / "sys/bus/pci/devices/0000:81:00.4/nvidia/creatable_vgpu_types"
                          ).read_text()
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-12Q: ['81:00.4']}"}))
    assert current(root, vfs(L40S, 1, 15)[0]) == 0
    assert current(root, "0000:81:00.4") == 1139
    assert out.unit_status.name == "active"


def test_a_type_never_seen_free_is_not_guessed(ctx, vfio, root, deb):
    (root / f"sys/bus/pci/devices/{vfs(L40S, 1, 15)[0]}/nvidia/current_vgpu_type").write_text("1141\n")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: ['81:00.4']}"},
                                                 resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings: L40S-12Q: 0000:81:00.0 (L40S) offers no vGPU type of that name; "
        "it offers L40S-24Q")
    assert current(root, "0000:81:00.4") == 0


def test_the_driver_refusing_a_type_blocks_and_publishes_nothing(ctx, vfio, root, deb):
    vfio.vfio_model(L40S).refuse.add("0000:81:00.5")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                 resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "VF 0000:81:00.5 holds 0 after writing 1139; every VF has its previous type back, as "
        "nova.conf lists them; retrying on the next hook")
    assert types_of(root, L40S, 2) == [0, 0]  # VF 0's write was undone
    assert "subordinate_configuration" not in ours(out)


def test_a_vf_list_with_bytes_that_are_not_utf8_is_still_read(ctx, vfio, root, deb):
    # The L40S's lists stay as written here, not recomputed by the fixture's kernel model.
    vfio.vfio_model(L40S).frozen = True
    listed = root / "sys/bus/pci/devices" / vfs(L40S, 1)[0] / "nvidia/creatable_vgpu_types"
    listed.write_bytes(listed.read_bytes().replace(b"L40S-48Q", b"L40S-48Q\xff"))
    assert b"\xff" in listed.read_bytes()
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    assert types_of(root, L40S, 1) == [1139]


def test_a_vf_that_lists_other_types_names_each_of_them(ctx, vfio, root, deb):
    vfio.vfio_model(L40S).frozen = True  # VF 2's list stays as written below
    (root / "sys/bus/pci/devices/0000:81:00.6/nvidia/creatable_vgpu_types").write_text(
        "ID    : vGPU Name\n1134  : NVIDIA L40S-2B\n1136  : NVIDIA L40S-4Q\n")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                 resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "VF 0000:81:00.6 cannot take nvidia-1139 now: it lists nvidia-1134, nvidia-1136; "
        "every VF has its previous type back, as nova.conf lists them; retrying on the next hook")


def test_each_vf_list_is_read_again_right_before_its_write(ctx, vfio, root, deb):
    # The driver lists nothing on VF 2 (say, a VF it keeps for itself): the charm sees that
    # right before writing, and stops with what the VF lists instead of a failed write.
    vfio.vfio_model(L40S).hidden.add("0000:81:00.6")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                 resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "VF 0000:81:00.6 cannot take nvidia-1139 now: it lists nothing; every VF has its "
        "previous type back, as nova.conf lists them; retrying on the next hook")
    assert types_of(root, L40S, 4) == [0, 0, 0, 0]  # all or nothing: the first two undone
    assert "subordinate_configuration" not in ours(out)


def test_running_guests_on_vfs_block_a_change_and_nothing_changes(ctx, vfio, root, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    running_guest(root, "instance-0000002a", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1",
                  pci_address="0000:81:00.5")
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings not applied, no VF changed: 1 running guest(s) use vGPUs: "
        "instance-0000002a (vm-instance-0000002a, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1); "
        "move them or restore the mapping")
    assert types_of(root, L40S, 5) == [1139, 1139, 1139, 1139, 0]
    assert types_of(root, H200, 4) == [1282] * 4
    assert ours(out) == ours(first)
    # A guest on a VF whose type stays does not stop other changes.
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-12Q: all}"}))
    assert out.unit_status.name == "active"
    assert types_of(root, H200, 4) == [0] * 4


def test_a_shut_off_guest_keeps_its_vf_type(ctx, vfio, root, deb):
    from unit_tests.libvirt import defined_guest
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    # Nova keeps a shut-off instance's VF (and its allocation): its type must stay.
    defined_guest(root, "instance-0000002a", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1",
                  pci_address="0000:81:00.5")
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings not applied, no VF changed: 1 guest(s) hold vGPUs, running or shut "
        "off: instance-0000002a (vm-instance-0000002a, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1, "
        "shut off); move them or restore the mapping")
    assert types_of(root, L40S, 5) == [1139, 1139, 1139, 1139, 0]
    assert ours(out) == ours(first)


def test_a_domain_definition_that_cannot_be_parsed_stops_vf_changes(ctx, vfio, root, deb):
    from unit_tests.libvirt import broken_guest
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    broken_guest(root, "instance-00000009")
    steady = ctx.run(ctx.on.update_status(), again(first))
    # Nothing to change. The count cannot tell what the file holds: none of the VFs is free.
    assert steady.unit_status == testing.ActiveStatus(first.unit_status.message.replace(
        "0 used, 4 free", "4 used (4 uncertain), 0 free"))
    assert "0 used, 4 free" in first.unit_status.message
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith(
        "vgpu-device-mappings not applied, no VF changed: 1 guest(s) hold vGPUs, running or shut "
        "off: /etc/libvirt/qemu/instance-00000009.xml (not XML: ")
    assert types_of(root, L40S, 5) == [1139, 1139, 1139, 1139, 0]
    assert ours(out) == ours(first)


def test_vfio_gpus_on_nova_before_epoxy_block_naming_the_gpu_and_release(ctx, vfio, root, deb):
    vfio.nova("3:30.1.0-0ubuntu1")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings: GPU 0000:81:00.0 (L40S) uses NVIDIA's vendor-specific VFIO "
        "framework, which needs Nova 31 (2025.1 epoxy) or later; this host runs 2024.2 dalmatian "
        "(Nova 30) (+1 more)")
    assert types_of(root, L40S, 4) == [0] * 4
    assert "subordinate_configuration" not in ours(out)


def test_a_hostile_device_id_in_sysfs_never_reaches_nova_conf(ctx, vfio, root, deb):
    (root / "sys/bus/pci/devices/0000:81:00.4/device").write_text("0x26b9\n[DEFAULT]\ndebug=1\n")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                 resource=deb))
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith("not publishing: refusing product_id")
    assert "subordinate_configuration" not in ours(out)


def test_list_vgpu_types_gives_the_flavor_property_and_the_pci_alias(ctx, vfio, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    ctx.run(ctx.on.action("list-vgpu-types"), again(first))
    l40s = ctx.action_results["gpus"]["gpu-0"]
    entry = l40s["types"]["nvidia-1139"]  # listed although the full GPU offers nothing now
    assert entry["flavor-property"] == "pci_passthrough:alias=vgpu-l40s-12q:1"
    # What the operator pastes into pci-alias, keys in one order: by ids, which nova-compute
    # 32+ requires at start; the resource class only with pci-in-placement (test_report.py).
    assert entry["pci-alias"] == (
        '{"device_type": "type-VF", "name": "vgpu-l40s-12q", "product_id": "26b9", '
        '"vendor_id": "10de"}')
    assert entry["resource-class"] == "CUSTOM_VGPU_L40S_12Q"
    table = ctx.action_results["table"]
    assert f"\n  {entry['pci-alias']}\n" in table  # under the table, with its siblings'
    assert table.count('"name": "vgpu-l40s-') == 6  # one per L40S type, not one per VF
    assert l40s["virtual-functions"] == ",".join(vfs(L40S, 16))
    # The full GPU lists nothing: the learnt type is counted from its profile against the
    # GPU's 48 GB (learnt while its VFs were free): four fit, and the four VFs that hold it
    # are free, as the status line counts them (vgpu.capacity.count for both).
    assert (entry["max-instances"], entry["available-instances"]) == ("4", "4")
    assert "CUSTOM_VGPU_L40S_12Q: 0 used, 4 free" in first.unit_status.message
    row = next(line for line in ctx.action_results["table"].splitlines() if " nvidia-1139 " in line)
    assert row.split()[-5:] == ["12288", "MiB", "4", "4", "pci_passthrough:alias=vgpu-l40s-12q:1"]



def test_the_zaza_tests_read_only_keys_list_vgpu_types_gives(ctx, vfio, deb):
    """tests/ reads list-vgpu-types' entries by key in a lab: each key it reads is one it gets."""
    import re
    from pathlib import Path

    source = "".join(p.read_text() for p in (Path(__file__).resolve().parents[1] / "tests").glob("*.py"))
    gpu_keys = set(re.findall(r"gpu(?:\[|\.get\()'([a-z-]+)'", source))
    type_keys = set(re.findall(r"(?:vgpu_type|first)(?:\[|\.get\()'([a-z-]+)'", source))
    assert {"addresses", "types"} <= gpu_keys and {"id", "framework"} <= type_keys
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    ctx.run(ctx.on.action("list-vgpu-types"), again(first))
    gpu = ctx.action_results["gpus"]["gpu-0"]
    assert gpu_keys <= set(gpu), gpu_keys - set(gpu)
    for entry in gpu["types"].values():
        assert type_keys <= set(entry), type_keys - set(entry)

def test_remove_stops_and_deletes_the_boot_unit(ctx, vfio, root, tools, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    ctx.run(ctx.on.remove(), again(first))
    assert not sriov.unit_path().exists()
    assert not (root / catalogue.FILE).exists()
    assert [c for c in tools.calls() if sriov.UNIT in c or "daemon-reload" in c][-3:] == [
        f"systemctl stop {sriov.UNIT}", f"systemctl disable {sriov.UNIT}", "systemctl daemon-reload"]



def test_remove_leaves_nothing_behind_even_with_types_still_to_learn(ctx, vfio, root, deb):
    # Free VFs list their types: the status check at the end of the remove dispatch
    # would learn them again and write the catalogue back.
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": ""}, resource=deb))
    assert (root / catalogue.FILE).exists() and sriov.unit_path().exists()
    assert (root / "run/nova-compute-nvidia-vgpu/host.lock").exists()
    out = ctx.run(ctx.on.remove(), again(first))
    assert not (root / catalogue.FILE).exists()
    assert not (root / catalogue.STATE_DIR).exists()
    assert not sriov.unit_path().exists()
    assert not (root / "run/nova-compute-nvidia-vgpu").exists()  # the host lock's directory
    assert out.unit_status == testing.MaintenanceStatus(
        "removing: the charm's files are deleted; the vGPU host driver stays installed")


def test_remove_leaves_nothing_behind_after_the_boot_step_ran(ctx, vfio, root, deb):
    """The boot step's result (boot-result.json, for the exporter) goes with its data."""
    from vgpu import boot, bootresult

    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert boot.run(f"/{sriov.DATA_FILE}") == 0  # as systemd runs it at the next boot
    assert (root / bootresult.RESULT_FILE).is_file()
    ctx.run(ctx.on.remove(), again(first))
    assert not (root / bootresult.RESULT_FILE).exists()
    assert not (root / catalogue.STATE_DIR).exists()


def test_a_linked_state_directory_is_not_written_through(ctx, vfio, root, deb):
    ssh = root / "etc/ssh"
    ssh.mkdir(parents=True)
    (root / catalogue.STATE_DIR).symlink_to(ssh)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert list(ssh.iterdir()) == []
    # Learnt and applied for this hook all the same; the next could not name the full GPUs.
    assert types_of(root, L40S, 4) == [1139] * 4
    assert out.unit_status == testing.BlockedStatus(
        f"cannot save learnt vGPU types to /{catalogue.FILE}: /{catalogue.STATE_DIR} is a "
        f"symbolic link (to {ssh}); the charm never writes through a link")
    said = [line.message for line in ctx.juju_log if line.level == "WARNING"]
    assert (f"cannot save learnt vGPU types to {root / catalogue.FILE}: /{catalogue.STATE_DIR} is a "
            f"symbolic link (to {ssh}); the charm never writes through a link") in said


def test_a_linked_unit_directory_blocks_naming_it(ctx, vfio, root, deb):
    ssh = root / "etc/ssh"
    ssh.mkdir(parents=True)
    (root / "etc/systemd").mkdir(parents=True, exist_ok=True)
    (root / "etc/systemd/system").symlink_to(ssh)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert list(ssh.iterdir()) == []
    assert out.unit_status == testing.BlockedStatus(
        f"{sriov.UNIT}: cannot write /{sriov.UNIT_FILE}: /etc/systemd/system is a symbolic link "
        f"(to {ssh}); the charm never writes through a link")


def test_a_catalogue_nested_too_deep_for_python_is_relearnt(ctx, vfio, root, deb):
    path = root / catalogue.FILE
    path.parent.mkdir(parents=True)
    path.write_text("[" * 100_000 + "]" * 100_000)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert out.unit_status.name == "active"
    assert json.loads(path.read_text())["0x26b9 570.158.02"]["1139"] == "NVIDIA L40S-12Q"
    ctx.run(ctx.on.update_status(), again(out))


def test_a_catalogue_edited_by_hand_with_digits_python_cannot_count_is_no_crash(ctx, vfio, root,
                                                                               deb):
    """``²`` passes str.isdigit but not int(): every hook and scrape would raise ValueError."""
    path = root / catalogue.FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"0x26b9 570.158.02": {"\u00b2": "NVIDIA L40S-1Q"},
                                "0x26b9 whole GPU": {catalogue.FRAMEBUFFER: "\u00b2"}}))
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    assert types_of(root, L40S, 4) == [1139] * 4


def test_remove_logs_each_step_it_could_not_undo_and_goes_on(ctx, vfio, root, tools, deb):
    from unit_tests.faketools import stand_in
    from vgpu import kernel

    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    paused = ctx.run(ctx.on.action("pause"), again(first))
    assert kernel.blacklist_path().exists()
    stand_in(tools.bin / "update-initramfs", "#!/bin/sh\necho 'E: /boot is full' >&2\nexit 1\n")
    tools.fail("stop", sriov.UNIT)
    tools.fail("unmask", MGR)
    ctx.run(ctx.on.remove(), paused)
    said = [(line.level, line.message) for line in ctx.juju_log
            if line.message.startswith(("could not", "the vGPU host driver"))]
    not_loaded = "Failed to {} {}.service: Unit {}.service not loaded."
    assert said == [
        ("WARNING", "could not remove the nouveau blacklist: update-initramfs -u failed: /boot is full"),
        ("WARNING", f"could not remove {sriov.UNIT}: systemctl stop {sriov.UNIT} failed: "
                    + not_loaded.format("stop", sriov.UNIT, sriov.UNIT)),
        ("WARNING", f"could not unmask the vGPU services: systemctl unmask {MGR} failed: "
                    + not_loaded.format("unmask", MGR, MGR)),
        ("INFO", "the vGPU host driver package stays installed; purge it by hand if wanted"),
    ]
    # The blacklist stays for the initramfs that still has it; the rest is left as it was.
    assert kernel.blacklist_path().exists()
    assert sriov.unit_path().exists()


# -- after a reboot: no VFs until sriov-manage -----------------------------------------

def test_after_a_reboot_the_charm_enables_the_vfs_and_writes_the_types(ctx, root, tools, deb):
    host = ready(l40s_host(root, enabled=False), root, tools, deb)
    assert not (root / f"sys/bus/pci/devices/{L40S}/virtfn0").exists()
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert [c for c in tools.calls() if c.startswith("sriov-manage")] == [
        f"sriov-manage -e {L40S}", f"sriov-manage -e {H200}"]
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert out.unit_status.name == "active"
    assert nova_conf(out).count("device_spec") == 8
    assert host.recipes.exists()


def test_a_gpu_whose_vfs_stay_missing_is_named_and_nothing_is_published(ctx, root, tools, deb):
    host = ready(l40s_host(root, enabled=False), root, tools, deb)
    host.fail_sriov_manage(H200)
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "no virtual functions on SR-IOV GPU 0000:c1:00.0 (H200 SXM 141GB) after sriov-manage -e: "
        "sriov-manage -e 0000:c1:00.0 failed: Enabling VFs on 0000:c1:00.0 failed: "
        "Input/output error; the boot step's attempts: journalctl -u nvidia-vgpu-vfs.service")
    assert "subordinate_configuration" not in ours(out)
    assert types_of(root, L40S, 4) == [0] * 4  # nothing half-applied


def test_the_next_hook_recovers_a_gpu_a_failed_run_left_on_the_stub(ctx, root, tools, deb):
    """Issue 33.1: no longer marked failed for good; one that stays unbound says how to recover."""
    host = ready(l40s_host(root, enabled=False), root, tools, deb)
    host.left_on_stub(H200)
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": "{H200X-35C: ['c1:00.0']}"},
                                        resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    assert [c for c in tools.calls() if c.startswith("sriov-manage")] == [f"sriov-manage -e {H200}"]
    assert (root / f"sys/bus/pci/devices/{H200}/driver").resolve().name == "nvidia"
    host.reboot()
    host.left_on_stub(H200)
    (root / "sys/bus/pci/drivers/nvidia/bind").unlink()  # the nvidia driver refuses it now
    out = ctx.run(ctx.on.start(), again(out))
    assert out.unit_status == testing.BlockedStatus(
        f"no virtual functions on SR-IOV GPU {H200} (H200 SXM 141GB) after sriov-manage -e: it is "
        "left on pci-pf-stub by a failed sriov-manage run and binding it to nvidia failed: "
        "/sys/bus/pci/drivers/nvidia/bind: No such file or directory; recover it with: "
        "echo '10de 2335' > /sys/bus/pci/drivers/pci-pf-stub/remove_id; echo 0000:c1:00.0 > "
        "/sys/bus/pci/drivers/pci-pf-stub/unbind; echo 0000:c1:00.0 > "
        "/sys/bus/pci/drivers/nvidia/bind; /usr/lib/nvidia/sriov-manage -e 0000:c1:00.0; the boot "
        "step's attempts: journalctl -u nvidia-vgpu-vfs.service")


LOCK = "run/nova-compute-nvidia-vgpu/host.lock"


def held_elsewhere(root) -> bool:
    """Whether another process holds the host lock now (the file is the charm's, by path)."""
    import fcntl

    path = root / LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_hook_while_the_boot_step_runs_leaves_the_host_to_it_and_says_so(ctx, root, tools, deb,
                                                                            monkeypatch):
    """The reboot race: the agent's start hook runs while nvidia-vgpu-vfs restores the VFs."""
    import subprocess
    import sys

    from vgpu import hostlock, reconcile

    host = ready(l40s_host(root, enabled=False), root, tools, deb)
    for gpu in (L40S, H200):
        host.vfio_model(gpu).frozen = True  # the boot step runs in another process
    sriov.write_boot_data({
        "version": 1, "wait_for": ["nvidia-vgpu-late"],  # never active: the step waits 2 s
        "limits": {"manager": 2, "poll": 0.05, "total": 30},
        "gpus": [{"address": L40S, "model": "L40S",
                  "vfs": [{"index": n, "name": "NVIDIA L40S-12Q", "number": 1139}
                          for n in range(4)]}]})
    boot = subprocess.Popen([sys.executable, str(sriov.BOOT_SCRIPT), f"/{sriov.DATA_FILE}"],
                            env=dict(os.environ), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        until = time.monotonic() + 20
        while not held_elsewhere(root) and boot.poll() is None and time.monotonic() < until:
            time.sleep(0.02)
        assert held_elsewhere(root), "the boot step does not hold the host lock"
        monkeypatch.setattr(hostlock, "HOOK_WAIT", 0.3)
        out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    finally:
        journal, _ = boot.communicate(timeout=60)
    assert boot.returncode == 0, journal
    assert out.unit_status == testing.WaitingStatus(reconcile.BUSY)
    assert reconcile.BUSY == (
        "waiting for nvidia-vgpu-vfs.service (the boot step) to finish restoring VFs, vGPU types "
        "and mdevs: this hook left the host and nova-compute's settings as they are; the next "
        "hook does the work")
    assert "subordinate_configuration" not in ours(out)
    assert [c for c in tools.calls() if c.startswith("sriov-manage")] == [f"sriov-manage -e {L40S}"]
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]  # the boot step's work stands
    for gpu in (L40S, H200):
        host.vfio_model(gpu).frozen = False
    out = ctx.run(ctx.on.update_status(), again(out))  # the next hook does the rest
    assert out.unit_status.name == "active"
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert types_of(root, H200, 4) == [1282] * 4
    assert nova_conf(out).count("device_spec") == 8


# -- restoring is not changing: the boot step did not run ---------------------------------

GUEST = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1"


def rebooted_without_the_boot_step(ctx, host, root, deb, guest_on=("0000:81:00.5",)):
    """Served, then a reboot whose boot step did not run; shut-off guests keep VFs ``guest_on``.

    The operator masked the boot unit, so no hook does the boot step's work either
    (vgpu.boot.catch_up): the hooks' own steps restore what nova.conf lists.
    """
    from unit_tests.libvirt import defined_guest

    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    for n, address in enumerate(guest_on):
        defined_guest(root, f"instance-0000002{n}", GUEST[:-1] + str(n), pci_address=address)
    unit = root / sriov.UNIT_FILE
    unit.unlink()
    unit.symlink_to(os.devnull)
    host.reboot()
    return first


def test_a_hook_after_a_reboot_gives_the_vfs_back_their_published_types_despite_a_guest(
        ctx, vfio, root, deb):
    first = rebooted_without_the_boot_step(ctx, vfio, root, deb)
    out = ctx.run(ctx.on.start(), again(first))
    # A restore, for the shut-off guest's own VF too, on every VF of both GPUs.
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert types_of(root, H200, 4) == [1282] * 4
    assert out.unit_status.name == "active", out.unit_status
    assert ours(out) == ours(first)


def test_a_change_a_guest_blocks_after_a_reboot_still_restores_what_nova_conf_lists(
        ctx, vfio, root, deb):
    first = rebooted_without_the_boot_step(ctx, vfio, root, deb)
    out = ctx.run(ctx.on.start(), again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]  # published: L40S-12Q on four
    assert types_of(root, H200, 4) == [1282] * 4
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings not applied: 1 guest(s) hold vGPUs, running or shut off: "
        "instance-00000020 (vm-instance-00000020, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d0, shut off); "
        "the 8 VFs without a type got back the types nova.conf lists; move them or restore the "
        "mapping")
    assert ours(out) == ours(first)


# -- mediated devices on VFs (A100) ------------------------------------------------------

@pytest.fixture
def a100(root, tools, deb):
    return ready(a100_host(root), root, tools, deb)


def test_a100_gpu_address_expands_to_the_first_vfs_the_type_fits(ctx, a100, tools, deb):
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{GRID A100-10C: ['41:00.0']}"}, resource=deb))
    assert out.unit_status == testing.ActiveStatus(
        "1 GPU (A100 PCIe 40GB), nvidia-474 on 4; nvidia-474: 0 used, 4 free")
    assert nova_conf(out) == (
        "[devices]\nenabled_mdev_types = nvidia-474\n[mdev_nvidia-474]\n"
        "device_addresses = 0000:41:00.4,0000:41:00.5,0000:41:00.6,0000:41:00.7\n")
    boot = json.loads(sriov.data_path().read_text())
    assert boot["gpus"] == [{"address": "0000:41:00.0", "model": "A100 PCIe 40GB", "vfs": []}]
    assert not [c for c in tools.calls() if c.startswith("sriov-manage")]  # VFs were there


def test_mdev_class_per_profile_is_opt_in(ctx, a100, deb):
    config = {"vgpu-device-mappings": "{A100-20C: all}"}
    out = ctx.run(ctx.on.config_changed(), state(config, resource=deb))
    assert "mdev_class" not in nova_conf(out)
    out = ctx.run(ctx.on.config_changed(), state({**config, "mdev-class-per-profile": True},
                                                 resource=deb))
    assert nova_conf(out) == (
        "[devices]\nenabled_mdev_types = nvidia-475\n[mdev_nvidia-475]\n"
        "device_addresses = 0000:41:00.4,0000:41:00.5\nmdev_class = CUSTOM_VGPU_A100_20C\n")
    ctx.run(ctx.on.action("list-vgpu-types"), again(out))
    assert ctx.action_results["gpus"]["gpu-0"]["types"]["nvidia-475"]["flavor-property"] == \
        "resources:CUSTOM_VGPU_A100_20C=1"


def test_a100_after_a_reboot_gets_its_vfs_back(ctx, root, tools, deb):
    ready(a100_host(root, enabled=False), root, tools, deb)
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": "{A100-20C: all}"}, resource=deb))
    assert [c for c in tools.calls() if c.startswith("sriov-manage")] == [
        "sriov-manage -e 0000:41:00.0"]
    assert "device_addresses = 0000:41:00.4,0000:41:00.5" in nova_conf(out)


def test_all_with_no_gpu_offering_it_is_a_note_not_a_block(ctx, a100, deb):
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{A100-20C: all, L40S-12Q: all}"}, resource=deb))
    assert out.unit_status == testing.ActiveStatus(
        "1 GPU (A100 PCIe 40GB), nvidia-475 on 2; nvidia-475: 0 used, 2 free; "
        "L40S-12Q: no GPU on this host offers it, "
        "nothing published for it")


def test_relation_fixture_is_the_default_one():
    assert relation().endpoint == "nova-vgpu"


def test_a_paused_unit_leaves_vf_types_alone_until_resume(ctx, vfio, root, tools, deb):
    for unit in (MGR, "nvidia-vgpud"):
        tools.set_active(unit, False)
    config = {"vgpu-device-mappings": "{L40S-12Q: all}"}
    out = ctx.run(ctx.on.config_changed(), state(config, resource=deb, paused=True))
    assert out.unit_status.message.startswith("paused: ")
    assert types_of(root, L40S, 4) == [0] * 4
    assert "subordinate_configuration" not in ours(out)
    out = ctx.run(ctx.on.action("resume"), out)
    out = ctx.run(ctx.on.config_changed(), again(out))
    assert types_of(root, L40S, 1) == [1139]
    assert out.unit_status.name == "active"


LIGHT = """
import sys
from pathlib import Path
from ops import testing
from charm import NovaComputeNvidiaVgpuCharm
from unit_tests.fakehost import l40s_host
from vgpu import mappings
root = Path(sys.argv[1])
l40s_host(root)
for n in range(4, 8):
    (root / f"sys/bus/pci/devices/0000:81:00.{n}/nvidia/current_vgpu_type").write_text("1139")
text = "{nvidia-1139: ['81:00.0']}"
ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
stored = testing.StoredState(owner_path="NovaComputeNvidiaVgpuCharm", name="_stored", content={
    "paused": False, "checked": {"key": mappings.fingerprint(text),
                                 "mapping": {"nvidia-1139": ["0000:81:00.0"]}, "errors": []}})
placeholder = root.parent / "empty.deb"
placeholder.write_text("")
out = ctx.run(ctx.on.update_status(), testing.State(
    config={"vgpu-device-mappings": text}, relations=[testing.SubordinateRelation("nova-vgpu")],
    stored_states={stored},
    resources={testing.Resource(name="nvidia-vgpu-software", path=placeholder)}))
print(out.unit_status.name, sorted(m for m in ("jsonschema", "xml.etree.ElementTree") if m in sys.modules))
"""


def test_update_status_on_a_served_vfio_host_stays_light(root, tmp_path, tools):
    from unit_tests.faketools import run_script

    host = tmp_path / "light-host"
    host.mkdir()
    result = run_script(tmp_path, LIGHT, str(host), VGPU_HOST_ROOT=str(host))
    # No driver installed here (blocked for the resource), but no schema or XML parsing
    # (ops.testing itself imports PyYAML, so yaml is not checked here).
    assert result.stdout.split()[-1] == "[]", result.stdout + result.stderr
    assert not [c for c in tools.calls() if not c.startswith("systemctl is-")]


STEADY = """
import json
import sys
from ops import testing
from charm import NovaComputeNvidiaVgpuCharm
config = {"vgpu-device-mappings": "{L40S-12Q: all}"}
resources = {testing.Resource(name="nvidia-vgpu-software", path=sys.argv[1])}
ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
from vgpu import bootfile  # the boot step ran at this boot: no hook does its work again
bootfile.write(bootfile.BY_BOOT, 0, [])
first = ctx.run(ctx.on.config_changed(), testing.State(
    config=config, relations=[testing.SubordinateRelation("nova-vgpu")], resources=resources))
out = ctx.run(ctx.on.update_status(), testing.State(
    config=config, relations=first.relations, resources=resources,
    stored_states=first.stored_states))
# The vgpu-usage action's report: the status line's count is vgpu.capacity.
heavy = ("vgpu.mig", "vgpu.miginstances", "vgpu.migsteps", "vgpu.migplan", "vgpu.report", "vgpu.table",
         "vgpu.boot", "vgpu.usage", "vgpu.bootdata")
print(json.dumps({"status": [first.unit_status.name, out.unit_status.name],
                  "message": out.unit_status.message,
                  "heavy": [m for m in heavy if m in sys.modules]}))
"""


def test_hooks_on_a_served_vfio_host_without_mig_profiles_never_import_mig(vfio, root, tmp_path,
                                                                         deb):
    import json

    from unit_tests.faketools import run_script

    result = run_script(tmp_path, STEADY, str(deb))
    answer = json.loads(result.stdout.splitlines()[-1])
    assert answer["status"] == ["active", "active"], result.stderr[-2000:]
    assert types_of(root, L40S, 4) == [1139] * 4  # the mapping was applied, then kept
    assert answer["message"].endswith("0 used, 4 free"), answer["message"]  # counted
    # MIG's tables are read only where a MIG-backed profile is mapped; the usage report's
    # code only by the vgpu-usage action.
    assert answer["heavy"] == []


# -- only what is ours: the GPUs the mapping selects, bound to nvidia ------------------------

def bind(root, address: str, driver: str) -> None:
    """Bind a PCI function to another driver, as sysfs shows it (the ``driver`` link)."""
    link = root / f"sys/bus/pci/devices/{address}/driver"
    link.unlink()
    target = root / "sys/bus/pci/drivers" / driver
    target.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.relpath(target, link.parent))


def sriov_calls(tools):
    return [c for c in tools.calls() if c.startswith("sriov-manage")]


@pytest.fixture
def rebooted(root, tools, deb):
    """The L40S and the H200 after a reboot: driver installed, no VFs yet."""
    return ready(l40s_host(root, enabled=False), root, tools, deb)


def test_only_the_gpu_the_mapping_names_gets_its_vfs(ctx, rebooted, root, tools, deb):
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": "{L40S-12Q: ['81:00.0']}"},
                                        resource=deb))
    assert sriov_calls(tools) == [f"sriov-manage -e {L40S}"]
    assert not (root / f"sys/bus/pci/devices/{H200}/virtfn0").exists()
    assert out.unit_status.name == "active", out.unit_status  # the H200 is not ours: no block
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]


def test_a_vf_address_selects_the_gpu_on_its_bus_before_the_vfs_exist(ctx, rebooted, tools, deb):
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": "{L40S-12Q: ['81:00.5']}"},
                                        resource=deb))
    assert sriov_calls(tools) == [f"sriov-manage -e {L40S}"]
    assert out.unit_status.name == "active", out.unit_status


def test_without_a_mapping_no_gpu_is_touched(ctx, rebooted, tools, deb):
    out = ctx.run(ctx.on.start(), state(resource=deb))
    assert sriov_calls(tools) == []
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (1 H200 SXM 141GB, 1 L40S), no vGPU type mapped: set vgpu-device-mappings")


def test_all_leaves_a_gpu_bound_to_vfio_pci_alone(ctx, rebooted, root, tools, deb):
    bind(root, H200, "vfio-pci")  # kept for whole-GPU passthrough
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": "{L40S-12Q: all}"}, resource=deb))
    assert sriov_calls(tools) == [f"sriov-manage -e {L40S}"]
    assert out.unit_status.name == "active", out.unit_status
    assert nova_conf(out).count("device_spec") == 4


def test_a_named_gpu_bound_to_another_driver_is_not_touched_and_named(ctx, rebooted, root, tools,
                                                                      deb):
    bind(root, H200, "vfio-pci")
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert sriov_calls(tools) == [f"sriov-manage -e {L40S}"]
    assert out.unit_status == testing.BlockedStatus(
        f"SR-IOV GPU {H200} (H200 SXM 141GB) is bound to vfio-pci, not nvidia: its VFs are left "
        "alone; bind it to nvidia or leave it out of vgpu-device-mappings")


def test_with_the_iommu_off_sriov_manage_is_not_run_and_the_status_says_why(ctx, rebooted, root,
                                                                            tools, deb):
    (root / "sys/kernel/iommu_groups").rename(root / "iommu_groups_off")
    first = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    ctx.run(ctx.on.update_status(), again(first))
    assert sriov_calls(tools) == []
    assert first.unit_status.message.startswith(f"IOMMU is off but SR-IOV GPU {L40S} needs it")


def test_sriov_manage_has_a_time_limit_per_hook(ctx, rebooted, root, tools, deb, monkeypatch,
                                               tmp_path):
    from unit_tests.faketools import stand_in

    tried = tmp_path / "tried"
    stand_in(root / sriov.SRIOV_MANAGE, f'#!/bin/sh\necho "$2" >> {tried}\nexec sleep 60\n')
    monkeypatch.setattr(sriov, "HOOK_BUDGET", 2)
    started = time.monotonic()
    out = ctx.run(ctx.on.start(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert time.monotonic() - started < 10
    assert tried.read_text().split() == [L40S, H200]  # each GPU had its share
    assert out.unit_status.name == "blocked"
    assert "timed out after 1s" in out.unit_status.message


# -- the boot unit: profiles by name, and an operator's mask respected ----------------------

def test_the_boot_data_names_profiles_and_the_unit_runs_the_boot_step(ctx, vfio, root, tools, deb):
    from vgpu import boot

    ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    unit = sriov.unit_path().read_text()
    assert "src/vgpu_boot.py /var/lib/nova-compute-nvidia-vgpu/boot.json" in unit
    assert "1139" not in unit and "sriov-manage" not in unit.split("[Unit]")[1]
    saved = json.loads((root / boot.DATA_FILE).read_text())
    assert saved["wait_for"] == [MGR]
    assert [g["address"] for g in saved["gpus"]] == [L40S, H200]
    assert saved["gpus"][0]["vfs"] == [{"index": n, "name": "NVIDIA L40S-12Q", "number": 1139}
                                       for n in range(4)]
    assert [v["name"] for v in saved["gpus"][1]["vfs"]] == ["NVIDIA H200X-35C"] * 4


@pytest.mark.parametrize("spoil", ["wrong type", "link", "huge"])
def test_boot_data_the_boot_step_cannot_use_is_rewritten_by_the_next_hook(ctx, vfio, root, deb,
                                                                          spoil):
    from vgpu import bootdata

    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    target = sriov.data_path()
    target.unlink()
    elsewhere = root / "etc/elsewhere.json"
    elsewhere.parent.mkdir(parents=True, exist_ok=True)
    elsewhere.write_text("kept\n")
    if spoil == "link":
        target.symlink_to(elsewhere)
    else:
        target.write_text('{"version": 1, "gpus": [{"address": "0000:81:00.0", "vfs": 5}]}'
                          if spoil == "wrong type" else " " * (bootdata.LIMIT + 1))
    # A mapping the host refuses: no plan in force, yet the data is made usable again.
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": "{L40S-99Q: ['81:00.0']}"}))
    assert out.unit_status.name == "blocked"
    assert not target.is_symlink() and elsewhere.read_text() == "kept\n"
    gpus, wait_for, _ = bootdata.parse(bootdata.load(f"/{sriov.DATA_FILE}"))
    assert [g.address for g in gpus] == [L40S, H200] and wait_for == [MGR]


def test_a_masked_boot_unit_is_left_masked_and_the_status_says_so(ctx, vfio, root, tools, deb):
    target = sriov.unit_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.symlink_to("/dev/null")  # systemctl mask, after the operator removed the charm's file
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert target.is_symlink() and str(target.readlink()) == "/dev/null"
    assert not [c for c in tools.calls() if sriov.UNIT in c]
    assert not sriov.data_path().exists()
    assert out.unit_status.name == "active"
    assert out.unit_status.message.endswith(
        f"; {sriov.UNIT} is masked: VFs and vGPU types are not restored at boot")
    ctx.run(ctx.on.remove(), again(out))
    assert target.is_symlink()  # removal leaves the operator's mask too


def test_a_runtime_mask_is_respected_too(ctx, vfio, root, tools, deb):
    runtime = root / "run/systemd/system" / sriov.UNIT
    runtime.parent.mkdir(parents=True)
    runtime.symlink_to("/dev/null")  # systemctl mask --runtime
    ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert not sriov.unit_path().exists()
    assert not [c for c in tools.calls() if sriov.UNIT in c]


# -- hosts as public transcripts show them ----------------------------------------------

@pytest.fixture(scope="module")
def branch_debs(tmp_path_factory):
    """The host driver at the version each transcript-built host has loaded."""
    out = tmp_path_factory.mktemp("branch-debs")
    return {v: debs.build(out, f"nvidia-vgpu-ubuntu-{v.split('.')[0]}", v, debs.machine_arch(),
                          debs.host_files())
            for v in ("580.105.06", "570.158.02", "550.90.05")}


def rtx_vfs(pf: str, count: int):
    """The RTX PRO 6000's VFs start at function .2 (cubecos #312)."""
    return [f"{pf[:-4]}{(2 + n) // 8:02x}.{(2 + n) % 8}" for n in range(count)]


def test_rtx_pro_6000_in_two_pci_domains_by_nvidia_smis_address_and_the_short_form(
        ctx, root, tools, branch_debs):
    deb = branch_debs["580.105.06"]
    ready(rtx_pro_6000_host(root, vfs=16), root, tools, deb)
    # nvidia-smi's spelling of the address, NVIDIA's tables' spelling of the type.
    mapping = "{DC-8Q: ['00000001:C8:00.0'], 'NVIDIA RTX Pro 6000 Blackwell DC-24Q': ['42:00.0']}"
    # Two profiles of one GPU model on one host: only Placement tells their VFs apart.
    config = {"vgpu-device-mappings": mapping, "pci-in-placement": True}
    out = ctx.run(ctx.on.config_changed(), state(config, resource=deb))
    assert out.unit_status == testing.ActiveStatus(
        "4 GPUs (RTX PRO 6000 Blackwell Server Edition), "
        "CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_24Q on 4, CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_8Q "
        "on 12; CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_24Q: 0 used, 4 free; "
        "CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_8Q: 0 used, 12 free")
    specs = [json.loads(v) for k, v in principal.nova_context(ours(out))["sections"]["pci"]
             if k == "device_spec"]
    # Exactly sysfs's names (what Nova derives from libvirt's pci_0001_c8_00_2), VF 0 at .2.
    assert [s["address"] for s in specs] == rtx_vfs("0000:42:00.0", 4) + rtx_vfs("0001:c8:00.0", 12)
    assert all((root / "sys/bus/pci/devices" / s["address"] / "physfn").exists() for s in specs)
    assert {s["product_id"] for s in specs} == {"2bb5"}  # the VFs' own id, which is the GPU's
    dc8q = int(next(n for n, t in RTX_TYPES.items() if t.endswith(" DC-8Q")))
    held = [current(root, a) for a in rtx_vfs("0001:c8:00.0", 13)]
    assert held == [dc8q] * 12 + [0]
    assert [current(root, a) for a in rtx_vfs("0001:04:00.0", 2)] == [0, 0]  # not mapped
    # At boot the types come back by name on the very VFs that hold them now.
    boot = {g["address"]: g["vfs"] for g in json.loads(sriov.data_path().read_text())["gpus"]}
    assert [(vf["index"], vf["name"]) for vf in boot["0001:c8:00.0"]] == [
        (n, RTX_TYPES[str(dc8q)]) for n in range(12)]
    ctx.run(ctx.on.action("list-vgpu-types"), again(out))
    gpu = next(g for g in ctx.action_results["gpus"].values() if "0001:c8:00.0" in g["addresses"])
    alias = json.loads(gpu["types"][f"nvidia-{dc8q}"]["pci-alias"])
    assert (alias["product_id"], alias["device_type"], alias["name"]) == (
        "2bb5", "type-VF", "vgpu-rtx-pro-6000-blackwell-dc-8q")


def test_list_vgpu_types_names_all_four_rtx_pro_6000_within_what_action_set_takes(
        ctx, root, tools, packages):
    # The host of cubecos #312 as it is: four GPUs, 48 VFs each, two in PCI domain 0001; the
    # options that make each entry longest.
    rtx_pro_6000_host(root)
    config = {"pci-in-placement": True, "vfio-live-migration": True}
    ctx.run(ctx.on.action("list-vgpu-types"), state(config, resource=packages["empty"]))
    results = ctx.action_results
    assert "truncated" not in results
    gpus = ("0000:42:00.0", "0000:8c:00.0", "0001:04:00.0", "0001:c8:00.0")
    assert [g["addresses"] for g in results["gpus"].values()] == [",".join(gpus)]
    entry = results["gpus"]["gpu-0"]["types"]
    assert len(entry) == len(RTX_TYPES)
    dc24q = entry["nvidia-2005"]  # DC-24Q: four on a 96 GB GPU
    assert (dc24q["max-instances"], dc24q["available-instances"]) == ("4", "4")
    assert results["gpus"]["gpu-0"]["virtual-functions"].split(",") == [
        vf for gpu in gpus for vf in rtx_vfs(gpu, 48)]
    rows = results["table"].split("\n\n")[0].splitlines()
    assert len(rows) == 1 + len(RTX_TYPES) and all(",".join(gpus) in row for row in rows[1:])


@pytest.mark.parametrize("branch,number", [("570", 1139), ("550", 1153)])
def test_a_mapping_by_name_survives_a_driver_branch_with_other_type_ids(
        ctx, root, tools, branch_debs, branch, number):
    host = l40s_branch_host(root, branch)
    deb = branch_debs[(root / "sys/module/nvidia/version").read_text().strip()]
    ready(host, root, tools, deb)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                 resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    assert [current(root, a) for a in vfs("0000:26:00.0", 5)] == [number] * 4 + [0]
    specs = [json.loads(v) for k, v in principal.nova_context(ours(out))["sections"]["pci"]
             if k == "device_spec"]
    assert {(s["resource_class"], s["product_id"]) for s in specs} == {
        ("CUSTOM_VGPU_L40S_12Q", "26b9")}
    assert str(number) not in sriov.unit_path().read_text()  # no type id frozen into the unit
    boot = json.loads(sriov.data_path().read_text())["gpus"]
    assert {vf["name"] for gpu in boot for vf in gpu["vfs"]} == {"NVIDIA L40S-12Q"}


# -- typos under `all` (issue 41, item 5) -----------------------------------------------

def test_a_typo_of_this_boards_name_under_all_is_refused_keeping_the_last_good(ctx, vfio, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    published = ours(first)["subordinate_configuration"]
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": "{L40S-99Q: all}"}))
    assert out.unit_status.name == "blocked"
    assert "L40S-99Q" in out.unit_status.message and "L40S-12Q" in out.unit_status.message
    assert ours(out)["subordinate_configuration"] == published


def test_a_mixed_fleets_mapping_applies_and_says_which_types_no_gpu_here_offers(ctx, vfio, deb):
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{A100-4C: all, L4-2Q: all}"}, resource=deb))
    assert out.unit_status.name == "active", out.unit_status.message
    assert "set vgpu-device-mappings" not in out.unit_status.message
    assert "no GPU here offers A100-4C, L4-2Q" in out.unit_status.message
