"""vGPU state on the vendor-specific VFIO framework is never lost or wrong (issue 15, items 1-4).

Each test is a host as the fixture's kernel model shows it (creatable_vgpu_types
shrinks as siblings take types and lists nothing on a full GPU), a sequence of
hooks, and what nova-compute (the relation data as it renders it) and the
guests (the VFs' current_vgpu_type) see afterwards.

Facts the fixtures rely on, from NVIDIA's own manager for this framework
(NVIDIA/vgpu-device-manager, pkg/vgpu/vfio/sysfs.go and vfio.go): a VF's
``nvidia/`` directory has ``creatable_vgpu_types`` (what can be created now)
and ``current_vgpu_type`` (the id it holds, 0 for none); no sysfs file lists
every supported type with its name: that tool asks NVML
(nvmlDeviceGetSupportedVgpus, pkg/vgpu/vfio/nvml.go) for names its creatable
lists no longer show. So a full GPU's held ids are named only by what was
learnt while VFs were free.
"""

import json

import pytest
from ops import testing

from unit_tests import debs, principal
from unit_tests.fakehost import L40S_TYPES, l40s_branch_host, l40s_host
from unit_tests.libvirt import defined_guest
from unit_tests.test_charm import install_driver, ours, state
from unit_tests.test_charm_sriov import again, ready, types_of, vfs
from unit_tests.test_nova_rules import nova_devspec
from vgpu import catalogue, novaconf, sriov
from vgpu.errors import HostReadError

MGR = "nvidia-vgpu-mgr"
L40S, H200 = "0000:81:00.0", "0000:c1:00.0"
BRANCH_GPU = "0000:26:00.0"  # l40s_branch_host's L40S
GUEST = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1"


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    return debs.host_driver(tmp_path_factory.mktemp("debs"))


@pytest.fixture(scope="module")
def branch_debs(tmp_path_factory):
    """The host driver of each branch, at the version l40s_branch_host loads."""
    out = tmp_path_factory.mktemp("branch-debs")
    return {v: debs.build(out, f"nvidia-vgpu-ubuntu-{v.split('.')[0]}", v, debs.machine_arch(),
                          debs.host_files())
            for v in ("570.158.02", "550.90.05")}


def vf_file(root, address: str, name: str):
    return root / f"sys/bus/pci/devices/{address}/nvidia/{name}"


def specs(out):
    """The [pci] device specs nova-compute renders from this unit's data."""
    sections = principal.nova_context(ours(out)).get("sections", {})
    return [json.loads(v) for k, v in sections.get("pci", []) if k == "device_spec"]


# -- 1. names that cannot be resolved ----------------------------------------------------

def test_a_full_gpu_whose_names_were_lost_keeps_its_vfs_and_nova_conf(ctx, root, tools, deb):
    """The catalogue is lost (deleted by hand, a remove and redeploy) while the GPU is full."""
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    published = ours(first)["subordinate_configuration"]
    (root / catalogue.FILE).unlink()
    out = ctx.run(ctx.on.update_status(), again(first))
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]  # no VF released
    assert ours(out)["subordinate_configuration"] == published  # nova.conf keeps its specs
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings: L40S-12Q: cannot tell whether GPU 0000:81:00.0 (L40S) serves it: "
        "its VFs hold nvidia-1139, which no VF lists now (a full GPU lists nothing) and which was "
        "not learnt under this driver; release a VF no guest uses (write 0 to its "
        "nvidia/current_vgpu_type) to let the charm read the name; keeping CUSTOM_VGPU_L40S_12Q "
        "on 4 (0000:81:00.4, 0000:81:00.5, 0000:81:00.6, 0000:81:00.7)")


def test_new_type_ids_after_a_driver_upgrade_change_nothing_until_named(
        ctx, root, tools, branch_debs):
    """550 -> 570: L40S-12Q is 1153, then 1139; the boot unit fills the GPU before any hook."""
    old, new = branch_debs["550.90.05"], branch_debs["570.158.02"]
    host = ready(l40s_branch_host(root, "550"), root, tools, old)
    config = {"vgpu-device-mappings": "{L40S-12Q: all}"}
    first = ctx.run(ctx.on.config_changed(), state(config, resource=old))
    assert [int(vf_file(root, a, "current_vgpu_type").read_text())
            for a in vfs(BRANCH_GPU, 5)] == [1153] * 4 + [0]
    published = ours(first)["subordinate_configuration"]
    # The upgrade: the 570 package, its module loaded after the reboot, its type ids; the
    # boot step gave the four VFs L40S-12Q by name (1139 now) before the charm ran.
    install_driver(root, new)
    host.loaded_driver("570.158.02")
    host.vfio_model(BRANCH_GPU).types = dict(L40S_TYPES)
    for address in vfs(BRANCH_GPU, 8):
        vf_file(root, address, "current_vgpu_type").write_text("0\n")
    for address in vfs(BRANCH_GPU, 4):
        vf_file(root, address, "current_vgpu_type").write_text("1139\n")
    # A shut-off instance keeps its VF (Nova keeps its allocation): it must find it as it was.
    defined_guest(root, "instance-0000002a", GUEST, pci_address=vfs(BRANCH_GPU, 1, 1)[0])
    out = ctx.run(ctx.on.update_status(), again(first))
    assert [int(vf_file(root, a, "current_vgpu_type").read_text())
            for a in vfs(BRANCH_GPU, 5)] == [1139] * 4 + [0]
    assert ours(out)["subordinate_configuration"] == published
    assert out.unit_status.message.startswith(
        "vgpu-device-mappings: L40S-12Q: cannot tell whether GPU 0000:26:00.0 (L40S) serves it: "
        "its VFs hold nvidia-1139, which no VF lists now")


def test_explicit_addresses_on_a_full_gpu_with_unknown_names_say_what_is_unknown(
        ctx, root, tools, deb):
    ready(l40s_host(root), root, tools, deb)
    mapping = {"vgpu-device-mappings": "{L40S-12Q: ['81:00.0']}"}
    first = ctx.run(ctx.on.config_changed(), state(mapping, resource=deb))
    published = ours(first)["subordinate_configuration"]
    (root / catalogue.FILE).unlink()
    out = ctx.run(ctx.on.update_status(), again(first))
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert ours(out)["subordinate_configuration"] == published
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith(
        "vgpu-device-mappings: L40S-12Q: cannot tell whether GPU 0000:81:00.0 (L40S) serves it: "
        "its VFs hold nvidia-1139")
    # The operator frees a VF no guest uses: its siblings' lists name the type again.
    vf_file(root, vfs(L40S, 1, 3)[0], "current_vgpu_type").write_text("0\n")
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active", out.unit_status
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert ours(out)["subordinate_configuration"] == published


def test_vfs_without_their_nvidia_files_keep_what_was_published(ctx, root, tools, deb):
    """While the vGPU manager restarts, the VFs briefly have no nvidia/ directory."""
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    published = ours(first)["subordinate_configuration"]
    hidden = root.parent / "hidden-nvidia"
    hidden.mkdir()
    for n, address in enumerate(vfs(L40S, 16)):
        (root / f"sys/bus/pci/devices/{address}/nvidia").resolve().rename(hidden / str(n))
    out = ctx.run(ctx.on.update_status(), again(first))
    assert ours(out)["subordinate_configuration"] == published
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings: L40S-12Q: cannot tell whether GPU 0000:81:00.0 (L40S) serves it: "
        "its VFs show no vGPU types now (no nvidia/ files nor mdev types: are they bound to the "
        "nvidia driver, is nvidia-vgpu-mgr starting?); keeping CUSTOM_VGPU_L40S_12Q on 4 "
        "(0000:81:00.4, 0000:81:00.5, 0000:81:00.6, 0000:81:00.7)")


# -- 2. counts on a partly used GPU ----------------------------------------------------

def test_all_on_a_partly_used_gpu_without_a_catalogue_fills_it_and_releases_nothing(
        ctx, root, tools, deb):
    """Two VFs hold L40S-12Q (given by hand); the others list only 12 GB types."""
    ready(l40s_host(root), root, tools, deb)
    for address in vfs(L40S, 2):
        vf_file(root, address, "current_vgpu_type").write_text("1139\n")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                 resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert [s["address"] for s in specs(out)] == vfs(L40S, 4)
    assert not [line for line in ctx.juju_log if "released" in line.message]


# -- 3. a write that fails halfway -----------------------------------------------------

def test_a_change_refused_halfway_is_rolled_back_to_what_nova_conf_lists(ctx, root, tools, deb):
    host = ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    published = ours(first)["subordinate_configuration"]
    host.vfio_model(L40S).refuse.add(("0000:81:00.5", 1141))  # refuses L40S-24Q only
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    # The four VFs hold L40S-12Q again, as the published (unchanged) nova.conf says.
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert ours(out)["subordinate_configuration"] == published
    assert out.unit_status == testing.BlockedStatus(
        "VF 0000:81:00.5 holds 0 after writing 1141; every VF has its previous type back, as "
        "nova.conf lists them; retrying on the next hook")
    said = [line.message for line in ctx.juju_log if line.message.startswith("vGPU type ")][4:]
    assert said == ([f"vGPU type {a}: released nvidia-1139" for a in vfs(L40S, 4)]
                    + ["vGPU type 0000:81:00.4: nvidia-1141",
                       "vGPU type 0000:81:00.4: released nvidia-1141"]
                    + [f"vGPU type {a}: nvidia-1139" for a in vfs(L40S, 4)])


def test_a_rollback_undoes_only_what_the_hook_wrote(ctx, root, tools, deb, monkeypatch):
    """The race of issue 21: the hook read the VFs empty, the boot step then gave two their type.

    Replayed in one process: the boot step's writes land right after the hook read
    the host. The hook's own write refused, it undoes its writes only.
    """
    from vgpu import facts

    host = ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    four = vfs(L40S, 4)
    for address in four:  # rebooted: the types are gone, the boot step has not run yet
        vf_file(root, address, "current_vgpu_type").write_text("0\n")
    gather = facts.gather
    boot_step = []

    def read_then_boot_step_writes():
        found = gather()
        if not boot_step:
            for address in four[:2]:
                vf_file(root, address, "current_vgpu_type").write_text("1139\n")
                boot_step.append(address)
        return found

    monkeypatch.setattr(facts, "gather", read_then_boot_step_writes)
    host.vfio_model(L40S).refuse.add((four[3], 1139))
    out = ctx.run(ctx.on.start(), again(first))
    assert types_of(root, L40S, 4) == [1139, 1139, 0, 0]
    assert out.unit_status.message.startswith(f"VF {four[3]} holds 0 after writing 1139; every VF")
    undone = [line.message for line in ctx.juju_log if "released" in line.message]
    assert undone == [f"vGPU type {four[2]}: released nvidia-1139"]


def test_a_rollback_that_fails_too_says_the_vfs_differ_from_nova_conf(ctx, root, tools, deb):
    host = ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    host.vfio_model(L40S).refuse.add("0000:81:00.5")  # refuses every type from now on
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert types_of(root, L40S, 2) == [1139, 0]
    assert out.unit_status == testing.BlockedStatus(
        "VF 0000:81:00.5 holds 0 after writing 1141; rolling back failed too (VF 0000:81:00.5 "
        "holds 0 after writing 1139): the VFs do not all hold what nova.conf lists; retrying on "
        "the next hook")


# -- what a host's contents cannot break: the VFs and nova.conf never disagree (issue 30, 9) ------

def test_a_hand_edited_boot_unit_that_is_not_utf8_is_replaced_and_nova_conf_follows_the_vfs(
        ctx, root, tools, deb):
    """An operator's editor saved the unit in Latin-1: every hook used to fail reading it."""
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    unit = sriov.unit_path()
    unit.write_bytes(unit.read_bytes().replace(b"Description=", b"Description=Fran\xe7ais "))
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert types_of(root, L40S, 5) == [1141] * 2 + [0] * 3
    assert [s["resource_class"] for s in specs(out)] == ["CUSTOM_VGPU_L40S_24Q"] * 2
    assert unit.read_text() == sriov.render_unit()  # the charm's own text again
    assert out.unit_status.name == "active", out.unit_status
    unit.write_bytes(b"\xff" * 10)
    assert ctx.run(ctx.on.update_status(), again(out)).unit_status.name == "active"


class _UnforeseenError(Exception):
    """A failure no step foresees (a bug, an exception no reader maps)."""


@pytest.mark.parametrize("where,failure,said", [
    ("facts.gather", HostReadError("cannot read /sys/bus/pci/devices: Input/output error"),
     "cannot read /sys/bus/pci/devices: Input/output error"),
    ("sriov.boot_data", _UnforeseenError("unforeseen"),
     "nvidia-vgpu-vfs.service: not updated after the VFs took their types "
     "(_UnforeseenError: unforeseen); retrying on the next hook"),
])
def test_a_failure_after_the_vf_types_are_written_still_gives_nova_compute_what_they_hold(
        ctx, root, tools, deb, monkeypatch, where, failure, said):
    """Whatever fails once the VFs hold the new types, nova-compute gets the specs that list them.

    A sysfs read that fails (the host read again after the writes), or a failure no
    step foresees, in the boot unit's step that follows the writes.
    """
    import vgpu

    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    module, name = where.split(".")
    real = getattr(getattr(vgpu, module), name)

    def fails_once_the_vfs_changed(*args, **kwargs):
        if types_of(root, L40S, 1) == [1141]:
            raise failure
        return real(*args, **kwargs)

    monkeypatch.setattr(getattr(vgpu, module), name, fails_once_the_vfs_changed)
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert types_of(root, L40S, 5) == [1141] * 2 + [0] * 3
    assert [s["resource_class"] for s in specs(out)] == ["CUSTOM_VGPU_L40S_24Q"] * 2
    assert out.unit_status.name == "blocked"
    assert said in out.unit_status.message


# -- 4. vanishing GPUs ------------------------------------------------------------------

def vanish(root, *gpus):
    """The GPUs fall off the bus (a driver reload, a failed device): discovery finds none of them."""
    for address in gpus:
        (root / f"sys/bus/pci/devices/{address}").unlink()


def test_report_in_placement_stays_when_the_gpus_vanish_after_the_mapping_was_cleared(
        ctx, root, tools, deb):
    ready(l40s_host(root), root, tools, deb)
    config = {"vgpu-device-mappings": "{L40S-12Q: all}", "pci-in-placement": True}
    first = ctx.run(ctx.on.config_changed(), state(config, resource=deb))
    cleared = ctx.run(ctx.on.config_changed(), again(first, {"pci-in-placement": True}))
    sections = principal.nova_context(ours(cleared))["sections"]
    assert sections["pci"] == [["report_in_placement", "True"]]  # sticky once published
    vanish(root, L40S, H200)
    out = ctx.run(ctx.on.update_status(), again(cleared))
    # Turning it off after devices were reported stops nova-compute.
    assert principal.nova_context(ours(out))["sections"] == sections


def test_every_gpu_vanishing_is_not_active_and_names_the_missing_gpus(ctx, root, tools, deb):
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{L40S-12Q: all}"},
                                                   resource=deb))
    published = ours(first)["subordinate_configuration"]
    vanish(root, L40S, H200)
    out = ctx.run(ctx.on.update_status(), again(first))
    assert ours(out)["subordinate_configuration"] == published
    assert out.unit_status == testing.BlockedStatus(
        "published vGPU devices missing: the GPU on bus 0000:81 with its VFs 0000:81:00.4, "
        "0000:81:00.5, 0000:81:00.6, 0000:81:00.7 (no NVIDIA GPU found now: driver reloading? "
        "check lspci and journalctl -k); keeping CUSTOM_VGPU_L40S_12Q on 4; removed for good? "
        "juju run nova-compute-nvidia-vgpu/0 forget-gpus gpus=0000:81:00.4")


def test_one_gpu_vanishing_says_the_same(ctx, root, tools, deb):
    ready(l40s_host(root), root, tools, deb)
    mapping = {"vgpu-device-mappings": "{L40S-12Q: all, H200X-35C: ['c1:00.0']}"}
    first = ctx.run(ctx.on.config_changed(), state(mapping, resource=deb))
    published = ours(first)["subordinate_configuration"]
    vanish(root, H200)
    out = ctx.run(ctx.on.update_status(), again(first))
    assert ours(out)["subordinate_configuration"] == published
    assert out.unit_status == testing.BlockedStatus(
        "published vGPU devices missing: GPU 0000:c1:00.0 with its VFs 0000:c1:00.4, "
        "0000:c1:00.5, 0000:c1:00.6, 0000:c1:00.7 (1 NVIDIA GPU found now: driver reloading? "
        "check lspci and journalctl -k); keeping CUSTOM_VGPU_H200X_35C on 4, "
        "CUSTOM_VGPU_L40S_12Q on 4; removed for good? juju run nova-compute-nvidia-vgpu/0 "
        "forget-gpus gpus=0000:c1:00.0")


# -- one GPU vanishes while the other's mapping changes (issue 15, item 4) ----------------

H200_VFS = ", ".join(vfs(H200, 4))


def h200_missing(mapping: str, kept: str) -> str:
    """The status: the GPU named as the option names it, else by its bus, with its VFs."""
    gpu, forget = (("GPU 0000:c1:00.0", "0000:c1:00.0") if "c1:00.0" in mapping
                   else ("the GPU on bus 0000:c1", "0000:c1:00.4"))
    return (f"published vGPU devices missing: {gpu} with its VFs {H200_VFS} (1 NVIDIA GPU found "
            f"now: driver reloading? check lspci and journalctl -k); keeping {kept}; removed for "
            f"good? juju run nova-compute-nvidia-vgpu/0 forget-gpus gpus={forget}")


def checked_specs(out):
    """The device specs nova-compute gets, under Nova's rules for the merged [pci] section."""
    sections = principal.nova_context(ours(out))["sections"]
    novaconf.check(sections)
    found = specs(out)
    for value in (v for k, v in sections["pci"] if k == "device_spec"):
        nova_devspec(value)
    addresses = [s["address"] for s in found]
    assert len(addresses) == len(set(addresses))  # one spec per VF
    classes = {}  # one resource class per PF (its bus: NVIDIA's VFs sit on their GPU's)
    for spec in found:
        classes.setdefault(spec["address"].rsplit(":", 1)[0], set()).add(spec["resource_class"])
    assert all(len(c) == 1 for c in classes.values()), classes
    return {a: s["resource_class"] for a, s in zip(addresses, found)}


def served(l40s: str, count: int, h200: str = "CUSTOM_VGPU_H200X_35C"):
    return {**{a: l40s for a in vfs(L40S, count)}, **{a: h200 for a in vfs(H200, 4)}}


@pytest.mark.parametrize("mapping", ["{L40S-12Q: all, H200X-35C: all}",
                                     "{L40S-12Q: all, H200X-35C: ['c1:00.0']}"])
def test_a_vanished_h200_keeps_its_device_specs_exactly(ctx, root, tools, deb, mapping):
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": mapping}, resource=deb))
    published = ours(first)["subordinate_configuration"]
    vanish(root, H200)
    out = ctx.run(ctx.on.update_status(), again(first))
    assert ours(out)["subordinate_configuration"] == published
    assert checked_specs(out) == served("CUSTOM_VGPU_L40S_12Q", 4)
    assert out.unit_status == testing.BlockedStatus(h200_missing(
        mapping, kept="CUSTOM_VGPU_H200X_35C on 4, CUSTOM_VGPU_L40S_12Q on 4"))


@pytest.mark.parametrize("mapping", ["{L40S-24Q: all, H200X-35C: all}",
                                     "{L40S-24Q: all, H200X-70C: ['c1:00.0']}",
                                     "{L40S-24Q: all}"])
def test_the_present_l40s_takes_a_new_type_while_the_vanished_h200_keeps_its_specs(
        ctx, root, tools, deb, mapping):
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{L40S-12Q: all, H200X-35C: all}"}, resource=deb))
    kept = [json.dumps(s, sort_keys=True) for s in specs(first) if s["address"].startswith("0000:c1")]
    vanish(root, H200)
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": mapping}))
    assert types_of(root, L40S, 5) == [1141] * 2 + [0] * 3  # the new type reached the L40S
    assert checked_specs(out) == served("CUSTOM_VGPU_L40S_24Q", 2)
    sections = principal.nova_context(ours(out))["sections"]
    assert [v for k, v in sections["pci"] if "c1:00" in v] == kept  # verbatim
    assert out.unit_status == testing.BlockedStatus(h200_missing(
        mapping, kept="CUSTOM_VGPU_H200X_35C on 4, CUSTOM_VGPU_L40S_24Q on 2"))


def test_forget_gpus_drops_the_vanished_h200_by_its_own_address(ctx, root, tools, deb):
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{L40S-12Q: all, H200X-35C: all}"}, resource=deb))
    vanish(root, H200)
    kept = ctx.run(ctx.on.update_status(), again(first))
    out = ctx.run(ctx.on.action("forget-gpus", params={"gpus": H200}), again(kept))
    assert ctx.action_results == {"forgotten": H200_VFS}
    assert checked_specs(out) == {a: "CUSTOM_VGPU_L40S_12Q" for a in vfs(L40S, 4)}
    later = ctx.run(ctx.on.update_status(), again(out))
    assert checked_specs(later) == {a: "CUSTOM_VGPU_L40S_12Q" for a in vfs(L40S, 4)}
    assert later.unit_status.name == "active"


def test_a_vanished_h200_coming_back_is_published_again_and_the_unit_is_active(
        ctx, root, tools, deb):
    ready(l40s_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{L40S-12Q: all, H200X-35C: all}"}, resource=deb))
    link = root / f"sys/bus/pci/devices/{H200}"
    target = link.readlink()
    vanish(root, H200)
    kept = ctx.run(ctx.on.config_changed(), again(
        first, {"vgpu-device-mappings": "{L40S-24Q: all, H200X-35C: all}"}))
    assert checked_specs(kept) == served("CUSTOM_VGPU_L40S_24Q", 2)
    link.symlink_to(target)
    out = ctx.run(ctx.on.update_status(), again(kept))
    assert checked_specs(out) == served("CUSTOM_VGPU_L40S_24Q", 2)
    assert types_of(root, H200, 5) == [1282] * 4 + [0]
    assert out.unit_status.name == "active"


def test_vfs_missing_of_a_gpu_present_are_no_vanished_gpu_and_forget_gpus_refuses_them(
        ctx, root, tools, deb):
    """After a reboot sriov-manage fails for the H200: its GPU is here, its VFs are not."""
    host = ready(l40s_host(root), root, tools, deb)
    mapping = {"vgpu-device-mappings": "{L40S-12Q: all, H200X-35C: ['c1:00.0']}"}
    first = ctx.run(ctx.on.config_changed(), state(mapping, resource=deb))
    published = ours(first)["subordinate_configuration"]
    host.reboot()
    host.fail_sriov_manage(H200)
    out = ctx.run(ctx.on.start(), again(first))
    assert out.unit_status == testing.BlockedStatus(
        "no virtual functions on SR-IOV GPU 0000:c1:00.0 (H200 SXM 141GB) after sriov-manage -e: "
        "sriov-manage -e 0000:c1:00.0 failed: Enabling VFs on 0000:c1:00.0 failed: Input/output "
        "error; the boot step's attempts: journalctl -u nvidia-vgpu-vfs.service")
    assert ours(out)["subordinate_configuration"] == published
    with pytest.raises(testing.ActionFailed) as failed:
        ctx.run(ctx.on.action("forget-gpus", params={"gpus": "0000:c1:00.4"}), again(out))
    assert failed.value.message == (
        "nothing forgotten: 0000:c1:00.4 is a VF of GPU 0000:c1:00.0, which is on this host "
        "without its VFs: sriov-manage -e failed (read journalctl -u nvidia-vgpu-vfs and the "
        "unit's status); once its VFs are back the next hook serves them again")
    assert ours(failed.value.state)["subordinate_configuration"] == published
