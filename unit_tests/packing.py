"""The charm built, packed and unpacked the way charmcraft and Juju do it, from what git stores.

Nothing here imitates charmcraft: the build runs the command that charmcraft's
own ``charm`` plugin (``charmcraft.parts.plugins.CharmPlugin``) derives from
this project's ``charmcraft.yaml`` part, which starts charmcraft's own
``charm_builder.py``: it copies the project less ``.jujuignore``, writes the
``dispatch`` script and the ``hooks/`` links, and installs
``requirements.txt`` with pip into ``staging-venv`` and from there into the
charm's ``venv/``. The charm is zipped with charmcraft's ``build_zip`` (as
``charmcraft pack`` does), unzipped with the file modes the zip holds (as
Juju unpacks a charm on its unit), and ``charmcraft analyse``'s own linters
run over that.

What goes in is what git stores: every path ``git ls-files`` lists with the
mode git records for it (100755 is executable, 100644 is not, whatever this
checkout's files say), the content being the checkout's. An untracked file is
not in the charm, as it would not be in a clean clone's.

The part's build directory stays in ``build/packed-charm`` between test
sessions: charm_builder reinstalls the dependencies only when
``requirements.txt`` (or the part's package lists) changed, by its own
dependency hash, as ``charmcraft pack`` does between packs. A clean clone
(CI) installs them from PyPI.
"""

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Dict, Iterator, List, Tuple
from unittest import mock

import yaml

# What git stores, with git's modes: the same code as `make charm` (tools/build_charm.py).
from tools.build_charm import (  # noqa: F401 (re-exported for test_dispatch)
    GIT_EXECUTABLE,
    GIT_FILE,
    GIT_SYMLINK,
    export,
    git_modes,
)

REPO = Path(__file__).resolve().parents[1]
WORK = REPO / "build" / "packed-charm"
PART_NAME = "charm"

# What charm_builder keeps in the build directory between builds.
KEPT = ("staging-venv", "charmcraft-dependencies-hash.txt")

class BuildError(Exception):
    """The charm could not be built, packed or unpacked."""


def in_git_checkout(repo: Path = REPO) -> bool:
    """Whether ``repo`` is the top of a git work tree (a clone or a worktree)."""
    try:
        top = subprocess.run(["git", "-C", str(repo), "rev-parse", "--show-toplevel"],
                             capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return False
    return Path(top).resolve() == repo.resolve()


def why_not() -> str:
    """Why the packed charm cannot be built here ('' when it can)."""
    if "MUTANT_UNDER_TEST" in os.environ:
        return "mutmut: a packed charm runs the unmutated checkout in its own process"
    if not in_git_checkout():
        return "not a git checkout: the charm is built from what git stores"
    try:
        import charmcraft  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        return "charmcraft is not installed: make test installs it (pyproject's unit extra)"
    return ""


def _clean_build_dir(build: Path) -> None:
    """Empty the part's build directory but for charm_builder's dependency cache."""
    build.mkdir(parents=True, exist_ok=True)
    for child in build.iterdir():
        if child.name in KEPT:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()


def charm_part(project: Path) -> Tuple[str, dict]:
    """The ``charm`` plugin part of ``charmcraft.yaml`` (tools/check_pack.py finds it the same way)."""
    from tools import check_pack

    config = yaml.safe_load((project / "charmcraft.yaml").read_text(encoding="utf-8"))
    name, part = check_pack.charm_part(config)
    if part.get("plugin") != "charm":
        raise BuildError(f"part {name!r} uses the {part.get('plugin')} plugin, not charm")
    return name, part


def build_commands(part: dict, work: Path, path: str) -> Tuple[List[str], Path, Path]:
    """The build commands charmcraft's charm plugin gives for ``part``; its build and install dirs.

    ``path`` is the PATH charmcraft would pass on to the charm builder (its own).
    """
    from charmcraft.parts.plugins import CharmPlugin, CharmPluginProperties
    from craft_parts.dirs import ProjectDirs
    from craft_parts.infos import PartInfo, ProjectInfo
    from craft_parts.parts import Part

    properties = CharmPluginProperties.unmarshal(part)
    common = {k: v for k, v in part.items() if not k.startswith("charm-")}
    project = ProjectInfo(application_name="charmcraft", cache_dir=work / "cache",
                          project_dirs=ProjectDirs(work_dir=work))
    info = PartInfo(project, Part(PART_NAME, common, project_dirs=project.dirs))
    plugin = CharmPlugin(properties=properties, part_info=info)
    with mock.patch.dict(os.environ, {"PATH": path}):
        commands = plugin.get_build_commands()
    return commands, info.part_build_dir, info.part_install_dir


def unit_python(where: Path) -> Path:
    """A bare interpreter, like a unit's python3: the standard library and nothing else.

    Made from the interpreter running the tests (the one whose Python version the
    built venv/ is for). Returns the directory that holds its ``python3``.
    """
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--clear", str(where)],
                   check=True, capture_output=True)
    return where / "bin"


@contextlib.contextmanager
def shared(tmp_path_factory, name: str) -> Iterator[Path]:
    """``name``, a directory of this test session that every pytest-xdist worker shares.

    Held by one process at a time: a build done there once (a ``done`` file beside it says so)
    serves every worker. Without xdist it is the session's own temporary directory.
    """
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the controller's basetemp, above each worker's popen-gwN
    path = root / name
    with _locked(path):
        yield path


@contextlib.contextmanager
def _locked(work: Path) -> Iterator[None]:
    """One build at a time in ``work`` (two test runs in one checkout)."""
    work.mkdir(parents=True, exist_ok=True)
    with open(work / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(python_bin: Path, log: Path, project: Path = REPO, work: Path = WORK) -> Path:
    """Build the charm as ``charmcraft pack`` does; the install directory (the charm's files).

    ``python_bin`` holds the ``python3`` that the builder makes ``staging-venv`` with.
    The builder's output goes to ``log``.
    """
    _name, part = charm_part(project)
    path = os.pathsep.join([str(python_bin), "/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                            "/usr/bin", "/sbin", "/bin"])
    # The staging venv is only reused for the same interpreter.
    work = work / f"py{sys.version_info.major}.{sys.version_info.minor}"
    with _locked(work):
        commands, build_dir, install_dir = build_commands(part, work, path)
        _clean_build_dir(build_dir)
        export(project, build_dir)
        with log.open("a", encoding="utf-8") as out:
            for command in commands:
                out.write(f"$ {command}\n")
                out.flush()
                done = subprocess.run(["/bin/bash", "-c", command], cwd=build_dir, stdout=out,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
                if done.returncode:
                    tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-30:])
                    raise BuildError(f"the charm plugin's build failed (exit {done.returncode}); "
                                     f"the end of {log}:\n{tail}")
        charm = Path(tempfile.mkdtemp(prefix="prime-", dir=log.parent))
        shutil.copytree(install_dir, charm, symlinks=True, dirs_exist_ok=True)
    return charm


def pack(prime: Path, charm_file: Path) -> Path:
    """Zip the built charm with charmcraft's own ``build_zip``, as ``charmcraft pack`` does."""
    from charmcraft.utils import build_zip

    build_zip(charm_file, prime)
    return charm_file


def unpack(charm_file: Path, dest: Path) -> Path:
    """Unzip a charm keeping the file modes the zip records, as Juju does on the unit."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(charm_file) as archive:
        for info in archive.infolist():
            target = dest / info.filename
            if not target.resolve().is_relative_to(dest.resolve()):
                raise BuildError(f"{info.filename} leaves the charm directory")
            archive.extract(info, dest)
            mode = (info.external_attr >> 16) & 0o7777
            if mode:
                target.chmod(mode)
    return dest


def juju_unit(charm_file: Path, python_bin: Path, where: Path, root: Path, tools,
              name: str = "nova-compute-nvidia-vgpu/0", principal: str = "nova-compute/0"):
    """One unit of ``charm_file``, unpacked under ``where``, on the host tree ``root``.

    Juju's state of it goes to ``where/juju``; ``tools`` (unit_tests/faketools.py) stand in
    for systemctl and the like, ahead of the bare interpreter ``python_bin`` on PATH.
    """
    from unit_tests.fakejuju import Unit

    charm_dir = unpack(charm_file, where / "charm")
    state = where / "juju"
    state.mkdir()
    env = {"VGPU_HOST_ROOT": str(root), "FAKE_LOG": str(tools.log), "FAKE_STATE": str(tools.state)}
    path = [str(tools.bin), str(python_bin), "/usr/local/sbin", "/usr/local/bin",
            "/usr/sbin", "/usr/bin", "/sbin", "/bin"]
    return Unit(charm_dir, state, name, principal, env, path)


def analyse(charm_file: Path) -> Dict[str, Tuple[str, str]]:
    """``charmcraft analyse``: each of charmcraft's checkers on the packed charm, by its name.

    Returns ``{name: (result, text)}``, e.g. ``{"entrypoint": ("ok", ...), "language": ("python", ...)}``.
    """
    from charmcraft.application.main import APP_METADATA
    from charmcraft.services.analysis import AnalysisService

    from tools.build_charm import quiet_emitter

    service = AnalysisService(APP_METADATA, None)  # lint_file needs neither
    with quiet_emitter():
        return {r.name: (str(r.result), r.text) for r in service.lint_file(charm_file)}
