#!/usr/bin/env python3
"""Liveness benchmark: what a structure edit costs the frame, beside the quiet frames of the same run.

Chains of N ``Scale`` blocks (1024 floats). With ``update()`` running every frame: add a block at
the end, remove it, add a link, remove it. For each edit: the slowest ``update()`` from the edit
until it is live, against the quiet median (target ≤ max(1 ms, 3× quiet)), and the frames until
live (target ≤ 3 at 100 and 1,000 blocks, ≤ 500 ms at 10,000). Peer: a bare ``cuGraphLaunch`` of
the same executable graph, measured in the same run (target: quiet ``update()`` ≤ 1.5× it).

Usage: ``python benchmarks/bench_liveness.py [--sizes 100 1000 10000] [--elements 1024]``.
Writes ``liveness.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cudapatch import Engine, Scale  # noqa: E402


def quiet_update_us(e: Engine, frames: int = 500) -> float:
    times = []
    for i in range(frames):
        if i % 50 == 0:
            e.synchronize()
        t = time.perf_counter_ns()
        e.update()
        times.append(time.perf_counter_ns() - t)
    e.synchronize()
    return statistics.median(times) / 1e3


def bare_launch_us(e: Engine, frames: int = 500) -> float:
    g = e.graph
    assert g is not None
    stream, times = e.resources.stream, []
    for i in range(frames):
        if i % 50 == 0:
            e.synchronize()
        t = time.perf_counter_ns()
        g.launch(stream)
        times.append(time.perf_counter_ns() - t)
    e.synchronize()
    return statistics.median(times) / 1e3


def until_live(e: Engine, live, fps: float = 60.0, limit_s: float = 30.0) -> tuple[float, int, float]:
    """Run frames at ``fps`` until ``live()``: (slowest update() µs, frames, seconds)."""
    worst, frames, t_start = 0.0, 0, time.perf_counter()
    period = 1.0 / fps
    while True:
        t = time.perf_counter_ns()
        e.update()
        worst = max(worst, (time.perf_counter_ns() - t) / 1e3)
        frames += 1
        if live() and not e.building:
            return worst, frames, time.perf_counter() - t_start
        if time.perf_counter() - t_start > limit_s:
            return worst, -1, limit_s
        time.sleep(max(0.0, period - (time.perf_counter_ns() - t) / 1e9))


def running(e: Engine, block) -> bool:
    g = e.graph
    return g is not None and block.id in g.plan.block_order


def bench_size(n: int, elements: int) -> list[tuple[str, float, str, float, str]]:
    rows = []
    with Engine(name=f"chain{n}") as e:
        x = np.random.default_rng(1).standard_normal(elements).astype(np.float32)
        blocks = [e.add(Scale(name="s0", Factor=1.0))]
        e.bind(blocks[0], "In", x)
        for i in range(1, n):
            b = e.add(Scale(name=f"s{i}", Factor=1.0))
            e.connect(blocks[-1], "Out", b, "In")
            blocks.append(b)
        e.wait_ready()
        e.update()
        quiet = quiet_update_us(e)
        bare = bare_launch_us(e)
        rows.append((f"{n}: quiet update() µs", quiet, "bare cuGraphLaunch µs", bare, "≤ 1.5×"))
        budget = max(1000.0, 3 * quiet)
        tail = e.add(Scale(name="tail"))
        e.connect(blocks[-1], "Out", tail, "In")
        instantiations = e.counters.rebuilds
        worst, frames, secs = until_live(e, lambda: running(e, tail))
        rows.append((f"{n}: add block, slowest update() µs", worst, "budget µs", budget, f"live in {frames} frames"))
        e.disconnect(blocks[-1], "Out", tail, "In")
        worst, frames, secs = until_live(e, lambda: not running(e, tail))
        rows.append((f"{n}: remove link, slowest update() µs", worst, "budget µs", budget, f"live in {frames} frames"))
        e.connect(blocks[-1], "Out", tail, "In")
        worst, frames, secs = until_live(e, lambda: running(e, tail))
        rows.append((f"{n}: add link, slowest update() µs", worst, "budget µs", budget, f"live in {frames} frames"))
        e.remove(tail)
        worst, frames, secs = until_live(e, lambda: e.graph is not None and tail.id not in e.graph.plan.block_order)
        rows.append((f"{n}: remove block, slowest update() µs", worst, "budget µs", budget, f"{secs * 1e3:.0f} ms"))
        rows.append((f"{n}: instantiations for 4 edits", e.counters.rebuilds - instantiations, "edits", 4, ""))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--elements", type=int, default=1024)
    args = ap.parse_args()
    rows = []
    for n in args.sizes:
        rows += bench_size(n, args.elements)
    print(f"{'measure':44} {'ours':>10} {'peer':>22} {'peer val':>10} {'ratio':>8}  note")
    for name, ours, peer, pv, note in rows:
        ratio = f"{ours / pv:.2f}" if pv else "-"
        print(f"{name:44} {ours:10.1f} {peer:>22} {pv:10.1f} {ratio:>8}  {note}")
    out = os.environ.get("RESULTS_DIR")
    if out:
        Path(out, "liveness.json").write_text(
            json.dumps(
                [dict(zip(("measure", "ours", "peer", "peer_val", "note"), r, strict=True)) for r in rows], indent=1
            )
        )


if __name__ == "__main__":
    main()
