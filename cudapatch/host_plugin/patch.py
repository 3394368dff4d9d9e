"""Patch files: a TOML description of a patch, validated with file:line messages, applied as a
difference to a running ``HostAdapter``.

Format::

    [engine]
    profiling = "PerBlock"        # a ProfilingLevel name
    device = 0

    [operators.emit]
    type = "particles.Emitter"    # a registered block type
    Rate = 300000.0               # any parameter of the block

    [operators.forces]
    type = "particles.Forces"

    links = ["emit.Particles -> forces.Particles"]   # top-level, before the tables, or [patch] links

    [preview]
    points = "points.Points"      # an output drawn as points
    image = "blur.Out"            # or an RGBA8 image output ...
    size = [512, 512]             # ... of this size

Editing the file while it runs applies the difference: changed parameters are Hot updates, new or
removed operators and links rebuild; a broken edit is reported and the last good patch keeps running.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..engine.profiling import ProfilingLevel
from ..errors import CudapatchError, PatchFileError
from .adapter import HostAdapter
from .coerce import coerce_host_value
from .registry import BlockTypeRegistry

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - 3.10
    import tomli as tomllib

__all__ = ["Patch", "OperatorSpec", "LinkSpec", "parse_patch", "load_patch", "apply_patch", "ENGINE_KEYS"]

ENGINE_KEYS = {"profiling", "device", "name"}
PREVIEW_KEYS = {"points", "image", "size"}
TOP_KEYS = {"engine", "operators", "links", "preview"}
_LINK = re.compile(r"^\s*([A-Za-z_][\w-]*)\.(\w+)\s*->\s*([A-Za-z_][\w-]*)\.(\w+)\s*$")


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    type: str
    params: dict[str, Any]
    line: int | None = None


@dataclass(frozen=True)
class LinkSpec:
    src: str
    src_port: str
    dst: str
    dst_port: str
    line: int | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.src, self.src_port, self.dst, self.dst_port)

    def __str__(self) -> str:
        return f"{self.src}.{self.src_port} -> {self.dst}.{self.dst_port}"


@dataclass
class Patch:
    """A parsed patch file."""

    path: Path | None
    engine: dict[str, Any] = field(default_factory=dict)
    operators: dict[str, OperatorSpec] = field(default_factory=dict)
    links: list[LinkSpec] = field(default_factory=list)
    preview: dict[str, Any] = field(default_factory=dict)

    @property
    def profiling(self) -> ProfilingLevel:
        return ProfilingLevel.parse(self.engine.get("profiling", "None"))


class _Lines:
    """Finds the line of a table or key in the raw text (tomllib keeps no positions)."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()

    def table(self, dotted: str) -> int | None:
        pat = re.compile(r"^\s*\[\s*" + r"\s*\.\s*".join(re.escape(p) for p in dotted.split(".")) + r"\s*\]")
        return next((i + 1 for i, line in enumerate(self.lines) if pat.match(line)), None)

    def key(self, key: str, after: int | None = None) -> int | None:
        pat = re.compile(r"^\s*" + re.escape(key) + r"\s*=")
        start = after or 0
        for i in range(start, len(self.lines)):
            if i > start and self.lines[i].lstrip().startswith("[") and after is not None:
                break
            if pat.match(self.lines[i]):
                return i + 1
        return after

    def text(self, needle: str) -> int | None:
        return next((i + 1 for i, line in enumerate(self.lines) if needle in line), None)


def parse_patch(text: str, *, path: str | Path | None = None, registry: BlockTypeRegistry | None = None) -> Patch:
    """Parse and validate patch text. With ``registry``, operator types, parameters (names and
    values) and link ports are checked too.

    Raises:
        PatchFileError: with ``file`` and ``line`` of the first problem.
    """
    file = str(path) if path is not None else "<patch>"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise PatchFileError(f"TOML syntax error: {exc}", file=file, line=int(m.group(1)) if m else None) from None
    lines = _Lines(text)

    def fail(msg: str, line: int | None, **ctx: Any) -> PatchFileError:
        return PatchFileError(msg, file=file, line=line, **ctx)

    for key in data:
        if key not in TOP_KEYS:
            raise fail(f"unknown key '{key}' (use: {', '.join(sorted(TOP_KEYS))})", lines.key(key) or lines.table(key))
    patch = Patch(Path(path) if path is not None else None)
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise fail("'engine' must be a table", lines.key("engine"))
    for key in engine:
        if key not in ENGINE_KEYS:
            raise fail(f"unknown engine setting '{key}' (use: {', '.join(sorted(ENGINE_KEYS))})", lines.key(key))
    if "profiling" in engine:
        try:
            ProfilingLevel.parse(engine["profiling"])
        except CudapatchError as exc:
            raise fail(exc.message, lines.key("profiling", lines.table("engine"))) from None
    patch.engine = dict(engine)

    ops = data.get("operators", {})
    if not isinstance(ops, dict):
        raise fail("'operators' must be a table of [operators.NAME] tables", lines.key("operators"))
    for name, body in ops.items():
        line = lines.table(f"operators.{name}")
        if not isinstance(body, dict):
            raise fail(f"operator '{name}' must be a table with a 'type'", line)
        body = dict(body)
        type_name = body.pop("type", None)
        if not isinstance(type_name, str):
            raise fail(f"operator '{name}' needs type = \"package.Type\"", line, block=name)
        spec = OperatorSpec(name, type_name, body, line)
        if registry is not None:
            _check_operator(spec, registry, lines, fail)
        patch.operators[name] = spec

    raw_links = data.get("links", [])
    if not isinstance(raw_links, list):
        raise fail("'links' must be a list of \"op.Port -> op.Port\" strings", lines.key("links"))
    seen = set()
    for item in raw_links:
        line = lines.text(str(item)) if isinstance(item, str) else lines.key("links")
        m = _LINK.match(item) if isinstance(item, str) else None
        if m is None:
            raise fail(f'bad link {item!r}: write "op.Port -> op.Port"', line)
        lk = LinkSpec(*m.groups(), line=line)
        for op, port, kind in ((lk.src, lk.src_port, "output"), (lk.dst, lk.dst_port, "input")):
            if op not in patch.operators:
                raise fail(f"link {lk}: no operator '{op}'", line)
            if registry is not None:
                bt = registry.get(patch.operators[op].type)
                names = [p[1] for p in bt.ports if p[0] == ("out" if kind == "output" else "in")]
                if bt.ports and port not in names:
                    raise fail(
                        f"link {lk}: operator '{op}' ({bt.name}) has no {kind} '{port}' "
                        f"(it has: {', '.join(names) or 'none'})",
                        line,
                        block=op,
                        port=port,
                    )
        if lk.key in seen:
            raise fail(f"link {lk} is listed twice", line)
        seen.add(lk.key)
        patch.links.append(lk)

    preview = data.get("preview", {})
    if not isinstance(preview, dict):
        raise fail("'preview' must be a table", lines.key("preview"))
    for key, value in preview.items():
        pline = lines.key(key, lines.table("preview"))
        if key not in PREVIEW_KEYS:
            raise fail(f"unknown preview setting '{key}' (use: {', '.join(sorted(PREVIEW_KEYS))})", pline)
        if key in ("points", "image"):
            op, _, port = str(value).partition(".")
            if op not in patch.operators or not port:
                raise fail(f'preview {key} = {value!r}: write "operator.Port" naming an operator of this patch', pline)
    patch.preview = dict(preview)
    return patch


def _check_operator(spec: OperatorSpec, registry: BlockTypeRegistry, lines: _Lines, fail: Any) -> None:
    try:
        bt = registry.get(spec.type)
    except CudapatchError as exc:
        raise fail(exc.message, lines.key("type", spec.line), block=spec.name) from None
    if not bt.ports and not bt.params:
        return  # a type that needs its parameters to describe itself (a kernel file): checked on create
    known = {name: kind for name, kind, _ in bt.params}
    for key in spec.params:
        line = lines.key(key, spec.line)
        if key not in known:
            raise fail(
                f"operator '{spec.name}' ({bt.name}) has no parameter '{key}' (it has: {', '.join(known) or 'none'})",
                line,
                block=spec.name,
                param=key,
            )


def load_patch(path: str | Path, registry: BlockTypeRegistry | None = None) -> Patch:
    """Read and validate a patch file.

    Raises:
        PatchFileError: unreadable file or invalid content (with the line).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PatchFileError(f"cannot read the patch file: {exc.strerror}", file=str(path)) from None
    return parse_patch(text, path=path, registry=registry)


def apply_patch(adapter: HostAdapter, new: Patch, old: Patch | None = None) -> dict[str, int]:
    """Make ``adapter`` match ``new``, changing only what differs from ``old`` (None: build all).

    Everything is validated first by building the new operators off to the side, so a bad edit
    raises before the running patch is touched.

    Returns:
        Counts of what changed: ``created``, ``deleted``, ``swapped``, ``params``, ``links``.

    Raises:
        PatchFileError: a value or link the blocks refuse, with the file and line.
    """
    file = str(new.path) if new.path else "<patch>"
    old_ops = old.operators if old is not None else {}
    counts = {"created": 0, "deleted": 0, "swapped": 0, "params": 0, "links": 0}
    # 1. validate: every new or changed operator must build, every value must be accepted
    for name, spec in new.operators.items():
        try:
            bt = adapter.registry.get(spec.type)
            probe_texts = {
                k: adapter.resolve_text(k, v)
                for k, v in spec.params.items()
                if isinstance(v, str) and k not in _scalars(bt)
            }
            probe = bt.create(name, **probe_texts)
            for key, value in spec.params.items():
                if key not in probe_texts:
                    p = probe.params.get(key)
                    if p is None:
                        raise CudapatchError(f"operator '{name}' ({bt.name}) has no parameter '{key}'")
                    probe.set(key, coerce_host_value(p.spec, value))
        except CudapatchError as exc:
            line = spec.line
            if exc.param is not None:
                line = _Lines(new.path.read_text() if new.path and new.path.exists() else "").key(exc.param, spec.line)
            msg = exc.message if exc.file is None or exc.file == file else f"{exc.message} ({exc.file})"
            raise PatchFileError(msg, file=file, line=line, block=name, param=exc.param) from None
    new_links = {lk.key: lk for lk in new.links}
    old_links = {lk.key: lk for lk in (old.links if old is not None else [])}
    # 2. remove links and operators that went away (links first: removing a block drops its links)
    for key in old_links.keys() - new_links.keys():
        if key[0] in adapter.operators() and key[2] in adapter.operators():
            adapter.disconnect(*key)
            counts["links"] += 1
    for name in old_ops.keys() - new.operators.keys():
        if name in adapter.operators():
            adapter.delete(name)
            counts["deleted"] += 1
    # 3. create, swap or update operators
    for name, spec in new.operators.items():
        before = old_ops.get(name)
        if name not in adapter.operators():
            adapter.create(name, spec.type, spec.params)
            counts["created"] += 1
            continue
        if before is not None and adapter.registry.get(before.type).name != adapter.registry.get(spec.type).name:
            adapter.hot_swap(name, adapter.registry.get(spec.type).name)
            for key, value in spec.params.items():
                adapter.set_param(name, key, value)
            counts["swapped"] += 1
            continue
        prev = before.params if before is not None else {}
        for key, value in spec.params.items():
            if prev.get(key) != value:
                adapter.set_param(name, key, value)
                counts["params"] += 1
        block = adapter.block(name)
        for key in prev.keys() - spec.params.keys():  # removed from the file: back to the default
            p = block.params.get(key)
            if p is not None:
                block.set(key, p.spec.default)
                counts["params"] += 1
    # 4. add new links (a swapped operator had its links restored by hot_swap)
    existing = {(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()}
    for key, lk in new_links.items():
        if key not in existing:
            try:
                adapter.connect(*key)
            except CudapatchError as exc:
                raise PatchFileError(f"link {lk}: {exc.message}", file=file, line=lk.line) from None
            counts["links"] += 1
    if "profiling" in new.engine:
        adapter.engine.set_profiling(new.profiling)
    return counts


def _scalars(bt: Any) -> set[str]:
    return {name for name, kind, _ in bt.params if kind != "text"}
