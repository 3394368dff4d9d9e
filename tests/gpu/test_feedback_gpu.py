"""FrameDelay feedback and per-frame Upload/Download on a real GPU: loops checked against NumPy over
many frames (both phases), the start value on the first frame and after reset(), Hot, Warm and
Code edits of blocks inside a loop without a rebuild, a Cold edit elsewhere keeping the loop's
state, a bad delay keeping the last graph running, Game of Life bit for bit, and Upload/Download
round trips that never synchronize. (Planning is unit-tested: tests/unit/test_feedback_plan.py.)"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from cudapatch import (
    CustomKernel,
    Download,
    DownloadRing,
    Engine,
    Fill,
    FrameDelay,
    Scale,
    Upload,
    UploadRing,
    VectorAdd,
)
from cudapatch.kernels._driver import driver

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[2]


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _accumulator(engine: Engine, x0: np.ndarray, b: object):
    """delay.Out + B -> add -> delay.In: each frame adds B to the previous frame's sum."""
    delay = engine.add(FrameDelay(name="delay"))
    add = engine.add(VectorAdd(name="add"))
    engine.bind(delay, "Init", x0)
    engine.bind(add, "B", b)
    engine.connect(delay, "Out", add, "A")
    engine.connect(add, "Sum", delay, "In")
    return delay, add


def test_a_loop_through_a_delay_matches_numpy_frame_after_frame(engine: Engine, rng: np.random.Generator) -> None:
    n = 10_000
    x0, b = _rand(rng, n), _rand(rng, n)
    delay, add = _accumulator(engine, x0, b)
    state = x0.copy()
    for frame in range(1, 12):  # odd and even frames: both phases of the graph
        engine.update()
        previous, state = state, state + b  # float32 adds, in the same order: bit for bit
        np.testing.assert_array_equal(engine.read(add, "Sum"), state, err_msg=f"frame {frame}")
        np.testing.assert_array_equal(engine.read(delay, "Out"), previous, err_msg=f"frame {frame}")
    assert engine.counters.rebuilds == 1
    assert not [d for d in engine.diagnostics() if d.severity != "info"]


def test_the_start_value_is_written_on_the_first_frame_and_after_reset(engine: Engine) -> None:
    n = 4096
    delay = engine.add(FrameDelay(name="delay", Count=n, Fill=1.0))
    double = engine.add(Scale(name="double", Factor=2.0))
    engine.connect(delay, "Out", double, "In")
    engine.connect(double, "Out", delay, "In")
    for k in range(1, 6):
        engine.update()
        np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 2.0**k, np.float32))
    rebuilds = engine.counters.rebuilds
    delay.reset()  # Hot: the init node runs in the next frame only
    engine.update()
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 2.0, np.float32))
    engine.update()
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 4.0, np.float32))
    delay.set("Fill", 3.0)  # Hot, used at the next reset
    engine.update()
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 8.0, np.float32))
    delay.reset()
    engine.update()
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 6.0, np.float32))
    assert engine.counters.rebuilds == rebuilds


def test_hot_and_warm_edits_inside_a_loop_patch_both_phases_without_a_rebuild(
    engine: Engine, rng: np.random.Generator
) -> None:
    cp = pytest.importorskip("cupy")
    n = 20_000
    x0 = _rand(rng, n)
    bs = [_rand(rng, n), _rand(rng, n)]
    on_gpu = [cp.asarray(b) for b in bs]
    cp.cuda.get_current_stream().synchronize()
    delay, add = _accumulator(engine, x0, on_gpu[0])
    scale = engine.add(Scale(name="scale", Factor=1.0))
    engine.disconnect(add, "Sum", delay, "In")
    engine.connect(add, "Sum", scale, "In")
    engine.connect(scale, "Out", delay, "In")
    engine.update()
    state = (x0 + bs[0]) * np.float32(1.0)
    np.testing.assert_array_equal(engine.read(scale, "Out"), state)
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    hot, warm = engine.counters.hot_updates, engine.counters.warm_updates
    for frame in range(10):
        factor = np.float32(0.5 + 0.25 * (frame % 3))
        scale.set("Factor", float(factor))  # Hot, in a block of the loop
        engine.bind(add, "B", on_gpu[frame % 2])  # Warm: another pointer of the same size
        engine.update()
        state = (state + bs[frame % 2]) * factor  # out = in * Factor + 0: one rounding, as in NumPy
        np.testing.assert_array_equal(engine.read(scale, "Out"), state, err_msg=f"frame {frame}")
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds
    assert engine.counters.hot_updates - hot == 10 and engine.counters.warm_updates - warm >= 5


def test_a_code_edit_inside_a_loop_is_swapped_into_both_phases(engine: Engine) -> None:
    n = 2048
    code = 'extern "C" __global__ void step(const float* in, float* out, unsigned int n)\n{{\n' + (
        "    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = in[i] + {add};\n}}\n"
    )
    delay = engine.add(FrameDelay(name="delay", Count=n))
    step = engine.add(CustomKernel(name="step", Code=code.format(add="1.0f")))
    engine.connect(delay, "Out", step, "in")
    engine.connect(step, "out", delay, "In")
    for _ in range(3):
        engine.update()
    np.testing.assert_array_equal(engine.read(step, "out"), np.full(n, 3.0, np.float32))
    rebuilds, swaps = engine.counters.rebuilds, engine.counters.code_swaps
    step.set("Code", code.format(add="2.0f"))  # same signature: the Code tier
    for expected in (5.0, 7.0, 9.0):
        engine.update()
        np.testing.assert_array_equal(engine.read(step, "out"), np.full(n, expected, np.float32))
    assert engine.counters.rebuilds == rebuilds and engine.counters.code_swaps == swaps + 1


def test_a_cold_edit_elsewhere_keeps_the_loops_state(engine: Engine) -> None:
    n = 1024
    delay = engine.add(FrameDelay(name="delay", Count=n, Fill=1.0))
    double = engine.add(Scale(name="double", Factor=2.0))
    engine.connect(delay, "Out", double, "In")
    engine.connect(double, "Out", delay, "In")
    for _ in range(3):
        engine.update()  # 2, 4, 8 (three launches: the next one is phase 1)
    rebuilds = engine.counters.rebuilds
    engine.add(Fill(name="elsewhere", Count=64, Value=5.0))  # a structure edit outside the loop
    engine.update()
    assert engine.counters.rebuilds == rebuilds + 1
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 16.0, np.float32))  # not 2: no re-init
    engine.update()
    np.testing.assert_array_equal(engine.read(double, "Out"), np.full(n, 32.0, np.float32))


def test_a_delay_that_no_longer_fits_is_an_error_and_the_last_graph_keeps_running(engine: Engine) -> None:
    fill = engine.add(Fill(name="one", Count=8, Value=1.0))
    delay = engine.add(FrameDelay(name="delay", Count=8))
    add = engine.add(VectorAdd(name="add"))
    engine.connect(fill, "Out", add, "A")  # Sum is sized like A: 8
    engine.connect(delay, "Out", add, "B")
    engine.connect(add, "Sum", delay, "In")
    engine.update()
    engine.update()
    graph = engine.graph
    delay.set("Count", 16)  # the delay now holds 16, the loop computes 8
    engine.update()
    codes = {str(d.code) for d in engine.diagnostics(delay) if d.severity == "error"}
    assert "delay-mismatch" in codes
    assert engine.graph is graph
    engine.update()  # still launching the last working graph: the count goes on
    np.testing.assert_array_equal(engine.read(add, "Sum"), np.full(8, 4.0, np.float32))


def test_game_of_life_matches_numpy_bit_for_bit(engine: Engine, rng: np.random.Generator) -> None:
    spec = importlib.util.spec_from_file_location("game_of_life", ROOT / "examples" / "09_game_of_life.py")
    life_example = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(life_example)  # type: ignore[union-attr]
    w, h = 96, 64  # not square: rows and columns kept apart
    grid = (rng.random((h, w)) < 0.35).astype(np.uint8)
    delay = engine.add(FrameDelay(name="delay", Type="uchar"))
    life = engine.add(CustomKernel(name="life", Code=life_example.LIFE, width=w, height=h))
    engine.bind(delay, "Init", grid)
    engine.connect(delay, "Out", life, "cells")
    engine.connect(life, "next", delay, "In")
    ref = grid
    for frame in range(1, 31):
        engine.update()
        ref = life_example.step(ref)
        if frame % 5 == 0 or frame < 3:
            np.testing.assert_array_equal(engine.read(life, "next").reshape(h, w), ref, err_msg=f"generation {frame}")


SYNCHRONIZING = ("cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize")


def _refuse_synchronize(monkeypatch: pytest.MonkeyPatch) -> None:
    """From now on, any synchronizing driver call fails the test (``monkeypatch.undo()`` ends it)."""

    def refuse(*_args: object) -> None:
        raise AssertionError("a frame synchronized")

    for name in SYNCHRONIZING:
        monkeypatch.setattr(driver(), name, refuse)


def test_upload_and_download_round_trip_every_frame_without_synchronizing(
    engine: Engine, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    n = 4096
    up = engine.add(Upload(name="up", Count=n))
    double = engine.add(Scale(name="double", Factor=2.0))
    tap = engine.add(Download(name="tap"))
    engine.connect(up, "Out", double, "In")
    engine.connect(double, "Out", tap, "In")
    with UploadRing(engine, up) as feed, DownloadRing(engine, tap, n) as ring:
        engine.update()  # builds (wait_for_compile) and launches: the frame copies nothing yet
        engine.synchronize()
        _refuse_synchronize(monkeypatch)
        frames_seen = []
        for _ in range(50):
            feed.write(_rand(rng, n))  # never waits: a write the GPU is not ready for is dropped
            engine.update()
            got = ring.read()  # plain loads: None or a frame or two old
            if got is not None:
                frames_seen.append(got[1])
        monkeypatch.undo()
        engine.synchronize()
        assert frames_seen == sorted(frames_seen) and feed.written + feed.dropped == 50
        last = _rand(rng, n)
        assert feed.write(last)  # the GPU is idle: the slot is free
        engine.update()
        engine.synchronize()
        values, frame = ring.read()
        np.testing.assert_array_equal(values, last * np.float32(2.0))
        assert frame == 52  # the download ran in every frame since its ring was bound
        np.testing.assert_array_equal(engine.read(up, "Out"), last)


def test_download_of_a_vector_type_keeps_its_lanes(engine: Engine, rng: np.random.Generator) -> None:
    n = 300
    x0 = rng.standard_normal((n, 4)).astype(np.float32)
    delay = engine.add(FrameDelay(name="delay", Type="float4"))
    tap = engine.add(Download(name="tap", Type="float4"))
    engine.bind(delay, "Init", x0)
    engine.connect(delay, "Out", tap, "In")
    with DownloadRing(engine, tap, n) as ring:
        engine.update()
        engine.synchronize()
        values, frame = ring.read()
    assert frame == 1 and values.shape == (n, 4)
    np.testing.assert_array_equal(values, x0)


def test_debug_launch_replays_the_phases_of_a_loop(rng: np.random.Generator) -> None:
    n = 1000
    x0, b = _rand(rng, n), _rand(rng, n)
    with Engine(wait_for_compile=True, debug_launch=True) as engine:
        _, add = _accumulator(engine, x0, b)
        state = x0
        for frame in range(5):
            engine.update()  # node by node, a synchronize after each block
            state = state + b
            np.testing.assert_array_equal(engine.read(add, "Sum"), state, err_msg=f"frame {frame}")
