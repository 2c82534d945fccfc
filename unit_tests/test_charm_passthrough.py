"""Whole GPUs beside vGPUs on one host: the charm end to end (issue 37, part 1)."""

import json
import os

import pytest
from ops import testing

from unit_tests import debs, principal
from unit_tests.fakehost import v100_host, whole_and_vgpu_host
from unit_tests.libvirt import defined_guest
from unit_tests.test_charm import ours, state
from unit_tests.test_charm_sriov import again, ready
from unit_tests.test_nova_rules import nova_devspec
from vgpu import passthrough, sriov

L40S, H200 = "0000:81:00.0", "0000:c1:00.0"
MAPPING = "{L40S-12Q: all, passthrough: [c1:00.0]}"
GUEST = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1"


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    return debs.host_driver(tmp_path_factory.mktemp("debs"))


def specs(out):
    sections = principal.nova_context(ours(out)).get("sections", {})
    return [json.loads(v) for k, v in sections.get("pci", []) if k == "device_spec"]


def test_a_gpu_still_on_nvidia_goes_to_vfio_pci_and_is_published_whole(ctx, root, tools, deb):
    host = ready(whole_and_vgpu_host(root, moved=False), root, tools, deb)
    host.unbind_lock(H200)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert (root / f"sys/bus/pci/devices/{H200}/driver_override").read_text() == "vfio-pci"
    assert "modprobe vfio-pci" in tools.calls()  # loaded before the probe: nothing else loads it
    assert sriov.driver_of(H200) == "vfio-pci"  # read back: the probe's write says nothing
    assert H200 in (root / passthrough.RULES).read_text()
    assert not list((root / f"sys/bus/pci/devices/{H200}").glob("virtfn*"))  # no VFs enabled
    whole = [s for s in specs(out) if s["address"] == H200]
    assert len(whole) == 1 and whole[0]["resource_class"].startswith("CUSTOM_GPU_")
    for spec in specs(out):
        nova_devspec(json.dumps(spec))
    assert {s["address"][:7] for s in specs(out)} == {"0000:81", "0000:c1"}


def test_a_held_gpu_is_not_published_until_it_is_free(ctx, root, tools, deb):
    host = ready(whole_and_vgpu_host(root, moved=False), root, tools, deb)
    host.unbind_lock(H200, held=True)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert [s for s in specs(out) if s["address"] == H200] == []
    assert isinstance(out.unit_status, testing.BlockedStatus)
    assert "held through the nvidia driver" in out.unit_status.message


def test_a_gpu_both_whole_and_split_is_refused_keeping_the_last_good(ctx, root, tools, deb):
    ready(whole_and_vgpu_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    published = ours(first)["subordinate_configuration"]
    out = ctx.run(ctx.on.config_changed(), again(
        first, {"vgpu-device-mappings": "{L40S-12Q: [81:00.0], passthrough: [81:00.0, c1:00.0]}"}))
    assert ours(out)["subordinate_configuration"] == published
    assert "GPU 0000:81:00.0 (L40S) is mapped both whole (passthrough) and to L40S-12Q" \
        in out.unit_status.message


def test_a_gpu_a_guest_holds_does_not_move_between_whole_and_vgpu(ctx, root, tools, deb):
    ready(whole_and_vgpu_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    published = ours(first)["subordinate_configuration"]
    defined_guest(root, "instance-00000001", GUEST, pci_address=H200)
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": "{L40S-12Q: all}"}))
    assert ours(out).get("subordinate_configuration", published) == published
    assert "moves between whole (passthrough) and vGPU" in out.unit_status.message


def test_a_host_of_whole_gpus_needs_no_driver(ctx, root, tools, deb):
    host = v100_host(root, count=1)
    host.bind("0000:c1:00.0", "vfio-pci")
    out = ctx.run(ctx.on.install(), state({"vgpu-device-mappings": "{passthrough: [c1:00.0]}"},
                                          resource=deb))
    assert not (root / "usr/lib/nvidia/sriov-manage").exists()  # the attached driver not installed
    assert out.unit_status == testing.ActiveStatus(out.unit_status.message)
    assert "no vGPU host driver needed" in out.unit_status.message
    assert [s["address"] for s in specs(out)] == ["0000:c1:00.0"]


def test_remove_takes_the_udev_rule_away_and_leaves_the_gpu_where_it_is(ctx, root, tools, deb):
    ready(whole_and_vgpu_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert (root / passthrough.RULES).exists()
    ctx.run(ctx.on.remove(), again(first))
    assert not (root / passthrough.RULES).exists()
    assert (root / f"sys/bus/pci/devices/{H200}/driver_override").read_text().strip() == "vfio-pci"


# -- issue 41: a whole GPU moves in one hook, only once the mapping is accepted -------------

WHOLE = "{L40S-12Q: all, passthrough: [c1:00.0]}"
H200_VF = "0000:c1:00.4"


def booted_with_vfs(root, tools, deb):
    """The L40S and H200, the H200 on nvidia with its VFs enabled (NVIDIA's sriov unit's doing)."""
    host = ready(whole_and_vgpu_host(root, moved=False), root, tools, deb)
    assert host.enable_recorded_vfs(["-e", H200]) == 0
    host.unbind_lock(H200)
    return host


def untouched(root):
    """The H200 as the boot left it: on nvidia, VFs there, no driver_override, no udev rule."""
    return (sriov.driver_of(H200) == "nvidia"
            and (root / f"sys/bus/pci/devices/{H200}/virtfn0").exists()
            and (root / f"sys/bus/pci/devices/{H200}/driver_override").read_text().strip() == "(null)"
            and not (root / passthrough.RULES).exists())


def test_vfs_no_guest_holds_are_disabled_and_the_gpu_goes_whole_in_the_same_hook(ctx, root,
                                                                                 tools, deb):
    booted_with_vfs(root, tools, deb)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": WHOLE}, resource=deb))
    calls = tools.calls()
    assert f"sriov-manage -d {H200}" in calls
    assert calls.index(f"sriov-manage -d {H200}") < calls.index("modprobe vfio-pci")
    assert not list((root / f"sys/bus/pci/devices/{H200}").glob("virtfn*"))
    assert sriov.driver_of(H200) == "vfio-pci"
    assert [s["address"] for s in specs(out) if s["address"] == H200] == [H200]
    assert out.unit_status.name == "active", out.unit_status.message
    assert "served vGPUs" not in out.unit_status.message


def test_a_guest_on_a_vf_refuses_the_move_naming_it_and_nothing_moves(ctx, root, tools, deb):
    booted_with_vfs(root, tools, deb)
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{L40S-12Q: all}"}, resource=deb))
    published = ours(first)["subordinate_configuration"]
    defined_guest(root, "instance-00000007", GUEST, pci_address=H200_VF)
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": WHOLE}))
    assert out.unit_status.name == "blocked"
    assert "instance-00000007" in out.unit_status.message and H200 in out.unit_status.message
    assert ours(out).get("subordinate_configuration", published) == published
    assert untouched(root)
    assert f"sriov-manage -d {H200}" not in tools.calls()


def test_a_gpu_held_through_nvidia_refuses_the_move_and_nothing_moves(ctx, root, tools, deb):
    booted_with_vfs(root, tools, deb).unbind_lock(H200, held=True)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": WHOLE}, resource=deb))
    assert out.unit_status.name == "blocked"
    assert "held through the nvidia driver" in out.unit_status.message
    assert untouched(root)


def test_a_refusal_elsewhere_leaves_the_whole_gpu_where_it_was(ctx, root, tools, deb):
    """A guest on an L40S VF whose type would change refuses the mapping: the H200 stays put."""
    booted_with_vfs(root, tools, deb)
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{L40S-12Q: [81:00.0]}"}, resource=deb))
    assert first.unit_status.name == "active", first.unit_status.message
    defined_guest(root, "instance-00000008", GUEST, pci_address="0000:81:00.4")
    out = ctx.run(ctx.on.config_changed(), again(
        first, {"vgpu-device-mappings": "{L40S-24Q: [81:00.0], passthrough: [c1:00.0]}"}))
    assert out.unit_status.name == "blocked"
    assert "instance-00000008" in out.unit_status.message
    assert untouched(root)


def test_a_gpu_vfio_pci_does_not_take_is_not_published(ctx, root, tools, deb):
    ready(whole_and_vgpu_host(root, moved=False), root, tools, deb).unbind_lock(H200)
    (tools.state / "modprobe.fail").touch()
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": WHOLE}, resource=deb))
    assert [s for s in specs(out) if s["address"] == H200] == []
    assert out.unit_status.name == "blocked"
    assert "vfio-pci could not be loaded" in out.unit_status.message
    assert sriov.driver_of(H200) != "vfio-pci"


def test_a_gpu_taken_out_of_passthrough_goes_back_to_nvidia_and_is_no_longer_published_whole(
        ctx, root, tools, deb):
    ready(whole_and_vgpu_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    assert H200 in {s["address"] for s in specs(first)}
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": "{L40S-12Q: [81:00.0]}"}))
    assert out.unit_status.name == "active", out.unit_status.message
    assert passthrough.bound(H200) == "nvidia"  # read back: vfio-pci let it go, nvidia probed it
    assert (root / f"sys/bus/pci/devices/{H200}/driver_override").read_text() == "\n"
    assert not (root / passthrough.RULES).exists() and not (root / passthrough.MODPROBE_CONF).exists()
    assert H200 not in {s["address"] for s in specs(out)}


def test_many_guests_on_a_gpu_going_whole_are_counted_past_three(ctx, root, tools, deb):
    """As every refusal that names guests: three named, the rest counted, where to list them."""
    booted_with_vfs(root, tools, deb)
    vgpus = "{L40S-12Q: ['81:00.0'], 'NVIDIA H200X-35C': ['c1:00.0']}"
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": vgpus}, resource=deb))
    assert first.unit_status.name == "active", first.unit_status
    vfs = sorted(os.readlink(link).rsplit("/", 1)[-1]
                 for link in (root / f"sys/bus/pci/devices/{H200}").glob("virtfn*"))
    for n, vf in enumerate(vfs[:4]):
        defined_guest(root, f"instance-{n:08x}", f"0b7a0f2c-6f2d-4b3c-9b1e-{n:012x}",
                      pci_address=vf)
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": WHOLE}))
    assert out.unit_status.name == "blocked"
    assert (
        "vgpu-device-mappings not applied, no GPU moved: "
        "instance-00000000 (vm-instance-00000000, 0b7a0f2c-6f2d-4b3c-9b1e-000000000000, shut off), "
        "instance-00000001 (vm-instance-00000001, 0b7a0f2c-6f2d-4b3c-9b1e-000000000001, shut off), "
        "instance-00000002 (vm-instance-00000002, 0b7a0f2c-6f2d-4b3c-9b1e-000000000002, shut off) "
        "and 1 more (juju run nova-compute-nvidia-vgpu/0 vgpu-usage lists the vGPUs guests hold) "
        f"hold GPU {H200} (") in out.unit_status.message
    # The one left out is there: its VF holds a type, so vgpu-usage lists it.
    ctx.run(ctx.on.action("vgpu-usage"), again(out))
    assert "instance-00000003" in ctx.action_results["table"]
