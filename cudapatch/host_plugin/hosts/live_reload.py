"""PatchReloader: when a patch file edited during a run is applied, and what a failed edit does.

The standalone host polls its patch file a few times a second. The rules, from the README's promise
that editing never ends the run:

- An edit that fails in any way (unreadable file, TOML error, a value a block refuses, and any
  exception a bug lets through) is logged (with its traceback when it is not a cudapatch error),
  kept in ``errors`` and shown in ``status``; the last good patch keeps running. ``apply_patch``
  makes that true of the engine too: it refuses an edit before changing anything, or undoes it.
- An edit that empties a patch that has operators is most likely a half-finished save (an editor
  truncates, then writes). It is held: applied only once the file is saved empty a second time, or
  stays empty for ``empty_hold_s`` (1 s). Until then ``status`` says it is held.

The clock is injectable, so these rules are tested without waiting.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from ...errors import CudapatchError, PatchFileError
from ..patch import Patch

__all__ = ["PatchReloader", "PATCH_POLL_S", "EMPTY_HOLD_S"]

log = logging.getLogger("cudapatch.host")

PATCH_POLL_S = 0.25
EMPTY_HOLD_S = 1.0

_Stamp = tuple[int, int, int]


def file_stamp(path: Path) -> _Stamp | None:
    """What tells a file's versions apart (mtime, size, inode); None when it cannot be read."""
    try:
        st = os.stat(path)
    except (OSError, ValueError):
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino


class PatchReloader:
    """Watches one patch file and applies its edits to a running patch.

    Args:
        path: The patch file (None: nothing to watch; ``poll`` does nothing).
        current: The patch running now.
        load: Reads and validates the file (``load_patch`` with the host's registry).
        apply: Applies a new patch given the old one, returning counts of what changed (``apply_patch``).
        clock: Seconds, monotonic (``time.monotonic``; tests pass a fake one).
        poll_s: Least time between two looks at the file.
        empty_hold_s: How long an edit that empties the patch is held before it is applied.
    """

    def __init__(
        self,
        path: Path | None,
        current: Patch,
        *,
        load: Callable[[Path], Patch],
        apply: Callable[[Patch, Patch], dict[str, int]],
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = PATCH_POLL_S,
        empty_hold_s: float = EMPTY_HOLD_S,
    ) -> None:
        self.path = path
        self.patch = current
        self._load = load
        self._apply = apply
        self._clock = clock
        self.poll_s = poll_s
        self.empty_hold_s = empty_hold_s
        self._seen = file_stamp(path) if path is not None else None
        self._next_poll = 0.0
        self._held_since: float | None = None
        self._held_stamp: _Stamp | None = None
        #: Edits applied so far.
        self.reloads = 0
        #: Every edit that was refused, oldest first.
        self.errors: list[PatchFileError] = []
        #: One line on the state of live editing, for the host to show.
        self.status = "patch loaded"

    @property
    def held(self) -> bool:
        """Whether an edit that empties the patch is being held."""
        return self._held_since is not None

    def poll(self, *, force: bool = False) -> bool:
        """Apply the file's edit if it changed (looked at no more often than ``poll_s``, unless
        ``force``). Returns whether an edit was applied. Never raises for what the file holds."""
        if self.path is None:
            return False
        now = self._clock()
        if not force and now < self._next_poll:
            return False
        self._next_poll = now + self.poll_s
        stamp = file_stamp(self.path)
        changed = stamp != self._seen
        if not changed and not force and not self.held:
            return False
        self._seen = stamp
        try:
            new = self._load(self.path)
        except Exception as exc:
            self._release()
            return self._refuse(exc)
        if not new.operators and self.patch.operators:
            if not self.held:
                self._held_since, self._held_stamp = now, stamp
                self.status = (
                    f"{self.path}: the patch was emptied; holding the edit until the file is saved empty "
                    f"again or stays empty for {self.empty_hold_s:g} s"
                )
                log.warning("%s", self.status)
                return False
            second_save = stamp != self._held_stamp
            if not second_save and now - self._held_since < self.empty_hold_s:  # type: ignore[operator]
                return False
        self._release()
        try:
            counts = self._apply(new, self.patch)
        except Exception as exc:
            return self._refuse(exc)
        self.patch = new
        self.reloads += 1
        changes = ", ".join(f"{v} {k}" for k, v in counts.items() if v) or "no changes"
        self.status = f"patch reloaded ({changes})"
        log.info("patch reloaded: %s", changes)
        return True

    def adopt(self, patch: Patch) -> None:
        """Take ``patch`` as the one running now, and the file as it is now as seen: the host wrote
        it (the node editor's write-back), so the next poll finds no change to apply."""
        self.patch = patch
        if self.path is not None:
            self._seen = file_stamp(self.path)
        self._release()

    def _release(self) -> None:
        self._held_since = self._held_stamp = None

    def _refuse(self, exc: Exception) -> bool:
        if isinstance(exc, PatchFileError):
            err = exc
            log.error("patch not applied, the last good patch keeps running: %s", err)
        elif isinstance(exc, CudapatchError):
            err = PatchFileError(str(exc), file=str(self.path))
            log.error("patch not applied, the last good patch keeps running: %s", err)
        else:  # a bug let something through: keep running, and keep the traceback for the report
            err = PatchFileError(f"{type(exc).__name__}: {exc}", file=str(self.path))
            log.error("patch not applied, the last good patch keeps running: %s", err, exc_info=exc)
        self.errors.append(err)
        self.status = f"edit not applied, the last good patch keeps running: {err}"
        return False
