#!/usr/bin/env python3
"""Engine core benchmark: a 100-block chain of tiny kernels, ours beside peers in the same run.

Peers: a hand-built raw CUDA graph of the same kernels (cuda-python), the same kernels launched one
by one with cuLaunchKernel, and (if installed) a PyTorch CUDA graph of 100 equivalent tiny ops. The
Hot and Warm rows' peer is the driver's part of the same patch on the engine's own executable graph:
``cuGraphExecKernelNodeSetParams`` of the node the update patches plus ``cuGraphLaunch``, minus a
bare ``cuGraphLaunch``, medians of the same run (the bare SetParams call on the hand-built graph,
no launch after it, stays as an info row).

Prints a table (ours, peer, ratio) and writes ``engine.json`` to ``$RESULTS_DIR`` when set.
Usage: ``python benchmarks/bench_engine.py [--blocks 100] [--elements 1024]``.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import bare_set_params_launch_us, host_us, patched_node  # noqa: E402
from _timing import gpu_ms as gpu_ms_per_frame  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Scale, bundled_kernel  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402

# The Hot and Warm rows' peer: what the driver adds to a frame for the same patch (``_timing.py``).
PATCH_PEER = "SetParams+launch − launch µs"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--elements", type=int, default=1024)
    ap.add_argument("--profile-cold", action="store_true", help="print a cProfile of 20 Cold rebuilds")
    args = ap.parse_args()
    logging.getLogger("cudapatch").setLevel(logging.ERROR)  # the toggled block's warnings are expected
    nb, n = args.blocks, args.elements
    rng = np.random.default_rng(1)
    rows: list[tuple[str, float, str, float | None, str]] = []

    eng = Engine(wait_for_compile=True, fuse=False)  # the raw graph's 100 kernels (fused: bench_fusion.py)
    stream = eng.device.stream
    sync = eng.device.synchronize
    blocks = [eng.add(Scale(name=f"s{i}", Factor=1.0001, Offset=0.0)) for i in range(nb)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        eng.connect(a, "Out", b, "In")
    x = rng.standard_normal(n).astype(np.float32)
    eng.bind(blocks[0], "In", x)
    eng.update()
    sync()

    # ---- peers: raw graph and raw launches of the same kernel ----------------------------------
    src = bundled_kernel("scale").load()
    module = check(d.cuModuleLoadData(src.image))
    fn = check(d.cuModuleGetFunction(module, b"scale"))
    bufs = [check(d.cuMemAlloc(4 * n)) for _ in range(nb + 1)]
    check(d.cuMemcpyHtoD(bufs[0], x.ctypes.data, 4 * n))
    grid = (n + 255) // 256
    arg_arrays = []
    for i in range(nb):
        vals = (int(bufs[i]), int(bufs[i + 1]), 1.0001, 0.0, n)
        cvals = [
            ctypes.c_uint64(vals[0]),
            ctypes.c_uint64(vals[1]),
            ctypes.c_float(vals[2]),
            ctypes.c_float(vals[3]),
            ctypes.c_uint32(vals[4]),
        ]
        ptrs = np.array([ctypes.addressof(c) for c in cvals], dtype=np.uint64)
        arg_arrays.append((cvals, ptrs))  # the ctypes values must outlive the graph
    graph = check(d.cuGraphCreate(0))
    prev = []
    raw_nodes = []
    for i in range(nb):
        p = d.CUDA_KERNEL_NODE_PARAMS()
        p.func = fn
        p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = 256, 1, 1
        p.sharedMemBytes = 0
        p.kernelParams = int(arg_arrays[i][1].ctypes.data)
        p.extra = 0
        node = check(d.cuGraphAddKernelNode(graph, prev, len(prev), p))
        raw_nodes.append((node, p))
        prev = [node]
    gexec = check(d.cuGraphInstantiate(graph, 0))

    def raw_graph_frame() -> None:
        d.cuGraphLaunch(gexec, stream)

    def raw_launch_frame() -> None:
        for i in range(nb):
            d.cuLaunchKernel(fn, grid, 1, 1, 256, 1, 1, 0, stream, int(arg_arrays[i][1].ctypes.data), 0)

    torch_frame = None
    try:
        import torch

        tx = torch.from_numpy(x).cuda()
        ts = torch.cuda.Stream()
        with torch.cuda.stream(ts):
            for _ in range(3):
                y = tx
                for _ in range(nb):
                    y = y * 1.0001 + 0.0
        torch.cuda.synchronize()
        tg = torch.cuda.CUDAGraph()
        with torch.cuda.graph(tg):
            y = tx
            for _ in range(nb):
                y = y * 1.0001  # one tiny kernel per op, like one Scale block
        torch_stream = torch.cuda.current_stream().cuda_stream

        def torch_frame() -> None:  # noqa: F811
            tg.replay()
    except Exception as exc:  # PyTorch missing or no GPU build: leave the column out
        print(f"(PyTorch peer unavailable: {exc})")
        torch_stream = None

    # ---- GPU time per frame -----------------------------------------------------------------------
    ours_gpu = gpu_ms_per_frame(eng.update, stream)
    raw_gpu = gpu_ms_per_frame(raw_graph_frame, stream)
    launch_gpu = gpu_ms_per_frame(raw_launch_frame, stream)
    rows.append(
        ("GPU µs/frame, 100-kernel chain vs raw graph", ours_gpu * 1e3, "raw graph µs", raw_gpu * 1e3, "≤ 1.05")
    )
    rows.append(
        ("GPU µs/frame vs per-kernel launches", ours_gpu * 1e3, "cuLaunchKernel µs", launch_gpu * 1e3, "≤ 0.286")
    )
    if torch_frame is not None:
        torch_gpu = gpu_ms_per_frame(torch_frame, torch_stream)
        rows.append(("GPU µs/frame vs PyTorch CUDA graph", ours_gpu * 1e3, "torch graph µs", torch_gpu * 1e3, "info"))

    # ---- host time of update() with nothing dirty -----------------------------------------------------
    ours_host = host_us(eng.update, 3000, sync)
    raw_host = host_us(raw_graph_frame, 3000, sync)
    rows.append(("update() host µs, nothing dirty", ours_host, "cuGraphLaunch µs", raw_host, "≤ 15 µs"))

    # ---- Hot update: set() and the update() that applies it, timed separately -------------------------
    s_mid = blocks[nb // 2]
    set_t, upd_t = [], []
    for i in range(3000):
        if i % 50 == 0:
            sync()
        t0 = time.perf_counter_ns()
        s_mid.set("Factor", 1.0 + (i % 2) * 1e-4)
        t1 = time.perf_counter_ns()
        eng.update()
        set_t.append(t1 - t0)
        upd_t.append(time.perf_counter_ns() - t1)
    sync()
    hot_set = statistics.median(set_t) / 1e3
    hot_upd = statistics.median(upd_t) / 1e3 - ours_host
    node, p = raw_nodes[nb // 2]
    raw_set = host_us(lambda: d.cuGraphExecKernelNodeSetParams(gexec, node, p), 3000, sync)
    set_launch, bare_launch = bare_set_params_launch_us(eng, patched_node(eng, s_mid.id, "Factor"))
    hot_peer = set_launch - bare_launch
    rows.append(("Hot: update() applying 1 scalar, minus clean update", hot_upd, PATCH_PEER, hot_peer, "≤ 3 µs"))
    rows.append(("Hot: the same, beside the SetParams call alone", hot_upd, "raw SetParams µs", raw_set, "info"))
    rows.append(("Hot: block.set() (validate + mark dirty)", hot_set, "-", None, "info"))

    # ---- Warm rebind: bind() and the update() that applies it -------------------------------------------
    try:
        import cupy as cp

        flip = [cp.asarray(x), cp.asarray(x * 2)]
        bind_t, upd_t = [], []
        for i in range(3000):
            if i % 50 == 0:
                sync()
            t0 = time.perf_counter_ns()
            eng.bind(blocks[0], "In", flip[i % 2])
            t1 = time.perf_counter_ns()
            eng.update()
            bind_t.append(t1 - t0)
            upd_t.append(time.perf_counter_ns() - t1)
        sync()
        assert eng.counters.warm_updates >= 2999
        warm_upd = statistics.median(upd_t) / 1e3 - ours_host
        set_launch, bare_launch = bare_set_params_launch_us(eng, patched_node(eng, blocks[0].id, "In", binding=True))
        warm_peer = set_launch - bare_launch
        rows.append(("Warm: update() applying 1 rebind, minus clean update", warm_upd, PATCH_PEER, warm_peer, "≤ 3 µs"))
        rows.append(("Warm: the same, beside the SetParams call alone", warm_upd, "raw SetParams µs", raw_set, "info"))
        rows.append(("Warm: engine.bind(cupy array)", statistics.median(bind_t) / 1e3, "-", None, "info"))
    except ImportError:
        print("(CuPy missing: no Warm rebind row)")

    # ---- Cold rebuild -------------------------------------------------------------------------------
    # A real topology change each time: link / unlink a 101st block at the end of the chain.
    extra = eng.add(Scale(name="extra"))
    linked = [False]

    def toggle_extra() -> None:
        if linked[0]:
            eng.disconnect(blocks[-1], "Out", extra, "In")
        else:
            eng.connect(blocks[-1], "Out", extra, "In")
        linked[0] = not linked[0]

    toggle_extra()
    eng.update()
    cold = []
    phases: dict[str, list[float]] = {}
    rebuilds0 = eng.counters.rebuilds
    for _ in range(50):
        sync()
        toggle_extra()
        t = time.perf_counter_ns()
        eng.update()
        cold.append((time.perf_counter_ns() - t) / 1e6)
        lb = eng.last_build
        for key, val in [
            ("reap", lb.reap_ms),
            ("compile", lb.compile_ms),
            ("realize", lb.realize_ms),
            *((k[:-3], v) for k, v in eng.graph.timing.items()),
        ]:
            phases.setdefault(key, []).append(val)
    sync()
    cold_phases = ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in phases.items())
    assert eng.counters.rebuilds == rebuilds0 + 50
    rows.append(("Cold rebuild of 100 blocks (modules cached), ms", statistics.median(cold), "-", None, "≤ 5 ms"))
    # Warm resize: the input shrinks/grows within the allocated buffers: no new graph.
    halves = [rng.standard_normal(n // 2).astype(np.float32), x]
    resize = []
    for i in range(50):
        sync()
        t = time.perf_counter_ns()
        eng.bind(blocks[0], "In", halves[i % 2])
        eng.update()
        resize.append((time.perf_counter_ns() - t) / 1e6)
    sync()
    assert eng.counters.rebuilds == rebuilds0 + 50
    rows.append(
        (
            "Warm resize of 100 blocks (count change), ms",
            statistics.median(resize),
            "Cold ms",
            statistics.median(cold),
            "info",
        )
    )
    if args.profile_cold:
        import cProfile
        import io
        import pstats

        prof = cProfile.Profile()
        for _ in range(20):
            sync()
            toggle_extra()
            prof.enable()
            eng.update()
            prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        print(buf.getvalue())

    # ---- memory -------------------------------------------------------------------------------------
    before = (eng.pool.driver_allocations, eng.pool.total_allocated_bytes)
    for _ in range(10_000):
        eng.update()
    sync()
    after = (eng.pool.driver_allocations, eng.pool.total_allocated_bytes)
    base_free = eng.device.mem_info()[0]
    for _ in range(1000):
        toggle_extra()
        eng.update()
    sync()
    eng.update()
    drift = eng.device.mem_info()[0] - base_free

    # ---- check the chain is right --------------------------------------------------------------------
    eng.bind(blocks[0], "In", x)
    for b in blocks:
        b.set("Factor", 1.0001)
    eng.update()
    ref = x.astype(np.float64) * 1.0001**nb
    err = float(np.max(np.abs(eng.read(blocks[-1], "Out") - ref)) / np.max(np.abs(ref)))

    print()
    print(
        f"device: {eng.device.name} ({eng.device.arch}), driver {eng.device.driver_version}, "
        f"{nb} blocks x {n} elements; chain rel. error {err:.2e}"
    )
    print(f"{'measure':52} {'ours':>10} {'peer':>28} {'peer val':>10} {'ratio':>8}  target")
    out = []
    for name, ours, peer, peer_val, target in rows:
        ratio = f"{ours / peer_val:.2f}" if peer_val else "-"
        pv = f"{peer_val:.2f}" if peer_val is not None else "-"
        print(f"{name:52} {ours:10.2f} {peer:>28} {pv:>10} {ratio:>8}  {target}")
        out.append({"measure": name, "ours": ours, "peer": peer, "peer_value": peer_val, "target": target})
    print(f"Cold rebuild phases (median ms): {cold_phases}")
    print(f"pool over 10,000 frames: driver allocations {before[0]} -> {after[0]}, bytes {before[1]} -> {after[1]}")
    print(f"device free memory drift after 1000 rebuilds: {drift / 2**20:+.2f} MiB")
    write_results("engine.json", {"rows": out, "pool": [before, after], "drift": drift})
    check(d.cuGraphExecDestroy(gexec))
    check(d.cuGraphDestroy(graph))
    for b in bufs:
        check(d.cuMemFree(b))
    check(d.cuModuleUnload(module))
    eng.close()


if __name__ == "__main__":
    main()
