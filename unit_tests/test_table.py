"""Action results stay within what Juju's action-set accepts (vgpu.table).

``action-set`` gets every flattened ``key=value`` as one argument, so the
checks here exec a real program with those arguments: the kernel, not a
number we picked, says whether they fit.
"""

import errno
import subprocess

import pytest
from ops import testing

from charm import NovaComputeNvidiaVgpuCharm
from unit_tests import debs
from unit_tests.fakehost import FakeHost, MdevType
from vgpu import hostroot, pci, report, table


def action_set_argv(results):
    """The argv ops builds for action-set: one ``a.b.c=value`` per leaf."""
    return ["true"] + [f"{'.'.join(path)}={value}" for path, value in table.flatten(results)
                       if value != {}]


def action_set_bytes(results):
    """Bytes of those arguments as exec gets them: each NUL-terminated, plus its argv pointer."""
    return sum(len(arg.encode()) + 1 + 8 for arg in action_set_argv(results)[1:])


def exec_with(results):
    return subprocess.run(action_set_argv(results), check=True)


def test_render_lays_out_columns_and_keeps_one_line_per_row():
    text = table.render(["A", "LONGER"], [["x\ny", "1"], ["zz", None]])
    assert text.splitlines() == ["A    LONGER", "x y  1", "zz   -"]


def test_render_caps_rows_and_says_how_many_are_left():
    rows = [[f"0000:{n // 256:02x}:{n % 256:02x}.0", f"nvidia-{n}"] for n in range(2500)]
    text = table.render(["ADDRESS", "TYPE"], rows, what="types")
    lines = text.splitlines()
    assert len(lines) == 1 + table.MAX_ROWS + 1
    assert lines[-1] == f"... and {2500 - table.MAX_ROWS} more types; see the nested results"


def test_render_caps_bytes_even_with_wide_rows():
    rows = [["x" * 500, str(n)] for n in range(80)]
    text = table.render(["NAME", "N"], rows)
    assert len(text.encode()) <= table.MAX_TABLE_BYTES
    shown = len(text.splitlines()) - 2
    assert text.splitlines()[-1] == f"... and {80 - shown} more rows; see the nested results"
    assert 0 < shown < 80


def test_lines_keep_whole_lines_within_the_bound_and_say_how_many_are_left():
    items = [f"guest-{n} ({'x' * 20})" for n in range(100)]
    assert table.lines(items[:3], what="guests") == "\n".join(items[:3])
    text = table.lines(items, what="guests", where="the vgpu-usage action", max_bytes=300)
    *shown, rest = text.splitlines()
    assert shown == items[:len(shown)] and len(shown) > 1
    assert rest == f"... and {100 - len(shown)} more guests; see the vgpu-usage action"
    assert len(text.encode()) <= 300
    # One line more would not have fitted.
    assert len((text + "\n" + items[len(shown)]).encode()) > 300


def test_fit_keeps_small_results_as_they_are():
    results = {"gpus": {"gpu-0": {"address": "0000:c1:00.0", "types": {
        "nvidia-108": {"id": "nvidia-108", "name": "GRID V100-8Q"}}}}, "table": "T"}
    assert table.fit(results, depth=4, records="gpus") == results
    assert table.fit({"gpus": {}, "table": "none"}, depth=4, records="gpus") == {"gpus": {}, "table": "none"}


def test_fit_drops_whole_records_from_the_end_and_says_so():
    types = {f"nvidia-{n}": {"id": f"nvidia-{n}", "name": f"GRID X-{n}Q", "max-instances": "4"}
             for n in range(3000)}
    results = {"table": "T", "gpus": {"gpu-0": {"address": "0000:c1:00.0", "types": types}}}
    out = table.fit(results, depth=4, records="gpus", what="types")
    kept = out["gpus"]["gpu-0"]["types"]
    assert 0 < len(kept) < 3000
    assert list(kept) == list(types)[:len(kept)]
    assert all(entry == types[key] for key, entry in kept.items())  # no half records
    assert out["gpus"]["gpu-0"]["address"] == "0000:c1:00.0"
    assert out["truncated"].startswith(f"{len(kept)} of 3000 types shown in the nested results")
    assert action_set_bytes(out) <= table.MAX_RESULTS_BYTES


def test_fit_cuts_a_huge_single_value():
    out = table.fit({"table": "x" * 200_000}, depth=2, records="rows")
    assert len(out["table"].encode()) <= table.MAX_VALUE_BYTES
    exec_with(out)


def test_our_flattening_is_the_one_ops_uses():
    model = pytest.importorskip("ops.model")
    results = {"a": {"b": {"c": "1"}, "d": "2"}, "e": "3"}
    assert {".".join(p): v for p, v in table.flatten(results)} == \
        model._format_action_result_dict(results)


# -- list-vgpu-types on a host with thousands of types -------------------------------

def big_host(root, gpus=20, types_per_gpu=100) -> FakeHost:
    host = FakeHost(root)
    host.pci_ids()
    host.nova("3:29.0.0-0ubuntu1")
    for g in range(gpus):
        types = {f"nvidia-{1000 + g * types_per_gpu + t}":
                 MdevType(f"GRID V100-{t}Q with a long marketing name", 1024, 16)
                 for t in range(types_per_gpu)}
        host.add_gpu(f"0000:{0x10 + g:02x}:00.0", mdev_types=types)
    return host


@pytest.fixture(scope="module")
def big_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("big") / "host"
    root.mkdir()
    big_host(root)
    return root


@pytest.fixture
def big(big_root, monkeypatch):
    monkeypatch.setenv(hostroot.ENV, str(big_root))
    return big_root


def test_thousands_of_types_would_not_fit_unbounded(big):
    host = pci.with_available(pci.discover())
    unbounded = {"gpus": report.gpu_results(host),
                 "table": table.render(*_rows(host), max_rows=10**6, max_bytes=10**9)}
    with pytest.raises(OSError) as failure:
        exec_with(unbounded)
    assert failure.value.errno == errno.E2BIG


def test_list_vgpu_types_with_thousands_of_types_fits_action_set(big, tools, tmp_path):
    ctx = testing.Context(NovaComputeNvidiaVgpuCharm)
    resource = testing.Resource(name="nvidia-vgpu-software", path=debs.empty(tmp_path))
    ctx.run(ctx.on.action("list-vgpu-types"), testing.State(resources={resource}))
    results = ctx.action_results
    assert action_set_bytes(results) <= table.MAX_RESULTS_BYTES
    exec_with(results)
    lines = results["table"].splitlines()
    assert lines[0].split()[:3] == ["GPUS", "MODEL", "TYPE"]
    assert len(lines) - 2 <= table.MAX_ROWS  # the header and the last line are not types
    assert lines[-1] == f"... and {2000 - (len(lines) - 2)} more types; see the nested results"
    assert len(results["table"].encode()) <= table.MAX_TABLE_BYTES
    shown = sum(len(g.get("types", {})) for g in results["gpus"].values())
    assert 0 < shown < 2000
    assert results["truncated"].startswith(f"{shown} of 2000 types shown")
    # Each GPU offers types of its own: twenty entries, every one named although types are cut.
    assert [g["addresses"] for g in results["gpus"].values()] == [
        f"0000:{0x10 + g:02x}:00.0" for g in range(20)]


def _rows(host):
    text = report.types_table(host)  # bounded; rebuild the full rows for the unbounded case
    assert text.splitlines()[-1].startswith("... and ")
    rows = [[gpu.address, gpu.model, t.id, t.name, str(t.framebuffer_mb), str(t.max_instances),
             str(t.available_instances)] for gpu in host.gpus for t in gpu.offered_types()]
    return ["GPUS", "MODEL", "TYPE", "NAME", "FRAMEBUFFER", "MAX", "AVAILABLE"], rows


def test_a_records_own_fields_are_kept_or_dropped_together():
    results = {"gpus": {"gpu-0": {"address": "a" * 100, "model": "m" * 100}}}
    # Room for one field, not both: the GPU is not shown half.
    out = table.fit(results, depth=4, records="gpus", what="GPUs", budget=300 + 130)
    assert "gpus" not in out
    assert table.fit(results, depth=4, records="gpus", what="GPUs", budget=300 + 260) == results


def test_an_entry_outside_the_records_is_kept_or_dropped_whole():
    results = {"projects": {"project-0": {"id": "i" * 100, "name": "n" * 100}}, "vgpus": {}}
    # Room for the id (131 bytes as an argument) but not the name: the project is not shown half.
    out = table.fit(results, depth=2, records="vgpus", what="vGPUs", budget=300 + 131)
    assert "projects" not in out
    fits = table.fit(results, depth=2, records="vgpus", what="vGPUs", budget=300 + 300)
    assert fits["projects"] == results["projects"]


def test_a_nul_in_a_value_becomes_a_question_mark():
    out = table.fit({"summary": "a\x00b", "vgpus": {}}, depth=2, records="vgpus", what="vGPUs")
    assert out["summary"] == "a?b"


def test_a_gpu_without_a_driver_says_so_in_the_results_and_the_table(root):
    host = FakeHost(root)
    host.add_gpu("0000:c1:00.0", driver=None, mdev_types={})
    found = pci.discover()
    gpu = report.gpu_results(found)["gpu-0"]
    assert (gpu["driver"], gpu["types"]) == ("none", "none (is the vGPU host driver loaded?)")
    row = report.types_table(found).splitlines()[1]
    assert row.split()[-9:] == ["no", "types", "(driver", "not", "loaded?)", "-", "-", "-", "-"]


def test_every_record_is_named_before_any_records_details_take_room():
    # Four GPUs whose types fill the budget: types are dropped, never a GPU's own fields.
    results = {"gpus": {f"gpu-{n}": {"addresses": f"0000:{n:02x}:00.0", "types": {
        f"nvidia-{m}": {"name": "x" * 200} for m in range(20)}} for n in range(4)}}
    out = table.fit(results, depth=4, records="gpus", what="types", budget=4000)
    assert [g["addresses"] for g in out["gpus"].values()] == [f"0000:{n:02x}:00.0" for n in range(4)]
    shown = sum(len(g.get("types", {})) for g in out["gpus"].values())
    assert 0 < shown < 80
    assert out["truncated"].startswith(f"{shown} of 80 types shown")
    assert table.fit(results, depth=4, records="gpus", what="types", budget=10**6) == results
