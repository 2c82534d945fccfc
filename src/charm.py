#!/usr/bin/env python3
# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""Juju subordinate of nova-compute: NVIDIA vGPU support for OpenStack Nova.

Event wiring only. One idempotent reconcile handler serves every lifecycle
and relation event; status is computed in one collect-unit-status handler;
actions and remove have their own handlers (a subordinate has nothing to do
on stop). What the host is and does lives in the ``vgpu`` package, which
never imports ops.
"""

import logging
from typing import Dict, List, Optional, Tuple, Union

import ops

from vgpu import (
    LIVE_MIGRATION,
    OPTION,
    PCI_IN_PLACEMENT,
    RELATION,
    RESOURCE,
    catalogue,
    dpkg,
    driver,
    facts,
    kernel,
    mappings,
    mdevs,
    novaconf,
    pci,
    principalconf,
    services,
    sriov,
    status,
    text,
)
from vgpu.errors import (
    GuestsRunningError,
    HostReadError,
    InstallError,
    PrincipalConfigError,
    ResourceInvalidError,
    ResourceMissingError,
    ServiceError,
    SriovError,
    VfTypeError,
    VgpuError,
)

logger = logging.getLogger(__name__)

MDEV_CLASS = "mdev-class-per-profile"


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
        self._stored.set_default(paused=False, masked=[], checked={}, attached={})
        self._gathered: Optional[facts.Facts] = None
        self._validation: Optional[mappings.Validation] = None
        # This dispatch's inspection of the resource: a DebInfo or the error it raised.
        self._package: Union[driver.DebInfo, VgpuError, None] = None
        self._fetched = False  # whether this dispatch fetched the resource itself
        self._problems: List[str] = []  # blocked messages from this dispatch's work
        self._waits: List[str] = []  # waiting messages from this dispatch's work
        self._vf_failures: Dict[str, str] = {}  # GPU address -> why sriov-manage -e failed
        self._removing = False  # this dispatch is remove: the status check reads (writes) nothing
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

    # -- reading the host, once per dispatch -------------------------------
    def _facts(self) -> facts.Facts:
        if self._gathered is None:
            self._gathered = facts.gather()
        return self._gathered

    def _refresh(self) -> None:
        """Forget what was read of the host (after changing it); the resource stays."""
        self._gathered = None
        self._validation = None

    def _mapping(self) -> mappings.Validation:
        if self._validation is None:
            here = self._facts()
            offered = whole = None
            if any(gpu.framework == pci.VFIO for gpu in here.pci.gpus):
                version = here.loaded_driver_version
                table = catalogue.learn(here.pci, version, problems=self._problems)
                offered = catalogue.offered(here.pci, version, table)
                whole = catalogue.whole_gpus(here.pci, table)
            self._validation = mappings.against_host(
                self._checked_text(), here.pci, here.supported_release(), offered,
                pci_in_placement=bool(self.config.get(PCI_IN_PLACEMENT)),
                live_migration=bool(self.config.get(LIVE_MIGRATION)), whole_gpus=whole,
                vanished=self._vanished()[1])
        return self._validation

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

    def _inspect_resource(self) -> None:
        """Fetch and inspect the resource now; what it said is recorded for later hooks."""
        try:
            self._attached(fetch=True)
        except (ResourceMissingError, ResourceInvalidError):
            pass  # recorded: the status says it where it matters

    def _wants_driver(self) -> bool:
        return bool(self._facts().pci.gpus) or bool(self.config.get("force-install-nvidia-vgpu"))

    # -- reconcile ----------------------------------------------------------
    def _reconcile(self, event: ops.EventBase) -> None:
        try:
            if self._wants_driver():
                if isinstance(event, (ops.InstallEvent, ops.UpgradeCharmEvent)):
                    self._inspect_resource()  # Juju runs upgrade-charm for a new revision
                self._ensure_driver()
            self._ensure_vfs()
            if self._stored.paused and self._resumed_elsewhere():
                logger.info("the vGPU services run again (started outside this charm): "
                            "no longer paused")
                self._stored.paused = False
                self._stored.masked = []
            self._publish()
        except HostReadError as error:
            # Nothing is published from a host that could not be read: the last data stays.
            logger.error("%s", error)
            self._problems.append(str(error))

    def _resumed_elsewhere(self) -> bool:
        """A paused unit whose daemons run again was resumed outside this charm.

        Only by hand (systemctl unmask and start, a reinstalled package):
        nova-compute's pause and resume leave them alone, as none is published
        in ``services``.
        """
        daemons = self._daemons()
        try:
            return bool(daemons) and all(services.active(daemons).values())
        except ServiceError:
            return False

    def _ensure_driver(self) -> None:
        installed = self._facts().driver
        if installed is None or not installed.installed:
            try:
                package = self._attached(fetch=True)
            except (ResourceMissingError, ResourceInvalidError) as error:
                logger.warning("not installing the vGPU host driver: %s", error)
                return
            if installed is not None and not driver.same_package(package, installed):
                # Another version is half-installed: replacing it is the upgrade
                # action's call (guests, downgrades), not a hook's.
                logger.warning("%s %s is %s; not installing %s %s by itself", installed.name,
                               installed.version, installed.state, package.package, package.version)
                return
            self.unit.status = ops.MaintenanceStatus(
                f"installing {package.package} {package.version}")
            try:
                driver.install(package)
            except ResourceInvalidError as error:
                logger.error("refusing to install %s: %s", package.package, error)
                self._problems.append(str(error))
            except InstallError as error:
                logger.error("installing %s failed: %s", package.package, error)
                self._problems.append(f"{error}; retrying on the next hook")
            self._refresh()
        try:
            if kernel.ensure_nouveau_blacklisted():
                logger.info("nouveau blacklisted in /%s; initramfs refreshed", kernel.BLACKLIST)
        except VgpuError as error:
            self._problems.append(f"blacklisting nouveau failed: {error}")

    def _ensure_vfs(self) -> None:
        """Enable the VFs of the SR-IOV GPUs the mapping selects that have none (after a reboot).

        Only GPUs bound to the nvidia driver are touched, within sriov's time
        limit per hook; with the IOMMU off nothing is tried (the status asks for it).
        """
        here = self._facts()
        if here.driver is None or not here.driver.installed or self._stored.paused:
            return
        if here.iommu_problem():
            return
        choice = sriov.selected(self._checked_text().mapping, here.pci)
        self._vf_failures = dict(choice.refused)
        missing = [g.address for g in here.pci.gpus if g.address in choice.wanted and g.vfs_missing]
        if not missing:
            return
        self._vf_failures.update(sriov.enable(missing))
        self._refresh()

    def _vgpu_services(self) -> List[str]:
        """Every vGPU service the installed driver ships: the status checks them all."""
        return list(self._facts().services)

    def _daemons(self) -> List[str]:
        """The driver's daemons: what this charm's pause stops and its status expects running.

        None is published in ``services``: nova-compute's pause would stop them
        under running guests (it leaves libvirt and the guests up), and its
        OpenStack upgrade would restart them. nvidia-vgpud prepares the GPUs
        and exits, so it is not paused.
        """
        return [name for name in self._facts().services if name in driver.DAEMONS]

    def _publish(self) -> None:
        """Send nova-compute the vGPU sections, services and packages, when they changed.

        A mapping that fails validation (or a Nova not installed yet) leaves the
        published sections as they are: the last good configuration stays.
        """
        here = self._facts()
        installed = here.driver if here.driver is not None and here.driver.installed else None
        sections: Optional[dict] = {}
        plan = None
        if here.pci.gpus:
            validation = self._mapping()
            release = here.supported_release()
            plan = validation.plan
            ok = (validation.ok and release is not None and plan is not None
                  and not plan.missing_vfs)
            sections = None
            if ok:
                try:  # with what was published for GPUs discovery no longer finds
                    sections = novaconf.keep_published(novaconf.plan_sections(
                        plan, release, mdev_class=bool(self.config.get(MDEV_CLASS)),
                        pci_in_placement=bool(self.config.get(PCI_IN_PLACEMENT)),
                        keep_placement_reporting=self._published_reporting(),
                        live_migratable=bool(self.config.get(LIVE_MIGRATION))), *self._vanished())
                except ValueError as error:  # sysfs gave something nova.conf must not get
                    self._problems.append(f"not publishing: {error}")
                    ok = False
            ok = ok and self._mdevs_may_change(sections)
            # The principal's [pci] is checked before any VF takes a type from the plan.
            accepted = self._principal_accepts(sections)
            ok = ok and accepted and self._mig_ready(plan) and self._give_vfs_types(plan)
            sections = sections if ok else None
            self._ensure_boot_unit(plan if ok else None)
        elif self._published_mapping() or self._published_reporting():
            # Every mapped GPU seems gone (a driver reload, a bad read): keep what
            # nova-compute has rather than empty its config; the status says so.
            # report_in_placement alone stays too: Nova refuses it turned off.
            sections = None
        data = novaconf.relation_data(sections or {}, packages=[installed.name] if installed else [])
        if sections is None:
            del data["subordinate_configuration"]
        for relation in self.model.relations[RELATION]:
            ours = relation.data[self.unit]
            changed = {k: v for k, v in data.items() if ours.get(k) != v}
            if changed:
                logger.info("publishing %s on %s", ", ".join(sorted(changed)), relation.name)
                ours.update(changed)

    def _principal_accepts(self, sections: Optional[dict]) -> bool:
        """Whether ``sections`` may join the principal's nova.conf; the published are checked too.

        nova.conf is read only when ours carry ``[pci]`` (VFIO device specs, or
        report_in_placement). Each principal entry Nova would refuse or let take
        our GPUs' functions is a blocked problem, as is a nova.conf that cannot be
        read or parsed; one not written yet is a wait. False keeps the last
        published sections.
        """
        relations = self.model.relations[RELATION]
        new = bool(sections and "pci" in sections)
        if sections is not None and not new:
            return True  # replaces what was published, and touches no [pci]
        published = [novaconf.sections_from_relation(r.data[self.unit]) for r in relations]
        mine = [s for s in [sections, *published] if s and "pci" in s]
        if not mine:
            return True
        app = relations[0].app.name if relations and relations[0].app else "nova-compute"
        try:
            conf = principalconf.load()
        except (HostReadError, PrincipalConfigError) as error:
            self._problems.append(f"cannot check {app}'s [pci] settings against this unit's: {error}; "
                                  "the last published settings stay")
            return False
        if conf is None:
            if new:
                self._waits.append(f"waiting for {app} to write {principalconf.NOVA_CONF} "
                                   "before publishing [pci] settings")
            return not new
        ours = [v for s in mine for k, v in s.get("pci", []) if k == "device_spec"]
        specs = principalconf.principal(conf, ours).specs
        found: List[str] = []
        for candidate in mine:  # the new sections first: accepted, they replace the published
            found.extend(principalconf.conflicts(specs, candidate, self._facts().pci, app))
            if new and not found:
                return True
        self._problems.extend(dict.fromkeys(found))
        return not new

    def _mdevs_may_change(self, sections) -> bool:
        """False (blocked, naming them) when guests hold mdevs of types ``sections`` take away.

        Domain XML is read only when the mdev mapping to publish takes a type
        from a function it is published for now.
        """
        from vgpu import plan as plans

        published = self._published_mapping()
        wanted = novaconf.mapping_from_sections(sections)
        removed = plans.removed_mdev_types(published, wanted, self._facts().pci)
        if not removed:
            return True
        from vgpu import guests  # XML parsing only when a type leaves a GPU

        conflicts = plans.mdev_conflicts(removed, guests.held_mdevs(), self._facts().pci)
        if not conflicts:
            return True
        more = f" (+{len(conflicts) - 1} more)" if len(conflicts) > 1 else ""
        self._problems.append(
            f"{OPTION} not applied: {conflicts[0]}{more}; restore the mapping, or move or delete "
            f"the instance first; keeping {mappings.summary(published)}")
        return False

    def _give_vfs_types(self, plan) -> bool:
        """Write the plan's types to vendor-specific VFIO VFs; False leaves all as it was."""
        from vgpu import vfio

        if self._stored.paused and vfio.desired(plan, self._facts().pci):
            return False  # the vGPU manager is stopped: VF types wait for resume
        try:
            done = vfio.ensure_types(plan, self._facts().pci)
        except GuestsRunningError as error:
            self._problems.append(
                f"{OPTION} not applied, no VF changed: {error}; move them or restore the mapping")
            return False
        except VfTypeError as error:
            self._problems.append(f"{error}; retrying on the next hook")
            self._refresh()
            return False
        if done:
            self._refresh()
        return True

    def _mig_ready(self, plan) -> bool:
        """GPUs given MIG-backed profiles are in MIG mode; nvidia-smi is asked only then."""
        from vgpu import mig

        problems = mig.mode_problems(mig.by_gpu(plan.assignments), self.unit.name)
        self._problems.extend(problems)
        return not problems

    def _ensure_boot_unit(self, plan) -> None:
        """The boot-time unit and its data: the selected GPUs' VFs and their profiles by name.

        A unit the operator masked is left alone (the status says so).
        """
        here = self._facts()
        if here.driver is None or not here.driver.installed:
            return
        restores_mdevs = self._record_mdevs()
        if not (restores_mdevs or any(gpu.sriov for gpu in here.pci.gpus)) \
                or sriov.unit_masked():
            return
        try:
            if plan is not None or not sriov.data_path().exists():
                # Without a plan in force the data keeps the types last applied.
                wanted = sriov.selected(self._checked_text().mapping, here.pci).wanted
                sriov.write_boot_data(sriov.boot_data(here.pci, plan, wanted, self._daemons()))
            sriov.ensure_unit(sriov.render_unit())
        except SriovError as error:
            self._problems.append(f"{sriov.UNIT}: {error}")

    def _record_mdevs(self) -> bool:
        """On Nova before 30, record the mdevs instances hold for the boot step; True if one is kept.

        Nova 30 and later persists mdevs itself: nothing is recorded there.
        """
        here = self._facts()
        release = here.supported_release()
        try:
            if release is not None and not mdevs.applies(release.nova_major):
                mdevs.forget()
                return False
            if release is None or not mdevs.uses_mdevs(here.pci):
                return mdevs.kept()  # nothing to look at now: the record stays as it was
            return bool(mdevs.refresh(here.pci))
        except HostReadError as error:
            self._problems.append(f"cannot record the mdevs instances hold: {error}; "
                                  "the last record stays")
        except OSError as error:
            self._problems.append(f"cannot write /{mdevs.FILE}: {error.strerror or error}")
        return mdevs.kept()

    def _vanished(self) -> Tuple[novaconf.Sections, List[str]]:
        """The published sections, and their functions discovery no longer finds (kept)."""
        for relation in self.model.relations[RELATION]:
            sections = novaconf.sections_from_relation(relation.data[self.unit])
            published = novaconf.mapping_from_sections(sections)
            return sections, status.missing_gpus(self._facts(), published)
        return {}, []

    def _published_reporting(self) -> bool:
        for relation in self.model.relations[RELATION]:
            if novaconf.reports_in_placement(
                    novaconf.sections_from_relation(relation.data[self.unit])):
                return True
        return False

    # -- status -------------------------------------------------------------
    _KINDS = {status.BLOCKED: ops.BlockedStatus, status.MAINTENANCE: ops.MaintenanceStatus,
              status.WAITING: ops.WaitingStatus, status.ACTIVE: ops.ActiveStatus}

    def _on_collect_status(self, event: ops.CollectStatusEvent) -> None:
        if self._removing:  # reading the mapping would learn the types and save them again
            event.add_status(ops.MaintenanceStatus(
                "removing: the charm's files are deleted; the vGPU host driver stays installed"))
            return
        try:
            pairs = status.statuses(self._status_inputs())
        except HostReadError as error:
            pairs = [(status.BLOCKED, message) for message in [*self._problems, str(error)]]
        for kind, message in pairs:
            event.add_status(self._KINDS[kind](message))
        for message in self._waits:
            event.add_status(ops.WaitingStatus(message))

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
            vf_failures=dict(self._vf_failures))
        if not status.checks_host(here, forced, published):
            return inputs
        if any(gpu.sriov for gpu in here.pci.gpus):
            choice = sriov.selected(self._checked_text().mapping, here.pci)
            inputs = inputs._replace(vf_selected=choice.addresses, vf_refused=dict(choice.refused),
                                     boot_unit_masked=sriov.unit_masked())
        validation = self._mapping()
        return inputs._replace(validation=validation, **self._driver_inputs(),
                               services=self._service_answers(), capacity=self._capacity(published))

    def _principal(self) -> str:
        """The principal's application name: nova-vgpu's remote app, else juju-info's."""
        for endpoint in (RELATION, "juju-info"):
            for relation in self.model.relations[endpoint]:
                if relation.app is not None:
                    return relation.app.name
        return "nova-compute"

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

    def _published_mapping(self) -> Dict[str, tuple]:
        for relation in self.model.relations[RELATION]:
            sections = novaconf.sections_from_relation(relation.data[self.unit])
            return novaconf.mapping_from_sections(sections)
        return {}

    def _capacity(self, served: Dict[str, tuple]) -> str:
        """``nvidia-108: 1 used, 3 free`` per published or assigned type ('' if none)."""
        from vgpu import usage  # reads libvirt's XML only when there is something to count

        return usage.capacity_text(usage.capacity(self._facts().pci, served))

    # -- actions ------------------------------------------------------------
    def _on_list_vgpu_types(self, event: ops.ActionEvent) -> None:
        from vgpu import report, table

        try:
            here = self._facts()
            host = pci.with_available(here.pci)  # what each function can still create
        except HostReadError as error:
            event.fail(str(error))
            return
        offered = catalogue.offered(host, here.loaded_driver_version, self._learnt(host))
        options = {"mdev_class": bool(self.config.get(MDEV_CLASS)),
                   "pci_in_placement": bool(self.config.get("pci-in-placement")),
                   "live_migration": bool(self.config.get("vfio-live-migration"))}
        event.set_results(table.fit({
            "gpus": report.gpu_results(host, offered=offered, **options),
            "table": report.types_table(host, offered, **options),
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
            published, missing = self._vanished()
        except (ValueError, HostReadError) as error:
            event.fail(f"nothing forgotten: {error}")
            return
        present = [a for a in named if host.gpu(a) is not None]
        unknown = [a for a in named if not plans.same_gpu(missing, [a])]
        if not named:
            event.fail("nothing forgotten: give gpus=<address>[,<address>...]")
            return
        if present:
            event.fail(f"nothing forgotten: {text.listing(present)} "
                       f"{'is' if len(present) == 1 else 'are'} on this host; a GPU present is "
                       f"changed through {OPTION}")
            return
        if unknown:
            event.fail(f"nothing forgotten: {unknown[0]} is no GPU whose published devices are "
                       f"missing (missing: {text.listing(missing) or 'none'})")
            return
        gone = plans.same_gpu(missing, named)
        data = novaconf.relation_data(novaconf.drop_published(published, gone))
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
            self._guard_guests(bool(event.params.get("force")))
            services.pause(names)
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
            services.resume(names)
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
            self._guard_guests(bool(event.params.get("force")))
        except VgpuError as error:
            event.fail(f"not upgraded: {error}")
            return
        try:
            driver.install(package)
        except VgpuError as error:
            event.fail(f"not upgraded: {error}")
            return
        finally:
            # Whatever dpkg did, the status and nova-compute get dpkg's answer now.
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
        from vgpu import guests, mig
        from vgpu.errors import MigError

        try:
            address = mappings.normalise_address(str(event.params.get("gpu") or ""))
            gpu = self._facts().pci.gpu(address)
            if gpu is None or gpu.address != address:
                raise MigError(f"{address} is not an NVIDIA GPU on this host (GPUs: "
                               f"{', '.join(g.address for g in self._facts().pci.gpus) or 'none'})")
            guests.ensure_no_guests([gpu.address, *(vf.address for vf in gpu.vfs)], defined=True)
            before = mig.modes([address])[address]
            done = None if before.enabled else mig.enable(address)
        except (ValueError, VgpuError) as error:
            event.fail(f"MIG mode not enabled: {error}")
            return
        event.set_results(mig.enable_results(address, done))
        self._refresh()
        try:
            self._publish()  # a mapping that waited for MIG mode applies now
        except HostReadError as error:
            logger.error("%s", error)

    # -- leaving ------------------------------------------------------------
    def _on_remove(self, _event: ops.RemoveEvent) -> None:
        """Undo what the charm changed; the driver package stays installed."""
        self._removing = True
        try:
            if kernel.remove_blacklist():
                logger.info("removed /%s; initramfs refreshed", kernel.BLACKLIST)
        except VgpuError as error:
            logger.warning("could not remove the nouveau blacklist: %s", error)
        try:
            sriov.remove_unit()
        except (VgpuError, OSError) as error:
            logger.warning("could not remove %s: %s", sriov.UNIT, error)
        try:
            mdevs.forget()
            catalogue.forget()
        except OSError as error:
            logger.warning("could not remove the charm's files in /%s: %s", catalogue.STATE_DIR,
                           error.strerror or error)
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
