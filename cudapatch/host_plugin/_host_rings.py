"""The pinned rings of a host's ``core.Upload`` and ``core.Download`` operators, by operator id.

A patch file or a host network cannot bind a ring itself: the adapter attaches one to every Upload
and Download operator it creates (``UploadRing``/``DownloadRing`` of ``cudapatch.engine.transfer``,
made for the block's ``Type`` and ``Count``), so the operator's ``Ring`` and ``Control`` are bound
and the chain after it plans and runs from the first frame (an Upload's ``Out`` holds zeros until
the host writes). The host then feeds and reads them by operator id: plain stores and loads in
pinned memory, never a synchronize.

A ring made for another element type or ``Count`` than its block has now is replaced when the
host changes them through the adapter's ``set_param``, when a patch file is applied (``sync``: a
value back at its default, a failed edit undone), and on the next ``upload``/``download`` otherwise,
so the graph built for the new size binds the new ring. The ring it replaces, or the ring of a deleted
operator, is still read by the graph that runs when it is dropped: the engine keeps launching that
graph until the edit's build is swapped in. So it is closed only once another graph runs and no build
is in flight or waiting to start; its free then waits only for frames already launched.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..blocks.block import Block
from ..engine.transfer import DownloadRing, UploadRing
from ..errors import CudapatchError
from ..kernels.types import DType

__all__ = ["HostRings", "RING_TYPES"]

log = logging.getLogger("cudapatch.host")

#: Block type names (``Block.description.type_name``) whose operators get a ring, and the ring class.
RING_TYPES: dict[str, type[UploadRing] | type[DownloadRing]] = {"Upload": UploadRing, "Download": DownloadRing}


@dataclass
class _Attached:
    block: Block  # the block the ring was made for (a hot swap makes another one)
    ring: UploadRing | DownloadRing  # (its ``dtype`` and ``count``: the block's when it was made)
    last: np.ndarray | None = None  # a Download's newest values read so far


def _shape_of(block: Block) -> tuple[DType, int]:
    """The element type and ``Count`` a ring for ``block`` is made with (as the ring classes read them)."""
    port = block.description.output("Out") if block.description.type_name == "Upload" else block.description.input("In")
    return port.dtype, int(block.get("Count"))  # type: ignore[union-attr]


class HostRings:
    """Rings by operator id, for one engine (the one the blocks are registered with).

    Args:
        engine: The engine; its ``bind`` takes the rings' mapped memory.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        #: Whether the engine binds arrays (a plan-only stand-in does not: its operators get no ring).
        self.binds = callable(getattr(engine, "bind", None))
        self._rings: dict[str, _Attached] = {}
        #: Dropped rings, each with the graph that ran when it was dropped (which may still read it).
        self._retired: list[tuple[Any, UploadRing | DownloadRing]] = []

    def __repr__(self) -> str:
        return f"<HostRings rings={len(self._rings)} retired={len(self._retired)}>"

    @staticmethod
    def takes_ring(block: Block) -> bool:
        """Whether ``block`` is an Upload or Download (its ring is the host's)."""
        return block.description.type_name in RING_TYPES

    def attach(self, op_id: str, block: Block) -> None:
        """Make and bind the ring of ``block`` (operator ``op_id``) if it is an Upload or Download and has
        none that fits; anything else is left alone.

        Raises:
            CudaError: the pinned allocation failed.
        """
        if not self.takes_ring(block) or not self.binds:
            self.drop(op_id)  # a hot swap to another type
            return
        had = self._rings.get(op_id)
        dtype, count = _shape_of(block)
        if had is not None and had.block is block and had.ring.dtype is dtype and had.ring.count == count:
            return
        ring = RING_TYPES[block.description.type_name](self.engine, block)
        self.drop(op_id)
        self._rings[op_id] = _Attached(block, ring)
        log.debug("attached %r to operator '%s'", ring, op_id)

    def sync(self, blocks: Mapping[str, Block]) -> None:
        """Make every ring fit its operator's block in ``blocks`` again (``attach``; a ring that fits
        stays): after values were set on the blocks directly, as a patch file's apply does.

        Raises:
            CudaError: a pinned allocation failed.
        """
        for op_id in list(self._rings):
            block = blocks.get(op_id)
            if block is not None:
                self.attach(op_id, block)

    def upload(self, op_id: str, block: Block, array: Any) -> bool:
        """Write ``array`` into the ring of Upload ``block``: the next frame copies it into ``Out``.
        Returns False when the write was dropped (the GPU still reads the slot it needs).

        Raises:
            CudapatchError: ``block`` is no Upload. BindingError: wrong element type or size.
        """
        att = self._fitting(op_id, block, "Upload")
        return att.ring.write(array)  # type: ignore[union-attr]

    def download(self, op_id: str, block: Block) -> np.ndarray | None:
        """The newest values of Download ``block`` that a frame completed (the same as last time when
        no newer frame completed), or None before its first frame completes.

        Raises:
            CudapatchError: ``block`` is no Download.
        """
        att = self._fitting(op_id, block, "Download")
        got = att.ring.read()  # type: ignore[union-attr]
        if got is not None:
            att.last = got[0]
        return att.last

    def _fitting(self, op_id: str, block: Block, type_name: str) -> _Attached:
        """The ring of ``op_id``, made again if its block's type or ``Count`` changed."""
        if block.description.type_name != type_name:
            raise CudapatchError(
                f"operator '{op_id}' ({block.description.type_name}) is not a core.{type_name}", block=op_id
            )
        if not self.binds:
            raise CudapatchError(f"this engine ({type(self.engine).__name__}) binds no rings", block=op_id)
        self._close_retired()
        self.attach(op_id, block)
        return self._rings[op_id]

    def rename(self, op_id: str, new_id: str) -> None:
        """Operator ``op_id`` is now ``new_id`` (its errors name the new id)."""
        att = self._rings.pop(op_id, None)
        if att is not None:
            att.ring.block_name = new_id
            self._rings[new_id] = att

    def drop(self, op_id: str) -> None:
        """Forget the ring of ``op_id`` (deleted, swapped to another type, or replaced); it is closed
        once another graph than the one running now runs, with no build in flight or waiting (this one,
        or one a build in flight made, may read it until then)."""
        att = self._rings.pop(op_id, None)
        if att is not None:
            self._retired.append((getattr(self.engine, "graph", None), att.ring))

    def _settling(self) -> bool:
        """Whether a build is in flight or a structure edit waits for one: the graph that runs may
        still be one built before the drop (an edit made during a build is built after it)."""
        dirty = getattr(getattr(self.engine, "context", None), "dirty", None)
        return bool(getattr(self.engine, "building", False) or (dirty is not None and dirty.structure))

    def _close_retired(self) -> None:
        if not self._retired or self._settling():
            return
        now = getattr(self.engine, "graph", None)
        # A ring dropped while no graph ran was never read; one dropped under a graph waits for the next.
        done = [ring for ran, ring in self._retired if ran is None or ran is not now]
        if done:
            self._retired = [(ran, ring) for ran, ring in self._retired if not (ran is None or ran is not now)]
            for ring in done:
                ring.close()

    def close(self) -> None:
        """Close every ring (before the engine closes: their frees wait for frames still running)."""
        rings = [att.ring for att in self._rings.values()] + [ring for _, ring in self._retired]
        self._rings, self._retired = {}, []
        for ring in rings:
            ring.close()
