"""The charm beside nova-compute's own rules and its neighbours (ops.testing).

What Nova refuses in an address (a PCI domain above ffff), what Nova 30 and
later need on an mdev host (mdevctl), and what a neighbouring subordinate
(ceilometer-agent) loses in nova.conf once this unit publishes sections:
each read the way nova-compute reads this unit's data (charmhelpers).
"""

from ops import testing

from unit_tests import principal
from unit_tests.fakehost import V100_TYPES, v100_host
from unit_tests.test_charm import install_driver, nova_conf, ours, state
from unit_tests.test_charm_sriov import again

MGR, VGPUD = "nvidia-vgpu-mgr", "nvidia-vgpud"
VMD = "10000:01:00.0"  # a GPU behind Intel VMD: PCI domain 10000


def driver_ready(root, tools, packages):
    install_driver(root, packages["old"])
    tools.set_active(MGR)
    tools.set_active(VGPUD)


# -- PCI domains above ffff ----------------------------------------------------------------

def test_a_gpu_in_a_domain_above_ffff_is_never_published_and_named(ctx, root, tools, packages):
    host = v100_host(root)
    host.add_gpu(VMD, device="0x1db4", mdev_types=V100_TYPES)
    driver_ready(root, tools, packages)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(
        f"GPU {VMD} (Tesla V100 PCIe 16GB) is in PCI domain 10000, above ffff, which Nova refuses "
        "(nova-compute would stop): not given to Nova; turn VMD off for its slot in the "
        "firmware, or map the other GPUs by address in vgpu-device-mappings")
    assert nova_conf(out) == ("[devices]\nenabled_mdev_types = nvidia-108\n"
                              "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0,0000:e1:00.0\n")
    # Mapped by address, the others alone: active, the same sections.
    out = ctx.run(ctx.on.config_changed(), again(out, {
        "vgpu-device-mappings": "{nvidia-108: [c1:00.0, e1:00.0]}"}))
    assert out.unit_status.name == "active", out.unit_status
    assert principal.nova_context(ours(out))["sections"]["mdev_nvidia-108"] == [
        ["device_addresses", "0000:c1:00.0,0000:e1:00.0"]]
