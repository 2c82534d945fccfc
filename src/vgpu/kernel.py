"""Kernel side of a vGPU host: the nouveau blacklist and why a reboot is due.

The blacklist is rendered from ``templates/blacklist-nouveau.conf`` in the
charm and written to ``<root>/etc/modprobe.d/``; every change is followed by
``update-initramfs -u`` so nouveau stays out of the initramfs too. When
``update-initramfs`` is not on PATH, or fails, the file change is undone
(so the next attempt repeats it) and InstallError is raised: keeping nouveau
away is part of preparing the host for the driver.

The upstream charm's blacklist (``/etc/modprobe.d/disable-nouveau.conf``,
see :mod:`vgpu.upstream`) is taken over where the upstream charm ran
(``upstream_ran``: its StoredState, unit or scripts, :func:`vgpu.upstream.ran`):
once this charm's is written it is deleted, if it tells modprobe nothing this
charm's does not, and remove deletes it with this charm's. Elsewhere a file
of that name is the operator's own and is never touched: two files saying
the same harm nothing. Either way the initramfs is rebuilt only when what
the files tell modprobe together changed: after a switch from the upstream
charm it already holds the same lines, so it is not rebuilt. A file that
says more (edited by hand) is left alone.
"""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from string import Template
from typing import FrozenSet, Iterable, List, Optional, Tuple

from . import APP, dpkg, files, hostroot, run, upstream
from .errors import CommandError, HostReadError, InstallError
from .record import NamedTuple

log = logging.getLogger(__name__)

CHARM_ROOT = Path(__file__).resolve().parents[2]  # src/vgpu/kernel.py -> charm root
TEMPLATE = CHARM_ROOT / "templates" / "blacklist-nouveau.conf"
BLACKLIST = "etc/modprobe.d/nvidia-vgpu-blacklist-nouveau.conf"
INITRAMFS_TIMEOUT = 240
BLACKLIST_LIMIT = 64 * 1024  # bytes read of a blacklist that is not the charm's own
VFIO_NOT_LOADED = "nvidia_vgpu_vfio is not loaded"  # the reboot reason Secure Boot may explain


def blacklist_path() -> Path:
    """Where the blacklist lives under the host root."""
    return hostroot.path(BLACKLIST)


def render_blacklist() -> str:
    """The blacklist file's content."""
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(charm=APP)


def ensure_nouveau_blacklisted(upstream_ran: bool = False) -> bool:
    """Write the blacklist if its content differs, then refresh the initramfs.

    Returns True when what modprobe is told changed (a reboot is then needed
    for it to take effect if nouveau is loaded). ``upstream_ran``: the
    upstream charm's blacklist is taken over (module doc). Raises
    InstallError when the file cannot be written or the initramfs refreshed;
    the file is then left as it was.
    """
    try:
        return _ensure_blacklisted(upstream_ran)
    except HostReadError as error:
        raise InstallError(str(error)) from None
    except OSError as error:
        raise InstallError(f"cannot write /{BLACKLIST}: {error.strerror or error}") from None


def _ensure_blacklisted(upstream_ran: bool) -> bool:
    target = blacklist_path()
    content = render_blacklist().encode("utf-8")
    previous = hostroot.read_bytes(target)  # put back byte for byte should the refresh fail
    if previous == content and not (upstream_ran and _upstream_there()):
        return False  # steady: nothing else is opened
    theirs = _upstream_blacklist()
    if previous == content and theirs is None:
        return False
    before = directives(previous) | directives(theirs)
    drop = upstream_ran and theirs is not None and directives(theirs) <= directives(content)
    after = directives(content) | (set() if drop else directives(theirs))
    if previous != content:
        files.write_atomic(target, content)
    if drop:  # ours is in place first: nouveau is never left unlisted
        files.remove(hostroot.path(upstream.BLACKLIST))
    try:
        if before != after:
            update_initramfs()
    except InstallError:
        _put_back(target, previous)
        if theirs is not None and drop:
            files.write_atomic(hostroot.path(upstream.BLACKLIST), theirs, mode=0o444)
        raise
    if drop:
        log.info("took over /%s of the upstream charm: /%s says the same%s", upstream.BLACKLIST,
                 BLACKLIST, "" if before != after else "; the initramfs has it already, not rebuilt")
    elif theirs is not None and not upstream_ran and previous != content:
        log.info("left /%s as it is: the upstream charm never ran here, so it is the operator's%s",
                 upstream.BLACKLIST, "" if before != after else
                 f"; /{BLACKLIST} says nothing more, the initramfs is not rebuilt")
    return before != after


def _upstream_blacklist() -> Optional[bytes]:
    """The upstream charm's blacklist (vgpu.upstream.BLACKLIST) as it is; None when absent.

    One that cannot be read as a plain file (a link, too large) is not the
    upstream charm's as it wrote it: it is left alone, as if absent.
    """
    if not _upstream_there():
        return None
    try:
        return files.read(hostroot.path(upstream.BLACKLIST), BLACKLIST_LIMIT)
    except OSError as error:
        log.warning("leaving /%s alone: %s", upstream.BLACKLIST, error.strerror or error)
        return None


def _upstream_there() -> bool:
    """Whether a file is at vgpu.upstream.BLACKLIST: an lstat, nothing opened."""
    return os.path.lexists(hostroot.text_path(upstream.BLACKLIST))


def directives(content: Optional[bytes]) -> FrozenSet[str]:
    """What a modprobe.d file tells modprobe: its lines without comments, blanks or extra spaces."""
    lines = (content or b"").decode("utf-8", errors="replace").splitlines()
    return frozenset(" ".join(line.split()) for line in lines
                     if line.strip() and not line.lstrip().startswith("#"))


def _put_back(target: Path, previous: Optional[bytes]) -> None:
    if previous is None:
        files.remove(target)
    else:
        files.write_atomic(target, previous)


def remove_blacklist(upstream_ran: bool = False) -> bool:
    """Delete the blacklist (charm removal); True when the initramfs was refreshed.

    ``upstream_ran``: the upstream charm's goes too (module doc). The
    initramfs is refreshed only when what modprobe is told changed: not
    while the operator's own file of the upstream charm's name says it all.
    """
    try:
        return _remove_blacklist(upstream_ran)
    except HostReadError as error:
        raise InstallError(str(error)) from None
    except OSError as error:
        raise InstallError(f"cannot remove /{BLACKLIST}: {error.strerror or error}") from None


def _remove_blacklist(upstream_ran: bool) -> bool:
    target = blacklist_path()
    previous = hostroot.read_bytes(target)
    theirs = _upstream_blacklist()
    # The upstream charm's, taken over: it goes too, unless it says more than ours (edited).
    drop = upstream_ran and theirs is not None and \
        directives(theirs) <= directives(render_blacklist().encode())
    if previous is None and not drop:
        return False
    before = directives(previous) | directives(theirs)
    after = frozenset() if drop else directives(theirs)
    files.remove(target)
    if drop:
        files.remove(hostroot.path(upstream.BLACKLIST))
    try:
        if before != after:
            update_initramfs()
    except InstallError:
        _put_back(target, previous)
        if theirs is not None and drop:
            files.write_atomic(hostroot.path(upstream.BLACKLIST), theirs, mode=0o444)
        raise
    if before == after:
        log.info("removed /%s; /%s says the same: the initramfs is not rebuilt", BLACKLIST,
                 upstream.BLACKLIST)
    return before != after


def update_initramfs() -> None:
    """Run ``update-initramfs -u`` from PATH; InstallError if missing or failing."""
    exe = shutil.which("update-initramfs")
    if exe is None:
        raise InstallError("update-initramfs not found; install initramfs-tools")
    try:
        run.run([exe, "-u"], INITRAMFS_TIMEOUT, what="update-initramfs -u")
    except CommandError as error:
        raise InstallError(str(error)) from None


def loaded_modules() -> FrozenSet[str]:
    """Names of the loaded kernel modules (``<root>/proc/modules``); empty if unreadable."""
    try:
        text = hostroot.read_text(hostroot.path("proc/modules")) or ""
    except HostReadError as error:
        log.warning("%s", error)
        return frozenset()
    return frozenset(line.split()[0] for line in text.splitlines() if line.strip())


def iommu_enabled() -> bool:
    """True when the kernel created IOMMU groups (``<root>/sys/kernel/iommu_groups``)."""
    try:
        with os.scandir(hostroot.path("sys/kernel/iommu_groups")) as entries:
            return any(True for _ in entries)
    except OSError:
        return False


def loaded_driver_version() -> Optional[str]:
    """Version of the loaded ``nvidia`` module (``<root>/sys/module/nvidia/version``)."""
    try:
        version = hostroot.read_text(hostroot.path("sys/module/nvidia/version"))
    except HostReadError as error:
        log.warning("%s", error)
        return None
    return (version or "").strip() or None


def reboot_reasons(modules: Optional[Iterable[str]] = None,
                   driver_installed: bool = False,
                   installed_version: Optional[str] = None,
                   loaded_version: Optional[str] = None) -> List[str]:
    """Why the host needs a reboot, in words; empty when it does not.

    Pure given ``modules`` (read from ``/proc/modules`` only when None). A
    loaded ``nvidia`` module older or newer than the installed package (after
    an upgrade) also needs a reboot: the module's version must equal the
    package's upstream version exactly (``570.158.0`` is not ``570.158.02``).
    """
    loaded = {m.replace("-", "_") for m in (loaded_modules() if modules is None else modules)}
    reasons = []
    if "nouveau" in loaded:
        reasons.append("nouveau is loaded")
    if driver_installed and "nvidia_vgpu_vfio" not in loaded:
        reasons.append(VFIO_NOT_LOADED)
    elif (driver_installed and installed_version and loaded_version
          and dpkg.upstream(installed_version) != loaded_version):
        reasons.append(f"NVIDIA driver {loaded_version} is loaded, {installed_version} installed")
    return reasons



# -- Secure Boot ----------------------------------------------------------------------
# With Secure Boot on, Ubuntu's kernel loads only modules signed by a key it trusts.
# DKMS signs what it builds with the machine owner key it generated
# (/var/lib/shim-signed/mok/MOK.der), which works only once enrolled in shim's MOK
# list (mokutil --import, then a reboot confirmed at the console in MOK Manager).
# Until then no reboot loads the NVIDIA modules: the status says what to do instead.

EFI_GLOBAL = "8be4df61-93ca-11d2-aa0d-00e098032b8c"  # EFI_GLOBAL_VARIABLE's GUID
SECURE_BOOT_VAR = f"sys/firmware/efi/efivars/SecureBoot-{EFI_GLOBAL}"
MOK_KEY = "var/lib/shim-signed/mok/MOK.der"  # the key DKMS signs modules with on Ubuntu
SECURE_BOOT_TIMEOUT = 30
# What the loaders say when the kernel refuses a module's signature, naming the module:
#   modprobe: ERROR: could not insert 'vmmon': Key was rejected by service
#   insmod: ERROR: could not insert module src/facer.ko: Key was rejected by service
#   Failed to insert module 'evdi': Key was rejected by service      (systemd-modules-load)
# ("Required key not available" on older kernels), or "Operation not permitted" under lockdown.
# The kernel's own line names no module on today's kernels ("Loading of module with unavailable
# key is rejected", "Lockdown: modprobe: unsigned module loading is restricted; see man
# kernel_lockdown.7": the process, not the module); some 5.x kernels put the module first
# ("nvidia: loading of module with unavailable key is rejected").
_LOADERS = ("could not insert module ", "could not insert '", "Failed to insert module '")
_KEY_REFUSED = ("Key was rejected by service", "Required key not available")
_LOCKED_DOWN = "Operation not permitted"  # a loader's word for a lockdown refusal (among others)
_KERNEL_REJECTS = ("loading of ", " is rejected")  # both in one line, in any case
_KERNEL_LOCKDOWN = "unsigned module loading is restricted"
_KEY, _LOCKDOWN = "key", "lockdown"  # the two kinds of refusal
NVIDIA_MODULE = "nvidia"  # nvidia, and nvidia_<anything>: nvidia_vgpu_vfio, nvidia_drm, ...
_LISTED_KEY = ("[key ", "Fingerprint")  # what mokutil --list-new prints of a waiting key


class SecureBoot(NamedTuple):
    """What the host says about Secure Boot and the modules' signing key."""

    enabled: Optional[bool]  # None: cannot tell
    rejected: str = ""  # the log's words refusing an NVIDIA module's key (nvidia_refusal)
    key_enrolled: Optional[bool] = None  # DKMS's MOK enrolled (None: no key or cannot tell)
    pending: bool = False  # a MOK enrolment waits for the next boot (confirmed at the console)

    def blocks_modules(self) -> bool:
        """Whether Secure Boot is why the modules do not load (a reboot alone will not help)."""
        return bool(self.enabled) and (bool(self.rejected) or self.key_enrolled is False)


def secure_boot_enabled() -> Optional[bool]:
    """Secure Boot's state from the firmware's variable; mokutil --sb-state when unreadable.

    False on a machine without EFI (``sys/firmware/efi`` absent under the
    host root), None when neither answers.
    """
    if not hostroot.path("sys/firmware/efi").exists():
        return False
    try:
        value = hostroot.read_bytes(hostroot.path(SECURE_BOOT_VAR))
    except HostReadError:
        value = None
    if value is not None and len(value) >= 5:  # 4 bytes of attributes, then the value
        return value[4] == 1
    said = _mokutil("--sb-state")
    if "SecureBoot enabled" in said:
        return True
    if "SecureBoot disabled" in said:
        return False
    return None


def secure_boot() -> SecureBoot:
    """Secure Boot, and (only when it is on) the kernel log and DKMS's key, via mokutil."""
    enabled = secure_boot_enabled()
    if not enabled:
        return SecureBoot(enabled)
    key_enrolled = None
    pending = False
    if hostroot.path(MOK_KEY).exists():
        said = _mokutil("--test-key", str(hostroot.path(MOK_KEY)))
        if "is already enrolled" in said:
            key_enrolled = True
        elif "is not enrolled" in said:
            key_enrolled = False
            # mokutil lists each waiting key ("[key 1]", its fingerprint); with none it says
            # "MokNew is empty" (or why it could not read MokNew): no enrolment waits then.
            pending = any(word in _mokutil("--list-new") for word in _LISTED_KEY)
    return SecureBoot(enabled, _rejection(), key_enrolled, pending)


def _mokutil(*args: str) -> str:
    """mokutil's output (stdout and stderr: it answers on both), '' when it cannot run."""
    if shutil.which("mokutil") is None:
        return ""
    try:
        result = run.run(["mokutil", *args], SECURE_BOOT_TIMEOUT, check=False)
    except CommandError as error:
        log.warning("%s", error)
        return ""
    return f"{result.stdout}\n{result.stderr}"


def _rejection() -> str:
    """The last line of this boot's log where an NVIDIA module's key was refused ('' if none)."""
    if shutil.which("journalctl") is None:
        return ""
    try:
        result = run.run(["journalctl", "--boot", "--no-pager", "--quiet", "--output=cat",
                          "--lines=20000"], SECURE_BOOT_TIMEOUT, check=False)
    except CommandError as error:
        log.warning("%s", error)
        return ""
    return nvidia_refusal(result.stdout.splitlines())


def nvidia_refusal(lines: Iterable[str]) -> str:
    """The last of ``lines`` (a log) saying an NVIDIA module's signature was refused, or ''.

    A loader's report names the module: only NVIDIA's count (a DKMS zfs or
    virtualbox module refused says nothing of NVIDIA's). The kernel's own line
    names none on today's kernels, so it cannot be told whose it is. Each
    refusal a loader reports for another module accounts for one such line of
    its kind; a kernel line left over counts, fail safe: it may well be NVIDIA's
    (a load at boot, by udev, need not leave a loader's line), it is read only
    while Secure Boot is on and nvidia_vgpu_vfio is not loaded, and read as
    another module's it would leave the status asking for a reboot that cannot
    help. The status quotes the line as it is, so that it names no module shows.
    """
    ours: List[str] = []
    unnamed: List[Tuple[str, str]] = []  # (kind, line)
    others = {_KEY: 0, _LOCKDOWN: 0}  # other modules' refusals, by the kind they answer
    for line in (raw.strip() for raw in lines):
        said = _refused(line)
        if said is None:
            continue
        module, kind, by_loader = said
        if module is None:
            unnamed.append((kind, line))
        elif _is_nvidia(module):
            if kind == _KEY:  # "Operation not permitted" alone is not the key's
                ours.append(line)
        elif by_loader:
            others[kind] += 1
    if ours:
        return ours[-1]
    left = []
    for kind, line in unnamed:
        if others[kind]:
            others[kind] -= 1
        else:
            left.append(line)
    return left[-1] if left else ""


def _refused(line: str) -> Optional[Tuple[Optional[str], str, bool]]:
    """(module or None, _KEY or _LOCKDOWN, whether a loader said it) for a refusal; else None."""
    named = _loader_report(line)
    if named is not None:
        module, reason = named
        if any(words in reason for words in _KEY_REFUSED):
            return module, _KEY, True
        return (module, _LOCKDOWN, True) if _LOCKED_DOWN in reason else None
    lowered = line.lower()
    if all(words in lowered for words in _KERNEL_REJECTS):
        first, _, rest = line.partition(": ")
        if rest.lower().startswith(_KERNEL_REJECTS[0]) and " " not in first:
            return first, _KEY, False  # the module first, as some 5.x kernels print it
        return None, _KEY, False
    return (None, _LOCKDOWN, False) if _KERNEL_LOCKDOWN in lowered else None


def _loader_report(line: str) -> Optional[Tuple[str, str]]:
    """(module, the error) from a loader's "could not insert" line, or None for other lines."""
    for marker in _LOADERS:
        at = line.find(marker)
        if at < 0:
            continue
        rest = line[at + len(marker):]
        name, found, reason = rest.partition("': " if marker.endswith("'") else ": ")
        if found:
            base = name.rsplit("/", 1)[-1]  # insmod names the file: src/facer.ko(.zst)
            return base.split(".ko", 1)[0] if ".ko" in base else base, reason
    return None


def _is_nvidia(module: str) -> bool:
    name = module.strip().replace("-", "_")
    return name == NVIDIA_MODULE or name.startswith(NVIDIA_MODULE + "_")


def secure_boot_advice(state: SecureBoot) -> str:
    """What the operator does when Secure Boot keeps the NVIDIA modules out."""
    if state.pending:
        return ("Secure Boot is on and DKMS's signing key waits for enrolment: reboot and confirm "
                "it in MOK Manager at the machine's console (the password given to mokutil "
                "--import)")
    seen = f" (kernel: {state.rejected})" if state.rejected else (
        f" (/{MOK_KEY} is not enrolled)" if state.key_enrolled is False else "")
    return ("Secure Boot is on and the NVIDIA modules are not signed by an enrolled key"
            f"{seen}, so no reboot loads them: enrol DKMS's key (mokutil --import /{MOK_KEY}, "
            "reboot, confirm it in MOK Manager at the console), sign the modules with an "
            "enrolled key, or turn Secure Boot off in the firmware")
