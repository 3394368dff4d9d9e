"""The same kernel as ``ptx_gen.py`` writes, as CUDA C++ for NVRTC: the reference path.

Every operation is spelled so NVRTC emits the instruction the PTX generator writes: ``__fadd_rn``
and friends (never contracted into an FMA), ``__fmaf_rn`` for ``fma``, inline PTX for the hardware
approximations and shifts. Compiled with ``-fmad=false`` besides, so both paths give the same bits.
It takes NVRTC 20-40 ms where the PTX path takes about one (see ``source.py``).
"""

from __future__ import annotations

from .check import Type
from .program import Program, Stage
from .ptx_gen import INV_TWO_PI, LN_2, LOG2_E, PI, TWO_PI_HI, TWO_PI_LO
from .syntax import Binary, Call, Name, Node, Num, Unary

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
        "__device__ __forceinline__ float cp_reduce(float x) {",
        "    float k = rintf(__fmul_rn(x, INV));",
        "    return __fmaf_rn(k, LO, __fmaf_rn(k, HI, x));",
        "}",
    ]
)

_F_OPS = {"+": "__fadd_rn", "-": "__fsub_rn", "*": "__fmul_rn", "/": "__fdiv_rn"}
_I_FUN = {"+": "cp_add", "-": "cp_sub", "*": "cp_mul", "%": "cp_rem", "<<": "cp_shl", ">>": "cp_shr"}


def _f(value: float) -> str:
    return f"{float(value)!r}f".replace("inf", "INFINITY")


class _Writer:
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
            return self._pow(self.fl(a, lt), self.fl(b, rt))
        if t == "int":
            fun = _I_FUN.get(op)
            return self.tmp("int", f"{fun}({a}, {b})" if fun else f"({a} {op} {b})")
        return self.tmp("float", f"{_F_OPS[op]}({self.fl(a, lt)}, {self.fl(b, rt)})")

    def _pow(self, x: str, y: str) -> str:
        return self.tmp("float", f"cp_ex2(__fmul_rn({y}, cp_lg2({x})))")

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
        x = [self.fl(a, ty) for a, ty in zip(args, types, strict=True)]
        tmp = self.tmp
        if fn == "float":
            return x[0]
        if fn in ("sin", "cos"):
            return tmp("float", f"cp_{fn}(cp_reduce({x[0]}))")
        if fn == "tan":
            r = tmp("float", f"cp_reduce({x[0]})")
            return tmp("float", f"__fdiv_rn(cp_sin({r}), cp_cos({r}))")
        if fn == "exp":
            return tmp("float", f"cp_ex2(__fmul_rn({x[0]}, {_f(LOG2_E)}))")
        if fn == "log":
            return tmp("float", f"__fmul_rn(cp_lg2({x[0]}), {_f(LN_2)})")
        if fn == "pow":
            return self._pow(x[0], x[1])
        if fn == "sqrt":
            return tmp("float", f"__fsqrt_rn({x[0]})")
        if fn == "abs":
            return tmp("float", f"fabsf({x[0]})")
        if fn == "floor":
            return tmp("float", f"floorf({x[0]})")
        if fn == "fract":
            return tmp("float", f"__fsub_rn({x[0]}, floorf({x[0]}))")
        if fn in ("min", "max"):
            return tmp("float", f"f{fn}f({x[0]}, {x[1]})")
        if fn == "clamp":
            return tmp("float", f"fminf(fmaxf({x[0]}, {x[1]}), {x[2]})")
        if fn == "mix":
            return tmp("float", f"__fadd_rn({x[0]}, __fmul_rn(__fsub_rn({x[1]}, {x[0]}), {x[2]}))")
        if fn == "step":
            return tmp("float", f"({x[1]} < {x[0]}) ? 0.0f : 1.0f")
        if fn == "smoothstep":
            q = tmp("float", f"__fdiv_rn(__fsub_rn({x[2]}, {x[0]}), __fsub_rn({x[1]}, {x[0]}))")
            c = tmp("float", f"fminf(fmaxf({q}, 0.0f), 1.0f)")
            return tmp("float", f"__fmul_rn(__fmul_rn({c}, {c}), __fsub_rn(3.0f, __fmul_rn(2.0f, {c})))")
        if fn == "fma":
            return tmp("float", f"__fmaf_rn({x[0]}, {x[1]}, {x[2]})")
        raise AssertionError(fn)


def generate_cuda(program: Program) -> str:
    """``program`` as one ``extern "C" __global__ void expression(...)`` in CUDA C++."""
    names = tuple(f"v_{name}" for name in program.param_names)  # prefixed: a user's name may be a C++ keyword
    desc = program.descriptor
    params = []
    for i, p in enumerate(desc.parameters):
        if p.is_pointer:
            params.append(f"{'const float*' if p.direction == 'in' else 'float*'} __restrict__ {names[i]}")
        else:
            params.append(f"{'float' if p.dtype.base.kind == 'f' else 'unsigned int'} {names[i]}")
    # no __restrict__ on inputs after all: the pool may give an input and an output the same memory
    params = [p.replace(" __restrict__", "") for p in params]
    body: list[str] = [
        "    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;",
        f"    const unsigned int n = {names[program.count_param]};",
        "    if (i >= n) return;",
    ]
    env: dict[tuple[str, int], str] = {}
    for k in range(len(program.inputs)):
        ptr, cnt = names[program.input_param(k)], names[program.input_param(k) + 1]
        body.append(f"    const float in{k} = {ptr}[min(i, {cnt} - 1u)];")
        env[("input", k)] = f"in{k}"
    for s in range(len(program.scalars)):
        env[("scalar", s)] = names[program.scalar_param(s)]
    for j, stage in enumerate(program.stages):
        body.append(f"    // {stage.label or f'stage {j}'}: {stage.expr.text.strip()}")
        w = _Writer(body, stage, env)
        value = w.ev(stage.expr.root)
        body.append(f"    const float s{j} = {w.fl(value, stage.expr.type_of(stage.expr.root))};")
        env[("stage", j)] = f"s{j}"
    for o, (_, j) in enumerate(program.outputs):
        body.append(f"    {names[program.output_param(o)]}[i] = s{j};")
    prelude = _PRELUDE.replace("INV", _f(INV_TWO_PI)).replace("HI", _f(-TWO_PI_HI)).replace("LO", _f(-TWO_PI_LO))
    head = "\n".join(f"// {line}" for line in ["Generated by cudapatch.expr from:", *program.summary().splitlines()])
    sig = ",\n    ".join(params)
    kernel = f'extern "C" __global__ void {desc.entry_point}(\n    {sig})\n{{\n'
    return f"{head}\n{prelude}\n\n{kernel}" + "\n".join(body) + "\n}\n"
