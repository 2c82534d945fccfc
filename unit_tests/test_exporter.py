"""The metrics exporter: its systemd unit and port (vgpu.exporter), and the process it runs.

The process is the real one (src/vgpu_exporter.py, prometheus-client), on 127.0.0.1 and a
free port, reading a fixture host; NVML through the pynvml stand-in where a test puts it
on the path, the real nvidia-ml-py (no driver here) otherwise.
"""

import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from unit_tests.test_capacity import VM_1, full_l40s_12q
from vgpu import exporter
from vgpu.errors import ExporterError

REPO = Path(__file__).resolve().parents[1]
FAKE_PYNVML = REPO / "unit_tests" / "fake_pynvml"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def unit_lines(text: str) -> dict:
    out: dict = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def get(port: int, path: str = "/metrics") -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
        assert answer.status == 200
        return answer.read().decode()


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


@contextlib.contextmanager
def serving(argv, env, port):
    """The exporter as its own process until the block ends; then SIGTERM, as systemd stops it."""
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                get(port)
                break
            except (urllib.error.URLError, ConnectionError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(
                        f"the exporter did not serve: {process.communicate()[0]}") from None
                time.sleep(0.1)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)


def exporter_env(root, **extra):
    env = {k: v for k, v in os.environ.items() if k != "FAKE_NVML"}
    env.update(VGPU_HOST_ROOT=str(root), **extra)
    return env


@pytest.fixture
def host(root):
    """An L40S full of L40S-12Q, a guest on one VF."""
    return full_l40s_12q(root)


# -- the process -------------------------------------------------------------------------------

def test_the_units_command_line_serves_the_hosts_metrics_on_127_0_0_1_only(host, root):
    """What systemd runs (ExecStart and Environment of the rendered unit), without NVML's driver."""
    port = free_port()
    lines = unit_lines(exporter.render(port))
    argv = shlex.split(lines["ExecStart"][0])
    assert argv == [sys.executable, str(REPO / "src/vgpu_exporter.py"), "--port", str(port)]
    env = exporter_env(root)
    env.update(dict(word.split("=", 1) for word in shlex.split(lines["Environment"][0])))
    with serving(argv, env, port) as process:
        found = families(get(port))
        used = {(s.labels["gpu"], s.labels["type"]): s.value
                for s in found["nvidia_vgpu_type_used_instances"].samples}
        assert used[("0000:81:00.0", "nvidia-1139")] == 1
        sources = {s.labels["source"]: s.value
                   for s in found["nvidia_vgpu_exporter_source_up"].samples}
        assert "nvml" not in sources and sources["pci"] == 1  # no driver here: no NVML, no error
        assert found["process_resident_memory_bytes"].samples[0].value > 0
        listening = [c.laddr for c in psutil.Process(process.pid).net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
        assert listening == [("127.0.0.1", port)]
    assert process.returncode == 0  # SIGTERM: a clean stop
    said = process.stdout.read()
    # A normal start is news, not a warning (issue 41): INFO, and nothing at WARNING or above.
    assert f"INFO vgpu_exporter: serving http://127.0.0.1:{port}/metrics" in said
    assert "WARNING vgpu: serving" not in said


def test_nvml_figures_reach_the_scrape(host, root, tmp_path):
    state = tmp_path / "nvml.json"
    state.write_text(json.dumps({"driver": "570.158.02", "gpus": [
        {"bus_id": "00000000:81:00.0", "vgpus": [
            {"id": 3, "uuid": "v-1", "vm": VM_1, "type": 1139, "licensed": 1, "state": 5,
             "fb": 5 << 30, "util": {"sm": 12, "memory": 3, "encoder": 0, "decoder": 0}}]}]}))
    port = free_port()
    env = exporter_env(root, FAKE_NVML=str(state),
                       PYTHONPATH=os.pathsep.join([str(FAKE_PYNVML), os.environ.get("PYTHONPATH", "")]))
    with serving([sys.executable, str(REPO / "src/vgpu_exporter.py"), "--port", str(port)], env,
                 port):
        found = families(get(port))
        (sample,) = found["nvidia_vgpu_vgpu_framebuffer_used_bytes"].samples
        assert sample.labels == {"gpu": "0000:81:00.0", "vgpu_instance": "3", "vgpu_uuid": "v-1",
                                 "type": "nvidia-1139"}
        assert sample.value == 5 << 30
        state.write_text(json.dumps({"driver": "570.158.02", "fail": {"nvmlDeviceGetCount": 999},
                                     "gpus": []}))
        again = families(get(port))  # NVML failing now: a sample says so, the scrape goes on
        sources = {s.labels["source"]: s.value
                   for s in again["nvidia_vgpu_exporter_source_up"].samples}
        assert sources["nvml"] == 0 and sources["pci"] == 1


def xid_series(text: str) -> dict:
    found = families(text).get("nvidia_vgpu_xid_errors")
    return {(s.labels["gpu"], s.labels["xid"]): s.value for s in found.samples} if found else {}


def wait_for_series(port: int, check, seconds: float = 20):
    deadline = time.monotonic() + seconds
    while True:
        text = get(port)
        if check(text):
            return text
        assert time.monotonic() < deadline, text
        time.sleep(0.1)


def test_the_exporter_reads_the_kernels_xid_lines_from_the_journal(host, root, bindir):
    """Off the scrape path: a thread reads the journal, each scrape serves what it left."""
    from unit_tests.fakejournal import XID_79, Journal

    journal = Journal(root, bindir)
    journal.kernel(["NVRM: Xid (PCI:0000:81:00): 31, pid=1234, name=qemu-system-x86, MMU Fault"],
                   1_764_000_000.0)
    port = free_port()
    with serving([sys.executable, str(REPO / "src/vgpu_exporter.py"), "--port", str(port)],
                 exporter_env(root), port):
        text = wait_for_series(port, lambda t: "nvidia_vgpu_xid_errors{" in t)
        counts = xid_series(text)
        assert counts[("0000:81:00.0", "31")] == 1 and counts[("0000:81:00.0", "79")] == 0
        journal.kernel([line.replace("2b:00", "81:00") for line in XID_79], 1_764_000_060.0)
        text = wait_for_series(port, lambda t: xid_series(t).get(("0000:81:00.0", "79")) == 1)
        assert 'nvidia_vgpu_xid_gpu_lost{gpu="0000:81:00.0",source="kernel"} 1.0' in text
        assert 'nvidia_vgpu_exporter_source_up{source="journal"} 1.0' in text
    runs = journal.runs()
    assert "--after-cursor" not in runs[0] and all("--after-cursor=" in r for r in runs[1:])


def test_a_journal_that_hangs_never_stalls_a_scrape(host, root, bindir):
    from unit_tests.fakejournal import Journal
    from unit_tests.faketools import running

    journal = Journal(root, bindir)
    journal.hang()
    port = free_port()
    with serving([sys.executable, str(REPO / "src/vgpu_exporter.py"), "--port", str(port)],
                 exporter_env(root), port) as process:
        started = time.monotonic()
        text = get(port)
        assert time.monotonic() - started < 5
        assert "nvidia_vgpu_gpu_info{" in text and "nvidia_vgpu_xid_errors{" not in text
        assert 'nvidia_vgpu_xid_gpu_lost{gpu="0000:81:00.0",source="pci"} 0.0' in text
        children = psutil.Process(process.pid).children(recursive=True)
        assert children  # journalctl, hanging
    assert process.returncode == 0  # SIGTERM while journalctl hangs: still a clean stop
    time.sleep(0.5)
    assert not [c.pid for c in children if running(c.pid)]  # and it was ended
def as_user(name, action):
    """``action()``'s text, run in a child process that is ``name`` (no longer root)."""
    import pwd

    user = pwd.getpwnam(name)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover (the child)
        status = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            assert os.getuid() == user.pw_uid != 0
            os.write(write, action().encode())
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        out = pipe.read().decode()
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return out


def tenant_series(text):
    return {name: [s.labels for s in family.samples]
            for name, family in families(text).items()
            if name.endswith("_tenant_info") and family.samples}


def test_tenant_identities_reach_root_only_and_only_where_the_operator_opts_in(host, root):
    """issue 34 item 2: a process running as nobody reads no tenant identity, opted in or not."""
    port = free_port()
    argv = [sys.executable, str(REPO / "src/vgpu_exporter.py"), "--port", str(port)]
    with serving(argv, exporter_env(root), port):
        assert tenant_series(get(port)) == {}  # off by default: root (the collector) gets none
        as_nobody = as_user("nobody", lambda: get(port))
        assert "nvidia_vgpu_guest_info" in as_nobody and VM_1 not in as_nobody
    port = free_port()
    opted = [sys.executable, str(REPO / "src/vgpu_exporter.py"), "--tenant-identities", "--port",
             str(port)]
    with serving(opted, exporter_env(root), port):
        assert tenant_series(get(port)) == {"nvidia_vgpu_guest_tenant_info": [{
            "gpu": "0000:81:00.0", "device": "0000:81:00.5", "instance_uuid": VM_1,
            "project_id": "8f1c2a7d5e3b4c6a9d0e1f2a3b4c5d6e", "project_name": "acme-render"}]}
        as_nobody = as_user("nobody", lambda: get(port))
        assert tenant_series(as_nobody) == {}
        assert VM_1 not in as_nobody and "acme-render" not in as_nobody
        assert "nvidia_vgpu_guest_info{" in as_nobody  # the rest of the scrape is the same


def test_more_idle_connections_than_the_unit_has_tasks_still_leave_scrapes_answered(host, root):
    """issue 34 item 6: 100 connections that send nothing (TasksMax=32 in the unit)."""
    port = free_port()
    argv = [sys.executable, str(REPO / "src/vgpu_exporter.py"), "--port", str(port)]
    idle = []
    with serving(argv, exporter_env(root), port) as process:
        try:
            for _ in range(100):
                idle.append(socket.create_connection(("127.0.0.1", port)))
            idle[0].sendall(b"GET /metrics HTTP/1.0\r\n")  # a head never finished
            assert "nvidia_vgpu_type_used_instances" in get(port)
            threads = psutil.Process(process.pid).num_threads()
            assert threads < 32, threads  # the idle ones hold no thread
            assert "nvidia_vgpu_type_used_instances" in get(port)
        finally:
            for connection in idle:
                connection.close()


def test_a_scrape_that_hangs_on_nvml_never_holds_the_next_one(host):
    """issue 34 item 1: the NVML session is waited for only so long; the rest is answered."""
    import threading

    from prometheus_client import generate_latest

    import vgpu_exporter
    from vgpu import nvml

    release = threading.Event()

    class Hanging:
        def read(self, *_addresses):
            release.wait()
            return nvml.Reading(present=False)

    shared = vgpu_exporter.SharedSession(Hanging(), wait=0.1)
    first = threading.Thread(target=lambda: generate_latest(vgpu_exporter.registry(shared)))
    first.start()
    try:
        deadline = time.monotonic() + 60
        while not shared._lock.locked():
            assert first.is_alive() and time.monotonic() < deadline
            time.sleep(0.01)
        text = generate_latest(vgpu_exporter.registry(shared)).decode()
    finally:
        release.set()
        first.join()
    assert 'nvidia_vgpu_exporter_source_up{source="nvml"} 0.0' in text
    assert 'nvidia_vgpu_exporter_source_up{source="pci"} 1.0' in text


def test_a_port_that_is_taken_stops_the_exporter_with_a_reason(root):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run([sys.executable, str(REPO / "src/vgpu_exporter.py"), "--port",
                               str(port)], env=exporter_env(root), capture_output=True, text=True,
                              timeout=60)
    assert done.returncode == 2
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr


# -- the unit ----------------------------------------------------------------------------------

def test_the_unit_is_a_sandboxed_simple_service_on_the_charms_own_python():
    lines = unit_lines(exporter.render(exporter.DEFAULT_PORT))
    assert lines["Type"] == ["simple"]
    assert lines["ExecStart"] == [f"{sys.executable} {REPO / 'src/vgpu_exporter.py'} --port 10230"]
    assert lines["Environment"] == [f"PYTHONPATH={REPO / 'venv'} PYTHONDONTWRITEBYTECODE=1"]
    for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"),
                       ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                       ("CapabilityBoundingSet", "CAP_DAC_READ_SEARCH"),
                       ("RestrictAddressFamilies", "AF_INET AF_UNIX"), ("IPAddressDeny", "any"),
                       ("IPAddressAllow", "localhost"), ("Restart", "on-failure")):
        assert lines[key] == [value], key
    assert "ReadWritePaths" not in lines  # it writes nothing


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze here")
def test_systemd_finds_nothing_wrong_in_the_unit(tmp_path):
    unit = tmp_path / exporter.UNIT
    unit.write_text(exporter.render(exporter.DEFAULT_PORT))
    done = subprocess.run(["systemd-analyze", "verify", "--man=no", str(unit)],
                          capture_output=True, text=True)
    problems = [line for line in (done.stdout + done.stderr).splitlines()
                if exporter.UNIT in line or "Unknown" in line]
    assert not problems, done.stdout + done.stderr


@pytest.mark.parametrize("value, why", [
    (True, "is not a port number"), ("10230", "is not a port number"), (None, "is not a port"),
    (80, "out of range"), (70000, "out of range"), (9400, "dcgm-exporter"),
    (10200, "hardware-observer's hardware-exporter"), (10201, "smartctl-exporter"),
    (9100, "node-exporter"), (4317, "opentelemetry-collector")])
def test_a_port_the_exporter_must_not_take_is_refused_naming_why(value, why):
    with pytest.raises(ExporterError, match=why):
        exporter.port(value)


def test_the_default_port_clashes_with_no_neighbour():
    assert exporter.port(exporter.DEFAULT_PORT) == 10230
    assert exporter.DEFAULT_PORT not in exporter.NEIGHBOURS


TCP = """  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:27D8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:24B8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1
   2: 0A00000B:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 3 1
   3: 0100007F:2906 0100007F:0016 01 00000000:00000000 00:00000000 00000000     0        0 4 1
"""
TCP6 = """  sl  local_address                         remote_address                        st
   0: 00000000000000000000000000000000:2EE0 00000000000000000000000000000000:0000 0A
"""


def proc_net(root, tcp=TCP, tcp6=TCP6):
    (root / "proc/net").mkdir(parents=True, exist_ok=True)
    (root / "proc/net/tcp").write_text(tcp)
    (root / "proc/net/tcp6").write_text(tcp6)


def test_ports_listened_on_locally_are_read_from_the_kernels_tables(root):
    proc_net(root)
    # 10200 on every address, 9400 on 127.0.0.1, 12000 on [::]; not 8080 on another address,
    # nor a connection's port.
    assert exporter.listening() == {10200, 9400, 12000}


def test_ensure_installs_enables_and_starts_the_unit_once(root, tools):
    assert exporter.ensure(exporter.DEFAULT_PORT)
    assert (root / exporter.UNIT_FILE).read_text() == exporter.render(exporter.DEFAULT_PORT)
    assert tools.calls() == ["systemctl daemon-reload", f"systemctl enable {exporter.UNIT}",
                             f"systemctl restart {exporter.UNIT}"]
    assert not exporter.ensure(exporter.DEFAULT_PORT)  # nothing changed: nothing done
    assert len(tools.calls()) == 3
    assert exporter.ensure(exporter.DEFAULT_PORT, restart=True)  # the charm's code changed
    assert tools.calls()[3:] == [f"systemctl enable {exporter.UNIT}",
                                 f"systemctl restart {exporter.UNIT}"]
    assert exporter.installed_port() == exporter.DEFAULT_PORT


def test_another_port_rewrites_and_restarts_it(root, tools):
    exporter.ensure(exporter.DEFAULT_PORT)
    proc_net(root, tcp=TCP + "   4: 0100007F:27F6 00000000:0000 0A 0 0 0 0 0 5 1\n")  # itself
    exporter.ensure(12001)
    assert exporter.installed_port() == 12001
    assert tools.calls()[-3:] == ["systemctl daemon-reload", f"systemctl enable {exporter.UNIT}",
                                  f"systemctl restart {exporter.UNIT}"]


def test_a_port_another_process_listens_on_is_refused_and_nothing_changes(root, tools):
    exporter.ensure(exporter.DEFAULT_PORT)
    proc_net(root, tcp=TCP + "   4: 0100007F:2EE1 00000000:0000 0A 0 0 0 0 0 5 1\n")
    with pytest.raises(ExporterError, match="another process listens on it"):
        exporter.ensure(12001)
    assert exporter.installed_port() == exporter.DEFAULT_PORT and len(tools.calls()) == 3
    # Its own port, which it listens on itself, is no clash.
    proc_net(root, tcp=TCP + "   4: 0100007F:27F6 00000000:0000 0A 0 0 0 0 0 5 1\n")
    assert exporter.ensure(exporter.DEFAULT_PORT, restart=True)


def test_a_unit_the_operator_masked_is_left_alone(root, tools):
    runtime = root / exporter.RUNTIME_UNIT_FILE
    runtime.parent.mkdir(parents=True)
    runtime.symlink_to(os.devnull)
    assert not exporter.ensure(exporter.DEFAULT_PORT)
    assert tools.calls() == [] and not (root / exporter.UNIT_FILE).exists()


def test_a_persistent_mask_is_never_replaced_nor_removed(root, tools):
    """``systemctl mask`` links /etc/systemd/system/<unit> to /dev/null: where the unit goes."""
    exporter.ensure(exporter.DEFAULT_PORT)
    unit = root / exporter.UNIT_FILE
    unit.unlink()
    unit.symlink_to(os.devnull)
    calls = len(tools.calls())
    assert exporter.masked()
    assert not exporter.ensure(exporter.DEFAULT_PORT, restart=True)
    assert not exporter.remove()
    assert os.readlink(unit) == os.devnull and tools.calls()[calls:] == []
    assert exporter.scrape_configs("h") == []


def test_a_start_that_fails_is_said(root, tools):
    tools.fail("restart", exporter.UNIT)
    with pytest.raises(ExporterError, match="the metrics exporter did not start"):
        exporter.ensure(exporter.DEFAULT_PORT)


def test_remove_stops_disables_and_deletes_the_unit(root, tools):
    assert not exporter.remove()
    assert tools.calls() == []
    exporter.ensure(exporter.DEFAULT_PORT)
    assert exporter.remove()
    assert not (root / exporter.UNIT_FILE).exists()
    assert tools.calls()[3:] == [f"systemctl stop {exporter.UNIT}",
                                 f"systemctl disable {exporter.UNIT}", "systemctl daemon-reload"]


def test_sync_says_why_and_never_raises(root, tools):
    assert exporter.sync(True, 9400).startswith("metrics-port 9400 is the port of dcgm-exporter")
    assert not (root / exporter.UNIT_FILE).exists()
    assert exporter.sync(True, 10230) == ""
    tools.fail("stop", exporter.UNIT)
    assert exporter.sync(False).startswith(f"cannot remove {exporter.UNIT}")


def test_the_collector_scrapes_the_port_the_exporter_serves(root, tools):
    assert exporter.scrape_configs("gpu-1.example") == []  # none installed: nothing to scrape
    exporter.ensure(exporter.DEFAULT_PORT)
    assert exporter.scrape_configs("gpu-1.example") == [{
        "job_name": "nvidia_vgpu_exporter", "metrics_path": "/metrics",
        "static_configs": [{"targets": ["127.0.0.1:10230"], "labels": {"instance": "gpu-1.example"}}]}]
    exporter.ensure(12001)
    exporter.sync(True, 9400)  # refused: 12001 stays in force
    assert exporter.scrape_configs("h")[0]["static_configs"][0]["targets"] == ["127.0.0.1:12001"]
