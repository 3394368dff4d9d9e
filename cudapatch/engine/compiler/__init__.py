"""The graph compiler: a PatchSnapshot in, a GraphPlan out. Pure: no driver calls.

``compile_plan`` runs a sequence of phases over one plan under construction (``PlanDraft``), each
in its own module and tested on its own:

1. ``validate``: links that make sense (unknown port, type mismatch, duplicate link, another
   engine's block → errors).
2. ``order``: topological order of the blocks (a cycle that does not pass through a FrameDelay →
   errors). Errors stop here, all at once.
3. ``sizes``: per block, where each input comes from, whether the block runs (a missing input, a
   kernel not ready, a rejected library shape leave it out with a warning), and the values it
   makes (outputs, internal links) with their element counts and shapes. Shape propagation lives
   here (``shapes``): each kernel's 1-/2-/3-D launch from its grid's shape, and the check that every
   input covers what the launches read (a short or mis-shaped input, a shape that does not resolve:
   an error on the block, which never launches).
3b. ``delays``: each FrameDelay's pair of buffers (its Out, and the value linked into its In),
   checked (sizes, sources); errors stop here.
3c. ``fusion`` (unless ``fuse=False``): chains and trees of elementwise blocks become one generated
   kernel; their intermediates need no buffer.
4. ``memory``: a buffer per value, append counters, the values pinned to a buffer of their own.
5. ``nodes``: kernel, captured-call and memset nodes with the source of every argument.
6. ``edges``: dependencies from buffer hazards (read after write, write after read, write after write).
7. ``share``: values whose lifetimes do not overlap under those dependencies share a buffer
   (``liveness``); the nodes' buffer arguments are renumbered, no edge is added.
8. ``stamps`` and ``publish``: profiling timestamps; the node publishing readback values.
9. ``composites``: a flattened composite's outputs, parameter and binding slots filed under the
   composite's own keys, its inner blocks' diagnostics put on it; its nodes grouped into one
   child-graph node when it asks for one (``child_graphs``).

A patch with ``If``/``While``/``For`` regions runs the region-aware forms of ordering, nodes, edges and
stamps (``regions.py``): bodies become the body graphs of conditional nodes; at ``PerBlock`` and up,
``body_timers`` times the blocks inside bodies on the device (``body_timers.py``). Fusion runs there too,
per graph level: a fused group's blocks are all in one scope (the top level, or one body). Its values keep
a buffer each (no ``share``: liveness across loop iterations and body graphs is not planned yet).

``PlanDraft.plan()`` freezes the result. With a ``NodeCache``, the phases from sizes to share resume
from the last plan after the blocks an edit did not touch (``resume.py``: incremental planning).
"""

from __future__ import annotations

from collections.abc import Mapping

from ...kernels.pacing import checkpoint
from ..context import PatchSnapshot
from ..plan import GraphPlan
from ..profiling import ProfilingLevel
from .body_timers import body_timers
from .child_graphs import child_graphs
from .composites import attribute_diagnostics, composite_keys
from .delays import delays
from .draft import KernelStatus, PlanDraft
from .edges import edges
from .fusion import fusion
from .memory import memory, share
from .nodes import nodes
from .order import order
from .region_delays import check_region_delays
from .regions import (
    check_regions,
    has_regions,
    order_regions,
    region_counters,
    region_edges,
    region_nodes,
    region_stamps,
    size_regions,
)
from .resume import PlanDelta, block_changes, plan_resumed, resumable
from .reuse import NodeCache
from .sizes import sizes
from .stamps import publish, stamps
from .validate import validate

__all__ = [
    "NodeCache",
    "PlanDelta",
    "PlanDraft",
    "compile_plan",
    "delays",
    "edges",
    "fusion",
    "memory",
    "nodes",
    "order",
    "publish",
    "share",
    "sizes",
    "stamps",
    "validate",
]


def compile_plan(
    snap: PatchSnapshot,
    kernel_status: KernelStatus | None = None,
    level: ProfilingLevel = ProfilingLevel.NONE,
    faulted: Mapping[int, str] | None = None,
    *,
    fuse: bool = True,
    cache: NodeCache | None = None,
    reuse: bool = True,
) -> GraphPlan:
    """Compile a patch snapshot into a GraphPlan.

    Args:
        snap: The patch.
        kernel_status: ``(block_id, kernel index)`` → ``(severity, code, message)`` for kernels that
            cannot run yet (still compiling, or failed with no earlier version to fall back on).
            Their blocks are left out, like blocks with a missing input, and so are their dependents.
        level: Profiling level: which timestamps to place (see ``stamps.place_stamps``).
        faulted: Blocks whose kernels faulted on the GPU (id → message): their kernels are left out,
            their outputs are zero-filled by memset nodes each frame, and blocks reading them are warned.
        fuse: Fuse chains and trees of elementwise blocks into one generated kernel each (``fusion``; on
            by default, as in ``Engine``). The fault replay plans with False: a block's own nodes.
        cache: Reuse the node drafts of blocks an edit did not touch (``reuse.NodeCache``: one per
            engine, one plan at a time); the plan is the same as without it.
        reuse: Let values whose lifetimes do not overlap share buffers (``memory``, ``share``); False gives
            every value its own buffer.

    Raises:
        GraphCompileError: validation errors (its ``diagnostics`` name every block and port involved).
    """
    draft = PlanDraft(snap, kernel_status, level, faulted, reuse)
    last = cache.state if cache is not None else None
    if last is not None and last.context_id != snap.context_id:  # another patch: planned whole
        last = cache.state = None  # type: ignore[union-attr]
    if cache is not None:
        # What this plan replaces (the last plan's state, the delta before it; below, the last plan)
        # goes with the drafts: freed here, each was a cascade of deallocations (``NodeCache.spent``).
        cache.spent += (cache.state, cache.delta)
        cache.delta = None  # set again by a plan that resumes
    changes = block_changes(snap.blocks, last.blocks) if last is not None else None
    if last is not None and changes is not None:
        unchanged = not changes.removed and not changes.redescribed
        validate(draft, (last.blocks, last.incoming, last.links, unchanged))
    else:
        validate(draft)
    if has_regions(draft):
        if cache is not None:
            cache.state = None
        return _compile_regions(draft, fuse)
    checkpoint()  # between phases (and in the per-block loops): a frame on another thread runs first
    order(draft, last if last is not None and resumable(draft) else None, changes)
    attribute_diagnostics(draft)
    draft.raise_errors()
    checkpoint()
    if cache is not None and resumable(draft):
        # Incremental planning: the phases from sizes to share resume from the last plan (``resume.py``).
        first = draft
        draft = plan_resumed(draft, cache, fuse, changes)
        plan = _finish(draft)
        delta = cache.state.delta
        cache.delta = PlanDelta(cache.plan, plan, *delta) if delta is not None else None
        cache.spent += (first, draft, cache.plan)
        cache.plan = plan
        return plan
    if cache is not None:
        cache.state = None
    sizes(draft)
    delays(draft)
    draft.raise_errors()
    checkpoint()
    fusion(draft, fuse=fuse)
    memory(draft)
    checkpoint()
    if cache is not None:
        cache.begin()
    nodes(draft, cache)
    if cache is not None:
        cache.end()
    checkpoint()
    edges(draft)
    share(draft)
    checkpoint()
    plan = _finish(draft)
    if cache is not None:
        cache.spent.append(draft)
    return plan


def _finish(draft: PlanDraft) -> GraphPlan:
    stamps(draft)
    publish(draft)
    return child_graphs(composite_keys(draft.plan(), draft.snap), draft.snap)


def _compile_regions(draft: PlanDraft, fuse: bool) -> GraphPlan:
    """``compile_plan`` for a patch with regions: the same phases, scoped (``regions.py``). Fusion groups
    blocks of one scope only (``fusion``: a group never spans a body and the graph around it, nor two
    bodies), so each fused node lands in the graph its members' nodes would have been in."""
    check_regions(draft)
    order_regions(draft)
    draft.raise_errors()
    size_regions(draft)
    delays(draft, alternating=False)  # carried by copy nodes here, not by two phases (``region_delays.py``)
    check_region_delays(draft)
    draft.raise_errors()
    fusion(draft, fuse=fuse)
    memory(draft)
    region_counters(draft)
    region_nodes(draft)
    region_edges(draft)
    body_timers(draft)  # PerBlock and up: the blocks inside bodies, timed on the device each iteration
    region_stamps(draft)
    publish(draft)
    return composite_keys(draft.plan(), draft.snap)
