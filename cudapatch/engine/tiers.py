"""The update tiers that patch the running executable graph in place, never rebuilding it.

``ParamTier``: Hot (a scalar parameter: its pinned slot is written and the node's parameters set,
1.4 µs a node measured from Python on the H100), Warm (an external input's pointer moved: the
nodes reading it are patched) and Recapture (a captured library call whose arguments changed is
captured again on a side stream and its child-graph node updated). It runs on the frame path of
an edit frame, so it does no lookups: the dirty tracker hands it the changed objects themselves.

``CodeTier``: a kernel edit goes live by swapping the recompiled function into the running graph.
An edit hands the kernel's source to the ``KernelTracker`` (compiles run in the background). When a
compile finishes with the same parameter layout, its function is swapped into every node of that
kernel with ``cuGraphExecKernelNodeSetParams`` (25 µs measured on the H100, DESIGN.md §3): on the
kernel builder's thread right after a frame when the graph is free (``swap_between_frames``), else
on the frame thread at the next ``update()`` (``apply``). Anything else a compile asks for (a first
compile, a new layout, a block to re-describe) becomes a structure change: the Cold tier.

``swap`` is the one place a swap is applied and counted.

``BypassTier``: a block's ``enabled`` flag turns its nodes off or on in the running graph and points
its readers at its input (``bypass.plan_bypass`` decides, ``CompiledGraph.set_bypass`` applies);
after every build, the new graph gets the flags as they are.

What neither can do in place becomes a structure change: the Cold tier (``build.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from time import perf_counter as _now  # (the specialisation budget's clock; tests set their own)
from typing import Any, Literal

from ..errors import CudaError, CudapatchError
from ..kernels.source import KernelSource
from .board import DiagnosticBoard
from .bypass import BypassIndex
from .compiler.fusion import FUSED_KERNEL, regenerate
from .context import Context
from .diagnostics import Diagnostic, DiagnosticCode
from .dirty import DirtyTracker
from .faults import FaultState
from .kernels import KernelOutcome, KernelTracker, after_settling
from .plan import KernelNodePlan
from .realize import CompiledGraph
from .resources import DeviceResources
from .stats import EngineCounters

__all__ = ["BypassTier", "CodeTier", "ParamTier"]

#: Specialised kernels (``specialize.py``) swapped in per frame at most; the others wait for the next
#: frames. Each costs the frame a look at the ~1,000 scalars of its group and a driver call, and every
#: group of a long fused chain is specialised anew at once after a build gives it a new graph (a
#: growth used to do the same; it keeps them now): on the CPU machine (stand-in driver,
#: ``bench_hot_cpu``'s) 10 of a fused 10,000-block chain's 20 landed in one frame, 6-8 ms. A
#: specialisation is an optimisation the running graph does not wait for.
SPECIALIZED_PER_FRAME = 4
#: Host seconds of specialisations after which a frame takes no more (the next frames take the rest):
#: on the H100 host one 500-member fused group's took 0.3-0.9 ms of a fused 10,000-block chain's frame
#: (the driver taking a new function with 4 KB of arguments), so four in a frame made it 1-2 ms.
SPECIALIZE_BUDGET_S = 0.25e-3


class ParamTier:
    """Hot, Warm and Recapture updates of one engine.

    Args:
        dirty: The patch's dirty tracker (pending parameters and bindings are taken from it).
        board: Takes the errors of re-captures that failed.
        counters: Hot and Warm updates, patched nodes and re-captures are counted here.
    """

    def __init__(self, *, dirty: DirtyTracker, board: DiagnosticBoard, counters: EngineCounters) -> None:
        self._dirty = dirty
        self._board = board
        self._counters = counters
        # While a build runs on the build thread: every change applied to the running graph, by key
        # (the parameter or binding object itself), to re-apply to the new graph before it launches.
        self._carried: tuple[dict[tuple[int, str], Any], dict[tuple[int, str], Any]] | None = None
        # The dicts ``DirtyTracker.swap_params`` puts in place of the pending changes (no dict per edit frame).
        self._spare: tuple[dict[tuple[int, str], Any], dict[tuple[int, str], Any]] = ({}, {})

    # -- Hot values across a build on the build thread ---------------------------------------------------
    def begin_carry(self) -> None:
        """A build started from a snapshot: from now on, remember what is applied (``end_carry``)."""
        self._carried = ({}, {})

    def carry(self, params: dict[tuple[int, str], Any], bindings: dict[tuple[int, str], Any]) -> None:
        """Remember changes taken while a build runs (no graph to apply them to yet, or applied to the
        running one): the new graph gets them at ``end_carry``. Nothing while no build runs."""
        carried = self._carried
        if carried is not None:
            carried[0].update(params)
            carried[1].update(bindings)

    def end_carry(self, g: CompiledGraph | None) -> None:
        """The build is done: write what changed since its snapshot into ``g`` (the graph that launches
        next; None: the build failed, nothing to do) and stop remembering.

        Raises:
            CudaError: a driver call failed.
        """
        carried, self._carried = self._carried, None
        if carried is None or g is None:
            return
        params, bindings = carried
        c = self._counters
        if params:  # each holds the parameter object: its value now, not the one it had then
            c.nodes_patched += g.update_scalars(params)
        if bindings:
            c.nodes_patched += g.update_bindings(bindings)

    def apply(self, g: CompiledGraph) -> bool:
        """Patch the pending scalar and pointer changes into ``g`` (only those may be pending).

        Returns:
            True when a re-capture needs a new graph: the caller builds one this frame.

        Raises:
            CudaError: a driver call failed.
        """
        dirty = self._dirty
        taken = dirty.swap_params(self._spare)  # an edit waiting for the build in flight stays pending
        params, bindings = taken
        try:
            if self._carried is not None:
                self.carry(params, bindings)
            c = self._counters
            calls = g.has_calls
            before = g.recaptures if calls else 0
            if params:
                c.nodes_patched += g.update_scalars(params)
                c.hot_updates += len(params)
            if bindings:
                c.nodes_patched += g.update_bindings(bindings)
                c.warm_updates += len(bindings)
        finally:  # applied (or failed: the edit is dropped, as it always was): the next swap's spare
            params.clear()
            bindings.clear()
            self._spare = taken
        if calls and (g.recaptures != before or g.call_errors or g.stale):
            self._after_recapture(g, before)
            return dirty.structure
        return False

    def _after_recapture(self, g: CompiledGraph, before: int) -> None:
        # Count, put failed calls on their blocks (their previous capture keeps running), and ask for
        # a rebuild when a new capture cannot replace the old in place.
        self._counters.recaptures += g.recaptures - before
        if g.stale:  # another algorithm for the new arguments: only a new graph can hold it
            g.stale = False
            self._dirty.mark_structure()
        self._board.recapture_errors(
            Diagnostic("error", bid, DiagnosticCode.LIBRARY_CALL, f"{exc} (the previous capture keeps running)")
            for bid, exc in g.call_errors.items()
        )


_FusedAction = Literal["swap", "upgrade"]


@dataclass(eq=False)
class _FusedJob:
    """A fused group's kernel, regenerated after a member's Code edit, compiling on the builder.

    Attributes:
        key: The fused node's ``(block id, kernel)``.
        future: The builder's compile.
        edit: The member edit it was made for (an older one is not swapped in once a newer exists).
        action: ``swap`` (the quick build, live at once) or ``upgrade`` (its optimised build).
        queued: Its outcome was handed to the frame thread (the done callback and ``settle_fused``
            race for it: whichever comes first).
    """

    key: tuple[int, int]
    future: Future
    edit: int
    action: _FusedAction
    queued: bool = False


class CodeTier:
    """The Code tier of one engine.

    Args:
        resources: Holds the running graph.
        context: The patch (blocks to re-describe; structure changes are marked on its dirty tracker).
        kernels: The compile state of every kernel.
        faults: A block disabled by a GPU fault gets a new chance with new code.
        board: Takes a re-description's error.
        counters: ``code_swaps`` and ``kernel_upgrades`` are counted here.
        graph_lock: Held by the frame thread for a whole ``update()``; a swap between frames takes it
            only if it is free.
    """

    def __init__(
        self,
        *,
        resources: DeviceResources,
        context: Context,
        kernels: KernelTracker,
        faults: FaultState,
        board: DiagnosticBoard,
        counters: EngineCounters,
        graph_lock: threading.Lock,
    ) -> None:
        self._resources = resources
        self._context = context
        self._kernels = kernels
        self._faults = faults
        self._board = board
        self._counters = counters
        self._lock = graph_lock
        self._closed = False
        # While a build runs on the build thread: functions swapped into the running graph since its
        # snapshot (the build resolved the older ones), to swap into the new graph before it launches.
        self._carried: dict[tuple[int, int], KernelOutcome] | None = None
        # While a build runs: kernels compiled for the first time (a new block's) whose rebuild waits
        # for that build, which may have taken them from the cache already (``end_carry`` decides).
        self._new_kernels: dict[tuple[int, int], KernelOutcome] = {}
        # Fused kernels regenerated by a member's Code edit, compiling.
        self._fused_jobs: list[_FusedJob] = []
        self._fused_lock = threading.Lock()
        # The latest member edit per fused node: an optimised build of an older edit is not swapped in.
        self._fused_edits: dict[tuple[int, int], int] = {}

    def begin_carry(self) -> None:
        """A build started: remember the swaps from now on (``end_carry``)."""
        self._carried = {}

    def end_carry(self, g: CompiledGraph | None) -> None:
        """Swap the functions swapped since the build's snapshot into ``g`` (the new graph; None: the
        build failed) and stop remembering.

        Raises:
            CudaError: the driver refused a swap.
        """
        carried, self._carried = self._carried, None
        # First compiles first: with the functions the build ran (an optimised build of the new kernel,
        # carried, is swapped in below), and decided even where a swap below raises.
        new, self._new_kernels = self._new_kernels, {}
        for o in new.values():
            if g is None or not self._needs_none(g, o):
                self._context.dirty.mark_structure()  # the build left it out: the next one runs it
                break
        if carried and g is not None:
            for o in carried.values():
                if o.compiled is not None:
                    g.swap_function(o.key, o.compiled.function, o.compiled.descriptor, o.compiled.source)

    def submit(self, keys: Iterable[tuple[int, int]]) -> None:
        """Kernels whose code changed ``(block id, kernel index)``: queue their compiles (``flush``
        hands them to the builder). A block disabled by a GPU fault is enabled again: new code gets a
        new chance (a structure change)."""
        for key in keys:
            self._submit(key)

    def edited(self, key: tuple[int, int]) -> bool:
        """A kernel's code changed at an edit: hand it to the builder now, so the next frame has
        nothing to do for it (measured on the H100 host: handing it over inside ``update()`` cost
        that frame 60-80 µs; the builder is paced, so it starts on it only after the next frame).
        Returns False when the kernel is not in the patch."""
        if not self._submit(key):
            return False
        self._kernels.flush()
        return True

    def _submit(self, key: tuple[int, int]) -> bool:
        bid, ki = key
        if self._faults.code_changed(bid):
            self._context.dirty.mark_structure()
        block = self._context.registry.get(bid)
        if block is None or not 0 <= ki < len(block.description.kernels):
            return False
        self._kernels.source_changed(key, block.description.kernels[ki].source, block.name)
        self._fused_edit(bid)
        return True

    def _fused(self, block_id: int, g: CompiledGraph | None = None) -> KernelNodePlan | None:
        """The fused node of ``g`` (default: the running graph) that ``block_id`` is a member of, if any."""
        g = self._resources.graph if g is None else g
        if g is None:
            return None
        nodes = g.plan.nodes
        # A member's nodes are its group's one node (``block_nodes``): no walk over the plan, which the
        # Code tier asks for each new block's first compile (0.13 ms a walk at 10,000 nodes).
        for i in g.plan.block_nodes.get(block_id, ()):
            node = nodes[i]
            if isinstance(node, KernelNodePlan) and node.kernel == FUSED_KERNEL and block_id in node.source.members:  # type: ignore[attr-defined]
                return node
        return None

    def _fused_edit(self, block_id: int) -> None:
        """A member of a fused group in the running graph has new code: generate the group's kernel
        again and swap it into the group's node (the member's own kernel compiles as well: a rebuild
        that splits the group runs it). Nothing when the edit changed the member's names (its
        re-description rebuilds the graph anyway)."""
        node = self._fused(block_id)
        if node is None:
            return
        registry = self._context.registry
        source = regenerate(node.source, {m: registry.get(m) for m in node.source.members})  # type: ignore[arg-type, attr-defined]
        if source is None:
            return
        key = (node.block_id, node.kernel)
        with self._fused_lock:
            edit = self._fused_edits[key] = self._fused_edits.get(key, 0) + 1
        self._fused_submit(key, source, "swap", edit)

    def _fused_submit(self, key: tuple[int, int], source: KernelSource, action: _FusedAction, edit: int) -> None:
        try:
            fut = self._kernels.builder.submit(source)
        except CudapatchError:  # the builder closed: the engine is closing
            return
        job = _FusedJob(key, fut, edit, action)
        with self._fused_lock:
            self._fused_jobs.append(job)
        fut.add_done_callback(lambda _f: self._fused_done(job))

    def _fused_done(self, job: _FusedJob) -> None:
        # On the builder's thread, or in settle_fused (whichever comes first queues the outcome). A
        # failure needs no report here: the member's own compile fails the same way, on the block.
        with self._fused_lock:
            if job.queued:
                return
            job.queued = True
            if job in self._fused_jobs:
                self._fused_jobs.remove(job)
            latest = self._fused_edits.get(job.key) == job.edit
        fut = job.future
        if fut.cancelled() or fut.exception() is not None:
            return
        compiled = fut.result()
        if job.action == "upgrade":
            if latest:  # else a newer edit's kernel runs already: this one is out of date
                self._kernels.ready.append(KernelOutcome("upgrade", job.key, compiled))
            return
        self._kernels.ready.append(KernelOutcome("swap", job.key, compiled))
        better = compiled.source.upgrade()
        if better is not None and latest:  # the optimised build follows once no newer edit came

            def submit() -> None:
                with self._fused_lock:
                    still = self._fused_edits.get(job.key) == job.edit
                if still:
                    self._fused_submit(job.key, better, "upgrade", job.edit)

            after_settling(submit)

    def settle_fused(self, timeout: float | None = None) -> None:
        """Wait for the fused kernels regenerated by members' edits and queue their swaps (for engines
        that wait for compiles: their next frame runs the edit)."""
        with self._fused_lock:
            jobs = list(self._fused_jobs)
        if not jobs:
            return
        with self._kernels.builder.unpaced():
            wait_futures([j.future for j in jobs], timeout=timeout)
        for job in jobs:
            if job.future.done():
                self._fused_done(job)

    def swap(self, o: KernelOutcome) -> bool:
        """Swap ``o``'s recompiled function into the running graph in place; False where it cannot be
        (no graph, not in it, or another parameter layout).

        Raises:
            CudaError: the driver refused the new function.
        """
        g = self._resources.graph
        if g is None or o.compiled is None:
            return False
        if not g.swap_function(o.key, o.compiled.function, o.compiled.descriptor, o.compiled.source):
            return False
        carried = self._carried
        if carried is not None:
            carried[o.key] = o
        if o.action == "upgrade":
            self._counters.kernel_upgrades += 1
        else:
            self._counters.code_swaps += 1
        return True

    def swap_between_frames(self, o: KernelOutcome) -> bool:
        """``swap`` on the kernel builder's thread right after a frame (the ``KernelTracker``'s swapper).
        Gives up (the frame thread swaps it then) rather than wait for the graph."""
        if not self._lock.acquire(blocking=False):
            return False
        try:
            return not self._closed and self._faults.lost is None and self.swap(o)
        except CudaError:  # the frame thread tries again, and reports what fails
            return False
        finally:
            self._lock.release()

    def apply(self, outcomes: list[KernelOutcome], *, specialize: bool = True) -> None:
        """On the frame thread: swap finished kernels into the running graph; mark a structure change
        where that cannot be done, re-describing blocks whose kernel signature changed. ``specialize``
        False: specialisations wait for the next frames (a build lands in this one: the swap frame
        already costs most of a fused 10,000-block frame's millisecond on the H100 host, and a graph
        it swaps in refuses what was made for the graph it replaces).

        Raises:
            CudaError: the driver refused a swap.
        """
        if not outcomes:
            return
        dirty = self._context.dirty
        specialized, later, until = 0, [], 0.0
        try:
            for o in outcomes:
                if o.action == "swapped":  # swapped between frames; its diagnostics changed (below)
                    continue
                if o.action == "specialize":  # the running graph only, if its code and values are still those
                    if not specialize or specialized == SPECIALIZED_PER_FRAME or (specialized and _now() > until):
                        later.append(o)
                        continue
                    if not specialized:
                        until = _now() + SPECIALIZE_BUDGET_S
                    specialized += 1
                    g = self._resources.graph
                    c = o.compiled
                    if g is not None and c is not None and g.specialize(o.key, c.function, o.constants, o.generic):
                        self._counters.specializations += 1
                    continue
                if o.action == "upgrade":  # an optimised build of what runs: swap it in where it runs
                    if not self.swap(o) and self._carried is not None:
                        self._carried[o.key] = o  # the build in flight may hold the quick build: end_carry swaps
                    continue
                if o.action == "swap":
                    if self.swap(o):
                        continue
                    if self._fused(o.key[0]) is not None:  # a fused member's own kernel: the group's is swapped
                        continue
                elif o.action == "refresh":  # a file edit changed the kernel's signature: re-describe the block
                    self._refresh(o.key[0])
                elif o.action == "rebuild" and o.compiled is not None and self._runs_or_may_run(o):
                    continue
                dirty.mark_structure()
        finally:
            if later:  # the next frames take them, in the order they came (also when a swap raised)
                self._kernels.ready.extendleft(reversed(later))
        self._board.refresh()  # a swap alone changes no block's state, but may clear a compile error

    def _runs_or_may_run(self, o: KernelOutcome) -> bool:
        """A kernel compiled for the first time (a new block's, or one that failed to compile before)
        needs a build to run, unless the running graph runs it already or the build in flight may:
        a build takes kernels that are in the cache when it resolves them (``KernelTracker.take_cached``),
        so the builder's own result for the same compile often lands after that build started, and a
        second build for it made a new block in a 1,000-block chain live one or two frames later.
        The build in flight is checked when it lands (``end_carry``). A block fused into a group needs
        no build for its own kernel either (a build that splits the group runs it)."""
        g = self._resources.graph
        if g is not None and self._needs_none(g, o):
            return True
        if self._carried is None:
            return False
        self._new_kernels[o.key] = o
        return True

    def _needs_none(self, g: CompiledGraph, o: KernelOutcome) -> bool:
        """``g`` runs ``o``'s function already, or its block inside a fused kernel (which its own
        kernel is not needed for). Fusion takes blocks of one kernel only: a block described now with
        more (a kernel added to a fused block) runs its new one only after a build."""
        assert o.compiled is not None
        if g.runs_function(o.key, o.compiled.function):
            return True
        block = self._context.registry.get(o.key[0])
        return block is not None and len(block.description.kernels) == 1 and self._fused(o.key[0], g) is not None

    def _refresh(self, block_id: int) -> None:
        block = self._context.registry.get(block_id)
        if block is None:
            return
        try:
            block.refresh()
        except CudapatchError as exc:  # stays on the block until a later edit re-describes it
            self._board.set_block_error(Diagnostic("error", block.id, DiagnosticCode.KERNEL_SIGNATURE, str(exc)))
        else:
            self._board.clear_block_error(block.id, DiagnosticCode.KERNEL_SIGNATURE)

    def close(self) -> None:
        """No swap between frames from now on (the engine is closing); idempotent. Take the graph
        lock afterwards to wait for one that began before."""
        self._closed = True


class BypassTier:
    """The Bypass tier of one engine.

    Args:
        context: The patch (``context.bypassed``: the blocks whose ``enabled`` flag is off).
        board: Takes a warning for a bypassed block whose nodes cannot be turned off.
        counters: ``bypass_updates`` is counted here.
        discard: Takes the index of a plan no longer running, to free it off the frame thread
            (``DeviceResources.discard_later``); None: it is freed where it is replaced.
        copies: The loaded copy kernels that carry a block whose buffers others share until its
            rebuild lands (``DeviceResources.copy_kernels``), or None while they are not loaded.
    """

    def __init__(
        self,
        *,
        context: Context,
        board: DiagnosticBoard,
        counters: EngineCounters,
        discard: Callable[[Any], None] | None = None,
        copies: Callable[[], Mapping[str, Any] | None] | None = None,
    ) -> None:
        self._discard = discard
        self._copies = copies
        self._context = context
        self._board = board
        self._counters = counters
        self._index: BypassIndex | None = None  # of the running graph's plan, made at the first bypass
        self._refused: set[int] = set()
        self._bypassing: CompiledGraph | None = None  # the graph with nodes off or readers redirected

    def _take_index(self, index: BypassIndex) -> None:
        old, self._index = self._index, index
        if old is not None and old is not index and self._discard is not None:
            self._discard(old)

    def apply(self, g: CompiledGraph | None, index: BypassIndex | None = None) -> None:
        """Make the running graph ``g`` match the blocks' ``enabled`` flags (an edit frame, or right
        after a build swapped ``g`` in or patched it). Nothing to do while no block is or was bypassed.
        ``index``: the ``BypassIndex`` of ``g``'s plan, made by the build on its own thread (else it is
        made here at the first bypass of the plan).

        Raises:
            CudaError: a driver call failed.
        """
        context = self._context
        context.dirty.take_bypass()  # and ``dirty.any`` recomputed: the next clean frame tests one flag
        if g is None:
            return
        if index is not None and index.plan is g.plan:
            self._take_index(index)
        bypassed = context.bypassed
        if not bypassed and self._bypassing is not g and not self._refused:
            return  # the common case, after every build: nothing bypassed, nothing to undo
        index = self._index
        if index is None or index.plan is not g.plan:  # once per plan: a toggle then costs what it touches
            index = BypassIndex(g.plan)
            self._take_index(index)
        copies = self._copies() if self._copies is not None else None
        shared, bp = index.decide(bypassed, copies is not None)  # once per set of bypassed blocks and plan
        if shared:  # the build that pins their values (those carried meanwhile copy their input)
            context.dirty.mark_structure()
        counters = self._counters
        counters.nodes_patched += g.set_bypass(bp, copies)
        counters.bypass_updates += 1
        self._bypassing = None if bp.empty else g
        if (bp.refused or self._refused) and bp.refused.keys() != self._refused:  # (no set made per toggle)
            for bid in self._refused - set(bp.refused):
                self._board.clear_block_error(bid, DiagnosticCode.BYPASS)
            for bid, why in bp.refused.items():
                name = b.name if (b := self._context.registry.get(bid)) is not None else bid
                message = f"block '{name}' is not bypassed: {why} (it keeps running)"
                self._board.set_block_error(Diagnostic("warning", bid, DiagnosticCode.BYPASS, message))
            self._refused = set(bp.refused)
