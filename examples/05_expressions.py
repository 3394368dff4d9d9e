#!/usr/bin/env python3
"""05 — expressions and fusion: math typed as text becomes a kernel, and a chain becomes one kernel.

What it teaches: an ``Expression`` block turns a line of math into a generated kernel (its
lower-case names are inputs, its capitalised names Hot scalars); the engine fuses the Expression
and the ``Scale`` after it into one generated kernel (``Engine(fuse=False)`` would not), and the Hot
scalars of both stay Hot. Editing the expression so that it uses a new name re-describes the block and rebuilds.

What you should see: the fused plan (one kernel for two blocks), a line per reported frame, then
``OK: matches NumPy``.

Run: ``python examples/05_expressions.py [--headless] [--frames N]`` (needs a CUDA GPU).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from cudapatch import Engine, Expression, Scale
from cudapatch._examples import example_main


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headless", action="store_true", help="no window (this example never opens one)")
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--elements", type=int, default=1 << 16)
    args = ap.parse_args(argv)

    x = np.linspace(-np.pi, np.pi, args.elements, dtype=np.float32)
    with Engine() as engine:  # fuses elementwise chains by default
        wave = engine.add(Expression(name="wave", Code="sin(x * Freq) * Amp", Freq=3.0))
        gain = engine.add(Scale(name="gain", Factor=2.0, Offset=0.5))
        engine.connect(wave, "Out", gain, "In")
        engine.bind(wave, "x", x)
        engine.wait_ready()
        print(engine.graph.plan.describe())  # one kernel node: wave and gain fused
        print(wave.generated_code.splitlines()[1])

        amp = 1.0
        for frame in range(args.frames):
            amp = 1.0 + 0.5 * float(np.sin(frame * 0.1))
            wave.set("Amp", amp)  # Hot: patched into the fused kernel's node
            if frame == args.frames // 2:
                wave.set("Code", "cos(x * Freq) * Amp + Bias")  # a new name (Bias): new scalar, rebuild
                wave.set("Bias", 0.25)
                engine.wait_ready()
            engine.update()
            if frame % 30 == 0 or frame == args.frames - 1:
                print(
                    f"frame {frame:4d}: amp={amp:.3f} kernels={len(engine.graph.plan.kernel_nodes)} "
                    f"rebuilds={engine.counters.rebuilds} hot={engine.counters.hot_updates}"
                )

        out = engine.read(gain, "Out").astype(np.float64)  # synchronizes: only for checking
        ref = (np.cos(x.astype(np.float64) * 3.0) * amp + 0.25) * 2.0 + 0.5
        ok = bool(np.allclose(out, ref, rtol=1e-4, atol=1e-4)) and len(engine.graph.plan.kernel_nodes) == 1
        for blk in engine.blocks:
            print(" ", blk)
        print("OK: matches NumPy" if ok else "MISMATCH against NumPy")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
