"""The editor panel's probes and culling, in read-back pixels (EGL: Mesa in CI, the NVIDIA driver on the
GPU machine): a probed wire is orange, red while its buffer holds a NaN; a 100-node patch draws only the
nodes in the window, and a wire leaving the window still reaches its pin. The probe statistics here are
stand-ins on a plan-only engine (the GPU computes real ones in tests/gpu/test_probes_gpu.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from cudapatch.engine.probes import ProbeStats

from .test_editor_gl import _draw, _model, _near, _render

pytestmark = pytest.mark.gl


def _stats(nan: int) -> ProbeStats:
    return ProbeStats(frame=7, age=1, values=128, minimum=0.5, maximum=0.5, mean=0.5, nan=nan, inf=0)


def _like(color):
    want = np.array(color[:3]) * 255
    return lambda px: np.abs(px - want).max(axis=1) < 50


def test_a_probed_wire_is_orange_and_red_while_its_buffer_holds_a_nan():
    from cudapatch.interop.editor import LINK_COLOR, PROBE_COLOR, REFUSED_COLOR

    model = _model()
    assert model.connect("scale", "Out", "add", "B")
    assert model.probe("fill", "Out") and model.probe("scale", "Out")
    # Stand-ins for the engine's probes: fill's buffer is clean, scale's has NaNs.
    model.probes._probes[("fill", "Out")] = SimpleNamespace(stats=_stats(0), close=lambda: None)
    model.probes._probes[("scale", "Out")] = SimpleNamespace(stats=_stats(3), close=lambda: None)
    img, layout = _render(model)
    a, b = layout.pins[("fill", "Out", "out")], layout.pins[("scale", "In", "in")]
    mid = ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)
    assert _near(img, *mid, 3, _like(PROBE_COLOR)) and not _near(img, *mid, 3, _like(LINK_COLOR))
    c, d = layout.pins[("scale", "Out", "out")], layout.pins[("add", "B", "in")]
    assert _near(img, (c[0] + d[0]) / 2, (c[1] + d[1]) / 2, 3, _like(REFUSED_COLOR))
    assert model.probes.bad("scale", "Out") and str(model.probes.latest[("scale", "Out")]).startswith("min 0.5")


def test_a_hundred_node_patch_draws_the_visible_nodes_and_wires_reach_nodes_outside():

    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel
    from cudapatch.interop.editor import LINK_COLOR

    from ..unit.plan_engine import PlanOnlyEngine

    lines = ["[operators.s0]", 'type = "core.Fill"', ""]
    for i in range(1, 100):
        lines += [f"[operators.s{i}]", 'type = "core.Scale"', ""]
    reg = PluginHost().registry
    patch = parse_patch("\n".join(lines), registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    for i in range(99):
        adapter.connect(f"s{i}", "Out", f"s{i + 1}", "In")
    model = EditorModel(adapter, patch)  # auto layout: one row, a column per node
    img, panel = _draw(model, 4, rect=(0, 0, 900, 720))  # columns at 40, 340, 640, 940 ...: three fit
    drawn, stubs, layout = set(panel.drawn), set(panel.stubs), panel.layout
    assert drawn == {"s0", "s1", "s2"} and set(layout.nodes) == drawn
    assert stubs == {"s3"}  # outside the window, but a drawn wire ends there
    x, y = layout.pins[("s2", "Out", "out")]
    assert x < 870
    # The wire leaves s2 towards s3: link-coloured pixels right of its pin, inside the window.
    assert _near(img, x + 20, y, 10, _like(LINK_COLOR))  # (the wire bends towards the pin of s3)
    assert not _near(img, 1100, y, 30, _like(LINK_COLOR))  # nothing drawn outside the panel's window


def test_the_selected_wires_probe_window_shows_its_statistics_and_thumbnail():

    from cudapatch.interop.editor import REFUSED_COLOR

    model = _model()
    assert model.probe("fill", "Out")
    thumb = np.zeros((8, 8), np.uint8)  # all NaN: drawn red
    st = ProbeStats(frame=9, age=1, values=64, minimum=None, maximum=None, mean=None, nan=64, inf=0, thumbnail=thumb)
    model.probes._probes[("fill", "Out")] = SimpleNamespace(stats=st, close=lambda: None)

    def select_the_wire(panel):
        panel._wire = ("fill", "Out", "scale", "In")  # as a click on the wire selects it

    img, _ = _draw(model, 3, prepare=select_the_wire)
    red = np.abs(img.reshape(-1, 3) - np.array(REFUSED_COLOR[:3]) * 255).max(axis=1) < 30
    assert red.sum() >= 8 * 8 * 6 * 6 * 0.9  # the thumbnail's 8 x 8 cells of 6 x 6 pixels, and the red wire
