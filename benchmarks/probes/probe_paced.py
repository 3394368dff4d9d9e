#!/usr/bin/env python3
"""Diagnostic: how much more host time does a frame paced at 60 fps cost than one right after another?

Times, for each way of waiting out the rest of a 60 fps frame, what a frame does and its peers:
an empty Python call (the interpreter's own wake-up cost), bare ``cuGraphLaunch`` calls of a
one-node graph and of the engine's executable graph (the driver's), ``Engine.update()`` (ours), and
the replay of a PyTorch CUDA graph of as many ops. Ways of waiting: none (back to back),
``time.sleep`` for the whole gap, sleep until 1 ms before the frame then spin (what game loops do),
and spin the whole gap. Measured on the H100 host: asleep, every launch costs 10 to 20 times its
back-to-back time (a bare one-node graph 32-36 µs, against 1.7-3 µs), and the slowest of 240
frames is 2 to 12 times the median for every launcher: a bound that ``update()`` cannot beat.

Usage: ``python benchmarks/probes/probe_paced.py [--blocks 100] [--frames 240]``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Scale  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402

PERIOD = 1 / 60


def host_facts() -> list[str]:
    def read(path: str) -> str:
        try:
            return Path(path).read_text().strip()
        except OSError:
            return "?"

    idle = Path("/sys/devices/system/cpu/cpu0/cpuidle")
    states = [read(str(s / "name")) for s in sorted(idle.glob("state*"))] if idle.exists() else []
    model = next((ln.split(":", 1)[1].strip() for ln in read("/proc/cpuinfo").splitlines() if "model name" in ln), "?")
    return [
        f"cpu: {model} ({platform.machine()})",
        f"cpus allowed: {len(os.sched_getaffinity(0))}",
        f"governor: {read('/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor')}",
        f"idle driver: {read('/sys/devices/system/cpu/cpuidle/current_driver')}, states {states}",
        f"machine: {read('/sys/class/dmi/id/sys_vendor')} {read('/sys/class/dmi/id/product_name')}",
    ]


def one_node_graph(eng: Engine) -> object:
    """An executable graph of one empty memset node (the cheapest launch there is)."""

    buf = check(d.cuMemAlloc(4), "cuMemAlloc")
    graph = check(d.cuGraphCreate(0), "cuGraphCreate")
    p = d.CUDA_MEMSET_NODE_PARAMS()
    p.dst, p.value, p.elementSize, p.width, p.height, p.pitch = buf, 0, 4, 1, 1, 4
    check(d.cuGraphAddMemsetNode(graph, None, 0, p, eng.device.context), "cuGraphAddMemsetNode")
    return check(d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")


def torch_peer(ops: int):  # noqa: ANN201
    """A PyTorch CUDA graph of ``ops`` small elementwise ops (its replay), or None without PyTorch."""
    try:
        import torch

        x = torch.ones(1 << 16, device="cuda")
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            for _ in range(3):
                y = x
                for _ in range(ops):
                    y = y * 1.0001
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x
            for _ in range(ops):
                y = y * 1.0001
        torch.cuda.synchronize()
        return g.replay
    except Exception as exc:  # noqa: BLE001 - a missing peer is reported, not fatal
        print(f"(PyTorch peer unavailable: {exc})")
        return None


def wait(mode: str, deadline: float) -> None:
    if mode == "sleep":
        time.sleep(max(0.0, deadline - time.perf_counter()))
    elif mode == "sleep, then spin the last ms":
        time.sleep(max(0.0, deadline - 0.001 - time.perf_counter()))
        while time.perf_counter() < deadline:
            pass
    elif mode == "spin":
        while time.perf_counter() < deadline:
            pass


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--frames", type=int, default=240)
    args = ap.parse_args()
    for line in host_facts():
        print(line)
    eng = Engine(wait_for_compile=True)
    blocks = [eng.add(Scale(name=f"s{i}")) for i in range(args.blocks)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        eng.connect(a, "Out", b, "In")
    eng.bind(blocks[0], "In", np.ones(1 << 16, np.float32))
    eng.update()
    eng.synchronize()
    assert all(b.debug.state.value == "OK" for b in blocks), [b.debug.message for b in blocks if b.debug.message]
    stream = eng.device.stream

    def noop() -> None:
        pass

    def launcher(graph: object) -> object:
        def launch() -> None:
            check(d.cuGraphLaunch(graph, stream), "cuGraphLaunch")

        return launch

    what = {
        "empty Python call": noop,
        "raw graph, 1 node": launcher(one_node_graph(eng)),
        f"raw graph, {args.blocks} nodes": launcher(eng.graph._exec),
        "Engine.update()": eng.update,
    }
    torch_graph = torch_peer(args.blocks)
    if torch_graph is not None:
        what[f"PyTorch graph, {args.blocks} ops"] = torch_graph
    print(f"\n{'waiting':30} {'timed':20} {'median µs':>10} {'p95 µs':>8} {'max µs':>8} {'max/med':>8}")
    for mode in ("back to back", "sleep", "sleep, then spin the last ms", "spin"):
        for name, fn in what.items():
            ts = []
            deadline = time.perf_counter()
            for i in range(args.frames):
                if mode != "back to back":
                    deadline += PERIOD
                    wait(mode, deadline)
                t = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t)
                if mode == "back to back" and i % 50 == 49:
                    check(d.cuCtxSynchronize(), "cuCtxSynchronize")  # keep the queue short
            check(d.cuCtxSynchronize(), "cuCtxSynchronize")
            ts.sort()
            med = statistics.median(ts)
            p95 = ts[int(0.95 * (len(ts) - 1))]
            print(f"{mode:30} {name:20} {med * 1e6:10.2f} {p95 * 1e6:8.2f} {ts[-1] * 1e6:8.2f} {ts[-1] / med:8.2f}")
    eng.close()


if __name__ == "__main__":
    main()
