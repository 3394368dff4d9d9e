"""Editor CPU time per frame for a 100-node patch (target <= 1 ms), beside the overlay alone.

Runs headless on EGL (Mesa on a CPU machine, the NVIDIA driver on the GPU machine) with an engine that
only plans, so it measures the panel's Python and imgui work, not the GPU. Prints a table of wall time
and CPU time of the frame thread (``time.thread_time``: what the host's thread spends; on a busy machine
the wall time also counts time the thread waited for a core), for the whole overlay frame and for the
editor panel alone (building its imgui frame: the Python, imgui and imgui-node-editor work, without the
GL render). With Mesa's software GL (llvmpipe, a CPU machine) the render of a full-window panel is
rasterization on the CPU that a GPU does; the panel column is the editor's own cost.

    PYOPENGL_PLATFORM=egl python benchmarks/bench_editor.py [--nodes 100] [--frames 200] [--regions 10]

``--regions N`` puts the chain's blocks into N ``For`` regions (N of the nodes are the regions), so
the editor draws N groups around them. ``--composites N`` makes N of the chain's nodes composites of
``--inner`` blocks each (a composite file of Scales): closed, each is one node, and their inner blocks
must cost the frame nothing; ``--open`` opens them all (their inner nodes drawn in groups).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--frames", type=int, default=200)
    parser.add_argument("--regions", type=int, default=0, help="For regions holding the chain (drawn as groups)")
    parser.add_argument("--composites", type=int, default=0, help="chain nodes that are composites")
    parser.add_argument("--inner", type=int, default=10, help="blocks inside each composite")
    parser.add_argument("--open", action="store_true", help="open every composite in the editor")
    args = parser.parse_args()
    from cudapatch.engine.profiling import EngineStats, ProfilingLevel
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
    from cudapatch.host_plugin.editor_model import EditorModel
    from cudapatch.interop import EglContext
    from cudapatch.interop.editor import EditorPanel
    from cudapatch.interop.overlay import Overlay
    from tests.unit.plan_engine import PlanOnlyEngine

    lines = ['links = ["s0.Out -> s1.In"]', "", "[operators.s0]", 'type = "core.Fill"', ""]
    for r in range(args.regions):
        lines += [f"[operators.r{r}]", 'type = "core.For"', "Count = 2", ""]
    chain = args.nodes - args.regions  # the Fill and the Scales; the rest of the nodes are regions
    per = max(1, (chain - 1) // args.regions) if args.regions else 0
    comp_file = _composite_file(args.inner) if args.composites else None
    every = max(1, (chain - 1) // args.composites) if args.composites else 0
    composites = []
    for i in range(1, chain):
        if every and i % every == 0 and len(composites) < args.composites:
            composites.append(f"s{i}")
            lines += [f"[operators.s{i}]", 'type = "core.Composite"', f'Path = "{comp_file}"']
        else:
            lines += [f"[operators.s{i}]", 'type = "core.Scale"', f"Factor = {1 + i / 100}"]
        if args.regions:
            lines.append(f'region = "r{min((i - 1) // per, args.regions - 1)}"')
        lines.append("")
    reg = PluginHost().registry
    patch = parse_patch("\n".join(lines), registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    for i in range(1, args.nodes - args.regions - 1):
        adapter.connect(f"s{i}", "Out", f"s{i + 1}", "In")
    adapter.engine.update()
    model = EditorModel(adapter, patch)
    if args.open:
        for op in composites:
            model.open(op)
    stats = EngineStats(ProfilingLevel.NONE, None, None, None, (), 0, 0, 0)
    ctx = EglContext(1920, 1080)
    results = {}
    configs = (("overlay only", False, False), ("overlay + editor", True, False), ("editor, all in view", True, True))
    for name, with_editor, fit in configs:
        panel = EditorPanel(model, rect=(0, 0, 1920, 1080)) if with_editor else None
        if fit:
            panel.fit_all()  # zoomed out to show all nodes: the most a 100-node patch can draw
        spent = [0.0, 0.0]

        def timed(stats, _panel=panel, _spent=spent):
            w0, c0 = time.perf_counter(), time.thread_time()
            _panel.draw(stats)
            _spent[0] += time.perf_counter() - w0
            _spent[1] += time.thread_time() - c0

        overlay = Overlay(ctx, panels=(timed,) if panel else ())
        for _ in range(8):
            overlay.draw(stats)
        spent[:] = [0.0, 0.0]
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(args.frames):
            overlay.draw(stats)
        per = 1e3 / args.frames
        wall, cpu = (time.perf_counter() - w0) * per, (time.thread_time() - c0) * per
        results[name] = (wall, cpu, spent[0] * per, spent[1] * per)
        if panel is not None:
            drawn, stubs = getattr(panel, "drawn", None), getattr(panel, "stubs", ())
            compact = " compact" if getattr(panel, "compact", False) else ""
            shown = len(drawn) if drawn is not None else "all"
            print(f"({name}: drawn{compact}: {shown} nodes, stubs: {len(stubs)})")
            panel.close()
        overlay.close()
    ctx.close()
    inside = f", {len(composites)} composites of {args.inner} blocks{' (open)' if args.open else ''}"
    print(f"{args.nodes} nodes ({args.regions} of them regions{inside}), {args.frames} frames, ms per frame")
    print(f"{'what':<20} {'wall':>8} {'CPU':>8} {'panel wall':>11} {'panel CPU':>10}")
    for name, (wall, cpu, pwall, pcpu) in results.items():
        print(f"{name:<20} {wall:>8.3f} {cpu:>8.3f} {pwall:>11.3f} {pcpu:>10.3f}")
    a = results["overlay only"]
    rows = (("editor alone", results["overlay + editor"]), ("... all in view", results["editor, all in view"]))
    for label, b in rows:
        alone = f"{b[0] - a[0]:>8.3f} {b[1] - a[1]:>8.3f} {b[2]:>11.3f} {b[3]:>10.3f}"
        print(f"{label:<20} {alone}   (target: CPU <= 1 ms)")


def _composite_file(inner: int) -> Path:
    """A composite file of ``inner`` Scales in a chain (In -> s0 ... -> Out, Gain sets the first)."""
    lines = ["links = [" + ", ".join(f'"c{i}.Out -> c{i + 1}.In"' for i in range(inner - 1)) + "]", ""]
    for i in range(inner):
        lines += [f"[operators.c{i}]", 'type = "core.Scale"', ""]
    lines += ["[expose]", 'In = "c0.In"', f'Out = "c{inner - 1}.Out"', 'Gain = "c0.Factor"', ""]
    path = Path(tempfile.mkdtemp(prefix="bench_editor_")) / "chain.toml"
    path.write_text("\n".join(lines))
    return path


if __name__ == "__main__":
    main()
