"""GPU time of repeated work on a stream, from CUDA events: shared by the benchmarks."""

from __future__ import annotations

import statistics
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
