"""Fusion in patches with If/While/For regions, without a GPU: which blocks fuse (a chain at the top
level, a chain inside one body, never across a body's boundary, two bodies or nested regions; a
region's Condition and a FrameDelay read their value like any block), where the fused node goes (in
the body, in every copy of an unrolled one, with each member's Hot slots), what stays as without
regions (``fuse=False``, profiling, bypass), and, through the NumPy interpreter of the plan
(``plan_interp.py``), that fused plans compute bit for bit what unfused plans compute, frame after
frame, over hand-made and random region patches."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CustomKernel, Expression, For, FrameDelay, If, Scale, VectorAdd, While
from cudapatch.engine import Context, ExternalBinding, compile_plan
from cudapatch.engine.compiler.fusion import FUSED_KERNEL, FusedSource
from cudapatch.engine.plan import ProbeNodePlan
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import GraphCompileError
from cudapatch.kernels.types import DType

from .plan_interp import PlanInterpreter

N = 256
_ptr = iter(range(0x4000_0000, 1 << 40, 0x10000))

ADD = """extern "C" __global__ void add(/*inout*/ float* x, float step, unsigned int n)
{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] += step; }"""
ABOVE = """extern "C" __global__ void above(const float* in, int* more, float level, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = in[0] > level; }"""


def _add(run: PlanInterpreter, node, args: list) -> None:
    x, step, n = args
    x[: int(n.value)] += np.float32(run._value(step))


def _above(run: PlanInterpreter, node, args: list) -> None:
    x, more, level = args[0], args[1], args[2]
    more.view(np.int32)[0] = int(x[0] > np.float32(run._value(level)))


CUSTOM = {"add": _add, "above": _above}


def _bind(c: Context, block, port: str, externals: dict, rng: np.random.Generator, n: int = N) -> None:
    c.bind_input(block, port, ExternalBinding(next(_ptr), n, DType.FLOAT32))
    externals[(block.id, port)] = rng.standard_normal(n).astype(np.float32)


def _groups(plan) -> set[tuple[int, ...]]:
    """The fused groups of ``plan`` (once each, however many copies of a body hold them)."""
    return {n.source.members for n in plan.kernel_nodes if isinstance(n.source, FusedSource)}


def _scopes(plan, block_id: int) -> list[int | None]:
    """The conditional node holding each of a block's nodes (None: the top-level graph)."""
    return [plan.scopes.get(i) for i in plan.block_nodes[block_id]]


def _add_in(c: Context, block, region):
    c.register_block(block)
    if region is not None:
        c.place(block, region)
    return block


def _same_results(
    c: Context,
    externals: dict,
    frames: int = 3,
    hot: dict | None = None,
    level: ProfilingLevel = ProfilingLevel.NONE,
) -> tuple:
    """Run the fused and the unfused plan of ``c`` frame by frame in the interpreter (``hot``: frame ->
    Hot values set before it) and check every output the fused plan keeps, bit for bit, each frame.
    Returns both plans."""
    snap = c.snapshot()
    plain = compile_plan(snap, fuse=False, level=level)
    fused = compile_plan(snap, fuse=True, level=level)
    runs = [PlanInterpreter(p, snap, externals, CUSTOM) for p in (plain, fused)]
    for frame in range(frames):
        for run in runs:
            run.scalars.update((hot or {}).get(frame, {}))
            run.frame()
        for bid, port in fused.outputs:
            dtype = np.int32 if port == "more" else np.float32
            np.testing.assert_array_equal(
                runs[1].output(bid, port, dtype), runs[0].output(bid, port, dtype), err_msg=f"{port} frame {frame}"
            )
    return plain, fused


# -- which blocks fuse -----------------------------------------------------------------------------


def test_chains_fuse_at_the_top_level_and_inside_a_body_but_never_across_its_boundary() -> None:
    rng, externals, c = np.random.default_rng(1), {}, Context()
    a = _add_in(c, Scale(name="a", Factor=1.5, Offset=0.25), None)
    b = _add_in(c, Expression(name="b", Code="sin(x) * Gain + x", Gain=0.75), None)
    loop = _add_in(c, For(name="Loop", Count=3, Unroll=1), None)
    p = _add_in(c, Scale(name="p", Factor=0.5, Offset=1.0), loop)  # reads b: across the boundary
    q = _add_in(c, Expression(name="q", Code="x * x - Gain", Gain=0.5), loop)
    r = _add_in(c, Scale(name="r", Factor=2.0, Offset=-1.0), None)  # reads q: after the loop
    s = _add_in(c, VectorAdd(name="s"), None)
    _bind(c, a, "In", externals, rng)
    _bind(c, s, "B", externals, rng)
    c.connect(a, "Out", b, "x")
    c.connect(b, "Out", p, "In")
    c.connect(p, "Out", q, "x")
    c.connect(q, "Out", r, "In")
    c.connect(r, "Out", s, "A")
    plain, plan = _same_results(c, externals)
    assert _groups(plan) == {(a.id, b.id), (p.id, q.id), (r.id, s.id)}
    cond = plan.regions[loop.id].node
    assert _scopes(plan, p.id) == _scopes(plan, q.id) == [cond]  # the body's fused node, in the body
    assert _scopes(plan, a.id) == _scopes(plan, s.id) == [None]
    (node,) = (plan.nodes[i] for i in plan.block_nodes[q.id])
    assert node.kernel == FUSED_KERNEL and node.block_id == q.id
    for key in ((p.id, "Factor"), (p.id, "Offset"), (q.id, "Gain")):  # one Hot slot each, in the body's node
        ((ni, ai),) = plan.scalar_slots[key]
        assert ni == node.index and plan.nodes[ni].args[ai].ref == key
    # the values crossing the boundary stay stored: b's for the body, q's for the blocks after the loop
    assert {(b.id, "Out"), (q.id, "Out"), (s.id, "Sum")} <= plan.outputs.keys()
    assert (p.id, "Out") not in plan.outputs and (a.id, "Out") not in plan.outputs
    assert len(plan.kernel_nodes) < len(plain.kernel_nodes)


def test_two_bodies_and_nested_regions_each_fuse_their_own_chains() -> None:
    rng, externals, c = np.random.default_rng(2), {}, Context()
    first = _add_in(c, For(name="First", Count=2), None)
    x1 = _add_in(c, Scale(name="x1", Factor=1.25), first)
    x2 = _add_in(c, Scale(name="x2", Offset=0.5), first)
    second = _add_in(c, For(name="Second", Count=3, Unroll=2), None)
    y1 = _add_in(c, Scale(name="y1", Factor=0.5), second)  # reads x2: another body
    outer = _add_in(c, For(name="Outer", Count=2, Unroll=1), None)
    o1 = _add_in(c, Scale(name="o1", Factor=-1.0), outer)
    inner = _add_in(c, For(name="Inner", Count=3, Unroll=2), outer)
    i1 = _add_in(c, Scale(name="i1", Factor=0.75), inner)  # reads o1: the body around it
    i2 = _add_in(c, Expression(name="i2", Code="abs(x) + Gain", Gain=0.125), inner)
    o2 = _add_in(c, Scale(name="o2", Offset=2.0), outer)  # reads i2: the inner loop's value
    o3 = _add_in(c, Scale(name="o3", Factor=3.0), outer)
    _bind(c, x1, "In", externals, rng)
    _bind(c, o1, "In", externals, rng)
    c.connect(x1, "Out", x2, "In")
    c.connect(x2, "Out", y1, "In")
    c.connect(o1, "Out", i1, "In")
    c.connect(i1, "Out", i2, "x")
    c.connect(i2, "Out", o2, "In")
    c.connect(o2, "Out", o3, "In")
    _, plan = _same_results(c, externals)
    assert _groups(plan) == {(x1.id, x2.id), (i1.id, i2.id), (o2.id, o3.id)}
    assert set(_scopes(plan, i1.id)) <= {plan.regions[inner.id].node, plan.regions[inner.id].tail}
    assert set(_scopes(plan, o3.id)) == {plan.regions[outer.id].node}
    assert len(plan.block_nodes[y1.id]) == 2 + 1 and len(plan.block_nodes[o1.id]) == 1  # alone, in every copy


def test_an_unrolled_body_has_the_fused_node_in_every_copy_with_every_members_hot_slots() -> None:
    rng, externals, c = np.random.default_rng(3), {}, Context()
    loop = _add_in(c, For(name="Loop", Count=10, Unroll=4), None)
    d = _add_in(c, FrameDelay(name="d"), loop)
    e = _add_in(c, Expression(name="e", Code="x * Gain + 0.25", Gain=0.5), loop)
    s = _add_in(c, Scale(name="s", Factor=1.0, Offset=0.125), loop)
    _bind(c, d, "Init", externals, rng)
    c.connect(d, "Out", e, "x")
    c.connect(e, "Out", s, "In")
    c.connect(s, "Out", d, "In")  # ping-pong: the fused node's buffers swap in the odd copies
    hot = {1: {(loop.id, "Count"): 7, (e.id, "Gain"): -0.5}, 2: {(loop.id, "Count"): 0}, 3: {(loop.id, "Count"): 3}}
    _, plan = _same_results(c, externals, frames=5, hot=hot)
    rp = plan.regions[loop.id]
    assert _groups(plan) == {(e.id, s.id)}
    nodes = plan.block_nodes[s.id]
    assert plan.block_nodes[e.id] == nodes and len(nodes) == 4 + 2 + 1  # main copies, the pairs' tail, the tail
    assert [plan.scopes[i] for i in nodes] == [rp.node] * 4 + [rp.pairs] * 2 + [rp.tail]
    assert all(plan.nodes[i].kernel == FUSED_KERNEL for i in nodes)
    for key in ((e.id, "Gain"), (s.id, "Factor"), (s.id, "Offset")):
        assert sorted(ni for ni, _ in plan.scalar_slots[key]) == sorted(nodes)  # one slot per copy: still Hot
    (dp,) = plan.delays
    first, second = (plan.nodes[i] for i in nodes[:2])
    buffers = [[a.ref for a in n.args if a.kind == "buffer"] for n in (first, second)]
    assert buffers == [[dp.previous, dp.current], [dp.current, dp.previous]]


@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_a_delay_in_a_body_ends_the_group_that_feeds_it_and_starts_the_one_that_reads_it(unroll: int) -> None:
    rng, externals, c = np.random.default_rng(4), {}, Context()
    loop = _add_in(c, For(name="Loop", Count=5, Unroll=unroll), None)
    d = _add_in(c, FrameDelay(name="d"), loop)
    a = _add_in(c, Scale(name="a", Factor=0.5), loop)
    b = _add_in(c, Scale(name="b", Offset=0.25), loop)  # b -> d.In, and b -> t (a second reader)
    t = _add_in(c, Scale(name="t", Factor=3.0), loop)
    u = _add_in(c, Scale(name="u", Offset=-1.0), loop)
    _bind(c, d, "Init", externals, rng)
    c.connect(d, "Out", a, "In")
    c.connect(a, "Out", b, "In")
    c.connect(b, "Out", d, "In")
    c.connect(b, "Out", t, "In")
    c.connect(t, "Out", u, "In")
    _, plan = _same_results(c, externals, frames=4, hot={2: {(loop.id, "Count"): 2}})
    assert _groups(plan) == {(a.id, b.id), (t.id, u.id)}
    assert (b.id, "Out") in plan.outputs  # the delay's In: stored, made by the group's sink
    (dp,) = plan.delays
    assert dp.current == plan.outputs[(b.id, "Out")]


def test_a_condition_source_reads_a_stored_value_and_an_unrolled_while_makes_its_group_once_per_pass() -> None:
    """While(Unroll 4) { d -> g (x2) -> d.In; g -> c1 -> c2 -> check -> Condition }: c1 -> c2 fuse, and
    since only the condition reads them they run in the last copy of each pass only, as unfused."""
    for unroll in (1, 4):
        externals, c = {}, Context()
        loop = _add_in(c, While(name="Grow", Max=30, Unroll=unroll), None)
        d = _add_in(c, FrameDelay(name="d", Count=N, Fill=1.0), loop)
        g = _add_in(c, Scale(name="g", Factor=2.0), loop)
        c1 = _add_in(c, Scale(name="c1", Factor=0.5), loop)
        c2 = _add_in(c, Scale(name="c2", Offset=1.0), loop)
        chk = _add_in(c, CustomKernel(name="chk", Code=ABOVE, level=-1000.0), loop)  # -(x/2 + 1) > -1000
        neg = _add_in(c, Scale(name="neg", Factor=-1.0), loop)
        c.connect(d, "Out", g, "In")
        c.connect(g, "Out", d, "In")
        c.connect(g, "Out", c1, "In")
        c.connect(c1, "Out", c2, "In")
        c.connect(c2, "Out", neg, "In")
        c.connect(neg, "Out", chk, "in")
        c.connect(chk, "more", loop, "Condition")
        plain, plan = _same_results(c, externals, frames=2)
        assert _groups(plan) == {(c1.id, c2.id, neg.id)}  # g is read by the delay too: stored, alone
        assert (neg.id, "Out") in plan.outputs  # what the condition's block reads
        rp = plan.regions[loop.id]
        where = [plan.scopes[i] for i in plan.block_nodes[neg.id]]
        if unroll == 1:
            assert where == [rp.node]
        else:  # the last copy of the main body, each copy of the pairs' tail, the tail: as unfused
            assert where == [rp.node, rp.pairs, rp.pairs, rp.tail] and len(plain.block_nodes[neg.id]) == 4
            assert len(plan.block_nodes[g.id]) == 4 + 2 + 1


def test_an_if_condition_source_keeps_the_value_it_reads_and_the_body_fuses() -> None:
    rng, externals, c = np.random.default_rng(6), {}, Context()
    a = _add_in(c, Scale(name="a", Factor=2.0), None)
    chk = _add_in(c, CustomKernel(name="chk", Code=ABOVE, level=0.0), None)
    maybe = _add_in(c, If(name="Maybe"), None)
    b = _add_in(c, Scale(name="b", Offset=1.0), None)  # reads a, as chk does: a stays stored
    p = _add_in(c, Scale(name="p", Factor=0.5), maybe)
    q = _add_in(c, Scale(name="q", Offset=0.5), maybe)
    _bind(c, a, "In", externals, rng)
    c.connect(a, "Out", chk, "in")
    c.connect(chk, "more", maybe, "Condition")
    c.connect(a, "Out", b, "In")
    c.connect(b, "Out", p, "In")
    c.connect(p, "Out", q, "In")
    for sign in (1.0, -1.0):  # the body runs, then not (q keeps the poison of a body never run)
        externals[(a.id, "In")][0] = sign
        _, plan = _same_results(c, externals, frames=1)
        assert _groups(plan) == {(p.id, q.id)} and (a.id, "Out") in plan.outputs
        assert _scopes(plan, q.id) == [plan.regions[maybe.id].node]


def _writer(c: Context, in_loop: bool) -> CustomKernel:
    """The in-place add, in a For of its own (or, without regions, at the top level)."""
    loop = _add_in(c, For(name="Loop", Count=3), None) if in_loop else None
    return _add_in(c, CustomKernel(name="w", Code=ADD, step=0.5), loop)


def test_a_block_writing_in_place_between_a_member_and_its_sink_keeps_the_member_apart() -> None:
    """src -> a -> s, and a kernel adding to src's buffer in place: unfused, a reads src before the add
    when the add comes after it (here inside a For between a and s), so a may not move to s's node."""
    for add_first in (False, True):
        for in_loop in (True, False):
            rng, externals, c = np.random.default_rng(7), {}, Context()
            src = _add_in(c, Scale(name="src", Factor=1.0), None)
            if add_first:  # registered first, ordered first (ties go by registration)
                w = _writer(c, in_loop)
            a = _add_in(c, Scale(name="a", Factor=2.0), None)
            if not add_first:
                w = _writer(c, in_loop)
            s = _add_in(c, Scale(name="s", Offset=1.0), None)
            _bind(c, src, "In", externals, rng)
            c.connect(src, "Out", a, "In")
            c.connect(src, "Out", w, "x")
            c.connect(a, "Out", s, "In")
            _, plan = _same_results(c, externals, frames=2)
            want = {(a.id, s.id)} if add_first else set()  # the add before a: a reads the added values either way
            assert _groups(plan) == want, (add_first, in_loop)


# -- what stays as without regions ---------------------------------------------------------------------


def _small(c: Context, externals: dict, rng: np.random.Generator):
    loop = _add_in(c, For(name="Loop", Count=2), None)
    a = _add_in(c, Scale(name="a", Factor=2.0), None)
    b = _add_in(c, Scale(name="b", Offset=1.0), None)
    p = _add_in(c, Scale(name="p", Factor=0.5), loop)
    q = _add_in(c, Scale(name="q", Offset=0.5), loop)
    _bind(c, a, "In", externals, rng)
    c.connect(a, "Out", b, "In")
    c.connect(b, "Out", p, "In")
    c.connect(p, "Out", q, "In")
    return loop, a, b, p, q


def test_fuse_false_and_profiling_per_block_fuse_nothing_in_a_patch_with_regions() -> None:
    rng, externals, c = np.random.default_rng(8), {}, Context()
    _small(c, externals, rng)
    snap = c.snapshot()
    assert len(_groups(compile_plan(snap))) == 2
    assert not _groups(compile_plan(snap, fuse=False))
    for level in (ProfilingLevel.PER_BLOCK, ProfilingLevel.PER_KERNEL):
        assert not _groups(compile_plan(snap, level=level))
    _same_results(c, externals, level=ProfilingLevel.SUMMARY)  # Summary times the graph only: fused


def test_a_probe_or_a_host_read_on_a_wire_inside_a_body_ends_the_group_there() -> None:
    rng, externals, c = np.random.default_rng(9), {}, Context()
    _, a, b, p, q = _small(c, externals, rng)
    key = c.add_probe(p, "Out")
    assert _groups(compile_plan(c.snapshot())) == {(a.id, b.id)}
    c.remove_probe(key)
    assert _groups(compile_plan(c.snapshot())) == {(a.id, b.id), (p.id, q.id)}
    c.add_probe(q, "Out")  # on the sink's output: the group stays, the probe follows its node
    plan = compile_plan(c.snapshot())
    assert _groups(plan) == {(a.id, b.id), (p.id, q.id)}
    probes = [n for n in plan.nodes if isinstance(n, ProbeNodePlan)]
    fused = plan.block_nodes[q.id]
    assert len(fused) == 8 + 1 and len(probes) == 2  # the main body's last copy and the tail's
    assert {n.buffer for n in probes} == {plan.outputs[(q.id, "Out")]}
    assert {plan.scopes[n.index] for n in probes} == {plan.scopes[fused[-2]], plan.scopes[fused[-1]]}
    c.keep(p, "Out")
    assert _groups(compile_plan(c.snapshot())) == {(a.id, b.id)}


def test_a_bypassed_member_leaves_its_group_and_a_body_member_is_then_refused_as_unfused() -> None:
    from cudapatch.engine.bypass import BypassIndex, plan_bypass

    rng, externals, c = np.random.default_rng(10), {}, Context()
    _, a, b, p, q = _small(c, externals, rng)
    plan = compile_plan(c.snapshot())
    assert BypassIndex(plan).fused == {a.id, b.id, p.id, q.id}  # a bypass of any needs the rebuild
    b.enabled = False
    q.enabled = False
    plan = compile_plan(c.snapshot())
    assert not _groups(plan)  # each group lost a member: the other runs alone
    bp = plan_bypass(BypassIndex(plan), {b.id, q.id})
    assert bp.disabled == set(plan.block_nodes[b.id])  # top level: its own node turns off
    assert q.id in bp.refused and "region's body" in bp.refused[q.id]  # in a body: refused, as unfused


def test_tooltips_show_the_fused_groups_at_the_top_level_and_in_a_body() -> None:
    from cudapatch.engine.built_view import BuiltShower, built_view

    rng, externals, c = np.random.default_rng(11), {}, Context()
    loop, a, b, p, q = _small(c, externals, rng)
    shower = BuiltShower(c.registry)
    names = {blk.id: blk.name for blk in c.registry}
    shower.apply(built_view(compile_plan(c.snapshot()), names, shower.shown), {})
    for blk, group in ((a, "a -> b"), (b, "a -> b"), (p, "p -> q"), (q, "p -> q")):
        assert blk.debug.fused == group and f"fused: {group}" in blk.tooltip()
    assert loop.debug.fused == ""
    shower.apply(built_view(compile_plan(c.snapshot(), fuse=False), names, shower.shown), {})
    assert all(blk.debug.fused == "" for blk in (a, b, p, q))


def test_a_members_code_edit_and_a_rebind_in_a_body_reach_every_copy() -> None:
    from cudapatch.engine.compiler.fusion import regenerate

    c = Context()
    loop = _add_in(c, For(name="Loop", Count=5, Unroll=4), None)
    e = _add_in(c, Expression(name="e", Code="x * 2"), loop)
    s = _add_in(c, Scale(name="s", Offset=1.0), loop)
    c.bind_input(e, "x", ExternalBinding(next(_ptr), N, DType.FLOAT32))
    c.connect(e, "Out", s, "In")
    plan = compile_plan(c.snapshot())
    nodes = [plan.nodes[i] for i in plan.block_nodes[s.id]]
    assert len(nodes) == 4 + 1 and len({n.source for n in nodes}) == 1  # one kernel: the Code tier swaps it in all
    assert {(n.block_id, n.kernel) for n in nodes} == {(s.id, FUSED_KERNEL)}
    slots = plan.binding_slots[(e.id, "x")]  # a Warm rebind of the group's input patches every copy
    assert sorted(ni for ni, _ in slots) == [n.index for n in nodes]
    e.set("Code", "x * 3")
    new = regenerate(nodes[0].source, {e.id: e, s.id: s})
    assert new is not None and new.program.descriptor == nodes[0].source.program.descriptor


# -- random region patches ------------------------------------------------------------------------------


def _random_region_patch(rng: np.random.Generator) -> tuple[Context, dict, dict]:
    """Random chains and trees of elementwise blocks (and in-place adds) spread over the top level, a For,
    a For nested in it and an If; a link that would make a cycle through a region is not made. Returns the
    context, the externals, and Hot values per frame (the loops' counts)."""
    c, externals = Context(), {}
    outer = _add_in(c, For(name="Outer", Count=int(rng.integers(0, 4)), Unroll=int(rng.choice([1, 2, 4]))), None)
    inner = _add_in(c, For(name="Inner", Count=int(rng.integers(1, 4)), Unroll=int(rng.choice([1, 2, 3]))), outer)
    maybe = _add_in(c, If(name="Maybe"), None)
    chk = _add_in(c, CustomKernel(name="chk", Code=ABOVE, level=float(rng.normal())), None)
    _bind(c, chk, "in", externals, rng)
    c.connect(chk, "more", maybe, "Condition")
    regions = [None, outer, inner, maybe]
    produced: list[tuple[object, str]] = []
    for i in range(int(rng.integers(3, 16))):
        region = regions[int(rng.integers(len(regions)))]
        kind = rng.choice(["scale", "add", "expr", "inplace"], p=[0.4, 0.2, 0.3, 0.1])
        if kind == "scale":
            b, ports = Scale(name=f"b{i}", Factor=float(rng.normal()), Offset=float(rng.normal())), ["In"]
        elif kind == "add":
            b, ports = VectorAdd(name=f"b{i}"), ["A", "B"]
        elif kind == "expr":
            b = Expression(name=f"b{i}", Code=str(rng.choice(["x * Gain + y", "sin(x) * Gain", "abs(x) - y * y"])))
            ports = [p.name for p in b.inputs]
        else:
            b, ports = CustomKernel(name=f"b{i}", Code=ADD, step=float(rng.normal())), ["x"]
        _add_in(c, b, region)
        if kind == "expr":
            for s in b.source.program.scalars:
                b.set(s, float(rng.normal()))
        for port in ports:
            linked = False
            for k in rng.permutation(len(produced)) if kind == "inplace" or rng.random() < 0.85 else ():
                src, out = produced[k]
                c.connect(src, out, b, port)
                try:  # a link making a cycle through a region (it would run before and after it): another
                    compile_plan(c.snapshot(), fuse=False)
                except GraphCompileError:
                    c.disconnect(src, out, b, port)
                    continue
                linked = True
                break
            if not linked:
                if kind == "inplace":  # an add never writes a host array
                    c.unregister_block(b)
                    break
                _bind(c, b, port, externals, rng)
        else:
            produced.append((b, b.outputs[0].name))
    hot = {
        1: {(outer.id, "Count"): int(rng.integers(0, 5)), (inner.id, "Count"): int(rng.integers(0, 4))},
        2: {(outer.id, "Count"): 3, (inner.id, "Count"): 5},
    }
    return c, externals, hot


@pytest.mark.parametrize("seed", range(60))
def test_random_region_patches_compute_the_same_fused_and_unfused(seed: int) -> None:
    rng = np.random.default_rng(seed)
    c, externals, hot = _random_region_patch(rng)
    plain, plan = _same_results(c, externals, frames=3, hot=hot)
    assert len(plan.kernel_nodes) <= len(plain.kernel_nodes)
    for group in _groups(plan):  # one graph per group: every member's nodes where the sink's are
        sink = group[-1]
        assert all(_scopes(plan, m) == _scopes(plan, sink) for m in group)
        assert len({c.snapshot().parents.get(m) for m in group}) == 1
