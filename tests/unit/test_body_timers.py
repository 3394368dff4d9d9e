"""Body timers without a GPU (``compiler/body_timers.py``): which profiling levels place them, where the
tick and tock kernels go in a body and what they wait for, the layout of their records among the
counters, a frame of the plan interpreter (``plan_interp.py``) whose timer counts equal the iterations
run, the timer kernels' own source built for the host, and the stats a fake readback record makes."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cudapatch import CustomKernel, Fill, For, If, Scale
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.compiler.body_timers import SLOT, TIMER
from cudapatch.engine.plan import ConditionalNodePlan, KernelNodePlan, MemsetNodePlan, ProbeNodePlan
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.engine.region_kernels import TIMER_RECORD_WORDS, TIMER_SLOT_WORDS, TIMER_SOURCE
from cudapatch.engine.region_stats import BodyTime, body_times, decode_timer
from cudapatch.engine.stats import FrameReading, collect_stats, show_on_blocks
from cudapatch.interop.overlay import gpu_cell

from .plan_interp import PlanInterpreter
from .test_region_pingpong import _check, _while
from .test_regions_plan import _body

MORE = """extern "C" __global__ void more(const float* x, int* yes, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) yes[0] = 1; }"""
TIMED = [lv for lv in ProfilingLevel if lv.at_least(ProfilingLevel.PER_BLOCK)]
UNTIMED = [lv for lv in ProfilingLevel if not lv.at_least(ProfilingLevel.PER_BLOCK)]


def _chain(count: int = 5, unroll: int = 1) -> tuple[Context, Fill, For, Scale, Scale]:
    """Src -> For(count) { A -> B }."""
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64, Value=1.0))
    loop = c.register_block(For(name="Loop", Count=count, Unroll=unroll))
    a = c.register_block(Scale(name="A", Factor=0.5))
    b = c.register_block(Scale(name="B", Factor=2.0))
    c.place(a, loop)
    c.place(b, loop)
    c.connect(src, "Out", a, "In")
    c.connect(a, "Out", b, "In")
    return c, src, loop, a, b


def _run(plan, c: Context, **custom) -> PlanInterpreter:
    """An interpreter of ``plan``: Fill's values do not matter to the timers (its output stays poisoned)."""
    return PlanInterpreter(plan, c.snapshot(), custom={"fill": lambda run, node, args: None, **custom})


def _timers(plan) -> list[KernelNodePlan]:
    return [n for n in plan.nodes if isinstance(n, KernelNodePlan) and n.entry_point in ("body_tick", "body_tock")]


def _records(plan) -> dict[int, int]:
    return {unit: ci for rp in plan.regions.values() for unit, ci in rp.timers}


def _timer(run: PlanInterpreter, ci: int) -> BodyTime:
    return decode_timer(run.counters[ci:])


def _assert_consistent(plan) -> None:
    """Indices in order, dependencies backwards within one graph, each body contiguous after its node."""
    for n in plan.nodes:
        assert plan.nodes[n.index] is n
        for d in n.deps:
            assert d < n.index and plan.scopes.get(d) == plan.scopes.get(n.index), (n, d)
        if isinstance(n, KernelNodePlan) and n.args and n.args[0].kind == "handle":
            assert isinstance(plan.nodes[n.args[0].ref], ConditionalNodePlan)
    for cond in (n for n in plan.nodes if isinstance(n, ConditionalNodePlan)):
        inside = _body(plan, cond.index)
        assert sorted(inside) == list(range(cond.index + 1, cond.index + 1 + len(inside)))
    for (bid, _), slots in plan.scalar_slots.items():
        for ni, _ in slots:
            assert plan.nodes[ni].block_id == bid


# -- planning ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("level", UNTIMED)
def test_levels_below_per_block_add_no_timer_nodes(level: ProfilingLevel) -> None:
    c, *_ = _chain()
    plan = compile_plan(c.snapshot(), level=level)
    assert not _timers(plan) and not _records(plan)
    assert plan.counters == compile_plan(c.snapshot()).counters  # the iteration counter alone


@pytest.mark.parametrize("level", TIMED)
def test_per_block_and_finer_time_every_block_of_a_body(level: ProfilingLevel) -> None:
    c, src, loop, a, b = _chain()
    plan = compile_plan(c.snapshot(), level=level)
    assert set(_records(plan)) == {a.id, b.id} and plan.regions[loop.id].timers  # not Src: the top level is stamped
    assert all(n.index in plan.scopes and n.block_id == loop.id for n in _timers(plan))
    _assert_consistent(plan)


def test_a_body_chain_has_one_tick_on_its_path_and_a_tock_beside_each_block() -> None:
    c, src, loop, a, b = _chain()
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    cond = plan.regions[loop.id].node
    body = [plan.nodes[i] for i in sorted(i for i, p in plan.scopes.items() if p == cond)]
    names = [getattr(n, "entry_point", "") for n in body]
    assert names == ["body_tick", "scale", "body_tock", "scale", "body_tock", "region_for_step"]
    tick, ka, tock_a, kb, tock_b, _ = body
    assert ka.deps == (tick.index,) and kb.deps == (ka.index,)  # B waits for A only: no tick of its own
    assert tock_a.deps == (ka.index,) and tock_b.deps == (tock_a.index, kb.index)
    waited = {d for n in plan.nodes for d in n.deps}
    assert tock_a.index not in {d for n in body if n is not tock_b for d in n.deps}
    assert tock_b.index not in waited  # a tock never delays the work
    rec = _records(plan)
    # B's start is the slot A's tock wrote its end time into
    assert tock_b.args[0].ref == tock_a.args[1].ref and tock_a.args[0].ref == tick.args[0].ref
    assert tock_a.args[2].ref == rec[a.id] and tock_b.args[2].ref == rec[b.id]


def test_records_and_slots_are_8_byte_words_among_the_counters_zeroed_each_frame() -> None:
    c, src, loop, a, b = _chain(count=9, unroll=4)
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    (memset,) = [n for n in plan.nodes if isinstance(n, MemsetNodePlan)]
    assert memset.count == len(plan.counters)  # the timers' words are zeroed with the counters
    rec = _records(plan)
    for unit, ci in rec.items():
        assert ci % 2 == 0
        assert plan.counters[ci : ci + TIMER_RECORD_WORDS] == tuple(
            (unit, f"{TIMER}:{ci}.{k}") for k in range(TIMER_RECORD_WORDS)
        )
    slots = set()
    for n in _timers(plan):
        for arg in n.args[: len(n.args) - (n.entry_point == "body_tock")]:
            assert arg.kind == "counter" and arg.ref % 2 == 0
            assert plan.counters[arg.ref] == (loop.id, f"{SLOT}:{arg.ref}.0")
            assert plan.counters[arg.ref + TIMER_SLOT_WORDS - 1] == (loop.id, f"{SLOT}:{arg.ref}.1")
            slots.add(arg.ref)
    # unrolled: 4 copies in the main body and one in the tail, one record per block for all of them
    tocks = [n for n in _timers(plan) if n.entry_point == "body_tock"]
    assert sorted(n.args[2].ref for n in tocks) == sorted([rec[a.id]] * 5 + [rec[b.id]] * 5)
    assert len({n.args[1].ref for n in tocks}) == 10  # each copy's end in a slot of its own
    assert not slots & {ci + k for ci in rec.values() for k in range(TIMER_RECORD_WORDS)}
    _assert_consistent(plan)


def test_a_probe_in_a_body_is_not_part_of_its_blocks_time() -> None:
    c, src, loop, a, b = _chain()
    c.add_probe(a, "Out")
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    (probe,) = [n for n in plan.nodes if isinstance(n, ProbeNodePlan)]
    assert plan.scopes[probe.index] == plan.regions[loop.id].node
    assert all(probe.index not in n.deps for n in _timers(plan))  # it reads A's value beside the work
    _assert_consistent(plan)


def test_an_if_only_patch_gets_a_counters_memset_its_region_waits_for() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64, Value=1.0))
    yes = c.register_block(CustomKernel(name="Yes", Code=MORE))
    maybe = c.register_block(If(name="Maybe"))
    body = c.register_block(Scale(name="Body"))
    c.place(body, maybe)
    c.connect(src, "Out", yes, "x")
    c.connect(yes, "yes", maybe, "Condition")
    c.connect(src, "Out", body, "In")
    assert compile_plan(c.snapshot(), level=ProfilingLevel.SUMMARY).counters == ()
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    (memset,) = [n for n in plan.nodes if isinstance(n, MemsetNodePlan)]
    assert memset.index not in plan.scopes and memset.count == len(plan.counters) > 0
    assert memset.index in plan.nodes[plan.regions[maybe.id].node].deps  # zeroed before the body times
    assert set(_records(plan)) == {body.id}
    _assert_consistent(plan)
    run = _run(plan, c, more=lambda r, n, a: a[1].view(np.int32).__setitem__(0, 1))
    run.frame()
    assert _timer(run, _records(plan)[body.id]).runs == 1


def test_a_region_nested_in_a_body_is_timed_as_one_of_its_units() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64, Value=0.0))
    outer = c.register_block(For(name="Outer", Count=3, Unroll=1))
    inner = c.register_block(For(name="Inner", Count=4, Unroll=1))
    a = c.register_block(Scale(name="A", Offset=1.0))
    b = c.register_block(Scale(name="B", Offset=100.0))
    c.place(inner, outer)
    c.place(a, inner)
    c.place(b, outer)
    c.connect(src, "Out", a, "In")
    c.connect(a, "Out", b, "In")
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    _assert_consistent(plan)
    assert {u for u, _ in plan.regions[outer.id].timers} == {inner.id, b.id}
    assert {u for u, _ in plan.regions[inner.id].timers} == {a.id}
    run = _run(plan, c)
    for _ in range(2):  # the records start again every frame
        run.frame()
        rec = _records(plan)
        ta, tb, ti = (_timer(run, rec[u]) for u in (a.id, b.id, inner.id))
        assert (ta.runs, tb.runs, ti.runs) == (12, 3, 3)  # the inner loop's 4 in each of the outer's 3
        assert ti.total_ms > ta.total_ms  # an inner run holds its 4 runs of A, and its own kernels
        assert ta.min_ms <= ta.total_ms / ta.runs <= ta.max_ms


@pytest.mark.parametrize("unroll", [1, 3, 8])
@pytest.mark.parametrize("count", [0, 1, 7, 20])
def test_a_for_blocks_timer_counts_its_iterations(count: int, unroll: int) -> None:
    c, src, loop, a, b = _chain(count, unroll)
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    run = _run(plan, c)
    run.frame()
    rec = _records(plan)
    assert int(run.counters[plan.regions[loop.id].counter]) == count
    for blk in (a, b):
        t = _timer(run, rec[blk.id])
        assert t.runs == count
        if count:  # the interpreter's clock ticks once a launch: every run lasts a launch or more
            assert t.min_ms >= 1e-6 and t.total_ms >= count * t.min_ms
        else:
            assert t == BodyTime(0.0, 0, None, None)


@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_a_whiles_timer_counts_match_its_iteration_count(unroll: int) -> None:
    for limit in (1.5, 40.0, 1e9):
        c, loop, d, s, chk = _while(12, unroll, limit, count=16)
        plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
        _assert_consistent(plan)
        rp = plan.regions[loop.id]
        run = _run(plan, c, check=_check)
        run.frame()
        its = int(run.counters[rp.counter])
        rec = _records(plan)
        assert _timer(run, rec[s.id]).runs == its
        # an unrolled While makes the block only its condition reads once per pass (condition_only.py)
        passes = its if unroll == 1 else its // unroll + its % unroll
        assert _timer(run, rec[chk.id]).runs == passes, (limit, its)


def test_the_timer_kernels_are_realized_in_their_body_graphs_on_their_counter_words(monkeypatch) -> None:
    from cudapatch.engine import realize
    from cudapatch.engine.buffers import BufferPool

    from .recording_driver import RegionDriver, StubDevice, install

    rec = install(monkeypatch, RegionDriver())
    c, src, loop, a, b = _chain(count=5, unroll=2)
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    snap = c.snapshot()
    g = realize(
        plan,
        device=StubDevice(),  # type: ignore[arg-type]
        pool=BufferPool(),
        bindings=snap.bindings,
        block_names={blk.id: blk.name for blk in snap.blocks},
        functions={(n.block_id, n.kernel): 100 + 10 * n.block_id + n.kernel % 10 for n in plan.kernel_nodes},
        publish_function=3,
        stamp_function=4,
    )
    counters = g.counters.ptr + 8 * plan.stamp_count  # the readback block: timestamps, then the counters
    timers = _timers(plan)
    assert len(timers) == 2 + 6  # a tick at the start of each body graph (main, tail), a tock per run of a block
    for n in timers:
        assert g._nodes[n.index].handle in rec.body_nodes
        for k, arg in enumerate(n.args):
            assert g.node_arg(n.index, k) == counters + 4 * arg.ref
    g.close()


# -- the kernels, built for the host -------------------------------------------------------------------

_HOST = r"""
#define __global__
#define __device__
static unsigned long long g_now;
extern "C" void set_now(unsigned long long t) { g_now = t; }
typedef unsigned long long u64;
static u64 atomicAdd(u64* p, u64 v) { u64 o = *p; *p += v; return o; }
static unsigned int atomicAdd(unsigned int* p, unsigned int v) { unsigned int o = *p; *p += v; return o; }
static u64 atomicMax(u64* p, u64 v) { u64 o = *p; if (v > o) *p = v; return o; }
"""
_ASM = 'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));'


def test_the_timer_kernels_accumulate_sum_extremes_and_count(tmp_path: Path) -> None:
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler to run the kernels' logic on the CPU")
    assert TIMER_SOURCE.count(_ASM) == 2  # the one line the host build replaces by its clock
    src = tmp_path / "timers.cpp"
    src.write_text(_HOST + TIMER_SOURCE.replace(_ASM, "t = g_now;"))
    lib = tmp_path / "timers.so"
    subprocess.run([cxx, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True, capture_output=True)
    k = ctypes.CDLL(str(lib))
    words = np.zeros(8 + 4, np.uint32)  # a record, then two slots
    record, start, end = (words[i:].ctypes.data_as(ctypes.c_void_p) for i in (0, 8, 10))
    for begin, finish in ((1_000, 1_250), (5_000, 5_100), (9_000, 9_400)):
        k.set_now(ctypes.c_ulonglong(begin))
        k.body_tick(start)
        k.set_now(ctypes.c_ulonglong(finish))
        k.body_tock(start, end, record)
        assert int(words[10:12].view(np.uint64)[0]) == finish
    assert decode_timer(words) == BodyTime(750 / 1e6, 3, 100 / 1e6, 400 / 1e6)
    k.set_now(ctypes.c_ulonglong(10))  # a start after the end (never on one timer): counted as zero
    k.body_tock(words[10:].ctypes.data_as(ctypes.c_void_p), end, record)
    assert decode_timer(words) == BodyTime(750 / 1e6, 4, 0.0, 400 / 1e6)


# -- readback and stats ----------------------------------------------------------------------------------


def _record(total_ns: int, runs: int, lo_ns: int, hi_ns: int) -> np.ndarray:
    w = np.zeros(TIMER_RECORD_WORDS, np.uint32)
    w[0:6].view(np.uint64)[:] = (total_ns, hi_ns, ~np.uint64(lo_ns))
    w[6] = runs
    return w


class _Ring:
    """What ``body_times`` reads of a ``ReadbackRing``: the newest frame's counters."""

    def __init__(self, counters: int, frame: int | None = 7) -> None:
        self.latest = np.zeros(counters, np.uint32)
        self.latest_frame = frame
        self.frozen = False
        self.polls = 0

    def poll(self) -> bool:
        self.polls += 1
        return False


def test_a_record_decodes_to_total_runs_and_extremes() -> None:
    assert decode_timer(_record(5_000_000, 100, 40_000, 70_000)) == BodyTime(5.0, 100, 0.04, 0.07)
    assert decode_timer(np.zeros(TIMER_RECORD_WORDS, np.uint32)) == BodyTime(0.0, 0, None, None)


def test_body_times_read_each_units_record_from_the_ring() -> None:
    c, src, loop, a, b = _chain()
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    ring = _Ring(len(plan.counters))
    rec = _records(plan)
    ring.latest[rec[a.id] : rec[a.id] + TIMER_RECORD_WORDS] = _record(5_000_000, 5, 900_000, 1_200_000)
    graph = SimpleNamespace(plan=plan, readback=ring)
    assert body_times(graph) == {a.id: BodyTime(5.0, 5, 0.9, 1.2), b.id: BodyTime(0.0, 0, None, None)}
    assert ring.polls == 1
    ring.frozen = True  # inside Engine.stats(): the ring stays on one frame
    body_times(graph)
    assert ring.polls == 1
    assert body_times(SimpleNamespace(plan=plan, readback=_Ring(len(plan.counters), frame=None))) == {}
    assert body_times(SimpleNamespace(plan=compile_plan(c.snapshot()), readback=ring)) == {}  # not timed
    assert body_times(None) == {}


def test_stats_show_a_body_blocks_total_and_time_per_iteration() -> None:
    c, src, loop, a, b = _chain(count=100)
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    ring = _Ring(len(plan.counters))
    ring.frozen = True
    rec = _records(plan)
    ring.latest[rec[a.id] : rec[a.id] + TIMER_RECORD_WORDS] = _record(4_200_000, 100, 40_000, 70_000)
    stamps = np.zeros(plan.stamp_count, np.uint64)
    pair = {t.key: t for t in plan.timings if t.kind == "block"}[loop.id]
    stamps[pair.start], stamps[pair.end] = 1_000, 6_001_000  # the region's own time, stamped as today
    graph = SimpleNamespace(plan=plan, readback=ring, occupancy={}, kernel_count=0)
    pool = SimpleNamespace(in_use_bytes=0, total_allocated_bytes=0)
    stats = collect_stats(
        level=plan.level,
        blocks=c.registry,
        graph=graph,
        reading=FrameReading(7, 1, stamps),
        pool=pool,
        diagnostics=(),
    )
    rows = {r.block_id: r for r in stats.blocks}
    ra = rows[a.id]
    assert (ra.gpu_ms, ra.runs, ra.min_ms, ra.max_ms) == (4.2, 100, 0.04, 0.07)
    assert ra.mean_ms == pytest.approx(0.042)
    assert rows[loop.id].gpu_ms == 6.0 and rows[loop.id].runs is None  # a top-level region: stamped
    assert (rows[b.id].gpu_ms, rows[b.id].runs, rows[b.id].mean_ms) == (0.0, 0, None)  # did not run
    assert rows[src.id].runs is None and rows[src.id].mean_ms is None
    show_on_blocks(stats, c.registry)
    assert str(a).splitlines() == ["A: NotCompiled, 4.20ms", "  Per iteration: 42.0µs x 100 (min 40.0µs, max 70.0µs)"]
    assert "Per iteration: did not run" in str(b) and "Per iteration" not in str(loop)
    assert gpu_cell(ra) == "4.200 (100x 42.0µs)" and gpu_cell(rows[loop.id]) == "6.000"
    assert gpu_cell(rows[b.id]) == "0.000"
