"""Composite files: a sub-patch in the patch-file format, used as one block type.

A composite file is a patch file (operators and links, checked the same way, with file:line
messages) plus what it exposes and how it runs::

    # blur.toml
    links = ["h.Out -> v.In"]

    [composite]
    name = "Blur"            # the type name shown (default: the file's stem)
    child_graph = false      # true: the inner blocks run as one CUDA child-graph node

    [operators.h]
    type = "core.Scale"
    Factor = 0.5

    [operators.v]
    type = "core.Scale"

    [expose]
    In = "h.In"                        # an outer input feeding inner inputs (a list feeds several)
    Out = "v.Out"                      # an outer output: one inner output
    Gain = ["h.Factor", "v.Factor"]    # an outer parameter setting inner parameters (Hot stays Hot)

A patch uses it by file, like a kernel file: ``type = "core.Composite"`` with ``Path = "blur.toml"``
(relative to the patch file), and sets and links the exposed names as any block's. Plugins ship
composites with ``registry.add_composite(path, name="package.Type")`` in ``cudapatch_register_blocks``.

Every problem is a ``PatchFileError`` naming the composite file and line and the inner operator: a
file that does not parse, an unknown inner type, parameter or port, an exposure of something that
does not exist, and a composite that includes itself (directly or through others).
"""

from __future__ import annotations

import tomllib
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from ..blocks.composite import Composite, CompositeBuilder
from ..errors import CudapatchError, PatchFileError
from ..kernels._files import MAX_PATCH_BYTES, read_user_text
from ..kernels._text import short_repr
from .patch import Patch, _Lines, build_operator, parse_patch

__all__ = ["CompositeFile", "FileComposite", "composite_type", "load_composite_file", "parse_composite"]

COMPOSITE_KEYS = {"name", "child_graph", "description"}
#: Composite files being composed on this thread, outermost first (a file met again includes itself).
_LOADING: ContextVar[tuple[str, ...]] = ContextVar("cudapatch_composites_loading", default=())


@dataclass(frozen=True)
class CompositeFile:
    """A parsed composite file.

    Attributes:
        patch: Its operators and links (a ``Patch``).
        name: The type name it shows.
        child_graph: Whether its inner blocks run as one child-graph node.
        description: Its text for tooltips.
        expose: ``(outer name, ("op.Name", ...), line)`` in file order.
    """

    patch: Patch
    name: str
    child_graph: bool
    description: str
    expose: tuple[tuple[str, tuple[str, ...], int | None], ...]

    @property
    def path(self) -> Path | None:
        return self.patch.path


def parse_composite(text: str, *, path: str | Path | None = None, registry: Any = None) -> CompositeFile:
    """Parse and check composite file text (with ``registry``: inner types, parameters and link ports).

    Raises:
        PatchFileError: with the file and line of the first problem.
    """
    file = str(path) if path is not None else "<composite>"
    patch = parse_patch(text, path=path, registry=registry, extra_keys=frozenset({"composite", "expose"}))
    data = tomllib.loads(text)  # parse_patch has accepted it
    lines = _Lines(text)
    for key in ("engine", "preview"):
        if key in data:
            raise PatchFileError(
                f"a composite file has no [{key}] (the patch using it has one)",
                file=file,
                line=lines.key(key) or lines.table(key),
            )
    head = data.get("composite", {})
    head_line = lines.table("composite")
    if not isinstance(head, dict):
        raise PatchFileError("'composite' must be a table", file=file, line=lines.key("composite"))
    for key, value in head.items():
        line = lines.key(key, head_line)
        if key not in COMPOSITE_KEYS:
            raise PatchFileError(
                f"unknown composite setting {short_repr(key)} (use: {', '.join(sorted(COMPOSITE_KEYS))})",
                file=file,
                line=line,
            )
        want = bool if key == "child_graph" else str
        if not isinstance(value, want):
            raise PatchFileError(
                f"{key} = {short_repr(value)}: write {'true or false' if want is bool else 'text'}",
                file=file,
                line=line,
            )
    expose_table = data.get("expose", {})
    expose_line = lines.table("expose")
    if not isinstance(expose_table, dict):
        raise PatchFileError("'expose' must be a table of NAME = \"op.Name\"", file=file, line=lines.key("expose"))
    expose = []
    for name, value in expose_table.items():
        line = lines.key(name, expose_line)
        targets = (value,) if isinstance(value, str) else value
        if not isinstance(targets, list | tuple) or not targets or not all(isinstance(t, str) for t in targets):
            raise PatchFileError(
                f'expose {name} = {short_repr(value)}: write "op.Name" or a list of them', file=file, line=line
            )
        for t in targets:
            op = t.partition(".")[0].strip()
            if op not in patch.operators:
                raise PatchFileError(
                    f"expose {name}: no operator '{op}' in this composite "
                    f"(operators: {', '.join(patch.operators) or 'none'})",
                    file=file,
                    line=line,
                )
        expose.append((name, tuple(targets), line))
    stem = Path(path).stem if path is not None else "Composite"
    return CompositeFile(
        patch,
        head.get("name", stem),
        head.get("child_graph", False),
        head.get("description", ""),
        tuple(expose),
    )


def load_composite_file(path: str | Path, registry: Any = None) -> CompositeFile:
    """Read and check a composite file.

    Raises:
        PatchFileError: missing, unreadable, over 8 MiB, not UTF-8, or invalid (with the line).
    """
    text = read_user_text(path, what="composite file", limit=MAX_PATCH_BYTES, error=PatchFileError)
    return parse_composite(text, path=Path(path), registry=registry)


class FileComposite(Composite):
    """A composite described by a file: the ``Path`` text parameter (``core.Composite``), or a file fixed
    by the type (a plugin's ``add_composite``). Its inner block types come from ``registry``."""

    type_name: ClassVar[str] = "Composite"
    #: Where inner operator types are looked up (set by ``composite_type``).
    registry: ClassVar[Any] = None
    #: The type's own file (plugin composites); None: the ``Path`` parameter names it.
    fixed_path: ClassVar[Path | None] = None

    def composite_file(self) -> str | None:
        path = self._path()
        return None if path is None else str(path)

    def _path(self) -> Path | None:
        if self.fixed_path is not None:
            return self.fixed_path
        text = self._texts.get("Path", "")
        return Path(text).absolute() if text else None

    def compose(self, c: CompositeBuilder) -> None:
        if self.fixed_path is None:
            c.text("Path", description="the composite file (.toml)")
        path = self._path()
        if path is None:
            return  # no file yet: no ports, no parameters besides Path
        stack = _LOADING.get()
        key = str(path.resolve()) if path.exists() else str(path)
        if key in stack:
            chain = " -> ".join(Path(p).name for p in (*stack[stack.index(key) :], key))
            raise c.error(f"the composite includes itself ({chain})", file=str(path))
        token = _LOADING.set((*stack, key))
        try:
            spec = load_composite_file(path, self.registry)
            self._compose_file(c, spec, path)
        finally:
            _LOADING.reset(token)

    def _compose_file(self, c: CompositeBuilder, spec: CompositeFile, path: Path) -> None:
        c.file = str(path)
        c.child_graph = spec.child_graph
        c.type_name = spec.name
        registry = self.registry
        texts = self._texts
        exposed_texts: dict[str, dict[str, str]] = {}  # op -> text parameter -> value set on the composite
        for name, targets, _ in spec.expose:
            if name in texts:
                for t in targets:
                    op, _, pname = t.partition(".")
                    exposed_texts.setdefault(op.strip(), {})[pname.strip()] = texts[name]
        for op, ospec in spec.patch.operators.items():
            try:
                bt = registry.get(ospec.type)
                text_names = {n for n, kind, _ in bt.params if kind == "text"} if bt.params else {"Path"}
                op_texts = {k: v for k, v in ospec.params.items() if isinstance(v, str) and k in text_names}
                op_texts.update({k: v for k, v in exposed_texts.get(op, {}).items() if k in text_names})
                if "Path" in op_texts and op_texts["Path"] and not Path(op_texts["Path"]).is_absolute():
                    op_texts["Path"] = str(path.parent / op_texts["Path"])
                block = build_operator(bt, op, ospec.params, op_texts, fuse=ospec.fuse)
            except CudapatchError as exc:
                line = ospec.line
                if exc.param is not None:
                    line = _Lines(spec.patch.text).key(exc.param, ospec.line)
                inner = f" ({exc.file}{'' if exc.line is None else f':{exc.line}'})" if exc.file else ""
                raise c.error(exc.message + inner, line=line, inner=op, param=exc.param) from None
            c.add(op, block, line=ospec.line)
        for lk in spec.patch.links:
            c.link(f"{lk.src}.{lk.src_port}", f"{lk.dst}.{lk.dst_port}", line=lk.line)
        for name, targets, line in spec.expose:
            c.expose(name, *targets, line=line)

    def _describe(self):  # type: ignore[no-untyped-def]
        try:
            return super()._describe()
        except PatchFileError:
            raise
        except CudapatchError as exc:  # as a file error, so patch files report the file and line
            if exc.file is None:
                raise
            raise PatchFileError(exc.message, file=exc.file, line=exc.line, block=exc.block, param=exc.param) from None


def composite_type(registry: Any, *, path: str | Path | None = None, name: str = "Composite") -> type[FileComposite]:
    """A ``FileComposite`` type whose inner types come from ``registry``: ``core.Composite`` (the file
    named by ``Path``) without ``path``, else a type fixed to the composite file ``path``."""
    attrs: dict[str, Any] = {"registry": registry, "type_name": name, "__module__": __name__}
    attrs["__doc__"] = "A sub-patch used as one block: the composite file named by ``Path`` (.toml)."
    if path is not None:
        attrs["fixed_path"] = Path(path).absolute()
        attrs["__doc__"] = f"The composite in {Path(path).name}."
    return type(name, (FileComposite,), attrs)
