"""What the user does in the editor panel besides editing parameters: links made and refused, nodes
and wires deleted (Delete, the wire menu's Unlink, or a linked input's wire dragged off into empty
space), the node, group, wire and background menus (rename, bypass, delete, move into or out of a
region, open or close a composite, probe, unlink), the block browser (``EditorModel.browse``), double
clicks, a selected wire's probe window, and dragged nodes' positions written back as one edit; plus the
tooltips of hovered wires and pins.

``EditorMenus`` is a base class of ``EditorPanel`` (``editor.py``), whose ``draw`` calls these after
submitting the nodes and wires (the editor answers its queries about them inside ``ed.begin``..``ed.end``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .editor_style import LINK_COLOR, REFUSED_COLOR

if TYPE_CHECKING:
    from ..host_plugin.editor_model import EditorModel
    from ..host_plugin.editor_views import GroupView, NodeView

__all__ = ["EditorMenus"]

_THUMB_PX = 6.0  # screen pixels per thumbnail pixel


class EditorMenus:
    """The interaction half of ``EditorPanel`` (see ``EditorPanel.__init__`` for the state it keeps)."""

    model: EditorModel
    _imgui: Any
    _ed: Any
    _report: Callable[[Any], None]
    _group_title: Callable[[GroupView], str]
    _spot_in: Callable[[str], tuple[float, float]]
    _spot_out: Callable[[str, str], tuple[float, float]]
    _node_ids: dict[str, int]
    _pins_by_id: dict[int, tuple[str, str, str]]
    _links_by_id: dict[int, tuple[str, str, str, str]]
    _groups_by_id: dict[int, str]
    _link_colors: dict[str, tuple[Any, float]]
    _placed: dict[str, tuple[float, float]]
    _refusal: str
    _refused: dict[tuple[str, str], str]
    _refused_drag: tuple[str, str, str, str] | None
    _search: str
    _new_at: tuple[float, float]
    _new_region: str | None
    _open_browser: bool
    _menu_op: str
    _menu_link: tuple[str, str, str, str] | None
    _rename_text: str
    _wire: tuple[str, str, str, str] | None

    def _create_and_delete(self) -> None:
        imgui, ed, model = self._imgui, self._ed, self.model
        refused: tuple[str, str, str, str] | None = None  # the refused link the wire hangs over this frame
        if ed.begin_create(imgui.ImVec4(1, 1, 1, 1), 2.0):
            start, end = ed.PinId(), ed.PinId()
            if ed.query_new_link(start, end):
                a, b = self._pins_by_id.get(start.id()), self._pins_by_id.get(end.id())
                if a is not None and b is not None:
                    out, inp = (b, a) if a[2] == "in" else (a, b)
                    problem = (
                        "links go from an output to an input"
                        if out[2] != "out" or inp[2] != "in"
                        else model.link_problem(out[0], out[1], inp[0], inp[1])
                    )
                    if problem is not None:
                        ed.reject_new_item(imgui.ImVec4(*REFUSED_COLOR), 2.0)
                        self._tooltip(problem)
                        refused = (out[0], out[1], inp[0], inp[1])
                    elif ed.accept_new_item(imgui.ImVec4(*LINK_COLOR), 2.5):
                        self._report(model.connect(out[0], out[1], inp[0], inp[1]))
            pin = ed.PinId()
            if ed.query_new_node(pin):
                self._dropped(self._pins_by_id.get(pin.id()))
            ed.end_create()
        if ed.begin_delete():
            link_id = ed.LinkId()
            while ed.query_deleted_link(link_id):
                key = self._links_by_id.get(link_id.id())
                if key is None:
                    continue
                problem = model.inner_problem(key[0]) or model.inner_problem(key[2])
                if problem is not None:  # a wire inside a composite: stays, the status line says why
                    ed.reject_deleted_item()
                    self._refusal = f"cannot unlink: {problem}"
                elif ed.accept_deleted_item():
                    self._report(model.disconnect(*key))
            node_id = ed.NodeId()
            while ed.query_deleted_node(node_id):
                op = next((k for k, v in self._node_ids.items() if v == node_id.id()), None)
                if op is None:
                    continue
                problem = model.inner_problem(op)
                if problem is not None:
                    ed.reject_deleted_item()
                    self._refusal = f"cannot delete: {problem}"
                elif ed.accept_deleted_item():
                    self._report(model.delete(op))
            ed.end_delete()
        self._dropped_refused(refused)
        hovered = ed.get_hovered_link()
        if hovered:
            key = self._links_by_id.get(hovered.id())
            link = next((lk for lk in model.drawn_links() if lk.key == key), None)
            if link is not None:
                probe = model.probes.latest.get((link.src, link.src_port), False)
                seen = "" if probe is False else f"\n{probe}" if probe is not None else "\nprobe: no frame yet"
                self._tooltip(f"{link}\n{link.size_text}{seen}")
        elif (pin := ed.get_hovered_pin()) and (where := self._pins_by_id.get(pin.id())) is not None:
            text = model.port_text(*where)  # shape, element type and bytes of what the pin carries
            reason = self._refused.get(where[:2])
            self._tooltip(f"{reason}\n\n{text}" if reason else text)  # a marked pin: why its link was refused first

    def _dropped_refused(self, refused: tuple[str, str, str, str] | None) -> None:
        """Mark the pin a refused wire was dropped on. imgui-node-editor drops a rejected link without a
        word, so the panel remembers the refused link under the mouse while the button is held; released
        over it, the link goes to ``EditorModel.connect``, which refuses it again (the same checks, the
        status line) and keeps the reason at the target pin (``refusals()``), drawn until the next edit."""
        if self._imgui.is_mouse_down(0):
            self._refused_drag = refused
            return
        dropped, self._refused_drag = self._refused_drag, None
        if dropped is not None:
            self._report(self.model.connect(*dropped))

    def _dropped(self, pin: tuple[str, str, str] | None) -> None:
        """A wire dragged from ``pin`` is over empty space. From a linked input it unlinks it when released
        (imgui-node-editor has no dragging of a wire's end off its pin: this stands in for it); from any
        other pin the block browser opens where it was released."""
        imgui, ed, model = self._imgui, self._ed, self.model
        link = model.link_into(pin[0], pin[1]) if pin is not None and pin[2] == "in" else None
        if link is not None:
            problem = model.inner_problem(link.src) or model.inner_problem(link.dst)
            if problem is not None:
                ed.reject_new_item(imgui.ImVec4(*REFUSED_COLOR), 2.0)
                self._tooltip(f"cannot unlink: {problem}")
                return
            self._tooltip(f"release to unlink {link}")
            if ed.accept_new_item(imgui.ImVec4(*REFUSED_COLOR), 2.0):
                self._report(model.unlink_input(pin[0], pin[1]))  # type: ignore[index]
            return
        if ed.accept_new_item():
            self._new_at = _xy(ed.get_mouse_pos_on_canvas())
            ed.suspend()
            imgui.open_popup("Add block")
            ed.resume()

    def _double_click(self) -> None:
        """A double-click on a composite's node opens or closes it; on an open composite's group, closes it."""
        node = self._ed.get_double_clicked_node()
        if not node:
            return
        model, nid = self.model, node.id()
        op = self._groups_by_id.get(nid)
        if op is not None and model.groups().get(op) is not None and model.groups()[op].kind == "composite":
            self._report(model.close(op))
            return
        op = next((k for k, v in self._node_ids.items() if v == nid), None)
        view = model.drawn_nodes().get(op) if op is not None else None
        if view is not None and view.inner:
            self._report(model.close(op) if view.opened else model.open(op))  # type: ignore[arg-type]

    def _menus(self) -> None:
        imgui, ed, model = self._imgui, self._ed, self.model
        ed.suspend()
        node = ed.NodeId()
        if ed.show_node_context_menu(node):
            # A group's menu is its region's.
            self._menu_op = self._groups_by_id.get(node.id()) or next(
                (k for k, v in self._node_ids.items() if v == node.id()), ""
            )
            self._rename_text = self._menu_op
            imgui.open_popup("Node")
        elif ed.show_background_context_menu():
            self._new_at = _xy(ed.get_mouse_pos_on_canvas())
            self._new_region = None
            imgui.open_popup("Add block")
        link = ed.LinkId()
        if ed.show_link_context_menu(link):
            self._menu_link = self._links_by_id.get(link.id())
            imgui.open_popup("Wire")
        if imgui.begin_popup("Wire"):
            key = self._menu_link
            if key is not None:
                src, port = key[0], key[1]
                imgui.text(f"{src}.{port} -> {key[2]}.{key[3]}")
                if imgui.menu_item("Unlink", "Del", False)[0]:
                    self._report(model.disconnect(*key))  # an inner wire is refused, the reason in the status line
                    if self._wire == key:
                        self._wire = None
                if (src, port) in model.probes:
                    if imgui.menu_item("Remove probe", "", False)[0]:
                        self._report(model.unprobe(src, port))
                elif imgui.menu_item("Probe", "", False)[0]:
                    self._report(model.probe(src, port))
                    self._wire = key
            imgui.end_popup()
        if imgui.begin_popup("Node"):
            op = self._menu_op
            view = model.drawn_nodes().get(op)
            if view is not None and view.composite is not None:  # inside a composite: read-only
                self._inner_menu(op, view)
            elif view is not None:
                imgui.text(op)
                changed, self._rename_text = imgui.input_text(
                    "Rename", self._rename_text, imgui.InputTextFlags_.enter_returns_true
                )
                if changed and self._rename_text != op:
                    self._report(model.rename(op, self._rename_text))
                    imgui.close_current_popup()
                if imgui.menu_item("Bypass", "", view.bypassed)[0]:
                    self._report(model.bypass(op, not view.bypassed))
                if imgui.menu_item("Delete", "Del", False)[0]:
                    self._report(model.delete(op))
                self._region_menu(op, view)
            imgui.end_popup()
        if self._open_browser:  # asked for inside the node menu: opened at this level, where it is drawn
            self._open_browser = False
            imgui.open_popup("Add block")
        if imgui.begin_popup("Add block"):
            self._browser()
            imgui.end_popup()
        ed.resume()

    def _region_menu(self, op: str, view: NodeView) -> None:
        """The node menu's region entries: move into a region, out of its region; for a region, add a
        block inside it; for a composite, show what it holds."""
        imgui, model = self._imgui, self.model
        groups = model.groups()
        targets = [
            g
            for r, g in groups.items()
            if g.kind != "composite" and r != op and r != view.region and not model.holds(op, r)
        ]
        if targets and imgui.begin_menu("Move into region"):
            for g in targets:
                if imgui.menu_item(self._group_title(g), "", False)[0]:
                    self._report(model.place(op, g.region, position=self._spot_in(g.region)))
            imgui.end_menu()
        if view.region is not None:
            outer = model.region_of(view.region)
            if imgui.menu_item(f"Move out of {view.region}", "", False)[0]:
                self._report(model.place(op, outer, position=self._spot_out(view.region, op)))
        if view.kind and imgui.menu_item("Add block inside", "", False)[0]:
            self._new_region, self._new_at, self._open_browser = op, self._spot_in(op), True
        if view.inner and imgui.menu_item("Close inside" if view.opened else "Open inside", "", False)[0]:
            self._report(model.close(op) if view.opened else model.open(op))

    def _inner_menu(self, op: str, view: NodeView) -> None:
        """The menu of a node inside an open composite: why it is read-only; open or close a composite."""
        imgui, model = self._imgui, self.model
        imgui.text(op)
        imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + 320.0)
        imgui.text_disabled(model.inner_problem(op) or "")
        imgui.pop_text_wrap_pos()
        if view.inner and imgui.menu_item("Close inside" if view.opened else "Open inside", "", False)[0]:
            self._report(model.close(op) if view.opened else model.open(op))
        if imgui.menu_item(f"Close {view.composite}", "", False)[0]:
            self._report(model.close(view.composite))  # type: ignore[arg-type]

    def _browser(self) -> None:
        """The block browser: what ``EditorModel.browse`` lists for the search text, grouped by category,
        each type with its docstring's first line (the whole first paragraph in its tooltip)."""
        imgui, model = self._imgui, self.model
        _, self._search = imgui.input_text("Search", self._search)
        groups: dict[str, list[Any]] = {}
        for entry in model.browse(self._search):
            groups.setdefault(entry.category, []).append(entry)
        for category, entries in groups.items():
            if imgui.tree_node_ex(category, imgui.TreeNodeFlags_.default_open):
                for entry in entries:
                    if imgui.selectable(f"{entry.label}##{entry.name}", False)[0]:
                        self._report(model.create(entry.name, position=self._new_at, region=self._new_region))
                        imgui.close_current_popup()
                    if imgui.is_item_hovered() and entry.doc:
                        imgui.set_tooltip(f"{entry.name} (from {entry.origin})\n{entry.doc}")
                    if entry.summary:
                        imgui.same_line()
                        imgui.text_disabled(entry.summary[:80])
                imgui.tree_pop()

    def _selected_wire(self) -> None:
        """The selection changed: a selected wire is probed and its statistics shown."""
        self._wire = None
        for lid in self._ed.get_selected_links():
            key = self._links_by_id.get(lid.id())
            if key is not None:
                self._report(self.model.probe(key[0], key[1]))
                self._wire = key
                return

    def _probe_window(self) -> None:
        """The selected wire's probe: statistics of the newest completed frame, a thumbnail for an image."""
        key = self._wire
        if key is None or (key[0], key[1]) not in self.model.probes:
            return
        imgui = self._imgui
        src, port = key[0], key[1]
        st = self.model.probes.latest.get((src, port))
        imgui.set_next_window_bg_alpha(0.9)
        imgui.begin(f"Probe {src}.{port}###probe", None, imgui.WindowFlags_.always_auto_resize)
        if st is None:
            imgui.text("waiting for the first frame with the probe")
        else:
            bad = self._link_colors["bad"][0]
            if st.minimum is None:
                imgui.text("no finite value")
            else:
                imgui.text(f"min  {st.minimum:.6g}\nmax  {st.maximum:.6g}\nmean {st.mean:.6g}")
            imgui.text_colored(bad, f"NaN {st.nan:,}  Inf {st.inf:,}") if st.bad else imgui.text("NaN 0  Inf 0")
            imgui.text_disabled(f"{st.values:,} values, frame {st.frame}")
            if st.thumbnail is not None:
                self._thumbnail(st.thumbnail)
        if imgui.button("Remove probe"):
            self._report(self.model.unprobe(src, port))
        imgui.end()

    def _thumbnail(self, image: Any) -> None:
        """A probe's thumbnail (uint8: 0 not finite, drawn red; 1..255 grey levels) as filled rectangles."""
        imgui = self._imgui
        h, w = image.shape
        at = imgui.get_cursor_screen_pos()
        draw = imgui.get_window_draw_list()
        red = imgui.get_color_u32(imgui.ImVec4(*REFUSED_COLOR))
        k = _THUMB_PX
        for y in range(h):
            row = image[y]
            for x in range(w):
                v = int(row[x])
                c = red if v == 0 else imgui.get_color_u32(imgui.ImVec4(v / 255, v / 255, v / 255, 1.0))
                x0, y0 = at.x + x * k, at.y + y * k
                draw.add_rect_filled(imgui.ImVec2(x0, y0), imgui.ImVec2(x0 + k, y0 + k), c)
        imgui.dummy(imgui.ImVec2(w * k, h * k))

    def _store_moves(self, nodes: dict[str, NodeView]) -> None:
        """After a mouse release: nodes the user dragged get their new position written to the file."""
        ed = self._ed
        moved: dict[str, tuple[float, float]] = {}
        for op, view in nodes.items():
            nid = self._node_ids.get(op)
            if nid is None:
                continue
            xy = _xy(ed.get_node_position(ed.NodeId(nid)))
            if abs(xy[0] - view.position[0]) > 0.5 or abs(xy[1] - view.position[1]) > 0.5:
                self._placed[op] = (round(xy[0], 1), round(xy[1], 1))
                moved[op] = xy
        if moved:  # a dragged selection or group is one edit (one undo)
            self._report(self.model.move_many(moved))

    def _tooltip(self, text: str) -> None:
        ed, imgui = self._ed, self._imgui
        ed.suspend()
        imgui.set_tooltip(text)
        ed.resume()


def _xy(v: Any) -> tuple[float, float]:
    return (float(v.x), float(v.y))
