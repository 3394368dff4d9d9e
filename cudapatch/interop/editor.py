"""The node editor panel: the running patch drawn with imgui-node-editor, edited through ``EditorModel``.

Every operator is a node (title coloured by its state, type, GPU time, append fill, diagnostic
text; a block whose kernel compiles, at its first compile or after a ``Code`` edit, is ``Compiling``,
its state line's tooltip saying what runs meanwhile), its ports are pins, its parameters are widgets
chosen by ``ParamView.widget`` (sliders with the declared ranges, checkboxes, enums, colour pickers, a
multi-line ``Code`` editor whose compile errors are marked at their line: tinted, a red bar, a tick at
the column, and listed below as ``line:column``; a block that generates its kernel, an Expression, can
show its generated code). Wires and pins show dtype, shape, element count and bytes on hover. Dragging
from a pin to a pin connects (a refused link turns red and shows the reason; dropped there, the pin it
was dropped on keeps a red dot and the reason as its tooltip until the next edit:
``EditorModel.refusals``, cycles the engine finds included); Delete removes the
selection, the wire menu's **Unlink** removes a wire, and so does dragging from a linked input pin into
empty space and releasing there. The node menu renames and bypasses, the background menu opens the
block browser (``EditorModel.browse``: every registered type, plugins' too, grouped by category,
searchable by name and docstring words, each with its docstring's first line). Ctrl+Z / Ctrl+Y undo
and redo; F2 shows or hides the panel (F1 stays the overlay).

A region (If, While, For) is a group: a tinted frame titled with its name, kind and state (a loop's
iterations in the newest completed frame, a While stopped at ``Max`` in the warning colour) around the
region's own node and the nodes it holds, nested regions nested (zoomed out, its title also large
above it). The model says which nodes a region
holds; the panel sizes the group around where they are (``group_rects``) whenever one of them moved or
changed size, and dragging the group's title drags them along (imgui-node-editor moves every node
inside a group with it), stored as one edit. The node menu moves a node into a region or out of its
region (``EditorModel.place``); a group's menu is its region's, plus adding a block inside it. A
composite is one node (its type and number of inner blocks); its **Open** button (or a double-click,
or its menu) draws its inside in place as a group of the same code: its inner blocks as nodes with
their states, messages and GPU times, its inner links as wires, exposed pins and parameters marked with
their outer names. The inside is read-only (its parameters drawn disabled, deleting or linking refused
with the reason in the status line), except an exposed parameter, which sets the composite's;
**Close** (or a double-click on the node or its group) draws it as one node again.

Selecting a wire probes it (``EditorModel.probe``, a probe node in the graph): a window shows its
min, max, mean and NaN/Inf counts (and a thumbnail for an image) from the newest completed frame;
a probed wire is drawn orange, and red while its buffer holds a NaN or an Inf. The wire's menu
removes the probe.

**Cost.** Only what the panel's window shows is drawn: a node whose last measured rectangle is
outside the visible canvas is not submitted at all, or, when a drawn wire ends at it, submitted as
a stub of the same size holding only its pins at their measured places. Labels and colours are
made once per patch version, not per frame. Zoomed out, a compact node measured the same over two
draws is drawn from that geometry (no group, no per-pin vectors, no editor queries), and the visible
wires go out from a batch of ready-made ids. (``benchmarks/bench_editor.py``: the CPU time per frame
of a 100-node patch, ≤ 1 ms.)

The panel calls only the model's actions and draws inside the overlay's imgui frame
(``Overlay(panels=[panel.draw])``). Per frame it reads views the model rebuilds only after edits;
after drawing it records where each node, title and pin landed (``layout``), which the GL tests
compare with the pixels of the rendered frame.

**Parts.** ``EditorPanel`` (here) keeps the panel's state and draws the frame: culling, nodes (full,
compact, stubs), pins, wires. Its bases do one job each: ``EditorGroups`` (``editor_groups.py``) the
groups of regions and open composites, ``EditorWidgets`` (``editor_widgets.py``) the parameter widgets
and the Code editor, ``EditorMenus`` (``editor_menus.py``) menus, the block browser, linking and
deleting, double clicks, the probe window and stored moves. Colours and the node width are in
``editor_style.py``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..host_plugin.editor_model import EditorModel
from ..host_plugin.editor_views import NodeView
from .editor_groups import EditorGroups
from .editor_menus import EditorMenus
from .editor_style import GROUP_COLORS, LINK_COLOR, NODE_WIDTH, PROBE_COLOR, REFUSED_COLOR, STATE_COLORS
from .editor_widgets import EditorWidgets

__all__ = [
    "EditorPanel",
    "EditorLayout",
    "STATE_COLORS",
    "LINK_COLOR",
    "PROBE_COLOR",
    "REFUSED_COLOR",
    "GROUP_COLORS",
]

_MARGIN = 40.0  # canvas units around the visible area that count as visible (pins stick out of nodes)
#: Zoomed out beyond this (canvas units per screen pixel), nodes are drawn compact: title and pins, no
#: parameter widgets or pin labels (unreadable at that size, and most of a node's cost).
_COMPACT_ZOOM = 1.6
#: A refused pin's red dot (canvas units): its radius, and how far its centre is from the wire's end.
_MARK_RADIUS, _MARK_GAP = 4.5, 6.0


@dataclass
class _Geometry:
    """Where a node's parts were, measured at its last full draw, relative to its content's origin
    (canvas units): what a stub needs to stand in for it, and what culling tests."""

    content: tuple[float, float]  # content size
    size: tuple[float, float]  # node size (content and padding)
    pins: dict[tuple[str, str], tuple[float, float, float, float, float]]  # (port, dir) -> x0, y0, x1, y1, pivot x


class EditorLayout:
    """Where the last frame drew things, in window pixels (top-left origin): node rectangles,
    title text positions, pin centres (``(op, port, direction)``).

    Nodes drawn from their compact geometry are recorded as where their content started and worked out
    into these tables only when someone reads them (the GL tests): a frame pays one entry per node."""

    def __init__(self, to_screen: tuple[float, float, float] = (0.0, 0.0, 1.0)) -> None:
        self._nodes: dict[str, tuple[float, float, float, float]] = {}
        self._titles: dict[str, tuple[float, float]] = {}
        self._pins: dict[tuple[str, str, str], tuple[float, float]] = {}
        self._to_screen = to_screen  # canvas -> screen: x = sx + cx * k, y = sy + cy * k
        self._compact: list[tuple[str, float, float, tuple]] = []  # (op, content origin x, y, geometry)
        #: Centres of the red dots of pins whose link was refused (``EditorModel.refusals``), by
        #: ``(op, port, direction)``: beside the pin's wire end, outside the node's text.
        self.refused: dict[tuple[str, str, str], tuple[float, float]] = {}
        #: Group rectangles ``(x0, y0, x1, y1)`` by region operator, and where their titles start.
        self.groups: dict[str, tuple[float, float, float, float]] = {}
        self.group_titles: dict[str, tuple[float, float]] = {}

    def _expanded(self) -> EditorLayout:
        if self._compact:
            sx, sy, k = self._to_screen
            for op, ox, oy, (_, rows, (dx, dy), (w, h)) in self._compact:
                x, y = ox - dx, oy - dy
                self._nodes[op] = (sx + x * k, sy + y * k, sx + (x + w) * k, sy + (y + h) * k)
                self._titles[op] = (sx + ox * k, sy + oy * k)
                for key, _, _, _, px, cy in rows:
                    self._pins[key] = (sx + (ox + px) * k, sy + (oy + cy) * k)
            self._compact = []
        return self

    @property
    def nodes(self) -> dict[str, tuple[float, float, float, float]]:
        """Node rectangles ``(x0, y0, x1, y1)`` by operator."""
        return self._expanded()._nodes

    @property
    def titles(self) -> dict[str, tuple[float, float]]:
        """Where each node's title text starts, by operator."""
        return self._expanded()._titles

    @property
    def pins(self) -> dict[tuple[str, str, str], tuple[float, float]]:
        """Pin centres (the wire's end) by ``(op, port, direction)``."""
        return self._expanded()._pins


class EditorPanel(EditorGroups, EditorWidgets, EditorMenus):
    """Draws an ``EditorModel`` with imgui-node-editor inside an imgui frame.

    Args:
        model: The model whose actions the panel calls.
        visible: Shown at start (F2 toggles).
        rect: ``(x, y, w, h)`` of the panel's window at first use (None: the right 62% of the display).
    """

    def __init__(
        self, model: EditorModel, *, visible: bool = True, rect: tuple[float, float, float, float] | None = None
    ) -> None:
        from imgui_bundle import imgui
        from imgui_bundle import imgui_node_editor as ed

        self._imgui, self._ed = imgui, ed
        self.model = model
        self.visible = visible
        self.rect = rect
        self.layout = EditorLayout()
        self._ctx: Any = None
        self._ids = itertools.count(1)
        self._node_ids: dict[str, int] = {}
        self._pin_ids: dict[tuple[str, str, str], int] = {}
        self._pins_by_id: dict[int, tuple[str, str, str]] = {}
        self._link_ids: dict[tuple[str, str, str, str], int] = {}
        self._links_by_id: dict[int, tuple[str, str, str, str]] = {}
        self._placed: dict[str, tuple[float, float]] = {}
        self._search = ""
        self._new_at = (0.0, 0.0)
        self._menu_op = ""
        self._rename_text = ""
        self._refusal = ""
        self._refused: dict[tuple[str, str], str] = {}  # the model's refusals, read once per frame
        self._refused_drag: tuple[str, str, str, str] | None = None  # a refused link under the held mouse
        self._red = imgui.color_convert_float4_to_u32(imgui.ImVec4(*REFUSED_COLOR))
        self._code_draft: tuple[str, str] | None = None
        self._geometry: dict[str, _Geometry] = {}
        self._rects: dict[str, tuple[float, float, float, float]] = {}  # op -> canvas rectangle, last known
        self._placed_version = -1
        self._vis_key: Any = None
        self._vis: tuple[set[str], set[str], list[Any]] = (set(), set(), [])
        self._wire_batch: tuple[list[Any], list[Any]] | None = None  # (wires, their ready-made ids)
        self._labels: dict[str, tuple] = {}  # op -> per-version strings and sizes (see ``_node_labels``)
        self._labels_version = -1
        #: op -> what a compact node needs (see ``_compact_node``), once two draws measured it the same.
        self._compact: dict[str, tuple] = {}
        self._compact_seen: dict[str, tuple] = {}  # op -> its last compact measurement
        self._origins: dict[str, tuple[float, float]] = {}  # op -> content origin of its last compact draw
        self._colors = {k: imgui.ImVec4(*v) for k, v in STATE_COLORS.items()}
        self._white = imgui.ImVec4(1, 1, 1, 1)
        self._link_colors = {
            "plain": (imgui.ImVec4(*LINK_COLOR), 2.5),
            "probed": (imgui.ImVec4(*PROBE_COLOR), 3.5),
            "bad": (imgui.ImVec4(*REFUSED_COLOR), 4.0),
        }
        self._wire: tuple[str, str, str, str] | None = None  # the selected wire, whose probe is shown
        # Regions as groups: node ids of their own (a group node holds no pins, so it is not the region's
        # node), the rectangle each was last given (canvas units), and what each holds at any depth.
        self._group_ids: dict[str, int] = {}
        self._groups_by_id: dict[int, str] = {}
        self._group_rects: dict[str, tuple[float, float, float, float]] = {}
        self._group_widths: dict[str, float] = {}  # region -> its title's width (made once per version)
        self._group_text: dict[str, tuple] = {}  # region -> (title, iterations, state line, warning)
        self._held: dict[str, tuple[str, ...]] = {}
        self._groups_dirty = True  # a node moved or changed size, or the patch changed: fit the groups again
        #: Left, top (title strip), right and bottom of a group node around its area, as last measured.
        self._group_frame = (8.0, 42.0, 8.0, 8.0)
        self._group_colors = {k: (imgui.ImVec4(*bg), imgui.ImVec4(*border)) for k, (bg, border) in GROUP_COLORS.items()}
        self._new_region: str | None = None  # the region the block browser creates into
        self._open_browser = False
        self._menu_link: tuple[str, str, str, str] | None = None
        #: Operators fully drawn / drawn as stubs in the last frame (what culling left in).
        self.drawn: set[str] = set()
        self.stubs: set[str] = set()
        #: Operator -> its Code's error markers drawn in the last frame: (line, screen x, screen y) of
        #: the marked line's left end (the Code box is sized to show every line up to ``_CODE_LINES``).
        self.code_marks: dict[str, list[tuple[int, float, float]]] = {}
        #: Operators whose "Generated code" section is open.
        self.generated_open: set[str] = set()
        #: Whether the last frame drew nodes compact (zoomed out beyond ``_COMPACT_ZOOM``).
        self.compact = False
        self._fit_in = 0  # frames until ``fit_all`` moves the view
        self._to_screen = (0.0, 0.0, 1.0)
        self._pin_box = imgui.ImVec2(NODE_WIDTH, 12.0)
        self._pivot_in, self._pivot_out = imgui.ImVec2(0.0, 0.5), imgui.ImVec2(1.0, 0.5)

    # -- ids: stable per operator name for the panel's life ------------------------------------------------
    def _id(self, table: dict, key: Any, back: dict | None = None) -> int:
        i = table.get(key)
        if i is None:
            i = table[key] = next(self._ids)
            if back is not None:
                back[i] = key
        return i

    def draw(self, stats: Any = None) -> None:
        """Draw the panel for this frame (inside ``imgui.new_frame`` .. ``imgui.render``)."""
        imgui, ed = self._imgui, self._ed
        if imgui.is_key_pressed(imgui.Key.f2):
            self.visible = not self.visible
        if not self.visible:
            self.model.end_live()
            return
        model = self.model
        io = imgui.get_io()
        if io.key_ctrl and not io.want_text_input:
            if imgui.is_key_pressed(imgui.Key.z):
                model.undo()
            elif imgui.is_key_pressed(imgui.Key.y):
                model.redo()
        model.refresh(stats)
        self._refused = model.refusals()
        if self._ctx is None:
            config = ed.Config()
            config.settings_file = ""  # positions live in the patch file, not in a settings file
            self._ctx = ed.create_editor(config)
        w, h = io.display_size.x, io.display_size.y
        x, y, pw, ph = self.rect or (w * 0.38, 0.0, w * 0.62, h)
        imgui.set_next_window_pos(imgui.ImVec2(x, y), imgui.Cond_.first_use_ever)
        imgui.set_next_window_size(imgui.ImVec2(pw, ph), imgui.Cond_.first_use_ever)
        imgui.set_next_window_bg_alpha(0.9)
        imgui.begin("Patch  (F2)")
        self._toolbar()
        win_at, win_size = imgui.get_window_pos(), imgui.get_window_size()
        ed.set_current_editor(self._ctx)
        ed.begin("patch")
        layout = EditorLayout(self._to_screen)
        nodes = model.drawn_nodes()  # the operators, and the inner nodes of open composites
        links = model.drawn_links()
        groups = model.groups()
        if self._labels_version != model.version:
            self._labels, self._compact, self._compact_seen, self._origins = {}, {}, {}, {}
            self._labels_version = model.version
            self._group_version(groups)
        a = ed.screen_to_canvas(win_at)
        b = ed.screen_to_canvas(imgui.ImVec2(win_at.x + win_size.x, win_at.y + win_size.y))
        full, stubs, wires = self._visible(nodes, links, (a.x - _MARGIN, a.y - _MARGIN, b.x + _MARGIN, b.y + _MARGIN))
        compact = self.compact = ed.get_current_zoom() > _COMPACT_ZOOM
        o, u = ed.canvas_to_screen(imgui.ImVec2(0, 0)), ed.canvas_to_screen(imgui.ImVec2(1, 0))
        self._to_screen = (o.x, o.y, u.x - o.x)  # canvas -> screen is a scale and a shift (for ``layout``)
        layout._to_screen = self._to_screen
        if groups:  # before the nodes: a group is drawn under what it holds
            view = (a.x - _MARGIN, a.y - _MARGIN, b.x + _MARGIN, b.y + _MARGIN)
            self._groups(groups, nodes, layout, view, hints=compact)
        for op, view in nodes.items():
            if op in full:
                if compact and op in self._compact:
                    self._compact_node(view, layout)
                else:
                    self._node(view, layout, compact)
            elif op in stubs:
                self._stub(view)
        self._wires(wires)
        self._create_and_delete()
        self._double_click()
        self._menus()
        if ed.has_selection_changed():
            self._selected_wire()
        if imgui.is_mouse_released(0):
            self._store_moves(nodes)  # inner nodes of open composites too: the model keeps their places
        ed.end()
        if self._fit_in:
            self._fit_in -= 1
            if not self._fit_in:
                ed.navigate_to_content(0.0)
        self.layout = layout
        self.drawn, self.stubs = full, stubs
        imgui.end()
        self._probe_window()
        if not imgui.is_any_item_active():
            model.end_live()  # a drag ended: its values become one edit, written once

    def _visible(
        self, nodes: dict[str, NodeView], links: list[Any], view: tuple[float, float, float, float]
    ) -> tuple[set[str], set[str], list[Any]]:
        """What this frame submits: nodes drawn in full (inside ``view``, or never measured), nodes
        drawn as stubs (an end of a visible wire), and the wires whose bounding box crosses ``view``.

        Worked out again only when something it depends on moved: the view (pan, zoom, resize), the
        patch (``version``), a drawn node's rectangle, or a drag (which may move selected nodes that
        are not drawn); otherwise the last frame's answer stands."""
        imgui, ed = self._imgui, self._ed
        version = self.model.version
        dragging = imgui.is_mouse_dragging(0)
        key = (tuple(round(v) for v in view), version)
        if key == self._vis_key and not dragging:
            return self._vis
        rects, geometry, node_ids = self._rects, self._geometry, self._node_ids
        if version != self._placed_version:  # positions change only with the patch (a move is an edit)
            placed = self._placed
            for op, v in nodes.items():
                if placed.get(op) != v.position:  # first time, or moved by undo / the file
                    nid = self._id(node_ids, op)
                    ed.set_node_position(ed.NodeId(nid), imgui.ImVec2(*v.position))
                    placed[op] = v.position
                    g = geometry.get(op)
                    w, h = g.size if g is not None else (NODE_WIDTH, 100.0)
                    rects[op] = (v.position[0], v.position[1], v.position[0] + w, v.position[1] + h)
            self._placed_version = version
        if self._fit_in:  # the editor fits what it was given this frame: give it every node
            self._vis_key = None
            return set(nodes), set(), list(links)
        if dragging:  # selected nodes move together, drawn or not: ask the editor where they are
            for op, r in rects.items():
                if op in nodes:
                    at = ed.get_node_position(ed.NodeId(node_ids[op]))
                    rects[op] = (at.x, at.y, at.x + r[2] - r[0], at.y + r[3] - r[1])
        x0, y0, x1, y1 = view
        full: set[str] = set()
        for op in nodes:
            r = rects[op]
            if op not in geometry or (r[0] < x1 and r[2] > x0 and r[1] < y1 and r[3] > y0):
                full.add(op)  # visible, or never measured (drawn once to learn its size)
        stubs: set[str] = set()
        for region, (gx0, gy0, gx1, gy1) in self._group_rects.items():
            # A shown group drags what it holds: every node inside it must be submitted (as a stub at least).
            if gx0 < x1 and gx1 > x0 and gy0 < y1 and gy1 > y0:
                held = (region, *self._held.get(region, ()))  # its own node lies inside it too
                stubs.update(op for op in held if op not in full and op in geometry)
        wires = []
        for link in links:
            src, dst = link.src, link.dst
            if src in full and dst in full:
                wires.append(link)
                continue
            rs, rd = rects.get(src), rects.get(dst)
            if rs is None or rd is None:
                continue
            if min(rs[0], rd[0]) < x1 and max(rs[2], rd[2]) > x0 and min(rs[1], rd[1]) < y1 and max(rs[3], rd[3]) > y0:
                wires.append(link)
                for op in (src, dst):
                    if op not in full:
                        stubs.add(op)
        self._vis_key, self._vis = key, (full, stubs, wires)
        return self._vis

    def _wires(self, wires: list[Any]) -> None:
        """Submit the visible wires: their ids are looked up once per culling answer (a batch of
        ready-made id objects), and only probed wires look up their colour each frame."""
        ed = self._ed
        batch = self._wire_batch
        if batch is None or batch[0] is not wires:
            batch = self._wire_batch = (wires, self._wire_ids(wires))
        probes = self.model.probes
        plain_color, plain_width = self._link_colors["plain"]
        link = ed.link
        if not probes:  # nothing probed: every wire in the plain colour
            for lid, src, dst, _ in batch[1]:
                link(lid, src, dst, plain_color, plain_width)
            if len(batch[1]) < len(wires):  # a pin not drawn yet: look again next frame
                self._wire_batch = None
            return
        colors = self._link_colors
        for lid, src, dst, key in batch[1]:
            if key in probes:
                color, width = colors["bad" if probes.bad(*key) else "probed"]
            else:
                color, width = plain_color, plain_width
            link(lid, src, dst, color, width)
        if len(batch[1]) < len(wires):
            self._wire_batch = None

    def _wire_ids(self, wires: list[Any]) -> list[tuple[Any, Any, Any, tuple[str, str]]]:
        """``(LinkId, source PinId, target PinId, (source, port))`` of each wire whose pins exist."""
        ed, pin_ids = self._ed, self._pin_ids
        out = []
        for link in wires:
            key = (link.src, link.src_port, link.dst, link.dst_port)
            lid = self._id(self._link_ids, key, self._links_by_id)
            src = pin_ids.get((link.src, link.src_port, "out"))
            dst = pin_ids.get((link.dst, link.dst_port, "in"))
            if src is not None and dst is not None:
                out.append((ed.LinkId(lid), ed.PinId(src), ed.PinId(dst), (link.src, link.src_port)))
        return out

    # -- parts ------------------------------------------------------------------------------------------
    def _toolbar(self) -> None:
        imgui, model = self._imgui, self.model
        if imgui.button("Undo") and model.can_undo:
            model.undo()
        imgui.same_line()
        if imgui.button("Redo") and model.can_redo:
            model.redo()
        imgui.same_line()
        color = (0.95, 0.65, 0.2, 1.0) if model.unsaved or self._refusal else (0.7, 0.7, 0.7, 1.0)
        imgui.text_colored(imgui.ImVec4(*color), self._refusal or model.status)

    def _node_labels(self, view: NodeView) -> tuple:
        """The pin labels of ``view`` (and the padding that right-aligns an output's), made once per
        patch version: formatting and measuring text every frame cost more than drawing it. An inner
        pin its composite exposes says so (``= smooth.In``)."""
        imgui = self._imgui
        ex = view.exposed
        ins = tuple(
            (p.name, f"> {p.name}  {p.type}" + (f"  = {ex[p.name]}" if p.name in ex else "")) for p in view.inputs
        )
        outs = []
        for p in view.outputs:
            label = (f"{ex[p.name]} =  " if p.name in ex else "") + f"{p.type}  {p.name} >"
            outs.append((p.name, label, imgui.ImVec2(max(0.0, NODE_WIDTH - imgui.calc_text_size(label).x), 0)))
        labels = self._labels[view.name] = (ins, tuple(outs))
        return labels

    def fit_all(self) -> None:
        """Move the view to show every node (as the F key does): every node is drawn for 3 frames (the
        editor measures new nodes over two and fits only the nodes drawn), then the view moves."""
        self._fit_in = 3

    def _node(self, view: NodeView, layout: EditorLayout, compact: bool = False) -> None:
        imgui, ed = self._imgui, self._ed
        op = view.name
        nid = ed.NodeId(self._node_ids[op])
        ins, outs = self._labels.get(op) or self._node_labels(view)
        ed.begin_node(nid)
        imgui.push_id(op)
        origin = imgui.get_cursor_screen_pos()  # widgets inside the editor are placed in canvas units
        imgui.begin_group()
        state = "Bypassed" if view.bypassed else view.state
        color = self._colors.get(state, self._white)
        imgui.text_colored(color, op)
        if not compact:
            imgui.same_line()
            imgui.text_disabled(f"{view.type}, {view.inner} blocks" if view.inner else view.type)
            if view.inner:
                imgui.same_line()
                if imgui.small_button("Close" if view.opened else "Open"):
                    self._report(self.model.close(op) if view.opened else self.model.open(op))
            if view.gpu_ms is None:
                imgui.text(state)
            elif view.runs:  # inside a body: the frame's sum, and one run's share
                imgui.text(f"{state}  {view.gpu_ms:.3f} ms, {view.runs} runs of {view.gpu_ms / view.runs:.3f}")
            else:
                imgui.text(f"{state}  {view.gpu_ms:.3f} ms")
            if view.compiling and imgui.is_item_hovered():  # a compile in flight: what runs meanwhile
                self._tooltip(f"{state}: {view.compiling}")
        for port, (count, capacity) in () if compact else view.append.items():
            imgui.progress_bar(
                count / capacity if capacity else 0.0, imgui.ImVec2(NODE_WIDTH, 0), f"{port} {count}/{capacity}"
            )
        if view.message and state != "OK" and not compact:
            imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + NODE_WIDTH)
            # The Code's errors are listed at the Code box: here the message's first line says what failed.
            message = view.message.split("\n", 1)[0] if view.code_errors else view.message
            imgui.text_colored(color, message[:300])
            imgui.pop_text_wrap_pos()
        pins: dict[tuple[str, str], tuple[float, float, float, float, float]] = {}
        for port, label in ins:
            pins[(port, "in")] = self._pin(op, port, "in", None if compact else label, None, origin, layout)
        for port, label, pad in outs:
            pins[(port, "out")] = self._pin(op, port, "out", None if compact else label, pad, origin, layout)
        if not compact:
            if view.composite is None:
                for param in view.params:
                    self._param(view, param)
            else:
                self._inner_params(view)
            if view.generates:
                self._generated_code(op)
        imgui.end_group()
        content = imgui.get_item_rect_size()
        imgui.pop_id()
        ed.end_node()
        pos, size = ed.get_node_position(nid), ed.get_node_size(nid)
        self._geometry[op] = _Geometry((content.x, content.y), (size.x, size.y), pins)
        if compact:
            self._measured_compact(op, pins, (origin.x - pos.x, origin.y - pos.y), (size.x, size.y))
        rect = (pos.x, pos.y, pos.x + size.x, pos.y + size.y)
        if self._rects.get(op) != rect:  # it moved or changed size: what is visible may have changed
            self._rects[op] = rect
            self._vis_key = None
            self._groups_dirty = True
        ox, oy, k = self._to_screen
        layout._nodes[op] = (ox + pos.x * k, oy + pos.y * k, ox + (pos.x + size.x) * k, oy + (pos.y + size.y) * k)
        layout._titles[op] = (ox + origin.x * k, oy + origin.y * k)

    def _measured_compact(
        self,
        op: str,
        pins: dict[tuple[str, str], tuple[float, float, float, float, float]],
        offset: tuple,
        size: tuple,
    ) -> None:
        """A compact node was drawn with imgui items and measured: once two draws agree (the editor sizes
        a new node over two frames), later frames draw it with ``_compact_node`` from these numbers."""
        seen = (tuple(pins.items()), offset, size)
        if self._compact_seen.get(op) != seen:
            self._compact_seen[op] = seen
            return
        ed = self._ed
        rows = []
        for (port, direction), (_, y0, _, y1, px) in pins.items():
            pid = ed.PinId(self._id(self._pin_ids, (op, port, direction), self._pins_by_id))
            kind, align = (
                (ed.PinKind.input, self._pivot_in) if direction == "in" else (ed.PinKind.output, self._pivot_out)
            )
            rows.append(((op, port, direction), pid, kind, align, px, (y0 + y1) * 0.5))
        self._compact[op] = (ed.NodeId(self._node_ids[op]), tuple(rows), offset, size)

    def _compact_node(self, view: NodeView, layout: EditorLayout) -> None:
        """A node zoomed out (title and pins) drawn with what its measured compact draws found: the same
        items, each pin's wire end set by alignment (no per-frame vectors), no group and no queries of
        the editor (its rectangle and pin places follow from where its content started)."""
        imgui, ed = self._imgui, self._ed
        op = view.name
        entry = self._compact[op]
        nid, rows, (dx, dy), (w, h) = entry
        ed.begin_node(nid)
        o = imgui.get_cursor_screen_pos()
        imgui.text_colored(self._colors.get("Bypassed" if view.bypassed else view.state, self._white), op)
        box = self._pin_box
        begin_pin, dummy, align_pivot, end_pin = ed.begin_pin, imgui.dummy, ed.pin_pivot_alignment, ed.end_pin
        for _, pid, kind, align, _, _ in rows:  # the same items as a measured compact draw, in order
            begin_pin(pid, kind)
            dummy(box)
            align_pivot(align)  # the wire's end: the middle of the pin's outer edge
            end_pin()
        if self._refused:
            for key, _, _, _, px, cy in rows:
                if key[:2] in self._refused:
                    self._refused_mark(key, o.x + px, o.y + cy, layout)
        ed.end_node()
        ox, oy = o.x, o.y
        layout._compact.append((op, ox, oy, entry))
        if self._origins.get(op) != (ox, oy):  # it moved: what is visible may have changed
            self._origins[op] = (ox, oy)
            x, y = ox - dx, oy - dy
            self._rects[op] = (x, y, x + w, y + h)
            self._vis_key = None
            self._groups_dirty = True

    def _stub(self, view: NodeView) -> None:
        """A node outside the visible area that a visible wire ends at: its measured size and its pins at
        their measured places, nothing else (so the wire is drawn to where the pin is)."""
        imgui, ed = self._imgui, self._ed
        op = view.name
        g = self._geometry[op]
        ed.begin_node(ed.NodeId(self._node_ids[op]))
        o = imgui.get_cursor_screen_pos()
        imgui.dummy(imgui.ImVec2(*g.content))
        vec, pin_ids, back = imgui.ImVec2, self._pin_ids, self._pins_by_id
        for (port, direction), (x0, y0, x1, y1, px) in g.pins.items():
            pid = self._id(pin_ids, (op, port, direction), back)
            ed.begin_pin(ed.PinId(pid), ed.PinKind.input if direction == "in" else ed.PinKind.output)
            ed.pin_rect(vec(o.x + x0, o.y + y0), vec(o.x + x1, o.y + y1))
            ed.pin_pivot_rect(vec(o.x + px, o.y + y0), vec(o.x + px, o.y + y1))
            ed.end_pin()
        ed.end_node()

    def _pin(
        self, op: str, port: str, direction: str, label: str | None, pad: Any, origin: Any, layout: EditorLayout
    ) -> tuple[float, float, float, float, float]:
        imgui, ed = self._imgui, self._ed
        key = (op, port, direction)
        pid = self._id(self._pin_ids, key, self._pins_by_id)
        ed.begin_pin(ed.PinId(pid), ed.PinKind.input if direction == "in" else ed.PinKind.output)
        if label is None:  # compact: the pin's place, no text
            imgui.dummy(self._pin_box)
        else:
            if pad is not None:  # an output: right-aligned
                imgui.dummy(pad)
                imgui.same_line()
            imgui.text(label)
        lo, hi = imgui.get_item_rect_min(), imgui.get_item_rect_max()
        x = lo.x if direction == "in" else hi.x
        ed.pin_pivot_rect(imgui.ImVec2(x, lo.y), imgui.ImVec2(x, hi.y))
        ed.end_pin()
        sx, sy, k = self._to_screen
        cy = (lo.y + hi.y) * 0.5
        layout._pins[key] = (sx + x * k, sy + cy * k)
        if self._refused and (op, port) in self._refused:
            self._refused_mark(key, x, cy, layout)
        ox, oy = origin.x, origin.y
        return (lo.x - ox, lo.y - oy, hi.x - ox, hi.y - oy, x - ox)

    def _refused_mark(self, key: tuple[str, str, str], x: float, y: float, layout: EditorLayout) -> None:
        """The red dot of a pin whose link was refused, beside its wire end at canvas ``(x, y)`` (left of an
        input, right of an output); its reason is the pin's tooltip (``_create_and_delete``)."""
        cx = x - _MARK_GAP if key[2] == "in" else x + _MARK_GAP
        self._imgui.get_window_draw_list().add_circle_filled(self._imgui.ImVec2(cx, y), _MARK_RADIUS, self._red)
        sx, sy, k = self._to_screen
        layout.refused[key] = (sx + cx * k, sy + y * k)

    def _report(self, result: Any) -> None:
        self._refusal = "" if result else result.message

    def close(self) -> None:
        """Release the node editor's context (idempotent; the imgui context must still exist)."""
        if self._ctx is not None:
            self._ed.destroy_editor(self._ctx)
            self._ctx = None
