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
reference counting, which is how a replaced plan goes. Cyclic garbage frozen with them would stay, so
the freeze is undone (``gc.unfreeze()``: the next full collection scans everything once) whenever the
permanent generation has grown past twice its size after the first freeze plus a margin.
``Engine(freeze_collector=False)`` leaves the collector alone (the freeze is process-wide: a host's
own objects are frozen with the patch's).
"""

from __future__ import annotations

import gc

__all__ = ["CollectorFreeze"]

#: Frozen objects the permanent generation may grow by (beyond twice its first size) before the
#: freeze is undone, so that cycles frozen by mistake are collected after all.
GROWTH_MARGIN = 200_000


class CollectorFreeze:
    """Freezes the collector's tracked objects after each build the engine swaps in.

    Args:
        enabled: False: do nothing (``Engine(freeze_collector=False)``).
    """

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._base: int | None = None  # frozen objects right after the first freeze of a cycle
        #: Freezes done, and undone (full collections allowed again).
        self.freezes = 0
        self.thaws = 0

    def after_build(self) -> None:
        """Freeze what the collector tracks now (a new graph was swapped in); undo the freeze once the
        permanent generation grew past its bound."""
        if not self.enabled:
            return
        gc.freeze()
        self.freezes += 1
        frozen = gc.get_freeze_count()
        if self._base is None:
            self._base = frozen
        elif frozen > 2 * self._base + GROWTH_MARGIN:
            gc.unfreeze()  # the next full collection scans everything once, and frees frozen cycles
            self._base = None
            self.thaws += 1
