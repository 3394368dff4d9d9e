"""The lifecycle protocol (``cudapatch._lifecycle``) over every owner that can be built without a GPU.

The owners run against a recording double of the CUDA driver and of GL: every handle the driver
or GL hands out is tracked, so a test can say that ``close()`` gave each back exactly once, that
``abandon()`` and a GL owner's finalizer made no call at all, and that a forgotten owner's
finalizer released its driver handles inside its context and warned. (The GPU and GL suites run
the same rules on the real driver: ``tests/gpu/test_lifecycle_gpu.py``, ``tests/gl/test_lifecycle_gl.py``.)
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from cudapatch import _lifecycle
from cudapatch._lifecycle import ContextRef, HandleOwner, Lifecycle, Releases, note_context_reset
from cudapatch.errors import CudaError, CudapatchError, InteropError
from cudapatch.kernels import _driver


# -- the doubles -----------------------------------------------------------------------------------
class _Names:
    """Any attribute is its own name: stands in for the driver's enums (``CUresult`` aside)."""

    def __getattr__(self, name: str) -> str:
        return name


class _Struct:
    """A driver struct: any attribute can be set; a nested one is made on first read."""

    def __getattr__(self, name: str) -> Any:
        child = _Struct()
        setattr(self, name, child)
        return child


class _Member(int):
    """An enum member of cuda-bindings: an int with ``.value``."""

    @property
    def value(self) -> int:
        return int(self)


class _Values:
    """An enum whose members are ints (flags the owners pass on as numbers): every member is 0."""

    def __getattr__(self, name: str) -> _Member:
        return _Member(0)


_ATTRIBUTES = {  # cuDeviceGetAttribute of an H100
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 9,
    "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 0,
    "CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT": 132,
    "CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR": 2048,
}

_ENUMS = (
    "CUdevice_attribute",
    "CUmemAllocationType",
    "CUmemLocationType",
    "CUmemAllocationHandleType",
    "CUmemAllocationGranularity_flags",
    "CUmemAccess_flags",
    "CUevent_flags",
    "CUresourcetype",
)


class FakeDriver:
    """What the owners call of ``cuda.bindings.driver``. Every handle it returns is live until the
    matching release; ``live`` holds them, ``calls`` every driver function looked up (so a call
    shows there, and so does a release remembered for later), ``pushed`` the contexts
    pushed current now, ``released_pushed`` the releases made while one was."""

    class CUresult:
        CUDA_SUCCESS = 0
        CUDA_ERROR_OUT_OF_MEMORY = 2
        CUDA_ERROR_NO_DEVICE = 100

    CUstream_flags = CUgraphicsRegisterFlags = _Values()

    def __init__(self) -> None:
        self.live: dict[int, str] = {}
        self.calls: list[str] = []
        self.pushed = 0
        self.released_pushed = 0
        self.ctx, self.ctx_id = 0xC0, 7
        self._next = 0x10000
        self._host: list[Any] = []  # pinned memory stand-ins: real bytes, kept for the test's life
        for enum in _ENUMS:
            setattr(self, enum, _Names())

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("cu"):
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)

    # structs
    CUmemAllocationProp = CUmemAccessDesc = CUDA_RESOURCE_DESC = _Struct

    def _make(self, kind: str, handle: int | None = None) -> tuple[int, int]:
        if handle is None:
            self._next += 0x100
            handle = self._next
        self.live[handle] = kind
        return 0, handle

    def _drop(self, kind: str, handle: Any) -> tuple[int]:
        assert self.live.pop(int(handle)) == kind, f"{kind} {handle} released twice or never made"
        self.released_pushed += self.pushed > 0
        return (0,)

    # the device and its primary context (each retain is a live handle until released)
    def cuInit(self, flags: int) -> tuple[int]:
        return (0,)

    def cuDeviceGetCount(self) -> tuple[int, int]:
        return 0, 1

    def cuDeviceGet(self, ordinal: int) -> tuple[int, int]:
        return 0, ordinal

    def cuDeviceGetName(self, n: int, device: int) -> tuple[int, bytes]:
        return 0, b"Fake H100".ljust(n, b"\0")

    def cuDeviceGetAttribute(self, attr: str, device: int) -> tuple[int, int]:
        return 0, _ATTRIBUTES[attr]

    def cuDeviceTotalMem(self, device: int) -> tuple[int, int]:
        return 0, 80 << 30

    def cuDriverGetVersion(self) -> tuple[int, int]:
        return 0, 13000

    def cuDevicePrimaryCtxRetain(self, device: int) -> tuple[int, int]:
        self._make("retain", -self._next - 1)
        self._next += 0x100
        return 0, self.ctx

    def cuDevicePrimaryCtxRelease(self, device: int) -> tuple[int]:
        retains = [h for h, kind in self.live.items() if kind == "retain"]
        assert retains, "the primary context was released more often than retained"
        return self._drop("retain", retains[-1])

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[int]:
        return (0,)

    def cuMemGetInfo(self) -> tuple[int, int, int]:
        return 0, 70 << 30, 80 << 30

    # streams and graphs
    def cuStreamCreate(self, flags: int) -> tuple[int, int]:
        return self._make("stream")

    def cuStreamDestroy(self, stream: int) -> tuple[int]:
        return self._drop("stream", stream)

    def cuStreamSynchronize(self, stream: int) -> tuple[int]:
        return (0,)

    def cuGraphCreate(self, flags: int) -> tuple[int, int]:
        return self._make("graph")

    def cuGraphDestroy(self, graph: int) -> tuple[int]:
        return self._drop("graph", graph)

    def cuGraphInstantiate(self, graph: int, flags: int) -> tuple[int, int]:
        return self._make("exec")

    def cuGraphExecDestroy(self, exec_: int) -> tuple[int]:
        return self._drop("exec", exec_)

    def cuGraphLaunch(self, exec_: Any, stream: int) -> tuple[int]:
        ok = exec_ is not None and self.live.get(int(exec_)) == "exec"
        return (0,) if ok else (400,)  # CUDA_ERROR_INVALID_HANDLE

    def cuDevicePrimaryCtxReset(self, device: int) -> tuple[int]:
        # Every allocation, stream, module and graph of the context is gone; its retains stay.
        self.live = {h: kind for h, kind in self.live.items() if kind == "retain"}
        return (0,)

    def cuGraphExecKernelNodeSetParams(self, exec_: int, node: int, params: Any) -> tuple[int]:
        return (0,)

    def cuGraphNodeSetEnabled(self, exec_: int, node: int, on: int) -> tuple[int]:
        return (0,)

    # GL interop registrations
    def cuGraphicsGLRegisterBuffer(self, name: int, flags: int) -> tuple[int, int]:
        return self._make("registration")

    def cuGraphicsGLRegisterImage(self, name: int, target: int, flags: int) -> tuple[int, int]:
        return self._make("registration")

    def cuGraphicsUnregisterResource(self, resource: int) -> tuple[int]:
        return self._drop("registration", resource)

    # contexts
    def cuCtxGetCurrent(self) -> tuple[int, int]:
        return 0, self.ctx

    def cuCtxGetId(self, ctx: Any) -> tuple[int, int]:
        return 0, self.ctx_id

    def cuCtxPushCurrent(self, ctx: Any) -> tuple[int]:
        self.pushed += 1
        return (0,)

    def cuCtxPopCurrent(self) -> tuple[int, int]:
        self.pushed -= 1
        return 0, self.ctx

    # memory
    def cuMemHostAlloc(self, nbytes: int, flags: int) -> tuple[int, int]:
        buf = ctypes.create_string_buffer(nbytes)
        self._host.append(buf)
        return self._make("host", ctypes.addressof(buf))

    def cuMemFreeHost(self, ptr: int) -> tuple[int]:
        return self._drop("host", ptr)

    def cuMemHostGetDevicePointer(self, ptr: int, flags: int) -> tuple[int, int]:
        return 0, ptr

    def cuMemAlloc(self, nbytes: int) -> tuple[int, int]:
        return self._make("device")

    def cuMemFree(self, ptr: int) -> tuple[int]:
        return self._drop("device", ptr)

    def cuMemsetD32Async(self, *args: Any) -> tuple[int]:
        return (0,)

    def cuMemsetD32(self, *args: Any) -> tuple[int]:
        return (0,)

    def cuMemcpyDtoDAsync(self, *args: Any) -> tuple[int]:
        return (0,)

    def cuMemGetAllocationGranularity(self, prop: Any, flags: Any) -> tuple[int, int]:
        return 0, 1 << 16

    def cuMemCreate(self, size: int, prop: Any, flags: int) -> tuple[int, int]:
        return self._make("physical")

    def cuMemRelease(self, handle: int) -> tuple[int]:
        return self._drop("physical", handle)

    def cuMemAddressReserve(self, size: int, *args: Any) -> tuple[int, int]:
        return self._make("range")

    def cuMemAddressFree(self, ptr: int, size: int) -> tuple[int]:
        return self._drop("range", ptr)

    def cuMemMap(self, ptr: int, size: int, offset: int, handle: int, flags: int) -> tuple[int]:
        self.live[-ptr] = "mapping"
        return (0,)

    def cuMemUnmap(self, ptr: int, size: int) -> tuple[int]:
        return self._drop("mapping", -ptr)

    def cuMemSetAccess(self, *args: Any) -> tuple[int]:
        return (0,)

    def cuMemExportToShareableHandle(self, handle: int, kind: Any, flags: int) -> tuple[int, int]:
        return 0, os.open(os.devnull, os.O_RDONLY)  # a real descriptor: GL's import takes it over

    # events, modules, surfaces, launches
    def cuEventCreate(self, flags: Any) -> tuple[int, int]:
        return self._make("event")

    def cuEventDestroy(self, event: int) -> tuple[int]:
        return self._drop("event", event)

    def cuEventRecord(self, *args: Any) -> tuple[int]:
        return (0,)

    def cuEventQuery(self, event: int) -> tuple[int]:
        return (0,)

    def cuModuleLoadData(self, image: Any) -> tuple[int, int]:
        return self._make("module")

    def cuModuleUnload(self, module: int) -> tuple[int]:
        return self._drop("module", module)

    def cuModuleGetFunction(self, module: int, name: bytes) -> tuple[int, str]:
        return 0, name.decode()

    def cuSurfObjectCreate(self, desc: Any) -> tuple[int, int]:
        return self._make("surface")

    def cuSurfObjectDestroy(self, surf: int) -> tuple[int]:
        return self._drop("surface", surf)

    def cuLaunchKernel(self, *args: Any) -> tuple[int]:
        return (0,)

    # the isolated engine's sharing (isolated/ipc.py)
    CUipcMemHandle = _Struct
    CUipcMem_flags = CUstreamWaitValue_flags = CUstreamWriteValue_flags = _Values()

    def cuMemHostRegister(self, ptr: int, nbytes: int, flags: int) -> tuple[int]:
        return self._make("registered", ptr)[:1]

    def cuMemHostUnregister(self, ptr: int) -> tuple[int]:
        return self._drop("registered", ptr)

    def cuIpcOpenMemHandle(self, handle: Any, flags: int) -> tuple[int, int]:
        return self._make("ipc")

    def cuIpcCloseMemHandle(self, ptr: int) -> tuple[int]:
        return self._drop("ipc", ptr)

    def cuStreamWaitValue32(self, *args: Any) -> tuple[int]:
        return (0,)


_GL_ENUMS = {  # the values of GL's headers the doubles tell apart (any other constant reads as 0)
    "GL_TEXTURE_WIDTH": 0x1000,
    "GL_TEXTURE_HEIGHT": 0x1001,
    "GL_TEXTURE_INTERNAL_FORMAT": 0x1003,
    "GL_FRAMEBUFFER_COMPLETE": 0x8CD5,
}


class FakeGL:
    """What the owners call of GL: names handed out (``made``), names deleted (``deleted``), and
    every call by name (``calls``)."""

    GLuint = ctypes.c_uint

    def __init__(self) -> None:
        self.made: list[tuple[str, int]] = []
        self.deleted: list[tuple[str, int]] = []
        self.calls: list[str] = []
        self._next = 100
        self._bound: dict[str, int] = {}  # kind -> the name bound now (targets are not told apart)
        self._storage: dict[int, Any] = {}  # buffer -> bytes, texture -> (width, height, internal format)

    def make(self, kind: str) -> int:
        self._next += 1
        self.made.append((kind, self._next))
        return self._next

    def _fill(self, kind: str, n: int, names: Any) -> None:
        for i in range(n):
            names[i] = self.make(kind)

    def _alive(self, kind: str, name: int) -> bool:
        return (kind, int(name)) in self.made and (kind, int(name)) not in self.deleted

    def _texture_level(self, pname: int) -> int:
        w, h, internal = self._storage[self._bound["texture"]]
        return {_GL_ENUMS["GL_TEXTURE_WIDTH"]: w, _GL_ENUMS["GL_TEXTURE_HEIGHT"]: h}.get(pname, internal)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("GL_"):
            return _GL_ENUMS.get(name, 0)
        handlers = {
            "glGenBuffers": lambda n: self.make("buffer"),
            "glGenFramebuffers": lambda n: self.make("framebuffer"),
            "glGenRenderbuffers": lambda n: [self.make("renderbuffer") for _ in range(n)],
            "glBindBuffer": lambda target, name: self._bound.__setitem__("buffer", name),
            "glBindTexture": lambda target, name: self._bound.__setitem__("texture", name),
            "glBufferData": lambda target, size, data, usage: self._storage.__setitem__(self._bound["buffer"], size),
            "glTexImage2D": lambda target, level, internal, w, h, *rest: self._storage.__setitem__(
                self._bound["texture"], (w, h, internal)
            ),
            "glIsBuffer": lambda name: self._alive("buffer", name),
            "glIsTexture": lambda name: self._alive("texture", name),
            "glGetBufferParameteriv": lambda target, pname: self._storage[self._bound["buffer"]],
            "glGetTexLevelParameteriv": lambda target, level, pname: self._texture_level(pname),
            "glCheckFramebufferStatus": lambda target: _GL_ENUMS["GL_FRAMEBUFFER_COMPLETE"],
            "glGetString": lambda what: b"fake GL",
            "glDeleteFramebuffers": lambda n, names: self._gone("framebuffer", list(names)[:n]),
            "glDeleteRenderbuffers": lambda n, names: self._gone("renderbuffer", list(names)[:n]),
            "glGenQueries": lambda n, names: self._fill("query", n, names),
            "glCreateBuffers": lambda n, names: self._fill("buffer", n, names),
            "glCreateMemoryObjectsEXT": lambda n, names: self._fill("memory", n, names),
            "glGenTextures": lambda n: self.make("texture"),
            "glGenVertexArrays": lambda n: self.make("vao") if n == 1 else [self.make("vao") for _ in range(n)],
            "glDeleteQueries": lambda n, names: self._gone("query", list(names)[:n]),
            "glDeleteBuffers": lambda n, names: self._gone("buffer", list(names)[:n]),
            "glDeleteMemoryObjectsEXT": lambda n, names: self._gone("memory", list(names)[:n]),
            "glDeleteTextures": lambda n, names: self._gone("texture", list(names)[:n]),
            "glDeleteVertexArrays": lambda n, names: self._gone("vao", list(names)[:n]),
            "glDeleteProgram": lambda p: self._gone("program", [p]),
            "glImportMemoryFdEXT": lambda memory, size, kind, fd: os.close(fd),  # GL owns the fd now
            "glGetUniformLocation": lambda program, name: 0,
        }
        fn = handlers.get(name, lambda *args: None)

        def call(*args: Any) -> Any:
            self.calls.append(name)
            return fn(*args)

        return call

    def _gone(self, kind: str, names: list[int]) -> None:
        self.deleted.extend((kind, int(n)) for n in names)

    def function(self, name: str, restype: Any, *argtypes: Any) -> Callable[..., Any]:
        """``gl_function``'s double: the entry point, recorded by name."""
        return getattr(self, name)


class FakeEGL:
    """What ``EglContext`` calls of PyOpenGL's EGL: displays initialised (``initialized``), contexts
    made and not destroyed (``contexts``), the context current on each thread (``current``), and every
    call by name (``calls``). Each double has a display of its own (EglContext counts its users)."""

    EGLint = ctypes.c_int32
    EGLConfig = ctypes.c_void_p
    _displays = itertools.count(0xD10)

    def __init__(self) -> None:
        self.display = ctypes.c_void_p(next(self._displays))
        self.initialized: set[int] = set()
        self.contexts: set[int] = set()
        self.current: dict[int, int] = {}
        self.calls: list[str] = []
        self._next = 0xE000

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("egl"):
            object.__getattribute__(self, "calls").append(name)
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> int:
        if name.startswith("EGL_"):
            return 0  # attributes and tokens (EGL_NO_CONTEXT and EGL_DEFAULT_DISPLAY are 0 in EGL's headers too)
        raise AttributeError(name)

    def eglGetDisplay(self, which: int) -> Any:
        return self.display

    def eglInitialize(self, display: Any, major: Any, minor: Any) -> bool:
        self.initialized.add(display.value)
        return True

    def eglTerminate(self, display: Any) -> bool:
        self.initialized.discard(display.value)
        self.contexts.clear()  # terminating a display releases its contexts (when no longer current)
        return True

    def eglChooseConfig(self, display: Any, attrs: Any, config: Any, size: int, n: Any) -> bool:
        n.contents.value = 1
        return True

    def eglBindAPI(self, api: int) -> bool:
        return True

    def eglCreateContext(self, display: Any, config: Any, share: Any, attrs: Any) -> int:
        self._next += 1
        self.contexts.add(self._next)
        return self._next

    def eglDestroyContext(self, display: Any, context: int) -> bool:
        assert context in self.contexts, f"EGL context {context:#x} destroyed twice or never made"
        self.contexts.discard(context)
        return True

    def eglMakeCurrent(self, display: Any, draw: Any, read: Any, context: int) -> bool:
        self.current[threading.get_ident()] = context
        return True

    def eglGetError(self) -> int:
        return 0x3000  # EGL_SUCCESS


@dataclass
class Doubles:
    driver: FakeDriver
    gl: FakeGL
    egl: FakeEGL

    def balanced(self) -> bool:
        """Every driver handle, GL name and EGL object made was given back exactly once."""
        gl_ok = sorted(self.gl.made) == sorted(self.gl.deleted)
        return not self.driver.live and gl_ok and not self.egl.contexts and not self.egl.initialized


@pytest.fixture
def doubles(monkeypatch: pytest.MonkeyPatch) -> Doubles:
    import OpenGL

    from cudapatch.interop import _platform, context, imported, render, shared, surface

    d, g, e = FakeDriver(), FakeGL(), FakeEGL()
    monkeypatch.setattr(_driver, "_driver", d)
    for mod in (imported, render, shared, context):
        monkeypatch.setattr(mod, "gl", lambda: g)
        monkeypatch.setattr(mod, "check_gl", lambda what: None)
    # EglContext on the EGL double: PyOpenGL's EGL module is the double, without the device extensions
    # (EglContext then asks for the default display, as on an EGL without them)
    monkeypatch.setattr(_platform, "HAS_EGL", True)
    monkeypatch.setattr(context, "pyopengl_platform", lambda: "egl")
    monkeypatch.setattr(OpenGL, "EGL", e, raising=False)
    monkeypatch.setitem(sys.modules, "OpenGL.EGL", e)
    for ext in ("device_enumeration", "device_query", "platform_base", "platform_device"):
        monkeypatch.setitem(sys.modules, f"OpenGL.EGL.EXT.{ext}", None)  # an import of it fails
    monkeypatch.setattr(imported, "gl_function", g.function)
    monkeypatch.setattr(render, "_program", lambda vs, fs, what: g.make("program"))
    monkeypatch.setattr(render, "compile_program", lambda stages, what: g.make("program"))
    monkeypatch.setattr(surface, "_image", lambda texel: types.SimpleNamespace(image=b"", entry_symbol="copy"))
    for name in ("memory_object", "memory_object_fd"):
        ext = types.ModuleType(f"OpenGL.GL.EXT.{name}")
        for fn in ("glCreateMemoryObjectsEXT", "glNamedBufferStorageMemEXT", "glImportMemoryFdEXT",
                   "glDeleteMemoryObjectsEXT"):  # fmt: skip
            setattr(ext, fn, getattr(g, fn))
        ext.GL_HANDLE_TYPE_OPAQUE_FD_EXT = 0x9586
        monkeypatch.setitem(sys.modules, f"OpenGL.GL.EXT.{name}", ext)
    return Doubles(d, g, e)


# -- the owners ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One owner: how to make it, one use that must fail once it is closed, whether it is a GL owner
    (its closed error is an ``InteropError``), and its finalizer: ``"warns"`` (releases what it can and
    warns), ``"quiet"`` (releases, no warning: a part its engine always closes) or None (none: its
    engine closes it). ``leaks_gl``: an unclosed one leaves GL names to its GL context (default: ``gl``)."""

    make: Callable[[pytest.MonkeyPatch], Any]
    use: Callable[[Any], Any]
    gl: bool = False
    finalizer: str | None = "warns"
    leaks_gl: bool | None = None
    #: Frees what the owner gave back to another owner (a GpuBuffer's block goes back to its pool,
    #: whose ``trim`` frees it), before the test counts the driver's live handles.
    settle: Callable[[Any], Any] = lambda owner: None


def _readback(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.engine.readback import ReadbackRing

    return ReadbackRing(0xD000, 3, stamps=2, frames_ptr=0xD100)


def _surface_writer(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop.surface import SurfaceWriter

    w = SurfaceWriter(64, 32, 4)
    w.write(0x1234, 0xA000, 64, None)  # makes a surface object: released with the writer
    return w


def _imported_buffer(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop.imported import ImportedBuffer

    return ImportedBuffer(1000, label="b")


def _imported_ring(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop.imported import ImportedRing

    ring = ImportedRing(4096, label="r")
    ring.attach(types.SimpleNamespace(set=lambda name, value: None))  # the control words, released too
    return ring


def _imported_image(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop.imported import ImportedBuffer, ImportedImage

    mp.setattr(ImportedBuffer, "shares_memory", lambda self: True)
    return ImportedImage(16, 8, label="i")


def _point_renderer(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop.render import PointRenderer

    return PointRenderer([5, 6, 7], 100)


def _texture_renderer(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop.render import TextureRenderer

    return TextureRenderer()


def _buffer_pool(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.engine.buffers import BufferPool

    pool = BufferPool()
    pool.release(pool.acquire(1000))  # one idle block, one handed out: close frees both
    pool.acquire(5000)
    return pool


def _module_cache(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.kernels.module_cache import ModuleCache

    return ModuleCache(device_key="0:sm_90")


def _library_handles(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.engine.libraries import LibraryHandles

    return LibraryHandles(types.SimpleNamespace(compute_capability=(9, 0)), pool=None)


def _device_context(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.engine import DeviceContext

    return DeviceContext(0)


# What a graph uses of its engine's device (the device itself is the DeviceContext case).
_ENGINE_DEVICE = types.SimpleNamespace(make_current=lambda: None, stream=0, upload_stream=None, context=0xC0)


def _compiled_graph(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.engine import BufferPool, Context, compile_plan, realize

    plan = compile_plan(Context().snapshot())  # no block: the graph and its executable, nothing else
    g = realize(plan, device=_ENGINE_DEVICE, pool=BufferPool(), functions={}, bindings={})
    g.adopt(None)
    return g


def _gpu_buffer(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.engine import BufferPool, GpuBuffer
    from cudapatch.kernels.types import DType

    return GpuBuffer(BufferPool(), DType.FLOAT32, 100, stream=0)


_TRANSFER_ENGINE = types.SimpleNamespace(bind=lambda block, port, view: None)  # what a ring asks of its engine


def _upload_ring(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.blocks.library.transfer import Upload
    from cudapatch.engine import UploadRing

    return UploadRing(_TRANSFER_ENGINE, Upload(name="up", Count=16))


def _download_ring(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.blocks.library.transfer import Download
    from cudapatch.engine import DownloadRing

    return DownloadRing(_TRANSFER_ENGINE, Download(name="down"), count=16)


def _shared_buffer(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop import SharedBuffer

    return SharedBuffer.create(4096, label="b")  # a GL buffer of its own, registered


def _shared_texture(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop import SharedTexture2D

    return SharedTexture2D.create(32, 16, format="rgba8", label="t")


def _egl_context(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.interop import EglContext

    return EglContext(64, 32)


def _frame_word(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.isolated.ipc import FrameWord

    return FrameWord.create(5)  # a memfd page of its own, registered


def _shared_pages(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.isolated.ipc import SharedPages

    return SharedPages.create(100)


def _ipc_imports(mp: pytest.MonkeyPatch) -> Any:
    from cudapatch.isolated.ipc import IpcImports

    imports = IpcImports()
    imports.pointer(b"a" * 64, 16)  # two allocations of the engine process, opened here
    imports.pointer(b"b" * 64, 0)
    return imports


_IMAGE = types.SimpleNamespace(descriptor=types.SimpleNamespace(entry_point="k"), key="k", debug_name="k.ptx")
_VIEW = [[1.0] * 4] * 4

CASES = {
    "ReadbackRing": Case(_readback, lambda r: r.publish_args()),
    "SurfaceWriter": Case(_surface_writer, lambda w: w.write(0x1234, 0xA000, 64, None)),
    "ImportedBuffer": Case(_imported_buffer, lambda b: b.shares_memory(), gl=True),
    "ImportedRing": Case(_imported_ring, lambda r: r.request(), gl=True),
    "ImportedImage": Case(_imported_image, lambda i: i.front(), gl=True),
    "PointRenderer": Case(_point_renderer, lambda r: r.draw(_VIEW, 100), gl=True),
    "TextureRenderer": Case(_texture_renderer, lambda r: r.draw(3), gl=True),
    "UploadRing": Case(_upload_ring, lambda r: r.write(np.zeros(16, np.float32))),
    "DownloadRing": Case(_download_ring, lambda r: r.read()),
    "SharedBuffer": Case(_shared_buffer, lambda b: b.map(stream=0), gl=True),
    "SharedTexture2D": Case(_shared_texture, lambda t: t.map(stream=0), gl=True),
    # Its finalizer destroys the EGL context (EGL is thread-safe) and with it the framebuffer's names.
    "EglContext": Case(_egl_context, lambda c: c.make_current(), gl=True, leaks_gl=False),
    # The root of an engine's handles: an unclosed engine warns once, from here.
    "DeviceContext": Case(_device_context, lambda d: d.mem_info()),
    # Parts an engine always closes (or abandons), see the table in cudapatch/_lifecycle.py.
    "CompiledGraph": Case(_compiled_graph, lambda g: g.replay(0), finalizer="quiet"),
    "GpuBuffer": Case(_gpu_buffer, lambda b: b.download(), finalizer="quiet", settle=lambda b: b._pool.trim()),
    "BufferPool": Case(_buffer_pool, lambda p: p.acquire(16), finalizer=None),
    "ModuleCache": Case(_module_cache, lambda c: c.function(_IMAGE), finalizer=None),
    "LibraryHandles": Case(_library_handles, lambda h: h.scope((1, 0)), finalizer=None),
    # The isolated engine's sharing: parts its host side or a transfer ring always closes.
    "FrameWord": Case(_frame_word, lambda w: w.wait(0, 6), finalizer="quiet"),
    "SharedPages": Case(_shared_pages, lambda p: p.device_ptr, finalizer="quiet"),
    "IpcImports": Case(_ipc_imports, lambda i: i.pointer(b"c" * 64, 0), finalizer="quiet"),
}
FINALIZED = [k for k, c in CASES.items() if c.finalizer == "warns"]
QUIET = [k for k, c in CASES.items() if c.finalizer == "quiet"]
owners = pytest.mark.parametrize("case", list(CASES), ids=list(CASES))


# -- the protocol, over every owner ----------------------------------------------------------------
@owners
def test_an_owner_follows_the_protocol_and_closes_once(case: str, doubles: Doubles, monkeypatch) -> None:
    c = CASES[case]
    owner = c.make(monkeypatch)
    assert isinstance(owner, Lifecycle) and isinstance(owner, HandleOwner)
    assert not owner.is_closed and "closed=False" in repr(owner)
    assert doubles.driver.live or doubles.gl.made or case in ("ModuleCache", "LibraryHandles")
    owner.close()
    assert owner.is_closed and "closed=True" in repr(owner)
    c.settle(owner)
    assert doubles.balanced(), (doubles.driver.live, doubles.gl.made, doubles.gl.deleted, doubles.egl.contexts)
    calls = len(doubles.driver.calls), len(doubles.gl.calls)
    owner.close()  # idempotent: nothing more is released
    assert (len(doubles.driver.calls), len(doubles.gl.calls)) == calls


@owners
def test_using_a_closed_owner_raises_a_cudapatch_error(case: str, doubles: Doubles, monkeypatch) -> None:
    c = CASES[case]
    owner = c.make(monkeypatch)
    owner.close()
    calls = len(doubles.driver.calls), len(doubles.gl.calls)
    with pytest.raises(CudapatchError, match="closed") as info:
        c.use(owner)
    assert case in str(info.value) or getattr(owner, "label", "\0") in str(info.value)  # names the owner
    assert (len(doubles.driver.calls), len(doubles.gl.calls)) == calls  # refused before any call
    if c.gl:
        with pytest.raises(InteropError):
            c.use(owner)


@owners
def test_an_owner_is_a_context_manager_that_closes_on_exception(case: str, doubles: Doubles, monkeypatch) -> None:
    c = CASES[case]
    with c.make(monkeypatch) as owner:
        assert not owner.is_closed
    c.settle(owner)
    assert owner.is_closed and doubles.balanced()
    with pytest.raises(RuntimeError, match="boom"), c.make(monkeypatch) as other:
        raise RuntimeError("boom")
    c.settle(other)
    assert other.is_closed and doubles.balanced()


@owners
def test_abandon_forgets_every_handle_without_a_call(case: str, doubles: Doubles, monkeypatch) -> None:
    owner = CASES[case].make(monkeypatch)
    live, made = dict(doubles.driver.live), list(doubles.gl.made)
    calls = len(doubles.driver.calls), len(doubles.gl.calls)
    owner.abandon()
    assert owner.is_closed
    owner.close()  # a no-op now
    del owner
    gc.collect()  # and no finalizer fires (warnings are errors here)
    assert (len(doubles.driver.calls), len(doubles.gl.calls)) == calls
    assert doubles.driver.live == live and doubles.gl.made == made and not doubles.gl.deleted


@pytest.mark.parametrize("case", FINALIZED, ids=FINALIZED)
def test_an_unclosed_owner_warns_from_its_finalizer(case: str, doubles: Doubles, monkeypatch) -> None:
    c = CASES[case]
    owner = c.make(monkeypatch)
    gl_calls = len(doubles.gl.calls)
    with pytest.warns(ResourceWarning) as record:  # a composite's parts warn too: see _lifecycle
        del owner
        gc.collect()
    assert any(str(w.message).startswith(f"unclosed {case}") for w in record)
    # Driver handles go back inside their (living) context; GL names are never touched off the GL thread.
    assert not doubles.driver.live and doubles.driver.pushed == 0
    gl_only = ("ImportedImage", "PointRenderer", "TextureRenderer", "EglContext")  # no driver handle of their own
    assert doubles.driver.released_pushed > 0 or case in gl_only
    assert len(doubles.gl.calls) == gl_calls and not doubles.gl.deleted
    if c.gl and c.leaks_gl is not False:
        assert any("GL names leak" in str(w.message) for w in record)


@pytest.mark.parametrize("case", QUIET, ids=QUIET)
def test_an_unclosed_engine_part_is_released_quietly_in_its_living_context(
    case: str, doubles: Doubles, monkeypatch
) -> None:
    c = CASES[case]
    owner = c.make(monkeypatch)
    keep = owner._pool if case == "GpuBuffer" else None  # where a buffer's block goes back to
    del owner
    gc.collect()  # no warning (warnings are errors here): its engine's DeviceContext is the one that warns
    if keep is not None:
        assert keep.in_use_bytes == 0 and keep.idle_bytes > 0  # back in the pool, for its next user
        keep.close()
    assert not doubles.driver.live and doubles.driver.pushed == 0
    assert doubles.driver.released_pushed > 0 or case == "GpuBuffer"  # a buffer's finalizer makes no driver call


# -- the finalizer policy in detail ----------------------------------------------------------------
def test_a_finalizer_forgets_the_handles_of_a_reset_context(doubles: Doubles, monkeypatch) -> None:
    ring = _readback(monkeypatch)
    note_context_reset(doubles.driver.ctx)  # what DeviceContext.reset does before the driver's reset
    with pytest.warns(ResourceWarning, match="CUDA context is gone"):
        del ring
        gc.collect()
    assert list(doubles.driver.live.values()) == ["host"]  # freeing it now could free a new allocation


def test_a_finalizer_forgets_the_handles_of_a_destroyed_context(doubles: Doubles, monkeypatch) -> None:
    writer = _surface_writer(monkeypatch)
    doubles.driver.ctx_id = 8  # the context handle now names another context
    with pytest.warns(ResourceWarning, match="CUDA context is gone"):
        del writer
        gc.collect()
    assert sorted(doubles.driver.live.values()) == ["module", "surface"]


@pytest.mark.parametrize("case", ["PointRenderer", "SharedBuffer", "SharedTexture2D"])
def test_gl_owners_refuse_to_close_off_their_thread(case: str, doubles: Doubles, monkeypatch) -> None:
    renderer = CASES[case].make(monkeypatch)
    errors: list[BaseException] = []

    def close_elsewhere() -> None:
        try:
            renderer.close()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=close_elsewhere)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], InteropError) and "another thread" in str(errors[0])
    assert not renderer.is_closed and not doubles.gl.deleted  # still open, nothing deleted from there
    renderer.close()
    assert doubles.balanced()


def test_a_registration_of_a_gl_object_made_elsewhere_closes_on_any_thread(doubles: Doubles, monkeypatch) -> None:
    from cudapatch.interop import SharedBuffer

    gl = doubles.gl
    name = gl.glGenBuffers(1)
    gl.glBindBuffer(0, name)
    gl.glBufferData(0, 256, None, 0)
    shared = SharedBuffer.from_gl_buffer(name, label="theirs")
    t = threading.Thread(target=shared.close)  # no GL name of its own: unregistering makes no GL call
    t.start()
    t.join()
    assert shared.is_closed and not doubles.driver.live and not gl.deleted  # the GL buffer stays its maker's


def test_a_reset_device_gives_back_its_new_streams_and_forgets_what_died(doubles: Doubles, monkeypatch) -> None:
    dev = _device_context(monkeypatch)
    graph = _compiled_graph(monkeypatch)  # made in the context before the reset
    dev.reset()
    assert dev.resets == 1 and not dev.is_closed
    calls = len(doubles.driver.calls)
    del graph
    gc.collect()  # its quiet finalizer forgets the graphs of the reset context: no call for them
    assert not any(c.startswith("cuGraph") for c in doubles.driver.calls[calls:])
    assert sorted(doubles.driver.live.values()) == ["retain", "stream", "stream"]
    with pytest.warns(ResourceWarning, match="unclosed DeviceContext 0 .*released by its finalizer"):
        del dev
        gc.collect()
    assert not doubles.driver.live  # the new streams and the one retain, not the old streams again


def test_each_thread_makes_the_context_current_once(doubles: Doubles, monkeypatch) -> None:
    # cuCtxSetCurrent is per thread (and lets go of the GIL through the bindings): a build thread's
    # call must not make the frame thread's next frame call it again; a reset makes every thread call it.
    dev = _device_context(monkeypatch)

    def sets() -> int:
        return doubles.driver.calls.count("cuCtxSetCurrent")

    def on_another_thread() -> None:
        t = threading.Thread(target=lambda: (dev.make_current(), dev.make_current()))
        t.start()
        t.join()

    start = sets()  # the constructor's, on this thread
    dev.make_current()
    assert sets() == start
    on_another_thread()
    assert sets() == start + 1
    dev.make_current()  # this thread's context is still current: nothing to do
    assert sets() == start + 1
    dev.reset()  # a new context, current on this thread
    after = sets()
    dev.make_current()
    assert sets() == after
    on_another_thread()  # the other thread's is the dead one
    assert sets() == after + 1
    dev.close()
    raised: list[BaseException | None] = []
    t = threading.Thread(target=lambda: raised.append(_raised(dev.make_current)))  # a thread it was never current on
    t.start()
    t.join()
    assert isinstance(raised[0], CudapatchError)
    assert "DeviceContext.make_current: DeviceContext is closed" in str(raised[0])


def test_engines_on_two_devices_make_their_own_context_current_again(doubles: Doubles, monkeypatch) -> None:
    # One current context per thread: an engine that made another device's current on this thread
    # is seen by the first engine's next call; two engines on one device share its primary context.
    a = _device_context(monkeypatch)
    same = _device_context(monkeypatch)  # the same device: the same primary context
    doubles.driver.ctx = 0xD0  # the second device's primary context
    b = _device_context(monkeypatch)

    def sets() -> int:
        return doubles.driver.calls.count("cuCtxSetCurrent")

    start = sets()  # b's constructor made 0xD0 current here
    a.make_current()
    same.make_current()  # 0xC0 is current already
    b.make_current()
    a.make_current()
    assert sets() == start + 3
    for dev in (b, same, a):
        dev.close()


def _raised(fn: Any) -> BaseException | None:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - handed to the test's thread
        return exc
    return None


def test_a_closed_graph_says_so_where_the_frame_path_checks_nothing(doubles: Doubles, monkeypatch) -> None:
    graph = _compiled_graph(monkeypatch)
    graph.launch(0)
    graph.close()
    with pytest.raises(CudapatchError, match="CompiledGraph.launch: CompiledGraph is closed") as info:
        graph.launch(0)  # the driver refused the launch; only then is the graph asked
    assert not isinstance(info.value, CudaError)


def test_a_buffer_is_closed_with_its_pool_and_a_view_with_its_buffer(doubles: Doubles) -> None:
    from cudapatch.engine import BufferPool, GpuBuffer
    from cudapatch.kernels.types import DType

    pool = BufferPool()
    buf = GpuBuffer(pool, DType.FLOAT32, 64, stream=0)
    view = buf.view(DType.UINT8, 16)
    other = GpuBuffer(pool, DType.FLOAT32, 64, stream=0)
    buf.close()
    assert view.is_closed and "closed=True" in repr(view) and not other.is_closed
    with pytest.raises(CudapatchError, match="GpuBuffer.fill_bytes: GpuBuffer uchar\\[16\\] is closed"):
        view.fill_bytes(0)
    pool.close()  # frees the block ``other`` still holds
    assert other.is_closed and not doubles.driver.live
    with pytest.raises(CudapatchError, match="closed"):
        other.__cuda_array_interface__  # noqa: B018
    other.close()  # nothing left to give back


def test_an_unclosed_egl_context_is_destroyed_without_a_gl_call(doubles: Doubles, monkeypatch) -> None:
    ctx = _egl_context(monkeypatch)
    other = _egl_context(monkeypatch)  # the same display: it stays initialised for this one
    gl_calls = len(doubles.gl.calls)
    with pytest.warns(ResourceWarning, match="unclosed EglContext 64x32"):
        del ctx
        gc.collect()
    assert len(doubles.egl.contexts) == 1 and doubles.egl.initialized
    assert len(doubles.gl.calls) == gl_calls  # the framebuffer's names went with the context
    other.close()
    assert not doubles.egl.contexts and not doubles.egl.initialized


def test_a_failed_constructor_leaves_nothing_behind(doubles: Doubles, monkeypatch) -> None:
    from cudapatch.interop.imported import ImportedRing

    real, asked = doubles.driver.cuEventCreate, []

    def second_fails(flags: Any) -> tuple[int, int]:
        asked.append(flags)
        return (2, 0) if len(asked) == 2 else real(flags)  # CUDA_ERROR_OUT_OF_MEMORY on the second event

    monkeypatch.setattr(doubles.driver, "cuEventCreate", second_fails)
    with pytest.raises(CudaError, match="cuEventCreate"):
        ImportedRing(256)
    gc.collect()  # no finalizer warns (warnings are errors here): the constructor gave everything back
    assert doubles.balanced()


def test_an_image_gl_cannot_share_closes_its_ring_before_raising(doubles: Doubles, monkeypatch) -> None:
    from cudapatch.interop.imported import ImportedBuffer, ImportedImage

    monkeypatch.setattr(ImportedBuffer, "shares_memory", lambda self: False)  # the preview then falls back
    with pytest.raises(InteropError, match="does not see what CUDA writes"):
        ImportedImage(16, 8)
    gc.collect()  # nothing left for a finalizer (warnings are errors here)
    assert doubles.balanced()


def test_releases_are_made_newest_first_and_all_of_them_on_error(doubles: Doubles) -> None:
    order: list[str] = []
    r = Releases()
    r.push(lambda: order.append("first") or (0,), what="first")
    r.push(lambda: order.append("second") or (1,), what="second")
    r.push(lambda: order.append("third") or (0,), what="third")
    assert len(r) == 3
    with pytest.raises(CudaError, match="second"):
        r.release()
    assert order == ["third", "second", "first"] and len(r) == 0
    r.push(lambda: 1 / 0, what="boom")
    r.release_quietly()  # a finalizer's: errors swallowed
    r.push(lambda: order.append("never"), what="never")
    r.forget()
    r.release()
    assert "never" not in order


def test_context_ref_is_none_without_a_current_context(doubles: Doubles) -> None:
    ref = ContextRef.current()
    assert ref is not None and ref.alive() and ref.ident == 7
    doubles.driver.ctx = 0
    assert ContextRef.current() is None


def test_the_module_docstring_lists_every_owner() -> None:
    doc = _lifecycle.__doc__ or ""
    gl_only = ("PointRenderer", "TextureRenderer", "Overlay", "GlfwWindow")  # tests/gl/test_lifecycle_gl.py
    named = ("DeviceContext", "GpuBuffer", "CompiledGraph", "SharedBuffer", "SharedTexture2D", "IsolatedEngine")
    for name in (*CASES, *gl_only, *named):  # IsolatedEngine: tests/unit/test_isolated.py
        assert f"``{name}``" in doc, name
