"""Shared fixtures: a host root per test, fake host tools on PATH, driver packages.

No GPU, systemd or initramfs exists here, so ``systemctl`` and
``update-initramfs`` are small scripts that record their calls; dpkg and
dpkg-deb are the real ones.
"""

import importlib.util
import os
import platform
import sys
import zipfile
from pathlib import Path

import pytest
from ops import testing

from charm import NovaComputeNvidiaVgpuCharm
from unit_tests import debs
from unit_tests.fakehost import FakeHost, v100_host
from unit_tests.faketools import Tools

NOVA_MARK = "pytest.mark.nova"  # make nova-functional finds the modules to run by this text


@pytest.hookimpl(tryfirst=True)  # before -m deselects: every test marked nova is seen
def pytest_collection_modifyitems(config, items):
    """Tests marked ``nova`` import Nova: skipped where it is not installed.

    ``make test`` deselects them (``-m "not nova"``); ``make nova-functional``
    runs them in its Nova venv, over the modules that spell the mark
    ``pytest.mark.nova``, so a module that marks them another way is refused.
    """
    installed = importlib.util.find_spec("nova") is not None
    marked = {}
    for item in items:
        if item.get_closest_marker("nova") is None:
            continue
        if item.path not in marked:
            marked[item.path] = NOVA_MARK in Path(item.path).read_text(encoding="utf-8")
        if not marked[item.path]:
            raise pytest.UsageError(f"{item.nodeid}: mark tests that need Nova with {NOVA_MARK} "
                                    "(how make nova-functional finds their modules)")
        if not installed:
            item.add_marker(pytest.mark.skip(
                reason="needs Nova: make nova-functional runs it in its Nova venv"))


@pytest.fixture
def tools(tmp_path, monkeypatch) -> Tools:
    tools = Tools(tmp_path / "tools")
    for name, value in tools.environ().items():
        monkeypatch.setenv(name, value)
    return tools


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    """An empty host root, in force through VGPU_HOST_ROOT."""
    path = tmp_path / "host"
    path.mkdir()
    monkeypatch.setenv("VGPU_HOST_ROOT", str(path))
    return path


@pytest.fixture
def bindir(tmp_path, monkeypatch) -> Path:
    """A folder first on PATH for stand-in tools."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ['PATH']}")
    return path


@pytest.fixture
def moves(monkeypatch):
    """Each os.replace as (source, destination, source directory, destination directory).

    The writer opens its temporary file relative to a descriptor of the target's
    directory: where that descriptor points is read from /proc/self/fd.
    """
    made = []
    real = os.replace

    def replace(src, dst, *, src_dir_fd=None, dst_dir_fd=None):
        made.append((src, dst, os.readlink(f"/proc/self/fd/{src_dir_fd}"),
                     os.readlink(f"/proc/self/fd/{dst_dir_fd}")))
        return real(src, dst, src_dir_fd=src_dir_fd, dst_dir_fd=dst_dir_fd)

    monkeypatch.setattr(os, "replace", replace)
    return made


@pytest.fixture
def fake_host(root) -> FakeHost:
    return FakeHost(root)


@pytest.fixture
def ctx() -> testing.Context:
    """The real charm under ops.testing."""
    return testing.Context(NovaComputeNvidiaVgpuCharm)


@pytest.fixture
def v100(root, tools) -> FakeHost:
    """Two V100s, nova caracal, the vGPU module loaded, both vGPU services up."""
    host = v100_host(root)
    tools.set_active("nvidia-vgpu-mgr")
    tools.set_active("nvidia-vgpud")
    return host


@pytest.fixture(scope="session")
def packages(tmp_path_factory) -> dict:
    """Real .deb files, built once and only read: driver packages and what an operator might attach."""
    d = tmp_path_factory.mktemp("debs")
    return {
        "old": debs.host_driver(d),
        "new": debs.newer_host_driver(d),
        # Another branch's package carrying the very same version string.
        "other-branch": debs.build(d, "nvidia-vgpu-ubuntu-580", debs.OLD, debs.machine_arch(),
                                   debs.host_files()),
        "guest": debs.guest_driver(d),
        "garbage": debs.garbage(d),
        "empty": debs.empty(d),  # Charmhub's placeholder: nothing attached yet
        "depends": debs.unmet_depends(d),
        "hollow": debs.build(d, debs.HOST, debs.OLD, debs.machine_arch(), {"usr/share/doc/x": "x\n"}),
    }


@pytest.fixture(scope="session")
def made_charms(tmp_path_factory) -> dict:
    """``make charm``'s artefacts (tools/build_charm.py), one per platform, built once a session.

    ``{target: path of the .charm}``; wheels come from PyPI through pip's cache. Under
    pytest-xdist the first worker that needs them builds them, the others wait and reuse them.
    """
    import yaml

    from tools import build_charm
    from unit_tests import packing

    if not packing.in_git_checkout():
        pytest.skip("not a git checkout: the charm is built from what git stores")
    config = yaml.safe_load((build_charm.REPO / "charmcraft.yaml").read_text(encoding="utf-8"))
    with packing.shared(tmp_path_factory, "made-charms") as out:
        return {target: _built_once(out, target) for target in build_charm.targets(config)}


def _built_once(out: Path, target) -> Path:
    """``target``'s charm in ``out``, built unless a worker built it already (its ``.done`` file)."""
    import yaml

    from tools import build_charm

    name = yaml.safe_load((build_charm.REPO / "metadata.yaml").read_text(encoding="utf-8"))["name"]
    charm_file = out / target.file_name(name)
    done = out / f"{charm_file.name}.done"
    if not done.exists():
        build_charm.build(target, out, out / "work" / target.platform.replace(":", "-"))
        done.touch()
    return charm_file


@pytest.fixture(scope="session")
def made_charm(request, tmp_path_factory) -> Path:
    """``make charm``'s artefact whose base runs this machine's Python (the one ./dispatch can run).

    Else the very same build for this Python's version and glibc; or the file that
    ``DISPATCH_CHARM`` names (``make charm`` then ``DISPATCH_CHARM=./nova-compute-nvidia-vgpu_
    ubuntu@24.04-amd64.charm pytest unit_tests/test_dispatch.py`` on Ubuntu 24.04).
    """
    from tools import build_charm
    from unit_tests import packing

    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    given = os.environ.get("DISPATCH_CHARM")
    if given:
        charm_file = Path(given).resolve()
        with zipfile.ZipFile(charm_file) as archive:
            compiled = [n for n in archive.namelist() if n.startswith("venv/rpds/") and
                        n.endswith(".so")]
        if not all(f".cpython-{here.replace('.', '')}-" in n for n in compiled):
            pytest.fail(f"DISPATCH_CHARM {charm_file.name} holds {compiled}: not for Python {here}")
        return charm_file
    made = request.getfixturevalue("made_charms")
    for target, charm_file in made.items():
        if target.python_version == here and target.machine == platform.machine():
            return charm_file
    with packing.shared(tmp_path_factory, "made-charm-this-python") as out:
        return _built_once(out, build_charm.for_this_python(next(iter(made))))
