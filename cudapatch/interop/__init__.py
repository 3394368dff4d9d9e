"""CUDA–OpenGL interop: GL contexts (headless EGL, GLFW window), GL buffers and textures shared with
CUDA, the bridge that maps them around an engine's launch, the preview and the imgui overlay.

Importing this package imports neither OpenGL, GLFW nor imgui: they load when a context, resource
or overlay is created. Set ``PYOPENGL_PLATFORM=egl`` before anything imports OpenGL to use
``EglContext`` (entry points and tests do; the library never sets it).
"""

from .bridge import GlBridge
from .context import EglContext, GlContext
from .png import read_png, write_png
from .shared import BufferMapping, RegisterFlags, ResourceGroup, SharedBuffer, SharedTexture2D, TextureMapping
from .window import GlfwWindow

__all__ = [
    "BufferMapping",
    "EglContext",
    "GlBridge",
    "GlContext",
    "GlfwWindow",
    "RegisterFlags",
    "ResourceGroup",
    "SharedBuffer",
    "SharedTexture2D",
    "TextureMapping",
    "read_png",
    "write_png",
]
