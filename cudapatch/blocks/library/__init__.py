"""Built-in block types."""

from .basic import AppendFilter, Fill, Scale, VectorAdd
from .custom import DEFAULT_CUSTOM_CODE, CustomKernel, KernelFile, ports_from_signature

BUILTIN_BLOCKS = (VectorAdd, Scale, Fill, AppendFilter, CustomKernel, KernelFile)

__all__ = [
    "BUILTIN_BLOCKS",
    "DEFAULT_CUSTOM_CODE",
    "AppendFilter",
    "CustomKernel",
    "Fill",
    "KernelFile",
    "Scale",
    "VectorAdd",
    "ports_from_signature",
]
