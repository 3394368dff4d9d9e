"""The memory phases: which buffer holds each value the sizes phase found.

The sizes phase records each value as the ``BufferPlan`` it would need on its own, numbered in the
order values are made. ``memory`` (before the nodes phase) gives every value its own buffer, as the
nodes and edges phases see it (buffer index = value index), adds an append counter to each append
output's data, and finds the values pinned to a buffer of their own. ``share`` (after the edges
phase) lets values whose lifetimes do not overlap share a buffer: liveness over the finished
nodes' partial order (``liveness.py``), so sharing adds no edge; then it renumbers the buffers the
nodes, outputs and append outputs name. Without reuse, or when nothing can share, the buffers stay
the values, exactly as before reuse existed. A ``through`` output makes no value: it names the
buffer of the value it carries.

Pinned (``memory_plan.PinReason``), so never shared:

- results: values nothing in the graph reads (the host, GL read them); probed values;
- kept: ``keep=True`` on the port (a FrameDelay's state, a block that wants its output readable),
  ``Engine.keep`` / ``Engine.output`` (the host reads it), ``keep`` in the patch file; a kept input
  keeps the value it reads;
- append outputs (counts and data are read back);
- values modified in place or read before written: a ``through`` port's value, any value bound to
  an ``inout`` pin (state kept across frames, like the particle emitter's);
- values written by captured library calls (cuBLAS with beta, saxpy read their output);
- a FrameDelay's pair: its ``Out`` and the value linked into its ``In`` (they alternate every frame);
- every value a bypassed block reads or makes (its readers may read its input instead, or its last
  output: see ``engine/bypass.py``).

Shared buffers are raw bytes (``uint8``), as large as their largest value, labelled ``shared<k>``
(block -1); buffers are numbered in the order of their first value.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

from ...kernels.types import DType
from ..memory_plan import MemoryPlan, PinReason
from ..plan import Arg, BufferPlan
from .draft import BlockSizes, PlanDraft
from .liveness import Lifetime, ancestors, assign_buffers

__all__ = ["SHARED_BLOCK", "memory", "order_keys", "pins_read", "pins_written", "share"]

_new = tuple.__new__  # skips NamedTuple.__new__ (see plan.py)
SHARED_BLOCK = -1  #: ``BufferPlan.block_id`` of a buffer several values share


def memory(draft: PlanDraft, pins: dict[int, str] | None = None) -> None:
    """Fill ``draft.buffers`` (one per value), ``value_buffer``, ``counters``, ``value_counter``,
    ``outputs``, ``appends`` and ``memory`` (with the pinned values; ``pins``: found already, by
    incremental planning)."""
    counters, appends, value_counter = draft.counters, draft.appends, draft.value_counter
    values = draft.values
    for v in values:
        if v.append:
            key = (v.block_id, v.label)
            ci = len(counters)
            counters.append(key)
            appends[key] = (v.index, ci)
            value_counter[v.index] = ci
    draft.buffers = values  # one buffer per value: the records sizes made are the buffers
    value_buffer = draft.value_buffer = list(range(len(values)))
    draft.outputs = {port: value_buffer[vi] for port, vi in draft.ports.items()}
    draft.memory = MemoryPlan(
        values=tuple(values),
        value_buffer=tuple(value_buffer),
        pinned=tuple(sorted((_pins(draft) if pins is None else pins).items())),
        ports=dict(draft.ports),
        reuse=draft.reuse,
    )


def share(draft: PlanDraft) -> None:
    """Let values with disjoint lifetimes share buffers (when ``draft.reuse``): rewrite ``buffers``,
    ``value_buffer``, the buffer arguments of ``nodes``, ``outputs``, ``appends`` and ``memory``."""
    mem = draft.memory
    values = draft.values
    if not draft.reuse or mem is None or len(values) < 3:
        return
    touch: list[list[int]] = [[] for _ in values]
    preds: list[tuple[int, ...]] = []
    for n in draft.nodes:
        i = n.index
        preds.append(n.deps)
        args = getattr(n, "args", None)
        if args is not None:
            for a in args:
                if a.kind == "buffer":
                    t = touch[a.ref]  # type: ignore[index]
                    if not t or t[-1] != i:
                        t.append(i)
        elif getattr(n, "buffer", None) is not None:  # a memset zeroing a faulted block's output, a probe
            touch[n.buffer].append(i)  # type: ignore[union-attr]
    pinned = {vi for vi, _ in mem.pinned}
    lifetimes = [
        Lifetime(tuple(t), v.count * v.dtype.itemsize, v.index in pinned) for v, t in zip(values, touch, strict=True)
    ]
    keys = order_keys(touch, values, draft.block_nodes)
    order = sorted(range(len(values)), key=keys.__getitem__)
    assigned, sizes = assign_buffers([lifetimes[vi] for vi in order], ancestors(preds))
    if len(sizes) == len(values):
        return  # nothing shared: the values stay the buffers
    value_buffer = [0] * len(values)
    for vi, b in zip(order, assigned, strict=True):
        value_buffer[vi] = b
    draft.buffers = _buffers(values, value_buffer, sizes)
    draft.value_buffer = value_buffer
    nodes = draft.nodes
    for i, n in enumerate(nodes):
        args = getattr(n, "args", None)
        if args is not None:
            if any(a.kind == "buffer" for a in args):
                new_args = tuple(
                    _new(Arg, (a.kind, a.dtype, True, value_buffer[a.ref], None)) if a.kind == "buffer" else a  # type: ignore[index]
                    for a in args
                )
                nodes[i] = n._replace(args=new_args)
        elif getattr(n, "buffer", None) is not None:
            nodes[i] = n._replace(buffer=value_buffer[n.buffer])  # type: ignore[union-attr]
    draft.outputs = {port: value_buffer[vi] for port, vi in draft.ports.items()}
    for key, (vi, ci) in draft.appends.items():
        draft.appends[key] = (value_buffer[vi], ci)
    draft.memory = MemoryPlan(
        values=mem.values, value_buffer=tuple(value_buffer), pinned=mem.pinned, ports=mem.ports, reuse=True
    )


def order_keys(
    touch: list[list[int]], values: list[BufferPlan], block_nodes: Mapping[int, tuple[int, ...]]
) -> list[int]:
    """Each value's place in the order of the buffer assignment: twice its first node; a value no node
    touches (a fused group's intermediate: its buffer is a placeholder) just before the first node of its
    block (the group's node), so that an edit after the group leaves its buffer's number as it was
    (incremental planning resumes the assignment there, ``resume.py``); -1 for a block without nodes."""
    out = []
    for v, t in zip(values, touch, strict=True):
        if t:
            out.append(2 * t[0])
        else:
            idx = block_nodes.get(v.block_id)
            out.append(2 * idx[0] - 1 if idx else -1)
    return out


def _buffers(values: list[BufferPlan], value_buffer: list[int], sizes: list[int]) -> list[BufferPlan]:
    """The buffer records: a value alone keeps its own record (renumbered), a shared one is raw bytes."""
    first: dict[int, int] = {}
    count = [0] * len(sizes)
    for vi, b in enumerate(value_buffer):
        first.setdefault(b, vi)
        count[b] += 1
    out: list[BufferPlan] = []
    shared = 0
    for b, size in enumerate(sizes):
        if count[b] == 1:
            v = values[first[b]]
            out.append(_new(BufferPlan, (b, v.block_id, v.label, v.dtype, v.count, v.append)))
        else:
            out.append(_new(BufferPlan, (b, SHARED_BLOCK, f"shared{shared}", DType.UINT8, size, False)))
            shared += 1
    return out


def _pins(draft: PlanDraft) -> dict[int, str]:
    """Value index -> why it keeps its own buffer, for every pinned value."""
    pinned: dict[int, str] = {}
    read: dict[int, None] = {}
    kept = draft.snap.kept
    faulted = draft.faulted or {}
    for sized in draft.sized.values():
        block_pins(sized, kept, faulted, pinned, read)
    return finish_pins(draft, pinned, read)


def block_pins(
    sized: BlockSizes, kept: Collection[tuple[int, str]], faulted: Mapping[int, str], pinned: dict, read: dict
) -> None:
    """Add what one block pins to ``pinned`` (value index -> reason, the first reason found, in block
    order) and the values it reads to ``read`` (both insertion-ordered: incremental planning takes
    the entries of the blocks before an edit as they were, ``resume.py``)."""
    b = sized.block
    d = b.description
    kernels = d.kernels
    reads_inputs = b.id not in faulted  # a faulted block's memsets read nothing
    for port in d.inputs:
        src = sized.inputs.get(port.name)
        if src is None or src.kind != "value":
            continue
        vi: int = src.ref  # type: ignore[assignment]
        if reads_inputs and port.pins:
            read[vi] = None
        if port.keep or (b.id, port.name) in kept:
            pinned.setdefault(vi, PinReason.KEEP)
        elif pins_written(kernels, port.pins):
            pinned.setdefault(vi, PinReason.IN_PLACE)
    for port in d.outputs:
        src = sized.outputs[port.name]
        if src.kind != "value":
            continue
        vi = src.ref  # type: ignore[assignment]
        if port.kind == "through":
            pinned.setdefault(vi, PinReason.IN_PLACE)
        elif port.kind == "append":
            pinned.setdefault(vi, PinReason.APPEND)
        elif port.keep or (b.id, port.name) in kept:
            pinned.setdefault(vi, PinReason.KEEP)
        elif pins_read(kernels, port.pins):
            pinned.setdefault(vi, PinReason.IN_PLACE)
        elif any(kernels[p.kernel].source is None for p in port.pins):
            pinned.setdefault(vi, PinReason.LIBRARY)
    for link, vi in zip(d.internal_links, sized.internal, strict=True):
        if pins_read(kernels, (link.src,)) or pins_written(kernels, link.dst):
            pinned.setdefault(vi, PinReason.IN_PLACE)
        elif kernels[link.src.kernel].source is None:
            pinned.setdefault(vi, PinReason.LIBRARY)


def finish_pins(draft: PlanDraft, pinned: dict[int, str], read: Collection[int]) -> dict[int, str]:
    """``pinned`` (every block's pins, ``block_pins``) with the pins of probes, bypassed blocks, delays
    and values nothing reads added."""
    for key, _shape in draft.snap.probes:  # a probe node reads it beside the graph's work
        vi = draft.ports.get(key)
        if vi is not None:
            pinned.setdefault(vi, PinReason.PROBE)
    bypassed = draft.snap.bypassed
    for bid in bypassed:  # readers may be redirected to its inputs, or read its last outputs
        sized = draft.sized.get(bid)
        if sized is not None:
            for src in (*sized.inputs.values(), *sized.outputs.values()):
                if src.kind == "value":
                    pinned.setdefault(src.ref, PinReason.BYPASS)  # type: ignore[arg-type]
            for vi in sized.internal:
                pinned.setdefault(vi, PinReason.BYPASS)
    for _bid, previous, current in draft.delays:  # a FrameDelay's pair lives on into the next frame
        for vi in (previous, current):
            if vi is not None:
                pinned.setdefault(vi, PinReason.DELAY)
    internal = {vi for sized in draft.sized.values() if sized.internal for vi in sized.internal}
    for vi in range(len(draft.values)):
        if vi not in read and vi not in internal:
            pinned.setdefault(vi, PinReason.SINK)
    return pinned


def pins_read(kernels: tuple, pins: tuple) -> bool:
    """Whether a kernel reads what it is given through one of ``pins`` (an ``in`` or ``inout`` pin)."""
    return any(kernels[p.kernel].descriptor.parameters[p.param].direction != "out" for p in pins)


def pins_written(kernels: tuple, pins: tuple) -> bool:
    """Whether a kernel writes what it is given through one of ``pins`` (an ``out`` or ``inout`` pin)."""
    return any(kernels[p.kernel].descriptor.parameters[p.param].direction != "in" for p in pins)
