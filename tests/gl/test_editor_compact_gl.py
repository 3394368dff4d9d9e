"""The node editor zoomed out (``fit_all``): nodes drawn compact from their measured geometry land where
the frame that measured them with imgui items put them, and the rendered frame has each wire where the
panel's layout says (read-back pixels, EGL)."""

from __future__ import annotations

import numpy as np
import pytest

from ..unit.plan_engine import PlanOnlyEngine
from .test_editor_gl import _draw

pytestmark = pytest.mark.gl


def _chain(n):
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel

    lines = ["[operators.s0]", 'type = "core.Fill"', ""]
    for i in range(1, n):
        lines += [f"[operators.s{i}]", 'type = "core.Scale"', ""]
    # Zigzag: every wire runs diagonally, so a wire end off its pin moves the wire's middle.
    lines += ["[editor.positions]"] + [f"s{i} = [{i * 300.0}, {(i % 2) * 400.0}]" for i in range(n)]
    reg = PluginHost().registry
    patch = parse_patch("\n".join(lines), registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    for i in range(n - 1):
        adapter.connect(f"s{i}", "Out", f"s{i + 1}", "In")
    return EditorModel(adapter, patch)


def test_compact_nodes_drawn_from_their_geometry_stay_where_they_were_measured():

    from cudapatch.interop.editor import LINK_COLOR, EditorPanel

    n = 12  # zoomed out to about 3 canvas units a pixel: compact, wires about a pixel wide
    model = _chain(n)
    layouts = []
    # fit (3 frames), then measured compact twice, then drawn from the geometry
    img, panel = _draw(
        model, 12, prepare=EditorPanel.fit_all, each_frame=lambda p: layouts.append((p.layout, set(p._compact)))
    )
    compact, drawn = panel.compact, set(panel.drawn)
    assert compact and drawn == {f"s{i}" for i in range(n)}
    last, cached = layouts[-1]
    assert cached == drawn  # every node drawn from its measured geometry
    # The last frame drawn with imgui items (before every node was cached) put everything at the same place.
    measured = next(lay for lay, c in reversed(layouts) if c != drawn)
    for table in ("nodes", "titles", "pins"):
        a, b = getattr(measured, table), getattr(last, table)
        assert a.keys() == b.keys(), table
        for key in a:
            assert np.allclose(a[key], b[key], atol=0.5), (table, key, a[key], b[key])
    assert LINK_COLOR[2] - LINK_COLOR[0] > 0.5
    for i in range(n):
        x0, y0, x1, y1 = last.nodes[f"s{i}"]
        tx, ty = last.titles[f"s{i}"]
        assert x0 <= tx < x1 and y0 <= ty < y1  # (the text itself is a few blurred pixels at this zoom)
    for i in range(n - 1):
        a, b = last.pins[(f"s{i}", "Out", "out")], last.pins[(f"s{i + 1}", "In", "in")]
        # The wire leaves the output to the right and enters the input from the left (horizontal there):
        # its hue just outside each node, level with the pin.
        for x, y in ((a[0] + 5, a[1]), (b[0] - 5, b[1])):
            near = img[int(y) - 2 : int(y) + 3, int(x) - 2 : int(x) + 3].reshape(-1, 3)
            # A wire a pixel wide is blended with the background: blue well above red.
            assert ((near[:, 2] - near[:, 0]) > 60).any(), f"no wire s{i} -> s{i + 1} at {(x, y)}"
