"""dpkg's status file and version order, checked against the real dpkg."""

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vgpu import dpkg


def dpkg_says(a: str, b: str) -> int:
    for op, result in (("lt", -1), ("eq", 0), ("gt", 1)):
        if subprocess.run(["dpkg", "--compare-versions", a, op, b]).returncode == 0:
            return result
    raise AssertionError(f"dpkg compares neither way: {a!r} {b!r}")


@pytest.mark.parametrize("a,b", [
    ("570.158.02", "570.172.08"), ("570.172.08", "570.158.02"), ("570.158.02", "570.158.02"),
    ("550.127.06", "570.86.15"), ("1.0~rc1", "1.0"), ("1:1.0", "2.0"), ("1.0-1", "1.0-1ubuntu1"),
    ("3:29.0.0-0ubuntu1~cloud0", "3:29.0.0-0ubuntu1"), ("1.0", "1.0-0"), ("1.0a", "1.0+"),
    ("2.10-3", "2.9-12"),
])
def test_known_orders_match_dpkg(a, b):
    assert dpkg.compare_versions(a, b) == dpkg_says(a, b)


part = st.text(alphabet="0123456789abz.+~", min_size=1, max_size=8).filter(lambda t: t[0].isdigit())


@settings(max_examples=150, deadline=None)
@given(st.tuples(st.integers(0, 2), part, st.none() | part),
       st.tuples(st.integers(0, 2), part, st.none() | part))
def test_any_versions_order_as_dpkg_orders_them(x, y):
    def version(t):
        epoch, upstream, revision = t
        return (f"{epoch}:" if epoch else "") + upstream + (f"-{revision}" if revision else "")
    a, b = version(x), version(y)
    assert dpkg.compare_versions(a, b) == dpkg_says(a, b)


def test_status_file_gives_only_the_packages_asked_for(root):
    from unit_tests.fakehost import FakeHost
    FakeHost(root).dpkg_status({"nova-common": "3:29.0.0-0ubuntu1", "nvidia-vgpu-ubuntu-570": "570.1",
                                "zlib1g": "1:1.3"}, states={"nvidia-vgpu-ubuntu-570": "unpacked"})
    found = dpkg.packages(names=["nova-common"], prefixes=["nvidia-vgpu-ubuntu-"])
    assert sorted(found) == ["nova-common", "nvidia-vgpu-ubuntu-570"]
    assert found["nova-common"].installed and found["nova-common"].version == "3:29.0.0-0ubuntu1"
    assert not found["nvidia-vgpu-ubuntu-570"].installed
    assert found["nvidia-vgpu-ubuntu-570"].state == "unpacked"
