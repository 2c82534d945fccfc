#!/usr/bin/env python3
# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""Juju subordinate of nova-compute: NVIDIA vGPU support for OpenStack Nova.

Event wiring only. One idempotent reconcile handler serves every lifecycle
and relation event: it gathers what only the charm knows (options, relation
data, StoredState, the attached resource) into ``vgpu.reconcile.Inputs``,
runs the steps in :mod:`vgpu.reconcile` and applies what they return
(relation data, problems, the paused flag). Status is computed in one
collect-unit-status handler; remove has its own (a subordinate has nothing to
do on stop). Each action is wired in an ops-facing helper beside this file:
``inspecting.py`` (list-vgpu-types, vgpu-usage), ``maintenance.py`` (pause,
resume, upgrade, forget-gpus), ``migmode.py`` (enable-mig), ``previewing.py``
(preview-mappings) and ``fleet.py`` (the fleet peer relation, fleet-report,
drain-plan); the metrics exporter and the cos-agent relation are wired in
``monitoring.py``. What the host is and does lives in the ``vgpu`` package,
which never imports ops.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Optional, Union

import ops

from fleet import Fleet, principal_app
from inspecting import Inspecting
from maintenance import Maintenance
from migmode import MigMode
from monitoring import Monitoring
from previewing import Previewing
from vgpu import (
    LIVE_MIGRATION,
    ONE_TIME_USE,
    OPTION,
    PCI_IN_PLACEMENT,
    RELATION,
    RESOURCE,
    catalogue,
    dpkg,
    driver,
    facts,
    hostlock,
    kernel,
    mappings,
    mdevctl,
    mdevs,
    neighbours,
    novaconf,
    passthrough,
    reconcile,
    services,
    sriov,
    status,
    upstream,
    virt,
)
from vgpu.errors import (
    HostReadError,
    ResourceInvalidError,
    ResourceMissingError,
    ServiceError,
    VgpuError,
)

logger = logging.getLogger(__name__)


class NovaComputeNvidiaVgpuCharm(ops.CharmBase):
    """Discover GPUs, install the host driver, pass vGPU settings to nova-compute."""

    _stored = ops.StoredState()

    def __init__(self, framework: ops.Framework):
        """Set stored defaults and route every event to its one handler."""
        super().__init__(framework)
        # Operator intent, not a host fact: services stay stopped until resume.
        # ``masked`` is what this charm masked (pause), so resume and remove undo
        # exactly that. ``checked`` keeps the host-independent check of the
        # option's text, keyed by its fingerprint, so update-status needs
        # neither PyYAML nor jsonschema. ``attached`` is what inspecting the
        # resource said (Juju's fact, not the host's): it is inspected again on
        # install and upgrade-charm (Juju runs it when a new revision is
        # attached), by the upgrade action and while the driver is not fully
        # installed, so steady hooks start neither resource-get nor dpkg-deb.
        # ``reported``: [pci] report_in_placement was published once. Nova refuses it turned
        # off afterwards, so it is published again on a nova-vgpu relation added anew.
        # ``mdevctl_failed``: when and why apt last failed to install mdevctl ({}: it did not),
        # so that update-status tries again only hourly (whether it is there is read each hook).
        # ``exporter``: why the metrics exporter was last refused ({"problem": ...}; {}: it was not).
        # ``clients_left``: neighbours' NVML clients enable-mig stopped and could not start
        # again (not a host fact: who stopped them); forgotten once systemd says they run.
        self._stored.set_default(paused=False, masked=[], checked={}, attached={}, reported=False,
                                 mdevctl_failed={}, exporter={}, clients_left=[])
        self._host = reconcile.Host()  # this dispatch's reading of the host
        # This dispatch's inspection of the resource: a DebInfo or the error it raised.
        self._package: Union[driver.DebInfo, VgpuError, None] = None
        self._fetched = False  # whether this dispatch fetched the resource itself
        self._problems: List[str] = []  # blocked messages from this dispatch's work
        self._waits: List[str] = []  # waiting messages from this dispatch's work
        self._vf_failures: Dict[str, str] = {}  # GPU address -> why sriov-manage -e failed
        self._removing = False  # this dispatch is remove: the status check reads (writes) nothing
        self._busy = False  # the boot step held the host lock: the hook left the host alone
        self._notes: List[str] = []  # said once in this dispatch's status (vgpu.upstream)
        self._checked: Optional[tuple] = None  # (the option's text, its check) in this dispatch
        if getattr(self._stored, upstream.PAUSED_KEY, False):
            self._pause_of_upstream()
        on = self.on
        for event in (on.install, on.config_changed, on.upgrade_charm, on.start,
                      on.update_status, on[RELATION].relation_joined,
                      on[RELATION].relation_changed, on["juju-info"].relation_joined):
            framework.observe(event, self._reconcile)
        framework.observe(on.collect_unit_status, self._on_collect_status)
        # The actions, each in its helper; created before the fleet helper, whose record
        # is published after pause, resume, upgrade and enable-mig have run.
        self._inspecting = Inspecting(self, self._host, self._checked_text)  # list-vgpu-types, vgpu-usage
        self._maintenance = Maintenance(self, self._host, self._stored, checked=self._checked_text,
                                        attached=self._attached, publish=self._publish)
        self._mig = MigMode(self, self._host, self._stored, publish=self._publish)  # enable-mig
        framework.observe(on.remove, self._on_remove)
        self._monitoring = Monitoring(self, self._stored)  # the exporter, cos-agent
        self._fleet = Fleet(self, self._host, self._stored)  # the fleet peer relation, its actions
        self._preview = Previewing(self, self._stored, self._host)  # preview-mappings, read only

    def _pause_of_upstream(self) -> None:
        """A unit the upstream charm paused (pre-series-upgrade) stays paused until resume.

        Its StoredState is this charm's (same class and attribute, see
        vgpu.upstream); its flag is read once and cleared.
        """
        self._stored.paused = True
        self._stored.masked = sorted({*self._stored.masked, *upstream.PAUSED_SERVICES})
        setattr(self._stored, upstream.PAUSED_KEY, False)
        logger.info("paused under the upstream charm: %s stays stopped until juju run %s resume",
                    ", ".join(upstream.PAUSED_SERVICES), self.unit.name)

    # -- reading the host, once per dispatch -------------------------------
    def _facts(self) -> facts.Facts:
        return self._host.facts()

    def _refresh(self) -> None:
        """Forget what was read of the host (after changing it); the resource stays."""
        self._host.refresh()

    def _mapping(self) -> mappings.Validation:
        return self._host.mapping(
            self._checked_text, pci_in_placement=bool(self.config.get(PCI_IN_PLACEMENT)),
            live_migration=bool(self.config.get(LIVE_MIGRATION)), problems=self._problems,
            published=self._ours(), one_time_use=bool(self.config.get(ONE_TIME_USE)))

    def _checked_text(self) -> mappings.Validation:
        raw = self.config.get(OPTION)  # a string option: text or unset
        text = None if raw is None else str(raw)
        if self._checked is not None and self._checked[0] == text:  # this dispatch's, again
            return self._checked[1]
        key = mappings.fingerprint(text)
        record = self._stored.checked
        if record.get("key") == key:
            checked = mappings.from_record(record)
        else:
            checked = mappings.check_text(text)
            self._stored.checked = {"key": key, **mappings.to_record(checked)}
        self._checked = (text, checked)
        return checked

    def _attached(self, fetch: bool = False) -> driver.DebInfo:
        """The attached driver package; raises ResourceMissingError or ResourceInvalidError.

        With ``fetch`` (to install it), or without a record from an earlier
        hook, the resource is fetched and inspected, once per dispatch, and
        what that said is recorded; otherwise the record answers (no path).
        """
        if fetch and not self._fetched:
            self._package = None
        if self._package is None:
            found = None if fetch else driver.from_record(self._stored.attached)
            if found is None:
                try:
                    path = self.model.resources.fetch(RESOURCE)
                except (ops.ModelError, NameError):
                    path = None
                try:
                    found = driver.inspect_deb(path, app=self.app.name)
                except (ResourceMissingError, ResourceInvalidError) as error:
                    found = error
                self._fetched = True
                record = driver.to_record(found)
                if dict(self._stored.attached) != record:
                    self._stored.attached = record
            self._package = found
        if isinstance(self._package, VgpuError):
            raise self._package
        return self._package

    # -- reconcile ----------------------------------------------------------
    def _reconcile(self, event: ops.EventBase) -> None:
        new_revision = isinstance(event, (ops.InstallEvent, ops.UpgradeCharmEvent))
        backoff = isinstance(event, ops.UpdateStatusEvent)
        self._apply(reconcile.reconcile(self._host, self._inputs(new_revision, backoff)))

    def _publish(self) -> None:
        """Send nova-compute what changed after an action changed the host (read errors logged)."""
        self._apply(reconcile.publish(self._host, self._inputs()))

    def _inputs(self, new_revision: bool = False, backoff: bool = False) -> reconcile.Inputs:
        """What the reconcile steps need from Juju; each part is read only when a step needs it."""
        return reconcile.Inputs(
            options=self.config, checked=self._checked_text, attached=self._attached,
            relations=self._relations, unit=self.unit.name, paused=bool(self._stored.paused),
            new_revision=new_revision, show=self._show_installing,
            reported=self._published_reporting(), backoff=backoff,
            mdevctl_failed=mdevctl.from_record(self._stored.mdevctl_failed),
            upstream_ran=self._upstream_ran)

    def _upstream_ran(self) -> bool:
        """Whether the upstream charm ran on this unit (its StoredState keys, unit or scripts)."""
        return upstream.ran(lambda key: hasattr(self._stored, key))

    def _relations(self) -> List[reconcile.Published]:
        return [reconcile.Published(r.app.name if r.app else reconcile.PRINCIPAL, r.data[self.unit])
                for r in self.model.relations[RELATION]]

    def _show_installing(self, message: str) -> None:
        self.unit.status = ops.MaintenanceStatus(message)

    def _apply(self, done: reconcile.Outcome) -> None:
        """Keep what the steps found for the status; set the relation data that changed."""
        self._problems.extend(done.problems)
        self._waits.extend(done.waits)
        if done.vf_failures is not None:
            self._vf_failures = done.vf_failures
        self._busy = self._busy or done.busy
        self._notes.extend(done.notes)
        if done.resumed:
            self._stored.paused = False
            self._stored.masked = []
        failed = mdevctl.to_record(done.mdevctl_failed)
        if dict(self._stored.mdevctl_failed) != failed:
            self._stored.mdevctl_failed = failed
        if not done.relation_data:
            return
        for relation, changed in zip(self.model.relations[RELATION], done.relation_data):
            if changed:
                logger.info("publishing %s on %s", ", ".join(sorted(changed)), relation.name)
                relation.data[self.unit].update(changed)
        self._published_reporting()  # remembers report_in_placement once published

    def _vgpu_services(self) -> List[str]:
        """Every vGPU service the installed driver ships: the status checks them all."""
        return list(self._facts().services)

    def _ours(self) -> List[Mapping[str, str]]:
        """This unit's data on each nova-vgpu relation (read when first looked into)."""
        return [r.data[self.unit] for r in self.model.relations[RELATION]]

    def _published_mapping(self) -> Dict[str, tuple]:
        return reconcile.published_mapping(self._ours())

    def _published_reporting(self) -> bool:
        """Whether report_in_placement is published now or was once (remembered in StoredState)."""
        if not self._stored.reported and reconcile.published_reporting(self._ours()):
            self._stored.reported = True
        return bool(self._stored.reported)

    # -- status -------------------------------------------------------------
    _KINDS = {status.BLOCKED: ops.BlockedStatus, status.MAINTENANCE: ops.MaintenanceStatus,
              status.WAITING: ops.WaitingStatus, status.ACTIVE: ops.ActiveStatus}

    def _on_collect_status(self, event: ops.CollectStatusEvent) -> None:
        if self._fleet.quiet:  # a peer's fleet record changed: this host did not
            return
        if self._removing:  # reading the mapping would learn the types and save them again
            event.add_status(ops.MaintenanceStatus(
                "removing: the charm's files are deleted; the vGPU host driver stays installed"))
            return
        if self._busy:  # the host is half restored: what it shows now says nothing yet
            for message in self._waits:
                event.add_status(ops.WaitingStatus(message))
            return
        try:
            pairs = status.statuses(self._status_inputs())
        except HostReadError as error:
            pairs = [(status.BLOCKED, message) for message in [*self._problems, str(error)]]
        for kind, message in pairs:
            event.add_status(self._KINDS[kind](message))
        for message in self._waits:
            event.add_status(ops.WaitingStatus(message))
        if self._monitoring.problem():  # recorded when the exporter was last set up
            event.add_status(ops.BlockedStatus(self._monitoring.problem()))
        for message in self._mig.left_stopped():  # a neighbour's client, not running
            event.add_status(ops.BlockedStatus(message))

    def _status_inputs(self) -> status.Inputs:
        """Read what the status depends on; the mapping, driver and services only when it matters."""
        here = self._facts()
        forced = bool(self.config.get("force-install-nvidia-vgpu"))
        published = self._published_mapping()
        publishes = self._publishes_sections()
        inputs = status.Inputs(
            facts=here, app=self.app.name, principal=self._principal(), unit=self.unit.name,
            reporting_kept=(not self.config.get(PCI_IN_PLACEMENT)
                            and self._published_reporting()),
            related=bool(self.model.relations[RELATION]),
            forced=forced, published=published, problems=tuple(self._problems),
            paused=bool(self._stored.paused), masked_by_us=tuple(self._stored.masked),
            vf_failures=dict(self._vf_failures), neighbour_notes=tuple(neighbours.notes(
                neighbours.installed_of(here.packages), publishes,
                self._principal(), load=self._host.principal_conf)),
            mapped=self._mapped() if status.missing_gpus(here, published) else (),
            notes=tuple(self._notes) + virt.status_notes(
                here, publishes, bool(self.config.get(LIVE_MIGRATION)),
                self._host.principal_conf, self._principal()) + self._monitoring.notes()
            + self._fleet.notes())
        if not status.checks_host(here, forced, published):
            return inputs
        if any(gpu.sriov for gpu in here.pci.gpus):
            checked = self._checked_text()
            choice = sriov.selected(checked.mapping, here.pci, checked.passthrough)
            inputs = inputs._replace(vf_selected=choice.addresses, vf_refused=dict(choice.refused),
                                     boot_unit_masked=sriov.unit_masked())
        validation = self._mapping()
        if kernel.VFIO_NOT_LOADED in here.reboot_reasons():  # Secure Boot may be why
            inputs = inputs._replace(secure_boot=kernel.secure_boot())
        return inputs._replace(validation=validation, **self._driver_inputs(),
                               services=self._service_answers(), capacity=self._capacity(published))

    def _mapped(self) -> tuple:
        """The addresses the option names (normalised; not ``all``), for naming GPUs gone."""
        return tuple(a for addresses in self._checked_text().mapping.values()
                     for a in addresses if a != "all")

    def _publishes_sections(self) -> bool:
        """Whether this unit's data (first relation) holds nova.conf sections."""
        return any(novaconf.sections_from_relation(ours) for ours in self._ours()[:1])

    def _principal(self) -> str:
        """The principal's application name: nova-vgpu's remote app, else juju-info's."""
        return principal_app(self.model)

    def _driver_inputs(self) -> dict:
        """The attached package (or why there is none) and how it compares with the installed one."""
        out: dict = {}
        try:
            out["attached"] = attached = self._attached()
        except ResourceMissingError as error:
            out["attached_missing"] = str(error)
            return out
        except ResourceInvalidError as error:
            out["attached_invalid"] = str(error)
            return out
        installed = self._facts().driver
        if installed is not None and installed.installed:
            try:
                out["order"] = dpkg.compare_versions(attached.version, installed.version)
            except (ValueError, VgpuError) as error:
                out["order_error"] = str(error)
        return out

    def _service_answers(self) -> status.Services:
        """systemctl's word on the driver's services, asked only while they should run."""
        installed = self._facts().driver
        if installed is None or not installed.installed or self._stored.paused:
            return status.Services()
        try:
            down = services.down(self._vgpu_services(), driver.DAEMONS)
            masked = services.masked(down) if down else []
        except ServiceError as error:
            return status.Services(error=str(error))
        return status.Services(down=tuple(down), masked=tuple(masked))

    def _capacity(self, served: Dict[str, tuple]) -> str:
        """``nvidia-108: 1 used, 3 free`` per published or assigned type ('' if none)."""
        from vgpu import capacity  # reads libvirt's XML only when there is something to count

        return capacity.capacity_text(capacity.capacity(self._facts().pci, served))

    # -- leaving ------------------------------------------------------------
    def _on_remove(self, _event: ops.RemoveEvent) -> None:
        """Undo what the charm changed; the driver package stays installed."""
        self._removing = True
        upstream_ran = self._upstream_ran()  # before its unit and scripts go
        try:
            upstream.retire("this charm is removed too", {})
        except (VgpuError, OSError) as error:
            logger.warning("could not remove the upstream charm's %s: %s", upstream.UNIT, error)
        try:
            if kernel.remove_blacklist(upstream_ran):
                logger.info("removed /%s; initramfs refreshed", kernel.BLACKLIST)
        except VgpuError as error:
            logger.warning("could not remove the nouveau blacklist: %s", error)
        try:
            sriov.remove_unit()
        except (VgpuError, OSError) as error:
            logger.warning("could not remove %s: %s", sriov.UNIT, error)
        try:  # whole GPUs stay on vfio-pci until the next boot: a guest may hold one
            passthrough.ensure_rules([])
        except OSError as error:
            logger.warning("could not remove /%s: %s", passthrough.RULES, error.strerror or error)
        self._monitoring.remove()  # a problem is logged
        try:
            mdevs.forget()
            catalogue.forget()
        except OSError as error:
            logger.warning("could not remove the charm's files in /%s: %s", catalogue.STATE_DIR,
                           error.strerror or error)
        try:  # held while deleted: a boot step still running (stop failed) waits, then retakes it
            hostlock.remove()
        except (VgpuError, OSError) as error:
            logger.warning("could not remove /%s: %s", hostlock.FILE,
                           getattr(error, "strerror", None) or error)
        # Whatever this charm masked is unmasked and started, as the package set them up.
        try:
            masked = self._maintenance.masked_by_us()
            if masked:
                services.resume(masked)
        except (HostReadError, ServiceError) as error:
            logger.warning("could not unmask the vGPU services: %s", error)
        logger.info("the vGPU host driver package stays installed; purge it by hand if wanted")


if __name__ == "__main__":  # pragma: nocover
    ops.main(NovaComputeNvidiaVgpuCharm)
