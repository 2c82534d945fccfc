"""Parse and validate the ``vgpu-device-mappings`` option. Pure: data in, data out.

The option is YAML (or JSON), e.g. ``{'nvidia-108': ['0000:c1:00.0']}``,
``{L40S-12Q: all}`` or ``{'GRID A100-20C': ['41:00.0']}``. Keys are type ids,
profile names (``RTX6000-Ada-12Q``, ``DC-8Q``) or the driver's names for them,
resolved per GPU by :mod:`vgpu.plan`; values are PCI addresses (lspci's
``c8:00.0``, nvidia-smi's ``00000001:C8:00.0``: both normalised to sysfs's
``0001:c8:00.0``) or ``all``. It is
parsed with every scalar kept as a string (so ``0000:04:00.0`` never becomes
a YAML 1.1 sexagesimal number), without aliases, tags that build objects or
duplicate keys, and within a size bound; then checked against a JSON Schema
kept beside this module; then against the host and the OpenStack release.

Everything the option brings has passed both the schema and a ``fullmatch``
here, so no key or address can carry a newline, ``]``, ``,``, ``=`` or
anything else that would start another setting; what reaches nova.conf is
built from sysfs and checked again by :mod:`vgpu.novaconf`.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional, Tuple

from .profiles import NAME_KEY
from .record import NamedTuple
from .text import listing, quote

if TYPE_CHECKING:  # plan is imported only where a host check needs it
    from .plan import Plan

SCHEMA_FILE = Path(__file__).with_name("vgpu-device-mappings.schema.json")
MAX_BYTES = 64 * 1024
MAX_DEPTH = 8

_TYPE = r"nvidia-(0|[1-9][0-9]{0,5})"  # patterns compiled by re when used: not on every hook
# The profile-name grammar of vgpu.pci (the schema's pattern too), compiled by ``re`` when a
# mapping's text is checked (not on steady hooks).
_NAME = NAME_KEY
ALL = "all"
PASSTHROUGH = "passthrough"  # the key whose GPUs go whole to guests (see vgpu.plan)
_NULLS = ("", "~", "null", "Null", "NULL")  # YAML 1.1 and 1.2 spellings of null
_ADDRESS = r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{2}):([01][0-9a-f])\.([0-7])"

Mapping_ = Dict[str, Tuple[str, ...]]


class Validation(NamedTuple):
    """The normalised mapping, or the reasons it is refused.

    ``mapping`` is key -> sorted addresses, or ``("all",)``; ``plan`` is set
    once the mapping was checked against a host; ``passthrough``: the sorted
    addresses of the GPUs the ``passthrough`` key gives whole to guests.
    """

    mapping: Mapping[str, Tuple[str, ...]]
    errors: Tuple[str, ...] = ()
    plan: Optional["Plan"] = None
    passthrough: Tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when nothing was refused."""
        return not self.errors


def normalise_address(text: str) -> str:
    """``c1:00.0`` or ``00000000:C1:00.0`` -> ``0000:c1:00.0`` (what Nova compares)."""
    match = re.fullmatch(_ADDRESS, text.lower())
    if not match:
        raise ValueError(f"{quote(text)} is not a PCI address like 0000:c1:00.0")
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{bus}:{device}.{function}"


def parse(text: Optional[str]):
    """The option's text as plain data; raises ValueError with a one-line reason."""
    if text is None or not text.strip():
        return {}
    if len(text.encode("utf-8", errors="replace")) > MAX_BYTES:
        raise ValueError(f"is larger than {MAX_BYTES // 1024} KiB")
    import yaml  # only hooks that have a mapping to read pay for it

    loader = None
    try:
        loader = _loader_class()(text)  # the reader refuses control characters here
        node = loader.get_single_node()
        # Scalars stay strings, so YAML's null (~, null) is read by hand: as the whole
        # option it means no types, like an empty option. Quoted, it stays a string.
        if node is None or (isinstance(node, yaml.ScalarNode) and node.style is None
                            and node.value in _NULLS):
            return {}
        data = loader.construct_document(node)
    except ValueError:
        raise
    except (yaml.YAMLError, RecursionError) as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or getattr(error, "reason", None) \
            or type(error).__name__
        raise ValueError(f"is not valid YAML or JSON{where}: {problem}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return {} if data is None or data == "" else data


def check_schema(data) -> List[str]:
    """Every way ``data`` breaks the JSON Schema, as one-line messages naming the entry."""
    import jsonschema

    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    messages = []
    for error in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.absolute_path]):
        messages.append(_describe(error, schema))
    return sorted(set(messages), key=messages.index)


def normalise(data) -> Mapping_:
    """Schema-valid data -> {key: sorted unique normalised addresses, or ("all",)}.

    Type ids come first in numeric order, then names in the order written.
    """
    mapping: Mapping_ = {}
    for key in sorted(data, key=_type_number):
        if key == PASSTHROUGH:
            mapping[key] = tuple(sorted({normalise_address(a) for a in data[key]}))
            continue
        if not (re.fullmatch(_TYPE, key) or re.fullmatch(_NAME, key)):
            raise ValueError(f"type {quote(key)} is not a vGPU type id like nvidia-108 "
                             "or a profile name like A100-20C")
        value = data[key]
        if value == ALL:
            mapping[key] = (ALL,)
        else:
            mapping[key] = tuple(sorted({normalise_address(a) for a in value}))
    return mapping


def check_text(text: Optional[str]) -> Validation:
    """Parse, schema-check and normalise the option: everything that needs no host."""
    try:
        data = parse(text)
    except ValueError as error:
        return Validation({}, (f"vgpu-device-mappings {error}",))
    errors = check_schema(data)
    if errors:
        return Validation({}, tuple(errors))
    try:
        mapping = normalise(data)
    except ValueError as error:
        return Validation({}, (str(error),))
    whole = mapping.pop(PASSTHROUGH, ())
    return Validation(mapping, passthrough=whole)


def against_host(checked: Validation, host, release=None, offered=None, *,
                 pci_in_placement: bool = False, live_migration: bool = False,
                 whole_gpus=None, vanished=(), one_time_use: bool = False,
                 other_drivers=None) -> Validation:
    """``checked`` (from check_text) resolved on the host into a plan.

    The host's and the release's objections become its errors. ``offered``:
    learnt types per GPU; ``pci_in_placement`` and ``live_migration``: the
    charm options of those names (see plan.option_problems); ``whole_gpus``:
    each VFIO GPU's framebuffer in GB when known (catalogue.whole_gpus);
    ``vanished``: published functions not found now (see plan.build);
    ``one_time_use``: the passthrough-one-time-use option; ``other_drivers``: names
    learnt for each GPU's board under other drivers (catalogue.other_drivers). The ``passthrough``
    GPUs of ``checked`` join the plan (whole GPUs).
    """
    if not checked.ok:
        return checked
    from . import plan

    built = plan.build(checked.mapping, host, release, offered,
                       pci_in_placement=pci_in_placement, live_migration=live_migration,
                       whole_gpus=whole_gpus, vanished=vanished, passthrough=checked.passthrough,
                       one_time_use=one_time_use, other_drivers=other_drivers)
    return Validation(checked.mapping, built.errors, built, checked.passthrough)


def fingerprint(text: Optional[str]) -> str:
    """Identifies the option's text under this very code and schema (for reusing check_text).

    The schema and this module are part of the key, so a charm upgrade that
    changes either checks the text again.
    """
    digest = hashlib.sha256(SCHEMA_FILE.read_bytes())
    digest.update(Path(__file__).read_bytes())
    digest.update(b"\0" + (text or "").encode("utf-8", errors="surrogatepass"))
    return digest.hexdigest()


def to_record(checked: Validation) -> dict:
    """check_text's result as plain data (for the charm's stored state)."""
    return {"mapping": {t: list(a) for t, a in checked.mapping.items()},
            "errors": list(checked.errors), PASSTHROUGH: list(checked.passthrough)}


def from_record(record) -> Validation:
    """The Validation that to_record stored (the charm's stored state) back."""
    return Validation({t: tuple(a) for t, a in dict(record["mapping"]).items()},
                      tuple(record["errors"]), passthrough=tuple(record.get(PASSTHROUGH) or ()))


def summary(mapping: Mapping[str, Tuple[str, ...]]) -> str:
    """``nvidia-108 on 1, nvidia-109 on 2`` (number of GPUs or VFs per type).

    A type without addresses (Queens to Train, which ignore them) serves every
    GPU that offers it.
    """
    return ", ".join(f"{t} on {len(a)}" if a and a != (ALL,) else f"{t} on every GPU offering it"
                     for t, a in mapping.items())


def kept(mapping: Mapping[str, Tuple[str, ...]]) -> str:
    """What nova-compute keeps, address by address: ``nvidia-35 on 0000:84:00.0, nvidia-36 on ...``.

    For a message that says the option was not applied: what stays in
    force is named exactly as published (a type on several functions:
    ``nvidia-474 on 16 (0000:41:00.4, ... and 12 more)``), whether or not
    the GPU named offers the type; a type without addresses is what Queens
    to Train do with it.
    """
    def where(addresses: Tuple[str, ...]) -> str:
        if not addresses or addresses == (ALL,):
            return "every GPU offering it"
        if len(addresses) == 1:
            return addresses[0]
        return f"{len(addresses)} ({listing(addresses)})"

    return ", ".join(f"{t} on {where(tuple(a))}" for t, a in mapping.items())


def _type_number(vgpu_type: str):
    match = re.fullmatch(_TYPE, vgpu_type) if isinstance(vgpu_type, str) else None
    return (0, int(match.group(1)), "") if match else (1, 0, str(vgpu_type))


def _describe(error, schema) -> str:
    path = list(error.absolute_path)
    where = list(error.relative_schema_path)
    if path and path[0] == PASSTHROUGH:
        return _describe_passthrough(error, path)
    if "propertyNames" in where:
        return (f"type {quote(error.instance)} is not a vGPU type id like nvidia-108 "
                "or a profile name like A100-20C")
    if not path:
        if error.validator == "maxProperties":
            return f"maps {len(error.instance)} vGPU types; at most {schema['maxProperties']}"
        return ("vgpu-device-mappings must map vGPU types to lists of PCI addresses, "
                "like {nvidia-108: ['0000:c1:00.0']}")
    plain = re.fullmatch(_TYPE, str(path[0])) or re.fullmatch(_NAME, str(path[0]))
    vgpu_type = path[0] if plain else quote(path[0])
    if len(path) == 1:
        if error.validator == "minItems":
            return f"{vgpu_type}: lists no PCI address"
        if error.validator == "maxItems":
            return f"{vgpu_type}: lists more than {error.validator_value} addresses"
        return f'{vgpu_type}: expected a list of PCI addresses or "all", got {quote(error.instance)}'

    return f"{vgpu_type}: {quote(error.instance)} is not a PCI address like 0000:c1:00.0"


def _describe_passthrough(error, path) -> str:
    """A schema error under the ``passthrough`` key, naming it."""
    if len(path) > 1:
        return f"{PASSTHROUGH}: {quote(error.instance)} is not a PCI address like 0000:c1:00.0"
    if error.validator == "minItems":
        return f"{PASSTHROUGH}: lists no PCI address"
    if error.validator == "maxItems":
        return f"{PASSTHROUGH}: lists more than {error.validator_value} addresses"
    return (f"{PASSTHROUGH}: expected a list of whole GPUs' PCI addresses (never all: "
            f"name each GPU given whole to guests), got {quote(error.instance)}")


def _loader_class():
    """A SafeLoader-like class that keeps scalars as strings and refuses aliases and duplicates."""
    import yaml  # already imported by check_text, which alone calls this

    class StringLoader(yaml.reader.Reader, yaml.scanner.Scanner, yaml.parser.Parser,
                       yaml.composer.Composer, yaml.constructor.SafeConstructor,
                       yaml.resolver.BaseResolver):
        def __init__(self, stream):
            yaml.reader.Reader.__init__(self, stream)
            yaml.scanner.Scanner.__init__(self)
            yaml.parser.Parser.__init__(self)
            yaml.composer.Composer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.BaseResolver.__init__(self)
            self._depth = 0

        def compose_node(self, parent, index):
            if self.check_event(yaml.events.AliasEvent):
                raise ValueError("uses a YAML alias (*name); write each entry out")
            self._depth += 1
            try:
                if self._depth > MAX_DEPTH:
                    raise ValueError(f"is nested deeper than {MAX_DEPTH} levels")
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1

        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise ValueError("uses a YAML merge key (<<); write each entry out")
                key = key_node.value if isinstance(key_node.value, str) else None
                if key is not None and key in seen:
                    raise ValueError(f"lists {quote(key)} twice")
                seen.add(key)
            return super().construct_mapping(node, deep=deep)

    return StringLoader
