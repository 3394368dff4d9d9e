"""DiagnosticBoard: every diagnostic of an engine, by where it comes from, and the one place that
puts them on the blocks.

Diagnostics come from several places with different lifetimes, and the board keeps them apart so
replacing one kind never drops another:

- **build**: the last build's plan diagnostics and measurements (low occupancy), or why it failed;
  replaced by the next build. A launch error joins them.
- **recapture**: library calls whose re-capture failed (their previous capture keeps running);
  replaced at each re-capture, cleared by a build.
- **block errors**: errors that stay on a block until it is fixed, whatever builds in between
  (a kernel file whose new signature cannot re-describe its block).
- **faults** (read from ``FaultState``) and **kernel compiles** (read from the ``KernelTracker``):
  those objects own the state; the board only reads it when it publishes.
- **per-frame warnings**: what the newest completed frame showed (append outputs nearly full, a
  While stopped at ``Max``); replaced when the engine shows a frame (``Engine.show_frame``, which a
  host calls at its frame boundary: never ``update()``, never ``stats()``, which only reads).

``publish`` merges them (in that order, without duplicates), logs each new one once, and sets every
block's state and message: nothing else writes those. Pure: tested without a GPU
(``tests/unit/test_board.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Protocol

from ..blocks.block import Block, BlockState
from .diagnostics import Diagnostic, DiagnosticLog
from .faults import FaultState
from .registry import BlockRegistry
from .slices import set_of

__all__ = ["DiagnosticBoard", "KernelDiagnostics", "RunningChange", "running_change"]


class KernelDiagnostics(Protocol):
    """What the board reads of the kernel compiles (``KernelTracker``)."""

    diag_version: int  # bumped whenever ``diagnostics()`` changes

    def diagnostics(self) -> tuple[Diagnostic, ...]: ...


@dataclass(frozen=True)
class RunningChange:
    """The blocks a new graph runs, made off the frame thread (``running_change``), with how they differ
    from what the board showed running when it was made: the swap frame then touches only those (a
    set of 10,000 ids and its difference with the last one were 0.5 ms of that frame, CPU machine)."""

    ids: frozenset[int]
    base: frozenset[int]
    changed: frozenset[int]


def running_change(block_order: Iterable[int], base: frozenset[int]) -> RunningChange:
    """``RunningChange`` of a plan running ``block_order`` against ``base`` (``DiagnosticBoard.running``)."""
    # (in slices and comprehensions: the set and its difference were C calls of 0.6-0.9 ms each at
    # 10,000 blocks on the build thread, CPU machine, holding the interpreter from the frames)
    ids = frozenset(set_of(block_order))
    changed = frozenset({i for i in ids if i not in base} | {i for i in base if i not in ids})
    return RunningChange(ids, base, changed)


class DiagnosticBoard:
    """The diagnostics of one engine.

    Args:
        blocks: The patch's blocks; ``publish`` writes their state and message.
        kernels: Compile diagnostics (read at each publish).
        faults: Fault diagnostics (read at each publish).
        logger: Where each new diagnostic is logged once.
    """

    def __init__(
        self, blocks: BlockRegistry, *, kernels: KernelDiagnostics, faults: FaultState, logger: logging.Logger
    ) -> None:
        self._blocks = blocks
        self._kernels = kernels
        self._faults = faults
        self._log = DiagnosticLog(logger, names=lambda bid: b.name if (b := blocks.get(bid)) is not None else None)
        self._build: tuple[Diagnostic, ...] = ()
        self._recapture: tuple[Diagnostic, ...] = ()
        self._block_errors: dict[tuple[int, str], Diagnostic] = {}
        self._frame: tuple[Diagnostic, ...] = ()
        self._running: frozenset[int] = frozenset()
        self._kernel_version = -1
        # What the last publish wrote, so the next writes only the blocks whose state may change: at
        # 10,000 blocks a loop over all of them costs the frame that swaps a build in ~8 ms.
        self._marked: set[int] = set()  # registered blocks that showed diagnostics
        self._shown_running: frozenset[int] = frozenset()
        self._published = False
        #: Everything published last, in publishing order (read it; the board replaces it).
        self.current: tuple[Diagnostic, ...] = ()

    # -- persistent diagnostics ------------------------------------------------------------------------
    @property
    def running(self) -> frozenset[int]:
        """The blocks shown running (the base of a ``running_change`` made on another thread)."""
        return self._shown_running

    def build_done(self, diags: Iterable[Diagnostic], running: Collection[int] | RunningChange) -> None:
        """A build swapped in a graph running ``running`` (block ids, or a ``RunningChange`` made off the
        frame thread); ``diags`` replace the last build's."""
        self._build = tuple(diags)
        self._recapture = ()
        changed = None
        if isinstance(running, RunningChange):
            self._running = running.ids
            if running.base is self._shown_running:  # what it was compared with is what the blocks show
                changed = running.changed
        else:
            self._running = frozenset(running)
        self._publish(changed)

    def build_failed(self, diags: Iterable[Diagnostic]) -> None:
        """A build failed: ``diags`` say why; the graph running before keeps running."""
        self._build = tuple(diags)
        self._recapture = ()
        self.publish()

    def graph_gone(self) -> None:
        """No graph runs any more (the context was reset or lost); the last build's diagnostics stay."""
        self._running = frozenset()
        self.publish()

    def add_error(self, diag: Diagnostic) -> None:
        """An error of the running graph (a failed launch), kept until the next build."""
        self._build += (diag,)
        self.publish()

    def recapture_errors(self, diags: Iterable[Diagnostic]) -> None:
        """The library calls whose re-capture failed now (replacing the last re-capture's)."""
        diags = tuple(diags)
        if diags != self._recapture:
            self._recapture = diags
            self.publish()

    def set_block_error(self, diag: Diagnostic) -> None:
        """An error that stays on its block until ``clear_block_error`` (one per block and code)."""
        assert diag.block_id is not None
        self._block_errors[(diag.block_id, diag.code)] = diag
        self.publish()

    def clear_block_error(self, block_id: int, code: str | None = None) -> None:
        """Drop ``block_id``'s lasting error of ``code`` (all of them when None)."""
        keys = [k for k in self._block_errors if k[0] == block_id and (code is None or k[1] == code)]
        for key in keys:
            del self._block_errors[key]
        if keys:
            self.publish()

    # -- per-frame warnings --------------------------------------------------------------------------
    def frame_warnings(self, diags: tuple[Diagnostic, ...]) -> None:
        """What the newest completed frame showed, replacing the previous frame's warnings."""
        if diags != self._frame:
            self._frame = diags
            self.publish()

    def with_frame(self, diags: tuple[Diagnostic, ...]) -> tuple[Diagnostic, ...]:
        """What ``current`` would be with ``diags`` as the per-frame warnings: a read (``Engine.stats``
        reports them with the frame they are of), nothing published or logged."""
        if diags == self._frame and self._kernels.diag_version == self._kernel_version:
            return self.current
        return self._merged(diags)

    # -- publishing -----------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Publish if the kernel compile diagnostics changed since the last publish (a swapped-in fix
        changes no graph, yet clears its block's error)."""
        if self._kernels.diag_version != self._kernel_version:
            self.publish()

    def publish(self) -> None:
        """Merge every source, log new diagnostics once, and set each block's state and message."""
        self._publish(None)

    def _publish(self, changed: frozenset[int] | None) -> None:
        # ``changed``: the blocks whose running state differs from the shown one, if known (``build_done``)
        self._kernel_version = self._kernels.diag_version
        diags = self.current = self._merged(self._frame)
        self._log.emit(diags)
        self._log.forget(set(diags))
        blocks, running = self._blocks, self._running
        on: dict[int, list[Diagnostic]] = {}  # registered block id -> the diagnostics it shows, in order
        for d in diags:
            b = self._shown_on(d.block_id)
            if b is not None:
                on.setdefault(b.id, []).append(d)
        added = blocks.take_added()
        if self._published:  # only what may have changed: diagnostics, running state, new blocks
            if changed is None:
                changed = running ^ self._shown_running
            touched: set[int] = self._marked | on.keys() | changed | added
        else:
            touched = {b.id for b in blocks}
        for bid in touched:
            b = blocks.get(bid)
            if b is None or b not in blocks:
                continue
            state, message = (BlockState.OK if bid in running else BlockState.NOT_COMPILED), ""
            for d in on.get(bid, ()):
                if d.severity == "error":
                    state = BlockState.ERROR
                elif d.severity == "warning" and state is BlockState.OK:
                    state = BlockState.WARNING
                if not message or d.severity == "error":
                    message = d.message.splitlines()[0]
            b.debug.state, b.debug.message = state, message
        self._marked, self._shown_running, self._published = set(on), running, True

    def _merged(self, frame: tuple[Diagnostic, ...]) -> tuple[Diagnostic, ...]:
        """Every source in publishing order, without duplicates, with ``frame`` as the per-frame warnings."""
        merged = (
            self._build
            + self._recapture
            + tuple(self._block_errors.values())
            + self._faults.diagnostics()
            + self._kernels.diagnostics()
            + frame
        )
        return tuple(dict.fromkeys(merged))

    def _shown_on(self, block_id: int | None) -> Block | None:
        """The registered block showing ``block_id``'s diagnostics: itself, or the composite holding it."""
        b = self._blocks.get(block_id) if block_id is not None else None
        if b is None or b in self._blocks:
            return b
        found = self._blocks.owner(block_id)  # type: ignore[arg-type]
        return found[0] if found is not None else None

    def of_block(self, block_id: int) -> tuple[Diagnostic, ...]:
        """The published diagnostics of one block (a composite's include its inner blocks')."""
        comp = self._blocks.composites.get(block_id)
        ids = {block_id} | ({b.id for _, b in comp.inner_blocks()} if comp is not None else set())
        return tuple(d for d in self.current if d.block_id in ids)
