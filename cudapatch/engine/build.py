"""GraphBuilds: the Cold tier and the Warm resize, from the patch to the running graph.

A build snapshots the patch (pure data), resolves every kernel (its compiled function, or why it
cannot run yet), and compiles a ``GraphPlan``. If only counts, grids or pointers changed, the plan is
patched into the running executable graph (Warm resize, no instantiation; a buffer that must grow
is reallocated from the pool and its kernels pointed at it); otherwise it is realized
into a new ``CompiledGraph`` that ``DeviceResources.install`` swaps in at this frame boundary. A
failed build keeps the old graph running and puts its errors on the blocks (``DiagnosticBoard``); a
library call that fails to capture leaves its block out (``FaultState``) and the rest is built.

A build has two halves. ``prepare`` (any thread) takes a ``BuildJob`` (the snapshot and what the
frame thread knew when it was taken), resolves kernels, plans, decides whether the running graph
can take the plan in place, and realizes and instantiates a new graph if not; it reads the running
graph's plan and allocations but changes nothing the frame thread uses. ``finish`` (frame thread,
at a frame boundary) applies the ``BuildOutcome``: the Warm patch, or the swap to the new graph, or
the errors. A live engine runs ``prepare`` on its ``BuildWorker`` (DESIGN.md §10) while the old
graph keeps launching; ``rebuild`` runs both halves at once (scripts, ``wait_for_compile``).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import (
    CudaError,
    CudaLaunchError,
    CudaOutOfMemoryError,
    GraphCompileError,
    KernelLoadError,
    LibraryCallError,
)
from ..kernels.pacing import checkpoint
from .board import DiagnosticBoard, RunningChange, running_change
from .built_view import BuiltShower, BuiltView, built_view
from .bypass import BypassIndex
from .compiler import NodeCache, compile_plan
from .compiler.fusion import FUSED_KERNEL
from .context import BlockSnapshot, Context, ExternalBinding, PatchSnapshot
from .diagnostics import Diagnostic, DiagnosticCode
from .executable import PreparedPatch
from .faults import FaultState
from .kernels import KernelTracker
from .plan import GraphPlan
from .profiling import ProfilingLevel
from .realize import CompiledGraph, realize
from .resources import DeviceResources
from .stats import BuildTiming, EngineCounters, occupancy_warnings
from .warm import WarmPatch, WarmRefusal, decide_warm_patch

__all__ = ["BuildJob", "BuildOutcome", "GraphBuilds"]

log = logging.getLogger("cudapatch.engine")

#: How long a build on the build thread waits for the compiles its snapshot asks for. A kernel in the
#: memory or disk cache lands within a frame (the kernel builder works between frames); a real compile
#: (20-40 ms with NVRTC) is not waited for to the end: the build goes on without that block, and the
#: finished compile starts the next one.
COMPILE_WAIT_S = 0.1


@dataclass
class BuildJob:
    """What a build starts from, taken on the frame thread.

    Attributes:
        snap: The patch, frozen.
        level: The profiling level.
        call_failures: Kernel status entries of library calls left out (``FaultState``), by key.
        disabled: Blocks disabled after a GPU fault, with the reason.
        previous: The graph running when the build started (it lends its allocations).
        off_thread: The build runs beside frames that launch and patch ``previous``.
        cold: Skip the Warm decision (the last one was refused at the swap).
        shown: What the blocks showed of the last build when the job was taken (``BuiltShower``).
        kernel_edits: ``KernelTracker.edits`` before the snapshot (``resolve``'s ``since``).
        started: ``time.perf_counter()`` at the start.
    """

    snap: PatchSnapshot
    level: ProfilingLevel
    call_failures: Mapping[tuple[int, int], tuple[Any, str, str]]
    disabled: Mapping[int, str]
    previous: CompiledGraph | None
    off_thread: bool = False
    cold: bool = False
    shown: BuiltView | None = None
    kernel_edits: int | None = None
    started: float = field(default_factory=time.perf_counter)


@dataclass
class BuildOutcome:
    """What ``prepare`` made of a job, for ``finish`` on the frame thread.

    Attributes:
        job: The job.
        plan: The compiled plan (None: the build failed before or while planning, or was deferred).
        functions: The loaded function of every kernel in the plan.
        graph: The new executable graph (None: a Warm patch of ``job.previous``, a failure or a deferral).
        diagnostics: Why it failed (empty: it did not).
        call_failure: The snapshot block whose library call failed to capture, and the error.
        deferred: A running block's new kernel is still compiling: the old graph keeps running.
        realize_on_frame: The plan is realized at ``finish`` (it captures library calls).
        compile_ms: Snapshot to plan.
        realize_ms: Buffers, nodes and instantiation.
        warm: The Warm patch decided on the build thread against ``warm_base`` (trimmed to the nodes
            that change), so that ``finish`` does not decide again on the frame thread.
        warm_base: The running graph's plan the decision compared with.
        prepared: ``warm`` made ready to apply (grown buffers' blocks reserved, arguments packed) on
            the build thread (``CompiledGraph.prepare_patch``), or None.
        bypass_index: The plan's ``BypassIndex`` (a build on the build thread makes it there).
        view: What the blocks show of the plan, and which blocks changed (``built_view``).
        running: The blocks the plan runs and how they differ from those shown running, made on the
            build thread (``board.running_change``).
        spent: The planning drafts of the build, no longer used: a build on the build thread frees
            them right after the next frame ends (``NodeCache.spent``); elsewhere they go with the
            outcome.
    """

    job: BuildJob
    plan: GraphPlan | None = None
    functions: Mapping[tuple[int, int], Any] = field(default_factory=dict)
    graph: CompiledGraph | None = None
    diagnostics: tuple[Diagnostic, ...] = ()
    call_failure: tuple[BlockSnapshot, str] | None = None
    deferred: bool = False
    realize_on_frame: bool = False
    compile_ms: float = 0.0
    realize_ms: float = 0.0
    warm: WarmPatch | None = None
    warm_base: GraphPlan | None = None
    prepared: PreparedPatch | None = None
    bypass_index: BypassIndex | None = None
    view: BuiltView | None = None
    running: RunningChange | None = None
    spent: list[Any] = field(default_factory=list)

    @property
    def bindings(self) -> dict[tuple[int, str], ExternalBinding]:
        return self.job.snap.bindings

    def discard(self) -> None:
        """Free the graph nobody will install (the engine closed, or the context is being reset), and
        give back the blocks a prepared Warm patch reserved."""
        prepared, self.prepared = self.prepared, None
        if prepared is not None:
            prepared.discard()
        g, self.graph = self.graph, None
        if g is not None:
            try:
                g.close()
            except CudaError:  # a dead context: forget it
                g.abandon()


def _compiling(status: Mapping[tuple[int, int], tuple[Any, str, str]]) -> list[tuple[int, int]]:
    return [k for k, (_, code, _) in status.items() if code == DiagnosticCode.KERNEL_COMPILING]


class GraphBuilds:
    """Builds the running graph of one engine.

    Args:
        context: The patch.
        kernels: Compiled functions, and compiles to wait for.
        resources: The running graph, and what a new one is realized with.
        faults: Disabled blocks and failed library calls, left out of the plan.
        board: Takes each build's diagnostics.
        counters: Rebuilds, failed rebuilds, Warm resizes, patched nodes, re-captures are counted here.
        timing: Where the last build spent its host time.
        settle_compiles: Waits for every compile in flight and applies the outcomes (the Code tier).
        reuse_buffers: Let values with disjoint lifetimes share buffers (``compiler.memory``).
        bypass: Applies the blocks' ``enabled`` flags to each graph a build swaps in or patches.
        fuse: Fuse chains of elementwise blocks (``compiler/fusion.py``); each fused kernel is generated
            and loaded by the build itself, on the build thread.
        pace: Called by a build on the build thread before it instantiates; returns at the end of a
            frame (``FrameGate.next_frame``), so the driver's lock is taken between two frames.
    """

    def __init__(
        self,
        *,
        context: Context,
        kernels: KernelTracker,
        resources: DeviceResources,
        faults: FaultState,
        board: DiagnosticBoard,
        counters: EngineCounters,
        timing: BuildTiming,
        settle_compiles: Callable[[], None],
        bypass: Callable[[CompiledGraph, BypassIndex | None], None] | None = None,
        fuse: bool = True,
        reuse_buffers: bool = True,
        pace: Callable[[], Any] | None = None,
        on_generalize: Callable[[], Any] | None = None,
    ) -> None:
        self._pace = pace
        self._on_generalize = on_generalize  # handed to every graph realized here
        self._fuse = fuse
        self.reuse_buffers = reuse_buffers
        self._context = context
        self._kernels = kernels
        self._resources = resources
        self._faults = faults
        self._board = board
        self._counters = counters
        self._timing = timing
        self._settle_compiles = settle_compiles
        self._bypass = bypass
        # The node drafts of the last plan (incremental planning): builds run one at a time, on
        # whichever thread, so one cache serves them all.
        self._plans = NodeCache()
        self._index: BypassIndex | None = None  # the bypass index of the last plan made on the build thread
        self._cold_next = False  # the last Warm decision was refused at the swap: realize next time
        self._shower = BuiltShower(context.registry)  # what the blocks show of the builds (frame thread)

    # -- the two halves ----------------------------------------------------------------------------
    def job(self, level: ProfilingLevel, *, off_thread: bool = False) -> BuildJob:
        """Take what a build starts from (frame thread): the snapshot, left-out library calls,
        disabled blocks and the running graph."""
        edits = self._kernels.edits  # before the snapshot: an edit after it is newer than the snapshot
        snap = self._context.snapshot()
        cold, self._cold_next = self._cold_next, False
        return BuildJob(
            snap,
            level,
            self._faults.with_call_failures(snap.blocks, {}),
            dict(self._faults.disabled),
            self._resources.graph,
            off_thread=off_thread,
            cold=cold,
            shown=self._shower.shown,
            kernel_edits=edits,
        )

    def prepare(self, job: BuildJob, resolved: tuple[dict[Any, Any], dict[Any, Any]] | None = None) -> BuildOutcome:
        """Plan ``job`` and realize a new graph unless the running one can take the plan in place. Runs
        on any thread: changes nothing the frame thread uses (a failed realize restores what it
        borrowed). Driver errors become the outcome's diagnostics.

        Args:
            job: From ``job()``.
            resolved: ``KernelTracker.resolve`` of the job's snapshot, if already done.

        Raises:
            KernelLoadError: the readback kernels (timestamps, publish) failed to build.
        """
        t0 = job.started
        snap = job.snap
        functions, status = resolved if resolved is not None else self._kernels.resolve(snap, job.kernel_edits)
        if status:
            compiling = _compiling(status)
            kernels = self._kernels
            if compiling and kernels.take_cached(compiling):  # compiled before: it runs in this build
                functions, status = kernels.resolve_again(snap, compiling, (functions, status), job.kernel_edits)
                compiling = _compiling(status)
            if job.off_thread and compiling:  # off the frame thread, a compile about to land is worth a wait
                kernels.await_compiles(compiling, COMPILE_WAIT_S)
                functions, status = kernels.resolve_again(snap, compiling, (functions, status), job.kernel_edits)
        out = BuildOutcome(job, functions=functions)
        g = job.previous
        if g is not None and status:
            running = set(g.plan.block_order)
            if any(
                code == DiagnosticCode.KERNEL_COMPILING and bid in running for (bid, _), (_, code, _) in status.items()
            ):
                # A running block's new kernel is still compiling: keep the old graph (and the old
                # kernel) until it lands; the finished compile marks the structure dirty again.
                out.deferred = True
                return out
        if job.call_failures:
            status = {**status, **job.call_failures}
        try:
            out.plan = compile_plan(
                snap,
                status,
                job.level,
                job.disabled,
                fuse=self._fuse,
                cache=self._plans,
                reuse=self.reuse_buffers,
            )
        except GraphCompileError as exc:
            out.diagnostics = tuple(exc.diagnostics)
            return out
        finally:
            out.spent, self._plans.spent = self._plans.spent, []
        if self._fuse:
            failed = self._load_fused(out)
            if failed is not None:
                # A generated kernel that does not load must not stop the patch: it runs unfused (the
                # same plan as ``fuse=False``), with the reason as a warning on the group's last block.
                out.plan = compile_plan(
                    snap, status, job.level, job.disabled, fuse=False, cache=self._plans, reuse=self.reuse_buffers
                )
                out.plan = dataclasses.replace(out.plan, diagnostics=out.plan.diagnostics + (failed,))
                out.spent += self._plans.spent
                self._plans.spent = []
        functions = out.functions
        checkpoint()  # off the frame thread: a frame that runs now first (``pacing.FrameGuard``)
        if job.off_thread:  # a bypass of this plan's graph then costs the frame only what it touches
            # (from the last plan's index, when this plan was resumed from that plan: incremental planning)
            out.bypass_index = self._index = BypassIndex(out.plan, self._index, self._plans.delta)
            # The bypass decision for what is bypassed now (none, usually) is made here, with what shares
            # buffers (O(blocks): 10 ms at 10,000), not at the swap or the graph's first bypass toggle.
            out.bypass_index.decide(snap.bypassed)
        # What the blocks show of it, as differences from what they show now: the swap frame writes only those.
        checkpoint()
        out.view = built_view(out.plan, snap.names, job.shown, self._plans.delta)
        if job.off_thread:
            out.running = running_change(out.plan.block_order, self._board.running)
        checkpoint()
        out.compile_ms = (time.perf_counter() - t0) * 1e3
        if g is not None and not job.cold and self._warm_candidate(g, out, snap.bindings, functions):
            return out  # ``finish`` patches the running graph in place
        if job.off_thread and out.plan.captured_nodes:
            # Library calls are captured with the engine's library handles, which Recapture updates of
            # the running graph use on the frame thread: such a graph is realized there, at ``finish``.
            out.realize_on_frame = True
            return out
        self._realize(out)
        return out

    def _load_fused(self, out: BuildOutcome) -> Diagnostic | None:
        """Generate and load the kernel of every fused group of ``out.plan`` (here, on the build's
        thread: the PTX is written in microseconds and nvJitLink links it to a cubin, so the driver's
        lock, which the frames' launches take, is held only to load it),
        adding their functions to ``out.functions``. A warning for the group's last block when one
        does not load (None: all loaded)."""
        assert out.plan is not None
        fused = [n for n in out.plan.kernel_nodes if n.kernel == FUSED_KERNEL]
        if not fused:
            return None
        functions = dict(out.functions)
        names = out.job.snap.names
        for node in fused:
            try:
                functions[(node.block_id, node.kernel)] = self._kernels.builder.build(node.source).function
            except (KernelLoadError, CudaError) as exc:
                group = " -> ".join(names.get(m, str(m)) for m in node.source.members)
                message = f"the fused kernel of {group} did not load, so the patch runs unfused: {exc}"
                log.warning("%s", message)
                return Diagnostic("warning", node.block_id, DiagnosticCode.REALIZE, message)
        out.functions = functions
        return None

    def _realize(self, out: BuildOutcome) -> None:
        job, snap, plan = out.job, out.job.snap, out.plan
        assert plan is not None
        res = self._resources
        t1 = time.perf_counter()
        names = snap.names
        try:
            stamp_function, publish_function = res.readback_functions(plan, self._kernels.builder)
            functions = out.functions
            if plan.regions:  # the regions' set-condition kernels, beside the blocks' own
                functions = {**functions, **res.region_functions(plan, self._kernels.builder)}
            probe_function = res.probe_function(plan, self._kernels.builder)
            out.graph = realize(
                plan,
                device=res.device,
                pool=res.pool,
                functions=functions,
                bindings=snap.bindings,
                block_names=names,
                previous=job.previous,
                occupancy=job.level.at_least(ProfilingLevel.DEEP_ASYNC),
                stamp_function=stamp_function,
                libraries=res.libraries,
                publish_function=publish_function,
                lend_stores=not job.off_thread or out.realize_on_frame,
                # On the frame thread the running executable may take the new graph (same topology).
                update_previous=not job.off_thread or out.realize_on_frame,
                probe_function=probe_function,
                upload_stream=res.device.upload_stream if job.off_thread and not out.realize_on_frame else None,
                pace=self._pace if job.off_thread and not out.realize_on_frame else None,
                on_generalize=self._on_generalize,
            )
        except LibraryCallError as exc:
            bid = self._block_id(snap, exc)
            tried = next((b for b in snap.blocks if b.id == bid), None)
            if tried is not None:
                out.call_failure = (tried, str(exc))
            else:
                out.diagnostics = (Diagnostic("error", bid, DiagnosticCode.LIBRARY_CALL, str(exc)),)
            return
        except CudaOutOfMemoryError as exc:  # the memory check before realize, or an allocation that failed
            bid = self._block_id(snap, exc)
            out.diagnostics = (Diagnostic("error", bid, DiagnosticCode.OUT_OF_MEMORY, str(exc)),)
            return
        except (KernelLoadError, CudaError) as exc:
            out.diagnostics = (Diagnostic("error", self._block_id(snap, exc), DiagnosticCode.REALIZE, str(exc)),)
            return
        out.realize_ms = (time.perf_counter() - t1) * 1e3

    def _warm_candidate(
        self, g: CompiledGraph, out: BuildOutcome, bindings: Mapping[tuple[int, str], ExternalBinding], functions: Any
    ) -> bool:
        # The pure Warm decision against the running graph (its plan and allocations change only at
        # ``finish``, on the frame thread, so it holds while ``g.plan`` is this plan). Off the frame
        # thread it is kept, trimmed to the nodes that change: the frame thread then writes only those.
        assert out.plan is not None
        base = g.plan
        capacities = [b.capacity_bytes for b in g.buffers]
        decision = decide_warm_patch(base, out.plan, bindings, capacities=capacities, functions=functions)
        if isinstance(decision, WarmRefusal):
            return False
        if out.job.off_thread and not out.plan.captured_nodes:  # re-captures decide with the stale set: at finish
            out.warm, out.warm_base = g.trim_patch(decision), base
            out.prepared = g.prepare_patch(out.warm, bindings)
        return True

    def finish(self, out: BuildOutcome) -> bool:
        """Apply a prepared build at a frame boundary (frame thread): patch the running graph in place,
        or swap in the new graph, or keep the old one and put the errors on the blocks.

        Returns:
            True when the graph is up to date (or deliberately waits for a compile), False when the
            build failed (or must run again: ``dirty.structure`` is set then).

        Raises:
            CudaError: recording the old graph's retire event failed.
        """
        timing = self._timing
        job = out.job
        if out.realize_on_frame and out.graph is None and not out.diagnostics:
            if job.previous is not self._resources.graph:
                self._context.dirty.mark_structure()  # the graph it borrows from is gone: plan again
                return False
            self._realize(out)
        if out.deferred:
            timing.tier = "deferred"
            return True
        if out.call_failure is not None:
            tried, message = out.call_failure
            if self._faults.call_failed(tried, message):
                # Leave that block (and what depends on it) out, and build the rest.
                self._context.dirty.mark_structure()
                return False
            return self._failed((Diagnostic("error", tried.id, DiagnosticCode.LIBRARY_CALL, message),))
        if out.plan is None or out.diagnostics:
            out.discard()
            return self._failed(out.diagnostics)
        plan = out.plan
        timing.compile_ms = out.compile_ms
        res = self._resources
        g = res.graph
        if out.graph is None:
            if g is None or g is not job.previous:
                out.discard()
                self._cold_next = True
                self._context.dirty.mark_structure()
                return False
            recaptures, reallocations = g.recaptures, g.reallocations
            # The replaced plan and the patch (a node each at 10,000 blocks) are freed by the next build,
            # on its thread: dropping them here took milliseconds of the swap frame.
            self._resources.discard_later((g.plan, out.warm, out.prepared))
            try:
                decided = out.warm if out.warm_base is g.plan else None
                patched = None
                if out.prepared is not None:  # made ready on the build thread: bytes and driver calls here
                    prepared, out.prepared = out.prepared, None
                    patched = g.apply_prepared(prepared, plan) if decided is not None else prepared.discard()
                if patched is None:
                    patched = g.try_patch(plan, out.bindings, out.functions, decided=decided)
            except CudaError as exc:
                if not isinstance(exc, CudaLaunchError):  # (a fault: the launch surfaces it, recovery rebuilds)
                    # The driver refused a node midway: the running graph is patched in part (buffers
                    # moved, nodes after the refused one not sent). The next build makes a new one.
                    self._cold_next = True
                    self._context.dirty.mark_structure()
                return self._failed((Diagnostic("error", None, DiagnosticCode.REALIZE, str(exc)),))
            if patched is None:  # refused now (a re-capture changed its topology): realize next build
                self._cold_next = True
                self._context.dirty.mark_structure()
                return False
            # Warm resize: same graph, new counts/grids/pointers patched into the executable graph
            # (captured calls whose arguments changed were re-captured in place).
            timing.tier, timing.realize_ms = "warm-resize", 0.0
            timing.total_ms = (time.perf_counter() - job.started) * 1e3
            self._counters.warm_resizes += 1
            self._counters.nodes_patched += patched
            self._counters.recaptures += g.recaptures - recaptures
            self._counters.growths += g.reallocations - reallocations
            self._done(g, plan, job, out)
            return True
        graph = out.graph
        timing.realize_ms = out.realize_ms
        res.install(graph)
        res.free_dropped(job.started)
        self._counters.rebuilds += 1
        self._counters.instantiations += graph.instantiations
        self._counters.exec_updates += graph.exec_updates
        self._done(graph, plan, job, out)
        timing.tier, timing.total_ms = "cold", (time.perf_counter() - job.started) * 1e3
        return True

    # -- on the frame thread, at once ------------------------------------------------------------------
    def rebuild(self, level: ProfilingLevel, *, wait_for_compile: bool) -> bool:
        """Build and apply at once, on the calling (frame) thread: compile; patch the running graph
        in place if only sizes changed (Warm), else realize and swap in a new one (Cold). On failure
        keep the old graph and put the errors on the blocks.

        Args:
            level: The profiling level (which timestamps the plan places).
            wait_for_compile: Wait for compiles in flight, so the build has every kernel in it.

        Returns:
            True when the graph is up to date (or deliberately waits for a compile), False when the
            build failed.

        Raises:
            KernelLoadError: the readback kernels (timestamps, publish) failed to build.
        """
        for _ in range(len(self._context.registry) + 2):  # a retry leaves out one more failed library call
            job = self.job(level)
            resolved = self._kernels.resolve(job.snap, job.kernel_edits)
            if resolved[1] and wait_for_compile and self._kernels.pending:
                self._settle_compiles()
                job = self.job(level)  # a compile may have re-described a block
                resolved = self._kernels.resolve(job.snap, job.kernel_edits)
            out = self.prepare(job, resolved)
            retry = out.call_failure is not None
            if self.finish(out):
                if out.deferred:
                    self._context.dirty.defer_structure()
                return True
            if not (retry and self._context.dirty.structure) and not self._cold_next:
                return False
        return False

    def _block_id(self, snap: PatchSnapshot, exc: CudaError | KernelLoadError | LibraryCallError) -> int | None:
        return next((b.id for b in snap.blocks if b.name == exc.block), None) if exc.block else None

    def _failed(self, diags: tuple[Diagnostic, ...]) -> bool:
        self._counters.failed_rebuilds += 1
        self._board.build_failed(diags)
        return False

    def _done(self, graph: CompiledGraph, plan: GraphPlan, job: BuildJob, out: BuildOutcome) -> None:
        if not job.off_thread:
            self._context.dirty.clear_structure()  # the snapshot held every pending change
        if self._bypass is not None:  # before its first launch: bypassed blocks stay off
            self._bypass(graph, out.bypass_index)
        registry = self._context.registry
        view = out.view if out.view is not None else built_view(plan, {}, None)
        shown = self._shower.shown
        self._shower.apply(view, graph.appends)
        if shown is not None:
            self._resources.discard_later(shown)  # freed by the next build, off the frame thread
        running = out.running if out.running is not None and out.plan is plan else plan.block_order
        self._board.build_done(plan.diagnostics + occupancy_warnings(graph.occupancy, registry), running)
