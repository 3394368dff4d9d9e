"""realize(plan) → CompiledGraph: the driver side of a GraphPlan.

Each kernel node owns pinned parameter storage: one slot per kernel parameter and a ``void**``
array pointing at the slots. The node's ``CUDA_KERNEL_NODE_PARAMS`` points at that array and is
kept, so a Hot or Warm update writes a slot and calls ``cuGraphExecKernelNodeSetParams`` with
the same struct: no allocation, no rebuild, no re-instantiation.
"""

from __future__ import annotations

import ctypes
import logging
import time
import weakref
from collections.abc import Mapping
from typing import Any

from ..blocks.parameter import BlockParameter
from ..errors import CudaLaunchError, CudapatchError, KernelLoadError
from ..kernels._driver import check, driver, error_from_code
from ..kernels.types import DType
from .buffers import AppendBuffer, BufferPool, GpuBuffer
from .context import ExternalBinding
from .device import DeviceContext
from .plan import Arg, GraphPlan, KernelNodePlan, MemsetNodePlan, StampNodePlan
from .readback import ReadbackRing

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


class CompiledGraph:
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
    ) -> None:
        d = driver()
        device.make_current()
        self.plan = plan
        self._device = device
        self._closed = False
        self._retire_event: Any = None
        names = block_names or {}
        self.buffers: list[GpuBuffer] = []
        self._owned: list[GpuBuffer] = []  # buffers this graph gives back to the pool
        self.counters: GpuBuffer | None = None
        self.readback: ReadbackRing | None = None
        self.appends: dict[tuple[int, str], AppendBuffer] = {}
        self._nodes: list[_Node | None] = []
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
                if n is not None:
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
                self.counters = GpuBuffer(pool, DType.UINT64, words, stream=device.stream)
                self._owned.append(self.counters)
                self._stamps_ptr = self.counters.ptr
                counters_ptr = self._counters_ptr = self.counters.ptr + 8 * n_stamps
                self.readback = ReadbackRing(self.counters.ptr, n_counters, stamps=n_stamps)
                for key, (bi, ci) in plan.appends.items():
                    self.appends[key] = AppendBuffer(self.buffers[bi], counters_ptr + 4 * ci, ci, self.readback)
            t1 = time.perf_counter()
            self._graph = check(d.cuGraphCreate(0), "cuGraphCreate")
            handles: list[Any] = []
            add_kernel = d.cuGraphAddKernelNode
            for node in plan.nodes:
                deps = [handles[i] for i in node.deps]
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
                elif isinstance(node, StampNodePlan):
                    h = check(
                        d.cuGraphAddKernelNode(self._graph, deps, len(deps), self._stamp_params(node, stamp_function)),
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
            if n is not None:
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
            (err,) = set_params(exec_, kn.handle, kn.params)
            if err:
                check((err,), "cuGraphExecKernelNodeSetParams", kernel=kn.plan.entry_point)

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
        for new, cur, kn in zip(plan.nodes, old.nodes, self._nodes, strict=True):
            if type(new) is not type(cur):
                return None
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
        return len(touched)

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
        if kn is None:
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
        return sum(1 for n in self._nodes if n is not None)

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
) -> CompiledGraph:
    """Make the driver objects for ``plan``: buffers from the pool, modules from the cache, the graph.

    ``previous`` (the graph running now) lends its output allocations and parameter storage; call
    ``adopt(previous)`` on the result once it replaces ``previous``.

    ``functions`` maps ``(block_id, kernel index)`` to the loaded ``CUfunction`` (from the engine's
    background builder).

    Raises:
        KernelLoadError: a kernel has no function (``.block`` names the block).
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
    )
