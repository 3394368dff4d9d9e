"""Device memory: a size-class pool, typed buffers on top of it, and append buffers."""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._lifecycle import HandleOwner
from ..errors import BindingError, CudapatchError
from ..kernels._driver import check, driver
from ..kernels.types import DType

__all__ = ["BufferPool", "GpuBuffer", "AppendBuffer", "size_class"]

_MIN_CLASS = 256  # cuMemAlloc aligns to 256 bytes anyway


def size_class(nbytes: int) -> int:
    """Round ``nbytes`` up to its pool size class.

    Classes are 256 B, then four steps per power of two (1, 1.25, 1.5, 1.75 × 2^k), so at most
    25 % is wasted and buffers of similar size are reused across rebuilds.
    """
    if nbytes <= _MIN_CLASS:
        return _MIN_CLASS
    top = 1 << (int(nbytes - 1).bit_length() - 1)  # largest power of two below nbytes
    step = max(top // 4, _MIN_CLASS)
    return -(-nbytes // step) * step


@dataclass
class _Allocation:
    ptr: int
    capacity: int


class BufferPool(HandleOwner):
    """Device allocations bucketed by size class and reused across rebuilds.

    ``acquire`` takes a free block of the right class or allocates one; ``release`` returns it
    to its bucket without freeing it, so a Cold rebuild that needs the same sizes allocates
    nothing. ``trim`` frees the idle blocks.

    Lifecycle (``cudapatch._lifecycle``): no finalizer. Its engine closes it (``DeviceResources``),
    or abandons it after a lost context; the blocks of a pool nobody closed live as long as its CUDA
    context (an unclosed engine's ``DeviceContext`` warns and releases that context).

    Args:
        make_current: Called before driver calls so the engine's context is current.
    """

    def __init__(self, make_current: Any = None) -> None:
        self._make_current = make_current or (lambda: None)
        self._free: dict[int, list[int]] = {}
        self._live: dict[int, int] = {}  # ptr -> class size, of blocks handed out
        self.total_allocated_bytes = 0
        self.in_use_bytes = 0
        self.peak_in_use_bytes = 0
        self.driver_allocations = 0  # cuMemAlloc calls ever made: unchanged on a healthy frame path
        self._closed = False
        self._abandoned = False

    def make_current(self) -> None:
        """Make the engine's context current on this thread, before a driver call on pool memory."""
        self._make_current()

    def acquire(self, nbytes: int) -> _Allocation:
        """A block of at least ``nbytes`` (its capacity is the size class).

        Raises:
            CudaOutOfMemoryError: the device is out of memory, even after trimming idle blocks.
            CudapatchError: the pool is closed.
        """
        if self._closed:
            raise CudapatchError("BufferPool.acquire: the buffer pool is closed")
        cls = size_class(max(1, int(nbytes)))
        bucket = self._free.get(cls)
        if bucket:
            ptr = bucket.pop()
        else:
            self._make_current()
            d = driver()
            res = d.cuMemAlloc(cls)
            if res[0] == d.CUresult.CUDA_ERROR_OUT_OF_MEMORY and self._free:
                self.trim()  # idle blocks of other classes may be what stands in the way
                res = d.cuMemAlloc(cls)
            ptr = int(check(res, f"cuMemAlloc({cls} bytes)"))
            self.total_allocated_bytes += cls
            self.driver_allocations += 1
        self._live[ptr] = cls
        self.in_use_bytes += cls
        self.peak_in_use_bytes = max(self.peak_in_use_bytes, self.in_use_bytes)
        return _Allocation(ptr, cls)

    def release(self, alloc: _Allocation) -> None:
        """Return a block to its bucket (it stays allocated for reuse). Releasing twice is a no-op."""
        if self._abandoned:  # its memory died with the context
            return
        cls = self._live.pop(alloc.ptr, None)
        if cls is None:
            return
        self.in_use_bytes -= cls
        if self._closed:
            self._free_now(alloc.ptr, cls)
        else:
            self._free.setdefault(cls, []).append(alloc.ptr)

    def _free_now(self, ptr: int, cls: int) -> None:
        self._make_current()
        check(driver().cuMemFree(ptr), "cuMemFree")
        self.total_allocated_bytes -= cls

    def trim(self) -> int:
        """Free every idle block; returns the bytes given back to the driver.

        Raises:
            CudaError: cuMemFree failed.
        """
        freed = 0
        for cls, ptrs in self._free.items():
            for ptr in ptrs:
                self._free_now(ptr, cls)
                freed += cls
        self._free.clear()
        return freed

    def abandon(self) -> None:
        """Forget every block without freeing it: the context they belonged to was reset."""
        self._abandoned = True
        self._closed = True
        self._free.clear()
        self._live.clear()
        self.in_use_bytes = 0

    @property
    def idle_bytes(self) -> int:
        """Bytes allocated but not handed out."""
        return self.total_allocated_bytes - self.in_use_bytes

    def close(self) -> None:
        """Free idle blocks and every block still handed out; idempotent.

        Raises:
            CudaError: cuMemFree failed.
        """
        if self._closed:
            return
        self.trim()
        for ptr, cls in list(self._live.items()):
            self._free_now(ptr, cls)
        self._live.clear()
        self.in_use_bytes = 0
        self._closed = True

    @property
    def is_closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        mb = 1 / 2**20
        return (
            f"<BufferPool in_use={self.in_use_bytes * mb:.1f}MB allocated={self.total_allocated_bytes * mb:.1f}MB "
            f"peak={self.peak_in_use_bytes * mb:.1f}MB closed={self._closed}>"
        )


def _no_release() -> None:
    """A view's finalizer: the memory belongs to the buffer it views."""


class GpuBuffer(HandleOwner):
    """A typed device buffer from a ``BufferPool``.

    Exposes ``__cuda_array_interface__`` (v3, with the engine stream) so CuPy, Numba and PyTorch
    can view it without a copy: ``cupy.asarray(buf)``.

    Its lifecycle (``cudapatch._lifecycle``): ``close()`` gives the block back to the pool, and so
    does the finalizer of a buffer nobody closed, quietly: a block back in its pool is no leak (the
    pool frees it), as a CuPy array's memory goes back to CuPy's pool. It makes no driver call, so it
    never touches a lost context (the pool of one is abandoned and takes nothing back). A buffer
    whose pool closed is closed too (the pool freed its block), and so is a ``view`` of a closed
    buffer: using one raises ``CudapatchError``.

    Args:
        pool: Where the memory comes from and goes back to.
        dtype: Element type.
        count: Number of elements.
        stream: The stream (handle) that orders work on this buffer.
    """

    def __init__(self, pool: BufferPool, dtype: DType, count: int, *, stream: Any) -> None:
        if count < 0:
            raise BindingError(f"buffer element count must be >= 0, got {count}")
        self.dtype = dtype
        self.count = int(count)
        self._pool = pool
        self._stream = stream
        self._base: GpuBuffer | None = None  # the buffer a view is of
        self._alloc = pool.acquire(max(1, self.count * dtype.itemsize))
        self._finalizer = weakref.finalize(self, pool.release, self._alloc)

    def view(self, dtype: DType, count: int) -> GpuBuffer:
        """A typed window on this buffer's memory (``count`` elements of ``dtype`` from its start),
        owning nothing: valid while this buffer is. A value in a buffer several values share is read
        through one (see ``memory_plan``).

        Raises:
            BindingError: the window is larger than the allocation.
        """
        if count * dtype.itemsize > self.capacity_bytes:
            raise BindingError(f"a view of {count * dtype.itemsize} bytes on a buffer of {self.capacity_bytes}")
        v = GpuBuffer.__new__(GpuBuffer)
        v.dtype, v.count, v._pool, v._stream, v._alloc = dtype, int(count), self._pool, self._stream, self._alloc
        v._base = self._base or self
        v._finalizer = weakref.finalize(v, _no_release)
        return v

    @property
    def ptr(self) -> int:
        """Device address of element 0."""
        return self._alloc.ptr

    @property
    def nbytes(self) -> int:
        """Bytes of the elements (not the pool capacity)."""
        return self.count * self.dtype.itemsize

    @property
    def capacity_bytes(self) -> int:
        """Bytes actually reserved (the size class)."""
        return self._alloc.capacity

    @property
    def is_closed(self) -> bool:
        """True once closed or abandoned, once its pool is closed, and for a view once its buffer is."""
        if self._closed or not self._finalizer.alive:
            return True
        return self._base.is_closed if self._base is not None else self._pool.is_closed

    def _check_open(self, what: str) -> None:
        if self.is_closed:
            raise CudapatchError(f"{what}: GpuBuffer {self.dtype.c_name}[{self.count}] is closed")

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        self._check_open("GpuBuffer.__cuda_array_interface__")
        shape = (self.count,) if self.dtype.lanes == 1 else (self.count, self.dtype.lanes)
        return {
            "shape": shape,
            "typestr": self.dtype.base.str,
            "data": (self.ptr, False),
            "version": 3,
            "strides": None,
            "stream": int(self._stream) or None,
        }

    def reallocate(self, nbytes: int) -> None:
        """Move the buffer to another pool block of at least ``nbytes`` (a Warm resize growing it); the
        contents are not kept and ``ptr`` changes. The old block goes back to the pool at once: work
        launched before on the engine stream still uses it, and pool reuse is ordered after it by
        that same stream.

        Raises:
            CudaOutOfMemoryError: no memory for the new block (the buffer keeps the old one).
            CudapatchError: the buffer is closed.
        """
        self.move_to(self.reserve(nbytes))

    def reserve(self, nbytes: int) -> _Allocation:
        """A pool block of at least ``nbytes`` for this buffer to ``move_to`` later (a Warm patch
        prepared on the build thread takes it there; the buffer keeps its own block until then).
        ``unreserve`` gives back one that is not used.

        Raises:
            CudaOutOfMemoryError: no memory for the block.
            CudapatchError: the buffer is closed.
        """
        self._check_open("GpuBuffer.reserve")
        return self._pool.acquire(max(1, int(nbytes)))

    def unreserve(self, alloc: _Allocation) -> None:
        """Give back a block from ``reserve`` that the buffer never moved to."""
        self._pool.release(alloc)

    def move_to(self, alloc: _Allocation) -> None:
        """Use ``alloc`` (from ``reserve``) from now on; the old block goes back to the pool at once,
        as in ``reallocate``. The contents are not kept.

        Raises:
            CudapatchError: the buffer is closed.
        """
        self._check_open("GpuBuffer.move_to")
        self._finalizer.detach()
        self._pool.release(self._alloc)
        self._alloc = alloc
        self._finalizer = weakref.finalize(self, self._pool.release, alloc)

    def upload(self, array: Any) -> None:
        """Copy a host array into the buffer (blocks until done).

        Raises:
            BindingError: size or dtype mismatch.
            CudaError: the copy failed.
        """
        self._check_open("GpuBuffer.upload")
        host = np.ascontiguousarray(array)
        if host.dtype != self.dtype.base:
            raise BindingError(f"upload of {host.dtype} data into a {self.dtype.c_name} buffer")
        if host.nbytes != self.nbytes:
            raise BindingError(f"upload of {host.nbytes} bytes into a buffer of {self.nbytes} bytes")
        d = driver()
        self._pool.make_current()
        check(d.cuMemcpyHtoDAsync(self.ptr, host.ctypes.data, host.nbytes, self._stream), "cuMemcpyHtoDAsync")
        check(d.cuStreamSynchronize(self._stream), "cuStreamSynchronize")

    def download(self) -> np.ndarray:
        """Copy the buffer to a new host array (waits for the engine stream).

        Raises:
            CudaError: the copy failed (a sticky fault of an earlier launch surfaces here too).
        """
        self._check_open("GpuBuffer.download")
        shape = (self.count,) if self.dtype.lanes == 1 else (self.count, self.dtype.lanes)
        host = np.empty(shape, dtype=self.dtype.base)
        if self.nbytes:
            d = driver()
            self._pool.make_current()
            check(d.cuMemcpyDtoHAsync(host.ctypes.data, self.ptr, self.nbytes, self._stream), "cuMemcpyDtoHAsync")
            check(d.cuStreamSynchronize(self._stream), "cuStreamSynchronize")
        return host

    def fill_bytes(self, value: int) -> None:
        """Set every byte to ``value`` (asynchronously, on the engine stream); used to poison outputs.

        Raises:
            CudaError: the memset failed.
        """
        self._check_open("GpuBuffer.fill_bytes")
        self._pool.make_current()
        check(driver().cuMemsetD8Async(self.ptr, value & 0xFF, self.nbytes, self._stream), "cuMemsetD8Async")

    def close(self) -> None:
        """Give the memory back to the pool; idempotent."""
        self._finalizer()

    def __enter__(self) -> GpuBuffer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<GpuBuffer {self.dtype.c_name}[{self.count}] ptr=0x{self._alloc.ptr:x} closed={self.is_closed}>"


class AppendBuffer:
    """Data of ``capacity`` elements plus a ``uint32`` counter that kernels ``atomicAdd`` to.

    The engine zeroes every counter with one memset node at the start of each launch, and copies
    the counters back asynchronously after it; ``count`` and ``overflowed`` are from the last
    completed frame (``age`` frames old). By contract kernels count every append, even past
    capacity, but never write data at or past capacity.

    Args:
        data: The element storage.
        counter_ptr: Device address of this buffer's counter (a slot in the engine's counter block).
        counter_index: Index of the counter in that block.
    """

    def __init__(self, data: GpuBuffer, counter_ptr: int, counter_index: int, readback: Any = None) -> None:
        self.data = data
        self.counter_ptr = counter_ptr
        self.counter_index = counter_index
        self._readback = readback

    @property
    def raw_count(self) -> int | None:
        """The counter's value in the last completed frame (may exceed capacity), None before any."""
        return None if self._readback is None else self._readback.value(self.counter_index)

    @property
    def age(self) -> int | None:
        """How many frames old ``count`` is."""
        return None if self._readback is None else self._readback.age()

    @property
    def capacity(self) -> int:
        """Maximum number of elements stored."""
        return self.data.count

    @property
    def count(self) -> int | None:
        """Elements stored in the last completed frame (clamped to capacity), None before any frame completed."""
        return None if self.raw_count is None else min(self.raw_count, self.capacity)

    @property
    def overflowed(self) -> bool:
        """True if the last completed frame tried to append more than ``capacity`` elements."""
        return self.raw_count is not None and self.raw_count > self.capacity

    def __repr__(self) -> str:
        return (
            f"<AppendBuffer {self.data.dtype.c_name} count={self.count}/{self.capacity} overflowed={self.overflowed}>"
        )
