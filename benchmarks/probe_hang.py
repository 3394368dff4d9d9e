#!/usr/bin/env python3
"""Diagnostic: does the embedded demo's preview leave the engine stream unfinished?

Runs the demo the way ``cudapatch run --headless`` does (frames back to back, nobody waiting), then
``glFinish`` and polls the engine stream for 10 s instead of synchronizing, per variant:

  cli        as the CLI does it (zero-map when the driver's check passes, else register + map)
  fallback   as the CLI on a driver whose check fails: the ring is made, checked, closed, then
             register + map
  hostread   as fallback, but the ring's buffers are read with glGetNamedBufferSubData first (what
             the coherence check did before it read through a GPU copy)
  map        register + map from the start
  map-sync   register + map, the engine synchronized after every frame
  map-ready  register + map, after the preview's writer block has compiled and run once
  no-draw    register + map, GL never draws (engine.update only, the bridge maps and unmaps)

Usage: python benchmarks/probe_hang.py [variant ...] [--frames N]
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cudapatch.host_plugin.hosts.standalone import StandaloneHost  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402
from cudapatch.kernels._driver import driver  # noqa: E402

VARIANTS = ("cli", "fallback", "hostread", "map", "map-sync", "map-ready", "no-draw")


def stream_done_after(stream, seconds: float) -> float | None:
    """Seconds until ``stream`` has no work left, or None if it still has after ``seconds``."""
    d = driver()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        (err,) = d.cuStreamQuery(stream)
        if err == d.CUresult.CUDA_SUCCESS:
            return time.perf_counter() - t0
        if err != d.CUresult.CUDA_ERROR_NOT_READY:
            raise RuntimeError(f"stream query: {err}")
        time.sleep(0.001)
    return None


def run(variant: str, frames: int) -> None:
    from OpenGL import GL

    if variant in ("fallback", "hostread"):
        import ctypes

        from cudapatch.interop._gl import gl_function
        from cudapatch.interop.imported import ImportedBuffer

        check = ImportedBuffer.shares_memory

        def failing_check(buf: ImportedBuffer) -> bool:
            if variant == "hostread":
                args = (ctypes.c_uint, ctypes.c_ssize_t, ctypes.c_ssize_t, ctypes.c_void_p)
                word = ctypes.c_uint32(0)
                gl_function("glGetNamedBufferSubData", None, *args)(buf.gl_name, 0, 4, ctypes.addressof(word))
            return check(buf) and False

        ImportedBuffer.shares_memory = failing_check
    with StandaloneHost(None) as host:
        ctx = EglContext(1280, 720)
        host.engine.device.make_current()
        preview = host.open_preview(ctx, overlay=False)
        if variant not in ("cli", "fallback", "hostread"):
            preview.zero_map = False
        eng = host.engine
        if variant == "map-ready":
            preview.frame()
            eng.wait_ready()
            preview.frame()
            eng.synchronize()
        t0 = time.perf_counter()
        for n in range(frames):
            if variant == "no-draw":
                if n == 0:
                    preview.frame()
                else:
                    eng.update()
            else:
                preview.frame()
            if variant == "map-sync":
                eng.synchronize()
        host_s = time.perf_counter() - t0
        GL.glFinish()
        done = stream_done_after(eng.device.stream, 10.0)
        state = "HUNG (stream busy after 10 s)" if done is None else f"done {done * 1e3:.1f} ms after glFinish"
        blocks = ", ".join(f"{b.name}:{b.state}" for b in eng.stats().blocks)
        print(
            f"{variant:9s}: {frames} frames in {host_s * 1e3:.0f} ms host, zero_map={preview.zero_map}, {state}; "
            f"{blocks}",
            flush=True,
        )
        if done is None:
            os._exit(3)  # a hung stream cannot be torn down; the next variant runs in a new process
        preview.close()
        host.preview = None
        ctx.close()


def main() -> None:
    args = sys.argv[1:]
    frames = 40
    if "--frames" in args:
        i = args.index("--frames")
        frames = int(args[i + 1])
        del args[i : i + 2]
    for variant in args or VARIANTS:
        run(variant, frames)


if __name__ == "__main__":
    main()
