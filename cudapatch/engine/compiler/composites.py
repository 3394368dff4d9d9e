"""The composites phase: what the plan says about a composite's inner blocks, said of the composite too.

The snapshot the compiler reads has composites flattened (``engine/composites.py``), so the plan is
keyed by the inner (leaf) blocks. The engine and hosts address the composite itself, so this phase
files under the composite's keys:

- its outputs and append outputs (``Engine.output(blur1, "Out")``);
- the scalar slots of every inner parameter an exposed parameter sets: a Hot edit of the composite's
  ``Radius`` patches the inner kernels' slots in place, with no rebuild;
- the binding slots and planned counts of the inner inputs an exposed input feeds (Warm rebinds);
- the composite in ``block_order`` when any of its blocks runs (its state is OK then);
- its GPU time at PerBlock and up: from the start of its first block to the end of its last;
- a probe given on one of its outputs, under the composite's key.

Diagnostics of inner blocks go on the registered composite holding them, naming the inner block
(its qualified name is in the message already) and the composite file and line that define it.
"""

from __future__ import annotations

from dataclasses import replace

from ..context import PatchSnapshot
from ..diagnostics import Diagnostic
from ..plan import GraphPlan, TimingPair
from .draft import PlanDraft

__all__ = ["attribute_diagnostics", "composite_keys"]


def attribute_diagnostics(draft: PlanDraft) -> None:
    """Move the errors and warnings recorded so far from inner blocks to their registered composite."""
    if not draft.snap.composites:
        return
    draft.errors[:] = attribute(draft.snap, draft.errors)
    draft.warnings[:] = attribute(draft.snap, draft.warnings)


def attribute(snap: PatchSnapshot, diags: list[Diagnostic] | tuple[Diagnostic, ...]) -> list[Diagnostic]:
    """``diags`` with each inner block's diagnostic put on the registered composite holding it."""
    tops = {c.id: c for c in snap.composites if c.top == c.id}
    where = {bid: (c.id, m) for c in tops.values() for bid, m in c.members.items()}
    out = []
    for d in diags:
        found = where.get(d.block_id) if d.block_id is not None else None
        if found is None:
            out.append(d)
            continue
        top, m = found
        at = f" ({m.file}{'' if m.line is None else f':{m.line}'})" if m.file else ""
        name = f"'{m.name}'"
        message = d.message if name in d.message else f"{m.name}: {d.message}"
        out.append(Diagnostic(d.severity, top, d.code, message + at))
    return out


def composite_keys(plan: GraphPlan, snap: PatchSnapshot) -> GraphPlan:
    """``plan`` with every composite's outputs, parameter and binding slots filed under its own keys."""
    if not snap.composites:
        return plan
    outputs, appends = dict(plan.outputs), dict(plan.appends)
    scalar_slots, binding_slots = dict(plan.scalar_slots), dict(plan.binding_slots)
    binding_counts = dict(plan.binding_counts)
    running = set(plan.block_order)
    order = list(plan.block_order)
    ports = dict(plan.memory.ports) if plan.memory is not None else {}  # buffer reuse: port -> value
    for c in snap.composites:
        for name, keys in c.outputs.items():
            for key in keys[:1]:
                if key in outputs:
                    outputs[(c.id, name)] = outputs[key]
                if key in ports:
                    ports[(c.id, name)] = ports[key]
                if key in appends:
                    appends[(c.id, name)] = appends[key]
        for name, keys in c.params.items():
            slots = tuple(s for key in keys for s in plan.scalar_slots.get(key, ()))
            if slots:
                scalar_slots[(c.id, name)] = slots
        for name, keys in c.inputs.items():
            slots = tuple(s for key in keys for s in plan.binding_slots.get(key, ()))
            if slots:
                binding_slots[(c.id, name)] = slots
            counts = [plan.binding_counts[k] for k in keys if k in plan.binding_counts]
            if counts:
                binding_counts[(c.id, name)] = counts[0]
        if c.top == c.id and running & c.members.keys():
            order.append(c.id)
    probes = plan.probes
    for c in snap.composites:  # a probe given on the composite reads as the composite's
        for name in c.probed:
            leaf = c.outputs[name][0]
            probes = tuple((c.id, name) if k == leaf else k for k in probes)
    return replace(
        plan,
        memory=replace(plan.memory, ports=ports) if plan.memory is not None else None,
        probes=probes,
        block_order=tuple(order),
        timings=plan.timings + _spans(plan, snap),
        diagnostics=tuple(attribute(snap, plan.diagnostics)),
        outputs=outputs,
        appends=appends,
        scalar_slots=scalar_slots,
        binding_slots=binding_slots,
        binding_counts=binding_counts,
    )


def _spans(plan: GraphPlan, snap: PatchSnapshot) -> tuple[TimingPair, ...]:
    """A composite's GPU time: from the start of its first block that runs to the end of its last."""
    pairs = {p.key: p for p in plan.timings if p.kind == "block"}
    if not pairs:
        return ()
    rank = {bid: i for i, bid in enumerate(plan.block_order)}
    out = []
    for c in snap.composites:
        timed = sorted((rank[b], pairs[b]) for b in c.members if b in pairs and b in rank)
        if timed:
            out.append(TimingPair("block", c.id, timed[0][1].start, timed[-1][1].end))
    return tuple(out)
