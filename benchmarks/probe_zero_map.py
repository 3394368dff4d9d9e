#!/usr/bin/env python3
"""Probe: the zero-map ring in the demo patch — what GL sees, and what each ring call costs."""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cudapatch.host_plugin.hosts.standalone import StandaloneHost  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402


def med(fn, n=300, before=None):
    t = []
    for _ in range(n):
        if before:
            before()
        a = time.perf_counter_ns()
        fn()
        t.append(time.perf_counter_ns() - a)
    return statistics.median(t) / 1e3


def main() -> None:
    from OpenGL import GL

    for capacity in (200_000, 1_048_576):
        host = StandaloneHost(None)
        host.adapter.set_param("emit", "Capacity", capacity)
        ctx = EglContext(640, 360)
        host.engine.device.make_current()
        pv = host.open_preview(ctx, overlay=False)
        pv.run(60)
        ring = pv._ring
        eng = host.engine
        eng.synchronize()
        GL.glFinish()
        pv.frame()
        eng.synchronize()
        pv.frame()
        img = ctx.read_pixels()
        lit = (img[..., :3].astype(int).sum(axis=2) > 60).mean()
        out = eng.read(host.adapter.block("points"), "Points").view(np.float32)
        GL.glBindBuffer(GL.GL_ARRAY_BUFFER, pv.points_gl_buffer)
        glb = np.frombuffer(GL.glGetBufferSubData(GL.GL_ARRAY_BUFFER, 0, out.nbytes), np.float32)
        alive = int((out.reshape(-1, 4)[: out.size // 8, 3] > 0).sum())
        gl_alive = int((glb.reshape(-1, 4)[: glb.size // 8, 3] > 0).sum())
        print(
            f"capacity {capacity}: lit {lit:.4f}, dropped {ring.dropped}, front {ring.front_slot}, "
            f"written {ring._written}, alive engine {alive} GL {gl_alive}",
            flush=True,
        )
        src = eng.output(host.adapter.block("points"), "Points")
        s = eng.device.stream

        def write(ring=ring, src=src, s=s):
            ring.write(src.ptr, src.nbytes, s)

        print(f"  ring.write {med(write, before=eng.synchronize):7.1f} µs", flush=True)
        print(f"  ring.front {med(ring.front, before=eng.synchronize):7.1f} µs", flush=True)
        print(f"  update     {med(eng.update, before=eng.synchronize):7.1f} µs", flush=True)
        print(f"  frame      {med(pv.frame, n=100, before=eng.synchronize):7.1f} µs", flush=True)
        pv.close()
        host.preview = None
        ctx.close()
        host.close()


if __name__ == "__main__":
    main()
