"""A MIG-backed profile on one GPU (H200 SXM-like, VFIO framework): one class on one PF.

MIG mode comes from the stand-in nvidia-smi (``unit_tests/faketools.py``) and the GPU
instances from the fixture's kernel model, as in the unit tests.
"""

import json

from nova_functional.base import CharmJudgedTest
from nova_functional.unit import alias_of, flavor_property
from unit_tests.fakehost import h200_sxm_host

GPU, OTHER = "0000:18:00.0", "0000:2a:00.0"
PROFILE, CLASS = "H200X-1-18C", "CUSTOM_VGPU_H200X_1_18C"


class MigTest(CharmJudgedTest):

    def test_a_mig_backed_profile_is_one_class_on_one_pf_and_boots_by_its_alias(self):
        self.unit.ready(h200_sxm_host(self.unit.root, mig="Enabled"))
        self.unit.configure(vgpu_device_mappings=f"{{{PROFILE}: ['18:00.0']}}", pci_in_placement=True)
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed = self.unit.action("list-vgpu-types")
        alias = alias_of(listed, PROFILE)
        used = self.publish_and_use(aliases=[alias])
        specs = [json.loads(spec) for spec in used[("pci", "device_spec")]]
        # 1g.18gb GPU instances: seven on an H200, one VF each (eight VFs enabled).
        self.assertEqual(7, len(specs))
        self.assertEqual({GPU[:-4]}, {spec["address"][:-4] for spec in specs})
        self.assertEqual({CLASS}, {spec["resource_class"] for spec in specs})
        self.flags(pci_in_placement=True, group="filter_scheduler")
        compute = self.start_host()
        self.assertEqual({f"compute1_{GPU.upper()}": {CLASS: 7}}, self.providers())
        key, value = flavor_property(listed, GPU, PROFILE).split("=")
        server = self.boot({key: value})
        hostdev = self.domain_xml(compute, server).find("./devices/hostdev")
        self.assertEqual("no", hostdev.get("managed"))
        usage = self._get_provider_usages(self._get_provider_uuid_by_name(f"compute1_{GPU.upper()}"))
        self.assertEqual({CLASS: 1}, usage)
