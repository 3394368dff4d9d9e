#!/usr/bin/env python3
"""Diagnostic: what a GPU fault in one process does to the previews of later processes.

Runs the embedded demo's headless preview (300 frames, 640x360) in a child process, then a child
that only faults (a kernel stores to address 8; no GL in it), then the preview again, and last a
child that checks the interop primitives alone (CUDA writes 32 MiB into an imported and into a
registered GL buffer; GL copies them and reads them back). Each preview prints its fps and how much
of its last frame is lit.

Measured on an H100 with driver 580: before the fault 500-1300 fps and 32 % lit; after it, in
every later process, ~66 fps and nothing lit, for both register + map and zero-map, while CUDA
results, the interop primitives and GL draws of memory GL alone owns stay correct. In a process
whose GL had touched memory shared with CUDA, later draws stalled (the first one 15 s, then
25-30 ms against 2.3 ms) and some drew nothing, with no GL context reset reported. It lasted as
long as the machine (over 100 s here). WARNING: run it on a machine you can replace.

Usage: python benchmarks/probes/probe_after_fault.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAULT = r"""
extern "C" __global__ void bad(float* out, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = 1.0f;
    if (i == 0) *((volatile float*)(size_t)8) = 1.0f;
}"""


def preview() -> None:
    import numpy as np

    from cudapatch.host_plugin.hosts.standalone import StandaloneHost
    from cudapatch.interop import EglContext

    with StandaloneHost(None) as host:
        ctx = EglContext(640, 360)
        host.engine.device.make_current()
        host.open_preview(ctx, overlay=False)
        with tempfile.TemporaryDirectory() as out:
            report = host.run(300, out_dir=out)
            img = ctx.read_pixels()
        lit = (img[..., :3].astype(int).sum(axis=2) > 60).mean()
        print(f"preview: {report.fps:.0f} fps, {lit:.1%} of the last frame lit, zero-map={host.preview.zero_map}")
        points = host.engine.read(host.adapter.block("points"), "Points").view(np.float32)
        print(f"         CUDA's points: {np.isfinite(points).mean():.0%} finite, {(points != 0).mean():.0%} nonzero")
        host.preview.close()
        ctx.close()


def fault() -> None:
    from cudapatch import Engine
    from cudapatch.blocks.library import CustomKernel

    e = Engine(wait_for_compile=True)
    b = e.add(CustomKernel(Code=FAULT))
    b.set("Count", 1024)
    e.wait_ready()
    e.update()
    try:
        e.synchronize()
        print("fault: none (unexpected)")
    except Exception as exc:  # the sticky fault, as intended
        print(f"fault: {exc}")


def interop() -> None:
    import cupy
    import numpy as np
    from OpenGL import GL

    from cudapatch.engine.device import DeviceContext
    from cudapatch.interop import EglContext
    from cudapatch.interop.imported import ImportedBuffer
    from cudapatch.interop.shared import SharedBuffer

    dev = DeviceContext(0)
    ctx = EglContext(64, 64)
    dev.make_current()
    n = 32 << 20
    src = cupy.arange(n // 4, dtype=cupy.uint32) + 7
    want = np.arange(n // 4, dtype=np.uint32) + 7

    def gl_sees(name: int) -> float:
        tmp = int(GL.glGenBuffers(1))
        GL.glBindBuffer(GL.GL_COPY_WRITE_BUFFER, tmp)
        GL.glBufferData(GL.GL_COPY_WRITE_BUFFER, n, None, GL.GL_STREAM_READ)
        GL.glBindBuffer(GL.GL_COPY_READ_BUFFER, name)
        GL.glCopyBufferSubData(GL.GL_COPY_READ_BUFFER, GL.GL_COPY_WRITE_BUFFER, 0, 0, n)
        GL.glBindBuffer(GL.GL_COPY_READ_BUFFER, tmp)
        got = np.frombuffer(GL.glGetBufferSubData(GL.GL_COPY_READ_BUFFER, 0, n), np.uint32)
        GL.glDeleteBuffers(1, [tmp])
        return float((got == want).mean())

    imported = ImportedBuffer(n)
    cupy.cuda.runtime.memcpy(imported.ptr, src.data.ptr, n, 3)
    cupy.cuda.runtime.deviceSynchronize()
    print(f"interop: imported buffer, GL sees {gl_sees(imported.gl_name):.0%} of CUDA's copy")
    imported.close()
    registered = SharedBuffer.create(n)
    with registered.map(stream=dev.stream) as m:
        cupy.cuda.runtime.memcpy(m.ptr, src.data.ptr, n, 3)
        cupy.cuda.runtime.deviceSynchronize()
    print(f"interop: registered buffer, GL sees {gl_sees(registered.gl_name):.0%} of CUDA's copy")
    registered.close()
    ctx.close()


STEPS = {"preview": preview, "fault": fault, "interop": interop}


def main() -> None:
    if len(sys.argv) > 1:
        STEPS[sys.argv[1]]()
        return
    env = dict(os.environ, PYOPENGL_PLATFORM="egl")
    for step in ("preview", "fault", "preview", "interop"):
        out = subprocess.run([sys.executable, __file__, step], capture_output=True, text=True, env=env, timeout=120)
        lines = [line for line in out.stdout.splitlines() if line.strip()]
        print(f"[{step}] rc={out.returncode}", *lines, sep="\n  ")
        if out.returncode and step != "fault":
            print(out.stderr[-2000:])


if __name__ == "__main__":
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
    sys.path.insert(0, str(ROOT))
    main()
