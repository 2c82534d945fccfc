"""nova-compute's own pci-passthrough-whitelist and pci-alias beside what the charm publishes.

charm-nova-compute renders its whitelist ahead of the subordinate's sections in the same
[pci], and Nova uses the first device_spec that matches a device. On mdev hosts the
charm publishes no [pci] of its own, but libvirt lists each mdev parent (a GPU, or a VF of
an SR-IOV GPU) as a PCI device too: a whitelist entry matching one makes Nova pass it
through while it gives out vGPUs on it, which the charm refuses.
"""

import json

from nova_functional.base import CharmJudgedTest
from nova_functional.unit import alias_of, flavor_property
from unit_tests.fakehost import MELLANOX, a100_host, l40s_host, v100_host

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


# -- nova-compute's whitelist over a GPU (or VF) whose mdevs the charm gives Nova ------------
V100_C1, V100_E1 = "0000:c1:00.0", "0000:e1:00.0"
V100_ALIAS = '{"device_type": "type-PCI", "name": "v100", "product_id": "1db4", "vendor_id": "10de"}'
A100_VFS = ["0000:41:00.4", "0000:41:00.5"]
A100_ALIAS = '{"device_type": "type-VF", "name": "a100vf", "product_id": "20f1", "vendor_id": "10de"}'
REFUSAL = ("libvirt lists mdev parents as PCI devices, so a passthrough flavor would take the "
           "whole device with the vGPUs on it; leave it out; "
           "change it: juju config nova-compute pci-passthrough-whitelist=...")


class MdevParentWhitelistTest(CharmJudgedTest):
    """Nova passes through a whitelisted mdev parent while it gives out vGPUs on it."""

    def _vgpu(self, listed, address, profile):
        key, value = flavor_property(listed, address, profile).split("=")
        return {key: value}

    def _refused(self, entry: str, what: str, before: dict) -> None:
        """The charm's next hook: blocked naming ``entry`` and the fix, its relation data kept."""
        self.unit.configure()
        status = self.unit.status()
        self.assertEqual("blocked", status.name, status)
        self.assertIn(f"nova-compute's pci-passthrough-whitelist entry {entry} matches {what}",
                      status.message)
        self.assertIn(REFUSAL, status.message)
        self.assertEqual(before, self.unit.published())

    def test_a_whitelisted_v100_is_both_a_vgpu_provider_and_a_passthrough_device(self):
        self.unit.ready(v100_host(self.unit.root))  # two V100s: c1 mapped, e1 spare
        self.unit.configure(vgpu_device_mappings="{nvidia-108: ['c1:00.0']}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed, before = self.unit.action("list-vgpu-types"), self.unit.published()
        # The operator then whitelists the mapped GPU in nova-compute's own options; nova-compute
        # renders it beside the charm's last published sections.
        entry = f'{{"vendor_id": "10de", "product_id": "1db4", "address": "{V100_C1}"}}'
        used = self.publish_and_use(whitelist=entry, aliases=[V100_ALIAS])
        self.assertEqual([entry], used[("pci", "device_spec")])
        self.assertEqual(["nvidia-108"], used[("devices", "enabled_mdev_types")])
        compute = self.start_host()
        # Nova's answers: c1 is a provider of V100-8Q vGPUs and, at once, a PCI device it
        # tracks for passthrough (libvirt lists it as one, Nova does not leave mdev parents out).
        self.assertEqual({"compute1_pci_0000_c1_00_0": {"VGPU": 2}}, self.providers())
        self.assertPCIDeviceCounts("compute1", total=1, free=1)
        self.assertEqual([(V100_C1, "type-PCI")],
                         [(d.address, d.dev_type) for d in self.pci_devices("compute1")])
        # A vGPU server gets an mdev on c1; a passthrough flavor then takes c1 whole, vGPU and
        # all; and a second vGPU server still lands on it: Nova double-books the one GPU.
        first = self.mdevs_of(compute, self.boot(self._vgpu(listed, V100_C1, "nvidia-108")))
        self.assertEqual([(V100_C1, "nvidia-108")], first)
        whole = self.domain_xml(compute, self.boot({"pci_passthrough:alias": "v100:1"}))
        self.assertEqual([(V100_C1, "yes")], [(hostdev_address(h), h.get("managed"))
                                              for h in whole.findall("./devices/hostdev")])
        self.assertPCIDeviceCounts("compute1", total=1, free=0)
        second = self.mdevs_of(compute, self.boot(self._vgpu(listed, V100_C1, "nvidia-108")))
        self.assertEqual([(V100_C1, "nvidia-108")], second)
        self.assertEqual(2, sum(self._get_provider_usages(
            self._get_provider_uuid_by_name("compute1_pci_0000_c1_00_0")).values()))
        # The charm's side: on its next hook it refuses that entry and keeps what it published.
        self._refused(entry, f"GPU {V100_C1}, whose mdevs this unit gives Nova", before)

    def test_a_whitelist_narrowed_to_the_spare_v100_keeps_passthrough_off_the_vgpus(self):
        self.unit.ready(v100_host(self.unit.root))
        self.unit.configure(vgpu_device_mappings="{nvidia-108: ['c1:00.0']}")
        listed = self.unit.action("list-vgpu-types")
        entry = f'{{"vendor_id": "10de", "product_id": "1db4", "address": "{V100_E1}"}}'
        self.unit.host().principal_nova_conf(entry, [V100_ALIAS])
        self.unit.configure()
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        self.publish_and_use(whitelist=entry, aliases=[V100_ALIAS])
        compute = self.start_host()
        self.assertEqual({"compute1_pci_0000_c1_00_0": {"VGPU": 2}}, self.providers())
        self.assertEqual([V100_E1], [d.address for d in self.pci_devices("compute1")])
        whole = self.domain_xml(compute, self.boot({"pci_passthrough:alias": "v100:1"}))
        self.assertEqual([V100_E1], [hostdev_address(h) for h in whole.findall("./devices/hostdev")])
        held = self.mdevs_of(compute, self.boot(self._vgpu(listed, V100_C1, "nvidia-108")))
        self.assertEqual([(V100_C1, "nvidia-108")], held)

    def test_a_whitelisted_a100_vf_is_both_a_vgpu_provider_and_a_passthrough_device(self):
        self.unit.ready(a100_host(self.unit.root))
        self.unit.configure(vgpu_device_mappings="{A100-20C: ['41:00.0']}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed, before = self.unit.action("list-vgpu-types"), self.unit.published()
        entry = f'{{"address": "{A100_VFS[1]}"}}'
        used = self.publish_and_use(whitelist=entry, aliases=[A100_ALIAS])
        self.assertEqual(A100_VFS, used[("mdev_nvidia-475", "device_addresses")])
        compute = self.start_host()
        self.assertEqual({"compute1_pci_0000_41_00_4": {"VGPU": 1},
                          "compute1_pci_0000_41_00_5": {"VGPU": 1}}, self.providers())
        self.assertEqual([(A100_VFS[1], "type-VF")],
                         [(d.address, d.dev_type) for d in self.pci_devices("compute1")])
        # Two vGPU servers take one VF each, .5 among them; the passthrough flavor takes .5 too.
        vgpu = self._vgpu(listed, "0000:41:00.0", "A100-20C")
        held = sorted(self.mdevs_of(compute, self.boot(vgpu)) + self.mdevs_of(compute, self.boot(vgpu)))
        self.assertEqual([(A100_VFS[0], "nvidia-475"), (A100_VFS[1], "nvidia-475")], held)
        whole = self.domain_xml(compute, self.boot({"pci_passthrough:alias": "a100vf:1"}))
        self.assertEqual([A100_VFS[1]], [hostdev_address(h) for h in whole.findall("./devices/hostdev")])
        self._refused(entry, f"VF {A100_VFS[1]} of GPU 0000:41:00.0, whose VFs "
                             f"{A100_VFS[0]}, {A100_VFS[1]} host the mdevs this unit gives Nova", before)
