#!/usr/bin/env python3
"""Diagnostic: the zero-map ring frame by frame in the headless particle preview (requests issued,
copies done, drops, the slot GL draws and its fences)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cudapatch import Engine  # noqa: E402
from cudapatch.blocks.library import Emitter, Forces, Integrate, ToPoints  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402
from cudapatch.interop.preview import Preview  # noqa: E402


def main() -> None:
    ctx = EglContext(640, 360)
    engine = Engine(name="probe", wait_for_compile=True)
    ctx.make_current()
    e, f, i, t = (engine.add(cls()) for cls in (Emitter, Forces, Integrate, ToPoints))
    engine.connect(e, "Particles", f, "Particles")
    engine.connect(f, "Particles", i, "Particles")
    engine.connect(i, "Particles", t, "Particles")
    with Preview(engine, ctx, points=(t, "Points"), overlay=False, zero_map=True) as preview:
        for n in range(120):
            preview.frame()
            r = preview._ring
            if r is not None and (n < 20 or n % 10 == 0):
                print(
                    f"frame {n}: issued {r._issued} done {r._done.value} dropped {r.dropped} "
                    f"front {r.front_slot} tags {r._written} GL busy {r._gl_busy}",
                    flush=True,
                )
    gl_call_costs()
    engine.close()
    ctx.close()


def gl_call_costs() -> None:
    """Host µs of the GL calls a zero-map frame could use to know when GL is done with a buffer."""
    import ctypes
    import statistics
    import time

    from cudapatch.interop._gl import gl, gl_function

    GL = gl()
    sync = ctypes.c_void_p
    fence = gl_function("glFenceSync", sync, ctypes.c_uint, ctypes.c_uint)
    wait = gl_function("glClientWaitSync", ctypes.c_uint, sync, ctypes.c_uint, ctypes.c_uint64)
    delete = gl_function("glDeleteSync", None, sync)
    counter = gl_function("glQueryCounter", None, ctypes.c_uint, ctypes.c_uint)
    get_query = gl_function("glGetQueryObjectuiv", None, ctypes.c_uint, ctypes.c_uint, ctypes.POINTER(ctypes.c_uint))
    query = int(GL.glGenQueries(1)[0]) if hasattr(GL.glGenQueries(1), "__getitem__") else int(GL.glGenQueries(1))
    out = ctypes.c_uint(0)
    f0 = fence(0x9117, 0)
    GL.glFinish()

    def med(fn, n=3000):
        ts = []
        for _ in range(n):
            t = time.perf_counter_ns()
            fn()
            ts.append(time.perf_counter_ns() - t)
        return statistics.median(ts) / 1e3

    print(f"glFenceSync + glDeleteSync  {med(lambda: delete(fence(0x9117, 0))):6.2f} µs")
    print(f"glClientWaitSync (signaled) {med(lambda: wait(f0, 1, 0)):6.2f} µs")
    print(f"glQueryCounter              {med(lambda: counter(query, 0x8E28)):6.2f} µs")
    GL.glFinish()
    print(f"glGetQueryObjectuiv(avail)  {med(lambda: get_query(query, 0x8867, ctypes.byref(out))):6.2f} µs")
    print(f"glFlush                     {med(GL.glFlush):6.2f} µs")


if __name__ == "__main__":
    main()
