"""The Bypass decision without a GPU: which nodes turn off, which readers read the input instead, and
where a redirect would race (``engine/bypass.py``); the enabled flag's path from blocks and hosts."""

from __future__ import annotations

import pytest

from cudapatch import AppendFilter, CustomKernel, DType, Fill, Scale, VectorAdd, compile_plan
from cudapatch.blocks.library import FFT
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.bypass import NO_BYPASS, BypassIndex, plan_bypass
from cudapatch.host_plugin import PluginHost
from cudapatch.host_plugin.adapter import HostAdapter
from cudapatch.host_plugin.hosts.touchdesigner import BlockOperatorExt, TouchDesignerHost

from ..td_double import COMP
from .plan_engine import PlanOnlyEngine

#: Adds to its data where it lies: an in-place reader of whatever it is linked to.
BUMP = """\
extern "C" __global__ void bump(/*inout*/ float* data, float amount, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) data[i] += amount;
}
"""


def _ctx(*blocks) -> Context:
    c = Context()
    for b in blocks:
        c.register_block(b)
    return c


def _chain(c: Context, *blocks) -> None:
    for a, b in zip(blocks, blocks[1:], strict=False):
        c.connect(a, "Out", b, "In")


def _decide(c: Context, *bypassed):
    c.bypassed.update(b.id for b in bypassed)  # as the engine plans them: their values in buffers of their own
    plan = compile_plan(c.snapshot())
    return plan, plan_bypass(BypassIndex(plan), {b.id for b in bypassed})


def _reads(plan, block, arg: int = 0):
    (ni,) = plan.block_nodes[block.id]
    return (ni, arg)


def test_nothing_bypassed_is_no_bypass() -> None:
    f, s = Fill(name="f"), Scale(name="s")
    c = _ctx(f, s)
    _chain(c, f, s)
    assert _decide(c)[1] is NO_BYPASS and NO_BYPASS.empty
    assert _decide(c, Scale(name="elsewhere"))[1] is NO_BYPASS  # not in this plan


def test_a_bypassed_block_is_off_and_its_reader_reads_its_input() -> None:
    f, s, t = Fill(name="f", Count=100), Scale(name="s"), Scale(name="t")
    c = _ctx(f, s, t)
    _chain(c, f, s, t)
    plan, bp = _decide(c, s)
    assert bp.disabled == set(plan.block_nodes[s.id])
    fill_out, s_out = plan.outputs[(f.id, "Out")], plan.outputs[(s.id, "Out")]
    t_node = plan.nodes[plan.block_nodes[t.id][0]]
    (ai,) = [i for i, a in enumerate(t_node.args) if a.kind == "buffer" and a.ref == s_out]
    assert bp.redirects == {(t_node.index, ai): fill_out}
    assert bp.outputs == {(s.id, "Out"): fill_out} and not bp.refused


def test_a_chain_of_bypassed_blocks_resolves_to_the_first_input_that_runs() -> None:
    f, a, b, t = Fill(name="f"), Scale(name="a"), Scale(name="b"), Scale(name="t")
    c = _ctx(f, a, b, t)
    _chain(c, f, a, b, t)
    plan, bp = _decide(c, a, b)
    fill_out = plan.outputs[(f.id, "Out")]
    assert bp.disabled == set(plan.block_nodes[a.id] + plan.block_nodes[b.id])
    assert set(bp.redirects.values()) == {fill_out} and len(bp.redirects) == 1  # only t reads, a and b are off
    assert bp.outputs == {(a.id, "Out"): fill_out, (b.id, "Out"): fill_out}


def test_an_output_without_an_input_of_its_size_keeps_its_last_values() -> None:
    f, s = Fill(name="f", Count=64), Scale(name="s")
    add = VectorAdd(name="add")
    c = _ctx(f, s, add)
    _chain(c, f, s)
    c.connect(f, "Out", add, "A")
    c.connect(s, "Out", add, "B")
    plan, bp = _decide(c, f)  # Fill has no input: its readers read what it wrote last
    assert bp.disabled == set(plan.block_nodes[f.id]) and not bp.redirects and not bp.outputs


def test_a_bound_input_is_read_through_and_follows_a_warm_rebind_key() -> None:
    s, t = Scale(name="s"), Scale(name="t")
    c = _ctx(s, t)
    _chain(c, s, t)
    c.bind_input(s, "In", ExternalBinding(0x1000, 32, DType.FLOAT32))
    plan, bp = _decide(c, s)
    assert list(bp.redirects.values()) == [(s.id, "In")] and bp.outputs == {(s.id, "Out"): (s.id, "In")}


def test_another_count_or_type_is_no_input_of_the_same_size() -> None:
    f, g = Fill(name="f", Count=10), Fill(name="g", Count=20)
    add, t = VectorAdd(name="add"), Scale(name="t")
    c = _ctx(f, g, add, t)
    c.connect(f, "Out", add, "A")
    c.connect(g, "Out", add, "B")  # 20 elements: the sum has A's 10
    c.connect(add, "Sum", t, "In")
    plan, bp = _decide(c, add)
    assert bp.outputs == {(add.id, "Sum"): plan.outputs[(f.id, "Out")]}  # A matches, B does not


def test_an_in_place_reader_of_the_output_is_not_redirected() -> None:
    f, s = Fill(name="f", Count=100), Scale(name="s")
    bump = CustomKernel(name="bump", Code=BUMP)
    c = _ctx(f, s, bump)
    _chain(c, f, s)
    c.connect(s, "Out", bump, "data")  # would write into f's buffer, unordered with f's other readers
    plan, bp = _decide(c, s)
    assert bp.disabled == set(plan.block_nodes[s.id]) and not bp.redirects and not bp.outputs
    plan, bp = _decide(c, s, bump)  # with the writer off too, the redirect is safe again
    assert bp.outputs == {(s.id, "Out"): plan.outputs[(f.id, "Out")]}


def test_an_input_written_in_place_elsewhere_is_not_read_through() -> None:
    f, s, t = Fill(name="f", Count=100), Scale(name="s"), Scale(name="t")
    bump = CustomKernel(name="bump", Code=BUMP)
    c = _ctx(f, s, t, bump)
    _chain(c, f, s, t)
    c.connect(f, "Out", bump, "data")  # f's buffer is changed in place after s read it
    plan, bp = _decide(c, s)
    assert not bp.redirects and not bp.outputs


def test_an_append_output_keeps_its_last_values() -> None:
    f, keep, t = Fill(name="f", Count=100), AppendFilter(name="keep"), Scale(name="t")
    c = _ctx(f, keep, t)
    c.connect(f, "Out", keep, "In")
    port = next(p.name for p in keep.description.outputs if p.kind == "append")
    c.connect(keep, port, t, "In")
    plan, bp = _decide(c, keep)
    assert bp.disabled == set(plan.block_nodes[keep.id]) and not bp.redirects


def test_a_library_call_cannot_be_turned_off_and_keeps_running() -> None:
    fft = FFT(name="fft", Nx=8)
    c = _ctx(fft)
    c.bind_input(fft, "In", ExternalBinding(0x2000, 16, fft.description.input("In").dtype))
    plan, bp = _decide(c, fft)
    assert bp.refused.keys() == {fft.id} and "child-graph" in bp.refused[fft.id] and not bp.disabled


def test_the_enabled_flag_reaches_the_context_and_is_kept_on_registration() -> None:
    s = Scale(name="s")
    assert s.enabled and "bypassed" not in s.tooltip()
    s.enabled = False  # not registered: only the flag
    c = _ctx(s)
    assert c.bypassed == {s.id}
    c.dirty.clear_structure()
    s.enabled = False  # unchanged: nothing marked
    assert not c.dirty.any
    s.enabled = True
    assert c.bypassed == set() and c.dirty.bypass and c.dirty.any and c.dirty.only_params
    assert c.dirty.tier == "params"
    s.enabled = False
    assert "(bypassed)" in s.tooltip()
    c.unregister_block(s)
    assert c.bypassed == set()


def test_hosts_bypass_through_the_adapter() -> None:
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, PluginHost().registry)
    b = adapter.create("s", "core.Scale")
    adapter.set_bypass("s", True)
    assert not b.enabled and adapter.bypassed("s") and engine.context.bypassed == {b.id}
    adapter.set_bypass("s", False)
    assert b.enabled and not adapter.bypassed("s")
    with pytest.raises(Exception, match="unknown operator"):
        adapter.set_bypass("nope", True)


def test_touchdesigner_bypass_flag_goes_to_the_block() -> None:
    td = TouchDesignerHost(engine=PlanOnlyEngine(), plugins=PluginHost())
    comp = COMP("/p/scale")
    comp.bypass = True
    ext = BlockOperatorExt(comp, td, "core.Scale")
    assert not ext.block.enabled  # created bypassed
    comp.bypass = False
    ext.OnFlagChange("bypass")
    assert ext.block.enabled
    comp.bypass = True
    ext.OnFlagChange("display")  # another flag: nothing
    assert ext.block.enabled
    ext.OnFlagChange("bypass")
    assert not ext.block.enabled


def test_a_block_inside_a_child_graph_is_not_turned_off_and_no_executable_takes_such_a_plan() -> None:
    from cudapatch.engine.warm import same_topology
    from tests.unit.composite_blocks import TwoScales

    c = Context()
    pair = c.register_block(TwoScales(name="pair", child_graph=True))
    tail = c.register_block(Scale(name="tail"))
    c.connect(pair, "Out", tail, "In")
    c.bind_input(pair, "In", ExternalBinding(0xA000, 1000, DType.FLOAT32))
    plan = compile_plan(c.snapshot())
    assert plan.children
    a = pair.inner("a")
    bp = plan_bypass(BypassIndex(plan), {a.id, tail.id})
    assert "child graph" in bp.refused[a.id] and bp.disabled == set(plan.block_nodes[tail.id])
    assert not same_topology(plan, plan)
