"""Realizing child-graph groups: the nodes of a composite with ``child_graph`` inside one CUDA
child-graph node (``compiler/child_graphs.py`` decides the groups).

The child node is added with an empty graph, and its nodes go straight into the graph the node
embeds (``cuGraphChildGraphNodeGetGraph`` returns it without a copy; changes to it are the node's),
so every kernel node keeps a handle in that embedded graph and its own pinned parameter storage.

Updates: a kernel node inside a child graph is patched through its embedded graph, the documented
route: ``cuGraphKernelNodeSetParams`` on the embedded node, then one
``cuGraphExecChildGraphNodeSetParams`` per touched child node (same topology, so the executable takes
the new parameters in place, no re-instantiation). Hot, Warm and Code edits of inner blocks stay in
their tiers. Library calls are never put in a child graph (the compiler runs such a composite
flattened), and profiling nodes inside a group hang on plain edges, not programmatic ones.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from ..kernels._driver import check, driver
from .nodes import KernelNode, NodeBuild, RuntimeNode, add_node
from .plan import ChildGraphPlan, GraphPlan

__all__ = ["ChildGraphNode", "add_grouped_nodes", "commit_child_nodes"]


class ChildGraphNode:
    """A child-graph node of an executable graph: its handle in the parent graph and the graph it embeds."""

    __slots__ = ("handle", "graph", "plan")

    def __init__(self, handle: Any, graph: Any, plan: ChildGraphPlan) -> None:
        self.handle = handle
        self.graph = graph
        self.plan = plan


def _units(plan: GraphPlan, group_of: dict[int, int]) -> list[tuple[str, int]]:
    """Plan nodes and groups in an order where every unit comes after those it depends on (Kahn's
    algorithm over the units, ties by the smallest plan index, so plans without groups keep their order)."""

    def unit(i: int) -> tuple[str, int]:
        g = group_of.get(i)
        return ("n", i) if g is None else ("g", g)

    first: dict[tuple[str, int], int] = {}
    for n in plan.nodes:
        first.setdefault(unit(n.index), n.index)
    indegree: dict[tuple[str, int], int] = dict.fromkeys(first, 0)
    succ: dict[tuple[str, int], set[tuple[str, int]]] = {}
    for n in plan.nodes:
        u = unit(n.index)
        for dep in n.deps:
            v = unit(dep)
            if v != u and u not in succ.setdefault(v, set()):
                succ[v].add(u)
                indegree[u] += 1
    ready = [(first[u], u) for u, deg in indegree.items() if deg == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, u = heapq.heappop(ready)
        out.append(u)
        for v in succ.get(u, ()):
            indegree[v] -= 1
            if indegree[v] == 0:
                heapq.heappush(ready, (first[v], v))
    if len(out) != len(first):  # the compiler refuses such groups; this is a guard, not a path
        raise ValueError("child-graph groups of the plan depend on each other in a cycle")
    return out


def _unique(handles: Iterable[Any]) -> list[Any]:
    """``handles`` without repeats: every node of a group stands for the one child handle object."""
    seen: set[int] = set()
    out = []
    for h in handles:
        if id(h) not in seen:
            seen.add(id(h))
            out.append(h)
    return out


def add_grouped_nodes(
    build: NodeBuild, plan: GraphPlan, edges: dict[int, dict[int, str]], add_programmatic: Any
) -> list[RuntimeNode]:
    """Add every node of ``plan`` to ``build.graph``, the grouped ones inside their child-graph nodes.

    Args:
        build: The graph under construction.
        plan: The plan, with ``children``.
        edges: Its programmatic edges (``plan.programmatic_edges``); edges touching a group become plain.
        add_programmatic: ``(graph, node, [(from, port)])`` adding programmatic edges.

    Returns:
        The runtime node of each plan node, by plan index.

    Raises:
        CudaError: a driver call failed (everything added belongs to ``build.graph``).
        KernelLoadError, LibraryCallError: as ``add_node``.
    """
    d = driver()
    group_of = {i: g for g, cp in enumerate(plan.children) for i in cp.nodes}
    own: dict[int, Any] = {}  # plan index -> handle in the graph the node is in
    seen_from_outside: dict[int, Any] = {}  # plan index -> what a node outside its group waits for
    runtime: list[RuntimeNode] = [None] * len(plan.nodes)
    nodes = plan.nodes
    for kind, ref in _units(plan, group_of):
        if kind == "n":
            node = nodes[ref]
            special = {j: p for j, p in edges.get(ref, {}).items() if j not in group_of} if ref not in group_of else {}
            deps = _unique(seen_from_outside[j] for j in node.deps if j not in special)
            h, rt = add_node(build, node, deps)
            if special:
                add_programmatic(build.graph, h, [(own[j], port) for j, port in special.items()])
            own[ref] = seen_from_outside[ref] = h
            runtime[ref] = rt
            continue
        cp = plan.children[ref]
        inside = set(cp.nodes)
        outside = _unique(seen_from_outside[j] for i in cp.nodes for j in nodes[i].deps if j not in inside)
        empty = check(d.cuGraphCreate(0), "cuGraphCreate")
        try:
            child = check(
                d.cuGraphAddChildGraphNode(build.graph, outside, len(outside), empty),
                "cuGraphAddChildGraphNode",
                block=cp.name,
            )
        finally:
            check(d.cuGraphDestroy(empty), "cuGraphDestroy")  # the node holds its own copy
        embedded = check(d.cuGraphChildGraphNodeGetGraph(child), "cuGraphChildGraphNodeGetGraph", block=cp.name)
        holder = ChildGraphNode(child, embedded, cp)
        sub = replace(build, graph=embedded)
        for i in cp.nodes:
            h, rt = add_node(sub, nodes[i], _unique(own[j] for j in nodes[i].deps if j in inside))
            if isinstance(rt, KernelNode):
                rt.child = holder
            own[i] = h
            seen_from_outside[i] = child
            runtime[i] = rt
    return runtime


def commit_child_nodes(exec_: Any, touched: list[KernelNode]) -> None:
    """Patch kernel nodes that sit inside child graphs: each embedded node, then each child node once.

    Raises:
        CudaError: the driver refused an update.
    """
    d = driver()
    children: dict[int, ChildGraphNode] = {}
    for kn in touched:
        check(
            d.cuGraphKernelNodeSetParams(kn.handle, kn.params), "cuGraphKernelNodeSetParams", kernel=kn.plan.entry_point
        )
        children[id(kn.child)] = kn.child
    for c in children.values():
        check(
            d.cuGraphExecChildGraphNodeSetParams(exec_, c.handle, c.graph),
            "cuGraphExecChildGraphNodeSetParams",
            block=c.plan.name,
        )
