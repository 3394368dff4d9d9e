"""The editor panel's parameter widgets: each parameter drawn by its ``ParamView.widget`` (sliders with
the declared ranges, drags, checkboxes, enums, colour pickers, vectors), an open composite's inner
parameters (the exposed ones edited as the composite's, the others disabled), the multi-line ``Code``
editor with its compile errors marked at their lines, and a generated kernel's code.

``EditorWidgets`` is a base class of ``EditorPanel`` (``editor.py``), whose ``_node`` calls ``_param``,
``_inner_params`` and ``_generated_code`` for a node drawn in full.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .editor_style import NODE_WIDTH, REFUSED_COLOR

if TYPE_CHECKING:
    from ..host_plugin.editor_model import EditorModel
    from ..host_plugin.editor_views import NodeView, ParamView

__all__ = ["EditorWidgets"]

_ERROR_LINE_TINT = (1.0, 0.25, 0.25, 0.3)  # a Code line with a compile error, under its text
#: The Code box grows with its text up to this many lines (then scrolls, and later lines go unmarked).
_CODE_LINES = 40
_INT_LIMIT = 2**30 - 1


class EditorWidgets:
    """The parameter half of ``EditorPanel`` (see ``EditorPanel.__init__`` for the state it keeps)."""

    model: EditorModel
    code_marks: dict[str, list[tuple[int, float, float]]]
    generated_open: set[str]
    _imgui: Any
    _report: Callable[[Any], None]
    _to_screen: tuple[float, float, float]
    _code_draft: tuple[str, str] | None

    def _param(self, view: NodeView, p: ParamView, label: str | None = None) -> None:
        imgui, model = self._imgui, self.model
        name = label or p.name  # an inner parameter's label also names what sets it (``Factor = smooth.Gain``)
        imgui.set_next_item_width(NODE_WIDTH * 0.62)
        changed, value = False, p.value
        widget = p.widget
        if widget == "slider" and p.integer and p.maximum - p.minimum > 10_000:  # type: ignore[operator]
            widget = "drag"  # a slider over millions of steps cannot be aimed
        if widget == "slider":
            if p.integer:
                changed, value = imgui.slider_int(name, int(value), int(p.minimum), int(p.maximum))  # type: ignore[arg-type]
            else:
                changed, value = imgui.slider_float(name, float(value), float(p.minimum), float(p.maximum))  # type: ignore[arg-type]
        elif widget == "drag":
            lo = p.minimum if p.minimum is not None else 0.0
            hi = p.maximum if p.maximum is not None else 0.0  # 0..0: unbounded
            if p.integer:  # imgui's int widgets take half the int32 range
                lo, hi = (max(min(int(v), _INT_LIMIT), -_INT_LIMIT) for v in (lo, hi))
                changed, value = imgui.drag_int(name, int(value), 1.0, lo, hi)
            else:
                speed = max(abs(float(value)) * 0.01, 0.001)
                changed, value = imgui.drag_float(name, float(value), speed, float(lo), float(hi), "%.4g")
        elif p.widget == "checkbox":
            changed, on = imgui.checkbox(name, bool(value))
            value = int(on)
        elif p.widget == "enum":
            current = p.choices.index(value) if value in p.choices else 0
            changed, picked = imgui.combo(name, current, [str(c) for c in p.choices])
            value = p.choices[picked]
        elif p.widget == "color":
            fn = imgui.color_edit3 if p.lanes == 3 else imgui.color_edit4
            changed, rgba = fn(name, list(value), imgui.ColorEditFlags_.no_inputs)
            value = tuple(rgba)
        elif p.widget == "vector":
            fn = {2: imgui.drag_float2, 3: imgui.drag_float3, 4: imgui.drag_float4}.get(p.lanes)
            if fn is not None and not p.integer:
                changed, vals = fn(name, list(value), 0.01)
                value = tuple(vals)
            else:
                imgui.text(f"{name} {value}")
        elif p.widget == "code":
            imgui.text("Code")
            text = str(value)
            # Tall enough for every line (up to _CODE_LINES): no scrolling, so a line's place is known.
            lines = min(max(text.count("\n") + 1, 10), _CODE_LINES)
            height = lines * imgui.get_text_line_height() + 2 * imgui.get_style().frame_padding.y + 2
            changed, value = imgui.input_text_multiline(
                "##code", text, imgui.ImVec2(NODE_WIDTH * 1.6, height), imgui.InputTextFlags_.allow_tab_input
            )
            deactivated = imgui.is_item_deactivated_after_edit()
            if view.code_errors:
                self._mark_code_errors(view, text)
            elif self.code_marks:
                self.code_marks.pop(view.name, None)
            if changed:  # text rebuilds the block: applied when the field loses focus, not per keystroke
                self._code_draft = (view.name, value)
                changed = False
            if deactivated and self._code_draft is not None:
                op, text = self._code_draft
                self._code_draft = None
                self._report(model.set_param(op, p.name, text))
        else:
            changed, value = imgui.input_text(name, str(value), imgui.InputTextFlags_.enter_returns_true)
        if imgui.is_item_hovered() and p.description:
            imgui.set_tooltip(p.description)
        if changed:
            live = p.widget in ("slider", "drag", "color", "vector") and imgui.is_item_active()
            self._report(model.set_param(view.name, p.name, value, live=live))

    def _inner_params(self, view: NodeView) -> None:
        """An inner node's parameters: the ones its open composite exposes are edited as the composite's
        (labelled with the outer name), the others shown with the values they run with, disabled."""
        imgui = self._imgui
        exposed, top = view.exposed, view.name.split("/", 1)[0]
        for p in view.params:
            outer = exposed.get(p.name, "")
            if view.composite == top and outer.startswith(top + "."):
                self._param(view, p, label=f"{p.name} = {outer}")
                continue
            imgui.begin_disabled()
            self._param(view, p, label=f"{p.name} = {outer}" if outer else None)
            imgui.end_disabled()

    def _mark_code_errors(self, view: NodeView, text: str) -> None:
        """Mark each error at its line of the Code box just drawn: the line tinted red with a bar at its
        left, a tick under the column where the compiler gives one; then the errors listed by line."""
        imgui = self._imgui
        lo, hi = imgui.get_item_rect_min(), imgui.get_item_rect_max()
        pad, h = imgui.get_style().frame_padding, imgui.get_text_line_height()
        draw = imgui.get_window_draw_list()
        red = imgui.get_color_u32(imgui.ImVec4(*REFUSED_COLOR))
        tint = imgui.get_color_u32(imgui.ImVec4(*_ERROR_LINE_TINT))
        source = text.splitlines()
        ox, oy, k = self._to_screen
        marks = []
        for e in view.code_errors:
            y = lo.y + pad.y + (e.line - 1) * h
            if e.line < 1 or y + h > hi.y:  # past the box's last line (a longer Code, a stale line)
                continue
            draw.add_rect_filled(imgui.ImVec2(lo.x, y), imgui.ImVec2(hi.x, y + h), tint)
            draw.add_rect_filled(imgui.ImVec2(lo.x, y), imgui.ImVec2(lo.x + 3, y + h), red)
            if e.column is not None and e.line <= len(source):
                x = lo.x + pad.x + imgui.calc_text_size(source[e.line - 1][: e.column - 1]).x
                draw.add_line(imgui.ImVec2(x, y + h - 1), imgui.ImVec2(x + h * 0.6, y + h - 1), red, 2.0)
            marks.append((e.line, ox + lo.x * k, oy + (y + h * 0.5) * k))
        self.code_marks[view.name] = marks
        imgui.push_text_wrap_pos(imgui.get_cursor_pos_x() + NODE_WIDTH * 1.6)
        for e in view.code_errors:
            where = f"{e.line}:{e.column}" if e.column is not None else f"{e.line}"
            imgui.text_colored(imgui.ImVec4(*REFUSED_COLOR), f"{where}  {e.message}")
        imgui.pop_text_wrap_pos()

    def _generated_code(self, op: str) -> None:
        """The "Generated code" section of a block that generates its kernel: a button opens it, and
        the model generates the code once per Code (read-only here; select and copy)."""
        imgui = self._imgui
        is_open = op in self.generated_open
        if imgui.small_button(("Hide" if is_open else "Show") + " generated code"):
            (self.generated_open.discard if is_open else self.generated_open.add)(op)
            is_open = not is_open
        if not is_open:
            return
        code = self.model.generated_code(op)
        if code is None:
            imgui.text_disabled("(none while the Code does not compile)")
            return
        imgui.input_text_multiline(
            "##generated", code, imgui.ImVec2(NODE_WIDTH * 1.6, 220), imgui.InputTextFlags_.read_only
        )
