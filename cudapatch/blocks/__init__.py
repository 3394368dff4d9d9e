"""Blocks: the passive Block base, the BlockBuilder DSL, descriptions, parameters, built-in blocks."""

from .block import Block, BlockDebugInfo, BlockState
from .builder import BlockBuilder, KernelHandle, KernelPin
from .description import (
    BlockDescription,
    InternalLink,
    KernelSpec,
    ParamSpec,
    PinRef,
    PinType,
    PortSpec,
    SizeRule,
    fixed,
    from_param,
    like,
)
from .library import BUILTIN_BLOCKS, AppendFilter, CustomKernel, Fill, KernelFile, Scale, VectorAdd
from .parameter import BlockParameter, coerce_scalar

__all__ = [
    "BUILTIN_BLOCKS",
    "AppendFilter",
    "Block",
    "BlockBuilder",
    "BlockDebugInfo",
    "BlockDescription",
    "BlockParameter",
    "BlockState",
    "CustomKernel",
    "Fill",
    "InternalLink",
    "KernelFile",
    "KernelHandle",
    "KernelPin",
    "KernelSpec",
    "ParamSpec",
    "PinRef",
    "PinType",
    "PortSpec",
    "Scale",
    "SizeRule",
    "VectorAdd",
    "coerce_scalar",
    "fixed",
    "from_param",
    "like",
]
