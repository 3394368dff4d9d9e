"""The editor panel under EGL (Mesa in CI, the NVIDIA driver on the GPU machine): a node whose kernel
compiles is drawn in the Compiling colour, and in the OK colour once its compile has landed; a wire is
unlinked by dragging from its linked input pin into empty space, and by its menu's Unlink (mouse events
fed to imgui), each as one edit."""

from __future__ import annotations

import numpy as np
import pytest

from ..unit.test_editor_actions import FX, _CompilingEngine, _stats
from ..unit.test_editor_model import _open
from .test_editor_gl import _draw

pytestmark = pytest.mark.gl


def _pixels(img, at, color, width=16, tolerance=20):
    """Pixels of ``color`` in the title starting at ``at`` (tight: Compiling and Warning are both yellows)."""
    x, y = at
    line = img[int(y) : int(y) + 14, int(x) : int(x) + width].reshape(-1, 3)
    return int((np.abs(line - np.array(color[:3]) * 255).max(axis=1) < tolerance).sum())


def test_a_compiling_node_is_drawn_in_the_compiling_colour_until_its_kernel_lands(tmp_path):
    from cudapatch.interop.editor import STATE_COLORS

    engine = _CompilingEngine()
    _, adapter, _, model = _open(tmp_path, FX, engine=engine)
    engine.update()  # first compiles in flight
    model.refresh(_stats(adapter, "NotCompiled"))  # the panel's own refreshes (no rows) keep these states
    img, panel = _draw(model)
    at = panel.layout.titles["fx"]
    assert _pixels(img, at, STATE_COLORS["Compiling"]) > 3
    assert not _pixels(img, at, STATE_COLORS["OK"])
    engine.builder.land()
    model.refresh(_stats(adapter, "OK"))
    img, panel = _draw(model)
    at = panel.layout.titles["fx"]
    assert _pixels(img, at, STATE_COLORS["OK"]) > 3
    assert not _pixels(img, at, STATE_COLORS["Compiling"])


def test_dragging_from_a_linked_input_into_empty_space_unlinks_it_as_one_edit():
    from imgui_bundle import imgui

    from .test_editor_gl import _model

    model = _model()
    text = model.doc.text
    steps: list = []

    def each_frame(panel):
        i = len(steps)
        steps.append(i)
        io = imgui.get_io()
        if i == 2:  # the nodes are measured: over scale's linked input pin
            x, y = panel.layout.pins[("scale", "In", "in")]
            x += 3.0  # inside the pin's label, right of its wire end
            steps.append((x, y))
            io.add_mouse_pos_event(x, y)
        elif i == 4:
            io.add_mouse_button_event(0, True)
        elif 5 <= i < 25:  # down into the empty canvas below the nodes
            x, y = next(s for s in steps if isinstance(s, tuple))
            io.add_mouse_pos_event(x + 20.0 * (i - 4) / 20, y + 400.0 * (i - 4) / 20)
        elif i == 26:
            io.add_mouse_button_event(0, False)

    _, panel = _draw(model, frames=32, each_frame=each_frame)
    assert not model.links() and model.status == "unlink fill.Out -> scale.In"
    assert len(model._undo) == 1 and "fill.Out -> scale.In" not in model.doc.text
    assert model.undo() and model.doc.text == text and [str(lk) for lk in model.links()] == ["fill.Out -> scale.In"]


def test_the_wire_menus_unlink_removes_the_wire():
    from imgui_bundle import imgui

    from .test_editor_gl import _model

    model = _model()
    frames: list = []  # each frame's number; the wire's middle once measured

    def each_frame(panel):
        n = len([f for f in frames if isinstance(f, int)])
        frames.append(n)
        io = imgui.get_io()
        if n == 2:  # the nodes are measured: over the wire's middle (symmetric tangents pass through it)
            (ax, ay), (bx, by) = panel.layout.pins[("fill", "Out", "out")], panel.layout.pins[("scale", "In", "in")]
            frames.append(((ax + bx) / 2, (ay + by) / 2))
            io.add_mouse_pos_event((ax + bx) / 2, (ay + by) / 2)
        elif n == 4:
            io.add_mouse_button_event(1, True)
        elif n == 5:
            io.add_mouse_button_event(1, False)  # the wire's menu opens at the mouse
        elif n == 8:  # its second row: the wire's text, then Unlink
            x, y = next(f for f in frames if isinstance(f, tuple))
            io.add_mouse_pos_event(x + 30.0, y + imgui.get_style().window_padding.y + imgui.get_frame_height() * 1.5)
        elif n == 10:
            io.add_mouse_button_event(0, True)
        elif n == 11:
            io.add_mouse_button_event(0, False)

    _draw(model, frames=16, each_frame=each_frame)
    assert not model.links() and model.status == "unlink fill.Out -> scale.In" and len(model._undo) == 1
