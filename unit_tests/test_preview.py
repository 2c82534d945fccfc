"""preview-mappings (vgpu.preview through the charm, ops.testing): what a mapping would do, done nowhere.

Hosts: the L40S and H200 SXM on the vendor-specific VFIO framework (unit_tests.fakehost),
before and after a mapping was applied, with their VFs not enabled yet, and with a guest on
a VF. Each test snapshots the host tree (every file's bytes, mode and link) and the charm's
State before and after: nothing may differ.
"""

import os

import pytest
from ops import testing

from unit_tests.fakehost import l40s_host
from unit_tests.libvirt import defined_guest
from unit_tests.test_charm import state
from unit_tests.test_charm_sriov import MAPPING, again, ready, types_of
from vgpu import catalogue, table

L40S, H200 = "0000:81:00.0", "0000:c1:00.0"


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    from unit_tests import debs

    return debs.host_driver(tmp_path_factory.mktemp("debs"))


def snapshot(root):
    """Every path under the host root: its kind, mode and bytes (a link: its target)."""
    found = {}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            info = os.lstat(path)
            if os.path.islink(path):
                found[path] = ("link", os.readlink(path))
            elif os.path.isdir(path):
                found[path] = ("dir", info.st_mode)
            else:
                with open(path, "rb") as handle:
                    found[path] = ("file", info.st_mode, handle.read())
    return found


def charms(out: testing.State):
    return {s for s in out.stored_states if s.owner_path == "NovaComputeNvidiaVgpuCharm"}


def settled(ctx, deb) -> testing.State:
    """What an update-status with no mapping leaves (the charm's StoredState set up)."""
    return again(ctx.run(ctx.on.update_status(), state({}, resource=deb)))


def preview(ctx, root, before: testing.State, mappings: str):
    """Run the action; assert it changed neither the host tree nor the State; its results."""
    tree = snapshot(root)
    out = ctx.run(ctx.on.action("preview-mappings", params={"mappings": mappings}), before)
    results = ctx.action_results
    assert snapshot(root) == tree
    assert out.relations == before.relations
    # The charm's own StoredState (ops' framework counts events in its own)
    assert charms(out) == charms(before)
    assert out.config == before.config
    # The status after the action is the option in force's, never the previewed value's.
    assert out.unit_status == ctx.run(ctx.on.update_status(), before).unit_status
    return results


@pytest.fixture
def applied(ctx, root, tools, deb):
    """The L40S and H200 with MAPPING applied by a config-changed; the State that hook left."""
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert first.unit_status.name == "active"
    return again(first)


def test_a_new_profile_is_shown_vf_by_vf_with_its_nova_conf_and_nothing_is_written(ctx, root, applied):
    results = preview(ctx, root, applied, "{L40S-24Q: ['81:00.0'], 'NVIDIA H200X-35C': ['c1:00.0']}")
    assert results["verdict"] == "would apply"
    # 48 GB / 24 GB: two VFs keep a type (now L40S-24Q), two are released; the H200 stays.
    # What a VF holds now is said by its type id, what it would hold by the mapping's name too.
    assert results["vf-changes"] == (
        "VF            holds now    would hold\n"
        "0000:81:00.4  nvidia-1139  L40S-24Q (nvidia-1141)\n"
        "0000:81:00.5  nvidia-1139  L40S-24Q (nvidia-1141)\n"
        "0000:81:00.6  nvidia-1139  none\n"
        "0000:81:00.7  nvidia-1139  none")
    conf = results["nova-conf"]
    assert conf.startswith("[pci]\ndevice_spec = ")
    assert conf.count("CUSTOM_VGPU_L40S_24Q") == 2 and conf.count("CUSTOM_VGPU_H200X_35C") == 4
    assert results["gpus"]["gpu-0"]["would-serve"] == "NVIDIA L40S-24Q on 2 VF(s)"
    # The L40S's VFs hold types now: a VF lists only what fits beside them.
    assert results["gpus"]["gpu-0"]["types-on-offer"].startswith(
        "unknown until applied: its VFs hold nvidia-1139")
    assert types_of(root, L40S, 5) == [1139, 1139, 1139, 1139, 0]
    assert results["summary"] == (
        "4 VF(s) would change type; nova-compute would get CUSTOM_VGPU_H200X_35C on 4, "
        "CUSTOM_VGPU_L40S_24Q on 2")


def test_a_profile_one_vf_takes_is_named_beside_the_gpu_that_keeps_its_own(ctx, root, applied):
    results = preview(ctx, root, applied, "{L40S-48Q: ['81:00.0'], 'NVIDIA H200X-35C': ['c1:00.0']}")
    # 48 GB / 48 GB: one VF takes it, three are released; the H200's four keep H200X-35C.
    assert results["vf-changes"] == (
        "VF            holds now    would hold\n"
        "0000:81:00.4  nvidia-1139  L40S-48Q (nvidia-1142)\n"
        "0000:81:00.5  nvidia-1139  none\n"
        "0000:81:00.6  nvidia-1139  none\n"
        "0000:81:00.7  nvidia-1139  none")


def test_the_mapping_in_force_changes_nothing(ctx, root, applied):
    results = preview(ctx, root, applied, MAPPING)
    assert results["verdict"] == results["summary"] == "nothing would change"
    assert "vf-changes" not in results and "whole-gpus" not in results


def test_a_mapping_emptied_releases_every_vf_and_gives_nova_compute_nothing(ctx, root, applied):
    results = preview(ctx, root, applied, "{}")
    assert results["verdict"] == "would apply"
    assert results["summary"] == "8 VF(s) would change type; nova-compute would get no vGPU devices"
    assert results["nova-conf"] == "no vGPU sections"
    assert [line.split()[-1] for line in results["vf-changes"].splitlines()[1:]] == ["none"] * 8
    assert {g["would-serve"] for g in results["gpus"].values()} == {"nothing"}


def test_a_host_without_the_driver_leaves_every_mapped_gpu_unknown_until_applied(ctx, root,
                                                                                 tools, deb):
    """No vGPU host driver known to dpkg at all (purged by hand): the hook installs it first."""
    l40s_host(root)
    before = settled(ctx, deb)
    status = root / "var/lib/dpkg/status"
    status.write_text("\n\n".join(stanza for stanza in status.read_text().split("\n\n")
                                   if "Package: nvidia-vgpu-ubuntu-" not in stanza))
    tree = snapshot(root)  # preview() compares the status with an update-status's, which
    # would install the driver again: the host tree alone is compared here
    ctx.run(ctx.on.action("preview-mappings", params={"mappings": "{L40S-12Q: all}"}), before)
    results = ctx.action_results
    assert snapshot(root) == tree
    assert results["verdict"] == results["nova-conf"] == "unknown until applied"
    assert results["summary"] == (
        "unknown until applied on 2 GPU(s): GPU 0000:81:00.0: the vGPU host driver is not "
        "installed yet; GPU 0000:c1:00.0: the vGPU host driver is not installed yet")
    assert results["gpus"]["gpu-0"]["types-on-offer"] == (
        "unknown until applied: the vGPU host driver is not installed yet")
    assert results["gpus"]["gpu-0"]["would-serve"] == "unknown until applied"


def test_a_refused_mapping_gets_the_words_the_status_would_use(ctx, root, applied):
    bad = "{L40S-12Q: ['81:00.0'], L40S-24Q: ['81:00.0']}"
    results = preview(ctx, root, applied, bad)
    status = ctx.run(ctx.on.config_changed(), again_with(applied, bad)).unit_status
    assert status.name == "blocked"
    assert results["verdict"] == "refused"
    assert results["refused"] == status.message
    assert results["nova-conf"] == "nothing new: the last published sections stay"


def test_a_value_that_is_not_yaml_is_refused_as_the_status_says(ctx, root, applied):
    results = preview(ctx, root, applied, "{L40S-12Q: [")
    status = ctx.run(ctx.on.config_changed(), again_with(applied, "{L40S-12Q: [")).unit_status
    assert results == {"verdict": "refused", "refused": status.message,
                       "summary": f"refused: {status.message}"}


def test_guests_holding_vfs_that_would_change_block_it_as_the_hook_would(ctx, root, applied):
    defined_guest(root, "instance-0000002a", "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1",
                  pci_address="0000:81:00.5")
    defined_guest(root, "instance-0000002b", "5c1d7e0a-2b1f-4c57-8d36-2f4e9a7b1c0e",
                  pci_address="0000:81:00.6")
    results = preview(ctx, root, applied, "{L40S-24Q: all}")
    status = ctx.run(ctx.on.config_changed(), again_with(applied, "{L40S-24Q: all}")).unit_status
    assert results["verdict"] == "refused"
    assert results["refused"] == status.message
    assert results["guests-blocking"] == (  # a line each
        "instance-0000002a (vm-instance-0000002a, 0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1, shut off)\n"
        "instance-0000002b (vm-instance-0000002b, 5c1d7e0a-2b1f-4c57-8d36-2f4e9a7b1c0e, shut off)")
    # The value was planned (its sections made) before the guests refused it: none are shown.
    assert results["nova-conf"] == "nothing new: the last published sections stay"


def test_vfs_not_enabled_yet_leave_the_types_unknown_until_applied(ctx, root, tools, deb):
    ready(l40s_host(root, enabled=False), root, tools, deb)
    results = preview(ctx, root, settled(ctx, deb), "{L40S-12Q: all}")
    assert results["verdict"] == "unknown until applied"
    assert results["nova-conf"] == "unknown until applied"
    gpu = results["gpus"]["gpu-0"]
    assert gpu["types-on-offer"] == (
        "unknown until applied: its VFs are not enabled yet (sriov-manage -e runs first)")
    assert "sriov-manage" not in "".join(tools.calls())


def test_a_fresh_host_learns_no_type_names_on_disk(ctx, root, tools, deb):
    ready(l40s_host(root), root, tools, deb)
    before = settled(ctx, deb)
    (root / catalogue.FILE).unlink()  # as on a host where no hook learnt them yet: the snapshot
    # in preview() shows the action saved none
    results = preview(ctx, root, before, "{L40S-12Q: all}")
    assert results["verdict"] == "would apply"
    assert results["gpus"]["gpu-0"]["types-on-offer"] == (
        "L40S-2B, L40S-4Q, L40S-12Q, L40S-16Q, L40S-24Q, L40S-48Q")


def test_a_host_nova_compute_has_not_configured_yet_waits_and_types_no_gpu_offers_are_noted(
        ctx, root, tools, deb):
    """One value for a mixed fleet (``all`` for boards this host lacks), on a host being deployed."""
    ready(l40s_host(root), root, tools, deb)
    before = settled(ctx, deb)
    (root / "etc/nova/nova.conf").unlink()  # nova-compute has not written it yet
    results = preview(ctx, root, before, "{L40S-12Q: all, A100-4C: all, L4-2Q: all}")
    assert results["verdict"] == "would apply"
    assert results["waits"] == ("waiting for nova-compute to write /etc/nova/nova.conf before "
                                "publishing [pci] settings")
    assert results["notes"] == (
        "A100-4C: no GPU on this host offers it, nothing published for it\n"
        "L4-2Q: no GPU on this host offers it, nothing published for it")


def test_a_unit_not_yet_integrated_through_nova_vgpu_previews_what_nova_compute_would_get(
        ctx, root, tools, deb):
    """Related to its principal through juju-info only: nothing published yet, nothing to compare."""
    ready(l40s_host(root), root, tools, deb)
    info = testing.SubordinateRelation("juju-info", remote_app_name="nova-compute")
    out = ctx.run(ctx.on.update_status(), state({}, relations=[info], resource=deb))
    assert out.unit_status.message.startswith("relate to nova-compute")
    before = again(out)
    empty = preview(ctx, root, before, "{}")
    assert empty["verdict"] == empty["summary"] == "nothing would change"
    mapped = preview(ctx, root, before, "{L40S-12Q: all}")
    assert mapped["summary"] == (
        "4 VF(s) would change type; nova-compute would get CUSTOM_VGPU_L40S_12Q on 4")


RTX = ("0000:42:00.0", "0000:8c:00.0", "0001:04:00.0", "0001:c8:00.0")


@pytest.fixture(scope="module")
def rtx_deb(tmp_path_factory):
    """The host driver at the version cubecos #312's host has loaded (580.105.06)."""
    from unit_tests import debs

    return debs.build(tmp_path_factory.mktemp("rtx-deb"), "nvidia-vgpu-ubuntu-580", "580.105.06",
                      debs.machine_arch(), debs.host_files())


def test_a_full_host_s_vf_table_and_gpus_stay_within_what_juju_accepts_and_say_so(
        ctx, root, tools, rtx_deb):
    """The host of cubecos #312 as it is: four RTX PRO 6000, 48 VFs each (192)."""
    from unit_tests.fakehost import rtx_pro_6000_host
    from unit_tests.test_charm_sriov import rtx_vfs

    ready(rtx_pro_6000_host(root), root, tools, rtx_deb)
    before = settled(ctx, rtx_deb)
    results = preview(ctx, root, before, "{DC-2Q: all}")
    assert results["summary"] == ("192 VF(s) would change type; nova-compute would get "
                                  "CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_2Q on 192")
    rows = results["vf-changes"].splitlines()
    assert len(rows) == 1 + 100 + 1  # the header, the table's bound, what it left out
    assert rows[100].split() == [rtx_vfs(RTX[2], 4)[-1], "none", "RTX", "Pro", "6000",
                                 "Blackwell", "DC-2Q", "(nvidia-2000)"]
    assert rows[101] == "... and 92 more VFs; see each GPU's would-serve"
    assert [g["would-serve"] for g in results["gpus"].values()] == [
        "NVIDIA RTX Pro 6000 Blackwell DC-2Q on 48 VF(s)"] * 4
    assert "truncated" not in results
    out = ctx.run(ctx.on.config_changed(), again_with(before, "{DC-2Q: all}"))
    assert out.unit_status.name == "active", out.unit_status
    applied = again(out)
    # A guest on every VF: a change of type refused. The refusal (and the summary that repeats
    # it) names three guests; the full list is said once, in guests-blocking.
    a_guest_on_every_vf(root)
    results = preview(ctx, root, applied, "{DC-4Q: all}")
    assert results["verdict"] == "refused"
    status = ctx.run(ctx.on.config_changed(), again_with(applied, "{DC-4Q: all}")).unit_status
    assert results["refused"] == status.message  # in the status's words
    assert results["refused"].startswith("vgpu-device-mappings not applied, no VF changed: "
                                         "192 guest(s) hold vGPUs, running or shut off: "
                                         "instance-00000000 (")
    # One guest a line, whole lines only, as many as a value holds; the rest counted, and where
    # to list them said.
    *named, rest = results["guests-blocking"].splitlines()
    assert named == [f"instance-{n:08x} (vm-instance-{n:08x}, 0b7a0f2c-6f2d-4b3c-9b1e-{n:012x}, "
                     "shut off)" for n in range(len(named))]
    assert len(results["guests-blocking"].encode()) <= table.MAX_VALUE_BYTES
    assert rest == (f"... and {192 - len(named)} more guests; see juju run "
                    "nova-compute-nvidia-vgpu/0 vgpu-usage")
    said = [value for _, value in table.flatten(results)]
    assert sum(str(value).count("instance-00000005 ") for value in said) == 1
    # The GPUs fit beside it: all four, nothing left out.
    assert [g["would-serve"] for g in results["gpus"].values()] == [
        "NVIDIA RTX Pro 6000 Blackwell DC-4Q on 24 VF(s)"] * 4  # 96 GB / 4 GB
    assert "truncated" not in results


def a_guest_on_every_vf(root):
    """A shut-off guest on each of the RTX PRO 6000 host's 192 VFs: instance-00000000 to -bf."""
    from unit_tests.test_charm_sriov import rtx_vfs

    for n, vf in enumerate(vf for gpu in RTX for vf in rtx_vfs(gpu, 48)):
        defined_guest(root, f"instance-{n:08x}", f"0b7a0f2c-6f2d-4b3c-9b1e-{n:012x}",
                      pci_address=vf)


def test_a_refusal_on_a_full_host_names_three_guests_and_where_the_rest_are_listed(
        ctx, root, tools, rtx_deb):
    """The blocked status on the 192-guest host: one line that `juju status` can show."""
    from unit_tests.fakehost import rtx_pro_6000_host

    ready(rtx_pro_6000_host(root), root, tools, rtx_deb)
    before = settled(ctx, rtx_deb)
    applied = again(ctx.run(ctx.on.config_changed(), again_with(before, "{DC-2Q: all}")))
    a_guest_on_every_vf(root)
    out = ctx.run(ctx.on.config_changed(), again_with(applied, "{DC-4Q: all}"))
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings not applied, no VF changed: 192 guest(s) hold vGPUs, running or "
        "shut off: "
        "instance-00000000 (vm-instance-00000000, 0b7a0f2c-6f2d-4b3c-9b1e-000000000000, shut off), "
        "instance-00000001 (vm-instance-00000001, 0b7a0f2c-6f2d-4b3c-9b1e-000000000001, shut off), "
        "instance-00000002 (vm-instance-00000002, 0b7a0f2c-6f2d-4b3c-9b1e-000000000002, shut off) "
        "and 189 more (juju run nova-compute-nvidia-vgpu/0 vgpu-usage lists the vGPUs guests "
        "hold); move them or restore the mapping")
    # The action it names lists the guests left out (within its own bounds, first ones first).
    ctx.run(ctx.on.action("vgpu-usage"), again(out))
    assert "instance-00000003" in ctx.action_results["table"]


def again_with(before: testing.State, mapping: str) -> testing.State:
    return testing.State(config={**before.config, "vgpu-device-mappings": mapping},
                         relations=before.relations, resources=before.resources,
                         stored_states=before.stored_states)


# -- MIG-backed profiles (the RTX PRO 6000 fixture, MIG mode kept by the stand-in nvidia-smi) ---

def test_a_mig_backed_profile_out_of_mig_mode_is_refused_in_the_statuss_words(ctx, root, tools,
                                                                              deb):
    from unit_tests.fakehost import rtx_pro_6000_host
    from unit_tests.test_charm_mig import ready as mig_ready

    host = mig_ready(rtx_pro_6000_host(root, vfs=8, gpus=2, mig="Disabled"), root, tools, deb)
    before = settled(ctx, deb)
    results = preview(ctx, root, before, "{DC-1-24Q: ['42:00.0']}")
    status = ctx.run(ctx.on.config_changed(),
                     again_with(before, "{DC-1-24Q: ['42:00.0']}")).unit_status
    assert status.message.startswith("GPU 0000:42:00.0 is not in MIG mode")
    assert (results["verdict"], results["refused"]) == ("refused", status.message)
    assert results["gpus"]["gpu-0"]["mig-mode"] == "disabled"
    assert results["gpus"]["gpu-0"]["gpu-instances"] == "4 x 1g.24gb+gfx for DC-1-24Q"
    assert host.mig_mode("0000:42:00.0")["current"] == "Disabled"


def test_gpu_instances_the_hook_would_create_leave_the_types_unknown_until_applied(ctx, root,
                                                                                  tools, deb):
    from unit_tests.fakehost import rtx_pro_6000_host
    from unit_tests.test_charm_mig import ready as mig_ready

    host = mig_ready(rtx_pro_6000_host(root, vfs=8, gpus=2, mig="Enabled"), root, tools, deb)
    results = preview(ctx, root, settled(ctx, deb), "{DC-1-24Q: ['42:00.0']}")
    assert results["verdict"] == "unknown until applied"
    assert results["gpus"]["gpu-0"]["types-on-offer"] == (
        "unknown until applied: its GPU instances (4 x 1g.24gb+gfx) are created first, and its VFs "
        "list MIG-backed types only then")
    assert host.gpu_instances("0000:42:00.0") == []  # none created by the preview
