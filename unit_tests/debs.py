"""Real .deb files for the driver tests, built with ``dpkg-deb --build``.

Packages carry tiny placeholder files and no maintainer scripts (dpkg
--root would run them chrooted into the test root).
"""

import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Optional

HOST = "nvidia-vgpu-ubuntu-570"
OLD = "570.158.02"
NEW = "570.172.08"
GUEST = "nvidia-linux-grid-570"
MISSING_DEP = "some-package-that-does-not-exist"


def machine_arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True,
                          text=True, check=True).stdout.strip()


def other_arch() -> str:
    return "arm64" if machine_arch() == "amd64" else "amd64"


def build(out_dir: Path, package: str, version: str, arch: str,
          files: Dict[str, str], depends: Optional[str] = None,
          pre_depends: Optional[str] = None) -> Path:
    """Build ``<package>_<version>_<arch>.deb`` holding ``files`` in a new folder under ``out_dir``."""
    out_dir = Path(tempfile.mkdtemp(dir=out_dir, prefix=f"{package}-"))
    tree = out_dir / "tree"
    (tree / "DEBIAN").mkdir(parents=True)
    control = [f"Package: {package}", f"Version: {version}", f"Architecture: {arch}",
               "Maintainer: Test <test@example.com>"]
    if depends:
        control.append(f"Depends: {depends}")
    if pre_depends:
        control.append(f"Pre-Depends: {pre_depends}")
    control.append("Description: test package\n placeholder files only\n")
    (tree / "DEBIAN" / "control").write_text("\n".join(control))
    for rel, content in files.items():
        target = tree / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    deb = out_dir / f"{package}_{version}_{arch}.deb"
    subprocess.run(["dpkg-deb", "--build", "--root-owner-group", str(tree), str(deb)],
                   check=True, capture_output=True)
    return deb


def host_files(vgpud: bool = True) -> Dict[str, str]:
    files = {
        "lib/systemd/system/nvidia-vgpu-mgr.service": "[Service]\nExecStart=/bin/true\n",
        "usr/lib/nvidia/sriov-manage": "#!/bin/sh\n",
        "usr/share/nvidia/vgpu/vgpuConfig.xml": "<vgpuconfig/>\n",
    }
    if vgpud:
        files["lib/systemd/system/nvidia-vgpud.service"] = "[Service]\nExecStart=/bin/true\n"
    return files


def host_driver(out_dir: Path, version: str = OLD, vgpud: bool = True,
                arch: Optional[str] = None, **kw) -> Path:
    """NVIDIA's vGPU host driver (vGPU Manager) for this machine."""
    return build(out_dir, HOST, version, arch or machine_arch(), host_files(vgpud), **kw)


def older_branch(out_dir: Path) -> Path:
    """The host driver of an older branch: another package name, the same files."""
    return build(out_dir, "nvidia-vgpu-ubuntu-550", "550.127.06", machine_arch(), host_files())


def newer_host_driver(out_dir: Path, vgpud: bool = True) -> Path:
    return host_driver(out_dir, NEW, vgpud=vgpud)


def guest_driver(out_dir: Path) -> Path:
    return build(out_dir, GUEST, "570.158.01", machine_arch(),
                 {"usr/bin/nvidia-smi": "#!/bin/sh\n"})


def foreign_host_driver(out_dir: Path) -> Path:
    """The host driver built for another architecture."""
    return host_driver(out_dir, arch=other_arch())


def arch_all_host_driver(out_dir: Path) -> Path:
    return host_driver(out_dir, arch="all")


def unrelated(out_dir: Path, package: str = "hello") -> Path:
    return build(out_dir, package, "2.10-3", machine_arch(), {"usr/bin/hello": "#!/bin/sh\n"})


def unmet_depends(out_dir: Path, version: str = NEW) -> Path:
    """Host driver with a Depends no package satisfies: dpkg unpacks, cannot configure."""
    return host_driver(out_dir, version, depends=MISSING_DEP)


def unmet_pre_depends(out_dir: Path, version: str = NEW) -> Path:
    """Host driver with an unmet Pre-Depends: dpkg refuses to unpack it at all."""
    return host_driver(out_dir, version, pre_depends=MISSING_DEP)


def garbage(out_dir: Path) -> Path:
    path = out_dir / "garbage.deb"
    path.write_bytes(b"\x7fELF not a debian archive \x00\xff" * 64)
    return path


def empty(out_dir: Path) -> Path:
    path = out_dir / "empty.deb"
    path.write_bytes(b"")
    return path


def make_root(base: Path) -> Path:
    """An empty dpkg database under ``base/root``, as on a fresh host."""
    root = base / "root"
    admin = root / "var/lib/dpkg"
    for d in ("info", "updates"):
        (admin / d).mkdir(parents=True)
    (admin / "status").write_text("")
    (admin / "available").write_text("")
    return root


def dpkg_query(root: Path, package: str = HOST) -> str:
    """``${Status} ${Version}`` of ``package`` in ``root``'s dpkg database ("" if unknown)."""
    out = subprocess.run(
        ["dpkg-query", f"--admindir={root}/var/lib/dpkg", "-W", "-f", "${Status} ${Version}", package],
        capture_output=True, text=True)
    return out.stdout.strip() if out.returncode == 0 else ""
