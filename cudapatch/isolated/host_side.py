"""The collaborators of an ``IsolatedEngine`` in the host process: its children, and its CUDA side.

- ``ChildLike``: what the engine needs of a child (messages both ways, its end); ``ProcessLauncher``
  starts real ones (``process.EngineProcess``), keeping the next one started in reserve.
- ``HostSide``: the host's CUDA work for the child's frames (the frame word, the host's stream, the
  child's outputs mapped here); ``CudaHostSide`` does it with the driver.

Both are passed to the engine, so ``host.py`` is tested on the CPU with fakes of them
(``tests/unit/test_isolated.py``); these real ones are tested on the GPU (``tests/gpu/test_isolated_gpu.py``).
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Collection
from typing import Any, Protocol

import numpy as np

from ..engine.context import ExternalBinding
from .protocol import InputHandle, StartConfig

__all__ = ["ChildLike", "CudaHostSide", "HostSide", "ProcessLauncher"]


class ChildLike(Protocol):
    """What the host needs of a child process (``process.EngineProcess``, or a fake)."""

    eof: bool

    def send(self, message: Any) -> None: ...
    def read(self) -> list[Any]: ...
    def wait_readable(self, timeout: float) -> None: ...
    def stderr_text(self) -> str: ...
    def close(self, timeout: float = 5.0) -> str: ...
    def release(self) -> Any: ...  # close its stdin, reap it in the background (after a fault report)


class HostSide(Protocol):
    """The host's CUDA side of an isolated engine (``CudaHostSide``, or a fake)."""

    stream: Any
    device: Any

    def start_parts(self, start_frame: int) -> int: ...  # the frame words' fd
    def begin_frame(self, n: int) -> None: ...
    def sent_frame(self, n: int) -> None: ...
    def finished(self) -> int: ...
    def let_start(self) -> int: ...  # the last frame the host's stream let the child start
    def release(self, n: int) -> None: ...
    def export(self, binding: ExternalBinding) -> InputHandle: ...
    def share(self, nbytes: int) -> Any: ...  # ipc.SharedPages
    def import_output(self, handle: Any) -> Any: ...
    def drop_outputs(self, keep: Collection[bytes] | None = None) -> None: ...  # None: every mapping
    def synchronize(self) -> None: ...
    def close(self) -> None: ...
    def abandon(self) -> None: ...  # forget every handle without a driver call (the context is gone)


#: How far past the last frame it let start the host's stream is let on: every frame it may wait for.
#: Its waits compare with wrap-around (``cuStreamWaitValue32`` GEQ: ``word - n`` as a signed 32-bit
#: number), so any value up to 2**31 - 1 ahead satisfies them all, however many frames were in flight.
_EVERY_FRAME = 1 << 30


def let_every_frame_past(side: HostSide) -> None:
    """Satisfy every wait of the host's stream for a child's frame without knowing the newest frame
    sent (an unclosed engine's finalizer: the engine is gone); a plain store, no driver call."""
    side.release(side.let_start() + _EVERY_FRAME)


class CudaHostSide:
    """The real host side: the device's primary context and a stream of the host's, the frame word,
    the host event, and the child's output allocations opened here (``ipc.py``)."""

    def __init__(self, device: int) -> None:
        from ..engine.device import DeviceContext
        from .ipc import FrameWord, IpcImports

        self.device = DeviceContext(device)
        self.device.make_current()
        self.stream = self.device.stream
        self.word = FrameWord.create(0)
        self.imports = IpcImports()
        self._shared: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()  # serial -> pages
        self._serials = itertools.count(1)

    def start_parts(self, start_frame: int) -> int:
        from .ipc import CHILD_DONE, HOST_READY

        self.word.release(start_frame, CHILD_DONE)
        self.word.release(start_frame, HOST_READY)
        return self.word.fd

    def begin_frame(self, n: int) -> None:
        from .ipc import HOST_READY

        self.device.make_current()
        self.word.signal(self.stream, n, HOST_READY)

    def sent_frame(self, n: int) -> None:
        self.word.wait(self.stream, n)

    def finished(self) -> int:
        return self.word.value  # a plain load of the shared page: the child's last finished frame

    def let_start(self) -> int:
        from .ipc import HOST_READY

        return self.word.read(HOST_READY)  # the last frame the host's stream let the child start

    def release(self, n: int) -> None:
        self.word.release(n)

    def export(self, binding: ExternalBinding) -> InputHandle:
        from .ipc import export_device_memory

        if isinstance(binding.owner, np.ndarray):
            return InputHandle(binding.count, binding.dtype, array=binding.owner)
        for serial, pages in list(self._shared.items()):  # an Upload/Download ring made for this engine
            if pages.contains(binding.ptr):
                where = (serial, pages.path, pages.nbytes, binding.ptr - pages.device_ptr)
                return InputHandle(binding.count, binding.dtype, shape=binding.shape, shared=where)
        self.device.make_current()
        handle, offset = export_device_memory(binding.ptr)
        return InputHandle(binding.count, binding.dtype, handle=handle, offset=offset, shape=binding.shape)

    def share(self, nbytes: int) -> Any:
        from .ipc import SharedPages

        self.device.make_current()
        pages = SharedPages.create(nbytes)
        self._shared[next(self._serials)] = pages  # kept by the ring that releases it
        return pages

    def import_output(self, h: Any) -> Any:
        from .ipc import SharedOutput

        self.device.make_current()
        return SharedOutput(self.imports.pointer(h.handle, h.offset), h.count, h.dtype, h.nbytes, self.stream)

    def drop_outputs(self, keep: Collection[bytes] | None = None) -> None:
        self.device.make_current()
        self.imports.drop(keep=keep or ())

    def synchronize(self) -> None:
        self.device.make_current()
        self.device.synchronize()

    def abandon(self) -> None:
        self.imports.abandon()
        self.word.abandon()
        self.device.abandon()

    def close(self) -> None:
        self.imports.close()  # (a lost context: ``abandon`` instead, which calls no driver)
        try:
            self.word.close()  # (its unregister may fail in a context that met an error: the device still closes)
        finally:
            self.device.close()


class ProcessLauncher:
    """Starts engine children, keeping one started in reserve (``standby``): a restart then skips the
    interpreter start, the imports and the CUDA context the reserve made while waiting (most of a
    restart's second, measured on the H100 host). The reserve waits for its ``start`` message with
    nothing on the GPU but its context and its fault replay process's (a few hundred MB of device
    memory each)."""

    def __init__(self, python: str, *, standby: bool) -> None:
        self._python = python
        self._standby = standby
        self._spare: Any = None
        self._spare_fds: tuple[int, ...] = ()

    def _spawn(self, fds: tuple[int, ...], device: int) -> Any:
        from .process import EngineProcess

        return EngineProcess(self._python, pass_fds=fds, device=device)

    def __call__(self, cfg: StartConfig) -> ChildLike:
        fds = (cfg.frame_word_fd,) if cfg.frame_word_fd >= 0 else ()
        child, self._spare = self._spare, None
        if child is None or self._spare_fds != fds or not child.alive:
            if child is not None:
                child.close(timeout=1.0)
            child = self._spawn(fds, cfg.device)
        child.send(("start", cfg))
        if self._standby:  # the next restart's child warms up while this one runs
            self._spare, self._spare_fds = self._spawn(fds, cfg.device), fds
        return child

    def close(self) -> None:
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.close(timeout=5.0)
