"""Host commands and host files at their edges.

apt-get's fallback, dpkg's locale, temporary files, cleanup after failures, and
every command that runs out of time.

The tools are the real ones (dpkg, dpkg-deb) or small stand-ins first on PATH
that record their arguments and environment, as unit_tests/faketools.py does
for systemctl; nothing of the charm's own code is replaced.
"""

import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from unit_tests import debs
from unit_tests.faketools import OPENED
from vgpu import dpkg, driver, files, hostroot, kernel, services
from vgpu.errors import CommandError, HostReadError, InstallError, ResourceInvalidError, ServiceError

REAL_DPKG = shutil.which("dpkg")


def _tool(bindir: Path, name: str, body: str) -> Path:
    bindir.mkdir(exist_ok=True)
    path = bindir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return path


@pytest.fixture
def bindir(tmp_path, monkeypatch) -> Path:
    """A folder first on PATH for stand-in tools."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{os.environ['PATH']}")
    return path


@pytest.fixture(scope="module")
def deb(tmp_path_factory) -> Path:
    return debs.host_driver(tmp_path_factory.mktemp("debs"))


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
    _tool(bindir, "dpkg",
          'case " $* " in *" --install "*) ;; *) exec ' + REAL_DPKG + ' "$@" ;; esac\n'
          f'echo "dpkg LC_ALL=$LC_ALL DEBIAN_FRONTEND=$DEBIAN_FRONTEND $*" >> {log}\n'
          f'cat {problems} >&2\nexit 1\n')
    apt_fails = tmp_path / "apt.fails"
    _tool(bindir, "apt-get",
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
        _tool(bindir, name, f'echo "{name} LC_ALL=$LC_ALL $1" >> {log}\n'
                            f'exec {shutil.which(name)} "$@"\n')
    driver.install(driver.inspect_deb(deb))
    dpkg.compare_versions(debs.OLD, debs.NEW)
    calls = log.read_text().splitlines()
    assert {c.split()[0] for c in calls} == {"dpkg", "dpkg-deb"}
    assert len(calls) >= 5  # architecture, fields, contents, install, compare
    assert [c for c in calls if " LC_ALL=C " not in c] == []
    assert debs.dpkg_query(root) == f"install ok installed {debs.OLD}"


# -- temporary files: beside their target, and gone after a failure --------------------

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


def test_write_atomic_creates_its_temporary_file_in_the_target_directory(tmp_path, moves):
    target = tmp_path / "etc/systemd/system/unit.service"
    with OPENED as opened:
        files.write_atomic(target, "[Unit]\n")
    # Opened by name in the target's directory (its descriptor), then renamed there.
    (written,) = opened.writes
    assert written == Path(written.name)
    assert moves == [(written.name, "unit.service", str(target.parent), str(target.parent))]
    # Hidden and named after its target: nothing reading the directory takes it for a unit,
    # and one left by a crash says what it was.
    assert written.name.startswith(".unit.service.")
    assert target.read_text() == "[Unit]\n"
    assert oct(target.stat().st_mode & 0o777) == "0o644"
    assert os.listdir(target.parent) == ["unit.service"]


def test_the_blacklist_is_written_through_a_file_in_its_own_directory(tmp_path, monkeypatch,
                                                                     bindir, moves):
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv(hostroot.ENV, str(root))
    _tool(bindir, "update-initramfs", "exit 0\n")
    with OPENED as opened:
        assert kernel.ensure_nouveau_blacklisted()
    target = kernel.blacklist_path()
    (written,) = opened.writes
    assert moves == [(written.name, target.name, str(target.parent), str(target.parent))]
    assert os.listdir(target.parent) == [target.name]


def test_a_failed_replace_leaves_no_temporary_file_behind(tmp_path):
    target = tmp_path / "etc" / "unit.service"
    (target / "occupied").mkdir(parents=True)  # a directory where the file belongs
    with pytest.raises(OSError):
        files.write_atomic(target, "[Unit]\n")
    assert os.listdir(target.parent) == ["unit.service"]
    assert os.listdir(target) == ["occupied"]


def test_a_failed_write_leaves_no_temporary_file_behind(tmp_path):
    target = tmp_path / "unit.service"
    with pytest.raises(UnicodeEncodeError):
        files.write_atomic(target, "bad \udcff surrogate")
    assert os.listdir(tmp_path) == []


# -- update-initramfs failing or hanging ----------------------------------------------

@pytest.fixture
def host_root(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv(hostroot.ENV, str(root))
    return root


def test_update_initramfs_failing_silently_still_says_why_and_undoes_the_file(host_root, bindir):
    _tool(bindir, "update-initramfs", "exit 1\n")
    with pytest.raises(InstallError) as error:
        kernel.ensure_nouveau_blacklisted()
    assert str(error.value) == "update-initramfs -u failed: update-initramfs -u exited with status 1"
    target = kernel.blacklist_path()
    assert not target.exists()
    assert os.listdir(target.parent) == []  # no temporary file left either


def test_update_initramfs_failing_on_a_rewrite_puts_the_old_file_back_byte_for_byte(host_root,
                                                                                  bindir):
    old = b"blacklist nouveau\n# \x00\xff an older charm's file, edited by hand\n"
    kernel.blacklist_path().parent.mkdir(parents=True)
    kernel.blacklist_path().write_bytes(old)
    _tool(bindir, "update-initramfs", "exit 1\n")
    with pytest.raises(InstallError):
        kernel.ensure_nouveau_blacklisted()
    assert kernel.blacklist_path().read_bytes() == old


def test_update_initramfs_failing_on_removal_keeps_the_blacklist_byte_for_byte(host_root, bindir):
    _tool(bindir, "update-initramfs", "exit 0\n")
    kernel.ensure_nouveau_blacklisted()
    # Edited by hand since, with bytes that are not text: they come back exactly.
    written = kernel.blacklist_path().read_bytes() + b"# \x00\xff by hand\n"
    kernel.blacklist_path().write_bytes(written)
    _tool(bindir, "update-initramfs", "exit 2\n")
    with pytest.raises(InstallError, match="^update-initramfs -u failed: update-initramfs -u exited "
                                           "with status 2$"):
        kernel.remove_blacklist()
    assert kernel.blacklist_path().read_bytes() == written
    assert os.listdir(kernel.blacklist_path().parent) == [kernel.blacklist_path().name]


# -- every command that runs out of time ------------------------------------------------

HANG = "sleep 300 & wait\n"


def test_update_initramfs_that_hangs_is_stopped_and_the_file_undone(host_root, bindir, monkeypatch):
    _tool(bindir, "update-initramfs", HANG)
    monkeypatch.setattr(kernel, "INITRAMFS_TIMEOUT", 1)
    with pytest.raises(InstallError) as error:
        kernel.ensure_nouveau_blacklisted()
    assert str(error.value) == "update-initramfs -u timed out after 1s and was stopped"
    assert not kernel.blacklist_path().exists()


def test_dpkg_print_architecture_that_hangs_is_reported(bindir, monkeypatch, deb):
    _tool(bindir, "dpkg", HANG)
    monkeypatch.setattr(driver, "ARCH_TIMEOUT", 1)
    with pytest.raises(ResourceInvalidError) as error:
        driver.inspect_deb(deb)
    assert str(error.value) == ("cannot check nvidia-vgpu-software: dpkg --print-architecture "
                                "timed out after 1s and was stopped")


def test_dpkg_deb_that_hangs_is_reported(bindir, monkeypatch, deb):
    _tool(bindir, "dpkg-deb", HANG)
    monkeypatch.setattr(driver, "INSPECT_TIMEOUT", 1)
    with pytest.raises(ResourceInvalidError) as error:
        driver.inspect_deb(deb, arch=debs.machine_arch())
    assert str(error.value) == ("cannot check nvidia-vgpu-software: dpkg-deb --field "
                                "timed out after 1s and was stopped")


def test_dpkg_compare_versions_that_hangs_is_reported(bindir, monkeypatch):
    _tool(bindir, "dpkg", HANG)
    monkeypatch.setattr(dpkg, "COMPARE_TIMEOUT", 1)
    with pytest.raises(CommandError) as error:
        dpkg.compare_versions(debs.OLD, debs.NEW)
    assert str(error.value) == "dpkg --compare-versions timed out after 1s and was stopped"


def test_systemctl_that_hangs_is_reported(bindir, monkeypatch):
    _tool(bindir, "systemctl", HANG)
    monkeypatch.setattr(services, "QUERY_TIMEOUT", 1)
    monkeypatch.setattr(services, "CHANGE_TIMEOUT", 1)
    with pytest.raises(ServiceError) as error:
        services.active(["nvidia-vgpu-mgr"])
    assert str(error.value) == "systemctl is-active nvidia-vgpu-mgr timed out after 1s and was stopped"
    with pytest.raises(ServiceError) as error:
        services.pause(["nvidia-vgpu-mgr"])
    assert "timed out after 1s and was stopped" in str(error.value)


# -- dpkg's answer decides, whatever its exit status ------------------------------------

def test_a_dpkg_error_elsewhere_after_the_driver_installed_is_logged_not_fatal(
        tmp_path, monkeypatch, bindir, deb, caplog):
    # dpkg installs the driver, then fails on another pending package and exits 1.
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    _tool(bindir, "dpkg", f'{REAL_DPKG} "$@" || exit $?\n'
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


def test_a_dpkg_that_says_success_but_installed_nothing_is_not_believed(tmp_path, monkeypatch, bindir,
                                                                       deb):
    root = debs.make_root(tmp_path)
    monkeypatch.setenv(hostroot.ENV, str(root))
    _tool(bindir, "dpkg", f'case "$*" in *--install*) exit 0;; esac\nexec {REAL_DPKG} "$@"\n')
    with pytest.raises(InstallError) as error:
        driver.install(driver.inspect_deb(deb))
    assert str(error.value) == f"dpkg did not install {debs.HOST} {debs.OLD}"


# -- the host root holds every path ----------------------------------------------------

def test_a_host_path_given_with_a_leading_slash_stays_under_the_root(root):
    assert hostroot.path("/etc/modprobe.d", "/x.conf") == root / "etc/modprobe.d/x.conf"
    assert hostroot.text_path("/sys/bus/pci/devices") == str(root / "sys/bus/pci/devices")
    assert hostroot.shown(hostroot.path("/var/lib/dpkg/status")) == "/var/lib/dpkg/status"


def test_without_a_root_set_the_host_is_the_machine_itself(monkeypatch):
    monkeypatch.delenv(hostroot.ENV, raising=False)
    assert hostroot.path("sys/bus/pci/devices") == Path("/sys/bus/pci/devices")
    assert hostroot.text_path("sys/bus/pci/devices") == "/sys/bus/pci/devices"
    assert hostroot.is_real_root()


def test_a_path_outside_the_root_is_shown_as_it_is(root):
    assert hostroot.shown("/var/lib/juju/agents/unit-x/resources/driver.deb") == \
        "/var/lib/juju/agents/unit-x/resources/driver.deb"


def test_an_unreadable_path_is_named_in_at_most_100_characters(root):
    deep = root / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    with pytest.raises(HostReadError) as error:
        hostroot.read_text(deep)
    shown = str(error.value).removeprefix("cannot read ").removesuffix(": Is a directory")
    assert shown == f"/{'d' * 60}/{'e' * 35}..." and len(shown) == 100


def test_an_error_without_a_reason_is_named_by_its_kind(root):
    error = hostroot.unreadable(root / "proc/cmdline", TimeoutError())
    assert str(error) == "cannot read /proc/cmdline: TimeoutError"


def test_a_file_that_reports_no_size_is_read_whole_past_64_kib(root):
    # /proc files report a size of 0 and are read in pieces: a FIFO behaves the same way.
    fifo = root / "proc/modules"
    fifo.parent.mkdir(parents=True)
    os.mkfifo(fifo)
    content = b"".join(f"module_{n} 16384 0 - Live 0x0\n".encode() for n in range(5000))
    assert len(content) > 2 * 65536

    def write():
        with open(fifo, "wb") as handle:
            for start in range(0, len(content), 4096):
                handle.write(content[start:start + 4096])
                handle.flush()

    writer = threading.Thread(target=write)
    writer.start()
    try:
        assert hostroot.read_bytes(fifo) == content
    finally:
        writer.join(timeout=10)
