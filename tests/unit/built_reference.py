"""The whole-patch reference of what a build shows on its blocks: every block written from the plan.
The engine applies the same as differences worked out on the build thread (``engine.built_view``);
tests check the two agree."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cudapatch.engine.plan import GraphPlan
from cudapatch.engine.registry import BlockRegistry


def built_rows(plan: GraphPlan, appends: Mapping[tuple[int, str], Any], blocks: BlockRegistry) -> dict[int, tuple]:
    """What every registered block must show after a build, written nowhere: block id -> (sizes,
    shapes, fused, append outputs, GPU ms, append fill), the GPU numbers cleared."""
    sizes: dict[int, dict[str, int]] = {}
    mem = plan.memory
    for (bid, port), bi in plan.outputs.items():  # a value's own count: a shared buffer holds several
        vi = mem.ports.get((bid, port)) if mem is not None else None
        sizes.setdefault(bid, {})[port] = mem.values[vi].count if vi is not None else plan.buffers[bi].count  # type: ignore[union-attr]
    shapes: dict[int, dict[str, Any]] = {}
    for (bid, port), shape in plan.shapes.items():
        shapes.setdefault(bid, {})[port] = shape
    by_block: dict[int, dict[str, Any]] = {}
    for (bid, port), ab in appends.items():
        by_block.setdefault(bid, {})[port] = ab
    fused = _fused_groups(plan, blocks)
    return {
        b.id: (sizes.get(b.id, {}), shapes.get(b.id, {}), fused.get(b.id, ""), by_block.get(b.id, {}), None, {})
        for b in blocks
    }


def show_built(plan: GraphPlan, appends: Mapping[tuple[int, str], Any], blocks: BlockRegistry) -> None:
    """After a build, set what ``str(block)`` shows of it (``built_rows``): append outputs and output
    sizes; the GPU numbers of the old graph are cleared (the next ``show_on_blocks`` fills them)."""
    rows = built_rows(plan, appends, blocks)
    for b in blocks:
        d = b.debug
        d.sizes, d.shapes, d.fused, d.append, d.gpu_ms, d.append_fill = rows[b.id]


def _fused_groups(plan: GraphPlan, blocks: BlockRegistry) -> dict[int, str]:
    """Block id → its fused group as ``"a -> b -> c"``, for the blocks that run in a fused kernel."""
    out: dict[int, str] = {}
    for node in plan.kernel_nodes:
        members = getattr(node.source, "members", ())
        if members:
            text = " -> ".join(b.name if (b := blocks.get(m)) is not None else str(m) for m in members)
            out.update(dict.fromkeys(members, text))
    return out
