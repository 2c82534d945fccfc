"""What the charm refuses because Nova would: Nova refuses it in the harness, the charm never publishes it.

Each Nova-side test starts from the nova.conf nova-compute renders from what the charm
did publish; where the charm cannot be made to publish the refused setting (that is the
point), the lines it refuses are added at the end of that file, in the charm's own form.
"""

import json

from nova import exception

from nova_functional.base import CharmJudgedTest
from unit_tests.fakehost import MELLANOX, V100_TYPES, h200_sxm_host, l40s_host, v100_host

NIC = '{"address": "0000:3b:00.0", "physical_network": "physnet1"}'
DEVNAME = '{"devname": "enp59s0f0", "physical_network": "physnet1"}'
H200 = "0000:18:00.0"
A, B = "0000:18:00.4", "0000:18:00.5"  # two VFs of one H200
VMD_GPU = "10000:01:00.0"  # a GPU behind Intel VMD: PCI domain above ffff


def pci_pairs(unit) -> list:
    return unit.sections().get("pci", [])


def specs(unit) -> list:
    return [json.loads(value) for key, value in pci_pairs(unit) if key == "device_spec"]


def reporting(unit) -> bool:
    return ["report_in_placement", "True"] in pci_pairs(unit)


class TwoClassesOnOnePfTest(CharmJudgedTest):

    def setUp(self):
        super().setUp()
        self.unit.ready(h200_sxm_host(self.unit.root, vfs=4, mig="Enabled"))

    def test_nova_refuses_two_resource_classes_on_one_pf(self):
        self.unit.configure(vgpu_device_mappings=f"{{H200X-3-71C: ['{A}']}}", pci_in_placement=True)
        (one,) = specs(self.unit)
        other = dict(one, address=B, resource_class="CUSTOM_VGPU_H200X_4_71C")
        self.publish_and_use(refused=f"[pci]\ndevice_spec = {json.dumps(other, sort_keys=True)}\n")
        error = self.assertRaises(exception.PlacementPciMixedResourceClassException, self.start_host)
        self.assertIn("VFs from the same PF cannot be configured with different 'resource_class'",
                      str(error))

    def test_the_charm_never_publishes_two_classes_on_one_pf(self):
        # Two MIG-backed profiles fit one H200 side by side (3g and 4g instances); with
        # reporting on, Nova refuses their two classes under one PF (issue 19).
        self.unit.configure(vgpu_device_mappings=f"{{H200X-3-71C: ['{A}'], H200X-4-71C: ['{B}']}}",
                            pci_in_placement=True)
        classes = {}
        for spec in specs(self.unit):
            classes.setdefault(spec["address"][:-4], set()).add(spec["resource_class"])
        self.assertEqual([], [pf for pf, found in classes.items() if len(found) > 1],
                         f"published: {specs(self.unit)}; status: {self.unit.status()}")
        self.assertEqual("blocked", self.unit.status().name, self.unit.status())


class VfioHostTest(CharmJudgedTest):
    """An L40S and an H200 on the VFIO framework, and a ConnectX NIC of nova-compute's own."""

    def setUp(self):
        super().setUp()
        host = self.unit.ready(l40s_host(self.unit.root))
        host.add_pci("0000:3b:00.0", MELLANOX, "0x101d", "0x020000", driver="mlx5_core")
        host.principal_nova_conf(NIC)

    def test_nova_refuses_a_devname_spec_with_reporting_on(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}", pci_in_placement=True)
        self.assertTrue(reporting(self.unit))
        # The operator then names the NIC by devname in nova-compute's own option.
        used = self.publish_and_use(whitelist=DEVNAME)
        self.assertEqual(DEVNAME, used[("pci", "device_spec")][0])
        error = self.assertRaises(exception.PlacementPciException, self.start_host)
        self.assertIn("does not support 'devname' based device specification", str(error))

    def test_the_charm_never_publishes_reporting_beside_a_devname_spec(self):
        self.unit.host().principal_nova_conf(DEVNAME)  # nova-compute's option says devname
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}", pci_in_placement=True)
        self.assertEqual("blocked", self.unit.status().name)
        self.assertIn("devname", self.unit.status().message)
        self.assertFalse(reporting(self.unit), pci_pairs(self.unit))

    def test_nova_refuses_reporting_turned_off_after_on(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}", pci_in_placement=False)
        never_reported = self.unit.render_nova_conf(NIC).read_text()
        self.unit.configure(pci_in_placement=True)
        self.publish_and_use(whitelist=NIC)
        self.start_host()
        self.assertEqual({"compute1_0000:81:00.0": {"CUSTOM_VGPU_L40S_12Q": 4}}, self.providers())
        # nova-compute restarted on the nova.conf without reporting: Nova stops it.
        path = self.unit.root / "etc/nova/nova.conf"
        path.write_text(never_reported)
        self.assertEqual(False, self.use_nova_conf(path).get(("pci", "report_in_placement"), False))
        error = self.assertRaises(exception.PlacementPciException, self.restart_compute_service,
                                  hostname="compute1", keep_hypervisor_state=False,
                                  pci_info=self.computes["compute1"].driver._host.get_connection().pci_info)
        self.assertIn("it was enabled before on this compute", str(error))

    def test_nova_refuses_a_device_spec_with_a_domain_above_ffff(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}")
        vmd = dict(specs(self.unit)[0], address="10000:81:00.4")  # the charm's spec, behind VMD
        self.publish_and_use(whitelist=NIC,
                             refused=f"[pci]\ndevice_spec = {json.dumps(vmd, sort_keys=True)}\n")
        error = self.assertRaises(exception.PciConfigInvalidSpec, self.start_host)
        self.assertIn("10000", str(error))

    def test_the_charm_never_turns_reporting_off_once_on(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}", pci_in_placement=True)
        self.assertTrue(reporting(self.unit))
        self.unit.configure(pci_in_placement=False)
        self.assertTrue(reporting(self.unit), "turned off: reporting must stay published")
        self.unit.configure(vgpu_device_mappings="")
        self.assertTrue(reporting(self.unit), "mapping cleared: reporting must stay published")
        # The relation removed and made again: its data starts empty; the unit remembers (issue 20).
        self.unit.new_relation()
        self.assertTrue(reporting(self.unit), "relation re-created: reporting must stay published")


class DomainAboveFfffTest(CharmJudgedTest):

    def setUp(self):
        super().setUp()
        host = self.unit.ready(v100_host(self.unit.root))
        host.add_gpu(VMD_GPU, mdev_types=V100_TYPES)

    def test_nova_refuses_a_gpu_address_with_a_domain_above_ffff(self):
        self.unit.configure(vgpu_device_mappings="{nvidia-108: ['c1:00.0']}")
        self.publish_and_use(refused=f"[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0,{VMD_GPU}\n")
        # Nova 34 wraps the address error in its mdev config error; either names the address.
        error = self.assertRaises(
            (exception.InvalidLibvirtMdevConfig, exception.PciDeviceWrongAddressFormat), self.start_host)
        self.assertIn(VMD_GPU, str(error))

    def test_the_charm_never_publishes_a_domain_above_ffff(self):
        self.unit.configure(vgpu_device_mappings=f"{{nvidia-108: ['c1:00.0', '{VMD_GPU}']}}")
        published = json.dumps(self.unit.published())
        self.assertNotIn(VMD_GPU, published)
        self.assertEqual("blocked", self.unit.status().name, self.unit.status())
