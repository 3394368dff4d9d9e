"""The plugin API of cudapatch: every hook a plugin can implement.

A plugin is a module or object with functions marked ``@cudapatch.host_plugin.hookimpl``, found
through the ``cudapatch`` entry-point group of an installed package::

    # pyproject.toml of a plugin package
    [project.entry-points.cudapatch]
    my_blocks = "my_package.plugin"

Hooks are always called with keyword arguments. Set ``CUDAPATCH_DISABLE_PLUGINS=name,other`` to
keep plugins (by entry-point name) from loading.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from . import NAME

if TYPE_CHECKING:
    from ..engine.engine import Engine
    from .registry import BlockTypeRegistry

hookspec = pluggy.HookspecMarker(NAME)

__all__ = [
    "cudapatch_register_blocks",
    "cudapatch_kernel_search_paths",
    "cudapatch_engine_started",
    "cudapatch_engine_stopping",
    "cudapatch_adapt_operator",
]


@hookspec
def cudapatch_register_blocks(registry: BlockTypeRegistry) -> None:
    """Add block types.

    Called once when the plugin manager is built, for every plugin. Call
    ``registry.add(BlockClass, name="package.Type", version="1.0")`` for each type; the registry
    checks the class (it must describe itself without errors) and refuses a name that is already
    taken, naming both plugins. A sub-patch shipped as a composite file becomes a type with
    ``registry.add_composite(path, name="package.Type")`` (read once every plugin has registered,
    so it may use any plugin's types; see ``host_plugin/composite_file.py``). A plugin that raises
    here is reported with its name and skipped; the other plugins still load.

    Args:
        registry: Where block types are registered.
    """


@hookspec
def cudapatch_kernel_search_paths() -> list[Path]:
    """Directories where kernel files named by relative paths are looked up.

    Called when a patch is loaded. Results of all plugins are concatenated, in plugin order, after
    the patch file's own directory.

    Returns:
        Directories (need not exist).
    """
    return []


@hookspec
def cudapatch_engine_started(engine: Engine) -> None:
    """An engine was created by a host (the standalone preview, a TouchDesigner engine operator).

    Called once, before the first frame. Use it to add frame hooks or log settings; do not launch
    GPU work here.

    Args:
        engine: The new engine.
    """


@hookspec
def cudapatch_engine_stopping(engine: Engine) -> None:
    """An engine is about to close: release what the plugin attached to it.

    Args:
        engine: The engine, still usable.
    """


@hookspec(firstresult=True)
def cudapatch_adapt_operator(host: str, operator: Any) -> dict[str, Any] | None:
    """Turn a host's operator into a block spec (used by host bindings such as TouchDesigner's).

    Stops at the first non-None result.

    Args:
        host: The host's name (``"touchdesigner"``, ``"standalone"``).
        operator: The host's operator object.

    Returns:
        ``{"type": "package.Type", "params": {...}}`` or None when this plugin does not handle it.
    """
