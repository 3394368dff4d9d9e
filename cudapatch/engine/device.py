"""The CUDA device an engine runs on: its primary context and one non-blocking stream."""

from __future__ import annotations

import threading
from typing import Any

from .._lifecycle import ContextRef, HandleOwner, Releases, note_context_reset
from ..errors import CudaUnavailableError
from ..kernels._driver import DRIVER_TOO_OLD, check, driver, driver_too_old_message, no_driver_message

__all__ = ["DeviceContext"]


class _CurrentHere(threading.local):
    """Per thread: the context a ``DeviceContext`` last made current on it, as ``(handle value, resets
    in the process then)``; None: none yet. One for all of them, as the driver keeps one current
    context per thread: an engine on another device that makes its own current there is seen by
    this one's next call, and two engines on one device (one primary context) share it."""

    context: tuple[int, int] | None = None


_HERE = _CurrentHere()
#: Contexts reset in this process (``DeviceContext.reset``): what any thread remembers from before
#: one is stale, even where the new context has the old one's handle value.
_RESETS = [0]


class DeviceContext(HandleOwner):
    """One CUDA device: ``cuInit``, its **primary context** (shared with CuPy, Numba and PyTorch,
    so their arrays interoperate with ours), and one non-blocking stream for all engine work.

    The root owner of an engine (``cudapatch._lifecycle``): every other driver handle of the engine
    lives in this context. One nobody closed is released by its finalizer with a ``ResourceWarning``
    (the one an unclosed ``Engine`` gives): its streams, then its retain of the primary context, which
    takes every allocation, module and graph of the context with it when no other library retains it.

    Args:
        ordinal: Device index.

    Raises:
        CudaUnavailableError: cuda-bindings missing, no driver, no device, or ``ordinal`` out of range.
        CudaError: another driver call failed.
    """

    def __init__(self, ordinal: int = 0) -> None:
        d = driver()
        try:
            (err,) = d.cuInit(0)
        except RuntimeError:  # cuda-bindings raises this when libcuda.so cannot be loaded
            raise CudaUnavailableError(no_driver_message()) from None
        if err == d.CUresult.CUDA_ERROR_NO_DEVICE:
            raise CudaUnavailableError("the NVIDIA driver reports no CUDA device; see `cudapatch check`")
        if getattr(err, "name", None) in DRIVER_TOO_OLD:
            raise CudaUnavailableError(driver_too_old_message(err.name))
        if err:
            check((err,), "cuInit")
        count = check(d.cuDeviceGetCount(), "cuDeviceGetCount")
        if not 0 <= ordinal < count:
            raise CudaUnavailableError(f"CUDA device {ordinal} requested but only {count} device(s) present")
        self.ordinal = ordinal
        self._device = check(d.cuDeviceGet(ordinal), "cuDeviceGet")
        self.name: str = check(d.cuDeviceGetName(256, self._device), "cuDeviceGetName").split(b"\0")[0].decode()
        attr = d.CUdevice_attribute
        major = check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self._device))
        minor = check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self._device))
        self.compute_capability: tuple[int, int] = (int(major), int(minor))
        self.multiprocessor_count: int = int(
            check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, self._device))
        )
        self.max_threads_per_multiprocessor: int = int(
            check(d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, self._device))
        )
        self.total_memory: int = int(check(d.cuDeviceTotalMem(self._device), "cuDeviceTotalMem"))
        self.driver_version: int = int(check(d.cuDriverGetVersion(), "cuDriverGetVersion"))
        self.resets = 0  # successful ``reset`` calls
        self._closed = False
        self._releases = Releases()  # the streams, then the retain: given back newest first
        self._context = check(d.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain")
        self._releases.push(d.cuDevicePrimaryCtxRelease, self._device, what="cuDevicePrimaryCtxRelease")
        try:
            self._start(d)
        except BaseException:
            self._releases.release_quietly()  # the error that stopped us is the one to report
            raise

    def _start(self, d: Any) -> None:
        """Make the retained context current here, make the streams and arm the finalizer (at
        construction and after a ``reset``)."""
        check(d.cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
        self._current = (int(self._context), _RESETS[0])  # what ``make_current`` compares
        _HERE.context = self._current
        flags = d.CUstream_flags.CU_STREAM_NON_BLOCKING.value
        self._stream = check(d.cuStreamCreate(flags), "cuStreamCreate")
        self._releases.push(d.cuStreamDestroy, self._stream, what="cuStreamDestroy")
        self._upload_stream = check(d.cuStreamCreate(flags), "cuStreamCreate")
        self._releases.push(d.cuStreamDestroy, self._upload_stream, what="cuStreamDestroy")
        self._arm(f"DeviceContext {self.ordinal} ({self.name})", releases=self._releases, context=ContextRef.current())

    @property
    def arch(self) -> str:
        """The architecture name, ``sm_90`` on an H100."""
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"

    @property
    def key(self) -> str:
        """Identifies this device for caches: ``"0:sm_90"``."""
        return f"{self.ordinal}:{self.arch}"

    @property
    def context(self) -> Any:
        """The primary ``CUcontext`` (read-only)."""
        return self._context

    @property
    def stream(self) -> Any:
        """The engine's non-blocking ``CUstream`` (read-only)."""
        return self._stream

    @property
    def upload_stream(self) -> Any:
        """A second non-blocking stream, for uploading new executable graphs (``cuGraphUpload``) on the
        build thread. On the engine's stream an upload waits behind the frames queued there, and
        launches from the frame thread wait for it: measured on the H100 host, 37 launches over 1 ms
        in 1.5 s beside uploads of a 1,000-node graph there, none on a stream of their own; at 10,000
        nodes the slowest launch took 191 ms there, 8 ms on its own. (That the first launch, on the
        engine's stream, comes after the upload is the driver's: the CUDA documentation orders an
        upload after the graph's earlier launches and says no more; the GPU suite, which checks the
        outputs of the frames after each swap, passes with it.)"""
        return self._upload_stream

    @property
    def stream_handle(self) -> int:
        """The stream as an integer handle, for ``__cuda_array_interface__`` and other libraries."""
        return int(self._stream)

    def make_current(self) -> None:
        """Make the primary context current on the calling thread, if it is not already.

        Cheap when nothing changes: one thread-local comparison, so the frame path can call it (the
        closed check is made only when the context has to be made current). Each thread remembers
        what it made current, as the driver does: a build thread's call does not make the frame
        thread's next frame call ``cuCtxSetCurrent`` again (which, through the bindings, lets go of the
        GIL, and a build's Python then held the frame for up to the switch interval). What another
        library makes current on a thread (``torch.cuda.set_device`` to another device) is not seen:
        such code puts the engine's device back before the engine's next call on that thread.

        Raises:
            CudapatchError: the device is closed.
            CudaError: cuCtxSetCurrent failed.
        """
        here = _HERE
        if here.context != self._current:
            self._check_open("DeviceContext.make_current")
            check(driver().cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            here.context = self._current

    def reset(self) -> None:
        """After a sticky fault: reset the primary context (every allocation, module and stream of
        it is gone, for every user of it in the process), then retain it again with a new stream.

        Raises:
            CudapatchError: the device is closed.
            CudaError: the reset or the new stream failed (the device is unusable: ``abandon`` it).
        """
        self._check_open("DeviceContext.reset")
        d = driver()
        self._disarm()
        d.cuCtxSetCurrent(0)  # nothing may use the dead context while it is reset (result ignored: it is dead)
        _RESETS[0] += 1  # every thread sets the new context before its next call
        note_context_reset(self._context)  # finalizers of its owners forget their handles, never free them
        self._releases.forget()  # the streams died with the context; the retain is given back again below
        self._releases.push(d.cuDevicePrimaryCtxRelease, self._device, what="cuDevicePrimaryCtxRelease")
        check(d.cuDevicePrimaryCtxReset(self._device), "cuDevicePrimaryCtxReset")
        self._context = check(d.cuDevicePrimaryCtxRetain(self._device), "cuDevicePrimaryCtxRetain")
        d.cuDevicePrimaryCtxRelease(self._device)  # the retain from __init__ still holds it
        self._start(d)
        self.resets += 1

    def synchronize(self) -> None:
        """Wait for all work on the engine stream.

        Raises:
            CudapatchError: the device is closed.
            CudaError: a launch on the stream failed (sticky errors surface here).
        """
        self._check_open("DeviceContext.synchronize")
        check(driver().cuStreamSynchronize(self._stream), "cuStreamSynchronize")

    def mem_info(self) -> tuple[int, int]:
        """``(free, total)`` device memory in bytes.

        Raises:
            CudapatchError: the device is closed.
            CudaError: cuMemGetInfo failed.
        """
        self._check_open("DeviceContext.mem_info")
        self.make_current()
        free, total = check(driver().cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total)

    # ``close()`` (idempotent) and ``abandon()`` are HandleOwner's: ``close`` destroys the streams and
    # releases the retain, every call made even when one fails (the first failure is raised after);
    # ``abandon`` (the context is lost for good: CUDA refuses the process after a fault) forgets them.
    def _release(self) -> None:
        """Destroy the streams, then release the primary context (with it current on this thread).

        Raises:
            CudaError: cuStreamDestroy or cuDevicePrimaryCtxRelease failed.
        """
        here = _HERE
        if here.context != self._current:
            check(driver().cuCtxSetCurrent(self._context), "cuCtxSetCurrent")
            here.context = self._current
        self._releases.release()

    def __enter__(self) -> DeviceContext:
        return self

    def __repr__(self) -> str:
        mem = self.total_memory / 2**30
        return f"<DeviceContext {self.ordinal}: {self.name} {self.arch} {mem:.0f} GiB closed={self._closed}>"
