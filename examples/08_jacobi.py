#!/usr/bin/env python3
"""08 — a Poisson solver in a While region: Jacobi iterations until the update is below a tolerance.

What it teaches: a ``While`` region holds blocks and runs them again and again inside the one CUDA
graph of the frame, as long as a block in it says so (its ``Condition``): the GPU decides, the host
launches one graph per frame whatever the number of iterations, and never waits. ``Max`` guards
against a condition that never turns false. The iterations each frame took come back through the
readback ring (``engine.iterations(region)``) without a stall. ``Tol`` is a Hot parameter of a block
inside the loop: changing it patches the running graph, no rebuild. ``Unroll = 8`` puts 8 copies of
the body in each pass of the loop: the device pays a conditional body's cost (and runs ``Decide``)
once per 8 iterations, and the solve may run up to 7 iterations past the one where it converged
(a Jacobi sweep past convergence only shrinks the update further; docs/regions.md, "Unroll").

The patch: ``Zero`` (u = 0, a fresh solve every frame) and ``Source`` (f = 1) before the region;
inside ``Solve``: ``SweepA`` (u → half), ``SweepB`` (half → u, in place) and ``Decide`` (more = some
cell moved by more than ``tol``), whose ``more`` is the While's Condition. The same patch as a file,
with a ``Colorize`` block after the region drawing u in the preview: ``examples/08_jacobi.toml``
(``cudapatch run examples/08_jacobi.toml``).

What you should see: lines like ``frame  20:  1864 iterations (tol 1e-06) ...`` (NumPy converges
at 1860; 8 a pass), 936 after the tolerance is raised to 1e-5 half way, ending with ``OK: matches
NumPy (bit for bit, after the iterations run; at most 7 past NumPy's)``.

Run: ``python examples/08_jacobi.py [--headless] [--frames N] [--size N]`` (needs a CUDA GPU).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from cudapatch import Engine, Fill, KernelFile, While
from cudapatch._examples import example_main


def kernels_folder() -> Path:
    """``examples/jacobi``: beside this file, or under the working directory for a copy elsewhere."""
    here = Path(__file__).resolve().parent / "jacobi"
    return here if here.is_dir() else Path.cwd() / "examples" / "jacobi"


KERNELS = kernels_folder()

#: Copies of the While's body per pass (the condition is read once a pass); examples/08_jacobi.toml too.
UNROLL = 8


def jacobi_numpy(nx: int, f: np.ndarray, h2: float, tol: float, max_iter: int) -> tuple[np.ndarray, int]:
    """The same solve in NumPy float32, operation by operation as the kernels round them."""
    u = np.zeros_like(f)
    h2, tol, quarter = np.float32(h2), np.float32(tol), np.float32(0.25)

    def sweep(src: np.ndarray) -> np.ndarray:
        s, g = src.reshape(-1, nx), f.reshape(-1, nx)
        out = np.zeros_like(s)
        total = (s[1:-1, :-2] + s[1:-1, 2:]) + (s[:-2, 1:-1] + s[2:, 1:-1])
        out[1:-1, 1:-1] = quarter * (total - h2 * g[1:-1, 1:-1])
        return out.reshape(-1)

    for k in range(1, max_iter + 1):
        half = sweep(u)
        u = sweep(half)
        if not np.any(np.abs(u - half) > tol):
            return u, k
    return u, max_iter


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headless", action="store_true", help="no window (this example never opens one)")
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--size", type=int, default=64, help="grid points per side")
    ap.add_argument("--max", type=int, default=20000, help="the While's Max: most iterations per frame")
    args = ap.parse_args(argv)

    nx, n = args.size, args.size * args.size
    h2 = (1.0 / (nx - 1)) ** 2
    with Engine() as engine:
        zero = engine.add(Fill(name="Zero", Count=n, Value=0.0))
        source = engine.add(Fill(name="Source", Count=n, Value=1.0))
        solve = engine.add(While(name="Solve", Max=args.max, Unroll=UNROLL))
        sweep_a = engine.add(KernelFile(KERNELS / "jacobi_a.cu", name="SweepA", h2=h2, nx=nx), region=solve)
        sweep_b = engine.add(KernelFile(KERNELS / "jacobi_b.cu", name="SweepB", h2=h2, nx=nx), region=solve)
        decide = engine.add(KernelFile(KERNELS / "decide.cu", name="Decide", tol=1e-6), region=solve)
        engine.connect(zero, "Out", sweep_a, "u")
        engine.connect(zero, "Out", sweep_b, "u")  # the same buffer: SweepB writes u in place
        engine.connect(source, "Out", sweep_a, "f")
        engine.connect(source, "Out", sweep_b, "f")
        engine.connect(sweep_a, "half", sweep_b, "half")
        engine.connect(sweep_b, "u", decide, "u")
        engine.connect(sweep_a, "half", decide, "half")
        engine.connect(decide, "more", solve, "Condition")  # a block inside the While decides
        engine.wait_ready()  # kernels compile in the background; a script waits for them once
        print(f"device: {engine.device.name}")

        for frame in range(args.frames):
            if frame == args.frames // 2:
                decide.set("tol", 1e-5)  # Hot: a scalar of a kernel inside the loop, patched in place
            engine.update()  # one graph launch, however many iterations the GPU runs
            if frame % 20 == 0 or frame == args.frames - 1:
                its = engine.iterations(solve)  # from the newest completed frame: no stall
                print(
                    f"frame {frame:4d}: {its if its is not None else '-':>5} iterations "
                    f"(tol {decide.get('tol'):g}) rebuilds={engine.counters.rebuilds} "
                    f"hot={engine.counters.hot_updates}"
                )

        u = engine.read(sweep_b, "u")  # synchronizes: only for checking
        engine.show_frame()  # the newest frame's numbers on the blocks (a warning if the While stopped at Max)
        its = engine.iterations(solve)
        f = np.ones(n, np.float32)
        _, ref_its = jacobi_numpy(nx, f, h2, float(np.float32(decide.get("tol"))), args.max)
        # The While stops at the end of the pass in which it converged: up to UNROLL - 1 iterations past
        # NumPy's. u is NumPy's after exactly the iterations run (a negative tolerance never stops).
        ok = its is not None and ref_its <= its <= min(ref_its + UNROLL - 1, args.max)
        ref = jacobi_numpy(nx, f, h2, -1.0, its)[0] if ok else None
        ok = ok and np.array_equal(u, ref)
        print(engine)
        for blk in engine.blocks:
            print(" ", blk)
        print(f"GPU: {its} iterations, NumPy: {ref_its}; max |u| = {np.abs(u).max():.5f}")
        print(
            f"OK: matches NumPy (bit for bit, after the iterations run; at most {UNROLL - 1} past NumPy's)"
            if ok
            else "MISMATCH against NumPy"
        )
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
