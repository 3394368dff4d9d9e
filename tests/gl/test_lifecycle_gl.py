"""The lifecycle protocol (``cudapatch._lifecycle``) over every owner of GL names, in a real GL
context: double close, use after close, ``with``, a finalizer that warns and leaves the GL names
alone, and ``close()`` refused off the GL thread. The renderers need GL only; the owners that
share memory with CUDA need the GPU too."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from cudapatch._lifecycle import Lifecycle
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
    warns: bool = True  # a warning finalizer (SharedBuffer's predates the policy and unregisters silently)


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
CASES = {
    "PointRenderer": GlCase(
        _point_renderer,
        lambda r: r.draw(_IDENTITY, 100),
        lambda r: [("vao", v) for v in r.vaos] + [("program", r.program)],
        gpu=False,
    ),
    "TextureRenderer": GlCase(_texture_renderer, lambda r: r.draw(0), lambda r: [("program", r.program)], gpu=False),
    "ImportedBuffer": GlCase(_imported_buffer, lambda b: b.shares_memory(), lambda b: [("buffer", b.gl_name)]),
    "ImportedRing": GlCase(_imported_ring, lambda r: r.front(), lambda r: [("buffer", b.gl_name) for b in r.buffers]),
    "ImportedImage": GlCase(
        _imported_image, lambda i: i.front(), lambda i: [("texture", i.gl_name), ("program", i._program)]
    ),
    "SharedTexture2D": GlCase(_shared_texture, lambda t: t.handle, lambda t: [("texture", t.gl_name)], warns=False),
    "SharedBuffer": GlCase(_shared_buffer, lambda b: b.handle, lambda b: [("buffer", b.gl_name)], warns=False),
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

    test = {"buffer": GL.glIsBuffer, "program": GL.glIsProgram, "texture": GL.glIsTexture, "vao": GL.glIsVertexArray}
    return bool(test[kind](name))


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
    owner = CASES[case].make(gl_context)
    names = CASES[case].names(owner)
    with pytest.warns(ResourceWarning) as record:  # parts of a composite warn too (see _lifecycle)
        del owner
        gc.collect()
    assert any(str(w.message).startswith(f"unclosed {case}") and "GL names leak" in str(w.message) for w in record)
    assert all(_alive(*n) for n in names)  # no GL call from the finalizer: the names die with the context


def test_a_gl_owner_is_closed_on_its_own_thread_only(gl_context: Any) -> None:
    renderer = _point_renderer(None)
    errors: list[BaseException] = []

    def close_elsewhere() -> None:
        try:
            renderer.close()
        except BaseException as exc:  # handed to the test thread
            errors.append(exc)

    t = threading.Thread(target=close_elsewhere)
    t.start()
    t.join()
    assert len(errors) == 1 and isinstance(errors[0], InteropError)
    assert not renderer.is_closed and _alive("program", renderer.program)
    renderer.close()
    assert renderer.is_closed
