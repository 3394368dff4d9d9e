#!/usr/bin/env python3
"""Diagnostic: where the embedded demo's preview frame spends its GPU time, frame by frame: the
engine's launch (update + synchronize) apart from GL's point draw (draw + glFinish), at a few
framebuffer sizes, with the point sizes the demo writes.

Usage: python benchmarks/probe_draw.py [WxH ...]   (default 640x360 1280x720 1920x1080)
"""

from __future__ import annotations

import faulthandler
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from cudapatch.host_plugin.hosts.standalone import StandaloneHost  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402
from cudapatch.interop.render import orbit_camera  # noqa: E402


def ms(fn) -> float:
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def probe_size(host: StandaloneHost, w: int, h: int) -> None:
    from OpenGL import GL

    ctx = EglContext(w, h)
    host.engine.device.make_current()
    preview = host.open_preview(ctx, overlay=False)
    preview.zero_map = False
    eng = host.engine

    def launch() -> None:
        eng.update()
        eng.synchronize()

    for _ in range(3):
        launch()
        preview.frame()
        GL.glFinish()
        eng.synchronize()
    block, port = preview.points
    out = eng.read(block, port).view(np.float32).reshape(-1, 4)
    cap = out.shape[0] // 2
    size = out[:cap, 3]
    alive = size > 0
    print(
        f"{w}x{h}: {cap} points, {alive.sum()} alive, size min/median/max "
        f"{size[alive].min() if alive.any() else 0:.3g}/{np.median(size[alive]) if alive.any() else 0:.3g}/"
        f"{size.max():.3g} (x {h / 540:.2f} px / depth)",
        flush=True,
    )
    renderer = preview._point_renderer
    vp = orbit_camera(math.pi * 0.15, w / h)

    def draw() -> None:
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, ctx.framebuffer)
        GL.glViewport(0, 0, w, h)
        GL.glClear(GL.GL_COLOR_BUFFER_BIT)
        renderer.draw(vp, h, 0)
        GL.glFinish()

    def clear_only() -> None:
        GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, ctx.framebuffer)
        GL.glClear(GL.GL_COLOR_BUFFER_BIT)
        GL.glFinish()

    for n in range(4):
        a, b, c = ms(launch), ms(draw), ms(clear_only)
        f = ms(lambda: (preview.frame(), GL.glFinish(), eng.synchronize()))
        print(
            f"  frame {n}: engine {a:.2f} ms, point draw {b:.2f} ms, clear {c:.2f} ms, whole frame {f:.2f} ms",
            flush=True,
        )
    preview.close()
    host.preview = None
    ctx.close()


def main() -> None:

    sizes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1:] or ["640x360", "1280x720", "1920x1080"])]
    faulthandler.dump_traceback_later(100, exit=True)  # a hung GPU prints where, instead of hanging
    with StandaloneHost(None) as host:
        for w, h in sizes:
            probe_size(host, w, h)


if __name__ == "__main__":
    main()
