"""vfio-live-migration where Nova accepts it: live_migratable device specs and libvirt's versions.

Nova 31+ (``nova/virt/libvirt/driver.py``, ``_check_pci_whitelist``, run by
``init_host``) refuses to start nova-compute when a ``[pci] device_spec`` is
``live_migratable`` and the running libvirt is older than 10.0.0 or QEMU older than
8.2.2 (``MIN_VFIO_PCI_VARIANT_LIBVIRT_VERSION``, ``..._QEMU_VERSION``). The harness's
fake libvirt reports the versions a test gives it; the charm reads the same versions
from the stand-in ``virsh`` (``unit_tests/faketools.py``).
"""

import json

from nova import exception
from oslo_utils import versionutils

from nova_functional.base import CharmJudgedTest
from unit_tests.fakehost import l40s_host

MAPPING = "{L40S-12Q: all}"
JAMMY = ("8.0.0", "6.2.0")  # Ubuntu 22.04's libvirt and QEMU
NOBLE = ("10.0.0", "8.2.2")  # Ubuntu 24.04's: Nova's minimum for live_migratable


def as_int(version: str) -> int:
    return versionutils.convert_version_to_int(tuple(int(n) for n in version.split(".")))


class LiveMigratableTest(CharmJudgedTest):

    def setUp(self):
        super().setUp()
        self.unit.ready(l40s_host(self.unit.root))

    def _host_runs(self, libvirt: str, qemu: str):
        """This host's libvirt and QEMU: what virsh tells the charm and fakelibvirt tells Nova."""
        self.unit.tools.set_virsh(libvirt, qemu)
        self.FAKE_LIBVIRT_VERSION, self.FAKE_QEMU_VERSION = as_int(libvirt), as_int(qemu)

    def _specs(self, used) -> list:
        return [json.loads(spec) for spec in used.get(("pci", "device_spec"), [])]

    def test_nova_refuses_a_live_migratable_spec_below_libvirt_10(self):
        """What the charm refuses to publish on such a host stops nova-compute there."""
        self._host_runs(*JAMMY)
        self.unit.configure(vgpu_device_mappings=MAPPING)
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        (one, *_) = [spec for key, spec in self.unit.sections()["pci"] if key == "device_spec"]
        marked = dict(json.loads(one), live_migratable="yes")
        self.publish_and_use(refused=f"[pci]\ndevice_spec = {json.dumps(marked, sort_keys=True)}\n")
        error = self.assertRaises(exception.InvalidConfiguration, self.start_host)
        self.assertIn("live_migratable", str(error))

    def test_the_charm_publishes_live_migratable_only_where_nova_starts_with_it(self):
        self._host_runs(*JAMMY)
        self.unit.configure(vgpu_device_mappings=MAPPING, vfio_live_migration=True)
        self.assertEqual("blocked", self.unit.status().name, self.unit.status())
        self.assertIn("libvirt 8.0.0 (running) is older than 10.0.0", self.unit.status().message)
        used = self.publish_and_use()
        self.assertEqual([], [s for s in self._specs(used) if "live_migratable" in s])
        self.start_host()  # nothing live_migratable: nova-compute starts on the old libvirt
        self.assertPCIDeviceCounts("compute1", total=0, free=0)  # and nothing was published

    def test_at_libvirt_10_and_qemu_8_2_2_nova_starts_with_the_published_specs(self):
        self._host_runs(*NOBLE)
        self.unit.configure(vgpu_device_mappings=MAPPING, vfio_live_migration=True)
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        used = self.publish_and_use()
        specs = self._specs(used)
        self.assertEqual(4, len(specs))
        self.assertEqual({"yes"}, {spec["live_migratable"] for spec in specs})
        self.start_host()
        self.assertPCIDeviceCounts("compute1", total=4, free=4)
