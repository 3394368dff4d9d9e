"""Every ```python snippet of docs/*.md runs as written from a file of its own, on the GPU.

The README's snippets run in test_examples.py; these are the docs pages'. Each is pasted into a
file unchanged (no main guard, nothing added) and must exit cleanly, its own ``assert`` lines
included. Snippets that only define a block or a hook still run: their imports and definitions
must hold. A snippet that draws through GL (it imports ``cudapatch.interop``) is a ``gl`` test too.
On the CPU the same snippets are compiled and their names checked (tests/unit/test_docs_snippets.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ..unit.test_docs_snippets import PYTHON
from .test_examples import _assert_clean, _run

DOCS = [(where, code) for where, code in PYTHON if where.startswith("docs")]


def _marks(code: str) -> list[pytest.MarkDecorator]:
    return [pytest.mark.gpu, *([pytest.mark.gl] if "cudapatch.interop" in code else [])]


@pytest.mark.parametrize("code", [pytest.param(c, id=w, marks=_marks(c)) for w, c in DOCS])
def test_docs_snippet_runs_from_a_file(code: str, tmp_path: Path) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code, encoding="utf-8")
    _assert_clean(_run(script, [], cwd=tmp_path))


def test_the_docs_have_python_snippets() -> None:
    assert len(DOCS) >= 10
    assert any("cudapatch.interop" in code for _, code in DOCS)  # the gl mark is exercised
