"""A real Prometheus on 127.0.0.1 scrapes the real exporter on a fixture host, end to end.

The charm, related to cos-agent, publishes what the collector reads (scrape job, alert rules,
dashboard) and writes the exporter's unit; the unit's own command line runs the exporter on the
fixture host, NVML answered by the pynvml stand-in (unit_tests/fake_pynvml). Prometheus
(Debian's ``prometheus`` package, which .ci/run installs) is given the published scrape job
and alert rules as they are; then every query of the published dashboard and every alert
expression is evaluated against what it scraped. The host is set up so that each has
something to show: a restore after boot (a hook's) that failed on one GPU, a published VF
without its type, a type exhausted, a vGPU past its licensing grace period, and in the
journal (unit_tests/fakejournal.py, real kernel lines) a guest's Xid 31 and an Xid 48 on the
L40S and a third GPU that fell off the bus (Xid 79) and is gone from sysfs.
"""

import contextlib
import json
import re
import shlex
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml
from cosl import LZMABase64
from ops import testing

from unit_tests.fakehost import l40s_host
from unit_tests.fakejournal import XID_31, XID_79, Journal
from unit_tests.libvirt import running_guest
from unit_tests.test_charm import install_driver, state
from unit_tests.test_exporter import free_port
from vgpu import bootresult, exporter, metrics

REPO = Path(__file__).resolve().parents[1]
L40S, H200 = "0000:81:00.0", "0000:c1:00.0"
H200_VFS = ("0000:c1:00.4", "0000:c1:00.5", "0000:c1:00.6", "0000:c1:00.7")
# A double-bit ECC error as NVIDIA's Xid reference words Xid 48 (on the fixture's L40S).
XID_48 = (f"NVRM: Xid (PCI:{L40S[:-2]}): 48, An uncorrectable double bit error (DBE) has been "
          "detected on GPU in the framebuffer at partition 0, subpartition 0.")
NEEDED = "install Debian's prometheus package (it ships promtool), as .ci/run does"


def tool(name: str) -> str:
    """The path of ``name``; a failure (never a skip) when it is missing."""
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: {NEEDED}")
    return found


def api(port: int, path: str, **params) -> dict:
    url = f"http://127.0.0.1:{port}/api/v1/{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as answer:
        return json.loads(answer.read().decode())


def wait_for(what, check, seconds: float = 60):
    deadline = time.monotonic() + seconds
    while True:
        try:
            found = check()
            if found:
                return found
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {seconds:.0f} s: {what}")
        time.sleep(0.5)


@contextlib.contextmanager
def running(argv, env=None, cwd=None):
    process = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True)
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture
def scene(ctx, root, tools, packages, tmp_path, monkeypatch, bindir):
    """The host, the charm related to cos-agent, and what the collector would be given."""
    monkeypatch.chdir(REPO)  # where Juju runs hooks: the library reads rules and dashboards there
    host = l40s_host(root)
    install_driver(root, packages["old"])
    host.install_sriov_manage()
    tools.set_active("nvidia-vgpu-mgr")
    port = free_port()
    config = {"vgpu-device-mappings": "{L40S-12Q: all, 'NVIDIA H200X-35C': ['c1:00.0']}",
              "metrics-port": port, "exporter-tenant-identities": True}  # Prometheus runs as root
    out = ctx.run(ctx.on.config_changed(), state(config, resource=packages["old"]))
    for n, vf in enumerate(H200_VFS):  # the H200's four H200X-35C all held: the type exhausted
        running_guest(root, f"instance-0000005{n}", f"5555555{n}-5555-4555-8555-555555555555",
                      pci_address=vf)
    host.vfio_model(L40S).frozen = True  # one published VF lost its type (a reboot, no boot step)
    (root / "sys/bus/pci/devices/0000:81:00.6/nvidia/current_vgpu_type").write_text("0\n")
    bootresult.save(bootresult.Result(time.time() - 600, 31.5, 1, bootresult.gpu_results(
        [(L40S, "not restored", 30.0), (H200, "restored", 1.5)]), run_by="hook"))
    cos = testing.Relation("cos-agent", remote_app_name="opentelemetry-collector")
    joined = ctx.run(ctx.on.relation_joined(cos), testing.State(
        config=dict(out.config), relations=[*out.relations, cos], resources=out.resources,
        stored_states=out.stored_states))
    published = json.loads(joined.get_relations("cos-agent")[0].local_unit_data["config"])
    nvml_state = tmp_path / "nvml.json"
    nvml_state.write_text(json.dumps({"driver": "570.158.02", "gpus": [
        {"bus_id": "00000000:C1:00.0", "vgpus": [
            {"id": 1, "uuid": "vgpu-restricted", "vm": "55555550-5555-4555-8555-555555555555",
             "type": 1282, "licensed": 0, "state": 3, "fb": 3 << 30,
             "util": {"sm": 40, "memory": 12, "encoder": 0, "decoder": 0}},
            {"id": 2, "uuid": "vgpu-licensed", "vm": "55555551-5555-4555-8555-555555555555",
             "type": 1282, "licensed": 1, "state": 5, "fb": 9 << 30,
             "util": {"sm": 90, "memory": 70, "encoder": 0, "decoder": 0}},
            # Two vGPUs of one type NVML cannot identify (UUID and VM calls fail): issue 34 item 3.
            *({"id": n, "uuid": "", "vm": "", "type": 1282, "licensed": 0, "state": 3,
               "fb": 3 << 30, "util": {"sm": 5, "memory": 1, "encoder": 0, "decoder": 0},
               "fail": {"nvmlVgpuInstanceGetUUID": 999, "nvmlVgpuInstanceGetVmID": 999}}
              for n in (3, 4))]}]}))
    journal = Journal(root, bindir)
    recent = time.time() - 120  # read from the boot's journal: the series first appear at 1
    # The kernel's PCI core added the third GPU at boot (drivers/pci/probe.c): this host's.
    added = "pci 0000:2b:00.0: [10de:2330] type 00 class 0x030200 PCIe Endpoint"
    # A contained ECC error in a MIG GPU instance of the H200 (NVIDIA's A100 memory error
    # management guide, "User Visible Statistics", gives the form): the GPU's fault.
    mig_94 = (f"NVRM: Xid (PCI:{H200[:-2]} GPU-I:03): 94, pid=4242, name=qemu-system-x86, "
              "Contained: SM (0x1). RST: No, D-RST: No")
    journal.kernel((added, XID_31.replace("03:00", "81:00"), XID_48, mig_94) + XID_79, recent)
    return {"root": root, "port": port, "published": published, "nvml": nvml_state,
            "work": tmp_path, "bindir": bindir}


def exporter_process(scene):
    """The exporter as the unit the charm wrote runs it (ExecStart, Environment)."""
    unit = (scene["root"] / exporter.UNIT_FILE).read_text()
    lines = dict(line.split("=", 1) for line in unit.splitlines()
                 if line.startswith(("ExecStart=", "Environment=")))
    env = dict(word.split("=", 1) for word in shlex.split(lines["Environment"]))
    env.update(VGPU_HOST_ROOT=str(scene["root"]), FAKE_NVML=str(scene["nvml"]),
               PATH=f"{scene['bindir']}:/usr/bin:/bin")  # journalctl: the stand-in
    env["PYTHONPATH"] = f"{REPO / 'unit_tests/fake_pynvml'}:{env['PYTHONPATH']}"
    return running(shlex.split(lines["ExecStart"]), env=env)


def dashboard_queries(published) -> list:
    out = []
    for encoded in published["dashboards"]:
        dashboard = json.loads(LZMABase64.decompress(encoded))
        for panel in dashboard["panels"]:
            for target in panel.get("targets", []):
                out.append((panel["title"], target["expr"].replace("$host", ".*")))
    return out


def metric_names(expr: str) -> set:
    """The metric names an expression reads: ours, and up (label values left out)."""
    bare = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\bnvidia_vgpu_[a-z0-9_]+\b", bare)) | (
        {"up"} if re.search(r"\bup\s*\{", bare) else set())


def test_prometheus_scrapes_the_exporter_and_evaluates_every_query_and_alert(scene):
    prometheus = tool("prometheus")
    published = scene["published"]
    work = scene["work"]
    (work / "rules.yml").write_text(yaml.safe_dump(published["metrics_alert_rules"]))
    jobs = published["metrics_scrape_jobs"]
    assert jobs[0]["static_configs"][0]["targets"] == [f"127.0.0.1:{scene['port']}"]
    (work / "prometheus.yml").write_text(yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(work / "rules.yml")], "scrape_configs": jobs}))
    check = subprocess.run([tool("promtool"), "check", "config", str(work / "prometheus.yml")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    web = free_port()
    with exporter_process(scene), running(
            [prometheus, f"--config.file={work / 'prometheus.yml'}",
             f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{web}"],
            cwd=work) as server:
        up = wait_for("the exporter scraped", lambda: [
            r for r in api(web, "query", query=f'up{{job="{jobs[0]["job_name"]}"}} == 1')["data"]["result"]])
        assert up[0]["metric"]["instance"]  # the host's name, from the published job's labels
        wait_for("every rule evaluated", lambda: all(
            not r.get("lastEvaluation", "").startswith("0001")
            for g in api(web, "rules")["data"]["groups"] for r in g["rules"]))
        time.sleep(3)  # a few more scrapes and evaluations (1 s each)
        scraped = {r["metric"]["__name__"] for r in api(
            web, "query", query='count by (__name__) ({__name__=~"nvidia_vgpu_.*|up"})')["data"]["result"]}
        # Every dashboard query runs and shows something.
        queries = dashboard_queries(published)
        assert len(queries) >= 20
        for title, expr in queries:
            answer = api(web, "query", query=expr)
            assert answer["status"] == "success", (title, expr, answer)
            assert answer["data"]["result"], (title, expr)
            assert metric_names(expr) <= scraped, (title, expr, metric_names(expr) - scraped)
        # Every alert expression of ours runs on what was scraped and reads only metrics it finds.
        rules = [r for g in api(web, "rules")["data"]["groups"] for r in g["rules"]
                 if r["name"].startswith("Nvidia")]
        assert {r["name"] for r in rules} == {r["alert"] for path in sorted(
            (REPO / "src/prometheus_alert_rules").glob("*.rules"))
            for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]}
        for rule in rules:
            assert rule["health"] == "ok" and not rule.get("lastError"), rule
            assert api(web, "query", query=rule["query"])["status"] == "success"
            assert metric_names(rule["query"]) <= scraped, rule["query"]
        active = {r["name"] for r in rules if r["state"] in ("pending", "firing")}
        assert active == {"NvidiaVgpuTypeCapacityExhausted", "NvidiaVgpuBootStepFailed",
                          "NvidiaVgpuPublishedVfWithoutType", "NvidiaVgpuMappingNotApplied",
                          "NvidiaVgpuUnlicensedPastGracePeriod", "NvidiaVgpuUnlicensed",
                          "NvidiaGpuXidRebootNode", "NvidiaGpuXidResetGpu", "NvidiaGpuXidRestartGuest",
                          "NvidiaVgpuExporterSourceUnreadable"}  # nvml: the failed calls
        firing = {a["labels"]["alertname"]: a["labels"] for a in api(web, "alerts")["data"]["alerts"]
                  if a["state"] == "firing"}
        assert firing["NvidiaVgpuBootStepFailed"]["gpu"] == L40S  # no "for": at once
        assert firing["NvidiaVgpuBootStepFailed"]["run_by"] == "hook"  # who restored, said
        (summary,) = [a["annotations"]["summary"] for a in api(web, "alerts")["data"]["alerts"]
                      if a["labels"]["alertname"] == "NvidiaVgpuBootStepFailed"]
        assert summary.startswith("A hook doing the boot step's work did not restore GPU "), summary
        assert firing["NvidiaGpuXidRebootNode"]["gpu"] == "0000:2b:00.0"  # gone from sysfs
        assert (firing["NvidiaGpuXidResetGpu"]["gpu"], firing["NvidiaGpuXidResetGpu"]["xid"]) \
            == (L40S, "48")
        restart = [a for a in api(web, "alerts")["data"]["alerts"]
                   if a["labels"]["alertname"] == "NvidiaGpuXidRestartGuest"]
        assert sorted((a["labels"]["gpu"], a["labels"]["xid"]) for a in restart) == sorted(
            [(L40S, "31"), (H200, "94")])
        (hardware,) = [a for a in restart if a["labels"]["xid"] == "94"]
        assert "the GPU's and not the guest's fault" in hardware["annotations"]["description"]
        (instance,) = api(web, "query", query="nvidia_vgpu_xid_gpu_instance_errors")["data"][
            "result"]
        assert (instance["metric"]["gpu"], instance["metric"]["gpu_instance"],
                instance["metric"]["xid"], instance["value"][1]) == (H200, "3", "94", "1")
        zero = api(web, "query", query=f'nvidia_vgpu_xid_errors{{gpu="{H200}",xid="79"}}')
        assert [r["value"][1] for r in zero["data"]["result"]] == ["0"]  # there from the start
        # Both vGPUs NVML cannot identify kept their series (none replaced the other), counted.
        restricted = api(web, "query", query=f'nvidia_vgpu_vgpu_license_state{{gpu="{H200}"}} == 3')
        assert sorted(r["metric"]["vgpu_instance"] for r in restricted["data"]["result"]) == [
            "1", "3", "4"]
        (unidentified,) = api(web, "query", query="nvidia_vgpu_gpu_unidentified_vgpu_instances")[
            "data"]["result"]
        assert unidentified["value"][1] == "2" and unidentified["metric"]["gpu"] == H200
        alerts = api(web, "query", query='ALERTS{alertname="NvidiaVgpuUnlicensedPastGracePeriod"}')
        assert sorted(r["metric"]["vgpu_instance"] for r in alerts["data"]["result"]) == [
            "1", "3", "4"]  # it can fire for each of them
        assert server.poll() is None
    assert {m.name for m in metrics.METRICS} <= scraped  # every metric reached Prometheus
