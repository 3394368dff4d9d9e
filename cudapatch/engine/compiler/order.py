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

from ..connections import Link
from .draft import PlanDraft

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


def order(draft: PlanDraft) -> None:
    """Fill ``draft.order``; record a ``cycle`` error for every block on a loop (naming the loop)
    and for every block that is only downstream of one."""
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
                    "cycle",
                    f"block '{blocks[b].name}' is part of a cycle ({names}); a loop must pass through a FrameDelay",
                )
        for b in cyclic:
            if b not in on_loop:
                draft.error(b, "cycle", f"block '{blocks[b].name}' runs after a cycle, which cannot be ordered")
