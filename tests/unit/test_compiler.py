"""The graph compiler: plans for chains, diamonds, fan-out, append buffers, and every validation error."""

from __future__ import annotations

import dataclasses

import pytest

from cudapatch import (
    AppendFilter,
    Block,
    BlockBuilder,
    DType,
    Fill,
    Scale,
    VectorAdd,
    bundled_kernel,
    like,
)
from cudapatch.engine import Context, ExternalBinding, KernelNodePlan, MemsetNodePlan
from cudapatch.engine.connections import Link
from cudapatch.errors import GraphCompileError

from .unfused import compile_plan  # one node per block: these tests are about unfused plans


def _ctx(*blocks: Block) -> Context:
    c = Context()
    for b in blocks:
        c.register_block(b)
    return c


def _bind(c: Context, block: Block, port: str, count: int = 1000, ptr: int = 0x7000_0000) -> None:
    c.bind_input(block, port, ExternalBinding(ptr, count, DType.FLOAT32))


def _node(plan, block: Block) -> KernelNodePlan:
    (ni,) = plan.block_nodes[block.id]
    node = plan.nodes[ni]
    assert isinstance(node, KernelNodePlan)
    return node


def test_chain() -> None:
    f, s1, s2 = Fill(name="f", Count=1000), Scale(name="s1", Factor=2.0), Scale(name="s2")
    c = _ctx(f, s1, s2)
    c.connect(f, "Out", s1, "In")
    c.connect(s1, "Out", s2, "In")
    plan = compile_plan(c.snapshot())
    assert plan.block_order == (f.id, s1.id, s2.id) and not plan.skipped and not plan.diagnostics
    nf, n1, n2 = _node(plan, f), _node(plan, s1), _node(plan, s2)
    assert (nf.deps, n1.deps, n2.deps) == ((), (nf.index,), (n1.index,))
    assert [b.count for b in plan.buffers] == [1000, 1000, 1000]
    assert nf.grid == 4 and nf.block == 256  # ceil(1000 / 256)
    # s1 reads f's output buffer and writes its own
    assert n1.args[0].kind == "buffer" and n1.args[0].ref == plan.outputs[(f.id, "Out")]
    assert n1.args[1].ref == plan.outputs[(s1.id, "Out")]
    assert n1.args[2].kind == "scalar" and n1.args[2].value == 2.0
    assert n1.args[4].kind == "const" and n1.args[4].value == 1000
    assert plan.scalar_slots[(s1.id, "Factor")] == ((n1.index, 2),)
    assert "fill" in plan.describe()


def test_diamond_and_fan_out() -> None:
    f = Fill(name="f", Count=300)
    left, right = Scale(name="left"), Scale(name="right")
    add = VectorAdd(name="add")
    c = _ctx(add, right, left, f)  # registration order is not topological order
    c.connect(f, "Out", left, "In")
    c.connect(f, "Out", right, "In")
    c.connect(left, "Out", add, "A")
    c.connect(right, "Out", add, "B")
    plan = compile_plan(c.snapshot())
    order = plan.block_order
    assert order.index(f.id) < order.index(left.id) < order.index(add.id)
    assert order.index(right.id) < order.index(add.id)
    assert order.index(right.id) < order.index(left.id)  # ties follow registration order
    assert set(_node(plan, add).deps) == {_node(plan, left).index, _node(plan, right).index}
    assert _node(plan, left).deps == _node(plan, right).deps == (_node(plan, f).index,)
    assert plan.buffers[plan.outputs[(add.id, "Sum")]].count == 300


def test_append_buffers_get_one_memset_node_first() -> None:
    f = Fill(name="f", Count=5000)
    a1 = AppendFilter(name="a1", Capacity=64)
    a2 = AppendFilter(name="a2", Capacity=128)
    c = _ctx(f, a1, a2)
    c.connect(f, "Out", a1, "In")
    c.connect(f, "Out", a2, "In")
    plan = compile_plan(c.snapshot())
    memset = plan.nodes[0]
    assert isinstance(memset, MemsetNodePlan) and memset.count == 2
    assert plan.counters == ((a1.id, "Kept"), (a2.id, "Kept"))
    n1, n2 = _node(plan, a1), _node(plan, a2)
    assert 0 in n1.deps and 0 in n2.deps and _node(plan, f).index in n1.deps
    assert n1.args[2].kind == "counter" and n1.args[2].ref == 0 and n2.args[2].ref == 1
    assert n1.args[5].value == 64  # capacity parameter filled from the Capacity scalar
    bi, ci = plan.appends[(a2.id, "Kept")]
    assert plan.buffers[bi].count == 128 and plan.buffers[bi].append and ci == 1
    assert plan.scalar_slots[(a1.id, "Threshold")] == ((n1.index, 3),)  # indices shifted past the memset


def test_unlinked_required_input_skips_block_and_dependents() -> None:
    s1, s2, f, s3 = Scale(name="s1"), Scale(name="s2"), Fill(name="f"), Scale(name="s3")
    c = _ctx(s1, s2, f, s3)
    c.connect(s1, "Out", s2, "In")
    c.connect(f, "Out", s3, "In")
    plan = compile_plan(c.snapshot())
    assert plan.skipped == (s1.id, s2.id) and plan.block_order == (f.id, s3.id)
    msgs = {d.block_id: d.message for d in plan.diagnostics}
    assert "required input 'In' is not linked" in msgs[s1.id]
    assert "comes from 's1', which is not running" in msgs[s2.id]
    codes = {d.block_id: d.code for d in plan.diagnostics}
    assert codes == {s1.id: "input-unlinked", s2.id: "input-not-running"}
    assert all(d.severity == "warning" for d in plan.diagnostics)


def test_external_binding_sizes_and_slots() -> None:
    add = VectorAdd(name="add")
    c = _ctx(add)
    _bind(c, add, "A", 777, 0x1000)
    _bind(c, add, "B", 777, 0x2000)
    plan = compile_plan(c.snapshot())
    n = _node(plan, add)
    assert n.args[0].kind == "external" and n.args[0].ref == (add.id, "A")
    assert plan.binding_slots[(add.id, "A")] == ((n.index, 0),) and plan.binding_counts[(add.id, "B")] == 777
    assert plan.buffers[0].count == 777 and n.grid == 4


class OptionalAdd(Block):
    """``Scaled = A * F`` and ``Out = A + B`` with B optional: two kernels that both only read A."""

    type_name = "OptionalAdd"

    def describe(self, b: BlockBuilder) -> None:
        pre = b.add_kernel(bundled_kernel("scale"))
        add = b.add_kernel(bundled_kernel("vector_add"))
        b.input("A", pre.in_(0), add.in_(0))
        b.input("B", add.in_(1), required=False)
        b.scalar("F", pre.in_(2), default=2.0)
        b.scalar("O", pre.in_(3), default=0.0)
        b.output("Scaled", pre.out(1), size=like("A"))
        b.output("Out", add.out(2), size=like("A"))
        pre.auto_grid(like("A"), count_param=4)
        add.auto_grid(like("A"), count_param=3)


class TwoStage(Block):
    """scale -> scale inside one block, through an internal buffer."""

    type_name = "TwoStage"

    def describe(self, b: BlockBuilder) -> None:
        k1 = b.add_kernel(bundled_kernel("scale"))
        k2 = b.add_kernel(bundled_kernel("scale"))
        b.input("In", k1.in_(0))
        b.connect(k1.out(1), k2.in_(0), size=like("In"))
        b.output("Out", k2.out(1), size=like("In"))
        b.scalar("Factor", k1.in_(2), k2.in_(2), default=2.0)
        b.scalar("O1", k1.in_(3), default=0.0)
        b.scalar("O2", k2.in_(3), default=0.0)
        k1.auto_grid(like("In"), count_param=4)
        k2.auto_grid(like("In"), count_param=4)


def test_optional_input_is_null_pointer_with_count_zero() -> None:
    blk = OptionalAdd(name="opt")
    c = _ctx(blk)
    _bind(c, blk, "A", 64)
    plan = compile_plan(c.snapshot())
    pre, add = (plan.nodes[i] for i in plan.block_nodes[blk.id])
    assert add.args[1].kind == "null" and add.args[0].kind == "external"
    assert add.deps == ()  # pre reads A, add reads A: no hazard between them
    assert pre.grid == 1 and plan.buffers[plan.outputs[(blk.id, "Out")]].count == 64


def test_internal_link_orders_kernels_and_shares_scalar() -> None:
    blk = TwoStage(name="two")
    c = _ctx(blk)
    _bind(c, blk, "In", 512)
    plan = compile_plan(c.snapshot())
    k1, k2 = (plan.nodes[i] for i in plan.block_nodes[blk.id])
    assert k2.deps == (k1.index,) and k1.args[1].ref == k2.args[0].ref
    assert [b.label for b in plan.buffers] == ["Out", "internal0"]
    assert plan.scalar_slots[(blk.id, "Factor")] == ((k1.index, 2), (k2.index, 2))


def test_write_after_read_hazard_on_shared_external_buffer() -> None:
    # two blocks read the same external buffer; nothing writes it, so they run in parallel
    s1, s2 = Scale(name="s1"), Scale(name="s2")
    c = _ctx(s1, s2)
    _bind(c, s1, "In", 100, 0x1000)
    _bind(c, s2, "In", 100, 0x1000)
    plan = compile_plan(c.snapshot())
    assert _node(plan, s1).deps == () and _node(plan, s2).deps == ()


def test_structural_parameter_sizes() -> None:
    f = Fill(name="f", Count=10)
    c = _ctx(f)
    assert compile_plan(c.snapshot()).buffers[0].count == 10
    f.set("Count", 4096)
    plan = compile_plan(c.snapshot())
    assert plan.buffers[0].count == 4096 and plan.nodes[0].grid == 16


def _snapshot_with(c: Context, **changes):
    return dataclasses.replace(c.snapshot(), **changes)


def test_validation_errors_name_blocks_and_ports() -> None:
    f, s = Fill(name="f"), Scale(name="s")
    c = _ctx(f, s)
    c.connect(f, "Out", s, "In")
    snap = c.snapshot()
    # unknown ports (a description changed under a link, or a hand-edited patch)
    bad = _snapshot_with(c, links=(Link(f.id, "Nope", s.id, "In"), Link(f.id, "Out", s.id, "Missing")))
    with pytest.raises(GraphCompileError) as info:
        compile_plan(bad)
    codes = [(d.block_id, d.code) for d in info.value.diagnostics]
    assert codes == [(f.id, "unknown-port"), (s.id, "unknown-port")]
    assert "has no output port 'Nope'" in str(info.value) and "no input port 'Missing'" in str(info.value)
    # a cycle
    cyc = _snapshot_with(c, links=snap.links + (Link(s.id, "Out", f.id, "In"),))
    with pytest.raises(GraphCompileError):
        compile_plan(cyc)  # Fill has no input 'In': unknown port first
    s2 = Scale(name="s2")
    c.register_block(s2)
    c.connect(s, "Out", s2, "In")
    cyc = _snapshot_with(c, links=tuple(c.connections) + (Link(s2.id, "Out", s.id, "In"),))
    cyc = dataclasses.replace(cyc, links=tuple(lk for lk in cyc.links if lk.src != f.id))
    with pytest.raises(GraphCompileError, match="cycle") as info:
        compile_plan(cyc)
    assert {d.block_id for d in info.value.diagnostics if d.code == "cycle"} == {s.id, s2.id}
    # a link to a block of another engine
    stranger = Link(99_999, "Out", s.id, "In")
    with pytest.raises(GraphCompileError, match="not part of this engine"):
        compile_plan(_snapshot_with(c, links=(stranger,)))
    foreign = dataclasses.replace(snap.blocks[0], context_id=-1)
    with pytest.raises(GraphCompileError, match="belongs to another engine"):
        compile_plan(_snapshot_with(c, blocks=(foreign,) + snap.blocks[1:], links=()))


def test_type_mismatch_after_a_block_changes_its_description() -> None:
    class Morph(Block):
        type_name = "Morph"
        as_int = False

        def describe(self, b: BlockBuilder) -> None:
            if self.as_int:
                k = b.add_kernel(bundled_kernel("append_filter"))
                b.input("In", k.in_(0))
                b.scalar("Cap", dtype=DType.UINT32, default=8)
                b.output("Out", k.out(2), size=1)  # a uint* pin: the output becomes uint
                b.output("Data", k.out(1), size=8)
                b.scalar("T", k.in_(3), default=0.0)
                k.auto_grid(like("In"), count_param=4)
                k.set_count(5, 8)
            else:
                k = b.add_kernel(bundled_kernel("scale"))
                b.input("In", k.in_(0))
                b.output("Out", k.out(1), size=like("In"))
                b.scalar("F", k.in_(2), default=1.0)
                b.scalar("O", k.in_(3), default=0.0)
                k.auto_grid(like("In"), count_param=4)

    f, m, s = Fill(name="f"), Morph(name="m"), Scale(name="s")
    c = _ctx(f, m, s)
    c.connect(f, "Out", m, "In")
    c.connect(m, "Out", s, "In")
    compile_plan(c.snapshot())
    m.as_int = True
    assert m.refresh()
    with pytest.raises(GraphCompileError, match=r"m.Out \(uint\) -> s.In \(float\): element types differ") as info:
        compile_plan(c.snapshot())
    assert info.value.diagnostics[0].block_id == s.id and info.value.diagnostics[0].code == "type-mismatch"
