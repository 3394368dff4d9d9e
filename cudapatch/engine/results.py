"""What a host reads from an engine: the running graph's outputs, append buffers, statistics and
diagnostics, the engine's one-line summary, and its stream, pool, libraries and modules.

``EngineResults`` is a base class of ``Engine`` (the reading half of its public API, apart from the
editing half in ``editing.py`` and the frame in ``engine.py``). Nothing here runs on the frame path:
``read`` synchronizes by design, ``stats`` does its arithmetic on the readback ring's host copy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..blocks.block import Block
from ..blocks.shape import Shape
from ..errors import CudapatchError
from .buffers import AppendBuffer, BufferPool, GpuBuffer
from .compiler.fusion import in_fused_node
from .diagnostics import Diagnostic
from .profiling import EngineStats, ProfilingLevel
from .region_stats import region_iterations, region_warnings, show_iterations
from .stats import append_warnings, collect_stats, newest_frame, show_on_blocks

if TYPE_CHECKING:
    from ..kernels.module_cache import ModuleCache
    from .board import DiagnosticBoard
    from .context import Context
    from .device import DeviceContext
    from .kernels import KernelTracker
    from .libraries import LibraryHandles
    from .realize import CompiledGraph
    from .resources import DeviceResources
    from .structure import StructureTier

__all__ = ["EngineResults"]


class EngineResults:
    """The reading half of ``Engine``'s API (see ``Engine`` for the objects it reads)."""

    name: str
    resources: DeviceResources
    device: DeviceContext
    context: Context
    kernels: KernelTracker
    profiling: ProfilingLevel
    _board: DiagnosticBoard
    _structure: StructureTier
    _last_gpu_ms: float | None
    _frame_hooks: tuple[Any, ...]

    # -- the device, for hosts that interoperate ------------------------------------------------------
    @property
    def stream(self) -> Any:
        """The ``CUstream`` every frame is launched on (read-only): a non-blocking stream of the
        device's primary context.

        For hosts that interoperate: work queued on this stream after ``update()`` runs after that
        frame, and work queued before it runs before the frame, with no synchronize, e.g. CuPy::

            s = cupy.cuda.Stream.from_external(engine)  # CuPy >= 14; before: ExternalStream(int(engine.stream))
            engine.update()
            with s:
                result = cupy.asarray(engine.output(block, "Out")) * 2  # after the frame

        Outputs are only valid for work ordered after the frame this way (or after
        ``synchronize()``). A GPU fault renews the stream with the context (see ``engine.recovery``):
        take it again after a fault instead of keeping it.
        """
        return self.resources.stream

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol (version 0, ``int(engine.stream)``): libraries that take a stream
        object (CuPy's ``Stream.from_external``, cuda.core) order their work with the engine's frames."""
        return 0, int(self.resources.stream)

    @property
    def pool(self) -> BufferPool:
        """The buffer pool (a new one after a GPU fault reset the context)."""
        return self.resources.pool

    @property
    def libraries(self) -> LibraryHandles:
        """cuBLAS/cuFFT/cuRAND/cuSOLVER/cuSPARSE handles, plans and workspaces for captured calls."""
        return self.resources.libraries

    @property
    def modules(self) -> ModuleCache:
        """The modules loaded into the engine's context."""
        return self.resources.modules

    @property
    def graph(self) -> CompiledGraph | None:
        """The compiled graph running now (None before the first successful build)."""
        return self.resources.graph

    def synchronize(self) -> None:
        """Wait for all launched frames.

        Raises:
            CudaError: a launched kernel faulted.
        """
        self.device.make_current()
        for h in self._frame_hooks:  # what a hook does before this thread blocks (``add_frame_hook``)
            wait = getattr(h, "before_wait", None)
            if wait is not None:
                wait()
        self.device.synchronize()

    def output(self, block: Block, port: str, *, keep: bool = True) -> GpuBuffer:
        """The device buffer of an output (valid until the next rebuild; view it with CuPy for no copy).
        A value inside a FrameDelay loop lives in two buffers that swap every frame: this is the one
        the frame launched last wrote (take it again each frame).

        The output is kept in a buffer of its own from then on (``keep``), so the view stays valid and
        its data stays readable: buffer reuse never lets another value overwrite it, and fusion never
        computes it inside another block's kernel. If the running graph already lets a later value
        overwrite it, or fused it away, this raises, and the next ``update()`` builds the graph that
        keeps it (call ``keep`` before the first update to avoid that). ``keep=False`` only looks
        (sizes for a tooltip): the output may stay shared or fused.

        Raises:
            CudapatchError: the block is not compiled, has no such output, or (once) its buffer is
                reused by a later output in the running graph, or it is fused away.
        """
        if block.description.output(port) is None:
            raise CudapatchError("no such output port", block=block.name, port=port)
        g = self.resources.graph
        buf = g.output(block.id, port) if g is not None else None
        # Why the running graph holds no readable value: a later value of the frame overwrites it
        # (buffer reuse), or it is computed inside a fused kernel (no buffer holds it).
        overwritten = g is not None and g.overwritten(block.id, port)
        fused = g is not None and buf is None and not overwritten and in_fused_node(g.plan, block.id)
        if keep:  # later builds keep it in a buffer of its own; the next one comes now if it is unreadable
            self.context.keep(block, port, rebuild=overwritten or fused)
        if overwritten and (keep or buf is None):
            how = (
                ", so its data is gone by the end of the frame; it is kept in its own buffer from the next "
                "update() on (to keep it from the start: engine.keep(block, port) before the first "
                "update, keep=True on the port, or Engine(reuse_buffers=False))"
                if keep
                else ""
            )
            raise CudapatchError(
                f"this output shares its buffer with outputs written after it in the frame (buffer reuse){how}",
                block=block.name,
                port=port,
            )
        if fused:
            how = (
                "; it is kept in its own buffer from the next update() on (to keep it from the start: "
                "engine.keep(block, port) before the first update, keep=True on the port, fuse=False on "
                "the block, or Engine(fuse=False))"
                if keep
                else ": engine.keep(block, port), or output() with keep=True, keeps it from the next update() on"
            )
            raise CudapatchError(
                f"this output is computed inside a fused kernel (elementwise fusion) and held in no buffer{how}",
                block=block.name,
                port=port,
            )
        if buf is None:
            raise CudapatchError("block is not running in the current graph", block=block.name, port=port)
        return buf

    def read(self, block: Block, port: str) -> np.ndarray:
        """Copy an output to the host. **Synchronizes** (by design): not for the frame path.

        Append outputs return only the elements written in the last frame; 2-D and 3-D outputs come
        shaped ``(h, w)`` / ``(d, h, w)`` (then channels, then vector lanes).

        Raises:
            CudapatchError: not compiled or no such output.
            CudaError: the copy failed (a kernel fault surfaces here).
        """
        buf = self.output(block, port)
        self.synchronize()
        data = buf.download()
        g = self.resources.graph
        ab = g.appends.get((block.id, port)) if g is not None else None
        if ab is not None:
            assert g is not None and g.counters is not None
            # The readback block holds the timestamps (uint64) first, then the counters (uint32).
            words = g.counters.download().view(np.uint32)
            raw = int(words[2 * g.plan.stamp_count + ab.counter_index])
            return data[: min(raw, ab.capacity)]
        shape = g.plan.shapes.get((block.id, port)) if g is not None else None
        if shape is not None:  # a 2-D/3-D output reads as an image or volume: (h, w[, channels][, lanes])
            data = data.reshape(shape.dims + ((shape.channels,) if shape.channels > 1 else ()) + data.shape[1:])
        return data

    def output_shape(self, block: Block, port: str) -> Shape:
        """The Shape of an output in the running graph (``(count,)`` for flat outputs).

        Raises:
            CudapatchError: not compiled or no such output.
        """
        if block.description.output(port) is None:
            raise CudapatchError("no such output port", block=block.name, port=port)
        g = self.resources.graph
        shape = g.plan.shapes.get((block.id, port)) if g is not None and block.id in g.plan.block_nodes else None
        if shape is not None:  # the plan knows it, whether or not a buffer of its own holds the value yet
            return shape
        # Only looks (keep=False): asking a value's shape (a preview about to show it, which keeps it
        # itself) must not raise because the running graph lets a later value reuse its buffer.
        return Shape.flat(self.output(block, port, keep=False).count)

    def iterations(self, region: Block) -> int | None:
        """The iterations a ``While`` or ``For`` ran in the newest completed frame, read from the
        readback ring without waiting (None before a frame completed, or for an If). Its age is the
        ring's (``stats().age``): a frame or two behind the last ``update()``."""
        return region_iterations(self.resources.graph, region.id)

    def append_buffer(self, block: Block, port: str) -> AppendBuffer:
        """The append buffer of an append output; its ``count`` is from the last completed frame.

        Raises:
            CudapatchError: not compiled or not an append output.
        """
        g = self.resources.graph
        ab = g.appends.get((block.id, port)) if g is not None else None
        if ab is None:
            raise CudapatchError("no running append output of this name", block=block.name, port=port)
        return ab

    def stats(self) -> EngineStats:
        """GPU times (per block, per kernel), append fill, occupancy and pool use of the newest completed
        frame, read without waiting. It only reads: no diagnostic and no block changes (its
        ``diagnostics`` include the frame's own warnings, e.g. an append output nearly full;
        ``show_frame`` publishes them and puts the numbers on the blocks).

        Cost is paid only here (host-side arithmetic on the ring's copy of the timestamps), never on
        the frame path.

        Raises:
            CudaError: a driver call failed (a GPU fault surfaces here).
        """
        return self._read_frame(show=False)

    def show_frame(self) -> EngineStats:
        """Read the newest completed frame as ``stats()`` does, and show it: its per-frame warnings
        (append outputs nearly full, a While stopped at ``Max``) replace the last shown frame's on the
        diagnostics board, published on the blocks, and its numbers go where ``str(block)`` and
        ``str(engine)`` show them (GPU time, append fill at the Deep levels, a loop's ``Iterations:
        n/limit``). A host calls it at its frame boundary where it displays the patch (the preview's
        overlay does, once per frame); ``update()`` never does, so a quiet frame pays nothing for it.

        Returns:
            The ``EngineStats`` shown.

        Raises:
            CudaError: a driver call failed (a GPU fault surfaces here).
        """
        return self._read_frame(show=True)

    def _read_frame(self, *, show: bool) -> EngineStats:
        self.device.make_current()
        g = self.resources.graph
        registry = self.context.registry
        with newest_frame(g) as reading:  # every value below is of this one frame
            warned = append_warnings(g.appends, registry) if g is not None and reading.frame is not None else ()
            if g is not None and reading.frame is not None and g.plan.regions:
                warned += region_warnings(g, registry)
            if show:  # published first: ``with_frame`` then finds them merged already
                self._board.frame_warnings(warned)
            stats = collect_stats(
                level=self.profiling,
                blocks=registry,
                graph=g,
                reading=reading,
                pool=self.resources.pool,
                diagnostics=self._board.with_frame(warned),
            )
            if show:
                show_on_blocks(stats, registry)
                if g is not None and g.plan.regions:
                    show_iterations(g, registry)  # "Iterations: 1860/20000" in a loop's tooltip
                self._last_gpu_ms = stats.gpu_ms  # "Launch: 2.10ms" in str(engine)
        return stats

    def diagnostics(self, block: Block | None = None) -> tuple[Diagnostic, ...]:
        """Current diagnostics (of one block, if given)."""
        if block is None:
            return self._board.current
        return self._board.of_block(block.id)

    @property
    def blocks(self) -> tuple[Block, ...]:
        """The registered blocks, in the order they were added."""
        return tuple(self.context.registry)

    def __str__(self) -> str:
        g = self.resources.graph
        kernels = g.kernel_count if g is not None else 0
        mb, pool = 1 / 2**20, self.resources.pool
        compiling = f" ({len(self.kernels.pending)} compiling)" if self.kernels.pending else ""
        if self._structure.building:
            compiling += " (building)"
        launch = f"  Launch: {self._last_gpu_ms:.2f}ms\n" if self._last_gpu_ms is not None else ""
        return (
            f"{self.name}: {len(self.context.registry)} blocks, {kernels} kernels{compiling}\n"
            f"{launch}"
            f"  Profiling: {self.profiling}\n"
            f"  Pool: {pool.in_use_bytes * mb:.1f} MB / {pool.total_allocated_bytes * mb:.1f} MB"
            f"{self._reuse_line(g, mb)}"
        )

    @staticmethod
    def _reuse_line(g: CompiledGraph | None, mb: float) -> str:
        """What buffer reuse saves in the running graph (empty when nothing shares)."""
        mem = g.plan.memory if g is not None else None
        if mem is None or not mem.buffer_values():
            return ""
        return f"\n  Buffers: {g.plan.total_buffer_bytes * mb:.1f} MB for {mem.logical_bytes * mb:.1f} MB of outputs"  # type: ignore[union-attr]
