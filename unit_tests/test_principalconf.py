"""The principal's nova.conf: parsed as oslo.config parses it, matched as Nova matches it.

Plain inputs: INI text, and a host of one L40S (PF 0000:81:00.0, device 26b9)
with eight VFs (device 26ba), of which this unit publishes two
(0000:81:00.4 and .5) as ``[pci] device_spec`` with ``report_in_placement``.
The parser is compared with oslo.config itself (a test dependency, not a
run-time one); the matching rules with Nova's own ``PciDeviceSpec`` where Nova
is importable (``pip install nova``), as unit_tests/test_nova_rules.py does.
"""

import json
from unittest import mock

import pytest
from oslo_config import cfg

from unit_tests.fakehost import render_principal_nova_conf
from vgpu import novaconf, pci, plan, principalconf, text
from vgpu.errors import HostReadError, PrincipalConfigError
from vgpu.principalconf import Device, Entry

APP = "compute-gpu"  # the principal's application name, not the usual nova-compute
PF = "0000:81:00.0"
VFS = [f"0000:81:0{(4 + n) // 8}.{(4 + n) % 8}" for n in range(8)]
OURS, SIBLING = VFS[:2], VFS[2]


def vf_spec(address: str) -> str:
    """This unit's device_spec for a VF, built by novaconf as the charm builds it."""
    return novaconf.device_spec(plan.Assignment(PF, address, 1139, "NVIDIA L40S-12Q", pci.VFIO,
                                                "26ba"))


OUR_SPECS = [vf_spec(a) for a in OURS]
REPORTING = {"pci": [["device_spec", s] for s in OUR_SPECS] + [["report_in_placement", "True"]]}
NOT_REPORTING = {"pci": [["device_spec", s] for s in OUR_SPECS]}
HOST = pci.Host(gpus=(pci.Gpu(
    address=PF, device_id="0x26b9", model="L40S", driver="nvidia", class_code="0x030200",
    sriov_totalvfs=32, sriov_numvfs=8,
    vfs=tuple(pci.VirtualFunction(address=a, index=n, device_id="0x26ba", framework=pci.VFIO)
              for n, a in enumerate(VFS))),))


def whitelist(value: str, section: str = "pci", key: str = "passthrough_whitelist",
              file: str = principalconf.NOVA_CONF) -> Entry:
    return Entry(section, key, value, file)


def found(value: str, sections=None, **where) -> list:
    return principalconf.conflicts([whitelist(value, **where)], sections or REPORTING, HOST, APP)


# -- parsing as oslo.config does ---------------------------------------------------------

NOVA_OPTS = [
    cfg.MultiStrOpt("device_spec", default=[], deprecated_opts=[
        cfg.DeprecatedOpt("passthrough_whitelist", group="pci"),
        cfg.DeprecatedOpt("pci_passthrough_whitelist", group="DEFAULT")]),
    cfg.MultiStrOpt("alias", default=[], deprecated_name="pci_alias", deprecated_group="DEFAULT"),
]


def oslo_pci(tmp_path, content: str):
    """nova.conf's [pci] device_spec and alias as Nova's option definitions read them."""
    path = tmp_path / "nova.conf"
    path.write_text(content)
    conf = cfg.ConfigOpts()
    conf.register_opts(NOVA_OPTS, group="pci")
    conf(args=[], default_config_files=[str(path)])
    return list(conf.pci.device_spec), list(conf.pci.alias)


MESSY = """# a comment
[DEFAULT]
debug = False
pci_passthrough_whitelist = {"vendor_id": "8086", "product_id": "1520"}
pci_alias = {"name": "old", "vendor_id": "8086", "product_id": "1520"}

[pci]
device_spec = {"address": "0000:3b:00.0"}
passthrough_whitelist: {"vendor_id": "15b3",
  "product_id": "101e"}
; another comment
alias = '{"name": "nic", "vendor_id": "15b3", "product_id": "101e"}'

[PCI]
passthrough_whitelist = [{"address": "*:3c:00.*"}, {"devname": "eth3"}]
\tdevice_spec = this continues the line above, not a setting of its own
device_spec = {"vendor_id": "10de", "product_id": "26ba", "address": "0000:81:00.4"}

[vnc]
enabled = False
"""


@pytest.mark.parametrize("content", [
    MESSY,
    MESSY.replace("\n", "\r\n"),
    render_principal_nova_conf(
        '[{"vendor_id": "15b3", "product_id": "101e", "physical_network": "physnet1"}]',
        ['{"name": "nic", "product_id": "101e", "vendor_id": "15b3"}'],
        "[pci]\ndevice_spec = " + OUR_SPECS[0] + "\nreport_in_placement = True\n"),
])
def test_specs_and_aliases_come_out_as_oslo_config_gives_them_to_nova(tmp_path, content):
    specs, aliases = oslo_pci(tmp_path, content)
    parsed = principalconf.principal(principalconf.parse(content))
    assert [e.value for e in parsed.specs] == specs
    assert [e.value for e in parsed.aliases] == aliases
    assert len(specs) >= 2 and aliases


@pytest.mark.parametrize("last", [
    '[pci]\nalias = {"name": "nic", "vendor_id": "15b3", "product_id": "101e"}',
    '[pci]\ndevice_spec = {"vendor_id": "15b3",\n  "product_id": "101e"}',  # continued
])
def test_an_option_on_the_last_line_without_a_newline_is_read(tmp_path, last):
    # A file written without a final newline ends on the option itself: it still counts.
    content = MESSY + last
    specs, aliases = oslo_pci(tmp_path, content)
    parsed = principalconf.principal(principalconf.parse(content))
    assert [e.value for e in parsed.specs] == specs
    assert [e.value for e in parsed.aliases] == aliases
    assert last.partition(" = ")[2].replace("\n  ", "\n") in specs + aliases


def test_merged_sections_repeated_keys_and_the_old_names_in_nova_s_order():
    parsed = principalconf.principal(principalconf.parse(MESSY))
    assert [(e.option, e.value[:24]) for e in parsed.specs] == [
        ("[DEFAULT] pci_passthrough_whitelist", '{"vendor_id": "8086", "p'),
        ("[pci] passthrough_whitelist", '{"vendor_id": "15b3",\n"p'),
        ("[pci] passthrough_whitelist", '[{"address": "*:3c:00.*"'),
        ("[pci] device_spec", '{"address": "0000:3b:00.'),
        ("[pci] device_spec", '{"vendor_id": "10de", "p'),
    ]
    assert parsed.aliases[1].value.startswith('{"name": "nic"')  # its quotes are gone


def test_this_units_own_entries_are_left_out_by_exact_value():
    content = render_principal_nova_conf(
        '{"vendor_id": "15b3"}', (),
        "[pci]\n" + "".join(f"device_spec = {s}\n" for s in OUR_SPECS))
    parsed = principalconf.parse(content)
    assert [e.value for e in principalconf.principal(parsed, OUR_SPECS).specs] == [
        '{"vendor_id": "15b3"}']
    assert len(principalconf.principal(parsed, OUR_SPECS[:1]).specs) == 2
    # Only under [pci] device_spec, where this unit writes: the same text in the
    # principal's own option is the principal's.
    copied = principalconf.parse(render_principal_nova_conf(OUR_SPECS[0]))
    assert len(principalconf.principal(copied, OUR_SPECS).specs) == 1


@pytest.mark.parametrize("content,line", [
    ("[pci]\nno separator here\n", "line 2: no '=' or ':'"),
    ("  indented = first\n[pci]\n", "line 1: unexpected continuation"),
    ("[pci]\na = 1\n\n  after a blank line\n", "line 4: unexpected continuation"),
    ("debug = True\n[DEFAULT]\n", "a setting before any [section]"),
    ("[pci\na = 1\n", "line 1: invalid section"),
    ("[]\n", "line 1: invalid section"),
    ("[pci]\n= value\n", "line 2: no key"),
])
def test_what_oslo_config_refuses_is_refused_naming_the_line(tmp_path, content, line):
    with pytest.raises(ValueError, match=line.replace("[", r"\[")):
        principalconf.parse(content)
    with pytest.raises(cfg.ConfigFileParseError):
        oslo_pci(tmp_path, content)


def test_load_reads_under_the_host_root(root):
    assert principalconf.load() is None  # nova-compute has not written it yet
    path = root / "etc/nova/nova.conf"
    path.parent.mkdir(parents=True)
    path.write_text(render_principal_nova_conf('{"vendor_id": "15b3"}'))
    assert principalconf.load()[0][1]["pci"]["passthrough_whitelist"] == ['{"vendor_id": "15b3"}']
    path.write_text("[pci]\ngarbage\n")
    with pytest.raises(PrincipalConfigError, match=r"cannot parse /etc/nova/nova.conf: line 2: "):
        principalconf.load()
    path.unlink()
    path.mkdir()
    with pytest.raises(HostReadError, match="cannot read /etc/nova/nova.conf: Is a directory"):
        principalconf.load()



def test_load_takes_any_bytes_and_no_more_than_its_bound(root, monkeypatch):
    path = root / "etc/nova/nova.conf"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"[DEFAULT]\n# \xe9dit\xe9 \xe0 la main\n[pci]\n"
                     b'passthrough_whitelist = {"vendor_id": "15b3"}\n')
    assert principalconf.load()[0][1]["pci"]["passthrough_whitelist"] == ['{"vendor_id": "15b3"}']
    monkeypatch.setattr(principalconf, "CONF_LIMIT", 40)
    with pytest.raises(HostReadError, match="^cannot read /etc/nova/nova.conf: more than 40 bytes$"):
        principalconf.load()

def test_nova_compute_conf_is_read_after_nova_conf_as_oslo_config_reads_both(root):
    """Ubuntu's nova-compute runs with --config-file nova.conf --config-file nova-compute.conf."""
    conf_dir = root / "etc/nova"
    conf_dir.mkdir(parents=True)
    (conf_dir / "nova.conf").write_text(MESSY)
    (conf_dir / "nova-compute.conf").write_text(
        "[DEFAULT]\ncompute_driver=libvirt.LibvirtDriver\n"
        '[pci]\ndevice_spec = {"address": "0000:81:00.0"}\n'
        'passthrough_whitelist = {"vendor_id": "1af4"}\nalias = {"name": "virtio"}\n'
        '[DEFAULT]\npci_passthrough_whitelist = {"vendor_id": "abcd"}\n')
    conf = cfg.ConfigOpts()
    conf.register_opts(NOVA_OPTS, group="pci")
    conf(args=[], default_config_files=[str(conf_dir / "nova.conf"),
                                        str(conf_dir / "nova-compute.conf")])
    parsed = principalconf.principal(principalconf.load())
    assert [e.value for e in parsed.specs] == list(conf.pci.device_spec)
    assert [e.value for e in parsed.aliases] == list(conf.pci.alias)
    assert [e.file for e in parsed.specs[-3:]] == ["/etc/nova/nova-compute.conf"] * 3
    # An entry there that takes our VFs is named with the file to correct.
    assert found('{"address": "0000:81:00.0"}', file="/etc/nova/nova-compute.conf",
                 key="device_spec") == [
        "compute-gpu's [pci] device_spec entry {\"address\": \"0000:81:00.0\"} matches GPU "
        f"{PF} and its VFs {', '.join(VFS[:4])} and 4 more, whose VFs this unit publishes for vGPUs: "
        "Nova refuses a GPU beside its VFs in Placement (nova-compute stops); leave the GPU out; "
        "[pci] device_spec is none of compute-gpu's options: remove it where it comes from "
        "(config-flags, another subordinate or a hand edit of /etc/nova/nova-compute.conf)"]
    (conf_dir / "nova-compute.conf").write_text("[pci]\nbroken\n")
    with pytest.raises(PrincipalConfigError, match="cannot parse /etc/nova/nova-compute.conf: "):
        principalconf.load()


# -- conflicts ---------------------------------------------------------------------------

def test_a_devname_spec_stops_nova_while_placement_reporting_is_on():
    nic = '{"devname": "enp59s0f0", "physical_network": "physnet1"}'
    assert found(nic) == [
        f"compute-gpu's pci-passthrough-whitelist entry {nic} names a device by devname, which "
        "Nova refuses while [pci] report_in_placement is on (nova-compute stops): name it by "
        "PCI address; change it: juju config compute-gpu pci-passthrough-whitelist=..."]
    assert found(nic, NOT_REPORTING) == []
    # Sticky reporting alone (no VF published any more) is enough.
    assert len(found(nic, {"pci": [["report_in_placement", "True"]]})) == 1


def test_the_exact_pf_address_takes_its_vfs_too():
    [message] = found('{"address": "0000:81:00.0"}')
    assert message == (
        "compute-gpu's pci-passthrough-whitelist entry {\"address\": \"0000:81:00.0\"} matches "
        f"GPU {PF} and its VFs {', '.join(VFS[:4])} and 4 more, whose VFs this unit publishes "
        "for vGPUs: Nova refuses a GPU beside its VFs in Placement (nova-compute stops); leave "
        "the GPU out; change it: juju config compute-gpu pci-passthrough-whitelist=...")


def test_the_pf_by_vendor_and_product_matches_the_pf_alone():
    [message] = found('{"vendor_id": "10DE", "product_id": "0x26b9"}')  # hex as Nova parses it
    assert f"matches GPU {PF}, whose VFs this unit publishes" in message
    [message] = found('{"vendor_id": "10de", "product_id": "26b9"}', NOT_REPORTING)
    assert f"matches GPU {PF}, whose VFs" in message
    assert "a guest given the whole GPU would take its vGPU VFs with it" in message


@pytest.mark.parametrize("value,hits", [
    ('{"address": "0000:81:00.4"}', OURS[:1]),
    ('{"address": "*:81:00.*"}', None),  # the PF itself (function 0) is among them
    ('{"address": "81:00.5", "vendor_id": "10de"}', OURS[1:]),
    ('{"address": ":00.4"}', OURS[:1]),
    ('{"address": "0000:81:00."}', None),
    ('{"address": {"bus": "8[0-9a-f]", "function": "[45]"}}', OURS),
    ('{"address": {"domain": "0000", "bus": "81", "slot": "00", "function": "0"}}', None),
    ('{"vendor_id": "*", "product_id": "26ba"}', VFS),
    ('{"vendor_id": " 10de ", "product_id": "*"}', None),
])
def test_glob_regex_and_wildcard_specs_that_take_our_vfs(value, hits):
    [message] = found(value)
    if hits is None:
        assert f"matches GPU {PF} and its VFs" in message
    else:
        assert f"matches {'VF' if len(hits) == 1 else 'VFs'} {', '.join(hits[:4])}" in message
        assert "Nova uses the first spec that matches, so they would lose managed=no" in message


def test_other_vfs_of_a_published_gpu_mix_resource_classes_while_reporting():
    [message] = found('{"address": "0000:81:00.6"}')
    assert message.startswith(
        "compute-gpu's pci-passthrough-whitelist entry {\"address\": \"0000:81:00.6\"} matches "
        f"VF {SIBLING} of GPU {PF}, beside the VFs this unit publishes for vGPUs: one GPU's VFs "
        "would mix resource classes in Placement (nova-compute stops); leave them out")
    assert found('{"address": "0000:81:00.6"}', NOT_REPORTING) == []


def test_a_json_list_names_the_item_that_conflicts():
    value = ('[{"vendor_id": "15b3", "product_id": "101e", "physical_network": "physnet1"}, '
             '{"vendor_id": "10de"}]')
    [message] = found(value)
    assert message.startswith(
        "compute-gpu's pci-passthrough-whitelist entry {\"vendor_id\": \"10de\"} matches GPU")


@pytest.mark.parametrize("section,key,named", [
    ("DEFAULT", "pci_passthrough_whitelist", "[DEFAULT] pci_passthrough_whitelist"),
    ("pci", "device_spec", "[pci] device_spec"),
])
def test_entries_under_other_names_say_they_are_not_the_principals_option(section, key, named):
    [message] = found('{"address": "0000:81:00.4"}', section=section, key=key)
    assert message.startswith(f"compute-gpu's {named} entry ")
    assert message.endswith(
        f"{named} is none of compute-gpu's options: remove it where it comes from "
        "(config-flags, another subordinate or a hand edit of /etc/nova/nova.conf)")


@pytest.mark.parametrize("value,sections", [
    ('{"vendor_id": "15b3", "product_id": "101e", "physical_network": "physnet1"}', REPORTING),
    ('{"address": "0000:3b:00.*"}', REPORTING),
    ('{"vendor_id": "10de", "product_id": "1db4"}', REPORTING),  # another GPU model
    # No VF of the GPU published (only sticky reporting): the GPU may be passed through whole.
    ('{"address": "0000:81:00.0"}', {"pci": [["report_in_placement", "True"]]}),
])
def test_specs_for_other_devices_are_fine(value, sections):
    assert found(value, sections) == []


def test_nothing_clashes_without_sections_that_give_nova_devices():
    for value in ('{"vendor_id": "10de"}', "not json"):
        assert principalconf.conflicts([whitelist(value)], {}, HOST, APP) == []
    # mdev types on a GPU not on this host: nothing of it to take.
    assert found('{"vendor_id": "10de"}', {"mdev_nvidia-105": [["device_addresses", "0000:99:00.0"]]}) \
        == []


@pytest.mark.parametrize("value,why", [
    ('{"vendor_id": "10de", "address": "0000:81:00.4"', "not valid JSON"),
    ('"0000:81:00.4"', "not a JSON object or a list of them"),
    ('[{"vendor_id": "10de"}, 7]', "not a JSON object or a list of them"),
    ('{"vendor_id": "zzzz"}', "vendor_id 'zzzz' is not a hex number"),
    ('{"product_id": "10000"}', "product_id '10000' is above FFFF"),
    ('{"address": "0:0:81:00.4"}', "has too many fields"),
    ('{"address": "0000:81:00.8"}', "function '8' is above 7"),
    ('{"address": {"bus": "(["}}', "invalid regular expression"),
    # Compiling these raised OverflowError and RecursionError in the hook's own process.
    ('{"address": {"bus": "8{1,4294967296}"}}', "invalid regular expression"),
    ('{"address": {"slot": "' + "(" * 1000 + ")" * 1000 + '"}}', "(address {'slot': '((((("),
    ('{"address": ["0000:81:00.4"]}', "neither a string nor an object"),
    ('{"devname": "eth0", "address": "0000:3b:00.0"}', "both devname and address"),
    ('{"address": "0000:3b:00.0", "managed": "maybe"}', "managed 'maybe' is not yes or no"),
    ('{"vendor_id": 4318}', "vendor_id is not a string"),
])
def test_an_entry_nova_refuses_is_named_with_why(value, why):
    [message] = found(value)
    assert message.startswith("compute-gpu's pci-passthrough-whitelist entry ")
    assert " is refused by Nova (" in message and why in message
    assert "whether it takes this unit's vGPU devices is unknown" in message


def test_a_long_entry_is_cut_to_a_readable_length():
    value = json.dumps({"vendor_id": "10de", "physical_network": "x" * 200})
    [message] = found(value)
    quoted = message.split(" entry ", 1)[1].split(" matches ", 1)[0]
    assert len(quoted) == 70 and quoted.endswith("...")


def test_published_vfs_that_are_gone_from_the_host_are_still_checked():
    gone = pci.Host()
    specs = [whitelist('{"address": "0000:81:00.5"}')]
    [message] = principalconf.conflicts(specs, REPORTING, gone, APP)
    assert f"matches VF {OURS[1]} of GPU {OURS[1]}" in message


V100S = pci.Host(gpus=tuple(pci.Gpu(
    address=a, device_id="0x1db4", model="V100", driver="nvidia", class_code="0x030200",
    types=(pci.VgpuType(108, "GRID V100-8Q", pci.MDEV),)) for a in (
    "0000:c1:00.0", "0000:e1:00.0")))


@pytest.mark.parametrize("sections,hit", [
    ({"devices": [["enabled_mdev_types", "nvidia-108"]],
      "mdev_nvidia-108": [["device_addresses", "0000:e1:00.0"]]}, ["0000:e1:00.0"]),
    # Queens to Train: one type, no addresses: every mdev GPU serves it.
    ({"devices": [["enabled_vgpu_types", "nvidia-108"]]}, ["0000:c1:00.0", "0000:e1:00.0"]),
])
def test_a_spec_taking_a_gpu_whose_mdevs_nova_gets_is_a_conflict(sections, hit):
    def said(value):
        return principalconf.conflicts([whitelist(value)], sections, V100S, APP)

    assert said('{"address": "0000:3b:00.0"}') == []
    for address in ("0000:c1:00.0", "0000:e1:00.0"):
        spec = json.dumps({"address": address})
        assert bool(said(spec)) == (address in hit)
    assert said('{"vendor_id": "10de"}')[0].startswith(
        f"compute-gpu's pci-passthrough-whitelist entry {{\"vendor_id\": \"10de\"}} matches GPU "
        f"{hit[0]}, whose mdevs this unit gives Nova for vGPUs")


# -- bounded: what a hook evaluates of the principal's text ------------------------------

CATASTROPHIC = {"address": {"bus": "(|)" * 40 + "x"}}  # 2**40 ways to fail on every bus


@pytest.mark.parametrize("value,why", [
    (json.dumps(CATASTROPHIC), "compiling and matching its regular expressions timed out after "
                               "0.5s and was stopped"),
    ("[" * 5000 + "]" * 5000, "its JSON is nested more than 32 deep"),
    (json.dumps({"address": "0000:81:00.0", "x": "a" * 70000}),
     "it is 70036 characters long, more than the 65536 this charm evaluates"),
])
def test_an_entry_beyond_the_bounds_is_named_as_not_checked(monkeypatch, value, why):
    monkeypatch.setattr(principalconf, "REGEX_BUDGET", 0.5)
    message = found(value)
    assert message == [
        f"cannot check compute-gpu's pci-passthrough-whitelist entry "
        f"{text.one_line(value, 70)}: {why}; whether it takes this unit's vGPU devices is "
        "unknown, the last published settings stay; change it: juju config compute-gpu "
        "pci-passthrough-whitelist=..."]


def slow_to_compile(ranges: int) -> str:
    """A case-insensitive class of ``ranges`` distinct ranges, slow to compile.

    re folds the case of each range's every character as it compiles, milliseconds
    per range, before anything is matched.
    """
    return "(?i)[" + "".join(chr(0x100 + n) + "-\uffff" for n in range(ranges)) + "]"


def test_a_pattern_slow_to_compile_costs_the_hook_no_more_than_the_bound(monkeypatch):
    """Compiling happens in the bounded process too: here seconds, stopped at the bound."""
    monkeypatch.setattr(principalconf, "REGEX_BUDGET", 0.2)
    value = json.dumps({"address": {"bus": slow_to_compile(5000)}}, ensure_ascii=False)
    assert len(value) < principalconf.MAX_ENTRY
    [message] = found(value)
    assert ": compiling and matching its regular expressions timed out after 0.2s and was " \
        "stopped; " in message


def test_each_entry_is_evaluated_once_for_every_set_of_sections_checked(monkeypatch):
    """The new sections and the published ones: one process per entry, not one per set."""
    from vgpu import run

    ran = []
    real = run.run

    def counted(cmd, *args, **kwargs):
        ran.append(cmd)
        return real(cmd, *args, **kwargs)

    monkeypatch.setattr(run, "run", counted)
    entries = [whitelist('{"address": {"bus": "8[0-9a-f]", "function": "[45]"}}'),
               whitelist('{"address": {"bus": "8{1,4294967296}"}}'),
               whitelist('{"vendor_id": "15b3"}')]
    found = principalconf.conflicts_each(entries, [REPORTING, NOT_REPORTING], HOST, APP)
    assert len(ran) == 2  # the two entries with regular expressions, once each
    assert [len(messages) for messages in found] == [2, 2]
    assert found[0][0].startswith(f"{APP}'s pci-passthrough-whitelist entry {{\"address\": "
                                  "{\"bus\": \"8[0-9a-f]\", \"function\": \"[45]\"}} matches VFs")
    assert "is refused by Nova (address {'bus': '8{1,4294967296}'} has an invalid regular " \
        "expression)" in found[1][1]
    assert principalconf.conflicts_each(entries, [{}, {}], HOST, APP) == [[], []]
    assert len(ran) == 2  # nothing to check: nothing evaluated


def test_the_documented_bound_is_the_one_in_force():
    from pathlib import Path

    docs = Path(__file__).parent.parent / "docs"
    bound = f"{principalconf.REGEX_BUDGET:g}"
    neighbours = (docs / "explanation/neighbours.md").read_text()
    assert f"that is ended after {bound} s." in " ".join(neighbours.split())
    assert f"regular expressions timed out after {bound}s and was stopped" in neighbours
    assert f"do not compile and finish in {bound} s (each entry once per hook)" in (
        docs / "reference/status-messages.md").read_text()


def test_regex_addresses_are_matched_as_re_match_does_in_a_process_of_their_own():
    spec = principalconf.parse_spec({"address": {"bus": "8[0-9a-f]", "function": "[45]"}}, set())
    assert [principalconf.matches(spec, Device("10de", "26ba", a)) for a in VFS[:3]] == [
        True, True, False]
    assert principalconf.regex_answers([("8", "81"), ("1$", "81"), ("", "x")]) == {
        ("8", "81"): True, ("1$", "81"): False, ("", "x"): True}
    # A regex that matches our VF, found within the bounds, is a conflict like any other.
    assert found('{"address": {"bus": "81", "slot": "00", "function": "4"}}')[0].startswith(
        "compute-gpu's pci-passthrough-whitelist entry {\"address\": {\"bus\": \"81\"")


# -- the same rules through Nova's own PciDeviceSpec -------------------------------------

DEVICES = [
    Device("10de", "26b9", PF),
    *(Device("10de", "26ba", a, PF) for a in VFS),
    Device("15b3", "101d", "0000:3b:00.0"),
    Device("10de", "1db4", "0000:c1:00.0"),
]
SPECS = [
    {"address": "0000:81:00.0"},
    {"address": "0000:81:00.4"},
    {"vendor_id": "10DE", "product_id": "0x26b9"},
    {"vendor_id": " 10de ", "product_id": "*"},
    {"vendor_id": "*", "product_id": "26ba"},
    {"address": "*:81:00.*"},
    {"address": "81:00.5", "vendor_id": "10de"},
    {"address": ":00.4"},
    {"address": "0000:81:00."},
    {"address": "0:81:0.0"},
    {"address": ""},
    {"address": {"bus": "8[0-9a-f]", "function": "[45]"}},
    {"address": {"domain": "0000", "bus": "81", "slot": "00", "function": "0"}},
    {"address": {"bus": "8"}},
    {"vendor_id": "15b3", "product_id": "101d", "physical_network": "physnet1"},
    {"address": "0000:3b:00.*", "managed": "no"},
    {"vendor_id": "10de", "product_id": "1db4", "live_migratable": "yes"},
    {"devname": "enp59s0f0"},
    {"vendor_id": "zzzz"},
    {"product_id": "10000"},
    {"address": "0:0:81:00.4"},
    {"address": "0000:81:00.8"},
    {"address": "0000:81:20.0"},
    {"address": {"bus": "(["}},
    {"address": {"bus": "8{1,4294967296}"}},  # OverflowError, not re.error: Nova lets it escape
    {"address": {"slot": "(" * 1000 + ")" * 1000}},  # RecursionError, likewise
    {"devname": "eth0", "address": "0000:3b:00.0"},
    {"address": "0000:3b:00.0", "managed": "maybe"},
]
PFS = {PF, "0000:3b:00.0"}


def nova_spec(devspec, spec):
    """Nova's PciDeviceSpec for ``spec``, with sysfs answered from PFS; None when it refuses."""
    is_pf = "nova.pci.utils.is_physical_function"
    ifname = "nova.pci.utils.get_function_by_ifname"
    with mock.patch(is_pf, lambda d, b, s, f: f"{d}:{b}:{s}.{f}" in PFS), \
            mock.patch(ifname, lambda name: ("0000:3b:00.0", True)):
        try:
            return devspec.PciDeviceSpec(json.loads(json.dumps(spec)))
        except Exception as error:  # Nova's exceptions, or the TypeError it lets escape
            if type(error).__module__.startswith(("nova", "builtins")):
                return None
            raise


@pytest.mark.nova
@pytest.mark.parametrize("spec", SPECS, ids=json.dumps)
def test_novas_own_device_spec_agrees(spec):
    from nova.pci import devspec

    theirs = nova_spec(devspec, spec)
    try:  # parsed in the hook; compiled (RefusedPatterns is a ValueError) and matched apart
        ours = principalconf.parse_spec(dict(spec), PFS)
        answers = principalconf.regex_answers(principalconf.regex_questions([ours], DEVICES),
                                              ours.regex or ())
    except ValueError:
        ours = None
    assert (ours is None) == (theirs is None)
    if theirs is None:
        return
    with mock.patch("nova.pci.utils.get_function_by_ifname", lambda name: ("0000:3b:00.0", True)):
        nova_says = [theirs.match(d._asdict()) for d in DEVICES]
    assert [principalconf.matches(ours, d, answers) for d in DEVICES] == [
        said and "devname" not in spec for said in nova_says]  # a devname is a NIC, never ours
