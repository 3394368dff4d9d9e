"""The editor's Code error markers on a real engine: a CustomKernel edited to CUDA C++ that NVRTC
rejects, and an Expression edited to one that does not parse, put each error on the node at its line
and column (from the engine's own diagnostic, as the preview's editor reads it every frame), while the
previous kernel keeps running."""

from __future__ import annotations

import pytest

from cudapatch import Engine
from cudapatch.blocks.library.custom import DEFAULT_CUSTOM_CODE
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.host_plugin.editor_model import EditorModel

from .conftest import run_until

pytestmark = pytest.mark.gpu

PATCH = """\
[operators.src]
type = "core.Fill"
Count = 1000
Value = 2.0

[operators.fx]
type = "core.CustomKernel"

[operators.wave]
type = "core.Expression"
Code = "x * 2 + 1"
Inputs = "x"
"""


def _model(engine: Engine) -> EditorModel:
    reg = PluginHost().registry
    patch = parse_patch(PATCH, registry=reg)
    adapter = HostAdapter(engine, reg)
    apply_patch(adapter, patch)
    engine.update()
    model = EditorModel(adapter, patch)
    assert model.connect("src", "Out", "fx", "in") and model.connect("src", "Out", "wave", "x")
    engine.update()
    model.refresh(engine.stats())
    assert model.nodes()["fx"].code_errors == () and model.nodes()["wave"].code_errors == ()
    return model


def _errors(engine: Engine, model: EditorModel, op: str):
    def marked() -> bool:
        model.refresh(engine.stats())
        return bool(model.nodes()[op].code_errors)

    run_until(engine, marked)
    return model.nodes()[op].code_errors


def test_nvrtc_errors_of_a_custom_kernel_are_at_their_line_and_column(engine: Engine) -> None:
    model = _model(engine)
    broken = DEFAULT_CUSTOM_CODE.replace("in[i] * gain", "undefined_thing * gain")
    assert model.set_param("fx", "Code", broken)
    (error, *_) = _errors(engine, model, "fx")
    line = next(i for i, ln in enumerate(broken.splitlines(), 1) if "undefined_thing" in ln)
    assert error.line == line and "undefined_thing" in error.message, error
    assert error.column == broken.splitlines()[line - 1].index("undefined_thing") + 1, error
    assert model.nodes()["fx"].state == "Error"


def test_an_expression_error_is_at_its_column(engine: Engine) -> None:
    model = _model(engine)
    assert model.set_param("wave", "Code", "x * * 1")
    (error,) = _errors(engine, model, "wave")
    assert (error.line, error.column) == (1, 5) and "expected a value" in error.message, error
    # The running kernel is the previous one: the node's generated code is none while Code is broken.
    assert model.generated_code("wave") is None
    assert model.set_param("wave", "Code", "x * 3 + 1")
    run_until(engine, lambda: (model.refresh(engine.stats()), not model.nodes()["wave"].code_errors)[1])
    assert "x * 3 + 1" in model.generated_code("wave")
