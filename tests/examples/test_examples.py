"""Every numbered example and every README snippet runs from a file, headless, and reports success.

A new user pastes code into a file and runs it, with no ``if __name__ == "__main__":`` guard; so
each example also runs with its guard removed, and each README ```python snippet runs as written
from a file of its own. That is how the compiler process was found re-running scripts (it used to
be started with multiprocessing's spawn, which re-imports the main module in the child). The
snippets are read from README.md when the tests are collected (by tests/unit/test_docs_snippets.py,
which checks them on the CPU), so they test the README as it is.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from cudapatch.kernels._driver import driver_needed

from ..conftest import gpu_unavailable_reason
from ..unit.test_docs_snippets import PYTHON

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("[0-9][0-9]_*.py"))
FRAMES = "40"
_GUARD = re.compile(r'^if __name__ == ["\']__main__["\']:[ \t]*$', re.MULTILINE)


def without_main_guard(code: str) -> str:
    """The script with its ``if __name__ == "__main__":`` block run unconditionally (same lines)."""
    return _GUARD.sub("if True:  # the main guard, removed: the script must work without one", code)


SNIPPETS = [(where, code) for where, code in PYTHON if where.startswith("README.md")]  # (page:line, code)


def _run(script: Path, args: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def _assert_clean(out: subprocess.CompletedProcess[str]) -> None:
    both = out.stdout + out.stderr
    assert out.returncode == 0, both
    assert "Traceback (most recent call last)" not in both, both
    assert "compiler process crashed" not in both and "compiler process did not start" not in both, both


def _example_args(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return ["--headless", "--frames", FRAMES] if "--headless" in text else []


@pytest.mark.gpu
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_headless(path: Path) -> None:
    out = _run(path, _example_args(path), cwd=ROOT)
    _assert_clean(out)
    assert "OK" in out.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_runs_without_a_main_guard(path: Path, tmp_path: Path) -> None:
    script = tmp_path / path.name
    script.write_text(without_main_guard(path.read_text(encoding="utf-8")), encoding="utf-8")
    out = _run(script, _example_args(path), cwd=ROOT)
    _assert_clean(out)
    assert "OK" in out.stdout


@pytest.mark.gpu
@pytest.mark.parametrize("code", [c for _, c in SNIPPETS], ids=[where for where, _ in SNIPPETS])
def test_readme_snippet_runs_from_a_file(code: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"  # as pasted: no main guard, nothing added
    script.write_text(code, encoding="utf-8")
    _assert_clean(_run(script, [], cwd=tmp_path))


@pytest.mark.parametrize("guard", ["as-written", "no-main-guard"])
@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_example_without_cuda_prints_one_line_and_fails(path: Path, guard: str, tmp_path: Path) -> None:
    """On a machine without a driver or GPU an example ends in one line naming the driver it
    needs and ``cudapatch check``, with a non-zero exit status, not a traceback; pasted into a
    file without its main guard, too."""
    if gpu_unavailable_reason() is None:
        pytest.skip("this machine has CUDA: the example runs (tested above)")
    script = path
    if guard == "no-main-guard":
        script = tmp_path / path.name
        script.write_text(without_main_guard(path.read_text(encoding="utf-8")), encoding="utf-8")
    out = _run(script, _example_args(path), cwd=ROOT)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2, out.stdout + out.stderr
    assert len(lines) == 1 and out.stdout == "", out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    assert lines[0].startswith(f"{path.name}: ") and "`cudapatch check`" in lines[0]
    if gpu_unavailable_reason().startswith("no CUDA driver"):
        assert driver_needed() in lines[0] and lines[0].lower().count("install") == 1  # CUDA 13: R580 or newer


def test_examples_have_a_header_and_headless_flags() -> None:
    assert EXAMPLES
    for path in EXAMPLES:
        text = path.read_text()
        assert text.startswith('#!/usr/bin/env python3\n"""') and "What you should see" in text
        assert "--headless" in text and "--frames" in text
        assert "@example_main" in text, f"{path.name}: main() is not wrapped by cudapatch._examples.example_main"


def test_snippets_are_found_and_unguarded_examples_are_still_python() -> None:
    assert SNIPPETS, "README.md has no ```python snippet"
    for where, code in SNIPPETS:
        compile(code, where, "exec")
    for path in EXAMPLES:
        code = path.read_text(encoding="utf-8")
        unguarded = without_main_guard(code)
        assert _GUARD.search(unguarded) is None and unguarded.count("\n") == code.count("\n")
        compile(unguarded, str(path), "exec")
