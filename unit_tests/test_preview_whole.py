"""preview-mappings and the hook decide whole GPUs from the same code (issue 41, item 4).

Each case runs preview-mappings, then the hook, on the same host and value, and
asserts they agree: a refusal both refuse in the same words, an acceptance the
preview says would apply and the hook applies, after which the mapping in force
previews as "nothing would change", with no GPU "unknown".
"""

import pytest

from unit_tests.fakehost import whole_and_vgpu_host
from unit_tests.libvirt import defined_guest
from unit_tests.test_charm_passthrough import GUEST, H200, H200_VF, L40S, WHOLE, specs
from unit_tests.test_charm_sriov import again, ready
from unit_tests.test_preview import preview, settled
from vgpu import passthrough, sriov


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


def test_two_gpus_going_whole_are_previewed_a_line_each(ctx, root, tools, deb):
    # (The hook is not played here: the stand-in kernel acts on one driver unbind and probe
    # per listing of the drivers, and the hook writes both GPUs' before it lists them.)
    host = host_with_vfs(root, tools, deb)
    host.unbind_lock(L40S)
    before = settled(ctx, deb)
    both = "{passthrough: [81:00.0, c1:00.0]}"
    results = preview(ctx, root, before, both)
    assert results["verdict"] == "would apply", results
    assert results["whole-gpus"] == "\n".join(
        f"GPU {gpu} ({model}): its VFs disabled (sriov-manage -d), then to vfio-pci "
        "(driver_override, udev rule), published whole once vfio-pci holds it"
        for gpu, model in ((L40S, "L40S"), (H200, "H200 SXM 141GB")))


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
