#!/usr/bin/env python3
"""mutmut with one module to mutate: ``make mutation MODULE=src/vgpu/releases.py``.

mutmut reads its configuration from pyproject.toml's ``[tool.mutmut]`` only;
this wrapper sets ``only_mutate`` from the ``MODULE`` environment variable
(a glob such as ``src/vgpu/releases.py`` or ``src/vgpu/*``) and then runs
mutmut's own command line with the arguments given (``run``, ``results``,
``show <mutant>``...). Without MODULE every module under src/ is mutated.
"""

import os
import sys

from mutmut import configuration
from mutmut.__main__ import cli

if __name__ == "__main__":
    module = os.environ.get("MODULE", "").strip()
    if module:
        configuration.config().only_mutate = [module]
    sys.exit(cli())
