"""StructureTier: when and where a structure edit is built, and how its outcome reaches the frame.

A structure edit (a block added or removed, a link, a size) needs a build (``build.py``: Warm resize,
growth, ``cuGraphExecUpdate`` or Cold). A live engine hands it to the ``BuildWorker``
(``build_thread.py``) and keeps launching the running graph; the frame thread takes the outcome at a
frame boundary (``finish``), and edits made meanwhile coalesce into the next build. Scripts
(``wait_for_compile``) and ``Engine(background_builds=False)`` build in the edit frame instead.
While a build runs, the Hot and Code tiers remember what they apply to the running graph
(``begin_carry``), and ``finish`` re-applies it to the new graph before it launches.

Frame thread only: every method here runs inside ``Engine.update`` (or ``wait_ready``, ``close``,
fault recovery) under the engine's graph lock.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable
from functools import partial
from typing import Any

from .build import BuildOutcome, GraphBuilds
from .build_thread import BuildWorker
from .collector import CollectorFreeze
from .context import Context
from .garbage import drop_each, drop_gradually
from .profiling import ProfilingLevel
from .resources import DeviceResources, close_graphs
from .stats import BuildTiming, log_build
from .tiers import CodeTier, ParamTier

__all__ = ["StructureTier"]

log = logging.getLogger("cudapatch.engine")


class StructureTier:
    """The structure edits of one engine.

    Args:
        builds: Prepares and applies builds.
        worker: The build thread.
        params: The Hot/Warm tier (its values set during a build are carried to the new graph).
        code: The Code tier (its swaps during a build are carried to the new graph).
        resources: The running graph, and the retired graphs reaped between builds.
        context: The patch and its dirty tracker.
        timing: Where the last build spent its host time.
        collector: Freezes Python's collector after each build swapped in (``collector.py``).
    """

    def __init__(
        self,
        *,
        builds: GraphBuilds,
        worker: BuildWorker,
        params: ParamTier,
        code: CodeTier,
        resources: DeviceResources,
        context: Context,
        timing: BuildTiming,
        collector: CollectorFreeze | None = None,
    ) -> None:
        self._collector = collector if collector is not None else CollectorFreeze(False)
        self._builds = builds
        self._worker = worker
        self._params = params
        self._code = code
        self._resources = resources
        self._context = context
        self._timing = timing
        self._stocked: Callable[[], Any] = lambda: None  # the graph spares were last made for (a weak reference)

    @property
    def building(self) -> bool:
        """A build runs on the build thread."""
        return self._worker.busy

    def reap(self, *, graphs: bool = True, off_thread: bool = False) -> None:
        """Close retired graphs the GPU is done with, unless a build in flight may borrow from them
        (``graphs=False``: only the other retired things; a build about to start closes the idle
        graphs on its own thread). ``off_thread``: the build thread closes them, after the next frame
        (an edit frame that needs no build, a bypass say, would otherwise spend 12 ms closing a
        10,000-node graph).

        Raises:
            CudaError: closing a graph failed.
        """
        if not self._worker.busy:
            t0 = time.perf_counter()
            if graphs and off_thread:
                idle = self._resources.take_idle()
                if idle:
                    self._worker.later(lambda: (close_graphs(idle), drop_gradually(idle)))
            self._resources.reap(graphs=graphs)
            self._timing.reap_ms = (time.perf_counter() - t0) * 1e3

    def apply(self, level: ProfilingLevel, *, here: bool, wait_for_compile: bool) -> bool:
        """The structure edit pending: start a build on the build thread, or (``here``) build it now.
        With a build in flight, the edit waits and coalesces into the next one.

        Returns:
            True when a build made here applied every pending change (nothing else to do this frame).

        Raises:
            CudaError: a driver call failed.
        """
        worker, dirty = self._worker, self._context.dirty
        if here:
            self._resources.take_garbage()  # freed here: this frame builds anyway
            if worker.busy:  # switched to building here while one was in flight: take it first
                worker.wait()
                self.finish()
            if self._builds.rebuild(level, wait_for_compile=wait_for_compile):
                self._collector.after_build()
                self.log()
                return True
            dirty.defer_structure()  # a failed rebuild is not retried every frame; the next edit retries
        elif not worker.busy:
            self.start(level)
        return False

    def start(self, level: ProfilingLevel) -> None:
        """Freeze the patch and hand the build to the build thread (in an edit frame)."""
        job = self._builds.job(level, off_thread=True)
        self._context.dirty.defer_structure()  # taken: edits from now on mark it again and coalesce
        self._params.begin_carry()
        self._code.begin_carry()
        builds = self._builds
        idle = self._resources.take_idle()
        garbage = self._resources.take_garbage()

        worker = self._worker

        def build() -> BuildOutcome:
            # The retired graphs the GPU is done with, and what the frame thread no longer uses: freed
            # off the frame thread, after the build and between two frames (destroying an executable
            # graph holds the driver's lock, which the frame's launch would wait for).
            worker.defer(lambda: close_graphs(idle))  # (device memory: closed before the next build)
            worker.defer(lambda: drop_gradually(idle, worker.preempted), yields=True)
            worker.defer(lambda: drop_gradually(garbage, worker.preempted), yields=True)
            for g in idle:  # their parameter storages are this build's (less than half the cost of new ones)
                g.give_back_stores()
            out = builds.prepare(job)
            # The planning drafts (``NodeCache.spent``): freed one by one right after the next frame,
            # long before the one after it. (A piece at a time, ``drop_gradually``, cost ten times
            # the CPU and held the next builds back: fused 10,000-block edits went live 40-90 frames
            # late instead of 10-30.)
            worker.defer(partial(drop_each, out.spent))
            out.spent = []
            return out

        self._worker.submit(build)

    def finish(self) -> None:
        """Apply the build the build thread finished (at a frame boundary): swap in the new graph or
        patch the running one, re-apply the Hot values and Code swaps made meanwhile; a failed build
        keeps the running graph and puts its errors on the blocks.

        Raises:
            CudaError: a driver call failed.
        """
        try:
            out: BuildOutcome = self._worker.take()
            ok = self._builds.finish(out)
        except BaseException:
            self._params.end_carry(None)
            self._code.end_carry(None)
            raise
        g = self._resources.graph if ok else None
        self._code.end_carry(g)  # kernels recompiled during the build: their new functions, then values
        self._params.end_carry(g)
        if ok:
            self._collector.after_build()
            self._stock_spares()
            self.log()

    def _stock_spares(self) -> None:
        # The first graph a build thread made for a patch (it replaced none): spare parameter storages
        # for the build of the first edit, made on the build thread between frames. Later builds load
        # the storages of the graph they replace (``CompiledGraph.give_back_stores``): a 1,000-block
        # build's realize took 23 ms with new storages, 15 ms with spares (CPU machine). Once per graph
        # (a Warm resize keeps the graph), and not for builds on the frame thread (no build thread).
        g, worker = self._resources.graph, self._worker
        if g is not None and self._stocked() is not g and not self._resources.retiring:
            self._stocked = weakref.ref(g)
            worker.later(lambda: g.stock_spares(worker.preempted, lambda: worker.closing), yields=True)

    def drop(self) -> None:
        """Wait for the build in flight and throw its outcome away (closing, or a fault resets the
        context); the patch is marked to build again. Work handed to the build thread (retired
        graphs to close, a finished build's deferred work) is waited for too: after a reset it would
        destroy handles of the dead context, which the new one may reuse."""
        worker = self._worker
        worker.wait()
        if not worker.busy:
            return
        try:
            out: BuildOutcome = worker.take()
        except Exception as exc:  # nobody will use it: say so, and go on
            log.warning("a build in flight failed while the engine dropped it: %s", exc)
        else:
            out.discard()
        self._params.end_carry(None)
        self._code.end_carry(None)
        self._context.dirty.mark_structure()

    def log(self) -> None:
        """The one INFO line of the build just applied."""
        g = self._resources.graph
        if g is not None:
            log_build(log, self._timing, len(g.plan.block_order), len(self._context.registry))
