#!/usr/bin/env python3
"""04 — library calls: cuRAND, cuFFT and cuBLAS captured into the same CUDA graph as kernels.

What it teaches: library blocks (``Random``, ``FFT``, ``GEMM``) are captured into child-graph
nodes and linked like kernel blocks; a block of your own adds a library call with
``add_captured`` (here a cuBLAS saxpy); editing ``Alpha`` is a device write (no re-capture),
editing ``StdDev`` re-captures the call in place, and nothing is rebuilt.

What you should see: a line per reported frame with the spectrum's energy and the tier counters
(``recaptures`` grows only when StdDev changes, ``rebuilds`` stays 1), ending with
``OK: FFT, GEMM and saxpy match NumPy``.

Run: ``python examples/04_library_calls.py [--headless] [--frames N]`` (needs a CUDA GPU and the
CUDA math libraries: ``pip install -e ".[libs]"``).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from cudapatch import Block, CallDescriptor, Engine, buffer_in, buffer_out, device_scalar, host_scalar, like
from cudapatch._examples import example_main
from cudapatch.blocks.library import FFT, GEMM, Random

SAXPY = CallDescriptor.of(
    "saxpy", buffer_in("X", "float"), buffer_out("Y", "float"), host_scalar("N", "int"), device_scalar("Alpha", "float")
)


def saxpy(stream, pointers, scalars, libs):
    """Y = Alpha * X + Y, issued inside the capture on the engine's cuBLAS handle."""
    from nvmath.bindings import cublas

    h = libs.cublas(stream)
    cublas.saxpy(h, scalars["N"], pointers["Alpha"], pointers["X"], 1, pointers["Y"], 1)


class Saxpy(Block):
    """``Y += Alpha * X`` (cuBLAS saxpy): Y keeps its contents, so it accumulates frame after frame."""

    def describe(self, b):
        c = b.add_captured(saxpy, SAXPY)
        b.input("X", c.in_("X"))
        b.output("Y", c.out("Y"), size=like("X"))
        c.set_count("N", like("X"))
        b.scalar("Alpha", c.in_("Alpha"), default=1.0)


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headless", action="store_true", help="no window (this example never opens one)")
    ap.add_argument("--frames", type=int, default=120)
    args = ap.parse_args(argv)
    n, rows = 1024, 64

    with Engine() as engine:
        noise = engine.add(Random(name="noise", Count=n * rows, Normal=1))
        spectrum = engine.add(FFT(name="spectrum", Kind="R2C", Nx=n))
        mix = engine.add(GEMM(name="mix", M=rows, N=rows, K=n, TransB=1))
        acc = engine.add(Saxpy(name="acc"))
        engine.connect(noise, "Out", spectrum, "In")
        engine.connect(noise, "Out", mix, "A")  # 64 x 1024 noise times its own transpose: a Gram matrix
        engine.connect(noise, "Out", mix, "B")
        engine.connect(noise, "Out", acc, "X")
        engine.wait_ready()
        engine.output(acc, "Y").fill_bytes(0)  # the accumulator starts at zero
        print(f"device: {engine.device.name}")

        for frame in range(args.frames):
            mix.set("Alpha", 1.0 / n)  # a device write: no re-capture
            if frame % 40 == 20:
                noise.set("StdDev", 1.0 + frame / 40)  # a host-mode cuRAND argument: re-captured in place
            engine.update()
            if frame % 30 == 0 or frame == args.frames - 1:
                c = engine.counters
                print(f"frame {frame:4d}: rebuilds={c.rebuilds} recaptures={c.recaptures} hot={c.hot_updates}")

        # Check one frame against NumPy (reading synchronizes: only for checking).
        acc.set("Alpha", 0.5)
        engine.update()
        engine.synchronize()
        before = engine.read(acc, "Y").astype(np.float64)
        engine.update()
        x = engine.read(noise, "Out").astype(np.float64)
        spec = engine.read(spectrum, "Out").view(np.complex64).reshape(rows, n // 2 + 1)
        gram = engine.read(mix, "C").reshape(rows, rows)
        after = engine.read(acc, "Y").astype(np.float64)
        xm = x.reshape(rows, n)
        ok_fft = np.allclose(spec, np.fft.rfft(xm, axis=1), rtol=1e-3, atol=1e-2 * np.sqrt(n))
        ok_gemm = np.allclose(gram, xm @ xm.T / n, rtol=1e-3, atol=1e-3)
        ok_saxpy = np.allclose(after, before + 0.5 * x, rtol=1e-5, atol=1e-4)
        if ok_fft and ok_gemm and ok_saxpy and engine.counters.rebuilds == 1:
            print("OK: FFT, GEMM and saxpy match NumPy")
            return 0
        print(f"MISMATCH: fft={ok_fft} gemm={ok_gemm} saxpy={ok_saxpy} rebuilds={engine.counters.rebuilds}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
