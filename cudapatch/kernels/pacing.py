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
"""

from __future__ import annotations

import _thread

__all__ = ["FrameGate"]


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

    def next_frame(self, timeout: float) -> bool:
        """Wait for the end of the next frame (at most ``timeout`` seconds): an ``open`` left over
        from before does not count. True when a frame ended."""
        self._lock.acquire(blocking=False)  # closed again, whatever it was
        self.wanted = True
        return self._lock.acquire(timeout=timeout)

    def wait(self, timeout: float) -> bool:
        """Wait for ``open`` (at most ``timeout`` seconds; negative: no limit). True when opened."""
        return self._lock.acquire(timeout=timeout)
