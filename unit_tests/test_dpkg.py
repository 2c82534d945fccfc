"""dpkg's database read as dpkg reads it (status plus the updates/ journal), and its version order.

Every answer here is checked against the real ``dpkg-query --admindir`` on
the same tree, so the charm's reading cannot drift from dpkg's.
"""

import subprocess

import pytest

from unit_tests import debs
from unit_tests.fakehost import FakeHost
from unit_tests.faketools import HANG, shell_tool
from vgpu import dpkg
from vgpu.errors import CommandError, HostReadError

HOST = debs.HOST


def stanza(name, version, state, arch="amd64"):
    return (f"Package: {name}\nStatus: install ok {state}\nPriority: optional\nSection: kernel\n"
            f"Maintainer: NVIDIA\nArchitecture: {arch}\nVersion: {version}\n"
            f"Description: {name}\n long description\n")


def journal(root, number, *stanzas):
    (root / "var/lib/dpkg/updates" / number).write_text("\n".join(stanzas))


def query(root, name=HOST):
    """``<state> <version>`` as dpkg-query reads it from the tree ("" when dpkg knows none)."""
    return debs.dpkg_query(root, name).replace("install ok ", "")


def ours(root, name=HOST):
    pkg = dpkg.packages(prefixes=["nvidia-vgpu-ubuntu-"]).get(name)
    return f"{pkg.state} {pkg.version}" if pkg else ""


def test_status_file_gives_only_the_packages_asked_for(root):
    FakeHost(root).dpkg_status({"nova-common": "3:29.0.0-0ubuntu1", HOST: "570.1",
                                "zlib1g": "1:1.3"}, states={HOST: "unpacked"})
    found = dpkg.packages(names=["nova-common"], prefixes=["nvidia-vgpu-ubuntu-"])
    assert sorted(found) == ["nova-common", HOST]
    assert found["nova-common"].installed and found["nova-common"].version == "3:29.0.0-0ubuntu1"
    assert not found[HOST].installed
    assert found[HOST].state == "unpacked"


def test_a_journal_entry_overrides_the_status_file_as_dpkg_reads_it(root):
    # dpkg killed mid-upgrade: status still says installed, its journal says half-configured.
    FakeHost(root).dpkg_status({HOST: debs.OLD})
    journal(root, "0000", stanza(HOST, debs.NEW, "half-configured"))
    assert query(root) == f"half-configured {debs.NEW}"
    assert ours(root) == query(root)
    assert not dpkg.package(HOST).installed


def test_journal_files_apply_in_order_and_only_digit_names_count(root):
    FakeHost(root).dpkg_status({HOST: debs.OLD, "nova-common": "3:29.0.0-0ubuntu1"})
    journal(root, "0000", stanza(HOST, debs.NEW, "half-installed"))
    journal(root, "0001", stanza(HOST, debs.NEW, "unpacked"))
    journal(root, "0002", stanza(HOST, debs.NEW, "half-configured"))
    journal(root, "tmp.i", stanza(HOST, "999", "installed"))  # being written: dpkg ignores it
    assert query(root) == f"half-configured {debs.NEW}"
    assert ours(root) == query(root)
    assert query(root, "nova-common") == "installed 3:29.0.0-0ubuntu1"
    assert dpkg.package("nova-common").installed


def test_a_journal_entry_for_another_architecture_replaces_a_single_instance_package(root):
    FakeHost(root).dpkg_status({HOST: debs.OLD})
    journal(root, "0000", stanza(HOST, debs.NEW, "half-configured", arch="i386"))
    assert query(root) == f"half-configured {debs.NEW}"
    assert ours(root) == query(root)


def test_multi_arch_same_packages_keep_one_instance_per_architecture(root):
    FakeHost(root)
    name = "libnvidia-vgpu-ubuntu-test"
    (root / "var/lib/dpkg/status").write_text(
        stanza(name, "1.0", "installed").replace("Version:", "Multi-Arch: same\nVersion:"))
    journal(root, "0000", stanza(name, "2.0", "half-configured", arch="i386").replace(
        "Version:", "Multi-Arch: same\nVersion:"))
    listed = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Status} ${Version}\n",
         name], capture_output=True, text=True).stdout.splitlines()
    assert sorted(listed) == ["install ok half-configured 2.0", "install ok installed 1.0"]
    # an installed instance is the answer for the name
    assert dpkg.package(name).installed and dpkg.package(name).version == "1.0"


def test_a_journal_entry_removing_the_package_hides_it(root):
    FakeHost(root).dpkg_status({HOST: debs.OLD})
    journal(root, "0000", f"Package: {HOST}\nStatus: purge ok not-installed\nArchitecture: amd64\n")
    assert query(root).endswith("not-installed")
    assert dpkg.package(HOST) is None


def test_the_journal_of_a_real_dpkg_run_is_read(tmp_path, monkeypatch):
    """Real dpkg leaves its own journal; what the charm reads equals dpkg-query's answer."""
    root = debs.make_root(tmp_path)
    monkeypatch.setenv("VGPU_HOST_ROOT", str(root))
    deb = debs.unmet_depends(tmp_path)  # unpacks, then cannot configure
    subprocess.run(["dpkg", f"--root={root}", f"--admindir={root}/var/lib/dpkg", "--install",
                    str(deb)], capture_output=True)
    assert ours(root) == query(root) == f"unpacked {debs.NEW}"


def test_continuation_lines_that_look_like_fields_are_not_fields(root):
    # A package's long description may hold "Version: ..." or "Status: ..." lines.
    FakeHost(root)
    (root / "var/lib/dpkg/status").write_text(stanza(HOST, debs.OLD, "installed").replace(
        " long description\n", " long description\n Version: 999\n\tStatus: install ok unpacked\n"))
    assert query(root) == f"installed {debs.OLD}"
    assert ours(root) == query(root)


def test_a_stanza_with_its_package_field_last_and_no_final_newline_is_read(root):
    FakeHost(root)
    (root / "var/lib/dpkg/status").write_text(
        stanza("zlib1g", "1:1.3", "installed") + "\n"
        + f"Status: install ok installed\nArchitecture: amd64\nVersion: {debs.OLD}\n"
          f"Maintainer: NVIDIA\nDescription: x\nPackage: {HOST}")
    # dpkg-query refuses the whole file ("missing final newline"); the charm reads what is there.
    assert query(root) == ""
    assert ours(root) == f"installed {debs.OLD}"
    assert dpkg.packages(names=[HOST])[HOST].version == debs.OLD  # an exact name, not a prefix


def test_a_stanza_without_a_status_is_not_installed_as_dpkg_reads_it(root):
    FakeHost(root)
    (root / "var/lib/dpkg/status").write_text(
        f"Package: {HOST}\nArchitecture: amd64\nVersion: {debs.OLD}\nDescription: x\n")
    assert query(root) == "unknown ok not-installed"
    assert dpkg.package(HOST) is None


def test_an_unreadable_status_file_names_the_path(root):
    (root / "var/lib/dpkg").mkdir(parents=True)
    (root / "var/lib/dpkg/status").mkdir()  # a directory where the file belongs
    with pytest.raises(HostReadError, match="^cannot read /var/lib/dpkg/status: Is a directory$"):
        dpkg.packages(names=["nova-common"])


def test_an_unreadable_journal_names_the_path(root):
    FakeHost(root).dpkg_status({HOST: debs.OLD})
    updates = root / "var/lib/dpkg/updates"
    updates.rmdir()
    updates.symlink_to("updates")  # a symlink loop
    with pytest.raises(HostReadError, match="^cannot read /var/lib/dpkg/updates: "):
        dpkg.packages(names=[HOST])


def test_hostile_bytes_in_the_status_file_never_raise_nor_pass_through(root):
    FakeHost(root)
    (root / "var/lib/dpkg/status").write_bytes(
        stanza(HOST, "570.158.02", "installed").replace("570.158.02", "570.1\x00\xff58").encode(
            "latin-1"))
    pkg = dpkg.package(HOST)
    assert pkg.version.isprintable() and "\x00" not in pkg.version


# -- versions, ordered by dpkg -------------------------------------------------------

def dpkg_says(a: str, b: str) -> int:
    for op, result in (("lt", -1), ("eq", 0), ("gt", 1)):
        if subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0:
            return result
    raise AssertionError(f"dpkg compares neither way: {a!r} {b!r}")


@pytest.mark.parametrize("a,b,order", [
    ("570.158.02", "570.172.08", -1), ("570.172.08", "570.158.02", 1),
    ("570.158.02", "570.158.02", 0), ("550.127.06", "570.86.15", -1), ("1.0~rc1", "1.0", -1),
    ("1:1.0", "2.0", 1), ("1.0-1", "1.0-1ubuntu1", -1), ("3:29.0.0-0ubuntu1~cloud0", "3:29.0.0-0ubuntu1", -1),
    ("1.0", "1.0-0", 0), ("0:1.0", "1.0", 0), ("2.10-3", "2.9-12", 1),
    # a colon in the upstream version (allowed after an epoch) and a hyphen in it
    ("1:2.0:3-1", "1:2.0:3-2", -1), ("1:2.0:3-1", "1:2.0:2-9", 1), ("1.0-beta-2", "1.0-beta-10", -1),
])
def test_versions_order_as_dpkg_orders_them(a, b, order):
    assert dpkg.compare_versions(a, b) == order == dpkg_says(a, b)


def test_equal_versions_need_no_process(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no dpkg to run
    assert dpkg.compare_versions("570.158.02", "570.158.02") == 0


@pytest.mark.parametrize("bad", ["1:", "1.0 2", "-1"])
def test_a_version_dpkg_refuses_is_a_value_error_with_its_reason(bad):
    with pytest.raises(ValueError) as error:
        dpkg.compare_versions(bad, "1.0")
    assert str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("version,upstream", [
    ("570.158.02", "570.158.02"), ("1:570.158.02-0ubuntu1", "570.158.02"),
    ("1:2.0:3-1", "2.0:3"), ("1.0-beta-2", "1.0-beta"), ("2:1.0", "1.0"),
])
def test_upstream_version(version, upstream):
    assert dpkg.upstream(version) == upstream


def test_dpkg_compare_versions_that_hangs_is_reported(bindir, monkeypatch):
    shell_tool(bindir, "dpkg", HANG)
    monkeypatch.setattr(dpkg, "COMPARE_TIMEOUT", 1)
    with pytest.raises(CommandError) as error:
        dpkg.compare_versions(debs.OLD, debs.NEW)
    assert str(error.value) == "dpkg --compare-versions timed out after 1s and was stopped"


def test_only_package_fields_name_a_stanza_wherever_they_stand(root):
    # Names found inside other fields, other packages' names, description lines and
    # a stanza whose Package field is not first: as dpkg-query reads them.
    (root / "var/lib/dpkg").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/dpkg/updates").mkdir(exist_ok=True)
    (root / "var/lib/dpkg/status").write_text("\n".join([
        stanza("python3-nova-common", "1.0", "installed").replace(
            "Description: python3-nova-common\n", "Description: x\n Package: nova-common\n"),
        "Status: install ok installed\nArchitecture: amd64\nPackage: nova-common\nVersion: 3:31.0.0\n"
        "Maintainer: Ubuntu\nDepends: nvidia-vgpu-ubuntu-570 (>= 1)\nDescription: nova\n",
        stanza("nova-compute", "3:31.0.0", "installed").replace(
            "Priority: optional\n", "Depends: nova-common (= 3:31.0.0)\n"),
        stanza(f"{HOST}-tools", "1", "installed"),
    ]))
    found = dpkg.packages(names=["nova-common"], prefixes=["nvidia-vgpu-ubuntu-"])
    assert {name: p.version for name, p in found.items()} == {
        "nova-common": "3:31.0.0", f"{HOST}-tools": "1"}
    assert debs.dpkg_query(root, "nova-common") == "install ok installed 3:31.0.0"
