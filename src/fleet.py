# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""The fleet peer relation, wired to its events: this unit's record, the leader's view, two actions.

What is published, reported and planned is :mod:`vgpu.fleet` (plain
functions); this helper gathers its inputs and sets what it returns:

* after every hook that may change a slow fact (install, config-changed,
  upgrade-charm, start, update-status, the peer relation created, and the
  pause, resume, upgrade and enable-mig actions) it builds this unit's record
  and writes it to its databag **only when it differs** from what the
  databag holds (no StoredState copy). update-status reads nothing new: the
  boot result, the charm revision and NVML's metadata are taken from the
  databag unless it holds none or the driver changed;
* on the leader, when a peer's data changed or left (and at election), the
  application status says the fleet's most important inconsistency; a
  relation-changed on any other unit returns at once;
* ``fleet-report`` (leader) and ``drain-plan`` (any unit; reads only).

Live-migration readiness (``vgpu.fleet.Readiness``) is what
:mod:`vgpu.virt` and :mod:`vgpu.livemigration` tell the status and
list-vgpu-types: the running libvirt and QEMU versions (``virsh``, so not on
update-status, which keeps what the databag holds while the driver is the
same), nova-compute's post-copy setting and every blocker.
"""

from __future__ import annotations

import logging
import os
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
            record = self._record(before, cheap=isinstance(event, ops.UpdateStatusEvent))
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

    def _record(self, before: Optional[model.Record], cheap: bool) -> model.Record:
        """This unit's record; with ``cheap`` (update-status) what costs comes from ``before``."""
        here = self._host.facts()
        driver = here.loaded_driver_version or ""
        keep = cheap and before is not None and before.driver == driver
        if keep and before is not None:
            metadata = {g.address: g.metadata for g in before.gpus if g.metadata}
            boot, revision, readiness = before.boot, before.revision, before.readiness
        else:
            metadata = self._gpu_metadata() if driver and here.pci.gpus else {}
            boot, revision, readiness = self._boot(), self._revision(), self._readiness(here)
        mapping = reconcile.published_mapping(
            [r.data[self.model.unit] for r in self.model.relations[RELATION]])
        import socket  # only when a record is built

        return model.Record(
            host=socket.gethostname(), revision=revision, driver=driver,
            paused=bool(self._stored.paused), boot=boot, readiness=readiness,
            gpus=model.gpu_records(here.pci, mapping, metadata))

    def _readiness(self, here) -> model.Readiness:
        """Live-migration readiness as list-vgpu-types tells it (vgpu.virt); no GPUs: the option."""
        vfio = bool(self.model.config.get(LIVE_MIGRATION))
        if not here.pci.gpus:
            return model.Readiness(vfio_live_migration=vfio)
        from vgpu import virt

        found = virt.readiness_of(here, vfio, self._host.principal_conf, principal_app(self.model))
        return model.Readiness(libvirt=_version(found.libvirt), qemu=_version(found.qemu),
                               vfio_live_migration=vfio, post_copy=found.post_copy,
                               blockers=found.blockers)


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
        """Where each vGPU guest of this host could go; reads only (the host and the relation)."""
        from vgpu import catalogue, guests, nvml, pci, usage

        relation = self.model.get_relation(model.RELATION)
        try:
            here = self._host.facts()
            learnt = catalogue.load() if any(g.framework == pci.VFIO for g in here.pci.gpus) else {}
            uses = usage.in_use(here.pci, learnt=learnt, driver_version=here.loaded_driver_version)
        except HostReadError as error:
            event.fail(f"no plan: {error}")
            return
        units = self._peers(relation) if relation is not None else []
        if not any(p.unit == self.model.unit.name and p.record for p in units):
            try:  # not published yet: this unit's record as it would publish it, not written
                units = [p for p in units if p.unit != self.model.unit.name] + [model.Peer(
                    self.model.unit.name, self._record(None, cheap=False))]
            except HostReadError as error:
                event.fail(f"no plan: {error}")
                return
        found = [model.Guest(u.instance_uuid, u.state == guests.RUNNING, u.type_id, u.profile,
                             u.gpu, u.framework) for u in uses]
        try:
            verdicts = self._verdicts(found, units) if found else None
        except nvml.UnansweredError as error:  # the plan without NVIDIA's verdicts, and why
            event.log(f"{error}: the plan is made without NVIDIA's verdicts")
            verdicts, unanswered = None, str(error)
        else:
            unanswered = ""
        if verdicts is not None:
            metadata, answers = verdicts
            found = [g._replace(metadata=metadata.get(g.instance, "")) for g in found]
            event.set_results(model.drain_plan(self.model.unit.name, units, found,
                                               lambda a, b: answers.get((a, b))))
            return
        results = model.drain_plan(self.model.unit.name, units, found)
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
