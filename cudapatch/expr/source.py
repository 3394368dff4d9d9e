"""``ProgramSource``: a generated kernel as a ``KernelSource``, so the engine compiles, caches, loads
and swaps it like any other (``kernels/builder.py``, the Code tier).

Two back ends, chosen per source:

- ``ptx`` (the default): ``compile`` writes PTX text (``ptx_gen``, microseconds) and hands it to the
  driver, which JITs a kernel this small when the builder loads the module off the frame thread.
  Nothing else runs, so an edit can be live within a couple of milliseconds.
- ``nvrtc``: the same kernel as CUDA C++ (``cuda_gen``) compiled by NVRTC to a cubin, 20-40 ms: the
  reference the PTX path is checked against, bit for bit.

A source built from an expression that does not compile (``broken``) keeps the descriptor of the
kernel it replaces and fails in ``compile`` with the ``ExpressionError``: a live edit with a typo
becomes a compile error on the block, with its column, while the previous kernel keeps running.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

from ..kernels._toolchain import nvrtc_compile, toolchain_version
from ..kernels.cache import cache_key
from ..kernels.descriptor import KernelDescriptor
from ..kernels.source import KernelImage, KernelSource
from .cuda_gen import NVRTC_OPTIONS, generate_cuda
from .errors import ExpressionError
from .program import GENERATOR_VERSION, Program
from .ptx_gen import generate_ptx
from .syntax import Binary, Call, Name, Node, Unary

__all__ = ["Backend", "ProgramSource", "BACKENDS"]

Backend = Literal["ptx", "nvrtc"]
BACKENDS: tuple[Backend, ...] = ("ptx", "nvrtc")


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
    """

    key: str
    backend: Backend = "ptx"
    name: str = "expression"
    program: Program | None = field(default=None, compare=False, hash=False, repr=False)
    broken: ExpressionError | None = field(default=None, compare=False, hash=False, repr=False)
    broken_descriptor: KernelDescriptor | None = field(default=None, compare=False, hash=False, repr=False)

    @classmethod
    def of(cls, program: Program, *, backend: Backend = "ptx", name: str = "expression") -> ProgramSource:
        """The source of ``program``."""
        return cls(program.key, backend, name, program)

    @classmethod
    def failing(cls, error: ExpressionError, descriptor: KernelDescriptor, *, name: str) -> ProgramSource:
        """A source whose ``compile`` raises ``error`` and whose descriptor is ``descriptor``."""
        key = hashlib.sha256(f"broken:{error}".encode()).hexdigest()
        return cls(key, "ptx", name, None, error, descriptor)

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
        return generate_ptx(self.program, arch) if self.backend == "ptx" else generate_cuda(self.program)

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
            col = _first_use(program.stages[0].expr.root, name)
            return (
                f"input '{name}' has {c} elements but '{first}' (the first input, which sets the output's "
                f"length) has {n}: give '{name}' {n} elements, or 1 to broadcast it (column {col})"
            )
        return None

    def cache_key(self, arch: str) -> str:
        tool = toolchain_version() if self.backend == "nvrtc" else ""
        return cache_key("expr", GENERATOR_VERSION, self.backend, self.key, arch, tool)

    def compile(self, arch: str) -> KernelImage:
        """PTX text (the driver JITs it at load) or an NVRTC cubin.

        Raises:
            ExpressionError: a broken source. KernelCompileError: NVRTC failed (a generator bug).
        """
        text = self.code(arch)
        desc = self.describe()
        if self.backend == "ptx":
            image = text.encode() + b"\0"  # the driver wants NUL-terminated PTX
            return KernelImage(desc, image, "ptx", hashlib.sha256(image).hexdigest(), self.name)
        cubin, symbol, _log = nvrtc_compile(
            text, name=f"{self.name}.cu", entry=desc.entry_point, arch=arch, options=NVRTC_OPTIONS
        )
        return KernelImage(desc, cubin, "cubin", hashlib.sha256(cubin).hexdigest(), self.name, symbol=symbol)


def _first_use(root: Node, name: str) -> int:
    """The column where ``name`` first appears in the tree (leftmost)."""
    best = None
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, Name) and node.id == name:
            best = node.col if best is None else min(best, node.col)
        elif isinstance(node, Binary):
            stack += [node.left, node.right]
        elif isinstance(node, Unary):
            stack.append(node.operand)
        elif isinstance(node, Call):
            stack += list(node.args)
    return best or 1
