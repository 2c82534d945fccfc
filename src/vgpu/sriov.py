"""SR-IOV virtual functions: enabled now, and again at every boot by a systemd unit.

VFs do not survive a reboot or a driver reload. NVIDIA's
``/usr/lib/nvidia/sriov-manage -e <GPU address>`` creates them; the charm runs
it for every SR-IOV GPU that has none, on every reconcile. The unit
``nvidia-vgpu-vfs.service`` (rendered from ``templates/``) does the same at
boot, after the vGPU manager and before nova-compute and libvirt, and writes
the vendor-specific VFIO types of the plan to their VFs again.
"""

import logging
from pathlib import Path
from string import Template
from typing import Iterable, List

from . import APP, files, hostroot, kernel, pci, run, services, text
from .errors import CommandError, ServiceError, SriovError

log = logging.getLogger(__name__)

SRIOV_MANAGE = "usr/lib/nvidia/sriov-manage"
UNIT = "nvidia-vgpu-vfs.service"
UNIT_FILE = f"etc/systemd/system/{UNIT}"
TEMPLATE = kernel.CHARM_ROOT / "templates" / UNIT
TIMEOUT = 300


def enable(addresses: Iterable[str]) -> List[str]:
    """Run ``sriov-manage -e`` for each GPU; returns the failures, one line each."""
    tool = hostroot.path(SRIOV_MANAGE)
    failures = []
    for address in addresses:
        if not tool.exists():
            failures.append(f"/{SRIOV_MANAGE} not found (is the vGPU host driver installed?)")
            break
        what = f"sriov-manage -e {address}"
        try:
            out = run.run([str(tool), "-e", address], TIMEOUT, check=False, what=what)
        except CommandError as error:  # could not run, or ran out of time
            failures.append(str(error))
            continue
        if out.returncode != 0:  # the script may say why on either stream
            why = text.cause(out.stderr or out.stdout) or f"exit status {out.returncode}"
            failures.append(f"{what} failed: {why}")
        else:
            log.info("enabled the virtual functions of %s", address)
    return failures


def render_unit(host: pci.Host, plan=None) -> str:
    """The unit's text: enable every SR-IOV GPU's VFs, then write the plan's VFIO types."""
    lines = [f"ExecStart=/{SRIOV_MANAGE} -e {gpu.address}" for gpu in host.gpus if gpu.sriov]
    for assignment in (plan.vfio() if plan is not None else ()):
        target = f"/sys/bus/pci/devices/{assignment.address}/nvidia/current_vgpu_type"
        lines.append(f"ExecStart=/bin/sh -c 'echo {assignment.number} > {target}'")
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        charm=APP, exec_lines="\n".join(lines))


def unit_path() -> Path:
    """Where the boot-time unit lives under the host root."""
    return hostroot.path(UNIT_FILE)


def ensure_unit(content: str) -> bool:
    """Install and enable the unit when its text changed; True when it did."""
    target = unit_path()
    try:
        previous = target.read_text(encoding="utf-8")
    except FileNotFoundError:
        previous = None
    except OSError as error:
        raise SriovError(f"cannot read /{UNIT_FILE}: {error.strerror or error}") from None
    if previous == content:
        return False
    try:
        files.write_atomic(target, content)
    except OSError as error:
        raise SriovError(f"cannot write /{UNIT_FILE}: {error.strerror or error}") from None
    try:
        services.reload_units()
        services.enable(UNIT)
    except ServiceError as error:
        raise SriovError(str(error)) from None
    log.info("installed and enabled %s", UNIT)
    return True


def remove_unit() -> bool:
    """Stop, disable and delete the unit (charm removal); True when there was one."""
    target = unit_path()
    if not target.exists():
        return False
    services.stop_and_disable(UNIT)
    target.unlink()
    services.reload_units()
    return True

