"""FrameDelays in patches with regions on a real GPU: a delay inside a For or While body carries its value
from one iteration to the next and from a frame's last iteration to the next frame's first, checked bit
for bit against NumPy across frames, odd and even Hot Count changes and reset(): at Unroll 1 by a copy
node last in the body, unrolled by ping-pong (the copies alternate the two buffers, one sync kernel after
the loop); nested loops; a top-level delay beside a region. (Planning is unit-tested:
tests/unit/test_region_delays_plan.py and tests/unit/test_region_pingpong.py, with a NumPy interpreter.)"""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CustomKernel, Engine, For, FrameDelay, Scale, VectorAdd, While

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


@pytest.mark.parametrize("unroll", [1, 2, 3, 4, None], ids=["unroll1", "unroll2", "unroll3", "unroll4", "default"])
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
        # after the frame, Out holds what the next iteration starts from (the copy or the sync ran last)
        np.testing.assert_array_equal(engine.read(delay, "Out"), state, err_msg=f"frame {frame}")
    assert engine.iterations(loop) == 7
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    assert graph.instantiations == 1
    for count in (1, 0, 16, 8, 2, 9, 13):  # odd and even: ping-pong ends in either buffer (13 last: see below)
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


BELOW = """extern "C" __global__ void below(const float* in, int* more, float level, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = in[0] < level; }"""


@pytest.mark.parametrize("unroll", [1, 2, 3, 4, 8])
def test_a_delay_in_a_while_body_carries_every_iteration_that_ran(engine: Engine, unroll: int) -> None:
    """While(Max=20) { delay -> double -> delay.In; more = double.Out < 1000 }: the state is 2 to the
    power of every iteration run so far, whatever the unroll (which may run up to Unroll - 1 past)."""
    n = 4096
    loop = engine.add(While(name="Grow", Max=20, Unroll=unroll))
    delay = engine.add(FrameDelay(name="delay", Count=n, Fill=1.0), region=loop)
    double = engine.add(Scale(name="double", Factor=2.0), region=loop)
    check = engine.add(CustomKernel(name="check", Code=BELOW, level=1000.0), region=loop)
    engine.connect(delay, "Out", double, "In")
    engine.connect(double, "Out", delay, "In")
    engine.connect(double, "Out", check, "in")
    engine.connect(check, "more", loop, "Condition")
    eff = unroll if unroll < 2 else unroll - unroll % 2  # ping-pong unrolls by whole pairs
    total = 0
    for frame in range(1, 5):
        engine.update()
        out = engine.read(delay, "Out")  # synchronizes: the iterations below are this frame's
        its = engine.iterations(loop)
        # 2**10 = 1024 is the first not below 1000, seen after a pass of eff; later frames start above it
        assert its == (-(-10 // eff) * eff if frame == 1 else eff), f"frame {frame}"
        total += its
        want = np.full(n, 2.0**total, np.float32)
        np.testing.assert_array_equal(out, want, err_msg=f"frame {frame}, {its} iterations")
        np.testing.assert_array_equal(engine.read(double, "Out"), want, err_msg=f"frame {frame}")
        assert engine.read(check, "more")[0] == 0  # the last iteration said stop (sized like its input)
    delay.reset()  # the start value again, before the next frame's loop
    engine.update()
    out = engine.read(delay, "Out")
    assert engine.iterations(loop) == -(-10 // eff) * eff
    np.testing.assert_array_equal(out, np.full(n, 2.0 ** engine.iterations(loop), np.float32))


@pytest.mark.parametrize("unroll", [1, 2, 8])
def test_a_delay_in_a_for_nested_in_a_for(engine: Engine, rng: np.random.Generator, unroll: int) -> None:
    n = 10_000
    x0 = (rng.standard_normal(n) * 100).astype(np.float32)
    outer = engine.add(For(name="Outer", Count=3, Unroll=2))
    loop, delay, step = _body_patch(engine, x0, 5, unroll)
    engine.place(loop, outer)
    state = x0.copy()
    for a, b in ((3, 5), (2, 4), (1, 7), (4, 2), (0, 3), (3, 0), (1, 1)):
        outer.set("Count", a)
        loop.set("Count", b)  # both Hot
        engine.update()
        state = _steps(state, a * b)
        np.testing.assert_array_equal(engine.read(delay, "Out"), state, err_msg=f"{a} x {b}")
        if a and b:
            np.testing.assert_array_equal(engine.read(step, "Out"), state, err_msg=f"{a} x {b}")
    assert engine.graph.instantiations == 1


@pytest.mark.parametrize("unroll", [1, 2, 4])
def test_a_delay_in_an_outer_loop_read_inside_an_inner_loop(
    engine: Engine, rng: np.random.Generator, unroll: int
) -> None:
    """Outer { delay -> Inner { twice } -> step -> delay.In }: the swapped buffers of the outer loop's odd
    copies reach the nodes of the inner loop inside them."""
    n = 10_000
    x0 = (rng.standard_normal(n) * 100).astype(np.float32)
    outer = engine.add(For(name="Outer", Count=5, Unroll=unroll))
    delay = engine.add(FrameDelay(name="delay"), region=outer)
    inner = engine.add(For(name="Inner", Count=2, Unroll=2), region=outer)
    twice = engine.add(Scale(name="twice", Factor=2.0), region=inner)
    step = engine.add(Scale(name="step", Factor=A, Offset=B), region=outer)
    engine.bind(delay, "Init", x0)
    engine.connect(delay, "Out", twice, "In")
    engine.connect(twice, "Out", step, "In")
    engine.connect(step, "Out", delay, "In")
    state = x0.copy()
    for count in (5, 4, 1, 0, 7):
        outer.set("Count", count)
        engine.update()
        for _ in range(count):  # (2x) * 0.5 is exact: one rounding, as on the GPU
            state = (state * np.float32(2.0)) * np.float32(A) + np.float32(B)
        np.testing.assert_array_equal(engine.read(delay, "Out"), state, err_msg=f"Count={count}")


@pytest.mark.parametrize("unroll", [1, 2, None], ids=["unroll1", "unroll2", "default"])
def test_reaction_diffusion_at_odd_and_even_counts_matches_numpy(engine: Engine, unroll: int | None) -> None:
    """The example's Gray-Scott step (float2, every operation rounded alone) in a For, bit for bit against
    its NumPy reference over frames of odd and even step counts, and the image block after the loop."""
    import importlib.util
    from pathlib import Path

    from cudapatch import CustomKernel

    path = Path(__file__).resolve().parents[2] / "examples" / "10_reaction_diffusion.py"
    spec = importlib.util.spec_from_file_location("rd_example", path)
    ex = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(ex)  # type: ignore[union-attr]
    h = w = 64
    seed = ex.seed_field(h, w)
    loop = engine.add(For(name="Steps", Count=7, **({} if unroll is None else {"Unroll": unroll})))
    field = engine.add(FrameDelay(name="field", Type="float2"), region=loop)
    step = engine.add(CustomKernel(name="step", Code=ex.GRAY_SCOTT, width=w, height=h, **ex.PARAMS), region=loop)
    paint = engine.add(CustomKernel(name="paint", Code=ex.PAINT))
    engine.bind(field, "Init", seed)
    engine.connect(field, "Out", step, "s")
    engine.connect(step, "next", field, "In")
    engine.connect(step, "next", paint, "s")
    engine.wait_ready()
    ref = seed
    for count in (7, 10, 3, 1, 16):
        loop.set("Count", count)
        engine.update()
        ref = ex.gray_scott(ref, h, w, count)
        np.testing.assert_array_equal(engine.read(step, "next").reshape(h * w, 2), ref, err_msg=f"Count={count}")
        np.testing.assert_array_equal(engine.read(field, "Out").reshape(h * w, 2), ref, err_msg=f"Count={count}")
    assert engine.read(paint, "rgba").size == h * w
