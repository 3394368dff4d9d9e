#!/usr/bin/env python3
"""07 — image chain: an animated camera-like source through a chain of built-in image blocks to the preview.

What it teaches: 2-D shapes on ports (each link carries its ``height x width``), 2-D launches,
RGBA8 images (``uchar4``), and the preview showing a 2-D output at its own size. The source's
``Time`` and the blur's ``Radius`` are Hot edits made every frame: no rebuild.

What you should see: moving colour waves and a bright spot, blurred, shrunk, colour-mapped by
luminance and mixed with a hard threshold of itself (in the window; with ``--out DIR`` also as PNG
files); the overlay with GPU time per block; and finally ``OK: 640x360 image, rebuilds 1``.

Run: ``python examples/07_image_chain.py [--headless] [--frames N] [--out DIR]`` (needs a CUDA GPU;
the window needs a display, ``--headless`` renders with EGL instead).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from cudapatch._examples import example_main  # imports no GL module: the platform is chosen in main


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--headless", action="store_true", help="render with EGL, no window")
    parser.add_argument("--frames", type=int, default=None, help="stop after N frames (default: until closed)")
    parser.add_argument("--out", default=None, help="write the last frame (and every 100th) as PNG files here")
    args = parser.parse_args()
    if args.headless:
        os.environ.setdefault("PYOPENGL_PLATFORM", "egl")  # an entry point chooses the GL platform

    from cudapatch import Engine
    from cudapatch.blocks.library import Blur, ColorMap, Mix, Pattern, Resample, Threshold
    from cudapatch.interop import EglContext, GlfwWindow
    from cudapatch.interop.preview import Preview

    with Engine(name="images") as engine:
        camera = engine.add(Pattern(name="camera", Width=1920, Height=1080))
        blur = engine.add(Blur(name="blur", Radius=6, Sigma=3.0))
        small = engine.add(Resample(name="small", Width=640, Height=360))
        cmap = engine.add(ColorMap(name="cmap", Low=0.2, High=0.9))
        edge = engine.add(Threshold(name="edge", Level=0.6))
        mix = engine.add(Mix(name="mix", Amount=0.25))
        engine.connect(camera, "Out", blur, "In")
        engine.connect(blur, "Out", small, "In")
        engine.connect(small, "Out", cmap, "In")
        engine.connect(small, "Out", edge, "In")
        engine.connect(cmap, "Out", mix, "A")
        engine.connect(edge, "Out", mix, "B")
        engine.set_profiling("PerBlock")
        engine.wait_ready()  # the image kernels compile once (then come from the cubin cache)

        context = EglContext(640, 360) if args.headless else GlfwWindow(640, 360, "cudapatch — images")
        engine.device.make_current()
        with Preview(engine, context, image=(mix, "Out")) as preview:  # sized from the output's shape
            frame = [0]

            def animate() -> None:
                frame[0] += 1
                camera.set("Time", frame[0] / 60.0)  # Hot edits: no rebuild
                blur.set("Radius", 2 + (frame[0] // 10) % 10)

            report = preview.run(args.frames, out_dir=args.out, png_every=100, before_frame=animate)
        context.close()
        shape = engine.output_shape(mix, "Out")
        out = engine.read(mix, "Out")
        print(f"{report.frames} frames, {report.fps:.0f} fps; {engine}")
        ok = out.shape == (360, 640, 4) and int(out[..., 3].min()) == 255 and np.ptp(out[..., :3]) > 64
        print(f"{'OK' if ok else 'FAILED'}: {shape.width}x{shape.height} image, rebuilds {engine.counters.rebuilds}")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
