"""``cuGraphExecUpdate`` on a real GPU: a Cold build made on the frame thread whose graph has the
running graph's topology is taken by the running executable instead of instantiating a new one, and
every later tier (Hot, bypass) still reaches its nodes."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CustomKernel, Engine, Scale

pytestmark = pytest.mark.gpu

GAIN = """extern "C" __global__ void gain(const float* in, float* out, float g, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * g;
}
"""
# Another entry point: the running node cannot take it in place (Code swap or Warm): a Cold build.
GAIN_PLUS = GAIN.replace("void gain(", "void gain_plus(").replace("in[i] * g", "in[i] * g + 1.0f")


def test_a_cold_build_of_the_same_topology_updates_the_running_executable(
    engine: Engine, rng: np.random.Generator
) -> None:
    x = rng.standard_normal(50_000).astype(np.float32)
    k = engine.add(CustomKernel(name="k", Code=GAIN))
    s = engine.add(Scale(name="s", Factor=2.0))
    engine.connect(k, "out", s, "In")
    engine.bind(k, "in", x)
    k.set("g", 3.0)
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), x.astype(np.float64) * 6, rtol=1e-6)
    c = engine.counters
    graph, handle = engine.graph, engine.graph.handle
    instantiations, rebuilds, updates = c.instantiations, c.rebuilds, c.exec_updates
    k.set("Code", GAIN_PLUS)
    engine.update()
    assert (c.rebuilds, c.exec_updates, c.instantiations) == (rebuilds + 1, updates + 1, instantiations)
    assert engine.graph is not graph and int(engine.graph.handle) == int(handle) and engine.graph.instantiations == 0
    np.testing.assert_allclose(engine.read(s, "Out"), (x.astype(np.float64) * 3 + 1) * 2, rtol=1e-6)
    k.set("g", -1.5)  # Hot, through the executable's own node handles
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), (x.astype(np.float64) * -1.5 + 1) * 2, rtol=1e-6)
    k.enabled = False  # a bypass, too: s reads x
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), x.astype(np.float64) * 2, rtol=1e-6)
    k.enabled = True
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), (x.astype(np.float64) * -1.5 + 1) * 2, rtol=1e-6)
    assert c.instantiations == instantiations


def test_another_topology_is_instantiated(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine  # fused, s1 -> s2 would be one node again: the same topology, an update
    x = rng.standard_normal(1000).astype(np.float32)
    s1 = engine.add(Scale(name="s1", Factor=2.0))
    engine.bind(s1, "In", x)
    engine.update()
    c = engine.counters
    instantiations, updates = c.instantiations, c.exec_updates
    s2 = engine.add(Scale(name="s2", Factor=3.0))
    engine.connect(s1, "Out", s2, "In")
    engine.update()
    assert (c.instantiations, c.exec_updates) == (instantiations + 1, updates)
    np.testing.assert_allclose(engine.read(s2, "Out"), x.astype(np.float64) * 6, rtol=1e-6)
