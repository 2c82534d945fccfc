"""Mediated-device vGPUs (V100-like GPUs) as the charm maps them, judged by nova-compute."""

from nova_functional.base import CharmJudgedTest
from nova_functional.unit import flavor_property
from unit_tests.fakehost import v100_host

GPU_2Q, GPU_8Q = "0000:c1:00.0", "0000:e1:00.0"
MAPPING = "{nvidia-106: ['c1:00.0'], nvidia-108: ['e1:00.0']}"


class MdevTest(CharmJudgedTest):

    def setUp(self):
        super().setUp()
        self.unit.ready(v100_host(self.unit.root, count=3))  # 0000:01:00.0: the mapping leaves it out

    def _check(self, per_profile: bool):
        self.unit.configure(vgpu_device_mappings=MAPPING, mdev_class_per_profile=per_profile)
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        used = self.publish_and_use()
        self.assertEqual(["nvidia-106", "nvidia-108"], used[("devices", "enabled_mdev_types")])
        compute = self.start_host()
        listed = self.unit.action("list-vgpu-types")
        prop_2q = flavor_property(listed, GPU_2Q, "nvidia-106")
        prop_8q = flavor_property(listed, GPU_8Q, "nvidia-108")
        class_2q, class_8q = (p.split(":", 1)[1].split("=")[0] for p in (prop_2q, prop_8q))
        if per_profile:
            self.assertEqual(("CUSTOM_VGPU_V100_2Q", "CUSTOM_VGPU_V100_8Q"), (class_2q, class_8q))
        else:
            self.assertEqual(("VGPU", "VGPU"), (class_2q, class_8q))
        # One provider per mapped GPU, with what NVIDIA's type allows there (V100-2Q: 8,
        # V100-8Q: 2), in the class the flavor asks for; nothing for the spare GPU.
        self.assertEqual({"compute1_pci_0000_c1_00_0": {class_2q: 8},
                          "compute1_pci_0000_e1_00_0": {class_8q: 2}}, self.providers())
        # The docs' flavor (list-vgpu-types' property) gets an mdev of the type mapped to
        # the GPU it lands on; with a class per profile, on that profile's GPU.
        mapped = {(GPU_2Q, "nvidia-106"), (GPU_8Q, "nvidia-108")}
        held = []
        for prop in (prop_8q, prop_2q, prop_8q):
            key, value = prop.split("=")
            held += self.mdevs_of(compute, self.boot({key: value}))
        self.assertEqual(3, len(held))
        self.assertLessEqual(set(held), mapped)
        if per_profile:
            self.assertEqual([(GPU_8Q, "nvidia-108"), (GPU_2Q, "nvidia-106"), (GPU_8Q, "nvidia-108")],
                             held)
        usage = {name: sum(self._get_provider_usages(self._get_provider_uuid_by_name(name)).values())
                 for name in self.providers()}
        self.assertEqual(3, sum(usage.values()))

    def test_two_types_on_two_gpus_as_vgpu_class(self):
        self._check(per_profile=False)

    def test_two_types_on_two_gpus_with_a_class_per_profile(self):
        self._check(per_profile=True)


class TwoMdevVgpusTest(CharmJudgedTest):
    """Two mdev vGPUs in one server by resource groups: Nova 33 and later (issue 37)."""

    def setUp(self):
        super().setUp()
        self.unit.ready(v100_host(self.unit.root, count=2))

    def test_a_full_framebuffer_type_on_two_gpus_gives_one_server_two(self):
        from nova_functional.unit import NOVA_VERSION

        self.unit.configure(vgpu_device_mappings="{V100-16Q: all}")
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed = self.unit.action("list-vgpu-types")
        entry = listed["gpus"]["gpu-0"]["types"]["nvidia-109"]
        if int(NOVA_VERSION.split(".")[0]) < 33:  # one mdev vGPU per instance before Nova 33
            self.assertEqual("1", entry["max-per-instance"])
            self.assertNotIn("flavor-property-for-two", entry)
            return
        self.assertEqual("2", entry["max-per-instance"])
        spec = dict(pair.split("=") for pair in entry["flavor-property-for-two"].split())
        self.assertEqual({"resources1:VGPU": "1", "resources2:VGPU": "1",
                          "group_policy": "isolate"}, spec)
        self.publish_and_use()
        compute = self.start_host()
        held = self.mdevs_of(compute, self.boot(spec))
        self.assertEqual([("0000:c1:00.0", "nvidia-109"), ("0000:e1:00.0", "nvidia-109")], held)
