#!/usr/bin/env python3
"""Fusion and Expression benchmark (docs/expressions.md), ours beside peers in the same run.

1. A chain of ``--blocks`` ``Scale`` blocks (``y = a*x + b``) over 1,024 and 1M floats: GPU time per
   frame of the fused graph (one generated kernel), of the unfused graph (one node per block), and of
   ``cupy.fuse`` of the same arithmetic (its factors and offsets Python floats: constants compiled into
   its code; and again as float32 arguments, kernel parameters as ours are: ``cupy args``). Targets:
   fused ≥ 30× faster than unfused at 1,024, ≥ 20× at 1M, ≤ 1.2× ``cupy.fuse``. Each side is measured
   the same way twice (events around the launches, GPU time only, median of 5):

   - **per frame**: one graph launch per frame, 200 frames. Ours is the engine's graph (at profiling
     level None: the one fused kernel node, nothing else); ``cupy frame`` is one ``cupy.fuse`` call
     captured into a graph on a CuPy stream, launched once per frame. ``empty frame`` is a graph of one
     empty kernel (one thread) launched the same way: what a graph launch costs the device before any
     work, the floor of both.
   - **per kernel**: 200 launches inside one graph, launched once. ``cupy graph`` is 200 ``cupy.fuse``
     calls captured into one graph; ``fused kernel`` is 200 copies of the running graph's fused kernel
     node (the same function, launch shape and arguments) chained in one raw graph.

   The ratio against ``cupy.fuse`` is given both ways (``frame/frame`` and ``kernel/kernel``). Until
   this run the only ratio was ours per frame against ``cupy graph`` per kernel: at 1,024 floats that
   charged our side a graph launch per kernel and CuPy's side none. ``cupy calls`` (events around 200
   calls from Python: each call a Python launch, so small arrays measure the host) stays for reference.
   Then the same twice more once the engine specialised the fused kernel on its resting scalar values
   (``engine/specialize.py``: the values compiled in, swapped in between frames; a Hot edit puts the
   generic kernel back): ``specialised``, with its results against the unfused graph's, bit for bit.
2. Expression edit → running: ``set("Code", ...)`` until the new kernel is swapped into the running
   graph (``live``: the quick build, the bytecode interpreter where it can run the program, else the
   PTX JITted at a low level), and until its optimised build is swapped
   in after it (``optimised``), median and p95 over ``--edits`` edits; generated PTX beside NVRTC of the
   same kernel (``Compiler="nvrtc"``: one build, no upgrade). Target: ``live`` ≤ 2 ms median. Then the
   compile step alone per path: generating the PTX, the driver's JIT at the quick level and at the
   default, nvJitLink, NVRTC.
3. A Hot change of one scalar: ``set()`` + ``update()`` host time for a member of the fused chain beside
   the same change unfused (target: the same, ≤ 3 µs per patched node), each beside a quiet ``update()``
   and the driver's part of the patch in the same run: ``cuGraphExecKernelNodeSetParams`` of the node
   the change patches (the fused kernel's node, all the group's arguments; unfused, the block's node)
   plus ``cuGraphLaunch``, minus a bare ``cuGraphLaunch`` of the same graph.

Usage: ``python benchmarks/bench_fusion.py [--blocks 100] [--edits 50] [--launch-variants]``
(``--launch-variants``: our fused kernel also at block sizes 64-512, 1, 2, 4 elements per thread and
both ways of reading its scalars, per kernel, at both sizes). Writes ``fusion.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))


from _results import write_results  # noqa: E402
from _timing import bare_set_params_launch_us, gpu_ms, patched_node, update_us  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Expression, Scale  # noqa: E402
from cudapatch.expr.bytecode import INTERPRETERS, assemble, patch_program  # noqa: E402
from cudapatch.expr.ptx_gen import ptx_version_for  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402


def chain(e: Engine, n_blocks: int, x: np.ndarray) -> list[Scale]:
    rng = np.random.default_rng(1)
    blocks = [
        e.add(Scale(Factor=float(rng.uniform(0.9, 1.1)), Offset=float(rng.uniform(-0.1, 0.1)))) for _ in range(n_blocks)
    ]
    e.bind(blocks[0], "In", x)
    for a, b in zip(blocks, blocks[1:], strict=False):
        e.connect(a, "Out", b, "In")
    return blocks


def launch_variants(
    e: Engine, g, node, blocks=(64, 128, 256, 512), per_thread=(1, 2, 4), loads=("param", "prefetched")
) -> list[dict]:
    """Our fused kernel at other launch shapes, each measured per kernel as ``fused kernel`` is: the
    group's program generated with ``per_thread`` elements per thread (``FusedSource.per_thread``) and
    its scalars read as ``loads`` says (``FusedSource.scalar_loads``: ``ld.param``, or prefetched lines
    read through generic addresses), the same arguments, ``block`` threads per block and the grid that
    covers the count. What the fusion phase's choice (``FUSED_PER_THREAD``, ``FUSED_PER_THREAD_FROM``,
    ``FUSED_SMALL_BLOCK``, ``FUSED_SMALL_SCALAR_LOADS``, ``BLOCK_SIZE``) is worth at this size."""
    import dataclasses

    base = g._nodes[node.index].params  # the running node's arguments (kernelParams) are shared by every variant
    count = node.args[-1].value  # the launch's element count, the node's last argument
    rows = []
    for k, how in ((k, how) for k in per_thread for how in loads):
        source = dataclasses.replace(node.source, per_thread=k, scalar_loads=how, jit="full")
        function = e.kernels.builder.build(source).function
        for block in blocks:
            p = d.CUDA_KERNEL_NODE_PARAMS()
            p.func = function
            p.gridDimX, p.gridDimY, p.gridDimZ = max(1, -(-count // (block * k))), 1, 1
            p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
            p.sharedMemBytes, p.kernelParams, p.extra = 0, base.kernelParams, base.extra  # pointers or one buffer
            rows.append(
                {
                    "per_thread": k,
                    "scalar_loads": how,
                    "block": block,
                    "grid": p.gridDimX,
                    "kernel_ms": kernel_graph_ms(p, e.resources.stream),
                }
            )
    return rows


def bench_chain(n_blocks: int, elements: int, variants: bool = False) -> dict:
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
            stream = e.resources.stream
            row["fused_nodes" if fuse else "unfused_nodes"] = len(g.plan.nodes)  # every node the frame launches
            row["fused_ms" if fuse else "unfused_ms"] = gpu_ms(lambda g=g, s=stream: g.launch(s), stream)
            if fuse:
                (node,) = g.plan.nodes  # level None: the fused kernel and nothing else
                row["fused_launch"] = {
                    "grid": node.grid,
                    "block": node.block,
                    "per_thread": node.source.per_thread,
                    "scalar_loads": node.source.scalar_loads,
                }
                # The node's CUDA_KERNEL_NODE_PARAMS as the executable graph holds them (no public accessor).
                row["fused_kernel_ms"] = kernel_graph_ms(g._nodes[node.index].params, stream)
                e.device.make_current()  # the empty kernel's module loads into the engine's context
                row["empty_frame_ms"] = empty_frame_ms(e.device.arch, stream)
                if variants:
                    row["launch_variants"] = launch_variants(e, g, node)
                results["generic"] = e.read(blocks[-1], "Out")
                # Resting values: the Specializer swaps in a build with them compiled in (engine/specialize.py).
                end = time.perf_counter() + 10.0
                while e.counters.specializations < 1 and time.perf_counter() < end:
                    e.update()
                    time.sleep(0.01)
                e.synchronize()
                if e.counters.specializations:
                    row["special_ms"] = gpu_ms(lambda g=g, s=stream: g.launch(s), stream)
                    row["special_kernel_ms"] = kernel_graph_ms(g._nodes[node.index].params, stream)
                    results["special"] = e.read(blocks[-1], "Out")
            results[fuse] = e.read(blocks[-1], "Out")
    row["bitwise_equal"] = bool(np.array_equal(results["generic"], results[False]))
    if "special" in results:
        row["special_bitwise_equal"] = bool(np.array_equal(results["special"], results[False]))
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
        row["cupy_calls_ms"] = gpu_ms(lambda: fused(xd), stream)
        row["cupy_max_abs_diff"] = float(cp.max(cp.abs(out - cp.asarray(results[True]))))
        row["cupy_fuse_ms"] = cupy_graph_ms(cp, fused, xd)  # per kernel: 200 calls in one graph
        row["cupy_frame_ms"] = cupy_graph_ms(cp, fused, xd, calls=1, frames=200)  # per frame: a graph per call
        # The same chain with its factors and offsets as arguments (float32 scalars: kernel parameters, as
        # ours are, so an edit needs no compile), where the call above compiles them into its code.
        with_args = _fuse_with_scalar_args(cp, n_blocks)
        values = [np.float32(v) for pair in factors for v in pair]
        call = lambda v: with_args(v, *values)  # noqa: E731
        row["cupy_args_max_abs_diff"] = float(cp.max(cp.abs(call(xd) - cp.asarray(results[True]))))
        row["cupy_args_ms"] = cupy_graph_ms(cp, call, xd)
        row["cupy_args_frame_ms"] = cupy_graph_ms(cp, call, xd, calls=1, frames=200)
    except ImportError:
        row["cupy_fuse_ms"] = row["cupy_calls_ms"] = row["cupy_frame_ms"] = None
        row["cupy_args_ms"] = row["cupy_args_frame_ms"] = None
    return row


def _fuse_with_scalar_args(cp, n_blocks: int):
    """``cupy.fuse`` of ``v = v * f_i + o_i`` for i < ``n_blocks`` with every ``f_i``, ``o_i`` an argument
    (cupy.fuse takes no ``*args``: the function is written out)."""
    names = [f"{k}{i}" for i in range(n_blocks) for k in ("f", "o")]
    body = "".join(f"    v = v * f{i} + o{i}\n" for i in range(n_blocks))
    scope: dict = {}
    exec(f"def chain(v, {', '.join(names)}):\n{body}    return v\n", scope)  # noqa: S102 - our own text
    return cp.fuse()(scope["chain"])


def cupy_graph_ms(cp, fused, xd, calls: int = 200, frames: int = 1) -> float | None:
    """GPU ms per call of ``fused(xd)``: ``calls`` calls captured into one CUDA graph on a CuPy stream,
    launched ``frames`` times in a row, events around the launches (median of 5), so no Python launch
    cost counts. ``calls=200, frames=1``: per kernel inside a graph; ``calls=1, frames=200``: per frame,
    a graph launch each, as the engine's frames. Each call allocates its output from CuPy's pool; the
    warm-up leaves a free block of that size, so the capture never allocates device memory. None (with
    the reason printed) where this CuPy cannot capture."""
    stream = cp.cuda.Stream(non_blocking=True)
    try:
        with stream:
            for _ in range(3):
                fused(xd)
            stream.synchronize()
            stream.begin_capture()
            try:
                for _ in range(calls):
                    out = fused(xd)
            finally:
                graph = stream.end_capture()
            del out
            graph.launch(stream)
            stream.synchronize()
            return gpu_ms(lambda: graph.launch(stream), stream.ptr, frames=frames) / calls
    except Exception as exc:  # an older CuPy, or a capture it refuses
        print(f"   (cupy.fuse graph capture failed: {type(exc).__name__}: {exc})")
        return None


def _chained_graph_ms(params, stream, calls: int, frames: int) -> float:
    """GPU ms per kernel of ``calls`` copies of one kernel node (``CUDA_KERNEL_NODE_PARAMS``; the driver
    copies them at each add) chained in one raw graph, launched ``frames`` times (median of 5)."""
    graph = check(d.cuGraphCreate(0))
    try:
        prev: list = []
        for _ in range(calls):
            prev = [check(d.cuGraphAddKernelNode(graph, prev, len(prev), params))]
        gexec = check(d.cuGraphInstantiate(graph, 0))
        try:
            check(d.cuGraphLaunch(gexec, stream))  # the first launch uploads the graph: not timed
            check(d.cuStreamSynchronize(stream))
            return gpu_ms(lambda: d.cuGraphLaunch(gexec, stream), stream, frames=frames) / calls
        finally:
            check(d.cuGraphExecDestroy(gexec))
    finally:
        check(d.cuGraphDestroy(graph))


def kernel_graph_ms(params, stream, calls: int = 200) -> float:
    """Our fused kernel measured as ``cupy graph`` measures ``cupy.fuse``: ``calls`` copies of the
    running graph's kernel node in one graph, launched once (GPU ms per kernel)."""
    return _chained_graph_ms(params, stream, calls, frames=1)


def empty_frame_ms(arch: str, stream) -> float:
    """GPU ms per frame of a graph holding one empty kernel (one thread), launched once per frame for
    200 frames: what a graph launch costs the device before any work (the floor of a frame)."""
    ptx = (
        f".version {ptx_version_for(arch)}\n.target {arch}\n.address_size 64\n.visible .entry empty()\n{{\n\tret;\n}}\n"
    )
    module = check(d.cuModuleLoadData(ptx.encode() + b"\0"))
    try:
        p = d.CUDA_KERNEL_NODE_PARAMS()
        p.func = check(d.cuModuleGetFunction(module, b"empty"))
        p.gridDimX = p.gridDimY = p.gridDimZ = p.blockDimX = p.blockDimY = p.blockDimZ = 1
        p.sharedMemBytes, p.kernelParams, p.extra = 0, 0, 0
        return _chained_graph_ms(p, stream, calls=1, frames=200)
    finally:
        check(d.cuModuleUnload(module))


def _p95(times: list[float]) -> float:
    times = sorted(times)
    return times[min(len(times) - 1, int(0.95 * len(times)))]


def bench_edits(edits: int, compiler: str) -> dict:
    """Edit → live (``code_swaps`` counts the edit's first build swapped in) and, for the PTX path, edit
    → optimised (``kernel_upgrades`` counts its optimised build swapped in after that), in ms."""
    x = np.random.default_rng(0).standard_normal(4096).astype(np.float32)
    live, optimised = [], []
    salt = time.time_ns() % 1_000_000  # constants no run has compiled before: no cache anywhere helps
    with Engine(cache_dir=False) as e:
        block = e.add(Expression(Code="x * Gain + 0.5", Gain=2.0, Compiler=compiler))
        e.bind(block, "x", x)
        e.wait_ready()
        if compiler == "ptx":  # what a live host has once the block's first build has run a while
            INTERPRETERS.get(1, 1, e.device.arch, wait=True)
        upgrades = block.source.upgrade() is not None
        deadline = time.monotonic() + 2.0
        while upgrades and e.counters.kernel_upgrades == 0 and time.monotonic() < deadline:
            e.update()  # the first build's optimised kernel: out of the way before the first edit
        e.update()
        for i in range(edits):
            e.synchronize()
            swaps, ups = e.counters.code_swaps, e.counters.kernel_upgrades
            t = time.perf_counter_ns()
            block.set("Code", f"x * Gain + {salt}.{i:03d}")
            while e.counters.code_swaps == swaps:  # frames as fast as they come: the frame loop of a live host
                e.update()
            live.append((time.perf_counter_ns() - t) / 1e6)
            deadline = time.monotonic() + 2.0
            while upgrades and e.counters.kernel_upgrades == ups and time.monotonic() < deadline:
                e.update()
            if upgrades and e.counters.kernel_upgrades > ups:
                optimised.append((time.perf_counter_ns() - t) / 1e6)
        e.update()
        got = e.read(block, "Out")
        expected = x * np.float32(2.0) + np.float32(f"{salt}.{edits - 1:03d}")
        assert np.array_equal(got, expected), "the last edit is not what runs"
    row = {"compiler": compiler, "edits": edits, "median_ms": statistics.median(live), "p95_ms": _p95(live)}
    if optimised:
        row.update(optimised_median_ms=statistics.median(optimised), optimised_p95_ms=_p95(optimised))
        row["optimised_edits"] = len(optimised)
    return row


def bench_compile_paths(reps: int = 20) -> dict:
    """The compile step alone, per path, for the same small expression: generating the PTX text, the
    driver's JIT of it (``cuModuleLoadData`` + ``cuFuncLoad``), nvJitLink to a cubin, NVRTC of the
    generated CUDA C++ (medians, ms)."""
    import hashlib

    from cudapatch.expr import NVRTC_OPTIONS, compile_expression, generate_cuda, generate_ptx, single
    from cudapatch.kernels._toolchain import link_ptx, nvrtc_compile
    from cudapatch.kernels.source import KernelImage

    salt = time.time_ns() % 1_000_000
    from cudapatch.expr.source import QUICK_JIT_LEVEL

    gen, quick, jit, link, nvrtc, interp = [], [], [], [], [], []
    with Engine(cache_dir=False) as e:
        arch = e.device.arch
        e.device.make_current()  # the modules load into the engine's context, on this thread
        for i in range(reps):
            program = single(compile_expression(f"a * sin(x * Freq) + b * {salt}.{i:03d}"))
            if i == 0:
                ti = time.perf_counter_ns()
                cubin, symbol = INTERPRETERS.get(3, 1, arch, wait=True) or (b"", "")
                interp_compile_ms = (time.perf_counter_ns() - ti) / 1e6
            if cubin:  # the interpreted quick build: bytecode into a copy of the cubin, load it
                ti = time.perf_counter_ns()
                image = patch_program(cubin, assemble(program))  # type: ignore[arg-type]
                key = hashlib.sha256(image).hexdigest()
                e.modules.function(KernelImage(program.descriptor, image, "cubin", key, "bench", symbol=symbol))
                interp.append((time.perf_counter_ns() - ti) / 1e6)
            t0 = time.perf_counter_ns()
            ptx = generate_ptx(program, arch).encode() + b"\0"
            t1 = time.perf_counter_ns()
            key = hashlib.sha256(ptx).hexdigest()
            low = KernelImage(program.descriptor, ptx, "ptx", f"{key}-quick", "bench", jit_level=QUICK_JIT_LEVEL)
            e.modules.function(low)  # the same text twice: the driver's JIT cache is per level (we salt anyway)
            t1q = time.perf_counter_ns()
            quick.append((t1q - t1) / 1e6)
            t1 = time.perf_counter_ns()
            e.modules.function(KernelImage(program.descriptor, ptx, "ptx", key, "bench"))
            t2 = time.perf_counter_ns()
            link_ptx(ptx, name="bench.ptx", arch=arch)
            t3 = time.perf_counter_ns()
            nvrtc_compile(generate_cuda(program), name="bench.cu", entry="expression", arch=arch, options=NVRTC_OPTIONS)
            t4 = time.perf_counter_ns()
            gen.append((t1q - t0) / 1e6 - quick[-1])
            jit.append((t2 - t1) / 1e6)
            link.append((t3 - t2) / 1e6)
            nvrtc.append((t4 - t3) / 1e6)
    med = statistics.median
    return {
        "generate_ms": med(gen),
        "quick_jit_ms": med(quick),
        "driver_jit_ms": med(jit),
        "nvjitlink_ms": med(link),
        "nvrtc_ms": med(nvrtc),
        "quick_level": QUICK_JIT_LEVEL,
        "interpreted_ms": med(interp) if interp else None,
        "interpreter_compile_ms": interp_compile_ms,
    }


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
            quiet = update_us(e, calls, 50)
            # the driver's part: the node this change patches (in a fused chain, the group's kernel)
            set_launch, launch = bare_set_params_launch_us(e, patched_node(e, target.id, "Factor"), calls)
        key = "fused" if fuse else "unfused"
        row[f"{key}_hot_update_us"] = statistics.median(times) / 1e3
        row[f"{key}_quiet_update_us"] = quiet
        row[f"{key}_bare_set_params_launch_us"] = set_launch
        row[f"{key}_bare_launch_us"] = launch
    return row


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


def _ratio(ours: float, peer: float | None) -> str:
    return "-" if peer is None else f"{ours / peer:.2f}x"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--edits", type=int, default=50)
    ap.add_argument(
        "--launch-variants",
        action="store_true",
        help="also time our fused kernel at other block sizes and elements per thread",
    )
    args = ap.parse_args()
    logging.getLogger("cudapatch").setLevel(logging.ERROR)
    report: dict = {"chains": [], "edits": [], "hot": None}
    print(f"1. chain of {args.blocks} Scale blocks: GPU ms")
    head = ("elements", "fused", "unfused", "cupy frame", "empty frame", "unfused/fused", "frame/frame")
    print("   per frame (a graph launch each):")
    print("{:>10} {:>9} {:>9} {:>11} {:>12} {:>14} {:>12} bitwise".format(*head))
    rows = []
    for elements in (1024, 1 << 20):
        r = bench_chain(args.blocks, elements, variants=args.launch_variants)
        report["chains"].append(r)
        rows.append(r)
        fused, unfused, frame = r["fused_ms"], r["unfused_ms"], r["cupy_frame_ms"]
        print(
            f"{elements:>10} {fused:>9.4f} {unfused:>9.4f} {_ms(frame):>11} {r['empty_frame_ms']:>12.4f} "
            f"{unfused / fused:>13.1f}x {_ratio(fused, frame):>12} {r['bitwise_equal']}"
        )
    print("   per kernel (200 launches in one graph), and cupy.fuse called from Python:")
    head = ("elements", "fused kernel", "cupy graph", "kernel/kernel", "frame/cupy graph", "cupy calls", "launch")
    print("{:>10} {:>13} {:>11} {:>14} {:>17} {:>11}  {}".format(*head))
    for r in rows:
        kernel, graph = r["fused_kernel_ms"], r["cupy_fuse_ms"]
        launch = "grid {grid} x {block}, {per_thread}/thread, scalars {scalar_loads}".format(**r["fused_launch"])
        print(
            f"{r['elements']:>10} {kernel:>13.4f} {_ms(graph):>11} {_ratio(kernel, graph):>14} "
            f"{_ratio(r['fused_ms'], graph):>17} {_ms(r['cupy_calls_ms']):>11}  {launch}"
        )
    print("   specialised: the same fused kernel once its scalars rest, rebuilt with their values compiled in:")
    head = ("elements", "frame", "kernel", "frame/cupy frame", "kernel/cupy graph", "bitwise")
    print("{:>10} {:>9} {:>9} {:>17} {:>18} {:>8}".format(*head))
    for r in rows:
        if "special_ms" not in r:
            print(f"{r['elements']:>10}   (not specialised within 10 s)")
            continue
        print(
            f"{r['elements']:>10} {r['special_ms']:>9.4f} {r['special_kernel_ms']:>9.4f} "
            f"{_ratio(r['special_ms'], r['cupy_frame_ms']):>17} "
            f"{_ratio(r['special_kernel_ms'], r['cupy_fuse_ms']):>18} "
            f"{r['special_bitwise_equal']!s:>8}"
        )
    print("   cupy.fuse with the factors and offsets as float32 arguments (kernel parameters, as ours):")
    head = ("elements", "args kernel", "kernel/kernel", "args frame", "frame/frame")
    print("{:>10} {:>12} {:>14} {:>11} {:>12}".format(*head))
    for r in rows:
        kernel, frame = r.get("cupy_args_ms"), r.get("cupy_args_frame_ms")
        print(
            f"{r['elements']:>10} {_ms(kernel):>12} {_ratio(r['fused_kernel_ms'], kernel):>14} {_ms(frame):>11} "
            f"{_ratio(r['fused_ms'], frame):>12}"
        )
    for r in rows:
        if "launch_variants" in r:
            print(
                f"   our fused kernel at other launch shapes, {r['elements']} elements "
                "(GPU ms per kernel, 200 in a graph):"
            )
            for v in r["launch_variants"]:
                print(
                    "     {per_thread}/thread, scalars {scalar_loads:<10}, block {block:>4}, grid {grid:>6}: "
                    "{kernel_ms:.4f}".format(**v)
                )
    print(f"2. Expression edit -> running, {args.edits} edits (ms): live = it runs, optimised = its optimised build")
    for compiler in ("ptx", "nvrtc"):
        r = bench_edits(args.edits, compiler)
        report["edits"].append(r)
        line = f"   {compiler:<6} live median {r['median_ms']:.2f}  p95 {r['p95_ms']:.2f}"
        if "optimised_median_ms" in r:
            line += (
                f"   optimised median {r['optimised_median_ms']:.2f}  p95 {r['optimised_p95_ms']:.2f}"
                f"  ({r['optimised_edits']}/{r['edits']} edits)"
            )
        print(line)
    ptx, nvrtc = report["edits"]
    print(f"   NVRTC / PTX live median: {nvrtc['median_ms'] / ptx['median_ms']:.1f}x")
    paths = bench_compile_paths()
    report["compile_paths"] = paths
    print(
        "   the compile step alone (median ms): generate PTX {generate_ms:.3f}, driver JIT at level {quick_level} "
        "{quick_jit_ms:.2f}, at the default {driver_jit_ms:.2f}, nvJitLink {nvjitlink_ms:.2f}, "
        "NVRTC {nvrtc_ms:.2f}".format(**paths)
    )
    interpreted = paths["interpreted_ms"]
    print(
        "   interpreted quick build (bytecode into the interpreter's cubin + load): "
        + ("-" if interpreted is None else f"{interpreted:.3f}")
        + f"; the interpreter's NVRTC compile, once per signature: {paths['interpreter_compile_ms']:.1f}"
    )
    r = bench_hot(args.blocks)
    report["hot"] = r
    print("3. Hot change of one scalar, set() + update() host µs, beyond a quiet update() beside the driver's part")
    print("   (bare SetParams of the patched node + launch, minus a bare launch; same graph, same run)")
    for key in ("fused", "unfused"):
        hot, quiet = r[f"{key}_hot_update_us"], r[f"{key}_quiet_update_us"]
        bare = r[f"{key}_bare_set_params_launch_us"] - r[f"{key}_bare_launch_us"]
        print(
            f"   {key:<8} {hot:.1f}  (quiet {quiet:.1f}): +{hot - quiet:.2f} beside bare SetParams+launch − launch "
            f"+{bare:.2f}  ratio {_ratio(hot - quiet, bare)}"
        )
    write_results("fusion.json", report, indent=2)


if __name__ == "__main__":
    main()
