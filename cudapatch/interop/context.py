"""GL context providers: one interface for the headless EGL context and the GLFW window.

``GlContext`` is what the preview, the overlay and shared resources need: ``make_current()``,
``size``, ``swap()`` (present, or flush when headless), ``read_pixels()`` and ``close()``.
``EglContext`` is headless: it renders into its own framebuffer object, on the GPU's driver when
the EGL device matching the CUDA device can be found (``EGL_NV_device_cuda``).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

import numpy as np

from .._lifecycle import HandleOwner, Releases
from ..errors import InteropError
from . import _platform
from ._gl import check_gl, gl, pyopengl_platform

__all__ = ["GlContext", "EglContext"]

log = logging.getLogger("cudapatch.interop")

_EGL_CUDA_DEVICE_NV = 0x323A
# EGL displays are per-device singletons: two contexts on one device share a display, so it is
# terminated only when its last context closes.
_display_users: dict[int, int] = {}
_display_lock = threading.RLock()  # re-entrant: a finalizer may run (gc) on a thread that holds it
_EGL_PLATFORM_SURFACELESS_MESA = 0x31DD


def _display_key(display: Any) -> int:
    return int(ctypes.cast(display, ctypes.c_void_p).value or 0)


def _release_display(EGL: Any, display: Any) -> tuple[int]:
    """One context fewer on ``display``: terminated with its last (a result tuple, as ``Releases`` takes)."""
    key = _display_key(display)
    with _display_lock:
        _display_users[key] = _display_users.get(key, 1) - 1
        last = _display_users[key] <= 0
        if last:
            del _display_users[key]
    if last:
        EGL.eglTerminate(display)
    return (0,)


def _destroy_context(EGL: Any, display: Any, context: Any) -> tuple[int]:
    """``eglDestroyContext``: thread-safe, and deferred by EGL while the context is current on some
    thread, so a finalizer may call it (it makes no GL call; the framebuffer names go with the context)."""
    EGL.eglDestroyContext(display, context)
    return (0,)


def _cuda_ordinal(EGL: Any, device: Any) -> int | None:
    """The CUDA device ordinal of an EGL device (``EGL_NV_device_cuda``), or None.

    Called through ``eglGetProcAddress``: PyOpenGL's wrapper checks the extension against the
    current display, and there is none yet (EGL_NOT_INITIALIZED)."""
    try:
        addr = EGL.eglGetProcAddress(b"eglQueryDeviceAttribEXT")
        if not addr:
            return None
        proto = ctypes.CFUNCTYPE(ctypes.c_uint, ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_ssize_t))
        fn = proto(ctypes.cast(addr, ctypes.c_void_p).value)
        value = ctypes.c_ssize_t(-1)
        if fn(ctypes.cast(device, ctypes.c_void_p), _EGL_CUDA_DEVICE_NV, ctypes.byref(value)):
            return int(value.value)
    except (ctypes.ArgumentError, TypeError, AttributeError) as exc:
        log.debug("EGL_CUDA_DEVICE_NV query failed: %s", exc)
    return None


class GlContext(HandleOwner):
    """Base of the context providers. Subclasses create the context and call ``_init_target()``.

    Objects owning GL names must release them on the thread that owns the context: ``owner_thread``.
    A closed context raises ``InteropError`` from every use (``cudapatch._lifecycle``).
    """

    _closed_error = InteropError

    def __init__(self) -> None:
        self._closed = False
        self.owner_thread = threading.get_ident()
        self._fbo = 0
        self._fbo_attachments: tuple[int, int] = (0, 0)
        self._size = (0, 0)

    # -- interface ---------------------------------------------------------------------------
    @property
    def size(self) -> tuple[int, int]:
        """Framebuffer size ``(width, height)`` in pixels."""
        return self._size

    @property
    def is_closed(self) -> bool:
        return self._closed

    @property
    def framebuffer(self) -> int:
        """The GL framebuffer to draw into (0: the window's)."""
        return self._fbo

    def make_current(self) -> None:
        """Make this context current on the calling thread.

        Raises:
            InteropError: the context is closed or the platform refused.
        """
        raise NotImplementedError

    def swap(self) -> None:
        """Present the frame (windows) or flush (headless)."""
        raise NotImplementedError

    def read_pixels(self) -> np.ndarray:
        """The current framebuffer as an ``(height, width, 4)`` uint8 RGBA array, top row first.

        Raises:
            InteropError: the context is closed.
        """
        self._check_open("read_pixels")
        GL = gl()
        w, h = self.size
        GL.glBindFramebuffer(GL.GL_READ_FRAMEBUFFER, self._fbo)
        GL.glPixelStorei(GL.GL_PACK_ALIGNMENT, 1)
        data = GL.glReadPixels(0, 0, w, h, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE)
        check_gl("glReadPixels")
        return np.frombuffer(data, np.uint8).reshape(h, w, 4)[::-1].copy()

    def close(self) -> None:
        """Release the context (idempotent)."""
        raise NotImplementedError

    def __enter__(self) -> GlContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- offscreen target ------------------------------------------------------------------------
    def _init_target(self, width: int, height: int) -> None:
        """An RGBA8 + depth framebuffer object: headless contexts draw into it."""
        GL = gl()
        fbo = int(GL.glGenFramebuffers(1))
        color, depth = (int(x) for x in GL.glGenRenderbuffers(2))
        GL.glBindRenderbuffer(GL.GL_RENDERBUFFER, color)
        GL.glRenderbufferStorage(GL.GL_RENDERBUFFER, GL.GL_RGBA8, width, height)
        GL.glBindRenderbuffer(GL.GL_RENDERBUFFER, depth)
        GL.glRenderbufferStorage(GL.GL_RENDERBUFFER, GL.GL_DEPTH24_STENCIL8, width, height)
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, fbo)
        GL.glFramebufferRenderbuffer(GL.GL_FRAMEBUFFER, GL.GL_COLOR_ATTACHMENT0, GL.GL_RENDERBUFFER, color)
        GL.glFramebufferRenderbuffer(GL.GL_FRAMEBUFFER, GL.GL_DEPTH_STENCIL_ATTACHMENT, GL.GL_RENDERBUFFER, depth)
        status = GL.glCheckFramebufferStatus(GL.GL_FRAMEBUFFER)
        if status != GL.GL_FRAMEBUFFER_COMPLETE:
            raise InteropError(f"offscreen framebuffer {width}x{height} is incomplete (status {hex(status)})")
        GL.glViewport(0, 0, width, height)
        check_gl("creating the offscreen framebuffer")
        self._fbo, self._fbo_attachments = fbo, (color, depth)
        self._size = (width, height)

    def _release_target(self) -> None:
        if self._fbo:
            GL = gl()
            GL.glDeleteFramebuffers(1, [self._fbo])
            GL.glDeleteRenderbuffers(2, list(self._fbo_attachments))
            self._fbo = 0

    def info(self) -> dict[str, str]:
        """GL vendor, renderer and version strings of this context.

        Raises:
            InteropError: the context is closed.
        """
        self._check_open("info")
        GL = gl()
        return {
            "vendor": GL.glGetString(GL.GL_VENDOR).decode(),
            "renderer": GL.glGetString(GL.GL_RENDERER).decode(),
            "version": GL.glGetString(GL.GL_VERSION).decode(),
        }

    def has_extension(self, name: str) -> bool:
        """Whether the current GL context advertises extension ``name``.

        Raises:
            InteropError: the context is closed.
        """
        self._check_open("has_extension")
        GL = gl()
        n = int(GL.glGetIntegerv(GL.GL_NUM_EXTENSIONS))
        return any(GL.glGetStringi(GL.GL_EXTENSIONS, i).decode() == name for i in range(n))


class EglContext(GlContext):
    """A headless OpenGL 3.3+ core context through EGL, drawing into an offscreen framebuffer.

    Needs ``PYOPENGL_PLATFORM=egl`` set before OpenGL is first imported (the CLI does this for
    ``--headless``; tests set it in their conftest).

    Args:
        width, height: Size of the offscreen framebuffer.
        cuda_device: Prefer the EGL device driving this CUDA device ordinal (``EGL_NV_device_cuda``);
            otherwise the first EGL device, then Mesa's surfaceless platform.

    Lifecycle (``cudapatch._lifecycle``): ``close()`` deletes the framebuffer (with the context
    current), destroys the context and gives the display back (terminated with its last context). One
    nobody closed is destroyed by its finalizer, with a ``ResourceWarning``: EGL calls are
    thread-safe and EGL defers the destruction while the context is current somewhere; the
    finalizer makes no GL call (the framebuffer's names go with the context).

    Raises:
        InteropError: not on Linux, PyOpenGL is on another platform, or no EGL display/context.
    """

    def __init__(self, width: int = 640, height: int = 360, *, cuda_device: int | None = 0) -> None:
        super().__init__()
        if not _platform.HAS_EGL:
            raise InteropError("EglContext: headless EGL is only available on Linux; use GlfwWindow")
        if pyopengl_platform() != "egl":
            raise InteropError(
                "EglContext: PyOpenGL is set up for the "
                f"'{pyopengl_platform()}' platform; set PYOPENGL_PLATFORM=egl before OpenGL is imported"
            )
        try:
            from OpenGL import EGL
        except ImportError as exc:
            raise InteropError(f"EglContext: PyOpenGL's EGL bindings cannot load ({exc})") from exc
        self._egl = EGL
        self._display, self.device_name = self._open_display(cuda_device)
        key = _display_key(self._display)
        with _display_lock:
            _display_users[key] = _display_users.get(key, 0) + 1
        self._releases = Releases()  # EGL's, given back by the finalizer only (close makes its own calls)
        self._releases.push(_release_display, EGL, self._display, what="eglTerminate")
        try:
            self._create(width, height)
        except BaseException:
            self._releases.release_quietly()
            raise
        self._arm(f"EglContext {width}x{height} on {self.device_name}", releases=self._releases)
        log.info("EGL context %dx%d on %s (%s)", width, height, self.device_name, self.info()["renderer"])

    def _create(self, width: int, height: int) -> None:
        EGL = self._egl
        cfg = EGL.EGLConfig()
        n = EGL.EGLint()
        # Device displays have no window surfaces: ask for pbuffer configs (we draw into an FBO anyway).
        attrs = (EGL.EGLint * 5)(
            EGL.EGL_SURFACE_TYPE, EGL.EGL_PBUFFER_BIT, EGL.EGL_RENDERABLE_TYPE, EGL.EGL_OPENGL_BIT, EGL.EGL_NONE
        )
        if not EGL.eglChooseConfig(self._display, attrs, ctypes.pointer(cfg), 1, ctypes.pointer(n)) or n.value < 1:
            raise InteropError("EglContext: no EGL config supports desktop OpenGL")
        if not EGL.eglBindAPI(EGL.EGL_OPENGL_API):
            raise InteropError("EglContext: eglBindAPI(EGL_OPENGL_API) failed")
        ctx_attrs = (EGL.EGLint * 7)(
            EGL.EGL_CONTEXT_MAJOR_VERSION, 3, EGL.EGL_CONTEXT_MINOR_VERSION, 3,
            EGL.EGL_CONTEXT_OPENGL_PROFILE_MASK, EGL.EGL_CONTEXT_OPENGL_CORE_PROFILE_BIT, EGL.EGL_NONE,
        )  # fmt: skip
        self._context = EGL.eglCreateContext(self._display, cfg, EGL.EGL_NO_CONTEXT, ctx_attrs)
        if not self._context:
            raise InteropError(f"EglContext: eglCreateContext failed (0x{EGL.eglGetError():x})")
        self._releases.push(_destroy_context, EGL, self._display, self._context, what="eglDestroyContext")
        self.make_current()
        self._init_target(width, height)

    def _open_display(self, cuda_device: int | None) -> tuple[Any, str]:
        EGL = self._egl
        major, minor = EGL.EGLint(), EGL.EGLint()
        candidates: list[tuple[Any, str]] = []
        try:
            from OpenGL.EGL.EXT.device_enumeration import eglQueryDevicesEXT
            from OpenGL.EGL.EXT.device_query import eglQueryDeviceStringEXT
            from OpenGL.EGL.EXT.platform_base import eglGetPlatformDisplayEXT
            from OpenGL.EGL.EXT.platform_device import EGL_PLATFORM_DEVICE_EXT

            count = EGL.EGLint()
            eglQueryDevicesEXT(0, None, ctypes.pointer(count))
            devices = (EGL.EGLDeviceEXT * max(count.value, 1))()
            eglQueryDevicesEXT(count.value, devices, ctypes.pointer(count))
            ranked = []
            for i in range(count.value):
                exts = (eglQueryDeviceStringEXT(devices[i], EGL.EGL_EXTENSIONS) or b"").decode()
                rank = 2
                if "EGL_NV_device_cuda" in exts:
                    rank = 1
                    ordinal = _cuda_ordinal(EGL, devices[i])
                    if cuda_device is not None and ordinal is not None:
                        rank = 0 if ordinal == cuda_device else 1
                ranked.append((rank, i, exts))
            for rank, i, _exts in sorted(ranked):
                dpy = eglGetPlatformDisplayEXT(EGL_PLATFORM_DEVICE_EXT, devices[i], None)
                kind = "CUDA device" if rank < 2 else "EGL device"
                candidates.append((dpy, f"{kind} {i}"))
            candidates.append(
                (eglGetPlatformDisplayEXT(_EGL_PLATFORM_SURFACELESS_MESA, EGL.EGL_DEFAULT_DISPLAY, None), "surfaceless")
            )
        except (ImportError, AttributeError, TypeError) as exc:  # an EGL without the device extensions
            log.debug("EGL device enumeration unavailable: %s", exc)
        candidates.append((EGL.eglGetDisplay(EGL.EGL_DEFAULT_DISPLAY), "default display"))
        for dpy, name in candidates:
            if dpy and EGL.eglInitialize(dpy, ctypes.pointer(major), ctypes.pointer(minor)):
                return dpy, name
        raise InteropError("EglContext: no EGL display could be initialised (no GPU driver or Mesa EGL installed)")

    def make_current(self) -> None:
        self._check_open("make_current")
        EGL = self._egl
        if not EGL.eglMakeCurrent(self._display, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, self._context):
            raise InteropError(f"EglContext: eglMakeCurrent failed (0x{EGL.eglGetError():x})")

    def swap(self) -> None:
        self._check_open("swap")
        gl().glFlush()

    def close(self) -> None:
        """Delete the framebuffer, destroy the context and give the display back (idempotent).

        Raises:
            InteropError: the context could not be made current here to delete the framebuffer (it is
                destroyed all the same, and the framebuffer with it).
        """
        if self._closed:
            return
        EGL = self._egl
        try:
            self.make_current()
            self._release_target()
        finally:
            self._closed = True
            self._disarm()
            EGL.eglMakeCurrent(self._display, EGL.EGL_NO_SURFACE, EGL.EGL_NO_SURFACE, EGL.EGL_NO_CONTEXT)
            self._releases.release_quietly()  # eglDestroyContext, then the display

    def __repr__(self) -> str:
        return f"<EglContext {self._size[0]}x{self._size[1]} on {self.device_name} closed={self._closed}>"
