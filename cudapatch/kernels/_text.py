"""Linear-time text helpers shared by the loaders: comment stripping, line numbers, and the limits
on parsed data (nesting depth, integer size, parameter count).

Every helper here runs in time linear in its input, whatever the input is. The regular expressions
they replace were quadratic on inputs a fuzzer finds in seconds: ``re.sub(r"/\\*.*?\\*/", ...)`` on
``'/*a\\n' * 20000`` (no comment ever closes, so each ``/*`` scans to the end: 8-12 s for 80 KB),
and ``text.count("\\n", 0, pos)`` once per parameter or entry (5-9 s for 20,000 sidecar
parameters).
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterator
from typing import Any

__all__ = [
    "MAX_NESTING",
    "MAX_INT_BITS",
    "INT_DIGITS_LIMIT",
    "MAX_KERNEL_PARAMETERS",
    "LineIndex",
    "data_problem",
    "short_repr",
    "strip_c_comments",
]

#: Deepest nesting of lists and tables accepted in a sidecar or a patch file. Real files nest 3 deep.
MAX_NESTING = 32
#: Largest integer (in bits, sign apart) accepted in a sidecar or a patch file: 64-bit values.
MAX_INT_BITS = 64
#: ``sys.get_int_max_str_digits()``'s default: ``int()`` (and so ``json`` and ``tomllib``) refuses
#: longer decimal text, saying not where; the loaders find the line themselves.
INT_DIGITS_LIMIT = 4300
#: Most parameters a kernel may have. CUDA's parameter buffer holds 32,764 bytes (4,096 before
#: CUDA 12.1), so a real kernel has far fewer; the limit keeps every per-parameter check bounded.
MAX_KERNEL_PARAMETERS = 1024

_COMMENT_START = re.compile(r"/[/*]")


def strip_c_comments(text: str) -> tuple[str, int | None]:
    """``text`` with ``//`` and ``/* */`` comments replaced by a space (a block comment keeps its
    newlines, so line numbers stay right). String literals are not recognised (neither PTX signatures
    nor kernel signatures contain any).

    Returns:
        The clean text, and the offset in ``text`` of a ``/*`` that is never closed (None if all
        are). An unclosed comment runs to the end, as a C compiler reads it.
    """
    out: list[str] = []
    pos = 0
    n = len(text)
    while pos < n:
        m = _COMMENT_START.search(text, pos)
        if m is None:
            break
        start = m.start()
        out.append(text[pos:start])
        if text[start + 1] == "/":
            end = text.find("\n", start)
            pos = n if end < 0 else end  # the newline stays
            out.append(" ")
            continue
        end = text.find("*/", start + 2)
        if end < 0:
            out.append(" " + "\n" * text.count("\n", start))
            return "".join(out), start
        out.append(" " + "\n" * text.count("\n", start, end))
        pos = end + 2
    out.append(text[pos:])
    return "".join(out), None


class LineIndex:
    """1-based line numbers of offsets in a text, each in O(log lines) after one linear pass."""

    def __init__(self, text: str) -> None:
        self._starts = [0]
        find = text.find
        pos = find("\n")
        while pos >= 0:
            self._starts.append(pos + 1)
            pos = find("\n", pos + 1)

    def line(self, offset: int) -> int:
        """The line ``offset`` is on."""
        return bisect.bisect_right(self._starts, offset)

    def __len__(self) -> int:
        return len(self._starts)


def short_repr(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to about ``limit`` characters, safe for any value a parser returns (a
    2,000-digit integer or a deep list makes a message, not an exception or a page of text)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"an integer of {value.bit_length()} bits"
    try:
        text = repr(value)
    except (ValueError, RecursionError):  # an integer too long for str(), a structure too deep
        return f"a {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 12] + "…" + text[-10:]


def _walk(value: Any) -> Iterator[tuple[Any, int, tuple[str, ...]]]:
    """Every value inside ``value`` with its depth and key path, without recursion."""
    stack: list[tuple[Any, int, tuple[str, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        yield item, depth, path
        if isinstance(item, dict):
            stack.extend((v, depth + 1, (*path, str(k))) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((v, depth + 1, (*path, f"[{i}]")) for i, v in enumerate(item))


def data_problem(
    data: Any, *, max_depth: int = MAX_NESTING, max_int_bits: int = MAX_INT_BITS
) -> tuple[str, tuple[str, ...]] | None:
    """The first value in parsed JSON/TOML ``data`` beyond the limits, as a message and the key path
    to it (for finding its line), or None.

    Checked: nesting deeper than ``max_depth`` lists/tables, integers wider than ``max_int_bits``.
    """
    for item, depth, path in _walk(data):
        if depth > max_depth:
            return f"values are nested more than {max_depth} deep (the limit is {max_depth} levels)", path
        if isinstance(item, int) and not isinstance(item, bool) and item.bit_length() > max_int_bits:
            return (
                f"an integer of {item.bit_length()} bits is too large (integers may have at most {max_int_bits} bits)",
                path,
            )
    return None
