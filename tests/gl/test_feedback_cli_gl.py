"""``cudapatch run`` of the Game of Life patch file on the GPU machine: a loop through a FrameDelay
loaded from a file, previewed headless, writes a PNG that shows live and dead cells."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cudapatch.interop import read_png

pytestmark = [pytest.mark.gpu, pytest.mark.gl]
ROOT = Path(__file__).resolve().parents[2]


def test_cli_runs_the_game_of_life_patch_file(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    patch = ROOT / "examples" / "09_game_of_life.toml"
    cmd = [sys.executable, "-m", "cudapatch", "run", str(patch), "--headless", "--frames", "60"]
    out = subprocess.run(
        cmd + ["--out", str(tmp_path), "--no-overlay"], capture_output=True, text=True, timeout=300, env=env, cwd=ROOT
    )
    assert out.returncode == 0, out.stdout + out.stderr
    (png,) = sorted(tmp_path.glob("*.png"))
    rgb = read_png(png)[..., :3].astype(int)
    live = (rgb.sum(axis=2) > 500).mean()  # warm white cells
    dark = (rgb.sum(axis=2) < 150).mean()  # dark blue background
    assert 0.002 < live < 0.6 and dark > 0.2, (live, dark)  # Life settles near 3-5 % alive
