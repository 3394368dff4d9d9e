"""FileWatcher: notices edits to kernel files (and their includes) and reports them, debounced.

A polling thread compares ``(mtime, size)`` of every watched path a few times per second. A
change is reported once the file has been stable for ``debounce`` seconds, so an editor's
truncate-then-write (a half-written file) is seen as one edit. Deleting a file is a change too.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Hashable, Iterable
from pathlib import Path

__all__ = ["FileWatcher"]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size


class FileWatcher:
    """Watches groups of files under hashable keys; ``events()`` returns the keys whose files changed.

    Args:
        interval: Seconds between polls.
        debounce: Seconds a changed file must stay unchanged before it is reported.
    """

    def __init__(self, *, interval: float = 0.05, debounce: float = 0.15) -> None:
        self.interval = interval
        self.debounce = debounce
        self._groups: dict[Hashable, tuple[Path, ...]] = {}
        self._stamps: dict[Path, tuple[int, int] | None] = {}
        self._changed_at: dict[Hashable, float] = {}
        self.ready: list[Hashable] = []  # keys with settled changes; non-empty means events() has news
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cudapatch-watch", daemon=True)
        self._thread.start()

    def watch(self, key: Hashable, paths: Iterable[Path]) -> None:
        """Watch ``paths`` under ``key`` (replacing what ``key`` watched before)."""
        paths = tuple(Path(p) for p in paths)
        with self._lock:
            self._groups[key] = paths
            for p in paths:
                if p not in self._stamps:
                    self._stamps[p] = _stamp(p)

    def unwatch(self, key: Hashable) -> None:
        """Stop watching ``key``; unknown keys are ignored."""
        with self._lock:
            self._groups.pop(key, None)
            self._changed_at.pop(key, None)
            live = {p for ps in self._groups.values() for p in ps}
            for p in [p for p in self._stamps if p not in live]:
                del self._stamps[p]

    def keys(self) -> set[Hashable]:
        with self._lock:
            return set(self._groups)

    def events(self) -> list[Hashable]:
        """Keys whose files changed (and settled) since the last call. Never blocks for long."""
        if not self.ready:
            return []
        with self._lock:
            out, self.ready = self.ready, []
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> None:
        """One polling pass (the thread calls this; tests may too)."""
        now = time.monotonic()
        with self._lock:
            changed_paths = set()
            for p, old in list(self._stamps.items()):
                new = _stamp(p)
                if new != old:
                    self._stamps[p] = new
                    changed_paths.add(p)
            for key, paths in self._groups.items():
                if changed_paths.intersection(paths):
                    self._changed_at[key] = now  # (re)start the debounce window
            for key, t in list(self._changed_at.items()):
                if now - t >= self.debounce:
                    del self._changed_at[key]
                    self.ready.append(key)

    def close(self) -> None:
        """Stop the polling thread; idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
