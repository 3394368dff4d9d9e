"""Building the plugin manager, and the one typed facade the rest of cudapatch calls hooks through.

Order (like pytest and tox): add the hookspecs → block plugins named in ``CUDAPATCH_DISABLE_PLUGINS``
→ load the ``cudapatch`` entry points → register the built-ins from an explicit tuple →
``check_pending()``. Nothing happens at import time.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import pluggy

from ..errors import PluginError
from . import NAME, builtins, hookspecs
from .registry import BlockTypeRegistry

__all__ = ["make_plugin_manager", "PluginHost", "DISABLE_ENV"]

log = logging.getLogger("cudapatch.plugins")
DISABLE_ENV = "CUDAPATCH_DISABLE_PLUGINS"
BUILTIN_PLUGINS = ((builtins.PLUGIN_NAME, builtins),)


def make_plugin_manager(
    *,
    entry_points: bool = True,
    disabled: tuple[str, ...] | None = None,
    plugins: tuple[tuple[str, object], ...] = (),
) -> pluggy.PluginManager:
    """A plugin manager with cudapatch's hookspecs, installed plugins and built-ins.

    Args:
        entry_points: Load plugins from the ``cudapatch`` entry-point group.
        disabled: Plugin names to block (default: from ``CUDAPATCH_DISABLE_PLUGINS``, comma-separated).
        plugins: Extra ``(name, plugin)`` pairs registered before the built-ins (an app's own blocks).

    Raises:
        PluginError: a plugin implements a hook that does not exist (``check_pending``), or failed to import.
    """
    pm = pluggy.PluginManager(NAME)
    pm.add_hookspecs(hookspecs)
    if disabled is None:
        disabled = tuple(n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip())
    for name in disabled:
        pm.set_blocked(name)
        log.info("plugin '%s' is disabled (%s)", name, DISABLE_ENV)
    if entry_points:
        try:
            pm.load_setuptools_entrypoints(NAME)
        except Exception as exc:  # an entry point whose module does not import
            raise PluginError(f"a '{NAME}' plugin failed to load: {type(exc).__name__}: {exc}") from exc
    for name, plugin in (*plugins, *BUILTIN_PLUGINS):
        if not pm.is_blocked(name):
            pm.register(plugin, name=name)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        name = pm.get_name(exc.plugin) or repr(exc.plugin)
        raise PluginError(f"plugin '{name}' is invalid: {exc}") from exc
    return pm


class PluginHost:
    """Typed access to the hooks; every call uses keyword arguments.

    Args:
        pm: A manager from ``make_plugin_manager`` (built on first use when None).
    """

    def __init__(self, pm: pluggy.PluginManager | None = None) -> None:
        self.pm = pm if pm is not None else make_plugin_manager()
        self.errors: list[PluginError] = []
        self._registry: BlockTypeRegistry | None = None

    def plugin_names(self) -> list[str]:
        """Names of the registered plugins."""
        return [name for name, _ in self.pm.list_name_plugin()]

    @property
    def registry(self) -> BlockTypeRegistry:
        """All block types, collected once. A plugin that raises is reported and skipped."""
        if self._registry is None:
            self._registry = self._collect_blocks()
        return self._registry

    def _collect_blocks(self) -> BlockTypeRegistry:
        registry = BlockTypeRegistry()
        # Call each plugin's implementation on its own, so one faulty plugin cannot hide the others.
        for impl in reversed(self.pm.hook.cudapatch_register_blocks.get_hookimpls()):
            try:
                with registry.registering(impl.plugin_name):  # on error, none of the plugin's types stay
                    impl.function(registry=registry)
            except Exception as exc:  # a third-party plugin's bug: report it, keep the others
                err = (
                    exc
                    if isinstance(exc, PluginError)
                    else PluginError(
                        f"plugin '{impl.plugin_name}' failed while registering blocks: {type(exc).__name__}: {exc}"
                    )
                )
                self.errors.append(err)
                log.error("%s", err)
        for err in registry.finish():  # composite files, once every plugin's types are there
            self.errors.append(err)
            log.error("%s", err)
        return registry

    def kernel_search_paths(self) -> list[Path]:
        """Every plugin's kernel directories, concatenated."""
        out: list[Path] = []
        for paths in self.pm.hook.cudapatch_kernel_search_paths():
            out.extend(Path(p) for p in paths or ())
        return out

    def engine_started(self, engine: Any) -> None:
        self.pm.hook.cudapatch_engine_started(engine=engine)

    def engine_stopping(self, engine: Any) -> None:
        self.pm.hook.cudapatch_engine_stopping(engine=engine)

    def adapt_operator(self, host: str, operator: Any) -> dict[str, Any] | None:
        """The first plugin's block spec for a host operator, or None."""
        return self.pm.hook.cudapatch_adapt_operator(host=host, operator=operator)
