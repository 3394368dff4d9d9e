"""The same kernel as ``ptx_gen.py`` writes, as CUDA C++ for NVRTC: the reference path.

Every operation is spelled so NVRTC emits the instruction the PTX generator writes: ``__fadd_rn``
and friends (never contracted into an FMA), ``__fmaf_rn`` for ``fma``, inline PTX for the hardware
approximations and shifts. Compiled with ``-fmad=false`` besides, so both paths give the same bits.
The float functions (``sin``, ``mix``, ``smoothstep`` ...) are lowered by ``lower.py``, as for PTX:
each of its instructions becomes one ``const`` here (``_C``).
It takes NVRTC 20-40 ms where the PTX path takes about one (see ``source.py``).
"""

from __future__ import annotations

from .check import Type
from .lower import F_OPS, PI, FloatLowering
from .program import Program, Stage
from .syntax import Binary, Call, Name, Node, Num, Unary
from .vectors import LANE_BY_LANE, LANE_NAMES, vector_dtype

__all__ = ["generate_cuda", "NVRTC_OPTIONS"]

#: Options the reference path compiles with (no contraction; IEEE division and square root).
NVRTC_OPTIONS = ("-fmad=false", "-prec-div=true", "-prec-sqrt=true", "-ftz=false")

_ASM_F = ("sin", "sin.approx.f32"), ("cos", "cos.approx.f32"), ("ex2", "ex2.approx.f32"), ("lg2", "lg2.approx.f32")
_ASM_I = ("shl", "shl.b32"), ("shr", "shr.s32"), ("rem", "rem.s32")
_PRELUDE = "\n".join(
    [
        *(
            f"__device__ __forceinline__ float cp_{n}(float x)\n"
            f'{{ float r; asm("{op} %0, %1;" : "=f"(r) : "f"(x)); return r; }}'
            for n, op in _ASM_F
        ),
        *(
            f"__device__ __forceinline__ int cp_{n}(int a, int b)\n"
            f'{{ int r; asm("{op} %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }}'
            for n, op in _ASM_I
        ),
        "__device__ __forceinline__ int cp_mul(int a, int b) { return (int)((unsigned)a * (unsigned)b); }",
        "__device__ __forceinline__ int cp_add(int a, int b) { return (int)((unsigned)a + (unsigned)b); }",
        "__device__ __forceinline__ int cp_sub(int a, int b) { return (int)((unsigned)a - (unsigned)b); }",
        "__device__ __forceinline__ int cp_neg(int a) { return (int)(0u - (unsigned)a); }",
    ]
)

# Each float instruction of ``lower.py`` as the CUDA C++ NVRTC compiles to it.
_C = {
    "add.rn.f32": "__fadd_rn({}, {})",
    "sub.rn.f32": "__fsub_rn({}, {})",
    "mul.rn.f32": "__fmul_rn({}, {})",
    "div.rn.f32": "__fdiv_rn({}, {})",
    "fma.rn.f32": "__fmaf_rn({}, {}, {})",
    "min.f32": "fminf({}, {})",
    "max.f32": "fmaxf({}, {})",
    "abs.f32": "fabsf({})",
    "sqrt.rn.f32": "__fsqrt_rn({})",
    "cvt.rmi.f32.f32": "floorf({})",
    "cvt.rni.f32.f32": "rintf({})",
    **{f"{op}.approx.f32": f"cp_{op}({{}})" for op in ("sin", "cos", "ex2", "lg2")},
}
_I_FUN = {"+": "cp_add", "-": "cp_sub", "*": "cp_mul", "%": "cp_rem", "<<": "cp_shl", ">>": "cp_shr"}


def _f(value: float) -> str:
    return f"{float(value)!r}f".replace("inf", "INFINITY")


class _Writer(FloatLowering[str]):
    """C expressions of one stage's nodes, each in its own ``const`` (the float functions: ``lower.py``)."""

    def __init__(self, lines: list[str], stage: Stage, env: dict[tuple[str, int], str]) -> None:
        self.lines = lines
        self.stage = stage
        self.env = env
        self.n = 0

    def t(self, node: Node) -> Type:
        return self.stage.expr.type_of(node)

    def tmp(self, ctype: str, expr: str) -> str:
        self.n += 1
        name = f"t{len(self.lines)}_{self.n}"
        self.lines.append(f"    const {ctype} {name} = {expr};")
        return name

    def fl(self, v: str, t: Type) -> str:
        return v if t == "float" else f"__int2float_rn({v})"

    def const(self, value: float) -> str:
        return _f(value)

    def f1(self, op: str, a: str) -> str:
        return self.tmp("float", _C[op].format(a))

    def f2(self, op: str, a: str, b: str) -> str:
        return self.tmp("float", _C[op].format(a, b))

    def f3(self, op: str, a: str, b: str, c: str) -> str:
        return self.tmp("float", _C[op].format(a, b, c))

    def step(self, edge: str, x: str) -> str:
        return self.tmp("float", f"({x} < {edge}) ? 0.0f : 1.0f")

    def ev(self, node: Node) -> str:
        t = self.t(node)
        if isinstance(node, Num):
            return str(int(node.value)) if t == "int" else _f(float(node.value))
        if isinstance(node, Name):
            if node.id == "index":
                return "(int)i"
            if node.id == "count":
                return "(int)n"
            if node.id == "pi":
                return _f(PI)
            return self.env[self.stage.bind[node.id]]
        if isinstance(node, Unary):
            a = self.ev(node.operand)
            if node.op == "+":
                return a
            if node.op == "not":
                return f"(!{a})"
            if node.op == "~":
                return f"(~{a})"
            return self.tmp("int", f"cp_neg({a})") if t == "int" else self.tmp("float", f"(-{a})")
        if isinstance(node, Binary):
            return self._binary(node, t)
        if isinstance(node, Call):
            return self._call(node, t)
        raise AssertionError(node)

    def _binary(self, node: Binary, t: Type) -> str:
        lt, rt = self.t(node.left), self.t(node.right)
        a, b = self.ev(node.left), self.ev(node.right)
        op = node.op
        if op in ("and", "or"):
            return self.tmp("bool", f"{a} {'&&' if op == 'and' else '||'} {b}")
        if op in ("<", "<=", ">", ">=", "==", "!="):
            if lt != rt or lt == "float":
                a, b = self.fl(a, lt), self.fl(b, rt)
            return self.tmp("bool", f"{a} {op} {b}")
        if op == "**":
            return self.pow(self.fl(a, lt), self.fl(b, rt))
        if t == "int":
            fun = _I_FUN.get(op)
            return self.tmp("int", f"{fun}({a}, {b})" if fun else f"({a} {op} {b})")
        return self.f2(F_OPS[op], self.fl(a, lt), self.fl(b, rt))

    def _call(self, node: Call, t: Type) -> str:
        fn = node.func
        types = [self.t(a) for a in node.args]
        args = [self.ev(a) for a in node.args]
        if fn == "where":
            a, b = (args[1], args[2]) if t == "int" else (self.fl(args[1], types[1]), self.fl(args[2], types[2]))
            return self.tmp("int" if t == "int" else "float", f"{args[0]} ? {a} : {b}")
        if fn == "int":
            return args[0] if types[0] == "int" else self.tmp("int", f"__float2int_rz({args[0]})")
        if t == "int":
            if fn == "abs":
                return self.tmp("int", f"abs({args[0]})")
            if fn in ("min", "max"):
                return self.tmp("int", f"{fn}({args[0]}, {args[1]})")
            return self.tmp("int", f"min(max({args[0]}, {args[1]}), {args[2]})")
        return self.call(fn, [self.fl(a, ty) for a, ty in zip(args, types, strict=True)])


def generate_cuda(program: Program) -> str:
    """``program`` as one ``extern "C" __global__ void expression(...)`` in CUDA C++."""
    names = tuple(f"v_{name}" for name in program.param_names)  # prefixed: a user's name may be a C++ keyword
    desc = program.descriptor
    params = []
    for i, p in enumerate(desc.parameters):
        if p.is_pointer:  # no __restrict__: the pool may give an input and an output the same memory
            params.append(f"{'const ' if p.direction == 'in' else ''}{p.dtype.c_name}* {names[i]}")
        else:
            params.append(f"{'float' if p.dtype.base.kind == 'f' else 'unsigned int'} {names[i]}")
    body: list[str] = [
        "    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;",
        f"    const unsigned int n = {names[program.count_param]};",
        "    if (i >= n) return;",
    ]
    # one environment per lane (a vector program computes its element's lanes one after the other)
    lanes = program.lanes
    envs: list[dict[tuple[str, int], str]] = [{} for _ in range(lanes)]
    for k in range(len(program.inputs)):
        ptr, cnt = names[program.input_param(k)], names[program.input_param(k) + 1]
        dtype = desc.parameters[program.input_param(k)].dtype
        body.append(f"    const {dtype.c_name} in{k} = {ptr}[min(i, {cnt} - 1u)];")
        for lane, env in enumerate(envs):  # a float input: its one value in every lane
            env[("input", k)] = f"in{k}.{LANE_NAMES[lane]}" if dtype.lanes > 1 else f"in{k}"
    for s in range(len(program.scalars)):
        for env in envs:
            env[("scalar", s)] = names[program.scalar_param(s)]
    for j, stage in enumerate(program.stages):
        for lane, env in enumerate(envs):
            tail = f" (lane {LANE_NAMES[lane]})" if lanes > 1 else ""
            body.append(f"    // {stage.label or f'stage {j}'}: {stage.expr.text.strip()}{tail}")
            w = _Writer(body, stage, env)
            value = w.ev(stage.expr.root)
            v = f"s{j}" if lanes == 1 else f"s{j}_{LANE_NAMES[lane]}"
            body.append(f"    const float {v} = {w.fl(value, stage.expr.type_of(stage.expr.root))};")
            env[("stage", j)] = v
    for o, (_, j) in enumerate(program.outputs):
        if lanes == 1:
            value = f"s{j}"
        else:
            value = f"make_{vector_dtype(lanes).c_name}({', '.join(env[('stage', j)] for env in envs)})"
        body.append(f"    {names[program.output_param(o)]}[i] = {value};")
    notes = ["Generated by cudapatch.expr from:", *program.summary().splitlines()]
    if lanes > 1:
        notes.append(f"{LANE_BY_LANE} {vector_dtype(lanes).c_name}: one thread per element, its lanes in turn")
    head = "\n".join(f"// {line}" for line in notes)
    sig = ",\n    ".join(params)
    kernel = f'extern "C" __global__ void {desc.entry_point}(\n    {sig})\n{{\n'
    return f"{head}\n{_PRELUDE}\n\n{kernel}" + "\n".join(body) + "\n}\n"
