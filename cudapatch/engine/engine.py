"""Engine: the one active part. Owns the device, compiles all blocks into one CUDA graph, and
applies every edit with the cheapest correct update before launching each frame.

``update()`` with nothing dirty tests one flag, polls the readback ring (plain loads from host-mapped
memory the graph publishes into, only when it has append buffers or timestamps), and launches: one
driver call, no allocation, no synchronize, no per-block loop.
"""

from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..blocks.block import Block, BlockState
from ..errors import (
    BindingError,
    CudaError,
    CudaLaunchError,
    CudapatchError,
    GraphCompileError,
    KernelLoadError,
    LibraryCallError,
)
from ..kernels._driver import check, driver
from ..kernels.builder import KernelBuilder
from ..kernels.cache import CubinCache
from ..kernels.cuda_source import CudaSource
from ..kernels.module_cache import ModuleCache
from ..kernels.types import DType
from .bindings import binding_from_cai, upload_host_array
from .buffers import AppendBuffer, BufferPool, GpuBuffer
from .compiler import compile_plan
from .context import Context, ExternalBinding
from .device import DeviceContext
from .diagnostics import Diagnostic, DiagnosticLog, Severity
from .kernels import KernelOutcome, KernelTracker
from .libraries import LibraryHandles
from .plan import GraphPlan
from .profiling import AppendStats, BlockStats, EngineStats, KernelStats, ProfilingLevel
from .readback import PUBLISH_SOURCE, STAMP_SOURCE
from .realize import CompiledGraph, realize
from .recovery import abandon_context_state, recover

__all__ = ["Engine", "EngineCounters", "BuildTiming"]

log = logging.getLogger("cudapatch.engine")


def _frozen_values(block: Any) -> tuple:
    """What a failed library call was tried with: a snapshot block's parameter values and description."""
    return (tuple(sorted((k, repr(v)) for k, v in dict(block.values).items())), block.description)


PUBLISH_KERNEL = CudaSource(code=PUBLISH_SOURCE, name="publish.cu")
STAMP_KERNEL = CudaSource(code=STAMP_SOURCE, name="stamp.cu")
LOW_OCCUPANCY = 0.25  # warn below this fraction of an SM's threads (occupancy API, Deep levels)
APPEND_FULL = 0.95  # warn when an append output is this full


@dataclass
class BuildTiming:
    """Where the last structure change spent its host time (ms); read by benchmarks and the overlay."""

    tier: str = ""
    reap_ms: float = 0.0  # closing graphs retired by earlier rebuilds
    compile_ms: float = 0.0  # snapshot + compile_plan
    realize_ms: float = 0.0  # buffers, kernel nodes, instantiate
    total_ms: float = 0.0  # compile to swap-in (excludes reap)


@dataclass
class EngineCounters:
    """How often each update tier ran (for tests, the overlay and benchmarks)."""

    frames: int = 0
    rebuilds: int = 0
    failed_rebuilds: int = 0
    hot_updates: int = 0
    warm_updates: int = 0
    warm_resizes: int = 0  # structure edits applied in place (counts/grids changed, buffers still fit)
    code_swaps: int = 0  # recompiled kernels swapped into the running graph
    recaptures: int = 0  # library calls captured again in place (pointer, size or host scalar changes)
    nodes_patched: int = 0
    faults: int = 0  # sticky GPU faults survived (context reset, faulting block disabled)


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
        wait_for_compile: Make ``update()`` wait for kernel compiles (deterministic scripts and
            offline rendering; never in a live host).
        debug_launch: Launch every frame node by node with a synchronize after each block, so a
            kernel fault is pinned on its block in the frame it happens (development only: slow).

    A sticky GPU fault (illegal address, ...) does not end the process: the next ``update()`` resets
    the context, finds the faulting block by replaying block by block, disables it (its outputs read
    as zeros, an error on it, warnings on its dependents) and rebuilds; see ``engine.recovery``.

    Raises:
        CudaUnavailableError: no cuda-bindings, no driver or no device (says which).
        CudaError: another driver call failed.
    """

    def __init__(
        self,
        device: int = 0,
        *,
        name: str = "CudaEngine",
        cache_dir: str | Path | None | bool = None,
        watch_files: bool = True,
        wait_for_compile: bool = False,
        debug_launch: bool = False,
    ) -> None:
        self.device = DeviceContext(device)
        self.name = name
        self.pool = BufferPool(self.device.make_current)
        #: cuBLAS/cuFFT/cuRAND/cuSOLVER/cuSPARSE handles, plans and workspaces for captured calls.
        self.libraries = LibraryHandles(self.device, self.pool)
        self.modules = ModuleCache(device_key=self.device.key)
        self.kernel_cache = CubinCache(cache_dir)
        builder = KernelBuilder(
            arch=self.device.arch,
            cache=self.kernel_cache,
            modules=self.modules,
            make_current=lambda: check(driver().cuCtxSetCurrent(self.device.context), "cuCtxSetCurrent"),
            paced=True,
        )
        self._gate = builder.gate  # opened after each frame while the builder has work
        # Held by the frame thread for a whole update(), and by the builder's thread while it swaps a
        # recompiled kernel into the graph between frames: an executable graph takes one caller at a time.
        self._graph_lock = threading.Lock()
        self.kernels = KernelTracker(builder, watch_files=watch_files)
        self.kernels.swapper = self._swap_between_frames
        self.wait_for_compile = wait_for_compile
        self.context = Context(code_listener=self._code_edited)
        self.counters = EngineCounters()
        self.last_build = BuildTiming()
        self.profiling = ProfilingLevel.NONE
        self._last_gpu_ms: float | None = None
        self._stamp_function: Any = None
        self._publish_function: Any = None  # the kernel that ends graphs with readback values
        self._frame_diags: tuple[Diagnostic, ...] = ()  # per-frame warnings (append buffers nearly full)
        self._graph: CompiledGraph | None = None
        self._retired: list[CompiledGraph] = []
        self._owned: dict[tuple[int, str], GpuBuffer] = {}  # buffers made from host arrays passed to bind()
        self._diagnostics: tuple[Diagnostic, ...] = ()
        self._build_diags: tuple[Diagnostic, ...] = ()
        self._published_diag_version = -1
        self._diaglog = DiagnosticLog(log)
        self._dirty = self.context.dirty
        self._stream = self.device.stream
        self._frame_hooks: tuple[Any, ...] = ()
        self.debug_launch = debug_launch
        self._faulted: dict[int, str] = {}  # blocks whose kernels faulted on the GPU -> message
        # Blocks whose library call failed to capture: id -> (kernel index, parameter values then, message).
        # Left out of the graph until their parameters or inputs change.
        self._call_failures: dict[int, tuple[int, tuple, str]] = {}
        self._fault_diags: tuple[Diagnostic, ...] = ()
        self._lost: str | None = None  # set when CUDA refuses to continue after a fault
        self._closed = False
        log.info("engine on %r", self.device)

    # -- patch editing (cheap: only marks dirty) ---------------------------------------------------
    def add(self, block: Block) -> Block:
        """Register ``block`` with this engine (Cold on the next update). Returns it."""
        self._call_failures.clear()  # an edit may fix a failed library call: try again
        return self.context.register_block(block)

    def remove(self, block: Block) -> None:
        """Unregister ``block``, dropping its links (Cold on the next update)."""
        for key in [k for k in self._owned if k[0] == block.id]:
            self._owned.pop(key).close()
        self._faulted.pop(block.id, None)
        self._call_failures.clear()  # an edit may fix a failed library call: try again
        self.context.unregister_block(block)

    def disable(self, block: Block, reason: str) -> None:
        """Leave ``block``'s kernels out of the graph, as after a GPU fault: its outputs read as zeros,
        blocks reading them are warned, and ``reason`` is its error diagnostic until its code changes
        (Cold on the next update). A host that restarted its process after a fault uses it to keep
        the faulting block off."""
        self._faulted[block.id] = reason
        self._dirty.mark_structure()

    def connect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> None:
        """Link an output to an input (Cold on the next update).

        Raises:
            LinkError: unknown port, incompatible pins, a cycle, or a block of another engine.
        """
        self._call_failures.clear()  # an edit may fix a failed library call: try again
        self.context.connect(src, src_port, dst, dst_port)

    def disconnect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> bool:
        """Remove a link (Cold on the next update); returns whether it existed."""
        self._call_failures.clear()  # an edit may fix a failed library call: try again
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
            binding = upload_host_array(array, want, self._owned, (block.id, port), self.pool, self._stream, block.name)
        self._call_failures.clear()  # an edit may fix a failed library call: try again
        self.context.bind_input(block, port, binding)

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
        if self._lost is not None:  # CUDA refuses this process after a fault: nothing to launch
            self.counters.frames += 1
            return
        with self._graph_lock:
            dirty = self._dirty
            if not ((dirty.any and not dirty.only_params) or self.kernels.ready):  # clean, Hot, Warm
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
        hooks = self._frame_hooks
        for h in hooks:  # GL interop: map shared resources (may rebind a moved pointer: Warm)
            h.before_launch(self._stream)
        kt = self.kernels
        if kt.ready:  # a deque test when no compile finished
            self._apply_compiles(kt.collect())
        if kt.watcher is not None and kt.watcher.ready:
            kt.file_events()  # recompiles start in the background; results arrive in later frames
        dirty = self._dirty
        if dirty.any:
            try:
                if dirty.only_params and self._graph is not None and not self._retired:
                    self._apply_params()
                else:
                    self._apply_changes()
            except CudaLaunchError as exc:  # a fault of an earlier frame surfaced in an update call
                self._recover(exc, None)
                return
        g = self._graph
        if g is not None:
            culprit = None
            try:
                # A fault of an earlier frame surfaces as the launch's error. A query of the stream or of
                # a per-frame event was tried: with GL interop pending on the stream it could stall the
                # frame, so there is none. The readback ring is read when its values are asked for
                # (append counts, stats), with plain loads: nothing of it runs here but a count.
                rb = g.readback
                if self.debug_launch:
                    culprit = g.replay(self._stream)  # node by node, a synchronize after each block
                    if culprit is not None:
                        raise CudaLaunchError("a kernel faulted in debug launch", name="CUDA_ERROR_ILLEGAL_ADDRESS")
                else:
                    try:
                        g.launch(self._stream)
                    except CudaError as exc:
                        self._launch_failed(exc)
                        raise
                if rb is not None:
                    rb.record(self._stream, self.counters.frames)
                    if self.profiling is ProfilingLevel.DEEP_SYNC:  # exact numbers for this frame, by design
                        self.device.synchronize()
                        rb.poll()
            except CudaLaunchError as exc:  # sticky: the context is dead; survive it
                self._recover(exc, culprit)
                return
        for h in hooks:  # copies into GL textures, then one unmap: GL work is ordered after the launch
            h.after_launch(self._stream)
        self.counters.frames += 1
        if kt.to_submit:
            kt.flush()  # compiles start after the launch, so the worker never delays it

    def _recover(self, exc: CudaLaunchError, culprit: int | None) -> None:
        recover(self, exc, culprit)
        self.counters.frames += 1
        keep = tuple(d for d in self._build_diags if d.code not in ("gpu-fault", "gpu-lost", "binding-lost"))
        faults = tuple(Diagnostic("error", bid, "gpu-fault", msg) for bid, msg in self._faulted.items())
        self._set_diagnostics(keep + self._fault_diags + faults)

    def report_fault(self, exc: CudaLaunchError) -> None:
        """Survive a sticky GPU fault that a call outside ``update()`` met first (a synchronize, a
        read, an interop call of the host's): as ``update()`` would, find the faulting block and
        disable it, or mark the engine ``lost``. Ignored once the engine is lost."""
        if self._lost is not None or self._closed:
            return
        with self._graph_lock:
            self._recover(exc, None)

    @property
    def lost(self) -> str | None:
        """Why the engine stopped launching, when CUDA refused to continue after a fault; else None."""
        return self._lost

    def _launch_failed(self, exc: CudaError) -> None:
        if not isinstance(exc, CudaLaunchError):  # a fault is recovered from; a refused launch is reported
            self._set_diagnostics(self._build_diags + (Diagnostic("error", None, "launch", str(exc)),))

    def _apply_params(self) -> None:
        """Hot and Warm: patch scalar slots and external pointers into the executable graph."""
        dirty = self._dirty
        g = self._graph
        assert g is not None
        params, bindings = dirty.params, dirty.bindings
        dirty.params, dirty.bindings, dirty.any = {}, {}, False
        c = self.counters
        before = g.recaptures
        if params:
            c.nodes_patched += g.update_scalars(params)
            c.hot_updates += len(params)
        if bindings:
            c.nodes_patched += g.update_bindings(bindings)
            c.warm_updates += len(bindings)
        if g.recaptures != before or g.call_errors or g.stale:
            self._after_recapture(g, before)
            if self._dirty.structure:  # a re-capture only a new graph can hold: build it this frame
                self._apply_changes()

    def _after_recapture(self, g: CompiledGraph, before: int) -> None:
        """Recapture tier bookkeeping: count, put failed calls on their blocks (their previous capture
        keeps running), and rebuild when a new capture cannot replace the old in place."""
        self.counters.recaptures += g.recaptures - before
        if g.stale:  # another algorithm for the new arguments: only a new graph can hold it
            g.stale = False
            self._dirty.mark_structure()
        keep = tuple(d for d in self._build_diags if d.code != "library-call")
        errors = tuple(
            Diagnostic("error", bid, "library-call", f"{exc} (the previous capture keeps running)")
            for bid, exc in g.call_errors.items()
        )
        if errors or len(keep) != len(self._build_diags):
            self._set_diagnostics(keep + errors)

    def _swap_between_frames(self, o: KernelOutcome) -> bool:
        """Code tier, on the kernel builder's thread right after a frame: swap ``o``'s function into the
        running graph. Gives up (the frame thread swaps it then) rather than wait for the graph."""
        lock = self._graph_lock
        if o.compiled is None or not lock.acquire(blocking=False):
            return False
        try:
            g = self._graph
            if g is None or self._lost is not None or self._closed:
                return False
            if not g.swap_function(o.key, o.compiled.function, o.compiled.descriptor):
                return False
            self.counters.code_swaps += 1
            return True
        except CudaError:  # the frame thread tries again, and reports what fails
            return False
        finally:
            lock.release()

    def _apply_compiles(self, outcomes: list[KernelOutcome]) -> None:
        """Code tier: swap finished kernels into the running graph; rebuild where that cannot be done."""
        if not outcomes:
            return
        registry = self.context.registry
        for o in outcomes:
            if o.action == "swapped":  # swapped between frames; its diagnostics changed (below)
                continue
            if o.action == "swap" and o.compiled is not None:
                g = self._graph
                if g is not None and g.swap_function(o.key, o.compiled.function, o.compiled.descriptor):
                    self.counters.code_swaps += 1
                    continue
            elif o.action == "refresh":  # a file edit changed the kernel's signature: re-describe the block
                block = registry.get(o.key[0])
                if block is not None:
                    try:
                        block.refresh()
                    except CudapatchError as exc:
                        self._build_diags += (Diagnostic("error", block.id, "kernel-signature", str(exc)),)
            self._dirty.mark_structure()
        if self.kernels.diag_version != self._published_diag_version:  # a swap alone changes no block's state
            self._publish_diagnostics()

    def _code_edited(self, key: tuple[int, int]) -> bool:
        """A kernel's code changed (``Context(code_listener=...)``): hand it to the compiler now, at the
        edit, so the next frame has nothing to do for it (measured on the H100 host: handing it over
        inside ``update()`` cost that frame 60-80 µs). The builder is paced, so it starts on it only
        after the next frame. Returns False to leave it to ``update()``: with ``wait_for_compile``
        (which waits there) or when the kernel is not in the patch."""
        if self.wait_for_compile or self._closed:
            return False
        block = self.context.registry.get(key[0])
        if block is None or not 0 <= key[1] < len(block.description.kernels):
            return False
        if self._faulted.pop(key[0], None) is not None:  # new code gets a new chance
            self._dirty.mark_structure()
        self.kernels.source_changed(key, block.description.kernels[key[1]].source, block.name)
        self.kernels.flush()
        return True

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
                while True:
                    self._apply_compiles(self.kernels.collect(wait=True, timeout=timeout))
                    if self._dirty.any:
                        self._apply_changes()
                    if not self.kernels.pending:
                        return
        finally:
            self.wait_for_compile = waiting

    def _apply_changes(self) -> None:
        t0 = time.perf_counter()
        self._reap()
        self.last_build.reap_ms = (time.perf_counter() - t0) * 1e3
        dirty = self._dirty
        if dirty.code:
            registry = self.context.registry
            for bid, ki in dirty.code:
                if self._faulted.pop(bid, None) is not None:  # new code gets a new chance
                    dirty.mark_structure()
                block = registry.get(bid)
                if block is not None and ki < len(block.description.kernels):
                    self.kernels.source_changed((bid, ki), block.description.kernels[ki].source, block.name)
            dirty.code.clear()
            dirty._recompute()
            if self.wait_for_compile:
                self._apply_compiles(self.kernels.collect(wait=True))
        if dirty.structure:
            if self._rebuild():
                return
            dirty.structure = False  # a failed rebuild is not retried every frame; the next edit retries
        dirty.code.clear()
        dirty.captured.clear()
        dirty._recompute()
        if self._graph is None:
            dirty.take_params()
        elif dirty.any:
            self._apply_params()

    def _rebuild(self) -> bool:
        """Compile; patch the running graph in place if only sizes changed (Warm), else realize and swap
        in a new one (Cold). On failure keep the old graph and put the errors on the blocks."""
        timing = self.last_build
        t0 = time.perf_counter()
        snap = self.context.snapshot()
        functions, status = self.kernels.resolve(snap)
        if status and self.wait_for_compile and self.kernels.pending:
            self._apply_compiles(self.kernels.collect(wait=True))
            snap = self.context.snapshot()  # a compile may have re-described a block
            functions, status = self.kernels.resolve(snap)
        if self._graph is not None and status:
            running = set(self._graph.plan.block_order)
            if any(code == "kernel-compiling" and bid in running for (bid, _), (_, code, _) in status.items()):
                # A running block's new kernel is still compiling: keep the old graph (and the old
                # kernel) until it lands; the finished compile marks the structure dirty again.
                self._dirty.structure = False
                self._dirty._recompute()
                timing.tier = "deferred"
                return True
        status = self._with_call_failures(snap, status)
        try:
            plan = compile_plan(snap, status, self.profiling, self._faulted)
            timing.compile_ms = (time.perf_counter() - t0) * 1e3
        except GraphCompileError as exc:
            self.counters.failed_rebuilds += 1
            self._set_diagnostics(exc.diagnostics)
            return False
        if self._graph is not None:
            recaptures = self._graph.recaptures
            try:
                patched = self._graph.try_patch(plan, snap.bindings, functions)
            except CudaError as exc:
                self.counters.failed_rebuilds += 1
                self._set_diagnostics((Diagnostic("error", None, "realize", str(exc)),))
                return False
            if patched is not None:
                # Warm resize: same graph, new counts/grids/pointers patched into the executable graph
                # (captured calls whose arguments changed were re-captured in place).
                timing.tier, timing.realize_ms = "warm-resize", 0.0
                timing.total_ms = (time.perf_counter() - t0) * 1e3
                self.counters.warm_resizes += 1
                self.counters.nodes_patched += patched
                self.counters.recaptures += self._graph.recaptures - recaptures
                self._finish_build(self._graph, plan)
                return True
        names = {b.id: b.name for b in snap.blocks}
        if plan.stamp_count and self._stamp_function is None:
            # Built once, at the first timed build (a level change is a rebuild anyway); cached on disk.
            self._stamp_function = self.kernels.builder.build(STAMP_KERNEL).function
        if (plan.stamp_count or plan.counters) and self._publish_function is None:
            self._publish_function = self.kernels.builder.build(PUBLISH_KERNEL).function
        t1 = time.perf_counter()
        try:
            graph = realize(
                plan,
                device=self.device,
                pool=self.pool,
                functions=functions,
                bindings=snap.bindings,
                block_names=names,
                previous=self._graph,
                occupancy=self.profiling.at_least(ProfilingLevel.DEEP_ASYNC),
                stamp_function=self._stamp_function,
                libraries=self.libraries,
                publish_function=self._publish_function,
            )
        except LibraryCallError as exc:
            block = self.context.registry.by_name(exc.block) if exc.block else None
            if block is not None and block.id not in self._call_failures:
                # Leave that block (and what depends on it) out, and build the rest.
                ki = next((i for i, k in enumerate(block.description.kernels) if k.source is None), 0)
                tried = next(b for b in snap.blocks if b.id == block.id)
                self._call_failures[block.id] = (ki, _frozen_values(tried), str(exc))
                return self._rebuild()
            self.counters.failed_rebuilds += 1
            self._set_diagnostics((Diagnostic("error", block.id if block else None, "library-call", str(exc)),))
            return False
        except (KernelLoadError, CudaError) as exc:
            self.counters.failed_rebuilds += 1
            block = self.context.registry.by_name(exc.block) if exc.block else None
            self._set_diagnostics((Diagnostic("error", block.id if block else None, "realize", str(exc)),))
            return False
        timing.realize_ms = (time.perf_counter() - t1) * 1e3
        old, self._graph = self._graph, graph
        graph.adopt(old)
        if old is not None:
            old.retire(self._stream)
            self._retired.append(old)
        self.counters.rebuilds += 1
        self._finish_build(graph, plan)
        timing.tier, timing.total_ms = "cold", (time.perf_counter() - t0) * 1e3
        return True

    def _with_call_failures(
        self, snap: Any, status: dict[tuple[int, int], tuple[Severity, str, str]]
    ) -> dict[tuple[int, int], tuple[Severity, str, str]]:
        """Add blocks whose library call failed to capture to the compile status (they stay out of the
        graph); a block whose parameters or inputs changed since gets another try."""
        if not self._call_failures:
            return status
        blocks = {b.id: b for b in snap.blocks}
        status = dict(status)
        for bid, (ki, values, message) in list(self._call_failures.items()):
            b = blocks.get(bid)
            if b is None or _frozen_values(b) != values:
                del self._call_failures[bid]
                continue
            status[(bid, ki)] = ("error", "library-call", message)
        return status

    def _finish_build(self, graph: CompiledGraph, plan: GraphPlan) -> None:
        self._dirty.clear_structure()
        registry = self.context.registry
        sizes: dict[int, dict[str, int]] = {}
        for (bid, port), bi in plan.outputs.items():
            sizes.setdefault(bid, {})[port] = plan.buffers[bi].count
        for b in registry:
            b.debug.append = {port: ab for (bid, port), ab in graph.appends.items() if bid == b.id}
            b.debug.sizes = sizes.get(b.id, {})
            b.debug.gpu_ms = None
            b.debug.append_fill = {}
        diags = list(plan.diagnostics) + list(self._fault_diags)
        diags += [Diagnostic("error", bid, "gpu-fault", msg) for bid, msg in self._faulted.items()]
        for (bid, ki), occ in graph.occupancy.items():
            if occ < LOW_OCCUPANCY:
                b = registry.get(bid)
                entry = b.description.kernels[ki].descriptor.entry_point if b else "?"
                diags.append(
                    Diagnostic(
                        "warning",
                        bid,
                        "low-occupancy",
                        f"kernel '{entry}' of '{b.name if b else bid}' keeps only {occ:.0%} of an "
                        "SM's threads busy (block size, registers or shared memory)",
                    )
                )
        self._set_diagnostics(diags)

    def _set_diagnostics(self, diags: Iterable[Diagnostic]) -> None:
        self._build_diags = tuple(diags)
        self._publish_diagnostics()

    def _publish_diagnostics(self) -> None:
        """Combine build and kernel diagnostics, log new ones once, and update every block's state."""
        self._published_diag_version = self.kernels.diag_version
        diags = tuple(dict.fromkeys(self._build_diags + self.kernels.diagnostics() + self._frame_diags))
        self._diagnostics = diags
        self._diaglog.emit(diags)
        self._diaglog.forget(set(diags))
        running = set(self._graph.plan.block_order) if self._graph is not None else set()
        registry = self.context.registry
        for b in registry:
            b.debug.state = BlockState.OK if b.id in running else BlockState.NOT_COMPILED
            b.debug.message = ""
        for d in diags:
            b = registry.get(d.block_id) if d.block_id is not None else None
            if b is None:
                continue
            if d.severity == "error":
                b.debug.state = BlockState.ERROR
            elif d.severity == "warning" and b.debug.state is BlockState.OK:
                b.debug.state = BlockState.WARNING
            if not b.debug.message or d.severity == "error":
                b.debug.message = d.message.splitlines()[0]

    def _reap(self) -> None:
        if self._retired:
            still = []
            for g in self._retired:
                if g.is_idle():
                    g.close()
                else:
                    still.append(g)
            self._retired = still
        if not self._retired and self.libraries.scope_count:  # no old graph runs: free unused call scopes
            g = self._graph
            live = {(n.block_id, n.kernel) for n in g.plan.captured_nodes} if g is not None else set()
            self.libraries.keep_only(live)

    # -- reading results ----------------------------------------------------------------------------
    @property
    def graph(self) -> CompiledGraph | None:
        """The compiled graph running now (None before the first successful build)."""
        return self._graph

    def synchronize(self) -> None:
        """Wait for all launched frames.

        Raises:
            CudaError: a launched kernel faulted.
        """
        self.device.make_current()
        self.device.synchronize()

    def output(self, block: Block, port: str) -> GpuBuffer:
        """The device buffer of an output (valid until the next rebuild; view it with CuPy for no copy).

        Raises:
            CudapatchError: the block is not compiled or has no such output.
        """
        g = self._graph
        buf = g.output(block.id, port) if g is not None else None
        if buf is None:
            if block.description.output(port) is None:
                raise CudapatchError("no such output port", block=block.name, port=port)
            raise CudapatchError("block is not running in the current graph", block=block.name, port=port)
        return buf

    def read(self, block: Block, port: str) -> np.ndarray:
        """Copy an output to the host. **Synchronizes** (by design): not for the frame path.

        Append outputs return only the elements written in the last frame.

        Raises:
            CudapatchError: not compiled or no such output.
            CudaError: the copy failed (a kernel fault surfaces here).
        """
        buf = self.output(block, port)
        self.synchronize()
        data = buf.download()
        ab = self._graph.appends.get((block.id, port)) if self._graph else None
        if ab is not None:
            assert self._graph is not None and self._graph.counters is not None
            # The readback block holds the timestamps (uint64) first, then the counters (uint32).
            block = self._graph.counters.download().view(np.uint32)
            raw = int(block[2 * self._graph.plan.stamp_count + ab.counter_index])
            return data[: min(raw, ab.capacity)]
        return data

    def append_buffer(self, block: Block, port: str) -> AppendBuffer:
        """The append buffer of an append output; its ``count`` is from the last completed frame.

        Raises:
            CudapatchError: not compiled or not an append output.
        """
        g = self._graph
        ab = g.appends.get((block.id, port)) if g is not None else None
        if ab is None:
            raise CudapatchError("no running append output of this name", block=block.name, port=port)
        return ab

    def stats(self) -> EngineStats:
        """GPU times (per block, per kernel), append fill, occupancy and pool use of the newest completed
        frame, read without waiting. Also refreshes what ``str(block)`` and ``str(engine)`` show.

        Cost is paid only here (host-side arithmetic on the ring's copy of the timestamps), never on
        the frame path.

        Raises:
            CudaError: a driver call failed (a GPU fault surfaces here).
        """
        self.device.make_current()
        g = self._graph
        rb = g.readback if g is not None else None
        try:
            return self._stats(g)
        finally:
            if rb is not None:
                rb.frozen = False

    def _stats(self, g: CompiledGraph | None) -> EngineStats:
        level = self.profiling
        registry = self.context.registry
        rb = g.readback if g is not None else None
        frame = age = None
        times = None
        if rb is not None:
            rb.poll()
            rb.frozen = True  # every value below from this one frame (unfrozen at the end)
            frame, age = rb.latest_frame, rb.age()
            if frame is not None and rb.stamps:
                times = rb.latest_stamps.astype(np.int64)  # nanoseconds of the GPU's global timer
        block_ms: dict[int, float] = {}
        kernel_ms: dict[tuple[int, int], float] = {}
        graph_ms = None
        if times is not None and g is not None:
            for pair in g.plan.timings:
                ms = max(0, int(times[pair.end] - times[pair.start])) / 1e6
                if pair.kind == "graph":
                    graph_ms = ms
                elif pair.kind == "block":
                    block_ms[pair.key] = ms  # type: ignore[index]
                else:
                    kernel_ms[pair.key] = ms  # type: ignore[index]
        deep = level.at_least(ProfilingLevel.DEEP_ASYNC)
        frame_diags: list[Diagnostic] = []
        blocks = []
        for b in registry:
            append: dict[str, AppendStats] = {}
            if g is not None and frame is not None:
                for port, ab in b.debug.append.items():
                    if ab.count is not None:
                        st = AppendStats(ab.count, ab.capacity, ab.overflowed)
                        append[port] = st
                        if st.fill >= APPEND_FULL:
                            frame_diags.append(
                                Diagnostic(
                                    "warning",
                                    b.id,
                                    "append-full",
                                    f"append output '{b.name}.{port}' is {st.fill:.0%} full "
                                    f"({st.count}/{st.capacity}); raise its capacity",
                                )
                            )
            b.debug.gpu_ms = block_ms.get(b.id)
            b.debug.append_fill = {p: (s.count, s.capacity) for p, s in append.items()} if deep else {}
            kernels = tuple(
                KernelStats(
                    k.descriptor.entry_point,
                    kernel_ms.get((b.id, ki)),
                    g.occupancy.get((b.id, ki)) if g is not None else None,
                )
                for ki, k in enumerate(b.description.kernels)
            )
            blocks.append(
                BlockStats(b.id, b.name, b.debug.state.value, b.debug.message, b.debug.gpu_ms, kernels, append)
            )
        frame_diags_t = tuple(frame_diags)
        if frame_diags_t != self._frame_diags:
            self._frame_diags = frame_diags_t
            self._publish_diagnostics()
        self._last_gpu_ms = graph_ms
        stats = EngineStats(
            level=level,
            frame=frame,
            age=age,
            gpu_ms=graph_ms,
            blocks=tuple(blocks),
            kernels=g.kernel_count if g is not None else 0,
            pool_in_use_bytes=self.pool.in_use_bytes,
            pool_total_bytes=self.pool.total_allocated_bytes,
            diagnostics=self._diagnostics,
        )
        return stats

    def diagnostics(self, block: Block | None = None) -> tuple[Diagnostic, ...]:
        """Current diagnostics (of one block, if given)."""
        if block is None:
            return self._diagnostics
        return tuple(d for d in self._diagnostics if d.block_id == block.id)

    @property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(self.context.registry)

    def __str__(self) -> str:
        g = self._graph
        kernels = g.kernel_count if g is not None else 0
        mb = 1 / 2**20
        compiling = f" ({len(self.kernels.pending)} compiling)" if self.kernels.pending else ""
        launch = f"  Launch: {self._last_gpu_ms:.2f}ms\n" if self._last_gpu_ms is not None else ""
        return (
            f"{self.name}: {len(self.context.registry)} blocks, {kernels} kernels{compiling}\n"
            f"{launch}"
            f"  Profiling: {self.profiling}\n"
            f"  Pool: {self.pool.in_use_bytes * mb:.1f} MB / {self.pool.total_allocated_bytes * mb:.1f} MB"
        )

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
        with self._graph_lock:  # a swap between frames that began before the flag was set ends first
            pass
        if self._lost is None:
            self.device.make_current()
            try:
                self.device.synchronize()
            except CudaLaunchError as exc:  # a fault nobody saw yet: the context is as good as lost
                self._lost = f"the GPU context is lost after {exc.name}"
        if self._lost is not None:  # every driver call would fail: forget, do not free
            for b in list(self.context.registry):
                self.context.unregister_block(b)
            abandon_context_state(self)
            self.kernels.close()
            self.device._closed = True
            self.device._finalizer.detach()
            return
        for b in list(self.context.registry):
            self.context.unregister_block(b)
        if self._graph is not None:
            self._graph.close()
            self._graph = None
        for g in self._retired:
            g.close()
        self._retired.clear()
        for buf in self._owned.values():
            buf.close()
        self._owned.clear()
        self.kernels.close()
        self.libraries.close()
        self.modules.close()
        self.pool.close()
        self.device.close()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
