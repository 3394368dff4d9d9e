"""Profiling without a GPU: levels, event placement in the plan, tooltip formats."""

from __future__ import annotations

import pytest

from cudapatch import AppendFilter, Fill, ProfilingLevel, Scale, VectorAdd, compile_plan
from cudapatch.blocks import BlockState
from cudapatch.engine import Context, KernelNodePlan, MemsetNodePlan, StampNodePlan
from cudapatch.errors import CudapatchError


def _patch() -> tuple[Context, list]:
    c = Context()
    f = c.register_block(Fill(name="f", Count=1000))
    s = c.register_block(Scale(name="s"))
    a = c.register_block(VectorAdd(name="a"))
    k = c.register_block(AppendFilter(name="k"))
    c.connect(f, "Out", s, "In")
    c.connect(f, "Out", a, "A")
    c.connect(s, "Out", a, "B")
    c.connect(a, "Sum", k, "In")
    return c, [f, s, a, k]


def _check_order(plan) -> None:
    for n in plan.nodes:
        assert all(d < n.index for d in n.deps), n  # dependencies point backwards: a valid launch order
    assert [n.index for n in plan.nodes] == list(range(len(plan.nodes)))


def test_level_names() -> None:
    assert ProfilingLevel.parse("PerBlock") is ProfilingLevel.PER_BLOCK
    assert ProfilingLevel.parse("deep_sync") is ProfilingLevel.DEEP_SYNC
    assert ProfilingLevel.parse(ProfilingLevel.NONE) is ProfilingLevel.NONE
    with pytest.raises(CudapatchError, match=r"unknown profiling level 'Fast' \(levels: None, Summary, PerBlock"):
        ProfilingLevel.parse("Fast")
    assert ProfilingLevel.PER_KERNEL.at_least(ProfilingLevel.PER_BLOCK) and not ProfilingLevel.NONE.timed


def test_none_places_no_events() -> None:
    c, _ = _patch()
    plan = compile_plan(c.snapshot())
    assert not any(isinstance(n, StampNodePlan) for n in plan.nodes) and plan.stamp_count == 0 and not plan.timings


@pytest.mark.parametrize(
    ("level", "events", "pairs"),
    [
        (ProfilingLevel.SUMMARY, 2, 1),
        (ProfilingLevel.PER_BLOCK, 10, 5),
        (ProfilingLevel.PER_KERNEL, 18, 9),
        (ProfilingLevel.DEEP_SYNC, 18, 9),
    ],
)
def test_event_placement(level: ProfilingLevel, events: int, pairs: int) -> None:
    c, (f, s, a, k) = _patch()
    plan = compile_plan(c.snapshot(), level=level)
    _check_order(plan)
    ev = [n for n in plan.nodes if isinstance(n, StampNodePlan)]
    assert len(ev) == events == plan.stamp_count and len(plan.timings) == pairs
    first, last = plan.nodes[0], plan.nodes[-1]
    assert isinstance(first, StampNodePlan) and first.stamp == 0 and not first.deps  # the graph starts here
    assert isinstance(last, StampNodePlan) and last.stamp == 1
    kernels = [n for n in plan.nodes if isinstance(n, KernelNodePlan)]
    used = {d for n in plan.nodes for d in n.deps}
    assert all(n.index in used for n in plan.nodes[:-1]), "every node leads to the end stamp"
    by_block = {n.block_id: n for n in kernels}

    def reaches(src: int, dst: int) -> bool:
        stack, seen = [dst], set()
        while stack:
            x = stack.pop()
            if x == src:
                return True
            if x not in seen:
                seen.add(x)
                stack.extend(plan.nodes[x].deps)
        return False

    assert reaches(by_block[f.id].index, by_block[s.id].index) and reaches(by_block[s.id].index, by_block[a.id].index)
    memset = next(n for n in plan.nodes if isinstance(n, MemsetNodePlan))
    assert reaches(memset.index, by_block[k.id].index)
    # slots follow the renumbering
    ((ni, ai),) = plan.scalar_slots[(s.id, "Factor")]
    assert plan.nodes[ni] is by_block[s.id] and ai == 2
    if level.at_least(ProfilingLevel.PER_BLOCK):
        block_pairs = {p.key: p for p in plan.timings if p.kind == "block"}
        assert set(block_pairs) == {f.id, s.id, a.id, k.id}
        start = next(n for n in ev if n.stamp == block_pairs[a.id].start)
        end = next(n for n in ev if n.stamp == block_pairs[a.id].end)
        assert reaches(start.index, by_block[a.id].index)  # the kernel waits for its block's start stamp
        assert end.deps == (by_block[a.id].index,)  # the end stamp waits for the kernel
        assert not any(end.index in n.deps for n in plan.nodes if n is not plan.nodes[-1])  # nothing else waits
    if level.at_least(ProfilingLevel.PER_KERNEL):
        assert {p.key for p in plan.timings if p.kind == "kernel"} == {(b.id, 0) for b in (f, s, a, k)}


def test_tooltip_formats() -> None:
    s = Scale(name="Emitter")
    assert str(s) == "Emitter: NotCompiled"
    s.debug.state = BlockState.OK
    assert str(s) == "Emitter: OK"
    s.debug.gpu_ms = 0.4234
    assert str(s) == "Emitter: OK, 0.42ms"
    s.debug.append_fill = {"Particles": (45231, 100000)}
    assert str(s) == "Emitter: OK, 0.42ms\n  Particles: 45231/100000"
    assert str(s.port("Out")) == "Out: float[?]"
    s.debug.sizes = {"Out": 1000}
    assert str(s.port("Out")) == "Out: float[1000]"
    k = AppendFilter(name="k")
    k.debug.append_fill = {"Kept": (3, 64)}
    assert str(k.port("Kept")) == "Kept: 3/64"
    with pytest.raises(CudapatchError, match="no such port"):
        s.port("Nope")
    s.debug.state, s.debug.message, s.debug.gpu_ms, s.debug.append_fill = BlockState.ERROR, "faulted", None, {}
    assert str(s) == "Emitter: Error: faulted"


def test_ring_harvests_the_newest_completed_frame_without_waiting() -> None:
    from cudapatch.engine.readback import newest_completed

    frames: list[int | None] = [None, None, None]
    done_slots: set[int] = set()
    asked: list[int] = []

    def done(slot: int) -> bool:  # a fake event source: which slots' copies have finished
        asked.append(slot)
        return slot in done_slots

    assert newest_completed(0, frames, None, None, done) is None  # nothing recorded yet: no timings, no wait
    frames[:] = [10, 11, 12]  # frames 10..12 in slots 0..2; the next frame goes to slot 0
    assert newest_completed(0, frames, None, None, done) is None and asked == [2, 1, 0]  # none finished
    done_slots |= {0, 1}
    assert newest_completed(0, frames, None, None, done) == 1  # 12 is in flight: 11 is the newest done
    assert newest_completed(0, frames, 1, 11, done) is None  # already held: older slots are not looked at
    done_slots.add(2)
    assert newest_completed(0, frames, 1, 11, done) == 2
    frames[0] = 13  # slot 0 reused for frame 13 (wrap-around), not yet finished
    done_slots.discard(0)
    asked.clear()
    assert newest_completed(1, frames, 2, 12, done) is None and asked == [0]  # stops at the held slot 2
    done_slots.add(0)
    assert newest_completed(1, frames, 2, 12, done) == 0
    assert newest_completed(1, frames, None, 13, done) is None  # not newer than what is held
