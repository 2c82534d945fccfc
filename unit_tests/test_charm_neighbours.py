"""The charm beside nova-compute's own rules and its neighbours (ops.testing).

What Nova refuses in an address (a PCI domain above ffff), what Nova 30 and
later need on an mdev host (mdevctl), and what a neighbouring subordinate
(ceilometer-agent) loses in nova.conf once this unit publishes sections:
each read the way nova-compute reads this unit's data (charmhelpers).
"""

import dataclasses
import time
from pathlib import Path

import pytest
from ops import testing

from unit_tests import principal
from unit_tests.fakehost import V100_TYPES, v100_host
from unit_tests.faketools import stand_in
from unit_tests.test_charm import install_driver, nova_conf, ours, state
from unit_tests.test_charm_sriov import again

MGR, VGPUD = "nvidia-vgpu-mgr", "nvidia-vgpud"
VMD = "10000:01:00.0"  # a GPU behind Intel VMD: PCI domain 10000
ROOT = Path(__file__).resolve().parent.parent


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


# -- ceilometer-agent's nova.conf settings -------------------------------------------------

NOVA = "3:29.0.0-0ubuntu1"
CEILOMETER = {"nova-ceilometer": principal.CEILOMETER_DATA}
LOST = ("ceilometer-agent's nova.conf settings lost beside this unit's (instance_usage_audit, "
        "instance_usage_audit_period, notify_on_state_change): juju config nova-compute "
        "config-flags=instance_usage_audit=True,instance_usage_audit_period=hour,"
        "notify_on_state_change=vm_and_task_state")


def ceilometer_host(root, tools, packages):
    host = v100_host(root)
    host.dpkg_status({"nova-common": NOVA, "nova-compute": NOVA, "python3-nova": NOVA,
                      "ceilometer-agent-compute": "2:22.0.0-0ubuntu1"})
    driver_ready(root, tools, packages)
    return host


def test_charm_nova_compute_drops_ceilometers_settings_once_this_unit_publishes(tmp_path):
    """Pinned with charmhelpers' own OSConfigRenderer and SubordinateConfigContexts."""
    ours_data = {"subordinate_configuration": '{"nova":{"/etc/nova/nova.conf":{"sections":'
                                              '{"devices":[["enabled_mdev_types","nvidia-108"]]}}}}'}
    alone = principal.render_with_neighbours({}, tmp_path / "a", CEILOMETER)
    both = principal.render_with_neighbours(ours_data, tmp_path / "b", CEILOMETER)
    fixed = principal.render_with_neighbours(ours_data, tmp_path / "c", CEILOMETER,
                                             config_flags=principal.CEILOMETER_FLAGS)
    assert "instance_usage_audit = True" in alone
    assert "instance_usage_audit" not in both and "[devices]" in both
    assert "instance_usage_audit = True" in fixed and "[devices]" in fixed
    # Empty sections publish nothing the principal merges: ceilometer's stay.
    empty = {"subordinate_configuration": '{"nova":{"/etc/nova/nova.conf":{"sections":{}}}}'}
    assert "notify_on_state_change = vm_and_task_state" in principal.render_with_neighbours(
        empty, tmp_path / "d", CEILOMETER)


def rendered_with_ours(ctx, root, packages, tmp_path, others, name):
    """The hook after nova-compute rendered nova.conf again with this unit's sections.

    Before, with the neighbours' alone, the first publishing hook says nothing of
    ``name``; after, the neighbours' sections are gone. vGPUs work: active.
    """
    conf = root / "etc/nova/nova.conf"
    conf.write_text(principal.render_with_neighbours({}, tmp_path / "t0", others))
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status.name == "active" and name not in out.unit_status.message
    conf.write_text(principal.render_with_neighbours(ours(out), tmp_path / "t1", others))
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active"  # no reason to block the vGPUs
    return out


def test_ceilometers_lost_settings_are_said_with_the_workaround(ctx, root, tools, packages,
                                                                 tmp_path, caplog):
    ceilometer_host(root, tools, packages)
    conf = root / "etc/nova/nova.conf"
    out = rendered_with_ours(ctx, root, packages, tmp_path, CEILOMETER, "ceilometer")
    assert out.unit_status.message.endswith("; " + LOST)
    assert ("ceilometer-agent's nova.conf settings (instance_usage_audit, "
            "instance_usage_audit_period, notify_on_state_change) are missing: nova-compute "
            "renders only one subordinate's sections once this unit publishes its own") in caplog.text
    assert "so Nova sends no instance usage audit and no state-change notifications" in caplog.text
    # The workaround applied: the settings are back, and so is the plain status.
    conf.write_text(principal.render_with_neighbours(
        ours(out), tmp_path / "t2", CEILOMETER, config_flags=principal.CEILOMETER_FLAGS))
    out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.name == "active" and "ceilometer" not in out.unit_status.message


def test_with_ceilometer_agent_a_steady_hook_reads_the_principal_s_files_once(
        ctx, root, tools, packages, tmp_path):
    """The note and the check of the principal's [pci] rules share one reading of nova.conf."""
    from unit_tests.faketools import OPENED

    ceilometer_host(root, tools, packages)
    conf = root / "etc/nova/nova.conf"
    conf.write_text(principal.render_with_neighbours({}, tmp_path / "t0", CEILOMETER))
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    conf.write_text(principal.render_with_neighbours(ours(out), tmp_path / "t1", CEILOMETER))
    with OPENED as opened:
        out = ctx.run(ctx.on.update_status(), again(out))
    assert out.unit_status.message.endswith("; " + LOST)  # both readers were served
    assert opened.reads[conf] == 1
    assert [p for p, n in opened.reads.items() if p.is_relative_to(root) and n > 1] == []


def test_without_ceilometer_agent_nothing_is_said(ctx, root, tools, packages):
    v100_host(root)
    driver_ready(root, tools, packages)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), nvidia-108 on 2; nvidia-108: 0 used, 4 free")


# -- a neutron plugin's and an ephemeral backend's nova.conf settings (issue 30, item 14) -----

CONTRAIL = {"neutron-plugin": principal.CONTRAIL_DATA}
EPHEMERAL = {"ephemeral-backend": principal.EPHEMERAL_DATA}
MDEV_SECTIONS = {"subordinate_configuration": '{"nova":{"/etc/nova/nova.conf":{"sections":'
                                              '{"devices":[["enabled_mdev_types","nvidia-108"]]}}}}'}


@pytest.mark.parametrize("others,theirs", [
    (CONTRAIL, ["firewall_driver = nova.virt.firewall.NoopFirewallDriver", "[CONTRAIL]",
                "use_huge_pages = True"]),
    (EPHEMERAL, ["images_type = sio"]),
])
def test_charm_nova_compute_drops_a_neutron_plugins_or_ephemeral_backends_settings_too(
        tmp_path, others, theirs):
    """Pinned as ceilometer's: the plugin's context comes first, and dict.update keeps ours."""
    alone = principal.render_with_neighbours({}, tmp_path / "a", others)
    both = principal.render_with_neighbours(MDEV_SECTIONS, tmp_path / "b", others)
    assert all(line in alone for line in theirs)
    assert not any(line in both for line in theirs) and "[devices]" in both


def plugin_host(root, tools, packages, *units):
    host = v100_host(root)
    driver_ready(root, tools, packages)
    host.juju_unit("nova-compute-nvidia-vgpu/0", (ROOT / "metadata.yaml").read_text())
    for unit, metadata in units:
        host.juju_unit(unit, metadata)
    return host


CONTRAIL_LOST = (
    "contrail-openstack's nova.conf settings lost beside this unit's (firewall_driver; with "
    "DPDK also [CONTRAIL] use_userspace_vhost and [libvirt] use_huge_pages, which no option of "
    "nova-compute puts back): juju config nova-compute config-flags=firewall_driver="
    "nova.virt.firewall.NoopFirewallDriver")
SCALEIO_LOST = (
    "scaleio-openstack's nova.conf settings lost beside this unit's (it provides "
    "ephemeral-backend; nova-compute renders one subordinate's sections): only nova-compute's "
    "own options put any back (libvirt-image-backend, config-flags)")


def test_a_neutron_plugins_lost_settings_are_said_once_nova_conf_lacks_them(
        ctx, root, tools, packages, tmp_path, caplog):
    plugin_host(root, tools, packages, ("contrail-openstack/3", principal.CONTRAIL_METADATA))
    conf = root / "etc/nova/nova.conf"
    out = rendered_with_ours(ctx, root, packages, tmp_path, CONTRAIL, "contrail")
    assert out.unit_status.message.endswith("; " + CONTRAIL_LOST)
    assert "charmhelpers merges SubordinateConfigContexts with dict.update" in caplog.text
    conf.write_text(principal.render_with_neighbours(
        ours(out), tmp_path / "t2", CONTRAIL,
        config_flags="firewall_driver=nova.virt.firewall.NoopFirewallDriver"))
    out = ctx.run(ctx.on.update_status(), again(out))
    assert "contrail" not in out.unit_status.message


def test_an_ephemeral_backend_beside_this_unit_is_said_while_it_publishes(
        ctx, root, tools, packages):
    from unit_tests.test_neighbours import NOVA_COMPUTE_METADATA

    plugin_host(root, tools, packages, ("scaleio-openstack/1", principal.SCALEIO_METADATA),
                ("neutron-openvswitch/0", NEUTRON_OPENVSWITCH_METADATA),
                ("nova-compute/0", NOVA_COMPUTE_METADATA))  # requires both: never named
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status.name == "active"
    assert out.unit_status.message.endswith("; " + SCALEIO_LOST)  # and nothing of the plugin's
    out = ctx.run(ctx.on.config_changed(), again(out, {"vgpu-device-mappings": ""}))
    assert "scaleio" not in out.unit_status.message  # nothing published: nothing lost


# A neutron plugin that sends nova-compute no sections: charm-neutron-openvswitch's
# neutron_plugin_joined (hooks/neutron_ovs_hooks.py) sets metadata-shared-secret, host and
# restart-nonce only. Present, never named.
NEUTRON_OPENVSWITCH_METADATA = """name: neutron-openvswitch
subordinate: true
provides:
  neutron-plugin:
    interface: neutron-plugin
    scope: container
  neutron-control:
    interface: service-control
requires:
  juju-info:
    interface: juju-info
    scope: container
"""


# -- mdevctl on Nova 30 and later ----------------------------------------------------------

DALMATIAN = "3:30.0.0-0ubuntu1"
MDEVCTL = "usr/sbin/mdevctl"


def test_mdevctl_is_installed_before_mdev_types_are_published_from_nova_30(ctx, root, tools,
                                                                          packages):
    v100_host(root, nova=DALMATIAN)
    driver_ready(root, tools, packages)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status.name == "active", out.unit_status
    assert "apt-get install --yes --no-install-recommends mdevctl" in tools.calls()
    assert (root / MDEVCTL).exists()
    assert "[mdev_nvidia-108]" in nova_conf(out)
    # Present: never asked again.
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), again(out))
    assert not [c for c in tools.calls()[calls:] if c.startswith("apt-get")]


def test_without_mdevctl_nothing_is_published_and_the_cause_is_said(ctx, root, tools, packages):
    v100_host(root, nova=DALMATIAN)
    driver_ready(root, tools, packages)
    tools.apt_fails("mdevctl")
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(
        "mdevctl is missing and could not be installed (apt-get install mdevctl failed: Unable "
        "to locate package mdevctl): Nova 30 (2024.2 dalmatian) defines mdevs through libvirt, "
        "which runs mdevctl, so every vGPU instance build would fail; make it installable "
        "(universe) or install it, then the mdev types are published")
    assert "subordinate_configuration" not in ours(out)
    assert [c for c in tools.calls() if c.startswith("apt-get")] == [
        "apt-get install --yes --no-install-recommends mdevctl", "apt-get update",
        "apt-get install --yes --no-install-recommends mdevctl"]


def test_before_nova_30_and_for_vfio_no_mdevctl_is_asked_for(ctx, root, tools, packages):
    v100_host(root)  # caracal: Nova 29 creates mdevs through sysfs
    driver_ready(root, tools, packages)
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status.name == "active"
    assert not [c for c in tools.calls() if c.startswith("apt-get")]
    assert not (root / MDEVCTL).exists()


# -- mdevctl that cannot be installed: update-status backs off -----------------------------

MISSING = (
    "mdevctl is missing and could not be installed (apt-get install mdevctl failed: Unable "
    "to locate package mdevctl): Nova 30 (2024.2 dalmatian) defines mdevs through libvirt, "
    "which runs mdevctl, so every vGPU instance build would fail; make it installable "
    "(universe) or install it, then the mdev types are published")
APT_TRIES = ["apt-get install --yes --no-install-recommends mdevctl", "apt-get update",
             "apt-get install --yes --no-install-recommends mdevctl"]
OWNER = "NovaComputeNvidiaVgpuCharm"


def apt_since(tools, calls):
    """The apt-get runs logged after the first ``calls`` calls."""
    return [c for c in tools.calls()[calls:] if c.startswith("apt-get")]


def remembered(out):
    """The failed attempt the charm keeps in its StoredState ({} for none)."""
    return dict(out.get_stored_state("_stored", owner_path=OWNER).content["mdevctl_failed"])


def waiting(failed):
    """MISSING as update-status says it between retries: when it is tried again."""
    retry = time.strftime("%H:%M", time.gmtime(failed["at"] + 3600))
    return f"{MISSING}; tried again at the next config-changed or after {retry} UTC"


def with_failure(out, at, cause="apt-get install mdevctl failed: Unable to locate package "
                                  "mdevctl"):
    """The next hook's state, the last failed attempt remembered as made at ``at``."""
    ours = out.get_stored_state("_stored", owner_path=OWNER)
    content = {**ours.content, "mdevctl_failed": {"at": at, "cause": cause}}
    return testing.State(config=dict(out.config), relations=out.relations,
                         resources=out.resources,
                         stored_states={*(out.stored_states - {ours}),
                                        dataclasses.replace(ours, content=content)})


def failed_mdevctl(ctx, root, tools, packages):
    """config-changed on Nova 30 with apt unable to install mdevctl: blocked, nothing published."""
    v100_host(root, nova=DALMATIAN)
    driver_ready(root, tools, packages)
    tools.apt_fails("mdevctl")
    before = time.time()
    out = ctx.run(ctx.on.config_changed(), state({"vgpu-device-mappings": "{nvidia-108: all}"},
                                                 resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(MISSING)
    assert apt_since(tools, 0) == APT_TRIES
    failed = remembered(out)
    assert failed["cause"] == "apt-get install mdevctl failed: Unable to locate package mdevctl"
    assert before <= failed["at"] <= time.time()
    return out


def test_update_status_runs_no_apt_within_the_hour_after_a_failure(ctx, root, tools, packages):
    out = failed_mdevctl(ctx, root, tools, packages)
    failed = remembered(out)
    for _ in range(2):
        calls = len(tools.calls())
        out = ctx.run(ctx.on.update_status(), again(out))
        assert apt_since(tools, calls) == []
        assert out.unit_status == testing.BlockedStatus(waiting(failed))
        assert "subordinate_configuration" not in ours(out)
        assert remembered(out) == failed  # the attempt that failed, not this hook
    # 59 minutes on: still none.
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), with_failure(out, time.time() - 3540))
    assert apt_since(tools, calls) == []
    assert out.unit_status.name == "blocked"


def test_update_status_tries_again_once_the_last_failure_is_an_hour_old(ctx, root, tools,
                                                                         packages):
    out = failed_mdevctl(ctx, root, tools, packages)
    calls = len(tools.calls())
    old = time.time() - 3660
    out = ctx.run(ctx.on.update_status(), with_failure(out, old, cause="an older cause"))
    assert apt_since(tools, calls) == APT_TRIES
    assert out.unit_status == testing.BlockedStatus(MISSING)  # this attempt's cause
    failed = remembered(out)
    assert failed["at"] > old + 3600
    assert failed["cause"] == "apt-get install mdevctl failed: Unable to locate package mdevctl"
    # The next update-status waits an hour again.
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), again(out))
    assert apt_since(tools, calls) == []
    # Once apt can install it, the hourly retry publishes.
    tools.apt_works("mdevctl")
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), with_failure(out, old))
    assert apt_since(tools, calls) == APT_TRIES[:1]
    assert out.unit_status.name == "active", out.unit_status
    assert "[mdev_nvidia-108]" in nova_conf(out)
    assert remembered(out) == {}


def test_a_clock_set_back_does_not_hold_the_retry_off(ctx, root, tools, packages):
    out = failed_mdevctl(ctx, root, tools, packages)
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), with_failure(out, time.time() + 86400))
    assert apt_since(tools, calls) == APT_TRIES
    assert remembered(out)["at"] <= time.time()


@pytest.mark.parametrize("hook", ["config_changed", "start", "upgrade_charm"])
def test_any_other_hook_after_a_failure_tries_again_at_once(ctx, root, tools, packages, hook):
    out = failed_mdevctl(ctx, root, tools, packages)
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), again(out))
    assert apt_since(tools, calls) == []
    # Still failing: tried all the same, the new attempt remembered.
    calls = len(tools.calls())
    out = ctx.run(getattr(ctx.on, hook)(), again(out))
    assert apt_since(tools, calls) == APT_TRIES
    assert out.unit_status == testing.BlockedStatus(MISSING)
    # The operator fixed the archive: the next such hook installs it and publishes.
    tools.apt_works("mdevctl")
    calls = len(tools.calls())
    out = ctx.run(getattr(ctx.on, hook)(), again(out))
    assert apt_since(tools, calls) == APT_TRIES[:1]
    assert out.unit_status.name == "active", out.unit_status
    assert "[mdev_nvidia-108]" in nova_conf(out)
    assert remembered(out) == {}


def test_mdevctl_installed_by_hand_is_published_by_the_next_update_status(ctx, root, tools,
                                                                          packages):
    out = failed_mdevctl(ctx, root, tools, packages)
    stand_in(root / MDEVCTL, "#!/bin/sh\n")  # the operator installed it
    calls = len(tools.calls())
    out = ctx.run(ctx.on.update_status(), again(out))
    assert apt_since(tools, calls) == []
    assert out.unit_status.name == "active", out.unit_status
    assert "[mdev_nvidia-108]" in nova_conf(out)
    assert remembered(out) == {}
