"""The compiler names its diagnostic codes through ``DiagnosticCode``, never as text.

``Diagnostic`` turns a known text into the enum, so a code written as a string still works, and a
misspelt one silently stays a plain string that no host matches. These tests read the compiler's
source, so a raw code string fails here instead of in a host.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cudapatch.engine.compiler as compiler
from cudapatch.engine.diagnostics import DiagnosticCode

_MODULES = sorted(Path(compiler.__file__).parent.glob("*.py"))
_TEXTS = {c.value for c in DiagnosticCode}
# The calls that take a code, and the position of that code among their arguments:
# ``Diagnostic(severity, block_id, code, message)`` and ``draft.error(block_id, code, message)``
# (also called through a local alias ``err``).
_CODE_ARG = {"Diagnostic": 2, "error": 1, "err": 1}


def _name(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _code_args(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _name(node) in _CODE_ARG:
            at = _CODE_ARG[_name(node)]
            if len(node.args) > at:
                yield node.args[at]
            yield from (kw.value for kw in node.keywords if kw.arg == "code")


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.name}:{node.lineno}"


def test_the_compiler_has_modules_to_check() -> None:
    names = {p.name for p in _MODULES}
    assert {"sizes.py", "regions.py", "order.py", "delays.py", "validate.py", "draft.py"} <= names


@pytest.mark.parametrize("path", _MODULES, ids=lambda p: p.name)
def test_no_code_is_given_as_a_string(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    raw = [
        f"{_where(path, a)}: {a.value!r}"
        for a in _code_args(tree)
        if isinstance(a, ast.Constant) and isinstance(a.value, str)
    ]
    assert not raw, f"use a DiagnosticCode member, not its text: {raw}"


@pytest.mark.parametrize("path", _MODULES, ids=lambda p: p.name)
def test_no_string_spells_a_code(path: Path) -> None:
    # Codes chosen before the Diagnostic is made (``code = "input-unlinked" if ...``, a returned
    # ``(code, message)`` pair) are not call arguments: any literal that is a code's text is one.
    tree = ast.parse(path.read_text(), filename=str(path))
    spelt = [
        f"{_where(path, n)}: {n.value!r}"
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and n.value in _TEXTS
    ]
    assert not spelt, f"use the DiagnosticCode member: {spelt}"


def test_the_check_sees_a_raw_code() -> None:
    # The two checks above pass on clean modules; show that they catch what they look for.
    tree = ast.parse('draft.error(b, "cycel", "m")\nDiagnostic("warning", b, code="probe", message="m")')
    assert [a.value for a in _code_args(tree)] == ["cycel", "probe"]
