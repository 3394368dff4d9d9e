"""Incremental planning: an edit re-plans the blocks from the first one it touched; the plan parts of
the blocks before it are taken from the last plan as they were.

Every phase from sizes to share works through the blocks in topological order and numbers what it
makes (values, nodes, buffers) in that order, looking back only: a block's sizes depend on its
snapshot and the blocks it reads, its nodes on its sizes and the values' buffers, a node's
dependencies on the nodes before it. So when the first ``P`` blocks of the new order are the first
``P`` of the last plan's, each with the same snapshot (description and parameter values: the
Context keeps the object while neither changes), links, bindings, kernel status, fault and kept
ports, what those phases made for them is what the last plan holds for them: values, ports, shapes,
pins, node drafts, finished nodes, Hot and Warm slots. Only the blocks from ``P`` on are planned
(``divergence`` finds ``P``). The phases that look at the whole patch resume where they can:

- pins: the values a block pins and reads are kept in insertion order, so the entries of the first
  ``P`` blocks are a prefix; probes, bypass, delays and unread values are added after, as always.
- edges: a log per resource of the nodes that read and write it gives the last writer and the
  readers since, at node ``N``, of each resource the new nodes touch.
- share: the greedy assignment (``liveness.assign_buffers``) runs in order of each value's first
  node; it resumes from the last checkpoint before the first value whose lifetime the edit changed
  (a new reader, a pin gone), and only nodes whose values moved to another buffer are renumbered.

A block whose Hot values alone changed (scalars no size depends on: a slider moved before the edit)
keeps its place in the prefix; its nodes are made again in place (same slots, resources, dependencies).
The order itself resumes (``order.resumed_order``), and validation takes the last plan's links between
unchanged blocks as valid. ``PlanDelta`` (``NodeCache.delta``) tells what the build makes of the plan
afterwards (``built_view``, ``BypassIndex``) which blocks and nodes to look at again.

Fused groups (``fusion.py``) resume at a group: a group's node runs where its sink runs and its
intermediates are placeholders, so the plan parts of its members are the group's. ``_fuse`` moves the
resume point back to the first block of the first group of the last plan that the edit may change: a
group with a block at the resume point or after it, or with a block that gained or lost a reader (a
group splits where a member is read twice, and one whose sink gets its only reader may grow) or was
bypassed or restored, or that one of those reads; no group may have blocks on both sides of the point.
``fusion.fusion_resumed`` then keeps the groups before it and groups the blocks after it; where a block
before it would now fuse into one after it (a sum of two chains too big for one launch: one chain's end
gets another reader, the other chain fits beside the sum now), it says so and the point moves back to
that block's group. The sizes phase resumes where it would without fusion (sizes do not depend on it);
the values and ports before the point are those fusion left (placeholders), after it those sizes made.
A fused member whose Hot values alone changed gets its new values in its group's node, in place.

An edit at the end of a chain plans one block (fused: the last group); an edit in the middle plans the
blocks after it (fused: from the group it touched). Plans with and without it are equal, and so are the
``built_view`` and ``BypassIndex`` made from the delta (``tests/unit/test_plan_reuse.py``,
``test_plan_reuse_fused.py``, over random edit sequences). Patches with regions, composites, probes or
profiling stamps are planned whole (the ``NodeCache`` still reuses node drafts there); delays run over
the whole patch. Measured on the CPU machine (``benchmarks/bench_compile.py``, snapshot to plan): a block
added at the end of a 1,000-block chain, fusion off, 2.8-3 ms beside a full plan's 32 ms; at 10,000
blocks 34-50 ms beside 370-390 ms. Fusion on (groups of about 500 Scale blocks), 10,000 blocks: 40-65 ms
(index and view after it 4.5-5 ms) beside 300-350 ms (75-105 ms), where fused plans used to be made whole.

Used by one build at a time; the state of the last plan is consumed by the next (a plan that fails
leaves none: the next is planned whole).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, NamedTuple

from ...kernels.pacing import checkpoint
from ..context import BlockSnapshot
from ..memory_plan import MemoryPlan
from ..plan import Arg
from ..slices import dict_copy
from .delays import delays
from .draft import BlockSizes, NodeDraft, PlanDraft
from .edges import hazards
from .fusion import FusionState, fusion, fusion_resumed
from .liveness import Checkpoint, Lifetime, ancestors, assign_buffers
from .memory import _buffers, block_pins, finish_pins, memory, order_keys
from .nodes import _work_node, block_nodes, counters_memset, node_env
from .reuse import NodeCache, signature
from .sizes import size_block
from .validate import relinked_since

__all__ = ["BlockChanges", "PlanDelta", "PlanState", "block_changes", "divergence", "plan_resumed", "resumable"]

_new = tuple.__new__
_MISSING = object()
_READ, _WRITE = 1, 2  # a resource log entry is ``node index * 4 + flags``


class PlanDelta(NamedTuple):
    """How a resumed plan differs from the one it resumed from, for what the build makes of a plan
    after planning (``built_view``, ``BypassIndex``): they redo only this part.

    Attributes:
        source: The plan resumed from.
        plan: The resumed plan.
        nodes: Nodes before this index are the source's nodes (the same objects), but for ``renumbered``.
        renumbered: Nodes before ``nodes`` whose buffer arguments were renumbered (buffers shared anew).
        blocks: The blocks whose outputs, shapes or nodes may differ (from the first block the edit
            touched on, in the old order and the new).
        ports: The output ports of each of ``blocks`` that runs.
    """

    source: Any
    plan: Any
    nodes: int
    renumbered: frozenset[int]
    blocks: frozenset[int]
    ports: Mapping[int, tuple[str, ...]]  # the output ports of each of ``blocks`` that runs


@dataclass(eq=False, slots=True)
class PlanState:
    """What one plan leaves for the next to resume from (each list: in the order of the phase that made it)."""

    context_id: int
    level: Any
    reuse: bool
    fuse: bool
    blocks: dict[int, BlockSnapshot]
    incoming: dict
    links: tuple  # the snapshot's links (all valid)
    bindings: dict
    kernel_status: dict
    faulted: dict
    kept: frozenset
    order: list[int]
    pos: dict[int, int]  # block id -> position in ``order``
    run_before: list[int]  # per position in ``order`` (and one past the end): running blocks before it
    bypassed: frozenset[int]
    # sizes
    sized: dict[int, BlockSizes]
    skipped: list[int]
    values: list  # as the sizes phase made them (fusion makes some placeholders: ``fused_values``)
    ports: dict  # as the sizes phase made them (fusion drops some: ``fused_ports``)
    shapes: dict
    binding_counts: dict
    size_warnings: list
    vstart: list[int]  # per running block (and one past the last): its first value
    # fusion (None: nothing may fuse): its state, the values and ports as it left them
    fusion: FusionState | None
    fused_values: list
    fused_ports: dict
    # pins (insertion-ordered: a block's entries follow those of the blocks before it)
    pinned: dict[int, str]
    pin_marks: list[int]  # per running block: entries in ``pinned`` before it
    read: dict[int, None]
    read_marks: list[int]
    # nodes
    counters: int
    drafts: list[NodeDraft]
    nstart: list[int]  # per running block (and one past the last): its first node
    scalar_slots: dict
    binding_slots: dict
    counter_users: set[int]
    block_nodes: dict
    # edges: the finished nodes before buffers are shared; each resource's readers and writers
    pre: list
    log: dict[object, list[int]]
    # share (None: no sharing was planned)
    share: ShareState | None
    # what differs from the last plan (None: planned whole): ``PlanDelta`` but for the two plans
    delta: tuple | None = None


@dataclass(eq=False, slots=True)
class ShareState:
    touch: list[list[int]]  # per value: the nodes touching it
    first: list[int]  # per value: its place in the assignment's order (``memory.order_keys``)
    vorder: list[int]  # values in that order
    anc: list[int]  # ancestors of each node
    assigned: list[int]  # buffer of each value of ``vorder``
    checkpoints: list[Checkpoint]
    vb: list[int]  # buffer of each value, as assigned
    value_buffer: list[int]  # as planned (the values themselves when nothing shared)
    post: list  # the nodes with their buffers renumbered
    pinned: Any  # the pinned values (a keys view)
    shared: bool  # some values share a buffer (else ``value_buffer`` is the values themselves)
    buffers: list  # the plan's buffers


def resumable(draft: PlanDraft) -> bool:
    """Whether ``plan_resumed`` can plan this patch (after ordering): no composites, probes or stamps."""
    snap = draft.snap
    return not (snap.composites or snap.probes or draft.level.timed or draft.warnings or draft.parents)


class BlockChanges(NamedTuple):
    """How the blocks of a snapshot differ from those the last plan saw (``block_changes``).

    Attributes:
        added: Blocks the last plan did not have.
        removed: Blocks it had that are gone.
        redescribed: Blocks with another description (ports, kernels).
        changed: Blocks whose snapshot differs otherwise than by Hot values (the re-described too).
        hot: Blocks whose Hot values alone differ (``_hot_only``).
    """

    added: list[int]
    removed: set[int]
    redescribed: list[int]
    changed: list[int]
    hot: list[int]


def block_changes(blocks: Sequence[BlockSnapshot], old: Mapping[int, BlockSnapshot]) -> BlockChanges:
    """Compare a snapshot's blocks with the last plan's, in one pass (validation, ordering and the
    resume point all ask)."""
    added: list[int] = []
    redescribed: list[int] = []
    changed: list[int] = []
    hot: list[int] = []
    seen = 0
    for b in blocks:
        o = old.get(b.id)
        if o is b:
            seen += 1
        elif o is None:
            added.append(b.id)
        else:
            seen += 1
            if o.description is not b.description:
                redescribed.append(b.id)
                changed.append(b.id)
            elif _hot_only(o, b):
                hot.append(b.id)
            else:
                changed.append(b.id)
    if seen != len(old):  # (a comprehension: a set difference of 10,000 ids was one 1.1 ms C call)
        ids = {b.id for b in blocks}
        removed = {bid for bid in old if bid not in ids}
    else:
        removed = set()
    return BlockChanges(added, removed, redescribed, changed, hot)


def divergence(prev: PlanState, draft: PlanDraft, changes: BlockChanges) -> tuple[int, list[int], list]:
    """The number of blocks at the start of the new order whose plan parts the last plan holds, those
    of them whose Hot values changed (only their nodes' scalar arguments differ), and the links added
    or removed (``(key, link)`` pairs)."""
    order, old = draft.order, prev.order
    n = min(len(order), len(old))
    p = n
    if order[:n] != old[:n]:
        p = next(i for i in range(n) if order[i] != old[i])
    if p == 0:
        return 0, [], []
    snap = draft.snap
    dirty = list(changes.changed)
    hot = changes.hot
    relinked = relinked_since(draft, prev.incoming)
    dirty += [key[0] for key, _ in relinked]
    dirty += [k[0] for k in _rebound(snap.bindings, prev.bindings)]
    dirty += [k[0] for k in _changed(draft.kernel_status or {}, prev.kernel_status)]
    dirty += _changed(draft.faulted or {}, prev.faulted)
    dirty += [k[0] for k in snap.kept ^ prev.kept]
    pos = prev.pos
    for bid in dirty:
        q = pos.get(bid)
        if q is not None and q < p:
            p = q
    return p, [bid for bid in hot if pos[bid] < p], relinked


def _hot_only(old: BlockSnapshot, new: BlockSnapshot) -> bool:
    """Whether only Hot values tell the two snapshots of a block apart: scalars no size, grid or
    shape depends on (``ParamSpec.structural`` off), which only the block's kernel arguments carry.
    A slider moved between two structure edits then leaves the blocks after it as they were."""
    d = new.description
    if old.description is not d or old.name != new.name:
        return False
    ov, nv = old.values, new.values
    for key, value in nv.items():
        if ov.get(key, _MISSING) != value:
            spec = d.param(key)
            if spec is None or spec.structural or spec.kind != "scalar":
                return False
    return ov.keys() == nv.keys()


def _rebound(new: Mapping, old: Mapping) -> list:
    """The bindings added, removed, or of another count, shape or type: a new pointer alone changes
    no plan (its nodes' arguments name the binding, and a Warm rebind patches the pointer)."""
    if not new and not old:
        return []
    out = []
    for k in new.keys() | old.keys():
        a, b = new.get(k), old.get(k)
        if a is None or b is None or (a.count, a.shape, a.dtype) != (b.count, b.shape, b.dtype):
            out.append(k)
    return out


def _changed(new: Mapping, old: Mapping) -> list:
    if not new and not old:
        return []
    return [k for k in new.keys() | old.keys() if new.get(k, _MISSING) != old.get(k, _MISSING)]


def plan_resumed(draft: PlanDraft, cache: NodeCache, fuse: bool, changes: BlockChanges | None = None) -> PlanDraft:
    """Run the phases from sizes to share on ``draft`` (validated and ordered, ``resumable``), resuming
    from the state ``cache`` holds of the last plan where it fits, and leave the state of this one there.

    Raises:
        GraphCompileError: the delays phase found errors.
    """
    prev, cache.state = cache.state, None  # consumed: a plan that fails leaves none
    snap = draft.snap
    if prev is not None and (
        prev.context_id != snap.context_id
        or prev.level != draft.level
        or prev.reuse != draft.reuse
        or prev.fuse != fuse
    ):
        prev = None
    if prev is not None and changes is None:
        changes = block_changes(snap.blocks, prev.blocks)
    p, hot, relinked = divergence(prev, draft, changes) if prev is not None and changes is not None else (0, [], [])
    if p == 0:
        prev = None
    k, resumed = _sizes(draft, prev, p)
    sized = draft.sized
    for bid in hot:  # the same sizes; the new snapshot (its values) for the phases that read them
        s = sized.get(bid)
        if s is not None:
            sized[bid] = s._replace(block=draft.blocks[bid])
    delays(draft)
    draft.raise_errors()
    pre_values, pre_ports = draft.values, draft.ports
    p, kf, fused = _fuse(draft, prev, p, k, fuse, relinked)
    if prev is not None and p == 0:  # the first group the edit touched starts the patch
        prev, k = None, 0
    if prev is not None:
        cache.resumed += 1
        cache.resumed_blocks += p
    st = _state(draft, p, prev, *resumed)
    st.fuse, st.values, st.ports = fuse, pre_values, pre_ports
    st.fusion, st.fused_values, st.fused_ports = fused, draft.values, draft.ports
    pins = _pins(draft, st, prev, k)
    memory(draft, pins)
    kn = kf if prev is not None and prev.counters == len(draft.counters) else 0
    hot_nodes = _nodes(draft, st, prev, kn, cache, hot)
    n0 = _edges(draft, st, prev, kn, hot_nodes)
    renumbered, moved = _share(draft, st, prev, kn, n0, hot_nodes)
    renumbered |= hot_nodes
    if prev is not None and moved is not None:
        changed = frozenset(islice(prev.order, p, None)) | frozenset(islice(draft.order, p, None)) | moved
        sized = draft.sized
        ports = {bid: tuple(sized[bid].outputs) for bid in changed if bid in sized}
        st.delta = (n0, frozenset(renumbered), changed, ports)
    cache.state = st
    return draft


def _fuse(
    draft: PlanDraft, prev: PlanState | None, p: int, k: int, fuse: bool, relinked: list
) -> tuple[int, int, FusionState | None]:
    """The fusion phase, resumed from the last plan's where its groups still hold (``fusion_resumed``).

    The sizes phase resumed at position ``p`` of the order (running block ``k``); fusion resumes at the
    first block of the first group of the last plan that the edit may change, or earlier: a group with a
    block at ``p`` or after it, with a block that gained or lost a reader (``relinked``: the sources of
    the links added or removed) or was bypassed or restored, or that reads such a block; and no group
    may have blocks on both sides of it. Where a block before it would now fuse into a block after it,
    it moves back to that block's group.

    Returns:
        The position and running block the phases after fusion resume from (``p`` and ``k`` or
        earlier; 0: plan whole), and the phase's state.
    """
    if not fuse:
        return p, k, None
    pre_values, pre_ports = draft.values, draft.ports
    fs = prev.fusion if prev is not None else None
    if fs is not None:
        assert prev is not None
        pos, groups, member_of = prev.pos, fs.result.groups, fs.result.member_of
        touched = [lk.src for _, lk in relinked]
        flipped = draft.snap.bypassed ^ prev.bypassed
        if flipped:  # a bypassed block is no member; its producers may fuse into it when it runs again
            touched += flipped
            for bid in flipped:
                for incoming in (draft.incoming, prev.incoming):
                    b = draft.blocks.get(bid) or prev.blocks.get(bid)
                    for port in b.description.inputs if b is not None else ():
                        lk = incoming.get((bid, port.name))
                        if lk is not None:
                            touched.append(lk.src)
        readers = fs.readers  # the links from each block: counted again only where links were added or removed
        old_incoming = prev.incoming
        for key, lk in relinked:
            readers[lk.src] += -1 if old_incoming.get(key) is lk else 1
        spans = sorted(((pos[g.sink], pos[g.members[0]]) for g in groups.values()), reverse=True)
        earlier: list[int] = touched
        for _attempt in range(4):
            for bid in earlier:
                q = pos.get(bid)
                if q is not None and q < p:
                    sink = member_of.get(bid)
                    p = min(p, pos[groups[sink].members[0]] if sink is not None else q)
            for last, first in spans:  # no group on both sides of ``p``
                if last < p:
                    break
                p = min(p, first)
            if p == 0:
                break
            k = prev.run_before[p]
            dropped = set(islice(prev.order, p, None))
            # the values and ports as fusion left them before ``p``; as the sizes phase made them after it
            v = prev.vstart[k]
            values = prev.fused_values[:v]
            values += islice(pre_values, v, None)
            ports = dict(prev.fused_ports)
            for bid in dropped:
                s = prev.sized.get(bid)
                if s is not None:
                    for port in s.outputs:
                        ports.pop((bid, port), None)
            for bid, s in islice(draft.sized.items(), k, None):
                for port in s.outputs:
                    vi = pre_ports.get((bid, port))
                    if vi is not None:
                        ports[(bid, port)] = vi
            draft.values, draft.ports = values, ports
            got = fusion_resumed(draft, fs, dropped, k)
            if isinstance(got, FusionState):
                return p, k, got
            earlier = got
        draft.values, draft.ports = list(pre_values), dict(pre_ports)
        return 0, 0, fusion(draft, fuse=fuse)  # the groups changed from the start: planned whole
    draft.values, draft.ports = list(pre_values), dict(pre_ports)
    fused = fusion(draft, fuse=fuse)
    if prev is not None and draft.fusion is not None:  # nothing fused in the last plan (it could not): whole
        return 0, 0, fused
    return p, k, fused


def _sizes(draft: PlanDraft, prev: PlanState | None, p: int) -> tuple[int, tuple[list[int], list[int], list]]:
    """The sizes phase from position ``p`` of the order; returns the running blocks before it, and the
    marks the next plan resumes from (``run_before``, ``vstart``, the warnings found)."""
    order = draft.order
    if prev is None:
        draft.sized, draft.skipped, draft.values, draft.ports, draft.shapes, draft.binding_counts = (
            {},
            [],
            [],
            {},
            {},
            {},
        )
        k = 0
        run_before, vstart = [0], [0]
    else:
        k = prev.run_before[p]
        pos = prev.pos
        draft.sized = dict_copy(prev.sized, k)
        draft.skipped = [b for b in prev.skipped if pos[b] < p]
        draft.values = prev.values[: prev.vstart[k]]
        ports, shapes, counts = dict_copy(prev.ports), dict_copy(prev.shapes), dict_copy(prev.binding_counts)
        for bid in islice(prev.order, p, None):
            s = prev.sized.get(bid)
            if s is not None:
                for port in s.outputs:
                    ports.pop((bid, port), None)
                    shapes.pop((bid, port), None)
            for port in prev.blocks[bid].description.inputs:
                counts.pop((bid, port.name), None)
        draft.ports, draft.shapes, draft.binding_counts = ports, shapes, counts
        draft.warnings[:] = [w for w in prev.size_warnings if pos.get(w.block_id, p) < p]
        run_before, vstart = prev.run_before[: p + 1], prev.vstart[: k + 1]
    skipped = set(draft.skipped)
    sized, values = draft.sized, draft.values
    for i in range(p, len(order)):
        checkpoint()
        had = len(sized)
        size_block(draft, order[i], skipped)
        if len(sized) > had:
            vstart.append(len(values))
        run_before.append(len(sized))
    return k, (run_before, vstart, list(draft.warnings))


def _state(
    draft: PlanDraft, p: int, prev: PlanState | None, run_before: list[int], vstart: list[int], size_warnings: list
) -> PlanState:
    order = draft.order
    if prev is None:
        pos = {b: i for i, b in enumerate(order)}
    else:
        pos = prev.pos
        for bid in islice(prev.order, p, None):
            del pos[bid]
        for i in range(p, len(order)):
            pos[order[i]] = i
    return PlanState(
        context_id=draft.snap.context_id,
        level=draft.level,
        reuse=draft.reuse,
        fuse=False,
        blocks=draft.blocks,
        incoming=draft.incoming,
        links=draft.snap.links,
        bindings=dict(draft.snap.bindings),
        kernel_status=dict(draft.kernel_status or {}),
        faulted=dict(draft.faulted or {}),
        kept=draft.snap.kept,
        bypassed=draft.snap.bypassed,
        order=list(order),
        pos=pos,
        run_before=run_before,
        sized=draft.sized,
        skipped=draft.skipped,
        values=draft.values,
        ports=draft.ports,
        shapes=draft.shapes,
        binding_counts=draft.binding_counts,
        size_warnings=size_warnings,
        vstart=vstart,
        fusion=None,
        fused_values=draft.values,
        fused_ports=draft.ports,
        pinned={},
        pin_marks=[],
        read={},
        read_marks=[],
        counters=0,
        drafts=[],
        nstart=[],
        scalar_slots={},
        binding_slots={},
        counter_users=set(),
        block_nodes={},
        pre=[],
        log={},
        share=None,
    )


def _pins(draft: PlanDraft, st: PlanState, prev: PlanState | None, k: int) -> dict[int, str]:
    if prev is None:
        pinned: dict[int, str] = {}
        read: dict[int, None] = {}
        pin_marks, read_marks = [0], [0]
    else:
        pinned = dict_copy(prev.pinned, prev.pin_marks[k])
        read = dict_copy(prev.read, prev.read_marks[k])
        pin_marks, read_marks = prev.pin_marks[: k + 1], prev.read_marks[: k + 1]
    kept, faulted = draft.snap.kept, draft.faulted or {}
    for s in islice(draft.sized.values(), k, None):
        block_pins(s, kept, faulted, pinned, read)
        pin_marks.append(len(pinned))
        read_marks.append(len(read))
    finish_pins(draft, pinned, read)  # after the blocks' entries: the next plan's prefix stays a prefix
    st.pinned, st.pin_marks, st.read, st.read_marks = pinned, pin_marks, read, read_marks
    return pinned


def _nodes(
    draft: PlanDraft, st: PlanState, prev: PlanState | None, kn: int, cache: NodeCache, hot: list[int]
) -> set[int]:
    """The nodes phase from running block ``kn``; the nodes of the ``hot`` blocks before it are made
    again in place (their scalar arguments). Returns those nodes."""
    remade: set[int] = set()
    if prev is None or kn == 0:
        cache.begin()
        counters_memset(draft)
        nstart = [len(draft.drafts)]
    else:
        n0 = prev.nstart[kn]
        draft.drafts = prev.drafts[:n0]
        nstart = prev.nstart[: kn + 1]
        scalar_slots, block_nodes_ = dict_copy(prev.scalar_slots), dict_copy(prev.block_nodes)
        dropped = list(islice(prev.sized, kn, None))
        for bid in dropped:
            block_nodes_.pop(bid, None)
            for name in prev.blocks[bid].values:
                scalar_slots.pop((bid, name), None)
        draft.scalar_slots, draft.block_nodes = scalar_slots, block_nodes_
        if prev.binding_slots:
            kept = {key: tuple(s for s in v if s[0] < n0) for key, v in prev.binding_slots.items()}
            draft.binding_slots = {key: v for key, v in kept.items() if v}
        draft.counter_users = {i for i in prev.counter_users if i < n0}
        faulted = draft.faulted
        reused = kn - sum(1 for bid in islice(draft.sized, kn) if bid in faulted) if faulted else kn
        cache.carry(dropped, reused)
        _remake(draft, hot, n0, cache, remade)
    env = node_env(draft)
    drafts = draft.drafts
    for s in islice(draft.sized.values(), kn, None):
        checkpoint()
        block_nodes(draft, s, env, None, cache)
        nstart.append(len(drafts))
    cache.end()
    st.counters = len(draft.counters)
    st.drafts, st.nstart = drafts, nstart
    st.scalar_slots, st.binding_slots = draft.scalar_slots, draft.binding_slots
    st.counter_users, st.block_nodes = draft.counter_users, draft.block_nodes
    # The plan gets its own copies: the next plan starts from these and changes them.
    draft.scalar_slots, draft.binding_slots = dict_copy(draft.scalar_slots), dict_copy(draft.binding_slots)
    draft.block_nodes = dict_copy(draft.block_nodes)
    return remade


def _remake(draft: PlanDraft, hot: list[int], n0: int, cache: NodeCache, remade: set[int]) -> None:
    """Make the nodes of the ``hot`` blocks (before node ``n0``) again, in place: the same arguments
    but their scalars' values, so the same slots (recorded already) and the same resources. A fused
    member's values are its group node's scalar arguments."""
    if not hot:
        return
    faulted = draft.faulted or {}
    env = (draft.value_buffer, draft.value_counter, draft.values, {}, {}, set())
    fused = draft.fusion.member_of if draft.fusion is not None else {}
    in_groups: dict[int, set[int]] = {}  # a fused node -> its members whose Hot values changed
    for bid in hot:
        s = draft.sized.get(bid)
        idx = draft.block_nodes.get(bid)
        if s is None or bid in faulted or not idx or idx[-1] >= n0:
            continue
        if bid in fused:
            in_groups.setdefault(idx[0], set()).add(bid)
            continue
        d = s.block.description
        if len(idx) != len(d.kernels):
            continue
        made = tuple(
            _work_node(i, ki, ks, roles, s, env)
            for ki, (i, ks, roles) in enumerate(zip(idx, d.kernels, d.kernel_roles, strict=False))
        )
        for i, nd in zip(idx, made, strict=True):
            draft.drafts[i] = nd
            remade.add(i)
        cache.put(s, idx[0], signature(s, draft.value_buffer, draft.value_counter, draft.buffers), made)
        cache.hits -= 1  # counted as reused with the blocks before ``n0``: made anew
        cache.misses += 1
    blocks = draft.blocks
    for i, bids in in_groups.items():
        nd = draft.drafts[i]
        *head, args = nd.head
        args = tuple(
            _new(Arg, ("scalar", a.dtype, False, a.ref, blocks[a.ref[0]].values[a.ref[1]]))
            if a.kind == "scalar" and a.ref[0] in bids
            else a
            for a in args
        )
        draft.drafts[i] = nd._replace(head=(*head, args))
        remade.add(i)


def _edges(draft: PlanDraft, st: PlanState, prev: PlanState | None, kn: int, remade: set[int]) -> int:
    """The edges phase from the first node of running block ``kn`` (``remade`` nodes before it keep
    their dependencies); returns that node's index."""
    if prev is None or kn == 0:
        n0, pre, log = 0, [], {}
    else:
        n0 = prev.nstart[kn]
        pre, log = prev.pre[:n0], prev.log
        for i in remade:
            cls, head, tail, _, _ = draft.drafts[i]
            pre[i] = _new(cls, (*head, prev.pre[i].deps, *tail))
        cut = n0 * 4
        for nd in islice(prev.drafts, n0, None):  # forget what the last plan's later nodes did
            for r in (*nd.reads, *nd.writes):
                entries = log.get(r)
                if entries and entries[-1] >= cut:
                    del entries[bisect.bisect_left(entries, cut) :]
                    if not entries:
                        del log[r]
    last_writer: dict[object, int] = {}
    readers: dict[object, set[int]] = {}
    seen: set[object] = set()
    counter_users = draft.counter_users
    for cls, head, tail, reads, writes in islice(draft.drafts, n0, None):
        index = head[0]
        flags: dict[object, int] = {}
        for r in reads:
            flags[r] = _READ
        for r in writes:
            flags[r] = flags.get(r, 0) | _WRITE
        for r in flags:
            if r not in seen:  # its last writer and readers among the nodes before ``n0``
                seen.add(r)
                rs: set[int] = set()
                for e in reversed(log.get(r, ())):
                    if e & _WRITE:
                        last_writer[r] = e >> 2
                        break
                    rs.add(e >> 2)
                if rs:
                    readers[r] = rs
        deps = hazards(index, reads, writes, last_writer, readers)
        if index in counter_users:
            deps.add(0)  # the counters' memset
        pre.append(_new(cls, (*head, tuple(sorted(deps)) if len(deps) > 1 else tuple(deps), *tail)))
        entry = index * 4
        for r, f in flags.items():
            entries = log.get(r)
            if entries is None:
                log[r] = [entry | f]
            else:
                entries.append(entry | f)
    st.pre, st.log = pre, log
    draft.nodes = list(pre)
    return n0


def _share(
    draft: PlanDraft, st: PlanState, prev: PlanState | None, kn: int, n0: int, remade: set[int]
) -> tuple[set[int], set[int] | None]:
    """The share phase (``memory.share``), resumed where the last plan's assignment still holds.

    Returns:
        The nodes before ``n0`` whose buffers it renumbered, and the blocks before the first one the
        edit touched whose outputs moved to another buffer or whose buffer now holds other values
        (None: not worked out, the buffers were shared afresh).
    """
    mem = draft.memory
    values = draft.values
    redo: set[int] = set()
    if not draft.reuse or mem is None or len(values) < 3:
        if prev is not None and prev.share is not None and prev.share.shared:
            return set(range(n0)), None  # the last plan shared buffers, this one does not
        return redo, set()
    ps = prev.share if prev is not None and kn > 0 else None
    pre = st.pre
    nv = len(values)
    affected: set[int] = set()
    if ps is None:
        n0, v0 = 0, 0
        touch: list[list[int]] = [[] for _ in values]
        anc = ancestors([n.deps for n in pre])
    else:
        assert prev is not None
        v0 = prev.vstart[kn]
        touch = ps.touch[:v0]
        for n in islice(prev.pre, n0, None):  # the last plan's later nodes touch nothing now
            for vi in _touched(n):
                if vi < v0:
                    t = touch[vi]
                    while t and t[-1] >= n0:
                        t.pop()
                    affected.add(vi)
        touch.extend([] for _ in range(nv - v0))
        anc = ancestors([n.deps for n in islice(pre, n0, None)], ps.anc[:n0])
    for n in islice(pre, n0, None):
        i = n.index
        for vi in _touched(n):
            t = touch[vi]
            if not t or t[-1] != i:
                t.append(i)
            if vi < v0:
                affected.add(vi)
    pins = st.pinned
    first = order_keys(touch, values, draft.block_nodes)  # twice the first node (``order_keys``)
    vorder = sorted(range(nv), key=first.__getitem__)
    start = 0
    checkpoint: Checkpoint | None = None
    checkpoints: list[Checkpoint] = []
    if ps is not None:
        affected.update(vi for vi in pins.keys() ^ ps.pinned if vi < v0)
        old_first = ps.first
        cands = [first[vi] for vi in range(v0, nv)]
        cands += [old_first[vi] for vi in range(v0, len(old_first))]
        cands += [min(first[vi], old_first[vi]) for vi in affected]
        t_min = min(cands, default=2 * n0 - 1)
        if t_min >= 0:
            limit = sum(1 for f in first if f < t_min)  # the values before it are as they were
            if vorder[:limit] == ps.vorder[:limit]:
                at = bisect.bisect_right([c.index for c in ps.checkpoints], limit) - 1
                if at >= 0:
                    c = ps.checkpoints[at]
                    start = c.index
                    checkpoints = ps.checkpoints[: at + 1]
                    checkpoint = c._replace(value_buffer=ps.assigned[:start])
                    del checkpoints[-1]  # recorded again as the assignment resumes there
    lifetimes = [
        Lifetime(tuple(touch[vi]), values[vi].count * values[vi].dtype.itemsize, vi in pins)
        for vi in islice(vorder, start, None)
    ]
    assigned, sizes = assign_buffers(lifetimes, anc, state=checkpoint, checkpoints=checkpoints)
    if ps is not None and start > 0:
        vb = ps.vb[:v0]
        vb.extend([0] * (nv - v0))
    else:
        vb = [0] * nv
    for i in range(start, nv):
        vb[vorder[i]] = assigned[i]
    shared = len(sizes) != nv
    value_buffer = vb if shared else list(range(nv))
    # Renumber the nodes: those before ``n0`` as the last plan did, unless one of their values moved.
    moved: list[int] | None = []
    if ps is not None and ps.shared == shared:
        post = ps.post[:n0]
        old_vb = ps.value_buffer
        redo.update(remade)
        for i in range(start, nv):
            vi = vorder[i]
            if vi < v0 and value_buffer[vi] != old_vb[vi]:
                redo.update(x for x in touch[vi] if x < n0)
                moved.append(vi)  # type: ignore[union-attr]
        for x in redo:
            post[x] = _renumber(pre[x], value_buffer)
    else:
        redo.update(range(n0))
        post, n0, moved = [], 0, None
    if shared:
        post.extend(_renumber(n, value_buffer) for n in islice(pre, n0, None))
    else:
        post.extend(islice(pre, n0, None))
    st.share = ShareState(
        touch, first, vorder, anc, assigned, checkpoints, vb, value_buffer, post, pins.keys(), shared, values
    )
    if not shared:
        return redo, set() if moved is not None else None  # the values stay the buffers (as ``memory`` left them)
    draft.buffers = st.share.buffers = _buffers(values, vb, sizes)
    owners: set[int] | None = None
    if moved is not None and ps is not None:
        # Outputs name their buffer, and a buffer of one value names its block: both change only for
        # the buffers that values moved into or out of, or that values made after ``v0`` took.
        old_vb, old_buffers, new_buffers = ps.vb, ps.buffers, draft.buffers
        touched = {vb[vi] for vi in moved} | {old_vb[vi] for vi in moved}
        touched.update(islice(vb, v0, None))
        touched.update(islice(old_vb, v0, None))
        owners = {values[vi].block_id for vi in moved}
        for b in touched:
            old = old_buffers[b] if b < len(old_buffers) else None
            new = new_buffers[b] if b < len(new_buffers) else None
            if old != new:
                owners.update(r.block_id for r in (old, new) if r is not None and r.block_id >= 0)
    draft.value_buffer = vb
    draft.nodes = list(post)
    draft.outputs = {port: vb[vi] for port, vi in draft.ports.items()}
    for key, (vi, ci) in draft.appends.items():
        draft.appends[key] = (vb[vi], ci)
    draft.memory = MemoryPlan(values=mem.values, value_buffer=tuple(vb), pinned=mem.pinned, ports=mem.ports, reuse=True)
    return redo, owners


def _touched(n: Any) -> list[int]:
    """The values a finished node (before sharing) reads or writes, in argument order."""
    args = getattr(n, "args", None)
    if args is not None:
        return [a.ref for a in args if a.kind == "buffer"]
    b = getattr(n, "buffer", None)
    return [b] if b is not None else []


def _renumber(n: Any, value_buffer: list[int]) -> Any:
    args = getattr(n, "args", None)
    if args is not None:
        if any(a.kind == "buffer" for a in args):
            return n._replace(
                args=tuple(
                    _new(Arg, (a.kind, a.dtype, True, value_buffer[a.ref], None)) if a.kind == "buffer" else a
                    for a in args
                )
            )
        return n
    b = getattr(n, "buffer", None)
    return n._replace(buffer=value_buffer[b]) if b is not None else n
