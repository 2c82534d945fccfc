"""unit_tests/MUTATION.md lists equivalent mutants of code that exists, each with its reason.

``tools/mutation.py summary`` leaves the listed names out of each module's
kill rate, so a name must be one mutmut can give: ``<module>.x_<function>``
or ``<module>.xǁ<Class>ǁ<method>``, then ``__mutmut_<n>``, of a function that
is in src/ today.
"""

import ast
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _tool():
    spec = importlib.util.spec_from_file_location("mutation_tool", ROOT / "tools" / "mutation.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _functions(module: str) -> set:
    """``function`` and ``Class.method`` names defined in src/<module>.py."""
    tree = ast.parse((ROOT / "src" / (module.replace(".", "/") + ".py")).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(f"{node.name}.{item.name}" for item in node.body
                         if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)))
    return names


LISTED = sorted(_tool().equivalents())


def test_the_list_names_equivalents():
    assert len(LISTED) >= 20


@pytest.mark.parametrize("name", LISTED)
def test_each_listed_mutant_is_of_a_function_in_src(name):
    head, _, number = name.rpartition("__mutmut_")
    assert number.isdigit()
    if "ǁ" in head:
        module, cls, method = head.split("ǁ")
        module, function = module.removesuffix(".x"), f"{cls}.{method}"
    else:
        module, _, function = head.partition(".x_")
    assert function in _functions(module), name


def test_each_listed_mutant_is_in_a_bullet_that_gives_a_reason():
    text = (ROOT / "unit_tests" / "MUTATION.md").read_text()
    bullets, current = [], None
    for line in text.splitlines():
        if line.startswith("- "):
            current = [line]
            bullets.append(current)
        elif line.startswith("  ") and current is not None:
            current.append(line.strip())
        else:
            current = None
    for name in LISTED:
        (bullet,) = [" ".join(b) for b in bullets if f"`{name}`" in " ".join(b)]
        reason = bullet.rsplit("): ", 1)[-1]
        assert reason != bullet and len(reason) > 20, bullet


@pytest.mark.parametrize("name, module", [
    ("vgpu.xid.x_read__mutmut_13", "vgpu.xid"),  # a module whose name starts with x
    ("vgpu.serve.xǁServerǁ_work__mutmut_21", "vgpu.serve"),
    ("charm.xǁNovaComputeNvidiaVgpuCharmǁ_on_pause__mutmut_26", "charm"),
    ("vgpu.releases.x_from_version__mutmut_8", "vgpu.releases"),
])
def test_summary_counts_each_mutant_under_its_own_module(name, module):
    assert _tool().module_of(name) == module
