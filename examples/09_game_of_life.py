#!/usr/bin/env python3
"""09 — Game of Life: feedback through a FrameDelay, one generation per frame, inside one CUDA graph.

What it teaches: a link cycle is allowed when it passes through a ``FrameDelay``, whose ``Out`` is
the previous frame's ``In`` (two buffers that swap roles every frame, no copy, no host work per
delay); ``Init`` is written on the first frame and again after ``reset()`` (a Hot edit, no
rebuild); a ``Download`` block hands the host a copy of the grid a frame or two later without
ever waiting for the GPU. The same patch as a file: ``examples/09_game_of_life.toml`` (``cudapatch
run examples/09_game_of_life.toml``).

What you should see: a line every 20 frames with the live cell count of the newest downloaded
generation, e.g. ``frame  20: generation 19 downloaded, 14873 alive``, and at the end ``OK: N
generations match NumPy bit for bit``.

Run: ``python examples/09_game_of_life.py [--headless] [--frames N]`` (needs a CUDA GPU; this
example never opens a window).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from cudapatch import CustomKernel, Download, DownloadRing, Engine, FrameDelay
from cudapatch._examples import example_main

LIFE = """\
// One cell per thread on a torus: the next generation from the previous one.
extern "C" __global__ void life(const unsigned char* cells, unsigned char* next, int width, int height,
                                unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    int x = i % width, y = i / width, alive = 0;
    for (int dy = -1; dy <= 1; ++dy)
        for (int dx = -1; dx <= 1; ++dx)
            if (dx || dy) alive += cells[((y + dy + height) % height) * width + (x + dx + width) % width];
    next[i] = (alive == 3 || (cells[i] && alive == 2)) ? 1 : 0;
}
"""


def step(grid: np.ndarray) -> np.ndarray:
    """One generation in NumPy (the reference)."""
    n = sum(np.roll(np.roll(grid, dy, 0), dx, 1) for dy in (-1, 0, 1) for dx in (-1, 0, 1) if dy or dx)
    return ((n == 3) | ((grid == 1) & (n == 2))).astype(np.uint8)


def generations(grid: np.ndarray, count: int) -> np.ndarray:
    for _ in range(count):
        grid = step(grid)
    return grid


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headless", action="store_true", help="no window (this example never opens one)")
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--size", type=int, default=256, help="the grid is size x size cells")
    args = ap.parse_args(argv)
    w = h = args.size
    reset_at = args.frames // 2  # Init again before this frame: the patch starts over

    seed = (np.random.default_rng().random((h, w)) < 0.3).astype(np.uint8)

    with Engine(name="life") as engine:
        delay = engine.add(FrameDelay(name="delay", Type="uchar"))
        life = engine.add(CustomKernel(name="life", Code=LIFE, width=w, height=h))
        tap = engine.add(Download(name="tap", Type="uchar"))
        engine.bind(delay, "Init", seed)  # the first generation (the delay's size follows it)
        engine.connect(delay, "Out", life, "cells")  # the previous frame's cells ...
        engine.connect(life, "next", delay, "In")  # ... and this frame's: the loop passes through the delay
        engine.connect(life, "next", tap, "In")
        with DownloadRing(engine, tap, w * h) as ring:
            engine.wait_ready()  # kernels compile in the background; a script waits for them once
            print(f"device: {engine.device.name}")
            last = None
            for frame in range(args.frames):
                if frame == reset_at:
                    delay.reset()  # Hot: the init kernel runs once more, in this frame
                engine.update()  # one graph launch; never waits for the GPU
                if frame % 20 == 0:
                    got = ring.read()  # the newest complete copy, a frame or two old: no stall
                    if got is not None:
                        last = cells, gen = got
                        print(f"frame {frame:4d}: generation {gen} downloaded, {int(cells.sum())} alive")

            out = engine.read(life, "next").reshape(h, w)  # synchronizes: only for checking
            ref = generations(seed, args.frames - reset_at)
            ok = np.array_equal(out, ref)
            last = ring.read() or last  # after the synchronize: the last frame's copy is complete
            ok = ok and last is not None and last[1] == args.frames and np.array_equal(last[0].reshape(h, w), ref)
        print(engine)
        for blk in engine.blocks:
            print(" ", blk)
        steps = args.frames - reset_at
        print(f"OK: {steps} generations match NumPy bit for bit" if ok else "MISMATCH against NumPy")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
