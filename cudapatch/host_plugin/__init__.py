"""Host integration: pluggy plugins that add block types, the HostAdapter that maps host operators to
blocks, the engine operator, patch files and the host bindings (standalone, TouchDesigner).

``NAME`` is the pluggy project name and the entry-point group; plugins mark hooks with ``hookimpl``.
Importing this package does no plugin loading: ``make_plugin_manager()`` does, when called.
"""

import pluggy

NAME = "cudapatch"
hookimpl = pluggy.HookimplMarker(NAME)

from .adapter import EngineOperator, HostAdapter  # noqa: E402 - hookimpl must exist before plugins import it
from .composite_file import FileComposite, load_composite_file, parse_composite  # noqa: E402
from .manager import PluginHost, make_plugin_manager  # noqa: E402
from .patch import Patch, apply_patch, load_patch, parse_patch  # noqa: E402
from .registry import BlockType, BlockTypeRegistry  # noqa: E402

__all__ = [
    "NAME",
    "BlockType",
    "BlockTypeRegistry",
    "EngineOperator",
    "FileComposite",
    "HostAdapter",
    "Patch",
    "PluginHost",
    "apply_patch",
    "hookimpl",
    "load_composite_file",
    "load_patch",
    "make_plugin_manager",
    "parse_composite",
    "parse_patch",
]
