"""Probes on wires on a real GPU: the probe kernel's statistics against NumPy (float64 reference), NaN
found within 3 frames, no synchronize on the frame path, thumbnails of images, 10 probes on a 100-block
patch. (Placement in the plan is unit-tested: tests/unit/test_probes.py.)

Tolerances: min and max are exact (each value converts to float64 exactly); the mean is a float64 sum
in another order than NumPy's, so it is compared with a relative tolerance of 1e-9.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np
import pytest

from cudapatch import CustomKernel, Engine, Fill, Scale
from cudapatch.engine.probes import THUMB
from cudapatch.kernels._driver import driver

from .conftest import run_until

pytestmark = pytest.mark.gpu

MEAN_RTOL = 1e-9

COPY = """\
extern "C" __global__ void copy(const T* in, T* out, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i];
}
"""


def _copy(name: str, c_type: str) -> CustomKernel:
    return CustomKernel(name=name, Code=COPY.replace("T*", f"{c_type}*"))


def _reference(data: np.ndarray) -> tuple[float, float, float, int, int]:
    v = data.astype(np.float64).ravel()
    fin = v[np.isfinite(v)]
    return float(fin.min()), float(fin.max()), float(fin.mean()), int(np.isnan(v).sum()), int(np.isinf(v).sum())


def _check(stats, data: np.ndarray) -> None:
    mn, mx, mean, nan, inf = _reference(data)
    assert stats is not None
    assert stats.values == data.size
    assert (stats.minimum, stats.maximum) == (mn, mx)
    assert stats.mean == pytest.approx(mean, rel=MEAN_RTOL)
    assert (stats.nan, stats.inf) == (nan, inf)


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Counts every synchronize the driver is asked for (stream, context, event) while the test runs."""
    calls: list[str] = []
    d = driver()
    for name in ("cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize"):
        real = getattr(d, name)

        def counted(*args, _real=real, _name=name):
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(d, name, counted)
    yield calls


DTYPES = {
    "float": (np.float32, 1 << 20),  # many blocks: the last one combines the partial results
    "double": (np.float64, 5000),
    "int": (np.int32, 3000),
    "unsigned int": (np.uint32, 777),
    "unsigned char": (np.uint8, 100),  # one block
}


@pytest.mark.parametrize("c_type", DTYPES.keys())
def test_probe_stats_match_numpy_statistics_of_the_same_buffer(engine: Engine, rng, c_type: str) -> None:
    dtype, n = DTYPES[c_type]
    if np.issubdtype(dtype, np.floating):
        data = (rng.standard_normal(n) * 100 + 7).astype(dtype)
        data[rng.choice(n, 5, replace=False)] = np.nan
        data[rng.choice(n, 3, replace=False)] = np.inf
        data[rng.choice(n, 2, replace=False)] = -np.inf
    else:
        info = np.iinfo(dtype)
        data = rng.integers(max(info.min, -(2**30)), min(info.max, 2**30), n, endpoint=True).astype(dtype)
    block = engine.add(_copy("copy", c_type))
    engine.bind(block, "in", data)
    probe = engine.probe(block, "out")
    engine.wait_ready()
    run_until(engine, lambda: probe.stats is not None)
    _check(probe.stats, data)
    np.testing.assert_array_equal(engine.read(block, "out"), data)  # the probe read the wire's buffer


def test_a_buffer_with_no_finite_value_has_no_span(engine: Engine) -> None:
    data = np.full(4096, np.nan, np.float32)
    block = engine.add(_copy("copy", "float"))
    engine.bind(block, "in", data)
    probe = engine.probe(block, "out")
    engine.wait_ready()
    run_until(engine, lambda: probe.stats is not None)
    st = probe.stats
    assert st.minimum is None and st.mean is None and st.nan == 4096 and st.bad


def test_a_nan_in_a_probed_buffer_shows_within_3_frames_without_a_synchronize(rng, syncs: list[str]) -> None:
    with Engine(wait_for_compile=True) as engine:
        clean = rng.standard_normal(1 << 16).astype(np.float32)
        src = engine.add(_copy("src", "float"))
        scale = engine.add(Scale(name="scale", Factor=0.5))
        engine.connect(src, "out", scale, "In")
        engine.bind(src, "in", clean)
        probe = engine.probe(scale, "Out")
        engine.wait_ready()
        run_until(engine, lambda: probe.stats is not None)
        assert not probe.stats.bad
        bad = clean.copy()
        bad[[3, 999, 40000]] = np.nan
        frame = 1 / 60  # a host at 60 fps
        engine.bind(src, "in", bad)  # same size: re-uploaded (an upload waits for its copy), no rebuild
        before = list(syncs)  # from here on: frames only
        first = engine.counters.frames  # the frame number of the next launch
        seen = None
        for i in range(3):
            engine.update()
            time.sleep(frame)
            st = probe.stats
            if st is not None and st.frame >= first and st.nan:
                seen = i + 1
                break
        assert syncs == before, "the frame path synchronized"
        assert seen is not None, f"no NaN within 3 frames (last stats: {probe.stats})"
        assert probe.stats.nan == 3


def test_a_hundred_frames_with_probes_make_no_synchronize(engine: Engine, rng, syncs: list[str]) -> None:
    fill = engine.add(Fill(name="fill", Count=1 << 18, Value=2.0))
    a = engine.add(Scale(name="a", Factor=3.0))
    engine.connect(fill, "Out", a, "In")
    probes = [engine.probe(fill, "Out"), engine.probe(a, "Out")]
    engine.wait_ready()
    engine.update()  # the first frame (the graph's buffers are made and zeroed before it)
    syncs.clear()
    for _ in range(100):
        engine.update()
        for p in probes:
            _ = p.stats
    assert syncs == []
    run_until(engine, lambda: all(p.stats is not None for p in probes))
    assert (probes[1].stats.minimum, probes[1].stats.maximum) == (6.0, 6.0)


def test_ten_probes_on_a_hundred_block_patch(engine: Engine) -> None:
    blocks = [engine.add(Fill(name="b0", Count=10_000, Value=1.0))]
    for i in range(1, 100):
        blocks.append(engine.add(Scale(name=f"b{i}", Factor=1.0 + i / 1000)))
        engine.connect(blocks[-2], "Out", blocks[-1], "In")
    probed = blocks[::10]
    probes = [engine.probe(b, "Out") for b in probed]
    engine.wait_ready()
    run_until(engine, lambda: all(p.stats is not None for p in probes))
    assert len(engine.graph.plan.probes) == 10
    for b, p in zip(probed, probes, strict=True):
        _check(p.stats, engine.read(b, "Out"))


def test_an_image_probe_brings_back_a_thumbnail_of_the_image(engine: Engine) -> None:
    h, w = 48, 64
    y, x = np.mgrid[0:h, 0:w]
    image = (x + 10.0 * y).astype(np.float32)
    image[5, 7] = np.nan
    block = engine.add(_copy("img", "float"))
    engine.bind(block, "in", image.ravel())
    probe = engine.probe(block, "out", shape=(h, w))
    engine.wait_ready()
    run_until(engine, lambda: probe.stats is not None)
    st = probe.stats
    _check(st, image)
    tw, th = min(w, THUMB), min(h, THUMB)
    xs = ((2 * np.arange(tw) + 1) * w) // (2 * tw)
    ys = ((2 * np.arange(th) + 1) * h) // (2 * th)
    sample = image[np.ix_(ys, xs)].astype(np.float64)
    want = np.floor(1.5 + 254.0 * (sample - st.minimum) / (st.maximum - st.minimum))
    want[~np.isfinite(sample)] = 0
    assert st.thumbnail.shape == (th, tw)
    assert np.abs(st.thumbnail.astype(int) - want.astype(int)).max() <= 1


def test_a_probe_added_to_a_running_patch_is_built_on_the_build_thread_and_closed_again(live_engine: Engine) -> None:
    e = live_engine
    fill = e.add(Fill(name="fill", Count=4096, Value=0.25))
    s = e.add(Scale(name="s", Factor=4.0))
    e.connect(fill, "Out", s, "In")
    run_until(e, lambda: e.graph is not None and not e.kernels.pending and not e.building)
    probe = e.probe(s, "Out")  # a structure edit: the build thread builds it, frames keep launching
    run_until(e, lambda: probe.stats is not None)
    assert (probe.stats.minimum, probe.stats.mean) == (1.0, 1.0) and probe.running
    probe.close()
    run_until(e, lambda: not e.building and not e.context.dirty.structure and not e.graph.plan.probes)
    assert probe.stats is None and e.probes == ()
