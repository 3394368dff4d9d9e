"""The node editor's edits on a running engine take the cheapest tier: a parameter edit is Hot (the
running graph is patched: no new graph, no rebuild), a bypass is the Bypass tier (the block's nodes off,
its readers redirected: no new graph either), a link edit is a structure edit (one rebuild), and a Code
edit is the Code tier (the previous kernel runs, the node shows Compiling, until the new one is swapped
in: no new graph). Each is checked on the engine's counters and on the values the graph computes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from cudapatch import Engine
from cudapatch.blocks.library.custom import DEFAULT_CUSTOM_CODE
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.host_plugin.editor_model import EditorModel
from cudapatch.host_plugin.editor_views import COMPILING_EDIT

from .conftest import run_until

pytestmark = pytest.mark.gpu

PATCH = """\
links = ["fill.Out -> a.In", "a.Out -> b.In"]

[operators.fill]
type = "core.Fill"
Count = 10007
Value = 1.5

[operators.a]
type = "core.Scale"
Factor = 2.0

[operators.b]
type = "core.Scale"
Factor = 3.0

[operators.c]
type = "core.Scale"
Factor = 5.0
"""


def _running(engine: Engine, text: str = PATCH) -> tuple[EditorModel, HostAdapter]:
    """``text`` applied to ``engine`` and built, with the editor's model of it."""
    reg = PluginHost().registry
    patch = parse_patch(text, registry=reg)
    adapter = HostAdapter(engine, reg)
    apply_patch(adapter, patch)
    engine.update()
    return EditorModel(adapter, patch), adapter


def _counts(engine: Engine) -> tuple[int, int, int, int]:
    """What makes or reshapes a graph: rebuilds, executables instantiated or updated, Warm resizes."""
    c = engine.counters
    return c.rebuilds, c.instantiations, c.exec_updates, c.warm_resizes


def test_editor_edits_take_the_cheapest_tier(unfused_engine: Engine) -> None:
    engine = unfused_engine  # a -> b would fuse: bypassing a fused member builds once (test_bypass_gpu.py)
    model, adapter = _running(engine)
    b, c = adapter.block("b"), adapter.block("c")
    np.testing.assert_allclose(engine.read(b, "Out"), np.full(10007, 1.5 * 2 * 3), rtol=1e-6)
    graph, counters = engine.graph, engine.counters
    built, hot, bypassed = _counts(engine), counters.hot_updates, counters.bypass_updates

    # A value: Hot, patched into the running graph.
    assert model.set_param("a", "Factor", 4.0)
    engine.update()
    np.testing.assert_allclose(engine.read(b, "Out"), np.full(10007, 1.5 * 4 * 3), rtol=1e-6)
    assert engine.graph is graph and _counts(engine) == built and counters.hot_updates > hot

    # A slider drag (live values, one edit when released): Hot at every value.
    for factor in (5.0, 6.0, 7.0):
        assert model.set_param("a", "Factor", factor, live=True)
        engine.update()
    assert model.end_live() and model.can_undo
    np.testing.assert_allclose(engine.read(b, "Out"), np.full(10007, 1.5 * 7 * 3), rtol=1e-6)
    assert engine.graph is graph and _counts(engine) == built

    # A bypass: the Bypass tier (b reads fill's output), and back on; no new graph.
    engine.output(b, "Out").fill_bytes(0xFF)  # poison: the bypassed frame must write every element
    assert model.bypass("a")
    engine.update()
    np.testing.assert_allclose(engine.read(b, "Out"), np.full(10007, 1.5 * 3), rtol=1e-6)
    assert model.bypass("a", False)
    engine.update()
    np.testing.assert_allclose(engine.read(b, "Out"), np.full(10007, 1.5 * 7 * 3), rtol=1e-6)
    assert engine.graph is graph and graph.instantiations == 1 and _counts(engine) == built
    assert counters.bypass_updates == bypassed + 2

    # A link: a structure edit, one build (c, left out while its input was unlinked, runs from then on).
    assert model.connect("fill", "Out", "c", "In")
    engine.update()
    rebuilds, _, _, resizes = _counts(engine)
    assert (rebuilds - built[0]) + (resizes - built[3]) == 1
    np.testing.assert_allclose(engine.read(c, "Out"), np.full(10007, 1.5 * 5), rtol=1e-6)
    np.testing.assert_allclose(engine.read(b, "Out"), np.full(10007, 1.5 * 7 * 3), rtol=1e-6)
    model.refresh(engine.stats())
    assert {op: v.state for op, v in model.nodes().items()} == {op: "OK" for op in ("fill", "a", "b", "c")}


FX = """\
links = ["fill.Out -> fx.in"]

[operators.fill]
type = "core.Fill"
Count = 4099
Value = 1.5

[operators.fx]
type = "core.CustomKernel"
"""


def _settled(engine: Engine) -> bool:
    """Built, with nothing compiling or waiting to be built."""
    waiting = engine.building or engine.context.dirty.structure or engine.kernels.pending
    return engine.graph is not None and not waiting


def test_a_code_edit_shows_compiling_while_the_previous_kernel_runs_then_swaps_in(
    live_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = live_engine  # compiles in the background, as a live host's
    model, adapter = _running(engine, FX)
    fx = adapter.block("fx")
    run_until(engine, lambda: _settled(engine) and fx.debug.state.value == "OK")
    before = engine.read(fx, "out").astype(np.float64)
    model.refresh(engine.stats())
    assert (model.nodes()["fx"].state, model.nodes()["fx"].compiling) == ("OK", "")
    graph, built, swaps = engine.graph, _counts(engine), engine.counters.code_swaps

    # Hold the kernel builder's service thread at its next compile: the edit stays in flight.
    gate = threading.Event()
    builder = engine.kernels.builder
    start = builder._start

    def held(req):
        assert gate.wait(30.0)
        start(req)

    monkeypatch.setattr(builder, "_start", held)
    try:
        assert model.set_param("fx", "Code", DEFAULT_CUSTOM_CODE.replace("in[i] * gain", "in[i] * gain + 1.0f"))
        for _ in range(3):
            engine.update()
        model.refresh(engine.stats())
        view = model.nodes()["fx"]
        assert (view.state, view.compiling) == ("Compiling", COMPILING_EDIT)
        assert fx.debug.state.value == "OK"  # the engine runs the previous version meanwhile
        np.testing.assert_allclose(engine.read(fx, "out"), before, rtol=1e-6)
    finally:
        gate.set()
    # (The block's first version may itself have come as a swap: count from before the edit.)
    run_until(engine, lambda: _settled(engine) and engine.counters.code_swaps > swaps)
    engine.update()  # a frame with the new kernel (a swap made between frames lands in the next one)
    run_until(engine, lambda: (model.refresh(engine.stats()), model.nodes()["fx"].state == "OK")[1])
    assert model.nodes()["fx"].compiling == ""
    np.testing.assert_allclose(engine.read(fx, "out"), before + 1.0, rtol=1e-6)
    assert engine.graph is graph and _counts(engine) == built  # swapped into the running graph
