"""The node editor panel renders a known patch (EGL: Mesa in CI, the NVIDIA driver on the GPU machine):
each node's title and each wire are where the panel's layout says, checked in the read-back pixels
(not against a golden image). The GPU test runs ``cudapatch run --headless --editor``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cudapatch.engine.profiling import EngineStats, ProfilingLevel
from cudapatch.interop import read_png

from ..unit.plan_engine import PlanOnlyEngine
from ..unit.test_editor_model import PATCH

pytestmark = pytest.mark.gl
ROOT = Path(__file__).resolve().parents[2]
STATS = EngineStats(ProfilingLevel.NONE, None, None, None, (), 0, 0, 0)


def _draw(model, frames=3, *, rect=(0, 0, 1280, 720), prepare=None, each_frame=None):
    """Draw ``model``'s editor panel (at ``rect``) ``frames`` times into a 1280 x 720 EGL framebuffer;
    returns the read-back pixels and the closed panel (its layout and drawn sets stay readable).
    ``prepare(panel)`` runs before the first frame, ``each_frame(panel)`` after each frame."""
    from OpenGL import GL

    from cudapatch.interop import EglContext
    from cudapatch.interop.editor import EditorPanel
    from cudapatch.interop.overlay import Overlay

    ctx = EglContext(1280, 720)
    panel = EditorPanel(model, rect=rect)
    if prepare is not None:
        prepare(panel)
    overlay = Overlay(ctx, panels=(panel.draw,))
    overlay.visible = False
    try:
        for _ in range(frames):  # the node editor places nodes in its first frame and draws them after
            GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, ctx.framebuffer)
            GL.glClearColor(0.0, 0.0, 0.0, 1.0)
            GL.glClear(GL.GL_COLOR_BUFFER_BIT)
            overlay.draw(STATS)
            if each_frame is not None:
                each_frame(panel)
        return ctx.read_pixels()[..., :3].astype(int), panel
    finally:
        panel.close()
        overlay.close()
        ctx.close()


def _render(model, frames=3):
    img, panel = _draw(model, frames)
    return img, panel.layout


def _model():
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel

    reg = PluginHost().registry
    patch = parse_patch(PATCH, registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    adapter.engine.update()
    return EditorModel(adapter, patch)


def _near(img, x, y, r, test):
    patch = img[max(0, int(y) - r) : int(y) + r + 1, max(0, int(x) - r) : int(x) + r + 1]
    return bool(test(patch.reshape(-1, 3)).any())


def test_editor_draws_titles_and_wires_where_the_layout_says():
    from cudapatch.interop.editor import LINK_COLOR, STATE_COLORS

    model = _model()
    img, layout = _render(model)
    assert set(layout.nodes) == {"fill", "scale", "add"}
    ok = np.array(STATE_COLORS["OK"][:3]) * 255
    for op, (x, y) in layout.titles.items():
        x0, y0, x1, y1 = layout.nodes[op]
        assert x0 <= x < x1 and y0 <= y < y1, (op, layout.nodes[op], (x, y))
        # The title is drawn in the state colour (OK: green) right at its position.
        title = img[int(y) : int(y) + 14, int(x) : int(x) + 8 * len(op)].reshape(-1, 3)
        assert (np.abs(title - ok).max(axis=1) < 40).sum() > 5, op
    link = np.array(LINK_COLOR[:3]) * 255
    a, b = layout.pins[("fill", "Out", "out")], layout.pins[("scale", "In", "in")]
    mid = ((a[0] + b[0]) / 2, (a[1] + b[1]) / 2)  # a wire with symmetric tangents passes through the middle
    assert _near(img, *mid, 3, lambda px: np.abs(px - link).max(axis=1) < 50)
    # Nowhere between the unlinked pins of add and scale is there a wire.
    c = layout.pins[("add", "A", "in")]
    far = ((b[0] + c[0]) / 2, (b[1] + c[1]) / 2)
    assert not _near(img, *far, 2, lambda px: np.abs(px - link).max(axis=1) < 50)


def test_a_link_made_through_the_actions_is_drawn():
    from cudapatch.interop.editor import LINK_COLOR

    model = _model()
    assert model.connect("scale", "Out", "add", "B")
    img, layout = _render(model)
    a, b = layout.pins[("scale", "Out", "out")], layout.pins[("add", "B", "in")]
    link = np.array(LINK_COLOR[:3]) * 255
    assert _near(img, (a[0] + b[0]) / 2, (a[1] + b[1]) / 2, 3, lambda px: np.abs(px - link).max(axis=1) < 50)


@pytest.mark.gpu
def test_cli_run_headless_editor_renders_the_editor(tmp_path):
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    patch = tmp_path / "demo.toml"
    from cudapatch.host_plugin.hosts.standalone import demo_patch_text

    patch.write_text(demo_patch_text())
    cmd = [sys.executable, "-m", "cudapatch", "run", str(patch), "--headless", "--editor", "--frames", "30"]
    cmd += ["--out", str(tmp_path / "out"), "--size", "1280x720", "--no-overlay"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    img = read_png(tmp_path / "out" / "frame_00030.png")[..., :3].astype(int)
    # The run's panel is laid out as this process lays out the same patch in a panel of the same default
    # place: each visible node's title is at its place, and a wire crosses the gap between linked nodes.
    layout = _demo_layout(demo_patch_text())
    titles = {op: at for op, at in layout.titles.items() if at[0] + 40 < 1280 and at[1] + 14 < 720}
    assert {"emit", "forces"} <= set(titles), layout.titles
    for op, at in titles.items():
        assert _title_drawn(img, at, op), (op, at)
    assert _is_wire(_wire_gap(img, layout, "emit", "forces")).sum() >= 3, "no wire between emit and forces"
    x0, y0, _, y1 = layout.nodes["emit"]  # left of the first node (it has no input) no wire runs
    assert not _is_wire(img[int(y0) : int(y1), max(0, int(x0) - 60) : int(x0) - 4].reshape(-1, 3)).any()
    assert patch.read_text() == demo_patch_text()  # opening the editor writes nothing


def _demo_layout(text):
    """Where an editor panel at its default place (the right of a 1280 x 720 frame) draws ``text``'s
    nodes, drawn here on an engine that only plans (node places come from the patch and its layout)."""
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel

    reg = PluginHost().registry
    patch = parse_patch(text, registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    adapter.engine.update()
    _, panel = _draw(EditorModel(adapter, patch), 4, rect=None)
    return panel.layout


def _title_drawn(img, at, op):
    """Whether ``op``'s title is drawn at ``at`` in one of the state colours (a running patch's node may
    still be compiling)."""
    from cudapatch.interop.editor import STATE_COLORS

    x, y = at
    title = img[int(y) : int(y) + 14, int(x) : int(x) + 8 * len(op)].reshape(-1, 3)
    return any((np.abs(title - np.array(c[:3]) * 255).max(axis=1) < 40).sum() > 5 for c in STATE_COLORS.values())


def _wire_gap(img, layout, src, dst):
    """The pixels between node ``src``'s right edge and ``dst``'s left edge, over the rows both span:
    where the wire between them runs, whatever row of each its pins are on."""
    a, b = layout.nodes[src], layout.nodes[dst]
    return img[int(max(a[1], b[1])) : int(min(a[3], b[3])), int(a[2]) + 4 : int(b[0]) - 4].reshape(-1, 3)


def _is_wire(px):
    from cudapatch.interop.editor import LINK_COLOR

    return np.abs(px - np.array(LINK_COLOR[:3]) * 255).max(axis=1) < 50


def _code_model(only=None):
    from cudapatch.engine.diagnostics import Diagnostic
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel

    from ..unit.test_code_errors import FX_PATCH, NVRTC, PATCH, WAVE_PATCH

    reg = PluginHost().registry
    patch = parse_patch({None: PATCH, "fx": FX_PATCH, "wave": WAVE_PATCH}[only], registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    adapter.engine.update()
    model = EditorModel(adapter, patch)
    if only == "wave":
        return model, 0
    code = adapter.block("fx").get("Code")
    line = next(i for i, ln in enumerate(code.splitlines(), 1) if "undefined_thing" in ln)
    message = NVRTC.replace("fx.cu(3)", f"fx.cu({line})").replace("fx.cu(4)", f"fx.cu({line + 1})")
    adapter.engine.errors = (Diagnostic("error", adapter.block("fx").id, "kernel-compile", message),)
    model.refresh()
    return model, line


def test_a_broken_code_shows_its_errors_at_their_lines():
    from cudapatch.interop.editor import REFUSED_COLOR

    model, line = _code_model("fx")
    img, panel = _draw(model, 4, prepare=lambda p: p.fit_all())
    marks = panel.code_marks["fx"]
    assert [m[0] for m in marks] == [line, line + 1]
    red = np.array(REFUSED_COLOR[:3]) * 255
    for _, x, y in marks:  # the red bar at the left end of each marked line
        assert _near(img, x + 1, y, 2, lambda px: np.abs(px - red).max(axis=1) < 60), (x, y)
    # The marks are one text line apart, and a line without an error has no bar.
    (_, x0, y0), (_, _, y1) = marks
    step = y1 - y0
    assert step > 4
    assert not _near(img, x0 + 1, y0 - 2 * step, 1, lambda px: np.abs(px - red).max(axis=1) < 60)


def test_an_expression_shows_its_generated_code_when_opened():
    model, _ = _code_model("wave")
    _, closed = _draw(model, 4, prepare=lambda p: p.fit_all())
    _, opened = _draw(model, 4, prepare=lambda p: (p.fit_all(), p.generated_open.add("wave")))
    # Heights in canvas units (fit_all zooms each to fit): the read-only code box (220 units) is in the node.
    h = {
        n: (p.layout.nodes["wave"][3] - p.layout.nodes["wave"][1]) / p._to_screen[2]
        for n, p in (("c", closed), ("o", opened))
    }
    assert h["o"] > h["c"] + 150, h


def _red(px):
    from cudapatch.interop.editor import REFUSED_COLOR

    return np.abs(px - np.array(REFUSED_COLOR[:3]) * 255).max(axis=1) < 60


def _assert_marked(img, layout, pin):
    """``pin``'s red dot is drawn where the layout says: beside its wire end, on its row."""
    assert set(layout.refused) == {pin}, layout.refused
    (x, y), (px, py) = layout.refused[pin], layout.pins[pin]
    assert abs(y - py) < 1 and 0 < px - x < 12, (layout.refused[pin], layout.pins[pin])
    assert _near(img, x, y, 1, _red)
    for other, (ox, oy) in layout.pins.items():  # no other pin has one
        if other != pin and other[2] == "in":
            assert not _near(img, ox - (px - x), oy, 1, _red), other


def test_a_refused_link_is_marked_at_its_target_pin_until_the_next_edit():
    model = _model()
    refused = model.connect("add", "Sum", "scale", "In")  # scale.In is linked already
    assert not refused
    img, layout = _render(model)
    _assert_marked(img, layout, ("scale", "In", "in"))
    assert model.set_param("fill", "Value", 0.25)  # the next edit clears the mark
    img, layout = _render(model)
    x, y = layout.pins[("scale", "In", "in")]
    assert not layout.refused and not _near(img, x - 6, y, 2, _red)


def test_a_link_dropped_on_a_pin_that_refuses_it_marks_that_pin():
    from imgui_bundle import imgui

    model = _model()
    text = model.doc.text
    steps: list = []

    def each_frame(panel):
        i = len([s for s in steps if isinstance(s, int)])
        steps.append(i)
        io = imgui.get_io()
        pins = panel.layout.pins
        if i == 2:  # the nodes are measured: over add's output pin, inside its label
            x, y = pins[("add", "Sum", "out")]
            steps.append((x - 3.0, y))
            io.add_mouse_pos_event(x - 3.0, y)
        elif i == 4:
            io.add_mouse_button_event(0, True)
        elif 5 <= i <= 25:  # dragged onto scale's input pin (linked already), inside its label
            (x0, y0), (x1, y1) = next(s for s in steps if isinstance(s, tuple)), pins[("scale", "In", "in")]
            t = (i - 5) / 20
            io.add_mouse_pos_event(x0 + (x1 + 3.0 - x0) * t, y0 + (y1 - y0) * t)
        elif i == 28:
            io.add_mouse_button_event(0, False)

    img, panel = _draw(model, frames=34, each_frame=each_frame)
    refusals = model.refusals()
    assert list(refusals) == [("scale", "In")] and "already linked" in refusals[("scale", "In")]
    assert model.doc.text == text and [str(lk) for lk in model.links()] == ["fill.Out -> scale.In"]
    _assert_marked(img, panel.layout, ("scale", "In", "in"))
