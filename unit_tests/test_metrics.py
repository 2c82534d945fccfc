"""The exporter's metrics (vgpu.metrics) on fixture hosts: names, labels, sources that fail.

Capacity equal to list-vgpu-types and vgpu-usage: test_capacity.py. The exporter as a
process and its unit: test_exporter.py. Prometheus scraping it: test_prometheus.py.
"""

import json
import os
import re

import pytest

from unit_tests.fake_pynvml import pynvml as fake
from unit_tests.fakehost import assign_vfio_type, l40s_host
from unit_tests.libvirt import broken_guest, defined_guest, running_guest
from unit_tests.test_boot import data, gpu
from vgpu import bootresult, metrics, nvml, sriov

L40S, H200 = "0000:81:00.0", "0000:c1:00.0"
L40S_VFS = ("0000:81:00.4", "0000:81:00.5", "0000:81:00.6", "0000:81:00.7")
VM_1 = "11111111-1111-4111-8111-111111111111"
VM_2, VM_3 = "22222222-2222-4222-8222-222222222222", "33333333-3333-4333-8333-333333333333"
# Prometheus' naming rules (prometheus.io, "Metric and label naming"): snake case, one
# application prefix, base units with their suffix, _info for info gauges, no _total on gauges.
NAME = re.compile(r"nvidia_vgpu_[a-z][a-z0-9_]*\Z")
UNITS = ("_seconds", "_bytes", "_ratio", "_info", "_instances", "_up", "_code", "_functions",
         "_result", "_applied", "_type", "_licensed", "_state", "_errors", "_lost")


def by_series(samples, name):
    return {s.labels: s.value for s in samples if s.name == name}


def sources(samples):
    return {s.labels[0]: s.value for s in samples if s.name == "nvidia_vgpu_exporter_source_up"}


@pytest.fixture
def mapped(root):
    """An L40S whose four VFs hold L40S-12Q as the boot data says, a guest on one of them."""
    host = l40s_host(root)
    for address in L40S_VFS:
        assign_vfio_type(host, address, 1139)
    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 4, number=1139)))
    running_guest(root, "instance-00000040", VM_1, pci_address=L40S_VFS[1])
    return host


def test_every_metric_follows_prometheus_naming_with_one_prefix():
    assert len({m.name for m in metrics.METRICS}) == len(metrics.METRICS)
    for metric in metrics.METRICS:
        assert NAME.match(metric.name), metric.name
        assert metric.name.endswith(UNITS), metric.name
        assert not metric.name.endswith("_total"), metric.name  # gauges only
        assert all(re.fullmatch(r"[a-z][a-z0-9_]*", label) for label in metric.labels)
        assert metric.help and "\n" not in metric.help


def test_the_names_the_issue_fixes_with_their_labels():
    labels = {m.name: m.labels for m in metrics.METRICS}
    for name in ("nvidia_vgpu_type_max_instances", "nvidia_vgpu_type_available_instances",
                 "nvidia_vgpu_type_used_instances"):
        assert labels[name] == ("gpu", "type")
    assert {"type", "gpu", "device"} <= set(labels["nvidia_vgpu_guest_info"])
    assert {"instance_uuid", "project_id"} <= set(labels["nvidia_vgpu_guest_tenant_info"])


TENANT = {"instance_uuid", "project_id", "project_name"}


def test_tenant_identities_are_in_the_tenant_series_only():
    """issue 34 item 2: every other series is free of them, whatever the exporter is told."""
    for metric in metrics.METRICS:
        if metric.name.endswith("_tenant_info"):
            assert TENANT & set(metric.labels), metric.name
        else:
            assert not TENANT & set(metric.labels), metric.name


def test_a_mapped_host_reads_as_samples_each_as_its_metric_declares(mapped):
    samples = metrics.collect()
    for sample in samples:
        assert len(sample.labels) == len(metrics.BY_NAME[sample.name].labels)
    assert sources(samples) == {"pci": 1, "guests": 1, "capacity": 1, "boot_data": 1,
                                "mapping": 1, "boot_result": 1}
    assert by_series(samples, "nvidia_vgpu_driver_info") == {("570.158.02",): 1}
    assert by_series(samples, "nvidia_vgpu_gpu_info")[(L40S, "L40S", "0x26b9", "vfio", "nvidia")] == 1
    assert by_series(samples, "nvidia_vgpu_gpu_virtual_functions")[(L40S,)] == 16
    (guest,) = [s.labels for s in samples if s.name == "nvidia_vgpu_guest_info"]
    assert dict(zip(metrics.BY_NAME["nvidia_vgpu_guest_info"].labels, guest)) == {
        "type": "nvidia-1139", "profile": "nvidia-1139", "gpu": L40S, "device": L40S_VFS[1],
        "state": "running"}
    assert not by_series(samples, "nvidia_vgpu_guest_tenant_info")  # not asked for
    assert VM_1 not in repr(samples) and "acme-render" not in repr(samples)
    assert by_series(samples, "nvidia_vgpu_mapping_applied") == {(L40S,): 1}
    assert by_series(samples, "nvidia_vgpu_published_vf_holds_type") == {
        (L40S, vf, "L40S-12Q"): 1 for vf in L40S_VFS}
    assert by_series(samples, "nvidia_vgpu_exporter_scrape_duration_seconds")[()] >= 0


def test_two_definitions_naming_one_vf_are_one_series_counting_both(mapped, root):
    """Without tenant identities two guests on one device would give equal label sets."""
    defined_guest(root, "instance-00000041", VM_2, pci_address=L40S_VFS[2])
    defined_guest(root, "instance-00000042", VM_3, pci_address=L40S_VFS[2])
    samples = metrics.collect(tenants=True)
    guests = by_series(samples, "nvidia_vgpu_guest_info")
    assert guests[("nvidia-1139", "nvidia-1139", L40S, L40S_VFS[2], "shut off")] == 2
    assert len(by_series(samples, "nvidia_vgpu_guest_tenant_info")) == 3
    series = [(s.name, s.labels) for s in samples]
    assert len(series) == len(set(series))


def test_tenant_identities_only_when_asked_for(mapped):
    samples = metrics.collect(tenants=True)
    (tenant,) = [s.labels for s in samples if s.name == "nvidia_vgpu_guest_tenant_info"]
    assert dict(zip(metrics.BY_NAME["nvidia_vgpu_guest_tenant_info"].labels, tenant)) == {
        "gpu": L40S, "device": L40S_VFS[1], "instance_uuid": VM_1,
        "project_id": "8f1c2a7d5e3b4c6a9d0e1f2a3b4c5d6e", "project_name": "acme-render"}


def test_a_published_vf_without_its_type_is_said_vf_by_vf(mapped, root):
    mapped.vfio_model(L40S).frozen = True  # sysfs as written below, whatever the driver would do
    (root / f"sys/bus/pci/devices/{L40S_VFS[2]}/nvidia/current_vgpu_type").write_text("0\n")
    assign_vfio_type(mapped, L40S_VFS[3], 1142)  # another profile: L40S-48Q, named by siblings
    (root / f"sys/bus/pci/devices/{L40S_VFS[0]}/nvidia/creatable_vgpu_types").write_text(
        "ID    : vGPU Name\n1142  : NVIDIA L40S-48Q\n1139  : NVIDIA L40S-12Q\n")
    samples = metrics.collect()
    assert by_series(samples, "nvidia_vgpu_published_vf_holds_type") == {
        (L40S, L40S_VFS[0], "L40S-12Q"): 1, (L40S, L40S_VFS[1], "L40S-12Q"): 1,
        (L40S, L40S_VFS[2], "L40S-12Q"): 0, (L40S, L40S_VFS[3], "L40S-12Q"): 0}
    assert by_series(samples, "nvidia_vgpu_mapping_applied") == {(L40S,): 0}


def test_after_a_reboot_the_missing_vfs_are_named_by_index(root):
    host = l40s_host(root)
    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 2)))
    host.reboot()
    samples = metrics.collect()
    assert by_series(samples, "nvidia_vgpu_gpu_virtual_functions")[(L40S,)] == 0
    assert by_series(samples, "nvidia_vgpu_mapping_applied") == {(L40S,): 0}
    assert by_series(samples, "nvidia_vgpu_published_vf_holds_type") == {
        (L40S, "virtfn0", "L40S-12Q"): 0, (L40S, "virtfn1", "L40S-12Q"): 0}


def test_without_a_mapping_there_is_nothing_to_apply(root):
    l40s_host(root)
    samples = metrics.collect()
    assert sources(samples)["boot_data"] == 1  # read: no mapping in force
    assert not by_series(samples, "nvidia_vgpu_mapping_applied")


@pytest.mark.parametrize("run_by", ["boot_step", "hook"])
def test_the_boot_steps_last_result_per_gpu_and_who_ran_it(root, run_by):
    """A hook that did the boot step's work is named as such on every boot series."""
    l40s_host(root)
    bootresult.save(bootresult.Result(1767225600.0, 42.5, 1, bootresult.gpu_results([
        (L40S, "not restored", 40.0), (H200, "restored", 2.5), ("0000:e1:00.0", "left alone", 0)]),
        run_by=run_by))
    samples = metrics.collect()
    assert by_series(samples, "nvidia_vgpu_boot_gpu_result") == {
        (L40S, "not_restored", run_by): 1, (H200, "restored", run_by): 1,
        ("0000:e1:00.0", "left_alone", run_by): 1}
    assert by_series(samples, "nvidia_vgpu_boot_gpu_duration_seconds")[(L40S, run_by)] == 40.0
    assert by_series(samples, "nvidia_vgpu_boot_last_run_timestamp_seconds") == {
        (run_by,): 1767225600.0}
    assert by_series(samples, "nvidia_vgpu_boot_duration_seconds") == {(run_by,): 42.5}
    assert by_series(samples, "nvidia_vgpu_boot_exit_code") == {(run_by,): 1}


def test_nvml_figures_per_vgpu_where_the_driver_is(mapped):
    fake.configure({"driver": "570.158.02", "gpus": [{"bus_id": "00000000:81:00.0", "vgpus": [
        {"id": 3, "uuid": "v-1", "vm": VM_1, "type": 1139, "licensed": 0, "state": 3,
         "fb": 1 << 33, "util": {"sm": 50, "memory": 10, "encoder": 0, "decoder": 0}}]}]})
    samples = metrics.collect(nvml.Session(module=fake))
    key = (L40S, "3", "v-1", "nvidia-1139")
    assert sources(samples)["nvml"] == 1
    assert by_series(samples, "nvidia_vgpu_gpu_unidentified_vgpu_instances") == {(L40S,): 0}
    assert not by_series(samples, "nvidia_vgpu_vgpu_tenant_info")
    assert by_series(metrics.collect(nvml.Session(module=fake), tenants=True),
                     "nvidia_vgpu_vgpu_tenant_info") == {(L40S, "3", VM_1): 1}
    assert by_series(samples, "nvidia_vgpu_vgpu_licensed") == {key: 0}
    assert by_series(samples, "nvidia_vgpu_vgpu_license_state") == {key: 3}
    assert by_series(samples, "nvidia_vgpu_vgpu_framebuffer_used_bytes") == {key: 1 << 33}
    assert by_series(samples, "nvidia_vgpu_vgpu_utilization_ratio")[(*key, "sm")] == 0.5


IDLE = {"sm": 0, "memory": 0, "encoder": 0, "decoder": 0}


def test_two_vgpus_nvml_cannot_identify_keep_a_series_each_and_are_counted(mapped):
    """issue 34 item 3: UUID and VM calls fail for both; neither's licence state is lost."""
    fake.configure({"driver": "570.158.02",
                    "fail": {"nvmlVgpuInstanceGetUUID": 999, "nvmlVgpuInstanceGetVmID": 999},
                    "gpus": [{"bus_id": "00000000:81:00.0", "vgpus": [
                        {"id": 3, "uuid": "v-1", "vm": VM_1, "type": 1139, "licensed": 1,
                         "state": 5, "fb": 1 << 30, "util": IDLE},
                        {"id": 4, "uuid": "v-2", "vm": VM_1, "type": 1139, "licensed": 0,
                         "state": 3, "fb": 1 << 30, "util": IDLE}]}]})
    samples = metrics.collect(nvml.Session(module=fake))
    assert by_series(samples, "nvidia_vgpu_vgpu_license_state") == {
        (L40S, "3", "", "nvidia-1139"): 5, (L40S, "4", "", "nvidia-1139"): 3}
    assert by_series(samples, "nvidia_vgpu_gpu_unidentified_vgpu_instances") == {(L40S,): 2}
    assert sources(samples)["nvml"] == 0  # the failed calls are said in the log
    series = [(s.name, s.labels) for s in samples]
    assert len(series) == len(set(series))  # every series of the scrape is unique


def test_a_host_without_the_driver_says_nothing_of_nvml(mapped):
    fake.configure({"driver": None})
    samples = metrics.collect(nvml.Session(module=fake))
    assert "nvml" not in sources(samples)
    assert not [s for s in samples if s.name.startswith("nvidia_vgpu_vgpu_")]
    assert by_series(samples, "nvidia_vgpu_type_used_instances")  # the rest is there


# -- a read that fails is a sample saying so, never a failed scrape ---------------------------

def test_pci_devices_that_cannot_be_listed(root):
    devices = root / "sys/bus/pci/devices"
    devices.parent.mkdir(parents=True)
    devices.write_text("")  # a file where the directory is expected
    samples = metrics.collect()
    assert sources(samples)["pci"] == 0
    assert not by_series(samples, "nvidia_vgpu_gpu_info")


def test_a_domain_file_that_cannot_be_read_counts_as_used_and_says_so(mapped, root):
    broken_guest(root, "instance-00000041")
    samples = metrics.collect()
    assert sources(samples)["guests"] == 0
    key = (L40S, "nvidia-1139")
    assert by_series(samples, "nvidia_vgpu_type_used_instances")[key] == 4  # none counted free
    assert by_series(samples, "nvidia_vgpu_type_uncertain_instances")[key] == 3
    assert by_series(samples, "nvidia_vgpu_type_available_instances")[key] == 0


@pytest.mark.parametrize("where", ["etc/libvirt/qemu", "run/libvirt/qemu"])
def test_a_fifo_or_device_link_among_domain_files_is_a_source_down_never_a_hang(mapped, root,
                                                                              where):
    # issue 34 item 1: a FIFO nobody writes, and a link to /dev/kmsg (a reader waits at its end).
    directory = root / where
    directory.mkdir(parents=True, exist_ok=True)
    os.mkfifo(directory / "instance-00000050.xml")
    (directory / "instance-00000051.xml").symlink_to("/dev/kmsg")
    samples = metrics.collect()
    assert sources(samples)["guests"] == 0
    key = (L40S, "nvidia-1139")
    assert by_series(samples, "nvidia_vgpu_type_used_instances")[key] == 4  # counted as used
    assert by_series(samples, "nvidia_vgpu_type_uncertain_instances")[key] == 3


@pytest.mark.parametrize("content", ["{", '{"version": 1, "gpus": "x"}'])
def test_boot_data_or_result_that_cannot_be_used(mapped, root, content):
    (root / sriov.DATA_FILE).write_text(content)
    (root / bootresult.RESULT_FILE).write_text(content)
    samples = metrics.collect()
    assert sources(samples)["boot_data"] == 0 and sources(samples)["boot_result"] == 0
    assert not by_series(samples, "nvidia_vgpu_mapping_applied")
    assert by_series(samples, "nvidia_vgpu_type_used_instances")  # the rest is there


def test_a_learnt_table_edited_by_hand_is_no_failed_scrape(mapped, root):
    """A type id of digits int() refuses (``²``, a hand edit): the scrape goes on without it."""
    from vgpu import catalogue

    (root / catalogue.FILE).write_text(json.dumps({"0x26b9 570.158.02": {"\u00b2": "x"}}))
    samples = metrics.collect()
    assert by_series(samples, "nvidia_vgpu_type_used_instances")[(L40S, "nvidia-1139")] == 1


@pytest.mark.parametrize("learnt, holds", [("NVIDIA L40S-12Q", 1), ("NVIDIA L40S-24Q", 0), (None, 0)])
def test_a_full_gpu_s_types_are_named_from_the_learnt_table(mapped, root, learnt, holds):
    """Boot data without type ids: only the catalogue's names say what the full GPU's VFs hold."""
    from vgpu import catalogue

    sriov.write_boot_data(data(gpu(L40S, ["NVIDIA L40S-12Q"] * 4)))  # no ids (number 0)
    if learnt:
        (root / catalogue.FILE).write_text(json.dumps({"0x26b9 570.158.02": {"1139": learnt}}))
    samples = metrics.collect()
    assert by_series(samples, "nvidia_vgpu_published_vf_holds_type") == {
        (L40S, vf, "L40S-12Q"): holds for vf in L40S_VFS}
    assert by_series(samples, "nvidia_vgpu_mapping_applied") == {(L40S,): holds}


def test_nvml_failing_in_any_way_is_a_sample(mapped):
    class Broken:
        def read(self):
            raise RuntimeError("the library crashed")

    assert sources(metrics.collect(Broken()))["nvml"] == 0
    fake.configure({"driver": "570.158.02", "fail": {"nvmlDeviceGetCount": 999}, "gpus": []})
    assert sources(metrics.collect(nvml.Session(module=fake)))["nvml"] == 0


def test_anything_discovery_raises_is_a_sample(root, monkeypatch):
    from vgpu import pci

    def crash():
        raise MemoryError("sysfs tree too large")

    monkeypatch.setattr(pci, "discover", crash)
    samples = metrics.collect()
    assert sources(samples) == {"pci": 0, "boot_result": 1}  # what does not need PCI is read
    assert by_series(samples, "nvidia_vgpu_exporter_scrape_duration_seconds")


def scrape() -> str:
    """What a scrape of the exporter answers (its registry, as the unit serves it)."""
    from prometheus_client import generate_latest

    import vgpu_exporter

    return generate_latest(vgpu_exporter.registry()).decode()


def raising(*args, **kwargs):
    raise RuntimeError("an unforeseen fault")


@pytest.mark.parametrize("source, module, name", [
    ("capacity", "capacity", "count"),  # the counts per GPU and type
    ("capacity", "usage", "in_use"),  # the vGPUs guests hold
    ("capacity", "catalogue", "whole_gpus"),
    ("mapping", "metrics", "_holds"),  # whether a published VF holds its type
])
def test_anything_the_capacity_or_mapping_part_raises_is_a_source_down(mapped, monkeypatch,
                                                                      source, module, name):
    """The scrape still answers: that part's series are left out whole, the rest is there."""
    import importlib

    monkeypatch.setattr(importlib.import_module(f"vgpu.{module}"), name, raising)
    text = scrape()
    assert f'nvidia_vgpu_exporter_source_up{{source="{source}"}} 0.0' in text
    assert 'nvidia_vgpu_exporter_source_up{source="pci"} 1.0' in text
    assert 'nvidia_vgpu_gpu_info{' in text  # what does not depend on it is there
    samples = metrics.collect()
    if source == "capacity":
        assert not [s for s in samples if s.name.startswith(("nvidia_vgpu_type_",
                                                               "nvidia_vgpu_guest_"))]
        assert by_series(samples, "nvidia_vgpu_mapping_applied") == {(L40S,): 1}
    else:
        assert not by_series(samples, "nvidia_vgpu_published_vf_holds_type")
        assert not by_series(samples, "nvidia_vgpu_mapping_applied")
        assert by_series(samples, "nvidia_vgpu_type_used_instances")
    assert sources(samples)[source] == 0


def test_a_sample_outside_its_metrics_labels_is_refused():
    out = metrics._Out()
    with pytest.raises(ValueError, match="takes the labels"):
        out.add("nvidia_vgpu_type_used_instances", 1, gpu="0000:81:00.0")


def test_the_reference_lists_exactly_the_metrics_with_their_labels():
    """docs/reference/metrics.md, checked against the code: every metric, its labels, its help."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs/reference/metrics.md").read_text()
    rows = re.findall(r"^\| `(nvidia_vgpu_[a-z0-9_]+)` \| ([^|]*) \| ([^|]*) \|$", text, re.MULTILINE)
    documented = {name: (tuple(re.findall(r"`([a-z_]+)`", labels)), meaning.strip())
                  for name, labels, meaning in rows}
    assert documented == {m.name: (m.labels, m.help) for m in metrics.METRICS}


# -- Xid errors and lost GPUs (vgpu.xid) --------------------------------------------------------

def test_xid_errors_and_lost_gpus_are_series_of_the_scrape(mapped, root, bindir):
    from unit_tests.fakejournal import Journal
    from vgpu import xid

    journal = Journal(root, bindir)
    journal.kernel(["NVRM: Xid (PCI:0000:81:00): 31, pid=1234, name=qemu-system-x86, Ch 00000010, "
                    "intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f5a_1b000000"],
                   1_764_000_000.0)
    watch = xid.Watch()
    assert watch.poll()
    fake.configure({"driver": "570.158.02", "gpus": [{"bus_id": "00000000:81:00.0", "lost": True}]})
    samples = metrics.collect(nvml.Session(module=fake), xid_watch=watch)
    assert by_series(samples, "nvidia_vgpu_xid_errors")[(L40S, "31")] == 1
    assert by_series(samples, "nvidia_vgpu_xid_errors")[(L40S, "79")] == 0
    assert by_series(samples, "nvidia_vgpu_xid_last_seen_timestamp_seconds") == {
        (L40S, "31"): 1_764_000_000.0}
    assert by_series(samples, "nvidia_vgpu_xid_gpu_lost") == {
        (L40S, "kernel"): 0, (L40S, "nvml"): 1, (L40S, "pci"): 0,
        (H200, "kernel"): 0, (H200, "nvml"): 0, (H200, "pci"): 0}
    assert sources(samples)["journal"] == 1 and sources(samples)["nvml"] == 1


def test_a_journal_that_cannot_be_read_is_a_source_down(mapped, root, bindir):
    from unit_tests.fakejournal import Journal
    from vgpu import xid

    Journal(root, bindir).fail()
    watch = xid.Watch()
    watch.poll()
    samples = metrics.collect(xid_watch=watch)
    assert sources(samples)["journal"] == 0
    assert not by_series(samples, "nvidia_vgpu_xid_errors")
    assert by_series(samples, "nvidia_vgpu_xid_gpu_lost") == {(L40S, "pci"): 0, (H200, "pci"): 0}


def test_without_a_watch_nothing_of_the_journal_is_said(mapped):
    samples = metrics.collect()
    assert "journal" not in sources(samples)
    assert not [s for s in samples if "_xid_" in s.name]
