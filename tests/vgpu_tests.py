"""Functional tests for nova-compute-nvidia-vgpu, run by zaza on a real lab.

They need a MAAS host with an NVIDIA vGPU-capable GPU (see tests/README.md).
The GPU host is found at run time: it is the unit whose list-vgpu-types
action reports a gpu-0. Units on hosts without NVIDIA GPU are checked too.

The tests run in name order and share the model: test_200 leaves a good
mapping that test_300 relies on; tearDownClass resets the option.
"""

import configparser
import json
import logging
import re
import time

import zaza.model
import zaza.openstack.charm_tests.test_utils as test_utils
import zaza.openstack.utilities.generic as generic_utils

APP = 'nova-compute-nvidia-vgpu'
OPTION = 'vgpu-device-mappings'
NOVA_CONF = '/etc/nova/nova.conf'
VGPU_SERVICE = 'nvidia-vgpu-mgr'
BLACKLIST = '/etc/modprobe.d/nvidia-vgpu-blacklist-nouveau.conf'
NO_GPU = 'no NVIDIA GPU on this host'
# An address no GPU host will have (function 7 of device 1f on the last bus).
ABSENT_ADDRESS = '0000:ff:1f.7'
# A key no nova.conf carries: finding it means the option injected settings.
PROBE = 'vgpu_injection_probe'

# What every unit of the charm says once its host is ready (after reboot).
READY_REGEX = r'^([0-9]+ GPUs? \(|{})'.format(NO_GPU)
READY_STATES = {APP: {'workload-status': 'active',
                      'workload-status-message-regex': READY_REGEX}}

STATUS_TIMEOUT = 1200
REBOOT_TIMEOUT = 1800


# -- helpers shared by the configure step and the tests ----------------------

def unit_status(unit_name, model_name=None):
    """(workload status, message) of a subordinate unit, from juju status."""
    status = zaza.model.get_status(model_name=model_name)
    for app in status.applications.values():
        for unit in (app['units'] or {}).values():
            subordinates = unit['subordinates'] or {}
            if unit_name in subordinates:
                workload = subordinates[unit_name]['workload-status']
                return workload['status'], workload['info'] or ''
    raise ValueError('{} is not a subordinate unit in the model'.format(unit_name))


def wait_for_unit_status(unit_name, status, regex, model_name=None,
                         timeout=STATUS_TIMEOUT):
    """Wait until the unit has ``status`` and a message matching ``regex``."""
    deadline = time.time() + timeout
    current = None
    while time.time() < deadline:
        current = unit_status(unit_name, model_name)
        if current[0] == status and re.search(regex, current[1]):
            return current[1]
        time.sleep(10)
    raise AssertionError('{} did not reach {} /{}/ within {}s; it is {}'.format(
        unit_name, status, regex, timeout, current))


def run(unit_name, command, model_name=None, timeout=120):
    """Run ``command`` as root on the unit's machine; return (code, stdout)."""
    out = zaza.model.run_on_unit(unit_name, command, model_name=model_name,
                                 timeout=timeout)
    return int(out.get('Code') or 0), out.get('Stdout', '')


def boot_id(unit_name, model_name=None):
    return run(unit_name, 'cat /proc/sys/kernel/random/boot_id',
               model_name, timeout=60)[1].strip()


def reboot_hosts_needing_it(model_name=None):
    """Configure step: reboot the hosts whose unit asks for it, then wait.

    After installing the host driver and blacklisting nouveau the charm goes
    blocked with "reboot required: ...". Each such host is rebooted once;
    then every unit must settle active.
    """
    for unit in zaza.model.get_units(APP, model_name=model_name):
        name = unit.entity_id
        status, message = unit_status(name, model_name)
        if not (status == 'blocked' and message.startswith('reboot required')):
            continue
        logging.info('Rebooting the host of %s (%s)', name, message)
        before = boot_id(name, model_name)
        generic_utils.reboot(name)
        deadline = time.time() + REBOOT_TIMEOUT
        while True:
            time.sleep(30)
            try:
                if boot_id(name, model_name) not in ('', before):
                    break
            except Exception as error:  # agent still down: keep waiting
                logging.debug('%s not back yet: %s', name, error)
            if time.time() > deadline:
                raise AssertionError('{} did not come back within {}s'.format(
                    name, REBOOT_TIMEOUT))
    zaza.model.block_until_all_units_idle(model_name=model_name)
    zaza.model.wait_for_application_states(model_name=model_name,
                                           states=READY_STATES,
                                           timeout=REBOOT_TIMEOUT)


def read_nova_conf(unit_name, model_name=None):
    """nova.conf as (text, ConfigParser); sections merge as oslo.config does."""
    code, text = run(unit_name, 'cat {}'.format(NOVA_CONF), model_name)
    assert code == 0, 'cannot read {} on {}'.format(NOVA_CONF, unit_name)
    parser = configparser.ConfigParser(strict=False, interpolation=None,
                                       allow_no_value=True)
    parser.read_string(text)
    return text, parser


def nova_major(unit_name, model_name=None):
    code, version = run(unit_name,
                        "dpkg-query -W -f='${Version}' nova-common", model_name)
    match = re.match(r'(?:[0-9]+:)?([0-9]+)\.', version.strip())
    assert code == 0 and match, 'cannot read nova-common version: {!r}'.format(version)
    return int(match.group(1))


def option_names(major):
    """(the [devices] option, the per-type section prefix) Nova ``major`` reads."""
    if major >= 24:  # xena onwards
        return 'enabled_mdev_types', 'mdev_'
    return 'enabled_vgpu_types', 'vgpu_'



def first_address(gpu):
    """The first GPU of a list-vgpu-types entry (one entry names every GPU offering the same types)."""
    return gpu['addresses'].split(',')[0]

class NovaVgpuTest(test_utils.OpenStackBaseTest):
    """Discovery, mapping, validation, pause/resume of nova-compute-nvidia-vgpu."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass(application_name=APP)
        cls.gpu_hosts = {}   # unit name -> list-vgpu-types 'gpus' results
        cls.plain_hosts = []  # units on hosts without NVIDIA GPU
        for unit in zaza.model.get_units(APP, model_name=cls.model_name):
            gpus = cls.list_vgpu_types(unit.entity_id).get('gpus') or {}
            if gpus:
                cls.gpu_hosts[unit.entity_id] = gpus
            else:
                cls.plain_hosts.append(unit.entity_id)
        logging.info('GPU units: %s; units without GPU: %s',
                     sorted(cls.gpu_hosts), cls.plain_hosts)

    @classmethod
    def tearDownClass(cls):
        zaza.model.reset_application_config(APP, [OPTION], model_name=cls.model_name)
        zaza.model.block_until_all_units_idle(model_name=cls.model_name)
        zaza.model.wait_for_application_states(model_name=cls.model_name,
                                               states=READY_STATES)

    @classmethod
    def list_vgpu_types(cls, unit_name):
        action = zaza.model.run_action(unit_name, 'list-vgpu-types',
                                       model_name=cls.model_name,
                                       raise_on_failure=True)
        return action.data['results']

    # -- helpers ----------------------------------------------------------------
    def gpu_unit(self):
        if not self.gpu_hosts:
            self.fail('no unit of {} reports an NVIDIA GPU: is a host tagged gpu '
                      'in the bundle?'.format(APP))
        return sorted(self.gpu_hosts)[0]

    def first_mdev_mapping(self):
        """(unit, type id, address) for the first type of the first GPU.

        Skips when that GPU cannot be mapped by this charm: types served by the
        vendor-specific VFIO framework, or an SR-IOV GPU without enabled VFs.
        """
        unit = self.gpu_unit()
        gpu = self.gpu_hosts[unit]['gpu-0']
        types = gpu.get('types')
        if not isinstance(types, dict) or not types:
            self.fail('{} offers no vGPU types: {}'.format(first_address(gpu), types))
        first = types[sorted(types, key=lambda t: int(t.split('-')[1]))[0]]
        if first.get('framework') != 'mdev':
            self.skipTest('{} ({}) uses the {} framework, which tests/vgpu_guest_tests.py '
                          'checks'.format(first_address(gpu), gpu['model'], first.get('framework')))
        address = first_address(gpu)
        if 'virtual-functions' in gpu:  # SR-IOV: each VF holds one vGPU
            vfs = [vf for vf in gpu['virtual-functions'].split(',') if ':' in vf]
            if not vfs:
                self.skipTest('{}: no virtual functions enabled (sriov-manage -e)'
                              .format(address))
            address = vfs[0]
        return unit, first['id'], address.lower()

    def set_mapping(self, mapping):
        text = mapping if isinstance(mapping, str) else json.dumps(mapping)
        logging.info('Setting %s to %r', OPTION, text)
        zaza.model.set_application_config(APP, {OPTION: text},
                                          model_name=self.model_name)
        zaza.model.block_until_all_units_idle(model_name=self.model_name)

    def apply_good_mapping(self):
        unit, vgpu_type, address = self.first_mdev_mapping()
        self.set_mapping({vgpu_type: [address]})
        wait_for_unit_status(unit, 'active', re.escape('{} on 1'.format(vgpu_type)),
                             self.model_name)
        return unit, vgpu_type, address

    def wait_for_nova_conf(self, unit, vgpu_type, address, timeout=600):
        """Wait until nova.conf serves ``vgpu_type`` on ``address``; return it."""
        option, prefix = option_names(nova_major(unit, self.model_name))
        section = prefix + vgpu_type
        deadline = time.time() + timeout
        while True:
            text, conf = read_nova_conf(unit, self.model_name)
            if (conf.get('devices', option, fallback='') == vgpu_type and
                    conf.get(section, 'device_addresses', fallback='') == address):
                return text, conf
            if time.time() > deadline:
                self.fail('{} on {} has no [devices] {} = {} and [{}] '
                          'device_addresses = {}'.format(NOVA_CONF, unit, option,
                                                         vgpu_type, section, address))
            time.sleep(15)

    def service_state(self, unit, verb):
        return run(unit, 'systemctl {} {}'.format(verb, VGPU_SERVICE),
                   self.model_name)[1].strip()

    # -- tests ------------------------------------------------------------------
    def test_100_list_vgpu_types(self):
        """list-vgpu-types reports each GPU with its address, model and types."""
        unit = self.gpu_unit()
        results = self.list_vgpu_types(unit)
        gpu = results['gpus']['gpu-0']
        for address in gpu['addresses'].split(','):  # GPUs that offer the same types: one entry
            self.assertRegex(address, r'^[0-9a-f]{4}:[0-9a-f]{2}:[01][0-9a-f]\.[0-7]$')
        self.assertTrue(gpu['model'])
        self.assertIsInstance(gpu['types'], dict,
                              'no vGPU types: {}'.format(gpu['types']))
        for type_id, entry in gpu['types'].items():
            self.assertRegex(type_id, r'^nvidia-[0-9]+$')
            self.assertEqual(entry['id'], type_id)
            self.assertTrue(entry['name'])
        self.assertIn(first_address(gpu), results['table'])

    def test_200_mapping_reaches_nova_conf(self):
        """A valid mapping becomes [devices] and [mdev_<type>] in nova.conf."""
        unit, vgpu_type, address = self.apply_good_mapping()
        self.wait_for_nova_conf(unit, vgpu_type, address)
        zaza.model.wait_for_application_states(model_name=self.model_name,
                                               states=READY_STATES)

    def test_300_invalid_mapping_blocks_and_keeps_last_good(self):
        """A refused mapping blocks the unit, names the entry, changes nothing."""
        unit, vgpu_type, address = self.apply_good_mapping()
        self.wait_for_nova_conf(unit, vgpu_type, address)
        hostile = '{}\n[DEFAULT]\n{} = 1'.format(address, PROBE)
        cases = [
            ('address absent from the host', {vgpu_type: [ABSENT_ADDRESS]},
             r'^{}: {}: {} is not an NVIDIA GPU on this host'.format(
                 OPTION, vgpu_type, re.escape(ABSENT_ADDRESS))),
            ('newline in an address', {vgpu_type: [hostile]},
             r'^{}: {}: ".*" is not a PCI address'.format(OPTION, vgpu_type)),
            ('newline in a type', {'nvidia-1]\n[DEFAULT': [address]},
             r'^{}: type ".*" is not a vGPU type id'.format(OPTION)),
            ('not YAML', "{'" + vgpu_type + "': [",
             r'^{}: vgpu-device-mappings is not valid YAML'.format(OPTION)),
        ]
        for label, mapping, regex in cases:
            with self.subTest(label):
                self.set_mapping(mapping)
                message = wait_for_unit_status(unit, 'blocked', regex, self.model_name)
                self.assertNotIn('\n', message)
                self.assertIn('keeping {} on 1'.format(vgpu_type), message)
                text, _ = self.wait_for_nova_conf(unit, vgpu_type, address, timeout=0)
                self.assertNotIn(PROBE, text)
        self.apply_good_mapping()

    def test_400_pause_resume(self):
        """pause stops and masks nvidia-vgpu-mgr; resume brings it back."""
        unit = self.gpu_unit()
        wait_for_unit_status(unit, 'active', READY_REGEX, self.model_name)
        self.assertEqual(self.service_state(unit, 'is-active'), 'active')

        action = zaza.model.run_action(unit, 'pause', model_name=self.model_name)
        generic_utils.assertActionRanOK(action)
        self.assertIn(VGPU_SERVICE, action.data['results'].get('stopped', ''))
        wait_for_unit_status(unit, 'maintenance', r'^paused', self.model_name)
        self.assertNotEqual(self.service_state(unit, 'is-active'), 'active')
        self.assertEqual(self.service_state(unit, 'is-enabled'), 'masked')

        action = zaza.model.run_action(unit, 'resume', model_name=self.model_name)
        generic_utils.assertActionRanOK(action)
        wait_for_unit_status(unit, 'active', READY_REGEX, self.model_name)
        self.assertEqual(self.service_state(unit, 'is-active'), 'active')
        self.assertIn(self.service_state(unit, 'is-enabled'), ('enabled', 'static'))

    def test_500_host_without_gpu(self):
        """On a host without NVIDIA GPU: active, nothing installed or configured."""
        if not self.plain_hosts:
            if self.get_my_tests_options('required', False):
                self.fail('no unit of {} on a host without NVIDIA GPU'.format(APP))
            self.skipTest('the bundle has no compute host without NVIDIA GPU')
        for unit in self.plain_hosts:
            with self.subTest(unit):
                # Whatever vgpu-device-mappings holds (test_200 set one).
                wait_for_unit_status(unit, 'active', '^' + NO_GPU, self.model_name)
                results = self.list_vgpu_types(unit)
                self.assertFalse(results.get('gpus'))
                self.assertEqual(results['table'], NO_GPU)
                code, out = run(unit, "dpkg-query -W -f='${Status}\\n' "
                                      "'nvidia-vgpu-ubuntu-*'", self.model_name)
                self.assertNotIn('installed', out.replace('not-installed', ''))
                self.assertNotEqual(run(unit, 'test -e ' + BLACKLIST,
                                        self.model_name)[0], 0)
                _, conf = read_nova_conf(unit, self.model_name)
                self.assertFalse([s for s in conf.sections()
                                  if s.startswith(('mdev_nvidia-', 'vgpu_nvidia-'))])
                self.assertFalse(conf.get('devices', 'enabled_mdev_types', fallback=''))
