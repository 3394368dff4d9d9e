"""Mirroring a patch into the engine process: the host's edits as a stream of edit messages.

The host keeps the user's blocks in a ``Context`` of its own (pure Python: validation, links and
dirty tracking work exactly as in a normal engine, and block objects never leave the host). When
the structure changed, ``PatchMirror.diff`` compares a snapshot of that context with what the child
was last sent and returns the edits that bring the child there; Hot values skip the snapshot and go
with the frame message.

Edits carry a block's **description** (pure data: ports, parameters, kernel sources), not its
Python class: a block type defined in the user's script, a plugin's block or a TouchDesigner
operator all travel alike, and the child needs only what the graph compiler reads (the same data
the fault replay already sends, ``engine/replay.py``). A Numba kernel's function travels by
reference, so the module defining it must be importable in the child, as for the compiler process.

Regions travel as blocks (a ``MirrorRegion`` in the child, so ``Engine.place`` takes it) plus one
``Place`` edit per block whose region changed. A composite travels whole, as a ``CompositeRecord``
(its inner blocks' descriptions and values, links and exposures, file and lines) from which the child
composes a ``MirrorComposite``: the child's engine flattens it, or makes it a child-graph node, files
its outputs, slots and GPU time under the composite and puts its inner blocks' diagnostics on it,
exactly as the host's own engine would (``patch_view`` gives the host's patch with composites whole).

``ChildPatch`` applies edits to a real engine in the child, through its public API, with a
``MirrorBlock`` standing for each host block. Both sides are pure here apart from the engine that
``ChildPatch`` is handed, so the whole round trip is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..blocks.block import Block
from ..blocks.builder import BlockBuilder
from ..blocks.composite import Composite, CompositeBuilder, Exposure, InnerLink
from ..blocks.regions import Region, RegionDescription

__all__ = [
    "AddBlock",
    "RemoveBlock",
    "Redescribe",
    "SetValues",
    "Rename",
    "Connect",
    "Disconnect",
    "Bind",
    "Unbind",
    "Disable",
    "SetProfiling",
    "SetBypassed",
    "SetKept",
    "Place",
    "Edit",
    "PatchMirror",
    "ChildPatch",
    "MirrorBlock",
    "MirrorRegion",
    "MirrorComposite",
    "CompositeRecord",
    "InnerOp",
    "composite_record",
    "patch_view",
]


@dataclass(frozen=True)
class AddBlock:
    id: int
    name: str
    description: Any
    values: dict[str, Any]


@dataclass(frozen=True)
class RemoveBlock:
    id: int


@dataclass(frozen=True)
class Redescribe:
    """The block's description changed (new ports, or new kernel code: the child's engine picks
    the tier, Code when only code changed)."""

    id: int
    description: Any
    values: dict[str, Any]


@dataclass(frozen=True)
class SetValues:
    id: int
    values: dict[str, Any]


@dataclass(frozen=True)
class Rename:
    id: int
    name: str


@dataclass(frozen=True)
class Connect:
    src: int
    src_port: str
    dst: int
    dst_port: str


@dataclass(frozen=True)
class Disconnect:
    src: int
    src_port: str
    dst: int
    dst_port: str


@dataclass(frozen=True)
class Bind:
    id: int
    port: str
    input: Any  # protocol.InputHandle


@dataclass(frozen=True)
class Unbind:
    id: int
    port: str


@dataclass(frozen=True)
class Disable:
    id: int
    reason: str


@dataclass(frozen=True)
class SetProfiling:
    level: str


@dataclass(frozen=True)
class SetKept:
    """The ``(block id, port)`` the host keeps in buffers of their own (``Engine.keep``; ``output()``
    asks for it), all of them: the child's fusion leaves them out of fused groups."""

    keys: frozenset[tuple[int, str]]


@dataclass(frozen=True)
class Place:
    """Block ``id`` goes into region ``region`` (an ``If``/``While``/``For`` block; None: the top level),
    as ``Engine.place``."""

    id: int
    region: int | None


@dataclass(frozen=True)
class SetBypassed:
    """The host blocks whose ``enabled`` flag is off, all of them (the child turns the rest on)."""

    ids: frozenset[int]


Edit = (
    AddBlock
    | RemoveBlock
    | Redescribe
    | SetValues
    | Rename
    | Connect
    | Disconnect
    | Bind
    | Unbind
    | Disable
    | SetProfiling
    | SetBypassed
    | SetKept
    | Place
)


@dataclass(frozen=True)
class InnerOp:
    """An inner block of a composite: local name, the host's block id, its description (a
    ``CompositeRecord`` for a composite inside), its parameter values and its line in the file."""

    op: str
    id: int
    description: Any
    values: dict[str, Any]
    line: int | None = None


@dataclass(frozen=True)
class CompositeRecord:
    """A composite as data, for the child to compose again: what its ``CompositeLayout`` holds, with
    inner blocks as descriptions. Compared by value: a re-composed composite (a file edit, other inner
    values) sends a ``Redescribe``."""

    type_name: str
    ops: tuple[InnerOp, ...]
    links: tuple[InnerLink, ...]
    exposures: tuple[Exposure, ...]
    file: str | None
    child_graph: bool
    texts: tuple[tuple[str, str], ...] = ()  # its own text parameters (a file composite's Path), with values


def _values(b: Block) -> dict[str, Any]:
    return {k: p.value for k, p in b.params.items()}


def composite_record(comp: Composite) -> CompositeRecord:
    """The record of a composite (its layout must exist: composed)."""
    layout = comp.layout
    assert layout is not None
    ops = []
    for op, b in layout.blocks.items():
        d = composite_record(b) if isinstance(b, Composite) and b.layout is not None else b.description
        ops.append(InnerOp(op, b.id, d, _values(b), layout.lines.get(op)))
    texts = tuple((name, p.value) for name, p in comp.params.items() if p.spec.kind == "text")
    return CompositeRecord(
        comp.description.type_name,
        tuple(ops),
        tuple(layout.links),
        tuple(layout.exposures.values()),
        layout.file,
        layout.child_graph,
        texts,
    )


def _inner_ids(record: CompositeRecord) -> Iterator[int]:
    for o in record.ops:
        yield o.id
        if isinstance(o.description, CompositeRecord):
            yield from _inner_ids(o.description)


def patch_view(context: Any) -> Any:
    """The host's patch for the mirror (host side): ``context.snapshot()`` (its blocks frozen once per
    change), except that composites stay whole, each as one block whose description is its
    ``CompositeRecord``, with the links, bindings, placements and keeps made on them."""
    from ..engine.context import BlockSnapshot

    snap = context.snapshot()
    registry = context.registry
    composites = registry.composites
    if not composites:
        return snap
    frozen = {b.id: b for b in snap.blocks}
    blocks = []
    for b in registry:
        if b.id in composites and b.layout is not None:
            blocks.append(BlockSnapshot(b.id, b.name, composite_record(b), _values(b), snap.context_id))
        else:
            blocks.append(frozen[b.id])
    return replace(
        snap,
        blocks=tuple(blocks),
        links=tuple(context.connections),
        bindings=dict(context.bindings),
        probes=(),
        composites=(),
        parents=dict(context.parents),
        kept=frozenset(context.kept),
        bypassed=frozenset(context.bypassed),
    )


def _link_key(lk: Any) -> tuple[int, str, int, str]:
    return (lk.src, lk.src_port, lk.dst, lk.dst_port)


class PatchMirror:
    """What the child was sent, and the edits from there to a new snapshot (host side, pure).

    Args:
        export: Turns an ``ExternalBinding`` of the host into the ``InputHandle`` the child binds
            (device memory through CUDA IPC, host arrays by value).
    """

    def __init__(self, export: Callable[[Any], Any]) -> None:
        self._export = export
        self._blocks: dict[int, tuple[str, Any, dict[str, Any]]] = {}  # id -> (name, description, values)
        self._links: set[tuple[int, str, int, str]] = set()
        self._bindings: dict[tuple[int, str], tuple[int, int, Any, int]] = {}  # key -> (ptr, count, dtype, owner id)
        self._kept: frozenset[tuple[int, str]] = frozenset()
        self._parents: dict[int, int] = {}  # block id -> its region's id, as the child has them

    def diff(self, snap: Any) -> list[Edit]:
        """The edits that turn what the child has into ``snap`` (a ``PatchSnapshot``, from ``patch_view``), in an order
        the child can apply one by one: removals, blocks, values, placements, links, bindings. Records
        ``snap`` as sent."""
        edits: list[Edit] = []
        new_blocks = {b.id: b for b in snap.blocks}
        for bid in [b for b in self._blocks if b not in new_blocks]:
            edits.append(RemoveBlock(bid))  # its links and bindings go with it in the child
            del self._blocks[bid]
            self._links = {lk for lk in self._links if bid not in (lk[0], lk[2])}
            for key in [k for k in self._bindings if k[0] == bid]:
                del self._bindings[key]
            self._unplace(bid)
        for bid, b in new_blocks.items():
            values = dict(b.values)
            old = self._blocks.get(bid)
            if old is None:
                edits.append(AddBlock(bid, b.name, b.description, values))
            else:
                name, desc, old_values = old
                if name != b.name:
                    edits.append(Rename(bid, b.name))
                if desc is not b.description and desc != b.description:
                    edits.append(Redescribe(bid, b.description, values))
                else:
                    changed = {k: v for k, v in values.items() if old_values.get(k, _MISSING) != v}
                    if changed:
                        edits.append(SetValues(bid, changed))
            self._blocks[bid] = (b.name, b.description, values)
        parents = dict(getattr(snap, "parents", {}))
        old_parents = self._parents
        moved = sorted(bid for bid in old_parents.keys() | parents.keys() if old_parents.get(bid) != parents.get(bid))
        # Out first, then in: every step is then a subset of the final placements, so the child never
        # sees a region inside itself on the way (R1 out of R2, then R2 into R1).
        edits += [Place(bid, None) for bid in moved if bid in old_parents]
        edits += [Place(bid, parents[bid]) for bid in moved if bid in parents]
        self._parents = parents
        links = {_link_key(lk) for lk in snap.links}
        edits += [Disconnect(*lk) for lk in sorted(self._links - links)]
        edits += [Connect(*lk) for lk in sorted(links - self._links)]
        self._links = links
        for key in [k for k in self._bindings if k not in snap.bindings]:
            del self._bindings[key]
            if key[0] in new_blocks:
                edits.append(Unbind(*key))
        for key, binding in snap.bindings.items():
            edit = self.bind(key, binding)
            if edit is not None:
                edits.append(edit)
        kept = frozenset(getattr(snap, "kept", ()))
        if kept != self._kept:
            edits.append(SetKept(kept))
            self._kept = kept
        return edits

    def _unplace(self, bid: int) -> None:
        """``bid`` was removed: as the child's engine does, its own placement goes and the blocks it held
        (a region) move to the region around it."""
        parents = self._parents
        outer = parents.pop(bid, None)
        for child in [c for c, r in parents.items() if r == bid]:
            if outer is None:
                del parents[child]
            else:
                parents[child] = outer

    def bind(self, key: tuple[int, str], binding: Any) -> Bind | None:
        """The edit for a binding that differs from what the child has (None when it has it)."""
        token = (binding.ptr, binding.count, binding.dtype, id(binding.owner))
        if self._bindings.get(key) == token and binding.ptr:  # host arrays (ptr 0) are re-sent: new values
            return None
        self._bindings[key] = token
        return Bind(key[0], key[1], self._export(binding))

    def note_value(self, block_id: int, name: str, value: Any) -> None:
        """A Hot value went to the child with a frame: the next diff need not send it again."""
        entry = self._blocks.get(block_id)
        if entry is not None:
            entry[2][name] = value

    def forget(self) -> None:
        """The child is gone: the next diff sends the whole patch (to a new child)."""
        self._blocks.clear()
        self._links.clear()
        self._bindings.clear()
        self._kept = frozenset()
        self._parents = {}

    @property
    def block_ids(self) -> frozenset[int]:
        """The host ids of the blocks the child has: registered ones and those inside composites (a
        fault names an inner block; the next child disables it)."""
        ids = set(self._blocks)
        for _, desc, _ in self._blocks.values():
            if isinstance(desc, CompositeRecord):
                ids.update(_inner_ids(desc))
        return frozenset(ids)


_MISSING = object()


class MirrorBlock(Block):
    """A block of the child made from a host block's description (its Python class stays in the
    host). ``redescribe`` puts a new description in place through ``Block.refresh``, so the engine
    treats it as it would the original block's re-description (Code tier when only code changed)."""

    def __init__(self, name: str, description: Any) -> None:
        self._given = description
        self.type_name = description.type_name  # type: ignore[misc]  (per instance: one class for every type)
        super().__init__(name=name)

    def describe(self, b: BlockBuilder) -> None:  # never called: _describe hands back the given description
        raise NotImplementedError

    def _describe(self) -> Any:
        return self._given

    def redescribe(self, description: Any) -> None:
        self._given = description
        self.refresh()

    def set_values(self, values: dict[str, Any]) -> None:
        """Set parameter values as the host had them; text values are already in the description."""
        for name, value in values.items():
            p = self.params.get(name)
            if p is None:
                continue
            if p.spec.kind == "text":
                p.set(value)  # no re-description: the description came with the edit
            elif p.value != value:  # a default the host never set may be one ``set`` refuses (a While's Max 0)
                self.set(name, value)


class MirrorRegion(MirrorBlock, Region):
    """A region of the child made from a host region's description: a ``Region`` (``Engine.place``
    takes only those), of the kind its description says."""

    def __init__(self, name: str, description: RegionDescription) -> None:
        self.kind = description.kind  # type: ignore[misc]  (per instance, like type_name)
        super().__init__(name, description)


class MirrorComposite(Composite):
    """A composite of the child composed from a host composite's ``CompositeRecord``: the same inner
    blocks (as ``MirrorBlock``s), links and exposures, so the child's engine treats it as the host's
    engine would treat the original (flattened or a child-graph node, Hot edits of its exposed
    parameters, its GPU time, diagnostics naming the inner block, file and line)."""

    def __init__(self, name: str, record: CompositeRecord) -> None:
        self._record = record
        self.type_name = record.type_name  # type: ignore[misc]  (per instance, like MirrorBlock)
        super().__init__(name=name)

    def compose(self, c: CompositeBuilder) -> None:
        r = self._record
        c.type_name = r.type_name
        c.child_graph = r.child_graph
        for name, value in r.texts:
            c.text(name, default=value)
        for o in r.ops:
            b = mirror_block(o.op, o.description)
            b.set_values(o.values)
            c.add(o.op, b, line=o.line)
        for lk in r.links:
            c.link(f"{lk.src}.{lk.src_port}", f"{lk.dst}.{lk.dst_port}", line=lk.line)
        for e in r.exposures:
            c.expose(e.name, *(f"{op}.{n}" for op, n in e.targets), line=e.line)

    def composite_file(self) -> str | None:
        return self._record.file

    def redescribe(self, record: CompositeRecord) -> None:
        """Compose again from a new record (the host's composite was re-composed, or inner values changed)."""
        self._record = record
        self.refresh()

    set_values = MirrorBlock.set_values

    def host_blocks(self) -> Iterator[tuple[int, Block]]:
        """``(host block id, block here)`` of every block inside, at any depth (composites included)."""
        layout = self.layout
        if layout is None:
            return
        for o in self._record.ops:
            b = layout.blocks[o.op]
            yield o.id, b
            if isinstance(b, MirrorComposite):
                yield from b.host_blocks()


def mirror_block(name: str, description: Any) -> Any:
    """The child's block for a host block's description: a ``MirrorRegion`` for a region's, a
    ``MirrorComposite`` for a composite's record."""
    if isinstance(description, CompositeRecord):
        return MirrorComposite(name, description)
    if isinstance(description, RegionDescription):
        return MirrorRegion(name, description)
    return MirrorBlock(name, description)


class ChildPatch:
    """Applies edits to the child's engine (``add``/``remove``/``connect``/``bind``/...).

    Args:
        engine: The engine (anything with the ``Engine`` editing methods).
        import_input: Turns an ``InputHandle`` into what ``engine.bind`` takes.
    """

    def __init__(self, engine: Any, import_input: Callable[[Any], Any]) -> None:
        self.engine = engine
        self._import = import_input
        self.blocks: dict[int, Any] = {}  # host id -> block (registered)
        #: Host id -> a block inside a composite (``MirrorComposite.host_blocks``).
        self.inner: dict[int, Block] = {}
        self.to_host: dict[int, int] = {}  # child block id -> host id, inner blocks included
        self.kept: set[tuple[int, str]] = set()  # host (block id, port) kept in the child's engine

    def apply(self, edits: list[Edit]) -> None:
        """Apply ``edits`` in order. An edit the engine refuses raises (the host validated it, so
        that is a bug or a version mismatch: the host restarts the child with the error logged)."""
        e = self.engine
        for ed in edits:
            if isinstance(ed, AddBlock):
                b = mirror_block(ed.name, ed.description)
                b.set_values(ed.values)
                e.add(b)
                self.blocks[ed.id] = b
                self.to_host[b.id] = ed.id
                self._map_inner(b, True)
            elif isinstance(ed, RemoveBlock):
                b = self.blocks.pop(ed.id)
                del self.to_host[b.id]
                self._map_inner(b, False)
                e.remove(b)
            elif isinstance(ed, Redescribe):
                b = self.blocks[ed.id]
                self._map_inner(b, False)
                b.redescribe(ed.description)
                b.set_values(ed.values)
                self._map_inner(b, True)
            elif isinstance(ed, SetValues):
                self.blocks[ed.id].set_values(ed.values)
            elif isinstance(ed, Rename):
                self.blocks[ed.id].name = ed.name
            elif isinstance(ed, Connect):
                e.connect(self.blocks[ed.src], ed.src_port, self.blocks[ed.dst], ed.dst_port)
            elif isinstance(ed, Disconnect):
                e.disconnect(self.blocks[ed.src], ed.src_port, self.blocks[ed.dst], ed.dst_port)
            elif isinstance(ed, Bind):
                b = self.blocks[ed.id]
                e.bind(b, ed.port, self._import(ed.input), dtype=ed.input.dtype)
            elif isinstance(ed, Unbind):
                e.context.unbind_input(self.blocks[ed.id], ed.port)
            elif isinstance(ed, Disable):
                b = self.blocks.get(ed.id)
                if b is None:
                    b = self.inner.get(ed.id)  # a fault names an inner block of a composite
                if b is not None:
                    e.disable(b, ed.reason)
            elif isinstance(ed, SetProfiling):
                e.set_profiling(ed.level)
            elif isinstance(ed, SetKept):
                every = self.all_blocks()  # a composite's inner outputs are kept by their own ids
                for key in sorted(self.kept - ed.keys):
                    b = every.get(key[0])
                    if b is not None:  # a removed block's keeps went with it
                        e.keep(b, key[1], False)
                for key in sorted(ed.keys - self.kept):
                    b = every.get(key[0])
                    if b is not None:  # an inner block of a composite re-composed since: gone with it
                        e.keep(b, key[1])
                self.kept = set(ed.keys)
            elif isinstance(ed, Place):
                e.place(self.blocks[ed.id], None if ed.region is None else self.blocks[ed.region])
            elif isinstance(ed, SetBypassed):  # the Bypass tier of the child's engine applies them
                for bid, b in self.blocks.items():
                    b.enabled = bid not in ed.ids
            else:  # pragma: no cover - a message of another version
                raise TypeError(f"unknown edit {ed!r}")

    def _map_inner(self, b: Any, on: bool) -> None:
        if not isinstance(b, MirrorComposite):
            return
        for hid, blk in b.host_blocks():
            if on:
                self.inner[hid] = blk
                self.to_host[blk.id] = hid
            else:
                self.inner.pop(hid, None)
                self.to_host.pop(blk.id, None)

    def all_blocks(self) -> dict[int, Block]:
        """Host id -> block here, registered and inside composites (what the host is told about)."""
        return {**self.inner, **self.blocks} if self.inner else self.blocks

    def hot(self, values: tuple[tuple[int, str, Any], ...]) -> None:
        """Hot values of a frame message: ``block.set`` on each (the engine's Hot tier takes them)."""
        blocks = self.blocks
        for bid, name, value in values:
            b = blocks.get(bid)
            if b is not None:
                b.set(name, value)
