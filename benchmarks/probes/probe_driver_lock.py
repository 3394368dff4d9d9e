#!/usr/bin/env python3
"""Diagnostic: which driver calls on another thread make the frame thread's ``cuGraphLaunch`` wait?

A chain of N ``Scale`` blocks (1024 floats, unfused). The main thread launches the engine's executable
graph with a bare ``cuGraphLaunch`` every 0.5 ms for 1.5 s (the stream drained every 20 launches),
while a second thread repeats one kind of driver call (1 ms apart): nothing, adding the graph's
kernel nodes to a new graph, cloning it, instantiating it, instantiating and uploading it on a stream
of its own or on the engine's, allocating device memory (kept), freeing it. Prints the launches'
median, p99 and slowest host time and how many took over 1 ms, beside the call's own median.

It decided where the engine uploads new executables (``DeviceContext.upload_stream``) and what a
build may do while frames run (docs/findings.md, 2026-11-26).

Usage: ``python benchmarks/probes/probe_driver_lock.py [N ...]`` (default 1000 10000).
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from cuda.bindings import driver as d

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_liveness import scale_chain  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402


def chain(n: int) -> Engine:
    e = Engine(name=f"chain{n}", fuse=False)
    scale_chain(e, n, np.ones(1024, np.float32))
    e.wait_ready()
    e.update()
    e.synchronize()
    return e


def calls(e: Engine) -> dict[str, Callable[[], None] | None]:
    """The kinds of driver work the second thread repeats."""
    g = e.graph
    assert g is not None
    template, stream = g._parts.graph, e.resources.stream
    nodes = [k for k in g._nodes if k is not None and getattr(k, "params", None) is not None]
    other = check(d.cuStreamCreate(d.CUstream_flags.CU_STREAM_NON_BLOCKING.value))
    held: list = []

    def add_nodes() -> None:
        graph, prev = check(d.cuGraphCreate(0)), None
        for k in nodes:
            deps = [prev] if prev is not None else []
            prev = check(d.cuGraphAddKernelNode(graph, deps, len(deps), k.params))
        check(d.cuGraphDestroy(graph))

    def clone() -> None:
        check(d.cuGraphDestroy(check(d.cuGraphClone(template))))

    def instantiate(upload_on: object = None) -> None:
        exec_ = check(d.cuGraphInstantiate(template, 0))
        if upload_on is not None:
            check(d.cuGraphUpload(exec_, upload_on))
        check(d.cuGraphExecDestroy(exec_))

    def alloc() -> None:
        for _ in range(20):
            held.append(check(d.cuMemAlloc(4096)))

    def free() -> None:
        for _ in range(20):
            if held:
                check(d.cuMemFree(held.pop()))

    return {
        "none": None,
        "add every node to a new graph": add_nodes,
        "clone the graph": clone,
        "instantiate": instantiate,
        "instantiate + upload (own stream)": lambda: instantiate(other),
        "instantiate + upload (engine stream)": lambda: instantiate(stream),
        "cuMemAlloc 4 KB x20 (kept)": alloc,
        "cuMemFree of those x20": free,
    }


def measure(e: Engine, name: str, fn: Callable[[], None] | None) -> str:
    g = e.graph
    assert g is not None
    exec_, stream = g.handle, e.resources.stream
    stop, per = threading.Event(), []

    def work() -> None:
        check(d.cuCtxSetCurrent(e.device.context))
        while not stop.is_set():
            t = time.perf_counter()
            fn()
            per.append(time.perf_counter() - t)
            time.sleep(0.001)

    thread = threading.Thread(target=work) if fn is not None else None
    if thread is not None:
        thread.start()
    times = []
    end, i = time.perf_counter() + 1.5, 0
    while time.perf_counter() < end:
        if i % 20 == 0:
            check(d.cuStreamSynchronize(stream))
        t = time.perf_counter_ns()
        check(d.cuGraphLaunch(exec_, stream))
        times.append((time.perf_counter_ns() - t) / 1e3)
        i += 1
        time.sleep(0.0005)
    stop.set()
    if thread is not None:
        thread.join()
    check(d.cuStreamSynchronize(stream))
    times.sort()
    call = statistics.median(per) * 1e3 if per else 0.0
    return (
        f"{name:38} {len(times):6d} {statistics.median(times):8.1f} {times[int(len(times) * 0.99)]:9.1f} "
        f"{times[-1]:9.1f} {sum(t > 1000 for t in times):6d} {call:9.2f}"
    )


def main() -> None:
    sizes = [int(a) for a in sys.argv[1:]] or [1000, 10000]
    for n in sizes:
        e = chain(n)
        try:
            print(f"\n{n} kernel nodes: launches beside a thread's driver calls (µs; call ms)")
            print(f"{'other thread':38} {'frames':>6} {'median':>8} {'p99':>9} {'max':>9} {'>1 ms':>6} {'call ms':>9}")
            for name, fn in calls(e).items():
                print(measure(e, name, fn), flush=True)
        finally:
            e.close()


if __name__ == "__main__":
    main()
