"""The imgui profiling overlay (imgui-bundle), drawn over the preview or any GL context.

Shows the engine line (blocks, internal ones counted apart, kernels, GPU ms, pool), a profiling
level selector that changes the engine's level live, a per-block table (state, GPU ms, append fill
bar), a frame-time plot (implot) and the diagnostics with block names. Internal blocks (the GL
writers a preview adds, see ``GlBridge.internal_blocks``) are listed dimmed and indented under the
block whose output they copy, so the table reads as the user's patch, with the preview's copies as
footnotes (``block_rows``). F1 toggles it. It saves and restores the GL state it touches, so it can
draw into someone else's context.

With a ``GlfwWindow`` it reuses imgui-bundle's ``GlfwRenderer`` (input and frame order); with a
headless context it uses the same programmable-pipeline renderer with a fixed display size.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from .._lifecycle import HandleOwner
from ..engine.diagnostics import Diagnostic
from ..engine.profiling import BlockStats, EngineStats, ProfilingLevel
from ..errors import InteropError
from ..host_plugin.generated_code import code_tooltip
from ._gl import gl
from .context import GlContext

__all__ = ["Overlay", "block_rows", "diagnostic_line", "engine_line", "gpu_cell"]

_STATE_COLORS = {
    "OK": (0.45, 0.85, 0.45, 1.0),
    "Compiling": (0.9, 0.8, 0.3, 1.0),
    "Warning": (0.95, 0.65, 0.2, 1.0),
    "Error": (0.95, 0.3, 0.3, 1.0),
}
FILL_BAR_COLOR = (0.2, 0.8, 1.0, 1.0)  # the append fill bars (tests look for this color)


def block_rows(blocks: Sequence[BlockStats], internal: Mapping[int, int]) -> list[tuple[BlockStats, bool]]:
    """The block table's rows: ``(stats, is_internal)``, each internal block right after the block it
    copies from, in the engine's order otherwise; an internal block whose source is not listed comes last.

    Args:
        blocks: The engine's blocks, as ``EngineStats.blocks`` lists them.
        internal: Internal block id -> the id of the block whose output it copies (``GlBridge.internal_blocks``).
    """
    if not internal:
        return [(b, False) for b in blocks]
    under: dict[int, list[BlockStats]] = {}
    for b in blocks:
        if b.block_id in internal:
            under.setdefault(internal[b.block_id], []).append(b)
    rows: list[tuple[BlockStats, bool]] = []
    for b in blocks:
        if b.block_id not in internal:
            rows.append((b, False))
            rows.extend((child, True) for child in under.pop(b.block_id, ()))
    rows.extend((child, True) for children in under.values() for child in children)  # sources not listed
    return rows


def diagnostic_line(d: Diagnostic, names: Mapping[int, str], places: Mapping[int, str]) -> str:
    """A diagnostic as the overlay lists it: ``path:line: block: message``, the place being that of the
    patch file's operator that made the block (``places``; absent for a patch built in code)."""
    who = names.get(d.block_id, "engine")  # type: ignore[arg-type]
    place = places.get(d.block_id) if d.block_id is not None else None
    return f"{place}: {who}: {d.message}" if place is not None else f"{who}: {d.message}"


def engine_line(stats: EngineStats, internal: Mapping[int, int]) -> str:
    """The panel's first line: the patch's blocks (internal ones counted apart), kernels, GPU time, pool.

    Args:
        stats: The engine's stats.
        internal: Internal block id -> the block it copies from (``GlBridge.internal_blocks``).
    """
    hidden = sum(1 for b in stats.blocks if b.block_id in internal)
    blocks = f"{len(stats.blocks) - hidden} blocks" + (f" (+{hidden} internal)" if hidden else "")
    gpu = f"{stats.gpu_ms:.3f} ms" if stats.gpu_ms is not None else "-"
    pool = f"{stats.pool_in_use_bytes / 2**20:.0f} MB / {stats.pool_total_bytes / 2**20:.0f} MB"
    return f"{blocks}, {stats.kernels} kernels   GPU {gpu}   Pool {pool}"


def gpu_cell(b: BlockStats) -> str:
    """A block's GPU ms cell: its time in the frame; for a block inside a region's body, also how many
    times it ran and the mean time of one run (``4.200 (100x 42.0µs)``)."""
    if b.gpu_ms is None:
        return "-"
    mean = b.mean_ms
    return f"{b.gpu_ms:.3f}" + (f" ({b.runs}x {mean * 1e3:.1f}µs)" if mean is not None else "")


def _imgui() -> tuple[Any, Any]:
    try:
        from imgui_bundle import imgui, implot
    except ImportError as exc:
        raise InteropError(f"imgui-bundle is not installed ({exc}): install it (the 'gl' extra)") from exc
    return imgui, implot


class _GlState:
    """The GL state the overlay changes, saved before and restored after drawing."""

    def __init__(self) -> None:
        GL = gl()
        self.GL = GL
        self.enabled = {
            cap: bool(GL.glIsEnabled(cap))
            for cap in (GL.GL_BLEND, GL.GL_DEPTH_TEST, GL.GL_CULL_FACE, GL.GL_SCISSOR_TEST, GL.GL_PROGRAM_POINT_SIZE)
        }
        self.program = GL.glGetIntegerv(GL.GL_CURRENT_PROGRAM)
        self.vao = GL.glGetIntegerv(GL.GL_VERTEX_ARRAY_BINDING)
        self.viewport = GL.glGetIntegerv(GL.GL_VIEWPORT)
        self.blend = (GL.glGetIntegerv(GL.GL_BLEND_SRC_RGB), GL.glGetIntegerv(GL.GL_BLEND_DST_RGB))
        self.texture = GL.glGetIntegerv(GL.GL_TEXTURE_BINDING_2D)

    def restore(self) -> None:
        GL = self.GL
        for cap, on in self.enabled.items():
            (GL.glEnable if on else GL.glDisable)(cap)
        GL.glUseProgram(self.program)
        GL.glBindVertexArray(self.vao)
        GL.glViewport(*[int(v) for v in self.viewport])
        GL.glBlendFunc(int(self.blend[0]), int(self.blend[1]))
        GL.glBindTexture(GL.GL_TEXTURE_2D, self.texture)


class Overlay(HandleOwner):
    """imgui overlay of an engine's profiling data.

    A GL ``HandleOwner`` (``cudapatch._lifecycle``): its imgui renderer's program, buffers, vertex
    array and font texture are deleted by ``close()``, on the thread that made the overlay with its
    GL context current; an overlay nobody closed only warns (``ResourceWarning``).

    Args:
        context: The GL context to draw into (current when drawing).
        on_level: Called with a ``ProfilingLevel`` when the user picks one (e.g. ``engine.set_profiling``).
        panels: More panels drawn in the same imgui frame, each called with the frame's stats (the
            node editor's ``EditorPanel.draw``).
        history: Frames kept for the frame-time plot.

    Raises:
        InteropError: imgui-bundle is missing.
    """

    _closed_error = InteropError

    def __init__(
        self,
        context: GlContext,
        *,
        on_level: Callable[[ProfilingLevel], None] | None = None,
        history: int = 240,
        panels: tuple[Callable[[EngineStats], None], ...] = (),
    ) -> None:
        imgui, implot = _imgui()
        self._imgui, self._implot = imgui, implot
        self.context = context
        self._on_level = on_level  # fixed at construction: the overlay has one owner to tell
        self.visible = True
        self._panels = tuple(panels)
        #: Block id -> ``path:line`` of the patch file's operator, asked for when there are diagnostics
        #: (``StandaloneHost.places``); None: diagnostics show the block's name only.
        self.places: Callable[[], Mapping[int, str]] | None = None
        #: Block id -> the code it generates for its kernel (an Expression's), or None; asked only while
        #: the pointer is on a block's name, which then shows it in a tooltip (``code_tooltip``).
        self.generated: Callable[[int], str | None] | None = None
        # create_context() leaves another overlay's context current (one left unclosed, say):
        # make ours current, or the renderer below would set up that one's io
        self._imgui_ctx = imgui.create_context()
        imgui.set_current_context(self._imgui_ctx)
        self._implot_ctx = implot.create_context()
        implot.set_current_context(self._implot_ctx)
        imgui.get_io().set_ini_filename("")  # never write imgui.ini into the user's directory
        self._window = getattr(context, "handle", None) if type(context).__name__ == "GlfwWindow" else None
        try:
            if self._window is not None:
                from imgui_bundle.python_backends.glfw_backend import GlfwRenderer

                self._renderer = GlfwRenderer(self._window, attach_callbacks=True)
            else:
                from imgui_bundle.python_backends.opengl_backend_programmable import ProgrammablePipelineRenderer

                self._renderer = ProgrammablePipelineRenderer()
        except Exception:  # no renderer, no GL names: the contexts are all there is to give back
            implot.destroy_context(self._implot_ctx)
            imgui.destroy_context(self._imgui_ctx)
            raise
        self._host_ms: deque[float] = deque(maxlen=history)
        self._gpu_ms: deque[float] = deque(maxlen=history)
        self._last = time.perf_counter()
        self._arm("Overlay", gl_names=True)

    def record_frame(self, host_ms: float, gpu_ms: float | None) -> None:
        """Add one frame's times to the plot."""
        self._host_ms.append(host_ms)
        self._gpu_ms.append(gpu_ms if gpu_ms is not None else float("nan"))

    def draw(self, stats: EngineStats, *, title: str = "cudapatch", internal: Mapping[int, int] | None = None) -> None:
        """Draw the overlay for ``stats`` into the current framebuffer (GL state is restored after).

        Args:
            stats: The engine's snapshot (``Engine.stats()``).
            title: The panel's title.
            internal: Internal block id -> the block it copies from (``GlBridge.internal_blocks``):
                those rows are dimmed and indented under their source.
        """
        if self._closed:
            self._check_open("Overlay.draw")
        imgui = self._imgui
        imgui.set_current_context(self._imgui_ctx)
        self._implot.set_current_context(self._implot_ctx)
        io = imgui.get_io()
        now = time.perf_counter()
        io.delta_time = max(now - self._last, 1e-4)
        self._last = now
        if self._window is not None:
            self._renderer.process_inputs()
        else:
            w, h = self.context.size
            io.display_size = imgui.ImVec2(float(w), float(h))
        saved = _GlState()
        try:
            imgui.new_frame()
            if imgui.is_key_pressed(imgui.Key.f1):
                self.visible = not self.visible
            if self.visible:
                self._panel(stats, title, internal or {})
            for panel in self._panels:
                panel(stats)
            imgui.render()
            gl().glBindFramebuffer(gl().GL_FRAMEBUFFER, self.context.framebuffer)
            self._renderer.render(imgui.get_draw_data())
        finally:
            saved.restore()

    def _panel(self, stats: EngineStats, title: str, internal: Mapping[int, int]) -> None:
        imgui, implot = self._imgui, self._implot
        imgui.set_next_window_pos(imgui.ImVec2(10, 10), imgui.Cond_.first_use_ever)
        imgui.set_next_window_size(imgui.ImVec2(460, 0), imgui.Cond_.first_use_ever)
        imgui.set_next_window_bg_alpha(0.85)
        imgui.begin(f"{title}  (F1)")
        imgui.text(engine_line(stats, internal))
        if stats.value_bytes > stats.buffer_bytes:  # buffer reuse: outputs share memory
            imgui.text(
                f"Buffers {stats.buffer_bytes / 2**20:.0f} MB for {stats.value_bytes / 2**20:.0f} MB of outputs (reuse)"
            )
        levels = [lv.value for lv in ProfilingLevel]
        current = levels.index(stats.level.value)
        changed, picked = imgui.combo("Profiling", current, levels)
        if changed and picked != current and self._on_level is not None:
            self._on_level(ProfilingLevel.parse(levels[picked]))
        flags = imgui.TableFlags_.borders | imgui.TableFlags_.row_bg
        if imgui.begin_table("blocks", 4, flags):
            for name in ("Block", "State", "GPU ms", "Fill"):
                imgui.table_setup_column(name)
            imgui.table_headers_row()
            for b, is_internal in block_rows(stats.blocks, internal):
                text = imgui.text_disabled if is_internal else imgui.text  # internal: dimmed, indented
                imgui.table_next_row()
                imgui.table_next_column()
                text(f"  {b.name}" if is_internal else b.name)
                if self.generated is not None and imgui.is_item_hovered():
                    code = self.generated(b.block_id)
                    if code is not None:
                        imgui.set_tooltip(code_tooltip(code))
                imgui.table_next_column()
                imgui.text_colored(imgui.ImVec4(*_STATE_COLORS.get(b.state, (1, 1, 1, 1))), b.state)
                if b.fused:  # runs inside one generated kernel with its group (the tooltip names it)
                    imgui.same_line()
                    imgui.text_disabled("fused")
                imgui.table_next_column()
                text(gpu_cell(b))
                imgui.table_next_column()
                for port, a in b.append.items():
                    imgui.push_style_color(imgui.Col_.plot_histogram, imgui.ImVec4(*FILL_BAR_COLOR))
                    imgui.progress_bar(a.fill, imgui.ImVec2(-1, 0), f"{port} {a.count}/{a.capacity}")
                    imgui.pop_style_color()
            imgui.end_table()
        if self._host_ms:
            host = np.asarray(self._host_ms, np.float64)
            gpu_t = np.asarray(self._gpu_ms, np.float64)
            if implot.begin_plot("Frame time (ms)", imgui.ImVec2(-1, 140)):
                implot.setup_axes("frame", "ms", implot.AxisFlags_.auto_fit, implot.AxisFlags_.auto_fit)
                implot.plot_line("host", host)
                if np.isfinite(gpu_t).any():
                    implot.plot_line("GPU", np.nan_to_num(gpu_t))
                implot.end_plot()
        if stats.diagnostics:
            imgui.separator()
            names = {b.block_id: b.name for b in stats.blocks}
            places = self.places() if self.places is not None else {}
            for d in stats.diagnostics:
                color = (0.95, 0.3, 0.3, 1.0) if d.severity == "error" else (0.95, 0.65, 0.2, 1.0)
                imgui.text_colored(imgui.ImVec4(*color), diagnostic_line(d, names, places))
        imgui.end()

    def _release(self) -> None:
        """Delete the renderer's GL objects and destroy imgui's and implot's contexts (``close``)."""
        imgui = self._imgui
        imgui.set_current_context(self._imgui_ctx)
        try:
            self._renderer.shutdown()
        except AttributeError:  # older backends have no shutdown
            pass
        self._implot.destroy_context(self._implot_ctx)
        imgui.destroy_context(self._imgui_ctx)

    def _forget(self) -> None:
        """Drop the renderer unshut (its GL names went with their context); imgui's contexts are
        plain memory, no GL, so they are destroyed all the same."""
        self._implot.destroy_context(self._implot_ctx)
        self._imgui.destroy_context(self._imgui_ctx)

    def __repr__(self) -> str:
        return f"<Overlay on {type(self.context).__name__} visible={self.visible} closed={self._closed}>"
