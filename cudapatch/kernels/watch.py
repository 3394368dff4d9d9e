"""FileWatcher: notices edits to kernel files (and their includes) and reports them, debounced.

A polling thread compares ``(mtime, size)`` of every watched path a few times per second; with
nothing to watch it sleeps until something is (each wake-up takes the GIL, which a frame thread
returning from a driver call may then wait for). A change is reported once the file has been
stable for ``debounce`` seconds, so an editor's truncate-then-write (a half-written file) is seen
as one edit. Deleting a file is a change too.
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
    except (OSError, ValueError):  # ValueError: a NUL byte in the path; watched as a missing file
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
        # Paths are kept as strings: hashing a Path costs a microsecond, and a patch watches hundreds.
        self._groups: dict[Hashable, tuple[str, ...]] = {}
        self._stamps: dict[str, tuple[int, int] | None] = {}
        self._users: dict[str, int] = {}  # path -> how many keys watch it
        self._changed_at: dict[Hashable, float] = {}
        self.ready: list[Hashable] = []  # keys with settled changes; non-empty means events() has news
        # The lock guards the dicts only; the polling thread stats files without holding it, so a
        # frame thread that (un)watches never waits for a polling pass.
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()  # set by watch() and close(): the idle thread looks again
        self._thread = threading.Thread(target=self._run, name="cudapatch-watch", daemon=True)
        self._thread.start()

    def watch(self, key: Hashable, paths: Iterable[Path | str]) -> None:
        """Watch ``paths`` under ``key`` (replacing what ``key`` watched before)."""
        new = tuple(os.fspath(p) for p in paths)
        fresh = {p: _stamp(p) for p in new if p not in self._stamps}  # outside the lock: stat may be slow
        with self._lock:
            self._drop(key)
            self._groups[key] = new
            for p in new:
                self._users[p] = self._users.get(p, 0) + 1
                if p not in self._stamps:
                    self._stamps[p] = fresh.get(p, _stamp(p))
        self._wake.set()

    def unwatch(self, key: Hashable) -> None:
        """Stop watching ``key``; unknown keys are ignored (without taking the lock)."""
        if key not in self._groups and key not in self._changed_at:
            return
        with self._lock:
            self._drop(key)
            self._changed_at.pop(key, None)

    def _drop(self, key: Hashable) -> None:
        for p in self._groups.pop(key, ()):  # with the lock held
            left = self._users.get(p, 0) - 1
            if left > 0:
                self._users[p] = left
            else:
                self._users.pop(p, None)
                self._stamps.pop(p, None)

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
        while not self._stop.is_set():
            self._wake.clear()
            if not self._stamps and not self._changed_at:
                self._wake.wait()  # nothing to poll: no wake-ups until watch() or close()
                continue
            if self._stop.wait(self.interval):
                break
            self.poll()

    def poll(self) -> None:
        """One polling pass (the thread calls this; tests may too)."""
        now = time.monotonic()
        with self._lock:
            paths = list(self._stamps.items())
        seen = [(p, old, _stamp(p)) for p, old in paths]  # no lock held while stat runs
        with self._lock:
            changed_paths = set()
            for p, old, new in seen:
                if new != old and p in self._stamps and self._stamps[p] == old:
                    self._stamps[p] = new
                    changed_paths.add(p)
            if changed_paths:
                for key, group in self._groups.items():
                    if changed_paths.intersection(group):
                        self._changed_at[key] = now  # (re)start the debounce window
            for key, t in list(self._changed_at.items()):
                if now - t >= self.debounce:
                    del self._changed_at[key]
                    self.ready.append(key)

    def close(self) -> None:
        """Stop the polling thread; idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)
