"""GraphBuilds: the Cold tier and the Warm resize, from the patch to the running graph.

A build snapshots the patch (pure data), resolves every kernel (its compiled function, or why it
cannot run yet), and compiles a ``GraphPlan``. If only counts, grids or pointers changed, the plan is
patched into the running executable graph (Warm resize, no instantiation); otherwise it is realized
into a new ``CompiledGraph`` that ``DeviceResources.install`` swaps in at this frame boundary. A
failed build keeps the old graph running and puts its errors on the blocks (``DiagnosticBoard``); a
library call that fails to capture leaves its block out (``FaultState``) and the rest is built.

Builds run on the frame thread today; DESIGN.md §10 moves planning and realizing to a build thread,
which is why a build is its own object with its collaborators passed in.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from ..errors import CudaError, GraphCompileError, KernelLoadError, LibraryCallError
from .board import DiagnosticBoard
from .compiler import compile_plan
from .context import Context
from .diagnostics import Diagnostic, DiagnosticCode
from .faults import FaultState
from .kernels import KernelTracker
from .plan import GraphPlan
from .profiling import ProfilingLevel
from .realize import CompiledGraph, realize
from .resources import DeviceResources
from .stats import BuildTiming, EngineCounters, occupancy_warnings, show_built

__all__ = ["GraphBuilds"]


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
    ) -> None:
        self._context = context
        self._kernels = kernels
        self._resources = resources
        self._faults = faults
        self._board = board
        self._counters = counters
        self._timing = timing
        self._settle_compiles = settle_compiles

    def rebuild(self, level: ProfilingLevel, *, wait_for_compile: bool) -> bool:
        """Compile; patch the running graph in place if only sizes changed (Warm), else realize and
        swap in a new one (Cold). On failure keep the old graph and put the errors on the blocks.

        Args:
            level: The profiling level (which timestamps the plan places).
            wait_for_compile: Wait for compiles in flight, so the build has every kernel in it.

        Returns:
            True when the graph is up to date (or deliberately waits for a compile), False when the
            build failed.

        Raises:
            KernelLoadError: the readback kernels (timestamps, publish) failed to build.
        """
        timing = self._timing
        t0 = time.perf_counter()
        snap = self._context.snapshot()
        functions, status = self._kernels.resolve(snap)
        if status and wait_for_compile and self._kernels.pending:
            self._settle_compiles()
            snap = self._context.snapshot()  # a compile may have re-described a block
            functions, status = self._kernels.resolve(snap)
        res = self._resources
        g = res.graph
        if g is not None and status:
            running = set(g.plan.block_order)
            if any(
                code == DiagnosticCode.KERNEL_COMPILING and bid in running for (bid, _), (_, code, _) in status.items()
            ):
                # A running block's new kernel is still compiling: keep the old graph (and the old
                # kernel) until it lands; the finished compile marks the structure dirty again.
                self._context.dirty.defer_structure()
                timing.tier = "deferred"
                return True
        status = self._faults.with_call_failures(snap.blocks, status)
        try:
            plan = compile_plan(snap, status, level, self._faults.disabled)
            timing.compile_ms = (time.perf_counter() - t0) * 1e3
        except GraphCompileError as exc:
            return self._failed(exc.diagnostics)
        if g is not None:
            recaptures = g.recaptures
            try:
                patched = g.try_patch(plan, snap.bindings, functions)
            except CudaError as exc:
                return self._failed((Diagnostic("error", None, DiagnosticCode.REALIZE, str(exc)),))
            if patched is not None:
                # Warm resize: same graph, new counts/grids/pointers patched into the executable graph
                # (captured calls whose arguments changed were re-captured in place).
                timing.tier, timing.realize_ms = "warm-resize", 0.0
                timing.total_ms = (time.perf_counter() - t0) * 1e3
                self._counters.warm_resizes += 1
                self._counters.nodes_patched += patched
                self._counters.recaptures += g.recaptures - recaptures
                self._done(g, plan)
                return True
        stamp_function, publish_function = res.readback_functions(plan, self._kernels.builder)
        t1 = time.perf_counter()
        try:
            graph = realize(
                plan,
                device=res.device,
                pool=res.pool,
                functions=functions,
                bindings=snap.bindings,
                block_names={b.id: b.name for b in snap.blocks},
                previous=g,
                occupancy=level.at_least(ProfilingLevel.DEEP_ASYNC),
                stamp_function=stamp_function,
                libraries=res.libraries,
                publish_function=publish_function,
            )
        except LibraryCallError as exc:
            bid = self._block_id(exc)
            tried = next((b for b in snap.blocks if b.id == bid), None)
            if tried is not None and self._faults.call_failed(tried, str(exc)):
                # Leave that block (and what depends on it) out, and build the rest.
                return self.rebuild(level, wait_for_compile=wait_for_compile)
            return self._failed((Diagnostic("error", bid, DiagnosticCode.LIBRARY_CALL, str(exc)),))
        except (KernelLoadError, CudaError) as exc:
            return self._failed((Diagnostic("error", self._block_id(exc), DiagnosticCode.REALIZE, str(exc)),))
        timing.realize_ms = (time.perf_counter() - t1) * 1e3
        res.install(graph)
        self._counters.rebuilds += 1
        self._done(graph, plan)
        timing.tier, timing.total_ms = "cold", (time.perf_counter() - t0) * 1e3
        return True

    def _block_id(self, exc: CudaError | KernelLoadError | LibraryCallError) -> int | None:
        block = self._context.registry.by_name(exc.block) if exc.block else None
        return block.id if block is not None else None

    def _failed(self, diags: tuple[Diagnostic, ...]) -> bool:
        self._counters.failed_rebuilds += 1
        self._board.build_failed(diags)
        return False

    def _done(self, graph: CompiledGraph, plan: GraphPlan) -> None:
        self._context.dirty.clear_structure()
        registry = self._context.registry
        show_built(plan, graph.appends, registry)
        self._board.build_done(plan.diagnostics + occupancy_warnings(graph.occupancy, registry), plan.block_order)
