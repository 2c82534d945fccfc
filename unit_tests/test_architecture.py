"""The house's rules read from the source itself: no import circle, no module over 800 lines.

Every ``src/*.py`` and ``src/vgpu/*.py`` is parsed with ``ast``; every import counts,
at module level or inside a function (``from . import x``, ``from .x import y``,
``from vgpu import x``, ``import vgpu.x``), because a function-level import ties a
circle just as well: it only hides it until the function runs.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, List, Optional, Set

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
MAX_LINES = 800


def _modules() -> Dict[str, Path]:
    """Module name (``charm``, ``vgpu.mig``) -> its file."""
    found = {path.stem: path for path in sorted(SRC.glob("*.py"))}
    for path in sorted((SRC / "vgpu").glob("*.py")):
        found["vgpu" if path.stem == "__init__" else f"vgpu.{path.stem}"] = path
    return found


def _package(module: str, path: Path) -> str:
    """The package a relative import in ``module`` starts from."""
    if path.name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def _resolve(base: str, level: int, package: str) -> str:
    """``from ..x`` in ``package``: the absolute module name."""
    parts = package.split(".") if package else []
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    if base:
        parts.append(base)
    return ".".join(parts)


def imports(module: str, path: Path, known: Set[str]) -> Set[str]:
    """The modules of ``known`` that ``module`` imports, at any level of its source."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _package(module, path)
    names: Set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                names.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = _resolve(base, node.level, package)
            names.add(base)
            for alias in node.names:  # from . import x, from vgpu import x: x may be a module
                names.add(f"{base}.{alias.name}" if base else alias.name)
    found = set()
    for name in names:
        while name and name not in known:  # import vgpu.mig.x -> vgpu.mig
            name = name.rpartition(".")[0]
        if name and name != module:
            found.add(name)
    return found


def graph() -> Dict[str, Set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: imports(name, path, known) for name, path in modules.items()}


def find_cycle(edges: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One import circle as ``[a, b, ..., a]``, or None (depth-first, colours)."""
    colour: Dict[str, int] = {}  # 1: on the path, 2: done
    path: List[str] = []

    def visit(node: str) -> Optional[List[str]]:
        colour[node] = 1
        path.append(node)
        for target in sorted(edges.get(node, ())):
            if colour.get(target) == 1:
                return path[path.index(target):] + [target]
            if target not in colour:
                found = visit(target)
                if found:
                    return found
        path.pop()
        colour[node] = 2
        return None

    for node in sorted(edges):
        if node not in colour:
            found = visit(node)
            if found:
                return found
    return None


# The package itself (vgpu/__init__.py) is imported by every ``from . import x``; it
# holds only constants and imports no module of its own package, which the graph checks.


def test_no_import_circle():
    cycle = find_cycle(graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or ())


@pytest.mark.parametrize("path", sorted(_modules().values()), ids=lambda p: str(p.relative_to(SRC)))
def test_no_module_over_800_lines(path):
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(SRC)} has {lines} lines (most {MAX_LINES})"


# The checks above are only as good as the graph: these pin that it sees each form.


def test_graph_sees_every_form_of_import(tmp_path):
    package = tmp_path / "vgpu"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from . import b\n")
    (package / "b.py").write_text("from .c import thing\n")
    (package / "c.py").write_text("def g():\n    from vgpu import a\n")
    (package / "d.py").write_text("import vgpu.a\n")
    known = {"vgpu", "vgpu.a", "vgpu.b", "vgpu.c", "vgpu.d"}
    edges = {name: imports(name, package / (name.split(".")[-1] + ".py"), known)
             for name in known - {"vgpu"}}
    assert edges["vgpu.a"] == {"vgpu", "vgpu.b"}
    assert edges["vgpu.b"] == {"vgpu.c"}
    assert edges["vgpu.c"] == {"vgpu", "vgpu.a"}
    assert edges["vgpu.d"] == {"vgpu.a"}
    assert find_cycle(edges) == ["vgpu.a", "vgpu.b", "vgpu.c", "vgpu.a"]
    del edges["vgpu.c"]
    assert find_cycle(edges) is None


def test_graph_reads_the_real_source():
    edges = graph()
    assert "vgpu.profiles" in edges["vgpu.pci"]  # from . import ..., profiles, ...
    assert "vgpu.reconcile" in edges["charm"]  # from vgpu import ... (a src/*.py module)
