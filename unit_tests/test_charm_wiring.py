"""Issue 43, item 2: src/charm.py only wires events; each action's handler lives in a helper beside it.

Read from the source itself (``ast``): what ``framework.observe`` is given in each
top-level module of ``src/``, the handlers ``src/charm.py`` defines, and what
each module imports. The actions are those ``actions.yaml`` declares.
"""

import ast
from pathlib import Path
from typing import Dict, List, Set, Tuple

import yaml

REPO = Path(__file__).resolve().parent.parent
SRC = REPO / "src"
CHARM = SRC / "charm.py"
MAX_CHARM_LINES = 450  # the house's bound for the event wiring (issue 43)


def actions() -> List[str]:
    return sorted(yaml.safe_load((REPO / "actions.yaml").read_text(encoding="utf-8")))


def snake(action: str) -> str:
    return action.replace("-", "_")


def helpers() -> List[Path]:
    """The ops-facing modules beside charm.py (the entry points of other programs aside)."""
    return sorted(p for p in SRC.glob("*.py") if p != CHARM)


def observed(tree: ast.AST) -> List[Tuple[str, str]]:
    """``(event attribute, handler name)`` for each ``observe`` call, loops over tuples unrolled."""
    loops: Dict[str, List[ast.expr]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.For) and isinstance(node.target, ast.Name)
                and isinstance(node.iter, ast.Tuple)):
            loops[node.target.id] = list(node.iter.elts)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "observe" and len(node.args) == 2):
            continue
        event, handler = node.args
        if not isinstance(handler, ast.Attribute):
            continue
        events = loops.get(event.id, []) if isinstance(event, ast.Name) else [event]
        found += [(e.attr, handler.attr) for e in events if isinstance(e, ast.Attribute)]
    return found


def dedicated_handlers(path: Path) -> Dict[str, Set[str]]:
    """Action event -> the handlers in ``path`` observing that event and nothing else."""
    pairs = observed(ast.parse(path.read_text(encoding="utf-8")))
    events_of: Dict[str, Set[str]] = {}
    for event, handler in pairs:
        events_of.setdefault(handler, set()).add(event)
    out: Dict[str, Set[str]] = {}
    for handler, events in events_of.items():
        if len(events) == 1 and next(iter(events)).endswith("_action"):
            out.setdefault(next(iter(events)), set()).add(handler)
    return out


def test_charm_py_is_within_the_bound_for_event_wiring():
    lines = len(CHARM.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_CHARM_LINES, f"src/charm.py has {lines} lines (at most {MAX_CHARM_LINES})"


def test_charm_py_defines_and_observes_no_action_handler():
    tree = ast.parse(CHARM.read_text(encoding="utf-8"))
    defined = {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    assert sorted(defined & {f"_on_{snake(a)}" for a in actions()}) == []
    action_events = {f"{snake(a)}_action" for a in actions()}
    assert [(e, h) for e, h in observed(tree) if e in action_events] == []


def test_each_action_has_one_dedicated_handler_in_a_helper_beside_charm_py():
    where: Dict[str, List[str]] = {}
    for path in helpers():
        for event, handlers in dedicated_handlers(path).items():
            where.setdefault(event, []).extend(f"{path.name}:{h}" for h in sorted(handlers))
    not_one = {a: where.get(f"{snake(a)}_action", []) for a in actions()
               if len(where.get(f"{snake(a)}_action", [])) != 1}
    assert not_one == {}

def imports(path: Path) -> Set[str]:
    """Top-level names of the modules ``path`` imports, at any level (function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
    return names


def test_no_helper_imports_charm_py():
    """charm.py imports its helpers; none imports it back (no circle), at any level."""
    assert [p.name for p in helpers() if "charm" in imports(p)] == []
    wired = {p.stem for p in helpers()} & imports(CHARM)
    assert {"fleet", "previewing", "monitoring"} <= wired
