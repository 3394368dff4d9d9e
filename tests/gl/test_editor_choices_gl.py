"""The node editor panel draws parameters with choices as combo boxes (EGL: Mesa in CI, the NVIDIA
driver on the GPU machine): a text choice (FFT's ``Kind``) and an integer one, whose entries are
labelled by their names; both nodes are drawn in full."""

from __future__ import annotations

import pytest

from cudapatch import Block, BlockBuilder, DType

from ..unit.plan_engine import PlanOnlyEngine
from .test_editor_gl import _draw

pytestmark = pytest.mark.gl

PATCH = """\
[operators.fft]
type = "signal.FFT"
Kind = "c2r"

[operators.lanes]
type = "test.Lanes"
Lanes = "16"
"""


class Lanes(Block):
    """An integer parameter with choices (no kernel: only its widget matters here)."""

    type_name = "Lanes"

    def describe(self, b: BlockBuilder) -> None:
        b.scalar("Lanes", dtype=DType.UINT32, default=4, choices=(1, 4, 16))


def test_choices_are_drawn_as_combo_boxes():
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel

    reg = PluginHost().registry
    reg.add(Lanes, name="test.Lanes")
    patch = parse_patch(PATCH, registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    model = EditorModel(adapter, patch)
    views = {op: {p.name: p for p in n.params} for op, n in model.nodes().items()}
    assert views["fft"]["Kind"].widget == "enum" and views["fft"]["Kind"].value == "C2R"
    assert views["lanes"]["Lanes"].widget == "enum" and views["lanes"]["Lanes"].value == 16
    _, panel = _draw(model)  # imgui's combo takes the entries' names: integers would not draw
    assert {"fft", "lanes"} <= panel.drawn and set(panel.layout.nodes) == {"fft", "lanes"}
