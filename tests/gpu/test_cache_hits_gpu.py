"""A block whose kernel is already compiled (memory or disk cache) runs in the first ``update()``
whose build includes it: the build loads the cached kernel itself instead of waiting for the
kernel builder, which works only between frames."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import BlockState, Engine, Scale

pytestmark = pytest.mark.gpu


def _first(engine: Engine, rng: np.random.Generator) -> tuple[Scale, np.ndarray]:
    x = rng.standard_normal(4096).astype(np.float32)
    s1 = engine.add(Scale(name="s1", Factor=2.0))
    engine.bind(s1, "In", x)
    engine.wait_ready()  # Scale's kernel is compiled now: in the memory and disk caches
    engine.update()
    return s1, x


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_a_cached_kernel_runs_in_the_update_that_swaps_in_its_build(
    tmp_path, rng: np.random.Generator, cache: str
) -> None:
    if cache == "disk":  # another engine compiled it; this one finds it on disk only
        with Engine(cache_dir=tmp_path) as other:
            _first(other, rng)
    with Engine(cache_dir=tmp_path) as engine:
        if cache == "memory":
            s1, x = _first(engine, rng)
        else:
            x = rng.standard_normal(4096).astype(np.float32)
            s1 = engine.add(Scale(name="s1", Factor=2.0))
            engine.bind(s1, "In", x)
        s2 = engine.add(Scale(name="s2", Factor=3.0))
        engine.connect(s1, "Out", s2, "In")
        engine.update()  # starts the build on the build thread
        # No frames meanwhile: nothing opens the kernel builder's gate, so only the build itself can
        # load s2's kernel. (``building`` stays True until a frame takes the finished build.)
        assert engine._worker.wait(10.0)
        engine.update()  # swaps the build in: s2 runs in this frame
        assert s2.debug.state is BlockState.OK, s2.debug.message
        np.testing.assert_allclose(engine.read(s2, "Out"), x.astype(np.float64) * 6, rtol=1e-6)


def test_without_the_build_thread_a_cached_kernel_runs_in_the_edit_frame(tmp_path, rng: np.random.Generator) -> None:
    with Engine(cache_dir=tmp_path, background_builds=False) as engine:
        s1, x = _first(engine, rng)
        rebuilds = engine.counters.rebuilds
        s2 = engine.add(Scale(name="s2", Factor=3.0))
        engine.connect(s1, "Out", s2, "In")
        engine.update()
        assert engine.counters.rebuilds == rebuilds + 1 and s2.debug.state is BlockState.OK
        np.testing.assert_allclose(engine.read(s2, "Out"), x.astype(np.float64) * 6, rtol=1e-6)
