"""Planning of If/While/For regions (no GPU): placements, conditions, Max, scopes, dependencies,
Hot slots of Count and Max, iteration counters, nesting, cycles and profiling stamps."""

from __future__ import annotations

import pytest

from cudapatch import CustomKernel, Fill, For, If, Scale, While
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.plan import ConditionalNodePlan, KernelNodePlan, ProbeNodePlan, PublishNodePlan, StampNodePlan
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import CudapatchError, GraphCompileError, LinkError, ParameterError

CHECK = """extern "C" __global__ void check(const float* in, int* more, float level, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = in[0] > level; }"""
CHECK_U8 = """extern "C" __global__ void check8(const float* in, unsigned char* more, float level, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = in[0] > level; }"""
CHECK_F = """extern "C" __global__ void checkf(const float* in, float* more, unsigned int n) { }"""


def _while(max_: int | None = 100) -> tuple[Context, Fill, While, Scale, CustomKernel, Scale]:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=256))
    w = c.register_block(While(name="Solve") if max_ is None else While(name="Solve", Max=max_))
    step = c.register_block(Scale(name="Step"))
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK))
    after = c.register_block(Scale(name="After"))
    c.place(step, w)
    c.place(chk, w)
    c.connect(src, "Out", step, "In")
    c.connect(step, "Out", chk, "in")
    c.connect(chk, "more", w, "Condition")
    c.connect(step, "Out", after, "In")
    return c, src, w, step, chk, after


def _codes(exc: GraphCompileError) -> set[tuple[int | None, str]]:
    return {(d.block_id, d.code) for d in exc.diagnostics if d.severity == "error"}


def _by_block(plan, block_id: int, cls=KernelNodePlan):
    return [n for n in plan.nodes if isinstance(n, cls) and n.block_id == block_id]


def test_a_while_is_a_conditional_node_whose_body_follows_it() -> None:
    c, src, w, step, chk, after = _while()
    plan = compile_plan(c.snapshot())
    (cond,) = _by_block(plan, w.id, ConditionalNodePlan)
    assert cond.kind == "while"
    begin, stepk = _by_block(plan, w.id)
    assert begin.entry_point == "region_begin" and begin.index == cond.index - 1
    assert begin.deps == (0,)  # it zeroes the iteration counter: after the counters' memset
    assert stepk.entry_point == "region_while_step4"
    body = {i for i, p in plan.scopes.items() if p == cond.index}
    assert body == {_by_block(plan, step.id)[0].index, _by_block(plan, chk.id)[0].index, stepk.index}
    assert body == set(range(cond.index + 1, cond.index + 1 + len(body)))  # contiguous, right after it
    # The conditional node waits for the begin kernel, the counters' memset and what the body reads.
    fill = _by_block(plan, src.id)[0]
    assert set(cond.deps) == {0, begin.index, fill.index}
    # Inside the body, dependencies stay inside: the body's first kernel is a root of the body graph.
    assert _by_block(plan, step.id)[0].deps == ()
    assert stepk.deps == (_by_block(plan, chk.id)[0].index,)
    # A block after the region waits for the conditional node, never for a node in its body.
    assert _by_block(plan, after.id)[0].deps == (cond.index,)
    publish = plan.nodes[-1]
    assert isinstance(publish, PublishNodePlan) and all(d not in plan.scopes for d in publish.deps)
    assert plan.block_order.count(w.id) == 1


def test_the_handle_argument_names_the_conditional_node_and_max_is_hot() -> None:
    c, _, w, *_ = _while(max_=7)
    plan = compile_plan(c.snapshot())
    cond = _by_block(plan, w.id, ConditionalNodePlan)[0]
    for k in _by_block(plan, w.id):
        assert k.args[0].kind == "handle" and k.args[0].ref == cond.index
        assert (k.grid, k.block) == (1, 1)
    slots = plan.scalar_slots[(w.id, "Max")]
    assert len(slots) == 2  # the begin and the step kernel: one Hot edit patches both
    for ni, ai in slots:
        assert plan.nodes[ni].args[ai].value == 7
    region = plan.regions[w.id]
    assert (region.kind, region.node, region.limit) == ("while", cond.index, "Max")
    assert plan.counters[region.counter] == (w.id, "Iterations")
    step = _by_block(plan, w.id)[1]
    assert any(a.kind == "counter" and a.ref == region.counter for a in step.args)


def test_a_while_without_max_is_an_error_on_the_region() -> None:
    c, _, w, *_ = _while(max_=None)
    assert w.get("Max") == 0  # not given
    with pytest.raises(GraphCompileError) as ei:
        compile_plan(c.snapshot())
    assert (w.id, "region-max") in _codes(ei.value)
    assert "needs Max" in str(ei.value)


@pytest.mark.parametrize("bad", [0, -1, 0.0])
def test_a_while_refuses_max_below_one_when_set_and_keeps_the_old_value(bad) -> None:
    """A Hot edit of a running While's Max to 0 would skip its body silently (the build-time check
    does not see Hot edits): it is refused at once, naming the block and Max, and nothing goes dirty."""
    c, _, w, *_ = _while(max_=7)
    compile_plan(c.snapshot())
    c.dirty.clear_structure()
    with pytest.raises(ParameterError) as ei:
        w.set("Max", bad)
    assert (ei.value.block, ei.value.param) == ("Solve", "Max")
    assert bad == -1 or "out of range [1, " in ei.value.message  # -1 is already no uint
    assert w.get("Max") == 7 and not c.dirty.any
    w.set("Max", 1)  # the least guard is fine, and Hot
    assert w.get("Max") == 1 and c.dirty.any and not c.dirty.structure
    with pytest.raises(ParameterError, match="'Max'"):
        While(name="Loop", Max=0)


def test_a_while_condition_from_outside_its_body_is_an_error() -> None:
    c, src, w, step, chk, after = _while()
    c.place(chk, None)  # the condition's block leaves the body
    with pytest.raises(GraphCompileError) as ei:
        compile_plan(c.snapshot())
    assert (w.id, "region-condition") in _codes(ei.value)
    assert "outside its body" in str(ei.value) and "'Check'" in str(ei.value)


def test_an_if_condition_from_inside_its_body_is_an_error_and_one_is_required() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=16))
    r = c.register_block(If(name="Maybe"))
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK))
    c.place(chk, r)
    c.connect(src, "Out", chk, "in")
    with pytest.raises(GraphCompileError) as ei:
        compile_plan(c.snapshot())
    assert (r.id, "region-condition") in _codes(ei.value) and "needs a Condition" in str(ei.value)
    c.connect(chk, "more", r, "Condition")
    with pytest.raises(GraphCompileError) as ei:
        compile_plan(c.snapshot())
    assert (r.id, "region-condition") in _codes(ei.value) and "inside its body" in str(ei.value)


def test_an_if_reads_its_condition_before_the_node_by_element_size() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=16))
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK_U8))
    r = c.register_block(If(name="Maybe"))
    body = c.register_block(Scale(name="Body"))
    c.place(body, r)
    c.connect(src, "Out", chk, "in")
    c.connect(chk, "more", r, "Condition")  # uchar (bool) links to the int Condition
    c.connect(src, "Out", body, "In")
    plan = compile_plan(c.snapshot())
    (begin,) = _by_block(plan, r.id)
    assert begin.entry_point == "region_if1"
    cond = _by_block(plan, r.id, ConditionalNodePlan)[0]
    assert cond.kind == "if" and begin.index in cond.deps
    assert _by_block(plan, chk.id)[0].index in begin.deps  # the decision waits for the condition's block
    assert plan.regions[r.id].counter is None and not plan.counters


def test_condition_links_take_int_uint_and_uchar_but_not_float() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=16))
    r = c.register_block(If(name="Maybe"))
    bad = c.register_block(CustomKernel(name="F", Code=CHECK_F))
    c.connect(src, "Out", bad, "in")
    with pytest.raises(LinkError, match="element types differ"):
        c.connect(bad, "more", r, "Condition")


def test_a_for_has_a_hot_count_in_both_of_its_kernels() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    f = c.register_block(For(name="Steps", Count=12, Unroll=1))
    step = c.register_block(Scale(name="Step"))
    c.place(step, f)
    c.connect(src, "Out", step, "In")
    plan = compile_plan(c.snapshot())
    begin, stepk = _by_block(plan, f.id)
    assert (begin.entry_point, stepk.entry_point) == ("region_begin", "region_for_step")
    slots = plan.scalar_slots[(f.id, "Count")]
    assert {ni for ni, _ in slots} == {begin.index, stepk.index}
    assert all(plan.nodes[ni].args[ai].value == 12 for ni, ai in slots)
    assert plan.regions[f.id].limit == "Count"
    assert not f.description.params[0].structural  # Hot: no rebuild
    assert stepk.deps == ()  # it only counts: it runs beside the body's kernels


def test_regions_nest_and_each_body_depends_only_inside_itself() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    outer = c.register_block(For(name="Outer", Count=3))
    inner = c.register_block(For(name="Inner", Count=5))
    a = c.register_block(Scale(name="A"))
    b = c.register_block(Scale(name="B"))
    c.place(inner, outer)
    c.place(a, outer)
    c.place(b, inner)
    c.connect(src, "Out", a, "In")
    c.connect(a, "Out", b, "In")
    plan = compile_plan(c.snapshot())
    oc = _by_block(plan, outer.id, ConditionalNodePlan)[0]
    ic = _by_block(plan, inner.id, ConditionalNodePlan)[0]
    assert plan.scopes[ic.index] == oc.index
    bk = _by_block(plan, b.id)[0]
    assert plan.scopes[bk.index] == ic.index
    ak = _by_block(plan, a.id)[0]
    assert plan.scopes[ak.index] == oc.index
    # The inner region as a whole waits for A (its body reads A's output); B has no dependency.
    assert ak.index in ic.deps and bk.deps == ()
    for n in plan.nodes:
        for d in n.deps:
            assert plan.scopes.get(d) == plan.scopes.get(n.index), (n, d)


def test_a_cycle_through_a_region_is_an_error() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=16))
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK))
    r = c.register_block(If(name="Maybe"))
    body = c.register_block(Scale(name="Body"))
    c.place(body, r)
    c.connect(src, "Out", body, "In")
    c.connect(body, "Out", chk, "in")  # the condition is made from the If's own output
    c.connect(chk, "more", r, "Condition")
    with pytest.raises(GraphCompileError) as ei:
        compile_plan(c.snapshot())
    codes = _codes(ei.value)
    assert (r.id, "cycle") in codes and (chk.id, "cycle") in codes


def test_a_region_whose_condition_block_does_not_run_is_left_out_with_its_body() -> None:
    c = Context()
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK))  # its input is not linked
    r = c.register_block(If(name="Maybe"))
    src = c.register_block(Fill(name="Src", Count=16))
    body = c.register_block(Scale(name="Body"))
    reader = c.register_block(Scale(name="Reader"))
    c.place(body, r)
    c.connect(chk, "more", r, "Condition")
    c.connect(src, "Out", body, "In")
    c.connect(body, "Out", reader, "In")
    plan = compile_plan(c.snapshot())
    assert {chk.id, r.id, body.id, reader.id} <= set(plan.skipped)
    assert src.id in plan.block_order and not any(isinstance(n, ConditionalNodePlan) for n in plan.nodes)
    assert any(d.block_id == r.id and d.code == "region-not-running" for d in plan.diagnostics)
    assert any(d.block_id == body.id and "its region 'Maybe'" in d.message for d in plan.diagnostics)


def test_profiling_times_a_region_as_one_block_and_its_body_by_timers_not_stamps() -> None:
    c, src, w, step, chk, after = _while()
    for level in (ProfilingLevel.PER_BLOCK, ProfilingLevel.PER_KERNEL):
        plan = compile_plan(c.snapshot(), level=level)
        assert any(t.kind == "block" and t.key == w.id for t in plan.timings)
        cond = _by_block(plan, w.id, ConditionalNodePlan)[0]
        assert all(not isinstance(plan.nodes[i], StampNodePlan) for i in plan.scopes)
        body = [i for i, p in plan.scopes.items() if p == cond.index]
        assert sorted(body) == list(range(cond.index + 1, cond.index + 1 + len(body)))
        for n in plan.nodes:
            assert n.index == plan.nodes.index(n)
            for d in n.deps:
                assert d < n.index and plan.scopes.get(d) == plan.scopes.get(n.index)
        for k in _by_block(plan, w.id):  # the set-condition kernels; the body timers (test_body_timers.py) aside
            assert k.args[0].ref == cond.index or k.entry_point in ("body_tick", "body_tock")
        assert plan.regions[w.id].node == cond.index
        for (bid, _), slots in plan.scalar_slots.items():
            for ni, _ in slots:
                assert plan.nodes[ni].block_id == bid


def test_place_refuses_what_is_not_a_region_and_a_region_inside_itself() -> None:
    c = Context()
    a = c.register_block(Scale(name="A"))
    outer = c.register_block(For(name="Outer"))
    inner = c.register_block(For(name="Inner"))
    with pytest.raises(CudapatchError, match="not a region"):
        c.place(outer, a)
    c.place(inner, outer)
    with pytest.raises(CudapatchError, match="inside itself"):
        c.place(outer, inner)
    with pytest.raises(CudapatchError, match="inside itself"):
        c.place(outer, outer)
    c.place(a, inner)
    c.unregister_block(inner)  # its blocks move to the region that held it
    assert c.snapshot().parents == {a.id: outer.id}


def test_a_placement_in_a_block_that_is_no_region_is_an_error_on_the_block() -> None:
    c, src, w, step, chk, after = _while()
    snap = c.snapshot()
    snap.parents[after.id] = src.id  # a hand-made snapshot (Context.place refuses this)
    with pytest.raises(GraphCompileError) as ei:
        compile_plan(snap)
    assert (after.id, "region-parent") in _codes(ei.value)


def test_moving_a_block_between_regions_is_refused_as_a_warm_patch() -> None:
    from cudapatch.engine.warm import Refusal, WarmRefusal, decide_warm_patch

    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    first = c.register_block(For(name="First", Count=2))
    second = c.register_block(For(name="Second", Count=3))
    a = c.register_block(Scale(name="A"))
    c.place(a, first)
    c.connect(src, "Out", a, "In")
    before = compile_plan(c.snapshot())
    c.place(a, second)
    after = compile_plan(c.snapshot())
    decision = decide_warm_patch(before, after, {}, capacities=[1 << 20] * len(before.buffers))
    assert isinstance(decision, WarmRefusal) and decision.reason is Refusal.REGIONS


def test_a_bound_condition_is_a_warm_binding_slot_of_the_set_condition_kernel() -> None:
    from cudapatch.engine import ExternalBinding
    from cudapatch.kernels.types import DType

    c = Context()
    r = c.register_block(If(name="Maybe"))
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK))
    body = c.register_block(Scale(name="Body"))
    c.place(body, r)
    c.bind_input(chk, "in", ExternalBinding(0xA000, 16, DType.FLOAT32))
    c.bind_input(body, "In", ExternalBinding(0xB000, 16, DType.FLOAT32))
    c.connect(chk, "more", r, "Condition")
    plan = compile_plan(c.snapshot())
    (begin,) = _by_block(plan, r.id)
    assert begin.args[1].kind == "buffer"  # made by Check: a planned buffer
    (slot,) = plan.binding_slots[(body.id, "In")]
    assert plan.scopes[slot[0]] == _by_block(plan, r.id, ConditionalNodePlan)[0].index  # a body node's slot


@pytest.mark.parametrize("unroll", [1, 4])
@pytest.mark.parametrize("level", list(ProfilingLevel))
def test_every_level_keeps_nested_scopes_consistent(level: ProfilingLevel, unroll: int) -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    outer = c.register_block(For(name="Outer", Count=3, Unroll=unroll))
    w = c.register_block(While(name="Inner", Max=9, Unroll=unroll))
    a = c.register_block(Scale(name="A"))
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK))
    b = c.register_block(Scale(name="B"))
    after = c.register_block(Scale(name="After"))
    c.place(w, outer)
    c.place(a, w)
    c.place(chk, w)
    c.place(b, outer)
    c.connect(src, "Out", a, "In")
    c.connect(a, "Out", chk, "in")
    c.connect(chk, "more", w, "Condition")
    c.connect(a, "Out", b, "In")
    c.connect(b, "Out", after, "In")
    plan = compile_plan(c.snapshot(), level=level)
    conds: dict[int, list] = {}
    for n in plan.nodes:
        if isinstance(n, ConditionalNodePlan):
            conds.setdefault(n.block_id, []).append(n)
    outer_nodes = {n.index for n in conds[outer.id]}
    assert all(plan.scopes[n.index] in outer_nodes for n in conds[w.id])
    # the outer's bodies (main U copies and tail one) each hold the inner loop's conditional nodes
    assert len(conds[outer.id]) == (1 if unroll == 1 else 2)
    # unrolled: the inner While is made in each of the outer's U + 1 copies, each a main and a tail node
    assert len(conds[w.id]) == (1 if unroll == 1 else (unroll + 1) * 2)
    for n in plan.nodes:
        assert plan.nodes[n.index] is n
        for d in n.deps:
            assert d < n.index and plan.scopes.get(d) == plan.scopes.get(n.index), (n, d)
        if isinstance(n, KernelNodePlan) and n.args and n.args[0].kind == "handle":
            target = plan.nodes[n.args[0].ref]
            assert target in conds[n.block_id]
            # a set-condition kernel sets the handle of a node in its own graph, or of the node it is in
            assert plan.scopes.get(n.index) in (plan.scopes.get(target.index), target.index)
        if n.index in plan.scopes:  # a body node sits after its conditional node, before the next top-level one
            assert plan.scopes[n.index] < n.index
    for (bid, _), slots in plan.scalar_slots.items():
        for ni, _ in slots:
            assert plan.nodes[ni].block_id == bid
    for rid, rp in plan.regions.items():
        assert plan.nodes[rp.node] in conds[rid] and rp.unroll == unroll
        assert (rp.tail is None) == (unroll == 1) and (rp.tail is None or plan.nodes[rp.tail] in conds[rid])
    for cond in (n for ns in conds.values() for n in ns):
        inside = _body(plan, cond.index)  # every node of its body, nested bodies included: right after it, contiguous
        assert sorted(inside) == list(range(cond.index + 1, cond.index + 1 + len(inside)))
    body_blocks = {plan.nodes[i].block_id for i in plan.scopes if hasattr(plan.nodes[i], "block_id")}
    assert {a.id, chk.id, b.id, w.id, outer.id} >= body_blocks >= {a.id, chk.id, b.id}
    assert after.id not in body_blocks and src.id not in body_blocks


def test_a_probe_on_a_wire_inside_a_body_is_a_node_of_the_body() -> None:
    from cudapatch.engine.plan import ProbeNodePlan

    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    loop = c.register_block(For(name="Loop", Count=4, Unroll=1))
    a = c.register_block(Scale(name="A"))
    c.place(a, loop)
    c.connect(src, "Out", a, "In")
    c.add_probe(a, "Out")
    plan = compile_plan(c.snapshot())
    (probe,) = [n for n in plan.nodes if isinstance(n, ProbeNodePlan)]
    cond = _by_block(plan, loop.id, ConditionalNodePlan)[0]
    assert plan.scopes[probe.index] == cond.index and probe.deps == (_by_block(plan, a.id)[0].index,)
    publish = plan.nodes[-1]
    assert isinstance(publish, PublishNodePlan) and probe.index not in publish.deps and plan.probe_words


def test_a_composite_placed_in_a_region_runs_its_blocks_in_the_body() -> None:
    from tests.unit.composite_blocks import TwoScales

    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    loop = c.register_block(For(name="Loop", Count=2, Unroll=1))
    t = c.register_block(TwoScales(name="t"))
    after = c.register_block(Scale(name="After"))
    c.place(t, loop)
    c.connect(src, "Out", t, "In")
    c.connect(t, "Out", after, "In")
    plan = compile_plan(c.snapshot())
    cond = _by_block(plan, loop.id, ConditionalNodePlan)[0]
    inner = {t.inner("a").id, t.inner("b").id}
    body = {i for i, p in plan.scopes.items() if p == cond.index}
    assert all(set(plan.block_nodes[b]) <= body for b in inner) and not set(plan.block_nodes[after.id]) & body
    assert plan.scalar_slots[(t.id, "Gain")]  # Hot slots filed under the composite, as without regions
    assert _by_block(plan, after.id)[0].deps == (cond.index,)


def _region_kernels(plan, rid: int) -> list[tuple[str, int | None]]:
    """``(entry point, scope)`` of the region's set-condition kernels, in node order."""
    return [(n.entry_point, plan.scopes.get(n.index)) for n in _by_block(plan, rid)]


def test_an_unrolled_for_is_a_main_loop_of_copies_and_a_tail_fed_by_one_begin() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    f = c.register_block(For(name="Steps", Count=10, Unroll=4))
    step = c.register_block(Scale(name="Step"))
    after = c.register_block(Scale(name="After"))
    c.place(step, f)
    c.connect(src, "Out", step, "In")
    c.connect(step, "Out", after, "In")
    plan = compile_plan(c.snapshot())
    rp = plan.regions[f.id]
    main, tail = plan.nodes[rp.node], plan.nodes[rp.tail]
    assert (rp.kind, rp.unroll, main.kind, tail.kind) == ("for", 4, "while", "while")
    assert _region_kernels(plan, f.id) == [
        ("region_begin_n", None),  # counter = 0; the main loop runs if a pass of 4 fits in Count
        ("region_for_step_n", main.index),  # counter += 4; again while another pass fits
        ("region_for_tail", None),  # between the two: the tail runs while iterations are left
        ("region_for_step", tail.index),  # one at a time up to Count: 10 = 2 * 4 + 2
    ]
    begin, step_n, tail_k, step_1 = _by_block(plan, f.id)
    assert begin.index == main.index - 1 and tail_k.index == tail.index - 1
    for k, cond in ((begin, main), (step_n, main), (tail_k, tail), (step_1, tail)):
        assert k.args[0].kind == "handle" and k.args[0].ref == cond.index
    assert begin.args[3].value == step_n.args[3].value == 4  # the unroll: a constant (Unroll is structural)
    # The copies: four in the main body, one after the other; one in the tail's body.
    copies = _by_block(plan, step.id)
    assert [plan.scopes[n.index] for n in copies] == [main.index] * 4 + [tail.index]
    assert [n.deps for n in copies[1:4]] == [(copies[0].index,), (copies[1].index,), (copies[2].index,)]
    assert plan.block_nodes[step.id] == tuple(n.index for n in copies)
    # Hot: every copy's Factor slot and every set-condition kernel's Count slot
    assert {ni for ni, _ in plan.scalar_slots[(step.id, "Factor")]} == {n.index for n in copies}
    assert {ni for ni, _ in plan.scalar_slots[(f.id, "Count")]} == {
        begin.index,
        step_n.index,
        tail_k.index,
        step_1.index,
    }
    assert tail_k.index > main.index and main.index in tail_k.deps and set(tail.deps) >= {main.index, tail_k.index}
    assert _by_block(plan, after.id)[0].deps == (tail.index,)
    assert plan.block_nodes[f.id] == (begin.index, main.index, step_n.index, tail_k.index, tail.index, step_1.index)
    unroll = next(p for p in f.description.params if p.name == "Unroll")
    assert unroll.structural and unroll.default == 8


def test_a_while_is_exact_by_default_and_an_unrolled_one_checks_once_per_pass() -> None:
    c, src, w, step, chk, after = _while(max_=10)
    plan = compile_plan(c.snapshot())
    assert plan.regions[w.id].unroll == 1 and plan.regions[w.id].tail is None  # Unroll 1: no overshoot
    c2, src, w, step, chk, after = _while(max_=10)
    w.set("Unroll", 4)
    plan = compile_plan(c2.snapshot())
    rp = plan.regions[w.id]
    main, tail = plan.nodes[rp.node], plan.nodes[rp.tail]
    assert _region_kernels(plan, w.id) == [
        ("region_begin_n", None),
        ("region_while_step_n4", main.index),
        ("region_while_tail4", None),
        ("region_while_step4", tail.index),
    ]
    # Check only computes the condition, read once per pass, and Step only feeds Check and the block after
    # the loop (nothing carries over from one iteration to the next here): both are made by the main
    # body's last copy only (``condition_only``); the tail checks after each iteration
    steps = _by_block(plan, step.id)
    assert [plan.scopes[n.index] for n in steps] == [main.index, tail.index]
    checks = _by_block(plan, chk.id)
    assert [plan.scopes[n.index] for n in checks] == [main.index, tail.index]
    assert steps[0].index in checks[0].deps and steps[1].index in checks[1].deps
    _, step_n, tail_k, step_1 = _by_block(plan, w.id)
    assert step_n.deps == (checks[0].index,)  # the condition after the last copy: once per pass
    assert step_1.deps == (checks[1].index,)
    more = checks[0].args[1].ref  # Check's output buffer, the condition
    assert step_n.args[1].ref == tail_k.args[1].ref == step_1.args[1].ref == more
    assert main.index in tail_k.deps  # it reads the condition and the count the main loop left
    assert {ni for ni, _ in plan.scalar_slots[(w.id, "Max")]} == {n.index for n in _by_block(plan, w.id)}


def _body(plan, cond: int) -> set[int]:
    """Every node inside conditional node ``cond``'s body, nested bodies included."""
    out = set()
    for i in plan.scopes:
        p = i
        while p in plan.scopes:
            p = plan.scopes[p]
            if p == cond:
                out.add(i)
    return out


def _region_of(kind: str, name: str):
    return {"for": lambda: For(name=name, Count=3, Unroll=2), "while": lambda: While(name=name, Max=5, Unroll=2),
            "if": lambda: If(name=name)}[kind]()  # fmt: skip


@pytest.mark.parametrize("inner_kind", ["for", "while", "if"])
@pytest.mark.parametrize("outer_kind", ["for", "while", "if"])
def test_every_nesting_sets_the_inner_handle_in_the_parent_body_on_every_entry(
    outer_kind: str, inner_kind: str
) -> None:
    """A handle's value is the one a kernel last set (no default is applied when a parent body runs
    again): so every conditional node, nested or not, has its set-condition kernel right before it in
    the same graph, with an edge, and a loop's begin kernel zeroes its counter there on every entry."""
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    gate = c.register_block(CustomKernel(name="Gate", Code=CHECK))  # an If's condition, made before both
    outer = c.register_block(_region_of(outer_kind, "Outer"))
    inner = c.register_block(_region_of(inner_kind, "Inner"))
    a = c.register_block(Scale(name="A"))
    c.place(inner, outer)
    c.place(a, inner)
    c.connect(src, "Out", gate, "in")
    c.connect(src, "Out", a, "In")
    for r, kind in ((outer, outer_kind), (inner, inner_kind)):
        if kind == "if":
            c.connect(gate, "more", r, "Condition")
        elif kind == "while":  # made in its body (the outer's: by a check after the inner region)
            chk = c.register_block(CustomKernel(name=f"Check{r.name}", Code=CHECK))
            c.place(chk, r)
            c.connect(a, "Out", chk, "in")
            c.connect(chk, "more", r, "Condition")
    plan = compile_plan(c.snapshot())
    conds = [n for n in plan.nodes if isinstance(n, ConditionalNodePlan)]
    setters = {}
    for n in plan.nodes:
        if isinstance(n, KernelNodePlan) and n.args and n.args[0].kind == "handle":
            setters.setdefault(n.args[0].ref, []).append(n)
    for cond in conds:
        scope = plan.scopes.get(cond.index)
        before = [k for k in setters[cond.index] if plan.scopes.get(k.index) == scope]
        assert len(before) == 1 and before[0].index in cond.deps, cond  # set right before, in the same graph
        first = before[0].entry_point
        kind = plan.regions[cond.block_id].kind
        if kind == "if":
            assert first.startswith("region_if")
        elif first == "region_begin_n":  # a main loop: zeroes the counter each time the parent body reaches it
            assert before[0].args[1].kind == "counter"
            assert plan.nodes[cond.index + 1 + len(_body(plan, cond.index))].entry_point.startswith(
                ("region_for_tail", "region_while_tail")
            )  # its tail's set-condition kernel follows the main loop in the same graph
        else:
            assert first in ("region_for_tail", "region_while_tail4")
        inside = [k for k in setters[cond.index] if plan.scopes.get(k.index) == cond.index]
        assert len(inside) == (0 if kind == "if" else 1)  # a loop's step kernel, in its own body
        if inside:
            body = [i for i, p in plan.scopes.items() if p == cond.index]
            assert inside[0].index == max(body)  # last in the body
    inner_conds = [n for n in conds if n.block_id == inner.id]
    outer_bodies = {n.index for n in conds if n.block_id == outer.id}
    assert inner_conds and all(plan.scopes[n.index] in outer_bodies for n in inner_conds)


def test_a_probe_in_an_unrolled_body_is_one_record_written_by_the_last_copy_and_the_tail() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    loop = c.register_block(For(name="Loop", Count=7, Unroll=3))
    a = c.register_block(Scale(name="A"))
    c.place(a, loop)
    c.connect(src, "Out", a, "In")
    c.add_probe(a, "Out")
    plan = compile_plan(c.snapshot())
    probes = [n for n in plan.nodes if isinstance(n, ProbeNodePlan)]
    rp = plan.regions[loop.id]
    copies = _by_block(plan, a.id)
    assert len(plan.probes) == 1 and len(probes) == 2
    assert {(p.probe, p.offset) for p in probes} == {(0, 0)}
    assert [plan.scopes[p.index] for p in probes] == [rp.node, rp.tail]
    assert [p.deps for p in probes] == [(copies[2].index,), (copies[3].index,)]


def test_nested_unrolled_loops_cap_the_copies_of_a_block() -> None:
    from cudapatch.engine.compiler.regions import MAX_COPIES

    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    outer = c.register_block(For(name="Outer", Count=100, Unroll=8))
    inner = c.register_block(For(name="Inner", Count=100, Unroll=8))
    a = c.register_block(Scale(name="A"))
    c.place(inner, outer)
    c.place(a, inner)
    c.connect(src, "Out", a, "In")
    plan = compile_plan(c.snapshot())
    assert plan.regions[outer.id].unroll == 8
    assert plan.regions[inner.id].unroll == MAX_COPIES // 9  # made in 8 + 1 outer copies: 7 more each
    assert len(_by_block(plan, a.id)) == 9 * (7 + 1)


def test_unroll_one_keeps_one_conditional_node_and_the_step_kernels() -> None:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    f = c.register_block(For(name="Steps", Count=10, Unroll=1))
    step = c.register_block(Scale(name="Step"))
    c.place(step, f)
    c.connect(src, "Out", step, "In")
    plan = compile_plan(c.snapshot())
    (cond,) = _by_block(plan, f.id, ConditionalNodePlan)
    assert _region_kernels(plan, f.id) == [("region_begin", None), ("region_for_step", cond.index)]
    assert len(_by_block(plan, step.id)) == 1


def test_a_fault_replay_runs_each_body_block_once_however_unrolled() -> None:
    from cudapatch.engine.replay import replayed_nodes

    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    outer = c.register_block(For(name="Outer", Count=5, Unroll=2))
    inner = c.register_block(For(name="Inner", Count=5, Unroll=3))
    a = c.register_block(Scale(name="A"))
    b = c.register_block(Scale(name="B"))
    after = c.register_block(Scale(name="After"))
    c.place(inner, outer)
    c.place(a, inner)
    c.place(b, outer)
    c.connect(src, "Out", a, "In")
    c.connect(a, "Out", b, "In")
    c.connect(b, "Out", after, "In")
    plan = compile_plan(c.snapshot())
    run = replayed_nodes(plan)
    assert run == sorted(run)
    work = [plan.nodes[i].block_id for i in run if isinstance(plan.nodes[i], KernelNodePlan)]
    assert [w for w in work if w not in (outer.id, inner.id)] == [src.id, a.id, b.id, after.id]
    assert len(_by_block(plan, a.id)) == 3 * 4  # in the plan: 2 + 1 outer copies, each with 3 + 1 of A
