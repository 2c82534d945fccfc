"""The drain plan (vgpu.drain): live and cold moves, spread, whole GPUs, peers' text as data.

Records are what ``vgpu.fleet`` encodes and decodes, as peers publish them.
Nova's rules the plan follows are cited in src/vgpu/drain.py.
"""

import json
import shlex

import pytest

from vgpu import drain, fleet

APP = "nova-compute-nvidia-vgpu"
OLD, NEW = "570.158.02", "570.172.08"
H200 = fleet.GpuRecord("0000:c1:00.0", "0x2335", 141, "vfio", False, "nvidia-1200",
                       "H200X-35C", 4, resource_class="CUSTOM_NVIDIA_1200", tag=drain.TRUE)
WHOLE = fleet.GpuRecord("0000:e1:00.0", "0x2335", 141, "", whole=True,
                        resource_class="CUSTOM_GPU_H200")
READY = fleet.Readiness(vfio_live_migration=True, live_migration=True)
OFF = fleet.Readiness(vfio_live_migration=True, live_migration=False,
                      blockers=("nova-compute has live migration off (enable-live-migration)",))
INSTANCE = "11111111-1111-4111-8111-111111111111"
GUEST = drain.Guest(INSTANCE, True, "nvidia-1200", "H200X-35C", "0000:c1:00.0", "vfio",
                    request=drain.TRUE)


def record(host="gpu-1", driver=OLD, gpus=(H200,), paused=False, readiness=READY):
    return fleet.Record(host, "12", driver, paused, "ok", readiness, tuple(gpus))


def unit(n):
    return f"{APP}/{n}"


def plan_of(*others, guests=(GUEST,), verdict=None, me=None, own_gpus=None, mine=0):
    records = [me or record(host="gpu-0")] + list(others)
    found = fleet.peers({unit(n): fleet.encode(r) for n, r in enumerate(records)})
    if mine:  # the draining unit is another one than unit 0
        found = fleet.peers({unit(n if n else mine): fleet.encode(r)
                             for n, r in enumerate(records)})
    results = drain.drain_plan(unit(mine), found, guests, verdict, own_gpus=own_gpus)
    return results, json.loads(results["plan"])


def guests(n, **fields):
    return [GUEST._replace(instance=f"{i:08d}-1111-4111-8111-111111111111", **fields)
            for i in range(n)]


# -- 1: live and cold are different moves ---------------------------------------------------

def test_a_shut_off_guest_moves_cold_to_an_upgraded_host_not_ready_for_live_migration():
    results, plan = plan_of(record(host="gpu-1", driver=NEW, readiness=OFF),
                            guests=(GUEST._replace(running=False),),
                            me=record(host="gpu-0", readiness=OFF))
    entry = plan["guests"][0]
    assert (entry["move"], entry["destinations"]) == ("cold", [unit(1)])
    assert entry["why"] == "shut off: a cold move carries no vGPU state"
    command = results["table"]
    assert f"openstack server migrate --host gpu-1 {INSTANCE}" in command
    assert "the guest stops" in command and f"openstack server resize confirm {INSTANCE}" in command


def test_nova_defaults_live_migration_off_every_running_guest_moves_cold_and_says_why():
    _, plan = plan_of(record(host="gpu-1", readiness=OFF), me=record(host="gpu-0", readiness=OFF))
    entry = plan["guests"][0]
    assert entry["move"] == "cold" and entry["destinations"] == [unit(1)]
    assert entry["why"] == ("this host is not ready to live-migrate: nova-compute has live "
                            "migration off (enable-live-migration)")
    assert plan["unplaceable"] == 0


def test_a_live_destination_needs_the_same_board_type_unpaused_ready_and_driver():
    _, plan = plan_of(
        record(host="gpu-1"),                                             # 1: live
        record(host="gpu-2", driver="570.100.01"),                        # 2: cold only
        record(host="gpu-3", gpus=(H200._replace(memory_gb=94),)),        # 3: cold only
        record(host="gpu-4", gpus=(H200._replace(type_id="nvidia-1201"),)),  # 4: no
        record(host="gpu-5", paused=True),                                # 5: no
        record(host="gpu-6", readiness=OFF),                              # 6: cold only
    )
    entry = plan["guests"][0]
    assert entry["move"] == "live" and entry["destinations"] == [unit(1)]
    assert sorted(entry["then-cold"]) == [unit(2), unit(3), unit(6)]
    _, plan = plan_of(record(host="gpu-2", driver=NEW), record(host="gpu-3", readiness=OFF),
                      record(host="gpu-4", gpus=(H200._replace(type_id="nvidia-1201"),)),
                      record(host="gpu-5", paused=True))
    entry = plan["guests"][0]
    assert entry["move"] == "cold" and set(entry["destinations"]) == {unit(1), unit(2)}
    assert entry["destinations"][0] == unit(1)  # on the newest driver: it never moves again
    assert entry["why"].startswith("no host takes it live: ")


@pytest.mark.parametrize("other, why", [
    (record(host="gpu-1", readiness=OFF), "not ready to live-migrate"),
    (record(host="gpu-1", gpus=(H200._replace(memory_gb=94),)), f"another board than {H200.board}"),
    (record(host="gpu-1", driver=NEW), f"driver {NEW}, not {OLD}"),
    (record(host="gpu-1", driver=""), f"driver none, not {OLD}"),
])
def test_the_only_host_that_takes_it_cold_says_why_not_live(other, why):
    _, plan = plan_of(other)
    entry = plan["guests"][0]
    assert (entry["move"], entry["destinations"]) == ("cold", [unit(1)])
    assert entry["why"] == f"no host takes it live: {why}"


def test_a_host_without_a_driver_is_named_so_and_nvidias_none_verdict_is_said():
    _, plan = plan_of(record(host="gpu-1"), me=record(host="gpu-0", driver=""))
    assert plan["guests"][0]["why"] == f"no host takes it live: driver {OLD}, not none"
    with_metadata = (GUEST._replace(metadata="vgpu-state"),)
    _, plan = plan_of(record(host="gpu-1", gpus=(H200._replace(metadata="gpu-state"),)),
                      guests=with_metadata, verdict=lambda vgpu, gpu: fleet.NONE)
    assert plan["guests"][0]["why"] == "no host takes it live: NVIDIA's verdict: not live"


def test_without_nvidias_verdict_a_running_guest_goes_cold_once_to_an_upgraded_host():
    """Issue 40.1: a live move to a host left on the old driver only delays the stop."""
    _, plan = plan_of(record(host="gpu-1"), record(host="gpu-2", driver=NEW))
    entry = plan["guests"][0]
    assert (entry["move"], entry["destinations"], entry["or-live"]) == (
        "cold", [unit(2)], [unit(1)])
    assert "it stops once whichever way" in entry["why"]


def test_nvidias_live_verdict_moves_a_guest_forward_once():
    mine = GUEST._replace(metadata="VGPU")
    answers = {("VGPU", "NEWGPU"): fleet.LIVE, ("VGPU", "OLDGPU"): fleet.LIVE}
    _, plan = plan_of(record(host="gpu-1", gpus=(H200._replace(metadata="OLDGPU"),)),
                      record(host="gpu-2", driver=NEW, gpus=(H200._replace(metadata="NEWGPU"),)),
                      guests=(mine,), verdict=lambda a, b: answers.get((a, b)))
    entry = plan["guests"][0]
    assert entry["move"] == "live" and entry["destinations"] == [unit(2), unit(1)]


def test_nvidias_none_verdict_is_never_a_live_destination_but_still_a_cold_one():
    mine = GUEST._replace(metadata="VGPU")
    _, plan = plan_of(record(host="gpu-1", gpus=(H200._replace(metadata="GPU"),)),
                      guests=(mine,), verdict=lambda a, b: fleet.NONE)
    entry = plan["guests"][0]
    assert entry["move"] == "cold" and entry["destinations"] == [unit(1)]
    assert "NVIDIA's verdict" in entry["why"]


@pytest.mark.parametrize("request_, tags, expected", [
    (drain.TRUE, (drain.TRUE, drain.NO_TAG), [1]),
    (drain.FALSE, (drain.TRUE, drain.NO_TAG), []),  # Nova keeps only pools tagged false
    (drain.NO_TAG, (drain.TRUE, drain.NO_TAG), [1, 2]),
    (drain.UNKNOWN, (drain.TRUE, drain.NO_TAG), [1]),  # true or none: a host tagged true takes both
])
def test_a_vfio_guest_goes_only_where_novas_pci_filter_lets_its_request(request_, tags, expected):
    _, plan = plan_of(*(record(host=f"gpu-{n + 1}", readiness=OFF, gpus=(H200._replace(tag=t),))
                        for n, t in enumerate(tags)),
                      guests=(GUEST._replace(running=False, request=request_),))
    assert sorted(plan["guests"][0]["destinations"]) == [unit(n) for n in expected]


def test_a_guest_that_booted_before_the_host_published_live_migratable_moves_cold():
    _, plan = plan_of(record(host="gpu-1"), guests=(GUEST._replace(request=drain.UNKNOWN),))
    entry = plan["guests"][0]
    assert entry["move"] == "cold" and entry["destinations"] == [unit(1)]
    assert "started before this host published its VFs live_migratable" in entry["why"]
    assert "resize to a flavor whose alias is live_migratable" in entry["why"]


def test_an_mdev_guest_has_no_pci_request_to_match():
    mdev = H200._replace(framework="mdev", tag="", resource_class="VGPU")
    _, plan = plan_of(record(host="gpu-1", gpus=(mdev,)), me=record(host="gpu-0", gpus=(mdev,)),
                      guests=(GUEST._replace(framework="mdev", request=drain.UNKNOWN),))
    assert plan["guests"][0]["move"] == "live"


# -- 2: spread, not a pile -----------------------------------------------------------------

def test_first_choices_spread_over_equal_hosts_and_each_guest_has_an_ordered_list():
    _, plan = plan_of(record(host="gpu-1"), record(host="gpu-2"), guests=guests(4))
    firsts = [g["destinations"][0] for g in plan["guests"]]
    assert sorted(firsts) == [unit(1), unit(1), unit(2), unit(2)]
    assert all(sorted(g["destinations"]) == [unit(1), unit(2)] for g in plan["guests"])


def test_first_choices_follow_capacity():
    two = (H200, H200._replace(address="0000:c2:00.0"))
    _, plan = plan_of(record(host="gpu-1", gpus=two), record(host="gpu-2"), guests=guests(6))
    firsts = [g["destinations"][0] for g in plan["guests"]]
    assert (firsts.count(unit(1)), firsts.count(unit(2))) == (4, 2)  # 8 against 4


def test_no_host_is_given_more_first_choices_than_its_capacity():
    small = H200._replace(most=1)
    _, plan = plan_of(record(host="gpu-1", gpus=(small,)), record(host="gpu-2"), guests=guests(5))
    firsts = [g["destinations"][0] for g in plan["guests"]]
    assert firsts.count(unit(1)) == 1 and firsts.count(unit(2)) == 4


def test_drains_of_different_hosts_start_their_rotation_at_different_hosts():
    hosts = [record(host=f"gpu-{n}") for n in range(4)]
    firsts = set()
    for mine in range(4):
        found = fleet.peers({unit(n): fleet.encode(r) for n, r in enumerate(hosts)})
        plan = json.loads(drain.drain_plan(unit(mine), found, [GUEST])["plan"])
        firsts.add(plan["guests"][0]["destinations"][0])
    assert len(firsts) == 4


def test_the_plan_says_to_take_the_next_destination_when_nova_finds_one_full():
    results, _ = plan_of(record(host="gpu-1"), record(host="gpu-2"))
    assert "use its next destination" in results["summary"]


# -- 3: whole GPUs --------------------------------------------------------------------------

def test_a_whole_gpu_guest_moves_cold_to_the_same_board_given_whole():
    whole = drain.Guest("22222222-2222-4222-8222-222222222222", True, "", "", "0000:e1:00.0",
                        "", whole=True)
    _, plan = plan_of(record(host="gpu-1", gpus=(H200, WHOLE)),
                      record(host="gpu-2", gpus=(WHOLE._replace(device_id="0x2330", memory_gb=80),)),
                      record(host="gpu-3", gpus=(H200,)),
                      me=record(host="gpu-0", gpus=(H200, WHOLE)), guests=(whole,))
    entry = plan["guests"][0]
    assert entry == {"instance": whole.instance, "type": "whole GPU 0x2335/141GB",
                     "state": "running", "move": "cold", "destinations": [unit(1)],
                     "why": "on a whole GPU, which never moves live"}
    assert plan["blocks-upgrade"] == 1


# -- 6: text from peers is data --------------------------------------------------------------

def test_a_host_name_that_is_not_one_is_refused_and_never_printed_into_a_command():
    evil = "gpu-1 $(curl x|sh) #"
    results, plan = plan_of(record(host=evil), record(host="gpu-2"))
    assert plan["guests"][0]["destinations"] == [unit(2)]
    assert "$(curl" not in results["table"]
    found = fleet.peers({unit(0): fleet.encode(record(host=evil))})
    assert any("not a host name (RFC 1123)" in i for i in fleet.inconsistencies(found))


def test_every_command_quotes_what_it_prints():
    odd = "11111111-1111-4111-8111-11111111111'"
    results, _ = plan_of(record(host="gpu-1"), guests=(GUEST._replace(instance=odd),))
    line = next(r for r in results["table"].splitlines() if "openstack" in r)
    command = line[line.index("openstack"):]
    assert shlex.split(command)[-1] == odd


# -- 7: big hosts ------------------------------------------------------------------------------

def test_guests_on_the_17th_gpu_are_placed_from_the_hosts_own_facts():
    many = tuple(H200._replace(address=f"0000:{n + 1:02x}:00.0") for n in range(20))
    me = record(host="gpu-0", gpus=many)
    late = GUEST._replace(gpu="0000:14:00.0")
    _, plan = plan_of(record(host="gpu-1"), me=me, guests=(late,))
    assert plan["guests"][0]["destinations"] == []  # the record keeps 16 GPUs only
    _, plan = plan_of(record(host="gpu-1"), me=me, guests=(late,), own_gpus=many)
    assert plan["guests"][0]["destinations"] == [unit(1)]
