"""NVML's per-vGPU figures (vgpu.nvml), through the pynvml stand-in of unit_tests/fake_pynvml."""

import ast
import importlib.util
import json
from pathlib import Path

import pytest

from unit_tests.fake_pynvml import pynvml as fake
from vgpu import nvml

VM_1 = "5d3a9e2f-7c41-4b8e-a6d2-9f1c0e8b7a64"  # hex letters: NVML may give it in upper case
VM_2 = "22222222-2222-4222-8222-222222222222"
GIB = 1 << 30


def host(**changes):
    """An L40S with two vGPUs (one licensed, one in its grace period) and an idle H200."""
    state = {"driver": "570.158.02", "gpus": [
        {"bus_id": "00000000:81:00.0", "vgpus": [
            {"id": 7, "uuid": "b8c5f3a0-1111-4d2e-9f10-aaaaaaaaaaaa", "vm": VM_1.upper(),
             "type": 1139, "licensed": 1, "state": 5, "fb": 6 * GIB,
             "util": {"sm": 35, "memory": 20, "encoder": 0, "decoder": 5}},
            {"id": 8, "uuid": "b8c5f3a0-2222-4d2e-9f10-bbbbbbbbbbbb", "vm": VM_2,
             "type": 1139, "licensed": 0, "state": 2, "fb": 512 << 20,
             "util": {"sm": 0, "memory": 0, "encoder": 0, "decoder": 0}}]},
        {"bus_id": "00000001:C8:00.0", "vgpus": []}]}
    state.update(changes)
    fake.configure(state)
    return nvml.Session(module=fake)


def test_each_active_vgpu_with_its_instance_type_licence_framebuffer_and_use():
    reading = host().read()
    assert reading.present and not reading.errors and reading.driver_version == "570.158.02"
    first, second = reading.vgpus
    assert first == nvml.Vgpu(
        gpu="0000:81:00.0", instance=7, uuid="b8c5f3a0-1111-4d2e-9f10-aaaaaaaaaaaa",
        instance_uuid=VM_1,
        type_id="nvidia-1139", licensed=True, license_state=5, framebuffer_bytes=6 * GIB,
        utilization=(("sm", 0.35), ("memory", 0.2), ("encoder", 0.0), ("decoder", 0.05)))
    assert (second.licensed, second.license_state, second.framebuffer_bytes) == (False, 2, 512 << 20)


def test_a_framebuffer_above_4_gib_is_read_whole():
    """nvidia-ml-py's own wrapper reads it into 32 bits (the module doc); this one does not."""
    assert host().read().vgpus[0].framebuffer_bytes == 6 * GIB > 1 << 32


def test_nvml_is_initialised_once_for_many_reads_and_shut_down_on_close():
    session = host()
    session.read()
    session.read()
    assert fake.calls().count("nvmlInit") == 1
    session.close()
    assert fake.calls()[-1] == "nvmlShutdown"


def test_a_host_without_the_driver_is_no_error_and_reads_nothing():
    reading = host(driver=None).read()
    assert reading == nvml.Reading(present=False)
    assert fake.calls() == ["nvmlInit"]


def test_without_nvidia_ml_py_nothing_is_read(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "pynvml", None)  # import fails
    assert nvml.Session().read() == nvml.Reading(present=False)


@pytest.mark.parametrize("call", ["nvmlVgpuInstanceGetLicenseInfo_v2", "nvmlVgpuInstanceGetUUID",
                                  "nvmlVgpuInstanceGetFbUsage", "nvmlVgpuInstanceGetType",
                                  "nvmlDeviceGetVgpuInstancesUtilizationInfo"])
def test_a_call_that_fails_is_said_and_the_rest_is_read(call):
    reading = host(fail={call: 999}).read()
    assert reading.present and len(reading.vgpus) == 2
    assert len(reading.errors) == 1 and "Unknown Error" in reading.errors[0]
    assert reading.vgpus[0].instance_uuid == VM_1  # what else there is, is read


@pytest.mark.parametrize("call, label, unknown", [
    ("nvmlVgpuInstanceGetUUID", "UUID", {"uuid": ""}),
    ("nvmlVgpuInstanceGetVmID", "VM", {"instance_uuid": ""}),
    ("nvmlVgpuInstanceGetType", "type", {"type_id": ""}),
    ("nvmlVgpuInstanceGetLicenseInfo_v2", "licence", {"licensed": None, "license_state": None}),
    ("nvmlVgpuInstanceGetFbUsage", "framebuffer", {"framebuffer_bytes": None})])
def test_a_vgpu_call_that_fails_is_said_with_its_gpu_and_what_it_read(call, label, unknown):
    reading = host(fail={call: 999}).read()
    assert reading.errors == (f"GPU 0000:81:00.0: a vGPU's {label}: Unknown Error",)
    whole = host().read().vgpus[0]
    assert reading.vgpus[0] == whole._replace(**unknown)  # the rest read as without the failure


def test_drivers_before_r550_give_utilisation_through_the_older_call():
    reading = host(old_utilization=True).read()
    assert not reading.errors
    assert dict(reading.vgpus[0].utilization)["sm"] == 0.35
    assert "nvmlDeviceGetVgpuUtilization" in fake.calls()


def test_the_device_list_failing_starts_nvml_again_at_the_next_read():
    session = host(fail={"nvmlDeviceGetCount": 999})
    reading = session.read()
    assert reading.present and reading.errors and not reading.vgpus
    fake._STATE["state"].pop("fail")
    assert len(session.read().vgpus) == 2
    assert fake.calls().count("nvmlInit") == 2


def test_init_failing_otherwise_is_said():
    reading = host(fail={"nvmlInit": 999}).read()
    assert reading.present and reading.errors == ("nvmlInit: Unknown Error",)


def test_a_vm_named_by_its_domain_id_has_no_instance_uuid():
    session = host()
    fake._STATE["state"]["gpus"][0]["vgpus"][0]["vm_type"] = fake.NVML_VGPU_VM_ID_DOMAIN_ID
    assert session.read().vgpus[0].instance_uuid == ""


@pytest.mark.parametrize("bus_id, address", [
    (b"00000000:81:00.0", "0000:81:00.0"), ("00000001:C8:00.0", "0001:c8:00.0"),
    ("0000:41:00.0", "0000:41:00.0")])
def test_nvmls_bus_ids_read_as_sysfs_names_the_gpus(bus_id, address):
    assert nvml.bus_address(bus_id) == address


def test_the_stand_in_only_offers_what_the_real_pynvml_has():
    """Every name the stand-in defines for vgpu.nvml exists in nvidia-ml-py, with its arity."""
    spec = importlib.util.find_spec("pynvml")
    assert spec is not None and spec.origin, "nvidia-ml-py is a dependency of the charm"
    real = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
    defined = {n.name: len(n.args.args) for n in real.body if isinstance(n, ast.FunctionDef)}
    names = {t.id for n in real.body if isinstance(n, ast.Assign) for t in n.targets
             if isinstance(t, ast.Name)} | {n.name for n in real.body if isinstance(n, ast.ClassDef)}
    ours = ast.parse(Path(fake.__file__).read_text(encoding="utf-8"))
    for node in ours.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith(("nvml", "_nvml")):
            assert defined.get(node.name) == len(node.args.args), node.name
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.id.startswith("NVML_"):
                    assert target.id in names, target.id
    assert "NVMLError" in names


def test_the_stand_ins_migration_structures_are_pynvmls_with_its_field_names():
    """nvmlGetVgpuCompatibility's inputs and answer: same class names, fields a subset, in order."""
    import pynvml as real

    for name in ("c_nvmlVgpuMetadata_t", "c_nvmlVgpuPgpuMetadata_t",
                 "c_nvmlVgpuPgpuCompatibility_t"):
        ours = [field for field, _ in getattr(fake, name)._fields_]
        theirs = [field for field, _ in getattr(real, name)._fields_]
        assert [f for f in theirs if f in ours] == ours, name


def test_migration_metadata_and_verdict_through_the_stand_in():
    fake.configure({"driver": "570.158.02", "gpus": [
        {"bus_id": "00000000:81:00.0", "metadata": "0x26b9/48", "vgpus": [
            {"id": 7, "uuid": "u", "vm": VM_1.upper(), "type": 1139, "licensed": 1, "state": 5,
             "fb": 1, "metadata": "0x26b9/48"}]},
        {"bus_id": "00000000:C1:00.0", "vgpus": []}]})  # no metadata: NOT_SUPPORTED, skipped
    gpus = nvml.once(nvml.gpu_metadata, fake)
    assert list(gpus) == ["0000:81:00.0"]
    vgpus = nvml.once(nvml.vgpu_metadata, fake)
    assert list(vgpus) == [VM_1]  # by Nova's instance UUID, lower case
    assert nvml.once(lambda m: nvml.compatibility(m, vgpus[VM_1], gpus["0000:81:00.0"]),
                     fake) == nvml.VERDICT_LIVE
    assert fake.calls()[-1] == "nvmlShutdown"  # NVML held only for the call


def test_metadata_with_characters_outside_base64_is_refused_not_skipped():
    """A peer's text is data: a stray character is no metadata, though the rest would decode."""
    fake.configure({"driver": "570.158.02", "gpus": [
        {"bus_id": "00000000:81:00.0", "metadata": "0x26b9/48", "vgpus": [
            {"id": 7, "uuid": "u", "vm": VM_1, "type": 1139, "licensed": 1, "state": 5,
             "fb": 1, "metadata": "0x26b9/48"}]}]})
    gpu = nvml.once(nvml.gpu_metadata, fake)["0000:81:00.0"]
    vgpu = nvml.once(nvml.vgpu_metadata, fake)[VM_1]

    def verdict(a, b):
        return nvml.once(lambda m: nvml.compatibility(m, a, b), fake)

    assert verdict(vgpu, gpu) == nvml.VERDICT_LIVE
    for stray in ("!", "\n", " "):
        assert verdict(vgpu[:8] + stray + vgpu[8:], gpu) is None
        assert verdict(vgpu, gpu[:8] + stray + gpu[8:]) is None


# -- the bounded child: python -m vgpu.nvml <query> ------------------------------------------

@pytest.fixture
def child_nvml(monkeypatch, tmp_path):
    """The stand-in as the child imports it: FAKE_NVML's file, the stand-in first on its path."""
    path = tmp_path / "fake-nvml.json"
    monkeypatch.syspath_prepend(str(Path(fake.__file__).parent))
    monkeypatch.setenv("FAKE_NVML", str(path))

    def configure(state):
        path.write_text(json.dumps(state))
    return configure


def test_the_child_answers_each_query_as_nvml_does_in_process(child_nvml):
    state = {"driver": "570.158.02", "per_vm": {"1155": 2}, "gpus": [
        {"bus_id": "00000000:81:00.0", "metadata": "0x26b9/48", "vgpus": [
            {"id": 7, "uuid": "u", "vm": VM_1.upper(), "type": 1139, "licensed": 1, "state": 5,
             "fb": 1, "metadata": "0x26b9/48"}]}]}
    child_nvml(state)
    fake.configure(state)
    gpus = nvml.ask("gpu-metadata")
    assert gpus == nvml.once(nvml.gpu_metadata, fake) and list(gpus) == ["0000:81:00.0"]
    said = nvml.ask("verdicts", {"instances": [VM_1, VM_2], "targets": [gpus["0000:81:00.0"]]})
    mine = nvml.once(nvml.vgpu_metadata, fake)[VM_1]
    assert said == {"metadata": {VM_1: mine},
                    "answers": [[mine, gpus["0000:81:00.0"], nvml.VERDICT_LIVE]]}
    assert nvml.ask("per-vm", [1155, 1139]) == {"1155": 2}
    child_nvml({"driver": None})  # no libnvidia-ml: nothing, and no error
    assert nvml.ask("gpu-metadata") is None


def test_a_hung_driver_costs_the_caller_the_childs_bound_and_says_so(child_nvml, monkeypatch):
    import time

    child_nvml({"driver": "570.158.02", "hang": ["nvmlInit"], "gpus": []})
    monkeypatch.setattr(nvml, "NVML_TIMEOUT", 2.0)
    for query, payload in (("gpu-metadata", None), ("verdicts", {"instances": [], "targets": []}),
                           ("per-vm", [1155])):
        started = time.monotonic()
        with pytest.raises(nvml.UnansweredError, match=r"^NVML did not answer within 2s$"):
            nvml.ask(query, payload)
        assert time.monotonic() - started < 10


def test_a_child_that_fails_or_answers_nonsense_is_unanswered(child_nvml, monkeypatch):
    child_nvml({"driver": "570.158.02", "gpus": []})
    with pytest.raises(ValueError):
        nvml.ask("no-such-query")
    monkeypatch.setattr("vgpu.run.run", lambda *a, **k: __import__("vgpu.run").run.Result(
        0, "<html>", ""))
    with pytest.raises(nvml.UnansweredError, match="could not be read"):
        nvml.ask("gpu-metadata")


def test_no_hook_or_action_calls_nvml_in_its_own_process():
    """Outside vgpu.nvml only the exporter holds a Session; every other NVML call is the child's.

    A call of ``once`` with no pynvml module given would call the real NVML in the caller's
    process: only the child (vgpu.nvml itself) may make one.
    """
    src = Path(nvml.__file__).parent.parent
    for path in sorted(src.rglob("*.py")):
        if path == Path(nvml.__file__):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert "pynvml" not in names, f"{path}: imports pynvml"
            if isinstance(node, ast.Call):
                name = getattr(node.func, "attr", getattr(node.func, "id", ""))
                if name == "once":
                    assert len(node.args) >= 2, f"{path}:{node.lineno}: NVML in-process"
                if name == "Session":
                    assert path.name == "vgpu_exporter.py", f"{path}:{node.lineno}"
