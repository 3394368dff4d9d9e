"""Expression blocks over vector inputs on a real GPU: float4, float3 and float2 inputs with a
per-element float mask, lane by lane, against NumPy (the f32 interpreter bit for bit where only
correctly rounded operations are used, float64 within a tolerance for the approximations), the PTX
path against the NVRTC path bit for bit, Code-tier edits and a bad edit that keeps the running
kernel, a chain of vector blocks with fusion on, and a 2-D float4 image through an Expression."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import BlockState, Engine, Expression, Scale
from cudapatch.blocks.library.image import Pattern
from cudapatch.expr import ExpressionError, evaluate

from .conftest import interpreted_then_jitted, run_until

pytestmark = pytest.mark.gpu

VEC = {2: "float2", 3: "float3", 4: "float4"}
# Correctly rounded operations only: the kernel's bits are the f32 interpreter's.
EXACT = "c * mask + d * Gain - where(mask > 0.5, Lift, 0.0) + float(index % 3) + fma(c, mask, d)"


def _vector_block(e: Engine, lanes: int, code: str, data: dict[str, np.ndarray], **kw: object) -> Expression:
    block = e.add(Expression(Code=code, Inputs=f"c: {VEC[lanes]}, mask, d: {VEC[lanes]}", **kw))  # type: ignore[arg-type]
    for port in block.inputs:
        e.bind(block, port.name, data[port.name])
    return block


def _data(rng: np.random.Generator, n: int, lanes: int) -> dict[str, np.ndarray]:
    return {
        "c": rng.standard_normal((n, lanes)).astype(np.float32),
        "mask": rng.random(n).astype(np.float32),
        "d": rng.standard_normal((1, lanes)).astype(np.float32),  # one element: broadcast to every element
    }


@pytest.mark.parametrize("compiler", ["ptx", "nvrtc"])
@pytest.mark.parametrize("lanes", [4, 3, 2])
def test_vector_inputs_with_a_scalar_mask_equal_numpy_bitwise(
    engine: Engine, rng: np.random.Generator, lanes: int, compiler: str
) -> None:
    n = 100_003
    data = _data(rng, n, lanes)
    block = _vector_block(engine, lanes, EXACT, data, Compiler=compiler, Gain=0.75, Lift=2.0)
    assert block.outputs[0].dtype.c_name == VEC[lanes]
    engine.update()
    got = engine.read(block, "Out")
    assert got.shape == (n, lanes) and got.dtype == np.float32
    program = block.source.program
    assert program is not None and program.lanes == lanes
    np.testing.assert_array_equal(got, evaluate(program, data, {"Gain": 0.75, "Lift": 2.0})["Out"])
    # the same formula written in NumPy (float32, lane by lane through broadcasting)
    f = np.float32
    c, m, d = data["c"], data["mask"][:, None], data["d"]
    fma = (c.astype(np.float64) * m + d).astype(np.float32)  # one rounding, as fma.rn
    idx = (np.arange(n) % 3).astype(np.float32)[:, None]
    want = (((c * m + d * f(0.75)) - np.where(m > 0.5, f(2.0), f(0.0))) + idx) + fma
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("lanes", [4, 2])
def test_vector_ptx_and_nvrtc_paths_give_the_same_bits_and_approximate_float64(
    engine: Engine, rng: np.random.Generator, lanes: int
) -> None:
    code = "c * sin(mask * Freq) + exp(d * 0.5) * mask"
    data = _data(rng, 65_536, lanes)
    fast = _vector_block(engine, lanes, code, data, Freq=3.0)
    ref = _vector_block(engine, lanes, code, data, Freq=3.0, Compiler="nvrtc")
    engine.update()
    got = engine.read(fast, "Out")
    np.testing.assert_array_equal(got, engine.read(ref, "Out"))
    c, m, d = (data[k].astype(np.float64) for k in ("c", "mask", "d"))
    want = c * np.sin(m[:, None] * 3.0) + np.exp(d * 0.5) * m[:, None]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_a_vector_code_edit_swaps_in_place_and_a_bad_edit_keeps_the_kernel(
    live_engine: Engine, rng: np.random.Generator
) -> None:
    e = live_engine
    c = rng.standard_normal((4096, 4)).astype(np.float32)
    mask = rng.random(4096).astype(np.float32)
    block = e.add(Expression(name="tint", Code="c * mask * Gain", Inputs="c: float4, mask", Gain=2.0))
    e.bind(block, "c", c)
    e.bind(block, "mask", mask)
    run_until(e, lambda: block.debug.state is BlockState.OK)
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), c * mask[:, None] * np.float32(2.0))
    graph, rebuilds = e.graph, e.counters.rebuilds
    block.set("Code", "c * mask * Gain + 1")
    run_until(e, lambda: e.counters.code_swaps == 1)
    e.update()
    assert e.graph is graph and e.counters.rebuilds == rebuilds
    want = c * mask[:, None] * np.float32(2.0) + np.float32(1.0)
    np.testing.assert_array_equal(e.read(block, "Out"), want)
    block.set("Code", "c * (mask + ")  # half-typed
    run_until(e, lambda: block.debug.state is BlockState.ERROR)
    diag = next(d for d in e.diagnostics(block) if d.code == "kernel-compile")
    assert "column 13" in diag.message
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), want)  # the previous kernel keeps running
    with pytest.raises(ExpressionError) as info:  # lanes that do not match: refused, nothing changes
        block.set("Inputs", "c: float4, mask: float2")
    assert info.value.param == "Inputs" and info.value.column == 12
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), want)
    block.set("Gain", -1.0)  # Hot: broadcast to every lane
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), c * mask[:, None] * np.float32(-1.0) + np.float32(1.0))


def test_a_chain_of_vector_expressions_runs_unfused_with_fusion_on(engine: Engine, rng: np.random.Generator) -> None:
    n = 50_000
    c = rng.standard_normal((n, 4)).astype(np.float32)
    raw = rng.random(n).astype(np.float32)
    gain = engine.add(Scale(name="gain", Factor=0.5))
    tint = engine.add(Expression(name="tint", Code="c * mask + Lift", Inputs="c: float4, mask", Lift=0.25))
    square = engine.add(Expression(name="square", Code="v * v", Inputs="v: float4"))
    engine.connect(gain, "Out", tint, "mask")
    engine.connect(tint, "Out", square, "v")
    engine.bind(gain, "In", raw)
    engine.bind(tint, "c", c)
    engine.update()
    assert not any(engine.diagnostics(b) for b in (gain, tint, square))
    t = c * (raw * np.float32(0.5))[:, None] + np.float32(0.25)
    np.testing.assert_array_equal(engine.read(square, "Out"), t * t)


def test_a_float4_image_goes_through_an_expression_keeping_its_shape(engine: Engine) -> None:
    pattern = engine.add(Pattern(name="cam", Format="rgba32f", Width=64, Height=48, Time=0.5))
    dim = engine.add(Expression(name="dim", Code="c * Amount", Inputs="c: float4", Amount=0.5))
    engine.connect(pattern, "Out", dim, "c")
    engine.keep(pattern, "Out")
    engine.update()
    src = engine.read(pattern, "Out")
    got = engine.read(dim, "Out")
    assert src.shape == got.shape == (48, 64, 4)
    np.testing.assert_array_equal(got, src * np.float32(0.5))


@pytest.mark.parametrize("lanes", [4, 3, 2])
def test_the_interpreter_gives_a_vector_kernels_bits(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, lanes: int
) -> None:
    """A vector edit's quick build run by the bytecode interpreter (its lane loop, no JIT) against the
    same program's generated PTX."""
    data = _data(rng, 50_001, lanes)
    code = "c * sin(mask * Freq) + exp(d * 0.5) * mask + " + EXACT
    out = interpreted_then_jitted(
        monkeypatch, lambda e: _vector_block(e, lanes, code, data, Freq=3.0, Gain=0.75, Lift=2.0)
    )
    assert out.shape == (50_001, lanes)
