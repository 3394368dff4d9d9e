#!/usr/bin/env python3
"""The demo's headless preview at 1920x1080: frames per second with the node editor open (target
>= 120 fps), beside the same preview with the overlay only and with nothing drawn over it, in one run.

Runs what ``cudapatch run`` runs (the embedded particle demo through the standalone host), on EGL:
the NVIDIA driver on the GPU machine (Mesa's software GL on a CPU machine measures the CPU's
rasterizer, not this). The editor draws every node of the demo's patch and its links each frame.

Usage: ``python benchmarks/bench_preview_editor.py [--frames 600] [--size 1920x1080]``; writes
``preview_editor.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402

from cudapatch.host_plugin.hosts.standalone import StandaloneHost  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402


def fps(width: int, height: int, frames: int, *, overlay: bool, editor: bool) -> float:
    """Frames per second of the demo's preview (a fresh host and context; the first 120 frames warm)."""
    ctx = EglContext(width, height)
    host = StandaloneHost()
    try:
        host.open_preview(ctx, overlay=overlay, editor=editor)
        host.run(120)
        return host.run(120 + frames, start=120).fps
    finally:
        host.close()
        ctx.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--frames", type=int, default=600)
    ap.add_argument("--size", default="1920x1080")
    args = ap.parse_args()
    logging.getLogger("cudapatch").setLevel(logging.ERROR)
    w, h = (int(v) for v in args.size.split("x"))
    rows = [
        ("preview only", fps(w, h, args.frames, overlay=False, editor=False)),
        ("preview + overlay", fps(w, h, args.frames, overlay=True, editor=False)),
        ("preview + overlay + editor", fps(w, h, args.frames, overlay=True, editor=True)),
    ]
    base = rows[0][1]
    print(f"demo preview {w}x{h}, {args.frames} frames")
    print(f"{'what':30} {'fps':>8} {'vs preview only':>16}")
    for name, value in rows:
        print(f"{name:30} {value:8.1f} {value / base:16.2f}")
    print(f"with the editor open: {rows[2][1]:.1f} fps (target >= 120)")
    write_results("preview_editor.json", {name: value for name, value in rows})


if __name__ == "__main__":
    main()
