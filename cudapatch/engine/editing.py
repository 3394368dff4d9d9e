"""Editing the patch an engine runs: blocks, links, bindings, frame hooks and the profiling level.

``PatchEditing`` is a base class of ``Engine`` (the editing half of its public API). Every edit only
marks what changed (``DirtyTracker``); the next ``update()`` applies it with the cheapest tier, so an
edit costs the host microseconds whatever the patch size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..blocks.block import Block
from ..blocks.shape import Shape
from ..errors import BindingError
from ..kernels.types import DType
from .bindings import device_binding
from .buffers import GpuBuffer
from .context import ExternalBinding
from .probes import Probe, ProbeSet
from .profiling import ProfilingLevel

if TYPE_CHECKING:
    from .board import DiagnosticBoard
    from .context import Context
    from .dirty import DirtyTracker
    from .faults import FaultState
    from .resources import DeviceResources
    from .structure import StructureTier

__all__ = ["PatchEditing"]


def _stream_handle(stream: Any) -> int | None:
    """The engine stream as the integer handle DLPack producers take (None: none yet; DLPack reserves 0)."""
    try:
        return (int(stream) or None) if stream is not None else None
    except (TypeError, ValueError):
        return None


class PatchEditing:
    """The editing half of ``Engine``'s API (see ``Engine`` for the objects it edits)."""

    resources: DeviceResources
    context: Context
    profiling: ProfilingLevel
    _faults: FaultState
    _board: DiagnosticBoard
    _dirty: DirtyTracker
    _structure: StructureTier
    _frame_hooks: tuple[Any, ...]
    _probes: ProbeSet

    def add(self, block: Block, *, region: Block | None = None) -> Block:
        """Register ``block`` with this engine (Cold on the next update), inside ``region`` (an ``If``,
        ``While`` or ``For`` added before) if given. Returns it.

        Raises:
            CudapatchError: ``region`` is not a region of this engine.
        """
        self._faults.patch_edited()
        self.context.register_block(block)
        if region is not None:
            self.context.place(block, region)
        return block

    def place(self, block: Block, region: Block | None) -> None:
        """Move ``block`` into ``region`` (an ``If``, ``While`` or ``For``), or to the top level with
        None (Cold on the next update); its links stay. See ``cudapatch.blocks.regions``.

        Raises:
            CudapatchError: ``region`` is not a region of this engine, or is ``block`` or inside it.
        """
        self._faults.patch_edited()
        self.context.place(block, region)

    def remove(self, block: Block) -> None:
        """Unregister ``block``, dropping its links (Cold on the next update)."""
        self.resources.drop_uploads(block.id, later=self._structure.building)  # a build in flight may read them
        self._faults.block_removed(block.id)
        self.context.unregister_block(block)
        self._board.clear_block_error(block.id)

    def disable(self, block: Block, reason: str) -> None:
        """Leave ``block``'s kernels out of the graph, as after a GPU fault: its outputs read as zeros,
        blocks reading them are warned, and ``reason`` is its error diagnostic until its code changes
        (Cold on the next update). A host that restarted its process after a fault uses it to keep
        the faulting block off."""
        self._faults.disable(block.id, reason)
        self._dirty.mark_structure()

    def connect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> None:
        """Link an output to an input (Cold on the next update).

        Raises:
            LinkError: unknown port, incompatible pins, a cycle, or a block of another engine.
        """
        self._faults.patch_edited()
        self.context.connect(src, src_port, dst, dst_port)

    def disconnect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> bool:
        """Remove a link (Cold on the next update); returns whether it existed."""
        self._faults.patch_edited()
        return self.context.disconnect(src, src_port, dst, dst_port)

    def bind(
        self, block: Block, port: str, array: Any, *, dtype: DType | None = None, shape: Shape | None = None
    ) -> None:
        """Bind external data to an input port.

        ``array`` may be a ``GpuBuffer``, any object with ``__cuda_array_interface__`` (CuPy, Numba,
        PyTorch: bound without a copy; keep it alive and finish writing it before the next update),
        a DLPack tensor on the device (PyTorch's bfloat16 tensors, which that interface refuses: the
        producer orders its pending writes before the engine's stream), or a host array (copied into
        an engine-owned buffer; binding a host array of the same size again only re-uploads). A
        different device pointer of the same size is a Warm update; a different size is Cold.
        ``shape``: what a ``GpuBuffer`` holds (an image: ``Shape.of(h, w)``; arrays bring their own),
        else it is flat.

        Raises:
            BindingError: unknown port, wrong element type, non-contiguous memory, a ``shape`` that does
                not hold the buffer's elements or that is given for anything but a ``GpuBuffer``.
        """
        inp = block.description.input(port)
        if inp is None:
            raise BindingError("unknown input port", block=block.name, port=port)
        want = dtype or inp.dtype
        if shape is not None and (not isinstance(array, GpuBuffer) or shape.count != array.count):
            held = f"{array.count} elements" if isinstance(array, GpuBuffer) else "an array with a shape of its own"
            raise BindingError(f"shape {shape} does not describe {held}", block=block.name, port=port)
        if isinstance(array, GpuBuffer):
            flat = shape is None or (shape.ndim == 1 and shape.channels == 1)  # bindings keep None for flat
            binding = ExternalBinding(array.ptr, array.count, array.dtype, owner=array, shape=None if flat else shape)
        else:
            binding = device_binding(array, want, block.name, port, stream=_stream_handle(self.resources.stream))
            if binding is None:  # a host array
                binding = self.resources.upload(block.id, port, array, want, block.name)
        self._faults.input_bound(block.id, port)
        self.context.bind_input(block, port, binding)

    def probe(self, block: Block, port: str, *, shape: tuple[int, int] | None = None) -> Probe:
        """Probe a wire: min, max, mean and NaN/Inf counts of output ``port`` (an input: the output linked
        into it), computed by a probe node inside the graph and read back through the readback ring.
        ``probe.stats`` is the newest completed frame's (with its frame number); reading it never waits.
        ``shape`` ``(height, width)`` makes it an image with a thumbnail (see ``engine.probes``).

        Adding or closing a probe is a structure edit: built on the build thread while the running graph
        keeps launching. The same output probed twice gives the same ``Probe``.

        Raises:
            LinkError: unknown port, an unlinked input, or another engine's block.
        """
        return self._probes.add(block, port, shape)

    @property
    def probes(self) -> tuple[Probe, ...]:
        """The open probes."""
        return tuple(self._probes)

    def keep(self, block: Block, port: str, keep: bool = True) -> None:
        """Keep an output (or the value an input reads) in a buffer of its own: buffer reuse never
        lets another value overwrite it, so it can be read after each frame (Cold on the next update
        if that changes the plan). ``output`` and ``read`` keep what they are asked for by
        themselves; ``keep=False`` lets a port share again.

        Raises:
            CudapatchError: the block has no such port.
        """
        self.context.keep(block, port, keep)

    def add_frame_hook(self, hook: Any) -> None:
        """Call ``hook.before_launch(stream)`` and ``hook.after_launch(stream)`` around every launch,
        and ``hook.before_wait()`` before this process blocks on the engine's stream (``synchronize``).

        For GL interop (``cudapatch.interop.GlBridge``): mapping and unmapping shared resources on
        the engine's stream (an isolated engine's bridge copies the last frame in at ``before_wait``).
        Hooks run in the order they were added."""
        if hook not in self._frame_hooks:
            self._frame_hooks += (hook,)

    def remove_frame_hook(self, hook: Any) -> None:
        """Stop calling ``hook`` (no error if it was not added)."""
        self._frame_hooks = tuple(h for h in self._frame_hooks if h is not hook)

    def set_profiling(self, level: str | ProfilingLevel) -> None:
        """Set the profiling level (``"None"``, ``"Summary"``, ``"PerBlock"``, ``"PerKernel"``,
        ``"DeepAsync"``, ``"DeepSync"``). Event nodes are part of the graph, so a change rebuilds it.

        Raises:
            CudapatchError: unknown level (the current level stays).
        """
        new = ProfilingLevel.parse(level)
        if new is not self.profiling:
            self.profiling = new
            self._dirty.mark_structure()
