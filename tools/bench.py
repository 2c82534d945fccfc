#!/usr/bin/env python3
"""What an update-status hook costs, next to the floor of ops itself. Prints figures.

update-status runs every few minutes on every compute host, so its path must
stay light. This measures, on sample hosts built like real ones:

* the import cost of the charm against ``import ops`` alone (fresh processes);
* one read of the host (sysfs through sys/bus/pci/devices, dpkg's status
  file, /proc/modules) on a small host and on a large one (8 GPUs with 16
  VFs each, 300 other PCI functions, 3,000 installed packages);
* validating vgpu-device-mappings, lazy imports (PyYAML, jsonschema) included;
* a whole update-status dispatch through ops.testing, and its peak memory.

    make bench            # or: .venv/bin/python tools/bench.py --repeat 50
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from unit_tests.fakehost import FakeHost, MdevType, v100_host  # noqa: E402

MAPPING = "{nvidia-108: ['0000:c1:00.0'], nvidia-109: ['0000:e1:00.0']}"


def fresh(code: str, repeat: int) -> float:
    """Median wall time (ms) of ``python -c code`` in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=f"{REPO / 'src'}{os.pathsep}{REPO}", PYTHONDONTWRITEBYTECODE="")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True, env=env)
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def large_host(root: Path) -> None:
    host = FakeHost(root)
    host.pci_ids()
    types = {f"nvidia-{n}": MdevType(f"GRID A100-{n}C", 4096, 10) for n in range(471, 479)}
    for g in range(8):
        pf = f"0000:{0x41 + g:02x}:00.0"
        host.add_gpu(pf, device="0x20b5", totalvfs=16)
        for i in range(16):
            host.add_vf(pf, i, f"0000:{0x41 + g:02x}:{(4 + i) // 8:02x}.{(4 + i) % 8}",
                        mdev_types=types)
    for n in range(300):
        host.add_pci(f"0000:{0x80 + n // 32:02x}:{n % 32:02x}.0", "0x8086", "0x1572", "0x020000")
    packages = {f"package-{n:04d}": "1.0-1" for n in range(3000)}
    packages.update({"nova-common": "3:29.0.0-0ubuntu1", "nvidia-vgpu-ubuntu-570": "570.158.02"})
    host.dpkg_status(packages)
    host.modules(["nvidia_vgpu_vfio", "nvidia"] + [f"mod{n}" for n in range(150)])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    n = args.repeat
    work = Path(tempfile.mkdtemp(prefix="vgpu-bench-"))
    small, large = work / "small", work / "large"
    v100_host(small)
    large_host(large)

    from vgpu import facts, mappings

    rows = []
    rows.append(("python -c pass", fresh("pass", n)))
    rows.append(("import ops", fresh("import ops", n)))
    rows.append(("import charm (update-status imports)", fresh("import charm", n)))
    rows.append(("import charm, yaml, jsonschema", fresh("import charm, yaml, jsonschema", n)))
    for name, root in (("small", small), ("large", large)):
        os.environ["VGPU_HOST_ROOT"] = str(root)
        rows.append((f"read the host once ({name})", timed(facts.gather, n * 4)))
    os.environ["VGPU_HOST_ROOT"] = str(small)
    host = facts.gather()
    rows.append(("validate mapping (warm imports)",
                 timed(lambda: mappings.validate(MAPPING, host.host, host.release()), n * 4)))
    rows.append(("validate mapping (fresh process, minus import charm)",
                 fresh("import os, charm; from vgpu import facts, mappings; f = facts.gather();"
                       f"mappings.validate({MAPPING!r}, f.host, f.release())", n)
                 - rows[2][1]))

    from ops import testing
    from charm import NovaComputeNvidiaVgpuCharm
    from unit_tests.faketools import Tools

    from unit_tests import debs
    from vgpu import driver

    tools = Tools(work / "tools")
    os.environ.update(tools.environ())
    for unit in ("nvidia-vgpu-mgr", "nvidia-vgpud"):
        tools.set_active(unit)
    package = debs.host_driver(work)
    driver.install(driver.inspect_deb(package))
    ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
    state = testing.State(config={"vgpu-device-mappings": MAPPING},
                          relations=[testing.SubordinateRelation("nova-vgpu")],
                          resources={testing.Resource(name="nvidia-vgpu-software", path=package)})
    rows.append(("update-status through ops.testing (driver installed)",
                 timed(lambda: ctx.run(ctx.on.update_status(), state), n)))
    tracemalloc.start()
    ctx.run(ctx.on.update_status(), state)
    peak = tracemalloc.get_traced_memory()[1] / 1024
    tracemalloc.stop()

    width = max(len(r[0]) for r in rows)
    print(f"{'measure':<{width}}  median ms  (repeat {n})")
    for label, value in rows:
        print(f"{label:<{width}}  {value:9.2f}")
    print(f"{'peak Python memory of one update-status':<{width}}  {peak:9.0f} KiB")
    import shutil
    shutil.rmtree(work)
    return 0


if __name__ == "__main__":
    sys.exit(main())
