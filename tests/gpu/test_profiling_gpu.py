"""Profiling on a real GPU: per-block and per-kernel times, live level switches, append counts at the
Deep levels, and a frame path that never waits except at DeepSync."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import AppendFilter, CudapatchError, Engine, Fill, ProfilingLevel, Scale

from .conftest import Spin, StreamMark, stream_idle

pytestmark = pytest.mark.gpu


def _frames(engine: Engine, n: int = 6) -> None:
    for _ in range(n):
        engine.update()
    engine.synchronize()
    engine.update()  # the frames above are complete now: their numbers can be read


def test_block_times_follow_the_work(engine: Engine) -> None:
    # Measured one workload at a time: blocks running side by side share the GPU, and a span then
    # includes the other's occupancy.
    engine.set_profiling("PerBlock")
    ms = {}
    for name, count in (("small", 1 << 20), ("big", 10 << 20)):
        src = engine.add(Fill(name=f"{name}_src", Count=count, Value=1.0))
        blk = engine.add(Scale(name=name))
        engine.connect(src, "Out", blk, "In")
        _frames(engine)
        stats = engine.show_frame()  # the numbers on the blocks and the engine too
        ms.update({b.name: b.gpu_ms for b in stats.blocks})
        assert stats.gpu_ms >= ms[name] > 0 and stats.age is not None and stats.frame is not None
        if name == "big":
            assert str(blk).startswith("big: OK, ") and str(blk).endswith("ms")
            assert "Launch: " in str(engine) and "Profiling: PerBlock" in str(engine)
        else:
            engine.remove(src)
            engine.remove(blk)
    ratio = ms["big"] / ms["small"]
    assert 4 < ratio < 25, f"10x the work took {ratio:.1f}x the time ({ms})"


def test_levels_switch_live(engine: Engine) -> None:
    f = engine.add(Fill(name="f", Count=1 << 16, Value=2.0))
    k = engine.add(AppendFilter(name="k", Capacity=1 << 16, Threshold=1.0))
    engine.connect(f, "Out", k, "In")
    _frames(engine)
    st = engine.stats()
    assert st.gpu_ms is None and engine.graph.plan.stamp_count == 0 and st.level is ProfilingLevel.NONE
    with pytest.raises(CudapatchError, match="unknown profiling level 'Loud'"):
        engine.set_profiling("Loud")
    for level in ("Summary", "PerBlock", "PerKernel", "DeepAsync", "DeepSync"):
        rebuilds = engine.counters.rebuilds
        engine.set_profiling(level)
        _frames(engine)
        st = engine.show_frame()
        assert engine.counters.rebuilds == rebuilds + 1 and st.level.value == level
        assert st.gpu_ms is not None and st.gpu_ms > 0
        blocks = {b.name: b for b in st.blocks}
        lvl = ProfilingLevel.parse(level)
        assert (blocks["k"].gpu_ms is not None) == lvl.at_least(ProfilingLevel.PER_BLOCK)
        assert (blocks["k"].kernels[0].gpu_ms is not None) == lvl.at_least(ProfilingLevel.PER_KERNEL)
        assert (blocks["k"].kernels[0].occupancy is not None) == lvl.at_least(ProfilingLevel.DEEP_ASYNC)
        assert blocks["k"].append["Kept"].count == 1 << 16  # every element is 2.0 > 1.0
        deep = lvl.at_least(ProfilingLevel.DEEP_ASYNC)
        assert ("Kept: 65536/65536" in str(k)) == deep
        assert any(d.code == "append-full" for d in engine.diagnostics(k))  # 100 % full: a per-frame warning
    k.set("Capacity", 1 << 17)
    _frames(engine)
    engine.show_frame()
    assert not any(d.code == "append-full" for d in engine.diagnostics(k))  # warnings are per frame


def test_deep_async_lags_at_most_two_frames_and_deep_sync_is_exact(engine: Engine) -> None:
    rng = np.random.default_rng()
    n = 1 << 15
    x = rng.standard_normal(n).astype(np.float32)
    k = engine.add(AppendFilter(name="k", Capacity=n))
    engine.bind(k, "In", x)
    thresholds = rng.uniform(-2, 2, 60)
    expected = [int(np.count_nonzero(x > np.float32(t))) for t in thresholds]
    for level in ("DeepAsync", "DeepSync"):
        engine.set_profiling(level)
        engine.update()
        engine.synchronize()
        for i, t in enumerate(thresholds):
            k.set("Threshold", float(t))
            engine.update()
            launched = engine.counters.frames - 1
            st = engine.stats()
            if st.frame is None or st.frame < launched - i:  # before this level's first frame completed
                continue
            lag = launched - st.frame
            assert lag <= 2, f"{level}: counts are {lag} frames old"
            j = i - lag
            assert {b.name: b for b in st.blocks}["k"].append["Kept"].count == expected[j]
            if level == "DeepSync":
                assert lag == 0


@pytest.mark.parametrize("level", ["None", "Summary", "PerBlock", "PerKernel", "DeepAsync", "DeepSync"])
def test_only_deep_sync_waits_for_the_gpu(engine: Engine, level: str) -> None:
    spin = engine.add(Spin(name="spin", Cycles=1000))
    engine.set_profiling(level)
    engine.update()
    engine.synchronize()
    spin.set("Cycles", int(1e8))  # >= 50 ms at any H100 clock
    engine.update()
    with StreamMark(engine) as frame_before:  # reached once the long kernel's frame is done
        engine.update()  # queued behind the long kernel, runs it again
        before_running, idle = frame_before.pending(), stream_idle(engine)
        engine.synchronize()
    if level == "DeepSync":
        assert idle, "DeepSync returned while its frame ran: it must wait for the frame"
    else:
        assert before_running, f"update() at {level} returned only after the frame before finished: it waited"
