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
    # The editor's window fills the right of the frame with its grey canvas.
    right = img[100:600, 600:1200]
    assert (np.abs(right - right.mean(axis=(0, 1))).max(axis=2) < 30).mean() > 0.3
    assert patch.read_text() == demo_patch_text()  # opening the editor writes nothing


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
