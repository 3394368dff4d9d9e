"""The OS-specific parts of interop, in one place.

Linux: headless GL through EGL; CUDA memory shared with GL as POSIX file descriptors
(``GL_EXT_memory_object_fd``). Windows (TouchDesigner): WGL windows through GLFW; the same
sharing uses Win32 handles (``GL_EXT_memory_object_win32``). Register/map works on both.
"""

from __future__ import annotations

import sys

__all__ = ["IS_WINDOWS", "HAS_EGL", "memory_object_extension", "display_available"]

IS_WINDOWS = sys.platform == "win32"
# EGL ships with the NVIDIA driver and Mesa on Linux; Windows drivers do not provide it.
HAS_EGL = sys.platform.startswith("linux")


def memory_object_extension() -> str:
    """The GL extension that imports CUDA-allocated memory on this OS."""
    return "GL_EXT_memory_object_win32" if IS_WINDOWS else "GL_EXT_memory_object_fd"


def display_available() -> bool:
    """Whether a window can be opened: Windows and macOS always; Linux needs X11 or Wayland."""
    if sys.platform != "linux":
        return True
    import os

    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
