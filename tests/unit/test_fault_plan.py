"""Plans with a block that faulted on the GPU: no kernels, zero-filled outputs, dependents warned."""

from __future__ import annotations

from cudapatch import Fill, Scale, compile_plan
from cudapatch.engine import Context, KernelNodePlan, MemsetNodePlan


def test_a_faulted_block_is_replaced_by_zero_fills_and_its_dependents_are_warned():
    c = Context()
    fill, bad, after = (c.register_block(b) for b in (Fill(name="fill"), Scale(name="bad"), Scale(name="after")))
    c.connect(fill, "Out", bad, "In")
    c.connect(bad, "Out", after, "In")
    plan = compile_plan(c.snapshot(), faulted={bad.id: "illegal address"})
    kernels = [n for n in plan.nodes if isinstance(n, KernelNodePlan)]
    assert {n.block_id for n in kernels} == {fill.id, after.id}
    (zero,) = [n for n in plan.nodes if isinstance(n, MemsetNodePlan) and n.buffer is not None]
    out = plan.outputs[(bad.id, "Out")]
    assert zero.buffer == out and plan.buffers[out].count == 1024
    (reader,) = plan.block_nodes[after.id]
    assert zero.index in plan.nodes[reader].deps  # the reader runs after the zero fill
    assert bad.id in plan.block_order and after.id in plan.block_order  # still running, reading zeros
    (warn,) = [d for d in plan.diagnostics if d.code == "input-faulted"]
    assert warn.block_id == after.id and "'bad' faulted" in warn.message
    assert "zero buffer" in plan.describe()
