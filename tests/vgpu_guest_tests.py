"""Functional tests with guests: nova.conf, Placement, a vGPU instance, vgpu-usage.

They run after tests.vgpu_tests on the same model (see tests/README.md) and
cover both NVIDIA frameworks, chosen from what list-vgpu-types reports for
the GPU host:

* mediated devices: the mapping test_200 of vgpu_tests leaves in place; the
  flavor asks for ``resources:VGPU=1``;
* vendor-specific VFIO (Ada, Hopper, Blackwell on Ubuntu 24.04 with Nova
  2025.1+): the first type of gpu-0 is mapped to that GPU; nova.conf must get
  one ``[pci] device_spec`` per VF that holds the type; the flavor asks for
  the VF through a ``[pci] alias`` set on nova-cloud-controller and
  nova-compute.

Booting needs an image (the configure step adds CirrOS) but no network:
the instance is created with ``--nic none``; the guest needs no NVIDIA
driver for the hypervisor to give it the vGPU.
"""

import json
import logging
import re
import time

import zaza.model
import zaza.openstack.charm_tests.test_utils as test_utils
import zaza.openstack.utilities.openstack as openstack_utils
from novaclient import client as nova_client

from tests.vgpu_tests import APP, OPTION, read_nova_conf, run, wait_for_unit_status

CIRROS = 'cirros'
FLAVOR = 'vgpu-functional-test'
SERVER = 'vgpu-functional-test'
ALIAS = 'vgpu-functional-test'
BOOT_TIMEOUT = 900
PLACEMENT_HEADERS = {'OpenStack-API-Version': 'placement 1.10'}


# -- pure helpers (unit-tested in unit_tests/test_functional_tests.py) ----------------------

def pci_device_specs(nova_conf_text):
    """The JSON objects of every ``device_spec`` (or ``passthrough_whitelist``) in ``[pci]``.

    oslo.config merges repeated ``[pci]`` sections and accumulates the
    multi-valued option, which ConfigParser cannot do: read the lines.
    """
    specs = []
    section = None
    for line in nova_conf_text.splitlines():
        stripped = line.strip()
        if stripped.startswith('[') and stripped.endswith(']'):
            section = stripped[1:-1].strip()
            continue
        if section != 'pci' or '=' not in stripped or stripped.startswith('#'):
            continue
        key, _, value = stripped.partition('=')
        if key.strip() in ('device_spec', 'passthrough_whitelist'):
            specs.append(json.loads(value.strip()))
    return specs


def pci_option(nova_conf_text, name):
    """The last value of ``name`` in any ``[pci]`` section, or None."""
    found = None
    section = None
    for line in nova_conf_text.splitlines():
        stripped = line.strip()
        if stripped.startswith('[') and stripped.endswith(']'):
            section = stripped[1:-1].strip()
        elif section == 'pci' and '=' in stripped and not stripped.startswith('#'):
            key, _, value = stripped.partition('=')
            if key.strip() == name:
                found = value.strip()
    return found


def resource_class(profile):
    """``L40S-12Q`` -> ``CUSTOM_VGPU_L40S_12Q``, normalised the way Nova does."""
    return 'CUSTOM_VGPU_' + re.sub(r'[^A-Z0-9]', '_', profile.upper())


def profile_name(type_name):
    """``NVIDIA L40S-12Q`` -> ``L40S-12Q``."""
    return type_name.split()[-1]


class VgpuGuestTest(test_utils.OpenStackBaseTest):
    """[pci] entries, Placement inventory, a vGPU instance and vgpu-usage."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass(application_name=APP)
        cls.keystone_session = openstack_utils.get_overcloud_keystone_session()
        # 2.37: servers may be created without a network (nics='none').
        cls.nova = nova_client.Client('2.37', session=cls.keystone_session)
        cls.glance = openstack_utils.get_glance_session_client(cls.keystone_session)
        cls.unit = cls.gpu_unit_name()
        cls.gpu = cls.action(cls.unit, 'list-vgpu-types')['gpus']['gpu-0']
        cls.gpu_address = cls.gpu['addresses'].split(',')[0]  # the entry names each like GPU
        types = cls.gpu.get('types')
        if not isinstance(types, dict) or not types:
            raise AssertionError('{}: gpu-0 offers no vGPU types: {}'.format(cls.unit, types))
        cls.vgpu_type = sorted(types.values(), key=lambda t: int(t['id'].split('-')[1]))[0]
        cls.framework = cls.vgpu_type['framework']
        logging.info('%s: gpu-0 %s (%s), type %s %s', cls.unit, cls.gpu_address,
                     cls.framework, cls.vgpu_type['id'], cls.vgpu_type['name'])

    @classmethod
    def tearDownClass(cls):
        for server in cls.nova.servers.list(search_opts={'name': SERVER}):
            server.delete()
        zaza.model.reset_application_config(APP, [OPTION], model_name=cls.model_name)
        for flavor in cls.nova.flavors.list():
            if flavor.name == FLAVOR:
                flavor.delete()

    @classmethod
    def gpu_unit_name(cls):
        for unit in zaza.model.get_units(APP, model_name=cls.model_name):
            gpus = cls.action(unit.entity_id, 'list-vgpu-types').get('gpus') or {}
            if gpus:
                return unit.entity_id
        raise AssertionError('no unit of {} reports an NVIDIA GPU'.format(APP))

    @classmethod
    def action(cls, unit, name, **params):
        result = zaza.model.run_action(unit, name, action_params=params,
                                       model_name=cls.model_name, raise_on_failure=True)
        return result.data['results']

    # -- helpers ----------------------------------------------------------------------------
    def require_vfio(self):
        if self.framework != 'vfio':
            self.skipTest('gpu-0 uses mediated devices: the VFIO checks need an Ada, Hopper '
                          'or Blackwell GPU on Ubuntu 24.04 with vGPU 17+')

    def map_vfio_type(self):
        """Map gpu-0 to its first type; return the VFs nova.conf must list.

        pci-in-placement goes on with it (test_200 reads Placement's inventory);
        Nova keeps reporting on this host from then on, whatever the option says.
        """
        self.require_vfio()
        zaza.model.set_application_config(
            APP, {OPTION: json.dumps({self.vgpu_type['id']: [self.gpu_address]}),
                  'pci-in-placement': 'true'},
            model_name=self.model_name)
        zaza.model.block_until_all_units_idle(model_name=self.model_name)
        wait_for_unit_status(self.unit, 'active', re.escape(self.vgpu_type['id']),
                             self.model_name)
        number = self.vgpu_type['id'].split('-')[1]
        vfs = [a for a in self.gpu.get('virtual-functions', '').split(',') if a]
        held = [vf for vf in vfs if run(self.unit, 'cat /sys/bus/pci/devices/{}/nvidia/'
                                        'current_vgpu_type'.format(vf),
                                        self.model_name)[1].strip() == number]
        self.assertTrue(held, 'no VF of {} holds {}'.format(self.gpu_address, number))
        return held

    def map_mdev_type(self):
        """Map gpu-0's first type to gpu-0, or to its first VF on SR-IOV GPUs."""
        vfs = [a for a in self.gpu.get('virtual-functions', '').split(',') if a]
        address = vfs[0] if 'virtual-functions' in self.gpu and vfs else self.gpu_address
        zaza.model.set_application_config(
            APP, {OPTION: json.dumps({self.vgpu_type['id']: [address]})},
            model_name=self.model_name)
        zaza.model.block_until_all_units_idle(model_name=self.model_name)
        wait_for_unit_status(self.unit, 'active',
                             re.escape('{} on 1'.format(self.vgpu_type['id'])), self.model_name)
        return address

    def wait_for_server(self, server, status='ACTIVE'):
        deadline = time.time() + BOOT_TIMEOUT
        while True:
            server = self.nova.servers.get(server.id)
            if server.status == status:
                return server
            if server.status == 'ERROR' or time.time() > deadline:
                self.fail('{} is {}, not {}: {}'.format(server.id, server.status, status,
                                                        getattr(server, 'fault', '')))
            time.sleep(10)

    def vf_device_id(self, vf):
        code, out = run(self.unit, 'cat /sys/bus/pci/devices/{}/device'.format(vf),
                        self.model_name)
        self.assertEqual(code, 0)
        return out.strip().lower().replace('0x', '')

    def placement(self, path):
        response = self.keystone_session.get(
            path, endpoint_filter={'service_type': 'placement', 'interface': 'public'},
            headers=PLACEMENT_HEADERS)
        response.raise_for_status()
        return response.json()

    def inventories(self):
        """{(provider name, resource class): total} for this host's providers."""
        host = run(self.unit, 'hostname', self.model_name)[1].strip().split('.')[0]
        out = {}
        for provider in self.placement('/resource_providers')['resource_providers']:
            if not provider['name'].startswith(host):
                continue
            found = self.placement('/resource_providers/{}/inventories'.format(provider['uuid']))
            for klass, inventory in found['inventories'].items():
                out[(provider['name'], klass)] = inventory['total']
        return out

    def flavor(self, extra_specs):
        for old in self.nova.flavors.list():
            if old.name == FLAVOR:
                old.delete()
        flavor = self.nova.flavors.create(FLAVOR, ram=512, vcpus=1, disk=1)
        flavor.set_keys(extra_specs)
        return flavor

    # -- tests --------------------------------------------------------------------------------
    def test_100_pci_entries_in_nova_conf(self):
        """Each VF holding the type is one [pci] device_spec with managed: no."""
        held = self.map_vfio_type()
        klass = resource_class(profile_name(self.vgpu_type['name']))
        deadline = time.time() + 600
        while True:
            text, _ = read_nova_conf(self.unit, self.model_name)
            ours = [s for s in pci_device_specs(text) if s.get('resource_class') == klass]
            if sorted(s.get('address') for s in ours) == sorted(held) or time.time() > deadline:
                break
            time.sleep(15)
        self.assertEqual(sorted(s.get('address') for s in ours), sorted(held))
        for spec in ours:
            self.assertEqual(spec.get('vendor_id'), '10de')
            self.assertEqual(spec.get('product_id'), self.vf_device_id(spec['address']))
            self.assertIn(str(spec.get('managed')).lower(), ('no', 'false'))
        self.assertEqual(str(pci_option(text, 'report_in_placement')).lower(), 'true')

    def test_200_placement_inventory(self):
        """Placement offers the vGPUs: VGPU per mdev parent, the profile's class per VFIO GPU."""
        if self.framework == 'vfio':
            held = self.map_vfio_type()
            klass, expected = resource_class(profile_name(self.vgpu_type['name'])), len(held)
        else:
            self.map_mdev_type()
            klass, expected = 'VGPU', 1
        deadline = time.time() + 600
        while True:
            totals = {k: v for k, v in self.inventories().items() if k[1] == klass}
            if sum(totals.values()) >= expected or time.time() > deadline:
                break
            time.sleep(30)  # nova-compute reports every minute or so
        logging.info('Placement inventory of %s: %s', klass, totals)
        self.assertGreaterEqual(sum(totals.values()), expected)

    def test_300_boot_a_vgpu_instance_and_read_vgpu_usage(self):
        """An instance on a vGPU flavor lands here, and vgpu-usage names it and its project."""
        if self.framework == 'vfio':
            held = self.map_vfio_type()
            alias = json.dumps({'name': ALIAS, 'device_type': 'type-VF', 'vendor_id': '10de',
                                'product_id': self.vf_device_id(held[0])})
            for app in ('nova-cloud-controller', 'nova-compute'):
                zaza.model.set_application_config(app, {'pci-alias': alias},
                                                  model_name=self.model_name)
            zaza.model.block_until_all_units_idle(model_name=self.model_name)
            flavor = self.flavor({'pci_passthrough:alias': '{}:1'.format(ALIAS)})
        else:
            self.map_mdev_type()
            flavor = self.flavor({'resources:VGPU': '1'})
        image = next(i for i in self.glance.images.list() if i.name.startswith(CIRROS))
        server = self.nova.servers.create(SERVER, image.id, flavor.id, nics='none')
        server = self.wait_for_server(server)
        results = self.action(self.unit, 'vgpu-usage')
        mine = [v for v in (results.get('vgpus') or {}).values()
                if v.get('instance') == server.id]
        self.assertEqual(len(mine), 1, 'vgpu-usage does not list {}: {}'.format(
            server.id, results.get('table')))
        entry = mine[0]
        self.assertEqual(entry['state'], 'running')
        self.assertEqual(entry['type'], self.vgpu_type['id'])
        self.assertEqual(entry['framework'], self.framework)
        self.assertEqual(entry['project-id'], self.keystone_session.get_project_id())
        projects = {p['id']: int(p['running-vgpus']) for p in results['projects'].values()}
        self.assertGreaterEqual(projects.get(entry['project-id'], 0), 1)
        # The guest holds a licence of its edition (C-series: its GPU; Q/B: its VM).
        edition = re.sub('[^a-z0-9]+', '-', entry['edition'].lower()).strip('-')
        self.assertGreaterEqual(int(results['licences'][edition]['licences']), 1)
        wait_for_unit_status(self.unit, 'active',
                             re.escape('{}: 1 used'.format(self.vgpu_type['id'])),
                             self.model_name)
        server.delete()
        zaza.model.reset_application_config(APP, [OPTION], model_name=self.model_name)
