"""What a frame says about its regions: the iterations each ``While``/``For`` ran, and a warning for
a ``While`` that ran ``Max`` of them (its condition may still hold: the guard stopped it).

Each loop's iteration counter is one of the graph's append counters (``RegionPlan.counter``), so
it comes back through the readback ring with the frame it belongs to: reading it costs no driver
call and never waits for the GPU.

So do the records of the body timers (``PerBlock`` and up, ``compiler/body_timers.py``): per block
inside a body, the sum, extremes and count of its runs in the frame (``body_times``).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from .diagnostics import Diagnostic, DiagnosticCode
from .region_kernels import TIMER_RECORD_WORDS
from .registry import BlockRegistry

__all__ = ["BodyTime", "body_times", "decode_timer", "region_iterations", "region_warnings", "show_iterations"]


class BodyTime(NamedTuple):
    """What a body timer measured for one block in one frame: the sum of its runs' durations, how many
    runs, and the shortest and longest (None when it did not run). Milliseconds."""

    total_ms: float
    runs: int
    min_ms: float | None
    max_ms: float | None


def decode_timer(words: np.ndarray) -> BodyTime:
    """A body timer's record from its ``TIMER_RECORD_WORDS`` counter words (``region_kernels.TIMER_SOURCE``:
    sum, maximum and complemented minimum as uint64 nanoseconds, then the count as uint32)."""
    w = np.ascontiguousarray(words[:TIMER_RECORD_WORDS], dtype=np.uint32)
    total, longest, not_shortest, _ = (int(x) for x in w.view(np.uint64))
    runs = int(w[6])
    if not runs:
        return BodyTime(0.0, 0, None, None)
    shortest = ~not_shortest & (2**64 - 1)
    return BodyTime(total / 1e6, runs, shortest / 1e6, longest / 1e6)


def body_times(graph: Any) -> dict[int, BodyTime]:
    """Block (or nested region) id -> its ``BodyTime`` in the newest completed frame of ``graph``, for
    every block inside a body of a graph timed at ``PerBlock`` and up (empty otherwise, or before a
    frame completed). Plain loads from the readback ring: no driver call, never a wait."""
    rb = graph.readback if graph is not None else None
    if rb is None or not any(rp.timers for rp in graph.plan.regions.values()):
        return {}
    if not rb.frozen:
        rb.poll()
    if rb.latest_frame is None:
        return {}
    words = rb.latest
    return {unit: decode_timer(words[ci:]) for rp in graph.plan.regions.values() for unit, ci in rp.timers}


def region_iterations(graph: Any, region_id: int) -> int | None:
    """Iterations region ``region_id`` ran in the newest completed frame of ``graph`` (None: not a
    loop of this graph, or no frame completed yet)."""
    if graph is None or graph.readback is None:
        return None
    rp = graph.plan.regions.get(region_id)
    if rp is None or rp.counter is None:
        return None
    return graph.readback.value(rp.counter)  # type: ignore[no-any-return]


def region_warnings(graph: Any, blocks: BlockRegistry) -> tuple[Diagnostic, ...]:
    """A ``region-max`` warning for each While that ran its ``Max`` iterations in the frame read."""
    if graph is None or graph.readback is None:
        return ()
    out = []
    for rid, rp in graph.plan.regions.items():
        b = blocks.get(rid)
        if b is None or rp.kind != "while":
            continue
        n = graph.readback.value(rp.counter)
        limit = int(b.get("Max"))
        if n is not None and limit and n >= limit:
            out.append(
                Diagnostic(
                    "warning",
                    rid,
                    DiagnosticCode.REGION_MAX,
                    f"While '{b.name}' stopped at Max ({limit} iterations) before its condition turned false",
                )
            )
    return tuple(out)


def show_iterations(graph: Any, blocks: BlockRegistry) -> None:
    """Put each loop's iterations of the frame read into its tooltip, as ``Iterations: n/limit``
    (``Count`` for a For, ``Max`` for a While), at every profiling level."""
    if graph is None or graph.readback is None:
        return
    for rid, rp in graph.plan.regions.items():
        b = blocks.get(rid)
        if b is None or rp.counter is None or rp.limit is None:
            continue
        n = graph.readback.value(rp.counter)
        if n is not None:
            b.debug.append_fill = {**b.debug.append_fill, "Iterations": (n, int(b.get(rp.limit)))}
