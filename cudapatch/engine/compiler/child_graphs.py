"""The child-graph phase: a composite with ``child_graph`` becomes one group of plan nodes that
``realize`` puts inside one CUDA child-graph node.

The group is the composite's nodes, plus the profiling nodes (timestamps) and zero-fill memsets that
lie between them, and the timestamps that wait only for its nodes (a block's end stamp: inside, it
reads the time the block ends, not the time the whole child graph does). A group can be realized
only if no other block's work lies between its nodes: a child-graph node runs as one unit, so a
block outside that reads one inner output and feeds another inner input would be a cycle. Then,
for a composite holding captured library calls (whose re-capture replaces a child graph of the
running graph, done for top-level nodes only), and for one holding a FrameDelay or using a delay's
buffers (the two phases patch those nodes one by one: ``engine/phases.py``), the composite runs
flattened with a ``child-graph`` warning saying why.
Nested child-graph composites are part of the outermost one's group.
"""

from __future__ import annotations

from dataclasses import replace

from ..context import PatchSnapshot
from ..diagnostics import Diagnostic, DiagnosticCode
from ..plan import CapturedNodePlan, ChildGraphPlan, GraphPlan, MemsetNodePlan, StampNodePlan

__all__ = ["child_graphs"]


def child_graphs(plan: GraphPlan, snap: PatchSnapshot) -> GraphPlan:
    """``plan`` with a ``ChildGraphPlan`` for every composite that asks for a child graph and can have one."""
    wanted = [c for c in snap.composites if c.child_graph]
    if not wanted:
        return plan
    nodes = plan.nodes
    dependents: dict[int, list[int]] = {}
    for n in nodes:
        for dep in n.deps:
            dependents.setdefault(dep, []).append(n.index)
    taken: set[int] = set()
    groups: list[ChildGraphPlan] = []
    warnings: list[Diagnostic] = []
    for c in sorted(wanted, key=lambda c: -len(c.members)):  # outermost first
        if taken & c.members.keys():
            continue  # inside a child-graph composite already
        taken |= c.members.keys()
        members = {i for bid in c.members for i in plan.block_nodes.get(bid, ())}
        if not members:
            continue
        why = _refusal(plan, c.members.keys(), members, dependents, snap)
        if isinstance(why, str):
            warnings.append(
                Diagnostic("warning", c.top, DiagnosticCode.CHILD_GRAPH, f"'{c.name}' runs flattened: {why}")
            )
            continue
        group = members | why
        # A block's end stamp waits only for the block's work: inside, it reads the time that work ends.
        group |= {i for m in members for i in dependents.get(m, ()) if _stamp_on(nodes[i], group)}
        groups.append(ChildGraphPlan(c.id, c.name, tuple(sorted(group))))
    return replace(plan, children=tuple(groups), diagnostics=plan.diagnostics + tuple(warnings))


def _refusal(
    plan: GraphPlan,
    blocks: set[int] | object,
    members: set[int],
    dependents: dict[int, list[int]],
    snap: PatchSnapshot,
) -> str | set[int]:
    """Why the nodes ``members`` cannot be one child graph, or the nodes between them to pull in."""
    nodes = plan.nodes
    for i in members:
        if isinstance(nodes[i], CapturedNodePlan):
            return f"it holds a library call ('{nodes[i].entry_point}'), which is re-captured only outside child graphs"
    if plan.delays and _touches_delays(plan, members):
        return "it holds a FrameDelay or uses one's buffers, which alternate every frame outside child graphs only"
    # Node indices are a launch order: a node between two members, and every node on a path from one
    # to it or from it to one, lies between the first member and the last; the walks stay there.
    lo, hi = min(members), max(members)
    after = _reach(members, lambda i: [j for j in dependents.get(i, ()) if j < hi])
    before = _reach(members, lambda i: [j for j in nodes[i].deps if j > lo])
    between = (after & before) - members
    for i in sorted(between):
        n = nodes[i]
        if isinstance(n, StampNodePlan) or (isinstance(n, MemsetNodePlan) and n.buffer is not None):
            continue
        owner = next((bid for bid, idx in plan.block_nodes.items() if i in idx), None)
        who = next((b.name for b in snap.blocks if b.id == owner), "another block")
        return f"'{who}' reads one of its outputs and feeds one of its inputs, so it cannot run as one node"
    return between


def _touches_delays(plan: GraphPlan, members: set[int]) -> bool:
    """Whether a node of ``members`` is a delay's init node or reads or writes a delay's pair: the two
    phases patch those nodes one by one in the executable graphs (``engine/phases.py``)."""
    if {dp.node for dp in plan.delays} & members:
        return True
    swaps = plan.swaps
    for i in members:
        n = plan.nodes[i]
        if any(a.kind == "buffer" and a.ref in swaps for a in getattr(n, "args", ())):
            return True
        if getattr(n, "buffer", None) in swaps:
            return True
    return False


def _stamp_on(node: object, group: set[int]) -> bool:
    return isinstance(node, StampNodePlan) and bool(node.deps) and set(node.deps) <= group


def _reach(start: set[int], step) -> set[int]:  # type: ignore[no-untyped-def]
    seen: set[int] = set()
    stack = list(start)
    while stack:
        for j in step(stack.pop()):
            if j not in seen:
                seen.add(j)
                stack.append(j)
    return seen
