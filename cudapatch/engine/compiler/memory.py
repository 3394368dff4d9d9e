"""The memory phase: which buffer holds each value the sizes phase found.

Today every output a block makes gets a buffer of its own, sized by its count, and so does every
internal link; an append output gets its data buffer and an append counter. A ``through`` output
allocates nothing: it names the buffer of the value it carries. Buffer indices follow block order,
then each block's outputs in port order, then its internal links.

This is the room where liveness analysis grows: values whose lifetimes do not overlap may share
one buffer; values read by the host, GL, a delay or a probe stay their own.
"""

from __future__ import annotations

from ..plan import BufferPlan
from .draft import BlockMemory, PlanDraft

__all__ = ["memory"]

_new = tuple.__new__  # skips NamedTuple.__new__: several times cheaper (see plan.py)
_NO_COUNTERS: dict[str, int] = {}  # shared by the blocks without append outputs (never written)


def memory(draft: PlanDraft) -> None:
    """Fill ``draft.buffers``, ``counters``, ``memory``, ``outputs`` and ``appends``."""
    buffers, counters, outputs, appends, placed = (
        draft.buffers,
        draft.counters,
        draft.outputs,
        draft.appends,
        draft.memory,
    )
    for bid, sized in draft.sized.items():
        d = sized.block.description
        ports: dict[str, int] = {}
        port_counters = _NO_COUNTERS
        for port, value in zip(d.outputs, sized.outputs.values(), strict=True):
            if port.kind == "through":
                if value.kind == "output":  # in place: the buffer that holds the input
                    outputs[(bid, port.name)] = outputs[value.ref]  # type: ignore[index]
                continue
            key: tuple[int, str] = value.ref  # type: ignore[assignment]  # its own value: (bid, port)
            append = port.kind == "append"
            bi = len(buffers)
            buffers.append(_new(BufferPlan, (bi, bid, port.name, port.dtype, value.count, append)))
            ports[port.name] = bi
            outputs[key] = bi
            if append:
                ci = len(counters)
                counters.append(key)
                appends[key] = (bi, ci)
                if port_counters is _NO_COUNTERS:
                    port_counters = {}
                port_counters[port.name] = ci
        internal: tuple[int, ...] = ()
        if d.internal_links:
            first = len(buffers)
            for i, (link, count) in enumerate(zip(d.internal_links, sized.internal, strict=True)):
                buffers.append(_new(BufferPlan, (first + i, bid, f"internal{i}", link.dtype, count, False)))
            internal = tuple(range(first, len(buffers)))
        placed[bid] = _new(BlockMemory, (ports, port_counters, internal))
