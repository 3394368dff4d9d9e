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

__all__ = ["condition_only"]


def _inside(draft: PlanDraft, bid: int, rid: int) -> bool:
    r = draft.parents.get(bid)
    while r is not None:
        if r == rid:
            return True
        r = draft.parents.get(r)
    return False


def _plain(draft: PlanDraft, bid: int) -> bool:
    """Whether block ``bid`` writes nothing but the values it makes, each written before it is read."""
    sized = draft.sized[bid]
    d = sized.block.description
    if d.feedback or bid in draft.units:
        return False
    kernels = d.kernels
    if any(k.source is None for k in kernels):  # a captured call: its writes are not listed by port
        return False
    for port in d.inputs:
        if any(kernels[p.kernel].descriptor.parameters[p.param].direction != "in" for p in port.pins):
            return False
    for port in d.outputs:
        if port.kind != "buffer":
            return False
        if any(kernels[p.kernel].descriptor.parameters[p.param].direction != "out" for p in port.pins):
            return False
    probed = {key for key, _ in draft.snap.probes}
    return not any((bid, port.name) in probed for port in d.outputs)


def condition_only(draft: PlanDraft, rid: int) -> frozenset[int]:
    """The blocks of ``While`` ``rid`` made only in the last copy of its main body (see the module docstring)."""
    if (rid, CONDITION) not in draft.incoming or rid not in draft.sized:
        return frozenset()
    members = {u for u in draft.units.get(rid, ()) if u in draft.sized and _plain(draft, u)}
    if not members:
        return frozenset()
    readers: dict[object, set[int]] = {}
    for s in draft.sized.values():
        for src in s.inputs.values():
            if src.kind == "value":
                readers.setdefault(src.ref, set()).add(s.block.id)
    for bid, _, cur in draft.delays:  # a delay's In is no input of the sizes phase: the link is cut
        if cur is not None:
            readers.setdefault(cur, set()).add(bid)
    # a reader elsewhere in the loop (not the region itself, not after it) needs every copy's value
    inner = {r for rs in readers.values() for r in rs if r != rid and _inside(draft, r, rid)}
    changed = True
    while changed:
        changed = False
        for u in sorted(members):
            for vi in draft.sized[u].made:
                if any(r in inner and r not in members for r in readers.get(vi, ())):
                    members.discard(u)
                    changed = True
                    break
    return frozenset(members)
