"""Which PCI function gets which vGPU type: one plan for both NVIDIA frameworks. Pure.

The checked option maps selectors to GPUs: a type id (``nvidia-1139``), the
driver's name for a type (``NVIDIA L40S-12Q``), that name without its vendor
(``L40S-12Q``, ``RTX Pro 6000 Blackwell DC-8Q``) or the short form of NVIDIA's
tables (``DC-8Q``), each resolved on every GPU it names, and refused where it
names two types; the value is a list of addresses or ``all`` (every NVIDIA
GPU on the host that offers it). Type ids change between driver branches
(``L40S-12Q`` is 1139 on one, 1153 on another): names are resolved on the
driver that runs. The plan then says,
function by function, what Nova gets:

* mediated devices on a GPU without SR-IOV (V100): the GPU itself;
* mediated devices on SR-IOV VFs (A100): a GPU named by its own address
  expands to its first ``max_instance`` VFs in ``virtfn`` order; a VF
  address is taken as given;
* vendor-specific VFIO (L40S, H100, H200): the first VFs that the profile
  fits (the GPU's largest profile's framebuffer over this one's), or the VFs
  given. The charm writes the type to each (see :mod:`vgpu.vfio`) and Nova
  takes them as PCI devices.

A GPU takes one time-sliced profile (mixed-size mode is refused), or one
MIG-backed profile (``H200X-1-18C``; see :mod:`vgpu.mig`), never both kinds:
Nova gives all VFs of one GPU one resource class.
"""

from __future__ import annotations

import re
from typing import (
    TYPE_CHECKING,
    Collection,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Set,
    Tuple,
)

from . import LIVE_MIGRATION, ONE_TIME_USE, PCI_IN_PLACEMENT, pci, profiles, releases
from .record import NamedTuple

if TYPE_CHECKING:
    from . import migplan
    from .guests import HeldMdev

CLASS_PREFIX = "CUSTOM_VGPU_"  # the Placement resource class of a profile: CUSTOM_VGPU_L40S_12Q
WHOLE_PREFIX = "CUSTOM_GPU_"  # the resource class of a whole GPU given to guests: CUSTOM_GPU_L40S
PASSTHROUGH = "passthrough"  # the mapping's key for whole GPUs (vgpu.mappings.PASSTHROUGH)
# Nova's device types (nova/virt/libvirt/host.py, _get_device_type): a function whose libvirt
# node device has the virt_functions capability is type-PF, which libvirt gives every
# SR-IOV-capable function (sriov_totalvfs above 0), VFs enabled or not; any other, type-PCI.
TYPE_PF = "type-PF"
TYPE_PCI = "type-PCI"
ONE_TIME_USE_MAJOR = 32  # Nova 2025.2 flamingo: device_spec's one_time_use

ALL = "all"
_TYPE_ID = re.compile(r"nvidia-([0-9]+)")
_CLASS_CHARACTERS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")  # the rest become "_"


class Assignment(NamedTuple):
    """One PCI function Nova gets, with the type it serves."""

    gpu: str  # the physical GPU's address
    address: str  # the function Nova gets: the GPU itself or one of its VFs
    number: int  # vGPU type id
    name: str  # the driver's name for it, e.g. NVIDIA L40S-12Q
    framework: str
    product_id: str = ""  # the function's PCI device id, 4 hex digits (VFIO)

    @property
    def type_id(self) -> str:
        """The type as Nova names it: ``nvidia-<number>``."""
        return f"nvidia-{self.number}"

    @property
    def resource_class(self) -> str:
        """The placement resource class this type is published under."""
        return resource_class(self.name)


class Whole(NamedTuple):
    """A GPU given whole to guests (the mapping's ``passthrough``): no VFs, no vGPU type."""

    address: str
    product_id: str  # its PCI device id, 4 hex digits (its VFs, where any, share it)
    model: str
    device_type: str  # what Nova calls it: TYPE_PF (SR-IOV-capable) or TYPE_PCI
    driver: Optional[str] = None  # the driver it is bound to now

    @property
    def resource_class(self) -> str:
        """``NVIDIA L40S`` -> ``CUSTOM_GPU_L40S``: whole GPUs' own class in Placement."""
        return WHOLE_PREFIX + re.sub(r"[^A-Z0-9]", "_", _model_word(self.model).upper())

    @property
    def alias_name(self) -> str:
        """``NVIDIA L40S`` -> ``gpu-l40s``: the ``[pci] alias`` of the whole GPU."""
        return "gpu-" + re.sub(r"[^a-z0-9]+", "-", _model_word(self.model).lower()).strip("-")


def _model_word(model: str) -> str:
    """The model without its vendor: ``NVIDIA L40S`` -> ``L40S`` (never empty)."""
    return re.sub(r"^(?:NVIDIA|GRID)\s+", "", model.strip(), flags=re.IGNORECASE) or "gpu"


def whole_gpu(gpu: pci.Gpu) -> Whole:
    """``gpu`` as a whole GPU Nova takes: its product id and Nova's device type for it."""
    return Whole(gpu.address, _hex4(gpu.device_id), gpu.model,
                 TYPE_PF if gpu.sriov else TYPE_PCI, gpu.driver)


# A type name's board and profile, as NVIDIA names them: ``L40S-12Q``, ``H200X-1-18C`` (MIG-backed:
# slices, then framebuffer and series), ``RTX6000-Ada-12Q``, ``DC-4-24C`` (the RTX PRO 6000
# Blackwell's last word). The board is everything before the profile.
_BOARD = re.compile(r"(?P<board>.+?)-(?:\d+-)?\d+[A-Z]+", re.IGNORECASE)


def unoffered_note(key: str) -> str:
    """The plan's note for a key of value ``all`` no GPU here offers."""
    return f"{key}: no GPU on this host offers it, nothing published for it"


def board(name: str) -> Optional[str]:
    """The board a type name is of (upper-cased): ``L40S`` in ``L40S-12Q``; None for an id.

    ``A100`` and ``A100D``, ``L40`` and ``L40S`` are different boards.
    """
    match = _BOARD.fullmatch(profiles.short_name(profiles.profile_name(name)))
    return match.group("board").upper() if match else None


class Plan(NamedTuple):
    """Which function gets which type, or why the mapping cannot be applied here."""
    assignments: Tuple[Assignment, ...] = ()
    errors: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()  # e.g. a key of value `all` that no GPU here offers
    missing_vfs: Tuple[str, ...] = ()  # SR-IOV GPUs whose VFs are not enabled yet
    passthrough: Tuple[Whole, ...] = ()  # GPUs given whole to guests, by address
    unoffered: Tuple[str, ...] = ()  # keys of value `all` no GPU here offers (another board's)

    @property
    def ok(self) -> bool:
        """True when the plan can be applied and published."""
        return not self.errors

    def mdev_mapping(self) -> Dict[str, Tuple[str, ...]]:
        """``{type id: sorted addresses}`` for the mdev framework, types by number."""
        out: Dict[int, set] = {}
        for a in self.assignments:
            if a.framework == pci.MDEV:
                out.setdefault(a.number, set()).add(a.address)
        return {f"nvidia-{n}": tuple(sorted(out[n])) for n in sorted(out)}

    def mdev_names(self) -> Dict[str, str]:
        """``{type id: driver name}`` of the mediated-device types in the plan."""
        return {a.type_id: a.name for a in self.assignments if a.framework == pci.MDEV}

    def vfio(self) -> Tuple[Assignment, ...]:
        """VFIO assignments in address order."""
        return tuple(sorted((a for a in self.assignments if a.framework == pci.VFIO),
                            key=lambda a: a.address))


def resource_class(name: str) -> str:
    """``NVIDIA L40S-12Q`` -> ``CUSTOM_VGPU_L40S_12Q`` (already in Placement's normal form)."""
    short = profiles.profile_name(name).upper()
    return CLASS_PREFIX + "".join(c if c in _CLASS_CHARACTERS else "_" for c in short)


def flavor_property(vgpu_type: pci.VgpuType, framework: Optional[str], mdev_class: bool) -> str:
    """The flavor extra spec that asks for one vGPU of this type."""
    if framework == pci.VFIO:
        return f"pci_passthrough:alias={alias_name(vgpu_type.name)}:1"
    if mdev_class:
        return f"resources:{resource_class(vgpu_type.name)}=1"
    return "resources:VGPU=1"


def vfio_fits(gpu: pci.Gpu, vgpu_type: pci.VgpuType, whole_gb: Optional[int] = None) -> Optional[int]:
    """How many vGPUs of a time-sliced VFIO type one GPU holds, counted as a mapping counts them.

    The profile's framebuffer against the whole GPU's, at most one per VF (see
    :func:`_fits`); None when that cannot be told (a partly used GPU whose
    whole framebuffer is unknown, a name that is no profile).
    """
    fits = _fits(gpu, vgpu_type, (), pci.VFIO, whole_gb)
    return fits if fits >= 0 else None


def alias_name(name: str) -> str:
    """``NVIDIA L40S-12Q`` -> ``vgpu-l40s-12q`` (a [pci] alias name)."""
    return "vgpu-" + re.sub(r"[^a-z0-9]+", "-", profiles.profile_name(name).lower()).strip("-")


def build(mapping: Mapping[str, Sequence[str]], host: pci.Host, release=None,
          offered: Optional[Mapping[str, Tuple[pci.VgpuType, ...]]] = None, *,
          pci_in_placement: bool = False, live_migration: bool = False,
          whole_gpus: Optional[Mapping[str, int]] = None, vanished: Collection[str] = (),
          passthrough: Sequence[str] = (), one_time_use: bool = False,
          other_drivers: Optional[Mapping[str, Mapping[str, str]]] = None) -> Plan:
    """The plan for a checked mapping on ``host``; ``offered`` adds learnt VFIO types per GPU.

    ``pci_in_placement`` and ``live_migration`` are the charm options of
    those names: what the plan needs of Nova follows from them (see
    :func:`option_problems`). ``whole_gpus``: each VFIO GPU's whole
    framebuffer in GB when known (:func:`vgpu.catalogue.whole_gpus`).
    ``vanished``: published functions discovery no longer finds; an address
    of their GPU (see :func:`same_gpu`) gets nothing and is no error: the
    charm keeps what was published for it (:func:`vgpu.novaconf.keep_published`).
    ``passthrough``: GPUs given whole to guests (never part of ``all``, never
    also under a type); ``one_time_use``: the option asking Nova to mark them
    used up once a guest had them (see :func:`option_problems`).
    ``other_drivers``: per GPU, the profile names (upper-cased) the catalogue
    learnt for its model under another driver, with that driver's version.
    """
    draft = _Draft(host, offered, whole_gpus)
    draft.other_drivers = dict(other_drivers or {})
    draft.vanished = tuple(vanished)
    draft.take_whole(passthrough)
    if profiles.mig_backed(mapping):  # refused by name: a VF lists no type without its instance
        from . import migplan

        mixed = migplan.mixed(mapping, host)
        draft.errors.extend(migplan.one_per_gpu(host.gpu(gpu), names) for gpu, names in mixed.items())
    for key, addresses in mapping.items():
        if tuple(addresses) == (ALL,):
            draft.everywhere(key)
        else:
            mig_backed = profiles.mig_profile(key) is not None
            draft.at(key, [a for a in addresses if not (
                mig_backed and getattr(host.gpu(a), "address", "") in mixed)])
    assignments = draft.assignments(release)
    errors = draft.errors
    single = _single_type_problem(assignments, release)
    if single:
        errors.insert(0, single)
    errors.extend(_shared_class_problems(assignments))
    errors.extend(option_problems(assignments, release, pci_in_placement=pci_in_placement,
                                  live_migration=live_migration))
    wholes = tuple(whole_gpu(draft.owner[a]) for a in sorted(draft.passthrough))
    errors.extend(whole_problems(wholes, release, pci_in_placement=pci_in_placement,
                                 one_time_use=one_time_use))
    return Plan(assignments=tuple(sorted(assignments, key=lambda a: a.address)),
                errors=tuple(dict.fromkeys(errors)), notes=tuple(draft.notes),
                missing_vfs=tuple(sorted(set(draft.missing))), passthrough=wholes,
                unoffered=tuple(draft.unoffered))


def whole_problems(wholes: Sequence[Whole], release, *, pci_in_placement: bool,
                   one_time_use: bool) -> List[str]:
    """What the options ask for whole GPUs that Nova would refuse (nova-compute would not start).

    ``one_time_use`` needs Nova 32 (2025.2 flamingo), which alone knows it, and
    ``[pci] report_in_placement``: Nova 32's PciDeviceSpec raises
    PciConfigInvalidSpec ("one_time_use=true requires pci.report_in_placement
    to be enabled", nova/pci/devspec.py) and nova-compute stops.
    """
    problems: List[str] = []
    if not wholes:
        return problems
    wide = [w.address for w in wholes if not _addressable(w.address)]
    problems.extend(f"{PASSTHROUGH}: GPU {a} is in PCI domain {a.split(':', 1)[0]}, above ffff, "
                    "which Nova refuses (nova-compute would stop); turn VMD off for its slot"
                    for a in wide)
    if one_time_use and not pci_in_placement:
        problems.append(f"{ONE_TIME_USE} needs {PCI_IN_PLACEMENT}=true: Nova accepts "
                        "one_time_use only with [pci] report_in_placement (nova-compute would "
                        f"not start); set {PCI_IN_PLACEMENT}=true or {ONE_TIME_USE}=false")
    if one_time_use and release is not None and release.nova_major < ONE_TIME_USE_MAJOR:
        minimum = releases.from_major(ONE_TIME_USE_MAJOR)
        problems.append(f"{ONE_TIME_USE} needs Nova {minimum.nova_major} ({minimum.series} "
                        f"{minimum.codename}) or later; this host runs {release}: upgrade Nova "
                        f"or set {ONE_TIME_USE}=false")
    return problems


def _addressable(address: str) -> bool:
    """Whether Nova takes ``address``'s PCI domain (four hex digits)."""
    return len(address.split(":", 1)[0]) <= 4


class _Draft:
    """The mapping's claims on one host, key by key, before any function is assigned."""

    def __init__(self, host: pci.Host, offered: Optional[Mapping[str, Tuple[pci.VgpuType, ...]]],
                 whole_gpus: Optional[Mapping[str, int]] = None):
        self.host = host
        self.offered = dict(offered or {})
        self.whole_gpus = dict(whole_gpus or {})
        self.errors: List[str] = []
        self.notes: List[str] = []
        self.missing: List[str] = []  # SR-IOV GPUs whose VFs are not enabled
        self.chosen: Dict[str, Tuple[pci.VgpuType, str, str]] = {}  # GPU -> (type, key, address)
        self.whole: Dict[str, bool] = {}  # GPU -> mapped by its own address (or `all`)
        self.explicit: Dict[str, List[str]] = {}  # GPU -> VF addresses mapped one by one
        # This draft's own indexes: each function's GPU, each GPU's types (asked per address).
        self.owner: Dict[str, pci.Gpu] = host.owners()  # as host.gpu() finds each
        self.types: Dict[str, Tuple[pci.VgpuType, ...]] = {}
        # GPU -> its MIG-backed profiles' claims (vgpu.migplan, imported at the first MIG-backed type)
        self.mig: Optional["migplan.Claims"] = None
        self.vanished: Tuple[str, ...] = ()  # published functions not found now (see build)
        self.passthrough: Set[str] = set()  # GPUs given whole to guests (the passthrough key)
        self.other_drivers: Dict[str, Mapping[str, str]] = {}  # GPU -> {profile: driver}
        self.unoffered: List[str] = []  # keys of value `all` no GPU here offers

    def take_whole(self, addresses: Sequence[str]) -> None:
        """The ``passthrough`` key's GPUs: each must be a GPU here, named by its own address."""
        for address in addresses:
            gpu = self.owner.get(address)
            if gpu is None and same_gpu(self.vanished, [address]):
                continue  # a vanished GPU: what was published for it stays
            if gpu is None:
                self.errors.append(f"{PASSTHROUGH}: {address} is not an NVIDIA GPU on this host "
                                   f"(found: {_summary(self.host.addresses())})")
            elif gpu.address != address:
                self.errors.append(f"{PASSTHROUGH}: {address} is a virtual function of GPU "
                                   f"{gpu.address} ({gpu.model}); a GPU is given whole by its "
                                   "own address")
            else:
                self.passthrough.add(address)

    def types_of(self, gpu: pci.Gpu) -> Tuple[pci.VgpuType, ...]:
        """What ``gpu`` offers: the learnt types when given, else what sysfs lists."""
        if gpu.address not in self.types:
            self.types[gpu.address] = self.offered.get(gpu.address) or gpu.offered_types()
        return self.types[gpu.address]

    def everywhere(self, key: str) -> None:
        """``key: all``: every GPU that offers the type; a note when none does."""
        found = False
        for gpu in self.host.gpus:
            if gpu.address in self.passthrough:
                continue  # given whole: never `all`'s
            if gpu.vfs_missing:
                if gpu.driver == "nvidia":  # bound elsewhere (passthrough): not `all`'s
                    self.missing.append(gpu.address)
                continue
            vgpu_type, problem = _resolve(key, gpu, self.types_of(gpu))
            if vgpu_type is None:
                unknown = _unknown_types(key, gpu, self.types_of(gpu))
                if unknown:  # it may serve the key: never dropped for a name not known now
                    found = True
                    self.errors.append(unknown)
                continue
            found = True
            if problem:
                self.errors.append(problem)  # e.g. MIG-backed: say so rather than skip
            else:
                self.claim(key, gpu, gpu.address)
        if not found:
            never = self.never_offered(key)
            if never:
                self.errors.append(never)
            else:
                self.notes.append(unoffered_note(key))
                self.unoffered.append(key)

    def never_offered(self, key: str) -> Optional[str]:
        """Why ``key`` under ``all`` is refused: a name of a board here that it never offers.

        Only a name whose board (:func:`board`) is exactly that of names a GPU
        here offers, that no GPU here offers in either MIG mode (a MIG-backed
        name on a MIG-capable board may be offered once in MIG mode) and that
        the catalogue never learnt for this board. A name another driver
        offers on this board is refused as an address would be, naming that
        driver. Any other name is another board's: a mixed fleet's mapping.
        """
        wanted = board(key)
        if wanted is None:
            return None
        for gpu in self.host.gpus:
            if gpu.address in self.passthrough:
                continue
            types = self.types_of(gpu)
            if wanted not in {board(t.name) for t in types}:
                continue
            if profiles.geometry(gpu) is not None and (
                    profiles.mig_profile(key) is not None
                    or not any(profiles.mig_profile(t.name) is None for t in types)):
                return None  # the other MIG mode may offer it
            profile = profiles.key_form(profiles.profile_name(key))
            newer = self.other_drivers.get(gpu.address, {}).get(profile)
            offers = _summary(sorted({profiles.profile_name(t.name) for t in types}))
            where = f"GPU {gpu.address} ({gpu.model})"
            if newer:
                return (f"{key}: {where} does not offer it under this host's driver (driver "
                        f"{newer} offers it on this board); upgrade this host's driver or map "
                        f"{key} by address on the hosts that have it; it offers {offers}")
            return (f"{key}: no GPU here offers it, and {where}, of the same board, never does "
                    f"(a typo?); it offers {offers}")
        return None

    def at(self, key: str, addresses: Sequence[str]) -> None:
        """``key: [addresses]``: each address must be a GPU here or one of its VFs."""
        for address in addresses:
            gpu = self.owner.get(address)  # as host.gpu(address), from the index
            if gpu is None and same_gpu(self.vanished, [address]):
                continue  # a vanished GPU: what was published for it stays
            if gpu is None:
                self.errors.append(f"{key}: {address} is not an NVIDIA GPU on this host "
                                   f"(found: {_summary(self.host.addresses())})")
            elif gpu.vfs_missing and gpu.address not in self.passthrough:
                self.missing.append(gpu.address)
            else:
                self.claim(key, gpu, address)

    def claim(self, key: str, gpu: pci.Gpu, address: str) -> None:
        """``address`` (``gpu`` or one of its VFs) takes ``key``'s type; one type per GPU."""
        if gpu.address in self.passthrough:
            via = "" if address == gpu.address else f" (through {address})"
            self.errors.append(f"GPU {gpu.address} ({gpu.model}){via} is mapped both whole "
                               f"({PASSTHROUGH}) and to {key}: a GPU goes whole to one guest or "
                               "is split into vGPUs, not both; remove it from one of them")
            return
        named = profiles.mig_profile(key)  # vgpu.mig (its tables) only for a MIG-backed key
        if named is not None and gpu.framework == pci.VFIO and profiles.geometry(gpu) is None:
            # Its VFs list the type only once a GPU instance exists, which needs the table.
            self.errors.append(f"GPU {gpu.address} ({gpu.model}, device {gpu.device_id}): the "
                               "charm has no MIG table for this model, so MIG-backed "
                               f"{named.name} cannot be counted")
            return
        vgpu_type, problem = _resolve(key, gpu, self.types_of(gpu))
        if problem:
            self.errors.append(problem)
            return
        problem = None  # no claim yet and not MIG-backed: nothing for vgpu.migplan to say
        if self.mig is not None or profiles.mig_profile(vgpu_type.name) is not None:
            from . import migplan

            self.mig = self.mig or migplan.Claims()
            problem = self.mig.claim(key, gpu, address, vgpu_type, self.chosen.get(gpu.address))
        if problem is not None:
            if problem:
                self.errors.append(problem)
            return
        held = self.chosen.setdefault(gpu.address, (vgpu_type, key, address))
        if held[0].number != vgpu_type.number:
            via = "" if address == gpu.address else f" (through {address})"
            mixed = "; a GPU takes one profile (mixed-size mode is not supported)" \
                if gpu.framework == pci.VFIO else ""
            self.errors.append(f"GPU {gpu.address}{via} is mapped to both {held[1]} and {key}{mixed}")
            return
        if address == gpu.address:
            self.whole[gpu.address] = True
        else:
            self.explicit.setdefault(gpu.address, []).append(address)

    def assignments(self, release) -> List["Assignment"]:
        """The functions each claimed GPU gives its type; what prevents that joins ``errors``."""
        out: List[Assignment] = []
        for gpu in self.host.gpus:
            if gpu.address not in self.chosen:
                continue
            vgpu_type, key, _ = self.chosen[gpu.address]
            made, problems = _functions(gpu, vgpu_type, key, self.whole.get(gpu.address, False),
                                        self.explicit.get(gpu.address, []), self.types_of(gpu), release,
                                        self.whole_gpus.get(gpu.address))
            self.errors.extend(problems)
            out.extend(made)
        if self.mig is None:
            return out  # no MIG-backed type: vgpu.migplan has nothing to add
        for gpu in self.host.gpus:
            typed, problems = self.mig.functions(gpu, release)
            self.errors.extend(problems)
            out.extend(Assignment(gpu.address, vf.address, vgpu_type.number, vgpu_type.name,
                                  pci.VFIO, _hex4(vf.device_id)) for vf, vgpu_type in typed)
        return out


def same_gpu(functions: Iterable[str], named: Iterable[str]) -> Tuple[str, ...]:
    """The ``functions`` (sorted) on the GPU of any ``named`` address, told by its PCI bus.

    For GPUs discovery no longer finds, whose VFs cannot be read: NVIDIA's VFs
    follow their GPU's routing ID on its bus (``0000:c1:00.4`` is a VF of
    ``0000:c1:00.0``), and each GPU sits on a bus of its own behind its PCIe
    port, so one address of the GPU names all its functions.
    """
    buses = {address.rsplit(":", 1)[0] for address in named}
    return tuple(sorted(a for a in set(functions) if a.rsplit(":", 1)[0] in buses))


def removed_mdev_types(published: Mapping[str, Sequence[str]], wanted: Mapping[str, Sequence[str]],
                       host: pci.Host) -> Dict[str, Tuple[str, ...]]:
    """``{function address: mdev types}`` that ``published`` gives it and ``wanted`` takes away.

    Both are mappings as nova-compute gets them (``novaconf.mapping_from_sections``):
    ``{type id: addresses}``, where a type without addresses (Queens to Train)
    serves every function offering it; VFIO resource classes are left out.
    """
    taken: Dict[str, List[str]] = {}
    for address, type_id in sorted(_served(published, host) - _served(wanted, host)):
        taken.setdefault(address, []).append(type_id)
    return {address: tuple(types) for address, types in taken.items()}


def _served(mapping: Mapping[str, Sequence[str]], host: pci.Host) -> Set[Tuple[str, str]]:
    """(function address, mdev type id) for every function ``mapping`` gives an mdev type."""
    pairs: Set[Tuple[str, str]] = set()
    for type_id, addresses in mapping.items():
        if not _TYPE_ID.fullmatch(type_id):
            continue
        if addresses:
            pairs.update((address, type_id) for address in addresses)
            continue
        for gpu in host.gpus:
            offering = [gpu.address] if any(t.id == type_id for t in gpu.types) else []
            offering += [vf.address for vf in gpu.vfs if any(t.id == type_id for t in vf.types)]
            pairs.update((address, type_id) for address in offering)
    return pairs


def mdev_conflicts(removed: Mapping[str, Sequence[str]], held: Sequence["HeldMdev"],
                   host: pci.Host) -> List[str]:
    """Why taking ``removed`` (see :func:`removed_mdev_types`) would strand a guest's mdev.

    Nova recreates or reuses an instance's mdev on its parent with its type
    (at nova-compute's start, before Nova 32 failing with
    InvalidLibvirtMdevConfig when the parent no longer has that type), and
    keeps a shut-off instance's mdev. An mdev that does not exist now (its
    parent and type unknown) and a domain file that cannot be read count
    against any type taken from any function.
    """
    if not removed:
        return []
    out = []
    for mdev in held:
        who = mdev.guest.describe()
        if mdev.guest.problem:
            out.append(who)
        elif mdev.parent is None:
            out.append(f"{who} holds mdev {mdev.uuid}, which is not on this host now: its GPU and "
                       "type are unknown")
        elif mdev.type_id in removed.get(mdev.parent, ()):
            gpu = host.gpu(mdev.parent)
            where = (f"GPU {mdev.parent}" if gpu is None or gpu.address == mdev.parent
                     else f"VF {mdev.parent} of GPU {gpu.address}")
            out.append(f"{who} holds an {mdev.type_id} mdev ({mdev.uuid}) on {where}, which the "
                       "new mapping takes away")
    return out


def _single_type_problem(assignments: Sequence["Assignment"], release) -> Optional[str]:
    """Queens to Train take one mdev type: more than one mapped is refused."""
    numbers = {a.number for a in assignments if a.framework == pci.MDEV}
    if release is None or release.multiple_types or len(numbers) <= 1:
        return None
    listed = ", ".join(f"nvidia-{n}" for n in sorted(numbers))
    return f"{release} supports one vGPU type; {len(numbers)} are mapped ({listed})"


def _shared_class_problems(assignments: Sequence["Assignment"]) -> List[str]:
    """Distinct profiles whose resource classes normalise to the same name."""
    classes: Dict[str, set] = {}
    for a in assignments:
        classes.setdefault(a.resource_class, set()).add(profiles.profile_name(a.name))
    return [f"profiles {', '.join(sorted(names))} would share Placement's resource class {cls}"
            for cls, names in sorted(classes.items()) if len(names) > 1]


def option_problems(assignments: Sequence["Assignment"], release, *, pci_in_placement: bool,
                    live_migration: bool) -> List[str]:
    """What the options ask of Nova that this plan on this release cannot give.

    ``live_migration`` needs a Nova that takes ``live_migratable`` (on any
    host: the option is the operator's request). Without ``pci_in_placement``
    a flavor reaches a VFIO vGPU through a ``[pci] alias`` by vendor and
    product id, and Nova's PCI pools ignore the resource class, so two
    profiles on VFs of one product id on this host cannot be told apart.
    """
    problems: List[str] = []
    if live_migration and release is not None and not release.live_migratable:
        minimum = releases.from_major(releases.LIVE_MIGRATABLE_MAJOR)
        problems.append(f"{LIVE_MIGRATION} needs Nova {minimum.nova_major} ({minimum.series} "
                        f"{minimum.codename}) or later; this host runs {release}: upgrade Nova "
                        f"or set {LIVE_MIGRATION}=false")
    if not pci_in_placement:
        by_product: Dict[str, set] = {}
        for a in assignments:
            if a.framework == pci.VFIO:
                by_product.setdefault(a.product_id, set()).add(profiles.profile_name(a.name))
        problems.extend(
            f"profiles {', '.join(sorted(names))} share VF product id {product}, which a PCI "
            f"alias by vendor and product id cannot tell apart: map one profile per GPU model "
            f"or set {PCI_IN_PLACEMENT}=true" for product, names in sorted(by_product.items())
            if len(names) > 1)
    return problems


def _resolve(key: str, gpu: pci.Gpu, types: Sequence[pci.VgpuType]):
    """(type, problem): the type ``key`` names on ``gpu``.

    A type is returned with a problem when it exists but cannot be used (one of two
    the key names).
    """
    where = f"{gpu.address} ({gpu.model})"
    unknown = _unknown_types(key, gpu, types)
    if not types and gpu.vfs and gpu.framework is None:
        return None, (f"{key}: the virtual functions of GPU {where} offer no vGPU types (are "
                      "they bound to the nvidia driver, nvidia-vgpu-mgr running?)")
    match = _TYPE_ID.fullmatch(key)
    if match:
        number = int(match.group(1))
        found = [t for t in types if t.number == number]
        if not found and not types and gpu.framework in (None, pci.MDEV) and not gpu.sriov:
            # The driver exposes no types yet: take the id as given (mdev GPU).
            return pci.VgpuType(number=number, name=key, framework=pci.MDEV), None
        if not found:
            return None, unknown or (f"{key}: {where} does not offer {key}; it offers "
                                     f"{_summary([t.id for t in types])}")
    else:
        found, problem = _by_name(key, where, types)
        if problem:  # a key naming two types names something here: with `all` too, refused
            return (found[0] if found else None), (unknown if not found and unknown else problem)
    return found[0], None


def _unknown_types(key: str, gpu: pci.Gpu, types: Sequence[pci.VgpuType]) -> Optional[str]:
    """Why it cannot be told now whether ``gpu`` serves ``key``; None when it can.

    A VFIO GPU whose VFs hold a type no VF lists now (a full GPU lists nothing)
    and that was never learnt under the running driver (a new driver's ids, a
    lost catalogue) may well hold ``key``'s type; so may a GPU bound to nvidia
    whose VFs show no vGPU files yet (the vGPU manager is starting). Either way
    the GPU is neither released nor dropped from what Nova has.
    """
    where = f"GPU {gpu.address} ({gpu.model})"
    head = f"{key}: cannot tell whether {where} serves it"
    if gpu.framework == pci.VFIO:
        named = {t.number for t in types if t.name != t.id}
        unnamed = [f"nvidia-{n}" for n in sorted({vf.current_type for vf in gpu.vfs
                                                  if vf.current_type} - named)]
        if not unnamed:
            return None
        return (f"{head}: its VFs hold {_summary(unnamed)}, which no VF lists now (a full GPU "
                "lists nothing) and which was not learnt under this driver; release a VF no "
                "guest uses (write 0 to its nvidia/current_vgpu_type) to let the charm read "
                "the name")
    if gpu.framework is None and gpu.vfs and not types and gpu.driver == "nvidia":
        return (f"{head}: its VFs show no vGPU types now (no nvidia/ files nor mdev types: are "
                "they bound to the nvidia driver, is nvidia-vgpu-mgr starting?)")
    return None


def _by_name(key: str, where: str, types: Sequence[pci.VgpuType]):
    """([types], problem): the types ``key`` names in any spelling :func:`profiles.name_keys` gives.

    A key that names two types (``A100-20C`` for ``GRID A100-20C`` and ``NVIDIA
    A100-20C``, or NVIDIA's short form for two models) is refused with the candidates.
    A MIG-backed ``...GFX`` key no type is named names the type without the suffix
    (:func:`vgpu.profiles.without_gfx`).
    """
    wanted = profiles.key_form(key)
    found = [t for t in types if wanted in profiles.name_keys(t.name)]
    stripped = profiles.without_gfx(wanted) if not found else None
    if stripped:  # DC-1-24QGFX: DC-1-24Q on +gfx GPU instances (vgpu-device-manager's config.go)
        found = [t for t in types if stripped in profiles.name_keys(t.name)]
    if not found:
        shown = [profiles.profile_name(t.name) for t in types]
        return [], (f"{key}: {where} offers no vGPU type of that name; it offers "
                    f"{_summary(shown)}" if types else
                    f"{key}: {where} offers no vGPU types yet (is the vGPU host driver "
                    "loaded?)")
    if len(found) > 1:
        return found, (f"{key}: names {len(found)} types on {where}: "
                    f"{_summary([f'{t.id} ({t.name})' for t in found])}; use the type id or the full name")
    return found, None


def _functions(gpu: pci.Gpu, vgpu_type: pci.VgpuType, key: str, whole: bool,
               explicit: List[str], types: Sequence[pci.VgpuType], release,
               whole_gb: Optional[int] = None):
    """The assignments for one GPU, or the problems that prevent them (``whole_gb``: see _fits)."""
    framework = gpu.framework or vgpu_type.framework
    if framework == pci.MDEV and (gpu.types or not gpu.vfs):
        # Mediated devices on the GPU itself (no SR-IOV): the GPU is the parent.
        if explicit:
            return [], [f"{key}: {explicit[0]} is not a vGPU parent of GPU {gpu.address}"]
        return [Assignment(gpu.address, gpu.address, vgpu_type.number, vgpu_type.name, pci.MDEV)], []
    if framework == pci.VFIO and release is not None and not release.managed_no:
        return [], [f"GPU {gpu.address} ({gpu.model}) uses NVIDIA's vendor-specific VFIO "
                    f"framework, which needs Nova 31 (2025.1 epoxy) or later; this host runs "
                    f"{release}"]
    fits = _fits(gpu, vgpu_type, types, framework, whole_gb)
    if fits == _NO_WHOLE:
        return [], [f"{key}: cannot tell how many VFs of GPU {gpu.address} ({gpu.model}) "
                    f"{vgpu_type.id} fits: its VFs hold vGPUs, so they list only what fits "
                    "beside them, and the whole GPU's framebuffer was never seen (its VFs were "
                    "never all free while the charm looked); nothing is changed until they are"]
    if fits < 0:
        return [], [_unknown_size(gpu, vgpu_type, key)]
    chosen_vfs = list(gpu.vfs[:fits]) if whole else []
    for address in explicit:
        vf = gpu.function(address)
        if vf not in chosen_vfs:
            chosen_vfs.append(vf)
    problems = _vf_problems(gpu, vgpu_type, key, framework, chosen_vfs, fits)
    if problems:
        return [], problems
    return [Assignment(gpu.address, vf.address, vgpu_type.number, vgpu_type.name, framework,
                       _hex4(vf.device_id)) for vf in sorted(chosen_vfs, key=lambda v: v.index)], []


def _unknown_size(gpu: pci.Gpu, vgpu_type: pci.VgpuType, key: str) -> str:
    """Why the VFs a VFIO type fits cannot be counted: its name is unknown, or not a profile's."""
    head = f"{key}: cannot tell how many VFs of GPU {gpu.address} ({gpu.model}) {vgpu_type.id} fits"
    if vgpu_type.name != vgpu_type.id:
        return (f"{head}: its name {vgpu_type.name} does not read as a profile "
                "(<model>-<GB><series>, like L40S-12Q)")
    return (f"{head}: its name was never listed while VFs were free; release its VFs "
            "(write 0 to nvidia/current_vgpu_type) to let the charm learn it")


def _vf_problems(gpu: pci.Gpu, vgpu_type: pci.VgpuType, key: str, framework: Optional[str],
                 chosen_vfs: Sequence[pci.VirtualFunction], fits: int) -> List[str]:
    """VFs that do not offer the type (mdev), and more VFs mapped than the type fits."""
    problems: List[str] = []
    if framework == pci.MDEV:
        for vf in chosen_vfs:
            if vf.types and vgpu_type.number not in {t.number for t in vf.types}:
                problems.append(f"{key}: {vf.address} ({gpu.model}) does not offer "
                                f"{vgpu_type.id}; it offers {_summary([t.id for t in vf.types])}")
    if len(chosen_vfs) > fits:
        problems.append(f"{key if key.startswith('nvidia-') else vgpu_type.id}: "
                        f"{len(chosen_vfs)} virtual functions of GPU {gpu.address} are mapped "
                        f"but the type fits {fits} per GPU")
    return problems


_NO_WHOLE = -2  # _fits: the whole GPU's framebuffer is unknown


def _fits(gpu: pci.Gpu, vgpu_type: pci.VgpuType, types: Sequence[pci.VgpuType],
          framework: Optional[str], whole_gb: Optional[int] = None) -> int:
    """How many vGPUs of the type one GPU holds, at most one per VF.

    VFIO: the profile's framebuffer against the whole GPU's (48 GB for an L40S,
    its largest time-sliced profile; the largest of the type's own series is
    smaller for B and A profiles): what its VFs list while none holds a type,
    else ``whole_gb`` (learnt, or NVIDIA's size of the model), never what a
    partly used GPU still lists (only the size its VFs hold): ``_NO_WHOLE``
    when neither is known. A type known only by the id a VF holds: as many VFs
    as hold it now, else unknown (-1).
    """
    count = len(gpu.vfs)
    if framework == pci.MDEV:
        for t in types:
            if t.number == vgpu_type.number and t.max_instances is not None:
                return min(count, t.max_instances)
        return count
    own = vgpu_type.profile
    if own is None or own.framebuffer_gb <= 0:
        return sum(1 for vf in gpu.vfs if vf.current_type == vgpu_type.number) or -1
    sizes = [] if any(vf.current_type for vf in gpu.vfs) else [  # listed whole only while free
        p.framebuffer_gb for p in (t.profile for t in gpu.offered_types())
        if p is not None and not p.mig]
    whole = (max(sizes) if sizes else None) or whole_gb
    if whole is None:
        return _NO_WHOLE
    return min(count, whole // own.framebuffer_gb)


def _hex4(device_id: str) -> str:
    text = (device_id or "").lower()
    return text[2:] if text.startswith("0x") else text


def _summary(items, limit: int = 4) -> str:
    items = list(items)
    if not items:
        return "none"
    shown = ", ".join(items[:limit])
    return shown if len(items) <= limit else f"{shown} and {len(items) - limit} more"
