"""``cudapatch run --headless`` on the GPU machine: the embedded demo renders PNGs that show particles."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudapatch.interop import read_png

pytestmark = [pytest.mark.gpu, pytest.mark.gl]
ROOT = Path(__file__).resolve().parents[2]


def test_cli_run_headless_renders_the_demo(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [
        sys.executable,
        "-m",
        "cudapatch",
        "run",
        "--headless",
        "--frames",
        "300",
        "--out",
        str(tmp_path),
        "--no-overlay",
    ]
    out = subprocess.run(cmd + ["--size", "640x360"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    pngs = sorted(tmp_path.glob("*.png"))
    assert [p.name for p in pngs] == ["frame_00300.png"]
    img = read_png(pngs[0])
    lit = img[..., :3].astype(int).sum(axis=2) > 60
    assert lit.mean() > 0.01, lit.mean()  # the particle cloud
    assert img[..., :3].max() > 200  # bright cores where particles pile up
    assert "300 frames" in out.stderr and "emit" in out.stderr
