"""The frame guard: a build's Python waits at its checkpoints while a frame runs on the frame thread
(``kernels/pacing.py``), and the engine holds it through every ``update()`` a build overlaps."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from cudapatch import Scale
from cudapatch.engine.build_thread import BuildWorker
from cudapatch.kernels import pacing
from cudapatch.kernels.pacing import FRAME_GUARD, FrameGuard

from .test_engine_orchestration import FakeGraph
from .test_live_builds import Realizer, _chain, _landed, engine, realizer  # noqa: F401 (fixtures)


@pytest.fixture
def long_checkpoints(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that waited for a frame the test never ends would hang the test, not pass it."""
    monkeypatch.setattr(pacing, "CHECKPOINT_TIMEOUT_S", 30.0)


def test_a_checkpoint_on_another_thread_goes_on_only_after_the_frame(long_checkpoints: None) -> None:
    guard, order, started = FrameGuard(), [], threading.Event()

    def build() -> None:
        started.set()
        guard.checkpoint()
        order.append("build")

    assert guard.enter()
    t = threading.Thread(target=build)
    t.start()
    assert started.wait(5.0)
    time.sleep(0.05)  # the build thread is at its checkpoint (or would be past it by now)
    order.append("frame")
    guard.leave()
    t.join(5.0)
    assert order == ["frame", "build"] and not guard.in_frame


def test_the_frame_thread_passes_its_own_checkpoints(long_checkpoints: None) -> None:
    guard = FrameGuard()
    assert guard.enter()
    guard.checkpoint()  # a build made inside the frame (``wait_for_compile``) never waits for itself
    assert guard.in_frame
    guard.leave()
    guard.checkpoint()  # no frame: an attribute test
    assert not guard.in_frame


def test_a_second_frame_thread_runs_unguarded_and_cannot_end_the_first_ones_frame() -> None:
    guard, results = FrameGuard(), {}
    assert guard.enter()

    def other() -> None:
        results["entered"] = guard.enter()
        guard.leave()  # not its guard: nothing
        results["still"] = guard.in_frame

    t = threading.Thread(target=other)
    t.start()
    t.join(5.0)
    assert results == {"entered": False, "still": True}
    assert guard.lift() and not guard.in_frame  # the holder gives it up
    assert not guard.lift()  # nothing left to give up


def test_waiting_for_a_build_inside_a_frame_lets_its_checkpoints_go_on(long_checkpoints: None) -> None:
    worker = BuildWorker(lambda: None)
    passed: list[int] = []

    def job() -> str:
        for i in range(3):
            pacing.checkpoint()
            passed.append(i)
        return "built"

    assert FRAME_GUARD.enter()
    try:
        worker.submit(job)
        assert worker.wait(10.0)  # a fault's recovery waits for the build: the guard is lifted meanwhile
        assert passed == [0, 1, 2] and worker.take() == "built"
        assert FRAME_GUARD.in_frame  # taken back for the rest of the frame
    finally:
        FRAME_GUARD.leave()
        worker.close()
    assert not FRAME_GUARD.in_frame


@pytest.fixture
def guarded(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """For each launch of a ``FakeGraph``: whether the launching thread held the frame guard."""
    held: list[bool] = []
    launch = FakeGraph.launch

    def recording(self: FakeGraph, stream: Any) -> None:
        held.append(FRAME_GUARD.owner == threading.get_ident())
        launch(self, stream)

    monkeypatch.setattr(FakeGraph, "launch", recording)
    return held


def test_update_holds_the_guard_while_a_build_is_in_flight(
    engine: Any,  # noqa: F811 (the fixture)
    realizer: Realizer,  # noqa: F811
    guarded: list[bool],
) -> None:
    _fill, scale = _chain(engine)
    _landed(engine)
    guarded.clear()
    engine.update()  # quiet: no build, no guard
    realizer.hold()
    more = engine.add(Scale(name="more"))
    engine.connect(scale, "Out", more, "In")
    engine.update()  # starts the build: the rest of this frame (its launch) runs first
    assert realizer.started.wait(5.0) and engine.building
    engine.update()  # a frame during the build
    assert guarded == [False, True, True]
    assert not FRAME_GUARD.in_frame  # let go after each frame
    realizer.gate.set()
    _landed(engine)
    guarded.clear()
    engine.update()
    assert guarded == [False] and not FRAME_GUARD.in_frame


def test_a_build_a_bypass_edit_starts_waits_for_the_rest_of_its_frame(
    engine: Any,  # noqa: F811 (the fixture)
    realizer: Realizer,  # noqa: F811
    guarded: list[bool],
) -> None:
    # A bypass inside a fused group needs a build (the inline path of ``update()`` takes that frame):
    # as for a structure edit, the launch of the frame that starts it runs before the build's Python.
    _fill, scale = _chain(engine)
    after = engine.add(Scale(name="after", Factor=0.5))
    engine.connect(scale, "Out", after, "In")
    _landed(engine)
    assert "fused" in str(scale)
    guarded.clear()
    realizer.hold()
    scale.enabled = False
    engine.update()  # starts the build that takes scale out of the group: this frame's launch first
    assert realizer.started.wait(5.0) and engine.building
    assert guarded == [True]
    assert not FRAME_GUARD.in_frame  # let go after the frame
    realizer.gate.set()
    _landed(engine)


def test_a_job_handed_over_inside_a_frame_starts_after_it(long_checkpoints: None) -> None:
    worker, order = BuildWorker(lambda: None), []
    assert FRAME_GUARD.enter()
    try:
        worker.submit(lambda: order.append("build"))
        time.sleep(0.05)  # the build thread is at its first checkpoint (or would have run by now)
        order.append("rest of the frame")
    finally:
        FRAME_GUARD.leave()
    assert worker.wait(10.0)
    worker.take()
    worker.close()
    assert order == ["rest of the frame", "build"]


def test_frames_hold_the_guard_while_background_python_says_it_is_working(
    engine: Any,  # noqa: F811 (the fixture)
    realizer: Realizer,  # noqa: F811
    guarded: list[bool],
) -> None:
    _fill, _scale = _chain(engine)
    _landed(engine)
    guarded.clear()
    engine.update()  # quiet, nothing working: no guard
    with FRAME_GUARD.working():  # as the specialiser's look (its checkpoints then wait for frames)
        assert FRAME_GUARD.busy == 1
        engine.update()  # quiet, but held
    assert guarded == [False, True] and FRAME_GUARD.busy == 0 and not FRAME_GUARD.in_frame


def test_work_outside_a_frame_holds_the_guard_once_and_lets_go_of_it_raised_or_not() -> None:
    me = threading.get_ident()
    with FRAME_GUARD.held():
        assert FRAME_GUARD.owner == me
        with FRAME_GUARD.held():  # nested: still held, and the outer one lets go
            assert FRAME_GUARD.owner == me
        assert FRAME_GUARD.owner == me
    assert not FRAME_GUARD.in_frame
    with pytest.raises(RuntimeError), FRAME_GUARD.held():
        raise RuntimeError("an edit that failed")
    assert not FRAME_GUARD.in_frame
