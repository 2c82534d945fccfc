"""The packed charm, run the way Juju runs it: ``./dispatch`` with Juju's environment and hook tools.

ops.testing, the demo and ``make pack-check`` all import the charm's class,
so none of them notices what only a unit shows: a ``src/charm.py`` that git
stores without its executable bit makes every hook fail with "Permission
denied". Here the charm is built by charmcraft's own charm plugin and charm
builder from what git stores (file modes included), zipped as ``charmcraft
pack`` zips it, unzipped as Juju unpacks it, checked by ``charmcraft
analyse``'s linters, and then run hook after hook and action after action on
one unit (unit_tests/fakejuju.py): each dispatch is a real process started
through the ``dispatch`` script charmcraft wrote, with the charm's own
``venv/`` and a bare interpreter, on a host tree from unit_tests/fakehost.py,
with stand-ins for systemctl and update-initramfs (unit_tests/faketools.py)
and for Juju's hook tools. What is checked is what Juju would see: exit
statuses, status-set calls, relation data (read back the way nova-compute
reads it), action results, and state kept between dispatches.

The charm is built once per session (see unit_tests/packing.py: its
dependencies are installed from PyPI on the first build and reused after
that by charmcraft's own dependency hash), and every test runs again on
``make charm``'s artefact for this machine's Python (tools/build_charm.py:
the wheels of that Python, not charmcraft's pip install).
"""

import json
import os
import subprocess
from types import SimpleNamespace

import pytest

from tools import build_charm
from unit_tests import debs, packing, principal, upstream
from unit_tests.fakehost import a100_host, l40s_host, settle_mdevs
from unit_tests.fakejuju import Unit
from unit_tests.libvirt import defined_guest, running_guest
from vgpu import fleet, kernel, sriov

UNIT = "nova-compute-nvidia-vgpu/0"
PRINCIPAL = "nova-compute/0"
MGR = "nvidia-vgpu-mgr"
VGPUD = "nvidia-vgpud"
RESOURCE = "nvidia-vgpu-software"
V100_MAPPING = "{nvidia-108: ['c1:00.0'], nvidia-109: ['00000000:E1:00.0']}"
V100_ACTIVE = ("2 GPUs (Tesla V100 PCIe 16GB), nvidia-108 on 1, nvidia-109 on 1; "
               "nvidia-108: 0 used, 2 free; nvidia-109: 0 used, 1 free")
# A key that would open a [DEFAULT] section in nova.conf, and an address ending a list.
HOSTILE = ['{"nvidia-108\\n[DEFAULT]\\ndebug": ["0000:c1:00.0"]}',
           "{nvidia-108: ['0000:c1:00.0]']}"]
MDEV = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1"
VM = "11111111-1111-4111-8111-111111111111"
PAUSED = ("maintenance",
          f"paused: vGPU services stopped; juju run {UNIT} resume to start them")


@pytest.fixture(scope="session", params=["charm-plugin", "make-charm"])
def packed(request, tmp_path_factory):
    """The packed charm, analysed as charmcraft analyse does; every test here runs on both builds.

    ``charm-plugin``: built by charmcraft's charm plugin (as ``charmcraft pack``) and packed
    here. ``make-charm``: ``make charm``'s artefact (tools/build_charm.py) for this machine's
    Python, or the file ``DISPATCH_CHARM`` names (the ``made_charm`` fixture, unit_tests/conftest.py).
    """
    why = packing.why_not()
    if why:
        pytest.skip(why)
    work = tmp_path_factory.mktemp("packed")
    python_bin = packing.unit_python(work / "unit-python")
    if request.param == "charm-plugin":
        with packing.shared(tmp_path_factory, "charm-plugin") as shared:  # one build, every worker
            charm_file = shared / "nova-compute-nvidia-vgpu.charm"
            if not (shared / "done").exists():
                packing.pack(packing.build(python_bin, shared / "build.log"), charm_file)
                (shared / "done").touch()
    else:
        charm_file = request.getfixturevalue("made_charm")
    return SimpleNamespace(file=charm_file, python_bin=python_bin,
                           analysis=packing.analyse(charm_file))


def _unit(packed, tmp_path, root, tools) -> Unit:
    return packing.juju_unit(packed.file, packed.python_bin, tmp_path, root, tools, UNIT, PRINCIPAL)


@pytest.fixture
def unit(packed, tmp_path, root, tools) -> Unit:
    return _unit(packed, tmp_path, root, tools)


def ok(dispatched):
    """The dispatch exited 0 and every hook tool it called took the command line."""
    assert dispatched.returncode == 0, dispatched.explain()
    refused = [c["argv"] for c in dispatched.calls if c["rc"] == 2]
    assert not refused, f"hook tools refused {refused}\n{dispatched.explain()}"
    return dispatched


def nova_conf(data) -> str:
    return principal.render_nova_conf(principal.nova_context(data))


# -- what git stores, and what charmcraft makes of it -----------------------------------

def test_git_stores_the_entrypoint_executable():
    if not packing.in_git_checkout():
        pytest.skip("not a git checkout")
    modes = packing.git_modes()
    # dispatch runs `exec ./src/charm.py`: without this bit every hook fails.
    assert modes["src/charm.py"] == packing.GIT_EXECUTABLE
    assert modes["charmcraft.yaml"] == packing.GIT_FILE


def test_charmcraft_analyse_finds_an_ops_charm_with_nothing_wrong(packed):
    results = packed.analysis
    assert results["language"][0] == "python"
    assert results["framework"][0] == "operator"
    for name in ("entrypoint", "ops-main-call", "metadata", "juju-actions", "juju-config",
                 "naming-conventions"):
        assert results[name][0] == "ok", (name, results[name])
    # The rest need charmcraft's build directories, charm libraries, or a venv with bin/
    # (the charm plugin ships site-packages only): not applicable here, or fine.
    for name in ("additional-files", "pip-check"):
        assert results[name][0] in ("ok", "nonapplicable"), (name, results[name])
    # pydeps looks for venv/lib/python3.x/site-packages, which the charm plugin does not lay
    # out (venv/ is site-packages): "fatal", as under charmcraft 4.5.0's analyse (make charm
    # counts it and explains it, docs/reference/development.md). Its own check, run on the
    # layout it expects, finds the cos_agent library's PYDEPS in the packed venv (below).
    assert results["pydeps"] == ("fatal", build_charm.PYDEPS_FATAL), results["pydeps"]
    assert len(results) == 11  # every checker charmcraft analyse runs was looked at above


def test_the_packed_venv_holds_every_charm_librarys_pydeps(packed, tmp_path):
    from charmcraft import linters, utils

    charm = packing.unpack(packed.file, tmp_path / "charm")
    deps = utils.collect_charmlib_pydeps(basedir=charm)
    assert {"cosl >= 0.0.50", "pydantic"} <= deps
    expected = tmp_path / "venv" / "lib" / "python3"
    expected.mkdir(parents=True)
    (expected / "site-packages").symlink_to(charm / "venv")
    assert linters.PyDeps._get_missing_deps(deps, tmp_path / "venv") == (set(), set())


def test_the_unpacked_charm_keeps_git_modes_and_charmcraft_dispatch(packed, tmp_path):
    charm = packing.unpack(packed.file, tmp_path / "charm")
    dispatch = (charm / "dispatch").read_text()
    assert dispatch.rstrip().endswith("exec ./src/charm.py")
    assert 'PYTHONPATH=lib:venv' in dispatch
    assert os.access(charm / "dispatch", os.X_OK)
    for hook in ("install", "start", "upgrade-charm"):
        assert (charm / "hooks" / hook).read_text() == dispatch
    assert (charm / "src/charm.py").read_text().startswith("#!/usr/bin/env python3\n")
    assert (charm / "venv/ops/__init__.py").is_file()
    assert (charm / "venv/jsonschema/__init__.py").is_file()
    for left_out in ("unit_tests", "tools", "tests", ".ci", "Makefile", "requirements.txt",
                     "staging-venv", ".git"):
        assert not (charm / left_out).exists(), left_out
    shipped = {rel: mode for rel, mode in packing.git_modes().items() if (charm / rel).is_file()}
    assert "src/charm.py" in shipped and "src/vgpu/pci.py" in shipped
    # charm.py's ops-facing helpers beside it (fleet.py, maintenance.py ...): every one git stores.
    helpers = {rel for rel in packing.git_modes() if rel.startswith("src/") and rel.count("/") == 1
               and rel.endswith(".py")}
    assert {"src/fleet.py", "src/maintenance.py", "src/migmode.py", "src/inspecting.py"} <= helpers
    assert sorted(helpers - set(shipped)) == []
    for rel, mode in shipped.items():
        assert os.access(charm / rel, os.X_OK) == (mode == packing.GIT_EXECUTABLE), rel


# -- one unit, hook after hook ------------------------------------------------------------

def test_a_v100_unit_from_install_to_remove(unit, v100, root, tools, packages):
    unit.attach(RESOURCE, packages["old"])
    install = ok(unit.hook("install"))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    assert kernel.blacklist_path().exists()
    assert "update-initramfs -u" in tools.calls()
    assert install.statuses() == [
        ("maintenance", "installing nvidia-vgpu-ubuntu-570 570.158.02"),
        ("blocked", "relate to nova-compute: juju integrate nova-compute:nova-vgpu "
                    "nova-compute-nvidia-vgpu:nova-vgpu")]
    assert (unit.charm_dir / ".unit-state.db").is_file()  # ops' state, kept for the next hooks

    # Juju brings the subordinate's relations, leadership, config and start.
    juju_info = unit.relate("juju-info", 5, "nova-compute")
    nova_vgpu = unit.relate("nova-vgpu", 7, "nova-compute")
    for name, relation in (("juju-info-relation-created", juju_info),
                           ("nova-vgpu-relation-created", nova_vgpu)):
        ok(unit.hook(name, relation))
    for name in ("leader-elected", "config-changed", "start"):
        ok(unit.hook(name))
    for relation in (juju_info, nova_vgpu):
        unit.join(relation, PRINCIPAL)
        for kind in ("joined", "changed"):
            ok(unit.hook(f"{relation.endpoint}-relation-{kind}", relation, remote_unit=PRINCIPAL))
    assert unit.status() == (
        "active", "2 GPUs (Tesla V100 PCIe 16GB), no vGPU type mapped: set vgpu-device-mappings")
    data = unit.relation_data(nova_vgpu)
    assert principal.services(data) == set()  # nova-compute's pause leaves the vGPU manager alone
    assert principal.release_packages(data).install == {"nvidia-vgpu-ubuntu-570"}
    assert principal.nova_context(data) == {}

    unit.configure(vgpu_device_mappings=V100_MAPPING)
    changed = ok(unit.hook("config-changed"))
    assert changed.statuses()[-1] == ("active", V100_ACTIVE)
    published = unit.relation_data(nova_vgpu)
    conf = nova_conf(published)
    assert "[devices]\nenabled_mdev_types = nvidia-108,nvidia-109\n" in conf
    assert "[mdev_nvidia-108]\ndevice_addresses = 0000:c1:00.0\n" in conf
    assert "[mdev_nvidia-109]\ndevice_addresses = 0000:e1:00.0\n" in conf

    steady = ok(unit.hook("update-status"))
    assert steady.statuses() == [("active", V100_ACTIVE)]
    assert "relation-set" not in steady.tools()  # nothing changed, nothing written
    assert "resource-get" not in steady.tools()  # the resource's record from install answers

    types = ok_action(unit, "list-vgpu-types")
    assert types.results["gpus"]["gpu-0"]["addresses"] == "0000:c1:00.0,0000:e1:00.0"  # alike: one entry
    assert types.results["gpus"]["gpu-0"]["types"]["nvidia-108"]["name"] == "GRID V100-8Q"
    assert types.results["table"].splitlines()[0].split()[:3] == ["GPUS", "MODEL", "TYPE"]
    assert ok_action(unit, "vgpu-usage").results == {
        "summary": "no vGPU in use on this host", "table": "no vGPU in use on this host"}

    tools.log.write_text("")
    paused = ok_action(unit, "pause")
    assert paused.results == {"stopped": MGR}
    assert [c for c in tools.calls() if not c.startswith("systemctl is-")] == [
        f"systemctl stop {MGR}", f"systemctl disable {MGR}", f"systemctl mask {MGR}"]
    assert paused.dispatched.statuses() == [PAUSED]
    # The next hook is a new process: the paused flag comes from ops' state in the charm dir.
    assert ok(unit.hook("update-status")).statuses() == [PAUSED]
    resumed = ok_action(unit, "resume")
    assert resumed.results == {"started": MGR}
    assert (tools.enabled(MGR), tools.enabled(VGPUD)) == ("enabled", "enabled")
    assert ok(unit.hook("update-status")).statuses() == [("active", V100_ACTIVE)]

    # juju attach-resource: Juju runs upgrade-charm, then the operator runs upgrade.
    unit.attach(RESOURCE, packages["new"])
    noted = ok(unit.hook("upgrade-charm"))
    assert "resource-get" in noted.tools()
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"  # hooks leave that to upgrade
    upgraded = ok_action(unit, "upgrade")
    assert (upgraded.results["previous"], upgraded.results["version"],
            upgraded.results["reboot-required"]) == ("nvidia-vgpu-ubuntu-570 570.158.02",
                                                     "570.172.08", "yes")
    assert debs.dpkg_query(root) == "install ok installed 570.172.08"
    reason = "NVIDIA driver 570.158.02 is loaded, 570.172.08 installed"
    assert unit.status() == ("blocked", f"reboot required: {reason}")
    v100.loaded_driver("570.172.08")  # the reboot
    assert ok(unit.hook("update-status")).statuses() == [("active", V100_ACTIVE)]

    # A guest takes a vGPU: vgpu-usage names it, and pause refuses (action-fail; exit 0).
    v100.add_mdev("0000:c1:00.0", "nvidia-108", MDEV)
    running_guest(root, "instance-0000002a", VM, mdev_uuid=MDEV)
    usage = ok_action(unit, "vgpu-usage")
    assert usage.results["summary"] == ("1 vGPU in running guests (1 RTX Virtual Workstation); "
                                        "licences: 1 NVIDIA RTX Virtual Workstation")
    assert usage.results["licences"]["rtx-virtual-workstation"]["licences"] == "1"
    assert usage.results["vgpus"]["vgpu-0"]["instance"] == VM
    assert usage.results["vgpus"]["vgpu-0"]["profile"] == "V100-8Q"
    refused = unit.action("pause")
    ok(refused.dispatched)
    assert refused.failed == (
        f"not paused: 1 running guest(s) use vGPUs: instance-0000002a (vm-instance-0000002a, {VM})")
    assert tools.enabled(MGR) == "enabled"

    for text in HOSTILE:
        unit.configure(vgpu_device_mappings=text)
        hostile = ok(unit.hook("config-changed"))
        status, message = hostile.statuses()[-1]
        assert status == "blocked" and message.startswith("vgpu-device-mappings: "), message
        assert message.endswith("; keeping nvidia-108 on 0000:c1:00.0, nvidia-109 on 0000:e1:00.0")
        assert "\n" not in message
        assert unit.relation_data(nova_vgpu) == published  # the last good mapping stays
        assert "debug" not in nova_conf(unit.relation_data(nova_vgpu))

    # nova-compute goes away: first the nova-vgpu relation, then the container relation.
    for relation in (nova_vgpu, juju_info):
        unit.depart(relation, PRINCIPAL)
        ok(unit.hook(f"{relation.endpoint}-relation-departed", relation, remote_unit=PRINCIPAL,
                     departing=PRINCIPAL))
        ok(unit.hook(f"{relation.endpoint}-relation-broken", relation))
        unit.forget(relation)
    ok(unit.hook("stop"))
    ok(unit.hook("remove"))
    assert not kernel.blacklist_path().exists()
    assert debs.dpkg_query(root) == "install ok installed 570.172.08"  # the package stays
    # Juju saw every call's command line accepted, and nothing logged as a problem,
    # over the whole life of the unit.
    assert not [c["argv"] for c in unit.calls() if c["rc"] == 2]
    assert not [e for e in unit.log() if e["level"] in ("WARNING", "ERROR")]


def test_a_unit_among_its_peers_publishes_once_and_the_leader_names_the_odd_driver(
        unit, v100, root, tools, packages):
    """The fleet peer relation as Juju runs it: relation-set only when the record changed."""
    unit.attach(RESOURCE, packages["old"])
    ok(unit.hook("install"))
    nova_vgpu = unit.relate("nova-vgpu", 7, "nova-compute")
    peers = unit.relate("fleet", 3, "nova-compute-nvidia-vgpu")
    ok(unit.hook("fleet-relation-created", peers))
    other = "nova-compute-nvidia-vgpu/1"
    unit.join(peers, other, {fleet.KEY: fleet.encode(fleet.Record(
        "gpu-1", "12", "570.172.08", gpus=(fleet.GpuRecord("0000:c1:00.0", "0x1db4", 16),)))})
    unit.join(nova_vgpu, PRINCIPAL)
    ok(unit.hook("nova-vgpu-relation-changed", nova_vgpu, remote_unit=PRINCIPAL))
    unit.configure(vgpu_device_mappings=V100_MAPPING)
    ok(unit.hook("config-changed"))
    mine = fleet.decode(unit.relation_data(peers)[fleet.KEY])
    assert (mine.driver, [g.type_id for g in mine.gpus]) == ("570.158.02",
                                                              ["nvidia-108", "nvidia-109"])
    changed = ok(unit.hook("fleet-relation-changed", peers, remote_unit=other))
    assert "relation-set" not in changed.tools()
    application = json.loads((unit.state / "status.json").read_text())["application"]
    assert (application["status"], application["message"]) == (
        "active", "driver 570.172.08 on 1 of 2 hosts: live migration between them fails")
    steady = ok(unit.hook("update-status"))
    assert "relation-set" not in steady.tools()  # nothing changed, nothing written
    assert ok_action(unit, "drain-plan").results["summary"] == (
        "no guest on this host's GPUs: nothing to drain")
    report = ok_action(unit, "fleet-report").results
    # The driver first; then this host's own live-migration readiness (vgpu.virt): nova-compute
    # here has live migration off, while the peer's record says nothing stands in its way.
    assert report["summary"] == ("2 units, 3 GPUs; 2 inconsistencies, first: driver 570.172.08 "
                                 "on 1 of 2 hosts: live migration between them fails")
    assert any("not ready to live-migrate" in i for i in json.loads(report["inconsistencies"]))


def ok_action(unit, name, **params):
    run = unit.action(name, **params)
    ok(run.dispatched)
    assert run.failed is None, f"{name} failed: {run.failed}\n{run.dispatched.explain()}"
    return run


def current_type(root, address: str) -> int:
    return int((root / f"sys/bus/pci/devices/{address}/nvidia/current_vgpu_type").read_text())


L40S_MAPPING = "{L40S-12Q: all, 'NVIDIA H200X-35C': ['c1:00.0']}"


def test_an_l40s_unit_writes_vf_types_and_removes_its_boot_unit(packed, tmp_path, root, tools,
                                                                 packages):
    host = l40s_host(root)
    unit = _unit(packed, tmp_path, root, tools)
    for name in (MGR, VGPUD):
        tools.set_active(name)
    unit.attach(RESOURCE, packages["old"])
    nova_vgpu = unit.relate("nova-vgpu", 7, "nova-compute")
    ok(unit.hook("install"))
    host.install_sriov_manage()  # the stand-in, over the placeholder the package brought
    unit.join(nova_vgpu, PRINCIPAL)
    ok(unit.hook("nova-vgpu-relation-joined", nova_vgpu, remote_unit=PRINCIPAL))
    unit.configure(vgpu_device_mappings=L40S_MAPPING)
    changed = ok(unit.hook("config-changed"))
    status, message = changed.statuses()[-1]
    assert status == "active", message
    assert message.startswith("2 GPUs (1 H200 SXM 141GB, 1 L40S), CUSTOM_VGPU_H200X_35C on 4, "
                              "CUSTOM_VGPU_L40S_12Q on 4"), message
    conf = nova_conf(unit.relation_data(nova_vgpu))
    assert conf.count("device_spec = ") == 8
    assert '"resource_class": "CUSTOM_VGPU_L40S_12Q"' in conf
    l40s_vfs = [f"0000:81:00.{n}" for n in range(4, 8)] + ["0000:81:01.0", "0000:81:01.1"]
    assert [current_type(root, vf) for vf in l40s_vfs] == [1139] * 4 + [0, 0]
    assert sriov.unit_path().is_file()
    assert ok(unit.hook("update-status")).statuses()[-1] == changed.statuses()[-1]
    listed = ok_action(unit, "list-vgpu-types")
    entry = listed.results["gpus"]["gpu-0"]["types"]["nvidia-1139"]
    assert entry["flavor-property"] == "pci_passthrough:alias=vgpu-l40s-12q:1"
    unit.configure(vgpu_device_mappings=HOSTILE[0])
    hostile = ok(unit.hook("config-changed"))
    assert hostile.statuses()[-1][0] == "blocked"
    assert nova_conf(unit.relation_data(nova_vgpu)) == conf
    unit.depart(nova_vgpu, PRINCIPAL)
    ok(unit.hook("nova-vgpu-relation-departed", nova_vgpu, remote_unit=PRINCIPAL,
                 departing=PRINCIPAL))
    ok(unit.hook("nova-vgpu-relation-broken", nova_vgpu))
    unit.forget(nova_vgpu)
    ok(unit.hook("stop"))
    ok(unit.hook("remove"))
    assert not sriov.unit_path().exists()
    assert not kernel.blacklist_path().exists()


# -- the stand-in hook tools themselves -------------------------------------------------------

def test_the_stand_in_hook_tools_take_what_ops_sends_and_refuse_the_rest(packed, tmp_path, root,
                                                                          tools, monkeypatch):
    from ops import hookcmds

    unit = _unit(packed, tmp_path, root, tools)
    rel = unit.relate("nova-vgpu", 7, "nova-compute")
    unit.join(rel, PRINCIPAL, {"restart-trigger": "x"})
    env = unit.environ("hooks/update-status")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # ops' own hook-command code, against the stand-ins.
    hookcmds.status_set("blocked", "a message\nwith a newline")
    assert hookcmds.status_get().message == "a message\nwith a newline"
    assert unit.status() == ("blocked", "a message\nwith a newline")
    hookcmds.relation_set({"a": "1", "b": "2"}, 7, endpoint="nova-vgpu")
    hookcmds.relation_set({"a": ""}, 7, endpoint="nova-vgpu")  # Juju deletes an emptied key
    assert hookcmds.relation_get(7, endpoint="nova-vgpu", unit=UNIT)["b"] == "2"
    assert "a" not in unit.relation_data(rel)
    assert hookcmds.relation_get(7, endpoint="nova-vgpu", unit=PRINCIPAL) == {"restart-trigger": "x"}
    assert hookcmds.relation_ids("nova-vgpu") == ["nova-vgpu:7"]
    assert hookcmds.relation_list(7, endpoint="nova-vgpu") == [PRINCIPAL]
    assert hookcmds.config_get()["vgpu-device-mappings"] == ""
    assert hookcmds.is_leader() is True
    hookcmds.app_version_set("570.158.02")
    assert hookcmds.opened_ports() == []
    assert set(hookcmds.goal_state().relations["nova-vgpu"]) == {"nova-compute", PRINCIPAL}
    with pytest.raises(hookcmds.Error) as missing:  # nothing attached yet
        hookcmds.resource_get(RESOURCE)
    assert "not found" in missing.value.stderr
    placeholder = tmp_path / "empty.deb"
    placeholder.write_bytes(b"")
    attached = unit.attach(RESOURCE, placeholder)
    assert hookcmds.resource_get(RESOURCE) == attached
    assert attached.name == "nvidia-vgpu.deb"  # metadata.yaml's filename, as Juju names it
    with pytest.raises(hookcmds.Error):  # not in an action
        hookcmds.action_get()
    with pytest.raises(hookcmds.Error) as gone:
        hookcmds.relation_get(9, endpoint="nova-vgpu", unit=PRINCIPAL)
    assert "relation not found" in gone.value.stderr
    # Command lines ops does not send are refused, whatever Juju's own tools would do.
    bin_dir = unit.bin
    for argv in (["status-set", "active", "no --application"],
                 ["status-set", "--application=False", "error", "--", "not settable"],
                 ["config-get"],
                 ["relation-get", "-r", "nova-vgpu:7", "-", UNIT],
                 ["relation-set", "-r", "nova-vgpu:7", "a=1"],
                 ["juju-log", "no level"],
                 ["is-leader"]):
        done = subprocess.run([str(bin_dir / argv[0]), *argv[1:]], capture_output=True, text=True,
                              env=env, stdin=subprocess.DEVNULL)
        assert done.returncode == 2, (argv, done.stderr)
        assert unit.calls()[-1] == {"argv": argv, "rc": 2, "hook": "hooks/update-status"}
    assert unit.status() == ("blocked", "a message\nwith a newline")
    # Action results keep Juju's nesting; a key Juju refuses fails the call.
    action_env = unit.action_environ("pause")
    for key, value in action_env.items():
        monkeypatch.setenv(key, value)
    assert hookcmds.action_get() == {"force": False}
    hookcmds.action_set({"a": {"b": "c"}, "d": "e"})
    with pytest.raises(hookcmds.Error):
        hookcmds.action_set({"Upper": "x"})
    hookcmds.action_log("-starts with a dash")
    hookcmds.action_fail("why")
    record = unit.action_record(action_env)
    assert (record["results"], record["failed"], record["log"]) == (
        {"a": {"b": "c"}, "d": "e"}, "why", ["-starts with a dash"])


def test_a_charm_stored_without_its_executable_bit_fails_every_hook(packed, tmp_path, root, tools):
    """The fault this file exists for: what a unit does with a non-executable entrypoint."""
    unit = _unit(packed, tmp_path, root, tools)
    (unit.charm_dir / "src/charm.py").chmod(0o644)
    done = unit.hook("install")
    # sh's exec cannot run it (126): the interpreter never starts, no hook tool is called.
    assert done.returncode == 126, done.explain()
    assert "Permission denied" in done.stderr
    assert unit.calls() == []


# -- juju refresh --switch from the upstream charm, then a reboot -----------------------------

SWITCH_VFS = ("0000:41:00.4", "0000:41:00.5")
SWITCH_MAPPING = {"nvidia-474": list(SWITCH_VFS)}
HELD = {"5b1c3e2a-8d4f-4a6b-9c7d-0e1f2a3b4c51": ("instance-00000011", SWITCH_VFS[0], running_guest),
        "5b1c3e2a-8d4f-4a6b-9c7d-0e1f2a3b4c52": ("instance-00000012", SWITCH_VFS[1], defined_guest)}


def test_a_switch_from_the_upstream_charm_then_a_reboot(packed, tmp_path, root, tools, packages,
                                                         caplog):
    """A switch from the upstream charm on a host with guests, then a reboot.

    Two A100s on caracal (Nova 29) under the upstream charm, its mapping on the first one's VFs,
    a running and a shut-off guest holding mdevs there: upstream's state, data and files
    (unit_tests/upstream.py) taken over by upgrade-charm; after a reboot exactly one unit
    restores, every guest's mdev comes back once with its UUID, and only the mapped GPU's VFs.
    """
    from vgpu import driver, mdevs
    from vgpu import upstream as leftovers

    host = a100_host(root, gpus=2, vfs=4)  # the VFs of both: upstream ran sriov-manage -e ALL
    driver.install(driver.inspect_deb(packages["old"]))  # its apt_install of the resource
    host.install_sriov_manage()
    for name in (MGR, VGPUD):
        tools.set_active(name)
    for uuid, (domain, vf, guest) in HELD.items():
        host.add_mdev(vf, "nvidia-474", uuid)
        guest(root, domain, f"aaaaaaaa-bbbb-4ccc-8ddd-{uuid[-12:]}", mdev_uuid=uuid)
    upstream.leave_files(root, SWITCH_MAPPING)
    unit = _unit(packed, tmp_path, root, tools)
    upstream.save_stored_state(unit.charm_dir, upstream.stored_state(packages["old"]))
    unit.attach(RESOURCE, packages["old"])  # the resource stays attached across the switch
    unit.configure(vgpu_device_mappings="{'nvidia-474': ['0000:41:00.4', '0000:41:00.5']}")
    juju_info = unit.relate("juju-info", 5, "nova-compute")
    nova_vgpu = unit.relate("nova-vgpu", 7, "nova-compute")
    for relation in (juju_info, nova_vgpu):
        unit.join(relation, PRINCIPAL)
    unit.left_by_another_charm(nova_vgpu, upstream.relation_data(SWITCH_MAPPING))
    assert principal.services(unit.relation_data(nova_vgpu)) == {MGR}
    tools.log.write_text("")

    # Juju runs upgrade-charm, then config-changed, on the new charm.
    upgraded = ok(unit.hook("upgrade-charm"))
    ok(unit.hook("config-changed"))
    assert leftovers.found() == []
    assert not (root / leftovers.BLACKLIST).exists() and kernel.blacklist_path().is_file()
    assert "update-initramfs -u" not in tools.calls()  # the initramfs has the same lines already
    status, message = upgraded.statuses()[-1]
    assert status == "active", message
    assert message.startswith("2 GPUs (A100 PCIe 40GB), nvidia-474 on 2; nvidia-474: 2 used"), \
        message
    assert message.endswith(
        "; nvidia-vgpu-mgr left nova-compute's services: its pause and openstack-upgrade no longer "
        "stop it; this unit's pause and resume do; removed the upstream charm's "
        "systemd-mdev-workaround.service, /opt/initialise_nova_mdevs.sh, /opt/remediate-nova-mdevs: "
        "nvidia-vgpu-vfs.service alone restores VFs and mdevs at boot, for the GPUs "
        "vgpu-device-mappings selects"), message
    removed = [e for e in unit.log() if "removed the upstream charm's" in e["message"]]
    assert len(removed) == 1  # said once
    data = unit.relation_data(nova_vgpu)
    assert principal.services(data) == set()
    assert principal.release_packages(data, "queens").install == {"nvidia-vgpu-ubuntu-570"}
    conf = nova_conf(data)
    assert "[devices]\nenabled_mdev_types = nvidia-474\n" in conf
    assert "[mdev_nvidia-474]\ndevice_addresses = 0000:41:00.4,0000:41:00.5\n" in conf
    # ops' own storage: the upstream charm's StoredState is this charm's, read and extended.
    stored = upstream.load_stored_state(unit.charm_dir)
    assert stored["is_started"] is True and stored["paused"] is False
    assert [m.uuid for m in mdevs.load()] == sorted(HELD)
    assert not [e for e in unit.log() if e["level"] in ("WARNING", "ERROR")]

    # The reboot: mdevs, VFs and running domains gone; systemd starts what is enabled.
    host.reboot()
    tools.log.write_text("")
    caplog.set_level("INFO", logger="vgpu.boot")
    assert upstream.start_at_boot(root) == [(sriov.UNIT, 0)]
    assert [c for c in tools.calls() if c.startswith("sriov-manage")] == [
        "sriov-manage -e 0000:41:00.0"]  # the mapped GPU only: never ALL
    assert not [c for c in tools.calls() if "nova_mdevs" in c or "remediate" in c]
    assert not (root / "sys/bus/pci/devices/0000:61:00.0/virtfn0").exists()
    settle_mdevs()
    for uuid, (_, vf, _) in HELD.items():
        device = (root / "sys/bus/mdev/devices" / uuid).resolve()
        assert (device.parent.name, (device / "mdev_type").resolve().name) == (vf, "nvidia-474")
    assert "mdevs: created 2, there already 0, of 2" in caplog.messages
    started = ok(unit.hook("start"))
    assert started.statuses()[-1][0] == "active"
    assert "upstream" not in started.statuses()[-1][1]


def test_a_unit_the_upstream_charm_paused_stays_paused_through_the_switch(unit, v100, root, tools,
                                                                          packages):
    """A unit the upstream charm paused stays paused until resume.

    Its StoredState, written with ops' own storage where ops keeps it, says is_paused: its
    pre-series-upgrade stopped, disabled and masked nvidia-vgpu-mgr.
    """
    from vgpu import driver

    driver.install(driver.inspect_deb(packages["old"]))
    tools.set_active(MGR, False)
    tools.set_state(f"{MGR}.enabled", "masked")
    upstream.save_stored_state(unit.charm_dir, upstream.stored_state(packages["old"], paused=True))
    unit.attach(RESOURCE, packages["old"])
    unit.configure(vgpu_device_mappings=V100_MAPPING)
    nova_vgpu = unit.relate("nova-vgpu", 7, "nova-compute")
    unit.join(nova_vgpu, PRINCIPAL)
    unit.left_by_another_charm(nova_vgpu, upstream.relation_data({"nvidia-108": ["0000:c1:00.0"]}))
    tools.log.write_text("")
    for hook in ("upgrade-charm", "config-changed", "update-status"):
        assert ok(unit.hook(hook)).statuses()[-1] == PAUSED
    assert not [c for c in tools.calls() if c.startswith(("systemctl start", "systemctl unmask"))]
    stored = upstream.load_stored_state(unit.charm_dir)
    assert (stored["paused"], stored["masked"], stored["is_paused"]) == (True, [MGR], False)
    assert ok_action(unit, "resume").results == {"started": MGR}
    assert tools.enabled(MGR) == "enabled"
    status, message = ok(unit.hook("update-status")).statuses()[-1]
    assert status == "active", message


def test_a_shared_build_directory_is_one_per_session_and_held_by_one_worker_at_a_time(
        tmp_path, monkeypatch):
    import fcntl

    worker = tmp_path / "pytest-7" / "popen-gw1"  # what xdist makes each worker's basetemp
    worker.mkdir(parents=True)
    factory = SimpleNamespace(getbasetemp=lambda: worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    with packing.shared(factory, "made-charms") as path:
        assert path == tmp_path / "pytest-7" / "made-charms"  # beside every worker's own
        with open(path / ".lock") as other:  # another worker's try: refused while held
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with open(path / ".lock") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    with packing.shared(factory, "made-charms") as path:
        assert path == worker / "made-charms"  # one process: the session's own directory
