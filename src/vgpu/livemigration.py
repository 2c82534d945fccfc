"""Whether vGPU guests on this host can live-migrate, and what stands in the way (pure).

One record, :class:`Readiness`, built by :func:`assess` from what was read
elsewhere (:mod:`vgpu.virt` reads the host): the running libvirt and QEMU
versions and where they came from, nova-compute's live-migration settings and
the charm's ``vfio-live-migration`` option. The charm's status, the
``list-vgpu-types`` action and, later, the fleet's peer relation read it; it
never touches the host and never imports ops.

Sources (each checked in the code named):

* Nova 31.0.0 and 34.0.0, ``nova/virt/libvirt/driver.py``: ``init_host`` calls
  ``_check_pci_whitelist``, which raises ``InvalidConfiguration`` ("PCI device
  spec is configured for live_migratable but it's not supported by libvirt") when
  any ``[pci] device_spec`` is ``live_migratable`` and
  ``self._host.has_min_version(MIN_VFIO_PCI_VARIANT_LIBVIRT_VERSION = (10, 0, 0),
  MIN_VFIO_PCI_VARIANT_QEMU_VERSION = (8, 2, 2))`` is false: nova-compute does not
  start. ``has_min_version`` compares the running daemon's ``getLibVersion`` and
  the hypervisor's ``getVersion`` (``nova/virt/libvirt/host.py``).
* The same file: ``MIN_MDEV_LIVEMIG_LIBVIRT_VERSION = (8, 6, 0)`` and
  ``MIN_MDEV_LIVEMIG_QEMU_VERSION = (8, 1, 0)``, below which Nova refuses to
  live-migrate a guest with mediated devices (Nova 29 and later).
* QEMU refuses to migrate VFIO devices with postcopy: Nova 34.0.0's
  ``doc/source/admin/virtual-gpu.rst`` has vGPU hosts set
  ``[libvirt] live_migration_permit_post_copy = False`` (and, for NVIDIA
  mdevs, ``live_migration_downtime = 500000``, ``_steps = 3``, ``_delay = 3``);
  Red Hat's vGPU live-migration guide (RHEL 9) says post-copy cannot be used.
* charm-nova-compute (``hooks/nova_compute_context.py``) renders those four
  settings from its options ``live-migration-permit-post-copy``,
  ``live-migration-downtime``, ``-steps`` and ``-delay``, only with
  ``enable-live-migration``: the fix is a ``juju config nova-compute``.
  Its config.yaml (checked at 77f2e9e, 2026-06) defaults them to 500 ms, 10
  steps and 75 s, Nova's own defaults (``nova/conf/libvirt.py``: 500, 10, 75;
  minimums 100, 3, 3). Nova's vGPU guide and Red Hat's vGPU live-migration
  configuration use 500000, 3 and 3: a vGPU's framebuffer takes long to copy,
  and with the defaults the switchover waits up to 10 x 75 s per GiB before its
  downtime grows. :func:`downtime_warnings` warns (it does not block) when a
  value is more than twice as far from theirs.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

from . import LIVE_MIGRATION
from .record import NamedTuple

Version = Tuple[int, int, int]

# nova/virt/libvirt/driver.py (31.0.0 to 34.0.0), _check_pci_whitelist.
MIN_VFIO_LIBVIRT: Version = (10, 0, 0)
MIN_VFIO_QEMU: Version = (8, 2, 2)
# nova/virt/libvirt/driver.py, mdev live migration (Nova 29 and later).
MIN_MDEV_LIBVIRT: Version = (8, 6, 0)
MIN_MDEV_QEMU: Version = (8, 1, 0)
MIN_MDEV_NOVA = 29  # 2024.1 Caracal: Nova live-migrates mdev guests

RUNNING = "running"  # versions from the running daemon (virsh -r version --daemon)
INSTALLED = "installed"  # from dpkg's status: libvirtd did not answer
UNKNOWN = "unknown"  # neither could be read

POST_COPY_FIX = "juju config {principal} live-migration-permit-post-copy=false"
# NVIDIA mdevs: Nova 34.0.0 doc/source/admin/virtual-gpu.rst, set through charm-nova-compute.
DOWNTIME_SETTINGS = (("live-migration-downtime", "500000"), ("live-migration-downtime-steps", "3"),
                     ("live-migration-downtime-delay", "3"))
# nova.conf's [libvirt] keys of those options, with Nova's (and charm-nova-compute's) defaults.
DOWNTIME_KEYS = (("live_migration_downtime", "live-migration-downtime", 500),
                 ("live_migration_downtime_steps", "live-migration-downtime-steps", 10),
                 ("live_migration_downtime_delay", "live-migration-downtime-delay", 75))


class Readiness(NamedTuple):
    """Whether guests of this host's vGPUs can live-migrate; ``blockers`` says why not.

    A record, not a dataclass: defining a dataclass costs each hook that reads readiness
    (every update-status) about 0.5 ms.
    """

    libvirt: Optional[Version]  # the libvirt daemon's version; None when unknown
    qemu: Optional[Version]  # QEMU's, as libvirt reports the hypervisor
    source: str  # RUNNING, INSTALLED or UNKNOWN: where the versions came from
    live_migration: Optional[bool]  # nova-compute's live migration on (None: nova.conf unread)
    post_copy: Optional[bool]  # nova-compute's live_migration_permit_post_copy (None: unread)
    vfio_live_migration: bool  # the charm's option: VFIO device specs live_migratable
    frameworks: Tuple[str, ...] = ()  # vgpu.pci's frameworks of the published vGPUs
    blockers: Tuple[str, ...] = ()  # why guests cannot live-migrate; () when they can
    warnings: Tuple[str, ...] = ()  # what lets them move but badly (downtime settings)

    @property
    def ready(self) -> bool:
        """Guests of this host's vGPUs can live-migrate, as far as this host can tell."""
        return not self.blockers

    def data(self) -> Dict[str, str]:
        """As flat text (an action result, a relation's data): ``why-not`` joins the blockers."""
        return {"libvirt": _shown(self.libvirt), "qemu": _shown(self.qemu),
                "source": self.source,
                "live-migration": _flag(self.live_migration),
                "post-copy": _flag(self.post_copy),
                "vfio-live-migration": _flag(self.vfio_live_migration),
                "ready": _flag(self.ready),
                "why-not": "; ".join(self.blockers) or "nothing: guests can live-migrate",
                **({"warnings": "; ".join(self.warnings)} if self.warnings else {})}


def parse_version(value: str) -> Optional[Version]:
    """``10.0.0``, a Debian version (``1:8.2.2+ds-0ubuntu1.4``) or ``8.2``: its first three numbers."""
    text = value.strip()
    epoch, colon, rest = text.partition(":")
    if colon and epoch.isdigit():
        text = rest
    numbers = []
    for part in text.split("."):
        digits = ""
        for char in part:
            if not char.isdigit():
                break
            digits += char
        if not digits:
            break
        numbers.append(int(digits))
        if len(numbers) == 3 or len(digits) != len(part):
            break
    if not numbers:
        return None
    return (numbers + [0, 0])[0], (numbers + [0, 0])[1], (numbers + [0, 0])[2]


def parse_virsh(output: str) -> Tuple[Optional[Version], Optional[Version]]:
    """(libvirt, QEMU) from ``virsh -r version --daemon``.

    libvirt's ``tools/virsh-host.c`` (``cmdVersion``) prints "Running hypervisor:
    QEMU 8.2.2" (``virConnectGetVersion``) and, with ``--daemon``, "Running against
    daemon: 10.0.0" (``virConnectGetLibVersion``): what Nova's ``has_min_version``
    compares. A line not found gives None.
    """
    libvirt = qemu = None
    for line in output.splitlines()[:32]:
        head, _, value = line.partition(":")
        words = value.split()
        if head.strip() == "Running against daemon" and words:
            libvirt = parse_version(words[0])
        elif head.strip() == "Running hypervisor" and len(words) == 2 and words[0] == "QEMU":
            qemu = parse_version(words[1])
    return libvirt, qemu


def assess(libvirt: Optional[Version], qemu: Optional[Version], source: str, *,
           vfio_live_migration: bool, live_migration: Optional[bool] = None,
           post_copy: Optional[bool] = None, frameworks: Sequence[str] = (),
           nova_major: Optional[int] = None, principal: str = "nova-compute",
           downtime: Optional[Dict[str, int]] = None) -> Readiness:
    """The record, with every blocker, for guests on ``frameworks`` (``vfio``, ``mdev``)."""
    blockers = list(version_problems(libvirt, qemu, source, "vfio" in frameworks
                                     or not frameworks))
    if "mdev" in frameworks:
        blockers += [p for p in _mdev_problems(libvirt, qemu, source, nova_major)
                     if p not in blockers]
    if "vfio" in frameworks or not frameworks:
        if not vfio_live_migration:
            blockers.insert(0, f"{LIVE_MIGRATION} is false: VFIO device specs and aliases are "
                               "not live_migratable, so Nova only cold-migrates their guests")
    if live_migration is False:
        blockers.append(f"{principal} has live migration off (enable-live-migration)")
    if post_copy:
        blockers.append(post_copy_problem(principal))
    warnings = downtime_warnings(downtime or {}, principal) if live_migration else ()
    return Readiness(libvirt, qemu, source, live_migration, post_copy, vfio_live_migration,
                     tuple(frameworks), tuple(blockers), warnings)


def downtime_warnings(values: Dict[str, int], principal: str = "nova-compute") -> Tuple[str, ...]:
    """A warning when nova-compute's downtime settings are far from what vGPU guests need.

    ``values``: nova.conf's ``[libvirt]`` ``live_migration_downtime*`` as read
    (a key absent: Nova's default). Far: downtime below half of 500000 ms, or
    steps or delay above twice 3 (Nova's vGPU guide; Red Hat's configuration).
    """
    wanted = dict(DOWNTIME_SETTINGS)
    found = {option: values.get(key, default) for key, option, default in DOWNTIME_KEYS}
    far = (found["live-migration-downtime"] < int(wanted["live-migration-downtime"]) // 2
           or found["live-migration-downtime-steps"] > 2 * int(wanted["live-migration-downtime-steps"])
           or found["live-migration-downtime-delay"] > 2 * int(wanted["live-migration-downtime-delay"]))
    if not far:
        return ()
    now = "/".join(str(found[option]) for _, option, _ in DOWNTIME_KEYS)
    fix = " ".join(f"{option}={value}" for option, value in DOWNTIME_SETTINGS)
    return (f"{principal}'s live-migration downtime settings ({now}) are far from what vGPU "
            f"guests need (500000/3/3, Nova's vGPU guide): a vGPU guest's migration may not "
            f"converge; juju config {principal} {fix}",)


def version_problems(libvirt: Optional[Version], qemu: Optional[Version], source: str,
                     vfio: bool = True) -> Tuple[str, ...]:
    """Why Nova refuses a ``live_migratable`` device spec here (:data:`MIN_VFIO_LIBVIRT`, ...).

    Versions that cannot be read count as too old: Nova would refuse to start, so
    the charm must not find out by publishing.
    """
    if not vfio:
        return ()
    where = "installed" if source == INSTALLED else "running"
    if libvirt is None or qemu is None:
        return (f"cannot tell which libvirt and QEMU run here ({source}); Nova 31 and later "
                f"refuse to start with a live_migratable [pci] device_spec below libvirt "
                f"{_shown(MIN_VFIO_LIBVIRT)} or QEMU {_shown(MIN_VFIO_QEMU)}",)
    out = []
    if libvirt < MIN_VFIO_LIBVIRT:
        out.append(f"libvirt {_shown(libvirt)} ({where}) is older than {_shown(MIN_VFIO_LIBVIRT)}")
    if qemu < MIN_VFIO_QEMU:
        out.append(f"QEMU {_shown(qemu)} ({where}) is older than {_shown(MIN_VFIO_QEMU)}")
    if not out:
        return ()
    return ("; ".join(out) + ", which Nova needs for a live_migratable [pci] device_spec "
            "(nova-compute would not start)",)


def _mdev_problems(libvirt, qemu, source, nova_major) -> Tuple[str, ...]:
    out = []
    if nova_major is not None and nova_major < MIN_MDEV_NOVA:
        out.append(f"Nova {nova_major} does not live-migrate guests with mediated devices "
                   f"(Nova {MIN_MDEV_NOVA}, 2024.1 Caracal, and later do)")
    if libvirt is None or qemu is None:
        out.append(f"cannot tell which libvirt and QEMU run here ({source})")
    elif libvirt < MIN_MDEV_LIBVIRT or qemu < MIN_MDEV_QEMU:
        out.append(f"mediated devices live-migrate with libvirt {_shown(MIN_MDEV_LIBVIRT)} and "
                   f"QEMU {_shown(MIN_MDEV_QEMU)} or later; this host has libvirt "
                   f"{_shown(libvirt)}, QEMU {_shown(qemu)}")
    return tuple(out)


def post_copy_problem(principal: str = "nova-compute") -> str:
    """The status note when nova-compute permits post-copy (QEMU refuses it with VFIO devices)."""
    return (f"vGPU guests will not live-migrate: {principal} permits post-copy "
            "(live_migration_permit_post_copy), which QEMU refuses for VFIO devices; "
            + POST_COPY_FIX.format(principal=principal))


def blocks_publishing(readiness: Readiness) -> Tuple[str, ...]:
    """What stops ``vfio-live-migration`` from being published: Nova's version check, nothing else."""
    if not readiness.vfio_live_migration:
        return ()
    found = version_problems(readiness.libvirt, readiness.qemu, readiness.source)
    return tuple(f"{LIVE_MIGRATION} not applied: {problem}; upgrade libvirt and QEMU (Ubuntu "
                 f"24.04 ships libvirt 10.0.0 and QEMU 8.2.2) or set {LIVE_MIGRATION}=false; "
                 "the last published settings stay" for problem in found)


def _shown(version: Optional[Version]) -> str:
    return ".".join(str(n) for n in version) if version is not None else "unknown"


def _flag(value: Optional[bool]) -> str:
    return "unknown" if value is None else ("yes" if value else "no")
