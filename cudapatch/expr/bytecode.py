"""An edit that runs without a compiler: the program as bytecode for a precompiled interpreter kernel.

The driver's JIT of even a one-line kernel costs milliseconds (``source.py``). So the first build of an
edit (``ProgramSource`` with ``jit="quick"``) is, where it can be, an *interpreter*: one CUDA C++
kernel per signature (number of inputs and scalars), compiled by NVRTC once per process, that runs a
program read from its own ``__constant__`` array ``cp_program``. An edit only writes the program into
a copy of that cubin (the array's initial data, found by a marker) and loads the copy: no JIT. The
optimised kernel follows through ``ProgramSource.upgrade``.

The bytecode is a translation of the generated PTX's body instruction by instruction (``ptx_layout``),
and the interpreter runs each instruction as that same PTX instruction (inline ``asm``), so it gives
the bits of the generated kernel. Every value is a 32-bit word in a slot of a per-thread array;
slots are reused once a value is dead (linear scan), so a long chain needs few.

Program words: ``n_instructions, n_constants, index slot, count slot, output slot``, a slot per input,
a slot per scalar, ``(slot, bits)`` per constant, then 5 words per instruction:
``opcode, destination, a, b, c`` (operand slots; unused ones 0).
"""

from __future__ import annotations

import atexit
import re
import struct
import threading
import time
from dataclasses import dataclass

from .program import Program
from .ptx_gen import ptx_layout

__all__ = ["INTERPRETERS", "OPS", "MAX_SLOTS", "MAX_WORDS", "Bytecode", "assemble", "interpreter_cuda", "patch_program"]

#: Value slots per thread (a local array): a program that needs more runs as JITted PTX instead.
MAX_SLOTS = 64
#: Words of the ``cp_program`` constant array (16 KB, about 800 instructions).
MAX_WORDS = 4096
#: The first words of ``cp_program`` in the cubin: where the program goes in a copy.
MARKER = (0x9E3779B9, 0x7F4A7C15, 0x85EBCA6B, 0xC2B2AE35, 0x27D4EB2F, 0x165667B1, 0xD3A2646C, 0xFD7046C5)

_F2 = '{ float r; asm("%s %%0, %%1, %%2;" : "=f"(r) : "f"(fa), "f"(fb)); v = __float_as_uint(r); }'
_F1 = '{ float r; asm("%s %%0, %%1;" : "=f"(r) : "f"(fa)); v = __float_as_uint(r); }'
_I2 = '{ int r; asm("%s %%0, %%1, %%2;" : "=r"(r) : "r"(a), "r"(b)); v = (unsigned)r; }'
_I1 = '{ int r; asm("%s %%0, %%1;" : "=r"(r) : "r"(a)); v = (unsigned)r; }'
_SETP_F = 'asm("{ .reg .pred q; %s q, %%1, %%2; selp.u32 %%0, 1, 0, q; }" : "=r"(v) : "f"(fa), "f"(fb));'
_SETP_I = 'asm("{ .reg .pred q; %s q, %%1, %%2; selp.u32 %%0, 1, 0, q; }" : "=r"(v) : "r"(a), "r"(b));'


def _ops() -> dict[str, tuple[int, str]]:
    """PTX instruction → (opcode, operand count, C statement setting ``v`` from ``a b c``/``fa fb fc``)."""
    table: list[tuple[str, int, str]] = []
    for op in ("add.rn.f32", "sub.rn.f32", "mul.rn.f32", "div.rn.f32", "min.f32", "max.f32"):
        table.append((op, 2, _F2 % op))
    for op in ("neg.f32", "abs.f32", "sqrt.rn.f32", "sin.approx.f32", "cos.approx.f32", "ex2.approx.f32"):
        table.append((op, 1, _F1 % op))
    for op in ("lg2.approx.f32", "cvt.rni.f32.f32", "cvt.rmi.f32.f32"):
        table.append((op, 1, _F1 % op))
    fma = (
        '{ float r; asm("fma.rn.f32 %0, %1, %2, %3;" : "=f"(r) : "f"(fa), "f"(fb), "f"(fc)); v = __float_as_uint(r); }'
    )
    table.append(("fma.rn.f32", 3, fma))
    for op in ("add.s32", "sub.s32", "mul.lo.s32", "rem.s32", "and.b32", "or.b32", "xor.b32", "shl.b32", "shr.s32"):
        table.append((op, 2, _I2 % op))
    for op in ("min.s32", "max.s32"):
        table.append((op, 2, _I2 % op))
    for op in ("not.b32", "neg.s32", "abs.s32"):
        table.append((op, 1, _I1 % op))
    cvt_f = '{ float r; asm("cvt.rn.f32.s32 %0, %1;" : "=f"(r) : "r"(a)); v = __float_as_uint(r); }'
    table.append(("cvt.rn.f32.s32", 1, cvt_f))
    table.append(
        ("cvt.rzi.s32.f32", 1, '{ int r; asm("cvt.rzi.s32.f32 %0, %1;" : "=r"(r) : "f"(fa)); v = (unsigned)r; }')
    )
    for cmp in ("lt", "le", "gt", "ge", "eq", "neu"):
        table.append((f"setp.{cmp}.f32", 2, _SETP_F % f"setp.{cmp}.f32"))
    for cmp in ("lt", "le", "gt", "ge", "eq", "ne"):
        table.append((f"setp.{cmp}.s32", 2, _SETP_I % f"setp.{cmp}.s32"))
    table.append(("and.pred", 2, "v = a & b;"))
    table.append(("or.pred", 2, "v = a | b;"))
    table.append(("not.pred", 1, "v = a ^ 1u;"))
    table.append(("selp.f32", 3, "v = c ? a : b;"))  # selp d, a, b, p: a where p
    table.append(("selp.s32", 3, "v = c ? a : b;"))
    table.append(("mov.f32", 1, "v = a;"))
    table.append(("mov.s32", 1, "v = a;"))
    return {op: (code, n, stmt) for code, (op, n, stmt) in enumerate(table)}


#: Every PTX instruction the interpreter runs: name → (opcode, operand count, C statement).
OPS = _ops()

_REG = re.compile(r"^%[a-z]+\d+$")


@dataclass(frozen=True)
class Bytecode:
    """A program for the interpreter: its words and how many value slots it needs."""

    words: tuple[int, ...]
    slots: int

    def to_bytes(self) -> bytes:
        return struct.pack(f"<{len(self.words)}I", *self.words)


def _immediate(text: str) -> int:
    if text.startswith("0f"):
        return int(text[2:], 16)
    return int(text) & 0xFFFFFFFF


def assemble(program: Program) -> Bytecode | None:
    """``program``'s bytecode, or None when the interpreter cannot run it (more than one output, a
    PTX instruction it lacks, more than ``MAX_SLOTS`` live values, more than ``MAX_WORDS`` words)."""
    if len(program.outputs) != 1:
        return None
    if program.lanes > 1:  # a vector program: each lane is its float program (the interpreter loops over lanes)
        program = Program(program.inputs, program.scalars, program.outputs, program.stages)
    layout = ptx_layout(program)
    instrs: list[tuple[str, str, list[str]]] = []
    for line in layout.body:
        op, _, rest = line.partition(" ")
        if op not in OPS:
            return None
        dst, *args = (a.strip() for a in rest.split(","))
        if len(args) != OPS[op][1]:
            return None
        instrs.append((op, dst, args))
    # values known before the first instruction: index, count, inputs, scalars, constants
    preset = [layout.index, layout.count, *layout.inputs, *layout.scalars]
    constants: dict[int, str] = {}
    for _, _, args in instrs:
        for a in args:
            if not _REG.match(a):
                bits = _immediate(a)
                constants.setdefault(bits, f"#k{bits}")
    instrs = [(op, d, [a if _REG.match(a) else constants[_immediate(a)] for a in args]) for op, d, args in instrs]
    last: dict[str, int] = {}
    for i, (_, _, args) in enumerate(instrs):
        for a in args:
            last[a] = i
    out = layout.outputs[0]
    last[out] = len(instrs)  # stored after the last instruction
    slot: dict[str, int] = {}
    free: list[int] = []
    top = 0

    def take(name: str) -> int:
        nonlocal top
        if free:
            s = free.pop()
        else:
            s, top = top, top + 1
        slot[name] = s
        return s

    for name in [*preset, *constants.values()]:
        if name not in slot:  # an input bound twice shares a register: one slot
            take(name)
    for name in [*preset, *constants.values()]:
        if name not in last and name != out and slot.get(name) is not None and slot[name] not in free:
            free.append(slot[name])  # never read: its slot is free from the start
    code: list[int] = []
    for i, (op, dst, args) in enumerate(instrs):
        operands = [slot[a] for a in args]
        for a in dict.fromkeys(args):  # not a set: the same slots in every process
            if last.get(a) == i:  # dead after this instruction: its slot may take the result
                free.append(slot[a])
        d = take(dst)
        code += [OPS[op][0], d, *operands, *([0] * (3 - len(operands)))]
    if top > MAX_SLOTS or out not in slot:
        return None
    head = [len(instrs), len(constants), slot[layout.index], slot[layout.count], slot[out]]
    head += [slot[r] for r in layout.inputs] + [slot[r] for r in layout.scalars]
    for bits, name in constants.items():
        head += [slot[name], bits]
    words = (*head, *code)
    if len(words) > MAX_WORDS:
        return None
    return Bytecode(words, top)


def interpreter_cuda(n_inputs: int, n_scalars: int, lanes: tuple[int, ...] = ()) -> str:
    """The interpreter kernel for programs of ``n_inputs`` inputs and ``n_scalars`` scalars, as CUDA
    C++: the parameters of the generated kernel (``program.py``), one output. ``lanes`` (each input's,
    for a program of vector inputs): the kernel runs the program once per lane of its element
    (``_vector_interpreter_cuda``)."""
    if lanes and max(lanes) > 1:
        return _vector_interpreter_cuda(n_inputs, n_scalars, lanes)
    # no __restrict__: an input and the output may share memory, as in the generated kernel
    params = [f"const float* in{i}, unsigned int in{i}_count" for i in range(n_inputs)]
    params.append("float* out0")
    params += [f"float s{s}" for s in range(n_scalars)]
    params.append("unsigned int n")
    marker = ", ".join(f"0x{w:08X}u" for w in MARKER)
    loads = "\n".join(
        f"    r[cp_program[5 + {i}]] = __float_as_uint(in{i}[min(i, in{i}_count - 1u)]);" for i in range(n_inputs)
    )
    scalars = "\n".join(f"    r[cp_program[5 + {n_inputs + s}]] = __float_as_uint(s{s});" for s in range(n_scalars))
    return f"""// cudapatch expression interpreter: {n_inputs} inputs, {n_scalars} scalars (cudapatch/expr/bytecode.py)
__constant__ unsigned int cp_program[{MAX_WORDS}] = {{{marker}}};

extern "C" __global__ void expression({", ".join(params)})
{{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned int r[{MAX_SLOTS}];
    r[cp_program[2]] = i;
    r[cp_program[3]] = n;
{loads}
{scalars}
{_run_program(n_inputs + n_scalars, "    ")}
    out0[i] = __uint_as_float(r[cp_program[4]]);
}}
"""


def _vector_interpreter_cuda(n_inputs: int, n_scalars: int, lanes: tuple[int, ...]) -> str:
    """The interpreter for programs of vector inputs (``lanes`` per input): the generated kernel's
    parameters (``const float4*`` ...), one thread per element, and the program, which is the float
    program of one lane, run once per lane: a vector input gives each run its lane, a float input its
    one value, and the results are stored as the element. Each run is the generated kernel's lane."""
    out_lanes = max(lanes)
    vec = {1: "float", 2: "float2", 3: "float3", 4: "float4"}
    params = [f"const {vec[li]}* in{i}, unsigned int in{i}_count" for i, li in enumerate(lanes)]
    params.append(f"{vec[out_lanes]}* out0")
    params += [f"float s{s}" for s in range(n_scalars)]
    params.append("unsigned int n")
    marker = ", ".join(f"0x{w:08X}u" for w in MARKER)
    reads = []
    for i, li in enumerate(lanes):
        reads.append(f"    const {vec[li]} e{i} = in{i}[min(i, in{i}_count - 1u)];")
        if li > 1:
            reads.append(f"    const float v{i}[{li}] = {{{', '.join(f'e{i}.{c}' for c in 'xyzw'[:li])}}};")
    loads = "\n".join(
        f"        r[cp_program[5 + {i}]] = __float_as_uint({f'v{i}[lane]' if li > 1 else f'e{i}'});"
        for i, li in enumerate(lanes)
    )
    scalars = "\n".join(f"        r[cp_program[5 + {n_inputs + s}]] = __float_as_uint(s{s});" for s in range(n_scalars))
    store = f"make_{vec[out_lanes]}({', '.join(f'res[{k}]' for k in range(out_lanes))})"
    return f"""// cudapatch expression interpreter: inputs of lanes {lanes}, {n_scalars} scalars (bytecode.py)
__constant__ unsigned int cp_program[{MAX_WORDS}] = {{{marker}}};

extern "C" __global__ void expression({", ".join(params)})
{{
    const unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
{chr(10).join(reads)}
    unsigned int r[{MAX_SLOTS}];
    float res[{out_lanes}];
    for (unsigned int lane = 0; lane < {out_lanes}u; ++lane) {{
        r[cp_program[2]] = i;
        r[cp_program[3]] = n;
{loads}
{scalars}
{_run_program(n_inputs + n_scalars, "        ")}
        res[lane] = __uint_as_float(r[cp_program[4]]);
    }}
    out0[i] = {store};
}}
"""


def _run_program(first_constant_slot: int, indent: str) -> str:
    """The interpreter's loop over ``cp_program`` (its constants into their slots, then each
    instruction), as CUDA C++ lines indented by ``indent``: the same in both interpreters."""
    lines = [
        "const unsigned int constants = cp_program[1];",
        f"unsigned int at = 5 + {first_constant_slot};",
        "for (unsigned int k = 0; k < constants; ++k, at += 2) r[cp_program[at]] = cp_program[at + 1];",
        "const unsigned int count = cp_program[0];",
        "for (unsigned int k = 0; k < count; ++k, at += 5) {",
        "    const unsigned int a = r[cp_program[at + 2]], b = r[cp_program[at + 3]], c = r[cp_program[at + 4]];",
        "    const float fa = __uint_as_float(a), fb = __uint_as_float(b), fc = __uint_as_float(c);",
        "    unsigned int v = 0;",
        "    switch (cp_program[at]) {",
        *(f"        case {code}: {stmt} break;" for code, _, stmt in OPS.values()),
        "        default: break;",
        "    }",
        "    r[cp_program[at + 1]] = v;",
        "}",
    ]
    return "\n".join(indent + line for line in lines)


_MARKER_BYTES = struct.pack(f"<{len(MARKER)}I", *MARKER)


def patch_program(cubin: bytes, code: Bytecode) -> bytes:
    """A copy of the interpreter's ``cubin`` whose ``cp_program`` holds ``code`` (zeros after it).

    Raises:
        ValueError: the cubin holds the marker not exactly once (not an interpreter cubin).
    """
    at = cubin.find(_MARKER_BYTES)
    if at < 0 or cubin.find(_MARKER_BYTES, at + 1) >= 0:
        raise ValueError("not an expression interpreter cubin (its program marker is missing or repeated)")
    data = code.to_bytes()
    return cubin[:at] + data + bytes(4 * MAX_WORDS - len(data)) + cubin[at + 4 * MAX_WORDS :]


class _Interpreters:
    """Interpreter cubins by ``(inputs, scalars, arch)``, compiled by NVRTC on a background thread the
    first time one is asked for (until then the asker JITs its PTX instead).

    NVRTC runs in this process, so a compile still running when the interpreter exits would be inside
    NVRTC while the process tears its libraries down ("double free or corruption" at the exit of a
    short script that edited an expression): ``join`` waits for them, and runs at exit."""

    def __init__(self) -> None:
        self._done: dict[tuple, tuple[bytes, str] | None] = {}
        self._started: set[tuple] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def get(
        self, n_inputs: int, n_scalars: int, arch: str, *, wait: bool = False, lanes: tuple[int, ...] = ()
    ) -> tuple[bytes, str] | None:
        """``(cubin, entry symbol)``, or None while it compiles (``wait``: compile it now) or when it
        failed to compile. ``lanes``: each input's, for a program of vector inputs."""
        key: tuple = (n_inputs, n_scalars, arch, lanes) if lanes and max(lanes) > 1 else (n_inputs, n_scalars, arch)
        with self._lock:
            if key in self._done:
                return self._done[key]
            start = key not in self._started
            self._started.add(key)
        if wait:
            return self._compile(key)
        if start:
            t = threading.Thread(target=self._compile, args=(key,), name="cudapatch-interp", daemon=True)
            t.start()
            with self._lock:
                self._threads = [th for th in self._threads if th.is_alive()]
                self._threads.append(t)
        return None

    def join(self, timeout: float = 30.0) -> None:
        """Wait until the compiles running now are done (at most ``timeout`` seconds in all)."""
        deadline = time.monotonic() + timeout
        with self._lock:
            threads = list(self._threads)
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _compile(self, key: tuple) -> tuple[bytes, str] | None:
        from ..kernels._toolchain import nvrtc_compile
        from .cuda_gen import NVRTC_OPTIONS

        n_inputs, n_scalars, arch, *vector = key
        try:
            cubin, symbol, _log = nvrtc_compile(
                interpreter_cuda(n_inputs, n_scalars, *vector),
                name="interpreter.cu",
                entry="expression",
                arch=arch,
                options=NVRTC_OPTIONS,
            )
            found: tuple[bytes, str] | None = (cubin, symbol)
        except Exception as exc:  # no NVRTC, or a generator bug: edits JIT their PTX instead
            import logging

            logging.getLogger("cudapatch.kernels").debug("expression interpreter %s did not compile: %s", key, exc)
            found = None
        with self._lock:
            self._done[key] = found
        return found


#: The process's interpreter cubins.
INTERPRETERS = _Interpreters()
atexit.register(INTERPRETERS.join)
