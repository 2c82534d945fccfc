"""vgpu.neighbours: what ceilometer-agent loses in nova.conf, read from the files as rendered."""

import logging
from pathlib import Path

import pytest
import yaml

from unit_tests import principal
from unit_tests.fakehost import FakeHost
from vgpu import neighbours, principalconf

PKG = [neighbours.CEILOMETER_PACKAGE]


def write(root, name, content):
    path = root / "etc/nova" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)


def test_the_settings_are_those_ceilometer_agent_sends():
    assert principal.CEILOMETER_FLAGS == neighbours.CEILOMETER_FLAGS
    assert principal.CEILOMETER_DATA["subordinate_configuration"].count("DEFAULT") == 1
    for key, value in neighbours.CEILOMETER_SETTINGS:
        assert f'["{key}", "{value}"]' in principal.CEILOMETER_DATA["subordinate_configuration"]


def test_nothing_is_read_without_ceilometer_or_without_sections(root):
    write(root, "nova.conf", "not even ini")  # would be a parse error if read
    assert neighbours.notes([], True, "nova-compute") == []
    assert neighbours.notes(PKG, False, "nova-compute") == []


def test_settings_in_either_file_count_and_missing_ones_are_named(root, caplog):
    write(root, "nova.conf", "[DEFAULT]\ninstance_usage_audit = True\n")
    write(root, "nova-compute.conf", "[DEFAULT]\nnotify_on_state_change = vm_and_task_state\n")
    assert neighbours.ceilometer_missing(principalconf.load()) == ["instance_usage_audit_period"]
    with caplog.at_level(logging.WARNING):
        said = neighbours.notes(PKG, True, "compute-gpu")
    assert said == ["ceilometer-agent's nova.conf settings lost beside this unit's "
                    "(instance_usage_audit_period): juju config compute-gpu config-flags="
                    + neighbours.CEILOMETER_FLAGS]
    assert "Workaround: juju config compute-gpu config-flags=" in caplog.text
    write(root, "nova-compute.conf", "[DEFAULT]\ninstance_usage_audit_period=hour\n"
                                     "notify_on_state_change = vm_and_task_state\n")
    assert neighbours.notes(PKG, True, "compute-gpu") == []


def test_an_unreadable_nova_conf_is_logged_not_guessed(root, caplog):
    write(root, "nova.conf", "[DEFAULT]\nbroken\n")
    with caplog.at_level(logging.WARNING):
        assert neighbours.notes(PKG, True, "nova-compute") == []
    assert "cannot tell whether ceilometer-agent's nova.conf settings are in force" in caplog.text


# -- the other units on this machine, from Juju's agent directories ----------------------

ROOT = Path(__file__).resolve().parent.parent
NOVA_COMPUTE_METADATA = yaml.safe_dump({  # charm-nova-compute's: it requires both interfaces
    "name": "nova-compute", "subordinate": False,
    "provides": {"cloud-compute": {"interface": "nova-compute"}},
    "requires": {"neutron-plugin": {"interface": "neutron-plugin", "scope": "container"},
                 "ephemeral-backend": {"interface": "ephemeral-backend", "scope": "container"},
                 "nova-vgpu": {"interface": "nova-vgpu", "scope": "container"}}})


@pytest.mark.parametrize("text", [
    (ROOT / "metadata.yaml").read_text(), principal.CONTRAIL_METADATA,
    principal.SCALEIO_METADATA, NOVA_COMPUTE_METADATA,
    "# a comment\nname: 'quoted'  # and one here\nprovides:\n  x:\n    interface: \"y\"  # z\n",
])
def test_metadata_is_read_as_yaml_reads_it(text):
    loaded = yaml.safe_load(text)
    provides = {r["interface"] for r in (loaded.get("provides") or {}).values()}
    assert neighbours.metadata(text) == (loaded["name"], frozenset(provides))


def test_flow_style_names_nothing_rather_than_a_guess():
    assert neighbours.metadata("{name: x, provides: {a: {interface: ephemeral-backend}}}") == (
        "", frozenset())


def test_the_units_on_this_machine_are_read_bounded_and_an_odd_one_is_skipped(root, caplog):
    host = FakeHost(root)
    assert neighbours.on_this_machine() == []  # no Juju here
    host.juju_unit("nova-compute/0", NOVA_COMPUTE_METADATA)
    host.juju_unit("scaleio-openstack/1", principal.SCALEIO_METADATA)
    huge = host.juju_unit("contrail-openstack/3", principal.CONTRAIL_METADATA)
    huge.write_text(principal.CONTRAIL_METADATA + "#" * neighbours.METADATA_LIMIT)
    (root / "var/lib/juju/agents/machine-4").mkdir()  # the machine agent: not a unit
    with caplog.at_level(logging.WARNING):
        found = neighbours.on_this_machine()
    assert [(n.unit, n.charm) for n in found] == [("nova-compute-0", "nova-compute"),
                                                 ("scaleio-openstack-1", "scaleio-openstack")]
    assert found[1].provides == {"cinder-backend", "ephemeral-backend"}
    assert "cannot tell which charm unit-contrail-openstack-3 runs: cannot read " \
        "/var/lib/juju/agents/unit-contrail-openstack-3/charm/metadata.yaml: more than " in caplog.text


def test_nothing_of_the_neighbours_is_read_while_this_unit_publishes_nothing(root):
    def never():
        raise AssertionError("read")

    assert neighbours.notes(PKG, False, "nova-compute", load=never, units=never) == []
