#!/usr/bin/env python3
"""Graph compiler benchmark: ``compile_plan`` on chains of Scale blocks, on the CPU (no GPU needed).

A Cold edit pays ``Context.snapshot()`` + ``compile_plan`` + realize; this times the middle part,
the pure compiler, for a 100-block and a 1,000-block chain at profiling levels None and PerKernel
(the level that places the most stamps). The snapshot is taken once, outside the timing. Also
printed beside it, as the peer measured in the same run: ``Context.snapshot()`` of the same patch,
the other host-side cost of every Cold rebuild.

Prints median and best times (ms) and the cost per block.

Then the edits of ``bench_liveness.py`` on chains of ``--edit-sizes`` blocks (1,000 and 10,000), planned
as the build thread plans them (``GraphBuilds.prepare``): ``Context.snapshot()`` + ``compile_plan``
with the engine's ``NodeCache`` (incremental planning, ``compiler/resume.py``), and after it the
``BypassIndex`` and ``built_view`` the build thread makes of the plan from the last ones. Each beside the
same made whole (snapshot + ``compile_plan`` without the cache, ``BypassIndex`` and ``built_view`` of the
whole plan: what a build paid before incremental planning, and what a fused patch paid before its
groups resumed), measured in the same run, as a ratio. Edits: add a block at the end, unlink it, link
it again, remove it; a Hot value changed in the middle of the chain with a block added at the end in
the same build; the link in the middle of the chain removed and made again (the blocks after it are
planned again); the block in the middle bypassed and restored (fused: it leaves its group, which is
planned again). Fusion off, as ``bench_liveness.py`` runs, and on (the engine's default: a chain of
Scale blocks fuses into groups of about 500; an edit plans the groups from the first one it touches).

The first table also has ``fused`` and ``unfused`` rows (level None, ``fuse`` on and off) and
``fusion``: the fusion phase alone (``compiler.fusion``, on a draft planned up to it).

Usage: ``python benchmarks/bench_compile.py [--sizes 100 1000] [--seconds 2] [--edit-sizes 1000 10000]``.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cudapatch import DType, Scale, compile_plan  # noqa: E402
from cudapatch.engine import Context, ExternalBinding  # noqa: E402
from cudapatch.engine.built_view import built_view  # noqa: E402
from cudapatch.engine.bypass import BypassIndex  # noqa: E402
from cudapatch.engine.compiler import NodeCache, delays, fusion, order, sizes, validate  # noqa: E402
from cudapatch.engine.compiler.draft import PlanDraft  # noqa: E402
from cudapatch.engine.profiling import ProfilingLevel  # noqa: E402


def scale_chain(blocks: int, elements: int = 1024) -> Context:
    """``blocks`` Scale blocks in a chain, the first reading an external buffer."""
    ctx = Context()
    prev = None
    for i in range(blocks):
        s = ctx.register_block(Scale(name=f"s{i}", Factor=1.0 + i * 1e-3))
        if prev is None:
            ctx.bind_input(s, "In", ExternalBinding(0x7000_0000, elements, DType.FLOAT32))
        else:
            ctx.connect(prev, "Out", s, "In")
        prev = s
    return ctx


def time_ms(fn, seconds: float, min_calls: int = 5) -> tuple[float, float, int]:
    """Median and best wall time of ``fn`` in ms over about ``seconds`` of calls (at least ``min_calls``)."""
    fn()  # warm caches (descriptor properties, the first allocation of every list)
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    gc_was = gc.isenabled()
    gc.disable()  # a collection landing in one call is noise, not the compiler's cost
    try:
        while len(times) < min_calls or time.perf_counter() < deadline:
            t = time.perf_counter_ns()
            fn()
            times.append((time.perf_counter_ns() - t) / 1e6)
            if len(times) % 20 == 0:
                gc.collect()
    finally:
        if gc_was:
            gc.enable()
    return statistics.median(times), min(times), len(times)


def _ms(fn) -> tuple[float, object]:  # noqa: ANN001
    t = time.perf_counter_ns()
    out = fn()
    return (time.perf_counter_ns() - t) / 1e6, out


def fusion_ms(snap, seconds: float) -> tuple[float, float, int]:  # noqa: ANN001
    """Median and best ms of the fusion phase alone, each call on a fresh draft planned up to it."""
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < 5 or time.perf_counter() < deadline:
        draft = PlanDraft(snap)
        validate(draft)
        order(draft)
        sizes(draft)
        delays(draft)
        gc.disable()
        t = time.perf_counter_ns()
        fusion(draft)
        times.append((time.perf_counter_ns() - t) / 1e6)
        gc.enable()
    return statistics.median(times[1:]), min(times[1:]), len(times) - 1


def bench_edits(n: int, repeats: int, fuse: bool = False) -> None:
    """The edits of ``bench_liveness.py`` on an ``n``-block chain: edit re-plan beside a full plan."""
    ctx = scale_chain(n)
    blocks = list(ctx.registry)
    cache = NodeCache()
    plan = compile_plan(ctx.snapshot(), fuse=fuse, cache=cache)
    view = built_view(plan, ctx.snapshot().names, None)
    index = BypassIndex(plan)
    last = blocks[-1]
    tail = Scale(name="tail")
    factors = itertools.count(2)  # a new value each round: the middle block is planned again

    def add() -> None:
        ctx.register_block(tail)
        ctx.connect(last, "Out", tail, "In")

    edits = [
        ("add block", add),
        ("unlink it", lambda: ctx.disconnect(last, "Out", tail, "In")),
        ("link it", lambda: ctx.connect(last, "Out", tail, "In")),
        ("remove it", lambda: ctx.unregister_block(tail)),
        ("hot mid, add", lambda: (blocks[n // 2].set("Factor", next(factors)), add())),
        ("remove it", lambda: ctx.unregister_block(tail)),
        ("unlink mid", lambda: ctx.disconnect(blocks[n // 2], "Out", blocks[n // 2 + 1], "In")),
        ("link mid", lambda: ctx.connect(blocks[n // 2], "Out", blocks[n // 2 + 1], "In")),
        ("bypass mid", lambda: setattr(blocks[n // 2], "enabled", False)),
        ("restore mid", lambda: setattr(blocks[n // 2], "enabled", True)),
    ]
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for name, edit in edits:
                edit()
                t_snap, snap = _ms(ctx.snapshot)
                t_plan, new = _ms(lambda snap=snap: compile_plan(snap, fuse=fuse, cache=cache))
                delta = cache.delta  # as ``GraphBuilds.prepare`` does: from the last plan's index and view
                t_index, index = _ms(lambda new=new, index=index, delta=delta: BypassIndex(new, index, delta))
                base = view
                t_view, view = _ms(
                    lambda new=new, snap=snap, view=view, delta=delta: built_view(new, snap.names, view, delta)
                )
                t_full, whole = _ms(lambda: compile_plan(ctx.snapshot(), fuse=fuse))
                t_full += _ms(lambda whole=whole: BypassIndex(whole))[0]
                t_full += _ms(lambda whole=whole, snap=snap, base=base: built_view(whole, snap.names, base))[0]
                rows.setdefault(name, []).append((t_snap + t_plan, t_index + t_view, t_full, t_snap))
                gc.collect()
    finally:
        if gc_was:
            gc.enable()
    for name, rs in rows.items():
        plan_ms = statistics.median(r[0] for r in rs)
        after_ms = statistics.median(r[1] for r in rs)
        full_ms = statistics.median(r[2] for r in rs)
        print(
            f"{n:>7} {'on' if fuse else 'off':>4} {name:>12} {plan_ms:>10.2f} {after_ms:>12.2f}"
            f" {plan_ms + after_ms:>9.2f} {full_ms:>9.2f}"
            f" {(plan_ms + after_ms) / full_ms:>7.3f}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="*", default=[100, 1000])
    ap.add_argument("--seconds", type=float, default=2.0, help="timing budget per measurement")
    ap.add_argument("--edit-sizes", type=int, nargs="*", default=[1000, 10000])
    ap.add_argument("--repeats", type=int, default=5, help="rounds of the edits per chain")
    args = ap.parse_args()
    print(f"{'blocks':>7} {'level':>10} {'median ms':>10} {'best ms':>9} {'µs/block':>9} {'calls':>6}")
    for n in args.sizes:
        ctx = scale_chain(n)
        snap = ctx.snapshot()
        for level in (ProfilingLevel.NONE, ProfilingLevel.PER_KERNEL):
            med, best, calls = time_ms(lambda snap=snap, level=level: compile_plan(snap, level=level), args.seconds)
            print(f"{n:>7} {str(level):>10} {med:>10.3f} {best:>9.3f} {med * 1e3 / n:>9.2f} {calls:>6}")
        for label, fuse in (("fused", True), ("unfused", False)):
            med, best, calls = time_ms(lambda snap=snap, fuse=fuse: compile_plan(snap, fuse=fuse), args.seconds)
            print(f"{n:>7} {label:>10} {med:>10.3f} {best:>9.3f} {med * 1e3 / n:>9.2f} {calls:>6}")
        med, best, calls = fusion_ms(snap, args.seconds)
        print(f"{n:>7} {'fusion':>10} {med:>10.3f} {best:>9.3f} {med * 1e3 / n:>9.2f} {calls:>6}")
        med, best, calls = time_ms(ctx.snapshot, args.seconds)
        print(f"{n:>7} {'snapshot':>10} {med:>10.3f} {best:>9.3f} {med * 1e3 / n:>9.2f} {calls:>6}")
    if args.edit_sizes:
        print()
        print("edit re-plan (median ms): snapshot + compile_plan with the cache; BypassIndex + built_view after it;")
        print(
            "beside the same made whole (snapshot + compile_plan without the cache, index and view of it), as a ratio"
        )
        head = f"{'blocks':>7} {'fuse':>4} {'edit':>12} {'re-plan':>10} {'index+view':>12}"
        print(f"{head} {'total':>9} {'whole':>9} {'ratio':>7}")
        for fuse in (False, True):
            for n in args.edit_sizes:
                bench_edits(n, args.repeats, fuse)


if __name__ == "__main__":
    main()
