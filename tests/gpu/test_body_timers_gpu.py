"""Body timers on a real GPU (``compiler/body_timers.py``): a block inside a loop's body gets its time in the
frame and per iteration at PerBlock and up, counted once per iteration it ran; nested regions; a While's
timer count equals its iteration count; an If's body block ran once or not at all; profiling level
changes add and remove the timer nodes; and the resolution of the GPU's timer, printed (``-s``)."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CustomKernel, Engine, Fill, For, If, Scale

from .conftest import ABOVE, ADD, halving_while

pytestmark = pytest.mark.gpu

# One thread reads the GPU's nanosecond timer in a loop and writes down by how much it moved each time
# it changed: the timer's update period, the resolution of every time the body timers measure.
TICKS = """extern "C" __global__ void ticks(unsigned int* out, unsigned int n)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    unsigned long long last, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(last));
    for (unsigned int i = 0; i < n;) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t != last) { out[i++] = (unsigned int)(t - last); last = t; }
    }
}"""


def _frames(engine: Engine, n: int = 4) -> None:
    """Run ``n`` frames and make them complete, then one more (the ring publishes the ones before)."""
    for _ in range(n):
        engine.update()
    engine.synchronize()
    engine.update()
    engine.synchronize()


def _rows(engine: Engine) -> dict[str, object]:
    return {b.name: b for b in engine.show_frame().blocks}


def _timer_nodes(engine: Engine) -> int:
    return sum(1 for n in engine.graph.plan.kernel_nodes if n.entry_point in ("body_tick", "body_tock"))


def _for(engine: Engine, count: int, unroll: int, n: int = 1 << 20) -> tuple[For, CustomKernel]:
    start = engine.add(Fill(name="Start", Count=n, Value=1.0))
    loop = engine.add(For(name="Loop", Count=count, Unroll=unroll))
    add = engine.add(CustomKernel(name="Add", Code=ADD, step=0.5), region=loop)
    engine.connect(start, "Out", add, "x")
    return loop, add


@pytest.mark.parametrize("unroll", [1, 8])
def test_a_for_bodys_block_gets_a_time_per_iteration(engine: Engine, unroll: int) -> None:
    loop, add = _for(engine, 20, unroll)
    engine.set_profiling("PerBlock")
    _frames(engine)
    np.testing.assert_array_equal(engine.read(add, "x"), np.full(1 << 20, 1.0 + 20 * 0.5, np.float32))
    rows = _rows(engine)
    a, r = rows["Add"], rows["Loop"]
    assert a.runs == 20 and engine.iterations(loop) == 20
    assert a.gpu_ms > 0 and a.min_ms > 0 and a.min_ms <= a.mean_ms <= a.max_ms
    eps = 1 + 1e-9  # the ms are nanoseconds / 1e6: equal sums may round apart
    assert a.runs * a.min_ms <= a.gpu_ms * eps and a.gpu_ms <= a.runs * a.max_ms * eps  # N runs of one iteration
    assert r.runs is None and r.gpu_ms >= a.gpu_ms  # the region's own time (stamped) holds its body's
    assert "Per iteration: " in str(add) and "x 20 (min " in str(add) and "Iterations: 20/20" in str(loop)
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    loop.set("Count", 40)  # Hot: the timers count what runs, no rebuild
    _frames(engine)
    a40 = _rows(engine)["Add"]
    assert a40.runs == 40 and engine.graph is graph and engine.counters.rebuilds == rebuilds
    ratio = a40.gpu_ms / a.gpu_ms
    assert 1.3 < ratio < 3.0, f"twice the iterations took {ratio:.2f}x the time ({a.gpu_ms} -> {a40.gpu_ms} ms)"


def test_nested_regions_time_each_block_and_the_inner_region_per_run(engine: Engine) -> None:
    start = engine.add(Fill(name="Start", Count=1 << 18, Value=0.0))
    outer = engine.add(For(name="Outer", Count=3))
    inner = engine.add(For(name="Inner", Count=4), region=outer)
    a = engine.add(CustomKernel(name="A", Code=ADD, step=1.0), region=inner)
    b = engine.add(CustomKernel(name="B", Code=ADD, step=100.0), region=outer)
    engine.connect(start, "Out", a, "x")
    engine.connect(a, "x", b, "x")
    engine.set_profiling("PerBlock")
    _frames(engine)
    np.testing.assert_array_equal(engine.read(b, "x"), np.full(1 << 18, 3 * (4 * 1.0 + 100.0), np.float32))
    rows = _rows(engine)
    ra, rb, ri, ro = rows["A"], rows["B"], rows["Inner"], rows["Outer"]
    assert (ra.runs, rb.runs, ri.runs, ro.runs) == (12, 3, 3, None)  # Outer is top-level: stamped
    assert min(ra.gpu_ms, rb.gpu_ms) > 0
    assert ri.gpu_ms >= ra.gpu_ms  # each run of Inner holds 4 of A
    # Inner and B run one after the other in each of Outer's iterations, all inside Outer's span (one clock;
    # a few timer periods of slack for the rounding of each reading)
    assert ri.gpu_ms + rb.gpu_ms <= ro.gpu_ms + 0.01


def test_a_whiles_timer_count_is_its_iteration_count(engine: Engine) -> None:
    start = engine.add(Fill(name="Start", Count=256, Value=1024.0))
    solve, halve, check = halving_while(engine, start)
    engine.set_profiling("PerKernel")  # finer than PerBlock: bodies are still timed per block
    _frames(engine)
    rows = _rows(engine)
    assert engine.iterations(solve) == 10 == rows["Halve"].runs == rows["Check"].runs
    assert rows["Halve"].kernels[0].gpu_ms is None  # kernels inside bodies have no time of their own
    solve.set("Max", 4)  # Hot: the guard stops it early
    _frames(engine)
    rows = _rows(engine)
    assert engine.iterations(solve) == 4 == rows["Halve"].runs == rows["Check"].runs
    np.testing.assert_array_equal(engine.read(halve, "x"), np.full(256, 64.0, np.float32))


def test_an_if_bodys_block_ran_once_or_not_at_all(engine: Engine) -> None:
    level = engine.add(Fill(name="Level", Count=1 << 16, Value=5.0))
    check = engine.add(CustomKernel(name="Check", Code=ABOVE, level=1.0))
    maybe = engine.add(If(name="Maybe"))
    body = engine.add(Scale(name="Body", Factor=3.0), region=maybe)
    engine.connect(level, "Out", check, "in")
    engine.connect(check, "more", maybe, "Condition")
    engine.connect(level, "Out", body, "In")
    engine.set_profiling("PerBlock")
    _frames(engine)
    row = _rows(engine)["Body"]
    assert row.runs == 1 and row.gpu_ms > 0 and row.mean_ms == row.gpu_ms
    check.set("level", 10.0)  # Hot: 5 > 10 is false, the body is skipped on the GPU
    _frames(engine)
    row = _rows(engine)["Body"]
    assert (row.runs, row.gpu_ms, row.mean_ms) == (0, 0.0, None) and "Per iteration: did not run" in str(body)


def test_profiling_level_changes_add_and_remove_the_timer_nodes(engine: Engine) -> None:
    loop, add = _for(engine, 6, 1, n=4096)
    for level, timed in (("None", False), ("PerBlock", True), ("Summary", False), ("DeepAsync", True), ("None", False)):
        engine.set_profiling(level)  # a rebuild: the level is part of the graph
        _frames(engine)
        np.testing.assert_array_equal(engine.read(add, "x"), np.full(4096, 1.0 + 6 * 0.5, np.float32))
        assert (_timer_nodes(engine) > 0) == timed, level
        row = _rows(engine)["Add"]
        assert (row.runs == 6) if timed else (row.runs is None), (level, row)
        assert ("Per iteration" in str(add)) == timed


def test_the_gpu_timers_resolution(engine: Engine) -> None:
    ticks = engine.add(CustomKernel(name="Ticks", Code=TICKS, Count=512))
    engine.update()
    deltas = engine.read(ticks, "out")[1:].astype(np.int64)  # the first step starts mid-period
    assert deltas.min() > 0
    print(
        f"\n%globaltimer on {engine.device.name}: moves every {np.median(deltas):.0f} ns "
        f"(min {deltas.min()}, max {deltas.max()} ns over {deltas.size} steps)"
    )
