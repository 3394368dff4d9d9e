#!/usr/bin/env python3
"""Probe: what the driver charges a Hot edit of a fused kernel, by how its arguments are handed over.

Question: a Hot edit of a member of a fused 100-Scale chain cost 7.6 µs beside a quiet ``update()``,
the same edit unfused 3.9 µs (H100 host, bench_fusion.py); the Python of both paths is the same
(``benchmarks/bench_hot_cpu.py``). Is the difference ``cuGraphExecKernelNodeSetParams`` copying the
fused kernel's 204 arguments one by one (``kernelParams``), and does one buffer (``extra``:
``CU_LAUNCH_PARAM_BUFFER_POINTER``, what ``engine/params.py`` hands the driver from
``BUFFER_FROM_ARGS`` arguments on) cost what a small kernel's call costs?

For the running engine's fused node (100 Scale blocks, 1,024 floats) and for one unfused Scale node,
each in a one-node graph of its own (the engine's function, launch shape and argument bytes), both
ways: host µs of ``cuGraphExecKernelNodeSetParams`` and of ``cuGraphLaunch`` (medians, the stream
drained every 50 calls), and the GPU µs per launch; the two ways must give the same output bits.

Usage: ``python benchmarks/probes/probe_hot_params.py [--blocks 100] [--calls 3000]``.
"""

from __future__ import annotations

import argparse
import ctypes
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _timing import gpu_ms, host_us  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Scale  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402


def _launch_struct(store: Any, *, one_buffer: bool) -> tuple[Any, list[Any]]:
    """A ``CUDA_KERNEL_NODE_PARAMS`` over ``store``'s argument bytes (an engine ``ParamStorage``), with a
    pointer per argument or the bytes as one buffer; the ctypes objects it points into come with it."""
    src = store.params
    kp = d.CUDA_KERNEL_NODE_PARAMS()
    kp.func = src.func
    kp.gridDimX, kp.gridDimY, kp.gridDimZ = src.gridDimX, src.gridDimY, src.gridDimZ
    kp.blockDimX, kp.blockDimY, kp.blockDimZ = src.blockDimX, src.blockDimY, src.blockDimZ
    kp.sharedMemBytes = src.sharedMemBytes
    offsets, size = store.descriptor.offsets
    base = ctypes.addressof(store.storage)
    if one_buffer:
        n = ctypes.c_size_t(size)
        extra = (ctypes.c_void_p * 5)(1, base, 2, ctypes.addressof(n), 0)
        kp.kernelParams, kp.extra = 0, ctypes.addressof(extra)
        return kp, [n, extra]
    pointers = (ctypes.c_void_p * len(offsets))(*[base + o for o in offsets])
    kp.kernelParams, kp.extra = ctypes.addressof(pointers), 0
    return kp, [pointers]


def _measure(store: Any, out: Any, poison: Any, stream: Any, calls: int, *, one_buffer: bool) -> dict[str, Any]:
    kp, keep = _launch_struct(store, one_buffer=one_buffer)
    graph = check(d.cuGraphCreate(0))
    node = check(d.cuGraphAddKernelNode(graph, [], 0, kp))
    gexec = check(d.cuGraphInstantiate(graph, 0))
    sync = lambda: check(d.cuStreamSynchronize(stream))  # noqa: E731
    try:
        poison()  # NaN: what this graph does not write shows
        check(d.cuGraphLaunch(gexec, stream))
        check(d.cuGraphExecKernelNodeSetParams(gexec, node, kp))  # once checked: the timed calls are not
        sync()
        row = {
            "set_params_us": host_us(lambda: d.cuGraphExecKernelNodeSetParams(gexec, node, kp), calls, sync),
            "launch_us": host_us(lambda: d.cuGraphLaunch(gexec, stream), calls, sync),
            "gpu_us": gpu_ms(lambda: d.cuGraphLaunch(gexec, stream), stream) * 1e3,
        }
        sync()
        row["out"] = out()
        return row
    finally:
        check(d.cuGraphExecDestroy(gexec))
        check(d.cuGraphDestroy(graph))
        del keep


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--calls", type=int, default=3000)
    args = ap.parse_args()
    x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    print("host µs of cuGraphExecKernelNodeSetParams and cuGraphLaunch, one-node graph; GPU µs per launch")
    print(f"{'kernel':<34} {'arguments':>9} {'SetParams':>10} {'launch':>8} {'GPU':>7}")
    for fuse in (True, False):
        with Engine(wait_for_compile=True, fuse=fuse, cache_dir=False) as e:
            blocks = [e.add(Scale(Factor=1.0 + i / 1000, Offset=0.01)) for i in range(args.blocks if fuse else 1)]
            e.bind(blocks[0], "In", x)
            for a, b in zip(blocks, blocks[1:], strict=False):
                e.connect(a, "Out", b, "In")
            e.keep(blocks[-1], "Out")
            e.update()
            e.synchronize()
            g = e.graph
            assert g is not None
            (plan_node,) = g.plan.kernel_nodes
            store = g._nodes[plan_node.index].store  # the running node's argument storage (no public accessor)
            stream = e.resources.stream
            e.device.make_current()
            out = g.buffers[g.plan.outputs[(blocks[-1].id, "Out")]]
            poison = lambda out=out, s=stream: check(d.cuMemsetD32Async(out.ptr, 0x7FC00000, x.size, s))  # noqa: E731
            read = lambda e=e, b=blocks[-1]: e.read(b, "Out")  # noqa: E731
            rows = {}
            for one_buffer in (False, True):
                rows[one_buffer] = r = _measure(store, read, poison, stream, args.calls, one_buffer=one_buffer)
                kernel = f"fused {args.blocks}" if fuse else "Scale"
                name = f"{kernel}, {'one buffer' if one_buffer else 'pointers'}"
                print(
                    f"{name:<34} {len(plan_node.args):>9} {r['set_params_us']:>10.2f} {r['launch_us']:>8.2f} "
                    f"{r['gpu_us']:>7.2f}"
                )
            assert not np.isnan(rows[True]["out"]).any(), "the one-buffer launch left its output unwritten"
            assert np.array_equal(rows[False]["out"], rows[True]["out"]), "the two ways computed different bits"


if __name__ == "__main__":
    main()
