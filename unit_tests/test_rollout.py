"""A whole driver rollout over six units, played end to end as docs/how-to/upgrade-driver.md says.

Each unit is a host root of its own (sysfs-shaped, unit_tests/fakehost.py): one
L40S whose VFs hold L40S-12Q vGPUs (VFIO, four per GPU) and one L40S given
whole, with libvirt's guest files (running and shut off, vGPU and whole GPU).
Units are drained in order, each by its own plan, built by the plan's own code
from what each host publishes (``vgpu.fleet.gpu_records`` of its sysfs and
published sections) and the guests the drain-plan action reads from the
draining host (``src/fleet.py``'s ``_guests``, through ``vgpu.usage`` and
``vgpu.guests``). Each move is applied to the guest files: the guest's files go,
its VF is freed on the source, and a free VF of the destination takes the type
and the guest (a full destination is skipped for the next one, as Nova's
scheduler refuses it). The host is then upgraded and the next one drained.

Played with and without NVIDIA's LIVE verdict across the two driver versions
(``nvmlGetVgpuCompatibility``, stood in here by a function of the metadata's
board and driver: NVML itself is unit_tests/test_nvml.py's and test_fleet.py's).
The figures printed (``pytest -s``) are the ones docs/how-to/upgrade-driver.md gives.
"""

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from fleet import _guests
from unit_tests.fakehost import FakeHost
from unit_tests.libvirt import defined_guest, running_guest
from vgpu import drain, fleet, pci

APP = "nova-compute-nvidia-vgpu"
OLD, NEW = "570.158.02", "570.172.08"
L40S, TYPE, NAME = "0x26b9", 1139, "NVIDIA L40S-12Q"
VGPU_GPU, WHOLE_GPU = "0000:c1:00.0", "0000:e1:00.0"
VFS, MOST = 8, 4  # VFs of the vGPU GPU; L40S-12Q per L40S (48 GB / 12 GB)
READY = fleet.Readiness("10.0.0", "8.2.2", True, False, (), True)
UNITS = 6
# Guests at the start: (host, kind, running). 14 vGPU guests (of 24 places), 3 whole GPUs (of 6).
START = [(0, "vgpu", True), (0, "vgpu", True), (0, "vgpu", False), (0, "whole", True),
         (1, "vgpu", True), (1, "vgpu", False), (1, "whole", False),
         (2, "vgpu", True), (2, "vgpu", True), (2, "vgpu", True),
         (3, "vgpu", True), (3, "whole", True),
         (4, "vgpu", True), (4, "vgpu", False),
         (5, "vgpu", True), (5, "vgpu", True), (5, "vgpu", True)]


def vf(n):
    return f"0000:c1:00.{n + 4}" if n < 4 else f"0000:c1:01.{n - 4}"


class Host:
    """One unit's host root: its GPUs, its guest files, its driver."""

    def __init__(self, root: Path, number: int):
        self.root, self.number, self.driver = root, number, OLD
        fake = FakeHost(root)
        fake.add_gpu(VGPU_GPU, device=L40S, totalvfs=VFS)
        for n in range(VFS):  # the charm gives MOST VFs the mapped type; they keep it, idle or used
            fake.add_vf(VGPU_GPU, n, vf(n), vfio_types={} if n < MOST else {TYPE: NAME},
                        current_type=TYPE if n < MOST else 0)
        fake.add_gpu(WHOLE_GPU, device=L40S, driver="vfio-pci")

    @property
    def unit(self):
        return f"{APP}/{self.number}"

    def __enter__(self):
        self._before = os.environ.get("VGPU_HOST_ROOT")
        os.environ["VGPU_HOST_ROOT"] = str(self.root)
        return self

    def __exit__(self, *_):
        os.environ["VGPU_HOST_ROOT"] = self._before or ""

    # -- the guest files ------------------------------------------------------------------
    def _nvidia(self, address):
        return self.root / "sys/bus/pci/devices" / address / "nvidia"

    def free_vf(self):
        for n in range(VFS):
            if (self._nvidia(vf(n)) / "current_vgpu_type").read_text().strip() == str(TYPE) \
                    and vf(n) not in self.held():
                return vf(n)
        return None

    def held(self):
        return {line for path in self.root.glob("etc/libvirt/qemu/*.xml")
                for line in _addresses(path.read_text())}

    def place(self, uuid, running, whole):
        """A guest arrives: a free VF takes the type (or the whole GPU); False when full."""
        if whole:
            if WHOLE_GPU in self.held():
                return False
            address = WHOLE_GPU
        else:
            address = self.free_vf()
            if address is None:
                return False
        name = f"instance-{uuid[:8]}"
        if running:
            running_guest(self.root, name, uuid, pci_address=address)
            (self.root / "run/libvirt/qemu" / f"{name}.pid").write_text("4242\n")
        else:
            defined_guest(self.root, name, uuid, pci_address=address)
        return True

    def remove(self, uuid):
        """A guest leaves: its files go; its VF keeps the type, idle (as the charm keeps it)."""
        name = f"instance-{uuid[:8]}"
        for part in ("run/libvirt/qemu", "etc/libvirt/qemu"):
            for suffix in (".xml", ".pid"):
                (self.root / part / f"{name}{suffix}").unlink(missing_ok=True)

    def guests(self):
        return {p.stem: p for p in self.root.glob("etc/libvirt/qemu/*.xml")}

    # -- what it publishes ----------------------------------------------------------------
    def record(self, limit=fleet.MAX_GPUS):
        with self:
            found = pci.discover()
            vfs = [vf(n) for n in range(MOST)]
            mapping = {"CUSTOM_NVIDIA_1139": vfs, "CUSTOM_GPU_L40S": [WHOLE_GPU]}
            sections = {"pci": [["device_spec", json.dumps(
                {"address": a, "live_migratable": "yes", "resource_class": "CUSTOM_NVIDIA_1139"})]
                for a in vfs] + [["report_in_placement", "True"]]}
            metadata = {VGPU_GPU: f"{L40S}@{self.driver}"}
            gpus = fleet.gpu_records(found, mapping, metadata, fleet.published(sections),
                                     limit=limit)
        return fleet.Record(f"gpu-{self.number}", "12", self.driver, False, "ok", READY, gpus,
                            len(gpus))


def _addresses(xml):
    import re

    out = set()
    for bus, slot, fn in re.findall(r"<address domain='0x0000' bus='0x(..)' slot='0x(..)' "
                                    r"function='0x(.)'", xml):
        out.add(f"0000:{bus}:{slot}.{fn}")
    return out


def nvidia(live_across_versions):
    """NVIDIA's verdict as NVML gives it: LIVE for the same board on the same driver.

    Across the two versions only where ``live_across_versions`` (a later driver that
    takes the earlier one's migration data).
    """
    def verdict(vgpu, gpu):
        (board, source), (there, target) = vgpu.split("@"), gpu.split("@")
        if board != there:
            return fleet.NONE
        if source == target or (live_across_versions and target >= source):
            return fleet.LIVE
        return fleet.NONE
    return verdict


def play(tmp_path, live_across_versions):
    hosts = [Host(tmp_path / f"host-{n}", n) for n in range(UNITS)]
    uuids = []
    for i, (number, kind, running) in enumerate(START):
        uuid = f"{i:08x}-0000-4000-8000-000000000000"
        uuids.append(uuid)
        with hosts[number]:
            assert hosts[number].place(uuid, running, kind == "whole")
    kinds = {u: kind for u, (_, kind, _) in zip(uuids, START)}
    ran = {u: running for u, (_, _, running) in zip(uuids, START)}
    moves = {u: [] for u in uuids}
    refused_full = 0
    verdict = nvidia(live_across_versions)
    for me in hosts:  # the guide's order: one host at a time, each drained by its own plan
        units = fleet.peers({h.unit: fleet.encode(h.record()) for h in hosts})
        records = {p.unit: p.record for p in units}
        with me:
            own = me.record(limit=None)
            here = SimpleNamespace(pci=pci.discover(), loaded_driver_version=me.driver)
            found = [g._replace(metadata=f"{L40S}@{me.driver}") if g.running and not g.whole
                     else g for g in _guests(here, own)]
        results = drain.drain_plan(me.unit, units, found, verdict, own_gpus=own.gpus)
        plan = json.loads(results["plan"])
        assert plan["unplaceable"] == 0, results["summary"]
        firsts = [g["destinations"][0] for g in plan["guests"]]
        for unit in set(firsts):  # no host is asked for more than its capacity
            capacity = {"vgpu": MOST, "whole": 1}
            for kind in capacity:
                asked = sum(1 for g in plan["guests"] if g["destinations"][0] == unit
                            and kinds[g["instance"]] == kind)
                assert asked <= capacity[kind], (unit, kind, asked)
        for entry in plan["guests"]:
            check_live(entry, me, own, records, kinds, ran, verdict)
            move, skipped = apply(entry, me, {h.unit: h for h in hosts}, kinds, ran)
            refused_full += skipped
            moves[entry["instance"]].append(move)
        with me:
            assert me.guests() == {}, "drained"
        me.driver = NEW  # upgraded (and rebooted): the next host is drained
    # every guest placed, once; no host over its capacity; every unit on the new driver
    placed = [name for h in hosts for name in h.guests()]
    assert sorted(placed) == sorted(f"instance-{u[:8]}" for u in uuids)
    for h in hosts:
        with h:
            assert len([a for a in h.held() if a != WHOLE_GPU]) <= MOST
    assert {h.driver for h in hosts} == {NEW}
    return moves, kinds, ran, refused_full


def check_live(entry, me, own, records, kinds, ran, verdict):
    """A live move is never given an incompatible destination."""
    uuid = entry["instance"]
    assert entry["move"] in ("live", "cold"), entry
    if entry["move"] != "live":
        return
    assert kinds[uuid] == "vgpu" and ran[uuid]
    for unit in entry["destinations"]:
        there = records[unit]
        assert there.ready() and there.gpus[0].board == own.gpus[0].board
        assert there.driver == me.driver or verdict(
            f"{L40S}@{me.driver}", there.gpus[0].metadata) == fleet.LIVE


def apply(entry, me, by_unit, kinds, ran):
    """The move applied to the guest files: (the move made, full destinations skipped)."""
    uuid = entry["instance"]
    tries = [(u, entry["move"]) for u in entry["destinations"]] + [
        (u, "cold") for u in entry.get("then-cold", [])]
    for skipped, (unit, how) in enumerate(tries):
        target = by_unit[unit]
        with target:  # Nova's scheduler refuses a full host: the next destination
            if target.place(uuid, ran[uuid], kinds[uuid] == "whole"):
                with me:
                    me.remove(uuid)
                return how, skipped
    pytest.fail(f"{uuid} found no room: {entry}")


def stops(moves, kinds, ran):
    """Cold moves of running guests (each a stop), per kind."""
    return {kind: sum(m.count("cold") for u, m in moves.items() if kinds[u] == kind and ran[u])
            for kind in ("vgpu", "whole")}


@pytest.mark.parametrize("live_across_versions", [False, True])
def test_a_rollout_over_six_units_places_every_guest(tmp_path, monkeypatch,
                                                     live_across_versions):
    monkeypatch.setenv("VGPU_HOST_ROOT", str(tmp_path))
    moves, kinds, ran, refused = play(tmp_path, live_across_versions)
    stopped = stops(moves, kinds, ran)
    cold_off = sum(m.count("cold") for u, m in moves.items() if not ran[u])
    live = sum(m.count("live") for m in moves.values())
    print(f"\nNVIDIA LIVE across versions: {live_across_versions}; live moves {live}; "
          f"stops of running vGPU guests {stopped['vgpu']}, of running whole-GPU guests "
          f"{stopped['whole']}; cold moves of shut-off guests {cold_off}; full hosts skipped "
          f"{refused}")
    for u, m in moves.items():
        print(f"  {u[:8]} {kinds[u]:5} {'running ' if ran[u] else 'shut off'} {' '.join(m)}")
    running_vgpu = [u for u in moves if kinds[u] == "vgpu" and ran[u]]
    whole_running = [u for u in moves if kinds[u] == "whole" and ran[u]]
    first = [u for u, (host, _, _) in zip(moves, START) if host == 0]
    # a whole GPU never moves live: each move of a running whole-GPU guest is a stop; it
    # goes to an upgraded host where one gives its board whole, so it moves once (twice from
    # the first host drained, which has no upgraded host to go to)
    assert stopped["whole"] == sum(len(moves[u]) for u in whole_running)
    assert all(len(m) <= (2 if u in first else 1) for u, m in moves.items())
    if live_across_versions:  # NVIDIA's verdict spares every running vGPU guest its stop
        assert stopped["vgpu"] == 0
        assert all(set(moves[u]) == {"live"} for u in running_vgpu)
    else:  # each running vGPU guest stops once, where it enters an upgraded host: no more
        assert all(moves[u].count("cold") == 1 for u in running_vgpu)
    row = (f"| {'yes' if live_across_versions else 'no'} | {len(running_vgpu)} | "
           f"{stopped['vgpu']} | {len(whole_running)} | {stopped['whole']} | "
           f"{sum(1 for u in moves if not ran[u])} | {cold_off} | {live} | {refused} |")
    guide = (Path(__file__).parents[1] / "docs/how-to/upgrade-driver.md").read_text()
    assert row in guide, f"docs/how-to/upgrade-driver.md gives other figures than: {row}"


def test_a_vfio_guest_started_before_the_tag_changed_has_an_unknown_request(tmp_path):
    """Its pid file is older than the record's ``since``: Nova kept its old PCI request."""
    host = Host(tmp_path / "host-0", 0)
    with host:
        host.place("0000000a-0000-4000-8000-000000000000", True, False)
        own = host.record(limit=None)
        here = SimpleNamespace(pci=pci.discover(), loaded_driver_version=OLD)
        (before,) = _guests(here, own)
        (after,) = _guests(here, own._replace(tag_since=int(2 ** 40) - 1))
    assert (before.request, after.request) == (drain.TRUE, drain.UNKNOWN)
