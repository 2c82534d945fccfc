"""nova-compute's own pci-passthrough-whitelist and pci-alias beside what the charm publishes.

charm-nova-compute renders its whitelist ahead of the subordinate's sections in the same
[pci], and Nova uses the first device_spec that matches a device.
"""

import json

from nova_functional.base import CharmJudgedTest
from nova_functional.unit import alias_of, flavor_property
from unit_tests.fakehost import MELLANOX, l40s_host

L40S = "0000:81:00.0"
NIC_ADDRESS = "0000:3b:00.0"
NIC = '{"vendor_id": "15b3", "product_id": "101d"}'
NIC_ALIAS = '{"device_type": "type-PCI", "name": "nic", "product_id": "101d", "vendor_id": "15b3"}'
DEVNAME = '{"devname": "enp59s0f0", "physical_network": "physnet1"}'
VFS = ["0000:81:00.4", "0000:81:00.5", "0000:81:00.6", "0000:81:00.7"]


def hostdev_address(hostdev) -> str:
    source = hostdev.find("./source/address")
    return "{:04x}:{:02x}:{:02x}.{:x}".format(
        *(int(source.get(k), 16) for k in ("domain", "bus", "slot", "function")))


class PrincipalBesideTest(CharmJudgedTest):

    def setUp(self):
        super().setUp()
        host = self.unit.ready(l40s_host(self.unit.root))
        host.add_pci(NIC_ADDRESS, MELLANOX, "0x101d", "0x020000", driver="mlx5_core")
        host.principal_nova_conf(NIC, [NIC_ALIAS])

    def _listed(self):
        listed = self.unit.action("list-vgpu-types")
        return listed, alias_of(listed, "L40S-12Q")

    def test_the_principals_device_and_the_charms_vfs_both_boot(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed, alias = self._listed()
        used = self.publish_and_use(whitelist=NIC, aliases=[NIC_ALIAS, alias])
        self.assertEqual(NIC, used[("pci", "device_spec")][0])  # nova-compute's own comes first
        compute = self.start_host()
        self.assertPCIDeviceCounts("compute1", total=5, free=5)  # the NIC and four VFs
        nic = self.domain_xml(compute, self.boot({"pci_passthrough:alias": "nic:1"}))
        self.assertEqual([(NIC_ADDRESS, "yes")], [(hostdev_address(h), h.get("managed"))
                                                  for h in nic.findall("./devices/hostdev")])
        key, value = flavor_property(listed, L40S, "L40S-12Q").split("=")
        gpu = self.domain_xml(compute, self.boot({key: value}))
        [hostdev] = gpu.findall("./devices/hostdev")
        self.assertIn(hostdev_address(hostdev), VFS)
        self.assertEqual("no", hostdev.get("managed"))

    def test_the_first_matching_spec_wins_so_the_charm_refuses_a_whitelist_over_its_vfs(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}")
        listed, alias = self._listed()
        # The operator whitelists one of the charm's VFs in nova-compute's own option.
        over = '{"vendor_id": "10de", "address": "0000:81:00.4"}'
        used = self.publish_and_use(whitelist=over, aliases=[alias])
        self.assertEqual(over, used[("pci", "device_spec")][0])
        self.start_host()
        # Nova took that VF by the first spec, which leaves it managed by libvirt: a VF of
        # NVIDIA's VFIO framework must not be (managed no); the charm's own spec lost.
        # As the libvirt driver reads it (absent: managed).
        managed = {d.address: d.extra_info.get("managed", "true") for d in self.pci_devices("compute1")}
        self.assertEqual({VFS[0]: "true", VFS[1]: "false", VFS[2]: "false", VFS[3]: "false"}, managed)
        # The charm, on its next hook, names that entry and keeps what it published.
        before = self.unit.published()
        self.unit.configure()
        self.assertEqual("blocked", self.unit.status().name)
        self.assertIn("Nova uses the first spec that matches", self.unit.status().message)
        self.assertEqual(before, self.unit.published())

    def test_a_devname_entry_beside_the_charms_specs_is_accepted_without_reporting(self):
        self.unit.host().principal_nova_conf(DEVNAME)
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        used = self.publish_and_use(whitelist=DEVNAME)
        self.assertEqual(DEVNAME, used[("pci", "device_spec")][0])
        self.assertNotIn(("pci", "report_in_placement"), used)
        self.start_host()  # nova-compute starts: devname is refused only with reporting
        self.assertEqual(VFS, sorted(d.address for d in self.pci_devices("compute1")))
        self.assertEqual({json.loads(s)["address"] for s in used[("pci", "device_spec")][1:]}, set(VFS))
