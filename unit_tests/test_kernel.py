"""vgpu.kernel: the nouveau blacklist, with a fake update-initramfs on PATH."""

import os
import stat

import pytest

from unit_tests import upstream as upstream_fixture
from unit_tests.faketools import HANG, OPENED, shell_tool
from vgpu import hostroot, kernel
from vgpu.errors import InstallError

TARGET = "etc/modprobe.d/nvidia-vgpu-blacklist-nouveau.conf"


@pytest.fixture
def root(tmp_path, monkeypatch):
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv(hostroot.ENV, str(root))
    return root


@pytest.fixture
def initramfs(tmp_path, monkeypatch):
    """A fake update-initramfs first on PATH; returns a reader of its calls.

    It fails when ``<tmp>/initramfs.fail`` exists.
    """
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "initramfs.log"
    fail = tmp_path / "initramfs.fail"
    script = bindir / "update-initramfs"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {log}\n'
        f'if [ -e {fail} ]; then echo "E: mkinitramfs failure cpio 141" >&2; exit 1; fi\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")

    def calls():
        return log.read_text().splitlines() if log.exists() else []
    calls.fail = fail
    return calls


def test_template_renders_blacklist():
    text = kernel.render_blacklist()
    lines = text.splitlines()
    assert lines[0].startswith("# Managed by the nova-compute-nvidia-vgpu charm")
    assert "blacklist nouveau" in lines
    assert "options nouveau modeset=0" in lines
    assert "$" not in text


def test_first_write_refreshes_initramfs_once(root, initramfs):
    assert kernel.ensure_nouveau_blacklisted() is True
    path = root / TARGET
    assert path.read_text() == kernel.render_blacklist()
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert initramfs() == ["-u"]
    assert os.listdir(path.parent) == [path.name]  # no temp file left behind


def test_unchanged_file_is_left_alone(root, initramfs):
    kernel.ensure_nouveau_blacklisted()
    mtime = (root / TARGET).stat().st_mtime_ns
    assert kernel.ensure_nouveau_blacklisted() is False
    assert initramfs() == ["-u"]
    assert (root / TARGET).stat().st_mtime_ns == mtime


def test_edited_file_is_restored(root, initramfs):
    kernel.ensure_nouveau_blacklisted()
    (root / TARGET).write_text("# someone's edit\n")
    assert kernel.ensure_nouveau_blacklisted() is True
    assert (root / TARGET).read_text() == kernel.render_blacklist()
    assert initramfs() == ["-u", "-u"]


def test_failed_refresh_undoes_the_write_so_a_retry_repeats_it(root, initramfs):
    initramfs.fail.touch()
    with pytest.raises(InstallError, match="^update-initramfs -u failed: mkinitramfs failure cpio 141$"):
        kernel.ensure_nouveau_blacklisted()
    assert not (root / TARGET).exists()

    initramfs.fail.unlink()
    assert kernel.ensure_nouveau_blacklisted() is True
    assert (root / TARGET).exists()
    assert initramfs() == ["-u", "-u"]


def test_failed_refresh_restores_previous_content(root, initramfs):
    (root / TARGET).parent.mkdir(parents=True)
    (root / TARGET).write_text("blacklist nouveau\n")
    initramfs.fail.touch()
    with pytest.raises(InstallError):
        kernel.ensure_nouveau_blacklisted()
    assert (root / TARGET).read_text() == "blacklist nouveau\n"


def test_missing_update_initramfs(root, tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(InstallError, match="update-initramfs not found; install initramfs-tools"):
        kernel.ensure_nouveau_blacklisted()
    assert not (root / TARGET).exists()


def test_remove_blacklist(root, initramfs):
    assert kernel.remove_blacklist() is False
    assert initramfs() == []

    kernel.ensure_nouveau_blacklisted()
    assert kernel.remove_blacklist() is True
    assert not (root / TARGET).exists()
    assert initramfs() == ["-u", "-u"]


def test_remove_blacklist_keeps_file_when_refresh_fails(root, initramfs):
    kernel.ensure_nouveau_blacklisted()
    initramfs.fail.touch()
    with pytest.raises(InstallError):
        kernel.remove_blacklist()
    assert (root / TARGET).read_text() == kernel.render_blacklist()


# -- the blacklist through a temporary file; update-initramfs failing or hanging ----------

def test_the_blacklist_is_written_through_a_file_in_its_own_directory(tmp_path, monkeypatch,
                                                                     bindir, moves):
    root = tmp_path / "root"
    root.mkdir()
    monkeypatch.setenv(hostroot.ENV, str(root))
    shell_tool(bindir, "update-initramfs", "exit 0\n")
    with OPENED as opened:
        assert kernel.ensure_nouveau_blacklisted()
    target = kernel.blacklist_path()
    (written,) = opened.writes
    assert moves == [(written.name, target.name, str(target.parent), str(target.parent))]
    assert os.listdir(target.parent) == [target.name]


def test_update_initramfs_failing_silently_still_says_why_and_undoes_the_file(root, bindir):
    shell_tool(bindir, "update-initramfs", "exit 1\n")
    with pytest.raises(InstallError) as error:
        kernel.ensure_nouveau_blacklisted()
    assert str(error.value) == "update-initramfs -u failed: update-initramfs -u exited with status 1"
    target = kernel.blacklist_path()
    assert not target.exists()
    assert os.listdir(target.parent) == []  # no temporary file left either


def test_update_initramfs_failing_on_a_rewrite_puts_the_old_file_back_byte_for_byte(root, bindir):
    old = b"blacklist nouveau\n# \x00\xff an older charm's file, edited by hand\n"
    kernel.blacklist_path().parent.mkdir(parents=True)
    kernel.blacklist_path().write_bytes(old)
    shell_tool(bindir, "update-initramfs", "exit 1\n")
    with pytest.raises(InstallError):
        kernel.ensure_nouveau_blacklisted()
    assert kernel.blacklist_path().read_bytes() == old


def test_update_initramfs_failing_on_removal_keeps_the_blacklist_byte_for_byte(root, bindir):
    shell_tool(bindir, "update-initramfs", "exit 0\n")
    kernel.ensure_nouveau_blacklisted()
    # Edited by hand since, with bytes that are not text: they come back exactly.
    written = kernel.blacklist_path().read_bytes() + b"# \x00\xff by hand\n"
    kernel.blacklist_path().write_bytes(written)
    shell_tool(bindir, "update-initramfs", "exit 2\n")
    with pytest.raises(InstallError, match="^update-initramfs -u failed: update-initramfs -u exited "
                                           "with status 2$"):
        kernel.remove_blacklist()
    assert kernel.blacklist_path().read_bytes() == written
    assert os.listdir(kernel.blacklist_path().parent) == [kernel.blacklist_path().name]


def test_update_initramfs_that_hangs_is_stopped_and_the_file_undone(root, bindir, monkeypatch):
    shell_tool(bindir, "update-initramfs", HANG)
    monkeypatch.setattr(kernel, "INITRAMFS_TIMEOUT", 1)
    with pytest.raises(InstallError) as error:
        kernel.ensure_nouveau_blacklisted()
    assert str(error.value) == "update-initramfs -u timed out after 1s and was stopped"
    assert not kernel.blacklist_path().exists()


PROC_MODULES = """\
nvidia_vgpu_vfio 110592 0 - Live 0x0000000000000000
nvidia 62586880 2 nvidia_vgpu_vfio, Live 0x0000000000000000 (POE)
mdev 20480 1 nvidia_vgpu_vfio, Live 0x0000000000000000
kvm_intel 487424 0 - Live 0x0000000000000000
"""


def test_loaded_modules(root):
    assert kernel.loaded_modules() == frozenset()
    (root / "proc").mkdir()
    (root / "proc/modules").write_text(PROC_MODULES)
    assert kernel.loaded_modules() == {"nvidia_vgpu_vfio", "nvidia", "mdev", "kvm_intel"}


def test_reboot_reasons_from_proc_modules(root):
    (root / "proc").mkdir()
    (root / "proc/modules").write_text("nouveau 2936832 1 - Live 0x0000000000000000\n")
    assert kernel.reboot_reasons(driver_installed=True) == [
        "nouveau is loaded", "nvidia_vgpu_vfio is not loaded"]


@pytest.mark.parametrize("modules,installed,reasons", [
    ({"nvidia", "nvidia_vgpu_vfio"}, True, []),
    ({"nvidia", "nvidia-vgpu-vfio"}, True, []),
    (set(), False, []),
    ({"nouveau"}, False, ["nouveau is loaded"]),
    ({"nouveau", "nvidia_vgpu_vfio"}, True, ["nouveau is loaded"]),
    ({"nvidia"}, True, ["nvidia_vgpu_vfio is not loaded"]),
    ({"drm", "nouveau"}, True, ["nouveau is loaded", "nvidia_vgpu_vfio is not loaded"]),
])
def test_reboot_reasons(modules, installed, reasons):
    assert kernel.reboot_reasons(modules, driver_installed=installed) == reasons


@pytest.mark.parametrize("installed,loaded,reasons", [
    ("570.158.02", "570.158.02", []),
    ("570.172.08", "570.158.02", ["NVIDIA driver 570.158.02 is loaded, 570.172.08 installed"]),
    ("570.172.08", None, []),          # version unknown: nothing to compare
    # the whole upstream version must match, not a prefix of it
    ("570.158.02", "570.158.0", ["NVIDIA driver 570.158.0 is loaded, 570.158.02 installed"]),
    ("570.158.02", "570.158", ["NVIDIA driver 570.158 is loaded, 570.158.02 installed"]),
    # an epoch or a Debian revision is not part of the module's version
    ("1:570.158.02-0ubuntu1", "570.158.02", []),
])
def test_a_loaded_driver_of_another_version_needs_a_reboot(installed, loaded, reasons):
    modules = {"nvidia", "nvidia_vgpu_vfio"}
    assert kernel.reboot_reasons(modules, driver_installed=True, installed_version=installed,
                                 loaded_version=loaded) == reasons


def test_loaded_driver_version_is_read_from_sysfs(root):
    assert kernel.loaded_driver_version() is None
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "sys/module/nvidia/version").write_text("570.158.02\n")
    assert kernel.loaded_driver_version() == "570.158.02"


def test_an_unwritable_modprobe_dir_is_an_install_error_not_a_crash(root, tmp_path, monkeypatch):
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/modprobe.d").write_text("a file where a directory belongs")
    with pytest.raises(InstallError, match=r"^cannot write /etc/modprobe.d/nvidia-vgpu-blacklist-nouveau"):
        kernel.ensure_nouveau_blacklisted()


@pytest.mark.parametrize("raw", [b"570.158.02\x00evil\n", b"570.\xff\xfe158\n"])
def test_hostile_bytes_in_the_module_version_never_raise_nor_pass_through(root, raw):
    (root / "sys/module/nvidia").mkdir(parents=True)
    (root / "sys/module/nvidia/version").write_bytes(raw)
    version = kernel.loaded_driver_version()
    assert version.isprintable() and "\x00" not in version
    assert "\ufffd" in version


def test_an_unreadable_module_version_reads_as_unknown(root):
    (root / "sys/module/nvidia/version").mkdir(parents=True)  # a directory where the file belongs
    assert kernel.loaded_driver_version() is None


def test_a_blacklist_file_with_hostile_bytes_is_rewritten(root, initramfs):
    (root / TARGET).parent.mkdir(parents=True)
    (root / TARGET).write_bytes(b"blacklist nouveau\x00\xff\n")
    assert kernel.ensure_nouveau_blacklisted() is True
    assert (root / TARGET).read_text() == kernel.render_blacklist()


def test_a_blacklist_path_that_cannot_be_read_is_an_install_error(root, initramfs):
    (root / TARGET).mkdir(parents=True)  # a directory where the file belongs
    with pytest.raises(InstallError, match=r"^cannot read /etc/modprobe.d/nvidia-vgpu-blacklist"):
        kernel.ensure_nouveau_blacklisted()
    assert initramfs() == []


def test_update_initramfs_gets_a_bounded_time():
    assert kernel.INITRAMFS_TIMEOUT <= 300


def test_a_blacklist_that_cannot_be_deleted_says_why_in_words(root, tools, monkeypatch):
    import errno

    kernel.ensure_nouveau_blacklisted()

    def read_only(path, *, dir_fd=None):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))

    monkeypatch.setattr(os, "unlink", read_only)
    with pytest.raises(InstallError) as error:
        kernel.remove_blacklist()
    assert str(error.value) == f"cannot remove /{kernel.BLACKLIST}: Read-only file system"


# -- Secure Boot ---------------------------------------------------------------------------

MOKUTIL = """#!/bin/sh
echo "mokutil $*" >> "$FAKE_LOG"
case "$1" in
  --sb-state) echo "SecureBoot %(state)s" ;;
  --test-key) echo "$2 %(key)s" ;;
  --list-new) printf '%(pending)s' ;;
esac
"""
JOURNAL = ("Dec 01 nvidia-vgpu-mgr[812]: error: vmiop_log: NVOS status 0x56\n"
           "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service\n")


def efi(root, value=None):
    """A machine booted through EFI; ``value``: SecureBoot's data byte (None: no variable)."""
    (root / "sys/firmware/efi/efivars").mkdir(parents=True)
    if value is not None:
        (root / kernel.SECURE_BOOT_VAR).write_bytes(b"\x06\x00\x00\x00" + bytes([value]))


def secure_boot_with_dkms_key(root):
    """Secure Boot on, and the key DKMS signs its modules with on disk (enrolled or not: mokutil)."""
    efi(root, 1)
    (root / kernel.MOK_KEY).parent.mkdir(parents=True)
    (root / kernel.MOK_KEY).write_bytes(b"0\x82")


def fake_mokutil(tools, state="enabled", key="is not enrolled", pending=""):
    from unit_tests.faketools import stand_in

    stand_in(tools.bin / "mokutil", MOKUTIL % {"state": state, "key": key, "pending": pending})


def fake_journal(tools, text=JOURNAL):
    from unit_tests.faketools import stand_in

    (tools.bin.parent / "journal.txt").write_text(text)
    stand_in(tools.bin / "journalctl",
             f'#!/bin/sh\necho "journalctl $*" >> "$FAKE_LOG"\ncat "{tools.bin.parent}/journal.txt"\n')


def test_without_efi_secure_boot_is_off_and_nothing_runs(root, tools):
    fake_mokutil(tools)
    assert kernel.secure_boot() == kernel.SecureBoot(False)
    assert tools.calls() == []


@pytest.mark.parametrize("value,enabled", [(1, True), (0, False)])
def test_the_firmware_variable_answers_first(root, tools, value, enabled):
    efi(root, value)
    fake_mokutil(tools, state="disabled" if enabled else "enabled")
    assert kernel.secure_boot_enabled() is enabled
    assert not [c for c in tools.calls() if "--sb-state" in c]


def test_mokutil_answers_when_the_variable_is_not_there(root, tools):
    efi(root)
    assert kernel.secure_boot_enabled() is None  # no mokutil either: cannot tell
    fake_mokutil(tools, state="enabled")
    assert kernel.secure_boot_enabled() is True


def test_an_unenrolled_dkms_key_and_the_kernels_refusal_are_found(root, tools):
    secure_boot_with_dkms_key(root)
    fake_mokutil(tools)
    fake_journal(tools)
    state = kernel.secure_boot()
    assert state == kernel.SecureBoot(
        True, "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service", False)
    assert state.blocks_modules()
    assert kernel.secure_boot_advice(state) == (
        "Secure Boot is on and the NVIDIA modules are not signed by an enrolled key (kernel: "
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service), so no reboot "
        "loads them: enrol DKMS's key (mokutil --import /var/lib/shim-signed/mok/MOK.der, "
        "reboot, confirm it in MOK Manager at the console), sign the modules with an enrolled "
        "key, or turn Secure Boot off in the firmware")


def test_an_enrolment_waiting_for_the_console_is_said(root, tools):
    secure_boot_with_dkms_key(root)
    fake_mokutil(tools, pending="[key 1]\\nSHA1 Fingerprint: 12:34\\n")
    fake_journal(tools, "")
    state = kernel.secure_boot()
    assert (state.pending, state.key_enrolled, state.blocks_modules()) == (True, False, True)
    assert kernel.secure_boot_advice(state).startswith(
        "Secure Boot is on and DKMS's signing key waits for enrolment: reboot and confirm it in "
        "MOK Manager")


@pytest.mark.parametrize("said", ["MokNew is empty\\n", "Failed to read MokNew\\n"])
def test_mokutil_saying_nothing_is_pending_is_no_pending_enrolment(root, tools, said):
    """mokutil --list-new answers "MokNew is empty" when no key waits: no reboot would help."""
    secure_boot_with_dkms_key(root)
    fake_mokutil(tools, pending=said)
    fake_journal(tools, "")
    state = kernel.secure_boot()
    assert (state.pending, state.key_enrolled, state.blocks_modules()) == (False, False, True)
    assert kernel.secure_boot_advice(state).startswith(
        "Secure Boot is on and the NVIDIA modules are not signed by an enrolled key "
        "(/var/lib/shim-signed/mok/MOK.der is not enrolled)")


# Lines as logs show them, module names aside (the bracketed source is each line's transcript):
# modprobe [lolo101/px1800kbd#10, Hyphaed/vmware_module_builder#7], insmod and the kernel's
# unnamed line [JafarAkhondali/acer-predator-turbo-and-rgb-keyboard-linux-module#113],
# systemd-modules-load [ublue-os/bluefin#1142], the kernel's line while an nvidia load failed
# [siderolabs/talos#7043], lockdown and modprobe's answer under it [AdnanHodzic/displaylink-debian#523],
# the module first [kernel.org stable review of 705e9195187d: pr_notice("%s: loading of %s is
# rejected", info->name, ...)].
KERNEL_REJECTS = "Loading of module with unavailable key is rejected"
LOCKDOWN = "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7"


def modprobe(module, error="Key was rejected by service"):
    return f"modprobe: ERROR: could not insert '{module}': {error}"


@pytest.mark.parametrize("log,found", [
    # Loaders name the module: only NVIDIA's count.
    ([KERNEL_REJECTS, modprobe("zfs")], ""),
    ([KERNEL_REJECTS, "Failed to insert module 'vboxdrv': Key was rejected by service"], ""),
    ([KERNEL_REJECTS, "insmod: ERROR: could not insert module src/facer.ko: Key was rejected by "
                      "service"], ""),
    ([LOCKDOWN, modprobe("evdi", "Operation not permitted")], ""),
    ([KERNEL_REJECTS, modprobe("nvidia_vgpu_vfio")], modprobe("nvidia_vgpu_vfio")),
    ([modprobe("zfs"), KERNEL_REJECTS, modprobe("nvidia"), KERNEL_REJECTS], modprobe("nvidia")),
    (["Failed to insert module 'nvidia_vgpu_vfio': Key was rejected by service", modprobe("zfs")],
     "Failed to insert module 'nvidia_vgpu_vfio': Key was rejected by service"),
    (["insmod: ERROR: could not insert module /lib/modules/6.8.0-45-generic/updates/dkms/"
      "nvidia.ko.zst: Required key not available"],
     "insmod: ERROR: could not insert module /lib/modules/6.8.0-45-generic/updates/dkms/"
     "nvidia.ko.zst: Required key not available"),
    (["nvidia_drm: loading of module with unavailable key is rejected"],
     "nvidia_drm: loading of module with unavailable key is rejected"),
    (["zfs: loading of module with unavailable key is rejected"], ""),
    # Named NVIDIA modules only: not nvidiafb, nor another vendor's.
    ([modprobe("nvidiafb"), modprobe("nvme_fabrics")], ""),
    # "Operation not permitted" alone is not the key's; under lockdown the kernel's line counts.
    ([modprobe("nvidia", "Operation not permitted")], ""),
    ([LOCKDOWN, modprobe("nvidia", "Operation not permitted")], LOCKDOWN),
    # The kernel's unnamed lines: those no other module's report accounts for count (fail safe).
    ([KERNEL_REJECTS], KERNEL_REJECTS),
    ([KERNEL_REJECTS, modprobe("zfs"), KERNEL_REJECTS], KERNEL_REJECTS),
    ([LOCKDOWN, modprobe("zfs")], LOCKDOWN),  # a key refusal does not account for lockdown
    ([LOCKDOWN, LOCKDOWN, modprobe("evdi", "Operation not permitted")], LOCKDOWN),
])
def test_only_refusals_of_nvidias_modules_count(log, found):
    assert kernel.nvidia_refusal(["Dec 01 systemd[1]: Started Journal Service."] + log) == found


def test_another_modules_refusal_is_not_blamed_on_secure_boot(root, tools):
    """A DKMS zfs refused at boot, NVIDIA's key enrolled: the reboot is what the host needs."""
    secure_boot_with_dkms_key(root)
    fake_mokutil(tools, key="is already enrolled")
    fake_journal(tools, f"{KERNEL_REJECTS}\n{modprobe('zfs')}\n")
    assert kernel.secure_boot() == kernel.SecureBoot(True, "", True)
    assert not kernel.secure_boot().blocks_modules()
    fake_journal(tools, f"{KERNEL_REJECTS}\n{modprobe('zfs')}\n{KERNEL_REJECTS}\n")
    assert kernel.secure_boot() == kernel.SecureBoot(True, KERNEL_REJECTS, True)
    assert kernel.secure_boot().blocks_modules()


def test_an_enrolled_key_without_refusals_is_left_to_the_reboot(root, tools):
    secure_boot_with_dkms_key(root)
    fake_mokutil(tools, key="is already enrolled")
    fake_journal(tools, "nothing to see\n")
    assert kernel.secure_boot() == kernel.SecureBoot(True, "", True)
    assert not kernel.secure_boot().blocks_modules()


# -- the upstream charm's blacklist (vgpu.upstream.BLACKLIST), after a switch --------------------
# Taken over only where the upstream charm ran (upstream_ran: its StoredState, unit or scripts);
# elsewhere a file of that name is the operator's own.

def upstream_blacklist(root, content=upstream_fixture.BLACKLIST_TEXT):
    return upstream_fixture.leave_blacklist(root, content)


def test_the_upstream_blacklist_is_replaced_by_ours_without_an_initramfs_rebuild(root, initramfs,
                                                                                 caplog):
    theirs = upstream_blacklist(root)
    caplog.set_level("INFO", logger="vgpu.kernel")
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=True) is False  # modprobe is told nothing new
    assert not theirs.exists()
    assert (root / TARGET).read_text() == kernel.render_blacklist()
    assert initramfs() == []
    assert caplog.messages == [
        "took over /etc/modprobe.d/disable-nouveau.conf of the upstream charm: "
        f"/{TARGET} says the same; the initramfs has it already, not rebuilt"]
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=True) is False  # steady: one file, nothing to do
    assert os.listdir(root / "etc/modprobe.d") == ["nvidia-vgpu-blacklist-nouveau.conf"]


def test_an_upstream_blacklist_that_said_less_is_replaced_and_the_initramfs_rebuilt(root,
                                                                                    initramfs):
    theirs = upstream_blacklist(root, "blacklist nouveau\n")
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=True) is True  # modeset=0 is new
    assert not theirs.exists()
    assert initramfs() == ["-u"]


def test_an_upstream_blacklist_edited_to_say_more_is_left_as_it_is(root, initramfs):
    edited = upstream_fixture.BLACKLIST_TEXT + "\noptions nouveau debug=1\n"
    theirs = upstream_blacklist(root, edited)
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=True) is False  # ours tells modprobe nothing new
    assert theirs.read_text() == edited
    assert (root / TARGET).is_file()
    assert initramfs() == []


def test_both_blacklists_come_back_when_the_rebuild_fails(root, initramfs):
    theirs = upstream_blacklist(root, "blacklist nouveau")
    initramfs.fail.touch()
    with pytest.raises(InstallError):
        kernel.ensure_nouveau_blacklisted(upstream_ran=True)
    assert theirs.read_text() == "blacklist nouveau"
    assert stat.S_IMODE(theirs.stat().st_mode) == 0o444
    assert not (root / TARGET).exists()


def test_removal_takes_the_upstream_blacklist_too_with_one_rebuild(root, initramfs):
    theirs = upstream_blacklist(root)
    assert kernel.remove_blacklist(upstream_ran=True) is True  # never taken over (no GPU hook ran): both go
    assert not theirs.exists()
    assert initramfs() == ["-u"]
    edited = upstream_blacklist(root, "blacklist nouveau\nblacklist lbm-nouveau\n")
    assert kernel.remove_blacklist(upstream_ran=True) is False  # says more than ours: not ours to remove
    assert edited.exists()


def test_an_upstream_blacklist_behind_a_link_is_left_alone(root, initramfs, tmp_path):
    elsewhere = tmp_path / "elsewhere.conf"
    elsewhere.write_text(upstream_fixture.BLACKLIST_TEXT)
    (root / "etc/modprobe.d").mkdir(parents=True)
    (root / "etc/modprobe.d/disable-nouveau.conf").symlink_to(elsewhere)
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=True) is True  # ours is new to modprobe's view here
    assert os.path.islink(root / "etc/modprobe.d/disable-nouveau.conf")
    assert elsewhere.read_text() == upstream_fixture.BLACKLIST_TEXT


def test_an_operators_file_of_that_name_is_left_alone_and_nothing_rebuilt(root, initramfs):
    """No upstream charm here: the same lines in two files harm nothing; neither goes."""
    theirs = upstream_blacklist(root)
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=False) is False  # nothing new
    assert theirs.read_text() == upstream_fixture.BLACKLIST_TEXT
    assert (root / TARGET).read_text() == kernel.render_blacklist()
    assert initramfs() == []
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=False) is False
    assert kernel.remove_blacklist(upstream_ran=False) is False  # theirs still says it all
    assert theirs.read_text() == upstream_fixture.BLACKLIST_TEXT
    assert not (root / TARGET).exists()
    assert initramfs() == []


def test_an_operators_file_that_says_less_is_kept_and_the_initramfs_rebuilt(root, initramfs):
    theirs = upstream_blacklist(root, "blacklist nouveau\n")
    assert kernel.ensure_nouveau_blacklisted(upstream_ran=False) is True  # modeset=0 is new
    assert theirs.read_text() == "blacklist nouveau\n"
    assert initramfs() == ["-u"]
    assert kernel.remove_blacklist(upstream_ran=False) is True  # modeset=0 goes
    assert theirs.read_text() == "blacklist nouveau\n"
    assert initramfs() == ["-u", "-u"]
