"""An isolated engine: the engine in a child process, so a GPU fault never takes the host down.

``Engine(isolated=True)`` returns an ``IsolatedEngine`` (``host.py``): the same API, the patch
mirrored to the child as edit messages (``mirror.py``, ``protocol.py``), outputs shared through
CUDA IPC with no copy (``ipc.py``), a new child with the faulting block disabled after a fault
(``policy.py``). Its children are started and its CUDA work done by ``host_side.py``; each child is
seen through ``process.py`` and runs ``child.py``. See docs/faults.md, "An isolated engine".
"""

from __future__ import annotations

from .host import IsolatedEngine, NotInIsolatedEngine
from .policy import RestartPolicy

__all__ = ["IsolatedEngine", "NotInIsolatedEngine", "RestartPolicy"]
