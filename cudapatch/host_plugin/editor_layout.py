"""Where the node editor puts things: positions for operators that have none (``auto_layout``, by
link depth and region), the room a node takes (``node_cell``), and the rectangles of region and
composite groups around what they hold (``group_rects``). Pure geometry over names and sizes."""

from __future__ import annotations

from typing import Any

from .editor_views import GroupView, Rect

__all__ = ["auto_layout", "group_rects", "node_cell"]


#: Auto layout: a node's cell (node width and the gap to the next column, a row's height) and the room
#: a group takes around what it holds (its title strip above, a margin all round).
_CELL = (300.0, 220.0)
_GROUP_PAD = 40.0
_GROUP_TITLE = 48.0


def auto_layout(
    ops: list[str],
    links: list[tuple[str, str, str, str]],
    regions: dict[str, str] | None = None,
    containers: set[str] | frozenset[str] = frozenset(),
    cells: dict[str, tuple[float, float]] | None = None,
) -> dict[str, tuple[float, float]]:
    """Positions for operators that have none: columns by link depth (sources left), rows in order.

    Region-aware: a region in ``containers`` (operators of ``ops`` that are regions) is laid out as one
    block of its scope, its own node first and the operators it holds (``regions``: operator -> region)
    in columns inside it, with room for the group drawn around them; a link into or out of a region's
    body counts as a link of the region in the scope around it. ``cells``: the room an operator's node
    takes with the gaps around it (default: a 300 x 220 cell), so tall or wide nodes do not overlap."""
    regions = regions or {}
    cells = cells or {}
    inside = set(ops)

    def parent(op: str) -> str | None:  # the nearest enclosing region that is laid out here
        seen = {op}
        r = regions.get(op)
        while r is not None and (r not in inside or r not in containers):
            if r in seen:
                return None
            seen.add(r)
            r = regions.get(r)
        return r

    parents = {op: parent(op) for op in ops}
    scopes: dict[str | None, list[str]] = {}
    for op in ops:
        scopes.setdefault(parents[op], []).append(op)

    def item(op: str, scope: str | None) -> str | None:  # ``op``'s stand-in in ``scope``: itself or a region holding it
        cur: str | None = op if op in inside else None
        for _ in range(len(ops)):
            if cur is None or parents[cur] == scope:
                return cur
            cur = parents[cur]
        return None

    blocks: dict[str, tuple[float, float]] = {}  # a region holding operators: the size of its block
    columns: dict[str | None, list[list[str]]] = {}

    def measure(scope: str | None) -> tuple[float, float]:
        members = ([scope] if scope is not None else []) + scopes.get(scope, [])
        depth = dict.fromkeys(members, 0)
        edges = []
        for src, _, dst, _ in links:
            a, b = item(src, scope), item(dst, scope)
            if a in depth and b in depth and a != b and b != scope:
                edges.append((a, b))
        depth = _depths(members, edges)
        cols: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
        for op in members:
            cols[depth[op]].append(op)
        columns[scope] = cols
        w = h = 0.0
        for col in cols:
            cw = ch = 0.0
            for op in col:
                if op != scope and op in scopes:
                    iw, ih = measure(op)
                    blocks[op] = (iw + 2 * _GROUP_PAD, ih + _GROUP_TITLE + 2 * _GROUP_PAD)
                size = blocks[op] if op != scope and op in blocks else cells.get(op, _CELL)
                cw, ch = max(cw, size[0]), ch + size[1]
            w, h = w + cw, max(h, ch)
        return w, h

    out: dict[str, tuple[float, float]] = {}

    def place(scope: str | None, x0: float, y0: float) -> None:
        x = x0
        for col in columns[scope]:
            y, cw = y0, 0.0
            for op in col:
                out[op] = (x, y)
                size = cells.get(op, _CELL)
                if op != scope and op in blocks:  # its own node goes first inside its block
                    place(op, x + _GROUP_PAD, y + _GROUP_TITLE + _GROUP_PAD)
                    size = blocks[op]
                cw = max(cw, size[0])
                y += size[1]
            x += cw

    measure(None)
    place(None, 40.0, 40.0)
    return out


def node_cell(desc: Any) -> tuple[float, float]:
    """The room a node of ``desc`` takes in the auto layout, from what the panel draws in it: title and
    state lines, a line per pin, a widget per parameter, a wider and taller editor for ``Code``."""
    code = any(p.name == "Code" and p.kind == "text" for p in desc.params)
    w = 336.0 if code else 216.0
    h = 50.0 + 17.0 * (len(desc.inputs) + len(desc.outputs)) + 23.0 * (len(desc.params) - code) + 165.0 * code
    return (max(_CELL[0], w + 84.0), max(_CELL[1], h + 40.0))


def _depths(members: list[str], edges: list[tuple[str, str]]) -> dict[str, int]:
    """Longest path from a source for each member, over ``edges`` less the ones that close a cycle (a
    FrameDelay's feedback: the engine allows a cycle through a delay), found by a depth-first walk in
    the members' order."""
    succ: dict[str, list[str]] = {m: [] for m in members}
    for a, b in edges:
        succ[a].append(b)
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    post: list[str] = []
    forward: dict[str, list[str]] = {m: [] for m in members}
    for root in members:
        if root in state:
            continue
        state[root] = 1
        stack = [(root, iter(succ[root]))]
        while stack:  # iterative: a long chain would overflow Python's recursion
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                state[node] = 2
                post.append(node)
                stack.pop()
            elif state.get(nxt) != 1:  # an edge back to the path closes a cycle: left out
                forward[node].append(nxt)
                if nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(succ[nxt])))
    depth = dict.fromkeys(members, 0)
    for node in reversed(post):  # a topological order of the edges kept
        for nxt in forward[node]:
            depth[nxt] = max(depth[nxt], depth[node] + 1)
    return depth


def group_rects(
    groups: dict[str, GroupView],
    rects: dict[str, Rect],
    *,
    margin: float = 16.0,
    frame: tuple[float, float, float, float] = (8.0, 40.0, 8.0, 8.0),
    widths: dict[str, float] | None = None,
) -> dict[str, Rect]:
    """Where each region's group goes: around the region's own node and the nodes it holds (a nested
    region: around its group), ``margin`` inside the group's area, and ``frame`` (left, top: the title
    strip, right, bottom) around the area for the group node's padding and title. ``rects`` are the
    nodes' rectangles (canvas units); ``widths`` the least width of a group (its title's). Returns each
    group node's rectangle; a group with no rectangle to go around is left out."""
    out: dict[str, Rect] = {}
    left, top, right, bottom = frame
    for g in sorted(groups.values(), key=lambda g: -g.depth):  # innermost first: the outer ones hold them
        boxes = [r for r in (out.get(op) or rects.get(op) for op in (g.region, *g.members)) if r is not None]
        if not boxes:
            continue
        x0 = min(b[0] for b in boxes) - margin - left
        y0 = min(b[1] for b in boxes) - margin - top
        x1 = max(b[2] for b in boxes) + margin + right
        y1 = max(b[3] for b in boxes) + margin + bottom
        if widths is not None and g.region in widths:
            x1 = max(x1, x0 + widths[g.region])
        out[g.region] = (x0, y0, x1, y1)
    return out
