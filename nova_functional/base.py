"""The test base: Nova's libvirt functional harness configured from the charm's nova.conf.

:class:`CharmJudgedTest` is Nova's own ``VGPUTestBase`` (itself a
``ServersTestBase``: API, conductor, scheduler and Placement in one process
on fakelibvirt) with a :class:`~nova_functional.unit.Unit` beside it. A test
drives the charm, renders nova-compute's nova.conf from what it published,
and :meth:`CharmJudgedTest.use_nova_conf` loads that file with oslo.config
(Nova's own option definitions) and gives each ``[pci]``, ``[devices]``,
``[mdev_*]`` and ``[vgpu_*]`` value the file sets to the harness. Then
nova-compute starts on the fake libvirt host read from the same fixture tree
(:mod:`nova_functional.libvirt_host`).
"""

import os
from pathlib import Path

import fixtures
import nova.conf
from lxml import etree
from nova import objects
from nova.tests.fixtures import libvirt as fakelibvirt_module
from nova.tests.functional.libvirt import test_vgpu
from nova.virt.libvirt import utils as libvirt_utils
from oslo_config import cfg

from nova_functional import libvirt_host
from nova_functional.unit import Unit

CONF = nova.conf.CONF
# Nova's sdist's etc/nova/api-paste.ini (the wheel lacks it); `make nova-functional` fetches it.
API_PASTE = os.environ.get("NOVA_API_PASTE", "")
# nova.conf sections that describe this host's devices: what the charm and the principal
# write; the rest of the principal's nova.conf (message bus, Neutron, Keystone) is the
# deployment's, which the harness replaces with its own fixtures.
DEVICE_GROUPS = ("pci", "devices")
DYNAMIC_PREFIXES = ("mdev_", "vgpu_")


def nova_conf_values(path: Path) -> dict:
    """{(group, option): value} that ``path`` sets in the device sections, as Nova parses it."""
    conf = cfg.ConfigOpts()
    nova.conf.pci.register_opts(conf)
    nova.conf.devices.register_opts(conf)
    conf(args=[], project="nova", default_config_files=[str(path)])
    nova.conf.devices.register_dynamic_opts(conf)
    sections: dict = {}
    cfg.ConfigParser(str(path), sections).parse()
    values = {}
    for group in sections:
        if group not in DEVICE_GROUPS and not group.startswith(DYNAMIC_PREFIXES):
            continue
        for name in conf[group]:
            where = conf.get_location(name, group)
            if where is not None and where.location == cfg.Locations.user:
                values[(group, name)] = conf[group][name]
    return values


class CharmJudgedTest(test_vgpu.VGPUTestBase):
    """Nova's vGPU functional base with the charm's unit and its nova.conf."""

    ADDITIONAL_FILTERS = ["NUMATopologyFilter", "PciPassthroughFilter"]
    microversion = "latest"

    def setUp(self):
        self.unit = Unit(Path(self.useFixture(fixtures.TempDir()).path))
        for name, value in self.unit.environ().items():
            self.useFixture(fixtures.EnvironmentVariable(name, value))
        super().setUp()
        # Nova asks sysfs whether a device_spec address is a PF; the harness forbids the
        # real /sys, so the same question goes to the fixture host's tree.
        self.useFixture(fixtures.MockPatch(
            "nova.pci.utils.is_physical_function",
            side_effect=libvirt_host.is_physical_function(self.unit.root)))
        self.useFixture(fixtures.MockPatch("nova.pci.utils.get_function_by_ifname",
                                           return_value=(None, False)))
        # A VF of NVIDIA's VFIO framework without a vGPU type serves no guest: the fake
        # libvirt refuses to start a domain on one, as QEMU would.
        domain = fakelibvirt_module.Domain
        self.useFixture(fixtures.MonkeyPatch(
            "nova.tests.fixtures.libvirt.Domain.createWithFlags",
            libvirt_host.typed_vfs_only(self.unit.root, domain.createWithFlags)))

    def _setup_services(self):
        self.assertTrue(os.path.isfile(API_PASTE),
                        f"NOVA_API_PASTE={API_PASTE!r}: run through `make nova-functional`")
        self.flags(api_paste_config=API_PASTE, group="wsgi")
        super()._setup_services()

    def _create_mdev(self, dev_name, mdev_type, uuid=None):
        """Nova's fake mdev creation, and the parent's available instances drop as the kernel's do."""
        return self._mdev_made(super()._create_mdev(dev_name, mdev_type, uuid), dev_name, mdev_type)

    def _create_mdev_7_3(self, dev_name, mdev_type, uuid=None):
        """Nova 31's name for the same fake (libvirt 7.3+, persistent mdevs)."""
        return self._mdev_made(super()._create_mdev_7_3(dev_name, mdev_type, uuid), dev_name, mdev_type)

    def _mdev_made(self, uuid, dev_name, mdev_type):
        connection = self.computes[self._current_host].driver._host.get_connection()
        connection.pci_info.devices[dev_name].mdev_created(mdev_type)
        return uuid

    # -- nova.conf -------------------------------------------------------------------
    def use_nova_conf(self, path: Path) -> dict:
        """Give the harness what nova.conf at ``path`` sets for this host's devices."""
        values = nova_conf_values(path)
        for group in DEVICE_GROUPS:  # what the file leaves out is Nova's default again
            for name in CONF[group]:
                if (group, name) not in values:
                    CONF.clear_override(name, group)
        for (group, name), value in sorted(values.items(), key=lambda kv: kv[0][0] != "devices"):
            if group.startswith(DYNAMIC_PREFIXES):
                nova.conf.devices.register_dynamic_opts(CONF)
            self.flags(**{name: value}, group=group)
        return values

    def publish_and_use(self, whitelist=None, aliases=(), refused: str = "") -> dict:
        """nova-compute renders nova.conf from the relation data; the harness takes it.

        ``refused``: nova.conf lines the charm refuses to publish, added at the end of the
        file (oslo.config merges a repeated section), to show what Nova does with them.
        """
        path = self.unit.render_nova_conf(whitelist, aliases)
        if refused:
            path.write_text(path.read_text() + refused)
        return self.use_nova_conf(path)

    # -- the compute ---------------------------------------------------------------
    def start_host(self, hostname="compute1"):
        """nova-compute on a fake libvirt host shaped like the fixture host."""
        hostname = self.start_compute(
            hostname=hostname, pci_info=libvirt_host.pci_info(self.unit.root),
            libvirt_version=self.FAKE_LIBVIRT_VERSION, qemu_version=self.FAKE_QEMU_VERSION)
        return self.computes[hostname]

    def providers(self, hostname="compute1") -> dict:
        """{provider name: inventory} of the compute node's tree, the node itself left out."""
        root = self.compute_rp_uuids[hostname]
        found = {}
        for uuid in self._get_all_rp_uuids_in_a_tree(root):
            if uuid == root:
                continue
            name = self.placement.get(f"/resource_providers/{uuid}").body["name"]
            found[name] = {rc: inv["total"] for rc, inv in self._get_provider_inventory(uuid).items()}
        return found

    def mdevs_of(self, compute, server) -> list:
        """(parent address, mdev type) of each mdev the server holds, as libvirt shows it."""
        instance = self._get_instance(server)
        held = []
        for uuid in compute.driver._get_all_assigned_mediated_devices(instance):
            info = compute.driver._get_mediated_device_information(libvirt_utils.mdev_uuid2name(uuid))
            held.append((self.libvirt2pci_address(info["parent"]), info["type"]))
        return sorted(held)

    def _get_instance(self, server):
        return objects.Instance.get_by_uuid(self.context, server["id"])

    def pci_devices(self, hostname):
        """The PCI devices nova-compute tracks on $hostname."""
        node = objects.ComputeNode.get_by_nodename(self.context, hostname)
        return objects.PciDeviceList.get_by_compute_node(self.context, node.id)

    def assertPCIDeviceCounts(self, hostname, total, free):  # noqa: N802 - Nova's own helper's name
        """As Nova's PCI tests check: $hostname tracks $total devices, $free of them free."""
        devices = self.pci_devices(hostname)
        self.assertEqual(total, len(devices))
        self.assertEqual(free, len([d for d in devices if d.is_available()]))

    def domain_xml(self, compute, server):
        """The libvirt domain of a server, parsed."""
        instance = self._get_instance(server)
        guest = compute.driver._host.get_guest(instance)
        return etree.fromstring(guest.get_xml_desc())

    def boot(self, extra_spec: dict, expected_state="ACTIVE"):
        flavor = self._create_flavor(extra_spec=extra_spec)
        return self._create_server(flavor_id=flavor, networks="none", expected_state=expected_state)
