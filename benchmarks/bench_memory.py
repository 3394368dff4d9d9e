#!/usr/bin/env python3
"""Buffer reuse benchmark: a chain of elementwise blocks on 4K RGBA32F images (3840 x 2160 x 4 floats,
133 MB each), with buffer reuse beside the same engine without it, in the same run.

Measures the device memory the chain's outputs take (planned buffer bytes and the pool's bytes in
use), how many image buffers' worth that is (target: <= 3 with reuse, against one per block
without), and the GPU time per frame with reuse / without (target <= 1.05x: sharing adds no edge,
so the kernels run as they did). If CuPy is installed, the same chain as CuPy elementwise ops (its
memory pool frees each intermediate as soon as the next one is made) is printed beside them.
Both engines' results are compared bit for bit.

Prints a table and writes ``memory.json`` to ``$RESULTS_DIR`` when set.
Usage: ``python benchmarks/bench_memory.py [--blocks 20] [--width 3840] [--height 2160]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import gpu_ms_samples  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Scale  # noqa: E402


def build(reuse: bool, image: np.ndarray, factors: list[float]) -> tuple[Engine, list]:
    name = "reuse" if reuse else "no-reuse"
    eng = Engine(wait_for_compile=True, reuse_buffers=reuse, name=name, fuse=False)  # fused: no buffers to share
    blocks = []
    for i, f in enumerate(factors):
        s = eng.add(Scale(name=f"s{i}", Factor=f, Offset=1e-3 * i))
        if blocks:
            eng.connect(blocks[-1], "Out", s, "In")
        else:
            eng.bind(s, "In", image)
        blocks.append(s)
    eng.update()
    eng.synchronize()
    return eng, blocks


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=20)
    ap.add_argument("--width", type=int, default=3840)
    ap.add_argument("--height", type=int, default=2160)
    args = ap.parse_args()
    n = args.width * args.height * 4  # RGBA32F
    image_bytes = 4 * n
    rng = np.random.default_rng(1)
    image = rng.standard_normal(n).astype(np.float32)
    factors = [float(f) for f in rng.uniform(0.9, 1.1, args.blocks)]

    reuse, reuse_blocks = build(True, image, factors)
    plain, plain_blocks = build(False, image, factors)
    mem = reuse.graph.plan.memory
    shared = mem.buffer_values()
    rows: list[tuple[str, float, str, float, str]] = []
    rows.append(
        (
            "chain outputs: planned buffer MB",
            reuse.graph.plan.total_buffer_bytes / 2**20,
            "no reuse MB",
            plain.graph.plan.total_buffer_bytes / 2**20,
            "info",
        )
    )
    rows.append(
        (
            "chain outputs: image buffers' worth",
            reuse.graph.plan.total_buffer_bytes / image_bytes,
            "no reuse",
            plain.graph.plan.total_buffer_bytes / image_bytes,
            "ours <= 3",
        )
    )
    rows.append(
        (
            "pool MB in use after the build",
            reuse.pool.in_use_bytes / 2**20,
            "no reuse MB",
            plain.pool.in_use_bytes / 2**20,
            "info",
        )
    )

    # GPU time, interleaved so clock and thermal drift hit both alike
    ours: list[float] = []
    peer: list[float] = []
    for _ in range(3):
        ours += gpu_ms_samples(reuse.update, reuse.stream, 20, 7)
        peer += gpu_ms_samples(plain.update, plain.stream, 20, 7)
    rows.append(
        ("GPU ms/frame with reuse", statistics.median(ours), "without reuse ms", statistics.median(peer), "<= 1.05")
    )

    try:
        import cupy as cp

        x = cp.asarray(image)
        stream = cp.cuda.Stream(non_blocking=True)

        def cupy_frame() -> None:
            with stream:
                y = x
                for i, f in enumerate(factors):
                    y = y * np.float32(f) + np.float32(1e-3 * i)

        cupy_frame()
        stream.synchronize()
        pool = cp.get_default_memory_pool()
        cupy_ms: list[float] = []
        for _ in range(3):
            cupy_ms += gpu_ms_samples(cupy_frame, d.CUstream(stream.ptr), 20, 7)
        rows.append(
            ("GPU ms/frame with reuse", statistics.median(ours), "CuPy ops ms", statistics.median(cupy_ms), "info")
        )
        rows.append(
            (
                "pool MB in use",
                reuse.pool.in_use_bytes / 2**20,
                "CuPy pool total MB",
                pool.total_bytes() / 2**20,
                "info",
            )
        )
    except ImportError:
        print("(CuPy missing: no CuPy rows)")

    got, want = reuse.read(reuse_blocks[-1], "Out"), plain.read(plain_blocks[-1], "Out")
    same = bool(np.array_equal(got, want))

    print()
    print(
        f"device: {reuse.device.name} ({reuse.device.arch}); {args.blocks} Scale blocks on "
        f"{args.width}x{args.height} RGBA32F ({image_bytes / 1e6:.0f} MB per image); "
        f"{len(reuse.graph.plan.buffers)} buffers with reuse ({len(shared)} shared), "
        f"{len(plain.graph.plan.buffers)} without; results equal: {same}"
    )
    print(f"{'measure':40} {'ours':>10} {'peer':>18} {'peer val':>10} {'ratio':>8}  target")
    out = []
    for name, value, peer_name, peer_value, target in rows:
        ratio = value / peer_value if peer_value else float("nan")
        print(f"{name:40} {value:10.3f} {peer_name:>18} {peer_value:10.3f} {ratio:8.3f}  {target}")
        out.append({"measure": name, "ours": value, "peer": peer_name, "peer_value": peer_value, "target": target})
    write_results("memory.json", {"rows": out, "equal": same})
    reuse.close()
    plain.close()
    if not same:
        sys.exit("MISMATCH: reuse changed the result")


if __name__ == "__main__":
    main()
