#!/usr/bin/env python3
"""Build a deployable ``.charm`` per platform of charmcraft.yaml, without LXD or snapd.

``charmcraft pack`` builds in an LXD container or a Multipass VM (both need
snapd), or with ``--destructive-mode`` on the very Ubuntu release of the base,
which pip's charmcraft refuses off Ubuntu. ``make charm`` builds the same
charm on any Linux with Python and git, for every platform charmcraft.yaml
lists (``ubuntu@22.04:amd64`` ... ``ubuntu@24.04:arm64``), reusing charmcraft's
own code for everything but the dependency install:

1. the files git stores (``git ls-files --stage``: tracked paths, git's modes,
   the checkout's content), laid out in a build directory;
2. charmcraft's ``CharmBuilder`` (what its charm plugin runs) links them into
   the charm less ``.jujuignore`` and writes ``dispatch`` and ``hooks/``;
3. requirements.txt, its markers evaluated for the base's Python and machine,
   installed by pip as wheels for that base only: ``--only-binary=:all:
   --implementation=cp --python-version=3.12 --abi=cp312 --platform=
   manylinux_2_39_x86_64 ...`` (the base's glibc down), ``--no-deps`` (every
   pin is listed, as under charm-strict-dependencies), ``--target`` the charm's
   ``venv/``, which holds site-packages as charmcraft's charm plugin lays it
   out; then what ``pip check`` checks, read from the installed metadata;
4. ``manifest.yaml`` from charmcraft's ``Manifest`` model (its bases: the
   platform's; its attributes: charmcraft's linters on the built charm);
5. zipped with charmcraft's ``build_zip`` as ``<name>_<platform>.charm``
   (``nova-compute-nvidia-vgpu_ubuntu@24.04-amd64.charm``), as charmcraft names it;
6. checked with ``charmcraft analyse``'s linters (``AnalysisService.lint_file``):
   an error or warning fails the build.

What differs from ``charmcraft pack``: dependencies come as the wheels PyPI
publishes for the base (PyYAML with its libyaml extension; the charm plugin
builds it from source, pure Python without a compiler), and ``venv/`` holds no
pip. Wheels come from PyPI through pip's own cache.

    make charm                              # every platform, into ./ (OUT=dir elsewhere)
    .venv/bin/python tools/build_charm.py --platform ubuntu@24.04:amd64 --out build/charms

Needs charmcraft (a library in the unit-test venv), PyYAML, packaging, git and PyPI.
"""

import argparse
import contextlib
import datetime
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: tools/ is sys.path[0], the repo is not
    sys.path.insert(0, str(REPO))

from tools import check_pack  # noqa: E402

GIT_FILE = "100644"
GIT_EXECUTABLE = "100755"
GIT_SYMLINK = "120000"

# Linter results that fail the build (charmcraft's lint.ResultType values).
BAD = ("errors", "warnings", "fatal")
# The one result charmcraft 4.5.0 gives every charm the charm plugin packs with a library that
# declares PYDEPS (lib/charms/grafana_agent/v0/cos_agent.py): its pydeps linter looks for
# venv/lib/python*/site-packages, the plugin's venv/ is site-packages itself, the lookup raises
# StopIteration and logging that (emit.debug of a non-string) ends the linter: "fatal". The
# build checks the PYDEPS itself instead (pydeps_unmet); docs/reference/development.md.
PYDEPS_FATAL = "'StopIteration' object has no attribute 'rstrip'"


class BuildError(Exception):
    """The charm could not be built, or charmcraft's linters found it wrong."""


class Target(NamedTuple):
    """One charm to build: a platform of charmcraft.yaml and the Python its base runs."""

    platform: str  # as charmcraft.yaml names it: ubuntu@24.04:amd64
    release: str  # 24.04
    arch: str  # amd64 (Debian's name)
    python: str  # the base's python3: 3.12.3
    glibc: Tuple[int, int]  # the base's glibc: (2, 39)
    suffix: str = ""  # added to the file name of a charm for another Python than the base's

    @property
    def python_version(self) -> str:
        """``3.12``."""
        return ".".join(self.python.split(".")[:2])

    @property
    def abi(self) -> str:
        """``cp312``."""
        return "cp" + self.python_version.replace(".", "")

    @property
    def machine(self) -> str:
        """``x86_64``."""
        return check_pack.ARCHES[self.arch]

    def file_name(self, charm: str) -> str:
        """``nova-compute-nvidia-vgpu_ubuntu@24.04-amd64.charm``, as charmcraft names it."""
        return f"{charm}_{self.platform.replace(':', '-')}{self.suffix}.charm"

    def wheel_platforms(self) -> List[str]:
        """The platform tags a wheel may carry for this base: its glibc and every older one."""
        major, minor = self.glibc
        tags = [f"manylinux_{major}_{m}_{self.machine}" for m in range(minor, 4, -1)]
        return tags + [f"manylinux2014_{self.machine}", f"manylinux2010_{self.machine}",
                       f"manylinux1_{self.machine}", "any"]

    def markers(self) -> Dict[str, str]:
        """requirements.txt's markers as the base's Python evaluates them."""
        env = check_pack.marker_env(self.release, self.arch)
        full = self.python
        return {**env, "python_version": self.python_version, "python_full_version": full,
                "implementation_version": full}


def targets(config: dict, only: Sequence[str] = ()) -> List[Target]:
    """Every platform charmcraft.yaml lists (or those in ``only``), with its base's Python."""
    found = []
    for name, release, arch in check_pack.platforms(config):
        if only and name not in only:
            continue
        check_pack.marker_env(release, arch)  # an unknown base or arch fails here
        python, glibc = check_pack.BASES[release]
        found.append(Target(name, release, arch, python, glibc))
    unknown = sorted(set(only) - {t.platform for t in found})
    if unknown:
        raise BuildError(f"not a platform of charmcraft.yaml: {', '.join(unknown)}")
    return found


def for_this_python(target: Target) -> Target:
    """``target`` built for the Python running this (its version, glibc and machine).

    For running the built charm here (``./dispatch`` with this interpreter) when
    no base's Python is this one; named ``..._ubuntu@24.04-amd64-python3.11.charm``.
    """
    libc, version = platform.libc_ver()
    if libc != "glibc":
        raise BuildError(f"this Python runs on {libc or 'an unknown C library'}, not glibc")
    major, minor = (int(n) for n in version.split(".")[:2])
    arch = {v: k for k, v in check_pack.ARCHES.items()}[platform.machine()]
    full = platform.python_version()
    return target._replace(arch=arch, python=full, glibc=(major, minor),
                           platform=f"ubuntu@{target.release}:{arch}",
                           suffix=f"-python{'.'.join(full.split('.')[:2])}")


# --- the files git stores ----------------------------------------------------------------------

def git_modes(repo: Path = REPO) -> Dict[str, str]:
    """Every path git stores (its index), with the mode git records: ``{path: "100755"}``."""
    out = subprocess.run(["git", "-C", str(repo), "ls-files", "--stage", "-z"],
                         capture_output=True, check=True).stdout
    modes = {}
    for entry in out.split(b"\0"):
        if not entry:
            continue
        fields, _, path = entry.partition(b"\t")
        modes[os.fsdecode(path)] = fields.split()[0].decode()
    return modes


def export(repo: Path, dest: Path) -> None:
    """Lay out the files git stores under ``dest``, each with git's mode (not the checkout's)."""
    for rel, mode in sorted(git_modes(repo).items()):
        source = repo / rel
        target = dest / rel
        if mode not in (GIT_FILE, GIT_EXECUTABLE, GIT_SYMLINK):
            continue  # a submodule: not part of this project's files
        if not os.path.lexists(source):
            continue  # deleted in this checkout, not yet in git: as the next commit has it
        target.parent.mkdir(parents=True, exist_ok=True)
        if mode == GIT_SYMLINK:
            target.symlink_to(os.readlink(source))
            continue
        shutil.copyfile(source, target)
        target.chmod(0o755 if mode == GIT_EXECUTABLE else 0o644)


# --- dependencies for the base ---------------------------------------------------------------

def pins(requirements: List[Path], target: Target) -> List[str]:
    """The pinned requirements the base installs (markers evaluated as its Python does)."""
    env = target.markers()
    out = []
    for req in check_pack.pins_for(requirements, env):
        if len(req.specifier) != 1 or next(iter(req.specifier)).operator != "==":
            raise BuildError(f"{req}: not pinned with == (make requirements pins every one)")
        out.append(f"{req.name}{req.specifier}")
    return out


def install(pinned: List[str], target: Target, venv: Path, log: Path) -> None:
    """The pins as the base's wheels in ``venv`` (site-packages, as charmcraft's ``venv/``)."""
    command = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile",
               "--disable-pip-version-check", "--only-binary=:all:", "--implementation=cp",
               f"--python-version={target.python_version}", f"--abi={target.abi}", "--abi=abi3",
               "--abi=none", *(f"--platform={p}" for p in target.wheel_platforms()),
               f"--target={venv}", *pinned]
    with log.open("a", encoding="utf-8") as out:
        out.write("$ " + " ".join(command) + "\n")
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    if done.returncode:
        tail = "\n".join(log.read_text(encoding="utf-8").splitlines()[-15:])
        raise BuildError(f"pip found no {target.abi} {target.machine} wheels for every pin "
                         f"(exit {done.returncode}); the end of {log}:\n{tail}")
    shutil.rmtree(venv / "bin", ignore_errors=True)  # console scripts: not in charmcraft's venv/


def unmet(venv: Path, target: Target) -> List[str]:
    """What ``pip check`` would say of ``venv`` on the base: requirements not installed."""
    from importlib.metadata import distributions

    env = target.markers()
    installed = {canonicalize_name(d.metadata["Name"]): d.version
                 for d in distributions(path=[str(venv)])}
    problems = []
    for dist in distributions(path=[str(venv)]):
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({**env, "extra": ""}):
                continue
            have = installed.get(canonicalize_name(req.name))
            if have is None or not req.specifier.contains(have, prereleases=True):
                problems.append(f"{dist.metadata['Name']} {dist.version} requires {req}, "
                                f"{'not installed' if have is None else 'but has ' + have}")
    return sorted(problems)


def wheel_tags(venv: Path) -> Dict[str, List[str]]:
    """Each installed distribution's wheel tags, from its ``WHEEL`` file: ``{"rpds-py": [...]}``."""
    tags = {}
    for wheel in sorted(venv.glob("*.dist-info/WHEEL")):
        name = wheel.parent.name.removesuffix(".dist-info").rsplit("-", 1)[0]
        tags[canonicalize_name(name)] = [line.split(":", 1)[1].strip()
                                         for line in wheel.read_text(encoding="utf-8").splitlines()
                                         if line.startswith("Tag:")]
    return tags


# --- charmcraft's own parts ------------------------------------------------------------------

def lint(path: Path, directory: bool = False) -> list:
    """charmcraft analyse's linters on a packed charm (or a built charm directory)."""
    from charmcraft.application.main import APP_METADATA
    from charmcraft.services.analysis import AnalysisService

    service = AnalysisService(APP_METADATA, None)  # lint_file/lint_directory need neither
    with quiet_emitter():
        return list(service.lint_directory(path) if directory else service.lint_file(path))


@contextlib.contextmanager
def quiet_emitter():
    """charmcraft's linters log through craft-cli's emitter, which its command line starts.

    Outside it (here) a message would raise "Emitter needs to be initiated first": the pydeps
    linter logs why it cannot read a venv laid out as the charm plugin lays it out
    (site-packages, no lib/python3.x): the exception itself, which craft-cli cannot print,
    so that its answer is "fatal", as under charmcraft 4.5.0's ``charmcraft analyse``.
    """
    from unittest import mock

    from charmcraft import linters

    class Quiet:
        """Prints nothing, but takes its message as craft-cli's emitter does (``rstrip``).

        So a linter that hands it something else fails here as under charmcraft: the
        pydeps linter's emit.debug(exception) is ``fatal`` there, and must be here too.
        """

        def __getattr__(self, _name):
            def emit(message="", *args, **kwargs):
                message.rstrip()

            return emit

    with mock.patch.object(linters, "emit", Quiet()):
        yield


def manifest(prime: Path, target: Target) -> str:
    """manifest.yaml as charmcraft pack writes it: its version, the bases, the linters' attributes."""
    from charmcraft import utils
    from charmcraft.models.charmcraft import Base
    from charmcraft.models.lint import CheckType
    from charmcraft.models.manifest import Attribute, Manifest

    attributes = [Attribute(name=r.name, result=r.result) for r in lint(prime, directory=True)
                  if r.check_type == CheckType.ATTRIBUTE]
    started = datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")
    model = Manifest(charmcraft_started_at=started, analysis={"attributes": attributes},
                     bases=[Base(name="ubuntu", channel=target.release,
                                 architectures=[target.arch])])
    return utils.dump_yaml(model.model_dump(mode="json", by_alias=True, exclude_unset=False,
                                            exclude_none=True))


def build(target: Target, out: Path, work: Path, project: Path = REPO) -> Path:
    """Build, pack and check one charm; the path of the ``.charm`` in ``out``."""
    from charmcraft.charm_builder import CharmBuilder
    from charmcraft.utils import build_zip

    _name, part = check_pack.charm_part(yaml.safe_load(
        (project / "charmcraft.yaml").read_text(encoding="utf-8")))
    if part.get("plugin") != "charm":
        raise BuildError(f"the charm part uses the {part.get('plugin')} plugin, not charm")
    charm = yaml.safe_load((project / "metadata.yaml").read_text(encoding="utf-8"))["name"]
    source, prime = work / "source", work / "prime"
    for path in (source, prime):
        shutil.rmtree(path, ignore_errors=True)
    source.mkdir(parents=True)
    export(project, source)
    requirements = [source / r for r in part.get("charm-requirements", ["requirements.txt"])]
    with (work / "build.log").open("w", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        builder = CharmBuilder(builddir=source, installdir=prime,
                               entrypoint=source / part.get("charm-entrypoint", "src/charm.py"))
    prime.mkdir()
    with (work / "build.log").open("a", encoding="utf-8") as log, contextlib.redirect_stdout(log):
        builder.handle_dispatcher(builder.handle_generic_paths())
    install(pins(requirements, target), target, prime / "venv", work / "pip.log")
    problems = unmet(prime / "venv", target)
    if problems:
        raise BuildError("the dependencies are inconsistent: " + "; ".join(problems))
    (prime / "manifest.yaml").write_text(manifest(prime, target), encoding="utf-8")
    out.mkdir(parents=True, exist_ok=True)
    charm_file = out / target.file_name(charm)
    charm_file.unlink(missing_ok=True)
    build_zip(charm_file, prime)
    judge(lint(charm_file), prime, charm_file.name)
    return charm_file


def pydeps_unmet(charm: Path) -> List[str]:
    """The PYDEPS of the charm's libraries (lib/charms) that its flat venv/ does not satisfy."""
    from importlib.metadata import distributions

    from charmcraft.utils.charmlibs import collect_charmlib_pydeps

    installed = {canonicalize_name(d.metadata["Name"]): d.version
                 for d in distributions(path=[str(charm / "venv")])}
    unmet_deps = []
    for line in sorted(collect_charmlib_pydeps(basedir=charm)):
        req = Requirement(line)
        have = installed.get(canonicalize_name(req.name))
        if have is None or not req.specifier.contains(have, prereleases=True):
            unmet_deps.append(f"{req} ({'not installed' if have is None else 'has ' + have})")
    return unmet_deps


def judge(results: Iterable, charm: Path, name: str) -> List[str]:
    """The linters' results counted: BuildError for any in BAD; the explained ones as text.

    Only pydeps' PYDEPS_FATAL on the charm plugin's flat venv/ is explained rather than
    failed, and only while :func:`pydeps_unmet` finds every PYDEPS satisfied.
    """
    bad, explained = [], []
    for r in results:
        if r.result not in BAD:
            continue
        if (r.name, r.result, r.text) == ("pydeps", "fatal", PYDEPS_FATAL) \
                and not (charm / "venv" / "lib").is_dir():
            missing = pydeps_unmet(charm)
            if not missing:
                explained.append("pydeps fatal (the charm plugin's flat venv/, which charmcraft's "
                                 "linter cannot read; every PYDEPS checked here and met)")
                continue
            bad.append(f"pydeps: the libraries' PYDEPS are not met: {'; '.join(missing)}")
            continue
        bad.append(f"{r.name}: {r.result} ({r.text})")
    if bad:
        raise BuildError(f"charmcraft analyse finds {name} wrong: " + "; ".join(bad))
    return explained


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path.cwd(), help="where the .charm files go")
    parser.add_argument("--platform", action="append", default=[],
                        help="only this platform of charmcraft.yaml (repeatable)")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary dir)")
    args = parser.parse_args(argv)
    config = yaml.safe_load((REPO / "charmcraft.yaml").read_text(encoding="utf-8"))
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="build-charm-"))
    try:
        for target in targets(config, args.platform):
            charm_file = build(target, args.out.resolve(), work / target.platform.replace(":", "-"))
            tags = wheel_tags(Path(work / target.platform.replace(":", "-") / "prime" / "venv"))
            binary = sorted(f"{n} ({t[0]})" for n, t in tags.items() if t and not t[0].endswith("-any"))
            prime = Path(work / target.platform.replace(":", "-") / "prime")
            explained = judge(lint(charm_file), prime, charm_file.name)
            print(f"{charm_file}: Python {target.python_version}, {target.machine}; "
                  f"compiled wheels: {', '.join(binary) or 'none'}; charmcraft analyse: "
                  f"{len(explained)} explained result(s){': ' if explained else ''}"
                  f"{'; '.join(explained)}; no other errors, warnings or fatal results")
    except (BuildError, check_pack.CheckError) as error:
        print(f"build-charm: FAILED: {error}\n(work kept in {work})", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
