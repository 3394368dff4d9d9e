"""``GlBridge``: an engine's outputs shown through GL, and GL buffers fed into an engine.

The bridge registers itself as a frame hook of the engine: before each launch it maps all its
resources with one ``cuGraphicsMapResources`` call on the engine's stream, rebinds a GL buffer
input whose mapped pointer moved (a Warm update), and after the launch unmaps everything with one
call. Nothing waits: the unmap orders GL's later use after the graph's writes. An isolated
engine's graph runs in its child process: its outputs are copied in from the child's buffers once
the child has finished the frame (one frame later in a live preview; ``catch_up`` for a frame saved
to a file, and ``synchronize`` copies the last one).

Outputs are copied into GL by blocks the bridge adds to the engine (``gl_writers.py``), so the
copies are graph nodes, not host calls: ``GlBufferWriter`` into a mapped buffer,
``GlSurfaceWriter`` into a texture registered with ``surface_ldst`` (surface stores), and
``GlRingWriter`` into an ``ImportedRing`` (zero-map: nothing is mapped at all). They show in the
engine's stats with their GPU time; adding one rebuilds the graph once. Only a texture without
``surface_ldst`` is still copied from the host (``cuMemcpy2DAsync`` into its array, after the
launch). A GL texture feeding an input is copied into a linear buffer before the launch (kernels
read linear memory, textures are CUDA arrays).

The writer blocks are internal (``Block.internal``): each is named after the output it copies
and where the bridge shows it, ``points.Points -> preview`` (stable across runs, readable in logs
and stats; ``points.Points -> preview 2`` for a second writer of that output and label), and
``internal_blocks`` maps each to the block it copies from, so the overlay shows it dimmed under
that block.

Copying an output into GL is an explicit choice made here (``show_buffer``/``show_texture``),
never a silent fallback. A device-to-device copy of 1M points (32 MB) is ~15 µs of GPU time.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..blocks.block import Block
from ..engine.bindings import DeviceArray
from ..errors import CudaError, CudapatchError, InteropError
from ..kernels._driver import check, driver
from .formats import conversion_for
from .shared import ResourceGroup, SharedBuffer, SharedTexture2D

__all__ = ["GlBridge"]

log = logging.getLogger("cudapatch.interop")


@dataclass
class _Link:
    block: Block
    port: str
    resource: Any
    last_ptr: int = 0  # the mapped address (buffers) or CUarray (textures) the graph was last given
    buffer: Any = None  # a texture input's linear copy bound to the port
    writer: Block | None = None  # the block copying into ``resource`` inside the graph


class GlBridge:
    """Shares GL resources with ``engine``'s graph, mapped in one call around each launch.

    Create it with the GL context and the engine's CUDA context current, on the GL thread.

    Args:
        engine: The engine whose graph reads and writes the GL resources.
        label: Where the outputs are shown, for the writer blocks' names (``points.Points -> preview``).
    """

    def __init__(self, engine: Any, *, label: str = "GL") -> None:
        self.engine = engine
        self.label = label
        self._internal: dict[int, int] = {}  # writer block id -> id of the block whose output it copies
        self._outputs: list[_Link] = []
        self._textures: list[_Link] = []
        self._inputs: list[_Link] = []
        self._texture_inputs: list[_Link] = []
        self._rings: list[_Link] = []
        self._group: ResourceGroup | None = None
        self._closed = False
        # An isolated engine's graph runs in its child process, which cannot reach this process's GL
        # memory: its outputs are copied in from the child's buffers mapped here (``engine.output``),
        # once the frame word says the child finished the frame (``_copy_finished``).
        self._by_copy = bool(getattr(engine, "graph_in_child", False))
        self._sent: int | None = None  # an isolated engine's frame whose outputs are not copied yet
        others = [h for h in getattr(engine, "frame_hooks", ()) if isinstance(h, GlBridge)]
        # What the engine had before any bridge, given back when the last one closes.
        self._frames_ahead = others[0]._frames_ahead if others else getattr(engine, "frames_ahead", None)
        if self._by_copy:  # each frame finished before the next is sent: the next update copies it
            engine.frames_ahead = 1
        engine.add_frame_hook(self)

    # -- wiring (not on the frame path) ------------------------------------------------------------
    def show_buffer(self, block: Block, port: str, buffer: SharedBuffer) -> None:
        """Copy output ``port`` of ``block`` into ``buffer`` every frame (the first
        ``min(output, buffer)`` bytes), by a ``GlBufferWriter`` block in the graph.

        Raises:
            InteropError: unknown output port, or the bridge is closed.
        """
        from .gl_writers import GlBufferWriter

        spec = self._check(block, port, "output")
        if self._by_copy:  # copied after each frame (see __init__)
            self._outputs.append(_Link(block, port, buffer))
            self._regroup()
            return
        writer = GlBufferWriter(name=self._writer_name(block, port), Type=spec.dtype.c_name)
        writer.set("Capacity", buffer.nbytes)
        self._outputs.append(self._add_writer(_Link(block, port, buffer), writer))
        self._regroup()

    def _writer_name(self, block: Block, port: str) -> str:
        # Stable and readable: no addresses (it is what logs and the overlay show). ASCII "->", not an
        # arrow: Windows consoles with a legacy code page cannot print one. Unique in the engine, which
        # refuses a second block of a name: the same output shown twice under one label (two textures,
        # or two bridges of one label) gets "points.Points -> preview 2" for the second, and so on.
        name = base = f"{block.name}.{port} -> {self.label}"
        taken = self.engine.context.registry
        n = 1
        while taken.by_name(name) is not None:
            n += 1
            name = f"{base} {n}"
        return name

    def _add_writer(self, link: _Link, writer: Block) -> _Link:
        self.engine.add(writer)
        try:
            self.engine.connect(link.block, link.port, writer, "In")
        except Exception:
            self.engine.remove(writer)
            raise
        link.writer = writer
        self._internal[writer.id] = link.block.id
        return link

    @property
    def internal_blocks(self) -> Mapping[int, int]:
        """The internal blocks this bridge added (its GL writers): block id -> the id of the block whose
        output each copies. A live view (no copy per frame): the overlay groups and dims them with it."""
        return self._internal

    def show_buffer_ring(self, block: Block, port: str, ring: Any) -> None:
        """Copy output ``port`` into the next free buffer of an ``ImportedRing`` every frame (the
        zero-map path). The copy is a ``GlRingWriter`` block added to the engine (it shows in the
        stats with its GPU time; the next update rebuilds the graph once); per frame the host only
        writes the ring's request word: no map, no unmap, no driver call. An isolated engine's child
        cannot write this process's memory: its finished frames are copied in from here
        (``ImportedRing.write`` on the engine's stream), still without a map.

        Raises:
            InteropError: unknown output port, the bridge is closed, or the ring cannot be attached.
        """
        from .gl_writers import GlRingWriter

        spec = self._check(block, port, "output")
        if self._by_copy:  # the child cannot write this process's memory: fed from here (ring.write)
            self._rings.append(_Link(block, port, ring))
            return
        writer = GlRingWriter(name=self._writer_name(block, port), Type=spec.dtype.c_name)
        ring.attach(writer)
        self._rings.append(self._add_writer(_Link(block, port, ring), writer))

    def show_texture(self, block: Block, port: str, texture: SharedTexture2D, *, channels: int = 1) -> None:
        """Copy output ``port`` (a linear image, ``width*height`` texels of the texture's format) into
        ``texture`` every frame: by surface stores of a ``GlSurfaceWriter`` block in the graph when
        the texture is registered with ``surface_ldst``, else by a copy after each launch. An image no
        texture holds texel for texel (``channels`` values of the output's type per pixel; see
        ``formats.conversion_for``) shown in the R32F/RGBA32F texture of its conversion is converted
        to floats by a ``GlConvertWriter`` block instead.

        Raises:
            InteropError: unknown output port, an element type that does not fit the texture, or a
                converted image in a texture not registered with ``surface_ldst`` or of an isolated engine.
        """
        spec = self._check(block, port, "output")
        conv = conversion_for(spec.dtype, channels)
        if conv is not None and texture.format == conv.texture:
            if self._by_copy:  # the writer would run in the child, which cannot reach this process's texture
                raise InteropError(
                    f"show_texture: output '{block.name}.{port}' ({spec.dtype.c_name} x{channels}) needs a conversion "
                    "kernel, which an isolated engine cannot run into this process's texture: convert it to "
                    "float, float4 or uchar4 in a block"
                )
            if not texture.surface_writable:
                raise InteropError(
                    f"show_texture: output '{block.name}.{port}' ({spec.dtype.c_name} x{channels}) is converted "
                    f"into {texture.label} by surface stores: register it with flags='surface_ldst'"
                )
            from .gl_writers import GlConvertWriter

            name = self._writer_name(block, port)
            writer = GlConvertWriter(name=name, Type=spec.dtype.c_name, Channels=str(channels))
            writer.set("Width", texture.width)
            writer.set("Height", texture.height)
            link = self._add_writer(_Link(block, port, texture), writer)
            self._textures.append(link)
            self._regroup()
            return
        if spec.dtype.itemsize not in (texture.texel_bytes, 1) and texture.texel_bytes % spec.dtype.itemsize:
            raise InteropError(
                f"show_texture: output '{block.name}.{port}' holds {spec.dtype.c_name}, which does not tile "
                f"{texture.label}'s {texture.format} texels"
            )
        link = _Link(block, port, texture)
        if texture.surface_writable and not self._by_copy:
            from .gl_writers import GlSurfaceWriter

            name = self._writer_name(block, port)
            writer = GlSurfaceWriter(name=name, Type=spec.dtype.c_name, Texel=str(texture.texel_bytes))
            writer.set("Width", texture.width)
            writer.set("Height", texture.height)
            self._add_writer(link, writer)
        self._textures.append(link)
        self._regroup()

    def bind_buffer(self, block: Block, port: str, buffer: SharedBuffer) -> None:
        """Feed GL ``buffer`` to input ``port`` of ``block`` (no copy: the kernel reads GL's memory).

        Raises:
            InteropError: unknown input port.
        """
        self._check(block, port, "input")
        self._refuse_input("bind_buffer")
        self._inputs.append(_Link(block, port, buffer))
        self._regroup()

    def bind_texture(self, block: Block, port: str, texture: SharedTexture2D) -> None:
        """Feed GL ``texture`` to input ``port`` of ``block``: before each launch the texture is
        copied (on the engine stream, so the graph reads this frame's texels) into a linear buffer
        bound to the port once: rows of ``width`` texels, top row of GL's level 0 first, with the
        shape ``(height, width)`` (a texel's scalars as channels when the port takes one of them).

        Raises:
            InteropError: unknown input port, or an element type that does not tile the texels.
        """
        spec = self._check(block, port, "input")
        self._refuse_input("bind_texture")
        texel = texture.texel_bytes
        if texel % spec.dtype.itemsize:
            raise InteropError(
                f"bind_texture: input '{block.name}.{port}' takes {spec.dtype.c_name}, which does not tile "
                f"{texture.label}'s {texture.format} texels ({texel} bytes)"
            )
        from ..blocks.shape import Shape
        from ..engine.buffers import GpuBuffer

        per_texel = texel // spec.dtype.itemsize  # a uchar4 port reads an RGBA8 texel as one element
        count = texture.width * texture.height * per_texel
        buf = GpuBuffer(self.engine.pool, spec.dtype, count, stream=self.engine.device.stream)
        # An image: (height, width), a texel's scalars as channels when the port's type is one of them,
        # so image blocks size their launches and outputs from it.
        self.engine.bind(block, port, buf, shape=Shape.of(texture.height, texture.width, channels=per_texel))
        self._texture_inputs.append(_Link(block, port, texture, buffer=buf))
        self._regroup()

    def _refuse_input(self, what: str) -> None:
        if self._by_copy:
            raise InteropError(
                f"{what}: the engine runs in a child process, which cannot read this process's GL memory; "
                "bind a CUDA array (engine.bind) with the values instead"
            )

    def _check(self, block: Block, port: str, kind: str) -> Any:
        if self._closed:
            raise InteropError("GlBridge is closed")
        desc = block.description
        spec = desc.output(port) if kind == "output" else desc.input(port)
        if spec is None:
            raise InteropError(f"GlBridge: block '{block.name}' has no {kind} port '{port}'")
        keep = getattr(self.engine, "keep", None)
        if kind == "output" and keep is not None:
            keep(block, port)  # GL reads it after the frame: buffer reuse must not give its memory to another output
        return spec

    def _regroup(self) -> None:
        resources = []
        for link in self._inputs + self._texture_inputs + self._outputs + self._textures:
            if all(r is not link.resource for r in resources):
                resources.append(link.resource)
        self._group = ResourceGroup(resources) if resources else None

    # -- the frame (called by Engine.update) -----------------------------------------------------
    def before_launch(self, stream: Any) -> None:
        """Request this launch's ring buffers; map every resource (one driver call); give the graph's
        writers and GL inputs the mapped addresses where they moved (Hot / Warm updates). With an
        isolated engine: copy in the outputs of the frame sent last, if the child has finished it."""
        if self._by_copy:
            self._copy_finished(stream, wait=not getattr(self.engine, "drop_frames", True))
            return
        for link in self._rings:
            link.resource.request()
        group = self._group
        if group is None:
            return
        group.map(stream=stream)
        try:
            self._give_mapped(group, stream)
        except BaseException:
            group.unmap()  # mapped until after the launch only: a failed frame leaves nothing mapped
            raise

    def _give_mapped(self, group: ResourceGroup, stream: Any) -> None:
        for link in self._texture_inputs:  # ordered before the launch on the same stream
            group.mapping(link.resource).copy_to(link.buffer.ptr, stream=stream)
        for link in self._inputs:
            ptr = group.pointer(link.resource)
            if ptr != link.last_ptr:
                spec = link.block.description.input(link.port)
                count = link.resource.nbytes // spec.dtype.itemsize
                self.engine.bind(link.block, link.port, DeviceArray(ptr, count, spec.dtype), dtype=spec.dtype)
                link.last_ptr = ptr
        for link in self._outputs:
            if link.writer is None:  # copied after the frame
                continue
            ptr = group.pointer(link.resource)
            if ptr != link.last_ptr:
                link.writer.set("Dst", ptr)  # type: ignore[union-attr]
                link.last_ptr = ptr
        for link in self._textures:
            if link.writer is not None:
                array = group.array(link.resource)
                if int(array) != link.last_ptr:
                    link.writer.set("Surface", link.resource.surface_object(array))
                    link.last_ptr = int(array)

    def after_launch(self, stream: Any) -> None:
        """Copy outputs into textures that surface stores cannot write, then unmap everything (one
        driver call). With an isolated engine: note the frame sent, copied in by a later call."""
        if self._by_copy:
            self._sent = self.engine.frames_sent
            return
        group = self._group
        if group is None:
            return
        try:
            for link in self._textures:
                if link.writer is not None:
                    continue
                src = self.output_buffer(link.block, link.port)
                if src is None:  # the block is not running (yet): leave GL's contents alone
                    continue
                self._copy_texture(group, link, src, stream)
        finally:
            group.unmap()

    def before_wait(self) -> None:
        """An isolated engine's frames are all finished (or let past) and this process is about to wait
        for its stream: copy in the last frame's outputs, so GL holds them once ``synchronize`` returns."""
        if self._by_copy:
            self._copy_finished(self.engine.stream, wait=False)

    def catch_up(self) -> None:
        """An isolated engine: wait for the frame sent last and copy its outputs in now (a frame saved
        to a file shows the frame it is named for). Nothing otherwise: the graph wrote GL already."""
        if self._by_copy:
            self._copy_finished(self.engine.stream, wait=True)

    def _copy_finished(self, stream: Any, *, wait: bool) -> None:
        """Copy on ``stream`` the outputs of the isolated engine's frame sent last (into rings as they
        are, into buffers and textures mapped for the copy), once the frame word says the child
        finished it (``wait``: wait for that, reading its pipe; else a frame still running is copied
        by a later call, or never if another is sent first).

        So no map, and no GL work after an unmap, waits on the GPU for a frame the child has not
        finished: a slow or stuck child leaves GL drawing the last frame it finished. The child's next
        frame waits for the host's stream to let it start, after these copies: no frame is read while
        it is written.
        """
        n, group = self._sent, self._group
        if n is None or (group is None and not self._rings):
            return
        done = self.engine.frame_finished(n, wait=wait)
        if done is False:
            return
        self._sent = None
        if done is None:  # the child ended before finishing it: its outputs are gone, GL keeps the last
            return
        for link in self._rings:  # imported memory: a copy and an event, no map
            src = self.output_buffer(link.block, link.port)
            if src is not None:
                link.resource.write(src.ptr, src.nbytes, stream)
        if group is None:
            return
        group.map(stream=stream)
        try:
            for link in self._outputs:
                src = self.output_buffer(link.block, link.port)
                if src is not None:
                    count = min(src.nbytes, link.resource.nbytes)
                    dst = group.pointer(link.resource)
                    check(driver().cuMemcpyDtoDAsync(dst, src.ptr, count, stream), "cuMemcpyDtoDAsync")
            for link in self._textures:
                src = self.output_buffer(link.block, link.port)
                if src is not None:
                    self._copy_texture(group, link, src, stream)
        finally:
            group.unmap()

    def _copy_texture(self, group: ResourceGroup, link: _Link, src: Any, stream: Any) -> None:
        """Copy ``src`` (an output's buffer) into the texture of ``link``, mapped in ``group``."""
        tex = link.resource
        need = tex.width * tex.height * tex.texel_bytes
        if src.nbytes < need and self._by_copy:  # (in process a writer block writes what it has)
            if link.last_ptr != -1:
                log.warning(
                    "%s: output '%s.%s' has %d bytes, fewer than its %dx%d texture's %d: not shown",
                    self.label,
                    link.block.name,
                    link.port,
                    src.nbytes,
                    tex.width,
                    tex.height,
                    need,
                )
                link.last_ptr = -1
            return
        if src.nbytes < need:
            raise InteropError(
                f"show_texture: output '{link.block.name}.{link.port}' has {src.nbytes} bytes; "
                f"{tex.label} ({tex.width}x{tex.height} {tex.format}) needs {need}"
            )
        group.mapping(tex).copy_from(src.ptr, stream=stream)

    @property
    def copies(self) -> bool:
        """Whether outputs reach GL by a copy after each frame (an isolated engine: its graph runs in a
        child process), not by writer blocks in the graph."""
        return self._by_copy

    def output_buffer(self, block: Block, port: str) -> Any:
        """The running graph's buffer of output ``port`` (``ptr``, ``nbytes``; an isolated engine's
        mapped here), or None while the block is not running."""
        if self._by_copy:
            try:
                # No pipe reading here (a frame hook runs inside update(): a restart the pipe holds is
                # taken at the start of the next one), and no keep (the preview keeps what it shows).
                return self.engine.output(block, port, keep=False, poll=False)
            except CudaError:  # mapping the child's memory failed: say so, every frame
                raise
            except CudapatchError:  # not running in the child (yet), or kept from the next frame on
                return None
        graph = self.engine.graph
        return graph.output(block.id, port) if graph is not None else None

    def close(self) -> None:
        """Detach from the engine (idempotent). The shared resources stay open: their owner closes them."""
        if self._closed:
            return
        self._closed = True
        self.engine.remove_frame_hook(self)
        if self._by_copy and not any(isinstance(h, GlBridge) for h in getattr(self.engine, "frame_hooks", ())):
            self.engine.frames_ahead = self._frames_ahead  # the last bridge: the child may run ahead again
        for link in self._outputs + self._textures + self._rings:
            if link.writer is not None:
                self.engine.remove(link.writer)
        self._internal.clear()
        self._group = None

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        n = len(self._outputs) + len(self._textures) + len(self._inputs) + len(self._texture_inputs) + len(self._rings)
        return f"<GlBridge links={n} closed={self._closed}>"
