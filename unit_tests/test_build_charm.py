"""``make charm`` (tools/build_charm.py): a deployable charm per platform, without LXD or snapd.

Each artefact is opened as Juju would receive it (the zip) and checked for what
``charmcraft pack`` would have put there for that platform: charmcraft's file
name, wheels for the base's Python and machine in ``venv/`` (rpds-py is Rust:
cp310 on 22.04, cp312 on 24.04, x86_64 or aarch64), manifest.yaml's base,
git's file modes, and charmcraft analyse's linters. The artefact for this
machine's Python runs hook after hook in unit_tests/test_dispatch.py.
"""

import io
import os
import shutil
import zipfile

import pytest
import yaml

from tools import build_charm
from unit_tests import packing

CHARM = "nova-compute-nvidia-vgpu"


def platforms():
    config = yaml.safe_load((build_charm.REPO / "charmcraft.yaml").read_text(encoding="utf-8"))
    return [name for name, _release, _arch in build_charm.check_pack.platforms(config)]


def members(charm_file):
    with zipfile.ZipFile(charm_file) as archive:
        return {i.filename: i for i in archive.infolist()}


def read(charm_file, name) -> str:
    with zipfile.ZipFile(charm_file) as archive:
        return archive.read(name).decode()


def test_one_charm_per_platform_named_as_charmcraft_names_it(made_charms):
    assert sorted(p.name for p in made_charms.values()) == sorted(
        f"{CHARM}_{p.replace(':', '-')}.charm" for p in platforms())
    assert f"{CHARM}_ubuntu@24.04-amd64.charm" in {p.name for p in made_charms.values()}
    assert {(t.release, t.python_version) for t in made_charms} == {("22.04", "3.10"),
                                                                     ("24.04", "3.12")}


def test_each_venv_holds_the_wheels_of_its_bases_python_and_machine(made_charms):
    for target, charm_file in made_charms.items():
        names = members(charm_file)
        abi = target.abi  # cp310 on 22.04, cp312 on 24.04
        machine = target.machine
        rpds = [n for n in names if n.startswith("venv/rpds_py-") and n.endswith(".dist-info/WHEEL")]
        assert len(rpds) == 1, (target, rpds)
        tags = [line.split(":", 1)[1].strip() for line in read(charm_file, rpds[0]).splitlines()
                if line.startswith("Tag:")]
        assert tags and all(t.startswith(f"{abi}-{abi}-manylinux") and t.endswith(f"_{machine}")
                            for t in tags), (target, tags)
        # The compiled modules are for that Python and machine, and no other.
        compiled = sorted(n for n in names if n.startswith("venv/") and n.endswith(".so"))
        suffix = f".cpython-{abi[2:]}-{machine}-linux-gnu.so"
        assert any(n.startswith("venv/rpds/") for n in compiled), compiled
        assert all(n.endswith(suffix) for n in compiled), (target, compiled)
        # requirements.txt's markers as that Python reads them: rpds-py 0.30 below 3.11.
        version = rpds[0].removesuffix(".dist-info/WHEEL").split("-")[-1]
        assert (version == "0.30.0") == (target.python_version == "3.10"), (target, version)
        # Nothing compiled by the Python that ran the build, no console scripts.
        assert not [n for n in names if n.endswith(".pyc") or n.startswith("venv/bin/")]
        for package in ("ops", "jsonschema", "yaml", "referencing"):
            assert f"venv/{package}/__init__.py" in names, (target, package)


def test_each_manifest_names_its_platforms_base(made_charms):
    for target, charm_file in made_charms.items():
        manifest = yaml.safe_load(read(charm_file, "manifest.yaml"))
        assert manifest["bases"] == [{"name": "ubuntu", "channel": target.release,
                                      "architectures": [target.arch]}]
        assert manifest["charmcraft-version"]
        assert {"name": "framework", "result": "operator"} in manifest["analysis"]["attributes"]


def test_charmcraft_analyse_finds_nothing_wrong_in_any(made_charms):
    for target, charm_file in made_charms.items():
        results = packing.analyse(charm_file)
        assert results["language"][0] == "python"
        assert results["framework"][0] == "operator"
        for name in ("entrypoint", "ops-main-call", "metadata", "juju-actions", "juju-config",
                     "naming-conventions"):
            assert results[name][0] == "ok", (target, name, results[name])
        # charmcraft 4.5.0's one result on the charm plugin's flat venv/ (issue 36): counted,
        # and explained only because the build checked every PYDEPS itself.
        assert results["pydeps"] == ("fatal", build_charm.PYDEPS_FATAL), target
        assert not [(n, r) for n, r in results.items() if r[0] in build_charm.BAD
                    and n != "pydeps"], (target, results)
        with zipfile.ZipFile(charm_file) as archive:
            assert not [n for n in archive.namelist() if n.startswith("venv/lib/python")]


def test_each_charm_holds_what_git_stores_with_gits_modes(made_charms):
    modes = packing.git_modes()
    for target, charm_file in made_charms.items():
        names = members(charm_file)
        assert read(charm_file, "dispatch").rstrip().endswith("exec ./src/charm.py")
        for rel in ("dispatch", "hooks/install", "src/charm.py"):
            assert (names[rel].external_attr >> 16) & 0o111, (target, rel)
        shipped = {rel: mode for rel, mode in modes.items() if rel in names}
        assert {"src/charm.py", "src/vgpu/pci.py", "metadata.yaml", "config.yaml"} <= set(shipped)
        for rel, mode in shipped.items():
            executable = bool((names[rel].external_attr >> 16) & 0o111)
            assert executable == (mode == packing.GIT_EXECUTABLE), (target, rel)
        for left_out in ("unit_tests/", "tools/", "tests/", ".ci/", "Makefile", "requirements.txt"):
            assert not [n for n in names if n == left_out or n.startswith(left_out)], left_out


def test_a_base_without_wheels_for_every_pin_fails_the_build(tmp_path):
    # Python 3.99 has no rpds-py or PyYAML wheels: nothing falls back to a source build.
    config = yaml.safe_load((build_charm.REPO / "charmcraft.yaml").read_text(encoding="utf-8"))
    target = build_charm.targets(config, ["ubuntu@24.04:amd64"])[0]._replace(python="3.99.0")
    with pytest.raises(build_charm.BuildError, match="pip found no cp399 x86_64 wheels"):
        build_charm.build(target, tmp_path / "out", tmp_path / "work")
    assert not list((tmp_path / "out").glob("*.charm"))


def test_a_requirement_left_out_of_the_venv_is_found_as_pip_check_would(made_charms, tmp_path):
    target, charm_file = next(iter(made_charms.items()))
    with zipfile.ZipFile(charm_file) as archive:
        archive.extractall(tmp_path / "charm", [n for n in archive.namelist() if n.startswith("venv/")])
    venv = tmp_path / "charm" / "venv"
    assert build_charm.unmet(venv, target) == []
    for gone in venv.glob("attrs*"):
        shutil.rmtree(gone)
    problems = build_charm.unmet(venv, target)
    assert problems and all(" requires attrs" in p and p.endswith("not installed") for p in problems)


def test_an_unknown_platform_is_refused():
    config = yaml.safe_load(io.StringIO("platforms: {ubuntu@24.04:amd64: }"))
    with pytest.raises(build_charm.BuildError, match="not a platform of charmcraft.yaml: ubuntu@26.04"):
        build_charm.targets(config, ["ubuntu@26.04:amd64"])
    assert os.path.basename(build_charm.targets(config)[0].file_name(CHARM)) == (
        f"{CHARM}_ubuntu@24.04-amd64.charm")


# -- charmcraft analyse's pydeps result, counted (no pack needed) ----------------------------------

def flat_charm(tmp_path, versions=(("cosl", "0.0.55"), ("pydantic", "2.11.7"))):
    """A charm directory as the charm plugin lays it out: lib/charms, venv/ = site-packages."""
    charm = tmp_path / "charm"
    shutil.copytree(build_charm.REPO / "lib", charm / "lib")
    for name, version in versions:
        info = charm / "venv" / f"{name}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (charm / "venv").mkdir(exist_ok=True)
    return charm


def test_the_pydeps_linter_is_fatal_on_a_flat_venv_here_as_under_charmcraft(tmp_path):
    """charmcraft 4.5.0's analyse says pydeps ``fatal``; the build's own run said ``unknown``."""
    results = {r.name: r for r in build_charm.lint(flat_charm(tmp_path), directory=True)}
    assert (results["pydeps"].result, results["pydeps"].text) == ("fatal", build_charm.PYDEPS_FATAL)


def test_the_pydeps_fatal_is_explained_only_while_every_pydeps_is_met(tmp_path):
    charm = flat_charm(tmp_path)
    results = list(build_charm.lint(charm, directory=True))
    pydeps = [r for r in results if r.name == "pydeps"]
    assert len(build_charm.judge(pydeps, charm, "x.charm")) == 1
    shutil.rmtree(charm / "venv" / "pydantic-2.11.7.dist-info")
    with pytest.raises(build_charm.BuildError, match=r"PYDEPS are not met: pydantic \(not installed"):
        build_charm.judge(pydeps, charm, "x.charm")


def test_any_other_fatal_result_fails_the_build(tmp_path):
    import dataclasses

    other = build_charm.lint(flat_charm(tmp_path), directory=True)
    broken = [dataclasses.replace(r, result="fatal", text="boom") for r in other
              if r.name == "entrypoint"]
    with pytest.raises(build_charm.BuildError, match="entrypoint: fatal"):
        build_charm.judge(broken, tmp_path, "x.charm")


def test_pack_check_says_why_pydeps_is_fatal_on_the_charm_plugins_layout(tmp_path):
    charm = flat_charm(tmp_path)
    note = build_charm.check_pack.pydeps_note(charm, "charm")
    assert note.startswith("venv/ is site-packages itself (charm plugin;")
    assert build_charm.PYDEPS_FATAL in note
    (charm / "venv" / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    assert "can read it" in build_charm.check_pack.pydeps_note(charm, "python")
