"""FrameDelays in a patch with regions: carried by a copy, not by two alternating graphs.

The two-phase alternation (``engine/phases.py``) is a host choice per launch; inside a ``For`` or
``While`` body the iterations are decided on the device, so there a delay is carried by a copy
(``engine/delay_copy.py``): the body reads the delay's ``Out`` buffer and writes its ``In``
buffer, and a copy kernel last in the delay's scope copies ``In`` into ``Out`` at the end of every
iteration: iteration k+1 (and the first iteration of the next frame) reads what iteration k wrote.
Every delay of a patch with regions is carried this way, a top-level one once a frame, so the
patch keeps one executable graph.

``region_nodes`` calls these two while it walks the scopes:

- ``delay_inits``: before a top-level region, the nodes of the delays inside it (at any depth):
  their init kernel writes the start value once, before the loop (enabled for one launch, like any
  delay's: the first frame and after ``reset()``); a node inside a body would run every iteration.
- ``delay_copies``: at the end of a scope, the copy node of each delay placed in it, which the edges
  phase orders after every writer of ``In`` and every reader of ``Out`` in that scope.

``check_region_delays`` refuses an ``Init`` made inside the region holding the delay (the start
value is written before the region runs).
"""

from __future__ import annotations

from ...kernels.types import DType
from ..delay_copy import COPY_ENTRIES, copy_entry, copy_grid, copy_kernel
from ..plan import Arg, KernelNodePlan
from .draft import NodeDraft, PlanDraft
from .nodes import block_nodes

__all__ = ["check_region_delays", "copy_nodes", "delay_copies", "delay_inits", "delays_in_bodies"]

_new = tuple.__new__
_FLAT = ((1, 1, 1, 1),)
_WORD = {"delay_copy4": DType.UINT32, "delay_copy1": DType.UINT8}


def _outermost(draft: PlanDraft, bid: int) -> int | None:
    """The top-level region holding ``bid``, or None at the top level."""
    parents, top = draft.parents, None
    r = parents.get(bid)
    while r is not None:
        top = r
        r = parents.get(r)
    return top


def _holds(draft: PlanDraft, rid: int, bid: int) -> bool:
    r = draft.parents.get(bid)
    while r is not None:
        if r == rid:
            return True
        r = draft.parents.get(r)
    return False


def delays_in_bodies(draft: PlanDraft) -> set[int]:
    """The running FrameDelays placed inside a region (their nodes are placed by ``delay_inits``)."""
    return {bid for bid, _, _ in draft.delays if bid in draft.parents and bid in draft.sized}


def check_region_delays(draft: PlanDraft) -> None:
    """An error on each delay inside a region whose ``Init`` comes from a block inside that region's
    outermost region: the start value is written before the region runs."""
    for bid, _, _ in draft.delays:
        top = _outermost(draft, bid)
        if top is None:
            continue
        lk = draft.incoming.get((bid, "Init"))
        if lk is not None and (lk.src == top or _holds(draft, top, lk.src)):
            draft.error(
                bid,
                "delay-region",
                f"FrameDelay '{draft.blocks[bid].name}': its Init comes from '{draft.blocks[lk.src].name}', inside "
                f"region '{draft.blocks[top].name}'; the start value is written before the region runs, so Init "
                "must come from a block before it",
            )


def delay_inits(draft: PlanDraft, rid: int, env: tuple, probes: dict | None, inside: set[int]) -> None:
    """The nodes of the delays of ``inside`` held by top-level region ``rid``, before its nodes."""
    for bid in draft.order:
        if bid in inside and _holds(draft, rid, bid):
            block_nodes(draft, draft.sized[bid], env, probes)


def delay_copies(draft: PlanDraft, scope: int | None, scope_node: int | None) -> None:
    """A copy node ``In`` -> ``Out`` for each fed delay placed in ``scope`` (None: the top level),
    appended to ``draft.drafts`` (inside the body of conditional node ``scope_node``) and to the
    delay's ``block_nodes``, last."""
    drafts, vb = draft.drafts, draft.value_buffer
    for bid, prev, cur in draft.delays:
        if cur is None or draft.parents.get(bid) != scope or bid not in draft.block_nodes:
            continue
        src, dst = vb[cur], vb[prev]
        b = draft.buffers[dst]
        entry, n = copy_entry(b.count * b.dtype.itemsize)
        source, desc = copy_kernel(entry)
        word = _WORD[entry]
        args = (
            _new(Arg, ("buffer", word, True, src, None)),
            _new(Arg, ("buffer", word, True, dst, None)),
            _new(Arg, ("const", DType.UINT32, False, None, n)),
        )
        index = len(drafts)
        head = (index, bid, COPY_ENTRIES[entry], source, desc, copy_grid(n), 256, 0, args)
        drafts.append(_new(NodeDraft, (KernelNodePlan, head, _FLAT, [src], [dst])))
        if scope_node is not None:
            draft.scopes[index] = scope_node
        draft.block_nodes[bid] = (*draft.block_nodes[bid], index)
        draft.copied_delays.add(bid)


def copy_nodes(draft: PlanDraft) -> set[int]:
    """The indices of the delays' copy nodes (profiling leaves them untimed: a top-level delay's copy
    is far from its init kernel, and a block's timed nodes must be contiguous)."""
    return {draft.block_nodes[bid][-1] for bid in draft.copied_delays}
