"""Every [pci] alias, device_spec and command the documentation shows works when typed.

README.md, every page of docs/ and config.yaml show ``[pci] alias`` and ``[pci] device_spec``
entries that operators paste into nova-cloud-controller's and nova-compute's
``pci-alias`` and read back from ``nova.conf``. Each one is found here (every
JSON object in the text: one with a ``name`` is an alias, one with an
``address`` a device spec) and put through Nova's own rules:

* aliases: the JSON schema ``_ALIAS_SCHEMA``, the parsing of
  ``get_alias_from_config`` (``live_migratable`` as a strict boolean, one
  ``device_type`` and NUMA policy per name) and ``_validate_required_ids`` /
  ``_validate_multispec``, replicated below from ``nova/pci/request.py`` at
  Nova commit 00a030403f672b975364c855b7d25b40ef83e757 (master, 34.x). The id
  check arrived in acc6221660d5113314c66361cace9e3982fa76bf and nova-compute
  runs it at start since ae064caf169b6d5888a5aec692b911c57c439ca4 (both
  32.0.0, 2025.2 Flamingo): without ``[filter_scheduler] pci_in_placement``
  on that host (nova-compute's charm never sets it), an alias without
  ``vendor_id`` and ``product_id`` stops nova-compute;
* device specs: the rules ``unit_tests/test_nova_rules.py`` replicates from
  ``nova/pci/devspec.py``;
* the tests marked ``nova`` (run by ``make nova-functional`` against each Nova
  version it installs), both also through Nova's real functions, and the replica
  against Nova on the same cases.

Every ``pci_passthrough:alias=NAME:N`` in the documentation must name an alias
it defines, and every NVIDIA alias must match, by ids, a device spec it shows.

The commands are checked against the charm itself: every ``juju run <unit>
<action> k=v`` names an action of actions.yaml with its parameters (or one of
the principal's, listed below), every ``juju config <app> <option>=...`` an
option of config.yaml (or a neighbour's, listed below), every ``make <target>``
a target of the Makefile, and every relative link resolves, anchors included.
"""

import json
import re
import shlex
from pathlib import Path

import jsonschema
import pytest

from unit_tests.test_nova_rules import nova_devspec, placement_class

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md",) + tuple(sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md")))
DOCS = PAGES + ("config.yaml",)

# nova/pci/request.py _ALIAS_SCHEMA; nova/pci/utils.py PCI_VENDOR_PATTERN;
# nova/objects/fields.py PciDeviceType (vDPA excluded) and PCINUMAAffinityPolicy.
HEX4 = "^([\\da-fA-F]{4})$"
ALIAS_SCHEMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 256},
        "capability_type": {"type": "string", "enum": ["pci"]},
        "product_id": {"type": "string", "pattern": HEX4},
        "vendor_id": {"type": "string", "pattern": HEX4},
        "device_type": {"type": "string", "enum": ["type-PCI", "type-PF", "type-VF"]},
        "numa_policy": {"type": "string",
                        "enum": ["required", "legacy", "preferred", "socket"]},
        "resource_class": {"type": "string"},
        "traits": {"type": "string"},
        "live_migratable": {"type": "string"},
    },
    "required": ["name"],
}
# oslo_utils.strutils.bool_from_string(strict=True)
BOOL_STRINGS = {"1", "t", "true", "on", "y", "yes", "0", "f", "false", "off", "n", "no"}
FLAVOR_ALIAS = re.compile(r"pci_passthrough:alias=([A-Za-z0-9_.-]+):(\d+)")


class InvalidAliasError(ValueError):
    """What nova.exception.PciInvalidAlias stands for here."""


def nova_aliases(texts, pci_in_placement=False, nova=34):
    """get_alias_from_config and _validate_aliases on ``[pci] alias`` values, replicated.

    Returns ``{name: (numa_policy, [spec, ...])}``; raises InvalidAliasError where
    Nova raises PciInvalidAlias (and nova-compute 32+ does not start). ``nova``: the
    major version; ``_validate_aliases`` (ids, one spec per name in Placement) came
    with 32.0.0 (commit acc6221660), and before it Nova 31 only parses.
    """
    aliases = {}
    for text in texts:
        name, policy, spec = _parsed_alias(text)
        if name not in aliases:
            aliases[name] = (policy, [spec])
            continue
        if aliases[name][0] != policy:
            raise InvalidAliasError(f"NUMA policy mismatch for alias '{name}'")
        first = aliases[name][1][0]
        if "dev_type" not in first or "dev_type" not in spec \
                or first["dev_type"] != spec["dev_type"]:
            raise InvalidAliasError(f"Device type mismatch for alias '{name}'")  # or a KeyError
        aliases[name][1].append(spec)
    if nova < 32:
        return aliases
    for name, (_, specs) in aliases.items():
        if pci_in_placement and len(specs) > 1:  # _validate_multispec
            raise InvalidAliasError(f"{name} has multiple specs but pci_in_placement is True")
        for spec in specs:  # _validate_required_ids
            ids = "vendor_id" in spec and "product_id" in spec
            if not ids and not (pci_in_placement and "resource_class" in spec):
                raise InvalidAliasError(f"The PCI alias(es) {name} does not have vendor_id and "
                                        "product_id fields set")
    return aliases


def _parsed_alias(text):
    """One alias as get_alias_from_config reads it: (name, numa_policy, spec)."""
    spec = json.loads(text)
    try:
        jsonschema.validate(spec, ALIAS_SCHEMA)
    except jsonschema.ValidationError as error:
        raise InvalidAliasError(error.message) from None
    name = spec.pop("name").strip()
    policy = spec.pop("numa_policy", None) or "legacy"
    if spec.get("device_type"):
        spec["dev_type"] = spec.pop("device_type")
    if "live_migratable" in spec and spec["live_migratable"].lower() not in BOOL_STRINGS:
        raise InvalidAliasError(f"live_migratable {spec['live_migratable']!r}")
    return name, policy, spec


def json_objects(text):
    """Every JSON object written in ``text`` (outermost ones; lists give their items)."""
    decoder = json.JSONDecoder()
    found, end = [], 0
    for match in re.finditer(r"[\[{]", text):
        if match.start() < end:
            continue
        try:
            value, stop = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        items = value if isinstance(value, list) else [value]
        objects = [item for item in items if isinstance(item, dict)]
        if objects:
            found.extend(json.dumps(item) for item in objects)
            end = stop
    return found


def documented(kind):
    """``[(file, json text)]`` of the aliases (``name``) or device specs (``address``)."""
    key = {"alias": "name", "device_spec": "address"}[kind]
    return [(doc, text) for doc in DOCS
            for text in json_objects((REPO / doc).read_text()) if key in json.loads(text)]


ALIASES = documented("alias")
SPECS = documented("device_spec")


def entry_id(entry):
    """``README.md:vgpu-l40s-12q`` or ``README.md:0000:81:00.4`` for test ids."""
    doc, text = entry
    value = json.loads(text)
    return f"{doc}:{value.get('name') or value.get('address')}"


def test_the_documentation_shows_aliases_and_device_specs():
    # Both files are searched; the README shows aliases and specs of both GPU models.
    names = {json.loads(text)["name"] for _, text in ALIASES}
    assert {"vgpu-l40s-12q", "vgpu-h200x-35c"} <= names, names
    products = {json.loads(text)["product_id"] for _, text in SPECS}
    assert {"26b9", "2335"} <= products, products


@pytest.mark.parametrize("doc,text", ALIASES, ids=[entry_id(e) for e in ALIASES])
def test_every_documented_alias_starts_nova_compute(doc, text):
    # nova-compute's host has no [filter_scheduler] pci_in_placement: ids are required there.
    nova_aliases([text], pci_in_placement=False)
    # The controllers may have it (pci-in-placement): the same alias holds there too.
    nova_aliases([text], pci_in_placement=True)


@pytest.mark.parametrize("doc,text", ALIASES, ids=[entry_id(e) for e in ALIASES])
def test_every_nvidia_alias_asks_for_a_vf_the_documentation_publishes(doc, text):
    alias = json.loads(text)
    if alias.get("vendor_id") != "10de":
        return  # another device's alias (the principal's own NIC)
    specs = [json.loads(spec) for _, spec in SPECS]
    if alias.get("device_type") in ("type-PF", "type-PCI"):  # a GPU given whole (passthrough)
        assert alias["name"].startswith("gpu-"), text
        whole = [s for s in specs if s["product_id"] == alias["product_id"]
                 and s["resource_class"].startswith("CUSTOM_GPU_")]
        assert whole, f"no whole-GPU device_spec shown for product {alias['product_id']}: {text}"
        assert alias.get("resource_class", whole[0]["resource_class"]) == whole[0]["resource_class"]
        return
    assert alias.get("device_type") == "type-VF", text  # else the charm publishes VFs
    matching = [s for s in specs if s["product_id"] == alias["product_id"]]
    assert matching, f"no device_spec shown for product {alias['product_id']}: {text}"
    if "resource_class" in alias:  # the class the charm gives the alias's profile
        profile = alias["name"].removeprefix("vgpu-")
        assert alias["resource_class"] == "CUSTOM_VGPU_" + profile.upper().replace("-", "_"), text
        assert placement_class(alias["resource_class"]) == alias["resource_class"]


@pytest.mark.parametrize("doc,text", SPECS, ids=[entry_id(e) for e in SPECS])
def test_every_documented_device_spec_passes_novas_rules(doc, text):
    rc = nova_devspec(text)
    assert placement_class(rc) == rc


def test_the_documentation_is_the_readme_and_every_page_of_docs():
    assert "docs/index.md" in PAGES and "docs/how-to/flavors.md" in PAGES, PAGES


def test_every_flavor_alias_in_the_documentation_is_defined_there():
    wanted = [(page, name, count) for page in PAGES
              for name, count in FLAVOR_ALIAS.findall((REPO / page).read_text())]
    assert {page for page, _, _ in wanted} >= {"README.md", "docs/how-to/flavors.md"}, wanted
    defined = {json.loads(text)["name"] for doc, text in ALIASES}
    assert {(page, name) for page, name, _ in wanted if name not in defined} == set()
    # A flavor asks for a positive count.
    assert all(int(count) >= 1 for _, _, count in wanted)


# [pci] alias values, whether [filter_scheduler] pci_in_placement is on, and whether Nova takes them.
SINGLE_ALIASES = [
    ('{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
     False, True),
    ('{"name": "a", "resource_class": "CUSTOM_VGPU_L40S_12Q"}', False, False),
    ('{"name": "a", "resource_class": "CUSTOM_VGPU_L40S_12Q"}', True, True),
    ('{"name": "a", "vendor_id": "10de"}', True, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "device_type": "type-VDPA"}',
     False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26bag"}', False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "gpu": "yes"}', False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "live_migratable": "maybe"}',
     False, False),
    ('{"name": "a", "vendor_id": "10de", "product_id": "26ba", "live_migratable": "yes",'
     ' "resource_class": "CUSTOM_VGPU_L40S_12Q", "device_type": "type-VF"}', True, True),
    ('{"name": "", "vendor_id": "10de", "product_id": "26ba"}', False, False),
]


@pytest.mark.parametrize("text,in_placement,ok", SINGLE_ALIASES)
def test_the_replica_refuses_what_nova_refuses(text, in_placement, ok):
    if ok:
        nova_aliases([text], pci_in_placement=in_placement)
    else:
        with pytest.raises(InvalidAliasError):
            nova_aliases([text], pci_in_placement=in_placement)


@pytest.mark.nova
@pytest.mark.parametrize("text,in_placement,ok", SINGLE_ALIASES)
def test_nova_itself_refuses_what_the_replica_refuses(text, in_placement, ok):
    nova = _nova_major()
    assert _real_nova_accepts([text], in_placement) == _replica_accepts([text], in_placement, nova)
    if nova >= 32:
        assert _real_nova_accepts([text], in_placement) == ok


# Several [pci] alias values, the same way.
JOINED_ALIASES = [
    # One name may list several devices (ORed), one device type and NUMA policy for all...
    (['{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "233c"}'],
     False, True),
    # ...but not with pci_in_placement,
    (['{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "233c"}'],
     True, False),
    # and not with different device types or a missing one.
    (['{"name": "a", "device_type": "type-VF", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "device_type": "type-PF", "vendor_id": "10de", "product_id": "233c"}'],
     False, False),
    (['{"name": "a", "vendor_id": "10de", "product_id": "26ba"}',
      '{"name": "a", "vendor_id": "10de", "product_id": "233c"}'], False, False),
]


@pytest.mark.parametrize("texts,in_placement,ok", JOINED_ALIASES)
def test_the_replica_joins_aliases_of_one_name_as_nova_does(texts, in_placement, ok):
    if ok:
        assert len(nova_aliases(texts, pci_in_placement=in_placement)["a"][1]) == 2
    else:
        with pytest.raises(InvalidAliasError):
            nova_aliases(texts, pci_in_placement=in_placement)


@pytest.mark.nova
@pytest.mark.parametrize("texts,in_placement,ok", JOINED_ALIASES)
def test_nova_itself_joins_aliases_as_the_replica_does(texts, in_placement, ok):
    nova = _nova_major()
    assert _real_nova_accepts(texts, in_placement) == _replica_accepts(texts, in_placement, nova)
    if nova >= 32:
        assert _real_nova_accepts(texts, in_placement) == ok


def test_before_nova_32_aliases_are_only_parsed():
    """Nova 31 takes what 32 refuses for missing ids or several specs in Placement."""
    no_ids = ['{"name": "a", "resource_class": "CUSTOM_VGPU_L40S_12Q"}']
    assert _replica_accepts(no_ids, False, 31) and not _replica_accepts(no_ids, False, 32)
    two = JOINED_ALIASES[1][0]  # one name, two products
    assert _replica_accepts(two, True, 31) and not _replica_accepts(two, True, 32)
    bad = ['{"name": "a", "vendor_id": "10de", "product_id": "26bag"}']
    assert not _replica_accepts(bad, False, 31)


@pytest.mark.nova
def test_nova_itself_accepts_the_documented_entries():
    from nova.pci import devspec, request

    for _, text in ALIASES:
        for in_placement in (False, True):
            assert _real_nova_accepts([text], in_placement), text
    assert isinstance(_nova_alias_reader(request)(), dict)
    for _, text in SPECS:
        devspec.PciDeviceSpec(json.loads(text))


def _replica_accepts(texts, pci_in_placement, nova):
    try:
        nova_aliases(texts, pci_in_placement=pci_in_placement, nova=nova)
    except InvalidAliasError:
        return False
    return True


def _nova_major():
    from importlib.metadata import version

    return int(version("nova").split(".")[0])


def _nova_alias_reader(request):
    """get_alias_from_config (Nova 32+, cached) or _get_alias_from_config (31)."""
    return getattr(request, "get_alias_from_config", None) or request._get_alias_from_config


def _real_nova_accepts(texts, pci_in_placement):
    """Whether Nova's own reader of ``[pci] alias`` (nova.pci.request) accepts these values."""
    import nova.conf
    from nova import exception
    from nova.pci import request

    read = _nova_alias_reader(request)
    forget = getattr(read, "cache_clear", lambda: None)
    conf = nova.conf.CONF
    conf.set_override("alias", list(texts), group="pci")
    conf.set_override("pci_in_placement", pci_in_placement, group="filter_scheduler")
    forget()
    try:
        read()
        return True
    except exception.PciInvalidAlias:
        return False
    finally:
        conf.clear_override("alias", group="pci")
        conf.clear_override("pci_in_placement", group="filter_scheduler")
        forget()


# -- Commands and links ------------------------------------------------------------------------

# Actions of the principal the documentation runs (charm-nova-compute's actions.yaml).
PRINCIPAL_ACTIONS = {"nova-compute": {"pause": set(), "resume": set(), "openstack-upgrade": set()}}
# Options of the neighbouring charms the documentation sets (their config.yaml), by application.
NEIGHBOUR_OPTIONS = {
    # charm-nova-compute's config.yaml (its live-migration-* options: docs/how-to/live-migration.md)
    "nova-compute": {"pci-alias", "pci-passthrough-whitelist", "openstack-origin", "config-flags",
                     "debug", "enable-live-migration", "live-migration-permit-post-copy",
                     "live-migration-downtime", "live-migration-downtime-steps",
                     "live-migration-downtime-delay"},
    "nova-cloud-controller": {"pci-alias", "scheduler-default-filters", "openstack-origin",
                              "config-flags", "debug",
                              "pci-in-placement"},  # newer revisions: docs/how-to/pci-in-placement.md
}
JUJU_RUN = re.compile(r"juju run (?:--\S+ )*(\S+) (\S+)((?: [A-Za-z][\w-]*=\S*)*)")
JUJU_CONFIG = re.compile(r"juju config (\S+) ([A-Za-z][\w-]*)=")
# make in command position: a line's start (after a prompt), or after && || | ( or sudo;
# "apt install git make python3-venv" names the package, and "...; make it installable" in a
# status message is prose, not a target.
MAKE = re.compile(r"(?:^\s*(?:\$\s+)?|(?:&&|\|\||[|(])\s*|sudo\s+)make ([a-z][\w-]*)")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.M | re.S)  # indented in lists too


def code_segments(text):
    """The text of every fenced block (line by line) and inline code span (lines joined)."""
    out = []
    for block in FENCE.findall(text):
        out.extend(block.splitlines()[1:-1])
    prose = FENCE.sub("", text)
    out.extend(" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose))
    return out


def _yaml(name):
    import yaml

    return yaml.safe_load((REPO / name).read_text())


def makefile_targets(text):
    """The targets a Makefile defines (rules and .PHONY), variables' own paths left out."""
    targets = set(re.findall(r"^([A-Za-z][\w.-]*)\s*:(?!=)", text, re.M))
    for phony in re.findall(r"^\.PHONY\s*:(.*)$", text, re.M):
        targets.update(phony.split())
    return targets


def command_problems(text, actions, options, targets):
    """What is wrong with the juju run, juju config and make commands in ``text``."""
    problems = []
    for segment in code_segments(text):
        problems += _run_problems(segment, actions) + _config_problems(segment, options)
        problems += [f"make {target}: no such target in the Makefile"
                     for target in MAKE.findall(segment) if target not in targets]
    return problems


def _run_problems(segment, actions):
    problems = []
    for unit, action, params in JUJU_RUN.findall(segment):
        if unit.startswith("<") or action.startswith("<"):
            continue  # a placeholder
        known = PRINCIPAL_ACTIONS.get(unit.split("/")[0], actions)
        if action not in known:
            problems.append(f"juju run {unit} {action}: no such action")
            continue
        problems += [f"juju run {unit} {action}: no parameter {name}"
                     for name in re.findall(r"([A-Za-z][\w-]*)=", params)
                     if name not in known[action]]
    return problems


def _config_problems(segment, options):
    return [f"juju config {app} {option}: no such option"
            for app, option in JUJU_CONFIG.findall(segment)
            if not app.startswith(("<", "$")) and option not in NEIGHBOUR_OPTIONS.get(app, options)]


def anchors(text):
    """GitHub's anchors for the headings of a Markdown text (duplicates numbered)."""
    out, seen = set(), {}
    for heading in re.findall(r"^#+ (.*)$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    return out


def link_problems(page, text, root=REPO):
    """Relative links of ``page`` (a path under ``root``) that lead nowhere."""
    problems = []
    for target in LINK.findall(FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        dest = (root / page).parent / path if path else root / page
        if not dest.exists():
            problems.append(f"{page}: {target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            problems.append(f"{page}: {target}: no such heading")
    return problems


# A section of another page named in prose: **Term** in [Page](page.md), or "Title" section.
BOLD_REF = re.compile(r"\*\*([^*]+?)\*\*\s+(?:in|under)\s+(?:the\s+)?"
                      r"(?:\[[^\]]*\]\(([^)\s]+)\)|([A-Z][\w-]*(?:\s+[A-Z][\w-]*)*))")
_PAGE = r"(?:\[[^\]]*\]\(([^)\s]+)\)|(README))"  # a link, or the README by name
QUOTED_REF = re.compile(rf"(?:{_PAGE}'s\s+)?[\"“]([^\"”\n]{{1,80}})[\"”]\s+section\b"
                        rf"(?:\s+(?:of|in)\s+(?:the\s+)?{_PAGE})?")


def section_names(text):
    """What a page's sections are called: its headings and its bold lead-ins (**Term.**)."""
    prose = FENCE.sub("", text)
    names = {h.strip() for h in re.findall(r"^#+ (.*)$", prose, re.M)}
    names |= {b.strip().rstrip(".:,").strip() for b in re.findall(r"\*\*([^*]+?)\*\*", prose)}
    return {name.lower() for name in names}


def section_ref_problems(page, text, root=REPO):
    """Sections of other pages that ``page`` names but that page does not have.

    ``**Term** in [Page](link)`` needs a heading or bold lead-in ``Term`` on the linked page;
    a bold term ``in``/``under`` a page named without a link, and a ``"Title" section``
    whose page is neither linked just before it nor the README, name no page to check.
    """
    prose = FENCE.sub("", text)
    problems = []
    for term, target, unlinked in BOLD_REF.findall(prose):
        if unlinked:
            problems.append(f"{page}: **{term}** under {unlinked}: link the page that has it")
            continue
        if re.match(r"[a-z]+:", target):
            continue
        dest = (root / page).parent / target.partition("#")[0]
        if dest.is_file() and term.strip().lower() not in section_names(dest.read_text()):
            problems.append(f"{page}: **{term}**: no such section in {target}")
    for link, readme, title, link_after, readme_after in QUOTED_REF.findall(prose):
        target = (link or link_after).partition("#")[0]
        dest = ((root / page).parent / target if target
                else root / "README.md" if readme or readme_after else None)
        if dest is None:
            problems.append(f"{page}: \"{title}\" section: link the page that has it")
        elif not dest.is_file() or title.strip().lower() not in section_names(dest.read_text()):
            problems.append(f"{page}: \"{title}\" section: no such section in "
                            f"{target or 'README.md'}")
    return problems


def _charm_actions():
    return {name: set((spec or {}).get("params", {})) for name, spec in _yaml("actions.yaml").items()}


@pytest.mark.parametrize("page", PAGES)
def test_every_command_in_the_documentation_is_real(page):
    problems = command_problems((REPO / page).read_text(), _charm_actions(),
                                set(_yaml("config.yaml")["options"]),
                                makefile_targets((REPO / "Makefile").read_text()))
    assert problems == []


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_in_the_documentation_resolves(page):
    assert link_problems(page, (REPO / page).read_text()) == []


def test_the_documentation_shows_the_commands_it_checks():
    segments = [s for page in PAGES for s in code_segments((REPO / page).read_text())]
    runs = {action for s in segments for _, action, _ in JUJU_RUN.findall(s)}
    assert set(_charm_actions()) <= runs, set(_charm_actions()) - runs
    configured = {option for s in segments for _, option in JUJU_CONFIG.findall(s)}
    assert set(_yaml("config.yaml")["options"]) - {"force-install-nvidia-vgpu"} <= configured
    assert {"demo", "test"} <= {t for s in segments for t in MAKE.findall(s)}


@pytest.mark.parametrize("text,problem", [
    ("`juju run nova-compute-nvidia-vgpu/0 upgrade forse=true`", "no parameter forse"),
    ("```\njuju run nova-compute-nvidia-vgpu/0 list-gpus\n```", "list-gpus: no such action"),
    ("`juju run nova-compute/3 upgrade`", "no such action"),  # the principal has no upgrade
    ("`juju config nova-compute-nvidia-vgpu pci-in-placment=true`", "no such option"),
    ("`juju config nova-compute vgpu-device-mappings=x`", "no such option"),
    ("```\nmake tset ARGS=-q\n```", "make tset"),
    ("`cd x && make lint-all`", "make lint-all"),
    ("```\n$ make tset\n```", "make tset"),
])
def test_the_command_check_finds_what_is_wrong(text, problem):
    actions = {"upgrade": {"force"}, "list-vgpu-types": set()}
    found = command_problems(text, actions, {"pci-in-placement"}, {"test", "lint"})
    assert len(found) == 1 and problem in found[0], found
    # The same text, spelt right, passes.
    right = (text.replace("forse", "force").replace("list-gpus", "list-vgpu-types")
             .replace("nova-compute/3 upgrade", "nova-compute/3 pause")
             .replace("placment", "placement").replace("nova-compute vgpu-device-mappings",
                                                       "nova-compute pci-alias")
             .replace("tset", "test").replace("lint-all", "lint"))
    assert command_problems(right, actions, {"pci-in-placement"}, {"test", "lint"}) == []


def test_the_link_check_finds_missing_files_and_headings(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A page\n\n## PCI in Placement (opt-in)\n")
    page = ("# The `p` page\n[ok](a.md#pci-in-placement-opt-in) [self](#the-p-page) [web](https://x.org/)\n"
            "[gone](b.md) [no heading](a.md#pci-in-placement) [up](../README.md)\n"
            "  ```\n  [in code](nowhere.md)\n  # not a heading\n  ```\n[no](#not-a-heading)\n")
    (tmp_path / "docs" / "p.md").write_text(page)
    problems = link_problems("docs/p.md", page, root=tmp_path)
    assert problems == ["docs/p.md: b.md: no such file",
                        "docs/p.md: a.md#pci-in-placement: no such heading",
                        "docs/p.md: ../README.md: no such file",
                        "docs/p.md: #not-a-heading: no such heading"], problems


@pytest.mark.parametrize("page", PAGES)
def test_every_section_of_another_page_the_documentation_names_exists(page):
    assert section_ref_problems(page, (REPO / page).read_text()) == []


def test_the_section_check_finds_sections_that_are_not_there(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# R\n\n## Removal\n")
    (tmp_path / "docs" / "t.md").write_text("# T\n\n**IOMMU off.** Text.\n\n- **GPUs vanish.** x\n")
    page = ("See **IOMMU off** in [Troubleshoot](t.md) and **GPUs vanish** under\n[T](t.md#t),\n"
            "**GPUs gone** in [Troubleshoot](t.md), **GPUs vanish** under Troubleshooting,\n"
            "the README's \"Removal\" section, the README's \"Pack\" section, the \"X\" section.\n"
            "```\n**Nowhere** in [T](t.md)\n```\n")
    assert section_ref_problems("docs/p.md", page, root=tmp_path) == [
        "docs/p.md: **GPUs gone**: no such section in t.md",
        "docs/p.md: **GPUs vanish** under Troubleshooting: link the page that has it",
        "docs/p.md: \"Pack\" section: no such section in README.md",
        "docs/p.md: \"X\" section: link the page that has it"]


def test_makefile_targets_are_read_from_rules_and_phony():
    text = ".PHONY: demo charm\nVENV ?= .venv\n$(VENV)/.ready: x\ntest: $(VENV)/.ready\nX := 1\n"
    assert makefile_targets(text) == {"demo", "charm", "test"}


@pytest.mark.parametrize("page", PAGES)
def test_the_documentation_writes_no_test_counts(page):
    # Figures like "723 passed, 2 skipped" go stale with the next test.
    assert re.findall(r"\b\d[\d,]* (?:passed|skipped|failed)\b", (REPO / page).read_text()) == []


def test_every_page_of_docs_is_linked_from_the_index():
    index = (REPO / "docs" / "index.md").read_text()
    linked = {str((REPO / "docs" / target.partition("#")[0]).resolve().relative_to(REPO))
              for target in LINK.findall(index) if not re.match(r"[a-z]+:", target)
              and target.partition("#")[0]}
    assert set(PAGES) - {"README.md", "docs/index.md"} - linked == set()


def _table_names(page):
    """The first column's code names of every table row of ``page`` (``enable-mig gpu=...`` -> enable-mig)."""
    rows = re.findall(r"^\| `([a-z][\w-]*)[^`]*` \|", (REPO / page).read_text(), re.M)
    return set(rows)


def test_the_options_reference_lists_exactly_the_options_of_config_yaml():
    documented = _table_names("docs/reference/options.md")
    assert documented == set(_yaml("config.yaml")["options"])


def test_the_actions_reference_lists_exactly_the_actions_of_actions_yaml():
    assert _table_names("docs/reference/actions.md") == set(_charm_actions())


@pytest.mark.parametrize("page", PAGES)
def test_every_code_block_of_the_documentation_is_closed(page):
    fences = re.findall(r"^[ \t]*```(\S*)", (REPO / page).read_text(), re.M)
    assert len(fences) % 2 == 0, fences
    # An info string (```console) only ever opens a block.
    assert all(info == "" for info in fences[1::2]), fences


def test_make_as_a_package_name_is_no_target():
    assert command_problems("```\nsudo apt install git make python3-venv\n```", {}, set(), {"test"}) == []
    assert command_problems("`blocked: mdevctl is missing; make it installable`", {}, set(), {"test"}) == []


# -- Where the charm comes from: juju deploy, juju refresh ----------------------------------------

CHARM = "nova-compute-nvidia-vgpu"  # metadata.yaml's name (checked below)
# juju deploy's and juju refresh's options that take a value (Juju 3's --help); the rest are flags.
JUJU_VALUED = {"--channel", "--config", "--constraints", "--resource", "--to", "-n", "--num-units",
               "--base", "--series", "--bind", "--storage", "--device", "--revision", "-m",
               "--model", "--overlay", "--attach-storage", "--path", "--switch"}


def _juju_words(segment, command):
    """``(positional words, {option: [values]})`` of each ``juju <command>`` in a code segment."""
    found = []
    for match in re.finditer(rf"\bjuju {command} (.+)", segment):
        try:
            words = shlex.split(match.group(1).rstrip("\\"), comments=True)
        except ValueError:
            continue
        positional, options = [], {}
        while words:
            word = words.pop(0)
            if word.startswith("-"):
                name, _, value = word.partition("=")
                if name in JUJU_VALUED and not value and words:
                    value = words.pop(0)
                options.setdefault(name, []).append(value)
            else:
                positional.append(word)
        found.append((positional, options))
    return found


def _local(path):
    return path.startswith(("./", "../", "/", "~")) or path.endswith((".charm", ".yaml"))


def _upstream(options):
    """Whether a Charmhub deploy or refresh names one of the upstream charm's channels.

    Charmhub's nova-compute-nvidia-vgpu is the upstream charm (openstack/charm-nova-compute-
    nvidia-vgpu), one track per OpenStack release (``2024.1/stable``): going back to it on
    purpose names that track (docs/how-to/switch-from-upstream.md); no channel, or ``latest``,
    is this charm asked for in the wrong place.
    """
    return any(re.fullmatch(r"(?!latest/)[a-z0-9.]+/(stable|candidate|beta|edge)", channel)
               for channel in options.get("--channel", []))


def deploy_problems(text):
    """What is wrong with the deploys, refreshes and resources of this charm in ``text``.

    A deploy not from a local ``.charm``, a refresh of its applications not to one, and a
    resource given twice to one application (``--resource``, then ``attach-resource``). This
    charm is not published on Charmhub, where the name is the upstream charm's: every deploy
    names the file ``make charm`` or ``charmcraft pack`` built (docs/how-to/build-the-charm.md),
    and only a deliberate return to the upstream charm names its channel (:func:`_upstream`).
    """
    segments = code_segments(text)
    deploys = [found for s in segments for found in _juju_words(s, "deploy")]
    apps, given, problems = {CHARM}, set(), []
    for positional, options in deploys:
        charm = positional[0] if positional else ""
        if charm.removeprefix("ch:") == CHARM and not _upstream(options):
            problems.append(f"juju deploy {charm}: Charmhub's {CHARM} is the upstream charm; "
                            "deploy the .charm you built")
        if _local(charm) and CHARM in charm:
            app = positional[1] if len(positional) > 1 else CHARM
            apps.add(app)
            given.update((app, r) for r in options.get("--resource", []))
    for s in segments:
        for positional, options in _juju_words(s, "refresh"):
            local = [v for v in options.get("--path", []) + options.get("--switch", []) if _local(v)]
            if positional and positional[0] in apps and not local and not _upstream(options):
                problems.append(f"juju refresh {positional[0]}: Charmhub's {CHARM} is the upstream "
                                "charm; refresh with --path to the .charm you built")
        for app, resource in re.findall(r"\bjuju attach-resource (\S+) (\S+=\S+)", s):
            if (app, resource) in given:
                problems.append(f"juju attach-resource {app} {resource}: given at deploy already")
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_every_deploy_of_the_charm_is_of_a_local_charm_with_its_resource_once(page):
    assert deploy_problems((REPO / page).read_text()) == []


def test_the_charm_is_the_one_metadata_names():
    assert _yaml("metadata.yaml")["name"] == CHARM


DEPLOYED = "juju deploy ./nova-compute-nvidia-vgpu_ubuntu@24.04-amd64.charm"
DEB = "nvidia-vgpu-software=./nvidia-vgpu-ubuntu-570_570.158.02_amd64.deb"


@pytest.mark.parametrize("text,problem", [
    ("```\njuju deploy nova-compute-nvidia-vgpu vgpu-v100\n```", "juju deploy nova-compute-nvidia-vgpu:"),
    ("`juju deploy ch:nova-compute-nvidia-vgpu --channel latest/edge`", "juju deploy ch:nova"),
    ("`juju refresh nova-compute-nvidia-vgpu --switch ch:nova-compute-nvidia-vgpu`", "upstream"),
    ("`juju refresh nova-compute-nvidia-vgpu`", "juju refresh nova-compute-nvidia-vgpu:"),
    (f"```\n{DEPLOYED} gpu-a \\\n    --resource {DEB}\njuju refresh gpu-a --channel x\n```",
     "juju refresh gpu-a:"),
    (f"```\n{DEPLOYED} --resource {DEB}\njuju attach-resource nova-compute-nvidia-vgpu {DEB}\n```",
     "given at deploy already"),
])
def test_the_deploy_check_finds_charmhub_deploys_and_resources_given_twice(text, problem):
    found = deploy_problems(text)
    assert len(found) == 1 and problem in found[0], found


def test_local_deploys_and_refreshes_pass_the_deploy_check():
    text = (f"```\n{DEPLOYED} gpu-a --resource {DEB}\n"
            "juju refresh gpu-a --path ./nova-compute-nvidia-vgpu_ubuntu@24.04-amd64.charm\n"
            "juju refresh nova-compute-nvidia-vgpu --switch ./nova-compute-nvidia-vgpu.charm\n"
            "juju attach-resource gpu-a nvidia-vgpu-software=./nvidia-vgpu-ubuntu-570_570.172.08_amd64.deb\n"
            "juju deploy nova-compute --channel 2024.1/stable\njuju refresh nova-compute\n"
            "juju refresh gpu-a --switch ch:nova-compute-nvidia-vgpu --channel 2024.1/stable\n```")
    assert deploy_problems(text) == []


# -- osc-placement: the microversion each command and option needs ------------------------------

# From openstack/osc-placement's own checks (osc_placement/resources/: resource_provider.py
# ListResourceProvider and CreateResourceProvider at e52fa969f9ee, trait.py at dbd50cbf974a,
# allocation_candidate.py at 3986993cd46b): "This param requires at least
# --os-placement-api-version N". Without the option, osc-placement asks for 1.0 and refuses.
PLACEMENT_NEEDS = {
    ("resource provider list", "--aggregate-uuid"): (1, 3),
    ("resource provider list", "--resource"): (1, 4),
    ("resource provider list", "--in-tree"): (1, 14),
    ("resource provider list", "--required"): (1, 18),
    ("resource provider list", "--forbidden"): (1, 22),
    ("resource provider create", "--parent-provider"): (1, 14),
    ("trait list", None): (1, 6), ("trait show", None): (1, 6), ("trait create", None): (1, 6),
    ("trait delete", None): (1, 6), ("resource provider trait list", None): (1, 6),
    ("resource provider trait set", None): (1, 6), ("resource provider trait delete", None): (1, 6),
    ("allocation candidate list", None): (1, 10),
    ("allocation candidate list", "--limit"): (1, 16),
    ("allocation candidate list", "--required"): (1, 17),
    ("allocation candidate list", "--aggregate-uuid"): (1, 21),
    ("allocation candidate list", "--forbidden"): (1, 22),
}


def placement_problems(text):
    """``openstack`` Placement commands that ask for less than the microversion they need.

    The version is the command's ``--os-placement-api-version``, else the
    ``OS_PLACEMENT_API_VERSION`` given before it on its line or exported on an earlier line of
    the page's code (as in one shell session), else 1.0, osc-placement's default.
    """
    problems, exported = [], "1.0"
    for segment in code_segments(text):
        export = re.match(r"\s*(?:\$\s+)?export\s+OS_PLACEMENT_API_VERSION=(\S+)", segment)
        exported = export.group(1) if export else exported
        for match in re.finditer(r"\b(?:OS_PLACEMENT_API_VERSION=(\S+)\s+)?openstack\s+(.+)", segment):
            words = match.group(2).split()
            version = match.group(1) or exported
            if "--os-placement-api-version" in words[:-1]:
                at = words.index("--os-placement-api-version")
                version = words[at + 1]
                del words[at:at + 2]
            have = tuple(int(n) for n in version.split("."))
            command = " ".join(w for w in words if not w.startswith("-"))
            for (name, option), need in PLACEMENT_NEEDS.items():
                if (command + " ").startswith(name + " ") and (option is None or option in words) \
                        and have < need:
                    problems.append(f"openstack {name}{' ' + option if option else ''} needs "
                                    f"--os-placement-api-version {need[0]}.{need[1]}, not {version}")
    return problems


@pytest.mark.parametrize("page", PAGES)
def test_every_placement_command_asks_for_the_microversion_it_needs(page):
    assert placement_problems((REPO / page).read_text()) == []


@pytest.mark.parametrize("text,problem", [
    ("`openstack resource provider list --resource VGPU=1`",
     "openstack resource provider list --resource needs --os-placement-api-version 1.4, not 1.0"),
    ("```\nopenstack --os-placement-api-version 1.10 allocation candidate list --resource VGPU=1 "
     "--limit 5\n```", "allocation candidate list --limit needs --os-placement-api-version 1.16"),
    ("`openstack resource provider trait set --trait CUSTOM_A <rp>`", "trait set needs"),
])
def test_the_placement_check_finds_a_microversion_too_low(text, problem):
    found = placement_problems(text)
    assert len(found) == 1 and problem in found[0], found


def test_commands_with_their_microversion_pass_the_placement_check():
    assert placement_problems(
        "```\nopenstack --os-placement-api-version 1.4 resource provider list --resource VGPU=1\n"
        "openstack resource provider list --name compute-1_pci_0000_c1_00_0\n"
        "OS_PLACEMENT_API_VERSION=1.16 openstack allocation candidate list --resource VGPU=1 --limit 5\n"
        "openstack resource provider usage show <rp>\nopenstack flavor set x --property a=b\n"
        "export OS_PLACEMENT_API_VERSION=1.6\nopenstack resource provider trait list <rp>\n```") == []


# -- Hooks run by hand: juju exec against the packed charm --------------------------------------

# juju exec's options that take a value (Juju 3's `juju exec --help`); the rest are flags.
JUJU_EXEC_VALUED = {"-u", "--unit", "-m", "--model", "-a", "--app", "--application", "--machine",
                    "-o", "--output", "--wait", "--format", "--execution-group"}


def juju_exec_commands(segment):
    """``(unit, command)`` of each ``juju exec`` in a code segment, as juju exec parses it.

    Options come first (``--unit X``, ``--unit=X``, ``-u X``); ``--`` or the first other word
    starts the command, whose words juju exec joins with spaces for the unit's shell.
    """
    found = []
    for match in re.finditer(r"\bjuju exec (.+)", segment):
        try:
            words = shlex.split(match.group(1), comments=True)
        except ValueError:  # an unclosed quote
            found.append((None, match.group(1)))
            continue
        unit = None
        while words and words[0].startswith("-") and words[0] != "--":
            name, _, value = words.pop(0).partition("=")
            if name in JUJU_EXEC_VALUED and not value and words:
                value = words.pop(0)
            if name in ("-u", "--unit"):
                unit = value
        found.append((unit, " ".join(words[1:] if words[:1] == ["--"] else words)))
    return found


def runs_a_hook(command):
    """Whether a juju exec command runs the charm: it names ``hooks/...`` or ``dispatch``."""
    return re.search(r"(?:^|[\s=/])(?:hooks/|\.?/?dispatch\b)", command) is not None


def documented_hook_runs():
    """``[(page, command)]``: every ``juju exec`` in the documentation that runs the charm.

    A command with a placeholder (``hooks/<name>``) is a form, not one to run.
    """
    return [(page, command) for page in PAGES for segment in code_segments((REPO / page).read_text())
            for _, command in juju_exec_commands(segment) if runs_a_hook(command) and "<" not in command]


def hook_run_problem(unit, command):
    """What is wrong when ``command`` runs as ``juju exec`` runs it on ``unit`` (None: nothing).

    It must name one hook (``hooks/<name>``), exit 0, and ops must have dispatched that hook's
    event (its log says ``Emitting Juju event <name>.``): ``./dispatch`` without the hook's
    name in ``JUJU_DISPATCH_PATH`` exits 0 too, having run no event.
    """
    named = re.findall(r"\bhooks/([a-z][\w-]*)", command)
    if len(named) != 1:
        return f"{command}: names no hook (hooks/<name>) for the charm to run"
    done = unit.exec(command)
    if done.returncode != 0:
        return f"{command}: exit status {done.returncode}: {done.stderr.strip()[-300:]}"
    event = named[0].replace("-", "_")
    if not any(entry["message"] == f"Emitting Juju event {event}." for entry in done.log):
        return f"{command}: the charm did not run hooks/{named[0]}"
    return None


HOOK_RUNS = documented_hook_runs()


def test_the_documentation_runs_a_hook_by_hand_somewhere():
    pages = {page for page, _ in HOOK_RUNS}
    assert {"docs/how-to/pause-and-maintenance.md", "docs/tutorial/sample-host.md"} <= pages, pages


@pytest.mark.parametrize("text,expected", [
    ("juju exec --unit nova-compute-nvidia-vgpu/0 -- JUJU_DISPATCH_PATH=hooks/update-status ./dispatch"
     "   # the next hook",
     [("nova-compute-nvidia-vgpu/0", "JUJU_DISPATCH_PATH=hooks/update-status ./dispatch")]),
    ("juju exec -m cloud --unit=app/1 hooks/update-status", [("app/1", "hooks/update-status")]),
    ("$ juju exec -u app/N -- 'sudo ls' /x", [("app/N", "sudo ls /x")]),
    ("juju exec --unit app/0 -- echo 'unclosed", [(None, "--unit app/0 -- echo 'unclosed")]),
])
def test_juju_exec_commands_are_read_as_juju_exec_parses_them(text, expected):
    assert juju_exec_commands(text) == expected


def test_only_commands_that_run_the_charm_are_hook_runs():
    assert runs_a_hook("JUJU_DISPATCH_PATH=hooks/update-status ./dispatch")
    assert runs_a_hook("hooks/update-status") and runs_a_hook("/var/lib/juju/agents/unit-a-0/charm/dispatch")
    assert not runs_a_hook("sudo cat /var/lib/nova-compute-nvidia-vgpu/mdevs.json")


@pytest.fixture
def exec_unit(made_charm, tmp_path, root, tools):
    """A unit of ``make charm``'s artefact on a host without GPUs, as ``juju exec`` reaches it."""
    from unit_tests import packing

    why = packing.why_not()
    if why:
        pytest.skip(why)
    return packing.juju_unit(made_charm, packing.unit_python(tmp_path / "unit-python"), tmp_path,
                             root, tools)


def test_every_hook_the_documentation_runs_by_hand_runs_on_the_packed_charm(exec_unit):
    problems = [f"{page}: {problem}" for page, command in dict.fromkeys(HOOK_RUNS)
                if (problem := hook_run_problem(exec_unit, command))]
    assert problems == []
    # The unit went on: update-status on a host without GPUs says so.
    assert exec_unit.status() == ("active", "no NVIDIA GPU on this host: nothing to do")


def test_the_hook_run_check_finds_a_hook_the_packed_charm_does_not_have(exec_unit):
    # charmcraft writes hooks/install, start and upgrade-charm only: Juju runs ./dispatch.
    problem = hook_run_problem(exec_unit, "hooks/update-status")
    assert problem.startswith("hooks/update-status: exit status 127: "), problem
    # ./dispatch without the hook's name exits 0 having run no hook.
    assert hook_run_problem(exec_unit, "./dispatch") == (
        "./dispatch: names no hook (hooks/<name>) for the charm to run")
    assert hook_run_problem(exec_unit, "JUJU_DISPATCH_PATH=hooks/update-status true") == (
        "JUJU_DISPATCH_PATH=hooks/update-status true: the charm did not run hooks/update-status")
    assert hook_run_problem(exec_unit, "JUJU_DISPATCH_PATH=hooks/update-status ./dispatch") is None


# -- The status reference against the charm's code ---------------------------------------------

KINDS = ("blocked", "waiting", "maintenance", "active")
WILD = "\x00"  # a part of a message left open: a value in the code, a placeholder in the text
_KIND_NAMES = {"BLOCKED": "blocked", "WAITING": "waiting", "MAINTENANCE": "maintenance",
               "ACTIVE": "active", "BlockedStatus": "blocked", "WaitingStatus": "waiting",
               "MaintenanceStatus": "maintenance", "ActiveStatus": "active"}


def _template(node, known=None):
    """A string expression as text with WILD for each part only known at run time.

    ``known``: module constants by name (``OPTION``, ``principalconf.NOVA_CONF``), whose text
    an f-string's ``{OPTION}`` gets.
    """
    import ast

    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return re.sub(r"%[-\d.]*[sdrf]|\{[^{}]*\}", WILD, node.value)  # "%s" and "{}" filled later
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else
                       (known or {}).get(_name(v.value)) or WILD for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _template(node.left, known), _template(node.right, known)
        return (left or WILD) + (right or WILD) if left is not None or right is not None else None
    return None


def _name(node):
    import ast

    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) \
        else None


def code_messages(sources):
    """``{template: {kinds}}`` of every string the charm's code builds, by the status it reaches.

    ``sources``: ``{module name: source}``. A string is ``waiting``, ``maintenance`` or
    ``active`` where the code says so: in a ``(KIND, ...)`` pair (vgpu.status), in
    ``ops.<Kind>Status(...)``, appended to a hook's ``waits`` (waiting) or ``show``n while
    installing (maintenance), or in a function or module constant used there; every other
    string reaches the status, if at all, as a blocked problem (``problems``, errors).
    """
    import ast

    code = _Code([ast.parse(text) for text in sources.values()])
    for node in code.nodes():
        kind = _kind_given(node)
        if kind:
            for expr in (node.elts[1:] if isinstance(node, ast.Tuple) else node.args):
                code.mark(expr, kind)
    return code.templates()


def _kind_given(node):
    """The status kind other than blocked that ``node`` gives the strings in it, if any."""
    import ast

    if isinstance(node, ast.Tuple) and len(node.elts) == 2:
        kind = _KIND_NAMES.get(_name(node.elts[0]))
        return kind if kind in KINDS[1:] else None
    if not isinstance(node, ast.Call):
        return None
    called = _name(node.func)
    owner = _name(node.func.value) if isinstance(node.func, ast.Attribute) else None
    if called and called.endswith("Status"):  # ops.WaitingStatus(...)
        kind = _KIND_NAMES.get(called)
        return kind if kind in KINDS[1:] else None
    return "waiting" if (called, owner) == ("append", "waits") else \
        "maintenance" if called == "show" else None


class _Code:
    """The charm's modules: their functions, module constants, and the kinds marked so far."""

    def __init__(self, trees):
        import ast

        self.trees = trees
        self.functions, self.constants, self.kinds = {}, {}, {}  # kinds: id(node) -> {kind}
        for node in self.nodes():
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, []).append(node)
        for tree in trees:
            for node in tree.body:  # module constants: BUSY = (...)
                if isinstance(node, ast.Assign) and len(node.targets) == 1 \
                        and isinstance(node.targets[0], ast.Name) and node.targets[0].id.isupper():
                    self.constants.setdefault(node.targets[0].id, []).append(node.value)

    def nodes(self):
        import ast

        for tree in self.trees:
            yield from ast.walk(tree)

    def mark(self, expr, kind, depth=0):
        """Give ``kind`` to the strings of ``expr``, of the functions it calls and names it uses."""
        import ast

        for node in ast.walk(expr):
            if _template(node) is not None:
                self.kinds.setdefault(id(node), set()).add(kind)
            if depth == 0 and isinstance(node, ast.Call):  # one call deep: serving_message(...)
                for function in self.functions.get(_name(node.func), []):
                    self.mark(function, kind, depth + 1)
            if depth == 0 and isinstance(node, ast.Name):  # BUSY
                for value in self.constants.get(node.id, []):
                    self.mark(value, kind, depth + 1)

    def templates(self):
        """``{template: {kinds}}``: each whole string once (an f-string, not its pieces)."""
        import ast

        known = {}  # constants every module that defines them gives one plain text: OPTION
        for name, values in self.constants.items():
            texts = {v.value for v in values if isinstance(v, ast.Constant)}
            if len(texts) == 1 and all(isinstance(v, ast.Constant) for v in values):
                text = texts.pop()
                if isinstance(text, str):
                    known[name] = text
        out, parts = {}, set()  # parts: pieces of a larger string (an f-string's text, a + b)
        for node in self.nodes():
            text = None if id(node) in parts else _template(node, known)
            if text is None:
                continue
            parts.update(id(child) for child in ast.walk(node) if child is not node)
            if text.strip(WILD).strip():
                out.setdefault(text, set()).update(self.kinds.get(id(node), {"blocked"}))
        return out


def _charm_sources():
    return {str(p.relative_to(REPO)): p.read_text() for p in sorted((REPO / "src").rglob("*.py"))}


def globs_meet(p, q):
    """Whether some text matches both ``p`` and ``q``, where WILD stands for any text.

    Bit-parallel over ``q``'s positions (bit j: ``q[:j]`` can be matched against ``p[:i]``).
    """
    m, full = len(q), (1 << (len(q) + 1)) - 1
    stars = sum(1 << j for j, c in enumerate(q) if c == WILD)
    same = {}
    for j, c in enumerate(q):
        same[c] = same.get(c, 0) | (1 << j)

    def close(bits):  # q's WILD may match nothing
        while True:
            more = bits | ((bits & stars) << 1)
            if more == bits:
                return bits
            bits = more

    row = close(1)
    for c in p:
        if c == WILD:  # p's WILD takes any of q's characters
            low = row & -row
            row = close(full & ~(low - 1)) if row else 0
            continue
        row = close((((row & same.get(c, 0)) << 1) | (row & stars)) & full)
        if not row:
            return False
    return bool(row >> m & 1)


def _doc_glob(message):
    """A message as the documentation writes it: ``<...>``, ``…`` and ``...`` left open."""
    return re.sub(r"<[^<>]*>|…|\.\.\.", WILD, message)


def _longest(text):
    return max(text.split(WILD), key=len)


def matching_kinds(message, templates):
    """The kinds of the code's most specific templates that can say ``message`` (empty: none).

    A template may begin a longer message (``reboot required: {reason}``); of those that can
    say it, the ones with the most fixed text decide (``no NVIDIA GPU on this host`` alone is
    another message than ``no NVIDIA GPU on this host: nothing to do``).
    """
    doc = _doc_glob(message)
    pieces = [piece for piece in doc.split(WILD) if len(piece) >= 6] or [_longest(doc)]
    found, best = set(), 0
    for template, kinds in templates.items():
        if not (any(piece in template for piece in pieces)
                or any(len(part) >= 8 and part in doc for part in template.split(WILD))):
            continue  # cheap: they share no long piece
        fixed = len(template.replace(WILD, ""))
        if fixed >= best and globs_meet(doc, template + WILD):
            found, best = (found | kinds if fixed == best else set(kinds)), fixed
    return found


def status_rows(text):
    """``(messages, kind)`` per row of the status tables (first column Status or Message).

    The messages are the first column's code spans; the kind is the ``Kind`` column ('' where
    the table has none).
    """
    rows = []
    for table in re.findall(r"(?:^\|.*\|[ \t]*\n)+", FENCE.sub("", text), re.M):
        lines = table.splitlines()
        header = [c.strip() for c in lines[0].strip("|").split("|")]
        if header[0] not in ("Status", "Message"):
            continue
        for line in lines[2:]:
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
            kind = cells[header.index("Kind")] if "Kind" in header else ""
            rows.append((re.findall(r"`([^`]+)`", cells[0]), kind))
    return rows


def status_table_problems(text, templates):
    """What is wrong with the status tables of ``text``, against the code's ``templates``.

    A row without a kind, a message no code says, one of a kind the code does not give it,
    and a message that another row has already (placeholders aside).
    """
    problems, seen, repeated = [], {}, set()  # the messages with their placeholders as …
    for messages, kind in status_rows(text):
        if kind not in KINDS:
            problems.append(f"{messages[:1]}: Kind {kind!r} is none of {', '.join(KINDS)}")
        for message in messages:
            kinds = matching_kinds(message, templates)
            if not kinds:
                problems.append(f"{message}: the charm's code never says this")
            elif kind in KINDS and kind not in kinds:
                problems.append(f"{message}: the code makes it {'/'.join(sorted(kinds))}, not {kind}")
            same = " ".join(re.sub(r"<[^<>]*>|…|\.\.\.", "…", message).split())
            if seen.setdefault(same, message) != message or same in repeated:
                problems.append(f"{message}: a row for it already")
            repeated.add(same)
    return problems


STATUS_PAGES = [page for page in PAGES if status_rows((REPO / page).read_text())]


@pytest.fixture(scope="module")
def charm_messages():
    return code_messages(_charm_sources())


def test_the_status_reference_is_a_status_table():
    assert "docs/reference/status-messages.md" in STATUS_PAGES


@pytest.mark.parametrize("page", STATUS_PAGES)
def test_every_status_message_of_the_documentation_is_the_codes_with_its_kind(page, charm_messages):
    assert status_table_problems((REPO / page).read_text(), charm_messages) == []


TOY_CHARM = {"toy.py": """
BLOCKED, WAITING, MAINTENANCE, ACTIVE = "blocked", "waiting", "maintenance", "active"
BUSY = "waiting for the boot step to finish"
OPTION = "vgpu-device-mappings"


def statuses(principal, count):
    out = [(WAITING, f"waiting for {principal} to install nova-common")]
    out.append((BLOCKED, f"reboot required: {reason()}"))
    out.append((ACTIVE, serving(count)))
    return out


def reason():
    return "nouveau is loaded"


def serving(count):
    return f"{count} GPUs, no vGPU type mapped: set {OPTION}"


def hook(out, show, path, error):
    out.waits.append(BUSY)
    show(f"installing {path}")
    out.problems.append(f"cannot read {path}: {error}")
    unit.status = ops.MaintenanceStatus("removing: the files are deleted")
"""}


def test_the_code_gives_each_message_its_kind():
    messages = code_messages(TOY_CHARM)
    assert messages["waiting for \x00 to install nova-common"] == {"waiting"}
    assert messages["waiting for the boot step to finish"] == {"waiting"}  # through BUSY
    assert messages["\x00 GPUs, no vGPU type mapped: set vgpu-device-mappings"] == {"active"}
    assert messages["reboot required: \x00"] == messages["nouveau is loaded"] == {"blocked"}
    assert messages["installing \x00"] == messages["removing: the files are deleted"] == {"maintenance"}
    assert messages["cannot read \x00: \x00"] == {"blocked"}
    assert "waiting for " not in messages  # an f-string's pieces are not messages of their own


def test_the_status_check_finds_wrong_kinds_unknown_and_repeated_messages():
    table = ("| Status | Kind | Meaning |\n| --- | --- | --- |\n"
             "| `waiting for nova-compute to install nova-common` | blocked | x |\n"
             "| `reboot required: nouveau is loaded` / `waiting for the boot step to finish` | "
             "blocked | x |\n"
             "| `…, no vGPU type mapped: set vgpu-device-mappings` | active | x |\n"
             "| `installing nvidia-vgpu-ubuntu-570 570.158.02` | maintenance | x |\n"
             "| `reboot required:  nouveau is loaded` | blocked | x |\n"
             "| `cannot read /<path>: <reason>` |  | x |\n"
             "| `no such message anywhere` | blocked | x |\n")
    assert status_table_problems(table, code_messages(TOY_CHARM)) == [
        "waiting for nova-compute to install nova-common: the code makes it waiting, not blocked",
        "waiting for the boot step to finish: the code makes it waiting, not blocked",
        "reboot required:  nouveau is loaded: a row for it already",  # spaces aside
        "['cannot read /<path>: <reason>']: Kind '' is none of blocked, waiting, maintenance, active",
        "no such message anywhere: the charm's code never says this"]


@pytest.mark.parametrize("p,q,meet", [
    ("reboot required: nouveau", "reboot required: \x00", True),
    ("reboot required: \x00", "reboot required: nouveau", True),
    ("\x00, no type: set x", "\x00 GPUs, no type: set x", True),
    ("relate to a: juju integrat0 b", "relate to \x00: juju integrate \x00", False),
    ("a\x00c", "ab", False),
    ("", "\x00", True),
])
def test_two_texts_with_open_parts_meet_where_one_text_can_match_both(p, q, meet):
    assert globs_meet(p, q) is meet and globs_meet(q, p) is meet


def test_the_readmes_docs_table_names_every_how_to_page():
    """The README's table of the docs links each page of docs/how-to (issue 41)."""
    readme = (REPO / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| How-to |"))
    missing = [p.name for p in sorted((REPO / "docs/how-to").glob("*.md"))
               if f"(docs/how-to/{p.name})" not in row]
    assert missing == []
