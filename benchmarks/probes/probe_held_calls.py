#!/usr/bin/env python3
"""Diagnostic: what a Hot frame waits for when another thread runs Python, with the frame's driver
calls held (``kernels.held_calls``) and made through cuda-bindings, which lets go of the GIL in each.

A chain of 20 unfused ``Scale`` blocks; each frame moves all 20 factors and calls ``update()``
(20 ``cuGraphExecKernelNodeSetParams`` and a launch), paced at 2 ms, beside a thread that runs Python
without pause (a build, the kernel builder) at the build's 0.1 ms switch interval and at the default
5 ms, and with no such thread. "bindings" puts the bindings' own function back on the running
graph (what the engine did before); "held" is the engine as it is. Peers of the same run: the bare
driver calls (20 SetParams through the bindings and a launch) with the same thread beside them.

H100 (2026-11-28), the bare calls alone: beside the thread at 0.1 ms a median of 0.84 ms (max 1.8)
through the bindings, 0.034 ms (max 0.13) held (docs/findings.md).

Usage: python benchmarks/probes/probe_held_calls.py [--frames 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _timing import kernel_nodes  # noqa: E402
from bench_liveness import scale_chain  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.kernels._driver import driver  # noqa: E402

BLOCKS = 20


def _busy(stop: threading.Event) -> None:
    while not stop.is_set():
        sum(range(300))


def _frames(frame, count: int) -> str:  # noqa: ANN001
    times = []
    for i in range(count):
        t = time.perf_counter_ns()
        frame(i)
        times.append((time.perf_counter_ns() - t) / 1e3)
        time.sleep(0.002)
    times.sort()
    return f"median {statistics.median(times):8.1f}  p90 {times[int(0.9 * len(times))]:8.1f}  max {times[-1]:8.1f} µs"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=300)
    args = ap.parse_args()
    d = driver()
    with Engine(name="held-calls", fuse=False) as e:
        blocks = scale_chain(e, BLOCKS, np.ones(1024, np.float32))
        e.wait_ready()
        e.update()
        e._worker.wait(10.0)
        e.synchronize()
        g = e.graph
        held, raw = g._set_params, g._raw  # (``raw``: the held calls on plain values a one-change patch makes)
        nodes, exec_, stream = kernel_nodes(e), g.handle, e.resources.stream

        def hot_frame(i: int) -> None:
            for k, b in enumerate(blocks):
                b.set("Factor", 1.0 + 1e-3 * ((i + k) % 7))
            e.update()

        def bare_frame(i: int) -> None:
            for n in nodes:
                d.cuGraphExecKernelNodeSetParams(exec_, n.handle, n.params)
            d.cuGraphLaunch(exec_, stream)

        saved = sys.getswitchinterval()
        print(f"{BLOCKS} Hot values and a launch per frame, frames paced at 2 ms")
        for interval in (1e-4, 5e-3, None):
            stop = threading.Event()
            thread = None
            if interval is not None:
                sys.setswitchinterval(interval)
                thread = threading.Thread(target=_busy, args=(stop,), daemon=True)
                thread.start()
            count = args.frames if interval != 5e-3 else max(20, args.frames // 10)  # (frames of ~0.1 s)
            beside = "no other thread" if interval is None else f"a Python thread, interval {interval * 1e3:.1f} ms"
            try:
                for name, fn, on_values in (("held", held, raw), ("bindings", d.cuGraphExecKernelNodeSetParams, None)):
                    g._set_params, g._raw = fn, on_values
                    print(f"  update(), {name:8} {beside:32} {_frames(hot_frame, count)}")
                    e.synchronize()
                print(f"  bare bindings calls    {beside:32} {_frames(bare_frame, count)}")
                e.synchronize()
            finally:
                g._set_params, g._raw = held, raw
                stop.set()
                if thread is not None:
                    thread.join()
                sys.setswitchinterval(saved)


if __name__ == "__main__":
    main()
