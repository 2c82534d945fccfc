"""NVIDIA's vGPU host driver package, attached as the ``nvidia-vgpu-software`` resource.

The file's control fields are read with ``dpkg-deb --field`` (cheap: only the
control member, so every hook may do it); its file list, which means
decompressing the whole package, is read only right before installing. It is
installed with the system's own ``dpkg`` (``apt-get -f install`` resolves its
dependencies on a real host). What is installed is always dpkg's answer,
read from its database under the host root; nothing is remembered elsewhere.

Architecture: a kernel driver is built for one architecture, so the package's
``Architecture`` must equal ``dpkg --print-architecture``; ``all`` is refused.
"""

import logging
import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Tuple, Union

from . import dpkg, hostroot
from .errors import InstallError, ResourceInvalidError, ResourceMissingError

log = logging.getLogger(__name__)

RESOURCE = "nvidia-vgpu-software"
APP = "nova-compute-nvidia-vgpu"
PREFIX = "nvidia-vgpu-ubuntu-"
HOST_PACKAGE = re.compile(r"nvidia-vgpu-ubuntu-(\d+)")
GUEST_PACKAGE = re.compile(r"nvidia-linux-grid-(\d+)")
# The vGPU services, in the order they are started. nvidia-vgpu-mgr must stay
# running; nvidia-vgpud prepares the GPUs and may exit once done.
SERVICES = ("nvidia-vgpu-mgr", "nvidia-vgpud")
DAEMONS = ("nvidia-vgpu-mgr",)
_UNIT_DIRS = ("lib/systemd/system/", "usr/lib/systemd/system/")

INSPECT_TIMEOUT = 120
DPKG_TIMEOUT = 1800  # the driver's postinst may build kernel modules
APT_TIMEOUT = 1800


@dataclass(frozen=True)
class DebInfo:
    """What an attached host-driver .deb holds, read with ``dpkg-deb``."""

    package: str
    version: str
    architecture: str
    branch: str  # "570" for nvidia-vgpu-ubuntu-570
    path: Path


def machine_architecture() -> str:
    """This machine's dpkg architecture (``amd64``, ``arm64``, ...)."""
    try:
        out = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                             check=True, timeout=INSPECT_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as error:
        raise ResourceInvalidError(
            f"cannot check {RESOURCE}: dpkg --print-architecture failed ({error})") from None
    return out.stdout.strip()


def attach_hint(arch: str = "amd64") -> str:
    """The command that attaches the resource, for status messages."""
    return (f"juju attach-resource {APP} "
            f"{RESOURCE}=./{PREFIX}<branch>_<version>_{arch}.deb")


def inspect_deb(path: Union[str, Path, None], arch: Optional[str] = None) -> DebInfo:
    """Check that ``path`` is NVIDIA's vGPU host driver for this machine.

    ``arch`` defaults to ``dpkg --print-architecture``. Raises
    ResourceMissingError when nothing (or an empty file) is attached and
    ResourceInvalidError when the file is anything but the host driver.
    """
    arch = arch or machine_architecture()
    if path is None:
        raise ResourceMissingError(f"{RESOURCE} resource is not attached: {attach_hint(arch)}")
    path = Path(path)
    if not path.is_file():
        raise ResourceMissingError(f"{RESOURCE} resource file is missing: {attach_hint(arch)}")
    if path.stat().st_size == 0:
        raise ResourceMissingError(f"{RESOURCE} resource is empty: {attach_hint(arch)}")

    need = f"need {PREFIX}<branch>_<version>_{arch}.deb"
    fields = _deb_fields(path, need)
    name = fields.get("Package", "")
    version = fields.get("Version", "")
    deb_arch = fields.get("Architecture", "")
    guest = GUEST_PACKAGE.fullmatch(name)
    if guest:
        raise ResourceInvalidError(
            f"{RESOURCE} is the vGPU guest driver {_q(name)}, which belongs in VMs; "
            f"need the host driver {PREFIX}{guest.group(1)}")
    host = HOST_PACKAGE.fullmatch(name)
    if not host:
        raise ResourceInvalidError(f"{RESOURCE} is package {_q(name)}; {need}")
    if deb_arch != arch:
        raise ResourceInvalidError(
            f"{RESOURCE} {_q(name)} is for architecture {_q(deb_arch)}; "
            f"this machine needs {_q(arch)}")
    if not version:
        raise ResourceInvalidError(f"{RESOURCE} {_q(name)} has no version; {need}")
    return DebInfo(package=name, version=version, architecture=deb_arch,
                   branch=host.group(1), path=path)


def shipped_services(info: DebInfo) -> Tuple[str, ...]:
    """The vGPU services the package holds, from its file list (decompresses it all).

    Raises ResourceInvalidError when it lacks ``nvidia-vgpu-mgr.service``: a
    package named like the host driver that is not NVIDIA's vGPU Manager.
    """
    need = f"need NVIDIA's vGPU Manager package {PREFIX}<branch>"
    services = _services_in(_deb_paths(info.path, need))
    if SERVICES[0] not in services:
        raise ResourceInvalidError(
            f"{RESOURCE} {_q(info.package)} ships no {SERVICES[0]}.service; {need}")
    return services


def installed_driver(pkgs: Optional[Mapping[str, dpkg.Package]] = None) -> Optional[dpkg.Package]:
    """The host driver dpkg knows of, in whatever state dpkg reports it.

    ``pkgs`` is an already-read ``dpkg.packages()`` answer; without it the
    status file is read. Half-installed or unpacked packages are returned too
    (check ``.installed`` / ``.state``). Should several branches be present, a
    fully installed one wins, then the highest branch.
    """
    if pkgs is None:
        pkgs = dpkg.packages(prefixes=[PREFIX])
    found = [p for p in pkgs.values() if HOST_PACKAGE.fullmatch(p.name) and p.present]
    if not found:
        return None
    return max(found, key=lambda p: (p.installed, int(HOST_PACKAGE.fullmatch(p.name).group(1))))


def install(info: DebInfo) -> None:
    """Install (or upgrade to) ``info`` with dpkg under the host root.

    On a real host, dependency problems are resolved with ``apt-get -f
    install``. Raises ResourceInvalidError, before anything is installed, when
    the package does not hold the vGPU Manager; InstallError unless dpkg then
    reports exactly this package and version as fully installed.
    """
    shipped_services(info)
    root = hostroot.root().absolute()
    dpkg_cmd = ["dpkg", f"--root={root}", f"--admindir={root / 'var/lib/dpkg'}"]
    # LC_ALL=C: dpkg's messages are matched ("dependency problems") and shown.
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
    # Another branch (nvidia-vgpu-ubuntu-550 -> -570) ships the same files
    # under another name: dpkg would refuse to overwrite them, so it goes first.
    others = sorted(p.name for p in dpkg.packages(prefixes=[PREFIX]).values()
                    if p.name != info.package and HOST_PACKAGE.fullmatch(p.name) and p.present)
    if others:
        log.info("removing %s before installing %s", ", ".join(others), info.package)
        reason = _run(dpkg_cmd + ["--remove", *others], env, DPKG_TIMEOUT)
        if reason:
            raise InstallError(f"dpkg could not remove {', '.join(others)} to install "
                               f"{info.package}: {reason}")
    log.info("installing %s %s from %s", info.package, info.version, info.path)
    reason = _run(dpkg_cmd + ["--force-confdef", "--force-confold", "--install", str(info.path)],
                  env, DPKG_TIMEOUT)
    if reason and "dependency problems" in reason and hostroot.is_real_root():
        log.info("dpkg reported dependency problems; running apt-get -f install")
        apt = ["apt-get", "--fix-broken", "install", "--yes",
               "--option=Dpkg::Options::=--force-confdef",
               "--option=Dpkg::Options::=--force-confold"]
        reason = _run(apt, env, APT_TIMEOUT) or reason

    pkg = dpkg.package(info.package)
    if pkg and pkg.installed and pkg.version == info.version:
        if reason:
            log.warning("dpkg reported %s but %s %s is installed", reason, info.package, info.version)
        return
    what = f"{info.package} {info.version}"
    why = f": {reason}" if reason else ""
    if pkg is None:
        raise InstallError(f"dpkg did not install {what}{why}")
    if pkg.version != info.version:
        raise InstallError(f"dpkg did not install {what} ({pkg.version} is {pkg.state}){why}")
    raise InstallError(f"dpkg left {what} {pkg.state}{why}")


def services_of(pkg_name: str) -> Tuple[str, ...]:
    """The vGPU services the installed ``pkg_name`` ships, from dpkg's file list."""
    info = hostroot.path("var/lib/dpkg/info")
    lists = [info / f"{pkg_name}.list"] + sorted(info.glob(f"{_glob_escape(pkg_name)}:*.list"))
    for lst in lists:
        try:
            text = lst.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        return _services_in(line.lstrip("/") for line in text.splitlines())
    return ()


# -- helpers -------------------------------------------------------------------

def _q(value: str, limit: int = 48) -> str:
    """A value quoted for a one-line status message: printable and short."""
    text = "".join(c if c.isprintable() else "?" for c in str(value))
    if len(text) > limit:
        text = text[:limit - 3] + "..."
    return repr(text)


def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _dpkg_deb(option: str, path: Path, fields: List[str], need: str) -> str:
    """``dpkg-deb <option> <deb> [fields]``'s output; ResourceInvalidError if it fails."""
    cmd = ["dpkg-deb", option, str(path.absolute()), *fields]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                             timeout=INSPECT_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise ResourceInvalidError(
            f"{RESOURCE} could not be read in {INSPECT_TIMEOUT}s; {need}") from None
    except OSError as error:
        raise ResourceInvalidError(f"cannot check {RESOURCE}: dpkg-deb: {error.strerror}") from None
    if out.returncode != 0:
        log.info("%s failed: %s", " ".join(cmd), out.stderr.strip())
        raise ResourceInvalidError(f"{RESOURCE} is not a Debian package; {need}")
    return out.stdout


def _deb_fields(path: Path, need: str) -> Dict[str, str]:
    text = _dpkg_deb("--field", path, ["Package", "Version", "Architecture"], need)
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and not line[:1].isspace():
            fields[key] = value.strip()
    return fields


def _deb_paths(path: Path, need: str) -> List[str]:
    """Paths in the package, relative to / (``lib/systemd/system/x.service``)."""
    paths = []
    for line in _dpkg_deb("--contents", path, [], need).splitlines():
        parts = line.split(None, 5)  # mode owner size date time name[ -> target]
        if len(parts) == 6:
            name = parts[5].split(" -> ")[0]
            paths.append(name[2:] if name.startswith("./") else name.lstrip("/"))
    return paths


def _services_in(paths) -> Tuple[str, ...]:
    units = {p for p in paths if p.startswith(_UNIT_DIRS) and p.endswith(".service")}
    names = {u.rsplit("/", 1)[-1][:-len(".service")] for u in units}
    return tuple(s for s in SERVICES if s in names)


def _run(cmd: List[str], env: Dict[str, str], timeout: int) -> str:
    """Run ``cmd``; return "" on success, else one short line saying why not."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, errors="replace",
                             env=env, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"{cmd[0]} timed out after {timeout}s"
    except OSError as e:
        return f"{cmd[0]} could not run: {e.strerror}"
    if out.returncode == 0:
        return ""
    log.warning("%s failed (%d): %s", cmd[0], out.returncode, out.stderr.strip())
    return _last_line(out.stderr) or f"{cmd[0]} exited with status {out.returncode}"


def _last_line(stderr: str, limit: int = 120) -> str:
    """The last meaningful stderr line: dpkg's summary that follows is dropped."""
    lines = []
    for line in stderr.splitlines():
        if line.startswith("Errors were encountered while processing"):
            break
        if line.strip():
            lines.append(line.strip())
    if not lines:
        return ""
    text = "".join(c if c.isprintable() else "?" for c in lines[-1])
    return text if len(text) <= limit else text[:limit - 3] + "..."
