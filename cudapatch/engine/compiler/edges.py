"""The edges phase: each node's dependencies, from the hazards on the resources nodes touch.

A node waits for the last writer of everything it reads (read after write), and for the last
writer and every reader since of everything it writes (write after write, write after read). Two
nodes that only read the same buffer run in parallel. Resources are planned buffers, append
counters and external bindings (see ``NodeDraft``). Every node using an append counter also waits
for the memset that zeroes the counters.

Nodes are visited in launch order, so every dependency points backwards and the node list is a
valid launch order.
"""

from __future__ import annotations

from collections.abc import Iterable

from .draft import PlanDraft

__all__ = ["edges", "hazards"]

_new = tuple.__new__  # skips NamedTuple.__new__: several times cheaper (see plan.py)


def edges(draft: PlanDraft) -> None:
    """Fill ``draft.nodes``: the node drafts, finished with their dependencies."""
    last_writer: dict[object, int] = {}
    readers: dict[object, set[int]] = {}  # the nodes that read a resource since its last write
    counter_users = draft.counter_users
    out = draft.nodes
    for cls, head, tail, reads, writes in draft.drafts:
        index = head[0]
        deps = hazards(index, reads, writes, last_writer, readers)
        if index in counter_users:
            deps.add(0)  # the counters' memset
        out.append(_new(cls, (*head, tuple(sorted(deps)) if len(deps) > 1 else tuple(deps), *tail)))


def hazards(
    index: int,
    reads: Iterable[object],
    writes: Iterable[object],
    last_writer: dict[object, int],
    readers: dict[object, set[int]],
) -> set[int]:
    """The nodes node ``index`` waits for, given the resources it reads and writes, the last writer of
    each resource and the nodes reading it since (both updated for the nodes after it)."""
    deps: set[int] = set()
    for r in reads:
        w = last_writer.get(r)
        if w is not None:
            deps.add(w)
    for r in writes:
        w = last_writer.get(r)
        if w is not None:
            deps.add(w)
        rs = readers.get(r)
        if rs:
            deps.update(rs)
    for r in reads:
        rs = readers.get(r)
        if rs is None:
            readers[r] = {index}
        else:
            rs.add(index)
    for r in writes:
        last_writer[r] = index
        readers.pop(r, None)
    return deps
