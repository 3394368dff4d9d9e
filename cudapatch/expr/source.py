"""``ProgramSource``: a generated kernel as a ``KernelSource``, so the engine compiles, caches, loads
and swaps it like any other (``kernels/builder.py``, the Code tier).

Two back ends, chosen per source:

- ``ptx`` (the default): ``compile`` writes PTX text (``ptx_gen``, microseconds) and hands it to the
  driver, which JITs a kernel this small when the builder loads the module off the frame thread.
  Nothing else runs, so an edit can be live within a couple of milliseconds.
- ``nvrtc``: the same kernel as CUDA C++ (``cuda_gen``) compiled by NVRTC to a cubin, 20-40 ms: the
  reference the PTX path is checked against, bit for bit.

**Live first, optimised next.** The driver's JIT of even a one-line kernel costs milliseconds at
its default level (measured ~6 ms on the H200 host). A ``quick`` source (what an ``Expression``
block and a fused group's regenerated kernel use) is built so an edit runs as soon as possible: as
the program in a copy of a precompiled interpreter kernel (``bytecode.py``: no compiler at all)
where the interpreter can run it and has been compiled for its signature, else as its PTX JITted at
``QUICK_JIT_LEVEL``. Once it runs, ``upgrade()`` names the same PTX at the default level, which the
engine compiles in the background and swaps in through the Code tier as well (``KernelTracker``,
``CodeTier``). All give the same bits: the PTX fixes every rounding (see ``ptx_gen``), a JIT level
only schedules instructions, and the interpreter runs each of its instructions as that instruction.

A source built from an expression that does not compile (``broken``) keeps the descriptor of the
kernel it replaces and fails in ``compile`` with the ``ExpressionError``: a live edit with a typo
becomes a compile error on the block, with its column, while the previous kernel keeps running.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Literal

from ..errors import KernelCompileError
from ..kernels._toolchain import link_ptx, linker_version, nvrtc_compile, toolchain_version
from ..kernels.cache import cache_key
from ..kernels.descriptor import KernelDescriptor
from ..kernels.source import KernelImage, KernelSource
from .bytecode import INTERPRETERS, assemble, patch_program
from .check import first_use
from .cuda_gen import NVRTC_OPTIONS, generate_cuda
from .errors import ExpressionError
from .program import GENERATOR_VERSION, Program
from .ptx_gen import ScalarLoads, generate_ptx

__all__ = ["Backend", "Jit", "ProgramSource", "BACKENDS", "QUICK_JIT_LEVEL"]

Backend = Literal["ptx", "nvrtc"]
BACKENDS: tuple[Backend, ...] = ("ptx", "nvrtc")
#: ``quick``: JIT at ``QUICK_JIT_LEVEL`` and upgrade later; ``full``: the driver's default level.
Jit = Literal["quick", "full"]
#: ``CU_JIT_OPTIMIZATION_LEVEL`` of a quick build. ``benchmarks/probes/probe_expression_jit.py``
#: measures every level's JIT time; 0 does the least work.
QUICK_JIT_LEVEL = 0


@dataclass(frozen=True)
class ProgramSource(KernelSource):
    """A generated elementwise kernel (see ``program.Program``).

    Compared by ``key`` (the program's content hash), ``backend`` and ``name``, so a block
    re-described with the same expression keeps an equal description.

    Args:
        key: ``program.key``.
        backend: ``ptx`` or ``nvrtc``.
        name: Label for messages (the block's name).
        program: The program (None for a broken source).
        broken: The error a broken source fails with.
        broken_descriptor: The descriptor a broken source pretends to have (the running kernel's).
        jit: ``quick`` (PTX only): JIT at ``QUICK_JIT_LEVEL``, then ``upgrade()``; ``full``: the
            driver's default level at once.
        per_thread: Elements per thread (PTX only, see ``generate_ptx``): the launch must cover
            ``count / per_thread`` threads (the fusion phase sets both for fused groups).
        scalar_loads: How the kernel reads its scalars (PTX only, see ``generate_ptx``; the fusion phase
            chooses for fused groups). Either way the scalars are the launch's arguments.
        constants: ``(scalar index, float32 bits)`` compiled into the code in place of those scalars'
            loads (PTX only; ``specialized``): the same arguments, some of them ignored.
    """

    key: str
    backend: Backend = "ptx"
    name: str = "expression"
    program: Program | None = field(default=None, compare=False, hash=False, repr=False)
    broken: ExpressionError | None = field(default=None, compare=False, hash=False, repr=False)
    broken_descriptor: KernelDescriptor | None = field(default=None, compare=False, hash=False, repr=False)
    jit: Jit = "full"
    per_thread: int = 1
    scalar_loads: ScalarLoads = "param"
    constants: tuple[tuple[int, int], ...] = ()

    @classmethod
    def of(
        cls, program: Program, *, backend: Backend = "ptx", name: str = "expression", jit: Jit = "full"
    ) -> ProgramSource:
        """The source of ``program`` (``jit`` applies to the ``ptx`` back end only)."""
        return cls(program.key, backend, name, program, jit=jit if backend == "ptx" else "full")

    def __post_init__(self) -> None:
        if self.per_thread != 1 and self.backend != "ptx":
            raise ValueError("only the ptx back end computes several elements per thread")
        if self.scalar_loads != "param" and self.backend != "ptx":
            raise ValueError("only the ptx back end prefetches its scalars")
        if self.constants and self.backend != "ptx":
            raise ValueError("only the ptx back end compiles scalars in as constants")

    def specialized(self, constants: tuple[tuple[int, int], ...]) -> ProgramSource:
        """This kernel with ``constants`` (``(scalar index, float32 bits)``) compiled in place of those
        scalars' loads, JITted at the driver's default level: the same arguments, the same results for
        the values given, fewer loads (a fused chain's scalars cost a constant-bank load each)."""
        return dataclasses.replace(self, constants=tuple(constants), jit="full")

    @property
    def disk_cached(self) -> bool:
        """A specialised kernel (a slider's resting values) is kept in memory only: the disk cache
        would grow with every value a slider ever rested on."""
        return not self.constants

    def upgrade(self) -> ProgramSource | None:
        """The same kernel JITted at the driver's default level, for a quick source (else None)."""
        if self.jit != "quick" or self.backend != "ptx" or self.program is None:
            return None
        return dataclasses.replace(self, jit="full")

    @classmethod
    def failing(cls, error: ExpressionError, descriptor: KernelDescriptor, *, name: str) -> ProgramSource:
        """A source whose ``compile`` raises ``error`` and whose descriptor is ``descriptor``."""
        key = hashlib.sha256(f"broken:{error}".encode()).hexdigest()
        return cls(key, "ptx", name, None, error, descriptor)

    @property
    def portable(self) -> bool:
        """Generated PTX is built here, not in a compiler process: no compiler runs (0.1 ms of Python),
        and the interpreter's cubin is compiled once per signature in this process, so a quick build
        finds it (in a compiler process it was never ready: every edit JITted its PTX, 6 ms on the
        H200 host). NVRTC builds go to a compiler process as every NVRTC compile does, and so do
        specialised kernels (``constants``): nobody waits for them, and their nvJitLink link (8-14 ms
        on the H100 host) then takes no CPU or GIL from this process's frames."""
        return self.backend != "ptx" or bool(self.constants)

    @property
    def debug_name(self) -> str:
        return self.name

    def describe(self) -> KernelDescriptor:
        if self.program is None:
            assert self.broken_descriptor is not None
            return self.broken_descriptor
        return self.program.descriptor

    def code(self, arch: str = "sm_90") -> str:
        """The generated code this back end compiles: PTX for ``arch``, or CUDA C++.

        Raises:
            ExpressionError: a broken source.
        """
        if self.program is None:
            assert self.broken is not None
            raise self.broken
        # Generated once per source and arch: tooltips, the editor and the overlay ask every frame they
        # show it (a frozen dataclass: the cache is no field, so equality and hashing ignore it).
        memo: dict[str, str] = self.__dict__.setdefault("_generated", {})
        code = memo.get(arch)
        if code is None:
            if self.backend == "ptx":
                code = generate_ptx(
                    self.program,
                    arch,
                    per_thread=self.per_thread,
                    scalar_loads=self.scalar_loads,
                    constants=dict(self.constants),
                )
            else:
                code = generate_cuda(self.program)
            memo[arch] = code
        return code

    @property
    def warning(self) -> str | None:
        """What the block running this source should be warned of, or None: names its expression
        declares (an ``Expression``'s ``Inputs``/``Scalars``) but does not use. They keep their ports
        and scalars; nothing reads them. The graph compiler asks once per build."""
        program = self.program
        if program is None or len(program.stages) != 1:
            return None
        unused = program.stages[0].expr.unused
        if not unused:
            return None
        names = ", ".join(f"input '{n}'" if n in program.inputs else f"scalar '{n}'" for n in unused)
        them = "it" if len(unused) == 1 else "them"
        return f"the expression does not use its declared {names} (kept, and nothing reads {them})"

    def check_counts(self, counts: dict[str, int], values: object = None) -> str | None:
        """What is wrong with these input lengths (port name → elements), or None. An input needs as
        many elements as the first input (which sets the launch) or one (broadcast); the message
        names the column where the expression first uses the input. The graph compiler asks before
        the block runs (a block whose inputs do not fit does not run)."""
        program = self.program
        if program is None or len(program.stages) != 1 or not program.inputs:
            return None
        first = program.inputs[0]
        n = counts.get(first)
        for name in program.inputs[1:]:
            c = counts.get(name)
            if n is None or c is None or c in (n, 1):
                continue
            col = first_use(program.stages[0].expr.root, name)
            if col is None:  # a declared input the expression does not use: nothing reads it
                continue
            return (
                f"input '{name}' has {c} elements but '{first}' (the first input, which sets the output's "
                f"length) has {n}: give '{name}' {n} elements, or 1 to broadcast it (column {col})"
            )
        return None

    def cache_key(self, arch: str) -> str:
        tool = toolchain_version() if self.backend == "nvrtc" else ""
        parts = ["expr", GENERATOR_VERSION, self.backend, self.key, arch, tool, self.jit, str(self.per_thread)]
        if self.scalar_loads != "param":  # ``param`` kernels keep the keys they always had
            parts.append(self.scalar_loads)
        if self.constants:
            parts.append("const-" + ",".join(f"{i}:{bits:08x}" for i, bits in self.constants))
        if self.backend == "ptx" and self.jit != "quick":  # the cubin this nvJitLink links, or the PTX ("none")
            parts.append(f"link-{linker_version()}")
        return cache_key(*parts)

    def compile(self, arch: str) -> KernelImage:
        """PTX text (the driver JITs it at load) or an NVRTC cubin. A quick source is, where it can be,
        the interpreter's cubin holding the program (``bytecode.py``: nothing to JIT), else PTX the
        driver JITs at ``QUICK_JIT_LEVEL``.

        Raises:
            ExpressionError: a broken source. KernelCompileError: NVRTC failed (a generator bug).
        """
        if self.jit == "quick" and self.backend == "ptx":
            interpreted = self._interpreted(arch)
            if interpreted is not None:
                return interpreted
        text = self.code(arch)
        desc = self.describe()
        if self.backend == "ptx":
            image = text.encode() + b"\0"  # the driver wants NUL-terminated PTX
            key = hashlib.sha256(image).hexdigest()
            if self.jit == "quick":  # another module than the optimised build of the same text
                level = QUICK_JIT_LEVEL
                return KernelImage(desc, image, "ptx", f"{key}-O{level}", self.name, jit_level=level)
            # A cubin from nvJitLink: loading PTX makes the driver JIT it while holding the lock every
            # graph launch of the context takes, so a fused group's kernel, built on the build thread
            # as the frames run, stalled those frames for as long as its JIT took.
            try:
                cubin = link_ptx(image, name=f"{self.name}.ptx", arch=arch, kernel=desc.entry_point)
            except KernelCompileError:  # no nvJitLink (or it refuses): the driver JITs the PTX
                return KernelImage(desc, image, "ptx", key, self.name)
            return KernelImage(desc, cubin, "cubin", hashlib.sha256(cubin).hexdigest(), self.name)
        cubin, symbol, _log = nvrtc_compile(
            text, name=f"{self.name}.cu", entry=desc.entry_point, arch=arch, options=NVRTC_OPTIONS
        )
        return KernelImage(desc, cubin, "cubin", hashlib.sha256(cubin).hexdigest(), self.name, symbol=symbol)

    def _interpreted(self, arch: str) -> KernelImage | None:
        """The program in a copy of the interpreter's cubin, or None (the interpreter cannot run it, or
        is still compiling: the first quick build of a signature starts that and JITs its PTX)."""
        program = self.program
        if program is None or self.per_thread != 1:
            return None
        code = assemble(program)
        if code is None:
            return None
        if program.lanes > 1:  # an interpreter of its own: the program runs once per lane
            found = INTERPRETERS.get(len(program.inputs), len(program.scalars), arch, lanes=program.input_lanes)
        else:
            found = INTERPRETERS.get(len(program.inputs), len(program.scalars), arch)
        if found is None:
            return None
        cubin, symbol = found
        image = patch_program(cubin, code)
        key = hashlib.sha256(image).hexdigest()
        return KernelImage(self.describe(), image, "cubin", key, f"{self.name} (interpreted)", symbol=symbol)
