"""GL drawing for the preview: a point cloud from a vertex buffer, and a textured full-screen quad.

GL 3.3 core. Points: the buffer holds ``capacity`` positions ``(x, y, z, size)`` followed by
``capacity`` colors ``(r, g, b, a)`` (what the ToPoints block writes); a size of 0 hides a point.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._lifecycle import HandleOwner
from ..errors import InteropError
from ._gl import check_gl, gl

__all__ = ["PointRenderer", "TextureRenderer", "orbit_camera"]

_POINT_VS = """#version 330 core
layout(location = 0) in vec4 position;   // xyz, size (0: dead)
layout(location = 1) in vec4 color;
uniform mat4 view_proj;
uniform float pixel_scale;
out vec4 v_color;
out float v_soft;
void main() {
    v_color = color;
    v_soft = 0.0;
    if (position.w <= 0.0) { gl_Position = vec4(2.0, 2.0, 2.0, 1.0); gl_PointSize = 1.0; return; }
    gl_Position = view_proj * vec4(position.xyz, 1.0);
    float size = position.w * pixel_scale / max(gl_Position.w, 0.1);
    gl_PointSize = max(1.0, size);
    v_soft = size >= 3.0 ? 1.0 : 0.0;  // points of a pixel or two are drawn solid, not with a falloff
}
"""
_POINT_FS = """#version 330 core
in vec4 v_color;
in float v_soft;
out vec4 frag;
void main() {
    vec2 d = gl_PointCoord * 2.0 - 1.0;
    float falloff = mix(1.0, clamp(1.0 - dot(d, d), 0.0, 1.0), v_soft);
    frag = vec4(v_color.rgb * v_color.a * falloff, 1.0);
}
"""
_QUAD_VS = """#version 330 core
out vec2 uv;
void main() {
    vec2 p = vec2((gl_VertexID << 1) & 2, gl_VertexID & 2);   // one triangle covering the screen
    uv = p;
    gl_Position = vec4(p * 2.0 - 1.0, 0.0, 1.0);
}
"""
_QUAD_FS = """#version 330 core
in vec2 uv;
uniform sampler2D image;
out vec4 frag;
void main() { frag = texture(image, vec2(uv.x, 1.0 - uv.y)); }
"""


def _program(vs: str, fs: str, what: str) -> int:
    GL = gl()
    return compile_program(((GL.GL_VERTEX_SHADER, vs), (GL.GL_FRAGMENT_SHADER, fs)), what)


def compile_program(stages: Sequence[tuple[int, str]], what: str) -> int:
    """Compile and link a GL program from ``(shader kind, source)`` stages; returns its name.

    Raises:
        InteropError: a stage does not compile or the program does not link (with GL's log).
    """
    GL = gl()
    prog = GL.glCreateProgram()
    shaders = []
    try:
        for kind, src in stages:
            sh = GL.glCreateShader(kind)
            shaders.append(sh)
            GL.glShaderSource(sh, src)
            GL.glCompileShader(sh)
            if not GL.glGetShaderiv(sh, GL.GL_COMPILE_STATUS):
                log = GL.glGetShaderInfoLog(sh).decode(errors="replace")
                raise InteropError(f"{what}: shader does not compile: {log}")
            GL.glAttachShader(prog, sh)
        GL.glLinkProgram(prog)
        if not GL.glGetProgramiv(prog, GL.GL_LINK_STATUS):
            log = GL.glGetProgramInfoLog(prog).decode(errors="replace")
            raise InteropError(f"{what}: program does not link: {log}")
    except Exception:
        GL.glDeleteProgram(prog)
        raise
    finally:
        for sh in shaders:
            GL.glDeleteShader(sh)
    return int(prog)


def orbit_camera(angle: float, aspect: float, *, distance: float = 3.2, height: float = 0.6) -> np.ndarray:
    """A perspective view-projection matrix (column-major for GL) orbiting the origin."""
    eye = np.array([math.sin(angle) * distance, height, math.cos(angle) * distance])
    target = np.array([0.0, 0.1, 0.0])
    f = target - eye
    f /= np.linalg.norm(f)
    s = np.cross(f, [0.0, 1.0, 0.0])
    s /= np.linalg.norm(s)
    u = np.cross(s, f)
    view = np.eye(4)
    view[0, :3], view[1, :3], view[2, :3] = s, u, -f
    view[:3, 3] = -view[:3, :3] @ eye
    near, far, fov = 0.05, 50.0, math.radians(45.0)
    t = 1.0 / math.tan(fov / 2)
    proj = np.zeros((4, 4))
    proj[0, 0], proj[1, 1] = t / aspect, t
    proj[2, 2], proj[2, 3], proj[3, 2] = (far + near) / (near - far), 2 * far * near / (near - far), -1.0
    return np.ascontiguousarray((proj @ view).T, dtype=np.float32)


class PointRenderer(HandleOwner):
    """Draws ``capacity`` points from a GL buffer (positions, then colors), additively.

    ``buffers`` may list several GL buffers of the same layout (a ring): ``draw(..., which=i)``
    draws the i-th; each gets its own vertex array, so switching costs nothing. The buffers stay
    their owner's; the program and vertex arrays are this renderer's, a GL ``HandleOwner``
    (``cudapatch._lifecycle``): ``close()`` it on the thread that made it, with its context current.

    Raises:
        InteropError: a shader does not compile or GL recorded an error.
    """

    _closed_error = InteropError

    def __init__(self, buffers: int | list[int], capacity: int) -> None:
        GL = gl()
        self.capacity = int(capacity)
        self.vaos: list[int] = []
        self.program = _program(_POINT_VS, _POINT_FS, "point renderer")
        try:
            self._setup(GL, [buffers] if isinstance(buffers, int) else list(buffers))
        except Exception:
            self.close()
            raise
        self._arm(f"PointRenderer ({len(self.vaos)} vertex arrays)", gl_names=True)

    def _setup(self, GL: Any, names: list[int]) -> None:
        self._u_view_proj = GL.glGetUniformLocation(self.program, "view_proj")
        self._u_scale = GL.glGetUniformLocation(self.program, "pixel_scale")
        self.vaos = [int(v) for v in np.atleast_1d(GL.glGenVertexArrays(len(names)))]
        self._index = {}
        for i, (vao, buffer) in enumerate(zip(self.vaos, names, strict=True)):
            GL.glBindVertexArray(vao)
            GL.glBindBuffer(GL.GL_ARRAY_BUFFER, buffer)
            GL.glEnableVertexAttribArray(0)
            GL.glVertexAttribPointer(0, 4, GL.GL_FLOAT, GL.GL_FALSE, 16, ctypes.c_void_p(0))
            GL.glEnableVertexAttribArray(1)
            GL.glVertexAttribPointer(1, 4, GL.GL_FLOAT, GL.GL_FALSE, 16, ctypes.c_void_p(16 * self.capacity))
            self._index[buffer] = i
        GL.glBindVertexArray(0)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, 0)
        check_gl("creating the point renderer")

    def index_of(self, buffer: int) -> int:
        """Which vertex array draws GL buffer ``buffer``."""
        return self._index[buffer]

    def draw(self, view_proj: np.ndarray, viewport_height: int, which: int = 0) -> None:
        """Draw all points with additive blending (the caller has bound the target framebuffer).

        Raises:
            InteropError: the renderer is closed.
        """
        if self._closed:
            self._check_open("PointRenderer.draw")
        GL = gl()
        GL.glUseProgram(self.program)
        GL.glUniformMatrix4fv(self._u_view_proj, 1, GL.GL_FALSE, view_proj)
        GL.glUniform1f(self._u_scale, viewport_height / 540.0)
        GL.glEnable(GL.GL_PROGRAM_POINT_SIZE)
        GL.glEnable(GL.GL_BLEND)
        GL.glBlendFunc(GL.GL_ONE, GL.GL_ONE)
        GL.glDisable(GL.GL_DEPTH_TEST)
        GL.glBindVertexArray(self.vaos[which])
        GL.glDrawArrays(GL.GL_POINTS, 0, self.capacity)
        GL.glBindVertexArray(0)
        GL.glDisable(GL.GL_BLEND)
        GL.glUseProgram(0)

    def _release(self) -> None:
        """Delete the vertex arrays and the program (``close``)."""
        GL = gl()
        if self.vaos:
            GL.glDeleteVertexArrays(len(self.vaos), self.vaos)
            self.vaos = []
        if self.program:
            GL.glDeleteProgram(self.program)
            self.program = 0

    def _forget(self) -> None:
        self.vaos, self.program = [], 0

    def __repr__(self) -> str:
        return f"<PointRenderer capacity={self.capacity} buffers={len(self.vaos)} closed={self._closed}>"


class TextureRenderer(HandleOwner):
    """Draws a 2-D texture over the whole viewport. A GL ``HandleOwner`` like ``PointRenderer``.

    Raises:
        InteropError: a shader does not compile.
    """

    _closed_error = InteropError

    def __init__(self) -> None:
        GL = gl()
        self.vao = 0
        self.program = _program(_QUAD_VS, _QUAD_FS, "texture renderer")
        try:
            self.vao = int(GL.glGenVertexArrays(1))
        except Exception:
            self.close()
            raise
        self._arm("TextureRenderer", gl_names=True)

    def draw(self, texture: int) -> None:
        """Draw ``texture`` (a GL 2-D texture name) over the viewport.

        Raises:
            InteropError: the renderer is closed.
        """
        if self._closed:
            self._check_open("TextureRenderer.draw")
        GL = gl()
        GL.glUseProgram(self.program)
        GL.glActiveTexture(GL.GL_TEXTURE0)
        GL.glBindTexture(GL.GL_TEXTURE_2D, texture)
        GL.glBindVertexArray(self.vao)
        GL.glDrawArrays(GL.GL_TRIANGLES, 0, 3)
        GL.glBindVertexArray(0)
        GL.glUseProgram(0)

    def _release(self) -> None:
        """Delete the vertex array and the program (``close``)."""
        GL = gl()
        if self.vao:
            GL.glDeleteVertexArrays(1, [self.vao])
            self.vao = 0
        if self.program:
            GL.glDeleteProgram(self.program)
            self.program = 0

    def _forget(self) -> None:
        self.vao = self.program = 0

    def __repr__(self) -> str:
        return f"<TextureRenderer closed={self._closed}>"
