"""What the upstream charm leaves on a host, and this charm taking it over after ``juju refresh --switch``.

Operators of openstack/charm-nova-compute-nvidia-vgpu switch to this charm
in place: the application name, the ``nvidia-vgpu-software`` resource, the
``nova-vgpu`` relation and the ``vgpu-device-mappings`` syntax are the same.
Its last revision (c87c8bf, 2025-07; ``src/charm_utils.py``
``install_mdev_init_workaround``, ``src/nvidia_utils.py``, ``files/`` and
``templates/``) leaves on the host:

- :data:`UNIT` in ``/etc/systemd/system``, enabled in ``multi-user.target``
  (:data:`WANTS`), ordered after libvirtd and nvidia-vgpu-mgr and before
  nova-compute. At every boot it runs ``/opt/initialise_nova_mdevs.sh``
  (``sriov-manage -e ... ALL``: every SR-IOV GPU, mapped or not) and then
  ``/opt/remediate-nova-mdevs``, which creates the mdevs libvirt's domains
  name that are missing, on the GPU Placement allocated them (the mapping is
  frozen into the script when it was written), and replaces the trait list of
  each local provider of an ``nvidia-610`` GPU with :data:`TRAIT`;
- :data:`BLACKLIST`, its nouveau blacklist (``blacklist nouveau``,
  ``options nouveau modeset=0``; :mod:`vgpu.kernel` takes it over where
  :func:`ran` says the upstream charm ran, and leaves it alone elsewhere);
- its StoredState under this charm's own handle: ops keeps a charm's
  StoredState at ``<charm class>/StoredStateData[<attribute>]``, and both
  charms name their class ``NovaComputeNvidiaVgpuCharm`` and the attribute
  ``_stored`` (ops_openstack's ``OSBaseCharm``). Its :data:`PAUSED_KEY` is
  True while its ``pre-series-upgrade`` left :data:`PAUSED_SERVICES`
  stopped, disabled and masked;
- on ``nova-vgpu``: ``services: ["nvidia-vgpu-mgr"]`` and a
  ``releases-packages-map`` keyed by nova-common's codename.

This charm's boot step (``nvidia-vgpu-vfs.service``) restores VFs and mdevs
for the GPUs the mapping selects. Two restorers at boot would enable VFs on
GPUs the mapping leaves alone (passthrough, MIG) and create each mdev twice,
so :func:`retire` disables and deletes the old unit and its scripts, once
this charm's unit is in place or nothing on the host needs restoring. What
was removed is said once, in the log and in that hook's status. This module
never imports ops.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Callable, List, Mapping, Optional, Sequence

from . import files, hostroot, services, text

log = logging.getLogger(__name__)

UNIT = "systemd-mdev-workaround.service"
UNIT_FILE = f"etc/systemd/system/{UNIT}"
WANTS = f"etc/systemd/system/multi-user.target.wants/{UNIT}"  # what systemctl enable links
INIT_SCRIPT = "opt/initialise_nova_mdevs.sh"
REMEDIATE_SCRIPT = "opt/remediate-nova-mdevs"
SCRIPTS = (INIT_SCRIPT, REMEDIATE_SCRIPT)
BLACKLIST = "etc/modprobe.d/disable-nouveau.conf"
TRAIT = "CUSTOM_VGPU_PLACEMENT"
TRAIT_TYPE = "nvidia-610"  # the one type whose providers the old script gave TRAIT
PAUSED_KEY = "is_paused"  # ops_openstack OSBaseCharm's StoredState key
# Its StoredState keys (ops_openstack OSBaseCharm's, then the charm's own), none of them this charm's.
STORED_KEYS = ("is_started", PAUSED_KEY, "series_upgrade", "last_installed_resource_hash")
PAUSED_SERVICES = ("nvidia-vgpu-mgr",)  # the upstream charm's RESTART_MAP services
SCRIPT_LIMIT = 1 << 20  # bytes read of the old script (about 10 KiB as written)
DOCS = "docs/how-to/switch-from-upstream.md"


def found() -> List[str]:
    """The old unit's file, its link and its scripts that are on the host (paths under the root).

    ``lstat`` only: every hook asks, and the answer is nearly always nothing.
    """
    return [where for where in (UNIT_FILE, WANTS, *SCRIPTS)
            if os.path.lexists(hostroot.text_path(where))]


def ran(stored: Callable[[str], bool]) -> bool:
    """Whether the upstream charm ran on this unit: what it left in Juju or on the host.

    ``stored``: whether this charm's StoredState holds a key (ops keeps both
    charms' under one handle, so upstream's :data:`STORED_KEYS` stay there
    after the switch); else its unit or scripts on the host (:func:`found`).
    Its nouveau blacklist alone is no evidence: an operator may have written
    a file of that name (:mod:`vgpu.kernel` leaves it alone then).
    """
    return any(stored(key) for key in STORED_KEYS) or bool(found())


def retire(restorer: str, published: Mapping[str, Sequence[str]]) -> List[str]:
    """Disable and delete the old unit, then its scripts; the notes to say once.

    ``restorer``: what restores vGPU state at boot from now on, for the note.
    ``published``: the mapping nova-compute has now (for the GPUs the old
    script gave :data:`TRAIT`). The unit is disabled first, so that whatever
    fails after it, nothing of the old charm runs at the next boot; then its
    file and link go, systemd reloads, and the scripts go last. Raises
    ServiceError (systemctl) or OSError (a path; a link on the way is not
    followed); the next hook tries again.
    """
    present = found()
    if not present:
        return []
    notes = [note for note in [_trait_note(published)] if note]
    if UNIT_FILE in present:
        services.disable(UNIT)
    for where in (WANTS, UNIT_FILE):
        files.remove(hostroot.path(where))
    if UNIT_FILE in present or WANTS in present:
        services.reload_units()
    for where in SCRIPTS:
        files.remove(hostroot.path(where))
    gone = ([UNIT] if UNIT_FILE in present or WANTS in present else []) + \
        [f"/{where}" for where in SCRIPTS if where in present]
    said = f"removed the upstream charm's {text.listing(gone)}: {restorer}"
    for note in [said, *notes]:
        log.info("%s", note)
    return [said, *notes]


def _trait_note(published: Mapping[str, Sequence[str]]) -> Optional[str]:
    """What to say when the old script set :data:`TRAIT` (it names :data:`TRAIT_TYPE`).

    Read before the script goes; a script that cannot be read says nothing
    (it set the trait only for a mapping that names the type, and the docs
    say how to check Placement).
    """
    try:
        raw = files.read(hostroot.path(REMEDIATE_SCRIPT), SCRIPT_LIMIT)
    except OSError as error:
        log.warning("cannot read /%s: %s", REMEDIATE_SCRIPT, error.strerror or error)
        return None
    if raw is None or not re.search(rb"^MDEV_TYPES = .*['\"]" + TRAIT_TYPE.encode() + rb"['\"]",
                                    raw, re.M):
        return None
    gpus = list(published.get(TRAIT_TYPE, ()))
    where = f" ({text.listing(gpus)})" if gpus else ""
    return (f"the upstream charm's boot script set trait {TRAIT} on the Placement providers of "
            f"{TRAIT_TYPE}{where} at every boot; this charm leaves Placement alone: the trait "
            f"stays on those providers, a provider made anew gets none ({DOCS})")


def services_note(before: Mapping[str, str], changed: Mapping[str, str]) -> Optional[str]:
    """What to say when ``changed`` takes the old charm's services off nova-compute's list.

    ``before``: this unit's data on a ``nova-vgpu`` relation; ``changed``: the
    keys about to be set there.
    """
    if "services" not in changed:
        return None
    try:
        listed = json.loads(before.get("services") or "[]")
    except ValueError:
        return None
    left = [name for name in PAUSED_SERVICES if isinstance(listed, list) and name in listed]
    if not left:
        return None
    note = (f"{', '.join(left)} left nova-compute's services: its pause and openstack-upgrade "
            "no longer stop it; this unit's pause and resume do")
    log.info("%s", note)
    return note
