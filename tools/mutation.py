#!/usr/bin/env python3
"""mutmut with one module to mutate, or a fixed sample of every module.

``make mutation MODULE=src/vgpu/releases.py`` mutates one module;
``make mutation SAMPLE=8`` runs one mutant in eight of every module, always the
same ones (chosen by a hash of the mutant's name), which measures every
module's kill rate in a fraction of the time of a whole run.

mutmut reads its configuration from pyproject.toml's ``[tool.mutmut]`` only;
this wrapper sets ``only_mutate`` from the ``MODULE`` environment variable
(a glob such as ``src/vgpu/releases.py`` or ``src/vgpu/*``, or several separated by commas) and then runs
mutmut's own command line with the arguments given (``run``, ``results``,
``show <mutant>``...). Without MODULE every module under src/ is mutated.
With ``SAMPLE=N`` and ``run`` without mutant names, the mutants are generated
first and only the sampled ones without a result yet are run (``run <names>``
runs given mutants again). ``summary`` prints each module's kill rate among
the mutants not listed as equivalent in unit_tests/MUTATION.md.
"""

import os
import re
import subprocess
import sys
import zlib
from pathlib import Path


def unchecked_mutants() -> list:
    """Every mutant without a result, from ``mutmut results --all true`` (generated if needed)."""
    if not Path("mutants").is_dir():
        # `run` with a name that matches nothing generates the mutants and stops.
        subprocess.run([sys.executable, __file__, "run", "--max-children", "1", "generate-only.*"],
                       check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    listed = subprocess.run([sys.executable, __file__, "results", "--all", "true"],
                            check=True, capture_output=True, text=True).stdout
    return [line.split(": ")[0].strip() for line in listed.splitlines()
            if line.endswith(": not checked")]


def sample(names: list, every: int) -> list:
    """One name in ``every``, the same ones on every machine and run."""
    return [name for name in names if zlib.crc32(name.encode()) % every == 0]


EQUIVALENTS = Path(__file__).resolve().parent.parent / "unit_tests" / "MUTATION.md"


def equivalents() -> set:
    """Mutant names that unit_tests/MUTATION.md lists as equivalent (in backticks, with a reason).

    A name stops matching when its function changes (mutmut numbers the
    mutants again): the survivor then counts as a gap until it is judged again.
    """
    try:
        listed = EQUIVALENTS.read_text(encoding="utf-8")
    except FileNotFoundError:
        return set()
    return set(re.findall(r"`([\w.\u01c1]+__mutmut_\d+)`", listed))


def module_of(name: str) -> str:
    """The module of a mutant's name: ``vgpu.xid`` of ``vgpu.xid.x_read__mutmut_13``."""
    return re.split(r"\.x[_\u01c1]", name, maxsplit=1)[0]


def summary() -> int:
    """Each module's kill rate among the mutants not listed as equivalent.

    Columns: mutants checked, killed (a timeout counts as killed), survived,
    survivors listed in unit_tests/MUTATION.md as equivalent, other outcomes.
    """
    listed = subprocess.run([sys.executable, __file__, "results", "--all", "true"],
                            check=True, capture_output=True, text=True).stdout
    equivalent = equivalents()
    counts: dict = {}
    for line in listed.splitlines():
        if ": " not in line:
            continue
        name, status = (part.strip() for part in line.split(": ", 1))
        module = module_of(name)
        row = counts.setdefault(module, {"killed": 0, "timeout": 0, "survived": 0, "equivalent": 0,
                                         "other": 0})
        if status == "survived" and name in equivalent:
            status = "equivalent"
        if status != "not checked":
            row[status if status in row else "other"] += 1
    print(f"{'module':<16} {'checked':>7} {'killed':>6} {'survived':>8} {'equivalent':>10} {'other':>5}"
          "  rate (of non-equivalent)")
    for module, row in sorted(counts.items()):
        checked = sum(row.values())
        if checked:
            killed = row["killed"] + row["timeout"]
            judged = checked - row["equivalent"]
            rate = f"{100 * killed / judged:.0f}%" if judged else "-"
            print(f"{module:<16} {checked:>7} {killed:>6} {row['survived']:>8} {row['equivalent']:>10}"
                  f" {row['other']:>5}  {rate}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["summary"]:
        sys.exit(summary())
    # mutmut only here: unit_tests/test_mutation_list.py imports this module without it.
    from mutmut import configuration
    from mutmut.__main__ import cli

    module = os.environ.get("MODULE", "").strip()
    if module:
        configuration.config().only_mutate = [glob.strip() for glob in module.split(",") if glob.strip()]
    every = int(os.environ.get("SAMPLE", "0") or 0)
    args = sys.argv[1:]
    if every > 1 and args[:1] == ["run"] and not [a for a in args[1:] if not a.startswith("-")
                                                  and not a.isdigit()]:
        chosen = sample(unchecked_mutants(), every)
        print(f"sample: {len(chosen)} mutants (one in {every})", flush=True)
        sys.argv[1:] = args + chosen
    sys.exit(cli())
