"""Regions in the node editor panel, rendered headless (EGL: Mesa in CI, the NVIDIA driver on the GPU
machine): a patch with a For region draws a group around the region's node and its body, nested
regions nest, wires into and out of a body are drawn, a While stopped at Max says so in the warning
colour, and dragging a group's title moves it with what it holds as one edit. Checked in the read-back
pixels at the places the panel's layout reports (not against a golden image)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from ..unit.plan_engine import PlanOnlyEngine
from .test_editor_gl import ROOT, _draw, _near

pytestmark = pytest.mark.gl

PATCH = """\
links = ["fill.Out -> a.In", "a.Out -> b.In", "b.Out -> after.In"]

[operators.fill]
type = "core.Fill"
Count = 64

[operators.loop]
type = "core.For"
Count = 4

[operators.a]
type = "core.Scale"
region = "loop"

[operators.b]
type = "core.Scale"
region = "loop"

[operators.after]
type = "core.Scale"
"""


class _Loops(PlanOnlyEngine):
    """The engine's iterations API (``engine.iterations``), answered with what the test sets."""

    def __init__(self) -> None:
        super().__init__()
        self.ran: dict[str, int] = {}

    def iterations(self, block):
        return self.ran.get(block.name)


def _model(text=PATCH, engine=None):
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel

    reg = PluginHost().registry
    patch = parse_patch(text, registry=reg)
    adapter = HostAdapter(engine or PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    adapter.engine.update()
    return EditorModel(adapter, patch)


def _inside(outer, inner, by=1.0):
    """Whether rectangle ``inner`` lies inside ``outer``, ``by`` pixels from its edges."""
    x0, y0, x1, y1 = outer
    return x0 + by <= inner[0] and y0 + by <= inner[1] and inner[2] + by <= x1 and inner[3] + by <= y1


def test_a_for_region_draws_as_a_group_around_its_body():
    from cudapatch.interop.editor import GROUP_COLORS, LINK_COLOR, STATE_COLORS

    model = _model()
    a = model.nodes()["a"]
    a.gpu_ms, a.runs = 0.4, 4  # as refresh takes them from a frame's statistics: drawn as 4 runs of 0.1 ms
    img, panel = _draw(model, frames=4)
    layout = panel.layout
    assert set(layout.groups) == {"loop"}
    group = layout.groups["loop"]
    for op in ("loop", "a", "b"):  # the region's own node and its body lie inside the group
        assert _inside(group, layout.nodes[op]), (op, group, layout.nodes[op])
    for op in ("fill", "after"):
        x0, y0, x1, y1 = layout.nodes[op]
        assert x1 <= group[0] or x0 >= group[2] or y1 <= group[1] or y0 >= group[3], op
    # The title, in the region's state colour (OK: green), at the top of the group.
    tx, ty = layout.group_titles["loop"]
    assert group[0] <= tx < group[2] and group[1] <= ty < layout.nodes["loop"][1]
    ok = np.array(STATE_COLORS["OK"][:3]) * 255
    title = img[int(ty) : int(ty) + 14, int(tx) : int(tx) + 40].reshape(-1, 3)
    assert (np.abs(title - ok).max(axis=1) < 40).sum() > 5
    # The group's area is tinted with the For colour: inside it, away from the nodes, the canvas is
    # greener than the plain canvas outside it.
    tint = np.array(GROUP_COLORS["for"][0][:3])
    ax = int((layout.nodes["a"][2] + group[2]) / 2)  # right of a, below b
    ay = int(layout.nodes["a"][3] - 5)
    assert not any(x0 <= ax <= x1 and y0 <= ay <= y1 for x0, y0, x1, y1 in layout.nodes.values())
    inside_px = img[ay - 2 : ay + 3, ax - 2 : ax + 3].reshape(-1, 3).mean(axis=0)
    outside_px = img[int(group[3]) + 20 : int(group[3]) + 25, int(group[0]) + 5 : int(group[0]) + 10]
    outside_px = outside_px.reshape(-1, 3).mean(axis=0)
    assert np.dot(inside_px - outside_px, tint - tint.mean()) > 5, (inside_px, outside_px)
    # Wires into and out of the body are drawn as any other wire.
    link = np.array(LINK_COLOR[:3]) * 255
    for (s, sp), (d, dp) in ((("fill", "Out"), ("a", "In")), (("b", "Out"), ("after", "In"))):
        p, q = layout.pins[(s, sp, "out")], layout.pins[(d, dp, "in")]
        assert _near(img, (p[0] + q[0]) / 2, (p[1] + q[1]) / 2, 3, lambda px: np.abs(px - link).max(axis=1) < 50)


def test_nested_regions_draw_nested_groups():
    b = '[operators.b]\ntype = "core.Scale"\nregion = '
    text = PATCH.replace(b + '"loop"', b + '"inner"')
    text += '\n[operators.inner]\ntype = "core.For"\nregion = "loop"\n'
    model = _model(text)
    _, panel = _draw(model, frames=4)
    groups, nodes = panel.layout.groups, panel.layout.nodes
    assert set(groups) == {"loop", "inner"}
    assert _inside(groups["loop"], groups["inner"])
    assert _inside(groups["inner"], nodes["b"]) and _inside(groups["inner"], nodes["inner"])
    assert _inside(groups["loop"], nodes["a"]) and not _inside(groups["inner"], nodes["a"], 0.0)


def test_placing_a_node_in_a_region_grows_its_group_around_it():
    model = _model()
    _, panel = _draw(model, frames=4)
    before = panel.layout.groups["loop"]
    # Where the node menu's "Move into region > loop" puts it: right of what the group holds, inside it.
    assert model.place("after", "loop", position=panel._spot_in("loop"))
    _, panel = _draw(model, frames=4)
    group = panel.layout.groups["loop"]
    assert _inside(group, panel.layout.nodes["after"]) and group[2] > before[2]
    # "Move out of loop": just right of the group, at the top level.
    assert model.place("after", None, position=panel._spot_out("loop", "after"))
    _, panel = _draw(model, frames=4)
    assert panel.layout.nodes["after"][0] >= panel.layout.groups["loop"][2]
    assert panel.layout.groups["loop"] == pytest.approx(before)  # back around what it held before


def test_a_while_stopped_at_max_says_so_in_the_warning_colour():
    from cudapatch.interop.editor import STATE_COLORS

    text = PATCH + '\n[operators.solve]\ntype = "core.While"\nMax = 50\n'
    engine = _Loops()
    model = _model(text, engine)
    engine.ran.update(loop=4, solve=50)
    img, panel = _draw(model, frames=4)
    warn = np.array(STATE_COLORS["Warning"][:3]) * 255
    for region, stopped in (("solve", True), ("loop", False)):
        tx, ty = panel.layout.group_titles[region]
        line = img[int(ty) + 15 : int(ty) + 30, int(tx) : int(tx) + 120].reshape(-1, 3)  # the state line
        assert ((np.abs(line - warn).max(axis=1) < 40).sum() > 5) == stopped, region
    assert model.nodes()["solve"].iterations == (50, 50) and model.nodes()["loop"].iterations == (4, 4)


def test_dragging_a_group_title_moves_it_with_its_body_as_one_edit():
    from imgui_bundle import imgui

    model = _model()
    start = {op: v.position for op, v in model.nodes().items()}
    steps: list = []

    def each_frame(panel):
        i = len(steps)
        steps.append(i)
        io = imgui.get_io()
        if i == 2:  # the group is measured: press on its title strip, right of the title text
            tx, ty = panel.layout.group_titles["loop"]
            steps.append((tx + 150.0, ty + 5.0))
            io.add_mouse_pos_event(tx + 150.0, ty + 5.0)
        elif i == 4:
            io.add_mouse_button_event(0, True)
        elif 5 <= i < 25:
            x, y = next(s for s in steps if isinstance(s, tuple))
            k = (i - 4) / 20
            io.add_mouse_pos_event(x + 160.0 * k, y + 80.0 * k)
        elif i == 26:
            io.add_mouse_button_event(0, False)

    _, panel = _draw(model, frames=32, each_frame=each_frame)
    moved = {op: (v.position[0] - start[op][0], v.position[1] - start[op][1]) for op, v in model.nodes().items()}
    dx, dy = moved["loop"]
    assert dx > 100 and dy > 40  # (snapped to the editor's grid)
    assert moved["a"] == pytest.approx((dx, dy)) and moved["b"] == pytest.approx((dx, dy))
    assert moved["fill"] == (0.0, 0.0) and moved["after"] == (0.0, 0.0)
    assert len(model._undo) == 1 and model.status == "move 3 nodes"
    assert _inside(panel.layout.groups["loop"], panel.layout.nodes["a"])
    model.undo()
    assert {op: v.position for op, v in model.nodes().items()} == start


def test_a_group_outside_the_window_is_not_drawn_and_one_in_view_submits_what_it_holds():
    text = PATCH + '\n[operators.far]\ntype = "core.For"\n\n[operators.deep]\ntype = "core.Scale"\nregion = "far"\n'
    text += "\n[editor.positions]\nfar = [6000.0, 40.0]\ndeep = [6000.0, 300.0]\n"
    model = _model(text)
    _, panel = _draw(model, frames=5)
    assert "loop" in panel.layout.groups and "far" not in panel.layout.groups
    assert not {"far", "deep"} & (panel.drawn | panel.stubs)
    assert {"loop", "a", "b"} <= panel.drawn | panel.stubs


def _teal(img: np.ndarray) -> np.ndarray:
    """Pixels of a For group's tint over the editor's canvas (not a wire, not a title: those are brighter)."""
    r, g, b = img[..., 0], img[..., 1], img[..., 2]
    return (g > r + 30) & (np.abs(g - b) < 25) & (g < 130)


@pytest.mark.gpu
def test_cli_headless_editor_draws_the_reaction_diffusion_loop_as_a_group(tmp_path):
    """``cudapatch run --headless --editor`` on the For example: the editor in the PNG shows the For
    group's tint over its canvas (the right 62% of the frame); the preview on the left has none."""
    from cudapatch.interop import read_png

    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    patch = ROOT / "examples" / "10_reaction_diffusion.toml"
    text = patch.read_text()
    cmd = [sys.executable, "-m", "cudapatch", "run", str(patch), "--headless", "--editor", "--frames", "20"]
    cmd += ["--out", str(tmp_path / "out"), "--size", "1280x720", "--no-overlay"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr
    img = read_png(tmp_path / "out" / "frame_00020.png")[..., :3].astype(int)
    assert _teal(img[60:700, 500:1270]).mean() > 0.03  # about 0.14 when drawn without a GPU (tests above)
    assert patch.read_text() == text  # opening the editor writes nothing


def test_zoomed_out_a_group_keeps_its_frame_and_shows_its_title_large_above_it():
    from cudapatch.interop.editor import GROUP_COLORS, EditorPanel

    lines = ["[operators.s0]", 'type = "core.Fill"', "", "[operators.loop]", 'type = "core.For"', ""]
    for i in range(1, 12):
        lines += [f"[operators.s{i}]", 'type = "core.Scale"', *(['region = "loop"'] if 4 <= i < 8 else []), ""]
    text = "\n".join(lines)
    links = [f"s{i}.Out -> s{i + 1}.In" for i in range(11)]
    model = _model("links = [" + ", ".join(f'"{lk}"' for lk in links) + "]\n\n" + text)
    img, panel = _draw(model, 12, prepare=EditorPanel.fit_all)
    assert panel.compact and set(panel.layout.groups) == {"loop"}
    group = panel.layout.groups["loop"]
    for op in ("loop", "s4", "s7"):
        assert _inside(group, panel.layout.nodes[op], 0.0), op
    border = np.array(GROUP_COLORS["for"][1][:3]) * 255
    x0, y0 = int(group[0]), int(group[1])
    hint = img[max(0, y0 - 20) : y0 - 2, x0 : x0 + 120].reshape(-1, 3)  # the hint's text, above the frame
    assert (np.abs(hint - border).max(axis=1) < 60).sum() > 5
