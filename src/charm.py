#!/usr/bin/env python3
# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""Juju subordinate of nova-compute: NVIDIA vGPU support for OpenStack Nova.

Event wiring only. One idempotent reconcile handler serves every lifecycle
and relation event: it gathers what only the charm knows (options, relation
data, StoredState, the attached resource) into ``vgpu.reconcile.Inputs``,
runs the steps in :mod:`vgpu.reconcile` and applies what they return
(relation data, problems, the paused flag). Status is computed in one
collect-unit-status handler; actions and remove have their own handlers (a
subordinate has nothing to do on stop). What the host is and does lives in
the ``vgpu`` package, which never imports ops; the metrics exporter and the
cos-agent relation are wired in ``monitoring.py``.
"""

from __future__ import annotations

import logging
from typing import Dict, List, Mapping, Union

import ops

from fleet import DRAIN_HINT, Fleet, principal_app
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
    pci,
    reconcile,
    services,
    sriov,
    status,
    text,
    upstream,
    virt,
)
from vgpu.errors import (
    GuestsRunningError,
    HostReadError,
    ResourceInvalidError,
    ResourceMissingError,
    ServiceError,
    VgpuError,
)

logger = logging.getLogger(__name__)

MDEV_CLASS = reconcile.MDEV_CLASS


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
        if getattr(self._stored, upstream.PAUSED_KEY, False):
            self._pause_of_upstream()
        on = self.on
        for event in (on.install, on.config_changed, on.upgrade_charm, on.start,
                      on.update_status, on[RELATION].relation_joined,
                      on[RELATION].relation_changed, on["juju-info"].relation_joined):
            framework.observe(event, self._reconcile)
        framework.observe(on.collect_unit_status, self._on_collect_status)
        framework.observe(on.list_vgpu_types_action, self._on_list_vgpu_types)
        framework.observe(on.vgpu_usage_action, self._on_vgpu_usage)
        framework.observe(on.pause_action, self._on_pause)
        framework.observe(on.resume_action, self._on_resume)
        framework.observe(on.forget_gpus_action, self._on_forget_gpus)
        framework.observe(on.upgrade_action, self._on_upgrade)
        framework.observe(on.enable_mig_action, self._on_enable_mig)
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
        key = mappings.fingerprint(text)
        record = self._stored.checked
        if record.get("key") == key:
            return mappings.from_record(record)
        checked = mappings.check_text(text)
        self._stored.checked = {"key": key, **mappings.to_record(checked)}
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

    def _wants_driver(self) -> bool:
        return reconcile.wants_driver(self._facts(), self.config,
                                      lambda: self._checked_text().passthrough)

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

    def _daemons(self) -> List[str]:
        """The driver's daemons (see reconcile.daemons): what pause stops."""
        return reconcile.daemons(self._facts())

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
        for message in self._clients_left_stopped():  # a neighbour's client, not running
            event.add_status(ops.BlockedStatus(message))

    def _status_inputs(self) -> status.Inputs:
        """Read what the status depends on; the mapping, driver and services only when it matters."""
        here = self._facts()
        forced = bool(self.config.get("force-install-nvidia-vgpu"))
        published = self._published_mapping()
        inputs = status.Inputs(
            facts=here, app=self.app.name, principal=self._principal(), unit=self.unit.name,
            reporting_kept=(not self.config.get(PCI_IN_PLACEMENT)
                            and self._published_reporting()),
            related=bool(self.model.relations[RELATION]),
            forced=forced, published=published, problems=tuple(self._problems),
            paused=bool(self._stored.paused), masked_by_us=tuple(self._stored.masked),
            vf_failures=dict(self._vf_failures), neighbour_notes=tuple(neighbours.notes(
                neighbours.installed_of(here.packages), self._publishes_sections(),
                self._principal(), load=self._host.principal_conf)),
            mapped=self._mapped() if status.missing_gpus(here, published) else (),
            notes=tuple(self._notes) + virt.status_notes(
                here, self._publishes_sections(), bool(self.config.get(LIVE_MIGRATION)),
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

    # -- actions ------------------------------------------------------------
    def _on_list_vgpu_types(self, event: ops.ActionEvent) -> None:
        from vgpu import capacity, multivgpu, report, table

        try:
            here = self._facts()
            host = pci.with_available(here.pci)  # what each function can still create
            held = capacity.held()  # what guests hold: counted as the status and the exporter do
        except HostReadError as error:
            event.fail(str(error))
            return
        learnt = self._learnt(host)
        offered = catalogue.offered(host, here.loaded_driver_version, learnt)
        options = {"mdev_class": bool(self.config.get(MDEV_CLASS)),
                   "pci_in_placement": bool(self.config.get(PCI_IN_PLACEMENT)),
                   "live_migration": bool(self.config.get(LIVE_MIGRATION))}
        mig_off = report.not_in_mig_mode(host, offered)  # MIG-backed types: none available there
        # What nova-compute has now: published types that share a resource class are flagged.
        published = next(map(novaconf.sections_from_relation, self._ours()[:1]), {})
        whole = catalogue.whole_gpus(host, learnt)  # counts time-sliced VFIO types on full GPUs
        live = virt.action_results(here, options["live_migration"], self._host.principal_conf,
                                   self._principal())
        # Several vGPUs per instance (NVML, nvidia-smi -q, Nova); GPUs given whole (passthrough).
        multi = multivgpu.read(host, offered, here.supported_release())
        given = self._checked_text().passthrough
        event.set_results(table.fit({
            "gpus": report.gpu_results(host, offered=offered, whole_gb=whole, held=held,
                                       published=published, multi=multi, whole=given, mig_off=mig_off,
                                       **options),
            "table": report.types_table(host, offered, whole_gb=whole, held=held,
                                        published=published, multi=multi, whole=given, mig_off=mig_off,
                                        **options),
            **live,
            **({"nvml": f"{multi.nvml}: NVIDIA's rules give each type's most per instance"}
               if multi.nvml else {}),
        }, depth=4, records="gpus", what="types"))

    @staticmethod
    def _learnt(host: pci.Host) -> catalogue.Table:
        """The VFIO type names learnt while VFs were free; none read on a host without VFIO GPUs."""
        return catalogue.load() if any(g.framework == pci.VFIO for g in host.gpus) else {}

    def _on_vgpu_usage(self, event: ops.ActionEvent) -> None:
        from vgpu import usage  # XML parsing: actions only

        try:
            here = self._facts()
        except HostReadError as error:
            event.fail(str(error))
            return
        event.set_results(usage.results(usage.in_use(
            here.pci, learnt=self._learnt(here.pci), driver_version=here.loaded_driver_version)))

    def _on_forget_gpus(self, event: ops.ActionEvent) -> None:
        """Drop what was published for GPUs removed for good; refused for GPUs present."""
        from vgpu import plan as plans

        try:
            host = self._facts().pci
            named = [mappings.normalise_address(a)
                     for a in str(event.params.get("gpus") or "").replace(",", " ").split()]
            published, missing = reconcile.vanished(self._facts(), self._ours())
        except (ValueError, HostReadError) as error:
            event.fail(f"nothing forgotten: {error}")
            return
        present = [a for a in named if host.gpu(a) is not None]
        without_vfs = {a: gpu for a in named if a not in present
                       for gpu in [status.present_gpu(self._facts(), a)] if gpu}
        unknown = [a for a in named if not plans.same_gpu(missing, [a])]
        if not named:
            event.fail("nothing forgotten: give gpus=<address>[,<address>...]")
            return
        if present:
            event.fail(f"nothing forgotten: {text.listing(present)} "
                       f"{'is' if len(present) == 1 else 'are'} on this host; a GPU present is "
                       f"changed through {OPTION}")
            return
        if without_vfs:
            vf, gpu = next(iter(without_vfs.items()))
            event.fail(f"nothing forgotten: {vf} is a VF of GPU {gpu}, which is on this host "
                       f"without its VFs: sriov-manage -e failed (read journalctl -u "
                       f"{sriov.UNIT.removesuffix('.service')} and the unit's status); once "
                       "its VFs are back the next hook serves them again")
            return
        if unknown:
            event.fail(f"nothing forgotten: {unknown[0]} is no GPU whose published devices are "
                       f"missing (missing: {text.listing(missing) or 'none'})")
            return
        gone = plans.same_gpu(missing, named)
        event.log(f"dropping the published devices of {', '.join(gone)}")
        data = novaconf.relation_data(novaconf.drop_published(published, gone))
        event.log("publishing to nova-compute")
        for relation in self.model.relations[RELATION]:
            relation.data[self.unit]["subordinate_configuration"] = data["subordinate_configuration"]
        logger.info("forgot the published devices of %s", ", ".join(gone))
        event.set_results({"forgotten": ", ".join(gone)})

    def _guard_guests(self, force: bool) -> None:
        from vgpu import guests  # XML parsing: actions only, not every hook

        guests.ensure_no_guests(set(self._facts().pci.addresses()), force=force)

    def _on_pause(self, event: ops.ActionEvent) -> None:
        try:
            names = self._daemons()
        except HostReadError as error:
            event.fail(f"not paused: {error}")
            return
        if not names:
            event.fail("not paused: the vGPU host driver is not installed, so no service runs")
            return
        try:
            event.log("checking that no running guest uses a vGPU")
            self._guard_guests(bool(event.params.get("force")))
            services.pause(names, progress=event.log)
        except (GuestsRunningError, HostReadError) as error:
            event.fail(f"not paused: {error}")
            return
        except ServiceError as error:
            # pause undid what it did; should some of that have failed, remember it as ours.
            try:
                self._stored.masked = services.masked(names)
            except ServiceError:
                self._stored.masked = names
            event.fail(f"not paused: {error}")
            return
        self._stored.paused = True
        self._stored.masked = names
        event.set_results({"stopped": ", ".join(names)})

    def _masked_by_us(self) -> List[str]:
        """What this charm masked; a pause by an older version of it masked every service."""
        if self._stored.masked:
            return list(self._stored.masked)
        return self._vgpu_services() if self._stored.paused else []

    def _on_resume(self, event: ops.ActionEvent) -> None:
        try:
            wanted = set(self._daemons()) | set(self._masked_by_us())
        except HostReadError as error:
            event.fail(f"not resumed: {error}")
            return
        names = [n for n in driver.SERVICES if n in wanted] + sorted(wanted - set(driver.SERVICES))
        try:
            services.resume(names, progress=event.log)
        except ServiceError as error:
            event.fail(f"not resumed: {error}")
            return
        self._stored.paused = False
        self._stored.masked = []
        event.set_results({"started": ", ".join(names) or "none"})

    def _on_upgrade(self, event: ops.ActionEvent) -> None:
        try:
            wanted = self._wants_driver()
        except HostReadError as error:
            event.fail(f"not upgraded: {error}")
            return
        if not wanted:
            event.fail("not upgraded: no NVIDIA GPU on this host, so no vGPU driver belongs here")
            return
        before = self._facts().driver
        try:
            package = self._attached(fetch=True)
            if not self._upgrade_wanted(event, package, before):
                return
            if self._stored.paused:
                event.fail("not upgraded: the unit is paused and its services masked, which the "
                           "driver's install scripts need; run resume first")
                return
            event.log("checking that no running guest uses a vGPU")
            self._guard_guests(bool(event.params.get("force")))
        except VgpuError as error:
            hint = DRAIN_HINT.format(unit=self.unit.name) if isinstance(error, GuestsRunningError) else ""
            event.fail(f"not upgraded: {error}{hint}")
            return
        try:
            event.log("taking the host lock (the boot step may hold it)")
            with hostlock.held(hostlock.HOOK_WAIT):  # a driver install reloads what the boot step restores
                driver.install(package, progress=event.log)
        except VgpuError as error:
            event.fail(f"not upgraded: {error}")
            return
        except OSError as error:  # the lock file (a link on the way)
            event.fail(f"not upgraded: cannot take the host lock /{hostlock.FILE}: "
                       f"{error.strerror or error}")
            return
        finally:
            # Whatever dpkg did, the status and nova-compute get dpkg's answer now.
            event.log("publishing to nova-compute what the host serves now")
            self._refresh()
            try:
                self._publish()
            except HostReadError as error:
                logger.error("%s", error)
        event.set_results(self._upgrade_results(package, before, "installed"))

    def _upgrade_wanted(self, event: ops.ActionEvent, package: driver.DebInfo, before) -> bool:
        """False when the action ends here: the attached package is installed, or older.

        Raises ResourceInvalidError when dpkg cannot order the two versions.
        """
        if before is None or not before.installed:
            return True
        try:
            order = dpkg.compare_versions(package.version, before.version)
        except ValueError as error:
            raise ResourceInvalidError(f"cannot compare {package.version} with "
                                       f"{before.version}: {error}") from None
        if order == 0 and package.package == before.name:
            event.set_results(self._upgrade_results(package, before, "already installed"))
            return False
        if order < 0 and not event.params.get("allow-downgrade"):
            event.fail(f"not upgraded: attached {package.version} is older than installed "
                       f"{before.version}; run with allow-downgrade=true to install it")
            return False
        return True

    def _upgrade_results(self, package: driver.DebInfo, before, done: str) -> dict:
        try:
            reasons = self._facts().reboot_reasons()
            reboot, why = ("yes", "; ".join(reasons)) if reasons else ("no", "no reboot needed")
        except HostReadError as error:  # installed all the same: say so, and what is unknown
            reboot, why = "unknown", f"cannot tell whether a reboot is needed: {error}"
        return {
            "package": package.package,
            "version": package.version,
            "previous": f"{before.name} {before.version}" if before is not None else "none",
            "reboot-required": reboot,
            "message": f"{package.package} {package.version} {done}; {why}",
        }

    def _on_enable_mig(self, event: ops.ActionEvent) -> None:
        """Turn MIG mode on for one GPU with nvidia-smi; refused while a guest holds its vGPUs."""
        from vgpu import gpuclients, guests, mig
        from vgpu.errors import MigError

        try:
            address = mappings.normalise_address(str(event.params.get("gpu") or ""))
            gpu = self._facts().pci.gpu(address)
            if gpu is None or gpu.address != address:
                raise MigError(f"{address} is not an NVIDIA GPU on this host (GPUs: "
                               f"{', '.join(g.address for g in self._facts().pci.gpus) or 'none'})")
            # A guest holding a vGPU there (running or shut off) stops it; a shut-off one whose
            # VF lost its type at a reboot does not: MIG mode is what its type needs again.
            event.log(f"checking that no guest holds a vGPU on GPU {address}")
            guests.ensure_no_guests([gpu.address, *(vf.address for vf in gpu.vfs)])
            guests.ensure_no_guests([gpu.address, *(vf.address for vf in gpu.vfs
                                                    if vf.current_type)], defined=True)
            before = mig.modes([address])[address]
            done, clients = None, gpuclients.Stopped()
            if not before.enabled:
                event.log(f"turning MIG mode on: {mig.enable_command(address)}")
                with hostlock.held(hostlock.HOOK_WAIT):  # not while the boot step restores
                    done, clients = gpuclients.around(
                        lambda: mig.enable(address), address,
                        bool(event.params.get(gpuclients.STOP_PARAM)))
        except gpuclients.ModeChangeError as error:  # what it stopped is said, whatever happened
            self._left_stopped(error.clients)
            event.set_results({"gpu-clients": error.clients.said()})
            left = "".join(f"; {name} was stopped and NOT started again"
                           for name in error.clients.not_started)
            event.fail(f"MIG mode not enabled: {error}{left}")
            return
        except (ValueError, VgpuError) as error:
            event.fail(f"MIG mode not enabled: {error}")
            return
        except OSError as error:  # the lock file (a link on the way)
            event.fail(f"MIG mode not enabled: cannot take the host lock /{hostlock.FILE}: "
                       f"{error.strerror or error}")
            return
        self._left_stopped(clients)
        event.set_results({**mig.enable_results(address, done), "gpu-clients": clients.said()})
        event.log("publishing to nova-compute: a mapping that waited for MIG mode applies now")
        self._refresh()
        try:
            self._publish()  # a mapping that waited for MIG mode applies now
        except HostReadError as error:
            logger.error("%s", error)

    def _left_stopped(self, clients) -> None:
        """Remember the neighbours' clients enable-mig stopped and could not start again."""
        if clients.not_started:
            self._stored.clients_left = sorted({*self._stored.clients_left,
                                                *clients.not_started})

    def _clients_left_stopped(self) -> List[str]:
        """The status lines for clients enable-mig left stopped that are still not running.

        Those systemd says run again are forgotten; where it cannot say, they are named.
        """
        from vgpu import gpuclients

        names = list(self._stored.clients_left)
        if not names:
            return []
        try:
            running = set(gpuclients.active(names))
        except (VgpuError, ValueError):
            running = set()
        left = [n for n in names if n not in running]
        if left != names:
            self._stored.clients_left = left
        return [f"enable-mig stopped {n} and it did not start again: sudo systemctl start {n}"
                for n in left]

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
            masked = self._masked_by_us()
            if masked:
                services.resume(masked)
        except (HostReadError, ServiceError) as error:
            logger.warning("could not unmask the vGPU services: %s", error)
        logger.info("the vGPU host driver package stays installed; purge it by hand if wanted")


if __name__ == "__main__":  # pragma: nocover
    ops.main(NovaComputeNvidiaVgpuCharm)
