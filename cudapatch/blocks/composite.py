"""Composite blocks ("functions"): a sub-patch used as one block type.

A ``Composite`` holds inner blocks, the links between them, and what it exposes: an outer input
feeds one or several inner inputs, an outer output is one inner output, an outer parameter sets one
or several inner scalar parameters. To the patch it is one block with those ports and parameters.

The engine flattens it when it freezes the patch (``engine/composites.py``): the compiler sees the
inner blocks under qualified names (``blur1/h``), links into and out of the composite go to the
inner ports, and the plan also files the inner kernels' parameter slots under the composite's own
parameter, so a Hot edit of an exposed parameter patches the inner kernels in place (no rebuild).
With its ``ChildGraph`` parameter set to 1 (a rebuild) the inner blocks' nodes become one CUDA
child-graph node.

A composite is described in Python (subclass, implement ``compose``) or by a TOML file in the
patch-file format with an ``[expose]`` table (``host_plugin/composite_file.py``)::

    class Blur(Composite):
        type_name = "Blur"

        def compose(self, c: CompositeBuilder) -> None:
            c.add("h", BlurH(Radius=2))
            c.add("v", BlurV(Radius=2))
            c.link("h.Out", "v.In")
            c.expose("In", "h.In")
            c.expose("Out", "v.Out")
            c.expose("Radius", "h.Radius", "v.Radius")    # one Hot parameter sets both

Mistakes (an unknown inner port, an exposed name used twice, a link cycle inside) raise
``CudapatchError`` naming the composite, the inner operator and, for files, the file and line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal

from ..errors import CudapatchError
from ..kernels.types import DType
from .block import Block
from .builder import BlockBuilder
from .description import BlockDescription, ParamSpec, PortSpec

__all__ = [
    "CHILD_GRAPH",
    "Composite",
    "CompositeBuilder",
    "CompositeDescription",
    "CompositeLayout",
    "Exposure",
    "InnerLink",
]

ExposureKind = Literal["input", "output", "param"]
#: Every composite's own parameter choosing how it runs: 1 as one child-graph node, 0 flattened.
CHILD_GRAPH = "ChildGraph"


@dataclass(frozen=True)
class InnerLink:
    """A link between two inner blocks: ``src.src_port -> dst.dst_port`` (local names)."""

    src: str
    src_port: str
    dst: str
    dst_port: str
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.src}.{self.src_port} -> {self.dst}.{self.dst_port}"


@dataclass(frozen=True)
class Exposure:
    """An outer port or parameter and the inner ports or parameters it stands for.

    Attributes:
        name: The outer name.
        kind: ``input`` (feeds every target), ``output`` (exactly one target) or ``param`` (sets
            every target; all of one type).
        targets: ``(inner block, port or parameter)`` pairs, local names.
        line: Line in the composite file, if any.
    """

    name: str
    kind: ExposureKind
    targets: tuple[tuple[str, str], ...]
    line: int | None = None


@dataclass(frozen=True, eq=False)
class CompositeLayout:
    """What ``CompositeBuilder.commit`` checked: the inner blocks and how they are wired and exposed.

    Attributes:
        blocks: Inner blocks by local name, in the order added (a valid launch order is found by the
            compiler, not taken from here).
        links: Links between inner blocks.
        exposures: Outer name → what it stands for.
        file: The composite file, if it came from one.
        lines: Inner block's local name → its line in ``file``.
        child_graph: The default of the composite's ``ChildGraph`` parameter (run the inner blocks
            as one child-graph node).
    """

    blocks: dict[str, Block]
    links: tuple[InnerLink, ...]
    exposures: dict[str, Exposure]
    file: str | None = None
    lines: dict[str, int | None] = field(default_factory=dict)
    child_graph: bool = False


@dataclass(frozen=True)
class CompositeDescription(BlockDescription):
    """A composite's description: the exposed ports and parameters (no kernels of its own), plus
    the identity of its inner blocks and their descriptions, so a re-composed composite (new inner
    blocks, a changed inner kernel signature) compares unequal and the engine rebuilds."""

    inner: tuple[tuple[str, int, BlockDescription], ...] = ()
    child_graph: bool = False


class CompositeBuilder:
    """Collects a composite's inner blocks, links and exposures; ``commit()`` checks them.

    Args:
        composite: The composite's name (for messages).
        file: The composite file, for messages (None for a Python composite).
        texts: The composite's text parameter values (a file composite's ``Path``).
    """

    def __init__(self, composite: str, *, file: str | None = None, texts: dict[str, str] | None = None) -> None:
        self.composite = composite
        self.file = file
        self._texts = texts or {}
        self._blocks: dict[str, Block] = {}
        self._lines: dict[str, int | None] = {}
        self._links: list[InnerLink] = []
        self._exposures: dict[str, Exposure] = {}
        self._text_params: list[ParamSpec] = []
        #: Run the inner blocks as one child-graph node.
        self.child_graph = False
        #: The type name the description carries (None: the composite class's ``type_name``).
        self.type_name: str | None = None

    def error(
        self, message: str, *, line: int | None = None, inner: str | None = None, file: str | None = None, **ctx: Any
    ) -> CudapatchError:
        """An error naming the composite (and ``inner``, the inner block), with the file and line."""
        where = f"composite '{self.composite}'" + (f", operator '{inner}'" if inner else "")
        return CudapatchError(f"{where}: {message}", block=self.composite, file=file or self.file, line=line, **ctx)

    # -- building -------------------------------------------------------------------------------
    def add(self, name: str, block: Block, *, line: int | None = None) -> Block:
        """Add inner block ``block`` under local name ``name`` (renamed to it). Returns it.

        Raises:
            CudapatchError: the name is empty, holds ``/`` or ``.``, or is taken.
        """
        if not isinstance(block, Block):
            raise self.error(f"inner operator '{name}' must be a Block, got {type(block).__name__}", line=line)
        if not name or "/" in name or "." in name:
            raise self.error(f"inner operator name '{name}' must be non-empty without '/' or '.'", line=line)
        if name in self._blocks:
            raise self.error(f"inner operator '{name}' is defined twice", line=line, inner=name)
        if block.context is not None:
            raise self.error("an inner block must not be registered with an engine", line=line, inner=name)
        block.name = name
        self._blocks[name] = block
        self._lines[name] = line
        return block

    def link(self, src: str, dst: str, *, line: int | None = None) -> None:
        """Link inner ports: ``link("h.Out", "v.In")``.

        Raises:
            CudapatchError: not ``op.Port`` text (ports are checked by ``commit``).
        """
        (s, sp), (d, dp) = self._split(src, line), self._split(dst, line)
        self._links.append(InnerLink(s, sp, d, dp, line))

    def expose(self, name: str, *targets: str, line: int | None = None) -> None:
        """Expose inner ports or parameters (``"op.Name"``) as outer ``name``; the targets' kind
        (input, output or parameter) decides what ``name`` is. Several targets: an input fed to all of
        them, or a parameter setting all of them; an output has exactly one.

        Raises:
            CudapatchError: ``name`` is taken or empty, or a target is not ``op.Name`` text.
        """
        if not name or not isinstance(name, str) or "." in name or "/" in name:
            raise self.error(f"exposed name {name!r} must be non-empty text without '.' or '/'", line=line)
        if name in self._exposures or any(p.name == name for p in self._text_params):
            raise self.error(f"'{name}' is exposed twice", line=line)
        if not targets:
            raise self.error(f"exposed '{name}' names no inner port or parameter", line=line)
        pairs = tuple(self._split(t, line) for t in targets)
        self._exposures[name] = Exposure(name, "input", pairs, line)  # the kind is found by commit

    def text(self, name: str, *, default: str = "", description: str = "") -> str:
        """A text parameter of the composite itself (a file composite's ``Path``); returns its value."""
        self._text_params.append(ParamSpec(name, None, default, kind="text", description=description))
        return self._texts.get(name, default)

    def _split(self, text: str, line: int | None) -> tuple[str, str]:
        op, dot, port = text.partition(".") if isinstance(text, str) else ("", "", "")
        if not dot or not op or not port:
            raise self.error(f'{text!r} must name an inner port or parameter as "operator.Name"', line=line)
        return op.strip(), port.strip()

    # -- checking -------------------------------------------------------------------------------
    def _block(self, op: str, line: int | None) -> Block:
        b = self._blocks.get(op)
        if b is None:
            known = ", ".join(self._blocks) or "none"
            raise self.error(f"no inner operator '{op}' (operators: {known})", line=line)
        return b

    def commit(self) -> CompositeLayout:
        """Check every link and exposure against the inner blocks' descriptions.

        Raises:
            CudapatchError: an unknown inner operator, port or parameter; mismatched element types;
                two links into one inner input; an exposed input that is also linked inside; a cycle
                of inner links; an output exposed with several targets; parameters of different types
                behind one name.
        """
        incoming: dict[tuple[str, str], InnerLink] = {}
        for lk in self._links:
            out = self._block(lk.src, lk.line).description.output(lk.src_port)
            inp = self._block(lk.dst, lk.line).description.input(lk.dst_port)
            if out is None:
                names = ", ".join(p.name for p in self._blocks[lk.src].outputs) or "none"
                raise self.error(f"link {lk}: no output '{lk.src_port}' (outputs: {names})", line=lk.line, inner=lk.src)
            if inp is None:
                names = ", ".join(p.name for p in self._blocks[lk.dst].inputs) or "none"
                raise self.error(f"link {lk}: no input '{lk.dst_port}' (inputs: {names})", line=lk.line, inner=lk.dst)
            if out.dtype != inp.dtype:
                raise self.error(
                    f"link {lk}: element types differ ({out.dtype.c_name} -> {inp.dtype.c_name})",
                    line=lk.line,
                    inner=lk.dst,
                )
            if (lk.dst, lk.dst_port) in incoming:
                raise self.error(f"link {lk}: input '{lk.dst_port}' is linked twice", line=lk.line, inner=lk.dst)
            incoming[(lk.dst, lk.dst_port)] = lk
        self._check_acyclic()
        exposures = {name: self._exposure(e, incoming) for name, e in self._exposures.items()}
        return CompositeLayout(
            dict(self._blocks), tuple(self._links), exposures, self.file, dict(self._lines), self.child_graph
        )

    def _check_acyclic(self) -> None:
        succ: dict[str, list[InnerLink]] = {}
        for lk in self._links:
            dst = self._blocks.get(lk.dst)
            if dst is not None and lk.dst_port in dst.description.feedback_inputs:
                continue  # into a FrameDelay's In: read a frame late, the one link a loop may pass through
            succ.setdefault(lk.src, []).append(lk)
        state: dict[str, int] = {}  # 1: on the path, 2: done

        def visit(op: str) -> None:
            state[op] = 1
            for lk in succ.get(op, ()):
                s = state.get(lk.dst)
                if s == 1:
                    raise self.error(f"link {lk} closes a cycle of inner links", line=lk.line, inner=lk.dst)
                if s is None:
                    visit(lk.dst)
            state[op] = 2

        for op in self._blocks:
            if op not in state:
                visit(op)

    def _exposure(self, e: Exposure, incoming: dict[tuple[str, str], InnerLink]) -> Exposure:
        kinds = []
        for op, name in e.targets:
            d = self._block(op, e.line).description
            if d.input(name) is not None:
                if (op, name) in incoming:
                    raise self.error(
                        f"exposed '{e.name}': input '{name}' is already linked inside ({incoming[(op, name)]})",
                        line=e.line,
                        inner=op,
                    )
                kinds.append("input")
            elif d.output(name) is not None:
                kinds.append("output")
            elif d.param(name) is not None:
                kinds.append("param")
            else:
                known = [p.name for p in (*d.inputs, *d.outputs, *d.params)]
                raise self.error(
                    f"exposed '{e.name}': operator '{op}' has no port or parameter '{name}' "
                    f"(it has: {', '.join(known) or 'none'})",
                    line=e.line,
                    inner=op,
                )
        if len(set(kinds)) != 1:
            both = " and ".join(sorted(set(kinds)))
            raise self.error(f"exposed '{e.name}' names {both} targets (one kind per name)", line=e.line)
        kind = kinds[0]
        if kind == "output" and len(e.targets) != 1:
            raise self.error(f"exposed output '{e.name}' must name exactly one inner output", line=e.line)
        if kind == "input":
            dtypes = {self._blocks[op].description.input(n).dtype for op, n in e.targets}  # type: ignore[union-attr]
            if len(dtypes) != 1:
                raise self.error(f"exposed input '{e.name}' feeds inputs of different element types", line=e.line)
        if kind == "param":
            specs = [self._blocks[op].description.param(n) for op, n in e.targets]
            if len({(s.kind, s.dtype) for s in specs}) != 1:  # type: ignore[union-attr]
                raise self.error(f"exposed parameter '{e.name}' sets parameters of different types", line=e.line)
        return replace(e, kind=kind)  # type: ignore[arg-type]

    def describe(self, type_name: str, layout: CompositeLayout) -> CompositeDescription:
        """The composite's description: exposed ports and parameters (values from the first target's
        current value), then its own text parameters."""
        blocks = layout.blocks
        inputs, outputs, params = [], [], []
        for e in layout.exposures.values():
            op, name = e.targets[0]
            d = blocks[op].description
            if e.kind == "input":
                specs = [blocks[o].description.input(n) for o, n in e.targets]
                required = any(s.required for s in specs)  # type: ignore[union-attr]
                inputs.append(replace(specs[0], name=e.name, pins=(), counter=(), required=required))  # type: ignore[arg-type]
            elif e.kind == "output":
                spec: PortSpec = d.output(name)  # type: ignore[assignment]
                outputs.append(replace(spec, name=e.name, pins=(), counter=()))
            else:
                ps: ParamSpec = d.param(name)  # type: ignore[assignment]
                structural = any(blocks[o].description.param(n).structural for o, n in e.targets)  # type: ignore[union-attr]
                default = blocks[op].params[name].value
                params.append(replace(ps, name=e.name, pins=(), structural=structural, default=default))
        if CHILD_GRAPH in layout.exposures or any(p.name == CHILD_GRAPH for p in self._text_params):
            raise self.error(f"'{CHILD_GRAPH}' is the composite's own parameter: expose another name")
        mode = ParamSpec(
            CHILD_GRAPH,
            DType.UINT32,
            int(layout.child_graph),
            0,
            1,
            structural=True,
            description="1: the inner blocks run as one CUDA child-graph node (a rebuild); 0: flattened",
        )
        inner = tuple((n, b.id, b.description) for n, b in blocks.items())
        return CompositeDescription(
            type_name=type_name,
            kernels=(),
            inputs=tuple(inputs),
            outputs=tuple(outputs),
            params=tuple(params) + (mode,) + tuple(self._text_params),
            inner=inner,
            child_graph=layout.child_graph,
        )


class Composite(Block):
    """Base class of composite block types: implement ``compose`` (see the module docstring).

    Args:
        name: Instance name.
        child_graph: The default of its ``ChildGraph`` parameter: run the inner blocks as one CUDA
            child-graph node (default: the class's ``child_graph``, or what the composite file says).
        **params: Initial values of exposed parameters (text parameters such as ``Path`` first).

    Raises:
        CudapatchError: the composition is wrong (names the composite, inner operator, file and line).
    """

    type_name: ClassVar[str] = "Composite"
    #: Default of the ``ChildGraph`` parameter (the ``child_graph`` argument overrides it).
    child_graph: ClassVar[bool] = False

    def __init__(self, *, name: str | None = None, child_graph: bool | None = None, **params: Any) -> None:
        self._child_graph_override = child_graph
        self.layout: CompositeLayout | None = None
        super().__init__(name=name, **params)

    def compose(self, c: CompositeBuilder) -> None:
        """Add inner blocks, links and exposures with ``c``. Called at construction and on ``refresh()``."""
        raise NotImplementedError(f"{type(self).__name__}.compose")

    def describe(self, b: BlockBuilder) -> None:  # a composite composes instead
        raise CudapatchError("a composite is described by compose()", block=self.name)

    def composite_file(self) -> str | None:
        """The file the composite comes from (for messages), None for a Python composite."""
        return None

    def _describe(self) -> BlockDescription:
        c = CompositeBuilder(self.name, file=self.composite_file(), texts=self._texts)
        c.child_graph = type(self).child_graph
        self.compose(c)
        if self._child_graph_override is not None:
            c.child_graph = bool(self._child_graph_override)
        layout = c.commit()
        desc = c.describe(c.type_name or self.type_name, layout)
        self.layout = layout
        return desc

    def _make_params(self, old: dict[str, Any]) -> None:
        super()._make_params(old)
        # Text parameters given at construction already shaped this description: holding their values
        # now spares the re-composition (a file read per level of nesting) that setting them would do.
        for name, text in self._texts.items():
            p = self.params.get(name)
            if p is not None and p.spec.kind == "text" and p.value != text:
                p.set(text)

    def inner_blocks(self) -> Iterator[tuple[str, Block]]:
        """Every leaf block inside, at any depth, with its name relative to this composite (``h``,
        ``inner/h``)."""
        if self.layout is None:
            return
        for local, b in self.layout.blocks.items():
            if isinstance(b, Composite):
                for sub, leaf in b.inner_blocks():
                    yield f"{local}/{sub}", leaf
            else:
                yield local, b

    def inner(self, name: str) -> Block:
        """An inner block by its relative name (``h``, ``inner/h``).

        Raises:
            CudapatchError: no such inner block.
        """
        head, _, rest = name.partition("/")
        b = self.layout.blocks.get(head) if self.layout is not None else None
        if b is not None and rest:
            b = b.inner(rest) if isinstance(b, Composite) else None
        if b is None:
            raise CudapatchError(f"composite has no inner block '{name}'", block=self.name)
        return b

    @property
    def is_child_graph(self) -> bool:
        """Whether the inner blocks run as one child-graph node: the ``ChildGraph`` parameter (its
        default from ``child_graph``, the class's or the composite file's)."""
        p = self.params.get(CHILD_GRAPH)
        return bool(p.value) if p is not None else False

    def tooltip(self) -> str:
        head = super().tooltip()
        n = sum(1 for _ in self.inner_blocks())
        return head.replace("\n", f" ({n} blocks)\n", 1) if "\n" in head else f"{head} ({n} blocks)"
