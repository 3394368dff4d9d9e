"""What the node editor shows inside an open composite, on a real GPU: a probe on an inner block's output
(a wire of the flattened graph) against NumPy, and the inner blocks' GPU times in
``EngineStats.block_ms`` inside the composite's own span. (The editor's model of it is unit-tested in
tests/unit/test_editor_composites.py, drawing in tests/gl/test_editor_composites_gl.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Composite, CompositeBuilder, CustomKernel, Engine, Scale

from .conftest import run_until
from .test_probes_gpu import COPY, MEAN_RTOL

pytestmark = pytest.mark.gpu


class _TwoScales(Composite):
    """Out = (In * Gain) * 2 + 0.5"""

    type_name = "TwoScales"

    def compose(self, c: CompositeBuilder) -> None:
        c.add("a", Scale())
        c.add("b", Scale(Factor=2.0, Offset=0.5))
        c.link("a.Out", "b.In")
        c.expose("In", "a.In")
        c.expose("Out", "b.Out")
        c.expose("Gain", "a.Factor")


def _patch(engine: Engine, data: np.ndarray) -> _TwoScales:
    src = engine.add(CustomKernel(name="src", Code=COPY.replace("T*", "float*")))
    two = engine.add(_TwoScales(name="two", Gain=3.0))
    engine.connect(src, "out", two, "In")
    engine.bind(src, "in", data)
    return two


def test_a_probe_on_an_inner_blocks_output_matches_numpy(engine: Engine, rng) -> None:
    data = (rng.standard_normal(1 << 18) * 10 + 1).astype(np.float32)
    data[[7, 4000]] = np.nan
    two = _patch(engine, data)
    probe = engine.probe(two.inner("a"), "Out")  # the wire a.Out -> b.In, inside the composite
    engine.wait_ready()
    run_until(engine, lambda: probe.stats is not None)
    inner = data.astype(np.float32) * np.float32(3.0)  # a: In * Gain, in float32 as the kernel computes it
    v = inner.astype(np.float64)
    fin = v[np.isfinite(v)]
    st = probe.stats
    assert st.values == data.size and st.nan == 2 and st.inf == 0
    assert (st.minimum, st.maximum) == (float(fin.min()), float(fin.max()))
    assert st.mean == pytest.approx(float(fin.mean()), rel=MEAN_RTOL)
    np.testing.assert_allclose(engine.read(two, "Out"), inner * np.float32(2.0) + np.float32(0.5), rtol=1e-6)
    engine.remove(two)  # its inner probe goes with it
    assert not engine.context.probes and not engine.probes


def test_inner_blocks_gpu_times_lie_within_the_composites(unfused_engine: Engine, rng) -> None:
    engine = unfused_engine
    two = _patch(engine, rng.standard_normal(1 << 20).astype(np.float32))
    engine.set_profiling("PerBlock")
    engine.wait_ready()
    a, b = two.inner("a"), two.inner("b")
    run_until(engine, lambda: a.id in engine.stats().block_ms and b.id in engine.stats().block_ms)
    stats = engine.stats()
    row = next(r for r in stats.blocks if r.block_id == two.id)
    assert row.gpu_ms is not None and stats.block_ms[two.id] == row.gpu_ms
    assert 0 < stats.block_ms[a.id] <= row.gpu_ms and 0 < stats.block_ms[b.id] <= row.gpu_ms
    assert all(r.block_id not in (a.id, b.id) for r in stats.blocks)  # rows stay one per registered block
