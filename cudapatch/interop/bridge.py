"""``GlBridge``: an engine's outputs shown through GL, and GL buffers fed into an engine.

The bridge registers itself as a frame hook of the engine: before each launch it maps all its
resources with one ``cuGraphicsMapResources`` call on the engine's stream (and rebinds a GL buffer
input whose mapped pointer moved: a Warm update); after the launch it copies outputs into their
GL buffers/textures on the same stream and unmaps everything with one call. Nothing waits: the
unmap orders GL's later use after the copies. A GL texture feeding an input is copied into a
linear buffer before the launch (kernels read linear memory, textures are CUDA arrays).

Copying an output into GL is an explicit choice made here (``show_buffer``/``show_texture``),
never a silent fallback. A device-to-device copy of 1M points (32 MB) is ~15 µs of GPU time.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ..blocks.block import Block
from ..engine.bindings import DeviceArray
from ..errors import InteropError
from ..kernels._driver import check, driver
from .shared import ResourceGroup, SharedBuffer, SharedTexture2D

__all__ = ["GlBridge"]

log = logging.getLogger("cudapatch.interop")


@dataclass
class _Link:
    block: Block
    port: str
    resource: Any
    last_ptr: int = 0
    buffer: Any = None  # a texture input's linear copy bound to the port; a ring's writer block


class GlBridge:
    """Shares GL resources with ``engine``'s graph, mapped in one call around each launch.

    Create it with the GL context and the engine's CUDA context current, on the GL thread.
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self._outputs: list[_Link] = []
        self._textures: list[_Link] = []
        self._inputs: list[_Link] = []
        self._texture_inputs: list[_Link] = []
        self._rings: list[_Link] = []
        self._group: ResourceGroup | None = None
        self._closed = False
        self.copied_bytes = 0
        engine.add_frame_hook(self)

    # -- wiring (not on the frame path) ------------------------------------------------------------
    def show_buffer(self, block: Block, port: str, buffer: SharedBuffer) -> None:
        """After each launch, copy output ``port`` of ``block`` into ``buffer`` (the first
        ``min(output, buffer)`` bytes).

        Raises:
            InteropError: unknown output port, or the bridge is closed.
        """
        self._check(block, port, "output")
        self._outputs.append(_Link(block, port, buffer))
        self._regroup()

    def show_buffer_ring(self, block: Block, port: str, ring: Any) -> None:
        """Copy output ``port`` into the next free buffer of an ``ImportedRing`` every frame (the
        zero-map path). The copy is a ``GlRingWriter`` block added to the engine (it shows in the
        stats with its GPU time; the next update rebuilds the graph once); per frame the host only
        writes the ring's request word: no map, no unmap, no driver call.

        Raises:
            InteropError: unknown output port, the bridge is closed, or the ring cannot be attached.
        """
        from .ring_writer import GlRingWriter

        spec = self._check(block, port, "output")
        writer = GlRingWriter(name=f"{block.name}.{port} to GL", Type=spec.dtype.c_name)
        ring.attach(writer)
        self.engine.add(writer)
        self.engine.connect(block, port, writer, "In")
        self._rings.append(_Link(block, port, ring, buffer=writer))

    def show_texture(self, block: Block, port: str, texture: SharedTexture2D) -> None:
        """After each launch, copy output ``port`` (a linear image, ``width*height`` texels of the
        texture's format) into ``texture``.

        Raises:
            InteropError: unknown output port, or an element type that does not fit the texture.
        """
        spec = self._check(block, port, "output")
        if spec.dtype.itemsize not in (texture.texel_bytes, 1) and texture.texel_bytes % spec.dtype.itemsize:
            raise InteropError(
                f"show_texture: output '{block.name}.{port}' holds {spec.dtype.c_name}, which does not tile "
                f"{texture.label}'s {texture.format} texels"
            )
        self._textures.append(_Link(block, port, texture))
        self._regroup()

    def bind_buffer(self, block: Block, port: str, buffer: SharedBuffer) -> None:
        """Feed GL ``buffer`` to input ``port`` of ``block`` (no copy: the kernel reads GL's memory).

        Raises:
            InteropError: unknown input port.
        """
        self._check(block, port, "input")
        self._inputs.append(_Link(block, port, buffer))
        self._regroup()

    def bind_texture(self, block: Block, port: str, texture: SharedTexture2D) -> None:
        """Feed GL ``texture`` to input ``port`` of ``block``: before each launch the texture is
        copied (on the engine stream, so the graph reads this frame's texels) into a linear buffer
        bound to the port once: rows of ``width`` texels, top row of GL's level 0 first.

        Raises:
            InteropError: unknown input port, or an element type that does not tile the texels.
        """
        spec = self._check(block, port, "input")
        texel = texture.texel_bytes
        if texel % spec.dtype.itemsize:
            raise InteropError(
                f"bind_texture: input '{block.name}.{port}' takes {spec.dtype.c_name}, which does not tile "
                f"{texture.label}'s {texture.format} texels ({texel} bytes)"
            )
        from ..engine.buffers import GpuBuffer

        count = texture.width * texture.height * texel // spec.dtype.itemsize
        buf = GpuBuffer(self.engine.pool, spec.dtype, count, stream=self.engine.device.stream)
        self.engine.bind(block, port, buf)
        self._texture_inputs.append(_Link(block, port, texture, buffer=buf))
        self._regroup()

    def _check(self, block: Block, port: str, kind: str) -> Any:
        if self._closed:
            raise InteropError("GlBridge is closed")
        desc = block.description
        spec = desc.output(port) if kind == "output" else desc.input(port)
        if spec is None:
            raise InteropError(f"GlBridge: block '{block.name}' has no {kind} port '{port}'")
        return spec

    def _regroup(self) -> None:
        resources = []
        for link in self._inputs + self._texture_inputs + self._outputs + self._textures:
            if all(r is not link.resource for r in resources):
                resources.append(link.resource)
        self._group = ResourceGroup(resources) if resources else None

    # -- the frame (called by Engine.update) -----------------------------------------------------
    def before_launch(self, stream: Any) -> None:
        """Request this launch's ring buffers; map every resource (one driver call); rebind GL inputs
        whose pointer moved."""
        for link in self._rings:
            link.resource.request()
        group = self._group
        if group is None:
            return
        group.map(stream=stream)
        for link in self._texture_inputs:  # ordered before the launch on the same stream
            group.mapping(link.resource).copy_to(link.buffer.ptr, stream=stream)
        for link in self._inputs:
            ptr = group.pointer(link.resource)
            if ptr != link.last_ptr:
                spec = link.block.description.input(link.port)
                count = link.resource.nbytes // spec.dtype.itemsize
                self.engine.bind(link.block, link.port, DeviceArray(ptr, count, spec.dtype), dtype=spec.dtype)
                link.last_ptr = ptr

    def after_launch(self, stream: Any) -> None:
        """Copy outputs into their GL resources, then unmap everything (one driver call)."""
        group = self._group
        if group is None:
            return
        graph = self.engine.graph
        d = driver()
        try:
            for link in self._outputs:
                src = graph.output(link.block.id, link.port) if graph is not None else None
                if src is None:  # the block is not running (yet): leave GL's contents alone
                    continue
                dst = group.pointer(link.resource)
                n = min(src.nbytes, link.resource.nbytes)
                check(d.cuMemcpyDtoDAsync(dst, src.ptr, n, stream), f"copy into {link.resource.label}")
                self.copied_bytes += n
            for link in self._textures:
                src = graph.output(link.block.id, link.port) if graph is not None else None
                if src is None:
                    continue
                tex = link.resource
                need = tex.width * tex.height * tex.texel_bytes
                if src.nbytes < need:
                    raise InteropError(
                        f"show_texture: output '{link.block.name}.{link.port}' has {src.nbytes} bytes; "
                        f"{tex.label} ({tex.width}x{tex.height} {tex.format}) needs {need}"
                    )
                group.mapping(tex).copy_from(src.ptr, stream=stream)
                self.copied_bytes += need
        finally:
            group.unmap()

    def close(self) -> None:
        """Detach from the engine (idempotent). The shared resources stay open: their owner closes them."""
        if self._closed:
            return
        self._closed = True
        self.engine.remove_frame_hook(self)
        for link in self._rings:
            self.engine.remove(link.buffer)
        self._group = None

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        n = len(self._outputs) + len(self._textures) + len(self._inputs) + len(self._texture_inputs) + len(self._rings)
        return f"<GlBridge links={n} closed={self._closed}>"
