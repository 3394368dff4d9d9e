#!/usr/bin/env python3
"""Captured library calls: update costs and in-graph GPU time beside eager calls, same run.

Prints:
- Recapture tier: host time of a rebind that re-captures a GEMM and swaps the child graph
  (``engine.bind`` + ``engine.update``), minus a clean ``update``; target <= 0.5 ms.
- Device scalar: host time of ``GEMM.set("Alpha")`` + ``update`` (a pinned write and an 8-byte
  copy, no re-capture), minus a clean update; target <= 10 us.
- GPU time per call of a GEMM (f32 2048^3, f64 1024^3) and an FFT (C2C 2^20 x 8, 2-D 2048^2)
  inside our graph vs the same library call issued eagerly on a stream (same handle settings,
  same workspace size), and CuPy's matmul/fft as a second peer; target ratio <= 1.05.

Run on the GPU machine: ``bash .gpu/run.sh python3 benchmarks/bench_library.py``.
"""

from __future__ import annotations

import statistics
import time

import cupy as cp
import numpy as np
from cuda.bindings import driver as d

from cudapatch import Engine
from cudapatch.blocks.captured import nvmath_module
from cudapatch.blocks.library import FFT, GEMM

REPS = 200


def _median_us(fn, reps: int = REPS) -> float:
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


def _gpu_ms(stream, issue, reps: int = 50) -> float:
    """Median GPU ms of ``issue()`` (work enqueued on ``stream``), by events around each."""
    start = [d.cuEventCreate(0)[1] for _ in range(reps)]
    end = [d.cuEventCreate(0)[1] for _ in range(reps)]
    for _ in range(5):
        issue()
    for i in range(reps):
        d.cuEventRecord(start[i], stream)
        issue()
        d.cuEventRecord(end[i], stream)
    d.cuStreamSynchronize(stream)
    times = [d.cuEventElapsedTime(start[i], end[i])[1] for i in range(reps)]
    for ev in start + end:
        d.cuEventDestroy(ev)
    return statistics.median(times)


def update_costs() -> None:
    with Engine(wait_for_compile=True) as engine:
        n = 512
        a = [cp.asarray(np.random.rand(n * n).astype(np.float32)) for _ in range(2)]
        g = engine.add(GEMM(M=n, N=n, K=n))
        engine.bind(g, "A", a[0])
        engine.bind(g, "B", np.random.rand(n * n).astype(np.float32))
        engine.wait_ready()
        engine.update()
        engine.synchronize()

        def clean():
            engine.update()
            engine.synchronize()

        state = {"i": 0}

        def rebind():
            state["i"] ^= 1
            engine.bind(g, "A", a[state["i"]])
            engine.update()
            engine.synchronize()

        def alpha():
            state["i"] ^= 1
            g.set("Alpha", 1.0 + state["i"])
            engine.update()
            engine.synchronize()

        base = _median_us(clean)
        before = engine.counters.recaptures
        recap = _median_us(rebind)
        assert engine.counters.recaptures - before >= REPS
        child = engine.graph.captured_graph(g.id)
        before = engine.counters.recaptures
        dev = _median_us(alpha)
        assert engine.counters.recaptures == before and engine.graph.captured_graph(g.id) is child
        # The Hot path itself, without the frame: what the host pays to change alpha.
        graph = engine.graph
        direct = _median_us(lambda: graph.update_scalars({(g.id, "Alpha"): 2.0}), reps=2000)
        engine.synchronize()
        print("update tier                          host us    target")
        print(f"recapture + child swap (GEMM)       {recap - base:8.1f}    <= 500")
        print(f"device alpha via set + update       {dev - base:8.1f}    <= 10")
        print(f"device alpha, update_scalars alone  {direct:8.1f}")
        print(f"(clean update + sync: {base:.1f} us)")


def gpu_times() -> None:
    blas, fft = nvmath_module("cublas"), nvmath_module("cufft")
    rows = []
    with Engine(wait_for_compile=True) as engine:
        stream = engine.device.stream
        sint = int(stream)
        cs = cp.cuda.ExternalStream(sint)
        for precision, n in (("float", 2048), ("double", 1024)):
            dt = np.float32 if precision == "float" else np.float64
            g = engine.add(GEMM(name=f"gemm_{precision}", M=n, N=n, K=n, Precision=precision))
            A = cp.asarray(np.random.rand(n * n).astype(dt))
            B = cp.asarray(np.random.rand(n * n).astype(dt))
            engine.bind(g, "A", A)
            engine.bind(g, "B", B)
            engine.wait_ready()
            ours = _gpu_ms(stream, lambda: engine.graph.launch(stream))
            # Eager: the same call, same handle settings (device pointer mode, same workspace size).
            h = blas.create()
            blas.set_pointer_mode(h, 1)
            blas.set_stream(h, sint)
            ws = cp.empty(engine.libraries.cublas_workspace_bytes, cp.uint8)
            blas.set_workspace(h, ws.data.ptr, ws.nbytes)
            al, be = cp.ones(1, dt), cp.zeros(1, dt)
            C = cp.empty(n * n, dt)
            call = blas.sgemm if dt is np.float32 else blas.dgemm

            def eager(call=call, h=h, n=n, A=A, B=B, C=C, al=al, be=be):
                call(h, 0, 0, n, n, n, al.data.ptr, B.data.ptr, n, A.data.ptr, n, be.data.ptr, C.data.ptr, n)

            eager_ms = _gpu_ms(stream, eager)
            with cs:
                Am, Bm = A.reshape(n, n), B.reshape(n, n)
                cupy_ms = _gpu_ms(stream, lambda Am=Am, Bm=Bm: cp.matmul(Am, Bm))
            blas.destroy(h)
            rows.append((f"GEMM {precision} {n}^3", ours, eager_ms, cupy_ms))
            engine.remove(g)
        for label, nx, ny, batch in (("FFT C2C 2^20 x8", 1 << 20, 1, 8), ("FFT C2C 2-D 2048^2", 2048, 2048, 1)):
            f = engine.add(FFT(name=label, Nx=nx, Ny=ny))
            count = nx * ny * batch
            X = cp.asarray(np.random.rand(count * 2).astype(np.float32))
            engine.bind(f, "In", X.reshape(-1, 2))
            engine.wait_ready()
            ours = _gpu_ms(stream, lambda: engine.graph.launch(stream))
            plan = fft.create()
            dims = [ny, nx] if ny > 1 else [nx]
            fft.make_plan_many(plan, len(dims), dims, 0, 1, 0, 0, 1, 0, fft.Type.C2C, batch)
            fft.set_stream(plan, sint)
            Y = cp.empty(count * 2, cp.float32)
            eager_ms = _gpu_ms(stream, lambda plan=plan, X=X, Y=Y: fft.exec_c2c(plan, X.data.ptr, Y.data.ptr, -1))
            fft.destroy(plan)
            with cs:
                Xc = X.view(cp.complex64).reshape((batch, ny, nx) if ny > 1 else (batch, nx))
                cupy_ms = _gpu_ms(stream, lambda Xc=Xc, ny=ny: cp.fft.fft2(Xc) if ny > 1 else cp.fft.fft(Xc, axis=-1))
            rows.append((label, ours, eager_ms, cupy_ms))
            engine.remove(f)
    print()
    print("GPU ms per call                ours (graph)   eager   ours/eager   CuPy   ours/CuPy")
    for label, ours, eager_ms, cupy_ms in rows:
        print(f"{label:28s} {ours:10.3f} {eager_ms:9.3f} {ours / eager_ms:10.3f}  {cupy_ms:8.3f} {ours / cupy_ms:8.3f}")
    print("target: ours/eager <= 1.05")


if __name__ == "__main__":
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    update_costs()
    gpu_times()
