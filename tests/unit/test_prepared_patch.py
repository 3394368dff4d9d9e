"""A Warm patch prepared on the build thread (``CompiledGraph.prepare_patch``) and applied at the swap
(``apply_prepared``) leaves the graph exactly as ``try_patch`` does: the same argument bytes, grids,
buffer counts and driver calls, over random growths and shrinks, without and with a bypass redirect in
place (without one, each node goes to the driver as it is written)."""

from __future__ import annotations

import random

import pytest

from cudapatch import DType, Scale
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.bypass import BypassIndex, plan_bypass
from cudapatch.engine.executable import CompiledGraph
from cudapatch.engine.nodes import KernelNode
from cudapatch.engine.warm import WarmPatch, decide_warm_patch
from cudapatch.errors import CudapatchError

from .recording_driver import RecordingDriver, realize_recorded
from .unfused import compile_plan


def _chain(n: int, count: int) -> tuple[Context, list]:
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=float(i + 2), Offset=0.5 * i)) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, count, DType.FLOAT32))
    return ctx, blocks


def _state(g: CompiledGraph) -> list:
    """What the executable holds per kernel node, with buffer addresses as buffer indices (two graphs
    built from one plan have their own allocations)."""
    where = {b.ptr: f"buf{i}" for i, b in enumerate(g.buffers)}
    out = []
    for kn in g._nodes:
        if isinstance(kn, KernelNode):
            p = kn.params
            args = [where.get(v, v) if isinstance(v, int) else v for v in (s.value for s in kn.slots)]
            out.append((args, p.gridDimX, p.gridDimY, p.gridDimZ, int(p.func), kn.plan))
    return out


def _patched(g: CompiledGraph, rec: RecordingDriver) -> list:
    """The plan nodes ``cuGraphExecKernelNodeSetParams`` was called for, with the grid it was given."""
    index = {kn.handle: i for i, kn in enumerate(g._nodes) if kn is not None}
    return sorted((index[c[1]], c[2]) for c in rec.calls if c[0] == "set_params")


def _decide(g: CompiledGraph, ctx: Context) -> tuple:
    snap = ctx.snapshot()
    new = compile_plan(snap, reuse=False)  # a buffer per value: a bypassed block's reader is redirected
    d = decide_warm_patch(g.plan, new, snap.bindings, capacities=[b.capacity_bytes for b in g.buffers])
    assert isinstance(d, WarmPatch)
    return new, snap.bindings, g.trim_patch(d)


@pytest.mark.parametrize("bypassed", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_a_prepared_patch_leaves_the_graph_as_try_patch_does(rec, seed: int, bypassed: bool) -> None:
    rng = random.Random(seed)
    n = rng.randint(3 if bypassed else 2, 12)
    ctx, blocks = _chain(n, rng.choice([100, 1000, 4000]))
    plan = compile_plan(ctx.snapshot(), reuse=False)
    pools = [BufferPool(), BufferPool()]
    a, b = (realize_recorded(ctx, plan, pool) for pool in pools)
    a.adopt(None)
    b.adopt(None)
    mid = None
    if bypassed:  # a bypassed middle block: its reader reads its input (a redirect the packed bytes do not hold)
        mid = blocks[rng.randrange(1, n - 1)].id
        for g in (a, b):
            g.set_bypass(plan_bypass(BypassIndex(g.plan), {mid}))
        assert b.bypass.redirects
    for _ in range(4):  # growths (new pool blocks) and shrinks (counts and grids only)
        count = rng.choice([50, 300, 1000, 5000, 20000])
        ctx.bind_input(blocks[0], "In", ExternalBinding(0xB000 + count, count, DType.FLOAT32))
        new, bindings, decision = _decide(a, ctx)
        rec.calls.clear()
        expected = a.try_patch(new, bindings, decided=decision)
        calls_a = _patched(a, rec)
        new_b, bindings_b, decision_b = _decide(b, ctx)
        prepared = b.prepare_patch(decision_b, bindings_b)
        assert prepared is not None
        rec.calls.clear()
        patched = b.apply_prepared(prepared, new_b)
        calls_b = _patched(b, rec)
        if mid is None:
            assert patched == expected and calls_b == calls_a
        else:  # the same, and the redirected readers again (their slots hold the input, not the plan's)
            readers = {ni for ni, _ in b.bypass.redirects}
            assert set(calls_a) <= set(calls_b) and len(calls_b) == len(set(calls_b))
            assert {ni for ni, _ in set(calls_b) - set(calls_a)} <= readers and patched >= expected
            for g in (a, b):  # the bypass tier's step after every patch (``try_patch`` leaves redirects to it)
                g.set_bypass(plan_bypass(BypassIndex(g.plan), {mid}))
        assert _state(a) == _state(b)
        assert [x.count for x in a.buffers] == [x.count for x in b.buffers]
        assert [x.capacity_bytes for x in a.buffers] == [x.capacity_bytes for x in b.buffers]
        assert a.reallocations == b.reallocations and b.plan is new_b
        assert pools[0].in_use_bytes == pools[1].in_use_bytes
    a.close()
    b.close()


def test_a_prepared_patch_reserves_on_the_build_thread_and_gives_back_what_is_not_applied(rec) -> None:
    ctx, blocks = _chain(3, 1000)
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    before, ptrs = pool.in_use_bytes, [b.ptr for b in g.buffers]
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xB000, 8000, DType.FLOAT32))
    new, bindings, decision = _decide(g, ctx)
    prepared = g.prepare_patch(decision, bindings)
    assert prepared is not None and len(prepared.allocs) == 3
    # Reserved, not moved: the running graph still reads and writes its own blocks.
    assert [b.ptr for b in g.buffers] == ptrs and pool.in_use_bytes > before
    # The graph was patched meanwhile (another build landed first): nothing is applied, blocks go back.
    g.plan = compile_plan(ctx.snapshot())
    rec.calls.clear()
    assert g.apply_prepared(prepared, new) is None
    assert rec.calls == [] and pool.in_use_bytes == before and [b.ptr for b in g.buffers] == ptrs
    prepared.discard()  # idempotent
    assert pool.in_use_bytes == before
    g.close()


def test_a_prepared_patch_for_a_graph_closed_meanwhile_gives_its_blocks_back(rec) -> None:
    ctx, blocks = _chain(3, 1000)
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xB000, 8000, DType.FLOAT32))
    new, bindings, decision = _decide(g, ctx)
    prepared = g.prepare_patch(decision, bindings)
    assert prepared is not None and prepared.allocs
    g.close()
    closed = pool.in_use_bytes  # the graph's own blocks are back; the reserved ones are not yet
    with pytest.raises(CudapatchError, match="closed"):
        g.apply_prepared(prepared, new)
    assert prepared.allocs == [] and pool.in_use_bytes < closed


def test_a_hot_value_set_after_the_snapshot_is_overwritten_until_the_carry_writes_it_again(rec) -> None:
    # The packed bytes hold the snapshot's values: a Hot edit made while the build ran is re-applied
    # after the swap by ParamTier.end_carry, which writes the slot through the same targets.
    ctx, (s0, s1, s2) = _chain(3, 1000)
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), BufferPool())
    g.adopt(None)
    ctx.bind_input(s0, "In", ExternalBinding(0xB000, 8000, DType.FLOAT32))
    new, bindings, decision = _decide(g, ctx)
    prepared = g.prepare_patch(decision, bindings)
    g.update_scalars({(s1.id, "Factor"): 42.0})  # on the frame thread, while the build runs
    node = new.block_nodes[s1.id][0]
    assert g.node_arg(node, 2) == 42.0
    g.apply_prepared(prepared, new)
    assert g.node_arg(node, 2) == 3.0  # the snapshot's value
    g.update_scalars({(s1.id, "Factor"): 42.0})  # end_carry
    assert g.node_arg(node, 2) == 42.0
    g.close()
