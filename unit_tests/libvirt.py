"""libvirt's XML for Nova's guests, as libvirt and Nova write it.

Status files of running guests in
/run/libvirt/qemu (``<domstatus>`` around the ``<domain>``) and the
persistent definitions in /etc/libvirt/qemu (a bare ``<domain>``), with the
``<nova:instance>`` metadata Nova writes (namespace .../nova/1.1).
"""

from pathlib import Path
from typing import Optional

PROJECT_ID = "8f1c2a7d5e3b4c6a9d0e1f2a3b4c5d6e"
# A status file's QEMU capabilities run to hundreds of <flag> lines: libvirt's own status
# file test data (tests/qemustatusxml2xmldata/modern-in.xml, 16.5 KB) lists 230. Only their
# number and size are kept here (the names are filler); the charm reads none of them.
QEMU_CAPS = "\n".join(["    <flag name='kvm'/>"]
                      + [f"    <flag name='capability-{n:03d}'/>" for n in range(1, 230)])
PROJECT_NAME = "acme-render"

STATUS = """<!--
WARNING: THIS IS AN AUTO-GENERATED FILE. CHANGES TO IT ARE LIKELY TO BE
OVERWRITTEN AND LOST. Changes to this xml configuration should be made using:
  virsh edit {name}
or other application using the libvirt API.
-->

{domstatus_open}
  <taint flag='high-privileges'/>
  <monitor path='/var/lib/libvirt/qemu/domain-3-{name}/monitor.sock' type='unix'/>
  <vcpus>
    <vcpu id='0' pid='41384'/>
  </vcpus>
  <qemuCaps>
{qemu_caps}
  </qemuCaps>
  <domain type='kvm'{domain_id}>
    <name>{name}</name>
    <uuid>{uuid}</uuid>
    <metadata>
      <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
        <nova:package version="29.0.0"/>
        <nova:name>vm-{name}</nova:name>
        <nova:creationTime>2026-11-20 10:11:12</nova:creationTime>
        <nova:flavor name="vgpu.large">
          <nova:memory>8192</nova:memory>
          <nova:disk>40</nova:disk>
          <nova:swap>0</nova:swap>
          <nova:ephemeral>0</nova:ephemeral>
          <nova:vcpus>4</nova:vcpus>
        </nova:flavor>
        <nova:owner>
          <nova:user uuid="5d2e7c1a9b3f4e8d8c6b0a1f2e3d4c5b">alice</nova:user>
          <nova:project uuid="{project_id}">{project_name}</nova:project>
        </nova:owner>
        <nova:root type="image" uuid="0e5d3f1a-7c2b-4a9e-8d6f-1b2c3d4e5f60"/>
      </nova:instance>
    </metadata>
    <memory unit='KiB'>8388608</memory>
    <os>
      <type arch='x86_64' machine='pc-q35-8.2'>hvm</type>
    </os>
    <devices>
      <emulator>/usr/bin/qemu-system-x86_64</emulator>
      <disk type='file' device='disk'>
        <driver name='qemu' type='qcow2' cache='none'/>
        <source file='/var/lib/nova/instances/{uuid}/disk' index='1'/>
        <target dev='vda' bus='virtio'/>
      </disk>
      <interface type='ethernet'>
        <mac address='fa:16:3e:2c:1b:9d'/>
        <target dev='tap5e2c1b9d-ab'/>
        <model type='virtio'/>
      </interface>
{hostdevs}
    </devices>
  </domain>
{domstatus_close}"""

MDEV = """      <hostdev mode='subsystem' type='mdev' managed='no' model='vfio-pci' display='off'>
        <source>
          <address uuid='{uuid}'/>
        </source>
        <alias name='hostdev0'/>
        <address type='pci' domain='0x0000' bus='0x00' slot='0x05' function='0x0'/>
      </hostdev>"""

PCI = """      <hostdev mode='subsystem' type='pci' managed='{managed}'>
        <driver name='vfio'/>
        <source>
          <address domain='{domain}' bus='{bus}' slot='0x00' function='{fn}'/>
        </source>
        <alias name='hostdev0'/>
        <address type='pci' domain='0x0000' bus='0x00' slot='0x06' function='0x0'/>
      </hostdev>"""

def status(name, uuid, hostdevs="", project_id=PROJECT_ID, project_name=PROJECT_NAME):
    """A running guest's status XML."""
    return STATUS.format(name=name, uuid=uuid, hostdevs=hostdevs, project_id=project_id,
                         project_name=project_name, domain_id=" id='3'", qemu_caps=QEMU_CAPS,
                         domstatus_open="<domstatus state='running' reason='booted' pid='41377'>",
                         domstatus_close="</domstatus>\n")


def definition(name, uuid, hostdevs="", project_id=PROJECT_ID, project_name=PROJECT_NAME):
    """The persistent definition libvirt keeps in /etc/libvirt/qemu (no status wrapper)."""
    text = STATUS.format(name=name, uuid=uuid, hostdevs=hostdevs, project_id=project_id,
                         project_name=project_name, domain_id="", qemu_caps="", domstatus_open="",
                         domstatus_close="")
    body = text[text.index("<domain"):]
    header = text[:text.index("-->") + 4]
    # Drop the status-only elements before the domain, keep the warning comment.
    return header + "\n" + "\n".join(line[2:] if line.startswith("  ") else line
                                     for line in body.splitlines()) + "\n"


def hostdevs(mdev_uuid: Optional[str] = None, pci_address: Optional[str] = None) -> str:
    out = ""
    if mdev_uuid:
        out += MDEV.format(uuid=mdev_uuid)
    if pci_address:
        domain, bus, rest = pci_address.split(":")
        slot, fn = rest.split(".")
        out += PCI.format(managed="no", domain=f"0x{domain}", bus=f"0x{bus}", fn=f"0x{fn}").replace(
            "slot='0x00' function", f"slot='0x{slot}' function", 1)
    return out


def running_guest(root, name: str, uuid: str, mdev_uuid: Optional[str] = None,
                  pci_address: Optional[str] = None, project_id: str = PROJECT_ID,
                  project_name: str = PROJECT_NAME) -> Path:
    """Write a running guest holding an mdev vGPU or a PCI device (``dddd:bb:ss.f``).

    Nova defines every instance persistently too, so its definition is
    written to /etc/libvirt/qemu as well.
    """
    devices = hostdevs(mdev_uuid, pci_address)
    defined_guest(root, name, uuid, mdev_uuid, pci_address, project_id, project_name)
    directory = Path(root) / "run/libvirt/qemu"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.xml"
    path.write_text(status(name, uuid, devices, project_id, project_name))
    return path


def defined_guest(root, name: str, uuid: str, mdev_uuid: Optional[str] = None,
                  pci_address: Optional[str] = None, project_id: str = PROJECT_ID,
                  project_name: str = PROJECT_NAME) -> Path:
    """Write only the persistent definition: a shut-off instance."""
    directory = Path(root) / "etc/libvirt/qemu"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.xml"
    path.write_text(definition(name, uuid, hostdevs(mdev_uuid, pci_address), project_id,
                               project_name))
    return path


BROKEN = "<domain type='kvm'><name>cut short</name><devices><hostdev mode='subsystem' type='pci'"


def broken_guest(root, name: str, running: bool = False, text: str = BROKEN) -> Path:
    """A domain file that cannot be parsed (cut short while written, or damaged).

    In /etc/libvirt/qemu (a defined domain) or, with ``running``, in /run/libvirt/qemu.
    """
    directory = Path(root) / ("run/libvirt/qemu" if running else "etc/libvirt/qemu")
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.xml"
    path.write_text(text)
    return path
