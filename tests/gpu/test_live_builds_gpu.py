"""Builds on the build thread, on a real GPU: the old graph keeps running until the swap, Hot values
set during a build land in the new graph, a failed build keeps the running graph, and closing the
engine during a build ends cleanly. (The swap protocol itself is unit-tested without a GPU:
tests/unit/test_live_builds.py.)"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from cudapatch import DiagnosticCode, Engine, Scale
from cudapatch.engine import build as build_module

from .conftest import run_until

pytestmark = pytest.mark.gpu


@pytest.fixture
def live(tmp_path) -> Iterator[Engine]:
    e = Engine(cache_dir=tmp_path / "kernel-cache")
    try:
        yield e
    finally:
        e.close()


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _until_built(e: Engine, timeout: float = 30.0) -> int:
    frames, deadline = 0, time.monotonic() + timeout
    while e.building or e.context.dirty.structure or e.kernels.pending or e.graph is None:
        assert time.monotonic() < deadline, "the build never landed"
        e.update()
        frames += 1
        time.sleep(0.002)
    return frames


def _slow_realize(monkeypatch: pytest.MonkeyPatch, started: threading.Event, gate: threading.Event) -> None:
    real = build_module.realize

    def slow(plan, **kw):
        started.set()
        assert gate.wait(30.0)
        return real(plan, **kw)

    monkeypatch.setattr(build_module, "realize", slow)


def test_hot_values_set_during_a_build_land_in_the_new_graph(
    live: Engine, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = _rand(rng, 4096)
    a = live.add(Scale(name="a", Factor=2.0))
    live.bind(a, "In", x)
    live.wait_ready()
    live.update()
    np.testing.assert_allclose(live.read(a, "Out"), x * 2.0, rtol=1e-6)
    started, gate = threading.Event(), threading.Event()
    _slow_realize(monkeypatch, started, gate)
    b = live.add(Scale(name="b", Factor=1.0))
    live.connect(a, "Out", b, "In")
    # frames, as a host runs them, until the build thread is inside realize (the frame that queues
    # the build may be the one after the edit, when the edit's kernel resolves first)
    run_until(live, started.is_set)
    assert live.building
    old = live.graph
    a.set("Factor", 5.0)  # Hot, on the running graph, and carried to the one being built
    live.update()
    np.testing.assert_allclose(live.read(a, "Out"), x * 5.0, rtol=1e-6)
    a.set("Factor", 7.0)
    gate.set()
    _until_built(live)
    assert live.graph is not old
    live.update()
    np.testing.assert_allclose(live.read(a, "Out"), x * 7.0, rtol=1e-6)
    np.testing.assert_allclose(live.read(b, "Out"), x * 7.0, rtol=1e-6)


def test_a_failed_build_keeps_the_running_graph(
    live: Engine, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cudapatch.errors import CudaError

    x = _rand(rng, 1024)
    a = live.add(Scale(name="a", Factor=3.0))
    live.bind(a, "In", x)
    live.wait_ready()
    live.update()
    old = live.graph

    def refuse(plan, **kw):
        raise CudaError("refused for the test", name="CUDA_ERROR_INVALID_VALUE")

    monkeypatch.setattr(build_module, "realize", refuse)
    b = live.add(Scale(name="b"))
    live.connect(a, "Out", b, "In")
    for _ in range(200):
        live.update()
        if live.counters.failed_rebuilds:
            break
        time.sleep(0.002)
    assert live.counters.failed_rebuilds == 1 and live.graph is old
    assert any(d.code == DiagnosticCode.REALIZE for d in live.diagnostics())
    live.update()
    np.testing.assert_allclose(live.read(a, "Out"), x * 3.0, rtol=1e-6)


def test_close_during_a_build_ends_cleanly(
    live: Engine, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    a = live.add(Scale(name="a"))
    live.bind(a, "In", _rand(rng, 1024))
    live.wait_ready()
    live.update()
    started, gate = threading.Event(), threading.Event()
    _slow_realize(monkeypatch, started, gate)
    live.connect(a, "Out", live.add(Scale(name="b")), "In")
    run_until(live, started.is_set)  # until the build thread is inside realize
    threading.Timer(0.05, gate.set).start()
    in_use = live.pool.in_use_bytes
    live.close()
    assert live.is_closed and not live.building and in_use >= 0


def test_structure_edits_never_build_on_the_frame_thread(live: Engine, rng: np.random.Generator) -> None:
    x = _rand(rng, 1 << 16)
    prev = live.add(Scale(name="s0"))
    live.bind(prev, "In", x)
    for i in range(1, 50):
        s = live.add(Scale(name=f"s{i}"))
        live.connect(prev, "Out", s, "In")
        prev = s
    _until_built(live)
    live.synchronize()
    worst = 0.0
    tail = live.add(Scale(name="tail", Factor=2.0))
    live.connect(prev, "Out", tail, "In")
    frames = 0
    while tail.id not in live.graph.plan.block_order:  # type: ignore[union-attr]
        t0 = time.perf_counter()
        live.update()
        worst = max(worst, time.perf_counter() - t0)
        frames += 1
        assert frames < 2000
        time.sleep(0.001)
    live.update()
    np.testing.assert_allclose(live.read(tail, "Out"), x * 2.0, rtol=1e-5)
    assert worst < 0.05, f"an update() took {worst * 1e3:.1f} ms during the build"
