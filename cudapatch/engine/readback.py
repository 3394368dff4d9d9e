"""A ring of 3 in-flight frames for reading small device values without stalling: profiling
timestamps (uint64) and append counters (uint32), which the graph keeps in one device block.

After each launch the engine copies that block into one pinned host slot and records an event;
``poll`` harvests the newest slot whose event has completed (``cuEventQuery``, never waiting).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

import numpy as np

from ..kernels._driver import check, driver

__all__ = ["ReadbackRing", "RING_FRAMES", "newest_completed"]

RING_FRAMES = 3


def newest_completed(
    next_slot: int,
    frames: list[int | None],
    harvested: int | None,
    latest_frame: int | None,
    done: Callable[[int], bool],
) -> int | None:
    """The ring slot to harvest: the newest recorded slot whose frame has completed, if it is newer
    than the frame already held; else None. Looks at most at every slot once, newest first, and
    stops at the slot already harvested (older slots cannot be newer). ``done(slot)`` must not wait.
    """
    for back in range(1, len(frames) + 1):
        slot = (next_slot - back) % len(frames)
        frame = frames[slot]
        if frame is None or slot == harvested:
            return None
        if not done(slot):
            continue
        if latest_frame is not None and frame <= latest_frame:
            return None
        return slot
    return None


class ReadbackRing:
    """Asynchronous readback, 3 frames deep, of ``stamps`` uint64 timestamps followed by ``count``
    uint32 counters at ``device_ptr``.

    Raises:
        CudaError: pinned allocation or event creation failed.
    """

    def __init__(self, device_ptr: int, count: int, *, stamps: int = 0) -> None:
        d = driver()
        self.device_ptr = device_ptr
        self.count = count
        self.stamps = stamps
        self.nbytes = 8 * stamps + 4 * count
        self._stamp_views: list[np.ndarray] = []
        self.latest_stamps = np.zeros(stamps, dtype=np.uint64)
        self._host_ptrs: list[int] = []
        self._views: list[np.ndarray] = []
        self._events: list[Any] = []
        self._frames: list[int | None] = [None] * RING_FRAMES
        self._next = 0
        self._harvested: int | None = None  # slot last harvested
        self.latest = np.zeros(count, dtype=np.uint32)
        self.latest_frame: int | None = None
        self.current_frame = 0
        self._closed = False
        for _ in range(RING_FRAMES):
            ptr = int(check(d.cuMemHostAlloc(max(self.nbytes, 8), 0), "cuMemHostAlloc"))
            self._host_ptrs.append(ptr)
            self._stamp_views.append(
                np.ctypeslib.as_array((ctypes.c_uint64 * max(stamps, 1)).from_address(ptr))[:stamps]
            )
            at = ptr + 8 * stamps
            self._views.append(np.ctypeslib.as_array((ctypes.c_uint32 * max(count, 1)).from_address(at))[:count])
            flags = d.CUevent_flags.CU_EVENT_DISABLE_TIMING.value
            self._events.append(check(d.cuEventCreate(flags), "cuEventCreate"))
        self._memcpy = d.cuMemcpyDtoHAsync
        self._record = d.cuEventRecord
        self._query = d.cuEventQuery
        self._not_ready = d.CUresult.CUDA_ERROR_NOT_READY

    @property
    def next_slot(self) -> int:
        """The ring slot the next frame uses (its executable and its events)."""
        return self._next

    def record(self, stream: Any, frame: int) -> None:
        """Enqueue the copy of this frame's values and its event (after the launch, same stream).

        Raises:
            CudaError: the copy or event record failed.
        """
        slot = self._next
        if self.nbytes:
            (err,) = self._memcpy(self._host_ptrs[slot], self.device_ptr, self.nbytes, stream)
            if err:
                check((err,), "cuMemcpyDtoHAsync")
        (err,) = self._record(self._events[slot], stream)
        if err:
            check((err,), "cuEventRecord")
        self._frames[slot] = frame
        if self._harvested == slot:
            self._harvested = None
        self._next = (slot + 1) % RING_FRAMES
        self.current_frame = frame

    def poll(self) -> bool:
        """Harvest the newest completed frame, if newer than the one held. Never waits.

        Returns:
            Whether new values arrived.

        Raises:
            CudaError: an event query failed (a sticky fault surfaces here).
        """
        slot = newest_completed(self._next, self._frames, self._harvested, self.latest_frame, self._done)
        if slot is None:
            return False
        self.latest[:] = self._views[slot]
        self.latest_stamps[:] = self._stamp_views[slot]
        self.latest_frame = self._frames[slot]
        self._harvested = slot
        return True

    def _done(self, slot: int) -> bool:
        (err,) = self._query(self._events[slot])
        if err == self._not_ready:
            return False
        if err:
            check((err,), "cuEventQuery")
        return True

    def value(self, index: int) -> int | None:
        """The value at ``index`` in the newest harvested frame, or None before any completed."""
        return None if self.latest_frame is None else int(self.latest[index])

    def age(self) -> int | None:
        """How many frames old the harvested values are (1 = the frame just before the last launch)."""
        return None if self.latest_frame is None else self.current_frame - self.latest_frame + 1

    def wait_idle(self) -> None:
        """Wait for every recorded copy (only on teardown).

        Raises:
            CudaError: an event synchronize failed.
        """
        d = driver()
        for slot, ev in enumerate(self._events):
            if self._frames[slot] is not None:
                check(d.cuEventSynchronize(ev), "cuEventSynchronize")

    def abandon(self) -> None:
        """Forget the pinned slots and events without freeing them (the context was reset)."""
        self._closed = True
        self._views.clear()
        self._stamp_views.clear()
        self._host_ptrs.clear()
        self._events.clear()

    def close(self) -> None:
        """Free the pinned slots and events once their copies are done; idempotent.

        Raises:
            CudaError: a driver call failed.
        """
        if self._closed:
            return
        self._closed = True
        self.wait_idle()
        d = driver()
        self._views.clear()
        self._stamp_views.clear()
        for ptr in self._host_ptrs:
            check(d.cuMemFreeHost(ptr), "cuMemFreeHost")
        for ev in self._events:
            check(d.cuEventDestroy(ev), "cuEventDestroy")
        self._host_ptrs.clear()
        self._events.clear()
