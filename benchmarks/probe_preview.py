#!/usr/bin/env python3
"""Diagnostic: where a headless preview frame's time goes (1920x1080, overlay, 1M points), with the
zero-map path and with register/map: fps, ring drops, and the calls that take the time (cProfile)."""

from __future__ import annotations

import cProfile
import os
import pstats
import sys
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cudapatch import Engine  # noqa: E402
from cudapatch.blocks.library import Emitter, Forces, Integrate, ToPoints  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402
from cudapatch.interop.preview import Preview  # noqa: E402


def main() -> None:
    ctx = EglContext(1920, 1080)
    engine = Engine(name="probe", wait_for_compile=True)
    ctx.make_current()
    e, f, i, t = (engine.add(cls()) for cls in (Emitter, Forces, Integrate, ToPoints))
    e.set("Capacity", 1_000_000)
    e.set("Rate", 1_000_000 / 3.0)
    engine.connect(e, "Particles", f, "Particles")
    engine.connect(f, "Particles", i, "Particles")
    engine.connect(i, "Particles", t, "Particles")
    engine.wait_ready()
    for zero_map in (True, False)[: 1 if "--zero-map" in sys.argv else 2]:
        with Preview(engine, ctx, points=(t, "Points"), overlay=True, zero_map=zero_map) as preview:
            preview.run(30)
            prof = cProfile.Profile()
            prof.enable()
            report = preview.run(40)
            prof.disable()
            ring = preview._ring
            extra = f", dropped {ring.dropped}, issued {ring._issued}" if ring is not None else ""
            print(f"zero_map={zero_map}: {report.fps:.1f} fps{extra}", flush=True)
            st = pstats.Stats(prof).sort_stats("tottime")
            st.print_stats(8)
            st.print_callers("threading.py.*wait|acquire")
    engine.close()
    ctx.close()


if __name__ == "__main__":
    main()
