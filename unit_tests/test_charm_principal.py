"""The charm beside the principal's own [pci] settings (ops.testing).

nova-compute (deployed here as ``compute-gpu``, to show the real application
name reaches the messages) renders its ``pci-passthrough-whitelist`` into the
same ``[pci]`` of /etc/nova/nova.conf as this unit's device specs, ahead of
them. The VFIO host (an L40S and an H200 SXM) gets its nova.conf from
``FakeHost.principal_nova_conf``, rendered as charm-nova-compute renders it.
Checked: the status, the relation data as nova-compute reads it (the last good
stays), and the VF types on the host.
"""

import json

import pytest
from ops import testing

from unit_tests import debs, principal
from unit_tests.fakehost import l40s_host, v100_host
from unit_tests.test_charm import ours
from unit_tests.test_charm_sriov import H200, L40S, MAPPING, ready, types_of, vfs
from unit_tests.test_charm_sriov import again as next_hook

APP = "compute-gpu"
NIC = '{"vendor_id": "15b3", "product_id": "101d", "physical_network": "physnet1"}'


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    return debs.host_driver(tmp_path_factory.mktemp("debs"))


@pytest.fixture
def vfio(root, tools, deb):
    host = ready(l40s_host(root), root, tools, deb)
    host.principal_nova_conf(NIC)  # a NIC passed through for SR-IOV networking
    return host


# Placement reporting on: the devname and Placement conflicts apply (pci-in-placement).
PLACEMENT = {"pci-in-placement": True}


def again(out, config=None):
    """The next hook; a new config keeps pci-in-placement on."""
    return next_hook(out, None if config is None else {**PLACEMENT, **config})


def state(config, deb, local=None):
    return testing.State(
        config={**PLACEMENT, **config},
        relations=[testing.SubordinateRelation("nova-vgpu", remote_app_name=APP,
                                               local_unit_data=dict(local or {}))],
        resources={testing.Resource(name="nvidia-vgpu-software", path=deb)})


def rendered(host, out, whitelist=NIC):
    """nova-compute renders its nova.conf again, with this unit's sections in it."""
    host.principal_nova_conf(whitelist, subordinate=principal.render_nova_conf(
        principal.nova_context(ours(out))))


def published_specs(out):
    return [json.loads(v) for k, v in principal.nova_context(ours(out))["sections"]["pci"]
            if k == "device_spec"]


def test_our_own_entries_in_nova_conf_are_no_conflict(ctx, vfio, root, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    assert first.unit_status.name == "active", first.unit_status
    rendered(vfio, first)
    assert (root / "etc/nova/nova.conf").read_text().count("device_spec = ") == 8
    out = ctx.run(ctx.on.update_status(), again(first))
    assert out.unit_status == first.unit_status
    assert ours(out) == ours(first)


def test_a_whitelisted_gpu_whose_vfs_would_be_published_blocks_before_any_vf_changes(
        ctx, vfio, root, deb):
    vfio.principal_nova_conf('[{"address": "0000:81:00.0"}, ' + NIC + "]")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    assert out.unit_status == testing.BlockedStatus(
        "compute-gpu's pci-passthrough-whitelist entry {\"address\": \"0000:81:00.0\"} matches GPU "
        f"{L40S} and its VFs {', '.join(vfs(L40S, 4))} and 12 more, whose VFs this unit "
        "publishes for vGPUs: Nova refuses a GPU beside its VFs in Placement (nova-compute "
        "stops); leave the GPU out; change it: juju config compute-gpu pci-passthrough-whitelist=...")
    assert "subordinate_configuration" not in ours(out)
    assert types_of(root, L40S, 4) == [0] * 4  # checked before any VF took a type
    assert types_of(root, H200, 4) == [0] * 4


def test_a_conflict_keeps_the_last_published_sections(ctx, vfio, root, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    # One of our VFs by its address (by vendor and product id it would take the GPU too:
    # an L40S's VFs carry the GPU's own id).
    rendered(vfio, first, whitelist='{"vendor_id": "10de", "address": "0000:81:00.4"}')
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert out.unit_status.name == "blocked"
    assert out.unit_status.message.startswith(
        "compute-gpu's pci-passthrough-whitelist entry {\"vendor_id\": \"10de\", \"address\": "
        f"\"0000:81:00.4\"}} matches VF 0000:81:00.4 of GPU {L40S}, which this unit "
        "publishes for vGPUs: Nova uses the first spec that matches")
    assert ours(out) == ours(first)
    assert [s["resource_class"] for s in published_specs(out)][:4] == ["CUSTOM_VGPU_L40S_12Q"] * 4
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]  # the published types stay on the VFs


def test_a_devname_entry_added_later_blocks_while_reporting_stays_published(ctx, vfio, root, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    devname = '{"devname": "enp59s0f0", "physical_network": "physnet1"}'
    rendered(vfio, first, whitelist=devname)  # the operator changed nova-compute's option
    out = ctx.run(ctx.on.update_status(), again(first))
    assert out.unit_status == testing.BlockedStatus(
        f"compute-gpu's pci-passthrough-whitelist entry {devname} names a device by devname, "
        "which Nova refuses while [pci] report_in_placement is on (nova-compute stops): name it "
        "by PCI address; change it: juju config compute-gpu pci-passthrough-whitelist=...")
    assert ours(out) == ours(first)
    # Clearing the mapping does not help: reporting would stay (Nova refuses it turned off).
    out = ctx.run(ctx.on.config_changed(), again(out, {"vgpu-device-mappings": ""}))
    assert out.unit_status.message.startswith(f"compute-gpu's pci-passthrough-whitelist entry {devname}")
    assert ours(out) == ours(first)
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]  # as published: no VF released
    # nova-compute's option corrected: the cleared mapping goes out, reporting stays.
    rendered(vfio, out)
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active", out.unit_status
    assert principal.nova_context(ours(out))["sections"]["pci"] == [
        ["report_in_placement", "True"]]


@pytest.mark.parametrize("damage,why", [
    ("directory", "cannot read /etc/nova/nova.conf: Is a directory"),
    ("garbage", "cannot parse /etc/nova/nova.conf: line 4: no '=' or ':' in 'passthrough_whitelist'"),
])
def test_a_nova_conf_that_cannot_be_read_is_named_and_the_last_good_stays(ctx, vfio, root, deb,
                                                                        damage, why):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    path = root / "etc/nova/nova.conf"
    path.unlink()
    if damage == "directory":
        path.mkdir()
    else:
        path.write_text("[DEFAULT]\ndebug = False\n[pci]\npassthrough_whitelist\n")
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    assert out.unit_status == testing.BlockedStatus(
        f"cannot check compute-gpu's [pci] settings against this unit's: {why}; "
        "the last published settings stay")
    assert ours(out) == ours(first)
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]


@pytest.mark.parametrize("entry,why", [
    ('{"address": {"bus": "' + "(|)" * 40 + 'x"}}',
     "compiling and matching its regular expressions timed out after 0.5s and was stopped"),
    ("[" * 5000 + "]" * 5000, "its JSON is nested more than 32 deep"),
])
def test_an_entry_no_hook_can_evaluate_is_named_and_the_last_good_stays(ctx, vfio, root, deb,
                                                                       monkeypatch, entry, why):
    from vgpu import principalconf, run, text

    monkeypatch.setattr(principalconf, "REGEX_BUDGET", 0.5)
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    rendered(vfio, first, whitelist=entry)
    evaluated, real = [], run.run

    def counted(cmd, *args, **kwargs):
        if "-I" in cmd:  # the bounded process of principalconf
            evaluated.append(cmd)
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(run, "run", counted)
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-24Q: all}"}))
    # Checked beside the new sections and the published ones: evaluated once, within the bound.
    assert len(evaluated) == ("address" in entry)
    assert out.unit_status == testing.BlockedStatus(
        f"cannot check compute-gpu's pci-passthrough-whitelist entry {text.one_line(entry, 70)}: "
        f"{why}; whether it takes this unit's vGPU devices is unknown, the last published "
        "settings stay; change it: juju config compute-gpu pci-passthrough-whitelist=...")
    assert ours(out) == ours(first)
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]


def test_without_nova_conf_it_waits_and_publishes_no_pci(ctx, vfio, root, deb):
    (root / "etc/nova/nova.conf").unlink()
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    assert out.unit_status == testing.WaitingStatus(
        "waiting for compute-gpu to write /etc/nova/nova.conf before publishing [pci] settings")
    assert "subordinate_configuration" not in ours(out)
    assert types_of(root, L40S, 4) == [0] * 4
    vfio.principal_nova_conf(NIC)
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active"
    assert len(published_specs(out)) == 8


V100 = '{"vendor_id": "10de", "product_id": "1db4"}'  # every V100 on the host


def test_a_whitelisted_gpu_whose_mdevs_would_be_given_to_nova_blocks(ctx, root, tools, deb):
    host = v100_host(root)
    ready(host, root, tools, deb)
    host.principal_nova_conf("[" + NIC + ", " + V100 + "]")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"}, deb))
    assert out.unit_status == testing.BlockedStatus(
        f"compute-gpu's pci-passthrough-whitelist entry {V100} matches GPU 0000:c1:00.0, whose "
        "mdevs this unit gives Nova for vGPUs: libvirt lists mdev parents as PCI devices, so a "
        "passthrough flavor would take the whole device with the vGPUs on it; leave it out; "
        "change it: juju config compute-gpu pci-passthrough-whitelist=...")
    assert "subordinate_configuration" not in ours(out)
    # The entry narrowed to the GPU not mapped: published.
    host.principal_nova_conf('{"address": "0000:e1:00.0"}')
    out = ctx.run(ctx.on.config_changed(), again(out, {"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"}))
    assert out.unit_status.name == "active", out.unit_status
    assert "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0" in principal.render_nova_conf(
        principal.nova_context(ours(out)))
    # Widened again later: blocked, and what was published stays.
    first = ours(out)
    host.principal_nova_conf('{"address": "*:c1:00.*"}')
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.message.startswith(
        "compute-gpu's pci-passthrough-whitelist entry {\"address\": \"*:c1:00.*\"} matches GPU "
        "0000:c1:00.0, whose mdevs this unit gives Nova")
    assert ours(out) == first


def test_a_whitelisted_vf_that_hosts_mdevs_blocks(ctx, root, tools, deb):
    from unit_tests.fakehost import a100_host

    host = a100_host(root)
    ready(host, root, tools, deb)
    host.principal_nova_conf('{"address": "0000:41:00.5"}')
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{nvidia-474: ['41:00.4', '41:00.5']}"}, deb))
    assert out.unit_status == testing.BlockedStatus(
        "compute-gpu's pci-passthrough-whitelist entry {\"address\": \"0000:41:00.5\"} matches VF "
        "0000:41:00.5 of GPU 0000:41:00.0, whose VFs 0000:41:00.4, 0000:41:00.5 host the mdevs "
        "this unit gives Nova for vGPUs: libvirt lists mdev parents as PCI devices, so a "
        "passthrough flavor would take the whole device with the vGPUs on it; leave it out; "
        "change it: juju config compute-gpu pci-passthrough-whitelist=...")
    assert "subordinate_configuration" not in ours(out)


def test_an_mdev_host_checks_nova_conf_and_keeps_the_last_good_when_it_cannot(ctx, root, tools,
                                                                             deb):
    host = v100_host(root)
    ready(host, root, tools, deb)
    first = ctx.run(ctx.on.config_changed(),
                    state({"vgpu-device-mappings": "{nvidia-108: all}"}, deb))
    assert first.unit_status.name == "active", first.unit_status
    conf = root / "etc/nova/nova.conf"
    conf.unlink()
    conf.mkdir()
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": "{nvidia-109: all}"}))
    assert out.unit_status == testing.BlockedStatus(
        "cannot check compute-gpu's [pci] settings against this unit's: cannot read "
        "/etc/nova/nova.conf: Is a directory; the last published settings stay")
    assert ours(out) == ours(first)


def test_an_mdev_host_publishes_before_nova_conf_is_written(ctx, root, tools, deb):
    host = v100_host(root)
    ready(host, root, tools, deb)
    (root / "etc/nova/nova.conf").unlink()
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"}, deb))
    assert out.unit_status.name == "active", out.unit_status
    assert "[mdev_nvidia-108]" in principal.render_nova_conf(principal.nova_context(ours(out)))


def test_the_published_sections_are_checked_while_a_bad_mapping_publishes_nothing(ctx, vfio, root,
                                                                                  deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, deb))
    rendered(vfio, first, whitelist='{"address": "0000:c1:00.0"}')
    out = ctx.run(ctx.on.config_changed(),
                  again(first, {"vgpu-device-mappings": "{L40S-12Q: ['99:00.0']}"}))
    assert out.unit_status.message.startswith(
        "compute-gpu's pci-passthrough-whitelist entry {\"address\": \"0000:c1:00.0\"} matches GPU "
        f"{H200} and its VFs {', '.join(vfs(H200, 4))} and 4 more, whose VFs this unit publishes")
    assert ours(out) == ours(first)
