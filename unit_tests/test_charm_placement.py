"""pci-in-placement and vfio-live-migration through the charm, step by step.

Each step runs the real charm (ops.testing) on a vendor-specific VFIO host
and reads what it published the way nova-compute does (charmhelpers'
SubordinateConfigContext), renders nova.conf beside the principal's own
``[pci]`` and parses it with oslo.config and Nova's option definitions, as
unit_tests/test_nova_rules.py does.
"""

import json

import pytest
from ops import testing

from charm import NovaComputeNvidiaVgpuCharm
from unit_tests import debs, principal
from unit_tests.fakehost import L40S_TYPES, FakeHost, l40s_host, v100_host
from unit_tests.test_charm import install_driver, ours, relation, state
from unit_tests.test_charm_sriov import L40S, MAPPING, again, ready, types_of
from unit_tests.test_nova_rules import PRINCIPAL_PCI, nova_devspec, oslo_conf
from vgpu import driver, status

PLACEMENT = "pci-in-placement"
LIVE = "vfio-live-migration"


def nova_reads(out, tmp_path):
    """nova.conf as nova-compute renders it after this hook, parsed as Nova parses it."""
    path = tmp_path / "nova.conf"
    path.write_text(PRINCIPAL_PCI + principal.render_nova_conf(principal.nova_context(ours(out))))
    return oslo_conf(path)


def our_specs(conf):
    return [json.loads(s) for s in conf.pci.device_spec if '"10de"' in s]


@pytest.fixture(scope="module")
def deb(tmp_path_factory):
    return debs.host_driver(tmp_path_factory.mktemp("debs"))


@pytest.fixture
def vfio(root, tools, deb):
    """An L40S and an H200 on the VFIO framework, Nova 31, the driver installed and running."""
    return ready(l40s_host(root), root, tools, deb)


@pytest.fixture
def v100(root, tools, deb):
    """Two V100s (mediated devices), Nova 29, the driver installed and running."""
    host = v100_host(root)
    install_driver(root, deb)
    tools.set_active("nvidia-vgpu-mgr")
    tools.set_active("nvidia-vgpud")
    return host


# -- pci-in-placement ----------------------------------------------------------------

def test_reporting_follows_the_option_and_stays_once_published(ctx, vfio, root, tmp_path):
    # A fresh deployment: the VFs are published, reporting is not, and Nova takes every entry.
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    conf = nova_reads(out, tmp_path)
    assert conf.pci.report_in_placement is False
    assert len(our_specs(conf)) == 8
    for spec in conf.pci.device_spec:
        if '"10de"' in spec:
            nova_devspec(spec)
    assert out.unit_status.name == "active" and "report_in_placement" not in out.unit_status.message
    # Turned on: published with the specs.
    out = ctx.run(ctx.on.config_changed(), again(out, {"vgpu-device-mappings": MAPPING,
                                                       PLACEMENT: True}))
    conf = nova_reads(out, tmp_path)
    assert conf.pci.report_in_placement is True and len(our_specs(conf)) == 8
    assert "report_in_placement" not in out.unit_status.message
    # Turned off again: Nova would not start without it, so it stays, and the status says why.
    out = ctx.run(ctx.on.config_changed(), again(out, {"vgpu-device-mappings": MAPPING,
                                                       PLACEMENT: False}))
    conf = nova_reads(out, tmp_path)
    assert conf.pci.report_in_placement is True and len(our_specs(conf)) == 8
    assert out.unit_status.name == "active"
    assert out.unit_status.message.endswith("; " + status.REPORTING_KEPT)
    # And with the mapping cleared too: only the reporting is left.
    out = ctx.run(ctx.on.config_changed(), again(out, {"vgpu-device-mappings": ""}))
    conf = nova_reads(out, tmp_path)
    assert (conf.pci.report_in_placement, our_specs(conf)) == (True, [])
    assert types_of(root, L40S, 4) == [0] * 4  # the VFs were released


def test_an_older_revisions_reporting_is_kept_after_the_upgrade(ctx, vfio, tmp_path):
    before = {"nova": {"/etc/nova/nova.conf": {"sections": {"pci": [
        ["report_in_placement", "True"]]}}}}
    older = relation(local={"subordinate_configuration": json.dumps(before)})
    out = ctx.run(ctx.on.upgrade_charm(), state({"vgpu-device-mappings": MAPPING},
                                                relations=[older], resource=deb))
    assert nova_reads(out, tmp_path).pci.report_in_placement is True
    assert out.unit_status.message.endswith(status.REPORTING_KEPT)


def test_the_option_on_a_mediated_device_host_publishes_no_reporting(ctx, v100, deb, tmp_path):
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}",
                                                  PLACEMENT: True}, resource=deb))
    # The principal's own passed-through devices must not be pulled into Placement.
    assert nova_reads(out, tmp_path).pci.report_in_placement is False
    assert "[mdev_nvidia-108]" in principal.render_nova_conf(principal.nova_context(ours(out)))


def two_l40s(root, tools, deb):
    host = FakeHost(root)
    host.pci_ids()
    for pf in ("0000:81:00.0", "0000:82:00.0"):
        host.add_sriov_gpu(pf, device="0x26b9", vf_device="0x26b9", count=4,
                           vfio_types=L40S_TYPES, totalvfs=32)
    host.iommu_groups(8)
    host.nova("3:31.0.0-0ubuntu1")
    host.modules(["nvidia_vgpu_vfio", "nvidia"])
    host.loaded_driver("570.158.02")
    return ready(host, root, tools, deb)


def test_two_profiles_on_one_gpu_model_need_placement(ctx, root, tools, deb, tmp_path):
    two_l40s(root, tools, deb)
    mapping = {"vgpu-device-mappings": "{L40S-12Q: ['81:00.0'], L40S-24Q: ['82:00.0']}"}
    out = ctx.run(ctx.on.config_changed(), state(mapping, resource=deb))
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings: profiles L40S-12Q, L40S-24Q share VF product id 26b9, which a PCI "
        "alias by vendor and product id cannot tell apart: map one profile per GPU model or set "
        "pci-in-placement=true")
    assert "subordinate_configuration" not in ours(out)
    out = ctx.run(ctx.on.config_changed(), again(out, {**mapping, PLACEMENT: True}))
    assert out.unit_status.name == "active"
    conf = nova_reads(out, tmp_path)
    assert conf.pci.report_in_placement is True
    assert {s["resource_class"] for s in our_specs(conf)} == {"CUSTOM_VGPU_L40S_12Q",
                                                              "CUSTOM_VGPU_L40S_24Q"}


# -- vfio-live-migration -------------------------------------------------------------

def test_live_migration_marks_every_spec_nova_accepts(ctx, vfio, tmp_path):
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING, LIVE: True},
                                                 resource=deb))
    specs = [s for s in nova_reads(out, tmp_path).pci.device_spec if '"10de"' in s]
    assert len(specs) == 8
    for text in specs:
        nova_devspec(text)
        assert json.loads(text)["live_migratable"] == "yes"
    out = ctx.run(ctx.on.config_changed(), again(out, {"vgpu-device-mappings": MAPPING}))
    assert not [s for s in our_specs(nova_reads(out, tmp_path)) if "live_migratable" in s]


def test_live_migration_on_an_older_nova_blocks_and_keeps_what_was_published(ctx, v100, deb):
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: [c1:00.0]}"},
                                                   resource=deb))
    published = ours(first)["subordinate_configuration"]
    out = ctx.run(ctx.on.config_changed(), again(first, {
        "vgpu-device-mappings": "{nvidia-109: [e1:00.0]}", LIVE: True}))
    assert out.unit_status == testing.BlockedStatus(
        "vgpu-device-mappings: vfio-live-migration needs Nova 31 (2025.1 epoxy) or later; this "
        "host runs 2024.1 caracal (Nova 29): upgrade Nova or set vfio-live-migration=false; "
        "keeping nvidia-108 on 0000:c1:00.0")
    assert ours(out)["subordinate_configuration"] == published


def test_live_migration_below_libvirt_10_or_qemu_8_2_2_blocks_and_keeps_what_was_published(
        ctx, vfio, tools, tmp_path):
    """Nova 31+ refuses to start with a live_migratable device_spec on older libvirt or QEMU.

    nova/virt/libvirt/driver.py ``_check_pci_whitelist`` (MIN_VFIO_PCI_VARIANT_LIBVIRT_VERSION
    (10, 0, 0), _QEMU_VERSION (8, 2, 2)), asking the running daemon: so does the charm (virsh).
    """
    tools.set_virsh("8.0.0", "6.2.0")  # Ubuntu 22.04's libvirt and QEMU
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING},
                                                   resource=deb))
    assert not [c for c in tools.calls() if c.startswith("virsh")]  # option off: never asked
    published = ours(first)["subordinate_configuration"]
    out = ctx.run(ctx.on.config_changed(), again(first, {"vgpu-device-mappings": MAPPING,
                                                         LIVE: True}))
    assert out.unit_status == testing.BlockedStatus(
        "vfio-live-migration not applied: libvirt 8.0.0 (running) is older than 10.0.0; QEMU "
        "6.2.0 (running) is older than 8.2.2, which Nova needs for a live_migratable [pci] "
        "device_spec (nova-compute would not start); upgrade libvirt and QEMU (Ubuntu 24.04 "
        "ships libvirt 10.0.0 and QEMU 8.2.2) or set vfio-live-migration=false; the last "
        "published settings stay")
    assert ours(out)["subordinate_configuration"] == published
    assert "virsh -r version --daemon" in tools.calls()
    # libvirtd down: dpkg's installed versions decide, and say so.
    tools.set_virsh("down")
    status_file = vfio.root / "var/lib/dpkg/status"
    status_file.write_text(status_file.read_text() + "".join(
        f"\nPackage: {name}\nStatus: install ok installed\nArchitecture: amd64\n"
        f"Version: {version}\n" for name, version in (
            ("libvirt-daemon-system", "10.0.0-2ubuntu8.5"),
            ("qemu-system-x86", "1:8.2.1+ds-0ubuntu1"))))
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status.message.startswith(
        "vfio-live-migration not applied: QEMU 8.2.1 (installed) is older than 8.2.2")
    assert ours(out)["subordinate_configuration"] == published
    # Upgraded and running: published live_migratable.
    tools.set_virsh("10.0.0", "8.2.2")
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status.name == "active", out.unit_status
    assert {s["live_migratable"] for s in our_specs(nova_reads(out, tmp_path))} == {
        "yes"}


def test_post_copy_on_says_vgpu_guests_will_not_live_migrate_with_the_fix(ctx, vfio, tools):
    """QEMU refuses VFIO migration with postcopy (Nova 34.0.0 virtual-gpu.rst; Red Hat's guide)."""
    from unit_tests.fakehost import live_migration_lines

    vfio.principal_nova_conf(libvirt=live_migration_lines(post_copy=True))
    config = {"vgpu-device-mappings": MAPPING, LIVE: True}
    out = ctx.run(ctx.on.config_changed(), state(config, resource=deb))
    assert out.unit_status.name == "active"
    assert out.unit_status.message.endswith(
        "; vGPU guests will not live-migrate: nova-compute permits post-copy "
        "(live_migration_permit_post_copy), which QEMU refuses for VFIO devices; juju config "
        "nova-compute live-migration-permit-post-copy=false"), out.unit_status
    ctx.run(ctx.on.action("list-vgpu-types"), out)
    live = ctx.action_results["live-migration"]
    assert (live["ready"], live["libvirt"], live["qemu"], live["source"], live["post-copy"]) == (
        "no", "10.0.0", "8.2.2", "running", "yes")
    assert "juju config nova-compute live-migration-permit-post-copy=false" in live["why-not"]
    # Fixed: no note, and list-vgpu-types says guests can move.
    vfio.principal_nova_conf(libvirt=live_migration_lines())
    out = ctx.run(ctx.on.update_status(), out)
    assert "post-copy" not in out.unit_status.message
    ctx.run(ctx.on.action("list-vgpu-types"), out)
    assert ctx.action_results["live-migration"]["ready"] == "yes"
    assert ctx.action_results["live-migration"]["why-not"] == "nothing: guests can live-migrate"
    # Live migration off in nova-compute: no note (nothing to migrate), but the action says why.
    vfio.principal_nova_conf()
    out = ctx.run(ctx.on.update_status(), out)
    assert "post-copy" not in out.unit_status.message
    ctx.run(ctx.on.action("list-vgpu-types"), out)
    assert ctx.action_results["live-migration"]["why-not"] == (
        "nova-compute has live migration off (enable-live-migration)")


def test_without_vfio_live_migration_vfio_guests_cold_migrate_and_no_virsh_runs(ctx, vfio, tools):
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING}, resource=deb))
    ctx.run(ctx.on.update_status(), out)
    assert not [c for c in tools.calls() if c.startswith("virsh")]
    ctx.run(ctx.on.action("list-vgpu-types"), out)
    assert ctx.action_results["live-migration"]["why-not"].startswith(
        "vfio-live-migration is false")


# -- names as deployed ---------------------------------------------------------------

@pytest.fixture
def gpu_a():
    """The charm deployed as gpu-a, its unit gpu-a/3."""
    return testing.Context(NovaComputeNvidiaVgpuCharm, app_name="gpu-a", unit_id=3)


def placeholder(tmp_path):
    """Charmhub's empty placeholder for the resource: nothing attached yet."""
    path = tmp_path / "placeholder.deb"
    path.touch()
    return {testing.Resource(name="nvidia-vgpu-software", path=path)}


def test_the_relate_hint_takes_the_principal_from_juju_info(gpu_a, root, tools, deb):
    v100_host(root)
    install_driver(root, deb)
    tools.set_active("nvidia-vgpu-mgr")
    info = testing.SubordinateRelation("juju-info", remote_app_name="compute-gpu")
    out = gpu_a.run(gpu_a.on.update_status(), testing.State(relations=[info], resources={
        testing.Resource(name="nvidia-vgpu-software", path=deb)}))
    assert out.unit_status == testing.BlockedStatus(
        "relate to compute-gpu: juju integrate compute-gpu:nova-vgpu gpu-a:nova-vgpu")


def test_the_attach_and_resume_hints_name_this_application_and_unit(gpu_a, root, tools, deb,
                                                                     tmp_path):
    v100_host(root)
    vgpu = testing.SubordinateRelation("nova-vgpu", remote_app_name="compute-gpu")
    out = gpu_a.run(gpu_a.on.install(), testing.State(relations=[vgpu],
                                                      resources=placeholder(tmp_path)))
    assert out.unit_status == testing.BlockedStatus(
        f"nvidia-vgpu-software resource is empty: {driver.attach_hint(app='gpu-a')}")
    assert out.unit_status.message.endswith(
        ": juju attach-resource gpu-a nvidia-vgpu-software=./nvidia-vgpu-ubuntu-<branch>_"
        f"<version>_{driver.hint_architecture()}.deb")
    install_driver(root, deb)
    tools.set_active("nvidia-vgpu-mgr")
    out = gpu_a.run(gpu_a.on.action("pause"), testing.State(
        relations=[vgpu], resources={testing.Resource(name="nvidia-vgpu-software", path=deb)}))
    assert out.unit_status == testing.MaintenanceStatus(
        "paused: vGPU services stopped; juju run gpu-a/3 resume to start them")


def test_reporting_survives_the_relation_removed_and_added_again(ctx, vfio, deb, tmp_path):
    """Nova refuses report_in_placement turned off: the unit remembers it, not the relation."""
    first = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": MAPPING,
                                                    PLACEMENT: True}, resource=deb))
    assert nova_reads(first, tmp_path).pci.report_in_placement is True
    gone = first.get_relations("nova-vgpu")[0]
    # pci-in-placement turned off meanwhile, then the relation removed (its data goes with it).
    config = {"vgpu-device-mappings": MAPPING, PLACEMENT: False}
    out = ctx.run(ctx.on.relation_broken(gone), testing.State(
        config=config, relations=first.relations, resources=first.resources,
        stored_states=first.stored_states))
    out = ctx.run(ctx.on.update_status(), testing.State(
        config=config, relations=[], resources=out.resources, stored_states=out.stored_states))
    added = relation()
    for event in (ctx.on.relation_created(added), ctx.on.relation_joined(added)):
        out = ctx.run(event, testing.State(config=config, relations=[added],
                                           resources=out.resources,
                                           stored_states=out.stored_states))
        added = out.get_relations("nova-vgpu")[0]
    conf = nova_reads(out, tmp_path)
    assert conf.pci.report_in_placement is True
    assert len(our_specs(conf)) == 8
    assert out.unit_status.message.endswith("; " + status.REPORTING_KEPT)
