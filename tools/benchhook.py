"""One hook in a fresh Python process, as Juju runs it; tools/bench.py starts it.

    python tools/benchhook.py SPEC.pickle SPAWN_TIME [count|time+count]

The process imports the charm module (``charm`` from the spec's source
directory: the real charm or the bare one), then ``ops.testing`` (not
counted: under Juju, ops.main and real hook tools take its place), builds
the State and runs one event with ``Context.run``. It prints one JSON line:

* ``start``: ms from the parent's spawn (``time.perf_counter`` is
  CLOCK_MONOTONIC, shared by both processes) to this file's first line;
* ``import``: ms to import the charm module (ops included);
* ``run``: ms for Context(...) and Context.run: metadata, framework set-up,
  the handlers, collect-status, commit;
* ``testing``: ms to import ops.testing (reported, not counted);
* ``cpu_start``, ``cpu_import``, ``cpu_run``: the same in CPU time (user +
  system), the programs the run started included: far steadier than wall
  time on a shared machine;
* ``maxrss``: the process's peak resident memory (VmHWM), KiB.

With ``count`` the run is instrumented instead (its times are not used);
with ``time+count`` it is timed, then run again, warm, and counted:
processes started (subprocess, os.system, os.fork, os.posix_spawn*), Juju
hook-tool calls (ops.testing's backend methods, each a process under real
Juju), host files opened, directories listed, links read and paths stat'ed
under VGPU_HOST_ROOT, and the tracemalloc peak of the run.
"""

import time

T0 = time.perf_counter()
C0 = time.process_time()  # CPU this process used to get here: interpreter start-up

import json  # noqa: E402
import os  # noqa: E402
import pickle  # noqa: E402
import sys  # noqa: E402

# ops' _ModelBackend method -> the hook tool it runs under real Juju.
HOOK_TOOLS = {
    "config_get": "config-get", "relation_ids": "relation-ids", "relation_list": "relation-list",
    "relation_get": "relation-get", "relation_set": "relation-set",
    "relation_model_get": "relation-model-get",
    "status_get": "status-get", "status_set": "status-set", "resource_get": "resource-get",
    "juju_log": "juju-log", "is_leader": "is-leader", "action_get": "action-get",
    "action_set": "action-set", "action_fail": "action-fail", "action_log": "action-log",
    "application_version_set": "application-version-set", "network_get": "network-get",
    "planned_units": "goal-state", "opened_ports": "opened-ports", "open_port": "open-port",
    "close_port": "close-port", "credential_get": "credential-get", "storage_list": "storage-list",
    "storage_get": "storage-get", "storage_add": "storage-add", "add_metrics": "add-metric",
    "secret_get": "secret-get", "secret_set": "secret-set", "secret_add": "secret-add",
    "secret_info_get": "secret-info-get", "secret_remove": "secret-remove",
}


class Counters:
    """Counts what the hook asks of the host and of Juju, once armed."""

    def __init__(self, host_root: str):
        self.root = os.path.realpath(host_root) + os.sep
        self.armed = self.in_popen = False
        self.files = self.dirs = self.links = self.stats = self.other_files = 0
        self.processes = {}
        self.tools = {}

    def _host(self, path) -> bool:
        try:
            text = os.fspath(path)
        except TypeError:
            return False
        if isinstance(text, bytes):
            text = os.fsdecode(text)
        return os.path.abspath(text).startswith(self.root)

    def install(self) -> None:
        """Count file opens, directory and link reads, stats and processes from now on."""
        self._count_opens()
        self._count_processes()

    def _count_opens(self) -> None:
        import builtins
        import io

        counters = self
        real_open = builtins.open

        def counted_open(file, *args, **kwargs):
            if counters.armed and not isinstance(file, int):
                if counters._host(file):
                    counters.files += 1
                else:
                    counters.other_files += 1
            return real_open(file, *args, **kwargs)

        builtins.open = io.open = counted_open

        def wrap(module, name, attr):
            real = getattr(module, name)

            def counted(path=".", *args, **kwargs):
                if counters.armed and not isinstance(path, int) and counters._host(path):
                    setattr(counters, attr, getattr(counters, attr) + 1)
                return real(path, *args, **kwargs)

            setattr(module, name, counted)

        wrap(os, "open", "files")  # the charm reads host files with os.open too
        wrap(os, "listdir", "dirs")
        wrap(os, "scandir", "dirs")
        wrap(os, "readlink", "links")
        wrap(os, "stat", "stats")
        wrap(os, "lstat", "stats")

    def _count_processes(self) -> None:
        import subprocess

        counters = self

        def spawned(what) -> None:
            if counters.armed:
                counters.processes[what] = counters.processes.get(what, 0) + 1

        real_child = subprocess.Popen._execute_child

        def execute_child(popen, args, executable, *rest, **kwargs):
            argv = [args] if isinstance(args, (str, bytes, os.PathLike)) else list(args)
            spawned(os.path.basename(os.fsdecode(executable or argv[0])))
            counters.in_popen = True
            try:
                return real_child(popen, args, executable, *rest, **kwargs)
            finally:
                counters.in_popen = False

        subprocess.Popen._execute_child = execute_child
        for name in ("system", "fork", "posix_spawn", "posix_spawnp"):
            real = getattr(os, name, None)
            if real is None:
                continue

            def counted(*args, _real=real, _name=name, **kwargs):
                if not counters.in_popen:
                    spawned(f"os.{_name}")
                return _real(*args, **kwargs)

            setattr(os, name, counted)

    def hook_tools(self, backend_class) -> None:
        counters = self
        for method, tool in HOOK_TOOLS.items():
            real = getattr(backend_class, method, None)
            if real is None:
                continue

            def counted(*args, _real=real, _tool=tool, **kwargs):
                if counters.armed:
                    counters.tools[_tool] = counters.tools.get(_tool, 0) + 1
                return _real(*args, **kwargs)

            setattr(backend_class, method, counted)


def peak_rss_kib() -> int:
    """VmHWM: this process's peak resident memory (ru_maxrss would include the parent's)."""
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def build_state(testing, data: dict):
    relations = [testing.SubordinateRelation(
        "nova-vgpu", remote_app_name="nova-compute", local_unit_data=data["local_unit_data"])]
    relations.append(testing.SubordinateRelation("juju-info", remote_app_name="nova-compute"))
    if "fleet_data" in data:  # the fleet peer relation, with the record the unit published
        relations.append(testing.PeerRelation("fleet", local_unit_data=data["fleet_data"]))
    if data.get("cos_agent"):  # related to opentelemetry-collector: the exporter runs
        relations.append(testing.Relation("cos-agent", remote_app_name="opentelemetry-collector"))
    return testing.State(
        config=data["config"],
        relations=relations,
        resources={testing.Resource(name="nvidia-vgpu-software", path=data["resource"])},
        stored_states={testing.StoredState(owner_path=owner, name=name, content=content)
                       for owner, name, content in data["stored"]},
    )


def main() -> int:
    spec_path, spawn = sys.argv[1], float(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "time"
    counting = mode == "count"
    with open(spec_path, "rb") as handle:
        spec = pickle.load(handle)
    sys.path.insert(0, spec["src"])
    counters = Counters(os.environ.get("VGPU_HOST_ROOT") or "/")
    if counting:
        counters.install()
    t1, c1 = time.perf_counter(), time.process_time()
    import charm

    t2, c2 = time.perf_counter(), time.process_time()
    from ops import testing

    t3, c3 = time.perf_counter(), time.process_time()
    if counting:
        from scenario import mocking

        counters.hook_tools(mocking._MockModelBackend)
    state = build_state(testing, spec["state"])
    event_name = spec["event"]
    if counting:
        import tracemalloc

        tracemalloc.start()
        counters.armed = True
    import resource

    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    t4, c4 = time.perf_counter(), time.process_time()
    ctx = testing.Context(charm.NovaComputeNvidiaVgpuCharm)
    if event_name.startswith("action:"):
        event = ctx.on.action(event_name[len("action:"):])
    else:
        event = getattr(ctx.on, event_name)()
    out = ctx.run(event, state)
    t5, c5 = time.perf_counter(), time.process_time()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    programs = (after.ru_utime + after.ru_stime) - (children.ru_utime + children.ru_stime)
    result = {"start": (T0 - spawn) * 1000, "import": (t2 - t1) * 1000, "testing": (t3 - t2) * 1000,
              "run": (t5 - t4) * 1000, "status": f"{out.unit_status.name}: {out.unit_status.message}",
              "cpu_start": C0 * 1000, "cpu_import": (c2 - c1) * 1000, "cpu_testing": (c3 - c2) * 1000,
              "cpu_run": (c5 - c4 + programs) * 1000}
    if mode == "time+count":
        # Counted again, warm: what a hook reads and starts does not depend on it.
        counters.install()
        from scenario import mocking

        counters.hook_tools(mocking._MockModelBackend)
        counters.armed = True
        again = testing.Context(charm.NovaComputeNvidiaVgpuCharm)
        again.run(getattr(again.on, event_name)() if ":" not in event_name
                  else again.on.action(event_name.split(":", 1)[1]), state)
        counting = True
    if counting:
        counters.armed = False
        if mode == "count":
            result["peak_kib"] = tracemalloc.get_traced_memory()[1] / 1024
            tracemalloc.stop()
        result.update(files=counters.files, dirs=counters.dirs, links=counters.links,
                      stats=counters.stats, other_files=counters.other_files,
                      processes=counters.processes, tools=counters.tools)
    result["maxrss"] = peak_rss_kib()
    # The test fixture's kernel models are audit hooks on every open (unit_tests/fakehost.py):
    # a hook measured with them loaded would pay for the fixture. bench.py refuses such a run.
    result["fixture"] = sorted(m for m in sys.modules if m.split(".")[0] == "unit_tests")
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
