"""The zero-map path: memory CUDA allocates, which GL imports as buffer storage.

Where the GL driver has ``GL_EXT_memory_object_fd`` (the NVIDIA driver on Linux does), CUDA
allocates exportable memory (``cuMemCreate`` with a POSIX file descriptor handle type, mapped into
CUDA's address space) and GL imports it (``glImportMemoryFdEXT`` + ``glNamedBufferStorageMemEXT``).
Both then address the same bytes: nothing is registered, mapped or unmapped per frame.

Without map/unmap, nothing orders CUDA's writes and GL's reads, so ``ImportedRing`` keeps three such
buffers: CUDA writes the next free one; GL draws the newest one whose copy has completed and marks
the end of its draws with a query; CUDA skips a frame (``dropped``) rather than write a buffer GL
may still be reading. No side ever waits. An engine feeds the ring from inside its graph
(``GlRingWriter``, see ``gl_writers.py``: the host only writes a request word per frame); ``write``
copies from the host's side instead, one copy and one event record per call. (Windows drivers
offer the same through ``GL_EXT_memory_object_win32``; not built yet: register/map is used there.)
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from .._lifecycle import ContextRef, HandleOwner, Releases
from ..errors import InteropError
from ..kernels._driver import check, driver
from . import _platform
from ._gl import check_gl, gl, gl_function
from .gl_writers import REQUESTS

__all__ = [
    "ImportedBuffer",
    "ImportedImage",
    "ImportedRing",
    "zero_map_available",
    "next_write_slot",
    "newest_written",
    "request_slot",
]

log = logging.getLogger("cudapatch.interop")
_GL_TIMESTAMP, _GL_QUERY_RESULT_AVAILABLE = 0x8E28, 0x8867


def next_write_slot(frame: int, slots: int, front: int, free: Callable[[int], bool]) -> int | None:
    """Which buffer of the ring the next copy goes to: the first after the last written one that is
    not the buffer GL draws (``front``) and that ``free(slot)`` says GL and CUDA are done with.
    None: every other buffer is busy, so this frame's copy is dropped."""
    for step in range(1, slots + 1):
        slot = (frame + step) % slots
        if slot != front and free(slot):
            return slot
    return None


def newest_written(written: Sequence[int], complete: Callable[[int], bool], front: int) -> int:
    """Which buffer GL draws: the most recently written one whose copy ``complete``d, else the one it
    drew before (``front``; -1 before any copy completed). ``written[slot]`` is the frame number the
    slot holds, -1 for none."""
    for slot in sorted(range(len(written)), key=lambda k: -written[k]):
        if written[slot] < 0:
            break
        if complete(slot):
            return slot
    return front


def request_slot(tags: Sequence[int], done: int, front: int, gl_busy: Sequence[bool], marked: Sequence[int]) -> int:
    """Which buffer a graph-fed ring's next launch writes (-1: none, drop the frame): not the one GL
    draws (``front``), one whose last request ``tags[slot]`` is done (``< done``; -1 for none), and
    of those one GL is known to be finished with, else the one whose end-of-draws mark is oldest
    (``marked``), for the caller to ask GL about."""
    slot = -1
    for k in range(len(tags)):
        if k == front or tags[k] >= done:
            continue
        if not gl_busy[k]:
            return k
        if slot < 0 or marked[k] < marked[slot]:
            slot = k
    return slot


def zero_map_available(context: Any) -> bool:
    """Whether ``context`` (current) can import CUDA memory on this OS."""
    if _platform.IS_WINDOWS:
        return False  # the win32 handle variant is not built yet
    return bool(context.has_extension("GL_EXT_memory_object") and context.has_extension("GL_EXT_memory_object_fd"))


class ImportedBuffer(HandleOwner):
    """``nbytes`` of CUDA memory that is also the storage of a GL buffer (``gl_name``).

    A GL ``HandleOwner`` (``cudapatch._lifecycle``): close it on the thread that made it, with the GL
    context and the CUDA context current. One nobody closed releases its CUDA memory from its
    finalizer and leaves its GL names to the GL context, with a ``ResourceWarning``.

    Args:
        nbytes: Size.
        device: CUDA device ordinal (the GL context must run on the same GPU).
        label: Name for messages.

    Raises:
        InteropError: the GL context lacks ``GL_EXT_memory_object_fd``.
        CudaError: the allocation or export failed.
    """

    _closed_error = InteropError

    def __init__(self, nbytes: int, *, device: int = 0, label: str = "imported buffer") -> None:
        if nbytes <= 0:
            raise InteropError(f"ImportedBuffer: {label}: size must be positive, got {nbytes}")
        try:
            from OpenGL.GL.EXT.memory_object import glCreateMemoryObjectsEXT, glNamedBufferStorageMemEXT
            from OpenGL.GL.EXT.memory_object_fd import GL_HANDLE_TYPE_OPAQUE_FD_EXT, glImportMemoryFdEXT
        except ImportError as exc:
            raise InteropError(f"ImportedBuffer: PyOpenGL lacks GL_EXT_memory_object_fd ({exc})") from exc
        d = driver()
        self.label = label
        self.nbytes = nbytes
        self.ptr = self.gl_name = self._memory = 0
        self._releases = Releases()  # the CUDA side, released newest first: unmap, free the range, release
        prop = d.CUmemAllocationProp()
        prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        prop.requestedHandleTypes = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        gran = check(
            d.cuMemGetAllocationGranularity(
                prop, d.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
            ),
            "cuMemGetAllocationGranularity",
        )
        self.size = -(-nbytes // gran) * gran
        self._handle = check(d.cuMemCreate(self.size, prop, 0), f"cuMemCreate({label})")
        self._releases.push(d.cuMemRelease, self._handle, what="cuMemRelease")
        fd = None
        try:
            ptr = check(d.cuMemAddressReserve(self.size, 0, 0, 0), "cuMemAddressReserve")
            self._releases.push(d.cuMemAddressFree, ptr, self.size, what="cuMemAddressFree")
            check(d.cuMemMap(ptr, self.size, 0, self._handle, 0), "cuMemMap")
            self._releases.push(d.cuMemUnmap, ptr, self.size, what="cuMemUnmap")
            self.ptr = int(ptr)
            access = d.CUmemAccessDesc()
            access.location = prop.location
            access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
            check(d.cuMemSetAccess(self.ptr, self.size, [access], 1), "cuMemSetAccess")
            fd = int(
                check(
                    d.cuMemExportToShareableHandle(
                        self._handle, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0
                    ),
                    "cuMemExportToShareableHandle",
                )
            )
            GL = gl()
            names = (GL.GLuint * 1)()
            glCreateMemoryObjectsEXT(1, names)
            self._memory = int(names[0])
            glImportMemoryFdEXT(self._memory, self.size, GL_HANDLE_TYPE_OPAQUE_FD_EXT, fd)
            fd = None  # GL owns the fd now
            GL.glCreateBuffers(1, names)
            self.gl_name = int(names[0])
            glNamedBufferStorageMemEXT(self.gl_name, nbytes, self._memory, 0)
            check_gl(f"importing {label} into GL")
        except Exception as exc:
            if fd is not None:  # exported but never handed to GL
                os.close(fd)
            self._delete_gl()
            self.ptr = 0
            self._releases.release_quietly()
            if type(exc).__module__.startswith("OpenGL"):  # PyOpenGL's own GLError, when checks are on
                call = getattr(getattr(exc, "baseOperation", None), "__name__", "a GL call")
                code = getattr(exc, "err", None)
                raise InteropError(
                    f"importing {label} into GL failed: {call} raised GL error {hex(code) if code else exc}"
                ) from exc
            raise
        self._arm(
            f"ImportedBuffer {label} ({nbytes} bytes)",
            releases=self._releases,
            context=ContextRef.current(),
            gl_names=True,
        )

    def shares_memory(self) -> bool:
        """Whether GL's GPU-side reads see what CUDA writes: CUDA stores a marker word at both ends,
        GL copies them into a plain buffer of its own on the GPU (as a draw would read them) and
        reads that back, twice, with another marker the second time (the buffer is zeroed after).

        Measured on an H100 with driver 580 (``benchmarks/probes/probe_coherence.py``): GL's GPU reads of
        imported memory (copies, vertex fetch) see every CUDA write, while
        ``glGetBufferSubData`` on the imported buffer itself keeps returning the bytes of its first
        call (a host-side cache), so it cannot tell. Waits for the device; call it at setup only.

        Raises:
            InteropError: the buffer is closed.
            CudaError: a driver call failed.
        """
        self._check_open("ImportedBuffer.shares_memory")
        d = driver()
        GL = gl()
        read = gl_function(
            "glGetNamedBufferSubData", None, ctypes.c_uint, ctypes.c_ssize_t, ctypes.c_ssize_t, ctypes.c_void_p
        )
        copy = gl_function(
            "glCopyNamedBufferSubData", None, ctypes.c_uint, ctypes.c_uint, ctypes.c_ssize_t, ctypes.c_ssize_t,
            ctypes.c_ssize_t,
        )  # fmt: skip
        scratch = (GL.GLuint * 1)()
        GL.glCreateBuffers(1, scratch)
        probe = int(scratch[0])
        GL.glNamedBufferStorage(probe, 4, (ctypes.c_uint32 * 1)(0), GL.GL_DYNAMIC_STORAGE_BIT)
        ends = (0, (self.nbytes // 4 - 1) * 4)
        seen_all = True
        try:
            for marker in (0x5A17C0DE, 0x0DDBA11):
                for off in ends:
                    check(d.cuMemsetD32(self.ptr + off, marker, 1), "cuMemsetD32")
                check(d.cuCtxSynchronize(), "cuCtxSynchronize")
                for off in ends:
                    copy(self.gl_name, probe, off, 0, 4)
                    word = ctypes.c_uint32(0)
                    read(probe, 0, 4, ctypes.addressof(word))
                    seen_all = seen_all and word.value == marker
        finally:
            GL.glDeleteBuffers(1, scratch)
        check(d.cuMemsetD8(self.ptr, 0, self.nbytes), "cuMemsetD8")
        check(d.cuCtxSynchronize(), "cuCtxSynchronize")
        return seen_all

    def _release(self) -> None:
        """Delete the GL buffer and memory object, then free the CUDA memory (``close``)."""
        self._delete_gl()
        self.ptr = 0
        # Errors are not raised: after a GPU fault of the engine's kernels every call on the context
        # fails, and the memory went with it (the preview closes its rings all the same).
        self._releases.release_quietly()

    def _forget(self) -> None:
        self.ptr = self.gl_name = self._memory = 0
        self._releases.forget()

    def _delete_gl(self) -> None:
        """Delete the GL buffer and the memory object (those made so far)."""
        from OpenGL.GL.EXT.memory_object import glDeleteMemoryObjectsEXT

        GL = gl()
        if self.gl_name:
            GL.glDeleteBuffers(1, [self.gl_name])
            self.gl_name = 0
        if self._memory:
            glDeleteMemoryObjectsEXT(1, (GL.GLuint * 1)(self._memory))
            self._memory = 0

    def __repr__(self) -> str:
        return f"<ImportedBuffer {self.label} {self.nbytes} bytes closed={self._closed}>"


class ImportedRing(HandleOwner):
    """Three ``ImportedBuffer``s that CUDA fills and GL draws without mapping or waiting.

    Fed by a graph: ``attach(writer)`` points a ``GlRingWriter`` block at the ring, then
    ``request()`` before each launch picks the buffer that launch writes (no driver call). Fed from
    the host: ``write(src_ptr, nbytes, stream)`` copies into the next free buffer and records its
    event. Either way ``front()`` (GL side, once per frame before drawing) returns the newest fully
    written buffer's GL name and marks the end of the previous frame's draws. A ring is fed one way
    or the other, not both.

    A GL ``HandleOwner`` (``cudapatch._lifecycle``): close it on the GL thread with both contexts
    current; every method raises ``InteropError`` once it is closed.
    """

    _closed_error = InteropError

    def __init__(
        self,
        nbytes: int,
        *,
        device: int = 0,
        label: str = "points",
        slots: int = 3,
    ) -> None:
        d = driver()
        # When GL is done drawing a buffer: a timestamp query written after the draws, one reusable
        # query object per buffer. Measured on the H100 (driver 580): glQueryCounter 1.2 µs and an
        # availability check 1.6 µs, against 4.9 µs to create and delete a fence sync per frame.
        # Called every frame, so plain ctypes entry points (see gl_function).
        uint = ctypes.c_uint
        self._gl_counter = gl_function("glQueryCounter", None, uint, uint)
        self._gl_query = gl_function("glGetQueryObjectuiv", None, uint, uint, ctypes.POINTER(uint))
        self._gl_flush = gl_function("glFlush", None)
        self._available = uint(0)
        self._available_ref = ctypes.byref(self._available)
        self.label = label
        self.buffers: list[ImportedBuffer] = []
        self._events: list[Any] = []
        self._queries: list[int] = []
        self._releases = Releases()  # events, and the control words attach() allocates
        try:
            for i in range(slots):
                self.buffers.append(ImportedBuffer(nbytes, device=device, label=f"{label}[{i}]"))
            flags = d.CUevent_flags.CU_EVENT_DISABLE_TIMING
            for _ in range(slots):
                self._events.append(check(d.cuEventCreate(flags), "cuEventCreate"))
                self._releases.push(d.cuEventDestroy, self._events[-1], what="cuEventDestroy")
            names = (ctypes.c_uint * slots)()
            gl().glGenQueries(slots, names)
            self._queries = list(names)
        except Exception:
            self._release()  # what was made so far; nothing is left for a finalizer
            raise
        # what each slot holds (-1: nothing yet): the frame number (write) or the request tag (graph-fed)
        self._written = [-1] * slots
        self._gl_busy = [False] * slots  # a query written after GL's draws from the slot has not completed
        self._marked = [0] * slots  # the front() call that wrote that query
        self._flushed = [False] * slots  # ... and GL was asked to flush it
        self._fronts = 0  # front() calls
        self._frame = 0
        self._front = -1
        self.nbytes = nbytes
        self.dropped = 0
        self._graph_fed = False  # set by attach(): completion is the writer's done count, not events
        self._ctl_host = self._ctl_dev = self._state = 0
        self._arm(
            f"ImportedRing {label} ({slots} x {nbytes} bytes)",
            releases=self._releases,
            context=ContextRef.current(),
            gl_names=True,
        )

    # -- fed by a graph ------------------------------------------------------------------------------
    def attach(self, writer: Any) -> None:
        """Point ``writer`` (a ``GlRingWriter`` block) at this ring: its slot addresses, the request
        table and the done word (Hot scalar values). From now on call ``request()`` before every
        launch of the graph holding it.

        Raises:
            InteropError: the ring is closed, fed by ``write`` already, or has more than 3 slots.
        """
        self._check_open("attach")
        if len(self.buffers) > 3 or self._frame:
            raise InteropError("attach: a graph feeds rings of at most 3 buffers not written with write()")
        d = driver()
        if not self._graph_fed:
            # Both frees wait for the device, so no launch still writes the ring when they return.
            self._ctl_host, self._ctl_dev = self._releases.mapped_host(8 * (REQUESTS + 1))
            self._requests = (ctypes.c_uint64 * REQUESTS).from_address(self._ctl_host)
            self._done = ctypes.c_uint64.from_address(self._ctl_host + 8 * REQUESTS)
            self._state = int(check(d.cuMemAlloc(16), "cuMemAlloc"))
            self._releases.push(d.cuMemFree, self._state, what="cuMemFree")
            check(d.cuMemsetD32(self._state, 0, 4), "cuMemsetD32")
            self._issued = 0
            self._graph_fed = True
        ctl = self._ctl_dev
        ptrs = [b.ptr for b in self.buffers] + [0] * (3 - len(self.buffers))
        values = {"Capacity": self.nbytes, "Dst0": ptrs[0], "Dst1": ptrs[1], "Dst2": ptrs[2]}
        values.update(State=self._state, Requests=ctl, HostDone=ctl + 8 * REQUESTS)
        for name, value in values.items():
            writer.set(name, value)

    def request(self) -> bool:
        """Ask the graph's next launch to write the next buffer GL and the GPU are done with: one
        word into mapped memory. False (and ``dropped`` + 1) when every other buffer is busy or the
        GPU is a whole request table behind; that launch copies nothing.

        Raises:
            InteropError: the ring is closed (its control words are freed).
        """
        if self._closed:
            self._check_open("request")
        done, issued, tags = self._done.value, self._issued, self._written
        if issued - done >= REQUESTS - 1:
            self.dropped += 1
            return False
        slot = request_slot(tags, done, self._front, self._gl_busy, self._marked)
        if slot < 0 or (self._gl_busy[slot] and not self._gl_done(slot)):  # the one GL call a request may make
            self.dropped += 1
            return False
        self._requests[issued % REQUESTS] = (issued << 2) | slot
        tags[slot] = issued
        self._issued = issued + 1
        return True

    def _newest_done(self) -> int:
        done, best, best_tag = self._done.value, self._front, -1
        for slot, tag in enumerate(self._written):
            if best_tag < tag < done:
                best, best_tag = slot, tag
        return best

    def _gl_done(self, slot: int) -> bool:
        if not self._gl_busy[slot]:
            return True
        self._gl_query(self._queries[slot], _GL_QUERY_RESULT_AVAILABLE, self._available_ref)  # never waits
        if self._available.value:
            self._gl_busy[slot] = False
            return True
        # A context that is never flushed (no swap) never completes the query (measured: slots stayed
        # busy for 100 frames): flush once, when the mark is a frame old (a swap flushes sooner).
        if not self._flushed[slot] and self._fronts - self._marked[slot] >= 2:
            self._gl_flush()
            self._flushed[slot] = True
        return False

    def _cuda_done(self, slot: int) -> bool:
        # Re-recording an event that has not completed would hide the earlier completion from
        # front(): when the GPU is that far behind, drop this frame's copy instead.
        if self._written[slot] < 0:
            return True
        d = driver()
        return d.cuEventQuery(self._events[slot])[0] == d.CUresult.CUDA_SUCCESS

    def write(self, src_ptr: int, nbytes: int, stream: Any) -> bool:
        """Copy ``nbytes`` from device memory into the next free buffer on ``stream``; False (and
        ``dropped`` + 1) when every other buffer is still being read by GL or written by CUDA.

        Raises:
            InteropError: the ring is closed, or fed by a graph.
            CudaError: the copy or the event record failed.
        """
        self._check_open("write")
        if self._graph_fed:
            raise InteropError("write: this ring is fed by a graph (attach); it cannot be written from the host too")
        d = driver()
        slot = next_write_slot(
            self._frame, len(self.buffers), self._front, lambda k: self._gl_done(k) and self._cuda_done(k)
        )
        if slot is None:
            self.dropped += 1
            return False
        check(d.cuMemcpyDtoDAsync(self.buffers[slot].ptr, src_ptr, min(nbytes, self.nbytes), stream), "copy")
        check(d.cuEventRecord(self._events[slot], stream), "cuEventRecord")
        self._frame += 1
        self._written[slot] = self._frame
        return True

    def front(self) -> int | None:
        """GL name of the newest completely written buffer, for this frame's draw; None
        before the first copy completes. Call it once per frame before drawing: it also marks the
        end of the draws from the buffer returned by the previous call (a timestamp query after the
        GL commands issued since), which CUDA then leaves alone until GL has executed them. The
        buffer returned stays untouched by CUDA until the next call.

        Raises:
            InteropError: the ring is closed.
        """
        if self._closed:
            self._check_open("front")
        prev = self._front
        self._fronts += 1
        if prev >= 0:  # the draws of the previous frame(s) from ``prev``: mark where they end
            self._gl_counter(self._queries[prev], _GL_TIMESTAMP)
            self._gl_busy[prev], self._flushed[prev], self._marked[prev] = True, False, self._fronts
        if self._graph_fed:
            best = self._newest_done()
        else:
            d = driver()
            ok = d.CUresult.CUDA_SUCCESS
            best = newest_written(self._written, lambda k: d.cuEventQuery(self._events[k])[0] == ok, prev)
        if best < 0:
            return None
        self._front = best
        return self.buffers[best].gl_name

    def shares_memory(self) -> bool:
        """Whether GL's GPU-side reads see what CUDA writes into every buffer of the ring (see
        ``ImportedBuffer.shares_memory``; waits for the device: call it at setup only).

        Raises:
            InteropError: the ring is closed.
            CudaError: a driver call failed.
        """
        self._check_open("shares_memory")
        return all(b.shares_memory() for b in self.buffers)

    @property
    def front_slot(self) -> int:
        """The slot the last ``front()`` returned (-1: none yet)."""
        return self._front

    @property
    def front_version(self) -> int:
        """Which copy the front slot holds (its frame number or request tag; -1: none): it changes
        exactly when ``front()`` returns a newer copy."""
        return self._written[self._front] if self._front >= 0 else -1

    def _release(self) -> None:
        """Delete the queries, then release events, control words and buffers (``close``)."""
        if self._queries:
            gl().glDeleteQueries(len(self._queries), (ctypes.c_uint * len(self._queries))(*self._queries))
            self._queries = []
        # Errors are not raised (as ImportedBuffer's): after a GPU fault every call fails.
        self._releases.release_quietly()
        self._ctl_host = self._ctl_dev = self._state = 0
        for b in self.buffers:
            b.close()

    def _forget(self) -> None:
        self._queries = []
        self._releases.forget()
        self._ctl_host = self._ctl_dev = self._state = 0
        for b in self.buffers:
            b.abandon()

    def __repr__(self) -> str:
        return f"<ImportedRing {self.label} {len(self.buffers)} x {self.nbytes} bytes closed={self._closed}>"


# One thread per texel: the ring buffer's words (RGBA8, rows of ``width``) stored into the texture.
_IMAGE_COPY_CS = """#version 430
layout(local_size_x = 16, local_size_y = 16) in;
layout(std430, binding = 0) readonly buffer Texels { uint texels[]; };
layout(rgba8, binding = 0) writeonly uniform image2D image;
uniform int width;
void main() {
    ivec2 p = ivec2(gl_GlobalInvocationID.xy);
    if (p.x >= width || p.y >= imageSize(image).y) return;
    imageStore(image, p, unpackUnorm4x8(texels[p.y * width + p.x]));
}
"""
_GL_COMPUTE_SHADER, _GL_SHADER_STORAGE_BUFFER, _GL_WRITE_ONLY, _GL_RGBA8 = 0x91B9, 0x90D2, 0x88B9, 0x8058
_GL_TEXTURE_BARRIERS = 0x00000008 | 0x00000100  # texture fetch | texture update


class ImportedImage(HandleOwner):
    """An RGBA8 GL texture fed through an ``ImportedRing``: CUDA writes linear rows (top row first)
    into the ring's buffers, nothing mapped; ``front()`` has GL copy the newest complete buffer
    into the texture when it is newer than the last one, by a compute shader (GPU work that GL
    orders itself), and returns the texture.

    Measured for 4K on the H100 (driver 580): the compute copy takes 37 µs of GPU time, 1.4x a CUDA
    device-to-device copy of the same bytes; GL's own copy paths crawl there (a pixel-unpack upload
    640-660 µs in any format, ``glCopyBufferSubData`` 375 µs). The texels cannot be CUDA's memory
    itself: driver 580 refuses linear tiling for textures on imported memory (``GL_INVALID_VALUE``
    from ``glTexParameteri(GL_TEXTURE_TILING_EXT)``).

    A GL ``HandleOwner`` (``cudapatch._lifecycle``) holding its ring: ``close()`` on the GL thread
    releases both.

    Raises:
        InteropError: no ``GL_EXT_memory_object_fd``, no compute shaders (GL < 4.3), GL does not see
            CUDA's writes into imported memory, or a bad size.
        CudaError: the allocation or export failed.
    """

    _closed_error = InteropError

    def __init__(self, width: int, height: int, *, device: int = 0, label: str = "image") -> None:
        if width <= 0 or height <= 0:
            raise InteropError(f"ImportedImage: {label}: size must be positive, got {width}x{height}")
        from .render import compile_program

        self.width, self.height, self.label = width, height, label
        self.gl_name = self._program = 0
        self.ring = ImportedRing(width * height * 4, device=device, label=label)
        try:
            if not self.ring.shares_memory():
                raise InteropError(f"ImportedImage: {label}: GL does not see what CUDA writes into imported buffers")
            self._program = compile_program(((_GL_COMPUTE_SHADER, _IMAGE_COPY_CS),), f"{label} copy")
            GL = gl()
            self.gl_name = int(GL.glGenTextures(1))
            GL.glBindTexture(GL.GL_TEXTURE_2D, self.gl_name)
            GL.glTexStorage2D(GL.GL_TEXTURE_2D, 1, GL.GL_RGBA8, width, height)
            GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_LINEAR)
            GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_LINEAR)
            GL.glBindTexture(GL.GL_TEXTURE_2D, 0)
            check_gl(f"creating the texture of {label} ({width}x{height} RGBA8)")
            self._width_at = int(GL.glGetUniformLocation(self._program, "width"))
            uint, sint = ctypes.c_uint, ctypes.c_int
            # Called every frame a new copy arrives: plain ctypes entry points (see gl_function).
            self._use = gl_function("glUseProgram", None, uint)
            self._uniform = gl_function("glProgramUniform1i", None, uint, sint, sint)
            self._bind_buffer = gl_function("glBindBufferBase", None, uint, uint, uint)
            self._bind_image = gl_function(
                "glBindImageTexture", None, uint, uint, sint, ctypes.c_ubyte, sint, uint, uint
            )
            self._dispatch = gl_function("glDispatchCompute", None, uint, uint, uint)
            self._barrier = gl_function("glMemoryBarrier", None, uint)
        except Exception:
            self.close()  # the ring too: nothing is left for a finalizer
            raise
        self._uniform(self._program, self._width_at, width)
        self._groups = (-(-width // 16), -(-height // 16))
        self._shown = (-1, -1)  # (slot, version) last copied
        self.uploads = 0
        self._arm(f"ImportedImage {label} {width}x{height}", gl_names=True)

    def front(self) -> int | None:
        """The texture, holding the newest complete copy (None before the first); call it once per
        frame before drawing, as ``ImportedRing.front``. Leaves no program, storage buffer or image
        unit bound.

        Raises:
            InteropError: the image is closed.
        """
        if self._closed:
            self._check_open("front")
        name = self.ring.front()
        if name is None:
            return None
        key = (self.ring.front_slot, self.ring.front_version)
        if key != self._shown:
            self._use(self._program)
            self._bind_buffer(_GL_SHADER_STORAGE_BUFFER, 0, name)
            self._bind_image(0, self.gl_name, 0, 0, 0, _GL_WRITE_ONLY, _GL_RGBA8)
            self._dispatch(self._groups[0], self._groups[1], 1)
            self._barrier(_GL_TEXTURE_BARRIERS)  # the draw samples what the shader stored
            self._bind_image(0, 0, 0, 0, 0, _GL_WRITE_ONLY, _GL_RGBA8)
            self._bind_buffer(_GL_SHADER_STORAGE_BUFFER, 0, 0)
            self._use(0)
            self._shown = key
            self.uploads += 1
        return self.gl_name

    def _release(self) -> None:
        """Delete the texture and the copy program, then close the ring (``close``)."""
        GL = gl()
        if self.gl_name:
            GL.glDeleteTextures(1, [self.gl_name])
            self.gl_name = 0
        if self._program:
            GL.glDeleteProgram(self._program)
            self._program = 0
        self.ring.close()

    def _forget(self) -> None:
        self.gl_name = self._program = 0
        self.ring.abandon()

    def __repr__(self) -> str:
        return f"<ImportedImage {self.label} {self.width}x{self.height} closed={self.is_closed}>"
