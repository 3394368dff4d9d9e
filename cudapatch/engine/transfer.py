"""Pinned, device-mapped rings that feed an ``Upload`` block and drain a ``Download`` block every
frame, never synchronizing and making no driver call per frame.

Why kernels and not memcpy nodes: a memcpy node's source is fixed in the executable graph, so a
ring behind one needs its node patched every frame (a driver call per upload per frame, twice with
FrameDelays' two phases), and the slot would be chosen when the host launches rather than when the
GPU gets there. The blocks' kernels read the slot number from the ring's control words when the
frame runs: the newest data the host finished writing, with plain host loads and stores on this
side. The policy (which slot the host may write, which one it may read) lives in pure functions
below, tested without a GPU.

Upload: the host writes array ``seq`` into slot ``seq % UPLOAD_SLOTS`` and then publishes ``seq`` in
control word 0; a frame copies the newest published slot and reports the sequence it copies in
word 1. The host never writes the slot a frame may be reading: a write that would (the GPU is
``UPLOAD_SLOTS - 1`` uploads behind) is dropped and counted (``dropped``), never waited for.

Download: the kernel writes frame ``f`` into slot ``f % 3`` and its frame word last, after a
system fence (as the readback ring's publish kernel does); ``read`` takes the newest complete slot
and checks its frame word again after copying (``readback.newest_published``).
"""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .._lifecycle import ContextRef, HandleOwner, Releases
from ..blocks.block import Block
from ..blocks.library.transfer import DOWNLOAD_SLOTS, UPLOAD_SLOTS
from ..errors import BindingError, CudapatchError
from ..kernels.types import DType
from .readback import newest_published

__all__ = ["DownloadRing", "UploadRing", "upload_slot"]


def upload_slot(latest: int, copying: int, slots: int = UPLOAD_SLOTS) -> int | None:
    """The slot the host writes upload ``latest + 1`` into, or None when that slot may still be read.

    Args:
        latest: The newest sequence number the host published (0: none yet).
        copying: The sequence number a frame last reported copying (it may be stale: the rule is safe
            for any value not newer than what the GPU really copies).
        slots: Ring slots.

    A frame reads only the slot it reported, or one published after it; slot ``(latest + 1) % slots``
    last held upload ``latest + 1 - slots``, which is being read only if the GPU is that far behind.
    """
    nxt = latest + 1
    if nxt - copying >= slots:
        return None
    return nxt % slots


class _MappedView:
    """Device-visible pinned memory as a ``__cuda_array_interface__`` (what ``Engine.bind`` takes);
    keeps its ring alive while bound."""

    def __init__(self, ring: _PinnedRing, ptr: int, count: int, dtype: DType) -> None:
        self._ring = ring
        self.__cuda_array_interface__ = {
            "shape": (count * dtype.lanes,),
            "typestr": dtype.base.str,
            "data": (ptr, False),
            "version": 3,
        }


class _PinnedRing(HandleOwner):
    """``slots`` slots of ``count`` elements plus ``words`` control words in mapped pinned memory: from
    ``cuMemHostAlloc``, or from ``engine.share_host_memory`` where the engine has it (an isolated
    engine, whose kernels run in another process: pages both processes map, ``isolated/ipc.py``)."""

    def __init__(self, dtype: DType, count: int, slots: int, words: int, what: str, engine: Any = None) -> None:
        self.dtype, self.count, self.slots = dtype, count, slots
        self.slot_bytes = count * dtype.itemsize
        data_bytes = -(-(slots * self.slot_bytes) // 8) * 8
        nbytes = data_bytes + 8 * words
        # An isolated engine's kernels run in another process: it gives memory both processes map.
        share = getattr(engine, "share_host_memory", None)
        self._releases = Releases()
        self._arm(what, releases=self._releases, context=ContextRef.current())
        try:
            if share is not None:
                pages = share(nbytes)  # new pages (a fresh memfd: zeroed), registered for the device
                self._releases.push(pages.release, what="SharedPages.release")
                self._host, dev = pages.host_ptr, pages.device_ptr
            else:
                # Its free waits for the device: a frame still copying finishes before the ring goes.
                self._host, dev = self._releases.mapped_host(nbytes)
        except BaseException:
            self.close()
            raise
        buf = (ctypes.c_uint8 * nbytes).from_address(self._host)
        flat = np.frombuffer(buf, dtype=np.uint8)
        self._data = flat[: slots * self.slot_bytes].view(dtype.base).reshape(slots, count * dtype.lanes)
        self._control = flat[data_bytes:].view(np.uint64)  # plain loads and stores: no driver call
        self.ring_view = _MappedView(self, dev, slots * count, dtype)
        self.control_view = _MappedView(self, dev + data_bytes, words, DType.UINT64)

    def _release(self) -> None:
        self._data = self._control = None  # type: ignore[assignment]
        self._releases.release()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.dtype.c_name}[{self.count}] x{self.slots} closed={self._closed}>"

    def _forget(self) -> None:
        self._data = self._control = None  # type: ignore[assignment]
        self._releases.forget()


def _check_block(block: Block, type_name: str) -> None:
    if block.description.type_name != type_name:
        raise CudapatchError(f"expected a {type_name} block, got a {block.description.type_name}", block=block.name)


class UploadRing(_PinnedRing):
    """The host side of an ``Upload`` block: ``write(array)`` whenever new data is there (each frame,
    say); the next frame that runs copies the newest complete array into the block's ``Out``.

    Args:
        engine: The engine the block is registered with (its ``Ring`` and ``Control`` are bound here).
        block: The ``Upload`` block.

    Attributes:
        written: Arrays published so far.
        dropped: Writes dropped because the GPU was still reading the slot they needed.

    Raises:
        CudapatchError: not an Upload block. CudaError: the pinned allocation failed.
    """

    def __init__(self, engine: Any, block: Block) -> None:
        _check_block(block, "Upload")
        dtype = block.description.output("Out").dtype  # type: ignore[union-attr]
        count = int(block.get("Count"))
        super().__init__(dtype, count, UPLOAD_SLOTS, 2, f"UploadRing of '{block.name}'", engine)
        self.block_name = block.name
        self.written = 0
        self.dropped = 0
        engine.bind(block, "Ring", self.ring_view)
        engine.bind(block, "Control", self.control_view)

    def write(self, array: Any) -> bool:
        """Copy ``array`` (``Count`` elements of the block's type) into the next free slot and publish
        it. Never waits: returns False (and counts ``dropped``) when the GPU is still reading the slot.

        Raises:
            BindingError: wrong size or type. CudapatchError: the ring is closed.
        """
        self._check_open("UploadRing.write")
        a = np.asarray(array)
        dst = self._data
        if a.dtype != dst.dtype or a.size != dst.shape[1]:
            raise BindingError(
                f"upload of {a.size} {a.dtype} values; the block takes {self.count} {self.dtype.c_name}",
                block=self.block_name,
                port="Out",
            )
        ctl = self._control
        latest = int(ctl[0])
        slot = upload_slot(latest, int(ctl[1]), self.slots)
        if slot is None:
            self.dropped += 1
            return False
        dst[slot] = a.reshape(-1)
        ctl[0] = latest + 1  # after the data: x86 stores reach memory in order
        self.written += 1
        return True


class DownloadRing(_PinnedRing):
    """The host side of a ``Download`` block: ``read()`` returns the newest frame's copy of ``In``
    that is complete, a frame or two after it ran, without waiting.

    Args:
        engine: The engine the block is registered with.
        block: The ``Download`` block.
        count: Elements a slot holds (the size of ``In``); sets the block's ``Count``. None: the
            block's ``Count``.

    Raises:
        CudapatchError: not a Download block. CudaError: the pinned allocation failed.
    """

    def __init__(self, engine: Any, block: Block, count: int | None = None) -> None:
        _check_block(block, "Download")
        dtype = block.description.input("In").dtype  # type: ignore[union-attr]
        if count is not None:
            block.set("Count", int(count))  # the kernel never writes more than a slot holds
        count = int(block.get("Count"))
        super().__init__(dtype, count, DOWNLOAD_SLOTS, 1 + DOWNLOAD_SLOTS, f"DownloadRing of '{block.name}'", engine)
        self.frame = 0  # the block's run whose values ``read`` returned last
        engine.bind(block, "Ring", self.ring_view)
        engine.bind(block, "Control", self.control_view)

    def read(self) -> tuple[np.ndarray, int] | None:
        """``(values, frame)``: a copy of the newest complete slot and the block's run number it is
        from (1 = its first frame), or None when nothing newer than the last read is complete.
        Plain loads from pinned memory: no driver call, never waits.

        Raises:
            CudapatchError: the ring is closed.
        """
        self._check_open("DownloadRing.read")
        ctl = self._control
        for _ in range(DOWNLOAD_SLOTS):  # a slot cleared while copied is retried
            words = [int(ctl[1 + s]) for s in range(DOWNLOAD_SLOTS)]
            slot = newest_published(words, self.frame)
            if slot is None:
                return None
            frame = words[slot]
            values = self._data[slot].copy()
            if int(ctl[1 + slot]) != frame:  # the kernel began rewriting it meanwhile
                continue
            self.frame = frame
            if self.dtype.lanes > 1:
                values = values.reshape(self.count, self.dtype.lanes)
            return values, frame
        return None
