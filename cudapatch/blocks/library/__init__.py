"""Built-in block types."""

from .basic import AppendFilter, Fill, Scale, VectorAdd
from .custom import DEFAULT_CUSTOM_CODE, CustomKernel, KernelFile, ports_from_signature
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

BUILTIN_BLOCKS = (VectorAdd, Scale, Fill, AppendFilter, CustomKernel, KernelFile, *PARTICLE_BLOCKS)

__all__ = [
    "BUILTIN_BLOCKS",
    "DEFAULT_CUSTOM_CODE",
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
