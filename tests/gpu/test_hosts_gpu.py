"""Hosts on the GPU: the standalone host with a patch file edited while it runs, and the
TouchDesigner engine TOP against the documented-API double."""

from __future__ import annotations

import gc
from typing import Any

import numpy as np
import pytest

from cudapatch.host_plugin import PluginHost
from cudapatch.host_plugin.hosts.standalone import StandaloneHost
from cudapatch.host_plugin.hosts.touchdesigner import BlockOperatorExt, EngineTOP, TouchDesignerHost

from ..td_double import COMP, TOP, CUDAMemory, CUDAMemoryShape, scriptTOP

pytestmark = pytest.mark.gpu

PATCH = """\
links = ["fill.Out -> scale.In"]

[operators.fill]
type = "core.Fill"
Count = 4096
Value = 1.5

[operators.scale]
type = "core.Scale"
Factor = 2.0
"""


def test_patch_file_edits_apply_while_running(tmp_path):
    path = tmp_path / "patch.toml"
    path.write_text(PATCH)
    with StandaloneHost(path) as host:
        host.engine.wait_ready()
        eng = host.engine
        for _ in range(3):
            eng.update()
        scale = host.adapter.block("scale")
        assert np.allclose(eng.read(scale, "Out"), 3.0)
        rebuilds = eng.counters.rebuilds
        path.write_text(PATCH.replace("Factor = 2.0", "Factor = -1.0"))  # Hot: no rebuild
        assert host.poll_patch(force=True)
        eng.update()
        assert np.allclose(eng.read(scale, "Out"), -1.5) and eng.counters.rebuilds == rebuilds
        path.write_text(PATCH.replace("Factor = 2.0", "Factor = oops"))  # a TOML error: nothing changes
        assert not host.poll_patch(force=True)
        assert host.reload_errors and host.reload_errors[-1].line == 10
        eng.update()
        assert np.allclose(eng.read(scale, "Out"), -1.5)
        extra = PATCH.replace('"fill.Out -> scale.In"]', '"fill.Out -> scale.In", "scale.Out -> more.In"]')
        path.write_text(extra + '\n[operators.more]\ntype = "core.Scale"\nOffset = 1.0\n')  # Cold
        assert host.poll_patch(force=True)
        eng.wait_ready()
        eng.update()
        # the new file has Factor = 2.0 again: 1.5 * 2 + 1
        assert np.allclose(eng.read(host.adapter.block("more"), "Out"), 4.0)
        assert eng.counters.rebuilds > rebuilds


def test_a_patch_files_bypassed_operators_apply_without_the_editor(tmp_path):
    """``[editor] bypassed`` runs bypassed from the first frame, and a reload that takes a name out of
    the list (or puts it back) toggles it, with no editor open."""
    chain = PATCH.replace('"fill.Out -> scale.In"]', '"fill.Out -> scale.In", "scale.Out -> more.In"]')
    chain += '\n[operators.more]\ntype = "core.Scale"\nOffset = 1.0\n'
    path = tmp_path / "patch.toml"
    path.write_text(chain + '\n[editor]\nbypassed = ["scale"]\n')
    with StandaloneHost(path) as host:
        eng = host.engine
        assert host.editor is None and host.adapter.bypassed("scale")

        def more() -> np.ndarray:  # a frame (that may start a build), the build landed, a frame
            eng.update()
            eng.wait_ready()
            eng.update()
            return eng.read(host.adapter.block("more"), "Out")

        assert np.allclose(more(), 1.5 + 1.0)  # more reads fill's values: scale is bypassed
        path.write_text(chain + "\n[editor]\nbypassed = []\n")
        assert host.poll_patch(force=True) and not host.adapter.bypassed("scale")
        assert np.allclose(more(), 1.5 * 2.0 + 1.0)
        path.write_text(chain + '\n[editor]\nbypassed = ["scale", "gone"]\n')  # "gone": a warning only
        assert host.poll_patch(force=True) and host.adapter.bypassed("scale") and not host.reload_errors
        assert np.allclose(more(), 1.5 + 1.0)


def _fill_scale_top(td: TouchDesignerHost) -> tuple:
    """Fill (64 x 32 x 4 values of 0.75) -> Scale as block COMPs, and an engine TOP showing the Scale's
    output as a 64 x 32 RGBA float image: ``(fill, scale, shape, top, script TOP)``."""
    fill = BlockOperatorExt(COMP("/p/fill"), td, "core.Fill")
    scale = BlockOperatorExt(COMP("/p/scale"), td, "core.Scale")
    fill.ownerComp.par.Count.val = 64 * 32 * 4
    fill.OnParValueChange(fill.ownerComp.par.Count, 1024)
    fill.ownerComp.par.Value.val = 0.75
    fill.OnParValueChange(fill.ownerComp.par.Value, 0.0)
    scale.Link(fill, "Out", "In")
    shape = CUDAMemoryShape()
    shape.width, shape.height, shape.numComps, shape.dataType = 64, 32, 4, np.float32
    return fill, scale, shape, EngineTOP(td, ("/p/scale", "Out"), shape), scriptTOP("/p/engine")


def _top_in_place_of_fill(td: TouchDesignerHost, fill: Any, shape: Any, top: Any) -> tuple:
    """A TOP of fresh random floats (CuPy) bound to the Scale's input, the Fill removed: ``(values, TOP)``."""
    import cupy

    rng = np.random.default_rng()
    img = cupy.asarray(rng.standard_normal(64 * 32 * 4).astype(np.float32))
    cupy.cuda.get_current_stream().synchronize()  # written before the engine reads it
    src_top = TOP("/p/movie", img, shape)
    td.engine.remove(fill.block)
    td.adapter._ops.pop("/p/fill")
    td.adapter._types.pop("/p/fill")
    top.BindInputTOP("/p/scale", "In", src_top)
    return img, src_top


def test_touchdesigner_engine_top_copies_on_the_engine_stream(engine):

    td = TouchDesignerHost(engine=engine, plugins=PluginHost())
    fill, scale, shape, top, op = _fill_scale_top(td)
    engine.wait_ready()
    for _ in range(2):
        top.onCook(op)
    assert not op.errors
    last = op.copies[-1]
    assert last["stream"] == int(engine.device.stream_handle) and last["size"] == 64 * 32 * 4 * 4
    assert np.allclose(last["data"].view(np.float32), 0.75)
    # a TOP as an input: its CUDAMemory is held while the engine reads it
    img, src_top = _top_in_place_of_fill(td, fill, shape, top)
    gc.collect()
    assert CUDAMemory.live >= 1 and src_top.streams[-1] == int(engine.device.stream_handle)
    scale.ownerComp.par.Factor.val = 2.0
    scale.OnParValueChange(scale.ownerComp.par.Factor, 1.0)
    top.onCook(op)
    assert np.allclose(op.copies[-1]["data"].view(np.float32), 2.0 * img.get())
    top.BindInputTOP("/p/scale", "In", src_top)  # the next frame's object replaces the old one
    gc.collect()
    held = CUDAMemory.live
    top.close()
    gc.collect()
    assert CUDAMemory.live == held - 1


def test_touchdesigner_with_an_isolated_engine_shows_and_feeds_tops():
    """``TouchDesignerHost(isolated=True)``: the blocks run in the engine's child process; the engine
    TOP copies the child's output (mapped here) on the host's engine stream, a Hot parameter reaches
    the child, and a TOP's CUDA memory fed to an input is read by the child with no copy."""

    td = TouchDesignerHost(plugins=PluginHost(), isolated=True)
    try:
        engine = td.engine
        assert engine.graph is None  # nothing runs in this process
        fill, scale, shape, top, op = _fill_scale_top(td)
        engine.wait_ready()
        for _ in range(2):
            top.onCook(op)
        assert not op.errors, op.errors
        last = op.copies[-1]
        assert last["stream"] == int(engine.device.stream_handle) and last["size"] == 64 * 32 * 4 * 4
        assert np.allclose(last["data"].view(np.float32), 0.75)
        scale.ownerComp.par.Factor.val = 3.0  # Hot: goes to the child with the frame
        scale.OnParValueChange(scale.ownerComp.par.Factor, 1.0)
        top.onCook(op)
        assert np.allclose(op.copies[-1]["data"].view(np.float32), 2.25)
        img, src_top = _top_in_place_of_fill(td, fill, shape, top)
        engine.wait_ready()
        for _ in range(2):
            top.onCook(op)
        assert not op.errors, op.errors
        np.testing.assert_allclose(op.copies[-1]["data"].view(np.float32), 3.0 * img.get(), rtol=1e-6)
        top.close()
    finally:
        td.close()
