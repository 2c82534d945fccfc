"""Alert rules the charm gives COS: promtool checks and tests each one, Loki's match the kernel.

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
LOKI_RULES = sorted((REPO / "src/loki_alert_rules").glob("*.rules"))
RULE_TESTS = sorted((REPO / "unit_tests/prometheus").glob("*-test.yaml"))
REFERENCE = REPO / "docs/reference/metrics.md"


def alerts(paths):
    return [rule for path in paths for group in yaml.safe_load(path.read_text())["groups"]
            for rule in group["rules"]]


def test_the_rule_directories_hold_rules_only():
    """cosl reads every .rule, .rules, .yml and .yaml file there as rules: tests live elsewhere."""
    for directory in ("prometheus_alert_rules", "loki_alert_rules"):
        names = [p.name for p in (REPO / "src" / directory).iterdir()]
        assert names and all(n.endswith(".rules") for n in names), names


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


def test_alerts_read_only_the_exporters_metrics_and_up():
    known = {m.name for m in metrics.METRICS} | {"up"}
    for rule in alerts(PROMETHEUS_RULES):
        names = metric_names(rule["expr"])
        assert names and names <= known, (rule["alert"], names - known)


@pytest.mark.parametrize("rule", alerts(PROMETHEUS_RULES) + alerts(LOKI_RULES),
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
    assert headings == {rule["alert"] for rule in alerts(PROMETHEUS_RULES) + alerts(LOKI_RULES)}


# -- Loki: the kernel's NVRM lines --------------------------------------------------------------

# Real lines, as their sources print them.
XID_79 = "NVRM: Xid (PCI:0000:44:00): 79, GPU has fallen off the bus"  # NVIDIA/NVSentinel#155
FALLEN = "NVRM: fallen off the bus and is not responding to commands."  # same issue, 570.158.01
XID_31 = ("NVRM: Xid (PCI:0000:03:00): 31, pid=1234, name=python3, Ch 00000010, intr 00000000. "
          "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f5a_1b000000")  # NVIDIA's Xid docs' form
UNRELATED = ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  570.158.01  Release Build",
             "mlx5_core 0000:ab:00.0 mlx5_5: Port: 1 Link ACTIVE")


def line_filters(expr: str):
    """Each ``|= "text"`` and ``|~ "regex"`` of a LogQL expression, as a Python predicate."""
    found = []
    for operator, quoted in re.findall(r'\|([=~])\s*("(?:[^"\\]|\\.)*")', expr):
        text = yaml.safe_load(quoted)  # a double-quoted YAML scalar unescapes as LogQL does
        found.append((lambda line, t=text: t in line) if operator == "=" else
                     (lambda line, r=re.compile(text): r.search(line) is not None))
    return found


def loki(name: str) -> str:
    (rule,) = [r for r in alerts(LOKI_RULES) if r["alert"] == name]
    return rule["expr"]


@pytest.mark.parametrize("name, matches, not_matches", [
    ("NvidiaGpuXidError", (XID_79, XID_31), (FALLEN, *UNRELATED)),
    ("NvidiaGpuFallenOffTheBus", (XID_79, FALLEN), (XID_31, *UNRELATED)),
])
def test_loki_rules_match_the_kernels_nvrm_lines(name, matches, not_matches):
    expr = loki(name)
    assert re.search(r'count_over_time\(\{[a-z_]+=~"\.\+"\}', expr)  # a selector Loki accepts
    (match,) = line_filters(expr)
    assert all(match(line) for line in matches)
    assert not any(match(line) for line in not_matches)
