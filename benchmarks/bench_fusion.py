#!/usr/bin/env python3
"""Fusion and Expression benchmark (docs/expressions.md), ours beside peers in the same run.

1. A chain of ``--blocks`` ``Scale`` blocks (``y = a*x + b``) over 1,024 and 1M floats: GPU time per
   frame of the fused graph (one generated kernel), of the unfused graph (one node per block), and of
   ``cupy.fuse`` of the same arithmetic. Targets: fused ≥ 30× faster than unfused at 1,024, ≥ 20× at 1M,
   ≤ 1.2× ``cupy.fuse``.
2. Expression edit → running: ``set("Code", ...)`` until the new kernel is swapped into the running
   graph, median and p95 over ``--edits`` edits, generated PTX (driver JIT) beside NVRTC of the same
   kernel (``Compiler="nvrtc"``). Target: ≤ 2 ms median. Then the compile step alone per path:
   generating the PTX, the driver's JIT, nvJitLink, NVRTC.
3. A Hot change of one scalar: ``set()`` + ``update()`` host time for a member of the fused chain beside
   the same change unfused (target: the same, ≤ 3 µs per patched node).

Usage: ``python benchmarks/bench_fusion.py [--blocks 100] [--edits 50]``. Writes ``fusion.json`` to
``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Expression, Scale  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402


def gpu_ms(run, stream, frames: int = 200, repeats: int = 5) -> float:
    """GPU time per call of ``run`` (ms) from events around ``frames`` calls; median of ``repeats``."""
    start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    out = []
    for _ in range(repeats):
        check(d.cuStreamSynchronize(stream))
        check(d.cuEventRecord(start, stream))
        for _ in range(frames):
            run()
        check(d.cuEventRecord(end, stream))
        check(d.cuEventSynchronize(end))
        out.append(check(d.cuEventElapsedTime(start, end)) / frames)
    check(d.cuEventDestroy(start))
    check(d.cuEventDestroy(end))
    return statistics.median(out)


def chain(e: Engine, n_blocks: int, x: np.ndarray) -> list[Scale]:
    rng = np.random.default_rng(1)
    blocks = [
        e.add(Scale(Factor=float(rng.uniform(0.9, 1.1)), Offset=float(rng.uniform(-0.1, 0.1)))) for _ in range(n_blocks)
    ]
    e.bind(blocks[0], "In", x)
    for a, b in zip(blocks, blocks[1:], strict=False):
        e.connect(a, "Out", b, "In")
    return blocks


def bench_chain(n_blocks: int, elements: int) -> dict:
    x = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    row: dict = {"blocks": n_blocks, "elements": elements}
    results = {}
    for fuse in (True, False):
        with Engine(wait_for_compile=True, fuse=fuse, cache_dir=False) as e:
            blocks = chain(e, n_blocks, x)
            e.update()
            e.synchronize()
            g = e.graph
            assert g is not None
            row["fused_nodes" if fuse else "unfused_nodes"] = len(g.plan.kernel_nodes)
            row["fused_ms" if fuse else "unfused_ms"] = gpu_ms(
                lambda g=g, s=e.resources.stream: g.launch(s), e.resources.stream
            )
            results[fuse] = e.read(blocks[-1], "Out")
    row["bitwise_equal"] = bool(np.array_equal(results[True], results[False]))
    try:
        import cupy as cp

        rng = np.random.default_rng(1)  # the chain's factors and offsets, drawn as chain() draws them
        factors = [(float(rng.uniform(0.9, 1.1)), float(rng.uniform(-0.1, 0.1))) for _ in range(n_blocks)]

        @cp.fuse()
        def fused(v):  # the same arithmetic, one kernel compiled by CuPy
            for f, o in factors:
                v = v * f + o
            return v

        xd = cp.asarray(x)
        out = fused(xd)
        stream = cp.cuda.get_current_stream().ptr
        row["cupy_fuse_ms"] = gpu_ms(lambda: fused(xd), stream)
        row["cupy_max_abs_diff"] = float(cp.max(cp.abs(out - cp.asarray(results[True]))))
    except ImportError:
        row["cupy_fuse_ms"] = None
    return row


def bench_edits(edits: int, compiler: str) -> dict:
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    times = []
    salt = time.time_ns() % 1_000_000  # constants no run has compiled before: no cache anywhere helps
    with Engine(cache_dir=False) as e:
        block = e.add(Expression(Code="x * Gain + 0.5", Gain=2.0, Compiler=compiler))
        e.bind(block, "x", x)
        e.wait_ready()
        e.update()
        for i in range(edits):
            e.synchronize()
            swaps = e.counters.code_swaps
            t = time.perf_counter_ns()
            block.set("Code", f"x * Gain + {salt}.{i:03d}")
            while e.counters.code_swaps == swaps:  # frames as fast as they come: the frame loop of a live host
                e.update()
            times.append((time.perf_counter_ns() - t) / 1e6)
        e.update()
        got = e.read(block, "Out")
        expected = x * np.float32(2.0) + np.float32(f"{salt}.{edits - 1:03d}")
        assert np.array_equal(got, expected), "the last edit is not what runs"
    times.sort()
    return {
        "compiler": compiler,
        "edits": edits,
        "median_ms": statistics.median(times),
        "p95_ms": times[min(len(times) - 1, int(0.95 * len(times)))],
    }


def bench_compile_paths(reps: int = 20) -> dict:
    """The compile step alone, per path, for the same small expression: generating the PTX text, the
    driver's JIT of it (``cuModuleLoadData`` + ``cuFuncLoad``), nvJitLink to a cubin, NVRTC of the
    generated CUDA C++ (medians, ms)."""
    import hashlib

    from cudapatch.expr import NVRTC_OPTIONS, compile_expression, generate_cuda, generate_ptx, single
    from cudapatch.kernels._toolchain import link_ptx, nvrtc_compile
    from cudapatch.kernels.source import KernelImage

    salt = time.time_ns() % 1_000_000
    gen, jit, link, nvrtc = [], [], [], []
    with Engine(cache_dir=False) as e:
        arch = e.device.arch
        e.device.make_current()  # the modules load into the engine's context, on this thread
        for i in range(reps):
            program = single(compile_expression(f"a * sin(x * Freq) + b * {salt}.{i:03d}"))
            t0 = time.perf_counter_ns()
            ptx = generate_ptx(program, arch).encode() + b"\0"
            t1 = time.perf_counter_ns()
            image = KernelImage(program.descriptor, ptx, "ptx", hashlib.sha256(ptx).hexdigest(), "bench")
            e.modules.function(image)
            t2 = time.perf_counter_ns()
            link_ptx(ptx, name="bench.ptx", arch=arch)
            t3 = time.perf_counter_ns()
            nvrtc_compile(generate_cuda(program), name="bench.cu", entry="expression", arch=arch, options=NVRTC_OPTIONS)
            t4 = time.perf_counter_ns()
            gen.append((t1 - t0) / 1e6)
            jit.append((t2 - t1) / 1e6)
            link.append((t3 - t2) / 1e6)
            nvrtc.append((t4 - t3) / 1e6)
    med = statistics.median
    return {"generate_ms": med(gen), "driver_jit_ms": med(jit), "nvjitlink_ms": med(link), "nvrtc_ms": med(nvrtc)}


def bench_hot(n_blocks: int, calls: int = 2000) -> dict:
    x = np.random.default_rng(0).standard_normal(1024).astype(np.float32)
    row = {}
    for fuse in (True, False):
        with Engine(wait_for_compile=True, fuse=fuse, cache_dir=False) as e:
            blocks = chain(e, n_blocks, x)
            e.update()
            target = blocks[n_blocks // 2]
            times = []
            for i in range(calls):
                if i % 50 == 0:
                    e.synchronize()
                t = time.perf_counter_ns()
                target.set("Factor", 1.0 + (i % 7) * 1e-3)
                e.update()
                times.append(time.perf_counter_ns() - t)
            quiet = []
            for i in range(calls):
                if i % 50 == 0:
                    e.synchronize()
                t = time.perf_counter_ns()
                e.update()
                quiet.append(time.perf_counter_ns() - t)
            e.synchronize()
        key = "fused" if fuse else "unfused"
        row[f"{key}_hot_update_us"] = statistics.median(times) / 1e3
        row[f"{key}_quiet_update_us"] = statistics.median(quiet) / 1e3
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--edits", type=int, default=50)
    args = ap.parse_args()
    logging.getLogger("cudapatch").setLevel(logging.ERROR)
    report: dict = {"chains": [], "edits": [], "hot": None}
    print(f"1. chain of {args.blocks} Scale blocks: GPU ms per frame")
    head = ("elements", "fused", "unfused", "cupy.fuse", "unfused/fused", "fused/cupy")
    print("{:>10} {:>9} {:>9} {:>10} {:>14} {:>11} bitwise".format(*head))
    for elements in (1024, 1 << 20):
        r = bench_chain(args.blocks, elements)
        report["chains"].append(r)
        cupy = r["cupy_fuse_ms"]
        fused, unfused = r["fused_ms"], r["unfused_ms"]
        cupy_ms = "-" if cupy is None else f"{cupy:.4f}"
        vs_cupy = "-" if cupy is None else f"{fused / cupy:.2f}x"
        print(
            f"{elements:>10} {fused:>9.4f} {unfused:>9.4f} {cupy_ms:>10} {unfused / fused:>13.1f}x "
            f"{vs_cupy:>11} {r['bitwise_equal']}"
        )
    print(f"2. Expression edit -> running, {args.edits} edits (ms)")
    for compiler in ("ptx", "nvrtc"):
        r = bench_edits(args.edits, compiler)
        report["edits"].append(r)
        print(f"   {compiler:<6} median {r['median_ms']:.2f}  p95 {r['p95_ms']:.2f}")
    ptx, nvrtc = report["edits"]
    print(f"   NVRTC / PTX median: {nvrtc['median_ms'] / ptx['median_ms']:.1f}x")
    paths = bench_compile_paths()
    report["compile_paths"] = paths
    print(
        "   the compile step alone (median ms): generate PTX {generate_ms:.3f}, driver JIT {driver_jit_ms:.2f}, "
        "nvJitLink {nvjitlink_ms:.2f}, NVRTC {nvrtc_ms:.2f}".format(**paths)
    )
    r = bench_hot(args.blocks)
    report["hot"] = r
    print("3. Hot change of one scalar, set() + update() host µs (quiet update() beside it)")
    for key in ("fused", "unfused"):
        print(f"   {key:<8} {r[f'{key}_hot_update_us']:.1f}  (quiet {r[f'{key}_quiet_update_us']:.1f})")
    out = os.environ.get("RESULTS_DIR")
    if out:
        Path(out, "fusion.json").write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
