"""CompositeReloader: composite files edited during a run are applied to the operators using them.

The patch file names a composite by its path, so editing the composite file leaves the patch's text
unchanged and the patch reloader sees nothing. This one stats the composite files of every
composite operator (their nested composite files too) a few times a second; when one changed, the
operator's block re-reads it (``Block.refresh``): exposed values the user set are kept, links to
ports that no longer exist are dropped, and the engine rebuilds. A file that no longer loads, or a
re-read that fails in any other way (a bug included: its traceback is logged), is logged and kept in
``errors`` as a ``PatchFileError`` naming the composite file; the composite keeps running as it was.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ...blocks.composite import Composite
from ...errors import CudapatchError, PatchFileError
from ..composite_file import FileComposite
from .live_reload import PATCH_POLL_S, file_stamp

__all__ = ["CompositeReloader", "composite_files"]

log = logging.getLogger("cudapatch.host")

_Stamps = dict[Path, tuple[int, int, int] | None]


def composite_files(block: Composite) -> Iterator[Path]:
    """The composite files ``block`` is made of: its own, then those of the composites inside it."""
    if isinstance(block, FileComposite):
        own = block.composite_file()
        if own is not None:
            yield Path(own)
    if block.layout is not None:
        for inner in block.layout.blocks.values():
            if isinstance(inner, Composite):
                yield from composite_files(inner)


class CompositeReloader:
    """Re-reads the composite files of a host adapter's operators when they change.

    Args:
        adapter: The host adapter whose composite operators are watched.
        clock: Seconds, monotonic (tests pass a fake one).
        poll_s: Least time between two looks at the files.
    """

    def __init__(self, adapter: object, *, clock: Callable[[], float] = time.monotonic, poll_s: float = PATCH_POLL_S):
        self._adapter = adapter
        self._clock = clock
        self.poll_s = poll_s
        self._next_poll = 0.0
        self._seen: dict[tuple[str, int], dict[Path, tuple[int, int, int] | None]] = {}
        #: Composite operators re-read so far.
        self.reloads = 0
        #: Every composite edit that was refused (the composite kept running as it was).
        self.errors: list[PatchFileError] = []

    def poll(self, *, force: bool = False) -> int:
        """Re-read every composite operator whose files changed since the last look (at most every
        ``poll_s``, unless ``force``). Returns how many were re-read. Never raises for a failed re-read."""
        now = self._clock()
        if not force and now < self._next_poll:
            return 0
        self._next_poll = now + self.poll_s
        done = 0
        seen: dict[tuple[str, int], dict[Path, tuple[int, int, int] | None]] = {}
        adapter = self._adapter
        for op in adapter.operators():  # type: ignore[attr-defined]
            block = adapter.block(op)  # type: ignore[attr-defined]
            if not isinstance(block, Composite):
                continue
            key = (op, block.id)
            stamps = {f: file_stamp(f) for f in composite_files(block)}
            before = self._seen.get(key)
            seen[key] = stamps
            if before is None or before == stamps:
                continue
            try:
                block.refresh()
            except Exception as exc:  # any failure, a bug's included: a live edit never ends the run
                self._refuse(op, exc, _changed(before, stamps) or block.composite_file())
                continue
            seen[key] = {f: file_stamp(f) for f in composite_files(block)}  # a nested file may have come or gone
            done += 1
            log.info("composite '%s' reloaded", op)
        self._seen = seen
        self.reloads += done
        return done

    def _refuse(self, op: str, exc: Exception, file: str | None) -> None:
        """Keep ``exc`` in ``errors`` as a file error naming the composite file (``file``: the one that
        changed, when the error names none); a bug's traceback goes to the log."""
        if isinstance(exc, PatchFileError):
            err = exc
        elif isinstance(exc, CudapatchError):
            err = PatchFileError(exc.message, file=exc.file or file, line=exc.line, block=exc.block, param=exc.param)
        else:  # a bug let something through: the composite keeps running, the traceback is kept for the report
            err = PatchFileError(f"{type(exc).__name__}: {exc}", file=file, block=op)
        self.errors.append(err)
        log.error(
            "composite '%s' not reloaded, it keeps running as it was: %s",
            op,
            err,
            exc_info=None if isinstance(exc, CudapatchError) else exc,
        )


def _changed(before: _Stamps, after: _Stamps) -> str | None:
    """The first composite file whose stamp differs (one that came, went or was edited)."""
    for f in (*after, *before):
        if before.get(f, False) != after.get(f, False):
            return str(f)
    return None
