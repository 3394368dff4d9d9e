"""The stamps and publish phases: timestamp nodes for the profiling level, and the publish node that ends a
graph with readback values.

Stamps hang beside the work wherever they can, so measuring changes the measured as little as
possible; ``place_stamps`` says where each goes and why. Placing them renumbers the nodes, so the
argument slots and block node lists are renumbered with them. The publish node (``PublishNodePlan``)
copies append counters and timestamps to the host-mapped readback ring after every other sink, and
writes the graph's end stamp.
"""

from __future__ import annotations

from ..plan import CapturedNodePlan, KernelNodePlan, NodePlan, PublishNodePlan, StampNodePlan, TimingPair, WorkNode
from ..profiling import ProfilingLevel
from .draft import PlanDraft

__all__ = ["place_stamps", "publish", "renumber", "stamps"]


def stamps(draft: PlanDraft) -> None:
    """Place the level's timestamp nodes in ``draft.nodes``; fill ``timings`` and ``stamp_count``."""
    if not draft.level.timed:
        return
    draft.nodes, remap, draft.timings, draft.stamp_count = place_stamps(draft.nodes, draft.level)
    renumber(draft, remap)


def renumber(draft: PlanDraft, remap: dict[int, int]) -> None:
    """Renumber the nodes the Hot and Warm slots, ``block_nodes``, the regions' conditional nodes and
    the set-condition kernels' handles name (``remap``: old index -> new; ``draft.nodes`` already in
    their new places)."""
    for slots in (draft.scalar_slots, draft.binding_slots):
        for k, v in slots.items():
            slots[k] = tuple([(remap[ni], ai) for ni, ai in v])
    block_nodes = draft.block_nodes
    for k, v in block_nodes.items():
        block_nodes[k] = tuple([remap[i] for i in v])
    if not draft.regions:
        return
    for rid, rp in draft.regions.items():
        draft.regions[rid] = rp._replace(
            node=remap[rp.node],
            tail=None if rp.tail is None else remap[rp.tail],
            pairs=None if rp.pairs is None else remap[rp.pairs],
        )
    nodes = draft.nodes
    for i, n in enumerate(nodes):  # each set-condition kernel's handle names its conditional node
        if isinstance(n, KernelNodePlan) and n.args and n.args[0].kind == "handle":
            a = n.args[0]
            nodes[i] = n._replace(args=(a._replace(ref=remap[a.ref]), *n.args[1:]))


def publish(draft: PlanDraft) -> None:
    """End the graph with a publish node when it has readback values (append counters, stamps, probes):
    after the sinks of the top-level graph (a node in a region's body cannot be waited for from there;
    its conditional node is)."""
    nodes, scopes = draft.nodes, draft.scopes
    if draft.counters or draft.stamp_count or draft.probe_words:
        top = [n for n in nodes if n.index not in scopes] if scopes else nodes
        used = {dep for n in top for dep in n.deps}
        sinks = tuple(n.index for n in top if n.index not in used)
        nodes.append(PublishNodePlan(len(nodes), sinks, 1 if draft.stamp_count else None))


def place_stamps(
    nodes: list[NodePlan], level: ProfilingLevel
) -> tuple[list[NodePlan], dict[int, int], tuple[TimingPair, ...], int]:
    """Insert timestamp nodes for ``level`` and renumber.

    Stamp 0 starts the graph (every root waits for it: measured, that costs a frame less than a
    stamp beside the roots); stamp 1, its end, is written by the publish node the compiler adds
    after every sink. A span ends with a stamp that waits for its nodes and that nothing waits for, so it never delays
    the work. A span *starts* when its dependencies are done, and most of the time that moment is
    already stamped: the end stamp of the one block (PerBlock) or node (PerKernel) it depends on,
    or stamp 0 for roots. Only otherwise (several predecessors, a memset) does a span get a start
    stamp of its own, placed on the path: its nodes wait for it (a stamp merely beside a node can
    run after the node starts: measured). Measured on the H100: a stamp on the path costs a chain
    about 1.4 µs per block, a stamp beside it close to nothing.

    Each side stamp is added right after its nodes: added after all the work instead, the graph
    looked cheaper (measured) because the driver ran them all at its end, which measured nothing.

    A block's nodes are contiguous in plan order.
    """
    per_block = level.at_least(ProfilingLevel.PER_BLOCK)
    per_kernel = level.at_least(ProfilingLevel.PER_KERNEL)
    out: list[NodePlan] = [StampNodePlan(0, 0, ())]
    remap: dict[int, int] = {}
    pairs: list[TimingPair] = [TimingPair("graph", None, 0, 1)]
    stamps = 2
    runs: dict[int, list[KernelNodePlan | CapturedNodePlan]] = {}
    for n in nodes:
        if isinstance(n, WorkNode):
            runs.setdefault(n.block_id, []).append(n)
    exits = {
        b: [m.index for m in members if not any(m.index in o.deps for o in members)] for b, members in runs.items()
    }
    node_end: dict[int, int] = {}  # old node index -> the stamp slot after it (PerKernel)
    block_end: dict[int, int] = {}  # block -> the stamp slot after its exits
    exit_block: dict[frozenset[int], int] = {}  # a finished block's exit set -> its block
    left: dict[int, int] = {}
    own_start: dict[int, int] = {}  # block -> index in ``out`` of its own start stamp
    block_start: dict[int, int] = {}  # block -> start stamp slot

    def emit(stamp: int, deps: tuple[int, ...] | list[int]) -> int:
        out.append(StampNodePlan(len(out), stamp, tuple(sorted(set(deps)))))
        return len(out) - 1

    for n in nodes:
        work = isinstance(n, WorkNode)
        b = n.block_id if work else None  # type: ignore[union-attr]
        if work and per_block and b not in left:  # the first node of its block
            members = {m.index for m in runs[b]}
            outside = {d for m in runs[b] for d in m.deps if d not in members}
            left[b] = len(members)
            pairs_start: int
            if not outside:
                pairs_start = 0
            elif frozenset(outside) in exit_block:  # exactly the exits of one finished block
                pairs_start = block_end[exit_block[frozenset(outside)]]
            else:
                pairs_start = stamps
                own_start[b] = emit(stamps, [remap[d] for d in outside])
                stamps += 1
            block_start[b] = pairs_start
        deps = tuple(remap[d] for d in n.deps) or (0,)  # roots wait for the graph's start stamp
        if work and b in own_start:
            deps = tuple(sorted(set(deps) | {own_start[b]}))
        kernel_start = None
        if work and per_kernel:
            if not n.deps:
                kernel_start = 0
            elif len(n.deps) == 1 and n.deps[0] in node_end:
                kernel_start = node_end[n.deps[0]]
            elif b in own_start and all(d not in {m.index for m in runs[b]} for d in n.deps):
                kernel_start = block_start[b]  # its block's own start stamp already waits for its deps
            else:
                kernel_start = stamps
                deps = (emit(stamps, deps),)
                stamps += 1
        idx = len(out)
        out.append(n._replace(index=idx, deps=deps))
        remap[n.index] = idx
        if work and per_kernel:
            node_end[n.index] = stamps
            pairs.append(TimingPair("kernel", (b, n.kernel), kernel_start, stamps))  # type: ignore[union-attr]
            emit(stamps, (idx,))
            stamps += 1
        if work and per_block:
            left[b] -= 1
            if left[b] == 0:  # the last node of its block
                ex = exits[b]
                if per_kernel and len(ex) == 1:
                    end = node_end[ex[0]]
                else:
                    end = stamps
                    emit(stamps, [remap[i] for i in ex])
                    stamps += 1
                block_end[b] = end
                exit_block[frozenset(ex)] = b
                pairs.append(TimingPair("block", b, block_start[b], end))
    # Stamp 1, the graph's end, is written by the publish node that ends every timed graph.
    return out, remap, tuple(pairs), stamps
