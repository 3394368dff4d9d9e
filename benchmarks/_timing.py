"""Timers shared by the benchmarks: GPU time from CUDA events, host time of a call, of update() and of
a bare launch of the engine's graph (the peer of a quiet update()), and one block's kernel launched
eagerly (the peer of the time the graph reports for it)."""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable
from typing import Any

from cuda.bindings import driver as d

from cudapatch.kernels._driver import check


def gpu_ms_samples(run: Callable[[], Any], stream: Any, frames: int = 200, repeats: int = 5) -> list[float]:
    """GPU time per call of ``run`` (ms), one value per repeat: events around ``frames`` calls, the
    stream drained before each repeat."""
    start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    out = []
    try:
        for _ in range(repeats):
            check(d.cuStreamSynchronize(stream))
            check(d.cuEventRecord(start, stream))
            for _ in range(frames):
                run()
            check(d.cuEventRecord(end, stream))
            check(d.cuEventSynchronize(end))
            out.append(check(d.cuEventElapsedTime(start, end)) / frames)
    finally:
        check(d.cuEventDestroy(start))
        check(d.cuEventDestroy(end))
    return out


def gpu_ms(run: Callable[[], Any], stream: Any, frames: int = 200, repeats: int = 5) -> float:
    """The median of ``gpu_ms_samples``."""
    return statistics.median(gpu_ms_samples(run, stream, frames, repeats))


def host_us(run: Callable[[], Any], calls: int, sync: Callable[[], Any] | None = None, every: int = 50) -> float:
    """Median host µs of ``run()``; ``sync()`` (untimed) every ``every`` calls and after the last, so a
    full launch queue never blocks a timed call."""
    times = []
    for i in range(calls):
        if sync is not None and i % every == 0:
            sync()
        t = time.perf_counter_ns()
        run()
        times.append(time.perf_counter_ns() - t)
    if sync is not None:
        sync()
    return statistics.median(times) / 1e3


def update_us(engine: Any, frames: int = 1000, sync_every: int = 20) -> float:
    """Median host µs of ``engine.update()``, the stream drained every ``sync_every`` frames (this
    measures the host, not a full launch queue)."""
    return host_us(engine.update, frames, engine.synchronize, sync_every)


def bare_launch_us(engine: Any, frames: int = 500, sync_every: int = 50) -> float:
    """Median host µs of launching the engine's executable graph by itself (``Graph.launch``, no
    ``update()`` around it): the peer of a quiet ``update()``."""
    graph = engine.graph
    assert graph is not None
    return host_us(functools.partial(graph.launch, engine.resources.stream), frames, engine.synchronize, sync_every)


def eager_kernel_ms(
    engine: Any, block_id: int, *, launches: int = 40, rounds: int = 20, behind_a_frame: bool = True
) -> float:
    """Median GPU ms of one launch of block ``block_id``'s first kernel node, launched with
    ``cuLaunchKernel`` as the graph launches it (its function, grid and parameters): ``launches``
    launches between two events per round. ``behind_a_frame``: each round is queued behind a frame of
    the graph, so the GPU runs them back to back even where issuing a launch takes longer than the
    kernel runs (without it, that peer is bound by the host's launch rate)."""
    node = next(
        n
        for n in engine.graph._nodes
        if n is not None and getattr(n, "plan", None) is not None and n.plan.block_id == block_id
    )
    kp, stream = node.params, engine.device.stream
    start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    out = []
    try:
        for _ in range(rounds):
            if behind_a_frame:
                engine.update()
            check(d.cuEventRecord(start, stream))
            for _ in range(launches):
                args = (kp.kernelParams, kp.extra)  # a pointer per argument, or one buffer (engine/params.py)
                check(d.cuLaunchKernel(kp.func, kp.gridDimX, 1, 1, kp.blockDimX, 1, 1, 0, stream, *args))
            check(d.cuEventRecord(end, stream))
            check(d.cuEventSynchronize(end))
            out.append(check(d.cuEventElapsedTime(start, end)) / launches)
    finally:
        check(d.cuEventDestroy(start))
        check(d.cuEventDestroy(end))
    return statistics.median(out)
