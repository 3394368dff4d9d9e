"""A small math language turned into GPU kernels while the patch runs (DESIGN.md §10).

``compile_expression("a * sin(x * Freq) + b")`` parses and types an expression (``syntax``,
``check``); ``program.single`` makes it a kernel program; ``ProgramSource`` generates PTX (or CUDA
C++ for NVRTC) from it for the engine to load. ``interp.evaluate`` runs a program in NumPy, the
reference the kernels are tested against. ``vectors`` gives inputs vector types (``float4`` ...),
computed lane by lane. The ``Expression`` block and the fusion phase of the graph compiler use all of
it. See docs/expressions.md.
"""

from .check import BUILTIN_NAMES, FUNCTIONS, Checked, check, compile_expression
from .cuda_gen import NVRTC_OPTIONS, generate_cuda
from .errors import ExpressionError, caret
from .interp import evaluate
from .program import Program, Stage, single
from .ptx_gen import generate_ptx
from .source import BACKENDS, Backend, ProgramSource
from .syntax import parse

__all__ = [
    "BACKENDS",
    "BUILTIN_NAMES",
    "Backend",
    "Checked",
    "ExpressionError",
    "FUNCTIONS",
    "NVRTC_OPTIONS",
    "Program",
    "ProgramSource",
    "Stage",
    "caret",
    "check",
    "compile_expression",
    "evaluate",
    "generate_cuda",
    "generate_ptx",
    "parse",
    "single",
]
