"""The editor panel's groups: a region (If, While, For) or an open composite drawn as a tinted frame
around the nodes it holds, titled with its name, kind and state, fitted around them when one moved.

``EditorGroups`` is a base class of ``EditorPanel`` (``editor.py``), which sets up the state read here
and calls ``_group_version`` when the patch changed and ``_groups`` each frame, before the nodes (a
group is drawn under what it holds). The node menu places nodes with ``_spot_in`` / ``_spot_out``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..host_plugin.editor_layout import group_rects

if TYPE_CHECKING:
    from ..host_plugin.editor_model import EditorModel
    from ..host_plugin.editor_views import GroupView, NodeView
    from .editor import EditorLayout

__all__ = ["EditorGroups"]

_KIND_NAMES = {"if": "If", "while": "While", "for": "For", "composite": "inside"}
_GROUP_MARGIN = 16.0  # canvas units between a group's edge and the nodes it holds


class EditorGroups:
    """The groups half of ``EditorPanel`` (see ``EditorPanel.__init__`` for the state it keeps)."""

    model: EditorModel
    _imgui: Any
    _ed: Any
    _id: Callable[..., int]
    _colors: dict[str, Any]
    _white: Any
    _to_screen: tuple[float, float, float]
    _fit_in: int
    _rects: dict[str, tuple[float, float, float, float]]
    _vis_key: Any
    _group_ids: dict[str, int]
    _groups_by_id: dict[int, str]
    _group_rects: dict[str, tuple[float, float, float, float]]
    _group_widths: dict[str, float]
    _group_text: dict[str, tuple]
    _held: dict[str, tuple[str, ...]]
    _groups_dirty: bool
    _group_frame: tuple[float, float, float, float]
    _group_colors: dict[str, tuple[Any, Any]]

    def _group_version(self, groups: dict[str, GroupView]) -> None:
        """The patch changed: what each region holds at any depth, its title's width, and a fit to come."""
        held: dict[str, tuple[str, ...]] = {}
        for g in reversed(list(groups.values())):  # inner regions first: an outer one holds what they hold
            held[g.region] = tuple(op for m in g.members for op in (m, *held.get(m, ())))
        self._held = held
        calc, nodes = self._imgui.calc_text_size, self.model.drawn_nodes()
        widths, texts = {}, {}
        for r, g in groups.items():  # the widest its title and state line get (the state line changes per frame)
            limit = next((p.value for p in nodes[r].params if p.name in ("Max", "Count")), 0)
            widest = self._group_state(nodes[r], (int(limit), int(limit)))[0]
            title = self._group_title(g)
            widths[r] = max(calc(title).x, calc(widest).x) + 24.0
            texts[r] = (title, nodes[r].iterations, *self._group_state(nodes[r]))
        self._group_widths, self._group_text = widths, texts
        for gone in [r for r in self._group_rects if r not in groups]:
            del self._group_rects[gone]
        self._groups_dirty = True

    @staticmethod
    def _group_title(g: GroupView) -> str:
        return f"{g.region}  ({_KIND_NAMES.get(g.kind, g.kind)})"

    def _groups(
        self,
        groups: dict[str, GroupView],
        nodes: dict[str, NodeView],
        layout: EditorLayout,
        view: tuple[float, float, float, float],
        *,
        hints: bool = False,
    ) -> None:
        """Fit the groups around what they hold when something moved (not during a drag: the editor moves
        a dragged group with its nodes), then draw the ones crossing ``view`` (the visible canvas), outer
        ones first. ``hints`` (zoomed out): each group's title also large above it, where the editor
        shows group hints (its own title is then too small to read)."""
        if self._groups_dirty and not self._imgui.is_mouse_dragging(0):
            self._fit_groups(groups)
        x0, y0, x1, y1 = view
        shown = []
        for region, g in groups.items():
            r = self._group_rects.get(region)
            if r is not None and (self._fit_in or (r[0] < x1 and r[2] > x0 and r[1] < y1 and r[3] > y0)):
                self._group_node(g, nodes[region], r, layout)
                shown.append((region, g.kind))
        if hints:
            self._group_hints(shown)

    def _group_hints(self, shown: list[tuple[str, str]]) -> None:
        """Zoomed out: each shown group's title in screen-size text above its frame (imgui-node-editor's
        group hints fade in below 0.75x and are drawn outside the nodes)."""
        imgui, ed = self._imgui, self._ed
        for region, kind in shown:
            if ed.begin_group_hint(ed.NodeId(self._group_ids[region])):
                at = ed.get_group_min()
                color = imgui.get_color_u32(self._group_colors.get(kind, self._group_colors["if"])[1])
                ed.get_hint_foreground_draw_list().add_text(
                    imgui.ImVec2(at.x, at.y - 18.0), color, self._group_text[region][0]
                )
            ed.end_group_hint()

    def _fit_groups(self, groups: dict[str, GroupView]) -> None:
        """Give each group the rectangle around its region's node and what it holds (``group_rects``)."""
        imgui, ed = self._imgui, self._ed
        rects = group_rects(
            groups, self._rects, margin=_GROUP_MARGIN, frame=self._group_frame, widths=self._group_widths
        )
        fl, ft, fr, fb = self._group_frame
        for region, r in rects.items():
            if self._group_rects.get(region) == r:
                continue
            gid = ed.NodeId(self._id(self._group_ids, region, self._groups_by_id))
            ed.set_node_position(gid, imgui.ImVec2(r[0], r[1]))
            ed.set_group_size(gid, imgui.ImVec2(r[2] - r[0] - fl - fr, r[3] - r[1] - ft - fb))
            self._group_rects[region] = r
            self._vis_key = None  # what is visible (and which held nodes need stubs) may have changed
        self._groups_dirty = False

    def _group_node(self, g: GroupView, view: NodeView, r: tuple, layout: EditorLayout) -> None:
        """One group: its title (name and kind in the region's state colour), its state line, its area."""
        imgui, ed = self._imgui, self._ed
        region = g.region
        gid = ed.NodeId(self._group_ids[region])
        fl, ft, fr, fb = self._group_frame
        w, h = r[2] - r[0] - fl - fr, r[3] - r[1] - ft - fb
        bg, border = self._group_colors.get(g.kind, self._group_colors["if"])
        state = "Bypassed" if view.bypassed else view.state
        title, iterations, line, warn = self._group_text[region]
        if iterations is not view.iterations:  # a new reading: its line is made once, not per frame
            line, warn = self._group_state(view)
            self._group_text[region] = (title, view.iterations, line, warn)
        ed.push_style_color(ed.StyleColor.group_bg, bg)
        ed.push_style_color(ed.StyleColor.group_border, border)
        ed.begin_node(gid)
        origin = imgui.get_cursor_screen_pos()
        imgui.text_colored(self._colors.get(state, self._white), title)
        if warn:
            imgui.text_colored(self._colors["Warning"], line)
        else:
            imgui.text_disabled(line)
        area = imgui.get_cursor_screen_pos()
        ed.group(imgui.ImVec2(w, h))  # the size of its first frame; later ones keep set_group_size's
        ed.end_node()
        ed.pop_style_color(2)
        pos, size = ed.get_node_position(gid), ed.get_node_size(gid)
        if size.x > 0:  # measured: the padding and title strip around the area, as the editor drew them
            pad = area.x - pos.x  # the node's padding, the same on every side
            frame = (pad, area.y - pos.y, pad, pad)
            if max(abs(u - v) for u, v in zip(frame, self._group_frame, strict=True)) > 0.5:
                self._group_frame = frame
                self._groups_dirty = True
        sx, sy, k = self._to_screen
        layout.groups[region] = (sx + pos.x * k, sy + pos.y * k, sx + (pos.x + size.x) * k, sy + (pos.y + size.y) * k)
        layout.group_titles[region] = (sx + origin.x * k, sy + origin.y * k)

    @staticmethod
    def _group_state(view: NodeView, iterations: tuple[int, int] | None = None) -> tuple[str, bool]:
        """A group's state line, and whether it is a warning: an open composite's type, size and source; a
        loop's iterations in the newest completed frame (``iterations``: these instead; a While that ran
        ``Max`` of them was stopped by the guard),
        an If's rule."""
        if view.opened:
            return f"{view.type}, {view.inner} blocks, from {view.source} (read-only)", False
        if view.kind == "if":
            return "runs when Condition is not 0", False
        iterations = iterations or view.iterations
        if iterations is None:
            return "iterations: no frame read yet", False
        n, limit = iterations
        if view.kind == "while" and limit and n >= limit:
            return f"stopped at Max: {n}/{limit} iterations", True
        return f"{n}/{limit} iterations", False

    def _spot_in(self, region: str) -> tuple[float, float]:
        """Where a node moved into ``region`` goes: right of what the group holds, at its top."""
        r = self._group_rects.get(region)
        if r is None:
            view = self.model.nodes()[region]
            return (view.position[0], view.position[1] + 240.0)
        _, ft, fr, _ = self._group_frame
        return (r[2] - fr - _GROUP_MARGIN + 60.0, r[1] + ft + _GROUP_MARGIN)

    def _spot_out(self, region: str, op: str) -> tuple[float, float]:
        """Where a node taken out of ``region`` goes: right of the group, at its own height."""
        r = self._group_rects.get(region)
        y = self.model.nodes()[op].position[1]
        return (r[2] + 60.0, y) if r is not None else self.model.nodes()[op].position
