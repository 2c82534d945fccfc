"""vGPU usage, licence editions and capacity (vgpu.usage, the vgpu-usage action, the status line).

Guests are libvirt XML files as libvirt writes them (status XML of running
guests in run/libvirt/qemu, definitions in etc/libvirt/qemu) with Nova's
metadata; vGPUs are sysfs-shaped mdevs and VFs holding a type.
"""

import os
import re
import subprocess

import pytest
from ops import testing

from unit_tests import libvirt
from unit_tests.fakehost import (
    L40S_TYPES,
    a100_host,
    assign_vfio_type,
    h200_nvl_host,
    h200_sxm_host,
    l40s_branch_host,
    l40s_host,
    v100_host,
)
from unit_tests.libvirt import PROJECT_ID, PROJECT_NAME, defined_guest, running_guest
from unit_tests.test_charm import install_driver, state
from unit_tests.test_table import action_set_argv, action_set_bytes
from vgpu import capacity, guests, pci, table, usage

MGR = "nvidia-vgpu-mgr"
VGPUD = "nvidia-vgpud"
MDEV_A = "0b7a0f2c-6f2d-4b3c-9b1e-4a8b1ef3c2d1"
MDEV_B = "1c8b1f3d-7a3e-4c4d-8c2f-5b9c2f04d3e2"
MDEV_IDLE = "2d9c2a4e-8b4f-4d5e-9d3a-6cad3015e4f3"
INTEL_MDEV = "9e0c7f3a-1b2d-4c5e-8f9a-0b1c2d3e4f5a"
VM_1 = "11111111-1111-4111-8111-111111111111"
VM_2 = "22222222-2222-4222-8222-222222222222"
VM_3 = "33333333-3333-4333-8333-333333333333"
OTHER_PROJECT = "0a0b0c0d0e0f40818283848586878889"
GUESTS = 1500


@pytest.fixture
def v100_guests(root):
    """Two V100s with guests: ours running and shut off, an idle mdev, one not ours.

    A running guest on an nvidia-108 mdev, a shut-off one on nvidia-109, an
    idle nvidia-108 mdev, and an Intel GVT-g guest that is not ours.
    """
    host = v100_host(root)
    host.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_A)
    host.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_IDLE)
    host.add_mdev("0000:e1:00.0", "nvidia-109", MDEV_B)
    host.add_mdev("0000:00:02.0", "i915-GVTg_V5_4", INTEL_MDEV)
    (root / "sys/bus/pci/devices/0000:c1:00.0/mdev_supported_types/nvidia-108/"
     "available_instances").write_text("0\n")
    (root / "sys/bus/pci/devices/0000:e1:00.0/mdev_supported_types/nvidia-109/"
     "available_instances").write_text("0\n")
    running_guest(root, "instance-0000002a", VM_1, mdev_uuid=MDEV_A)
    defined_guest(root, "instance-0000002b", VM_2, mdev_uuid=MDEV_B,
                  project_id=OTHER_PROJECT, project_name="globex")
    running_guest(root, "instance-0000002c", VM_3, mdev_uuid=INTEL_MDEV)
    return host


def test_mdev_vgpus_with_project_profile_and_edition(v100_guests):
    uses = usage.in_use(pci.discover())
    assert [(u.domain, u.state) for u in uses] == [
        ("instance-0000002a", "running"), ("instance-0000002b", "shut off")]
    first = uses[0]
    assert first == usage.VgpuUse(
        instance_uuid=VM_1, domain="instance-0000002a", state="running",
        instance_name="vm-instance-0000002a", project_id=PROJECT_ID, project_name=PROJECT_NAME,
        address="0000:c1:00.0", gpu="0000:c1:00.0", framework="mdev", type_id="nvidia-108",
        profile="V100-8Q", name_known=True, framebuffer_mb=8192,
        edition="RTX Virtual Workstation", mdev_uuid=MDEV_A)
    assert (uses[1].project_name, uses[1].type_id, uses[1].framebuffer_mb) == (
        "globex", "nvidia-109", 16384)


def test_totals_count_running_guests_per_edition_and_project(v100_guests):
    editions, projects = usage.totals(usage.in_use(pci.discover()))
    assert editions == {"RTX Virtual Workstation": 1}
    assert projects == {(PROJECT_ID, PROJECT_NAME): 1}


def test_vfio_vf_holding_a_type_is_a_vgpu_named_through_its_siblings(root):
    host = l40s_host(root)
    # 0000:81:00.4 holds L40S-12Q; its siblings still list what fits beside it.
    assign_vfio_type(host, "0000:81:00.4", 1139)
    for address in ("0000:81:00.5", "0000:81:00.6", "0000:81:00.7"):
        assign_vfio_type(host, address, 0, creatable={1139: L40S_TYPES[1139]})
    running_guest(root, "instance-00000040", VM_1, pci_address="0000:81:00.4")
    running_guest(root, "instance-00000041", VM_2, pci_address="0000:81:00.5")  # VF without type
    (use,) = usage.in_use(pci.discover())
    assert (use.address, use.gpu, use.framework, use.type_id, use.profile, use.name_known,
            use.framebuffer_mb, use.edition) == (
        "0000:81:00.4", "0000:81:00.0", "vfio", "nvidia-1139", "L40S-12Q", True, 12288,
        "RTX Virtual Workstation")


def test_a_full_gpu_lists_no_names_so_the_type_stays_an_id(root):
    host = l40s_host(root)
    for address in ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6", "0000:81:00.7"):
        assign_vfio_type(host, address, 1141)  # 4 x 24Q would not fit; names gone everywhere
    running_guest(root, "instance-00000040", VM_1, pci_address="0000:81:00.6")
    (use,) = usage.in_use(pci.discover())
    assert (use.type_id, use.profile, use.name_known, use.edition, use.framebuffer_mb) == (
        "nvidia-1141", "nvidia-1141", False, "unknown", None)
    results = usage.results([use])
    assert results["vgpus"]["vgpu-0"]["profile"] == "nvidia-1141 (name unknown)"
    assert "nvidia-1141?" in results["table"]


def test_vgpu_usage_on_a_full_gpu_names_the_type_learnt_while_it_was_free(root, tools, ctx, packages):
    host = l40s_host(root)
    ctx.run(ctx.on.update_status(), state(resource=packages["empty"]))  # the VFs list their types
    for address in ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6", "0000:81:00.7"):
        assign_vfio_type(host, address, 1141)  # full: no VF lists a name any more
    running_guest(root, "instance-00000040", VM_1, pci_address="0000:81:00.6")
    ctx.run(ctx.on.action("vgpu-usage"), state(resource=packages["empty"]))
    entry = ctx.action_results["vgpus"]["vgpu-0"]
    assert (entry["address"], entry["type"], entry["profile"], entry["framebuffer-mb"], entry["edition"]) == (
        "0000:81:00.6", "nvidia-1141", "L40S-24Q", "24576", "RTX Virtual Workstation")
    assert ctx.action_results["editions"] == {"rtx-virtual-workstation": "1"}


@pytest.mark.parametrize("name,profile,edition,mb", [
    ("GRID V100-8Q", "V100-8Q", "RTX Virtual Workstation", 8192),
    ("NVIDIA L40S-12Q", "L40S-12Q", "RTX Virtual Workstation", 12288),
    ("GRID A100-20C", "A100-20C", "Virtual Compute Server", 20480),
    # MIG-backed media profiles (+me GPU instances) are C-series: counted in their edition.
    ("GRID A100-1-5CME", "A100-1-5CME", "Virtual Compute Server", 5120),
    ("NVIDIA H200X-1-18CME", "H200X-1-18CME", "Virtual Compute Server", 18432),
    ("NVIDIA H200X-2-35C", "H200X-2-35C", "Virtual Compute Server", 35840),
    ("NVIDIA A16-2B", "A16-2B", "Virtual PC", 2048),
    ("NVIDIA L4-4A", "L4-4A", "Virtual Applications", 4096),
    ("GRID T4-1Z", "T4-1Z", "unknown", 1024),
    ("mystery", None, "unknown", None),
])
def test_profiles_editions_and_framebuffers_from_names(name, profile, edition, mb):
    assert usage.profile_of(name) == profile
    assert usage.edition_of(profile or "") == edition
    assert usage.framebuffer_of(profile or "") == mb


def test_older_nova_namespace_and_missing_metadata(root):
    v100 = v100_host(root)
    v100.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_A)
    v100.add_mdev("0000:e1:00.0", "nvidia-109", MDEV_B)
    path = running_guest(root, "instance-00000001", VM_1, mdev_uuid=MDEV_A)
    path.write_text(path.read_text().replace("libvirt/nova/1.1", "libvirt/nova/1.0"))
    bare = running_guest(root, "instance-00000002", VM_2, mdev_uuid=MDEV_B)
    text = bare.read_text()
    bare.write_text(text[:text.index("<metadata>")] + text[text.index("</metadata>") + 11:])
    found = {d.name: d for d in guests.domains()}
    assert (found["instance-00000001"].project_id, found["instance-00000001"].project_name) == (
        PROJECT_ID, PROJECT_NAME)
    assert found["instance-00000002"].project_name == ""
    entry = usage.results(usage.in_use(pci.discover()))["vgpus"]["vgpu-1"]
    assert (entry["domain"], entry["project"], entry["project-id"]) == (
        "instance-00000002", "unknown", "unknown")


def test_hostile_names_stay_one_bounded_line(root):
    v100 = v100_host(root)
    v100.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_A)
    running_guest(root, "instance-00000001", VM_1, mdev_uuid=MDEV_A,
                  project_name="evil\u2028name\n[DEFAULT]\t" + "x" * 1000)
    (use,) = usage.in_use(pci.discover())
    assert use.project_name.startswith("evil name [DEFAULT] xxx")
    assert len(use.project_name) <= 255


def test_hostile_type_names_never_break_action_set(root):
    v100 = v100_host(root)
    v100.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_A)
    (root / "sys/bus/pci/devices/0000:c1:00.0/mdev_supported_types/nvidia-108/name").write_bytes(
        b"GRID\x00 V100-8Q\xff\n[x]")
    running_guest(root, "instance-00000001", VM_1, mdev_uuid=MDEV_A)
    results = usage.results(usage.in_use(pci.discover()))
    subprocess.run(action_set_argv(results), check=True)
    assert "\x00" not in results["table"]


# -- the action -----------------------------------------------------------------------------

def test_vgpu_usage_action(v100_guests, tools, ctx, packages):
    ctx.run(ctx.on.action("vgpu-usage"), state(resource=packages["empty"]))
    results = ctx.action_results
    assert results["summary"] == ("1 vGPU in running guests (1 RTX Virtual Workstation); "
                                  "licences: 1 NVIDIA RTX Virtual Workstation; "
                                  "1 held by shut-off instances (not licensed while off)")
    assert results["editions"] == {"rtx-virtual-workstation": "1"}
    assert results["licences"] == {"rtx-virtual-workstation": {
        "edition": "RTX Virtual Workstation", "product": "NVIDIA RTX Virtual Workstation",
        "licences": "1", "counts": usage.RULES["RTX Virtual Workstation"].counts, "exact": "yes",
        "running-vgpus": "1", "running-vms": "1"}}
    assert results["open-cases"] == {"case-0": (
        "1 vGPU held by shut-off instances: no licence counted, since a guest checks one out at "
        "boot and returns it at shutdown; they need licences again when they start")}
    assert results["projects"] == {"project-0": {"id": PROJECT_ID, "name": PROJECT_NAME,
                                                 "running-vgpus": "1",
                                                 "licences": {"rtx-virtual-workstation": "1"}}}
    assert results["vgpus"]["vgpu-0"] == {
        "instance": VM_1, "domain": "instance-0000002a", "state": "running",
        "name": "vm-instance-0000002a", "project-id": PROJECT_ID, "project": PROJECT_NAME,
        "address": "0000:c1:00.0", "gpu": "0000:c1:00.0", "framework": "mdev",
        "type": "nvidia-108", "profile": "V100-8Q", "framebuffer-mb": "8192",
        "edition": "RTX Virtual Workstation", "mdev": MDEV_A}
    assert sorted(results["vgpus"]) == ["vgpu-0", "vgpu-1"]
    vgpu_lines, licence_lines = (part.splitlines() for part in results["table"].split("\n\n"))
    assert vgpu_lines[0].split() == ["PROJECT", "INSTANCE", "DOMAIN", "STATE", "ADDRESS", "TYPE",
                                     "PROFILE", "FRAMEBUFFER", "EDITION"]
    assert vgpu_lines[1].split()[:4] == [PROJECT_NAME, VM_1, "instance-0000002a", "running"]
    assert licence_lines[0].split() == ["EDITION", "LICENCE", "COUNT", "PER", "VGPUS", "VMS"]
    assert licence_lines[1].split() == ["RTX", "Virtual", "Workstation", "NVIDIA", "RTX", "Virtual",
                                        "Workstation", "1", "concurrent", "user", "(running", "VM)",
                                        "1", "1"]
    assert licence_lines[2] == "open case: " + results["open-cases"]["case-0"]
    assert "truncated" not in results


def test_vgpu_usage_on_an_idle_host(root, tools, ctx, packages):
    v100_host(root)
    ctx.run(ctx.on.action("vgpu-usage"), state(resource=packages["empty"]))
    assert ctx.action_results == {"summary": "no vGPU in use on this host", "editions": {},
                                  "licences": {}, "open-cases": {}, "projects": {}, "vgpus": {},
                                  "table": "no vGPU in use on this host"}


def test_thousands_of_guests_stay_within_action_set(root, tools, ctx, packages):
    """A big host with small profiles: 1,500 guests, each on its own mdev."""
    host = v100_host(root)
    qemu = root / "run/libvirt/qemu"
    qemu.mkdir(parents=True)
    for n in range(GUESTS):
        uuid = f"{n:08x}-0000-4000-8000-{n:012x}"
        host.add_mdev("0000:c1:00.0", "nvidia-105", uuid)
        (qemu / f"instance-{n:08x}.xml").write_text(libvirt.status(
            f"instance-{n:08x}", f"{n:08x}-1111-4111-8111-{n:012x}", libvirt.hostdevs(uuid),
            project_id=f"{n % 40:032x}", project_name=f"tenant-{n % 40}"))
    ctx.run(ctx.on.action("vgpu-usage"), state(resource=packages["empty"]))
    results = ctx.action_results
    assert action_set_bytes(results) <= table.MAX_RESULTS_BYTES
    subprocess.run(action_set_argv(results), check=True)  # the kernel accepts them as action-set's arguments
    assert results["summary"].startswith("1500 vGPUs in running guests (1500 RTX Virtual")
    assert len(results["projects"]) == 40  # totals come first and are never dropped
    assert sum(int(p["running-vgpus"]) for p in results["projects"].values()) == GUESTS
    shown = len(results["vgpus"])
    assert 0 < shown < GUESTS
    assert results["truncated"].startswith(f"{shown} of {GUESTS} vGPUs shown")
    vgpu_part, licence_part = results["table"].split("\n\n")
    lines = vgpu_part.splitlines()
    rows = len(lines) - 2  # the header and the summary line
    assert 0 < rows <= table.MAX_ROWS
    assert len(results["table"].encode()) <= table.MAX_TABLE_BYTES  # the licences included
    assert lines[-1] == f"... and {GUESTS - rows} more vGPUs; see the nested results"
    assert licence_part.splitlines()[1].split()[-3:] == ["VM)", str(GUESTS), str(GUESTS)]
    assert results["licences"]["rtx-virtual-workstation"]["licences"] == str(GUESTS)


# -- licences, counted the way NVIDIA counts them ---------------------------------------------

JUJU_KEY = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?\Z")
VM_4 = "44444444-4444-4444-8444-444444444444"
A100_10C = "nvidia-474"  # GRID A100-10C: Virtual Compute Server, on the A100's VFs
MDEV_C = "3e0d3b5f-9c5a-4e6f-8e4b-7dbe4126f5a4"


def guest_with(root, name, uuid, *devices, project_id=PROJECT_ID, project_name=PROJECT_NAME):
    """A running guest holding several vGPUs: mdev uuids and VF addresses (``dddd:bb:ss.f``)."""
    hostdevs = "\n".join(libvirt.hostdevs(pci_address=d) if ":" in d else libvirt.hostdevs(d)
                         for d in devices)
    for directory, text in (("etc/libvirt/qemu", libvirt.definition), ("run/libvirt/qemu", libvirt.status)):
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / f"{name}.xml").write_text(
            text(name, uuid, hostdevs, project_id=project_id, project_name=project_name))


def by_edition(uses):
    return {lic.edition: lic for lic in usage.licences(uses)}


def test_two_c_series_vgpus_on_one_gpu_need_one_gpu_licence(root):
    host = a100_host(root)
    host.add_mdev("0000:41:00.4", A100_10C, MDEV_A)  # two VFs of the same A100
    host.add_mdev("0000:41:00.5", A100_10C, MDEV_B)
    running_guest(root, "instance-00000050", VM_1, mdev_uuid=MDEV_A)
    running_guest(root, "instance-00000051", VM_2, mdev_uuid=MDEV_B)
    uses = usage.in_use(pci.discover())
    (licence,) = usage.licences(uses)
    assert (licence.edition, licence.rule.product, licence.licences, licence.vgpus, licence.vms,
            licence.gpus) == ("Virtual Compute Server", "NVIDIA AI Enterprise", 1, 2, 2,
                              ("0000:41:00.0",))
    results = usage.results(uses)
    assert results["licences"]["virtual-compute-server"]["licences"] == "1"
    assert results["licences"]["virtual-compute-server"]["gpus"] == "0000:41:00.0"
    assert results["licences"]["virtual-compute-server"]["running-vgpus"] == "2"
    # NVIDIA's two counts: the per-GPU entitlement and the licence server's leases, one per
    # running vGPU ("NVIDIA vGPU for Compute Licensing"); neither called exact.
    entry = results["licences"]["virtual-compute-server"]
    assert (entry["entitlement-gpus"], entry["leases"]) == ("1", "2")
    assert entry["exact"].startswith("no: NVIDIA counts leases on the licence server")
    assert "1 GPU, 2 leases" in results["table"]
    assert results["open-cases"] == {}  # one project, all running: nothing left open
    assert results["summary"] == ("2 vGPUs in running guests (2 Virtual Compute Server); "
                                  "licences: NVIDIA AI Enterprise: 1 GPU entitlement, 2 licence "
                                  "server leases")


def test_c_series_on_two_gpus_need_two_licences_whoever_holds_them(root):
    """VFIO H200 SXMs: one VM with a vGPU on each GPU, another VM on the first GPU."""
    host = h200_sxm_host(root)
    for vf in ("0000:18:00.4", "0000:18:00.5", "0000:2a:00.4"):
        assign_vfio_type(host, vf, 1420)  # H200X-18C
    guest_with(root, "instance-00000060", VM_1, "0000:18:00.4", "0000:2a:00.4")
    running_guest(root, "instance-00000061", VM_2, pci_address="0000:18:00.5")
    licence = by_edition(usage.in_use(pci.discover()))["Virtual Compute Server"]
    assert (licence.licences, licence.vgpus, licence.vms, licence.gpus) == (
        2, 3, 2, ("0000:18:00.0", "0000:2a:00.0"))


@pytest.mark.parametrize("vgpus,needed", [(16, 1), (17, 2)])
def test_one_c_series_licence_covers_up_to_16_vgpus_on_a_gpu(root, vgpus, needed):
    host = h200_nvl_host(root)  # H200-4C fits 32 times
    for n in range(vgpus):
        vf = f"0000:41:{(4 + n) // 8:02x}.{(4 + n) % 8}"
        assign_vfio_type(host, vf, 1500)
        running_guest(root, f"instance-{n:08x}", f"{n:08x}-1111-4111-8111-{n:012x}", pci_address=vf)
    licence = by_edition(usage.in_use(pci.discover()))["Virtual Compute Server"]
    assert (licence.vgpus, licence.licences, licence.gpus) == (vgpus, needed, ("0000:41:00.0",))


def test_q_series_counts_one_licence_per_running_vm_however_many_vgpus_it_holds(root):
    host = v100_host(root)
    host.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_A)
    host.add_mdev("0000:e1:00.0", "nvidia-108", MDEV_B)
    host.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_C)
    guest_with(root, "instance-00000070", VM_1, MDEV_A, MDEV_B)  # multi-vGPU: one user
    running_guest(root, "instance-00000071", VM_2, mdev_uuid=MDEV_C)
    uses = usage.in_use(pci.discover())
    licence = by_edition(uses)["RTX Virtual Workstation"]
    assert (licence.licences, licence.vgpus, licence.vms, licence.rule.bound) == (2, 3, 2, usage.EXACT)
    assert usage.results(uses)["editions"] == {"rtx-virtual-workstation": "3"}  # vGPUs, as before


def test_b_series_counts_running_vms_on_vfio(root):
    host = l40s_host(root)
    for vf in ("0000:81:00.4", "0000:81:00.5"):
        assign_vfio_type(host, vf, 1134)  # L40S-2B
    running_guest(root, "instance-00000080", VM_1, pci_address="0000:81:00.4")
    running_guest(root, "instance-00000081", VM_2, pci_address="0000:81:00.5")
    licence = by_edition(usage.in_use(pci.discover()))["Virtual PC"]
    assert (licence.rule.product, licence.licences, licence.vms) == ("NVIDIA Virtual PC", 2, 2)


def test_shut_off_guests_hold_no_licence_and_say_so(root):
    host = a100_host(root, gpus=2)
    host.add_mdev("0000:41:00.4", A100_10C, MDEV_A)
    host.add_mdev("0000:61:00.4", A100_10C, MDEV_B)  # the other GPU, held by a shut-off guest
    running_guest(root, "instance-00000090", VM_1, mdev_uuid=MDEV_A)
    defined_guest(root, "instance-00000091", VM_2, mdev_uuid=MDEV_B)
    uses = usage.in_use(pci.discover())
    assert len(uses) == 2
    (licence,) = usage.licences(uses)
    assert (licence.licences, licence.gpus) == (1, ("0000:41:00.0",))
    results = usage.results(uses)
    assert results["open-cases"]["case-0"].startswith("1 vGPU held by shut-off instances: no licence")
    assert "open case: 1 vGPU held by shut-off instances" in results["table"]
    # Only shut-off guests: no licence at all, and the table says so.
    (root / "run/libvirt/qemu/instance-00000090.xml").unlink()
    results = usage.results(usage.in_use(pci.discover()))
    assert (results["licences"], sorted(results["open-cases"])) == ({}, ["case-0"])
    assert "no licence in use: no running guest holds a vGPU" in results["table"]
    assert results["projects"] == {}


def test_c_series_gpu_shared_by_projects_counts_once_here_and_in_each_project(root):
    """41:00.0 carries both projects' vGPUs; globex also has 61:00.0 to itself."""
    host = a100_host(root, gpus=2)
    host.add_mdev("0000:41:00.4", A100_10C, MDEV_A)
    host.add_mdev("0000:41:00.5", A100_10C, MDEV_B)
    host.add_mdev("0000:61:00.4", A100_10C, MDEV_C)
    running_guest(root, "instance-000000a0", VM_1, mdev_uuid=MDEV_A)
    for name, uuid, mdev in (("instance-000000a1", VM_2, MDEV_B), ("instance-000000a2", VM_3, MDEV_C)):
        running_guest(root, name, uuid, mdev_uuid=mdev, project_id=OTHER_PROJECT,
                      project_name="globex")
    results = usage.results(usage.in_use(pci.discover()))
    assert results["licences"]["virtual-compute-server"]["licences"] == "2"
    assert {p["name"]: p["licences"] for p in results["projects"].values()} == {
        PROJECT_NAME: {"virtual-compute-server": "1"}, "globex": {"virtual-compute-server": "2"}}
    assert results["open-cases"] == {"case-0": (
        "C-series vGPUs of several projects share 0000:41:00.0: this host's total counts each GPU "
        "once and each project's count includes it; the guides do not split a per-GPU licence "
        "between projects")}
    assert results["table"].splitlines()[-1] == "open case: " + results["open-cases"]["case-0"]
    assert all(JUJU_KEY.match(key) for path, _ in table.flatten(results) for key in path)


def test_vapps_users_are_invisible_to_the_host_so_vgpus_stand_in(root):
    host = l40s_branch_host(root, "550")
    for vf in ("0000:26:00.4", "0000:26:00.5"):
        assign_vfio_type(host, vf, 1157)  # L40S-1A
    running_guest(root, "instance-000000b0", VM_1, pci_address="0000:26:00.4")
    running_guest(root, "instance-000000b1", VM_2, pci_address="0000:26:00.5")
    uses = usage.in_use(pci.discover())
    licence = by_edition(uses)["Virtual Applications"]
    assert (licence.rule.product, licence.licences, licence.rule.bound) == (
        "NVIDIA Virtual Applications", 2, usage.AT_LEAST)
    results = usage.results(uses)
    entry = results["licences"]["virtual-applications"]
    assert (entry["licences"], entry["exact"]) == ("2", "no: a lower bound (see open-cases)")
    assert results["open-cases"]["case-0"].startswith(
        "2 running vGPUs of Virtual Applications: NVIDIA counts every concurrent user")
    assert "licences: at least 2 NVIDIA Virtual Applications" in results["summary"]
    assert ">=2" in results["table"].split("\n\n")[1]


def test_an_unknown_edition_counts_vgpus_and_is_an_open_case(root):
    host = l40s_host(root)
    for address in ("0000:81:00.4", "0000:81:00.5"):
        assign_vfio_type(host, address, 1141)  # a full GPU: the name is unknown
    running_guest(root, "instance-000000c0", VM_1, pci_address="0000:81:00.4")
    guest_with(root, "instance-000000c1", VM_2, "0000:81:00.5")
    uses = usage.in_use(pci.discover())
    licence = by_edition(uses)["unknown"]
    assert (licence.rule.product, licence.licences, licence.vgpus) == ("unknown edition", 2, 2)
    results = usage.results(uses)
    assert (results["licences"]["unknown"]["licences"], results["licences"]["unknown"]["exact"]) == (
        "2", "no: edition unknown (see open-cases)")
    assert results["summary"].endswith("; licences: 2 vGPUs of unknown edition")
    assert results["table"].split("\n\n")[1].splitlines()[1].split()[3] == "2?"
    assert results["open-cases"]["case-0"] == (
        "2 running vGPUs of unknown edition (nvidia-1141): the type's name is unknown, so its "
        "edition is too; counted as vGPUs")


def test_licences_on_a_mixed_host_keep_every_edition_apart(root):
    """One A100 host: C-series on two VFs of a GPU, plus a shut-off guest (VM_4)."""
    host = a100_host(root)
    for mdev, vf in ((MDEV_A, "0000:41:00.4"), (MDEV_B, "0000:41:00.5"), (MDEV_C, "0000:41:00.6")):
        host.add_mdev(vf, A100_10C, mdev)
    guest_with(root, "instance-000000d0", VM_1, MDEV_A, MDEV_B)
    defined_guest(root, "instance-000000d1", VM_4, mdev_uuid=MDEV_C)
    results = usage.results(usage.in_use(pci.discover()))
    subprocess.run(action_set_argv(results), check=True)
    assert results["licences"]["virtual-compute-server"]["running-vms"] == "1"
    assert results["licences"]["virtual-compute-server"]["licences"] == "1"
    assert results["projects"]["project-0"]["running-vgpus"] == "2"


# -- capacity in the status line --------------------------------------------------------------

def test_capacity_counts_held_mdevs_as_used_and_idle_ones_as_free(v100_guests):
    mapping = {"nvidia-108": ("0000:c1:00.0",), "nvidia-109": ("0000:e1:00.0",)}
    found = capacity.capacity(pci.discover(), mapping)
    # c1: one mdev held by a running guest, one idle (Nova reuses it), none creatable;
    # e1: its one nvidia-109 is held by a shut-off instance, which keeps it.
    assert found == [capacity.Capacity("nvidia-108", 1, 1), capacity.Capacity("nvidia-109", 1, 0)]
    assert capacity.capacity_text(found) == "nvidia-108: 1 used, 1 free; nvidia-109: 1 used, 0 free"


def test_capacity_of_vfio_vfs_holding_a_type(root):
    host = l40s_host(root)
    for address in ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6"):
        assign_vfio_type(host, address, 1139)
    running_guest(root, "instance-00000040", VM_1, pci_address="0000:81:00.5")
    # VFs count under the resource class they are published with; a guest holds one.
    published = {"CUSTOM_VGPU_L40S_12Q": ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6")}
    assert capacity.capacity(pci.discover(), published) == [
        capacity.Capacity("CUSTOM_VGPU_L40S_12Q", 1, 2)]
    # A VF holding a type that nova-compute was not given offers Nova nothing.
    assert capacity.capacity(pci.discover(), {}) == []


# What cannot be read counts as used, never as free, and the count says it is uncertain.
V100_108 = {"nvidia-108": ("0000:c1:00.0",)}  # c1: MDEV_A held by a running guest, MDEV_IDLE idle


def dangle(link):
    """A link whose target is gone: its name is there, nothing can be read through it."""
    link.unlink()
    link.symlink_to("gone")


def test_an_mdev_that_cannot_be_read_counts_as_used_never_as_free(v100_guests, root):
    assert capacity.capacity(pci.discover(), V100_108) == [capacity.Capacity("nvidia-108", 1, 1)]
    # Its type link gone: it counts for the type its parent is published with.
    dangle(root / "sys/bus/pci/devices/0000:c1:00.0" / MDEV_IDLE / "mdev_type")
    found = capacity.capacity(pci.discover(), V100_108)
    assert found == [capacity.Capacity("nvidia-108", 2, 0, 1)]
    assert capacity.capacity_text(found) == "nvidia-108: 2 used (1 uncertain), 0 free"
    # Its bus link dangling (its device gone, the link's text as the kernel wrote it): the
    # parent is still told by the link's text, so the other GPU's type is not touched.
    both = {"nvidia-108": ("0000:c1:00.0",), "nvidia-109": ("0000:e1:00.0",)}
    link = root / "sys/bus/mdev/devices" / MDEV_IDLE
    target = os.readlink(link)
    assert os.path.basename(os.path.dirname(target)) == "0000:c1:00.0"
    device = link.resolve()
    device.rename(device.with_name("gone"))
    assert os.readlink(link) == target and not link.exists()
    assert capacity.capacity(pci.discover(), both) == [
        capacity.Capacity("nvidia-108", 2, 0, 1), capacity.Capacity("nvidia-109", 1, 0)]
    # Not a link at all: its parent cannot be told, so it counts for every type.
    link.unlink()
    link.mkdir()
    assert capacity.capacity(pci.discover(), both) == [
        capacity.Capacity("nvidia-108", 2, 0, 1), capacity.Capacity("nvidia-109", 2, 0, 1)]


def test_an_mdev_bus_that_cannot_be_listed_counts_one_used_per_type(v100_guests, root):
    bus = root / "sys/bus/mdev/devices"
    bus.rename(root / "sys/bus/mdev/devices.away")
    bus.write_text("")  # a file where the directory is expected
    assert capacity.capacity(pci.discover(), V100_108) == [capacity.Capacity("nvidia-108", 1, 0, 1)]


def test_available_instances_that_cannot_be_read_count_as_one_used(v100_guests, root):
    available = root / "sys/bus/pci/devices/0000:c1:00.0/mdev_supported_types/nvidia-108/" \
                       "available_instances"
    available.unlink()
    available.mkdir()  # exists, cannot be read as a file
    assert capacity.capacity(pci.discover(), V100_108) == [capacity.Capacity("nvidia-108", 2, 1, 1)]


def test_while_a_domain_file_cannot_be_read_what_no_other_holds_counts_as_used(v100_guests, root):
    (root / "run/libvirt/qemu/instance-0000002d.xml").write_text("<domain><devices><hostdev")
    # The idle mdev may be the unreadable guest's.
    assert capacity.capacity(pci.discover(), V100_108) == [capacity.Capacity("nvidia-108", 2, 0, 1)]


def test_while_a_domain_file_cannot_be_read_no_vfio_vf_is_free(root):
    host = l40s_host(root)
    for address in ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6"):
        assign_vfio_type(host, address, 1139)
    running_guest(root, "instance-00000040", VM_1, pci_address="0000:81:00.5")
    (root / "etc/libvirt/qemu").mkdir(parents=True, exist_ok=True)
    (root / "etc/libvirt/qemu/instance-00000041.xml").write_text("<!DOCTYPE d><domain><hostdev/>")
    published = {"CUSTOM_VGPU_L40S_12Q": ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6")}
    assert capacity.capacity(pci.discover(), published) == [
        capacity.Capacity("CUSTOM_VGPU_L40S_12Q", 3, 0, 2)]


def test_capacity_text_is_bounded():
    entries = [capacity.Capacity(f"nvidia-{n}", 0, 1) for n in range(9)]
    assert capacity.capacity_text(entries) == (
        "nvidia-0: 0 used, 1 free; nvidia-1: 0 used, 1 free; nvidia-2: 0 used, 1 free; "
        "+6 more types (vgpu-usage)")


def test_status_line_shows_capacity_per_type(ctx, v100_guests, root, tools, packages):
    install_driver(root, packages["old"])
    tools.set_active(MGR)
    tools.set_active(VGPUD)
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{nvidia-108: [c1:00.0], nvidia-109: [e1:00.0]}"}, resource=packages["old"]))
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), nvidia-108 on 1, nvidia-109 on 1; "
        "nvidia-108: 1 used, 1 free; nvidia-109: 1 used, 0 free")
    # An mdev that cannot be read: used, and the count says it is uncertain.
    dangle(root / "sys/bus/pci/devices/0000:c1:00.0" / MDEV_IDLE / "mdev_type")
    out = ctx.run(ctx.on.update_status(), out)
    assert out.unit_status == testing.ActiveStatus(
        "2 GPUs (Tesla V100 PCIe 16GB), nvidia-108 on 1, nvidia-109 on 1; "
        "nvidia-108: 2 used (1 uncertain), 0 free; nvidia-109: 1 used, 0 free")


# -- prerequisites come first -------------------------------------------------------------------

def test_iommu_off_is_the_status_not_a_mapping_error_about_missing_vfs(ctx, root, tools, packages):
    """After a reboot without the IOMMU an A100 has no VFs: say what to fix first."""
    host = a100_host(root)
    (root / "sys/kernel/iommu_groups").rename(root / "iommu_groups_off")
    for index in range(4):  # no IOMMU, no VFs
        (host.bus / "0000:41:00.0").resolve().joinpath(f"virtfn{index}").unlink()
    install_driver(root, packages["old"])
    out = ctx.run(ctx.on.config_changed(), state(
        {"vgpu-device-mappings": "{nvidia-474: ['41:00.4', '41:00.5']}"}, resource=packages["old"]))
    assert out.unit_status == testing.BlockedStatus(
        "IOMMU is off but SR-IOV GPU 0000:41:00.0 needs it: add intel_iommu=on iommu=pt (Intel) "
        "or amd_iommu=on (AMD) to the kernel command line, enable VT-d/AMD-Vi in firmware, reboot")


def test_list_vgpu_types_counts_one_vgpu_per_free_vf_up_to_what_the_type_fits(root):
    """An SR-IOV A100 with mdev types on 16 VFs: 10C fits 4, 40C fits 1, whatever the VFs list."""
    from vgpu import report

    a100_host(root)
    lines = report.types_table(pci.with_available(pci.discover())).splitlines()[1:]
    rows = {next(w for w in line.split() if w.startswith("nvidia-")): line.split() for line in lines}
    assert rows["nvidia-474"][-2] == "4"   # GRID A100-10C: max_instance 4 on the GPU
    assert rows["nvidia-476"][-2] == "1"   # GRID A100-40C: the whole GPU
    assert rows["nvidia-471"][-2] == "10"  # GRID A100-4C: 10 fit, 16 VFs free


def test_an_mdev_type_without_a_readable_name_keeps_its_id_and_described_framebuffer(v100_guests, root):
    (root / "sys/bus/pci/devices/0000:c1:00.0/mdev_supported_types/nvidia-108/name").unlink()
    first = usage.in_use(pci.discover())[0]
    assert (first.type_id, first.profile, first.name_known, first.framebuffer_mb, first.edition) == (
        "nvidia-108", "nvidia-108", False, 8192, "unknown")
    results = usage.results([first])
    assert results["vgpus"]["vgpu-0"]["profile"] == "nvidia-108 (name unknown)"
    assert results["vgpus"]["vgpu-0"]["framebuffer-mb"] == "8192"
    assert " nvidia-108? " in results["table"] and " V100-8Q" not in results["table"]


def test_a_known_name_is_shown_as_it_is_in_the_table(v100_guests):
    results = usage.results(usage.in_use(pci.discover()))
    row = next(line for line in results["table"].splitlines() if "instance-0000002a" in line)
    assert row.split()[6:9] == ["V100-8Q", "8192", "MiB"]


def test_an_mdev_without_its_type_link_is_not_counted(v100_guests, root):
    # An mdev being torn down: its directory is there, its mdev_type link is gone.
    (root / "sys/bus/pci/devices/0000:c1:00.0" / MDEV_A / "mdev_type").unlink()
    assert [u.domain for u in usage.in_use(pci.discover())] == ["instance-0000002b"]


def test_a_guest_without_nova_metadata_is_reported_as_unknown(root):
    host = v100_host(root)
    host.add_mdev("0000:c1:00.0", "nvidia-108", MDEV_A)
    running_guest(root, "instance-0000002a", "", mdev_uuid=MDEV_A, project_id="", project_name="")
    uses = usage.in_use(pci.discover())
    assert usage.totals(uses)[1] == {("unknown", "unknown"): 1}
    results = usage.results(uses)
    entry = results["vgpus"]["vgpu-0"]
    assert (entry["instance"], entry["project-id"], entry["project"]) == ("unknown", "unknown", "unknown")
    assert results["projects"] == {"project-0": {"id": "unknown", "name": "unknown", "running-vgpus": "1",
                                                 "licences": {"rtx-virtual-workstation": "1"}}}


def test_a_description_without_a_framebuffer_leaves_it_to_the_name(v100_guests, root):
    (root / "sys/bus/pci/devices/0000:c1:00.0/mdev_supported_types/nvidia-108/"
     "description").write_text("num_heads=4, max_instance=2\n")
    assert usage.in_use(pci.discover())[0].framebuffer_mb == 8192


def test_capacity_counts_only_mdevs_of_the_type_on_the_published_functions(v100_guests):
    # nvidia-108 published on e1 only: the 108 mdevs on c1 and the 109 mdev on e1 are not its.
    (v100_guests.bus / "0000:e1:00.0/mdev_supported_types/nvidia-108/available_instances"
     ).write_text("0\n")
    assert capacity.capacity(pci.discover(), {"nvidia-108": ("0000:e1:00.0",)}) == [
        capacity.Capacity("nvidia-108", 0, 0)]
    assert capacity.capacity(pci.discover(), {"nvidia-108": ("0000:c1:00.0",)}) == [
        capacity.Capacity("nvidia-108", 1, 1)]  # the running guest's, and the idle one
