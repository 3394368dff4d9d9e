"""The regions phases: ``If``/``While``/``For`` blocks holding other blocks, planned as CUDA
conditional nodes whose bodies are the graphs of their blocks.

A patch with regions compiles through these in place of ``order``, ``nodes``, ``edges`` and
``stamps`` (``compile_plan`` picks them when the patch has a region block). The ``fusion`` phase runs
between sizing and memory as without regions, each group within one scope; ``region_nodes`` makes a
group's node where its sink is, in every copy of an unrolled body:

1. ``check_regions``: every placement names a region of the patch; a ``While`` has ``Max``; an
   ``If``/``While`` has a ``Condition`` from a valid source (an ``If``: a block outside its body,
   which runs before it; a ``While``: a block inside its body, re-read after each iteration).
   Each problem is an error on the region (or the placed block), so the last working graph keeps running.
2. ``order_regions``: each scope (the top level, every region's body) is ordered on its own, with
   every region inside it collapsed to one unit: a link from or to a block inside a region orders
   the region as a whole. A cycle through a region is an error naming the blocks and regions on it.
   ``draft.order`` lists the blocks (not the regions) so that a body's blocks are contiguous.
3. ``size_regions``: the sizes phase, then: a region whose condition's block is not running is left
   out with its whole body (sizes runs again with them left out: rare, and only on such a patch).
4. ``region_counters``: one iteration counter per ``While``/``For`` among the append counters, so
   the readback ring brings the counts back without a stall (``RegionPlan.counter``).
5. ``region_nodes``: per scope, in order, each block's nodes; each region a set-condition kernel,
   its conditional node, its body's nodes (``draft.scopes`` maps them to the conditional node) and,
   for loops, the step kernel in the body (after the condition's block; the condition is read when
   the body is done). ``Max``/``Count`` are scalar slots: Hot. A loop with ``Unroll`` U > 1 is a
   main conditional node over U copies of its body and a tail one of one copy (``region_nodes``);
   a nested region's set-condition kernel is in its parent's body, so it sets the handle (and zeroes
   the counter) every time the parent body reaches it. FrameDelays in an unrolled loop's body
   ping-pong between their two buffers (no copy per iteration, one sync after the loop); with
   ``Unroll`` 1 a copy kernel carries them (``region_delays.py``).
6. ``region_edges``: dependencies per scope: a conditional node stands for everything its body
   reads and writes, so blocks after a region wait for it, and it waits for what its body reads.
7. ``region_stamps``: profiling stamps in the top-level graph only, where a region counts as one
   block (its set-condition kernel and conditional node); nodes inside bodies are not stamped (before
   it, at ``PerBlock`` and up, ``body_timers.py`` times them per iteration). Then
   ``publish`` (``stamps.py``), whose node waits for the top-level sinks.
"""

from __future__ import annotations

from collections.abc import Container

from ...blocks.regions import CONDITION, RegionDescription
from ...kernels.types import DType
from ..connections import Link
from ..diagnostics import Diagnostic, DiagnosticCode
from ..plan import (
    Arg,
    ConditionalNodePlan,
    KernelNodePlan,
    MemsetNodePlan,
    ProbeNodePlan,
    RegionPlan,
)
from ..region_kernels import REGION_ENTRIES, region_kernel
from .condition_only import condition_only
from .draft import BlockSizes, NodeDraft, PlanDraft
from .edges import hazards
from .nodes import block_nodes, counters_memset, node_env
from .order import same_frame_links, topological_order
from .probes import probe_requests
from .region_delays import (
    copy_nodes,
    delay_copies,
    delay_inits,
    delay_syncs,
    delays_in_bodies,
    pingpong_delays,
    swap_buffers,
)
from .reuse import replay_slots
from .sizes import sizes
from .stamps import place_stamps, renumber

__all__ = [
    "check_regions",
    "has_regions",
    "order_regions",
    "region_counters",
    "region_edges",
    "region_nodes",
    "region_stamps",
    "size_regions",
]

_new = tuple.__new__
_ONE_THREAD = ((1, 1, 1, 1),)  # KernelNodePlan.yz of a one-thread launch


def has_regions(draft: PlanDraft) -> bool:
    """Whether the patch has a region block (the region phases apply)."""
    return any(isinstance(b.description, RegionDescription) for b in draft.snap.blocks)


def _kind(draft: PlanDraft, rid: int) -> str:
    return draft.blocks[rid].description.kind  # type: ignore[no-any-return]


def check_regions(draft: PlanDraft) -> None:
    """Fill ``draft.parents`` (valid placements) and ``units`` (scope -> members, unordered); record an
    error for every placement, ``Max`` and condition that cannot work."""
    blocks = draft.blocks
    regions = {bid for bid, b in blocks.items() if isinstance(b.description, RegionDescription)}
    parents = draft.parents
    for bid, rid in draft.snap.parents.items():
        if bid not in blocks:
            continue
        if rid not in regions:
            where = f"'{blocks[rid].name}', which is not a region" if rid in blocks else "a region not in this engine"
            draft.error(bid, DiagnosticCode.REGION_PARENT, f"block '{blocks[bid].name}' is placed in {where}")
            continue
        parents[bid] = rid
    for rid in regions:  # a region inside itself (a hand-made snapshot; Context.place refuses it)
        seen = {rid}
        r = parents.get(rid)
        while r is not None:
            if r in seen:
                draft.error(rid, DiagnosticCode.REGION_PARENT, f"region '{blocks[rid].name}' is placed inside itself")
                parents.pop(rid, None)
                break
            seen.add(r)
            r = parents.get(r)
    units: dict[int | None, list[int]] = {None: []}
    for rid in regions:
        units[rid] = []
    for b in draft.snap.blocks:
        units[parents.get(b.id)].append(b.id)
    draft.units = units
    for rid in regions:
        _check_region(draft, rid)


def _check_region(draft: PlanDraft, rid: int) -> None:
    b = draft.blocks[rid]
    kind = b.description.kind
    name = f"{b.description.type_name} '{b.name}'"
    if kind == "while" and not b.values.get("Max"):
        draft.error(
            rid,
            DiagnosticCode.REGION_MAX,
            f"{name} needs Max, the most iterations per frame (a guard against a condition that never turns false)",
        )
    if kind == "for":
        return
    lk = draft.incoming.get((rid, CONDITION))
    if lk is None:
        made = "before it" if kind == "if" else "inside it"
        draft.error(
            rid,
            DiagnosticCode.REGION_CONDITION,
            f"{name} needs a Condition: link a one-element output of a block {made}",
        )
        return
    src = draft.blocks[lk.src]
    if kind == "if" and (lk.src == rid or draft.inside(lk.src, rid)):
        draft.error(
            rid,
            DiagnosticCode.REGION_CONDITION,
            f"the Condition of {name} comes from '{src.name}', inside its body: an If decides before its body runs, "
            "so the condition must be made by a block before the region",
        )
    elif kind == "while" and not draft.inside(lk.src, rid):
        draft.error(
            rid,
            DiagnosticCode.REGION_CONDITION,
            f"the Condition of {name} comes from '{src.name}', outside its body: a While re-reads its condition "
            "after every iteration, so it must be made by a block inside the region",
        )


def _scope_edge(parents: dict[int, int], src: int, dst: int) -> tuple[int | None, int, int] | None:
    """The one scope a link ``src`` -> ``dst`` orders: the innermost scope holding both, with the member
    of it that is or holds each end (None when that is one member: the link stays inside it)."""
    up: dict[int | None, int] = {}  # scope -> the member of it that is or holds ``src``
    cur = src
    while True:
        p = parents.get(cur)
        up[p] = cur
        if p is None:
            break
        cur = p
    cur = dst
    while True:
        p = parents.get(cur)
        if p in up:
            s = up[p]
            return (p, s, cur) if s != cur else None
        cur = p  # type: ignore[assignment]


def order_regions(draft: PlanDraft) -> None:
    """Order each scope with its regions collapsed; fill ``draft.order`` (blocks only, each body's
    blocks together) and replace ``draft.units`` by the ordered members; record ``cycle`` errors."""
    rank = {b.id: i for i, b in enumerate(draft.snap.blocks)}
    blocks = draft.blocks
    ordered: dict[int | None, list[int]] = {}
    edges: dict[int | None, set[tuple[int, int]]] = {}
    for lk in same_frame_links(draft):  # a link into a FrameDelay's In closes no cycle
        found = _scope_edge(draft.parents, lk.src, lk.dst)
        if found is not None:
            edges.setdefault(found[0], set()).add(found[1:])
    for scope, members in draft.units.items():
        members = sorted(members, key=rank.__getitem__)
        links = [Link(s, "", d, "") for s, d in sorted(edges.get(scope, ()))]
        order, cyclic = topological_order(members, links)
        if cyclic:
            names = ", ".join(blocks[b].name for b in cyclic)
            for b in cyclic:
                draft.error(b, DiagnosticCode.CYCLE, f"block '{blocks[b].name}' is part of a cycle ({names})")
        ordered[scope] = order
    draft.units = ordered
    out: list[int] = []

    def walk(scope: int | None) -> None:
        for u in ordered.get(scope, ()):
            if u in ordered:  # a region: its body's blocks follow
                walk(u)
            else:
                out.append(u)

    walk(None)
    draft.order = out


def size_regions(draft: PlanDraft) -> None:
    """The sizes phase, leaving out regions whose condition's block does not run (with their bodies);
    running regions join ``draft.sized`` with their condition as their one input."""
    warnings_before = list(draft.warnings)
    region_warnings: list[Diagnostic] = []
    while True:
        sizes(draft)
        gone = _regions_not_running(draft)
        if not gone:
            break
        for rid, reason in gone.items():
            draft.left_out[rid] = reason
            name = draft.blocks[rid].name
            region_warnings.append(
                Diagnostic(
                    "warning", rid, DiagnosticCode.REGION_NOT_RUNNING, f"region '{name}' is not running: {reason}"
                )
            )
        for bid in draft.order:  # the blocks inside them, each naming the outermost
            top, r = None, draft.parents.get(bid)
            while r is not None:
                if r in gone:
                    top = r
                r = draft.parents.get(r)
            if top is not None:
                draft.left_out.setdefault(bid, f"its region '{draft.blocks[top].name}' is not running")
        draft.warnings[:] = warnings_before  # again from the start, with those left out
    draft.warnings.extend(region_warnings)
    for rid in _regions_in_order(draft):
        if rid in draft.left_out:
            draft.skipped.append(rid)
            continue
        lk = draft.incoming.get((rid, CONDITION))
        inputs = {CONDITION: draft.sized[lk.src].outputs[lk.src_port]} if lk is not None else {}
        draft.sized[rid] = BlockSizes(draft.blocks[rid], inputs, {}, (), range(0), ())  # no kernels


def _regions_in_order(draft: PlanDraft) -> list[int]:
    out: list[int] = []

    def walk(scope: int | None) -> None:
        for u in draft.units.get(scope, ()):
            if u in draft.units:
                out.append(u)
                walk(u)

    walk(None)
    return out


def _regions_not_running(draft: PlanDraft) -> dict[int, str]:
    gone: dict[int, str] = {}
    for rid in _regions_in_order(draft):
        if rid in draft.left_out:
            continue
        parent = draft.parents.get(rid)
        if parent is not None and (parent in gone or parent in draft.left_out):
            gone[rid] = f"its region '{draft.blocks[parent].name}' is not running"
            continue
        lk = draft.incoming.get((rid, CONDITION))
        if lk is not None and lk.src not in draft.sized:
            gone[rid] = f"its Condition comes from '{draft.blocks[lk.src].name}', which is not running"
    return gone


def region_counters(draft: PlanDraft) -> None:
    """One iteration counter per running ``While``/``For``, after the append counters (memory phase)."""
    for rid in _regions_in_order(draft):
        if rid not in draft.sized or _kind(draft, rid) == "if":
            continue
        draft.counters.append((rid, "Iterations"))


def _region_kernel_draft(
    draft: PlanDraft, index: int, rid: int, entry: str, args: list[Arg], reads: list, writes: list
) -> NodeDraft:
    source, desc = region_kernel(entry)
    head = (index, rid, REGION_ENTRIES[entry], source, desc, 1, 1, 0, tuple(args))
    nd = _new(NodeDraft, (KernelNodePlan, head, _ONE_THREAD, reads, writes))
    # Hot edits of Count/Max and Warm rebinds of a bound condition patch these slots too
    replay_slots(nd, draft.scalar_slots, draft.binding_slots, draft.counter_users)
    return nd


def _condition_arg(draft: PlanDraft, rid: int) -> tuple[Arg, object, int]:
    """The condition's argument, the resource it reads and its element size (1 or 4 bytes)."""
    src = draft.sized[rid].inputs[CONDITION]
    lk = draft.incoming[(rid, CONDITION)]
    dtype = draft.blocks[lk.src].description.output(lk.src_port).dtype
    if src.kind == "value":
        bi = draft.value_buffer[src.ref]  # type: ignore[index]
        return _new(Arg, ("buffer", dtype, True, bi, None)), bi, dtype.itemsize
    return _new(Arg, ("external", dtype, True, src.ref, None)), src.ref, dtype.itemsize


#: The most copies of one block that unrolled loops make: nested ones multiply (an inner loop's
#: copies are made in every copy of the outer body), so an inner loop unrolls less where needed.
MAX_COPIES = 64


def _unroll(draft: PlanDraft, rid: int, copies: int) -> int:
    """A loop's effective ``Unroll`` when its blocks are already made ``copies`` times by the loops
    around it (1 for a hand-made snapshot without one)."""
    value = max(1, int(draft.blocks[rid].values.get("Unroll", 1)))  # type: ignore[call-overload]
    return min(value, max(1, MAX_COPIES // copies))


def region_nodes(draft: PlanDraft) -> None:
    """The nodes phase for a patch with regions (see the module docstring, step 5).

    A loop with ``Unroll`` U > 1 is two conditional nodes fed by one begin kernel (a set-condition
    kernel sets only the handle of a node in its own graph, or of the node whose body it is in)::

        begin_n (counter = 0; main runs if a whole pass fits: limit >= U)
        WHILE main { U copies of the body; step_n (counter += U; again while another pass fits) }
        tail kernel (the tail runs while iterations are left: For counter < Count; While, also the condition)
        WHILE tail { one copy of the body; the one-step kernel of U = 1 }

    so a For runs exactly ``Count`` iterations and a While never more than ``Max``; a While checks its
    condition once per pass (up to U - 1 iterations past the one that turned it false), and the blocks
    whose values only the condition reads are made in the last copy of the main body only
    (``condition_only.py``). A loop holding FrameDelays that ping-pong carries (``region_delays.py``)
    unrolls by an even U, swaps the delays' buffers in every odd copy, and runs what the main loop
    leaves in a tail of pairs (``RegionPlan.pairs``; ``region_for_tail_n``/``region_while_tail_n``
    enter it) before the tail of one copy; one sync kernel per delay follows the loop. Every copy is
    nodes of the same blocks: their Hot and Warm slots, and ``block_nodes``, list every copy, and a Code
    swap finds them all by ``(block, kernel)``. A probe in a body is one record written by the last copy
    of the main body and by the tail's copy (the last iteration's value shows). Nested unrolled loops
    multiply copies: an inner loop unrolls less so that no block has more than ``MAX_COPIES``
    (``RegionPlan.unroll`` is the unroll used).
    """
    env = node_env(draft)
    counters_memset(draft)
    probes = probe_requests(draft)  # a probe in a body reads its value after each iteration (the last one shows)
    drafts, scopes, sized = draft.drafts, draft.scopes, draft.sized
    counter_of = {k[0]: ci for ci, k in enumerate(draft.counters) if k[1] == "Iterations" and k[0] in draft.units}
    u64, u32 = DType.UINT64, DType.UINT32
    made_probes: dict[int, list[NodeDraft]] = {}  # block -> its probe drafts, repeated in later copies

    body_delays = delays_in_bodies(draft)  # FrameDelays in bodies: init before the region, a copy per body copy
    in_bodies = {bid for inside in body_delays.values() for bid in inside}

    fused = draft.fusion

    def add_block(u: int, mode: str) -> None:
        """Block ``u``'s nodes; ``mode``: ``make`` its probes, ``repeat`` the ones made, or ``none``. The
        sink of a fused group makes the group's node, which is every member's (in every copy)."""
        group = fused.groups.get(u) if fused is not None else None
        before = {m: draft.block_nodes.pop(m, ()) for m in (group.members if group is not None else (u,))}
        first = len(drafts)
        block_nodes(draft, sized[u], env, probes if mode == "make" else None)
        if mode == "make" and u in probes:
            made_probes[u] = [d for d in drafts[first:] if d[0] is ProbeNodePlan]
        elif mode == "repeat":
            for d in made_probes.get(u, ()):  # the same record (probe index and offset), written again
                drafts.append(_new(NodeDraft, (ProbeNodePlan, (len(drafts), *d[1][1:]), d[2], d[3], d[4])))
        for m, nodes in before.items():
            if nodes:
                draft.block_nodes[m] = nodes + draft.block_nodes.get(m, ())

    carried: set[int] = set()  # delays carried by ping-pong: no copy node

    def walk(scope_node: int | None, scope: int | None, mode: str, copies: int, skip: Container[int] = ()) -> None:
        for u in draft.units.get(scope, ()):
            if u not in sized or u in in_bodies or u in skip:
                continue
            if scope is None and u in body_delays:
                delay_inits(draft, body_delays[u], env, probes)
            first = len(drafts)
            if u not in draft.units:
                add_block(u, mode)
            else:
                before = draft.block_nodes.pop(u, ())
                _region(u, mode, copies)
                draft.block_nodes[u] = before + draft.block_nodes[u]
            if scope_node is not None:
                for i in range(first, len(drafts)):
                    scopes.setdefault(i, scope_node)
                draft.body_units.append((scope_node, u, first, len(drafts)))  # what body timers time
        if draft.delays:
            delay_copies(draft, scope, scope_node, carried)

    def kernel(rid: int, entry: str, args: list[Arg], reads: list, writes: list, scope: int | None = None) -> int:
        i = len(drafts)
        drafts.append(_region_kernel_draft(draft, i, rid, entry, args, reads, writes))
        if scope is not None:
            scopes[i] = scope
        return i

    def conditional(rid: int, kind: str, token: object) -> int:
        i = len(drafts)
        drafts.append(_new(NodeDraft, (ConditionalNodePlan, (i, rid, kind), (-1,), [token], [])))
        return i

    def _region(rid: int, mode: str, copies: int) -> None:
        kind = _kind(draft, rid)
        values = draft.blocks[rid].values
        begin = len(drafts)
        handle = _new(Arg, ("handle", u64, False, begin + 1, None))
        token = ("region", begin + 1)  # the set-condition kernel "writes" the handle its conditional node "reads"
        if kind == "if":
            arg, res, size = _condition_arg(draft, rid)
            kernel(rid, f"region_if{size}", [handle, arg], [res], [token])
            cond = conditional(rid, "if", token)
            walk(cond, rid, mode, copies)
            draft.regions[rid] = RegionPlan(kind, cond)
            draft.block_nodes[rid] = (begin, cond)
            return
        limit = "Max" if kind == "while" else "Count"
        ci = counter_of[rid]
        unroll = _unroll(draft, rid, copies)
        pairs = pingpong_delays(draft, rid) if unroll > 1 else []  # delays the copies carry by swapping buffers
        swap: dict[int, int] = {}
        for bid, prev, cur in pairs:
            swap[prev], swap[cur] = cur, prev
            carried.add(bid)
        if swap:
            unroll -= unroll % 2  # whole pairs: each pass ends with the state back where it began
        # the levels: the main loop, then tails running what it leaves (pairs, then one copy, with ping-pong)
        levels = [unroll] if unroll == 1 else [unroll, 2, 1] if swap and unroll > 2 else [unroll, 1]
        skip = condition_only(draft, rid) if kind == "while" and unroll > 1 else frozenset()
        inside = copies * sum(levels)  # copies of each block in the body
        counter = _new(Arg, ("counter", u32, True, ci, None))
        limit_arg = _new(Arg, ("scalar", u32, False, (rid, limit), values[limit]))
        cres = -1 - ci  # the counter as a resource of the edges phase
        # begin: zeroes the iteration counter (a nested loop counts from 0 each time it is reached)
        if unroll == 1:
            kernel(rid, "region_begin", [handle, counter, limit_arg], [], [token, cres])
        else:
            unroll_arg = _new(Arg, ("const", u32, False, None, unroll))
            kernel(rid, "region_begin_n", [handle, counter, limit_arg, unroll_arg], [], [token, cres])
        main = conditional(rid, "while", token)
        for copy in range(unroll):  # the last copy makes the body's probes and computes the condition
            last = copy == unroll - 1
            body_copy(main, rid, mode if last else "none", inside, swap if copy % 2 else None, () if last else skip)
        nodes = [begin, main, _level_step(rid, kind, handle, counter, limit_arg, main, unroll)]
        tails = []
        for level in levels[1:]:
            mid = len(drafts)
            tail_handle = _new(Arg, ("handle", u64, False, mid + 1, None))
            tail_token = ("region", mid + 1)
            level_arg = _new(Arg, ("const", u32, False, None, level))
            if kind == "for":
                entry, args, reads = "region_for_tail", [tail_handle, counter, limit_arg], [cres]
            else:
                arg, res, size = _condition_arg(draft, rid)
                entry, args, reads = f"region_while_tail{size}", [tail_handle, arg, counter, limit_arg], [res, cres]
            if level > 1:  # a tail of pairs: entered while two iterations are left
                entry = "region_for_tail_n" if kind == "for" else f"region_while_tail_n{entry[-1]}"
                args.append(level_arg)
            kernel(rid, entry, args, reads, [tail_token])
            tail = conditional(rid, "while", tail_token)
            for copy in range(level):
                body_copy(tail, rid, "none" if mode == "none" else "repeat", inside, swap if copy % 2 else None, ())
            nodes += [mid, tail, _level_step(rid, kind, tail_handle, counter, limit_arg, tail, level)]
            tails.append(tail)
        if pairs:
            delay_syncs(draft, pairs, ci)  # after the loop, in the scope around it
        draft.regions[rid] = RegionPlan(
            kind, main, ci, limit, unroll, tails[-1] if tails else None, tails[0] if len(tails) > 1 else None
        )
        draft.block_nodes[rid] = tuple(nodes)

    def body_copy(cond: int, rid: int, mode: str, copies: int, swap: dict | None, skip: Container[int]) -> None:
        """One copy of loop ``rid``'s body in conditional node ``cond``; with ``swap``, the delays'
        buffers swapped (the odd copies of a loop that ping-pongs); ``skip``: blocks left out."""
        first = len(drafts)
        walk(cond, rid, mode, copies, skip)
        if swap:
            swap_buffers(draft, first, swap)

    def _level_step(rid: int, kind: str, handle: Arg, counter: Arg, limit_arg: Arg, cond: int, unroll: int) -> int:
        """The step kernel last in ``cond``'s body (after the condition's block: the condition is read
        when the body is done): counts ``unroll`` iterations, goes on while another pass of as many fits."""
        cres = -1 - counter.ref  # type: ignore[operator]
        n, extra = ("", []) if unroll == 1 else ("_n", [_new(Arg, ("const", u32, False, None, unroll))])
        if kind == "for":
            return kernel(rid, f"region_for_step{n}", [handle, counter, limit_arg, *extra], [cres], [cres], scope=cond)
        arg, res, size = _condition_arg(draft, rid)
        args = [handle, arg, counter, limit_arg, *extra]
        return kernel(rid, f"region_while_step{n}{size}", args, [res, cres], [cres], scope=cond)

    walk(None, None, "make", 1)


def region_edges(draft: PlanDraft) -> None:
    """The edges phase for a patch with regions (see the module docstring, step 6)."""
    drafts, scopes = draft.drafts, draft.scopes
    n = len(drafts)
    reads: list[set] = [set(d.reads) for d in drafts]
    writes: list[set] = [set(d.writes) for d in drafts]
    counter_user = [
        i in draft.counter_users or any(isinstance(r, int) and r < 0 for r in (*reads[i], *writes[i])) for i in range(n)
    ]
    for i in range(n - 1, -1, -1):  # a body's nodes follow their conditional node: fold them in backwards
        p = scopes.get(i)
        if p is not None:
            reads[p] |= reads[i]
            writes[p] |= writes[i]
            counter_user[p] = counter_user[p] or counter_user[i]
    state: dict[int | None, tuple[dict, dict]] = {}
    out = draft.nodes
    for i, (cls, head, tail, _, _) in enumerate(drafts):
        scope = scopes.get(i)
        last_writer, readers = state.setdefault(scope, ({}, {}))
        deps = hazards(i, reads[i], writes[i], last_writer, readers)
        if scope is None and counter_user[i] and i != 0 and draft.counters:
            deps.add(0)  # the counters' memset, in the top-level graph
        deps.discard(i)
        out.append(_new(cls, (*head, tuple(sorted(deps)), *tail)))


def region_stamps(draft: PlanDraft) -> None:
    """Profiling stamps for a patch with regions (see the module docstring, step 7)."""
    if not draft.level.timed:
        return
    nodes, scopes = draft.nodes, draft.scopes
    top = [n for n in nodes if n.index not in scopes]
    # ``place_stamps`` times kernel and captured nodes: a conditional node stands in as a kernel node of
    # its region while stamps are placed, and is put back after. It sees the top level numbered 0..k-1.
    pos = {n.index: i for i, n in enumerate(top)}
    copies = copy_nodes(draft)  # a top-level delay's copy comes long after its init: not timed (a memset stands in)
    local = [
        (
            KernelNodePlan(i, n.block_id, -1, None, None, 0, 0, 0, (), ())  # type: ignore[arg-type]
            if isinstance(n, ConditionalNodePlan)
            else MemsetNodePlan(i, 0)
            if n.index in copies
            else n
        )._replace(index=i, deps=tuple(pos[d] for d in n.deps))
        for i, n in enumerate(top)
    ]
    placed, remap_local, timings, count = place_stamps(local, draft.level)
    local_of = {new: li for li, new in remap_local.items()}
    body: dict[int, list] = {}
    for n in nodes:
        if n.index in scopes:
            body.setdefault(_top_of(scopes, n.index), []).append(n)
    final: list = []
    pmap: dict[int, int] = {}  # index in ``placed`` -> index in ``final``
    remap: dict[int, int] = {}  # index before -> index in ``final``
    for pn in placed:
        li = local_of.get(pn.index)
        node = pn if li is None else top[li]
        if li is not None and not isinstance(node, ConditionalNodePlan) and node.index not in copies:
            node = pn
        pmap[pn.index] = len(final)
        final.append(node._replace(index=len(final), deps=tuple(pmap[d] for d in pn.deps)))
        if li is not None:
            old = top[li].index
            remap[old] = len(final) - 1
            for bn in body.get(old, ()):  # its body follows the conditional node
                remap[bn.index] = len(final)
                final.append(bn)
    for i, n in enumerate(final):
        if n.index in scopes and remap.get(n.index) == i:
            final[i] = n._replace(index=i, deps=tuple(remap[d] for d in n.deps))
    draft.nodes = final
    draft.timings, draft.stamp_count = timings, count
    draft.scopes = {remap[i]: remap[p] for i, p in scopes.items()}
    renumber(draft, remap)


def _top_of(scopes: dict[int, int], i: int) -> int:
    while i in scopes:
        i = scopes[i]
    return i
