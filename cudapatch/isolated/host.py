"""IsolatedEngine: the engine in a child process, behind the ``Engine`` API the host already uses.

On driver 580 a GPU fault makes CUDA refuse the whole process (DESIGN.md §9): a normal engine then
stops for good, and a host such as TouchDesigner loses its own CUDA work with it. Here the engine
runs in a child process on the same GPU (``child.py``); the host keeps only pure state:

- a ``Context`` of its own for the user's blocks, so adding, linking, binding and setting values
  validate at once exactly as in a normal engine, and the dirty tracker says what to send;
- a ``PatchMirror`` that turns structure edits into edit messages (``mirror.py``);
- the child's last diagnostics and block states, and its output buffers mapped with CUDA IPC
  (``ipc.py``), so ``output()`` hands out the child's memory with no copy;
- a ``RestartPolicy``: a fault ends only the child, which reports the faulting block (found by its
  engine's replay) before it goes; the host starts a new child with that block disabled.

``update()`` is the frame path: read what the child sent (non-blocking), send one small message
(Hot values batched into it), record the host's event before it and make the host's stream wait
for the frame after it. No allocation beyond the message, no synchronize.

The GPU side and the child are collaborators passed in (``HostSide``, ``launch``), so everything
here is tested on the CPU with fakes (``tests/unit/test_isolated.py``).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import warnings
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .._lifecycle import HandleOwner
from ..blocks.block import Block, BlockState
from ..blocks.shape import Shape, shape_from_array
from ..engine.bindings import checked_host_values, device_binding
from ..engine.context import Context, ExternalBinding
from ..engine.diagnostics import Diagnostic, DiagnosticCode
from ..engine.profiling import ProfilingLevel
from ..engine.stats import BuildTiming, EngineCounters, show_on_blocks
from ..errors import BindingError, CudapatchError
from ..kernels.types import DType
from .host_side import ChildLike, CudaHostSide, HostSide, ProcessLauncher, let_every_frame_past
from .mirror import Disable, PatchMirror, Redescribe, RemoveBlock, SetBypassed, SetProfiling, patch_view
from .policy import ChildEnd, RestartPolicy
from .protocol import PROTOCOL, InputHandle, StartConfig, diag_from_record

__all__ = ["IsolatedEngine", "HostSide", "ChildLike", "NotInIsolatedEngine"]

log = logging.getLogger("cudapatch.isolated")

REQUEST_TIMEOUT_S = 300.0
#: A wait for the child's frames that sees none finish for this long logs where both streams stand.
SLOW_FRAME_S = 10.0
# Frames the host may send ahead of the child's finished ones. Each frame puts two stream-memory
# operations on the host's stream; a child that stops finishing frames (busy finding a faulting
# block, dead) would otherwise fill that stream's queue until a driver call blocks the host thread
# (seen on the H100: the frame loop of a host at ~1 kHz hung in cuStreamWriteValue32). The readback
# ring keeps 3 frames in flight for the same reason.
MAX_FRAMES_AHEAD = 3


class NotInIsolatedEngine(CudapatchError, AttributeError):
    """An ``Engine`` attribute the isolated engine does not have (it lives in the engine process).

    A ``CudapatchError`` that names the attribute and why; also an ``AttributeError``, so
    ``hasattr(engine, "probe")`` and ``getattr(engine, "pool", None)`` tell a host what it may use."""


#: ``Engine`` attributes an ``IsolatedEngine`` does not offer, and why (``__getattr__`` raises
#: ``NotInIsolatedEngine`` with the reason).
UNSUPPORTED: dict[str, str] = {
    "probe": "wire probes are read every frame from the engine process's readback ring, which this process "
    "does not map",
    "probes": "wire probes are read every frame from the engine process's readback ring, which this process "
    "does not map",
    "append_buffer": "an append buffer's count is read live from the engine process's memory; use read() "
    "(the elements written in the last frame)",
    "pool": "the buffer pool lives in the engine process (outputs come here through output())",
    "resources": "the CUDA context and its objects live in the engine process",
    "libraries": "the library handles live in the engine process",
    "modules": "the loaded kernel modules live in the engine process",
    "kernels": "kernels compile in the engine process",
    "kernel_cache": "kernels compile in the engine process (its cache is the cache_dir given)",
}


def _export_key(binding: ExternalBinding) -> tuple:
    return (binding.ptr, binding.count, binding.dtype, binding.shape)


def _same_memory(a: Any, b: Any) -> bool:
    """Whether two ``OutputHandle`` of an output map the same memory with the same size and shape (the
    frame they were sent in aside: a FrameDelay pair's parity holds either way)."""
    return a is not None and b is not None and dataclasses.replace(a, frame=0) == dataclasses.replace(b, frame=0)


@dataclasses.dataclass(frozen=True)
class _DelayPair:
    """Both mapped buffers of a value in a FrameDelay's pair: ``first`` is written by ``frame`` and the
    frames of its parity, ``other`` by the rest."""

    first: Any
    other: Any
    frame: int


class _Processes:
    """What an unclosed ``IsolatedEngine``'s finalizer ends (it must not hold the engine): the running
    child, the launcher's reserve, and the host's side whose stream waits for the child's frames. The
    engine's one record of its child too (``IsolatedEngine._child`` reads it)."""

    __slots__ = ("child", "gpu", "launcher")

    def __init__(self, gpu: HostSide, launcher: ProcessLauncher | None) -> None:
        self.gpu, self.launcher = gpu, launcher
        self.child: ChildLike | None = None

    def end(self) -> None:
        """Let the host's stream past every frame it waits for, then end the processes (their
        memory goes with them). No driver call: the frame word is a plain store."""
        child, self.child = self.child, None
        if child is not None:
            let_every_frame_past(self.gpu)
            child.close(timeout=1.0)  # its stdin closed: it exits (killed if it does not in a second)
        if self.launcher is not None:
            self.launcher.close()


def _unclosed(name: str, processes: _Processes) -> None:
    """The finalizer of an ``IsolatedEngine`` nobody closed (module level: it must not hold it)."""
    try:
        processes.end()
    finally:
        warnings.warn(
            f"unclosed IsolatedEngine '{name}' (its engine process was ended by its finalizer): call close() "
            "or use it in a with block",
            ResourceWarning,
            stacklevel=2,
        )


class IsolatedEngine(HandleOwner):
    """An engine whose GPU work runs in a child process; the same API as ``Engine``.

    Made by ``Engine(isolated=True)``. What differs: ``output()`` returns the child's buffer mapped
    into this process (``SharedOutput``: ``ptr``, ``nbytes``, ``__cuda_array_interface__``, no
    copy); ``read()``, ``stats()`` and ``iterations()`` ask the child and wait for its answer; a GPU
    fault ends only the child, and the next ``update()`` runs a new one with the faulting block
    disabled (its diagnostic says so), ``restarts`` counting them. Regions (``add(region=)``,
    ``place``), FrameDelays and composites run in the child as in an engine here. What lives only
    in the child (``pool``, ``probe``, ``append_buffer``, ... : ``UNSUPPORTED``) raises
    ``NotInIsolatedEngine``.

    Args:
        device: CUDA device ordinal.
        name: Engine name.
        cache_dir: As ``Engine``.
        watch_files: As ``Engine``.
        wait_for_compile: As ``Engine``.
        python: The interpreter for the child (default ``sys.executable``; an embedded host sets
            ``CUDAPATCH_COMPILER_PYTHON``, which is used here too).
        host_side: The host's CUDA side (tests pass a fake).
        launch: Starts a child from a ``StartConfig`` (tests pass a fake).
        policy: When to restart (default ``RestartPolicy()``).
        standby: Keep a second child started, so a restart skips its start-up.
        fuse: As ``Engine`` (elementwise fusion in the child, on by default); what the host reads
            (``output``, ``keep``, a GL bridge) is kept out of fused groups.
        background_builds: As ``Engine`` (in the child).
        debug_launch: As ``Engine`` (in the child: a fault is pinned on its block in its frame).
        reuse_buffers: Accepted for ``Engine``'s sake; always off in the child, whose every output is
            mapped by the host (no value may overwrite another's buffer).
        freeze_collector: As ``Engine`` (the child's collector; this process's is left alone).

    Lifecycle (``cudapatch._lifecycle``): ``close()`` is idempotent, the engine is a context manager,
    and an unclosed one's finalizer ends its engine process and warns (``ResourceWarning``); the host's
    CUDA side keeps the policy of its own owners.

    Raises:
        CudaUnavailableError: no driver or device (host side).
        CudapatchError: not Linux (the processes share memory through ``os.memfd_create``).
    """

    #: The graph runs in the child process: this process's GL memory is out of its reach.
    graph_in_child = True

    def __init__(
        self,
        device: int = 0,
        *,
        name: str = "CudaEngine",
        cache_dir: str | Path | None | bool = None,
        watch_files: bool = True,
        wait_for_compile: bool = False,
        python: str | None = None,
        host_side: HostSide | None = None,
        launch: Callable[[StartConfig], ChildLike] | None = None,
        policy: RestartPolicy | None = None,
        standby: bool = True,
        fuse: bool = True,
        background_builds: bool = True,
        debug_launch: bool = False,
        reuse_buffers: bool = False,
        freeze_collector: bool = True,
    ) -> None:
        from ..kernels.compiler_process import compiler_python

        if host_side is None:
            from .ipc import check_platform

            check_platform()  # before any CUDA or process work: say why plainly
        self.name = name
        self._config = StartConfig(
            device=device,
            name=name,
            cache_dir=str(cache_dir) if isinstance(cache_dir, Path) else cache_dir,
            wait_for_compile=wait_for_compile,
            watch_files=watch_files,
            fuse=fuse,
            background_builds=background_builds,
            debug_launch=debug_launch,
            freeze_collector=freeze_collector,
        )
        self.background_builds = background_builds
        self.debug_launch = debug_launch
        self._gpu: HostSide = host_side if host_side is not None else CudaHostSide(device)
        chosen = python or (compiler_python() or (sys.executable, ""))[0]
        self._launcher = ProcessLauncher(chosen, standby=standby) if launch is None else None
        self._launch: Callable[[StartConfig], ChildLike] = launch or self._launcher  # type: ignore[assignment]
        self._processes = _Processes(self._gpu, self._launcher)
        self._finalizer = weakref.finalize(self, _unclosed, name, self._processes)
        self.policy = policy or RestartPolicy()
        self.context = Context()
        self._dirty = self.context.dirty
        # Device memory is exported when bound (so unshareable memory is refused there, not in update());
        # the mirror takes the handle from here when it sends the binding.
        self._exports: dict[tuple, InputHandle] = {}
        self._mirror = PatchMirror(self._export)
        #: As ``Engine.counters``, counted here: ``frames`` sent, ``hot_updates`` batched into them, ``rebuilds``
        #: (structure edits sent to the child) and ``faults`` (children that ended: a GPU fault or a crash).
        self.counters = EngineCounters()
        #: As ``Engine.last_build``, for the API's sake: the child builds, so it stays at its defaults here.
        self.last_build = BuildTiming()
        self.profiling = ProfilingLevel.NONE
        self.wait_for_compile = wait_for_compile
        self._frame = 0
        self._ended_at = -1  # the last frame sent to a child that ended: never finished with outputs here
        #: True (a live host): while the child is ``frames_ahead`` frames behind, ``update()`` drops
        #: the frame (counted in ``counters.frames_dropped``) rather than wait. False (offline: frames
        #: rendered to files, a fixed count of frames): ``update()`` waits until the child catches up,
        #: so every frame runs, as it does in an engine in this process.
        self.drop_frames = True
        #: Frames ``update()`` sends ahead of the child's finished ones, at most (``MAX_FRAMES_AHEAD``). A
        #: ``GlBridge`` sets 1: it copies a frame's outputs only once the child finished it and before the
        #: next frame may start, so with frames in flight it copied only when the child caught up, never
        #: while the child was slower than the host's frames (the preview showed none of its frames).
        self.frames_ahead = MAX_FRAMES_AHEAD
        self._frame_hooks: tuple[Any, ...] = ()
        self._handles: dict[tuple[int, str], Any] = {}  # (block id, port) -> OutputHandle from the child
        self._child_busy = False  # the child's last word on ``building``
        self._outputs: dict[tuple[int, str], Any] = {}  # mapped here, on first use
        # Mappings no output uses any more since the child's last new outputs ("all": a new graph, every
        # mapping; "unused": a Warm patch, those no output uses now): unmapped at the end of the
        # ``_poll`` that took them, once the child's frames and the host's stream are done with them.
        self._unmap_due = ""
        self._unmapping = False
        self._diags: tuple[Diagnostic, ...] = ()
        self._engine_diags: tuple[Diagnostic, ...] = ()  # the host's own: restarts, a lost engine
        self._fault_report: tuple | None = None
        self._replies: dict[int, tuple[bool, Any]] = {}
        self._next_request = 0
        #: New children started after one ended (GPU faults and crashes).
        self.restarts = 0
        #: Seconds from noticing the end of the last child to the new child's first frame sent.
        self.last_restart_s: float | None = None
        self._fault_times: dict[str, float] = {}
        self._start_child()

    @property
    def device(self) -> Any:
        """The host's ``DeviceContext`` (the primary context; ``stream`` is the host's engine stream)."""
        return self._gpu.device

    @property
    def stream(self) -> Any:
        """The host's ``CUstream`` the child's frames are ordered with (read-only), as ``Engine.stream``.

        It is a stream of this process (the child launches on its own): ``update()`` orders the frame
        it sends after the work already queued on this stream, then makes the stream wait for that
        frame on the GPU. So work queued on it before ``update()`` runs before the frame, and work
        queued after sees the frame's outputs, with no synchronize, e.g. CuPy::

            s = cupy.cuda.Stream.from_external(engine)  # CuPy >= 14; before: ExternalStream(int(engine.stream))
            engine.update()
            with s:
                result = cupy.asarray(engine.output(block, "Out")) * 2  # after the child's frame

        It stays the same across restarts of the child.
        """
        return self._gpu.stream

    def __cuda_stream__(self) -> tuple[int, int]:
        """The CUDA stream protocol over ``stream``, as ``Engine.__cuda_stream__``."""
        return 0, int(self._gpu.stream)

    @property
    def fault_times(self) -> dict[str, float]:
        """When the last GPU fault's steps happened, as ``time.monotonic()`` stamps (one clock for
        every process of the machine), as ``Engine.fault_times`` with the host's steps added:
        ``surfaced`` (the child's engine met the fault), ``named`` (its replay named the block),
        ``reset`` (the context reset, refused on this driver), ``sent`` (the report left the child),
        ``received`` (here), ``released`` (the child let go: its exit is reaped in the background),
        ``restarted`` (the next child started). Empty before a fault."""
        return dict(self._fault_times)

    @property
    def child_pid(self) -> int | None:
        return getattr(self._child, "pid", None)

    @property
    def _child(self) -> ChildLike | None:
        """The running child (None: lost, or closed). Kept in ``_processes``, which the finalizer of an
        unclosed engine ends without holding the engine."""
        return self._processes.child

    # -- the child ----------------------------------------------------------------------------------
    def _start_child(self) -> None:
        fd = self._gpu.start_parts(self._frame)
        cfg = dataclasses.replace(self._config, frame_word_fd=fd, start_frame=self._frame)
        self._processes.child = self._launch(cfg)
        self._mirror.forget()
        self._dirty.mark_structure()  # the next update sends the whole patch
        self._handles.clear()

    def _child_ended(self, child: ChildLike) -> None:
        """The child's output ended: let the host's stream past its frames, unmap its memory, and
        start another (or give up, per the policy)."""
        t0 = time.perf_counter()
        self._gpu.release(self._frame)
        self._ended_at = self._frame
        self._drop_outputs()
        report = self._fault_report
        self._fault_report = None
        if report is not None:
            # It said all it had to; its exit waits for the driver to tear its faulted context
            # down, which the next child need not wait for (measured in ``bench_isolated.py``).
            child.release()
            how = "reported a GPU fault (it exits once let go)"
        else:
            how = child.close()
        released = time.monotonic()
        disabled, records = (report[1], report[0]) if report is not None else ({}, ())
        end = ChildEnd(how, dict(disabled), records)
        if report is None:
            tail = child.stderr_text().strip().splitlines()[-6:]
            log.error("the isolated engine process %s%s", how, ("; stderr:\n" + "\n".join(tail)) * bool(tail))
        else:
            log.error("GPU fault in the isolated engine process (%s): %s", how, "; ".join(disabled.values()) or "?")
        self.counters.faults += 1
        self._processes.child = None
        if not self.policy.child_ended(end):
            self._engine_diags = (Diagnostic("error", None, DiagnosticCode.GPU_LOST, self.policy.lost or ""),)
            self._publish(tuple(diag_from_record(r) for r in records), None)
            return
        self._start_child()
        self.restarts += 1
        if report is not None:
            self._fault_times = dict(report[2], released=released, restarted=time.monotonic())
        if report is None:
            self._engine_diags = (
                Diagnostic("warning", None, DiagnosticCode.GPU_LOST, f"the engine process {how}; restarted it"),
            )
        self.last_restart_s = time.perf_counter() - t0

    def _drop_outputs(self) -> None:
        """Unmap every output of the child (it ended, or this engine closes; its frames were let past)."""
        if self._outputs or self._unmap_due:
            self._wait_host_stream()  # host work reading the child's memory ends before it is unmapped
            self._outputs.clear()
            self._gpu.drop_outputs()
            self._unmap_due = ""

    def _new_outputs(self, handles: dict[tuple[int, str], Any], replaced: bool) -> None:
        """The child's output handles after a build. With a new graph every output of the old one is
        mapped again on its next ``output()``; after a Warm patch into the running graph only outputs
        whose memory, count or shape moved are, and views of the rest stay valid, as the buffers of an
        engine in the host do. Allocations no output uses any more are unmapped by ``_unmap_stale``
        at the end of this poll, not here: the host's stream may still read them in frames the child
        has not finished, and a child that faults in its new graph's first frame never finishes it
        (waiting here for the stream, without reading the pipe, would wait for good)."""
        old, self._handles = self._handles, handles
        stale = [k for k in self._outputs if replaced or not _same_memory(old.get(k), handles.get(k))]
        for k in stale:
            del self._outputs[k]
        if replaced and (stale or self._unmap_due):
            self._unmap_due = "all"
        elif stale and not self._unmap_due:
            self._unmap_due = "unused"

    def _unmap_stale(self) -> None:
        """Unmap the allocations no output uses any more, once the child has finished every frame sent
        (its pipe read meanwhile: a fault is taken, and the ended child's memory all goes) and the
        host's stream is done with them."""
        self._unmapping = True
        try:
            self._wait_for_frames(0)
            if self._unmap_due:
                self._wait_host_stream()
                # A new graph: only what was mapped since (none, unless an earlier wait here raised).
                # A Warm patch: every allocation the child's outputs use now.
                h = self._handles
                handles = [h[k] for k in self._outputs if k in h] if self._unmap_due == "all" else h.values()
                keep = {x.handle for x in handles} | {x.alt[0] for x in handles if x.alt}
                self._gpu.drop_outputs(keep=keep or None)
                self._unmap_due = ""
        finally:
            self._unmapping = False

    def _take(self, messages: list[Any]) -> None:
        for m in messages:
            kind = m[0]
            if kind == "outputs":
                self._new_outputs(m[1], m[2])
            elif kind == "diagnostics":
                self._publish(tuple(diag_from_record(r) for r in m[1]), m[2])
            elif kind == "built":
                self._show_built(m[1])
            elif kind == "building":
                self._child_busy = bool(m[1])
            elif kind == "reply":
                self._replies[m[1]] = (m[2], m[3])
            elif kind == "fault":
                times = dict(m[3] if len(m) > 3 else {}, received=time.monotonic())
                self._fault_report = (m[1], m[2], times)
                self._publish(tuple(diag_from_record(r) for r in m[1]), None)
                child = self._child
                if child is not None:  # it waits for us: unmap its memory, then let it go
                    self._child_ended(child)
                return
            elif kind == "ready":
                if m[1] != PROTOCOL:
                    raise CudapatchError(f"the engine process speaks protocol {m[1]}, this host {PROTOCOL}")

    def _show_built(self, shown: dict[int, tuple[dict, dict, str]]) -> None:
        """What the child's new graph says of each block (sizes and shapes of its outputs, its fused
        group), onto the host's blocks as the engine puts them on its own (``str(block.port(...))``)."""
        registry = self.context.registry
        for bid, (sizes, shapes, fused) in shown.items():
            b = registry.get(bid)  # a composite's inner blocks too
            if b is not None:
                b.debug.sizes, b.debug.shapes, b.debug.fused = sizes, shapes, fused

    def _publish(self, diags: tuple[Diagnostic, ...], states: dict[int, tuple[str, str]] | None) -> None:
        """The child's diagnostics and the states its engine's board gave the blocks (host id -> state,
        message; composites and their inner blocks alike), onto the host's blocks. ``states`` None: no
        graph runs any more (the child faulted or the engine is lost), so, as the board of an engine
        whose graph is gone, every registered block is NotCompiled, showing its first diagnostic, or
        Error with its last error."""
        self._diags = diags
        registry = self.context.registry
        if states is not None:
            for bid, st in states.items():
                b = registry.get(bid)
                if b is not None:
                    b.debug.state, b.debug.message = BlockState(st[0]), st[1]
            return
        for b in registry:
            b.debug.state, b.debug.message = BlockState.NOT_COMPILED, ""
        for d in diags:
            if d.block_id is None:
                continue
            owner = registry.owner(d.block_id) if registry.composites else None  # shown on its composite
            b = owner[0] if owner is not None else registry.get(d.block_id)
            if b is not None and (d.severity == "error" or not b.debug.message):
                if d.severity == "error":
                    b.debug.state = BlockState.ERROR
                b.debug.message = d.message.splitlines()[0]

    def _poll(self) -> ChildLike | None:
        """Read the child; restart it if it ended. The child to talk to (None: lost)."""
        child = self._child
        if child is None:
            return None
        msgs = child.read()
        if msgs:
            self._take(msgs)
        if child is self._child and child.eof:
            self._child_ended(child)
        if self._unmap_due and not self._unmapping:
            self._unmap_stale()
        return self._child

    # -- patch editing (as Engine: validates here, the child gets it with the next frame) ------------
    def add(self, block: Block, *, region: Block | None = None) -> Block:
        """Register ``block`` (Cold in the child on the next update), inside ``region`` (an ``If``,
        ``While`` or ``For`` added before) if given, as ``Engine.add``. Returns it.

        Raises:
            CudapatchError: ``region`` is not a region of this engine.
        """
        self.context.register_block(block)
        if region is not None:
            self.context.place(block, region)
        return block

    def place(self, block: Block, region: Block | None) -> None:
        """Move ``block`` into ``region`` (an ``If``, ``While`` or ``For``), or to the top level with None,
        as ``Engine.place`` (Cold in the child on the next update); its links stay.

        Raises:
            CudapatchError: ``region`` is not a region of this engine, or is ``block`` or inside it.
        """
        self.context.place(block, region)

    def remove(self, block: Block) -> None:
        """Unregister ``block`` and its links."""
        self.policy.code_changed(block.id)
        self.context.unregister_block(block)

    def disable(self, block: Block, reason: str) -> None:
        """Leave ``block`` out of the graph, as after a GPU fault (in this child and every later one)."""
        self.policy.disabled[block.id] = reason
        child = self._child
        if child is not None:
            child.send(("edits", [Disable(block.id, reason)]))

    def connect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> None:
        """Link an output to an input. Raises: LinkError."""
        self.context.connect(src, src_port, dst, dst_port)

    def disconnect(self, src: Block, src_port: str, dst: Block, dst_port: str) -> bool:
        """Remove a link; returns whether it existed."""
        return self.context.disconnect(src, src_port, dst, dst_port)

    def bind(self, block: Block, port: str, array: Any, *, dtype: DType | None = None) -> None:
        """Bind data to an input port: device memory (``__cuda_array_interface__``) is shared with the
        child through CUDA IPC with no copy (memory from ``cuMemAlloc`` or CuPy's default pool); a
        host array is sent to the child, which copies it.

        Raises:
            BindingError: unknown port, wrong element type, non-contiguous or unshareable memory.
        """
        inp = block.description.input(port)
        if inp is None:
            raise BindingError("unknown input port", block=block.name, port=port)
        want = dtype or inp.dtype
        binding = device_binding(array, want, block.name, port)  # None: a host array
        if binding is not None:
            old = self.context.bindings.get((block.id, port))
            try:
                if old is None or _export_key(old) != _export_key(binding):  # the same memory again: exported
                    self._exports[_export_key(binding)] = self._gpu.export(binding)
            except BindingError as exc:
                if block.description.type_name in ("Upload", "Download") and port in ("Ring", "Control"):
                    kind = block.description.type_name
                    raise BindingError(
                        f"this {kind} ring's memory is not shared with the engine process: make the ring for "
                        f"this engine ({kind}Ring(engine, block)), which gives it memory both processes map",
                        block=block.name,
                        port=port,
                    ) from None
                raise BindingError(exc.message, block=block.name, port=port) from None
        else:
            host = checked_host_values(array, want, block.name, port)
            shape = shape_from_array(host.shape, want.lanes) if host.ndim > 1 else None
            binding = ExternalBinding(0, host.size // want.lanes, want, owner=host, shape=shape)
        key = (block.id, port)
        old = self.context.bindings.get(key)
        self.context.bind_input(block, port, binding)
        if old is not None and old.count == binding.count and old.ptr == binding.ptr and not binding.ptr:
            self._dirty.mark_binding(block.id, port, binding)  # a host array of the same size: new values

    def _export(self, binding: ExternalBinding) -> InputHandle:
        """The ``InputHandle`` of a binding for the child: exported at ``bind`` for device memory."""
        h = self._exports.pop(_export_key(binding), None) if binding.ptr else None
        return h if h is not None else self._gpu.export(binding)

    def add_frame_hook(self, hook: Any) -> None:
        """Call ``hook.before_launch(stream)`` / ``after_launch(stream)`` around each frame, on the host's
        stream, and ``hook.before_wait()`` before this process blocks on that stream (as ``Engine``)."""
        if hook not in self._frame_hooks:
            self._frame_hooks += (hook,)

    def remove_frame_hook(self, hook: Any) -> None:
        self._frame_hooks = tuple(h for h in self._frame_hooks if h is not hook)

    @property
    def frame_hooks(self) -> tuple[Any, ...]:
        """The frame hooks added (``add_frame_hook``), in order."""
        return self._frame_hooks

    def set_profiling(self, level: str | ProfilingLevel) -> None:
        """Set the profiling level (as ``Engine.set_profiling``). Raises: CudapatchError."""
        new = ProfilingLevel.parse(level)
        if new is not self.profiling:
            self.profiling = new
            self._dirty.mark_structure()

    # -- the frame ----------------------------------------------------------------------------------
    def update(self) -> None:
        """Send pending edits and one frame to the child; waits for neither it nor the GPU, except: with
        ``drop_frames`` off, for a child ``frames_ahead`` frames behind; and when the child's new outputs replace
        mapped ones, for the frames that may still read those (then unmapped).

        The host's stream (``engine.stream``) waits on the GPU for this frame, so host work queued
        there afterwards sees its outputs."""
        ahead = self.frames_ahead
        child = self._poll() if self.drop_frames else self._wait_for_frames(ahead - 1)
        if child is None:  # lost: nothing launches any more, as a lost Engine
            self.counters.frames += 1
            return
        dirty = self._dirty
        hot: tuple = ()
        if dirty.any:
            if dirty.only_params:
                params, bindings = dirty.take_params()
                mirror = self._mirror
                hot = tuple((bid, name, p.value) for (bid, name), p in params.items())
                for bid, name, value in hot:
                    mirror.note_value(bid, name, value)
                if bindings:
                    edits = [mirror.bind(k, b) for k, b in bindings.items()]
                    child.send(("edits", [e for e in edits if e is not None]))
                    self._exports.clear()  # what was bound is sent: the rest was replaced before it was
                if dirty.take_bypass():  # the child's Bypass tier turns the nodes off: no rebuild there
                    child.send(("edits", [SetBypassed(frozenset(self.context.bypassed))]))
                self.counters.hot_updates += len(hot)
            else:
                self._send_structure(child)
        n = self._frame + 1
        gpu = self._gpu
        if ((n - 1 - gpu.finished()) & 0xFFFFFFFF) >= ahead:  # the child lags: drop this frame
            self.counters.frames += 1
            self.counters.frames_dropped += 1
            return  # (before the hooks: a GL bridge maps in before_launch and unmaps in after_launch)
        for h in self._frame_hooks:
            h.before_launch(gpu.stream)
        if self._child is not child:  # a hook waited for the child's frame and met its end (GlBridge.catch_up)
            child = self._child
            if child is not None:  # the next child: the whole patch first (its start marked it to send)
                self._send_structure(child)
        if child is not None:  # (None: lost; the hooks still unmap what they mapped)
            gpu.begin_frame(n)
            child.send(("frame", n, hot))
            gpu.sent_frame(n)
            self._frame = n
        self.counters.frames += 1
        failed: BaseException | None = None
        for h in self._frame_hooks:  # every hook unmaps what it mapped, whatever an earlier one raised
            try:
                h.after_launch(gpu.stream)
            except BaseException as exc:
                failed = failed or exc
        if failed is not None:
            raise failed

    def _send_structure(self, child: ChildLike) -> None:
        edits = self._mirror.diff(patch_view(self.context))
        self._exports.clear()  # every binding the child lacks was sent
        for e in edits:
            if isinstance(e, (Redescribe, RemoveBlock)):  # new code or gone: a disabled block gets a new chance
                self.policy.code_changed(e.id)
        ids = self._mirror.block_ids
        edits += [Disable(bid, why) for bid, why in self.policy.disabled.items() if bid in ids]
        edits.append(SetProfiling(self.profiling.value if hasattr(self.profiling, "value") else str(self.profiling)))
        edits.append(SetBypassed(frozenset(self.context.bypassed)))
        child.send(("edits", edits))
        self._dirty.clear_structure()
        self._child_busy = True  # until the child says otherwise (it answers every edits message)
        self.counters.rebuilds += 1

    # -- requests (wait for the child; not for the frame path) ---------------------------------------
    def _request(self, what: str, *args: Any, timeout: float = REQUEST_TIMEOUT_S) -> Any:
        child = self._poll()
        if child is None:
            raise CudapatchError(f"the engine is lost: {self.policy.lost}")
        if self._dirty.any and not self._dirty.only_params:
            self._send_structure(child)
        self._next_request += 1
        rid = self._next_request
        child.send(("request", rid, what, args))
        end = time.monotonic() + timeout
        while rid not in self._replies:
            if self._child is not child:
                raise CudapatchError(f"the engine process ended during {what}(); it was restarted")
            if time.monotonic() > end:
                raise CudapatchError(f"the engine process did not answer {what}() within {timeout:.0f} s")
            child.wait_readable(0.05)
            self._poll()
        ok, value = self._replies.pop(rid)
        if not ok:
            raise value
        return value

    def engine_counters(self) -> EngineCounters:
        """The engine process's own ``EngineCounters`` (waits for the child): its Cold rebuilds, Warm
        updates, resizes and growths, instantiations, as ``Engine.counters`` counts them. ``counters``
        counts what this process sent (a structure edit is one ``rebuilds`` here, whichever tier the
        child applied it by).

        Raises:
            CudapatchError: the engine is lost, or the child ended while asked.
        """
        return self._request("counters")  # type: ignore[no-any-return]

    def wait_ready(self, timeout: float | None = 120.0) -> None:
        """Wait until the child compiled every kernel and built the graph (scripts, tests).

        Raises:
            CudapatchError: the child ended or did not answer.
        """
        self._request("wait_ready", timeout, timeout=(timeout or REQUEST_TIMEOUT_S) + 60.0)
        self._poll()  # its outputs and diagnostics arrived before the reply

    def synchronize(self) -> None:
        """Wait for every frame sent so far (the host's stream waits on them), and the host's work after
        them. A child that faults meanwhile is taken while waiting (restarted, its unfinished frames let
        past). Raises: CudaError."""
        self._wait_for_frames(0)
        self._wait_host_stream()

    @property
    def frames_sent(self) -> int:
        """The number of the last frame sent to the child (frames the host dropped are not sent)."""
        return self._frame

    def frame_finished(self, n: int, *, wait: bool = False) -> bool | None:
        """Whether the child has finished frame ``n`` (a number ``frames_sent`` gave): True once it has,
        and its outputs hold that frame until the host's stream lets the next frame start; False while
        it runs; None when it never will (the child ended first: its outputs are unmapped here). A plain
        load of the frame word, no driver call.

        Args:
            n: The frame.
            wait: Wait until it is not running (reading the child's pipe, as ``synchronize``).

        Raises:
            CudapatchError: ``wait`` and the child finished no frame for ``REQUEST_TIMEOUT_S``.
        """
        if wait and self._child is not None:
            self._wait_for_frames((self._frame - n) & 0xFFFFFFFF)
        if self._child is None or n <= self._ended_at:  # (host frame numbers never wrap: Python ints)
            return None  # lost, or sent to a child that ended: at or before the frame it ended at
        return ((self._gpu.finished() - n) & 0xFFFFFFFF) < 1 << 31  # (the frame word wraps at 2**32)

    def _wait_host_stream(self) -> None:
        """Block until the host's stream is done. The hooks' ``before_wait`` goes first (a GL bridge
        copies the last finished frame's outputs in, so GL holds them once this returns): called once
        every frame the stream waits for is finished or let past (``synchronize``, a child that ended),
        or when a rebuild's new outputs arrive from a child that goes on finishing its frames."""
        for h in self._frame_hooks:
            wait = getattr(h, "before_wait", None)
            if wait is None:
                continue
            try:
                wait()
            except Exception as exc:  # a GL error: the wait goes on (an escape would leave a child half-ended)
                log.warning("frame hook %r: before_wait failed: %s", h, exc)
        self._gpu.synchronize()

    def _wait_for_frames(self, behind: int) -> ChildLike | None:
        """Wait until the child has finished all but ``behind`` of the frames sent, reading its pipe
        meanwhile: a child that faults reports and then waits for this process to let it go, and its
        unfinished frames never finish, so a wait on the host's stream alone never ended (measured on
        the H100: ``synchronize()`` after a fault). The child to talk to (None: lost).

        Raises:
            CudapatchError: the child finished no frame for ``REQUEST_TIMEOUT_S`` (hung, not ended).
        """
        gpu = self._gpu
        end, last = time.monotonic() + REQUEST_TIMEOUT_S, gpu.finished()
        warn = time.monotonic() + SLOW_FRAME_S
        while True:
            child = self._poll()
            done = gpu.finished()
            if child is None or ((self._frame - done) & 0xFFFFFFFF) <= behind:
                return child
            if done != last:  # progress: the deadline counts from the last finished frame
                end, last = time.monotonic() + REQUEST_TIMEOUT_S, done
                warn = time.monotonic() + SLOW_FRAME_S
            elif time.monotonic() > end:
                raise CudapatchError(
                    f"the engine process finished no frame within {REQUEST_TIMEOUT_S:.0f} s "
                    f"(frame {done} done of {self._frame} sent): it is stuck"
                )
            elif time.monotonic() > warn:  # once per stall (then the deadline): where both streams stand
                warn = end
                log.warning(
                    "the engine process (pid %s) has finished no frame for %.0f s: frame %d done of %d sent, "
                    "the host's stream let it start frame %d (lower: the host's stream is behind)",
                    self.child_pid,
                    SLOW_FRAME_S,
                    done,
                    self._frame,
                    gpu.let_start(),
                )
            child.wait_readable(0.0005)

    def keep(self, block: Block, port: str, keep: bool = True) -> None:
        """As ``Engine.keep``: the child keeps the port in a buffer of its own, never computed inside a
        fused kernel (sent with the next structure edit; Cold in the child if that changes its plan).

        Raises:
            CudapatchError: the block has no such port.
        """
        self.context.keep(block, port, keep)

    def output(self, block: Block, port: str, *, keep: bool = True, poll: bool = True) -> Any:
        """The child's buffer of an output, mapped here with no copy (valid until the next rebuild, or a
        Warm edit that moves or resizes it, as ``Engine.output``'s buffer is). A
        value inside a FrameDelay loop lives in two buffers that swap every frame: this is the one the
        frame sent last writes (take it again each frame), as ``Engine.output``.
        The child never shares output buffers; ``keep`` (as ``Engine.output``) keeps the output out of
        fused groups: one the child's running graph computes inside a fused kernel raises once and is
        held in a buffer from the next ``update()`` on. ``poll=False`` does not read the child's pipe
        for outputs not known yet (a frame hook inside ``update()``: what the pipe holds, a restart
        among it, is taken at the start of the next ``update()``, not halfway through this one).

        Raises:
            CudapatchError: the block is not running in the child's graph (or the output is fused
                away), or has no such output.
        """
        key = (block.id, port)
        buf = self._outputs.get(key)
        if buf is not None:
            return self._of_frame(buf)
        h = self._handles.get(key)
        if h is None and poll:
            self._poll()  # its newest outputs may be waiting in the pipe
            h = self._handles.get(key)
        if keep and block.description.output(port) is not None:
            # recorded for the child; a build is asked for only when no buffer holds the output now
            newly = self.context.keep(block, port, rebuild=h is None)
            if h is None and newly:
                raise CudapatchError(
                    "this output is held in no buffer of the engine process's graph (computed inside a fused "
                    "kernel, or the block is not running yet); it is kept in its own buffer from the next "
                    "update() on (to keep it from the start: engine.keep(block, port) before the first update)",
                    block=block.name,
                    port=port,
                )
        if h is None:
            if block.description.output(port) is None:
                raise CudapatchError("no such output port", block=block.name, port=port)
            raise CudapatchError("block is not running in the current graph", block=block.name, port=port)
        buf = self._gpu.import_output(h)
        if h.alt:  # a FrameDelay's pair: both buffers mapped, the frame's parity picks one
            other = self._gpu.import_output(dataclasses.replace(h, handle=h.alt[0], offset=h.alt[1], alt=()))
            buf = _DelayPair(buf, other, h.frame)
        self._outputs[key] = buf
        return self._of_frame(buf)

    def _of_frame(self, buf: Any) -> Any:
        """``buf``, or for a FrameDelay's pair the buffer the frame sent last writes: the pair swaps
        every frame, and every frame sent is launched by the child (``OutputHandle.frame``)."""
        if type(buf) is not _DelayPair:
            return buf
        return buf.first if (self._frame - buf.frame) % 2 == 0 else buf.other

    def output_shape(self, block: Block, port: str) -> Shape:
        """The Shape of an output in the child's running graph (``(count,)`` for flat outputs), as
        ``Engine.output_shape``; known from the child's last build, no request.

        Raises:
            CudapatchError: not running in the child's graph, or no such output.
        """
        if block.description.output(port) is None:
            raise CudapatchError("no such output port", block=block.name, port=port)
        key = (block.id, port)
        h = self._handles.get(key)
        if h is None:
            self._poll()
            h = self._handles.get(key)
        if h is None:
            raise CudapatchError("block is not running in the current graph", block=block.name, port=port)
        return h.shape if h.shape is not None else Shape.flat(h.count)

    def iterations(self, region: Block) -> int | None:
        """The iterations a ``While`` or ``For`` ran in the newest completed frame of the child, as
        ``Engine.iterations``: read from the child's readback ring, which never waits for the GPU; the
        host waits only for the child's answer through its pipe (a request, not for every frame).
        None before a frame completed, for an If, or for a block that is no region.

        Raises:
            CudapatchError: the engine is lost, or the child ended while asked.
        """
        return self._request("iterations", region.id)  # type: ignore[no-any-return]

    def read(self, block: Block, port: str) -> np.ndarray:
        """Copy an output to the host, from the child (waits for it; append outputs: the elements
        written in the last frame). Raises: CudapatchError."""
        if block.description.output(port) is None:
            raise CudapatchError("no such output port", block=block.name, port=port)
        self.context.keep(block, port, rebuild=False)  # the host reads it: kept by every later child too
        return self._request("read", block.id, port)

    def stats(self) -> Any:
        """``EngineStats`` of the child's newest completed frame (waits for the child). As
        ``Engine.stats``, it only reads: no diagnostic and no block changes here or in the child."""
        stats, _ = self._request("stats")
        return dataclasses.replace(stats, diagnostics=tuple(diag_from_record(r) for r in stats.diagnostics))

    def show_frame(self) -> Any:
        """As ``Engine.show_frame`` (waits for the child): the frame's GPU times (and append fill at the
        Deep levels) and each loop's ``Iterations: n/limit`` go on the host's blocks, and the child's
        per-frame warnings (a While that stopped at ``Max``) into ``diagnostics()`` (the child publishes
        them and reports its diagnostics before it answers)."""
        stats, loops = self._request("show_frame")
        stats = dataclasses.replace(stats, diagnostics=tuple(diag_from_record(r) for r in stats.diagnostics))
        registry = self.context.registry
        show_on_blocks(stats, registry)
        for bid, fill in loops.items():
            b = registry.get(bid)
            if b is not None:
                b.debug.append_fill = {**b.debug.append_fill, "Iterations": fill}
        return stats

    def diagnostics(self, block: Block | None = None) -> tuple[Diagnostic, ...]:
        """The child's last diagnostics plus the host's own (a restart, a lost engine)."""
        diags = self._engine_diags + self._diags
        if block is None:
            return diags
        comp = self.context.registry.composites.get(block.id)  # a composite's include its inner blocks'
        ids = {block.id} | ({b.id for _, b in comp.inner_blocks()} if comp is not None else set())
        return tuple(d for d in diags if d.block_id in ids)

    def share_host_memory(self, nbytes: int) -> Any:
        """Pinned host memory of at least ``nbytes`` that the engine process maps too (``ipc.SharedPages``:
        ``host_ptr``, ``device_ptr``, ``release()``): what ``UploadRing`` and ``DownloadRing`` allocate
        their rings in for an isolated engine, so its kernels read and write what this process writes
        and reads, with no copy and no message per frame. Binding it sends its name, not its bytes.

        Raises:
            OSError, CudaError: the memory cannot be made or registered.
        """
        return self._gpu.share(nbytes)

    def report_fault(self, exc: Any) -> None:
        """Faults happen in the child; a fault in the host's own context is the host's. Ignored."""

    def prepare_fault_replay(self) -> None:
        """As ``Engine.prepare_fault_replay``: every engine process does it when it starts. Nothing here."""

    @property
    def building(self) -> bool:
        """Whether a structure edit is not running yet: unsent, or in the child's build (as
        ``Engine.building``; the child says when that changes)."""
        return bool(self._dirty.structure) or self._child_busy

    def __getattr__(self, name: str) -> Any:
        # Only for attributes not found otherwise: an Engine attribute that lives in the engine process.
        why = UNSUPPORTED.get(name)
        if why is None:
            raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")
        raise NotInIsolatedEngine(f"engine.{name} is not available in an isolated engine: {why}")

    @property
    def lost(self) -> str | None:
        """Why no child runs any more (restarts exhausted), else None."""
        return self.policy.lost

    @property
    def graph(self) -> None:
        """The compiled graph lives in the child: None here."""
        return None

    @property
    def blocks(self) -> tuple[Block, ...]:
        return tuple(self.context.registry)

    def __str__(self) -> str:
        state = f"lost: {self.lost}" if self.lost else f"child pid {self.child_pid}, {self.restarts} restarts"
        return f"{self.name}: {len(self.context.registry)} blocks (isolated, {state})\n  Profiling: {self.profiling}"

    def __repr__(self) -> str:
        return (
            f"<IsolatedEngine '{self.name}' blocks={len(self.context.registry)} child={self.child_pid} "
            f"restarts={self.restarts} closed={self._closed}>"
        )

    # -- teardown (``close()``: HandleOwner's, idempotent, around ``_release``) ----------------------
    def _release(self) -> None:
        """Stop the child (it closes its engine), unmap its memory, release the host's side (once, by
        ``close()``)."""
        child, self._processes.child = self._processes.child, None
        if child is not None:
            self._gpu.release(self._frame)
            self._drop_outputs()
            child.send(("close",))
            child.close(timeout=30.0)
        if self._launcher is not None:
            self._launcher.close()
        for b in list(self.context.registry):
            self.context.unregister_block(b)
        self._gpu.close()

    def abandon(self) -> None:
        """End the engine process and forget the host's CUDA side without a driver call (its context
        is gone); closes. The process's memory goes with it. Does nothing once closed."""
        # HandleOwner.abandon forgets again after close(): here that would abandon a closed host side.
        if not self._closed:
            super().abandon()

    def _forget(self) -> None:
        """End the engine process, forget the host's CUDA side (once, by ``abandon()``)."""
        self._processes.end()
        self._gpu.abandon()

    def __enter__(self) -> IsolatedEngine:
        return self
