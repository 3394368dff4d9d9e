"""DeviceResources: everything one engine's CUDA context owns, in one object with one lifecycle.

The device and its stream, the buffer pool, the library handles, the loaded modules, the
executable graphs (the running one and those retired while the GPU may still run them), the
buffers made from host arrays passed to ``Engine.bind``, and the two readback kernels (timestamps
and publish). All of them die together when a sticky GPU fault kills the context, so they are
forgotten together (``abandon``, no driver call: each would fail) and made anew together
(``reset``); the engine and recovery never rebuild them piece by piece.

The frame path reads ``graph`` and ``stream``, plain attributes: one load each, no call.

Finalizer policy: none of its own. ``close`` frees everything in order, and ``abandon`` marks every
part closed (detaching their finalizers) so nothing touches a dead context. Of the parts, the
device warns and releases the context when nobody closed it (the one warning of an unclosed engine);
graphs and buffers have quiet safety nets; pool, modules and library handles have none and live as
long as the context (the table in ``cudapatch/_lifecycle.py``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from functools import partial
from typing import Any

from ..errors import CudaError
from ..kernels.builder import KernelBuilder
from ..kernels.cuda_source import CudaSource
from ..kernels.module_cache import ModuleCache
from ..kernels.types import DType
from .bindings import upload_host_array
from .buffers import BufferPool, GpuBuffer
from .context import ExternalBinding
from .device import DeviceContext
from .libraries import LibraryHandles
from .params import clear_spares
from .plan import GraphPlan
from .probes import PROBE_SOURCE
from .readback import PUBLISH_SOURCE, STAMP_SOURCE
from .realize import CompiledGraph

__all__ = ["DeviceResources", "PROBE_KERNEL", "PUBLISH_KERNEL", "STAMP_KERNEL"]

log = logging.getLogger("cudapatch.engine")

PUBLISH_KERNEL = CudaSource(code=PUBLISH_SOURCE, name="publish.cu")
STAMP_KERNEL = CudaSource(code=STAMP_SOURCE, name="stamp.cu")
PROBE_KERNEL = CudaSource(code=PROBE_SOURCE, name="probe.cu")


class SharedPool(BufferPool):
    """The engine's ``BufferPool``, taken from two threads: a build on the build thread allocates its
    graph's buffers while the frame thread uploads bound host arrays and frees retired graphs' ones
    (and buffer finalizers may run on either). One lock around the bookkeeping; a free block is
    reused in stream order (every user launches on the engine's stream), so no device sync."""

    def __init__(self, make_current: Any = None) -> None:
        super().__init__(make_current)
        self._lock = threading.RLock()

    def acquire(self, nbytes: int) -> Any:
        with self._lock:
            return super().acquire(nbytes)

    def release(self, alloc: Any) -> None:
        with self._lock:
            super().release(alloc)

    def trim(self) -> int:
        with self._lock:
            return super().trim()


class DeviceResources:
    """The CUDA context of one engine and everything allocated in it.

    Args:
        ordinal: CUDA device ordinal.

    Raises:
        CudaUnavailableError: no cuda-bindings, no driver or no device (says which).
        CudaError: another driver call failed.
    """

    def __init__(self, ordinal: int = 0, *, on_install: Callable[[CompiledGraph], Any] | None = None) -> None:
        self.device = DeviceContext(ordinal)
        #: The engine's stream (the device's; renewed by ``reset``).
        self.stream: Any = self.device.stream
        self.pool: BufferPool = SharedPool(self.device.make_current)
        #: cuBLAS/cuFFT/cuRAND/cuSOLVER/cuSPARSE handles, plans and workspaces for captured calls.
        self.libraries = LibraryHandles(self.device, self.pool)
        self.modules = ModuleCache(device_key=self.device.key)
        #: The executable graph running now (None before the first build and after a reset).
        self.graph: CompiledGraph | None = None
        self._retired: list[CompiledGraph] = []  # replaced graphs the GPU may still be running
        self._uploads: dict[tuple[int, str], GpuBuffer] = {}  # buffers made from host arrays passed to bind()
        # Uploads of removed blocks that a build in flight (or the graph it makes) may still read: freed
        # when a graph built after the removal is installed.
        self._dropped: list[tuple[float, GpuBuffer]] = []  # (perf_counter at the removal, buffer)
        # Host objects no longer used that take a while to free (a 10,000-node plan's bypass index:
        # 2-3 ms): dropped by the next build, on the build thread, not in the frame that replaced them.
        self._garbage: list[Any] = []
        self._stamp_function: Any = None
        self._publish_function: Any = None
        self._region_functions: dict[str, Any] = {}  # set-condition kernels of regions, by entry point
        self._probe_function: Any = None
        self._copies: dict[str, Any] | None = None  # the copy kernels that carry a bypass, once loaded
        self._generation = 1  # of the loaded modules: a context reset loads everything again
        #: Called with each graph ``install`` makes the running one (the engine's ``Specializer``).
        self.on_install = on_install
        self._closed = False

    # -- graphs -------------------------------------------------------------------------------------
    def install(self, graph: CompiledGraph) -> None:
        """Make ``graph`` the running graph. The one it replaces hands over what both use and retires:
        it is closed by ``reap`` once the GPU has finished its last launch.

        Raises:
            CudaError: recording the retire event failed.
        """
        old, self.graph = self.graph, graph
        replaced = graph.adopt(old)
        if replaced:
            self.discard_later(replaced)  # (freed by the next build, on its thread)
        if old is not None:
            old.retire(self.stream)
            self._retired.append(old)
        if self.on_install is not None:
            self.on_install(graph)

    def free_dropped(self, snapshot_time: float) -> None:
        """Free the uploads ``drop_uploads(later=True)`` kept from before ``snapshot_time``
        (``time.perf_counter()``): the graph running now was built from a snapshot taken after their
        blocks were removed (reuse is stream-ordered, as for a retired graph's buffers)."""
        if not self._dropped:
            return
        keep = []
        for t, buf in self._dropped:
            if t < snapshot_time:
                buf.close()
            else:
                keep.append((t, buf))
        self._dropped = keep

    @property
    def retired(self) -> tuple[CompiledGraph, ...]:
        """Replaced graphs not closed yet (the frame patches in place only when there are none)."""
        return tuple(self._retired)

    @property
    def retiring(self) -> bool:
        """True while a replaced graph is not closed yet."""
        return bool(self._retired)

    def discard_later(self, obj: Any) -> None:
        """Keep ``obj`` (no longer used) until ``take_garbage``: the next build frees it on its thread."""
        self._garbage.append(obj)

    def take_garbage(self) -> list[Any]:
        """Hand over what ``discard_later`` kept, for the caller to drop (frame thread)."""
        garbage, self._garbage = self._garbage, []
        return garbage

    def take_idle(self) -> list[CompiledGraph]:
        """Hand over the retired graphs the GPU is done with, for the caller to close (a build closes
        them on the build thread: 12 ms for a 10,000-node graph, measured on the H200 host). Graphs
        with captured library calls stay: their calls release into library scopes the frame thread uses."""
        # (``has_calls``, not the plan's ``captured_nodes``: a retired plan's list of them was made
        # here, in the edit frame, in one pass over its nodes: 0.3 ms at 1,000 nodes, CPU machine)
        idle = [g for g in self._retired if not g.has_calls and g.is_idle()]
        if idle:
            self._retired = [g for g in self._retired if g not in idle]
        return idle

    def reap(self, *, graphs: bool = True) -> None:
        """Close retired graphs the GPU is done with (unless ``graphs`` is False: a build about to
        start closes them, see ``take_idle``); with none left, free library scopes that no running
        capture uses.

        Raises:
            CudaError: a driver call failed.
        """
        if self._retired and graphs:
            still = []
            for g in self._retired:
                if g.is_idle():
                    g.close()
                else:
                    still.append(g)
            self._retired = still
        if not self._retired and self.libraries.scope_count:
            g = self.graph
            live = {(n.block_id, n.kernel) for n in g.plan.captured_nodes} if g is not None else set()
            self.libraries.keep_only(live)

    # -- other things the context owns ----------------------------------------------------------------
    def readback_functions(self, plan: GraphPlan, builder: KernelBuilder) -> tuple[Any, Any]:
        """The stamp and publish kernels ``plan`` needs (None where it needs none), built at the first
        plan that uses them (a profiling level change is a rebuild anyway; cached on disk).

        Raises:
            KernelLoadError: a compile or module load failed.
        """
        if plan.stamp_count and self._stamp_function is None:
            self._stamp_function = builder.build(STAMP_KERNEL).function
        if (plan.stamp_count or plan.counters or plan.probes) and self._publish_function is None:
            self._publish_function = builder.build(PUBLISH_KERNEL).function
        return self._stamp_function, self._publish_function

    def region_functions(self, plan: GraphPlan, builder: KernelBuilder) -> dict[tuple[int, int], Any]:
        """``(region block id, kernel index)`` -> the loaded set-condition kernel of every region node
        of ``plan`` (``region_kernels``; built at the first plan with regions, cached on disk), and
        ``(delay block id, kernel index)`` -> the copy kernel of each FrameDelay's copy node (``delay_copy``).

        Raises:
            KernelLoadError: a compile or module load failed.
        """
        if not plan.regions:
            return {}
        from .delay_copy import COPY_ENTRIES, copy_kernel  # FrameDelays in such a patch: their copy nodes
        from .region_kernels import REGION_ENTRIES, region_kernel  # only patches with regions need them

        index = {v: k for k, v in REGION_ENTRIES.items()}
        copies = {v: k for k, v in COPY_ENTRIES.items()}
        out: dict[tuple[int, int], Any] = {}
        for n in plan.kernel_nodes:
            entry = index.get(n.kernel) if n.block_id in plan.regions else copies.get(n.kernel)
            if entry is None:
                continue
            fn = self._region_functions.get(entry)
            if fn is None:
                source = (region_kernel if n.block_id in plan.regions else copy_kernel)(entry)[0]
                fn = self._region_functions[entry] = builder.build(source).function
            out[(n.block_id, n.kernel)] = fn
        return out

    def copy_kernels(self) -> Mapping[str, Any] | None:
        """The copy kernels that carry a bypassed block until its rebuild lands (``bypass.Carry``), by
        entry point, or None until ``want_copy_kernels`` has them loaded."""
        return self._copies

    def want_copy_kernels(self, builder: KernelBuilder) -> None:
        """Have ``builder`` compile and load the copy kernels in the background (the engine asks at its
        start, the recovery after a context reset). Loads for an earlier context are dropped."""
        generation = self._generation
        from .delay_copy import copy_kernel

        loaded: dict[str, Any] = {}
        entries = ("delay_copy4", "delay_copy1")

        def done(entry: str, future: Future) -> None:  # on the builder's thread
            try:
                loaded[entry] = future.result().function
            except Exception as exc:  # noqa: BLE001 (a bypass then waits for its rebuild, as without them)
                if not builder.is_closed:  # (closing fails what is queued: nothing to say then)
                    log.warning("the copy kernel %s did not load (%s): bypasses wait for their rebuild", entry, exc)
                return
            if len(loaded) == len(entries) and self._generation == generation:
                self._copies = loaded

        for entry in entries:
            builder.submit(copy_kernel(entry)[0]).add_done_callback(partial(done, entry))

    def probe_function(self, plan: GraphPlan, builder: KernelBuilder) -> Any:
        """The probe kernel (``engine/probes.py``) when ``plan`` has probes, built at the first such plan.

        Raises:
            KernelLoadError: a compile or module load failed.
        """
        if plan.probes and self._probe_function is None:
            self._probe_function = builder.build(PROBE_KERNEL).function
        return self._probe_function

    def upload(self, block_id: int, port: str, array: Any, dtype: DType, block_name: str) -> ExternalBinding:
        """Copy a host array into the buffer kept for ``(block_id, port)`` (reused while the size stays).

        Raises:
            BindingError: the array cannot be read as ``dtype``.
            CudaError: the allocation or copy failed.
        """
        key = (block_id, port)
        return upload_host_array(array, dtype, self._uploads, key, self.pool, self.stream, block_name)

    def drop_uploads(self, block_id: int, *, later: bool = False) -> None:
        """Free the buffers made for a removed block's inputs (``later``: at ``free_dropped``, because a
        build in flight may still read them)."""
        for key in [k for k in self._uploads if k[0] == block_id]:
            buf = self._uploads.pop(key)
            if later:
                self._dropped.append((time.perf_counter(), buf))
            else:
                buf.close()

    # -- the context's fate -------------------------------------------------------------------------
    def _forget_contents(self) -> None:
        # Graphs, library handles, pool blocks and uploads of a dead context: forgotten, not freed.
        for g in (self.graph, *self._retired):
            if g is not None:
                g.abandon()
        self.graph, self._retired = None, []
        self.libraries.abandon()
        self.modules.abandon()
        self.pool.abandon()
        self._uploads.clear()
        self._dropped.clear()
        self._stamp_function = self._publish_function = self._probe_function = None
        self._region_functions = {}
        self._copies = None
        self._generation += 1

    def reset(self) -> None:
        """After a sticky fault: forget everything the dead context owned without touching it, reset
        the context (``DeviceContext.reset``) and make a new stream, pool, library handles and module
        cache. Loaded kernels must be loaded again into ``modules``.

        Raises:
            CudaError: the driver refused the reset (it does on H100 + driver 580): the context is lost;
                everything is forgotten and ``abandon`` is what remains to do.
        """
        self._forget_contents()
        self.device.reset()
        self.stream = self.device.stream
        self.pool: BufferPool = SharedPool(self.device.make_current)
        self.libraries = LibraryHandles(self.device, self.pool)
        self.modules = ModuleCache(device_key=self.device.key)

    def abandon(self) -> None:
        """The context is lost for good: forget everything, the device included, without a driver call
        (each would fail). Idempotent; the resources are closed afterwards."""
        self._closed = True
        self._forget_contents()
        self.device.abandon()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Free the graphs, uploads, library handles, modules and pool, then the stream and context;
        idempotent. Wait for the GPU first (``device.synchronize``): running graphs are destroyed.

        Raises:
            CudaError: a driver call failed during teardown.
        """
        if self._closed:
            return
        self._closed = True
        self._garbage.clear()
        if self.graph is not None:
            self.graph.close()
            self.graph = None
        for g in self._retired:
            g.close()
        self._retired.clear()
        clear_spares()  # what the closed graphs gave back, and other engines' (they make new ones)
        for buf in (*self._uploads.values(), *(b for _, b in self._dropped)):
            buf.close()
        self._uploads.clear()
        self._dropped.clear()
        self.libraries.close()
        self.modules.close()
        self.pool.close()
        self.device.close()

    def __enter__(self) -> DeviceResources:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"<DeviceResources device={self.device.ordinal} graph={self.graph is not None} "
            f"retired={len(self._retired)} closed={self._closed}>"
        )


def close_graphs(graphs: list[CompiledGraph]) -> None:
    """Close idle retired graphs (from ``DeviceResources.take_idle``) on any thread; a driver error is
    logged (the graph is forgotten either way: nothing else holds it)."""
    for g in graphs:
        try:
            g.close()
        except CudaError as exc:
            log.warning("closing a replaced graph failed: %s", exc)
