#!/usr/bin/env python3
"""Replay what ``charmcraft pack`` installs for the charm, with no Rust and no C compiler.

Reads charmcraft.yaml, finds the part that builds ``src/charm.py`` and derives
the pip commands charmcraft 4.x runs for it (charm plugin: ``charm_builder.py``;
python plugin: craft-parts' python plugin with ``PIP_NO_BINARY=:all:``). Then:

1. runs them in a fresh venv made by this host's ``python3``, in an
   environment like charmcraft's (``env -i`` with LANG, LC_ALL,
   CRYPTOGRAPHY_OPENSSL_NO_LEGACY), no pip configuration, an empty pip cache,
   and a PATH holding every tool of this host except cargo, rustc, rustup and
   the C/C++ compilers: a dependency that needs building with them fails here;
2. checks pip's install reports: only the packages the part lets pip take as
   binary came as wheels, and every package built from source built pure
   Python (no compiled code, whatever toolchain was found);
3. lays the charm out as charmcraft does (the project less .jujuignore, the
   venv's site-packages as ``venv/``) and imports ``src/charm.py`` from it in a
   bare interpreter with PYTHONPATH set only to the charm's ``lib``, ``venv``
   and ``src`` (as its dispatch does); every module must come from there, and
   jsonschema must accept the shipped schema and reject an injection;
4. for every platform in charmcraft.yaml (base -> its Python and glibc, arch),
   evaluates requirements.txt's markers as that base would, and downloads the
   binary-allowed pins as wheels for that platform and the others as source
   releases accepted by that Python: a missing arm64 or cp310 wheel fails here.

``--control`` also builds the binary-allowed pins (rpds-py, pydantic-core) from source, as the
python plugin (``PIP_NO_BINARY=:all:``) or the part without its exception
would, and expects that to fail for want of Rust: proof that this check notices.

    make pack-check          # or: .venv/bin/python tools/check_pack.py [--control] [--keep DIR]

Needs PyYAML and packaging (both in the unit-test venv) and PyPI.
"""

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Set, Tuple

import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]

# charmcraft's charm plugin replaces a venv pip older than 24.1 with 24.1.1,
# built from its source release.
MINIMUM_PIP = (24, 1)
KNOWN_GOOD_PIP = "pip==24.1.1"

# Ubuntu base -> (its python3, its glibc), for markers and wheel tags.
BASES: Dict[str, Tuple[str, Tuple[int, int]]] = {
    "22.04": ("3.10.12", (2, 35)),
    "24.04": ("3.12.3", (2, 39)),
}
ARCHES = {"amd64": "x86_64", "arm64": "aarch64", "ppc64el": "ppc64le", "s390x": "s390x",
          "riscv64": "riscv64"}

# Kept off PATH while installing.
RUST_TOOLS = {"cargo", "rustc", "rustup", "rustdoc", "rust-gdb", "rust-lldb"}
COMPILER = re.compile(r"([\w.+-]*-)?(gcc|g\+\+|cc|c\+\+|c89|c99|clang|clang\+\+|cpp|tcc)(-[0-9.]+)?")

# Ignored whatever .jujuignore says (charmcraft's own defaults).
DEFAULT_IGNORE = [".git", ".svn", ".hg", ".bzr", ".tox", "/build/", "/revision", "/venv", ".jujuignore"]

# Passed through to pip, as charmcraft passes the proxy variables.
PASS_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
            "PIP_INDEX_URL", "PIP_CERT", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_DEFAULT_TIMEOUT")

# Files that only a compiler makes.
NATIVE = re.compile(r"\.(so|pyd|dylib|a|o)(\.[0-9.]+)?$")

# A requirement line's package name, read as charmcraft reads it: literally.
LINE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


class CheckError(Exception):
    """The charm would not pack (or not import) the way charmcraft.yaml says."""


class Plan(NamedTuple):
    """How one part installs its dependencies."""

    plugin: str
    requirements: List[Path]
    binary: List[str]  # packages pip may take as wheels (names as written)
    steps: List[List[str]]  # pip arguments, one install (or check) each
    env: Dict[str, str]  # plugin-specific build environment
    venv_pip: bool  # whether the venv gets its own pip (else pip runs from outside: --python)


# --- reading charmcraft.yaml -------------------------------------------------------------------

def requirement_names(paths: Iterable[Path]) -> Set[str]:
    """Package names in requirements files, spelt as written (charmcraft compares them so)."""
    names = set()
    for path in paths:
        for line in path.read_text(encoding="utf-8").splitlines():
            match = LINE_NAME.match(line.strip())
            if match:
                names.add(match.group(0))
    return names


def charm_part(config: dict) -> Tuple[str, dict]:
    """The part that builds src/charm.py."""
    parts = config.get("parts") or {}
    for name, part in parts.items():
        if part.get("plugin") in ("charm", "python", "uv", "poetry"):
            return name, part
    raise CheckError("charmcraft.yaml has no charm, python, uv or poetry part")


def plan_for(part: dict, project: Path) -> Plan:
    """The pip commands charmcraft runs for this part."""
    plugin = part["plugin"]
    if plugin == "charm":
        return _charm_plan(part, project)
    if plugin == "python":
        reqs = [project / r for r in part.get("python-requirements", [])]
        args = ["install", "--no-deps",
                *(f"--constraint={project / c}" for c in part.get("python-constraints", [])),
                *(f"--requirement={r}" for r in reqs), *part.get("python-packages", [])]
        return Plan("python", reqs, [], [args, ["check"]], {"PIP_NO_BINARY": ":all:"}, venv_pip=False)
    raise CheckError(f"the {plugin} plugin is not replayed by this check")


def _charm_plan(part: dict, project: Path) -> Plan:
    entrypoint = project / part.get("charm-entrypoint", "src/charm.py")
    if not entrypoint.is_file():
        raise CheckError(f"charm-entrypoint {entrypoint.relative_to(project)} does not exist")
    reqs = [project / r for r in part.get("charm-requirements", [])]
    if not reqs and (project / "requirements.txt").is_file():
        reqs = [project / "requirements.txt"]
    binary = list(part.get("charm-binary-python-packages", []))
    packages = list(part.get("charm-python-packages", []))
    req_args = [f"--requirement={r}" for r in reqs]
    if part.get("charm-strict-dependencies", False):
        if packages:
            raise CheckError("charm-python-packages cannot go with charm-strict-dependencies")
        if not reqs:
            raise CheckError("charm-strict-dependencies needs a requirements file")
        names = requirement_names(reqs)
        unlisted = sorted(set(binary) - names)
        if unlisted:  # charmcraft fails these too ("missing dependencies")
            raise CheckError(f"charm-binary-python-packages not in the requirements "
                              f"(spelt as there): {', '.join(unlisted)}")
        source_only = sorted(names - set(binary))
        no_binary = [f"--no-binary={','.join(source_only)}"] if source_only else []
        return Plan("charm", reqs, binary, [["install", "--no-deps", *no_binary, *req_args], ["check"]],
                    {}, venv_pip=True)
    # Legacy mode: binary packages with whatever they pull (as wheels), then
    # pip/setuptools/wheel and charm-python-packages from source, then the requirements.
    steps = []
    if binary:
        steps.append(["install", *binary])
    if packages or reqs:
        listed = {re.split("[<=>]", p, maxsplit=1)[0].strip() for p in packages}
        tools = [t for t in ("pip", "setuptools", "wheel") if t not in listed]
        steps.append(["install", "--no-binary=:all:", *tools, *packages])
    if reqs:
        steps.append(["install", "--no-binary=:all:", *req_args])
    return Plan("charm", reqs, binary, steps, {}, venv_pip=True)


def platforms(config: dict) -> List[Tuple[str, str, str]]:
    """(name, Ubuntu release, arch) for every platform the charm is built for."""
    found = []
    for name, spec in (config.get("platforms") or {}).items():
        targets = (spec or {}).get("build-for") or [name]
        for target in targets if isinstance(targets, list) else [targets]:
            match = re.fullmatch(r"ubuntu@(\d+\.\d+):(\w+)", target)
            if not match:
                raise CheckError(f"platform {target!r}: expected ubuntu@<release>:<arch>")
            found.append((target, match.group(1), match.group(2)))
    if not found:
        raise CheckError("charmcraft.yaml lists no platforms")
    return found


# --- running pip without toolchains ------------------------------------------------------------

def toolchain_free_path(shim: Path) -> str:
    """A PATH with a link to every tool on this PATH but Rust's and the C/C++ compilers."""
    shim.mkdir(parents=True)
    for directory in os.environ.get("PATH", "").split(os.pathsep):
        try:
            entries = sorted(os.scandir(directory or "."), key=lambda e: e.name)
        except OSError:
            continue
        for entry in entries:
            name = entry.name
            if (name in RUST_TOOLS or name.startswith("cargo-") or COMPILER.fullmatch(name)
                    or (shim / name).exists() or not os.access(entry.path, os.X_OK)
                    or entry.is_dir()):
                continue
            (shim / name).symlink_to(entry.path)
    path = str(shim)
    for tool in ("cargo", "rustc", "rustup", "cc", "gcc", "c++", "clang"):
        if shutil.which(tool, path=path):
            raise CheckError(f"{tool} is still on the stripped PATH")
    return path


class Runner:
    """Runs commands in the clean environment, logging their output."""

    def __init__(self, work: Path, log: Path):
        self.work = work
        self.log = log
        home = work / "home"
        tmp = work / "tmp"
        home.mkdir()
        tmp.mkdir()
        self.env = {
            "PATH": toolchain_free_path(work / "bin"),
            "HOME": str(home),  # an empty pip cache: no wheel built earlier with a compiler
            "TMPDIR": str(tmp),
            "LANG": "C.UTF-8",
            "LC_ALL": "C.UTF-8",
            "CRYPTOGRAPHY_OPENSSL_NO_LEGACY": "true",
            "PIP_CONFIG_FILE": os.devnull,  # no site indexes, find-links or constraints
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
        }
        self.env.update({k: os.environ[k] for k in PASS_ENV if k in os.environ})

    def __call__(self, cmd: Sequence[str], extra_env: Optional[Dict[str, str]] = None,
                 cwd: Optional[Path] = None) -> str:
        """Run ``cmd``; its output goes to the log; CheckError with the log's tail on failure."""
        with self.log.open("a", encoding="utf-8") as out:
            out.write(f"\n$ {shlex.join(str(c) for c in cmd)}\n")
            out.flush()
            proc = subprocess.run([str(c) for c in cmd], env={**self.env, **(extra_env or {})},
                                  cwd=cwd or self.work, stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True, errors="replace")
            out.write(proc.stdout)
        if proc.returncode != 0:
            tail = "\n".join("    " + ln for ln in proc.stdout.rstrip().splitlines()[-25:])
            raise CheckError(f"failed (exit {proc.returncode}): {shlex.join(str(c) for c in cmd)}\n{tail}")
        return proc.stdout


def install(plan: Plan, python: str, run: Runner, work: Path) -> Tuple[Path, List[dict]]:
    """Run the plan's pip commands into a new venv; its site-packages and pip's reports."""
    venv = work / "staging-venv"
    if plan.venv_pip:
        run([python, "-m", "venv", venv])
        pip = [venv / "bin" / "python", "-m", "pip"]
    else:  # craft-parts' python plugin: a venv without pip, driven by another pip
        run([python, "-m", "venv", "--without-pip", venv])
        helper = work / "pip-venv"
        run([python, "-m", "venv", helper])
        pip = [helper / "bin" / "python", "-m", "pip", f"--python={venv / 'bin' / 'python'}"]
    version = run([*pip, "--version"]).split()[1]
    if plan.venv_pip and tuple(int(p) for p in re.findall(r"\d+", version)[:2]) < MINIMUM_PIP:
        run([*pip, "install", "--force-reinstall", "--no-binary=pip", KNOWN_GOOD_PIP])
    reports = []
    for number, step in enumerate(plan.steps):
        args = list(step)
        if step[0] == "install":
            report = work / f"report-{number}.json"
            args.append(f"--report={report}")
        print(f"  pip {shlex.join(step)}".replace(str(REPO) + "/", ""))
        run([*pip, *args], plan.env)
        if step[0] == "install":
            reports.extend(json.loads(report.read_text())["install"])
    site = list((venv / "lib").glob("python3*/site-packages"))
    if len(site) != 1:
        raise CheckError(f"no single site-packages in {venv}")
    return site[0], reports


def check_reports(plan: Plan, reports: List[dict], site: Path) -> List[str]:
    """Wheels only where allowed; no compiled file from a source build. Returns lines to print."""
    allowed = {canonicalize_name(b) for b in plan.binary}
    native = {}  # package -> the compiled files it installed
    for dist_info in site.glob("*.dist-info"):
        name = canonicalize_name(_fields(dist_info / "METADATA").get("Name", [dist_info.name])[0])
        record = (dist_info / "RECORD").read_text(encoding="utf-8", errors="replace").splitlines()
        native[name] = [row.split(",")[0] for row in record if NATIVE.search(row.split(",")[0])]
    lines, problems = [], []
    for item in sorted(reports, key=lambda i: canonicalize_name(i["metadata"]["name"])):
        name = canonicalize_name(item["metadata"]["name"])
        version = item["metadata"]["version"]
        from_wheel = item["download_info"]["url"].split("#")[0].endswith(".whl")
        compiled = native.get(name, [])
        if from_wheel and name not in allowed:
            problems.append(f"{name} {version} came as a wheel but the part allows no binary for it")
        if not from_wheel and compiled:
            problems.append(f"{name} {version} compiled code while building from source: {compiled[0]}")
        how = "wheel " if from_wheel else "source"
        what = f"compiled: {', '.join(Path(c).name for c in compiled)}" if compiled else "pure Python"
        lines.append(f"  {how} {name}=={version} ({what})")
    if problems:
        raise CheckError("\n".join(problems))
    return lines


def _fields(path: Path) -> Dict[str, List[str]]:
    fields: Dict[str, List[str]] = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            break  # METADATA's body follows
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), []).append(value.strip())
    return fields


# --- the charm as charmcraft lays it out -------------------------------------------------------

def ignore_patterns(project: Path) -> List[str]:
    patterns = list(DEFAULT_IGNORE)
    path = project / ".jujuignore"
    if path.exists():
        patterns += [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()
                     if ln.strip() and not ln.lstrip().startswith("#")]
    return [p for p in patterns if p]


def ignored(rel: str, is_dir: bool, patterns: List[str]) -> bool:
    """A plain reading of .jujuignore (gitignore-like): anchored, dir-only and name globs."""
    for pattern in patterns:
        if pattern.endswith("/") and not is_dir:
            continue
        core = pattern.strip("/")
        if pattern.startswith("/") or "/" in core:
            if fnmatch.fnmatchcase(rel, core):
                return True
        elif fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], core):
            return True
    return False


def pydeps_note(charm: Path, plugin: str) -> str:
    """Why ``charmcraft analyse`` says pydeps ``fatal`` on this layout (docs/reference/development.md)."""
    nested = sorted(p.name for p in (charm / "venv" / "lib").glob("python*"))
    if nested:
        return f"venv/lib/{nested[0]}/site-packages: charmcraft analyse's pydeps linter can read it"
    return (f"venv/ is site-packages itself ({plugin} plugin; no venv/lib/python3.x/site-packages): "
            "charmcraft analyse's pydeps linter (charmcraft 4.5.0) looks only there and reports "
            "fatal (\"'StopIteration' object has no attribute 'rstrip'\"); make charm checks the "
            "libraries' PYDEPS against venv/ itself. The python plugin nests the venv but builds "
            "every dependency from source (PIP_NO_BINARY=:all:): --control shows that failing "
            "for want of Rust")


def lay_out(project: Path, site: Path, charm: Path) -> None:
    """Copy the project less .jujuignore, and site-packages as venv/."""
    patterns = ignore_patterns(project)
    for base, dirs, files in os.walk(project):
        rel_base = Path(base).relative_to(project)
        keep = []
        for name in dirs:
            rel = (rel_base / name).as_posix()
            if not ignored(rel, True, patterns):
                keep.append(name)
                (charm / rel).mkdir(parents=True, exist_ok=True)
        dirs[:] = keep
        for name in files:
            rel = (rel_base / name).as_posix()
            if not ignored(rel, False, patterns):
                shutil.copy2(Path(base) / name, charm / rel, follow_symlinks=False)
    shutil.copytree(site, charm / "venv", symlinks=True)


IMPORT_CHECK = r'''
import inspect, json, os, sys
root = os.path.realpath(sys.argv[1])
import ops, yaml, jsonschema, rpds
import charm
# What the cos-agent hooks and the exporter load: the vendored library with its PYDEPS
# (pydantic on pydantic-core), prometheus-client and nvidia-ml-py.
import charms.grafana_agent.v0.cos_agent as cos_agent, cosl, pydantic, pydantic_core
import prometheus_client, pynvml, vgpu_exporter
classes = [c for c in vars(charm).values()
           if inspect.isclass(c) and issubclass(c, ops.CharmBase) and c is not ops.CharmBase]
assert classes, "src/charm.py defines no ops.CharmBase"
assert cos_agent.LIBPATCH >= 20, cos_agent.LIBPATCH
for module in (ops, yaml, jsonschema, rpds, charm, cos_agent, cosl, pydantic, pydantic_core,
               prometheus_client, pynvml, vgpu_exporter):
    where = os.path.realpath(module.__file__)
    assert where.startswith(root + os.sep), f"{module.__name__} imported from {where}"
schemas = sys.argv[2:]
assert schemas, "no *.schema.json under src/"
for path in schemas:
    with open(path, encoding="utf-8") as f:
        schema = json.load(f)
    validator = jsonschema.validators.validator_for(schema)
    validator.check_schema(schema)
    good = yaml.safe_load('nvidia-35: ["0000:84:00.0"]')
    bad = {"nvidia-35": ["0000:84:00.0\n[DEFAULT]"]}
    assert not list(validator(schema).iter_errors(good)), f"{path} rejects {good}"
    assert list(validator(schema).iter_errors(bad)), f"{path} accepts {bad}"
from importlib.metadata import version
print(json.dumps({"charm": classes[0].__name__, "python": sys.version.split()[0],
                  "validator": validator.__name__, "libyaml": yaml.__with_libyaml__,
                  **{n: version(n) for n in ("ops", "jsonschema", "rpds-py", "PyYAML", "cosl",
                                             "pydantic", "pydantic-core", "prometheus-client",
                                             "nvidia-ml-py")}}))
'''


def import_charm(python: str, charm: Path, run: Runner, work: Path) -> dict:
    """Import the charm in a bare interpreter that sees only the charm's own directories."""
    bare = work / "bare-venv"
    run([python, "-m", "venv", "--without-pip", bare])
    schemas = sorted(str(p) for p in (charm / "src").rglob("*.schema.json"))
    path = os.pathsep.join(str(charm / d) for d in ("lib", "venv", "src"))
    out = run([bare / "bin" / "python", "-s", "-c", IMPORT_CHECK, charm, *schemas],
              {"PYTHONPATH": path}, cwd=charm)
    return json.loads(out.strip().splitlines()[-1])


# --- every platform ----------------------------------------------------------------------------

def marker_env(release: str, arch: str) -> Dict[str, str]:
    if release not in BASES:
        raise CheckError(f"ubuntu@{release}: unknown base; add its Python and glibc to BASES")
    if arch not in ARCHES:
        raise CheckError(f"arch {arch}: unknown; add it to ARCHES")
    full = BASES[release][0]
    return {"python_version": ".".join(full.split(".")[:2]), "python_full_version": full,
            "implementation_version": full, "platform_machine": ARCHES[arch],
            "sys_platform": "linux", "platform_system": "Linux", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython",
            "platform_release": "", "platform_version": "", "extra": ""}


def pins_for(requirements: List[Path], env: Dict[str, str]) -> List[Requirement]:
    pins = []
    for path in requirements:
        for line in path.read_text(encoding="utf-8").splitlines():
            line = line.split(" #")[0].strip()
            if not line or line.startswith(("#", "-")):
                continue
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate(env):
                pins.append(req)
    return pins


def check_platforms(plan: Plan, config: dict, pip: List[str], run: Runner, work: Path) -> List[str]:
    """Every binary-allowed pin has a wheel, every other pin a source release, on every platform."""
    allowed = {canonicalize_name(b) for b in plan.binary} if plan.plugin == "charm" else set()
    lines, sources_done = [], set()
    for target, release, arch in platforms(config):
        env = marker_env(release, arch)
        pins = pins_for(plan.requirements, env)
        py = env["python_version"]
        abi = "cp" + py.replace(".", "")
        binary = [str(p).split(";")[0].strip() for p in pins if canonicalize_name(p.name) in allowed]
        source = [p for p in pins if canonicalize_name(p.name) not in allowed]
        got: List[str] = []
        if binary:
            glibc_major, glibc_minor = BASES[release][1]
            machine = ARCHES[arch]
            tags = [f"manylinux_{glibc_major}_{m}_{machine}" for m in range(glibc_minor, 4, -1)]
            tags += [f"manylinux2014_{machine}", f"manylinux2010_{machine}", f"manylinux1_{machine}"]
            dest = work / "wheels" / target.replace(":", "-")
            run([*pip, "download", "--no-deps", "--only-binary=:all:", "--implementation=cp",
                 f"--python-version={py}", f"--abi={abi}", "--abi=abi3", "--abi=none",
                 *(f"--platform={t}" for t in tags), f"--dest={dest}", *binary])
            got = sorted(p.name for p in dest.glob("*.whl"))
        key = (py, tuple(str(p) for p in source))
        if source and key not in sources_done:
            sources_done.add(key)
            names = ",".join(sorted({p.name for p in source}))
            run([*pip, "download", "--no-deps", f"--no-binary={names}", f"--python-version={py}",
                 f"--dest={work / 'sdists' / py}", *(str(p).split(";")[0].strip() for p in source)])
        lines.append(f"  {target} (Python {py}): {len(source)} from source, "
                     f"wheels: {', '.join(got) or 'none'}")
    return lines


# --- the control: the same part without its binary exceptions ---------------------------------

def control(plan: Plan, python: str, work: Path) -> str:
    """Build the binary-allowed pins from source, as the part would without its exceptions.

    This is what charmcraft's python plugin (``PIP_NO_BINARY=:all:``) or an
    empty ``charm-binary-python-packages`` would do with them. It must fail
    for want of Rust: proof that this check's PATH leaves no way to build them.
    """
    if not plan.binary:
        raise CheckError("--control needs a part with charm-binary-python-packages")
    wanted = {canonicalize_name(b) for b in plan.binary}
    lines = []
    for path in plan.requirements:
        for line in path.read_text(encoding="utf-8").splitlines():
            match = LINE_NAME.match(line.strip())
            if match and canonicalize_name(match.group(0)) in wanted:
                lines.append(line.strip())
    work.mkdir()
    requirements = work / "binary-allowed.txt"
    requirements.write_text("\n".join(lines) + "\n", encoding="utf-8")
    step = ["install", "--no-deps", f"--no-binary={','.join(plan.binary)}", f"--requirement={requirements}"]
    source_plan = Plan("charm", [requirements], [], [step], {}, venv_pip=True)
    log = work / "pip.log"
    run = Runner(work, log)
    print(f"control: {', '.join(lines)} from source")
    try:
        site, reports = install(source_plan, python, run, work)
    except CheckError:
        text = log.read_text(encoding="utf-8", errors="replace")
        hits = [ln.strip() for ln in text.splitlines() if re.search(r"rust|cargo", ln, re.IGNORECASE)]
        missing = [ln for ln in hits if re.search(r"not found|not installed|can.?t find", ln, re.I)]
        if hits:
            return (missing or hits)[0][:160]
        raise CheckError(f"the control failed, but not for want of Rust: see {log}") from None
    # Built after all (a build backend fetched its own Rust): the main check rejects that too.
    try:
        check_reports(source_plan, reports, site)
    except CheckError as error:
        return f"built, and rejected: {error}"
    raise CheckError(f"the control built {', '.join(plan.binary)} from source without Rust: "
                      "this check could not tell a Rust build from a pure one")


# --- main --------------------------------------------------------------------------------------

def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--charmcraft", type=Path, default=REPO / "charmcraft.yaml")
    parser.add_argument("--python", default="python3",
                        help="the interpreter charmcraft's build would use (default: python3 on PATH)")
    parser.add_argument("--control", action="store_true",
                        help="also show that the binary-allowed packages fail to build from source here")
    parser.add_argument("--keep", type=Path, help="work here and keep it (default: a temporary dir)")
    args = parser.parse_args(argv)

    python = subprocess.run([args.python, "-c", "import sys; print(sys.executable)"],
                            capture_output=True, text=True, check=True).stdout.strip()
    project = args.charmcraft.resolve().parent
    config = yaml.safe_load(args.charmcraft.read_text(encoding="utf-8"))
    work = args.keep.resolve() if args.keep else Path(tempfile.mkdtemp(prefix="check-pack-"))
    if args.keep:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    started = time.monotonic()
    try:
        name, part = charm_part(config)
        plan = plan_for(part, project)
        print(f"part {name!r}: {plan.plugin} plugin, binary allowed: {', '.join(plan.binary) or 'none'}; "
              f"no Rust or C compiler on PATH; {python}")
        run = Runner(work, work / "pip.log")
        site, reports = install(plan, python, run, work)
        for line in check_reports(plan, reports, site):
            print(line)
        print(f"installed in {time.monotonic() - started:.0f}s")

        charm = work / "charm"
        charm.mkdir()
        lay_out(project, site, charm)
        facts = import_charm(python, charm, run, work)
        print("imported the charm from its own venv: " + ", ".join(f"{k} {v}" for k, v in facts.items()))
        print(f"charmcraft analyse, pydeps: {pydeps_note(charm, plan.plugin)}")

        step = time.monotonic()
        pip = [work / "staging-venv" / "bin" / "python", "-m", "pip"]
        if not plan.venv_pip:
            pip = [work / "pip-venv" / "bin" / "python", "-m", "pip"]
        for line in check_platforms(plan, config, pip, run, work):
            print(line)
        print(f"platforms checked in {time.monotonic() - step:.0f}s")

        if args.control:
            step = time.monotonic()
            why = control(plan, python, work / "control")
            print(f"control: fails without its binary exception, for want of Rust "
                  f"({time.monotonic() - step:.0f}s): {why}")
    except CheckError as error:
        print(f"check-pack: FAILED: {error}\n(logs kept in {work})", file=sys.stderr)
        return 1
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    print(f"check-pack: OK in {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
