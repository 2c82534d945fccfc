"""The charm's packaging metadata agrees with itself."""

import re
import sys
from pathlib import Path

import yaml
from packaging.requirements import Requirement

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def pinned():
    pins = {}
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            pins.setdefault(req.name.lower().replace("_", "-"), []).append(req)
    return pins


def test_every_run_time_dependency_is_pinned_within_its_range():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    pins = pinned()
    for spec in project["dependencies"]:
        wanted = Requirement(spec)
        name = wanted.name.lower().replace("_", "-")
        assert name in pins, f"{name} is missing from requirements.txt: run make requirements"
        for pin in pins[name]:
            version = re.fullmatch(r"==(.+)", str(pin.specifier)).group(1)
            assert wanted.specifier.contains(version), f"{pin} is outside {wanted}"


def test_charmcraft_installs_the_pins_and_the_metadata_names_the_resource():
    charmcraft = yaml.safe_load((ROOT / "charmcraft.yaml").read_text())
    assert charmcraft["parts"]["charm"]["charm-requirements"] == ["requirements.txt"]
    assert set(charmcraft["platforms"]) == {f"ubuntu@{v}:{a}" for v in ("22.04", "24.04")
                                            for a in ("amd64", "arm64")}
    metadata = yaml.safe_load((ROOT / "metadata.yaml").read_text())
    assert metadata["subordinate"] is True
    assert metadata["provides"]["nova-vgpu"] == {"interface": "nova-vgpu", "scope": "container"}
    assert metadata["requires"]["juju-info"] == {"interface": "juju-info", "scope": "container"}
    assert metadata["resources"]["nvidia-vgpu-software"]["filename"] == "nvidia-vgpu.deb"


def test_the_licence_is_apache_2_0_and_every_place_names_it():
    """Apache-2.0, as the OpenStack charms and the vendored Charmhub library use (issue 36)."""
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in licence
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # PEP 639: an SPDX expression and the file; no licence classifier (setuptools 77 deprecates it).
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert not [c for c in project.get("classifiers", ()) if c.startswith("License ::")]
    metadata = yaml.safe_load((ROOT / "metadata.yaml").read_text())
    assert "Apache-2.0" in metadata["description"]
    assert "Apache-2.0" in (ROOT / "charmcraft.yaml").read_text()
    assert re.search(r"\[Apache-2\.0\]\(LICENSE\)", (ROOT / "README.md").read_text())
    said = [path for path in ROOT.glob("src/**/*.py") if "See LICENSE file" in path.read_text()]
    assert said  # the headers that point at the file find it beside the charm
    # The charm ships it: .jujuignore leaves it in.
    assert not any(line.strip().lstrip("/") == "LICENSE"
                   for line in (ROOT / ".jujuignore").read_text().splitlines())


def test_make_test_first_checks_the_system_tools_and_names_the_command_that_installs_them(tmp_path):
    """The README's two commands on a fresh machine: missing promtool stops make, saying why."""
    import os
    import shutil
    import subprocess

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for tool in ("sh", "make", "dpkg-deb", "prometheus"):
        found = shutil.which(tool)
        if found:
            (bindir / tool).symlink_to(found)
    env = {"PATH": str(bindir), "HOME": str(tmp_path)}
    import sys

    command = ["make", "-s", "-C", str(ROOT), "prerequisites", f"PYTHON={sys.executable}"]
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "make test needs: promtool." in run.stderr
    assert "sudo apt install --no-install-recommends dpkg python3-venv prometheus" in run.stderr
    (bindir / "promtool").symlink_to(shutil.which("promtool"))
    ok = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
    assert (ok.returncode, ok.stderr) == (0, "")
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^test: prerequisites \$\(VENV\)/\.ready$", makefile, re.M)
    readme = (ROOT / "README.md").read_text()
    assert "sudo apt install --no-install-recommends prometheus" in readme
    assert "promtool" in (ROOT / ".ci/run").read_text() and os.access(ROOT / ".ci/run", os.X_OK)


def test_every_page_gives_the_juju_version_the_charm_assumes():
    metadata = yaml.safe_load((ROOT / "metadata.yaml").read_text())
    assert metadata["assumes"] == ["juju >= 3.6"]
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for page in pages:
        text = page.read_text()
        for found in re.findall(r"Juju (\d+\.\d+)(?:\.\d+)? or later", text):
            assert found == "3.6", (page.name, found)
        assert not re.search(r"Juju 2\.9|Juju 3\.[0-5]\b(?! to 3\.5 are past)|Juju 3\.x", text), page.name
    for name in ("README.md", "docs/tutorial/first-deployment.md", "docs/how-to/monitor-with-cos.md"):
        assert "Juju 3.6 or later" in (ROOT / name).read_text(), name


def test_the_first_make_builds_the_project_without_a_setuptools_deprecation(tmp_path):
    """Issue 41.7: the licence table made setuptools warn on every first ``make``.

    pip builds the project as ``make`` does (an isolated build with what
    ``[build-system]`` requires, from PyPI), verbosely, so the backend's warnings show.
    """
    import subprocess

    run = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-v",
                          "-w", str(tmp_path), str(ROOT)], capture_output=True, text=True,
                         timeout=300, check=False)
    said = run.stdout + run.stderr
    assert run.returncode == 0, said[-3000:]
    assert "adding license file 'LICENSE'" in said  # the backend's output is there to read
    warned = [line for line in said.splitlines()
              if "Warning" in line or "deprecated" in line.lower()]  # SetuptoolsDeprecationWarning,
    assert not warned, said[-3000:]  # or BuildBackendWarning in later setuptools
