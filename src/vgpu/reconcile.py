"""The reconcile steps: the driver, the VFs, their types, the boot unit and what nova-compute gets.

The charm gathers what only it can know (the options, this unit's data on each
``nova-vgpu`` relation, the paused flag, the attached package, its unit name)
into :class:`Inputs` and calls :func:`reconcile` (every lifecycle and relation
hook) or :func:`publish` (the actions that change the host). The steps do the
host work through the other ``vgpu`` modules and return an :class:`Outcome`:
the relation data to set, the blocked and waiting messages, the VFs that could
not be enabled, whether the unit was resumed outside the charm and the failed
install of mdevctl to remember. The charm applies it (relation data, statuses,
StoredState); this module never imports ops.

What the host is, is read once per dispatch and read again after changing it,
through one :class:`Host` the charm keeps for the whole dispatch (its status
and actions read through the same one).

The steps are functions over one :class:`_Hook` (the host's reading, the
inputs, the outcome); :func:`_steps` runs them in order. Each section below
holds one step and the functions it calls; the steps of one concern live with
it, over the same ``_Hook``:

- the driver: :func:`_inspect_resource`, :func:`_ensure_driver`, :func:`_resumed_elsewhere`;
- the VFs: :func:`_ensure_vfs`;
- after a reboot, the boot step's work when it could not do it: :func:`_after_boot`;
- publishing: :func:`_publish` (the only step of :func:`publish`), which checks the
  sections to publish (:func:`_addressable`, :func:`vgpu.mdevs.step_may_change`,
  :func:`vgpu.mdevctl.step_ready`, :func:`_principal_accepts`), decides and moves the
  whole GPUs (:func:`vgpu.whole.step_decide`, :func:`vgpu.whole.step_act`), gives the VFs
  their types (:func:`vgpu.vfio.step_give_types`), and runs the next two;
- MIG: :func:`_mig_instances` (before the mapping is checked), :func:`_mig_ready`,
  :func:`_with_mig` (the boot data): guards that import :mod:`vgpu.migsteps` only
  where a MIG-backed profile is mapped;
- the boot unit and the mdev record: :func:`_ensure_boot_unit`, :func:`vgpu.mdevs.step_record`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import (
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from . import (
    LIVE_MIGRATION,
    ONE_TIME_USE,
    OPTION,
    PCI_IN_PLACEMENT,
    catalogue,
    driver,
    facts,
    hostlock,
    kernel,
    mappings,
    mdevctl,
    mdevs,
    novaconf,
    pci,
    principalconf,
    profiles,
    services,
    sriov,
    status,
    text,
    upstream,
)
from .errors import (
    HostBusyError,
    HostReadError,
    InstallError,
    PrincipalConfigError,
    ResourceInvalidError,
    ResourceMissingError,
    ServiceError,
    SriovError,
    VgpuError,
)
from .record import NamedTuple

logger = logging.getLogger(__name__)

FORCE_INSTALL = "force-install-nvidia-vgpu"
MDEV_CLASS = "mdev-class-per-profile"
PRINCIPAL = "nova-compute"  # the principal's name when no relation says it


class Host:
    """One dispatch's reading of the host: the facts and the mapping checked against them.

    Both are read on first use and kept until :meth:`refresh` (after the host
    changed); nothing outlives the dispatch.
    """

    def __init__(self, dry: bool = False) -> None:
        """Start with nothing read; ``dry`` (a preview): what is learnt is not saved."""
        self.dry = dry
        self._gathered: Optional[facts.Facts] = None
        self._validation: Optional[mappings.Validation] = None
        # principalconf.load's answer: (files, None) or (None, the error it raised)
        self._principal: Optional[Tuple[Optional[principalconf.Files], Optional[VgpuError]]] = None

    def facts(self) -> facts.Facts:
        """What the host is, read once until :meth:`refresh`; raises HostReadError."""
        if self._gathered is None:
            self._gathered = facts.gather()
        return self._gathered

    def principal_conf(self) -> Optional[principalconf.Files]:
        """The principal's nova.conf and nova-compute.conf (:func:`principalconf.load`), read once.

        Kept until :meth:`refresh`, as the facts are: the check of the
        principal's [pci] rules and the neighbours' note share one reading.
        Raises what that reading raised (HostReadError, PrincipalConfigError)
        to every caller.
        """
        if self._principal is None:
            try:
                self._principal = (principalconf.load(), None)
            except (HostReadError, PrincipalConfigError) as error:
                self._principal = (None, error)
        conf, failure = self._principal
        if failure is not None:
            raise failure
        return conf

    def refresh(self) -> None:
        """Forget what was read of the host (after changing it)."""
        self._gathered = None
        self._validation = None
        self._principal = None

    def mapping(self, checked: Callable[[], mappings.Validation], *, pci_in_placement: bool,
                live_migration: bool, problems: List[str],
                published: Sequence[Mapping[str, str]],
                one_time_use: bool = False) -> mappings.Validation:
        """The option (``checked()`` gives its checked text) validated against this host.

        VFIO type names are learnt only on a host with VFIO GPUs; what learning
        them could not do is added to ``problems``. ``published``: this unit's
        data per relation (what it published for GPUs now missing stays mapped).
        """
        if self._validation is None:
            here = self.facts()
            offered = whole = others = None
            if any(gpu.framework == pci.VFIO for gpu in here.pci.gpus):
                version = here.loaded_driver_version
                table = catalogue.learn(here.pci, version, problems=problems,
                                        save_grown=not self.dry)
                offered = catalogue.offered(here.pci, version, table)
                whole = catalogue.whole_gpus(here.pci, table)
                others = catalogue.other_drivers(here.pci, version, table)
            self._validation = mappings.against_host(
                checked(), here.pci, here.supported_release(), offered,
                pci_in_placement=pci_in_placement, live_migration=live_migration,
                whole_gpus=whole, vanished=vanished(here, published)[1],
                one_time_use=one_time_use, other_drivers=others)
        return self._validation


class Published(NamedTuple):
    """One ``nova-vgpu`` relation: the principal's application and this unit's data on it."""

    app: str  # the remote application's name (PRINCIPAL if Juju does not say)
    data: Mapping[str, str]  # what this unit published there


class Inputs(NamedTuple):
    """What the steps need from the charm; each is looked into only when a step needs it."""

    options: Mapping[str, Any]  # the charm's options (its config, read when first looked into)
    checked: Callable[[], mappings.Validation]  # the option's text, checked (host-independent)
    attached: Callable[[bool], driver.DebInfo]  # the package (True: fetch it); raises Resource*
    relations: Callable[[], Sequence[Published]]  # the nova-vgpu relations, in the model's order
    unit: str  # this unit's name, for the actions named in messages
    paused: bool = False  # the pause action stopped the driver's daemons
    new_revision: bool = False  # install or upgrade-charm: inspect the resource again
    show: Callable[[str], None] = lambda message: None  # maintenance message while installing
    # [pci] report_in_placement was published once (the unit's memory, kept across relations).
    reported: bool = False
    # update-status: apt retries mdevctl only once mdevctl.RETRY_AFTER has passed since
    # mdevctl_failed (every other hook and the actions try at once).
    backoff: bool = False
    mdevctl_failed: Optional[mdevctl.Failure] = None  # the last failed install (the unit's memory)
    # Whether the upstream charm ran on this unit (vgpu.upstream.ran): its blacklist is taken over.
    upstream_ran: Callable[[], bool] = lambda: False


class Outcome:
    """What the steps did and found, for the charm to apply (a plain class: cheaper than a dataclass)."""

    def __init__(self) -> None:
        """Nothing done, nothing found."""
        # Per relation, in Inputs.relations' order: the keys whose value changed ({}: none).
        self.relation_data: List[Dict[str, str]] = []
        self.problems: List[str] = []  # blocked messages
        self.waits: List[str] = []  # waiting messages
        self.vf_failures: Optional[Dict[str, str]] = None  # GPU address -> why; None: not looked at
        self.resumed = False  # the paused daemons run again (started outside the charm)
        self.busy = False  # the boot step held the host lock: nothing done, the waits say so
        # The failed install of mdevctl to remember (None: none); _Hook starts it as given.
        self.mdevctl_failed: Optional[mdevctl.Failure] = None
        self.notes: List[str] = []  # said once, in this hook's status (the upstream charm taken over)


def wants_driver(here: facts.Facts, options: Mapping[str, Any],
                 whole: Callable[[], Sequence[str]] = tuple) -> bool:
    """Whether the host driver belongs here: a GPU not given whole, or forced (options).

    ``whole()``: the GPUs the mapping gives whole to guests, asked only on a
    host with GPUs. A host whose every GPU goes whole needs no vGPU driver.
    """
    if options.get(FORCE_INSTALL):
        return True
    if not here.pci.gpus:
        return False
    given = set(whole())
    return any(g.address not in given for g in here.pci.gpus)


def daemons(here: facts.Facts) -> List[str]:
    """The driver's daemons: what the charm's pause stops and its status expects running.

    None is published in ``services``: nova-compute's pause would stop them
    under running guests (it leaves libvirt and the guests up), and its
    OpenStack upgrade would restart them. nvidia-vgpud prepares the GPUs
    and exits, so it is not paused.
    """
    return [name for name in here.services if name in driver.DAEMONS]


def published_mapping(published: Sequence[Mapping[str, str]]) -> Dict[str, tuple]:
    """The mapping nova-compute has now: the first relation's (only its data is read)."""
    for ours in published:
        return novaconf.mapping_from_sections(novaconf.sections_from_relation(ours))
    return {}


def vanished(here: facts.Facts, published: Sequence[Mapping[str, str]]
             ) -> Tuple[novaconf.Sections, List[str]]:
    """The published sections (first relation), and their functions discovery no longer finds."""
    for ours in published:
        sections = novaconf.sections_from_relation(ours)
        return sections, status.missing_gpus(here, novaconf.mapping_from_sections(sections))
    return {}, []


def published_reporting(published: Sequence[Mapping[str, str]]) -> bool:
    """Whether [pci] report_in_placement is published on any relation."""
    for ours in published:
        if novaconf.reports_in_placement(novaconf.sections_from_relation(ours)):
            return True
    return False


def reconcile(host: Host, given: Inputs) -> Outcome:
    """Every hook's work: driver, VFs, a resume by hand noticed, then what nova-compute gets.

    A host that cannot be read stops the work: nothing is published (the
    last data stays) and the error is a problem.
    """
    hook = _Hook(host, given)
    try:
        # The resource is Juju's, not the host's: inspected before the lock, so that a
        # hook the boot step keeps waiting still records what was attached.
        if given.new_revision and wants_driver(hook.facts(), given.options,
                                               lambda: given.checked().passthrough):
            _inspect_resource(hook)  # Juju runs upgrade-charm for a new revision
        with _locked(host, hook.out):
            _steps(hook)
    except HostReadError as error:
        logger.error("%s", error)
        hook.out.problems.append(str(error))
    except HostBusyError:
        pass  # said in the outcome's waits
    return hook.out


def publish(host: Host, given: Inputs) -> Outcome:
    """Only what nova-compute gets (after an action changed the host); read errors are logged."""
    hook = _Hook(host, given)
    try:
        with _locked(host, hook.out):
            _publish(hook)
    except HostReadError as error:
        logger.error("%s", error)
    except HostBusyError:
        pass
    return hook.out


BUSY = (f"waiting for {sriov.UNIT} (the boot step) to finish restoring VFs, vGPU types and "
        "mdevs: this hook left the host and nova-compute's settings as they are; the next hook "
        "does the work")


@contextlib.contextmanager
def _locked(host: Host, out: Outcome) -> Iterator[None]:
    """The host lock held (:mod:`vgpu.hostlock`), the host read afresh once it is.

    Not had within :data:`vgpu.hostlock.HOOK_WAIT`: HostBusyError, with
    :data:`BUSY` among ``out``'s waits. A lock file that cannot be opened is
    a problem, and the work is not done either.
    """
    with contextlib.ExitStack() as stack:
        try:
            stack.enter_context(hostlock.held(hostlock.HOOK_WAIT))
        except HostBusyError as error:
            logger.warning("%s; %s", error, BUSY)
            out.waits.append(BUSY)
            out.busy = True
            raise
        except OSError as error:
            raise HostReadError(f"cannot take the host lock /{hostlock.FILE}: "
                                f"{error.strerror or error}") from None
        host.refresh()  # whatever was read before the lock may be stale now
        yield


class _Hook:
    """One hook's run of the steps: the host's reading, the inputs and the outcome they share.

    ``paused`` starts as the inputs say; :func:`_steps` clears it when the
    daemons run again. ``mig_modes``: the MIG modes :func:`_mig_instances`
    read, for :func:`_mig_ready`.
    """

    def __init__(self, host: Host, given: Inputs) -> None:
        self.host = host
        self.given = given
        self.paused = given.paused
        self.out = Outcome()
        self.out.mdevctl_failed = given.mdevctl_failed
        self.problems = self.out.problems
        self.waits = self.out.waits
        self.mig_modes: Optional[Dict[str, Any]] = None  # MIG modes read by _mig_instances
        self.mig_driver: Optional[Dict[str, Any]] = None  # NVML's GPU instance profiles, by type
        self.vfs_enabled = False  # _ensure_vfs ran sriov-manage -e (it may wipe MIG state)
        self.mdevs_unrecorded = False  # mdevs.step_record could not record the mdevs guests hold
        self.split_back: Tuple[str, ...] = ()  # GPUs _publish handed back from whole for vGPUs
        self.sections_sent = False  # _publish gave nova-compute new sections

    def facts(self) -> facts.Facts:
        return self.host.facts()

    def refresh(self) -> None:
        self.host.refresh()

    def mapping(self) -> mappings.Validation:
        options = self.given.options
        return self.host.mapping(self.given.checked,
                                 pci_in_placement=bool(options.get(PCI_IN_PLACEMENT)),
                                 live_migration=bool(options.get(LIVE_MIGRATION)),
                                 problems=self.problems, published=self.published(),
                                 one_time_use=bool(options.get(ONE_TIME_USE)))

    def published(self) -> List[Mapping[str, str]]:
        return [relation.data for relation in self.given.relations()]

    def published_mapping(self) -> Dict[str, tuple]:
        return published_mapping(self.published())

    def published_reporting(self) -> bool:
        return self.given.reported or published_reporting(self.published())


def _steps(hook: _Hook) -> None:
    """The steps of :func:`reconcile`, in order; raises HostReadError."""
    if wants_driver(hook.facts(), hook.given.options, lambda: hook.given.checked().passthrough):
        if hook.given.new_revision:  # done before the lock, unless no GPU was seen then
            _inspect_resource(hook)  # (the charm fetches the resource once per dispatch)
        _ensure_driver(hook)
    _ensure_vfs(hook)
    _after_boot(hook)
    if hook.paused and _resumed_elsewhere(hook):
        logger.info("the vGPU services run again (started outside this charm): "
                    "no longer paused")
        hook.paused = False
        hook.out.resumed = True
    _publish(hook)
    if hook.split_back:  # handed back from whole for vGPUs: their VFs, then the mapping again
        first, hook.split_back = hook.out.relation_data, ()
        _ensure_vfs(hook)  # (no MIG state to restore there: they were whole)
        _publish(hook)
        if not hook.sections_sent:  # no VFs yet: what the first pass published stands
            hook.out.relation_data = first
    _take_over_upstream(hook)


# -- the driver: the resource inspected, the package installed, a resume by hand noticed ---------

def _inspect_resource(hook: _Hook) -> None:
    """Fetch and inspect the resource now; the charm records what it said for later hooks."""
    try:
        hook.given.attached(True)
    except (ResourceMissingError, ResourceInvalidError):
        pass  # recorded: the status says it where it matters


def _resumed_elsewhere(hook: _Hook) -> bool:
    """A paused unit whose daemons run again was resumed outside this charm.

    Only by hand (systemctl unmask and start, a reinstalled package):
    nova-compute's pause and resume leave them alone, as none is published
    in ``services``.
    """
    names = daemons(hook.facts())
    try:
        return bool(names) and all(services.active(names).values())
    except ServiceError:
        return False


def _ensure_driver(hook: _Hook) -> None:
    installed = hook.facts().driver
    if installed is None or not installed.installed:
        try:
            package = hook.given.attached(True)
        except (ResourceMissingError, ResourceInvalidError) as error:
            logger.warning("not installing the vGPU host driver: %s", error)
            return
        if installed is not None and not driver.same_package(package, installed):
            # Another version is half-installed: replacing it is the upgrade
            # action's call (guests, downgrades), not a hook's.
            logger.warning("%s %s is %s; not installing %s %s by itself", installed.name,
                           installed.version, installed.state, package.package, package.version)
            return
        hook.given.show(f"installing {package.package} {package.version}")
        try:
            driver.install(package)
        except ResourceInvalidError as error:
            logger.error("refusing to install %s: %s", package.package, error)
            hook.problems.append(str(error))
        except InstallError as error:
            logger.error("installing %s failed: %s", package.package, error)
            hook.problems.append(f"{error}; retrying on the next hook")
        hook.refresh()
    try:
        if kernel.ensure_nouveau_blacklisted(hook.given.upstream_ran()):
            logger.info("nouveau blacklisted in /%s; initramfs refreshed", kernel.BLACKLIST)
    except VgpuError as error:
        hook.problems.append(f"blacklisting nouveau failed: {error}")


# -- the virtual functions -----------------------------------------------------------------------

def _ensure_vfs(hook: _Hook) -> None:
    """Enable the VFs of the SR-IOV GPUs the mapping selects that have none (after a reboot).

    Only GPUs bound to the nvidia driver are touched, within sriov's time
    limit per hook; with the IOMMU off nothing is tried (the status asks for it).
    """
    here = hook.facts()
    if here.driver is None or not here.driver.installed or hook.paused:
        return
    if here.iommu_problem():
        return
    checked = hook.given.checked()
    choice = sriov.selected(checked.mapping, here.pci, checked.passthrough)
    hook.out.vf_failures = dict(choice.refused)
    missing = [g.address for g in here.pci.gpus if g.address in choice.wanted and g.vfs_missing]
    if not missing:
        return
    hook.out.vf_failures.update(sriov.enable(missing))
    hook.vfs_enabled = True
    hook.refresh()


def _after_boot(hook: _Hook) -> None:
    """The boot step's work when it was not done since this boot; what it left undone, named.

    After the hook's own sriov-manage (VFs first, as at boot): MIG mode, GPU
    instances, types and mdevs, from the boot data and the mdev record, when
    the boot step left no mark this boot or left one saying something was not
    restored (see :mod:`vgpu.bootfile`, :func:`vgpu.boot.catch_up`), and after
    every hook that enabled VFs itself (a driver reload took them; sriov-manage
    may have wiped the MIG state the mapping in force needs). Not while paused
    (the vGPU manager is stopped) nor for a boot unit the operator masked.
    Mdevs still missing are blocked problems: no hook creates them.
    """
    here = hook.facts()
    if here.driver is None or not here.driver.installed or hook.paused:
        return
    from . import bootfile

    if (hook.vfs_enabled or not bootfile.done()) and not sriov.unit_masked():
        from . import boot

        boot.catch_up(again=hook.vfs_enabled)
        hook.refresh()
    hook.problems.extend(bootfile.left_behind(bootfile.left()))


# -- publishing: what nova-compute gets, and the VF types that go with it ------------------------

def _publish(hook: _Hook) -> None:
    """Send nova-compute the vGPU sections, services and packages, when they changed.

    A mapping that fails validation (or a Nova not installed yet) leaves the
    published sections as they are: the last good configuration stays.
    """
    here = hook.facts()
    installed = here.driver if here.driver is not None and here.driver.installed else None
    sections: Optional[dict] = {}
    plan = boot_plan = None
    gpus = bool(here.pci.gpus)
    if gpus:
        from . import vfio  # the VF types (vendor-specific VFIO)

        _mig_instances(hook)
        here = hook.facts()
        validation = hook.mapping()
        release = here.supported_release()
        plan = _addressable(hook, validation.plan)
        back: Tuple[str, ...] = ()  # GPUs without VFs that the hook hands back from whole first
        if plan is not None and plan.missing_vfs:
            from . import whole

            back = whole.split_back(here.pci, plan)
        ok = (validation.ok and release is not None and plan is not None
              and set(plan.missing_vfs) <= set(back) and _live_migratable_accepted(hook, plan))
        # Every check that can refuse the mapping runs before the host changes (whole GPUs
        # moved, VFs typed): a refusal leaves each GPU as it was.
        decision = None
        if ok:
            from . import whole  # the whole GPUs: decided read only, moved once all accepted

            decision = whole.step_decide(hook, plan)
        ok = decision is not None and not decision.refusals and set(back) <= set(decision.give_back)
        sections = plan_sections(hook, plan, release) if ok else None
        ok = ok and sections is not None
        ok = ok and mdevs.step_may_change(hook, sections) \
            and mdevctl.step_ready(hook, sections, release)
        # The principal's [pci] is checked before any VF takes a type from the plan.
        accepted = _principal_accepts(hook, sections)
        # VF types next: their guard (guests on VFs whose type would change) refuses before
        # any VF changes, and the whole GPUs move only after it accepted.
        ok = ok and accepted and _mig_ready(hook, plan) and vfio.step_give_types(hook, plan)
        if ok and decision is not None and (decision.moves or plan.passthrough):
            from . import whole

            plan = whole.step_act(hook, plan, decision)  # only what vfio-pci holds is published
            sections = plan_sections(hook, plan, release)
            ok = sections is not None
            here = hook.facts()
            hook.split_back = tuple(a for a in back if sriov.driver_of(a) == sriov.NVIDIA_DRIVER)
        sections = sections if ok else None
        boot_plan = plan if ok else None
    elif hook.published_mapping() or hook.published_reporting():
        # Every mapped GPU seems gone (a driver reload, a bad read): keep what
        # nova-compute has rather than empty its config; the status says so.
        # report_in_placement alone stays too: Nova refuses it turned off.
        sections = None
    hook.sections_sent = sections is not None
    data = novaconf.relation_data(sections or {}, packages=[installed.name] if installed else [])
    if sections is None:
        del data["subordinate_configuration"]
    hook.out.relation_data = [{k: v for k, v in data.items() if ours.get(k) != v}
                              for ours in hook.published()]
    if gpus:  # once the relation data is set: see _after_types
        _after_types(hook, boot_plan)


def _live_migratable_accepted(hook: _Hook, plan) -> bool:
    """False (blocked, naming what it needs) when Nova would refuse live_migratable specs here.

    Nova 31+ stops nova-compute at start when a ``[pci] device_spec`` is
    ``live_migratable`` below libvirt 10.0.0 or QEMU 8.2.2 (see vgpu.livemigration):
    the versions are read (vgpu.virt) only with vfio-live-migration on and VFs to publish.
    """
    from . import virt

    problems = virt.publishing_problems(
        vfio_live_migration=bool(hook.given.options.get(LIVE_MIGRATION)),
        vfio_published=bool(plan.vfio))
    hook.problems.extend(problems)
    return not problems


def _after_types(hook: _Hook, plan) -> None:
    """The boot unit's step, once the VFs hold what the relation data (already set) lists.

    Nothing that fails from here on may keep nova-compute from getting the
    sections the VFs now hold: a failed hook would leave its relation data
    unset, the VFs disagreeing with nova.conf. A host read error is said as
    such, anything else as the boot unit not updated; the next hook retries.
    """
    try:
        _ensure_boot_unit(hook, plan)
    except VgpuError as error:
        logger.error("%s", error)
        hook.problems.append(str(error))
    except Exception as error:  # noqa: BLE001 -- a failed hook would undo the publishing
        logger.exception("%s not updated", sriov.UNIT)
        hook.problems.append(
            f"{sriov.UNIT}: not updated after the VFs took their types "
            f"({type(error).__name__}: {text.one_line(str(error), 100)}); retrying on the next hook")


def _addressable(hook: _Hook, plan):
    """``plan`` without the GPUs in a PCI domain above ffff, each named as a problem.

    Nova refuses such addresses (``PciAddressGlobSpec``, and
    ``device_addresses`` needs a four-digit domain): nova-compute would
    stop. The other GPUs are published as planned.
    """
    if plan is None:
        return None
    wide = sorted({a.gpu for a in plan.assignments if not novaconf.nova_addressable(a.gpu)})
    if not wide:
        return plan
    host = hook.facts().pci
    for address in wide:
        gpu = host.gpu(address)
        model = f" ({gpu.model})" if gpu is not None and gpu.model else ""
        hook.problems.append(
            f"GPU {address}{model} is in PCI domain {address.split(':', 1)[0]}, above ffff, "
            "which Nova refuses (nova-compute would stop): not given to Nova; turn VMD off "
            f"for its slot in the firmware, or map the other GPUs by address in {OPTION}")
    return plan._replace(assignments=tuple(a for a in plan.assignments if a.gpu not in wide))


def plan_sections(hook: _Hook, plan, release) -> Optional[novaconf.Sections]:
    """What nova-compute would get for ``plan``, with what was published for vanished GPUs.

    None (the problem said) when sysfs gave something nova.conf must not get.
    """
    options = hook.given.options
    published, gone = vanished(hook.facts(), hook.published())
    if gone and plan.passthrough:  # a GPU published whole: its VFs did not vanish
        from . import whole

        gone = whole.vanished_vfs(hook.facts().pci, plan, gone)
    try:
        return novaconf.keep_published(novaconf.plan_sections(
            plan, release, mdev_class=bool(options.get(MDEV_CLASS)),
            pci_in_placement=bool(options.get(PCI_IN_PLACEMENT)),
            keep_placement_reporting=hook.published_reporting(),
            live_migratable=bool(options.get(LIVE_MIGRATION)),
            one_time_use=bool(options.get(ONE_TIME_USE))), published, gone)
    except ValueError as error:
        hook.problems.append(f"not publishing: {error}")
        return None


def _principal_accepts(hook: _Hook, sections: Optional[dict]) -> bool:
    """Whether ``sections`` may join the principal's nova.conf; the published are checked too.

    nova.conf (and nova-compute.conf) are read only when ours give Nova
    devices (mdev types, VFIO device specs) or report_in_placement. Each
    principal entry Nova would refuse or let take our GPUs' functions is a
    blocked problem, as is a file that cannot be read or parsed; a nova.conf
    not written yet is a wait before publishing ``[pci]`` (mdev types need
    no wait: nothing of the principal's can take them yet). False keeps
    the last published sections.
    """
    new = principalconf.checked_sections(sections)
    if sections is not None and not new:
        return True  # replaces what was published, and gives Nova no device
    relations = hook.given.relations()
    published = [novaconf.sections_from_relation(r.data) for r in relations]
    mine: List[novaconf.Sections] = [
        s for s in [sections, *published] if s and principalconf.checked_sections(s)]
    if not mine:
        return True
    app = relations[0].app if relations else PRINCIPAL
    try:
        conf = hook.host.principal_conf()
    except (HostReadError, PrincipalConfigError) as error:
        hook.problems.append(f"cannot check {app}'s [pci] settings against this unit's: {error}; "
                             "the last published settings stay")
        return False
    if conf is None:
        waits = bool(sections and "pci" in sections)
        if waits:
            hook.waits.append(f"waiting for {app} to write {principalconf.NOVA_CONF} "
                              "before publishing [pci] settings")
        return not waits
    ours = [v for s in mine for k, v in s.get("pci", []) if k == "device_spec"]
    specs = principalconf.principal(conf, ours).specs
    found: List[str] = []
    # Each entry evaluated once for all of them (its bound is per hook, not per candidate).
    each = principalconf.conflicts_each(specs, mine, hook.facts().pci, app)
    for messages in each:  # the new sections first: accepted, they replace the published
        found.extend(messages)
        if new and not found:
            return True
    hook.problems.extend(dict.fromkeys(found))
    return not new


# -- MIG: the GPU instances MIG-backed profiles need (vgpu.migsteps, imported only for them) ----

def _mig_instances(hook: _Hook) -> None:
    """The GPU instances the mapping's MIG-backed profiles need (:func:`vgpu.migsteps.instances`)."""
    here = hook.facts()
    if hook.paused or here.driver is None or not here.driver.installed:
        return
    checked = hook.given.checked()
    if not checked.ok or not profiles.mig_backed(checked.mapping):
        return
    from . import migsteps

    migsteps.instances(hook, checked.mapping)


def _mig_ready(hook: _Hook, plan) -> bool:
    """GPUs given MIG-backed profiles are in MIG mode (:func:`vgpu.migsteps.ready`)."""
    if not profiles.mig_backed(a.name for a in plan.assignments):
        return True  # vgpu.mig (nvidia-smi) is imported only where MIG-backed profiles are
    from . import migsteps

    return migsteps.ready(hook, plan)


def _with_mig(data: dict, plan, host, driver=None) -> dict:
    """The boot data with each MIG-backed GPU's GPU instances (:func:`vgpu.migsteps.with_instances`)."""
    if plan is None or not profiles.mig_backed(a.name for a in plan.assignments):
        return data
    from . import migsteps

    return migsteps.with_instances(data, plan, host, driver)


# -- the boot unit and the mdev record -----------------------------------------------------------

def _ensure_boot_unit(hook: _Hook, plan) -> None:
    """The boot-time unit and its data: the selected GPUs' VFs and their profiles by name.

    A unit the operator masked is left alone (the status says so).
    """
    here = hook.facts()
    if here.driver is None or not here.driver.installed:
        return
    restores_mdevs = mdevs.step_record(hook)
    if not (restores_mdevs or any(gpu.sriov for gpu in here.pci.gpus)) \
            or sriov.unit_masked():
        return
    try:
        if plan is not None or not sriov.boot_data_usable():
            # Without a plan in force the data keeps the types last applied, unless
            # the boot step could not use it (then the next hook restores the types).
            checked = hook.given.checked()
            wanted = sriov.selected(checked.mapping, here.pci, checked.passthrough).wanted
            if plan is None:  # and the GPUs nova-compute has VFs of now
                wanted = tuple(sorted({*wanted, *sriov.selected(
                    hook.published_mapping(), here.pci).wanted}))
            data = sriov.boot_data(here.pci, plan, wanted, daemons(here))
            sriov.write_boot_data(_with_mig(data, plan, here.pci, hook.mig_driver))
        sriov.ensure_unit(sriov.render_unit())
    except SriovError as error:
        hook.problems.append(f"{sriov.UNIT}: {error}")


# -- the upstream charm's leftovers, after juju refresh --switch ---------------------------------

def _take_over_upstream(hook: _Hook) -> None:
    """The upstream charm's boot unit retired once this charm's restores (see :mod:`vgpu.upstream`).

    Kept while the host needs restoring at boot (an SR-IOV GPU, mdevs
    recorded, or mdevs instances hold that could not be recorded) and this
    charm's unit is not in place yet: the old one is then the only restorer.
    What changed is said once, as notes of this hook.
    """
    notes = hook.out.notes
    for relation, changed in zip(hook.given.relations(), hook.out.relation_data):
        note = upstream.services_note(relation.data, changed)
        if note:
            notes.append(note)
            break
    if not upstream.found():
        return
    here = hook.facts()
    ours = sriov.unit_masked() or sriov.unit_path().is_file()
    needed = mdevs.kept() or hook.mdevs_unrecorded or any(gpu.sriov for gpu in here.pci.gpus)
    if needed and not ours:
        logger.warning("keeping the upstream charm's %s until %s is in place: it is the only "
                       "unit that restores VFs and mdevs at boot", upstream.UNIT, sriov.UNIT)
        return
    if sriov.unit_masked():
        restorer = f"{sriov.UNIT} is masked: nothing restores VFs or mdevs at boot"
    elif ours:
        restorer = f"{sriov.UNIT} alone restores VFs and mdevs at boot, for the GPUs {OPTION} selects"
    else:
        restorer = f"nothing here needs restoring at boot now; {sriov.UNIT} comes when something does"
    try:
        notes.extend(upstream.retire(restorer, hook.published_mapping()))
    except (ServiceError, OSError) as error:
        hook.problems.append(
            f"cannot remove the upstream charm's {upstream.UNIT}: "
            f"{getattr(error, 'strerror', None) or error}; at boot it still runs sriov-manage -e "
            "on every GPU and creates mdevs beside this charm; retrying on the next hook")
