"""The fleet peer relation through the charm (ops.testing): several units, the leader, two actions.

Other units' data is what ``vgpu.fleet`` encodes for them (or garbage, or an
older schema); NVML is the pynvml stand-in (unit_tests/fake_pynvml) put
where the charm imports pynvml.
"""

import dataclasses
import json
import sys
import time
from pathlib import Path

import pytest
from ops import testing

from unit_tests.fake_pynvml import pynvml as fake
from unit_tests.fakehost import live_migration_lines
from unit_tests.libvirt import defined_guest, running_guest
from unit_tests.test_charm import install_driver, relation
from vgpu import fleet

APP = "nova-compute-nvidia-vgpu"
MAPPED = {"vgpu-device-mappings": "{nvidia-108: all}"}
V100 = fleet.GpuRecord("0000:c1:00.0", "0x1db4", 16, "mdev", False, "nvidia-108", "V100-8Q", 2,
                       resource_class="VGPU")
GUEST = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1"


def peer_record(host, driver="570.158.02", gpus=(V100,), paused=False):
    return fleet.encode(fleet.Record(host, "12", driver, paused, "ok", fleet.Readiness(),
                                     tuple(gpus)))


def fleet_state(peers, leader=True, local=None, resource=None, config=MAPPED, paused=False):
    peer = testing.PeerRelation("fleet", peers_data=peers, local_unit_data=dict(local or {}))
    kwargs = {"config": dict(config), "relations": [relation(), peer], "leader": leader}
    if resource is not None:
        kwargs["resources"] = {testing.Resource(name="nvidia-vgpu-software", path=resource)}
    if paused:
        kwargs["stored_states"] = {testing.StoredState(
            owner_path="NovaComputeNvidiaVgpuCharm", name="_stored", content={"paused": True})}
    return testing.State(**kwargs), peer


def published(out, peer):
    return out.get_relation(peer.id).local_unit_data.get(fleet.KEY)


@pytest.fixture
def nvml(monkeypatch, tmp_path):
    """NVML on this host: the stand-in as the charm's pynvml, two V100s with their metadata."""
    return use_nvml(monkeypatch, tmp_path, {"driver": "570.158.02", "gpus": [
        {"bus_id": "00000000:C1:00.0", "metadata": "0x1db4/16", "vgpus": []},
        {"bus_id": "00000000:E1:00.0", "metadata": "0x1db4/16", "vgpus": []}]})


class FakeNvml:
    """The stand-in pynvml as the bounded child (python -m vgpu.nvml) imports it: FAKE_NVML."""

    def __init__(self, path):
        self.path = path

    def configure(self, state):
        """The host NVML describes from now on; the calls made so far forgotten."""
        self.state = state
        self.path.write_text(json.dumps(state))
        Path(f"{self.path}.calls").unlink(missing_ok=True)

    def calls(self):
        """The calls the child made since configure(), by name."""
        log = Path(f"{self.path}.calls")
        return log.read_text().splitlines() if log.exists() else []


def use_nvml(monkeypatch, where, state):
    path = where / "fake-nvml.json"
    monkeypatch.syspath_prepend(str(Path(fake.__file__).parent))
    monkeypatch.setenv("FAKE_NVML", str(path))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    fake.configure(None)
    nvml = FakeNvml(path)
    nvml.configure(state)
    return nvml


@pytest.fixture
def ready(v100, root, packages):
    """The driver installed, and nova-compute with live migration on (ready to live-migrate)."""
    install_driver(root, packages["old"])
    v100.principal_nova_conf(libvirt=live_migration_lines())
    return packages["old"]


def test_each_unit_publishes_its_record_and_the_leader_names_the_odd_driver(ctx, ready, nvml):
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1", "570.172.08")},
                            2: {fleet.KEY: peer_record("gpu-2")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    mine = fleet.decode(published(out, peer))
    assert mine.driver == "570.158.02" and not mine.paused
    assert [(g.address, g.type_id, g.board, g.most) for g in mine.gpus] == [
        ("0000:c1:00.0", "nvidia-108", "0x1db4/16GB", 2), ("0000:e1:00.0", "nvidia-108",
                                                           "0x1db4/16GB", 2)]
    assert all(g.metadata for g in mine.gpus)  # NVML's, through the stand-in
    assert out.app_status == testing.ActiveStatus(
        "driver 570.172.08 on 1 of 3 hosts: live migration between them fails")
    assert out.unit_status.name == "active"


def test_a_consistent_fleet_leaves_the_application_status_empty(ctx, ready):
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    assert out.app_status == testing.ActiveStatus("")


@pytest.mark.parametrize("held", ["", "garbage", '{"v": 0, "host": "old"}', "{" * 20_000,
                                  json.dumps({"v": 1, "gpus": "many"})])
def test_a_peer_that_cannot_be_read_never_fails_a_hook(ctx, ready, held):
    st, peer = fleet_state({1: {fleet.KEY: held} if held else {}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    out = ctx.run(ctx.on.relation_changed(out.get_relation(peer.id), remote_unit=1), out)
    assert out.app_status.message.startswith(f"{APP}/1 cannot be read: it publishes")
    ctx.run(ctx.on.action("fleet-report"), out)
    assert json.loads(ctx.action_results["inconsistencies"])[0] == out.app_status.message
    ctx.run(ctx.on.action("drain-plan"), out)
    assert ctx.action_results["summary"] == "no guest on this host's GPUs: nothing to drain"


def test_a_relation_changed_on_a_unit_that_is_not_the_leader_returns_at_once(
        ctx, ready, monkeypatch):
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, leader=False, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    before = published(out, peer)

    def no_reading():
        raise AssertionError("the host was read")

    monkeypatch.setattr("vgpu.facts.gather", no_reading)
    monkeypatch.setattr("vgpu.fleet.peers", no_reading)
    out = ctx.run(ctx.on.relation_changed(out.get_relation(peer.id), remote_unit=1), out)
    assert published(out, peer) == before


def test_update_status_reads_nothing_new_and_publishes_nothing_when_nothing_changed(
        ctx, ready, nvml, monkeypatch):
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    before = published(out, peer)
    assert "nvmlDeviceGetVgpuMetadata" in nvml.calls()
    nvml.configure(nvml.state)  # forget the calls
    writes = []
    real = fleet.encode
    monkeypatch.setattr("vgpu.fleet.encode", lambda r: writes.append(r) or real(r))
    out = ctx.run(ctx.on.update_status(), out)
    assert published(out, peer) == before  # the metadata kept
    assert nvml.calls() == []  # NVML not asked
    assert len(writes) == 1  # built once, compared, not written (the same text)


def test_pause_is_published(ctx, ready, tools):
    tools.set_active("nvidia-vgpu-mgr")
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    out = ctx.run(ctx.on.action("pause"), out)
    assert fleet.decode(published(out, peer)).paused


def test_the_report_is_the_leaders(ctx, ready):
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, leader=False, resource=ready)
    with pytest.raises(testing.ActionFailed) as failure:
        ctx.run(ctx.on.action("fleet-report"), st)
    assert failure.value.message == (f"run fleet-report on the leader: juju run {APP}/leader "
                                     "fleet-report")
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    ctx.run(ctx.on.action("fleet-report"), out)
    assert ctx.action_results["summary"] == "2 units, 3 GPUs; consistent"
    assert [line.split()[0] for line in ctx.action_results["table"].splitlines()] == [
        "unit", f"{APP}/0", f"{APP}/1"]


def test_drain_plan_lists_each_guest_with_where_it_can_go(ctx, ready, root, nvml):
    running_guest(root, "instance-0000002a", GUEST, mdev_uuid="5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f")
    from unit_tests.fakehost import FakeHost
    FakeHost(root).add_mdev("0000:c1:00.0", "nvidia-108", "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f")
    defined_guest(root, "instance-0000002b", "3d9f1c52-2a7e-4b5e-8f3a-1c2d3e4f5a6b",
                  pci_address="0000:e1:00.0")  # a whole GPU passed through: no vGPU
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")},
                            2: {fleet.KEY: peer_record("gpu-2", "570.172.08")},
                            3: {fleet.KEY: peer_record("gpu-3", paused=True)}},
                           leader=False, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    files_before = sorted(p.name for p in root.rglob("*"))
    ctx.run(ctx.on.action("drain-plan"), out)
    plan = json.loads(ctx.action_results["plan"])
    assert plan == {"guests": [
        {"instance": GUEST, "type": "V100-8Q", "state": "running", "move": "cold",
         "destinations": [f"{APP}/2"], "or-live": [f"{APP}/1"],
         "why": "no host on driver 570.172.08 takes it live (NVIDIA's verdict does not say "
                "LIVE): it stops once whichever way, and a live move to a host left on the old "
                "driver only delays that stop"},
        {"instance": "3d9f1c52-2a7e-4b5e-8f3a-1c2d3e4f5a6b", "type": "whole GPU 0x1db4/16GB",
         "state": "shut off", "move": "none", "destinations": [],
         "why": "on a whole GPU, which never moves live"}],
        "unplaceable": 1, "blocks-upgrade": 1}
    assert f"openstack server migrate --host gpu-2 {GUEST}" in ctx.action_results["table"]
    assert sorted(p.name for p in root.rglob("*")) == files_before  # it only reads


def test_drain_plan_before_the_unit_published_uses_its_record_unwritten(ctx, ready):
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, leader=False, resource=ready)
    out = ctx.run(ctx.on.action("drain-plan"), st)
    assert published(out, peer) is None
    assert ctx.action_results["summary"] == "no guest on this host's GPUs: nothing to drain"


def test_the_record_carries_the_hosts_own_live_migration_readiness(ctx, ready, tools):
    """vgpu.virt's reading (virsh, nova.conf) reaches the peers; update-status runs no virsh."""
    tools.set_virsh("9.0.0", "8.0.0")  # older than Nova's minimums for mdev guests
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    mine = fleet.decode(published(out, peer))
    assert (mine.readiness.libvirt, mine.readiness.qemu) == ("9.0.0", "8.0.0")
    assert any("libvirt 8.6.0 and QEMU 8.1.0" in b for b in mine.readiness.blockers), mine.readiness
    assert fleet.blockers(mine) == list(mine.readiness.blockers)  # each said once (qemu in it)
    calls = len([c for c in tools.calls() if c.startswith("virsh")])
    assert calls >= 1
    tools.set_virsh("10.0.0", "8.2.2")
    again = ctx.run(ctx.on.update_status(), testing.State(
        config=dict(out.config), relations=list(out.relations), leader=True,
        resources=out.resources, stored_states=out.stored_states))
    assert len([c for c in tools.calls() if c.startswith("virsh")]) == calls  # kept, not read
    assert fleet.decode(published(again, peer)).readiness == mine.readiness


def test_update_status_refreshes_readiness_from_nova_conf_and_the_plan_agrees(
        ctx, ready, root, v100, tools, nvml):
    """Issue 40.4: post-copy permitted after the record said ready, then live migration off."""
    running_guest(root, "instance-0000002a", GUEST, mdev_uuid="5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f")
    from unit_tests.fakehost import FakeHost
    FakeHost(root).add_mdev("0000:c1:00.0", "nvidia-108", "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f")
    tools.set_virsh("10.0.0", "8.2.2")
    ready_peer = fleet.encode(fleet.Record("gpu-1", "12", "570.158.02", False, "ok",
                                           fleet.Readiness(live_migration=True), (V100,)))
    st, peer = fleet_state({1: {fleet.KEY: ready_peer}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    assert fleet.decode(published(out, peer)).ready()
    virsh = len([c for c in tools.calls() if c.startswith("virsh")])
    v100.principal_nova_conf(libvirt=live_migration_lines(post_copy=True))
    out = ctx.run(ctx.on.update_status(), out)
    mine = fleet.decode(published(out, peer))
    assert not mine.ready() and any("post-copy" in b for b in fleet.blockers(mine))
    ctx.run(ctx.on.action("drain-plan"), out)
    entry = json.loads(ctx.action_results["plan"])["guests"][0]
    assert entry["move"] == "cold" and "post-copy" in entry["why"]
    assert "--live-migration" not in ctx.action_results["table"]
    v100.principal_nova_conf(libvirt=live_migration_lines())
    out = ctx.run(ctx.on.update_status(), out)
    assert fleet.decode(published(out, peer)).ready()
    ctx.run(ctx.on.action("drain-plan"), out)
    assert json.loads(ctx.action_results["plan"])["guests"][0]["move"] == "live"
    assert len([c for c in tools.calls() if c.startswith("virsh")]) == virsh  # none on update
    warnings = fleet.decode(published(out, peer)).readiness.warnings
    assert warnings and "live-migration-downtime=500000" in warnings[0]


def test_the_plan_and_the_upgrade_refusal_agree_on_which_guests_block(ctx, ready, root):
    """Issue 40.3: a running guest on a whole GPU blocks the upgrade and is in the plan."""
    running_guest(root, "instance-0000002c", "4e8a2b63-3b8f-4c6f-9a4b-2d3e4f5a6b7c",
                  pci_address="0000:e1:00.0")
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    ctx.run(ctx.on.action("drain-plan"), out)
    plan = json.loads(ctx.action_results["plan"])
    assert [(g["instance"], g["type"], g["move"]) for g in plan["guests"]] == [
        ("4e8a2b63-3b8f-4c6f-9a4b-2d3e4f5a6b7c", "whole GPU 0x1db4/16GB", "none")]  # no peer gives it whole
    assert plan["blocks-upgrade"] == 1
    from vgpu import guests, pci  # what the upgrade action's guard asks (maintenance.py's _guard_guests)

    blocking = guests.running_vgpu_guests(set(pci.discover().addresses()))
    assert [g.instance_uuid for g in blocking] == [
        g["instance"] for g in plan["guests"] if g["state"] == "running"]


def test_a_hung_nvml_costs_a_hook_and_drain_plan_its_bound_and_says_so(
        ctx, ready, root, nvml, monkeypatch):
    """nvmlInit never returns (a wedged driver): the bounded child is stopped, the rest goes on."""
    monkeypatch.setattr("vgpu.nvml.NVML_TIMEOUT", 2.0)
    nvml.configure({**nvml.state, "hang": ["nvmlInit"]})
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, leader=False, resource=ready)
    started = time.monotonic()
    out = ctx.run(ctx.on.config_changed(), st)
    assert time.monotonic() - started < 30  # the child's bound, not the driver's hang
    assert "nvmlInit" in nvml.calls()  # NVML was asked, and did not answer
    mine = fleet.decode(published(out, peer))
    assert mine.gpus and not any(g.metadata for g in mine.gpus)  # left out, the rest published
    assert out.unit_status.name == "active" and out.unit_status.message.endswith(
        "; NVML did not answer within 2s: the fleet record has no vGPU migration metadata")
    running_guest(root, "instance-0000002a", GUEST, mdev_uuid="5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f")
    from unit_tests.fakehost import FakeHost
    FakeHost(root).add_mdev("0000:c1:00.0", "nvidia-108", "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f")
    ctx.run(ctx.on.action("drain-plan"), out)
    assert ctx.action_results["nvml"] == (
        "NVML did not answer within 2s: no NVIDIA verdicts in this plan")
    assert json.loads(ctx.action_results["plan"])["guests"][0]["instance"] == GUEST


def test_an_unchanged_config_changed_asks_neither_nvml_nor_virsh_and_publishes_nothing(
        ctx, ready, nvml, tools):
    """Issue 43.1: the record's costly parts are kept from the databag.

    NVML's metadata, virsh's versions, the boot result and the revision stay while the
    driver and the GPUs are the same; a new driver asks again.
    """
    st, peer = fleet_state({1: {fleet.KEY: peer_record("gpu-1")}}, resource=ready)
    out = ctx.run(ctx.on.config_changed(), st)
    before = published(out, peer)
    assert "nvmlDeviceGetVgpuMetadata" in nvml.calls()
    virsh = len([c for c in tools.calls() if c.startswith("virsh")])
    assert virsh >= 1
    nvml.configure(nvml.state)  # forget the calls
    out = ctx.run(ctx.on.config_changed(), out)
    assert published(out, peer) == before
    assert nvml.calls() == []  # NVML not asked
    assert len([c for c in tools.calls() if c.startswith("virsh")]) == virsh  # virsh not run
    # The live-migration option is config: the record follows it without asking again.
    out = ctx.run(ctx.on.config_changed(), dataclasses.replace(
        out, config={**out.config, "vfio-live-migration": True}))
    assert fleet.decode(published(out, peer)).readiness.vfio_live_migration
    assert nvml.calls() == []
    # A record from another driver: asked again.
    held = fleet.decode(published(out, peer))
    stale = fleet.encode(held._replace(driver="535.54.03"))
    relations = [r if r.id != peer.id else dataclasses.replace(
        r, local_unit_data={**r.local_unit_data, fleet.KEY: stale}) for r in out.relations]
    out = ctx.run(ctx.on.config_changed(), dataclasses.replace(out, relations=relations))
    assert "nvmlDeviceGetVgpuMetadata" in nvml.calls()
    assert len([c for c in tools.calls() if c.startswith("virsh")]) > virsh
    assert fleet.decode(published(out, peer)).driver == "570.158.02"
