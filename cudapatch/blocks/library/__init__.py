"""Built-in block types."""

from .basic import BUILTIN_BLOCKS, AppendFilter, Fill, Scale, VectorAdd

__all__ = ["BUILTIN_BLOCKS", "AppendFilter", "Fill", "Scale", "VectorAdd"]
