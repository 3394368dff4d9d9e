"""A NumPy interpreter of programs: the reference the generated kernels are tested against.

``dtype=np.float32`` follows the generated code's rounding: every float operation rounds to f32
(NumPy's f32 ufuncs are correctly rounded, like ``add.rn``/``mul.rn``/``div.rn``/``sqrt.rn``), so
``+ - * / sqrt fma floor min max`` and integer operations give the GPU's bits; ``sin``, ``cos``,
``tan``, ``exp``, ``log`` and ``pow`` are computed exactly and rounded, where the GPU uses hardware
approximations (compare those with a tolerance). ``dtype=np.float64`` computes the mathematical
value: the reference for GPU tests.

A program of vector inputs (``Program.input_lanes``) runs lane by lane as its kernel does: a vector
input is given as ``(elements, lanes)`` (or flat), a ``float`` input's element is used by every lane,
and each output comes back as ``(n, lanes)``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .check import Type
from .program import Program, Stage
from .syntax import Binary, Call, Name, Node, Num, Unary

__all__ = ["evaluate", "broadcast_read"]


def broadcast_read(array: np.ndarray, n: int, lanes: int = 1) -> np.ndarray:
    """What the kernel reads from an input for ``n`` elements: element ``min(i, len - 1)`` (of
    ``lanes`` values each: ``(n, lanes)`` then)."""
    a = np.asarray(array).reshape(-1) if lanes == 1 else np.asarray(array).reshape(-1, lanes)
    idx = np.minimum(np.arange(n), len(a) - 1)
    return a[idx]


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray, dtype: Any) -> np.ndarray:
    if dtype == np.float32:  # the product and sum of f32 values are exact in f64 before the one rounding
        # (a·b has 48 bits; a·b + c in f64 can round once; a double rounding f64→f32 is possible but
        # happens only on exact ties of the f64 sum, far rarer than the cases tests draw)
        return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
    return a * b + c


class _Eval:
    def __init__(self, stage: Stage, env: dict, n: int, dtype: Any) -> None:
        self.stage = stage
        self.env = env
        self.n = n
        self.f = dtype
        self.one = np.ones(n, dtype=dtype)

    def t(self, node: Node) -> Type:
        return self.stage.expr.type_of(node)

    def fl(self, v: np.ndarray) -> np.ndarray:
        return v.astype(self.f) if v.dtype != self.f else v

    def ev(self, node: Node) -> np.ndarray:
        f, n = self.f, self.n
        t = self.t(node)
        if isinstance(node, Num):
            if t == "int":
                return np.full(n, int(node.value), dtype=np.int32)
            return np.full(n, node.value, dtype=f)
        if isinstance(node, Name):
            if node.id == "index":
                return np.arange(n, dtype=np.int64).astype(np.int32)
            if node.id == "count":
                return np.full(n, n, dtype=np.int64).astype(np.int32)
            if node.id == "pi":
                return np.full(n, np.pi, dtype=f)
            return self.env[self.stage.bind[node.id]]
        if isinstance(node, Unary):
            a = self.ev(node.operand)
            if node.op == "+":
                return a
            if node.op == "not":
                return ~a
            if node.op == "~":
                return ~a
            return (-a.astype(np.int64)).astype(np.int32) if t == "int" else -a
        if isinstance(node, Binary):
            return self._binary(node, t)
        if isinstance(node, Call):
            return self._call(node, t)
        raise AssertionError(node)

    def _binary(self, node: Binary, t: Type) -> np.ndarray:
        a, b = self.ev(node.left), self.ev(node.right)
        op = node.op
        if op == "and":
            return a & b
        if op == "or":
            return a | b
        if op in ("<", "<=", ">", ">=", "==", "!="):
            if a.dtype != b.dtype:
                a, b = self.fl(a), self.fl(b)
            return {
                "<": np.less,
                "<=": np.less_equal,
                ">": np.greater,
                ">=": np.greater_equal,
                "==": np.equal,
                "!=": np.not_equal,
            }[op](a, b)
        if op == "**":
            return self._pow(self.fl(a), self.fl(b))
        if t == "int":
            x, y = a.astype(np.int64), b.astype(np.int64)
            if op == "+":
                r = x + y
            elif op == "-":
                r = x - y
            elif op == "*":
                r = x * y
            elif op == "%":  # C remainder: the sign of the dividend; x % 0 is undefined (0 here)
                safe = np.where(y == 0, 1, y)
                r = np.where(y == 0, 0, np.fmod(x, safe))
            elif op == "&":
                r = x & y
            elif op == "|":
                r = x | y
            elif op == "^":
                r = x ^ y
            else:  # PTX shifts: the amount is unsigned and clamped to 32
                amt = np.minimum(y & 0xFFFFFFFF, 32)
                if op == "<<":
                    r = np.where(amt >= 32, 0, (x << np.minimum(amt, 31)) & 0xFFFFFFFF)
                else:
                    r = x >> np.minimum(amt, 31)
            return (r & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
        a, b = self.fl(a), self.fl(b)
        with np.errstate(all="ignore"):
            return {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}[op](a, b)

    def _pow(self, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):  # 2^(y·log2 x): NaN for x < 0, as the kernel
            r = np.exp2(y.astype(np.float64) * np.log2(x.astype(np.float64)))
        return r.astype(self.f)

    def _call(self, node: Call, t: Type) -> np.ndarray:
        fn = node.func
        args = [self.ev(a) for a in node.args]
        types = [self.t(a) for a in node.args]
        if fn == "where":
            a, b = args[1], args[2]
            if t != "int":
                a, b = self.fl(a), self.fl(b)
            return np.where(args[0], a, b)
        if fn == "int":
            if types[0] == "int":
                return args[0]
            x = args[0].astype(np.float64)  # cvt.rzi.s32.f32: truncate, saturate, NaN → 0
            x = np.where(np.isnan(x), 0, np.clip(np.trunc(x), -(2**31), 2**31 - 1))
            return x.astype(np.int64).astype(np.int32)
        if t == "int":
            x = [a.astype(np.int64) for a in args]
            if fn == "abs":
                r = np.abs(x[0])
            elif fn == "min":
                r = np.minimum(x[0], x[1])
            elif fn == "max":
                r = np.maximum(x[0], x[1])
            else:
                r = np.minimum(np.maximum(x[0], x[1]), x[2])
            return (r & 0xFFFFFFFF).astype(np.uint32).view(np.int32)
        x = [self.fl(a) for a in args]
        f = self.f
        with np.errstate(all="ignore"):
            if fn == "float":
                return x[0]
            if fn in ("sin", "cos", "tan", "exp", "log"):
                return getattr(np, fn)(x[0].astype(np.float64)).astype(f)
            if fn == "pow":
                return self._pow(x[0], x[1])
            if fn == "sqrt":
                return np.sqrt(x[0])
            if fn == "abs":
                return np.abs(x[0])
            if fn == "floor":
                return np.floor(x[0])
            if fn == "fract":
                return x[0] - np.floor(x[0])
            if fn == "min":  # min.f32: a NaN operand gives the other one
                return np.fmin(x[0], x[1])
            if fn == "max":
                return np.fmax(x[0], x[1])
            if fn == "clamp":
                return np.fmin(np.fmax(x[0], x[1]), x[2])
            if fn == "mix":
                return x[0] + (x[1] - x[0]) * x[2]
            if fn == "step":
                return np.where(x[1] < x[0], f(0), f(1)).astype(f)
            if fn == "smoothstep":
                c = np.fmin(np.fmax((x[2] - x[0]) / (x[1] - x[0]), f(0)), f(1))
                return (c * c) * (f(3) - f(2) * c)
            if fn == "fma":
                return _fma(x[0], x[1], x[2], f)
        raise AssertionError(fn)


def evaluate(
    program: Program,
    inputs: Sequence[np.ndarray] | Mapping[str, np.ndarray],
    scalars: Sequence[float] | Mapping[str, float] = (),
    n: int | None = None,
    *,
    dtype: Any = np.float32,
) -> dict[str, np.ndarray]:
    """Run ``program`` over ``n`` elements (default: the first input's length) in NumPy.

    Args:
        program: What to run.
        inputs: One array per program input (in order, or by name).
        scalars: One value per Hot scalar (in order, or by name).
        n: Elements of the launch.
        dtype: ``np.float32`` (the kernel's rounding) or ``np.float64`` (the mathematical value).

    Returns:
        ``{output name: array of n elements}`` (``dtype``; ``(n, lanes)`` for a vector program).
    """
    if isinstance(inputs, Mapping):
        inputs = [inputs[name] for name in program.inputs]
    if isinstance(scalars, Mapping):
        scalars = [scalars[name] for name in program.scalars]
    if n is None:
        n = len(np.asarray(inputs[0]).reshape(-1)) // program.lanes_of(0) if inputs else 1
    lanes = program.lanes
    read = [
        broadcast_read(np.asarray(a, dtype=np.float32), n, program.lanes_of(i)).astype(dtype)
        for i, a in enumerate(inputs)
    ]
    results = []
    for lane in range(lanes):  # a vector program: each lane as a program of floats, as the kernel does
        env: dict[tuple[str, int], np.ndarray] = {}
        for i, a in enumerate(read):
            env[("input", i)] = a if a.ndim == 1 else np.ascontiguousarray(a[:, lane])
        for s, v in enumerate(scalars):
            env[("scalar", s)] = np.full(n, np.float32(v), dtype=dtype)
        for j, stage in enumerate(program.stages):
            e = _Eval(stage, env, n, dtype)
            value = e.ev(stage.expr.root)
            env[("stage", j)] = value.astype(dtype)
        results.append({name: env[("stage", j)] for name, j in program.outputs})
    if lanes == 1:
        return results[0]
    return {name: np.stack([r[name] for r in results], axis=1) for name, _ in program.outputs}
