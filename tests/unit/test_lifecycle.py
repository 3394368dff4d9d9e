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
import os
import sys
import threading
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

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


_ENUMS = (
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


class FakeGL:
    """What the owners call of GL: names handed out (``made``), names deleted (``deleted``), and
    every call by name (``calls``)."""

    GLuint = ctypes.c_uint

    def __init__(self) -> None:
        self.made: list[tuple[str, int]] = []
        self.deleted: list[tuple[str, int]] = []
        self.calls: list[str] = []
        self._next = 100

    def make(self, kind: str) -> int:
        self._next += 1
        self.made.append((kind, self._next))
        return self._next

    def _fill(self, kind: str, n: int, names: Any) -> None:
        for i in range(n):
            names[i] = self.make(kind)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("GL_"):
            return 0
        handlers = {
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


@dataclass
class Doubles:
    driver: FakeDriver
    gl: FakeGL

    def balanced(self) -> bool:
        """Every driver handle and GL name made was given back exactly once."""
        return not self.driver.live and sorted(self.gl.made) == sorted(self.gl.deleted)


@pytest.fixture
def doubles(monkeypatch: pytest.MonkeyPatch) -> Doubles:
    from cudapatch.interop import imported, render, surface

    d, g = FakeDriver(), FakeGL()
    monkeypatch.setattr(_driver, "_driver", d)
    for mod in (imported, render):
        monkeypatch.setattr(mod, "gl", lambda: g)
        monkeypatch.setattr(mod, "check_gl", lambda what: None)
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
    return Doubles(d, g)


# -- the owners ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One owner: how to make it, one use that must fail once it is closed (None: the class has no
    closed check yet), whether it holds GL names, and whether it has a warning finalizer."""

    make: Callable[[pytest.MonkeyPatch], Any]
    use: Callable[[Any], Any] | None
    gl: bool = False
    warns: bool = True


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
    # Closed by their engine; no warning finalizer yet (see the table in cudapatch/_lifecycle.py).
    "BufferPool": Case(_buffer_pool, lambda p: p.acquire(16), warns=False),
    "ModuleCache": Case(_module_cache, lambda c: c.function(_IMAGE), warns=False),
    "LibraryHandles": Case(_library_handles, None, warns=False),
}
FINALIZED = [k for k, c in CASES.items() if c.warns]
CHECKED = [k for k, c in CASES.items() if c.use is not None]  # LibraryHandles has no closed check yet
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
    assert doubles.balanced(), (doubles.driver.live, doubles.gl.made, doubles.gl.deleted)
    calls = len(doubles.driver.calls), len(doubles.gl.calls)
    owner.close()  # idempotent: nothing more is released
    assert (len(doubles.driver.calls), len(doubles.gl.calls)) == calls


@pytest.mark.parametrize("case", CHECKED, ids=CHECKED)
def test_using_a_closed_owner_raises_a_cudapatch_error(case: str, doubles: Doubles, monkeypatch) -> None:
    c = CASES[case]
    owner = c.make(monkeypatch)
    owner.close()
    calls = len(doubles.driver.calls), len(doubles.gl.calls)
    with pytest.raises(CudapatchError, match="closed"):
        c.use(owner)  # type: ignore[misc]
    assert (len(doubles.driver.calls), len(doubles.gl.calls)) == calls  # refused before any call
    if c.gl:
        with pytest.raises(InteropError):
            c.use(owner)  # type: ignore[misc]


@owners
def test_an_owner_is_a_context_manager_that_closes_on_exception(case: str, doubles: Doubles, monkeypatch) -> None:
    c = CASES[case]
    with c.make(monkeypatch) as owner:
        assert not owner.is_closed
    assert owner.is_closed and doubles.balanced()
    with pytest.raises(RuntimeError, match="boom"), c.make(monkeypatch) as other:
        raise RuntimeError("boom")
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
    assert doubles.driver.released_pushed > 0 or case in ("ImportedImage", "PointRenderer", "TextureRenderer")
    assert len(doubles.gl.calls) == gl_calls and not doubles.gl.deleted
    if c.gl:
        assert any("GL names leak" in str(w.message) for w in record)


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


def test_gl_owners_refuse_to_close_off_their_thread(doubles: Doubles, monkeypatch) -> None:
    renderer = _point_renderer(monkeypatch)
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
    for name in (*CASES, *gl_only, "DeviceContext", "GpuBuffer", "CompiledGraph", "SharedBuffer", "SharedTexture2D"):
        assert f"``{name}``" in doc, name
