"""Every numbered example runs headless and reports success."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("[0-9][0-9]_*.py"))


@pytest.mark.gpu
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_headless(path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(path), "--headless", "--frames", "40"], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "OK" in out.stdout


def test_examples_have_a_header_and_headless_flags() -> None:
    assert EXAMPLES
    for path in EXAMPLES:
        text = path.read_text()
        assert text.startswith('#!/usr/bin/env python3\n"""') and "What you should see" in text
        assert "--headless" in text and "--frames" in text
