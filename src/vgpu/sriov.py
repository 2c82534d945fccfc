"""SR-IOV virtual functions: enabled now, and again at every boot by a systemd unit.

VFs do not survive a reboot or a driver reload. NVIDIA's
``/usr/lib/nvidia/sriov-manage -e <GPU address>`` creates them. Only GPUs that
are ours are touched (:func:`selected`): those ``vgpu-device-mappings``
selects, and only while they are bound to the ``nvidia`` driver; a GPU left
for whole-GPU passthrough (bound to vfio-pci) is never enabled. The charm
runs it for such GPUs that have no VFs, within :data:`HOOK_BUDGET` seconds per
hook. The unit ``nvidia-vgpu-vfs.service`` (rendered from ``templates/``)
runs :mod:`vgpu.boot` at boot, after the vGPU manager and before nova-compute
and libvirt: it reads the GPUs and the VFs' profile names from
:data:`DATA_FILE` (:func:`boot_data`), so the unit's text names no type id
that a driver upgrade could renumber. A unit the operator masked is left
masked (:func:`unit_masked`).
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
import time
from pathlib import Path
from string import Template
from types import MappingProxyType
from typing import Dict, Iterable, List, Mapping, Optional, Sequence

from . import APP, bootfile, files, hostlock, hostroot, kernel, pci, run, services, text
from .errors import CommandError, HostReadError, ServiceError, SriovError
from .record import NamedTuple

log = logging.getLogger(__name__)

SRIOV_MANAGE = "usr/lib/nvidia/sriov-manage"
UNIT = bootfile.UNIT  # nvidia-vgpu-vfs.service
UNIT_FILE = f"etc/systemd/system/{UNIT}"
RUNTIME_UNIT_FILE = f"run/systemd/system/{UNIT}"  # where ``systemctl mask --runtime`` links
UNIT_LIMIT = 1 << 16  # bytes of the unit file read back; the charm's own text is about 1.3 KB
TEMPLATE = kernel.CHARM_ROOT / "templates" / UNIT
BOOT_SCRIPT = kernel.CHARM_ROOT / "src" / "vgpu_boot.py"
DATA_FILE = bootfile.DATA_FILE
DATA_VERSION = bootfile.DATA_VERSION
NVIDIA_DRIVER = "nvidia"
STUB_DRIVER = "pci-pf-stub"  # sriov-manage binds a GPU to it while it writes sriov_numvfs
DRIVERS = "sys/bus/pci/drivers"
TIMEOUT = 300  # one sriov-manage run
HOOK_BUDGET = 480  # every sriov-manage run of one hook together
MIN_CALL = 0.5  # a GPU with less time than this left is not tried in this hook
_SYSTEMD_WORD = re.compile(r"[A-Za-z0-9/._+@:-]+")
# One sriov-manage run at a time in this process (the boot step's threads); between processes
# the host lock (vgpu.hostlock) is held by every caller: the boot step, hooks and actions.
_ONE_AT_A_TIME = threading.Lock()


class Selection(NamedTuple):
    """The SR-IOV GPUs a mapping selects: ``wanted`` are ours; ``refused``, why not."""

    wanted: tuple = ()  # GPU addresses bound to nvidia: their VFs are enabled
    refused: Mapping[str, str] = MappingProxyType({})  # GPU address -> why it is left alone

    @property
    def addresses(self) -> tuple:
        """Every GPU the mapping selects, ours or refused."""
        return (*self.wanted, *self.refused)


def selected(mapping: Mapping[str, Sequence[str]], host: pci.Host,
             whole: Sequence[str] = ()) -> Selection:
    """Which SR-IOV GPUs ``mapping`` (checked, normalised) selects, before or after their VFs exist.

    ``all`` selects every SR-IOV GPU bound to the nvidia driver: before its VFs
    exist nobody can tell which types a GPU offers, so each is enabled and the
    plan then serves those that offer the type. A GPU bound to another driver
    (vfio-pci: whole-GPU passthrough) is not selected by ``all``. An address
    selects its GPU: the GPU's own, one of its VFs, or, while the VFs do not
    exist, a VF address on the bus of a GPU without VFs (NVIDIA's VFs follow
    their GPU's routing ID on its bus). A GPU named by address but bound to
    another driver is refused, with the reason. GPUs given ``whole`` to guests
    (the mapping's ``passthrough``) are never selected: they get no VFs.
    """
    gpus = [gpu for gpu in host.gpus if gpu.sriov and gpu.address not in whole]
    chosen: Dict[str, pci.Gpu] = {}
    named: Dict[str, pci.Gpu] = {}
    owners = host.owners()  # as host.gpu(address), for every address
    for addresses in mapping.values():
        if tuple(addresses) == ("all",):
            chosen.update((g.address, g) for g in gpus if ours(g.driver))
            continue
        for address in addresses:
            gpu = owners.get(address)
            gpu = gpu if gpu is not None else _by_bus(address, gpus)
            if gpu is not None and gpu.sriov and gpu.address not in whole:
                named[gpu.address] = gpu
    chosen.update(named)
    wanted = tuple(a for a in sorted(chosen) if ours(chosen[a].driver))
    refused = {a: f"it is bound to {chosen[a].driver}, not {NVIDIA_DRIVER}"
               for a in sorted(chosen) if not ours(chosen[a].driver)}
    return Selection(wanted, refused)


def unbound(driver: Optional[str]) -> bool:
    """A GPU that sriov-manage left unbound: no driver, or still on pci-pf-stub (see :func:`rebind`)."""
    return driver is None or driver == STUB_DRIVER


def ours(driver: Optional[str]) -> bool:
    """Bound to nvidia, or left unbound by a failed sriov-manage run: the charm's to enable.

    A GPU bound to any other driver (vfio-pci: whole-GPU passthrough) was given
    to it on purpose and is left alone.
    """
    return driver == NVIDIA_DRIVER or unbound(driver)


def _by_bus(address: str, gpus: Sequence[pci.Gpu]):
    """The GPU without VFs on ``address``'s domain and bus (``0000:81``), if exactly one."""
    bus = address.rsplit(":", 1)[0]
    found = [g for g in gpus if g.vfs_missing and g.address.rsplit(":", 1)[0] == bus]
    return found[0] if len(found) == 1 else None


def enable(addresses: Iterable[str], budget: float = 0) -> Dict[str, str]:
    """Run ``sriov-manage -e`` for each GPU within ``budget`` seconds; ``{GPU: why}`` for failures.

    Each GPU gets at most :data:`TIMEOUT`, and at most an even share of the
    time left, so one that hangs cannot starve the next. ``budget`` 0 means
    :data:`HOOK_BUDGET`.
    """
    addresses = list(addresses)
    deadline = time.monotonic() + (budget or HOOK_BUDGET)
    failures: Dict[str, str] = {}
    for n, address in enumerate(addresses):
        share = (deadline - time.monotonic()) / (len(addresses) - n)
        if share < MIN_CALL:
            failures[address] = ("not tried: this hook's time for sriov-manage was spent; "
                                 "retrying on the next hook")
            continue
        why = enable_one(address, min(TIMEOUT, share))
        if why:
            failures[address] = why
        else:
            log.info("enabled the virtual functions of %s", address)
    return failures


def enable_one(address: str, timeout: float) -> str:
    """Run ``sriov-manage -e <address>`` once; '' when it succeeded, else why not (one line).

    Never two at once: NVIDIA's script unbinds the GPU from nvidia, registers its
    ``vendor device`` in pci-pf-stub's ``new_id`` table (shared by every run),
    binds the stub, writes ``sriov_numvfs``, removes the id and binds nvidia
    again, then runs ``nvidia-smi -pm 1`` on every GPU; two runs race on the table
    and the unbind (StackHPC orders each GPU's unit after the previous one:
    stackhpc/ansible-collection-linux ``roles/vgpu/templates/nvidia-sriov.service.j2``).
    A GPU that a failed run left unbound is bound to nvidia again first
    (:func:`rebind`; StackHPC writes the address to ``nvidia/bind`` before every
    run), since every later run fails on it.
    """
    return _manage("-e", address, timeout)


def disable_one(address: str, timeout: float = TIMEOUT) -> str:
    """Run ``sriov-manage -d <address>`` once: its VFs gone (a GPU going whole); '' or why not.

    The same discipline as :func:`enable_one`: one run at a time in this
    process, the host lock held by the caller (the hook's steps hold it), and
    a GPU a failed run left unbound bound to nvidia again.
    """
    return _manage("-d", address, timeout)


def _manage(flag: str, address: str, timeout: float) -> str:
    tool = hostroot.path(SRIOV_MANAGE)
    if not tool.exists():
        return f"/{SRIOV_MANAGE} not found (is the vGPU host driver installed?)"
    with _ONE_AT_A_TIME:
        if _present(address) and unbound(driver_of(address)):
            why = rebind(address)
            if why:
                return why
        why = _run_once(tool, address, timeout, flag)
        if why and _present(address) and unbound(driver_of(address)) and not rebind(address):
            why += "; the GPU, left unbound, is bound to nvidia again"
        return why


def _run_once(tool: Path, address: str, timeout: float, flag: str = "-e") -> str:
    what = f"sriov-manage {flag} {address}"
    try:
        out = run.run([str(tool), flag, address], round(timeout, 1), check=False, what=what)
    except CommandError as error:  # could not run, or ran out of time
        return str(error)
    if out.returncode != 0:  # the script may say why on either stream
        why = text.cause(out.stderr or out.stdout) or f"exit status {out.returncode}"
        return f"{what} failed: {why}"
    return ""


def _present(address: str) -> bool:
    return os.path.exists(hostroot.text_path(pci.PCI_DEVICES, address))


def driver_of(address: str) -> Optional[str]:
    """The driver the device at ``address`` is bound to now; None when none."""
    try:
        return os.path.basename(os.readlink(hostroot.text_path(pci.PCI_DEVICES, address,
                                                                "driver")))
    except OSError:
        return None


def recover_commands(address: str, ids: str = "10de <device id>") -> str:
    """What an operator runs to bind a GPU a failed sriov-manage left unbound, then enable it."""
    stub, nvidia = f"/{DRIVERS}/{STUB_DRIVER}", f"/{DRIVERS}/{NVIDIA_DRIVER}"
    return (f"echo '{ids}' > {stub}/remove_id; echo {address} > {stub}/unbind; "
            f"echo {address} > {nvidia}/bind; /{SRIOV_MANAGE} -e {address}")


def rebind(address: str) -> str:
    """Bind a GPU that a failed sriov-manage run left unbound to nvidia again; '' once it is.

    As NVIDIA's sriov-manage ends a good run: its ``vendor device`` removed from
    pci-pf-stub's ``new_id`` table (``remove_id``: else the VFs it makes next are
    claimed by the stub too; the kernel answers ENODEV for an id not there), the
    GPU let go by the stub (``unbind``), and its address written to
    ``/sys/bus/pci/drivers/nvidia/bind`` (StackHPC's nvidia-sriov.service.j2 does
    that before every run). Whether it worked is read from the driver's directory,
    which lists each device bound to it. Else why not, with the commands that
    recover it by hand.
    """
    device = hostroot.text_path(pci.PCI_DEVICES, address)
    try:
        ids = " ".join((hostroot.read_text(hostroot.path(pci.PCI_DEVICES, address, name)) or ""
                        ).strip().removeprefix("0x") for name in ("vendor", "device"))
    except (HostReadError, OSError) as error:
        return f"it is left unbound and its ids cannot be read: {error}"
    if not re.fullmatch(r"[0-9a-f]{4} [0-9a-f]{4}", ids):  # sysfs's own words only, never text
        return (f"it is left unbound and its ids read {text.quote(ids, 40)}, not a vendor and "
                f"device id; recover it with: {recover_commands(address)}")
    was = f"left on {STUB_DRIVER}" if driver_of(address) == STUB_DRIVER else "left unbound"
    nvidia = hostroot.text_path(DRIVERS, NVIDIA_DRIVER)
    if not os.path.isdir(nvidia):
        return (f"it is {was} and the nvidia driver is not loaded (is the vGPU host driver "
                "installed, and the host rebooted since?)")
    stub = hostroot.text_path(DRIVERS, STUB_DRIVER)
    if os.path.isdir(stub):
        _control(os.path.join(stub, "remove_id"), ids)  # ENODEV: not registered, as wanted
        if driver_of(address) == STUB_DRIVER:
            _control(os.path.join(stub, "unbind"), address)
    failed = _control(os.path.join(nvidia, "bind"), address)
    try:
        bound = address in os.listdir(nvidia) and os.path.exists(device)
    except OSError as error:
        bound, failed = False, failed or (error.strerror or str(error))
    if bound:
        log.info("GPU %s: %s by a failed sriov-manage run: bound to nvidia again", address, was)
        return ""
    return (f"it is {was} by a failed sriov-manage run and binding it to nvidia failed"
            f"{': ' + failed if failed else ''}; recover it with: {recover_commands(address, ids)}")


def _control(path: str, value: str) -> str:
    """Write ``value`` to a driver's control file (sysfs: one write); '' or why it failed."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, value.encode("ascii"))
        finally:
            os.close(fd)
    except OSError as error:
        return f"{hostroot.shown(path)}: {error.strerror or error}"
    return ""


def boot_data(host: pci.Host, plan, wanted: Sequence[str], wait_for: Sequence[str]) -> dict:
    """What the boot step restores: the wanted GPUs and, per VF index, the profile it takes.

    Profiles are kept by the driver's name (``NVIDIA L40S-12Q``); the boot
    step finds each one's id in what the VF lists then. ``number`` is the id
    under today's driver, used only for a type that was never named.
    """
    assigned: Dict[str, List[dict]] = {}
    owners = host.owners()  # as host.gpu(address), for every assignment
    for assignment in (plan.vfio() if plan is not None else ()):
        gpu = owners.get(assignment.gpu)
        vf = gpu.function(assignment.address) if gpu is not None else None
        if gpu is None or not isinstance(vf, pci.VirtualFunction):
            continue
        assigned.setdefault(gpu.address, []).append(
            {"index": vf.index, "name": assignment.name, "number": assignment.number})
    gpus = []
    for gpu in host.gpus:
        if gpu.address in wanted or gpu.address in assigned:
            entries: List[dict] = assigned.get(gpu.address, [])
            entries.sort(key=lambda entry: int(entry["index"]))
            gpus.append({"address": gpu.address, "model": gpu.model, "vfs": entries})
    return {"version": DATA_VERSION, "wait_for": list(wait_for), "gpus": gpus}


def boot_data_usable() -> bool:
    """Whether the boot step can use the data file now (a link, a huge or odd file: no)."""
    from . import bootdata  # the boot step's parser: only when the file is read back

    try:
        bootdata.parse(bootdata.load(f"/{DATA_FILE}"))
    except bootdata.DataError as error:
        log.info("/%s: %s", DATA_FILE, error)
        return False
    return True


def data_path() -> Path:
    """Where the boot step's data lives under the host root."""
    return hostroot.path(DATA_FILE)


def write_boot_data(data: Mapping) -> bool:
    """Write the boot step's data when it changed; True when it did. SriovError if it cannot."""
    content = json.dumps(data, indent=1, sort_keys=True) + "\n"
    target = data_path()
    try:
        before = files.read(target, bootfile.LIMIT)
    except OSError as error:  # a link, not a file, too large: replaced (never written through)
        log.warning("replacing /%s: %s", DATA_FILE, error.strerror or error)
        before = None
    try:
        if before == content.encode("utf-8"):
            return False
        files.write_atomic(target, content)
    except OSError as error:
        raise SriovError(f"cannot write /{DATA_FILE}: {error.strerror or error}") from None
    log.info("boot data written to /%s: %d GPUs", DATA_FILE, len(data.get("gpus", ())))
    return True


def render_unit() -> str:
    """The unit's text: the charm's Python runs the boot step on :data:`DATA_FILE`."""
    words = (sys.executable, str(BOOT_SCRIPT), f"/{DATA_FILE}")
    for word in words:
        if not _SYSTEMD_WORD.fullmatch(word):
            raise SriovError(f"cannot name {text.quote(word)} in {UNIT}: unusual characters")
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(
        charm=APP, python=words[0], script=words[1], data=words[2],
        timeout=int(bootfile.TOTAL + hostlock.BOOT_WAIT) + 60)


def unit_masked() -> bool:
    """Whether the operator masked the unit (its file, or the runtime one, links to /dev/null)."""
    return files.masked(hostroot.path(UNIT_FILE), hostroot.path(RUNTIME_UNIT_FILE))


def unit_path() -> Path:
    """Where the boot-time unit lives under the host root."""
    return hostroot.path(UNIT_FILE)


def ensure_unit(content: str) -> bool:
    """Install and enable the unit when its text changed; True when it did.

    A masked unit is never written over nor enabled (False). When systemctl
    fails, the file is put back as it was (removed if there was none): a unit
    written but not enabled would not run at boot, yet look in place (the
    upstream charm's unit is retired once ours is, :mod:`vgpu.upstream`), and
    the next hook would find its text right and enable nothing.
    """
    if unit_masked():
        return False
    target = unit_path()
    try:  # bytes, bounded, no link followed: a hand edit in another encoding is just different
        previous = files.read(target, UNIT_LIMIT)
    except OSError as error:  # a link, not a file, too large: replaced (never written through)
        log.warning("replacing /%s: %s", UNIT_FILE, error.strerror or error)
        previous = None
    if previous == content.encode("utf-8"):
        return False
    try:
        files.write_atomic(target, content)
    except OSError as error:
        raise SriovError(f"cannot write /{UNIT_FILE}: {error.strerror or error}") from None
    try:
        services.reload_units()
        services.enable(UNIT)
    except ServiceError as error:
        try:
            if previous is None:
                files.remove(target)
            else:
                files.write_atomic(target, previous)
        except OSError as undo:
            log.warning("cannot put /%s back: %s", UNIT_FILE, undo.strerror or undo)
        raise SriovError(str(error)) from None
    log.info("installed and enabled %s", UNIT)
    return True


def remove_unit() -> bool:
    """Stop, disable and delete the unit and its data (charm removal); True when there was one.

    A masked unit is the operator's: it is left as it is. The boot step's mark
    in /run goes too (see :mod:`vgpu.bootfile`), and its last result (see
    :mod:`vgpu.bootresult`).
    """
    from . import bootresult

    try:
        data_path().unlink()
    except FileNotFoundError:
        pass
    bootfile.forget()
    bootresult.forget()
    target = unit_path()
    if unit_masked() or not target.exists():
        return False
    services.stop_and_disable(UNIT)
    target.unlink()
    services.reload_units()
    return True

