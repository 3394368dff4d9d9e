"""Edits made through the node editor that fail to build, on a running engine: the node shows the
error, and what ran before keeps running. A Code edit that NVRTC rejects leaves the previous kernel in
place (its output still the previous kernel's result, and still following a Hot value upstream); a
link the build refuses (an input shorter than the kernel's launch) puts the reason on its node while the
other blocks' outputs stay as they were and keep updating."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Engine
from cudapatch.blocks.library.custom import DEFAULT_CUSTOM_CODE
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.host_plugin.editor_model import EditorModel

from .conftest import run_until

pytestmark = pytest.mark.gpu

N = 1000

PATCH = f"""\
links = ["src.Out -> fx.in", "src.Out -> a.In", "src.Out -> add.A", "src.Out -> add.B"]

[operators.src]
type = "core.Fill"
Count = {N}
Value = 2.0

[operators.fx]
type = "core.CustomKernel"

[operators.a]
type = "core.Scale"
Factor = 3.0

[operators.add]
type = "core.VectorAdd"

[operators.short]
type = "core.Fill"
Count = {N // 2}
Value = 1.0
"""


def _running(engine: Engine) -> tuple[EditorModel, HostAdapter]:
    reg = PluginHost().registry
    patch = parse_patch(PATCH, registry=reg)
    adapter = HostAdapter(engine, reg)
    apply_patch(adapter, patch)
    engine.update()
    model = EditorModel(adapter, patch)
    model.refresh(engine.stats())
    assert all(v.state == "OK" for v in model.nodes().values()), {k: v.message for k, v in model.nodes().items()}
    return model, adapter


def _reads(engine: Engine, adapter: HostAdapter, op: str, port: str, value: float) -> bool:
    """Whether ``op.port`` holds ``value`` in every element (after one more frame)."""
    return bool(np.allclose(engine.read(adapter.block(op), port), value, rtol=1e-6))


def _node(engine: Engine, model: EditorModel, op: str):
    model.refresh(engine.stats())
    return model.nodes()[op]


def test_a_code_edit_that_does_not_compile_keeps_the_previous_kernel(engine: Engine) -> None:
    model, adapter = _running(engine)
    edited = DEFAULT_CUSTOM_CODE.replace("in[i] * gain", "in[i] * gain + 1.0f")
    assert model.set_param("fx", "Code", edited)
    run_until(engine, lambda: _reads(engine, adapter, "fx", "out", 2.0 + 1.0))

    broken = edited.replace("in[i] * gain + 1.0f", "undefined_thing * gain + 1.0f")
    assert model.set_param("fx", "Code", broken)
    run_until(engine, lambda: _node(engine, model, "fx").state == "Error")
    view = _node(engine, model, "fx")
    line = next(i for i, ln in enumerate(broken.splitlines(), 1) if "undefined_thing" in ln)
    assert view.code_errors and view.code_errors[0].line == line, view.code_errors
    assert "undefined_thing" in view.code_errors[0].message and view.message

    # The previous kernel (``+ 1``) still runs: its result, and a Hot value upstream lands through it.
    for _ in range(3):
        engine.update()
    assert _reads(engine, adapter, "fx", "out", 2.0 + 1.0)
    assert model.set_param("src", "Value", 4.0)
    run_until(engine, lambda: _reads(engine, adapter, "fx", "out", 4.0 + 1.0))
    assert _reads(engine, adapter, "a", "Out", 4.0 * 3.0)
    assert _node(engine, model, "fx").state == "Error"  # still broken: the edit did not land


def test_a_link_the_build_refuses_shows_on_its_node_and_the_rest_keeps_running(engine: Engine) -> None:
    model, adapter = _running(engine)
    assert _reads(engine, adapter, "add", "Sum", 2.0 + 2.0) and _reads(engine, adapter, "a", "Out", 2.0 * 3.0)
    assert model.unlink_input("add", "B")
    # The editor's own checks pass (float into float, B free): the build is what refuses the short input.
    assert model.link_problem("short", "Out", "add", "B") is None
    assert model.connect("short", "Out", "add", "B")
    run_until(engine, lambda: _node(engine, model, "add").state == "Error")
    view = _node(engine, model, "add")
    assert f"{N // 2} elements" in view.message and f"needs {N}" in view.message, view.message
    assert all(v.state == "OK" for op, v in model.nodes().items() if op != "add")

    # The other blocks' outputs are as before, and a Hot value upstream still lands in them.
    for _ in range(3):
        engine.update()
    assert _reads(engine, adapter, "a", "Out", 2.0 * 3.0) and _reads(engine, adapter, "fx", "out", 2.0)
    assert model.set_param("src", "Value", 5.0)
    run_until(engine, lambda: _reads(engine, adapter, "a", "Out", 5.0 * 3.0))
    assert _reads(engine, adapter, "fx", "out", 5.0)
    assert _node(engine, model, "add").state == "Error"

    # Undone (the Hot value, the refused link, then the unlink), the link the build took is back: add
    # runs again, on the first value.
    assert [model.undo().message for _ in range(3)] == [
        "undone: set src.Value",
        "undone: link short.Out -> add.B",
        "undone: unlink src.Out -> add.B",
    ]
    run_until(engine, lambda: _node(engine, model, "add").state == "OK")
    run_until(engine, lambda: _reads(engine, adapter, "add", "Sum", 2.0 + 2.0))
    assert _reads(engine, adapter, "a", "Out", 2.0 * 3.0)
