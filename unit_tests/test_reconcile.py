"""The reconcile steps on plain inputs, without ops: what comes back for the charm to apply.

The charm tests (test_charm*.py) drive the same steps through ops.testing;
these check the module's own contract: relation data only for what changed,
per relation, nothing asked of the charm that a step does not need, and a
resume by hand reported rather than stored.
"""

import json

import pytest

from unit_tests.test_charm import install_driver
from vgpu import OPTION, mappings, novaconf, reconcile


def inputs(mapping=None, relations=({},), paused=False, **overrides):
    """Plain inputs: the option's text checked as the charm does, no resource attached."""
    def attached(fetch):
        raise AssertionError("the resource is not asked for while the driver is installed")

    options = {} if mapping is None else {OPTION: mapping}
    given = dict(
        options=options, checked=lambda: mappings.check_text(mapping), attached=attached,
        relations=lambda: [reconcile.Published("nova-compute", data) for data in relations],
        unit="nova-compute-nvidia-vgpu/0", paused=paused)
    given.update(overrides)
    return reconcile.Inputs(**given)


def sections(data):
    return novaconf.sections_from_relation(data)


@pytest.fixture
def ready(v100, root, packages):
    """Two V100s (mediated devices), Nova 29, the driver installed and its daemons running."""
    install_driver(root, packages["old"])
    return v100


GOOD = "{nvidia-108: ['c1:00.0']}"


def test_a_valid_mapping_is_returned_for_every_relation_and_then_nothing(ready):
    first = reconcile.reconcile(reconcile.Host(), inputs(GOOD, relations=({}, {})))
    assert first.problems == [] and first.waits == []
    assert len(first.relation_data) == 2 and first.relation_data[0] == first.relation_data[1]
    data = first.relation_data[0]
    assert sections(data)["devices"] == [["enabled_mdev_types", "nvidia-108"]]
    assert json.loads(data["releases-packages-map"])
    # The next hook sees it published: nothing changed, nothing to set.
    again = reconcile.reconcile(reconcile.Host(), inputs(GOOD, relations=(data,)))
    assert again.relation_data == [{}]


def test_only_the_keys_that_changed_are_returned_per_relation(ready):
    data = reconcile.reconcile(reconcile.Host(), inputs(GOOD)).relation_data[0]
    stale = {**data, "services": "stale"}
    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD, relations=(data, stale)))
    assert done.relation_data == [{}, {"services": data["services"]}]


def test_a_mapping_that_fails_validation_leaves_the_published_sections(ready):
    published = reconcile.reconcile(reconcile.Host(), inputs(GOOD)).relation_data[0]
    host = reconcile.Host()
    done = reconcile.reconcile(host, inputs("{nvidia-999: ['c1:00.0']}", relations=(published,)))
    assert done.relation_data == [{}]  # no sections: the last good ones stay, nothing else moved
    done = reconcile.reconcile(host, inputs("{nvidia-999: ['c1:00.0']}", relations=({},)))
    assert "subordinate_configuration" not in done.relation_data[0]
    assert set(done.relation_data[0]) == {"services", "releases-packages-map"}
    # Why is the validation's (the status shows it), kept on the Host for this dispatch.
    validation = host.mapping(lambda: pytest.fail("validated again"), pci_in_placement=False,
                              live_migration=False, problems=[], published=[{}])
    assert not validation.ok and "nvidia-999" in "; ".join(validation.errors)


def test_a_host_without_gpus_asks_neither_the_option_nor_the_resource(root, tools):
    def untouched():
        raise AssertionError("the option's text is not checked without a GPU")

    done = reconcile.reconcile(reconcile.Host(), inputs(checked=untouched))
    assert done.problems == [] and done.vf_failures is None and not done.resumed
    assert sections(done.relation_data[0]) == {}  # empty sections: nothing of ours in nova.conf


def test_a_paused_unit_whose_daemons_run_again_is_reported_resumed(ready, tools):
    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD, paused=True))
    assert done.resumed


def test_a_paused_unit_whose_daemon_is_stopped_stays_paused(ready, tools):
    tools.set_active("nvidia-vgpu-mgr", False)
    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD, paused=True))
    assert not done.resumed


def test_publish_alone_logs_a_host_read_error_and_returns_no_data(ready, root, caplog):
    (root / "var/lib/dpkg/status").unlink()
    (root / "var/lib/dpkg/status").mkdir()
    unreadable = "cannot read /var/lib/dpkg/status: Is a directory"
    done = reconcile.publish(reconcile.Host(), inputs(GOOD))
    assert done.relation_data == [] and done.problems == []
    assert ("ERROR", unreadable) in [(r.levelname, r.getMessage()) for r in caplog.records]
    # The hooks' reconcile says it as a problem instead, and publishes nothing either.
    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD))
    assert done.problems == [unreadable] and done.relation_data == []


def test_the_principal_s_files_are_read_once_per_dispatch_and_a_failure_is_said_to_each_caller(
        root):
    from unit_tests.faketools import OPENED
    from vgpu.errors import PrincipalConfigError

    conf = root / "etc/nova/nova.conf"
    conf.parent.mkdir(parents=True, exist_ok=True)
    conf.write_text("[DEFAULT]\nbroken\n")
    host = reconcile.Host()
    with OPENED as opened:
        for _ in range(2):
            with pytest.raises(PrincipalConfigError, match="cannot parse /etc/nova/nova.conf: line 2"):
                host.principal_conf()
    assert opened.reads[conf] == 1
    conf.write_text("[pci]\nalias = {}\n")
    with pytest.raises(PrincipalConfigError):  # kept until refresh: one dispatch, one answer
        host.principal_conf()
    host.refresh()
    assert host.principal_conf() == [("/etc/nova/nova.conf", {"pci": {"alias": ["{}"]}})]


def test_the_failed_mdevctl_install_comes_back_and_update_status_alone_backs_off(
        root, tools, packages):
    """Inputs.backoff and mdevctl_failed in, Outcome.mdevctl_failed out; actions try at once."""
    import time

    from unit_tests.fakehost import v100_host
    from vgpu import mdevctl

    v100_host(root, nova="3:30.0.0-0ubuntu1")
    install_driver(root, packages["old"])
    for daemon in ("nvidia-vgpu-mgr", "nvidia-vgpud"):
        tools.set_active(daemon)
    tools.apt_fails("mdevctl")

    def apt_runs():
        return len([c for c in tools.calls() if c.startswith("apt-get")])

    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD))
    failed = done.mdevctl_failed
    assert apt_runs() == 3 and failed is not None
    assert failed.cause == "apt-get install mdevctl failed: Unable to locate package mdevctl"
    assert "subordinate_configuration" not in done.relation_data[0]
    # update-status within the hour: no apt, the same failure kept, the same cause said.
    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD, backoff=True, mdevctl_failed=failed))
    assert apt_runs() == 3 and done.mdevctl_failed == failed
    assert done.problems[0].startswith(f"mdevctl is missing and could not be installed "
                                       f"({failed.cause}): Nova 30")
    assert "subordinate_configuration" not in done.relation_data[0]
    # An hour on, and for an action (publish) at once: apt again, a new failure.
    old = failed._replace(at=time.time() - mdevctl.RETRY_AFTER)
    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD, backoff=True, mdevctl_failed=old))
    assert apt_runs() == 6 and done.mdevctl_failed.at > old.at
    done = reconcile.publish(reconcile.Host(), inputs(GOOD, mdevctl_failed=failed))
    assert apt_runs() == 9 and done.mdevctl_failed.at >= failed.at
    # Installed: forgotten, and the mdev types go out.
    tools.apt_works("mdevctl")
    done = reconcile.reconcile(reconcile.Host(), inputs(GOOD, mdevctl_failed=failed))
    assert apt_runs() == 10 and done.mdevctl_failed is None and done.problems == []
    assert sections(done.relation_data[0])["devices"] == [["enabled_mdev_types", "nvidia-108"]]
