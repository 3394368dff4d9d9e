"""tools/build_kernels.py --nvrtc: the bundled kernels rebuilt through the installed NVRTC (the CUDA 12
set-up in docs/setup.md runs it) give PTX that the installed nvJitLink links, and the same sidecars."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from cudapatch.kernels import PtxFileSource

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ROOT / "cudapatch" / "kernels" / "ptx"


def test_the_bundled_kernels_rebuild_with_nvrtc(tmp_path: Path) -> None:
    sources = sorted(BUNDLED.glob("*.cu"))
    assert sources
    for cu in sources:
        shutil.copy2(cu, tmp_path / cu.name)
    cmd = [sys.executable, str(ROOT / "tools" / "build_kernels.py"), "--nvrtc", str(tmp_path)]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    for cu in sources:
        ptx = tmp_path / cu.with_suffix(".ptx").name
        text = ptx.read_bytes()
        assert b"\0" not in text and text.rstrip().endswith(b"}")  # the whole module, no C string's NUL
        assert (tmp_path / ptx.with_suffix(".json").name).read_text() == cu.with_suffix(".json").read_text()
        image = PtxFileSource(ptx).compile("sm_90")
        assert image.kind == "cubin" and image.image.startswith(b"\x7fELF") and image.descriptor.entry_point == cu.stem
