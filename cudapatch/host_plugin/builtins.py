"""The built-in plugin: cudapatch's own block types, registered like any third-party plugin's."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import __version__
from ..blocks.library import (
    FFT,
    GEMM,
    GEMV,
    AppendFilter,
    Blur,
    ColorMap,
    CustomKernel,
    Download,
    Emitter,
    Expression,
    Fill,
    Forces,
    FrameDelay,
    Integrate,
    KernelFile,
    LUSolve,
    Mix,
    Pattern,
    Random,
    Resample,
    Scale,
    SpMV,
    Threshold,
    ToPoints,
    Upload,
    VectorAdd,
)
from ..blocks.regions import For, If, While
from . import hookimpl
from .composite_file import composite_type

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
    ("core.FrameDelay", FrameDelay),
    ("core.Upload", Upload),
    ("core.Download", Download),
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
    ("image.Pattern", Pattern),
    ("image.Blur", Blur),
    ("image.Resample", Resample),
    ("image.Threshold", Threshold),
    ("image.ColorMap", ColorMap),
    ("image.Mix", Mix),
    ("core.If", If),
    ("core.While", While),
    ("core.For", For),
)


@hookimpl
def cudapatch_register_blocks(registry: BlockTypeRegistry) -> None:
    for name, cls in BUILTIN_TYPES:
        registry.add(cls, name=name, version=__version__)
    # A composite file named by its Path; its inner types come from this registry.
    registry.add(composite_type(registry), name="core.Composite", version=__version__)
