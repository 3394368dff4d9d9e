"""The node editor panel: the running patch drawn with imgui-node-editor, edited through ``EditorModel``.

Every operator is a node (title coloured by its state, type, GPU time, append fill, diagnostic
text), its ports are pins, its parameters are widgets chosen by ``ParamView.widget`` (sliders with the
declared ranges, checkboxes, enums, colour pickers, a multi-line ``Code`` editor with compile errors
listed at their line). Wires and pins show dtype, shape, element count and bytes on hover. Dragging from a pin to
a pin connects (a refused link turns red and shows the reason), Delete removes the selection, the
node menu renames and bypasses, the background menu opens the block browser (every registered
type, grouped by package, with its docstring). Ctrl+Z / Ctrl+Y undo and redo; F2 shows or hides
the panel (F1 stays the overlay).

The panel calls only the model's actions and draws inside the overlay's imgui frame
(``Overlay(panels=[panel.draw])``). Per frame it reads views the model rebuilds only after edits;
after drawing it records where each node, title and pin landed (``layout``), which the GL tests
compare with the pixels of the rendered frame.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from ..host_plugin.editor_model import EditorModel, NodeView, ParamView

__all__ = ["EditorPanel", "EditorLayout", "STATE_COLORS", "LINK_COLOR", "REFUSED_COLOR"]

STATE_COLORS = {
    "OK": (0.45, 0.85, 0.45, 1.0),
    "Compiling": (0.9, 0.8, 0.3, 1.0),
    "Warning": (0.95, 0.65, 0.2, 1.0),
    "Error": (0.95, 0.3, 0.3, 1.0),
    "Bypassed": (0.55, 0.55, 0.6, 1.0),
}
LINK_COLOR = (0.3, 0.75, 1.0, 1.0)  # wires (the GL tests look for it)
REFUSED_COLOR = (1.0, 0.25, 0.25, 1.0)
_NODE_WIDTH = 200.0
_INT_LIMIT = 2**30 - 1


@dataclass
class EditorLayout:
    """Where the last frame drew things, in window pixels (top-left origin): node rectangles,
    title text positions, pin centres (``(op, port, direction)``)."""

    nodes: dict[str, tuple[float, float, float, float]] = field(default_factory=dict)
    titles: dict[str, tuple[float, float]] = field(default_factory=dict)
    pins: dict[tuple[str, str, str], tuple[float, float]] = field(default_factory=dict)


class EditorPanel:
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
        self._code_draft: tuple[str, str] | None = None

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
        ed.set_current_editor(self._ctx)
        ed.begin("patch")
        layout = EditorLayout()
        nodes = model.nodes()
        for view in nodes.values():
            self._node(view, layout)
        for link in model.links():
            key = link.key
            lid = self._id(self._link_ids, key, self._links_by_id)
            a = self._pin_ids.get((link.src, link.src_port, "out"))
            b = self._pin_ids.get((link.dst, link.dst_port, "in"))
            if a is not None and b is not None:
                ed.link(ed.LinkId(lid), ed.PinId(a), ed.PinId(b), imgui.ImVec4(*LINK_COLOR), 2.5)
        self._create_and_delete()
        self._menus()
        if imgui.is_mouse_released(0):
            self._store_moves(nodes)
        ed.end()
        self.layout = layout
        imgui.end()
        if not imgui.is_any_item_active():
            model.end_live()  # a drag ended: its values become one edit, written once

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

    def _node(self, view: NodeView, layout: EditorLayout) -> None:
        imgui, ed = self._imgui, self._ed
        nid = self._id(self._node_ids, view.name)
        if self._placed.get(view.name) != view.position:  # first time, or moved by undo / the file
            ed.set_node_position(ed.NodeId(nid), imgui.ImVec2(*view.position))
            self._placed[view.name] = view.position
        ed.begin_node(ed.NodeId(nid))
        imgui.push_id(view.name)
        state = "Bypassed" if view.bypassed else view.state
        title_at = imgui.get_cursor_screen_pos()
        imgui.text_colored(imgui.ImVec4(*STATE_COLORS.get(state, (1, 1, 1, 1))), view.name)
        imgui.same_line()
        imgui.text_disabled(view.type)
        gpu = f"  {view.gpu_ms:.3f} ms" if view.gpu_ms is not None else ""
        imgui.text(f"{state}{gpu}")
        for port, (count, capacity) in view.append.items():
            imgui.progress_bar(
                count / capacity if capacity else 0.0, imgui.ImVec2(_NODE_WIDTH, 0), f"{port} {count}/{capacity}"
            )
        if view.message and state != "OK":
            imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + _NODE_WIDTH)
            imgui.text_colored(imgui.ImVec4(*STATE_COLORS.get(state, (1, 1, 1, 1))), view.message[:300])
            imgui.pop_text_wrap_pos()
        for pin in view.inputs:
            self._pin(view.name, pin.name, "in", f"> {pin.name}  {pin.type}", layout)
        for pin in view.outputs:
            self._pin(view.name, pin.name, "out", f"{pin.type}  {pin.name} >", layout)
        for param in view.params:
            self._param(view, param)
        imgui.pop_id()
        ed.end_node()
        pos, size = ed.get_node_position(ed.NodeId(nid)), ed.get_node_size(ed.NodeId(nid))
        a, b = ed.canvas_to_screen(pos), ed.canvas_to_screen(imgui.ImVec2(pos.x + size.x, pos.y + size.y))
        layout.nodes[view.name] = (a.x, a.y, b.x, b.y)
        title = ed.canvas_to_screen(title_at)  # widgets inside the editor are placed in canvas units
        layout.titles[view.name] = (title.x, title.y)

    def _pin(self, op: str, port: str, direction: str, label: str, layout: EditorLayout) -> None:
        imgui, ed = self._imgui, self._ed
        key = (op, port, direction)
        pid = self._id(self._pin_ids, key, self._pins_by_id)
        ed.begin_pin(ed.PinId(pid), ed.PinKind.input if direction == "in" else ed.PinKind.output)
        if direction == "out":
            imgui.dummy(imgui.ImVec2(max(0.0, _NODE_WIDTH - imgui.calc_text_size(label).x), 0))
            imgui.same_line()
        imgui.text(label)
        lo, hi = imgui.get_item_rect_min(), imgui.get_item_rect_max()
        x = lo.x if direction == "in" else hi.x
        ed.pin_pivot_rect(imgui.ImVec2(x, lo.y), imgui.ImVec2(x, hi.y))
        ed.end_pin()
        at = ed.canvas_to_screen(imgui.ImVec2(x, (lo.y + hi.y) * 0.5))
        layout.pins[key] = (at.x, at.y)

    def _param(self, view: NodeView, p: ParamView) -> None:
        imgui, model = self._imgui, self.model
        imgui.set_next_item_width(_NODE_WIDTH * 0.62)
        changed, value = False, p.value
        widget = p.widget
        if widget == "slider" and p.integer and p.maximum - p.minimum > 10_000:  # type: ignore[operator]
            widget = "drag"  # a slider over millions of steps cannot be aimed
        if widget == "slider":
            if p.integer:
                changed, value = imgui.slider_int(p.name, int(value), int(p.minimum), int(p.maximum))  # type: ignore[arg-type]
            else:
                changed, value = imgui.slider_float(p.name, float(value), float(p.minimum), float(p.maximum))  # type: ignore[arg-type]
        elif widget == "drag":
            lo = p.minimum if p.minimum is not None else 0.0
            hi = p.maximum if p.maximum is not None else 0.0  # 0..0: unbounded
            if p.integer:  # imgui's int widgets take half the int32 range
                lo, hi = (max(min(int(v), _INT_LIMIT), -_INT_LIMIT) for v in (lo, hi))
                changed, value = imgui.drag_int(p.name, int(value), 1.0, lo, hi)
            else:
                speed = max(abs(float(value)) * 0.01, 0.001)
                changed, value = imgui.drag_float(p.name, float(value), speed, float(lo), float(hi), "%.4g")
        elif p.widget == "checkbox":
            changed, on = imgui.checkbox(p.name, bool(value))
            value = int(on)
        elif p.widget == "enum":
            current = p.choices.index(value) if value in p.choices else 0
            changed, picked = imgui.combo(p.name, current, list(p.choices))
            value = p.choices[picked]
        elif p.widget == "color":
            fn = imgui.color_edit3 if p.lanes == 3 else imgui.color_edit4
            changed, rgba = fn(p.name, list(value), imgui.ColorEditFlags_.no_inputs)
            value = tuple(rgba)
        elif p.widget == "vector":
            fn = {2: imgui.drag_float2, 3: imgui.drag_float3, 4: imgui.drag_float4}.get(p.lanes)
            if fn is not None and not p.integer:
                changed, vals = fn(p.name, list(value), 0.01)
                value = tuple(vals)
            else:
                imgui.text(f"{p.name} {value}")
        elif p.widget == "code":
            imgui.text("Code")
            changed, value = imgui.input_text_multiline(
                "##code", str(value), imgui.ImVec2(_NODE_WIDTH * 1.6, 140), imgui.InputTextFlags_.allow_tab_input
            )
            for line, message in view.code_errors:
                imgui.text_colored(imgui.ImVec4(*REFUSED_COLOR), f"line {line}: {message}")
            if changed:  # text rebuilds the block: applied when the field loses focus, not per keystroke
                self._code_draft = (view.name, value)
                changed = False
            if imgui.is_item_deactivated_after_edit() and self._code_draft is not None:
                op, text = self._code_draft
                self._code_draft = None
                self._report(model.set_param(op, p.name, text))
        else:
            changed, value = imgui.input_text(p.name, str(value), imgui.InputTextFlags_.enter_returns_true)
        if imgui.is_item_hovered() and p.description:
            imgui.set_tooltip(p.description)
        if changed:
            live = p.widget in ("slider", "drag", "color", "vector") and imgui.is_item_active()
            self._report(model.set_param(view.name, p.name, value, live=live))

    def _create_and_delete(self) -> None:
        imgui, ed, model = self._imgui, self._ed, self.model
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
                    elif ed.accept_new_item(imgui.ImVec4(*LINK_COLOR), 2.5):
                        self._report(model.connect(out[0], out[1], inp[0], inp[1]))
            pin = ed.PinId()
            if ed.query_new_node(pin) and ed.accept_new_item():
                self._new_at = _xy(ed.get_mouse_pos_on_canvas())
                ed.suspend()
                imgui.open_popup("Add block")
                ed.resume()
            ed.end_create()
        if ed.begin_delete():
            link_id = ed.LinkId()
            while ed.query_deleted_link(link_id):
                key = self._links_by_id.get(link_id.id())
                if key is not None and ed.accept_deleted_item():
                    self._report(model.disconnect(*key))
            node_id = ed.NodeId()
            while ed.query_deleted_node(node_id):
                op = next((k for k, v in self._node_ids.items() if v == node_id.id()), None)
                if op is not None and ed.accept_deleted_item():
                    self._report(model.delete(op))
            ed.end_delete()
        hovered = ed.get_hovered_link()
        if hovered:
            key = self._links_by_id.get(hovered.id())
            link = next((lk for lk in model.links() if lk.key == key), None)
            if link is not None:
                self._tooltip(f"{link}\n{link.size_text}")
        elif (pin := ed.get_hovered_pin()) and (where := self._pins_by_id.get(pin.id())) is not None:
            self._tooltip(model.port_text(*where))  # shape, element type and bytes of what the pin carries

    def _menus(self) -> None:
        imgui, ed, model = self._imgui, self._ed, self.model
        ed.suspend()
        node = ed.NodeId()
        if ed.show_node_context_menu(node):
            self._menu_op = next((k for k, v in self._node_ids.items() if v == node.id()), "")
            self._rename_text = self._menu_op
            imgui.open_popup("Node")
        elif ed.show_background_context_menu():
            self._new_at = _xy(ed.get_mouse_pos_on_canvas())
            imgui.open_popup("Add block")
        if imgui.begin_popup("Node"):
            op = self._menu_op
            view = model.nodes().get(op)
            if view is not None:
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
            imgui.end_popup()
        if imgui.begin_popup("Add block"):
            self._browser()
            imgui.end_popup()
        ed.resume()

    def _browser(self) -> None:
        """The block browser: every registered type, grouped by package, filtered by the search text."""
        imgui, model = self._imgui, self.model
        _, self._search = imgui.input_text("Search", self._search)
        needle = self._search.lower()
        groups: dict[str, list[Any]] = {}
        for bt in model.registry:
            if not needle or needle in bt.name.lower() or needle in bt.doc.lower():
                groups.setdefault(bt.name.split(".", 1)[0], []).append(bt)
        for package, types in groups.items():
            if imgui.tree_node_ex(package, imgui.TreeNodeFlags_.default_open):
                for bt in types:
                    if imgui.selectable(bt.name.split(".", 1)[1], False)[0]:
                        self._report(model.create(bt.name, position=self._new_at))
                        imgui.close_current_popup()
                    if imgui.is_item_hovered() and bt.doc:
                        imgui.set_tooltip(f"{bt.name} (from {bt.origin})\n{bt.doc}")
                imgui.tree_pop()

    def _store_moves(self, nodes: dict[str, NodeView]) -> None:
        """After a mouse release: nodes the user dragged get their new position written to the file."""
        ed = self._ed
        for op, view in nodes.items():
            nid = self._node_ids.get(op)
            if nid is None:
                continue
            xy = _xy(ed.get_node_position(ed.NodeId(nid)))
            if abs(xy[0] - view.position[0]) > 0.5 or abs(xy[1] - view.position[1]) > 0.5:
                self._placed[op] = (round(xy[0], 1), round(xy[1], 1))
                self.model.move(op, *xy)

    def _tooltip(self, text: str) -> None:
        ed, imgui = self._ed, self._imgui
        ed.suspend()
        imgui.set_tooltip(text)
        ed.resume()

    def _report(self, result: Any) -> None:
        self._refusal = "" if result else result.message

    def close(self) -> None:
        """Release the node editor's context (idempotent; the imgui context must still exist)."""
        if self._ctx is not None:
            self._ed.destroy_editor(self._ctx)
            self._ctx = None


def _xy(v: Any) -> tuple[float, float]:
    return (float(v.x), float(v.y))
