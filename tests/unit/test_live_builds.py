"""Builds on the build thread, without a GPU: the real Engine over the stand-in device, kernel builder
and executable graphs of test_engine_orchestration, with a realize that waits for the test to let it
finish. Covers the swap protocol (the old graph launches until the frame boundary after the build),
coalescing of edits made during a build, Hot values set meanwhile reaching the new graph, a failed
build keeping the running graph, ``wait_ready`` and ``close`` with a build in flight. The driver side
is tested on the GPU (tests/gpu/test_live_builds_gpu.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest

from cudapatch import DiagnosticCode, Engine, Fill, Scale
from cudapatch.blocks.description import like
from cudapatch.engine import build as build_module
from cudapatch.engine import engine as engine_module
from cudapatch.engine import resources as resources_module
from cudapatch.engine.build_thread import BuildWorker
from cudapatch.engine.kernels import KernelOutcome
from cudapatch.errors import CudaError
from cudapatch.kernels import bundled_kernel

from .test_engine_orchestration import FakeBuilder, FakeDevice, FakeGraph, FakeModules


class LiveGraph(FakeGraph):
    """A stand-in graph that takes a plan in place when ``decide_warm_patch`` would (its buffers have
    room), as the real one does: a build whose plan did not change is a Warm resize, not Cold."""

    def __init__(self, plan: Any, **kw: Any) -> None:
        super().__init__(plan, **kw)
        self.buffers = [type("Alloc", (), {"capacity_bytes": 1 << 30})() for _ in plan.buffers]

    def try_patch(self, plan: Any, bindings: Any, functions: Any, *, decided: Any = None) -> int | None:
        self.plan = plan
        self.decided = decided
        return 0

    def trim_patch(self, decision: Any) -> Any:
        return decision

    def prepare_patch(self, decision: Any, bindings: Any) -> None:
        return None  # patched by ``try_patch`` alone (the prepared path runs in test_prepared_patch)


class Realizer:
    """``realize`` on the build thread: makes a FakeGraph once the test opens ``gate`` (open at first)."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.gate.set()
        self.started = threading.Event()
        self.threads: list[str] = []
        self.fail: str | None = None
        self.made: list[LiveGraph] = []

    def __call__(self, plan: Any, **kw: Any) -> LiveGraph:
        self.threads.append(threading.current_thread().name)
        self.started.set()
        assert self.gate.wait(10.0), "the test never let the build finish"
        if self.fail is not None:
            raise CudaError(self.fail, name="CUDA_ERROR_INVALID_VALUE")
        g = LiveGraph(plan, **kw)
        self.made.append(g)
        return g

    def hold(self) -> None:
        self.gate.clear()
        self.started.clear()


@pytest.fixture
def realizer(monkeypatch: pytest.MonkeyPatch) -> Realizer:
    r = Realizer()
    monkeypatch.setattr(resources_module, "DeviceContext", FakeDevice)
    monkeypatch.setattr(resources_module, "ModuleCache", FakeModules)
    monkeypatch.setattr(engine_module, "KernelBuilder", FakeBuilder)
    monkeypatch.setattr(build_module, "realize", r)
    monkeypatch.setattr(FakeGraph, "fault", False)
    return r


@pytest.fixture
def engine(realizer: Realizer) -> Any:
    e = Engine(cache_dir=False, watch_files=False)
    yield e
    realizer.gate.set()
    e.close()


@pytest.fixture
def engine_here(realizer: Realizer) -> Any:
    e = Engine(cache_dir=False, watch_files=False, background_builds=False)
    yield e
    e.close()


def _landed(e: Engine, timeout: float = 5.0) -> None:
    """Run frames until no build is in flight and nothing structural is pending."""
    deadline = time.monotonic() + timeout
    while e.building or e.context.dirty.structure or e.kernels.pending or e.kernels.ready:
        assert time.monotonic() < deadline, "the build never landed"
        e._worker.wait(1.0)
        e.update()


def _chain(e: Engine) -> tuple[Any, Any]:
    fill = e.add(Fill(name="fill", Count=1024, Value=2.0))
    scale = e.add(Scale(name="scale", Factor=3.0))
    e.connect(fill, "Out", scale, "In")
    return fill, scale


def test_the_old_graph_launches_until_the_build_is_swapped_in_at_a_frame_boundary(
    engine: Engine, realizer: Realizer
) -> None:
    fill, scale = _chain(engine)
    _landed(engine)
    old = engine.graph
    assert isinstance(old, FakeGraph) and set(old.plan.block_order) == {fill.id, scale.id}
    assert all(name == "cudapatch-build" for name in realizer.threads)  # never on the frame thread
    n = old.launches
    realizer.hold()
    more = engine.add(Scale(name="more"))
    engine.connect(scale, "Out", more, "In")
    engine.update()  # starts the build; launches the old graph
    assert realizer.started.wait(5.0) and engine.building and "(building)" in str(engine)
    for _ in range(3):
        engine.update()
    assert engine.graph is old and old.launches == n + 4 and not old.retired
    realizer.gate.set()
    engine._worker.wait(5.0)
    assert engine.graph is old  # nothing changes between frames
    engine.update()  # the frame boundary: swap, then launch the new graph
    new = engine.graph
    assert new is not old and new.launches == 1 and old.retired and old.launches == n + 4
    assert more.id in new.plan.block_order  # its kernel compiled while the build waited: in at once
    _landed(engine)
    assert engine.graph is new and "(building)" not in str(engine)


def test_edits_during_a_build_coalesce_into_one_next_build(engine: Engine, realizer: Realizer) -> None:
    _, scale = _chain(engine)
    _landed(engine)
    rebuilds = engine.counters.rebuilds
    realizer.hold()
    added = [engine.add(Scale(name="a0"))]
    engine.connect(scale, "Out", added[0], "In")
    engine.update()
    assert realizer.started.wait(5.0)
    prev = added[0]
    for i in range(1, 4):  # three more edits while the first build runs
        b = engine.add(Scale(name=f"a{i}"))
        engine.connect(prev, "Out", b, "In")
        added.append(b)
        prev = b
        engine.update()
    assert engine.counters.rebuilds == rebuilds and len(realizer.made) == rebuilds
    realizer.gate.set()
    _landed(engine)
    assert engine.counters.rebuilds == rebuilds + 2  # the first build, then one for the three edits
    assert {b.id for b in added} <= set(engine.graph.plan.block_order)  # type: ignore[union-attr]


def test_hot_values_set_during_a_build_reach_the_new_graph(engine: Engine, realizer: Realizer) -> None:
    _, scale = _chain(engine)
    _landed(engine)
    old = engine.graph
    realizer.hold()
    engine.connect(scale, "Out", engine.add(Scale(name="more")), "In")
    engine.update()  # the snapshot holds Factor = 3.0
    assert realizer.started.wait(5.0)
    scale.set("Factor", 7.0)
    engine.update()  # Hot, on the running graph
    assert old.scalars[-1] == {(scale.id, "Factor"): scale.params["Factor"]}  # type: ignore[union-attr]
    scale.set("Factor", 9.0)  # set, but no frame before the swap
    realizer.gate.set()
    engine._worker.wait(5.0)
    engine.update()
    new = engine.graph
    assert new is not old and isinstance(new, FakeGraph) and new.launches == 1
    carried = {k: v.value for d in new.scalars for k, v in d.items()}
    assert carried == {(scale.id, "Factor"): 9.0}  # re-applied before its first launch


def test_a_failed_build_keeps_the_running_graph_and_puts_the_error_on_the_blocks(
    engine: Engine, realizer: Realizer
) -> None:
    _chain(engine)
    _landed(engine)
    old = engine.graph
    n = old.launches  # type: ignore[union-attr]
    realizer.fail = "out of parameter space"
    fill, scale = engine.blocks
    engine.disconnect(fill, "Out", scale, "In")  # Cold: scale leaves the graph
    engine.update()
    engine._worker.wait(5.0)
    engine.update()
    assert engine.graph is old and old.launches == n + 2 and engine.counters.failed_rebuilds == 1  # type: ignore[union-attr]
    (d,) = [d for d in engine.diagnostics() if d.code == DiagnosticCode.REALIZE]
    assert "out of parameter space" in d.message and not engine.building
    engine.update()  # not retried every frame
    assert engine.counters.failed_rebuilds == 1 and not engine.building


def test_wait_ready_takes_the_build_in_flight_and_the_next_update_runs_the_built_graph(
    engine: Engine, realizer: Realizer
) -> None:
    fill, scale = _chain(engine)
    realizer.hold()
    engine.update()  # a build starts (kernels still compiling)
    assert realizer.started.wait(5.0)
    threading.Timer(0.05, realizer.gate.set).start()
    engine.wait_ready()
    g = engine.graph
    assert g is not None and set(g.plan.block_order) == {fill.id, scale.id} and not engine.building
    engine.update()
    assert engine.graph is g and g.launches == 1  # type: ignore[attr-defined]


def test_close_during_a_build_frees_its_graph_and_installs_nothing(engine: Engine, realizer: Realizer) -> None:
    _chain(engine)
    _landed(engine)
    old = engine.graph
    realizer.hold()
    engine.connect(engine.blocks[1], "Out", engine.add(Scale(name="more")), "In")
    engine.update()
    assert realizer.started.wait(5.0)
    threading.Timer(0.05, realizer.gate.set).start()
    engine.close()
    assert engine.is_closed and realizer.made[-1].closed and realizer.made[-1] is not old
    assert engine._worker.is_closed and not engine.building


def test_removing_a_block_during_a_build_keeps_its_upload_until_a_later_graph_runs(
    engine: Engine, realizer: Realizer
) -> None:
    import numpy as np

    freed: list[Any] = []
    src = engine.add(Fill(name="src", Count=16))
    s = engine.add(Scale(name="s"))
    engine.connect(src, "Out", s, "In")
    engine.resources._uploads[(s.id, "In")] = type("Buf", (), {"close": lambda self: freed.append(self)})()
    _landed(engine)
    realizer.hold()
    t = engine.add(Scale(name="t"))
    engine.connect(s, "Out", t, "In")
    engine.update()
    assert realizer.started.wait(5.0)
    engine.remove(s)  # the build in flight still has s
    assert not freed
    realizer.gate.set()
    _landed(engine)  # this build had s; the next one (the removal) frees it when installed
    assert len(freed) == 1 and t.id not in engine.graph.plan.block_order  # type: ignore[union-attr]
    assert np.isfinite(engine.last_build.total_ms)


def test_the_worker_hands_back_a_job_exception_and_refuses_a_second_job() -> None:
    w = BuildWorker(lambda: None)
    gate = threading.Event()
    w.submit(gate.wait)
    with pytest.raises(RuntimeError, match="in flight"):
        w.submit(lambda: None)
    gate.set()
    assert w.wait(5.0) and w.done and w.take() is True
    w.submit(lambda: 1 / 0)
    w.wait(5.0)
    with pytest.raises(ZeroDivisionError):
        w.take()
    assert w.close(5.0) is None and w.is_closed
    with pytest.raises(RuntimeError, match="closed"):
        w.submit(lambda: None)


def test_a_paced_job_goes_on_at_the_end_of_a_frame_and_its_deferred_work_after_its_outcome() -> None:
    w = BuildWorker(lambda: None)
    order: list[str] = []

    def job() -> str:
        w.defer(lambda: order.append("deferred"))
        w.pace()  # waits for the frame thread's next frame end
        order.append("after frame")
        return "built"

    try:
        w.submit(job)
        deadline = time.monotonic() + 5.0
        while not w.gate.wanted and time.monotonic() < deadline:
            time.sleep(0.001)
        assert w.gate.wanted and order == []  # waiting at the gate, not timed out
        w.gate.open()  # what Engine.update() does after its launch
        deadline = time.monotonic() + 5.0
        while not w.done and time.monotonic() < deadline:
            time.sleep(0.001)
        assert w.take() == "built" and order[0] == "after frame"
        w.gate.open()  # the deferred work waits for the next frame's end, too
        assert w.wait(5.0)  # and wait() waits for it
        assert order == ["after frame", "deferred"]
    finally:
        w.close(5.0)


def test_waiting_for_a_paced_job_lets_it_go_on_without_a_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudapatch.engine import build_thread

    monkeypatch.setattr(build_thread, "PACE_TIMEOUT_S", 60.0)  # no frame comes: only wait() can let it go
    w = BuildWorker(lambda: None)
    try:
        w.submit(lambda: (w.pace(), "built")[1])
        assert w.wait(5.0) and w.take() == "built"
    finally:
        w.close(5.0)


def test_an_outcome_handed_over_is_freed_on_the_worker_after_the_next_jobs_frame() -> None:
    """The worker holds the last outcome it handed over (a frame thread dropping the last reference
    would free a whole build's snapshot in its frame): the next job frees it right after a frame."""
    import weakref

    class Outcome:
        pass

    freed: list[str] = []
    w = BuildWorker(lambda: None)
    try:
        w.submit(Outcome)
        assert w.wait(5.0)
        first = w.take()
        weakref.finalize(first, lambda: freed.append(threading.current_thread().name))
        del first
        assert freed == []  # the worker's reference: not freed on this thread
        w.submit(lambda: "second")
        w.gate.open()
        assert w.wait(5.0) and w.take() == "second"
        w.gate.open()  # (the end of a frame: then it goes)
        assert w.wait(5.0)
        assert len(freed) == 1 and freed[0] != threading.current_thread().name
    finally:
        w.close(5.0)


def test_a_kernel_swapped_in_during_a_build_is_swapped_into_the_new_graph(engine: Engine, realizer: Realizer) -> None:
    from cudapatch import CustomKernel

    from .test_engine_orchestration import GAIN

    fill = engine.add(Fill(name="fill", Count=256))
    ck = engine.add(CustomKernel(name="ck", Code=GAIN))
    engine.connect(fill, "Out", ck, "in")
    _landed(engine)
    old = engine.graph
    realizer.hold()
    engine.connect(ck, "out", engine.add(Scale(name="more")), "In")
    engine.update()
    assert realizer.started.wait(5.0)
    ck.set("Code", GAIN.replace("gain;", "gain * 2.0f;"))  # same signature: swapped into the running graph
    assert old.swaps == [(ck.id, 0)]  # type: ignore[union-attr]
    realizer.gate.set()
    engine._worker.wait(5.0)
    engine.update()
    new = engine.graph
    assert new is not old and new.swaps == [(ck.id, 0)]  # type: ignore[union-attr]


def test_a_build_runs_with_a_short_gil_switch_interval_and_restores_it() -> None:
    import sys

    from cudapatch.engine.build_thread import BUILD_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    seen: list[float] = []
    w = BuildWorker(lambda: None)
    try:
        w.submit(lambda: seen.append(sys.getswitchinterval()))
        assert w.wait(5.0)
        w.take()
    finally:
        w.close(5.0)
    assert seen == [pytest.approx(min(before, BUILD_SWITCH_INTERVAL_S))]
    assert sys.getswitchinterval() == pytest.approx(before)


def test_the_switch_interval_is_short_from_the_moment_a_job_is_handed_over_until_the_worker_is_idle() -> None:
    import sys

    from cudapatch.engine.build_thread import BUILD_SWITCH_INTERVAL_S

    before = sys.getswitchinterval()
    short = pytest.approx(min(before, BUILD_SWITCH_INTERVAL_S))
    gate = threading.Event()
    w = BuildWorker(lambda: None)
    try:
        w.submit(lambda: gate.wait(5.0))
        # Lowered on the frame thread, before the worker's thread runs: a frame's driver call that lets
        # the worker take the GIL must not wait the default interval to get it back.
        assert sys.getswitchinterval() == short
        gate.set()
        assert w.wait(5.0)
        w.take()
        deadline = time.monotonic() + 5.0
        while sys.getswitchinterval() != pytest.approx(before) and time.monotonic() < deadline:
            time.sleep(0.001)
        assert sys.getswitchinterval() == pytest.approx(before)  # idle: as it was
    finally:
        w.close(5.0)
    assert sys.getswitchinterval() == pytest.approx(before)


def test_a_warm_build_is_decided_on_the_build_thread_and_applied_as_decided(engine: Engine, realizer: Realizer) -> None:
    fill, _ = _chain(engine)
    _landed(engine)
    g = engine.graph
    fill.set("Count", 512)  # a size edit: a Warm resize of the running graph
    _landed(engine)
    assert engine.graph is g and engine.last_build.tier == "warm-resize"
    assert g.decided is not None  # the frame thread did not decide again
    assert [b.count for b in g.plan.buffers][0] == 512


def test_the_graph_a_build_replaced_is_closed_on_the_next_build_thread(engine: Engine, realizer: Realizer) -> None:
    _, scale = _chain(engine)
    _landed(engine)
    first = engine.graph
    engine.connect(scale, "Out", engine.add(Scale(name="two")), "In")
    _landed(engine)
    assert first.retired
    engine.connect(scale, "Out", engine.add(Scale(name="three")), "In")
    _landed(engine)
    assert first.closed and first.closed_on == "cudapatch-build"  # not on the frame thread


class _Probe:
    pass


def test_a_builds_planning_drafts_are_freed_on_the_build_thread(
    engine: Engine, realizer: Realizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Freed where ``compile_plan`` returned, a large draft was one long cascade of deallocations; the
    build thread frees them a piece at a time after the build, and never the frame thread."""
    import weakref

    from cudapatch.engine.compiler.draft import PlanDraft

    freed: list[str] = []
    made: list[int] = []
    prepare = build_module.GraphBuilds.prepare

    def watched(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = prepare(self, *args, **kwargs)
        for draft in out.spent:  # (a slotted dataclass: a probe in a field nothing reads any more)
            if type(draft) is not PlanDraft:  # (the state and plan it replaced)
                continue
            probe = draft.regions["probe"] = _Probe()
            made.append(1)
            weakref.finalize(probe, lambda: freed.append(threading.current_thread().name))
        return out

    monkeypatch.setattr(build_module.GraphBuilds, "prepare", watched)
    _, scale = _chain(engine)
    _landed(engine)
    first = len(made)
    engine.connect(scale, "Out", engine.add(Scale(name="two")), "In")
    _landed(engine)
    engine._worker.wait(5.0)
    # (the last plan's drafts share parts with what the next plan resumes from: freed with it)
    assert first >= 1 and len(made) > first and len(freed) >= first and set(freed) == {"cudapatch-build"}, freed


def test_the_first_graph_stocks_spare_storages_and_a_replaced_one_gives_its_own_to_the_next_build(
    engine: Engine, realizer: Realizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Parameter storages (``params.new_storage``): the first graph of a patch has spares made for the
    # first edit's build; a replaced graph gives its own to the build after (it is retired and idle),
    # on the build thread before that build realizes anything, and is closed after it.
    _, scale = _chain(engine)
    _landed(engine)
    first = engine.graph
    engine._worker.wait(5.0)  # the chores after the build
    assert first.stocked_on == "cudapatch-build"
    given = []
    realizer_call = build_module.realize

    def realize(plan: Any, **kw: Any) -> Any:
        given.append(getattr(first, "gave_back_on", None))
        return realizer_call(plan, **kw)

    monkeypatch.setattr(build_module, "realize", realize)
    engine.connect(scale, "Out", engine.add(Scale(name="two")), "In")
    _landed(engine)
    second = engine.graph
    engine._worker.wait(5.0)
    assert first.retired and not hasattr(second, "stocked_on")  # it replaced one: that one's storages come back
    engine.connect(scale, "Out", engine.add(Scale(name="three")), "In")
    _landed(engine)
    assert given == [None, "cudapatch-build"] and first.closed  # given back before the second build realized
    assert first.stocks == 1


def test_spares_are_stocked_once_per_graph_and_let_go_when_an_engine_closes(realizer: Realizer) -> None:
    from cudapatch.engine.params import ParamStorage, _layout

    from .test_params import VALUES, _scale_node

    e = Engine(cache_dir=False, watch_files=False)
    _, scale = _chain(e)
    _landed(e)
    g = e.graph
    e._worker.wait(5.0)
    for i in range(3):  # builds the stand-in graph takes in place (Warm): the same graph
        e.connect(scale, "Out", e.add(Scale(name=f"w{i}")), "In")
        e.remove(e.blocks[-1])
        _landed(e)
        e._worker.wait(5.0)
    assert e.graph is g and g.stocks == 1
    node = _scale_node()
    _layout(node.descriptor).spares.append(ParamStorage(node, 42, VALUES))
    e.close()
    assert not _layout(node.descriptor).spares


def test_a_frame_thread_build_stocks_nothing(engine_here: Engine) -> None:
    _chain(engine_here)
    engine_here.update()
    assert engine_here.graph is not None and not hasattr(engine_here.graph, "stocks")
    assert engine_here._worker._thread is None  # no build thread started for it


def test_work_that_only_prepares_later_builds_gives_way_to_a_job_and_is_dropped_once_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cudapatch.engine import build_thread

    monkeypatch.setattr(build_thread, "PACE_TIMEOUT_S", 60.0)
    w = BuildWorker(lambda: None)
    ran: list[str] = []
    try:
        w.later(lambda: ran.append("stock"), yields=True)
        gate = threading.Event()
        w.submit(lambda: gate.wait(5.0) and ran.append("build"))  # comes before the chore's frame ends
        gate.set()
        deadline = time.monotonic() + 5.0
        while not w.done and time.monotonic() < deadline:
            time.sleep(0.001)
        w.take()
        w.wait(5.0)
        assert ran == ["build", "stock"]
    finally:
        w.close(5.0)
    w.later(lambda: ran.append("closed"), yields=True)
    assert ran == ["build", "stock"]


def _idle_retired_graph(engine: Engine) -> tuple[Scale, LiveGraph]:
    """A chain whose first graph a build replaced while the GPU still ran it (retired, not closed),
    and which the GPU is now done with: the chain's Scale and that graph."""
    _, scale = _chain(engine)
    _landed(engine)
    first = engine.graph
    first.is_idle = lambda: False  # the GPU still runs it while the next build lands
    engine.connect(scale, "Out", engine.add(Scale(name="two")), "In")
    _landed(engine)
    assert first.retired and not first.closed
    first.is_idle = lambda: True
    return scale, first


def test_a_graph_an_edit_frame_finds_idle_is_closed_on_the_build_thread(engine: Engine, realizer: Realizer) -> None:
    # A Hot edit (no build) reaps the retired graphs: the build thread closes them after a frame.
    scale, first = _idle_retired_graph(engine)
    scale.set("Factor", 5.0)
    engine.update()
    engine._worker.wait(5.0)  # its chores too
    assert first.closed and first.closed_on == "cudapatch-build"


def test_no_collection_runs_while_a_build_runs_after_the_frame_that_started_it(
    engine: Engine, realizer: Realizer
) -> None:
    import gc

    _, scale = _chain(engine)
    _landed(engine)
    assert gc.isenabled()
    realizer.hold()
    running = engine.graph
    launch = running.launch
    # The edit frame's launch lets the build thread run (a driver call releases the GIL): the build
    # starts while the edit frame still pauses the collector, and goes on after the frame.
    running.launch = lambda stream: (realizer.started.wait(5.0), launch(stream))
    engine.connect(scale, "Out", engine.add(Scale(name="two")), "In")
    engine.update()  # the edit frame: starts the build, which waits in realize
    assert realizer.started.is_set() and engine.building
    engine.update()  # a clean frame while it runs
    assert not gc.isenabled()  # the edit frame's own pause ended; the build's goes on
    realizer.gate.set()
    _landed(engine)
    assert gc.isenabled()


def test_graphs_handed_to_the_build_thread_are_closed_before_a_fault_resets_the_context(
    engine: Engine, realizer: Realizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudapatch.engine import recovery as recovery_module

    events: list[str] = []
    reset = FakeDevice.reset
    monkeypatch.setattr(FakeDevice, "reset", lambda self: (reset(self), events.append("reset")))
    scale, first = _idle_retired_graph(engine)
    first.close = lambda: events.append(f"close on {threading.current_thread().name}")
    monkeypatch.setattr(recovery_module, "attribute_in_child", lambda snap, **_: (scale.id, "faulted"))
    monkeypatch.setattr(FakeGraph, "fault", True)
    scale.set("Factor", 5.0)  # a Hot edit frame hands the idle retired graph to the build thread ...
    engine.update()  # ... and its launch faults: the recovery resets the context
    monkeypatch.setattr(FakeGraph, "fault", False)
    engine._worker.wait(5.0)
    assert events == ["close on cudapatch-build", "reset"]  # never a dead context's handles after the reset


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # the escape, on purpose
def test_the_switch_interval_is_restored_when_the_worker_thread_ends_on_an_escaping_error() -> None:
    import sys

    before = sys.getswitchinterval()
    w = BuildWorker(lambda: None)

    def escape() -> None:
        raise SystemExit  # not an Exception: the chore loop does not catch it

    try:
        w.later(escape)
        w.gate.open()
        deadline = time.monotonic() + 5.0
        while (w._thread is not None and w._thread.is_alive()) and time.monotonic() < deadline:
            w.gate.open()
            time.sleep(0.005)
        assert sys.getswitchinterval() == pytest.approx(before)
        ran: list[str] = []
        w.later(lambda: ran.append("after"))  # a new thread takes the work on
        assert w.wait(5.0) and ran == ["after"]
    finally:
        w.close(1.0)


def test_the_worker_runs_work_handed_to_it_after_a_frame_or_after_the_job_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from cudapatch.engine import build_thread

    monkeypatch.setattr(build_thread, "PACE_TIMEOUT_S", 60.0)  # it goes on at a frame's end, never by timeout
    w = BuildWorker(lambda: None)
    ran: list[tuple[str, str]] = []
    try:
        w.later(lambda: ran.append(("alone", threading.current_thread().name)))
        time.sleep(0.05)
        assert ran == []  # it waits for the end of a frame
        w.gate.open()
        assert w.wait(5.0) and ran == [("alone", "cudapatch-build")] and not w.busy
        gate = threading.Event()
        w.submit(lambda: gate.wait(5.0) and "built")
        w.later(lambda: ran.append(("after the job", threading.current_thread().name)))
        gate.set()
        deadline = time.monotonic() + 5.0
        while not w.done and time.monotonic() < deadline:
            time.sleep(0.001)
        assert w.take() == "built"
        w.wait(5.0)  # opens the gate: no frame comes
        assert ran[-1] == ("after the job", "cudapatch-build")
    finally:
        w.close(5.0)
    w.later(lambda: ran.append(("closed", threading.current_thread().name)))  # closed: here and now
    assert ran[-1] == ("closed", threading.current_thread().name)


def test_what_a_swap_replaced_is_freed_by_the_next_build_on_the_build_thread(engine: Engine) -> None:
    import weakref

    fill, scale = _chain(engine)
    _landed(engine)
    freed: list[str] = []
    view = engine._builds._shower.shown
    assert view is not None
    gone = weakref.ref(view, lambda _: freed.append(threading.current_thread().name))
    del view
    more = engine.add(Scale(name="more"))
    engine.connect(scale, "Out", more, "In")
    _landed(engine)  # a swap replaced the view; it is kept, and the build after it frees it
    engine.remove(more)
    _landed(engine)
    assert gone() is None and freed == ["cudapatch-build"]


def test_a_bypass_whose_values_share_buffers_applies_to_the_graph_the_pin_build_swaps_in(
    realizer: Realizer,
) -> None:
    from cudapatch.engine.memory_plan import shares_with_others

    from .test_engine_orchestration import DeviceArray

    e = Engine(cache_dir=False, watch_files=False, fuse=False)  # buffer reuse on: the chain's values share buffers
    try:
        blocks = [e.add(Scale(name=f"s{i}", Factor=1.0 + i / 1000)) for i in range(150)]
        for a, b in zip(blocks, blocks[1:], strict=False):
            e.connect(a, "Out", b, "In")
        e.bind(blocks[0], "In", DeviceArray(4099))
        _landed(e)
        g, s40 = e.graph, blocks[40]
        assert g is not None and shares_with_others(g.plan, {s40.id})
        deadline = time.monotonic() + 5.0
        while e.resources.copy_kernels() is None:  # asked for by the first build on the build thread
            assert time.monotonic() < deadline, "the copy kernels never loaded"
            e.update()
            time.sleep(0.005)
        realizer.hold()
        s40.enabled = False
        # Only the update that decides knows a build is needed: a wait for "no build, no structure edit"
        # must run a frame first (tests/gpu/test_incremental_plan_gpu.py's wait did not, and read too early).
        assert not (e.building or e.context.dirty.structure) and e.context.dirty.bypass
        # Nothing turned off (its readers would read another block's data): its node copies its input into
        # its output from this frame on (carried), and the pin build starts.
        e.update()
        assert realizer.started.wait(5.0) and e.building and e.graph is g
        carried = g.bypasses[-1]
        (node,) = g.plan.block_nodes[s40.id]
        assert set(carried.carried) == {node} and not (carried.disabled or carried.redirects)
        src, dst = carried.carried[node].src, carried.carried[node].dst
        args = g.plan.nodes[node].args
        assert args[src].ref == g.plan.outputs[(blocks[39].id, "Out")]
        assert args[dst].ref == g.plan.outputs[(s40.id, "Out")]
        e.update()
        assert e.graph is g and "(bypassed)" in str(s40)
        realizer.gate.set()
        e._worker.wait(5.0)
        e.update()  # the swap: the new graph gets the bypass before its first launch
        g2 = e.graph
        assert g2 is not g and g2.launches == 1 and not shares_with_others(g2.plan, {s40.id})
        (bp,) = g2.bypasses
        s39_out, s40_out = g2.plan.outputs[(blocks[39].id, "Out")], g2.plan.outputs[(s40.id, "Out")]
        (reader,) = g2.plan.block_nodes[blocks[41].id]
        assert bp.disabled == set(g2.plan.block_nodes[s40.id]) and bp.outputs == {(s40.id, "Out"): s39_out}
        assert bp.redirects == {(reader, 0): s39_out} and s40_out != s39_out
        _landed(e)
        assert e.graph is g2 and not e.context.dirty.any
        rebuilds, updates = e.counters.rebuilds, e.counters.bypass_updates
        for on in (True, False, True, False):  # the Bypass tier alone from here on
            s40.enabled = on
            e.update()
            assert e.graph is g2 and not e.building and g2.bypasses[-1].empty is on
        assert g2.bypasses[-1] is bp and g2.bypasses[-2] is g2.bypasses[-4]  # each decided once for this plan
        assert (e.counters.rebuilds, e.counters.bypass_updates) == (rebuilds, updates + 4)
    finally:
        realizer.gate.set()
        e.close()


def test_a_bypass_undone_before_its_pin_build_lands_leaves_the_block_running(realizer: Realizer) -> None:
    from cudapatch.engine.memory_plan import shares_with_others

    e = Engine(cache_dir=False, watch_files=False, fuse=False)
    try:
        blocks = [e.add(Fill(name="fill", Count=1024)), *(e.add(Scale(name=f"s{i}")) for i in range(7))]
        for a, b in zip(blocks, blocks[1:], strict=False):
            e.connect(a, "Out", b, "In")
        _landed(e)
        assert shares_with_others(e.graph.plan, {blocks[3].id})  # type: ignore[union-attr]
        realizer.hold()
        blocks[3].enabled = False
        e.update()
        assert realizer.started.wait(5.0) and e.building
        blocks[3].enabled = True  # on again while the build that pins its values runs
        e.update()
        realizer.gate.set()
        e._worker.wait(5.0)
        e.update()
        assert e.graph.bypasses == [] and not e.context.dirty.any  # type: ignore[union-attr]
        blocks[3].enabled = False  # its values have buffers of their own now: off at once
        e.update()
        assert not e.building and e.graph.bypasses[-1].disabled == set(e.graph.plan.block_nodes[blocks[3].id])  # type: ignore[union-attr]
    finally:
        realizer.gate.set()
        e.close()


@pytest.mark.parametrize("fuse", [False, True])
def test_a_new_blocks_kernel_that_its_build_runs_starts_no_second_build(
    realizer: Realizer, monkeypatch: pytest.MonkeyPatch, fuse: bool
) -> None:
    """The build of an added block waits for its kernel's compile and runs it (or fuses the block into
    its neighbours' kernel); the builder's result for that compile also reaches the frame thread, as a
    first compile that asks for a build. The graph the build swapped in runs that function already, or
    needs none, so no second build follows (on the H100 host one did, and a block added to a
    1,000-block chain went live one or two frames later)."""
    with Engine(cache_dir=False, watch_files=False, fuse=fuse) as engine:
        _new_block_lands_in_one_build(engine, monkeypatch, fuse)


def _new_block_lands_in_one_build(engine: Engine, monkeypatch: pytest.MonkeyPatch, fuse: bool) -> None:
    _, scale = _chain(engine)
    _landed(engine)
    jobs = []
    job = build_module.GraphBuilds.job
    monkeypatch.setattr(build_module.GraphBuilds, "job", lambda self, *a, **k: jobs.append(1) or job(self, *a, **k))
    more = engine.add(Scale(name="more"))
    engine.connect(scale, "Out", more, "In")
    engine.update()  # starts the build
    assert engine._worker.wait(5.0)
    engine.update()  # the swap
    g, rebuilds = engine.graph, engine.counters.rebuilds
    assert g is not None and more.id in g.plan.block_order
    for _ in range(3):
        engine._worker.wait(1.0)
        engine.update()
    assert not engine.building and not engine.context.dirty.structure
    assert engine.graph is g and engine.counters.rebuilds == rebuilds and len(jobs) == 1
    fused = [n for n in g.plan.kernel_nodes if more.id in getattr(n.source, "members", ())]
    assert bool(fused) == fuse  # (the case each run covers)


class _HeldCompiles:
    """Takes over the engine's compiles: each finishes only at ``release``."""

    def __init__(self, engine: Engine) -> None:
        self._builder = engine.kernels.builder
        self._submit = self._builder.submit
        self.held: list[tuple[Future, Any]] = []
        self._builder.submit = self._later

    def _later(self, source: Any) -> Future:
        f: Future = Future()
        self.held.append((f, source))
        return f

    def release(self) -> None:
        self._builder.submit = self._submit
        held, self.held = self.held, []
        for f, source in held:
            f.set_result(self._submit(source).result())


def _held_builds(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Builds end when the test sets the second event, once planned (the first: set then)."""
    planned, finish = threading.Event(), threading.Event()
    prepare = build_module.GraphBuilds.prepare

    def held_prepare(self: Any, *a: Any, **k: Any) -> Any:
        out = prepare(self, *a, **k)
        planned.set()
        assert finish.wait(10.0)
        return out

    monkeypatch.setattr(build_module.GraphBuilds, "prepare", held_prepare)
    return planned, finish


@pytest.mark.parametrize("lands", ["after", "during"])
def test_a_new_blocks_kernel_that_its_build_left_out_starts_the_next_build(
    engine: Engine, realizer: Realizer, monkeypatch: pytest.MonkeyPatch, lands: str
) -> None:
    """The other way round: a build that planned without the new block's kernel (its compile landed
    after the build resolved the kernels) is followed by one that runs it, whether the compile lands
    once that build was swapped in or while it still runs (then the Code tier decides at its end)."""
    _, scale = _chain(engine)
    _landed(engine)
    compiles = _HeldCompiles(engine)
    planned, finish = _held_builds(monkeypatch)
    if lands == "after":
        finish.set()
    more = engine.add(Scale(name="more", Factor=5.0, Offset=1.0))  # its own source: a compile of its own
    engine.connect(scale, "Out", more, "In")
    engine.update()
    if lands == "during":
        assert planned.wait(5.0)  # planned without the new kernel
        compiles.release()
        engine.update()  # the compile's outcome waits for the build in flight
        assert engine.building and not engine.context.dirty.structure
        finish.set()
    assert engine._worker.wait(5.0)
    engine.update()
    assert more.id not in engine.graph.plan.block_order  # compiling: left out
    compiles.release()
    _landed(engine)
    assert more.id in engine.graph.plan.block_order


class _Growing(Scale):
    """A Scale (elementwise: it fuses) that gains a second kernel when ``extra`` is set and it is
    described again: then it no longer fuses, and its new kernel compiles for the first time."""

    extra = False

    def describe(self, b: Any) -> None:
        super().describe(b)
        if self.extra:
            k = b.add_kernel(bundled_kernel("fill"))
            b.output("Extra", k.out(0), size=like("In"))
            b.scalar("Value", k.in_(1), default=0.0)
            k.auto_grid(like("In"), count_param=2)


def test_a_fused_blocks_new_second_kernel_is_built_once_it_compiles(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A block running inside a fused kernel gains a kernel: the build for its new description waits
    for that kernel's compile (keeping the running graph, whose fused kernel stands for the block's
    old description), and the compile, when it lands, asks for the build that runs the block with both
    kernels (the fused node runs the block's one kernel of before, not this one)."""
    monkeypatch.setattr(build_module, "COMPILE_WAIT_S", 0.01)
    _, scale = _chain(engine)
    grow = engine.add(_Growing(name="grow"))
    engine.connect(scale, "Out", grow, "In")
    _landed(engine)
    g = engine.graph
    assert any(grow.id in getattr(n.source, "members", ()) for n in g.plan.kernel_nodes)  # fused
    compiles = _HeldCompiles(engine)
    grow.extra = True
    assert grow.refresh()
    for _ in range(3):  # the build waits for the new kernel: the fused graph keeps running
        engine.update()
        assert engine._worker.wait(5.0)
    engine.update()
    assert engine.graph is g and compiles.held and not engine.building and not engine.context.dirty.structure
    compiles.release()
    _landed(engine)
    assert (grow.id, 1) in {(n.block_id, n.kernel) for n in engine.graph.plan.kernel_nodes}


def test_an_optimised_build_of_a_new_kernel_landing_during_its_build_starts_no_second_build(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The build of an added block runs its kernel's first compile; that kernel's optimised build
    lands while the build still runs and is swapped into the new graph at its end. The new graph ran
    the first compile: no second build follows."""
    _, scale = _chain(engine)
    _landed(engine)
    planned, finish = _held_builds(monkeypatch)
    more = engine.add(Scale(name="more", fuse=False))
    engine.connect(scale, "Out", more, "In")
    engine.update()  # starts the build, which waits for the new kernel's compile and runs it
    assert planned.wait(5.0)
    engine.update()  # the first compile's outcome waits for the build in flight
    key = (more.id, 0)
    better = engine.kernels.builder.submit(more.description.kernels[0].source).result()
    engine.kernels.ready.append(KernelOutcome("upgrade", key, better))
    engine.update()  # carried to the new graph
    rebuilds = engine.counters.rebuilds
    finish.set()
    assert engine._worker.wait(5.0)
    engine.update()  # the swap
    g = engine.graph
    assert engine.counters.rebuilds == rebuilds + 1 and g.runs_function(key, better.function)
    assert not engine.building and not engine.context.dirty.structure  # (a Warm one would not count as a rebuild)


def _until(condition: Callable[[], Any], timeout: float = 5.0) -> None:
    """Poll until ``condition()`` holds or ``timeout`` seconds have passed (the caller asserts what it needs)."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)


def _freeing(
    w: BuildWorker, order: list[str], pieces: list[int], ran: threading.Event, go: Callable[[int], threading.Event]
) -> Any:
    """Deferred work that yields and frees ``pieces`` one at a time, as ``drop_gradually`` does: it stops
    when a job waits (``preempted``) and returns the rest; after each piece it sets ``ran`` and waits
    for ``go(piece)``."""
    while pieces:
        if w.preempted():
            return lambda: _freeing(w, order, pieces, ran, go)
        piece = pieces.pop(0)
        order.append(f"piece {piece}")
        ran.set()
        go(piece).wait(5.0)
    return None


def _freeing_started(w: BuildWorker, first: Callable[[], str], piece_ran: threading.Event) -> None:
    """Run job ``first`` on ``w`` and take its outcome, then end a frame: its deferred freeing starts
    and frees its first piece."""
    w.submit(first)
    _until(lambda: w.done)
    assert w.take() == "first"
    w.gate.open()  # a frame ends: the deferred work starts
    assert piece_ran.wait(5.0)


def test_a_job_submitted_while_deferred_work_runs_goes_first_and_the_rest_runs_after_it() -> None:
    """Freeing what a build replaced must not hold up the next build: deferred work waiting for a
    frame's end gives way at once, work that can stop (``preempted``) stops between pieces, and what
    is left runs after the new job's outcome, before that job's own deferred work; ``wait`` covers it."""
    w = BuildWorker(lambda: None)
    order: list[str] = []
    piece_ran = threading.Event()
    second_submitted = threading.Event()  # (the first piece waits for the second job to come)

    def first() -> str:
        w.defer(lambda: order.append("closed"))
        w.defer(lambda: _freeing(w, order, [1, 2, 3], piece_ran, lambda _: second_submitted), yields=True)
        return "first"

    def second() -> str:
        order.append("second job")
        w.defer(lambda: order.append("second's deferred"))
        return "second"

    try:
        _freeing_started(w, first, piece_ran)
        w.submit(second)
        second_submitted.set()
        _until(lambda: w.done)
        assert w.take() == "second"
        assert w.wait(5.0)
        assert order == ["closed", "piece 1", "second job", "piece 2", "piece 3", "second's deferred"], order
    finally:
        w.close(5.0)


def test_deferred_work_waiting_for_a_frame_gives_way_to_a_job_without_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """No frame comes: deferred work waiting for one starts when a job is submitted; what does not
    yield (closing retired graphs: device memory) runs first, what yields after the job."""
    from cudapatch.engine import build_thread

    monkeypatch.setattr(build_thread, "PACE_TIMEOUT_S", 60.0)  # no frame comes
    w = BuildWorker(lambda: None)
    order: list[str] = []

    def first() -> str:
        w.defer(lambda: order.append("closed"))
        w.defer(lambda: order.append("dropped"), yields=True)
        return "first"

    try:
        w.submit(first)
        _until(lambda: w.done and w.gate.wanted)
        assert w.take() == "first" and w.tailing and order == []  # waiting for a frame's end
        w.submit(lambda: (order.append("second job"), "second")[1])
        _until(lambda: w.done)
        assert w.take() == "second"  # no frame came, no 60 s wait
        assert w.wait(5.0) and order == ["closed", "second job", "dropped"]
    finally:
        w.close(5.0)


def test_deferred_work_that_gave_way_as_often_as_it_may_runs_to_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Edits coming every frame must not pile up freeing work: what gave way to ``GIVE_WAY`` jobs (here
    one) runs to its end after the last of them, a next job waiting or not."""
    from cudapatch.engine import build_thread

    monkeypatch.setattr(build_thread, "GIVE_WAY", 1)
    w = BuildWorker(lambda: None)
    order: list[str] = []
    submitted = {n: threading.Event() for n in ("second", "third")}

    def after(piece: int) -> threading.Event:
        return submitted["second" if piece == 1 else "third"]

    def job(name: str, defer: bool = False) -> Any:
        def run() -> str:
            order.append(f"{name} job")
            if defer:
                w.defer(lambda: _freeing(w, order, [1, 2, 3], threading.Event(), after), yields=True)
            return name

        return run

    def finish(name: str) -> None:
        _until(lambda: w.done)
        assert w.take() == name

    try:
        w.submit(job("first", defer=True))
        finish("first")
        w.gate.open()  # a frame ends: piece 1 runs, then waits for the second job
        _until(lambda: "piece 1" in order)
        w.submit(job("second"))
        submitted["second"].set()
        finish("second")  # piece 2 runs now (put off once), then waits for the third job
        _until(lambda: "piece 2" in order)
        w.submit(job("third"))
        submitted["third"].set()
        finish("third")
        assert w.wait(5.0)
        assert order == ["first job", "piece 1", "second job", "piece 2", "piece 3", "third job"], order
    finally:
        w.close(5.0)


def test_deferred_work_a_job_ends_the_wait_of_starts_after_the_frame_that_submitted_it() -> None:
    """A job submitted in an edit frame wakes deferred work waiting for a frame's end; what runs first
    (closing retired graphs holds the driver's lock) waits for that frame to end (its launch)."""
    from cudapatch.kernels.pacing import FRAME_GUARD

    w = BuildWorker(lambda: None)
    order: list[str] = []
    try:
        w.submit(lambda: (w.defer(lambda: order.append("closed")), "first")[1])
        _until(lambda: w.done and w.gate.wanted)
        assert w.take() == "first" and order == []
        assert FRAME_GUARD.enter()  # this thread is in its frame
        try:
            w.submit(lambda: (order.append("second job"), "second")[1])  # the edit of this frame
            time.sleep(0.02)  # (the worker is awake now: it waits for the frame, not for the next one)
            order.append("launch")
        finally:
            FRAME_GUARD.leave()
        _until(lambda: w.done)
        assert w.take() == "second" and w.wait(5.0)
        assert order == ["launch", "closed", "second job"], order
    finally:
        w.close(5.0)


def test_work_that_does_not_yield_is_not_put_off_behind_work_that_gave_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """Freeing put off by one job comes first in the next job's deferred work; closing that job's
    retired graphs (does not yield: device memory) must still run before a third job, not be put off
    with the freeing in front of it."""
    from cudapatch.engine import build_thread

    monkeypatch.setattr(build_thread, "PACE_TIMEOUT_S", 60.0)  # no frame comes
    w = BuildWorker(lambda: None)
    order: list[str] = []

    def job(name: str) -> Any:
        def run() -> str:
            order.append(f"{name} job")
            w.defer(lambda: order.append(f"{name} closed"))
            w.defer(lambda: order.append(f"{name} dropped"), yields=True)
            return name

        return run

    def finish(name: str) -> None:
        _until(lambda: w.done and w.gate.wanted)
        assert w.take() == name and w.tailing  # its deferred work waits for a frame's end

    try:
        w.submit(job("first"))
        finish("first")
        w.submit(job("second"))
        finish("second")  # first's freeing gave way to it: it comes first in second's deferred work
        w.submit(job("third"))
        _until(lambda: w.done)
        assert w.take() == "third" and w.wait(5.0)
        assert order.index("second closed") < order.index("third job"), order
    finally:
        w.close(5.0)


def test_work_that_does_not_yield_left_when_freeing_gives_way_starts_after_the_frame_that_submitted_the_job() -> None:
    """A job submitted in an edit frame stops freeing that yields; what does not yield behind it
    (closing retired graphs holds the driver's lock) runs before the job, but after that frame."""
    from cudapatch.kernels.pacing import FRAME_GUARD

    w = BuildWorker(lambda: None)
    order: list[str] = []
    piece_ran = threading.Event()
    submitted = threading.Event()

    def first() -> str:
        w.defer(lambda: _freeing(w, order, [1, 2], piece_ran, lambda _: submitted), yields=True)
        w.defer(lambda: order.append("closed"))
        return "first"

    try:
        _freeing_started(w, first, piece_ran)
        assert FRAME_GUARD.enter()  # this thread is in its frame
        try:
            w.submit(lambda: (order.append("second job"), "second")[1])  # the edit of this frame
            submitted.set()
            time.sleep(0.02)
            order.append("launch")
        finally:
            FRAME_GUARD.leave()
        _until(lambda: w.done)
        assert w.take() == "second" and w.wait(5.0)
        assert order == ["piece 1", "launch", "closed", "second job", "piece 2"], order
    finally:
        w.close(5.0)


def test_retired_graphs_are_taken_for_closing_without_walking_their_plans() -> None:
    class Plan:
        @property
        def captured_nodes(self) -> tuple:  # one pass over every node, in the edit frame that starts a build
            raise AssertionError("a retired plan's nodes were walked")

    class Retired:
        def __init__(self, has_calls: bool, idle: bool) -> None:
            self.plan, self.has_calls, self._idle = Plan(), has_calls, idle

        def is_idle(self) -> bool:
            return self._idle

    res = resources_module.DeviceResources.__new__(resources_module.DeviceResources)
    done, with_calls, running = Retired(False, True), Retired(True, True), Retired(False, False)
    res._retired = [done, with_calls, running]
    assert res.take_idle() == [done]  # library calls release into scopes the frame thread uses: they stay
    assert res._retired == [with_calls, running]
