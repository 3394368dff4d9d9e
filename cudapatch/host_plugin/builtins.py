"""The built-in plugin: cudapatch's own block types, registered like any third-party plugin's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import __version__
from ..blocks.library import (
    FFT,
    GEMM,
    GEMV,
    AppendFilter,
    CustomKernel,
    Emitter,
    Expression,
    Fill,
    Forces,
    Integrate,
    KernelFile,
    LUSolve,
    Random,
    Scale,
    SpMV,
    ToPoints,
    VectorAdd,
)
from . import hookimpl

if TYPE_CHECKING:
    from .registry import BlockTypeRegistry

PLUGIN_NAME = "cudapatch.builtins"

BUILTIN_TYPES = (
    ("core.VectorAdd", VectorAdd),
    ("core.Scale", Scale),
    ("core.Fill", Fill),
    ("core.AppendFilter", AppendFilter),
    ("core.CustomKernel", CustomKernel),
    ("core.KernelFile", KernelFile),
    ("core.Expression", Expression),
    ("particles.Emitter", Emitter),
    ("particles.Forces", Forces),
    ("particles.Integrate", Integrate),
    ("particles.ToPoints", ToPoints),
    ("linalg.GEMM", GEMM),
    ("linalg.GEMV", GEMV),
    ("linalg.LUSolve", LUSolve),
    ("linalg.SpMV", SpMV),
    ("signal.FFT", FFT),
    ("signal.Random", Random),
)


@hookimpl
def cudapatch_register_blocks(registry: BlockTypeRegistry) -> None:
    for name, cls in BUILTIN_TYPES:
        registry.add(cls, name=name, version=__version__)
