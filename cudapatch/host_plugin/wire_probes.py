"""``WireProbes``: the editor's probes on wires, kept by the output they read (``engine.probe``).

Selecting a wire probes the output it leaves (every wire from that output shares the probe); the probe
stays, so a NaN or Inf appearing there later still marks the wire, until the user removes it. Once per
frame ``refresh`` takes each probe's newest statistics (plain loads from the engine's readback ring),
and the panel reads them from ``latest``: no driver call, no synchronize. Probes are not part of the
patch file: they are a view, like the selection.
"""

from __future__ import annotations

from typing import Any

from ..errors import CudapatchError

__all__ = ["WireProbes"]

Key = tuple[str, str]  # (operator, output port)


class WireProbes:
    """Probes the editor placed, by ``(operator, output port)``.

    Args:
        adapter: The host adapter (its engine makes the probes; an engine without ``probe`` has none).
    """

    def __init__(self, adapter: Any) -> None:
        self._adapter = adapter
        self._probes: dict[Key, Any] = {}
        #: The newest statistics of each probe (``ProbeStats``, or None until its first frame), by key.
        self.latest: dict[Key, Any] = {}

    @property
    def available(self) -> bool:
        """Whether the engine has probes (the isolated engine, for one, has none)."""
        return hasattr(self._adapter.engine, "probe")

    def add(self, op: str, port: str, block: Any = None) -> str | None:
        """Probe output ``port`` of ``op`` (``block``: its block, when ``op`` names an inner block of an open
        composite); returns why not, or None. Probing it again changes nothing."""
        if (op, port) in self._probes:
            return None
        if not self.available:
            return "this engine has no probes"
        try:
            block = block if block is not None else self._adapter.block(op)
            self._probes[(op, port)] = self._adapter.engine.probe(block, port)
        except CudapatchError as exc:
            return str(exc)
        self.latest[(op, port)] = None
        return None

    def remove(self, op: str, port: str) -> bool:
        """Stop probing ``op.port``; returns whether it was probed."""
        p = self._probes.pop((op, port), None)
        self.latest.pop((op, port), None)
        if p is None:
            return False
        p.close()
        return True

    def __contains__(self, key: Key) -> bool:
        return key in self._probes

    def __len__(self) -> int:
        return len(self._probes)

    def bad(self, op: str, port: str) -> bool:
        """Whether the newest statistics of ``op.port`` have a NaN or an Inf."""
        st = self.latest.get((op, port))
        return st is not None and st.bad

    def refresh(self) -> None:
        """Take every probe's newest statistics (once per frame)."""
        for key, p in self._probes.items():
            self.latest[key] = p.stats

    def sync(self, nodes: Any) -> None:
        """After an edit: forget the probes of nodes that are gone (an operator's went with its block) or
        whose block changed (a composite file read again made new inner blocks). ``nodes``: node views
        by name, the inner nodes of open composites among them."""
        gone = [
            k
            for k, p in self._probes.items()
            if k[0] not in nodes or ("/" in k[0] and nodes[k[0]].block_id != p.key[0])  # an inner block made anew
        ]
        for key in gone:
            self._probes.pop(key).close()  # no change where the engine dropped it already
            self.latest.pop(key, None)

    def remove_inside(self, op: str) -> None:
        """Remove the probes inside composite ``op`` (closed: its inner wires are not drawn)."""
        for key in [k for k in self._probes if k[0].startswith(op + "/")]:
            self.remove(*key)

    def renamed(self, old: str, new: str) -> None:
        """``old`` is called ``new`` now: its probes follow (they probe the same block)."""
        for key in [k for k in self._probes if k[0] == old]:
            self._probes[(new, key[1])] = self._probes.pop(key)
            self.latest[(new, key[1])] = self.latest.pop(key, None)

    def close(self) -> None:
        """Remove every probe."""
        for key in list(self._probes):
            self.remove(*key)
