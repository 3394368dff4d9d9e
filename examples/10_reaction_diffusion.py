#!/usr/bin/env python3
"""10 — reaction–diffusion: Gray–Scott on a 1024 x 1024 grid, N steps per frame in a For region.

What it teaches: a ``FrameDelay`` placed inside a ``For`` body carries the field from one iteration
to the next and from the last iteration of a frame to the first of the next one; ``Count`` (the
steps per frame) is a Hot parameter, so changing it patches the running graph; the GPU decides the
iterations, so the host launches one graph per frame whatever the count. The For's body is unrolled
(``Unroll``, 8 by default) and its copies alternate the delay's two buffers, so no step copies the
field: one copy after the loop leaves both buffers holding the last step (``docs/regions.md``,
"Feedback inside a loop"). The kernel rounds every
operation on its own (``__fmul_rn``, ``__fadd_rn``: no fused multiply-add), so NumPy, doing the same
operations in the same order in float32, matches it bit for bit. The same patch as a file, with
the image in the preview: ``cudapatch run examples/10_reaction_diffusion.toml``.

What you should see: ``frame 1: 10 steps match NumPy bit for bit`` (and frame 2), a line every 20
frames with the steps the last frame ran and the reacting area, then after a ``reset()`` the field
starting again from its seed, and at the end ``OK: ...``.

Run: ``python examples/10_reaction_diffusion.py [--headless] [--frames N] [--size S] [--steps N]``
(needs a CUDA GPU; this example never opens a window).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from cudapatch import CustomKernel, Engine, For, FrameDelay
from cudapatch._examples import example_main

GRAY_SCOTT = """\
// One Gray-Scott step on a torus: (u, v) per cell, 5-point Laplacian, every operation rounded alone.
extern "C" __global__ void gray_scott(const float2* s, float2* next, int width, int height,
                                      float Du, float Dv, float F, float k, float dt, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = i % width, y = i / width;
    float2 c = s[i];
    float2 l = s[y * width + (x + width - 1) % width], r = s[y * width + (x + 1) % width];
    float2 u = s[((y + height - 1) % height) * width + x], d = s[((y + 1) % height) * width + x];
    float lu = __fsub_rn(__fadd_rn(__fadd_rn(__fadd_rn(l.x, r.x), u.x), d.x), __fmul_rn(4.0f, c.x));
    float lv = __fsub_rn(__fadd_rn(__fadd_rn(__fadd_rn(l.y, r.y), u.y), d.y), __fmul_rn(4.0f, c.y));
    float uvv = __fmul_rn(__fmul_rn(c.x, c.y), c.y);
    float du = __fadd_rn(__fsub_rn(__fmul_rn(Du, lu), uvv), __fmul_rn(F, __fsub_rn(1.0f, c.x)));
    float dv = __fsub_rn(__fadd_rn(__fmul_rn(Dv, lv), uvv), __fmul_rn(__fadd_rn(F, k), c.y));
    float2 o;
    o.x = __fadd_rn(c.x, __fmul_rn(dt, du));
    o.y = __fadd_rn(c.y, __fmul_rn(dt, dv));
    next[i] = o;
}
"""

PAINT = """\
// RGBA8 pixels for the preview: v (the second chemical) from dark blue to warm white.
extern "C" __global__ void paint(const float2* s, unsigned int* rgba, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float t = fminf(fmaxf(s[i].y * 3.0f, 0.0f), 1.0f);
    unsigned int r = (unsigned int)(255.0f * t), g = (unsigned int)(200.0f * t + 24.0f * (1.0f - t));
    unsigned int b = (unsigned int)(160.0f * t + 64.0f * (1.0f - t));
    rgba[i] = 0xFF000000u | (b << 16) | (g << 8) | r;  // A B G R, little endian
}
"""

PARAMS = {"Du": 0.16, "Dv": 0.08, "F": 0.035, "k": 0.065, "dt": 1.0}


def seed_field(h: int, w: int) -> np.ndarray:
    """u = 1, v = 0, with a noisy square of u = 0.5, v = 0.25 in the middle: ``(h * w, 2)`` float32."""
    s = np.zeros((h, w, 2), np.float32)
    s[..., 0] = 1.0
    a, b = h // 2 - h // 10, h // 2 + h // 10
    c, d = w // 2 - w // 10, w // 2 + w // 10
    s[a:b, c:d] = (0.5, 0.25)
    s += np.random.default_rng(1).uniform(0.0, 0.01, s.shape).astype(np.float32)
    return s.reshape(h * w, 2)


def gray_scott(s: np.ndarray, h: int, w: int, steps: int) -> np.ndarray:
    """``steps`` steps in NumPy float32, in the kernel's operation order (the reference)."""
    f = {k: np.float32(v) for k, v in PARAMS.items()}
    s = s.reshape(h, w, 2)
    for _ in range(steps):
        u, v = s[..., 0], s[..., 1]

        def lap(a: np.ndarray) -> np.ndarray:
            return (((np.roll(a, 1, 1) + np.roll(a, -1, 1)) + np.roll(a, 1, 0)) + np.roll(a, -1, 0)) - np.float32(4) * a

        uvv = (u * v) * v
        du = (f["Du"] * lap(u) - uvv) + f["F"] * (np.float32(1) - u)
        dv = (f["Dv"] * lap(v) + uvv) - (f["F"] + f["k"]) * v
        s = np.stack([u + f["dt"] * du, v + f["dt"] * dv], axis=-1)
    return s.reshape(h * w, 2)


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headless", action="store_true", help="no window (this example never opens one)")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--size", type=int, default=1024, help="the grid is size x size cells")
    ap.add_argument("--steps", type=int, default=10, help="steps per frame (the For's Count)")
    args = ap.parse_args(argv)
    h = w = args.size
    frames, steps = max(args.frames, 4), args.steps
    seed = seed_field(h, w)

    with Engine(name="reaction-diffusion") as engine:
        loop = engine.add(For(name="Steps", Count=steps))
        field = engine.add(FrameDelay(name="field", Type="float2"), region=loop)  # inside the body
        step = engine.add(CustomKernel(name="step", Code=GRAY_SCOTT, width=w, height=h, **PARAMS), region=loop)
        paint = engine.add(CustomKernel(name="paint", Code=PAINT))  # after the loop: the image
        engine.bind(field, "Init", seed)  # the start value (the delay's size follows it)
        engine.connect(field, "Out", step, "s")  # what the previous iteration made ...
        engine.connect(step, "next", field, "In")  # ... and what the next one reads
        engine.connect(step, "next", paint, "s")
        engine.wait_ready()  # kernels compile in the background; a script waits for them once
        print(f"device: {engine.device.name}")

        ok, ref = True, seed
        for frame in (1, 2):  # reading synchronizes: only for checking
            engine.update()
            ref = gray_scott(ref, h, w, steps)
            same = np.array_equal(engine.read(step, "next").reshape(h * w, 2), ref)
            print(f"frame {frame}: {steps} steps {'match NumPy bit for bit' if same else 'DIFFER from NumPy'}")
            ok = ok and same
        rebuilds = engine.counters.rebuilds
        loop.set("Count", 2 * steps)  # Hot: twice the steps per frame, no rebuild
        reset_at = frames // 2
        for frame in range(3, frames + 1):
            if frame == reset_at:
                field.reset()  # Hot: the seed again, before this frame's loop
            engine.update()  # one graph launch, whatever the count; never waits for the GPU
            if frame % 20 == 0:
                print(f"frame {frame:4d}: {engine.iterations(loop)} steps in the newest finished frame")
        out = engine.read(field, "Out").reshape(h * w, 2)  # what the next frame starts from
        fine = bool(np.isfinite(out).all() and out.min() >= -0.05 and out.max() <= 1.05)
        area = float((out[:, 1] > 0.1).mean())
        print(f"after {frames} frames: reacting area {area:.1%}, values {'in range' if fine else 'OUT OF RANGE'}")
        ok = ok and fine and engine.counters.rebuilds == rebuilds
        rgba = engine.read(paint, "rgba")
        ok = ok and rgba.size == h * w
        print(engine)
        print(f"OK: Gray-Scott {w}x{h}, {steps} then {2 * steps} steps per frame" if ok else "MISMATCH")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
