"""PlanDraft: the plan under construction, which the compiler's phases fill in one after another.

Each phase reads what the phases before it wrote and adds its own part (see ``compile_plan`` for
the sequence); ``PlanDraft.plan()`` freezes the result into a ``GraphPlan``. Keeping every
intermediate result on one object lets a phase be tested alone: run the phases before it on a
snapshot, then look at exactly what it added.

The records here are NamedTuples for the reason ``plan.py`` gives: a Cold rebuild of a 100-block
patch makes hundreds of them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from ...blocks.description import SizeRule
from ...blocks.shape import Shape
from ...errors import GraphCompileError
from ..connections import Link
from ..context import BlockSnapshot, PatchSnapshot
from ..diagnostics import Diagnostic, DiagnosticCode, Severity
from ..memory_plan import MemoryPlan
from ..plan import BufferPlan, DelayPlan, GraphPlan, NodePlan, Slot, TimingPair
from ..profiling import ProfilingLevel

__all__ = ["BlockSizes", "KernelStatus", "NodeDraft", "PlanDraft", "Source", "resolve_count"]

#: ``(block_id, kernel index)`` → ``(severity, code, message)`` of a kernel that cannot run yet.
KernelStatus = Mapping[tuple[int, int], tuple[Severity, str, str]]


class Source(NamedTuple):
    """What a port carries: a value a block made, an external binding, or nothing.

    Attributes:
        kind: ``value`` (``ref``: its index in ``PlanDraft.values``; a ``through`` port passes its
            input's source on unchanged), ``external`` (``ref``: the binding's ``(block_id, port)``
            key) or ``null`` (an optional input left unbound).
        ref: See ``kind``.
        count: Element count.
        shape: Its shape (``(count,)`` for flat data).
    """

    kind: Literal["value", "external", "null"]
    ref: object
    count: int
    shape: Shape


class BlockSizes(NamedTuple):
    """What the sizes phase found for one block that runs.

    Attributes:
        block: The block.
        inputs: Input port → its source.
        outputs: Output port → what it carries (a value it makes, or a ``through`` port's input).
        internal: The value index of each internal link.
        made: Indices of the values the block makes: its outputs in port order, then its internal links.
        launches: Per kernel, its grid and block sizes (``shapes.Launch``; None for a captured call).
    """

    block: BlockSnapshot
    inputs: dict[str, Source]
    outputs: dict[str, Source]
    internal: tuple[int, ...]
    made: range
    launches: tuple = ()


class NodeDraft(NamedTuple):
    """A node before its dependencies are known: ``cls(*head, deps, *tail)`` once the edges phase
    has found them from the resources the node reads and writes.

    Resources: planned buffer ``i`` is the int ``i``, append counter ``c`` is ``-1 - c``, an external
    binding is its ``(block_id, port)`` key.
    """

    cls: type
    head: tuple
    tail: tuple
    reads: list[object]
    writes: list[object]


def resolve_count(rule: SizeRule, inputs: Mapping[str, Source], params: Mapping[str, object]) -> int:
    """The element count ``rule`` gives for a block with these input sources and parameter values
    (for rules with axes, the count of their shape, or the one axis they name).

    Raises:
        ShapeError: a rule with axes cannot be resolved (the sizes phase checks every rule of a block
            before the block runs, so later phases do not meet this).
    """
    if rule.dims or rule.axis is not None or rule.fn is not None:
        from .shapes import resolve_shape

        return resolve_shape(rule, inputs, params).count
    # The common rules inline: a rebuild resolves thousands.
    if rule.like is not None:
        n = inputs[rule.like].count
    elif rule.param is not None:
        n = int(params[rule.param])  # type: ignore[call-overload]
    else:
        n = int(rule.fixed)  # type: ignore[arg-type]
    return max(0, n // rule.divide * rule.scale + rule.extra)


@dataclass(eq=False, slots=True)
class PlanDraft:
    """The plan under construction. Fields are grouped by the phase that fills them.

    Args:
        snap: The patch.
        kernel_status: Kernels that cannot run yet (see ``compile_plan``).
        level: Profiling level.
        faulted: Blocks whose kernels faulted on the GPU (id → message).
        reuse: Let values with disjoint lifetimes share buffers (the memory phase).
    """

    snap: PatchSnapshot
    kernel_status: KernelStatus | None = None
    level: ProfilingLevel = ProfilingLevel.NONE
    faulted: Mapping[int, str] | None = None
    reuse: bool = True
    blocks: dict[int, BlockSnapshot] = field(init=False)
    errors: list[Diagnostic] = field(default_factory=list)  # any error stops compile_plan after ordering
    warnings: list[Diagnostic] = field(default_factory=list)
    # regions (``regions.py``): which region holds each block, the blocks left out with their region,
    # the order of each scope's blocks and regions (None: the top level), the region of each node
    parents: dict[int, int] = field(default_factory=dict)
    left_out: dict[int, str] = field(default_factory=dict)
    units: dict[int | None, list[int]] = field(default_factory=dict)
    scopes: dict[int, int] = field(default_factory=dict)
    regions: dict = field(default_factory=dict)  # region block id -> RegionPlan
    # each copy of each unit (block or region) made in a body: (conditional node, unit, first node, end)
    body_units: list[tuple[int, int, int, int]] = field(default_factory=list)
    # validate: the links that make sense, and the one link into each linked input
    links: list[Link] = field(default_factory=list)
    incoming: dict[tuple[int, str], Link] = field(default_factory=dict)
    # the links added or removed since the last plan (``validate.relinked``), and its ``incoming``
    relinked: list[tuple[tuple[int, str], Link]] | None = None
    relinked_from: Mapping[tuple[int, str], Link] | None = None
    # order: blocks in topological order
    order: list[int] = field(default_factory=list)
    # sizes: the blocks that run (in order) with what they read and make; the blocks left out
    sized: dict[int, BlockSizes] = field(default_factory=dict)
    skipped: list[int] = field(default_factory=list)
    # Each value a block makes (an output's data, an internal link), numbered in the order made, as
    # the BufferPlan it needs on its own; memory decides which buffers actually hold them.
    values: list[BufferPlan] = field(default_factory=list)
    ports: dict[tuple[int, str], int] = field(default_factory=dict)  # (block, output port) → value index
    shapes: dict[tuple[int, str], Shape] = field(default_factory=dict)  # (block, output port) → shape, if not flat
    binding_counts: dict[tuple[int, str], int] = field(default_factory=dict)
    # delays: (FrameDelay block id, value its Out reads, value its In gets or None) of each running delay
    delays: list[tuple[int, int, int | None]] = field(default_factory=list)
    # regions: delays carried by a copy node, the last of their block's nodes (``region_delays.py``)
    copied_delays: set[int] = field(default_factory=set)
    # fusion: fused groups of elementwise blocks (a ``fusion.Fusion``), None when nothing fused
    fusion: Any = None
    # memory: the buffer that holds each value; append counters
    buffers: list[BufferPlan] = field(default_factory=list)
    value_buffer: list[int] = field(default_factory=list)
    counters: list[tuple[int, str]] = field(default_factory=list)
    value_counter: dict[int, int] = field(default_factory=dict)
    outputs: dict[tuple[int, str], int] = field(default_factory=dict)
    appends: dict[tuple[int, str], tuple[int, int]] = field(default_factory=dict)
    memory: MemoryPlan | None = None
    # nodes: node drafts in launch order, and the argument slots Hot and Warm edits patch
    drafts: list[NodeDraft] = field(default_factory=list)
    counter_users: set[int] = field(default_factory=set)
    scalar_slots: dict[tuple[int, str], tuple[Slot, ...]] = field(default_factory=dict)
    binding_slots: dict[tuple[int, str], tuple[Slot, ...]] = field(default_factory=dict)
    block_nodes: dict[int, tuple[int, ...]] = field(default_factory=dict)
    # edges: the finished nodes
    nodes: list[NodePlan] = field(default_factory=list)
    # stamps: measured spans and timestamp slots
    timings: tuple[TimingPair, ...] = ()
    stamp_count: int = 0
    # probes (placed by the nodes phase, see ``probes.py``): each probe's (block, port), readback words
    probe_keys: list[tuple[int, str]] = field(default_factory=list)
    probe_words: int = 0

    def __post_init__(self) -> None:
        self.blocks = {b.id: b for b in self.snap.blocks}

    def inside(self, bid: int, rid: int) -> bool:
        """Whether block ``bid`` is inside region ``rid``, at any depth (``parents``: a patch with regions)."""
        parents = self.parents
        r = parents.get(bid)
        while r is not None:
            if r == rid:
                return True
            r = parents.get(r)
        return False

    def error(self, block_id: int | None, code: DiagnosticCode, message: str) -> None:
        """Record a validation error (``compile_plan`` raises them together after ordering)."""
        self.errors.append(Diagnostic("error", block_id, code, message))

    def raise_errors(self) -> None:
        """Raise every error recorded so far as one ``GraphCompileError``.

        Raises:
            GraphCompileError: there were errors (its ``diagnostics`` name every block and port involved).
        """
        if self.errors:
            raise GraphCompileError(
                f"{len(self.errors)} error(s) in the patch: " + "; ".join(d.message for d in self.errors),
                diagnostics=tuple(self.errors + self.warnings),
            )

    def plan(self) -> GraphPlan:
        """The finished plan (after every phase)."""
        return GraphPlan(
            nodes=tuple(self.nodes),
            buffers=tuple(self.buffers),
            counters=tuple(self.counters),
            block_order=tuple(self.sized),
            skipped=tuple(self.skipped),
            diagnostics=tuple(self.warnings),
            outputs=self.outputs,
            appends=self.appends,
            scalar_slots=self.scalar_slots,
            binding_slots=self.binding_slots,
            binding_counts=self.binding_counts,
            block_nodes=self.block_nodes,
            shapes=self.shapes,
            level=self.level,
            timings=self.timings,
            stamp_count=self.stamp_count,
            delays=self._delay_plans(),
            scopes=self.scopes,
            regions=self.regions,
            probes=tuple(self.probe_keys),
            probe_words=self.probe_words,
            memory=self.memory,
        )

    def _delay_plans(self) -> tuple[DelayPlan, ...]:
        vb, block_nodes = self.value_buffer, self.block_nodes
        return tuple(
            DelayPlan(
                bid,
                block_nodes[bid][0] if bid in block_nodes else None,  # a faulted delay has no init kernel
                vb[prev],
                vb[cur] if cur is not None else None,
                block_nodes[bid][-1] if bid in self.copied_delays else None,
            )
            for bid, prev, cur in self.delays
        )
