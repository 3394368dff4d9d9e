#!/usr/bin/env python3
"""Diagnostic: what stalls the frame thread while kernels compile in the background?

Runs a 100-block patch and times update() while another thread does, in turn: nothing, a
pure-Python busy loop (GIL contention), NVRTC compiles, cuModuleLoadData of cubins, and Numba
compiles. Prints the median and worst update() time for each, and compile-phase timings.
"""

from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuda.bindings import driver as d  # noqa: E402

from cudapatch import CudaSource, Engine, NumbaSource, Scale  # noqa: E402
from cudapatch.kernels._toolchain import link_ptx, nvrtc_compile  # noqa: E402

CODE = (
    'extern "C" __global__ void k(const float* in, float* out, float g, unsigned n)'
    "{ unsigned i = blockIdx.x*blockDim.x+threadIdx.x; if (i<n) out[i]=in[i]*g+VALUE; }"
)


def main() -> None:
    eng = Engine(wait_for_compile=True)
    blocks = [eng.add(Scale(name=f"s{i}")) for i in range(100)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        eng.connect(a, "Out", b, "In")
    eng.bind(blocks[0], "In", np.ones(1024, np.float32))
    eng.update()
    eng.synchronize()
    arch = eng.device.arch
    ctx = eng.device.context
    cubin = CudaSource(code=CODE.replace("VALUE", "1.0f")).compile(arch).image

    def frames(seconds: float) -> list[float]:
        out = []
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            t = time.perf_counter()
            eng.update()
            out.append(time.perf_counter() - t)
            if len(out) % 50 == 0:
                eng.synchronize()
            time.sleep(0.0005)
        return out

    def busy(stop: threading.Event) -> None:
        while not stop.is_set():
            sum(i * i for i in range(2000))

    def nvrtc(stop: threading.Event) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            nvrtc_compile(CODE.replace("VALUE", f"{i}.0f"), name="k.cu", entry="k", arch=arch)

    def modload(stop: threading.Event) -> None:
        d.cuCtxSetCurrent(ctx)
        while not stop.is_set():
            err, mod = d.cuModuleLoadData(cubin)
            d.cuModuleUnload(mod)

    def numba(stop: threading.Event) -> None:
        from numba import cuda

        def k(out, x, a, n):  # noqa: ANN001
            i = cuda.grid(1)
            if i < n:
                out[i] = a * x[i]

        while not stop.is_set():
            NumbaSource(k, ("float32[:]", "float32[:]", "float32", "int32")).compile(arch)

    print(f"{'background work':28} {'median µs':>10} {'p99 µs':>10} {'max µs':>10}")
    for name, fn in [
        ("none", None),
        ("python busy loop", busy),
        ("NVRTC compiles", nvrtc),
        ("cuModuleLoadData", modload),
        ("Numba compiles", numba),
    ]:
        stop = threading.Event()
        th = threading.Thread(target=fn, args=(stop,), daemon=True) if fn else None
        if th:
            th.start()
            time.sleep(0.2)
        ts = frames(2.0)
        stop.set()
        if th:
            th.join()
        ts.sort()
        print(
            f"{name:28} {statistics.median(ts) * 1e6:10.1f} {ts[int(len(ts) * 0.99)] * 1e6:10.1f} {ts[-1] * 1e6:10.1f}"
        )
    # Compile-phase costs.
    t = time.perf_counter()
    for i in range(10):
        nvrtc_compile(CODE.replace("VALUE", f"{i}.5f"), name="k.cu", entry="k", arch=arch)
    base = (time.perf_counter() - t) / 10
    t = time.perf_counter()
    for i in range(10):
        nvrtc_compile(CODE.replace("VALUE", f"{i}.25f"), name="k.cu", entry="k", arch=arch, options=("-minimal",))
    minimal = (time.perf_counter() - t) / 10
    print(f"NVRTC small kernel: {base * 1e3:.1f} ms; with -minimal: {minimal * 1e3:.1f} ms")
    from numba import cuda

    def k(out, x, a, n):  # noqa: ANN001
        i = cuda.grid(1)
        if i < n:
            out[i] = a * x[i]

    sig = NumbaSource(k, ("float32[:]", "float32[:]", "float32", "int32"))._numba_types()
    cuda.compile_ptx(k, sig, device=False, cc=(9, 0))
    t = time.perf_counter()
    ptx, _ = cuda.compile_ptx(k, sig, device=False, cc=(9, 0))
    tp = time.perf_counter() - t
    t = time.perf_counter()
    link_ptx(ptx.encode(), name="k", arch=arch)
    tl = time.perf_counter() - t
    print(f"Numba compile_ptx: {tp * 1e3:.1f} ms; nvJitLink of its PTX: {tl * 1e3:.1f} ms")
    eng.close()


if __name__ == "__main__":
    main()
