#!/usr/bin/env python3
"""A host's edit calls at any patch size: what each ``HostAdapter`` call costs the host's thread in a
chain of 100, 1,000 and 10,000 operators, beside the same call at 100 (target: flat, ≤ 1.5x).

A host (TouchDesigner's callbacks, the standalone preview's patch file) makes these calls on its own
frame thread before the cook, so one that walks the patch drops frames in a large one: at 10,000
operators a rename took 46 ms, a disconnect 24 ms and a hot swap of a middle operator 50 ms on the CPU
machine (lists of every link scanned, a cycle check that walked the chain below the link) before the
adapter and the Context indexed what they look up (``host_plugin/operator_index.py``,
``engine/link_order.py``).

The real adapter, engine, Context and blocks over the stand-in device and kernel builder of the unit
tests (``bench_hot_cpu.py``'s): the calls time Python only (none of them calls the driver). A middle
operator of the chain is edited: created, linked, unlinked, renamed, deleted; a value set; bypassed;
hot-swapped (deleted, made again, linked between its neighbours). Each row is the median of
``--rounds`` calls, an ``update()`` (a build, on the calling thread) between rounds.

Usage: ``python benchmarks/bench_edit_calls.py [--sizes 100 1000 10000] [--rounds 15]``.
Writes ``edit_calls.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from bench_hot_cpu import _stand_ins  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.host_plugin import HostAdapter, PluginHost  # noqa: E402


def measure(n: int, rounds: int) -> dict[str, float]:
    """Median µs of each edit call on a chain of ``n`` Scale operators fed by a Fill."""
    with Engine(cache_dir=False, watch_files=False, background_builds=False, wait_for_compile=True) as e:
        a = HostAdapter(e, PluginHost().registry)
        a.create("fill", "core.Fill", {"Count": 1024})
        prev = "fill"
        for i in range(n):
            a.create(f"s{i}", "core.Scale")
            a.connect(prev, "Out", f"s{i}", "In")
            prev = f"s{i}"
        e.update()
        mid, below = f"s{n // 2}", f"s{n // 2 + 1}"
        calls: dict[str, Callable[[int], object]] = {
            "create": lambda i: a.create(f"x{i}", "core.Scale"),
            "connect": lambda i: a.connect(mid, "Out", f"x{i}", "In"),
            "disconnect": lambda i: a.disconnect(mid, "Out", f"x{i}", "In"),
            "rename": lambda i: a.rename(f"x{i}", f"y{i}"),
            "delete": lambda i: a.delete(f"y{i}"),
            "set_param": lambda i: a.set_param(mid, "Factor", 1.0 + i * 1e-3),
            "set_bypass": lambda i: a.set_bypass(mid, i % 2 == 0),
            "hot_swap": lambda i: a.hot_swap(below, "core.Scale"),
        }
        times: dict[str, list[float]] = {k: [] for k in calls}
        for i in range(rounds):
            for name, call in calls.items():
                t = time.perf_counter_ns()
                call(i)
                times[name].append((time.perf_counter_ns() - t) / 1e3)
            e.update()
        assert len(a.links()) == n and a.block(below).context is not None  # the chain is whole again
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    _stand_ins()
    results = {n: measure(n, args.rounds) for n in args.sizes}
    base = results[min(args.sizes)]
    print(f"{'call':12}" + "".join(f"{f'µs at {n}':>14}" for n in args.sizes) + f"{'ratio':>8}  (largest / smallest)")
    for name in base:
        row = "".join(f"{results[n][name]:14.1f}" for n in args.sizes)
        print(f"{name:12}{row}{results[max(args.sizes)][name] / base[name]:8.2f}")
    write_results("edit_calls.json", {str(n): r for n, r in results.items()})


if __name__ == "__main__":
    main()
