"""MIG-backed vGPUs through the charm (ops.testing) on the VFIO framework.

Hosts: the RTX PRO 6000 and H200 SXM fixtures in their MIG-backed form, MIG
mode kept by the stand-in nvidia-smi, GPU instances by the fixture's kernel
model. Checked: the status, the current_vgpu_type and gpu_instance_id files,
the relation data as nova-compute renders it, nvidia-smi's calls, the
enable-mig action and the guards of the time-sliced path.
"""

import json
import os

import pytest
from ops import testing

from unit_tests import debs, fakehost, principal
from unit_tests.fakehost import h200_sxm_host, rtx_pro_6000_host
from unit_tests.libvirt import defined_guest, running_guest
from unit_tests.test_charm import install_driver, ours, state
from unit_tests.test_charm_sriov import again

MGR = "nvidia-vgpu-mgr"
FAKE_PYNVML = os.path.join(os.path.dirname(__file__), "fake_pynvml")
GPU, OTHER = "0000:42:00.0", "0000:8c:00.0"
VF = [f"0000:42:00.{n}" for n in range(2, 8)] + ["0000:42:01.0", "0000:42:01.1"]
UNIT = "nova-compute-nvidia-vgpu/0"
SMI = "nvidia-smi --query-gpu=pci.bus_id,mig.mode.current,mig.mode.pending --format=csv,noheader"
AT_BOOT = ("at every boot, before libvirt and nova-compute start, nvidia-vgpu-vfs.service enables "
           "the VFs of a GPU given a MIG-backed profile, turns its MIG mode on (Hopper and "
           "Blackwell lose it at every reboot; Ampere keeps it), creates its GPU instances again "
           "(they never survive a reboot), then gives the VFs their types")
LGI, LGIP = "nvidia-smi mig -i 00000000:42:00.0 -lgi", "nvidia-smi mig -i 00000000:42:00.0 -lgip"


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    return debs.host_driver(tmp_path_factory.mktemp("debs"))


def ready(host, root, tools, deb):
    install_driver(root, deb)
    host.loaded_driver(debs.OLD)  # the package's version: no reboot pending
    host.install_sriov_manage()
    tools.set_active(MGR)
    tools.set_active("nvidia-vgpud")
    return host


def use_nvml(monkeypatch, root, nvml):
    """NVML as the stand-in pynvml answers it (unit_tests/fake_pynvml), for the charm's NVML probe."""
    path = root / "fake-nvml.json"
    path.write_text(json.dumps(nvml))
    monkeypatch.syspath_prepend(str(FAKE_PYNVML))
    monkeypatch.setenv("FAKE_NVML", str(path))


def rtx(root, tools, deb, mode="Enabled", monkeypatch=None):
    host = ready(rtx_pro_6000_host(root, vfs=8, gpus=2, mig=mode), root, tools, deb)
    if monkeypatch is not None:
        use_nvml(monkeypatch, root, host.nvml_state())
    return host


def nvidia(root, vf: str, name: str) -> str:
    path = root / f"sys/bus/pci/devices/{vf}/nvidia/{name}"
    return path.read_text().strip() if path.exists() else "absent"


def specs(out):
    return [json.loads(v) for k, v in principal.nova_context(ours(out))["sections"]["pci"]
            if k == "device_spec"]


def smi_calls(tools):
    return [c for c in tools.calls() if c.startswith("nvidia-smi")]


def test_a_mig_backed_profile_is_written_and_published_like_a_time_sliced_one(ctx, root, tools,
                                                                             deb, monkeypatch):
    host = rtx(root, tools, deb, monkeypatch=monkeypatch)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{DC-1-24Q: ['42:00.0']}"}, resource=deb))
    rc = "CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_1_24Q"
    assert out.unit_status == testing.ActiveStatus(
        f"2 GPUs (RTX PRO 6000 Blackwell Server Edition), {rc} on 4; {rc}: 0 used, 4 free")
    # 4 x 1g.24gb+gfx GPU instances created first (writing a type creates none), checked
    # with -lgi/-lgip; then four VFs, each in its own GPU instance; the rest stay free. On the
    # RTX PRO 6000 every MIG-backed type sits on +gfx instances, though no name says GFX
    # (NVIDIA/vgpu-device-manager pkg/vgpu/config.go); the stand-in NVML says so too.
    assert host.gpu_instances(GPU) == [f"{n}:1g.24gb+gfx@{n - 1}" for n in (1, 2, 3, 4)]
    assert host.gpu_instances(OTHER) == []
    assert [nvidia(root, vf, "current_vgpu_type") for vf in VF[:5]] == ["2033"] * 4 + ["0"]
    assert [nvidia(root, vf, "gpu_instance_id") for vf in VF[:5]] == ["1", "2", "3", "4", "absent"]
    assert [s["address"] for s in specs(out)] == VF[:4]
    assert {s["resource_class"] for s in specs(out)} == {rc}
    assert smi_calls(tools) == [SMI, LGI, LGIP, "nvidia-smi mig -i 00000000:42:00.0 -cgi "
                                "1g.24gb+gfx,1g.24gb+gfx,1g.24gb+gfx,1g.24gb+gfx -C"]
    boot = json.loads((root / "var/lib/nova-compute-nvidia-vgpu/boot.json").read_text())
    assert [v["name"] for v in boot["gpus"][0]["vfs"]] == [
        "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q"] * 4
    assert boot["gpus"][0]["mig"] == {"profile": "DC-1-24Q", "instance": "1g.24gb+gfx",
                                      "count": 4}
    # The next hook finds them there: nothing created, nothing destroyed.
    before = len(smi_calls(tools))
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active"
    assert host.gpu_instances(GPU) == [f"{n}:1g.24gb+gfx@{n - 1}" for n in (1, 2, 3, 4)]
    assert smi_calls(tools)[before:] == [SMI, LGI]


def test_the_gfx_spelling_is_the_same_type_on_gfx_gpu_instances(ctx, root, tools, deb):
    """``DC-1-24QGFX`` is ``DC-1-24Q`` on ``1g.24gb+gfx``, the one type either way.

    NVIDIA/vgpu-device-manager pkg/vgpu/config.go (main): on the RTX PRO 6000 every MIG-backed
    type sits on +gfx GPU instances and no type name carries GFX; the suffix is stripped
    before the lookup.
    """
    host = rtx(root, tools, deb)
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{DC-1-24QGFX: ['42:00.0'], DC-2-12Q: ['8c:00.0']}",
         "pci-in-placement": True}, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    assert host.gpu_instances(GPU) == [f"{n}:1g.24gb+gfx@{n - 1}" for n in (1, 2, 3, 4)]
    assert host.gpu_instances(OTHER) == ["1:2g.48gb+gfx@0", "2:2g.48gb+gfx@2"]
    assert [nvidia(root, vf, "current_vgpu_type") for vf in VF[:5]] == ["2033"] * 4 + ["0"]
    # One type, one resource class, whichever spelling the mapping uses.
    assert {s["resource_class"] for s in specs(out) if s["address"].startswith("0000:42")} == {
        "CUSTOM_VGPU_RTX_PRO_6000_BLACKWELL_DC_1_24Q"}
    boot = json.loads((root / "var/lib/nova-compute-nvidia-vgpu/boot.json").read_text())
    assert boot["gpus"][0]["mig"] == {"profile": "DC-1-24Q", "instance": "1g.24gb+gfx",
                                      "count": 4}


def test_the_gpu_instance_profile_comes_from_nvml_where_the_driver_says(ctx, root, tools, deb,
                                                                      monkeypatch):
    """nvmlVgpuTypeGetGpuInstanceProfileId names the profile a type needs: it wins over the name."""
    host = rtx(root, tools, deb)
    # A driver that puts every type on plain instances: its NVML says so, its VFs list them there.
    fakehost._MODELS[os.path.realpath(root / "sys/bus/pci/devices" / GPU)].mig.gfx = False
    nvml = host.nvml_state()
    assert nvml["gpus"][0]["gi_profiles"]["14"] == "MIG 1g.24gb"
    use_nvml(monkeypatch, root, nvml)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{DC-1-24Q: ['42:00.0']}"}, resource=deb))
    assert host.gpu_instances(GPU) == [f"{n}:1g.24gb@{n - 1}" for n in (1, 2, 3, 4)]
    assert out.unit_status.name == "active", out.unit_status
    # The other tests: NVML as config.go describes the GPU (+gfx), or no NVML at all (the
    # GFX-spelling test: no libnvidia-ml here), where config.go's rule gives +gfx by itself.


def test_a_gpu_out_of_mig_mode_blocks_naming_the_command_and_changes_nothing(ctx, root, tools,
                                                                            deb):
    host = rtx(root, tools, deb, mode="Disabled")
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{DC-1-24Q: ['42:00.0']}"}, resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "GPU 0000:42:00.0 is not in MIG mode, which MIG-backed DC-1-24Q (vgpu-device-mappings) "
        f"need: juju run {UNIT} enable-mig gpu=0000:42:00.0 (it runs nvidia-smi -i "
        "00000000:42:00.0 -mig 1)")
    assert [nvidia(root, vf, "current_vgpu_type") for vf in VF] == ["0"] * 8
    assert "subordinate_configuration" not in ours(out)
    assert host.mig_mode(GPU)["current"] == "Disabled"  # hooks never change MIG mode
    assert smi_calls(tools) == [SMI]
    # A pending mode asks for a reset or a reboot instead.
    host.install_nvidia_smi({GPU: "Disabled", OTHER: "Disabled"})
    state_file = host.recipes.parent / "nvidia-smi.json"
    modes = json.loads(state_file.read_text())
    modes[GPU]["pending"] = "Enabled"
    state_file.write_text(json.dumps(modes))
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.message.endswith(
        "need: enabling it is pending; another client uses the GPU: stop it (nvidia-smi lists the "
        f"processes using the GPU), then juju run {UNIT} enable-mig gpu=0000:42:00.0 again, which "
        "runs -mig 1 again as nvidia-smi's warning asks (no GPU reset: one is refused while the "
        "GPU has VFs or persistence mode is on)")


def test_update_status_asks_nvidia_smi_only_while_a_mig_profile_is_mapped(ctx, root, tools, deb):
    rtx(root, tools, deb, mode="Disabled")
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{DC-8Q: ['42:00.0']}"}, resource=deb))
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active"
    assert smi_calls(tools) == []


def test_enable_mig_turns_the_mode_on_and_the_waiting_mapping_applies(ctx, root, tools, deb):
    host = rtx(root, tools, deb, mode="Disabled")
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{DC-1-24Q: ['42:00.0']}"}, resource=deb))
    assert first.unit_status.name == "blocked"
    out = ctx.run(ctx.on.action("enable-mig", params={"gpu": "00000000:42:00.0"}), again(first))
    assert ctx.action_results == {
        "gpu": GPU, "command": "nvidia-smi -i 00000000:42:00.0 -mig 1",
        "output": "Enabled MIG Mode for GPU 00000000:42:00.0\nAll done.",
        "pending": "no", "message": "MIG mode enabled on GPU 0000:42:00.0",
        "at-boot": AT_BOOT, "gpu-clients": "none stopped"}
    assert host.mig_mode(GPU)["current"] == "Enabled" and host.mig_mode(OTHER)["current"] == "Disabled"
    assert [nvidia(root, vf, "current_vgpu_type") for vf in VF[:4]] == ["2033"] * 4
    assert ctx.action_logs == [
        "checking that no guest holds a vGPU on GPU 0000:42:00.0",
        "turning MIG mode on: nvidia-smi -i 00000000:42:00.0 -mig 1",
        "publishing to nova-compute: a mapping that waited for MIG mode applies now"]
    assert out.unit_status.name == "active"
    ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), again(out))
    assert ctx.action_results["message"] == "GPU 0000:42:00.0 is in MIG mode already; nothing run"


def test_enable_mig_says_when_the_mode_is_pending_and_never_advises_a_reset(ctx, root, tools, deb):
    host = rtx(root, tools, deb, mode="busy")
    ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    assert ctx.action_results["pending"] == "yes"
    assert ctx.action_results["message"] == (
        "MIG mode is pending on GPU 0000:42:00.0: another client uses the GPU: stop it (nvidia-smi "
        "lists the processes using the GPU), then run this action again, which runs -mig 1 again "
        "as nvidia-smi's warning asks (no GPU reset: one is refused while the GPU has VFs or "
        "persistence mode is on)")
    assert ctx.action_results["at-boot"] == AT_BOOT
    assert "pending enable state" in ctx.action_results["output"]
    assert (host.mig_mode(GPU)["current"], host.mig_mode(GPU)["pending"]) == ("Disabled", "Enabled")
    host.set_mig(GPU, busy=False)  # the other client stopped: the action again puts it in force
    ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    assert ctx.action_results["pending"] == "no"
    assert host.mig_mode(GPU)["current"] == "Enabled"
    assert not [c for c in smi_calls(tools) if " -r" in c]


def test_enable_mig_is_refused_while_a_guest_holds_a_vgpu_on_that_gpu(ctx, root, tools, deb):
    host = rtx(root, tools, deb, mode="Disabled")
    running_guest(root, "instance-00000001", "6c1e5bd3-7a4f-4e0e-9a3b-1f1f2d0c0a01",
                  pci_address=VF[3])
    with pytest.raises(testing.ActionFailed, match="MIG mode not enabled: 1 running guest.s. use "
                                                   "vGPUs: instance-00000001"):
        ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    assert host.mig_mode(GPU)["current"] == "Disabled"
    assert [c for c in smi_calls(tools) if "-mig" in c] == []
    with pytest.raises(testing.ActionFailed, match="0000:99:00.0 is not an NVIDIA GPU on this host"):
        ctx.run(ctx.on.action("enable-mig", params={"gpu": "99:00.0"}), state(resource=deb))


def test_enable_mig_refused_past_three_guests_names_the_command_that_lists_them(ctx, root, tools,
                                                                               deb):
    rtx(root, tools, deb, mode="Disabled")
    for n in range(4):
        running_guest(root, f"instance-{n:08x}", f"6c1e5bd3-7a4f-4e0e-9a3b-{n:012x}",
                      pci_address=VF[n])
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    assert failure.value.message.startswith(
        "MIG mode not enabled: 4 running guest(s) use vGPUs: instance-00000000 (")
    assert " and 1 more (juju run nova-compute-nvidia-vgpu/0 vgpu-usage lists the vGPUs guests " \
        "hold)" in failure.value.message


@pytest.mark.parametrize("placement", [True, False])
def test_two_mig_profiles_on_one_gpu_are_refused_and_the_last_good_state_stays(ctx, root, tools,
                                                                               deb, placement):
    """Nova: one resource class per PF (PlacementPciMixedResourceClassException stops it)."""
    ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    a, b, c = "0000:18:00.4", "0000:18:00.5", "0000:18:00.6"
    config = {"vgpu-device-mappings": f"{{H200X-2-35C: ['{a}']}}", "pci-in-placement": placement}
    out = ctx.run(ctx.on.config_changed(), state(config, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    published = ours(out)
    mixed = dict(config, **{"vgpu-device-mappings":
                            f"{{H200X-1-18C: ['{a}', '{b}'], H200X-2-35C: ['{c}']}}"})
    out = ctx.run(ctx.on.config_changed(), again(out, mixed))
    assert out.unit_status.name == "blocked"
    assert ("GPU 0000:18:00.0 (H200 SXM 141GB) is mapped to MIG-backed H200X-1-18C, H200X-2-35C: "
            "one MIG-backed profile per GPU. Nova gives all VFs of one GPU one resource class in "
            "Placement (two stop nova-compute: PlacementPciMixedResourceClassException)") \
        in out.unit_status.message
    assert [nvidia(root, vf, "current_vgpu_type") for vf in (a, b, c)] == ["1416", "0", "0"]
    assert ours(out) == published
    assert {s["resource_class"] for s in specs(out)} <= {"CUSTOM_VGPU_H200X_2_35C"}


def test_a_shut_off_guest_keeps_its_mig_backed_vf(ctx, root, tools, deb):
    """Nova keeps a shut-off instance's VF: the mapping may not take its MIG-backed type away."""
    host = ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    a = "0000:18:00.4"
    config = {"vgpu-device-mappings": f"{{H200X-3-71C: ['{a}']}}"}
    out = ctx.run(ctx.on.config_changed(), state(config, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    assert nvidia(root, a, "current_vgpu_type") == "1417"
    assert host.gpu_instances("0000:18:00.0") == ["1:3g.71gb@0"]
    published = ours(out)
    defined_guest(root, "instance-00000003", "6c1e5bd3-7a4f-4e0e-9a3b-1f1f2d0c0a03", pci_address=a)
    out = ctx.run(ctx.on.config_changed(),
                  again(out, {"vgpu-device-mappings": "{H200X-1-18C: ['18:00.0']}"}))
    assert out.unit_status.name == "blocked"
    # Asked of the guests before any GPU instance changes: blocked, naming them.
    assert out.unit_status.message.startswith(
        "vgpu-device-mappings not applied on GPU 0000:18:00.0: MIG-backed H200X-1-18C takes the "
        "place of H200X-3-71C, and 1 guest(s) hold vGPUs, running or shut off: instance-00000003")
    assert "shut off" in out.unit_status.message
    assert nvidia(root, a, "current_vgpu_type") == "1417"  # neither released nor retyped
    assert host.gpu_instances("0000:18:00.0") == ["1:3g.71gb@0"]  # never changed by a hook
    assert ours(out) == published  # nova-compute keeps the VF it gave the instance
    assert not [c for c in smi_calls(tools) if " -dgi" in c or " -dci" in c]


def mask_boot_unit(root):
    """The operator masked nvidia-vgpu-vfs.service: no boot step, and no hook does its work."""
    unit = root / "etc/systemd/system/nvidia-vgpu-vfs.service"
    unit.unlink()
    unit.symlink_to(os.devnull)


def test_after_a_reboot_without_the_boot_step_a_shut_off_guest_gets_its_own_type_back(
        ctx, root, tools, deb):
    """What nova.conf lists comes back before any GPU instance for a change the guest blocks."""
    host = ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    a = "0000:18:00.4"
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": f"{{H200X-3-71C: ['{a}']}}"}, resource=deb))
    assert nvidia(root, a, "current_vgpu_type") == "1417"
    published = ours(out)
    defined_guest(root, "instance-00000003", "6c1e5bd3-7a4f-4e0e-9a3b-1f1f2d0c0a03", pci_address=a)
    mask_boot_unit(root)
    host.reboot()  # Hopper: MIG mode, GPU instances, VFs and types gone
    changed = {"vgpu-device-mappings": "{H200X-1-18C: ['18:00.0']}"}
    out = ctx.run(ctx.on.config_changed(), again(out, changed))
    assert "is not in MIG mode" in out.unit_status.message  # the boot step's work is not done
    ctx.run(ctx.on.action("enable-mig", params={"gpu": "0000:18:00.0"}), again(out, changed))
    assert host.mig_mode("0000:18:00.0")["current"] == "Enabled"
    out = ctx.run(ctx.on.update_status(), again(out, changed))
    assert host.gpu_instances("0000:18:00.0") == ["1:3g.71gb@0"]  # none for the blocked change
    assert nvidia(root, a, "current_vgpu_type") == "1417"  # the guest can start again
    assert ours(out) == published
    assert "instance-00000003" in out.unit_status.message


def test_a_mig_profile_change_with_no_guest_on_the_gpu_goes_through_by_itself(ctx, root, tools,
                                                                            deb):
    """The types the charm wrote are no guest's: released, as a time-sliced change is."""
    host = ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{H200X-3-71C: ['18:00.0']}"}, resource=deb))
    vfs = ["0000:18:00.4", "0000:18:00.5", "0000:18:00.6", "0000:18:00.7"]
    assert [nvidia(root, vf, "current_vgpu_type") for vf in vfs] == ["1417", "1417", "0", "0"]
    out = ctx.run(ctx.on.config_changed(),
                  again(out, {"vgpu-device-mappings": "{H200X-2-35C: ['18:00.0']}"}))
    assert out.unit_status.name == "active", out.unit_status
    assert host.gpu_instances("0000:18:00.0") == ["1:2g.35gb@0", "2:2g.35gb@2", "3:2g.35gb@4"]
    assert [nvidia(root, vf, "current_vgpu_type") for vf in vfs] == ["1416", "1416", "1416", "0"]
    assert {s["resource_class"] for s in specs(out)} == {"CUSTOM_VGPU_H200X_2_35C"}
    assert "move" not in out.unit_status.message


def test_when_the_boot_step_could_not_take_the_lock_the_next_hook_does_its_work(
        ctx, root, tools, deb, monkeypatch):
    """A hook held the lock past the boot step's wait: MIG mode, GPU instances and types anyway."""
    from unit_tests.faketools import host_lock_held
    from vgpu import boot, hostlock

    host = ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{H200X-2-35C: ['18:00.0']}"}, resource=deb))
    vfs = ["0000:18:00.4", "0000:18:00.5", "0000:18:00.6"]
    host.reboot()
    monkeypatch.setattr(hostlock, "BOOT_WAIT", 0.2)
    with host_lock_held(root / hostlock.FILE):  # the start hook, running sriov-manage for long
        assert boot.main([f"/{boot.DATA_FILE}"]) == 1
    assert not (root / "run/nova-compute-nvidia-vgpu/restored").exists()
    out = ctx.run(ctx.on.start(), again(out))
    assert host.mig_mode("0000:18:00.0")["current"] == "Enabled"  # the hook turned it on again
    assert host.gpu_instances("0000:18:00.0") == ["1:2g.35gb@0", "2:2g.35gb@2", "3:2g.35gb@4"]
    assert [nvidia(root, vf, "current_vgpu_type") for vf in vfs] == ["1416"] * 3
    assert out.unit_status.name == "active", out.unit_status
    assert (root / "run/nova-compute-nvidia-vgpu/restored").read_text() == "a hook: 0\n"
    before = len(tools.calls())
    ctx.run(ctx.on.update_status(), again(out))  # done for this boot: not again
    assert [c for c in tools.calls()[before:] if "-mig 1" in c or "-cgi" in c] == []


def test_while_paused_no_hook_does_the_boot_steps_work_then_resume_does(
        ctx, root, tools, deb, monkeypatch):
    """Paused, the vGPU manager is stopped: the work waits (its mark too) until resume."""
    from unit_tests.faketools import host_lock_held
    from vgpu import boot, hostlock

    host = ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{H200X-2-35C: ['18:00.0']}"}, resource=deb))
    paused = ctx.run(ctx.on.action("pause"), again(out))
    host.reboot()
    monkeypatch.setattr(hostlock, "BOOT_WAIT", 0.2)
    with host_lock_held(root / hostlock.FILE):
        assert boot.main([f"/{boot.DATA_FILE}"]) == 1
    before = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), paused)
    assert [c for c in tools.calls()[before:] if "-mig 1" in c or "-cgi" in c] == []
    assert not (root / "run/nova-compute-nvidia-vgpu/restored").exists()
    out = ctx.run(ctx.on.action("resume"), out)
    out = ctx.run(ctx.on.update_status(), out)
    assert host.mig_mode("0000:18:00.0")["current"] == "Enabled"
    assert (root / "run/nova-compute-nvidia-vgpu/restored").read_text() == "a hook: 0\n"


def test_list_vgpu_types_and_vgpu_usage_show_slices_and_gpu_instances(ctx, root, tools, deb):
    rtx(root, tools, deb)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{DC-2-12Q: ['42:00.0']}"}, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    ctx.run(ctx.on.action("list-vgpu-types"), out)
    gpu = ctx.action_results["gpus"]["gpu-0"]
    entry = gpu["types"]["nvidia-2034"]
    # 2 x 2g.48gb+gfx instances, 4 DC-2-12Q each: 8 per GPU, from the profile, not from sysfs;
    # NVIDIA/vgpu-device-manager's spelling of the same type is accepted in a mapping.
    assert (entry["mig-slices"], entry["max-instances"], entry["gpu-instance-profile"],
            entry["also-mapped-as"]) == ("2", "8", "2g.48gb+gfx (at most 2, 4 vGPU each)",
                                         "DC-2-12QGFX")
    assert gpu["gpu-instances"] == ",".join(f"{vf}={1 + n // 4}" for n, vf in enumerate(VF))
    running_guest(root, "instance-00000003", "6c1e5bd3-7a4f-4e0e-9a3b-1f1f2d0c0a03",
                  pci_address=VF[5])
    ctx.run(ctx.on.action("vgpu-usage"), out)
    vgpu = ctx.action_results["vgpus"]["vgpu-0"]
    assert (vgpu["address"], vgpu["mig-slices"], vgpu["gpu-instance"]) == (VF[5], "2", "2")
    assert "RTX Pro 6000 Blackwell DC-2-12Q (2 slices, GI 2)" in ctx.action_results["table"]


def test_enable_mig_output_is_bounded_however_much_nvidia_smi_says(ctx, root, tools, deb):
    """A 4 MB answer must not become a 4 MB action result (action-set takes far less)."""
    host = rtx(root, tools, deb, mode="Disabled")
    host.set_mig(GPU, noise=60000)  # about 4.5 MB of warnings
    ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    output = ctx.action_results["output"]
    assert len(output) < 2100
    assert output.startswith("Enabled MIG Mode for GPU 00000000:42:00.0\nWarning: line 0")
    assert output.endswith("more characters not shown)")
    assert sum(len(v) for v in ctx.action_results.values()) < 4000
    assert host.mig_mode(GPU)["current"] == "Enabled"


def test_after_a_reboot_the_boot_step_brings_back_mode_instances_vfs_and_types(ctx, root, tools,
                                                                             deb):
    """What the charm wrote is enough for the boot step, even with MIG mode left pending."""
    from vgpu import boot

    host = ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{H200X-2-35C: ['18:00.0']}"}, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    vfs = ["0000:18:00.4", "0000:18:00.5", "0000:18:00.6"]
    assert [nvidia(root, vf, "current_vgpu_type") for vf in vfs] == ["1416"] * 3
    host.reboot()  # Hopper loses MIG mode (NVIDIA/gpu-admin-tools#2)
    assert host.gpu_instances("0000:18:00.0") == []
    assert host.mig_mode("0000:18:00.0")["current"] == "Disabled"
    data = json.loads((root / "var/lib/nova-compute-nvidia-vgpu/boot.json").read_text())
    data["limits"] = {"total": 20, "manager": 2, "call": 10, "delay": 0, "poll": 0.05}
    assert boot.restore(data) == 0
    assert host.mig_mode("0000:18:00.0")["current"] == "Enabled"
    assert host.gpu_instances("0000:18:00.0") == ["1:2g.35gb@0", "2:2g.35gb@2", "3:2g.35gb@4"]
    assert [nvidia(root, vf, "current_vgpu_type") for vf in vfs] == ["1416"] * 3
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active", out.unit_status


def test_enable_mig_waits_for_the_boot_step_then_changes_nothing(ctx, root, tools, deb, monkeypatch):
    """The boot step holds the host lock (here: another process holding it, bounded)."""
    import fcntl

    from unit_tests.faketools import host_lock_held
    from vgpu import hostlock

    host = rtx(root, tools, deb, mode="Disabled")
    lock = root / "run/nova-compute-nvidia-vgpu/host.lock"
    monkeypatch.setattr(hostlock, "HOOK_WAIT", 0.2)
    with host_lock_held(lock), pytest.raises(
            testing.ActionFailed,
            match="MIG mode not enabled: /run/nova-compute-nvidia-vgpu/host.lock is held by another process"):
        ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    assert host.mig_mode(GPU)["current"] == "Disabled"
    assert [c for c in smi_calls(tools) if "-mig" in c] == []
    fd = os.open(lock, os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released with its holder
    os.close(fd)


def test_a_hook_that_enables_vfs_turns_mig_mode_on_again_after_them(ctx, root, tools, deb):
    """sriov-manage -e may wipe MIG state (Harvester, StackHPC): the hook restores it after."""
    from vgpu import bootfile

    host = ready(h200_sxm_host(root, vfs=4, mig="Enabled"), root, tools, deb)
    host.set_mig("0000:18:00.0", reboot="keeps")  # the mode outlives the reboot (Ampere-like)
    out = ctx.run(ctx.on.config_changed(),
                  state({"vgpu-device-mappings": "{H200X-2-35C: ['18:00.0']}"}, resource=deb))
    host.reboot()  # or a driver reload: VFs gone, the boot step's mark there all the same
    bootfile.write(bootfile.BY_BOOT, 0, [])
    assert host.mig_mode("0000:18:00.0")["current"] == "Enabled"
    out = ctx.run(ctx.on.update_status(), again(out))
    calls = [c for c in tools.calls() if c.startswith(("sriov-manage -e 0000:18", "nvidia-smi -i"))
             and "--query-gpu" not in c]
    assert calls[:2] == ["sriov-manage -e 0000:18:00.0", "nvidia-smi -i 00000000:18:00.0 -mig 1"]
    assert host.mig_mode("0000:18:00.0")["current"] == "Enabled"
    assert host.gpu_instances("0000:18:00.0") == ["1:2g.35gb@0", "2:2g.35gb@2", "3:2g.35gb@4"]
    vfs = ["0000:18:00.4", "0000:18:00.5", "0000:18:00.6"]
    assert [nvidia(root, vf, "current_vgpu_type") for vf in vfs] == ["1416"] * 3
    assert out.unit_status.name == "active", out.unit_status


# -- NVML clients around a MIG mode change (issue 33.2) ------------------------------------

DCGM = ("snap.dcgm.nv-hostengine.service", "snap.dcgm.dcgm-exporter.service")
EXPORTER = "nvidia-vgpu-exporter.service"


def systemctl(tools, verbs=("stop", "start", "--no-block")):
    return [c for c in tools.calls() if c.startswith(tuple(f"systemctl {v}" for v in verbs))]


@pytest.mark.parametrize("held", ["pending", "applies"])
def test_enable_mig_names_active_dcgm_and_refuses_stopping_nothing(ctx, root, tools, deb, held):
    """Never a neighbour's service stopped unasked (hardware-observer's dcgm snap)."""
    host = rtx(root, tools, deb, mode="Disabled")
    host.set_mig(GPU, held=held)
    for unit in DCGM:
        tools.set_active(unit)
    with pytest.raises(testing.ActionFailed, match=(
            "MIG mode not enabled: NVML clients that hold GPU 0000:42:00.0 are active: "
            "snap.dcgm.nv-hostengine.service, snap.dcgm.dcgm-exporter.service; .*run again with "
            "stop-gpu-clients=true")):
        ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    assert [c for c in smi_calls(tools) if "-mig" in c] == []
    assert systemctl(tools) == []
    assert host.mig_mode(GPU)["current"] == "Disabled"


@pytest.mark.parametrize("held", ["pending", "applies"])
def test_stop_gpu_clients_stops_them_changes_the_mode_and_starts_them_again(ctx, root, tools, deb,
                                                                            held):
    """Right under both readings of whether a held GPU leaves -mig 1 pending (Hopper, Blackwell)."""
    host = rtx(root, tools, deb, mode="Disabled")
    host.set_mig(GPU, held=held)
    for unit in (*DCGM, EXPORTER):
        tools.set_active(unit)
    ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU, "stop-gpu-clients": True}),
            state(resource=deb))
    assert host.mig_mode(GPU)["current"] == "Enabled"
    assert ctx.action_results["pending"] == "no"
    assert ctx.action_results["gpu-clients"] == (
        "stopped snap.dcgm.nv-hostengine.service, snap.dcgm.dcgm-exporter.service around the "
        "change; started again: snap.dcgm.nv-hostengine.service, snap.dcgm.dcgm-exporter.service")
    calls = [c for c in tools.calls() if c.startswith(("systemctl stop", "systemctl start"))
             or "-mig 1" in c]
    assert calls == [f"systemctl stop {EXPORTER}", *(f"systemctl stop {u}" for u in DCGM),
                     "nvidia-smi -i 00000000:42:00.0 -mig 1",
                     *(f"systemctl start {u}" for u in reversed(DCGM)), f"systemctl start {EXPORTER}"]
    assert all(tools.enabled(u) == "enabled" for u in DCGM)
    assert all((tools.state / u).read_text().strip() == "active" for u in (*DCGM, EXPORTER))


def test_the_clients_are_started_again_when_the_mode_change_fails(ctx, root, tools, deb):
    host = rtx(root, tools, deb, mode="Disabled")
    tools.set_active(DCGM[1])
    smi = root / "usr/bin/nvidia-smi"
    smi.rename(smi.with_name("nvidia-smi.real"))
    from unit_tests.faketools import stand_in

    stand_in(smi, '#!/bin/sh\ncase "$*" in *"-mig 1"*) echo "nvidia-smi $*" >> "$FAKE_LOG"; '
                  'echo "Unable to enable MIG Mode: Unknown Error" >&2; exit 3;; esac\n'
                  f'exec {smi.with_name("nvidia-smi.real")} "$@"\n')
    with pytest.raises(testing.ActionFailed, match="Unable to enable MIG Mode"):
        ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU, "stop-gpu-clients": True}),
                state(resource=deb))
    assert systemctl(tools) == [f"systemctl stop {DCGM[1]}", f"systemctl start {DCGM[1]}"]
    assert (tools.state / DCGM[1]).read_text().strip() == "active"
    assert host.mig_mode(GPU)["current"] == "Disabled"


@pytest.mark.parametrize("held", ["pending", "applies"])
def test_the_charms_own_exporter_is_stopped_around_enable_mig_unasked(ctx, root, tools, deb, held):
    host = rtx(root, tools, deb, mode="Disabled")
    host.set_mig(GPU, held=held)
    tools.set_active(EXPORTER)
    ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU}), state(resource=deb))
    assert host.mig_mode(GPU)["current"] == "Enabled" and ctx.action_results["pending"] == "no"
    assert systemctl(tools) == [f"systemctl stop {EXPORTER}", f"systemctl start {EXPORTER}"]


@pytest.mark.parametrize("held", ["pending", "applies"])
def test_a_hook_that_must_turn_mig_on_names_the_clients_and_the_action(ctx, root, tools, deb,
                                                                       held):
    """The boot step's work done by a hook after a failed boot: DCGM runs by then."""
    host = ready(h200_sxm_host(root, vfs=2, mig="Enabled"), root, tools, deb)
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{H200X-1-18C: ['18:00.0']}"}, resource=deb))
    assert out.unit_status.name == "active", out.unit_status
    host.reboot()  # Hopper: the mode goes; the boot step did not run (no mark)
    host.set_mig("0000:18:00.0", held=held)
    tools.set_active(DCGM[0])
    out = ctx.run(ctx.on.update_status(), again(out))
    assert [c for c in systemctl(tools) if DCGM[0] in c] == []  # never stopped by a hook
    if held == "applies":
        assert host.mig_mode("0000:18:00.0")["current"] == "Enabled"
        assert out.unit_status.name == "active", out.unit_status
    else:
        assert host.mig_mode("0000:18:00.0")["current"] == "Disabled"
        assert out.unit_status.name == "blocked"
        assert (f"NVML clients hold GPU 0000:18:00.0 while its MIG mode must change: {DCGM[0]}; "
                f"juju run {UNIT} enable-mig gpu=0000:18:00.0 stop-gpu-clients=true stops them, "
                "turns MIG mode on and starts them again") in out.unit_status.message
def test_list_vgpu_types_never_shows_a_mig_backed_type_available_out_of_mig_mode(ctx, root, tools,
                                                                                deb):
    """The demo's H200 listed H200X-1-18C with 7 available on a GPU not in MIG mode (issue 36).

    The l40s fixture's H200 VFs list the MIG-backed type on free VFs (as a host may, before
    any instance exists); without MIG mode no vGPU of it can be created, so 0 are available,
    and the entry says what it needs. No nvidia-smi here: the mode cannot be read, which
    counts as not in MIG mode (docs/how-to/mig.md).
    """
    from unit_tests.fakehost import l40s_host

    ready(l40s_host(root), root, tools, deb)
    ctx.run(ctx.on.action("list-vgpu-types"), state({}, resource=deb))
    rows = [line.split() for line in ctx.action_results["table"].splitlines()
            if "H200X-1-18C" in line and line.startswith("0000")]
    assert [(r[4], r[9], r[10]) for r in rows] == [("nvidia-1290", "7", "0")]  # MAX, AVAILABLE
    h200 = next(g for g in ctx.action_results["gpus"].values()
                if g["addresses"] == "0000:c1:00.0")
    entry = h200["types"]["nvidia-1290"]
    assert entry["available-instances"] == "0"
    assert entry["mig-mode"].startswith("not enabled")
    # A time-sliced type on the same GPU stays available.
    assert h200["types"]["nvidia-1282"]["available-instances"] == "4"


def test_list_vgpu_types_counts_a_mig_backed_type_once_the_gpu_is_in_mig_mode(ctx, root, tools,
                                                                             deb):
    ready(h200_sxm_host(root, mig="Enabled"), root, tools, deb)
    ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{H200X-1-18C: ['18:00.0']}"},
                                           resource=deb))
    ctx.run(ctx.on.action("list-vgpu-types"), state({}, resource=deb))
    h200 = next(g for g in ctx.action_results["gpus"].values()
                if "0000:18:00.0" in g["addresses"])
    entry = next(e for e in h200["types"].values() if e["name"].endswith("H200X-1-18C"))
    assert "mig-mode" not in entry


def test_list_vgpu_types_with_a_hung_nvml_says_so_and_answers_by_nvidias_rules(
        ctx, root, tools, deb, monkeypatch):
    """nvmlInit never returns: the per-VM maximum's child is stopped at its bound (issue 42)."""
    import time

    from unit_tests.fakehost import l40s_host

    ready(l40s_host(root), root, tools, deb)
    use_nvml(monkeypatch, root, {"driver": "570.158.02", "hang": ["nvmlInit"], "gpus": []})
    monkeypatch.setattr("vgpu.nvml.NVML_TIMEOUT", 2.0)
    started = time.monotonic()
    ctx.run(ctx.on.action("list-vgpu-types"), state({}, resource=deb))
    assert time.monotonic() - started < 30
    assert ctx.action_results["nvml"] == ("NVML did not answer within 2s: NVIDIA's rules give "
                                          "each type's most per instance")
    assert ctx.action_results["gpus"]  # the rest answered


def test_a_failed_enable_mig_says_which_clients_it_left_stopped_and_the_status_names_them(
        ctx, root, tools, deb):
    """-mig 1 fails and nv-hostengine does not start again: the result and the status say it."""
    host = rtx(root, tools, deb, mode="Disabled")
    for unit in DCGM:
        tools.set_active(unit)
    tools.fail_start(DCGM[0])
    smi = root / "usr/bin/nvidia-smi"
    smi.rename(smi.with_name("nvidia-smi.real"))
    from unit_tests.faketools import stand_in

    stand_in(smi, '#!/bin/sh\ncase "$*" in *"-mig 1"*) echo "nvidia-smi $*" >> "$FAKE_LOG"; '
                  'echo "Unable to enable MIG Mode: Unknown Error" >&2; exit 3;; esac\n'
                  f'exec {smi.with_name("nvidia-smi.real")} "$@"\n')
    with pytest.raises(testing.ActionFailed, match=(
            f"Unable to enable MIG Mode.*; {DCGM[0]} was stopped and NOT started again")) as failed:
        ctx.run(ctx.on.action("enable-mig", params={"gpu": GPU, "stop-gpu-clients": True}),
                state(resource=deb))
    said = failed.value.state  # the state the failed action left
    assert ctx.action_results["gpu-clients"].startswith(
        f"stopped {DCGM[0]}, {DCGM[1]} around the change; started again: {DCGM[1]}; "
        f"NOT started again: {DCGM[0]} (")
    assert host.mig_mode(GPU)["current"] == "Disabled"
    out = ctx.run(ctx.on.update_status(), said)
    assert out.unit_status.name == "blocked"
    assert (f"enable-mig stopped {DCGM[0]} and it did not start again: "
            f"sudo systemctl start {DCGM[0]}") in out.unit_status.message
    (tools.state / DCGM[0]).write_text("active\n")  # the operator started it
    out = ctx.run(ctx.on.update_status(), out)
    assert DCGM[0] not in out.unit_status.message
