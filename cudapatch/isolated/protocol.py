"""The messages between a host and its isolated engine process, as plain tuples.

The host (``IsolatedEngine``) and the engine child (``isolated/child.py``) talk over the child's
stdin and stdout in the frames of the compiler child (``kernels/_compiler_child.py``: an 8-byte
length and a pickle). Every message is a tuple whose first item is its kind; tuples of builtins
pickle and unpickle in a few microseconds, which is what the frame message needs (``update()`` on
the host must stay within ~30 µs, DESIGN.md §10 "Isolation").

Host → child:

- ``("start", StartConfig)``: first message; the engine is created from it.
- ``("edits", [Edit, ...])``: patch edits (``mirror.py``), applied in order before the next frame.
- ``("frame", n, hot)``: run frame ``n``; ``hot`` is a tuple of ``(block id, parameter, value)``.
- ``("request", rid, what, args)``: ``wait_ready``, ``read``, ``stats``, ``iterations``,
  ``synchronize``: one ``reply`` comes back; the host waits for it (these are not frame-path calls).
  ``stats`` answers ``(EngineStats, loops)``, ``loops`` the ``{block id: (iterations, limit)}`` of
  each While/For of the frame read (what ``str(region)`` shows as ``Iterations: n/limit``).
- ``("close",)``: tear down and exit 0 (a closed stdin means the same).

Child → host:

- ``("ready", PROTOCOL, pid)``: imports done, engine created.
- ``("outputs", {(block id, port): OutputHandle}, replaced)``: after a build changed the output
  buffers (a value in a FrameDelay's alternating pair comes with both buffers, ``OutputHandle.alt``):
  ``replaced`` True for a new graph (every mapping of the old one goes), False for a Warm patch into
  the running graph that moved, grew or reshaped outputs (only what no output uses any more goes).
- ``("built", {block id: (sizes, shapes, fused)})``: what ``str(block.port(...))`` and ``str(block)``
  show of the new graph (``BlockDebugInfo.sizes``, ``shapes``, ``fused``), after ``outputs``, for the
  blocks where that changed.
- ``("building", busy)``: whether the engine has a structure edit not yet running (``building``):
  after every ``edits`` message and whenever it changes.
- ``("diagnostics", (DiagRecord, ...), {block id: (state, message)})``: when they changed.
- ``("reply", rid, ok, value)``: the answer to a request (``ok`` False: ``value`` is the error).
- ``("fault", (DiagRecord, ...), {block id: reason}, {step: time.monotonic()})``: CUDA refuses the
  child after a GPU fault; the blocks to disable in the next child, with why, and when the fault
  surfaced, was named and the report was sent (``IsolatedEngine.fault_times``). The child
  exits once the host closes its stdin.

Block ids in messages are always the **host's** block ids; the child maps them to its own blocks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = [
    "PROTOCOL",
    "EXIT_FAULT",
    "StartConfig",
    "OutputHandle",
    "InputHandle",
    "DiagRecord",
    "diag_record",
    "diag_from_record",
]

#: Bumped when a message changes; a child of another version is refused at the handshake.
PROTOCOL = 5  # 2: StartConfig.fuse, the SetKept edit; 3: regions (Place), built, building, iterations;
# 4: outputs after a Warm patch (``replaced``); 5: the fault's times
#: The child's exit status after it reported a GPU fault (CUDA refuses the process from then on).
EXIT_FAULT = 3

#: ``(severity, host block id or None, code text, message)``: a ``Diagnostic`` that pickles cheaply.
DiagRecord = tuple[str, "int | None", str, str]


@dataclass(frozen=True)
class StartConfig:
    """What the child needs to create its engine.

    Attributes:
        device: CUDA device ordinal.
        name: Engine name.
        cache_dir: Compiled-kernel cache (as ``Engine(cache_dir=...)``; a path as text).
        wait_for_compile: As the ``Engine`` option.
        watch_files: As the ``Engine`` option.
        fuse: As the ``Engine`` option (elementwise fusion, on by default).
        background_builds: As the ``Engine`` option.
        debug_launch: As the ``Engine`` option.
        freeze_collector: As the ``Engine`` option (in the child's process).
        frame_word_fd: The child's descriptor of the shared page holding the frame word (-1: none,
            for tests without a GPU); see ``ipc.FrameWord``.
        start_frame: The frame number the child starts after (frames count on across restarts).
    """

    device: int = 0
    name: str = "CudaEngine"
    cache_dir: Any = None
    wait_for_compile: bool = False
    watch_files: bool = True
    fuse: bool = True
    background_builds: bool = True
    debug_launch: bool = False
    freeze_collector: bool = True
    frame_word_fd: int = -1
    start_frame: int = 0


@dataclass(frozen=True)
class OutputHandle:
    """An output buffer of the child, for the host to map without a copy.

    Attributes:
        handle: ``cuIpcGetMemHandle`` of the buffer's allocation (64 bytes).
        offset: Bytes from the allocation's start to the buffer.
        count: Elements.
        dtype: The element type (a ``DType``: an enum, pickled by name).
        nbytes: The buffer's size in bytes.
        shape: Its ``Shape`` in the child's plan (None: flat, ``(count,)``), for ``output_shape``.
        alt: For a value in a FrameDelay's pair of buffers, which swap every frame (``engine/phases.py``):
            ``(handle, offset)`` of the other buffer; empty otherwise.
        frame: With ``alt``: the frame whose launch wrote ``handle``'s buffer; ``alt``'s is written by
            the frames of the other parity.
    """

    handle: bytes
    offset: int
    count: int
    dtype: Any
    nbytes: int
    shape: Any = None
    alt: tuple[bytes, int] | tuple[()] = ()
    frame: int = 0


@dataclass(frozen=True)
class InputHandle:
    """Memory of the host bound to an input of the child's engine: an IPC handle of device memory
    (``handle``, ``offset``), a host array sent by value (``array``, copied by the child), or pinned
    host pages both processes map (``shared``: ``(serial, path, nbytes, offset)``, an Upload or
    Download ring; ``ipc.SharedPages``)."""

    count: int
    dtype: Any
    handle: bytes = b""
    offset: int = 0
    array: Any = None
    shape: Any = None  # the binding's Shape (2-D/3-D data), so the child launches over the same axes
    shared: tuple = ()


def diag_record(d: Any, to_host: dict[int, int]) -> DiagRecord:
    """A child ``Diagnostic`` as a record, its block id mapped to the host's (``to_host``)."""
    bid = d.block_id
    return (d.severity, to_host.get(bid) if bid is not None else None, str(d.code), d.message)


def diag_from_record(r: DiagRecord) -> Any:
    """The host's ``Diagnostic`` of a record."""
    from ..engine.diagnostics import Diagnostic

    return Diagnostic(r[0], r[1], r[2], r[3])  # type: ignore[arg-type]
