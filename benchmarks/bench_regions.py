#!/usr/bin/env python3
"""Regions on the GPU: a While and a For inside the frame's graph beside host loops doing the same
work, in the same run, with the same kernels (``examples/jacobi/*.cu``).

Each region runs at ``Unroll`` 1 and at its default (a For: 8; a While: 1, and 4 and 8 beside it,
which may run up to 3 or 7 iterations past convergence: the iterations printed are the ones run).
The While's rows also name the ``Unroll`` that ``examples/08_jacobi.toml`` sets (read from the file),
so its Jacobi solve is timed as the example runs it, beside Unroll 1 and the host loop.
An unrolled While makes ``Decide`` (read only by its condition) in the last copy of each pass only.

1. Jacobi While, time to converge: one ``update()`` runs the While (``SweepA``, ``SweepB``,
   ``Decide``) until ``Decide`` says stop; the peer is a host loop launching a CuPy-captured graph of
   one iteration and reading ``more`` back (a synchronizing copy) after each. At 1,000 iterations
   (``tol = 0``, ``Max = 1000``) and to convergence (``tol = 1e-6``). Target: ours >= 3x faster.
2. For, steps per second: ``For(Count=K)`` around the two Jacobi sweeps, one launch per frame,
   beside a host loop of K launches of a one-step CuPy graph (no read-back between them).
3. Host time of ``update()`` at For counts 1, 100 and 10,000: the iterations cost the host nothing.

Usage: ``python benchmarks/bench_regions.py [--size 64]``; writes ``regions.json`` to ``$RESULTS_DIR``
when set. Needs a CUDA GPU and CuPy.
"""

from __future__ import annotations

import argparse
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _results import write_results  # noqa: E402
from _timing import update_us  # noqa: E402

from cudapatch import Engine, Fill, For, KernelFile, While  # noqa: E402
from cudapatch.blocks.regions import FOR_UNROLL, WHILE_UNROLL  # noqa: E402

KERNELS = ROOT / "examples" / "jacobi"


def example_unroll() -> int:
    """The ``Unroll`` of the While in ``examples/08_jacobi.toml`` (the While's default if it sets none)."""
    with (ROOT / "examples" / "08_jacobi.toml").open("rb") as f:
        return int(tomllib.load(f)["operators"]["Solve"].get("Unroll", WHILE_UNROLL))


def _jacobi(engine: Engine, nx: int, region, *, tol: float | None) -> tuple:
    """The example's patch in ``region`` (a While: with Decide as its condition; a For: sweeps only)."""
    n = nx * nx
    h2 = (1.0 / (nx - 1)) ** 2
    zero = engine.add(Fill(name="Zero", Count=n, Value=0.0))
    src = engine.add(Fill(name="Source", Count=n, Value=1.0))
    a = engine.add(KernelFile(KERNELS / "jacobi_a.cu", name="SweepA", h2=h2, nx=nx), region=region)
    b = engine.add(KernelFile(KERNELS / "jacobi_b.cu", name="SweepB", h2=h2, nx=nx), region=region)
    for s, sp, t, tp in ((zero, "Out", a, "u"), (zero, "Out", b, "u"), (src, "Out", a, "f"), (src, "Out", b, "f")):
        engine.connect(s, sp, t, tp)
    engine.connect(a, "half", b, "half")
    if tol is not None:
        d = engine.add(KernelFile(KERNELS / "decide.cu", name="Decide", tol=tol), region=region)
        engine.connect(b, "u", d, "u")
        engine.connect(a, "half", d, "half")
        engine.connect(d, "more", region, "Condition")
    return a, b


def _frame_ms(engine: Engine, frames: int) -> float:
    engine.update()
    engine.synchronize()
    t0 = time.perf_counter()
    for _ in range(frames):
        engine.update()
    engine.synchronize()
    return (time.perf_counter() - t0) * 1e3 / frames


class CupyJacobi:
    """The peer: the same kernels through CuPy, one iteration captured as a graph."""

    def __init__(self, nx: int, tol: float) -> None:
        import cupy as cp

        self.cp = cp
        n = nx * nx
        self.n, self.nx = n, nx
        self.h2 = np.float32((1.0 / (nx - 1)) ** 2)
        self.tol = np.float32(tol)
        k = {
            name: cp.RawKernel((KERNELS / f"{name}.cu").read_text(), name)
            for name in ("jacobi_a", "jacobi_b", "decide")
        }
        self.k = k
        self.u = cp.zeros(n, cp.float32)
        self.f = cp.ones(n, cp.float32)
        self.half = cp.zeros(n, cp.float32)
        self.more = cp.zeros(n, cp.int32)
        self.stream = cp.cuda.Stream(non_blocking=True)
        self.host_more = cp.cuda.alloc_pinned_memory(4)
        self.iteration = self._capture(with_decide=True)
        self.step = self._capture(with_decide=False)

    def _launch(self, with_decide: bool) -> None:
        grid, block, n = ((self.n + 255) // 256,), (256,), np.uint32(self.n)
        nx = np.uint32(self.nx)
        self.k["jacobi_a"](grid, block, (self.u, self.f, self.half, self.h2, nx, n))
        self.k["jacobi_b"](grid, block, (self.half, self.f, self.u, self.h2, nx, n))
        if with_decide:
            self.k["decide"](grid, block, (self.u, self.half, self.more, self.tol, n))

    def _capture(self, *, with_decide: bool):
        with self.stream:
            self.stream.begin_capture()
            self._launch(with_decide)
            return self.stream.end_capture()

    def converge(self, max_iter: int) -> int:
        """Host loop: launch one iteration, copy ``more`` back (synchronizing), decide; returns iterations."""
        cp = self.cp
        with self.stream:
            self.u.fill(0)
        host = np.frombuffer(self.host_more, np.int32, 1)
        for k in range(1, max_iter + 1):
            self.iteration.launch(stream=self.stream)
            cp.cuda.runtime.memcpyAsync(host.ctypes.data, self.more.data.ptr, 4, 2, self.stream.ptr)  # D2H
            self.stream.synchronize()
            if host[0] == 0:
                return k
        return max_iter

    def steps(self, count: int) -> None:
        for _ in range(count):
            self.step.launch(stream=self.stream)
        self.stream.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--frames", type=int, default=10)
    args = ap.parse_args()
    nx = args.size
    rows: dict[str, float] = {}

    # 1. While: time to converge, ours beside the host loop, at Unroll 1 (the default: exact), 4, 8 and
    # the example's
    example = example_unroll()
    for label, tol, max_iter in (("1000 iterations", 0.0, 1000), ("to tol 1e-6", 1e-6, 100_000)):
        peer = CupyJacobi(nx, tol)
        peer.converge(max_iter)  # warm up
        t0 = time.perf_counter()
        peer_its = peer.converge(max_iter)
        theirs = (time.perf_counter() - t0) * 1e3
        key = label.replace(" ", "_")
        rows[f"host_loop_{key}_ms"] = theirs
        for unroll in sorted({WHILE_UNROLL, 1, 4, 8, example}):
            with Engine(name="regions-bench", wait_for_compile=True) as engine:
                solve = engine.add(While(name="Solve", Max=max_iter, Unroll=unroll))
                _jacobi(engine, nx, solve, tol=tol)
                engine.wait_ready()
                ours = _frame_ms(engine, args.frames)
                its = engine.iterations(solve)
            rows[f"while_{key}_unroll{unroll}_ms"] = ours
            tags = [t for t, u in (("default", WHILE_UNROLL), ("example 08", example)) if u == unroll]
            tag = f" ({', '.join(tags)})" if tags else ""
            print(
                f"Jacobi While {label:16s} Unroll {unroll}{tag:22s}: ours {ours:8.2f} ms ({its} its)   "
                f"host loop {theirs:8.2f} ms ({peer_its} its)   {theirs / ours:5.1f}x  (target >= 3x)"
            )

    # 2. For: steps per second, ours beside a host loop of graph launches, at Unroll 1 and the default
    count = 1000
    peer = CupyJacobi(nx, 0.0)
    peer.steps(count)
    t0 = time.perf_counter()
    peer.steps(count)
    theirs = (time.perf_counter() - t0) * 1e3
    rows["host_loop_steps_per_s"] = count / theirs * 1e3
    host: dict[tuple[int, int], float] = {}
    for unroll in sorted({1, FOR_UNROLL}):
        with Engine(name="regions-bench", wait_for_compile=True) as engine:
            loop = engine.add(For(name="Steps", Count=count, Unroll=unroll))
            _jacobi(engine, nx, loop, tol=None)
            engine.wait_ready()
            ours = _frame_ms(engine, args.frames)
            # 3. host time per frame, whatever the count (the For's count is Hot: no rebuild between)
            for c in (1, 100, 10_000):
                loop.set("Count", c)
                engine.update()
                host[(unroll, c)] = update_us(engine, 200 if c == 10_000 else 2000)
        rows[f"for_unroll{unroll}_steps_per_s"] = count / ours * 1e3
        tag = " (default)" if unroll == FOR_UNROLL else ""
        print(
            f"For {count} steps Unroll {unroll}{tag:10s}: ours {count / ours * 1e3:10.0f} steps/s   host loop of "
            f"launches {count / theirs * 1e3:10.0f} steps/s   {theirs / ours:5.1f}x"
        )
    for (unroll, c), us in host.items():
        rows[f"update_us_unroll{unroll}_count_{c}"] = us
        print(f"update() host time, For Unroll={unroll} Count={c:<6d}: {us:7.2f} µs")
    rows["example_08_unroll"] = example
    write_results("regions.json", rows)


if __name__ == "__main__":
    main()
