"""Blocks: the passive Block base, the BlockBuilder DSL, descriptions, parameters, built-in blocks,
and the two protocols that are all a block knows of the engine: ``BlockHost`` (the context a block is
registered with) and ``LibraryScope`` (what a captured call function may ask for).

Nothing here imports ``cudapatch.engine`` (``tests/unit/test_layering.py`` checks it).
"""

from .block import Block, BlockDebugInfo, BlockState
from .builder import BlockBuilder, CapturedHandle, KernelHandle, KernelPin
from .captured import (
    CallDescriptor,
    CapturedSpec,
    buffer_in,
    buffer_inout,
    buffer_out,
    device_scalar,
    host_scalar,
)
from .composite import Composite, CompositeBuilder
from .description import (
    BlockDescription,
    InternalLink,
    KernelSpec,
    ParamSpec,
    PinRef,
    PinType,
    PortSpec,
    SizeRule,
    computed,
    fixed,
    from_param,
    like,
    shape_of,
)
from .host import BlockHost
from .libraries import LibraryScope
from .library import (
    BUILTIN_BLOCKS,
    AppendFilter,
    CustomKernel,
    Download,
    Expression,
    Fill,
    FrameDelay,
    KernelFile,
    Scale,
    Upload,
    VectorAdd,
)
from .parameter import BlockParameter, coerce_scalar
from .regions import For, If, Region, RegionDescription, While
from .shape import Shape

__all__ = [
    "CallDescriptor",
    "CapturedHandle",
    "CapturedSpec",
    "buffer_in",
    "buffer_inout",
    "buffer_out",
    "computed",
    "device_scalar",
    "host_scalar",
    "BUILTIN_BLOCKS",
    "AppendFilter",
    "Block",
    "BlockBuilder",
    "BlockDebugInfo",
    "BlockDescription",
    "BlockHost",
    "BlockParameter",
    "BlockState",
    "Composite",
    "CompositeBuilder",
    "CustomKernel",
    "Expression",
    "Fill",
    "For",
    "If",
    "Region",
    "RegionDescription",
    "While",
    "FrameDelay",
    "Download",
    "Upload",
    "InternalLink",
    "KernelFile",
    "KernelHandle",
    "KernelPin",
    "KernelSpec",
    "LibraryScope",
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
    "shape_of",
    "Shape",
]
