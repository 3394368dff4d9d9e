"""FrameDelays in patches with regions on a real GPU: a delay inside a For body carries its value from
one iteration to the next and from a frame's last iteration to the next frame's first (a copy node
last in the body), checked bit for bit against NumPy across frames, Hot Count changes and reset();
a top-level delay beside a region. (Planning is unit-tested: tests/unit/test_region_delays_plan.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Engine, For, FrameDelay, Scale, VectorAdd

pytestmark = pytest.mark.gpu

A, B = 0.5, 0.25  # x * 0.5 is exact, so x*a+b rounds once with or without FMA: NumPy matches bit for bit


def _steps(x: np.ndarray, n: int) -> np.ndarray:
    for _ in range(n):
        x = x * np.float32(A) + np.float32(B)
    return x


def _body_patch(engine: Engine, x0: np.ndarray, count: int, unroll: int | None = None):
    """For(Count) { delay -> step (x*a+b) -> delay.In }, Init bound to x0."""
    loop = engine.add(For(name="Steps", Count=count, **({} if unroll is None else {"Unroll": unroll})))
    delay = engine.add(FrameDelay(name="delay"), region=loop)
    step = engine.add(Scale(name="step", Factor=A, Offset=B), region=loop)
    engine.bind(delay, "Init", x0)
    engine.connect(delay, "Out", step, "In")
    engine.connect(step, "Out", delay, "In")
    return loop, delay, step


@pytest.mark.parametrize("unroll", [1, 4, None], ids=["unroll1", "unroll4", "default"])
def test_a_delay_in_a_for_body_equals_n_steps_across_frames_count_changes_and_reset(
    engine: Engine, rng: np.random.Generator, unroll: int | None
) -> None:
    n = 100_000
    x0 = (rng.standard_normal(n) * 100).astype(np.float32)
    loop, delay, step = _body_patch(engine, x0, 7, unroll)  # 7 and 13: the main loop and the tail
    state = x0.copy()
    for frame in range(1, 4):  # the state goes on from frame to frame
        engine.update()
        state = _steps(state, 7)
        np.testing.assert_array_equal(engine.read(step, "Out"), state, err_msg=f"frame {frame}")
        # after the frame, Out holds what the next iteration starts from (the copy ran last)
        np.testing.assert_array_equal(engine.read(delay, "Out"), state, err_msg=f"frame {frame}")
    assert engine.iterations(loop) == 7
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    assert graph.instantiations == 1
    for count in (1, 0, 13):
        loop.set("Count", count)  # Hot: no rebuild
        engine.update()
        state = _steps(state, count)
        if count:  # with Count 0 the body does not run: step's Out keeps an older value
            np.testing.assert_array_equal(engine.read(step, "Out"), state, err_msg=f"Count={count}")
        np.testing.assert_array_equal(engine.read(delay, "Out"), state, err_msg=f"Count={count}")
        assert engine.iterations(loop) == count
    delay.reset()  # Hot: the start value is written before the next frame's loop, once
    engine.update()
    state = _steps(x0, 13)
    np.testing.assert_array_equal(engine.read(delay, "Out"), state)
    engine.update()
    state = _steps(state, 13)
    np.testing.assert_array_equal(engine.read(delay, "Out"), state)
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds
    assert not [d for d in engine.diagnostics() if d.severity == "error"]


def test_a_fill_start_value_and_a_body_with_a_second_reader(engine: Engine) -> None:
    n = 4096
    loop = engine.add(For(name="Steps", Count=5))
    delay = engine.add(FrameDelay(name="delay", Count=n, Fill=1.0), region=loop)
    double = engine.add(Scale(name="double", Factor=2.0), region=loop)
    total = engine.add(VectorAdd(name="total"), region=loop)  # reads Out and the new value: Out + 2 Out
    engine.connect(delay, "Out", double, "In")
    engine.connect(double, "Out", delay, "In")
    engine.connect(delay, "Out", total, "A")
    engine.connect(double, "Out", total, "B")
    engine.update()
    # iteration k (1-based) reads 2^(k-1): the last one adds 2^4 + 2^5
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 32.0, np.float32))
    np.testing.assert_array_equal(engine.read(total, "Sum"), np.full(n, 48.0, np.float32))
    engine.update()
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 1024.0, np.float32))


def test_a_top_level_delay_beside_a_region(engine: Engine, rng: np.random.Generator) -> None:
    n = 10_000
    x0, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    delay = engine.add(FrameDelay(name="delay"))
    add = engine.add(VectorAdd(name="add"))
    loop = engine.add(For(name="Twice", Count=2))
    halve = engine.add(Scale(name="halve", Factor=0.5), region=loop)
    engine.bind(delay, "Init", x0)
    engine.bind(add, "B", b)
    engine.connect(delay, "Out", add, "A")
    engine.connect(add, "Sum", halve, "In")
    engine.connect(halve, "Out", delay, "In")  # In is made inside the loop; copied into Out after it
    state = x0.copy()
    for frame in range(1, 6):
        engine.update()
        state = (state + b) * np.float32(0.5)  # both iterations halve the same sum
        np.testing.assert_array_equal(engine.read(halve, "Out"), state, err_msg=f"frame {frame}")


def test_a_library_call_in_a_body_reads_and_writes_a_delay(engine: Engine, rng: np.random.Generator) -> None:
    from cudapatch.blocks.library import FFT

    n = 64
    x0 = rng.standard_normal((n, 2)).astype(np.float32)  # 64 complex values as float2
    loop = engine.add(For(name="Twice", Count=2))
    delay = engine.add(FrameDelay(name="delay", Type="float2"), region=loop)
    fft = engine.add(FFT(name="fft", Kind="C2C", Nx=n), region=loop)  # forward, unnormalized
    engine.bind(delay, "Init", x0)
    engine.connect(delay, "Out", fft, "In")
    engine.connect(fft, "Out", delay, "In")  # the capture keeps its pointers: they never swap here
    engine.update()
    z0 = x0[:, 0] + 1j * x0[:, 1]
    want = np.fft.fft(np.fft.fft(z0))  # = n * z0[-k mod n]
    got = engine.read(fft, "Out").reshape(n, 2)
    np.testing.assert_allclose(got[:, 0] + 1j * got[:, 1], want, rtol=0, atol=1e-3 * n)
