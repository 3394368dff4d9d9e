"""CollectorFreeze: the engine's objects leave the collector's full scans after each build."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from cudapatch.engine import collector
from cudapatch.engine.collector import CollectorFreeze


@pytest.fixture(autouse=True)
def _thawed() -> Iterator[None]:
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the test session collects as usual


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_a_build_freezes_what_the_collector_tracks() -> None:
    c = CollectorFreeze()
    kept = [_Node() for _ in range(100)]
    c.after_build()
    assert c.freezes == 1
    assert gc.get_freeze_count() >= len(kept)
    assert not any(gc.is_tracked(n) and n in gc.get_objects(2) for n in kept[:3])  # out of the full scans


def test_disabled_leaves_the_collector_alone() -> None:
    c = CollectorFreeze(enabled=False)
    c.after_build()
    assert c.freezes == 0
    assert gc.get_freeze_count() == 0


def test_the_freeze_is_undone_every_so_many_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(collector, "THAW_EVERY", 3)
    c = CollectorFreeze()
    for _ in range(3):
        c.after_build()
    garbage = [_Node() for _ in range(1000)]  # frozen cycles that become garbage
    c.after_build()  # not frozen: thawed
    assert (c.freezes, c.thaws) == (3, 1)
    assert gc.get_freeze_count() == 0
    ids = {id(n) for n in garbage}
    del garbage
    gc.collect()  # after the thaw a full collection frees them
    assert not ids & {id(o) for o in gc.get_objects() if isinstance(o, _Node)}
    c.after_build()
    assert c.freezes == 4


def test_no_collection_runs_during_a_build_and_its_objects_are_frozen_after() -> None:
    c = CollectorFreeze()
    runs: list[int] = []
    callback = lambda phase, info: runs.append(info["generation"]) if phase == "start" else None  # noqa: E731
    gc.callbacks.append(callback)
    try:
        with c.building():
            assert not gc.isenabled()
            made = [_Node() for _ in range(20_000)]  # far over generation 0's threshold
        assert runs == [] and gc.isenabled()
        assert gc.get_freeze_count() >= len(made)  # frozen before collection came back on
    finally:
        gc.callbacks.remove(callback)


def test_overlapping_builds_turn_collection_back_on_once_both_end() -> None:
    a, b = CollectorFreeze(), CollectorFreeze()
    with a.building():
        with b.building():
            pass
        assert not gc.isenabled()  # the other build still runs
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    try:
        with CollectorFreeze().building():
            pass
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


def test_disabled_does_not_pause_collection() -> None:
    with CollectorFreeze(enabled=False).building():
        assert gc.isenabled()


def test_an_edit_frame_that_ends_while_its_build_runs_leaves_collection_off_until_the_build_ends() -> None:
    # The frame thread pauses collection for an edit frame, starts a build in it, and ends the frame
    # while the build runs on the build thread: collection must stay off until the build ends.
    c = CollectorFreeze()
    collector.pause_collector()  # the edit frame
    build = c.building()
    build.__enter__()  # the build it started, on the build thread
    collector.resume_collector()  # the edit frame ends
    assert not gc.isenabled()
    made = [_Node() for _ in range(1000)]
    build.__exit__(None, None, None)
    assert gc.isenabled() and gc.get_freeze_count() >= len(made)


def test_edit_frames_alone_pause_and_resume_without_freezing() -> None:
    collector.pause_collector()
    assert not gc.isenabled()
    collector.resume_collector()
    assert gc.isenabled() and gc.get_freeze_count() == 0
