"""vgpu.catalogue: the learnt VFIO type names, kept in the charm's state directory.

Hosts: the L40S + H200 fixture of unit_tests/fakehost.py (vendor-specific
VFIO); the catalogue file as the charm writes it, or damaged, or reached
through a link.
"""

import json
import logging
import os

import pytest

from unit_tests.fakehost import l40s_host
from vgpu import catalogue, pci

DRIVER = "570.158.02"
KEY = "0x26b9 570.158.02"


@pytest.fixture
def vfio(root):
    return l40s_host(root)


def test_what_the_vfs_list_is_learnt_saved_and_loaded_again(root, vfio):
    table = catalogue.learn(pci.discover(), DRIVER)
    assert table[KEY]["1139"] == "NVIDIA L40S-12Q"
    assert json.loads((root / catalogue.FILE).read_text()) == table
    assert catalogue.load() == table


@pytest.mark.parametrize("content", [
    b"[" * 200_000 + b"]" * 200_000,  # nested past Python's recursion limit
    b'{"a": ' * 100_000 + b"{}" + b"}" * 100_000,
    b'{"%s": {"1139": "NVIDIA L40S-12Q"}}' % (b"x" * (2 << 20)),  # larger than any real table
    b"\xff\xfe not utf-8",
    b"{not json",
], ids=["deep-list", "deep-object", "huge", "not-utf-8", "not-json"])
def test_a_damaged_catalogue_is_taken_as_absent_and_relearnt(root, vfio, caplog, content):
    path = root / catalogue.FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    caplog.set_level(logging.WARNING)
    assert catalogue.load() == {}
    assert f"ignoring /{catalogue.FILE}" in caplog.text
    table = catalogue.learn(pci.discover(), DRIVER)
    assert json.loads(path.read_text()) == table and table[KEY]


def test_values_that_are_not_names_are_dropped(root):
    path = root / catalogue.FILE
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({KEY: {"1139": "NVIDIA L40S-12Q", "1140": {"deep": ["x"]},
                                      "1141": 3}, "other": ["x"]}))
    assert catalogue.load() == {KEY: {"1139": "NVIDIA L40S-12Q"}}


def test_a_linked_state_directory_is_neither_read_nor_written(root, vfio, caplog):
    ssh = root / "etc/ssh"
    ssh.mkdir(parents=True)
    (ssh / "vgpu-types.json").write_text(json.dumps({KEY: {"1": "planted"}}))
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    (root / catalogue.STATE_DIR).symlink_to(ssh)
    caplog.set_level(logging.WARNING)
    assert catalogue.load() == {}
    table = catalogue.learn(pci.discover(), DRIVER)
    assert table[KEY]["1139"] == "NVIDIA L40S-12Q"  # learnt all the same, for this hook
    assert os.listdir(ssh) == ["vgpu-types.json"]
    assert json.loads((ssh / "vgpu-types.json").read_text()) == {KEY: {"1": "planted"}}
    assert (f"cannot save learnt vGPU types to {root / catalogue.FILE}: /{catalogue.STATE_DIR} is a "
            f"symbolic link (to {ssh}); the charm never writes through a link") in caplog.text
    with pytest.raises(OSError):
        catalogue.forget()
    assert os.listdir(ssh) == ["vgpu-types.json"]


def test_forget_removes_the_file_and_the_state_directory(root, vfio):
    catalogue.learn(pci.discover(), DRIVER)
    assert (root / catalogue.FILE).exists()
    catalogue.forget()
    assert not (root / catalogue.STATE_DIR).exists()
    assert (root / "var/lib").is_dir()
    catalogue.forget()  # nothing left: nothing to do


def test_digits_python_cannot_read_as_a_number_name_nothing(root, vfio):
    """A hand edit: ``²`` is a digit to str.isdigit, yet int() refuses it (ValueError)."""
    host = pci.discover()
    (root / catalogue.STATE_DIR).mkdir(parents=True)
    (root / catalogue.FILE).write_text(json.dumps({
        KEY: {"\u00b2": "NVIDIA L40S-1Q", "1139": "NVIDIA L40S-12Q"},
        catalogue.whole_key(host.gpus[0]): {catalogue.FRAMEBUFFER: "\u00b2"}}))
    table = catalogue.load()
    offered = catalogue.offered(host, DRIVER, table)
    assert "NVIDIA L40S-12Q" in {t.name for t in offered["0000:81:00.0"]}
    assert catalogue.whole_gpus(host, table)["0000:81:00.0"] == 48  # what its free VFs list
