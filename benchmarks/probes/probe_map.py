#!/usr/bin/env python3
"""Probe: what a GL map/unmap pair costs on this machine, by resource kind, flags and grouping.

Usage: ``PYOPENGL_PLATFORM=egl python benchmarks/probes/probe_map.py``
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.interop import EglContext, ResourceGroup, SharedBuffer, SharedTexture2D  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402


def med(fn, n=500):
    t = []
    for _ in range(n):
        a = time.perf_counter_ns()
        fn()
        t.append(time.perf_counter_ns() - a)
    return statistics.median(t) / 1e3


def main() -> None:
    ctx = EglContext(64, 64)
    eng = Engine()
    ctx.make_current()
    eng.device.make_current()
    s = eng.device.stream
    for flags in ("none", "write_discard", "read_only"):
        b = SharedBuffer.create(1 << 20, flags=flags)
        h = b.handle

        def pair(h=h, st=s):
            check(d.cuGraphicsMapResources(1, h, st))
            check(d.cuGraphicsUnmapResources(1, h, st))

        def pair_null(h=h):
            check(d.cuGraphicsMapResources(1, h, 0))
            check(d.cuGraphicsUnmapResources(1, h, 0))

        print(
            f"buffer {flags:14s} engine stream {med(pair):8.1f} µs   null stream {med(pair_null):8.1f} µs", flush=True
        )
        b.close()
    t = SharedTexture2D.create(256, 256, flags="write_discard")
    th = t.handle

    def tex_pair():
        check(d.cuGraphicsMapResources(1, th, s))
        check(d.cuGraphicsUnmapResources(1, th, s))

    print(f"texture write_discard          {med(tex_pair):8.1f} µs")
    b1, b2 = SharedBuffer.create(1 << 20), SharedBuffer.create(1 << 20)
    g = ResourceGroup([b1, b2, t])

    def grp():
        g.map(stream=s)
        g.unmap()

    print(f"group of 3 (one call each)     {med(grp):8.1f} µs", flush=True)
    from OpenGL import GL

    def with_finish():
        GL.glFinish()

    print(f"glFinish alone                 {med(with_finish):8.1f} µs", flush=True)
    print(f"cuStreamSynchronize alone      {med(lambda: check(d.cuStreamSynchronize(s))):8.1f} µs", flush=True)
    # the same pair after the engine has launched graphs on the stream, and the bridge's frame
    from cudapatch.blocks.library import CustomKernel
    from cudapatch.interop import GlBridge

    code = (
        'extern "C" __global__ void k(unsigned int* o, unsigned int n) '
        "{ unsigned i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) o[i] = i; }"
    )
    blk = eng.add(CustomKernel(Code=code))
    blk.set("Count", 256 * 256)
    eng.wait_ready()
    for _ in range(100):
        eng.update()
    eng.synchronize()
    b3 = SharedBuffer.create(256 * 256 * 4)
    h3 = b3.handle

    def pair3():
        check(d.cuGraphicsMapResources(1, h3, s))
        check(d.cuGraphicsUnmapResources(1, h3, s))

    print(f"buffer pair after graph launches   {med(pair3):8.1f} µs", flush=True)
    base = med(eng.update)
    eng.synchronize()
    br = GlBridge(eng)
    br.show_buffer(blk, "o", b3)
    with_br = med(eng.update)
    eng.synchronize()
    print(f"update {base:8.1f} µs, with bridge (1 buffer) {with_br:8.1f} µs", flush=True)

    def upd_sync():
        eng.update()
        eng.synchronize()

    print(f"update+sync with bridge            {med(upd_sync):8.1f} µs", flush=True)
    br.close()
    print(f"update+sync without bridge         {med(upd_sync):8.1f} µs", flush=True)
    ext = ctx.has_extension("GL_EXT_memory_object_fd"), ctx.has_extension("GL_EXT_semaphore_fd")
    print("GL_EXT_memory_object_fd, GL_EXT_semaphore_fd:", ext, flush=True)


if __name__ == "__main__":
    main()
