"""PTX text generated straight from a program, with no compiler in between.

This is the fast path of an edit: generating the text takes microseconds, leaving the driver's JIT
(``cuModuleLoadDataEx``, milliseconds; at a low level first, see ``source.py``) as the only compile.
``cuda_gen.py`` writes the same kernel as CUDA C++ for NVRTC, as the reference.

Floating-point rules (the same in both): every ``+ - * /`` is its own correctly rounded instruction
with an explicit rounding mode (``add.rn``, ``mul.rn`` ...), which ptxas never contracts into an FMA;
``fma(a, b, c)`` is the only fused multiply-add. ``sqrt`` and ``/`` are IEEE (``sqrt.rn``,
``div.rn``). Denormals are kept (no ``.ftz``). ``sin``/``cos`` reduce their argument by 2π in two
steps and use the hardware approximation (``sin.approx``); ``exp``, ``log`` and ``pow`` use
``ex2.approx``/``lg2.approx`` (``pow(x, y)`` = 2^(y·log2 x): NaN for x < 0, as in GLSL). Those
functions are lowered to instructions once, in ``lower.py``, for both back ends.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from .check import Type
from .lower import F_OPS, PI, FloatLowering
from .program import Program, Stage
from .syntax import Binary, Call, Name, Node, Num, Unary
from .vectors import LANE_BY_LANE, vector_dtype

__all__ = ["Layout", "ScalarLoads", "generate_ptx", "ptx_layout", "ptx_version_for"]

#: How a kernel reads its scalar arguments (``generate_ptx``): ``param`` with ``ld.param`` (a constant-bank
#: load, ``LDC``, on sm_90), ``prefetched`` through their generic addresses (``cvta.param``, ``ld``) after a
#: ``prefetch.L1`` of each 128-byte line of them at the start.
ScalarLoads = Literal["param", "prefetched"]

#: A scalar's cache line: 32 floats.
_LINE_SCALARS = 32

_I_OPS = {
    "+": "add.s32",
    "-": "sub.s32",
    "*": "mul.lo.s32",
    "%": "rem.s32",
    "&": "and.b32",
    "|": "or.b32",
    "^": "xor.b32",
    "<<": "shl.b32",
    ">>": "shr.s32",
}
# setp comparisons: ordered for float (NaN compares false) except != (unordered: NaN != x is true, as in C)
_F_CMP = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "neu"}
_I_CMP = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


def f32_hex(value: float) -> str:
    """A float as PTX's exact single-precision literal (``0f3F800000``)."""
    return f"0f{struct.unpack('<I', struct.pack('<f', value))[0]:08X}"


def _sm(arch: str) -> int:
    """``sm_90`` → 90 (90 for a name it cannot read)."""
    try:
        return int(arch.removeprefix("sm_").removeprefix("compute_").rstrip("af"))
    except ValueError:
        return 90


def ptx_version_for(arch: str) -> str:
    """The lowest PTX ISA that targets ``arch`` (``sm_90`` → 7.8), so older drivers load it."""
    sm = _sm(arch)
    if sm >= 120:
        return "8.7"
    if sm >= 100:
        return "8.6"
    return "7.8"


class _Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.counts = {"f": 0, "r": 0, "p": 0, "rd": 0}

    def reg(self, kind: str) -> str:
        self.counts[kind] += 1
        return f"%{kind}{self.counts[kind]}"

    def op(self, text: str) -> None:
        self.lines.append("\t" + text + ";")

    def comment(self, text: str) -> None:
        self.lines.append("\t// " + text.replace("\n", " "))


class _Values(FloatLowering[str]):
    """Registers of one stage's nodes, typed (the float functions: ``lower.py``)."""

    def __init__(self, em: _Emitter, stage: Stage, env: dict[tuple[str, int], str], index: str, count: str) -> None:
        self.em = em
        self.stage = stage
        self.env = env
        self.index = index
        self.count = count

    def type_of(self, node: Node) -> Type:
        return self.stage.expr.type_of(node)

    def as_float(self, reg: str, t: Type) -> str:
        if t == "float":
            return reg
        out = self.em.reg("f")
        self.em.op(f"cvt.rn.f32.s32 {out}, {reg}")
        return out

    def const(self, value: float) -> str:
        out = self.em.reg("f")
        self.em.op(f"mov.f32 {out}, {f32_hex(value)}")
        return out

    def f2(self, op: str, a: str, b: str) -> str:
        out = self.em.reg("f")
        self.em.op(f"{op} {out}, {a}, {b}")
        return out

    def f1(self, op: str, a: str) -> str:
        out = self.em.reg("f")
        self.em.op(f"{op} {out}, {a}")
        return out

    def f3(self, op: str, a: str, b: str, c: str) -> str:
        out = self.em.reg("f")
        self.em.op(f"{op} {out}, {a}, {b}, {c}")
        return out

    def step(self, edge: str, x: str) -> str:
        p = self.em.reg("p")
        self.em.op(f"setp.lt.f32 {p}, {x}, {edge}")
        out = self.em.reg("f")
        self.em.op(f"selp.f32 {out}, {f32_hex(0.0)}, {f32_hex(1.0)}, {p}")
        return out

    def emit(self, node: Node) -> str:
        t = self.type_of(node)
        em = self.em
        if isinstance(node, Num):
            if t == "int":
                out = em.reg("r")
                em.op(f"mov.s32 {out}, {int(node.value)}")
                return out
            return self.const(float(node.value))
        if isinstance(node, Name):
            if node.id == "index":
                return self.index
            if node.id == "count":
                return self.count
            if node.id == "pi":
                return self.const(PI)
            return self.env[self.stage.bind[node.id]]
        if isinstance(node, Unary):
            a = self.emit(node.operand)
            if node.op == "+":
                return a
            if node.op == "not":
                out = em.reg("p")
                em.op(f"not.pred {out}, {a}")
                return out
            if node.op == "~":
                out = em.reg("r")
                em.op(f"not.b32 {out}, {a}")
                return out
            if t == "int":
                out = em.reg("r")
                em.op(f"neg.s32 {out}, {a}")
                return out
            return self.f1("neg.f32", a)
        if isinstance(node, Binary):
            return self._binary(node, t)
        if isinstance(node, Call):
            return self._call(node, t)
        raise AssertionError(node)

    def _binary(self, node: Binary, t: Type) -> str:
        em = self.em
        lt, rt = self.type_of(node.left), self.type_of(node.right)
        a, b = self.emit(node.left), self.emit(node.right)
        op = node.op
        if op in ("and", "or"):
            out = em.reg("p")
            em.op(f"{op}.pred {out}, {a}, {b}")
            return out
        if op in _F_CMP:
            out = em.reg("p")
            if lt == rt == "int":
                em.op(f"setp.{_I_CMP[op]}.s32 {out}, {a}, {b}")
            else:
                em.op(f"setp.{_F_CMP[op]}.f32 {out}, {self.as_float(a, lt)}, {self.as_float(b, rt)}")
            return out
        if op == "**":
            return self.pow(self.as_float(a, lt), self.as_float(b, rt))
        if t == "int":
            out = em.reg("r")
            em.op(f"{_I_OPS[op]} {out}, {a}, {b}")
            return out
        return self.f2(F_OPS[op], self.as_float(a, lt), self.as_float(b, rt))

    def _call(self, node: Call, t: Type) -> str:
        em = self.em
        f = node.func
        types = [self.type_of(a) for a in node.args]
        regs = [self.emit(a) for a in node.args]
        if f == "where":
            out = em.reg("r" if t == "int" else "f")
            a = regs[1] if t == "int" else self.as_float(regs[1], types[1])
            b = regs[2] if t == "int" else self.as_float(regs[2], types[2])
            em.op(f"selp.{'s32' if t == 'int' else 'f32'} {out}, {a}, {b}, {regs[0]}")
            return out
        if f == "int":
            if types[0] == "int":
                return regs[0]
            out = em.reg("r")
            em.op(f"cvt.rzi.s32.f32 {out}, {regs[0]}")
            return out
        if t == "int":  # abs, min, max, clamp of ints
            if f == "abs":
                out = em.reg("r")
                em.op(f"abs.s32 {out}, {regs[0]}")
                return out
            if f in ("min", "max"):
                out = em.reg("r")
                em.op(f"{f}.s32 {out}, {regs[0]}, {regs[1]}")
                return out
            lo = em.reg("r")
            em.op(f"max.s32 {lo}, {regs[0]}, {regs[1]}")
            out = em.reg("r")
            em.op(f"min.s32 {out}, {lo}, {regs[2]}")
            return out
        return self.call(f, [self.as_float(r, ty) for r, ty in zip(regs, types, strict=True)])


@dataclass
class Layout:
    """Where the generated kernel keeps what (one element per thread), for ``bytecode.py``.

    Attributes:
        index: Register of the element index. count: Register of the element count.
        inputs: Register of each input's value. scalars: Register of each scalar.
        outputs: Register stored to each output.
        body: The instructions that compute the outputs from those registers (PTX lines).
    """

    index: str = ""
    count: str = ""
    inputs: list[str] = field(default_factory=list)
    scalars: list[str] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    body: list[str] = field(default_factory=list)


def ptx_layout(program: Program) -> Layout:
    """The registers and body instructions of ``generate_ptx(program)`` (one element per thread)."""
    layout = Layout()
    _generate(program, "sm_90", 1, layout)
    return layout


def _vector_access(op: str, values: list[str], addr: str) -> list[str]:
    """``ld.global``/``st.global`` of an element's lanes at ``addr``: one vector access for 2 and 4 lanes
    (the element is aligned to its size, as CUDA's ``float2``/``float4`` are), three for ``float3``
    (aligned to 4 bytes only)."""
    if len(values) == 1:
        return [f"{op}.f32 {values[0]}, [{addr}]" if op == "ld.global" else f"{op}.f32 [{addr}], {values[0]}"]
    if len(values) in (2, 4):
        regs = "{" + ", ".join(values) + "}"
        v = f"{op}.v{len(values)}.f32"
        return [f"{v} {regs}, [{addr}]" if op == "ld.global" else f"{v} [{addr}], {regs}"]
    return [
        f"{op}.f32 {v}, [{addr}+{4 * lane}]" if op == "ld.global" else f"{op}.f32 [{addr}+{4 * lane}], {v}"
        for lane, v in enumerate(values)
    ]


def _load_lanes(
    em: _Emitter, program: Program, names: tuple[str, ...], i: int, index: str, envs: list[dict[tuple[str, int], str]]
) -> None:
    """Input ``i`` of a vector program into each lane's environment: its element ``min(index, count - 1)``,
    all its lanes for a vector input, its one value in every lane for a ``float`` input."""
    li = program.lanes_of(i)
    name = program.inputs[i]
    what = f"its {li} lanes" if li > 1 else "one value for every lane"
    em.comment(f"input {name}: element min(index, {name}_count - 1), {what}")
    base = program.input_param(i)
    ptr, n_in, last, at = em.reg("rd"), em.reg("r"), em.reg("r"), em.reg("r")
    em.op(f"ld.param.u64 {ptr}, [{names[base]}]")
    em.op(f"ld.param.u32 {n_in}, [{names[base + 1]}]")
    em.op(f"sub.s32 {last}, {n_in}, 1")
    em.op(f"min.u32 {at}, {index}, {last}")
    gptr, off, addr = em.reg("rd"), em.reg("rd"), em.reg("rd")
    em.op(f"cvta.to.global.u64 {gptr}, {ptr}")
    em.op(f"mul.wide.u32 {off}, {at}, {4 * li}")
    em.op(f"add.s64 {addr}, {gptr}, {off}")
    values = [em.reg("f") for _ in range(li)]
    # a plain ld.global, not .nc: the pool may give an input and an output of one kernel the same memory
    for line in _vector_access("ld.global", values, addr):
        em.op(line)
    for lane, env in enumerate(envs):
        env[("input", i)] = values[lane if li > 1 else 0]


def _store_lanes(
    em: _Emitter, program: Program, names: tuple[str, ...], index: str, envs: list[dict[tuple[str, int], str]]
) -> None:
    """Each output of a vector program: the lanes' values of its stage, stored as the element ``index``."""
    off = em.reg("rd")
    em.op(f"mul.wide.u32 {off}, {index}, {4 * program.lanes}")
    for o, (_, j) in enumerate(program.outputs):
        ptr, gptr, addr = em.reg("rd"), em.reg("rd"), em.reg("rd")
        em.op(f"ld.param.u64 {ptr}, [{names[program.output_param(o)]}]")
        em.op(f"cvta.to.global.u64 {gptr}, {ptr}")
        em.op(f"add.s64 {addr}, {gptr}, {off}")
        for line in _vector_access("st.global", [env[("stage", j)] for env in envs], addr):
            em.op(line)


def generate_ptx(
    program: Program,
    arch: str = "sm_90",
    *,
    per_thread: int = 1,
    scalar_loads: ScalarLoads = "param",
    constants: Mapping[int, int] | None = None,
) -> str:
    """The PTX module of ``program`` for ``arch``: one ``.entry expression`` (see ``program.py``).

    ``per_thread`` > 1: each thread computes that many elements, ``blockDim.x`` apart (block ``b``
    covers ``b·blockDim.x·per_thread`` onwards, so every access stays coalesced), and the launch needs
    ``per_thread`` times fewer threads. The elements are independent chains in one basic block (loads
    clamped into the buffers, stores predicated), so ptxas interleaves them and each scalar it loads
    into a register (an ``LDC`` per scalar and thread on sm_90) serves ``per_thread`` elements.

    ``scalar_loads``: ``param`` reads each scalar with ``ld.param``. ptxas turns those into constant-bank
    loads (``LDC``) issued a few stages ahead of their use, so in a long chain (a fused group) each
    constant-cache line of the scalars is first asked for when the chain reaches it, one miss after
    another. ``prefetched`` asks for every line at the start (``prefetch.L1`` of the scalars' generic
    addresses, beside the input loads) and reads the scalars from there (``ld`` through
    ``cvta.param``: the launch's own argument bytes, so a Hot edit reaches them as before). Same
    values, same bits; sm_70 and newer (``cvta.param``), else ``param``.

    ``constants``: scalar index -> the bits of a float32 value compiled into the code in place of
    that scalar's load (a kernel specialised on the values its scalars hold; ``mov.f32`` of the exact
    bits, so it computes what the argument would). The kernel keeps every parameter (the same
    launch arguments), and ignores the scalars it was given constants for.
    """
    return _generate(program, arch, per_thread, None, scalar_loads, constants)


def _generate(
    program: Program,
    arch: str,
    per_thread: int,
    layout: Layout | None,
    scalar_loads: ScalarLoads = "param",
    constants: Mapping[int, int] | None = None,
) -> str:
    if per_thread < 1:
        raise ValueError(f"per_thread must be at least 1, got {per_thread}")
    lanes = program.lanes
    if lanes > 1 and (per_thread != 1 or layout is not None):
        raise ValueError("a program of vector inputs computes one element (all its lanes) per thread")
    if scalar_loads not in ("param", "prefetched"):
        raise ValueError(f"scalar_loads must be 'param' or 'prefetched', got {scalar_loads!r}")
    generic = scalar_loads == "prefetched" and bool(program.scalars) and _sm(arch) >= 70
    # prefixed: a user's name may be a PTX opcode or reserved word ("ret", "WARP_SZ")
    names = tuple(f"p_{name}" for name in program.param_names)
    desc = program.descriptor
    em = _Emitter()
    params = []
    for i, p in enumerate(desc.parameters):
        kind = "u64" if p.is_pointer else ("f32" if p.dtype.base.kind == "f" else "u32")
        params.append(f"\t.param .{kind} {names[i]}")
    idx_r = [em.reg("r") for _ in range(3)]
    em.op(f"mov.u32 {idx_r[0]}, %ctaid.x")
    em.op(f"mov.u32 {idx_r[1]}, %ntid.x")
    em.op(f"mov.u32 {idx_r[2]}, %tid.x")
    index = em.reg("r")
    if per_thread == 1:
        em.op(f"mad.lo.s32 {index}, {idx_r[0]}, {idx_r[1]}, {idx_r[2]}")
    else:
        span = em.reg("r")
        em.op(f"mul.lo.s32 {span}, {idx_r[1]}, {per_thread}")
        em.op(f"mad.lo.s32 {index}, {idx_r[0]}, {span}, {idx_r[2]}")
    count = em.reg("r")
    em.op(f"ld.param.u32 {count}, [{names[program.count_param]}]")
    done = em.reg("p")
    em.op(f"setp.ge.u32 {done}, {index}, {count}")
    em.op(f"@{done} bra $L_done")
    indices, inside = [index], [""]  # element k of this thread, and the guard of its store
    for k in range(1, per_thread):
        at_k = em.reg("r")
        em.op(f"mad.lo.s32 {at_k}, {idx_r[1]}, {k}, {index}")
        p = em.reg("p")
        em.op(f"setp.lt.u32 {p}, {at_k}, {count}")
        indices.append(at_k)
        inside.append(f"@{p} ")
    envs: list[dict[tuple[str, int], str]] = [{} for _ in indices]
    if lanes > 1:  # one environment per lane of the thread's element; ``index`` is the element's in each
        envs = [{} for _ in range(lanes)]
        indices, inside = [index] * lanes, [""] * lanes
    scalar_at: list[str] = []  # the generic address of each scalar (``prefetched``)
    if generic:
        em.comment("scalars: their generic addresses, and a prefetch of each 128-byte line of them")
        for s in range(len(program.scalars)):
            pa, ga = em.reg("rd"), em.reg("rd")
            em.op(f"mov.u64 {pa}, {names[program.scalar_param(s)]}")
            em.op(f"cvta.param.u64 {ga}, {pa}")
            scalar_at.append(ga)
        last = len(scalar_at) - 1
        for s in (*range(0, last, _LINE_SCALARS), last):
            em.op(f"prefetch.L1 [{scalar_at[s]}]")
    for i in range(len(program.inputs) if lanes > 1 else 0):
        _load_lanes(em, program, names, i, index, envs)
    for i, name in enumerate(program.inputs if lanes == 1 else ()):
        em.comment(f"input {name}: element min(index, {name}_count - 1)")
        base, cnt = program.input_param(i), program.input_param(i) + 1
        ptr, n_in, last = em.reg("rd"), em.reg("r"), em.reg("r")
        em.op(f"ld.param.u64 {ptr}, [{names[base]}]")
        em.op(f"ld.param.u32 {n_in}, [{names[cnt]}]")
        em.op(f"sub.s32 {last}, {n_in}, 1")
        for k, at_k in enumerate(indices):
            at = em.reg("r")
            em.op(f"min.u32 {at}, {at_k}, {last}")
            if k == 0:
                gptr = em.reg("rd")
            off, addr = em.reg("rd"), em.reg("rd")
            if k == 0:
                em.op(f"cvta.to.global.u64 {gptr}, {ptr}")
            em.op(f"mul.wide.u32 {off}, {at}, 4")
            em.op(f"add.s64 {addr}, {gptr}, {off}")
            value = em.reg("f")
            # a plain ld.global, not .nc: the pool may give an input and an output of one kernel the same memory
            em.op(f"ld.global.f32 {value}, [{addr}]")
            envs[k][("input", i)] = value
    for s in range(len(program.scalars)):
        value = em.reg("f")
        bits = constants.get(s) if constants else None
        if bits is not None:
            em.op(f"mov.f32 {value}, 0f{bits & 0xFFFFFFFF:08X}")
        elif generic:
            em.op(f"ld.f32 {value}, [{scalar_at[s]}]")
        else:
            em.op(f"ld.param.f32 {value}, [{names[program.scalar_param(s)]}]")
        for env in envs:
            env[("scalar", s)] = value
    body_start = len(em.lines)
    for j, stage in enumerate(program.stages):
        em.comment(f"{stage.label or f'stage {j}'}: {stage.expr.text.strip()}")
        for env, at_k in zip(envs, indices, strict=True):
            vals = _Values(em, stage, env, at_k, count)
            reg = vals.emit(stage.expr.root)
            env[("stage", j)] = vals.as_float(reg, stage.expr.type_of(stage.expr.root))
    if layout is not None:
        env = envs[0]
        layout.index, layout.count = index, count
        layout.inputs = [env[("input", i)] for i in range(len(program.inputs))]
        layout.scalars = [env[("scalar", s)] for s in range(len(program.scalars))]
        layout.outputs = [env[("stage", j)] for _, j in program.outputs]
        layout.body = [ln.strip().rstrip(";") for ln in em.lines[body_start:] if not ln.strip().startswith("//")]
    if lanes > 1:
        _store_lanes(em, program, names, index, envs)
    offs = []
    for at_k in indices if lanes == 1 else ():
        off = em.reg("rd")
        em.op(f"mul.wide.u32 {off}, {at_k}, 4")
        offs.append(off)
    for o, (_, j) in enumerate(program.outputs if lanes == 1 else ()):
        ptr, gptr = em.reg("rd"), em.reg("rd")
        em.op(f"ld.param.u64 {ptr}, [{names[program.output_param(o)]}]")
        em.op(f"cvta.to.global.u64 {gptr}, {ptr}")
        for env, off, guard in zip(envs, offs, inside, strict=True):
            addr = em.reg("rd")
            em.op(f"add.s64 {addr}, {gptr}, {off}")
            em.op(f"{guard}st.global.f32 [{addr}], {env[('stage', j)]}")
    c = em.counts
    head = [
        "// Generated by cudapatch.expr from:",
        *(f"//   {line}" for line in program.summary().splitlines()),
        *(
            [f"// {LANE_BY_LANE} {vector_dtype(lanes).c_name}: one thread per element, its lanes in turn"]
            if lanes > 1
            else []
        ),
        f".version {ptx_version_for(arch)}",
        f".target {arch}",
        ".address_size 64",
        "",
        f".visible .entry {desc.entry_point}(",
        ",\n".join(params),
        ")",
        "{",
        f"\t.reg .pred %p<{c['p'] + 1}>;",
        f"\t.reg .f32 %f<{c['f'] + 1}>;",
        f"\t.reg .b32 %r<{c['r'] + 1}>;",
        f"\t.reg .b64 %rd<{c['rd'] + 1}>;",
        "",
    ]
    return "\n".join([*head, *em.lines, "$L_done:", "\tret;", "}", ""])
