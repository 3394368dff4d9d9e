"""``GlfwWindow``: a visible window with an OpenGL 3.3 core context, for the preview.

Works on Linux (X11/Wayland), Windows and macOS. pyGLFW turns GLFW errors into warnings by
default; we make them exceptions on purpose (``glfw.ERROR_REPORTING = "raise"``) and translate
them into ``InteropError`` naming what failed.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from .._lifecycle import HandleOwner
from ..errors import InteropError
from . import _platform
from ._gl import pyopengl_platform
from .context import GlContext

__all__ = ["GlfwWindow"]

log = logging.getLogger("cudapatch.interop")
_glfw_lock = threading.Lock()
_glfw_users = 0


def _glfw() -> Any:
    try:
        import glfw
    except ImportError as exc:
        raise InteropError(f"GLFW is not installed ({exc}): pip install glfw (the 'gl' extra)") from exc
    glfw.ERROR_REPORTING = "raise"
    return glfw


class GlfwWindow(GlContext):
    """A window with a GL 3.3 core context, current on the creating thread.

    A GL ``HandleOwner`` (``cudapatch._lifecycle``): ``close()`` destroys the window and its context,
    on the thread that made it (GLFW allows no other: the preview and the CLI close theirs on the
    thread that runs the frames); a window nobody closed only warns (``ResourceWarning``) and lives
    until the process ends.

    Args:
        width, height: Window size in screen coordinates.
        title: Window title.
        visible: False creates a hidden window (tests); it still has a default framebuffer.
        vsync: Swap interval 1 (True) or 0.

    Raises:
        InteropError: no display (``DISPLAY``/``WAYLAND_DISPLAY`` unset: use ``--headless``), no GLFW,
            or the driver cannot make a GL 3.3 core context.
    """

    _closed_error = InteropError

    def __init__(
        self,
        width: int = 1280,
        height: int = 720,
        title: str = "cudapatch",
        *,
        visible: bool = True,
        vsync: bool = False,
    ) -> None:
        global _glfw_users
        super().__init__()
        if not _platform.display_available():
            raise InteropError("GlfwWindow: no display (DISPLAY and WAYLAND_DISPLAY are unset); run with --headless")
        glfw = self._glfw = _glfw()
        with _glfw_lock:
            try:
                if _glfw_users == 0 and not glfw.init():
                    raise InteropError("GlfwWindow: glfw.init() failed")
                _glfw_users += 1
            except glfw.GLFWError as exc:
                raise InteropError(f"GlfwWindow: GLFW cannot start: {exc}") from exc
        try:
            glfw.default_window_hints()
            glfw.window_hint(glfw.CONTEXT_VERSION_MAJOR, 3)
            glfw.window_hint(glfw.CONTEXT_VERSION_MINOR, 3)
            glfw.window_hint(glfw.OPENGL_PROFILE, glfw.OPENGL_CORE_PROFILE)
            glfw.window_hint(glfw.OPENGL_FORWARD_COMPAT, True)
            glfw.window_hint(glfw.VISIBLE, visible)
            if pyopengl_platform() == "egl":  # PyOpenGL loads GL through EGL: the context must be an EGL one
                glfw.window_hint(glfw.CONTEXT_CREATION_API, glfw.EGL_CONTEXT_API)
            self.handle = glfw.create_window(width, height, title, None, None)
        except glfw.GLFWError as exc:
            self._release_glfw()
            raise InteropError(f"GlfwWindow: cannot create a {width}x{height} GL 3.3 core window: {exc}") from exc
        try:
            glfw.make_context_current(self.handle)
            glfw.swap_interval(1 if vsync else 0)
            self._size = tuple(glfw.get_framebuffer_size(self.handle))  # type: ignore[assignment]
        except glfw.GLFWError as exc:
            glfw.destroy_window(self.handle)
            self._release_glfw()
            raise InteropError(f"GlfwWindow: cannot make the {width}x{height} window's context current: {exc}") from exc
        self._arm(f"GlfwWindow ({width}x{height} {title!r})", gl_names=True)
        log.info("GLFW window %dx%d (%s)", *self._size, self.info()["renderer"])

    @property
    def size(self) -> tuple[int, int]:
        self._check_open("size")
        self._size = tuple(self._glfw.get_framebuffer_size(self.handle))  # type: ignore[assignment]
        return self._size

    @property
    def should_close(self) -> bool:
        """True once the user closed the window (or pressed the close shortcut)."""
        return self._closed or bool(self._glfw.window_should_close(self.handle))

    def poll_events(self) -> None:
        """Process pending window events (input callbacks run here)."""
        self._glfw.poll_events()

    def make_current(self) -> None:
        self._check_open("make_current")
        self._glfw.make_context_current(self.handle)

    def swap(self) -> None:
        self._check_open("swap")
        self._glfw.swap_buffers(self.handle)

    def close(self) -> None:
        """Destroy the window and its GL context (idempotent; on the thread that made it).

        Raises:
            InteropError: called from another thread (the window stays open).
        """
        HandleOwner.close(self)

    def _release(self) -> None:
        self._glfw.destroy_window(self.handle)
        self._release_glfw()

    def _forget(self) -> None:
        """Drop the window undestroyed (no GLFW call; GLFW stays initialised)."""
        self.handle = None

    def _release_glfw(self) -> None:
        global _glfw_users
        with _glfw_lock:
            _glfw_users -= 1
            if _glfw_users <= 0:
                _glfw_users = 0
                self._glfw.terminate()

    def __repr__(self) -> str:
        return f"<GlfwWindow {self._size[0]}x{self._size[1]} closed={self._closed}>"
