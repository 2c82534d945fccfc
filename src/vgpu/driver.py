"""NVIDIA's vGPU host driver package, attached as the ``nvidia-vgpu-software`` resource.

The file's control fields are read with ``dpkg-deb --field`` (only the
control member) when the charm inspects the resource: on install and
upgrade-charm (which Juju runs when a new revision is attached), in the
upgrade action and while the driver is not fully installed. What that
inspection said is Juju's fact about the resource, not the host's, so the
charm keeps it between hooks (:func:`to_record`, :func:`from_record`). The
file list, which means decompressing the whole package, is read only right
before installing. It is
installed with the system's own ``dpkg`` (``apt-get -f install`` resolves its
dependencies on a real host). What is installed is always dpkg's answer,
read from its database under the host root; nothing is remembered elsewhere.

Architecture: a kernel driver is built for one architecture, so the package's
``Architecture`` must equal ``dpkg --print-architecture``; ``all`` is refused.

Commands run through :mod:`vgpu.run`: each in a session of its own, whose
whole process group is ended when it runs out of time, so no maintainer
script outlives the hook. Two dpkg never run at once: dpkg and apt-get take
dpkg's own locks (``lock-frontend``, ``lock``), and a second one fails at
once with that cause, which the unit shows first; the next hook retries, and
reinstalling the same package finishes one that dpkg left half-configured.

Worst case of an install hook: dpkg --print-architecture 10 s, two dpkg-deb
reads 60 s each, then dpkg --remove, dpkg --install and apt-get -f install
together at most INSTALL_BUDGET (720 s), then update-initramfs 240 s
(:mod:`vgpu.kernel`), plus a few seconds of systemctl queries: under 19
minutes in all.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import time
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

from . import APP, RESOURCE, dpkg, hostroot, run
from .errors import CommandError, InstallError, ResourceInvalidError, ResourceMissingError
from .record import NamedTuple
from .text import quote

log = logging.getLogger(__name__)

PREFIX = "nvidia-vgpu-ubuntu-"
HOST_PACKAGE = re.compile(r"nvidia-vgpu-ubuntu-(\d+)")
GUEST_PACKAGE = r"nvidia-linux-grid-(\d+)"  # compiled by re when used: not on every hook
# The vGPU services, in the order they are started. nvidia-vgpu-mgr must stay
# running; nvidia-vgpud prepares the GPUs and may exit once done.
SERVICES = ("nvidia-vgpu-mgr", "nvidia-vgpud")
DAEMONS = ("nvidia-vgpu-mgr",)
_UNIT_DIRS = ("lib/systemd/system/", "usr/lib/systemd/system/")

ARCH_TIMEOUT = 10
INSPECT_TIMEOUT = 60  # dpkg-deb --field, and --contents (decompresses the whole package)
# dpkg --remove, dpkg --install and apt-get -f install share this budget: the
# driver's postinst may build kernel modules (DKMS) and refresh the initramfs.
INSTALL_BUDGET = 720


class DebInfo(NamedTuple):
    """What an attached host-driver .deb holds, read with ``dpkg-deb``."""

    package: str  # nvidia-vgpu-ubuntu-<branch>, for this machine's architecture
    version: str
    path: Optional[Path]  # None when taken from a record of an earlier hook


# The kernel's machine name -> Debian's architecture name, for messages only.
_DEBIAN_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64el", "s390x": "s390x",
                "riscv64": "riscv64"}


def machine_architecture() -> str:
    """This machine's dpkg architecture (``amd64``, ``arm64``, ...), as dpkg itself says.

    Checking a package against it starts ``dpkg --print-architecture``; only
    inspecting the resource does, never a steady hook.
    """
    try:
        out = run.run(["dpkg", "--print-architecture"], ARCH_TIMEOUT, what="dpkg --print-architecture")
    except CommandError as error:
        raise ResourceInvalidError(f"cannot check {RESOURCE}: {error}") from None
    return out.stdout.strip()


def hint_architecture() -> str:
    """The Debian name of the kernel's architecture, for messages: starts no process."""
    return _DEBIAN_ARCH.get(platform.machine(), "<arch>")


def attach_hint(arch: Optional[str] = None, app: str = APP) -> str:
    """The command that attaches the resource to application ``app``, for status messages.

    Starts no process.
    """
    arch = arch or hint_architecture()
    return (f"juju attach-resource {app} "
            f"{RESOURCE}=./{PREFIX}<branch>_<version>_{arch}.deb")


def inspect_deb(path: Union[str, Path, None], arch: Optional[str] = None,
                app: str = APP) -> DebInfo:
    """Check that ``path`` is NVIDIA's vGPU host driver for this machine.

    ``arch`` defaults to ``dpkg --print-architecture``, asked only when there
    is a file to check. Raises ResourceMissingError when nothing (or an empty
    file) is attached, its message naming application ``app`` in the attach
    command, and ResourceInvalidError when the file is anything but the host
    driver.
    """
    if path is None:
        raise ResourceMissingError(f"{RESOURCE} resource is not attached: {attach_hint(arch, app)}")
    path = Path(path)
    if not path.is_file():
        raise ResourceMissingError(f"{RESOURCE} resource file is missing: {attach_hint(arch, app)}")
    if path.stat().st_size == 0:
        raise ResourceMissingError(f"{RESOURCE} resource is empty: {attach_hint(arch, app)}")
    arch = arch or machine_architecture()

    need = f"need {PREFIX}<branch>_<version>_{arch}.deb"
    fields = _deb_fields(path, need)
    name = fields.get("Package", "")
    version = fields.get("Version", "")
    deb_arch = fields.get("Architecture", "")
    guest = re.fullmatch(GUEST_PACKAGE, name)
    if guest:
        raise ResourceInvalidError(
            f"{RESOURCE} is the vGPU guest driver {quote(name)}, which belongs in VMs; "
            f"need the host driver {PREFIX}{guest.group(1)}")
    if not HOST_PACKAGE.fullmatch(name):
        raise ResourceInvalidError(f"{RESOURCE} is package {quote(name)}; {need}")
    if deb_arch != arch:
        raise ResourceInvalidError(
            f"{RESOURCE} {quote(name)} is for architecture {quote(deb_arch)}; "
            f"this machine needs {quote(arch)}")
    if not version:
        raise ResourceInvalidError(f"{RESOURCE} {quote(name)} has no version; {need}")
    return DebInfo(package=name, version=version, path=path)


def to_record(found: Union[DebInfo, ResourceMissingError, ResourceInvalidError]) -> Dict[str, str]:
    """What an inspection said, as plain data to keep between hooks (no path: it is fetched again)."""
    if isinstance(found, ResourceMissingError):
        return {"missing": str(found)}
    if isinstance(found, ResourceInvalidError):
        return {"invalid": str(found)}
    return {"package": found.package, "version": found.version}


def from_record(record: Mapping[str, str]) -> Union[DebInfo, ResourceMissingError,
                                                     ResourceInvalidError, None]:
    """The inspection a record keeps; None for no (or an unreadable) record."""
    if "missing" in record:
        return ResourceMissingError(str(record["missing"]))
    if "invalid" in record:
        return ResourceInvalidError(str(record["invalid"]))
    try:
        return DebInfo(package=str(record["package"]), version=str(record["version"]), path=None)
    except KeyError:
        return None


def same_package(info: DebInfo, installed: dpkg.Package) -> bool:
    """Whether ``info`` is the very package and version dpkg holds (a retry, not an upgrade)."""
    return (info.package, info.version) == (installed.name, installed.version)


def shipped_services(info: DebInfo) -> Tuple[str, ...]:
    """The vGPU services the package holds, from its file list (decompresses it all).

    Raises ResourceInvalidError when it lacks ``nvidia-vgpu-mgr.service``: a
    package named like the host driver that is not NVIDIA's vGPU Manager.
    """
    need = f"need NVIDIA's vGPU Manager package {PREFIX}<branch>"
    if info.path is None:
        raise ResourceInvalidError(f"{RESOURCE} {quote(info.package)} was not fetched in this hook")
    services = _services_in(_deb_paths(info.path, need))
    if SERVICES[0] not in services:
        raise ResourceInvalidError(
            f"{RESOURCE} {quote(info.package)} ships no {SERVICES[0]}.service; {need}")
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
    found = [(p, int(match.group(1))) for p in pkgs.values()
             if (match := HOST_PACKAGE.fullmatch(p.name)) and p.present]
    if not found:
        return None
    return max(found, key=lambda pair: (pair[0].installed, pair[1]))[0]


def install(info: DebInfo, progress: Callable[[str], None] = lambda message: None) -> None:
    """Install (or upgrade to) ``info`` with dpkg under the host root.

    On a real host, dependency problems are resolved with ``apt-get -f
    install``. Raises ResourceInvalidError, before anything is installed, when
    the package does not hold the vGPU Manager; InstallError unless dpkg then
    reports exactly this package and version as fully installed. ``progress``
    is told each dpkg or apt step before it runs.
    """
    shipped_services(info)
    root = hostroot.root().absolute()
    dpkg_cmd = ["dpkg", f"--root={root}", f"--admindir={root / 'var/lib/dpkg'}"]
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    deadline = time.monotonic() + INSTALL_BUDGET
    # Another branch (nvidia-vgpu-ubuntu-550 -> -570) ships the same files
    # under another name: dpkg would refuse to overwrite them, so it goes first.
    others = sorted(p.name for p in dpkg.packages(prefixes=[PREFIX]).values()
                    if p.name != info.package and HOST_PACKAGE.fullmatch(p.name) and p.present)
    if others:
        log.info("removing %s before installing %s", ", ".join(others), info.package)
        progress(f"removing {', '.join(others)} with dpkg before installing {info.package}")
        failure = _run(dpkg_cmd + ["--remove", *others], env, deadline)
        if failure:
            raise InstallError(f"dpkg could not remove {', '.join(others)} to install "
                               f"{info.package}: {failure.cause}")
    log.info("installing %s %s from %s", info.package, info.version, info.path)
    progress(f"installing {info.package} {info.version} with dpkg")
    failure = _run(dpkg_cmd + ["--force-confdef", "--force-confold", "--install", str(info.path)],
                   env, deadline)
    if failure and _dependency_problems(failure) and hostroot.is_real_root():
        log.info("dpkg reported dependency problems; running apt-get -f install")
        progress("dpkg reported dependency problems: running apt-get -f install")
        apt = ["apt-get", "--fix-broken", "install", "--yes",
               "--option=Dpkg::Options::=--force-confdef",
               "--option=Dpkg::Options::=--force-confold"]
        failure = _run(apt, env, deadline) or failure
    reason = failure.cause if failure else ""

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
    """The vGPU services the installed ``pkg_name`` ships, from dpkg's file list.

    Raises HostReadError when the list exists but cannot be read.
    """
    info = hostroot.path("var/lib/dpkg/info")
    for lst in _file_lists(info, pkg_name):
        content = hostroot.read_text(lst)
        if content is not None:
            return _services_in(line.lstrip("/") for line in content.splitlines())
    return ()


def _file_lists(info: Path, pkg_name: str) -> Iterator[Path]:
    """dpkg's file lists of ``pkg_name``: ``<name>.list``, then any ``<name>:<arch>.list``.

    The directory (thousands of files on a server) is listed only when the
    first is not there.
    """
    yield info / f"{pkg_name}.list"
    yield from sorted(info.glob(f"{_glob_escape(pkg_name)}:*.list"))


# -- helpers -------------------------------------------------------------------

def _glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


def _dpkg_deb(option: str, path: Path, fields: List[str], need: str) -> str:
    """``dpkg-deb <option> <deb> [fields]``'s output; ResourceInvalidError if it fails."""
    cmd = ["dpkg-deb", option, str(path.absolute()), *fields]
    try:
        return run.run(cmd, INSPECT_TIMEOUT, what=f"dpkg-deb {option}").stdout
    except CommandError as error:
        if error.returncode is None:  # could not run, or ran out of time
            raise ResourceInvalidError(f"cannot check {RESOURCE}: {error}") from None
        raise ResourceInvalidError(f"{RESOURCE} is not a Debian package; {need}") from None


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
            # ./lib/... from dpkg-deb; lib/... or /lib/... from other tools
            paths.append(name.removeprefix("./").lstrip("/"))
    return paths


def _services_in(paths) -> Tuple[str, ...]:
    units = {p for p in paths if p.startswith(_UNIT_DIRS) and p.endswith(".service")}
    names = {u.rsplit("/", 1)[-1][:-len(".service")] for u in units}
    return tuple(s for s in SERVICES if s in names)


def _run(cmd: List[str], env: Dict[str, str], deadline: float) -> Optional[CommandError]:
    """Run ``cmd`` within what is left of the install budget; the CommandError if it failed."""
    left = deadline - time.monotonic()
    if left < 1:
        return CommandError(f"{cmd[0]} not run", f"no time left of the {INSTALL_BUDGET}s install budget")
    try:
        run.run(cmd, int(left), env=env)
    except CommandError as error:
        return error
    return None


def _dependency_problems(failure: CommandError) -> bool:
    """dpkg unpacked the package but could not configure it for want of dependencies."""
    return "dependency problems" in failure.stderr
