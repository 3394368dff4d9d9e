"""Editor CPU time per frame for a 100-node patch (target <= 1 ms), beside the overlay alone.

Runs headless on EGL (Mesa on a CPU machine, the NVIDIA driver on the GPU machine) with an engine that
only plans, so it measures the panel's Python and imgui work, not the GPU. Prints a table.

    PYOPENGL_PLATFORM=egl python benchmarks/bench_editor.py [--nodes 100] [--frames 200]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--frames", type=int, default=200)
    args = parser.parse_args()
    from cudapatch.engine.profiling import EngineStats, ProfilingLevel
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel
    from cudapatch.interop import EglContext
    from cudapatch.interop.editor import EditorPanel
    from cudapatch.interop.overlay import Overlay
    from tests.unit.plan_engine import PlanOnlyEngine

    lines = ['links = ["s0.Out -> s1.In"]', "", "[operators.s0]", 'type = "core.Fill"', ""]
    for i in range(1, args.nodes):
        lines += [f"[operators.s{i}]", 'type = "core.Scale"', f"Factor = {1 + i / 100}", ""]
    reg = PluginHost().registry
    patch = parse_patch("\n".join(lines), registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    for i in range(1, args.nodes - 1):
        adapter.connect(f"s{i}", "Out", f"s{i + 1}", "In")
    adapter.engine.update()
    model = EditorModel(adapter, patch)
    stats = EngineStats(ProfilingLevel.NONE, None, None, None, (), 0, 0, 0)
    ctx = EglContext(1920, 1080)
    results = {}
    for name, with_editor in (("overlay only", False), ("overlay + editor", True)):
        panel = EditorPanel(model, rect=(0, 0, 1920, 1080)) if with_editor else None
        overlay = Overlay(ctx, panels=(panel.draw,) if panel else ())
        for _ in range(5):
            overlay.draw(stats)
        t0 = time.perf_counter()
        for _ in range(args.frames):
            overlay.draw(stats)
        results[name] = (time.perf_counter() - t0) / args.frames * 1e3
        if panel is not None:
            panel.close()
        overlay.close()
    ctx.close()
    print(f"{'what':<20} {'CPU ms/frame':>12}   ({args.nodes} nodes, {args.frames} frames)")
    for name, ms in results.items():
        print(f"{name:<20} {ms:>12.3f}")
    print(f"{'editor alone':<20} {results['overlay + editor'] - results['overlay only']:>12.3f}")


if __name__ == "__main__":
    main()
