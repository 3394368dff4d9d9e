"""The float functions of the language as the instructions both GPU back ends emit, written once.

``ptx_gen`` writes each instruction as PTX, ``cuda_gen`` as the CUDA C++ that NVRTC turns into that
instruction; both lower ``sin``, ``mix``, ``smoothstep`` ... through ``FloatLowering.call``, so the
two cannot drift apart (they must give the same bits). The vocabulary is PTX's instruction names:
every ``+ - * /`` is correctly rounded with an explicit rounding mode, ``fma`` is the only fused
multiply-add, ``sin``/``cos`` reduce their argument by 2π in two steps (Cody-Waite) before the
hardware approximation, ``exp``/``log``/``pow`` go through ``ex2.approx``/``lg2.approx``.
"""

from __future__ import annotations

from typing import Generic, TypeVar

__all__ = ["F_OPS", "FloatLowering", "INV_TWO_PI", "LN_2", "LOG2_E", "PI", "TWO_PI_HI", "TWO_PI_LO"]

#: The instruction of each float operator.
F_OPS = {"+": "add.rn.f32", "-": "sub.rn.f32", "*": "mul.rn.f32", "/": "div.rn.f32"}

TWO_PI_HI = 6.28125  # 2π split in two: k·HI is exact for |k| < 2^15, so the reduction loses nothing there
TWO_PI_LO = 0.0019353071795864769
INV_TWO_PI = 0.15915494309189535
LOG2_E = 1.4426950408889634
LN_2 = 0.6931471805599453
PI = 3.141592653589793

V = TypeVar("V")


class FloatLowering(Generic[V]):
    """Lowers float function calls to instructions over values ``V`` (a PTX register, a C expression).

    A back end provides ``const``, ``f1``/``f2``/``f3`` (one instruction, by its PTX name, on one to
    three values) and ``step``; the operands of each instruction are built left to right, so the
    order the instructions come out in is fixed.
    """

    def const(self, value: float) -> V:
        raise NotImplementedError

    def f1(self, op: str, a: V) -> V:
        raise NotImplementedError

    def f2(self, op: str, a: V, b: V) -> V:
        raise NotImplementedError

    def f3(self, op: str, a: V, b: V, c: V) -> V:
        raise NotImplementedError

    def step(self, edge: V, x: V) -> V:
        """``x < edge ? 0 : 1``."""
        raise NotImplementedError

    def pow(self, x: V, y: V) -> V:
        """2^(y·log2 x): NaN for x < 0, as in GLSL."""
        return self.f1("ex2.approx.f32", self.f2("mul.rn.f32", y, self.f1("lg2.approx.f32", x)))

    def reduce(self, x: V) -> V:
        """x - k·2π with k = round(x / 2π), 2π in two parts: sin.approx is accurate on [-π, π]."""
        k = self.f1("cvt.rni.f32.f32", self.f2("mul.rn.f32", x, self.const(INV_TWO_PI)))
        r1 = self.f3("fma.rn.f32", k, self.const(-TWO_PI_HI), x)
        return self.f3("fma.rn.f32", k, self.const(-TWO_PI_LO), r1)

    def call(self, fn: str, x: list[V]) -> V:
        """Float function ``fn`` of the float values ``x`` (``check.FUNCTIONS``; ``where`` and the
        integer forms are the back ends' own)."""
        f1, f2 = self.f1, self.f2
        if fn == "float":
            return x[0]
        if fn in ("sin", "cos"):
            return f1(f"{fn}.approx.f32", self.reduce(x[0]))
        if fn == "tan":
            r = self.reduce(x[0])
            return f2("div.rn.f32", f1("sin.approx.f32", r), f1("cos.approx.f32", r))
        if fn == "exp":
            return f1("ex2.approx.f32", f2("mul.rn.f32", x[0], self.const(LOG2_E)))
        if fn == "log":
            return f2("mul.rn.f32", f1("lg2.approx.f32", x[0]), self.const(LN_2))
        if fn == "pow":
            return self.pow(x[0], x[1])
        if fn == "sqrt":
            return f1("sqrt.rn.f32", x[0])
        if fn == "abs":
            return f1("abs.f32", x[0])
        if fn == "floor":
            return f1("cvt.rmi.f32.f32", x[0])
        if fn == "fract":
            return f2("sub.rn.f32", x[0], f1("cvt.rmi.f32.f32", x[0]))
        if fn in ("min", "max"):
            return f2(f"{fn}.f32", x[0], x[1])
        if fn == "clamp":
            return f2("min.f32", f2("max.f32", x[0], x[1]), x[2])
        if fn == "mix":  # a + (b - a)·t
            return f2("add.rn.f32", x[0], f2("mul.rn.f32", f2("sub.rn.f32", x[1], x[0]), x[2]))
        if fn == "step":
            return self.step(x[0], x[1])
        if fn == "smoothstep":  # t = clamp((x - e0) / (e1 - e0), 0, 1); t·t·(3 - 2t)
            q = f2("div.rn.f32", f2("sub.rn.f32", x[2], x[0]), f2("sub.rn.f32", x[1], x[0]))
            c = f2("min.f32", f2("max.f32", q, self.const(0.0)), self.const(1.0))
            poly = f2("sub.rn.f32", self.const(3.0), f2("mul.rn.f32", self.const(2.0), c))
            return f2("mul.rn.f32", f2("mul.rn.f32", c, c), poly)
        if fn == "fma":
            return self.f3("fma.rn.f32", x[0], x[1], x[2])
        raise AssertionError(fn)
