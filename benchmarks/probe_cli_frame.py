#!/usr/bin/env python3
"""Diagnostic: the embedded demo as ``cudapatch run --headless`` runs it, with the zero-map ring's
state and what the engine output, the ring buffer GL draws and the framebuffer hold at the end."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cudapatch.host_plugin.hosts.standalone import StandaloneHost  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402
from cudapatch.kernels._driver import driver  # noqa: E402


def main() -> None:
    frames = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    with StandaloneHost(None) as host:
        ctx = EglContext(640, 360)
        host.engine.device.make_current()
        preview = host.open_preview(ctx, overlay=False)
        for n in range(frames):
            preview.frame(settle=n == frames - 1)
        pixels = ctx.read_pixels()
        lit = (pixels[..., :3].astype(int).sum(axis=2) > 60).mean()
        r = preview._ring
        block, port = preview.points
        out = host.engine.read(block, port)
        print(
            f"engine output {port}: shape {out.shape} finite {np.isfinite(out).mean():.3f} "
            f"min {np.nanmin(out):.3g} max {np.nanmax(out):.3g} nonzero {np.count_nonzero(out)}"
        )
        if r is not None:
            print(
                f"ring: issued {r._issued} done {r._done.value} dropped {r.dropped} front {r.front_slot} "
                f"tags {r._written} GL busy {r._gl_busy}"
            )
            buf = r.buffers[r.front_slot]
            host_copy = np.empty(buf.nbytes // 4, np.float32)
            driver().cuMemcpyDtoH(host_copy.ctypes.data, buf.ptr, buf.nbytes)
            print(
                f"front buffer: nonzero {np.count_nonzero(host_copy)} of {host_copy.size}, "
                f"equal to the output {np.array_equal(host_copy[: out.size], out.ravel()[: host_copy.size])}"
            )
        states = ", ".join(f"{b.name} {b.state}" for b in host.engine.stats().blocks)
        print(f"framebuffer lit {lit:.4f}; blocks {states}")
        from cudapatch.interop._gl import gl

        GL = gl()
        print(
            f"GL error after the frames: {GL.glGetError():#x}; "
            f"draws buffer {r.buffers[r.front_slot].gl_name if r else None}"
        )
        GL.glFinish()
        if r is not None:
            name = r.buffers[r.front_slot].gl_name
            GL.glBindBuffer(GL.GL_ARRAY_BUFFER, name)
            seen = np.frombuffer(GL.glGetBufferSubData(GL.GL_ARRAY_BUFFER, 0, r.nbytes), np.float32)
            print(
                f"GL's view of buffer {name}: nonzero {np.count_nonzero(seen)}, "
                f"same bytes {np.array_equal(seen, host_copy)}"
            )
            pr = preview._point_renderer
            print(f"renderer: capacity {pr.capacity}, index of {name}: {pr.index_of(name)}, frames {preview.frames}")
        preview.frame(settle=True)
        GL.glFinish()
        again = (ctx.read_pixels()[..., :3].astype(int).sum(axis=2) > 60).mean()
        print(f"one more settled frame after glFinish: lit {again:.4f}; front {r.front_slot if r else None}")
        preview.close()
        ctx.close()


if __name__ == "__main__":
    main()
