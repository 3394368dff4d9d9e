"""Compile errors of a ``Code`` parameter as (line, column, message), for the editor's line markers.

A block's message carries the compiler's words in one of these shapes (``engine/kernels.py``
appends the first lines of the compiler's log to the error itself):

- NVRTC: ``name.cu(12): error: expected a ";"``, then the source line and a ``^`` under the column;
- ptxas (nvJitLink): ``ptxas application ptx input, line 12; error   : Unknown symbol 'x'``;
- Numba: ``File "k.py", line 12:`` in the log, ``k.py:12: ...: Numba cannot compile k: ...`` first;
- Expression: ``...: unknown name 'q' (known: a, b) (column 5)``: an offset into the whole ``Code``.

Every ``file:line: ...`` error (the first line of each message) counts where its log names nothing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePath

__all__ = ["CodeError", "code_errors"]


@dataclass(frozen=True)
class CodeError:
    """One error at a line of the ``Code`` text: 1-based ``line``, 1-based ``column`` (None: unknown)."""

    line: int
    column: int | None
    message: str


_NVRTC = re.compile(
    r"^(?P<file>[^\n(]+?)\((?P<line>\d+)\): (?P<kind>(?:catastrophic )?error|warning)[^:\n]*: (?P<msg>.*)$", re.M
)
_PTXAS = re.compile(r"^ptxas[^\n,]*, line (?P<line>\d+); (?P<kind>error|warning)\s*: (?P<msg>.*)$", re.M)
_NUMBA = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_COLUMN = re.compile(r"\s*\(column (?P<col>\d+)\)")
# str(CudapatchError): "file:line: block 'x', kernel 'k': message" (the context parts are optional).
_HEADER = re.compile(
    r"^(?P<file>[^\s:'][^\n:']*?):(?P<line>\d+): (?:(?:block|port|parameter|kernel) '[^']*'(?:, )?)*:?\s*(?P<msg>.*)$",
    re.M,
)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CONTEXT = re.compile(r"^(?:(?:block|port|parameter|kernel) '[^']*'(?:, )?)+:\s*")


def code_errors(message: str, code: str = "", files: tuple[str, ...] | None = None) -> tuple[CodeError, ...]:
    """The errors in a block's ``message`` that point into its ``Code`` text, in the message's order.

    Args:
        message: The block's diagnostic text (several diagnostics may be joined with "; ").
        code: The ``Code`` text: an Expression's column becomes its line and column there, and
            NVRTC's caret line gives a column.
        files: The names the Code compiles under (``fx.cu``); a location in another file (an
            included header, a generated kernel) is left out. None: every location counts.
    """
    if not message:
        return ()
    message = _ANSI.sub("", message)  # Numba colours its messages
    found: list[CodeError] = []
    lines = message.splitlines()
    for m in _NVRTC.finditer(message):
        if _ours(m.group("file"), files):
            line = int(m.group("line"))
            kind = "error" if "error" in m.group("kind") else "warning"
            column = _caret_column(message, m.end(), code, line)
            found.append(CodeError(line, column, f"{kind}: {m.group('msg').strip()}"))
    if files is None or any(f.endswith(".ptx") for f in files):
        for m in _PTXAS.finditer(message):
            found.append(CodeError(int(m.group("line")), None, f"{m.group('kind')}: {m.group('msg').strip()}"))
    if not found:  # Numba's and every other error: the located first line of each message
        for m in _HEADER.finditer(message):
            if _ours(m.group("file"), files):
                found.append(CodeError(int(m.group("line")), None, _COLUMN.sub("", m.group("msg")).strip()))
    if not found:
        for m in _NUMBA.finditer(message):
            if _ours(m.group("file"), files):
                found.append(CodeError(int(m.group("line")), None, _first_words(lines)))
    for text in message.split("; ") if not found else ():
        col = _COLUMN.search(text.splitlines()[0] if text else "")
        if col is not None:  # an Expression's column: an offset into the whole Code
            line, column = _line_and_column(code, int(col.group("col")))
            words = _CONTEXT.sub("", text.splitlines()[0][: col.start()]).strip()
            found.append(CodeError(line, column, words))
    seen: set[CodeError] = set()
    return tuple(e for e in found if not (e in seen or seen.add(e)))  # type: ignore[func-returns-value]


def _ours(file: str, files: tuple[str, ...] | None) -> bool:
    return files is None or PurePath(file.strip()).name in {PurePath(f).name for f in files}


def _caret_column(message: str, end: int, code: str, line: int) -> int | None:
    """NVRTC echoes the source line and puts ``^`` under the column: read it back against the Code's
    own line (the echo may be indented differently), None where the log has no caret."""
    after = message[end:].split("\n")[1:3]
    if len(after) < 2 or after[1].strip() != "^":
        return None
    echo, caret = after[0], after[1].index("^")
    source = code.splitlines()[line - 1] if code and 0 < line <= len(code.splitlines()) else None
    if source is None:
        return None
    shift = len(echo.rstrip()) - len(source.rstrip())  # the echo's extra (or missing) indent
    column = caret - shift + 1
    return column if 1 <= column <= len(source) + 1 else None


def _line_and_column(code: str, offset: int) -> tuple[int, int]:
    """1-based ``offset`` into ``code`` as a 1-based (line, column)."""
    before = code[: max(offset - 1, 0)]
    line = before.count("\n") + 1
    return line, offset - (before.rfind("\n") + 1)


def _first_words(lines: list[str]) -> str:
    return next((ln.strip() for ln in lines if ln.strip()), "")
