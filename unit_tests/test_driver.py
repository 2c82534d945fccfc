"""vgpu.driver against real .deb files and a real dpkg working on an isolated root."""

import os
import shutil
import subprocess
import types

import pytest

from unit_tests import debs
from unit_tests.faketools import HANG, running, shell_tool
from vgpu import dpkg, driver, hostroot
from vgpu.errors import InstallError, ResourceInvalidError, ResourceMissingError

ARCH = debs.machine_arch()
REAL_DPKG = shutil.which("dpkg")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every package the tests need, built once."""
    d = tmp_path_factory.mktemp("debs")
    return {
        "old": debs.host_driver(d),
        "new": debs.newer_host_driver(d, vgpud=False),
        "no_vgpud": debs.host_driver(d, vgpud=False),
        "guest": debs.guest_driver(d),
        "foreign": debs.foreign_host_driver(d),
        "all": debs.arch_all_host_driver(d),
        "hello": debs.unrelated(d),
        "lookalike": debs.unrelated(d, "nvidia-vgpu-ubuntu-beta"),
        "depends": debs.unmet_depends(d),
        "predepends": debs.unmet_pre_depends(d),
        "garbage": debs.garbage(d),
        "empty": debs.empty(d),
        "550": debs.older_branch(d),
        "hollow": debs.build(d, debs.HOST, debs.OLD, ARCH, {"usr/share/doc/x/README": "x\n"}),
    }


@pytest.fixture(scope="module")
def deb(built):
    """The host driver package, the one most tests install."""
    return built["old"]


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A fresh host root with an empty dpkg database; apt-get on PATH logs any call."""
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    bindir = tmp_path / "bin"
    bindir.mkdir()
    apt = bindir / "apt-get"
    apt.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/apt.log\n')
    apt.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    return root


# -- inspect_deb -----------------------------------------------------------------

def test_inspect_host_driver(built):
    info = driver.inspect_deb(built["old"])
    assert info == driver.DebInfo(package="nvidia-vgpu-ubuntu-570", version="570.158.02",
                                  path=built["old"])
    assert driver.shipped_services(info) == ("nvidia-vgpu-mgr", "nvidia-vgpud")


def test_inspect_host_driver_without_vgpud(built):
    info = driver.inspect_deb(str(built["no_vgpud"]))
    assert driver.shipped_services(info) == ("nvidia-vgpu-mgr",)
    assert info.path == built["no_vgpud"]


def test_a_lookalike_without_the_vgpu_manager_is_refused_before_installing(built, root):
    info = driver.inspect_deb(built["hollow"])  # the name and fields look right
    with pytest.raises(ResourceInvalidError, match="ships no nvidia-vgpu-mgr.service; need NVIDIA's "
                                                   "vGPU Manager package nvidia-vgpu-ubuntu-<branch>"):
        driver.install(info)
    assert debs.dpkg_query(root) == ""


@pytest.mark.parametrize("make", [
    lambda d: None,
    lambda d: d / "absent.deb",
    lambda d: debs.empty(d),
])
def test_missing_resource_says_how_to_attach(tmp_path, make):
    with pytest.raises(ResourceMissingError) as e:
        driver.inspect_deb(make(tmp_path))
    msg = str(e.value)
    assert "nvidia-vgpu-software" in msg
    assert ("juju attach-resource nova-compute-nvidia-vgpu "
            f"nvidia-vgpu-software=./nvidia-vgpu-ubuntu-<branch>_<version>_{ARCH}.deb") in msg
    assert "\n" not in msg


def test_garbage_is_not_a_debian_package(built):
    with pytest.raises(ResourceInvalidError, match="is not a Debian package; need nvidia-vgpu-ubuntu-") as e:
        driver.inspect_deb(built["garbage"])
    assert "\n" not in str(e.value)


def test_guest_driver_is_refused_as_such(built):
    with pytest.raises(ResourceInvalidError) as e:
        driver.inspect_deb(built["guest"])
    msg = str(e.value)
    assert 'guest driver "nvidia-linux-grid-570"' in msg
    assert "belongs in VMs" in msg
    assert "nvidia-vgpu-ubuntu-570" in msg


@pytest.mark.parametrize("key,name", [("hello", '"hello"'),
                                      ("lookalike", '"nvidia-vgpu-ubuntu-beta"')])
def test_other_packages_are_refused(built, key, name):
    with pytest.raises(ResourceInvalidError, match=f"is package {name}; need nvidia-vgpu-ubuntu-"):
        driver.inspect_deb(built[key])


@pytest.mark.parametrize("key", ["foreign", "all"])
def test_wrong_architecture_is_refused(built, key):
    with pytest.raises(ResourceInvalidError) as e:
        driver.inspect_deb(built[key])
    foreign = debs.other_arch() if key == "foreign" else "all"
    assert f'architecture "{foreign}"; this machine needs "{ARCH}"' in str(e.value)


def test_architecture_is_compared_with_the_one_given(built):
    info = driver.inspect_deb(built["foreign"], arch=debs.other_arch())
    assert (info.package, info.path) == (debs.HOST, built["foreign"])
    with pytest.raises(ResourceInvalidError, match="this machine needs"):
        driver.inspect_deb(built["old"], arch=debs.other_arch())


# -- install / installed_driver / services_of ------------------------------------

def test_install_into_isolated_root(built, root, tmp_path):
    assert driver.installed_driver() is None
    driver.install(driver.inspect_deb(built["old"]))

    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    pkg = driver.installed_driver()
    assert (pkg.name, pkg.version, pkg.installed, pkg.state) == (
        "nvidia-vgpu-ubuntu-570", "570.158.02", True, "installed")
    assert (root / "lib/systemd/system/nvidia-vgpu-mgr.service").is_file()
    assert (root / "usr/share/nvidia/vgpu/vgpuConfig.xml").read_text() == "<vgpuconfig/>\n"
    assert (root / "usr/lib/nvidia/sriov-manage").is_file()
    assert driver.services_of("nvidia-vgpu-ubuntu-570") == ("nvidia-vgpu-mgr", "nvidia-vgpud")
    assert not (tmp_path / "apt.log").exists()


def test_upgrade_to_newer_version(built, root):
    driver.install(driver.inspect_deb(built["old"]))
    driver.install(driver.inspect_deb(built["new"]))

    assert debs.dpkg_query(root) == "install ok installed 570.172.08"
    assert driver.installed_driver().version == "570.172.08"
    # the newer package has no nvidia-vgpud: dpkg removed it and the answer follows dpkg
    assert not (root / "lib/systemd/system/nvidia-vgpud.service").exists()
    assert driver.services_of("nvidia-vgpu-ubuntu-570") == ("nvidia-vgpu-mgr",)


def test_unmet_depends_leaves_unpacked_and_raises(built, root, tmp_path):
    driver.install(driver.inspect_deb(built["old"]))
    with pytest.raises(InstallError) as e:
        driver.install(driver.inspect_deb(built["depends"]))
    msg = str(e.value)
    assert msg.startswith("dpkg left nvidia-vgpu-ubuntu-570 570.172.08 unpacked: ")
    # dpkg's cause, which names the missing package, not its closing summary
    assert debs.MISSING_DEP in msg and "\n" not in msg
    assert "Errors were encountered" not in msg

    assert debs.dpkg_query(root) == "install ok unpacked 570.172.08"
    pkg = driver.installed_driver()
    assert (pkg.version, pkg.installed, pkg.state) == ("570.172.08", False, "unpacked")
    # not the real root: apt-get is never asked to fix the fixture tree
    assert not (tmp_path / "apt.log").exists()


def test_refused_upgrade_keeps_previous_version(built, root):
    driver.install(driver.inspect_deb(built["old"]))
    with pytest.raises(InstallError) as e:
        driver.install(driver.inspect_deb(built["predepends"]))
    msg = str(e.value)
    assert msg.startswith(
        "dpkg did not install nvidia-vgpu-ubuntu-570 570.172.08 (570.158.02 is installed): ")
    assert debs.MISSING_DEP in msg and "\n" not in msg

    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    assert driver.installed_driver().version == "570.158.02"
    assert driver.installed_driver().installed


def test_refused_first_install_reports_nothing_installed(built, root):
    with pytest.raises(InstallError, match=r"^dpkg did not install nvidia-vgpu-ubuntu-570 "
                                           r"570\.172\.08: .*" + debs.MISSING_DEP):
        driver.install(driver.inspect_deb(built["predepends"]))
    assert debs.dpkg_query(root) == "install ok not-installed"  # selected, nothing unpacked
    assert driver.installed_driver() is None


def test_install_fails_when_the_file_is_gone(built, root, tmp_path):
    info = driver.inspect_deb(built["old"])
    gone = tmp_path / "gone.deb"
    # Its contents are read again right before dpkg runs: a vanished file stops there.
    with pytest.raises(ResourceInvalidError):
        driver.install(info._replace(path=gone))
    assert driver.installed_driver() is None


def test_a_new_branch_replaces_the_old_one(built, root):
    driver.install(driver.inspect_deb(built["550"]))
    assert debs.dpkg_query(root, "nvidia-vgpu-ubuntu-550") == "install ok installed 550.127.06"
    driver.install(driver.inspect_deb(built["old"]))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"
    assert not debs.dpkg_query(root, "nvidia-vgpu-ubuntu-550").endswith("installed 550.127.06")
    assert driver.installed_driver().name == "nvidia-vgpu-ubuntu-570"
    assert (root / "lib/systemd/system/nvidia-vgpu-mgr.service").exists()


def test_services_of_reads_multiarch_list(root):
    info = root / "var/lib/dpkg/info"
    (info / f"nvidia-vgpu-ubuntu-570:{ARCH}.list").write_text(
        "/.\n/usr\n/usr/lib/systemd/system/nvidia-vgpud.service\n"
        "/usr/lib/systemd/system/nvidia-vgpu-mgr.service\n/etc/nvidia-vgpud.service\n")
    assert driver.services_of("nvidia-vgpu-ubuntu-570") == ("nvidia-vgpu-mgr", "nvidia-vgpud")
    assert driver.services_of("nvidia-vgpu-ubuntu-550") == ()


def test_services_of_lists_dpkg_s_info_directory_only_without_the_plain_list(root, monkeypatch):
    import os
    info = root / "var/lib/dpkg/info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "nvidia-vgpu-ubuntu-570.list").write_text("/usr/lib/systemd/system/nvidia-vgpud.service\n")
    (info / f"nvidia-vgpu-ubuntu-570:{ARCH}.list").write_text(
        "/usr/lib/systemd/system/nvidia-vgpu-mgr.service\n")
    listed = []
    real = os.scandir
    monkeypatch.setattr(os, "scandir", lambda path=".": listed.append(str(path)) or real(path))
    # A server's info directory holds thousands of files: the plain list answers first.
    assert driver.services_of("nvidia-vgpu-ubuntu-570") == ("nvidia-vgpud",)
    assert [p for p in listed if p.startswith(str(info))] == []
    (info / "nvidia-vgpu-ubuntu-570.list").unlink()
    assert driver.services_of("nvidia-vgpu-ubuntu-570") == ("nvidia-vgpu-mgr",)
    assert [p for p in listed if p.startswith(str(info))] == [str(info)]


def test_installed_driver_picks_host_driver_from_given_packages():
    def pkg(name, status="install ok installed", version="1"):
        return dpkg.Package(name, version, "amd64", status)

    pkgs = {p.name: p for p in [
        pkg("nvidia-vgpu-ubuntu-550", "install ok half-installed"),
        pkg("nvidia-vgpu-ubuntu-570", version="570.158.02"),
        pkg("nvidia-vgpu-ubuntu-common"),
        pkg("nvidia-linux-grid-570"),
    ]}
    assert driver.installed_driver(pkgs).version == "570.158.02"
    del pkgs["nvidia-vgpu-ubuntu-570"]
    half = driver.installed_driver(pkgs)
    assert (half.name, half.state, half.installed) == ("nvidia-vgpu-ubuntu-550", "half-installed", False)
    assert driver.installed_driver({"x": pkg("nvidia-linux-grid-570")}) is None
    assert driver.installed_driver({}) is None


def test_an_installed_branch_wins_over_a_half_installed_higher_one():
    pkgs = {
        "nvidia-vgpu-ubuntu-550": dpkg.Package("nvidia-vgpu-ubuntu-550", "550.127.06", "amd64",
                                               "install ok installed"),
        "nvidia-vgpu-ubuntu-570": dpkg.Package("nvidia-vgpu-ubuntu-570", "570.158.02", "amd64",
                                               "install ok unpacked"),
    }
    assert driver.installed_driver(pkgs).name == "nvidia-vgpu-ubuntu-550"


def test_a_driver_removed_but_not_purged_counts_as_absent(root):
    from unit_tests.fakehost import FakeHost
    FakeHost(root).dpkg_status({"nvidia-vgpu-ubuntu-570": "570.158.02"},
                               states={"nvidia-vgpu-ubuntu-570": "config-files"})
    assert driver.installed_driver() is None


# -- apt-get -f install, on the real root only -------------------------------------

DEPENDENCY_PROBLEMS = (
    "dpkg: dependency problems prevent configuration of nvidia-vgpu-ubuntu-570:\n"
    " nvidia-vgpu-ubuntu-570 depends on dkms; however:\n"
    "  Package dkms is not installed.\n\n"
    "dpkg: error processing package nvidia-vgpu-ubuntu-570 (--install):\n"
    " dependency problems - leaving unconfigured\n"
    "Errors were encountered while processing:\n nvidia-vgpu-ubuntu-570\n")


@pytest.fixture
def real_root(tmp_path, monkeypatch, bindir):
    """The charm working on this machine's own root (no VGPU_HOST_ROOT).

    Only reads reach the real system: ``dpkg --install`` is a stand-in that fails as
    dpkg does with unmet dependencies, ``apt-get`` a stand-in that records its call.
    Everything else dpkg is asked (--print-architecture) is the real dpkg.
    """
    monkeypatch.delenv(hostroot.ENV, raising=False)
    monkeypatch.setenv("DEBIAN_FRONTEND", "readline")  # what the charm must override
    assert hostroot.is_real_root()
    if driver.installed_driver() is not None:  # pragma: no cover - a vGPU host running the tests
        pytest.skip("this machine has a vGPU host driver installed")
    log = tmp_path / "calls.log"
    problems = tmp_path / "problems.txt"
    problems.write_text(DEPENDENCY_PROBLEMS)
    shell_tool(bindir, "dpkg",
               'case " $* " in *" --install "*) ;; *) exec ' + REAL_DPKG + ' "$@" ;; esac\n'
               f'echo "dpkg LC_ALL=$LC_ALL DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> {log}\n'
               f'cat {problems} >&2\nexit 1\n')
    apt_fails = tmp_path / "apt.fails"
    shell_tool(bindir, "apt-get",
               f'echo "apt-get LC_ALL=$LC_ALL DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> {log}\n'
               f'if [ -e {apt_fails} ]; then\n'
               '  echo "E: Unable to correct problems, you have held broken packages." >&2; exit 100\n'
               'fi\n')

    class Real:
        def calls(self):
            return log.read_text().splitlines() if log.exists() else []

        def apt_fails(self):
            apt_fails.touch()

        def other_failure(self, text):
            problems.write_text(text)
    return Real()


def test_dependency_problems_on_the_real_root_run_apt_get_fix_broken(real_root, deb):
    info = driver.inspect_deb(deb)
    with pytest.raises(InstallError) as error:
        driver.install(info)
    calls = real_root.calls()
    assert [c.split()[0] for c in calls] == ["dpkg", "apt-get"]
    assert calls[1] == ("apt-get LC_ALL=C DEBIAN_FRONTEND=noninteractive --fix-broken install --yes "
                        "--option=Dpkg::Options::=--force-confdef "
                        "--option=Dpkg::Options::=--force-confold")
    # apt-get ran and succeeded, yet dpkg's answer is what counts: this machine has no
    # such package, so dpkg's own cause is reported.
    assert str(error.value) == (f"dpkg did not install {debs.HOST} {debs.OLD}: {debs.HOST} depends "
                                "on dkms; however: Package dkms is not installed. (dependency "
                                f"problems prevent configuration of {debs.HOST})")


def test_when_apt_get_cannot_fix_it_its_cause_is_shown(real_root, deb):
    real_root.apt_fails()
    with pytest.raises(InstallError) as error:
        driver.install(driver.inspect_deb(deb))
    assert str(error.value) == (f"dpkg did not install {debs.HOST} {debs.OLD}: "
                                "Unable to correct problems, you have held broken packages.")


def test_other_dpkg_failures_on_the_real_root_do_not_run_apt_get(real_root, deb):
    real_root.other_failure("dpkg: error: requested operation requires superuser privilege\n")
    with pytest.raises(InstallError) as error:
        driver.install(driver.inspect_deb(deb))
    assert [c.split()[0] for c in real_root.calls()] == ["dpkg"]
    assert str(error.value) == (f"dpkg did not install {debs.HOST} {debs.OLD}: "
                                "requested operation requires superuser privilege")


# -- dpkg reads the same in every locale -------------------------------------------

def test_every_dpkg_and_dpkg_deb_call_runs_in_the_c_locale(tmp_path, monkeypatch, bindir, deb):
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    monkeypatch.setenv("LC_ALL", "de_DE.UTF-8")
    monkeypatch.setenv("LANG", "de_DE.UTF-8")
    log = tmp_path / "env.log"
    for name in ("dpkg", "dpkg-deb"):
        shell_tool(bindir, name, f'echo "{name} LC_ALL=$LC_ALL $1" >> {log}\n'
                                 f'exec {shutil.which(name)} "$@"\n')
    driver.install(driver.inspect_deb(deb))
    dpkg.compare_versions(debs.OLD, debs.NEW)
    calls = log.read_text().splitlines()
    assert {c.split()[0] for c in calls} == {"dpkg", "dpkg-deb"}
    assert len(calls) >= 5  # architecture, fields, contents, install, compare
    assert [c for c in calls if " LC_ALL=C " not in c] == []
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"


# -- dpkg's answer decides, whatever its exit status ------------------------------------

def test_a_dpkg_error_elsewhere_after_the_driver_installed_is_logged_not_fatal(
        tmp_path, monkeypatch, bindir, deb, caplog):
    # dpkg installs the driver, then fails on another pending package and exits 1.
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    shell_tool(bindir, "dpkg", f'{REAL_DPKG} "$@" || exit $?\n'
                               'case "$*" in *--install*)\n'
                               '  echo "dpkg: error processing package libfoo (--configure):" >&2\n'
                               '  echo " installed libfoo package post-installation script subprocess '
                               'returned error exit status 1" >&2\n'
                               '  exit 1;;\nesac\n')
    with caplog.at_level("INFO"):
        driver.install(driver.inspect_deb(deb))
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"
    assert ("WARNING", "dpkg reported installed libfoo package post-installation script subprocess "
                       "returned error exit status 1 (error processing package libfoo (--configure)) "
                       f"but {debs.HOST} {debs.OLD} is installed") in [
        (r.levelname, r.getMessage()) for r in caplog.records]


def test_another_branch_that_dpkg_cannot_remove_stops_the_install_naming_it(
        tmp_path, monkeypatch, deb, caplog):
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    older = "nvidia-vgpu-ubuntu-550"
    driver.install(driver.inspect_deb(debs.older_branch(tmp_path)))
    # A package of the operator's that needs the older branch: dpkg will not remove it.
    tools = debs.build(tmp_path, "site-vgpu-tools", "1.0", debs.machine_arch(),
                       {"usr/share/doc/site-vgpu-tools/README": "x\n"}, depends=older)
    subprocess.run([REAL_DPKG, f"--root={root}", f"--admindir={root}/var/lib/dpkg", "--install",
                    str(tools)], check=True, capture_output=True)
    with caplog.at_level("INFO"), pytest.raises(InstallError) as error:
        driver.install(driver.inspect_deb(deb))
    assert str(error.value).startswith(
        f"dpkg could not remove {older} to install {debs.HOST}: ")
    assert "site-vgpu-tools" in str(error.value)
    # Still installed (dpkg marks it for removal only), and the new branch is not unpacked.
    assert debs.dpkg_query(root, older).endswith(" ok installed 550.127.06")
    assert debs.dpkg_query(root) == ""
    assert ("INFO", f"removing {older} before installing {debs.HOST}") in [
        (r.levelname, r.getMessage()) for r in caplog.records]


def test_an_install_budget_spent_on_removing_another_branch_runs_no_dpkg_install(
        tmp_path, monkeypatch, bindir, deb):
    # Removing the other branch ends with less than a second left of the install budget:
    # dpkg --install is not started (it could only be cut short), and the error says why.
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    older = "nvidia-vgpu-ubuntu-550"
    driver.install(driver.inspect_deb(debs.older_branch(tmp_path)))
    log = tmp_path / "dpkg.log"
    shell_tool(bindir, "dpkg", f'case "$*" in *--install*) echo install >> {log};; esac\n'
                               f'exec {REAL_DPKG} "$@"\n')
    # The install's clock: the budget starts, the removal starts at once and takes all but
    # half a second of it.
    readings = iter([0.0, 0.0, driver.INSTALL_BUDGET - 0.5])
    monkeypatch.setattr(driver, "time", types.SimpleNamespace(monotonic=lambda: next(readings)))
    with pytest.raises(InstallError) as error:
        driver.install(driver.inspect_deb(deb))
    assert str(error.value) == (f"dpkg did not install {debs.HOST} {debs.OLD}: "
                                f"no time left of the {driver.INSTALL_BUDGET}s install budget")
    assert not log.exists()  # dpkg --install never ran
    assert debs.dpkg_query(root, older) == ""  # the removal itself was done


def test_a_dpkg_that_says_success_but_installed_nothing_is_not_believed(tmp_path, monkeypatch, bindir,
                                                                       deb):
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    shell_tool(bindir, "dpkg", f'case "$*" in *--install*) exit 0;; esac\nexec {REAL_DPKG} "$@"\n')
    with pytest.raises(InstallError) as error:
        driver.install(driver.inspect_deb(deb))
    assert str(error.value) == f"dpkg did not install {debs.HOST} {debs.OLD}"


# -- dpkg and dpkg-deb that hang -------------------------------------------------

def test_dpkg_print_architecture_that_hangs_is_reported(bindir, monkeypatch, deb):
    shell_tool(bindir, "dpkg", HANG)
    monkeypatch.setattr(driver, "ARCH_TIMEOUT", 1)
    with pytest.raises(ResourceInvalidError) as error:
        driver.inspect_deb(deb)
    assert str(error.value) == ("cannot check nvidia-vgpu-software: dpkg --print-architecture "
                                "timed out after 1s and was stopped")


def test_dpkg_deb_that_hangs_is_reported(bindir, monkeypatch, deb):
    shell_tool(bindir, "dpkg-deb", HANG)
    monkeypatch.setattr(driver, "INSPECT_TIMEOUT", 1)
    with pytest.raises(ResourceInvalidError) as error:
        driver.inspect_deb(deb, arch=debs.machine_arch())
    assert str(error.value) == ("cannot check nvidia-vgpu-software: dpkg-deb --field "
                                "timed out after 1s and was stopped")


# -- dpkg under faults -------------------------------------------------------------

def test_a_held_dpkg_lock_is_reported_cause_first_and_nothing_runs_beside_it(built, root):
    """Another dpkg (or apt) at work: ours does not run beside it, and the unit says why."""
    import fcntl
    with open(root / "var/lib/dpkg/lock-frontend", "w") as lock:
        fcntl.lockf(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # what a running dpkg holds
        with pytest.raises(InstallError) as e:
            driver.install(driver.inspect_deb(built["old"]))
    msg = str(e.value)
    assert msg.startswith("dpkg did not install nvidia-vgpu-ubuntu-570 570.158.02: ")
    cause = msg.split(": ", 1)[1]
    assert "lock" in cause and str(os.getpid()) in cause  # names the holder
    assert "wiki" not in msg and "\n" not in msg  # dpkg's advice after the cause is dropped
    assert debs.dpkg_query(root) == ""
    # once the lock is free, the next try installs
    driver.install(driver.inspect_deb(built["old"]))
    assert debs.dpkg_query(root) == "install ok installed 570.158.02"


def test_a_dpkg_that_runs_out_of_time_is_ended_with_its_maintainer_scripts(built, root, tmp_path,
                                                                           monkeypatch):
    """What dpkg started (a postinst) ends with it; the next hook cannot run a second one."""
    pids = tmp_path / "postinst.pid"
    wrapper = tmp_path / "bin" / "dpkg"
    # The real dpkg, after a stand-in for a slow maintainer script that it started.
    real = shutil.which("dpkg")
    wrapper.write_text(f"#!/bin/sh\ncase \"$*\" in *--install*) ;; *) exec {real} \"$@\" ;; esac\n"
                       f"sleep 300 &\necho $! > {pids}\nsleep 300\n")
    wrapper.chmod(0o755)
    monkeypatch.setattr(driver, "INSTALL_BUDGET", 2)
    with pytest.raises(InstallError, match=r"dpkg timed out after [12]s and was stopped"):
        driver.install(driver.inspect_deb(built["old"]))
    child = int(pids.read_text())
    assert not running(child)


def test_the_install_hook_has_a_bounded_worst_case():
    from vgpu import kernel, services
    worst = (driver.ARCH_TIMEOUT + 2 * driver.INSPECT_TIMEOUT + driver.INSTALL_BUDGET
             + kernel.INITRAMFS_TIMEOUT + 4 * services.QUERY_TIMEOUT)
    assert worst < 20 * 60


def test_a_half_configured_driver_is_finished_by_installing_the_same_package(built, root):
    driver.install(driver.inspect_deb(built["old"]))
    # dpkg killed while configuring the upgrade: its journal says so, status does not
    (root / "var/lib/dpkg/updates/0000").write_text(
        f"Package: {debs.HOST}\nStatus: install ok half-configured\nArchitecture: {ARCH}\n"
        f"Version: {debs.OLD}\nMaintainer: Test <test@example.com>\nDescription: test\n")
    pkg = driver.installed_driver()
    assert (pkg.version, pkg.state, pkg.installed) == (debs.OLD, "half-configured", False)
    driver.install(driver.inspect_deb(built["old"]))
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"
    assert driver.installed_driver().installed


def test_an_unreadable_file_list_names_the_path(root):
    from vgpu.errors import HostReadError
    (root / "var/lib/dpkg/info/nvidia-vgpu-ubuntu-570.list").mkdir()
    with pytest.raises(HostReadError, match="^cannot read /var/lib/dpkg/info/nvidia-vgpu-ubuntu-570.list: "
                                            "Is a directory$"):
        driver.services_of("nvidia-vgpu-ubuntu-570")


def test_a_file_list_with_hostile_bytes_still_reads(root):
    (root / "var/lib/dpkg/info/nvidia-vgpu-ubuntu-570.list").write_bytes(
        b"/.\n/usr/\xff\x00\n/lib/systemd/system/nvidia-vgpu-mgr.service\n")
    assert driver.services_of("nvidia-vgpu-ubuntu-570") == ("nvidia-vgpu-mgr",)
