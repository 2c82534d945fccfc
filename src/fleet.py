# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""The fleet peer relation, wired to its events: this unit's record, the leader's view, two actions.

What is published, reported and planned is :mod:`vgpu.fleet` (plain
functions); this helper gathers its inputs and sets what it returns:

* after every hook that may change a slow fact (install, config-changed,
  upgrade-charm, start, update-status, the peer relation created, and the
  pause, resume, upgrade and enable-mig actions) it builds this unit's record
  and writes it to its databag **only when it differs** from what the
  databag holds (no StoredState copy). update-status and config-changed read
  nothing new: the boot result, the charm revision, NVML's metadata and the
  libvirt and QEMU versions are taken from the databag unless it holds none,
  the driver changed or the GPUs did (the other events ask again), while
  nova-compute's live-migration settings come from the nova.conf the hook reads
  anyway (so the status, the record and drain-plan agree);
* on the leader, when a peer's data changed or left (and at election), the
  application status says the fleet's most important inconsistency; a
  relation-changed on any other unit returns at once;
* ``fleet-report`` (leader) and ``drain-plan`` (any unit; reads only).

Live-migration readiness (``vgpu.fleet.Readiness``) is what
:mod:`vgpu.virt` and :mod:`vgpu.livemigration` tell the status and
list-vgpu-types: the running libvirt and QEMU versions (``virsh``, so not on
update-status, which keeps what the databag holds while the driver is the
same), nova-compute's live migration, post-copy and downtime settings, every
blocker and warning.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Dict, Optional

import ops

from vgpu import LIVE_MIGRATION, RELATION, reconcile
from vgpu import fleet as model
from vgpu.errors import HostReadError

logger = logging.getLogger(__name__)

CHARM_URL = ".juju-charm"  # Juju writes the charm's URL (with its revision) in the charm's directory
DRAIN_HINT = "; juju run {unit} drain-plan says where each guest can go"


class Fleet(ops.Object):
    """The ``fleet`` peer relation: publish, report, plan.

    ``host``: the charm's reading of the host for this dispatch; ``stored``:
    its StoredState (``paused``).
    """

    def __init__(self, charm: ops.CharmBase, host: reconcile.Host, stored: ops.BoundStoredState):
        """Observe what may change this unit's record, the peers' changes and the two actions."""
        super().__init__(charm, model.RELATION)
        self._charm = charm
        self._host = host
        self._stored = stored
        # A peer's record changed (or a peer left): nothing of this unit's host changed, so
        # the charm's status check reads nothing either (Juju keeps the status it has).
        self.quiet = False
        self.unanswered = ""  # why NVML did not answer this dispatch ("": it did, or not asked)
        on = charm.on
        for event in (on.install, on.config_changed, on.upgrade_charm, on.start, on.update_status,
                      on[model.RELATION].relation_created, on.pause_action, on.resume_action,
                      on.upgrade_action, on.enable_mig_action):
            self.framework.observe(event, self._on_publish)
        for event in (on[model.RELATION].relation_changed, on[model.RELATION].relation_departed,
                      on.leader_elected):
            self.framework.observe(event, self._on_peers)
        self.framework.observe(on.fleet_report_action, self._on_fleet_report)
        self.framework.observe(on.drain_plan_action, self._on_drain_plan)

    def notes(self) -> tuple:
        """What the active status adds: NVML did not answer for the record's metadata."""
        if not self.unanswered:
            return ()
        return (f"{self.unanswered}: the fleet record has no vGPU migration metadata",)

    # -- publishing -----------------------------------------------------------------------
    def _on_publish(self, event: ops.EventBase) -> None:
        relation = self.model.get_relation(model.RELATION)
        if relation is None:
            return
        ours = relation.data[self.model.unit]
        held = ours.get(model.KEY)
        try:
            before: Optional[model.Record] = model.decode(held)
        except model.RecordError:
            before = None
        try:
            record = self._record(before, cheap=isinstance(
                event, (ops.UpdateStatusEvent, ops.ConfigChangedEvent)))
            text = model.encode(record)
        except (HostReadError, model.RecordError) as error:
            logger.warning("fleet record not published: %s", error)
            return
        if text == held:
            return
        logger.info("publishing this unit's fleet record (%d bytes)", len(text))
        ours[model.KEY] = text
        if self.model.unit.is_leader():
            self._set_app_status(relation)

    def _record(self, before: Optional[model.Record], cheap: bool,
                limit: Optional[int] = model.MAX_GPUS) -> model.Record:
        """This unit's record; ``cheap``: what costs comes from ``before`` where it still holds.

        ``cheap`` (update-status, config-changed) keeps what ``before`` says while the
        driver and the GPUs are the ones it names.

        What costs: NVML's metadata (a Python child), libvirt's and QEMU's versions
        (virsh), the boot result and the charm's revision. Readiness is what
        nova.conf and the config decide now, read as the hook reads it (one
        reading per dispatch, :meth:`vgpu.reconcile.Host.principal_conf`); the
        GPUs' records (mapping, published sections, tags) are built anew.
        """
        here = self._host.facts()
        driver = here.loaded_driver_version or ""
        keep = cheap and before is not None and before.driver == driver and _same_gpus(
            before, here.pci)
        if keep and before is not None:
            metadata = {g.address: g.metadata for g in before.gpus if g.metadata}
            boot, revision = before.boot, before.revision
            readiness = self._readiness(here, before.readiness)
        else:
            metadata = self._gpu_metadata() if driver and here.pci.gpus else {}
            boot, revision, readiness = self._boot(), self._revision(), self._readiness(here)
        ours = [r.data[self.model.unit] for r in self.model.relations[RELATION]]
        mapping = reconcile.published_mapping(ours)
        from vgpu import novaconf

        given = model.published(novaconf.sections_from_relation(ours[0]) if ours else {})
        import socket  # only when a record is built

        gpus = model.gpu_records(here.pci, mapping, metadata, given, learnt=_learnt(here.pci),
                                 driver_version=driver, limit=limit)
        tags = sorted({(g.address, g.tag) for g in gpus})
        held = sorted({(g.address, g.tag) for g in before.gpus}) if before is not None else None
        # When this host's live_migratable tags last changed: guests started before it carry
        # the PCI request of the tag before (vgpu.drain). A first record counts as always.
        since = (before.tag_since if before is not None and held == tags
                 else 0 if before is None else int(time.time()))
        return model.Record(
            host=socket.gethostname(), revision=revision, driver=driver,
            paused=bool(self._stored.paused), boot=boot, readiness=readiness, gpus=gpus,
            gpu_count=len(here.pci.gpus), tag_since=since)

    def _readiness(self, here, before: Optional[model.Readiness] = None) -> model.Readiness:
        """Live-migration readiness as list-vgpu-types tells it (vgpu.virt); no GPUs: the option.

        ``before``: the versions come from it (no virsh); nova.conf is read as the hook reads it.
        """
        vfio = bool(self.model.config.get(LIVE_MIGRATION))
        if not here.pci.gpus:
            return model.Readiness(vfio_live_migration=vfio)
        from vgpu import livemigration, virt

        known = None
        if before is not None:
            known = (livemigration.parse_version(before.libvirt) if before.libvirt else None,
                     livemigration.parse_version(before.qemu) if before.qemu else None,
                     before.source or livemigration.UNKNOWN)
        found = virt.readiness_of(here, vfio, self._host.principal_conf, principal_app(self.model),
                                  known=known)
        return model.Readiness(libvirt=_version(found.libvirt), qemu=_version(found.qemu),
                               vfio_live_migration=vfio, post_copy=found.post_copy,
                               blockers=found.blockers, live_migration=found.live_migration,
                               warnings=found.warnings, source=found.source)

    def _gpu_metadata(self) -> Dict[str, str]:
        """NVML's migration metadata per GPU, asked in the bounded child; {} when unanswered."""
        from vgpu import nvml

        try:
            said = nvml.ask("gpu-metadata")
        except nvml.UnansweredError as error:
            logger.warning("%s: the GPUs' vGPU migration metadata is left out", error)
            self.unanswered = str(error)
            return {}
        return {k: v for k, v in (said or {}).items() if isinstance(k, str) and isinstance(v, str)}

    @staticmethod
    def _boot() -> str:
        from vgpu import bootresult

        try:
            result = bootresult.load()
        except bootresult.ResultError:
            return "unreadable"
        if result is None:
            return ""
        failed = sum(1 for gpu in result.gpus if gpu.result == "not restored")
        return f"failed on {failed} GPUs" if failed else (
            "ok" if result.status == 0 else f"exit {result.status}")

    @staticmethod
    def _revision() -> str:
        """The charm's revision from Juju's ``.juju-charm`` (``local:noble/<name>-7``); "" unknown."""
        from pathlib import Path

        from vgpu import files

        try:
            raw = files.read(Path(os.environ.get("JUJU_CHARM_DIR", "."), CHARM_URL).absolute(), 512)
        except OSError:
            return ""
        url = (raw or b"").decode("utf-8", errors="replace").strip()
        number = url.rpartition("-")[2]
        return number if number.isdigit() else ""

    # -- the leader's view ---------------------------------------------------------------
    def _on_peers(self, event: ops.EventBase) -> None:
        self.quiet = not isinstance(event, ops.LeaderElectedEvent)
        if not self.model.unit.is_leader():
            return  # a peer's record changes nothing here
        relation = self.model.get_relation(model.RELATION)
        if relation is not None:
            self._set_app_status(relation)

    def _set_app_status(self, relation: ops.Relation) -> None:
        line = model.app_status(self._peers(relation))
        if self.model.app.status.message != line or self.model.app.status.name != "active":
            self.model.app.status = ops.ActiveStatus(line)

    def _peers(self, relation: ops.Relation):
        data: Dict[str, Optional[str]] = {}
        for unit in (self.model.unit, *relation.units):
            try:
                data[unit.name] = relation.data[unit].get(model.KEY)
            except ops.ModelError as error:
                data[unit.name] = f"unreadable: {error}"
        return model.peers(data)

    # -- actions --------------------------------------------------------------------------
    def _on_fleet_report(self, event: ops.ActionEvent) -> None:
        if not self.model.unit.is_leader():
            event.fail(f"run fleet-report on the leader: juju run {self.model.app.name}/leader "
                       "fleet-report")
            return
        relation = self.model.get_relation(model.RELATION)
        if relation is None:
            event.fail("the fleet peer relation is not there yet")
            return
        event.set_results(model.report(self._peers(relation)))

    def _on_drain_plan(self, event: ops.ActionEvent) -> None:
        """Where each guest of this host's GPUs could go; reads only (the host and the relation).

        The guests are the ones the upgrade action counts (vGPUs and whole GPUs),
        running and shut off; this host's own GPUs come from its facts, every
        one (its record keeps at most ``vgpu.fleet.MAX_GPUS``).
        """
        from vgpu import drain, nvml

        relation = self.model.get_relation(model.RELATION)
        units = self._peers(relation) if relation is not None else []
        held = next((p.record for p in units if p.unit == self.model.unit.name), None)
        try:  # as published, refreshed as update-status would (no virsh, no NVML when published)
            here = self._host.facts()
            own = self._record(held, cheap=True, limit=None)
            found = _guests(here, own)
        except HostReadError as error:
            event.fail(f"no plan: {error}")
            return
        units = [p for p in units if p.unit != self.model.unit.name] + [
            model.Peer(self.model.unit.name, own)]
        try:
            verdicts = self._verdicts(found, units) if found else None
        except nvml.UnansweredError as error:  # the plan without NVIDIA's verdicts, and why
            event.log(f"{error}: the plan is made without NVIDIA's verdicts")
            verdicts, unanswered = None, str(error)
        else:
            unanswered = ""
        verdict = None
        if verdicts is not None:
            metadata, answers = verdicts
            found = [g._replace(metadata=metadata.get(g.instance, "")) for g in found]
            verdict = lambda a, b: answers.get((a, b))  # noqa: E731
        results = drain.drain_plan(self.model.unit.name, units, found, verdict, own_gpus=own.gpus)
        if unanswered:
            results = {**results, "nvml": f"{unanswered}: no NVIDIA verdicts in this plan"}
        event.set_results(results)

    @staticmethod
    def _verdicts(found, units):
        """NVML's metadata of the running vGPUs, and its verdicts on each peer GPU's.

        None where NVML cannot be asked; asked in the bounded child (``python -m vgpu.nvml
        verdicts``), so a hung driver costs the action at most its bound. UnansweredError (from
        vgpu.nvml) when the child did not answer.
        """
        from vgpu import nvml

        targets = sorted({g.metadata for p in units if p.record for g in p.record.gpus
                          if g.metadata})
        said = nvml.ask("verdicts", {"instances": sorted({g.instance for g in found}),
                                     "targets": targets})
        if not isinstance(said, dict):
            return None
        metadata = {k: v for k, v in (said.get("metadata") or {}).items()
                    if isinstance(k, str) and isinstance(v, str)}
        answers = {(a[0], a[1]): a[2] for a in said.get("answers") or ()
                   if isinstance(a, list) and len(a) == 3}
        return metadata, answers


def _same_gpus(before: model.Record, host) -> bool:
    """Whether ``before`` was made on these GPUs: as many, each it names still here."""
    if before.gpu_count != len(host.gpus):
        return False
    here = {g.address for g in host.gpus}
    return all(g.address in here for g in before.gpus)


def _learnt(host):
    """The catalogue where a VFIO GPU lists no type (every VF assigned); {} otherwise (not read)."""
    from vgpu import catalogue, pci

    if any(g.framework == pci.VFIO and g.vfs and not any(vf.types for vf in g.vfs)
           for g in host.gpus):
        return catalogue.load()
    return {}


def _guests(here, own: model.Record):
    """This host's guests as the plan takes them: each vGPU, and each GPU given whole.

    A VFIO guest's PCI request is the live_migratable tag of its GPU's VFs when
    it started after the tag last changed (``own.tag_since``), else unknown:
    its start is when libvirt wrote its pid file (``/run/libvirt/qemu/<name>.pid``).
    """
    from vgpu import catalogue, drain, guests, hostroot, pci, usage

    domains = guests.domains()
    learnt = catalogue.load() if any(g.framework == pci.VFIO for g in here.pci.gpus) else {}
    uses = usage.in_use(here.pci, domains, learnt=learnt,
                        driver_version=here.loaded_driver_version)
    tags = {g.address: g.tag for g in own.gpus}
    out = []
    for use in uses:
        request = drain.UNKNOWN
        if use.framework == pci.VFIO:
            started = _started(hostroot, guests, use.domain)
            if started is not None and started > own.tag_since:
                request = tags.get(use.gpu, "")
        out.append(drain.Guest(use.instance_uuid, use.state == guests.RUNNING, use.type_id,
                               use.profile, use.gpu, use.framework, request=request))
    whole = {g.address for g in here.pci.gpus}
    for domain in domains:
        for address in domain.pci:
            if address in whole:
                out.append(drain.Guest(domain.uuid, domain.state == guests.RUNNING, "", "",
                                       address, "", whole=True))
    return out


def _started(hostroot, guests, name: str) -> Optional[float]:
    """When libvirt started domain ``name`` (its pid file's time); None when not told."""
    try:
        return os.stat(hostroot.path(guests.STATUS_DIR) / f"{name}.pid").st_mtime
    except (OSError, ValueError):
        return None


def _version(found) -> str:
    """``10.0.0`` for (10, 0, 0); "" when unknown."""
    return ".".join(str(part) for part in found) if found else ""


def principal_app(model_: ops.Model) -> str:
    """The principal's application name: nova-vgpu's remote app, else juju-info's."""
    for endpoint in (RELATION, "juju-info"):
        for relation in model_.relations[endpoint]:
            if relation.app is not None:
                return relation.app.name
    return "nova-compute"
