"""The Warm-resize decision: can a new plan be patched into the graph running the old one?

A structure edit that only changes sizes (a bound array grew, a count parameter changed) produces a
plan with the same nodes, edges, kernels and buffers as the running one, differing in element
counts, grids, external pointers and scalar values. Such a plan is applied to the running
executable graph with ``cuGraphExecKernelNodeSetParams`` per changed node (≤ 3 µs each) instead of
realizing and instantiating a new graph (milliseconds at 100 blocks); captured library calls whose
arguments changed are re-captured in place.

Whether that is possible is a pure comparison of the two plans, the input bindings and what the
running graph allocated, so it lives here, apart from the driver objects, where unit tests cover
every answer. ``decide_warm_patch`` returns either a ``WarmPatch`` (what to write where) or a
``WarmRefusal`` (why only a Cold rebuild can apply the plan).

A buffer that outgrew its allocation does not make the edit Cold: the patch lists it in ``grow``
with the bytes to take from the pool (``grown_bytes``: half as much again, so a buffer growing step
by step is not reallocated at every step), and every kernel reading or writing it gets its new
address in the same patch. Only where a captured library call or a memset node holds its address
(they would need a re-capture or other node parameters) does growth still refuse. Applying a patch may still fail at
run time (a re-capture picks another algorithm: a topology change); that is the executable graph's
part.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, NamedTuple

from .plan import CapturedNodePlan, GraphPlan, KernelNodePlan

if TYPE_CHECKING:
    from .context import ExternalBinding

__all__ = ["KernelPatch", "Refusal", "WarmPatch", "WarmRefusal", "decide_warm_patch", "grown_bytes", "same_topology"]


def same_topology(old: GraphPlan, new: GraphPlan) -> bool:
    """Whether a graph realized from ``new`` has the topology of one realized from ``old``: the same
    node kinds in the same insertion order with the same edges, the condition under which
    ``cuGraphExecUpdate`` may take the new graph into the executable of the old one (the driver
    decides the rest: a kernel node's function may change within its context, a child graph must
    keep its own topology). Tried before instantiating a Cold build made on the frame thread:
    0.06 / 0.56 / 5.7 ms against 0.59 / 6.4 / 91 ms for chains of 100 / 1,000 / 10,000 kernel nodes
    (H100, DESIGN.md §9)."""
    if len(old.nodes) != len(new.nodes) or old.level is not new.level:
        return False
    if old.scopes or new.scopes or old.children or new.children or old.delays or new.delays:
        # Nodes in conditional bodies and composites' child graphs are patched through the graph the
        # executable was instantiated from (a whole-graph update from it): that graph must stay its own.
        # FrameDelays run two executables of one graph, both made at the build.
        return False
    return all(type(a) is type(b) and a.deps == b.deps for a, b in zip(old.nodes, new.nodes, strict=True))


def grown_bytes(need: int) -> int:
    """Bytes to allocate for a buffer that must grow to ``need`` bytes: 1.5 times as much (the pool
    rounds it up to its size class), so growing again soon finds room."""
    return need + need // 2


class Refusal(StrEnum):
    """Why a new plan cannot be patched into the running graph (each needs a Cold rebuild)."""

    PROFILING_LEVEL = "profiling-level"  #: the profiling level changed (other stamp and publish nodes)
    NODE_COUNT = "node-count"  #: nodes were added or removed
    BUFFER_COUNT = "buffer-count"  #: buffers were added or removed
    COUNTERS = "counters"  #: the append counters differ
    SCALAR_SLOTS = "scalar-slots"  #: Hot-update targets moved (another parameter layout)
    BINDING_SLOTS = "binding-slots"  #: Warm-rebind targets moved
    BUFFER_LAYOUT = "buffer-layout"  #: a buffer belongs to another block or port, has another type or append role
    BUFFER_CAPACITY = (
        "buffer-capacity"  #: a buffer outgrew its allocation, and a captured call or memset holds its address
    )
    SHARING = "sharing"  #: values share buffers differently (buffer reuse decided otherwise)
    NODE_KIND = "node-kind"  #: a node became another kind of node
    CAPTURED_CALL = "captured-call"  #: a captured call's identity, edges or argument sources changed
    STALE_CAPTURE = "stale-capture"  #: the running capture of a call needs a new graph already
    KERNEL_NODE = "kernel-node"  #: a kernel's identity, edges, block size, shared memory or argument sources changed
    FIXED_NODE = "fixed-node"  #: a memset, timestamp or publish node changed
    UNBOUND = "unbound-input"  #: an external argument has no binding
    CHILD_GRAPHS = "child-graphs"  #: nodes moved into or out of a composite's child-graph node
    REGIONS = "regions"  #: a node moved into or out of a region's body (another graph holds it)
    DELAYS = "delays"  #: the FrameDelays or the sizes of their buffers changed (their state starts again)


@dataclass(frozen=True)
class WarmRefusal:
    """The answer when the new plan needs a Cold rebuild.

    Attributes:
        reason: Which rule refused it.
        index: The node (or, for buffer rules, buffer) index the rule tripped on; None for plan-wide rules.
        detail: A readable sentence, for logs.
    """

    reason: Refusal
    index: int | None
    detail: str

    def __str__(self) -> str:
        return f"{self.reason.value}: {self.detail}"


class KernelPatch(NamedTuple):
    """What the Warm patch may write into one kernel node.

    Attributes:
        index: The node's index (the same in both plans).
        plan: Its node in the new plan.
        writes: ``(argument index, value)`` for every constant, scalar and external-pointer argument
            (the executable graph writes those that differ from its slots: Hot edits since the old
            plan live only in the slots).
        function: The ``CUfunction`` to run (a kernel recompiled meanwhile), or None to keep the node's.
    """

    index: int
    plan: KernelNodePlan
    writes: tuple[tuple[int, Any], ...]
    function: Any = None


@dataclass(frozen=True)
class WarmPatch:
    """The answer when the new plan can be patched into the running graph.

    Attributes:
        kernels: Kernel nodes whose arguments, grid or function may change, in node order.
        calls: Captured-call nodes of the new plan, in node order (each is compared with the values it
            was captured with, re-captured if a host-side argument changed).
        counts: New element count of every buffer, by buffer index.
        grow: ``(buffer index, bytes)`` of every buffer to reallocate from the pool before the kernels
            are written (their buffer arguments then take its new address).
    """

    kernels: tuple[KernelPatch, ...]
    calls: tuple[CapturedNodePlan, ...]
    counts: tuple[int, ...]
    grow: tuple[tuple[int, int], ...] = ()


def _refuse(reason: Refusal, index: int | None, detail: str) -> WarmRefusal:
    return WarmRefusal(reason, index, detail)


def _same_sources(new: Any, cur: Any) -> bool:
    """Whether every argument of two nodes comes from the same kind of source (same buffer, binding, ...)."""
    return all(na.kind == oa.kind and na.ref == oa.ref for na, oa in zip(new.args, cur.args, strict=True))


def decide_warm_patch(
    old: GraphPlan,
    new: GraphPlan,
    bindings: Mapping[tuple[int, str], ExternalBinding],
    *,
    capacities: Sequence[int],
    stale: Collection[int] = frozenset(),
    functions: Mapping[tuple[int, int], Any] | None = None,
) -> WarmPatch | WarmRefusal:
    """Decide whether ``new`` can replace ``old`` in the running graph by patching it in place.

    It can when the two plans have the same nodes, edges, kernels (descriptors, block sizes, shared
    memory), argument sources, buffers (owner, type, append role), counters and update targets, and
    buffers that outgrew the allocation the running graph made for them are read and written by
    kernel nodes only (they are reallocated). Grids, element counts, constants, scalar values,
    external pointers and (same-layout) kernel functions may differ.

    Args:
        old: The plan the running graph was built from (or last patched to).
        new: The plan to apply.
        bindings: The input bindings ``new`` was compiled with, by ``(block_id, port)``.
        capacities: Bytes allocated for each of ``old``'s buffers in the running graph.
        stale: Node indices of captured calls whose latest capture the running graph could not take.
        functions: ``(block_id, kernel index)`` -> loaded ``CUfunction``. When given, every kernel
            node is part of the patch (its function may have been recompiled meanwhile).

    Returns:
        A ``WarmPatch`` to apply, or the ``WarmRefusal`` naming the first rule the plans break.
    """
    if new.level is not old.level:
        return _refuse(Refusal.PROFILING_LEVEL, None, f"profiling level {old.level} -> {new.level}")
    if len(new.nodes) != len(old.nodes):
        return _refuse(Refusal.NODE_COUNT, None, f"{len(old.nodes)} -> {len(new.nodes)} nodes")
    if len(new.buffers) != len(old.buffers):
        return _refuse(Refusal.BUFFER_COUNT, None, f"{len(old.buffers)} -> {len(new.buffers)} buffers")
    if new.children != old.children:
        return _refuse(Refusal.CHILD_GRAPHS, None, "the nodes grouped into child-graph nodes differ")
    if new.counters != old.counters:
        return _refuse(Refusal.COUNTERS, None, "the append counters differ")
    if new.scopes != old.scopes:
        return _refuse(Refusal.REGIONS, None, "nodes moved into or out of a region's body")
    if new.scalar_slots != old.scalar_slots:
        return _refuse(Refusal.SCALAR_SLOTS, None, "the scalar parameters map to other argument slots")
    if new.binding_slots != old.binding_slots:
        return _refuse(Refusal.BINDING_SLOTS, None, "the bound inputs map to other argument slots")
    nm, om = new.memory, old.memory
    if nm is not None and om is not None and nm.value_buffer != om.value_buffer:
        # the resize changed which values take turns in which buffer (e.g. best fit by size chose
        # another buffer): the new sharing needs new buffers for the values, so a Cold rebuild.
        return _refuse(Refusal.SHARING, None, "values share buffers differently")
    pairs = [i for dp in new.delays for i in (dp.previous, dp.current) if i is not None]
    if new.delays != old.delays or any(new.buffers[i].count != old.buffers[i].count for i in pairs):
        # a resized delay writes its start value again: a new graph, with its init armed
        return _refuse(Refusal.DELAYS, None, "the FrameDelays or their sizes changed")
    grow: list[tuple[int, int]] = []
    for nb, ob, capacity in zip(new.buffers, old.buffers, capacities, strict=True):
        if nb[:4] != ob[:4] or nb.append != ob.append:  # (index, block_id, label, dtype) and the append role
            what = f"buffer {nb.index} is now {nb.label!r} of block {nb.block_id}"
            return _refuse(Refusal.BUFFER_LAYOUT, nb.index, what)
        need = nb.count * nb.dtype.itemsize
        if need > capacity:
            grow.append((nb.index, grown_bytes(need)))
    if grow and new.delays:  # two executables hold the addresses: growth in place is not done there yet
        bi = grow[0][0]
        return _refuse(Refusal.BUFFER_CAPACITY, bi, f"buffer {bi} outgrew its allocation in a patch with FrameDelays")
    grown = {bi for bi, _ in grow}
    kernels: list[KernelPatch] = []
    calls: list[CapturedNodePlan] = []
    for n, c in zip(new.nodes, old.nodes, strict=True):
        i = n.index
        if type(n) is not type(c):
            return _refuse(Refusal.NODE_KIND, i, f"node {i} is a {type(n).__name__}, was a {type(c).__name__}")
        if isinstance(n, CapturedNodePlan):
            cur: Any = c
            if (n.block_id, n.kernel, n.descriptor, n.deps, n.spec) != (
                cur.block_id,
                cur.kernel,
                cur.descriptor,
                cur.deps,
                cur.spec,
            ) or not _same_sources(n, cur):
                return _refuse(Refusal.CAPTURED_CALL, i, f"captured call '{n.entry_point}' (node {i}) changed")
            if i in stale:
                what = f"captured call '{n.entry_point}' (node {i}) was re-captured into another topology"
                return _refuse(Refusal.STALE_CAPTURE, i, what)
            if any(a.kind == "external" and a.ref not in bindings for a in n.args):
                return _refuse(Refusal.UNBOUND, i, f"captured call '{n.entry_point}' (node {i}) reads an unbound input")
            if grown and any(a.kind == "buffer" and a.ref in grown for a in n.args):
                return _refuse_growth(new, n.args, grown, f"captured call '{n.entry_point}' (node {i})")
            calls.append(n)
            continue
        if not isinstance(n, KernelNodePlan):  # memset, timestamp and publish nodes must match exactly
            if n != c:
                return _refuse(Refusal.FIXED_NODE, i, f"{type(n).__name__} node {i} changed")
            if grown and getattr(n, "buffer", None) in grown:
                bi = n.buffer  # type: ignore[union-attr]
                return _refuse(
                    Refusal.BUFFER_CAPACITY, bi, f"buffer {bi} outgrew its allocation; memset node {i} zeroes it"
                )
            continue
        cur = c
        if (n.block_id, n.kernel, n.descriptor, n.deps, n.block, n.yz[2:], n.shared_bytes) != (
            cur.block_id,
            cur.kernel,
            cur.descriptor,
            cur.deps,
            cur.block,
            cur.yz[2:],
            cur.shared_bytes,
        ) or not _same_sources(n, cur):
            return _refuse(Refusal.KERNEL_NODE, i, f"kernel '{n.entry_point}' (node {i}) changed")
        external = False
        writes: list[tuple[int, Any]] = []
        for ai, a in enumerate(n.args):
            if a.kind in ("const", "scalar"):
                writes.append((ai, a.value))
            elif a.kind == "buffer" and a.ref in grown:
                external = True  # its new address is written once the buffer is reallocated
            elif a.kind == "external":
                binding = bindings.get(a.ref)  # type: ignore[call-overload]
                if binding is None:
                    return _refuse(Refusal.UNBOUND, i, f"kernel '{n.entry_point}' (node {i}) reads an unbound input")
                writes.append((ai, binding.ptr))
                external = True
        if n != c or functions is not None or external:
            fn = functions.get((n.block_id, n.kernel)) if functions is not None else None
            kernels.append(KernelPatch(i, n, tuple(writes), fn))
    return WarmPatch(tuple(kernels), tuple(calls), tuple(b.count for b in new.buffers), tuple(grow))


def _refuse_growth(plan: GraphPlan, args: Sequence[Any], grown: set[int], what: str) -> WarmRefusal:
    bi = next(a.ref for a in args if a.kind == "buffer" and a.ref in grown)
    b = plan.buffers[bi]
    detail = f"buffer {bi} needs {b.count * b.dtype.itemsize} bytes, more than allocated; {what} holds its address"
    return _refuse(Refusal.BUFFER_CAPACITY, bi, detail)
