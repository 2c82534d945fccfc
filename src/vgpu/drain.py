"""A host's drain plan: where each guest of its GPUs can go, live or cold, as Nova will do it.

Pure functions on plain data (the peers' :class:`vgpu.fleet.Record`, this
host's guests and GPUs); ``src/fleet.py`` gathers them and sets what
:func:`drain_plan` returns. A live move and a cold move are different moves:

**A live destination** has the same board (device id and framebuffer), the
type mapped, is not paused, is ready to live-migrate as the source is, and
runs the same vGPU host driver, or NVIDIA's own verdict says LIVE:
``nvmlGetVgpuCompatibility`` asked on this host with the running vGPU's
metadata and the destination GPU's (NVIDIA: a vGPU moves only where the
destination's driver supports its migration data; across driver versions
only where the verdict says so). The verdict is what lets a guest move
*forward* onto an already upgraded host, so those come first: the guest
moves once, not once per host left on the old driver.

**A cold destination** (a shut-off guest, or a running one Nova will not move
live: it stops, moves, and ``openstack server resize confirm`` follows) needs
the type mapped and the host not paused, on any driver: a cold move carries
no vGPU state. A VFIO guest's PCI request keeps the ``live_migratable`` value
its alias had when it booted, and Nova's PCI filter matches it against the
device spec's tag on every scheduled move, cold ones included:
``PciDeviceStats._filter_pools_for_live_migratable_devices``
(nova/pci/stats.py, Nova 31 to 2026.2): ``true`` in every spec of the request
keeps only pools tagged ``true``; ``false`` keeps only pools tagged
``false`` (untagged ones are dropped too); a request without the value is
not filtered. Only a resize to another flavor renews the request:
``API.resize`` (nova/compute/api.py) recomputes ``pci_requests`` from the new
flavor ("if the flavor is changed then we need to recalculate the
pci_requests as well"); a migration keeps the old one.

**Whole GPUs** (passthrough) never move live; they go cold to a host that
gives the same board whole.

**Spread.** Each guest gets an ordered list of destinations. First choices
go to the eligible hosts in proportion to their capacity for the type (GPUs
mapped x instances per GPU, which the record carries: it changes only with
the mapping), never more to a host than that capacity while another has
room, and drains of different hosts start their rotation at different hosts.
Guests and live capacity never go over the relation, so a destination may be
full: Nova's scheduler still checks a pinned host (``--host``) and refuses a
full one, and the plan says to use the next destination then.

**Peers' text is data.** A host name that is not one (RFC 1123) makes its
unit no destination (``vgpu.fleet`` counts it as an inconsistency), and
every value printed into a command is quoted for the shell.
"""

from __future__ import annotations

import json
import shlex
from collections import Counter
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from . import fleet
from .fleet import LIVE, NONE, GpuRecord, Peer, Record
from .record import NamedTuple

# A guest's PCI request, ``live_migratable`` (nova/pci/request.py keeps "true" or "false"),
# and what a GPU's VFs are published with.
TRUE, FALSE, NO_TAG = "true", "false", ""
UNKNOWN = "unknown"  # it booted before this host's current tag: "true" or none

MOVE_LIVE, MOVE_COLD, MOVE_NONE = "live", "cold", "none"
RENEWED_BY = ("Nova keeps the PCI request a guest booted with; only a resize to a flavor whose "
              "alias is live_migratable renews it (nova/compute/api.py, API.resize)")
FULL_HOST = ("Nova's scheduler still checks a pinned host and refuses a full one: then use its "
             "next destination")


class Guest(NamedTuple):
    """One guest of this host's GPUs: a vGPU (libvirt's XML; NVML where running) or a whole GPU."""

    instance: str  # Nova's instance UUID
    running: bool
    type_id: str  # nvidia-<n>; "" for a whole GPU
    type_name: str  # the profile; the type id when unknown
    gpu: str  # its physical GPU's address
    framework: str  # mdev, vfio; "" for a whole GPU
    metadata: str = ""  # nvmlVgpuInstanceGetMetadata of the running vGPU, base64; "" none
    request: str = UNKNOWN  # a VFIO guest's PCI request: TRUE, FALSE, NO_TAG or UNKNOWN
    whole: bool = False  # a whole GPU passed through


Verdict = Callable[[str, str], Optional[str]]  # (vGPU metadata, GPU metadata) -> LIVE/NONE


def drain_plan(me: str, units: Sequence[Peer], guests: Sequence[Guest],
               verdict: Optional[Verdict] = None,
               own_gpus: Optional[Sequence[GpuRecord]] = None) -> Dict[str, object]:
    """drain-plan's results for unit ``me`` (whose own record is among ``units``).

    ``verdict``: NVIDIA's answer for a running vGPU's metadata against a
    destination GPU's (None where NVML cannot be asked). ``own_gpus``: this
    host's GPUs from its own facts (every one: the record keeps
    :data:`vgpu.fleet.MAX_GPUS`); the record's where not given.
    """
    from . import table

    own = next((p.record for p in units if p.unit == me and p.record), None)
    if own is not None and own_gpus is not None:
        own = own._replace(gpus=tuple(own_gpus))
    others = [p for p in units if p.unit != me and p.record is not None
              and fleet.host_name(p.record.host)]
    newest = _newest([p.record for p in units if p.record is not None])
    load: Counter = Counter()
    planned: List[Dict[str, object]] = []
    rows: List[List[str]] = []
    nowhere: Counter = Counter()
    moves: Counter = Counter()
    for guest in guests:
        move, why, ranked, cold = _placement(own, guest, others, verdict, newest)
        move, why, places, alternative = _choose(me, own, guest, move, why, ranked, cold, load,
                                                 newest)
        if places:
            load[(places[0], guest.type_id or f"whole {guest.gpu}")] += 1
        if not places:
            move = MOVE_NONE
            nowhere[why] += 1
        moves[move] += 1
        name = _type_label(own, guest)
        planned.append({"instance": guest.instance, "type": name,
                        "state": "running" if guest.running else "shut off", "move": move,
                        "destinations": places, "why": why,
                        **alternative})
        rows.append([guest.instance, name, "running" if guest.running else "shut off", move,
                     ", ".join(places) or "-",
                     _command(move, _host_of(others, places[0]) if places else "", guest, why)])
    blocking = sum(1 for g in guests if g.running)
    plan: Dict[str, object] = {"guests": planned, "unplaceable": sum(nowhere.values()),
                               "blocks-upgrade": blocking}
    text = json.dumps(plan)
    while len(text.encode()) > table.MAX_VALUE_BYTES and planned:
        planned.pop()  # whole guests from the end; the table still lists them
        plan["left-out"] = len(guests) - len(planned)
        text = json.dumps(plan)
    return table.fit({
        "summary": _summary(len(guests), moves, nowhere, blocking),
        "plan": text,
        "table": table.render(["instance", "type", "state", "move", "destinations", "command"],
                              rows, what="guests", where="plan"),
    }, depth=1, records="table", what="guests")


def _choose(me: str, own: Optional[Record], guest: Guest, move: str, why: str,
            live: Sequence[_Place], cold: Sequence[_Place], load: Counter, newest: str
            ) -> Tuple[str, str, List[str], Dict[str, List[str]]]:
    """(move, why, destinations, the other kind of move's destinations) for one guest.

    Without NVIDIA's LIVE verdict onto a newer driver, a running guest reaches an
    upgraded host only by a cold move: it stops once whichever way, and a live move
    onto a host left on the old driver only delays that stop (and adds moves: the
    guests pile up on the last of those hosts). So where an upgraded host has room
    for it, it goes there cold, once; the live destinations are the alternative.
    """
    if move != MOVE_LIVE:
        places, _ = _spread(me, guest, cold, load)
        return move, why, places, {}
    forward = [p for p in live if p.rank == 0]
    if not forward and own is not None and newest and own.driver != newest:
        upgraded = [p for p in cold if p.rank == 0]
        places, room = _spread(me, guest, upgraded, load)
        if room:
            return (MOVE_COLD, f"no host on driver {newest} takes it live (NVIDIA's verdict "
                    "does not say LIVE): it stops once whichever way, and a live move to a "
                    "host left on the old driver only delays that stop",
                    places, {"or-live": [p.unit for p in live]})
    places, room = _spread(me, guest, live, load)
    if not room and cold:  # more of this drain's guests than the live destinations hold
        places, _ = _spread(me, guest, cold, load)
        return (MOVE_COLD, "the hosts that take it live have no place left for it in this "
                "drain (each holds what its record says)", places, {})
    rest = [p.unit for p in sorted(cold, key=lambda p: p.rank) if p.unit not in places]
    return MOVE_LIVE, why, places, ({"then-cold": rest} if rest else {})


# -- one guest ---------------------------------------------------------------------------

class _Place(NamedTuple):
    unit: str
    rank: int  # 0 first: forward on NVIDIA's LIVE verdict (live) or on the newest driver (cold)
    capacity: int  # the destination's capacity for the guest's type (or board, whole)


def _placement(own: Optional[Record], guest: Guest, others: Sequence[Peer],
               verdict: Optional[Verdict], newest: str
               ) -> Tuple[str, str, List[_Place], List[_Place]]:
    """(move, why, its destinations, the cold ones) for one guest, unordered, ranked."""
    here = next((g for g in own.gpus if g.address == guest.gpu), None) if own else None
    if own is None:
        return MOVE_NONE, "this unit's own record cannot be read", [], []
    if here is None:
        return MOVE_NONE, f"its GPU {guest.gpu} is not among this host's GPUs", [], []
    if guest.whole:
        found = [_Place(p.unit, 0 if newest and p.record.driver == newest else 1, n)
                 for p in others if p.record and not p.record.paused
                 for n in [sum(1 for g in p.record.gpus if g.whole and g.board == here.board)]
                 if n]
        found = found if here.memory_gb else []
        return MOVE_COLD, "on a whole GPU, which never moves live", found, found
    cold: List[_Place] = []
    live: List[_Place] = []
    reasons: Counter = Counter()
    for peer in others:
        record = peer.record
        assert record is not None
        fits = [g for g in record.gpus if g.type_id == guest.type_id and not g.whole]
        if record.paused or not fits:
            reasons["paused" if record.paused else
                    f"{guest.type_name or guest.type_id} not mapped"] += 1
            continue
        fits = [g for g in fits if guest.framework != "vfio" or _request_fits(guest.request, g.tag)]
        if not fits:
            reasons[f"its PCI request (live_migratable {guest.request or 'not set'}) does not "
                    "match the host's device specs"] += 1
            continue
        capacity = sum(g.most for g in fits) or len(fits)
        cold.append(_Place(peer.unit, 0 if newest and record.driver == newest else 1, capacity))
        why = _not_live(own, here, guest, record, fits, verdict)
        if why:
            reasons[why] += 1
        else:  # first where it moves forward, onto another (an upgraded) driver
            live.append(_Place(peer.unit, 0 if record.driver != own.driver else 1, capacity))
    stopped = _why_not_live(own, guest)
    if stopped:
        return MOVE_COLD, stopped, cold, cold
    if live:
        return MOVE_LIVE, "", live, cold
    why = reasons.most_common(1)[0][0] if reasons else "no other unit publishes"
    return MOVE_COLD, f"no host takes it live: {why}", cold, cold


def _why_not_live(own: Record, guest: Guest) -> str:
    """Why Nova will not live-migrate this guest from this host; "" where it may."""
    if not guest.running:
        return "shut off: a cold move carries no vGPU state"
    if not own.ready():
        return f"this host is not ready to live-migrate: {'; '.join(fleet.blockers(own))}"
    if guest.framework == "vfio" and guest.request != TRUE:
        return ("it started before this host published its VFs live_migratable: "
                + RENEWED_BY) if guest.request == UNKNOWN else (
            f"its PCI request is not live_migratable ({guest.request or 'not set'}): "
            + RENEWED_BY)
    return ""


def _request_fits(request: str, tag: str) -> bool:
    """Whether Nova's PCI filter lets a request with ``request`` take VFs tagged ``tag``."""
    if request == TRUE:
        return tag == TRUE
    if request == FALSE:
        return tag == FALSE
    if request == UNKNOWN:  # true or not set: a pool tagged true takes either
        return tag == TRUE
    return True


def _not_live(own: Record, here: GpuRecord, guest: Guest, there: Record,
              fits: Sequence[GpuRecord], verdict: Optional[Verdict]) -> str:
    """Why the guest cannot move live to one destination; "" where it can.

    Another driver there takes it live only on NVIDIA's LIVE verdict.
    """
    if not there.ready():
        return "not ready to live-migrate"
    same_board = [g for g in fits if g.board == here.board and g.memory_gb]
    if not same_board:
        return f"another board than {here.board}"
    if verdict is not None and guest.metadata and any(g.metadata for g in same_board):
        answers = [verdict(guest.metadata, g.metadata) for g in same_board if g.metadata]
        if LIVE in answers:
            return ""
        if NONE in answers:
            return "NVIDIA's verdict: not live"
    if there.driver != own.driver:
        return f"driver {there.driver or 'none'}, not {own.driver or 'none'}"
    return ""


# -- spread ------------------------------------------------------------------------------

def _spread(me: str, guest: Guest, places: Sequence[_Place], load: Counter
            ) -> Tuple[List[str], bool]:
    """(the ordered destinations, whether the first has room left in this drain).

    The first by weighted rotation over the best rank, then the rest. ``load``
    counts first choices given per (unit, type) in this plan (the caller adds
    the one it gives).
    """
    if not places:
        return [], False
    key = guest.type_id or f"whole {guest.gpu}"
    order = _rotation(me, [p.unit for p in places])

    def share(place: _Place) -> Tuple[int, float, int]:
        given = load[(place.unit, key)]
        return (place.rank if given < place.capacity else place.rank + 2,
                (given + 1) / max(place.capacity, 1), order.index(place.unit))

    ranked = sorted(places, key=share)
    return [p.unit for p in ranked], load[(ranked[0].unit, key)] < ranked[0].capacity


def _rotation(me: str, units: Sequence[str]) -> List[str]:
    """``units`` in unit order, starting after ``me``: each drain starts at another host."""
    ordered = sorted(set(units), key=fleet.unit_order)
    mine = fleet.unit_order(me)
    return [u for u in ordered if fleet.unit_order(u) > mine] + \
        [u for u in ordered if fleet.unit_order(u) <= mine]


# -- text -----------------------------------------------------------------------------------

def _command(move: str, host: str, guest: Guest, why: str) -> str:
    instance = shlex.quote(guest.instance)
    if move == MOVE_LIVE:
        return f"openstack server migrate --live-migration --host {shlex.quote(host)} {instance}"
    if move == MOVE_COLD:
        return (f"(the guest stops) openstack server migrate --host {shlex.quote(host)} "
                f"{instance}; once VERIFY_RESIZE: openstack server resize confirm {instance}")
    return f"none: {why}"


def _type_label(own: Optional[Record], guest: Guest) -> str:
    if not guest.whole:
        return guest.type_name or guest.type_id
    here = next((g for g in own.gpus if g.address == guest.gpu), None) if own else None
    return f"whole GPU {here.board if here else guest.gpu}"


def _summary(total: int, moves: Counter, nowhere: Counter, blocking: int) -> str:
    if not total:
        return "no guest on this host's GPUs: nothing to drain"
    said = (f"{total} guests ({blocking} running, which block the upgrade): "
            f"{moves[MOVE_LIVE]} move live, {moves[MOVE_COLD]} move cold (the guest stops)")
    if nowhere:
        why = "; ".join(f"{n}: {reason}" for reason, n in nowhere.most_common())
        said += f", {sum(nowhere.values())} have nowhere to go ({why}): agree a window"
    return f"{said}; {FULL_HOST}"


def _host_of(units: Sequence[Peer], unit: str) -> str:
    return next((p.record.host for p in units if p.unit == unit and p.record), unit)


def _newest(records: Sequence[Record]) -> str:
    """The newest driver version any unit runs ("" none)."""
    versions = {r.driver for r in records if r.driver}
    return max(versions, key=_version_key) if versions else ""


def _version_key(text: str) -> Tuple[int, ...]:
    return tuple(int(p) if p.isdigit() else -1 for p in text.split("."))

