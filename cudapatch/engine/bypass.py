"""The Bypass decision: which nodes of the running graph to turn off, and what their readers read.

``block.enabled = False`` (a host's Bypass flag) takes a block out of the frame without a rebuild:
its nodes are disabled in the executable graph with ``cuGraphNodeSetEnabled`` (1.8 µs a node at
every graph size, measured on the H100, DESIGN.md §9), and where one of its outputs has an input
of the same element type and count, the nodes reading that output read the input instead (a Warm
pointer patch). Elsewhere the readers read the output's last values.

A block fused into one generated kernel with others (``compiler/fusion.py``) has no node of its own:
the tier asks for a rebuild instead (the fusion phase leaves bypassed blocks out of groups), and the
bypass applies to the graph that rebuild swaps in, as for a block whose buffers others share.

Until that rebuild lands, a block whose buffers others share is *carried* where it can be: its one
kernel node runs the engine's copy kernel (``delay_copy``) from its input of the same size into its
own output, in place of its own code (``cuGraphExecKernelNodeSetParams``). The node keeps its place
and its dependencies and touches only buffers it touched before, so buffer reuse cannot race it, and
its readers see its input from the next frame on. A carried block is one kernel node (not fused,
not a library call) with one output of its own whose value, and every value in the input's buffer,
has that input's element type and count.

The driver can disable kernel, memset and memcpy nodes only (``cuGraphNodeSetEnabled``); a block
with a captured library call (a child-graph node) keeps running, and the decision says why.

A redirect is made only where it cannot race: no enabled node may write the output (an in-place
reader would then write into another block's buffer) nor the input it reads instead (a reader of
the input would no longer be ordered after it), and every reader is a kernel node (a captured
call reads its pointers at capture). An append output is never redirected: its count lives in a
counter. Chains of bypassed blocks resolve to the first input that runs.

Pure: a ``GraphPlan`` and the set of bypassed block ids in, a ``BypassPlan`` out. ``BypassIndex``
reads the plan once (readers and writers of every buffer and binding; a build on the build thread
makes it there, about 2.4 µs a node on the CPU machine), so a toggle costs what the bypassed blocks
touch, not the size of the patch. Tested without a GPU (``tests/unit/test_bypass.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from ..kernels.types import DType
from .delay_copy import copy_entry
from .memory_plan import shares_with_others
from .plan import CapturedNodePlan, GraphPlan, KernelNodePlan, Slot

if TYPE_CHECKING:
    from .compiler.resume import PlanDelta

__all__ = ["BypassIndex", "BypassPlan", "Carry", "Resource", "plan_bypass"]

#: A planned buffer (its index) or an external binding (its ``(block_id, port)`` key).
Resource = Hashable


@dataclass(frozen=True)
class BypassPlan:
    """What bypassing a set of blocks does to the graph running a plan.

    Attributes:
        disabled: Node indices to disable (every node of every bypassed block that can be).
        redirects: ``(node index, argument index)`` -> the resource that argument reads instead of a
            bypassed block's output.
        outputs: ``(block_id, port)`` of a bypassed output -> the resource it passes on.
        refused: Bypassed block id -> why its nodes keep running.
        carried: Node index -> the copy it runs instead of its kernel (a block whose buffers others
            share, until the rebuild that pins them lands).
    """

    disabled: frozenset[int] = frozenset()
    redirects: dict[Slot, Resource] = field(default_factory=dict)
    outputs: dict[tuple[int, str], Resource] = field(default_factory=dict)
    refused: dict[int, str] = field(default_factory=dict)
    carried: dict[int, Carry] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (self.disabled or self.redirects or self.carried)


class Carry(NamedTuple):
    """A carried block's node copies argument ``src`` (its input) into argument ``dst`` (its output):
    ``count`` elements of the copy kernel ``entry`` (``delay_copy.copy_entry``). The pointers are read
    from the node's arguments whenever it goes to the driver (a Warm patch may move them)."""

    src: int
    dst: int
    entry: str
    count: int


NO_BYPASS = BypassPlan()


class BypassIndex:
    """Who reads and writes what in one plan, and each block's candidate inputs and outputs.

    Args:
        plan: The plan of the running graph (an index belongs to one plan).
        previous: The index of the plan ``plan`` was resumed from, with ``delta`` (``NodeCache.delta``:
            incremental planning): only the nodes and blocks the delta names are indexed again.
        delta: How ``plan`` differs from ``previous.plan``.
    """

    def __init__(self, plan: GraphPlan, previous: BypassIndex | None = None, delta: PlanDelta | None = None) -> None:
        if (
            previous is not None
            and delta is not None
            and delta.plan is plan
            and previous.plan is delta.source
            and not (previous.nested or plan.scopes or plan.children)
        ):
            self._resume(plan, previous, delta)
            return
        self.plan = plan
        #: resource -> ``(node, arg)`` of every kernel argument that only reads it
        self.readers: dict[Resource, list[Slot]] = {}
        #: resource -> nodes that write it (an ``out`` or ``inout`` parameter)
        self.writers: dict[Resource, set[int]] = {}
        #: resource -> captured-call nodes that read it (they cannot be redirected)
        self.captured_readers: dict[Resource, set[int]] = {}
        #: block id -> what its nodes read (``in`` parameters), in argument order, with element type
        self.inputs: dict[int, list[tuple[Resource, DType]]] = {}
        #: block id -> its nodes are child graphs (library calls): the driver cannot disable them
        self.captured_blocks: set[int] = set()
        #: blocks computed inside a fused kernel with others (``compiler/fusion.py``): their node is
        #: the group's, so a bypass of one needs the rebuild that takes it out of the group
        self.fused: set[int] = set()
        self.outputs: dict[int, list[tuple[str, int]]] = {}
        #: nodes inside a region's body or a composite's child graph: not disabled one by one
        self.nested: set[int] = set(plan.scopes) | {ni for c in plan.children for ni in c.nodes}
        #: block id -> its place in the plan's topological order (a decision sorts only what it bypasses)
        self.position = {bid: i for i, bid in enumerate(plan.block_order)}
        #: (bypassed blocks, carry) -> ``decide``'s answer: a toggle alternates between two sets, and an
        #: answer depends on nothing else than this plan
        self.decisions: dict[tuple[frozenset[int], bool], tuple[frozenset[int], BypassPlan]] = {}
        for n in plan.nodes:
            if isinstance(n, KernelNodePlan):
                self._add(n, captured=False)
                self.fused.update(getattr(n.source, "members", ()))
            elif isinstance(n, CapturedNodePlan):
                self._add(n, captured=True)
                self.captured_blocks.add(n.block_id)
        #: block id -> ``(port, buffer)`` of each of its outputs (``_carry`` looks for its own among them)
        self.ports: dict[int, list[tuple[str, int]]] = {}
        buffers = plan.buffers
        for (bid, port), bi in plan.outputs.items():
            self.ports.setdefault(bid, []).append((port, bi))
            if buffers[bi].block_id == bid:  # a ``through`` output names its input's buffer: nothing to pass on
                self.outputs.setdefault(bid, []).append((port, bi))

    def decide(self, bypassed: Collection[int], carry: bool = False) -> tuple[frozenset[int], BypassPlan]:
        """What bypassing ``bypassed`` does to the graph running this plan, made once per set: the
        blocks that must wait for a rebuild, and the ``BypassPlan`` of the others.

        Buffer reuse gave the first ones' values to other blocks too, or fusion their node (computed in
        a fused kernel with others: no node of their own to turn off): bypassed now, their readers would
        read another block's data (or the whole group would stop). They wait for a rebuild that pins
        their values and takes them out of fused groups (the snapshot carries ``bypassed``); with
        ``carry`` (the copy kernels are loaded), those that can be are carried meanwhile (``Carry``)."""
        key = frozenset(bypassed)
        decided = self.decisions.get((key, carry))
        if decided is None:
            shared = frozenset(shares_with_others(self.plan, key)) | self.fused.intersection(key)
            if len(self.decisions) >= 64:
                self.decisions.clear()
            bp = plan_bypass(self, key - shared)
            if carry and shared and not self.plan.delays:
                carried = {}
                for bid in shared:
                    c = self._carry(bid)
                    if c is not None:
                        carried[c[0]] = c[1]
                if carried:
                    bp = dataclasses.replace(bp, carried=carried)
            decided = self.decisions[(key, carry)] = (shared, bp)
        return decided

    def _carry(self, bid: int) -> tuple[int, Carry] | None:
        """Block ``bid``'s node and the copy that carries it, or None where it cannot be carried."""
        plan, mem = self.plan, self.plan.memory
        nodes = plan.block_nodes.get(bid, ())
        if len(nodes) != 1 or bid in self.fused or mem is None or nodes[0] in self.nested:
            return None
        n = plan.nodes[nodes[0]]
        if not isinstance(n, KernelNodePlan) or n.block_id != bid:
            return None
        # Its outputs of its own (a ``through`` port carries another block's value): exactly one.
        own = []
        for port, bi in self.ports.get(bid, ()):
            vi = mem.ports.get((bid, port))
            if vi is not None and mem.values[vi].block_id == bid:
                own.append((bi, mem.values[vi]))
        if len(own) != 1 or own[0][1].append:
            return None
        bo, out = own[0]
        slots, params = n.descriptor.slots, n.descriptor.parameters
        dst = src = None
        for ai, a in enumerate(n.args):
            if not a.is_pointer or a.kind not in ("buffer", "external"):
                continue
            direction = params[slots[ai].param].direction if ai < len(slots) else "inout"
            if direction != "in":
                if a.ref == bo and dst is None:
                    dst = ai
            elif src is None and a.ref != bo and a.dtype == out.dtype and self._count_read(n, a.ref) == out.count:
                src = ai
        if src is None or dst is None or plan.buffers[bo].count < out.count:
            return None
        entry, count = copy_entry(out.count * out.dtype.itemsize)
        return n.index, Carry(src, dst, entry, count)

    def _count_read(self, n: KernelNodePlan, res: Resource) -> int | None:
        """Element count of the value node ``n`` reads in ``res``: a binding's, or that of the value in
        buffer ``res`` written by a node ``n`` depends on (a buffer several values take turns in holds
        the one its last writer before ``n`` made). None where no such writer is found."""
        plan = self.plan
        if not isinstance(res, int):
            return plan.binding_counts.get(res)  # type: ignore[call-overload]
        mem = plan.memory
        for d in n.deps:
            bid = getattr(plan.nodes[d], "block_id", None)
            for port, bi in self.ports.get(bid, ()) if bid is not None else ():
                vi = mem.ports.get((bid, port)) if bi == res and mem is not None else None
                if vi is not None and mem.value_buffer[vi] == res:  # type: ignore[union-attr]
                    return mem.values[vi].count  # type: ignore[union-attr]
        return None

    def _resume(self, plan: GraphPlan, previous: BypassIndex, delta: PlanDelta) -> None:
        """The index of ``plan`` from ``previous``'s: the nodes the delta names leave it and come back
        as they are now; the blocks it names are looked at again. ``previous`` is not changed (the
        frame thread may be using it): what changes is copied first."""
        self.plan = plan
        self.readers = dict(previous.readers)
        self.writers = dict(previous.writers)
        self.captured_readers = dict(previous.captured_readers)
        self.inputs = dict(previous.inputs)
        self.captured_blocks = set(previous.captured_blocks)
        self.fused = set(previous.fused)
        self.nested = set()
        self.position = {bid: i for i, bid in enumerate(plan.block_order)}
        self.decisions = {}
        first, renumbered = delta.nodes, delta.renumbered
        old_nodes, new_nodes = delta.source.nodes, plan.nodes
        gone = [old_nodes[i] for i in sorted(renumbered)]
        gone += old_nodes[first:]
        removed = {n.index for n in gone}
        blocks = set(delta.blocks)
        copied: set[int] = set()  # resources whose entries are this index's own copies already
        for n in gone:
            if not isinstance(n, (KernelNodePlan, CapturedNodePlan)):
                continue
            blocks.add(n.block_id)
            self.fused.difference_update(getattr(n.source, "members", ()))
            for a in n.args:
                if not a.is_pointer or a.kind not in ("buffer", "external"):
                    continue
                res = a.ref
                if res in copied:
                    continue
                copied.add(res)
                for table in (self.writers, self.captured_readers):
                    old = table.get(res)
                    if old is not None:
                        kept = {i for i in old if i not in removed}
                        if kept:
                            table[res] = kept
                        else:
                            del table[res]
                old_slots = self.readers.get(res)
                if old_slots is not None:
                    kept_slots = [sl for sl in old_slots if sl[0] not in removed]
                    if kept_slots:
                        self.readers[res] = kept_slots
                    else:
                        del self.readers[res]
        back = [new_nodes[i] for i in sorted(renumbered)]
        back += new_nodes[first:]
        blocks.update(n.block_id for n in back if isinstance(n, (KernelNodePlan, CapturedNodePlan)))
        for bid in blocks:
            self.inputs.pop(bid, None)
            self.captured_blocks.discard(bid)
        added: set[Resource] = set()
        for n in back:
            if isinstance(n, (KernelNodePlan, CapturedNodePlan)):
                added.update(self._add(n, captured=isinstance(n, CapturedNodePlan), copy=copied))
                if isinstance(n, KernelNodePlan):
                    self.fused.update(getattr(n.source, "members", ()))
        for res in added:  # nodes added before the kept ones of a resource: back in node order
            slots = self.readers.get(res)
            if slots is not None:
                slots.sort()
        # Each block's inputs (in node order) and whether it holds a library call, from all its nodes (a
        # fused group's node is its sink's: the other members' inputs are the node's too, filed under the sink).
        block_nodes = plan.block_nodes
        for bid in blocks:
            self.inputs.pop(bid, None)
            for i in block_nodes.get(bid, ()):
                n = new_nodes[i]
                if isinstance(n, (KernelNodePlan, CapturedNodePlan)) and n.block_id == bid:
                    self._inputs_of(n)
                    if isinstance(n, CapturedNodePlan):
                        self.captured_blocks.add(n.block_id)
        self.outputs = dict(previous.outputs)
        self.ports = dict(previous.ports)
        buffers, outputs = plan.buffers, plan.outputs
        for bid in delta.blocks:
            ports = [(port, outputs[(bid, port)]) for port in delta.ports.get(bid, ()) if (bid, port) in outputs]
            own = [(port, bi) for port, bi in ports if buffers[bi].block_id == bid]
            for table, entries in ((self.ports, ports), (self.outputs, own)):
                if entries:
                    table[bid] = entries
                else:
                    table.pop(bid, None)

    def _inputs_of(self, n: KernelNodePlan | CapturedNodePlan) -> None:
        slots, params = n.descriptor.slots, n.descriptor.parameters
        inputs = self.inputs.setdefault(n.block_id, [])
        for ai, a in enumerate(n.args):
            if not a.is_pointer or a.kind not in ("buffer", "external"):
                continue
            direction = params[slots[ai].param].direction if ai < len(slots) else "inout"
            if direction == "in":
                inputs.append((a.ref, a.dtype))

    def _add(
        self, n: KernelNodePlan | CapturedNodePlan, *, captured: bool, copy: set[Resource] | None = None
    ) -> list[Resource]:
        """Index node ``n``; returns the resources it reads. ``copy``: resources whose entries this index
        owns already (a resumed index copies the others' before adding to them)."""
        slots, params = n.descriptor.slots, n.descriptor.parameters
        inputs = self.inputs.setdefault(n.block_id, [])
        read: list[Resource] = []
        if copy is not None:
            for a in n.args:
                res = a.ref
                if a.is_pointer and a.kind in ("buffer", "external") and res not in copy:
                    copy.add(res)
                    for table in (self.writers, self.captured_readers):
                        if res in table:
                            table[res] = set(table[res])
                    if res in self.readers:
                        self.readers[res] = list(self.readers[res])
        for ai, a in enumerate(n.args):
            if not a.is_pointer or a.kind not in ("buffer", "external"):
                continue
            res: Resource = a.ref
            direction = params[slots[ai].param].direction if ai < len(slots) else "inout"
            if direction != "in":
                self.writers.setdefault(res, set()).add(n.index)
                continue
            if captured:
                self.captured_readers.setdefault(res, set()).add(n.index)
            else:
                self.readers.setdefault(res, []).append((n.index, ai))
                read.append(res)
            inputs.append((res, a.dtype))
        return read

    def count(self, res: Resource) -> int | None:
        """Element count of a buffer or a binding in the plan."""
        if isinstance(res, int):
            return self.plan.buffers[res].count
        return self.plan.binding_counts.get(res)  # type: ignore[call-overload]


def plan_bypass(index: BypassIndex, bypassed: Collection[int]) -> BypassPlan:
    """Decide what bypassing ``bypassed`` (block ids) does to the graph running ``index.plan``.

    Returns:
        The ``BypassPlan``; ``NO_BYPASS`` when no bypassed block runs in the plan.
    """
    plan = index.plan
    position = index.position  # topological order: chains resolve forwards
    running = sorted((bid for bid in bypassed if bid in position), key=position.__getitem__)
    if not running:
        return NO_BYPASS
    block_nodes, buffers = plan.block_nodes, plan.buffers
    disabled: set[int] = set()
    refused: dict[int, str] = {}
    through: dict[Resource, Resource] = {}  # a bypassed output -> what its readers read instead
    outputs: dict[tuple[int, str], Resource] = {}
    for bid in running:  # every node off first: a redirect is judged against what still runs
        if plan.delays:  # two executables alternate; turning nodes off in both is not done yet
            refused[bid] = "the patch has FrameDelay feedback (two executables take turns)"
        elif bid in index.captured_blocks:
            refused[bid] = "its library call is a child-graph node, which the driver cannot disable"
        elif index.nested and not index.nested.isdisjoint(block_nodes.get(bid, ())):
            refused[bid] = "it runs inside a region's body or a composite's child graph"
        else:
            disabled.update(block_nodes.get(bid, ()))
    for bid in running:
        if bid in refused:
            continue
        own = {bi for _, bi in index.outputs.get(bid, ())}
        for port, bo in index.outputs.get(bid, ()):
            out = buffers[bo]
            if out.append:
                continue
            src = _same_size_input(index, bid, own, out.dtype, out.count)
            if src is None:
                continue
            src = through.get(src, src)  # an upstream bypassed block passes its own input on
            if _redirect_safe(index, bo, src, disabled):
                through[bo] = src
                outputs[(bid, port)] = src
    redirects: dict[Slot, Resource] = {}
    for bo, src in through.items():
        for slot in index.readers.get(bo, ()):
            if slot[0] not in disabled:
                redirects[slot] = src
    return BypassPlan(frozenset(disabled), redirects, outputs, refused)


def _same_size_input(index: BypassIndex, bid: int, own: set[int], dtype: DType, count: int) -> Resource | None:
    """The first input of block ``bid`` (argument order) of ``dtype`` and ``count`` elements."""
    for res, dt in index.inputs.get(bid, ()):
        if res not in own and dt == dtype and index.count(res) == count:
            return res
    return None


def _redirect_safe(index: BypassIndex, out: Resource, src: Resource, disabled: set[int]) -> bool:
    """Whether readers of ``out`` may read ``src`` instead: no enabled node writes either of them
    except ``src``'s producer, and no captured call reads ``out``."""
    if index.captured_readers.get(out):
        return False
    if any(ni not in disabled for ni in index.writers.get(out, ())):
        return False
    producer = index.plan.buffers[src].block_id if isinstance(src, int) else None
    block_nodes = index.plan.block_nodes
    made_by = set(block_nodes.get(producer, ())) if producer is not None else set()
    return all(ni in disabled or ni in made_by for ni in index.writers.get(src, ()))
