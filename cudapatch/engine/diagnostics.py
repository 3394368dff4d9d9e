"""Diagnostics: problems found while compiling or running, attached to the block that caused them."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

__all__ = ["Diagnostic", "Severity", "DiagnosticLog"]

Severity = Literal["error", "warning", "info"]
_LEVELS = {"error": logging.ERROR, "warning": logging.WARNING, "info": logging.INFO}


@dataclass(frozen=True)
class Diagnostic:
    """One problem.

    Attributes:
        severity: ``error`` (block does not run), ``warning`` (runs or is skipped), ``info``.
        block_id: The block it belongs to, None for the engine itself.
        code: Stable machine-readable code (``type-mismatch``, ``cycle``, ``input-unlinked`` ...).
        message: Human-readable text naming block, port, parameter, file and line as applicable.
    """

    severity: Severity
    block_id: int | None
    code: str
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.message}"


class DiagnosticLog:
    """Logs each distinct diagnostic once (no log spam when the same problem persists every frame)."""

    def __init__(self, logger: logging.Logger) -> None:
        self._logger = logger
        self._seen: set[Diagnostic] = set()

    def emit(self, diags: tuple[Diagnostic, ...] | list[Diagnostic]) -> None:
        for d in diags:
            if d not in self._seen:
                self._seen.add(d)
                self._logger.log(_LEVELS[d.severity], "%s", d.message)

    def forget(self, keep: set[Diagnostic]) -> None:
        """Forget resolved diagnostics so they are logged again if they come back."""
        self._seen &= keep
