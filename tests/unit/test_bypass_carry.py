"""A bypass whose block shares its buffers with others (buffer reuse) is carried until the rebuild that
pins them lands (``bypass.Carry``): its one kernel node runs the copy kernel from its input into its own
output, in place of its own code, with the pointers its arguments hold whenever it goes to the driver
(Hot and Warm updates of the node in between included), and its own kernel again when it runs again.
Without a GPU: the decision, and what the recording driver is handed."""

from __future__ import annotations

import ctypes
import random

import pytest

from cudapatch import DType, Fill, Scale, VectorAdd
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.bypass import BypassIndex, Carry
from cudapatch.engine.memory_plan import shares_with_others
from cudapatch.engine.nodes import KernelNode
from cudapatch.engine.warm import WarmPatch, decide_warm_patch

from .recording_driver import realize_recorded
from .unfused import compile_plan

#: Stand-ins for the loaded copy kernels (``DeviceResources.copy_kernels``).
COPIES = {"delay_copy4": 7004, "delay_copy1": 7001}


def _scale_chain(n: int, count: int = 1000) -> tuple[Context, list[Scale]]:
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=1.0 + i)) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, count, DType.FLOAT32))
    return ctx, blocks


def test_a_block_sharing_its_buffers_is_carried_by_a_copy_of_its_input_while_it_waits_for_its_rebuild() -> None:
    ctx, blocks = _scale_chain(6)
    plan = compile_plan(ctx.snapshot())  # buffer reuse: the values take turns in two buffers
    s3 = blocks[3]
    assert shares_with_others(plan, {s3.id})
    index = BypassIndex(plan)
    shared, bp = index.decide({s3.id})
    assert shared == {s3.id} and bp.empty  # without the copy kernels: it keeps running until its rebuild
    shared, bp = index.decide({s3.id}, carry=True)
    (node,) = plan.block_nodes[s3.id]
    args = plan.nodes[node].args
    assert shared == {s3.id} and not (bp.disabled or bp.redirects) and set(bp.carried) == {node}
    c = bp.carried[node]
    assert args[c.src].ref == plan.outputs[(blocks[2].id, "Out")] and args[c.dst].ref == plan.outputs[(s3.id, "Out")]
    assert (c.entry, c.count) == ("delay_copy4", 1000)  # 4-byte words
    assert index.decide({s3.id}, carry=True)[1] is bp  # made once per set


def test_the_first_block_is_carried_from_its_binding() -> None:
    ctx, blocks = _scale_chain(4, count=1001)
    plan = compile_plan(ctx.snapshot())
    s0 = blocks[0]
    assert shares_with_others(plan, {s0.id})
    _, bp = BypassIndex(plan).decide({s0.id}, carry=True)
    ((node, c),) = bp.carried.items()
    assert plan.nodes[node].args[c.src].ref == (s0.id, "In") and (c.entry, c.count) == ("delay_copy4", 1001)


def test_what_cannot_be_carried_waits_for_its_rebuild() -> None:
    # Fill has no input; VectorAdd's inputs have other counts than its sum here (B is longer).
    ctx = Context()
    f = ctx.register_block(Fill(name="f", Count=64))
    g = ctx.register_block(Fill(name="g", Count=128))
    add = ctx.register_block(VectorAdd(name="add"))
    chain = [ctx.register_block(Scale(name=f"t{i}")) for i in range(4)]
    ctx.connect(f, "Out", chain[0], "In")
    for a, b in zip(chain, chain[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.connect(chain[-1], "Out", add, "A")
    ctx.connect(g, "Out", add, "B")
    plan = compile_plan(ctx.snapshot())
    index = BypassIndex(plan)
    for block in (f, g):
        shared, bp = index.decide({block.id}, carry=True)
        assert not bp.carried  # no input to copy (shared or not, it is not carried)
    ctx2, blocks = _scale_chain(5)
    plan2 = compile_plan(ctx2.snapshot(), fuse=True)  # one fused kernel: no node of the block's own
    _, bp = BypassIndex(plan2).decide({blocks[2].id}, carry=True)
    assert not bp.carried


def _kernel_params(kp) -> tuple[int, ...]:
    """The copy launch's three arguments as the driver would read them."""
    ptrs = (ctypes.c_void_p * 3).from_address(int(kp.kernelParams))
    return (
        ctypes.c_uint64.from_address(ptrs[0]).value,
        ctypes.c_uint64.from_address(ptrs[1]).value,
        ctypes.c_uint32.from_address(ptrs[2]).value,
    )


@pytest.fixture
def sent(rec, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, tuple[int, ...] | None]]:
    """``(node handle, function, copy arguments or None)`` of every node given to the executable."""
    out: list[tuple[int, int, tuple[int, ...] | None]] = []
    plain = rec.cuGraphExecKernelNodeSetParams

    def record(exec_, node, kp):  # noqa: ANN001
        fn = int(kp.func)
        out.append((node, fn, _kernel_params(kp) if fn in COPIES.values() else None))
        return plain(exec_, node, kp)

    monkeypatch.setattr(rec, "cuGraphExecKernelNodeSetParams", record)
    return out


def test_a_carried_node_copies_with_the_pointers_it_holds_through_hot_and_warm_updates(rec, sent) -> None:
    ctx, blocks = _scale_chain(6)
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), BufferPool())
    g.adopt(None)
    s3 = blocks[3]
    (node,) = g.plan.block_nodes[s3.id]
    kn = g._nodes[node]
    assert isinstance(kn, KernelNode)
    _, bp = BypassIndex(g.plan).decide({s3.id}, carry=True)
    c = bp.carried[node]

    def copy_sent() -> tuple[int, ...]:
        return (kn.slots[c.src].value, kn.slots[c.dst].value, c.count)

    g.set_bypass(bp, COPIES)
    assert sent == [(kn.handle, COPIES["delay_copy4"], copy_sent())]
    sent.clear()
    g.update_scalar(s3.id, "Factor", 9.0)  # the slider of a carried block: kept for when it runs again
    assert sent == [(kn.handle, COPIES["delay_copy4"], copy_sent())]
    sent.clear()
    g.update_scalars({(s3.id, "Factor"): 10.0, (blocks[4].id, "Factor"): 2.0})  # (the several-changes path)
    assert (kn.handle, COPIES["delay_copy4"], copy_sent()) in sent and len(sent) == 2
    # A Warm growth moves the buffers: the copy goes with them.
    before = copy_sent()
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 4000, DType.FLOAT32))
    snap = ctx.snapshot()
    new = compile_plan(snap)
    d = decide_warm_patch(g.plan, new, snap.bindings, capacities=[b.capacity_bytes for b in g.buffers])
    assert isinstance(d, WarmPatch)
    sent.clear()
    assert g.try_patch(new, snap.bindings, decided=d) is not None
    mine = [s for s in sent if s[0] == kn.handle]
    assert mine == [(kn.handle, COPIES["delay_copy4"], copy_sent())] and copy_sent()[:2] != before[:2]
    # Running again: its own kernel, with the slider's last value.
    _, back = BypassIndex(g.plan).decide(set(), carry=True)
    sent.clear()
    g.set_bypass(back, COPIES)
    assert sent == [(kn.handle, 100 + s3.id, None)] and kn.carrier is None


@pytest.mark.parametrize("seed", range(6))
def test_carried_redirected_and_disabled_nodes_follow_random_bypass_sets(rec, sent, seed: int) -> None:
    rng = random.Random(seed)
    ctx, blocks = _scale_chain(rng.randint(4, 9))
    ids = [b.id for b in blocks]
    ctx.bypassed.update(rng.sample(ids, 2))  # planned as bypassed: values of their own (turned off, read through)
    g = realize_recorded(ctx, compile_plan(ctx.snapshot()), BufferPool())
    g.adopt(None)
    index = BypassIndex(g.plan)
    sets = [frozenset(rng.sample(ids, rng.randint(0, 3))) for _ in range(4)]
    carried: dict[int, int] = {}  # node handle -> the function it runs now, as the driver was told
    for step in range(25):
        _, bp = index.decide(rng.choice(sets), carry=True)
        sent.clear()
        g.set_bypass(bp, COPIES)
        for handle, fn, _ in sent:
            carried[handle] = fn
        for ni, kn in enumerate(g._nodes):
            if not isinstance(kn, KernelNode):
                continue
            c: Carry | None = bp.carried.get(ni)
            if c is not None:
                assert carried[kn.handle] == COPIES[c.entry], f"step {step}: node {ni} is not carried"
                want = (kn.slots[c.src].value, kn.slots[c.dst].value, c.count)
                last = [s for s in sent if s[0] == kn.handle]
                assert not last or last[-1][2] == want
            elif kn.handle in carried:
                assert carried[kn.handle] == 100 + kn.plan.block_id, f"step {step}: node {ni} still copies"
        assert len({s[0] for s in sent}) == len(sent), "a node went to the driver twice in one step"
    g.close()
