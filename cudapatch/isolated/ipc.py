"""Sharing memory and frame order between the host and its engine process through CUDA IPC.

Four pieces, each the smallest driver use that does the job (cuda-bindings 13 signatures):

- ``FrameWord``: one 32-bit word in a shared memory page (a ``memfd`` the child inherits) that
  both processes register with ``cuMemHostRegister(DEVICEMAP)``. After each frame the child's
  stream writes the frame number into it (``cuStreamWriteValue32``); right after sending frame
  ``n`` the host's stream waits for ``word >= n`` (``cuStreamWaitValue32``, GEQ, which compares
  with wrap-around). So work the host puts on its stream after ``update()`` runs after the child's
  frame, as it would after a normal engine's launch, and the host never waits on the CPU. An IPC
  event could not do this direction: ``cuStreamWaitEvent`` waits for the record made *before* the
  call, and the child records the frame's event only after it got the message, so the host would
  have to wait for a reply. Host memory (not device memory) is used because a child that dies in
  the middle of a frame never writes its number: the host then stores it from the CPU (``release``)
  and its stream goes on; no CUDA call is needed for that, from any thread.
- The same page's second word runs the other way: right before the host sends frame ``n`` its
  stream writes ``n`` there, and the child's stream waits for it before the launch, so a frame never
  overwrites outputs the host is still reading. An interprocess event did this first (the host
  recorded it, the child's stream waited on it): on the H100 with driver 580 the child's wait never
  completed when the host's stream held a ``cuStreamWaitValue32`` behind the record, and the two
  processes deadlocked after two quick frames; the two stream-memory words do not.
- ``export_device_memory`` / ``IpcImports``: a buffer shared by ``cuIpcGetMemHandle`` of its
  allocation plus an offset (the engine's pool allocates each buffer with ``cuMemAlloc``, and CuPy's
  pool too), opened once per allocation with ``cuIpcOpenMemHandle``: outputs child → host and bound
  inputs host → child, with no copy. Memory from ``cudaMallocAsync`` pools or the VMM API has no such
  handle: binding it fails with a ``BindingError`` that says so.
- ``SharedBuffer``-like views (``SharedOutput``) that the host hands out as ``engine.output(...)``.
- ``SharedPages``: pinned host memory both processes map, for the rings of ``Upload`` and
  ``Download`` blocks (``engine/transfer.py``), which the host writes and reads with plain stores
  and loads while the child's kernels read and write them: memory from ``cuMemHostAlloc`` belongs to
  one process, so an isolated engine gives the rings a ``memfd`` instead, which the host and the
  child each map and register with ``cuMemHostRegister(DEVICEMAP)`` (as the frame word's page). The
  child opens it as ``/proc/<host pid>/fd/<fd>`` (a ``memfd`` has no other name), when it is bound.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import struct
import sys
from collections.abc import Collection
from typing import Any

import numpy as np

from .._lifecycle import ContextRef, HandleOwner, Releases
from ..errors import BindingError, CudaError, CudapatchError
from ..kernels._driver import check, driver

__all__ = [
    "CHILD_DONE",
    "HOST_READY",
    "FrameWord",
    "export_device_memory",
    "IpcImports",
    "SharedOutput",
    "SharedPages",
]

_PAGE = 4096
_WORD = struct.Struct("<I")


CHILD_DONE = 0  # the page's first word: the last frame the child's stream finished
HOST_READY = 1  # the second: the last frame the host's stream let the child start

#: Whether this platform has what an isolated engine shares through: ``memfd`` pages (Linux only).
SHARED_PAGES = sys.platform.startswith("linux") and hasattr(os, "memfd_create")


def check_platform() -> None:
    """Refuse an isolated engine where its shared pages cannot exist.

    Raises:
        CudapatchError: not Linux (``os.memfd_create`` is missing).
    """
    if not SHARED_PAGES:
        raise CudapatchError(
            f"Engine(isolated=True) needs Linux: the engine process shares its frame word and rings with "
            f"this one through os.memfd_create, which {sys.platform} does not have; use Engine() here"
        )


def _memfd(name: str, nbytes: int) -> int:
    """A new zeroed ``memfd`` of ``nbytes`` (Linux); closed again if it cannot be sized."""
    check_platform()
    fd = os.memfd_create(name, 0)  # type: ignore[attr-defined]  (Linux)
    try:
        os.ftruncate(fd, nbytes)
    except BaseException:
        os.close(fd)
        raise
    return fd


class _PageHandles:
    """What pages registered for the device give back: the registration (a driver call, made in the
    context it was made in) and, for the process that made them, the ``memfd`` (an OS call, made
    also when the context is gone). The finalizer holds this, never the pages (see ``_lifecycle``)."""

    __slots__ = ("driver", "fd")

    def __init__(self) -> None:
        self.driver = Releases()
        self.fd = -1

    def __len__(self) -> int:
        return len(self.driver) + (self.fd >= 0)

    def release(self) -> None:
        try:
            self.driver.release()
        finally:
            self._close_fd()

    def release_quietly(self) -> None:
        self.driver.release_quietly()
        self._close_fd()

    def forget(self) -> None:
        self.driver.forget()
        self._close_fd()

    def _close_fd(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)


class _RegisteredPages(HandleOwner):
    """``nbytes`` of a ``memfd`` mapped into this process and registered for the device
    (``cuMemHostRegister``, DEVICEMAP | PORTABLE): the part ``FrameWord`` and ``SharedPages`` share.

    An engine part: its owner (the host's CUDA side, a transfer ring) closes it; an unclosed one's
    finalizer unregisters it in its living context, quietly. ``close()`` unregisters, unmaps, and closes
    the ``memfd`` of the process that owns it; the other process's mapping keeps the memory until it
    unmaps too.

    Raises:
        OSError: the pages cannot be mapped. CudaError: registering them failed (nothing is left behind).
    """

    def __init__(self, fd: int, nbytes: int, *, owner: bool, what: str) -> None:
        self.nbytes = nbytes
        self._what = what
        self._handles = _PageHandles()
        self._handles.fd = fd if owner else -1  # from here on, close() closes it: also when this fails
        self._arm(what, releases=self._handles, context=ContextRef.current(), warn=False)
        try:
            self._map = mmap.mmap(fd, nbytes)
            self._anchor = ctypes.c_char.from_buffer(self._map)  # pins the map; released in close()
            self._host_ptr = ctypes.addressof(self._anchor)
            d = driver()
            flags = 0x2 | 0x1  # CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_PORTABLE
            check(d.cuMemHostRegister(self._host_ptr, nbytes, flags), f"cuMemHostRegister({what})")
            self._handles.driver.push(d.cuMemHostUnregister, self._host_ptr, what=f"cuMemHostUnregister({what})")
            self._device_ptr = int(check(d.cuMemHostGetDevicePointer(self._host_ptr, 0), "cuMemHostGetDevicePointer"))
        except BaseException:
            self.close()
            raise

    @property
    def host_ptr(self) -> int:
        """This process's address of the first byte. Raises: CudapatchError once closed."""
        self._check_open(f"{type(self).__name__}.host_ptr")
        return self._host_ptr

    @property
    def device_ptr(self) -> int:
        """The device's address of the first byte. Raises: CudapatchError once closed."""
        self._check_open(f"{type(self).__name__}.device_ptr")
        return self._device_ptr

    def _release(self) -> None:
        try:
            self._handles.release()  # unregister first: the registration must not outlive the mapping
        finally:
            self._unmap()

    def _forget(self) -> None:
        self._handles.forget()  # no driver call: the registration died with its context
        self._unmap()

    def _unmap(self) -> None:
        if hasattr(self, "_anchor"):  # no other reference to it may live while the map closes
            del self._anchor
        if hasattr(self, "_map"):
            self._map.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._what} {self.nbytes} bytes closed={self._closed}>"


class FrameWord(_RegisteredPages):
    """The shared frame word (see the module docstring).

    Use ``FrameWord.create()`` in the host (it owns the page and passes ``fd`` to the child) and
    ``FrameWord.attach(fd)`` in the child. An engine part (see ``_RegisteredPages``).

    Raises:
        CudaError: registering the page failed.
    """

    def __init__(self, fd: int, *, owner: bool) -> None:
        self.fd = fd
        super().__init__(fd, _PAGE, owner=owner, what="frame word")

    @classmethod
    def create(cls, start: int = 0) -> FrameWord:
        """A new page (host side) holding ``start``; its ``fd`` is inheritable for the child.

        Raises:
            CudapatchError: not Linux. CudaError: registering the page failed.
        """
        fd = _memfd("cudapatch-frame", _PAGE)
        os.set_inheritable(fd, True)
        word = cls(fd, owner=True)
        word.release(start)
        return word

    @classmethod
    def attach(cls, fd: int) -> FrameWord:
        """The child's view of the host's page."""
        return cls(fd, owner=False)

    @property
    def value(self) -> int:
        """The frame number last written (a plain load; the GPU writes it after the frame's work)."""
        return _WORD.unpack_from(self._map, 0)[0]

    def read(self, slot: int) -> int:
        """The word ``slot`` (``CHILD_DONE`` or ``HOST_READY``): a plain load."""
        return _WORD.unpack_from(self._map, slot * _WORD.size)[0]

    def release(self, n: int, slot: int = 0) -> None:
        """Store ``n`` from the CPU: every stream wait for a frame up to ``n`` is satisfied (a child
        that died without finishing them, a restart that starts counting there)."""
        _WORD.pack_into(self._map, slot * _WORD.size, n & 0xFFFFFFFF)

    def wait(self, stream: Any, n: int, slot: int = CHILD_DONE) -> None:
        """Make ``stream`` wait until frame ``n`` is written (host side, right after sending it).

        Raises:
            CudapatchError: the word is closed. CudaError: the driver refused the stream wait.
        """
        self._check_open("FrameWord.wait")  # a closed word's address may belong to other memory now
        d = driver()
        flag = d.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ.value
        ptr = self._device_ptr + slot * _WORD.size
        check(d.cuStreamWaitValue32(stream, ptr, n & 0xFFFFFFFF, flag), "cuStreamWaitValue32")

    def signal(self, stream: Any, n: int, slot: int = CHILD_DONE) -> None:
        """Write ``n`` on ``stream`` after the work before it (child side, after each frame).

        Raises:
            CudapatchError: the word is closed. CudaError: the driver refused the write.
        """
        self._check_open("FrameWord.signal")
        d = driver()
        flag = d.CUstreamWriteValue_flags.CU_STREAM_WRITE_VALUE_DEFAULT.value
        ptr = self._device_ptr + slot * _WORD.size
        check(d.cuStreamWriteValue32(stream, ptr, n & 0xFFFFFFFF, flag), "cuStreamWriteValue32")


class SharedPages(_RegisteredPages):
    """Host memory the host and its engine process both map, registered for the device in each.

    ``SharedPages.create(nbytes)`` in the host (it owns the ``memfd``; ``path`` names it for the child),
    ``SharedPages.attach(path, nbytes)`` in the child. ``host_ptr`` and ``device_ptr`` are this
    process's addresses of the first byte. An engine part (see ``_RegisteredPages``): the ring that
    asked for it closes it (``release``).

    Raises:
        OSError: the memory cannot be made or opened. CudaError: registering it failed.
    """

    def __init__(self, fd: int, nbytes: int, *, owner: bool) -> None:
        self.path = f"/proc/{os.getpid()}/fd/{fd}" if owner else ""
        super().__init__(fd, _pages(nbytes), owner=owner, what="shared pages")

    @classmethod
    def create(cls, nbytes: int) -> SharedPages:
        """New zeroed pages of at least ``nbytes`` (host side).

        Raises:
            CudapatchError: not Linux. OSError, CudaError: as the class.
        """
        return cls(_memfd("cudapatch-ring", _pages(nbytes)), nbytes, owner=True)

    @classmethod
    def attach(cls, path: str, nbytes: int) -> SharedPages:
        """The child's mapping of the host's pages named ``path``."""
        fd = os.open(path, os.O_RDWR)
        try:
            return cls(fd, nbytes, owner=False)
        finally:
            os.close(fd)  # the mapping keeps the memory

    def contains(self, ptr: int) -> bool:
        """Whether device address ``ptr`` lies in these pages (False once closed)."""
        return not self._closed and self._device_ptr <= ptr < self._device_ptr + self.nbytes

    def release(self) -> tuple[Any, ...]:
        """``close()`` as a release call of a ``Releases`` (a driver result tuple): how a ring gives its
        pages back.

        Raises:
            CudaError: unregistering failed (the pages are closed all the same).
        """
        self.close()
        return (0,)


def _pages(nbytes: int) -> int:
    return -(-max(nbytes, 1) // _PAGE) * _PAGE


def export_device_memory(ptr: int) -> tuple[bytes, int]:
    """``(IPC handle of the allocation holding ptr, offset of ptr in it)``.

    Raises:
        BindingError: the memory has no IPC handle (a ``cudaMallocAsync`` pool, VMM memory, host memory).
    """
    d = driver()
    try:
        base, _size = check(d.cuMemGetAddressRange(ptr), "cuMemGetAddressRange")
        handle = check(d.cuIpcGetMemHandle(base), "cuIpcGetMemHandle")
    except CudaError as exc:
        raise BindingError(
            f"this memory cannot be shared with the isolated engine process ({exc.name}): bind memory from "
            "cuMemAlloc or CuPy's default pool, or a host array (copied)"
        ) from None
    return bytes(handle.reserved), int(ptr) - int(base)


class _Opened(dict):
    """The allocations ``IpcImports`` opened (handle -> base address), as its finalizer releases them:
    ``cuIpcCloseMemHandle`` each (the memory is freed once its exporter freed it too)."""

    def __init__(self, d: Any) -> None:
        super().__init__()
        self.driver = d  # the driver the bases came from (tests swap doubles)

    def close_all_but(self, keep: Collection[bytes] = ()) -> None:
        """Close every opened allocation but those of the handles in ``keep``."""
        for h in [h for h in self if h not in keep]:
            # Result ignored: the child that exported it may be gone; nothing here can act on a failure.
            self.driver.cuIpcCloseMemHandle(self.pop(h))

    def release_quietly(self) -> None:
        for base in self.values():
            try:
                self.driver.cuIpcCloseMemHandle(base)
            except Exception:  # a finalizer's: at interpreter exit the driver may be gone
                pass
        self.clear()

    def forget(self) -> None:
        self.clear()


class IpcImports(HandleOwner):
    """Allocations of another process opened in this one, once each (opening one twice fails).

    An engine part: its owner (the host's CUDA side) closes it; an unclosed one's finalizer closes its
    allocations in their living context, quietly (see ``_lifecycle``).
    """

    def __init__(self) -> None:
        self._opened = _Opened(driver())
        self._arm("IpcImports", releases=self._opened, context=ContextRef.current(), warn=False)

    def pointer(self, handle: bytes, offset: int) -> int:
        """This process's address of ``offset`` in the allocation of ``handle``.

        Raises:
            CudapatchError: closed. CudaError: the driver refused to open it.
        """
        base = self._opened.get(handle)
        if base is None:
            self._check_open("IpcImports.pointer")
            d = driver()
            h = d.CUipcMemHandle()
            h.reserved = handle
            flag = d.CUipcMem_flags.CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS.value
            base = self._opened[handle] = int(check(d.cuIpcOpenMemHandle(h, flag), "cuIpcOpenMemHandle"))
        return base + offset

    def drop(self, keep: Collection[bytes] = ()) -> None:
        """Close every opened allocation but those of the handles in ``keep`` (this stays usable: a
        handle asked for again later is opened anew)."""
        self._opened.close_all_but(keep)

    def _release(self) -> None:
        self._opened.close_all_but()

    def _forget(self) -> None:
        self._opened.forget()

    def __repr__(self) -> str:
        return f"<IpcImports opened={len(self._opened)} closed={self._closed}>"


class SharedOutput:
    """An output buffer of the engine process, mapped into the host with no copy.

    Valid until the next rebuild of the child's graph, a Warm edit that moves or resizes it, or the
    child's restart (as ``Engine.output``'s buffer is valid until the next rebuild or growth);
    ``__cuda_array_interface__`` carries the host's engine stream, which is ordered after the child's
    frame.
    """

    def __init__(self, ptr: int, count: int, dtype: Any, nbytes: int, stream: Any) -> None:
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.nbytes = nbytes
        self._stream = stream

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        shape = (self.count,) if self.dtype.lanes == 1 else (self.count, self.dtype.lanes)
        return {
            "shape": shape,
            "typestr": self.dtype.base.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": int(self._stream) or None,
        }

    def download(self) -> np.ndarray:
        """Copy to a new host array, after the frames the host's stream waits for. Raises: CudaError."""
        shape = (self.count,) if self.dtype.lanes == 1 else (self.count, self.dtype.lanes)
        host = np.empty(shape, dtype=self.dtype.base)
        if self.nbytes:
            d = driver()
            check(d.cuMemcpyDtoHAsync(host.ctypes.data, self.ptr, self.nbytes, self._stream), "cuMemcpyDtoHAsync")
            check(d.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
        return host

    def __repr__(self) -> str:
        return f"<SharedOutput ptr=0x{self.ptr:x} count={self.count} dtype={self.dtype.c_name}>"
