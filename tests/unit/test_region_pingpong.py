"""Copy-free ping-pong of FrameDelays in unrolled loops, and blocks made once per condition check, without
a GPU: which buffers each copy of a body reads and writes, and a NumPy interpreter of the plan
(``plan_interp.py``) showing that frames of N iterations equal N sequential steps, for N = 0..9,
several unrolls, For and While, nested loops, Hot Count changes and a second reader of ``Out``."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CustomKernel, For, FrameDelay, Scale, VectorAdd, While
from cudapatch.blocks.library import Fill
from cudapatch.engine import Context, ExternalBinding, compile_plan
from cudapatch.engine.plan import ConditionalNodePlan, KernelNodePlan
from cudapatch.kernels.types import DType

from .plan_interp import PlanInterpreter

A, B = 0.5, 0.25  # x * 0.5 + 0.25: exact in float32 for the values here
N = 64


def _steps(x: np.ndarray, k: int) -> np.ndarray:
    for _ in range(k):
        x = x * np.float32(A) + np.float32(B)
    return x


def _x0() -> np.ndarray:
    return np.random.default_rng(7).standard_normal(N).astype(np.float32) * 100


def _loop_patch(c: Context, loop, *, reader: bool = True):
    """``loop`` { d (FrameDelay, Init bound) -> s (x*a+b) -> d.In }, r after the loop reading s."""
    d = c.register_block(FrameDelay(name="d"))
    s = c.register_block(Scale(name="s", Factor=A, Offset=B))
    c.place(d, loop)
    c.place(s, loop)
    c.bind_input(d, "Init", ExternalBinding(0x7000_0000, N, DType.FLOAT32))
    c.connect(d, "Out", s, "In")
    c.connect(s, "Out", d, "In")
    r = None
    if reader:
        r = c.register_block(Scale(name="r", Factor=1.0))
        c.connect(s, "Out", r, "In")
    return d, s, r


def _for(count: int, unroll: int):
    c = Context()
    loop = c.register_block(For(name="Steps", Count=count, Unroll=unroll))
    d, s, r = _loop_patch(c, loop)
    return c, loop, d, s, r


def _interp(c: Context, plan, **kw) -> PlanInterpreter:
    d = next(b for b in c.registry if b.name == "d")
    return PlanInterpreter(plan, c.snapshot(), {(d.id, "Init"): _x0()}, **kw)


def _nodes(plan, block_id: int) -> list:
    return [plan.nodes[i] for i in plan.block_nodes[block_id]]


# -- the plan --------------------------------------------------------------------------------------


def test_an_unrolled_for_alternates_the_delay_buffers_and_syncs_once_after_the_loop() -> None:
    c, loop, d, s, r = _for(10, 4)
    plan = compile_plan(c.snapshot())
    rp = plan.regions[loop.id]
    (dp,) = plan.delays
    p, cur = dp.previous, dp.current
    assert (rp.unroll, rp.pairs is not None, rp.tail is not None) == (4, True, True)
    scales = _nodes(plan, s.id)
    where = [plan.scopes[k.index] for k in scales]
    assert where == [rp.node] * 4 + [rp.pairs] * 2 + [rp.tail]
    # copy j reads Out and writes In when j is even, the other way round when odd; the tail's one copy is even
    assert [(k.args[0].ref, k.args[1].ref) for k in scales] == [(p, cur), (cur, p)] * 3 + [(p, cur)]
    # no copy kernel in any body: the delay's nodes are its init (before the loop) and one sync after it
    init, sync = _nodes(plan, d.id)
    assert init.index == dp.node and sync.index == dp.copy and plan.swaps == {}
    assert sync.entry_point == "delay_sync4" and sync.index not in plan.scopes
    assert [a.kind for a in sync.args] == ["buffer", "buffer", "const", "counter"]
    assert (sync.args[0].ref, sync.args[1].ref, sync.args[2].value, sync.args[3].ref) == (p, cur, N, rp.counter)
    assert rp.tail in sync.deps and 0 in sync.deps  # after the loop's last conditional node
    (after,) = _nodes(plan, r.id)
    assert sync.index in after.deps  # the reader after the loop waits for the sync
    # the second copy of a pair waits for the first (reads what it wrote, writes what it read)
    assert scales[1].deps == (scales[0].index,)
    # the set-condition kernels: main, then pairs, then one copy
    kinds = [n.entry_point for n in _nodes(plan, loop.id) if isinstance(n, KernelNodePlan)]
    assert kinds == [
        "region_begin_n",
        "region_for_step_n",
        "region_for_tail_n",
        "region_for_step_n",
        "region_for_tail",
        "region_for_step",
    ]
    tail_n = next(n for n in _nodes(plan, loop.id) if getattr(n, "entry_point", "") == "region_for_tail_n")
    assert tail_n.args[-1].value == 2 and tail_n.args[0].ref == rp.pairs


@pytest.mark.parametrize(("asked", "used"), [(2, 2), (3, 2), (5, 4), (8, 8)])
def test_a_loop_that_ping_pongs_unrolls_by_whole_pairs(asked: int, used: int) -> None:
    c, loop, *_ = _for(7, asked)
    plan = compile_plan(c.snapshot())
    rp = plan.regions[loop.id]
    assert rp.unroll == used
    assert (rp.pairs is None) == (used == 2)  # unrolled by 2 the main loop is the pairs
    assert not [n for n in plan.nodes if isinstance(n, KernelNodePlan) and n.entry_point.startswith("delay_copy")]


def test_unroll_1_keeps_the_copy_per_iteration() -> None:
    c, loop, d, s, r = _for(7, 1)
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    assert plan.nodes[dp.copy].entry_point == "delay_copy4" and plan.scopes[dp.copy] == plan.regions[loop.id].node


def test_a_delay_whose_in_is_made_outside_the_loop_keeps_its_copies() -> None:
    """Ping-pong needs the value linked into In to be written in every iteration."""
    c = Context()
    loop = c.register_block(For(name="Steps", Count=5, Unroll=4))
    f = c.register_block(Fill(name="f", Count=N, Value=2.0))
    d = c.register_block(FrameDelay(name="d", Count=N))
    s = c.register_block(Scale(name="s"))
    c.place(d, loop)
    c.place(s, loop)
    c.connect(d, "Out", s, "In")
    c.connect(f, "Out", d, "In")
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    assert plan.nodes[dp.copy].entry_point == "delay_copy4"
    assert plan.regions[loop.id].pairs is None and plan.regions[loop.id].unroll == 4
    copies = [n for n in _nodes(plan, d.id) if n.entry_point == "delay_copy4"]
    assert len(copies) == 5  # 4 in the main body, one in the tail


# -- N sequential iterations, by the interpreter -----------------------------------------------------


@pytest.mark.parametrize("unroll", [1, 2, 3, 4, 5, 8])
def test_for_frames_equal_n_sequential_steps_for_every_count(unroll: int) -> None:
    c, loop, d, s, r = _for(0, unroll)
    plan = compile_plan(c.snapshot())
    run = _interp(c, plan)
    state = _x0()
    for count in [*range(10), 9, 3, 0, 1]:  # Hot Count edits on one plan, as the engine patches them
        run.scalars[(loop.id, "Count")] = count
        run.frame()
        state = _steps(state, count)
        np.testing.assert_array_equal(run.output(d.id, "Out"), state, err_msg=f"Out, Count={count}")
        if count:  # with Count 0 the body does not run: s keeps an older value
            np.testing.assert_array_equal(run.output(s.id, "Out"), state, err_msg=f"In, Count={count}")
            np.testing.assert_array_equal(run.output(r.id, "Out"), state, err_msg=f"after, Count={count}")
        assert run.counters[plan.regions[loop.id].counter] == count
    copies = sum(v for (b, k), v in run.kernels_run.items() if b == d.id and k in (-8, -9))
    if unroll > 1:  # ping-pong: no copy kernel ran
        assert copies == 0


def test_a_second_reader_of_out_in_the_body_sees_the_previous_iteration() -> None:
    for unroll in (1, 2, 4, 8):
        c, loop, d, s, r = _for(0, unroll)
        total = c.register_block(VectorAdd(name="total"))
        c.place(total, loop)
        c.connect(d, "Out", total, "A")
        c.connect(s, "Out", total, "B")
        plan = compile_plan(c.snapshot())
        run = _interp(c, plan)
        state = _x0()
        for count in (5, 1, 8, 7):
            run.scalars[(loop.id, "Count")] = count
            run.frame()
            prev, state = _steps(state, count - 1), _steps(state, count)
            np.testing.assert_array_equal(run.output(total.id, "Sum"), prev + state, err_msg=f"U={unroll} N={count}")


@pytest.mark.parametrize("unroll", [1, 2, 4, 8])
@pytest.mark.parametrize("outer_unroll", [1, 3])
def test_a_delay_in_a_nested_for_equals_outer_times_inner_steps(unroll: int, outer_unroll: int) -> None:
    c = Context()
    outer = c.register_block(For(name="Outer", Count=1, Unroll=outer_unroll))
    loop = c.register_block(For(name="Steps", Count=1, Unroll=unroll))
    c.place(loop, outer)
    d, s, r = _loop_patch(c, loop)
    plan = compile_plan(c.snapshot())
    run = _interp(c, plan)
    state = _x0()
    for a, b in ((3, 5), (2, 0), (1, 9), (4, 7), (0, 3)):
        run.scalars[(outer.id, "Count")] = a
        run.scalars[(loop.id, "Count")] = b
        run.frame()
        state = _steps(state, a * b)
        np.testing.assert_array_equal(run.output(d.id, "Out"), state, err_msg=f"{a} x {b}")
    syncs = [n for n in _nodes(plan, d.id) if n.entry_point == "delay_sync4"]
    if unroll > 1:  # one sync after each copy of the inner loop, inside the outer body
        assert syncs and all(
            plan.scopes[n.index] in {plan.regions[outer.id].node, plan.regions[outer.id].tail} for n in syncs
        )


def test_a_delay_in_the_outer_loop_with_an_inner_loop_in_its_body() -> None:
    """Outer(Count=a) { d -> Inner(Count=b) { s2 } -> s -> d.In }: ping-pong in the outer loop's copies
    swaps the buffers the inner loop's nodes read too."""
    for unroll in (1, 2, 4):
        c = Context()
        outer = c.register_block(For(name="Outer", Count=1, Unroll=unroll))
        inner = c.register_block(For(name="Inner", Count=1, Unroll=2))
        d = c.register_block(FrameDelay(name="d"))
        twice = c.register_block(Scale(name="twice", Factor=2.0))  # reads Out inside the inner loop
        s = c.register_block(Scale(name="s", Factor=A, Offset=B))
        for blk in (d, inner, s):
            c.place(blk, outer)
        c.place(twice, inner)
        c.bind_input(d, "Init", ExternalBinding(0x7000_0000, N, DType.FLOAT32))
        c.connect(d, "Out", twice, "In")
        c.connect(twice, "Out", s, "In")
        c.connect(s, "Out", d, "In")
        plan = compile_plan(c.snapshot())
        run = _interp(c, plan)
        state = _x0()
        for a in range(6):
            run.scalars[(outer.id, "Count")] = a
            run.scalars[(inner.id, "Count")] = 1 + a % 2
            run.frame()
            for _ in range(a):
                state = state * np.float32(2.0) * np.float32(A) + np.float32(B)
            np.testing.assert_array_equal(run.output(d.id, "Out"), state, err_msg=f"U={unroll} a={a}")


# -- While ---------------------------------------------------------------------------------------------

CHECK = r"""
extern "C" __global__ void check(const float* x, int* more, float limit, unsigned int n)
{
    if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = x[0] < limit;
}
"""


def _check(run: PlanInterpreter, node: KernelNodePlan, args: list) -> None:
    x, more, limit = args[0], args[1], args[2]
    more.view(np.int32)[0] = int(x[0] < np.float32(run._value(limit)))


def _while(max_: int, unroll: int, limit: float, count: int = N):
    """While(Max) { d -> s (x*2) -> d.In; check: more = s.Out[0] < limit }, Init = 1, ``count`` elements."""
    c = Context()
    loop = c.register_block(While(name="Solve", Max=max_, Unroll=unroll))
    d = c.register_block(FrameDelay(name="d", Count=count, Fill=1.0))
    s = c.register_block(Scale(name="s", Factor=2.0))
    chk = c.register_block(CustomKernel(name="chk", Code=CHECK, limit=limit))
    for blk in (d, s, chk):
        c.place(blk, loop)
    c.connect(d, "Out", s, "In")
    c.connect(s, "Out", d, "In")
    c.connect(s, "Out", chk, "x")
    c.connect(chk, "more", loop, "Condition")
    return c, loop, d, s, chk


@pytest.mark.parametrize("unroll", [1, 2, 3, 4, 8])
def test_while_frames_equal_the_iterations_run_and_stop_within_a_pass(unroll: int) -> None:
    for max_ in range(1, 10):
        for limit in (1.5, 4.0, 40.0, 1e9):
            c, loop, d, s, chk = _while(max_, unroll, limit)
            plan = compile_plan(c.snapshot())
            rp = plan.regions[loop.id]
            run = PlanInterpreter(plan, c.snapshot(), custom={"check": _check})
            run.frame()
            its = int(run.counters[rp.counter])
            exact = 1  # the first iteration whose result is not below the limit (a While runs at least once)
            while exact < max_ and 2.0**exact < limit:
                exact += 1
            step = rp.unroll
            assert exact <= its <= min(max_, exact + step - 1), (max_, limit, unroll, its)
            if unroll == 1:
                assert its == exact
            want = np.full(N, 2.0**its, np.float32)
            np.testing.assert_array_equal(run.output(d.id, "Out"), want, err_msg=f"Max={max_} limit={limit}")
            np.testing.assert_array_equal(run.output(s.id, "Out"), want)
            more = run.output(chk.id, "more", np.int32)[0]
            assert more == int(2.0**its < limit)  # the last iteration's condition, whichever copy made it


def test_an_unrolled_while_makes_its_condition_once_per_pass() -> None:
    c, loop, d, s, chk = _while(100, 4, 1e9)
    plan = compile_plan(c.snapshot())
    rp = plan.regions[loop.id]
    checks = _nodes(plan, chk.id)
    assert [plan.scopes[n.index] for n in checks] == [rp.node, rp.pairs, rp.pairs, rp.tail]
    # the pairs' tail checks after each pair (its step reads the condition once per pass of two)
    scales = _nodes(plan, s.id)
    assert len(scales) == 4 + 2 + 1
    assert isinstance(plan.nodes[rp.node], ConditionalNodePlan)


def test_a_block_whose_output_the_next_iteration_reads_is_made_in_every_copy() -> None:
    c, loop, d, s, chk = _while(100, 4, 1e9)
    code = r"""
extern "C" __global__ void use(const float* x, const int* more, float* out, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * more[0];
}
"""
    use = c.register_block(CustomKernel(name="use", Code=code))
    c.place(use, loop)
    c.connect(s, "Out", use, "x")
    c.connect(chk, "more", use, "more")
    plan = compile_plan(c.snapshot())
    # use's output is read by nobody in the body: like the condition, only its last value shows
    assert len(_nodes(plan, chk.id)) == len(_nodes(plan, use.id)) == 1 + 2 + 1
    c.disconnect(s, "Out", d, "In")
    c.connect(use, "out", d, "In")  # now the next iteration reads it: made in every copy, and so is chk
    plan = compile_plan(c.snapshot())
    assert len(_nodes(plan, chk.id)) == len(_nodes(plan, use.id)) == 4 + 2 + 1


# -- realize (the recording stand-in for the driver) ---------------------------------------------------


def test_realize_puts_each_copy_in_its_body_with_the_buffers_swapped(monkeypatch) -> None:
    from cudapatch.engine.buffers import BufferPool

    from .recording_driver import RegionDriver, install, realize_regions

    rec = install(monkeypatch, RegionDriver())
    c, loop, d, s, r = _for(10, 4)
    plan = compile_plan(c.snapshot())
    g = realize_regions(c, plan, BufferPool())
    assert rec.names().count("instantiate") == 1 and g._exec1 is None  # one executable: nothing alternates
    assert len([call for call in rec.calls if call[0] == "add_conditional"]) == 3  # main, pairs, tail
    (dp,) = plan.delays
    p, cur = g.buffers[dp.previous].ptr, g.buffers[dp.current].ptr
    scales = _nodes(plan, s.id)
    assert [(g.node_arg(k.index, 0), g.node_arg(k.index, 1)) for k in scales] == [(p, cur), (cur, p)] * 3 + [(p, cur)]
    assert all(g._nodes[k.index].handle in rec.body_nodes for k in scales)
    sync = g._nodes[dp.copy]
    assert sync.handle not in rec.body_nodes
    assert (g.node_arg(dp.copy, 0), g.node_arg(dp.copy, 1), g.node_arg(dp.copy, 2)) == (p, cur, N)
    g.update_scalars({(loop.id, "Count"): 5})  # Hot: every set-condition kernel's Count slot, the new ones too
    slots = plan.scalar_slots[(loop.id, "Count")]
    assert {plan.nodes[ni].entry_point for ni, _ in slots} == {
        "region_begin_n",
        "region_for_step_n",
        "region_for_tail_n",
        "region_for_tail",
        "region_for_step",
    }
    assert all(g.node_arg(ni, ai) == 5 for ni, ai in slots)
    g.close()


@pytest.mark.parametrize("level", ["Summary", "PerBlock", "PerKernel"])
def test_profiling_stamps_keep_the_tails_and_the_sync_in_place(level: str) -> None:
    from cudapatch.engine.profiling import ProfilingLevel

    c, loop, d, s, r = _for(10, 4)
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.parse(level))
    rp = plan.regions[loop.id]
    for node in (rp.node, rp.pairs, rp.tail):
        assert isinstance(plan.nodes[node], ConditionalNodePlan) and node not in plan.scopes
    assert [plan.scopes[k.index] for k in _nodes(plan, s.id)] == [rp.node] * 4 + [rp.pairs] * 2 + [rp.tail]
    (dp,) = plan.delays
    sync = plan.nodes[dp.copy]
    assert sync.entry_point == "delay_sync4" and dp.copy not in plan.scopes and rp.tail in sync.deps
    handles = {
        n.args[0].ref for n in plan.nodes if isinstance(n, KernelNodePlan) and n.args and n.args[0].kind == "handle"
    }
    assert handles == {rp.node, rp.pairs, rp.tail}
    run = _interp(c, plan)
    run.frame()
    np.testing.assert_array_equal(run.output(d.id, "Out"), _steps(_x0(), 10))


def test_a_probe_in_a_body_that_ping_pongs_reads_the_buffer_its_copy_wrote() -> None:
    from cudapatch.engine.plan import ProbeNodePlan

    c, loop, d, s, r = _for(10, 4)
    c.add_probe(s, "Out")
    plan = compile_plan(c.snapshot())
    rp = plan.regions[loop.id]
    (dp,) = plan.delays
    probes = [n for n in plan.nodes if isinstance(n, ProbeNodePlan)]
    # the main body's last copy (odd: writes Out's buffer), both copies of a pair, the tail's one copy
    assert [(plan.scopes[n.index], n.buffer) for n in probes] == [
        (rp.node, dp.previous),
        (rp.pairs, dp.current),
        (rp.pairs, dp.previous),
        (rp.tail, dp.current),
    ]
    assert len({n.probe for n in probes}) == 1  # one record, written by whichever copy ran last
    scales = _nodes(plan, s.id)
    for n in probes:  # right after the copy of s that wrote it
        writer = max(k.index for k in scales if k.index < n.index)
        assert writer in n.deps and plan.nodes[writer].args[1].ref == n.buffer


def test_a_library_call_making_in_keeps_the_copies() -> None:
    """A captured call may read its output before writing it (cuBLAS with beta): ping-pong does not carry it."""
    from cudapatch.blocks.library import FFT

    c = Context()
    loop = c.register_block(For(name="Steps", Count=3))  # the default Unroll: 8
    d = c.register_block(FrameDelay(name="d", Type="float2", Count=64))
    fft = c.register_block(FFT(name="fft", Kind="C2C", Nx=64))
    c.place(d, loop)
    c.place(fft, loop)
    c.connect(d, "Out", fft, "In")
    c.connect(fft, "Out", d, "In")
    plan = compile_plan(c.snapshot())
    rp = plan.regions[loop.id]
    (dp,) = plan.delays
    assert (rp.unroll, rp.pairs) == (8, None) and plan.nodes[dp.copy].entry_point == "delay_copy4"
