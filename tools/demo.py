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
    make demo ARGS="--host a100 --mappings '{A100-20C: all}'"
    make demo ARGS="--host l40s"                    # vendor-specific VFIO: L40S + H200 SXM
    make demo ARGS="--host rtxpro6000"              # 4 RTX PRO 6000, PCI domains 0000 and 0001
    make demo ARGS="--host rtxpro6000-mig"          # the same in MIG mode: MIG-backed profiles
    make demo ARGS="--nova 2:21.2.4-0ubuntu2"      # ussuri spelling
    make demo ARGS="--host l40s --config pci-in-placement=true"   # any other option
    make demo ARGS="--host l40s --reboot-upgrade"   # driver branch 550 -> 570 and a reboot
    make demo ARGS="--host l40s --guest"            # then a guest holds a vGPU: vgpu-usage
    make demo ARGS="--host l40s --mappings '{L40S-12Q: all, passthrough: [c1:00.0]}'"
    make demo ARGS="--host l40s --action preview-mappings --param mappings='{L40S-24Q: all}'"
    make demo ARGS="--host rtxpro6000-mig --action enable-mig --param gpu=0000:8c:00.0"
    make demo ARGS="--action fleet-report"          # with two sample peers; drain-plan too

``--action`` runs any action after the mapping is applied and prints its results
as ``juju run`` prints them (YAML); list-vgpu-types, vgpu-usage, preview-mappings,
enable-mig (a sample DCGM unit runs), fleet-report and drain-plan (two sample peers).

systemctl and update-initramfs are stand-ins that record their calls, so
nothing on this machine is touched.
"""

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from ops import testing  # noqa: E402

from charm import NovaComputeNvidiaVgpuCharm  # noqa: E402
from unit_tests import debs, principal  # noqa: E402
from unit_tests.fakehost import L40S_BRANCHES, build  # noqa: E402
from unit_tests.faketools import Tools  # noqa: E402

DEFAULT_MAPPINGS = {
    "v100": "{nvidia-108: ['0000:c1:00.0'], nvidia-109: ['e1:00.0']}",
    "a100": "{GRID A100-10C: ['0000:41:00.0']}",
    "l40s": "{L40S-12Q: all, NVIDIA H200X-35C: ['c1:00.0']}",
    # NVIDIA's tables' short form and the driver's full name of one time-sliced profile
    # (two profiles of one model on a host need pci-in-placement), nvidia-smi's address form.
    "rtxpro6000": "{DC-8Q: ['00000001:C8:00.0'], NVIDIA RTX Pro 6000 Blackwell DC-8Q: "
                  "['0000:42:00.0']}",
    # MIG-backed: four 1g.24gb GPU instances of one GPU, 3 x 8 GB vGPUs each (12 VFs).
    "rtxpro6000-mig": "{DC-1-8Q: ['0000:42:00.0']}",
    "empty": "{nvidia-108: ['0000:c1:00.0']}",
}
DEFAULT_NOVA = {"l40s": "3:31.0.0-0ubuntu1", "rtxpro6000": "3:31.0.0-0ubuntu1",
                "rtxpro6000-mig": "3:31.0.0-0ubuntu1"}  # VFIO: epoxy
UNIT = "nova-compute-nvidia-vgpu/0"
OLD_BRANCH, NEW_BRANCH = "550", "570"  # --reboot-upgrade: L40S-12Q is nvidia-1153, then 1139
L40S_ADDRESS = "0000:81:00.0"
RTX_PRO_6000_GPUS = ("0000:42:00.0", "0000:8c:00.0", "0001:04:00.0", "0001:c8:00.0")


def arguments(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", choices=sorted(DEFAULT_MAPPINGS), default="v100",
                        help="sample host: two V100s (mdev), an SR-IOV A100 (mdev on VFs), "
                             "an L40S and an H200 SXM, four RTX PRO 6000 (vendor-specific "
                             "VFIO), the same in MIG mode (MIG-backed), or no NVIDIA GPU")
    parser.add_argument("--mappings", help="vgpu-device-mappings (YAML or JSON)")
    parser.add_argument("--nova", help="installed nova-common version (default: caracal; "
                                       "epoxy for --host l40s)")
    parser.add_argument("--config", action="append", default=[], metavar="OPTION=VALUE",
                        help="another charm option (true/false for booleans); may repeat")
    parser.add_argument("--reboot-upgrade", action="store_true",
                        help="--host l40s only: start on driver branch 550, then upgrade to "
                             "570 (other L40S type ids) and reboot; the boot step and a hook "
                             "restore the VF types by name")
    parser.add_argument("--guest", action="store_true",
                        help="then a running guest holds the first published vGPU, as after "
                             "openstack server create: the status and vgpu-usage")
    parser.add_argument("--action", metavar="NAME",
                        help="then run this action and print its results as juju run does")
    parser.add_argument("--param", action="append", default=[], metavar="KEY=VALUE",
                        help="a parameter of --action; may repeat")
    parser.add_argument("--keep", action="store_true", help="keep the sample host tree")
    args = parser.parse_args(argv)
    if args.reboot_upgrade and args.host != "l40s":
        parser.error("--reboot-upgrade needs --host l40s (the host with two driver branches)")
    if args.guest and args.reboot_upgrade:
        parser.error("--guest and --reboot-upgrade: one at a time")
    return args


SAMPLE_HOSTNAME = "gpu-host-1"  # the sample host's name: the fleet record names no machine here


def main(argv=None) -> int:
    """The demo, with the sample host's own host name where the charm asks for one."""
    from unittest import mock

    with mock.patch("socket.gethostname", return_value=SAMPLE_HOSTNAME):
        return _main(argv)


def _main(argv=None) -> int:
    args = arguments(argv)
    mappings = args.mappings if args.mappings is not None else DEFAULT_MAPPINGS[args.host]
    config = {"vgpu-device-mappings": mappings, **options(args.config)}

    work = Path(tempfile.mkdtemp(prefix="vgpu-sample-host-"))
    root = work / "host"
    tools = Tools(work / "tools")
    os.environ.update(tools.environ())
    os.environ["VGPU_HOST_ROOT"] = str(root)
    branch = {"branch": OLD_BRANCH} if args.reboot_upgrade else {}
    host = build(args.host, root, nova=args.nova or DEFAULT_NOVA.get(args.host, "3:29.0.0-0ubuntu1"),
                 **branch)
    package = prepare(args, host, tools, work)

    ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
    relation = testing.SubordinateRelation("nova-vgpu", remote_app_name="nova-compute")
    state = testing.State(
        relations=[relation],
        resources={testing.Resource(name="nvidia-vgpu-software", path=package)})

    print(f"Sample host at {root}" if args.keep else "Sample host (temporary)")
    print(f"$ juju attach-resource nova-compute-nvidia-vgpu nvidia-vgpu-software=./{package.name}")
    state = ctx.run(ctx.on.install(), state)
    print(f"  installed: {debs.dpkg_query(root, package.name.split('_')[0]) or 'nothing'}")
    if (root / "usr/lib/nvidia/sriov-manage").exists():
        host.install_sriov_manage()  # the package's sriov-manage is a placeholder
    for key in sorted(config):
        if key != "vgpu-device-mappings":
            print(f"$ juju config nova-compute-nvidia-vgpu {key}={str(config[key]).lower()}")
    print(f"$ juju config nova-compute-nvidia-vgpu vgpu-device-mappings=\"{mappings}\"")
    state = ctx.run(ctx.on.config_changed(),
                    testing.State(config=config, relations=state.relations,
                                  resources=state.resources))
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
    print(f"services nova-compute's pause stops: {sorted(principal.services(data)) or 'none'}")
    print_vfs(root)
    if args.reboot_upgrade:
        state = reboot_upgrade(ctx, state, host, work, config)
        status = state.unit_status
        if not args.keep:
            import shutil
            shutil.rmtree(work)
        return 0 if status.name == "active" else 1
    print()
    print("$ juju run nova-compute-nvidia-vgpu/0 list-vgpu-types")
    ctx.run(ctx.on.action("list-vgpu-types"), state)
    print(ctx.action_results["table"])
    flavors = flavor_lines(ctx.action_results["gpus"], context, held_types(root))
    if flavors:
        print()
        print("Flavors for what is published (from list-vgpu-types):")
        print("\n".join(flavors))
    if args.guest:
        state = boot_guest(ctx, state, host, config)
        status = state.unit_status
    if args.action:
        run_action(ctx, state, config, args.action, options(args.param))
    if not args.keep:
        import shutil
        shutil.rmtree(work)
    return 0 if status.name == "active" else 1


def prepare(args, host, tools, work: Path) -> Path:
    """The vGPU manager up, nvidia-smi where the host has MIG, a DCGM for enable-mig; the package."""
    for unit in ("nvidia-vgpu-mgr", "nvidia-vgpud"):
        tools.set_active(unit)
    if args.host == "rtxpro6000":  # the driver brings nvidia-smi: MIG mode off, as shipped
        host.install_nvidia_smi({g: "Disabled" for g in RTX_PRO_6000_GPUS}, "RTX PRO 6000")
    if args.action == "enable-mig":
        tools.set_active(SAMPLE_DCGM)  # a neighbour's NVML client: the action names it
    return driver_package(work, host.root)


GUEST = ("instance-0000002a", "3d9f1c52-8b1e-4c3a-9f6d-2a7e5b0c4d11")  # libvirt's and Nova's names
GUEST_MDEV = "5f4b8a3e-1c2d-4e5f-8a9b-0c1d2e3f4a5b"


def boot_guest(ctx, state, host, config: dict):
    """A running guest takes the first published vGPU (as Nova would); update-status, vgpu-usage."""
    from unit_tests.libvirt import running_guest

    root = host.root
    context = principal.nova_context(state.get_relations("nova-vgpu")[0].local_unit_data)
    specs = device_specs(state)
    sections = context.get("sections", {}) if context else {}
    if specs:  # vendor-specific VFIO: a VF holding its type, taken whole
        vf = json.loads(specs[0])["address"]
        running_guest(root, *GUEST, pci_address=vf)
        what = f"VF {vf} ({held_types(root)[vf]})"
    elif sections.get("devices"):  # mediated devices: Nova creates one on a parent the type lists
        vgpu_type = sections["devices"][0][1].split(",")[0]
        parent = dict(sections.get(f"mdev_{vgpu_type}") or [])["device_addresses"].split(",")[0]
        host.add_mdev(parent, vgpu_type, GUEST_MDEV)
        # As the driver counts then: one fewer of that type, none of the others (one per GPU).
        for offered in (root / "sys/bus/pci/devices" / parent / "mdev_supported_types").iterdir():
            left = int((offered / "available_instances").read_text()) - 1
            (offered / "available_instances").write_text(
                f"{left if offered.name == vgpu_type else 0}\n")
        running_guest(root, *GUEST, mdev_uuid=GUEST_MDEV)
        what = f"an {vgpu_type} mdev on {parent}"
    else:
        print("\n(nothing published: no guest can take a vGPU)")
        return state
    print()
    print("$ openstack server create --flavor <flavor> ... vm-1")
    print(f"  (simulated: {GUEST[0]}, instance {GUEST[1]}, runs here holding {what})")
    state = ctx.run(ctx.on.update_status(), testing.State(
        config=config, relations=state.relations, stored_states=state.stored_states,
        resources=state.resources))
    width = len(UNIT)
    print()
    print(f"{'Unit':<{width}}  {'Workload':<8}  Message")
    print(f"{UNIT:<{width}}  {state.unit_status.name:<8}  {state.unit_status.message}")
    print()
    print(f"$ juju run {UNIT} vgpu-usage")
    ctx.run(ctx.on.action("vgpu-usage"), state)
    print(ctx.action_results["table"])
    return state


def print_vfs(root: Path) -> None:
    """The types written to VFs and, for MIG-backed ones, their GPU instances (if any)."""
    written = vf_types(root)
    if not written:
        return
    print()
    print("vGPU types written to virtual functions (nvidia/current_vgpu_type):")
    print("\n".join(written))
    instances = gpu_instances(root)
    if instances:
        print("GPU instances of MIG-backed vGPUs (nvidia/gpu_instance_id):")
        print("\n".join(instances))


def reboot_upgrade(ctx, state, host, work: Path, config: dict):
    """The upgrade action to the new branch, a reboot, the boot step, then a hook; its state."""
    from vgpu import boot, sriov

    root = host.root
    host_driver_before = (root / "sys/module/nvidia/version").read_text().strip()
    before = device_specs(state)
    types_before = vf_types(root)
    _, version = L40S_BRANCHES[NEW_BRANCH]
    package = debs.build(work, f"nvidia-vgpu-ubuntu-{NEW_BRANCH}", version, debs.machine_arch(),
                         debs.host_files())
    print()
    print(f"$ juju attach-resource nova-compute-nvidia-vgpu nvidia-vgpu-software=./{package.name}")
    print("$ juju run nova-compute-nvidia-vgpu/0 upgrade")
    state = ctx.run(ctx.on.action("upgrade"), testing.State(
        config=config, relations=state.relations, stored_states=state.stored_states,
        resources={testing.Resource(name="nvidia-vgpu-software", path=package)}))
    print(f"  message: {ctx.action_results['message']}")
    print("$ juju ssh nova-compute/0 sudo systemctl reboot")
    host.reboot(driver=version, vfio_types={L40S_ADDRESS: L40S_BRANCHES[NEW_BRANCH][0]})
    host.install_sriov_manage()  # the package's sriov-manage is a placeholder
    numbers = {name: n for n, name in L40S_BRANCHES[NEW_BRANCH][0].items()}
    print(f"  (simulated: no VFs, no types; driver {version} loaded, on which NVIDIA L40S-12Q "
          f"is nvidia-{numbers['NVIDIA L40S-12Q']})")
    print()
    print("$ journalctl -u nvidia-vgpu-vfs -b   # the boot step, before nova-compute")
    boot.main([f"/{sriov.DATA_FILE}"])
    types_booted = vf_types(root)
    print()
    print("$ juju exec --unit nova-compute-nvidia-vgpu/0 -- JUJU_DISPATCH_PATH=hooks/update-status "
          "./dispatch   # the next hook")
    state = ctx.run(ctx.on.update_status(), testing.State(
        config=config, relations=state.relations, stored_states=state.stored_states,
        resources=state.resources))
    status = state.unit_status
    print(f"  {status.name}: {status.message}")
    print()
    types_after = vf_types(root)
    released = "none released" if types_after == types_booted else "CHANGED by the hook"
    print("vGPU types on the virtual functions:")
    print("\n".join([f"  before the reboot ({host_driver_before}):",
                     *(f"  {line}" for line in types_before),
                     f"  after the boot step and the hook ({version}; {released}):",
                     *(f"  {line}" for line in types_after)]))
    after = device_specs(state)
    print()
    print(f"[pci] device_spec published: {len(after)}, "
          f"{'unchanged' if after == before else 'CHANGED'}:")
    shown = after if len(after) <= 3 else [*after[:2], "...", after[-1]]
    print("\n".join(f"  {spec}" for spec in shown))
    return state


def device_specs(state) -> list:
    """The ``[pci] device_spec`` values the relation publishes, as nova-compute renders them."""
    context = principal.nova_context(state.get_relations("nova-vgpu")[0].local_unit_data)
    sections = context.get("sections", {}) if context else {}
    return [value for key, value in sections.get("pci", []) if key == "device_spec"]


def driver_package(work: Path, root: Path) -> Path:
    """The host driver package at the version the sample host has loaded (no reboot pending)."""
    loaded = root / "sys/module/nvidia/version"
    version = loaded.read_text().strip() if loaded.exists() else debs.OLD
    if version == debs.OLD:
        return debs.host_driver(work)
    return debs.build(work, f"nvidia-vgpu-ubuntu-{version.split('.')[0]}", version,
                      debs.machine_arch(), debs.host_files())


def vf_types(root: Path):
    """``<GPU>: <first VF>..<last VF> -> <type>`` for VFs holding a type, per GPU and type."""
    held = {}
    for vf, type_id in sorted(held_types(root).items()):
        gpu = os.path.basename(os.readlink(root / "sys/bus/pci/devices" / vf / "physfn"))
        held.setdefault((gpu, type_id), []).append(vf)
    return [f"  GPU {gpu}: {len(vfs)} VFs ({vfs[0]} .. {vfs[-1]}) hold {type_id}"
            for (gpu, type_id), vfs in sorted(held.items())]


def gpu_instances(root: Path):
    """``GI <id>: <VFs>`` for VFs whose MIG-backed vGPU lives in a GPU instance."""
    by_gi = {}
    for vf in sorted(held_types(root)):
        path = root / "sys/bus/pci/devices" / vf / "nvidia/gpu_instance_id"
        if path.exists():
            gpu = os.path.basename(os.readlink(root / "sys/bus/pci/devices" / vf / "physfn"))
            by_gi.setdefault((gpu, int(path.read_text())), []).append(vf)
    return [f"  GPU {gpu} GI {gi}: {', '.join(vfs)}" for (gpu, gi), vfs in sorted(by_gi.items())]


def options(pairs):
    """``--config`` (and ``--param``) values as ops.testing wants them: booleans for true/false."""
    out = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        out[key] = {"true": True, "false": False}.get(value.lower(), value)
    return out


SAMPLE_DCGM = "nvidia-dcgm.service"
FLEET_ACTIONS = ("fleet-report", "drain-plan")


def run_action(ctx, state, config: dict, name: str, params: dict) -> None:
    """Run action ``name`` on the unit as it is now; print its results as ``juju run`` does."""
    state = testing.State(config=config, relations=state.relations,
                          stored_states=state.stored_states, resources=state.resources,
                          leader=True)
    if name in FLEET_ACTIONS:
        state = with_sample_peers(ctx, state)
    shown = " ".join(f"{k}={shlex_quote(str(v).lower() if isinstance(v, bool) else str(v))}"
                     for k, v in params.items())
    print()
    print(f"$ juju run {UNIT} {name}{' ' + shown if shown else ''}")
    try:
        ctx.run(ctx.on.action(name, params=params), state)
    except testing.ActionFailed as failed:
        print(f"ERROR {failed.message}")
        return
    print(juju_yaml(ctx.action_results or {}), end="")


def shlex_quote(value: str) -> str:
    import shlex

    return shlex.quote(value)


def with_sample_peers(ctx, state):
    """The fleet peer relation with two sample peers: this unit's record on two other hosts."""
    from vgpu import fleet

    peer = testing.PeerRelation("fleet")
    state = ctx.run(ctx.on.update_status(), testing.State(
        config=state.config, relations=[*state.relations, peer], leader=True,
        stored_states=state.stored_states, resources=state.resources))
    mine = fleet.decode(state.get_relation(peer.id).local_unit_data.get(fleet.KEY))
    peers = {1: {fleet.KEY: fleet.encode(mine._replace(host="gpu-host-2"))},
             2: {fleet.KEY: fleet.encode(mine._replace(host="gpu-host-3",
                                                       driver=SAMPLE_PEER_DRIVER))}}
    print(f"  (sample peers: gpu-host-2 as this host, gpu-host-3 on driver {SAMPLE_PEER_DRIVER})")
    others = [r for r in state.relations if r.endpoint != "fleet"]
    return testing.State(config=state.config, leader=True, stored_states=state.stored_states,
                         resources=state.resources,
                         relations=[*others, testing.PeerRelation(
                             "fleet", id=peer.id, peers_data=peers,
                             local_unit_data=dict(state.get_relation(peer.id).local_unit_data))])


SAMPLE_PEER_DRIVER = "570.172.08"


def juju_yaml(results: dict) -> str:
    """Results as ``juju run`` prints them: YAML, nested keys sorted, text blocks literal."""
    import yaml

    class Dumper(yaml.SafeDumper):
        pass

    def text(dumper, value):
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    Dumper.add_representer(str, text)
    return yaml.dump(results, Dumper=Dumper, sort_keys=True, default_flow_style=False,
                     width=10_000, allow_unicode=True)


def held_types(root: Path):
    """``{VF address: type id}`` of the VFs holding a vGPU type (vendor-specific VFIO)."""
    held = {}
    for link in (root / "sys/bus/pci/devices").iterdir():
        current = link / "nvidia/current_vgpu_type"
        if current.exists() and current.read_text().strip() not in ("", "0"):
            held[link.name] = f"nvidia-{current.read_text().strip()}"
    return held


def flavor_lines(gpus: dict, context: dict, held: dict):
    """The flavor property of every type the relation publishes, then the aliases they need.

    A type whose resource class another published type has points to list-vgpu-types' note.

    mdev types are published by id in ``[devices]``; VFIO types as one
    ``[pci] device_spec`` per VF, whose address ``held`` maps to its type.
    """
    sections = context.get("sections", {}) if context else {}
    published = set()
    for key, value in sections.get("devices", []):
        if key in ("enabled_mdev_types", "enabled_vgpu_types"):
            published.update(value.split(","))
    published.update(held.get(json.loads(v).get("address"), "") for k, v in sections.get("pci", [])
                     if k == "device_spec")
    lines, seen, aliases = [], set(), []
    for gpu in gpus.values():
        if "passthrough" in gpu:  # a GPU given whole: its own flavor property and alias
            lines.append(f"  {gpu['model']} (whole GPU): openstack flavor set <flavor> "
                         f"--property {gpu['flavor-property']}")
            aliases.append(gpu["pci-alias"])
            continue
        types = gpu.get("types") if isinstance(gpu.get("types"), dict) else {}
        for type_id, entry in types.items():
            if type_id in published and entry["name"] not in seen:
                seen.add(entry["name"])
                shared = "   (shared: see the note above)" if "flavor-note" in entry else ""
                lines.append(f"  {entry['name']}: openstack flavor set <flavor> --property "
                             f"{entry['flavor-property']}{shared}")
                if "pci-alias" in entry:
                    aliases.append(entry["pci-alias"])
    if aliases:
        value = aliases[0] if len(aliases) == 1 else f"[{', '.join(aliases)}]"
        lines.append("PCI aliases those flavors name, on the controllers and the computes:")
        lines += [f"  juju config {app} pci-alias='{value}'"
                  for app in ("nova-cloud-controller", "nova-compute")]
    return lines


if __name__ == "__main__":
    sys.exit(main())
