"""unit_tests/principal.py, which reads relation data as nova-compute does, leaves charmhelpers as it was."""

import sys

import charmhelpers.osplatform

from unit_tests import principal


def test_reading_relation_data_like_nova_compute_leaves_charmhelpers_as_it_was():
    assert charmhelpers.osplatform.get_platform is not principal._ubuntu
    patched = [name for name, module in list(sys.modules.items())
               if name.startswith("charmhelpers") and getattr(module, "get_platform", None)
               is principal._ubuntu]
    assert patched == []
    # and the helpers still read relation data once the stand-in is gone
    assert principal.services({"services": '["nvidia-vgpu-mgr"]'}) == {"nvidia-vgpu-mgr"}
