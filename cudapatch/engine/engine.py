"""Engine: the one active part. Compiles all blocks into one CUDA graph, and applies every edit with
the cheapest correct update before launching each frame.

The engine orchestrates; each concept it uses lives in its own object:

- ``DeviceResources`` (``resources.py``): the CUDA context and everything in it (stream, pool,
  library handles, modules, the running and retired graphs, uploads), with one ``reset``.
- ``KernelTracker`` (``kernels.py``): background compiles and what each finished one asks for.
- ``ParamTier``, ``CodeTier`` and ``BypassTier`` (``tiers.py``): Hot, Warm, Recapture, Code and
  Bypass updates, in place.
- ``GraphBuilds`` (``build.py``): the Cold tier and the Warm resize (growth included), prepared on
  the ``BuildWorker`` (``build_thread.py``) while the old graph keeps launching; ``StructureTier``
  (``structure.py``) decides where a structure edit builds and swaps the outcome in at a frame boundary.
- ``EditApplier`` (``applying.py``): the edit frame, the tiers above asked in order (and
  ``wait_ready``'s loop).
- ``FaultState`` (``faults.py``): disabled blocks, failed library calls, a lost context.
- ``DiagnosticBoard`` (``board.py``): every diagnostic by source; the one writer of block states.
- ``stats.py``: what a completed frame measured, read without side effects; the tier counters.
- ``Recovery`` (``recovery.py``): surviving a sticky GPU fault through the objects above.
- ``PatchEditing`` (``editing.py``) and ``EngineResults`` (``results.py``): the editing and the
  reading halves of the public API (the stream, pool, libraries and modules too), base classes of
  ``Engine``.

``update()`` with nothing dirty tests a few flags and launches: one driver call (a graph with
FrameDelays picks the executable of this frame's phase), no allocation, no synchronize, no per-block
loop. The readback ring (append counts, timings, probes, loop iterations) is only counted; it is read
with plain loads when a value is asked for.
"""

from __future__ import annotations

import logging
import threading
from functools import partial
from pathlib import Path
from typing import Any

from ..errors import (
    CudaError,
    CudaLaunchError,
)
from ..kernels._driver import check, driver
from ..kernels.builder import KernelBuilder
from ..kernels.cache import CubinCache
from ..kernels.pacing import FRAME_GUARD
from .applying import EditApplier, settle_compiles
from .board import DiagnosticBoard
from .build import GraphBuilds
from .build_thread import BuildWorker
from .collector import CollectorFreeze, pause_collector, resume_collector
from .compiler.fusion import in_fused_node
from .context import Context
from .diagnostics import Diagnostic, DiagnosticCode
from .editing import PatchEditing
from .faults import FaultState
from .kernels import KernelOutcome, KernelTracker
from .probes import ProbeSet
from .profiling import ProfilingLevel
from .recovery import Recovery
from .replay import ReplayStandby
from .resources import PUBLISH_KERNEL as PUBLISH_KERNEL  # re-exported: the kernel that ends timed graphs
from .resources import DeviceResources
from .results import EngineResults
from .specialize import Specializer
from .stats import BuildTiming, EngineCounters
from .structure import StructureTier
from .tiers import BypassTier, CodeTier, ParamTier

__all__ = ["Engine", "EngineCounters", "BuildTiming"]

_DEEP_SYNC = ProfilingLevel.DEEP_SYNC  # (a module constant: the quiet frame tests it)

log = logging.getLogger("cudapatch.engine")


class Engine(PatchEditing, EngineResults):
    """Compiles registered blocks into one CUDA graph and launches it once per ``update()``.

    Kernels compile in the background: a block whose kernel is still compiling is left out of the
    graph until it is ready (scripts call ``wait_ready()``), and a kernel edit goes live by swapping
    the function inside the running graph, never stalling a frame.

    Args:
        device: CUDA device ordinal.
        name: Engine name, shown in ``str(engine)``.
        cache_dir: The compiled-kernel cache (None: ``$CUDAPATCH_CACHE_DIR`` or the XDG cache dir;
            False: memory only).
        watch_files: Recompile kernels when their files (and ``#include``s) change.
        wait_for_compile: Make ``update()`` wait for kernel compiles and builds (deterministic scripts
            and offline rendering; never in a live host).
        background_builds: Plan, realize and instantiate structure edits on a build thread while the
            running graph keeps launching; the new graph is swapped in at the first ``update()``
            after it is ready (``building`` says one is in flight). False (or ``wait_for_compile``):
            the ``update()`` after an edit builds and launches the new graph itself.
        debug_launch: Launch every frame node by node with a synchronize after each block, so a
            kernel fault is pinned on its block in the frame it happens (development only: slow).
        isolated: Run the engine in a child process (``cudapatch.isolated.IsolatedEngine`` is
            returned): a GPU fault ends only the child, which restarts without the faulting block.
        fuse: Fuse chains and trees of elementwise blocks (Expression, Scale, VectorAdd, plugin blocks
            that declare an expression) whose intermediates nothing else reads into one generated
            kernel each (docs/expressions.md, "Fusion"). On by default; ``fuse=False`` gives every
            block its own nodes. An intermediate the host reads stays out of its group:
            ``keep(block, port)`` (a GL bridge does it) before the first ``update()``; ``output()`` or
            ``read()`` of a fused intermediate raises once and keeps it from the next ``update()`` on.
        reuse_buffers: Let outputs whose lifetimes do not overlap share device memory (see ``keep``
            and docs/architecture.md, memory phase). False: every output has a buffer of its own.
        freeze_collector: After each build, move the objects Python's cyclic collector tracks into its
            permanent generation (``gc.freeze()``), so its full collections stop scanning the whole
            patch while frames run, and pause automatic collection while a build runs on the build
            thread (``engine/collector.py``). Process-wide: False leaves it alone.

    A sticky GPU fault (illegal address, ...) does not end the process: the next ``update()`` resets
    the context, finds the faulting block by replaying block by block, disables it (its outputs read
    as zeros, an error on it, warnings on its dependents) and rebuilds; see ``engine.recovery``.

    Raises:
        CudaUnavailableError: no cuda-bindings, no driver or no device (says which).
        CudaError: another driver call failed.
    """

    #: The graph runs in this process (an ``IsolatedEngine``'s runs in a child: GL interop copies).
    graph_in_child = False

    def __new__(cls, *args: Any, isolated: bool = False, **kwargs: Any) -> Any:
        # ``isolated=True``: the same API with the engine in a child process (``cudapatch.isolated``);
        # Python does not call ``__init__`` on what is returned here, which is no Engine.
        if isolated:
            from ..isolated import IsolatedEngine

            return IsolatedEngine(*args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        device: int = 0,
        *,
        isolated: bool = False,
        name: str = "CudaEngine",
        cache_dir: str | Path | None | bool = None,
        watch_files: bool = True,
        wait_for_compile: bool = False,
        debug_launch: bool = False,
        background_builds: bool = True,
        fuse: bool = True,
        reuse_buffers: bool = True,
        freeze_collector: bool = True,
    ) -> None:
        #: The CUDA context and everything in it (renewed in place after a GPU fault).
        self.resources = DeviceResources(device, on_install=self._graph_installed if fuse else None)
        self.device = self.resources.device
        self.name = name
        self.kernel_cache = CubinCache(cache_dir)
        builder = KernelBuilder(
            arch=self.device.arch,
            cache=self.kernel_cache,
            modules=self.resources.modules,
            make_current=lambda: check(driver().cuCtxSetCurrent(self.device.context), "cuCtxSetCurrent"),
            paced=True,
        )
        self._gate = builder.gate  # opened after each frame while the builder has work
        #: The thread structure edits are built on (``background_builds``).
        collector = CollectorFreeze(freeze_collector)
        self._worker = BuildWorker(lambda: self.resources.device.make_current(), around_job=collector.building)
        self._build_gate = self._worker.gate  # opened after a frame while a build waits for one
        # Held by the frame thread for a whole update(), and by the builder's thread while it swaps a
        # recompiled kernel into the graph between frames: an executable graph takes one caller at a time.
        self._graph_lock = threading.Lock()
        self.kernels = KernelTracker(builder, watch_files=watch_files, swapper=self._swap_between_frames)
        # The copy kernels that carry a first bypass (``bypass.Carry``): built in the background from the
        # first frame on, beside the patch's own first kernels, so a bypass finds them loaded.
        self.resources.want_copy_kernels(builder)
        self.wait_for_compile = wait_for_compile
        self.context = Context(code_listener=self._code_edited)
        #: How often each update tier ran since the engine started (``EngineCounters``: ``frames``,
        #: ``rebuilds``, ``hot_updates``, ``warm_updates``, ``code_swaps``, ``faults`` ...). Plain
        #: integers the engine increments: read them, never write them.
        self.counters = EngineCounters()
        #: Where the last structure change spent its host time (``BuildTiming``: ``tier``, ``compile_ms``,
        #: ``realize_ms``, ``total_ms``, ``reap_ms``), filled by the update that applied it.
        self.last_build = BuildTiming()
        self.profiling = ProfilingLevel.NONE
        self.debug_launch = debug_launch
        self._faults = FaultState()
        self._board = DiagnosticBoard(self.context.registry, kernels=self.kernels, faults=self._faults, logger=log)
        self._code = CodeTier(
            resources=self.resources,
            context=self.context,
            kernels=self.kernels,
            faults=self._faults,
            board=self._board,
            counters=self.counters,
            graph_lock=self._graph_lock,
        )
        self._params = ParamTier(dirty=self.context.dirty, board=self._board, counters=self.counters)
        self._bypass = BypassTier(
            context=self.context,
            board=self._board,
            counters=self.counters,
            discard=self.resources.discard_later,
            copies=self.resources.copy_kernels,
        )
        # Fused kernels recompiled with their resting scalar values, swapped in by the Code tier.
        self._specializer: Specializer | None = None
        if fuse:
            self._specializer = Specializer(lambda: self.resources.graph, builder, self.kernels.ready)
        self._builds = GraphBuilds(
            context=self.context,
            kernels=self.kernels,
            resources=self.resources,
            faults=self._faults,
            board=self._board,
            counters=self.counters,
            timing=self.last_build,
            settle_compiles=partial(settle_compiles, self._code, self.kernels),
            bypass=self._bypass.apply,
            fuse=fuse,
            reuse_buffers=reuse_buffers,
            pace=self._worker.pace,
            on_generalize=self._specializer.arm if self._specializer is not None else None,
        )
        self._recovery = Recovery(
            context=self.context,
            resources=self.resources,
            kernels=self.kernels,
            faults=self._faults,
            board=self._board,
            counters=self.counters,
            cache_dir=self.kernel_cache.directory,
        )
        self._structure = StructureTier(
            builds=self._builds,
            worker=self._worker,
            params=self._params,
            code=self._code,
            resources=self.resources,
            context=self.context,
            timing=self.last_build,
            collector=collector,
        )
        self._applier = EditApplier(
            settings=self,
            dirty=self.context.dirty,
            resources=self.resources,
            kernels=self.kernels,
            code=self._code,
            params=self._params,
            bypass=self._bypass,
            structure=self._structure,
            worker=self._worker,
            graph_lock=self._graph_lock,
        )
        self.background_builds = background_builds
        self._dirty = self.context.dirty
        self._probes = ProbeSet(self.context, lambda: self.resources.graph)
        self._frame_hooks: tuple[Any, ...] = ()
        self._last_gpu_ms: float | None = None
        self._closed = False
        log.info("engine on %r", self.device)

    # -- the frame --------------------------------------------------------------------------------
    def update(self) -> None:
        """Apply pending edits with the cheapest tier, then launch the graph. Never waits for the GPU.

        Raises:
            CudaError: the launch failed (the error is also recorded as a diagnostic).
        """
        # The plain frame, inline: no structure or code edit, no build or compile to take, no frame
        # hooks, no fault; a Hot, Warm or Bypass edit at most. Its Python is what a quiet ``update()``
        # costs beyond its launch (target ≤ 1.5x a bare ``cuGraphLaunch``: bench_liveness.py) and what
        # such an edit's frame costs besides the edit; the general path below does the same and more,
        # at 0.5-0.8 µs more.
        g = self.resources.graph
        dirty, worker, kt = self._dirty, self._worker, self.kernels
        if (
            g is not None
            and not (
                dirty.beyond_params or worker.busy or worker.tailing or worker.done or kt.ready or self._frame_hooks
            )
            and not self.debug_launch
            and self.profiling is not _DEEP_SYNC
            and self._faults.lost is None
            and (kt.watcher is None or not kt.watcher.ready)
        ):
            lock = self._graph_lock
            lock.acquire()  # (not ``with``: its two special-method calls were a fifth of this path's Python)
            try:
                res = self.resources
                if res.graph is g:  # (else another thread swapped or closed it meanwhile: the general path)
                    self.device.make_current()
                    if FRAME_GUARD.busy:  # background Python runs beside frames: it waits for this one
                        FRAME_GUARD.enter()
                    try:
                        if dirty.any:
                            if not self._edits(res):  # a fault of an earlier frame surfaced: recovered, no launch
                                self._open_gates()
                                return
                            g = res.graph
                        if g is not None:
                            try:
                                g.launch(res.stream)
                            except CudaLaunchError as exc:  # a fault of an earlier frame surfaced in this launch
                                self._recover(exc, None)
                                self._open_gates()
                                return
                            except CudaError as exc:
                                self._launch_failed(exc)
                                raise
                            if g.readback is not None:
                                g.readback.record(self.counters.frames)
                    finally:
                        if FRAME_GUARD.owner:  # (entered above, or by an edit that started a build)
                            FRAME_GUARD.leave()
                    self.counters.frames += 1
                    g = None
            finally:
                lock.release()
            if g is None:
                if kt.to_submit:
                    kt.flush()
                if self._gate.wanted:
                    self._gate.open()
                if self._build_gate.wanted:
                    self._build_gate.open()
                return
        if self._faults.lost is not None:  # CUDA refuses this process after a fault: nothing to launch
            self.counters.frames += 1
            return
        # A build in flight waits at its checkpoints while this frame runs (``pacing.FrameGuard``; a
        # build this frame starts waits too: ``EditApplier.apply``), as do a replaced plan being freed
        # after a build and other background Python that says it is ``working``.
        if self._worker.busy or self._worker.tailing or FRAME_GUARD.busy:
            FRAME_GUARD.enter()
        try:
            with self._graph_lock:
                dirty = self._dirty
                # Clean, Hot or Warm: no collector pause. A finished build is taken like an edit.
                if not ((dirty.any and dirty.beyond_params) or self.kernels.ready or self._worker.done):
                    self._frame()
                else:  # builds allocate: Python's collector runs after this frame, not inside it
                    pause_collector()  # (measured on the H100 host: 0.25-0.8 ms collections inside edit frames)
                    try:
                        self._frame()
                    finally:
                        resume_collector()
        finally:
            if FRAME_GUARD.owner:
                FRAME_GUARD.leave()  # (nothing when another engine's frame thread holds it)
        self._open_gates()

    def _open_gates(self) -> None:
        # (the quiet frame's inline path tests the two flags itself: a call less)
        if self._gate.wanted:  # the kernel builder has work: it runs now, between this frame and the next
            self._gate.open()
        if self._build_gate.wanted:  # a build waits to instantiate: the driver is ours until the next frame
            self._build_gate.open()

    def _frame(self) -> None:
        self.device.make_current()
        res = self.resources
        hooks = self._frame_hooks
        for h in hooks:  # GL interop: map shared resources (may rebind a moved pointer: Warm)
            h.before_launch(res.stream)
        kt = self.kernels
        if kt.ready:  # a deque test when no compile finished (specialisations wait while a build lands)
            self._code.apply(kt.collect(), specialize=not self._worker.done)
        if kt.watcher is not None and kt.watcher.ready:
            kt.file_events()  # recompiles start in the background; results arrive in later frames
        if self._worker.done:  # a build finished on the build thread: swap it in at this frame boundary
            self._structure.finish()
        if self._dirty.any and not self._edits(res):
            return
        g = res.graph
        if g is not None:
            culprit = None
            try:
                # A fault of an earlier frame surfaces as the launch's error. A query of the stream or of
                # a per-frame event was tried: with GL interop pending on the stream it could stall the
                # frame, so there is none. The readback ring is read when its values are asked for
                # (append counts, stats), with plain loads: nothing of it runs here but a count.
                rb = g.readback
                if self.debug_launch:
                    culprit = g.replay(res.stream)  # node by node, a synchronize after each block
                    if culprit is not None:
                        if in_fused_node(g.plan, culprit):  # a fused kernel: the unfused replay names the member
                            culprit = None
                        raise CudaLaunchError("a kernel faulted in debug launch", name="CUDA_ERROR_ILLEGAL_ADDRESS")
                else:
                    try:
                        g.launch(res.stream)
                    except CudaError as exc:
                        self._launch_failed(exc)
                        raise
                if rb is not None:
                    rb.record(self.counters.frames)
                    if self.profiling is ProfilingLevel.DEEP_SYNC:  # exact numbers for this frame, by design
                        self.device.synchronize()
                        rb.poll()
            except CudaLaunchError as exc:  # sticky: the context is dead; survive it
                self._recover(exc, culprit)
                return
        for h in hooks:  # copies into GL textures, then one unmap: GL work is ordered after the launch
            h.after_launch(res.stream)
        self.counters.frames += 1
        if kt.to_submit:
            kt.flush()  # compiles start after the launch, so the worker never delays it

    def _edits(self, res: DeviceResources) -> bool:
        """Apply the pending edits at this frame boundary with the cheapest tier: Hot, Warm and Bypass
        on the running graph, anything else (or a graph being retired) through ``EditApplier.apply``.

        Returns:
            False when a fault of an earlier frame surfaced meanwhile (recovered from: no launch now).
        """
        dirty = self._dirty
        try:
            if not dirty.beyond_params and res.graph is not None and not res.retiring:
                if dirty.bypass:
                    self._bypass.apply(res.graph)
                if dirty.structure:  # a bypassed block runs in a fused kernel or shared buffers: rebuild now
                    self._applier.apply()
                elif (dirty.params or dirty.bindings) and self._params.apply(res.graph):
                    self._applier.apply()  # a re-capture only a new graph can hold
            else:
                self._applier.apply()
        except CudaLaunchError as exc:  # a fault of an earlier frame surfaced in an update call
            self._recover(exc, None)
            return False
        return True

    def _launch_failed(self, exc: CudaError) -> None:
        if not isinstance(exc, CudaLaunchError):  # a fault is recovered from; a refused launch is reported
            self._board.add_error(Diagnostic("error", None, DiagnosticCode.LAUNCH, str(exc)))

    # -- faults -------------------------------------------------------------------------------------
    def _recover(self, exc: CudaLaunchError, culprit: int | None) -> None:
        self._structure.drop()  # built in the context recovery resets: never installed
        self._recovery.recover(exc, culprit)
        self.counters.frames += 1

    def prepare_fault_replay(self, standby: ReplayStandby | None = None, *, reset: bool = True) -> None:
        """Start the process that names a faulting block by replay now, not at the fault: a fault is
        then attributed without an interpreter start (the isolated engine's child does this). It
        holds a CUDA context until the fault or ``close``.

        Args:
            standby: One started earlier (e.g. while this process imported the engine), used if it
                runs on this engine's device; else it is closed and a new one started.
            reset: Whether a fault tries to reset the CUDA context and go on in this process. False
                for a process that is replaced after a fault anyway: the engine is lost at once,
                without the reset the driver refuses (about 0.1 s on H100 + driver 580).
        """
        recovery = self._recovery
        recovery.reset_context = reset
        if standby is not None and (
            self._closed or recovery.replay_standby is not None or standby.device != self.device.ordinal
        ):
            standby.close()
            standby = None
        if recovery.replay_standby is None and not self._closed:
            recovery.replay_standby = standby or ReplayStandby(self.device.ordinal)

    def report_fault(self, exc: CudaLaunchError) -> None:
        """Survive a sticky GPU fault that a call outside ``update()`` met first (a synchronize, a
        read, an interop call of the host's): as ``update()`` would, find the faulting block and
        disable it, or mark the engine ``lost``. Ignored once the engine is lost."""
        if self._faults.lost is not None or self._closed:
            return
        with self._graph_lock:
            self._recover(exc, None)

    @property
    def lost(self) -> str | None:
        """Why the engine stopped launching, when CUDA refused to continue after a fault; else None."""
        return self._faults.lost

    @property
    def fault_times(self) -> dict[str, float]:
        """When the last fault's recovery steps happened, as ``time.monotonic()`` stamps: ``surfaced``,
        the replay process's ``replay_read`` (the request read), ``replay_kernels`` (kernels loaded),
        ``replay_built`` (graph realized), ``replay_faulted`` (launched block by block), then ``named``
        (the faulting block found) and ``reset`` (the context reset, refused, or not tried). Empty
        before a fault; the replay's steps are missing when a block was named without one."""
        return dict(self._recovery.times)

    # -- Code tier (``tiers.py``) -----------------------------------------------------------------------
    def _swap_between_frames(self, o: KernelOutcome) -> bool:
        return self._code.swap_between_frames(o)  # the KernelTracker's swapper, made before the CodeTier

    def _code_edited(self, key: tuple[int, int]) -> bool:
        """A kernel's code changed (``Context(code_listener=...)``): hand it to the compiler now (see
        ``CodeTier.edited``). Returns False to leave it to ``update()``: with ``wait_for_compile``
        (which waits there) or when the kernel is not in the patch."""
        return not (self.wait_for_compile or self._closed) and self._code.edited(key)

    def wait_ready(self, timeout: float | None = 120.0) -> None:
        """Wait until every kernel in the patch has compiled (or failed), and build the graph.

        For scripts, tests and offline rendering; a live host never calls this. Launches nothing.

        Raises:
            CudaError: a driver call failed while building.
        """
        self.device.make_current()
        self._applier.wait_ready(timeout)

    @property
    def building(self) -> bool:
        """True while a structure edit is being built on the build thread (the running graph keeps
        launching until the first ``update()`` after it is ready)."""
        return self._structure.building

    def __repr__(self) -> str:
        blocks = len(self.context.registry)
        return f"<Engine '{self.name}' device={self.device.ordinal} blocks={blocks} closed={self._closed}>"

    def _graph_installed(self, graph: Any) -> None:
        """A new running graph: its fused kernels are specialised once their values rest (the patch that
        puts a node's generic kernel back asks for that again: its ``on_generalize``, given at ``realize``)."""
        specializer = self._specializer
        if specializer is not None:  # (it finds the fused kernels on its own thread, not in this frame)
            specializer.arm()

    # -- teardown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the GPU, release graph, modules, buffers, stream and context; idempotent.

        Raises:
            CudaError: a driver call failed during teardown.
        """
        if self._closed:
            return
        self._closed = True
        if self._specializer is not None:
            self._specializer.close()
        self._code.close()
        with self._graph_lock:  # a swap between frames that began before the flag was set ends first
            self._structure.drop()  # the build in flight ends; its graph is freed, never installed
        self._worker.close()
        faults = self._faults
        if faults.lost is None:
            self.device.make_current()
            try:
                self.device.synchronize()
            except CudaLaunchError as exc:  # a fault nobody saw yet: the context is as good as lost
                faults.mark_lost(f"the GPU context is lost after {exc.name}")
        self._recovery.close()
        for b in list(self.context.registry):
            self.context.unregister_block(b)
        self.kernels.close()  # first: the builder's thread loads modules into the context
        if faults.lost is not None:  # every driver call would fail: forget, do not free
            self.resources.abandon()
        else:
            self.resources.close()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
