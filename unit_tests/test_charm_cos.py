"""The cos-agent relation: the cos_agent library's data, and the exporter it keeps running.

What the collector (opentelemetry-collector) reads is the unit's ``config`` key, as the
library's COSAgentProvider writes it; it is read back here with the library's own model.
"""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cosl import LZMABase64
from ops import testing

from unit_tests.test_charm import install_driver, relation, state
from unit_tests.test_charm_sriov import again
from vgpu import exporter

REPO = Path(__file__).resolve().parents[1]
ALERTS = {r["alert"] for path in (REPO / "src/prometheus_alert_rules").glob("*.rules")
          for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]}


@pytest.fixture
def v100(v100, root, packages):
    """Two V100s with the driver installed: active, no vGPU type mapped."""
    install_driver(root, packages["old"])
    return v100


@pytest.fixture(autouse=True)
def in_charm_dir(monkeypatch):
    """Juju runs each hook in the charm's directory: the library reads rules and dashboards there."""
    monkeypatch.chdir(REPO)


def cos_agent():
    return testing.Relation("cos-agent", remote_app_name="opentelemetry-collector")


def joined(ctx, packages, config=None):
    """cos-agent's relation-joined, the collector newly related."""
    cos = cos_agent()
    return ctx.run(ctx.on.relation_joined(cos), state(config, relations=[relation(), cos],
                                                      resource=packages["old"]))


def published(out) -> dict:
    data = out.get_relations("cos-agent")[0].local_unit_data["config"]
    return json.loads(data)


def test_metadata_provides_cos_agent_as_the_library_expects():
    meta = yaml.safe_load((REPO / "metadata.yaml").read_text())
    assert meta["provides"]["cos-agent"] == {"interface": "cos_agent", "limit": 1}
    lib = (REPO / "lib/charms/grafana_agent/v0/cos_agent.py").read_text()
    assert 'LIBID = "dc15fa84cef84ce58155fb84f6c6213a"' in lib
    assert int(lib.split("LIBPATCH = ")[1].split()[0]) >= 20


def test_the_collector_gets_the_scrape_job_rules_and_dashboard(ctx, v100, root, tools, packages):
    out = joined(ctx, packages)
    data = published(out)
    (job,) = data["metrics_scrape_jobs"]
    assert job["job_name"].startswith("nova-compute-nvidia-vgpu_nvidia_vgpu_exporter_")
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:10230"]
    assert job["metrics_path"] == "/metrics"
    alerts = {r["alert"] for g in data["metrics_alert_rules"]["groups"] for r in g["rules"]}
    assert ALERTS <= alerts  # with the library's generic ones (HostMetricsMissing ...)
    assert {"NvidiaGpuXidRebootNode", "NvidiaGpuXidResetGpu", "NvidiaGpuXidRestartGuest",
            "NvidiaGpuXidContactSupport"} <= ALERTS
    assert not data["log_alert_rules"].get("groups")  # no Loki rule: one could never fire
    assert "NvidiaVgpuFleetDriverVersionsDiffer" in alerts  # src/prometheus_alert_rules/*.rules
    dashboards = [json.loads(LZMABase64.decompress(d)) for d in data["dashboards"]]
    assert sorted(d["title"] for d in dashboards) == ["NVIDIA vGPU fleet", "NVIDIA vGPU hosts"]
    # And the exporter runs, on that port.
    assert exporter.installed_port() == 10230
    assert f"systemctl restart {exporter.UNIT}" in tools.calls()


def test_without_the_relation_nothing_of_it_runs(ctx, v100, root, tools, packages):
    before = ctx.run(ctx.on.config_changed(), state(resource=packages["old"]))
    assert not (root / exporter.UNIT_FILE).exists()
    assert not [c for c in tools.calls() if exporter.UNIT in c]
    assert before.unit_status.name == "active"


def test_update_status_never_loads_the_library_nor_touches_the_exporter(v100, root, tools, packages):
    """A fresh process, as Juju runs each hook: pydantic and cosl stay out of update-status."""
    script = (
        "import sys\n"
        "from ops import testing\n"
        "from charm import NovaComputeNvidiaVgpuCharm\n"
        "from unit_tests.test_charm import relation, state\n"
        "ctx = testing.Context(NovaComputeNvidiaVgpuCharm)\n"
        "cos = testing.Relation('cos-agent', remote_app_name='opentelemetry-collector')\n"
        "out = ctx.run(ctx.on.update_status(), state(relations=[relation(), cos],"
        " resource=sys.argv[1]))\n"
        "print(out.unit_status.name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'cosl', 'charms')))\n")
    done = subprocess.run([sys.executable, "-c", script, str(packages["old"])], capture_output=True,
                          text=True, cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(["src", "lib", "."])})
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-3:] == ["active", "[]", ""]
    assert not [c for c in tools.calls() if exporter.UNIT in c]


def test_a_port_a_neighbour_uses_blocks_and_the_exporter_keeps_its_port(ctx, v100, root, tools, packages):
    first = joined(ctx, packages)
    out = ctx.run(ctx.on.config_changed(), again(first, {"metrics-port": 9400}))
    assert out.unit_status == testing.BlockedStatus(
        "metrics-port 9400 is the port of dcgm-exporter (the DCGM snap hardware-observer installs "
        "on NVIDIA GPU hosts): give another (default 10230)")
    assert exporter.installed_port() == 10230
    assert published(out)["metrics_scrape_jobs"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:10230"]
    # Still said on the hooks that do not touch the exporter ...
    later = ctx.run(ctx.on.update_status(), again(out))
    assert later.unit_status.name == "blocked"
    # ... until a good port is given.
    fixed = ctx.run(ctx.on.config_changed(), again(later, {"metrics-port": 10231}))
    assert fixed.unit_status.name == "active", fixed.unit_status
    assert exporter.installed_port() == 10231
    assert published(fixed)["metrics_scrape_jobs"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:10231"]


def test_upgrade_charm_restarts_the_exporter_on_the_new_code(ctx, v100, root, tools, packages):
    first = joined(ctx, packages)
    calls = len(tools.calls())
    ctx.run(ctx.on.upgrade_charm(), again(first))
    assert f"systemctl restart {exporter.UNIT}" in tools.calls()[calls:]


def test_the_relation_gone_removes_the_exporter(ctx, v100, root, tools, packages):
    first = joined(ctx, packages)
    cos = first.get_relations("cos-agent")[0]
    out = ctx.run(ctx.on.relation_broken(cos), again(first))
    assert not (root / exporter.UNIT_FILE).exists()
    assert f"systemctl stop {exporter.UNIT}" in tools.calls()
    assert out.unit_status.name == "active"


def test_remove_removes_the_exporter(ctx, v100, root, tools, packages):
    first = joined(ctx, packages)
    ctx.run(ctx.on.remove(), again(first))
    assert not (root / exporter.UNIT_FILE).exists()


def test_an_exporter_that_could_not_be_enabled_is_enabled_and_started_by_a_later_hook(
        ctx, v100, root, tools, packages):
    """Its unit file was written before systemctl failed, and is right the next time.

    That is no reason to leave it disabled and stopped while the status says nothing any more.
    """
    tools.fail("enable", exporter.UNIT)
    first = joined(ctx, packages)
    assert first.unit_status.name == "blocked"
    assert first.unit_status.message.startswith("the metrics exporter did not start: ")
    (tools.state / f"{exporter.UNIT}.fail-enable").unlink()  # the operator fixed systemd
    calls = len(tools.calls())
    out = ctx.run(ctx.on.config_changed(), again(first))
    done = tools.calls()[calls:]
    assert f"systemctl enable {exporter.UNIT}" in done
    assert f"systemctl restart {exporter.UNIT}" in done
    assert out.unit_status.name == "active", out.unit_status


def test_a_port_taken_before_any_exporter_is_never_published_as_a_scrape_job(
        ctx, v100, root, tools, packages):
    """issue 34 item 5: another process on 10230; the collector must not scrape it as ours."""
    from unit_tests.test_exporter import TCP, proc_net

    proc_net(root, tcp=TCP + "   4: 0100007F:27F6 00000000:0000 0A 0 0 0 0 0 5 1\n")  # :10230
    out = joined(ctx, packages)
    assert out.unit_status.name == "blocked"
    assert "another process listens on it" in out.unit_status.message
    assert exporter.installed_port() is None
    assert published(out)["metrics_scrape_jobs"] == []  # no job: nothing of ours to scrape
    # A free port given: the exporter runs there, and that is the job.
    fixed = ctx.run(ctx.on.config_changed(), again(out, {"metrics-port": 10231}))
    assert published(fixed)["metrics_scrape_jobs"][0]["static_configs"][0]["targets"] == [
        "127.0.0.1:10231"]


@pytest.mark.parametrize("where", [exporter.UNIT_FILE, exporter.RUNTIME_UNIT_FILE])
def test_an_operators_mask_is_respected_by_every_hook_and_said(ctx, v100, root, tools, packages,
                                                              where):
    """issue 34 item 8: ``systemctl mask`` (persistent: /etc; --runtime: /run) stays."""
    first = joined(ctx, packages)
    link = root / where
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.exists():
        link.unlink()
    link.symlink_to(os.devnull)  # what systemctl mask does
    calls = len(tools.calls())
    out = first
    for hook in ("config_changed", "upgrade_charm", "relation_changed"):
        before = again(out)
        cos = before.get_relations("cos-agent")[0]
        event = ctx.on.relation_changed(cos) if hook == "relation_changed" else getattr(
            ctx.on, hook)()
        out = ctx.run(event, before)
        assert os.readlink(link) == os.devnull
        assert not [c for c in tools.calls()[calls:] if exporter.UNIT in c]
        assert out.unit_status.name == "active"
        assert out.unit_status.message.endswith(exporter.MASKED), out.unit_status
        assert published(out)["metrics_scrape_jobs"] == []
    before = again(out)
    ctx.run(ctx.on.relation_broken(before.get_relations("cos-agent")[0]), before)
    # the relation gone: the mask still stays, and no metrics are asked for: nothing to say
    assert os.readlink(link) == os.devnull
    alone = dataclasses.replace(again(out), relations=[
        r for r in out.relations if r.endpoint != "cos-agent"])
    out = ctx.run(ctx.on.update_status(), alone)
    assert out.unit_status.name == "active"
    assert exporter.MASKED not in out.unit_status.message


def test_tenant_identities_are_served_only_where_the_operator_opts_in(ctx, v100, root, tools,
                                                                     packages):
    first = joined(ctx, packages)
    assert "--tenant-identities" not in (root / exporter.UNIT_FILE).read_text()
    out = ctx.run(ctx.on.config_changed(), again(first, {"exporter-tenant-identities": True}))
    assert " --tenant-identities --port 10230\n" in (root / exporter.UNIT_FILE).read_text()
    assert exporter.installed_port() == 10230
    ctx.run(ctx.on.config_changed(), again(out, {"exporter-tenant-identities": False}))
    assert "--tenant-identities" not in (root / exporter.UNIT_FILE).read_text()
