"""Timers shared by the benchmarks: GPU time from CUDA events, host time of update()."""

from __future__ import annotations

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


def update_us(engine: Any, frames: int = 1000, sync_every: int = 20) -> float:
    """Median host µs of ``engine.update()``, the stream drained every ``sync_every`` frames (this
    measures the host, not a full launch queue)."""
    times = []
    for i in range(frames):
        if i % sync_every == 0:
            engine.synchronize()
        t = time.perf_counter_ns()
        engine.update()
        times.append(time.perf_counter_ns() - t)
    engine.synchronize()
    return statistics.median(times) / 1e3
