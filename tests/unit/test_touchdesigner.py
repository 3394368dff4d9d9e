"""The TouchDesigner binding against the documented-API double (tests/td_double.py), at plan level."""

from __future__ import annotations

import pytest

from cudapatch.errors import CudapatchError
from cudapatch.host_plugin import PluginHost, hookimpl, make_plugin_manager
from cudapatch.host_plugin.hosts.touchdesigner import BlockOperatorExt, EngineTOP, TouchDesignerHost, td_par_name

from ..td_double import COMP, CUDAMemoryShape, scriptTOP
from .plan_engine import PlanOnlyEngine


@pytest.fixture
def td():
    return TouchDesignerHost(engine=PlanOnlyEngine(), plugins=PluginHost())


def test_par_names_follow_touchdesigner_rules():
    assert td_par_name("CurlScale") == "Curlscale" and td_par_name("Dt") == "Dt" and td_par_name("gain") == "Gain"


def test_block_comp_builds_its_parameter_page(td):
    comp = COMP("/project1/forces")
    ext = BlockOperatorExt(comp, td, "particles.Forces")
    assert td.adapter.operators() == {"/project1/forces": "particles.Forces"}
    (page,) = comp.customPages
    names = [p.name for p in page.pars]
    assert names[:3] == ["Gravity1", "Gravity2", "Gravity3"] and "Curlscale" in names
    assert comp.par.Gravity2.val == -0.6 and comp.par.Drag.normMin == 0.0
    comp.par.Curl.val = 0.25
    ext.OnParValueChange(comp.par.Curl, 1.5)
    assert ext.block.params["Curl"].value == 0.25
    comp.par.Gravity1.val = 1.0
    ext.OnParValueChange(comp.par.Gravity1, 0.0)
    assert ext.block.params["Gravity"].value == (1.0, -0.6, 0.0)
    comp.par.Drag.val = -3.0  # out of range: an error on the COMP, the block keeps its value
    ext.OnParValueChange(comp.par.Drag, 0.4)
    assert ext.block.params["Drag"].value == 0.4 and comp.par.Drag.val == 0.4
    assert comp.errors and "Drag" in comp.errors[-1]


def test_links_cook_and_dispose(td):
    emit = BlockOperatorExt(COMP("/p/emit"), td, "particles.Emitter")
    forces = BlockOperatorExt(COMP("/p/forces"), td, "particles.Forces")
    forces.Link(emit, "Particles", "Particles")
    td.adapter.engine_operator.cook()
    plan = td.engine.plan
    assert plan.outputs[(forces.block.id, "Particles")] == plan.outputs[(emit.block.id, "Particles")]
    forces.Link(emit, "Nope", "Particles")
    assert "Nope" in forces.ownerComp.errors[-1]
    assert "forces" in forces.Tooltip()
    forces.Unlink(emit, "Particles", "Particles")
    forces.Dispose()
    assert td.adapter.operators() == {"/p/emit": "particles.Emitter"}


class TaggedOperators:
    """A plugin that maps COMPs tagged 'emitter' to particles.Emitter."""

    @hookimpl
    def cudapatch_adapt_operator(self, host, operator):
        if host == "touchdesigner" and "emitter" in getattr(operator, "tags", ()):
            return {"type": "particles.Emitter"}
        return None


def test_plugins_decide_the_block_type_of_an_operator():
    plugins = PluginHost(make_plugin_manager(entry_points=False, disabled=(), plugins=(("tags", TaggedOperators()),)))
    td = TouchDesignerHost(engine=PlanOnlyEngine(), plugins=plugins)
    comp = COMP("/p/spark")
    comp.tags = ("emitter",)
    ext = BlockOperatorExt(comp, td)
    assert td.adapter.operators() == {"/p/spark": "particles.Emitter"} and ext.block.type_name == "Emitter"
    with pytest.raises(CudapatchError, match="no plugin knows"):
        BlockOperatorExt(COMP("/p/other"), td)


def test_engine_top_after_a_lost_engine_shows_why_and_copies_nothing(td):
    BlockOperatorExt(COMP("/p/emit"), td, "particles.Emitter")
    shape = CUDAMemoryShape()
    shape.width, shape.height = 8, 8
    top = EngineTOP(td, ("/p/emit", "Particles"), shape)
    td.engine.lost = "the GPU context is lost after CUDA_ERROR_ILLEGAL_ADDRESS in block 'emit'"
    op = scriptTOP("/p/engine")
    top.onCook(op)
    assert op.errors == [f"engine: {td.engine.lost}"] and not op.copies


def test_a_block_comp_inside_a_region_comp_runs_in_its_body(td):
    src = BlockOperatorExt(COMP("/p/src"), td, "core.Fill")
    step = BlockOperatorExt(COMP("/p/loop/step"), td, "core.Scale")  # made before its region COMP
    loop = BlockOperatorExt(COMP("/p/loop"), td, "core.For")
    inner = BlockOperatorExt(COMP("/p/loop/inner"), td, "core.Scale")  # made after it
    step.Link(src, "Out", "In")
    inner.Link(step, "Out", "In")
    assert td.adapter.regions() == {"/p/loop/step": "/p/loop", "/p/loop/inner": "/p/loop"}
    td.adapter.engine_operator.cook()
    plan = td.engine.plan
    assert plan.regions[loop.block.id].kind == "for"
    scoped = set(plan.scopes)  # step and inner fuse: one node in the body holds both
    assert all(set(plan.block_nodes[b.block.id]) <= scoped for b in (step, inner))
    assert not set(plan.block_nodes[src.block.id]) & scoped
    nested = BlockOperatorExt(COMP("/p/src/child"), td, "core.Scale")  # inside a plain block COMP: top level
    assert "/p/src/child" not in td.adapter.regions() and not nested.ownerComp.errors


def test_engine_top_keeps_the_output_it_shows_out_of_fused_groups(td):
    shape = CUDAMemoryShape()
    shape.width, shape.height = 8, 8
    top = EngineTOP(td, ("/p/a", "Out"), shape)  # made before its operator: kept at the first cook
    src = BlockOperatorExt(COMP("/p/src"), td, "core.Fill")
    a = BlockOperatorExt(COMP("/p/a"), td, "core.Scale")
    b = BlockOperatorExt(COMP("/p/b"), td, "core.Scale")
    a.Link(src, "Out", "In")
    b.Link(a, "Out", "In")
    td.adapter.engine_operator.cook()
    assert (a.block.id, "Out") not in td.engine.plan.outputs  # a -> b fused: a.Out is in no buffer
    eo = td.adapter.engine_operator

    def no_device(op_id, port):  # a plan-only engine holds no device memory to copy
        raise CudapatchError("no device", block=op_id, port=port)

    eo.output = no_device
    op = scriptTOP("/p/engine")
    top.onCook(op)  # keeps a.Out, then cooks
    assert len(op.errors) == 1 and "no device" in op.errors[0]
    assert (a.block.id, "Out") in td.engine.context.kept
    assert (a.block.id, "Out") in td.engine.plan.outputs  # its own buffer from that cook's build on
    top2 = EngineTOP(td, ("/p/b", "Out"), shape)  # its operator exists: kept at once
    assert (b.block.id, "Out") in td.engine.context.kept and top2._kept
