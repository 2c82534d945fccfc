"""Alert rules the charm gives COS: promtool checks and tests each one.

Prometheus evaluating them on a scraped host: test_prometheus.py.
"""

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from unit_tests.test_prometheus import metric_names, tool
from unit_tests.test_readme import anchors
from vgpu import metrics

REPO = Path(__file__).resolve().parents[1]
PROMETHEUS_RULES = sorted((REPO / "src/prometheus_alert_rules").glob("*.rules"))
RULE_TESTS = sorted((REPO / "unit_tests/prometheus").glob("*-test.yaml"))
REFERENCE = REPO / "docs/reference/metrics.md"


def alerts(paths):
    return [rule for path in paths for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def test_the_rule_directories_hold_rules_only():
    """cosl reads every .rule, .rules, .yml and .yaml file there as rules: tests live elsewhere."""
    names = [p.name for p in (REPO / "src/prometheus_alert_rules").iterdir()]
    assert names and all(n.endswith(".rules") for n in names), names


def test_no_loki_rule_ships():
    """A Loki rule over the kernel's lines never fires (cosl injects this charm's application).

    cosl's ``Rules`` (1.11.3, ``rules.py``) gives every rule this charm's topology labels and
    injects ``juju_model``, ``juju_model_uuid`` and ``juju_application`` matchers into its
    expression, LogQL included (the cos_agent library's ``_log_alert_rules``, LIBPATCH 26);
    the collector ships /var/log with its own application's labels
    (canonical/opentelemetry-collector-operator ``src/charm.py``, ``filelog/var-log``).
    Xid errors are metrics instead (vgpu.xid).
    """
    assert not (REPO / "src/loki_alert_rules").exists()


def test_promtool_checks_the_rules():
    done = subprocess.run([tool("promtool"), "check", "rules", *map(str, PROMETHEUS_RULES)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    for path in PROMETHEUS_RULES:  # promtool counts per file
        assert f"{path}\n  SUCCESS: {len(alerts([path]))} rules found" in done.stdout


def test_promtool_tests_every_alert():
    done = subprocess.run([tool("promtool"), "test", "rules", *map(str, RULE_TESTS)],
                          capture_output=True, text=True, cwd=REPO / "unit_tests/prometheus")
    assert done.returncode == 0, done.stdout + done.stderr
    tested = {case["alertname"] for path in RULE_TESTS for test in yaml.safe_load(path.read_text())["tests"]
              for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert tested == {rule["alert"] for rule in alerts(PROMETHEUS_RULES)}  # each fires in a test


def test_promtool_notices_a_rule_that_no_longer_fires(tmp_path):
    """The control: the same tests against rules with one expression broken must fail."""
    broken = tmp_path / "rules"
    broken.mkdir()
    for path in PROMETHEUS_RULES:
        (broken / path.name).write_text(path.read_text().replace(
            "nvidia_vgpu_boot_exit_code == 2", "nvidia_vgpu_boot_exit_code == 3"))
    for path in RULE_TESTS:
        (tmp_path / path.name).write_text(path.read_text().replace(
            "../../src/prometheus_alert_rules/", "rules/"))
    done = subprocess.run([tool("promtool"), "test", "rules",
                           *(str(tmp_path / p.name) for p in RULE_TESTS)],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode != 0 and "NvidiaVgpuBootDataUnreadable" in done.stdout + done.stderr


@pytest.mark.parametrize("broken, instead, fails", [
    ('xid="79"', 'xid="78"', "NvidiaGpuXidRebootNode"),  # an Xid 79 served at 1 after a restart
    ("< 900", "< 0", "NvidiaGpuXidRestartGuest"),  # an Xid the runbook does not name: its time
    ('eq $labels.xid "94"', 'eq $labels.xid "95"', "NvidiaGpuXidRestartGuest"),  # 94: hardware
])
def test_promtool_notices_an_xid_rule_that_no_longer_fires(tmp_path, broken, instead, fails):
    rules = REPO / "src/prometheus_alert_rules/nvidia-gpu-xid.rules"
    test = REPO / "unit_tests/prometheus/nvidia-gpu-xid-rules-test.yaml"
    (tmp_path / rules.name).write_text(rules.read_text().replace(broken, instead))
    (tmp_path / test.name).write_text(test.read_text().replace(f"../../{rules.relative_to(REPO)}",
                                                               rules.name))
    done = subprocess.run([tool("promtool"), "test", "rules", test.name], capture_output=True,
                          text=True, cwd=tmp_path)
    assert done.returncode != 0 and f"alertname: {fails}," in done.stdout + done.stderr


def test_alerts_read_only_the_exporters_metrics_and_up():
    known = {m.name for m in metrics.METRICS} | {"up"}
    for rule in alerts(PROMETHEUS_RULES):
        names = metric_names(rule["expr"])
        assert names and names <= known, (rule["alert"], names - known)


@pytest.mark.parametrize("rule", alerts(PROMETHEUS_RULES),
                         ids=lambda rule: rule["alert"])
def test_each_alert_says_what_and_where_its_runbook_line_is(rule):
    assert rule["labels"]["severity"] in ("warning", "critical")
    assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    anchor = rule["alert"].lower()
    assert f"docs/reference/metrics.md#{anchor}" in rule["annotations"]["description"]
    assert anchor in anchors(REFERENCE.read_text())  # the heading the description points to
    section = REFERENCE.read_text().split(f"\n### {rule['alert']}\n", 1)[1].split("\n#", 1)[0]
    assert re.search(r"^Runbook: \S", section, re.MULTILINE), f"{rule['alert']}: no runbook line"


def test_the_reference_describes_exactly_the_alerts_of_the_rules():
    headings = set(re.findall(r"^### (\w+)$", REFERENCE.read_text(), re.MULTILINE))
    assert headings == {rule["alert"] for rule in alerts(PROMETHEUS_RULES)}


# -- Xid errors: the rules and vgpu.xid's runbook agree ----------------------------------------

def xid_sets(expr: str):
    """The Xid numbers each ``xid=~`` and ``xid!~`` matcher of an expression names."""
    return [(op, set(map(int, numbers.split("|"))))
            for op, numbers in re.findall(r'xid(=~|!~)"([0-9|]+)"', expr)]


def test_the_xid_alerts_are_the_catalogues_classes_as_vgpu_xid_has_them():
    """One alert per class of NVIDIA's Xid catalogue's resolution buckets (vgpu.xid.RUNBOOK)."""
    from vgpu import xid

    rules = {r["alert"]: r for r in alerts(PROMETHEUS_RULES)}
    named = {"NvidiaGpuXidRebootNode": xid.REBOOT_NODE, "NvidiaGpuXidResetGpu": xid.RESET_GPU,
             "NvidiaGpuXidContactSupport": xid.CONTACT_SUPPORT,
             "NvidiaGpuXidRestartGuest": xid.RESTART_GUEST}
    assert {n for n in rules if "Xid" in n} == set(named)
    reset, support = set(xid.numbers(xid.RESET_GPU)), set(xid.numbers(xid.CONTACT_SUPPORT))
    assert xid_sets(rules["NvidiaGpuXidResetGpu"]["expr"]) == [("=~", reset)] * 2
    assert xid_sets(rules["NvidiaGpuXidContactSupport"]["expr"]) == [("=~", support)] * 2
    others = set(xid.numbers(xid.RESET_GPU) + xid.numbers(xid.REBOOT_NODE)) | support
    assert xid_sets(rules["NvidiaGpuXidRestartGuest"]["expr"]) == [("!~", others)] * 2
    assert set(xid.numbers(xid.REBOOT_NODE)) == {xid.FALLEN_XID}
    assert 'nvidia_vgpu_xid_errors{xid="79"}' in rules["NvidiaGpuXidRebootNode"]["expr"]
    # The restart-guest Xids that are the GPU's fault (94) are said so, not blamed on the guest.
    hardware = {x.number for x in xid.RUNBOOK if x.hardware and x.action == xid.RESTART_GUEST}
    said = set(map(int, re.findall(r'eq \$labels\.xid "([0-9]+)"',
                                   rules["NvidiaGpuXidRestartGuest"]["annotations"]["description"])))
    assert said == hardware == {94}
    for rule in rules.values():  # critical: the GPU must be reset or the node rebooted
        assert (rule["labels"]["severity"] == "critical") == (named.get(rule["alert"]) in (
            xid.RESET_GPU, xid.REBOOT_NODE)) or "Xid" not in rule["alert"]
    section = REFERENCE.read_text().split("\n### Xid numbers\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([0-9]+) \| [^|]+ \| `([A-Z_0-9]+)` \| ([a-z-]+) \| (hardware|application) \|",
                      section, re.MULTILINE)
    assert {int(n): (b, a, c == "hardware") for n, b, a, c in rows} == {
        x.number: (x.bucket, x.action, x.hardware) for x in xid.RUNBOOK}


def test_every_alert_the_docs_name_is_a_rule():
    """Issue 40.8: upgrade-driver.md named `VgpuFleetDriverVersionsDiffer`, a rule that is not."""
    names = {rule["alert"] for rule in alerts(PROMETHEUS_RULES)}
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    named = {(path.name, found) for path in docs for line in path.read_text().splitlines()
             if "alert" in line.lower()
             for found in re.findall(r"`((?:Nvidia)?(?:Vgpu|Gpu)[A-Z][A-Za-z]+)`", line)}
    assert {pair for pair in named if pair[1] not in names} == set()
