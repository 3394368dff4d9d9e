"""The order phase: blocks in topological order of the valid links; blocks on a cycle are errors.

Ties are broken by registration order (Kahn's algorithm over a heap of ranks), so the same patch
always compiles to the same plan. (Feedback through a delay block will be the one legal cycle: it
is cut here, at the delay, before ordering.)
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


def order(draft: PlanDraft) -> None:
    """Fill ``draft.order``; record a ``cycle`` error for every block left on a cycle."""
    draft.order, cyclic = topological_order([b.id for b in draft.snap.blocks], draft.links)
    if cyclic:
        blocks = draft.blocks
        names = ", ".join(blocks[b].name for b in cyclic)
        for b in cyclic:
            draft.error(b, "cycle", f"block '{blocks[b].name}' is part of a cycle ({names})")
