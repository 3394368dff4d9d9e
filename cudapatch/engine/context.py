"""Context: the engine's model of the patch (blocks, links, external bindings) and its dirty state.

All of this is pure Python: it is what the graph compiler reads. Edits validate immediately
(unknown port, incompatible pins, a cycle not passing through a FrameDelay, another engine's block →
``LinkError``) and only mark dirty;
the engine applies them on its next ``update()``.

A registered block sees its Context only as a ``BlockHost`` (``cudapatch.blocks.host``): the
Context attaches and detaches blocks and hears their edits through that protocol, and never writes
a block's fields.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from ..blocks.block import Block, check_block
from ..blocks.description import BlockDescription
from ..blocks.host import ParamListener
from ..blocks.parameter import BlockParameter
from ..blocks.regions import Region, accepts_condition
from ..errors import BindingError, CudapatchError, LinkError
from ..kernels.source import KernelSource
from ..kernels.types import DType
from .chunked import Chunked, ChunkedOrder
from .composites import CompositeInfo, flatten_snapshot
from .connections import ConnectionGraph, Link
from .dirty import DirtyTracker
from .link_order import SameFrameOrder, cycle_message
from .registry import BlockRegistry

__all__ = ["Context", "ExternalBinding", "BlockSnapshot", "PatchSnapshot", "check_link_ports"]

_context_ids = itertools.count(1)


@dataclass(frozen=True)
class ExternalBinding:
    """A user's device memory bound to an input port.

    Attributes:
        ptr: Device address.
        count: Element count.
        dtype: Element type.
        owner: The object that owns the memory; kept alive while bound.
        shape: Its ``Shape`` when the array had 2 or more axes (None: flat, ``(count,)``).
    """

    ptr: int
    count: int
    dtype: DType
    owner: Any = field(default=None, compare=False, repr=False)
    shape: Any = None


@dataclass(frozen=True)
class BlockSnapshot:
    """What the compiler needs of one block."""

    id: int
    name: str
    description: Any  # BlockDescription
    values: dict[str, Any] = field(compare=False)
    context_id: int


@dataclass(frozen=True)
class PatchSnapshot:
    """The whole patch, frozen for the compiler. ``kept``: the ``(block_id, port)`` the host asked to
    keep in a buffer of their own (``Context.keep``)."""

    context_id: int
    #: Sequences equal to tuples of the same items (``chunked.Chunked`` where the patch has no composites).
    blocks: Sequence[BlockSnapshot]
    links: Sequence[Link]
    bindings: dict[tuple[int, str], ExternalBinding] = field(compare=False)
    #: Probed outputs: ``((block_id, port), shape or None)``, ``shape`` an ``(height, width)`` given by
    #: the user (see ``engine/probes.py``).
    probes: tuple[tuple[tuple[int, str], tuple[int, int] | None], ...] = ()
    #: The composites flattened into ``blocks`` (``engine/composites.py``); empty without any.
    composites: tuple[CompositeInfo, ...] = ()
    #: Block id -> the region block it is placed in (blocks at the top level are absent).
    parents: dict[int, int] = field(default_factory=dict, compare=False)
    kept: frozenset[tuple[int, str]] = frozenset()
    #: Blocks bypassed (``enabled`` off): their values keep buffers of their own (buffer reuse), so
    #: readers redirected past them, or reading their last output, read no other block's data.
    bypassed: frozenset[int] = frozenset()

    @cached_property
    def names(self) -> dict[int, str]:
        """Block id -> name, made once per snapshot (a build asks for it at several steps)."""
        return {b.id: b.name for b in self.blocks}


def check_link_ports(
    src: BlockDescription, src_name: str, src_port: str, dst: BlockDescription, dst_name: str, dst_port: str
) -> None:
    """That ``src_name.src_port`` is an output, ``dst_name.dst_port`` an input, and their element types
    fit: what ``Context.connect`` checks before a link, and a patch edit before it changes anything.

    Raises:
        LinkError: unknown port, wrong direction, incompatible element types.
    """
    out = src.output(src_port)
    if out is None:
        if src.input(src_port) is not None:
            raise LinkError("is an input; links start at an output", block=src_name, port=src_port)
        known = ", ".join(p.name for p in src.outputs) or "none"
        raise LinkError(f"unknown output port (outputs: {known})", block=src_name, port=src_port)
    inp = dst.input(dst_port)
    if inp is None:
        if dst.output(dst_port) is not None:
            raise LinkError("is an output; links end at an input", block=dst_name, port=dst_port)
        known = ", ".join(p.name for p in dst.inputs) or "none"
        raise LinkError(f"unknown input port (inputs: {known})", block=dst_name, port=dst_port)
    if out.dtype != inp.dtype and not accepts_condition(dst, dst_port, out.dtype):
        raise LinkError(
            f"cannot link {src_name}.{src_port} ({out.dtype.c_name}) to "
            f"{dst_name}.{dst_port} ({inp.dtype.c_name}): element types differ",
            block=dst_name,
            port=dst_port,
        )


class Context:
    """Registry, connections, external bindings and dirty tracking of one engine; the ``BlockHost``
    of its blocks.

    Args:
        code_listener: Called with ``(block_id, kernel)`` when a kernel's code changes, at the edit.
            It returns whether it took the change (the engine hands it to the compiler then, so the
            next frame has nothing to do); else, or without one, the change is marked dirty for the
            next update.
    """

    def __init__(self, *, code_listener: Callable[[tuple[int, int]], bool] | None = None) -> None:
        self.id = next(_context_ids)
        self.registry = BlockRegistry()
        self.connections = ConnectionGraph()
        # Ranks every same-frame link climbs: a cycle check without a walk of the patch (``connect``).
        self._order = SameFrameOrder(self.connections, self._same_frame)
        self._feedback_of: dict[int, frozenset[str]] = {}  # blocks with feedback inputs, as last described
        self.dirty = DirtyTracker()
        self.bindings: dict[tuple[int, str], ExternalBinding] = {}
        #: Ids of the registered blocks whose ``enabled`` flag is off (the Bypass tier reads it).
        self.bypassed: set[int] = set()
        #: Block id -> the region it is placed in (``place``); top-level blocks are absent.
        self.parents: dict[int, int] = {}
        self.kept: set[tuple[int, str]] = set()  # ports the host reads: never in a shared buffer
        #: Probed outputs (``engine/probes.py``): ``(block_id, port)`` -> the ``(height, width)`` given, or None.
        self.probes: dict[tuple[int, str], tuple[int, int] | None] = {}
        # Each block's last snapshot, dropped when its values or description change: a build freezes
        # only what changed (freezing all of a 10,000-block patch took 18 ms of the frame thread).
        self._frozen: dict[int, BlockSnapshot] = {}
        # Blocks whose frozen snapshot was dropped since the last snapshot (or never made): the next
        # snapshot freezes only those, so the frame that starts a build does not visit every block.
        self._thawed: set[int] = set()
        # The registered blocks' ids in the registry's order, with each chunk's last frozen snapshots:
        # a snapshot copies only the chunks of blocks frozen again since (``chunked.py``).
        self._block_order = ChunkedOrder()
        self._code_listener = code_listener

    @property
    def code_listener(self) -> Callable[[tuple[int, int]], bool] | None:
        """The listener given at construction (read-only: who hears code edits is fixed then)."""
        return self._code_listener

    # -- blocks -------------------------------------------------------------------------------
    def register_block(self, block: Block) -> Block:
        """Add a block to the patch (Cold on the next update).

        Raises:
            CudapatchError: registered with another engine, or its name is taken here.
        """
        check_block(block)
        host = block.context
        if host is self:
            return block
        if host is not None:
            raise CudapatchError("block is registered with another engine; close() it there first", block=block.name)
        self.registry.add(block)
        self._note_feedback(block)
        self._block_order.append(block.id)
        self._thawed.add(block.id)
        block.attach(self)
        if not block.enabled:
            self.bypassed.add(block.id)
        self.dirty.mark_structure()
        return block

    def unregister_block(self, block: Block) -> None:
        """Remove a block, its links and bindings (Cold on the next update). Unknown blocks are ignored."""
        if not self.registry.remove(block):
            return
        self._block_order.discard(block.id)
        self.connections.remove_block(block.id)
        self._order.forget(block.id)
        self._feedback_of.pop(block.id, None)
        self._thaw(block.id)
        for key in [k for k in self.bindings if k[0] == block.id]:
            del self.bindings[key]
        self.kept -= {k for k in self.kept if k[0] == block.id}
        self.bypassed.discard(block.id)
        parents = self.parents
        outer = parents.pop(block.id, None)
        for child in [c for c, r in parents.items() if r == block.id]:  # a removed region's blocks move out
            if outer is None:
                del parents[child]
            else:
                parents[child] = outer
        gone = {block.id} | {b.id for _, b in block.inner_blocks()} if hasattr(block, "inner_blocks") else {block.id}
        for key in [k for k in self.probes if k[0] in gone]:  # a composite's inner probes go with it
            del self.probes[key]
        block.detach(self)
        self.dirty.mark_structure()

    def param_listener(self, block: Block) -> ParamListener:
        """The listener ``block`` subscribes to its scalar parameters (``BlockHost``): a change marks
        the parameter dirty (Hot), or the structure when sizes depend on it (Cold)."""
        dirty, block_id, frozen, thawed = self.dirty, block.id, self._frozen, self._thawed  # bound once: every Hot edit

        def listener(param: BlockParameter) -> None:
            frozen.pop(block_id, None)
            thawed.add(block_id)
            if param.spec.structural:
                dirty.mark_structure()
            else:
                dirty.mark_param(block_id, param.spec.name, param)

        return listener

    def _thaw(self, block_id: int) -> None:
        self._frozen.pop(block_id, None)
        self._thawed.add(block_id)

    def on_snapshot_stale(self, block: Block) -> None:
        """``block`` was renamed or given another description: the next snapshot freezes it again."""
        self._thaw(block.id)
        self.registry.renamed(block)
        self._note_feedback(block)

    def on_parameter_changed(self, block: Block, name: str) -> None:
        """Mark a parameter dirty: Hot on the next update, or Cold if sizes depend on it."""
        p = block.params.get(name)
        if p is None:
            return
        self._thaw(block.id)
        if p.spec.structural:
            self.dirty.mark_structure()
        else:
            self.dirty.mark_param(block.id, name, p)

    def on_description_changed(self, block: Block, old: BlockDescription) -> None:
        """A block was re-described (``Block.refresh``). If only kernel code changed and every kernel
        keeps its descriptor, that is a Code-tier change; otherwise drop links to ports that no
        longer exist and rebuild."""
        self._thaw(block.id)
        new = block.description
        if len(new.kernels) == len(old.kernels):
            same_code = replace(
                new, kernels=tuple(replace(k, source=o.source) for k, o in zip(new.kernels, old.kernels, strict=False))
            )
            if same_code == old:
                for ki, (k, o) in enumerate(zip(new.kernels, old.kernels, strict=False)):
                    if k.source != o.source:
                        self._code_changed((block.id, ki))
                return
        self.on_structure_changed(block)

    def on_enabled_changed(self, block: Block) -> None:
        """``block.enabled`` changed: the Bypass tier turns its nodes off or on at the next update."""
        if block.enabled:
            self.bypassed.discard(block.id)
        else:
            self.bypassed.add(block.id)
        self.dirty.mark_bypass()

    def on_code_changed(self, block: Block, kernel: int, new_source: KernelSource | None = None) -> None:
        """Kernel ``kernel`` of ``block`` has new code: recompile it in the background and swap it into
        the running graph (Code tier). With ``new_source``, the kernel is replaced by that source,
        which must have the same signature (parameter types and directions).

        Raises:
            CudapatchError: unknown kernel, or the new source's signature differs (re-describe the block
                instead); KernelLoadError: the new source cannot be read.
        """
        self._thaw(block.id)
        kernels = block.description.kernels
        if not 0 <= kernel < len(kernels):
            raise CudapatchError(f"block has {len(kernels)} kernels; there is no kernel {kernel}", block=block.name)
        if new_source is not None and not block.replace_kernel_source(kernel, new_source):
            self.dirty.mark_structure()  # e.g. another entry-point name: the running nodes cannot take it in place
            return
        self._code_changed((block.id, kernel))

    def _code_changed(self, key: tuple[int, int]) -> None:
        listener = self._code_listener
        if listener is None or not listener(key):
            self.dirty.mark_code(key)

    def on_structure_changed(self, block: Block) -> None:
        """A block's description changed: drop links to ports that no longer fit, rebuild."""
        self._thaw(block.id)
        d = block.description
        for lk in self.connections.links_of(block.id):
            if lk.src == block.id and d.output(lk.src_port) is None:
                self.connections.remove(lk)
            elif lk.dst == block.id and d.input(lk.dst_port) is None:
                self.connections.remove(lk)
        self.dirty.mark_structure()

    def _owned(self, block: Block, role: str) -> Block:
        check_block(block)
        host = block.context
        if host is None:
            raise LinkError(f"{role} block is not registered with an engine", block=block.name)
        if host is not self:
            raise LinkError(f"{role} block belongs to another engine and cannot be linked here", block=block.name)
        return block

    # -- links --------------------------------------------------------------------------------
    def connect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> Link:
        """Link ``src.src_port`` (an output) to ``dst.dst_port`` (an input). Replaces an existing link into that input.

        Raises:
            LinkError: unknown port, wrong direction, incompatible element types, a cycle, or another engine's block.
        """
        self._owned(src, "source")
        self._owned(dst, "destination")
        check_link_ports(src.description, src.name, src_port, dst.description, dst.name, dst_port)
        if dst_port not in dst.description.feedback_inputs and not self._order.admit(src.id, dst.id):
            raise LinkError(
                cycle_message(src.name, src_port, dst.name, dst_port, self._loop_names(dst.id, src.id)),
                block=dst.name,
                port=dst_port,
            )
        link = Link(src.id, src_port, dst.id, dst_port)
        old = self.connections.add(link)
        if old != link:
            self.dirty.mark_structure()
        return link

    def _loop_names(self, start: int, target: int) -> list[str] | None:
        """The names of the blocks on a same-frame path ``start`` ... ``target``: only looked for once
        a link is refused, so a link that is admitted pays nothing for the message."""
        path = self.connections.path(start, target, follow=self._same_frame)
        if path is None:
            return None
        return [getattr(self.registry.get(b), "name", f"#{b}") for b in path]

    def _same_frame(self, link: Link) -> bool:
        """Whether ``link`` is followed within a frame (not into an input read a frame late, a
        FrameDelay's ``In``)."""
        return link.dst_port not in self._feedback_of.get(link.dst, ())

    def _note_feedback(self, block: Block) -> None:
        """Keep ``block``'s feedback inputs as described now; a change re-ranks the links (``_order``)."""
        now = block.description.feedback_inputs
        if now != self._feedback_of.get(block.id, frozenset()):
            if now:
                self._feedback_of[block.id] = now
            else:
                self._feedback_of.pop(block.id, None)
            if any(lk.dst == block.id for lk in self.connections.links_of(block.id)):  # (a block just added has none)
                self._order.invalidate()

    def disconnect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> bool:
        """Remove a link; returns whether it existed."""
        removed = self.connections.remove(Link(src.id, src_port, dst.id, dst_port))
        if removed:
            self.dirty.mark_structure()
        return removed

    # -- regions ------------------------------------------------------------------------------
    def place(self, block: Block, region: Block | None) -> None:
        """Put ``block`` inside ``region`` (an ``If``, ``While`` or ``For`` of this engine), or back at
        the top level with None (Cold on the next update). Links stay as they are.

        Raises:
            CudapatchError: ``region`` is not a region of this engine, or it is ``block`` itself or
                inside it (a region cannot contain itself).
        """
        self._owned(block, "placed")
        if region is None:
            if self.parents.pop(block.id, None) is not None:
                self.dirty.mark_structure()
            return
        self._owned(region, "region")
        if not isinstance(region, Region):
            raise CudapatchError(f"'{region.name}' is not a region (If, While, For)", block=block.name)
        r: int | None = region.id
        while r is not None:
            if r == block.id:
                raise CudapatchError(f"region '{region.name}' cannot be placed inside itself", block=block.name)
            r = self.parents.get(r)
        if self.parents.get(block.id) != region.id:
            self.parents[block.id] = region.id
            self.dirty.mark_structure()

    # -- external bindings ----------------------------------------------------------------------
    def bind_input(self, block: Block, port: str, binding: ExternalBinding) -> None:
        """Bind external device memory to an input port. Same size and type as before: Warm; otherwise Cold.

        Raises:
            BindingError: unknown input port or element type mismatch.
        """
        self._owned(block, "bound")
        inp = block.description.input(port)
        if inp is None:
            known = ", ".join(p.name for p in block.inputs) or "none"
            raise BindingError(f"unknown input port (inputs: {known})", block=block.name, port=port)
        if binding.dtype != inp.dtype:
            raise BindingError(
                f"bound memory holds {binding.dtype.c_name} but the port takes {inp.dtype.c_name}",
                block=block.name,
                port=port,
            )
        key = (block.id, port)
        old = self.bindings.get(key)
        self.bindings[key] = binding
        if old is not None and old.count == binding.count and old.shape == binding.shape:
            if old.ptr != binding.ptr:
                self.dirty.mark_binding(block.id, port, binding)
        else:
            self.dirty.mark_structure()

    def unbind_input(self, block: Block, port: str) -> bool:
        """Remove an external binding; returns whether there was one."""
        if self.bindings.pop((block.id, port), None) is None:
            return False
        self.dirty.mark_structure()
        return True

    # -- buffer reuse -----------------------------------------------------------------------------
    def keep(self, block: Block, port: str, keep: bool = True, *, rebuild: bool = True) -> bool:
        """Keep port ``port`` of ``block`` in a buffer of its own (or, ``keep=False``, let it share
        again): its value is never in a buffer other values reuse, so it can be read after a frame.
        ``rebuild=False`` records it for the next build without asking for one.

        Returns:
            Whether anything changed.

        Raises:
            CudapatchError: the block has no such port.
        """
        check_block(block)
        if block.context is not None and block.context is not self:
            raise CudapatchError("block belongs to another engine", block=block.name)
        d = block.description  # an inner block of a composite has no context of its own: kept by its id
        if d.output(port) is None and d.input(port) is None:
            raise CudapatchError("no such port", block=block.name, port=port)
        key = (block.id, port)
        if (key in self.kept) == keep:
            return False
        if keep:
            self.kept.add(key)
        else:
            self.kept.discard(key)
        if rebuild:
            self.dirty.mark_structure()
        return True

    # -- probes -------------------------------------------------------------------------------
    def add_probe(self, block: Block, port: str, shape: tuple[int, int] | None = None) -> tuple[int, str]:
        """Probe the wire that leaves output ``port`` (an input: the output linked into it). A new probe
        is a structure edit (Cold on the next update, built on the build thread). ``shape``
        ``(height, width)`` makes it an image; without one, a shape given before stays.

        Returns:
            The probed ``(block_id, output port)``.

        An inner block of a registered composite can be probed too (an output it makes: its wire runs in
        the flattened graph); the probe goes when the composite does.

        Raises:
            LinkError: unknown port, an input that no link feeds, or another engine's block.
        """
        if block.context is not None or self.registry.owner(block.id) is None:  # not an inner block here
            self._owned(block, "probed")
        key = (block.id, port)
        if block.description.output(port) is None:
            if block.description.input(port) is None:
                known = ", ".join(p.name for p in (*block.outputs, *block.inputs)) or "none"
                raise LinkError(f"unknown port (ports: {known})", block=block.name, port=port)
            link = self.connections.link_into(*key)
            if link is None:
                raise LinkError("only wires are probed: no link feeds this input", block=block.name, port=port)
            key = (link.src, link.src_port)
        if shape is None and key in self.probes:
            shape = self.probes[key]  # probed again without a shape (a wire selected): the given one stays
        if key not in self.probes or self.probes[key] != shape:
            self.probes[key] = shape
            self.dirty.mark_structure()
        return key

    def remove_probe(self, key: tuple[int, str]) -> bool:
        """Stop probing ``(block_id, output port)`` (Cold on the next update); returns whether it was probed."""
        if self.probes.pop(key, False) is False:
            return False
        self.dirty.mark_structure()
        return True

    def mark_structure_dirty(self) -> None:
        """Force a Cold rebuild on the next update."""
        self.dirty.mark_structure()

    # -- for the compiler -----------------------------------------------------------------------
    def snapshot(self) -> PatchSnapshot:
        """Freeze the patch for the compiler. A block whose values, name and description did not change
        since the last snapshot keeps its frozen ``BlockSnapshot`` (its ``values`` are never written),
        and without composites only the blocks thawed since (``_thawed_snapshot``) are looked at: a
        10,000-block patch was 6.6 ms of the frame that starts a build (CPU machine). Composites are
        flattened into their inner blocks, afresh each time (``engine/composites.py``)."""
        frozen, cid, composites = self._frozen, self.id, self.registry.composites
        thawed = None if composites else self._thawed_snapshot()
        if thawed is not None:
            return self._patch_snapshot(thawed)
        self._thawed.clear()  # every block is looked at below
        blocks: list[Any] = []
        for b in self.registry:
            if b.id in composites:
                blocks.append(b)
                continue
            s = frozen.get(b.id)
            if s is None or s.description is not b.description or s.name != b.name:
                s = frozen[b.id] = self._freeze(b)
                self._block_order.touch(b.id)
            blocks.append(s)
        probes = tuple(self.probes.items())
        parents = dict(self.parents)
        if composites:
            snap = flatten_snapshot(
                cid, blocks, tuple(self.connections), self.bindings, probes, PatchSnapshot, BlockSnapshot
            )
            if parents:
                snap = replace(snap, parents=_place_members(parents, snap.composites))
            snap = replace(snap, kept=_kept_inside(self.kept, snap.composites)) if self.kept else snap
            return replace(snap, bypassed=frozenset(self.bypassed)) if self.bypassed else snap
        return self._patch_snapshot(blocks)

    def _thawed_snapshot(self) -> Chunked | None:
        """Every block's snapshot, in the registry's order, freezing again only the blocks thawed since
        the last snapshot (a value, name or description changed, or the block is new) and copying only
        the chunks that hold them; None when one is missing anyway (the whole patch is then looked at)."""
        frozen, thawed, registry, order = self._frozen, self._thawed, self.registry, self._block_order
        for bid in list(thawed):
            thawed.discard(bid)  # before freezing: a change made meanwhile thaws it again
            b = registry.get(bid)
            if b is not None:
                frozen[bid] = self._freeze(b)
                order.touch(bid)
        try:
            return order.freeze(frozen.__getitem__)
        except KeyError:
            return None

    def _freeze(self, b: Block) -> BlockSnapshot:
        return BlockSnapshot(b.id, b.name, b.description, {k: p.value for k, p in b.params.items()}, self.id)

    def _patch_snapshot(self, blocks: Sequence[Any]) -> PatchSnapshot:
        return PatchSnapshot(
            self.id,
            blocks if isinstance(blocks, Chunked) else tuple(blocks),
            self.connections.links(),
            dict(self.bindings),
            tuple(self.probes.items()),
            parents=dict(self.parents),
            kept=frozenset(self.kept),
            bypassed=frozenset(self.bypassed),
        )


def _place_members(parents: dict[int, int], composites: tuple[CompositeInfo, ...]) -> dict[int, int]:
    """Placements after flattening: a composite placed in a region puts its leaf blocks there (the
    flattened patch has no composite block to place)."""
    out = dict(parents)
    for c in composites:
        region = parents.get(c.id)
        if region is not None:
            for leaf in c.members:
                out.setdefault(leaf, region)
    return out


def _kept_inside(kept: set[tuple[int, str]], composites: tuple[Any, ...]) -> frozenset[tuple[int, str]]:
    """Kept ports with a composite's exposed ports replaced by the inner ports they stand for."""
    exposed = {(c.id, port): keys for c in composites for port, keys in (*c.outputs.items(), *c.inputs.items())}
    out: set[tuple[int, str]] = set()
    for key in kept:
        out.update(exposed.get(key, (key,)))
    return frozenset(out)
