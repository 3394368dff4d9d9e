#!/usr/bin/env python3
"""Composite blocks: what a composite costs per frame, beside the same blocks patched flat.

Three patches of one chain of ``--blocks`` Scales: the blocks registered one by one (the peer), a
composite holding them flattened (the default), and the same composite as one CUDA child-graph node.
For each: GPU time per frame, host time of a quiet ``update()``, and host time of an ``update()``
that applies one Hot edit setting every Factor (the flat peer: one ``set`` per block; a composite:
one exposed parameter whose slots are all its inner kernels'). Flattened should match the peer;
the child graph pays one ``cuGraphExecChildGraphNodeSetParams`` per Hot edit on top.

Prints a table (ours, peer, ratio) and writes ``composites.json`` to ``$RESULTS_DIR`` when set.
Usage: ``python benchmarks/bench_composites.py [--blocks 100] [--elements 4096]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _results import write_results  # noqa: E402
from _timing import gpu_ms, host_us  # noqa: E402

from cudapatch import Composite, CompositeBuilder, Engine, Scale  # noqa: E402


def chain_composite(n: int) -> type[Composite]:
    class Chain(Composite):
        type_name = "Chain"

        def compose(self, c: CompositeBuilder) -> None:
            for i in range(n):
                c.add(f"s{i}", Scale(Factor=1.0001))
                if i:
                    c.link(f"s{i - 1}.Out", f"s{i}.In")
            c.expose("In", "s0.In")
            c.expose("Out", f"s{n - 1}.Out")
            c.expose("Gain", *(f"s{i}.Factor" for i in range(n)))

    return Chain


def measure(mode: str, n: int, x: np.ndarray) -> dict[str, float]:
    eng = Engine(wait_for_compile=True)
    try:
        if mode == "flat":
            blocks = [eng.add(Scale(name=f"s{i}", Factor=1.0001)) for i in range(n)]
            for a, b in zip(blocks, blocks[1:], strict=False):
                eng.connect(a, "Out", b, "In")
            head, tail = blocks[0], blocks[-1]

            def hot(v: float) -> None:
                for b in blocks:
                    b.set("Factor", v)
        else:
            comp = eng.add(chain_composite(n)(name="chain", child_graph=mode == "child graph"))
            head = tail = comp

            def hot(v: float) -> None:
                comp.set("Gain", v)

        eng.bind(head, "In", x)
        eng.wait_ready()
        eng.update()
        rebuilds = eng.counters.rebuilds
        sync = eng.device.synchronize
        quiet = host_us(eng.update, 2000, sync)
        values = iter(np.tile([1.0001, 0.9999], 1000))

        def edit() -> None:
            hot(float(next(values)))
            eng.update()

        edit_us = host_us(edit, 1000, sync)
        gpu = gpu_ms(eng.update, eng.device.stream)
        assert eng.counters.rebuilds == rebuilds, "a Hot edit rebuilt the graph"
        out = eng.read(tail, "Out")
        assert np.isfinite(out).all()
        return {"gpu_ms": gpu, "quiet_us": quiet, "hot_edit_us": edit_us}
    finally:
        eng.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--elements", type=int, default=4096)
    args = ap.parse_args()
    x = np.random.default_rng(1).standard_normal(args.elements).astype(np.float32)
    t0 = time.perf_counter()
    results = {mode: measure(mode, args.blocks, x) for mode in ("flat", "composite", "child graph")}
    peer = results["flat"]
    print(f"{args.blocks} Scales of {args.elements} floats; peer: the same blocks patched flat")
    print(f"{'what':40s} {'ours':>10s} {'peer':>10s} {'ratio':>7s}")
    labels = {"gpu_ms": "GPU ms per frame", "quiet_us": "quiet update() µs", "hot_edit_us": "Hot edit + update() µs"}
    for mode in ("composite", "child graph"):
        for key, label in labels.items():
            ours = results[mode][key]
            print(f"{mode + ': ' + label:40s} {ours:10.3f} {peer[key]:10.3f} {ours / peer[key]:6.2f}x")
    print(f"(took {time.perf_counter() - t0:.1f} s; GPU ms per frame, host µs medians)")
    write_results("composites.json", {"blocks": args.blocks, **results}, indent=2)


if __name__ == "__main__":
    main()
