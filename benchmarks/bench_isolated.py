#!/usr/bin/env python3
"""Isolated engine overhead: host microseconds of ``update()`` (clean, and with one Hot value) of an
isolated engine beside a normal engine on the same 20-block chain and a bare ``cuGraphLaunch`` of
that graph, medians in the same run; then the time from a planted GPU fault to the engine running
again (the host notices the child's report, starts a new child, which builds without the block).

Usage: ``python benchmarks/bench_isolated.py [--no-fault]``; writes ``isolated.json`` to
``$RESULTS_DIR`` when set. Run the fault part on a machine whose later GL previews do not matter
(docs/faults.md, "After a fault, on that machine").
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import host_us  # noqa: E402

from cudapatch import Engine, Fill, Scale  # noqa: E402
from cudapatch.kernels._driver import check, driver  # noqa: E402

BLOCKS = 20


def chain(e):
    prev = e.add(Fill(name="f", Count=4096, Value=1.0))
    first = None
    for i in range(BLOCKS - 1):
        s = e.add(Scale(name=f"s{i}", Factor=1.0001))
        e.connect(prev, "Out", s, "In")
        prev, first = s, first or s
    e.wait_ready()
    for _ in range(3):
        e.update()
    e.synchronize()
    return first


def hot(e, block):
    values = iter(range(10**9))

    def step():
        block.set("Factor", 1.0 + next(values) % 7 * 1e-4)
        e.update()

    return step


def fault_restart_s() -> float:
    from cudapatch.blocks.library import CustomKernel

    bad_code = """
extern "C" __global__ void k(const float* in, float* out, float trigger, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
    if (trigger > 0.5f && i == 0) *((volatile float*)(size_t)8) = 1.0f;
}"""
    with Engine(isolated=True, wait_for_compile=True) as e:
        f = e.add(Fill(name="f", Count=4096, Value=1.0))
        bad = e.add(CustomKernel(name="bad", Code=bad_code))
        e.connect(f, "Out", bad, "in")
        e.wait_ready()
        e.update()
        bad.set("trigger", 1.0)
        t0 = time.perf_counter()
        while e.restarts == 0:
            e.update()
            time.sleep(0.0005)
        noticed = time.perf_counter()
        while True:  # the new child's graph has published its outputs
            e.update()
            try:
                e.output(f, "Out")
                break
            except Exception:
                time.sleep(0.0005)
        e.synchronize()
        back = time.perf_counter()
        print(f"fault to noticed (child's replay and report): {noticed - t0:.3f} s")
        return back - noticed


def main() -> None:
    results: dict[str, float] = {}
    with Engine(wait_for_compile=True) as normal:
        s = chain(normal)
        g = normal.graph
        assert g is not None
        d, exe, stream = driver(), g.handle, normal.device.stream
        results["cuGraphLaunch"] = host_us(
            lambda: check(d.cuGraphLaunch(exe, stream)), 3000, normal.synchronize, every=100
        )
        results["normal update"] = host_us(normal.update, 3000, normal.synchronize, every=100)
        results["normal hot update"] = host_us(hot(normal, s), 3000, normal.synchronize, every=100)
    with Engine(isolated=True, wait_for_compile=True) as iso:
        s = chain(iso)
        results["isolated update"] = host_us(iso.update, 3000, iso.synchronize, every=100)
        results["isolated hot update"] = host_us(hot(iso, s), 3000, iso.synchronize, every=100)
    base = results["normal update"]
    print(f"{'what':<22} {'host us':>9} {'vs normal update':>17}")
    for k, v in results.items():
        print(f"{k:<22} {v:9.2f} {v / base:16.2f}x")
    if "--no-fault" not in sys.argv:
        results["restart after fault s"] = fault_restart_s()
        print(f"restart after fault (noticed -> running again): {results['restart after fault s']:.3f} s")
    write_results("isolated.json", results, indent=2)


if __name__ == "__main__":
    main()
