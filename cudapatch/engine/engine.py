"""Engine: the one active part. Compiles all blocks into one CUDA graph, and applies every edit with
the cheapest correct update before launching each frame.

The engine orchestrates; each concept it uses lives in its own object:

- ``DeviceResources`` (``resources.py``): the CUDA context and everything in it (stream, pool,
  library handles, modules, the running and retired graphs, uploads), with one ``reset``.
- ``KernelTracker`` (``kernels.py``): background compiles and what each finished one asks for.
- ``ParamTier`` and ``CodeTier`` (``tiers.py``): Hot, Warm, Recapture and Code updates, in place.
- ``GraphBuilds`` (``build.py``): the Cold tier and the Warm resize, prepared on the ``BuildWorker``
  (``build_thread.py``) while the old graph keeps launching, swapped in at a frame boundary.
- ``FaultState`` (``faults.py``): disabled blocks, failed library calls, a lost context.
- ``DiagnosticBoard`` (``board.py``): every diagnostic by source; the one writer of block states.
- ``stats.py``: what a completed frame measured, read without side effects; the tier counters.
- ``Recovery`` (``recovery.py``): surviving a sticky GPU fault through the objects above.

``update()`` with nothing dirty tests one flag, polls the readback ring (plain loads from host-mapped
memory the graph publishes into, only when it has append buffers or timestamps), and launches: one
driver call, no allocation, no synchronize, no per-block loop.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..blocks.block import Block
from ..blocks.shape import Shape
from ..errors import (
    BindingError,
    CudaError,
    CudaLaunchError,
    CudapatchError,
)
from ..kernels._driver import check, driver
from ..kernels.builder import KernelBuilder
from ..kernels.cache import CubinCache
from ..kernels.module_cache import ModuleCache
from ..kernels.types import DType
from .bindings import binding_from_cai
from .board import DiagnosticBoard
from .buffers import AppendBuffer, BufferPool, GpuBuffer
from .build import BuildOutcome, GraphBuilds
from .build_thread import BuildWorker
from .context import Context, ExternalBinding
from .diagnostics import Diagnostic, DiagnosticCode
from .faults import FaultState
from .kernels import KernelOutcome, KernelTracker
from .libraries import LibraryHandles
from .probes import Probe, ProbeSet
from .profiling import EngineStats, ProfilingLevel
from .realize import CompiledGraph
from .recovery import Recovery
from .region_stats import region_iterations, region_warnings, show_iterations
from .replay import ReplayStandby
from .resources import PUBLISH_KERNEL as PUBLISH_KERNEL  # re-exported: the kernel that ends timed graphs
from .resources import DeviceResources, close_graphs
from .stats import BuildTiming, EngineCounters, append_warnings, collect_stats, newest_frame, show_on_blocks
from .tiers import CodeTier, ParamTier

__all__ = ["Engine", "EngineCounters", "BuildTiming"]

log = logging.getLogger("cudapatch.engine")


class Engine:
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
            kernel each (docs/expressions.md). Off by default: a fused intermediate has no buffer, so
            ``output()``/``read()`` of it fails.
        reuse_buffers: Let outputs whose lifetimes do not overlap share device memory (see ``keep``
            and docs/architecture.md, memory phase). False: every output has a buffer of its own.

    A sticky GPU fault (illegal address, ...) does not end the process: the next ``update()`` resets
    the context, finds the faulting block by replaying block by block, disables it (its outputs read
    as zeros, an error on it, warnings on its dependents) and rebuilds; see ``engine.recovery``.

    Raises:
        CudaUnavailableError: no cuda-bindings, no driver or no device (says which).
        CudaError: another driver call failed.
    """

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
        fuse: bool = False,
        reuse_buffers: bool = True,
    ) -> None:
        #: The CUDA context and everything in it (renewed in place after a GPU fault).
        self.resources = DeviceResources(device)
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
        # Held by the frame thread for a whole update(), and by the builder's thread while it swaps a
        # recompiled kernel into the graph between frames: an executable graph takes one caller at a time.
        self._graph_lock = threading.Lock()
        self.kernels = KernelTracker(builder, watch_files=watch_files, swapper=self._swap_between_frames)
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
        self._builds = GraphBuilds(
            context=self.context,
            kernels=self.kernels,
            resources=self.resources,
            faults=self._faults,
            board=self._board,
            counters=self.counters,
            timing=self.last_build,
            settle_compiles=self._settle_compiles,
            fuse=fuse,
            reuse_buffers=reuse_buffers,
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
        #: The thread structure edits are built on (``background_builds``).
        self._worker = BuildWorker(lambda: self.resources.device.make_current())
        self.background_builds = background_builds
        self._dirty = self.context.dirty
        self._probes = ProbeSet(self.context, lambda: self.resources.graph)
        self._frame_hooks: tuple[Any, ...] = ()
        self._last_gpu_ms: float | None = None
        self._closed = False
        log.info("engine on %r", self.device)

    @property
    def stream(self) -> Any:
        """The ``CUstream`` every frame is launched on (read-only): a non-blocking stream of the
        device's primary context.

        For hosts that interoperate: work queued on this stream after ``update()`` runs after that
        frame, and work queued before it runs before the frame, with no synchronize, e.g. CuPy::

            s = cupy.cuda.Stream.from_external(engine)  # CuPy >= 14; before: ExternalStream(int(engine.stream))
            engine.update()
            with s:
                result = cupy.asarray(engine.output(block, "Out")) * 2  # after the frame

        Outputs are only valid for work ordered after the frame this way (or after
        ``synchronize()``). A GPU fault renews the stream with the context (see ``engine.recovery``):
        take it again after a fault instead of keeping it.
        """
        return self.resources.stream

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, ``int(engine.stream)``): libraries that take a stream
        object (CuPy's ``Stream.from_external``, cuda.core) order their work with the engine's frames."""
        return 0, int(self.resources.stream)

    @property
    def pool(self) -> BufferPool:
        """The buffer pool (a new one after a GPU fault reset the context)."""
        return self.resources.pool

    @property
    def libraries(self) -> LibraryHandles:
        """cuBLAS/cuFFT/cuRAND/cuSOLVER/cuSPARSE handles, plans and workspaces for captured calls."""
        return self.resources.libraries

    @property
    def modules(self) -> ModuleCache:
        """The modules loaded into the engine's context."""
        return self.resources.modules

    # -- patch editing (cheap: only marks dirty) ---------------------------------------------------
    def add(self, block: Block, *, region: Block | None = None) -> Block:
        """Register ``block`` with this engine (Cold on the next update), inside ``region`` (an ``If``,
        ``While`` or ``For`` added before) if given. Returns it.

        Raises:
            CudapatchError: ``region`` is not a region of this engine.
        """
        self._faults.patch_edited()
        self.context.register_block(block)
        if region is not None:
            self.context.place(block, region)
        return block

    def place(self, block: Block, region: Block | None) -> None:
        """Move ``block`` into ``region`` (an ``If``, ``While`` or ``For``), or to the top level with
        None (Cold on the next update); its links stay. See ``cudapatch.blocks.regions``.

        Raises:
            CudapatchError: ``region`` is not a region of this engine, or is ``block`` or inside it.
        """
        self._faults.patch_edited()
        self.context.place(block, region)

    def remove(self, block: Block) -> None:
        """Unregister ``block``, dropping its links (Cold on the next update)."""
        self.resources.drop_uploads(block.id, later=self._worker.busy)  # a build in flight may read them
        self._faults.block_removed(block.id)
        self.context.unregister_block(block)
        self._board.clear_block_error(block.id)

    def disable(self, block: Block, reason: str) -> None:
        """Leave ``block``'s kernels out of the graph, as after a GPU fault: its outputs read as zeros,
        blocks reading them are warned, and ``reason`` is its error diagnostic until its code changes
        (Cold on the next update). A host that restarted its process after a fault uses it to keep
        the faulting block off."""
        self._faults.disable(block.id, reason)
        self._dirty.mark_structure()

    def connect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> None:
        """Link an output to an input (Cold on the next update).

        Raises:
            LinkError: unknown port, incompatible pins, a cycle, or a block of another engine.
        """
        self._faults.patch_edited()
        self.context.connect(src, src_port, dst, dst_port)

    def disconnect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> bool:
        """Remove a link (Cold on the next update); returns whether it existed."""
        self._faults.patch_edited()
        return self.context.disconnect(src, src_port, dst, dst_port)

    def bind(self, block: Block, port: str, array: Any, *, dtype: DType | None = None) -> None:
        """Bind external data to an input port.

        ``array`` may be a ``GpuBuffer``, any object with ``__cuda_array_interface__`` (CuPy, Numba,
        PyTorch: bound without a copy; keep it alive and finish writing it before the next update),
        or a host array (copied into an engine-owned buffer; binding a host array of the same size
        again only re-uploads). A different device pointer of the same size is a Warm update; a
        different size is Cold.

        Raises:
            BindingError: unknown port, wrong element type, non-contiguous memory.
        """
        inp = block.description.input(port)
        if inp is None:
            raise BindingError("unknown input port", block=block.name, port=port)
        want = dtype or inp.dtype
        if isinstance(array, GpuBuffer):
            binding = ExternalBinding(array.ptr, array.count, array.dtype, owner=array)
        elif hasattr(array, "__cuda_array_interface__"):
            binding = binding_from_cai(array, want, block.name, port)
        else:
            binding = self.resources.upload(block.id, port, array, want, block.name)
        self._faults.input_bound(block.id, port)
        self.context.bind_input(block, port, binding)

    def keep(self, block: Block, port: str, keep: bool = True) -> None:
        """Keep an output (or the value an input reads) in a buffer of its own: buffer reuse never
        lets another value overwrite it, so it can be read after each frame (Cold on the next update
        if that changes the plan). ``output`` and ``read`` keep what they are asked for by
        themselves; ``keep=False`` lets a port share again.

        Raises:
            CudapatchError: the block has no such port.
        """
        self.context.keep(block, port, keep)

    def probe(self, block: Block, port: str, *, shape: tuple[int, int] | None = None) -> Probe:
        """Probe a wire: min, max, mean and NaN/Inf counts of output ``port`` (an input: the output linked
        into it), computed by a probe node inside the graph and read back through the readback ring.
        ``probe.stats`` is the newest completed frame's (with its frame number); reading it never waits.
        ``shape`` ``(height, width)`` makes it an image with a thumbnail (see ``engine.probes``).

        Adding or closing a probe is a structure edit: built on the build thread while the running graph
        keeps launching. The same output probed twice gives the same ``Probe``.

        Raises:
            LinkError: unknown port, an unlinked input, or another engine's block.
        """
        return self._probes.add(block, port, shape)

    @property
    def probes(self) -> tuple[Probe, ...]:
        """The open probes."""
        return tuple(self._probes)

    def add_frame_hook(self, hook: Any) -> None:
        """Call ``hook.before_launch(stream)`` and ``hook.after_launch(stream)`` around every launch.

        For GL interop (``cudapatch.interop.GlBridge``): mapping and unmapping shared resources on
        the engine's stream. Hooks run in the order they were added."""
        if hook not in self._frame_hooks:
            self._frame_hooks += (hook,)

    def remove_frame_hook(self, hook: Any) -> None:
        """Stop calling ``hook`` (no error if it was not added)."""
        self._frame_hooks = tuple(h for h in self._frame_hooks if h is not hook)

    def set_profiling(self, level: str | ProfilingLevel) -> None:
        """Set the profiling level (``"None"``, ``"Summary"``, ``"PerBlock"``, ``"PerKernel"``,
        ``"DeepAsync"``, ``"DeepSync"``). Event nodes are part of the graph, so a change rebuilds it.

        Raises:
            CudapatchError: unknown level (the current level stays).
        """
        new = ProfilingLevel.parse(level)
        if new is not self.profiling:
            self.profiling = new
            self._dirty.mark_structure()

    # -- the frame --------------------------------------------------------------------------------
    def update(self) -> None:
        """Apply pending edits with the cheapest tier, then launch the graph. Never waits for the GPU.

        Raises:
            CudaError: the launch failed (the error is also recorded as a diagnostic).
        """
        if self._faults.lost is not None:  # CUDA refuses this process after a fault: nothing to launch
            self.counters.frames += 1
            return
        with self._graph_lock:
            dirty = self._dirty
            # Clean, Hot or Warm: no collector pause. A finished build is taken like an edit.
            if not ((dirty.any and not dirty.only_params) or self.kernels.ready or self._worker.done):
                self._frame()
            elif gc.isenabled():  # builds allocate: Python's collector runs after this frame, not inside it
                gc.disable()  # (measured on the H100 host: 0.25-0.8 ms collections inside edit frames)
                try:
                    self._frame()
                finally:
                    gc.enable()
            else:
                self._frame()
        if self._gate.wanted:  # the kernel builder has work: it runs now, between this frame and the next
            self._gate.open()

    def _frame(self) -> None:
        self.device.make_current()
        res = self.resources
        hooks = self._frame_hooks
        for h in hooks:  # GL interop: map shared resources (may rebind a moved pointer: Warm)
            h.before_launch(res.stream)
        kt = self.kernels
        if kt.ready:  # a deque test when no compile finished
            self._code.apply(kt.collect())
        if kt.watcher is not None and kt.watcher.ready:
            kt.file_events()  # recompiles start in the background; results arrive in later frames
        if self._worker.done:  # a build finished on the build thread: swap it in at this frame boundary
            self._finish_build()
        dirty = self._dirty
        if dirty.any:
            try:
                if dirty.only_params and res.graph is not None and not res.retiring:
                    if self._params.apply(res.graph):  # a re-capture only a new graph can hold
                        self._apply_changes()
                else:
                    self._apply_changes()
            except CudaLaunchError as exc:  # a fault of an earlier frame surfaced in an update call
                self._recover(exc, None)
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
                        raise CudaLaunchError("a kernel faulted in debug launch", name="CUDA_ERROR_ILLEGAL_ADDRESS")
                else:
                    try:
                        g.launch(res.stream)
                    except CudaError as exc:
                        self._launch_failed(exc)
                        raise
                if rb is not None:
                    rb.record(res.stream, self.counters.frames)
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

    def _launch_failed(self, exc: CudaError) -> None:
        if not isinstance(exc, CudaLaunchError):  # a fault is recovered from; a refused launch is reported
            self._board.add_error(Diagnostic("error", None, DiagnosticCode.LAUNCH, str(exc)))

    # -- faults -------------------------------------------------------------------------------------
    def _recover(self, exc: CudaLaunchError, culprit: int | None) -> None:
        self._drop_build()  # built in the context recovery resets: never installed
        self._recovery.recover(exc, culprit)
        self.counters.frames += 1

    def prepare_fault_replay(self) -> None:
        """Start the process that names a faulting block by replay now, not at the fault: a fault is
        then attributed without an interpreter start (the isolated engine's child does this). It
        holds a CUDA context until the fault or ``close``."""
        if self._recovery.replay_standby is None and not self._closed:
            self._recovery.replay_standby = ReplayStandby(self.device.ordinal)

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

    # -- Code tier (``tiers.py``) -----------------------------------------------------------------------
    def _swap_between_frames(self, o: KernelOutcome) -> bool:
        return self._code.swap_between_frames(o)  # the KernelTracker's swapper, made before the CodeTier

    def _code_edited(self, key: tuple[int, int]) -> bool:
        """A kernel's code changed (``Context(code_listener=...)``): hand it to the compiler now (see
        ``CodeTier.edited``). Returns False to leave it to ``update()``: with ``wait_for_compile``
        (which waits there) or when the kernel is not in the patch."""
        return not (self.wait_for_compile or self._closed) and self._code.edited(key)

    def _settle_compiles(self) -> None:
        self._code.settle_fused()  # kernels of fused groups a member's edit regenerated
        self._code.apply(self.kernels.collect(wait=True))

    def wait_ready(self, timeout: float | None = 120.0) -> None:
        """Wait until every kernel in the patch has compiled (or failed), and build the graph.

        For scripts, tests and offline rendering; a live host never calls this. Launches nothing.

        Raises:
            CudaError: a driver call failed while building.
        """
        self.device.make_current()
        waiting, self.wait_for_compile = self.wait_for_compile, True  # one build, with every kernel in it
        try:
            with self._graph_lock:
                if self._worker.busy:  # the build in flight first: its outcome is applied, then built anew
                    self._worker.wait()
                    self._finish_build()
                while True:
                    self._code.settle_fused(timeout)
                    self._code.apply(self.kernels.collect(wait=True, timeout=timeout))
                    if self._dirty.any:
                        self._apply_changes()
                    if not self.kernels.pending:
                        return
        finally:
            self.wait_for_compile = waiting

    # -- an edit frame: the tiers in order -----------------------------------------------------------
    def _apply_changes(self) -> None:
        """Apply what is dirty, most expensive tier first: Code (queue compiles), Structure (start a
        build, or build now: Cold or Warm resize), then Hot/Warm on the graph that runs now."""
        worker = self._worker
        dirty = self._dirty
        if not worker.busy:  # a build in flight may borrow from retired graphs' pool blocks: later
            t0 = time.perf_counter()
            # A build about to start closes the idle retired graphs on its own thread.
            self.resources.reap(graphs=not (dirty.structure and self._builds_off_thread))
            self.last_build.reap_ms = (time.perf_counter() - t0) * 1e3
        if dirty.code:
            self._code.submit(dirty.take_code())
            if self.wait_for_compile:
                self._settle_compiles()
        if dirty.structure:
            if self.wait_for_compile or not self.background_builds:
                if worker.busy:  # switched to building here while one was in flight: take it first
                    worker.wait()
                    self._finish_build()
                if self._builds.rebuild(self.profiling, wait_for_compile=self.wait_for_compile):
                    self._log_build()
                    return
                dirty.defer_structure()  # a failed rebuild is not retried every frame; the next edit retries
            elif not worker.busy:  # (``_builds_off_thread``)
                self._start_build()
            # else: a build is in flight; this edit and any others coalesce into the next one
        dirty.forget_code_and_captured()
        g = self.resources.graph
        if g is None:
            self._params.carry(*dirty.take_params())  # nothing runs yet: the build in flight gets them
        elif (dirty.params or dirty.bindings) and self._params.apply(g) and not worker.busy:
            self._apply_changes()  # a re-capture only a new graph can hold

    # -- builds on the build thread ------------------------------------------------------------------
    @property
    def building(self) -> bool:
        """True while a structure edit is being built on the build thread (the running graph keeps
        launching until the first ``update()`` after it is ready)."""
        return self._worker.busy

    def _start_build(self) -> None:
        """Freeze the patch and hand the build to the build thread (frame thread, in an edit frame)."""
        dirty = self._dirty
        job = self._builds.job(self.profiling, off_thread=True)
        dirty.defer_structure()  # taken: edits from now on mark it again and coalesce into the next build
        self._params.begin_carry()
        self._code.begin_carry()
        builds = self._builds
        idle = self.resources.take_idle()

        def build() -> BuildOutcome:
            close_graphs(idle)
            return builds.prepare(job)

        self._worker.submit(build)

    @property
    def _builds_off_thread(self) -> bool:
        return self.background_builds and not self.wait_for_compile

    def _finish_build(self) -> None:
        """Apply the build the build thread finished (frame thread, at a frame boundary): swap in the
        new graph or patch the running one, re-apply the Hot and Warm values set meanwhile; a failed
        build keeps the running graph and puts its errors on the blocks."""
        try:
            out: BuildOutcome = self._worker.take()
            ok = self._builds.finish(out)
        except BaseException:
            self._params.end_carry(None)
            self._code.end_carry(None)
            raise
        g = self.resources.graph if ok else None
        self._code.end_carry(g)  # kernels recompiled during the build: their new functions, then values
        self._params.end_carry(g)
        if ok:
            self._log_build()

    def _drop_build(self) -> None:
        """Wait for the build in flight and throw its outcome away (closing, or a fault resets the context)."""
        worker = self._worker
        if not worker.busy:
            return
        worker.wait()
        try:
            out: BuildOutcome = worker.take()
        except Exception as exc:  # nobody will use it: say so, and go on
            log.warning("a build in flight failed while the engine dropped it: %s", exc)
        else:
            out.discard()
        self._params.end_carry(None)
        self._code.end_carry(None)
        self._dirty.mark_structure()

    def _log_build(self) -> None:
        t = self.last_build
        g = self.resources.graph
        if t.tier == "deferred" or g is None:
            return
        blocks = len(g.plan.block_order)
        log.info(
            "%s build: %.1f ms (plan %.1f, realize %.1f), %d of %d blocks running",
            t.tier,
            t.total_ms,
            t.compile_ms,
            t.realize_ms,
            blocks,
            len(self.context.registry),
        )

    # -- reading results ----------------------------------------------------------------------------
    @property
    def graph(self) -> CompiledGraph | None:
        """The compiled graph running now (None before the first successful build)."""
        return self.resources.graph

    def synchronize(self) -> None:
        """Wait for all launched frames.

        Raises:
            CudaError: a launched kernel faulted.
        """
        self.device.make_current()
        self.device.synchronize()

    def output(self, block: Block, port: str, *, keep: bool = True) -> GpuBuffer:
        """The device buffer of an output (valid until the next rebuild; view it with CuPy for no copy).
        A value inside a FrameDelay loop lives in two buffers that swap every frame: this is the one
        the frame launched last wrote (take it again each frame).

        The output is kept in a buffer of its own from then on (``keep``), so the view stays valid and
        its data stays readable: buffer reuse never lets another value overwrite it. If the running
        graph already lets a later value overwrite it, this raises, and the next ``update()`` builds
        the graph that keeps it (call ``keep`` before the first update to avoid that). ``keep=False``
        only looks (sizes for a tooltip): the output may stay shared.

        Raises:
            CudapatchError: the block is not compiled, has no such output, or (once) its buffer is
                reused by a later output in the running graph.
        """
        g = self.resources.graph
        if keep and block.description.output(port) is not None:
            overwritten = g is not None and g.overwritten(block.id, port)
            self.context.keep(block, port, rebuild=overwritten)  # later builds keep it; now, only if needed
            if overwritten:
                raise CudapatchError(
                    "this output shares its buffer with outputs written after it in the frame (buffer reuse), "
                    "so its data is gone by the end of the frame; it is kept in its own buffer from the next "
                    "update() on (to keep it from the start: engine.keep(block, port) before the first "
                    "update, keep=True on the port, or Engine(reuse_buffers=False))",
                    block=block.name,
                    port=port,
                )
        buf = g.output(block.id, port) if g is not None else None
        if buf is None:
            if block.description.output(port) is None:
                raise CudapatchError("no such output port", block=block.name, port=port)
            if g is not None and g.overwritten(block.id, port):
                raise CudapatchError(
                    "this output shares its buffer with outputs written after it in the frame (buffer reuse)",
                    block=block.name,
                    port=port,
                )
            if g is not None and block.id in g.plan.block_order:
                raise CudapatchError(
                    "this output is fused into the next block's kernel and held in no buffer: make the block "
                    "with fuse=False, or the engine with fuse=False, to read it",
                    block=block.name,
                    port=port,
                )
            raise CudapatchError("block is not running in the current graph", block=block.name, port=port)
        return buf

    def read(self, block: Block, port: str) -> np.ndarray:
        """Copy an output to the host. **Synchronizes** (by design): not for the frame path.

        Append outputs return only the elements written in the last frame; 2-D and 3-D outputs come
        shaped ``(h, w)`` / ``(d, h, w)`` (then channels, then vector lanes).

        Raises:
            CudapatchError: not compiled or no such output.
            CudaError: the copy failed (a kernel fault surfaces here).
        """
        buf = self.output(block, port)
        self.synchronize()
        data = buf.download()
        g = self.resources.graph
        ab = g.appends.get((block.id, port)) if g is not None else None
        if ab is not None:
            assert g is not None and g.counters is not None
            # The readback block holds the timestamps (uint64) first, then the counters (uint32).
            words = g.counters.download().view(np.uint32)
            raw = int(words[2 * g.plan.stamp_count + ab.counter_index])
            return data[: min(raw, ab.capacity)]
        shape = g.plan.shapes.get((block.id, port)) if g is not None else None
        if shape is not None:  # a 2-D/3-D output reads as an image or volume: (h, w[, channels][, lanes])
            data = data.reshape(shape.dims + ((shape.channels,) if shape.channels > 1 else ()) + data.shape[1:])
        return data

    def output_shape(self, block: Block, port: str) -> Shape:
        """The Shape of an output in the running graph (``(count,)`` for flat outputs).

        Raises:
            CudapatchError: not compiled or no such output.
        """
        buf = self.output(block, port)
        g = self.resources.graph
        shape = g.plan.shapes.get((block.id, port)) if g is not None else None
        return shape if shape is not None else Shape.flat(buf.count)

    def append_buffer(self, block: Block, port: str) -> AppendBuffer:
        """The append buffer of an append output; its ``count`` is from the last completed frame.

        Raises:
            CudapatchError: not compiled or not an append output.
        """
        g = self.resources.graph
        ab = g.appends.get((block.id, port)) if g is not None else None
        if ab is None:
            raise CudapatchError("no running append output of this name", block=block.name, port=port)
        return ab

    def iterations(self, region: Block) -> int | None:
        """The iterations a ``While`` or ``For`` ran in the newest completed frame, read from the
        readback ring without waiting (None before a frame completed, or for an If). Its age is the
        ring's (``stats().age``): a frame or two behind the last ``update()``."""
        return region_iterations(self.resources.graph, region.id)

    def stats(self) -> EngineStats:
        """GPU times (per block, per kernel), append fill, occupancy and pool use of the newest completed
        frame, read without waiting. Taking that frame also sets its per-frame warnings (append outputs
        nearly full) and refreshes what ``str(block)`` and ``str(engine)`` show.

        Cost is paid only here (host-side arithmetic on the ring's copy of the timestamps), never on
        the frame path.

        Raises:
            CudaError: a driver call failed (a GPU fault surfaces here).
        """
        self.device.make_current()
        g = self.resources.graph
        registry = self.context.registry
        with newest_frame(g) as reading:
            full = append_warnings(g.appends, registry) if g is not None and reading.frame is not None else ()
            if g is not None and reading.frame is not None and g.plan.regions:
                full += region_warnings(g, registry)
            self._board.frame_warnings(full)
            stats = collect_stats(
                level=self.profiling,
                blocks=registry,
                graph=g,
                reading=reading,
                pool=self.pool,
                diagnostics=self._board.current,
            )
        show_on_blocks(stats, registry)
        if g is not None and g.plan.regions:
            show_iterations(g, registry)  # "Iterations: 1860/20000" in a loop's tooltip
        self._last_gpu_ms = stats.gpu_ms
        return stats

    def diagnostics(self, block: Block | None = None) -> tuple[Diagnostic, ...]:
        """Current diagnostics (of one block, if given)."""
        if block is None:
            return self._board.current
        return self._board.of_block(block.id)

    @property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(self.context.registry)

    def __str__(self) -> str:
        g = self.resources.graph
        kernels = g.kernel_count if g is not None else 0
        mb = 1 / 2**20
        compiling = f" ({len(self.kernels.pending)} compiling)" if self.kernels.pending else ""
        if self._worker.busy:
            compiling += " (building)"
        launch = f"  Launch: {self._last_gpu_ms:.2f}ms\n" if self._last_gpu_ms is not None else ""
        return (
            f"{self.name}: {len(self.context.registry)} blocks, {kernels} kernels{compiling}\n"
            f"{launch}"
            f"  Profiling: {self.profiling}\n"
            f"  Pool: {self.pool.in_use_bytes * mb:.1f} MB / {self.pool.total_allocated_bytes * mb:.1f} MB"
            f"{self._reuse_line(g, mb)}"
        )

    @staticmethod
    def _reuse_line(g: CompiledGraph | None, mb: float) -> str:
        """What buffer reuse saves in the running graph (empty when nothing shares)."""
        mem = g.plan.memory if g is not None else None
        if mem is None or not mem.buffer_values():
            return ""
        return f"\n  Buffers: {g.plan.total_buffer_bytes * mb:.1f} MB for {mem.logical_bytes * mb:.1f} MB of outputs"  # type: ignore[union-attr]

    def __repr__(self) -> str:
        blocks = len(self.context.registry)
        return f"<Engine '{self.name}' device={self.device.ordinal} blocks={blocks} closed={self._closed}>"

    # -- teardown --------------------------------------------------------------------------------
    def close(self) -> None:
        """Wait for the GPU, release graph, modules, buffers, stream and context; idempotent.

        Raises:
            CudaError: a driver call failed during teardown.
        """
        if self._closed:
            return
        self._closed = True
        self._code.close()
        with self._graph_lock:  # a swap between frames that began before the flag was set ends first
            self._drop_build()  # the build in flight ends; its graph is freed, never installed
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
