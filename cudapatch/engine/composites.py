"""Flattening composites: the patch the compiler sees has every composite replaced by its inner blocks.

``flatten_snapshot`` runs when the Context freezes a patch that holds composites
(``blocks/composite.py``). Each composite becomes its leaf blocks under qualified names
(``blur1/h``, ``outer/blur1/h`` for a composite inside a composite) with the values its exposed
parameters give them; links into a composite's input go to every inner input it feeds, links out
of its output start at the inner output; an external binding of its input binds the inner inputs.

What the plan needs to answer for the composite itself (its outputs for ``Engine.output``, the slots
a Hot edit of an exposed parameter patches, the binding slots of a Warm rebind) is recorded per
composite in ``CompositeInfo`` and filed under the composite's keys by the compiler's composites
phase (``compiler/composites.py``), which also puts the inner blocks' diagnostics on the composite.

Pure: no driver call, tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..blocks.block import Block
from ..blocks.composite import Composite
from .connections import Link

__all__ = ["CompositeInfo", "Member", "flatten_snapshot"]

Key = tuple[int, str]


@dataclass(frozen=True)
class Member:
    """A leaf block inside a composite: its qualified name, and the file and line that define it
    (the innermost composite file holding it)."""

    name: str
    file: str | None
    line: int | None


@dataclass(frozen=True)
class CompositeInfo:
    """One composite of a flattened snapshot (nested composites have their own).

    Attributes:
        id: The composite block's id.
        name: Its qualified name.
        file: Its composite file, if any.
        child_graph: Whether its inner blocks run as one child-graph node.
        top: Id of the registered composite it sits in (its own id at the top level).
        members: Leaf block id → ``Member``, at any depth.
        inputs / outputs / params: Outer name → the leaf ``(block id, port or parameter)`` keys.
        probed: Its exposed outputs probed on the composite (``Engine.probe(composite, port)``).
    """

    id: int
    name: str
    file: str | None
    child_graph: bool
    top: int
    members: dict[int, Member] = field(compare=False)
    inputs: dict[str, tuple[Key, ...]] = field(compare=False)
    outputs: dict[str, tuple[Key, ...]] = field(compare=False)
    params: dict[str, tuple[Key, ...]] = field(compare=False)
    probed: tuple[str, ...] = ()


def flatten_snapshot(
    context_id: int,
    blocks: Iterable[Any],
    links: Iterable[Link],
    bindings: Mapping[Key, Any],
    probes: tuple[tuple[Key, Any], ...],
    snapshot_type: Any,
    block_type: Any,
) -> Any:
    """The patch with every composite replaced by its leaf blocks (see the module docstring).

    Args:
        context_id: The Context's id (each leaf block snapshot carries it).
        blocks: The registered blocks in registration order, each as a ``BlockSnapshot`` already made
            or as the block (composites always).
        links: The registered links.
        bindings: External bindings by ``(block id, port)``.
        probes: Probed outputs ``((block id, port), shape)``: a composite's go to its inner output.
        snapshot_type / block_type: ``PatchSnapshot`` and ``BlockSnapshot`` (passed in: the context
            module imports this one).

    Returns:
        A ``PatchSnapshot`` whose ``composites`` describe each composite.
    """
    flat = _Flattener(context_id, block_type)
    exposed: dict[int, dict[str, tuple[Key, ...]]] = {}
    for b in blocks:
        if isinstance(b, block_type):  # frozen already (the Context keeps unchanged blocks' snapshots)
            flat.blocks.append(b)
        elif isinstance(b, Composite) and b.layout is not None:
            exposed[b.id] = flat.expand(b, b.name, {}, top=b.id)
        else:
            flat.leaf(b, b.name, {})
    out_links: list[Link] = []
    for lk in links:
        srcs = exposed[lk.src][lk.src_port] if lk.src in exposed else ((lk.src, lk.src_port),)
        dsts = exposed[lk.dst][lk.dst_port] if lk.dst in exposed else ((lk.dst, lk.dst_port),)
        for s in srcs[:1]:  # an output stands for exactly one inner output
            out_links.extend(Link(s[0], s[1], d[0], d[1]) for d in dsts)
    out_bindings: dict[Key, Any] = {}
    for (bid, port), binding in bindings.items():
        for key in exposed[bid].get(port, ()) if bid in exposed else ((bid, port),):
            out_bindings[key] = binding
    out_probes: dict[Key, Any] = {}
    probed: dict[int, list[str]] = {}
    for (bid, port), shape in probes:
        if bid in exposed:
            for key in exposed[bid].get(port, ())[:1]:
                out_probes.setdefault(key, shape)
                probed.setdefault(bid, []).append(port)
        else:
            out_probes[(bid, port)] = shape
    infos = tuple(replace(c, probed=tuple(probed[c.id])) if c.id in probed else c for c in flat.infos)
    return snapshot_type(
        context_id,
        tuple(flat.blocks),
        tuple(flat.links) + tuple(out_links),
        out_bindings,
        tuple(out_probes.items()),
        composites=infos,
    )


class _Flattener:
    def __init__(self, context_id: int, block_type: Any) -> None:
        self.context_id = context_id
        self.block_type = block_type
        self.blocks: list[Any] = []
        self.links: list[Link] = []
        self.infos: list[CompositeInfo] = []
        self._members: dict[int, Member] = {}

    def leaf(self, b: Block, name: str, overrides: Mapping[str, Any]) -> None:
        values = {k: p.value for k, p in b.params.items()}
        values.update(overrides)
        self.blocks.append(self.block_type(b.id, name, b.description, values, self.context_id))

    def expand(
        self, comp: Composite, name: str, overrides: Mapping[str, Any], *, top: int
    ) -> dict[str, tuple[Key, ...]]:
        """Add ``comp``'s leaf blocks and inner links; returns its exposures as leaf keys."""
        layout = comp.layout
        assert layout is not None
        values = {k: p.value for k, p in comp.params.items()}
        values.update(overrides)
        per_op: dict[str, dict[str, Any]] = {}
        for e in layout.exposures.values():
            if e.kind == "param":
                for op, pname in e.targets:
                    per_op.setdefault(op, {})[pname] = values[e.name]
        first = len(self.blocks)
        inner_exposed: dict[str, dict[str, tuple[Key, ...]]] = {}
        for op, inner in layout.blocks.items():
            qual = f"{name}/{op}"
            if isinstance(inner, Composite) and inner.layout is not None:
                inner_exposed[op] = self.expand(inner, qual, per_op.get(op, {}), top=top)
            else:
                self.leaf(inner, qual, per_op.get(op, {}))
                self._members[inner.id] = Member(qual, layout.file, layout.lines.get(op))

        def leaf_keys(op: str, port: str) -> tuple[Key, ...]:
            sub = inner_exposed.get(op)
            return sub.get(port, ()) if sub is not None else ((layout.blocks[op].id, port),)

        for lk in layout.links:
            for s in leaf_keys(lk.src, lk.src_port)[:1]:
                self.links.extend(Link(s[0], s[1], d[0], d[1]) for d in leaf_keys(lk.dst, lk.dst_port))
        exposed = {e.name: tuple(k for op, n in e.targets for k in leaf_keys(op, n)) for e in layout.exposures.values()}
        members = {b.id: self._members[b.id] for b in self.blocks[first:]}
        kinds = {e.name: e.kind for e in layout.exposures.values()}
        self.infos.append(
            CompositeInfo(
                comp.id,
                name,
                layout.file,
                comp.is_child_graph,
                top,
                members,
                {n: k for n, k in exposed.items() if kinds[n] == "input"},
                {n: k for n, k in exposed.items() if kinds[n] == "output"},
                {n: k for n, k in exposed.items() if kinds[n] == "param"},
            )
        )
        return exposed
