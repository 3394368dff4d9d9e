#!/usr/bin/env python3
"""Liveness benchmark: what a structure edit costs the frame, beside the quiet frames of the same run.

Chains of N ``Scale`` blocks (1024 floats). With ``update()`` running every frame: add a block at
the end, remove its link, link it again, remove it; ``--rounds`` times (3), so that one slow frame
of a noisy machine reads as one sample of three. For each edit: the slowest ``update()`` from the
edit until it is live (the median of the rounds, each round's and the max in the note), against
the quiet median (target ≤ max(1 ms, 3× quiet)), and the frames until live in each round (target
≤ 3 at 100 and 1,000 blocks, ≤ 500 ms at 10,000), and the builds the edits took (one each: a
second build after an edit made it live frames later), with each round's build in the note (host ms
of its plan and realize on the build thread, and when it swapped in). Peer: a bare ``cuGraphLaunch`` of
the same executable graph, timed in alternating runs with it (target: quiet ``update()`` ≤ 1.5× it),
after a warm-up, before the edits and again after them, each time once the engine has settled
(``settle``: the specialiser's Code swaps of a fused chain's kernels landed; any that land meanwhile
are noted). Beside
the edits, the driver's floor in the same run: a thread builds a graph of the same kernel nodes with
raw driver calls (add the nodes, instantiate, upload, 10 times) while the running graph is launched
bare at 60 fps, no engine code running; its slowest launch shows what the driver's lock alone costs
a launch during a build, so each edit's slowest ``update()`` reads against it (in the note) as well
as against the budget. Above 2,000 nodes, the same floor had the patch been split into executables
of at most 2,000 nodes, each instantiated right after a frame (the one way around the lock), beside
what launching the split executables costs a quiet frame against launching the one.

Then, on the same chain: bypass a block in the middle and turn it back on, 200 times (the host time
of ``enabled = False`` plus the ``update()`` that applies it, beside quiet ``update()`` calls timed
in alternating runs with the toggles; target
≤ 10 µs of host time, 0 instantiations; the first bypass, carried (the block's node copies its
input) from the frame that applies it until a build that gives the block's shared buffers their own
lands, is listed apart; peer: the bare toggle, ``cuGraphNodeSetEnabled`` of the
block's node, ``cuGraphExecKernelNodeSetParams`` of its reader and ``cuGraphLaunch`` on the running
graph, beside a bare launch, same run), and grow the bound input to twice its size (slowest
``update()`` until the chain runs at the new size, frames until live, instantiations: target none,
the buffers are reallocated in place; peer: ``cuGraphExecKernelNodeSetParams`` of every kernel node
and a launch, bare on the same executable, same run: the driver's part of a patch that changes every
node).

With ``--fuse`` the engine fuses (its default; the chain runs as groups of about 500 blocks, one
kernel each, and an edit plans the groups from the first one it touches): the four edits and the
growth (the bypass rows need a node per block).

Usage: ``python benchmarks/bench_liveness.py [--sizes 100 1000 10000] [--elements 1024] [--fuse]``.
Writes ``liveness.json`` to ``$RESULTS_DIR`` when set.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _results import write_results  # noqa: E402
from _timing import (  # noqa: E402
    bare_build_beside_launches,
    bare_bypass_toggle_us,
    bare_patch_every_node_us,
    bare_split_launch_us,
    host_us_side_by_side,
    kernel_node,
    kernel_nodes,
    update_and_bare_launch_us,
)

from cudapatch import Engine, Scale  # noqa: E402
from cudapatch.engine.compiler.fusion import FUSED_KERNEL  # noqa: E402
from cudapatch.engine.memory_plan import shares_with_others  # noqa: E402

#: The structure edits timed, in the order each round makes them.
EDITS = ("add block", "remove link", "add link", "remove block")


class LiveRun(NamedTuple):
    """What ``until_live`` saw: the slowest ``update()`` (µs), the frames until live (-1: never), the
    seconds that took, and the latest a frame started (ms past its time: another thread of the
    process held the interpreter when the frame thread woke, which ``update()``'s time cannot show)."""

    worst: float
    frames: int
    seconds: float
    late_ms: float
    build: str = ""  # the last build's host ms when it returned (``build_note``)


def build_note(e: Engine) -> str:
    """The engine's last build: the host ms of its plan and realize (on the build thread; realize:
    kernel nodes made, instantiated, uploaded), and the ms from its start to its swap."""
    b, g = e.last_build, e.graph
    if b.tier != "cold" or g is None:  # (a Warm resize keeps the graph, and its timing, of an older build)
        return f"{b.compile_ms + b.realize_ms:.1f} ({b.tier or 'none'}: plan {b.compile_ms:.1f}; at {b.total_ms:.1f})"
    timing = g.timing
    return (
        f"{b.compile_ms + b.realize_ms:.1f} (plan {b.compile_ms:.1f}, nodes {timing.get('nodes_ms', 0.0):.1f},"
        f" instantiate {timing.get('instantiate_ms', 0.0):.1f}; swapped at {b.total_ms:.1f})"
    )


#: Where ``until_live`` also records, when a list: ``(start, end, "late" or "update", ms)`` (perf_counter
#: seconds) of each frame that started over 0.5 ms late and each ``update()`` over 1 ms
#: (``probes/probe_late_starts.py``).
EVENTS: list[tuple[float, float, str, float]] | None = None


def until_live(e: Engine, live, fps: float = 60.0, limit_s: float = 30.0, settled: bool = True) -> LiveRun:
    """Run frames at ``fps`` until ``live()`` (and, ``settled``, no build in flight)."""
    worst, frames, late, t_start = 0.0, 0, 0.0, time.perf_counter()
    period = 1.0 / fps
    events = EVENTS
    while True:
        t = time.perf_counter_ns()
        e.update()
        took = (time.perf_counter_ns() - t) / 1e3
        worst = max(worst, took)
        if events is not None and took > 1000:
            events.append((t / 1e9, t / 1e9 + took / 1e6, "update", took / 1e3))
        frames += 1
        if live() and not (settled and e.building):
            return LiveRun(worst, frames, time.perf_counter() - t_start, late, build_note(e))
        if time.perf_counter() - t_start > limit_s:
            return LiveRun(worst, -1, limit_s, late)
        wait = max(0.0, period - (time.perf_counter_ns() - t) / 1e9)
        slept = time.perf_counter()
        time.sleep(wait)
        late_ms = (time.perf_counter() - slept - wait) * 1e3
        if events is not None and late_ms > 0.5:
            events.append((slept + wait, time.perf_counter(), "late", late_ms))
        late = max(late, late_ms)


def settle(e: Engine, limit_s: float = 20.0) -> str:
    """Frames at 60 fps until the engine has nothing to do between them (or ``limit_s``): no build and
    no freeing after one, no compiled kernel waiting to be swapped in, every fused kernel of the running
    graph specialised on its resting values. The specialiser's builds land as Code swaps for a while
    after each new graph (a fused 10,000-block chain: about 20 kernels), and a frame that swaps one in
    is no quiet frame. Returns how long it took, for the note."""
    start = time.perf_counter()
    e._worker.wait(limit_s)
    deadline = time.perf_counter() + limit_s  # (after the build thread's wait: the specialiser's looks need time)
    while time.perf_counter() < deadline:
        g = e.graph
        fused = [] if g is None else [(k.block_id, k.kernel) for k in g.plan.kernel_nodes if k.kernel == FUSED_KERNEL]
        if not e.building and not e.kernels.ready and all(g.specialized(key) for key in fused):
            e._worker.wait(limit_s)
            return f"in {time.perf_counter() - start:.1f} s"
        e.update()
        time.sleep(1 / 60)
    return f"not within {limit_s:.0f} s"


def quiet_note(e: Engine, waited: str, swaps: int) -> str:
    """The quiet row's note: the target, how long ``settle`` took, and any specialised kernel swapped in
    while the frames were timed (``swaps``: the count before; such a frame is no quiet one)."""
    note = f"≤ 1.5×; settled {waited}"
    if e.counters.specializations != swaps:
        note += f", {e.counters.specializations - swaps} specialised kernels swapped in meanwhile"
    return note


def scale_chain(e: Engine, n: int, x: np.ndarray) -> list[Scale]:
    """A chain of ``n`` ``Scale`` blocks (factor 1) in ``e``, ``x`` bound to the first one's input."""
    blocks = [e.add(Scale(name="s0", Factor=1.0))]
    e.bind(blocks[0], "In", x)
    for i in range(1, n):
        b = e.add(Scale(name=f"s{i}", Factor=1.0))
        e.connect(blocks[-1], "Out", b, "In")
        blocks.append(b)
    return blocks


def running(e: Engine, block) -> bool:
    g = e.graph
    return g is not None and block.id in g.plan.block_order


def bench_size(n: int, elements: int, fuse: bool = False, rounds: int = 3) -> list[tuple[str, float, str, float, str]]:
    rows = []
    # fuse=False: a node and a buffer per block (the speed of fused kernels: bench_fusion.py)
    with Engine(name=f"chain{n}", fuse=fuse) as e:
        blocks = scale_chain(e, n, np.random.default_rng(1).standard_normal(elements).astype(np.float32))
        e.wait_ready()
        e.update()
        # Quiet frames on a quiet engine: the build thread may still free what the first builds
        # replaced, a piece at a time, and would take its share of the interpreter (as for the toggles),
        # and the specialiser's builds land as Code swaps (``settle``).
        waited = settle(e)
        swaps = e.counters.specializations
        update_and_bare_launch_us(e, 400)  # warm-up, not kept: the first frames of a process run slower
        quiet, bare = update_and_bare_launch_us(e)  # in alternating runs: the machine's drift moves both
        rows.append((f"{n}: quiet update() µs", quiet, "bare cuGraphLaunch µs", bare, quiet_note(e, waited, swaps)))
        budget = max(1000.0, 3 * quiet)
        floor, frames, phases = bare_build_beside_launches(e)  # the driver's part of an edit's slowest frame
        build = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
        note = f"{frames} frames; build ms: {build}"
        rows.append((f"{n}: bare build beside launches, slowest launch µs", floor, "budget µs", budget, note))
        peer = f"bare build {floor:.0f} µs"
        if len(kernel_nodes(e)) > SPLIT_NODES:  # the one way around the driver's lock, and its cost
            rows += bare_split_rows(e, n, budget)
        instantiations = e.counters.rebuilds
        builds = e.counters.rebuilds + e.counters.warm_resizes  # a second build after an edit shows here
        runs: dict[str, list[LiveRun]] = {k: [] for k in EDITS}
        for r in range(rounds):  # the four edits again with a new block: one sample of each per round
            tail = e.add(Scale(name=f"tail{r}"))
            e.connect(blocks[-1], "Out", tail, "In")
            runs["add block"].append(until_live(e, lambda t=tail: running(e, t)))
            e.disconnect(blocks[-1], "Out", tail, "In")
            runs["remove link"].append(until_live(e, lambda t=tail: not running(e, t)))
            e.connect(blocks[-1], "Out", tail, "In")
            runs["add link"].append(until_live(e, lambda t=tail: running(e, t)))
            e.remove(tail)
            runs["remove block"].append(
                until_live(e, lambda t=tail: e.graph is not None and t.id not in e.graph.plan.block_order)
            )
        for kind, got in runs.items():
            worst = [run.worst for run in got]
            if kind == "remove block":  # the block is gone at once; the frames say when its nodes are
                live = "; ".join(f"{run.seconds * 1e3:.0f}" for run in got) + " ms"
            else:
                live = "live in " + "; ".join(str(run.frames) for run in got) + " frames"
            each = ", ".join(f"{w:.0f}" for w in worst)
            late = max(run.late_ms for run in got)
            build_ms = "; ".join(run.build for run in got)
            note = (
                f"{live}; each round µs: {each} (max {max(worst):.0f}); {peer}; frames up to {late:.1f} ms late;"
                f" build ms: {build_ms}"
            )
            rows.append(
                (f"{n}: {kind}, slowest update() µs (median)", statistics.median(worst), "budget µs", budget, note)
            )
        edits = 4 * rounds
        rows.append(
            (f"{n}: instantiations for {edits} edits", e.counters.rebuilds - instantiations, "edits", edits, "")
        )
        built = e.counters.rebuilds + e.counters.warm_resizes - builds
        rows.append((f"{n}: builds (Cold + Warm) for {edits} edits", built, "edits", edits, "one each"))
        # The same quiet frame again, once the edits' builds have settled: a second sample of the target,
        # taken later in the process (the first one's machine may still have been warming up)
        waited = settle(e)
        swaps = e.counters.specializations
        again, bare = update_and_bare_launch_us(e)
        note = quiet_note(e, waited, swaps)
        rows.append((f"{n}: quiet update() µs, after the edits", again, "bare cuGraphLaunch µs", bare, note))
        if not fuse:  # a fused member has no node of its own to turn off until a build takes it out
            rows += bench_bypass(e, blocks[n // 2], blocks[n // 2 + 1], quiet)
        rows += bench_growth(e, blocks, elements, budget)
    if fuse:
        rows = [(f"{name} (fused)", *rest) for name, *rest in rows]
    return rows


#: The executables' size in the split peer: 2,000 chained kernel nodes instantiate in about 5 ms on
#: the H100 host, which fits between two frames at 60 fps.
SPLIT_NODES = 2_000


def bare_split_rows(e: Engine, n: int, budget: float) -> list[tuple[str, float, str, float, str]]:
    """The driver's floor had the patch been split into executables of at most ``SPLIT_NODES`` nodes:
    the slowest raw launch while a thread builds the split graphs (each instantiated right after a
    frame), and a quiet frame's raw launches of the split executables beside one launch of the
    engine's single executable (a quiet ``update()`` may take 1.5x that)."""
    floor, frames, phases = bare_build_beside_launches(e, split=SPLIT_NODES)
    build = ", ".join(f"{k} {v:.1f}" for k, v in phases.items())
    split, one, execs = bare_split_launch_us(e, SPLIT_NODES)
    return [
        (
            f"{n}: bare split build beside launches, slowest launch µs",
            floor,
            "budget µs",
            budget,
            f"{execs} executables of ≤ {SPLIT_NODES:,} nodes, each instantiated after a frame; "
            f"{frames} frames; build ms: {build}",
        ),
        (
            f"{n}: bare launch of the split executables µs",
            split,
            "bare launch of one µs",
            one,
            "what the split would cost every quiet frame (target for update(): ≤ 1.5× one)",
        ),
    ]


def _graphs_made(e: Engine) -> int:
    c = e.counters
    return c.instantiations + c.exec_updates


def _bypassed(e: Engine, block: Scale) -> bool:
    """The running graph has ``block``'s values in buffers of their own and its nodes turned off."""
    g = e.graph
    if g is None or shares_with_others(g.plan, {block.id}):
        return False
    return bool(g.plan.block_nodes.get(block.id)) and set(g.plan.block_nodes[block.id]) <= g.bypass.disabled


def _carried(e: Engine, block: Scale) -> bool:
    """The running graph runs a copy of ``block``'s input in place of its node (``bypass.Carry``: its
    values still share buffers, the build that pins them is in flight)."""
    g = e.graph
    nodes = g.plan.block_nodes.get(block.id) if g is not None else None
    return bool(nodes) and set(nodes) <= set(g.bypass.carried)


def bench_bypass(
    e: Engine, block: Scale, reader: Scale, quiet: float, toggles: int = 200
) -> list[tuple[str, float, str, float, str]]:
    """Host time of a bypass toggle: the flag set plus the ``update()`` that applies it, beside the
    driver's part of it on the running graph (``bare_bypass_toggle_us``: ``block``'s node turned on
    and off, ``reader``'s, the next block's, parameters set, a launch), measured after the toggles.

    With buffer reuse (the default) the chain's blocks share buffers, so the first bypass of the
    block is carried (its node copies its input) from the frame that applies it, until one build
    that gives its values buffers of their own lands (listed apart); every toggle after that is the
    Bypass tier alone."""
    n = len(e.blocks)
    made = _graphs_made(e)
    copies = e.resources.copy_kernels() is not None
    block.enabled = False
    first, seen, *_ = until_live(e, lambda: _carried(e, block) or _bypassed(e, block), settled=False)
    assert seen > 0, "the first bypass never reached the running graph"
    how = "carried" if _carried(e, block) else "turned off"
    worst, frames, after = first, seen, 0.0
    if not (_bypassed(e, block) and not e.building):
        after, more, *_ = until_live(e, lambda: _bypassed(e, block))
        assert more > 0, "the build that pins the first bypass never landed"
        worst, frames = max(first, after), seen + more
    pin_builds = _graphs_made(e) - made
    made, updates = _graphs_made(e), e.counters.bypass_updates
    # The toggles start on a quiet engine: the build thread frees the replaced plan a piece at a time
    # after the first bypass's build (1,000 blocks: a few ms), and toggles timed back to back meanwhile
    # would time its share of the interpreter (a host toggling at 60 fps finds it done).
    e._worker.wait(10.0)
    e.update()
    e.synchronize()
    flips = [0]

    def toggle_and_update() -> None:
        block.enabled = flips[0] % 2 == 0  # on, off, on, ... (it starts off)
        flips[0] += 1
        e.update()

    # In alternating runs with quiet frames (as the bare toggle with bare launches): a machine that
    # drifts meanwhile moves both; ``quiet`` (timed before the edits) is printed beside them
    assert 2 * toggles % 10 == 0, "ten alternating runs of the same whole number of toggles"
    toggle, quiet_now = host_us_side_by_side(toggle_and_update, e.update, 2 * toggles, e.synchronize, rounds=10)
    e.synchronize()
    assert e.counters.bypass_updates - updates == 2 * toggles and _bypassed(e, block)  # it ends off
    # The driver's part, on the graph the toggles left running (the block off, its reader redirected).
    bare, launch = bare_bypass_toggle_us(e, kernel_node(e, block.id), kernel_node(e, reader.id))
    more = f"ours +{toggle - quiet_now:.1f} beyond quiet update(), bare +{bare - launch:.1f} beyond a launch"
    return [
        (
            f"{n}: first bypass, slowest update() µs",
            worst,
            "builds",
            pin_builds,
            f"visible in {seen} frame(s) ({how}{'' if copies else '; copy kernels not loaded yet'}),"
            f" its pinning build live in {frames}; slowest until visible {first:.0f} µs, after {after:.0f} µs",
        ),
        (f"{n}: bypass toggle + update() µs (median)", toggle, "bare toggle µs", bare, f"target ≤ 10 µs more; {more}"),
        (
            f"{n}: bare toggle µs (enable+params+launch)",
            bare,
            "bare launch µs",
            launch,
            f"quiet update() {quiet_now:.1f} µs beside the toggles, {quiet:.1f} before the edits",
        ),
        (f"{n}: instantiations for {2 * toggles} toggles", _graphs_made(e) - made, "toggles", 2 * toggles, "target 0"),
    ]


def bench_growth(e: Engine, blocks: list, elements: int, budget: float) -> list[tuple[str, float, str, float, str]]:
    """Grow the chain's bound input to twice its size while frames run at 60 fps."""
    n = len(blocks)
    made, growths = _graphs_made(e), e.counters.growths
    big = np.random.default_rng(2).standard_normal(2 * elements).astype(np.float32)
    e.bind(blocks[0], "In", big)
    last = blocks[-1]

    def grown() -> bool:
        g = e.graph
        return (
            g is not None
            and g.plan.outputs.get((last.id, "Out")) is not None
            and e.output(last, "Out").count == 2 * elements
        )

    worst, frames, *_ = until_live(e, grown)
    note = f"live in {frames} frames, {e.counters.growths - growths} buffers grown"
    # the driver's floor: every node patched, then the launch (on a quiet engine: not after a timeout)
    bare = bare_patch_every_node_us(e) if frames > 0 else float("nan")
    return [
        (f"{n}: grow input 2x, slowest update() µs", worst, "budget µs", budget, note),
        (f"{n}: grow input 2x, slowest update() µs", worst, "bare patch of every node µs", bare, "the driver's floor"),
        (f"{n}: instantiations for the growth", _graphs_made(e) - made, "edits", 1, "target 0"),
    ]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 1000, 10000])
    ap.add_argument("--elements", type=int, default=1024)
    ap.add_argument("--fuse", action="store_true", help="the engine's default: Scale chains fuse into groups")
    ap.add_argument("--rounds", type=int, default=3, help="how many times each structure edit is timed")
    args = ap.parse_args()
    rows = []
    print(f"{'measure':56} {'ours':>10} {'peer':>22} {'peer val':>10} {'ratio':>8}  note")
    for n in args.sizes:  # each size's rows as soon as it is done (10,000 blocks take a while)
        size_rows = bench_size(n, args.elements, args.fuse, args.rounds)
        for name, ours, peer, pv, note in size_rows:
            ratio = f"{ours / pv:.2f}" if pv else "-"
            print(f"{name:56} {ours:10.1f} {peer:>22} {pv:10.1f} {ratio:>8}  {note}", flush=True)
        rows += size_rows
    write_results(
        "liveness.json", [dict(zip(("measure", "ours", "peer", "peer_val", "note"), r, strict=True)) for r in rows]
    )


if __name__ == "__main__":
    main()
