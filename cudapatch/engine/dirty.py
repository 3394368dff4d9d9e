"""DirtyTracker: what changed since the last frame, and so which update tier the next frame needs."""

from __future__ import annotations

from typing import Any

__all__ = ["DirtyTracker"]


class DirtyTracker:
    """Change sets checked once per frame, in priority Structure > Code > Recapture > Parameters.

    ``any`` is a plain attribute so the frame path tests one flag when nothing changed. Structure
    starts dirty (nothing is built yet); clearing structure clears everything, because a rebuild
    applies every pending change.
    """

    __slots__ = ("structure", "code", "captured", "params", "bindings", "any")

    def __init__(self) -> None:
        self.structure = True
        self.code: set[Any] = set()
        self.captured: set[Any] = set()
        self.params: set[tuple[int, str]] = set()
        self.bindings: set[tuple[int, str]] = set()
        self.any = True

    def mark_structure(self) -> None:
        self.structure = True
        self.any = True

    def mark_code(self, key: Any) -> None:
        self.code.add(key)
        self.any = True

    def mark_captured(self, key: Any) -> None:
        self.captured.add(key)
        self.any = True

    def mark_param(self, block_id: int, name: str) -> None:
        self.params.add((block_id, name))
        self.any = True

    def mark_binding(self, block_id: int, port: str) -> None:
        self.bindings.add((block_id, port))
        self.any = True

    @property
    def tier(self) -> str:
        """The most expensive pending tier: ``structure``, ``code``, ``captured``, ``params`` or ``clean``."""
        if self.structure:
            return "structure"
        if self.code:
            return "code"
        if self.captured:
            return "captured"
        if self.params or self.bindings:
            return "params"
        return "clean"

    def clear_structure(self) -> None:
        """After a rebuild: everything is applied."""
        self.structure = False
        self.code.clear()
        self.captured.clear()
        self.params.clear()
        self.bindings.clear()
        self.any = False

    def take_params(self) -> tuple[set[tuple[int, str]], set[tuple[int, str]]]:
        """Return and clear the pending parameter and binding changes."""
        params, bindings = self.params, self.bindings
        self.params, self.bindings = set(), set()
        self._recompute()
        return params, bindings

    def _recompute(self) -> None:
        self.any = bool(self.structure or self.code or self.captured or self.params or self.bindings)
