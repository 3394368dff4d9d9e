"""Statistics of a completed frame, read without waiting, and the warnings its measurements raise;
the engine's counters of update tiers and build timing.

The numbers come from the readback ring (timestamps and append counters the graph publishes into
host memory, see ``engine.readback``). Everything here reads: ``collect_stats`` builds an
``EngineStats`` and changes nothing, and the threshold checks (``append_warnings``,
``occupancy_warnings``) return diagnostics for the engine to hand to its ``DiagnosticBoard``.
``show_on_blocks`` is the writer, named as such: it copies a reading onto what ``str(block)``
shows (a build's part is ``built_view``'s). Cost is paid only when someone asks (``Engine.stats()``),
never on the frame path.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..blocks.block import Block
from .diagnostics import Diagnostic, DiagnosticCode
from .plan import GraphPlan, TimingPair
from .profiling import AppendStats, BlockStats, EngineStats, KernelStats, ProfilingLevel
from .region_stats import body_times
from .registry import BlockRegistry

__all__ = [
    "APPEND_FULL",
    "BuildTiming",
    "EngineCounters",
    "LOW_OCCUPANCY",
    "append_warnings",
    "collect_stats",
    "FrameReading",
    "frame_times",
    "log_build",
    "newest_frame",
    "occupancy_warnings",
    "readings_shown",
    "show_on_blocks",
]

LOW_OCCUPANCY = 0.25  # warn below this fraction of an SM's threads (occupancy API, Deep levels)
APPEND_FULL = 0.95  # warn when an append output is this full


@dataclass
class EngineCounters:
    """How often each update tier ran (for tests, the overlay and benchmarks)."""

    frames: int = 0
    rebuilds: int = 0
    instantiations: int = 0  # executable graphs instantiated for the graphs swapped in (cuGraphInstantiate)
    exec_updates: int = 0  # Cold builds the running executable took in place instead (cuGraphExecUpdate)
    failed_rebuilds: int = 0
    hot_updates: int = 0
    warm_updates: int = 0
    warm_resizes: int = 0  # structure edits applied in place (counts/grids changed, buffers still fit)
    growths: int = 0  # buffers reallocated larger by a Warm resize (a bound input grew: no new graph)
    bypass_updates: int = 0  # ``enabled`` flags applied to the running graph (nodes off/on, readers redirected)
    code_swaps: int = 0  # recompiled kernels swapped into the running graph
    kernel_upgrades: int = 0  # optimised builds swapped in after a quick one (an Expression edit)
    specializations: int = 0  # fused kernels swapped for a build with their resting scalars compiled in
    recaptures: int = 0  # library calls captured again in place (pointer, size or host scalar changes)
    nodes_patched: int = 0
    faults: int = 0  # sticky GPU faults survived (context reset, faulting block disabled)
    frames_dropped: int = 0  # isolated engine: frames not sent while the engine process lagged behind


@dataclass
class BuildTiming:
    """Where the last structure change spent its host time (ms); read by benchmarks and the overlay."""

    tier: str = ""
    reap_ms: float = 0.0  # closing graphs retired by earlier rebuilds
    compile_ms: float = 0.0  # snapshot + compile_plan
    realize_ms: float = 0.0  # buffers, kernel nodes, instantiate
    total_ms: float = 0.0  # compile to swap-in (excludes reap)


def log_build(logger: logging.Logger, t: BuildTiming, running: int, total: int) -> None:
    """The one INFO line of a build that changed the running graph: its tier, host time and how many
    of the patch's blocks run (what is left out, and why, is on the blocks). A deferred build (a
    running block's kernel is compiling) changed nothing: no line."""
    if t.tier in ("", "deferred"):
        return
    logger.info(
        "%s build: %.1f ms (plan %.1f, realize %.1f), %d of %d blocks running",
        t.tier,
        t.total_ms,
        t.compile_ms,
        t.realize_ms,
        running,
        total,
    )


@dataclass(frozen=True)
class FrameReading:
    """The newest completed frame of a graph: the engine frame it was (None: none completed yet), how
    many frames ago, and its timestamps (None: no timing at this level, or no frame yet)."""

    frame: int | None = None
    age: int | None = None
    stamps: np.ndarray | None = None


@contextmanager
def newest_frame(graph: Any) -> Iterator[FrameReading]:
    """Take the newest completed frame of ``graph``'s readback ring and hold it: while the block runs,
    every value read from the ring (append counts included) is from that one frame. No driver call."""
    rb = graph.readback if graph is not None else None
    if rb is None:
        yield FrameReading()
        return
    rb.poll()
    rb.frozen = True
    try:
        frame = rb.latest_frame
        stamps = rb.latest_stamps if frame is not None and rb.stamps else None
        yield FrameReading(frame, rb.age(), stamps)
    finally:
        rb.frozen = False


def frame_times(
    timings: Iterable[TimingPair], stamps: np.ndarray
) -> tuple[float | None, dict[int, float], dict[tuple[int, int], float]]:
    """GPU times (ms) from one frame's timestamps (nanoseconds of the GPU's global timer).

    Returns:
        ``(whole graph or None, per block id, per (block id, kernel index))``.
    """
    times = stamps.astype(np.int64)  # unsigned differences would wrap where a pair is out of order
    graph_ms = None
    block_ms: dict[int, float] = {}
    kernel_ms: dict[tuple[int, int], float] = {}
    for pair in timings:
        ms = max(0, int(times[pair.end] - times[pair.start])) / 1e6
        if pair.kind == "graph":
            graph_ms = ms
        elif pair.kind == "block":
            block_ms[pair.key] = ms  # type: ignore[index]
        else:
            kernel_ms[pair.key] = ms  # type: ignore[index]
    return graph_ms, block_ms, kernel_ms


def append_warnings(appends: Mapping[tuple[int, str], Any], blocks: BlockRegistry) -> tuple[Diagnostic, ...]:
    """A warning for each append output at least ``APPEND_FULL`` full in the frame its count is from.

    Args:
        appends: ``(block id, port) -> AppendBuffer`` of the running graph.
        blocks: The patch's blocks (a block removed since the build gets no warning).
    """
    out = []
    for (bid, port), ab in appends.items():
        if bid in blocks.composites:
            continue  # a composite's exposed append output: the inner block's own key warns (on the composite)
        b = blocks.get(bid)
        count = ab.count if b is not None else None
        if count is None:
            continue
        st = AppendStats(count, ab.capacity, ab.overflowed)
        if st.fill >= APPEND_FULL:
            name = b.name
            out.append(
                Diagnostic(
                    "warning",
                    bid,
                    DiagnosticCode.APPEND_FULL,
                    f"append output '{name}.{port}' is {st.fill:.0%} full ({st.count}/{st.capacity}); "
                    "raise its capacity",
                )
            )
    return tuple(out)


def occupancy_warnings(occupancy: Mapping[tuple[int, int], float], blocks: BlockRegistry) -> tuple[Diagnostic, ...]:
    """A warning for each kernel whose occupancy (measured at the Deep levels) is below ``LOW_OCCUPANCY``."""
    out = []
    for (bid, ki), occ in occupancy.items():
        if occ < LOW_OCCUPANCY:
            b = blocks.get(bid)
            entry = b.description.kernels[ki].descriptor.entry_point if b else "?"
            out.append(
                Diagnostic(
                    "warning",
                    bid,
                    DiagnosticCode.LOW_OCCUPANCY,
                    f"kernel '{entry}' of '{b.name if b else bid}' keeps only {occ:.0%} of an "
                    "SM's threads busy (block size, registers or shared memory)",
                )
            )
    return tuple(out)


def collect_stats(
    *,
    level: ProfilingLevel,
    blocks: Iterable[Block],
    graph: Any,
    reading: FrameReading,
    pool: Any,
    diagnostics: tuple[Diagnostic, ...],
) -> EngineStats:
    """What the newest completed frame measured, for every block. Reads only.

    Args:
        level: The profiling level.
        blocks: The patch's blocks, in order.
        graph: The running ``CompiledGraph`` (None before the first build).
        reading: The frame the numbers are from (``newest_frame``).
        pool: The buffer pool (its use is reported).
        diagnostics: The diagnostics published now.
    """
    frame, stamps = reading.frame, reading.stamps
    graph_ms, block_ms, kernel_ms = frame_times(graph.plan.timings, stamps) if stamps is not None else (None, {}, {})
    body = body_times(graph) if stamps is not None else {}  # blocks inside regions' bodies: timed per run
    occupancy = graph.occupancy if graph is not None else {}
    rows = []
    for b in blocks:
        append: dict[str, AppendStats] = {}
        if graph is not None and frame is not None:
            for port, ab in b.debug.append.items():
                count = ab.count
                if count is not None:
                    append[port] = AppendStats(count, ab.capacity, ab.overflowed)
        kernels = tuple(
            KernelStats(k.descriptor.entry_point, kernel_ms.get((b.id, ki)), occupancy.get((b.id, ki)))
            for ki, k in enumerate(b.description.kernels)
        )
        debug = b.debug
        ms, bt = block_ms.get(b.id), body.get(b.id)
        runs = (bt.runs, bt.min_ms, bt.max_ms) if bt is not None else (None, None, None)
        if bt is not None:
            ms = bt.total_ms
        rows.append(BlockStats(b.id, b.name, debug.state.value, debug.message, ms, kernels, append, debug.fused, *runs))
    return EngineStats(
        level=level,
        frame=frame,
        age=reading.age,
        gpu_ms=graph_ms,
        blocks=tuple(rows),
        kernels=graph.kernel_count if graph is not None else 0,
        pool_in_use_bytes=pool.in_use_bytes,
        pool_total_bytes=pool.total_allocated_bytes,
        diagnostics=diagnostics,
        buffer_bytes=graph.plan.total_buffer_bytes if graph is not None else 0,
        value_bytes=_value_bytes(graph.plan) if graph is not None else 0,
        # The timings already read, not a copy per frame (a copy only when bodies add their sums).
        block_ms={**block_ms, **{k: t.total_ms for k, t in body.items()}} if body else block_ms,
    )


def _value_bytes(plan: GraphPlan) -> int:
    """Bytes of the plan's values, each in a buffer of its own (without buffer reuse)."""
    return plan.memory.logical_bytes if plan.memory is not None else plan.total_buffer_bytes


_readings_shown = 0  # bumped by every ``show_on_blocks``: a build clears GPU numbers only if some were shown


def readings_shown() -> int:
    """How many readings ``show_on_blocks`` has copied onto blocks (of any engine) so far."""
    return _readings_shown


def show_on_blocks(stats: EngineStats, blocks: BlockRegistry) -> None:
    """Copy a reading onto what ``str(block)`` shows: GPU time, and append fill at the Deep levels."""
    global _readings_shown
    _readings_shown += 1
    deep = stats.level.at_least(ProfilingLevel.DEEP_ASYNC)
    for row in stats.blocks:
        b = blocks.get(row.block_id)
        if b is None:
            continue
        b.debug.gpu_ms = row.gpu_ms
        b.debug.runs = (row.runs, row.min_ms, row.max_ms) if row.runs is not None else None
        b.debug.append_fill = {p: (s.count, s.capacity) for p, s in row.append.items()} if deep else {}
