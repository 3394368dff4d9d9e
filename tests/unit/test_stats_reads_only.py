"""``Engine.stats()`` only reads; ``Engine.show_frame()`` is what puts a frame on the board and the
blocks. The real Engine over the stand-ins of test_engine_orchestration.py, with a readback ring and
an append output nearly full in the newest completed frame."""

from __future__ import annotations

from typing import Any

import numpy as np

from cudapatch import AppendFilter, DiagnosticCode, Engine, Fill, ProfilingLevel
from cudapatch.blocks import BlockState
from tests.unit.test_engine_orchestration import engine  # noqa: F401 - the fixture
from tests.unit.test_stats import Appends, Ring


def _nearly_full(e: Engine) -> tuple[Any, Any]:
    """A Fill into an AppendFilter whose Kept output held 99 of 100 elements in frame 12."""
    f = e.add(Fill(name="f", Count=100))
    k = e.add(AppendFilter(name="k", Capacity=100))
    e.connect(f, "Out", k, "In")
    e.set_profiling(ProfilingLevel.PER_BLOCK)
    e.update()  # builds without the blocks: their kernels are compiling
    e.update()  # the compiles landed: rebuilt with them
    g = e.resources.graph
    assert set(g.plan.block_order) == {f.id, k.id}
    g.readback = Ring(12, [0] * g.plan.stamp_count)
    g.readback.latest_stamps[:] = np.arange(g.plan.stamp_count, dtype=np.uint64) * 1_000_000
    g.appends = {(k.id, "Kept"): Appends(99, 100)}
    return f, k


def _shown(e: Engine) -> tuple:
    blocks = tuple((b.debug.state, b.debug.message, b.debug.gpu_ms, dict(b.debug.append_fill)) for b in e.blocks)
    return e.diagnostics(), blocks, str(e)


def test_stats_reports_the_frame_and_changes_no_diagnostic_and_no_block(engine: Engine) -> None:  # noqa: F811
    f, k = _nearly_full(engine)
    before = _shown(engine)
    frames = engine.counters.frames
    stats = engine.stats()
    (full,) = [d for d in stats.diagnostics if d.code is DiagnosticCode.APPEND_FULL]  # reported with its frame
    assert full.block_id == k.id and stats.frame == 12
    assert {b.name: b.gpu_ms is not None for b in stats.blocks} == {"f": True, "k": True}
    assert _shown(engine) == before  # ... but neither published nor put on a block
    assert k.debug.state is BlockState.OK and engine.counters.frames == frames
    engine.stats()
    assert _shown(engine) == before


def test_show_frame_publishes_the_frames_warnings_and_numbers(engine: Engine) -> None:  # noqa: F811
    f, k = _nearly_full(engine)
    stats = engine.show_frame()
    assert [d.code for d in engine.diagnostics(k)] == [DiagnosticCode.APPEND_FULL]
    assert k.debug.state is BlockState.WARNING and "99% full" in k.debug.message
    assert k.debug.gpu_ms == next(b.gpu_ms for b in stats.blocks if b.name == "k") and "Launch: " in str(engine)
    engine.resources.graph.appends = {(k.id, "Kept"): Appends(10, 100)}  # a later frame, no longer full
    assert not [d for d in engine.stats().diagnostics if d.block_id == k.id]
    assert k.debug.state is BlockState.WARNING  # still the frame shown last, until the next show_frame
    engine.show_frame()
    assert not engine.diagnostics(k) and k.debug.state is BlockState.OK
