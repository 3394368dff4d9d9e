"""The Expression block on a real GPU: results against NumPy (float64, and the f32 interpreter bit
for bit where only correctly rounded operations are used), the PTX path against the NVRTC path bit
for bit, Hot scalars, Code-tier edits, bad edits of each kind (syntax, unknown function or name,
type, a port's name) that keep the running kernel, name changes, and names declared by Inputs and
Scalars."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import BlockState, Engine, Expression
from cudapatch.expr import evaluate

from .conftest import interpreted_then_jitted, run_until

pytestmark = pytest.mark.gpu

# Expressions of correctly rounded operations only: the kernel's bits are the f32 interpreter's.
EXACT = [
    "a * x + b",
    "fma(a, x, b) - a / (abs(x) + 1) + sqrt(abs(b))",
    "clamp(x, -0.5, Hi) + mix(a, b, 0.25) + floor(x * 3) + fract(x) + step(0, x) + smoothstep(-1, 1, b)",
    "where(x > a and not (b < 0), x, -a) + float(index % 7) + int(x * 10) + min(a, b) + max(x, b)",
]
# Expressions with the hardware approximations: compared with float64 NumPy within a tolerance.
APPROX = [
    ("a * sin(x * Freq) + b", lambda a, x, b, f: a * np.sin(x * f) + b),
    ("cos(x * 4) + exp(x) + log(abs(a) + 1)", lambda a, x, b, f: np.cos(x * 4) + np.exp(x) + np.log(np.abs(a) + 1)),
    # tan(x / 4) stays far from its poles for normal x, where an argument's rounding would be magnified
    ("pow(abs(x) + 0.5, 1.5) + tan(x * 0.25)", lambda a, x, b, f: (np.abs(x) + 0.5) ** 1.5 + np.tan(x * 0.25)),
]


def _inputs(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    return {k: rng.standard_normal(n).astype(np.float32) for k in ("a", "x", "b")}


def _expression(e: Engine, code: str, data: dict[str, np.ndarray], **kw: object) -> Expression:
    """An Expression of ``code`` reading ``data`` by port name; of the scalars in ``kw``, those it has."""
    compiler = str(kw.pop("Compiler", "ptx"))
    block = e.add(Expression(Code=code, Compiler=compiler))
    for name, value in kw.items():
        if name in block.params:
            block.set(name, value)
    for port in block.inputs:
        e.bind(block, port.name, data[port.name])
    return block


@pytest.mark.parametrize("code", EXACT)
def test_correctly_rounded_expressions_equal_the_f32_interpreter_bitwise(
    engine: Engine, rng: np.random.Generator, code: str
) -> None:
    data = _inputs(rng, 100_003)
    block = _expression(engine, code, data, Hi=0.75)
    engine.update()
    engine.synchronize()
    got = engine.read(block, "Out")
    program = block.source.program
    assert program is not None
    scalars = {name: block.get(name) for name in program.scalars}
    np.testing.assert_array_equal(got, evaluate(program, data, scalars)["Out"])
    if code in EXACT[:2]:  # no floor, int or comparison, whose f32 and f64 answers part at the edges
        ref64 = evaluate(program, data, scalars, dtype=np.float64)["Out"]
        np.testing.assert_allclose(got, ref64, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(("code", "ref"), APPROX)
def test_approximated_functions_against_float64(engine: Engine, rng: np.random.Generator, code: str, ref) -> None:
    data = _inputs(rng, 65_536)
    block = _expression(engine, code, data, Freq=3.0)
    engine.update()
    got = engine.read(block, "Out").astype(np.float64)
    a, x, b = (data[k].astype(np.float64) for k in ("a", "x", "b"))
    np.testing.assert_allclose(got, ref(a, x, b, 3.0), rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("code", [*EXACT, *(c for c, _ in APPROX)])
def test_ptx_and_nvrtc_paths_give_the_same_bits(engine: Engine, rng: np.random.Generator, code: str) -> None:
    data = _inputs(rng, 10_000)
    fast = _expression(engine, code, data, Hi=0.5, Freq=2.0)
    ref = _expression(engine, code, data, Hi=0.5, Freq=2.0, Compiler="nvrtc")
    engine.update()
    np.testing.assert_array_equal(engine.read(fast, "Out"), engine.read(ref, "Out"))


def test_one_element_inputs_broadcast_and_no_input_uses_count(engine: Engine, rng: np.random.Generator) -> None:
    x = rng.standard_normal(5000).astype(np.float32)
    block = engine.add(Expression(Code="x * c + Offset", Offset=0.25))
    engine.bind(block, "x", x)
    engine.bind(block, "c", np.array([3.0], np.float32))
    ramp = engine.add(Expression(Code="index * Step", Count=777, Step=0.5))
    engine.update()
    np.testing.assert_array_equal(engine.read(block, "Out"), x * np.float32(3.0) + np.float32(0.25))
    np.testing.assert_array_equal(engine.read(ramp, "Out"), np.arange(777, dtype=np.float32) * np.float32(0.5))


def test_hot_scalar_changes_without_rebuild(engine: Engine, rng: np.random.Generator) -> None:
    x = rng.standard_normal(4096).astype(np.float32)
    block = engine.add(Expression(Code="x * Gain", Gain=2.0))
    engine.bind(block, "x", x)
    engine.update()
    rebuilds = engine.counters.rebuilds
    block.set("Gain", -3.0)
    engine.update()
    np.testing.assert_array_equal(engine.read(block, "Out"), x * np.float32(-3.0))
    assert engine.counters.rebuilds == rebuilds and engine.counters.hot_updates >= 1


def test_code_edit_swaps_in_place_and_bad_edit_keeps_the_kernel(live_engine: Engine, rng: np.random.Generator) -> None:
    e = live_engine
    x = rng.standard_normal(2048).astype(np.float32)
    block = e.add(Expression(name="ex", Code="x * Gain", Gain=2.0))
    e.bind(block, "x", x)
    run_until(e, lambda: block.debug.state is BlockState.OK)
    graph, rebuilds = e.graph, e.counters.rebuilds
    block.set("Code", "x * Gain + 1")
    run_until(e, lambda: e.counters.code_swaps == 1)
    e.update()
    assert e.graph is graph and e.counters.rebuilds == rebuilds
    np.testing.assert_array_equal(e.read(block, "Out"), x * np.float32(2.0) + np.float32(1.0))
    block.set("Code", "x * (Gain + ")  # half-typed
    run_until(e, lambda: block.debug.state is BlockState.ERROR)
    diag = next(d for d in e.diagnostics(block) if d.code == "kernel-compile")
    assert "column 13" in diag.message and "keeps running" in diag.message
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), x * np.float32(2.0) + np.float32(1.0))
    block.set("Code", "x * (Gain + 1)")
    run_until(e, lambda: block.debug.state is BlockState.OK and e.counters.code_swaps == 2)
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), x * np.float32(3.0))
    assert not e.diagnostics(block)


# Bad live edits of "x * Gain" other than syntax errors: (code, its column, words of the error).
BAD_EDITS = [
    ("x * sinn(Gain)", 5, "unknown function 'sinn'"),
    ("x * Gain + x % 2", 12, "takes integers"),
    ("x * Gain + Out", 12, "taken by the output port"),
    ("x * Gainn", 5, "unknown name 'Gainn'"),  # Scalars="Gain" declares the scalars
]


def test_bad_edits_of_each_kind_are_errors_at_their_column_and_the_previous_kernel_runs_on(
    live_engine: Engine, rng: np.random.Generator
) -> None:
    e = live_engine
    x = rng.standard_normal(4099).astype(np.float32)
    block = e.add(Expression(name="ex", Code="x * Gain", Inputs="x", Scalars="Gain", Gain=2.0))
    e.bind(block, "x", x)
    run_until(e, lambda: block.debug.state is BlockState.OK)
    block.set("Code", "x * Gain - 0.5")  # the previous expression, gone live by the Code tier
    run_until(e, lambda: e.counters.code_swaps == 1)
    e.update()
    want = x * np.float32(2.0) - np.float32(0.5)
    np.testing.assert_array_equal(e.read(block, "Out"), want)
    for code, column, words in BAD_EDITS:

        def failed(words: str = words, column: int = column) -> bool:
            return any(
                d.code == "kernel-compile" and words in d.message and f"(column {column})" in d.message
                for d in e.diagnostics(block)
            )

        block.set("Code", code)
        run_until(e, lambda failed=failed: block.debug.state is BlockState.ERROR and failed())
        (diag,) = [d for d in e.diagnostics(block) if d.code == "kernel-compile"]
        assert "keeps running" in diag.message, diag.message
        assert [p.name for p in block.inputs] == ["x"]  # no port came or went
        e.update()
        np.testing.assert_array_equal(e.read(block, "Out"), want)  # the previous expression's result
    block.set("Code", "x * Gain + 1")
    run_until(e, lambda: block.debug.state is BlockState.OK and e.counters.code_swaps == 2)
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), x * np.float32(2.0) + np.float32(1.0))
    assert not e.diagnostics(block)


def test_new_names_rebuild_with_new_ports(live_engine: Engine, rng: np.random.Generator) -> None:
    e = live_engine
    x, y = (rng.standard_normal(300).astype(np.float32) for _ in range(2))
    block = e.add(Expression(Code="x * Gain", Gain=2.0))
    e.bind(block, "x", x)
    run_until(e, lambda: block.debug.state is BlockState.OK)
    block.set("Code", "x * Gain + y * Bias")
    block.set("Bias", 0.5)
    e.bind(block, "y", y)
    run_until(e, lambda: block.debug.state is BlockState.OK and e.counters.rebuilds >= 2)
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), x * np.float32(2.0) + y * np.float32(0.5))


def test_inputs_of_other_lengths_are_an_error_on_the_block(engine: Engine, rng: np.random.Generator) -> None:
    block = engine.add(Expression(name="ex", Code="x * 2 + b"))
    engine.bind(block, "x", rng.standard_normal(100).astype(np.float32))
    engine.bind(block, "b", rng.standard_normal(7).astype(np.float32))
    engine.update()
    (diag,) = [d for d in engine.diagnostics(block) if d.code == "input-size"]
    assert diag.severity == "error" and "(column 9)" in diag.message and "'b' has 7 elements" in diag.message
    engine.bind(block, "b", np.array([0.5], np.float32))  # one element: broadcast, and it runs
    engine.update()
    assert not engine.diagnostics(block)
    assert engine.read(block, "Out").shape == (100,)


def test_an_edit_runs_its_quick_build_then_the_optimised_one_with_the_same_bits(
    live_engine: Engine, rng: np.random.Generator
) -> None:
    e = live_engine
    x = rng.standard_normal(1 << 16).astype(np.float32)
    block = e.add(Expression(name="ex", Code="sin(x * Gain) + fma(x, 0.5, Gain)", Gain=2.0))
    e.bind(block, "x", x)
    key = (block.id, 0)

    def optimised() -> bool:  # the build that runs is the upgrade (not the interpreter, not JIT level 0)
        running = e.kernels.running(key)
        return running is not None and running.source.jit == "full"

    run_until(e, lambda: block.debug.state is BlockState.OK and optimised())
    for _ in range(3):
        e.update()  # an optimised build swapped on the frame thread is counted there
    graph, swaps, upgrades = e.graph, e.counters.code_swaps, e.counters.kernel_upgrades
    block.set("Code", "sin(x * Gain) + fma(x, 0.25, Gain)")
    run_until(e, lambda: e.counters.code_swaps == swaps + 1)
    e.update()
    first = e.read(block, "Out")
    run_until(e, lambda: e.counters.kernel_upgrades >= upgrades + 1 and optimised())  # the edit's, optimised
    e.update()
    assert e.graph is graph  # both went in through the Code tier
    np.testing.assert_array_equal(e.read(block, "Out"), first)  # the JIT level changes no bit
    expected = evaluate(block.source.program, {"x": x}, {"Gain": 2.0}, dtype=np.float64)["Out"]
    np.testing.assert_allclose(first, expected, atol=2e-5)


@pytest.mark.parametrize("code", [*EXACT, *(c for c, _ in APPROX)])
def test_the_interpreter_gives_the_generated_kernels_bits(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch, code: str
) -> None:
    """An edit's quick build run by the bytecode interpreter (no JIT) against the same program's PTX."""
    data = _inputs(rng, 50_001)
    data["b"] = data["b"][:1]  # broadcast
    interpreted_then_jitted(monkeypatch, lambda e: _expression(e, code, data, Hi=0.75, Freq=3.0))


def test_declared_names_compute_and_an_unused_declared_input_is_a_warning(
    live_engine: Engine, rng: np.random.Generator
) -> None:
    e = live_engine
    x, c, spare = (rng.standard_normal(n).astype(np.float32) for n in (3000, 1, 5))
    block = e.add(Expression(name="ex", Code="c * X + gain", Inputs="X, spare, c", Scalars="gain", gain=0.5))
    assert [p.name for p in block.inputs] == ["X", "spare", "c"]
    for port, data in (("X", x), ("spare", spare), ("c", c)):  # X, declared first, sets the length
        e.bind(block, port, data)  # spare: 5 elements, no error (nothing reads it)
    run_until(e, lambda: block.debug.state is BlockState.WARNING)
    e.update()
    np.testing.assert_array_equal(e.read(block, "Out"), c[0] * x + np.float32(0.5))
    (warn,) = [d for d in e.diagnostics(block) if d.code == "expression-declaration"]
    assert warn.severity == "warning" and "input 'spare'" in warn.message
    e.bind(block, "spare", np.array([2.0], np.float32))  # one element: broadcast
    builds = e.counters.rebuilds + e.counters.warm_resizes
    block.set("Code", "c * X + gain + spare")  # now it uses spare: re-described (same ports), built again
    block.set("gain", -1.0)  # (same ports and sizes: the new kernel is patched into the running graph)
    run_until(e, lambda: block.debug.state is BlockState.OK and e.counters.rebuilds + e.counters.warm_resizes > builds)
    e.update()
    assert not [d for d in e.diagnostics(block) if d.code == "expression-declaration"]
    np.testing.assert_array_equal(e.read(block, "Out"), c[0] * x + np.float32(-1.0) + np.float32(2.0))
