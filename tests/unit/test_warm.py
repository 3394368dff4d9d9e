"""The Warm-resize decision (no GPU): which new plans can be patched into the running graph, what the
patch writes, and every reason a plan needs a Cold rebuild instead.

Plans come from the real compiler on real blocks; the refusals a patch edit cannot reach directly
(a buffer count that changes while the node count stays) edit one field of a compiled plan.
"""

from __future__ import annotations

import dataclasses

import pytest

from cudapatch import (
    AppendFilter,
    Block,
    BlockBuilder,
    CallDescriptor,
    DType,
    Fill,
    Scale,
    VectorAdd,
    buffer_in,
    buffer_out,
    device_scalar,
    host_scalar,
    like,
)
from cudapatch.engine import Context, ExternalBinding, KernelNodePlan, MemsetNodePlan
from cudapatch.engine.plan import CapturedNodePlan, GraphPlan
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.engine.warm import (
    KernelPatch,
    Refusal,
    WarmPatch,
    WarmRefusal,
    decide_warm_patch,
    grown_bytes,
    same_topology,
)

from .unfused import compile_plan  # one node per block: these tests are about unfused plans


def _axpy(stream, pointers, scalars, libs):  # never called here: plans only
    raise AssertionError("a plan test must not capture")


AXPY = CallDescriptor.of(
    "axpy", buffer_in("X", "float"), buffer_out("Y", "float"), host_scalar("N", "int"), device_scalar("Alpha", "float")
)


class Axpy(Block):
    type_name = "Axpy"

    def describe(self, b: BlockBuilder) -> None:
        c = b.add_captured(_axpy, AXPY)
        b.input("X", c.in_("X"))
        b.output("Y", c.out("Y"), size=like("X"))
        c.set_count("N", like("X"))
        b.scalar("Alpha", c.in_("Alpha"), default=2.0)


def _bind(ctx: Context, block: Block, port: str, count: int, ptr: int = 0x7000_0000) -> None:
    ctx.bind_input(block, port, ExternalBinding(ptr, count, DType.FLOAT32))


def _capacities(plan: GraphPlan) -> list[int]:
    """What a graph realized from ``plan`` allocated: each buffer's bytes, exactly."""
    return [b.count * b.dtype.itemsize for b in plan.buffers]


def _decide(old: GraphPlan, new: GraphPlan, ctx: Context, **kw):
    kw.setdefault("capacities", _capacities(old))
    return decide_warm_patch(old, new, ctx.snapshot().bindings, **kw)


def _refused(result, reason: Refusal, index: int | None = None) -> WarmRefusal:
    assert isinstance(result, WarmRefusal), result
    assert result.reason is reason, result
    if index is not None:
        assert result.index == index
    assert reason.value in str(result) and result.detail
    return result


@pytest.fixture
def chain():
    """``s1`` reads a bound input of 1000 floats; ``s2`` reads ``s1``'s output."""
    s1, s2 = Scale(name="s1", Factor=2.0), Scale(name="s2", Factor=3.0)
    ctx = Context()
    for b in (s1, s2):
        ctx.register_block(b)
    ctx.connect(s1, "Out", s2, "In")
    _bind(ctx, s1, "In", 1000)
    return ctx, s1, s2


def _node(plan: GraphPlan, block: Block) -> KernelNodePlan:
    (ni,) = plan.block_nodes[block.id]
    node = plan.nodes[ni]
    assert isinstance(node, KernelNodePlan)
    return node


# -- accepted -------------------------------------------------------------------------------------


def test_the_same_plan_patches_only_the_nodes_reading_bound_inputs(chain) -> None:
    ctx, s1, s2 = chain
    plan = compile_plan(ctx.snapshot())
    result = _decide(plan, compile_plan(ctx.snapshot()), ctx)
    assert isinstance(result, WarmPatch)
    n1 = _node(plan, s1)
    (kp,) = result.kernels  # s2 reads only planned buffers and equals its old node: nothing to write
    assert kp.index == n1.index and kp.function is None
    # Every constant, scalar and external argument is offered; the graph writes those that differ.
    assert dict(kp.writes) == {0: 0x7000_0000, 2: 2.0, 3: 0.0, 4: 1000}
    assert result.calls == () and result.counts == (1000, 1000)


def test_a_smaller_input_patches_counts_grids_and_pointers(chain) -> None:
    ctx, s1, s2 = chain
    old = compile_plan(ctx.snapshot())
    _bind(ctx, s1, "In", 300, ptr=0x9000_0000)  # shrinks and moves: fits the old allocations
    new = compile_plan(ctx.snapshot())
    result = _decide(old, new, ctx)
    assert isinstance(result, WarmPatch)
    by_index = {kp.index: kp for kp in result.kernels}
    k1, k2 = by_index[_node(new, s1).index], by_index[_node(new, s2).index]
    assert k1.plan.grid == k2.plan.grid == 2  # ceil(300 / 256)
    assert dict(k1.writes)[0] == 0x9000_0000 and dict(k1.writes)[4] == 300
    assert dict(k2.writes)[4] == 300
    assert result.counts == (300, 300)


def test_new_scalar_values_are_written_by_the_patch(chain) -> None:
    ctx, s1, s2 = chain
    old = compile_plan(ctx.snapshot())
    s2.params["Factor"].value = 5.0
    result = _decide(old, compile_plan(ctx.snapshot()), ctx)
    assert isinstance(result, WarmPatch)
    k2 = next(kp for kp in result.kernels if kp.index == _node(old, s2).index)
    assert dict(k2.writes)[2] == 5.0


def test_with_functions_every_kernel_is_patched_with_its_function(chain) -> None:
    ctx, s1, s2 = chain
    plan = compile_plan(ctx.snapshot())
    functions = {(s1.id, 0): "fn1", (s2.id, 0): "fn2"}  # opaque handles: the decision only looks them up
    result = _decide(plan, plan, ctx, functions=functions)
    assert isinstance(result, WarmPatch)
    assert [(kp.index, kp.function) for kp in result.kernels] == [
        (_node(plan, s1).index, "fn1"),
        (_node(plan, s2).index, "fn2"),
    ]
    assert all(isinstance(kp, KernelPatch) for kp in result.kernels)


def test_a_growth_within_the_allocation_is_accepted(chain) -> None:
    ctx, s1, _ = chain
    old = compile_plan(ctx.snapshot())
    _bind(ctx, s1, "In", 1500)
    new = compile_plan(ctx.snapshot())
    assert isinstance(_decide(old, new, ctx, capacities=[4 * 2048, 4 * 2048]), WarmPatch)  # pool size classes


def test_captured_calls_are_listed_for_comparison() -> None:
    a = Axpy(name="a")
    ctx = Context()
    ctx.register_block(a)
    _bind(ctx, a, "X", 256)
    old = compile_plan(ctx.snapshot())
    _bind(ctx, a, "X", 128)
    new = compile_plan(ctx.snapshot())
    result = _decide(old, new, ctx)
    assert isinstance(result, WarmPatch)
    (call,) = result.calls
    assert isinstance(call, CapturedNodePlan) and call.block_id == a.id
    assert result.kernels == () and result.counts == (128,)


# -- refused --------------------------------------------------------------------------------------


def test_a_profiling_level_change_needs_a_new_graph(chain) -> None:
    ctx, *_ = chain
    old = compile_plan(ctx.snapshot())
    new = compile_plan(ctx.snapshot(), level=ProfilingLevel.parse("PerBlock"))
    _refused(_decide(old, new, ctx), Refusal.PROFILING_LEVEL)


def test_an_added_block_changes_the_node_count(chain) -> None:
    ctx, _, s2 = chain
    old = compile_plan(ctx.snapshot())
    s3 = ctx.register_block(Scale(name="s3"))
    ctx.connect(s2, "Out", s3, "In")
    _refused(_decide(old, compile_plan(ctx.snapshot()), ctx), Refusal.NODE_COUNT)


def test_a_changed_buffer_count_needs_a_new_graph(chain) -> None:
    ctx, *_ = chain
    old = compile_plan(ctx.snapshot())
    new = dataclasses.replace(old, buffers=old.buffers[:1])
    _refused(decide_warm_patch(old, new, ctx.snapshot().bindings, capacities=_capacities(old)), Refusal.BUFFER_COUNT)


def test_changed_append_counters_need_a_new_graph() -> None:
    f, a = Fill(name="f", Count=5000), AppendFilter(name="a", Capacity=64)
    ctx = Context()
    for b in (f, a):
        ctx.register_block(b)
    ctx.connect(f, "Out", a, "In")
    old = compile_plan(ctx.snapshot())
    new = dataclasses.replace(old, counters=((a.id, "Other"),))
    _refused(_decide(old, new, ctx), Refusal.COUNTERS)


def test_moved_update_targets_need_a_new_graph(chain) -> None:
    ctx, s1, _ = chain
    old = compile_plan(ctx.snapshot())
    scalars = dict(old.scalar_slots)
    scalars[(s1.id, "Factor")] = ((0, 3),)
    _refused(_decide(old, dataclasses.replace(old, scalar_slots=scalars), ctx), Refusal.SCALAR_SLOTS)
    _refused(_decide(old, dataclasses.replace(old, binding_slots={}), ctx), Refusal.BINDING_SLOTS)


def test_a_buffer_of_another_type_or_role_needs_a_new_graph(chain) -> None:
    ctx, *_ = chain
    old = compile_plan(ctx.snapshot())
    retyped = (old.buffers[0], old.buffers[1]._replace(dtype=DType.INT32))
    _refused(_decide(old, dataclasses.replace(old, buffers=retyped), ctx), Refusal.BUFFER_LAYOUT, index=1)
    appending = (old.buffers[0]._replace(append=True), old.buffers[1])
    _refused(_decide(old, dataclasses.replace(old, buffers=appending), ctx), Refusal.BUFFER_LAYOUT, index=0)


def test_a_buffer_outgrowing_its_allocation_is_reallocated_and_its_kernels_repointed(chain) -> None:
    ctx, s1, s2 = chain
    old = compile_plan(ctx.snapshot())
    _bind(ctx, s1, "In", 2000)  # twice the size
    result = _decide(old, compile_plan(ctx.snapshot()), ctx)
    assert isinstance(result, WarmPatch)
    assert result.grow == ((0, grown_bytes(8000)), (1, grown_bytes(8000))) and grown_bytes(8000) == 12_000
    assert {kp.index for kp in result.kernels} == {_node(old, s1).index, _node(old, s2).index}
    assert result.counts == (2000, 2000)
    within = _decide(old, compile_plan(ctx.snapshot()), ctx, capacities=[8192, 8192])
    assert isinstance(within, WarmPatch) and within.grow == ()


def test_growth_of_a_buffer_a_library_call_holds_needs_a_new_graph(chain) -> None:
    ctx, s1, s2 = chain
    a = ctx.register_block(Axpy(name="a"))
    ctx.connect(s2, "Out", a, "X")
    old = compile_plan(ctx.snapshot())
    _bind(ctx, s1, "In", 1001)
    refusal = _refused(_decide(old, compile_plan(ctx.snapshot()), ctx), Refusal.BUFFER_CAPACITY)
    assert "captured call" in refusal.detail and "4004" in refusal.detail


def test_a_node_of_another_kind_needs_a_new_graph(chain) -> None:
    ctx, s1, _ = chain
    old = compile_plan(ctx.snapshot())
    i = _node(old, s1).index
    nodes = list(old.nodes)
    nodes[i] = MemsetNodePlan(i, 1)
    _refused(_decide(old, dataclasses.replace(old, nodes=tuple(nodes)), ctx), Refusal.NODE_KIND, index=i)


def test_a_kernel_with_other_edges_or_launch_shape_needs_a_new_graph() -> None:
    f, s = Fill(name="f", Count=1000), Scale(name="s")
    ctx = Context()
    for b in (f, s):
        ctx.register_block(b)
    ctx.connect(f, "Out", s, "In")
    old = compile_plan(ctx.snapshot())
    i = _node(old, s).index

    def with_node(**change) -> GraphPlan:
        nodes = list(old.nodes)
        nodes[i] = nodes[i]._replace(**change)
        return dataclasses.replace(old, nodes=tuple(nodes))

    _refused(_decide(old, with_node(block=128), ctx), Refusal.KERNEL_NODE, index=i)
    _refused(_decide(old, with_node(deps=()), ctx), Refusal.KERNEL_NODE, index=i)
    _refused(_decide(old, with_node(shared_bytes=1024), ctx), Refusal.KERNEL_NODE, index=i)


def test_an_argument_from_another_source_needs_a_new_graph(chain) -> None:
    """Binding an input that was linked (or the reverse) moves the argument from a planned buffer to a
    user's memory: other update targets, other nodes."""
    ctx, s1, s2 = chain
    old = compile_plan(ctx.snapshot())
    node = _node(old, s2)
    args = list(node.args)
    args[0] = args[0]._replace(kind="external", ref=(s2.id, "In"))
    nodes = list(old.nodes)
    nodes[node.index] = node._replace(args=tuple(args))
    new = dataclasses.replace(old, nodes=tuple(nodes))
    _refused(_decide(old, new, ctx), Refusal.KERNEL_NODE, index=node.index)


def test_a_changed_memset_needs_a_new_graph() -> None:
    f, a = Fill(name="f", Count=5000), AppendFilter(name="a", Capacity=64)
    ctx = Context()
    for b in (f, a):
        ctx.register_block(b)
    ctx.connect(f, "Out", a, "In")
    old = compile_plan(ctx.snapshot())
    memset = old.nodes[0]
    assert isinstance(memset, MemsetNodePlan)
    new = dataclasses.replace(old, nodes=(memset._replace(count=2), *old.nodes[1:]))
    _refused(_decide(old, new, ctx), Refusal.FIXED_NODE, index=0)


def test_a_changed_captured_call_needs_a_new_graph() -> None:
    a = Axpy(name="a")
    ctx = Context()
    ctx.register_block(a)
    _bind(ctx, a, "X", 256)
    old = compile_plan(ctx.snapshot())
    (call,) = old.captured_nodes
    other = dataclasses.replace(old, nodes=(call._replace(spec=object()),))
    _refused(_decide(old, other, ctx), Refusal.CAPTURED_CALL, index=call.index)
    moved = call.args[0]._replace(kind="buffer", ref=0)
    rewired = dataclasses.replace(old, nodes=(call._replace(args=(moved, *call.args[1:])),))
    _refused(_decide(old, rewired, ctx), Refusal.CAPTURED_CALL, index=call.index)


def test_a_stale_capture_needs_a_new_graph() -> None:
    a = Axpy(name="a")
    ctx = Context()
    ctx.register_block(a)
    _bind(ctx, a, "X", 256)
    plan = compile_plan(ctx.snapshot())
    (call,) = plan.captured_nodes
    _refused(_decide(plan, plan, ctx, stale={call.index}), Refusal.STALE_CAPTURE, index=call.index)


def test_an_unbound_input_is_refused_not_looked_up(chain) -> None:
    ctx, s1, _ = chain
    plan = compile_plan(ctx.snapshot())
    refusal = decide_warm_patch(plan, plan, {}, capacities=_capacities(plan))
    _refused(refusal, Refusal.UNBOUND, index=_node(plan, s1).index)
    a = Axpy(name="a")
    actx = Context()
    actx.register_block(a)
    _bind(actx, a, "X", 256)
    aplan = compile_plan(actx.snapshot())
    _refused(decide_warm_patch(aplan, aplan, {}, capacities=_capacities(aplan)), Refusal.UNBOUND)


def test_rules_are_checked_plan_wide_first() -> None:
    """A plan breaking several rules gets the first plan-wide one: the cheapest comparison that decides."""
    f, s, add = Fill(name="f", Count=100), Scale(name="s"), VectorAdd(name="add")
    ctx = Context()
    for b in (f, s, add):
        ctx.register_block(b)
    ctx.connect(f, "Out", s, "In")
    old = compile_plan(ctx.snapshot())
    ctx.connect(f, "Out", add, "A")
    ctx.connect(s, "Out", add, "B")
    new = compile_plan(ctx.snapshot(), level=ProfilingLevel.parse("PerKernel"))
    _refused(_decide(old, new, ctx), Refusal.PROFILING_LEVEL)


def test_the_same_topology_is_what_cuGraphExecUpdate_may_take(chain) -> None:  # noqa: N802
    ctx, s1, s2 = chain
    old = compile_plan(ctx.snapshot())
    assert same_topology(old, old)
    s1.set("Factor", 9.0)
    _bind(ctx, s1, "In", 100_000)  # values, counts and grids differ: the topology does not
    assert same_topology(old, compile_plan(ctx.snapshot()))
    ctx.disconnect(s1, "Out", s2, "In")
    _bind(ctx, s2, "In", 1000)  # the same nodes, one edge fewer
    assert not same_topology(old, compile_plan(ctx.snapshot()))
    assert not same_topology(old, compile_plan(ctx.snapshot(), level=ProfilingLevel.PER_BLOCK))
