"""MIG geometry, counts, placements and MIG mode through the stand-in nvidia-smi."""

import pytest

from unit_tests.fakehost import h200_sxm_host, rtx_pro_6000_host
from vgpu import mig, miginstances, pci, profiles
from vgpu.errors import MigError, MigInUseError

H200_GPU = pci.Gpu("0000:18:00.0", "0x2335", "H200 SXM 141GB", "nvidia", "0x030200")
RTX_GPU = pci.Gpu("0000:42:00.0", "0x2bb5", "RTX PRO 6000", "nvidia", "0x030200")


def profile(name):
    return profiles.profile(name)


# Every row of each GPU model's GPU instance profiles, written out from the sources in
# vgpu.mig's module doc: NVIDIA's MIG user guide, "Supported MIG Profiles" (names, compute
# slices, instances per GPU) and the placements nvidia-smi mig -lgipp prints (start:size, in
# memory slices); the RTX PRO 6000's placements inferred as the module doc says.
# (name, compute slices, GB, memory slices, placements, most per GPU, media)
HOPPER_ROWS = [  # 1g, 1g+me, 1g x2 memory, 2g, 3g, 4g, 7g; GB of the H200 141GB, then the H100 80GB
    ("1g.{}gb", 1, 1, (0, 1, 2, 3, 4, 5, 6), 7, False),
    ("1g.{}gb+me", 1, 1, (0, 1, 2, 3, 4, 5, 6), 1, True),
    ("1g.{}gb", 1, 2, (0, 2, 4, 6), 4, False),
    ("2g.{}gb", 2, 2, (0, 2, 4), 3, False),
    ("3g.{}gb", 3, 4, (0, 4), 2, False),
    ("4g.{}gb", 4, 4, (0,), 1, False),
    ("7g.{}gb", 7, 8, (0,), 1, False),
]
GUIDE = {
    "H200 141GB": (7, 8, [(name.format(gb), slices, gb, size, starts, most, media)
                          for (name, slices, size, starts, most, media), gb
                          in zip(HOPPER_ROWS, (18, 18, 35, 35, 71, 71, 141))]),
    "H100 80GB": (7, 8, [(name.format(gb), slices, gb, size, starts, most, media)
                         for (name, slices, size, starts, most, media), gb
                         in zip(HOPPER_ROWS, (10, 10, 20, 20, 40, 40, 80))]),
    "RTX PRO 6000 Blackwell Server Edition": (4, 4, [
        ("1g.24gb", 1, 24, 1, (0, 1, 2, 3), 4, False),
        ("2g.48gb", 2, 48, 2, (0, 2), 2, False),
        ("4g.96gb", 4, 96, 4, (0,), 1, False),
    ]),
}


@pytest.mark.parametrize("device_id, model", [
    ("0x2335", "H200 141GB"), ("0x233b", "H200 141GB"), ("0x2330", "H100 80GB"),
    ("0x2331", "H100 80GB"), ("0x2bb5", "RTX PRO 6000 Blackwell Server Edition"),
])
def test_every_gpu_instance_profile_row_is_the_guide_s(device_id, model):
    shape = profiles.GEOMETRIES[device_id]
    compute, memory, rows = GUIDE[model]
    assert (shape.model, shape.compute_slices, shape.memory_slices) == (model, compute, memory)
    assert [(gi.name, gi.slices, gi.memory_gb, gi.size, gi.starts, gi.most, gi.media)
            for gi in shape.profiles] == rows
    for gi in shape.profiles:  # each placement lies within the GPU's memory slices
        assert all(start % gi.size == 0 or gi.size == 1 for start in gi.starts), gi.name
        assert max(gi.starts) + gi.size <= shape.memory_slices, gi.name


def test_the_geometries_cover_the_guide_s_models_and_no_others():
    assert {shape.model for shape in profiles.GEOMETRIES.values()} == set(GUIDE)


@pytest.mark.parametrize("name, fits, gi", [
    # NVIDIA's Hopper vGPU table: H200X-1-18C 7, -1-35C 4, -2-35C 3, -3-71C 2, -4-71C 1, -7-141C 1.
    ("H200X-1-18C", 7, "1g.18gb"), ("H200X-1-35C", 4, "1g.35gb"), ("H200X-2-35C", 3, "2g.35gb"),
    ("H200X-3-71C", 2, "3g.71gb"), ("H200X-4-71C", 1, "4g.71gb"), ("H200X-7-141C", 1, "7g.141gb"),
    ("H200X-1-18CME", 1, "1g.18gb+me"),
])
def test_h200_counts_come_from_the_profile_and_its_gpu_instance(name, fits, gi):
    found = profiles.slot(profiles.H200, profile(name))
    assert (found.fits, found.instance.name) == (fits, gi)
    assert profiles.fits(H200_GPU, profile(name)) == fits


@pytest.mark.parametrize("name, fits, per", [
    ("DC-1-24Q", 4, 1), ("DC-1-8Q", 12, 3), ("DC-1-2Q", 48, 12),  # cubecos PR 1223: 48 DC-1-2Q
    ("DC-2-48Q", 2, 1), ("DC-2-12Q", 8, 4), ("DC-4-96Q", 1, 1), ("DC-4-24Q", 4, 4),
])
def test_rtx_pro_6000_counts(name, fits, per):
    found = profiles.slot(profiles.RTX_PRO_6000, profile(f"NVIDIA RTX Pro 6000 Blackwell {name}"))
    assert (found.fits, found.per_instance) == (fits, per)


def test_no_gpu_instance_or_no_table_gives_no_count():
    assert profiles.slot(profiles.H200, profile("H200X-5-71C")) is None  # no 5g profile
    assert profiles.slot(profiles.H200, profile("H200X-1-72C")) is None  # more memory than a 1g holds
    assert profiles.slot(profiles.H200, profile("H200X-18C")) is None  # time-sliced
    assert profiles.fits(H200_GPU._replace(device_id="0x20f1"), profile("A100-1-5C")) is None


def test_addresses_in_both_spellings():
    assert mig.smi_address("0001:c8:00.0") == "00000001:C8:00.0"
    assert mig.sysfs_address("00000001:C8:00.0") == "0001:c8:00.0"
    assert mig.enable_command("0000:42:00.0") == "nvidia-smi -i 00000000:42:00.0 -mig 1"
    assert mig.parse_modes("00000000:42:00.0, Enabled, Enabled\n00000000:8C:00.0, [N/A], [N/A]\n"
                           "garbage\n") == {"0000:42:00.0": mig.Mode("Enabled", "Enabled"),
                                            "0000:8c:00.0": mig.Mode("[N/A]", "[N/A]")}


def test_modes_are_read_with_one_nvidia_smi_run(root, tools):
    rtx_pro_6000_host(root, vfs=2, gpus=2, mig="Disabled")
    modes = mig.modes(["0000:42:00.0", "0000:8c:00.0"])
    assert not modes["0000:42:00.0"].enabled
    assert [c for c in tools.calls() if c.startswith("nvidia-smi")] == [
        "nvidia-smi --query-gpu=pci.bus_id,mig.mode.current,mig.mode.pending --format=csv,noheader"]
    with pytest.raises(MigError, match="does not report the MIG mode of GPU 0001:04:00.0"):
        mig.modes(["0001:04:00.0"])


def test_modes_without_nvidia_smi_is_an_error(root, tools):
    h200_sxm_host(root, vfs=1)
    with pytest.raises(MigError, match="usr/bin/nvidia-smi not found"):
        mig.modes(["0000:18:00.0"])


def test_enable_turns_mig_mode_on_or_says_it_is_pending(root, tools):
    host = rtx_pro_6000_host(root, vfs=1, gpus=3, mig="Disabled")
    done = mig.enable("0000:42:00.0")
    assert done.output == "Enabled MIG Mode for GPU 00000000:42:00.0\nAll done."
    assert not done.pending and host.mig_mode("0000:42:00.0")["current"] == "Enabled"
    host.install_nvidia_smi({"0000:8c:00.0": "busy", "0001:04:00.0": "reset"})
    busy = mig.enable("0000:8c:00.0")
    assert busy.pending and mig.pending_warning(busy.output)
    assert busy.mode == mig.Mode("Disabled", "Enabled") and busy.mode.enable_pending
    host.set_mig("0000:8c:00.0", busy=False)  # the other client stopped: -mig 1 again
    assert not mig.enable("0000:8c:00.0").pending
    with pytest.raises(MigError, match="nvidia-smi -i 00000000:C8:00.0 -mig 1 failed: "
                                       "No devices were found"):
        mig.enable("0000:c8:00.0")


def test_writing_a_type_creates_no_gpu_instance(root):
    """NVIDIA's vGPU for Compute guide: on KVM the GPU instances are created first."""
    from vgpu import vfio
    from vgpu.errors import VfTypeError

    host = h200_sxm_host(root, vfs=2, mig="Enabled")
    vf = "0000:18:00.4"
    assert vfio.creatable(vf) == ()  # no GPU instance: nothing MIG-backed is creatable
    with pytest.raises(VfTypeError, match="holds 0 after writing 1414"):
        vfio.assign(vf, 1414)  # H200X-1-18C
    assert host.gpu_instances(H200) == []
    miginstances.create(H200, "1g.18gb", 1)
    assert [t.number for t in vfio.creatable(vf)] == [1414]
    vfio.assign(vf, 1414)
    assert miginstances.instance_id(vf) == "1"
    assert miginstances.used(H200) == {1: [vf]}
    vfio.assign(vf, 0)
    assert miginstances.instance_id(vf) is None and miginstances.used(H200) == {}


H200 = "0000:18:00.0"
NEED = miginstances.Need(H200, "H200X-2-35C", "2g.35gb", 3)


def test_listing_parses_nvidia_smis_tables(root, tools):
    host = h200_sxm_host(root, vfs=2, mig="Enabled")
    assert miginstances.instances(H200) == []  # "No GPU instances found": none, not an error
    offers = miginstances.offered(H200)
    assert offers["1g.18gb"] == miginstances.Offered("1g.18gb", 19, 7, 7)
    assert offers["1g.18gb+me"] == miginstances.Offered("1g.18gb+me", 20, 1, 1)
    assert offers["7g.141gb"] == miginstances.Offered("7g.141gb", 0, 1, 1)
    assert miginstances.create(H200, "3g.71gb", 1).startswith("Successfully created GPU instance ID  1")
    assert miginstances.instances(H200) == [miginstances.GpuInstance(1, "3g.71gb", 0, 4)]
    assert miginstances.offered(H200)["3g.71gb"].free == 1 and miginstances.offered(H200)["4g.71gb"].free == 0
    assert host.gpu_instances(H200) == ["1:3g.71gb@0"]
    host.set_mig(H200, current="Disabled")
    with pytest.raises(MigError, match="-lgi failed: No MIG-enabled devices found"):
        miginstances.instances(H200)


def test_layout_keeps_what_fits_destroys_only_what_is_unused_and_never_what_is_in_use():
    gi = miginstances.GpuInstance
    assert miginstances.layout(NEED, [gi(1, "2g.35gb", 0, 2)] * 3, {}) == miginstances.Layout()
    assert miginstances.layout(NEED, [gi(1, "2g.35gb", 0, 2)], {}) == miginstances.Layout(create=2)
    other = gi(5, "1g.18gb", 6, 1)
    assert miginstances.layout(NEED, [other], {}) == miginstances.Layout(destroy=(other,), create=3)
    held = miginstances.layout(NEED, [other], {5: ["0000:18:00.4"]})
    assert held.create == 0 and held.destroy == () and held.held == ("0000:18:00.4",)
    assert held.problem == (
        "GPU 0000:18:00.0: MIG-backed H200X-2-35C needs 3 x 2g.35gb GPU instances, but GPU "
        "instance 5 (1g.18gb) holds the vGPUs of VF 0000:18:00.4; the charm never destroys a GPU "
        "instance in use. Move or delete the guests on those VFs, release each VF (echo 0 > "
        "/sys/bus/pci/devices/<VF>/nvidia/current_vgpu_type), then run nvidia-smi mig -i "
        "00000000:18:00.0 -dci -gi 5; nvidia-smi mig -i 00000000:18:00.0 -dgi -gi 5; the next "
        "hook creates the rest")
    short = miginstances.layout(NEED, [], {}, {"2g.35gb": miginstances.Offered("2g.35gb", 14, 2, 3)})
    assert short.problem == ("GPU 0000:18:00.0: MIG-backed H200X-2-35C needs 3 x 2g.35gb GPU "
                             "instances, 0 exist and nvidia-smi mig -lgip lists 2 creatable")
    assert "does not offer it" in miginstances.layout(NEED, [], {}, {}).problem
    # Others to destroy: the profile's Total less the instances kept, whatever Free says now.
    kept = gi(1, "2g.35gb", 0, 2)
    assert miginstances.layout(NEED, [kept, other], {},
                               {"2g.35gb": miginstances.Offered("2g.35gb", 14, 0, 3)}) == \
        miginstances.Layout(destroy=(other,), create=2)
    assert miginstances.layout(NEED, [kept, other], {}, {"2g.35gb": miginstances.Offered("2g.35gb", 14, 0, 2)}
                      ).problem.endswith("1 exist and nvidia-smi mig -lgip lists 2 in all")


def test_ensure_creates_what_is_missing_and_replaces_only_unused_instances(root, tools):
    from vgpu import vfio

    host = h200_sxm_host(root, vfs=2, mig="Enabled")
    miginstances.create(H200, "1g.18gb", 2)
    before = len(tools.calls())
    assert miginstances.ensure(NEED) == ["GPU instance 1 (1g.18gb, unused) destroyed",
                                "GPU instance 2 (1g.18gb, unused) destroyed",
                                "3 x 2g.35gb GPU instances created"]
    # -lgip once, before anything is destroyed.
    assert [c.split()[-1] for c in tools.calls()[before:] if " -lgi" in c] == ["-lgi", "-lgip"]
    assert [c for c in tools.calls()[before:] if "-lgip" in c or "-dgi" in c][0].endswith("-lgip")
    assert host.gpu_instances(H200) == ["1:2g.35gb@0", "2:2g.35gb@2", "3:2g.35gb@4"]
    assert miginstances.ensure(NEED) == []  # there already: nothing run but the listing
    # A VF's vGPU in an instance of another profile: the layout stays, the steps are said.
    vfio.assign("0000:18:00.4", 1416)
    before = len(tools.calls())
    with pytest.raises(MigInUseError, match="holds the vGPUs of VF 0000:18:00.4") as caught:
        miginstances.ensure(miginstances.Need(H200, "H200X-1-18C", "1g.18gb", 7))
    assert caught.value.vfs == ("0000:18:00.4",)
    assert host.gpu_instances(H200) == ["1:2g.35gb@0", "2:2g.35gb@2", "3:2g.35gb@4"]
    assert not [c for c in tools.calls()[before:] if "-dci" in c or "-dgi" in c or "-cgi" in c]
    # The stand-in refuses to destroy it too, as the driver would.
    with pytest.raises(MigError, match="In use by another client"):
        miginstances.destroy(H200, 1)


def test_nothing_is_destroyed_for_instances_that_would_not_fit_once_the_others_are_gone(root, tools):
    """-lgip, read before destroying: the profile's Total less those kept is what will fit."""
    host = h200_sxm_host(root, vfs=2, mig="Enabled")
    miginstances.create(H200, "1g.18gb", 1)  # unused: in the way of the +me instances only by slices
    before = len(tools.calls())
    with pytest.raises(MigError) as error:
        miginstances.ensure(miginstances.Need(H200, "H200X-1-18C", "1g.18gb+me", 2))
    assert str(error.value) == ("GPU 0000:18:00.0: MIG-backed H200X-1-18C needs 2 x 1g.18gb+me GPU "
                                "instances, 0 exist and nvidia-smi mig -lgip lists 1 in all")
    assert host.gpu_instances(H200) == ["1:1g.18gb@0"]
    assert not [c for c in tools.calls()[before:] if "-dci" in c or "-dgi" in c or "-cgi" in c]
    # -lgip that cannot be read: nothing is destroyed either.
    smi = root / "usr/bin/nvidia-smi"
    smi.rename(smi.with_name("nvidia-smi.real"))
    smi.write_text('#!/bin/sh\ncase "$*" in *-lgip*) echo "Unknown Error"; exit 255 ;; esac\n'
                   f'exec "{smi}.real" "$@"\n')
    smi.chmod(0o755)
    with pytest.raises(MigError, match="-lgip failed: Unknown Error"):
        miginstances.ensure(miginstances.Need(H200, "H200X-7-141C", "7g.141gb", 1))
    assert host.gpu_instances(H200) == ["1:1g.18gb@0"]
    smi.with_name("nvidia-smi.real").replace(smi)
    # One that fits once the other is gone: destroyed, then created, -lgip read once.
    before = len(tools.calls())
    assert miginstances.ensure(miginstances.Need(H200, "H200X-7-141C", "7g.141gb", 1)) == [
        "GPU instance 1 (1g.18gb, unused) destroyed", "1 x 7g.141gb GPU instance created"]
    assert len([c for c in tools.calls()[before:] if c.endswith("-lgip")]) == 1
    assert host.gpu_instances(H200) == ["1:7g.141gb@0"]


def test_the_stand_ins_model_what_real_hosts_do_at_a_reboot_and_with_sriov_manage(root, tools):
    """Hopper/Blackwell lose MIG mode at a reboot, Ampere keeps it; GPU instances never survive.

    sriov-manage -e turns persistence mode on and (in one model) wipes MIG state; a GPU
    reset is refused then, and while the GPU has VFs (NVIDIA/NVSentinel#1690).
    """
    import subprocess

    host = h200_sxm_host(root, vfs=2, mig="Enabled")
    miginstances.create(H200, "7g.141gb", 1)
    host.reboot()
    assert host.gpu_instances(H200) == [] and mig.modes([H200])[H200] == mig.Mode("Disabled",
                                                                                    "Disabled")
    host.set_mig(H200, reboot="keeps", current="Enabled", pending="Enabled")  # Ampere
    miginstances.create(H200, "7g.141gb", 1)
    host.reboot()
    assert miginstances.instances(H200) == [] and mig.modes([H200])[H200].enabled
    smi = str(root / "usr/bin/nvidia-smi")
    reset = subprocess.run([smi, "-r", "-i", "00000000:18:00.0"], capture_output=True, text=True)
    assert reset.returncode == 0, reset.stdout  # no VFs, persistence mode off: a reset works
    host.install_sriov_manage()
    assert subprocess.run([str(root / "usr/lib/nvidia/sriov-manage"), "-e", H200]).returncode == 0
    assert host.mig_mode(H200)["persistence"] and host.mig_mode(H200)["current"] == "Disabled"
    reset = subprocess.run([smi, "-r", "-i", "00000000:18:00.0"], capture_output=True, text=True)
    assert reset.returncode == 255 and "In use by another client" in reset.stdout


def test_every_rtx_pro_6000_mig_type_sits_on_gfx_instances_and_gfx_names_it_too(root):
    """Every RTX PRO 6000 MIG-backed type on +gfx instances; ``...GFX`` names the same type.

    NVIDIA/vgpu-device-manager pkg/vgpu/config.go (main): on the RTX PRO 6000 Blackwell every
    MIG-backed type is supported only on +gfx GPU instances and no type name carries GFX;
    ``DC-1-24QGFX`` means ``DC-1-24Q`` on ``1g.24gb+gfx`` (the suffix stripped).
    """
    assert (profile("NVIDIA RTX Pro 6000 Blackwell DC-1-24QGFX")
            == profiles.Profile("RTX Pro 6000 Blackwell DC-1-24QGFX", "RTX Pro 6000 Blackwell DC", 24,
                           "Q", True, 1, gfx=True))
    assert not profile("DC-1-24Q").gfx and profile("DC-1-24CGFX").series == "C"
    assert profiles.without_gfx("NVIDIA RTX Pro 6000 Blackwell DC-1-24QGFX") == (
        "NVIDIA RTX Pro 6000 Blackwell DC-1-24Q")
    assert profiles.without_gfx("DC-1-24Q") is None and profiles.without_gfx("DC-24Q") is None
    shape = profiles.RTX_PRO_6000
    for name in ("DC-1-24Q", "DC-1-24QGFX"):
        assert profiles.instance_name(profiles.slot(shape, profile(name)).instance, profile(name),
                                 shape) == "1g.24gb+gfx"
    assert profiles.instance_name(profiles.slot(profiles.H200, profile("H200X-1-18C")).instance,
                             profile("H200X-1-18C"), profiles.H200) == "1g.18gb"
    assert profiles.slot(profiles.H200, profile("H200X-1-18CGFX")) is None  # no +gfx profiles there
    host = rtx_pro_6000_host(root, vfs=8, gpus=2, mig="Enabled")
    found = miginstances.mapped({"DC-2-12QGFX": ("0000:42:00.0",), "DC-1-24Q": ("0000:8c:00.0",)},
                       pci.discover())
    assert found == {"0000:42:00.0": miginstances.Need("0000:42:00.0", "DC-2-12Q", "2g.48gb+gfx", 2),
                     "0000:8c:00.0": miginstances.Need("0000:8c:00.0", "DC-1-24Q", "1g.24gb+gfx", 4)}
    # What the driver says (NVML) wins over the name, GPU by GPU.
    driver = {"0000:8c:00.0": {"NVIDIA RTX Pro 6000 Blackwell DC-1-24Q": "1g.24gb"}}
    assert miginstances.mapped({"DC-1-24Q": ("0000:8c:00.0",)}, pci.discover(), driver) == {
        "0000:8c:00.0": miginstances.Need("0000:8c:00.0", "DC-1-24Q", "1g.24gb", 4)}
    miginstances.ensure(found["0000:8c:00.0"])
    assert host.gpu_instances("0000:8c:00.0") == [f"{n}:1g.24gb+gfx@{n - 1}" for n in (1, 2, 3, 4)]
    # A VF lists the type (its name without GFX) only once a +gfx instance has room for it.
    listed = (root / "sys/bus/pci/devices/0000:8c:00.2/nvidia/creatable_vgpu_types").read_text()
    assert "DC-1-24Q\n" in listed + "\n" and "GFX" not in listed
    found = miginstances.mapped({"DC-2-12Q": ("0000:42:00.0",), "H200X-1-18C": ("all",)}, pci.discover())
    assert found == {"0000:42:00.0": miginstances.Need("0000:42:00.0", "DC-2-12Q", "2g.48gb+gfx", 2)}
    # VF by VF: 5 VFs of 4 per instance take 2 instances.
    vfs = tuple(f"0000:8c:00.{n}" for n in range(2, 7))
    assert miginstances.mapped({"DC-2-12Q": vfs}, pci.discover())["0000:8c:00.0"].gis == 2
    # Two MIG-backed profiles on one GPU: none (the plan refuses the mapping).
    assert miginstances.mapped({"DC-2-12Q": vfs[:1], "DC-1-24Q": vfs[1:2]}, pci.discover()) == {}
    miginstances.ensure(found["0000:42:00.0"])
    assert host.gpu_instances("0000:42:00.0") == ["1:2g.48gb+gfx@0", "2:2g.48gb+gfx@2"]


def test_a_partly_failed_cgi_says_nvidia_smis_reason_not_its_first_line(root, tools):
    host = h200_sxm_host(root, vfs=2, mig="Enabled")
    host.set_mig(H200, gis=[{"id": 9, "profile": "1g.18gb", "start": 6, "size": 1}])
    with pytest.raises(MigError) as failed:
        miginstances.create(H200, "2g.35gb", 4)  # three fit beside the one at slice 6, the fourth does not
    assert str(failed.value) == (
        "nvidia-smi mig -i 00000000:18:00.0 -cgi 2g.35gb,2g.35gb,2g.35gb,2g.35gb -C failed: Unable "
        "to create a GPU instance on GPU 0 using profile 2g.35gb: Insufficient Resources (3 GPU "
        "instances created before that)")


def test_boot_needs_take_only_what_the_charm_writes():
    good = {"address": H200, "mig": NEED.data()}
    assert miginstances.boot_needs({"gpus": [good]}) == {H200: NEED}
    for bad in ({"address": H200, "mig": dict(NEED.data(), count=True)},
                {"address": "18:00.0", "mig": NEED.data()},
                {"address": H200, "mig": dict(NEED.data(), instance="2g; reboot")},
                {"address": H200, "mig": dict(NEED.data(), count=9)}):
        assert miginstances.boot_needs({"gpus": [bad]}) == {}


def test_mode_problems_count_what_cannot_be_read_as_out_of_mig_mode(root, tools):
    h200_sxm_host(root, vfs=1)  # no nvidia-smi
    assert mig.mode_problems({"0000:18:00.0": ["H200X-1-18C"]}, "gpu/0") == [
        "cannot tell whether GPU 0000:18:00.0 is in MIG mode, which MIG-backed profiles need: "
        "/usr/bin/nvidia-smi not found (is the vGPU host driver installed?); no VF changed"]
    assert mig.mode_problems({}, "gpu/0") == []


def test_a_vf_whose_type_cannot_be_read_counts_as_in_use(root):
    """used() never calls a GPU instance free on a VF it could not read: ensure() may destroy it."""
    from vgpu import vfio

    h200_sxm_host(root, vfs=2, mig="Enabled")
    vf = "0000:18:00.4"
    miginstances.create(H200, "1g.18gb", 1)
    vfio.assign(vf, 1414)
    current = root / "sys/bus/pci/devices" / vf / "nvidia/current_vgpu_type"
    current.unlink()
    current.mkdir()  # exists, cannot be read as a file
    with pytest.raises(MigError, match=f"VF {vf}.*cannot be read"):
        miginstances.used(H200)
