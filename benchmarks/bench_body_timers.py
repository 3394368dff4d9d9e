#!/usr/bin/env python3
"""Body timers benchmark (``engine/compiler/body_timers.py``): what timing the blocks inside a loop's body
costs the frame, how the time per iteration they report compares with the same kernel launched eagerly
between CUDA events, and the resolution of the GPU timer they read (``%globaltimer``).

A ``For`` of ``--count`` iterations whose body is a chain of ``--blocks`` Scale blocks:

- GPU ms per frame (CUDA events around 100 launches) at ``None``, ``Summary`` (the region stamped as one
  block, no timers in the body) and ``PerBlock`` (a tick and a tock per block and iteration): the
  timers' cost per iteration and block, beside the frame without them, same run;
- one block's reported time per iteration beside its kernel launched eagerly 40 times between two
  events queued behind a frame (as ``bench_profiling.py`` times one kernel);
- the timer's update period: one thread reads it in a loop and records each step.

Usage: ``python benchmarks/bench_body_timers.py [--count 100] [--blocks 4] [--elements 65536]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _timing import eager_kernel_ms, gpu_ms  # noqa: E402

from cudapatch import CustomKernel, Engine, Fill, For, Scale  # noqa: E402

LEVELS = ["None", "Summary", "PerBlock"]
ROUNDS = 5
TICKS = """extern "C" __global__ void ticks(unsigned int* out, unsigned int n)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long last, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(last));
    for (unsigned int i = 0; i < n;) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t != last) { out[i++] = (unsigned int)(t - last); last = t; }
    }
}"""


def _settle(eng: Engine, frames: int = 10) -> None:
    for _ in range(frames):
        eng.update()
    eng.synchronize()
    eng.update()
    eng.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--blocks", type=int, default=4)
    ap.add_argument("--elements", type=int, default=1 << 16)
    ap.add_argument("--unroll", type=int, default=8)
    args = ap.parse_args()
    eng = Engine(wait_for_compile=True, fuse=False)
    src = eng.add(Fill(name="Src", Count=args.elements, Value=1.0))
    loop = eng.add(For(name="Loop", Count=args.count, Unroll=args.unroll))
    chain = [eng.add(Scale(name=f"s{i}", Factor=1.0001), region=loop) for i in range(args.blocks)]
    eng.connect(src, "Out", chain[0], "In")
    for a, b in zip(chain, chain[1:], strict=False):
        eng.connect(a, "Out", b, "In")

    # Rounds alternate the levels (the host's and GPU's speed drift within a run); each level's figure is
    # its median round.
    gpu: dict[str, list[float]] = {level: [] for level in LEVELS}
    for _ in range(ROUNDS):
        for level in LEVELS:
            eng.set_profiling(level)
            eng.update()  # the rebuild (untimed)
            gpu[level].append(gpu_ms(eng.update, eng.device.stream, 100, repeats=1))
    frame = {level: statistics.median(v) for level, v in gpu.items()}

    # One block's reported time per iteration beside its kernel launched eagerly.
    eng.set_profiling("PerBlock")
    _settle(eng)
    rows = {b.name: b for b in eng.stats().blocks}
    mid = chain[len(chain) // 2]
    row = rows[mid.name]
    eager_ms = eager_kernel_ms(eng, mid.id)  # 40 launches between two events, behind a frame: back to back

    # The timer's resolution.
    eng.set_profiling("None")
    ticks = eng.add(CustomKernel(name="Ticks", Code=TICKS, Count=1024))
    eng.update()
    steps = eng.read(ticks, "out")[1:].astype(np.int64)  # the first step starts mid-period

    runs = args.count * args.blocks
    print(
        f"\ndevice: {eng.device.name}; For {args.count} (Unroll {args.unroll}) x {args.blocks} Scale blocks "
        f"of {args.elements} elements"
    )
    print(f"{'level':10} {'GPU ms/frame':>13} {'vs Summary':>11}")
    for level in LEVELS:
        print(f"{level:10} {frame[level]:13.3f} {frame[level] / frame['Summary']:11.3f}")
    cost_us = (frame["PerBlock"] - frame["Summary"]) * 1e3 / runs
    print(f"body timers: +{cost_us:.2f} µs per block and iteration ({runs} timed runs a frame)")
    print(
        f"block {mid.name}: {row.mean_ms * 1e3:.2f} µs per iteration (min {row.min_ms * 1e3:.2f}, max "
        f"{row.max_ms * 1e3:.2f}, {row.runs} runs) vs its kernel eagerly between events {eager_ms * 1e3:.2f} µs "
        f"(ratio {row.mean_ms / eager_ms:.2f})"
    )
    print(
        f"%globaltimer: moves every {np.median(steps):.0f} ns (min {steps.min()}, max {steps.max()} ns, "
        f"{steps.size} steps): the resolution of each body timer reading"
    )
    eng.close()


if __name__ == "__main__":
    main()
