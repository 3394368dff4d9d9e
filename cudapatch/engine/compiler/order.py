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
    indegree = dict.fromkeys(block_ids, 0)
    succ: dict[int, list[int]] = {b: [] for b in block_ids}
    for lk in links:
        succ[lk.src].append(lk.dst)
        indegree[lk.dst] += 1
    ready = [(rank[b], b) for b, deg in indegree.items() if deg == 0]
    heapq.heapify(ready)
    out: list[int] = []
    while ready:
        _, b = heapq.heappop(ready)
        out.append(b)
        for s in succ[b]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, (rank[s], s))
    return out, [b for b in block_ids if indegree[b] > 0]


def order(draft: PlanDraft) -> None:
    """Fill ``draft.order``; record a ``cycle`` error for every block left on a cycle."""
    draft.order, cyclic = topological_order([b.id for b in draft.snap.blocks], draft.links)
    if cyclic:
        blocks = draft.blocks
        names = ", ".join(blocks[b].name for b in cyclic)
        for b in cyclic:
            draft.error(b, "cycle", f"block '{blocks[b].name}' is part of a cycle ({names})")
