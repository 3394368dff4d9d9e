"""Frame statistics without a GPU: times from timestamps, threshold warnings, a reading that changes
nothing, and the writers that show it on blocks."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from cudapatch import AppendFilter, Fill, ProfilingLevel, Scale, compile_plan
from cudapatch.blocks import BlockState
from cudapatch.engine import Context
from cudapatch.engine.built_view import BuiltShower, built_view
from cudapatch.engine.plan import TimingPair
from cudapatch.engine.stats import (
    FrameReading,
    append_warnings,
    collect_stats,
    frame_times,
    newest_frame,
    occupancy_warnings,
    show_on_blocks,
)


class Ring:
    """The readback ring's reading side: a poll takes the newest frame; frozen, values stay put."""

    def __init__(self, frame: int | None, stamps: list[int]) -> None:
        self.latest_frame, self.stamps = frame, len(stamps)
        self.latest_stamps = np.array(stamps, dtype=np.uint64)
        self.frozen, self.polls = False, 0

    def poll(self) -> bool:
        self.polls += 1
        return True

    def age(self) -> int | None:
        return None if self.latest_frame is None else 1


class Appends:
    """An append output as the running graph holds it."""

    def __init__(self, count: int | None, capacity: int) -> None:
        self.count, self.capacity = count, capacity
        self.overflowed = count is not None and count > capacity


def test_frame_times_from_timestamps() -> None:
    timings = [TimingPair("graph", None, 0, 3), TimingPair("block", 7, 1, 2), TimingPair("kernel", (7, 0), 1, 2)]
    stamps = np.array([1_000_000, 1_200_000, 1_700_000, 3_000_000], dtype=np.uint64)
    assert frame_times(timings, stamps) == (2.0, {7: 0.5}, {(7, 0): 0.5})
    backwards = np.array([5, 3, 0, 0], dtype=np.uint64)  # out of order: zero, never a wrapped huge value
    assert frame_times([TimingPair("block", 1, 0, 1)], backwards)[1] == {1: 0.0}


def test_threshold_warnings() -> None:
    c = Context()
    k = c.register_block(AppendFilter(name="k"))
    s = c.register_block(Scale(name="s"))
    appends = {(k.id, "Kept"): Appends(97, 100), (s.id, "Out"): Appends(94, 100), (99, "Gone"): Appends(100, 100)}
    (full,) = append_warnings(appends, c.registry)  # 94 % is below the line; a removed block is not warned
    assert full.block_id == k.id and full.code == "append-full" and "'k.Kept' is 97% full (97/100)" in full.message
    assert append_warnings({(k.id, "Kept"): Appends(None, 100)}, c.registry) == ()  # no frame completed yet
    (low,) = occupancy_warnings({(k.id, 0): 0.125, (s.id, 0): 0.5}, c.registry)
    assert low.block_id == k.id and low.code == "low-occupancy" and "12%" in low.message


def test_a_reading_holds_one_frame_and_collecting_changes_nothing() -> None:
    c = Context()
    f = c.register_block(Fill(name="f", Count=100))
    k = c.register_block(AppendFilter(name="k", Capacity=100))
    c.connect(f, "Out", k, "In")
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.PER_BLOCK)
    ring = Ring(12, [0] * plan.stamp_count)
    ring.latest_stamps[:] = np.arange(plan.stamp_count, dtype=np.uint64) * 1_000_000
    graph = SimpleNamespace(plan=plan, readback=ring, appends={(k.id, "Kept"): Appends(100, 100)}, occupancy={})
    graph.kernel_count = 2
    BuiltShower(c.registry).apply(built_view(plan, {b.id: b.name for b in c.registry}, None), graph.appends)
    assert k.debug.append == {"Kept": graph.appends[(k.id, "Kept")]} and k.debug.sizes["Kept"] == 100
    with newest_frame(graph) as reading:
        assert ring.frozen and ring.polls == 1 and reading.frame == 12 and reading.age == 1
        pool = SimpleNamespace(in_use_bytes=10, total_allocated_bytes=20)
        before = (k.debug.state, k.debug.message, k.debug.gpu_ms, dict(k.debug.append_fill))
        stats = collect_stats(
            level=ProfilingLevel.DEEP_ASYNC, blocks=c.registry, graph=graph, reading=reading, pool=pool, diagnostics=()
        )
        assert (k.debug.state, k.debug.message, k.debug.gpu_ms, dict(k.debug.append_fill)) == before
    assert not ring.frozen
    rows = {b.name: b for b in stats.blocks}
    assert stats.frame == 12 and stats.gpu_ms is not None and rows["k"].gpu_ms is not None
    assert rows["k"].append["Kept"].count == 100 and rows["k"].state == BlockState.NOT_COMPILED.value
    assert stats.kernels == 2 and stats.pool_total_bytes == 20
    show_on_blocks(stats, c.registry)
    assert k.debug.gpu_ms == rows["k"].gpu_ms and k.debug.append_fill == {"Kept": (100, 100)}
    with newest_frame(None) as nothing:
        assert nothing == FrameReading()
