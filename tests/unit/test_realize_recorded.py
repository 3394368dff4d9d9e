"""realize and CompiledGraph against a recording stand-in for the driver (no GPU).

The GPU suite checks results on a device; these check, on every machine, the calls the builder and
the executable graph make: nodes in plan order after their dependencies, one instantiation, Hot and
Warm updates patching exactly the nodes they change, a refused Warm resize touching nothing, and a
failed rebuild leaving the running graph's storage and buffers as they were. cuda-bindings' structs
and enums are the real ones; only the ``cu*`` functions are recorded.
"""

from __future__ import annotations

import pytest

import cudapatch.kernels._driver as driver_module
from cudapatch import DType, KernelLoadError, Scale
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.profiling import ProfilingLevel

from .recording_driver import ChildGraphDriver, realize_recorded
from .unfused import compile_plan  # one node per block: these tests are about unfused plans


@pytest.fixture
def patch():
    """Three Scales in a chain reading a bound input of 1000 floats."""
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=float(i + 2))) for i in range(3)]
    ctx.connect(blocks[0], "Out", blocks[1], "In")
    ctx.connect(blocks[1], "Out", blocks[2], "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 1000, DType.FLOAT32))
    return ctx, blocks


def test_nodes_follow_the_plan_and_the_graph_is_instantiated_once(rec, patch) -> None:
    ctx, blocks = patch
    plan = compile_plan(ctx.snapshot(), level=ProfilingLevel.parse("PerBlock"))
    pool = BufferPool()
    g = realize_recorded(ctx, plan, pool, stamp_function=1, publish_function=2)
    added = [c for c in rec.calls if c[0] in ("add_kernel", "add_memset")]
    assert len(added) == len(plan.nodes) == len(g.plan.nodes)
    handles = [c[1] for c in added]
    edges = {tos[0]: froms for name, froms, tos in (c for c in rec.calls if c[0] == "add_edges")}
    for node, call in zip(plan.nodes, added, strict=True):
        # Every dependency is a plain edge at the add, or a programmatic one added right after.
        deps = set(call[2]) | set(edges.get(call[1], ()))
        assert deps == {handles[d] for d in node.deps}
    kernels = {c[3] for c in added if c[0] == "add_kernel"}
    assert {100 + b.id for b in blocks} | {1, 2} == kernels  # the blocks' kernels, stamps and publish
    assert rec.names().count("instantiate") == 1 and g.instantiations == 1
    rec.calls.clear()
    g.launch(0)
    assert rec.calls == [("launch", g.handle)]
    g.close()
    assert rec.names()[1:] == ["destroy_exec", "destroy_graph"] and g.is_closed


def test_hot_and_warm_updates_patch_only_the_nodes_they_change(rec, patch) -> None:
    ctx, (s0, s1, s2) = patch
    pool = BufferPool()
    plan = compile_plan(ctx.snapshot())
    g = realize_recorded(ctx, plan, pool)
    g.adopt(None)
    node = {c[3]: c[1] for c in rec.calls if c[0] == "add_kernel"}  # function -> node handle
    rec.calls.clear()
    assert g.update_scalars({(s1.id, "Factor"): 9.0}) == 1
    assert rec.calls == [("set_params", node[100 + s1.id], 4)]
    assert g.node_arg(plan.block_nodes[s1.id][0], 2) == 9.0
    # The first update resolved the key's target (none is made at the build); the next takes it as is.
    assert g.update_scalars({(s1.id, "Factor"): 8.0}) == 1 and g.node_arg(plan.block_nodes[s1.id][0], 2) == 8.0
    assert g.update_scalars({(s1.id, "NoSuchParam"): 1.0, (999, "Factor"): 1.0}) == 0
    assert rec.calls == [("set_params", node[100 + s1.id], 4)] * 2
    rec.calls.clear()
    assert g.update_pointer(s0.id, "In", 0xB000) == 1
    assert rec.calls == [("set_params", node[100 + s0.id], 4)]
    # A smaller input: counts, grids and the const count argument of every node change in place.
    rec.calls.clear()
    ctx.bind_input(s0, "In", ExternalBinding(0xC000, 300, DType.FLOAT32))
    snap = ctx.snapshot()
    assert g.try_patch(compile_plan(snap), snap.bindings) == 3
    assert sorted(rec.calls) == sorted(("set_params", node[100 + b.id], 2) for b in (s0, s1, s2))
    assert [b.count for b in g.buffers] == [300, 300, 300] and g.warm_refusal is None
    # A larger one than was allocated: the buffers move to larger pool blocks (with headroom) and every
    # node reading or writing them is pointed at them, in place: no new graph.
    rec.calls.clear()
    old_ptrs = {b.ptr for b in g.buffers}
    ctx.bind_input(s0, "In", ExternalBinding(0xC000, 5000, DType.FLOAT32))
    snap = ctx.snapshot()
    grown = compile_plan(snap)
    assert g.try_patch(grown, snap.bindings) == 3
    assert sorted(rec.calls) == sorted(("set_params", node[100 + b.id], 20) for b in (s0, s1, s2))  # 5000 / 256
    assert g.reallocations == 3 and g.instantiations == 1 and g.warm_refusal is None
    assert [b.count for b in g.buffers] == [5000, 5000, 5000] and all(b.capacity_bytes >= 30_000 for b in g.buffers)
    assert not old_ptrs & {b.ptr for b in g.buffers} and pool.in_use_bytes == sum(b.capacity_bytes for b in g.buffers)
    for n in grown.kernel_nodes:
        for ai, a in enumerate(n.args):
            if a.kind == "buffer":
                assert g.node_arg(n.index, ai) == g.buffers[a.ref].ptr
    g.close()


def test_a_failed_rebuild_leaves_the_running_graph_as_it_was(rec, patch) -> None:
    ctx, (s0, s1, _) = patch
    pool = BufferPool()
    plan = compile_plan(ctx.snapshot())
    g = realize_recorded(ctx, plan, pool)
    g.adopt(None)
    s0.params["Factor"].value = 42.0
    newer = compile_plan(ctx.snapshot())
    functions = {(s0.id, 0): 100 + s0.id}  # s1 and s2 have no compiled kernel
    in_use = pool.in_use_bytes
    rec.calls.clear()
    with pytest.raises(KernelLoadError, match="s1"):
        realize_recorded(ctx, newer, pool, functions=functions, previous=g)
    assert g.node_arg(plan.block_nodes[s0.id][0], 2) == 2.0  # the borrowed storage was restored
    assert "destroy_graph" in rec.names() and "instantiate" not in rec.names()
    assert pool.in_use_bytes == in_use and not g.is_closed
    # The next rebuild succeeds, takes the buffers over, and the old graph gives back only what it kept.
    g2 = realize_recorded(ctx, newer, pool, previous=g)
    g2.adopt(g)
    assert [b.ptr for b in g2.buffers] == [b.ptr for b in g.buffers]
    g.retire(0)
    assert g.is_idle() and pool.in_use_bytes == in_use
    g.close()
    assert pool.in_use_bytes == in_use  # the buffers are g2's now
    g2.close()
    assert pool.in_use_bytes == 0


@pytest.mark.parametrize("refused", [False, True])
def test_a_cold_build_of_the_same_topology_updates_the_running_executable(rec, patch, refused: bool) -> None:
    ctx, (s0, s1, s2) = patch
    pool = BufferPool()
    plan = compile_plan(ctx.snapshot())
    old = realize_recorded(ctx, plan, pool)
    old.adopt(None)
    old_exec = old.handle
    (old_graph,) = [c[1] for c in rec.calls if c[0] == "create_graph"]
    original = [c[1] for c in rec.calls if c[0] == "add_kernel"]
    rec.calls.clear()
    rec.refuse_update = refused
    # Other functions for every kernel: what a Warm patch does not take when their layout changed.
    functions = {(b.id, 0): 200 + b.id for b in (s0, s1, s2)}
    new = realize_recorded(ctx, plan, pool, previous=old, update_previous=True, functions=functions)
    names = rec.names()
    (built_graph,) = [c[1] for c in rec.calls if c[0] == "create_graph"]
    built = [c[1] for c in rec.calls if c[0] == "add_kernel"]
    assert names.count("exec_update") == 1 and names.index("exec_update") > names.index("add_kernel")
    assert ("exec_update", old_exec, built_graph) in rec.calls
    if refused:  # the driver changed nothing: instantiate; the old graph keeps its executable
        assert ("instantiate", built_graph) in rec.calls and (new.instantiations, new.exec_updates) == (1, 0)
        assert new.handle != old_exec and old.handle == old_exec
        old.close()
        assert ("destroy_exec", old_exec) in rec.calls and ("destroy_graph", old_graph) in rec.calls
    else:
        assert "instantiate" not in names and (new.instantiations, new.exec_updates) == (0, 1)
        assert new.handle == old_exec and old.handle is None
        assert [c for c in rec.calls if c[0] == "destroy_graph"] == [("destroy_graph", built_graph)]
        rec.calls.clear()
        assert new.update_scalars({(s1.id, "Factor"): 9.0}) == 1
        (call,) = rec.calls
        assert call[0] == "set_params" and call[1] == original[1] and call[1] not in built  # the executable's nodes
        old.close()  # it runs nothing any more: neither its executable nor its graph is destroyed
        assert not [c for c in rec.calls if c[0] in ("destroy_exec", "destroy_graph")]
        new.close()
        assert ("destroy_exec", old_exec) in rec.calls and ("destroy_graph", old_graph) in rec.calls


def test_a_child_graph_composite_is_one_node_whose_kernels_update_through_it(monkeypatch) -> None:
    from tests.unit.composite_blocks import TwoScales

    fake = ChildGraphDriver()
    monkeypatch.setattr(driver_module, "_driver", fake)
    ctx = Context()
    pair = ctx.register_block(TwoScales(name="pair", child_graph=True))
    tail = ctx.register_block(Scale(name="tail"))
    ctx.connect(pair, "Out", tail, "In")
    ctx.bind_input(pair, "In", ExternalBinding(0xA000, 1000, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot())
    (group,) = plan.children
    g = realize_recorded(ctx, plan, BufferPool())
    g.adopt(None)
    (child,) = [c for c in fake.calls if c[0] == "add_child"]
    kernels = {c[3]: c for c in fake.calls if c[0] == "add_kernel"}  # function -> call
    a, b = pair.inner("a"), pair.inner("b")
    ka, kb, kt = kernels[100 + a.id], kernels[100 + b.id], kernels[100 + tail.id]
    # The inner kernels go into the child's embedded graph, chained there; the tail waits for the child.
    assert ka[5] == kb[5] == f"embedded-{child[1]}" and ka[2] == () and kb[2] == (ka[1],)
    assert child[2] == () and kt[2] == (child[1],) and kt[5] == child[3] is not None and kt[5] != ka[5]
    assert fake.names().count("destroy_graph") == 1  # the empty graph the child node copied
    # A Hot edit of the exposed Gain patches both inner nodes through the child node, once.
    fake.calls.clear()
    assert g.update_scalars({(pair.id, "Gain"): 4.0}) == 2
    assert fake.calls == [
        ("template_params", ka[1]),
        ("template_params", kb[1]),
        ("child_params", child[1], f"embedded-{child[1]}"),
    ]
    assert g.node_arg(plan.block_nodes[b.id][0], 2) == 4.0
    # The tail, outside, is patched as always; a Warm rebind of the composite's input reaches 'a'.
    fake.calls.clear()
    g.update_scalars({(tail.id, "Factor"): 0.5})
    assert fake.calls == [("set_params", kt[1], 4)]
    fake.calls.clear()
    assert g.update_pointer(pair.id, "In", 0xB000) == 1
    assert [c[0] for c in fake.calls] == ["template_params", "child_params"]
    g.close()


def test_adopt_takes_over_the_borrowed_buffers_and_gives_them_the_new_counts(rec, patch) -> None:
    ctx, (s0, _, _) = patch
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    ctx.bind_input(s0, "In", ExternalBinding(0xA000, 600, DType.FLOAT32))  # smaller: every buffer still fits
    smaller = compile_plan(ctx.snapshot())
    g2 = realize_recorded(ctx, smaller, pool, previous=g)
    assert [b.count for b in g.buffers] == [1000] * len(g.buffers)  # the running graph keeps its counts
    g2.adopt(g)
    assert [b.ptr for b in g2.buffers] == [b.ptr for b in g.buffers]
    assert [b.count for b in g2.buffers] == [bp.count for bp in smaller.buffers] == [600] * len(smaller.buffers)
    g.retire(0)
    g.close()
    assert pool.in_use_bytes > 0  # g2's now
    g2.close()
    assert pool.in_use_bytes == 0


def test_adopt_uses_the_hand_over_worked_out_by_the_build(rec, patch) -> None:
    # The build works out which borrowed counts change and what the previous graph keeps (a removed
    # block's buffer), so the swap frame visits neither every buffer nor every owned one.
    ctx, (s0, s1, s2) = patch
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    ctx.unregister_block(s2)
    ctx.bind_input(s0, "In", ExternalBinding(0xA000, 600, DType.FLOAT32))
    shorter = compile_plan(ctx.snapshot())
    g2 = realize_recorded(ctx, shorter, pool, previous=g)
    handover = g2._handover
    assert handover is not None and handover.previous is g and len(handover.counts) == len(shorter.buffers)
    assert handover.kept == [g.buffers[-1]]  # s2's output: borrowed by nothing
    kept_bytes = g.buffers[-1].capacity_bytes
    epoch = g.buffer_epoch
    before = (g2._owned, g._owned)
    replaced = g2.adopt(g)
    assert g.buffer_epoch == epoch + 1 and g.owned_buffers() == [g.buffers[-1]]
    # The lists were taken whole (the swap frame copies none), each graph's parts hold the one it
    # owns now, and the lists replaced come back for the caller to free later.
    assert replaced == before and all(a is b for a, b in zip(replaced, before, strict=True))
    assert g2._owned is g2._parts.owned and g._owned is g._parts.owned is handover.kept
    assert sorted(map(id, g2.owned_buffers())) == sorted(map(id, g2.buffers))
    assert [b.count for b in g2.buffers] == [600] * len(shorter.buffers)
    in_use = pool.in_use_bytes
    g.retire(0)  # gives back only what it kept
    assert pool.in_use_bytes == in_use - kept_bytes
    g.close()
    g2.close()
    assert pool.in_use_bytes == 0


def test_a_warm_patch_between_build_and_swap_makes_adopt_visit_every_buffer(rec, patch) -> None:
    # Built for the counts the running graph has (so the hand-over changes no count), then the running
    # graph is patched Warm to other counts: adopt must still give the new graph its own counts.
    ctx, (s0, _, _) = patch
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    g2 = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool, previous=g)
    assert g2._handover is not None and g2._handover.counts == []
    ctx.bind_input(s0, "In", ExternalBinding(0xA000, 600, DType.FLOAT32))
    snap = ctx.snapshot()
    assert g.try_patch(compile_plan(snap), snap.bindings) is not None
    assert [b.count for b in g.buffers] == [600] * len(g.buffers)
    g2.adopt(g)
    assert [b.count for b in g2.buffers] == [1000] * len(g2.buffers)
    assert g.owned_buffers() == []
    g.retire(0)
    g.close()
    assert pool.in_use_bytes > 0  # g2's now
    g2.close()
    assert pool.in_use_bytes == 0


def test_a_fused_chain_at_level_none_is_one_kernel_node_and_one_launch(rec) -> None:
    # What a frame of a fused chain launches (benchmarks/bench_fusion.py compares it with cupy.fuse):
    # at profiling level None, the group's kernel and nothing else: no stamp, publish, memset, copy or
    # event, no readback. Stamps and the publish node come with a profiling level, as before.
    from cudapatch.engine.compiler.fusion import FUSED_KERNEL
    from cudapatch.engine.plan import KernelNodePlan, PublishNodePlan, StampNodePlan

    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=1.0 + i / 100)) for i in range(100)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 1024, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot(), fuse=True)
    (node,) = plan.nodes
    assert isinstance(node, KernelNodePlan) and node.kernel == FUSED_KERNEL and not node.deps
    assert (plan.stamp_count, plan.counters, plan.probe_words) == (0, (), 0)
    # 1,024 elements, one per thread, 128 a block; the scalars read through prefetched lines
    assert (node.grid, node.block, node.source.per_thread, node.source.scalar_loads) == (8, 128, 1, "param")
    pool = BufferPool()
    g = realize_recorded(ctx, plan, pool, functions={(blocks[-1].id, FUSED_KERNEL): 7})
    assert [c[0] for c in rec.calls if c[0].startswith("add_")] == ["add_kernel"] and g.readback is None
    rec.calls.clear()
    g.launch(0)
    assert rec.calls == [("launch", g.handle)]
    g.close()
    timed = compile_plan(ctx.snapshot(), level=ProfilingLevel.parse("Summary"), fuse=True)
    kinds = [type(n) for n in timed.nodes]
    assert kinds.count(KernelNodePlan) == 1 and StampNodePlan in kinds and kinds[-1] is PublishNodePlan


def test_only_a_large_graph_waits_for_the_end_of_a_frame_to_instantiate(rec, patch, monkeypatch) -> None:
    import importlib

    realize_module = importlib.import_module("cudapatch.engine.realize")  # (the package's ``realize`` is the function)
    ctx, _ = patch
    plan = compile_plan(ctx.snapshot())
    paced: list[int] = []

    def pace() -> None:
        paced.append(rec.names().count("instantiate"))  # called before the instantiation, not after

    g = realize_recorded(ctx, plan, BufferPool(), pace=pace)
    assert paced == [] and rec.names().count("instantiate") == 1  # 3 nodes: instantiated at once
    monkeypatch.setattr(realize_module, "PACE_FROM_NODES", len(plan.nodes))
    h = realize_recorded(ctx, plan, BufferPool(), pace=pace)
    assert paced == [1] and rec.names().count("instantiate") == 2 and h.timing["pace_ms"] >= 0
    g.close()
    h.close()


def test_a_replaced_graph_is_freed_once_closed_not_kept_by_the_graph_that_adopted_it(rec, patch) -> None:
    # The hand-over names the graph it was worked out from; once adopted, nothing of the new graph may
    # still hold it, or every graph replaced since the engine started would stay in memory (each one
    # holding the one before), and the build thread's freeing of retired graphs would free nothing.
    import gc
    import weakref

    ctx, (s0, _, _) = patch
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    ctx.bind_input(s0, "In", ExternalBinding(0xA000, 600, DType.FLOAT32))
    g2 = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool, previous=g)
    g2.adopt(g)
    g.retire(0)
    g.close()
    gone = weakref.ref(g)
    del g
    gc.collect()
    assert gone() is None
    g2.close()
