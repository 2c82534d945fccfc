"""VFs on NVIDIA's vendor-specific VFIO framework (L40S-like) as the charm publishes them."""

import json

from nova_functional.base import CharmJudgedTest
from nova_functional.unit import alias_of, flavor_property
from unit_tests.fakehost import l40s_host

L40S, H200 = "0000:81:00.0", "0000:c1:00.0"
# The first four VFs of the L40S: 48 GB hold four L40S-12Q.
VFS = ["0000:81:00.4", "0000:81:00.5", "0000:81:00.6", "0000:81:00.7"]


class VfioTest(CharmJudgedTest):

    def setUp(self):
        super().setUp()
        self.unit.ready(l40s_host(self.unit.root))

    def _publish(self, pci_in_placement: bool):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}", pci_in_placement=pci_in_placement)
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed = self.unit.action("list-vgpu-types")
        alias = alias_of(listed, "L40S-12Q")
        # The operator pastes the alias into nova-compute's pci-alias (and
        # nova-cloud-controller's); nova-compute renders it into its own [pci].
        used = self.publish_and_use(aliases=[alias])
        specs = [json.loads(spec) for spec in used[("pci", "device_spec")]]
        self.assertEqual(VFS, [spec["address"] for spec in specs])
        self.assertEqual({"no"}, {spec["managed"] for spec in specs})
        self.assertEqual([alias], used[("pci", "alias")])
        return listed, alias

    def _boot_and_check(self, compute, listed):
        key, value = flavor_property(listed, L40S, "L40S-12Q").split("=")
        self.assertEqual("pci_passthrough:alias", key)
        server = self.boot({key: value})
        hostdevs = self.domain_xml(compute, server).findall("./devices/hostdev")
        self.assertEqual(1, len(hostdevs))
        self.assertEqual(("pci", "no"), (hostdevs[0].get("type"), hostdevs[0].get("managed")))
        source = hostdevs[0].find("./source/address")
        address = "{:04x}:{:02x}:{:02x}.{:x}".format(
            *(int(source.get(k), 16) for k in ("domain", "bus", "slot", "function")))
        self.assertIn(address, VFS)
        return server

    def test_vfs_boot_as_unmanaged_hostdevs_by_the_listed_alias(self):
        listed, alias = self._publish(pci_in_placement=False)
        self.assertNotIn("resource_class", json.loads(alias))  # by ids: Nova 32+ needs them
        compute = self.start_host()
        self.assertEqual({}, self.providers())  # not reported: no PCI providers
        self.assertPCIDeviceCounts("compute1", total=4, free=4)  # only the published VFs
        self._boot_and_check(compute, listed)
        self.assertPCIDeviceCounts("compute1", total=4, free=3)

    def test_with_pci_in_placement_each_gpu_is_a_provider_of_its_profile_class(self):
        listed, alias = self._publish(pci_in_placement=True)
        self.assertEqual("CUSTOM_VGPU_L40S_12Q", json.loads(alias)["resource_class"])
        # The scheduler side: nova-cloud-controller's [filter_scheduler] pci_in_placement.
        self.flags(pci_in_placement=True, group="filter_scheduler")
        compute = self.start_host()
        provider = f"compute1_{L40S.upper()}"
        self.assertEqual({provider: {"CUSTOM_VGPU_L40S_12Q": 4}}, self.providers())
        self.assertPCIDeviceCounts("compute1", total=4, free=4)
        self._boot_and_check(compute, listed)
        usage = self._get_provider_usages(self._get_provider_uuid_by_name(provider))
        self.assertEqual({"CUSTOM_VGPU_L40S_12Q": 1}, usage)


class TwoVfioVgpusTest(CharmJudgedTest):
    """Two VFIO vGPUs in one server, by the flavor list-vgpu-types gives for two (issue 37)."""

    def setUp(self):
        super().setUp()
        host = self.unit.ready(l40s_host(self.unit.root))
        # The L40S says Fractional Multi-vGPU: Supported in nvidia-smi -q (vGPU 16+).
        host.install_nvidia_smi({L40S: "Disabled", H200: "Disabled"})
        host.set_mig(L40S, fractional="Supported")

    def test_a_server_boots_with_two_vfs_by_the_alias_count(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed = self.unit.action("list-vgpu-types")
        entry = next(e for g in listed["gpus"].values() if L40S in g["addresses"]
                     for e in g["types"].values() if e["name"].endswith("L40S-12Q"))
        self.assertEqual("4", entry["max-per-instance"])
        key, value = entry["flavor-property-for-two"].split("=")
        self.assertEqual(("pci_passthrough:alias", "vgpu-l40s-12q:2"), (key, value))
        self.publish_and_use(aliases=[alias_of(listed, "L40S-12Q")])
        compute = self.start_host()
        server = self.boot({key: value})
        hostdevs = self.domain_xml(compute, server).findall("./devices/hostdev")
        self.assertEqual(2, len(hostdevs))
        addresses = {"{:04x}:{:02x}:{:02x}.{:x}".format(*(int(h.find("./source/address").get(k), 16)
                                                         for k in ("domain", "bus", "slot",
                                                                   "function")))
                     for h in hostdevs}
        self.assertLessEqual(addresses, set(VFS))
        self.assertEqual(2, len(addresses))
        self.assertPCIDeviceCounts("compute1", total=4, free=2)


class WholeGpuTest(CharmJudgedTest):
    """A GPU given whole beside an L40S split into vGPUs (issue 37): both by their aliases."""

    def setUp(self):
        super().setUp()
        from unit_tests.fakehost import whole_and_vgpu_host

        self.unit.ready(whole_and_vgpu_host(self.unit.root))

    def test_the_whole_gpu_and_a_vgpu_boot_each_by_its_own_alias(self):
        self.unit.configure(vgpu_device_mappings="{L40S-12Q: all, passthrough: [c1:00.0]}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed = self.unit.action("list-vgpu-types")
        whole = next(g for g in listed["gpus"].values() if g["addresses"] == H200)
        self.assertEqual("type-PF", whole["device-type"])
        used = self.publish_and_use(aliases=[whole["pci-alias"], alias_of(listed, "L40S-12Q")])
        specs = [json.loads(spec) for spec in used[("pci", "device_spec")]]
        self.assertEqual(VFS + [H200], [spec["address"] for spec in specs])
        compute = self.start_host()
        self.assertPCIDeviceCounts("compute1", total=5, free=5)
        key, value = whole["flavor-property"].split("=")
        server = self.boot({key: value})
        source = self.domain_xml(compute, server).find("./devices/hostdev/source/address")
        self.assertEqual("0xc1", source.get("bus"))
        self.assertPCIDeviceCounts("compute1", total=5, free=4)
        # The vGPU alias (same vendor, another product id here; type-VF) takes a VF, and a
        # second whole-GPU server finds none: the alias never reaches the L40S's VFs.
        key, value = flavor_property(listed, L40S, "L40S-12Q").split("=")
        self.boot({key: value})
        key, value = whole["flavor-property"].split("=")
        self.boot({key: value}, expected_state="ERROR")
        self.assertPCIDeviceCounts("compute1", total=5, free=3)
