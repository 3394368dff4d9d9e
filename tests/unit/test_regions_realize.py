"""Realizing regions against the recording stand-in for the driver (no GPU): a conditional node per
region with its handle made on the top-level graph, body nodes added to the node's body graph,
set-condition kernels getting the handle's value, Hot updates of body nodes, and the fallback
through ``cuGraphExecUpdate`` when the driver refuses to patch a body node in the executable."""

from __future__ import annotations

from typing import Any

import pytest
from cuda.bindings import driver as real

from cudapatch import CustomKernel, Fill, For, Scale, While, compile_plan
from cudapatch.engine import Context, realize
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.plan import ConditionalNodePlan, KernelNodePlan

from .recording_driver import OK, RegionDriver, StubDevice, install, realize_regions

CHECK = """extern "C" __global__ void check(const float* in, int* more, float level, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = in[0] > level; }"""


def _while_patch() -> tuple[Context, While, Scale, CustomKernel]:
    c = Context()
    src = c.register_block(Fill(name="Src", Count=256))
    w = c.register_block(While(name="Solve", Max=50))
    step = c.register_block(Scale(name="Step", Factor=0.5))
    chk = c.register_block(CustomKernel(name="Check", Code=CHECK))
    c.place(step, w)
    c.place(chk, w)
    c.connect(src, "Out", step, "In")
    c.connect(step, "Out", chk, "in")
    c.connect(chk, "more", w, "Condition")
    return c, w, step, chk


def test_a_region_becomes_a_conditional_node_with_its_body_in_the_body_graph(monkeypatch) -> None:
    rec = install(monkeypatch, RegionDriver())
    ctx, w, step, chk = _while_patch()
    plan = compile_plan(ctx.snapshot())
    g = realize_regions(ctx, plan, BufferPool())
    (handle_call,) = [c for c in rec.calls if c[0] == "handle"]
    assert str(handle_call[1]) == str(rec.root)  # the handle belongs to the top-level graph
    (cond_call,) = [c for c in rec.calls if c[0] == "add_conditional"]
    assert cond_call[5] == real.CUgraphConditionalNodeType.CU_GRAPH_COND_TYPE_WHILE and cond_call[6] == 1
    handle_value = cond_call[4]
    assert handle_value >= 7000 and handle_call[2:] == (0, 0)  # no default: set every launch
    kernels = [c for c in rec.calls if c[0] == "add_kernel"]
    in_body = {c[1] for c in kernels if c[1] in rec.body_nodes}
    cond = next(n for n in plan.nodes if isinstance(n, ConditionalNodePlan))
    body_plan = [i for i, p in plan.scopes.items() if p == cond.index]
    assert len(in_body) == len(body_plan) == 3  # Step, Check and the step kernel
    # The set-condition kernels carry the conditional handle's value in their first argument.
    for n in plan.nodes:
        if isinstance(n, KernelNodePlan) and n.block_id == w.id:
            assert g.node_arg(n.index, 0) == handle_value
    g.close()


def test_hot_updates_of_body_nodes_patch_the_executable(monkeypatch) -> None:
    rec = install(monkeypatch, RegionDriver())
    ctx, w, step, chk = _while_patch()
    plan = compile_plan(ctx.snapshot())
    g = realize_regions(ctx, plan, BufferPool())
    rec.calls.clear()
    assert g.update_scalars({(step.id, "Factor"): 0.25, (w.id, "Max"): 9}) == 3  # Step, begin, step kernel
    assert [c[0] for c in rec.calls] == ["set_params"] * 3
    (slot,) = plan.scalar_slots[(step.id, "Factor")]
    assert g.node_arg(*slot) == 0.25
    assert all(g.node_arg(*s) == 9 for s in plan.scalar_slots[(w.id, "Max")])
    g.close()


def test_a_refused_body_update_goes_through_the_template_and_one_exec_update(monkeypatch) -> None:
    rec = install(monkeypatch, RegionDriver(refuse_body_updates=True))
    ctx, w, step, chk = _while_patch()
    plan = compile_plan(ctx.snapshot())
    g = realize_regions(ctx, plan, BufferPool())
    kernel_nodes = len(plan.kernel_nodes)
    rec.calls.clear()
    g.update_scalars({(step.id, "Factor"): 0.25})
    names = [c[0] for c in rec.calls]
    assert names[0] == "set_params_refused" and names[-1] == "exec_update"
    # every kernel node's current values go to the template first, so the update reverts nothing
    assert names.count("template_params") == kernel_nodes + 1
    rec.calls.clear()
    g.update_scalars({(step.id, "Offset"): 1.0})  # from now on: straight to the template
    assert [c[0] for c in rec.calls] == ["set_params_refused", "template_params", "exec_update"]
    g.close()


@pytest.mark.parametrize("unroll", [1, 3])
@pytest.mark.parametrize("count", [0, 5])
def test_a_for_body_with_a_faulted_block_gets_its_memset_in_the_body(monkeypatch, count: int, unroll: int) -> None:
    rec = install(monkeypatch, RegionDriver())
    rec.memsets: list[Any] = []
    orig = rec.cuGraphAddMemsetNode

    def memset(graph, deps, n, mp, ctx):  # noqa: ANN001
        rec.memsets.append(graph)
        return orig(graph, deps, n, mp, ctx)

    rec.cuGraphAddMemsetNode = memset  # type: ignore[method-assign]
    c = Context()
    src = c.register_block(Fill(name="Src", Count=64))
    loop = c.register_block(For(name="Loop", Count=count, Unroll=unroll))
    a = c.register_block(Scale(name="A"))
    c.place(a, loop)
    c.connect(src, "Out", a, "In")
    plan = compile_plan(c.snapshot(), faulted={a.id: "illegal address"})
    g = realize_regions(c, plan, BufferPool())
    # the counters' memset at the top, A's zero-fill in the body: in each copy (unrolled: U and the tail's)
    assert len(rec.memsets) == 1 + (1 if unroll == 1 else unroll + 1)
    assert str(rec.memsets[0]) == str(rec.root) and all(str(m) != str(rec.root) for m in rec.memsets[1:])
    g.close()


def test_set_condition_kernels_are_left_out_of_occupancy(monkeypatch) -> None:
    rec = install(monkeypatch, RegionDriver())
    rec.cuOccupancyMaxActiveBlocksPerMultiprocessor = lambda fn, block, shared: (OK, 8)  # type: ignore[attr-defined]
    ctx, w, step, chk = _while_patch()
    plan = compile_plan(ctx.snapshot())
    snap = ctx.snapshot()
    functions = {(n.block_id, n.kernel): 1 for n in plan.nodes if isinstance(n, KernelNodePlan)}
    g = realize(
        plan,
        device=StubDevice(),
        pool=BufferPool(),
        bindings=snap.bindings,
        functions=functions,
        occupancy=True,
        publish_function=3,
    )  # type: ignore[arg-type]
    # the region's kernels are no kernel of a block's description: occupancy warnings could not name them
    assert {(step.id, 0), (chk.id, 0)} <= set(g.occupancy) and all(bid != w.id for bid, _ in g.occupancy)
    g.close()


def test_every_tier_patches_every_copy_of_an_unrolled_body(monkeypatch) -> None:
    """Hot (scalars), Code (a swapped function) and Warm (a rebound pointer) reach each of the U copies
    in the main body and the tail's copy; each conditional node gets a handle of its own."""
    from cudapatch.engine.bindings import ExternalBinding
    from cudapatch.kernels.types import DType

    rec = install(monkeypatch, RegionDriver())
    c = Context()
    loop = c.register_block(For(name="Loop", Count=10, Unroll=3))
    step = c.register_block(Scale(name="Step", Factor=0.5))
    c.place(step, loop)
    c.bind_input(step, "In", ExternalBinding(0x7100_0000, 256, DType.FLOAT32))
    plan = compile_plan(c.snapshot())
    g = realize_regions(c, plan, BufferPool())
    handles = [call for call in rec.calls if call[0] == "handle"]
    conds = [call for call in rec.calls if call[0] == "add_conditional"]
    assert len(handles) == len(conds) == 2 and len({call[4] for call in conds}) == 2
    copies = [n.index for n in plan.nodes if isinstance(n, KernelNodePlan) and n.block_id == step.id]
    assert len(copies) == 4
    rec.calls.clear()
    assert g.update_scalars({(step.id, "Factor"): 0.25}) == 4
    assert all(g.node_arg(*slot) == 0.25 for slot in plan.scalar_slots[(step.id, "Factor")])
    assert {s[0] for s in plan.scalar_slots[(step.id, "Factor")]} == set(copies)
    assert g.update_bindings({(step.id, "In"): 0x7200_0000}) == 4
    assert {s[0] for s in plan.binding_slots[(step.id, "In")]} == set(copies)
    assert all(g.node_arg(*slot) == 0x7200_0000 for slot in plan.binding_slots[(step.id, "In")])
    desc = plan.nodes[copies[0]].descriptor
    rec.calls.clear()
    assert g.swap_function((step.id, 0), 999, desc)
    assert [call[0] for call in rec.calls].count("set_params") == 4
    g.close()
