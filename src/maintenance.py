# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""The operator's maintenance actions, wired to their events: pause, resume, upgrade, forget-gpus.

What they do to the host is :mod:`vgpu.services`, :mod:`vgpu.driver`,
:mod:`vgpu.guests` and :mod:`vgpu.novaconf` (plain modules); this helper
checks the action's parameters and the host, records the operator's intent
in the charm's StoredState (``paused``, ``masked``: what pause masked, so
that resume and remove undo exactly that) and says the result. After an
upgrade, nova-compute is sent what the host serves through the charm's own
publish step. ``src/charm.py`` creates one :class:`Maintenance`.
"""

from __future__ import annotations

import logging
from typing import Callable, List

import ops

from fleet import DRAIN_HINT
from vgpu import (
    OPTION,
    RELATION,
    dpkg,
    driver,
    hostlock,
    mappings,
    novaconf,
    reconcile,
    services,
    sriov,
    status,
    text,
)
from vgpu.errors import GuestsRunningError, HostReadError, ResourceInvalidError, ServiceError, VgpuError

logger = logging.getLogger(__name__)


class Maintenance(ops.Object):
    """Pause, resume, upgrade and forget-gpus.

    ``host``: the charm's reading of the host for this dispatch; ``stored``:
    its StoredState; ``checked``: the option's checked text; ``attached``:
    the attached driver package (``attached(True)`` fetches it); ``publish``:
    the charm's publish step (raises HostReadError).
    """

    def __init__(self, charm: ops.CharmBase, host: reconcile.Host, stored: ops.BoundStoredState, *,
                 checked: Callable[[], mappings.Validation],
                 attached: Callable[[bool], driver.DebInfo], publish: Callable[[], None]):
        """Observe the four actions."""
        super().__init__(charm, "maintenance")
        self._charm = charm
        self._host = host
        self._stored = stored
        self._checked = checked
        self._attached = attached
        self._publish = publish
        on = charm.on
        self.framework.observe(on.pause_action, self._on_pause)
        self.framework.observe(on.resume_action, self._on_resume)
        self.framework.observe(on.forget_gpus_action, self._on_forget_gpus)
        self.framework.observe(on.upgrade_action, self._on_upgrade)

    def masked_by_us(self) -> List[str]:
        """What this charm masked; a pause by an older version of it masked every service."""
        if self._stored.masked:
            return list(self._stored.masked)
        return list(self._host.facts().services) if self._stored.paused else []

    def _daemons(self) -> List[str]:
        """The driver's daemons (see reconcile.daemons): what pause stops."""
        return reconcile.daemons(self._host.facts())

    def _guard_guests(self, force: bool) -> None:
        from vgpu import guests  # XML parsing: actions only, not every hook

        guests.ensure_no_guests(set(self._host.facts().pci.addresses()), force=force,
                                unit=self.model.unit.name)

    # -- forget-gpus ----------------------------------------------------------------------
    def _on_forget_gpus(self, event: ops.ActionEvent) -> None:
        """Drop what was published for GPUs removed for good; refused for GPUs present."""
        from vgpu import plan as plans

        unit = self.model.unit
        try:
            host = self._host.facts().pci
            named = [mappings.normalise_address(a)
                     for a in str(event.params.get("gpus") or "").replace(",", " ").split()]
            published, missing = reconcile.vanished(
                self._host.facts(), [r.data[unit] for r in self.model.relations[RELATION]])
        except (ValueError, HostReadError) as error:
            event.fail(f"nothing forgotten: {error}")
            return
        present = [a for a in named if host.gpu(a) is not None]
        without_vfs = {a: gpu for a in named if a not in present
                       for gpu in [status.present_gpu(self._host.facts(), a)] if gpu}
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
            relation.data[unit]["subordinate_configuration"] = data["subordinate_configuration"]
        logger.info("forgot the published devices of %s", ", ".join(gone))
        event.set_results({"forgotten": ", ".join(gone)})

    # -- pause and resume -----------------------------------------------------------------
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

    def _on_resume(self, event: ops.ActionEvent) -> None:
        try:
            wanted = set(self._daemons()) | set(self.masked_by_us())
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

    # -- upgrade --------------------------------------------------------------------------
    def _on_upgrade(self, event: ops.ActionEvent) -> None:
        try:
            wanted = reconcile.wants_driver(self._host.facts(), self._charm.config,
                                            lambda: self._checked().passthrough)
        except HostReadError as error:
            event.fail(f"not upgraded: {error}")
            return
        if not wanted:
            event.fail("not upgraded: no NVIDIA GPU on this host, so no vGPU driver belongs here")
            return
        before = self._host.facts().driver
        try:
            package = self._attached(True)
            if not self._upgrade_wanted(event, package, before):
                return
            if self._stored.paused:
                event.fail("not upgraded: the unit is paused and its services masked, which the "
                           "driver's install scripts need; run resume first")
                return
            event.log("checking that no running guest uses a vGPU")
            self._guard_guests(bool(event.params.get("force")))
        except VgpuError as error:
            guests = isinstance(error, GuestsRunningError)
            hint = DRAIN_HINT.format(unit=self.model.unit.name) if guests else ""
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
            self._host.refresh()
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
            reasons = self._host.facts().reboot_reasons()
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
