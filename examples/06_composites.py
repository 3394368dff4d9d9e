#!/usr/bin/env python3
"""06 — composite blocks: a sub-patch file used as one block, its exposed parameters edited Hot.

What it teaches: a composite file (``examples/composites/smooth.toml``) is a small patch of its own,
two blur kernels from a ``.cu`` file and a Scale, that exposes one input, one output and two
parameters. A host creates it by file like any operator (``core.Composite`` with a ``Path``); the
engine flattens it, so its kernels sit in the one CUDA graph beside everything else, named
``smooth/pass1``, ``smooth/pass2`` and ``smooth/gain``. Setting an exposed parameter (``Weight`` sets
both blur passes) is a Hot update: no rebuild. ``--child-graph`` sets its ``ChildGraph`` parameter:
the three kernels run as one CUDA child-graph node instead.

What you should see: a line per reported frame with the parameters and the tier counters (no
rebuild while it runs, Hot updates each frame), the composite's tooltip, and ``OK: matches NumPy``.

Run: ``python examples/06_composites.py [--headless] [--frames N] [--child-graph]`` (needs a CUDA
GPU). The patch ``examples/composites/patch.toml`` uses the same composite: ``cudapatch run`` it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from cudapatch import Engine
from cudapatch._examples import example_main
from cudapatch.host_plugin import HostAdapter, PluginHost


def composites_folder() -> Path:
    """``examples/composites``: beside this file, or under the working directory for a copy elsewhere."""
    here = Path(__file__).resolve().parent / "composites"
    return here if here.is_dir() else Path.cwd() / "examples" / "composites"


def box3(x: np.ndarray, weight: np.float32) -> np.ndarray:
    """What ``box3.cu`` computes, in float32 in the kernel's order: ``(left + x + right) * weight``."""
    left = np.concatenate([x[:1], x[:-1]])
    right = np.concatenate([x[1:], x[-1:]])
    return ((left + x) + right) * weight


@example_main  # no driver or GPU: one line and a non-zero exit, not a traceback
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--headless", action="store_true", help="no window (this example never opens one)")
    ap.add_argument("--frames", type=int, default=120)
    ap.add_argument("--elements", type=int, default=100_000)
    ap.add_argument("--child-graph", action="store_true", help="run the composite as one child-graph node")
    args = ap.parse_args(argv)

    x = np.random.default_rng().standard_normal(args.elements).astype(np.float32)
    registry = PluginHost().registry
    with Engine() as engine:
        # As a host creates it: by file, relative to its search paths (a patch's own folder first).
        adapter = HostAdapter(engine, registry, search_paths=[composites_folder()])
        params = {"Path": "smooth.toml", "Gain": 2.0, "ChildGraph": int(args.child_graph)}
        smooth = adapter.create("smooth", "core.Composite", params)
        engine.bind(smooth, "In", x)
        engine.wait_ready()  # the blur kernel compiles in the background; a script waits for it once
        print(f"device: {engine.device.name}")
        print(f"{smooth.name} runs as: {', '.join(f'{smooth.name}/{n}' for n, _ in smooth.inner_blocks())}")

        weight, gain = np.float32(1 / 3), np.float32(2.0)
        rebuilds = engine.counters.rebuilds
        for frame in range(args.frames):
            weight = np.float32(0.3 + 0.05 * np.sin(frame * 0.1))
            gain = np.float32(1.5 + np.cos(frame * 0.05))
            smooth.set("Weight", float(weight))  # Hot: both blur passes patched in place
            smooth.set("Gain", float(gain))  # Hot
            engine.update()  # returns without waiting for the GPU
            if frame % 30 == 0 or frame == args.frames - 1:
                print(
                    f"frame {frame:4d}: Weight={weight:.4f} Gain={gain:.4f} "
                    f"rebuilds={engine.counters.rebuilds} hot={engine.counters.hot_updates}"
                )

        out = engine.read(smooth, "Out")  # synchronizes: only for checking
        ref = box3(box3(x, weight), weight) * gain
        ok = np.allclose(out, ref, rtol=1e-5, atol=1e-6) and engine.counters.rebuilds == rebuilds
        print(engine)
        print(" ", smooth)
        print("OK: matches NumPy" if ok else "MISMATCH against NumPy")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
