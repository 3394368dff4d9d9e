"""``HostAdapter``: host operators ⇄ passive blocks, and the one ``EngineOperator`` a host cooks.

A host (TouchDesigner callbacks, the standalone preview driven by a patch file, an app) calls the
adapter when its user edits the network (a composite, ``core.Composite`` with a ``Path``, is an
operator like any other: created, deleted, linked and set the same way); the adapter turns each
call into block and engine edits that only mark the engine dirty. ``EngineOperator.cook()`` runs
``Engine.update()`` once per frame, which applies everything with the cheapest tier. Errors are
precise (operator, port, parameter) and leave the previous state in place.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from ..blocks.block import Block
from ..blocks.composite import Composite
from ..engine.diagnostics import Diagnostic
from ..errors import CudapatchError, LinkError, ParameterError
from ..kernels.pacing import FRAME_GUARD
from ._host_rings import HostRings
from .coerce import check_param, coerce_host_value
from .operator_index import OperatorLink, OperatorLinks, Placements
from .registry import BlockType, BlockTypeRegistry

__all__ = ["HostAdapter", "EngineOperator", "OperatorLink"]

log = logging.getLogger("cudapatch.host")

_Edit = TypeVar("_Edit", bound=Callable[..., Any])


def _frame_first(edit: _Edit) -> _Edit:
    """A structure edit of the host: it runs on the host's frame thread, between cooks, and holds
    ``FRAME_GUARD`` as a frame does, so a build in flight waits at its checkpoints until it returns
    (``kernels/pacing.py``). Without it the build thread's Python took the interpreter from these
    calls: a hot swap made while a build ran took 1.1-3.6 ms (median) on the CPU machine, 0.7-1.0
    with the guard held. Nested edits (a hot swap deletes, places and links) hold it once."""

    @functools.wraps(edit)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with FRAME_GUARD.held():
            return edit(*args, **kwargs)

    return guarded  # type: ignore[return-value]


class HostAdapter:
    """Maps host operator ids to blocks of one engine.

    Args:
        engine: The engine the blocks run in.
        registry: Block types by name (``PluginHost().registry``).
    """

    def __init__(self, engine: Any, registry: BlockTypeRegistry, *, search_paths: list[Path] | None = None) -> None:
        self.engine = engine
        self.registry = registry
        #: Where relative kernel file paths (a ``Path`` text parameter) are looked up, in order:
        #: the patch file's directory, then ``cudapatch_kernel_search_paths`` of the plugins.
        self.search_paths: list[Path] = list(search_paths or [])
        self._ops: dict[str, Block] = {}
        self._types: dict[str, BlockType] = {}
        self._links = OperatorLinks()
        self._regions = Placements()
        self._rings = HostRings(engine)  # the pinned rings of Upload and Download operators
        self.engine_operator = EngineOperator(self)

    # -- queries -----------------------------------------------------------------------------------
    def block(self, op_id: str) -> Block:
        """The block of operator ``op_id``.

        Raises:
            CudapatchError: unknown operator.
        """
        b = self._ops.get(op_id)
        if b is None:
            known = ", ".join(self._ops) or "none"
            raise CudapatchError(f"unknown operator '{op_id}' (operators: {known})")
        return b

    def operators(self) -> dict[str, str]:
        """Operator id → qualified block type."""
        return {op: t.name for op, t in self._types.items()}

    def links(self) -> tuple[OperatorLink, ...]:
        return tuple(self._links)

    def regions(self) -> dict[str, str]:
        """Operator id → the region operator (``If``, ``While``, ``For``) holding it; top-level ones are absent."""
        return self._regions.as_dict()

    def operators_by_block(self) -> dict[int, str]:
        """Block id → operator id, for routing the engine's per-block results to operators. The inner
        blocks of a composite route to the composite's operator."""
        out = {b.id: op for op, b in self._ops.items()}
        for op, b in self._ops.items():
            if isinstance(b, Composite):
                out.update((inner.id, op) for _, inner in b.inner_blocks())
        return out

    # -- structure (Cold on the next cook) ------------------------------------------------------------
    @_frame_first
    def create(self, op_id: str, type_name: str, params: dict[str, Any] | None = None, *, fuse: bool = True) -> Block:
        """Create operator ``op_id`` as a block of ``type_name`` with ``params`` (``fuse=False``: the
        constructor keyword of an elementwise block, kept out of fused groups).

        Raises:
            CudapatchError: the id is taken, or the type is unknown.
            ParameterError: a parameter is unknown or its value is bad (nothing is created).
        """
        if op_id in self._ops:
            raise CudapatchError(f"operator '{op_id}' already exists")
        bt = self.registry.get(type_name)
        params = dict(params or {})
        scalars = {name for name, kind, _ in bt.params if kind != "text"}
        # Text parameters (code, paths) shape the description, so they go to the constructor.
        texts = {k: self.resolve_text(k, v) for k, v in params.items() if isinstance(v, str) and k not in scalars}
        if issubclass(bt.cls, Composite):
            block, texts = self._create_composite(op_id, bt, texts)
        else:
            block = bt.create(op_id, **texts) if fuse else bt.create(op_id, fuse=False, **texts)
        for name, value in params.items():
            if name not in texts:
                self._set(block, name, value)
        self.engine.add(block)
        try:
            self._rings.attach(op_id, block)  # an Upload or Download: its Ring and Control are bound now
        except BaseException:
            self.engine.remove(block)
            raise
        self._ops[op_id] = block
        self._types[op_id] = bt
        log.debug("created %s as %s", op_id, bt.name)
        return block

    @staticmethod
    def _create_composite(op_id: str, bt: BlockType, texts: dict[str, str]) -> tuple[Block, dict[str, str]]:
        """A composite's parameters are known once its file is read: a host's text for one of its
        number parameters (``"0.5"``) is a value set after creation, and only its text parameters
        (``Path``, exposed ones) go to the constructor. Returns the block and those texts."""
        declared = {name for name, kind, _ in bt.params if kind == "text"}
        given = {k: v for k, v in texts.items() if k in declared}
        block = bt.create(op_id, **given)
        exposed = {k: v for k, v in texts.items() if k not in declared and k in block.params}
        exposed = {k: v for k, v in exposed.items() if block.params[k].spec.kind == "text"}
        if exposed:  # an exposed text parameter (an inner kernel's Code) shapes the composite too
            given.update(exposed)
            block = bt.create(op_id, **given)
        return block, given

    def resolve_text(self, name: str, value: str) -> str:
        """The value text parameter ``name`` gets from the host's ``value``: a relative kernel file
        path (the ``Path`` parameter) made absolute against the search paths (the first one that has
        it); anything else unchanged."""
        if name != "Path" or not value or Path(value).is_absolute():
            return value
        for base in self.search_paths:
            candidate = Path(base) / value
            try:
                found = candidate.exists()
            except OSError:  # ENAMETOOLONG: the block reports the path the OS refuses
                found = False
            if found:
                return str(candidate)
        return value  # the block reports the missing file with its path

    @_frame_first
    def place(self, op_id: str, region_op: str | None) -> None:
        """Put operator ``op_id`` inside region operator ``region_op`` (an ``If``, ``While`` or
        ``For``: in TouchDesigner, a COMP holding block COMPs), or at the top level with None
        (Cold on the next cook).

        Raises:
            CudapatchError: unknown operator, ``region_op`` is no region, or it would hold itself.
        """
        block = self.block(op_id)
        region = self.block(region_op) if region_op is not None else None
        place = getattr(self.engine, "place", None)
        if place is None:
            raise CudapatchError(f"this engine ({type(self.engine).__name__}) runs no regions", block=op_id)
        place(block, region)
        self._regions.place(op_id, region_op)

    @_frame_first
    def delete(self, op_id: str) -> None:
        """Remove operator ``op_id`` and its links (a region's operators move to the region around it).

        Raises:
            CudapatchError: unknown operator.
        """
        block = self.block(op_id)
        self._links.remove_operator(op_id)
        self.engine.remove(block)
        self._rings.drop(op_id)
        del self._ops[op_id]
        del self._types[op_id]
        self._regions.remove_operator(op_id)

    @_frame_first
    def rename(self, op_id: str, new_id: str) -> None:
        """Rename an operator (its block, links and messages follow).

        Raises:
            CudapatchError: unknown operator or the new id is taken.
        """
        block = self.block(op_id)
        if new_id in self._ops:
            raise CudapatchError(f"cannot rename '{op_id}' to '{new_id}': that operator exists")
        self._ops[new_id] = self._ops.pop(op_id)
        self._types[new_id] = self._types.pop(op_id)
        block.name = new_id
        self._links.rename(op_id, new_id)
        self._regions.rename(op_id, new_id)
        self._rings.rename(op_id, new_id)

    @_frame_first
    def connect(self, src_op: str, src_port: str, dst_op: str, dst_port: str) -> None:
        """Link ``src_op.src_port`` to ``dst_op.dst_port``.

        Raises:
            LinkError: unknown operator or port, incompatible types, a second link into one input, a cycle
                that does not pass through a FrameDelay's ``In``.
        """
        try:
            src, dst = self.block(src_op), self.block(dst_op)
        except CudapatchError as exc:
            raise LinkError(exc.message) from None
        self.engine.connect(src, src_port, dst, dst_port)
        self._links.add(OperatorLink(src_op, src_port, dst_op, dst_port))  # (replaces the link into that input)

    @_frame_first
    def disconnect(self, src_op: str, src_port: str, dst_op: str, dst_port: str) -> bool:
        """Remove a link; returns whether it existed."""
        if not self._links.remove(OperatorLink(src_op, src_port, dst_op, dst_port)):
            return False
        return self.engine.disconnect(self._ops[src_op], src_port, self._ops[dst_op], dst_port)

    @_frame_first
    def hot_swap(self, op_id: str, new_type_or_code: str, *, fuse: bool = True) -> Block:
        """Replace operator ``op_id``'s block, as a live-coding host does: a block type name makes a
        block of that type; anything else is CUDA code for a ``core.CustomKernel``. Links and values
        whose names still exist are restored; links that no longer fit are dropped (and logged).
        ``fuse=False``: the constructor keyword of an elementwise block, as ``create`` takes it.

        Raises:
            CudapatchError: unknown operator or type; the old block stays in place.
        """
        old = self.block(op_id)
        looks_like_type = "." in new_type_or_code and not any(c.isspace() for c in new_type_or_code)
        if new_type_or_code in self.registry or looks_like_type:
            bt, texts = self.registry.get(new_type_or_code), {}
        else:
            bt, texts = self.registry.get("core.CustomKernel"), {"Code": new_type_or_code}
        # fails before anything changes
        new = bt.create(op_id, **texts) if fuse else bt.create(op_id, fuse=False, **texts)
        values = {n: p.value for n, p in old.params.items() if p.spec.kind != "text"}
        links = self._links.of(op_id)
        region = self._regions.region(op_id)
        held = self._regions.held(op_id)  # a swapped region keeps its operators
        self.delete(op_id)
        for name, value in values.items():
            if name in new.params and new.params[name].spec.kind != "text":
                try:
                    new.set(name, value)
                except ParameterError:
                    pass  # a type change: keep the new default
        self.engine.add(new)
        self._ops[op_id] = new
        self._types[op_id] = bt
        try:
            self._rings.attach(op_id, new)
        except CudapatchError as exc:  # the operator stays, unbound: its next upload or download tries again
            log.warning("hot swap of '%s': no ring: %s", op_id, exc)
        for child, where in [(op_id, region), *((c, op_id) for c in held)]:
            if where is not None:
                try:
                    self.place(child, where)
                except CudapatchError as exc:  # the new type is no region: its operators stay where they are
                    log.warning("hot swap of '%s': %s stays out of it: %s", op_id, child, exc)
        for lk in links:
            try:
                self.connect(lk.src, lk.src_port, lk.dst, lk.dst_port)
            except (LinkError, CudapatchError) as exc:
                log.warning("hot swap of '%s': link %s dropped: %s", op_id, lk, exc)
        return new

    # -- values (Hot: cheap, no rebuild unless structural) ------------------------------------------
    def set_param(self, op_id: str, name: str, value: Any) -> None:
        """Set a parameter from a host value (coerced to the parameter's type). A text parameter's value
        is resolved as ``create`` resolves it (a relative ``Path`` against the search paths), so a
        composite or kernel file named after creation is found where one named at creation is.

        Raises:
            CudapatchError: unknown operator.
            ParameterError: unknown parameter, wrong type, out of range (the old value stays).
        """
        block = self.block(op_id)
        self._set(block, name, value, resolve=True)
        if name in ("Count", "Type") and self._rings.takes_ring(block):
            self._rings.attach(op_id, block)  # the build for the new size binds a ring of it

    def _set(self, block: Block, name: str, value: Any, *, resolve: bool = False) -> None:
        """Set ``block``'s parameter ``name`` from a host value, coerced to the parameter's type; with
        ``resolve``, a text value is resolved first (``resolve_text``). ``create`` leaves it off: its
        text values went to the constructor, resolved there."""
        p = block.params.get(name)
        if p is None:
            check_param(block, name)  # raises, naming the block's parameters
        spec = p.spec  # type: ignore[union-attr]
        if resolve and spec.kind == "text" and isinstance(value, str):
            value = self.resolve_text(name, value)
        block.set(name, coerce_host_value(spec, value))

    def set_bypass(self, op_id: str, on: bool) -> None:
        """Bypass operator ``op_id`` (``on``) or let it run again, without a rebuild: its kernels are
        turned off in the running graph and its readers read its input of the same type and size
        (else its output's last values); see ``Block.enabled``. Visible from the next cook.

        Raises:
            CudapatchError: unknown operator.
        """
        self.block(op_id).enabled = not on

    def bypassed(self, op_id: str) -> bool:
        """Whether operator ``op_id`` is bypassed.

        Raises:
            CudapatchError: unknown operator.
        """
        return not self.block(op_id).enabled

    # -- per-frame data (Upload and Download operators) -----------------------------------------------
    def upload(self, op_id: str, array: Any) -> bool:
        """Feed Upload operator ``op_id``: ``array`` (``Count`` elements of its ``Type``; a vector type's
        lanes may be a last axis) goes into its pinned ring, and the next frame copies it into ``Out``.
        Never waits: returns False when the write was dropped because the GPU still reads the slot it
        needs (``UploadRing.write``). A ring that no longer fits the operator's ``Type`` or ``Count`` is
        made again first.

        Raises:
            CudapatchError: unknown operator, or it is no ``core.Upload``.
            BindingError: ``array`` has another element type or size than the operator takes.
            CudaError: a new ring could not be allocated.
        """
        return self._rings.upload(op_id, self.block(op_id), array)

    def download(self, op_id: str) -> np.ndarray | None:
        """The newest values Download operator ``op_id`` copied in a completed frame (a frame or two
        old; the same values again until a newer frame completes), or None before its first frame
        completes. Plain loads from its pinned ring: no synchronize, no driver call.

        Raises:
            CudapatchError: unknown operator, or it is no ``core.Download``.
            CudaError: a new ring could not be allocated.
        """
        return self._rings.download(op_id, self.block(op_id))

    def sync_rings(self) -> None:
        """Give each Upload and Download operator a ring of its block's ``Type`` and ``Count`` again, if
        they were changed on the block directly (``apply_patch`` calls it; ``set_param`` does it)."""
        self._rings.sync(self._ops)

    def close_rings(self) -> None:
        """Free the Upload and Download operators' rings; a host calls it before closing the engine."""
        self._rings.close()

    # -- per operator, for the host's nodes ----------------------------------------------------------
    def tooltip(self, op_id: str) -> str:
        """What the host shows on the operator (``str(block)``)."""
        return str(self.block(op_id))

    def diagnostics(self, op_id: str) -> tuple[Diagnostic, ...]:
        """Errors and warnings of the operator's block."""
        return self.engine.diagnostics(self.block(op_id))


class EngineOperator:
    """The one operator a host gets for the engine: ``cook()`` once per frame."""

    def __init__(self, adapter: HostAdapter) -> None:
        self._adapter = adapter
        self.engine = adapter.engine
        self.cook = self.engine.update  # bound once: a cook is exactly one Engine.update()

    def output(self, op_id: str, port: str) -> Any:
        """The device buffer of an operator's output (``GpuBuffer``, CUDA array interface)."""
        return self.engine.output(self._adapter.block(op_id), port)

    def tooltip(self) -> str:
        """The engine's tooltip (``str(engine)``)."""
        return str(self.engine)

    def diagnostics(self) -> dict[str, tuple[Diagnostic, ...]]:
        """Diagnostics per operator id (only operators that have some), plus ``""`` for the engine."""
        by_block = self._adapter.operators_by_block()
        out: dict[str, list[Diagnostic]] = {}
        for d in self.engine.diagnostics():
            out.setdefault(by_block.get(d.block_id, ""), []).append(d)
        return {k: tuple(v) for k, v in out.items()}
