#!/usr/bin/env python3
"""02 — live kernel: edit a .cu file while the patch runs; the new kernel goes live without a rebuild.

What it teaches: a KernelFile block takes its ports from the kernel's signature; the engine watches
the file (and its #includes), compiles edits in the background and swaps the new kernel into the
running CUDA graph (the Code tier). A broken edit shows the compiler's error on the block while the
previous kernel keeps running; fixing it clears the error.

What you should see: the output changing as the example rewrites the kernel file three times:
``gain 2x`` → a compile error (old kernel still running) → ``gain 2x + 1`` → ``squared``, with
``rebuilds`` unchanged throughout and ``swaps`` counting up, ending with ``OK: every edit went live``.

Run: ``python examples/02_live_kernel.py [--headless] [--frames N] [--kernel FILE]`` (needs a CUDA GPU).
Pass ``--kernel my.cu`` and a large ``--frames`` to edit a file yourself while it runs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cudapatch import BlockState, Engine, KernelFile
from cudapatch._examples import example_main

KERNEL = """// cudapatch: description=Edited live by examples/02_live_kernel.py
extern "C" __global__ void live(const float* in, float* out, float gain, unsigned int n)
{{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = {expr};
}}
"""

EDITS = [
    ("gain 2x", "in[i] * gain", lambda x: 2.0 * x),
    ("broken", "in[i] * gain + oops", None),  # a compile error: the previous kernel keeps running
    ("gain 2x + 1", "in[i] * gain + 1.0f", lambda x: 2.0 * x + 1.0),
    ("squared", "in[i] * in[i]", lambda x: x * x),
]


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headless", action="store_true", help="no window (this example never opens one)")
    ap.add_argument("--frames", type=int, default=240, help="frames between edits")
    ap.add_argument("--kernel", type=Path, help="run this .cu file and watch it instead of scripted edits")
    args = ap.parse_args(argv)

    folder = Path(tempfile.mkdtemp(prefix="cudapatch-live-"))
    path = args.kernel or folder / "live.cu"
    if args.kernel is None:
        path.write_text(KERNEL.format(expr=EDITS[0][1]))
    x = np.linspace(-2, 2, 4096, dtype=np.float32)

    with Engine() as engine:
        live = engine.add(KernelFile(path, name="live", gain=2.0))
        engine.bind(live, "in", x)
        engine.wait_ready()
        print(f"device: {engine.device.name}; kernel file: {path}")
        if args.kernel is not None:  # the user edits the file; we just run and report
            for frame in range(args.frames):
                engine.update()
                if frame % 60 == 0:
                    print(f"frame {frame:5d}: {live}; out[:3]={engine.read(live, 'out')[:3]}")
                time.sleep(1 / 60)
            return 0

        ok = True
        rebuilds = engine.counters.rebuilds
        for step, (label, expr, ref) in enumerate(EDITS):
            if step:
                path.write_text(KERNEL.format(expr=expr))  # what saving in an editor does
            swaps = engine.counters.code_swaps
            deadline = time.monotonic() + 10.0
            frame = 0
            # The frames keep running while the edit is noticed (debounced) and compiles in the
            # background: at least --frames of them, and on until the edit has landed.
            while frame < args.frames or time.monotonic() < deadline:
                engine.update()
                frame += 1
                landed = engine.counters.code_swaps > swaps or (ref is None and live.debug.state is BlockState.ERROR)
                if landed and frame >= args.frames:
                    break
                time.sleep(1 / 240)
            engine.update()
            out = engine.read(live, "out")
            if ref is None:
                running = np.allclose(out, EDITS[step - 1][2](x), atol=1e-5)
                print(
                    f"edit {step} ({label}): {live.debug.message.splitlines()[0]}; previous kernel running: {running}"
                )
                ok &= live.debug.state is BlockState.ERROR and running
            else:
                good = np.allclose(out, ref(x.astype(np.float64)), atol=1e-5)
                print(
                    f"edit {step} ({label}): out[:3]={out[:3]} correct={good} "
                    f"rebuilds={engine.counters.rebuilds} swaps={engine.counters.code_swaps}"
                )
                ok &= good and live.debug.state is BlockState.OK
        ok &= engine.counters.rebuilds == rebuilds  # every edit went live without a rebuild
        print(engine)
        print("OK: every edit went live" if ok else "MISMATCH: an edit did not go live as expected")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
