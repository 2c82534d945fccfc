"""An SR-IOV GPU with mdev types on its VFs (A100-like): one vGPU per VF, as many VFs as fit."""

from nova_functional.base import CharmJudgedTest
from nova_functional.unit import flavor_property
from unit_tests.fakehost import a100_host

A100 = "0000:41:00.0"


class SriovMdevTest(CharmJudgedTest):

    def setUp(self):
        super().setUp()
        # Each VF's types offer one instance while it is free (a VF holds one vGPU).
        self.unit.ready(a100_host(self.unit.root))

    def test_each_published_vf_is_a_provider_of_one_vgpu_and_only_as_many_as_fit(self):
        self.unit.configure(vgpu_device_mappings="{A100-20C: ['41:00.0']}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        used = self.publish_and_use()
        self.assertEqual(["0000:41:00.4", "0000:41:00.5"], used[("mdev_nvidia-475", "device_addresses")])
        compute = self.start_host()
        # 40 GB hold two A100-20C: two VFs, one vGPU each; the GPU's other 14 VFs get nothing.
        self.assertEqual({"compute1_pci_0000_41_00_4": {"VGPU": 1},
                          "compute1_pci_0000_41_00_5": {"VGPU": 1}}, self.providers())
        key, value = flavor_property(self.unit.action("list-vgpu-types"), A100, "A100-20C").split("=")
        held = [self.mdevs_of(compute, self.boot({key: value})) for _ in range(2)]
        self.assertEqual([[("0000:41:00.4", "nvidia-475")], [("0000:41:00.5", "nvidia-475")]],
                         sorted(held))
        self.boot({key: value}, expected_state="ERROR")  # a third does not fit: no valid host
