"""The interpreter's bytecode without a GPU: a NumPy machine runs it as the interpreter kernel would
(one slot array per element) and must give the float32 reference interpreter's bits for expressions
of exactly rounded operations; the interpreter kernel compiles with NVRTC and takes a program in a
copy of its cubin. The kernel itself runs in tests/gpu/test_expression_gpu.py."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from cudapatch.expr import ProgramSource, compile_expression, evaluate, single
from cudapatch.expr.bytecode import INTERPRETERS, MARKER, MAX_SLOTS, OPS, assemble, interpreter_cuda, patch_program
from cudapatch.expr.program import Program, Stage

EXACT = [
    "a * x + b",
    "fma(a, x, b) - a / (abs(x) + 1) + sqrt(abs(b))",
    "clamp(x, -0.5, Hi) + mix(a, b, 0.25) + floor(x * 3) + fract(x) + step(0, x) + smoothstep(-1, 1, b)",
    "where(x > a and not (b < 0), x, -a) + float(index % 7) + int(x * 10) + min(a, b) + max(x, b)",
    "float((index << 3) ^ (count >> 1) | ~index & 5) + where(x != x or x <= b, 1.0, 2.0) - float(-index)",
    "x",
    "2.5",
]
_NAME = {code: op for op, (code, _, _) in OPS.items()}


def _f(u: np.ndarray) -> np.ndarray:
    return u.view(np.float32)


def _i(u: np.ndarray) -> np.ndarray:
    return u.view(np.int32)


def _step(op: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    fa, fb, fc, ia, ib = _f(a), _f(b), _f(c), _i(a), _i(b)
    with np.errstate(all="ignore"):
        if op.endswith(".f32") and op.split(".")[0] in ("add", "sub", "mul", "div"):
            f = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide}[op.split(".")[0]]
            return f(fa, fb).astype(np.float32).view(np.uint32)
        simple = {
            "min.f32": lambda: np.fmin(fa, fb),
            "max.f32": lambda: np.fmax(fa, fb),
            "neg.f32": lambda: -fa,
            "abs.f32": lambda: np.abs(fa),
            "sqrt.rn.f32": lambda: np.sqrt(fa),
            "cvt.rni.f32.f32": lambda: np.rint(fa),
            "cvt.rmi.f32.f32": lambda: np.floor(fa),
            "fma.rn.f32": lambda: (fa.astype(np.float64) * fb + fc.astype(np.float64)).astype(np.float32),
            "sin.approx.f32": lambda: np.sin(fa),
            "cos.approx.f32": lambda: np.cos(fa),
            "ex2.approx.f32": lambda: np.exp2(fa),
            "lg2.approx.f32": lambda: np.log2(fa),
            "cvt.rn.f32.s32": lambda: ia.astype(np.float32),
        }
        if op in simple:
            return np.asarray(simple[op](), np.float32).view(np.uint32)
        ints = {
            "add.s32": lambda: ia + ib,
            "sub.s32": lambda: ia - ib,
            "mul.lo.s32": lambda: ia * ib,
            "rem.s32": lambda: np.fmod(ia, np.where(ib == 0, 1, ib)),
            "and.b32": lambda: ia & ib,
            "or.b32": lambda: ia | ib,
            "xor.b32": lambda: ia ^ ib,
            "shl.b32": lambda: np.where(b >= 32, 0, ia << np.minimum(b, 31).astype(np.int32)),
            "shr.s32": lambda: ia >> np.minimum(b, 31).astype(np.int32),
            "min.s32": lambda: np.minimum(ia, ib),
            "max.s32": lambda: np.maximum(ia, ib),
            "not.b32": lambda: ~ia,
            "neg.s32": lambda: -ia,
            "abs.s32": lambda: np.abs(ia),
            "cvt.rzi.s32.f32": lambda: np.where(
                np.isnan(fa), 0, np.clip(np.trunc(np.nan_to_num(fa)), -(2.0**31), 2.0**31 - 1)
            ).astype(np.int32),
        }
        if op in ints:
            return np.asarray(ints[op](), np.int32).view(np.uint32)
        cmp = op.split(".")[1]
        if op.startswith("setp."):
            x, y = (fa, fb) if op.endswith(".f32") else (ia, ib)
            r = {
                "lt": x < y,
                "le": x <= y,
                "gt": x > y,
                "ge": x >= y,
                "eq": x == y,
                "ne": x != y,
                "neu": (x != y) | np.isnan(x) | np.isnan(y),
            }[cmp]
            return r.astype(np.uint32)
        return {
            "and.pred": lambda: a & b,
            "or.pred": lambda: a | b,
            "not.pred": lambda: a ^ 1,
            "selp.f32": lambda: np.where(c != 0, a, b),
            "selp.s32": lambda: np.where(c != 0, a, b),
            "mov.f32": lambda: a,
            "mov.s32": lambda: a,
        }[op]().astype(np.uint32)


def run(words: tuple[int, ...], inputs: list[np.ndarray], scalars: list[float], n: int) -> np.ndarray:
    """What the interpreter kernel computes, for ``n`` elements at once (its C, line by line)."""
    w = list(words)
    r = np.zeros((MAX_SLOTS, n), np.uint32)
    r[w[2]] = np.arange(n, dtype=np.uint32)
    r[w[3]] = n
    for i, x in enumerate(inputs):
        r[w[5 + i]] = x[np.minimum(np.arange(n), x.size - 1)].view(np.uint32)
    for s, v in enumerate(scalars):
        r[w[5 + len(inputs) + s]] = np.float32(v).view(np.uint32)
    at = 5 + len(inputs) + len(scalars)
    for _ in range(w[1]):
        r[w[at]] = w[at + 1]
        at += 2
    for _ in range(w[0]):
        op, d, a, b, c = w[at : at + 5]
        r[d] = _step(_NAME[op], r[a].copy(), r[b].copy(), r[c].copy())
        at += 5
    return r[w[4]].view(np.float32)


@pytest.mark.parametrize("text", EXACT)
def test_bytecode_gives_the_reference_bits(text: str) -> None:
    program = single(compile_expression(text))
    code = assemble(program)
    assert code is not None and code.slots <= MAX_SLOTS
    rng = np.random.default_rng(3)
    n = 1000
    data = {name: rng.standard_normal(n).astype(np.float32) for name in program.inputs}
    data = {k: (v[:1] if k == "b" else v) for k, v in data.items()}  # a broadcast input
    scalars = {name: 0.7 for name in program.scalars}
    got = run(code.words, [data[k] for k in program.inputs], [scalars[k] for k in program.scalars], n)
    want = evaluate(program, data, scalars, n=n)["Out"]
    np.testing.assert_array_equal(got, want)


def test_approximations_run_close_to_float64() -> None:
    program = single(compile_expression("a * sin(x * Freq) + cos(x) + exp(x) + log(abs(a) + 1) + pow(abs(x), 1.5)"))
    code = assemble(program)
    assert code is not None
    rng = np.random.default_rng(4)
    a, x = (rng.standard_normal(500).astype(np.float32) for _ in range(2))
    got = run(code.words, [a, x], [2.0], 500)
    want = evaluate(program, {"a": a, "x": x}, {"Freq": 2.0}, dtype=np.float64)["Out"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_fused_chain_reuses_slots_and_a_long_one_is_left_to_the_jit() -> None:
    expr = compile_expression("fma(In, Factor, Offset)")

    def chain(k: int) -> Program:
        stages = [
            Stage(
                expr,
                {
                    "In": ("input", 0) if j == 0 else ("stage", j - 1),
                    "Factor": ("scalar", 2 * j),
                    "Offset": ("scalar", 2 * j + 1),
                },
            )
            for j in range(k)
        ]
        return Program(("x",), tuple(f"s{i}" for i in range(2 * k)), (("Out", k - 1),), tuple(stages))

    p = chain(10)
    code = assemble(p)
    assert code is not None and code.slots <= 2 + 1 + 20 + 1  # index, count, x, scalars, one running value
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    scalars = [1.0 + i / 100 for i in range(20)]
    np.testing.assert_array_equal(run(code.words, [x], scalars, 64), evaluate(p, [x], scalars)["Out"])
    assert assemble(chain(100)) is None  # 200 scalars do not fit the slots: the PTX is JITted instead
    two = Program(p.inputs, p.scalars, (("A", 0), ("B", 9)), p.stages)
    assert assemble(two) is None  # one output only


def test_the_interpreter_takes_a_program_in_a_copy_of_its_cubin() -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    program = single(compile_expression("a * sin(x * Freq) + b"))
    found = INTERPRETERS.get(len(program.inputs), len(program.scalars), "sm_90", wait=True)
    if found is None:
        pytest.skip("NVRTC could not compile here")
    cubin, symbol = found
    assert symbol == "expression"
    code = assemble(program)
    assert code is not None
    patched = patch_program(cubin, code)
    assert len(patched) == len(cubin) and code.to_bytes() in patched
    assert struct.pack("<8I", *MARKER) not in patched
    with pytest.raises(ValueError):
        patch_program(patched, code)  # the marker is gone: not an interpreter cubin any more
    image = ProgramSource.of(program, jit="quick").compile("sm_90")
    assert image.kind == "cubin" and image.image == patched and image.jit_level is None
    assert ProgramSource.of(program).compile("sm_90").kind == "cubin"  # the optimised build: nvJitLink, no driver JIT
    assert "case 0:" in interpreter_cuda(3, 1) and "cp_program" in interpreter_cuda(3, 1)


def test_join_waits_for_an_interpreter_compile_in_flight(monkeypatch) -> None:
    """An in-process NVRTC compile still running at exit would crash the process's teardown: the
    interpreters' ``join`` (registered with atexit) waits for it."""
    import threading
    import time

    from cudapatch.expr.bytecode import _Interpreters

    interp = _Interpreters()
    finished = threading.Event()

    def slow(key):
        time.sleep(0.3)
        finished.set()
        return None

    monkeypatch.setattr(interp, "_compile", slow)
    assert interp.get(1, 2, "sm_90") is None  # compiling on its thread
    assert not finished.is_set()
    interp.join()
    assert finished.is_set()
    interp.join()  # nothing in flight: returns at once
