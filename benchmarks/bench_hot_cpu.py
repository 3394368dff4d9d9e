#!/usr/bin/env python3
"""The Python share of a Hot and a Warm edit, on the CPU: what ``set()`` and the ``update()`` that
applies it cost beyond a quiet ``update()``, for a member of a fused chain beside the same block
unfused.

The real Engine, tiers and ``CompiledGraph`` (realized by ``realize`` from the real plan) over the
stand-in device and kernel builder of the unit tests and a driver whose ``cu*`` calls return at once:
what is timed is the engine's own Python, everything but the driver calls. On the GPU machine
``bench_fusion.py`` (section 3) and ``bench_engine.py`` time the same edits with the driver: the
difference is the driver's share (``cuGraphExecKernelNodeSetParams``, ~1.4 µs for a small kernel on
the H100 host; more for a fused kernel, whose argument list holds every member's scalars). Target
(issue 21): a Hot edit of a fused member costs what it costs unfused, ≤ 3 µs with the driver.

The unfused row also times a bypass toggle (``enabled`` flipped, then the ``update()`` that applies
it: the Bypass tier's Python; target with the driver ≤ 10 µs, ``bench_liveness.py``).

Each row is the smallest of ``--repeats`` medians of ``--calls`` edits (the machine's noise adds,
never subtracts). Usage: ``python benchmarks/bench_hot_cpu.py [--blocks 100] [--calls 20000]``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import cudapatch.kernels._driver as driver_module  # noqa: E402
from cudapatch import Engine, Scale  # noqa: E402
from cudapatch.engine import engine as engine_module  # noqa: E402
from cudapatch.engine import resources as resources_module  # noqa: E402
from cudapatch.kernels.builder import CompiledKernel  # noqa: E402
from cudapatch.kernels.source import KernelImage  # noqa: E402
from tests.unit.recording_driver import OK, RecordingDriver  # noqa: E402
from tests.unit.test_engine_orchestration import DeviceArray, FakeBuilder, FakeDevice, FakeModules  # noqa: E402


class _QuietDriver(RecordingDriver):
    """The recording driver, recording nothing: each call returns at once."""

    def _rec(self, *call: Any) -> None:
        pass

    def cuGraphExecKernelNodeSetParams(self, exec_, node, kp):  # noqa: N802
        return (OK,)

    def cuGraphLaunch(self, exec_, stream):  # noqa: N802
        return (OK,)

    def cuGraphNodeSetEnabled(self, exec_, node, on):  # noqa: N802
        return (OK,)


class _Builder(FakeBuilder):
    """Every compile done at once, with an integer function handle (``realize`` puts it in a struct)."""

    def submit(self, source: Any) -> Future:
        f: Future = Future()
        image = KernelImage(source.describe(), b"", "cubin", "k", "k.cu")
        f.set_result(CompiledKernel(source, image, 0x1234, "", 0))
        return f


def _stand_ins() -> None:
    resources_module.DeviceContext = FakeDevice
    resources_module.ModuleCache = FakeModules
    engine_module.KernelBuilder = _Builder
    FakeDevice.max_threads_per_multiprocessor = 2048  # what ``realize`` reads of the device (an H100's)
    driver_module._driver = _QuietDriver()


def _median_us(run: Any, calls: int) -> float:
    times = []
    clock = time.perf_counter_ns
    for i in range(calls):
        t = clock()
        run(i)
        times.append(clock() - t)
    return statistics.median(times) / 1e3


def measure(fuse: bool, blocks: int, calls: int, repeats: int) -> dict[str, float]:
    """Host µs of a quiet ``update()``, of ``set()``, of the ``update()`` applying it and of the one
    applying a rebind (``bind`` of another array), for the middle block of a chain of ``blocks``."""
    with Engine(cache_dir=False, watch_files=False, background_builds=False, wait_for_compile=True, fuse=fuse) as e:
        chain = [e.add(Scale(Factor=1.0, Offset=0.0)) for _ in range(blocks)]
        arrays = [DeviceArray(1024, 0x7F0000000000), DeviceArray(1024, 0x7F0000100000)]
        e.bind(chain[0], "In", arrays[0])
        for a, b in zip(chain, chain[1:], strict=False):
            e.connect(a, "Out", b, "In")
        e.update()
        e.update()
        nodes = len(e.graph.plan.nodes) if e.graph is not None else 0
        # Unfused a node per block; fused a kernel per group (a long chain is cut into groups of a few hundred)
        assert nodes == blocks if not fuse else 1 <= nodes <= max(1, blocks // 100), (fuse, nodes)
        target, values = chain[blocks // 2], [1.0 + k * 1e-3 for k in range(7)]

        def hot_set(i: int) -> None:
            target.set("Factor", values[i % 7])

        def hot(i: int) -> None:
            target.set("Factor", values[i % 7])
            e.update()

        def warm(i: int) -> None:
            e.bind(chain[0], "In", arrays[i & 1])
            e.update()

        def bind(i: int) -> None:
            e.bind(chain[0], "In", arrays[i & 1])

        def quiet(i: int) -> None:
            e.update()

        def toggle(i: int) -> None:
            target.enabled = bool(i & 1)  # off, on, off, ...
            e.update()

        runs = [("quiet", quiet), ("set", hot_set), ("hot", hot), ("warm", warm), ("bind", bind)]
        if not fuse:  # a fused member has no node of its own to turn off
            target.enabled = False
            e.update()  # the build that gives its values buffers of their own (buffer reuse)
            e.update()
            target.enabled = True
            e.update()
            runs.append(("toggle", toggle))
        rows: dict[str, list[float]] = {key: [] for key, _ in runs}
        for _ in range(repeats):
            for key, run in runs:
                rows[key].append(_median_us(run, calls))
            e.update()  # what ``bind`` left pending
        best = {k: min(v) for k, v in rows.items()}
        assert e.counters.hot_updates > 0 and e.counters.warm_updates > 0
        assert fuse or e.counters.bypass_updates >= calls
    q = best["quiet"]
    return {
        "quiet_update_us": q,
        "set_us": best["set"],
        "hot_update_us": best["hot"] - best["set"] - q,  # the update() applying it, beyond a quiet one
        "hot_total_us": best["hot"] - q,  # set() + update() beyond a quiet update(): bench_fusion's row
        "warm_update_us": best["warm"] - best["bind"] - q,
        "toggle_us": best["toggle"] - q if "toggle" in best else float("nan"),  # enabled flag + update()
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=100)
    ap.add_argument("--calls", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    _stand_ins()
    print(f"Python host µs per edit, chain of {args.blocks} Scale blocks (driver calls return at once)")
    head = ("", "quiet update", "set()", "Hot update", "set+update", "Warm update", "bypass toggle")
    print("{:<9} {:>13} {:>7} {:>11} {:>11} {:>12} {:>14}".format(*head))
    for fuse in (True, False):
        r = measure(fuse, args.blocks, args.calls, args.repeats)
        print(
            f"{'fused' if fuse else 'unfused':<9} {r['quiet_update_us']:>13.2f} {r['set_us']:>7.2f} "
            f"{r['hot_update_us']:>11.2f} {r['hot_total_us']:>11.2f} {r['warm_update_us']:>12.2f} "
            f"{r['toggle_us']:>14.2f}"
        )
    print("(beyond the quiet update(); on the GPU host add the driver's share: bench_engine.py, bench_liveness.py)")


if __name__ == "__main__":
    main()
