"""Liveness over the graph's partial order, and the buffer assignment it allows. Pure.

A CUDA graph runs every node whose dependencies are done, so two nodes that no path of edges joins
may run at the same time, in either order: a lifetime is not an interval of one launch order. Here
a value's lifetime is the set of graph nodes that touch it (write or read it), and value ``u`` may
hand its memory on to value ``v`` only if every node touching ``u`` is a strict ancestor (through
the plan's edges) of every node touching ``v``. Then every access of ``u`` happens before every
access of ``v`` on any schedule the graph allows, with the edges that are there anyway: reuse adds
no edge and never serialises independent branches (``tests/unit/test_liveness.py`` checks both on
random patches). It runs on nodes, not blocks, because the kernels of one block are ordered only by
their own hazards: a block's kernel reading ``u`` need not come before the kernel its successors
wait for.

The assignment is greedy in launch order (a coloring of an interval graph generalized to the
partial order): each value takes a released buffer whose last value is all behind it, best fit by
size, or a new buffer. A buffer's values are then totally ordered, so the check against its last
value covers all of them. Pinned values get a buffer of their own that nothing else takes.

Ancestor sets are Python-int bitsets over node indices: a chain of 10,000 nodes costs a few ms.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["CHECKPOINT_EVERY", "SCAN_LIMIT", "Checkpoint", "Lifetime", "ancestors", "assign_buffers", "conflicts"]

#: Released buffers examined per value (newest first): bounds the cost on wide patches, where many
#: released buffers belong to parallel branches and cannot be taken anyway.
SCAN_LIMIT = 32


#: Values between two checkpoints of the assignment (incremental planning resumes at the last one
#: before the first value an edit changed).
CHECKPOINT_EVERY = 64


class Checkpoint(NamedTuple):
    """The state of ``assign_buffers`` before value ``index`` (in its order)."""

    index: int
    value_buffer: Sequence[int]  # the buffers of the values before it (empty in a recorded checkpoint)
    sizes: list[int]
    last_mask: list[int]
    pending: list[tuple[int, int]]
    released: list[int]


class Lifetime(NamedTuple):
    """One value, as liveness sees it.

    Attributes:
        nodes: The nodes that write or read it, ascending (node indices are a topological order).
        nbytes: Its size.
        pinned: It keeps a buffer of its own (read by the host, kept across frames, modified in place ...).
    """

    nodes: tuple[int, ...]
    nbytes: int
    pinned: bool = False


def ancestors(preds: Sequence[Sequence[int]], anc: list[int] | None = None) -> list[int]:
    """The strict ancestors of each node as a bitset (bit ``i`` set: node ``i`` is an ancestor).

    Args:
        preds: ``preds[i]``: the nodes node ``i`` depends on (all below ``i``).
        anc: The ancestors of the nodes before ``preds[0]``, extended in place (None: ``preds`` starts
            at node 0).
    """
    if anc is None:
        anc = []
    for ps in preds:
        mask = 0
        for p in ps:
            mask |= anc[p] | (1 << p)
        anc.append(mask)
    return anc


def assign_buffers(
    values: Sequence[Lifetime],
    anc: Sequence[int],
    *,
    state: Checkpoint | None = None,
    checkpoints: list[Checkpoint] | None = None,
) -> tuple[list[int], list[int]]:
    """Give every value a buffer; values may share one when their lifetimes are ordered.

    Args:
        values: The values, in order of their first node.
        anc: ``ancestors`` of the nodes.
        state: Resume after the values a checkpoint was taken at (``values`` are the ones after them;
            the result then covers all, theirs first). Incremental planning: an edit that changes
            only late values assigns only those (``resume.py``).
        checkpoints: Record the state every ``CHECKPOINT_EVERY`` values here.

    Returns:
        ``(buffer of each value, size in bytes of each buffer)``; buffers are numbered in the order of
        their first value.
    """
    if state is None:
        state = Checkpoint(0, [], [], [], [], [])
    start = state.index
    value_buffer = list(state.value_buffer)
    sizes = list(state.sizes)
    last_mask = list(state.last_mask)  # per buffer: the nodes touching its last value
    pending = list(state.pending)  # (last node touching it, buffer): not free before that
    released = list(state.released)  # buffers whose last value is done before the current value starts
    for j, v in enumerate(values):
        if checkpoints is not None and (start + j) % CHECKPOINT_EVERY == 0:
            checkpoints.append(Checkpoint(start + j, (), sizes[:], last_mask[:], pending[:], released[:]))
        nodes = v.nodes
        if v.pinned or not nodes:
            value_buffer.append(len(sizes))
            sizes.append(v.nbytes)
            last_mask.append(0)
            continue
        first = nodes[0]
        while pending and pending[0][0] < first:
            released.append(heapq.heappop(pending)[1])
        behind = anc[first]  # the nodes before every node touching v
        for x in nodes[1:]:
            behind &= anc[x]
        not_behind = ~behind
        best = -1
        best_key: tuple[int, int] = (0, 0)
        need = v.nbytes
        for pos in range(len(released) - 1, max(-1, len(released) - 1 - SCAN_LIMIT), -1):
            b = released[pos]
            if last_mask[b] & not_behind:
                continue  # its last value is still in use beside this one
            size = sizes[b]
            key = (0, size - need) if size >= need else (1, need - size)  # fits best, else grows least
            if best < 0 or key < best_key:
                best, best_key = pos, key
        mask = 0
        for x in nodes:
            mask |= 1 << x
        if best < 0:
            b = len(sizes)
            sizes.append(need)
            last_mask.append(mask)
        else:
            b = released.pop(best)
            sizes[b] = max(sizes[b], need)
            last_mask[b] = mask
        value_buffer.append(b)
        heapq.heappush(pending, (nodes[-1], b))
    return value_buffer, sizes


def conflicts(values: Sequence[Lifetime], value_buffer: Sequence[int], anc: Sequence[int]) -> list[tuple[int, int]]:
    """The pairs of values that share a buffer although some access of one does not happen before
    every access of the other (an independent check of ``assign_buffers``, for tests and debugging).
    Quadratic in the values of one buffer."""
    by_buffer: dict[int, list[int]] = {}
    for vi, b in enumerate(value_buffer):
        by_buffer.setdefault(b, []).append(vi)
    bad: list[tuple[int, int]] = []
    for members in by_buffer.values():
        for i, u in enumerate(members):
            for v in members[i + 1 :]:
                if not (_before(values[u], values[v], anc) or _before(values[v], values[u], anc)):
                    bad.append((u, v))
    return bad


def _before(u: Lifetime, v: Lifetime, anc: Sequence[int]) -> bool:
    """Every node touching ``u`` is a strict ancestor of every node touching ``v``."""
    return all(all(anc[b] >> a & 1 for a in u.nodes) for b in v.nodes)
