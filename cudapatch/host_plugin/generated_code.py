"""The code a block generates for its kernel (an Expression's PTX or CUDA C++), for the editor's
"Generated code" section and the overlay's tooltip: generated once per ``Code`` and description, not
once per frame (the panels ask every frame they show it)."""

from __future__ import annotations

from typing import Any

from ..errors import CudapatchError

__all__ = ["GeneratedCode", "code_tooltip"]


class GeneratedCode:
    """Generated code by block, cached by the block's ``Code`` value and description."""

    def __init__(self) -> None:
        self._cache: dict[int, tuple[Any, Any, str | None]] = {}  # block id -> (Code, description, code)

    def of(self, block: Any) -> str | None:
        """``block``'s generated code; None for a block that generates none, or while its ``Code``
        does not compile (the error is the block's diagnostic)."""
        if not hasattr(type(block), "generated_code"):
            return None
        code, desc = block.get("Code"), block.description
        cached = self._cache.get(block.id)
        if cached is not None and cached[0] == code and cached[1] is desc:
            return cached[2]
        try:
            text: str | None = block.generated_code
        except CudapatchError:
            text = None
        self._cache[block.id] = (code, desc, text)
        return text


def code_tooltip(code: str, limit: int = 40) -> str:
    """Generated code as a tooltip shows it: its line count, then its first ``limit`` lines."""
    lines = code.splitlines()
    more = f"\n... {len(lines) - limit} more lines" if len(lines) > limit else ""
    return f"generated code: {len(lines)} lines\n" + "\n".join(lines[:limit]) + more
