"""The memory check before a build (no GPU): what a plan would newly allocate against what is free,
and the error that names the largest buffers. The driver side (``cuMemGetInfo``, nothing allocated,
the old graph running on) is tests/gpu/test_memory_gpu.py."""

from __future__ import annotations

import pytest

from cudapatch import Fill, Scale
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.buffers import BufferPool, size_class
from cudapatch.engine.memory_check import RESERVE_BYTES, lends, memory_shortfall, new_buffers
from cudapatch.errors import CudaOutOfMemoryError
from cudapatch.kernels.types import DType
from tests.unit.recording_driver import realize_recorded

from .unfused import compile_plan  # one node per block: these tests are about unfused plans

GB = 1 << 30


def _patch(*counts: int) -> tuple[Context, list]:
    """One Fill per count, each followed by a Scale."""
    c = Context()
    blocks = []
    for i, n in enumerate(counts):
        f = c.register_block(Fill(name=f"f{i}", Count=n))
        s = c.register_block(Scale(name=f"s{i}"))
        c.connect(f, "Out", s, "In")
        blocks += [f, s]
    return c, blocks


def test_a_plan_that_fits_passes() -> None:
    c, _ = _patch(1000, 2000)
    plan = compile_plan(c.snapshot())
    assert memory_shortfall(plan, free_bytes=GB) is None
    need = sum(size_class(b.count * 4) for b in plan.buffers)
    assert memory_shortfall(plan, free_bytes=need + RESERVE_BYTES) is None
    assert memory_shortfall(plan, free_bytes=need + RESERVE_BYTES - 1) is not None


def test_too_much_names_the_largest_buffers_and_their_blocks() -> None:
    c, blocks = _patch(1000, 500_000_000, 250_000_000, 100)
    plan = compile_plan(c.snapshot())
    names = {b.id: b.name for b in blocks}
    short = memory_shortfall(plan, free_bytes=GB, names=names)
    assert short is not None
    assert [(names[bid], what) for bid, what, _ in short.largest] == [("f1", "Out"), ("s1", "Out"), ("f2", "Out")]
    assert short.largest[0][2] == 2_000_000_000  # its bytes; the need counts pool size classes
    assert short.block_id == blocks[2].id
    msg = short.message(names)
    assert "'f1.Out' 1.9 GB" in msg and "'s1.Out'" in msg and "'f2.Out'" in msg and "only 1.0 GB is free" in msg
    assert "nothing was allocated" in msg
    assert short.need_bytes == sum(size_class(b.count * 4) for b in plan.buffers) + RESERVE_BYTES


def test_idle_pool_blocks_count_as_free() -> None:
    c, _ = _patch(100_000_000)
    plan = compile_plan(c.snapshot())
    assert memory_shortfall(plan, free_bytes=GB // 2) is not None
    assert memory_shortfall(plan, free_bytes=GB // 2, idle_bytes=GB // 2) is None


def test_what_the_running_graph_lends_is_not_allocated_again() -> None:
    c, blocks = _patch(100_000_000)
    plan = compile_plan(c.snapshot())
    f, s = blocks
    cap = size_class(400_000_000)
    lent = {(f.id, "Out"): (DType.FLOAT32, cap), (s.id, "Out"): (DType.FLOAT32, cap)}
    assert new_buffers(plan, lent) == []
    assert memory_shortfall(plan, free_bytes=RESERVE_BYTES, lent=lent) is None
    small = {(f.id, "Out"): (DType.FLOAT32, 1000), (s.id, "Out"): (DType.INT32, cap)}  # too small; another type
    assert [b.label for b, _ in new_buffers(plan, small)] == ["Out", "Out"]
    assert lends(plan.buffers[0], DType.FLOAT32, cap) and not lends(plan.buffers[0], DType.FLOAT32, 1000)


def test_a_shared_buffer_is_named_by_the_values_in_it() -> None:
    c = Context()
    prev = c.register_block(Fill(name="head", Count=200_000_000))
    names = {prev.id: "head"}
    for i in range(5):
        s = c.register_block(Scale(name=f"s{i}"))
        c.connect(prev, "Out", s, "In")
        names[s.id] = s.name
        prev = s
    plan = compile_plan(c.snapshot())
    assert plan.memory.buffer_values()  # the chain shares
    short = memory_shortfall(plan, free_bytes=GB, names=names)
    assert short is not None
    whats = [what for _, what, _ in short.largest]
    assert "a buffer shared by 'head.Out', 's1.Out', 's3.Out'" in whats
    assert "'s4.Out'" in short.message(names)


# -- realize with shared buffers and the check, against the recording driver -------------------------


def _recorded_chain(n: int = 6, count: int = 1000):
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=float(i + 2))) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, count, DType.FLOAT32))
    return ctx, blocks


def test_realize_allocates_the_shared_buffers_once_and_reads_values_through_them(rec) -> None:
    ctx, blocks = _recorded_chain()
    plan = compile_plan(ctx.snapshot())
    assert len(plan.buffers) == 3
    pool = BufferPool()
    g = realize_recorded(ctx, plan, pool)
    g.adopt(None)
    assert pool.driver_allocations == 3
    # s0, s2, s4 take turns in one buffer, s1, s3 in another; s3 and s4 are last in theirs; s5 the result
    assert [g.overwritten(b.id, "Out") for b in blocks] == [True] * 3 + [False] * 3
    assert g.output(blocks[0].id, "Out") is None
    view = g.output(blocks[4].id, "Out")
    assert view is not None and view.dtype is DType.FLOAT32 and view.count == 1000
    assert view.ptr == g.buffers[plan.outputs[(blocks[4].id, "Out")]].ptr
    view.close()  # a view owns nothing: the buffer stays
    assert not g.buffers[plan.outputs[(blocks[4].id, "Out")]].is_closed
    assert g.output(blocks[5].id, "Out") is g.buffers[2]
    # a Cold rebuild of the same sharing lends every allocation: nothing new
    again = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool, previous=g)
    assert pool.driver_allocations == 3
    again.adopt(g)
    g.close()
    # a Warm resize writes the shared buffers' new byte counts
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xC000, 600, DType.FLOAT32))
    snap = ctx.snapshot()
    assert again.try_patch(compile_plan(snap), snap.bindings) == 6
    assert [b.count for b in again.buffers] == [2400, 2400, 600]
    again.close()


def test_realize_refuses_a_plan_larger_than_free_memory_before_allocating(rec) -> None:
    ctx, blocks = _recorded_chain(count=1000)
    pool = BufferPool()
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), pool)
    g.adopt(None)
    allocations = pool.driver_allocations
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xC000, 300_000_000, DType.FLOAT32))  # 1.2 GB per value
    rec.free = 1 << 30
    rec.calls.clear()
    with pytest.raises(CudaOutOfMemoryError, match="s5.Out") as err:
        realize_recorded(ctx, compile_plan(ctx.snapshot()), pool, previous=g)
    assert err.value.block == "s0" and "nothing was allocated" in str(err.value)
    assert pool.driver_allocations == allocations and rec.calls == []  # no node, no graph, no allocation
    g.launch(0)  # the running graph is as it was
    g.close()
