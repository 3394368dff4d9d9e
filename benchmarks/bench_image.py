#!/usr/bin/env python3
"""Image blocks: a separable Gaussian blur of a 4K RGBA8 image, ours beside CuPy
(``cupyx.scipy.ndimage.gaussian_filter1d`` along x, then y, on the same image) in the same run;
and the RGBA32F blur beside the same CuPy filter on float32.

GPU time per frame: CUDA events around 100 frames on each side's stream, median of 5 repeats.
Ours is a whole frame (``update()``: the weights kernel and both passes in one graph launch).
The results are compared too: at most 2 steps apart (each side rounds every pass to bytes).

Prints a table (ours, peer, ratio) and writes ``image.json`` to ``$RESULTS_DIR`` when set.
Usage: ``python benchmarks/bench_image.py [--width 3840] [--height 2160] [--sigma 2.0]``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cupy as cp  # noqa: E402
from _results import write_results  # noqa: E402
from _timing import gpu_ms  # noqa: E402
from cupyx.scipy import ndimage  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.blocks.library import Blur  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--width", type=int, default=3840)
    ap.add_argument("--height", type=int, default=2160)
    ap.add_argument("--sigma", type=float, default=2.0)
    args = ap.parse_args()
    logging.getLogger("cudapatch").setLevel(logging.ERROR)
    radius = int(4.0 * args.sigma + 0.5)  # scipy's truncate=4.0
    rng = np.random.default_rng(0)
    rows = []
    with Engine(wait_for_compile=True) as eng:
        stream = eng.device.stream
        peer_stream = cp.cuda.Stream(non_blocking=True)
        for fmt, host in (
            ("rgba8", rng.integers(0, 255, size=(args.height, args.width, 4), endpoint=True, dtype=np.uint8)),
            ("rgba32f", rng.random((args.height, args.width, 4), dtype=np.float32)),
        ):
            blur = eng.add(Blur(name=f"blur_{fmt}", Format=fmt, Radius=radius, Sigma=args.sigma))
            eng.bind(blur, "In", host)
            eng.update()
            eng.synchronize()
            ours = gpu_ms(eng.update, stream, 100)
            got = eng.read(blur, "Out")

            x = cp.asarray(host)
            with peer_stream:

                def peer(x=x) -> object:
                    y = ndimage.gaussian_filter1d(x, args.sigma, axis=1, mode="nearest", truncate=4.0)
                    return ndimage.gaussian_filter1d(y, args.sigma, axis=0, mode="nearest", truncate=4.0)

                want = cp.asnumpy(peer())
                theirs = gpu_ms(peer, peer_stream.ptr, 100)
            if fmt == "rgba8":
                diff = int(np.abs(got.astype(np.int32) - want.astype(np.int32)).max())
            else:
                diff = float(np.abs(got - want).max())
            rows.append((f"blur {fmt} {args.width}x{args.height}, radius {radius}", ours, theirs, diff))
            eng.remove(blur)
        print(f"device: {eng.device.name}; sigma {args.sigma}, radius {radius}, edges clamped (mode='nearest')")
    print(f"{'measure':40} {'ours ms':>9} {'cupyx ms':>9} {'ratio':>7} {'max diff':>9}  target")
    out = []
    for name, ours, theirs, diff in rows:
        print(f"{name:40} {ours:9.3f} {theirs:9.3f} {ours / theirs:7.2f} {diff:9.3g}  <= 1.0x")
        out.append({"measure": name, "ours_ms": ours, "cupyx_ms": theirs, "ratio": ours / theirs, "max_diff": diff})
    write_results("image.json", {"rows": out})


if __name__ == "__main__":
    main()
