"""vgpu.vfio: a VF's nvidia/ files read as sysfs gives them, any bytes, never more than a page."""

import pytest

from vgpu import vfio
from vgpu.errors import VfTypeError

VF = "0000:81:00.4"


def test_a_vf_file_is_read_with_any_bytes_and_no_more_than_its_bound(root):
    listed = root / f"sys/bus/pci/devices/{VF}/nvidia/creatable_vgpu_types"
    listed.parent.mkdir(parents=True)
    listed.write_bytes(b"ID    : vGPU Name\n1139  : NVIDIA L40S-12Q \xff\n")
    assert [t.name for t in vfio.creatable(VF)] == ["NVIDIA L40S-12Q \ufffd"]
    listed.write_bytes(b"ID    : vGPU Name\n" + b"#" * 65536)
    with pytest.raises(VfTypeError) as error:
        vfio.creatable(VF)
    assert str(error.value) == f"cannot read creatable_vgpu_types of VF {VF}: more than 65536 bytes"
