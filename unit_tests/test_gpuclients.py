"""NVML clients around a MIG mode change: the units' order, stopping and starting again (issue 33.2)."""

import pytest

from vgpu import exporter, gpuclients, sriov
from vgpu.errors import MigError


def directives(text, key):
    return [word for line in text.splitlines() if line.startswith(f"{key}=")
            for word in line.split("=", 1)[1].split()]


def test_the_boot_unit_comes_before_every_known_nvml_client_and_the_exporter_after_it():
    boot = sriov.render_unit()
    assert set(gpuclients.NEIGHBOURS) <= set(directives(boot, "Before"))
    assert {"nova-compute.service", "libvirtd.service"} <= set(directives(boot, "Before"))
    assert sriov.UNIT in directives(exporter.render(exporter.DEFAULT_PORT), "After")
    assert gpuclients.OURS == exporter.UNIT


def test_stopped_starts_each_again_whatever_happened_and_says_what_it_could_not(tools):
    tools.set_active("dcgm-exporter.service")
    tools.set_active("nvsm.service")
    tools.fail_start("nvsm.service")
    assert gpuclients.active() == ["dcgm-exporter.service", "nvsm.service"]
    with pytest.raises(RuntimeError), gpuclients.stopped(gpuclients.active()) as done:
        assert gpuclients.active() == []
        raise RuntimeError("the change failed")
    assert done.not_started.keys() == {"nvsm.service"}
    assert done.said().startswith(
        "stopped dcgm-exporter.service, nvsm.service around the change; started again: "
        "dcgm-exporter.service; NOT started again: nvsm.service (")
    assert gpuclients.active() == ["dcgm-exporter.service"]


def test_the_exporter_is_touched_only_when_it_is_active_and_restarted_without_blocking(tools):
    with gpuclients.ours_stopped(wait=False):
        pass
    assert [c for c in tools.calls() if not c.startswith("systemctl is-active")] == []
    tools.set_active(gpuclients.OURS)
    with gpuclients.ours_stopped(wait=False):
        assert gpuclients.active([gpuclients.OURS]) == []
    assert [c for c in tools.calls() if not c.startswith("systemctl is-active")] == [
        f"systemctl stop {gpuclients.OURS}", f"systemctl --no-block start {gpuclients.OURS}"]


def test_a_neighbour_active_refuses_unless_asked_and_systemd_silent_counts_as_held(tools):
    tools.set_active("snap.dcgm.nv-hostengine.service")
    with pytest.raises(MigError, match="snap.dcgm.nv-hostengine.service; a MIG mode change"):
        gpuclients.around(lambda: "changed", "0000:42:00.0", False)
    assert gpuclients.around(lambda: "changed", "0000:42:00.0", True)[0] == "changed"
    tools.no_bus()
    with pytest.raises(MigError, match="cannot tell which NVML clients run"):
        gpuclients.around(lambda: "changed", "0000:42:00.0", True)


def test_a_failed_change_carries_what_was_stopped_and_what_did_not_start_again(tools):
    """issue 42 item 5: the record is not dropped with the MIG error."""
    tools.set_active("nvsm.service")
    tools.fail_start("nvsm.service")

    def change():
        raise MigError("nvidia-smi -i 0000:42:00.0 -mig 1 failed: Unknown Error")

    with pytest.raises(gpuclients.ModeChangeError, match="-mig 1 failed") as failed:
        gpuclients.around(change, "0000:42:00.0", stop_neighbours=True)
    assert isinstance(failed.value, MigError)  # still the MIG error to whoever catches that
    assert failed.value.clients.stopped == ["nvsm.service"]
    assert list(failed.value.clients.not_started) == ["nvsm.service"]


@pytest.mark.parametrize("state, holds", [("active", True), ("reloading", True), ("activating", True),
                                          ("deactivating", False), ("inactive", False),
                                          ("failed", False)])
def test_a_client_starting_or_reloading_counts_as_holding_the_gpu(tools, state, holds):
    # A starting dcgm has NVML open, or will have before MIG mode changes: it counts.
    tools.set_state("nvidia-dcgm.service", state)
    assert gpuclients.active() == (["nvidia-dcgm.service"] if holds else [])
