"""The inside of an open composite in the node editor: its inner blocks as nodes, its inner links as
wires, a group around them, and each inner node's state from the composite's diagnostics.

A composite is one block of the patch (``blocks/composite.py``): the engine flattens it into its inner
blocks, files its diagnostics and GPU time under the composite, and the patch file names only the
composite. The editor shows it as one node; opened (``EditorModel.open``), its inner blocks are drawn
too, in a group with the composite's node, the way a region's body is (``GroupView`` of kind
``composite``). What is built here is a view, made when the patch or what is open changes:

- **Nodes** named by their path (``smooth/pass1``; an operator name never holds ``/``), laid out with
  the operators by ``auto_layout``, the open composite as a block of its own the way a region is (its
  node first, its inner nodes in columns beside it, room left for the group; operators without a
  stored position make room), or where the user dragged them in this session (offsets from the
  composite's node, not written anywhere). Pins and parameters as an operator's, each parameter
  with the value that runs: an exposed one the composite's value, not the file's.
- **Exposures**: an inner port or parameter the composite exposes carries its outer name
  (``NodeView.exposed``: ``{"Factor": "smooth.Gain"}``).
- **States**: ``refresh_inside`` puts each diagnostic of the composite on the inner node it is about (the
  engine keeps an inner kernel's compile error on the inner block's id, and names the inner block in a
  plan diagnostic it moved onto the composite: ``'smooth/pass1'`` or ``smooth/pass1: ...``), and each
  node's GPU time from ``EngineStats.block_ms``. Only open composites are refreshed: a closed one costs
  the frame nothing beyond its own node.

Pure: no imgui, no GPU; tested in ``tests/unit/test_editor_composites.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..blocks.composite import Composite
from .editor_layout import node_cell
from .editor_model import source_text
from .editor_views import GroupView, LinkView, NodeView, PinView, param_view, shown_state

__all__ = ["Inside", "finish_inside", "plan_inside", "refresh_inside"]


@dataclass
class Inside:
    """One open composite operator and what its inside shows (nested open composites included).

    ``plan_inside`` fills what the layout needs (``ops``, ``regions``, ``containers``, ``edges``,
    ``cells``: the editor lays them out with the operators, the composite as a block of its own like a
    region), ``finish_inside`` the views.

    Attributes:
        op: The composite operator.
        block: Its block when the views were made.
        layout: Its ``CompositeLayout`` then (a re-read composite file makes a new one: views are stale).
        views: Inner nodes by path (``smooth/pass1``, ``smooth/sub/x`` when ``smooth/sub`` is open too).
        links: Inner links between shown nodes.
        groups: A ``composite`` group per open composite (this one and nested open ones), outer first.
        leaves: Leaf block id -> the shown node holding it (itself, or a closed composite inside).
        names: ``(the engine's qualified name, shown node)`` of every leaf: plan diagnostics on the
            composite name the inner block by the first.
    """

    op: str
    block: Composite
    layout: Any
    views: dict[str, NodeView] = field(default_factory=dict)
    links: list[LinkView] = field(default_factory=list)
    groups: list[GroupView] = field(default_factory=list)
    leaves: dict[int, str] = field(default_factory=dict)
    names: list[tuple[str, str]] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    regions: dict[str, str] = field(default_factory=dict)  # inner node -> the open composite holding it
    containers: set[str] = field(default_factory=set)  # this composite and the open ones inside it
    edges: list[tuple[str, str, str, str]] = field(default_factory=list)  # inner links, exposed inputs
    cells: dict[str, tuple[float, float]] = field(default_factory=dict)
    made: list[tuple[str, str, Any, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    inner_links: list[tuple[str, str, str, str]] = field(default_factory=list)


def plan_inside(op: str, block: Composite, opened: set[str] | frozenset[str], region: str | None) -> Inside:
    """What open composite operator ``op`` (block ``block``, in region ``region``) shows inside: its
    inner nodes (and those of the open composites inside it: ``opened`` holds their paths), links,
    groups, and the items the layout places."""
    inside = Inside(op, block, block.layout)
    inside.containers.add(op)

    def expand(comp: Composite, path: str, qual: str, values: dict[str, Any], level: int, parent: str | None) -> None:
        layout = comp.layout
        if layout is None:
            return
        per_op: dict[str, dict[str, Any]] = {}  # what the composite's exposed values set inside it
        exposed: dict[str, dict[str, str]] = {}
        own = path.rsplit("/", 1)[-1]
        for e in layout.exposures.values():
            for local, name in e.targets:
                exposed.setdefault(local, {})[name] = f"{own}.{e.name}"
                if e.kind == "param" and e.name in values:
                    per_op.setdefault(local, {})[name] = values[e.name]
                if e.kind == "input":  # laid out after the composite's own node, as if it fed them
                    inside.edges.append((path, e.name, f"{path}/{local}", name))
        members = []
        for local, inner in layout.blocks.items():
            p, q = f"{path}/{local}", f"{qual}/{local}"
            members.append(p)
            inside.ops.append(p)
            inside.regions[p] = path
            inside.cells[p] = node_cell(inner.description)
            inner_values = {k: prm.value for k, prm in inner.params.items()}
            inner_values.update(per_op.get(local, {}))
            inside.made.append((p, path, inner, inner_values, exposed.get(local, {})))
            if isinstance(inner, Composite):
                if p in opened and inner.layout is not None:
                    inside.containers.add(p)
                    expand(inner, p, q, inner_values, level + 1, path)
                else:
                    for sub, leaf in inner.inner_blocks():
                        inside.leaves[leaf.id] = p
                        inside.names.append((f"{q}/{sub}", p))
            else:
                inside.leaves[inner.id] = p
                inside.names.append((q, p))
        for lk in layout.links:
            key = (f"{path}/{lk.src}", lk.src_port, f"{path}/{lk.dst}", lk.dst_port)
            inside.inner_links.append(key)
            inside.edges.append(key)
        inside.groups.append(GroupView(path, "composite", tuple(members), parent, level))

    expand(block, op, block.name, {k: prm.value for k, prm in block.params.items()}, 0, region)
    return inside


def finish_inside(
    inside: Inside,
    view: NodeView,
    *,
    laid: Mapping[str, tuple[float, float]],
    offsets: Mapping[str, tuple[float, float]],
    type_names: Mapping[type, tuple[str, str]],
    link_view: Callable[[Any, str, str, str, str, str], LinkView],
    depth: int,
) -> None:
    """The views of ``inside`` (planned by ``plan_inside``), now that the layout placed its items.

    Args:
        inside: What ``plan_inside`` made.
        view: The composite operator's node.
        laid: The layout's positions (the composite's node among them): an inner node goes where the
            layout put it relative to the composite's node, wherever that node is drawn.
        offsets: Inner node path -> where the user put it, from the composite's node.
        type_names: Block class -> ``(registered type name, doc)``.
        link_view: ``(source block, source path, port, destination path, port, element type) -> LinkView``
            with the wire's sizes.
        depth: The depth of the composite's group (the regions around it).
    """
    inside.groups = sorted((replace(g, depth=g.depth + depth) for g in inside.groups), key=lambda g: g.depth)
    x0, y0 = view.position
    cx, cy = laid.get(inside.op, (x0, y0))
    by_path = {p: inner for p, _, inner, _, _ in inside.made}
    for p, container, inner, inner_values, exposed in inside.made:
        at = offsets.get(p)
        if at is None:
            lx, ly = laid.get(p, (cx, cy))
            at = (lx - cx, ly - cy)
        desc = inner.description
        type_name, doc = type_names.get(type(inner), (desc.type_name, ""))
        nested = isinstance(inner, Composite)
        inside.views[p] = NodeView(
            name=p,
            type=type_name,
            doc=doc,
            position=(x0 + at[0], y0 + at[1]),
            inputs=tuple(PinView(p, s.name, "in", str(s.pin_type), s.description) for s in desc.inputs),
            outputs=tuple(PinView(p, s.name, "out", str(s.pin_type), s.description) for s in desc.outputs),
            params=tuple(param_view(s, inner_values.get(s.name, s.default)) for s in desc.params),
            block_id=inner.id,
            inner=sum(1 for _ in inner.inner_blocks()) if nested else 0,
            generates=hasattr(type(inner), "generated_code"),
            composite=container,
            exposed=exposed,
            opened=p in inside.containers,
            source=source_text(inner) if nested else "",
        )
    for src, sp, dst, dp in inside.inner_links:
        out = by_path[src].description.output(sp)
        inside.links.append(link_view(by_path[src], src, sp, dst, dp, str(out.pin_type) if out is not None else ""))


def refresh_inside(
    inside: Inside,
    top: NodeView,
    diags: Any,
    block_ms: Mapping[int, float] | None,
    compiling: frozenset[int] = frozenset(),
) -> None:
    """Each inner node's state and message from the composite's diagnostics ``diags``, and its GPU time
    from ``block_ms`` (``EngineStats.block_ms``; None: not measured). A node with no diagnostic of its
    own is OK, or not compiled yet while its composite is not; one whose kernel compiles (its block id in
    ``compiling``, ``KernelTracker.compiling``) is Compiling (``shown_state``). An open nested composite's
    node shows what its inside has."""
    per: dict[str, list[Any]] = {}
    for d in diags:
        target = inside.leaves.get(d.block_id) if d.block_id is not None else None
        if target is None:
            message = d.message
            target = next((p for q, p in inside.names if message.startswith(f"{q}: ") or f"'{q}'" in message), None)
        while target is not None and target != inside.op:  # the node, then the open composites around it
            per.setdefault(target, []).append(d)
            target = target.rsplit("/", 1)[0]
    busy: set[str] = set()  # nodes with a leaf compiling: the leaf's node, then the open composites around it
    for bid in compiling:
        target = inside.leaves.get(bid)
        while target is not None and target != inside.op:
            busy.add(target)
            target = target.rsplit("/", 1)[0]
    # The composite runs (OK, or Compiling an edit while the previous version runs) or it does not yet.
    waiting = top.block_state == "NotCompiled"
    base = "NotCompiled" if waiting else "OK"
    for path, view in inside.views.items():
        found = per.get(path)
        state = base
        if found:
            errors = any(d.severity == "error" for d in found)
            state = "Error" if errors else "Warning" if any(d.severity == "warning" for d in found) else base
            view.message = "; ".join(d.message for d in found)
        else:
            view.message = ""
        view.block_state = state
        view.state, view.compiling = shown_state(state, path in busy)
        view.gpu_ms = block_ms.get(view.block_id) if block_ms else None
