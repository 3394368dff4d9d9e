"""The preview: an engine's point output and/or image output drawn every frame, with the overlay.

``Preview(engine, context, points=(block, "Points"))`` draws the points a ToPoints-style block
writes; ``image=(block, port)`` shows a 2-D output as a texture of its element type (RGBA8 for
``uchar4`` and packed ``uint``, RGBA32F for ``float4``, grey for ``float``/``half``/``uchar`` ...;
signed, bfloat16 and float3 images converted to floats in the graph),
``image=(block, port, width, height)`` any output of that many texels. Each
``frame()`` runs ``engine.update()`` (which maps the GL resources, launches, copies and unmaps on
the engine's stream, never waiting), then draws with GL and presents. With an ``EglContext`` the
same frames render headless and ``run(out_dir=...)`` writes them as PNG files.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..blocks.block import Block
from ..errors import CudaLaunchError, CudapatchError, InteropError
from ._gl import gl
from .bridge import GlBridge
from .context import GlContext
from .formats import conversion_for, texture_format_for
from .png import write_png
from .render import PointRenderer, TextureRenderer, orbit_camera
from .shared import SharedBuffer, SharedTexture2D

__all__ = ["Preview", "PreviewReport"]


def _image_spec(engine: Any, image: tuple) -> tuple[Block, str, int, int, str, int]:
    """``(block, port, width, height, texture format, channels)`` of the image to show: the size as
    given, or the output's 2-D shape; the format from its element type (``formats.texture_format_for``,
    else the R32F/RGBA32F texture of its conversion, ``formats.conversion_for``).

    Raises:
        InteropError: no size and no 2-D shape, or an element type no texture shows.
    """
    block, port = image[0], image[1]
    spec = block.description.output(port)
    if spec is None:
        raise InteropError(f"Preview: '{block.name}' has no output '{port}'")
    channels = 1
    if len(image) >= 4:
        w, h = int(image[2]), int(image[3])
    else:
        shape = engine.output_shape(block, port)  # the running graph's: call after engine.wait_ready()
        if shape.ndim != 2:
            raise InteropError(
                f"Preview: output '{block.name}.{port}' has shape {shape}; show a 2-D output or give width, height"
            )
        h, w, channels = shape.height, shape.width, shape.channels
    fmt = texture_format_for(spec.dtype, channels)
    if fmt is not None:
        return block, port, w, h, fmt.name, channels
    conv = conversion_for(spec.dtype, channels)
    if conv is not None:
        return block, port, w, h, conv.texture, channels
    raise InteropError(
        f"Preview: output '{block.name}.{port}' holds {spec.dtype.c_name}"
        f"{f' x{channels}' if channels > 1 else ''}, which the preview does not show (it shows 8/16-bit "
        "integers, half, bfloat16, float and double with 1 to 4 values per pixel, float2/3/4 and uchar4; "
        "convert 32/64-bit integers to float in a block)"
    )


log = logging.getLogger("cudapatch.interop")


@dataclass
class PreviewReport:
    """What a ``run`` did: frames, wall time, frames per second, PNGs written."""

    frames: int = 0
    seconds: float = 0.0
    pngs: list[Path] = field(default_factory=list)

    @property
    def fps(self) -> float:
        return self.frames / self.seconds if self.seconds > 0 else 0.0


class Preview:
    """Draws an engine's outputs into a GL context every frame.

    Args:
        engine: The engine (its CUDA context is made current by ``engine.update``).
        context: A ``GlfwWindow`` or ``EglContext`` (current on this thread).
        points: ``(block, port)`` of a points output (``capacity`` positions then colors, float4).
        image: ``(block, port, width, height)`` of an RGBA8 image output (``uchar4``/``uint``, row-major).
        overlay: Draw the imgui profiling overlay.
        zero_map: Share the points through memory GL imports from CUDA (no map/unmap per frame).
            None: when the driver supports it (logged); False: register/map.
        orbit: Camera orbit speed in radians per frame.
        editor: An ``EditorModel``: the node editor panel is drawn over the preview (F2 toggles it).
    """

    def __init__(
        self,
        engine: Any,
        context: GlContext,
        *,
        points: tuple[Block, str] | None = None,
        image: tuple[Block, str, int, int] | None = None,
        overlay: bool = True,
        zero_map: bool | None = None,
        orbit: float = 0.004,
        background: tuple[float, float, float] = (0.015, 0.015, 0.025),
        editor: Any = None,
    ) -> None:
        if points is None and image is None:
            raise InteropError("Preview: give points=(block, port) and/or image=(block, port[, width, height])")
        self.engine = engine
        self.context = context
        self.points = points
        self.image = image
        keep = getattr(engine, "keep", None)
        if points is not None and keep is not None:
            keep(*points)  # drawn after the frame: its own buffer (buffer reuse), never another output's
        self.orbit = orbit
        self.background = background
        self.frames = 0
        context.make_current()
        from .imported import ImportedRing, zero_map_available

        self.bridge = GlBridge(engine, label="preview")
        # An isolated engine's outputs are copied into the imported memory from this process (the child
        # cannot reach it): no GL map at all. Measured on the H100 (driver 580): after the child's fault,
        # the host's first map of the points buffer never completed on its stream (docs/findings.md).
        self.zero_map = zero_map_available(context) if zero_map is None else zero_map
        self._ring_cls = ImportedRing
        how = "imported CUDA memory (zero-map)" if self.zero_map else "register + map/unmap"
        log.info("preview: outputs shared with GL through %s", how)
        if self.bridge.copies and not self.zero_map:
            log.warning(
                "preview: an isolated engine shown through register + map/unmap: after a GPU fault of its "
                "process this preview has hung on a GL map (H100, driver 580; docs/faults.md)"
            )
        self._ring: ImportedRing | None = None
        self._point_buffer: SharedBuffer | None = None
        self._point_renderer: PointRenderer | None = None
        self._texture: SharedTexture2D | None = None
        self._texture_renderer: TextureRenderer | None = None
        self._image: Any = None
        self._channels = 1
        if image is not None:
            block, port, w, h, fmt, channels = _image_spec(engine, image)
            self.image = (block, port, w, h)
            self._channels = channels
            label = f"{block.name}.{port}"
            if self.zero_map and fmt == "rgba8":  # CUDA writes a ring of imported buffers, GL copies the newest
                from .imported import ImportedImage

                try:
                    self._image = ImportedImage(w, h, device=engine.device.ordinal, label=label)
                    self.bridge.show_buffer_ring(block, port, self._image.ring)
                except InteropError as exc:
                    if self._image is not None:
                        self._image.close()
                        self._image = None
                    log.warning("preview: %s; the image goes through register + map instead", exc)
            if self._image is None:
                # surface_ldst: written by surface stores, 2.4x faster than a copy into the array
                self._texture = SharedTexture2D.create(w, h, format=fmt, flags="surface_ldst", label=label)
                self.bridge.show_texture(block, port, self._texture, channels=channels)
            self._texture_renderer = TextureRenderer()
        self.overlay = None
        self.editor_panel = None
        if editor is not None:
            from .editor import EditorPanel

            self.editor_panel = EditorPanel(editor)
        if overlay or editor is not None:
            from .overlay import Overlay

            panels = (self.editor_panel.draw,) if self.editor_panel is not None else ()
            self.overlay = Overlay(context, on_level=engine.set_profiling, panels=panels)
            self.overlay.visible = overlay
        self._closed = False

    def _points_before_first_launch(self) -> None:
        """An isolated engine: build the child's graph and register the points buffer with CUDA before
        the first frame runs any kernel. Measured on the H100 machine (driver 580): registering a GL
        buffer in this process once a kernel in the child has faulted spins in
        ``cuGraphicsGLRegisterBuffer`` for good (a patch whose new operator faults in its first frame
        hung ``cudapatch run --isolated``); the buffer registered before stays usable. Only the first
        registration: points that appear later (a build that failed here) or change size are
        registered when they do, after a fault too. A live window's first frame waits for the build."""
        try:
            self.engine.wait_ready()
        except CudapatchError as exc:  # the child ended or did not answer: the frames say why
            log.warning("preview: the engine process did not build its first graph: %s", exc)
            return
        self._sync_points()

    def _sync_points(self) -> None:
        """(Re)create the GL vertex buffer(s) when the points output appears or changes size."""
        block, port = self.points  # type: ignore[misc]
        out = self.bridge.output_buffer(block, port)
        if out is None:
            return
        current = self._ring or self._point_buffer
        if current is not None and current.nbytes == out.nbytes:
            return
        if current is not None:
            self.bridge.close()
            self._point_renderer.close()  # type: ignore[union-attr]
            current.close()
            self._ring = self._point_buffer = None
            self.bridge = GlBridge(self.engine, label="preview")
            if self._texture is not None:
                self.bridge.show_texture(
                    self.image[0],  # type: ignore[index]
                    self.image[1],  # type: ignore[index]
                    self._texture,
                    channels=self._channels,
                )
            if self._image is not None:
                self.bridge.show_buffer_ring(self.image[0], self.image[1], self._image.ring)  # type: ignore[index]
        label = f"{block.name}.{port}"
        if self.zero_map:
            ring = self._ring_cls(out.nbytes, device=self.engine.device.ordinal, label=label)
            if ring.shares_memory():
                self._ring = ring
            else:
                log.warning(
                    "preview: GL does not see what CUDA writes into imported %d-byte buffers on this driver; "
                    "%s is shared through register + map/unmap instead",
                    out.nbytes,
                    label,
                )
                ring.close()
                self.zero_map = False
        if self._ring is not None:
            self.bridge.show_buffer_ring(block, port, self._ring)
            names = [b.gl_name for b in self._ring.buffers]
        else:
            self._point_buffer = SharedBuffer.create(out.nbytes, flags="write_discard", label=label)
            self.bridge.show_buffer(block, port, self._point_buffer)
            names = [self._point_buffer.gl_name]
        self._point_renderer = PointRenderer(names, out.nbytes // 32)
        log.info("preview: drawing %d points from %s", out.nbytes // 32, label)

    @property
    def points_gl_buffer(self) -> int | None:
        """The GL buffer the last frame drew the points from."""
        if self._ring is not None:
            slot = self._ring.front_slot
            return self._ring.buffers[slot].gl_name if slot >= 0 else None
        return self._point_buffer.gl_name if self._point_buffer is not None else None

    def frame(self, *, settle: bool = False) -> float:
        """Update the engine and draw one frame; returns the host milliseconds it took.

        Args:
            settle: Wait for kernels still compiling (the preview's own writers among them), GL and
                the GPU before and after the engine's launch (for PNG frames): the zero-map ring
                then gets every buffer free and shows this very frame. Live frames never wait;
                they show the newest copy GL and CUDA are done with.

        A GPU fault of the engine's kernels that the preview's own CUDA calls meet before
        ``update()`` does is handed to ``engine.report_fault`` (the frame ends there).
        """
        t0 = time.perf_counter()
        try:
            self._frame(settle, t0)
        except CudaLaunchError as exc:  # a fault of the engine's kernels met by the preview's own CUDA calls
            self.engine.report_fault(exc)
        return (time.perf_counter() - t0) * 1e3

    def _frame(self, settle: bool, t0: float) -> None:
        ctx = self.context
        ctx.make_current()
        if settle:
            self.engine.wait_ready()
        if self.frames == 0 and self.points is not None and self.bridge.copies:
            self._points_before_first_launch()
        rings = self._ring is not None or self._image is not None
        if settle and rings:
            gl().glFinish()  # GL is done with every buffer: this launch's copy request is not dropped
            self.engine.synchronize()
        self.engine.update()
        if settle and rings:
            self.engine.synchronize()  # this launch's copy is done: front() returns it
        if settle:
            self.bridge.catch_up()  # an isolated engine's outputs of this frame, not the one before
            if rings and self.bridge.copies:
                self.engine.synchronize()  # catch_up's copy into the ring is done: front() returns it
        if self.points is not None:
            self._sync_points()
        GL = gl()
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, ctx.framebuffer)
        w, h = ctx.size
        GL.glViewport(0, 0, w, h)
        GL.glClearColor(*self.background, 1.0)
        GL.glClear(GL.GL_COLOR_BUFFER_BIT | GL.GL_DEPTH_BUFFER_BIT)
        if self._texture_renderer is not None:
            name = self._image.front() if self._image is not None else self._texture.gl_name  # type: ignore[union-attr]
            if name is not None:
                self._texture_renderer.draw(name)
        if self._point_renderer is not None:
            which = 0
            if self._ring is not None:
                name = self._ring.front()
                which = -1 if name is None else self._point_renderer.index_of(name)
            if which >= 0:
                vp = orbit_camera(self.frames * self.orbit + math.pi * 0.15, w / max(h, 1))
                self._point_renderer.draw(vp, h, which)
        stats = None
        if self.overlay is not None:
            stats = self.engine.show_frame()  # once per frame: the overlay, its plot and the tooltips
            self.overlay.draw(stats, title=self.engine.name, internal=self.bridge.internal_blocks)
        ctx.swap()
        self.frames += 1
        if stats is not None:
            self.overlay.record_frame((time.perf_counter() - t0) * 1e3, stats.gpu_ms)  # type: ignore[union-attr]

    def run(
        self,
        frames: int | None = None,
        *,
        out_dir: str | Path | None = None,
        png_every: int = 0,
        before_frame: Callable[[], None] | None = None,
        start: int = 0,
    ) -> PreviewReport:
        """Run frames until ``frames`` are done, the window is closed or the engine is lost (CUDA
        refused to continue after a GPU fault: ``engine.lost``).

        Args:
            frames: Number of the last frame (None: until the window closes).
            out_dir: Write PNGs there: the last frame, and every ``png_every`` frames if > 0.
            png_every: See ``out_dir``.
            before_frame: Called before each frame (a host polling its patch file, a script
                animating parameters).
            start: Frames already run (by a process this one replaced): numbering goes on from it.
        """
        report = PreviewReport()
        out = Path(out_dir) if out_dir is not None else None
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        while frames is None or start + report.frames < frames:
            if getattr(self.context, "should_close", False) or getattr(self.engine, "lost", None):
                break
            if hasattr(self.context, "poll_events"):
                self.context.poll_events()
            number = start + report.frames + 1
            last = frames is not None and number == frames
            png = out is not None and (last or (png_every > 0 and number % png_every == 0))
            if before_frame is not None:
                before_frame()
            # Zero-map shows the newest copy GL and CUDA are done with, which can be many frames old
            # where GL draws slowly (H100: graphics on few SMs); a PNG shows the frame it is named for.
            self.frame(settle=png)
            report.frames += 1
            if png:
                report.pngs.append(write_png(out / f"frame_{number:05d}.png", self.context.read_pixels()))
        lost = getattr(self.engine, "lost", None)
        gl().glFinish()
        if not lost:  # a lost engine's stream only returns its fault
            self.engine.synchronize()
        report.seconds = time.perf_counter() - t0
        return report

    def close(self) -> None:
        """Release the bridge, GL objects and the overlay (idempotent; the context stays open)."""
        if self._closed:
            return
        self._closed = True
        self.context.make_current()
        self.bridge.close()
        if self.editor_panel is not None:  # its node editor context goes before imgui's own
            self.editor_panel.close()
        for ring in (self._ring, self._image.ring if self._image is not None else None):
            if ring is not None:
                log.info("preview: zero-map ring shown slot %d, %d frames dropped", ring.front_slot, ring.dropped)
        for obj in (
            self.overlay,
            self._point_renderer,
            self._texture_renderer,
            self._point_buffer,
            self._ring,
            self._image,
            self._texture,
        ):
            if obj is not None:
                obj.close()

    def __enter__(self) -> Preview:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
