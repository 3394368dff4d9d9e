"""The editor panel's keys and its append-fill bars under EGL (Mesa in CI, the NVIDIA driver on the GPU
machine), with key events fed to imgui as the window backend feeds them: F2 hides the panel and shows
it again, Ctrl+Z undoes the last edit and Ctrl+Y redoes it (in the model and in the patch file), and a
node with an append output draws its fill as a bar as long as the fill."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch.engine.profiling import AppendStats

from ..unit.test_editor_fill_and_shapes import FILTER, _stats
from ..unit.test_editor_model import _open
from .test_editor_gl import _draw, _model

pytestmark = pytest.mark.gl


def _keys(presses: dict[int, tuple]):
    """An ``each_frame`` that, after frame ``i`` in ``presses``, presses its keys (modifiers first) and
    releases them after the next frame: imgui sees each press in exactly one frame."""
    from imgui_bundle import imgui

    held: list = []
    frame = [0]

    def each_frame(panel):
        io = imgui.get_io()
        i = frame[0]
        frame[0] += 1
        for key in reversed(held):
            io.add_key_event(key, False)
        held.clear()
        for key in presses.get(i, ()):
            io.add_key_event(key, True)
            held.append(key)

    return each_frame


def _green(img, layout) -> int:
    """Pixels of the OK colour in the node titles where the layout last placed them."""
    from cudapatch.interop.editor import STATE_COLORS

    ok = np.array(STATE_COLORS["OK"][:3]) * 255
    total = 0
    for op, (x, y) in layout.titles.items():
        title = img[int(y) : int(y) + 14, int(x) : int(x) + 8 * len(op)].reshape(-1, 3)
        total += int((np.abs(title - ok).max(axis=1) < 40).sum())
    return total


def test_f2_hides_the_panel_and_shows_it_again():
    from imgui_bundle import imgui

    f2 = (imgui.Key.f2,)
    img, panel = _draw(_model(), frames=6, each_frame=_keys({3: f2}))
    assert not panel.visible
    assert img.max() == 0  # nothing drawn over the cleared framebuffer
    img, panel = _draw(_model(), frames=9, each_frame=_keys({3: f2, 6: f2}))
    assert panel.visible
    assert _green(img, panel.layout) > 10


def test_ctrl_z_undoes_the_last_edit_and_ctrl_y_redoes_it(tmp_path):
    from imgui_bundle import imgui

    path, _, _, model = _open(tmp_path)
    before = path.read_text()
    assert model.connect("scale", "Out", "add", "B")
    after = path.read_text()
    assert "scale.Out -> add.B" in after

    def links():
        return sorted(str(lk) for lk in model.links())

    z, y = (imgui.Key.mod_ctrl, imgui.Key.z), (imgui.Key.mod_ctrl, imgui.Key.y)
    _draw(model, frames=6, each_frame=_keys({3: z}))
    assert model.status == "undone: link scale.Out -> add.B"
    assert links() == ["fill.Out -> scale.In"] and path.read_text() == before
    _draw(model, frames=6, each_frame=_keys({3: y}))
    assert model.status == "redone: link scale.Out -> add.B"
    assert links() == ["fill.Out -> scale.In", "scale.Out -> add.B"] and path.read_text() == after
    # Without Ctrl the letters are no shortcut: nothing is undone.
    _draw(model, frames=6, each_frame=_keys({3: (imgui.Key.z,)}))
    assert path.read_text() == after and model.can_undo and not model.can_redo


def test_an_append_output_draws_its_fill_as_a_bar(tmp_path):
    from imgui_bundle import imgui

    _, adapter, _, model = _open(tmp_path, FILTER)
    adapter.engine.update()
    colour: list = []

    def read_colour(panel):
        if not colour:
            c = imgui.get_style().color_(imgui.Col_.plot_histogram)
            colour.append(np.array([c.x, c.y, c.z]) * 255)

    def bar(fill: dict) -> int:
        """Pixels of the bar colour inside the filter node, with the fill ``fill`` reported."""
        model.refresh(_stats(adapter, {"keep": fill}))
        img, panel = _draw(model, frames=4, each_frame=read_colour)
        x0, y0, x1, y1 = (int(v) for v in panel.layout.nodes["keep"])
        area = img[y0:y1, x0:x1].reshape(-1, 3)
        return int((np.abs(area - colour[0]).max(axis=1) < 30).sum())

    quarter = bar({"Kept": AppendStats(32, 128, False)})
    three_quarters = bar({"Kept": AppendStats(96, 128, False)})
    none = bar({})
    assert none == 0 and quarter > 50
    # The bar's filled part grows with the fill: three times the count, about three times the pixels
    # (the label drawn over it takes a few).
    assert 2.0 * quarter < three_quarters < 4.0 * quarter
