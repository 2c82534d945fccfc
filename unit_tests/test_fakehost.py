"""The fixture's VFIO kernel model (unit_tests/fakehost.py): cheap, and never stale.

The model keeps what it read of a GPU's VFs between opens (issue 41.7: the
4 x 48-VF MIG sample took a minute, each open re-reading every sibling); a type
written beside it, by this process or another, is still seen at the next read.
"""

import os
import subprocess
import sys

from unit_tests.fakehost import STUB, _driver_dir, _stub_ids, build, l40s_host, v100_host
from vgpu import passthrough

PF = "0000:81:00.0"  # l40s_host's L40S: 16 VFs, 48 GB
MIG_PF = "0000:42:00.0"  # rtxpro6000-mig's first GPU


def creatable(root, vf: str) -> list:
    text = (root / "sys/bus/pci/devices" / vf / "nvidia/creatable_vgpu_types").read_text()
    return [line.split(":", 1)[0].strip() for line in text.splitlines()[1:]]


def vfs(root, pf: str) -> list:
    directory = (root / "sys/bus/pci/devices" / pf).resolve()
    links = sorted((n for n in os.listdir(directory) if n.startswith("virtfn")),
                   key=lambda n: int(n[len("virtfn"):]))
    return [os.path.basename(os.readlink(directory / n)) for n in links]


class Opens:
    """How often each file name is opened while active (an audit hook, kept for the process)."""

    def __init__(self):
        self.counts: dict = {}
        self.active = False
        sys.addaudithook(self._hook)

    def _hook(self, event, args):
        if self.active and event == "open" and isinstance(args[0], (str, os.PathLike)):
            name = os.path.basename(os.fspath(args[0]))
            self.counts[name] = self.counts.get(name, 0) + 1


def test_reading_every_vf_s_list_again_reads_no_sibling_s_type_again(root):
    build("rtxpro6000-mig", root)
    names = vfs(root, MIG_PF)
    first = [creatable(root, vf) for vf in names]
    assert first[0] == []  # MIG mode on, no GPU instance yet: nothing (MigModel)
    opens = Opens()
    opens.active = True
    again = [creatable(root, vf) for vf in names]
    opens.active = False
    assert again == first
    # The 48 reads themselves, and nothing of the 47 siblings each (48 x 47 before).
    assert opens.counts.get("creatable_vgpu_types", 0) == 2 * len(names)  # each read, rewritten
    assert opens.counts.get("current_vgpu_type", 0) == 0
    assert opens.counts.get("gpu_instance_id", 0) == 0


def test_a_type_written_by_a_test_or_another_process_is_seen_at_the_next_read(root):
    l40s_host(root)
    a, b, c = vfs(root, PF)[:3]
    assert "1142" in creatable(root, c)  # 48 GB free: the whole GPU's type is listed
    (root / "sys/bus/pci/devices" / a / "nvidia/current_vgpu_type").write_text("1141\n")
    assert creatable(root, c) == ["1141"]  # 24 GB left, the same size only
    # Another process (as the boot step or a stand-in tool would) releases it.
    path = root / "sys/bus/pci/devices" / a / "nvidia/current_vgpu_type"
    subprocess.run([sys.executable, "-c", f"open({str(path)!r}, 'w').write('0\\n')"], check=True)
    assert "1142" in creatable(root, c)
    # Written and flushed, read while the handle is still open: read anew, not kept stale.
    with open(root / "sys/bus/pci/devices" / b / "nvidia/current_vgpu_type", "w") as handle:
        handle.write("1139\n")
        handle.flush()
    assert creatable(root, c) == ["1139"]


# -- the PCI control files: each write acted on in order, as the kernel's store callbacks ----

C1, E1 = "0000:c1:00.0", "0000:e1:00.0"  # v100_host's two GPUs, on nvidia


def test_two_gpus_unbound_and_probed_one_after_the_other_both_go_where_their_override_says(
        root):
    """The hook's order: driver_override, unbind, drivers_probe for one GPU, then the next.

    The second GPU's writes to nvidia's ``unbind`` and to ``drivers_probe`` come before
    anything lists a driver: the kernel took the first GPU's at their write.
    """
    host = v100_host(root)
    _driver_dir(root, "vfio-pci")
    for gpu in (C1, E1):
        assert passthrough.take(gpu, "nvidia") is None
    assert host.pci_writes() == [
        ("sys/bus/pci/drivers/nvidia/unbind", C1), ("sys/bus/pci/drivers_probe", C1),
        ("sys/bus/pci/drivers/nvidia/unbind", E1), ("sys/bus/pci/drivers_probe", E1)]
    assert [passthrough.bound(gpu) for gpu in (C1, E1)] == ["vfio-pci", "vfio-pci"]
    assert sorted(n for n in os.listdir(root / "sys/bus/pci/drivers/vfio-pci")
                  if n.startswith("0000:")) == [C1, E1]
    for gpu in (C1, E1):  # handed back the same way: overrides cleared, nvidia probes them
        assert passthrough.give_back(gpu, "vfio-pci") is None
    assert [passthrough.bound(gpu) for gpu in (C1, E1)] == ["nvidia", "nvidia"]
    assert len(host.pci_writes()) == 8


def test_a_write_is_taken_once_and_a_control_file_touched_or_refused_is_no_write(root):
    host = v100_host(root)
    unbind = root / "sys/bus/pci/drivers/nvidia/unbind"
    unbind.write_text(C1)
    assert passthrough.bound(C1) is None  # listed: the unbind was taken at its write
    unbind.touch()  # opened for writing, nothing written
    (root / "sys/bus/pci/drivers_probe").write_text(C1)
    assert passthrough.bound(C1) == "nvidia"  # no override: nvidia's id table takes it
    assert host.pci_writes() == [("sys/bus/pci/drivers/nvidia/unbind", C1),
                                 ("sys/bus/pci/drivers_probe", C1)]
    assert unbind.read_text() == ""  # taken: the kernel's control files are write-only


def test_bind_is_refused_where_the_override_names_another_driver(root):
    """drivers/base/bus.c bind_store matches first: pci_match_device honours driver_override."""
    v100_host(root)
    _driver_dir(root, "vfio-pci")
    device = root / "sys/bus/pci/devices" / C1
    (root / "sys/bus/pci/drivers/nvidia/unbind").write_text(C1)
    (device / "driver_override").write_text("vfio-pci\n")
    (root / "sys/bus/pci/drivers/nvidia/bind").write_text(C1)
    assert passthrough.bound(C1) is None
    (root / "sys/bus/pci/drivers/vfio-pci/bind").write_text(C1)
    assert passthrough.bound(C1) == "vfio-pci"


def test_new_id_on_the_stub_takes_the_unbound_devices_it_matches_and_remove_id_drops_it(root):
    """pci-driver.c new_id_store adds the id and attaches the driver; remove_id_store drops it."""
    v100_host(root)
    stub = _driver_dir(root, STUB)
    (root / "sys/bus/pci/drivers/nvidia/unbind").write_text(C1)
    (stub / "new_id").write_text("10de 1db4")
    assert _stub_ids(root) == ["10de 1db4"]
    assert passthrough.bound(C1) == STUB and passthrough.bound(E1) == "nvidia"  # E1 had one
    (stub / "remove_id").write_text("10de 1db4")
    assert _stub_ids(root) == []
