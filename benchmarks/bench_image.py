#!/usr/bin/env python3
"""Image blocks: a separable Gaussian blur of a 4K RGBA8 image, ours beside CuPy
(``cupyx.scipy.ndimage.gaussian_filter1d`` along x, then y, on the same image) in the same run;
and the RGBA32F blur beside the same CuPy filter on float32.

GPU time per frame: CUDA events around 100 frames on each side's stream, median of 5 repeats.
Ours is a whole frame (``update()``: the weights kernel and both passes in one graph launch).
The results are compared too: at most 2 steps apart (each side rounds every pass to bytes).
Without CuPy the peer is printed as unavailable and ours is measured alone.

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

from _results import write_results  # noqa: E402
from _timing import gpu_ms  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.blocks.library import Blur  # noqa: E402

try:  # the peer; without it ours is measured alone
    import cupy as cp
    from cupyx.scipy import ndimage
except ImportError:
    cp = ndimage = None


def peer_blur(host: np.ndarray, sigma: float) -> tuple[float, np.ndarray]:
    """``(GPU ms per frame, result)`` of cupyx's Gaussian along x then y on ``host``, on a stream of
    its own (scipy's ``truncate=4.0``: the radius ours is given; edges ``nearest``: ours clamps)."""
    stream = cp.cuda.Stream(non_blocking=True)
    with stream:
        x = cp.asarray(host)  # copied on this stream: ordered before the filters on it

        def peer() -> object:
            y = ndimage.gaussian_filter1d(x, sigma, axis=1, mode="nearest", truncate=4.0)
            return ndimage.gaussian_filter1d(y, sigma, axis=0, mode="nearest", truncate=4.0)

        want = cp.asnumpy(peer())
        return gpu_ms(peer, d.CUstream(stream.ptr), 100), want


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
            theirs = diff = None
            if cp is not None:
                theirs, want = peer_blur(host, args.sigma)
                if fmt == "rgba8":
                    diff = int(np.abs(got.astype(np.int32) - want.astype(np.int32)).max())
                else:
                    diff = float(np.abs(got - want).max())
            rows.append((f"blur {fmt} {args.width}x{args.height}, radius {radius}", ours, theirs, diff))
            eng.remove(blur)
        print(f"device: {eng.device.name}; sigma {args.sigma}, radius {radius}, edges clamped (mode='nearest')")
    if cp is None:
        print("peer: cupyx.scipy.ndimage unavailable (CuPy is not installed): ours alone")
    print(f"{'measure':40} {'ours ms':>9} {'cupyx ms':>11} {'ratio':>7} {'max diff':>9}  target")
    out = []
    for name, ours, theirs, diff in rows:
        if theirs is None:
            print(f"{name:40} {ours:9.3f} {'unavailable':>11} {'-':>7} {'-':>9}  <= 1.0x")
        else:
            print(f"{name:40} {ours:9.3f} {theirs:11.3f} {ours / theirs:7.2f} {diff:9.3g}  <= 1.0x")
        ratio = ours / theirs if theirs else None
        out.append({"measure": name, "ours_ms": ours, "cupyx_ms": theirs, "ratio": ratio, "max_diff": diff})
    write_results("image.json", {"rows": out, "peer": "cupyx.scipy.ndimage" if cp is not None else None})


if __name__ == "__main__":
    main()
