"""A unit as Juju runs it: ``./dispatch`` in the charm directory, with Juju's environment and hook tools.

:class:`Unit` runs the packed charm's ``dispatch`` as a subprocess for each
hook or action, with the variables a Juju 3 unit agent sets (``JUJU_DISPATCH_PATH``,
``JUJU_UNIT_NAME``, ``JUJU_RELATION_ID``, ``JUJU_ACTION_UUID``...), in the
charm directory, and with stand-ins for Juju's hook tools first on ``PATH``.

The stand-ins are one small Python script (:data:`HOOK_TOOL`) linked under
each tool's name, as Juju links its tools to ``jujuc``. Each accepts exactly
the command lines that ops' ``hookcmds`` sends (``status-set
--application=False active -- <message>``, ``relation-set -r nova-vgpu:7
--file -``...) and refuses any other with exit 2 ("usage"), so that a call
Juju would not understand fails the hook. They answer, and keep what the
charm tells Juju, in JSON files under the unit's state directory, so that it
persists between dispatches as on a unit: configuration, relations and their
data, the unit's status and its history, the attached resource, action
parameters and results, and the charm's log. Every call is recorded in
``calls.jsonl`` with its exit status.
"""

import json
import os
import subprocess
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

import yaml

JUJU_VERSION = "3.6.8"
MODEL = "openstack"
MODEL_UUID = "8d5b3a30-1b7e-4b47-8a0b-6c1f9e0f3a51"

TOOLS = ("config-get", "status-set", "status-get", "is-leader", "relation-ids", "relation-list",
         "relation-get", "relation-set", "resource-get", "action-get", "action-set", "action-fail",
         "action-log", "juju-log", "application-version-set", "opened-ports", "goal-state")

HOOK_TOOL = r'''
"""Stand-in for a Juju hook tool (see unit_tests/fakejuju.py): the name it is run by says which."""
import json, os, re, sys

STATE = os.environ["FAKE_JUJU"]
TOOL = os.path.basename(sys.argv[0])
ARGS = sys.argv[1:]
UNIT = os.environ["JUJU_UNIT_NAME"]
APP = UNIT.split("/")[0]
STATUSES = ("active", "blocked", "maintenance", "waiting")
LEVELS = ("TRACE", "DEBUG", "INFO", "WARNING", "ERROR")
RESULT_KEY = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
RESERVED = ("stdout", "stdout-encoding", "stderr", "stderr-encoding")


class Refused(Exception):
    """Exit 2: a command line Juju's tool would not take (or ops never sends)."""


class Failed(Exception):
    """Exit 1: Juju understood the call and says no (not the leader, no such relation...)."""


def path(name):
    return os.path.join(STATE, name)


def load(name, default):
    try:
        with open(path(name), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return default


def save(name, value):
    tmp = path(name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
    os.replace(tmp, path(name))


def out(value):
    sys.stdout.write(json.dumps(value) + "\n")


def expect(ok):
    if not ok:
        raise Refused()


def relation(ref):
    """The relation that ``-r`` names: ``endpoint:id`` (ops' spelling) or ``id``."""
    relations = load("relations.json", {})
    endpoint, _, number = ref.rpartition(":")
    for key, rel in relations.items():
        if key.split(":")[1] == number and endpoint in ("", rel["endpoint"]):
            return key, rel
    raise Failed(f'invalid value "{ref}" for option -r: relation not found')


def hook_relation():
    ref = os.environ.get("JUJU_RELATION_ID")
    if not ref:
        raise Failed("no relation id specified")
    return relation(ref)


def action():
    uuid = os.environ.get("JUJU_ACTION_UUID")
    if not uuid:
        raise Failed("not running an action")
    return "action-" + uuid + ".json", load("action-" + uuid + ".json", None)


def config_get():
    expect(ARGS == ["--format=json"])
    out(load("config.json", {}))


def status_set():
    expect(len(ARGS) in (2, 4) and ARGS[0] in ("--application=False", "--application=True"))
    expect(ARGS[1] in STATUSES and (len(ARGS) == 2 or ARGS[2] == "--"))
    app = ARGS[0] == "--application=True"
    if app and not load("unit.json", {}).get("leader"):
        raise Failed("this unit is not the leader")
    entry = {"status": ARGS[1], "message": ARGS[3] if len(ARGS) == 4 else "",
             "hook": os.environ.get("JUJU_DISPATCH_PATH", "")}
    statuses = load("status.json", {})
    statuses["application" if app else "unit"] = entry
    save("status.json", statuses)
    with open(path("status-history.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"application": app, **entry}) + "\n")


def status_get():
    expect(ARGS[:2] == ["--include-data", "--format=json"] and len(ARGS) == 3)
    expect(ARGS[2] in ("--application=false", "--application=true"))
    statuses = load("status.json", {})
    if ARGS[2] == "--application=true":
        if not load("unit.json", {}).get("leader"):
            raise Failed("finding application status: this unit is not the leader")
        mine = statuses.get("application", {"status": "unknown", "message": ""})
        out({"application-status": {"status": mine["status"], "message": mine["message"],
                                    "status-data": {}}, "units": {}})
        return
    mine = statuses.get("unit", {"status": "maintenance", "message": ""})
    out({"status": mine["status"], "message": mine["message"], "status-data": {}})


def is_leader():
    expect(ARGS == ["--format=json"])
    out(bool(load("unit.json", {}).get("leader")))


def relation_ids():
    expect(len(ARGS) == 2 and ARGS[1] == "--format=json")
    endpoints = load("unit.json", {})["endpoints"]
    if ARGS[0] not in endpoints:
        raise Failed(f'invalid value "{ARGS[0]}" for option -r: unknown endpoint')
    out([key for key, rel in load("relations.json", {}).items() if rel["endpoint"] == ARGS[0]])


def relation_list():
    args = list(ARGS)
    expect(args[:1] == ["--format=json"])
    app = "--app" in args
    if app:
        args.remove("--app")
    expect(len(args) == 3 and args[1] == "-r")
    _key, rel = relation(args[2])
    out(rel["app"] if app else rel["units"])


def relation_get():
    args = list(ARGS)
    expect(args[:1] == ["--format=json"])
    del args[0]
    if args[:1] == ["-r"]:
        expect(len(args) >= 2)
        _key, rel = relation(args[1])
        del args[:2]
    else:
        _key, rel = hook_relation()
    app = args[:1] == ["--app"]
    if app:
        del args[0]
    expect(len(args) == 2 and args[0] == "-")
    member = args[1]
    if app:
        expect("/" not in member)
        if member == APP and not load("unit.json", {}).get("leader"):
            raise Failed("permission denied")
        expect(member in (APP, rel["app"]))
    else:
        expect(member == UNIT or member in rel["units"] or member in rel.get("departed", []))
    out(rel["data"].get(member, {}))


def relation_set():
    args = list(ARGS)
    if args[:1] == ["-r"]:
        expect(len(args) >= 2)
        key, rel = relation(args[1])
        del args[:2]
    else:
        key, rel = hook_relation()
    app = args[:1] == ["--app"]
    if app:
        del args[0]
    expect(args == ["--file", "-"])
    if app and not load("unit.json", {}).get("leader"):
        raise Failed("cannot write relation settings: this unit is not the leader")
    import yaml  # Juju reads the file as YAML: a map of strings (JSON is YAML)
    settings = yaml.safe_load(sys.stdin.read())
    if not isinstance(settings, dict) or not all(
            isinstance(k, str) and (v is None or isinstance(v, str)) for k, v in settings.items()):
        raise Failed("expected a map of strings")
    relations = load("relations.json", {})
    data = relations[key]["data"].setdefault(APP if app else UNIT, {})
    for k, v in settings.items():
        if v:
            data[k] = v
        else:
            data.pop(k, None)  # Juju deletes a key set to nothing
    save("relations.json", relations)


def resource_get():
    expect(len(ARGS) == 1)
    resources = load("resources.json", {})
    if ARGS[0] not in load("unit.json", {})["resources"]:
        raise Failed(f'resource "{ARGS[0]}" not found')
    if ARGS[0] not in resources:
        raise Failed(f"could not download resource: resource#{APP}/{ARGS[0]} not found")
    print(resources[ARGS[0]])


def action_get():
    expect(ARGS == ["--format=json"])
    _name, record = action()
    out(record["params"])


def action_set():
    expect(len(ARGS) >= 1 and all("=" in a for a in ARGS))
    name, record = action()
    for arg in ARGS:
        key, _, value = arg.partition("=")
        parts = key.split(".")
        if not all(RESULT_KEY.match(p) for p in parts) or key in RESERVED:
            raise Failed(f'key "{key}" must start and end with lowercase alphanumeric, '
                         "and contain only lowercase alphanumeric, hyphens and periods")
        where = record["results"]
        for part in parts[:-1]:
            where = where.setdefault(part, {})
            if not isinstance(where, dict):
                raise Failed(f'key "{key}" conflicts with a result set before')
        where[parts[-1]] = value
    save(name, record)


def action_fail():
    expect(ARGS == [] or (len(ARGS) == 2 and ARGS[0] == "--"))
    name, record = action()
    record["failed"] = ARGS[1] if ARGS else "action failed without reason given, check action for errors"
    save(name, record)


def action_log():
    expect(len(ARGS) == 2 and ARGS[0] == "--")
    name, record = action()
    record["log"].append(ARGS[1])
    save(name, record)


def juju_log():
    expect(len(ARGS) == 4 and ARGS[0] == "--log-level" and ARGS[1] in LEVELS and ARGS[2] == "--")
    with open(path("juju-log.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"level": ARGS[1], "message": ARGS[3],
                            "hook": os.environ.get("JUJU_DISPATCH_PATH", "")}) + "\n")


def application_version_set():
    expect(len(ARGS) == 2 and ARGS[0] == "--")
    unit = load("unit.json", {})
    unit["workload-version"] = ARGS[1]
    save("unit.json", unit)


def opened_ports():
    expect(ARGS == ["--format=json"])
    out([])  # a subordinate of nova-compute opens none


def goal_state():
    expect(ARGS == ["--format=json"])
    since = "2026-01-01T00:00:00Z"
    relations = {}
    for rel in load("relations.json", {}).values():
        goals = relations.setdefault(rel["endpoint"], {})
        for member in [rel["app"], *rel["units"]]:
            goals[member] = {"status": "joined", "since": since}
    out({"units": {UNIT: {"status": "active", "since": since}}, "relations": relations})


def main():
    handler = globals()[TOOL.replace("-", "_")]
    code, error = 0, ""
    try:
        handler()
    except Refused:
        code, error = 2, f"ERROR usage: {TOOL} does not take: {ARGS!r}"
    except Failed as e:
        code, error = 1, f"ERROR {e}"
    with open(path("calls.jsonl"), "a", encoding="utf-8") as f:
        f.write(json.dumps({"argv": [TOOL, *ARGS], "rc": code,
                            "hook": os.environ.get("JUJU_DISPATCH_PATH", "")}) + "\n")
    if error:
        print(error, file=sys.stderr)
    sys.exit(code)


main()
'''


@dataclass
class Dispatched:
    """One dispatch: its exit status, output and the hook-tool calls it made."""

    path: str
    returncode: int
    stdout: str
    stderr: str
    calls: List[dict]
    log: List[dict]

    def tools(self) -> List[str]:
        """The hook tools called, in order (``["juju-log", "config-get", ...]``)."""
        return [c["argv"][0] for c in self.calls]

    def statuses(self) -> List[tuple]:
        """``(status, message)`` of every unit ``status-set`` in this dispatch, in order."""
        return [(c["argv"][2], c["argv"][4] if len(c["argv"]) == 5 else "") for c in self.calls
                if c["argv"][0] == "status-set" and c["argv"][1] == "--application=False"]

    def explain(self) -> str:
        """What to print when the dispatch did not go as expected."""
        logged = "\n".join(f"  {e['level']}: {e['message']}" for e in self.log)
        refused = [c for c in self.calls if c["rc"]]
        return (f"{self.path}: exit {self.returncode}\nstderr:\n{self.stderr}\nlog:\n{logged}\n"
                f"failed hook tool calls: {refused}")


@dataclass
class Relation:
    endpoint: str
    number: int
    app: str
    units: List[str] = field(default_factory=list)

    @property
    def ref(self) -> str:
        return f"{self.endpoint}:{self.number}"


class Unit:
    """One unit of the packed charm: its charm directory, Juju's state of it, and a way to run hooks."""

    def __init__(self, charm_dir: Path, state: Path, name: str, principal: str,
                 extra_env: Mapping[str, str], path: Sequence[str]):
        self.charm_dir = charm_dir
        self.state = state
        self.name = name
        self.app = name.split("/")[0]
        self.principal = principal
        self.extra_env = dict(extra_env)
        self.bin = state / "bin"
        self.home = state / "home"
        self.path = [str(self.bin), *path]
        self._contexts = 0
        self._install_tools()
        metadata = yaml.safe_load((charm_dir / "metadata.yaml").read_text())
        endpoints = [*(metadata.get("provides") or {}), *(metadata.get("requires") or {}),
                     *(metadata.get("peers") or {})]
        self._save("unit.json", {"leader": True, "endpoints": endpoints,
                                 "resources": sorted(metadata.get("resources") or {})})
        self._save("relations.json", {})
        self.configure()

    # -- what Juju holds ------------------------------------------------------
    def _install_tools(self) -> None:
        self.bin.mkdir(parents=True)
        self.home.mkdir()
        script = self.bin / "jujuc.py"
        # -I: none of this machine's PYTHON* variables or user site; the tools need
        # only the standard library and PyYAML (relation-set reads YAML, as Juju does).
        script.write_text(f"#!{sys.executable} -I\n{HOOK_TOOL}")
        script.chmod(0o755)
        for tool in TOOLS:
            (self.bin / tool).symlink_to(script.name)

    def _load(self, name: str, default=None):
        try:
            return json.loads((self.state / name).read_text())
        except FileNotFoundError:
            return default

    def _save(self, name: str, value) -> None:
        (self.state / name).write_text(json.dumps(value, indent=1, sort_keys=True))

    def _lines(self, name: str) -> List[dict]:
        try:
            text = (self.state / name).read_text()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in text.splitlines()]

    def configure(self, **values) -> Dict[str, object]:
        """Set options (``juju config``); config-get answers with the defaults for the rest."""
        options = yaml.safe_load((self.charm_dir / "config.yaml").read_text())["options"]
        current = self._load("config.json", {}) or {o: spec["default"] for o, spec in options.items()
                                                    if "default" in spec}
        for key, value in values.items():
            option = key.replace("_", "-")
            if option not in options:
                raise KeyError(f"no option {option}")
            current[option] = value
        self._save("config.json", current)
        return current

    def attach(self, resource: str, source: Path) -> Path:
        """``juju attach-resource``: the file where resource-get gives it to the charm."""
        metadata = yaml.safe_load((self.charm_dir / "metadata.yaml").read_text())
        target = self.state / "resources" / resource / metadata["resources"][resource]["filename"]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(source).read_bytes())
        resources = self._load("resources.json", {})
        resources[resource] = str(target)
        self._save("resources.json", resources)
        return target

    def relate(self, endpoint: str, number: int, app: str) -> Relation:
        """A new relation with ``app``: Juju writes this unit's address settings into it."""
        relations = self._load("relations.json")
        ref = f"{endpoint}:{number}"
        relations[ref] = {"endpoint": endpoint, "app": app, "units": [], "data": {
            self.name: {"private-address": "10.5.0.21", "ingress-address": "10.5.0.21",
                        "egress-subnets": "10.5.0.21/32"}}}
        self._save("relations.json", relations)
        return Relation(endpoint, number, app)

    def left_by_another_charm(self, relation: Relation, data: Mapping[str, str]) -> None:
        """This unit's data as the charm it ran before left it (``juju refresh --switch``)."""
        relations = self._load("relations.json")
        relations[relation.ref]["data"][self.name].update(data)
        self._save("relations.json", relations)

    def join(self, relation: Relation, unit: str, data: Optional[Mapping[str, str]] = None) -> None:
        """A remote unit enters the relation (before its relation-joined hook)."""
        relations = self._load("relations.json")
        rel = relations[relation.ref]
        rel["units"].append(unit)
        rel["data"][unit] = dict(data or {})
        self._save("relations.json", relations)
        relation.units.append(unit)

    def depart(self, relation: Relation, unit: str) -> None:
        """A remote unit leaves the relation (before its relation-departed hook)."""
        relations = self._load("relations.json")
        rel = relations[relation.ref]
        rel["units"].remove(unit)
        rel.setdefault("departed", []).append(unit)
        self._save("relations.json", relations)
        relation.units.remove(unit)

    def forget(self, relation: Relation) -> None:
        """The relation is gone (after its relation-broken hook)."""
        relations = self._load("relations.json")
        del relations[relation.ref]
        self._save("relations.json", relations)

    def relation_data(self, relation: Relation, member: Optional[str] = None) -> Dict[str, str]:
        """What Juju holds for ``member`` (this unit by default) in ``relation``."""
        rel = self._load("relations.json")[relation.ref]
        return dict(rel["data"].get(member or self.name, {}))

    def status(self) -> tuple:
        """The unit's status as ``juju status`` shows it: ``(status, message)``."""
        unit = (self._load("status.json", {}) or {}).get("unit")
        return (unit["status"], unit["message"]) if unit else ("unknown", "")

    def calls(self) -> List[dict]:
        return self._lines("calls.jsonl")

    def log(self) -> List[dict]:
        return self._lines("juju-log.jsonl")

    # -- running the charm ----------------------------------------------------
    def environ(self, dispatch_path: str) -> Dict[str, str]:
        """The environment Juju gives a hook or action (``hooks/install``, ``actions/pause``)."""
        self._contexts += 1
        unit_tag = self.name.replace("/", "-")
        env = {
            "PATH": os.pathsep.join(self.path),
            "HOME": str(self.home),
            "LANG": "C.UTF-8",
            "CHARM_DIR": str(self.charm_dir),
            "JUJU_CHARM_DIR": str(self.charm_dir),
            "JUJU_CONTEXT_ID": f"{self.name}-{dispatch_path.split('/')[-1]}-{self._contexts}",
            "JUJU_DISPATCH_PATH": dispatch_path,
            "JUJU_MODEL_NAME": MODEL,
            "JUJU_MODEL_UUID": MODEL_UUID,
            "JUJU_UNIT_NAME": self.name,
            "JUJU_PRINCIPAL_UNIT": self.principal,
            "JUJU_MACHINE_ID": "0",
            "JUJU_VERSION": JUJU_VERSION,
            "JUJU_AGENT_SOCKET_ADDRESS": f"@/var/lib/juju/agents/unit-{unit_tag}/agent.socket",
            "JUJU_AGENT_SOCKET_NETWORK": "unix",
            "JUJU_API_ADDRESSES": "10.5.0.2:17070",
            "FAKE_JUJU": str(self.state),
        }
        env.update(self.extra_env)
        return env

    def _run(self, dispatch_path: str, env: Dict[str, str]) -> Dispatched:
        calls_before, log_before = len(self.calls()), len(self.log())
        done = subprocess.run([str(self.charm_dir / "dispatch")], cwd=self.charm_dir, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        return Dispatched(dispatch_path, done.returncode, done.stdout, done.stderr,
                          self.calls()[calls_before:], self.log()[log_before:])

    def hook(self, name: str, relation: Optional[Relation] = None,
             remote_unit: Optional[str] = None, departing: Optional[str] = None) -> Dispatched:
        """Run hook ``name`` (``install``, ``nova-vgpu-relation-joined``...) as Juju runs it."""
        env = self.environ(f"hooks/{name}")
        env["JUJU_HOOK_NAME"] = name
        if relation is not None:
            env.update({"JUJU_RELATION": relation.endpoint, "JUJU_RELATION_ID": relation.ref,
                        "JUJU_REMOTE_APP": relation.app})
            if remote_unit:
                env["JUJU_REMOTE_UNIT"] = remote_unit
            if departing:
                env["JUJU_DEPARTING_UNIT"] = departing
        return self._run(f"hooks/{name}", env)

    def exec(self, command: str) -> Dispatched:
        """``juju exec --unit <unit> -- <command>``: ``command`` run by bash in the charm directory.

        With the unit's hook context but no ``JUJU_DISPATCH_PATH``: Juju's uniter runs
        ``juju exec`` commands with the context's variables in the charm directory, and sets
        ``JUJU_DISPATCH_PATH`` only for hooks and actions (juju/juju
        worker/uniter/runner/runner.go: ``runCommandsWithTimeout``, ``WorkingDir:
        GetCharmDir()``; ``runCharmHookWithLocation`` appends ``JUJU_DISPATCH_PATH``).
        """
        env = self.environ("exec")
        del env["JUJU_DISPATCH_PATH"]
        calls_before, log_before = len(self.calls()), len(self.log())
        done = subprocess.run(["/bin/bash", "-c", command], cwd=self.charm_dir, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
        return Dispatched(command, done.returncode, done.stdout, done.stderr,
                          self.calls()[calls_before:], self.log()[log_before:])

    def action_environ(self, name: str, **params) -> Dict[str, str]:
        """A new run of action ``name``: its environment. Its params get actions.yaml's defaults."""
        spec = yaml.safe_load((self.charm_dir / "actions.yaml").read_text())[name]
        values = {k: p["default"] for k, p in (spec.get("params") or {}).items() if "default" in p}
        values.update({k.replace("_", "-"): v for k, v in params.items()})
        action_id = str(uuid.uuid4())
        self._save(f"action-{action_id}.json", {"params": values, "results": {}, "failed": None,
                                                 "log": []})
        env = self.environ(f"actions/{name}")
        env.update({"JUJU_ACTION_NAME": name, "JUJU_ACTION_UUID": action_id,
                    "JUJU_ACTION_TAG": f"action-{action_id}"})
        return env

    def action_record(self, env: Mapping[str, str]) -> dict:
        """What Juju holds of the action run ``env`` is for: params, results, failed, log."""
        return self._load(f"action-{env['JUJU_ACTION_UUID']}.json")

    def action(self, name: str, **params) -> "ActionRun":
        """``juju run <unit> <name> key=value...``: the dispatch, its results and failure message."""
        env = self.action_environ(name, **params)
        dispatched = self._run(f"actions/{name}", env)
        done = self.action_record(env)
        return ActionRun(dispatched, done["results"], done["failed"], done["log"])


@dataclass
class ActionRun:
    """An action's dispatch and what ``juju run`` shows of it."""

    dispatched: Dispatched
    results: dict
    failed: Optional[str]
    log: List[str]
