"""What ``str(block)`` shows of a build, worked out on the build thread and applied as differences.

Writing it from the whole plan onto every block took tens of milliseconds at 10,000 blocks on
the frame thread, in the frame that swaps a finished build in. Here the per-block
part (output sizes, shapes, fused groups) is computed from the plan alone by ``built_view`` (any
thread: the build's ``prepare``), together with the blocks whose entries differ from the view shown
when the build started. ``BuiltShower.apply`` (frame thread) then writes only those blocks, the
append outputs of the new graph, and clears the GPU numbers of the old graph where any are shown:
what the blocks show afterwards is what writing every block would have made them show
(``tests/unit/built_reference.py``). Pure: tested
without a GPU (``tests/unit/test_built_view.py``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .plan import GraphPlan
from .registry import BlockRegistry
from .slices import dict_copy
from .stats import readings_shown

if TYPE_CHECKING:
    from .compiler.resume import PlanDelta

__all__ = ["BuiltShower", "BuiltView", "built_view"]

_serials = itertools.count()


@dataclass(frozen=True)
class BuiltView:
    """The per-block part of what a build shows.

    Attributes:
        sizes: Block id -> output port -> element count.
        shapes: Block id -> output port -> Shape (2-D/3-D outputs).
        groups: Block id -> its fused group, as ``(member id, member name at the snapshot)`` pairs.
        serial: This view's number (views are told apart by it).
        base: The ``serial`` of the view this one was compared with (None: compared with nothing); a
            number, not the view, so that views do not keep their predecessors alive.
        changed: Block ids whose entries differ from the base view's (every block in this view when
            ``base`` is None).
        plan: The plan it shows (a view of the next plan redoes only what changed, ``delta``).
    """

    sizes: dict[int, dict[str, int]]
    shapes: dict[int, dict[str, Any]]
    groups: dict[int, tuple[tuple[int, str], ...]]
    serial: int
    base: int | None
    changed: frozenset[int]
    plan: GraphPlan | None = field(default=None, compare=False, repr=False)  # the plan it shows


def built_view(
    plan: GraphPlan, names: Mapping[int, str], base: BuiltView | None, delta: PlanDelta | None = None
) -> BuiltView:
    """The view of ``plan`` (any thread; reads the plan only).

    Args:
        plan: The build's plan.
        names: Block id -> name, from the build's snapshot (a rename shows at the next build).
        base: The view shown when the build started (``BuiltShower.shown``), or None.
        delta: How ``plan`` differs from the plan it was resumed from (``NodeCache.delta``): when
            ``base`` shows that plan, only the blocks the delta names are looked at again.
    """
    if (
        delta is not None
        and base is not None
        and delta.plan is plan
        and base.plan is delta.source
        and plan.memory is not None
    ):
        return _resumed_view(plan, names, base, delta)
    sizes: dict[int, dict[str, int]] = {}
    mem = plan.memory
    for (bid, port), bi in plan.outputs.items():  # a value's own count: a shared buffer holds several
        vi = mem.ports.get((bid, port)) if mem is not None else None
        sizes.setdefault(bid, {})[port] = mem.values[vi].count if vi is not None else plan.buffers[bi].count  # type: ignore[union-attr]
    shapes: dict[int, dict[str, Any]] = {}
    for (bid, port), shape in plan.shapes.items():
        shapes.setdefault(bid, {})[port] = shape
    groups: dict[int, tuple[tuple[int, str], ...]] = {}
    for node in plan.kernel_nodes:
        members = getattr(node.source, "members", ())
        if members:
            group = tuple((m, names.get(m, str(m))) for m in members)
            groups.update(dict.fromkeys(members, group))
    if base is None:
        changed = frozenset(sizes) | frozenset(shapes) | frozenset(groups)
    else:
        differ = _differ()
        old_groups = base.groups
        changed = frozenset(
            bid
            for bid in {*sizes, *shapes, *groups, *base.sizes, *base.shapes, *old_groups}
            if sizes.get(bid) != base.sizes.get(bid)
            or shapes.get(bid) != base.shapes.get(bid)
            or differ(groups.get(bid), old_groups.get(bid))
        )
    return BuiltView(sizes, shapes, groups, next(_serials), base.serial if base is not None else None, changed, plan)


def _resumed_view(plan: GraphPlan, names: Mapping[int, str], base: BuiltView, delta: PlanDelta) -> BuiltView:
    """``built_view`` of a resumed plan from the view of the plan it resumed from: the blocks before the
    first one the edit touched show what they showed (their values' counts and shapes are the same;
    buffers shared anew change no count), the others are looked up again; so are the fused groups of
    the nodes the delta names (a group before them is the same node, of the same members)."""
    sizes, shapes = dict(base.sizes), dict(base.shapes)
    mem = plan.memory
    assert mem is not None
    outputs, values, plan_shapes = plan.outputs, mem.values, plan.shapes
    ports = mem.ports
    changed = set()
    for bid in delta.blocks:
        own: dict[str, int] = {}
        own_shapes: dict[str, Any] = {}
        for port in delta.ports.get(bid, ()):
            key = (bid, port)
            if key in outputs:
                vi = ports.get(key)
                own[port] = values[vi].count if vi is not None else plan.buffers[outputs[key]].count
            shape = plan_shapes.get(key)
            if shape is not None:
                own_shapes[port] = shape
        _put(sizes, bid, own)
        _put(shapes, bid, own_shapes)
        if sizes.get(bid) != base.sizes.get(bid) or shapes.get(bid) != base.shapes.get(bid):
            changed.add(bid)
    groups = base.groups
    old_nodes, new_nodes, first = delta.source.nodes, plan.nodes, delta.nodes
    gone = [_members(n) for n in (*(old_nodes[i] for i in delta.renumbered), *old_nodes[first:])]
    back = [_members(n) for n in (*(new_nodes[i] for i in delta.renumbered), *new_nodes[first:])]
    if any(gone) or any(back):
        groups = dict_copy(groups)
        regrouped: set[int] = set()
        for members in gone:  # a block of a group keeps it unless its node is one of these
            for m in members:
                groups.pop(m, None)
            regrouped.update(members)
        for members in back:
            if members:
                groups.update(dict.fromkeys(members, tuple((m, names.get(m, str(m))) for m in members)))
                regrouped.update(members)
        differ = _differ()
        changed.update(bid for bid in regrouped if differ(groups.get(bid), base.groups.get(bid)))
    return BuiltView(sizes, shapes, groups, next(_serials), base.serial, frozenset(changed), plan)


def _members(node: Any) -> tuple[int, ...]:
    """The blocks of a fused node (none for any other node)."""
    return getattr(getattr(node, "source", None), "members", ())


def _differ() -> Any:
    """``a != b`` for the group tuples of two views, compared once per pair of tuples: every member of a
    group holds the same tuple (at 10,000 fused blocks, comparing each member's took 80 ms)."""
    seen: dict[tuple[int, int], bool] = {}

    def differ(a: Any, b: Any) -> bool:
        if a is b:
            return False
        if a is None or b is None:
            return True
        key = (id(a), id(b))
        out = seen.get(key)
        if out is None:
            out = seen[key] = a != b
        return out

    return differ


def _put(table: dict, bid: int, entry: dict) -> None:
    if entry:
        table[bid] = entry
    else:
        table.pop(bid, None)


class BuiltShower:
    """Applies build views to the blocks of one engine (frame thread), remembering what it showed.

    Args:
        blocks: The patch's blocks.
    """

    def __init__(self, blocks: BlockRegistry) -> None:
        self._blocks = blocks
        #: The view applied last (a build compares its own with it).
        self.shown: BuiltView | None = None
        self._appends: set[int] = set()  # blocks showing append outputs
        self._away: set[int] = set()  # changed while not registered: written when they are again
        self._readings = -1  # ``readings_shown()`` when the GPU numbers were last cleared
        self._attached: set[int] = set()  # blocks whose sizes, shapes and fused are read from ``shown``

    def sizes_of(self, block_id: int) -> dict[str, int]:
        """Output port -> element count of a block in the view shown."""
        shown = self.shown
        return {} if shown is None else shown.sizes.get(block_id, {})

    def shapes_of(self, block_id: int) -> dict[str, Any]:
        """Output port -> Shape (2-D/3-D outputs) of a block in the view shown."""
        shown = self.shown
        return {} if shown is None else shown.shapes.get(block_id, {})

    def fused_of(self, block_id: int) -> str:
        """The fused group a block runs in, as ``"a -> b -> c"`` with the members' names now ("" if none)."""
        shown = self.shown
        group = None if shown is None else shown.groups.get(block_id)
        if not group:
            return ""
        blocks = self._blocks
        return " -> ".join(x.name if (x := blocks.get(m)) is not None else str(m) for m, _ in group)

    def detached(self, block_id: int) -> None:
        """A block stopped reading from this shower (a value was set on it): the next view in which it
        changes attaches it again."""
        self._attached.discard(block_id)

    def apply(self, view: BuiltView, appends: Mapping[tuple[int, str], Any]) -> None:
        """Show ``view`` and the new graph's append outputs; clear the old graph's GPU numbers."""
        blocks = self._blocks
        shown = self.shown
        if shown is not None and view.base == shown.serial or shown is None and view.base is None:
            ids: Any = view.changed | self._away
        else:  # compared with another view than the one shown: every block
            ids = [b.id for b in blocks]
        away = set()
        self.shown = view  # what every block shown from here reads (``BlockDebugInfo.sizes``)
        attached = self._attached
        for bid in ids if not attached else {*ids} - attached:  # a growth changes every block: read, not written
            b = blocks.get(bid)
            if b is None or b not in blocks:  # removed (or inside a composite, never shown)
                if b is None:
                    away.add(bid)
                continue
            b.debug.show_from(self, bid)
            attached.add(bid)
        by_block: dict[int, dict[str, Any]] = {}
        for (bid, port), ab in appends.items():
            by_block.setdefault(bid, {})[port] = ab
        kept = set(by_block)
        for bid in self._appends | by_block.keys():
            b = blocks.get(bid)
            if b is not None and b in blocks:
                b.debug.append = by_block.get(bid, {})
            elif b is None:
                kept.add(bid)  # removed: cleared if it comes back
        self._appends = kept
        self._away = away
        if readings_shown() != self._readings:  # the old graph's GPU numbers (``show_on_blocks``) are gone
            self._readings = readings_shown()
            for b in blocks:
                d = b.debug
                if d.gpu_ms is not None or d.append_fill:
                    d.gpu_ms = d.runs = None
                    d.append_fill = {}
