"""``BlockTypeRegistry``: the block types plugins provide, by qualified name (``particles.Emitter``)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..blocks.block import Block
from ..errors import CudapatchError, KernelLoadError, PluginError

__all__ = ["BlockType", "BlockTypeRegistry"]


@dataclass(frozen=True)
class BlockType:
    """A registered block type.

    Attributes:
        name: Qualified name, ``package.Type``.
        cls: The Block subclass.
        version: The plugin's version string for the type.
        origin: The plugin that registered it.
        doc: First paragraph of the class docstring.
        ports: ``(direction, name, type)`` of each port of a default instance.
        params: ``(name, type, default)`` of each parameter of a default instance.
        choices: ``(name, choices)`` of each parameter of a default instance that has choices.
    """

    name: str
    cls: type[Block]
    version: str
    origin: str
    doc: str = ""
    ports: tuple[tuple[str, str, str], ...] = field(default=(), compare=False)
    params: tuple[tuple[str, str, Any], ...] = field(default=(), compare=False)
    choices: tuple[tuple[str, tuple[Any, ...]], ...] = field(default=(), compare=False)

    def create(self, name: str, **params: Any) -> Block:
        """A new block of this type called ``name`` with ``params`` set."""
        return self.cls(name=name, **params)


class BlockTypeRegistry:
    """Block types by qualified name. ``add`` validates and refuses duplicates, naming both origins."""

    def __init__(self) -> None:
        self._types: dict[str, BlockType] = {}
        self.current_origin = "?"
        self._pending: list[str] = []  # composite types whose ports are read by ``finish``

    @contextmanager
    def registering(self, origin: str) -> Iterator[BlockTypeRegistry]:
        """Types added inside the ``with`` come from plugin ``origin``. If the body raises, every
        type it added is removed again, so a faulty plugin is skipped entirely rather than half
        registered; the exception propagates.
        """
        before = dict(self._types)
        self.current_origin = origin
        try:
            yield self
        except BaseException:
            self._types = before
            raise
        finally:
            self.current_origin = "?"

    def add(self, cls: type[Block], *, name: str | None = None, version: str = "0", doc: str = "") -> BlockType:
        """Register ``cls`` as ``name`` (default: ``<module's top package>.<type_name>``).

        Raises:
            PluginError: not a Block subclass, a name that is not ``package.Type``, a duplicate, or a
                class that fails to describe itself with default parameters.
        """
        origin = self.current_origin
        if not (inspect.isclass(cls) and issubclass(cls, Block)):
            raise PluginError(f"plugin '{origin}' registered {cls!r}, which is not a Block subclass")
        if name is None:
            name = f"{cls.__module__.split('.')[0]}.{cls.type_name or cls.__name__}"
        parts = name.split(".")
        if len(parts) < 2 or not all(p.isidentifier() for p in parts):
            raise PluginError(f"plugin '{origin}': block type name '{name}' must look like 'package.Type'")
        if name in self._types:
            other = self._types[name]
            raise PluginError(
                f"block type '{name}' from plugin '{origin}' is already registered by plugin '{other.origin}'"
            )
        ports: tuple[tuple[str, str, str], ...] = ()
        params: tuple[tuple[str, str, Any], ...] = ()
        choices: tuple[tuple[str, tuple[Any, ...]], ...] = ()
        try:
            desc = cls(name=parts[-1]).description
        except KernelLoadError:  # needs a parameter first (a kernel file's path): ports follow that
            pass
        except (CudapatchError, TypeError, ValueError) as exc:
            raise PluginError(f"plugin '{origin}': block type '{name}' does not describe itself: {exc}") from exc
        else:
            ports, params, choices = _ports(desc), _params(desc), _choices(desc)
        text = doc or inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        bt = BlockType(name, cls, version, origin, text, ports, params, choices)
        self._types[name] = bt
        return bt

    def add_composite(self, path: str | Path, *, name: str, version: str = "0", doc: str = "") -> BlockType:
        """Register the composite file ``path`` as block type ``name`` (``package.Type``): a plugin
        shipping a sub-patch as a block (``host_plugin/composite_file.py`` has the format). Its inner
        types may come from plugins registered later: the file is read by ``finish``, which the
        plugin host calls once every plugin has registered.

        Raises:
            PluginError: a name that is not ``package.Type``, a duplicate, or no such file.
        """
        from .composite_file import composite_type  # composite files are patch files: patch.py imports this module

        origin = self.current_origin
        parts = name.split(".")
        if len(parts) < 2 or not all(p.isidentifier() for p in parts):
            raise PluginError(f"plugin '{origin}': block type name '{name}' must look like 'package.Type'")
        if name in self._types:
            other = self._types[name].origin
            raise PluginError(f"block type '{name}' from plugin '{origin}' is already registered by plugin '{other}'")
        if not Path(path).is_file():
            raise PluginError(f"plugin '{origin}': composite file '{path}' of block type '{name}' does not exist")
        cls = composite_type(self, path=path, name=parts[-1])
        bt = BlockType(name, cls, version, origin, doc or f"Composite from {Path(path).name}.")
        self._types[name] = bt
        self._pending.append(name)
        return bt

    def finish(self) -> list[PluginError]:
        """Read the composite files registered since the last call: their exposed ports and parameters
        become the types' ``ports`` and ``params``. A composite that does not load is removed.

        Returns:
            One ``PluginError`` per removed type, naming the plugin, the file and the line.
        """
        errors = []
        pending, self._pending = self._pending, []
        for name in pending:
            bt = self._types.get(name)
            if bt is None:
                continue
            try:
                desc = bt.cls(name=name.rsplit(".", 1)[-1]).description
            except CudapatchError as exc:
                del self._types[name]
                where = f" ({exc.file}{'' if exc.line is None else f':{exc.line}'})" if exc.file else ""
                errors.append(
                    PluginError(f"plugin '{bt.origin}': composite type '{name}' does not load: {exc.message}{where}")
                )
                continue
            self._types[name] = replace(bt, ports=_ports(desc), params=_params(desc), choices=_choices(desc))
        return errors

    def get(self, name: str) -> BlockType:
        """The type called ``name``; an unqualified ``Type`` works when exactly one package has it.

        Raises:
            CudapatchError: unknown (or ambiguous) type, with the close matches listed.
        """
        bt = self._types.get(name)
        if bt is not None:
            return bt
        matches = [t for n, t in self._types.items() if n.rsplit(".", 1)[-1] == name]
        if len(matches) == 1:
            return matches[0]
        if matches:
            raise CudapatchError(f"block type '{name}' is ambiguous: {', '.join(t.name for t in matches)}")
        known = ", ".join(sorted(self._types)) or "none"
        raise CudapatchError(f"unknown block type '{name}' (installed: {known})")

    def __contains__(self, name: object) -> bool:
        return name in self._types

    def __iter__(self):
        return iter(sorted(self._types.values(), key=lambda t: t.name))

    def __len__(self) -> int:
        return len(self._types)

    def __repr__(self) -> str:
        return f"<BlockTypeRegistry {len(self._types)} types>"


def _ports(desc: Any) -> tuple[tuple[str, str, str], ...]:
    return tuple(("in", p.name, str(p.pin_type)) for p in desc.inputs) + tuple(
        ("out", p.name, str(p.pin_type)) for p in desc.outputs
    )


def _choices(desc: Any) -> tuple[tuple[str, tuple[Any, ...]], ...]:
    return tuple((p.name, p.choices) for p in desc.params if p.choices)


def _params(desc: Any) -> tuple[tuple[str, str, Any], ...]:
    return tuple(
        (p.name, "text" if p.kind == "text" else p.dtype.c_name, p.default)  # type: ignore[union-attr]
        for p in desc.params
    )
