"""The metrics exporter's systemd unit, ``nvidia-vgpu-exporter.service``, and its port.

While the cos-agent relation exists the charm keeps the unit (rendered from
``templates/``) installed, enabled and running: the charm's own python3 runs
``src/vgpu_exporter.py --port <metrics-port>`` with the charm's ``venv/`` on
``PYTHONPATH`` (prometheus-client, nvidia-ml-py), ``Type=simple``, listening
on 127.0.0.1 only and sandboxed (read-only system, no new privileges, only
``CAP_DAC_READ_SEARCH``, IPv4 to localhost only). The charm writes it on
config-changed, upgrade-charm (restarting it on the new code) and cos-agent's
relation events, and removes it when the relation goes and on remove; no
other hook touches it.

The port: an integer from 1024 to 65535 (the sandbox grants no privileged
port), and not one a neighbour on a GPU host listens on by default
(:data:`NEIGHBOURS`: hardware-observer's exporters and the DCGM exporter its
DCGM snap runs, node-exporter, the collector's own ports). A port that
another process already listens on is refused too, read from the kernel's
``/proc/net/tcp`` and ``tcp6``, unless it is this exporter's own. A refused
port leaves the exporter running as it was.
"""

from __future__ import annotations

import logging
import os
import re
import sys
from string import Template
from typing import List, Optional, Set

from . import APP, files, hostroot, kernel, services
from .errors import ExporterError, HostReadError, ServiceError

log = logging.getLogger(__name__)

OPTION = "metrics-port"
TENANTS_OPTION = "exporter-tenant-identities"  # instance and project identities, to root only
DEFAULT_PORT = 10230
ADDRESS = "127.0.0.1"
UNIT = "nvidia-vgpu-exporter.service"
UNIT_FILE = f"etc/systemd/system/{UNIT}"
RUNTIME_UNIT_FILE = f"run/systemd/system/{UNIT}"  # where ``systemctl mask --runtime`` links
TEMPLATE = kernel.CHARM_ROOT / "templates" / UNIT
SCRIPT = kernel.CHARM_ROOT / "src" / "vgpu_exporter.py"
VENV = kernel.CHARM_ROOT / "venv"  # the charm's dependencies, as its dispatch puts them on the path
# Who listens on a port by default on a GPU compute host, and so which ports are refused.
NEIGHBOURS = {
    9100: "prometheus-node-exporter",
    9400: "dcgm-exporter (the DCGM snap hardware-observer installs on NVIDIA GPU hosts)",
    10200: "hardware-observer's hardware-exporter (its hardware-exporter-port)",
    10201: "hardware-observer's smartctl-exporter (its smartctl-exporter-port)",
    4317: "opentelemetry-collector's OTLP gRPC receiver",
    4318: "opentelemetry-collector's OTLP HTTP receiver",
    8888: "opentelemetry-collector's own metrics",
    12345: "grafana-agent",
}
PROC_NET = ("proc/net/tcp", "proc/net/tcp6")
_WORD = re.compile(r"[A-Za-z0-9/._+@:-]+")  # what systemd takes unquoted in ExecStart
_LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_LOCAL = {"00000000", "0100007F", "00000000000000000000000000000000",
          "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def port(value) -> int:
    """The ``metrics-port`` option as a port the exporter may use; ExporterError saying why not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ExporterError(f"{OPTION} {value!r} is not a port number: give an integer "
                            f"from 1024 to 65535 (default {DEFAULT_PORT})")
    if not 1024 <= value <= 65535:
        raise ExporterError(f"{OPTION} {value} is out of range: give a port from 1024 to 65535 "
                            f"(default {DEFAULT_PORT}; the sandboxed exporter gets no port below "
                            "1024)")
    if value in NEIGHBOURS:
        raise ExporterError(f"{OPTION} {value} is the port of {NEIGHBOURS[value]}: give another "
                            f"(default {DEFAULT_PORT})")
    return value


def render(number: int, tenants: bool = False) -> str:
    """The unit's text for ``number`` (a port :func:`port` accepted).

    ``tenants``: the exporter serves tenant identities to root's scrapes (:data:`TENANTS_OPTION`).
    """
    words = (sys.executable, str(SCRIPT), str(VENV))
    for word in words:
        if not _WORD.fullmatch(word):
            raise ExporterError(f"cannot name {word!r} in {UNIT}: unusual characters")
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        charm=APP, python=words[0], script=words[1], venv=words[2], port=number,
        address=ADDRESS, options=" --tenant-identities" if tenants else "")


def installed_port() -> Optional[int]:
    """The port the installed unit serves, None without one (or one not written by the charm)."""
    try:
        text = files.read(hostroot.path(UNIT_FILE), 1 << 16)
    except OSError:
        return None
    found = re.search(rb"^ExecStart=.* --port ([0-9]{1,5})$", text or b"", re.MULTILINE)
    return int(found.group(1)) if found else None


def listening() -> Set[int]:
    """TCP ports something listens on, on 127.0.0.1 or every address (IPv4 and IPv6)."""
    out: Set[int] = set()
    for name in PROC_NET:
        try:
            text = hostroot.read_text(hostroot.path(name)) or ""
        except HostReadError as error:  # unreadable is "none known", said in the log
            log.warning("%s", error)
            continue
        for line in text.splitlines()[1:]:
            fields = line.split()
            if len(fields) < 4 or fields[3] != _LISTEN:
                continue
            address, _, hex_port = fields[1].partition(":")
            if address.upper() in _LOCAL:
                try:
                    out.add(int(hex_port, 16))
                except ValueError:
                    continue
    return out


def ensure(number: int, restart: bool = False, tenants: bool = False) -> bool:
    """Install (or rewrite) the unit for port ``number`` and start it; True when anything changed.

    ``restart``: enable and restart it even when its text is the same (the charm's code
    changed, or an earlier attempt failed after the text was written: systemctl's part is
    done again, not skipped because the file is already right).
    A port another process listens on is refused (ExporterError) and nothing is changed;
    so is a unit the operator masked (``systemctl mask``, persistent or ``--runtime``): its
    ``/dev/null`` link is never replaced, nothing is started (:func:`masked`).
    ``tenants``: as :func:`render` has it.
    """
    if masked():
        log.info("%s is masked: left as it is", UNIT)
        return False
    previous = installed_port()
    if number != previous and number in listening():
        raise ExporterError(f"{OPTION} {number}: another process listens on it on this host "
                            f"(ss -ltnp 'sport = :{number}' names it): give another port")
    content = render(number, tenants)
    target = hostroot.path(UNIT_FILE)
    try:
        before = files.read(target, 1 << 16)
    except OSError:
        before = None
    changed = before != content.encode("utf-8")
    try:
        if changed:
            files.write_atomic(target, content)
            services.reload_units()
        if changed or restart:
            services.enable(UNIT)
            services.restart(UNIT)
    except OSError as error:
        raise ExporterError(f"cannot write /{UNIT_FILE}: {error.strerror or error}") from None
    except ServiceError as error:
        raise ExporterError(f"the metrics exporter did not start: {error}") from None
    if changed:
        log.info("%s serves http://%s:%d/metrics", UNIT, ADDRESS, number)
    return changed or restart


def remove() -> bool:
    """Stop, disable and delete the unit; True when there was one. ExporterError if it cannot."""
    target = hostroot.path(UNIT_FILE)
    if not os.path.lexists(target):
        return False
    if masked():  # the operator's mask (the /dev/null link in the unit's place) stays
        log.info("%s is masked: left as it is", UNIT)
        return False
    try:
        services.stop_and_disable(UNIT)
        files.remove(target)
        services.reload_units()
    except ServiceError as error:
        raise ExporterError(f"cannot remove {UNIT}: {error}") from None
    except OSError as error:
        raise ExporterError(f"cannot remove /{UNIT_FILE}: {error.strerror or error}") from None
    log.info("removed %s", UNIT)
    return True


def sync(related: bool, option=None, restart: bool = False, tenants: object = False) -> str:
    """The exporter for ``option`` (``metrics-port``) while ``related``, else none; why not, or "".

    ``tenants``: :data:`TENANTS_OPTION` (a value that is not True counts as off).

    What :func:`ensure` or :func:`remove` refused is logged and returned (the
    charm's status says it until a later sync works); nothing raises.
    """
    try:
        if related:
            ensure(port(option), restart=restart, tenants=tenants is True)
        else:
            remove()
    except ExporterError as error:
        log.error("%s", error)
        return str(error)
    return ""


def scrape_configs(instance: str) -> List[dict]:
    """What the collector scrapes: the port the installed exporter serves; no job without one.

    A refused port is never in force: while the exporter was refused before it
    was ever installed (its port taken), or while the operator masks it, there
    is nothing to scrape and no job is given.
    ``instance``: the host's name, for the ``instance`` label (127.0.0.1 says nothing in COS).
    """
    number = installed_port()
    if number is None or masked():
        return []
    return [{"job_name": "nvidia_vgpu_exporter", "metrics_path": "/metrics",
             "static_configs": [{"targets": [f"{ADDRESS}:{number}"],
                                 "labels": {"instance": instance}}]}]


def masked() -> bool:
    """Whether the operator masked the unit: ``systemctl mask``, persistent or ``--runtime``.

    Both put a link to ``/dev/null`` in the unit's place: ``/etc/systemd/system`` (where the
    charm writes the unit) or ``/run/systemd/system``.
    """
    return files.masked(hostroot.path(UNIT_FILE), hostroot.path(RUNTIME_UNIT_FILE))


MASKED = (f"{UNIT} is masked: no vGPU metrics until it is unmasked "
          f"(systemctl unmask {UNIT}, then any juju config change)")

