"""Live-migration readiness (vgpu.livemigration, pure) and the host reading behind it (vgpu.virt)."""

import pytest

from unit_tests.fakehost import FakeHost, live_migration_lines
from vgpu import livemigration, principalconf, virt
from vgpu.livemigration import INSTALLED, RUNNING, UNKNOWN

# virsh -r version --daemon on Ubuntu 24.04 (libvirt tools/virsh-host.c, cmdVersion).
NOBLE = """Compiled against library: libvirt 10.0.0
Using library: libvirt 10.0.0
Using API: QEMU 10.0.0
Running hypervisor: QEMU 8.2.2
Running against daemon: 10.0.0
"""


@pytest.mark.parametrize("value, version", [
    ("10.0.0", (10, 0, 0)), ("8.2.2", (8, 2, 2)), ("1:8.2.2+ds-0ubuntu1.4", (8, 2, 2)),
    ("10.0.0-2ubuntu8.5", (10, 0, 0)), ("1:6.2+dfsg-2ubuntu6.24", (6, 2, 0)),
    ("8.0.0-1ubuntu7.10", (8, 0, 0)), ("", None), ("n/a", None)])
def test_versions_read_as_nova_compares_them(value, version):
    assert livemigration.parse_version(value) == version


def test_virsh_names_the_running_daemon_and_qemu():
    assert livemigration.parse_virsh(NOBLE) == ((10, 0, 0), (8, 2, 2))
    without_daemon = NOBLE.replace("Running against daemon: 10.0.0\n", "")
    assert livemigration.parse_virsh(without_daemon) == (None, (8, 2, 2))
    assert livemigration.parse_virsh("error: failed to connect") == (None, None)


def test_below_libvirt_10_or_qemu_8_2_2_a_live_migratable_spec_stops_nova_compute():
    """nova/virt/libvirt/driver.py (31.0.0, 34.0.0): MIN_VFIO_PCI_VARIANT_* = (10, 0, 0), (8, 2, 2)."""
    ready = livemigration.assess((10, 0, 0), (8, 2, 2), RUNNING, vfio_live_migration=True,
                                 live_migration=True, post_copy=False, frameworks=["vfio"])
    assert ready.ready and ready.blockers == () and livemigration.blocks_publishing(ready) == ()
    jammy = livemigration.assess((8, 0, 0), (6, 2, 0), RUNNING, vfio_live_migration=True,
                                 live_migration=True, post_copy=False, frameworks=["vfio"])
    assert not jammy.ready
    assert livemigration.blocks_publishing(jammy) == (
        "vfio-live-migration not applied: libvirt 8.0.0 (running) is older than 10.0.0; QEMU "
        "6.2.0 (running) is older than 8.2.2, which Nova needs for a live_migratable [pci] "
        "device_spec (nova-compute would not start); upgrade libvirt and QEMU (Ubuntu 24.04 "
        "ships libvirt 10.0.0 and QEMU 8.2.2) or set vfio-live-migration=false; the last "
        "published settings stay",)
    one_short = livemigration.assess((10, 0, 0), (8, 2, 1), INSTALLED, vfio_live_migration=True)
    assert livemigration.blocks_publishing(one_short)[0].startswith(
        "vfio-live-migration not applied: QEMU 8.2.1 (installed) is older than 8.2.2")
    unknown = livemigration.assess(None, None, UNKNOWN, vfio_live_migration=True)
    assert "cannot tell which libvirt and QEMU run here (unknown)" in \
        livemigration.blocks_publishing(unknown)[0]
    # The option off: nothing live_migratable is published, nothing to block.
    off = livemigration.assess(None, None, UNKNOWN, vfio_live_migration=False, frameworks=["vfio"])
    assert livemigration.blocks_publishing(off) == ()
    assert off.blockers[0].startswith("vfio-live-migration is false")


def test_post_copy_and_live_migration_off_are_why_guests_cannot_move():
    ready = livemigration.assess((10, 0, 0), (8, 2, 2), RUNNING, vfio_live_migration=True,
                                 live_migration=True, post_copy=True, frameworks=["vfio"],
                                 principal="compute")
    assert ready.blockers == (
        "vGPU guests will not live-migrate: compute permits post-copy "
        "(live_migration_permit_post_copy), which QEMU refuses for VFIO devices; juju config "
        "compute live-migration-permit-post-copy=false",)
    assert livemigration.blocks_publishing(ready) == ()  # said, never a reason to withhold
    off = livemigration.assess((10, 0, 0), (8, 2, 2), RUNNING, vfio_live_migration=True,
                               live_migration=False, post_copy=False, frameworks=["vfio"])
    assert off.blockers == ("nova-compute has live migration off (enable-live-migration)",)
    assert off.data() == {"libvirt": "10.0.0", "qemu": "8.2.2", "source": "running",
                          "live-migration": "no", "post-copy": "no",
                          "vfio-live-migration": "yes", "ready": "no",
                          "why-not": off.blockers[0]}


def test_mdev_guests_need_nova_29_libvirt_8_6_and_qemu_8_1():
    """nova/virt/libvirt/driver.py: MIN_MDEV_LIVEMIG_LIBVIRT_VERSION (8, 6, 0), _QEMU (8, 1, 0)."""
    ok = livemigration.assess((10, 0, 0), (8, 2, 2), RUNNING, vfio_live_migration=False,
                              live_migration=True, post_copy=False, frameworks=["mdev"],
                              nova_major=29)
    assert ok.ready
    old = livemigration.assess((8, 0, 0), (6, 2, 0), RUNNING, vfio_live_migration=False,
                               live_migration=True, post_copy=False, frameworks=["mdev"],
                               nova_major=28)
    assert old.blockers == (
        "Nova 28 does not live-migrate guests with mediated devices (Nova 29, 2024.1 Caracal, "
        "and later do)",
        "mediated devices live-migrate with libvirt 8.6.0 and QEMU 8.1.0 or later; this host has "
        "libvirt 8.0.0, QEMU 6.2.0")


def test_virt_reads_the_running_versions_then_dpkg_where_libvirtd_does_not_answer(root, tools):
    assert virt.versions() == ((10, 0, 0), (8, 2, 2), RUNNING)
    assert tools.calls()[-1] == "virsh -r version --daemon"
    tools.set_virsh("9.0.0", "8.0.0")
    assert virt.versions() == ((9, 0, 0), (8, 0, 0), RUNNING)
    tools.set_virsh("down")
    assert virt.versions() == (None, None, UNKNOWN)  # no dpkg record either
    FakeHost(root).dpkg_status({"libvirt-daemon-system": "10.0.0-2ubuntu8.5",
                                "qemu-system-x86": "1:8.2.2+ds-0ubuntu1.4"})
    assert virt.versions() == ((10, 0, 0), (8, 2, 2), INSTALLED)


def test_a_libvirtd_that_does_not_answer_is_said_with_virsh_s_reason(root, tools, caplog):
    tools.set_virsh("down")
    with caplog.at_level("WARNING", logger="vgpu.virt"):
        virt.versions()
    (said,) = [r.getMessage() for r in caplog.records if r.name == "vgpu.virt"]
    assert said.startswith("libvirtd does not answer (virsh -r version --daemon ")
    assert said.endswith("); reading the installed versions from dpkg")


def test_virt_reads_nova_computes_live_migration_settings_as_it_renders_them(root):
    host = FakeHost(root)
    host.principal_nova_conf()
    assert virt.nova_settings(principalconf.load()) == (False, False)
    host.principal_nova_conf(libvirt=live_migration_lines())
    assert virt.nova_settings(principalconf.load()) == (True, False)
    host.principal_nova_conf(libvirt=live_migration_lines(post_copy=True))
    assert virt.nova_settings(principalconf.load()) == (True, True)
    (root / "etc/nova/nova-compute.conf").write_text(
        "[libvirt]\nlive_migration_permit_post_copy = false\n")
    assert virt.nova_settings(principalconf.load()) == (True, False)  # the later file wins
    assert virt.nova_settings(None) == (None, None)


@pytest.mark.nova
def test_the_minimums_are_novas_own():
    """The versions the charm blocks below are Nova's (31.0.0 and 34.0.0, make nova-functional)."""
    from nova.virt.libvirt import driver

    assert livemigration.MIN_VFIO_LIBVIRT == driver.MIN_VFIO_PCI_VARIANT_LIBVIRT_VERSION
    assert livemigration.MIN_VFIO_QEMU == driver.MIN_VFIO_PCI_VARIANT_QEMU_VERSION
    assert livemigration.MIN_MDEV_LIBVIRT == driver.MIN_MDEV_LIVEMIG_LIBVIRT_VERSION
    assert livemigration.MIN_MDEV_QEMU == driver.MIN_MDEV_LIVEMIG_QEMU_VERSION


def test_downtime_settings_far_from_what_vgpu_guests_need_warn_and_name_the_options():
    """Issue 40.4: charm-nova-compute's defaults (500/10/75) against Nova's vGPU guide (500000/3/3)."""
    from vgpu import livemigration

    found = livemigration.assess((10, 0, 0), (8, 2, 2), livemigration.RUNNING,
                                 vfio_live_migration=True, live_migration=True,
                                 frameworks=("vfio",), downtime={})
    assert found.ready and found.warnings == (
        "nova-compute's live-migration downtime settings (500/10/75) are far from what vGPU "
        "guests need (500000/3/3, Nova's vGPU guide): a vGPU guest's migration may not converge; "
        "juju config nova-compute live-migration-downtime=500000 live-migration-downtime-steps=3 "
        "live-migration-downtime-delay=3",)
    assert found.data()["warnings"] == found.warnings[0]
    tuned = {"live_migration_downtime": 500000, "live_migration_downtime_steps": 3,
             "live_migration_downtime_delay": 3}
    assert livemigration.assess((10, 0, 0), (8, 2, 2), livemigration.RUNNING,
                                vfio_live_migration=True, live_migration=True,
                                frameworks=("vfio",), downtime=tuned).warnings == ()
    assert livemigration.downtime_warnings({**tuned, "live_migration_downtime_delay": 75})
