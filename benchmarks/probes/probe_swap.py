#!/usr/bin/env python3
"""Diagnostic: where the host time of a frame that swaps a recompiled kernel goes (cProfile of 20
swap frames in a 100-block patch, and the same frames timed without the profiler)."""

from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cudapatch import CustomKernel, Engine, Scale  # noqa: E402

CODE = """extern "C" __global__ void k(const float* in, float* out, float gain, unsigned int n)
{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) out[i] = in[i] * gain + VALUE; }"""


def main() -> None:
    eng = Engine()
    ck = eng.add(CustomKernel(name="ck", Code=CODE.replace("VALUE", "0.0f")))
    eng.bind(ck, "in", np.ones(1 << 16, np.float32))
    prev = ck
    for i in range(99):
        s = eng.add(Scale(name=f"s{i}"))
        eng.connect(prev, "out" if prev is ck else "Out", s, "In")
        prev = s
    eng.wait_ready()
    eng.update()
    eng.synchronize()

    def swap_frame(i: int, prof: cProfile.Profile | None) -> tuple[float, float, float]:
        t = time.perf_counter()
        ck.set("Code", CODE.replace("VALUE", f"{i}.0f"))
        t_set = time.perf_counter() - t
        t = time.perf_counter()
        eng.update()  # the edit's frame: hands the source to the compiler
        t_edit = time.perf_counter() - t
        swaps = eng.counters.code_swaps
        while eng.counters.code_swaps == swaps:
            time.sleep(0.002)
            if prof:
                prof.enable()
            t = time.perf_counter()
            eng.update()
            dt = time.perf_counter() - t
            if prof:
                prof.disable()
        eng.synchronize()
        return t_set, t_edit, dt

    import gc

    collections = []  # (generation, seconds) of the cyclic GC passes inside timed frames
    in_frame = [False]
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:
        if not in_frame[0]:
            return
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            collections.append((info["generation"], time.perf_counter() - started[0]))

    gc.callbacks.append(on_gc)
    real_update = eng.update

    def update() -> None:
        in_frame[0] = True
        try:
            real_update()
        finally:
            in_frame[0] = False

    eng.update = update  # type: ignore[method-assign]
    plain = [swap_frame(i, None) for i in range(1, 21)]
    print(
        f"GC passes inside the 20 edits' frames: {len(collections)}, "
        f"{sum(t for _, t in collections) * 1e6:.0f} µs in all, generations {sorted({g for g, _ in collections})}",
        flush=True,
    )
    idle = []
    for i in range(100, 110):  # the compiler thread long idle before the swap frame
        ck.set("Code", CODE.replace("VALUE", f"{i}.0f"))
        eng.update()
        swaps = eng.counters.code_swaps
        while not all(s.future is None or s.future.done() for s in eng.kernels._slots.values()):
            time.sleep(0.001)
        time.sleep(0.05)
        t = time.perf_counter()
        eng.update()
        idle.append(time.perf_counter() - t)
        assert eng.counters.code_swaps == swaps + 1
        eng.synchronize()
    print(f"swap frame, compiler idle 50 ms before: median {statistics.median(idle) * 1e6:.1f} µs", flush=True)
    for name, k in (("set()", 0), ("edit frame", 1), ("swap frame", 2)):
        print(f"{name}: median {statistics.median(p[k] for p in plain) * 1e6:.1f} µs", flush=True)
    # The driver's part: swap two loaded functions back and forth in the running graph, timing the
    # swap call and the launch after it apart, beside a launch with no swap before it.
    from dataclasses import replace

    eng.wait_ready()
    g = eng.graph
    key = (ck.id, 0)
    node = g._by_kernel[key][0]
    fn_now = node.params.func
    source = replace(ck.description.kernels[0].source, code=CODE.replace("VALUE", "7.0f"))
    fn_other = eng.kernels.builder.build(source).function  # compiled and loaded like an edit's kernel
    desc = node.plan.descriptor
    swap_t, launch_after, launch_plain = [], [], []
    s = eng.device.stream
    for k in range(200):
        eng.synchronize()
        t = time.perf_counter()
        g.swap_function(key, fn_other if k % 2 else fn_now, desc)
        swap_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        g.launch(s)
        launch_after.append(time.perf_counter() - t)
        eng.synchronize()
        t = time.perf_counter()
        g.launch(s)
        launch_plain.append(time.perf_counter() - t)
    med = lambda xs: statistics.median(xs) * 1e6  # noqa: E731
    print(
        f"driver, two functions taking turns: swap_function {med(swap_t):.1f} µs, the launch after it "
        f"{med(launch_after):.1f} µs, a launch with no swap {med(launch_plain):.1f} µs",
        flush=True,
    )
    # Each swap to a function this graph has never run (compiled and loaded beforehand, as the
    # compiler thread does): what a real edit's swap costs the driver.
    fresh = [
        eng.kernels.builder.build(replace(source, code=CODE.replace("VALUE", f"{500 + i}.0f"))).function
        for i in range(20)
    ]
    swap_t, launch_after = [], []
    for fn in fresh:
        eng.synchronize()
        time.sleep(0.001)
        t = time.perf_counter()
        g.swap_function(key, fn, desc)
        swap_t.append(time.perf_counter() - t)
        t = time.perf_counter()
        g.launch(s)
        launch_after.append(time.perf_counter() - t)
    eng.synchronize()
    print(
        f"driver, a new function each time: swap_function {med(swap_t):.1f} µs, the launch after it "
        f"{med(launch_after):.1f} µs",
        flush=True,
    )
    prof = cProfile.Profile()
    for i in range(21, 41):  # the edit frames: the update right after the edit
        ck.set("Code", CODE.replace("VALUE", f"{i}.0f"))
        prof.enable()
        eng.update()
        prof.disable()
        eng.wait_ready()
        eng.update()
        eng.synchronize()
    print("edit frames:")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
    eng.close()


if __name__ == "__main__":
    main()
