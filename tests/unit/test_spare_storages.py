"""Spare parameter storages without a GPU: a build after a closed (or retired and idle) graph loads
that graph's storages instead of making new ones, and the driver is handed the same bytes and launch
configuration a build with new storages hands it; a storage the running graph uses is never a spare,
and a failed build gives back what it took. The recording driver stands in for the ``cu*`` functions."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import DType, Scale
from cudapatch.engine import Context, ExternalBinding, compile_plan
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.nodes import KernelNode, arg_value
from cudapatch.engine.params import _layout, pack_arguments
from cudapatch.errors import CudapatchError, KernelLoadError

from .recording_driver import realize_recorded


@pytest.fixture
def spares():
    """Scale's spare storages, none before or after the test (they are kept for the whole process)."""
    ctx = Context()
    s = ctx.register_block(Scale(name="probe"))
    ctx.bind_input(s, "In", ExternalBinding(0xA000, 8, DType.FLOAT32))
    (node,) = compile_plan(ctx.snapshot(), fuse=False).kernel_nodes
    kept = _layout(node.descriptor).spares
    kept.clear()
    yield kept
    kept.clear()


def _chain(n: int, rng: np.random.Generator) -> tuple[Context, list[Scale]]:
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=float(rng.standard_normal()))) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 1000, DType.FLOAT32))
    return ctx, blocks


def _kernel_nodes(g) -> list[KernelNode]:
    return [n for n in g._nodes if type(n) is KernelNode]


def _loaded_as_planned(g, ctx: Context) -> None:
    """Every kernel node's storage holds what its plan says, as a new storage would, and its struct
    the function and launch configuration: what the driver read when the node was added."""
    bindings = ctx.snapshot().bindings
    for n in _kernel_nodes(g):
        values = [arg_value(a, g.buffers, bindings, 0) for a in n.plan.args]
        raw = pack_arguments(n.plan, values)
        assert bytes(n.store.storage) == raw, n.plan.block_id
        kp = n.store.params
        assert (int(kp.func), kp.gridDimX, kp.blockDimX, kp.sharedMemBytes) == (
            100 + n.plan.block_id,
            n.plan.grid,
            n.plan.block,
            n.plan.shared_bytes,
        )
        assert (kp.gridDimY, kp.gridDimZ, kp.blockDimY, kp.blockDimZ) == n.plan.yz


def test_a_build_after_a_retired_idle_graph_loads_its_storages(rec, spares) -> None:
    rng = np.random.default_rng()
    ctx, blocks = _chain(6, rng)
    pool = BufferPool()
    g1 = realize_recorded(ctx, compile_plan(ctx.snapshot(), fuse=False), pool, lend_stores=False)
    g1.adopt(None)
    first = {id(n.store) for n in _kernel_nodes(g1)}
    for n in _kernel_nodes(g1):  # what the running graph's Hot patches and specialisations leave
        n.store.storage[0:8] = bytes(range(8))
        n.store.params.func = 999
    # An edit: another Factor, another count, one more block.
    blocks[2].set("Factor", float(rng.standard_normal()))
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 3000, DType.FLOAT32))
    tail = ctx.register_block(Scale(name="tail", Factor=float(rng.standard_normal())))
    ctx.connect(blocks[-1], "Out", tail, "In")
    with pytest.raises(Exception, match="still runs"):
        g1.give_back_stores()  # never while it runs
    g1.update_scalars({(blocks[1].id, "Factor"): 0.5})  # (its one-change lookup is made: the fast path)
    g1.retire(0)
    g1.give_back_stores()
    assert len(spares) == 6
    g2 = realize_recorded(ctx, compile_plan(ctx.snapshot(), fuse=False), pool, previous=g1, lend_stores=False)
    g2.adopt(g1)
    assert sum(id(n.store) in first for n in _kernel_nodes(g2)) == 6 and not spares
    _loaded_as_planned(g2, ctx)
    for changes in ({(blocks[1].id, "Factor"): 123.0}, {(blocks[1].id, "Factor"): 1.0, (blocks[3].id, "Factor"): 2.0}):
        with pytest.raises(CudapatchError, match="replaced"):  # the old graph must not write g2's storages
            g1.update_scalars(changes)
    with pytest.raises(CudapatchError, match="replaced"):
        g1.node_arg(0, 2)
    _loaded_as_planned(g2, ctx)
    g1.close()  # its storages are g2's now: none come back
    assert not spares
    g2.retire(0)
    g2.close()
    assert len(spares) == 7 and all(s.owner == 0 for s in spares)


def test_a_failed_build_gives_back_the_spares_it_took_and_the_running_graph_keeps_its_own(rec, spares) -> None:
    ctx, blocks = _chain(4, np.random.default_rng())
    pool = BufferPool()
    g1 = realize_recorded(ctx, compile_plan(ctx.snapshot(), fuse=False), pool, lend_stores=False)
    g1.adopt(None)
    g1.retire(0)
    g1.close()
    assert len(spares) == 4
    running = realize_recorded(ctx, compile_plan(ctx.snapshot(), fuse=False), pool, lend_stores=False)
    running.adopt(None)
    assert not spares
    tail = ctx.register_block(Scale(name="tail"))
    ctx.connect(blocks[-1], "Out", tail, "In")
    snap = ctx.snapshot()
    functions = {(b.id, 0): 100 + b.id for b in snap.blocks if b.id != tail.id}  # its kernel never compiled
    g1.close()  # (closed twice: nothing more comes back)
    with pytest.raises(KernelLoadError):
        realize_recorded(ctx, compile_plan(snap, fuse=False), pool, previous=running, functions=functions)
    assert not spares  # it took none: the running graph lent it its own (a frame-thread build)
    for n in _kernel_nodes(running):  # and has them back as they were
        assert n.store.owner == running._parts.token
    _loaded_as_planned(running, ctx)
    ctx2, _ = _chain(3, np.random.default_rng())
    other = realize_recorded(ctx2, compile_plan(ctx2.snapshot(), fuse=False), pool, lend_stores=False)
    other.retire(0)
    other.close()
    assert len(spares) == 3
    with pytest.raises(KernelLoadError):  # a build off the frame thread takes the spares, fails, gives them back
        realize_recorded(
            ctx, compile_plan(snap, fuse=False), pool, previous=running, functions=functions, lend_stores=False
        )
    assert len(spares) == 4  # the 3 it took and the one it made before the tail's node failed
    running.retire(0)
    running.close()
    assert len(spares) == 4 + 4
