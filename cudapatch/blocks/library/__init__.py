"""Built-in block types."""

from ..regions import For, If, While
from .basic import AppendFilter, Fill, Scale, VectorAdd
from .custom import DEFAULT_CUSTOM_CODE, CustomKernel, KernelFile, ports_from_signature
from .expression import DEFAULT_EXPRESSION, Expression
from .feedback import FrameDelay
from .fft import FFT
from .image import IMAGE_BLOCKS, Blur, ColorMap, Mix, Pattern, Resample, Threshold
from .linalg import GEMM, GEMV, LINALG_BLOCKS, LUSolve, SpMV
from .noise import Random
from .particles import (
    PARTICLE_BLOCKS,
    Emitter,
    Forces,
    Integrate,
    ParticleState,
    ToPoints,
    particle_capacity,
    read_particles,
)
from .transfer import Download, Upload

#: Blocks made of captured library calls (cuBLAS, cuSOLVER, cuSPARSE, cuFFT, cuRAND).
LIBRARY_BLOCKS = (*LINALG_BLOCKS, FFT, Random)
#: Regions: blocks holding blocks, run conditionally or repeatedly on the GPU (``blocks.regions``).
REGION_BLOCKS = (If, While, For)
BUILTIN_BLOCKS = (
    VectorAdd,
    Scale,
    Fill,
    AppendFilter,
    CustomKernel,
    KernelFile,
    Expression,
    FrameDelay,
    Upload,
    Download,
    *PARTICLE_BLOCKS,
    *LIBRARY_BLOCKS,
    *IMAGE_BLOCKS,
    *REGION_BLOCKS,
)

__all__ = [
    "BUILTIN_BLOCKS",
    "IMAGE_BLOCKS",
    "Blur",
    "ColorMap",
    "Mix",
    "Pattern",
    "Resample",
    "Threshold",
    "FFT",
    "FrameDelay",
    "Download",
    "Upload",
    "GEMM",
    "GEMV",
    "LIBRARY_BLOCKS",
    "REGION_BLOCKS",
    "LUSolve",
    "Random",
    "SpMV",
    "DEFAULT_CUSTOM_CODE",
    "DEFAULT_EXPRESSION",
    "Expression",
    "Emitter",
    "Forces",
    "Integrate",
    "PARTICLE_BLOCKS",
    "ToPoints",
    "particle_capacity",
    "ParticleState",
    "read_particles",
    "AppendFilter",
    "CustomKernel",
    "Fill",
    "KernelFile",
    "Scale",
    "VectorAdd",
    "ports_from_signature",
]
