"""Fault attribution and recovery: a kernel that hits an illegal address does not end the process.

Each scenario runs in its own process: the recovery resets the device's primary context, which
would invalidate memory other tests in this process (and CuPy's pool) still hold."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
SCENARIO = Path(__file__).with_name("fault_scenario.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("flag", [[], ["--debug-launch"]], ids=["graph", "debug-launch"])
def test_a_faulting_block_is_found_disabled_and_revived(flag):
    out = subprocess.run([sys.executable, str(SCENARIO), *flag], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().endswith("OK"), out.stdout + out.stderr
    assert "GPU fault" in out.stderr and "resetting the CUDA context" in out.stderr
