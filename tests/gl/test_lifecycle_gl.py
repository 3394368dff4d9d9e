"""The lifecycle protocol (``cudapatch._lifecycle``) over every owner of GL names, in a real GL
context: double close, use after close, ``with``, a finalizer that warns and leaves the GL names
alone, and ``close()`` refused off the GL thread. The renderers and the overlay need GL only, the
window a display too (Xvfb); the owners that share memory with CUDA need the GPU."""

from __future__ import annotations

import ctypes
import gc
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from cudapatch._lifecycle import Lifecycle
from cudapatch.engine.profiling import EngineStats, ProfilingLevel
from cudapatch.errors import InteropError

pytestmark = pytest.mark.gl


@dataclass(frozen=True)
class GlCase:
    """How to make the owner (given the engine, None for GL-only owners), one use that must fail
    once it is closed, the GL names it holds as ``(kind, name)``, and whether it needs the GPU."""

    make: Callable[[Any], Any]
    use: Callable[[Any], Any]
    names: Callable[[Any], list[tuple[str, int]]]
    gpu: bool = True
    warns: bool = True  # a warning finalizer
    #: What gives back, after the finalizer test, what an unclosed owner leaves for the process's
    #: end (given the owner, it returns a call that holds none of it).
    reclaim: Callable[[Any], Callable[[], None]] | None = None


def _vertex_buffer() -> int:
    from OpenGL import GL

    name = int(GL.glGenBuffers(1))
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, name)
    GL.glBufferData(GL.GL_ARRAY_BUFFER, 4 * 32, None, GL.GL_STATIC_DRAW)
    GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
    return name  # deleted with the context


def _point_renderer(engine: Any) -> Any:
    from cudapatch.interop.render import PointRenderer

    return PointRenderer([_vertex_buffer(), _vertex_buffer()], 4)


def _texture_renderer(engine: Any) -> Any:
    from cudapatch.interop.render import TextureRenderer

    return TextureRenderer()


class _BoundTarget:
    """What an overlay reads of its context: the size and framebuffer of the fixture's ``EglContext``
    (current, its framebuffer bound)."""

    size = (64, 64)

    def __init__(self) -> None:
        from OpenGL import GL

        self.framebuffer = int(GL.glGetIntegerv(GL.GL_DRAW_FRAMEBUFFER_BINDING))


def _overlay(engine: Any) -> Any:
    from cudapatch.interop.overlay import Overlay

    overlay = Overlay(_BoundTarget())
    for _ in range(2):  # the first frame uploads imgui's font texture, the second draws the panel
        overlay.draw(_STATS)
    return overlay


def _overlay_names(overlay: Any) -> list[tuple[str, int]]:
    from imgui_bundle import imgui

    r = overlay._renderer  # imgui-bundle's renderer: its GL names are what close() must delete
    imgui.set_current_context(overlay._imgui_ctx)
    fonts = [("texture", int(t.tex_id)) for t in imgui.get_platform_io().textures if t.tex_id]
    return [("program", int(r._shader_handle)), ("vao", int(r._vao_handle)), ("buffer", int(r._vbo_handle)),
            ("buffer", int(r._elements_handle)), *fonts]  # fmt: skip


def _glfw_window(engine: Any) -> Any:
    from cudapatch.interop import GlfwWindow

    if not (os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")):
        pytest.skip("no display here: window tests run under Xvfb in CI (.ci/run)")
    return GlfwWindow(64, 48, "lifecycle", visible=False)


def _window_names(window: Any) -> list[tuple[str, int]]:
    import glfw

    return [("context", int(glfw.get_egl_context(window.handle)))]  # GLFW makes EGL contexts here (conftest)


def _destroy_later(window: Any) -> Callable[[], None]:
    import glfw

    handle = window.handle
    return lambda: glfw.destroy_window(handle)  # GLFW stays initialised (its user count is the window's)


def _imported_buffer(engine: Any) -> Any:
    from cudapatch.interop.imported import ImportedBuffer

    return ImportedBuffer(4096, device=engine.device.ordinal, label="lifecycle")


def _imported_ring(engine: Any) -> Any:
    from cudapatch.interop.imported import ImportedRing

    return ImportedRing(4096, device=engine.device.ordinal, label="lifecycle")


def _imported_image(engine: Any) -> Any:
    from cudapatch.interop.imported import ImportedImage

    return ImportedImage(32, 16, device=engine.device.ordinal, label="lifecycle")


def _shared_texture(engine: Any) -> Any:
    from cudapatch.interop import SharedTexture2D

    return SharedTexture2D.create(32, 16, format="rgba8", flags="surface_ldst", label="lifecycle")


def _shared_buffer(engine: Any) -> Any:
    from cudapatch.interop import SharedBuffer

    return SharedBuffer.create(4096, label="lifecycle")


_IDENTITY = np.eye(4, dtype=np.float32)
_STATS = EngineStats(ProfilingLevel.PER_BLOCK, None, None, None, (), 0, 0, 0)
CASES = {
    "PointRenderer": GlCase(
        _point_renderer,
        lambda r: r.draw(_IDENTITY, 100),
        lambda r: [("vao", v) for v in r.vaos] + [("program", r.program)],
        gpu=False,
    ),
    "TextureRenderer": GlCase(_texture_renderer, lambda r: r.draw(0), lambda r: [("program", r.program)], gpu=False),
    "Overlay": GlCase(_overlay, lambda o: o.draw(_STATS), _overlay_names, gpu=False),
    "GlfwWindow": GlCase(_glfw_window, lambda w: w.swap(), _window_names, gpu=False, reclaim=_destroy_later),
    "ImportedBuffer": GlCase(_imported_buffer, lambda b: b.shares_memory(), lambda b: [("buffer", b.gl_name)]),
    "ImportedRing": GlCase(_imported_ring, lambda r: r.front(), lambda r: [("buffer", b.gl_name) for b in r.buffers]),
    "ImportedImage": GlCase(
        _imported_image, lambda i: i.front(), lambda i: [("texture", i.gl_name), ("program", i._program)]
    ),
    # Unregistered by their finalizer (a driver call, no GL call); the GL object they made leaks.
    "SharedTexture2D": GlCase(_shared_texture, lambda t: t.handle, lambda t: [("texture", t.gl_name)]),
    "SharedBuffer": GlCase(_shared_buffer, lambda b: b.handle, lambda b: [("buffer", b.gl_name)]),
}


def _params(names: list[str]) -> list[Any]:
    return [pytest.param(n, id=n, marks=[pytest.mark.gpu] if CASES[n].gpu else []) for n in names]


@pytest.fixture
def gl_context(request: pytest.FixtureRequest):
    """An EGL context current on this thread; for GPU cases an engine too, its CUDA context current."""
    from cudapatch.interop import EglContext

    engine = request.getfixturevalue("engine") if request.node.get_closest_marker("gpu") else None
    ctx = EglContext(64, 64)
    if engine is not None:
        engine.device.make_current()
    yield engine
    ctx.close()


def _alive(kind: str, name: int) -> bool:
    from OpenGL import GL

    if kind == "context":
        return _context_alive(name)
    test = {"buffer": GL.glIsBuffer, "program": GL.glIsProgram, "texture": GL.glIsTexture, "vao": GL.glIsVertexArray}
    return bool(test[kind](name))


def _context_alive(context: int) -> bool:
    """Whether the EGL context ``context`` of GLFW's display still exists (EGL checks the handle
    against the display's contexts, so asking after it was destroyed is safe: ``EGL_BAD_CONTEXT``)."""
    import glfw
    from OpenGL import EGL

    value = EGL.EGLint()
    try:
        return bool(EGL.eglQueryContext(glfw.get_egl_display(), context, EGL.EGL_CONFIG_ID, ctypes.pointer(value)))
    except EGL.EGLError:  # EGL_BAD_CONTEXT: destroyed
        return False
    except glfw.GLFWError:  # GLFW terminated with its last window, destroying every context it made
        return False


@pytest.mark.parametrize("case", _params(list(CASES)))
def test_a_gl_owner_follows_the_protocol(gl_context: Any, case: str) -> None:
    c = CASES[case]
    owner = c.make(gl_context)
    names = c.names(owner)
    assert isinstance(owner, Lifecycle) and not owner.is_closed and "closed=False" in repr(owner)
    assert names and all(_alive(*n) for n in names)
    owner.close()
    owner.close()
    assert owner.is_closed and "closed=True" in repr(owner)
    assert not any(_alive(*n) for n in names)  # close() deleted its GL names
    with pytest.raises(InteropError, match="closed"):
        c.use(owner)
    with pytest.raises(RuntimeError, match="boom"), c.make(gl_context) as other:
        raise RuntimeError("boom")
    assert other.is_closed


@pytest.mark.parametrize("case", _params([n for n, c in CASES.items() if c.warns]))
def test_an_unclosed_gl_owner_warns_and_leaves_its_names_to_the_context(gl_context: Any, case: str) -> None:
    c = CASES[case]
    owner = c.make(gl_context)
    names = c.names(owner)
    reclaim = c.reclaim(owner) if c.reclaim is not None else None
    with pytest.warns(ResourceWarning) as record:  # parts of a composite warn too (see _lifecycle)
        del owner
        gc.collect()
    assert any(str(w.message).startswith(f"unclosed {case}") and "GL names leak" in str(w.message) for w in record)
    assert all(_alive(*n) for n in names)  # no GL call from the finalizer: the names die with the context
    if reclaim is not None:
        reclaim()


@pytest.mark.parametrize("case", _params([n for n, c in CASES.items() if not c.gpu]))
def test_a_gl_owner_is_closed_on_its_own_thread_only(gl_context: Any, case: str) -> None:
    owner = CASES[case].make(None)
    names = CASES[case].names(owner)
    errors: list[BaseException] = []

    def close_elsewhere() -> None:
        try:
            owner.close()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=close_elsewhere)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], InteropError)
    assert not owner.is_closed and all(_alive(*n) for n in names)
    owner.close()
    assert owner.is_closed
