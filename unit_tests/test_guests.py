"""vgpu.guests on libvirt status XML files as libvirt writes them in /run/libvirt/qemu."""

import logging
import os

import pytest

from unit_tests.libvirt import MDEV, PCI, status
from vgpu import guests, hostroot
from vgpu.errors import GuestsRunningError, HostReadError, VgpuError

NVIDIA_VFS = {"0000:c1:00.4", "0000:c1:00.5"}

MDEV_GUEST = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1"
VF_GUEST = "3d9f1c52-2a7e-4b5e-8f3a-1c2d3e4f5a6b"
NIC_GUEST = "7a1e6c0d-5b4f-4e2a-9c8d-0f1e2d3c4b5a"
MDEV_UUID = "5f4b8a3e-2d1c-4b0a-9e8f-7a6b5c4d3e2f"


@pytest.fixture
def qemu(tmp_path, monkeypatch):
    root = tmp_path / "root"
    d = root / "run/libvirt/qemu"
    d.mkdir(parents=True)
    monkeypatch.setenv(hostroot.ENV, str(root))
    (d / "instance-0000002a.xml").write_text(
        status("instance-0000002a", MDEV_GUEST, MDEV.format(uuid=MDEV_UUID)))
    (d / "instance-0000002b.xml").write_text(
        status("instance-0000002b", VF_GUEST,
               PCI.format(managed="no", domain="0x0000", bus="0xc1", fn="0x4")))
    (d / "instance-0000002c.xml").write_text(
        status("instance-0000002c", NIC_GUEST,
               PCI.format(managed="yes", domain="0x0000", bus="0x41", fn="0x2")))
    (d / "instance-0000002d.xml").write_text(status("instance-0000002d", "1" * 32))  # no hostdev
    (d / "instance-0000002a.pid").write_text("41377")
    (d / "channel").mkdir()
    return d


def broken(qemu):
    """A status file cut short before its devices, and one declaring entities."""
    (qemu / "instance-00000030.xml").write_text("<domstatus state='running'><domain><name>x</na")
    (qemu / "instance-00000031.xml").write_text(
        '<?xml version="1.0"?>\n<!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;">]>\n'
        + status("instance-00000031", VF_GUEST, MDEV.format(uuid=MDEV_UUID)).replace(
            "<name>instance-00000031</name>", "<name>&lol2;</name>"))


def test_guests_holding_vgpus(qemu):
    found = guests.running_vgpu_guests(NVIDIA_VFS)
    assert found == [
        guests.Guest("instance-0000002a", MDEV_GUEST, (MDEV_UUID,), nova_name="vm-instance-0000002a"),
        guests.Guest("instance-0000002b", VF_GUEST, ("0000:c1:00.4",), nova_name="vm-instance-0000002b"),
    ]


def test_files_that_cannot_be_parsed_count_as_guests_holding_vgpus(qemu, caplog):
    broken(qemu)
    caplog.set_level(logging.WARNING)
    found = guests.running_vgpu_guests(NVIDIA_VFS)
    assert [g.name for g in found] == ["instance-0000002a", "instance-0000002b",
                                       "/run/libvirt/qemu/instance-00000030.xml",
                                       "/run/libvirt/qemu/instance-00000031.xml"]
    assert found[2].problem.startswith("not XML: ")
    assert found[3].describe() == ("/run/libvirt/qemu/instance-00000031.xml (DOCTYPE declarations "
                                   "are not accepted; counted as in use)")
    assert (found[2].instance_uuid, found[2].vgpus, found[2].state) == ("", (), "running")
    with pytest.raises(GuestsRunningError) as error:
        guests.ensure_no_guests({"0000:c1:00.5"})  # held by nobody readable
    # (instance-0000002a's mdev is nowhere in sysfs here: it could be on any GPU)
    assert str(error.value).startswith("3 guest(s) hold vGPUs, running or shut off: "
                                       "instance-0000002a (vm-instance-0000002a, ")
    assert "/run/libvirt/qemu/instance-00000031.xml (DOCTYPE" in str(error.value)


def test_a_complete_file_without_a_hostdev_is_not_parsed(qemu, monkeypatch):
    import xml.etree.ElementTree as ET
    parsed = []
    real = ET.fromstring
    monkeypatch.setattr(ET, "fromstring", lambda text: parsed.append(text) or real(text))
    (qemu / "instance-0000002a.xml").unlink()
    (qemu / "instance-0000002b.xml").unlink()
    (qemu / "instance-0000002c.xml").unlink()
    assert guests.running_vgpu_guests(NVIDIA_VFS) == []
    assert guests.domains() == []  # the counts' reading too
    assert parsed == []
    # Cut short, it might have held one: parsed, and counted.
    text = (qemu / "instance-0000002d.xml").read_text()
    (qemu / "instance-0000002d.xml").write_text(text[:text.index("<devices>")])
    assert [g.problem[:8] for g in guests.running_vgpu_guests(NVIDIA_VFS)] == ["not XML:"]
    assert len(parsed) == 1


# -- running or shut off: what retyping a VF or taking a type from a GPU must respect ------

def test_shut_off_guests_hold_their_vfs_too(root):
    from unit_tests.libvirt import defined_guest, running_guest
    running_guest(root, "instance-00000001", MDEV_GUEST, pci_address="0000:c1:00.4")
    defined_guest(root, "instance-00000002", VF_GUEST, pci_address="0000:c1:00.5",
                  project_name="globex")
    defined_guest(root, "instance-00000003", NIC_GUEST, pci_address="0000:41:00.2")
    assert [g.name for g in guests.running_vgpu_guests(NVIDIA_VFS)] == ["instance-00000001"]
    found = guests.vgpu_guests(NVIDIA_VFS)
    assert found == [
        guests.Guest("instance-00000001", MDEV_GUEST, ("0000:c1:00.4",), "running",
                     "vm-instance-00000001"),
        guests.Guest("instance-00000002", VF_GUEST, ("0000:c1:00.5",), "shut off",
                     "vm-instance-00000002"),
    ]
    with pytest.raises(GuestsRunningError) as error:
        guests.ensure_no_guests({"0000:c1:00.5"}, defined=True)
    assert str(error.value) == (f"1 guest(s) hold vGPUs, running or shut off: instance-00000002 "
                                f"(vm-instance-00000002, {VF_GUEST}, shut off)")
    assert guests.ensure_no_guests({"0000:c1:00.5"}) == []  # running guests only


def test_a_device_only_in_a_running_guests_definition_is_held_too(root):
    """A guest's live XML and its definition may differ (a device plugged for the next boot)."""
    from unit_tests.libvirt import defined_guest, running_guest
    running_guest(root, "instance-00000001", MDEV_GUEST, pci_address="0000:c1:00.4")
    defined_guest(root, "instance-00000001", MDEV_GUEST, pci_address="0000:c1:00.5")
    (found,) = guests.vgpu_guests(NVIDIA_VFS)
    assert (found.name, found.state, found.vgpus) == (
        "instance-00000001", "running", ("0000:c1:00.4", "0000:c1:00.5"))
    # Running without any device now: still running, holding what its definition names.
    running_guest(root, "instance-00000001", MDEV_GUEST)
    defined_guest(root, "instance-00000001", MDEV_GUEST, pci_address="0000:c1:00.5")
    assert guests.vgpu_guests(NVIDIA_VFS) == [guests.Guest(
        "instance-00000001", MDEV_GUEST, ("0000:c1:00.5",), "running", "vm-instance-00000001")]


def test_a_defined_file_that_cannot_be_read_counts_as_in_use(root):
    from unit_tests.libvirt import broken_guest
    path = broken_guest(root, "instance-00000009")
    (found,) = guests.vgpu_guests(NVIDIA_VFS)
    assert found.name == "/etc/libvirt/qemu/instance-00000009.xml"
    assert found.state == "shut off" and found.problem.startswith("not XML: ")
    path.chmod(0)
    if os.access(path, os.R_OK):  # root reads it anyway: a directory stands in
        path.unlink()
        path.mkdir()
    (found,) = guests.vgpu_guests(NVIDIA_VFS)
    assert found.problem.startswith("cannot read /etc/libvirt/qemu/instance-00000009.xml: ")
    assert guests.running_vgpu_guests(NVIDIA_VFS) == []


def test_an_unreadable_domain_directory_is_a_host_read_error(root):
    from unit_tests.libvirt import defined_guest
    defined_guest(root, "instance-00000002", VF_GUEST, pci_address="0000:c1:00.5")
    directory = root / "etc/libvirt/qemu"
    directory.rename(root / "etc/libvirt/elsewhere")
    directory.write_text("a file where the directory belongs")
    with pytest.raises(HostReadError) as error:
        guests.vgpu_guests(NVIDIA_VFS)
    assert str(error.value) == "cannot read /etc/libvirt/qemu: Not a directory"


def test_held_mdevs_say_where_sysfs_puts_each_one(root):
    from unit_tests.fakehost import a100_host
    from unit_tests.libvirt import broken_guest, defined_guest, running_guest
    host = a100_host(root)
    on_vf, gone = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1", "9e0c7f3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
    host.add_mdev("0000:41:00.5", "nvidia-474", on_vf)
    running_guest(root, "instance-00000001", MDEV_GUEST, mdev_uuid=on_vf)
    defined_guest(root, "instance-00000002", VF_GUEST, mdev_uuid=gone)  # not created since boot
    defined_guest(root, "instance-00000003", NIC_GUEST, pci_address="0000:41:00.6")
    broken_guest(root, "instance-00000004")
    held = guests.held_mdevs()
    assert [(m.guest.name, m.guest.state, m.uuid, m.parent, m.type_id) for m in held] == [
        ("instance-00000001", "running", on_vf, "0000:41:00.5", "nvidia-474"),
        ("instance-00000002", "shut off", gone, None, None),
        ("/etc/libvirt/qemu/instance-00000004.xml", "shut off", "", None, None),
    ]


def test_an_mdev_counts_only_when_its_parent_is_one_of_ours(root):
    from unit_tests.fakehost import v100_host
    from unit_tests.libvirt import running_guest
    host = v100_host(root)
    nvidia, intel = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1", "9e0c7f3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
    host.add_mdev("0000:c1:00.0", "nvidia-108", nvidia)
    host.add_mdev("0000:00:02.0", "i915-GVTg_V5_4", intel)
    running_guest(root, "instance-00000001", "11111111-1111-4111-8111-111111111111", mdev_uuid=nvidia)
    running_guest(root, "instance-00000002", "22222222-2222-4222-8222-222222222222", mdev_uuid=intel)
    ours = {"0000:c1:00.0", "0000:e1:00.0"}
    assert [(g.name, g.vgpus) for g in guests.running_vgpu_guests(ours)] == [
        ("instance-00000001", (nvidia,))]


def test_nic_is_a_vgpu_only_when_its_address_is_given(qemu):
    names = [g.name for g in guests.running_vgpu_guests({"0000:41:00.2"})]
    assert names == ["instance-0000002a", "instance-0000002c"]
    assert [g.name for g in guests.running_vgpu_guests(set())] == ["instance-0000002a"]


def test_given_addresses_are_compared_in_lower_case(qemu):
    found = guests.running_vgpu_guests({"0000:C1:00.4"})
    assert [g.vgpus for g in found] == [(MDEV_UUID,), ("0000:c1:00.4",)]


def test_bare_domain_and_sorting(qemu):
    (qemu / "aaa.xml").write_text(f"""<domain type='kvm'>
  <name>instance-00000001</name>
  <uuid>{NIC_GUEST.upper()}</uuid>
  <devices>
    <hostdev mode='subsystem' type='pci' managed='no'>
      <source><address domain='0x0000' bus='0xc1' slot='0x00' function='0x5'/></source>
    </hostdev>
    <hostdev mode='subsystem' type='mdev' model='vfio-pci'>
      <source><address uuid='{MDEV_UUID.upper()}'/></source>
    </hostdev>
    <hostdev mode='capabilities' type='storage'>
      <source><block>/dev/sdf1</block></source>
    </hostdev>
  </devices>
</domain>""")
    found = guests.running_vgpu_guests(NVIDIA_VFS)
    assert [g.name for g in found] == ["instance-00000001", "instance-0000002a", "instance-0000002b"]
    assert found[0] == guests.Guest("instance-00000001", NIC_GUEST, ("0000:c1:00.5", MDEV_UUID))


def test_no_libvirt_dir_means_no_guests(tmp_path, monkeypatch):
    monkeypatch.setenv(hostroot.ENV, str(tmp_path))
    assert guests.running_vgpu_guests(NVIDIA_VFS) == []
    assert guests.ensure_no_guests(NVIDIA_VFS) == []


def test_ensure_no_guests_raises_with_names(qemu):
    with pytest.raises(GuestsRunningError) as e:
        guests.ensure_no_guests(NVIDIA_VFS)
    assert isinstance(e.value, VgpuError)
    assert [g.name for g in e.value.guests] == ["instance-0000002a", "instance-0000002b"]
    assert str(e.value) == (f"2 running guest(s) use vGPUs: instance-0000002a "
                            f"(vm-instance-0000002a, {MDEV_GUEST}), instance-0000002b "
                            f"(vm-instance-0000002b, {VF_GUEST})")


def test_ensure_no_guests_forced_returns_them(qemu):
    forced = guests.ensure_no_guests(NVIDIA_VFS, force=True)
    assert [g.name for g in forced] == ["instance-0000002a", "instance-0000002b"]


def test_ensure_no_guests_passes_when_only_unrelated_guests_run(qemu):
    for name in ("instance-0000002a.xml", "instance-0000002b.xml"):
        (qemu / name).unlink()
    assert guests.ensure_no_guests(NVIDIA_VFS) == []


def test_domains_reads_running_and_defined_guests_once_each(root, caplog):
    from unit_tests.libvirt import PROJECT_ID, PROJECT_NAME, defined_guest, running_guest
    running_guest(root, "instance-00000001", MDEV_GUEST, mdev_uuid=MDEV_UUID)  # + its definition
    defined_guest(root, "instance-00000002", VF_GUEST, pci_address="0000:c1:00.4",
                  project_id="ab" * 16, project_name="globex")
    defined_guest(root, "instance-00000003", NIC_GUEST)  # no hostdev: not even parsed
    (root / "etc/libvirt/qemu/instance-00000004.xml").write_text(
        '<!DOCTYPE d [<!ENTITY x "x">]><domain><devices><hostdev/></devices></domain>')
    found = guests.domains()
    assert [(d.name, d.state, d.mdevs, d.pci) for d in found] == [
        ("instance-00000001", "running", (MDEV_UUID,), ()),
        ("instance-00000002", "shut off", (), ("0000:c1:00.4",))]
    assert (found[0].uuid, found[0].project_id, found[0].project_name, found[0].nova_name) == (
        MDEV_GUEST, PROJECT_ID, PROJECT_NAME, "vm-instance-00000001")
    assert found[1].project_name == "globex"
    assert guests.held_devices() == ({MDEV_UUID}, {"0000:c1:00.4"},
                                     ["/etc/libvirt/qemu/instance-00000004.xml"])
    assert "instance-00000004.xml: DOCTYPE declarations are not accepted" in caplog.text


def test_held_devices_names_a_domain_directory_that_cannot_be_listed(root):
    from unit_tests.libvirt import running_guest
    running_guest(root, "instance-00000001", MDEV_GUEST, mdev_uuid=MDEV_UUID)
    defined = root / "etc/libvirt/qemu"
    for entry in defined.iterdir():
        entry.unlink()
    defined.rmdir()
    defined.write_text("")  # a file where the directory is expected: cannot be listed
    assert guests.held_devices() == ({MDEV_UUID}, set(), ["/etc/libvirt/qemu"])


def test_a_source_address_without_a_domain_is_in_domain_0000(root):
    from unit_tests.libvirt import defined_guest
    path = defined_guest(root, "instance-00000040", VF_GUEST, pci_address="0000:81:00.4")
    path.write_text(path.read_text().replace("<address domain='0x0000' bus='0x81'", "<address bus='0x81'"))
    assert "<address bus='0x81'" in path.read_text()
    assert guests.held_devices() == (set(), {"0000:81:00.4"}, [])


def test_a_file_without_a_domain_is_skipped_by_name(root, caplog):
    caplog.set_level(logging.WARNING)
    d = root / "run/libvirt/qemu"
    d.mkdir(parents=True)
    (d / "instance-00000050.xml").write_text("<domstatus><hostdev/></domstatus>")
    assert guests.domains() == []
    assert [r.getMessage() for r in caplog.records] == [
        "skipping /run/libvirt/qemu/instance-00000050.xml: no <domain> element"]


def test_a_capabilities_hostdev_is_not_a_pci_device(root):
    from unit_tests.libvirt import defined_guest
    path = defined_guest(root, "instance-00000040", VF_GUEST, pci_address="0000:81:00.4")
    path.write_text(path.read_text().replace("<hostdev mode='subsystem'", "<hostdev mode='capabilities'"))
    assert "mode='capabilities'" in path.read_text()
    assert guests.held_devices() == (set(), set(), [])


def test_only_novas_own_instance_metadata_names_the_guest(root):
    """Another tool's <instance> element, or Nova's other elements, never stand in for Nova's."""
    from unit_tests.libvirt import PROJECT_ID, PROJECT_NAME, running_guest
    path = running_guest(root, "instance-00000001", MDEV_GUEST, mdev_uuid=MDEV_UUID)
    others = ('<acme:instance xmlns:acme="http://acme.example/xmlns/instance/1.0">'
              '<acme:name>not-nova</acme:name><acme:owner><acme:project uuid="cd">acme</acme:project>'
              '</acme:owner></acme:instance>'
              '<nova:note xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">'
              '<nova:name>not-an-instance</nova:name></nova:note>')
    path.write_text(path.read_text().replace("<metadata>", "<metadata>" + others, 1))
    assert "acme:instance" in path.read_text()
    (found,) = [d for d in guests.domains() if d.state == "running"]
    assert (found.nova_name, found.project_id, found.project_name) == (
        "vm-instance-00000001", PROJECT_ID, PROJECT_NAME)


def test_a_guest_file_with_bytes_that_are_not_utf8_is_still_read(root):
    from unit_tests.libvirt import running_guest
    path = running_guest(root, "instance-00000001", MDEV_GUEST, mdev_uuid=MDEV_UUID,
                         project_name="caf\u00e9")
    path.write_bytes(path.read_bytes().replace("caf\u00e9".encode(), b"caf\xe9"))  # Latin-1
    assert b"caf\xe9<" in path.read_bytes()
    (found,) = [d for d in guests.domains() if d.state == "running"]
    assert (found.mdevs, found.project_name) == ((MDEV_UUID,), "caf\ufffd")


def test_a_running_domain_s_definition_is_not_read_for_the_counts(root, caplog):
    """The status file says what a running guest holds; its definition is not parsed again.

    libvirt names both files after the domain (whose name is unique on the host). A
    definition that would not parse costs nothing then: the status file is whole.
    """
    from unit_tests.libvirt import defined_guest, running_guest
    running_guest(root, "instance-00000001", VF_GUEST, pci_address="0000:c1:00.4")
    (root / "etc/libvirt/qemu/instance-00000001.xml").write_text("<domain><devices><hostdev")
    defined_guest(root, "instance-00000002", MDEV_GUEST, pci_address="0000:c1:00.5")
    assert [(d.name, d.state, d.pci) for d in guests.domains()] == [
        ("instance-00000001", "running", ("0000:c1:00.4",)),
        ("instance-00000002", "shut off", ("0000:c1:00.5",))]
    assert guests.held_devices() == (set(), {"0000:c1:00.4", "0000:c1:00.5"}, [])
    assert "skipping" not in caplog.text
    # Stopped: only the definition is left, and one that cannot be parsed counts as in use.
    (root / "run/libvirt/qemu/instance-00000001.xml").unlink()
    assert guests.held_devices() == (set(), {"0000:c1:00.5"},
                                     ["/etc/libvirt/qemu/instance-00000001.xml"])


def _status_with(text: str, before: str = "", after: str = "") -> str:
    """A status file with ``before`` and ``after`` in libvirt's private data around the domain."""
    return text.replace("<domain type='kvm' id='3'>", before + "<domain type='kvm' id='3'>", 1) \
        .replace("</domstatus>", after + "</domstatus>", 1)


@pytest.mark.parametrize("change", [
    # The QEMU capabilities and other private data: not read, whatever they hold.
    lambda text: _status_with(text, after="<qemuCaps>" + "<flag name='kvm'/>" * 300
                              + "</qemuCaps><blockjobs active='no'/>\n"),
    # A namespace declared on <domstatus> and used in the domain: read with the whole file.
    lambda text: text.replace("<domstatus ", "<domstatus xmlns:nova='http://openstack.org/"
                              "xmlns/libvirt/nova/1.1' ", 1).replace(
        '<nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">',
        "<nova:instance>", 1),
    # Not a status file's shape (no <domstatus> end): read whole, as before.
    lambda text: text.replace("</domstatus>", "</domstatus>\n<!-- trailing -->", 1),
])
def test_a_status_file_is_read_for_its_domain(root, change):
    from unit_tests.libvirt import hostdevs
    d = root / "run/libvirt/qemu"
    d.mkdir(parents=True)
    text = change(status("instance-00000001", VF_GUEST, hostdevs(pci_address="0000:c1:00.4")))
    (d / "instance-00000001.xml").write_text(text)
    (found,) = guests.domains()
    assert (found.name, found.uuid, found.state, found.pci, found.nova_name) == (
        "instance-00000001", VF_GUEST, "running", ("0000:c1:00.4",), "vm-instance-00000001")


@pytest.mark.parametrize("shape", [
    lambda text: text,  # as libvirt writes it: its warning comment first
    lambda text: text[text.index("<domstatus"):],  # as libvirt's own test data has it
    lambda text: "\n" + text + "\n",
])
def test_damage_in_libvirt_s_private_data_leaves_the_guest_counted_as_its_domain_says(root, shape):
    """Only the domain of a complete status file is read: what libvirt keeps beside it is not."""
    from unit_tests.libvirt import hostdevs
    d = root / "run/libvirt/qemu"
    d.mkdir(parents=True)
    text = status("instance-00000001", VF_GUEST, hostdevs(pci_address="0000:c1:00.4"))
    damaged = text.replace("<qemuCaps>", "<qemuCaps><flag name='kvm'>", 1)  # never closed
    (d / "instance-00000001.xml").write_text(shape(damaged))
    assert guests.held_devices() == (set(), {"0000:c1:00.4"}, [])


@pytest.mark.parametrize("damage", [
    lambda text: text.replace("</devices>", "</device>", 1),  # the domain itself
    lambda text: text[:text.rindex("</domain>") + len("</domain>")],  # cut short after it
])
def test_a_damaged_status_file_counts_as_in_use_even_where_its_domain_reads(root, caplog, damage):
    from unit_tests.libvirt import hostdevs
    d = root / "run/libvirt/qemu"
    d.mkdir(parents=True)
    text = status("instance-00000001", VF_GUEST, hostdevs(pci_address="0000:c1:00.4"))
    (d / "instance-00000001.xml").write_text(damage(text))
    assert guests.held_devices() == (set(), set(), ["/run/libvirt/qemu/instance-00000001.xml"])
    assert "not XML" in caplog.text


# -- how many guests a refusal names: a status line, read in `juju status` tables -------------

def shut_off(n: int) -> guests.Guest:
    return guests.Guest(f"instance-{n:08x}", f"0b7a0f2c-6f2d-4b3c-9b1e-{n:012x}", ("0000:c1:00.4",),
                        guests.SHUT_OFF, f"vm-{n}")


def unreadable(n: int) -> guests.Guest:
    return guests.Guest(f"/etc/libvirt/qemu/instance-{n:08x}.xml", "", (), guests.SHUT_OFF,
                        problem="not XML: no element found: line 1, column 0")


def test_up_to_three_guests_are_each_named_as_before():
    three = [shut_off(n) for n in range(3)]
    assert str(GuestsRunningError(three, unit="gpu-a/0")) == (
        "3 guest(s) hold vGPUs, running or shut off: "
        "instance-00000000 (vm-0, 0b7a0f2c-6f2d-4b3c-9b1e-000000000000, shut off), "
        "instance-00000001 (vm-1, 0b7a0f2c-6f2d-4b3c-9b1e-000000000001, shut off), "
        "instance-00000002 (vm-2, 0b7a0f2c-6f2d-4b3c-9b1e-000000000002, shut off)")
    assert str(GuestsRunningError(three[:1])) == (
        "1 guest(s) hold vGPUs, running or shut off: "
        "instance-00000000 (vm-0, 0b7a0f2c-6f2d-4b3c-9b1e-000000000000, shut off)")


def test_more_guests_name_three_count_the_rest_and_say_which_action_lists_them():
    held = [shut_off(n) for n in range(192)]
    error = GuestsRunningError(held, unit="gpu-a/0")
    assert str(error) == (
        "192 guest(s) hold vGPUs, running or shut off: "
        "instance-00000000 (vm-0, 0b7a0f2c-6f2d-4b3c-9b1e-000000000000, shut off), "
        "instance-00000001 (vm-1, 0b7a0f2c-6f2d-4b3c-9b1e-000000000001, shut off), "
        "instance-00000002 (vm-2, 0b7a0f2c-6f2d-4b3c-9b1e-000000000002, shut off) "
        "and 189 more (juju run gpu-a/0 vgpu-usage lists the vGPUs guests hold)")
    assert error.guests == held  # every one kept for the callers
    # Four: one more than named. Without the unit's name (an action's failure), the action's.
    assert str(GuestsRunningError(held[:4])).endswith(
        "instance-00000002 (vm-2, 0b7a0f2c-6f2d-4b3c-9b1e-000000000002, shut off) "
        "and 1 more (the vgpu-usage action lists the vGPUs guests hold)")


def test_files_that_cannot_be_read_are_named_first_since_no_action_lists_them():
    held = [shut_off(n) for n in range(5)] + [unreadable(0xff)]
    assert str(GuestsRunningError(held, unit="gpu-a/0")) == (
        "6 guest(s) hold vGPUs, running or shut off: "
        "/etc/libvirt/qemu/instance-000000ff.xml (not XML: no element found: line 1, column 0; "
        "counted as in use), "
        "instance-00000000 (vm-0, 0b7a0f2c-6f2d-4b3c-9b1e-000000000000, shut off), "
        "instance-00000001 (vm-1, 0b7a0f2c-6f2d-4b3c-9b1e-000000000001, shut off) "
        "and 3 more (juju run gpu-a/0 vgpu-usage lists the vGPUs guests hold)")
    # More of them than named: those left out are counted apart (vgpu-usage cannot list them).
    held = [shut_off(0)] + [unreadable(n) for n in range(5)]
    message = str(GuestsRunningError(held, unit="gpu-a/0"))
    assert message.count("counted as in use") == 4
    assert message.endswith(
        "/etc/libvirt/qemu/instance-00000002.xml (not XML: no element found: line 1, column 0; "
        "counted as in use) and 1 more (juju run gpu-a/0 vgpu-usage lists the vGPUs guests hold) "
        "and 2 more domain file(s) that cannot be read, counted as in use")


def test_domains_without_a_uuid_are_told_apart_by_their_names(root):
    from unit_tests.libvirt import defined_guest
    for n, vf in ((1, "0000:c1:00.4"), (2, "0000:c1:00.5")):
        path = defined_guest(root, f"instance-0000000{n}", VF_GUEST, pci_address=vf)
        path.write_text(path.read_text().replace(f"<uuid>{VF_GUEST}</uuid>", ""))
    assert [(d.name, d.uuid, d.pci) for d in guests.domains()] == [
        ("instance-00000001", "", ("0000:c1:00.4",)), ("instance-00000002", "", ("0000:c1:00.5",))]
