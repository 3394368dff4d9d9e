#!/usr/bin/env python3
"""Diagnostic: what a GPU fault in an isolated engine's child does to GL, in the host and in later processes.

``probe_after_fault.py`` found that on the H100 (driver 580) a fault in one process leaves every
later process's previews showing nothing of what CUDA shares with GL. This probe asks the same of
``Engine(isolated=True)``, where the fault ends only the engine's child process. It runs, each in a
process of its own:

1. ``preview``: a fresh process draws a known image (a red ramp along x, green = a level) through a
   normal engine's headless preview, and the same image from a texture GL alone owns (the baseline).
2. ``isolated``: a host holding a headless EGL preview of an isolated engine's ramp plants the
   illegal-address kernel of ``tests/gpu/isolated_fault_scenario.py`` in the child, waits for the
   restart, sets a new level (so only the new child's frames can show it) and checks that the
   host's preview draws it: the time to the first correct frame, then live fps and a last frame.
3. ``preview`` again: can a later, fresh process still make an EGL context and render a correct
   frame, through CUDA-shared memory and through GL alone?

Each step prints its fps and how much of its last frame is correct (every pixel within 2 of the
ramp and level). A step that hangs is ended after its timeout (60 s in all) and reported as such.
H100, driver 580, a fresh machine (2026-11-27): the host's preview drew correct frames before the
child's fault and none after it (the isolated step ended at its bound); a later process drew GL
alone correctly and its CUDA preview stalled (docs/faults.md).
WARNING: as ``probe_after_fault.py``, run it on a machine you can replace.

Usage: python benchmarks/probes/probe_isolated_gl.py
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
W, H = 640, 360  # the ramp kernel's size, and the GL contexts'
RAMP = r"""
extern "C" __global__ void image(unsigned int* rgba, float level, unsigned int count) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;   // 640 x 360, red ramp along x
    unsigned int green = (unsigned int)(level * 255.0f) << 8;
    if (i < count) rgba[i] = (unsigned int)((i % 640u) * 255u / 639u) | green | (255u << 24);
}"""
# The illegal-address kernel of tests/gpu/isolated_fault_scenario.py: harmless until ``trigger`` is set.
BAD = (Path(__file__).resolve().parents[2] / "tests" / "gpu" / "kernels" / "illegal_address.cu").read_text()
LIVE_FRAMES = 120
FAULT_WAIT_S = 10.0  # from the planting edit to the host's restart of the child
RESTART_WAIT_S = 8.0  # from the restart to the host's preview showing the new child's frame
TIMEOUTS = {"preview": 15, "isolated": 30}  # seconds a step may take before it counts as hung


def _expected(level: float):
    """The ramp's RGBA pixels, as the kernel computes them."""
    import numpy as np

    img = np.zeros((H, W, 4), np.uint8)
    img[..., 0] = np.arange(W) * 255 // (W - 1)
    img[..., 1] = int(level * 255.0)
    img[..., 3] = 255
    return img


def _correct(img, level: float) -> float:
    """The fraction of pixels of ``img`` within 2 of the ramp at ``level`` (alpha exact)."""
    import numpy as np

    want = _expected(level).astype(int)
    got = img.astype(int)
    close = (np.abs(got[..., :2] - want[..., :2]) <= 2).all(axis=2) & (got[..., 3] == 255)
    return float(close.mean())


def _ramp(engine, level: float):
    from cudapatch.blocks.library import CustomKernel

    block = engine.add(CustomKernel(name="ramp", Code=RAMP))
    block.set("Count", W * H)
    block.set("level", level)
    return block


def _show(label: str, preview, ctx, level: float) -> None:
    """Live frames (fps), then one settled frame: how much of it is correct."""
    report = preview.run(LIVE_FRAMES)
    preview.frame(settle=True)
    ok = _correct(ctx.read_pixels(), level)
    print(f"{label}: {report.fps:.0f} fps live, {ok:.1%} of the last frame correct", flush=True)


def _gl_only(ctx, level: float) -> float:
    """The ramp uploaded into a texture GL alone owns, drawn and read back: how much is correct."""
    from OpenGL import GL

    from cudapatch.interop.render import TextureRenderer

    tex = int(GL.glGenTextures(1))
    GL.glBindTexture(GL.GL_TEXTURE_2D, tex)
    GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MIN_FILTER, GL.GL_NEAREST)  # no mipmaps
    GL.glTexParameteri(GL.GL_TEXTURE_2D, GL.GL_TEXTURE_MAG_FILTER, GL.GL_NEAREST)
    GL.glTexImage2D(GL.GL_TEXTURE_2D, 0, GL.GL_RGBA8, W, H, 0, GL.GL_RGBA, GL.GL_UNSIGNED_BYTE, _expected(level))
    renderer = TextureRenderer()
    GL.glBindFramebuffer(GL.GL_FRAMEBUFFER, ctx.framebuffer)
    GL.glViewport(0, 0, W, H)
    GL.glClearColor(0.0, 0.0, 0.0, 1.0)
    GL.glClear(GL.GL_COLOR_BUFFER_BIT)
    renderer.draw(tex)
    GL.glFinish()
    ok = _correct(ctx.read_pixels(), level)
    renderer.close()
    GL.glDeleteTextures(1, [tex])
    return ok


def preview() -> None:
    from cudapatch import Engine
    from cudapatch.interop import EglContext
    from cudapatch.interop.preview import Preview

    t0 = time.perf_counter()
    ctx = EglContext(W, H)
    print(f"egl: context made in {time.perf_counter() - t0:.2f} s ({ctx.info()['renderer']})", flush=True)
    print(f"gl alone: {_gl_only(ctx, 0.4):.1%} of a texture's frame correct", flush=True)
    with Engine(wait_for_compile=True) as engine:
        engine.device.make_current()
        ramp = _ramp(engine, 0.5)
        engine.wait_ready()
        with Preview(engine, ctx, image=(ramp, "rgba", W, H), overlay=False) as p:
            _show(f"preview (zero-map={p.zero_map})", p, ctx, 0.5)
    ctx.close()


def isolated() -> None:
    from cudapatch import Engine, Fill, Scale
    from cudapatch.blocks.library import CustomKernel
    from cudapatch.interop import EglContext
    from cudapatch.interop.preview import Preview

    ctx = EglContext(W, H)
    try:
        with Engine(isolated=True, wait_for_compile=True) as engine:
            engine.device.make_current()
            ramp = _ramp(engine, 0.25)
            fill = engine.add(Fill(name="fill", Count=4096, Value=2.0))
            bad = engine.add(CustomKernel(name="bad", Code=BAD))
            bad.set("trigger", 0.0)
            after = engine.add(Scale(name="after", Factor=3.0, Offset=1.0))  # reads 'bad', as in the tests
            engine.connect(fill, "Out", bad, "in")
            engine.connect(bad, "out", after, "In")
            engine.wait_ready()
            with Preview(engine, ctx, image=(ramp, "rgba", W, H), overlay=False) as p:
                _show(f"host before the fault (zero-map={p.zero_map})", p, ctx, 0.25)
                bad.set("trigger", 1.0)  # a Hot edit that makes the kernel fault in the child
                t0 = time.perf_counter()
                while engine.restarts == 0 and time.perf_counter() - t0 < FAULT_WAIT_S:
                    p.frame()  # the live preview goes on meanwhile
                if engine.restarts == 0:
                    print(f"fault: no restart within {FAULT_WAIT_S:.0f} s (lost: {engine.lost})", flush=True)
                    return
                named = [d.message for d in engine.diagnostics() if d.code == "gpu-fault"]
                print(f"fault: child restarted {time.perf_counter() - t0:.2f} s after the edit; {named}", flush=True)
                ramp.set("level", 0.75)  # only the new child's frames show this level
                t1 = time.perf_counter()
                ok = 0.0
                while ok < 0.99 and time.perf_counter() - t1 < RESTART_WAIT_S:
                    p.frame(settle=True)
                    ok = _correct(ctx.read_pixels(), 0.75)
                took = f"in {time.perf_counter() - t1:.2f} s" if ok >= 0.99 else f"not within {RESTART_WAIT_S:.0f} s"
                print(f"host after the restart: first correct frame {took} ({ok:.1%} correct)", flush=True)
                _show("host after the restart", p, ctx, 0.75)
    finally:  # (also after a fault that never restarted the child)
        ctx.close()


STEPS = {"preview": preview, "isolated": isolated}


def _run_step(step: str, env: dict[str, str]) -> None:
    """One step in a process of its own (a session, so a hung step's engine processes end with it)."""
    proc = subprocess.Popen(
        [sys.executable, __file__, step],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUTS[step])
        status = f"rc={proc.returncode}"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        status = f"hung: ended after {TIMEOUTS[step]} s"
    lines = [line for line in out.decode(errors="replace").splitlines() if line.strip()]
    print(f"[{step}] {status}", *lines, sep="\n  ", flush=True)
    if proc.returncode:
        print(err.decode(errors="replace")[-2000:], flush=True)


def main() -> None:
    if len(sys.argv) > 1:
        STEPS[sys.argv[1]]()
        return
    env = dict(os.environ, PYOPENGL_PLATFORM="egl")
    for step in ("preview", "isolated", "preview"):
        _run_step(step, env)


if __name__ == "__main__":
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    sys.path.insert(0, str(ROOT))
    main()
