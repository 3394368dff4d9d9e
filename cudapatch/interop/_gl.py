"""Lazy access to PyOpenGL, so that ``import cudapatch`` never imports OpenGL.

PyOpenGL picks its platform (GLX, EGL, WGL) when it is first imported, from ``PYOPENGL_PLATFORM``.
The library never sets that variable: entry points and tests do (``cudapatch run --headless``
sets ``egl``), before anything imports OpenGL.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from ..errors import InteropError

__all__ = ["gl", "gl_function", "check_gl", "pyopengl_platform"]


def pyopengl_platform() -> str:
    """The platform PyOpenGL uses or will use: ``egl``, ``glx``, ``wgl``, ... (lower case)."""
    mod = sys.modules.get("OpenGL.platform")
    if mod is not None and getattr(mod, "PLATFORM", None) is not None:
        name = type(mod.PLATFORM).__name__.lower()  # EGLPlatform, GLXPlatform, ...
        return name.replace("platform", "")
    return os.environ.get("PYOPENGL_PLATFORM", "").lower() or ("wgl" if sys.platform == "win32" else "glx")


def gl() -> Any:
    """The ``OpenGL.GL`` module.

    Raises:
        InteropError: PyOpenGL is not installed.
    """
    try:
        import OpenGL

        # Per-call glGetError checks cost ~1 µs each; we check where it matters with check_gl().
        OpenGL.ERROR_CHECKING = os.environ.get("CUDAPATCH_GL_CHECKS", "0") == "1"
        from OpenGL import GL
    except ImportError as exc:
        raise InteropError(f"PyOpenGL is not installed ({exc}): pip install PyOpenGL (the 'gl' extra)") from exc
    return GL


def gl_function(name: str, restype: Any, *argtypes: Any) -> Any:
    """A GL entry point as a plain ctypes function, for calls made every frame: PyOpenGL's wrappers,
    even its ``raw`` ones, cost about 4x as much per call (measured: fence + delete 4.8 µs against
    1.2 µs). Resolved through the platform's ``GetProcAddress`` with a context current; the
    pointer is valid for that context's driver.

    Raises:
        InteropError: the driver does not have ``name``.
    """
    import ctypes

    gl()  # PyOpenGL configured and its platform loaded
    from OpenGL import platform

    address = platform.PLATFORM.getExtensionProcedure(name.encode())
    if not address:
        raise InteropError(f"the GL driver has no {name}")
    return ctypes.CFUNCTYPE(restype, *argtypes)(address)


_GL_ERRORS = {
    0x0500: "GL_INVALID_ENUM",
    0x0501: "GL_INVALID_VALUE",
    0x0502: "GL_INVALID_OPERATION",
    0x0505: "GL_OUT_OF_MEMORY",
    0x0506: "GL_INVALID_FRAMEBUFFER_OPERATION",
}


def check_gl(what: str) -> None:
    """Raise if GL recorded an error since the last check.

    Raises:
        InteropError: naming ``what`` and the GL error.
    """
    GL = gl()
    errors = []
    for _ in range(8):
        err = GL.glGetError()
        if err == 0:
            break
        errors.append(_GL_ERRORS.get(err, hex(err)))
    if errors:
        raise InteropError(f"{what}: {', '.join(errors)}")
