"""vgpu.neighbours: what ceilometer-agent loses in nova.conf, read from the files as rendered."""

import logging

from unit_tests import principal
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
