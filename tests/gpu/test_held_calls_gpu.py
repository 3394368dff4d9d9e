"""The frame path's driver calls on a real GPU (``kernels.held_calls``): a graph's Hot patches and
bypass toggles go through the driver's own entry points with the GIL held (on plain values where
the graph keeps them), land as the bindings' calls do, keep every other Python thread out while they
run, and fail with the driver's error name."""

from __future__ import annotations

import gc
import sys
import threading

import numpy as np
import pytest
from cuda.bindings import driver as d

from cudapatch import Engine, Scale
from cudapatch.errors import CudaError
from cudapatch.kernels._driver import check
from cudapatch.kernels.held_calls import RawCalls, frame_calls

from .conftest import run_until
from .test_bypass_gpu import _chain

pytestmark = pytest.mark.gpu


def test_the_graph_patches_and_toggles_through_held_calls(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine
    x = rng.standard_normal(4099).astype(np.float32)
    s1, s2 = _chain(engine, x)
    g = engine.graph
    held = frame_calls()
    assert held.set_params is not d.cuGraphExecKernelNodeSetParams, "this driver gives the entry points"
    assert held.set_enabled is not d.cuGraphNodeSetEnabled and held.launch is d.cuGraphLaunch
    assert (g._launch, g._set_params, g._set_enabled, g._raw) == tuple(held) and held.raw is not None
    assert g._exec_i == int(g.handle)
    made: list[str] = []  # the calls on plain values the frames make, counted on the way through

    def counted(name: str, fn):
        return lambda *a: (made.append(name), fn(*a))[1]

    g._raw = RawCalls(counted("set_params", held.raw.set_params), counted("set_enabled", held.raw.set_enabled))
    x64 = x.astype(np.float64)
    for factor in rng.uniform(-4, 4, size=5):  # Hot: one held cuGraphExecKernelNodeSetParams each
        engine.output(s2, "Out").fill_bytes(0xFF)  # poison: the frame must write every element
        s1.set("Factor", float(factor))
        engine.update()
        np.testing.assert_allclose(engine.read(s2, "Out"), x64 * float(np.float32(factor)) * 3, rtol=1e-6)
    assert made.count("set_params") == 4  # (a key's first patch goes the general way: on handles)
    engine.output(s2, "Out").fill_bytes(0xFF)
    s2.enabled = False  # Bypass: held cuGraphNodeSetEnabled; s2's output is s1's
    engine.update()
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * float(np.float32(factor)), rtol=1e-6)
    assert engine.graph is g and g.instantiations == 1


def test_toggles_call_the_held_entry_points_on_plain_values(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine
    x = rng.standard_normal(4099).astype(np.float32)
    s1, s2 = _chain(engine, x)
    s3 = engine.add(Scale(name="s3", Factor=5.0))
    engine.connect(s2, "Out", s3, "In")
    s2.enabled = False  # (carried, maybe, until the build that gives its values buffers of their own lands)
    run_until(engine, lambda: not engine.building and engine.graph is not None and engine.graph.bypass.disabled)
    g = engine.graph
    raw = g._raw
    assert raw is not None and g._exec_i == int(g.handle)
    made: list[str] = []  # the calls on plain values the frames make, counted on the way through

    def counted(name: str, fn):
        return lambda *a: (made.append(name), fn(*a))[1]

    g._raw = RawCalls(counted("set_params", raw.set_params), counted("set_enabled", raw.set_enabled))
    x64 = x.astype(np.float64)
    for on in (True, False, True, False, True):  # s2's node on or off, s3 reading s2's output or s1's
        engine.output(s3, "Out").fill_bytes(0xFF)  # poison: the frame must write every element
        del made[:]
        s2.enabled = on
        engine.update()
        assert made == ["set_enabled", "set_params"], made
        np.testing.assert_allclose(engine.read(s3, "Out"), x64 * 2 * (3 if on else 1) * 5, rtol=1e-6)
    assert engine.graph is g and g.instantiations == 1
    engine.close()  # the executable destroyed: the graph keeps no value for it
    assert g._raw is None


def test_held_calls_keep_other_threads_out(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine
    _chain(engine, rng.standard_normal(1024).astype(np.float32))
    g = engine.graph
    node = next(n for n in g._nodes if getattr(n, "params", None) is not None)
    calls = frame_calls()
    set_params, set_enabled = calls.set_params, calls.set_enabled
    gate, ran = threading.Lock(), []

    def waiter() -> None:
        with gate:  # blocked here (without the GIL) until the gate opens; then it needs the GIL to go on
            ran.append(True)

    engine.wait_ready()  # no background work that runs Python while the interval is long
    engine._worker.wait(10.0)
    saved = sys.getswitchinterval()
    gate.acquire()
    collecting = gc.isenabled()
    gc.disable()  # (a finalizer's driver call in the loop would let go of the GIL: not a held call)
    sys.setswitchinterval(30.0)  # no forced switch in this test: the waiter runs only where we let go
    thread = threading.Thread(target=waiter, daemon=True)
    try:
        thread.start()
        gate.release()  # the waiter wakes and waits for the GIL, which this thread keeps...
        for _ in range(200):  # ... unless a call lets go of it
            check(set_params(g.handle, node.handle, node.params), "cuGraphExecKernelNodeSetParams")
            check(set_enabled(g.handle, node.handle, 1), "cuGraphNodeSetEnabled")
        during = list(ran)
    finally:
        sys.setswitchinterval(saved)
        if collecting:
            gc.enable()
        thread.join(10.0)  # (lets go of the GIL: the waiter runs now)
    assert during == [], "a held call let another thread run"
    assert ran == [True]
    engine.synchronize()


def test_a_held_call_fails_with_the_drivers_error_name(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine
    _chain(engine, rng.standard_normal(256).astype(np.float32))
    set_enabled = frame_calls().set_enabled
    result = set_enabled(engine.graph.handle, d.CUgraphNode(), 1)  # no such node
    assert type(result[0]) is int and result[0] != 0
    with pytest.raises(CudaError) as info:
        check(result, "cuGraphNodeSetEnabled")
    assert info.value.name == "CUDA_ERROR_INVALID_VALUE" and "cuGraphNodeSetEnabled" in str(info.value)
    engine.update()  # the graph runs on
    engine.synchronize()
