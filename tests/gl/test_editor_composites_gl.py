"""Open composites in the node editor panel, rendered headless (EGL: Mesa in CI, the NVIDIA driver on the
GPU machine): a closed composite is one node; opened, its inner blocks are drawn as nodes inside a group
around them and the composite's node, with the inner wire between them, titles in their states'
colours (an inner error in red); a double-click opens and closes it; zoomed out the group still holds
its nodes. Checked at the places the panel's layout reports and in the read-back pixels there (not
against a golden image)."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cudapatch.engine.diagnostics import Diagnostic

from ..unit.test_editor_composites import _Diagnosing, _patch
from .test_editor_gl import _draw, _near
from .test_editor_regions_gl import _inside, _model

pytestmark = pytest.mark.gl


def _colour(img, at, color, width=40):
    """Pixels of ``color`` in the text line starting at ``at`` (a title)."""
    x, y = at
    line = img[int(y) : int(y) + 14, int(x) : int(x) + width].reshape(-1, 3)
    return int((np.abs(line - np.array(color[:3]) * 255).max(axis=1) < 40).sum())


def test_a_closed_composite_is_one_node_and_an_open_one_a_group_of_its_inside(tmp_path):
    from cudapatch.interop.editor import GROUP_COLORS, LINK_COLOR, STATE_COLORS

    model = _model(_patch(tmp_path))
    _, panel = _draw(model, frames=4)
    assert set(panel.layout.nodes) == {"fill", "two", "after"} and not panel.layout.groups
    assert model.open("two")
    img, panel = _draw(model, frames=5)
    layout = panel.layout
    inner = {"two/a", "two/b", "two/loose"}
    assert set(layout.nodes) == {"fill", "two", "after"} | inner and set(layout.groups) == {"two"}
    group = layout.groups["two"]
    for op in ("two", *inner):  # the composite's node and its inside lie in the group
        assert _inside(group, layout.nodes[op]), (op, group, layout.nodes[op])
    for op in ("fill", "after"):
        x0, y0, x1, y1 = layout.nodes[op]
        assert x1 <= group[0] or x0 >= group[2] or y1 <= group[1] or y0 >= group[3], op
    two = layout.nodes["two"]
    for op in inner:  # below the composite's node or right of it, as a region's body is laid out
        assert layout.nodes[op][1] >= two[3] or layout.nodes[op][0] >= two[2], op
    # Titles where the layout says, in their states' colours (loose is not running: its input is not
    # linked inside), and the group's title in the composite's (the statistics here have no rows: OK).
    for op in ("two/a", "two/b"):
        assert _colour(img, layout.titles[op], STATE_COLORS["OK"]) > 5, op
    assert _colour(img, layout.titles["two/loose"], STATE_COLORS["Warning"]) > 5
    assert _colour(img, layout.group_titles["two"], STATE_COLORS["OK"]) > 5
    # The inner wire a.Out -> b.In is drawn.
    link = np.array(LINK_COLOR[:3]) * 255
    p, q = layout.pins[("two/a", "Out", "out")], layout.pins[("two/b", "In", "in")]
    assert _near(img, (p[0] + q[0]) / 2, (p[1] + q[1]) / 2, 3, lambda px: np.abs(px - link).max(axis=1) < 50)
    # The group's area is tinted: inside it, right of the composite's node, away from every node, the
    # canvas leans to the composite tint against the plain canvas right of the group.
    tint = np.array(GROUP_COLORS["composite"][0][:3])
    ax, ay = int(layout.nodes["two/a"][2] + 30), int(layout.nodes["two/a"][3] - 10)  # right of a, below b
    bx, by = int(group[2] + 20), ay
    for x, y in ((ax, ay), (bx, by)):
        assert not any(x0 <= x <= x1 and y0 <= y <= y1 for x0, y0, x1, y1 in layout.nodes.values()), (x, y)
    assert ax < group[2] - 5 and bx < 1275
    inside_px = img[ay - 2 : ay + 3, ax - 2 : ax + 3].reshape(-1, 3).mean(axis=0)
    outside_px = img[by - 2 : by + 3, bx - 2 : bx + 3].reshape(-1, 3).mean(axis=0)
    assert np.dot(inside_px - outside_px, tint - tint.mean()) > 3, (inside_px, outside_px)
    assert model.close("two")
    _, panel = _draw(model, frames=3)
    assert set(panel.layout.nodes) == {"fill", "two", "after"} and not panel.layout.groups


def test_an_inner_error_is_red_inside_and_on_the_closed_composite(tmp_path):
    from cudapatch.interop.editor import STATE_COLORS

    engine = _Diagnosing()
    model = _model(_patch(tmp_path), engine)
    two = model.adapter.block("two")
    engine.extra.append(Diagnostic("error", two.inner("a").id, "kernel-compile", "two/a: fx.cu(3): error: oops"))
    model.open("two")
    model.nodes()["two"].state = "Error"  # as the composite's row of a frame's statistics says
    img, panel = _draw(model, frames=4)
    layout = panel.layout
    assert _colour(img, layout.titles["two/a"], STATE_COLORS["Error"]) > 5
    assert _colour(img, layout.titles["two/b"], STATE_COLORS["OK"]) > 5 and not _colour(
        img, layout.titles["two/b"], STATE_COLORS["Error"]
    )
    assert _colour(img, layout.group_titles["two"], STATE_COLORS["Error"]) > 5
    model.close("two")
    img, panel = _draw(model, frames=3)
    assert _colour(img, panel.layout.titles["two"], STATE_COLORS["Error"]) > 5


def test_double_clicks_open_and_close_a_composite(tmp_path):
    from imgui_bundle import imgui

    model = _model(_patch(tmp_path))
    clicks = {3: "two", 12: "two"}  # at these frames, double-click that node's title
    seen: list = []

    def each_frame(panel):
        i = len(seen)
        seen.append(model.opened)
        io = imgui.get_io()
        if i == 10:
            time.sleep(0.4)  # past imgui's double-click time: the next clicks are a double-click of their own
        for start, op in clicks.items():
            if i == start:
                x, y = panel.layout.titles[op]
                io.add_mouse_pos_event(x + 4.0, y + 6.0)
            elif start < i <= start + 4:  # down, up, down, up: one per frame
                io.add_mouse_button_event(0, (i - start) % 2 == 1)

    _draw(model, frames=20, each_frame=each_frame)
    assert seen[3] == frozenset() and seen[10] == {"two"} and seen[-1] == frozenset(), seen
    assert not model.can_undo  # opening is a view, not an edit


def test_zoomed_out_an_open_composite_keeps_its_inside_in_its_group(tmp_path):
    from cudapatch.interop.editor import EditorPanel

    model = _model(_patch(tmp_path))
    model.open("two")
    _, panel = _draw(model, 12, prepare=EditorPanel.fit_all)
    group = panel.layout.groups["two"]
    for op in ("two", "two/a", "two/b", "two/loose"):
        assert _inside(group, panel.layout.nodes[op], 0.0), op


def test_a_probed_inner_wire_is_drawn_in_the_probe_colour(tmp_path):
    from cudapatch.interop.editor import LINK_COLOR, PROBE_COLOR

    from ..unit.plan_engine import PlanOnlyEngine

    model = _model(_patch(tmp_path), PlanOnlyEngine(fuse=False))
    model.open("two")
    assert model.probe("two/a", "Out")
    img, panel = _draw(model, frames=5)
    p, q = panel.layout.pins[("two/a", "Out", "out")], panel.layout.pins[("two/b", "In", "in")]
    mid = ((p[0] + q[0]) / 2, (p[1] + q[1]) / 2)
    orange, blue = np.array(PROBE_COLOR[:3]) * 255, np.array(LINK_COLOR[:3]) * 255
    assert _near(img, *mid, 3, lambda px: np.abs(px - orange).max(axis=1) < 50)
    assert not _near(img, *mid, 3, lambda px: np.abs(px - blue).max(axis=1) < 50)


def test_a_composite_open_inside_an_open_one_is_a_group_inside_its_group(tmp_path):
    _patch(tmp_path)
    text = 'links = ["fill.Out -> o.In"]\n\n[operators.fill]\ntype = "core.Fill"\n\n'
    text += f'[operators.o]\ntype = "core.Composite"\nPath = "{tmp_path / "outer.toml"}"\n'
    model = _model(text)
    model.open("o")
    model.open("o/sub")
    _, panel = _draw(model, frames=5, rect=(0, 0, 1280, 720), prepare=lambda p: p.fit_all())
    groups, nodes = panel.layout.groups, panel.layout.nodes
    assert set(groups) == {"o", "o/sub"}
    assert _inside(groups["o"], groups["o/sub"], 0.0)
    for op in ("o/sub", "o/sub/a", "o/sub/b", "o/sub/loose"):
        assert _inside(groups["o/sub"], nodes[op], 0.0), op
    assert _inside(groups["o"], nodes["o/c"], 0.0) and not _inside(groups["o/sub"], nodes["o/c"], 0.0)


@pytest.mark.gpu
def test_on_the_gpu_an_open_composite_shows_its_inner_times_states_and_probes(engine, tmp_path):
    """A real engine at PerBlock runs examples/composites/smooth.toml (box3.cu through NVRTC): opened in
    the editor, each inner node has its own GPU time and the OK state, a probe on the inner wire
    pass1.out -> pass2.in matches NumPy, and the panel draws the inner titles in the OK colour."""
    import shutil

    from OpenGL import GL

    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel
    from cudapatch.interop import EglContext
    from cudapatch.interop.editor import STATE_COLORS, EditorPanel
    from cudapatch.interop.overlay import Overlay

    from .test_editor_gl import ROOT

    for name in ("smooth.toml", "box3.cu"):
        shutil.copy(ROOT / "examples" / "composites" / name, tmp_path / name)
    text = f'[operators.smooth]\ntype = "core.Composite"\nPath = "{tmp_path / "smooth.toml"}"\nGain = 2.0\n'
    reg = PluginHost().registry
    patch = parse_patch(text, registry=reg)
    adapter = HostAdapter(engine, reg)
    apply_patch(adapter, patch)
    data = np.random.default_rng().standard_normal(1 << 16).astype(np.float32) * 5 + 1
    engine.bind(adapter.block("smooth"), "In", data)  # an exposed input bound: binds pass1's in
    engine.set_profiling("PerBlock")
    model = EditorModel(adapter, patch)
    assert model.open("smooth") and model.probe("smooth/pass1", "out")
    engine.wait_ready()
    ctx = EglContext(1280, 720)
    panel = EditorPanel(model, rect=(0, 0, 1280, 720))
    overlay = Overlay(ctx, panels=(panel.draw,))
    overlay.visible = False
    inner = ("smooth/pass1", "smooth/pass2", "smooth/gain")
    try:
        for _ in range(400):
            engine.update()
            GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, ctx.framebuffer)
            GL.glClear(GL.GL_COLOR_BUFFER_BIT)
            overlay.draw(engine.stats())  # the panel refreshes the model from these
            drawn = model.drawn_nodes()
            probed = model.probes.latest.get(("smooth/pass1", "out"))
            if probed is not None and all(drawn[p].gpu_ms for p in inner) and len(panel.layout.titles) == 4:
                break
        img = ctx.read_pixels()[..., :3].astype(int)
        layout = panel.layout
    finally:
        panel.close()
        overlay.close()
        ctx.close()
    drawn = model.drawn_nodes()
    for p in inner:
        assert drawn[p].state == "OK" and drawn[p].gpu_ms > 0, (p, drawn[p].state, drawn[p].message)
        assert drawn[p].gpu_ms <= drawn["smooth"].gpu_ms
        assert _colour(img, layout.titles[p], STATE_COLORS["OK"]) > 5, p
    # pass1 = box3(In) * weight, in float32 as the kernel adds and scales.
    left, right = np.concatenate([data[:1], data[:-1]]), np.concatenate([data[1:], data[-1:]])
    want = ((left + data) + right) * np.float32(0.33333334)
    st = model.probes.latest[("smooth/pass1", "out")]
    v = want.astype(np.float64)
    assert st.values == data.size and (st.nan, st.inf) == (0, 0)
    assert (st.minimum, st.maximum) == (float(v.min()), float(v.max()))
    assert st.mean == pytest.approx(float(v.mean()), rel=1e-9)


def test_delete_on_a_selected_inner_node_is_refused_with_the_reason(tmp_path):
    from imgui_bundle import imgui

    model = _model(_patch(tmp_path))
    model.open("two")
    text = model.doc.text
    seen: list = []

    def each_frame(panel):
        i = len(seen)
        seen.append(i)
        io = imgui.get_io()
        if i == 3:  # click the inner node's title: selects it
            x, y = panel.layout.titles["two/b"]
            io.add_mouse_pos_event(x + 4.0, y + 6.0)
        elif i in (4, 5):
            io.add_mouse_button_event(0, i == 4)
        elif i in (7, 8):
            io.add_key_event(imgui.Key.delete, i == 7)

    _, panel = _draw(model, frames=12, each_frame=each_frame)
    assert "two/b" in model.drawn_nodes() and model.doc.text == text and not model.can_undo
    assert "cannot delete: 'two/b' is inside composite 'two'" in panel._refusal
