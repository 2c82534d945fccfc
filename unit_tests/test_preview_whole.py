"""preview-mappings and the hook decide whole GPUs from the same code (issue 41, item 4).

Each case runs preview-mappings, then the hook, on the same host and value, and
asserts they agree: a refusal both refuse in the same words, an acceptance the
preview says would apply and the hook applies, after which the mapping in force
previews as "nothing would change", with no GPU "unknown".
"""

import json

import pytest

from unit_tests import principal
from unit_tests.fakehost import whole_and_vgpu_host
from unit_tests.libvirt import defined_guest
from unit_tests.test_charm import ours
from unit_tests.test_charm_passthrough import GUEST, H200, H200_VF, L40S, WHOLE, specs
from unit_tests.test_charm_sriov import again, ready
from unit_tests.test_nova_rules import nova_devspec
from unit_tests.test_preview import preview, settled
from vgpu import passthrough, sriov
from vgpu.preview import render


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    from unit_tests import debs

    return debs.host_driver(tmp_path_factory.mktemp("debs"))


def host_with_vfs(root, tools, deb, held=False, guest=False):
    host = ready(whole_and_vgpu_host(root, moved=False), root, tools, deb)
    assert host.enable_recorded_vfs(["-e", H200]) == 0
    host.unbind_lock(H200, held=held)
    if guest:
        defined_guest(root, "instance-00000009", GUEST, pci_address=H200_VF)
    return host


def whole_entry(results):
    """The H200's entry in the preview's per-GPU results."""
    return next(g for g in results["gpus"].values() if g["address"] == H200)


@pytest.mark.parametrize("held, guest, words", [
    (True, False, "held through the nvidia driver"),
    (False, True, "instance-00000009"),
])
def test_a_refused_move_is_refused_by_both_in_the_same_words(ctx, root, tools, deb, held, guest,
                                                             words):
    host_with_vfs(root, tools, deb, held=held, guest=guest)
    before = settled(ctx, deb)
    results = preview(ctx, root, before, WHOLE)
    out = ctx.run(ctx.on.config_changed(), again(before, {"vgpu-device-mappings": WHOLE}))
    assert results["verdict"] == "refused"
    assert out.unit_status.name == "blocked"
    assert words in results["refused"] and words in out.unit_status.message
    problem = next(line for line in results["refused"].splitlines() if words in line)
    assert problem[:80] in out.unit_status.message
    assert sriov.driver_of(H200) == "nvidia"


def test_an_accepted_move_previews_as_the_hook_does_it_then_nothing_would_change(ctx, root,
                                                                                 tools, deb):
    host_with_vfs(root, tools, deb)
    before = settled(ctx, deb)
    results = preview(ctx, root, before, WHOLE)
    assert results["verdict"] == "would apply", results
    assert H200 in results["whole-gpus"] and "sriov-manage -d" in results["whole-gpus"]
    assert "unknown until applied" not in str(results["gpus"])
    out = ctx.run(ctx.on.config_changed(), again(before, {"vgpu-device-mappings": WHOLE}))
    assert out.unit_status.name == "active", out.unit_status.message
    assert sriov.driver_of(H200) == "vfio-pci"
    assert H200 in results["nova-conf"] and H200 in {s["address"] for s in specs(out)}
    after = preview(ctx, root, again(out), WHOLE)
    assert after["verdict"] == "nothing would change", after
    assert "unknown until applied" not in str(whole_entry(after)), after


def test_a_gpu_the_mapping_leaves_alone_is_never_unknown(ctx, root, tools, deb):
    """The H200 on nvidia without VFs, mapped by no key: the L40S mapping previews in full."""
    ready(whole_and_vgpu_host(root, moved=False), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), again(settled(ctx, deb),
                                                   {"vgpu-device-mappings": "{L40S-12Q: [81:00.0]}"}))
    assert first.unit_status.name == "active", first.unit_status.message
    results = preview(ctx, root, again(first), "{L40S-12Q: [81:00.0]}")
    assert results["verdict"] == "nothing would change", results
    assert "unknown until applied" not in str(whole_entry(results)), results


def test_a_gpu_taken_out_of_passthrough_previews_as_handed_back(ctx, root, tools, deb):
    ready(whole_and_vgpu_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), again(settled(ctx, deb),
                                                   {"vgpu-device-mappings": WHOLE}))
    assert first.unit_status.name == "active", first.unit_status.message
    results = preview(ctx, root, again(first), "{L40S-12Q: all}")
    assert results["verdict"] == "would apply", results
    assert results["whole-gpus"] == f"GPU {H200} (H200 SXM 141GB): handed back from vfio-pci"


BOTH = "{passthrough: [81:00.0, c1:00.0]}"
CLASSES = {L40S: "CUSTOM_GPU_L40S", H200: "CUSTOM_GPU_H200_SXM_141GB"}


def published_sections(out) -> dict:
    """nova-compute's [pci] entries from this unit, read as the principal reads them."""
    return principal.nova_context(ours(out)).get("sections", {})


def whole_on_vfio_pci(root, gpu) -> bool:
    """On vfio-pci (read back as the charm and as sysfs show it), its override set, no VFs."""
    device = root / "sys/bus/pci/devices" / gpu
    return (passthrough.bound(gpu) == sriov.driver_of(gpu) == "vfio-pci"
            and (device / "driver_override").read_text().strip() == "vfio-pci"
            and not list(device.glob("virtfn*")))


def test_two_gpus_going_whole_in_one_hook_end_where_the_preview_said(ctx, root, tools, deb):
    """Both GPUs, on nvidia with VFs enabled, go whole in one config-changed.

    The hook writes both GPUs' driver_override, nvidia's unbind and drivers_probe one
    after the other; the kernel acts on each write as it is made (pci-sysfs.c,
    pci-driver.c, bus.c), so both end on vfio-pci and both are published whole.
    """
    host = host_with_vfs(root, tools, deb)
    host.unbind_lock(L40S)
    before = settled(ctx, deb)
    results = preview(ctx, root, before, BOTH)
    assert results["verdict"] == "would apply", results
    assert results["whole-gpus"] == "\n".join(
        f"GPU {gpu} ({model}): its VFs disabled (sriov-manage -d), then to vfio-pci "
        "(driver_override, udev rule), published whole once vfio-pci holds it"
        for gpu, model in ((L40S, "L40S"), (H200, "H200 SXM 141GB")))
    assert results["summary"] == ("0 VF(s) would change type; nova-compute would get "
                                  "CUSTOM_GPU_H200_SXM_141GB on 1, CUSTOM_GPU_L40S on 1")

    out = ctx.run(ctx.on.config_changed(), again(before, {"vgpu-device-mappings": BOTH}))
    assert out.unit_status.name == "active", out.unit_status.message
    calls = tools.calls()
    for gpu in (L40S, H200):
        assert whole_on_vfio_pci(root, gpu), gpu
        assert calls.index(f"sriov-manage -d {gpu}") < calls.index("modprobe vfio-pci")
    assert passthrough.overridden((root / passthrough.RULES).read_text()) == [L40S, H200]
    sections = published_sections(out)
    assert results["nova-conf"] == render(sections)  # the preview said what the hook published
    pci = sections["pci"]
    spec_of = {s["address"]: s for s in (json.loads(v) for k, v in pci if k == "device_spec")}
    assert {a: s["resource_class"] for a, s in spec_of.items()} == CLASSES
    for spec in spec_of.values():
        nova_devspec(json.dumps(spec))
    assert [k for k, _ in pci] == ["device_spec", "device_spec"]  # aliases are the operator's
    # ... as list-vgpu-types gives them, one per whole GPU, matching its published spec.
    ctx.run(ctx.on.action("list-vgpu-types"), again(out))
    listed = {g["addresses"]: g for g in ctx.action_results["gpus"].values()}
    assert sorted(listed) == [L40S, H200]
    for gpu, entry in listed.items():
        alias = json.loads(entry["pci-alias"])
        assert (entry["driver"], entry["resource-class"]) == ("vfio-pci", CLASSES[gpu])
        assert (alias["product_id"], alias["device_type"]) == (spec_of[gpu]["product_id"], "type-PF")
    assert "CUSTOM_GPU_H200_SXM_141GB on 1" in out.unit_status.message
    assert "CUSTOM_GPU_L40S on 1" in out.unit_status.message
    after = preview(ctx, root, again(out), BOTH)
    assert after["verdict"] == "nothing would change", after


def test_a_gpu_serving_vgpus_goes_whole_and_its_vfs_specs_go_with_its_vfs(ctx, root, tools, deb):
    """vGPU to whole: the VFs the hook disabled are no longer published, as the preview said.

    Their device specs are not those of VFs gone missing (kept for the guests on them,
    vgpu.novaconf.keep_published): the hook disabled them itself, once it found no guest
    on any, and the GPU is published whole in their place.
    """
    ready(whole_and_vgpu_host(root, moved=False), root, tools, deb).unbind_lock(L40S)
    first = ctx.run(ctx.on.config_changed(), again(settled(ctx, deb),
                                                   {"vgpu-device-mappings": "{L40S-12Q: [81:00.0]}"}))
    assert first.unit_status.name == "active", first.unit_status.message
    assert {s["address"] for s in specs(first)} == {f"0000:81:00.{n}" for n in range(4, 8)}
    whole = "{passthrough: [81:00.0]}"
    results = preview(ctx, root, again(first), whole)
    assert results["verdict"] == "would apply", results
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": whole}))
    assert whole_on_vfio_pci(root, L40S)
    assert [(s["address"], s["resource_class"]) for s in specs(out)] == [(L40S, "CUSTOM_GPU_L40S")]
    assert results["nova-conf"] == render(published_sections(out))
    assert out.unit_status.name == "active", out.unit_status.message
    after = preview(ctx, root, again(out), whole)
    assert after["verdict"] == "nothing would change", after


SWAP = "{'NVIDIA H200X-35C': [c1:00.0], passthrough: [81:00.0]}"


def test_a_whole_gpu_split_into_vgpus_as_another_goes_whole_in_one_hook(ctx, root, tools, deb):
    """The H200 back from whole to vGPUs, the L40S from vGPUs to whole: one mapping change.

    The H200 is handed back to nvidia (its override and udev rule gone), then its VFs are
    enabled (sriov-manage -e) and given their type, all in the hook; the preview cannot
    know its VFs' types before they exist, and says so, as for any GPU without VFs.
    """
    ready(whole_and_vgpu_host(root), root, tools, deb).unbind_lock(L40S)
    first = ctx.run(ctx.on.config_changed(), again(settled(ctx, deb),
                                                   {"vgpu-device-mappings": WHOLE}))
    assert first.unit_status.name == "active", first.unit_status.message
    results = preview(ctx, root, again(first), SWAP)
    assert results["verdict"] == "unknown until applied", results
    assert results["summary"] == (
        f"unknown until applied on 1 GPU(s): GPU {H200}: it is handed back from vfio-pci "
        "first, then its VFs are enabled (sriov-manage -e)")
    assert results["whole-gpus"] == (
        f"GPU {L40S} (L40S): its VFs disabled (sriov-manage -d), then to vfio-pci (driver_override, "
        f"udev rule), published whole once vfio-pci holds it\n"
        f"GPU {H200} (H200 SXM 141GB): handed back from vfio-pci")

    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": SWAP}))
    assert out.unit_status.name == "active", out.unit_status.message
    assert whole_on_vfio_pci(root, L40S)
    assert passthrough.bound(H200) == "nvidia"
    assert (root / f"sys/bus/pci/devices/{H200}/driver_override").read_text() == "\n"
    assert passthrough.overridden((root / passthrough.RULES).read_text()) == [L40S]
    calls = tools.calls()
    assert calls.index(f"sriov-manage -d {L40S}") < calls.index(f"sriov-manage -e {H200}")
    h200_vfs = [f"0000:c1:00.{n}" for n in range(4, 8)]
    assert [(s["address"], s["resource_class"]) for s in specs(out)] == [
        (L40S, "CUSTOM_GPU_L40S")] + [(vf, "CUSTOM_VGPU_H200X_35C") for vf in h200_vfs]
    after = preview(ctx, root, again(out), SWAP)
    assert after["verdict"] == "nothing would change", after


def test_a_whole_gpu_a_guest_holds_is_not_split_and_both_say_so_in_the_same_words(ctx, root,
                                                                                   tools, deb):
    ready(whole_and_vgpu_host(root), root, tools, deb).unbind_lock(L40S)
    first = ctx.run(ctx.on.config_changed(), again(settled(ctx, deb),
                                                   {"vgpu-device-mappings": WHOLE}))
    published = specs(first)
    defined_guest(root, "instance-0000000a", GUEST, pci_address=H200)
    results = preview(ctx, root, again(first), SWAP)
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": SWAP}))
    assert results["verdict"] == "refused" and out.unit_status.name == "blocked"
    words = next(line for line in results["refused"].splitlines() if "instance-0000000a" in line)
    assert "moves between whole (passthrough) and vGPU" in words
    assert words in out.unit_status.message
    assert passthrough.bound(H200) == "vfio-pci" and sriov.driver_of(L40S) == "nvidia"
    assert specs(out) == published
    assert f"sriov-manage -e {H200}" not in tools.calls()


def test_a_gpu_handed_back_whose_vfs_fail_is_published_neither_whole_nor_split(ctx, root,
                                                                               tools, deb):
    """sriov-manage -e fails on the H200 once handed back: the first step stands, said.

    nova-compute no longer gets it whole (nvidia holds it now) nor any of its VFs; the
    L40S is published whole; the next hook, once sriov-manage works, splits the H200.
    """
    host = ready(whole_and_vgpu_host(root), root, tools, deb)
    host.unbind_lock(L40S)
    first = ctx.run(ctx.on.config_changed(), again(settled(ctx, deb),
                                                   {"vgpu-device-mappings": WHOLE}))
    host.fail_sriov_manage(H200)
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": SWAP}))
    assert out.unit_status.name == "blocked"
    assert H200 in out.unit_status.message and "sriov-manage -e" in out.unit_status.message
    assert passthrough.bound(H200) == "nvidia" and whole_on_vfio_pci(root, L40S)
    assert [(s["address"], s["resource_class"]) for s in specs(out)] == [(L40S, "CUSTOM_GPU_L40S")]
    recipes = json.loads(host.recipes.read_text())
    del recipes[H200]["fails"]
    host.recipes.write_text(json.dumps(recipes))
    retried = ctx.run(ctx.on.update_status(), again(out))
    assert retried.unit_status.name == "active", retried.unit_status.message
    assert [s["address"] for s in specs(retried)] == [L40S] + [
        f"0000:c1:00.{n}" for n in range(4, 8)]


def test_a_udev_rule_removed_by_hand_is_previewed_as_rewritten_and_the_hook_rewrites_it(
        ctx, root, tools, deb):
    """The GPUs are where the mapping wants them: the rule alone would change, nothing else."""
    ready(whole_and_vgpu_host(root), root, tools, deb)
    first = ctx.run(ctx.on.config_changed(), again(settled(ctx, deb),
                                                   {"vgpu-device-mappings": WHOLE}))
    assert first.unit_status.name == "active", first.unit_status.message
    rule = root / passthrough.RULES
    written = rule.read_text()
    rule.unlink()
    results = preview(ctx, root, again(first), WHOLE)
    assert results["whole-gpus"] == "the udev rule rewritten"
    assert (results["verdict"], results["summary"]) == (
        "would apply", "0 VF(s) would change type; nova-compute would get "
        "CUSTOM_GPU_H200_SXM_141GB on 1, CUSTOM_VGPU_L40S_12Q on 4")
    out = ctx.run(ctx.on.config_changed(), again(first))
    assert rule.read_text() == written
    after = preview(ctx, root, again(out), WHOLE)
    assert after["verdict"] == "nothing would change", after
