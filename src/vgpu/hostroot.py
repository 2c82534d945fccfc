"""The one root under which every host path is read or written.

``VGPU_HOST_ROOT`` (default ``/``) lets tests and the sample-host demo point
the charm at a directory tree shaped like a real host: sysfs at
``<root>/sys``, dpkg's database at ``<root>/var/lib/dpkg``, ``/proc`` at
``<root>/proc`` and ``/etc`` at ``<root>/etc``.
"""

import os
from pathlib import Path

ENV = "VGPU_HOST_ROOT"


def root() -> Path:
    """The host root now in force."""
    return Path(os.environ.get(ENV) or "/")


def is_real_root() -> bool:
    """True when the charm works on the machine itself, not a fixture tree."""
    return root().resolve() == Path("/")


def path(*parts: str) -> Path:
    """A host path under the root: ``path("sys/bus/pci/devices")``."""
    return root().joinpath(*(str(p).lstrip("/") for p in parts))
