"""GL without CUDA: contexts, PNG files, the point renderer and the imgui overlay (Mesa in CI)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from cudapatch.engine.diagnostics import Diagnostic
from cudapatch.engine.profiling import AppendStats, BlockStats, EngineStats, ProfilingLevel
from cudapatch.errors import InteropError
from cudapatch.interop import read_png, write_png

pytestmark = pytest.mark.gl

BACKGROUND = (0.0, 0.0, 0.0)


def _stats(level=ProfilingLevel.PER_BLOCK) -> EngineStats:
    blocks = (
        BlockStats(1, "Emitter", "OK", "", 0.42),
        BlockStats(2, "Filter", "Warning", "almost full", 0.13, append={"Kept": AppendStats(900, 1000, False)}),
        BlockStats(3, "Broken", "Error", "does not compile", None),
    )
    diags = (Diagnostic("error", 3, "compile", "kernel.cu:3: expected ';'"),)
    return EngineStats(level, 10, 2, 0.61, blocks, 5, 12 << 20, 64 << 20, diags)


def _clear(ctx, rgb=BACKGROUND):
    from OpenGL import GL

    GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, ctx.framebuffer)
    GL.glViewport(0, 0, *ctx.size)
    GL.glClearColor(*rgb, 1.0)
    GL.glClear(GL.GL_COLOR_BUFFER_BIT)


def test_egl_context_clears_and_reads_back(egl):
    assert egl.info()["version"].split()[0] >= "3.3"
    _clear(egl, (1.0, 0.5, 0.0))
    px = egl.read_pixels()
    assert px.shape == (200, 320, 4)
    assert np.all(np.abs(px[..., :3].astype(int) - [255, 128, 0]) <= 1)


def test_egl_context_lifecycle():
    from cudapatch.interop import EglContext

    ctx = EglContext(64, 64)
    other = EglContext(32, 32)  # shares the display: closing it must not end the first context
    other.close()
    ctx.make_current()
    assert ctx.read_pixels().shape == (64, 64, 4)
    ctx.close()
    ctx.close()  # idempotent
    assert ctx.is_closed
    with pytest.raises(InteropError, match="closed"):
        ctx.make_current()
    with pytest.raises(InteropError, match="closed"):
        ctx.read_pixels()


def test_egl_needs_the_egl_platform_chosen_before_opengl_loads():
    code = (
        "import os; os.environ['PYOPENGL_PLATFORM'] = 'glx'\n"
        "from cudapatch.interop import EglContext\n"
        "from cudapatch.errors import InteropError\n"
        "try:\n    EglContext(8, 8)\nexcept InteropError as e:\n    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "ERR" in out.stdout and "PYOPENGL_PLATFORM=egl" in out.stdout, out.stdout + out.stderr


def test_png_round_trip(tmp_path):
    rng = np.random.default_rng()
    img = rng.integers(0, 256, (17, 23, 4), dtype=np.uint8)
    path = write_png(tmp_path / "x.png", img)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert np.array_equal(read_png(path), img)
    with pytest.raises(ValueError, match="height, width, 4"):
        write_png(tmp_path / "bad.png", img[..., :3])


def test_point_renderer_draws_live_points_only(egl):
    from OpenGL import GL

    from cudapatch.interop.render import PointRenderer, orbit_camera

    cap = 4
    pos = np.array([[0, 0.1, 0, 8], [0.3, 0.3, 0, 8], [0, 0, 0, 0], [-0.3, 0, 0, 0]], np.float32)  # 2 alive
    col = np.array([[1, 0, 0, 1], [0, 1, 0, 1], [0, 0, 1, 1], [0, 0, 1, 1]], np.float32)  # dead ones blue
    buf = int(GL.glGenBuffers(1))
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buf)
    GL.glBufferData(GL.GL_ARRAY_BUFFER, np.concatenate([pos, col]).tobytes(), GL.GL_STATIC_DRAW)
    r = PointRenderer(buf, cap)
    _clear(egl)
    r.draw(orbit_camera(0.0, 320 / 200), 200)
    px = egl.read_pixels().astype(int)
    assert (px[..., 0] > 100).any() and (px[..., 1] > 100).any()  # the red and the green point
    assert not (px[..., 2] > 60).any()  # no blue: dead points are not drawn
    r.close()
    GL.glDeleteBuffers(1, [buf])


def test_overlay_draws_its_panel_and_fill_bar():
    from cudapatch.interop import EglContext
    from cudapatch.interop.overlay import FILL_BAR_COLOR, Overlay

    egl = EglContext(640, 400)
    picked = []
    ov = Overlay(egl, on_level=picked.append)
    for i in range(3):
        ov.record_frame(1.0 + i, 0.5)
        _clear(egl)
        ov.draw(_stats())
    px = egl.read_pixels().astype(int)
    assert (px[..., :3].sum(axis=2) > 30).mean() > 0.05  # the panel covers part of the frame
    want = np.array([round(c * 255) for c in FILL_BAR_COLOR[:3]])
    assert (np.abs(px[..., :3] - want).max(axis=2) <= 8).sum() > 20  # the 90 % fill bar is drawn
    ov.close()
    ov.close()
    with pytest.raises(InteropError, match="closed"):
        ov.draw(_stats())
    egl.close()


def test_overlay_dims_internal_blocks_under_their_source():
    from cudapatch.interop import EglContext
    from cudapatch.interop.overlay import Overlay

    base = _stats()
    writer = BlockStats(4, "Emitter.Points -> preview", "OK", "", 0.02)
    stats = dataclasses.replace(base, blocks=(*base.blocks, writer))
    egl = EglContext(640, 400)
    ov = Overlay(egl)
    counts = {}
    try:
        for internal in ({}, {4: 1}):
            for _ in range(2):  # imgui lays a table out on its first frame
                _clear(egl)
                ov.draw(stats, internal=internal)
            px = egl.read_pixels()[..., :3].astype(int)
            white = (px > 235).all(axis=2).sum()
            # imgui's disabled text: a neutral mid grey (148 over this panel with Mesa), unlike the
            # panel's dark greys and the white text's anti-aliased edges, which are few at this level
            grey = (((px >= 128) & (px <= 170)).all(axis=2) & (np.ptp(px, axis=2) <= 4)).sum()
            counts[bool(internal)] = white, grey
    finally:
        ov.close()
        egl.close()
    (white_plain, grey_plain), (white_dim, grey_dim) = counts[False], counts[True]
    assert white_plain - white_dim > 60, counts  # the writer's name and GPU ms are no longer white ...
    assert grey_dim - grey_plain > 60, counts  # ... but drawn in the dimmed text color


def test_overlay_restores_gl_state(egl):
    from OpenGL import GL

    from cudapatch.interop.overlay import Overlay

    ov = Overlay(egl)
    GL.glDisable(GL.GL_BLEND)
    GL.glEnable(GL.GL_DEPTH_TEST)
    GL.glViewport(1, 2, 30, 40)
    ov.draw(_stats())
    assert not GL.glIsEnabled(GL.GL_BLEND) and GL.glIsEnabled(GL.GL_DEPTH_TEST)
    assert list(GL.glGetIntegerv(GL.GL_VIEWPORT)) == [1, 2, 30, 40]
    ov.close()


def test_window_with_overlay(needs_display):
    from cudapatch.interop import GlfwWindow
    from cudapatch.interop.overlay import Overlay

    with GlfwWindow(400, 300, "cudapatch test", visible=False) as win:
        ov = Overlay(win)
        for _ in range(3):
            _clear(win)
            ov.draw(_stats())
        px = win.read_pixels()
        assert px.shape[:2] == (win.size[1], win.size[0])
        assert (px[..., :3].astype(int).sum(axis=2) > 30).mean() > 0.05
        ov.close()
        win.swap()
    with pytest.raises(InteropError, match="closed"):
        win.make_current()


def test_window_without_display_is_a_clear_error(monkeypatch):
    from cudapatch.interop import GlfwWindow

    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    with pytest.raises(InteropError, match="no display.*--headless"):
        GlfwWindow(100, 100)


def test_overlay_lists_a_diagnostic_at_its_patch_files_line():
    from cudapatch.interop import EglContext
    from cudapatch.interop.overlay import Overlay

    egl = EglContext(640, 400)
    ov = Overlay(egl)
    red = {}
    try:
        for places in ({}, {3: "a/long/path/to/the/patch.toml:31"}):
            ov.places = (lambda p=places: p) if places else None  # as StandaloneHost.open_preview sets it
            for _ in range(2):
                _clear(egl)
                ov.draw(_stats())
            px = egl.read_pixels()[..., :3].astype(int)
            want = np.array([round(c * 255) for c in (0.95, 0.3, 0.3)])  # the error's text color
            red[bool(places)] = int((np.abs(px - want).max(axis=2) <= 40).sum())
    finally:
        ov.close()
        egl.close()
    assert red[True] - red[False] > 60, red  # the error's line is longer: the place stands before it
