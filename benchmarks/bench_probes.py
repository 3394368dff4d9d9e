#!/usr/bin/env python3
"""Probes: GPU time of a 100-block chain with 10 probes beside the same chain without them (target <= 1.05x),
and the synchronizes made while frames run and every probe is read after each (target 0), with the host
time of those reads.

One engine, one run: the probes are added and closed between rounds (each a rebuild, waited for outside
the timed frames), so both sides run on the same buffers and the same GPU state. GPU time per frame comes
from events around 200 frames, the median of the rounds; the host does nothing else between those
frames, so the launches run ahead and the events time the GPU (reading ten probes' statistics after
every frame made the host the slower side at 1,024 elements, so an earlier version of this benchmark
timed the host's reads as GPU time: 1.35x). Run at the default 1,024 elements (the chain of
tiny kernels of ``bench_engine.py``, where the probes' launch overhead shows most) and at 1M elements
(where they read real data). Fusion stays off (the engine's default): a probe keeps the value it reads
from being fused away, so with fusion on the two sides would run different kernels.

Usage: ``python benchmarks/bench_probes.py [--blocks 100] [--probes 10] [--elements 1024 1048576]``;
writes ``probes.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine, Scale  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402

SYNCS = ("cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize")


class SyncCounter:
    """Counts the driver's synchronize calls made while ``counting`` is True (the timed frames only)."""

    def __init__(self) -> None:
        self.counting = False
        self.calls = 0
        for name in SYNCS:
            real = getattr(d, name)

            def counted(*args, _real=real):
                if self.counting:
                    self.calls += 1
                return _real(*args)

            setattr(d, name, counted)


def gpu_ms(eng: Engine, frames: int) -> float:
    """GPU time per frame (ms) from events around ``frames`` updates, nothing else on the host between
    them: the launches run ahead of the GPU, so the events time the GPU's work, not the host's."""
    stream = eng.stream
    start, end = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
    check(d.cuStreamSynchronize(stream))
    check(d.cuEventRecord(start, stream))
    for _ in range(frames):
        eng.update()
    check(d.cuEventRecord(end, stream))
    check(d.cuEventSynchronize(end))
    ms = check(d.cuEventElapsedTime(start, end)) / frames
    check(d.cuEventDestroy(start))
    check(d.cuEventDestroy(end))
    return ms


def read_frames(eng: Engine, probes: list, frames: int, counter: SyncCounter) -> tuple[int, float]:
    """What the editor does: ``frames`` updates, each followed by a read of every probe (plain loads from
    the ring). Returns the synchronizes made and the median host µs of one frame's reads."""
    counter.calls, counter.counting = 0, True
    reads = []
    for _ in range(frames):
        eng.update()
        t = time.perf_counter_ns()
        for p in probes:
            _ = p.stats
        reads.append(time.perf_counter_ns() - t)
    counter.counting = False
    eng.synchronize()
    return counter.calls, statistics.median(reads) / 1e3


def run(blocks: int, n_probes: int, elements: int, frames: int, rounds: int, counter: SyncCounter) -> tuple:
    rng = np.random.default_rng(1)
    with Engine(wait_for_compile=True, fuse=False) as eng:  # probes end fused groups: compare the same nodes
        chain = [eng.add(Scale(name=f"s{i}", Factor=1.0001, Offset=0.0)) for i in range(blocks)]
        for a, b in zip(chain, chain[1:], strict=False):
            eng.connect(a, "Out", b, "In")
        eng.bind(chain[0], "In", rng.standard_normal(elements).astype(np.float32))
        eng.wait_ready()
        step = max(1, blocks // n_probes)
        probed = chain[step - 1 :: step][:n_probes]  # every tenth block's output, the last one's too
        plain, probed_ms, read_us = [], [], []
        syncs = 0
        for _ in range(rounds):
            eng.wait_ready()
            gpu_ms(eng, 20)  # warm
            plain.append(gpu_ms(eng, frames))
            probes = [eng.probe(b, "Out") for b in probed]
            eng.wait_ready()
            assert len(eng.graph.plan.probes) == n_probes
            gpu_ms(eng, 20)
            probed_ms.append(gpu_ms(eng, frames))
            calls, us = read_frames(eng, probes, frames, counter)
            syncs += calls
            read_us.append(us)
            stats = [p.stats for p in probes]
            assert all(s is not None for s in stats), "a probe never reported"
            for p in probes:
                p.close()
        return statistics.median(plain), statistics.median(probed_ms), syncs, statistics.median(read_us)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--probes", type=int, default=10)
    ap.add_argument("--elements", type=int, nargs="+", default=[1024, 1 << 20])
    ap.add_argument("--frames", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    logging.getLogger("cudapatch").setLevel(logging.ERROR)
    counter = SyncCounter()
    print(f"{args.blocks}-block chain, {args.probes} probes, GPU ms per frame (median of {args.rounds} rounds)")
    head = f"{'elements':>10} {'no probes':>10} {'probes':>10} {'ratio':>7} {'syncs':>6} {'reads µs':>9}"
    print(f"{head}  (targets: ratio <= 1.05, syncs 0; reads: host µs per frame, info)")
    rows = []
    for n in args.elements:
        plain, probed, syncs, read_us = run(args.blocks, args.probes, n, args.frames, args.rounds, counter)
        print(f"{n:>10} {plain:>10.4f} {probed:>10.4f} {probed / plain:>7.3f} {syncs:>6} {read_us:>9.1f}")
        rows.append({"elements": n, "plain_ms": plain, "probed_ms": probed, "syncs": syncs, "reads_us": read_us})
    write_results("probes.json", {"blocks": args.blocks, "probes": args.probes, "rows": rows})


if __name__ == "__main__":
    main()
