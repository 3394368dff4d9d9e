"""Captured library calls inside one executable graph, and the Recapture tier that updates them.

A captured call (cuBLAS, cuFFT, ... through nvmath's bindings) is stream-captured into a graph of
its own, which becomes a child-graph node. Its arguments reach the call in two ways:

- **host-side** arguments (pointers, counts, host scalars) are baked into the captured work: a change
  means capturing the call again and swapping the new capture into the executable graph with
  ``cuGraphExecChildGraphNodeSetParams`` (the Recapture tier, ≈0.2 ms measured on H100). A new size
  may make the library pick another algorithm, a different topology the executable graph refuses
  (``CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE``): the call is then *stale* and only a Cold rebuild can
  take it, while the previous capture keeps running.
- **device scalars** (cuBLAS ``alpha``/``beta`` in device pointer mode) live in device memory the
  captured work reads at run time: a change is an 8-byte copy from a pinned host slot on the engine
  stream, ordered between frames, with no re-capture (verified on H100).

``CallArg`` and ``DeviceSlot`` give both the same slot interface as kernel parameters (``value``,
item assignment), so Hot and Warm updates patch captured calls and kernels through one path.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from ..errors import LibraryCallError
from ..kernels._driver import check, driver
from ..kernels.types import DType
from .buffers import BufferPool, GpuBuffer
from .capture import capture_call, destroy_graph
from .device import DeviceContext
from .libraries import LibraryHandles
from .params import write_slot
from .plan import Arg, CapturedNodePlan, NodePlan

__all__ = ["CallArg", "CapturedCall", "CapturedCalls", "DeviceScalars", "DeviceSlot"]


class DeviceSlot:
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

    def __setitem__(self, key: Any, v: Any) -> None:  # vector values (``write_slot`` assigns slices)
        self.view[key] = v
        self._copy()

    def _copy(self) -> None:
        (err,) = driver().cuMemcpyHtoDAsync(self.device, self.host, self.nbytes, self.stream)
        if err:
            check((err,), "cuMemcpyHtoDAsync")


class DeviceScalars:
    """Device memory for the device scalars of a graph's captured calls: one 8-byte slot per block
    parameter (shared by every call of the block that reads it), a pinned host mirror, and one copy
    of the initial values on the engine stream.

    ``buffer`` comes from the pool; the graph owns it like its other buffers (it goes back to the
    pool when the graph retires). The pinned mirror is this object's: ``close`` frees it.
    """

    def __init__(self, nodes: Iterable[NodePlan], pool: BufferPool, device: DeviceContext) -> None:
        """Allocate and fill the slots of every ``device`` argument of the captured nodes in ``nodes``.

        Raises:
            CudaError: an allocation or the initial copy failed (nothing is left allocated).
        """
        calls = [n for n in nodes if isinstance(n, CapturedNodePlan)]
        keys: dict[Any, int] = {}
        for node in calls:
            for a in node.args:
                if a.kind == "device" and a.ref not in keys:
                    keys[a.ref] = len(keys)
        self.buffer: GpuBuffer | None = None
        self.host = 0
        self._by_node: dict[int, dict[int, DeviceSlot]] = {}
        if not keys:
            return
        d = driver()
        nbytes = 8 * len(keys)
        self.buffer = buf = GpuBuffer(pool, DType.UINT64, len(keys), stream=device.stream)
        try:
            self.host = host = int(check(d.cuMemHostAlloc(nbytes, 0), "cuMemHostAlloc"))
            ctypes.memset(host, 0, nbytes)
            slots: dict[Any, DeviceSlot] = {}
            for node in calls:
                for ai, a in enumerate(node.args):
                    if a.kind != "device":
                        continue
                    slot = slots.get(a.ref)
                    if slot is None:
                        off = 8 * keys[a.ref]
                        dt = a.dtype
                        ctype = dt.ctype if dt.lanes == 1 else dt.ctype * dt.lanes
                        view = ctype.from_address(host + off)
                        write_slot(view, a.value)
                        slot = DeviceSlot(view, host + off, buf.ptr + off, min(dt.itemsize, 8), device.stream)
                        slots[a.ref] = slot
                    self._by_node.setdefault(node.index, {})[ai] = slot
            check(d.cuMemcpyHtoDAsync(buf.ptr, host, nbytes, device.stream), "cuMemcpyHtoDAsync")
        except BaseException:
            try:
                self.close()
            except Exception:  # the failure being raised matters more than this cleanup's
                self.host = 0
            buf.close()
            self.buffer = None
            raise

    def for_node(self, node_index: int) -> dict[int, DeviceSlot]:
        """Argument index -> slot, of the captured node at ``node_index`` (empty if it has none)."""
        return self._by_node.get(node_index, {})

    def close(self) -> None:
        """Free the pinned mirror; idempotent. (``buffer`` is the graph's to give back.)

        Raises:
            CudaError: cuMemFreeHost failed.
        """
        if self.host:
            host, self.host = self.host, 0
            check(driver().cuMemFreeHost(host), "cuMemFreeHost")

    def abandon(self) -> None:
        """Forget the pinned mirror without freeing it: the context was reset under it."""
        self.host = 0


class CallArg:
    """A host-side argument of a captured call: writing it marks the call for re-capture."""

    __slots__ = ("call", "index")

    def __init__(self, call: CapturedCall, index: int) -> None:
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


class CapturedCall:
    """A captured library call in one executable graph: its child-graph node, the argument values it
    was captured with, and the captured graph itself (kept for fault replay).

    ``params`` is None: the commit step of a Hot/Warm update tells it from a kernel node by that.
    """

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

    generic = None  # never runs a specialised kernel (``KernelNode.generic``)

    def __init__(
        self, plan: CapturedNodePlan, values: list[Any], block_name: str | None, device_slots: dict[int, DeviceSlot]
    ) -> None:
        """A call as captured into one graph (``capture`` makes the child graph; nothing here calls the driver).

        Args:
            plan: The planned call.
            values: One value per descriptor parameter (device scalars: their value, read through the slot).
            block_name: For error messages.
            device_slots: Argument index -> the device slot of each device scalar argument.
        """
        self.plan = plan
        self.values = values
        self.block_name = block_name
        self.handle: Any = None
        self.child: Any = None
        self.dirty = False
        self.stale = False  # its values were captured into a topology the executable graph cannot take
        self.params = None
        self._replay: Any = None  # an executable of ``child`` alone, for node-by-node replay
        self._device = device_slots
        self.slots: list[Any] = [device_slots.get(i) or CallArg(self, i) for i in range(len(values))]

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
        """Capture the call with the current values; returns the new ``CUgraph`` (not kept: see ``replace_child``).

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

    def abandon(self) -> None:
        """Forget the captured graph and replay executable without destroying them (context reset)."""
        self.child = self._replay = None


class CapturedCalls:
    """The captured calls of one executable graph and their Recapture tier.

    Attributes:
        recaptures: Re-captures done by Hot/Warm updates and in-place resizes.
        errors: Block id -> the error of its last failed re-capture (the previous capture keeps running).
        stale: True when a re-capture changed a call's graph topology: only a Cold rebuild can apply it.
    """

    def __init__(self, libraries: LibraryHandles | None) -> None:
        self.libraries = libraries
        self.calls: list[CapturedCall] = []
        self.recaptures = 0
        self.errors: dict[int, LibraryCallError] = {}
        self.stale = False
        #: The second executable of a graph with FrameDelays (``phases.py``): a re-capture goes into both.
        self.second: Any = None

    def add(self, call: CapturedCall) -> None:
        """Own ``call`` from now on (``release`` destroys its captured graph)."""
        self.calls.append(call)

    def __len__(self) -> int:
        return len(self.calls)

    def stale_nodes(self) -> frozenset[int]:
        """Plan node indices of the calls whose newest capture only a new graph can take."""
        return frozenset(c.plan.index for c in self.calls if c.stale)

    def child_graph(self, block_id: int, kernel: int = 0) -> Any:
        """The ``CUgraph`` the call of ``(block_id, kernel)`` was last captured into, or None."""
        for c in self.calls:
            if c.plan.block_id == block_id and c.plan.kernel == kernel:
                return c.child
        return None

    def recapture(self, exec_: Any, call: CapturedCall) -> bool:
        """Recapture tier: capture ``call`` again with its new arguments and swap the result into the
        executable graph ``exec_`` (``cuGraphExecChildGraphNodeSetParams``). A failing call keeps its
        previous capture running and lands in ``errors``; a capture whose topology changed (another
        algorithm for another size) sets ``stale``: only a Cold rebuild can take it.

        Returns:
            Whether the new capture is live.

        Raises:
            CudaError: a driver call failed (other than the topology check).
        """
        d = driver()
        call.dirty = False
        bid = call.plan.block_id
        assert self.libraries is not None  # a graph with captured calls was built with library handles
        try:
            child = call.capture(self.libraries)
        except LibraryCallError as exc:
            self.errors[bid] = exc
            return False
        (err,) = d.cuGraphExecChildGraphNodeSetParams(exec_, call.handle, child)
        if not err and self.second is not None:  # the second phase of a graph with FrameDelays
            (err,) = d.cuGraphExecChildGraphNodeSetParams(self.second, call.handle, child)
        if err == d.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            destroy_graph(child)
            self.stale = call.stale = True
            return False
        if err:
            destroy_graph(child)
            check((err,), "cuGraphExecChildGraphNodeSetParams", block=call.block_name, kernel=call.plan.entry_point)
        call.replace_child(child)
        self.errors.pop(bid, None)
        self.recaptures += 1
        return True

    def patch(
        self,
        exec_: Any,
        changes: Sequence[tuple[CapturedCall, CapturedNodePlan]],
        arg_value: Callable[[Arg], Any],
    ) -> int | None:
        """Warm resize of the calls: move each call to its new plan node, re-capturing it where a
        host-side argument changed and writing device scalars that changed.

        Args:
            exec_: The executable graph holding the calls.
            changes: ``(call, new plan node)`` pairs (the Warm decision checked they match).
            arg_value: Resolves a planned argument to its value in this graph.

        Returns:
            The number of calls re-captured, or None if one could not be (a Cold rebuild takes it
            then; its error and the stale flag are cleared for that rebuild to decide).

        Raises:
            CudaError: a driver call failed.
        """
        recaptured = 0
        for call, new in changes:
            values = [arg_value(a) for a in new.args]
            if any(a.kind != "device" and v != o for a, v, o in zip(new.args, values, call.values, strict=True)):
                saved, call.values = call.values, values
                if not self.recapture(exec_, call):
                    call.values = saved
                    self.stale = False
                    self.errors.pop(new.block_id, None)
                    return None
                recaptured += 1
            for slot, a in zip(call.slots, new.args, strict=True):
                if a.kind == "device" and slot.value != a.value:
                    write_slot(slot, a.value)
            call.plan = new
        return recaptured

    def release(self) -> None:
        """Destroy every call's captured graph (errors ignored: teardown)."""
        for c in self.calls:
            c.release()

    def abandon(self) -> None:
        """Forget every captured graph without destroying it: the context was reset under them."""
        for c in self.calls:
            c.abandon()
