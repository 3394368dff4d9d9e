"""GraphPlan: the compiled patch as pure data, ready for ``realize``.

Nothing here touches the driver. Kernel arguments are described by ``Arg`` records saying where
each value comes from, so ``realize`` can fill them and the engine can patch them later (Hot
scalars, Warm pointers) through ``scalar_slots`` and ``binding_slots``.

Per-node records are NamedTuples: a Cold rebuild makes hundreds of them, and tuples are several
times cheaper to build and hash than frozen dataclasses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal, NamedTuple

from ..kernels.descriptor import KernelDescriptor
from ..kernels.source import KernelSource
from ..kernels.types import DType
from .diagnostics import Diagnostic
from .memory_plan import MemoryPlan
from .profiling import ProfilingLevel

__all__ = [
    "Arg",
    "BufferPlan",
    "CapturedNodePlan",
    "ChildGraphPlan",
    "ConditionalNodePlan",
    "RegionPlan",
    "DelayPlan",
    "StampNodePlan",
    "GraphPlan",
    "KernelNodePlan",
    "MemsetNodePlan",
    "NodePlan",
    "ProbeNodePlan",
    "PublishNodePlan",
    "Slot",
    "TimingPair",
    "programmatic_edges",
]

ArgKind = Literal["buffer", "external", "scalar", "device", "const", "counter", "null", "handle"]


class Arg(NamedTuple):
    """Where one kernel parameter's value comes from.

    Attributes:
        kind: ``buffer`` (a planned buffer), ``external`` (a user binding), ``scalar`` (a block parameter),
            ``device`` (a block parameter a captured call reads from device memory), ``const`` (a resolved
            count), ``counter`` (an append counter slot), ``null`` (optional input unbound).
        dtype: Value type (pointee type for pointers).
        is_pointer: Whether the parameter is a device pointer.
        ref: Buffer index, counter index, ``(block_id, port)`` binding key or ``(block_id, param)`` key.
        value: The constant, or the scalar's value at compile time.
    """

    kind: ArgKind
    dtype: DType
    is_pointer: bool
    ref: object = None
    value: object = None


class BufferPlan(NamedTuple):
    """A device buffer the graph needs: a block output, an internal link, or append storage."""

    index: int
    block_id: int
    label: str
    dtype: DType
    count: int
    append: bool = False


class KernelNodePlan(NamedTuple):
    """A kernel launch node."""

    index: int
    block_id: int
    kernel: int
    source: KernelSource
    descriptor: KernelDescriptor
    grid: int
    block: int
    shared_bytes: int
    args: tuple[Arg, ...]
    deps: tuple[int, ...]
    #: 2-D/3-D launches: ``(grid y, grid z, block y, block z)``; ``grid`` and ``block`` are the x axis.
    yz: tuple[int, int, int, int] = (1, 1, 1, 1)

    @property
    def entry_point(self) -> str:
        return self.descriptor.entry_point


class CapturedNodePlan(NamedTuple):
    """A captured library call: realized as a child-graph node holding what ``spec.call`` issued
    during stream capture. ``args`` follow ``descriptor.parameters`` one to one."""

    index: int
    block_id: int
    kernel: int
    spec: object  # the CapturedSpec (kept opaque: the plan module does not import blocks)
    descriptor: KernelDescriptor
    args: tuple[Arg, ...]
    deps: tuple[int, ...]

    @property
    def entry_point(self) -> str:
        return self.descriptor.entry_point


class MemsetNodePlan(NamedTuple):
    """Zeroes ``count`` uint32 append counters at the start of each launch, or, with ``buffer``
    set, that planned buffer (the outputs of a block that faulted on the GPU read as zeros)."""

    index: int
    count: int
    deps: tuple[int, ...] = ()
    buffer: int | None = None


class StampNodePlan(NamedTuple):
    """Writes the GPU's nanosecond timer into timestamp slot ``stamp`` (profiling levels above None).

    Stamp nodes are side branches: nothing depends on them, so they never delay the kernels they
    measure (event-record nodes were measured at ~2.6 µs of host time per node per launch). Where
    the GPU has them, they hang on programmatic edges (see ``programmatic_edges``).
    """

    index: int
    stamp: int
    deps: tuple[int, ...] = ()


class PublishNodePlan(NamedTuple):
    """The graph's last node when it has readback values (append counters, timestamps): copies them
    into the host-mapped readback ring (``engine/readback.py``). Waits for every other sink. With
    ``end_stamp`` set it first writes the graph's end time into that timestamp slot, so the graph
    ends with one small kernel, not two."""

    index: int
    deps: tuple[int, ...] = ()
    end_stamp: int | None = None


class ConditionalNodePlan(NamedTuple):
    """A region (``If``, ``While``, ``For``): a CUDA conditional node whose body graph holds the nodes
    that ``GraphPlan.scopes`` maps to this node's index. ``kind`` is ``if`` or ``while`` (a ``For`` is
    a while over a device counter). Its handle is set on the device by the region's set-condition
    kernels (``KernelNodePlan`` of the region block whose ``handle`` argument names this node)."""

    index: int
    block_id: int
    kind: str
    deps: tuple[int, ...] = ()
    kernel: int = -1  # never a kernel of the block: here so profiling can time it like one


class RegionPlan(NamedTuple):
    """What the engine needs to know of one region at run time.

    Attributes:
        kind: ``if``, ``while`` or ``for``.
        node: Index of its conditional node.
        counter: Index of its iteration counter among the plan's counters (While and For), read back
            through the readback ring like an append count; None for an If.
        limit: The parameter bounding its iterations (``Max``, ``Count``), None for an If.
        unroll: Copies of the body in one iteration of the conditional node ``node`` (``Unroll``).
        tail: With ``unroll`` > 1, the conditional node running the iterations left, one copy each.
        pairs: With FrameDelays carried by ping-pong and ``unroll`` > 2, the conditional node between
            ``node`` and ``tail`` running what is left two copies at a time (``compiler/region_delays.py``).
        timers: ``(unit, counter index)`` of the body timer of each block and region directly in its
            body (``PerBlock`` and up, ``compiler/body_timers.py``): the first of its record's counter words.
    """

    kind: str
    node: int
    counter: int | None = None
    limit: str | None = None
    unroll: int = 1
    tail: int | None = None
    pairs: int | None = None
    timers: tuple[tuple[int, int], ...] = ()


class ProbeNodePlan(NamedTuple):
    """Statistics of one probed wire (``engine/probes.py``): a reduction kernel reading buffer
    ``buffer`` right after the block that makes it, writing min, max, sum, finite/NaN/Inf counts (and
    a ``thumb_w`` x ``thumb_h`` thumbnail of a ``height`` x ``width`` image) into the readback block at
    ``offset`` words past the append counters. A side branch: only writers of the same buffer after
    it (in-place consumers) and the publish node wait for it.

    Attributes:
        probe: Its index in ``GraphPlan.probes``.
        values: Scalars read: elements x lanes.
        kind: The element kind code of the probe kernel (``probes.PROBE_KINDS``).
        grid: Thread blocks of the reduction.
        width / height / channels: The image the buffer holds (0: not known to be 2-D).
    """

    index: int
    probe: int
    buffer: int
    values: int
    kind: int
    grid: int
    offset: int
    deps: tuple[int, ...] = ()
    width: int = 0
    height: int = 0
    channels: int = 0
    thumb_w: int = 0
    thumb_h: int = 0


class TimingPair(NamedTuple):
    """A measured span: ``kind`` is ``graph``, ``block`` (key: block id) or ``kernel`` (key:
    ``(block id, kernel index)``), between timestamp slots ``start`` and ``end``."""

    kind: str
    key: object
    start: int
    end: int


class ChildGraphPlan(NamedTuple):
    """Plan nodes realized inside one CUDA child-graph node (a composite with ``child_graph``): the
    nodes keep their indices, slots and stats; ``realize`` adds them to the child's graph, with the
    edges among them, and hangs the child node on every dependency they have outside it."""

    block_id: int  # the composite
    name: str
    nodes: tuple[int, ...]  # in plan order


class DelayPlan(NamedTuple):
    """A running ``FrameDelay`` (see ``compiler/delays.py``).

    In the plan as compiled (phase 0) the block computing the delay's ``In`` writes buffer
    ``current`` and the readers of its ``Out`` read buffer ``previous``; the executable graph's
    phase 1 swaps the two pointers in every node, and the phases alternate frame by frame.

    Attributes:
        block_id: The delay.
        node: Its init kernel node (writes the start value into ``previous``; enabled only on the
            first frame and after a reset), or None when the block faulted.
        previous: Buffer index ``Out`` reads in phase 0.
        current: Buffer index ``In``'s block writes in phase 0; None when nothing feeds the delay
            (``Out`` keeps its start value, nothing alternates).
        copy: In a patch with regions: the node copying ``current`` into ``previous`` last in the
            delay's scope (``engine/delay_copy.py``; the last one where an unrolled loop has one per
            copy of its body), or, in a loop whose copies ping-pong the pair, the sync node after the
            loop (``compiler/region_delays.py``); such a delay does not alternate. None otherwise.
    """

    block_id: int
    node: int | None
    previous: int
    current: int | None
    copy: int | None = None


NodePlan = (
    KernelNodePlan
    | CapturedNodePlan
    | MemsetNodePlan
    | StampNodePlan
    | PublishNodePlan
    | ProbeNodePlan
    | ConditionalNodePlan
)
WorkNode = (KernelNodePlan, CapturedNodePlan)  # the nodes a block's work becomes (for isinstance)
Slot = tuple[int, int]  # (node index, argument index)


@dataclass(frozen=True)
class GraphPlan:
    """Everything ``realize`` needs, in topological order.

    Attributes:
        nodes: Nodes in a valid launch order (dependencies point backwards).
        buffers: Buffers to allocate.
        counters: ``(block_id, port)`` of each append counter, by counter index.
        block_order: Compiled blocks in topological order.
        skipped: Blocks left out of the graph (unlinked required input, or upstream skipped).
        diagnostics: Warnings found (errors make ``compile_plan`` raise instead).
        outputs: ``(block_id, port)`` → buffer index of each output.
        appends: ``(block_id, port)`` → ``(data buffer index, counter index)``.
        scalar_slots: ``(block_id, param)`` → kernel argument slots to patch on a Hot update.
        binding_slots: ``(block_id, port)`` → kernel argument slots to patch on a Warm rebind.
        binding_counts: ``(block_id, port)`` → element count the plan was sized for.
        block_nodes: block id → its node indices.
        scopes: node index → index of the conditional node whose body graph holds it (nodes of the
            top-level graph are absent). A body's nodes follow their conditional node, contiguously.
        regions: region block id → ``RegionPlan``.
        shapes: ``(block_id, port)`` → the Shape of each output that is not flat (1-D outputs hold
            their buffer's count).
        probes: ``(block_id, output port)`` of each probe node, by its ``probe`` index.
        probe_words: uint64 words the probes write into the readback block (after the counters).
        children: Groups of nodes realized as one child-graph node each.
        memory: Which values share which buffers, and which are pinned (None: a plan made by hand).
    """

    nodes: tuple[NodePlan, ...]
    buffers: tuple[BufferPlan, ...]
    counters: tuple[tuple[int, str], ...]
    block_order: tuple[int, ...]
    skipped: tuple[int, ...]
    diagnostics: tuple[Diagnostic, ...]
    outputs: dict[tuple[int, str], int] = field(compare=False)
    appends: dict[tuple[int, str], tuple[int, int]] = field(compare=False)
    scalar_slots: dict[tuple[int, str], tuple[Slot, ...]] = field(compare=False)
    binding_slots: dict[tuple[int, str], tuple[Slot, ...]] = field(compare=False)
    binding_counts: dict[tuple[int, str], int] = field(compare=False)
    block_nodes: dict[int, tuple[int, ...]] = field(compare=False)
    shapes: dict[tuple[int, str], Any] = field(default_factory=dict, compare=False)
    level: ProfilingLevel = ProfilingLevel.NONE
    timings: tuple[TimingPair, ...] = ()
    stamp_count: int = 0
    scopes: dict[int, int] = field(default_factory=dict, compare=False)
    regions: dict[int, RegionPlan] = field(default_factory=dict, compare=False)
    probes: tuple[tuple[int, str], ...] = ()
    probe_words: int = 0
    children: tuple[ChildGraphPlan, ...] = ()  # composites realized as child-graph nodes
    delays: tuple[DelayPlan, ...] = ()
    memory: MemoryPlan | None = field(default=None, compare=False)

    @property
    def swaps(self) -> dict[int, int]:
        """Buffer index -> the buffer it stands for in phase 1 (both ways), for every delay that alternates."""
        out: dict[int, int] = {}
        for dp in self.delays:
            if dp.current is not None and dp.copy is None:
                out[dp.previous], out[dp.current] = dp.current, dp.previous
        return out

    # Cached (the plan is frozen, its nodes a tuple): the frame thread asks at every swap and reap, and
    # a walk over 10,000 nodes costs it a millisecond each time.
    @cached_property
    def kernel_nodes(self) -> tuple[KernelNodePlan, ...]:
        return tuple(n for n in self.nodes if isinstance(n, KernelNodePlan))

    @cached_property
    def captured_nodes(self) -> tuple[CapturedNodePlan, ...]:
        return tuple(n for n in self.nodes if isinstance(n, CapturedNodePlan))

    @property
    def total_buffer_bytes(self) -> int:
        return sum(b.count * b.dtype.itemsize for b in self.buffers)

    def describe(self) -> str:
        """A readable listing of the plan, for debugging and docs."""
        lines = [f"GraphPlan: {len(self.nodes)} nodes, {len(self.buffers)} buffers, {len(self.counters)} counters"]
        for n in self.nodes:
            if isinstance(n, MemsetNodePlan):
                what = f"zero buffer {n.buffer}" if n.buffer is not None else f"{n.count} counters"
                lines.append(f"  [{n.index}] memset {what}")
            elif isinstance(n, StampNodePlan):
                lines.append(f"  [{n.index}] stamp {n.stamp} deps={list(n.deps)}")
            elif isinstance(n, PublishNodePlan):
                stamp = "" if n.end_stamp is None else f" (end stamp {n.end_stamp})"
                lines.append(f"  [{n.index}] publish readback{stamp} deps={list(n.deps)}")
            elif isinstance(n, ConditionalNodePlan):
                lines.append(f"  [{n.index}] {n.kind} region block={n.block_id} deps={list(n.deps)}")
            elif isinstance(n, ProbeNodePlan):
                bid, port = self.probes[n.probe]
                lines.append(f"  [{n.index}] probe {bid}.{port} buffer={n.buffer} grid={n.grid} deps={list(n.deps)}")
            elif isinstance(n, CapturedNodePlan):
                lines.append(f"  [{n.index}] captured {n.entry_point} block={n.block_id} deps={list(n.deps)}")
            else:
                gy, gz, by, bz = n.yz
                grid = f"{n.grid}x{n.block}" if n.yz == (1, 1, 1, 1) else f"({n.grid},{gy},{gz})x({n.block},{by},{bz})"
                lines.append(f"  [{n.index}] {n.entry_point} block={n.block_id} grid={grid} deps={list(n.deps)}")
        lines.extend(f"  child graph '{c.name}' (block {c.block_id}): nodes {list(c.nodes)}" for c in self.children)
        mem = self.memory
        if mem is not None and mem.buffer_values():  # buffer reuse: which values take turns in which buffer
            mb = 1 / 2**20
            lines.append(
                f"  buffers: {self.total_buffer_bytes * mb:.1f} MB for {mem.logical_bytes * mb:.1f} MB of values "
                f"({len(self.buffers)} buffers, {len(mem.values)} values)"
            )
            lines.append(mem.describe())
        return "\n".join(lines)


EdgePort = Literal["programmatic", "launch_order"]


def programmatic_edges(nodes: tuple[NodePlan, ...] | list[NodePlan]) -> dict[int, dict[int, EdgePort]]:
    """The edges of the profiling nodes that can be programmatic (GPUs of compute capability 9.0 and
    up): ``{node index: {dependency index: port}}``; every other edge is a plain one.

    - A stamp beside the work (one only the publish node waits for) and the publish node hang on the
      kernels before them by ``programmatic`` edges: launched while those kernels run, they wait for
      their end inside (``griddepcontrol.wait``) and read the timer right after it.
    - A kernel that only waits for the graph's start stamp launches once that stamp has begun
      (``launch_order``): the start time is taken, and nothing the kernel reads comes from it.
    - A probe hangs on the kernel writing its buffer by a ``programmatic`` edge (it waits inside, like
      the publish node), so a probe at the end of a chain costs the frame its run time, not also a
      launch latency.

    Edges from memsets and captured library calls stay plain, as do stamps on the path (a block's
    own start stamp), which the work waits for.
    """
    waited_for: dict[int, set[int]] = {}
    for n in nodes:
        for dep in n.deps:
            waited_for.setdefault(dep, set()).add(n.index)
    publish = {n.index for n in nodes if isinstance(n, PublishNodePlan)}
    launched = (KernelNodePlan, StampNodePlan, ProbeNodePlan)
    edges: dict[int, dict[int, EdgePort]] = {}
    for n in nodes:
        if isinstance(n, PublishNodePlan) or (
            isinstance(n, StampNodePlan) and n.deps and waited_for.get(n.index, set()) <= publish
        ):
            ports: dict[int, EdgePort] = {d: "programmatic" for d in n.deps if isinstance(nodes[d], launched)}
        elif isinstance(n, ProbeNodePlan):
            ports = {d: "programmatic" for d in n.deps if isinstance(nodes[d], KernelNodePlan)}
        elif isinstance(n, KernelNodePlan) and len(n.deps) == 1:
            first = nodes[n.deps[0]]
            ports = {first.index: "launch_order"} if isinstance(first, StampNodePlan) and first.stamp == 0 else {}
        else:
            ports = {}
        if ports:
            edges[n.index] = ports
    return edges
