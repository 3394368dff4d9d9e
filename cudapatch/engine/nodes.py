"""Node kinds: how each kind of plan node becomes a node of a CUDA graph.

``NODE_KINDS`` maps a plan node type (``KernelNodePlan``, ``MemsetNodePlan``, ...) to the function
that adds it to the graph under construction. The builder looks every node up in that table, so a
new kind (a conditional region, a memcpy, a fused kernel, a probe) is one more plan record, one
more function here and one more table entry; nothing else in the builder changes.

Each kind returns the driver's node handle and the *runtime node* the executable graph keeps for
later updates: a ``KernelNode`` (pinned parameter storage a Hot/Warm update patches), a
``CapturedCall`` (a child graph the Recapture tier replaces), or None where nothing is patched after
the build (memsets, timestamps, the readback publish kernel).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from ctypes import c_uint32, c_uint64
from dataclasses import dataclass, field
from typing import Any

from ..errors import CudapatchError, KernelLoadError, LibraryCallError
from ..kernels._driver import check, driver
from .buffers import GpuBuffer
from .captured_calls import CapturedCall, CapturedCalls, DeviceScalars
from .context import ExternalBinding
from .device import DeviceContext
from .params import PackedLaunch, ParamStorage, StoreLoans
from .plan import (
    Arg,
    CapturedNodePlan,
    ConditionalNodePlan,
    KernelNodePlan,
    MemsetNodePlan,
    NodePlan,
    ProbeNodePlan,
    PublishNodePlan,
    StampNodePlan,
)
from .probes import PROBE_SCRATCH_WORDS, PROBE_THREADS
from .readback import PUBLISH_THREADS, ReadbackRing

__all__ = [
    "NODE_KINDS",
    "KernelNode",
    "NodeBuild",
    "RuntimeNode",
    "add_node",
    "arg_value",
    "make_conditions",
    "probe_launch",
]


class KernelNode:
    """A kernel node of one executable graph: its handle, plan and (possibly inherited) storage."""

    __slots__ = (
        "store",
        "params",
        "slots",
        "handle",
        "plan",
        "child",
        "body",
        "alt",
        "alt_params",
        "generic",
        "special",
        "carrier",
        "hid",
    )

    def __init__(self, store: ParamStorage, handle: Any, plan: KernelNodePlan) -> None:
        self.store = store
        self.params = store.params
        self.handle = handle
        self.plan = plan
        #: The child-graph node it sits in (``child_graphs.ChildGraphNode``), None at the top level.
        self.child: Any = None
        self.body: Any = None  # the region body graph holding the node (None: the top-level graph)
        #: The storage of this node in a graph's second phase (FrameDelay feedback: other pair
        #: pointers), or None; ``alt_params`` is what the second executable is patched with.
        self.alt: ParamStorage | None = None
        self.alt_params = store.params
        #: While the node runs a kernel specialised on its scalars' values (``CompiledGraph.specialize``):
        #: the function it ran before, put back by the node's next Hot or Warm patch. None otherwise.
        self.generic: Any = None
        #: The ``(argument index, 32 bits)`` values the specialised kernel was made with (while ``generic``
        #: is set): a Warm patch that leaves them as they are (new pointers, counts, grids) keeps it.
        self.special: Any = None
        #: While the node's block is carried (``bypass.Carry``): the copy it runs instead of its kernel
        #: (``executable._Carrier``), which every update of the node gives the driver. None otherwise.
        self.carrier: Any = None

    def __getattr__(self, name: str) -> Any:
        if name == "slots":  # the storage's slot objects, made at first use (``ParamStorage.slots``)
            self.slots = slots = self.store.slots
            return slots
        if name == "hid":  # the handle's value, for the held calls on plain values (``RawCalls``), at first use
            self.hid = hid = int(self.handle)
            return hid
        raise AttributeError(name)

    def set_alt(self, alt: ParamStorage) -> None:
        """Give the node its second-phase storage (``phases.second_phase``)."""
        self.alt = alt
        self.alt_params = alt.params

    def launch_alone(self, stream: Any) -> Any:
        """Launch this kernel by itself (fault replay); returns the driver's error code."""
        return self.store.launch_alone(stream)


#: What the executable graph keeps per plan node (None: nothing to patch after the build).
RuntimeNode = KernelNode | CapturedCall | None


def arg_value(
    a: Arg, buffers: Sequence[GpuBuffer], bindings: Mapping[tuple[int, str], ExternalBinding], counters_ptr: int
) -> Any:
    """The value a planned argument takes in one graph: a buffer's or binding's device address, an
    append counter's address, 0 for an unbound optional input, else the planned value."""
    if a.kind == "buffer":
        return buffers[a.ref].ptr  # type: ignore[index]
    if a.kind == "external":
        return bindings[a.ref].ptr  # type: ignore[index]
    if a.kind == "counter":
        return counters_ptr + 4 * a.ref  # type: ignore[operator]
    if a.kind == "null":
        return 0
    return a.value


@dataclass
class NodeBuild:
    """What the node kinds need from the graph under construction.

    Attributes:
        graph: The ``CUgraph`` nodes are added to.
        device: The engine's device (its context for memset nodes).
        buffers: The graph's buffers, by plan buffer index.
        bindings: Input bindings, by ``(block_id, port)``.
        functions: ``(block_id, kernel index)`` -> loaded ``CUfunction``.
        names: Block id -> name, for errors.
        stores: Parameter storages lent by the running graph.
        calls: The graph's captured calls (a call joins before its child node is added, so a
            failed build destroys its capture).
        scalars: Device-scalar slots of the captured calls.
        libraries: The engine's library handles (None: the plan must hold no captured call).
        readback: The graph's readback ring (None without counters and stamps).
        counters_ptr: Device address of the append counters; stamps_ptr: of the timestamp slots.
        stamp_function / publish_function: The engine's timestamp and publish kernels, when loaded.
        probe_function: The probe kernel (``engine/probes.py``), when the plan has probes.
        probes_ptr: Device address of the probe records in the readback block; probe_scratch_ptr: of
            the probes' scratch (partial results and finished-block counters).
        occupancy: Filled with ``(block_id, kernel) -> occupancy`` when not None (DeepAsync and up).
        launches: Keeps the packed arguments of the fixed kernels alive with the graph.
        root: The top-level ``CUgraph`` (regions' conditional handles belong to it); ``graph`` is the
            graph the next node goes into: the root or a region's body.
        handles: Conditional node index -> its handle's value (the set-condition kernels' argument).
        conditions: Conditional node index -> its ``CUgraphConditionalHandle`` (``make_conditions``).
        bodies: Conditional node index -> its body ``CUgraph`` (owned by the node).
        specialized: ``(block_id, kernel index)`` -> the specialised kernel the replaced graph runs
            (``CompiledGraph.specializations``): a node of that kernel starts with it where it runs the
            same generic source and holds the same values.
    """

    graph: Any
    device: DeviceContext
    buffers: Sequence[GpuBuffer]
    bindings: Mapping[tuple[int, str], ExternalBinding]
    functions: Mapping[tuple[int, int], Any]
    names: Mapping[int, str]
    stores: StoreLoans
    calls: CapturedCalls
    scalars: DeviceScalars | None
    libraries: Any = None
    readback: ReadbackRing | None = None
    counters_ptr: int = 0
    stamps_ptr: int = 0
    stamp_function: Any = None
    publish_function: Any = None
    probe_function: Any = None
    probes_ptr: int = 0
    probe_scratch_ptr: int = 0
    occupancy: dict[tuple[int, int], float] | None = None
    launches: list[PackedLaunch] = field(default_factory=list)
    root: Any = None
    handles: dict[int, int] = field(default_factory=dict)
    conditions: dict[int, Any] = field(default_factory=dict)
    bodies: dict[int, Any] = field(default_factory=dict)
    specialized: Mapping[tuple[int, int], Any] = field(default_factory=dict)
    _pointers: list[int] | None = field(default=None, repr=False)

    def value(self, a: Arg) -> Any:
        """``arg_value`` of ``a`` in this graph (a region's handle: the value made for its conditional node)."""
        if a.kind == "handle":
            return self.handles[a.ref]  # type: ignore[index]
        return arg_value(a, self.buffers, self.bindings, self.counters_ptr)

    def values(self, args: Sequence[Arg]) -> list[Any]:
        """``value`` of each of ``args``; the common kinds without a call each (a build of 10,000
        kernel nodes asks for 50,000 values)."""
        ptrs = self._pointers
        if ptrs is None:  # the buffers are all made before the first node
            ptrs = self._pointers = [buf.ptr for buf in self.buffers]
        out = []
        for a in args:
            kind = a.kind
            if kind == "buffer":
                out.append(ptrs[a.ref])  # type: ignore[index]
            elif kind == "scalar" or kind == "const":
                out.append(a.value)
            else:
                out.append(self.value(a))
        return out


AddNode = Callable[[NodeBuild, Any, list[Any]], tuple[Any, RuntimeNode]]


def _occupancy(fn: Any, node: KernelNodePlan, device: DeviceContext) -> float:
    """Fraction of an SM's thread slots this kernel can keep busy (the occupancy API, at build time)."""
    threads = node.block * node.yz[2] * node.yz[3]  # a 2-D/3-D block's threads: x * y * z
    blocks = check(
        driver().cuOccupancyMaxActiveBlocksPerMultiprocessor(fn, threads, node.shared_bytes),
        "cuOccupancyMaxActiveBlocksPerMultiprocessor",
        kernel=node.entry_point,
    )
    return min(1.0, int(blocks) * threads / device.max_threads_per_multiprocessor)


def _add_kernel(b: NodeBuild, node: KernelNodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    fn = b.functions.get((node.block_id, node.kernel))
    if fn is None:
        raise KernelLoadError("kernel is not compiled", block=b.names.get(node.block_id), kernel=node.entry_point)
    store = b.stores.storage(node, fn, b.values(node.args))
    kept = b.specialized.get((node.block_id, node.kernel)) if b.specialized else None
    if kept is not None and (kept.source is not node.source or not kept.holds(store)):
        kept = None  # other code or other values: the generic kernel (the specialiser looks again)
    if kept is not None:
        store.params.func = kept.function  # (a build that fails restores a borrowed storage's function)
    err, h = driver().cuGraphAddKernelNode(b.graph, deps, len(deps), store.params)
    if err:
        check((err,), "cuGraphAddKernelNode", block=b.names.get(node.block_id), kernel=node.entry_point)
    if b.occupancy is not None and node.kernel >= 0:  # not a region's one-thread set-condition kernel
        b.occupancy[(node.block_id, node.kernel)] = _occupancy(fn, node, b.device)
    kn = KernelNode(store, h, node)
    if kept is not None:  # as ``CompiledGraph.specialize`` leaves it: a Hot patch puts ``fn`` back
        kn.generic, kn.special = type(fn)(int(fn)), kept.constants
    return h, kn


def _add_memset(b: NodeBuild, node: MemsetNodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    d = driver()
    mp = d.CUDA_MEMSET_NODE_PARAMS()
    if node.buffer is not None:  # the output of a faulted block, zero-filled
        buf = b.buffers[node.buffer]
        mp.dst = buf.ptr
        mp.elementSize, mp.width, mp.height, mp.pitch, mp.value = 1, max(buf.nbytes, 1), 1, 0, 0
    else:  # the append counters, zeroed at the start of each launch
        mp.dst = b.counters_ptr
        mp.elementSize, mp.width, mp.height, mp.pitch, mp.value = 4, node.count, 1, 0, 0
    h = check(d.cuGraphAddMemsetNode(b.graph, deps, len(deps), mp, b.device.context), "cuGraphAddMemsetNode")
    return h, None


def _add_captured(b: NodeBuild, node: CapturedNodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    name = b.names.get(node.block_id)
    if b.libraries is None:
        raise LibraryCallError("library calls need the engine's library handles", block=name)
    slots = b.scalars.for_node(node.index) if b.scalars is not None else {}
    call = CapturedCall(node, [b.value(a) for a in node.args], name, slots)
    call.child = call.capture(b.libraries)
    b.calls.add(call)  # a failed build destroys its child graph from here on
    call.handle = check(
        driver().cuGraphAddChildGraphNode(b.graph, deps, len(deps), call.child),
        "cuGraphAddChildGraphNode",
        block=name,
        kernel=node.entry_point,
    )
    return call.handle, call


def _add_fixed(b: NodeBuild, launch: PackedLaunch, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    b.launches.append(launch)
    h = check(driver().cuGraphAddKernelNode(b.graph, deps, len(deps), launch.params), "cuGraphAddKernelNode")
    return h, None


def _add_stamp(b: NodeBuild, node: StampNodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    if b.stamp_function is None:
        raise CudapatchError("profiling needs the timestamp kernel, which is not loaded")
    # stamp(unsigned long long* slots, unsigned int index): the index's low 4 bytes are read.
    return _add_fixed(b, PackedLaunch(b.stamp_function, (c_uint64(b.stamps_ptr), c_uint64(node.stamp))), deps)


def _add_publish(b: NodeBuild, node: PublishNodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    if b.publish_function is None or b.readback is None:
        raise CudapatchError("the graph publishes readback values, but the publish kernel is not loaded")
    src, words, ring, slot_words, frames, end = b.readback.publish_args(node.end_stamp)
    values = (c_uint64(src), c_uint32(words), c_uint64(ring), c_uint32(slot_words), c_uint64(frames), c_uint32(end))
    return _add_fixed(b, PackedLaunch(b.publish_function, values, threads=PUBLISH_THREADS), deps)


def _add_conditional(b: NodeBuild, node: ConditionalNodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    """A region: a conditional node (IF, or WHILE for While and For) with one body graph, which the
    builder fills with the nodes the plan scopes to it; its handle comes from ``make_conditions``."""
    d = driver()
    name = b.names.get(node.block_id)
    handle = b.conditions[node.index]
    cond = d.CUDA_CONDITIONAL_NODE_PARAMS()
    cond.handle = handle
    kinds = d.CUgraphConditionalNodeType
    cond.type = kinds.CU_GRAPH_COND_TYPE_IF if node.kind == "if" else kinds.CU_GRAPH_COND_TYPE_WHILE
    cond.size = 1
    cond.ctx = b.device.context
    params = d.CUgraphNodeParams()
    params.type = d.CUgraphNodeType.CU_GRAPH_NODE_TYPE_CONDITIONAL
    params.conditional = cond
    try:  # cuda-bindings 13: (graph, deps, edge data, count, params); 12: without edge data
        result = d.cuGraphAddNode(b.graph, deps, None, len(deps), params)
    except TypeError:
        result = d.cuGraphAddNode(b.graph, deps, len(deps), params)
    h = check(result, "cuGraphAddNode (conditional)", block=name)
    # The body graph is on the struct the call filled (``params``), not on ``cond``, the copy given in.
    b.bodies[node.index] = params.conditional.phGraph_out[0]
    return h, None


def make_conditions(b: NodeBuild, nodes: Sequence[NodePlan]) -> None:
    """Create the conditional handle of every region before any node is added: the set-condition
    kernel that precedes a conditional node takes its handle's value as an argument. Handles belong
    to the top-level graph (valid for conditional nodes in it and in its children); no default
    value: a set-condition kernel sets each one every launch.

    Raises:
        CudaError: the driver refused a handle.
    """
    d = driver()
    for node in nodes:
        if isinstance(node, ConditionalNodePlan):
            handle = check(
                d.cuGraphConditionalHandleCreate(b.root, b.device.context, 0, 0),
                "cuGraphConditionalHandleCreate",
                block=b.names.get(node.block_id),
            )
            b.conditions[node.index] = handle
            b.handles[node.index] = int(handle)


def probe_launch(b: NodeBuild, node: ProbeNodePlan, data: int) -> PackedLaunch:
    """The packed launch of a probe node reading ``data`` (a FrameDelay's second phase probes the
    other buffer of a pair)."""
    # probe(data, n, kind, out, width, height, channels, scratch): see engine/probes.py
    values = (
        c_uint64(data),
        c_uint64(node.values),
        c_uint32(node.kind),
        c_uint64(b.probes_ptr + 8 * node.offset),
        c_uint32(node.width),
        c_uint32(node.height),
        c_uint32(node.channels),
        c_uint64(b.probe_scratch_ptr + 8 * PROBE_SCRATCH_WORDS * node.probe),
    )
    return PackedLaunch(b.probe_function, values, threads=PROBE_THREADS, grid=node.grid)


def _add_probe(b: NodeBuild, node: ProbeNodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    if b.probe_function is None or not b.probes_ptr:
        raise CudapatchError("the graph has probes, but the probe kernel is not loaded")
    return _add_fixed(b, probe_launch(b, node, b.buffers[node.buffer].ptr), deps)


#: Plan node type -> the function adding it to a graph. New node kinds register here.
NODE_KINDS: dict[type, AddNode] = {
    KernelNodePlan: _add_kernel,
    MemsetNodePlan: _add_memset,
    CapturedNodePlan: _add_captured,
    StampNodePlan: _add_stamp,
    PublishNodePlan: _add_publish,
    ConditionalNodePlan: _add_conditional,
    ProbeNodePlan: _add_probe,
}


def add_node(build: NodeBuild, node: NodePlan, deps: list[Any]) -> tuple[Any, RuntimeNode]:
    """Add ``node`` to ``build.graph`` after ``deps`` (driver node handles).

    Returns:
        ``(node handle, runtime node)``.

    Raises:
        CudapatchError: no kind for this node (``KernelLoadError``, ``LibraryCallError`` from the kinds).
        CudaError: a driver call failed.
    """
    kind = NODE_KINDS.get(type(node))
    if kind is None:
        raise CudapatchError(f"realize has no node kind for {type(node).__name__}")
    return kind(build, node, deps)
