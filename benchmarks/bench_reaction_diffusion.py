#!/usr/bin/env python3
"""Reaction–diffusion (Gray–Scott, ``examples/10_reaction_diffusion.py``'s kernel) on the GPU: steps
per second with the steps inside the frame's graph beside the same kernel stepped by the host, in the
same run.

1. Steps per second, 1024 x 1024 ``float2``:
   - ours, For: one ``update()`` a frame runs ``For(Count=K)`` around the step, the FrameDelay inside
     the body; at the For's default ``Unroll`` (8) the copies of the body alternate the delay's two
     buffers (ping-pong: one copy of the field a frame, ``docs/regions.md``), at ``Unroll`` 1 a copy
     kernel carries the field after every step (listed beside it: what ping-pong saves);
   - ours, host loop: the same kernel through a FrameDelay at the top level (two alternating graphs,
     no copy), one step per ``update()``, K updates per K steps: a host loop of graph launches;
   - CuPy, host loop (when CuPy is installed): the same kernel as a ``RawKernel``, one step captured as
     a CUDA graph per direction (ping-pong, no copy), launched K times.
   The For saves K - 1 launches per frame; at Unroll 1 it pays a copy per step (twice the memory
   traffic of a step), unrolled one copy a frame.
2. Host time of ``update()`` with the For at Count 1, 10 and 100: the iterations cost the host
   nothing, so it must not grow with the count.

Usage: ``python benchmarks/bench_reaction_diffusion.py [--size 1024] [--steps 100]``; writes
``reaction_diffusion.json`` to ``$RESULTS_DIR`` when set. Needs a CUDA GPU (CuPy optional).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _results import write_results  # noqa: E402
from _timing import update_us  # noqa: E402

from cudapatch import CustomKernel, Engine, For, FrameDelay  # noqa: E402


def _example():
    spec = importlib.util.spec_from_file_location("rd_example", ROOT / "examples" / "10_reaction_diffusion.py")
    mod = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(mod)  # type: ignore[union-attr]
    return mod


EX = _example()


def _patch(engine: Engine, size: int, count: int | None, unroll: int | None = None):
    """The example's patch: with ``count``, the delay and step inside ``For(Count=count)`` (``unroll``:
    its ``Unroll``, None for the default); without, at the top level (one step a frame)."""
    seed = EX.seed_field(size, size)
    extra = {} if unroll is None else {"Unroll": unroll}
    loop = engine.add(For(name="Steps", Count=count, **extra)) if count is not None else None
    field = engine.add(FrameDelay(name="field", Type="float2"), region=loop)
    step = engine.add(CustomKernel(name="step", Code=EX.GRAY_SCOTT, width=size, height=size, **EX.PARAMS), region=loop)
    engine.bind(field, "Init", seed)
    engine.connect(field, "Out", step, "s")
    engine.connect(step, "next", field, "In")
    engine.wait_ready()
    engine.update()
    engine.synchronize()
    return loop


def _updates(engine: Engine, count: int):
    """A run for ``_steps_per_s``: ``count`` ``update()`` calls, then the stream drained."""

    def run() -> None:
        for _ in range(count):
            engine.update()
        engine.synchronize()

    return run


def _steps_per_s(run, steps: int, repeats: int = 5) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t0)
    return steps / best


class CupyPeer:
    """The same kernel through CuPy: one step captured as a graph per direction (a -> b, b -> a)."""

    def __init__(self, size: int) -> None:
        import cupy as cp

        self.cp = cp
        n = size * size
        k = cp.RawKernel(EX.GRAY_SCOTT, "gray_scott")
        self.a = cp.asarray(EX.seed_field(size, size))
        self.b = cp.empty_like(self.a)
        self.stream = cp.cuda.Stream(non_blocking=True)
        p = {key: np.float32(v) for key, v in EX.PARAMS.items()}
        args = (np.int32(size), np.int32(size), p["Du"], p["Dv"], p["F"], p["k"], p["dt"], np.uint32(n))
        grid, block = ((n + 255) // 256,), (256,)
        self.graphs = []
        for src, dst in ((self.a, self.b), (self.b, self.a)):
            with self.stream:
                self.stream.begin_capture()
                k(grid, block, (src, dst, *args))
                self.graphs.append(self.stream.end_capture())

    def run(self, steps: int) -> None:
        for i in range(steps):
            self.graphs[i & 1].launch(stream=self.stream)
        self.stream.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=100, help="steps per frame of the For (K)")
    ap.add_argument("--frames", type=int, default=10)
    args = ap.parse_args()
    k, frames = args.steps, args.frames
    rows: dict[str, object] = {"size": args.size, "steps_per_frame": k}

    with Engine(name="rd-for", wait_for_compile=True) as engine:
        _patch(engine, args.size, k)
        print(f"device: {engine.device.name}; {args.size}x{args.size} float2, {k} steps a frame")
        rows["ours_for_steps_per_s"] = _steps_per_s(_updates(engine, frames), k * frames)
    with Engine(name="rd-for-copy", wait_for_compile=True) as engine:
        _patch(engine, args.size, k, unroll=1)
        rows["ours_for_unroll1_copy_steps_per_s"] = _steps_per_s(_updates(engine, frames), k * frames)
    with Engine(name="rd-host", wait_for_compile=True) as engine:
        _patch(engine, args.size, None)
        rows["ours_host_loop_steps_per_s"] = _steps_per_s(_updates(engine, k * frames), k * frames)
    try:
        peer = CupyPeer(args.size)
        rows["cupy_host_loop_steps_per_s"] = _steps_per_s(lambda: peer.run(k * frames), k * frames)
    except ImportError:
        print("CuPy not installed: no CuPy peer")
    base = rows["ours_for_steps_per_s"]
    keys = (
        "ours_for_steps_per_s",
        "ours_for_unroll1_copy_steps_per_s",
        "ours_host_loop_steps_per_s",
        "cupy_host_loop_steps_per_s",
    )
    for key in keys:
        if key in rows:
            print(f"  {key:32s} {rows[key]:12.0f} steps/s   For / this = {base / rows[key]:.2f}x")  # type: ignore[operator]

    print("update() host time with the For (median, queue kept short):")
    with Engine(name="rd-update", wait_for_compile=True) as engine:
        loop = _patch(engine, 256, 1)  # a small grid: the GPU keeps up, the host is measured
        for count in (1, 10, 100):
            loop.set("Count", count)  # Hot
            engine.update()
            engine.synchronize()
            us = update_us(engine, 1000, 10)
            rows[f"update_us_count_{count}"] = us
            print(f"  Count {count:4d}: {us:7.2f} us")
    write_results("reaction_diffusion.json", rows)


if __name__ == "__main__":
    main()
