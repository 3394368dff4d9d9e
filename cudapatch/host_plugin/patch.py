"""Patch files: a TOML description of a patch, validated with file:line messages, applied as a
difference to a running ``HostAdapter``.

Format::

    [engine]
    profiling = "PerBlock"        # a ProfilingLevel name
    device = 0
    fuse = true                   # elementwise fusion (the default); read when the engine starts

    [operators.emit]
    type = "particles.Emitter"    # a registered block type
    Rate = 300000.0               # any parameter of the block

    [operators.forces]
    type = "particles.Forces"

    [operators.gain]
    type = "core.Scale"
    fuse = false                  # an elementwise block kept out of fused groups (Scale(fuse=False))

    [operators.solve]
    type = "While"                # a region: If, While (Max required) or For (Count)
    Max = 500

    [operators.step]
    type = "KernelFile"
    Path = "step.cu"
    region = "solve"              # inside the region: runs in its body, on the GPU, per iteration

    links = ["emit.Particles -> forces.Particles"]   # top-level, before the tables, or [patch] links

    [preview]
    points = "points.Points"      # an output drawn as points
    image = "blur.Out"            # or an RGBA8 image output ...
    size = [512, 512]             # ... of this size

    [editor]
    bypassed = ["blur"]           # operators bypassed (HostAdapter.set_bypass: no rebuild)

Parameter names and link ports are checked against the block each operator's text parameters
describe: a ``CustomKernel``'s ``Code`` or a kernel file's ``Path`` declares its own ports and
scalars (reading a signature compiles nothing), and an edit applies such text before the values it
declares.

Editing the file while it runs applies the difference: changed parameters are Hot updates, new or
removed operators and links rebuild; a broken edit is reported and the last good patch keeps running.
An edit applies all or nothing (``apply_patch``; the checks and the undo are ``_patch_guard``'s): a
link, region or kept output the engine would refuse is refused before anything changes, and an edit
that fails part way is undone.

``[editor]`` holds the node editor's settings (``patch_writer``): ``positions`` is for the editor
only, ``bypassed`` is applied wherever the file is (the first load, every reload, an editor's undo),
through ``HostAdapter.set_bypass``: an operator leaving the list runs again. A name there that is not
an operator of the patch is a warning with the file and line, not an error (a hand edit that deleted
the operator).

A patch file is user input: it is read through ``kernels._files`` (a regular file of at most 8 MiB,
UTF-8, never a FIFO), and every way it can be wrong is a ``PatchFileError`` with the file and line:
TOML syntax, nesting deeper than 32, integers wider than 64 bits, unknown keys, settings of the wrong
type (``[engine] device = [0]``, ``[preview] size = "8x8"``), kernel paths the OS cannot take (a NUL
byte, too long). Line lookups use indexes built in one pass, so checking is linear in the file.
"""

from __future__ import annotations

import logging
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..blocks.library.basic import Fusable
from ..engine.profiling import ProfilingLevel
from ..errors import CudapatchError, ParameterError, PatchFileError
from ..kernels._files import MAX_PATCH_BYTES, check_path_text, read_user_text
from ..kernels._text import INT_DIGITS_LIMIT, MAX_NESTING, data_problem, short_repr
from ._patch_guard import Saved, check_structure, same_spec, set_fuse
from .adapter import HostAdapter
from .coerce import coerce_host_value
from .registry import BlockTypeRegistry

__all__ = ["Patch", "OperatorSpec", "LinkSpec", "parse_patch", "load_patch", "apply_patch", "ENGINE_KEYS"]

ENGINE_KEYS = {"profiling", "device", "name", "reuse_buffers", "fuse", "keep"}
PREVIEW_KEYS = {"points", "image", "size"}
TOP_KEYS = {"engine", "operators", "links", "preview", "editor"}  # [editor]: node positions, bypass (patch_writer)
log = logging.getLogger("cudapatch.host")
_PORT = re.compile(r"^\s*([A-Za-z_][\w-]*)\.(\w+)\s*$")  # [engine] keep = ["op.Port", ...]
_LINK = re.compile(r"^\s*([A-Za-z_][\w-]*)\.(\w+)\s*->\s*([A-Za-z_][\w-]*)\.(\w+)\s*$")
# Patterns run on every line of user text, so none may backtrack over a line: a table header's name is
# stripped in Python (a lazy name before "[ \t]*\]" is quadratic on "[" and spaces), and a string that
# never closes ends at the end of its line (else every later quote on the line rescans it).
_TABLE = re.compile(r"^[ \t]*\[([^\[\]\n]*)\]")
_STRING = re.compile(r'"((?:[^"\\\n]|\\.)*)(?:"|$)')
_DIGITS = re.compile(r"\d[\d_]*")  # a run of digits, for the line of a number too long to read
#: Largest preview image side, in pixels (a GPU's largest texture is 16K-32K).
MAX_PREVIEW_SIDE = 16384
#: Highest CUDA device ordinal a patch may name.
MAX_DEVICE = 1023


@dataclass(frozen=True)
class OperatorSpec:
    name: str
    type: str
    params: dict[str, Any]
    line: int | None = None
    region: str | None = None  # the region operator (If, While, For) holding it
    #: ``fuse = false``: kept out of fused groups (the ``fuse=False`` of ``Scale(fuse=False)``).
    fuse: bool = True


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
    #: ``[editor] bypassed``: operators to bypass, in the file's order (names are checked when applied).
    bypassed: tuple[str, ...] = ()
    #: The text the patch was parsed from (for line numbers of later errors).
    text: str = field(default="", repr=False, compare=False)

    @property
    def profiling(self) -> ProfilingLevel:
        return ProfilingLevel.parse(self.engine.get("profiling", "None"))

    @property
    def fuse(self) -> bool:
        """``[engine] fuse``: elementwise fusion, on unless the file says ``fuse = false``."""
        return bool(self.engine.get("fuse", True))


def _long_number_line(text: str) -> int | None:
    """The first line with a decimal integer of more than 4,300 digits (``int()``'s limit; underscores
    between digits do not count), outside strings and comments; None if none is found there."""
    for i, line in enumerate(text.splitlines()):
        code = _STRING.sub('""', line).split("#", 1)[0]
        for m in _DIGITS.finditer(code):
            if len(m.group()) - m.group().count("_") > INT_DIGITS_LIMIT:
                return i + 1
    return None


class _Lines:
    """Finds the line of a table, key or string in the raw text (tomllib keeps no positions). Tables
    and strings are indexed in one pass, so finding every operator's and link's line stays linear."""

    def __init__(self, text: str) -> None:
        self.lines = text.splitlines()
        self._tables: dict[str, int] = {}
        self._strings: dict[str, int] | None = None
        for i, line in enumerate(self.lines):
            m = _TABLE.match(line)
            if m is not None:
                self._tables.setdefault(".".join(p.strip() for p in m.group(1).split(".")), i + 1)

    def table(self, dotted: str) -> int | None:
        return self._tables.get(dotted)

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
        """The first line with the string literal ``"needle"`` (a link), else the first containing ``needle``."""
        if self._strings is None:
            self._strings = {}
            for i, line in enumerate(self.lines):
                for m in _STRING.finditer(line):
                    self._strings.setdefault(m.group(1), i + 1)
        found = self._strings.get(needle)
        if found is not None:
            return found
        return next((i + 1 for i, line in enumerate(self.lines) if needle in line), None)

    def path(self, keys: tuple[str, ...]) -> int | None:
        """The line of a value by its key path in the parsed data: its table, then its key there."""
        names = [k for k in keys if not k.startswith("[")]
        for n in range(len(names), 0, -1):
            line = self.table(".".join(names[:n]))
            if line is not None:
                return self.key(names[n], line) if n < len(names) else line
        return self.key(names[0]) if names else None


def parse_patch(
    text: str,
    *,
    path: str | Path | None = None,
    registry: BlockTypeRegistry | None = None,
    extra_keys: frozenset[str] = frozenset(),
) -> Patch:
    """Parse and validate patch text. With ``registry``, operator types, parameters (names and
    values) and link ports are checked too. ``extra_keys``: top-level tables a caller reads itself
    (a composite file's ``[composite]`` and ``[expose]``).

    Raises:
        PatchFileError: with ``file`` and ``line`` of the first problem.
    """
    file = str(path) if path is not None else "<patch>"
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        m = re.search(r"line (\d+)", str(exc))
        raise PatchFileError(f"TOML syntax error: {exc}", file=file, line=int(m.group(1)) if m else None) from None
    except RecursionError:
        raise PatchFileError(
            f"values are nested too deep to read (the limit is {MAX_NESTING} levels)", file=file
        ) from None
    except ValueError:  # tomllib's only other error: an integer of more than 4,300 digits, refused by int()
        raise PatchFileError("a number has more than 4,300 digits", file=file, line=_long_number_line(text)) from None
    lines = _Lines(text)
    problem = data_problem(data)
    if problem is not None:
        raise PatchFileError(problem[0], file=file, line=lines.path(problem[1]))

    def fail(msg: str, line: int | None, **ctx: Any) -> PatchFileError:
        return PatchFileError(msg, file=file, line=line, **ctx)

    for key in data:
        if key not in TOP_KEYS and key not in extra_keys:
            raise fail(
                f"unknown key {short_repr(key)} (use: {', '.join(sorted(TOP_KEYS | extra_keys))})",
                lines.key(key) or lines.table(key),
            )
    patch = Patch(Path(path) if path is not None else None, text=text)
    engine = data.get("engine", {})
    if not isinstance(engine, dict):
        raise fail("'engine' must be a table", lines.key("engine"))
    _check_engine(engine, lines, fail)
    patch.engine = dict(engine)

    ops = data.get("operators", {})
    if not isinstance(ops, dict):
        raise fail("'operators' must be a table of [operators.NAME] tables", lines.key("operators"))
    shapes: dict[str, _Shape | None] = {}  # each operator's parameters and ports, as its own texts make them
    for name, body in ops.items():
        line = lines.table(f"operators.{name}")
        if not isinstance(body, dict):
            raise fail(f"operator '{name}' must be a table with a 'type'", line)
        body = dict(body)
        type_name = body.pop("type", None)
        if not isinstance(type_name, str):
            raise fail(f"operator '{name}' needs type = \"package.Type\"", line, block=name)
        region = body.pop("region", None)
        if region is not None and not isinstance(region, str):
            raise fail(
                f"operator '{name}': region = {short_repr(region)}: write the name of an If, While or For operator",
                lines.key("region", line),
                block=name,
            )
        fuse = body.pop("fuse", True)
        if not isinstance(fuse, bool):
            raise fail(
                f"operator '{name}': fuse = {short_repr(fuse)}: write true or false",
                lines.key("fuse", line),
                block=name,
                param="fuse",
            )
        path_value = body.get("Path")
        if isinstance(path_value, str):
            try:
                check_path_text(path_value, what="kernel file", error=PatchFileError)
            except PatchFileError as exc:
                raise fail(exc.message, lines.key("Path", line), block=name, param="Path") from None
        spec = OperatorSpec(name, type_name, body, line, region, fuse)
        if registry is not None:
            shapes[name] = _check_operator(spec, registry, lines, fail, base=patch.path)
        patch.operators[name] = spec
    _check_regions(patch, registry, lines, fail)

    raw_links = data.get("links", [])
    if not isinstance(raw_links, list):
        raise fail("'links' must be a list of \"op.Port -> op.Port\" strings", lines.key("links"))
    seen = set()
    for item in raw_links:
        line = lines.text(item) if isinstance(item, str) else lines.key("links")
        m = _LINK.match(item) if isinstance(item, str) else None
        if m is None:
            raise fail(f'bad link {short_repr(item)}: write "op.Port -> op.Port"', line)
        lk = LinkSpec(*m.groups(), line=line)
        for op, port, kind in ((lk.src, lk.src_port, "output"), (lk.dst, lk.dst_port, "input")):
            if op not in patch.operators:
                raise fail(f"link {lk}: no operator '{op}'", line)
            shape = shapes.get(op)
            if shape is not None:
                names = list(shape.outputs if kind == "output" else shape.inputs)
                if port not in names:
                    raise fail(
                        f"link {lk}: operator '{op}' ({shape.type_name}) has no {kind} '{port}' "
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
            raise fail(f"unknown preview setting {short_repr(key)} (use: {', '.join(sorted(PREVIEW_KEYS))})", pline)
        if key in ("points", "image"):
            op, _, port = value.partition(".") if isinstance(value, str) else ("", "", "")
            if op not in patch.operators or not port:
                raise fail(
                    f'preview {key} = {short_repr(value)}: write "operator.Port" naming an operator of this patch',
                    pline,
                )
        elif key == "size":
            ok = (
                isinstance(value, list)
                and len(value) == 2
                and all(isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_PREVIEW_SIDE for v in value)
            )
            if not ok:
                raise fail(
                    f"preview size = {short_repr(value)}: write [width, height], two whole numbers of pixels "
                    f"in 1..{MAX_PREVIEW_SIDE}",
                    pline,
                )
    patch.preview = dict(preview)

    editor = data.get("editor", {})
    if not isinstance(editor, dict):
        raise fail("'editor' must be a table (the node editor's positions and bypassed operators)", lines.key("editor"))
    bypassed = editor.get("bypassed", [])
    if not isinstance(bypassed, list) or not all(isinstance(v, str) for v in bypassed):
        raise fail(
            f"[editor] bypassed = {short_repr(bypassed)}: write a list of operator names",
            lines.key("bypassed", lines.table("editor")),
        )
    patch.bypassed = tuple(dict.fromkeys(bypassed))
    return patch


def _check_regions(patch: Patch, registry: BlockTypeRegistry | None, lines: _Lines, fail: Any) -> None:
    """Each ``region = "name"`` names an operator of the patch that is a region (with ``registry``),
    and no region holds itself."""
    from ..blocks.regions import Region

    ops = patch.operators
    for name, spec in ops.items():
        if spec.region is None:
            continue
        line = lines.key("region", spec.line)
        holder = ops.get(spec.region)
        if holder is None:
            raise fail(f"operator '{name}': region '{spec.region}' is not an operator of this patch", line, block=name)
        if registry is not None:
            try:
                is_region = issubclass(registry.get(holder.type).cls, Region)
            except CudapatchError:
                is_region = True  # an unknown type is reported at its own operator
            if not is_region:
                raise fail(
                    f"operator '{name}': '{spec.region}' ({holder.type}) is not a region: use an If, While or For",
                    line,
                    block=name,
                )
        seen, cur = {name}, spec.region
        while cur is not None:
            if cur in seen:
                raise fail(f"operator '{name}': region '{spec.region}' holds itself", line, block=name)
            seen.add(cur)
            nxt = ops.get(cur)
            cur = nxt.region if nxt is not None else None


def _check_engine(engine: dict[str, Any], lines: _Lines, fail: Any) -> None:
    """The ``[engine]`` settings' names and types: ``profiling`` a level's name, ``device`` an ordinal,
    ``name`` text (a wrong type would otherwise surface as a TypeError when the engine starts)."""
    table = lines.table("engine")
    for key, value in engine.items():
        line = lines.key(key, table)
        if key not in ENGINE_KEYS:
            raise fail(f"unknown engine setting {short_repr(key)} (use: {', '.join(sorted(ENGINE_KEYS))})", line)
        if key == "profiling":
            if not isinstance(value, str):
                raise fail(f'profiling = {short_repr(value)}: write a level\'s name, such as "PerBlock"', line)
            try:
                ProfilingLevel.parse(value)
            except CudapatchError as exc:
                raise fail(exc.message, line) from None
        elif key == "device":
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_DEVICE:
                raise fail(f"device = {short_repr(value)}: write a CUDA device number (0 for the first GPU)", line)
        elif key == "name" and not isinstance(value, str):
            raise fail(f"name = {short_repr(value)}: the engine's name must be text", line)
        elif key in ("reuse_buffers", "fuse") and not isinstance(value, bool):
            raise fail(f"{key} = {short_repr(value)}: write true or false", line)
        elif key == "keep" and (
            not isinstance(value, list) or not all(isinstance(v, str) and _PORT.match(v) for v in value)
        ):
            raise fail(f'keep = {short_repr(value)}: write a list of "operator.Port" strings', line)


@dataclass(frozen=True)
class _Shape:
    """An operator's parameter and port names, for checking a patch before anything is built."""

    type_name: str
    params: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _check_operator(
    spec: OperatorSpec, registry: BlockTypeRegistry, lines: _Lines, fail: Any, *, base: Path | None
) -> _Shape | None:
    """Check ``spec``'s type and parameter names; returns its shape for the link checks (None: the
    shape is only known once the block is created, which reports any problem then)."""
    try:
        bt = registry.get(spec.type)
    except CudapatchError as exc:
        raise fail(exc.message, lines.key("type", spec.line), block=spec.name) from None
    try:
        _check_fuse(spec, bt)
    except CudapatchError as exc:
        raise fail(exc.message, lines.key("fuse", spec.line), block=spec.name, param="fuse") from None
    texts = _shaping_texts(spec, bt)
    if texts:
        shape = _described_shape(spec, bt, texts, base)
        if shape is None:
            return None  # the block reports why it does not describe when the adapter creates it
    elif not bt.ports and not bt.params:
        return None  # a type that needs its parameters to describe itself (a kernel file): checked on create
    else:
        shape = _Shape(
            bt.name,
            tuple(name for name, _, _ in bt.params),
            tuple(n for d, n, _ in bt.ports if d == "in"),
            tuple(n for d, n, _ in bt.ports if d == "out"),
        )
    for key in spec.params:
        if key not in shape.params:
            line = lines.key(key, spec.line)
            raise fail(
                f"operator '{spec.name}' ({bt.name}) has no parameter '{key}' "
                f"(it has: {', '.join(shape.params) or 'none'})",
                line,
                block=spec.name,
                param=key,
            )
    return shape


def _shaping_texts(spec: OperatorSpec, bt: Any) -> dict[str, str]:
    """The text parameters ``spec`` sets that shape its block: a ``CustomKernel``'s ``Code``, a kernel
    file's ``Path`` (the only parameter a type that cannot describe itself by default is known to have)."""
    if not bt.params:
        path = spec.params.get("Path")
        return {"Path": path} if isinstance(path, str) else {}
    declared = {name for name, kind, _ in bt.params if kind == "text"}
    return {k: v for k, v in spec.params.items() if k in declared and isinstance(v, str)}


def _described_shape(spec: OperatorSpec, bt: Any, texts: dict[str, str], base: Path | None) -> _Shape | None:
    """The shape of ``spec``'s block with its text parameters applied: a ``CustomKernel``'s ``Code`` or
    a kernel file's ``Path`` declares the ports and scalars, so the default instance's names do not
    apply. Describing reads the code's signature (or the file and its sidecar) and compiles nothing.
    None: the block does not describe (a missing file, a signature it cannot read): the adapter
    reports that when it creates the block, after looking on the host's search paths."""
    texts = dict(texts)
    path = texts.get("Path")
    if path:
        resolved = Path(path) if Path(path).is_absolute() else (base.parent / path if base is not None else None)
        try:
            if resolved is None or not resolved.is_file():
                return None  # found later through the host's search paths, or reported missing there
        except OSError:  # a path the OS refuses (too long): the block reports it on create
            return None
        texts["Path"] = str(resolved)
    try:
        block = bt.create(spec.name, **texts)
    except (CudapatchError, TypeError, ValueError):  # as the registry allows a plugin's describe to fail
        return None
    desc = block.description
    return _Shape(
        bt.name,
        tuple(p.name for p in desc.params),
        tuple(p.name for p in desc.inputs),
        tuple(p.name for p in desc.outputs),
    )


def load_patch(path: str | Path, registry: BlockTypeRegistry | None = None) -> Patch:
    """Read and validate a patch file.

    Raises:
        PatchFileError: missing, unreadable or not a regular file, over 8 MiB, not UTF-8, or invalid
            content (with the line).
    """
    text = read_user_text(path, what="patch file", limit=MAX_PATCH_BYTES, error=PatchFileError)
    return parse_patch(text, path=Path(path), registry=registry)


def apply_patch(adapter: HostAdapter, new: Patch, old: Patch | None = None) -> dict[str, int]:
    """Make ``adapter`` match ``new``, changing only what differs from ``old`` (None: build all).

    All or nothing: everything that can be checked is checked before the running patch is touched.
    Every new or changed operator is built off to the side (its values, its text), and the regions,
    links and kept outputs the edit would make are checked against those blocks: ports, element
    types, loops that do not pass through a FrameDelay (named block by block). An edit that still
    fails part way (a kernel file changed meanwhile) is undone before the error is raised: the
    adapter is as it was, operators the edit did not change keeping their blocks.

    Returns:
        Counts of what changed: ``created``, ``deleted``, ``swapped``, ``params``, ``links``, ``regions``
        (operators placed in or out of a region), ``bypass`` (operators bypassed or run again for
        ``[editor] bypassed``).

    Raises:
        PatchFileError: a value, region or link the blocks refuse, with the file and line.
    """
    file = str(new.path) if new.path else "<patch>"
    old_ops = old.operators if old is not None else {}
    probes = _probe_operators(adapter, new, old_ops, file)
    # Once the probes passed: they looked up every type same_spec looks up, an unknown one at its line.
    present = adapter.operators()
    changed = {n for n, s in new.operators.items() if n not in present or not same_spec(adapter, old_ops.get(n), s)}
    check_structure(adapter, new, old, probes, changed, _Lines(new.text))
    saved = Saved.of(adapter, changed)
    try:
        return _change(adapter, new, old, file)
    except BaseException:
        keep_before = {_port(v) for v in old.engine.get("keep", [])} if old is not None else set()
        saved.restore(adapter, keep_before, {_port(v) for v in new.engine.get("keep", [])})
        raise
    finally:  # values set on blocks directly (back to a default, or undone) may change a ring's size
        adapter.sync_rings()


def _probe_operators(adapter: HostAdapter, new: Patch, old_ops: dict[str, OperatorSpec], file: str) -> dict[str, Any]:
    """Build every operator of ``new`` off to the side, with its values: each must build, each value
    must be accepted. Returns the blocks by operator name (``check_structure`` reads their ports)."""
    probes: dict[str, Any] = {}
    for name, spec in new.operators.items():
        try:
            bt = adapter.registry.get(spec.type)
            _check_fuse(spec, bt)
            probe_texts = {
                k: adapter.resolve_text(k, v)
                for k, v in spec.params.items()
                if isinstance(v, str) and k not in _scalars(bt)
            }
            probes[name] = build_operator(bt, name, spec.params, probe_texts, fuse=spec.fuse)
            was = old_ops.get(name)
            if was is not None and adapter.registry.get(was.type).name == bt.name:  # not swapped: values go back
                _check_defaults(probes[name], was.params.keys() - spec.params.keys())
        except CudapatchError as exc:
            line = spec.line
            if exc.param is not None:
                line = _Lines(new.text).key(exc.param, spec.line)
            raise _at_operator(exc, file, line, name) from None
    return probes


def _change(adapter: HostAdapter, new: Patch, old: Patch | None, file: str) -> dict[str, int]:
    """The steps of ``apply_patch`` that change the adapter, once ``new`` is checked. Operators that
    went away are deleted last, after every step that may fail, so undoing never needs them back."""
    old_ops = old.operators if old is not None else {}
    counts = {"created": 0, "deleted": 0, "swapped": 0, "params": 0, "links": 0, "regions": 0, "bypass": 0}
    new_links = {lk.key: lk for lk in new.links}
    old_links = {lk.key: lk for lk in (old.links if old is not None else [])}
    # 1. remove links that went away (before new ones: a loop they closed may be opened by the edit)
    for key in old_links.keys() - new_links.keys():
        if key[0] in adapter.operators() and key[2] in adapter.operators():
            adapter.disconnect(*key)
            counts["links"] += 1
    # 2. create, swap or update operators
    for name, spec in new.operators.items():
        try:
            _apply_operator(adapter, name, spec, old_ops.get(name), counts)
        except CudapatchError as exc:  # refused after the probe passed (a file changed meanwhile ...)
            raise _at_operator(exc, file, spec.line, name) from None
    # 3. regions: put each operator in the region the file names (or back at the top level)
    placed = adapter.regions()
    for name, spec in new.operators.items():
        if placed.get(name) != spec.region:
            try:
                adapter.place(name, spec.region)
            except CudapatchError as exc:
                raise _at_operator(exc, file, _Lines(new.text).key("region", spec.line), name) from None
            counts["regions"] += 1
    # 4. add new links (a swapped operator had its links restored by hot_swap)
    existing = {(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()}
    kept = {(key[2], key[3]): key for key in new_links}  # an input keeps the last link listed into it
    for key, lk in new_links.items():
        if key not in existing and kept[(key[2], key[3])] == key:
            try:
                adapter.connect(*key)
            except CudapatchError as exc:
                raise PatchFileError(f"link {lk}: {exc.message}", file=file, line=lk.line) from None
            counts["links"] += 1
    _apply_keep(adapter, new, old, file)
    # 5. delete the operators that went away (their links went in step 1)
    for name in old_ops.keys() - new.operators.keys():
        if name in adapter.operators():
            adapter.delete(name)
            counts["deleted"] += 1
    counts["bypass"] = _apply_bypassed(adapter, new, old, file)
    if "profiling" in new.engine:
        adapter.engine.set_profiling(new.profiling)
    return counts


def _apply_bypassed(adapter: HostAdapter, new: Patch, old: Patch | None, file: str) -> int:
    """``[editor] bypassed``: bypass the operators listed in ``new``, and let those only ``old`` listed
    run again (``HostAdapter.set_bypass``, the Bypass tier: no rebuild). Set from the adapter's state,
    so a flag already right is not set again (the editor set it) and an operator created or swapped
    since is bypassed too. Operators neither file lists are left as they are. Returns how many flags
    changed."""
    wanted = set(new.bypassed)
    before = set(old.bypassed) if old is not None else set()
    if not wanted and not before:
        return 0  # the common case: nothing bypassed, nothing to undo
    ops = adapter.operators()
    lines: _Lines | None = None
    changed = 0
    for op in new.bypassed:
        if op not in ops:
            if lines is None:
                lines = _Lines(new.text)
            line = lines.key("bypassed", lines.table("editor"))
            log.warning("%s:%s: [editor] bypassed: no operator '%s' in this patch (ignored)", file, line or "?", op)
    for op in sorted(wanted | before):
        on = op in wanted
        if op in ops and adapter.bypassed(op) != on:
            adapter.set_bypass(op, on)
            changed += 1
    return changed


def _apply_keep(adapter: HostAdapter, new: Patch, old: Patch | None, file: str) -> None:
    """``[engine] keep``: the outputs kept in buffers of their own (buffer reuse never shares them, fusion
    never computes them inside another block's kernel)."""
    keep = getattr(adapter.engine, "keep", None)
    if keep is None:  # an engine that keeps nothing apart (no buffer reuse, no fusion)
        return
    wanted = {_port(v) for v in new.engine.get("keep", [])}
    before = {_port(v) for v in old.engine.get("keep", [])} if old is not None else set()
    line = _Lines(new.text).key("keep", _Lines(new.text).table("engine"))
    for op, port in sorted(wanted):
        if op not in adapter.operators():
            raise PatchFileError(f"keep: no operator '{op}'", file=file, line=line)
        try:
            keep(adapter.block(op), port)
        except CudapatchError as exc:
            raise PatchFileError(f"keep: {exc.message}", file=file, line=line) from None
    for op, port in sorted(before - wanted):
        if op in adapter.operators():
            keep(adapter.block(op), port, False)


def _port(text: str) -> tuple[str, str]:
    m = _PORT.match(text)
    assert m is not None  # parse_patch checked it
    return m.group(1), m.group(2)


def _at_operator(exc: CudapatchError, file: str, line: int | None, name: str) -> PatchFileError:
    """``exc`` as a PatchFileError at the operator's line; a kernel file's own location stays in the message."""
    if exc.file is None or exc.file == file:
        msg = exc.message
    else:
        msg = f"{exc.message} ({exc.file}{'' if exc.line is None else f':{exc.line}'})"
    return PatchFileError(msg, file=file, line=line, block=name, param=exc.param)


def _apply_operator(
    adapter: HostAdapter, name: str, spec: OperatorSpec, before: OperatorSpec | None, counts: dict
) -> None:
    """Create, swap or update one operator to match ``spec`` (``before``: its previous spec)."""
    if name not in adapter.operators():
        adapter.create(name, spec.type, spec.params, fuse=spec.fuse)
        counts["created"] += 1
        return
    bt = adapter.registry.get(spec.type)
    # Text parameters (Code, Path) go first: they declare the block's other parameters and ports.
    scalars = _scalars(bt)
    ordered = sorted(spec.params.items(), key=lambda kv: not (isinstance(kv[1], str) and kv[0] not in scalars))
    if before is not None and adapter.registry.get(before.type).name != bt.name:
        adapter.hot_swap(name, bt.name, fuse=spec.fuse)  # fuse to the constructor: one description
        for key, value in ordered:
            adapter.set_param(name, key, value)
        counts["swapped"] += 1
        return
    prev = before.params if before is not None else {}
    for key, value in ordered:
        if prev.get(key) != value:
            adapter.set_param(name, key, value)
            counts["params"] += 1
    block = adapter.block(name)
    for key in prev.keys() - spec.params.keys():  # removed from the file: back to the default
        p = block.params.get(key)
        if p is not None:
            block.set(key, p.spec.default)
            counts["params"] += 1
    if getattr(block, "fuse", True) != spec.fuse:  # a Fusable's constructor keyword: it describes the block again
        set_fuse(block, spec.fuse)
        counts["params"] += 1


def _check_defaults(probe: Any, removed: set[str]) -> None:
    """A value removed from the file goes back to its default: refuse the edit now if ``set`` would
    refuse that default (a While's Max, whose default 0 means "not given" and is no value to run with)."""
    for key in sorted(removed):
        p = probe.params.get(key)
        if p is None or p.spec.kind == "text":
            continue
        try:
            p.validate(p.spec.default)
        except ParameterError as exc:
            raise ParameterError(
                f"removed from the file, it would go back to its default {p.spec.default!r}, which it refuses "
                f"({exc.message}): give it a value",
                block=exc.block,
                param=key,
            ) from None


def build_operator(bt: Any, name: str, params: dict[str, Any], texts: dict[str, str], *, fuse: bool = True) -> Any:
    """A block of type ``bt`` named ``name``: ``texts`` (its text parameters) go to the constructor,
    with ``fuse=False`` when ``fuse`` is off (a ``Fusable`` type), and every other value of ``params``
    is set as a host value (``coerce_host_value``).

    Raises:
        CudapatchError: the block does not describe, has no such parameter (``param`` names it, so
            the caller can point at its line), or refuses a value.
    """
    block = bt.create(name, **texts) if fuse else bt.create(name, fuse=False, **texts)
    for key, value in params.items():
        if key in texts:
            continue
        p = block.params.get(key)
        if p is None:
            raise CudapatchError(f"operator '{name}' ({bt.name}) has no parameter '{key}'", param=key)
        block.set(key, coerce_host_value(p.spec, value))
    return block


def _check_fuse(spec: OperatorSpec, bt: Any) -> None:
    """``fuse = false`` is a constructor keyword of the elementwise blocks (``Fusable``), no parameter.

    Raises:
        CudapatchError: on a type that never fuses (``param`` is ``fuse``).
    """
    if not spec.fuse and not issubclass(bt.cls, Fusable):
        raise CudapatchError(
            f"operator '{spec.name}' ({bt.name}) never fuses: fuse = false applies to elementwise blocks "
            "(VectorAdd, Scale, Expression and plugin types built on Fusable)",
            block=spec.name,
            param="fuse",
        )


def _scalars(bt: Any) -> set[str]:
    return {name for name, kind, _ in bt.params if kind != "text"}
