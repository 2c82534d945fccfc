"""Running libvirt guests that hold vGPUs.

libvirt keeps one status XML per running domain in ``/run/libvirt/qemu/``
(``<domstatus>`` wrapping ``<domain>``). A guest holds a vGPU when it has an
mdev hostdev, or a PCI hostdev whose source is one of the NVIDIA GPUs or VFs
given (the vendor-specific VFIO framework passes VFs as PCI devices). The
domain ``<uuid>`` is the Nova instance uuid.

``domains`` reads more for the usage report and the capacity count: every
domain libvirt knows, running (status XML) or only defined
(``/etc/libvirt/qemu``: Nova defines each instance persistently, so a
shut-off instance keeps its vGPU there), with the mdevs and PCI devices it
holds and the owner Nova wrote into ``<metadata><nova:instance>``:
``<nova:owner><nova:project uuid="...">name</nova:project>``. Nova's
namespace is ``http://openstack.org/xmlns/libvirt/nova/1.1`` (``1.0``
before); any version is read.

What guards a change (retyping a VF, taking an mdev type from a GPU, pausing
or upgrading the driver) is fail safe: a domain file that cannot be read or
parsed, or that declares a DOCTYPE (where entities would be declared: it is
never parsed), counts as a guest holding vGPUs, named by its path. The usage
report logs such files and skips them; the capacity count, told of them
(:func:`held_devices`), counts what no readable file holds as used, uncertain.
Only a file that is complete (it ends with its closing tag) and names no
``<hostdev`` is left unparsed.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, Iterable, Iterator, List, Optional, Set, Tuple

from . import hostroot
from .errors import GuestsRunningError, HostReadError
from .record import NamedTuple

if TYPE_CHECKING:  # parsing XML is imported only when a file has something to parse
    import xml.etree.ElementTree as ET

log = logging.getLogger(__name__)

STATUS_DIR = "run/libvirt/qemu"
DEFINED_DIR = "etc/libvirt/qemu"
NOVA_NS = "http://openstack.org/xmlns/libvirt/nova/"
RUNNING = "running"
SHUT_OFF = "shut off"


class Guest(NamedTuple):
    """A libvirt domain that holds vGPUs, as the guards against changing them see it."""
    name: str  # libvirt domain name, e.g. instance-0000002a; a file's host path for a problem
    instance_uuid: str  # domain <uuid> = Nova instance uuid
    vgpus: Tuple[str, ...]  # mdev uuids and PCI addresses (dddd:bb:dd.f) it holds
    state: str = RUNNING  # RUNNING, or SHUT_OFF when only its definition holds them
    nova_name: str = ""  # the instance's display name, from Nova's metadata
    problem: str = ""  # why its file could not be read or parsed: counted as holding any vGPU

    def describe(self) -> str:
        """``instance-0000002a (vm-1, <uuid>, shut off)``, or the file and why it counts."""
        if self.problem:
            return f"{self.name} ({self.problem}; counted as in use)"
        details = [d for d in (self.nova_name, self.instance_uuid) if d]
        if self.state != RUNNING:
            details.append(self.state)
        return f"{self.name} ({', '.join(details)})" if details else self.name


class HeldMdev(NamedTuple):
    """An mdev a running or defined domain holds, and where sysfs has it now."""
    guest: Guest
    uuid: str  # "" for a file that could not be read
    parent: Optional[str]  # the GPU or VF it was created on; None when it does not exist now
    type_id: Optional[str]  # its mdev type (nvidia-108); None when it does not exist now


def running_vgpu_guests(pci_addresses: Iterable[str]) -> List[Guest]:
    """Running guests holding an mdev or one of ``pci_addresses`` (see :func:`vgpu_guests`)."""
    return vgpu_guests(pci_addresses, defined=False)


def vgpu_guests(pci_addresses: Iterable[str], defined: bool = True) -> List[Guest]:
    """Guests holding an NVIDIA mdev or one of ``pci_addresses``, by name; then unreadable files.

    Running guests, and with ``defined`` the domains defined in
    ``/etc/libvirt/qemu`` too (a shut-off instance keeps its devices). A
    domain both running and defined is one guest, holding what either file
    names. Raises HostReadError when a domain directory cannot be listed.
    """
    wanted = {a.strip().lower() for a in pci_addresses}
    holders, problems = _holders(defined)
    found = []
    for guest, devices in holders:
        vgpus = _vgpus(devices, wanted)
        if vgpus:
            found.append(guest._replace(vgpus=vgpus))
    return sorted(found) + problems


def held_mdevs() -> List[HeldMdev]:
    """Every mdev a running or defined domain holds, with its parent and type; unreadable files last.

    Raises HostReadError when a domain directory cannot be listed.
    """
    holders, problems = _holders(defined=True)
    out = []
    for guest, devices in sorted(holders):
        for kind, value in devices:
            if kind == "mdev":
                parent, type_id = _mdev_where(value) or (None, None)
                out.append(HeldMdev(guest._replace(vgpus=(value,)), value, parent, type_id))
    return out + [HeldMdev(problem, "", None, None) for problem in problems]


def _holders(defined: bool) -> Tuple[List[Tuple[Guest, List[Tuple[str, str]]]], List[Guest]]:
    """(each domain with its hostdevs, merged by uuid; a Guest per file that cannot be read)."""
    merged: Dict[str, Tuple[Guest, List[Tuple[str, str]]]] = {}
    problems: List[Guest] = []
    running = _listed(STATUS_DIR)
    places = [running, _listed(DEFINED_DIR)] if defined else [running]
    names = {path.name for path in running}  # libvirt names both files after the domain
    for paths in places:
        for path in paths:
            state = RUNNING if path.name in names else SHUT_OFF
            domain, problem = _parse(path, require="<hostdev")
            if problem:
                problems.append(Guest(hostroot.shown(path), "", (), state, problem=problem))
            if domain is None:
                continue
            devices = list(_hostdevs(domain))
            uuid = (domain.findtext("uuid") or "").strip().lower()
            name = (domain.findtext("name") or path.stem).strip()
            key = uuid or name
            if key in merged:
                merged[key][1].extend(d for d in devices if d not in merged[key][1])
            elif devices:
                merged[key] = (Guest(name, uuid, (), state, _nova_metadata(domain)["nova_name"]),
                               devices)
    return list(merged.values()), problems


def _listed(directory: str) -> List[Path]:
    """The ``*.xml`` files of a domain directory, sorted; HostReadError if it cannot be listed."""
    where = hostroot.path(directory)
    names = hostroot.listdir(where)
    if names is None:
        return []
    return [where / name for name in sorted(names) if name.endswith(".xml")]


class Domain(NamedTuple):
    """A libvirt domain holding host devices, with what Nova says about it."""

    name: str
    uuid: str
    state: str  # RUNNING or SHUT_OFF
    mdevs: Tuple[str, ...] = ()  # mdev uuids
    pci: Tuple[str, ...] = ()  # PCI addresses (dddd:bb:dd.f) passed through
    nova_name: str = ""  # the instance's display name
    project_id: str = ""
    project_name: str = ""


def domains(problems: Optional[List[str]] = None) -> List[Domain]:
    """Domains that hold an mdev or a PCI device: running ones, then shut-off ones.

    A domain both running and defined is read from its status XML only.
    Files without a ``<hostdev`` are not parsed at all (update-status reads
    these to count capacity). Each file that cannot be read or parsed is
    logged and skipped, and its host path added to ``problems`` when given.
    """
    out: Dict[str, Domain] = {}
    running: Set[str] = set()  # libvirt names both files after the domain, whose name is unique
    for directory, state in ((STATUS_DIR, RUNNING), (DEFINED_DIR, SHUT_OFF)):
        for path in _xml_files(hostroot.path(directory), problems):
            if state == RUNNING:
                running.add(path.name)
            elif path.name in running:
                continue  # a running domain's definition: its status file said what it holds
            domain = _domain(path, require="<hostdev", problems=problems)
            if domain is None:
                continue
            uuid = (domain.findtext("uuid") or "").strip().lower()
            name = (domain.findtext("name") or path.stem).strip()
            key = uuid or name
            if key in out:
                continue
            mdevs, pci = _devices(domain)
            if mdevs or pci:
                out[key] = Domain(name=name, uuid=uuid, state=state, mdevs=mdevs, pci=pci,
                                  **_nova_metadata(domain))
    return list(out.values())


def _xml_files(directory: Path, problems: Optional[List[str]] = None) -> List[Path]:
    """``directory``'s ``*.xml`` entries, sorted, as ``Path.glob`` gives them.

    None if it does not exist; none either if it cannot be listed, and then its
    host path is added to ``problems``.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    except OSError as error:
        log.warning("%s", hostroot.unreadable(directory, error))
        if problems is not None:
            problems.append(hostroot.shown(directory))
        return []
    return sorted(directory / name for name in names if name.endswith(".xml"))


def held_devices() -> Tuple[Set[str], Set[str], List[str]]:
    """(mdev uuids, PCI addresses) that any running or defined domain holds; unreadable files.

    The host paths of the domain files that could not be read or parsed come
    last: what they hold cannot be told.
    """
    mdevs: Set[str] = set()
    pci: Set[str] = set()
    problems: List[str] = []
    for domain in domains(problems):
        mdevs.update(domain.mdevs)
        pci.update(domain.pci)
    return mdevs, pci, problems


def ensure_no_guests(pci_addresses: Iterable[str], force: bool = False,
                     defined: bool = False, unit: str = "") -> List[Guest]:
    """Raise GuestsRunningError if guests hold vGPUs, unless ``force``; return them.

    Running guests only, or with ``defined`` shut-off ones too (see :func:`vgpu_guests`).
    ``unit``: this unit's name, for the ``juju run`` that lists the guests the error
    does not name.
    """
    guests = vgpu_guests(pci_addresses, defined=defined)
    if guests and not force:
        raise GuestsRunningError(guests, unit)
    if guests:
        log.warning("forced past %d running vGPU guest(s): %s",
                    len(guests), ", ".join(g.name for g in guests))
    return guests


def _domain(path: Path, require: str = "",
            problems: Optional[List[str]] = None) -> Optional[ET.Element]:
    """The ``<domain>`` element of a status or domain XML file, or None (logged when unreadable).

    A complete file whose text lacks ``require`` is skipped unparsed. The host
    path of a file that cannot be read or parsed is added to ``problems``.
    """
    domain, problem = _parse(path, require)
    if problem:
        log.warning("skipping %s: %s", hostroot.shown(path), problem)
        if problems is not None:
            problems.append(hostroot.shown(path))
    return domain


def _parse(path: Path, require: str = "") -> Tuple[Optional[ET.Element], str]:
    """(the ``<domain>`` element or None, why the file could not be read or parsed or "")."""
    try:
        text = hostroot.read_text(path, clean=False)
    except HostReadError as error:
        return None, str(error)
    if text is None:
        return None, ""  # gone since it was listed (the guest stopped)
    if require and require not in text and text.rstrip().endswith(("</domain>", "</domstatus>")):
        return None, ""  # complete, and names no such element
    # Entities can only be declared inside a DOCTYPE: without one, nothing expands.
    if "<!DOCTYPE" in text:
        return None, "DOCTYPE declarations are not accepted"
    import xml.etree.ElementTree as ET

    inner = _status_domain(text)
    if inner is not None:
        return inner, ""
    try:
        root = ET.fromstring(text)
    except ET.ParseError as e:
        return None, f"not XML: {e}"
    if root.tag == "domain":
        return root, ""
    found = root.find("domain") if root.tag == "domstatus" else None
    return (found, "") if found is not None else (None, "no <domain> element")


def _status_domain(text: str) -> Optional[ET.Element]:
    """The ``<domain>`` of a complete status file, parsed alone; None to parse the whole file.

    libvirt writes a running guest's status file as ``<domstatus>`` around its own
    private data (``qemuDomainObjPrivateXMLFormat``: the QEMU capabilities, a few
    hundred ``<flag>`` lines, vCPU threads, block jobs), then the live ``<domain>``
    (``virDomainDefFormat``), and none of that private data is read here, so what it
    holds, damaged or not, changes nothing; the file is replaced whole
    (``virFileRewrite``). A domain that does not parse on its own (a namespace prefix
    declared outside it, say) is read with the whole file.
    """
    import xml.etree.ElementTree as ET

    if not (text.lstrip().startswith(("<!--", "<domstatus"))
            and text.rstrip().endswith("</domstatus>")):
        return None
    start, end = text.find("<domain "), text.rfind("</domain>")
    if not 0 <= start < end:
        return None
    try:  # what parses from "<domain " on is a <domain> element
        return ET.fromstring(text[start:end + len("</domain>")])
    except ET.ParseError:
        return None


def _vgpus(devices: Iterable[Tuple[str, str]], wanted: Set[str]) -> Tuple[str, ...]:
    found = []
    for kind, value in devices:
        if kind == "mdev":
            parent = _mdev_parent(value)
            # An mdev of another vendor's parent (Intel GVT-g) is not a vGPU of ours;
            # one whose parent cannot be found is counted, to be safe.
            if parent is None or parent in wanted:
                found.append(value)
        elif value in wanted:
            found.append(value)
    return tuple(found)


def _devices(domain: ET.Element) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(mdev uuids, PCI addresses) of the domain's subsystem hostdevs, in order."""
    pairs = list(_hostdevs(domain))
    return (tuple(value for kind, value in pairs if kind == "mdev"),
            tuple(value for kind, value in pairs if kind == "pci"))


def _hostdevs(domain: ET.Element) -> Iterator[Tuple[str, str]]:
    """``("mdev", uuid)`` or ``("pci", address)`` per subsystem hostdev of the domain, in order."""
    for hostdev in domain.findall("./devices/hostdev"):
        if hostdev.get("mode", "subsystem") != "subsystem":
            continue
        address = hostdev.find("./source/address")
        if address is None:
            continue
        kind = hostdev.get("type")
        uuid = (address.get("uuid") or "").strip().lower()
        if kind == "mdev" and uuid:
            yield "mdev", uuid
        elif kind == "pci":
            found = _pci(address)
            if found:
                yield "pci", found


def _nova_metadata(domain: ET.Element) -> Dict[str, str]:
    """Instance name and project from ``<metadata><nova:instance>``; empty if absent."""
    out = {"nova_name": "", "project_id": "", "project_name": ""}
    metadata = domain.find("metadata")
    if metadata is None:
        return out
    for instance in metadata:
        namespace, _, local = instance.tag.rpartition("}")
        if local != "instance" or not namespace.startswith("{" + NOVA_NS):
            continue
        ns = namespace + "}"
        out["nova_name"] = _text(instance.findtext(f"{ns}name"))
        project = instance.find(f"{ns}owner/{ns}project")
        if project is not None:
            out["project_id"] = _text(project.get("uuid")).lower()
            out["project_name"] = _text(project.text)
        break
    return out


def _text(value: Optional[str], limit: int = 255) -> str:
    """One line of printable text, bounded (names reach action results)."""
    text = " ".join("".join(c if c.isprintable() else " " for c in (value or "")).split())
    return text[:limit]


def _mdev_parent(uuid: str) -> Optional[str]:
    """The PCI address of the device an mdev was created on (``sys/bus/mdev/devices``)."""
    where = _mdev_where(uuid)
    return where[0] if where else None


def _mdev_where(uuid: str) -> Optional[Tuple[str, str]]:
    """(parent address, mdev type) of a created mdev; None when it does not exist now."""
    if not re.fullmatch(r"[0-9a-f-]{36}", uuid):
        return None
    try:
        device = os.path.realpath(hostroot.path("sys/bus/mdev/devices", uuid), strict=True)
        type_dir = os.path.realpath(os.path.join(device, "mdev_type"), strict=True)
    except OSError:
        return None
    return os.path.basename(os.path.dirname(device)), os.path.basename(type_dir)


def _pci(address: ET.Element) -> Optional[str]:
    """``<address domain='0x0000' bus='0xc1' slot='0x00' function='0x4'/>`` as 0000:c1:00.4."""
    try:
        d, b, s, f = (int(address.get(k, "0x0000" if k == "domain" else ""), 0)
                      for k in ("domain", "bus", "slot", "function"))
    except ValueError:
        return None
    return f"{d:04x}:{b:02x}:{s:02x}.{f:x}"
