"""The code a block generates for its kernel (an Expression's PTX or CUDA C++), for the editor's
"Generated code" section and the overlay's tooltip."""

from __future__ import annotations

from typing import Any

from ..errors import CudapatchError

__all__ = ["code_tooltip", "generated_code"]


def generated_code(block: Any) -> str | None:
    """``block``'s generated code; None for no block, a block that generates none, or while its
    ``Code`` does not compile (the error is the block's diagnostic). Generated once per source
    (``ProgramSource.code``), so the panels may ask every frame."""
    if block is None or not hasattr(type(block), "generated_code"):
        return None
    try:
        return block.generated_code
    except CudapatchError:
        return None


def code_tooltip(code: str, limit: int = 40) -> str:
    """Generated code as a tooltip shows it: its line count, then its first ``limit`` lines."""
    lines = code.splitlines()
    more = f"\n... {len(lines) - limit} more lines" if len(lines) > limit else ""
    return f"generated code: {len(lines)} lines\n" + "\n".join(lines[:limit]) + more
