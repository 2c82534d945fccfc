"""The boot step of nvidia-vgpu-vfs.service, run against fixture trees.

Hosts after a reboot: GPUs without VFs until the stand-in sriov-manage
creates them, and (L40S, H200) the fixture's VFIO kernel model, in which a
VF's creatable_vgpu_types shrinks as its siblings take types. The boot step
runs in this process (so the kernel model applies), with the fake systemctl
answering for nvidia-vgpu-mgr; one test runs the unit's own ExecStart line.
"""

import json
import logging
import os
import shlex
import stat
import subprocess
import sys
import threading
import time

import pytest

from unit_tests.fakehost import L40S_TYPES, FakeHost, a100_host, l40s_host, settle_mdevs, v100_host
from unit_tests.faketools import stand_in
from unit_tests.libvirt import defined_guest, running_guest
from vgpu import boot, mdevs, pci, sriov

MGR = "nvidia-vgpu-mgr"
L40S, H200 = "0000:81:00.0", "0000:c1:00.0"
# Small bounds: every wait below is a fraction of a second to a few seconds.
FAST = {"total": 20, "manager": 5, "call": 10, "attempts": 3, "delay": 0.05, "poll": 0.05}


def vfs(pf: str, count: int):
    return [f"{pf[:-4]}{(4 + n) // 8:02x}.{(4 + n) % 8}" for n in range(count)]


def current(root, address: str) -> int:
    return int((root / f"sys/bus/pci/devices/{address}/nvidia/current_vgpu_type").read_text())


def types_of(root, pf: str, count: int):
    return [current(root, a) for a in vfs(pf, count)]


def gpu(address, profiles=(), name=None, number=0):
    """One GPU's entry: VFs 0.. given ``profiles`` in order (or ``count`` copies of ``name``)."""
    return {"address": address, "model": "x",
            "vfs": [{"index": n, "name": p, "number": number} for n, p in enumerate(profiles)]}


def data(*gpus, limits=None, wait_for=(MGR,)):
    return {"version": 1, "wait_for": list(wait_for), "limits": dict(FAST, **(limits or {})),
            "gpus": list(gpus)}


def sriov_calls(tools):
    return [c for c in tools.calls() if c.startswith("sriov-manage")]


@pytest.fixture
def rebooted(root, tools):
    """An L40S and an H200 after a reboot: no VFs yet, the vGPU manager up."""
    host = l40s_host(root, enabled=False)
    host.install_sriov_manage()
    tools.set_active(MGR)
    return host


@pytest.fixture
def journal(caplog):
    caplog.set_level(logging.INFO, logger="vgpu.boot")
    caplog.set_level(logging.INFO, logger="vgpu.mig")  # the boot step's MIG part, same journal
    caplog.set_level(logging.INFO, logger="vgpu.miginstances")
    return caplog


def said(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name in ("vgpu.boot", "vgpu.mig", "vgpu.miginstances")]


def test_both_gpus_get_their_vfs_and_types_by_name(rebooted, root, tools, journal):
    rc = boot.restore(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 4, number=1139),
                           gpu(H200, ["H200X-35C"] * 2)))
    assert rc == 0
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert types_of(root, H200, 3) == [1282, 1282, 0]
    assert sorted(sriov_calls(tools)) == [f"sriov-manage -e {L40S}", f"sriov-manage -e {H200}"]
    lines = said(journal)
    assert f"GPU {L40S}: 16 virtual functions enabled by sriov-manage -e (attempt 1)" in lines
    assert (f"GPU {L40S}: VF 0000:81:00.4 (virtfn0) now holds NVIDIA L40S-12Q "
            "(nvidia-1139)") in lines
    assert f"GPU {H200}: VF 0000:c1:00.5 (virtfn1) now holds NVIDIA H200X-35C (nvidia-1282)" in lines
    assert lines[-1] == "restored 2 of 2 GPUs"


def test_the_first_gpus_sriov_manage_failing_does_not_stop_the_second(rebooted, root, tools,
                                                                        journal):
    rebooted.fail_sriov_manage(L40S)
    rc = boot.restore(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 4), gpu(H200, ["NVIDIA H200X-35C"] * 4)))
    assert rc == 1  # the unit shows failed: not everything was restored
    assert not (root / f"sys/bus/pci/devices/{L40S}/virtfn0").exists()
    assert types_of(root, H200, 5) == [1282] * 4 + [0]
    # Retried (bounded); the other GPU, after it, once.
    assert sorted(sriov_calls(tools)) == [f"sriov-manage -e {L40S}"] * 3 + [f"sriov-manage -e {H200}"]
    lines = said(journal)
    assert (f"GPU {L40S}: sriov-manage -e attempt 1 of 3 failed: sriov-manage -e {L40S} failed: "
            f"Enabling VFs on {L40S} failed: Input/output error") in lines
    assert f"GPU {L40S}: no virtual functions after 3 attempts; its vGPU types are not restored" \
        in lines
    assert lines[-1] == f"restored 1 of 2 GPUs; not restored: {L40S}"


def test_types_renumbered_by_a_driver_upgrade_are_found_by_name(root, tools, journal):
    # The unit's data was written under the old driver (L40S-12Q was 1139); the new one
    # numbers every type 1000 higher.
    host = FakeHost(root)
    host.pci_ids()
    host.iommu_groups(2)
    renumbered = {n + 1000: name for n, name in L40S_TYPES.items()}
    host.add_sriov_gpu(L40S, device="0x26b9", vf_device="0x26ba", count=8, vfio_types=renumbered,
                       enabled=False)
    host.install_sriov_manage()
    tools.set_active(MGR)
    rc = boot.restore(data(gpu(L40S, ["NVIDIA L40S-24Q", "L40S-24Q"], number=1141)))
    assert rc == 0
    assert types_of(root, L40S, 3) == [2141, 2141, 0]
    assert (f"GPU {L40S}: VF 0000:81:00.5 (virtfn1) now holds NVIDIA L40S-24Q (nvidia-2141)"
            in said(journal))


def test_each_vf_list_is_read_again_before_its_write(rebooted, root, tools, journal):
    # Two 24Q fill the 48 GB L40S: a third finds nothing creatable and is not written,
    # while the first two are (the lists shrink as siblings take types).
    started = time.monotonic()
    rc = boot.restore(data(gpu(L40S, ["L40S-24Q"] * 3)))
    assert rc == 1
    assert time.monotonic() - started < 5  # a full GPU is not waited for as a starting one
    assert types_of(root, L40S, 3) == [1141, 1141, 0]
    assert (f"GPU {L40S}: VF 0000:81:00.6 (virtfn2) lists nothing creatable: L40S-24Q not given"
            in said(journal))


def test_a_name_the_driver_no_longer_lists_is_said_with_what_it_lists(rebooted, root, journal):
    assert boot.restore(data(gpu(L40S, ["L40S-3Q"]))) == 1
    assert current(root, "0000:81:00.4") == 0
    assert (f"GPU {L40S}: VF 0000:81:00.4 (virtfn0) does not list L40S-3Q; it lists "
            "L40S-2B, L40S-4Q, L40S-12Q, L40S-16Q, L40S-24Q, L40S-48Q") in said(journal)


def test_the_boot_step_waits_for_the_manager_that_comes_up_late(root, tools, journal):
    host = l40s_host(root, enabled=False)
    host.install_sriov_manage()
    # The real sriov-manage fails while the vGPU manager is not up: so does this one.
    real = root / sriov.SRIOV_MANAGE
    real.rename(real.with_name("sriov-manage.real"))
    stand_in(real, f'#!/bin/sh\ngrep -qx active "$FAKE_STATE/{MGR}" 2>/dev/null || '
                   '{ echo "nvidia-vgpu-mgr is not running" >&2; exit 1; }\n'
                   f'exec {real.with_name("sriov-manage.real")} "$@"\n')
    tools.set_active(MGR, False)
    later = threading.Timer(0.6, tools.set_active, (MGR,))
    later.start()
    try:
        started = time.monotonic()
        rc = boot.restore(data(gpu(L40S, ["L40S-12Q"]), limits={"attempts": 1}))
    finally:
        later.cancel()
    assert rc == 0
    assert time.monotonic() - started >= 0.6
    assert types_of(root, L40S, 2) == [1139, 0]
    polls = [c for c in tools.calls() if c == f"systemctl is-active {MGR}"]
    assert len(polls) >= 2
    assert any(line.startswith(f"{MGR} is active after ") for line in said(journal))


def test_a_failed_attempt_is_retried_after_a_pause(rebooted, root, tools, journal, tmp_path):
    real = root / sriov.SRIOV_MANAGE
    real.rename(real.with_name("sriov-manage.real"))
    once = tmp_path / "failed-once"
    stand_in(real, f'#!/bin/sh\nif [ ! -e {once} ]; then touch {once}; '
                   'echo "NVRM: GPU not ready" >&2; exit 1; fi\n'
                   f'exec {real.with_name("sriov-manage.real")} "$@"\n')
    started = time.monotonic()
    assert boot.restore(data(gpu(H200, ["H200X-70C"]), limits={"delay": 0.5})) == 0
    assert time.monotonic() - started >= 0.5  # it paused before trying again
    assert types_of(root, H200, 2) == [1283, 0]
    assert f"GPU {H200}: 8 virtual functions enabled by sriov-manage -e (attempt 2)" in said(journal)


def test_the_total_time_is_bounded_however_the_tools_hang(rebooted, root, tools, journal, tmp_path):
    tried = tmp_path / "tried"
    stand_in(root / sriov.SRIOV_MANAGE, f'#!/bin/sh\necho "$2" >> {tried}\nexec sleep 60\n')
    tools.set_active(MGR, False)  # and the manager never comes up
    started = time.monotonic()
    rc = boot.restore(data(gpu(L40S, ["L40S-12Q"]), gpu(H200, ["H200X-35C"]),
                           limits={"total": 3, "manager": 1, "call": 300}))
    took = time.monotonic() - started
    assert rc == 1
    assert took < 4.5, took
    # One at a time, each an even share of the time left: the first's hang did not starve the second.
    assert tried.read_text().split() == [L40S, H200]  # one after the other, each its share
    lines = said(journal)
    assert any(line.startswith(f"{MGR} not active after ") for line in lines)
    assert any(line.startswith(f"GPU {L40S}: sriov-manage -e attempt 1 of 3 failed: ")
               and "timed out" in line for line in lines)
    assert lines[-1] == f"restored 0 of 2 GPUs; not restored: {L40S}, {H200}"


def test_a_gpu_bound_to_another_driver_is_left_alone(rebooted, root, tools, journal):
    link = root / f"sys/bus/pci/devices/{H200}/driver"
    link.unlink()
    (root / "sys/bus/pci/drivers/vfio-pci").mkdir(parents=True)
    link.symlink_to(os.path.relpath(root / "sys/bus/pci/drivers/vfio-pci", link.parent))
    assert boot.restore(data(gpu(L40S, ["L40S-12Q"]), gpu(H200, ["H200X-35C"]))) == 0
    assert sriov_calls(tools) == [f"sriov-manage -e {L40S}"]
    assert (f"GPU {H200}: bound to vfio-pci, not nvidia: left alone (whole-GPU passthrough?)"
            in said(journal))


def test_without_the_iommu_nothing_is_tried(rebooted, root, tools, journal):
    (root / "sys/kernel/iommu_groups").rename(root / "iommu_groups_off")
    assert boot.restore(data(gpu(L40S, ["L40S-12Q"]))) == 1
    assert sriov_calls(tools) == []
    assert said(journal)[-1].startswith("IOMMU is off: no virtual function can be enabled")


def test_a_vf_that_holds_a_type_already_is_left_as_it_is(rebooted, root, tools, journal):
    wanted = data(gpu(L40S, ["L40S-12Q"] * 2))
    assert boot.restore(wanted) == 0
    assert boot.restore(wanted) == 0  # run again (systemctl restart): nothing changes
    assert types_of(root, L40S, 3) == [1139, 1139, 0]
    assert sriov_calls(tools) == [f"sriov-manage -e {L40S}"]
    assert (f"GPU {L40S}: VF 0000:81:00.5 (virtfn1) holds nvidia-1139 already: left as it is"
            in said(journal))


@pytest.mark.parametrize("text,why", [
    ("{not json", "is not JSON"),
    ('{"version": 9, "gpus": []}', "version 9 is not one this charm knows"),
    ('{"version": 1, "gpus": [{"address": "../../etc"}]}', "an entry names no GPU address"),
])
def test_data_that_cannot_be_read_restores_nothing_and_says_why(root, tools, capsys, text, why):
    path = root / boot.DATA_FILE
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert boot.main([f"/{boot.DATA_FILE}"]) == 2
    out = capsys.readouterr().out
    assert f"/{boot.DATA_FILE}: {why}" in out
    assert sriov_calls(tools) == []


def test_the_units_own_command_line_restores_the_host(rebooted, root, tools):
    """What systemd runs: the charm's Python on the charm's own module, output to the journal."""
    rebooted.vfio_model(L40S).frozen = True  # a separate process: no kernel model there
    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 2)))
    unit = sriov.render_unit()
    execs = [line.split("=", 1)[1] for line in unit.splitlines() if line.startswith("ExecStart=")]
    assert len(execs) == 1
    argv = shlex.split(execs[0])
    assert argv[0] == sys.executable and argv[1].endswith("/src/vgpu_boot.py")
    assert argv[2] == f"/{boot.DATA_FILE}"
    # The unit names profiles through its data, never type ids.
    assert "1139" not in unit and "current_vgpu_type" not in unit
    timeout = next(line for line in unit.splitlines() if line.startswith("TimeoutStartSec="))
    assert int(timeout.split("=")[1]) > boot.Limits().total
    out = subprocess.run(argv, env=dict(os.environ), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert types_of(root, L40S, 3) == [1139, 1139, 0]
    assert f"GPU {L40S}: VF 0000:81:00.5 (virtfn1) now holds NVIDIA L40S-12Q (nvidia-1139)" \
        in out.stdout
    assert json.loads((root / boot.DATA_FILE).read_text())["gpus"][0]["address"] == L40S


def test_an_unexpected_error_on_one_gpu_is_logged_and_the_next_still_restored(
        rebooted, root, journal, monkeypatch):
    counted = boot._vf_count

    def failing(entry):
        if entry.endswith(L40S):
            raise PermissionError(13, "Permission denied")
        return counted(entry)

    monkeypatch.setattr(boot, "_vf_count", failing)
    assert boot.restore(data(gpu(L40S, ["L40S-12Q"]), gpu(H200, ["H200X-35C"]))) == 1
    assert types_of(root, H200, 2) == [1282, 0]
    assert f"GPU {L40S}: [Errno 13] Permission denied" in said(journal)


def test_the_data_cannot_stretch_the_boot_step_past_the_units_timeout():
    assert boot.Limits.of({"total": 10 ** 6, "attempts": 0}) == boot.Limits(attempts=1)
    assert boot.Limits.of({"total": 30}).total == 30
    with pytest.raises(boot.DataError, match="limits.call is not a number of seconds"):
        boot.Limits.of({"call": "300"})


def test_a_charm_path_systemd_would_split_is_refused(monkeypatch):
    from vgpu.errors import SriovError

    monkeypatch.setattr(sriov, "BOOT_SCRIPT", "/var/lib/juju/agents/unit x/charm/src/vgpu_boot.py")
    with pytest.raises(SriovError, match="unusual characters"):
        sriov.render_unit()


def mig_gpu(address, profile, instance, count, vfs):
    entry = gpu(address, [profile] * vfs)
    entry["mig"] = {"profile": profile, "instance": instance, "count": count}
    return entry


def mig_host(root, tools, vfs=4, mode="Enabled", rebooted=True):
    """Two H200 SXM in MIG mode, then (``rebooted``) a reboot: no VFs, no GPU instances.

    At the reboot they lose MIG mode, as Hopper does with the vGPU host driver
    (see FakeHost._reboot_mig); the stand-in sriov-manage wipes MIG state (see
    FakeHost._sriov_on_mig) unless a test says otherwise.
    """
    from unit_tests.fakehost import h200_sxm_host

    host = h200_sxm_host(root, enabled=False, vfs=vfs, mig=mode)
    host.install_sriov_manage()
    if rebooted:
        host.reboot()
    tools.set_active(MGR)
    return host


H200_A, H200_B = "0000:18:00.0", "0000:2a:00.0"


def host_calls(tools, gpu=H200_A):
    """sriov-manage and nvidia-smi calls about one GPU, in order (the query names no GPU)."""
    smi = f"00000000:{gpu[5:].upper()}"
    return [c for c in tools.calls() if c == f"sriov-manage -e {gpu}"
            or (c.startswith("nvidia-smi") and smi in c)]


@pytest.mark.parametrize("wipes", [True, False], ids=["sriov-manage wipes MIG", "keeps MIG"])
@pytest.mark.parametrize("reboot", ["loses", "keeps"], ids=["Hopper", "Ampere"])
def test_vfs_first_then_mig_mode_and_gpu_instances_then_types(root, tools, journal, wipes,
                                                              reboot):
    """However the GPU keeps MIG mode over a reboot and whatever sriov-manage -e does to it."""
    host = mig_host(root, tools, rebooted=False)
    host.set_mig(H200_A, reboot=reboot)
    if not wipes:
        host.sriov_keeps_mig(H200_A)
    host.reboot()
    assert host.mig_mode(H200_A)["current"] == ("Enabled" if reboot == "keeps" else "Disabled")
    assert boot.restore(data(mig_gpu(H200_A, "NVIDIA H200X-2-35C", "2g.35gb", 3, 3))) == 0
    assert host.mig_mode(H200_A)["current"] == "Enabled"
    assert host.gpu_instances(H200_A) == ["1:2g.35gb@0", "2:2g.35gb@2", "3:2g.35gb@4"]
    assert types_of(root, H200_A, 4) == [1416, 1416, 1416, 0]
    calls = host_calls(tools)
    assert calls[0] == f"sriov-manage -e {H200_A}"  # before anything MIG: it may wipe it
    turned_on = "nvidia-smi -i 00000000:18:00.0 -mig 1" in calls
    assert turned_on == (wipes or reboot == "loses")  # only when the mode is not in force
    assert calls[-1] == "nvidia-smi mig -i 00000000:18:00.0 -cgi 2g.35gb,2g.35gb,2g.35gb -C"
    assert not [c for c in tools.calls() if " -r" in c]  # never a GPU reset


def test_hopper_loses_mig_mode_at_a_reboot_and_the_boot_step_turns_it_on_again(root, tools,
                                                                               journal):
    """NVIDIA/gpu-admin-tools#2, cozystack/ansible-cozystack#70: the intent is the boot data's."""
    host = mig_host(root, tools, vfs=2)
    host.sriov_keeps_mig(H200_A)  # the mode is lost at the reboot itself
    assert host.mig_mode(H200_A)["current"] == "Disabled"
    assert boot.restore(data(mig_gpu(H200_A, "H200X-1-18C", "1g.18gb", 2, 2))) == 0
    assert (host.mig_mode(H200_A)["current"], host.mig_mode(H200_A)["pending"]) == (
        "Enabled", "Enabled")
    assert types_of(root, H200_A, 2) == [1414, 1414]
    assert ("GPU 0000:18:00.0: MIG mode is Disabled; turning it on for MIG-backed H200X-1-18C "
            "(nvidia-smi -i 00000000:18:00.0 -mig 1): Hopper and Blackwell lose it at every "
            "reboot") in said(journal)


def test_a_pending_mode_gets_mig_1_again_never_a_gpu_reset(root, tools, journal):
    """Another client held the GPU at the first -mig 1; nvidia-smi's remedy: run it again."""
    host = mig_host(root, tools, vfs=2)
    host.set_mig(H200_A, busy=True)
    real = root / "usr/bin/nvidia-smi"
    real.rename(real.with_name("nvidia-smi.real"))
    # The client goes away after the first -mig 1 (a monitor that was polling the GPU).
    stand_in(real, f'#!/bin/sh\n"{real.with_name("nvidia-smi.real")}" "$@"; rc=$?\n'
                   f'case "$*" in *-mig\\ 1*) {sys.executable} -c "import json; p=\'{host.smi_state}\'; '
                   f's=json.load(open(p)); s[\'{H200_A}\'][\'busy\']=False; '
                   f'json.dump(s, open(p, \'w\'))";; esac\nexit $rc\n')
    assert boot.restore(data(mig_gpu(H200_A, "H200X-1-18C", "1g.18gb", 2, 2))) == 0
    assert [c for c in host_calls(tools) if "-mig 1" in c] == [
        "nvidia-smi -i 00000000:18:00.0 -mig 1"] * 2
    assert host.gpu_instances(H200_A) == ["1:1g.18gb@0", "2:1g.18gb@1"]
    assert types_of(root, H200_A, 2) == [1414, 1414]
    assert not [c for c in tools.calls() if " -r" in c]


def test_a_mode_that_stays_pending_fails_that_gpu_at_once_and_names_the_remedy(root, tools,
                                                                              journal):
    host = mig_host(root, tools, vfs=2)
    host.set_mig(H200_A, busy=True)  # and it never goes away
    started = time.monotonic()
    assert boot.restore(data(mig_gpu(H200_A, "H200X-1-18C", "1g.18gb", 2, 2),
                             mig_gpu(H200_B, "H200X-7-141C", "7g.141gb", 1, 1))) == 1
    assert time.monotonic() - started < 10  # its VFs are not waited for: the failure is known
    assert host.gpu_instances(H200_A) == [] and types_of(root, H200_A, 2) == [0, 0]
    assert host.gpu_instances(H200_B) == ["1:7g.141gb@0"]
    assert types_of(root, H200_B, 2) == [1419, 0]
    assert [c for c in host_calls(tools) if "-mig 1" in c] == [
        "nvidia-smi -i 00000000:18:00.0 -mig 1"] * 3  # FAST: 3 attempts
    assert not [c for c in tools.calls() if " -r" in c]
    lines = said(journal)
    assert ("GPU 0000:18:00.0: MIG mode is still pending after 3 runs of nvidia-smi -i "
            "00000000:18:00.0 -mig 1: another client uses the GPU; stop it, then run the charm's "
            "enable-mig action (or systemctl restart nvidia-vgpu-vfs.service); its GPU instances "
            "are not created") in lines
    assert "restored 1 of 2 GPUs; not restored: 0000:18:00.0" in lines
    assert not any("reset" in line for line in lines)


def test_a_gpu_whose_gpu_instances_cannot_be_created_is_not_waited_for(root, tools, journal):
    """The failure is known at once: its VFs are not polled for types that cannot come."""
    host = mig_host(root, tools, vfs=2)
    host.set_mig(H200_A, table="H100")  # -lgip offers no 1g.18gb
    started = time.monotonic()
    rc = boot.restore(data(mig_gpu(H200_A, "H200X-1-18C", "1g.18gb", 2, 2),
                           limits={"total": 60}))
    assert rc == 1
    assert time.monotonic() - started < 10, "waited for types on a GPU without GPU instances"
    lines = said(journal)
    assert ("GPU 0000:18:00.0: its VFs get no MIG-backed type now: H200X-1-18C needs MIG mode and "
            "2 x 1g.18gb GPU instances (nvidia-smi mig -i 00000000:18:00.0 -lgi)") in lines
    assert not [line for line in lines if "lists nothing creatable" in line]


def test_a_vf_whose_mig_backed_type_finds_no_room_says_what_the_type_needs(root, tools, journal):
    """The boot data asks one 1g.18gb instance for two H200X-1-18C VFs: the second finds none."""
    host = mig_host(root, tools, vfs=3)
    assert boot.restore(data(mig_gpu(H200_A, "H200X-1-18C", "1g.18gb", 1, 2))) == 1
    assert host.gpu_instances(H200_A) == ["1:1g.18gb@0"] and types_of(root, H200_A, 3) == [1414, 0, 0]
    assert ("GPU 0000:18:00.0: VF 0000:18:00.5 (virtfn1) lists nothing creatable: H200X-1-18C not "
            "given; MIG-backed H200X-1-18C needs MIG mode and a GPU instance with room on GPU "
            "0000:18:00.0 (nvidia-smi mig -i 00000000:18:00.0 -lgi)") in said(journal)


def test_sriov_manage_runs_one_gpu_at_a_time_then_mig_steps_side_by_side(root, tools, journal,
                                                                        tmp_path):
    """Issue 33.1: never two sriov-manage runs at once; every GPU's before any MIG step.

    The stand-in sriov-manage fails when another run is inside and leaves its GPU on
    pci-pf-stub (see FakeHost._raced); each run stays inside 0.3 s. Each GPU's -mig 1
    waits until the other's has started: the MIG steps run side by side, each naming its GPU.
    """
    host = mig_host(root, tools, vfs=2)
    host.sriov_manage_takes(0.3)
    real = root / "usr/bin/nvidia-smi"
    real.rename(real.with_name("nvidia-smi.real"))
    marks = tmp_path / "mig"
    marks.mkdir()
    stand_in(real, f'#!/bin/sh\ncase "$*" in *"-mig 1"*) touch "{marks}/$2"; n=0\n'
                   f'  while [ "$(ls {marks} | wc -l)" -lt 2 ]; do\n'
                   '    n=$((n + 1)); [ $n -gt 100 ] && { echo "alone: not side by side" >&2; exit 1; }\n'
                   '    sleep 0.1; done ;; esac\n'
                   f'exec {real.with_name("nvidia-smi.real")} "$@"\n')
    assert boot.restore(data(mig_gpu(H200_A, "H200X-1-18C", "1g.18gb", 2, 2),
                             mig_gpu(H200_B, "H200X-1-18C", "1g.18gb", 2, 2),
                             limits={"attempts": 1})) == 0
    assert types_of(root, H200_A, 2) == [1414, 1414] and types_of(root, H200_B, 2) == [1414, 1414]
    calls = [c for c in tools.calls() if c.startswith(("sriov-manage", "nvidia-smi"))]
    assert calls[:2] == [f"sriov-manage -e {H200_A}", f"sriov-manage -e {H200_B}"]
    assert not [c for c in calls[2:] if c.startswith("sriov-manage")]
    # One query of every GPU's mode before any changes; then every call names its GPU (-i): a
    # call without -i opens every GPU, a client of the one whose mode another thread changes.
    assert calls[2].startswith("nvidia-smi --query-gpu=") and " -i " not in calls[2]
    assert [c for c in calls[3:] if " -i 0000" not in c] == []


@pytest.mark.parametrize("left", ["pci-pf-stub", "no driver"])
def test_a_gpu_a_failed_run_left_unbound_is_bound_to_nvidia_again_and_retried(
        rebooted, root, tools, journal, left):
    from unit_tests.fakehost import _stub_ids

    journal.set_level(logging.INFO, logger="vgpu.sriov")
    rebooted.left_on_stub(L40S)
    if left == "no driver":
        (root / "sys/bus/pci/drivers/pci-pf-stub/unbind").write_text(L40S)
        os.listdir(root / "sys/bus/pci/drivers/pci-pf-stub")  # the kernel acts on the write
        assert sriov.driver_of(L40S) is None
    assert boot.restore(data(gpu(L40S, ["L40S-12Q"]), gpu(H200, ["H200X-35C"]))) == 0
    assert sriov.driver_of(L40S) == "nvidia" and _stub_ids(root) == []
    assert types_of(root, L40S, 2) == [1139, 0]
    was = "left on pci-pf-stub" if left == "pci-pf-stub" else "left unbound"
    assert (f"GPU {L40S}: {was} by a failed sriov-manage run: bound to nvidia again"
            in [r.getMessage() for r in journal.records])


def test_a_gpu_that_stays_unbound_fails_alone_and_names_the_commands(rebooted, root, tools,
                                                                       journal):
    rebooted.left_on_stub(L40S)
    (root / "sys/bus/pci/drivers/nvidia/bind").unlink()  # the nvidia driver refuses it
    assert boot.restore(data(gpu(L40S, ["L40S-12Q"]), gpu(H200, ["H200X-35C"]))) == 1
    assert types_of(root, H200, 2) == [1282, 0]
    assert sriov_calls(tools) == [f"sriov-manage -e {H200}"]  # never run on an unbound GPU
    assert (f"GPU {L40S}: it is left on pci-pf-stub by a failed sriov-manage run and binding it "
            "to nvidia failed: /sys/bus/pci/drivers/nvidia/bind: No such file or directory; "
            "recover it with: echo '10de 26b9' > /sys/bus/pci/drivers/pci-pf-stub/remove_id; "
            f"echo {L40S} > /sys/bus/pci/drivers/pci-pf-stub/unbind; echo {L40S} > "
            f"/sys/bus/pci/drivers/nvidia/bind; /usr/lib/nvidia/sriov-manage -e {L40S}; "
            "not restored") in said(journal)


def test_a_mig_entry_the_charm_did_not_write_is_skipped_and_said(root, tools, journal):
    mig_host(root, tools, vfs=1)
    entry = gpu(H200_A, [])
    entry["mig"] = {"profile": "H200X-1-18C", "instance": "1g.18gb; reboot", "count": 1}
    assert boot.restore(data(entry)) == 0
    assert any("has a mig entry the charm did not write" in line for line in said(journal))


# -- mdevs after a reboot (Nova before 30) ------------------------------------------------

C1, E1 = "0000:c1:00.0", "0000:e1:00.0"
M1, M2, M3, M4 = (f"11111111-2222-4333-8444-00000000000{n}" for n in range(1, 5))
HELD = {M1: (C1, "nvidia-108"), M2: (C1, "nvidia-108"), M3: (E1, "nvidia-109")}


def instance(n: int) -> str:
    return f"aaaaaaaa-bbbb-4ccc-8ddd-00000000000{n}"


def held_then_rebooted(root, host, held):
    """Guests holding ``held`` ({uuid: (parent, type)}), the charm's record, then a reboot."""
    for n, (uuid, (parent, type_id)) in enumerate(held.items(), 1):
        host.add_mdev(parent, type_id, uuid)
        (running_guest if n % 2 else defined_guest)(root, f"instance-0000000{n}", instance(n),
                                                     mdev_uuid=uuid)
    assert [m.uuid for m in mdevs.refresh(pci.discover())] == sorted(held)
    host.reboot()
    assert all(mdev_where(root, uuid) is None for uuid in held)
    return host


def mdev_where(root, uuid):
    """(parent, type) of the mdev as sysfs shows it; None when it does not exist."""
    settle_mdevs()
    device = root / boot.MDEV_DEVICES / uuid
    if not os.path.lexists(device):
        return None
    real = device.resolve()
    return real.parent.name, (real / "mdev_type").resolve().name


def boot_main(root, *gpus, limits=None):
    sriov.write_boot_data(data(*gpus, limits=limits))
    return boot.main([f"/{boot.DATA_FILE}"])


@pytest.fixture
def v100_rebooted(root, tools):
    tools.set_active(MGR)
    return held_then_rebooted(root, v100_host(root), HELD)


def test_each_held_mdev_comes_back_after_a_reboot_with_its_uuid_parent_and_type(
        v100_rebooted, root, journal):
    assert boot_main(root) == 0
    assert {uuid: mdev_where(root, uuid) for uuid in HELD} == HELD
    lines = said(journal)
    assert (f"mdev {M2} (instance-00000002, {instance(2)}) created on {C1} as nvidia-108"
            in lines)
    assert lines[-1] == "mdevs: created 3, there already 0, of 3"


def test_an_a100s_mdevs_come_back_on_their_vfs_once_sriov_manage_made_them(root, tools, journal):
    tools.set_active(MGR)
    host = a100_host(root, gpus=2, vfs=4)
    host.install_sriov_manage()
    held = {M1: ("0000:41:00.5", "nvidia-474"), M2: ("0000:61:00.4", "nvidia-475"),
            M3: ("0000:61:00.6", "nvidia-475")}
    held_then_rebooted(root, host, held)
    assert not (root / "sys/bus/pci/devices/0000:41:00.5").exists()  # the VFs went too
    assert boot_main(root, gpu("0000:41:00.0"), gpu("0000:61:00.0")) == 0
    assert sorted(sriov_calls(tools)) == ["sriov-manage -e 0000:41:00.0",
                                         "sriov-manage -e 0000:61:00.0"]
    assert {uuid: mdev_where(root, uuid) for uuid in held} == held
    assert said(journal)[-1] == "mdevs: created 3, there already 0, of 3"


def test_a_parent_gone_or_a_type_no_longer_offered_is_skipped_and_the_others_created(
        root, tools, journal):
    tools.set_active(MGR)
    v100_host(root)
    (root / mdevs.FILE).parent.mkdir(parents=True)
    (root / mdevs.FILE).write_text(mdevs.render([
        mdevs.Mdev(M1, C1, "nvidia-108", instance(1), "instance-00000001"),
        mdevs.Mdev(M2, E1, "nvidia-109", instance(2), "instance-00000002"),
        mdevs.Mdev(M3, "0000:a1:00.0", "nvidia-108", instance(3), "instance-00000003"),
        mdevs.Mdev(M4, C1, "nvidia-302", instance(4), "instance-00000004")]))
    assert boot_main(root) == 1  # the unit shows failed: not every mdev came back
    assert mdev_where(root, M1) == (C1, "nvidia-108")
    assert mdev_where(root, M2) == (E1, "nvidia-109")
    assert mdev_where(root, M3) is None and mdev_where(root, M4) is None
    lines = said(journal)
    assert (f"mdev {M3} (instance-00000003, {instance(3)}): its parent 0000:a1:00.0 is gone: "
            "not created") in lines
    assert (f"mdev {M4} (instance-00000004, {instance(4)}): {C1} no longer offers nvidia-302 "
            "(it offers nvidia-105, nvidia-106, nvidia-107, nvidia-108, nvidia-109): "
            "not created") in lines
    assert lines[-1] == f"mdevs: created 2, there already 0, of 4; not created: {M3}, {M4}"


def test_a_parent_whose_types_come_late_is_waited_for(v100_rebooted, root, journal):
    types = root / f"sys/bus/pci/devices/{C1}/mdev_supported_types"
    hidden = types.resolve().with_name("types-not-registered-yet")
    types.rename(hidden)
    later = threading.Timer(0.5, hidden.rename, (types,))
    later.start()
    try:
        started = time.monotonic()
        assert boot_main(root) == 0
    finally:
        later.cancel()
    assert time.monotonic() - started >= 0.5
    assert {uuid: mdev_where(root, uuid) for uuid in HELD} == HELD


def test_the_total_time_stays_bounded_when_a_parent_never_offers_types(v100_rebooted, root,
                                                                         tools, journal):
    types = root / f"sys/bus/pci/devices/{C1}/mdev_supported_types"
    types.rename(types.resolve().with_name("types-never-registered"))
    tools.set_active(MGR, False)  # and the manager never comes up
    started = time.monotonic()
    assert boot_main(root, limits={"total": 2, "manager": 0.5}) == 1
    took = time.monotonic() - started
    assert took < 3.5, took
    # Both of C1's mdevs gave up at the deadline; E1's, after them, was still created.
    assert mdev_where(root, M3) == (E1, "nvidia-109")
    assert mdev_where(root, M1) is None and mdev_where(root, M2) is None
    lines = said(journal)
    assert (f"mdev {M1} (instance-00000001, {instance(1)}): {C1} offers no mdev types (is the "
            "vGPU manager running?): not created") in lines
    assert lines[-1] == f"mdevs: created 1, there already 0, of 3; not created: {M1}, {M2}"


def test_an_mdev_there_already_is_left_as_it_is(v100_rebooted, root, journal):
    assert boot_main(root) == 0
    assert boot_main(root) == 0  # run again (systemctl restart): nothing changes
    assert {uuid: mdev_where(root, uuid) for uuid in HELD} == HELD
    lines = said(journal)
    assert f"mdev {M3} (instance-00000003, {instance(3)}) is there already on {E1} as nvidia-109" \
        in lines
    assert lines[-1] == "mdevs: created 0, there already 3, of 3"


def test_a_record_that_cannot_be_read_creates_nothing_and_the_vfs_still_come_back(
        rebooted, root, tools, capsys):
    (root / mdevs.FILE).parent.mkdir(parents=True, exist_ok=True)
    (root / mdevs.FILE).write_text('{"version": 1, "mdevs": [{"uuid": "../x"}]}')
    assert boot_main(root, gpu(L40S, ["L40S-12Q"])) == 2
    assert types_of(root, L40S, 2) == [1139, 0]
    out = capsys.readouterr().out
    assert (f"/var/lib/nova-compute-nvidia-vgpu/{mdevs.NAME}: an entry is not a uuid, a parent "
            "address and an nvidia type") in out
    assert "no mdev created" in out


def test_without_a_record_the_boot_step_says_nothing_of_mdevs(rebooted, root, journal):
    assert boot_main(root, gpu(L40S, ["L40S-12Q"])) == 0
    assert not any("mdev" in line for line in said(journal))


def test_the_boot_step_notes_the_new_drivers_type_names_while_the_vfs_are_free(root, tools):
    # After an upgrade to a branch that renumbers types, the VFs are full once the boot
    # step is done and list nothing: the charm's next hook finds the names it noted.
    from vgpu import catalogue

    host = l40s_host(root, enabled=False, branch="550")
    host.install_sriov_manage()
    host.reboot(driver="570.158.02", vfio_types={L40S: L40S_TYPES})
    tools.set_active(MGR)
    assert boot.restore(data(gpu(L40S, ["L40S-12Q"] * 4))) == 0
    assert types_of(root, L40S, 5) == [1139] * 4 + [0]
    assert catalogue.load()["0x26b9 570.158.02"]["1139"] == "NVIDIA L40S-12Q"


# -- boot data read as carefully as the charm's other state files -------------------------

_GPU = '{"address": "0000:81:00.0", "vfs": [{"index": 0, "name": "L40S-12Q"}]}'


@pytest.mark.parametrize("content,why", [
    ('{"version": 1, "gpus": [{"address": "0000:81:00.0", "vfs": 5}]}',
     "GPU 0000:81:00.0: vfs is not a list or model not text"),
    ('{"version": 1, "gpus": [{"address": "0000:81:00.0", "vfs": [{"index": true, "name": "x"}]}]}',
     "GPU 0000:81:00.0: a VF entry is not an index and a name"),
    ('{"version": 1, "gpus": ' + "[" * 100_000 + "]" * 100_000 + "}",
     "is nested too deeply to be boot data"),
    ('{"version": 1, "gpus": [' + _GPU + '], "limits": {"total": NaN}}',
     "is not JSON (NaN is no JSON number)"),
    ('{"version": 1, "gpus": [' + _GPU + '], "limits": {"poll": -Infinity}}',
     "is not JSON (-Infinity is no JSON number)"),
    ('{"version": 1, "gpus": [' + _GPU + '], "limits": {"total": 1e999}}',
     "limits.total is not a number of seconds"),
    ('{"version": 1, "gpus": [], "wait_for": ["--now"]}', "wait_for names no systemd unit"),
    ('{"version": 1, "gpus": [], "pad": "' + "x" * (2 << 20) + '"}',
     "is larger than 1048576 bytes"),
])
def test_boot_data_of_the_wrong_shape_is_refused_and_the_mdevs_still_come_back(
        v100_rebooted, root, tools, capsys, content, why):
    path = root / boot.DATA_FILE
    path.write_text(content)
    started = time.monotonic()
    assert boot.main([f"/{boot.DATA_FILE}"]) == 2
    assert time.monotonic() - started < 15  # not a time test: NaN once looped until systemd's kill
    out = capsys.readouterr().out
    assert f"/{boot.DATA_FILE}: {why}" in out and "nothing restored from it" in out
    assert "Traceback" not in out
    assert {uuid: mdev_where(root, uuid) for uuid in HELD} == HELD  # the record still served
    assert sriov_calls(tools) == []


def test_boot_data_behind_a_link_is_not_followed(v100_rebooted, root, tools, capsys):
    elsewhere = root / "etc/boot.json"
    elsewhere.parent.mkdir(parents=True, exist_ok=True)
    elsewhere.write_text(json.dumps(data(gpu(L40S, ["L40S-12Q"]))))
    (root / boot.DATA_FILE).symlink_to(elsewhere)
    assert boot.main([f"/{boot.DATA_FILE}"]) == 2
    out = capsys.readouterr().out
    assert (f"/{boot.DATA_FILE}: is a symbolic link: not followed (the charm writes a plain "
            "file); nothing restored from it") in out
    assert sriov_calls(tools) == []
    assert {uuid: mdev_where(root, uuid) for uuid in HELD} == HELD


def test_the_boot_step_restores_once_under_the_lock_whatever_the_restore_raises(root, monkeypatch):
    """An error inside the restore is not taken for a lock that could not be had (no second run)."""
    from vgpu import hostlock
    from vgpu.errors import HostBusyError

    runs = []

    def failing(where, *how):
        runs.append(where)
        with pytest.raises(HostBusyError), hostlock.held(0):  # the restore runs holding the lock
            pass
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(boot, "_run", failing)
    with pytest.raises(OSError):
        boot.run(str(root / "boot.json"))
    assert len(runs) == 1
    with hostlock.held(0):  # and the lock was let go
        pass


@pytest.mark.parametrize("mark, rc", [(None, 1), (("a hook", 0), 0), (("a hook", 1), 1)])
def test_a_boot_step_that_cannot_take_the_lock_exits_0_once_a_hook_did_its_work(
        rebooted, root, tools, capsys, monkeypatch, mark, rc):
    """The unit shows failed only when something is left to do: a hook's mark says it is done."""
    from unit_tests.faketools import host_lock_held
    from vgpu import bootfile, hostlock

    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 2)))
    if mark is not None:
        bootfile.write(*mark, [])  # what the hook holding the lock left once it did the work
    monkeypatch.setattr(hostlock, "BOOT_WAIT", 0.2)
    with host_lock_held(root / hostlock.FILE):  # that hook still holds the lock
        assert boot.main([f"/{boot.DATA_FILE}"]) == rc
    out = capsys.readouterr().out
    assert sriov_calls(tools) == []  # the boot step itself did nothing either way
    if rc == 0:
        assert ("a hook did this step's work since this boot (VFs, MIG mode, GPU instances, "
                "types and mdevs): nothing left to do here") in out
    elif mark is None:
        assert "nothing restored here: that hook, or the next, does this step's work" in out
    else:
        assert ("a hook did this step's work since this boot but could not restore everything: "
                "the unit's status names what is missing") in out


def test_about_300_mdevs_left_behind_are_written_bounded_and_all_counted(root):
    """issue 34 item 7: written as it is read (64 KiB), the overflow counted, never "none"."""
    from vgpu import bootfile

    left = [{"uuid": f"{n:08x}-0000-4000-8000-000000000000", "parent": E1, "type": "nvidia-109",
             "why": "its parent 0000:e1:00.0 is gone: " + "x" * 100} for n in range(300)]
    bootfile.write(bootfile.BY_BOOT, 1, left)
    assert (root / bootfile.LEFT).stat().st_size <= bootfile.LEFT_LIMIT
    found = bootfile.left()
    assert 0 < len(found["mdevs"]) < 300 and len(found["mdevs"]) + found["more"] == 300
    (message,) = bootfile.left_behind(found)
    assert message.startswith("after this boot, the boot step could not create again the mdevs "
                              f"{left[0]['uuid']} (nvidia-109 on {E1}: its parent")
    assert " and 298 more that instances hold: " in message
    (root / bootfile.LEFT).write_text("{")  # cut short: what was left cannot be told, and is said
    assert bootfile.left_behind(bootfile.left()) == [
        "after this boot, the mdevs the boot step could not create again cannot be told: "
        f"/{bootfile.LEFT} not JSON; journalctl -u nvidia-vgpu-vfs.service says what was left; "
        "systemctl restart nvidia-vgpu-vfs.service tries again"]


def test_the_mark_says_whether_a_hook_still_has_the_boot_steps_work_to_do(root):
    """No mark, or the boot step's own incomplete run: a hook does the work (vgpu.boot.catch_up)."""
    from vgpu import bootfile

    assert not bootfile.done() and bootfile.left() is None  # /run is empty after a boot
    bootfile.write(bootfile.BY_BOOT, 0, [])
    assert bootfile.done() and bootfile.left() is None
    bootfile.forget()
    bootfile.write(bootfile.BY_BOOT, 1, [])  # something not restored: the next hook tries again
    assert not bootfile.done()
    assert bootfile.left() == {"by": "the boot step", "status": 1, "mdevs": []}
    assert bootfile.left_behind(bootfile.left()) == []  # VFs, types, MIG: every hook redoes them
    gone = {"uuid": M3, "parent": E1, "type": "nvidia-109", "why": "its parent 0000:e1:00.0 is gone"}
    bootfile.write(bootfile.BY_HOOK, 1, [gone])
    assert bootfile.done()
    assert bootfile.left_behind(bootfile.left()) == [
        f"after this boot, a hook could not create again the mdev {M3} (nvidia-109 on {E1}: its "
        "parent 0000:e1:00.0 is gone) that instances hold: they cannot start until it is there; "
        "journalctl -u nvidia-vgpu-vfs.service says why; systemctl restart "
        "nvidia-vgpu-vfs.service tries again"]
    (root / boot.MDEV_DEVICES).mkdir(parents=True)
    (root / boot.MDEV_DEVICES / M3).symlink_to("elsewhere")  # there again: nothing to say
    assert bootfile.left_behind(bootfile.left()) == []
    bootfile.write(bootfile.BY_HOOK, 0, [])
    assert bootfile.left() is None


def test_the_mark_and_what_was_left_are_root_s_alone(root):
    """Both say what the host did since this boot: nobody but root reads or writes them (0600)."""
    from vgpu import bootfile

    bootfile.write(bootfile.BY_HOOK, 1, [{"uuid": M3, "parent": E1, "type": "nvidia-109",
                                          "why": "its parent is gone"}])
    assert stat.S_IMODE((root / bootfile.MARK).stat().st_mode) == 0o600
    assert stat.S_IMODE((root / bootfile.LEFT).stat().st_mode) == 0o600


@pytest.mark.parametrize("step", ["_prepare", "_give_types"])
def test_any_exception_in_one_gpus_steps_fails_that_gpu_alone_and_the_mark_is_left(
        rebooted, root, tools, capsys, monkeypatch, step):
    """Issue 34.4: not only VgpuError and OSError; the traceback is logged, the rest goes on."""
    from vgpu import bootfile, bootresult

    real = getattr(boot, step)

    def broken(gpu, *args):
        if gpu.address == L40S:
            raise KeyError("surprise")
        return real(gpu, *args)

    monkeypatch.setattr(boot, step, broken)
    assert boot_main(root, gpu(L40S, ["L40S-12Q"]), gpu(H200, ["H200X-35C"])) == 1
    assert types_of(root, H200, 2) == [1282, 0]  # the other GPU finished
    out = capsys.readouterr().out
    assert f"GPU {L40S}: unexpected error: KeyError: 'surprise'" in out
    assert "Traceback (most recent call last):" in out
    assert f"restored 1 of 2 GPUs; not restored: {L40S}" in out
    assert bootfile.left() == {"by": bootfile.BY_BOOT, "status": 1, "mdevs": []}  # the next hook
    result = bootresult.load()
    assert result is not None and result.status == 1
    assert {g.address: g.result for g in result.gpus} == {L40S: boot.FAILED, H200: boot.RESTORED}


def test_a_failed_vgpu_manager_ends_the_boot_step_within_its_minute_and_says_so(
        rebooted, root, tools, journal, monkeypatch):
    """Issue 33.5: systemd says nvidia-vgpu-mgr failed (not starting): no waiting out the budget.

    Without the manager the VFs have no nvidia/ files (the driver's vGPU part is not up),
    so nothing would ever be listed: the boot step used to wait its whole budget.
    """
    real = root / sriov.SRIOV_MANAGE
    real.rename(real.with_name("sriov-manage.real"))
    stand_in(real, f'#!/bin/sh\n{real.with_name("sriov-manage.real")} "$@" || exit $?\n'
                   f'for vf in {root}/sys/bus/pci/devices/$2/virtfn*; do rm -rf "$vf/nvidia"; done\n')
    tools.set_state(MGR, "failed")
    monkeypatch.setattr(boot, "MANAGER_FAILED_BUDGET", 1.0)
    started = time.monotonic()
    rc = boot.restore(data(gpu(L40S, ["L40S-12Q"]), limits={"total": 20, "manager": 10}))
    assert rc == 1
    assert time.monotonic() - started < 5  # not manager (10 s), nor total (20 s)
    assert sriov_calls(tools) == [f"sriov-manage -e {L40S}"]  # what it could do, it did
    lines = said(journal)
    assert (f"{MGR} failed (systemd says so): no VF can take a vGPU type until it runs; "
            f"journalctl -u {MGR} says why; doing what can be done within 1 s, then failing"
            ) in lines
    assert lines[-1] == (f"restored 0 of 1 GPUs; not restored: {L40S}; the vGPU manager "
                         f"{MGR} failed: journalctl -u {MGR} says why")


@pytest.mark.parametrize("held", ["pending", "applies"])
def test_the_charms_exporter_is_stopped_while_the_boot_step_turns_mig_on(root, tools, journal,
                                                                         held):
    """systemctl restart nvidia-vgpu-vfs while the exporter runs (at boot it starts after)."""
    host = mig_host(root, tools, vfs=2)
    host.set_mig(H200_A, held=held)
    tools.set_active("nvidia-vgpu-exporter.service")
    assert boot.restore(data(mig_gpu(H200_A, "H200X-1-18C", "1g.18gb", 2, 2))) == 0
    assert host.mig_mode(H200_A)["current"] == "Enabled"
    calls = [c for c in tools.calls() if c.startswith(("systemctl stop", "systemctl --no-block"))
             or "-mig 1" in c]
    assert calls == ["systemctl stop nvidia-vgpu-exporter.service",
                     "nvidia-smi -i 00000000:18:00.0 -mig 1",
                     "systemctl --no-block start nvidia-vgpu-exporter.service"]


def test_an_unexpected_error_outside_the_gpus_steps_still_leaves_the_result(rebooted, root, capsys,
                                                                          monkeypatch):
    from vgpu import bootfile, bootresult

    def broken(*args):
        raise ValueError("a defect")

    monkeypatch.setattr(boot, "_mig_needs", broken)
    assert boot_main(root, gpu(L40S, ["L40S-12Q"])) == 1
    assert "the boot step's restore stopped on an unexpected error" in capsys.readouterr().out
    assert bootfile.left() == {"by": bootfile.BY_BOOT, "status": 1, "mdevs": []}
    result = bootresult.load()
    assert result is not None and result.status == 1
