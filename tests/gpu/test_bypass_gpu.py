"""Bypass on a real GPU: ``block.enabled = False`` turns the block's kernels off in the running graph
(``cuGraphNodeSetEnabled``) and its readers read its input, from the next frame, with no new graph;
a block whose values share buffers (buffer reuse) copies its input into its output from the next frame
(carried) until the one build that gives it buffers of its own is swapped in; a block fused into a
kernel with others is bypassed once the build that gives it a node of its own is swapped in."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import DType, Engine, Fill, Scale
from cudapatch.engine.buffers import GpuBuffer
from cudapatch.engine.memory_plan import shares_with_others

from .conftest import run_until

pytestmark = pytest.mark.gpu


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _chain(engine: Engine, x: np.ndarray) -> tuple[Scale, Scale]:
    s1 = engine.add(Scale(name="s1", Factor=2.0))
    s2 = engine.add(Scale(name="s2", Factor=3.0))
    engine.connect(s1, "Out", s2, "In")
    engine.bind(s1, "In", x)
    engine.update()
    return s1, s2


def test_bypass_reads_the_input_next_frame_without_a_new_graph(
    unfused_engine: Engine, rng: np.random.Generator
) -> None:
    engine = unfused_engine  # s1 -> s2 would fuse: the next test bypasses inside a fused group
    x = _rand(rng, 10_007)
    s1, s2 = _chain(engine, x)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 6, rtol=1e-6)
    graph, c = engine.graph, engine.counters
    rebuilds, resizes = c.rebuilds, c.warm_resizes
    engine.output(s2, "Out").fill_bytes(0xFF)  # poison: the bypassed frame must write every element
    s1.enabled = False
    engine.update()
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 3, rtol=1e-6)  # s2 reads x itself
    s1.enabled, s2.enabled = True, False  # the last block: its output is s1's, as its readers would read
    engine.update()
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 2, rtol=1e-6)
    s2.enabled = True
    engine.update()
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 6, rtol=1e-6)
    assert engine.graph is graph and graph.instantiations == 1
    assert (c.rebuilds, c.warm_resizes) == (rebuilds, resizes) and c.bypass_updates == 3


def test_bypassing_a_fused_member_builds_once_then_toggles_without_a_new_graph(
    engine: Engine, rng: np.random.Generator
) -> None:
    x = _rand(rng, 10_007)
    s1, s2 = _chain(engine, x)  # fused: one kernel computes s2(s1(x))
    x64 = x.astype(np.float64)
    assert s1.debug.fused == "s1 -> s2" and engine.graph.kernel_count == 1
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 6, rtol=1e-6)
    c = engine.counters
    rebuilds = c.rebuilds
    engine.output(s2, "Out").fill_bytes(0xFF)  # poison: the bypassed frame must write every element
    s1.enabled = False  # its node is the group's: this update builds the graph with s1 on a node of its own
    engine.update()
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 3, rtol=1e-6)  # s2 reads x itself
    assert c.rebuilds == rebuilds + 1 and not s1.debug.fused and engine.graph.kernel_count == 2
    graph = engine.graph
    s1.enabled, s2.enabled = True, False  # from here on: the Bypass tier alone
    engine.update()
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 2, rtol=1e-6)
    s2.enabled = True
    engine.update()
    np.testing.assert_allclose(engine.read(s2, "Out"), x64 * 6, rtol=1e-6)
    assert engine.graph is graph and graph.instantiations == 1 and c.rebuilds == rebuilds + 1


def test_a_bypass_whose_values_share_buffers_is_carried_next_frame_until_the_build_that_pins_them_lands(
    tmp_path, rng: np.random.Generator
) -> None:
    # A live engine (builds on the build thread), unfused, buffer reuse on: the chain's values take turns
    # in a few buffers, so the block cannot be turned off until the build that gives its values their own
    # lands; meanwhile its node copies its input into its output (carried), from the next frame on.
    with Engine(cache_dir=tmp_path / "kernel-cache", fuse=False) as e:
        x = _rand(rng, 4099)
        factors = [1.0 + i / 8 for i in range(8)]
        blocks = [e.add(Scale(name=f"s{i}", Factor=f)) for i, f in enumerate(factors)]
        for a, b in zip(blocks, blocks[1:], strict=False):
            e.connect(a, "Out", b, "In")
        e.bind(blocks[0], "In", x)
        last, s3 = blocks[-1], blocks[3]
        run_until(e, lambda: e.graph is not None and last.id in e.graph.plan.block_order and not e.building)
        run_until(e, lambda: e.resources.copy_kernels() is not None)  # asked for by the first build
        g = e.graph
        assert shares_with_others(g.plan, {s3.id})
        x64 = x.astype(np.float64)
        e.output(last, "Out").fill_bytes(0xFF)  # poison: the carried frame must write every element
        s3.enabled = False
        e.update()  # carried: s3's node copies s2's output into its own; the build that pins them starts
        assert e.building and e.graph is g and g.instantiations == 1 and not g.bypass.disabled
        assert set(g.bypass.carried) == set(g.plan.block_nodes[s3.id])
        np.testing.assert_allclose(e.read(last, "Out"), x64 * np.prod(factors) / factors[3], rtol=1e-5)
        # Hot edits while it is carried: the carried block's value is kept for when it runs, another's lands.
        s3.set("Factor", 5.0)
        blocks[5].set("Factor", 2.0)
        e.update()
        factors[3], factors[5] = 5.0, 2.0
        if e.graph is g:  # (the build may have landed in this frame)
            want = np.prod([f for i, f in enumerate(factors) if i != 3])
            np.testing.assert_allclose(e.read(last, "Out"), x64 * want, rtol=1e-5)
        run_until(e, lambda: not e.building)
        g2 = e.graph
        assert g2 is not g and not shares_with_others(g2.plan, {s3.id})
        assert set(g2.plan.block_nodes[s3.id]) <= g2.bypass.disabled  # applied before its first launch
        for on in (False, True, False, True):  # the Bypass tier alone from here on
            s3.enabled = on
            e.output(last, "Out").fill_bytes(0xFF)  # poison: the next frame must write every element
            e.update()
            want = np.prod([f for i, f in enumerate(factors) if on or i != 3])
            np.testing.assert_allclose(e.read(last, "Out"), x64 * want, rtol=1e-5)
        assert e.graph is g2 and g2.instantiations == 1 and not g2.bypass.disabled


def test_a_bypassed_block_without_an_input_leaves_its_last_values(engine: Engine) -> None:
    f = engine.add(Fill(name="f", Count=4096, Value=1.5))
    s = engine.add(Scale(name="s", Factor=2.0))
    engine.connect(f, "Out", s, "In")
    engine.update()
    rebuilds = engine.counters.rebuilds
    f.enabled = False
    f.set("Value", 7.0)  # a Hot edit of a block that is off: nothing writes it
    engine.update()
    np.testing.assert_array_equal(engine.read(s, "Out"), np.full(4096, 3.0, np.float32))
    f.enabled = True
    engine.update()
    np.testing.assert_array_equal(engine.read(s, "Out"), np.full(4096, 14.0, np.float32))
    assert engine.counters.rebuilds == rebuilds


def test_bypass_outlives_a_cold_rebuild_and_follows_a_warm_rebind(engine: Engine, rng: np.random.Generator) -> None:
    n = 5000
    x = _rand(rng, n)
    s1, s2 = _chain(engine, x)
    s1.enabled = False
    engine.update()
    extra = engine.add(Scale(name="extra", Factor=10.0))  # Cold: a new graph, s1 still off in it
    engine.connect(s2, "Out", extra, "In")
    rebuilds = engine.counters.rebuilds
    engine.update()
    assert engine.counters.rebuilds == rebuilds + 1
    np.testing.assert_allclose(engine.read(extra, "Out"), x.astype(np.float64) * 30, rtol=1e-6)
    y = _rand(rng, n)
    with GpuBuffer(engine.pool, DType.FLOAT32, n, stream=engine.stream) as buf:
        buf.upload(y)
        engine.bind(s1, "In", buf)  # another pointer, same size: Warm; s2 reads it in place of s1's output
        engine.update()
        assert engine.counters.rebuilds == rebuilds + 1
        np.testing.assert_allclose(engine.read(extra, "Out"), y.astype(np.float64) * 30, rtol=1e-6)
        s1.enabled = True
        engine.update()
        np.testing.assert_allclose(engine.read(extra, "Out"), y.astype(np.float64) * 60, rtol=1e-6)
        engine.synchronize()


def test_bypass_through_the_host_adapter(engine: Engine, rng: np.random.Generator) -> None:
    from cudapatch.host_plugin import PluginHost
    from cudapatch.host_plugin.adapter import HostAdapter

    adapter = HostAdapter(engine, PluginHost().registry)
    f = adapter.create("f", "core.Fill", {"Count": 1024, "Value": 2.0})
    adapter.create("s", "core.Scale", {"Factor": 5.0})
    adapter.connect("f", "Out", "s", "In")
    adapter.create("t", "core.Scale", {"Factor": 0.5})
    adapter.connect("s", "Out", "t", "In")
    engine.update()
    rebuilds = engine.counters.rebuilds
    adapter.set_bypass("s", True)
    engine.update()
    np.testing.assert_array_equal(engine.read(adapter.block("t"), "Out"), np.full(1024, 1.0, np.float32))
    adapter.set_bypass("s", False)
    engine.update()
    np.testing.assert_array_equal(engine.read(adapter.block("t"), "Out"), np.full(1024, 5.0, np.float32))
    # s and t were one fused kernel: the first bypass of s took it out of the group (one build)
    assert engine.counters.rebuilds == rebuilds + 1 and f.enabled
