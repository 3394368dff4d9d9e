"""FrameGate: lets a background thread run its Python between frames instead of during one.

Python runs one thread at a time. When a background thread holds the GIL while the frame thread
returns from a driver call inside ``Engine.update()``, the frame waits until that thread lets go:
up to the interpreter's switch interval (5 ms), measured as frames of 0.3 to 1.6 ms during edit
bursts. So the kernel builder does its Python (cache lookups, module loads, swapping a kernel into
the graph) right after a frame: it waits at the gate, and the engine opens the gate when its frame
is done, but only while the builder has work (``wanted``), so a quiet frame pays an attribute test.

The build thread uses a gate of its own for the driver: ``cuGraphInstantiate`` holds a lock of the
driver that the frame thread's ``cuGraphLaunch`` waits for (launches of 2 to 10 ms during a 1,000-block
build, H200 host). Started right after a frame, an instantiation of a few milliseconds ends before
the next frame's launch.

A build's Python can still be running when the next frame starts (a 1,000-block build is tens of
milliseconds). Every driver call of that frame gives the GIL up, the build thread takes it, and the
frame waits for it again: up to the switch interval (0.1 ms while a build runs) per call, so a frame
that patches 20 Hot values took 2 ms (H100 host, ``benchmarks/bench_host_driven.py``). ``FRAME_GUARD``
stops that: the frame thread holds it through ``update()`` while a build is in flight, and the build's
loops call ``checkpoint()``, which waits (without the GIL) until the frame is over.

Other background Python that runs beside frames for a while (the specialiser's looks over a fused
patch's scalars) says so with ``FRAME_GUARD.working()``: frames hold the guard then too, quiet ones
included (one attribute test otherwise), and its loops call ``checkpoint()`` as a build's do. A
host's structure edits (``HostAdapter.create``, ``hot_swap`` ...) are frame-thread work as well and
hold the guard while each call runs.
"""

from __future__ import annotations

import _thread
from collections.abc import Callable, Iterator
from contextlib import contextmanager

__all__ = ["FRAME_GUARD", "FrameGate", "FrameGuard", "checkpoint"]

#: The longest a checkpoint waits for a frame to end (a frame that never ends must not stop a build).
CHECKPOINT_TIMEOUT_S = 0.05


class FrameGate:
    """A gate the frame thread opens after each frame for one waiting background thread."""

    __slots__ = ("wanted", "_lock")

    def __init__(self) -> None:
        self._lock = _thread.allocate_lock()
        self._lock.acquire()  # closed
        self.wanted = False  # a thread waits (or has work queued) and wants the next frame's end

    def open(self) -> None:
        """Let the waiting thread run (the frame thread, after its frame; anyone, to wake it now)."""
        self.wanted = False
        try:
            self._lock.release()
        except RuntimeError:  # already open: the thread has not come back to wait yet
            pass

    def next_frame(self, timeout: float, unless: Callable[[], bool] | None = None) -> bool:
        """Wait for the end of the next frame (at most ``timeout`` seconds): an ``open`` left over
        from before does not count. True when a frame ended (or someone opened the gate).

        ``unless``: asked once the gate is closed again; True: no wait (False returned). Whoever makes
        it true and then opens the gate cannot be missed: either it is seen here, or the open ends the
        wait."""
        self._lock.acquire(blocking=False)  # closed again, whatever it was
        self.wanted = True
        if unless is not None and unless():
            return False
        return self._lock.acquire(timeout=timeout)

    def wait(self, timeout: float) -> bool:
        """Wait for ``open`` (at most ``timeout`` seconds; negative: no limit). True when opened."""
        return self._lock.acquire(timeout=timeout)


class FrameGuard:
    """Held by a frame thread while its frame runs; background Python waits at ``checkpoint``.

    One per process (``FRAME_GUARD``): the GIL is the process's, so another engine's build yields to
    this engine's frame as well. A frame that finds the guard held (another engine's frame thread is in
    its frame) runs unguarded rather than wait for it.
    """

    __slots__ = ("owner", "busy", "_free", "_count")

    def __init__(self) -> None:
        self._free = _thread.allocate_lock()
        self._count = _thread.allocate_lock()
        #: The thread in its frame (its ident), 0 when none: read without the lock by ``checkpoint``
        #: (a stale read costs one wait or one pass).
        self.owner = 0
        #: How many background threads are ``working()`` now: a frame holds the guard while any is.
        self.busy = 0

    @contextmanager
    def working(self) -> Iterator[None]:
        """Around background Python that is not a build (which the engine knows of): frames hold the
        guard while it runs, so its ``checkpoint()`` calls wait for them."""
        with self._count:
            self.busy += 1
        try:
            yield
        finally:
            with self._count:
                self.busy -= 1

    @contextmanager
    def held(self) -> Iterator[None]:
        """Around frame-thread work outside ``update()`` (a host's edit call): the guard is held while
        it runs, unless this thread holds it already (then it stays held) or another engine's frame
        thread does (then the work runs unguarded, as such a frame does)."""
        entered = self.enter()
        try:
            yield
        finally:
            if entered:
                self.leave()

    @property
    def in_frame(self) -> bool:
        """A frame thread holds the guard."""
        return self.owner != 0

    def enter(self) -> bool:
        """From a frame thread, at the start of its frame: True when it holds the guard now (then
        ``leave`` at the end of the frame)."""
        if not self._free.acquire(False):
            return False
        self.owner = _thread.get_ident()
        return True

    def leave(self) -> None:
        """End of the frame ``enter`` returned True for: the waiting checkpoints go on. Nothing when
        this thread does not hold the guard (``lift`` gave it up and could not take it back)."""
        if self.owner != _thread.get_ident():
            return
        self.owner = 0
        self._free.release()

    def lift(self) -> bool:
        """Before a frame thread waits for background work (a build to finish): give the guard up, so
        the build does not wait at its checkpoints for this frame. True when it was held (then
        ``enter`` again after the wait)."""
        if self.owner != _thread.get_ident():
            return False
        self.leave()
        return True

    def checkpoint(self) -> None:
        """From background Python (a build's loops): while a frame runs on another thread, wait for its
        end (at most ``CHECKPOINT_TIMEOUT_S``), the GIL given up. An attribute test otherwise."""
        owner = self.owner
        if owner and owner != _thread.get_ident():
            if self._free.acquire(True, CHECKPOINT_TIMEOUT_S):
                self._free.release()


#: The process's frame guard (see ``FrameGuard``).
FRAME_GUARD = FrameGuard()

#: ``FRAME_GUARD.checkpoint``, bound once for the build's loops.
checkpoint = FRAME_GUARD.checkpoint
