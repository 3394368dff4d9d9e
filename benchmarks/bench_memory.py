#!/usr/bin/env python3
"""Buffer reuse benchmark: a chain of 20 built-in image blocks on a 4K RGBA32F image (2160 x 3840
``float4`` pixels, 133 MB per image), with buffer reuse beside the same engine without it, in the
same run.

The chain repeats ``Blur -> ColorMap -> Mix -> Resample -> Threshold`` (``cudapatch.blocks.library``):
each ``Mix`` blends the chain with the source image (``B``, bound memory like ``In`` of the first
block, so it stretches no intermediate's life); ``Resample`` keeps the size (every value is one image,
so bytes divide into images' worth). Both engines run unfused (``fuse=False``: fused, elementwise
neighbours share one kernel and hold no buffers between them), so they launch the same kernels.

Measures (the issue's targets): the device memory the chain's values take (every output, each
Blur's internal image and its 65 weights, as planned; the pool's bytes in use beside it), in images'
worth: <= 3 with reuse (the weights add about a kilobyte: 3.000), against one per value without;
and the GPU time per frame with reuse / without: <= 1.05x (sharing adds no edge between kernels).
GPU time is CUDA events around frames on each engine's stream (``_timing.gpu_ms_samples``), the two
engines taken in turn for several rounds, so clock or thermal drift hits both alike; the median of
each. The two engines' final images are compared bit for bit.

Prints a table (ours, peer, ratio, target) and writes ``memory.json`` to ``$RESULTS_DIR`` when set.
Usage: ``python benchmarks/bench_memory.py [--small] [--blocks 20] [--width 3840] [--height 2160]``
(``--small``: 960 x 540 and fewer frames, a quick check).
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import gpu_ms_samples  # noqa: E402

from cudapatch import Engine, GpuBuffer, Shape  # noqa: E402
from cudapatch.blocks.block import Block  # noqa: E402
from cudapatch.blocks.library import Blur, ColorMap, Mix, Resample, Threshold  # noqa: E402
from cudapatch.kernels.types import DType  # noqa: E402

FORMAT = "rgba32f"


def _stage(i: int, width: int, height: int) -> Block:
    """Block ``i`` of the chain: Blur, ColorMap, Mix, Resample, Threshold, then again."""
    name = f"b{i:02d}"
    make = (
        lambda: Blur(name=name, Format=FORMAT, Radius=4, Sigma=2.0),
        lambda: ColorMap(name=name, Format=FORMAT, Low=0.1, High=0.9),
        lambda: Mix(name=name, Format=FORMAT, Amount=0.3),
        lambda: Resample(name=name, Format=FORMAT, Width=width, Height=height),  # the same size
        lambda: Threshold(name=name, Format=FORMAT, Level=0.45),
    )
    return make[i % len(make)]()


def chain(eng: Any, blocks: int, width: int, height: int, source: Callable[[Block, str], None]) -> list[Block]:
    """``blocks`` image blocks in a row on ``eng`` (anything with ``add`` and ``connect``), the first
    reading the source image, each Mix blending it in (``source(block, port)`` binds it there)."""
    out: list[Block] = []
    for i in range(blocks):
        b = eng.add(_stage(i, width, height))
        if out:
            eng.connect(out[-1], "Out", b, "A" if isinstance(b, Mix) else "In")
        else:
            source(b, "A" if isinstance(b, Mix) else "In")
        if isinstance(b, Mix):
            source(b, "B")
        out.append(b)
    return out


def build(reuse: bool, args: argparse.Namespace, host: np.ndarray) -> tuple[Engine, list[Block], GpuBuffer]:
    """An engine running the chain, and the source image: uploaded once into a buffer of the engine's
    pool (bound memory, read where the chain reads the source; no intermediate)."""
    eng = Engine(wait_for_compile=True, reuse_buffers=reuse, fuse=False, name="reuse" if reuse else "no-reuse")
    src = GpuBuffer(eng.pool, DType.FLOAT4, args.width * args.height, stream=eng.stream)
    src.upload(host)
    shape = Shape.of(args.height, args.width)
    blocks = chain(eng, args.blocks, args.width, args.height, lambda b, port: eng.bind(b, port, src, shape=shape))
    eng.wait_ready()
    eng.update()
    eng.synchronize()
    return eng, blocks, src


def _images(plan: Any, image_bytes: int) -> int:
    """How many of ``plan``'s buffers hold a whole image (the rest: each Blur's 65 weights)."""
    return sum(1 for b in plan.buffers if b.count * b.dtype.itemsize >= image_bytes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="960 x 540 and fewer frames: a quick check")
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--width", type=int, default=None, help="default 3840 (960 with --small)")
    ap.add_argument("--height", type=int, default=None, help="default 2160 (540 with --small)")
    args = ap.parse_args()
    args.width = args.width or (960 if args.small else 3840)
    args.height = args.height or (540 if args.small else 2160)
    frames, repeats, rounds = (10, 3, 2) if args.small else (20, 5, 3)
    logging.getLogger("cudapatch").setLevel(logging.ERROR)
    image_bytes = args.width * args.height * 16  # one float4 per pixel
    host = np.random.default_rng(1).random((args.height, args.width, 4), dtype=np.float32)

    reuse, reuse_blocks, reuse_src = build(True, args, host)
    plain, plain_blocks, plain_src = build(False, args, host)
    rp, pp = reuse.graph.plan, plain.graph.plan
    shared = rp.memory.buffer_values()
    mb = 2**20
    rows: list[tuple[str, float, str, float, str]] = [
        ("chain values: planned MB", rp.total_buffer_bytes / mb, "no reuse MB", pp.total_buffer_bytes / mb, "info"),
        (
            "chain values: images' worth",
            rp.total_buffer_bytes / image_bytes,
            "no reuse",
            pp.total_buffer_bytes / image_bytes,
            "ours <= 3",
        ),
        ("image-sized buffers", _images(rp, image_bytes), "no reuse", _images(pp, image_bytes), "info"),
        # the pool holds the bound source image too (one image in each engine)
        (
            "pool MB in use after the build",
            reuse.pool.in_use_bytes / mb,
            "no reuse MB",
            plain.pool.in_use_bytes / mb,
            "info",
        ),
    ]

    # GPU time of whole frames, the engines in turn: drift between rounds shifts both
    ours: list[float] = []
    peer: list[float] = []
    for _ in range(rounds):
        ours += gpu_ms_samples(reuse.update, reuse.stream, frames, repeats)
        peer += gpu_ms_samples(plain.update, plain.stream, frames, repeats)
    rows.append(
        ("GPU ms/frame with reuse", statistics.median(ours), "without reuse ms", statistics.median(peer), "<= 1.05")
    )

    got, want = reuse.read(reuse_blocks[-1], "Out"), plain.read(plain_blocks[-1], "Out")
    same = bool(np.array_equal(got, want))
    kinds = " -> ".join(type(b).__name__ for b in reuse_blocks[:5])

    print()
    print(
        f"device: {reuse.device.name} ({reuse.device.arch}); {args.blocks} image blocks ({kinds}, repeated) on "
        f"{args.height}x{args.width} RGBA32F ({image_bytes / 1e6:.0f} MB per image), unfused; "
        f"{len(rp.buffers)} buffers with reuse ({len(shared)} shared) for {len(rp.memory.values)} values, "
        f"{len(pp.buffers)} without; final images equal: {same}"
    )
    print(f"{'measure':40} {'ours':>10} {'peer':>18} {'peer val':>10} {'ratio':>8}  target")
    out = []
    for name, value, peer_name, peer_value, target in rows:
        ratio = value / peer_value if peer_value else float("nan")
        print(f"{name:40} {value:10.3f} {peer_name:>18} {peer_value:10.3f} {ratio:8.3f}  {target}")
        out.append({"measure": name, "ours": value, "peer": peer_name, "peer_value": peer_value, "target": target})
    write_results(
        "memory.json",
        {"rows": out, "equal": same, "width": args.width, "height": args.height, "blocks": args.blocks},
    )
    for eng, src in ((reuse, reuse_src), (plain, plain_src)):
        src.close()
        eng.close()
    if not same:
        sys.exit("MISMATCH: reuse changed the result")


if __name__ == "__main__":
    main()
