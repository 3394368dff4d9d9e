"""realize(plan) → CompiledGraph: the driver side of a GraphPlan.

Each kernel node owns pinned parameter storage: one slot per kernel parameter and a ``void**``
array pointing at the slots. The node's ``CUDA_KERNEL_NODE_PARAMS`` points at that array and is
kept, so a Hot or Warm update writes a slot and calls ``cuGraphExecKernelNodeSetParams`` with
the same struct: no allocation, no rebuild, no re-instantiation.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
import weakref
from collections.abc import Mapping
from typing import Any

from .._lifecycle import HandleOwner
from ..blocks.parameter import BlockParameter
from ..errors import CudaLaunchError, CudapatchError, KernelLoadError, LibraryCallError
from ..kernels._driver import check, driver, error_from_code
from ..kernels.types import DType
from .buffers import AppendBuffer, BufferPool, GpuBuffer
from .capture import capture_call, destroy_graph
from .context import ExternalBinding
from .device import DeviceContext
from .libraries import LibraryHandles
from .plan import (
    Arg,
    CapturedNodePlan,
    GraphPlan,
    KernelNodePlan,
    MemsetNodePlan,
    PublishNodePlan,
    StampNodePlan,
    programmatic_edges,
)
from .readback import PUBLISH_THREADS, ReadbackRing

__all__ = ["CompiledGraph", "realize"]

log = logging.getLogger("cudapatch.engine")


class _ParamStorage:
    """Pinned parameter storage of one kernel launch: a byte buffer holding every parameter, a
    ``void**`` array pointing into it, ctypes slot objects over each parameter, and the reusable
    ``CUDA_KERNEL_NODE_PARAMS`` struct pointing at the array.

    Building one costs more than a rebuild should spend per node, so a Cold rebuild reuses the
    previous graph's storage for the same kernel of the same block and rewrites every slot.
    """

    __slots__ = ("descriptor", "storage", "pointers", "slots", "params")

    def __init__(self, node: KernelNodePlan, function: Any, values: list[Any]) -> None:
        d = driver()
        desc = node.descriptor
        self.descriptor = desc
        offsets, size = desc.offsets
        self.storage = (ctypes.c_uint8 * max(size, 8))()
        base = ctypes.addressof(self.storage)
        self.pointers = (ctypes.c_void_p * max(len(offsets), 1))(*[base + o for o in offsets])
        self.slots: list[Any] = []
        for abi, o in zip(desc.slots, offsets, strict=True):
            p = desc.parameters[abi.param]
            if abi.role != "value":  # a slot of an ABI expansion: 8-byte pointers and counts
                slot = ctypes.c_int64.from_buffer(self.storage, o)
            elif p.is_pointer:
                slot = ctypes.c_uint64.from_buffer(self.storage, o)
            elif p.dtype.lanes == 1:
                slot = p.dtype.ctype.from_buffer(self.storage, o)
            else:
                slot = (p.dtype.ctype * p.dtype.lanes).from_buffer(self.storage, o)
            self.slots.append(slot)
        kp = d.CUDA_KERNEL_NODE_PARAMS()
        kp.gridDimY, kp.gridDimZ, kp.blockDimY, kp.blockDimZ = 1, 1, 1, 1
        kp.kernelParams = ctypes.addressof(self.pointers) if offsets else 0
        kp.extra = 0
        self.params = kp
        self.load(node, function, values)

    def load(self, node: KernelNodePlan, function: Any, values: list[Any]) -> None:
        """Write every slot and the launch configuration."""
        for slot, v in zip(self.slots, values, strict=True):
            _write(slot, v)
        kp = self.params
        kp.func = function
        kp.gridDimX = node.grid
        kp.blockDimX = node.block
        kp.sharedMemBytes = node.shared_bytes

    def backup(self) -> tuple[bytes, Any, int, int, int]:
        kp = self.params
        return bytes(self.storage), kp.func, kp.gridDimX, kp.blockDimX, kp.sharedMemBytes

    def restore(self, saved: tuple[bytes, Any, int, int, int]) -> None:
        raw, func, grid, block, shared = saved
        ctypes.memmove(self.storage, raw, len(raw))
        kp = self.params
        kp.func, kp.gridDimX, kp.blockDimX, kp.sharedMemBytes = func, grid, block, shared


class _Node:
    """A kernel node of one executable graph: its handle, plan and (possibly inherited) storage."""

    __slots__ = ("store", "params", "slots", "handle", "plan")

    def __init__(self, store: _ParamStorage, handle: Any, plan: KernelNodePlan) -> None:
        self.store = store
        self.params = store.params
        self.slots = store.slots
        self.handle = handle
        self.plan = plan


class _DeviceSlot:
    """A device scalar of a captured call (cuBLAS ``alpha``): a pinned host slot and its device copy.
    Writing ``value`` stores it in the pinned slot and enqueues an 8-byte copy on the engine stream,
    ordered after the frames already launched and before the next: a Warm update, no re-capture."""

    __slots__ = ("view", "host", "device", "nbytes", "stream")

    def __init__(self, view: Any, host: int, device: int, nbytes: int, stream: Any) -> None:
        self.view, self.host, self.device, self.nbytes, self.stream = view, host, device, nbytes, stream

    @property
    def value(self) -> Any:
        return tuple(self.view) if isinstance(self.view, ctypes.Array) else self.view.value

    @value.setter
    def value(self, v: Any) -> None:
        self.view.value = v
        self._copy()

    def __setitem__(self, key: Any, v: Any) -> None:  # vector values (``_write`` assigns slices)
        self.view[key] = v
        self._copy()

    def _copy(self) -> None:
        (err,) = driver().cuMemcpyHtoDAsync(self.device, self.host, self.nbytes, self.stream)
        if err:
            check((err,), "cuMemcpyHtoDAsync")


class _CallArg:
    """A host-side argument of a captured call: writing it marks the call for re-capture."""

    __slots__ = ("call", "index")

    def __init__(self, call: _Captured, index: int) -> None:
        self.call, self.index = call, index

    @property
    def value(self) -> Any:
        return self.call.values[self.index]

    @value.setter
    def value(self, v: Any) -> None:
        if self.call.values[self.index] != v:
            self.call.values[self.index] = v
            self.call.dirty = True

    def __setitem__(self, key: Any, v: Any) -> None:
        self.value = tuple(v)


class _Captured:
    """A captured library call in one executable graph: its child-graph node, the argument values it
    was captured with, and the captured graph itself (kept for fault replay).

    ``params`` is None: the commit step tells it from a kernel node by that."""

    __slots__ = (
        "plan",
        "handle",
        "values",
        "slots",
        "child",
        "dirty",
        "stale",
        "block_name",
        "params",
        "_device",
        "_replay",
    )

    def __init__(self, plan: CapturedNodePlan, values: list[Any], block_name: str | None) -> None:
        self.plan = plan
        self.values = values
        self.block_name = block_name
        self.handle: Any = None
        self.child: Any = None
        self.dirty = False
        self.stale = False  # its values were captured into a topology the executable graph cannot take
        self.params = None
        self._replay: Any = None  # an executable of ``child`` alone, for node-by-node replay
        self._device: dict[int, _DeviceSlot] = {}
        self.slots: list[Any] = []

    def bind_slots(self, device_slots: dict[int, _DeviceSlot]) -> None:
        self._device = device_slots
        self.slots = [device_slots.get(i) or _CallArg(self, i) for i in range(len(self.values))]

    def arguments(self) -> tuple[dict[str, int], dict[str, Any]]:
        """``(pointers, scalars)`` for the call function, by parameter name."""
        pointers: dict[str, int] = {}
        scalars: dict[str, Any] = dict(getattr(self.plan.descriptor, "constants", ()))
        for i, (p, v) in enumerate(zip(self.plan.descriptor.parameters, self.values, strict=True)):
            if p.is_pointer:
                pointers[p.name] = int(v)
            elif i in self._device:
                pointers[p.name] = self._device[i].device
            else:
                scalars[p.name] = v
        return pointers, scalars

    def capture(self, libraries: LibraryHandles) -> Any:
        """Capture the call with the current values; returns the new ``CUgraph``.

        Raises:
            LibraryCallError: the call failed or cannot be captured; CudaError: a driver call failed.
        """
        pointers, scalars = self.arguments()
        return capture_call(self.plan, pointers, scalars, libraries, self.block_name)

    def launch_alone(self, stream: Any) -> Any:
        """Launch the captured work by itself (fault replay); returns the driver's error code."""
        d = driver()
        if self._replay is None:
            err, ex = d.cuGraphInstantiate(self.child, 0)
            if err:
                return err
            self._replay = ex
        return d.cuGraphLaunch(self._replay, stream)[0]

    def replace_child(self, child: Any) -> None:
        """Keep ``child`` as the captured graph, destroying the previous one."""
        self.release()
        self.child = child

    def release(self) -> None:
        """Destroy the captured graph and its replay executable (errors ignored: teardown)."""
        if self._replay is not None:
            try:
                driver().cuGraphExecDestroy(self._replay)
            except Exception:
                pass
            self._replay = None
        if self.child is not None:
            destroy_graph(self.child)
            self.child = None


def _write(slot: Any, value: Any) -> None:
    if type(value) is tuple:
        slot[:] = value
    else:
        slot.value = value


def _release_graph(d: Any, exec_: Any, graph: Any) -> None:
    try:
        d.cuGraphExecDestroy(exec_)
        d.cuGraphDestroy(graph)
    except Exception:
        pass


def _occupancy(d: Any, fn: Any, node: KernelNodePlan, device: DeviceContext) -> float:
    """Fraction of an SM's thread slots this kernel can keep busy (the occupancy API, at build time)."""
    blocks = check(
        d.cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, node.block, node.shared_bytes),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        kernel=node.entry_point,
    )
    return min(1.0, int(blocks) * node.block / device.max_threads_per_multiprocessor)


class CompiledGraph(HandleOwner):
    """An instantiated CUDA graph for a GraphPlan, with its buffers and parameter slots.

    Use ``realize(plan, ...)`` to make one.
    """

    def __init__(
        self,
        plan: GraphPlan,
        *,
        device: DeviceContext,
        pool: BufferPool,
        functions: Mapping[tuple[int, int], Any],
        bindings: dict[tuple[int, str], ExternalBinding],
        block_names: dict[int, str] | None = None,
        previous: CompiledGraph | None = None,
        occupancy: bool = False,
        stamp_function: Any = None,
        libraries: LibraryHandles | None = None,
        publish_function: Any = None,
    ) -> None:
        d = driver()
        device.make_current()
        self.plan = plan
        self._libraries = libraries
        #: Re-captures done by Hot/Warm updates and in-place resizes (the Recapture tier).
        self.recaptures = 0
        #: Block id -> the error of its last failed re-capture (the previous capture keeps running).
        self.call_errors: dict[int, LibraryCallError] = {}
        #: True when a re-capture changed the call's graph topology: only a Cold rebuild can apply it.
        self.stale = False
        self._scalar_host = 0  # pinned mirror of the device scalars
        self._device = device
        self._closed = False
        self._retire_event: Any = None
        names = block_names or {}
        self.buffers: list[GpuBuffer] = []
        self._owned: list[GpuBuffer] = []  # buffers this graph gives back to the pool
        self.counters: GpuBuffer | None = None
        self.readback: ReadbackRing | None = None
        self.appends: dict[tuple[int, str], AppendBuffer] = {}
        self._nodes: list[_Node | _Captured | None] = []
        self._graph: Any = None
        self._exec: Any = None
        self.occupancy: dict[tuple[int, int], float] = {}
        self._stamp_args: list[Any] = []  # parameter storage of the timestamp nodes
        # What the previous graph can lend: its output allocations (pointers stay stable across a
        # rebuild, so views users hold stay valid) and its parameter storage. Nothing of it is
        # modified unless this graph is built; a failure restores what was touched.
        prev_buffers: dict[tuple[int, str], GpuBuffer] = {}
        prev_stores: dict[tuple[int, int], _ParamStorage] = {}
        if previous is not None and not previous.is_closed:
            for bp, buf in zip(previous.plan.buffers, previous.buffers, strict=True):
                prev_buffers[(bp.block_id, bp.label)] = buf
            for n in previous._nodes:
                if isinstance(n, _Node):
                    prev_stores[(n.plan.block_id, n.plan.kernel)] = n.store
        saved: list[tuple[_ParamStorage, Any]] = []
        t0 = time.perf_counter()
        try:
            for b in plan.buffers:
                old = prev_buffers.pop((b.block_id, b.label), None)
                if old is not None and old.dtype is b.dtype and b.count * b.dtype.itemsize <= old.capacity_bytes:
                    self.buffers.append(old)  # borrowed until adopt()
                else:
                    buf = GpuBuffer(pool, b.dtype, b.count, stream=device.stream)
                    self.buffers.append(buf)
                    self._owned.append(buf)
            # One readback block per graph: timestamps (uint64) then append counters (uint32), so a
            # single async copy per frame brings both back through the ring.
            n_stamps, n_counters = plan.stamp_count, len(plan.counters)
            self._stamps_ptr = self._counters_ptr = 0
            if n_stamps or n_counters:
                words = n_stamps + (n_counters + 1) // 2
                self.counters = GpuBuffer(pool, DType.UINT64, words + 1, stream=device.stream)  # +1: frame count
                self._owned.append(self.counters)
                self._stamps_ptr = self.counters.ptr
                counters_ptr = self._counters_ptr = self.counters.ptr + 8 * n_stamps
                self.readback = ReadbackRing(
                    self.counters.ptr,
                    n_counters,
                    stamps=n_stamps,
                    frames_ptr=self.counters.ptr + 8 * words,
                    stream=device.stream,
                )
                for key, (bi, ci) in plan.appends.items():
                    self.appends[key] = AppendBuffer(self.buffers[bi], counters_ptr + 4 * ci, ci, self.readback)
            device_slots = self._device_scalars(plan, pool, device)
            t1 = time.perf_counter()
            self._graph = check(d.cuGraphCreate(0), "cuGraphCreate")
            handles: list[Any] = []
            add_kernel = d.cuGraphAddKernelNode
            timed = plan.stamp_count or plan.counters  # the graphs with profiling or readback nodes
            edges = programmatic_edges(plan.nodes) if timed and _programmatic(device) else {}
            for node in plan.nodes:
                special = edges.get(node.index)
                deps = [handles[i] for i in node.deps if not special or i not in special]
                if isinstance(node, MemsetNodePlan):
                    mp = d.CUDA_MEMSET_NODE_PARAMS()
                    if node.buffer is not None:  # the output of a faulted block, zero-filled
                        buf = self.buffers[node.buffer]
                        mp.dst = buf.ptr
                        mp.elementSize, mp.width, mp.height, mp.pitch, mp.value = 1, max(buf.nbytes, 1), 1, 0, 0
                    else:
                        assert self.counters is not None
                        mp.dst = self.counters.ptr + 8 * n_stamps
                        mp.elementSize, mp.width, mp.height, mp.pitch, mp.value = 4, node.count, 1, 0, 0
                    h = check(
                        d.cuGraphAddMemsetNode(self._graph, deps, len(deps), mp, device.context), "cuGraphAddMemsetNode"
                    )
                    self._nodes.append(None)
                elif isinstance(node, CapturedNodePlan):
                    if libraries is None:
                        raise LibraryCallError(
                            "library calls need the engine's library handles", block=names.get(node.block_id)
                        )
                    call = _Captured(node, [self._arg_value(a, bindings) for a in node.args], names.get(node.block_id))
                    call.bind_slots(device_slots.get(node.index, {}))
                    call.child = call.capture(libraries)
                    self._nodes.append(call)  # the teardown destroys its child graph from here on
                    h = check(
                        d.cuGraphAddChildGraphNode(self._graph, deps, len(deps), call.child),
                        "cuGraphAddChildGraphNode",
                        block=names.get(node.block_id),
                        kernel=node.entry_point,
                    )
                    call.handle = h
                elif isinstance(node, StampNodePlan):
                    h = check(
                        d.cuGraphAddKernelNode(self._graph, deps, len(deps), self._stamp_params(node, stamp_function)),
                        "cuGraphAddKernelNode",
                    )
                    self._nodes.append(None)
                elif isinstance(node, PublishNodePlan):
                    h = check(
                        d.cuGraphAddKernelNode(
                            self._graph, deps, len(deps), self._publish_params(publish_function, node.end_stamp)
                        ),
                        "cuGraphAddKernelNode",
                    )
                    self._nodes.append(None)
                else:
                    fn = functions.get((node.block_id, node.kernel))
                    if fn is None:
                        raise KernelLoadError(
                            "kernel is not compiled", block=names.get(node.block_id), kernel=node.entry_point
                        )
                    values = [self._arg_value(a, bindings) for a in node.args]
                    store = prev_stores.pop((node.block_id, node.kernel), None)
                    if store is not None and (
                        store.descriptor is node.descriptor or store.descriptor == node.descriptor
                    ):
                        saved.append((store, store.backup()))
                        store.load(node, fn, values)
                    else:
                        store = _ParamStorage(node, fn, values)
                    err, h = add_kernel(self._graph, deps, len(deps), store.params)
                    if err:
                        check((err,), "cuGraphAddKernelNode", block=names.get(node.block_id), kernel=node.entry_point)
                    if occupancy:
                        self.occupancy[(node.block_id, node.kernel)] = _occupancy(d, fn, node, device)
                    self._nodes.append(_Node(store, h, node))
                if special:
                    _add_programmatic(self._graph, h, [(handles[i], port) for i, port in special.items()])
                handles.append(h)
            t2 = time.perf_counter()
            self._exec = check(d.cuGraphInstantiate(self._graph, 0), "cuGraphInstantiate")
            t3 = time.perf_counter()
            #: Host ms spent on buffers, node creation and instantiation (for benchmarks and the overlay).
            self.timing = {
                "buffers_ms": (t1 - t0) * 1e3,
                "nodes_ms": (t2 - t1) * 1e3,
                "instantiate_ms": (t3 - t2) * 1e3,
            }
        except BaseException:
            for store, backup in saved:  # the previous graph keeps running with its values intact
                store.restore(backup)
            self._teardown()
            raise
        self._by_kernel: dict[tuple[int, int], list[_Node]] = {}
        for n in self._nodes:
            if isinstance(n, _Node):
                self._by_kernel.setdefault((n.plan.block_id, n.plan.kernel), []).append(n)
        # Pre-resolved targets of Hot/Warm updates: key -> [(node, slot)], no plan lookups per frame.
        self._scalar_targets = self._targets(plan.scalar_slots)
        self._binding_targets = self._targets(plan.binding_slots)
        self._launch = d.cuGraphLaunch
        self._set_params = d.cuGraphExecKernelNodeSetParams
        self._finalizer = weakref.finalize(self, _release_graph, d, self._exec, self._graph)
        self.instantiations = 1

    def adopt(self, previous: CompiledGraph | None) -> None:
        """Take ownership of the buffers borrowed from ``previous`` and set their element counts.
        Call once this graph replaces ``previous`` (before ``previous.retire``)."""
        mine = {id(b) for b in self._owned}
        for buf, bp in zip(self.buffers, self.plan.buffers, strict=True):
            buf.count = bp.count
            if id(buf) not in mine:
                self._owned.append(buf)
                mine.add(id(buf))
        if previous is not None:
            previous._owned = [b for b in previous._owned if id(b) not in mine]

    def _targets(self, slots: dict[tuple[int, str], tuple[tuple[int, int], ...]]) -> dict[tuple[int, str], list]:
        nodes = self._nodes
        return {key: [(nodes[ni], nodes[ni].slots[ai]) for ni, ai in v] for key, v in slots.items()}  # type: ignore[union-attr]

    def _device_scalars(self, plan: GraphPlan, pool: BufferPool, device: DeviceContext) -> dict[int, dict[int, Any]]:
        """Device memory for the device scalars of captured calls: one 8-byte slot per parameter of a
        block, a pinned host mirror, and one copy of the initial values on the engine stream.
        Returns node index -> argument index -> ``_DeviceSlot``."""
        keys: dict[tuple[int, str], int] = {}
        for node in plan.nodes:
            if isinstance(node, CapturedNodePlan):
                for a in node.args:
                    if a.kind == "device" and a.ref not in keys:
                        keys[a.ref] = len(keys)  # type: ignore[index]
        if not keys:
            return {}
        d = driver()
        buf = GpuBuffer(pool, DType.UINT64, len(keys), stream=device.stream)
        self._owned.append(buf)
        nbytes = 8 * len(keys)
        self._scalar_host = host = int(check(d.cuMemHostAlloc(nbytes, 0), "cuMemHostAlloc"))
        ctypes.memset(host, 0, nbytes)
        slots: dict[tuple[int, str], _DeviceSlot] = {}
        out: dict[int, dict[int, Any]] = {}
        for node in plan.nodes:
            if not isinstance(node, CapturedNodePlan):
                continue
            for ai, a in enumerate(node.args):
                if a.kind != "device":
                    continue
                slot = slots.get(a.ref)  # type: ignore[arg-type]
                if slot is None:
                    off = 8 * keys[a.ref]  # type: ignore[index]
                    dt = a.dtype
                    ctype = dt.ctype if dt.lanes == 1 else dt.ctype * dt.lanes
                    view = ctype.from_address(host + off)
                    _write(view, a.value)
                    slot = _DeviceSlot(view, host + off, buf.ptr + off, min(dt.itemsize, 8), device.stream)
                    slots[a.ref] = slot  # type: ignore[index]
                out.setdefault(node.index, {})[ai] = slot
        check(d.cuMemcpyHtoDAsync(buf.ptr, host, nbytes, device.stream), "cuMemcpyHtoDAsync")
        return out

    def _arg_value(self, a: Arg, bindings: dict[tuple[int, str], ExternalBinding]) -> Any:
        if a.kind == "buffer":
            return self.buffers[a.ref].ptr  # type: ignore[index]
        if a.kind == "external":
            return bindings[a.ref].ptr  # type: ignore[index]
        if a.kind == "counter":
            return self._counters_ptr + 4 * a.ref  # type: ignore[operator]
        if a.kind == "null":
            return 0
        return a.value

    # -- the frame path -------------------------------------------------------------------------
    @property
    def handle(self) -> Any:
        """The ``CUgraphExec`` (read-only)."""
        return self._exec

    def launch(self, stream: Any) -> None:
        """Launch the graph on ``stream``; returns without waiting.

        Raises:
            CudaError: the launch was rejected.
        """
        (err,) = self._launch(self._exec, stream)
        if err:
            check((err,), "cuGraphLaunch")

    # -- Hot / Warm updates -----------------------------------------------------------------------
    def _commit(self, touched: Any) -> None:
        set_params, exec_ = self._set_params, self._exec
        for kn in touched:
            if kn.params is None:  # a captured call: re-capture if a host-side argument changed
                if kn.dirty:
                    self._recapture(kn)
                continue
            (err,) = set_params(exec_, kn.handle, kn.params)
            if err:
                check((err,), "cuGraphExecKernelNodeSetParams", kernel=kn.plan.entry_point)

    def _recapture(self, call: _Captured) -> bool:
        """Recapture tier: capture ``call`` again with its new arguments and swap the result into the
        executable graph (``cuGraphExecChildGraphNodeSetParams``). A failing call keeps its previous
        capture running and lands in ``call_errors``; a capture whose topology changed (another
        algorithm for another size) sets ``stale``: only a Cold rebuild can take it.

        Returns:
            Whether the new capture is live.

        Raises:
            CudaError: a driver call failed (other than the topology check).
        """
        d = driver()
        call.dirty = False
        bid = call.plan.block_id
        assert self._libraries is not None
        try:
            child = call.capture(self._libraries)
        except LibraryCallError as exc:
            self.call_errors[bid] = exc
            return False
        (err,) = d.cuGraphExecChildGraphNodeSetParams(self._exec, call.handle, child)
        if err == d.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            destroy_graph(child)
            self.stale = call.stale = True
            return False
        if err:
            destroy_graph(child)
            check((err,), "cuGraphExecChildGraphNodeSetParams", block=call.block_name, kernel=call.plan.entry_point)
        call.replace_child(child)
        self.call_errors.pop(bid, None)
        self.recaptures += 1
        return True

    def _patch(self, targets: dict[tuple[int, str], list], changes: Mapping[tuple[int, str], Any]) -> int:
        touched: list[_Node] = []
        for key, value in changes.items():
            tgt = targets.get(key)
            if tgt is None:
                continue  # not in this graph (a skipped block, or a failed rebuild's new block)
            if isinstance(value, BlockParameter):
                value = value._value
            elif isinstance(value, ExternalBinding):
                value = value.ptr
            for kn, slot in tgt:
                _write(slot, value)
                if kn not in touched:
                    touched.append(kn)
        self._commit(touched)
        return len(touched)

    def update_scalars(self, changes: Mapping[tuple[int, str], Any]) -> int:
        """Hot update: write new scalar values into their slots and patch the affected nodes.

        Args:
            changes: ``(block_id, param)`` → new value, or the ``BlockParameter`` holding it.
                Keys the graph does not use are ignored.

        Returns:
            The number of nodes patched.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        return self._patch(self._scalar_targets, changes)

    def update_bindings(self, changes: Mapping[tuple[int, str], Any]) -> int:
        """Warm update: point every kernel reading an external input at a new device address.

        Args:
            changes: ``(block_id, port)`` → new device pointer or ``ExternalBinding`` (same size and type as planned).

        Returns:
            The number of nodes patched.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        return self._patch(self._binding_targets, changes)

    def update_scalar(self, block_id: int, name: str, value: Any) -> int:
        """Hot update of one scalar; see ``update_scalars``.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        return self.update_scalars({(block_id, name): value})

    def update_pointer(self, block_id: int, port: str, ptr: int) -> int:
        """Warm update of one external input pointer; see ``update_bindings``.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        return self.update_bindings({(block_id, port): ptr})

    def try_patch(
        self,
        plan: GraphPlan,
        bindings: dict[tuple[int, str], ExternalBinding],
        functions: Mapping[tuple[int, int], Any] | None = None,
    ) -> int | None:
        """Warm resize: adopt ``plan`` in place if it differs from the current one only in element
        counts, grids, external pointers and (same-layout) kernel functions, and every buffer still
        fits its allocation.

        Returns:
            The number of nodes patched, or None if the plan needs a Cold rebuild.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        old = self.plan
        if (
            plan.level is not old.level  # a profiling level change is a structure change
            or len(plan.nodes) != len(old.nodes)
            or len(plan.buffers) != len(old.buffers)
            or plan.counters != old.counters
            or plan.scalar_slots != old.scalar_slots
            or plan.binding_slots != old.binding_slots
        ):
            return None
        for nb, ob, buf in zip(plan.buffers, old.buffers, self.buffers, strict=True):
            if nb[:4] != ob[:4] or nb.append != ob.append or nb.count * nb.dtype.itemsize > buf.capacity_bytes:
                return None
        changes: list[tuple[_Node, KernelNodePlan]] = []
        calls: list[tuple[_Captured, CapturedNodePlan]] = []
        for new, cur, kn in zip(plan.nodes, old.nodes, self._nodes, strict=True):
            if type(new) is not type(cur):
                return None
            if isinstance(new, CapturedNodePlan):
                if (new.block_id, new.kernel, new.descriptor, new.deps, new.spec) != (
                    cur.block_id,
                    cur.kernel,
                    cur.descriptor,
                    cur.deps,
                    cur.spec,  # type: ignore[union-attr]
                ) or any(na.kind != oa.kind or na.ref != oa.ref for na, oa in zip(new.args, cur.args, strict=True)):
                    return None
                if kn.stale:  # type: ignore[union-attr]
                    return None  # its new capture needs a new graph
                calls.append((kn, new))  # type: ignore[arg-type]
                continue
            if not isinstance(new, KernelNodePlan):  # memset and event nodes must match exactly
                if new != cur:
                    return None
                continue
            if (new.block_id, new.kernel, new.descriptor, new.deps, new.block, new.shared_bytes) != (
                cur.block_id,
                cur.kernel,
                cur.descriptor,
                cur.deps,
                cur.block,
                cur.shared_bytes,
            ):
                return None
            for na, oa in zip(new.args, cur.args, strict=True):
                if na.kind != oa.kind or na.ref != oa.ref:
                    return None
            if new != cur or functions is not None or any(a.kind == "external" for a in new.args):
                changes.append((kn, new))  # type: ignore[arg-type]
        # Captured calls first: a new size may need another algorithm (a topology change), which only a
        # Cold rebuild can apply, and then nothing else has been written yet.
        recaptured = 0
        for call, new in calls:
            values = [self._arg_value(a, bindings) for a in new.args]
            if any(a.kind != "device" and v != o for a, v, o in zip(new.args, values, call.values, strict=True)):
                saved, call.values = call.values, values
                if not self._recapture(call):
                    call.values = saved
                    self.stale = False
                    self.call_errors.pop(new.block_id, None)
                    return None
                recaptured += 1
            for slot, a in zip(call.slots, new.args, strict=True):
                if a.kind == "device" and slot.value != a.value:
                    _write(slot, a.value)
            call.plan = new
        # Everything fits: write the new values (scalars too: Hot edits pending with this one land here).
        touched = []
        for kn, new in changes:
            changed = False
            for slot, a in zip(kn.slots, new.args, strict=True):
                if a.kind in ("const", "scalar"):
                    current = tuple(slot) if isinstance(slot, ctypes.Array) else slot.value
                    if current != a.value:
                        _write(slot, a.value)
                        changed = True
                elif a.kind == "external":
                    ptr = bindings[a.ref].ptr  # type: ignore[index]
                    if slot.value != ptr:
                        slot.value = ptr
                        changed = True
            if kn.params.gridDimX != new.grid:
                kn.params.gridDimX = new.grid
                changed = True
            fn = functions.get((new.block_id, new.kernel)) if functions is not None else None
            if fn is not None and int(fn) != int(kn.params.func):  # a kernel recompiled meanwhile
                kn.params.func = fn
                changed = True
            kn.plan = new
            if changed:
                touched.append(kn)
        for nb, buf in zip(plan.buffers, self.buffers, strict=True):
            buf.count = nb.count
        self._commit(touched)
        self.plan = plan
        return len(touched) + recaptured

    def swap_function(self, key: tuple[int, int], function: Any, descriptor: Any) -> bool:
        """Code tier: put a recompiled ``function`` into every node of kernel ``key`` (block id, kernel
        index), in place, if its parameter layout is the one the nodes were built with.

        Returns:
            False (and changes nothing) if the kernel is not in this graph or its layout differs.

        Raises:
            CudaError: the driver refused the new function.
        """
        nodes = self._by_kernel.get(key)
        if not nodes or any(n.plan.descriptor != descriptor for n in nodes):
            return False
        for n in nodes:
            n.params.func = function
        self._commit(nodes)
        return True

    def update_grid(self, node_index: int, grid: int) -> None:
        """Warm update: change a kernel node's grid size.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
            CudapatchError: the node is not a kernel node.
        """
        kn = self._kernel(node_index)
        kn.params.gridDimX = max(1, int(grid))
        self._commit((kn,))

    def _kernel(self, node_index: int) -> _Node:
        kn = self._nodes[node_index] if 0 <= node_index < len(self._nodes) else None
        if not isinstance(kn, _Node):
            raise CudapatchError(f"node {node_index} is not a kernel node")
        return kn

    # -- access ---------------------------------------------------------------------------------
    def output(self, block_id: int, port: str) -> GpuBuffer | None:
        """The buffer of output ``port`` of ``block_id``, or None if not in this graph."""
        bi = self.plan.outputs.get((block_id, port))
        return None if bi is None else self.buffers[bi]

    def node_arg(self, node_index: int, arg: int) -> Any:
        """Current value in a node's parameter slot (for tests and debugging)."""
        slot = self._kernel(node_index).slots[arg]
        return tuple(slot) if isinstance(slot, ctypes.Array) else slot.value

    def _publish_params(self, function: Any, end_stamp: int | None) -> Any:
        if function is None or self.readback is None:
            raise CudapatchError("the graph publishes readback values, but the publish kernel is not loaded")
        d = driver()
        src, words, ring, slot_words, frames, end = self.readback.publish_args(end_stamp)
        values = (
            ctypes.c_uint64(src),
            ctypes.c_uint32(words),
            ctypes.c_uint64(ring),
            ctypes.c_uint32(slot_words),
            ctypes.c_uint64(frames),
            ctypes.c_uint32(end),
        )
        pointers = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        kp = d.CUDA_KERNEL_NODE_PARAMS()
        kp.func = function
        kp.gridDimX, kp.gridDimY, kp.gridDimZ = 1, 1, 1
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = PUBLISH_THREADS, 1, 1
        kp.sharedMemBytes = 0
        kp.kernelParams = ctypes.addressof(pointers)
        kp.extra = 0
        self._stamp_args.append((values, pointers, kp))
        return kp

    def _stamp_params(self, node: StampNodePlan, function: Any) -> Any:
        if function is None:
            raise CudapatchError("profiling needs the timestamp kernel, which is not loaded")
        d = driver()
        storage = (ctypes.c_uint64 * 2)(self._stamps_ptr, node.stamp)  # (slots pointer, index: uint fits)
        pointers = (ctypes.c_void_p * 2)(ctypes.addressof(storage), ctypes.addressof(storage) + 8)
        kp = d.CUDA_KERNEL_NODE_PARAMS()
        kp.func = function
        kp.gridDimX, kp.gridDimY, kp.gridDimZ = 1, 1, 1
        kp.blockDimX, kp.blockDimY, kp.blockDimZ = 1, 1, 1
        kp.sharedMemBytes = 0
        kp.kernelParams = ctypes.addressof(pointers)
        kp.extra = 0
        self._stamp_args.append((storage, pointers, kp))
        return kp

    @property
    def kernel_count(self) -> int:
        """Kernel and captured-call nodes (timestamp and memset nodes not counted)."""
        return sum(1 for n in self._nodes if n is not None)

    @property
    def captured_count(self) -> int:
        """Captured library-call (child-graph) nodes."""
        return sum(1 for n in self._nodes if isinstance(n, _Captured))

    def captured_graph(self, block_id: int, kernel: int = 0) -> Any:
        """The ``CUgraph`` a captured call was last captured into (tests check it was not replaced), or None."""
        for n in self._nodes:
            if isinstance(n, _Captured) and n.plan.block_id == block_id and n.plan.kernel == kernel:
                return n.child
        return None

    # -- fault attribution ----------------------------------------------------------------------
    def replay(self, stream: Any) -> int | None:
        """Launch the plan node by node, synchronizing after each block's kernels: the id of the
        first block whose kernels fault, or None. Used after a sticky fault, on a fresh context.

        Raises:
            CudaError: a failure that is not a kernel fault.
        """
        d = driver()
        counters_ptr = self._counters_ptr
        nodes = self.plan.nodes
        for i, node in enumerate(nodes):
            if isinstance(node, MemsetNodePlan):
                if node.buffer is not None:
                    buf = self.buffers[node.buffer]
                    check(d.cuMemsetD8Async(buf.ptr, 0, buf.nbytes, stream), "cuMemsetD8Async")
                else:
                    check(d.cuMemsetD32Async(counters_ptr, 0, node.count, stream), "cuMemsetD32Async")
                continue
            n = self._nodes[i]
            if n is None:  # a timestamp node
                continue
            if isinstance(n, _Captured):
                err = n.launch_alone(stream)
            else:
                kp = n.store.params
                err = d.cuLaunchKernel(
                    kp.func, kp.gridDimX, 1, 1, kp.blockDimX, 1, 1, kp.sharedMemBytes, stream, kp.kernelParams, 0
                )[0]
            last_of_block = i + 1 == len(nodes) or getattr(nodes[i + 1], "block_id", None) != node.block_id
            if err or last_of_block:
                err = err or d.cuStreamSynchronize(stream)[0]
                if err:
                    e = error_from_code(err, "replay")
                    if isinstance(e, CudaLaunchError):
                        return node.block_id
                    raise e
        return None

    def abandon(self) -> None:
        """Forget every driver object without destroying it: the context was reset under them."""
        self._closed = True
        self._finalizer.detach()
        if self.readback is not None:
            self.readback.abandon()
        self._owned = []
        self._scalar_host = 0
        for n in self._nodes:
            if isinstance(n, _Captured):
                n.child = n._replay = None
        self._exec = self._graph = self._retire_event = None

    # -- teardown -------------------------------------------------------------------------------
    def retire(self, stream: Any) -> None:
        """Give the buffers this graph still owns back to the pool now (reuse is stream-ordered, so
        safe) and mark when its in-flight work ends; ``close`` later, once ``is_idle``.

        Raises:
            CudaError: event creation or record failed.
        """
        d = driver()
        for b in self._owned:
            b.close()
        self._owned = []
        self._retire_event = check(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
        check(d.cuEventRecord(self._retire_event, stream), "cuEventRecord")

    def is_idle(self) -> bool:
        """True when nothing this graph launched is still running (after ``retire``)."""
        if self._retire_event is None:
            return False
        d = driver()
        (err,) = d.cuEventQuery(self._retire_event)
        return err != d.CUresult.CUDA_ERROR_NOT_READY

    def _teardown(self) -> None:
        d = driver()
        if self.readback is not None:
            self.readback.close()
        for n in self._nodes:
            if isinstance(n, _Captured):
                n.release()
        if self._scalar_host:
            check(d.cuMemFreeHost(self._scalar_host), "cuMemFreeHost")
            self._scalar_host = 0
        for b in self._owned:
            b.close()
        self._owned = []
        if self._exec is not None:
            check(d.cuGraphExecDestroy(self._exec), "cuGraphExecDestroy")
            self._exec = None
        if self._graph is not None:
            check(d.cuGraphDestroy(self._graph), "cuGraphDestroy")
            self._graph = None
        if self._retire_event is not None:
            check(d.cuEventDestroy(self._retire_event), "cuEventDestroy")
            self._retire_event = None

    def close(self) -> None:
        """Destroy the executable graph and free its resources; idempotent. Waits for this graph's
        in-flight readback copies, so call it after ``is_idle`` on the frame thread.

        Raises:
            CudaError: a driver call failed.
        """
        if self._closed:
            return
        self._closed = True
        self._device.make_current()
        self._finalizer.detach()
        self._teardown()

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __enter__(self) -> CompiledGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CompiledGraph nodes={len(self.plan.nodes)} kernels={self.kernel_count} closed={self._closed}>"


def _programmatic(device: DeviceContext) -> bool:
    """Whether graphs on ``device`` get programmatic edges for their profiling nodes (compute
    capability 9.0 and up; ``CUDAPATCH_PROGRAMMATIC_EDGES=0`` turns them off, for comparisons)."""
    return device.compute_capability >= (9, 0) and os.environ.get("CUDAPATCH_PROGRAMMATIC_EDGES", "1") != "0"


def _add_programmatic(graph: Any, node: Any, sources: list[tuple[Any, str]]) -> None:
    d = driver()
    ports = {
        "programmatic": d.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC,
        "launch_order": d.CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER,
    }
    edges = []
    for _, port in sources:
        e = d.CUgraphEdgeData()
        e.type = d.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        e.from_port = ports[port]
        edges.append(e)
    froms = [h for h, _ in sources]
    check(d.cuGraphAddDependencies(graph, froms, [node] * len(froms), edges, len(froms)), "cuGraphAddDependencies")


def realize(
    plan: GraphPlan,
    *,
    device: DeviceContext,
    pool: BufferPool,
    functions: Mapping[tuple[int, int], Any],
    bindings: dict[tuple[int, str], ExternalBinding],
    block_names: dict[int, str] | None = None,
    previous: CompiledGraph | None = None,
    occupancy: bool = False,
    stamp_function: Any = None,
    libraries: LibraryHandles | None = None,
    publish_function: Any = None,
) -> CompiledGraph:
    """Make the driver objects for ``plan``: buffers from the pool, modules from the cache, the graph.

    ``previous`` (the graph running now) lends its output allocations and parameter storage; call
    ``adopt(previous)`` on the result once it replaces ``previous``.

    ``functions`` maps ``(block_id, kernel index)`` to the loaded ``CUfunction`` (from the engine's
    background builder). ``libraries`` (the engine's ``LibraryHandles``) captures library calls.

    Raises:
        KernelLoadError: a kernel has no function (``.block`` names the block).
        LibraryCallError: a library call failed or cannot be captured (``.block`` names the block).
        CudaError: a driver call failed (nothing is leaked: partial work is undone, ``previous`` is untouched).
    """
    return CompiledGraph(
        plan,
        device=device,
        pool=pool,
        functions=functions,
        bindings=bindings,
        block_names=block_names,
        previous=previous,
        occupancy=occupancy,
        stamp_function=stamp_function,
        libraries=libraries,
        publish_function=publish_function,
    )
