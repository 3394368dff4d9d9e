"""The TouchDesigner binding against the documented-API double (tests/td_double.py), at plan level."""

from __future__ import annotations

import pytest

from cudapatch.blocks.library.custom import DEFAULT_CUSTOM_CODE
from cudapatch.errors import CudapatchError
from cudapatch.host_plugin import PluginHost, hookimpl, make_plugin_manager
from cudapatch.host_plugin.hosts.composite_reload import CompositeReloader
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


BLUR = """\
links = ["h.Out -> v.In"]

[operators.h]
type = "core.Scale"
Factor = 0.5

[operators.v]
type = "core.Scale"

[expose]
In = "h.In"
Out = "v.Out"
Gain = ["h.Factor", "v.Factor"]
"""

# The same ports; Gain again (of one Scale) and a new Bias.
SHIFT = """\
[operators.s]
type = "core.Scale"
Factor = 4.0
Offset = 0.25

[expose]
In = "s.In"
Out = "s.Out"
Gain = "s.Factor"
Bias = "s.Offset"
"""

# No Gain at all.
PLAIN = """\
[operators.s]
type = "core.Scale"

[expose]
In = "s.In"
Out = "s.Out"
"""


def _names(comp: COMP) -> list[str]:
    (page,) = comp.customPages
    return [p.name for p in page.pars]


def _set(ext: BlockOperatorExt, name: str, value) -> None:
    """What TouchDesigner does when the user types a value: the parameter changes, then its callback."""
    par = getattr(ext.ownerComp.par, name)
    prev, par.val = par.val, value
    ext.OnParValueChange(par, prev)


@pytest.fixture
def project(tmp_path):
    """A TouchDesigner project saved in ``tmp_path`` (the .toe's folder) with three composite files."""
    for name, text in (("blur.toml", BLUR), ("shift.toml", SHIFT), ("plain.toml", PLAIN)):
        (tmp_path / name).write_text(text)
    return TouchDesignerHost(engine=PlanOnlyEngine(), plugins=PluginHost(), project_folder=tmp_path)


def test_a_composite_comp_finds_its_file_next_to_the_project_and_shows_what_it_exposes(project, tmp_path):
    src = BlockOperatorExt(COMP("/p/src"), project, "core.Fill")
    ext = BlockOperatorExt(COMP("/p/blur"), project, "core.Composite")
    comp = ext.ownerComp
    assert _names(comp) == ["Childgraph", "Path"]  # no file yet: nothing exposed
    _set(ext, "Childgraph", 1)
    _set(ext, "Path", "blur.toml")  # relative to the .toe's folder, as TouchDesigner's own file parameters
    assert not comp.errors
    assert ext.block.get("Path") == str(tmp_path / "blur.toml") and comp.par.Path.val == "blur.toml"
    assert _names(comp) == ["Gain", "Childgraph", "Path"]  # in the block's order
    assert comp.par.Gain.val == comp.par.Gain.default == 0.5  # the first target's value
    assert comp.par.Childgraph.val == 1 and ext.block.is_child_graph  # kept across the re-description
    _set(ext, "Gain", 2.0)
    assert ext.block.get("Gain") == 2.0
    ext.Link(src, "Out", "In")
    project.adapter.engine_operator.cook()
    plan = project.engine.plan
    inner = {b.id for _, b in ext.block.inner_blocks()}
    assert len(inner) == 2 and all(plan.block_nodes[i] for i in inner) and not comp.errors  # flattened in

    _set(ext, "Path", "shift.toml")  # another file: Gain stays (with its value), Bias appears
    assert _names(comp) == ["Gain", "Bias", "Childgraph", "Path"]
    assert comp.par.Gain.val == ext.block.get("Gain") == 2.0
    assert comp.par.Bias.val == ext.block.get("Bias") == 0.25
    _set(ext, "Bias", 1.5)
    assert ext.block.get("Bias") == 1.5

    _set(ext, "Path", "plain.toml")  # Gain and Bias are gone from the page too
    assert _names(comp) == ["Childgraph", "Path"] and not hasattr(comp.par, "Gain")
    assert comp.par.Childgraph.val == 1 and not comp.errors


def test_a_composite_path_that_does_not_load_is_an_error_on_the_comp_and_changes_nothing(project, tmp_path):
    ext = BlockOperatorExt(COMP("/p/blur"), project, "core.Composite")
    comp = ext.ownerComp
    _set(ext, "Path", "blur.toml")
    _set(ext, "Gain", 3.0)
    _set(ext, "Path", "nope.toml")
    assert "nope.toml" in comp.errors[-1] and "not found" in comp.errors[-1]
    assert comp.par.Path.val == "blur.toml" and ext.block.get("Path") == str(tmp_path / "blur.toml")
    assert _names(comp) == ["Gain", "Childgraph", "Path"] and ext.block.get("Gain") == comp.par.Gain.val == 3.0
    (tmp_path / "broken.toml").write_text('[expose]\nOut = "nobody.Out"\n')
    _set(ext, "Path", "broken.toml")
    assert "broken.toml" in comp.errors[-1] and "nobody" in comp.errors[-1]
    assert comp.par.Path.val == "blur.toml" and _names(comp) == ["Gain", "Childgraph", "Path"]


def test_a_saved_composite_comp_comes_back_with_its_file_and_values(project, tmp_path):
    comp = COMP("/p/blur")
    first = BlockOperatorExt(comp, project, "core.Composite")
    _set(first, "Path", "blur.toml")
    _set(first, "Gain", 2.0)
    first.Dispose()
    # The project is opened again: a new engine; the COMP holds its page and values from the .toe.
    reopened = TouchDesignerHost(engine=PlanOnlyEngine(), plugins=PluginHost(), project_folder=tmp_path)
    ext = BlockOperatorExt(comp, reopened, "core.Composite")
    assert not comp.errors and _names(comp) == ["Gain", "Childgraph", "Path"]  # no parameter twice
    assert ext.block.get("Path") == str(tmp_path / "blur.toml") and comp.par.Path.val == "blur.toml"
    assert ext.block.get("Gain") == comp.par.Gain.val == 2.0
    _set(ext, "Gain", 0.75)
    assert ext.block.get("Gain") == 0.75
    ext.Dispose()
    (tmp_path / "blur.toml").unlink()  # the file is gone when the project opens: an error, the page shows the path
    again = BlockOperatorExt(comp, TouchDesignerHost(engine=PlanOnlyEngine(), plugins=PluginHost()), "core.Composite")
    assert "blur.toml" in comp.errors[-1] and comp.par.Path.val == "blur.toml"
    assert _names(comp) == ["Childgraph", "Path"] and again.block.get("Path") == ""


def test_an_edited_composite_file_reaches_the_page_through_sync_page(project, tmp_path):
    ext = BlockOperatorExt(COMP("/p/blur"), project, "core.Composite")
    _set(ext, "Path", "blur.toml")
    _set(ext, "Gain", 2.0)
    reloader = CompositeReloader(project.adapter, clock=lambda: 0.0)  # e.g. from an Execute DAT's onFrameStart
    reloader.poll(force=True)  # the files as they are now
    (tmp_path / "blur.toml").write_text(SHIFT + "\n# edited\n")
    assert reloader.poll(force=True) == 1
    ext.SyncPage()
    assert _names(ext.ownerComp) == ["Gain", "Bias", "Childgraph", "Path"]
    assert ext.ownerComp.par.Gain.val == ext.block.get("Gain") == 2.0 and ext.ownerComp.par.Path.val == "blur.toml"


def test_a_composite_comp_in_a_region_comp_and_a_feedback_loop(project):
    src = BlockOperatorExt(COMP("/p/src"), project, "core.Fill")
    loop = BlockOperatorExt(COMP("/p/loop"), project, "core.For")
    blur = BlockOperatorExt(COMP("/p/loop/blur"), project, "core.Composite")
    _set(blur, "Path", "blur.toml")
    delay = BlockOperatorExt(COMP("/p/delay"), project, "core.FrameDelay")
    mix = BlockOperatorExt(COMP("/p/mix"), project, "core.VectorAdd")
    mix.Link(src, "Out", "A")
    mix.Link(delay, "Out", "B")
    blur.Link(mix, "Sum", "In")
    delay.Link(blur, "Out", "In")  # closes the loop through the delay
    assert [e.ownerComp.errors for e in (src, loop, blur, delay, mix)] == [[]] * 5
    assert project.adapter.regions() == {"/p/loop/blur": "/p/loop"}
    project.adapter.engine_operator.cook()
    plan = project.engine.plan
    scoped = set(plan.scopes)
    assert plan.regions[loop.block.id].kind == "for"
    assert all(set(plan.block_nodes[b.id]) <= scoped for _, b in blur.block.inner_blocks())  # in the body


def test_a_frame_delay_type_reshapes_its_fill_parameter_on_the_page(td):
    ext = BlockOperatorExt(COMP("/p/delay"), td, "core.FrameDelay")
    comp = ext.ownerComp
    _set(ext, "Count", 64)
    _set(ext, "Type", "float4")  # Fill becomes four components
    assert _names(comp) == ["Type", "Count", "Fill1", "Fill2", "Fill3", "Fill4", "Reset"]
    assert comp.par.Count.val == 64 and not hasattr(comp.par, "Fill")
    comp.par.Fill3.val = 0.5
    ext.OnParValueChange(comp.par.Fill3, 0.0)
    assert ext.block.get("Fill") == (0.0, 0.0, 0.5, 0.0)
    _set(ext, "Type", "uint")  # an integer Fill
    assert _names(comp) == ["Type", "Count", "Fill", "Reset"] and comp.par.Fill.style == "Int"
    assert ext.block.get("Count") == comp.par.Count.val == 64 and not comp.errors


def test_a_comp_whose_block_type_changed_drops_the_old_page(td):
    comp = COMP("/p/k")
    first = BlockOperatorExt(comp, td, "core.CustomKernel")
    _set(first, "Gain", 3.0)
    first.Dispose()
    ext = BlockOperatorExt(comp, td, "core.Scale")  # Blocktype set to another type, the extension re-initialized
    assert not comp.errors and _names(comp) == [td_par_name(p.name) for p in ext.block.description.params]
    assert not hasattr(comp.par, "Code")


def test_a_custom_kernel_whose_code_takes_other_scalars_rebuilds_the_page(td):
    ext = BlockOperatorExt(COMP("/p/k"), td, "core.CustomKernel")
    comp = ext.ownerComp
    assert _names(comp) == ["Code", "Gain"]
    _set(ext, "Gain", 3.0)
    same = DEFAULT_CUSTOM_CODE.replace("in[i] * gain", "in[i] * gain * gain")  # the same scalars: no rebuild
    _set(ext, "Code", same)
    assert _names(comp) == ["Code", "Gain"] and comp.par.Gain.val == 3.0
    more = DEFAULT_CUSTOM_CODE.replace("float gain,", "float gain, float bias, int steps,").replace(
        "* gain", "* gain + bias"
    )
    _set(ext, "Code", more)
    assert not comp.errors
    assert _names(comp) == ["Code", "Gain", "Bias", "Steps"] and comp.par.Steps.style == "Int"
    assert ext.block.get("gain") == comp.par.Gain.val == 3.0  # kept
    _set(ext, "Bias", 0.5)
    assert ext.block.get("bias") == 0.5
    _set(ext, "Code", DEFAULT_CUSTOM_CODE)
    assert _names(comp) == ["Code", "Gain"] and not hasattr(comp.par, "Bias") and comp.par.Gain.val == 3.0
