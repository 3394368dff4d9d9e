"""GL buffers and textures shared with CUDA through register/map.

``SharedBuffer`` / ``SharedTexture2D`` register a GL object with CUDA once
(``cuGraphicsGLRegisterBuffer`` / ``cuGraphicsGLRegisterImage``). ``map(stream=...)`` returns a
mapping usable as a context manager: a device pointer for buffers, a CUDA array for textures.
``ResourceGroup`` maps all of a frame's resources with **one** ``cuGraphicsMapResources`` call
and unmaps them with one ``cuGraphicsUnmapResources``, both on the engine's stream: no
``glFinish`` and no stream synchronize. The unmap orders later GL commands after the stream's
work, and the map orders the stream after earlier GL commands.

Both the GL context and the CUDA context must be current on the calling thread.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any, Literal

from .._lifecycle import ContextRef, HandleOwner, Releases
from ..errors import InteropError
from ..kernels._driver import check, driver
from ._gl import check_gl, gl
from .formats import TEXTURE_FORMATS

__all__ = ["RegisterFlags", "SharedBuffer", "SharedTexture2D", "BufferMapping", "TextureMapping", "ResourceGroup"]

log = logging.getLogger("cudapatch.interop")

RegisterFlags = Literal["none", "read_only", "write_discard", "surface_ldst"]
_FLAG_NAMES = {
    "none": "CU_GRAPHICS_REGISTER_FLAGS_NONE",
    "read_only": "CU_GRAPHICS_REGISTER_FLAGS_READ_ONLY",
    "write_discard": "CU_GRAPHICS_REGISTER_FLAGS_WRITE_DISCARD",
    "surface_ldst": "CU_GRAPHICS_REGISTER_FLAGS_SURFACE_LDST",
}
# Texture formats: GL internal format -> (name, bytes per texel, GL format, GL type) (see formats.py)
_TEXTURE_FORMATS = {f.internal: (f.name, f.texel_bytes, f.gl_format, f.gl_type) for f in TEXTURE_FORMATS.values()}
_SINGLE_CHANNEL = {f.internal for f in TEXTURE_FORMATS.values() if f.channels == 1}
_SWIZZLE_G, _SWIZZLE_B = 0x8E43, 0x8E44  # GL_TEXTURE_SWIZZLE_G/B
_FORMAT_BY_NAME = {v[0]: k for k, v in _TEXTURE_FORMATS.items()}


def _register_flags(flags: str, what: str) -> int:
    name = _FLAG_NAMES.get(flags)
    if name is None:
        raise InteropError(f"{what}: unknown register flags '{flags}' (use one of {', '.join(_FLAG_NAMES)})")
    return int(getattr(driver().CUgraphicsRegisterFlags, name))


class _SharedResource(HandleOwner):
    """Common lifecycle (``cudapatch._lifecycle``): the registration, mapped state, idempotent close,
    GL name ownership. One nobody closed is unregistered by its finalizer inside its CUDA context
    while that lives (``cuGraphicsUnregisterResource`` makes no GL call), with a ``ResourceWarning``;
    a GL object this class created (``create``) is deleted only by ``close()``, on the thread that
    made it, so an unclosed one leaks its GL name until its GL context is destroyed."""

    kind = "resource"
    _closed_error = InteropError

    def __init__(self, gl_name: int, handle: Any, *, owns_gl: bool, label: str) -> None:
        self.gl_name = int(gl_name)
        self._handle = handle
        self._owns_gl = False
        self.label = label
        self._mapped = False
        self._closed = False
        self._releases = Releases()
        self._releases.push(
            driver().cuGraphicsUnregisterResource, handle, what=f"cuGraphicsUnregisterResource({label})"
        )
        self._arm(f"{type(self).__name__} {label}", releases=self._releases, context=ContextRef.current())
        if owns_gl:
            self._own_gl_name()

    def _own_gl_name(self) -> None:
        """This object made its GL object (``create``): ``close()`` deletes it, on this thread only."""
        self._owns_gl = True
        self._disarm()
        self._arm(
            f"{type(self).__name__} {self.label}",
            releases=self._releases,
            context=ContextRef.current(),
            gl_names=True,
        )

    @property
    def handle(self) -> Any:
        """The ``CUgraphicsResource`` (read-only)."""
        self._check_open("handle")
        return self._handle

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def is_mapped(self) -> bool:
        return self._mapped

    def _check_open(self, what: str) -> None:
        if self._closed:
            raise InteropError(f"{what}: {self.label} is closed")

    def _check_map(self) -> None:
        self._check_open("map")
        if self._mapped:
            raise InteropError(f"map: {self.label} is already mapped; unmap it first")

    def map(self, *, stream: Any) -> Any:
        """Map for CUDA on ``stream``; the result is a context manager that unmaps on exit.

        Raises:
            InteropError: already mapped, or closed.
            CudaError: the driver refused.
        """
        self._check_map()
        check(driver().cuGraphicsMapResources(1, self._handle, stream), f"cuGraphicsMapResources({self.label})")
        self._mapped = True
        return self._mapping(stream)

    def _mapping(self, stream: Any) -> Any:
        raise NotImplementedError

    def _unmap(self, stream: Any) -> None:
        if not self._mapped:
            raise InteropError(f"unmap: {self.label} is not mapped")
        self._mapped = False
        check(driver().cuGraphicsUnmapResources(1, self._handle, stream), f"cuGraphicsUnmapResources({self.label})")

    def close(self) -> None:
        """Unregister from CUDA and, if this object created the GL object, delete it (idempotent).
        Call it with the CUDA context current and, for an object ``create`` made, on the thread that
        owns the GL context, with that context current.

        Raises:
            InteropError: an object ``create`` made, closed from another thread (it stays open).
            CudaError: cuGraphicsUnregisterResource failed (the object is closed all the same).
        """
        HandleOwner.close(self)

    def _release(self) -> None:
        try:
            self._releases.release()
        finally:
            if self._owns_gl:
                self._delete_gl()

    def _delete_gl(self) -> None:
        raise NotImplementedError


class _Mapping:
    """What both mapping kinds share: unmap on the stream they were mapped on, and a context manager
    that unmaps on exit (if still mapped)."""

    resource: Any
    _stream: Any

    def unmap(self) -> None:
        """Unmap on the stream it was mapped on.

        Raises:
            InteropError: not mapped.
        """
        self.resource._unmap(self._stream)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.resource.is_mapped:
            self.unmap()


class BufferMapping(_Mapping):
    """A mapped ``SharedBuffer``: ``ptr`` and ``nbytes``, valid until unmapped.

    Exposes ``__cuda_array_interface__`` (bytes, or ``dtype``/``shape`` given to ``as_array``)."""

    def __init__(self, resource: SharedBuffer, stream: Any, ptr: int, nbytes: int) -> None:
        self.resource = resource
        self._stream = stream
        self.ptr = ptr
        self.nbytes = nbytes

    def as_array(self, dtype: str, shape: tuple[int, ...] | None = None) -> Any:
        """A CuPy array viewing the mapped memory (valid until unmap)."""
        import cupy
        import numpy as np

        dt = np.dtype(dtype)
        shape = shape if shape is not None else (self.nbytes // dt.itemsize,)
        mem = cupy.cuda.UnownedMemory(self.ptr, self.nbytes, self)
        return cupy.ndarray(shape, dt, cupy.cuda.MemoryPointer(mem, 0))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3, "strides": None}


class SharedBuffer(_SharedResource):
    """A GL buffer object registered with CUDA.

    Use ``from_gl_buffer`` for a buffer GL code made, or ``create`` to make one here too.
    """

    kind = "buffer"

    @classmethod
    def from_gl_buffer(cls, name: int, *, flags: RegisterFlags = "none", label: str | None = None) -> SharedBuffer:
        """Register the existing GL buffer ``name`` (its storage must be allocated).

        Raises:
            InteropError: ``name`` is not a buffer with storage, or bad flags.
            CudaError: registration failed (no CUDA context, GL on another device).
        """
        GL = gl()
        label = label or f"GL buffer {name}"
        if not GL.glIsBuffer(name):
            raise InteropError(f"from_gl_buffer: {label} is not a GL buffer object")
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, name)
        size = int(GL.glGetBufferParameteriv(GL.GL_ARRAY_BUFFER, GL.GL_BUFFER_SIZE))
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
        if size <= 0:
            raise InteropError(f"from_gl_buffer: {label} has no storage (call glBufferData first)")
        handle = check(
            driver().cuGraphicsGLRegisterBuffer(name, _register_flags(flags, label)),
            f"cuGraphicsGLRegisterBuffer({label})",
        )
        obj = cls(name, handle, owns_gl=False, label=label)
        obj.nbytes = size
        return obj

    @classmethod
    def create(cls, nbytes: int, *, flags: RegisterFlags = "none", label: str = "shared buffer") -> SharedBuffer:
        """Create a GL buffer of ``nbytes`` (zeroed) and register it; ``close()`` deletes it.

        Raises:
            InteropError: ``nbytes`` not positive or GL refused.
            CudaError: registration failed.
        """
        if nbytes <= 0:
            raise InteropError(f"SharedBuffer.create: {label}: size must be positive, got {nbytes}")
        GL = gl()
        name = int(GL.glGenBuffers(1))
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, name)
        GL.glBufferData(GL.GL_ARRAY_BUFFER, nbytes, None, GL.GL_DYNAMIC_DRAW)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
        check_gl(f"creating {label} ({nbytes} bytes)")
        try:
            obj = cls.from_gl_buffer(name, flags=flags, label=f"{label} (GL buffer {name})")
        except Exception:
            GL.glDeleteBuffers(1, [name])
            raise
        obj._own_gl_name()
        return obj

    def _mapping(self, stream: Any) -> BufferMapping:
        ptr, size = check(
            driver().cuGraphicsResourceGetMappedPointer(self._handle), "cuGraphicsResourceGetMappedPointer"
        )
        return BufferMapping(self, stream, int(ptr), int(size))

    def _delete_gl(self) -> None:
        gl().glDeleteBuffers(1, [self.gl_name])

    def __repr__(self) -> str:
        size = getattr(self, "nbytes", 0)
        return f"<SharedBuffer {self.label} {size} bytes mapped={self._mapped} closed={self._closed}>"


class TextureMapping(_Mapping):
    """A mapped ``SharedTexture2D``: ``array`` is the ``CUarray`` of level 0, valid until unmapped."""

    def __init__(self, resource: SharedTexture2D, stream: Any, array: Any) -> None:
        self.resource = resource
        self._stream = stream
        self.array = array

    def copy_from(self, ptr: int, *, pitch: int | None = None, stream: Any = None) -> None:
        """Copy a linear image (rows of ``width * texel`` bytes, ``pitch`` apart) into the texture.

        Raises:
            CudaError: the copy failed.
        """
        self.resource._copy_into(self.array, ptr, pitch, stream if stream is not None else self._stream)

    def copy_to(self, ptr: int, *, pitch: int | None = None, stream: Any = None) -> None:
        """Copy the texture into a linear image at device address ``ptr`` (rows ``pitch`` apart).

        Raises:
            CudaError: the copy failed.
        """
        self.resource._copy_out(self.array, ptr, pitch, stream if stream is not None else self._stream)


class SharedTexture2D(_SharedResource):
    """A GL 2-D texture registered with CUDA (formats rgba8, rgba32f, r32f)."""

    kind = "texture"

    @classmethod
    def from_gl_texture(cls, name: int, *, flags: RegisterFlags = "none", label: str | None = None) -> SharedTexture2D:
        """Register the existing 2-D texture ``name``.

        Raises:
            InteropError: not a texture, unsupported internal format, or bad flags.
            CudaError: registration failed.
        """
        GL = gl()
        label = label or f"GL texture {name}"
        if not GL.glIsTexture(name):
            raise InteropError(f"from_gl_texture: {label} is not a GL texture object")
        GL.glBindTexture(GL.GL_TEXTURE_2D, name)
        w = int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, 0, GL.GL_TEXTURE_WIDTH))
        h = int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, 0, GL.GL_TEXTURE_HEIGHT))
        fmt = int(GL.glGetTexLevelParameteriv(GL.GL_TEXTURE_2D, 0, GL.GL_TEXTURE_INTERNAL_FORMAT))
        GL.glBindTexture(GL.GL_TEXTURE_2D, 0)
        if fmt not in _TEXTURE_FORMATS:
            names = ", ".join(v[0] for v in _TEXTURE_FORMATS.values())
            raise InteropError(f"from_gl_texture: {label} has internal format 0x{fmt:x}; supported: {names}")
        if w <= 0 or h <= 0:
            raise InteropError(f"from_gl_texture: {label} has no storage for level 0")
        handle = check(
            driver().cuGraphicsGLRegisterImage(name, GL.GL_TEXTURE_2D, _register_flags(flags, label)),
            f"cuGraphicsGLRegisterImage({label})",
        )
        obj = cls(name, handle, owns_gl=False, label=label)
        obj.width, obj.height = w, h
        obj.format, obj.texel_bytes = _TEXTURE_FORMATS[fmt][0], _TEXTURE_FORMATS[fmt][1]
        obj._copy = obj._copy_back = None
        obj.flags = flags
        obj._writer = None
        if flags == "surface_ldst" and obj.texel_bytes in (4, 16):
            from .surface import SurfaceWriter

            try:  # now, not in a frame: the first writer in a process compiles its kernel (~30 ms)
                obj._writer = SurfaceWriter(w, h, obj.texel_bytes)
            except Exception:
                obj.close()  # unregisters; the GL texture stays with whoever made it
                raise
        return obj

    @classmethod
    def create(
        cls, width: int, height: int, *, format: str = "rgba8", flags: RegisterFlags = "none", label: str = "texture"
    ) -> SharedTexture2D:  # noqa: A002 - "format" is the word GL users expect
        """Create a ``width`` x ``height`` texture of ``format`` and register it; ``close()`` deletes it.

        Raises:
            InteropError: bad size or format.
            CudaError: registration failed.
        """
        if format not in _FORMAT_BY_NAME:
            raise InteropError(
                f"SharedTexture2D.create: {label}: unknown format '{format}' ({', '.join(_FORMAT_BY_NAME)})"
            )
        if width <= 0 or height <= 0:
            raise InteropError(f"SharedTexture2D.create: {label}: size must be positive, got {width}x{height}")
        GL = gl()
        internal = _FORMAT_BY_NAME[format]
        _, _, gl_format, gl_type = _TEXTURE_FORMATS[internal]
        name = int(GL.glGenTextures(1))
        GL.glBindTexture(GL.GL_TEXTURE_2D, name)
        GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, internal, width, height, 0, gl_format, gl_type, None)
        GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_LINEAR)
        GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_LINEAR)
        if internal in _SINGLE_CHANNEL:  # shown grey: red into green and blue
            GL.glTexParameteri(GL.GL_TEXTURE_2D, _SWIZZLE_G, GL.GL_RED)
            GL.glTexParameteri(GL.GL_TEXTURE_2D, _SWIZZLE_B, GL.GL_RED)
        GL.glBindTexture(GL.GL_TEXTURE_2D, 0)
        check_gl(f"creating {label} ({width}x{height} {format})")
        try:
            obj = cls.from_gl_texture(name, flags=flags, label=f"{label} (GL texture {name})")
        except Exception:
            GL.glDeleteTextures(1, [name])
            raise
        obj._own_gl_name()
        return obj

    def _mapping(self, stream: Any) -> TextureMapping:
        array = check(
            driver().cuGraphicsSubResourceGetMappedArray(self._handle, 0, 0), "cuGraphicsSubResourceGetMappedArray"
        )
        return TextureMapping(self, stream, array)

    @property
    def surface_writable(self) -> bool:
        """Whether surface stores can write it (registered ``surface_ldst``, 4- or 16-byte texels)."""
        return self._writer is not None

    def surface_object(self, array: Any) -> int:
        """The ``CUsurfObject`` of ``array`` (this texture's mapped level 0), made once per array and
        destroyed with the texture.

        Raises:
            InteropError: the texture is not surface-writable (see ``surface_writable``).
        """
        if self._writer is None:
            raise InteropError(f"surface_object: {self.label} is not registered with surface_ldst (4/16-byte texels)")
        return self._writer._surface(array)

    def _copy_into(self, array: Any, ptr: int, pitch: int | None, stream: Any) -> None:
        row = self.width * self.texel_bytes
        if self._writer is not None and (pitch or row) % self.texel_bytes == 0:
            # Surface stores: 2.4x faster than the copy engine into the array (see interop/surface.py).
            self._writer.write(array, ptr, (pitch or row) // self.texel_bytes, stream)
            return
        c = self._copy2d(into=True)
        c.srcDevice, c.srcPitch, c.dstArray = ptr, pitch or row, array
        check(driver().cuMemcpy2DAsync(c, stream), f"cuMemcpy2DAsync into {self.label}")

    def _copy_out(self, array: Any, ptr: int, pitch: int | None, stream: Any) -> None:
        c = self._copy2d(into=False)
        c.srcArray, c.dstDevice, c.dstPitch = array, ptr, pitch or self.width * self.texel_bytes
        check(driver().cuMemcpy2DAsync(c, stream), f"cuMemcpy2DAsync out of {self.label}")

    def _copy2d(self, *, into: bool) -> Any:
        """The copy descriptor into (or out of) the texture's array, built once per direction: only the
        pointers change per frame, and the struct costs ~10 µs to build."""
        c = self._copy if into else self._copy_back
        if c is None:
            d = driver()
            c = d.CUDA_MEMCPY2D()
            linear, array = d.CUmemorytype.CU_MEMORYTYPE_DEVICE, d.CUmemorytype.CU_MEMORYTYPE_ARRAY
            c.srcMemoryType, c.dstMemoryType = (linear, array) if into else (array, linear)
            c.WidthInBytes = self.width * self.texel_bytes
            c.Height = self.height
            if into:
                self._copy = c
            else:
                self._copy_back = c
        return c

    def close(self) -> None:
        """Release the surface writer (if any), unregister, and delete the GL texture if this object
        created it (idempotent); on the GL thread, with the context current.

        Raises:
            InteropError: a texture ``create`` made, closed from another thread (it stays open).
            CudaError: a release call failed (the texture is closed all the same).
        """
        HandleOwner.close(self)

    def _release(self) -> None:
        writer, self._writer = getattr(self, "_writer", None), None
        try:
            if writer is not None:
                writer.close()
        finally:
            super()._release()

    def _forget(self) -> None:
        writer, self._writer = getattr(self, "_writer", None), None
        if writer is not None:
            writer.abandon()
        super()._forget()

    def _delete_gl(self) -> None:
        gl().glDeleteTextures(1, [self.gl_name])

    def __repr__(self) -> str:
        size = f"{getattr(self, 'width', 0)}x{getattr(self, 'height', 0)}"
        return f"<SharedTexture2D {self.label} {size} mapped={self._mapped} closed={self._closed}>"


class ResourceGroup:
    """Several shared resources mapped and unmapped together, one driver call each.

    ``map(stream=...)`` maps all and returns the group; ``pointer(buffer)`` / ``array(texture)``
    then give each resource's mapping. ``unmap()`` unmaps all. Use it as a context manager per frame.
    """

    def __init__(self, resources: list[_SharedResource] | tuple[_SharedResource, ...]) -> None:
        self.resources = tuple(resources)
        if len({id(r) for r in self.resources}) != len(self.resources):
            raise InteropError("ResourceGroup: a resource is listed twice")
        # cuda-bindings takes several resources as the address of a C array of handles.
        self._handles = (ctypes.c_void_p * len(self.resources))(*[int(r.handle) for r in self.resources])
        self._address = ctypes.addressof(self._handles)
        self._stream: Any = None

    def map(self, *, stream: Any) -> ResourceGroup:
        """Map every resource in one ``cuGraphicsMapResources`` call on ``stream``.

        Raises:
            InteropError: a resource is closed or already mapped.
            CudaError: the driver refused.
        """
        for r in self.resources:
            r._check_map()
        check(driver().cuGraphicsMapResources(len(self._handles), self._address, stream), "cuGraphicsMapResources")
        for r in self.resources:
            r._mapped = True
        self._stream = stream
        return self

    def pointer(self, buffer: SharedBuffer) -> int:
        """The device pointer of a mapped buffer of this group."""
        if not buffer._mapped:
            raise InteropError(f"pointer: {buffer.label} is not mapped")
        ptr, _ = check(
            driver().cuGraphicsResourceGetMappedPointer(buffer._handle), "cuGraphicsResourceGetMappedPointer"
        )
        return int(ptr)

    def array(self, texture: SharedTexture2D) -> Any:
        """The ``CUarray`` of a mapped texture of this group (level 0)."""
        if not texture._mapped:
            raise InteropError(f"array: {texture.label} is not mapped")
        return check(
            driver().cuGraphicsSubResourceGetMappedArray(texture._handle, 0, 0), "cuGraphicsSubResourceGetMappedArray"
        )

    def mapping(self, resource: _SharedResource) -> Any:
        """A ``BufferMapping`` / ``TextureMapping`` view of a mapped resource of this group."""
        if not resource._mapped:
            raise InteropError(f"mapping: {resource.label} is not mapped")
        return resource._mapping(self._stream)

    def unmap(self) -> None:
        """Unmap every resource in one call on the stream they were mapped on."""
        if not any(r._mapped for r in self.resources):
            raise InteropError("unmap: the resource group is not mapped")
        for r in self.resources:
            r._mapped = False
        check(
            driver().cuGraphicsUnmapResources(len(self._handles), self._address, self._stream),
            "cuGraphicsUnmapResources",
        )

    def __enter__(self) -> ResourceGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        if any(r._mapped for r in self.resources):
            self.unmap()

    def __repr__(self) -> str:
        return f"<ResourceGroup {len(self.resources)} resources>"
