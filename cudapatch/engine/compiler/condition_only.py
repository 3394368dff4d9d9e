"""Blocks of an unrolled ``While`` whose values only the condition reads: made once per condition check.

A ``While`` unrolled by U (``Unroll``) reads its ``Condition`` once per pass of U copies of its body,
after the last copy. A block whose values are read by nothing in the body but the condition (or by
other such blocks) computes, in the first U - 1 copies, values nobody reads: in Jacobi's patch the
``Decide`` block, a residual reduction. ``region_nodes`` leaves such blocks out of every copy of the
main body but the last; the tails (one check per iteration, or per pair) keep them. What changes:
nothing a reader can see. The condition read after each pass, every block and region after the loop,
the host (``engine.read``) and the probes see the values of the last iteration run, as before; only
values that no one reads are not computed. The same holds for a block inside the loop whose outputs
nobody inside it reads (a sink, read by the host or after the loop): it is made once per pass too.

A block qualifies when it is a kernel block placed directly in the loop (not in a region inside it),
is no FrameDelay, writes only the values it makes, each without reading it first (no in-place or
append output, no captured library call, no probe on it), and every reader of a value it makes is
the loop's ``Condition``, another qualifying block, or a block after the loop.
"""

from __future__ import annotations

from ...blocks.regions import CONDITION
from .draft import PlanDraft
from .memory import pins_read, pins_written

__all__ = ["condition_only"]


def _plain(draft: PlanDraft, bid: int, probed: set[tuple[int, str]]) -> bool:
    """Whether block ``bid`` writes nothing but the values it makes, each written before it is read."""
    sized = draft.sized[bid]
    d = sized.block.description
    if d.feedback or bid in draft.units:
        return False
    kernels = d.kernels
    if any(k.source is None for k in kernels):  # a captured call: its writes are not listed by port
        return False
    if any(pins_written(kernels, port.pins) for port in d.inputs):
        return False
    for port in d.outputs:
        if port.kind != "buffer" or pins_read(kernels, port.pins):
            return False
    return not any((bid, port.name) in probed for port in d.outputs)


def _body(draft: PlanDraft, rid: int) -> list[int]:
    """The blocks and regions inside region ``rid``, at any depth."""
    out: list[int] = []
    stack = [rid]
    while stack:
        for u in draft.units.get(stack.pop(), ()):
            out.append(u)
            if u in draft.units:
                stack.append(u)
    return out


def condition_only(draft: PlanDraft, rid: int) -> frozenset[int]:
    """The blocks of ``While`` ``rid`` made only in the last copy of its main body (see the module docstring)."""
    if (rid, CONDITION) not in draft.incoming or rid not in draft.sized:
        return frozenset()
    sized, values = draft.sized, draft.values
    probed = {key for key, _ in draft.snap.probes}
    members = {u for u in draft.units.get(rid, ()) if u in sized and _plain(draft, u, probed)}
    if not members:
        return frozenset()
    # per block in the loop (at any depth), the members whose values it reads; a delay reads the value
    # linked into its In (no input of the sizes phase: the link is cut)
    makers: dict[int, set[int]] = {}
    for r in _body(draft, rid):
        s = sized.get(r)
        if s is not None:
            for src in s.inputs.values():
                if src.kind == "value":
                    m = values[src.ref].block_id  # type: ignore[index]
                    if m in members:
                        makers.setdefault(r, set()).add(m)
    for bid, _, cur in draft.delays:
        if cur is not None and values[cur].block_id in members and draft.inside(bid, rid):
            makers.setdefault(bid, set()).add(values[cur].block_id)
    # a reader elsewhere in the loop needs every copy's value: its members are not condition-only, and
    # neither are the members read by those, and so on
    out = [m for r, ms in makers.items() if r not in members for m in ms]
    while out:
        m = out.pop()
        if m in members:
            members.discard(m)
            out.extend(makers.get(m, ()))
    return frozenset(members)
