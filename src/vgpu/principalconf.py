"""The principal's own ``[pci]`` settings in nova.conf, and what in them clashes with ours.

What this unit publishes lands in nova-compute's ``/etc/nova/nova.conf`` after
nova-compute's own ``[pci]`` section, which carries its
``pci-passthrough-whitelist`` option (rendered as ``passthrough_whitelist =
<value>``, the value as the operator typed it, possibly a JSON list) and its
``pci-alias`` option (``alias = ...`` lines); see charm-nova-compute's
``templates/*/nova.conf`` and ``hooks/nova_compute_context.py``. Nova then
refuses to start, or hands devices out wrongly, when:

* a device spec names a ``devname`` while ``[pci] report_in_placement`` is on
  (``ensure_no_dev_spec_with_devname`` in
  ``nova/compute/pci_placement_translator.py``);
* a spec matches a GPU (the physical function) whose VFs are reported to
  Placement (``PlacementPciDependentDeviceException``), or other VFs of that
  GPU without our resource class (``PlacementPciMixedResourceClassException``);
* a spec matches our VFs: Nova uses the first spec that matches a device
  (``nova/pci/whitelist.py``), and the principal's come first, so the VF would
  lose ``managed = no`` and its resource class.

Ubuntu's nova-compute service reads ``/etc/nova/nova-compute.conf`` after
nova.conf (``--config-file`` twice; charm-nova-compute renders it from Train
on): both are read, in that order. oslo.config accumulates a multi-valued
option over its files, file by file (each file's values in the order below),
so the principal's entries are every file's, nova.conf's first.

Each file is parsed the way oslo.config reads it (``oslo_config/iniparser.py``:
repeated sections merge, a repeated key accumulates, indented lines continue
a value, ``#`` and ``;`` start comments, section names other than
``DEFAULT`` are case-insensitive) and each spec is matched the way
``nova/pci/devspec.py`` matches it; neither library is imported. Nothing here
imports ops.
"""

from __future__ import annotations

import json
import string
import sys
from typing import Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from . import hostroot, pci, run, text
from .errors import CommandError, PrincipalConfigError, UncheckedEntryError
from .record import NamedTuple

NOVA_CONF = "/etc/nova/nova.conf"
NOVA_COMPUTE_CONF = "/etc/nova/nova-compute.conf"
CONFIG_FILES = (NOVA_CONF, NOVA_COMPUTE_CONF)  # in the order nova-compute reads them
CONF_LIMIT = 1 << 22  # bytes of either file read; charm-nova-compute renders some kilobytes

# Every name Nova reads [pci] device_spec under, in the order oslo.config returns
# their values: a MultiStrOpt collects each deprecated name's values ahead of the
# values found under the names before it.
SPEC_OPTIONS = (("DEFAULT", "pci_passthrough_whitelist"), ("pci", "passthrough_whitelist"),
                ("pci", "device_spec"))
ALIAS_OPTIONS = (("DEFAULT", "pci_alias"), ("pci", "alias"))

ANY = "*"
_ENTRY_LIMIT = 70  # how much of an entry a status message quotes
_TRUE = ("1", "t", "true", "on", "y", "yes")  # oslo_utils.strutils' spellings
_FALSE = ("0", "f", "false", "off", "n", "no")
_BOOL_TAGS = ("managed", "live_migratable", "one_time_use")  # refused unless they read as a bool

# What a hook evaluates of one entry. The principal's option is the operator's text:
# a regex address with catastrophic backtracking would stall the hook (holding the
# machine lock nova-compute needs to correct it), a list nested thousands deep
# would fail it with RecursionError. Beyond these bounds an entry is "not checked".
# Compiling a pattern can cost as much as matching it (seconds for a long case-insensitive
# class) or fail with OverflowError or RecursionError, so both happen in that process.
MAX_ENTRY = 65536  # characters of one option value
MAX_DEPTH = 32  # nesting of JSON lists and objects (Nova's entries use three)
REGEX_BUDGET = 5.0  # seconds for one entry's regular expressions per hook, in a process of their own
# Reads [patterns, pairs] from stdin; compiles each pattern as Nova does (re.compile: any
# failure, re.error or not, is one Nova refuses) and matches each [pattern, field] pair
# (re.match); prints [the patterns that failed, one answer per pair]. Run with the
# charm's Python in isolated mode, ended when out of time.
_REGEX_SCRIPT = (
    "import json, re, sys\n"
    "patterns, pairs = json.load(sys.stdin)\n"
    "compiled, failed = {}, []\n"
    "for p in patterns:\n"
    "    try:\n"
    "        compiled[p] = re.compile(p)\n"
    "    except Exception:\n"
    "        failed.append(p)\n"
    "json.dump([failed, [p in compiled and bool(compiled[p].match(f)) for p, f in pairs]],"
    " sys.stdout)\n")
_EVALUATING = "compiling and matching its regular expressions"  # what a message says ran out

Parsed = Dict[str, Dict[str, List[str]]]  # section -> key -> values, in file order
Files = List[Tuple[str, Parsed]]  # (path, parsed) per file nova-compute reads, in its order


class Entry(NamedTuple):
    """One value of a device spec or alias option, as the file holds it."""

    section: str
    key: str
    value: str
    file: str = NOVA_CONF  # the file it is in

    @property
    def option(self) -> str:
        """``[pci] passthrough_whitelist``."""
        return f"[{self.section}] {self.key}"


class Principal(NamedTuple):
    """The principal's own entries: what is in nova.conf besides this unit's."""

    specs: Tuple[Entry, ...] = ()  # device specs, in the order Nova matches them
    aliases: Tuple[Entry, ...] = ()


class Device(NamedTuple):
    """A PCI function as Nova's PCI tracker describes it to a spec (``dev_dict``)."""

    vendor_id: str  # four lowercase hex digits
    product_id: str
    address: str  # 0000:81:00.4
    parent_addr: Optional[str] = None  # a VF's physical function


# -- reading nova.conf ----------------------------------------------------------------

def path(name: str = NOVA_CONF):
    """One of nova-compute's configuration files under the host root."""
    return hostroot.path(name)


def load() -> Optional[Files]:
    """nova.conf, then nova-compute.conf where it exists, parsed; None without nova.conf.

    None while nova-compute has not written nova.conf. Raises HostReadError
    when a file cannot be read or holds more than CONF_LIMIT bytes,
    PrincipalConfigError when oslo.config (so nova-compute) could not parse
    it either.
    """
    out: Files = []
    for name in CONFIG_FILES:
        # Any bytes, at most CONF_LIMIT; values are cleaned where quoted.
        content = hostroot.read_text(path(name), clean=False, limit=CONF_LIMIT)
        if content is None:
            if name == NOVA_CONF:
                return None
            continue
        try:
            out.append((name, parse(content)))
        except ValueError as error:
            raise PrincipalConfigError(f"cannot parse {name}: {text.one_line(str(error), 120)}") \
                from None
    return out


def parse(content: str) -> Parsed:
    """INI text as oslo.config reads it; ValueError naming the line it refuses."""
    parsed: Parsed = {}
    section: Optional[str] = None
    key: Optional[str] = None
    value: List[str] = []

    def flush() -> None:
        if section is None:
            raise ValueError(f"line {number}: a setting before any [section]")
        parsed[section].setdefault(str(key), []).append("\n".join(value))

    number = 0
    for number, raw in enumerate(content.replace("\r\n", "\n").replace("\r", "\n").split("\n"), 1):
        line = raw.rstrip()
        if line.startswith((" ", "\t")):  # continues the value above, unless a blank line ended it
            if key is None:
                raise ValueError(f"line {number}: unexpected continuation line {line.strip()!r}")
            value.append(line.lstrip())
            continue
        if key is not None:
            flush()
            key = None
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = _section_name(line, number)
            parsed.setdefault(section, {})
        else:
            key, value = _assignment(line, number)
    if key is not None:
        flush()
    return parsed


def _section_name(line: str, number: int) -> str:
    if not line.endswith("]") or len(line) <= 2:
        raise ValueError(f"line {number}: invalid section {line!r}")
    name = line[1:-1]
    return name if name == "DEFAULT" else name.lower()  # oslo.config's group names


def _assignment(line: str, number: int) -> Tuple[str, List[str]]:
    equal, colon = line.find("="), line.find(":")
    at = equal if colon < 0 or 0 <= equal < colon else colon
    if at < 0:
        raise ValueError(f"line {number}: no '=' or ':' in {line!r}")
    key, value = line[:at].strip(), line[at + 1:].strip()
    if not key:
        raise ValueError(f"line {number}: no key in {line!r}")
    if value and value[0] == value[-1] and value[0] in "\"'":
        value = value[1:-1]  # one pair of quotes around the whole value goes
    return key, [value]


def principal(conf, ours: Iterable[str] = ()) -> Principal:
    """The principal's device specs and aliases: every entry but this unit's own.

    ``conf``: what :func:`load` returns, or one parsed nova.conf. ``ours``:
    the ``[pci] device_spec`` values this unit published or is about to
    publish; nova.conf holds them beside the principal's once rendered.
    """
    files: Files = [(NOVA_CONF, conf)] if isinstance(conf, dict) else list(conf)
    own = set(ours)
    specs = tuple(Entry(section, key, value, name) for name, parsed in files
                  for section, key in SPEC_OPTIONS
                  for value in parsed.get(section, {}).get(key, [])
                  if not (name == NOVA_CONF and (section, key) == ("pci", "device_spec")
                          and value in own))
    aliases = tuple(Entry(section, key, value, name) for name, parsed in files
                    for section, key in ALIAS_OPTIONS
                    for value in parsed.get(section, {}).get(key, []))
    return Principal(specs=specs, aliases=aliases)


# -- Nova's matching rules (nova/pci/devspec.py), replicated ----------------------------

class Spec(NamedTuple):
    """One device spec as Nova parses it: ids, address rule and the tags that matter here."""

    vendor_id: str  # four hex digits or '*'
    product_id: str
    devname: Optional[str]  # a network interface: never a GPU
    glob: Optional[Tuple[str, str, str, str]]  # domain, bus, slot, function ('*' = any)
    regex: Optional[Tuple[str, str, str, str]]  # patterns, compiled and matched (from the start)
    # in a process of their own (see regex_answers)
    physical_function: bool  # an exact address of an SR-IOV PF: its VFs match too


def specs_of(entry: Entry) -> List[Dict[str, Any]]:
    """The spec objects of one option value (a JSON object or list of them); ValueError if not.

    Raises UncheckedEntryError, before parsing, for a value longer than
    MAX_ENTRY or nested deeper than MAX_DEPTH.
    """
    if len(entry.value) > MAX_ENTRY:
        raise UncheckedEntryError(f"it is {len(entry.value)} characters long, more than the "
                                  f"{MAX_ENTRY} this charm evaluates")
    if _depth(entry.value) > MAX_DEPTH:
        raise UncheckedEntryError(f"its JSON is nested more than {MAX_DEPTH} deep")
    try:
        loaded = json.loads(entry.value)
    except RecursionError:  # not reached within MAX_DEPTH; a hook never fails on it
        raise UncheckedEntryError(f"its JSON is nested more than {MAX_DEPTH} deep") from None
    except ValueError:
        raise ValueError("not valid JSON") from None
    items = [loaded] if isinstance(loaded, dict) else loaded
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise ValueError("not a JSON object or a list of them")
    return items


def _depth(value: str) -> int:
    """How deep JSON lists and objects nest in ``value`` (strings skipped), without recursion."""
    depth = deepest = 0
    quoted = escaped = False
    for char in value:
        if quoted:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
        elif char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def parse_spec(spec: Dict[str, Any], physical_functions: Set[str]) -> Spec:
    """``spec`` under Nova's rules; ValueError for what Nova refuses at start.

    ``physical_functions``: addresses of SR-IOV PFs, which Nova finds in sysfs
    (``sriov_totalvfs`` above 0) for an exact address. A regex address is
    not compiled here: :func:`regex_answers` finds the patterns Nova cannot
    compile, in the bounded process (:func:`conflicts` names the entry).
    """
    vendor = spec.get("vendor_id", ANY)
    if not isinstance(vendor, str):
        raise ValueError("vendor_id is not a string")
    vendor = _hex_field("vendor_id", vendor.strip(), 0xFFFF, "%04x")
    product = _hex_field("product_id", spec.get("product_id", ANY), 0xFFFF, "%04x")
    devname = spec.get("devname")
    address = spec.get("address")
    if address and devname:
        raise ValueError("both devname and address")
    for tag in _BOOL_TAGS:
        _bool_tag(tag, spec.get(tag))
    if devname:
        return Spec(vendor, product, str(devname), None, None, False)
    address = address or "*:*:*.*"
    if isinstance(address, str):
        glob = _glob(address)
        return Spec(vendor, product, None, glob, None, _single(glob, physical_functions))
    if isinstance(address, dict):
        raw = [address.get(name, ".*") for name in ("domain", "bus", "slot", "function")]
        if not all(isinstance(part, str) for part in raw):  # re.compile's TypeError in Nova
            raise ValueError(_invalid(address))
        domain, bus, slot, function = raw
        return Spec(vendor, product, None, None, (domain, bus, slot, function),
                    _single(raw, physical_functions))
    raise ValueError(f"address {address!r} is neither a string nor an object")


def _invalid(address: Any) -> str:
    return f"address {address} has an invalid regular expression"


def _hex_field(name: str, value: Any, maximum: int, form: str) -> str:
    if value == ANY:
        return ANY
    try:
        number = int(value, 16)
    except (ValueError, TypeError):
        raise ValueError(f"{name} {value!r} is not a hex number") from None
    if number > maximum:
        raise ValueError(f"{name} {value!r} is above {maximum:X}")
    return form % number


def _bool_tag(tag: str, value: Any) -> None:
    if value is None or isinstance(value, bool):
        return
    if str(value).strip().lower() not in _TRUE + _FALSE:
        raise ValueError(f"{tag} {value!r} is not yes or no")


def _glob(address: str) -> Tuple[str, str, str, str]:
    """``[[[domain]:][bus]:][slot][.function]`` with '*' or blanks for any (PciAddressGlobSpec)."""
    dbs, _, function = address.partition(".")
    func = _hex_field("function", function.strip(), 0x7, "%01x") if function else ANY
    domain = bus = slot = ANY
    if dbs:
        parts = dbs.split(":")
        if len(parts) > 3:
            raise ValueError(f"address {address!r} has too many fields")
        parts = [ANY] * (3 - len(parts)) + parts
        domain, bus, slot = (part.strip() or ANY for part in parts)
        domain = _hex_field("domain", domain, 0xFFFF, "%04x")
        bus = _hex_field("bus", bus, 0xFF, "%02x")
        slot = _hex_field("slot", slot, 0x1F, "%02x")
    return domain, bus, slot, func


def _single(fields: Sequence[Any], physical_functions: Set[str]) -> bool:
    """Whether the address names one function that is an SR-IOV PF (so its VFs match too)."""
    if not all(isinstance(f, str) and all(c in string.hexdigits for c in f) for f in fields):
        return False
    domain, bus, slot, function = fields
    return f"{domain}:{bus}:{slot}.{function}" in physical_functions


Answers = Dict[Tuple[str, str], bool]  # (pattern, address field) -> whether re.match takes it


def matches(spec: Spec, device: Device, answers: Optional[Answers] = None) -> bool:
    """Whether Nova's ``PciDeviceSpec.match`` takes ``device`` for ``spec``.

    A regex address is matched from ``answers`` (see :func:`regex_answers`),
    or in a process of its own when they are not given; UncheckedEntryError
    when that runs out of time.
    """
    if spec.devname is not None:
        return False  # an interface name resolves to a NIC, never to a GPU function
    if spec.vendor_id not in (ANY, device.vendor_id) or spec.product_id not in (ANY, device.product_id):
        return False
    if answers is None and spec.regex is not None:
        answers = regex_answers(regex_questions([spec], [device]), spec.regex)
    if spec.physical_function and device.parent_addr \
            and _address_matches(spec, device.parent_addr, answers):
        return True
    return _address_matches(spec, device.address, answers)


def _fields(address: str) -> Tuple[str, str, str, str]:
    dbs, _, function = address.partition(".")
    domain, bus, slot = dbs.split(":")
    return domain, bus, slot, function


def _address_matches(spec: Spec, address: str, answers: Optional[Answers]) -> bool:
    fields = _fields(address)
    if spec.regex is not None:
        assert answers is not None
        return all(answers[(pattern, field)] for pattern, field in zip(spec.regex, fields))
    assert spec.glob is not None
    return all(want in (ANY, field) for want, field in zip(spec.glob, fields))


def regex_questions(specs: Iterable[Spec], devices: Iterable[Device]) -> List[Tuple[str, str]]:
    """Every (pattern, address field) pair matching ``specs`` against ``devices`` asks."""
    addresses = sorted({a for d in devices for a in (d.address, d.parent_addr) if a})
    pairs = {(pattern, field) for spec in specs if spec.regex is not None
             for address in addresses for pattern, field in zip(spec.regex, _fields(address))}
    return sorted(pairs)


class UncompiledPatternError(ValueError):
    """Patterns Nova cannot compile (``re.error``, OverflowError, RecursionError...)."""

    def __init__(self, patterns: Sequence[str]):
        """Keep the patterns that failed."""
        super().__init__(f"{len(patterns)} regular expression(s) Python cannot compile")
        self.patterns = frozenset(patterns)


def regex_answers(pairs: Sequence[Tuple[str, str]], patterns: Iterable[str] = ()) -> Answers:
    """``re.match`` of each pair, as Nova matches regex address fields, within REGEX_BUDGET.

    Every pattern (of ``pairs`` and ``patterns``) is compiled first:
    UncompiledPatternError names those that fail, as they fail in Nova. Python's
    ``re`` can be interrupted neither compiling nor matching, so both run in
    one process of their own, ended when out of time: UncheckedEntryError then
    (or when that process cannot run), and the hook goes on.
    """
    every = sorted({*patterns, *(pattern for pattern, _ in pairs)})
    if not every:
        return {}
    try:
        result = run.run([sys.executable, "-I", "-c", _REGEX_SCRIPT], REGEX_BUDGET,
                         what=_EVALUATING, stdin=json.dumps([every, pairs]))
        failed, said = json.loads(result.stdout)
    except CommandError as error:
        raise UncheckedEntryError(error.cause) from None
    except (ValueError, TypeError):
        raise UncheckedEntryError(f"{_EVALUATING} gave no answer") from None
    if not isinstance(said, list) or len(said) != len(pairs) or not isinstance(failed, list):
        raise UncheckedEntryError(f"{_EVALUATING} gave no answer")
    if failed:
        raise UncompiledPatternError([str(pattern) for pattern in failed])
    return {(str(pattern), str(field)): bool(answer)
            for (pattern, field), answer in zip(pairs, said)}


# -- conflicts --------------------------------------------------------------------------

class _Target(NamedTuple):
    """A GPU whose functions this unit gives Nova: its functions as Nova sees them."""

    gpu: str
    pf: Optional[Device]  # None when the GPU is not on the host now
    ours: Tuple[Device, ...]  # the functions we publish: VFIO VFs, or mdev parents
    others: Tuple[Device, ...]  # its other VFs
    mdev: bool = False  # ours host mediated devices (mdev parents), not VFIO VFs


def checked_sections(sections: Optional[Dict[str, List[List[str]]]]) -> bool:
    """Whether ``sections`` give Nova devices a principal's spec could also take.

    ``[pci]`` (VFIO device specs, report_in_placement) and the mdev types
    (``[devices]``, ``[mdev_*]``, ``[vgpu_*]``): libvirt lists an mdev
    parent as a PCI device too, so a whitelist entry can pass it through.
    """
    return bool(sections) and any(
        name in ("pci", "devices") or name.startswith(("mdev_", "vgpu_")) for name in sections or {})


def conflicts(specs: Sequence[Entry], sections: Dict[str, List[List[str]]], host: pci.Host,
              app: str) -> List[str]:
    """Blocked messages for principal ``specs`` Nova refuses or mishandles beside ``sections``.

    ``sections``: this unit's nova.conf sections (to publish, or published;
    nothing clashes without a ``[pci]`` or mdev types); ``host``: the GPUs and
    VFs found; ``app``: the principal application's name, for the command
    that fixes it. Each message names the entry, what it hits and the option
    to change. An entry beyond what a hook evaluates (see MAX_ENTRY,
    MAX_DEPTH, REGEX_BUDGET) is named as not checked.
    """
    return conflicts_each(specs, [sections], host, app)[0]


def conflicts_each(specs: Sequence[Entry], candidates: Sequence[Dict[str, List[List[str]]]],
                   host: pci.Host, app: str) -> List[List[str]]:
    """:func:`conflicts` for each of ``candidates`` (sets of sections), in their order.

    Each entry is parsed, and its regular expressions compiled and matched
    against the functions of every candidate at once, once: one bounded
    process per entry with patterns, so an entry costs a hook REGEX_BUDGET
    at most however many sets of sections are checked.
    """
    out: List[List[str]] = [[] for _ in candidates]
    if not specs:  # the principal gives Nova no device: nothing of ours to clash with
        return out
    checks = [_check(sections, host) for sections in candidates]
    if not any(checks):
        return out
    physical = {gpu.address for gpu in host.gpus if gpu.sriov}
    devices = {d.address: d for check in checks if check for t in check[0]
               for d in (t.pf, *t.ours, *t.others) if d is not None}.values()
    for entry in specs:
        evaluated = _evaluated(entry, physical, devices, app)
        for messages, check in zip(out, checks):
            if check is None:
                continue
            if isinstance(evaluated, str):  # not checked, or refused by Nova: said for each
                messages.append(evaluated)
                continue
            parsed, answers = evaluated
            for item, spec in parsed:
                problem = _problem(spec, check[0], check[1], answers)
                if problem:
                    shown = entry.value if len(parsed) == 1 else json.dumps(item)
                    messages.append(f"{_named(app, entry, shown)} {problem}; {_fix(app, entry)}")
    return out


def _check(sections: Dict[str, List[List[str]]], host: pci.Host
           ) -> Optional[Tuple[List["_Target"], bool]]:
    """(the GPUs ``sections`` give Nova, whether they report to Placement); None: nothing to clash."""
    pairs = [list(p) for p in sections.get("pci", [])]
    reporting = ["report_in_placement", "True"] in pairs
    targets = _targets([value for key, value in pairs if key == "device_spec"], host)
    targets += _mdev_targets(sections, host)
    return (targets, reporting) if targets or reporting else None


def _evaluated(entry: Entry, physical: Set[str], devices: Iterable[Device], app: str
               ) -> Union[str, Tuple[List[Tuple[Dict[str, Any], Spec]], Answers]]:
    """An entry's specs parsed and their regex answers for ``devices``; else why, as a message."""
    try:
        parsed = [(item, parse_spec(dict(item), physical)) for item in specs_of(entry)]
        return parsed, _answers(parsed, devices)
    except UncheckedEntryError as error:
        return (f"cannot check {_named(app, entry, entry.value)}: {error}; whether it takes "
                f"this unit's vGPU devices is unknown, the last published settings stay; "
                f"{_fix(app, entry)}")
    except ValueError as error:
        return (f"{_named(app, entry, entry.value)} is refused by Nova "
                f"({text.one_line(str(error), _ENTRY_LIMIT)}), so "
                f"whether it takes this unit's vGPU devices is unknown: correct it; "
                f"{_fix(app, entry)}")


def _answers(parsed: Sequence[Tuple[Dict[str, Any], Spec]], devices: Iterable[Device]) -> Answers:
    """One entry's regex answers for ``devices`` (:func:`regex_answers`, one process).

    ValueError naming the address whose pattern Nova cannot compile.
    """
    regex = [spec for _, spec in parsed if spec.regex is not None]
    try:
        return regex_answers(regex_questions(regex, devices),
                             [pattern for spec in regex for pattern in spec.regex or ()])
    except UncompiledPatternError as error:
        address = next(item.get("address") for item, spec in parsed
                       if set(spec.regex or ()) & error.patterns)
        raise ValueError(_invalid(address)) from None


def _problem(spec: Spec, targets: Sequence[_Target], reporting: bool, answers: Answers) -> str:
    """What ``spec`` does to the GPUs this unit gives Nova ('' when nothing)."""
    if reporting and spec.devname is not None:
        return ("names a device by devname, which Nova refuses while [pci] report_in_placement "
                "is on (nova-compute stops): name it by PCI address")
    for target in targets:
        pf = target.pf is not None and matches(spec, target.pf, answers)
        ours = [d.address for d in target.ours if matches(spec, d, answers)]
        if target.mdev:
            problem = _mdev_problem(target, pf, ours)
            if problem:
                return problem
            continue
        others = [d.address for d in target.others if matches(spec, d, answers)] if reporting else []
        hit_vfs = ours + others
        vfs = ("VF " if len(hit_vfs) == 1 else "VFs ") + text.listing(hit_vfs)
        if pf:
            why = ("Nova refuses a GPU beside its VFs in Placement (nova-compute stops)" if reporting
                   else "a guest given the whole GPU would take its vGPU VFs with it")
            hit = f"GPU {target.gpu}" + (f" and its {vfs}" if hit_vfs else "")
            return f"matches {hit}, whose VFs this unit publishes for vGPUs: {why}; leave the GPU out"
        if ours:
            return (f"matches {vfs} of GPU {target.gpu}, which this unit publishes for vGPUs: "
                    "Nova uses the first spec that matches, so they would lose managed=no and "
                    "their resource class; leave them out")
        if others:
            return (f"matches {vfs} of GPU {target.gpu}, beside the VFs this unit publishes "
                    "for vGPUs: one GPU's VFs would mix resource classes in Placement "
                    "(nova-compute stops); leave them out")
    return ""


def _mdev_problem(target: _Target, pf: bool, ours: List[str]) -> str:
    """A spec that takes a GPU (or VF) whose mediated devices this unit gives Nova."""
    parents = [d.address for d in target.ours]
    if not pf and not ours:
        return ""
    if pf or target.gpu in ours:
        hit = f"GPU {target.gpu}"
    else:
        hit = f"{'VF' if len(ours) == 1 else 'VFs'} {text.listing(ours)} of GPU {target.gpu}"
    if parents == [target.gpu]:
        whose = "whose mdevs"
    else:
        whose = f"whose VF{'s' if len(parents) > 1 else ''} {text.listing(parents)} host the mdevs"
    return (f"matches {hit}, {whose} this unit gives Nova for vGPUs: libvirt lists mdev parents "
            "as PCI devices, so a passthrough flavor would take the whole device with the vGPUs "
            "on it; leave it out")


def _mdev_targets(sections: Dict[str, List[List[str]]], host: pci.Host) -> List[_Target]:
    """The GPUs whose functions host the mdevs ``sections`` give Nova (found on the host now).

    ``device_addresses`` names each parent (a GPU, or a VF of an SR-IOV GPU);
    a ``[devices]`` type without them (Queens to Train, or a type that is the
    default for unclaimed GPUs) covers every mdev GPU here.
    """
    named: Dict[str, Set[str]] = {}  # GPU address -> parents
    addresses = [a for name, pairs in sections.items() if name.startswith(("mdev_", "vgpu_"))
                 for key, value in pairs if key == "device_addresses"
                 for a in filter(None, str(value).split(","))]
    owners = host.owners()  # as host.gpu(address), for every address at once
    for address in addresses:
        gpu = owners.get(address)
        if gpu is not None:
            named.setdefault(gpu.address, set()).add(address)
    types = [v for k, v in sections.get("devices", []) if k in ("enabled_mdev_types",
                                                                 "enabled_vgpu_types")]
    if types and not addresses:  # every mdev GPU offering the type may serve it
        for gpu in host.gpus:
            if gpu.framework == pci.MDEV:
                named.setdefault(gpu.address, set()).update(
                    [vf.address for vf in gpu.vfs] if gpu.sriov else [gpu.address])
    out = []
    for gpu_address, parents in sorted(named.items()):
        gpu = owners.get(gpu_address)
        assert gpu is not None
        pf = Device(_NVIDIA, _id(gpu.device_id), gpu.address)
        by_address = {vf.address: Device(_NVIDIA, _id(vf.device_id), vf.address, gpu.address)
                      for vf in gpu.vfs}
        by_address[gpu.address] = pf
        out.append(_Target(gpu.address, pf, tuple(by_address[a] for a in sorted(parents)), (),
                           mdev=True))
    return out


def _targets(device_specs: Sequence[str], host: pci.Host) -> List[_Target]:
    """The GPUs whose VFs ``device_specs`` (ours) publish, with all their functions."""
    by_gpu: Dict[str, Dict[str, str]] = {}  # GPU address -> our VF address -> product id
    owners = host.owners()  # as host.gpu(address), for every address at once
    for value in device_specs:
        try:
            spec = json.loads(value)
            address, product = str(spec["address"]), str(spec["product_id"])
        except (ValueError, KeyError, TypeError):
            continue  # not one of ours: novaconf builds every one with both
        gpu = owners.get(address)
        by_gpu.setdefault(gpu.address if gpu else address, {})[address] = product
    out = []
    for gpu_address, ours in by_gpu.items():
        gpu = owners.get(gpu_address)
        if gpu is None:  # the VFs are not on the host now: only what we publish is known
            out.append(_Target(gpu_address, None, tuple(
                Device(_NVIDIA, product, address) for address, product in ours.items()), ()))
            continue
        pf = Device(_NVIDIA, _id(gpu.device_id), gpu.address)
        vfs = {vf.address: Device(_NVIDIA, _id(vf.device_id) or ours.get(vf.address, ""),
                                  vf.address, gpu.address) for vf in gpu.vfs}
        for address, product in ours.items():
            vfs.setdefault(address, Device(_NVIDIA, product, address, gpu.address))
        out.append(_Target(gpu.address, pf, tuple(vfs[a] for a in sorted(ours)),
                           tuple(d for a, d in sorted(vfs.items()) if a not in ours)))
    return out


_NVIDIA = "10de"


def _id(device_id: str) -> str:
    """sysfs' ``0x26ba`` as Nova's ``26b9``."""
    return device_id.lower().removeprefix("0x")


def _whitelist(entry: Entry) -> bool:
    """Whether ``entry`` is where charm-nova-compute renders its pci-passthrough-whitelist."""
    return entry.file == NOVA_CONF and (entry.section, entry.key) == ("pci", "passthrough_whitelist")


def _named(app: str, entry: Entry, shown: str) -> str:
    what = "pci-passthrough-whitelist" if _whitelist(entry) else entry.option
    return f"{app}'s {what} entry {text.one_line(shown, _ENTRY_LIMIT)}"


def _fix(app: str, entry: Entry) -> str:
    """What to change: nova-compute's option, or the entry wherever else it comes from."""
    if _whitelist(entry):
        return f"change it: juju config {app} pci-passthrough-whitelist=..."
    return (f"{entry.option} is none of {app}'s options: remove it where it comes from "
            f"(config-flags, another subordinate or a hand edit of {entry.file})")
