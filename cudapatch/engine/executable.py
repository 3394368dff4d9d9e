"""CompiledGraph: the executable graph of one plan, as the engine runs and patches it each frame.

``realize`` (the builder) makes the driver objects; this class owns them once built and is what the
engine holds: ``launch(stream)`` is the one way to launch it, and every later change goes through a
public update method, cheapest first:

- Hot: ``update_scalars`` writes scalar values into the nodes' pinned parameter slots.
- Warm: ``update_bindings`` points kernels at new input addresses; ``update_grid`` changes a grid;
  ``try_patch`` applies a whole new plan in place when ``warm.decide_warm_patch`` accepts it.
- Code: ``swap_function`` puts a recompiled ``CUfunction`` into every node of a kernel.
- Bypass: ``set_bypass`` turns nodes off and on (``cuGraphNodeSetEnabled``) and points readers of a
  bypassed output at its input (``bypass.plan_bypass`` decides).
- Recapture: captured library calls whose host-side arguments changed are captured again
  (``captured_calls.CapturedCalls``).

Each writes slots and calls ``cuGraphExecKernelNodeSetParams`` with the node's kept parameter
struct (≈1.4 µs from Python, measured on H100): no allocation, no re-instantiation. The targets of
Hot and Warm updates are resolved once, at construction, so the frame path looks nothing up in the
plan.
"""

from __future__ import annotations

import ctypes
import itertools
import logging
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, NamedTuple

from .._lifecycle import ContextRef, HandleOwner, Releases
from ..blocks.parameter import BlockParameter
from ..errors import CudapatchError, LibraryCallError
from ..kernels._driver import check, driver, error_from_code
from ..kernels.held_calls import frame_calls
from .buffers import AppendBuffer, GpuBuffer
from .bypass import NO_BYPASS, BypassPlan, Carry
from .captured_calls import CapturedCall, CapturedCalls, DeviceScalars
from .child_graphs import commit_child_nodes
from .context import ExternalBinding
from .delay_copy import BLOCK as COPY_BLOCK
from .delay_copy import copy_grid
from .device import DeviceContext
from .nodes import KernelNode, RuntimeNode, arg_value
from .params import (
    PackedLaunch,
    ParamStorage,
    argument_offsets,
    give_back,
    pack_arguments,
    read_slot,
    stock_spares,
    write_slot,
)
from .phases import Phases, lending_keys, phase_nodes
from .plan import GraphPlan, ProbeNodePlan
from .probes import ProbeStats, decode_probe, record_words
from .readback import ReadbackRing
from .replay import replay_by_block
from .warm import WarmPatch, WarmRefusal, decide_warm_patch

__all__ = ["CompiledGraph", "GraphParts", "PreparedPatch"]

_U32 = struct.Struct("<I")
log = logging.getLogger("cudapatch.engine")

#: ``GraphParts.token``s, one per graph built (0 is no graph's).
_tokens = itertools.count(1)


@dataclass(frozen=True)
class Handover:
    """What ``CompiledGraph.adopt`` does to the previous graph's buffers, worked out by the build
    thread so that the swap frame does not visit every buffer (10,000 blocks: 4 ms on the H100 host):
    the borrowed buffers whose element count changes, all borrowed buffers (this graph owns them from
    then on), and the previous graph's owned buffers it keeps. Valid while the previous graph's
    ``buffer_epoch`` is still ``epoch`` (a Warm patch of it meanwhile sets counts: ``adopt`` then
    visits them all, as before)."""

    previous: CompiledGraph
    epoch: int
    counts: list[tuple[GpuBuffer, int]]
    borrowed: list[GpuBuffer]
    kept: list[GpuBuffer]

    @classmethod
    def work_out(cls, previous: CompiledGraph, borrowed: list[tuple[GpuBuffer, int]]) -> Handover:
        """The hand-over from ``previous`` of ``borrowed`` (``GraphParts.borrowed``); build thread."""
        epoch = previous.buffer_epoch  # read first: a patch after it moves the epoch on
        bufs = [buf for buf, _ in borrowed]
        gone = {id(b) for b in bufs}
        return cls(
            previous,
            epoch,
            [(buf, count) for buf, count in borrowed if buf.count != count],
            bufs,
            [b for b in previous.owned_buffers() if id(b) not in gone],
        )


@dataclass
class GraphParts:
    """Everything one graph owns besides its executable: what the builder made, handed over whole
    to the ``CompiledGraph`` (or released by the builder when the build fails).

    Attributes:
        device: The engine's device.
        calls: The captured library calls.
        buffers: Device buffers by plan buffer index (some borrowed from the previous graph until ``adopt``).
        owned: The buffers this graph gives back to the pool.
        borrowed: The previous graph's buffers in ``buffers``, each with the element count this graph
            gives it at ``adopt`` (the previous graph keeps running with its own until then).
        handover: What ``adopt`` does to the previous graph's buffers, worked out on the build thread
            (``Handover``), if there is a previous graph.
        counters: The readback block (timestamps, then append counters, then the frame count), if any.
        readback: The ring the readback block is copied into each frame, if any.
        appends: ``(block_id, port)`` -> the append buffer of an append output.
        counters_ptr: Device address of the append counters (0 without).
        probes_ptr / probe_scratch_ptr: Device addresses of the probe records and the probes' scratch.
        nodes: The runtime node of each plan node (None where nothing is patched later).
        scalars: Device-scalar slots of the captured calls.
        launches: Packed arguments of the timestamp and publish nodes.
        graph: The ``CUgraph``.
        handles: The graph node of each plan node, in insertion order.
        occupancy: ``(block_id, kernel)`` -> occupancy, measured at DeepAsync and up.
        token: This graph's own number: its kernel nodes' parameter storages name it as their owner
            (``ParamStorage.owner``), and ``release`` gives those back for later builds.
    """

    device: DeviceContext
    calls: CapturedCalls
    buffers: list[GpuBuffer] = field(default_factory=list)
    owned: list[GpuBuffer] = field(default_factory=list)
    borrowed: list[tuple[GpuBuffer, int]] = field(default_factory=list)
    handover: Handover | None = None
    counters: GpuBuffer | None = None
    readback: ReadbackRing | None = None
    appends: dict[tuple[int, str], AppendBuffer] = field(default_factory=dict)
    counters_ptr: int = 0
    probes_ptr: int = 0
    probe_scratch_ptr: int = 0
    nodes: list[RuntimeNode] = field(default_factory=list)
    scalars: DeviceScalars | None = None
    launches: list[PackedLaunch] = field(default_factory=list)
    graph: Any = None
    handles: list[Any] = field(default_factory=list)
    occupancy: dict[tuple[int, int], float] = field(default_factory=dict)
    token: int = field(default_factory=lambda: next(_tokens))

    def take_over(self, graph: Any, handles: list[Any]) -> None:
        """Use ``graph`` (the one another executable was instantiated from, now updated with this
        build's graph by ``cuGraphExecUpdate``) in place of the graph built here: nodes are addressed
        by its node handles from now on (paired by insertion order), and the graph built here, whose
        parameters the update copied, is destroyed (a failure is logged: the executable already runs
        this build's graph, so nothing may undo the take-over now).
        """
        own, self.graph = self.graph, graph
        for node, handle in zip(self.nodes, handles, strict=True):
            if node is not None:
                node.handle = handle
        self.handles = list(handles)
        (err,) = driver().cuGraphDestroy(own)
        if err:  # the executable runs already: a leaked template graph is logged, never fatal here
            log.warning("cuGraphDestroy of a graph taken over by cuGraphExecUpdate failed: %s", err)

    def release(self) -> None:
        """Free everything (the executable must be destroyed first); idempotent.

        Raises:
            CudaError: a driver call failed.
        """
        if self.readback is not None:
            self.readback.close()
        self.calls.release()
        if self.scalars is not None:
            self.scalars.close()
        for b in self.owned:
            b.close()
        self.owned.clear()  # the same list as the graph's ``_owned`` (``CompiledGraph._own`` rebinds both)
        if self.graph is not None:
            graph, self.graph = self.graph, None
            check(driver().cuGraphDestroy(graph), "cuGraphDestroy")
        self.give_back_stores()  # the executable is gone (or never was)

    def give_back_stores(self) -> None:
        """Hand the parameter storages this graph owns to later builds (``params.give_back``): only
        once nothing patches or launches this graph's nodes again (it is closed, or retired and idle)."""
        give_back((n.store for n in self.nodes if type(n) is KernelNode), self.token)

    def abandon(self) -> None:
        """Forget every driver object without freeing it: the context was reset under them."""
        if self.readback is not None:
            self.readback.abandon()
        self.calls.abandon()
        if self.scalars is not None:
            self.scalars.abandon()
        self.owned.clear()
        self.graph = None


class ArgumentBits(tuple):
    """``(argument index, the 32 bits it held)`` pairs, as ``CompiledGraph.argument_bits`` read them from
    a node's parameter storage, keeping what reads them again: ``specialize`` checks that a node
    still holds them on the frame thread in two C calls, with no Python loop over a fused group's
    ~1,000 scalars. A Python loop there gave the interpreter away to the build and specializer
    threads at every switch interval (after a 2x growth of a fused 10,000-block chain its 20
    specialised kernels landed within a few frames: 0.4 ms each on the CPU machine, 8 ms frames)."""

    indices: tuple[int, ...]
    bits: tuple[int, ...]
    descriptor: Any  # the layout read
    read: Callable[[Any], tuple[int, ...]]  # storage of that layout -> ``bits``

    def __new__(
        cls, indices: tuple[int, ...], bits: tuple[int, ...], descriptor: Any, read: Callable[[Any], tuple[int, ...]]
    ) -> ArgumentBits:
        self = super().__new__(cls, zip(indices, bits, strict=True))
        self.indices, self.bits, self.descriptor, self.read = indices, bits, descriptor, read
        return self


def _holds(constants: Sequence[tuple[int, int]]) -> Callable[[KernelNode], bool]:
    """Whether a node's parameter storage holds ``constants`` (``(argument index, 32 bits)``) now."""
    if isinstance(constants, ArgumentBits):
        desc, read, bits = constants.descriptor, constants.read, constants.bits
        # (the reader made for the layout read, where the node has it still: no cache lookup, which
        # hashes the indices)
        return lambda n: (
            (read if n.store.descriptor is desc else _bits_reader(n.store.descriptor, constants.indices))(
                n.store.storage
            )
            == bits
        )
    indices, bits = tuple(map(_first, constants)), tuple(map(_second, constants))
    return lambda n: _bits_reader(n.store.descriptor, indices)(n.store.storage) == bits


def _store_holds(constants: Sequence[tuple[int, int]]) -> Callable[[Any], bool]:
    """``_holds`` of a ``ParamStorage`` (a node's storage before the node is made: ``realize``)."""
    holds = _holds(constants)
    return lambda store: holds(_StoreOnly(store))


class _StoreOnly:
    """What ``_holds`` reads of a node: its storage."""

    __slots__ = ("store",)

    def __init__(self, store: Any) -> None:
        self.store = store


class KeptSpecialization(NamedTuple):
    """A specialised kernel of a graph, for the graph that replaces it (``CompiledGraph.specializations``).

    Attributes:
        function: The specialised function.
        constants: ``(argument index, 32 bits)`` it was made with (``specialize``).
        source: The generic ``KernelSource`` it was made from: a node of another source does not keep it.
        holds: Whether a ``ParamStorage`` holds ``constants`` now.
    """

    function: Any
    constants: Sequence[tuple[int, int]]
    source: Any
    holds: Callable[[Any], bool]


def _new_code(kn: KernelNode, function: Any) -> Any:
    """``function`` (a Warm patch's, from the build) where it is other code than the node runs: not
    its function, nor the generic kernel behind the specialised one it runs (read from another thread,
    ``generic`` may change meanwhile: ``apply_prepared`` decides about the specialisation again). Else None."""
    if function is None:
        return None
    f = int(function)
    if f == int(kn.params.func):
        return None
    generic = kn.generic
    return None if generic is not None and f == int(generic) else function


def _keeps_special(kn: KernelNode) -> bool:
    """Whether the specialised kernel ``kn`` runs may stay after a Warm patch wrote its storage: the
    scalars it was made with hold the same bits (it reads pointers, counts and grids as arguments, as
    the generic one does). A growth of a long fused chain then keeps every group specialised, where
    each used to go back to its generic kernel and be specialised again a quarter second later."""
    return kn.special is not None and _holds(kn.special)(kn)


_first, _second = itemgetter(0), itemgetter(1)

_bit_readers: dict[tuple[int, tuple[int, ...]], tuple[Any, Callable[[Any], tuple[int, ...]]]] = {}


def _bits_reader(descriptor: Any, indices: Sequence[int]) -> Callable[[Any], tuple[int, ...]]:
    """A reader of the 32 bits each argument of ``indices`` holds in a storage of ``descriptor``'s
    layout: one ``struct`` unpack for all of them (a fused group's ~1,000 scalars are compared on the
    frame thread when its specialised kernel lands: one ``unpack_from`` each took 0.27 ms a 1,000 on
    the CPU machine, the pairs included; now 0.09).
    Cached by the descriptor's identity and the indices."""
    key = (id(descriptor), tuple(indices))
    known = _bit_readers.get(key)
    if known is not None and known[0] is descriptor:
        return known[1]
    offsets = argument_offsets(descriptor)
    read = _one_unpack([offsets[i] for i in indices])
    if len(_bit_readers) > 1024:  # descriptors of edited kernels come and go
        _bit_readers.clear()
    _bit_readers[key] = (descriptor, read)
    return read


def _one_unpack(at: list[int]) -> Callable[[Any], tuple[int, ...]]:
    """Read the little-endian 32-bit words at byte offsets ``at`` (in that order) with one struct that
    skips the bytes between them, put back in the order asked for."""
    order = sorted(range(len(at)), key=at.__getitem__)
    fmt, pos = ["<"], 0
    for k in order:
        if at[k] < pos:  # overlapping words (an index asked twice): one unpack each
            return lambda raw: tuple(_U32.unpack_from(raw, o)[0] for o in at)
        fmt.append(f"{at[k] - pos}xI" if at[k] > pos else "I")
        pos = at[k] + 4
    unpack = struct.Struct("".join(fmt)).unpack_from
    if order == sorted(order):
        return unpack
    back = itemgetter(*sorted(range(len(order)), key=order.__getitem__))  # the inverse permutation
    if len(order) == 1:
        return lambda raw: (back(unpack(raw)),)
    return lambda raw: back(unpack(raw))


_PLAN = object()  # ``kernel_source``: no Code swap, the plan's source
_NO_SINGLE_TARGETS: dict[tuple[int, str], Any] = {}  # ``_patch``'s one-target table where there is none (read only)


def _top_level_kernel(node: Any) -> bool:
    """A kernel node of the top-level graph: patched with one ``cuGraphExecKernelNodeSetParams``."""
    return isinstance(node, KernelNode) and node.child is None and node.body is None


@dataclass(eq=False)
class PreparedPatch:
    """A Warm patch made ready on the build thread (``CompiledGraph.prepare_patch``).

    Attributes:
        base: The plan of the running graph it was decided against.
        decision: The trimmed decision.
        allocs: ``(buffer, pool block)`` of each buffer that grows (reserved, not yet moved to).
        writes: ``(node, a byte view of its storage, its packed arguments, its grid, its new function or
            None, its new plan node)`` of each node that changes.
        same: ``(node, its new plan node)`` of each node the patch named that keeps its values.
    """

    base: GraphPlan
    decision: WarmPatch
    allocs: list[tuple[GpuBuffer, Any]]
    writes: list[tuple[KernelNode, memoryview, bytes, tuple[int, int, int], Any, Any]] = field(default_factory=list)
    same: list[tuple[KernelNode, Any]] = field(default_factory=list)

    def discard(self) -> None:
        """Give back the reserved blocks (the patch will not be applied); idempotent."""
        allocs, self.allocs = self.allocs, []
        for buf, alloc in allocs:
            buf.unreserve(alloc)


class _Carrier:
    """The copy a carried node runs instead of its kernel (``bypass.Carry``): its launch, packed once,
    with the pointers the node's own arguments hold (read again each time it goes to the driver)."""

    __slots__ = ("launch", "src", "dst")

    def __init__(self, function: Any, carry: Carry) -> None:
        self.src, self.dst = carry.src, carry.dst
        values = (ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint32(carry.count))
        self.launch = PackedLaunch(function, values, threads=COPY_BLOCK, grid=copy_grid(carry.count))

    def params(self, kn: KernelNode) -> Any:
        """The copy's ``CUDA_KERNEL_NODE_PARAMS`` with the node's input and output pointers now."""
        values, slots = self.launch.values, kn.slots
        values[0].value = slots[self.src].value
        values[1].value = slots[self.dst].value
        return self.launch.params


def _params(kn: KernelNode) -> Any:
    """What the driver runs for kernel node ``kn``: its kernel, or the copy that carries it."""
    return kn.params if kn.carrier is None else kn.carrier.params(kn)


class _BypassStep:
    """What going from one bypass to another does to a graph's nodes, found once per pair of
    ``BypassPlan`` (``CompiledGraph.set_bypass``): a toggle alternates between two, and the frame then
    only calls the driver and writes the pointers (resolved at each step: a Warm growth or a rebind
    may have moved the buffers since).

    Attributes:
        old: The bypass it starts from.
        new: The bypass it ends in.
        switches: ``(node handle, 1 on / 0 off, its node)`` of each kernel node turned on or off.
        pointers: ``(slot, buffer, binding key, node, argument index)`` of each reader whose pointer
            the step may change, to the buffer it reads (a ``GpuBuffer``: a growth moves it in place),
            else the binding it reads, else (both None) what its plan argument says.
        one: The node of every pointer, where that is one top-level kernel node (one driver call
            applies the step's pointers), else None.
        targets: Binding key -> ``(node, slot)`` of the readers ``new`` redirects to that binding (a
            Warm rebind of it writes them too).
        carries: ``(node, its _Carrier or None)`` of each node whose carry ``new`` starts, changes or ends.
        direct: ``(slot, buffer)`` of every pointer, where all are buffers of ``one`` and nothing is
            carried (a toggle's usual step), else None: ``set_bypass`` then writes them and makes its
            one driver call without comparing or collecting anything.
        back: The step from ``new`` to ``old`` (made at the first step back): a toggle finds it here.
    """

    __slots__ = ("old", "new", "switches", "pointers", "one", "targets", "carries", "direct", "back")

    def __init__(
        self, graph: CompiledGraph, old: BypassPlan, new: BypassPlan, copies: Mapping[str, Any] | None = None
    ) -> None:
        self.old, self.new = old, new
        self.back: _BypassStep | None = None
        nodes, buffers = graph._nodes, graph.buffers
        self.carries: list[tuple[KernelNode, _Carrier | None]] = []
        for ni in old.carried.keys() | new.carried.keys():
            carry = new.carried.get(ni)
            if carry != old.carried.get(ni):
                kn = nodes[ni]
                fn = copies.get(carry.entry) if copies is not None and carry is not None else None
                self.carries.append((kn, None if fn is None else _Carrier(fn, carry)))  # type: ignore[arg-type]
        self.switches: list[tuple[Any, int, Any]] = []
        for on, which in ((1, old.disabled - new.disabled), (0, new.disabled - old.disabled)):
            for ni in sorted(which):
                kn = nodes[ni]
                if kn is None or kn.params is None:  # only kernel nodes are planned to be disabled
                    continue
                self.switches.append((kn.handle, on, kn))
        redirects = new.redirects
        self.pointers: list[tuple[Any, Any, Any, Any, int]] = []
        for key in (old.redirects.keys() | redirects.keys()) if old.redirects else redirects:
            ni, ai = key
            kn = nodes[ni]
            res = redirects.get(key)
            if res is None:  # what the plan says: its buffer (a growth moves it in place)
                a = kn.plan.args[ai]
                res = a.ref if a.kind == "buffer" else None
            if type(res) is int:
                self.pointers.append((kn.slots[ai], buffers[res], None, kn, ai))
            else:
                self.pointers.append((kn.slots[ai], None, res, kn, ai))
        readers = {id(p[3]) for p in self.pointers}
        kn = self.pointers[0][3] if len(readers) == 1 else None
        self.one = kn if type(kn) is KernelNode and kn.child is None and kn.body is None else None
        direct = self.one is not None and not self.carries and all(p[1] is not None for p in self.pointers)
        self.direct = [(p[0], p[1]) for p in self.pointers] if direct else None
        self.targets: dict[Any, list] = {}
        for (ni, ai), res in redirects.items():
            if not isinstance(res, int):
                self.targets.setdefault(res, []).append((nodes[ni], nodes[ni].slots[ai]))


class CompiledGraph(HandleOwner):
    """The instantiated CUDA graph of a GraphPlan, with its buffers and parameter slots.

    Use ``realize(plan, ...)`` to make one. Its engine closes it (``retire`` then ``close`` once idle,
    or ``abandon`` after a lost context); a graph nobody closed is destroyed by a quiet finalizer while
    its context lives (``cudapatch._lifecycle``). A closed graph raises ``CudapatchError`` from every
    public method; the frame path's (``launch``, Hot and Warm updates) check only when the driver
    refused, so a launch that works costs no check.

    Attributes:
        plan: The plan it runs (a Warm resize replaces it).
        buffers: Device buffers, by plan buffer index.
        counters: The readback block, if the plan has timestamps or append counters.
        readback: The ring the engine reads timings and append counts from.
        appends: ``(block_id, port)`` -> append buffer.
        occupancy: ``(block_id, kernel)`` -> occupancy (DeepAsync and up).
        timing: Host ms the build spent on buffers, nodes and instantiation.
        instantiations: How often a graph was instantiated for this object (1: patches never re-instantiate;
            0: it took over the previous graph's executable with ``cuGraphExecUpdate``).
        warm_refusal: Why ``warm.decide_warm_patch`` refused the last ``try_patch``'s plan (None when it
            accepted it, also if a re-capture then failed: ``try_patch`` returned None for that).
    """

    def __init__(
        self,
        plan: GraphPlan,
        parts: GraphParts,
        exec_: Any,
        *,
        timing: Mapping[str, float],
        phases: Phases | None = None,
        updated: bool = False,
        on_generalize: Callable[[], Any] | None = None,
    ) -> None:
        """Take over ``parts`` and the executable ``exec_`` built from them (``realize`` does this);
        with FrameDelays, ``phases`` holds ``exec_`` and its second-phase twin (``phases.py``);
        ``updated``: ``exec_`` is the previous graph's, updated with ``cuGraphExecUpdate``."""
        d = driver()
        self.plan = plan
        self._parts = parts
        self._device = parts.device
        self._calls = parts.calls
        self.buffers = parts.buffers
        self._owned = parts.owned
        self._borrowed = parts.borrowed
        # Taken out of ``parts`` (kept for the graph's life): it names the previous graph, which each
        # graph would otherwise keep alive, and so every graph replaced before it.
        self._handover, parts.handover = parts.handover, None
        #: Moved on after every change of the buffers' counts or of the buffers this graph owns, so
        #: that a ``Handover`` worked out before it is not used.
        self.buffer_epoch = 0
        self.counters = parts.counters
        self.readback = parts.readback
        self.appends = parts.appends
        self.occupancy = parts.occupancy
        self._counters_ptr = parts.counters_ptr
        self._nodes = parts.nodes
        self._exec = exec_
        self._phases = phases
        # patched beside ``_exec``; none where every delay is carried by a copy node (both phases are ``exec_``)
        self._exec1 = phases.execs[1] if phases is not None and phases.execs[1] is not exec_ else None
        self._calls.second = self._exec1
        self.timing = dict(timing)
        self.instantiations = 0 if updated else 1
        #: 1 when this graph runs in the previous graph's executable, updated with ``cuGraphExecUpdate``.
        self.exec_updates = 1 if updated else 0
        #: Buffers moved to a larger pool block by ``try_patch`` (growth without a new graph).
        self.reallocations = 0
        self.warm_refusal: WarmRefusal | None = None
        self._body_fallback = False  # region body nodes updated through cuGraphExecUpdate (``_commit``)
        #: Nodes put back from a specialised kernel to their generic one by a patch (``specialize``).
        self.generalized = 0
        #: Called when nodes run new generic code, or a specialisation came too late: a patch put a
        #: node's generic kernel back, a Code swap or Warm patch brought new code, ``specialize`` refused
        #: one whose values or code changed meanwhile (the engine's ``Specializer.arm``, passed in).
        self.on_generalize = on_generalize
        # Kernels a Code swap gave other code than the plan's: the source it was built from (None: not
        # said). ``kernel_source`` answers from here; a Warm patch that brings the build's code drops it.
        self._swapped: dict[tuple[int, int], Any] = {}
        self._closed = False
        self._stores_given = False  # its parameter storages are later graphs' (``give_back_stores``)
        self._retire_event: Any = None
        self._by_kernel: dict[tuple[int, int], list[KernelNode]] = {}
        self._specialized_keys: set[tuple[int, int]] = set()  # every kernel that ran specialised here
        for n in self._nodes:
            if isinstance(n, KernelNode):
                key = (n.plan.block_id, n.plan.kernel)
                self._by_kernel.setdefault(key, []).append(n)
                if n.generic is not None:  # (kept from the graph it replaces: ``specializations``)
                    self._specialized_keys.add(key)
        self._probe_nodes = {plan.probes[n.probe]: n for n in plan.nodes if isinstance(n, ProbeNodePlan)}
        # The targets of Hot/Warm updates, key -> [(node, slot)], resolved at a key's first update
        # (``_target``) and kept: no plan lookups per frame after that. Made here for every key, they
        # cost a build 3-4 ms at 1,000 blocks (a ctypes slot object each), on the build thread that
        # an edit waits for.
        self._scalar_targets: dict[tuple[int, str], list] = {}
        self._binding_targets: dict[tuple[int, str], list] = {}
        # The same targets where a key is one slot of one top-level kernel node and the graph has one
        # executable: what a slider or a rebind patches nearly always, written by ``_patch`` with no loop.
        self._scalar_one: dict[tuple[int, str], tuple[KernelNode, Any]] = {}
        self._binding_one: dict[tuple[int, str], tuple[KernelNode, Any]] = {}
        #: Whether the graph holds captured library calls: only those re-capture in a Hot or Warm update.
        self.has_calls = len(self._calls) > 0
        #: The bypass applied now (``set_bypass``), and the redirected slots that read a binding: a
        #: Warm rebind of that binding writes them too.
        self.bypass: BypassPlan = NO_BYPASS
        self._redirect_targets: dict[tuple[int, str], list] = {}
        self._bypass_steps: dict[tuple[int, int], _BypassStep] = {}  # by (id(from), id(to)): ``set_bypass``
        self._bypass_back: _BypassStep | None = None  # the step back from the last one ``set_bypass`` took
        # Bound once: the frame path is one call of each, no attribute lookups on the driver module; and
        # made with the GIL held, so that no other thread takes it from the frame (``held_calls``).
        self._launch, self._set_params, self._set_enabled, raw = frame_calls()
        # The same held calls on plain values (``RawCalls``), and the executable's value for them: what
        # a toggle and a slider call (None where the calls are not held; made None when the executable goes).
        # A test that replaces ``_set_params`` or ``_set_enabled`` on a built graph sets ``_raw`` too.
        self._raw = raw
        self._exec_i = int(exec_) if raw is not None else 0
        # The safety net of a graph nobody closed: its engine always closes (or abandons) the graphs it
        # makes, so it is quiet (cudapatch._lifecycle); it destroys the executables and the graph only in
        # a context that still lives, never in a reset one.
        graphs = Releases()
        graphs.push(d.cuGraphDestroy, parts.graph, what="cuGraphDestroy")
        graphs.push(d.cuGraphExecDestroy, exec_, what="cuGraphExecDestroy")
        if self._exec1 is not None:
            graphs.push(d.cuGraphExecDestroy, self._exec1, what="cuGraphExecDestroy")
        self._arm("CompiledGraph", releases=graphs, context=ContextRef.current(), warn=False)

    def _target(self, key: tuple[int, str], scalars: bool) -> list | None:
        """The ``(node, slot)`` targets of a scalar's (``scalars``) or binding's ``key`` in this graph,
        resolved from the plan and kept (None: the graph does not use it), and kept in the one-target
        table too where there is one target, a top-level kernel node's, and one executable."""
        slots = (self.plan.scalar_slots if scalars else self.plan.binding_slots).get(key)
        if slots is None:
            return None
        nodes = self._nodes
        tgt = [(nodes[ni], nodes[ni].slots[ai]) for ni, ai in slots]  # type: ignore[union-attr]
        if self._phases is not None:  # the second phase's storage gets every value too
            alts = [(nodes[ni], getattr(nodes[ni], "alt", None), ai) for ni, ai in slots]  # captured calls have none
            tgt += [(kn, alt.slots[ai]) for kn, alt, ai in alts if alt is not None]
        (self._scalar_targets if scalars else self._binding_targets)[key] = tgt
        if self._phases is None and len(tgt) == 1 and _top_level_kernel(tgt[0][0]):
            (self._scalar_one if scalars else self._binding_one)[key] = tgt[0]
        return tgt

    # -- handing over from the previous graph -------------------------------------------------------
    def lendable_buffers(self) -> dict[tuple[int, str], GpuBuffer]:
        """``(block_id, label)`` -> buffer: the allocations a rebuild may reuse, so pointers (and views
        users hold) stay stable across it. Nothing changes hands until the new graph's ``adopt``.
        A FrameDelay's pair is keyed by the delay (``phases.lending_keys``)."""
        if self.plan.delays:
            return dict(zip(lending_keys(self.plan), self.buffers, strict=True))
        return {(bp.block_id, bp.label): buf for bp, buf in zip(self.plan.buffers, self.buffers, strict=True)}

    def lendable_stores(self) -> dict[tuple[int, int], ParamStorage]:
        """``(block_id, kernel)`` -> parameter storage a rebuild may reuse (see ``params.StoreLoans``)."""
        return {(n.plan.block_id, n.plan.kernel): n.store for n in self._nodes if isinstance(n, KernelNode)}

    def adopt(self, previous: CompiledGraph | None) -> tuple[list[GpuBuffer], ...]:
        """Take ownership of the buffers borrowed from ``previous`` and set their element counts.
        Call once this graph replaces ``previous`` (before ``previous.retire``).

        Returns:
            The lists of buffers the two graphs owned before, replaced by others (empty when none
            was): a caller on the frame thread frees them later (a 10,000-buffer list takes a while).
        """
        self._check_open("CompiledGraph.adopt")
        # Only the borrowed buffers (listed by ``realize``, on the build thread): the ones allocated
        # for this graph have their counts and are owned already.
        borrowed, self._borrowed = self._borrowed, []
        handover, self._handover = self._handover, None
        replaced: tuple[list[GpuBuffer], ...] = ()
        if (
            handover is not None
            and previous is not None
            and handover.previous is previous
            and handover.epoch == previous.buffer_epoch
        ):  # worked out on the build thread: only the changed counts; the lists are its own, taken whole
            for buf, count in handover.counts:
                buf.count = count
            owned = handover.borrowed
            owned.extend(self._owned)  # (this graph's new buffers: the few an edit added)
            # Lists taken, not copied: a fused 10,000-block chain's swap frame extended one list with
            # the 10,000 borrowed buffers and rewrote the other (0.2 ms on the CPU machine).
            replaced = (self._own(owned), previous._own(handover.kept))
            previous.buffer_epoch += 1
        else:
            for buf, count in borrowed:
                buf.count = count
                self._owned.append(buf)
            if previous is not None and borrowed:
                previous.disown(buf for buf, _ in borrowed)
        if self._phases is not None:  # delays whose pair was handed over read the value written last
            self._phases.continue_from(previous._phases if previous is not None else None)
        return replaced

    def _own(self, buffers: list[GpuBuffer]) -> list[GpuBuffer]:
        # ``buffers`` is what this graph owns from now on, in its parts too (one list, which their
        # release and close clear); returns the list it owned before.
        old, self._owned = self._owned, buffers
        self._parts.owned = buffers
        return old

    def exec_update(self, graph: Any) -> tuple[Any, Any, list[Any]] | None:
        """Update this graph's executable with ``graph`` (``cuGraphExecUpdate``: same topology and
        insertion order, checked by ``warm.same_topology``) and hand the executable over: returns
        ``(executable, the graph it was instantiated from, that graph's node handles)`` for the new
        ``CompiledGraph``, which addresses nodes through those handles from now on (``GraphParts.take_over``).
        This graph keeps running nothing of its own afterwards: ``retire`` and ``close`` leave the
        executable alone. Frame thread only, between launches. Nodes a bypass turned off are turned
        on again (the new graph starts with none off).

        Returns:
            None when the driver refuses the update (it then changed nothing: instantiate instead).

        Raises:
            CudaError: another driver failure.
        """
        self._check_open("CompiledGraph.exec_update")
        d = driver()
        err, _info = d.cuGraphExecUpdate(self._exec, graph)
        if err == d.CUresult.CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE:
            return None
        check((err,), "cuGraphExecUpdate")
        exec_, self._exec = self._exec, None
        self._raw, self._exec_i = None, 0  # (the executable is the new graph's now)
        handles = self._parts.handles
        for ni in self.bypass.disabled:
            check(d.cuGraphNodeSetEnabled(exec_, handles[ni], 1), "cuGraphNodeSetEnabled")
        self.bypass = NO_BYPASS
        original, self._parts.graph = self._parts.graph, None
        self._finalizer.detach()
        return exec_, original, list(handles)

    def disown(self, buffers: Iterable[GpuBuffer]) -> None:
        """Stop owning ``buffers`` (a newer graph adopted them): ``retire`` and ``close`` leave them alone."""
        gone = {id(b) for b in buffers}
        self._owned[:] = [b for b in self._owned if id(b) not in gone]
        self.buffer_epoch += 1

    def owned_buffers(self) -> list[GpuBuffer]:
        """The buffers this graph gives back to the pool when it retires (a copy)."""
        return list(self._owned)

    # -- the frame path -------------------------------------------------------------------------
    @property
    def handle(self) -> Any:
        """The ``CUgraphExec`` (read-only)."""
        return self._exec

    def launch(self, stream: Any) -> None:
        """Launch the graph on ``stream``; returns without waiting.

        Raises:
            CudaLaunchError: a kernel of an earlier launch faulted (the context is lost).
            CudaError: the launch was rejected.
        """
        phases = self._phases
        if phases is None:
            (err,) = self._launch(self._exec, stream)
        else:  # FrameDelay feedback: this frame's phase; the same few operations at any number of delays
            err = phases.launch(self._launch, stream)
        if err:  # only here, off the path of a launch that worked: a closed graph says so, not the driver
            self._check_open("CompiledGraph.launch")
            check((err,), "cuGraphLaunch")

    # -- Hot / Warm updates -----------------------------------------------------------------------
    def _commit(self, touched: Iterable[Any]) -> None:
        set_params, exec_, exec1 = self._set_params, self._exec, self._exec1
        whole = False
        inside: list[KernelNode] = []
        for kn in touched:
            if kn.params is None:  # a captured call: re-capture if a host-side argument changed
                if kn.dirty:
                    self._calls.recapture(exec_, kn)
                continue
            if kn.child is not None:  # inside a composite's child graph: patched through it, below
                inside.append(kn)
                continue
            (err,) = set_params(exec_, kn.handle, kn.params if kn.carrier is None else kn.carrier.params(kn))
            if not err and exec1 is not None:  # the second phase of a graph with FrameDelays
                (err,) = set_params(exec1, kn.handle, kn.alt_params)
            if err:
                self._check_open("CompiledGraph.update")  # only on failure: a closed graph has no executable
                if kn.body is None:
                    check((err,), "cuGraphExecKernelNodeSetParams", kernel=kn.plan.entry_point)
                if not self._body_fallback:
                    self._start_body_fallback(err)
                whole = True
            if self._body_fallback:  # the graph it was instantiated from follows every update
                self._set_template(kn)
        if inside:
            commit_child_nodes(exec_, inside)
            if exec1 is not None:  # a child graph touches no delay pair (child_graphs): the same for both phases
                commit_child_nodes(exec1, inside)
        if whole:
            result = driver().cuGraphExecUpdate(exec_, self._parts.graph)  # same topology: no re-instantiation
            check(result[:1], "cuGraphExecUpdate")
            if exec1 is not None:  # the second phase too, then its own pointers again (the template is phase 0)
                check(driver().cuGraphExecUpdate(exec1, self._parts.graph)[:1], "cuGraphExecUpdate")
                for node in self._nodes:
                    if isinstance(node, KernelNode) and node.alt is not None:
                        check(set_params(exec1, node.handle, node.alt_params), "cuGraphExecKernelNodeSetParams")

    def _start_body_fallback(self, err: Any) -> None:
        """The driver would not patch a node inside a region's body in the executable by itself (the
        CUDA documentation does not say whether ``cuGraphExecKernelNodeSetParams`` takes one; where it
        does, this never runs). From now on every kernel node's parameters are also written into the
        graph the executable was instantiated from, and a body node's update applies that graph with
        one ``cuGraphExecUpdate``; first, every kernel node's current values go there, so the update
        reverts nothing patched before. (Re-captured library calls are not carried over: untested.)"""
        said = error_from_code(err).name  # (a held call returns a plain int: named as the driver names it)
        log.info("region body nodes are updated through cuGraphExecUpdate (the driver said %s)", said)
        self._body_fallback = True
        for kn in self._nodes:
            if isinstance(kn, KernelNode):
                self._set_template(kn)

    @staticmethod
    def _set_template(kn: KernelNode) -> None:
        check(
            driver().cuGraphKernelNodeSetParams(kn.handle, _params(kn)),
            "cuGraphKernelNodeSetParams",
            kernel=kn.plan.entry_point,
        )

    def _patch(
        self,
        targets: dict[tuple[int, str], list],
        ones: dict[tuple[int, str], tuple[KernelNode, Any]],
        changes: Mapping[tuple[int, str], Any],
        scalars: bool,
    ) -> int:
        # ``scalars``: the values are scalars, which a specialised kernel holds as constants (its node
        # goes back to the generic kernel); pointers it reads from its arguments as the generic one does.
        if len(changes) == 1 and not self._body_fallback:
            # One change of one top-level node (``ones``): one slot write and one driver call. This is
            # the Hot/Warm budget, so no helper calls, no list of touched nodes.
            for key, value in changes.items():
                one = ones.get(key)
                if one is None:
                    break
                kn, slot = one
                cls = type(value)
                if cls is BlockParameter:
                    value = value._value
                elif cls is ExternalBinding:
                    value = value.ptr
                if type(value) is tuple:
                    slot[:] = value
                else:
                    slot.value = value
                if scalars and kn.generic is not None:  # a specialised kernel ignores the value: generic again
                    self._generalize(kn)
                params = kn.params if kn.carrier is None else kn.carrier.params(kn)  # (carried: ``bypass.Carry``)
                raw = self._raw
                if raw is not None:  # (the held call on plain values: no wrapper, no conversions)
                    err = raw.set_params(self._exec_i, kn.hid, params.getPtr())
                else:
                    (err,) = self._set_params(self._exec, kn.handle, params)
                if err:
                    self._check_open("CompiledGraph.update")  # only on failure: a closed graph has no executable
                    check((err,), "cuGraphExecKernelNodeSetParams", kernel=kn.plan.entry_point)
                return 1
        self._check_open("CompiledGraph.update")  # (off the one-change path: a replaced graph writes nothing)
        touched: list[Any] = []
        for key, value in changes.items():
            tgt = targets.get(key)
            if tgt is None and targets is not self._redirect_targets:
                tgt = self._target(key, scalars)  # the key's first update in this graph
            if tgt is None:
                continue  # not in this graph (a skipped block, or a failed rebuild's new block)
            if isinstance(value, BlockParameter):
                value = value._value
            elif isinstance(value, ExternalBinding):
                value = value.ptr
            for kn, slot in tgt:
                write_slot(slot, value)
                if kn not in touched:
                    touched.append(kn)
                    if scalars and kn.generic is not None:  # a specialised kernel ignores the value: generic again
                        self._generalize(kn)
        self._commit(touched)
        return len(touched)

    def _generalize(self, kn: KernelNode) -> None:
        """Put the node's generic kernel back (it runs a specialised one); the caller patches the node."""
        kn.params.func = kn.alt_params.func = kn.generic
        kn.generic = kn.special = None
        self.generalized += 1
        if self.on_generalize is not None:
            self.on_generalize()

    def _build_code(self, kn: KernelNode, function: Any) -> None:
        """A Warm patch's ``function`` (the build's, from the node's new plan source) into both phases
        of ``kn``, in place of a swapped or specialised kernel; the caller patches the node and calls
        ``on_generalize``."""
        kn.params.func = kn.alt_params.func = function
        self._swapped.pop((kn.plan.block_id, kn.plan.kernel), None)
        if kn.generic is not None:
            kn.generic = kn.special = None
            self.generalized += 1

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
        if self._phases is not None:  # a FrameDelay's Reset arms its init node for the next launch
            self._phases.reset(changes)
        return self._patch(self._scalar_targets, self._scalar_one, changes, True)

    def update_bindings(self, changes: Mapping[tuple[int, str], Any]) -> int:
        """Warm update: point every kernel reading an external input at a new device address.

        Args:
            changes: ``(block_id, port)`` → new device pointer or ``ExternalBinding`` (same size and type as planned).

        Returns:
            The number of nodes patched.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        n = self._patch(self._binding_targets, self._binding_one, changes, False)
        if self._redirect_targets:  # readers of a bypassed output that read this binding instead
            n += self._patch(self._redirect_targets, _NO_SINGLE_TARGETS, changes, False)
        return n

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

    def update_grid(self, node_index: int, grid: int) -> None:
        """Warm update: change a kernel node's grid size.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
            CudapatchError: the node is not a kernel node.
        """
        self._check_open("CompiledGraph.update_grid")
        kn = self._kernel(node_index)
        kn.params.gridDimX = kn.alt_params.gridDimX = max(1, int(grid))
        self._commit((kn,))

    def trim_patch(self, decision: WarmPatch) -> WarmPatch:
        """``decision`` without the kernel nodes it would leave as they are: same plan node, no external
        pointer, no buffer that grows, same function. Runs on the build thread, so that the frame thread
        writes only what changes (every node of a 10,000-block patch took tens of milliseconds there). Node functions
        change on the frame thread only by Code swaps, which a build re-applies when it lands.
        """
        nodes = self._nodes
        grown = {bi for bi, _ in decision.grow}
        keep = []
        for kp in decision.kernels:
            kn = nodes[kp.index]
            if (
                kp.plan != kn.plan  # type: ignore[union-attr]
                or any(a.kind == "external" or (a.kind == "buffer" and a.ref in grown) for a in kp.plan.args)
                or (kp.function is not None and int(kp.function) != int(kn.params.func))  # type: ignore[union-attr]
            ):
                keep.append(kp)
        return WarmPatch(tuple(keep), decision.calls, decision.counts, decision.grow)

    def try_patch(
        self,
        plan: GraphPlan,
        bindings: dict[tuple[int, str], ExternalBinding],
        functions: Mapping[tuple[int, int], Any] | None = None,
        *,
        decided: WarmPatch | None = None,
    ) -> int | None:
        """Warm resize: adopt ``plan`` in place if ``warm.decide_warm_patch`` accepts it (it differs
        from the current one only in element counts, grids, external pointers, values and same-layout
        kernel functions; a buffer that outgrew its allocation is reallocated from the pool, with
        headroom, and its kernels are pointed at it). ``warm_refusal`` says why not.

        ``decided``: the decision already taken against this graph's current plan (on the build
        thread, see ``trim_patch``): it is applied without deciding again.

        Returns:
            The number of nodes patched, or None if the plan needs a Cold rebuild.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        self._check_open("CompiledGraph.try_patch")
        decision = (
            decided
            if decided is not None
            else decide_warm_patch(
                self.plan,
                plan,
                bindings,
                capacities=[b.capacity_bytes for b in self.buffers],
                stale=self._calls.stale_nodes(),
                functions=functions,
            )
        )
        if isinstance(decision, WarmRefusal):
            self.warm_refusal = decision
            log.debug("no Warm resize: %s", decision)
            return None
        self.warm_refusal = None
        # Captured calls first: a new size may need another algorithm (a topology change), which only a
        # Cold rebuild can apply, and then no kernel node has been written yet.
        nodes = self._nodes
        calls: list[tuple[CapturedCall, Any]] = [(nodes[c.index], c) for c in decision.calls]  # type: ignore[misc]
        recaptured = self._calls.patch(
            self._exec, calls, lambda a: arg_value(a, self.buffers, bindings, self._counters_ptr)
        )
        if recaptured is None:
            return None
        # Buffers that outgrew their allocation move to a larger pool block; only kernel nodes hold
        # their address (the decision refuses otherwise), and those are written below.
        grown = set()
        for bi, nbytes in decision.grow:
            self.buffers[bi].reallocate(nbytes)
            grown.add(bi)
        self.reallocations += len(grown)
        buffers = self.buffers
        # Everything fits: write the new values (scalars too: Hot edits pending with this one land here).
        touched = []
        new_code = False
        for kp in decision.kernels:
            kn: KernelNode = nodes[kp.index]  # type: ignore[assignment]
            changed = False
            slots = kn.slots
            alt = kn.alt.slots if kn.alt is not None else None  # the second phase's storage (FrameDelays)
            for ai, value in kp.writes:
                if read_slot(slots[ai]) != value:
                    write_slot(slots[ai], value)
                    if alt is not None:
                        write_slot(alt[ai], value)
                    changed = True
            if grown:
                for ai, a in enumerate(kp.plan.args):
                    if a.kind == "buffer" and a.ref in grown:
                        write_slot(slots[ai], buffers[a.ref].ptr)  # type: ignore[index]
                        changed = True
            if kn.params.gridDimX != kp.plan.grid:
                kn.params.gridDimX = kn.alt_params.gridDimX = kp.plan.grid
                changed = True
            gy, gz = kp.plan.yz[0], kp.plan.yz[1]
            if kn.params.gridDimY != gy or kn.params.gridDimZ != gz:  # a 2-D/3-D image resized (Warm)
                kn.params.gridDimY, kn.params.gridDimZ = gy, gz
                changed = True
            if _new_code(kn, kp.function) is not None:
                self._build_code(kn, kp.function)  # a kernel recompiled meanwhile
                changed = new_code = True
            elif changed and kn.generic is not None and not _keeps_special(kn):  # new scalar values: generic
                self._generalize(kn)
            kn.plan = kp.plan
            if changed:
                touched.append(kn)
        for buf, count in zip(self.buffers, decision.counts, strict=True):
            buf.count = count
        self.buffer_epoch += 1
        self._commit(touched)
        self.plan = plan
        if new_code and self.on_generalize is not None:
            self.on_generalize()
        return len(touched) + recaptured

    def prepare_patch(
        self, decision: WarmPatch, bindings: Mapping[tuple[int, str], ExternalBinding]
    ) -> PreparedPatch | None:
        """Make ``decision`` (decided against this graph's current plan, trimmed by ``trim_patch``)
        ready to apply, on the build thread: take the pool blocks of the buffers that grow and pack
        every changed node's arguments as the new plan has them. ``apply_prepared`` then only copies
        bytes and calls the driver on the frame thread (a 2x growth of a 1,000-node chain: every node
        changes; making each node's values there was most of a 10 ms frame).

        Returns:
            None where only ``try_patch`` can apply it: captured calls, FrameDelay phases, nodes in
            child graphs or region bodies, region handles among the arguments (or no memory for a
            grown buffer: ``try_patch`` reports that).
        """
        self._check_open("CompiledGraph.prepare_patch")
        if decision.calls or self._phases is not None or self._exec1 is not None:
            return None
        nodes, buffers, counters_ptr = self._nodes, self.buffers, self._counters_ptr
        for kp in decision.kernels:
            kn = nodes[kp.index]
            if not _top_level_kernel(kn) or kn.alt is not None:
                return None
        allocs: list[tuple[GpuBuffer, Any]] = []
        try:
            for bi, nbytes in decision.grow:
                allocs.append((buffers[bi], buffers[bi].reserve(nbytes)))
        except CudapatchError:  # out of memory (or closed): the frame thread's try_patch says which
            for buf, alloc in allocs:
                buf.unreserve(alloc)
            return None
        prepared = PreparedPatch(self.plan, decision, allocs)
        ptrs = [buf.ptr for buf in buffers]
        for (bi, _), (_, alloc) in zip(decision.grow, allocs, strict=True):
            ptrs[bi] = alloc.ptr
        writes = prepared.writes
        for kp in decision.kernels:
            values = []
            for a in kp.plan.args:
                kind = a.kind
                if kind == "buffer":
                    values.append(ptrs[a.ref])  # type: ignore[index]
                elif kind == "scalar" or kind == "const":
                    values.append(a.value)
                elif kind == "handle":
                    prepared.discard()
                    return None
                else:
                    values.append(arg_value(a, buffers, bindings, counters_ptr))
            kn, raw = nodes[kp.index], pack_arguments(kp.plan, values)
            p, node = kn.params, kp.plan  # type: ignore[union-attr]
            grid = (node.grid, node.yz[0], node.yz[1])
            function = _new_code(kn, kp.function)
            storage = kn.store.storage  # type: ignore[union-attr]
            if raw != bytes(storage) or (p.gridDimX, p.gridDimY, p.gridDimZ) != grid or function is not None:
                # A view of the storage made here: the frame thread only copies (a memoryview slice
                # assignment is a memcpy; ``ctypes.memmove`` is a foreign call, ~1 µs a node on the CPU).
                writes.append((kn, memoryview(storage).cast("B"), raw, grid, function, node))  # type: ignore[arg-type]
            else:  # nothing to write (``trim_patch`` keeps every node reading a binding)
                prepared.same.append((kn, node))  # type: ignore[arg-type]
        return prepared

    def apply_prepared(self, prepared: PreparedPatch, plan: GraphPlan) -> int | None:
        """Apply a ``prepare_patch`` result (frame thread, between launches): move the grown buffers
        to their new blocks, copy each changed node's packed arguments into its storage, set its
        grid and function, point bypassed outputs' readers at their inputs again, and give the
        driver each changed node. Hot values, rebinds and Code swaps made since the build's snapshot
        are the caller's to re-apply (``ParamTier.end_carry``), as after any build.

        Returns:
            The number of nodes patched, or None (nothing changed) when the graph was patched since
            the decision was taken: ``try_patch`` decides again.

        Raises:
            CudaError: cuGraphExecKernelNodeSetParams failed.
        """
        if self._closed:  # (the reserved blocks go back to the pool first)
            prepared.discard()
        self._check_open("CompiledGraph.apply_prepared")
        if prepared.base is not self.plan:
            prepared.discard()
            return None
        self.warm_refusal = None
        allocs, prepared.allocs = prepared.allocs, []
        for i, (buf, alloc) in enumerate(allocs):
            try:
                buf.move_to(alloc)
            except BaseException:  # (a closed buffer) the blocks not moved to go back to the pool
                prepared.allocs = allocs[i:]
                prepared.discard()
                raise
        self.reallocations += len(allocs)
        for kn, node in prepared.same:
            kn.plan = node
        touched = []
        new_code = False
        # Every node of a long chain changes in a 2x growth: this loop is all the frame thread does per
        # node (each touches a handful of objects scattered over the heap), and each node goes to the
        # driver as it is written, unless a bypass redirects readers (they are written below first).
        # Every node here is a top-level kernel node of a graph without a second phase (``prepare_patch``).
        redirects = self.bypass.redirects
        direct = not redirects and not self._body_fallback and not self.bypass.carried  # (carried: ``_commit``)
        set_params, exec_ = self._set_params, self._exec
        for kn, view, raw, grid, function, node in prepared.writes:
            view[:] = raw
            params = kn.params
            params.gridDimX, params.gridDimY, params.gridDimZ = grid
            if function is not None:
                self._build_code(kn, function)  # a kernel recompiled meanwhile (or a specialised one ran)
                new_code = True
            elif kn.generic is not None and not _keeps_special(kn):  # new scalar values: the generic one
                self._generalize(kn)
            kn.plan = node
            if direct:
                (err,) = set_params(exec_, kn.handle, params)
                if err:
                    check((err,), "cuGraphExecKernelNodeSetParams", kernel=node.entry_point)
            else:
                touched.append(kn)
        sent = len(prepared.writes) if direct else 0  # (given to the driver in the loop)
        if redirects:
            # The packed values are the plan's: a bypassed output's readers read its input again (also
            # readers the patch left alone, where the input they are redirected to moved).
            buffers, nodes, patched = self.buffers, self._nodes, {id(kn) for kn in touched}
            for (ni, ai), res in redirects.items():
                ptr = buffers[res].ptr if isinstance(res, int) else self._binding_ptr(res)
                kn = nodes[ni]
                slot = kn.slots[ai]  # type: ignore[union-attr]
                if id(kn) in patched or slot.value != ptr:
                    slot.value = ptr
                    if id(kn) not in patched:
                        patched.add(id(kn))
                        touched.append(kn)
        for buf, count in zip(self.buffers, prepared.decision.counts, strict=True):
            buf.count = count
        self.buffer_epoch += 1
        self._commit(touched)
        self.plan = plan
        if new_code and self.on_generalize is not None:
            self.on_generalize()
        return sent + len(touched)

    def set_bypass(self, bp: BypassPlan, copies: Mapping[str, Any] | None = None) -> int:
        """Bypass: make ``bp`` (from ``bypass.plan_bypass`` of this graph's plan) the graph's bypass.
        Nodes leaving it are enabled and their readers read what the plan says again; nodes joining
        it are disabled (``cuGraphNodeSetEnabled``: kernel nodes only) and the readers it redirects
        read the input instead; the nodes it carries run the copy kernel ``copies`` holds for their
        ``Carry`` (entry point -> loaded function; without one a node runs its own kernel).
        Visible from the next launch; nothing is re-instantiated.

        Returns:
            The number of nodes enabled, disabled or patched.

        Raises:
            CudaError: a driver call failed.
        """
        if self._closed or self._stores_given:  # (two attribute tests: a toggle is a frame's edit)
            self._check_open("CompiledGraph.set_bypass")
        old = self.bypass
        if bp is old:
            return 0
        step = self._bypass_back  # a toggle goes back where the last step came from
        if step is None or step.new is not bp or step.old is not old:
            step = self._bypass_steps.get((id(old), id(bp)))
            if step is None or step.old is not old or step.new is not bp:  # once per pair
                if len(self._bypass_steps) >= 16:
                    self._bypass_steps.clear()
                step = self._bypass_steps[(id(old), id(bp))] = _BypassStep(self, old, bp, copies)
        exec_, raw = self._exec, self._raw  # (``raw``: the held calls on plain values, else None)
        switches = step.switches
        for handle, on, kn in switches:
            if raw is not None:
                err = raw.set_enabled(self._exec_i, kn.hid, on)
            else:
                (err,) = self._set_enabled(exec_, handle, on)
            if err:
                check((err,), "cuGraphNodeSetEnabled", kernel=kn.plan.entry_point)
        direct = step.direct
        if direct is not None and self._exec1 is None and not self._body_fallback:
            # A toggle's usual step: write every pointer (the buffers' pointers now: a Warm growth may
            # have moved them) and send the one node without comparing or collecting (``_BypassStep.direct``).
            for slot, buf in direct:
                slot.value = buf._alloc.ptr
            kn = step.one
            params = kn.params if kn.carrier is None else kn.carrier.params(kn)
            if raw is not None:
                err = raw.set_params(self._exec_i, kn.hid, params.getPtr())
            else:
                (err,) = self._set_params(exec_, kn.handle, params)
            if err:
                check((err,), "cuGraphExecKernelNodeSetParams", kernel=kn.plan.entry_point)
            sent = 1
        else:
            touched: list[Any] = []
            for kn, carrier in step.carries:  # (written with the pointers below: one driver call a node)
                kn.carrier = carrier
                touched.append(kn)
            for slot, buf, res, kn, ai in step.pointers:
                if buf is not None:
                    ptr = buf._alloc.ptr  # (``GpuBuffer.ptr``, without the property)
                elif res is None:  # no longer redirected, and its plan argument is no buffer: what the plan says
                    ptr = arg_value(kn.plan.args[ai], self.buffers, {}, self._counters_ptr)
                else:
                    ptr = self._binding_ptr(res)
                if slot.value != ptr:  # pointer slots are scalars
                    slot.value = ptr
                    if kn not in touched:  # each node's storage goes to the driver once
                        touched.append(kn)
            if touched:
                kn = step.one
                if kn is not None and len(touched) == 1 and self._exec1 is None and not self._body_fallback:
                    (err,) = self._set_params(exec_, kn.handle, _params(kn))  # one driver call, as ``_commit``
                    if err:
                        check((err,), "cuGraphExecKernelNodeSetParams", kernel=kn.plan.entry_point)
                else:
                    self._commit(touched)
            sent = len(touched)
        # ``bp`` is the graph's bypass now, and a toggle back finds its step here.
        self._redirect_targets = step.targets
        self.bypass = bp
        self._bypass_back = step.back or self._step_back(step, bp, old, copies)
        return len(switches) + sent

    def _step_back(
        self, step: _BypassStep, bp: BypassPlan, old: BypassPlan, copies: Mapping[str, Any] | None
    ) -> _BypassStep:
        # The step from ``bp`` back to ``old``, made once (a toggle then finds it on ``step``).
        back = step.back = self._bypass_steps[(id(bp), id(old))] = _BypassStep(self, bp, old, copies)
        back.back = step  # (a cycle of two small objects: the collector frees it with the graph)
        return back

    def _binding_ptr(self, key: Any) -> int:
        # The binding's pointer as the graph holds it now: the slot of a node reading it (a Warm
        # rebind writes them all).
        tgt = self._binding_targets.get(key) or self._target(key, False)
        assert tgt is not None, key
        kn, slot = tgt[0]
        return int(read_slot(slot))

    def swap_function(self, key: tuple[int, int], function: Any, descriptor: Any, source: Any = None) -> bool:
        """Code tier: put a recompiled ``function`` into every node of kernel ``key`` (block id, kernel
        index), in place, if its parameter layout is the one the nodes were built with. ``source``: the
        ``KernelSource`` it was built from (``kernel_source``; without it the kernel is not specialised
        until the graph's next build brings it code of its own).

        Returns:
            False (and changes nothing) if the kernel is not in this graph or its layout differs.

        Raises:
            CudaError: the driver refused the new function.
        """
        self._check_open("CompiledGraph.swap_function")
        nodes = self._by_kernel.get(key)
        if not nodes or any(n.plan.descriptor != descriptor for n in nodes):
            return False
        for n in nodes:
            n.params.func = n.alt_params.func = function
            n.generic = n.special = None  # the new code is the generic kernel now
        self._swapped[key] = source
        self._commit(nodes)
        if self.on_generalize is not None:  # new code: specialised on its values once they rest
            self.on_generalize()
        return True

    def specialize(
        self, key: tuple[int, int], function: Any, constants: Sequence[tuple[int, int]], generic: Any
    ) -> bool:
        """Run ``function``, kernel ``key``'s ``generic`` source compiled with ``constants`` (``(argument
        index, float32 bits)``) in place of those arguments, in every node of that kernel, if the nodes
        run ``generic``'s code (``kernel_source``) and their arguments hold exactly those values now.
        The node's next Hot (or Warm) patch of a scalar puts its generic kernel back (``on_generalize``
        is then called, on the thread patching).

        Returns:
            False (and changes nothing) where the kernel is not in this graph, or its code or a value
            changed since ``constants`` were read (``on_generalize`` is then called: it is looked at
            again).

        Raises:
            CudaError: the driver refused the new function.
        """
        self._check_open("CompiledGraph.specialize")
        nodes = self._by_kernel.get(key)
        if not nodes:
            return False
        if self.kernel_source(key) is not generic or not all(map(_holds(constants), nodes)):
            if self.on_generalize is not None:
                self.on_generalize()
            return False
        for n in nodes:
            if n.generic is None:  # a copy: the struct's getter returns a view of the field set below
                func = n.params.func
                n.generic = type(func)(int(func))
            n.params.func = n.alt_params.func = function
            n.special = constants
        self._commit(nodes)
        self._specialized_keys.add(key)
        return True

    def specializations(self) -> dict[tuple[int, int], KeptSpecialization]:
        """The specialised kernels this graph runs now (``specialize``), for the graph a structure edit
        builds to keep (``realize``: its nodes that run the same generic source and hold the same
        values start with them): an edit elsewhere in a fused patch leaves most groups as they were,
        and the specialiser would otherwise build each again and swap it in between frames, a Code
        swap a group in the frames after the edit (about 20 at 10,000 blocks).

        Any thread, before the build loads its values (a build on the frame thread borrows this
        graph's storages: ``StoreLoans``). The frame thread may put a generic kernel back meanwhile,
        in the order ``_generalize`` writes, read here the other way round: such a group is left out,
        or handed on with the values it was made with. A new graph keeps it only where its storage
        holds those; where a Hot edit changed them after the build's snapshot, that edit reaches the
        new graph at the swap (``ParamTier.end_carry``) and puts its generic kernel back before its
        first launch."""
        kept: dict[tuple[int, int], KeptSpecialization] = {}
        for key in tuple(self._specialized_keys):  # (a copy made in one C call: the frame thread adds)
            n0 = self._by_kernel[key][0]
            generic, special = n0.generic, n0.special
            if generic is None or special is None:
                continue
            source = self.kernel_source(key)
            func = n0.params.func
            function = type(func)(int(func))  # (a copy: the node's field may be written meanwhile)
            if source is not None and int(function) != int(generic):
                kept[key] = KeptSpecialization(function, special, source, _store_holds(special))
        return kept

    def kernel_source(self, key: tuple[int, int]) -> Any:
        """The ``KernelSource`` of the generic code kernel ``key``'s nodes run now: their plan's, or
        the one a Code swap brought (None: not in this graph, or a swap that did not say)."""
        swapped = self._swapped.get(key, _PLAN)  # (one lookup: the specializer's thread asks too)
        if swapped is not _PLAN:
            return swapped
        nodes = self._by_kernel.get(key)
        return nodes[0].plan.source if nodes else None

    def specialized(self, key: tuple[int, int]) -> bool:
        """Whether kernel ``key``'s nodes run a specialised kernel now (``specialize``)."""
        nodes = self._by_kernel.get(key)
        return bool(nodes) and nodes[0].generic is not None

    def argument_bits(self, key: tuple[int, int], indices: Sequence[int]) -> ArgumentBits | None:
        """``(argument index, the 32 bits it holds now)`` for ``indices`` of kernel ``key``'s first node
        (None: not in this graph). Plain loads of the parameter storage: any thread may ask; a Hot
        patch meanwhile makes the answer stale, which ``specialize`` sees."""
        nodes = self._by_kernel.get(key)
        return self._argument_bits(nodes[0], indices) if nodes else None

    @staticmethod
    def _argument_bits(kn: KernelNode, indices: Sequence[int]) -> ArgumentBits:
        indices, desc = tuple(indices), kn.store.descriptor
        read = _bits_reader(desc, indices)
        return ArgumentBits(indices, read(kn.store.storage), desc, read)

    def runs_function(self, key: tuple[int, int], function: Any) -> bool:
        """Whether every node of kernel ``key`` (block id, kernel index) runs ``function`` (False where
        the kernel is not in this graph)."""
        nodes = self._by_kernel.get(key)
        return bool(nodes) and all(int(n.params.func) == int(function) for n in nodes)  # (handles compared)

    def _kernel(self, node_index: int) -> KernelNode:
        kn = self._nodes[node_index] if 0 <= node_index < len(self._nodes) else None
        if not isinstance(kn, KernelNode):
            raise CudapatchError(f"node {node_index} is not a kernel node")
        return kn

    # -- the Recapture tier's state ---------------------------------------------------------------
    @property
    def recaptures(self) -> int:
        """Re-captures done by Hot/Warm updates and in-place resizes (the Recapture tier)."""
        return self._calls.recaptures

    @property
    def call_errors(self) -> dict[int, LibraryCallError]:
        """Block id -> the error of its last failed re-capture (the previous capture keeps running)."""
        return self._calls.errors

    @property
    def stale(self) -> bool:
        """True when a re-capture changed a call's graph topology: only a Cold rebuild can apply it.
        The engine clears it once it has scheduled that rebuild."""
        return self._calls.stale

    @stale.setter
    def stale(self, value: bool) -> None:
        self._calls.stale = value

    # -- access ---------------------------------------------------------------------------------
    def output(self, block_id: int, port: str) -> GpuBuffer | None:
        """The buffer of output ``port`` of ``block_id``, or None if not in this graph, or if its value
        is in a buffer a later value of the frame overwrites (``overwritten``). A value that shares
        its buffer but is the last one in it comes as a typed view of that buffer."""
        self._check_open("CompiledGraph.output")
        res = self.bypass.outputs.get((block_id, port))
        if isinstance(res, int):  # a bypassed output: what its readers read
            return self.buffers[res]
        key = (block_id, port)
        bi = self.plan.outputs.get(key)
        if bi is None:
            return None
        mem = self.plan.memory
        if mem is not None and mem.shared(bi):  # a FrameDelay's buffers are never shared
            vi = mem.ports.get(key)
            if vi is None or mem.overwritten(vi):
                return None
            v = mem.values[vi]
            return self.buffers[bi].view(v.dtype, v.count)
        if self._phases is not None:  # a FrameDelay's pair: the buffer of the frame launched last
            bi = self._phases.physical(bi)
        return self.buffers[bi]

    def overwritten(self, block_id: int, port: str) -> bool:
        """Whether output ``port`` of ``block_id`` shares its buffer with a value written after it in
        the frame (buffer reuse): then its data is gone by the end of the frame."""
        mem = self.plan.memory
        vi = mem.ports.get((block_id, port)) if mem is not None else None
        return vi is not None and mem.overwritten(vi)  # type: ignore[union-attr]

    def probe_stats(self, key: tuple[int, str]) -> ProbeStats | None:
        """The newest published statistics of the probe on ``(block_id, port)`` (plain loads from the
        readback ring, no driver call), or None: not probed in this graph, or no frame completed yet."""
        n = self._probe_nodes.get(key)
        rb = self.readback
        if n is None or rb is None or self._closed:
            return None
        if not rb.frozen:
            rb.poll()
        frame = rb.latest_frame
        if frame is None:
            return None
        words = rb.latest_probes[n.offset : n.offset + record_words(n.thumb_w, n.thumb_h)]
        return decode_probe(words, frame=frame, age=rb.current_frame - frame + 1, thumb=(n.thumb_w, n.thumb_h))

    def node_arg(self, node_index: int, arg: int) -> Any:
        """Current value in a node's parameter slot (for tests and debugging)."""
        self._check_open("CompiledGraph.node_arg")
        return read_slot(self._kernel(node_index).slots[arg])

    @property
    def kernel_count(self) -> int:
        """Kernel and captured-call nodes (timestamp and memset nodes not counted)."""
        return sum(1 for n in self._nodes if n is not None)

    @property
    def captured_count(self) -> int:
        """Captured library-call (child-graph) nodes."""
        return len(self._calls)

    def captured_graph(self, block_id: int, kernel: int = 0) -> Any:
        """The ``CUgraph`` a captured call was last captured into (tests check it was not replaced), or None."""
        self._check_open("CompiledGraph.captured_graph")
        return self._calls.child_graph(block_id, kernel)

    # -- fault attribution ----------------------------------------------------------------------
    def replay(self, stream: Any) -> int | None:
        """Launch the plan node by node, synchronizing after each block's kernels: the id of the
        first block whose kernels fault, or None. Used after a sticky fault, on a fresh context,
        and every frame with ``debug_launch``.

        With FrameDelays, the frame's phase is replayed (phase 1: the nodes' second storages and the
        pairs swapped for memsets), init nodes only where armed, and the phase flips as a launch does.

        Raises:
            CudaError: a failure that is not a kernel fault.
        """
        self._check_open("CompiledGraph.replay")
        ph = self._phases
        if ph is None:
            return replay_by_block(self.plan, self._nodes, self.buffers, self._counters_ptr, stream)
        nodes, buffers = phase_nodes(self.plan, self._nodes, self.buffers, ph)
        culprit = replay_by_block(self.plan, nodes, buffers, self._counters_ptr, stream)
        ph.pending = set()
        ph.phase ^= 1
        return culprit

    def abandon(self) -> None:
        """Forget every driver object without destroying it: the context was reset under them."""
        self._closed = True
        self._finalizer.detach()
        self._parts.abandon()
        self._exec = self._exec1 = self._retire_event = self._raw = None
        self._exec_i = 0

    # -- teardown -------------------------------------------------------------------------------
    def retire(self, stream: Any) -> None:
        """Give the buffers this graph still owns back to the pool now (reuse is stream-ordered, so
        safe) and mark when its in-flight work ends; ``close`` later, once ``is_idle``.

        Raises:
            CudaError: event creation or record failed.
        """
        self._check_open("CompiledGraph.retire")
        d = driver()
        for b in self._owned:
            b.close()
        self._owned.clear()
        self.buffer_epoch += 1  # a hand-over worked out before this would put closed buffers back
        self._retire_event = check(d.cuEventCreate(d.CUevent_flags.CU_EVENT_DISABLE_TIMING.value), "cuEventCreate")
        check(d.cuEventRecord(self._retire_event, stream), "cuEventRecord")

    def give_back_stores(self) -> None:
        """Hand this graph's parameter storages to the next builds before ``close`` (``params.give_back``):
        it is retired and idle, so nothing patches or launches its nodes again, and the driver copied
        their bytes when it added them."""
        if self._retire_event is None:
            raise CudapatchError("CompiledGraph.give_back_stores: the graph still runs (retire it first)")
        self._stores_given = True  # from now on every patch or read of a node refuses (``_check_open``)
        for found in (self._scalar_one, self._binding_one, self._scalar_targets, self._binding_targets):
            found.clear()  # (a one-change patch looks here first, then takes the checked path)
        self._parts.give_back_stores()

    def _check_open(self, what: str) -> None:
        if self._stores_given:
            raise CudapatchError(f"{what}: this graph was replaced, and its parameter storages are a newer graph's")
        super()._check_open(what)

    def stock_spares(
        self, stop: Callable[[], bool] | None = None, give_up: Callable[[], bool] | None = None
    ) -> Callable[[], Any] | None:
        """Make spare parameter storages for the next builds, one per kernel node of this graph, less
        the spares there are (``params.stock_spares``; ``stop``, ``give_up`` and the rest as there)."""
        return stock_spares((n.store for n in self._nodes if type(n) is KernelNode), stop, give_up)

    def is_idle(self) -> bool:
        """True when nothing this graph launched is still running (after ``retire``)."""
        if self._retire_event is None:
            return False
        d = driver()
        (err,) = d.cuEventQuery(self._retire_event)
        return err != d.CUresult.CUDA_ERROR_NOT_READY

    def close(self) -> None:
        """Destroy the executable graph and free its resources; idempotent. Waits for this graph's
        in-flight readback copies, so call it after ``is_idle`` on the frame thread.

        Raises:
            CudaError: a driver call failed.
        """
        if self._closed:
            return
        self._closed = True
        self._handover = None  # (a graph never adopted: it names the previous graph)
        self._device.make_current()
        self._finalizer.detach()
        d = driver()
        if self._exec1 is not None:
            exec1, self._exec1 = self._exec1, None
            check(d.cuGraphExecDestroy(exec1), "cuGraphExecDestroy")
        if self._exec is not None:
            exec_, self._exec = self._exec, None
            self._raw, self._exec_i = None, 0  # (a destroyed one's value is no NULL: the calls on handles say it)
            check(d.cuGraphExecDestroy(exec_), "cuGraphExecDestroy")
        self._parts.release()
        if self._retire_event is not None:
            event, self._retire_event = self._retire_event, None
            check(d.cuEventDestroy(event), "cuEventDestroy")

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __enter__(self) -> CompiledGraph:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<CompiledGraph nodes={len(self.plan.nodes)} kernels={self.kernel_count} closed={self._closed}>"
