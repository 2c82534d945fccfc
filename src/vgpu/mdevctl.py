"""mdevctl, which Nova 30 and later needs on an mdev host, installed by the charm itself.

From Nova 30 (2024.2 Dalmatian) the libvirt driver defines each mdev as a
persistent libvirt node device; libvirt's node-device driver does that by
running ``mdevctl``, which no package of this stack depends on (Ubuntu ships
it on its own, in universe). Without it every vGPU instance build fails
("Cannot find 'mdevctl' in path").

The charm installs it with apt, before it publishes mdev types (so before
the first instance can be scheduled here), rather than through the
``releases-packages-map`` it sends nova-compute: nova-compute installs that
map only in its own install, upgrade-charm and openstack-upgrade hooks, never
when this unit's data changes, and with ``fatal=True``, so a package its
sources lack would fail nova-compute's own hooks. Nothing here imports ops.

While apt cannot install it, update-status (every five minutes on every
host) does not run apt again until :data:`RETRY_AFTER` has passed since the
last failed attempt (:func:`retry_due`): each attempt holds dpkg's lock, which
nova-compute's own hooks may want, for up to three apt runs. The charm keeps
that attempt (:class:`Failure`) in its own state; every other hook tries at once.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Mapping, Optional

from . import hostroot, novaconf, run
from .errors import CommandError, InstallError
from .record import NamedTuple

log = logging.getLogger(__name__)

PACKAGE = "mdevctl"
FIRST_NOVA = 30  # the first Nova that defines mdevs through libvirt (and so mdevctl)
PROGRAMS = ("usr/sbin/mdevctl", "usr/bin/mdevctl")  # where the package puts it
APT_TIMEOUT = 300  # seconds per apt-get run
_INSTALL = ["apt-get", "install", "--yes", "--no-install-recommends", PACKAGE]
RETRY_AFTER = 3600  # seconds update-status waits after a failed install before trying again


class Failure(NamedTuple):
    """The last attempt to install mdevctl that failed: when (seconds since the epoch) and why."""

    at: float
    cause: str


def retry_due(failed: Failure, now: float) -> bool:
    """Whether update-status may try again: RETRY_AFTER has passed, or the clock went back."""
    return not failed.at <= now < failed.at + RETRY_AFTER


def to_record(failed: Optional[Failure]) -> Dict[str, Any]:
    """``failed`` as plain data to keep between hooks ({} for none)."""
    return {} if failed is None else {"at": failed.at, "cause": failed.cause}


def from_record(record: Mapping[str, Any]) -> Optional[Failure]:
    """The failure a record keeps; None for none, or for a record that cannot be read (retry)."""
    try:
        return Failure(float(record["at"]), str(record["cause"]))
    except (KeyError, TypeError, ValueError):
        return None


def needed(nova_major: int) -> bool:
    """Whether this Nova runs mdevctl (through libvirt) for the mdevs it creates."""
    return nova_major >= FIRST_NOVA


def present() -> bool:
    """Whether mdevctl is on the host (under the host root), executable."""
    return any(os.access(hostroot.path(p), os.X_OK) and hostroot.path(p).is_file()
               for p in PROGRAMS)


def ensure() -> bool:
    """mdevctl on the host: installed with apt when missing (the package lists refreshed once).

    Returns True when it was installed now. Raises InstallError saying why
    it could not be.
    """
    if present():
        return False
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    try:
        run.run(_INSTALL, APT_TIMEOUT, what=f"apt-get install {PACKAGE}", env=env)
    except CommandError as first:
        log.info("apt-get install %s failed (%s); refreshing the package lists", PACKAGE,
                 first.cause)
        try:
            run.run(["apt-get", "update"], APT_TIMEOUT, what="apt-get update", env=env)
            run.run(_INSTALL, APT_TIMEOUT, what=f"apt-get install {PACKAGE}", env=env)
        except CommandError as error:
            raise InstallError(str(error)) from None
    if not present():
        raise InstallError(f"apt-get installed {PACKAGE} but /{PROGRAMS[0]} is not there")
    log.info("installed %s: Nova defines its mdevs through libvirt, which runs it", PACKAGE)
    return True


# -- the hook's step (run by vgpu.reconcile on its _Hook) ----------------------------------------

def step_ready(hook, sections, release) -> bool:
    """mdevctl on the host before mdev types go out on Nova 30+; False (blocked) without it.

    Whether it is there is read every hook. Missing, it is installed with apt,
    except on update-status within RETRY_AFTER of the last failed
    attempt: then no apt runs and that attempt's cause is said again, with
    when it is retried. The outcome keeps the failed attempt (None once there).
    """
    if not sections or release is None or not needed(release.nova_major) \
            or not novaconf.mapping_from_sections(
                {k: v for k, v in sections.items() if k != "pci"}):
        return True
    if present():
        hook.out.mdevctl_failed = None
        return True
    failed = hook.given.mdevctl_failed
    if hook.given.backoff and failed is not None and not retry_due(failed, time.time()):
        cause = failed.cause  # no apt now: the last attempt's cause, and when it is retried
        at = time.strftime("%H:%M", time.gmtime(failed.at + RETRY_AFTER))
        retry = f"; tried again at the next config-changed or after {at} UTC"
    else:
        try:
            ensure()
        except InstallError as error:
            cause, retry = str(error), ""
            hook.out.mdevctl_failed = Failure(time.time(), cause)
        else:
            hook.out.mdevctl_failed = None
            return True
    hook.problems.append(
        f"{PACKAGE} is missing and could not be installed ({cause}): Nova "
        f"{release.nova_major} ({release.series} {release.codename}) defines mdevs through "
        f"libvirt, which runs {PACKAGE}, so every vGPU instance build would fail; "
        f"make it installable (universe) or install it, then the mdev types are published"
        + retry)
    return False
