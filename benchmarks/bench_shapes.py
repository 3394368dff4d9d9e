#!/usr/bin/env python3
"""Shapes cost nothing per frame: a clean ``update()`` of an image patch (2-D launches, shapes and input
checks on every block) beside a bare ``cuGraphLaunch`` of the same executable graph, and beside the
same chain over flat data, all in one run.

The checks run when a graph is planned (Cold rebuilds), never per frame: ``update()`` with nothing dirty
stays one graph launch. The plan-time cost is printed too: ``compile_plan`` of the image patch beside
the flat one (same blocks, same count). No peer library is needed (CuPy or not, the same rows).

Prints a table (ours, peer, ratio) and writes ``shapes.json`` to ``$RESULTS_DIR`` when set.
Both patches are timed in alternating rounds. Usage:
``python benchmarks/bench_shapes.py [--blocks 100] [--width 1920] [--height 1080] [--rounds 5]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import host_us  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Scale  # noqa: E402
from cudapatch.engine import compile_plan  # noqa: E402
from tests.unit.shape_blocks import Gain2D  # noqa: E402


def build(eng: Engine, nb: int, data: np.ndarray, image: bool) -> list:
    """A chain of ``nb`` blocks over ``data``: Gain2D blocks (2-D launches) for an image, Scale blocks
    for flat data; either way every block's input is checked against its launch when planned."""
    make = (lambda i: Gain2D(name=f"g{i}", Gain=1.0001)) if image else (lambda i: Scale(name=f"s{i}", Factor=1.0001))
    blocks = [eng.add(make(i)) for i in range(nb)]
    port_in, port_out = "In", "Out"
    for a, b in zip(blocks, blocks[1:], strict=False):
        eng.connect(a, port_out, b, port_in)
    eng.bind(blocks[0], port_in, data)
    eng.wait_ready()
    eng.update()
    eng.synchronize()
    return blocks


def plan_ms(eng: Engine, repeats: int = 20) -> float:
    """Median ms of ``compile_plan`` of the engine's patch, unfused as the engine plans it."""
    snap = eng.context.snapshot()
    times = []
    for _ in range(repeats):
        t = time.perf_counter_ns()
        compile_plan(snap, fuse=False)
        times.append(time.perf_counter_ns() - t)
    return statistics.median(times) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--width", type=int, default=1920)
    ap.add_argument("--height", type=int, default=1080)
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds of 1,000 calls per side")
    args = ap.parse_args()
    logging.getLogger("cudapatch").setLevel(logging.ERROR)
    rng = np.random.default_rng(0)
    img = rng.standard_normal((args.height, args.width)).astype(np.float32)
    rows: list[tuple[str, float, str, float]] = []

    # Both patches are built first and timed in alternating rounds (median of the rounds' medians), so
    # neither side is the one timed while the other engine's build threads settle or the machine drifts.
    engines = []
    for label, data, image in (("image (2-D)", img, True), ("flat (1-D)", img.ravel(), False)):
        eng = Engine(wait_for_compile=True, fuse=False)  # the flat chain as many nodes as the image patch
        blocks = build(eng, args.blocks, data, image)
        kinds = {n.yz != (1, 1, 1, 1) for n in eng.graph.plan.kernel_nodes}
        assert kinds == {image}, f"{label}: expected {'2-D' if image else '1-D'} launches"
        engines.append((label, eng, blocks))
    timed: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _, _ in engines}
    for _ in range(args.rounds):
        for label, eng, _ in engines:
            stream, sync, gexec = eng.device.stream, eng.device.synchronize, eng.graph.handle
            timed[label][0].append(host_us(eng.update, 1000, sync))
            timed[label][1].append(host_us(lambda g=gexec, s=stream: d.cuGraphLaunch(g, s), 1000, sync))
    for label, eng, blocks in engines:
        ours, bare = (statistics.median(v) for v in timed[label])
        rows.append((f"{label}: update() host µs, nothing dirty", ours, "bare cuGraphLaunch µs", bare))
        rows.append((f"{label}: compile_plan ms ({args.blocks} blocks)", plan_ms(eng), "-", 0.0))
        got = eng.read(blocks[-1], "Out")
        ref = img.astype(np.float64) * 1.0001**args.blocks
        err = float(np.max(np.abs(got.reshape(img.shape) - ref)) / np.max(np.abs(ref)))
        print(f"{label}: {eng.device.name}, {args.blocks} blocks over {args.height}x{args.width}; rel. error {err:.2e}")
        eng.close()

    print(f"{'measure':52} {'ours':>10} {'peer':>24} {'peer val':>10} {'ratio':>8}")
    out = []
    for name, ours, peer, peer_val in rows:
        ratio = f"{ours / peer_val:.2f}" if peer_val else "-"
        pv = f"{peer_val:.2f}" if peer_val else "-"
        print(f"{name:52} {ours:10.2f} {peer:>24} {pv:>10} {ratio:>8}")
        out.append({"measure": name, "ours": ours, "peer": peer, "peer_value": peer_val})
    image_update, flat_update = rows[0][1], rows[2][1]
    print(f"clean update(), image patch / flat patch: {image_update / flat_update:.2f}x (target: 1.0, nothing added)")
    write_results("shapes.json", {"rows": out})


if __name__ == "__main__":
    main()
