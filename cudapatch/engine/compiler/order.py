"""The order phase: blocks in topological order of the valid links; blocks on a cycle are errors.

Ties are broken by registration order (Kahn's algorithm over a heap of ranks), so the same patch
always compiles to the same plan. Feedback through a delay (a link into an input the block's
description lists in ``feedback``, a ``FrameDelay``'s ``In``) is the one legal cycle: such a link
carries the previous frame's value, so it is cut here, before ordering. A cycle left after that is
an error on each block of the loop, naming the loop's blocks in link order.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Any

from ..connections import Link
from ..diagnostics import DiagnosticCode
from .draft import PlanDraft
from .validate import relinked_since

__all__ = ["order", "topological_order"]


def topological_order(block_ids: Sequence[int], links: Iterable[Link]) -> tuple[list[int], list[int]]:
    """Kahn's algorithm, ties broken by position in ``block_ids``.

    Returns:
        ``(order, cyclic)``: the blocks that can be ordered, and those left on or behind a cycle
        (in ``block_ids`` order).
    """
    rank = {b: i for i, b in enumerate(block_ids)}
    indegree = [0] * len(block_ids)
    succ: dict[int, list[int]] = {}  # by rank; the heap holds ranks (ints compare faster than tuples)
    for lk in links:
        s, d = rank[lk.src], rank[lk.dst]
        if s in succ:
            succ[s].append(d)
        else:
            succ[s] = [d]
        indegree[d] += 1
    ready = [r for r, deg in enumerate(indegree) if deg == 0]  # sorted already: a valid heap
    out: list[int] = []
    while ready:
        r = heapq.heappop(ready)
        out.append(block_ids[r])
        for s in succ.get(r, ()):
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, s)
    return out, [b for b, deg in zip(block_ids, indegree, strict=True) if deg > 0]


def same_frame_links(draft: PlanDraft) -> list[Link]:
    """The links that order blocks within a frame: every valid link except those into a feedback input."""
    blocks = draft.blocks
    if not any(b.description.feedback for b in blocks.values()):
        return draft.links
    return [lk for lk in draft.links if lk.dst_port not in blocks[lk.dst].description.feedback_inputs]


def find_loops(cyclic: Sequence[int], links: Iterable[Link]) -> list[list[int]]:
    """The loops among ``cyclic`` blocks (strongly connected components of two or more blocks, or one
    linked to itself), each in link order starting at its first block in ``cyclic``; blocks that are
    only downstream of a loop are in none."""
    members = set(cyclic)
    succ: dict[int, list[int]] = {b: [] for b in cyclic}
    for lk in links:
        if lk.src in members and lk.dst in members:
            succ[lk.src].append(lk.dst)
    # Tarjan's algorithm, iterative (a patch may be thousands of blocks deep).
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    comps: list[set[int]] = []
    for root in cyclic:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            nxt = succ[v]
            if i < len(nxt):
                work.append((v, i + 1))
                w = nxt[i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in succ[v]:
                    comps.append(comp)
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    loops = []
    for comp in comps:
        start = next(b for b in cyclic if b in comp)
        # The shortest way round from ``start`` back to it (breadth first inside the component).
        parent: dict[int, int] = {}
        frontier, closing = [start], None
        while closing is None and frontier:
            nxt_frontier = []
            for v in frontier:
                for w in succ[v]:
                    if w == start:
                        closing = v
                        break
                    if w in comp and w not in parent:
                        parent[w] = v
                        nxt_frontier.append(w)
                if closing is not None:
                    break
            frontier = nxt_frontier
        path = []
        v = closing if closing is not None else start
        while v != start:
            path.append(v)
            v = parent[v]
        loops.append([start, *reversed(path)])
    return loops


def order(draft: PlanDraft, last: Any = None, changes: Any = None) -> None:
    """Fill ``draft.order``; record a ``cycle`` error for every block on a loop (naming the loop)
    and for every block that is only downstream of one.

    ``last``: the state the last plan left (``resume.PlanState``: its order, blocks and links), which
    had no errors, and ``changes`` (``resume.BlockChanges``) of the blocks since: the order is then
    taken from it up to the first place the edit could change it, and Kahn's algorithm runs on from
    there (``resumed_order``)."""
    if last is not None and changes is not None:
        resumed = resumed_order(draft, last, changes)
        if resumed is not None:
            draft.order = resumed
            return
    links = same_frame_links(draft)
    draft.order, cyclic = topological_order([b.id for b in draft.snap.blocks], links)
    if cyclic:
        blocks = draft.blocks
        on_loop: set[int] = set()
        for loop in find_loops(cyclic, links):
            names = " -> ".join(f"'{blocks[b].name}'" for b in (*loop, loop[0]))
            for b in loop:
                on_loop.add(b)
                draft.error(
                    b,
                    DiagnosticCode.CYCLE,
                    f"block '{blocks[b].name}' is part of a cycle ({names}); a loop must pass through a FrameDelay",
                )
        for b in cyclic:
            if b not in on_loop:
                draft.error(
                    b, DiagnosticCode.CYCLE, f"block '{blocks[b].name}' runs after a cycle, which cannot be ordered"
                )


def resumed_order(draft: PlanDraft, last: Any, changes: Any) -> list[int] | None:
    """``topological_order`` of the patch from the last plan's order (None: a cycle, planned whole).

    Kahn's algorithm pops the ready block of lowest rank (registration order) first. The blocks an
    edit touches are the ones added or removed, re-described, or linked differently (the destination
    of a link added or removed). Up to the first of them in the last order, that order's blocks are
    ready as before, and each one popped is still the lowest-ranked ready one unless a touched block
    became ready earlier with a lower rank: the first ``p`` blocks are kept where no touched block
    can do that, and the algorithm runs on over the rest.
    """
    if last.context_id != draft.snap.context_id:
        return None
    blocks, old, pos = draft.blocks, last.order, last.pos
    incoming, old_incoming = draft.incoming, last.incoming
    added = set(changes.added)
    touched = {lk.dst for _, lk in relinked_since(draft, old_incoming)}
    touched.update(changes.removed)
    touched.update(changes.redescribed)  # its feedback inputs may differ
    p = len(old)
    for b in touched:
        q = pos.get(b)
        if q is not None and q < p:
            p = q
    ids = [b.id for b in draft.snap.blocks]
    rank = {b: i for i, b in enumerate(ids)}

    def preds(v: int) -> list[int]:
        d = blocks[v].description
        feedback = d.feedback_inputs if d.feedback else ()
        out = []
        for port in d.inputs:
            if port.name not in feedback:
                lk = incoming.get((v, port.name))
                if lk is not None:
                    out.append(lk.src)
        return out

    for v in (*added, *(b for b in touched if b in blocks)):  # when each becomes ready, if before ``p``
        ready_at = 0
        for u in preds(v):
            q = pos.get(u)
            if q is None or q >= p or u in added:
                ready_at = p  # not ready while the first ``p`` are popped
                break
            ready_at = max(ready_at, q + 1)
        if ready_at < p and _ranked_above(rank, old, ready_at, p, rank[v]):
            p = ready_at  # it would be popped before one of them
    kept = old[:p]
    rest = [b for b in ids if not (pos.get(b, p) < p and b not in added)]
    indegree = dict.fromkeys(rest, 0)
    succ: dict[int, list[int]] = {}
    for v in rest:
        for u in preds(v):
            if u in indegree:
                indegree[v] += 1
                succ.setdefault(u, []).append(v)
    ready = [rank[v] for v in rest if indegree[v] == 0]
    heapq.heapify(ready)
    out = kept
    while ready:
        v = ids[heapq.heappop(ready)]
        out.append(v)
        for w in succ.get(v, ()):
            indegree[w] -= 1
            if indegree[w] == 0:
                heapq.heappush(ready, rank[w])
    return out if len(out) == len(ids) else None


#: Blocks per ``max`` in ``_ranked_above``: one ``max`` over a 10,000-block order was a C call of
#: 0.6-1.0 ms that held the interpreter from the frames (H100 host, CPU machine).
RANKS_PER_CALL = 2048


def _ranked_above(rank: dict[int, int], order: Sequence[int], lo: int, hi: int, r: int) -> bool:
    """Whether a block of ``order[lo:hi]`` ranks above ``r``, in slices of ``RANKS_PER_CALL``."""
    for i in range(lo, hi, RANKS_PER_CALL):
        if max(map(rank.__getitem__, order[i : min(i + RANKS_PER_CALL, hi)])) > r:
            return True
    return False
