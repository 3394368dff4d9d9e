"""When the host starts a new engine process after the old one ended, and with what disabled.

A GPU fault ends only the engine child (CUDA refuses a process after a sticky fault, DESIGN.md §9);
the host starts another one with the faulting block disabled. ``RestartPolicy`` holds that rule in
pure data, tested with a fake child:

- A child that reported a fault names the blocks to disable (found by its engine's replay,
  ``engine/recovery.py``); they stay disabled in every later child until their code changes or
  they are removed, as in a normal engine (``FaultState``).
- A child that ended without a report (killed, crashed outside CUDA, a fault the replay could not
  pin) is restarted as it was; the reason becomes an engine diagnostic.
- Restarts are limited: more than ``max_restarts`` within ``window_s`` seconds means the patch
  kills every child (a fault the replay cannot attribute, say): the engine is then *lost*, says
  why, and the host's ``update()`` goes on doing nothing, as a lost normal engine does.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["RestartPolicy", "ChildEnd"]


@dataclass(frozen=True)
class ChildEnd:
    """How a child ended.

    Attributes:
        how: In words (``exited with code 3``, ``killed by SIGSEGV``).
        disabled: Host block id → reason, from the child's fault report (empty without one).
        diagnostics: The child's last diagnostics (records), from its fault report.
    """

    how: str
    disabled: dict[int, str] = field(default_factory=dict)
    diagnostics: tuple = ()


class RestartPolicy:
    """Decides whether to restart, and accumulates the blocks every new child starts with disabled.

    Args:
        max_restarts: Restarts allowed within ``window_s``.
        window_s: The window (seconds).
        clock: Monotonic seconds (tests pass a fake).
    """

    def __init__(self, max_restarts: int = 5, window_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.max_restarts = max_restarts
        self.window_s = window_s
        self._clock = clock
        self._times: deque[float] = deque()
        #: Host block id → reason: disabled in every child from now on.
        self.disabled: dict[int, str] = {}
        #: Why the engine gave up (None while it restarts).
        self.lost: str | None = None
        #: Children that ended without being asked to.
        self.ends = 0

    def child_ended(self, end: ChildEnd) -> bool:
        """Record an unrequested end; returns whether to start a new child."""
        self.ends += 1
        self.disabled.update(end.disabled)
        now = self._clock()
        self._times.append(now)
        while self._times and now - self._times[0] > self.window_s:
            self._times.popleft()
        if len(self._times) > self.max_restarts:
            self.lost = (
                f"the engine process ended {len(self._times)} times within {self.window_s:.0f} s "
                f"(last: {end.how}); not restarting it: edit or remove the faulting blocks, then "
                "create the engine again"
            )
            return False
        return True

    def code_changed(self, block_id: int) -> bool:
        """A block's code changed or it was removed: it gets a new chance. Returns whether it was disabled."""
        return self.disabled.pop(block_id, None) is not None
