#!/usr/bin/env python3
"""The charm doing its main job on a bundled sample GPU host, without Juju.

Builds a host tree shaped like a real one (sysfs with two Tesla V100s, dpkg's
database with Nova, /proc), builds a stand-in for NVIDIA's host driver
package, then runs the real charm with ops.testing: install with the
package attached, config-changed with a mapping, and the list-vgpu-types
action. It prints the unit's status as `juju status` would and the nova.conf
sections nova-compute renders from the relation data (read with
charmhelpers, as nova-compute reads it).

    make demo
    make demo ARGS="--mappings '{nvidia-108: [c1:00.0, c1:00.0], nvidia-109: [c1:00.0]}'"
    make demo ARGS="--host a100 --mappings '{nvidia-474: [41:00.4, 41:00.5]}'"
    make demo ARGS="--nova 2:21.2.4-0ubuntu2"      # ussuri spelling

systemctl and update-initramfs are stand-ins that record their calls, so
nothing on this machine is touched.
"""

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from ops import testing  # noqa: E402

from charm import NovaComputeNvidiaVgpuCharm  # noqa: E402
from unit_tests import debs, principal  # noqa: E402
from unit_tests.fakehost import build  # noqa: E402
from unit_tests.faketools import Tools  # noqa: E402

DEFAULT_MAPPINGS = {
    "v100": "{nvidia-108: ['0000:c1:00.0'], nvidia-109: ['e1:00.0']}",
    "a100": "{nvidia-474: ['0000:41:00.4', '0000:41:00.5']}",
    "empty": "{nvidia-108: ['0000:c1:00.0']}",
}
UNIT = "nova-compute-nvidia-vgpu/0"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", choices=sorted(DEFAULT_MAPPINGS), default="v100",
                        help="sample host: two V100s (mdev), an SR-IOV A100, or no NVIDIA GPU")
    parser.add_argument("--mappings", help="vgpu-device-mappings (YAML or JSON)")
    parser.add_argument("--nova", default="3:29.0.0-0ubuntu1",
                        help="installed nova-common version (default: caracal)")
    parser.add_argument("--keep", action="store_true", help="keep the sample host tree")
    args = parser.parse_args(argv)
    mappings = args.mappings if args.mappings is not None else DEFAULT_MAPPINGS[args.host]

    work = Path(tempfile.mkdtemp(prefix="vgpu-sample-host-"))
    root = work / "host"
    tools = Tools(work / "tools")
    os.environ.update(tools.environ())
    os.environ["VGPU_HOST_ROOT"] = str(root)
    build(args.host, root, nova=args.nova)
    for unit in ("nvidia-vgpu-mgr", "nvidia-vgpud"):
        tools.set_active(unit)
    package = debs.host_driver(work)

    ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
    relation = testing.SubordinateRelation("nova-vgpu", remote_app_name="nova-compute")
    state = testing.State(
        relations=[relation],
        resources={testing.Resource(name="nvidia-vgpu-software", path=package)})

    print(f"Sample host at {root}" if args.keep else "Sample host (temporary)")
    print(f"$ juju attach-resource nova-compute-nvidia-vgpu nvidia-vgpu-software=./{package.name}")
    state = ctx.run(ctx.on.install(), state)
    print(f"  installed: {debs.dpkg_query(root) or 'nothing'}")
    print(f"$ juju config nova-compute-nvidia-vgpu vgpu-device-mappings=\"{mappings}\"")
    state = ctx.run(ctx.on.config_changed(),
                    testing.State(config={"vgpu-device-mappings": mappings},
                                  relations=state.relations, resources=state.resources))
    print()
    status = state.unit_status
    width = len(UNIT)
    print(f"{'Unit':<{width}}  {'Workload':<8}  Message")
    print(f"{UNIT:<{width}}  {status.name:<8}  {status.message}")
    print()
    data = state.get_relations("nova-vgpu")[0].local_unit_data
    context = principal.nova_context(data)
    print("/etc/nova/nova.conf, the sections nova-compute renders from nova-vgpu:")
    print(principal.render_nova_conf(context).rstrip() if context else "  (none)")
    print(f"services for nova-compute's pause/resume: {sorted(principal.services(data)) or 'none'}")
    print()
    print("$ juju run nova-compute-nvidia-vgpu/0 list-vgpu-types")
    ctx.run(ctx.on.action("list-vgpu-types"), state)
    print(ctx.action_results["table"])
    if not args.keep:
        import shutil
        shutil.rmtree(work)
    return 0 if status.name == "active" else 1


if __name__ == "__main__":
    sys.exit(main())
