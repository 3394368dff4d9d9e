"""Fault attribution and recovery: a kernel that hits an illegal address does not end the process,
and the block is named (by a replay in a child process, or at once with ``debug_launch``).

Each scenario runs in its own process: after the fault the driver refuses the whole process's CUDA
use (on H100 + driver 580 even a context reset), which would break every later test here.

Marked ``gpu_fault``: these run after every other test (see tests/conftest.py for why)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.gpu_fault]
SCENARIO = Path(__file__).with_name("fault_scenario.py")
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    "flag",
    [
        [],
        ["--debug-launch"],
        ["--fused-tail"],
        ["--debug-launch", "--fused-tail"],
        ["--in-for"],
        ["--debug-launch", "--in-for"],
    ],
    ids=["graph", "debug-launch", "graph-fused-tail", "debug-launch-fused-tail", "graph-in-for", "debug-launch-in-for"],
)
def test_a_faulting_block_is_found_disabled_and_revived(flag):
    out = subprocess.run([sys.executable, str(SCENARIO), *flag], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip().startswith("OK"), out.stdout + out.stderr
    assert "GPU fault" in out.stderr
    assert "'bad'" in out.stderr  # the log names the faulting block
