#!/usr/bin/env python3
# Copyright 2026 nova-compute-nvidia-vgpu developers
# See LICENSE file for licensing details.
"""Entry point of nvidia-vgpu-vfs.service: ``vgpu_boot.py <boot data file>`` (see vgpu.boot).

Run as a script, its own directory (the charm's ``src/``) comes first on
``sys.path``, so the charm's modules are found without ops or the charm's
other dependencies: the boot step needs only the standard library.
"""

import sys

from vgpu import boot

if __name__ == "__main__":
    sys.exit(boot.main(sys.argv[1:]))
