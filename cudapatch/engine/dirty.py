"""DirtyTracker: what changed since the last frame, and so which update tier the next frame needs."""

from __future__ import annotations

from typing import Any

__all__ = ["DirtyTracker"]


class DirtyTracker:
    """Change sets checked once per frame, in priority Structure > Code > Recapture > Parameters.

    ``any`` is a plain attribute so the frame path tests one flag when nothing changed, and
    ``beyond_params`` (structure, code or a re-capture pending) one more in a Hot or Warm frame. Structure
    starts dirty (nothing is built yet); clearing structure clears everything, because a rebuild
    applies every pending change.
    """

    __slots__ = ("structure", "code", "captured", "params", "bindings", "bypass", "any", "beyond_params")

    def __init__(self) -> None:
        self.structure = True
        self.code: set[Any] = set()
        self.captured: set[Any] = set()
        # (block_id, name) -> the BlockParameter / ExternalBinding itself, so applying a change needs
        # no lookups: the Hot tier's whole budget is a few microseconds.
        self.params: dict[tuple[int, str], Any] = {}
        self.bindings: dict[tuple[int, str], Any] = {}
        self.bypass = False  # a block's ``enabled`` flag changed (the Bypass tier: nodes off or on)
        self.any = True
        self.beyond_params = True  # not ``only_params``, kept as a flag: two property calls less per edit frame

    def mark_structure(self) -> None:
        self.structure = True
        self.any = self.beyond_params = True

    def mark_code(self, key: Any) -> None:
        self.code.add(key)
        self.any = self.beyond_params = True

    def mark_captured(self, key: Any) -> None:
        self.captured.add(key)
        self.any = self.beyond_params = True

    def mark_bypass(self) -> None:
        self.bypass = True
        self.any = True

    def take_bypass(self) -> bool:
        """Return and clear the pending bypass change."""
        bypass, self.bypass = self.bypass, False
        # (``beyond_params`` does not change: only what a bypass adds is taken)
        self.any = bool(self.beyond_params or self.params or self.bindings)
        return bypass

    def mark_param(self, block_id: int, name: str, param: Any = None) -> None:
        self.params[(block_id, name)] = param
        self.any = True

    def mark_binding(self, block_id: int, port: str, binding: Any = None) -> None:
        self.bindings[(block_id, port)] = binding
        self.any = True

    @property
    def only_params(self) -> bool:
        """True when the pending changes are Hot/Warm only (the fast path)."""
        return not self.beyond_params

    @property
    def tier(self) -> str:
        """The most expensive pending tier: ``structure``, ``code``, ``captured``, ``params`` or ``clean``."""
        if self.structure:
            return "structure"
        if self.code:
            return "code"
        if self.captured:
            return "captured"
        if self.params or self.bindings or self.bypass:
            return "params"
        return "clean"

    def clear_structure(self) -> None:
        """After a rebuild: everything is applied."""
        self.structure = False
        self.code.clear()
        self.captured.clear()
        self.params.clear()
        self.bindings.clear()
        self.bypass = False  # a build applies the bypass flags to the graph it makes
        self.any = self.beyond_params = False

    def take_code(self) -> set[Any]:
        """Return and clear the pending kernel-code changes."""
        code = set(self.code)
        self.code.clear()
        self._recompute()
        return code

    def defer_structure(self) -> None:
        """Leave the structure change unapplied until something marks it again: a failed rebuild is
        not retried every frame, and a rebuild waiting for a compile is marked again when it lands."""
        self.structure = False
        self._recompute()

    def forget_code_and_captured(self) -> None:
        """Drop pending code and re-capture marks: the build that just ran (or failed) dealt with them."""
        self.code.clear()
        self.captured.clear()
        self._recompute()

    def take_params(self) -> tuple[dict[tuple[int, str], Any], dict[tuple[int, str], Any]]:
        """Return and clear the pending parameter and binding changes."""
        params, bindings = self.params, self.bindings
        self.params, self.bindings = {}, {}
        self._recompute()
        return params, bindings

    def swap_params(
        self, spare: tuple[dict[tuple[int, str], Any], dict[tuple[int, str], Any]]
    ) -> tuple[dict[tuple[int, str], Any], dict[tuple[int, str], Any]]:
        """``take_params`` for the frame thread's Hot/Warm tier: ``spare`` (two empty dicts, the ones an
        earlier swap returned, cleared) takes the pending changes' place, so an edit frame makes no
        dicts. Returns the pending parameter and binding changes."""
        taken = self.params, self.bindings
        self.params, self.bindings = spare
        # The new two are empty unless another thread's ``set()`` has just marked one: that edit stays pending.
        self.any = bool(self.beyond_params or self.bypass or self.params or self.bindings)
        return taken

    def _recompute(self) -> None:
        self.beyond_params = beyond = bool(self.structure or self.code or self.captured)
        self.any = bool(beyond or self.params or self.bindings or self.bypass)
