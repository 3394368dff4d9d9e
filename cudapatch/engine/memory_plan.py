"""MemoryPlan: which values of a plan share a buffer, which are pinned to their own, and the bytes.

The compiler's memory phase (``compiler/memory.py``) fills it; the plan carries it
(``GraphPlan.memory``). A *value* is what one output port or internal link of a running block
makes in a frame (``values``, sized as it needs); a *buffer* is device memory the graph allocates
(``GraphPlan.buffers``). Without reuse each value is a buffer. With reuse, values whose lifetimes
do not overlap (see ``compiler/liveness.py``) take turns in one buffer, which is as large as the
largest of them and holds raw bytes.

A value in a shared buffer holds its data only until the next value of that buffer is written in
the same frame; the last value of a buffer still holds its data after the frame. ``overwritten``
says which values the host cannot read back.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .plan import BufferPlan

__all__ = ["MemoryPlan", "PinReason", "shares_with_others"]


class PinReason:
    """Why a value keeps a buffer of its own (the strings ``MemoryPlan.pinned`` holds)."""

    SINK = "sink"  #: nothing in the graph reads it: it is a result (the host, GL or a probe reads it)
    KEEP = "keep"  #: asked for: ``keep=True`` on the port, ``Engine.keep`` or ``Engine.output``, the patch file
    APPEND = "append"  #: append output: its count and data are read back
    PROBE = "probe"  #: a probe node reads it beside the graph's work (``Engine.probe``)
    DELAY = "delay"  #: a FrameDelay's pair: read in the next frame, the two buffers alternate
    BYPASS = "bypass"  #: read or made by a bypassed block (its readers read its input or last output)
    IN_PLACE = "in-place"  #: modified in place (``through`` port, ``inout`` pin) or kept across frames
    LIBRARY = "library"  #: written by a captured library call (which may read it: cuBLAS beta, saxpy)


@dataclass(frozen=True)
class MemoryPlan:
    """The memory phase's result.

    Attributes:
        values: Each value as it needs a buffer (``BufferPlan`` records, numbered in the order made).
        value_buffer: Value index -> index of the buffer holding it.
        pinned: ``(value index, PinReason)`` of every value with a buffer of its own by rule.
        ports: ``(block_id, output port)`` -> value index (``through`` ports: the value they carry).
        reuse: Whether buffer reuse was on (off: every value has its own buffer, pinned or not).
    """

    values: tuple[BufferPlan, ...]
    value_buffer: tuple[int, ...]
    pinned: tuple[tuple[int, str], ...] = ()
    ports: dict[tuple[int, str], int] = field(default_factory=dict, compare=False)
    reuse: bool = True

    @property
    def logical_bytes(self) -> int:
        """Bytes the values would take with a buffer each."""
        return sum(v.count * v.dtype.itemsize for v in self.values)

    def buffer_values(self) -> dict[int, tuple[int, ...]]:
        """Buffer index -> its values, in the order they use it (only buffers holding several).
        Made once per plan (a bypass toggle asks on the frame thread); do not modify it."""
        return self._buffer_values

    @cached_property
    def _buffer_values(self) -> dict[int, tuple[int, ...]]:
        out: dict[int, list[int]] = {}
        for vi, b in enumerate(self.value_buffer):
            out.setdefault(b, []).append(vi)
        return {b: tuple(vs) for b, vs in out.items() if len(vs) > 1}

    @cached_property
    def shared_buffers(self) -> frozenset[int]:
        """The buffers several values take turns in."""
        return frozenset(self._buffer_values)

    def shared(self, buffer: int) -> bool:
        """Whether several values take turns in ``buffer``."""
        return self.value_buffer.count(buffer) > 1

    def overwritten(self, value: int) -> bool:
        """Whether a later value of the same frame writes ``value``'s buffer (so the host cannot read it)."""
        b = self.value_buffer[value]
        return any(vb == b for vb in self.value_buffer[value + 1 :])

    def largest(self, n: int = 3) -> tuple[BufferPlan, ...]:
        """The ``n`` largest values, largest first (for messages)."""
        return tuple(sorted(self.values, key=lambda v: -v.count * v.dtype.itemsize)[:n])

    def describe(self, names: dict[int, str] | None = None) -> str:
        """One line per shared buffer: which values take turns in it."""
        names = names or {}
        lines = []
        for b, vs in self.buffer_values().items():
            who = ", ".join(
                f"{names.get(self.values[v].block_id, self.values[v].block_id)}.{self.values[v].label}" for v in vs
            )
            lines.append(f"  buffer {b}: {who}")
        return "\n".join(lines)


def shares_with_others(plan: Any, blocks: Iterable[int]) -> set[int]:
    """Those of ``blocks`` whose nodes read or write a buffer several values share in ``plan`` (a
    ``GraphPlan``): bypassing one would have its readers read another block's data."""
    mem = plan.memory
    if mem is None or not mem.shared_buffers:
        return set()
    shared = mem.shared_buffers
    out = set()
    for bid in blocks:
        for ni in plan.block_nodes.get(bid, ()):
            n = plan.nodes[ni]
            used = [a.ref for a in getattr(n, "args", ()) if a.kind == "buffer"]
            if getattr(n, "buffer", None) is not None:
                used.append(n.buffer)
            if any(bi in shared for bi in used):
                out.add(bid)
                break
    return out
