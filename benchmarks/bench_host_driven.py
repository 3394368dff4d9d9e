#!/usr/bin/env python3
"""A host driving the engine as a live session does: every frame over 2 ms, and what it did.

100 operators in 20 chains (a ``core.Fill`` and four ``core.Scale`` each, 4096 floats), made through
the host adapter as TouchDesigner's operators make them. 1,000 frames at 60 fps; every frame sets one
parameter on each chain (a slider held by the user), and every few frames one chain gets a structure
edit, in turn: a hot swap to CUDA code and back (two kernels, each compiled once in the compiler
process, cached after), a link moved to another chain and back, an operator deleted and re-created
(its kernel in the memory cache), a rename and back, a bypass on and off. A frame is the edit calls
plus the cook (``EngineOperator.cook``, one ``Engine.update()``), timed apart.

Printed: every frame whose edits plus cook took over 2 ms, with the edits made in it and what the
engine did in its cook (the engine's counters that moved: a build swapped in, a code swap, a bypass,
Hot values); then the cook time percentiles, frames from each re-created operator's edit until it
runs, and the peers measured in the same run: 1,000 frames of ``update()`` with no edits, and 1,000
bare ``cuGraphLaunch`` calls of the same executable graph at 60 fps (no engine code), 1,000 frames of
the sliders and the cook with no structure edit, and the driver's part of those alone (the slider
blocks' 20 ``cuGraphExecKernelNodeSetParams`` and a launch, bare), each with its frames over 2 ms. A
slow frame with no engine work in it reads against those (host jitter, the driver's own calls);
target: no slow frame caused by the engine.

Usage: ``python benchmarks/bench_host_driven.py [--frames 1000] [--every 10]``.
Writes ``host_driven.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import patched_node  # noqa: E402
from cuda.bindings import driver as d  # noqa: E402

from cudapatch import Engine  # noqa: E402
from cudapatch.host_plugin import HostAdapter, PluginHost  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402

CHAINS, LENGTH, ELEMENTS, SLOW_MS = 20, 5, 4096, 2.0
PERIOD = 1.0 / 60.0
CODE_A = """extern "C" __global__ void k(const float* In, float* Out, float Factor, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Out[i] = In[i] * Factor;
}"""
CODE_B = CODE_A.replace("In[i] * Factor", "In[i] * Factor + 1.0f")


def op(chain: int, k: int) -> str:
    return f"c{chain}_{k}"


def make_patch(adapter: HostAdapter) -> None:
    """20 chains: Fill -> Scale -> Scale -> Scale -> Scale."""
    for c in range(CHAINS):
        adapter.create(op(c, 0), "core.Fill", {"Count": ELEMENTS, "Value": 1.0 + c})
        for k in range(1, LENGTH):
            adapter.create(op(c, k), "core.Scale", {"Factor": 1.0})
            adapter.connect(op(c, k - 1), "Out", op(c, k), "In")


class Session:
    """The structure edits, in turn, one chain each (``step`` returns what it did)."""

    def __init__(self, adapter: HostAdapter, every: int) -> None:
        self.adapter, self.every, self.turn = adapter, every, 0
        self.recreated: list[tuple[str, int]] = []  # (operator, frame of its creation)
        self.later: dict[int, list] = {}  # frame -> edits due then (the second half of a pair)

    def step(self, frame: int) -> list[str]:
        a, done = self.adapter, []
        for edit in self.later.pop(frame, []):
            done.append(edit())
        if frame % self.every == 0:
            c = self.turn % CHAINS
            kind = (self.turn // CHAINS + self.turn) % 5
            self.turn += 1
            if kind == 0:  # hot swap to code; back to the block type 20 frames later
                a.hot_swap(op(c, 2), CODE_A if self.turn % 2 else CODE_B)
                done.append(f"hot swap {op(c, 2)} to CUDA code")
                self._due(frame + 20, lambda c=c: (a.hot_swap(op(c, 2), "core.Scale"), f"hot swap {op(c, 2)} back")[1])
            elif kind == 1:  # move a link to the next chain, and back 15 frames later
                n = (c + 1) % CHAINS
                a.disconnect(op(c, 2), "Out", op(c, 3), "In")
                a.connect(op(n, 2), "Out", op(c, 3), "In")
                done.append(f"link {op(c, 3)}.In moved to {op(n, 2)}")

                def back(c=c, n=n) -> str:
                    a.disconnect(op(n, 2), "Out", op(c, 3), "In")
                    a.connect(op(c, 2), "Out", op(c, 3), "In")
                    return f"link {op(c, 3)}.In moved back"

                self._due(frame + 15, back)
            elif kind == 2:  # delete the chain's last operator; re-create it 10 frames later
                a.delete(op(c, 4))
                done.append(f"delete {op(c, 4)}")

                def create(c=c, due=frame + 10) -> str:
                    a.create(op(c, 4), "core.Scale", {"Factor": 1.0})
                    a.connect(op(c, 3), "Out", op(c, 4), "In")
                    self.recreated.append((op(c, 4), due))
                    return f"re-create {op(c, 4)}"

                self._due(frame + 10, create)
            elif kind == 3:  # rename, and back 10 frames later
                a.rename(op(c, 3), op(c, 3) + "r")
                done.append(f"rename {op(c, 3)}")

                def back(c=c) -> str:
                    a.rename(op(c, 3) + "r", op(c, 3))  # its links follow it
                    return f"rename {op(c, 3)} back"

                self._due(frame + 10, back)
            else:  # bypass, and on again 10 frames later
                a.set_bypass(op(c, 1), True)
                done.append(f"bypass {op(c, 1)}")
                self._due(frame + 10, lambda c=c: (a.set_bypass(op(c, 1), False), f"bypass {op(c, 1)} off")[1])
        return done

    def _due(self, frame: int, edit) -> None:
        self.later.setdefault(frame, []).append(edit)


def counters(engine: Engine) -> dict[str, int]:
    return dataclasses.asdict(engine.counters)


def what_it_did(before: dict[str, int], after: dict[str, int]) -> str:
    moved = {k: after[k] - before[k] for k in after if after[k] != before[k] and k != "frames"}
    return ", ".join(f"{k} +{v}" for k, v in moved.items()) or "launch only"


def paced(run, frames: int) -> list[float]:
    """``run()`` once a frame at 60 fps: each call's ms."""
    out = []
    for _ in range(frames):
        t = time.perf_counter_ns()
        run()
        dt = (time.perf_counter_ns() - t) / 1e6
        out.append(dt)
        time.sleep(max(0.0, PERIOD - dt / 1e3))
    return out


def bare_launches(engine: Engine, frames: int) -> list[float]:
    """The peer: the running executable launched bare at 60 fps, no engine code."""
    with engine._graph_lock:
        assert not engine.building and engine.graph is not None
        engine.device.make_current()
        exec_, stream, launch = engine.graph.handle, engine.resources.stream, d.cuGraphLaunch
        out = paced(lambda: check(launch(exec_, stream)), frames)
        engine.synchronize()
    return out


def bare_hot_frames(engine: Engine, adapter: HostAdapter, frames: int) -> list[float]:
    """The driver's peer of a frame with only the sliders in it: the 20 slider blocks' kernel nodes
    set (``cuGraphExecKernelNodeSetParams`` with the parameters they hold) and the executable
    launched, bare at 60 fps, no engine code."""
    with engine._graph_lock:
        assert not engine.building and engine.graph is not None
        engine.device.make_current()
        # (the node a slider patches: a fused group's kernel where the chain fused)
        nodes = [patched_node(engine, adapter.block(op(c, 1)).id, "Factor") for c in range(CHAINS)]
        exec_, stream, launch, set_params = (
            engine.graph.handle,
            engine.resources.stream,
            d.cuGraphLaunch,
            d.cuGraphExecKernelNodeSetParams,
        )

        def frame() -> None:
            for n in nodes:
                check(set_params(exec_, n.handle, n.params))
            check(launch(exec_, stream))

        out = paced(frame, frames)
        engine.synchronize()
    return out


def running(engine: Engine, adapter: HostAdapter, name: str) -> bool:
    g = engine.graph
    return g is not None and name in adapter.operators() and adapter.block(name).id in g.plan.block_order


def summary(name: str, ms: list[float]) -> dict[str, float]:
    q = statistics.quantiles(ms, n=100)
    slow = sum(1 for x in ms if x > SLOW_MS)
    print(f"{name:44} median {statistics.median(ms):7.3f}  p99 {q[98]:7.3f}  max {max(ms):7.3f} ms  over 2 ms: {slow}")
    return {"median_ms": statistics.median(ms), "p99_ms": q[98], "max_ms": max(ms), "over_2ms": slow}


def main(args: argparse.Namespace) -> None:
    engine = Engine(name="host-driven")
    adapter = HostAdapter(engine, PluginHost().registry)
    cook = adapter.engine_operator.cook
    make_patch(adapter)
    for code in (CODE_A, CODE_B):  # both swap kernels compiled once, as a live coder's first try
        adapter.create("warmup", "core.Scale")
        adapter.hot_swap("warmup", code)
        engine.wait_ready()
        adapter.delete("warmup")
    engine.wait_ready()
    for _ in range(60):
        cook()
    engine.synchronize()

    session, frames, live = Session(adapter, args.every), [], {}
    for f in range(args.frames):
        t0 = time.perf_counter_ns()
        for c in range(CHAINS):  # a slider per chain, moved every frame
            adapter.set_param(op(c, 1), "Factor", 1.0 + 0.25 * math.sin(0.05 * f + c))
        edits = session.step(f)
        t1 = time.perf_counter_ns()
        before, building = counters(engine), engine.building
        cook()
        t2 = time.perf_counter_ns()
        frames.append(
            {
                "frame": f,
                "edit_ms": (t1 - t0) / 1e6,
                "cook_ms": (t2 - t1) / 1e6,
                "edits": edits,
                "engine": what_it_did(before, counters(engine)),
                "building": building or engine.building,
            }
        )
        for name, since in session.recreated:
            if name not in live and running(engine, adapter, name):
                live[name] = f - since + 1
        time.sleep(max(0.0, PERIOD - (time.perf_counter_ns() - t0) / 1e9))
    engine.wait_ready()
    for _ in range(30):
        cook()
    engine.synchronize()
    quiet = paced(cook, args.frames)
    engine.synchronize()
    bare = bare_launches(engine, args.frames)
    sliding = iter(range(args.frames))

    def hot_cook() -> None:  # the sliders of a session frame and the cook, no structure edit
        f = next(sliding)
        for c in range(CHAINS):
            adapter.set_param(op(c, 1), "Factor", 1.0 + 0.25 * math.sin(0.05 * f + c))
        cook()

    hot = paced(hot_cook, args.frames)
    engine.synchronize()
    bare_hot = bare_hot_frames(engine, adapter, args.frames)

    print(
        f"{CHAINS * LENGTH} operators in {CHAINS} chains, {args.frames} frames at 60 fps, one edit every {args.every}"
    )
    print(f"{'frame':>5} {'edits ms':>8} {'cook ms':>8}  edits | what the engine did in the cook")
    slow = [r for r in frames if r["edit_ms"] + r["cook_ms"] > SLOW_MS]
    for r in slow:
        # The sliders alone patch one node each: a cook that did only that reads against the slider peers.
        sliders_only = r["engine"] in ("launch only", f"hot_updates +{CHAINS}, nodes_patched +{CHAINS}")
        if r["cook_ms"] > SLOW_MS:
            cause = "sliders only: see the slider peers" if sliders_only else "engine"
        else:
            cause = "edit calls" if r["edit_ms"] > SLOW_MS else "no engine work"
        print(
            f"{r['frame']:5d} {r['edit_ms']:8.2f} {r['cook_ms']:8.2f}  {'; '.join(r['edits']) or '-'} | {r['engine']}"
            f"{' (build in flight)' if r['building'] else ''}  [{cause}]"
        )
    if not slow:
        print("  (none)")
    results = {
        "edit frames: cook": summary("edit frames: cook()", [r["cook_ms"] for r in frames]),
        "edit frames: edits + cook": summary(
            "edit frames: edit calls + cook()", [r["edit_ms"] + r["cook_ms"] for r in frames]
        ),
        "quiet cook": summary("peer: cook() with no edits", quiet),
        "bare launch": summary("peer: bare cuGraphLaunch at 60 fps", bare),
        "slider cook": summary(f"peer: {CHAINS} sliders + cook(), no edits", hot),
        "bare sliders": summary(f"peer: bare {CHAINS} SetParams + launch", bare_hot),
    }
    waits = sorted(live.values())
    if waits:
        print(
            f"re-created operators running after (frames): median {statistics.median(waits)}, max {max(waits)}"
            f" over {len(waits)}; never: {len(session.recreated) - len(waits)}"
        )
    results["recreated_live_frames"] = waits
    results["slow_frames"] = slow
    write_results("host_driven.json", results)
    engine.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=1000)
    ap.add_argument("--every", type=int, default=10, help="frames between structure edits")
    main(ap.parse_args())
