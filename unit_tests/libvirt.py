"""libvirt's status XML for running guests, as it writes them in /run/libvirt/qemu."""

from pathlib import Path
from typing import Optional

STATUS = """<!--
WARNING: THIS IS AN AUTO-GENERATED FILE. CHANGES TO IT ARE LIKELY TO BE
OVERWRITTEN AND LOST. Changes to this xml configuration should be made using:
  virsh edit {name}
or other application using the libvirt API.
-->

<domstatus state='running' reason='booted' pid='41377'>
  <taint flag='high-privileges'/>
  <monitor path='/var/lib/libvirt/qemu/domain-3-{name}/monitor.sock' type='unix'/>
  <vcpus>
    <vcpu id='0' pid='41384'/>
  </vcpus>
  <qemuCaps>
    <flag name='kvm'/>
  </qemuCaps>
  <domain type='kvm' id='3'>
    <name>{name}</name>
    <uuid>{uuid}</uuid>
    <metadata>
      <nova:instance xmlns:nova="http://openstack.org/xmlns/libvirt/nova/1.1">
        <nova:package version="29.0.0"/>
        <nova:name>vm-{name}</nova:name>
        <nova:flavor name="vgpu.large"><nova:memory>8192</nova:memory></nova:flavor>
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
</domstatus>
"""

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
          <address domain='0x0000' bus='{bus}' slot='0x00' function='{fn}'/>
        </source>
        <alias name='hostdev0'/>
        <address type='pci' domain='0x0000' bus='0x00' slot='0x06' function='0x0'/>
      </hostdev>"""

def status(name, uuid, hostdevs=""):
    return STATUS.format(name=name, uuid=uuid, hostdevs=hostdevs)


def running_guest(root, name: str, uuid: str, mdev_uuid: Optional[str] = None,
                  pci_address: Optional[str] = None) -> Path:
    """Write a running guest holding an mdev vGPU or a PCI device (``dddd:bb:ss.f``)."""
    hostdevs = ""
    if mdev_uuid:
        hostdevs += MDEV.format(uuid=mdev_uuid)
    if pci_address:
        domain, bus, rest = pci_address.split(":")
        hostdevs += PCI.format(managed="no", bus=f"0x{bus}", fn=f"0x{rest.split('.')[1]}")
    directory = Path(root) / "run/libvirt/qemu"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.xml"
    path.write_text(status(name, uuid, hostdevs))
    return path
