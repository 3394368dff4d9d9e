"""The expression language's error: a ``KernelLoadError`` that knows the column."""

from __future__ import annotations

from ..errors import KernelLoadError

__all__ = ["ExpressionError", "caret"]


class ExpressionError(KernelLoadError):
    """An expression that cannot become a kernel: a syntax error, an unknown function, a type error,
    a name that collides with a port. ``column`` is 1-based; the message ends with it.

    Args:
        message: What is wrong.
        column: Where, 1-based (None when the whole expression is meant).
        **context: ``block``, ``param`` ... as for every ``CudapatchError``.
    """

    def __init__(self, message: str, *, column: int | None = None, **context: object) -> None:
        # The column is part of the message: whoever re-raises the message (a patch file's loader) keeps it.
        super().__init__(message if column is None else f"{message} (column {column})", **context)  # type: ignore[arg-type]
        self.column = column


def caret(text: str, column: int | None) -> str:
    """``text`` with a ``^`` under ``column`` on the next line, for tooltips and logs."""
    if column is None:
        return text
    return f"{text}\n{' ' * (column - 1)}^"
