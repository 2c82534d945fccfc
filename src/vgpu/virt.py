"""What this host runs for live migration: libvirt and QEMU, and nova-compute's settings.

Reads the host for :mod:`vgpu.livemigration` (which stays pure):

* the versions Nova compares: ``virsh -r version --daemon`` (read-only, bounded
  in time, its output cut), whose "Running against daemon" and "Running
  hypervisor" lines are libvirt's ``virConnectGetLibVersion`` and
  ``virConnectGetVersion``, the calls behind Nova's ``has_min_version``
  (``nova/virt/libvirt/host.py``). Only where libvirtd does not answer, dpkg's
  status of ``libvirt-daemon-system`` and ``qemu-system-x86``: what is installed,
  which a restart would run, and said so (``installed``);
* nova-compute's ``[libvirt]`` as its nova.conf (and nova-compute.conf) hold it,
  read as :mod:`vgpu.principalconf` reads them: charm-nova-compute renders
  ``live_migration_completion_timeout``, ``live_migration_downtime*`` and
  ``live_migration_permit_post_copy`` (the last only when true) only with
  ``enable-live-migration`` (``hooks/nova_compute_context.py``,
  ``templates/*/nova.conf``).

Nothing here runs unless asked: a hook asks for the versions only while
``vfio-live-migration`` is on and VFIO VFs are to be published, so a steady
update-status starts no virsh otherwise.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Dict, Iterable, Optional, Tuple

from . import dpkg, run
from .errors import CommandError, HostReadError, PrincipalConfigError

if TYPE_CHECKING:  # vgpu.livemigration is imported only where it is used
    from . import livemigration
    from .livemigration import Version

log = logging.getLogger(__name__)

VIRSH = ("virsh", "-r", "version", "--daemon")
TIMEOUT = 10  # seconds: a libvirtd that hangs must not stall the hook
OUTPUT_LIMIT = 4096  # characters of virsh's answer read (it prints five lines)
PACKAGES = ("libvirt-daemon-system", "qemu-system-x86")  # what Ubuntu's nova-compute-kvm pulls in
LIVE_MIGRATION_KEYS = ("live_migration_completion_timeout", "live_migration_downtime",
                       "live_migration_downtime_steps", "live_migration_downtime_delay",
                       "live_migration_permit_post_copy", "live_migration_permit_auto_converge")
_TRUE = ("1", "t", "true", "on", "y", "yes")  # oslo_utils.strutils' spellings of true


def versions(timeout: float = TIMEOUT) -> Tuple[Optional["Version"], Optional["Version"], str]:
    """(libvirt, QEMU, where they came from): the running daemon's, else dpkg's, else unknown."""
    from . import livemigration

    try:
        result = run.run(list(VIRSH), timeout, what="virsh -r version --daemon")
        libvirt, qemu = livemigration.parse_virsh(result.stdout[:OUTPUT_LIMIT])
        if libvirt is not None and qemu is not None:
            return libvirt, qemu, livemigration.RUNNING
        log.warning("virsh -r version --daemon named no daemon or QEMU version; reading dpkg's")
    except CommandError as error:
        log.warning("libvirtd does not answer (%s); reading the installed versions from dpkg",
                    error)
    try:
        found = dpkg.packages(names=PACKAGES)
    except HostReadError as error:
        log.warning("cannot read dpkg's status: %s", error)
        return None, None, livemigration.UNKNOWN
    libvirt_pkg, qemu_pkg = (found.get(name) for name in PACKAGES)
    if libvirt_pkg is None or qemu_pkg is None or not (libvirt_pkg.installed
                                                       and qemu_pkg.installed):
        return None, None, livemigration.UNKNOWN
    return (livemigration.parse_version(libvirt_pkg.version),
            livemigration.parse_version(qemu_pkg.version), livemigration.INSTALLED)


def nova_settings(conf) -> Tuple[Optional[bool], Optional[bool]]:
    """(live migration on, post-copy permitted) from nova-compute's files; (None, None) unread.

    ``conf``: :func:`vgpu.principalconf.load`'s answer. A later file's value wins,
    as oslo.config reads them.
    """
    if conf is None:
        return None, None
    on = False
    post_copy: Optional[bool] = False
    for _, parsed in conf:
        section = parsed.get("libvirt", {})
        on = on or any(key in section for key in LIVE_MIGRATION_KEYS)
        values = section.get("live_migration_permit_post_copy")
        if values:
            post_copy = values[-1].strip().lower() in _TRUE
    return on, post_copy


def downtime(conf) -> Dict[str, int]:
    """nova.conf's ``[libvirt] live_migration_downtime*`` that read as numbers (a later file wins)."""
    out: Dict[str, int] = {}
    for _, parsed in conf or ():
        section = parsed.get("libvirt", {})
        for key in LIVE_MIGRATION_KEYS[1:4]:
            values = section.get(key)
            if values and values[-1].strip().isdigit():
                out[key] = int(values[-1].strip())
    return out


def readiness(*, vfio_live_migration: bool, frameworks: Iterable[str], load=None,
              nova_major: Optional[int] = None, principal: str = "nova-compute",
              read_versions: bool = True, known=None) -> "livemigration.Readiness":
    """The host's :class:`vgpu.livemigration.Readiness` (``load``: reads nova-compute's files).

    ``read_versions`` False asks nothing of libvirt or dpkg (the versions are
    then unknown): for a note that needs only nova.conf. ``known``: (libvirt,
    QEMU, source) read before (update-status: no virsh), used as read.
    """
    from . import livemigration

    live, post_copy, times = None, None, {}
    if load is not None:
        try:
            conf = load()
            live, post_copy = nova_settings(conf)
            times = downtime(conf)
        except (HostReadError, PrincipalConfigError) as error:  # the [pci] check says it too
            log.warning("cannot read %s's live-migration settings: %s", principal, error)
    if known is not None:
        libvirt, qemu, source = known
    else:
        libvirt, qemu, source = versions() if read_versions else (None, None,
                                                                  livemigration.UNKNOWN)
    return livemigration.assess(libvirt, qemu, source, vfio_live_migration=vfio_live_migration,
                                live_migration=live, post_copy=post_copy,
                                frameworks=tuple(sorted(set(frameworks))), nova_major=nova_major,
                                principal=principal, downtime=times)


def frameworks_of(gpus) -> Tuple[str, ...]:
    """The vGPU frameworks of ``gpus`` (vgpu.pci's ``mdev``, ``vfio``), sorted."""
    return tuple(sorted({gpu.framework for gpu in gpus if gpu.framework}))


def readiness_of(here, vfio_live_migration: bool, load,
                 principal: str = "nova-compute", known=None) -> "livemigration.Readiness":
    """:func:`readiness` for the host ``here`` (vgpu.facts.Facts): its GPUs' frameworks, its Nova.

    ``known``: the versions read before (see :func:`readiness`), so no virsh runs.
    """
    release = here.supported_release()
    return readiness(vfio_live_migration=vfio_live_migration, frameworks=frameworks_of(
        here.pci.gpus), load=load, nova_major=release.nova_major if release else None,
        principal=principal, known=known)


def action_results(here, vfio_live_migration: bool, load,
                   principal: str = "nova-compute") -> dict:
    """list-vgpu-types' ``live-migration`` result; {} on a host without NVIDIA GPUs (no virsh)."""
    if not here.pci.gpus:
        return {}
    return {"live-migration": readiness_of(here, vfio_live_migration, load, principal).data()}


def status_notes(here, publishing: bool, vfio_live_migration: bool, load,
                 principal: str = "nova-compute") -> Tuple[str, ...]:
    """The active-status note when nova-compute permits post-copy and vGPU guests could move.

    Only while this unit publishes, and only for guests that would live-migrate
    otherwise (mediated devices, or VFIO with ``vfio-live-migration``) on the host
    ``here`` (vgpu.facts.Facts): nova.conf is read through ``load`` (the hook's one
    reading), no virsh is run.
    """
    kinds = set(frameworks_of(here.pci.gpus))
    if not publishing or not ("mdev" in kinds or (vfio_live_migration and "vfio" in kinds)):
        return ()
    try:
        live, post_copy = nova_settings(load())
    except (HostReadError, PrincipalConfigError):
        return ()  # the check of the principal's [pci] names what cannot be read
    if live and post_copy:
        from . import livemigration

        return (livemigration.post_copy_problem(principal),)
    return ()


def publishing_problems(*, vfio_live_migration: bool, vfio_published: bool) -> Tuple[str, ...]:
    """Why ``live_migratable`` VFIO device specs must not be published now (virsh, then dpkg).

    Asked only with the option on and VFIO VFs to publish: nothing is run otherwise.
    """
    if not (vfio_live_migration and vfio_published):
        return ()
    from . import livemigration

    libvirt, qemu, source = versions()
    return livemigration.blocks_publishing(livemigration.assess(
        libvirt, qemu, source, vfio_live_migration=True, frameworks=("vfio",)))
