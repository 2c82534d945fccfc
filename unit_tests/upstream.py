"""What the upstream charm leaves on a host and in Juju: fixtures for a switch to this charm.

openstack/charm-nova-compute-nvidia-vgpu at c87c8bf7b850973e8d59ff042723ef314949cb23
(2025-07-10, "Add Nova mdev initialisation workaround"), its last revision, read in full:

- ``src/charm_utils.py`` ``install_mdev_init_workaround`` (upgrade-charm and start): copies
  ``files/initialise_nova_mdevs.sh`` to ``/opt`` (mode 0755), renders
  ``templates/remediate_nova_mdevs.py`` to ``/opt/remediate-nova-mdevs`` (0755) with the
  option's mapping as ``MDEV_TYPES = {{ mdev_types }}``, renders
  ``templates/systemd-mdev-workaround.service`` to ``/etc/systemd/system`` (0644) and runs
  ``systemctl enable`` (a link in ``multi-user.target.wants``), starting nothing;
- ``src/nvidia_utils.py`` ``disable_nouveau_driver`` (after installing the resource): renders
  ``templates/disable-nouveau.conf`` to ``/etc/modprobe.d/disable-nouveau.conf``, then
  ``update-initramfs``. charmhelpers' ``render`` writes mode 0444 by default and its jinja2
  Environment drops a template's last newline (``keep_trailing_newline`` is off), as for
  every rendered file here;
- ``set_principal_unit_relation_data``: ``subordinate_configuration`` (``json.dumps``; from
  Xena the types joined with ``", "`` in ``[devices] enabled_mdev_types`` and each type's
  addresses with ``","`` in ``[mdev_<type>] device_addresses``, as the operator wrote them),
  ``services`` (``json.dumps(self.services())``: the RESTART_MAP's ``nvidia-vgpu-mgr`` where a
  GPU is) and ``releases-packages-map`` (``json.dumps(..., sort_keys=True)``, keyed by
  ``get_os_codename_package('nova-common')``: ``caracal`` for Nova 29);
- StoredState: ops_openstack's ``OSBaseCharm`` (openstack/charm-ops-openstack
  ``ops_openstack/core.py``) declares ``_stored = StoredState()`` and defaults ``is_started``,
  ``is_paused`` and ``series_upgrade`` to False (``on_pre_series_upgrade`` sets both of the
  last two, after pausing its services); the charm, class ``NovaComputeNvidiaVgpuCharm``, adds
  ``last_installed_resource_hash`` (charmhelpers ``file_hash``: sha256). ops keeps it at
  ``NovaComputeNvidiaVgpuCharm/StoredStateData[_stored]``: :func:`handle_path` builds that path
  with ops' own ``Handle``.

The two /opt scripts here are stand-ins, not upstream's code: each records its run in
``$FAKE_LOG``; the init script runs ``sriov-manage`` (under ``$VGPU_HOST_ROOT``) with the
arguments upstream's passes, and the remediate script carries the ``MDEV_TYPES`` line as
upstream's rendering writes it (``str()`` of ruamel's CommentedMap: its keys quoted), the
only line of it this charm reads.
"""

import hashlib
import json
import os
import shlex
import subprocess
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

import ops

from vgpu import boot, upstream

COMMIT = "c87c8bf7b850973e8d59ff042723ef314949cb23"
CHARM_CLASS = "NovaComputeNvidiaVgpuCharm"  # upstream src/charm.py
STORED_ATTRIBUTE = "_stored"  # ops_openstack OSBaseCharm

# templates/systemd-mdev-workaround.service as rendered (no last newline).
UNIT_TEXT = """[Unit]
Description=GPU MDev Initialisation Workaround for OpenStack Nova
Before=nova-compute.service
After=syslog.target network.target libvirtd.service nvidia-vgpu-mgr.service

[Service]
Environment="MDEV_INIT_DRY_RUN=False"
Type=oneshot
ExecStart=/bin/bash /opt/initialise_nova_mdevs.sh

[Install]
WantedBy=multi-user.target"""
# templates/disable-nouveau.conf as rendered.
BLACKLIST_TEXT = "blacklist nouveau\noptions nouveau modeset=0"
# The stand-in for files/initialise_nova_mdevs.sh: its sriov-manage line has upstream's arguments.
INIT_SCRIPT = """#!/bin/bash -e
# Stand-in for the upstream charm's /opt/initialise_nova_mdevs.sh (files/ at c87c8bf).
echo "initialise_nova_mdevs.sh" >> "$FAKE_LOG"
"$VGPU_HOST_ROOT"/usr/lib/nvidia/sriov-manage -e srvio-manage -e ALL
"$VGPU_HOST_ROOT"/opt/remediate-nova-mdevs
"""
REMEDIATE_SCRIPT = """#!/usr/bin/env python3
# Stand-in for the upstream charm's /opt/remediate-nova-mdevs (templates/ at c87c8bf): it
# records its run; the line this charm reads is as the rendering writes it.
import os

MDEV_TYPES = {types}  # noqa pylint: disable=unhashable-member,undefined-variable

with open(os.environ["FAKE_LOG"], "a", encoding="utf-8") as log:
    log.write("remediate-nova-mdevs\\n")
"""


def sections(mapping: Mapping[str, Sequence[str]]) -> dict:
    """The nova.conf sections it publishes from Xena on (``_nova_conf_sections``)."""
    out: Dict[str, list] = {"devices": [["enabled_mdev_types", ", ".join(mapping)]]}
    for vgpu_type, addresses in mapping.items():
        out[f"mdev_{vgpu_type}"] = [["device_addresses", ",".join(addresses)]]
    return out


def relation_data(mapping: Mapping[str, Sequence[str]], release: str = "caracal",
                  packages: Sequence[str] = ("nvidia-vgpu-ubuntu-570",)) -> Dict[str, str]:
    """Its unit data on ``nova-vgpu`` for ``mapping`` (the option, as written) on a GPU host."""
    return {
        "subordinate_configuration": json.dumps(
            {"nova": {"/etc/nova/nova.conf": {"sections": sections(mapping)}}}),
        "services": json.dumps(["nvidia-vgpu-mgr"]),
        "releases-packages-map": json.dumps(
            {release: {"deb": {"install": list(packages), "purge": []}}}, sort_keys=True),
    }


def stored_state(resource: Optional[Path] = None, paused: bool = False) -> dict:
    """Its StoredState after start (``paused``: after pre-series-upgrade)."""
    digest = hashlib.sha256(resource.read_bytes()).hexdigest() if resource else None
    return {"is_started": True, "is_paused": paused, "series_upgrade": paused,
            "last_installed_resource_hash": digest}


def handle_path() -> str:
    """Where ops keeps its StoredState: built by ops' own Handle from upstream's names."""
    charm = ops.Handle(None, CHARM_CLASS, None)
    return ops.Handle(charm, ops.StoredStateData.handle_kind, STORED_ATTRIBUTE).path


def save_stored_state(charm_dir: Path, content: Mapping) -> None:
    """Write it into a unit's ops state (``.unit-state.db``) with ops' own SQLite storage."""
    from ops.storage import SQLiteStorage

    storage = SQLiteStorage(charm_dir / ".unit-state.db")
    try:
        storage.save_snapshot(handle_path(), dict(content))
        storage.commit()
    finally:
        storage.close()


def load_stored_state(charm_dir: Path) -> dict:
    """The StoredState at upstream's handle, read back with ops' own SQLite storage."""
    from ops.storage import SQLiteStorage

    storage = SQLiteStorage(charm_dir / ".unit-state.db")
    try:
        return storage.load_snapshot(handle_path())
    finally:
        storage.close()


def leave_files(root: Path, mapping: Mapping[str, Sequence[str]]) -> None:
    """What its start and upgrade-charm leave on the host for ``mapping``."""
    units = root / "etc/systemd/system"
    (units / "multi-user.target.wants").mkdir(parents=True, exist_ok=True)
    (root / upstream.UNIT_FILE).write_text(UNIT_TEXT)
    (root / upstream.UNIT_FILE).chmod(0o644)
    (root / upstream.WANTS).symlink_to(f"/{upstream.UNIT_FILE}")
    (root / "opt").mkdir(exist_ok=True)
    types = repr({t: list(a) for t, a in mapping.items()})
    for where, content in ((upstream.INIT_SCRIPT, INIT_SCRIPT),
                           (upstream.REMEDIATE_SCRIPT, REMEDIATE_SCRIPT.format(types=types))):
        (root / where).write_text(content)
        (root / where).chmod(0o755)
    leave_blacklist(root)


def leave_blacklist(root: Path, content: str = BLACKLIST_TEXT) -> Path:
    path = root / upstream.BLACKLIST
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content)
    path.chmod(0o444)
    return path


# -- a boot, as systemd starts the enabled units before nova-compute ---------------------------

def boot_units(root: Path) -> List[str]:
    """The units systemd starts at boot, those ordered before libvirtd first (``Before=``).

    Files in /etc/systemd/system, wanted by multi-user.target and enabled (the fake
    systemctl's state; a unit never enabled nor disabled counts as enabled).
    """
    found = []
    for path in sorted((root / "etc/systemd/system").glob("*.service")):
        if path.is_symlink() or not path.is_file():
            continue
        text = path.read_text()
        state = Path(os.environ["FAKE_STATE"]) / f"{path.name}.enabled"
        enabled = not state.exists() or state.read_text().strip() == "enabled"
        if "WantedBy=multi-user.target" in text and enabled:
            before = any(line.startswith("Before=") and "libvirtd.service" in line
                         for line in text.splitlines())
            found.append((0 if before else 1, path.name))
    return [name for _, name in sorted(found)]


def start_at_boot(root: Path) -> List[Tuple[str, int]]:
    """Run each unit :func:`boot_units` names once, in order: ``[(unit, exit status)]``.

    This charm's unit runs in this process, as test_boot runs the boot step (the fixture's
    kernel models apply here only): its ExecStart's Python and script are checked and its
    data argument given to :func:`vgpu.boot.main`. Any other runs as a process, its /opt
    paths under the host root.
    """
    done = []
    for name in boot_units(root):
        text = (root / "etc/systemd/system" / name).read_text()
        exec_start = next(line.split("=", 1)[1] for line in text.splitlines()
                          if line.startswith("ExecStart="))
        argv = shlex.split(exec_start)
        if argv[1].endswith("/src/vgpu_boot.py"):
            done.append((name, boot.main(argv[2:])))
            continue
        argv = [f"{root}{a}" if a.startswith("/opt/") else a for a in argv]
        run = subprocess.run(argv, env=dict(os.environ), capture_output=True, text=True,
                             timeout=60)
        done.append((name, run.returncode))
    return done
