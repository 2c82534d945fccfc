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

    def _served_then_rebooted(self):
        """H200X-1-18C on one H200, published; then a reboot: VFs, types, MIG mode, instances gone."""
        host = self.unit.ready(h200_sxm_host(self.unit.root, mig="Enabled"))
        self.unit.configure(vgpu_device_mappings=f"{{{PROFILE}: ['18:00.0']}}", pci_in_placement=True)
        self.assertEqual("active", self.unit.status().name, self.unit.status())
        listed = self.unit.action("list-vgpu-types")
        self.publish_and_use(aliases=[alias_of(listed, PROFILE)])
        self.flags(pci_in_placement=True, group="filter_scheduler")
        host.reboot()  # Hopper: MIG mode lost too (NVIDIA/gpu-admin-tools#2)
        return host, listed

    def _vf_of(self, compute, server) -> str:
        source = self.domain_xml(compute, server).find("./devices/hostdev/source/address")
        return "{:04x}:{:02x}:{:02x}.{:x}".format(
            *(int(source.get(k), 16) for k in ("domain", "bus", "slot", "function")))

    def test_after_a_reboot_and_the_boot_step_a_server_gets_a_vf_that_holds_the_mapped_type(self):
        from vgpu import boot

        host, listed = self._served_then_rebooted()
        self.assertEqual(0, boot.run(f"/{boot.DATA_FILE}"))  # what systemd runs
        self.assertEqual("Enabled", host.mig_mode(GPU)["current"])
        compute = self.start_host()
        key, value = flavor_property(listed, GPU, PROFILE).split("=")
        server = self.boot({key: value})
        held = self.unit.root / "sys/bus/pci/devices" / self._vf_of(compute, server) / "nvidia"
        self.assertEqual("1414", (held / "current_vgpu_type").read_text().strip())  # H200X-1-18C
        self.assertTrue((held / "gpu_instance_id").read_text().strip().isdigit())

    def test_a_vf_without_its_type_serves_no_server(self):
        """The check above can fail: VFs back (sriov-manage) but no boot step, no type."""
        from vgpu import sriov

        _, listed = self._served_then_rebooted()
        self.assertEqual({}, sriov.enable([GPU, OTHER]))
        self.start_host()
        key, value = flavor_property(listed, GPU, PROFILE).split("=")
        server = self.boot({key: value}, expected_state="ERROR")
        self.assertIn("Exceeded maximum number of retries", server["fault"]["message"])
        self.assertIn("(the VF holds no vGPU type)", self.stdlog.logger.output)
