"""CollectorFreeze: keeps CPython's full collections from scanning the running patch on every build.

A full collection (generation 2) scans every object the collector tracks while holding the GIL.
A patch's blocks, snapshots and plan are about 110 tracked objects per block: at 1,000 blocks a full
collection took 38 ms, at 10,000 blocks 318 ms (H100 host, Python 3.12). CPython runs one when the
objects that survived into the oldest generation since the last one exceed a quarter of it, and a
build makes a whole new plan: so nearly every build of a large patch ran one, on the build thread,
and the frame thread's next ``update()`` waited for the GIL that long (slowest ``update()`` 53 to
69 ms during a 1,000-block edit).

So after a build is swapped in, the engine moves every tracked object into the collector's
permanent generation (``gc.freeze()``, constant time): later collections scan only what was made
since. Objects frozen are never collected as cycles; those that become garbage are still freed by
reference counting, which is how a replaced plan goes (the frozen count stayed at 235,600 over
repeated 1,000-block builds). Cyclic garbage frozen with them (a host's own, say) would stay, so
every ``THAW_EVERY`` builds the freeze is undone (``gc.unfreeze()``, constant time too): the next
full collection scans everything once and frees them. The frozen count is not asked for: CPython
walks the whole permanent generation to count it (14 ms at 1,000 blocks).
``Engine(freeze_collector=False)`` leaves the collector alone (the freeze is process-wide: a host's
own objects are frozen with the patch's).

The younger generations cost the frame too: a build makes hundreds of thousands of objects, so the
collector ran a generation-1 collection five times per 1,000-block build, 0.5 to 1.3 ms each, on the
build thread holding the GIL, and the frame thread's ``update()`` waited for it (H200 host). So
while a build runs, automatic collection is off (``building``), and when it ends what it made is
frozen like the rest before collection is on again: no collection ever scans a build's objects
(reference counting frees them, as above).
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

__all__ = ["CollectorFreeze", "pause_collector", "resume_collector"]

#: Builds between two thaws (``gc.unfreeze()``), so that cycles frozen by mistake are collected after all.
THAW_EVERY = 100

_pause_lock = threading.Lock()
_pause_users = 0  # builds and edit frames running with the collector paused (engines share one interpreter)
_pause_resume = False  # whether the collector was on when the first of them paused it
_pause_freeze = False  # whether a build ran meanwhile: what it made is frozen before collection is on


def pause_collector(*, build: bool = False) -> None:
    """No automatic collection from now until the matching ``resume_collector`` (process-wide and
    counted: builds on the build thread and edit frames on the frame thread overlap). The collector
    is on again when the last pause ends, if it was on when the first began; ``build``: first freeze
    what was made meanwhile. (An edit frame used to switch the collector back on at its end while
    the build it had started ran: the build's objects then set off collections, 5-10 ms each at
    1,000 blocks, in whichever thread allocated next, the frame thread's launch included.)"""
    global _pause_users, _pause_resume, _pause_freeze
    with _pause_lock:
        if _pause_users == 0:
            _pause_resume = gc.isenabled()
            _pause_freeze = False
            gc.disable()
        _pause_users += 1
        _pause_freeze = _pause_freeze or build


def resume_collector() -> None:
    """End a ``pause_collector``."""
    global _pause_users
    with _pause_lock:
        _pause_users -= 1
        if _pause_users == 0 and _pause_resume:
            if _pause_freeze:
                gc.freeze()  # before collection is on: its first pass would scan the whole build
            gc.enable()


class CollectorFreeze:
    """Freezes the collector's tracked objects after each build the engine swaps in.

    Args:
        enabled: False: do nothing (``Engine(freeze_collector=False)``).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        #: Freezes done, and undone (full collections see everything again).
        self.freezes = 0
        self.thaws = 0
        self._since_thaw = 0

    def after_build(self) -> None:
        """Freeze what the collector tracks now (a build was applied); every ``THAW_EVERY`` builds,
        undo the freeze instead."""
        if not self.enabled:
            return
        if self._since_thaw >= THAW_EVERY:
            gc.unfreeze()  # the next full collection scans everything once, and frees frozen cycles
            self.thaws += 1
            self._since_thaw = 0
            return
        gc.freeze()
        self.freezes += 1
        self._since_thaw += 1

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """No automatic collection while a build runs (it would hold the GIL the frame thread waits
        for); at the end, what the build made is frozen and collection is on again, unless another
        build still runs or the collector was off before."""
        if not self.enabled:
            yield
            return
        pause_collector(build=True)
        try:
            yield
        finally:
            resume_collector()
