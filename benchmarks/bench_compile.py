#!/usr/bin/env python3
"""Graph compiler benchmark: ``compile_plan`` on chains of Scale blocks, on the CPU (no GPU needed).

A Cold edit pays ``Context.snapshot()`` + ``compile_plan`` + realize; this times the middle part,
the pure compiler, for a 100-block and a 1,000-block chain at profiling levels None and PerKernel
(the level that places the most stamps). The snapshot is taken once, outside the timing. Also
printed beside it, as the peer measured in the same run: ``Context.snapshot()`` of the same patch,
the other host-side cost of every Cold rebuild.

Prints median and best times (ms) and the cost per block. Usage:
``python benchmarks/bench_compile.py [--sizes 100 1000] [--seconds 2]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cudapatch import DType, Scale, compile_plan  # noqa: E402
from cudapatch.engine import Context, ExternalBinding  # noqa: E402
from cudapatch.engine.profiling import ProfilingLevel  # noqa: E402


def scale_chain(blocks: int, elements: int = 1024) -> Context:
    """``blocks`` Scale blocks in a chain, the first reading an external buffer."""
    ctx = Context()
    prev = None
    for i in range(blocks):
        s = ctx.register_block(Scale(name=f"s{i}", Factor=1.0 + i * 1e-3))
        if prev is None:
            ctx.bind_input(s, "In", ExternalBinding(0x7000_0000, elements, DType.FLOAT32))
        else:
            ctx.connect(prev, "Out", s, "In")
        prev = s
    return ctx


def time_ms(fn, seconds: float, min_calls: int = 5) -> tuple[float, float, int]:
    """Median and best wall time of ``fn`` in ms over about ``seconds`` of calls (at least ``min_calls``)."""
    fn()  # warm caches (descriptor properties, the first allocation of every list)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    gc_was = gc.isenabled()
    gc.disable()  # a collection landing in one call is noise, not the compiler's cost
    try:
        while len(times) < min_calls or time.perf_counter() < deadline:
            t = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t) / 1e6)
            if len(times) % 20 == 0:
                gc.collect()
    finally:
        if gc_was:
            gc.enable()
    return statistics.median(times), min(times), len(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000])
    ap.add_argument("--seconds", type=float, default=2.0, help="timing budget per measurement")
    args = ap.parse_args()
    print(f"{'blocks':>7} {'level':>10} {'median ms':>10} {'best ms':>9} {'µs/block':>9} {'calls':>6}")
    for n in args.sizes:
        ctx = scale_chain(n)
        snap = ctx.snapshot()
        for level in (ProfilingLevel.NONE, ProfilingLevel.PER_KERNEL):
            med, best, calls = time_ms(lambda snap=snap, level=level: compile_plan(snap, level=level), args.seconds)
            print(f"{n:>7} {str(level):>10} {med:>10.3f} {best:>9.3f} {med * 1e3 / n:>9.2f} {calls:>6}")
        med, best, calls = time_ms(ctx.snapshot, args.seconds)
        print(f"{n:>7} {'snapshot':>10} {med:>10.3f} {best:>9.3f} {med * 1e3 / n:>9.2f} {calls:>6}")


if __name__ == "__main__":
    main()
