"""CUDA–OpenGL interop (GL buffers/textures shared with CUDA, EGL/GLFW contexts, preview, overlay).

Not built yet; importing this package never imports OpenGL, GLFW or imgui.
"""

__all__: list[str] = []
