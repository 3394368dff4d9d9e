"""The engine on a real GPU: results against NumPy, and which update tier each edit takes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cudapatch import AppendFilter, Block, BlockBuilder, BlockState, Engine, Fill, Scale, VectorAdd
from cudapatch.blocks import like
from cudapatch.kernels import PtxFileSource, bundled_kernel

from .conftest import Spin, StreamMark

pytestmark = pytest.mark.gpu


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def test_vector_add_pipeline_matches_numpy(engine: Engine, rng: np.random.Generator) -> None:
    n = 100_003  # not a multiple of the block size: the tail must be handled
    a, b = _rand(rng, n), _rand(rng, n)
    add = engine.add(VectorAdd(name="add"))
    scale = engine.add(Scale(name="scale", Factor=-2.5, Offset=0.25))
    engine.connect(add, "Sum", scale, "In")
    engine.bind(add, "A", a)
    engine.bind(add, "B", b)
    engine.update()
    engine.synchronize()
    engine.output(scale, "Out").fill_bytes(0xFF)  # poison: NaN everywhere, so unwritten elements show
    engine.update()
    got = engine.read(scale, "Out")
    ref = (a.astype(np.float64) + b.astype(np.float64)) * -2.5 + 0.25
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-6)
    assert add.debug.state is BlockState.OK and str(add) == "add: OK\n  fused: add -> scale"  # one kernel


def test_hot_update_changes_next_frame_without_reinstantiation(engine: Engine, rng: np.random.Generator) -> None:
    x = _rand(rng, 4096)
    s = engine.add(Scale(name="s", Factor=1.0))
    engine.bind(s, "In", x)
    engine.update()
    graph = engine.graph
    rebuilds = engine.counters.rebuilds
    for factor in rng.uniform(-3, 3, size=5):
        s.set("Factor", float(factor))
        engine.update()
        np.testing.assert_allclose(engine.read(s, "Out"), x.astype(np.float64) * np.float32(factor), rtol=1e-6)
    assert engine.graph is graph and graph.instantiations == 1
    assert engine.counters.rebuilds == rebuilds
    assert engine.counters.hot_updates == 5


def test_warm_rebind_with_cupy_arrays(engine: Engine, rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cupy")
    n = 50_000
    a1, a2, b = (cp.asarray(_rand(rng, n)) for _ in range(3))
    cp.cuda.get_current_stream().synchronize()  # bound arrays are written before the update
    add = engine.add(VectorAdd(name="add"))
    engine.bind(add, "A", a1)
    engine.bind(add, "B", b)
    engine.update()
    np.testing.assert_allclose(engine.read(add, "Sum"), cp.asnumpy(a1 + b), rtol=1e-6)
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    engine.bind(add, "A", a2)  # same size: only the pointer changes
    engine.update()
    np.testing.assert_allclose(engine.read(add, "Sum"), cp.asnumpy(a2 + b), rtol=1e-6)
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds and engine.counters.warm_updates == 1
    # a zero-copy view of our output through __cuda_array_interface__
    view = cp.asarray(engine.output(add, "Sum"))
    np.testing.assert_array_equal(cp.asnumpy(view), engine.read(add, "Sum"))
    big_a, big_b = cp.asarray(_rand(rng, 4 * n)), cp.asarray(_rand(rng, 4 * n))
    cp.cuda.get_current_stream().synchronize()
    engine.bind(add, "A", big_a)  # four times the size: the output grows in place (Warm), no new graph
    engine.bind(add, "B", big_b)
    engine.update()
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds and engine.counters.growths == 1
    np.testing.assert_allclose(engine.read(add, "Sum"), cp.asnumpy(big_a + big_b), rtol=1e-6)


def test_warm_resize_when_counts_change_within_capacity(engine: Engine, rng: np.random.Generator) -> None:
    n = 100_000
    add = engine.add(VectorAdd(name="add"))
    s = engine.add(Scale(name="s", Factor=2.0))
    engine.connect(add, "Sum", s, "In")
    a, b = _rand(rng, n), _rand(rng, n)
    engine.bind(add, "A", a)
    engine.bind(add, "B", b)
    engine.update()
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    for m in (n - 1, 513, 1, n):  # smaller inputs fit the buffers already allocated
        a2, b2 = _rand(rng, m), _rand(rng, m)
        engine.bind(add, "A", a2)
        engine.bind(add, "B", b2)
        s.set("Factor", float(m % 7) - 3.0)  # a Hot edit pending together with the resize
        engine.update()
        out = engine.read(s, "Out")
        assert out.shape == (m,)
        np.testing.assert_allclose(out, (a2.astype(np.float64) + b2) * (m % 7 - 3.0), rtol=1e-6, atol=1e-6)
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds and engine.counters.warm_resizes == 4
    f = engine.add(Fill(name="f", Count=4096, Value=1.5))  # a structural parameter within capacity: Warm too
    engine.update()
    rebuilds = engine.counters.rebuilds
    f.set("Count", 4000)
    engine.update()
    assert engine.counters.rebuilds == rebuilds and engine.read(f, "Out").shape == (4000,)
    f.set("Count", 40_000)  # beyond the allocation: reallocated from the pool, still no new graph
    engine.update()
    assert engine.counters.rebuilds == rebuilds and engine.counters.growths == 1
    np.testing.assert_array_equal(engine.read(f, "Out"), np.full(40_000, 1.5, np.float32))


def test_cold_rebuild_on_connect_disconnect_add_remove(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine  # kernel counts per block (s1 -> s2 would fuse into one)
    x = _rand(rng, 1000)
    c = engine.counters
    s1 = engine.add(Scale(name="s1", Factor=2.0))
    engine.bind(s1, "In", x)
    engine.update()
    assert c.rebuilds == 1
    s2 = engine.add(Scale(name="s2", Factor=3.0))  # add: s2 has no input yet, so it is skipped with a warning
    engine.update()
    assert (c.rebuilds, c.warm_resizes) == (1, 1)  # the plan is unchanged: no new graph
    assert s2.debug.state is BlockState.NOT_COMPILED and "not linked" in s2.debug.message
    engine.connect(s1, "Out", s2, "In")
    engine.update()
    assert c.rebuilds == 2 and s2.debug.state is BlockState.OK
    np.testing.assert_allclose(engine.read(s2, "Out"), x.astype(np.float64) * 6.0, rtol=1e-6)
    engine.disconnect(s1, "Out", s2, "In")
    engine.update()
    assert c.rebuilds == 3 and s2.debug.state is BlockState.NOT_COMPILED and engine.graph.kernel_count == 1
    engine.connect(s1, "Out", s2, "In")
    engine.update()
    assert c.rebuilds == 4 and engine.graph.kernel_count == 2
    engine.remove(s2)
    engine.update()
    assert c.rebuilds == 5 and engine.graph.kernel_count == 1
    np.testing.assert_allclose(engine.read(s1, "Out"), x.astype(np.float64) * 2.0, rtol=1e-6)


def test_append_filter_counts_over_frames_match_numpy(engine: Engine, rng: np.random.Generator) -> None:
    n = 200_000
    f = engine.add(AppendFilter(name="keep", Capacity=n))
    for frame in range(3):
        x = _rand(rng, n)
        thr = float(rng.uniform(-1, 1))
        engine.bind(f, "In", x)
        f.set("Threshold", thr)
        engine.update()
        kept = engine.read(f, "Kept")
        ref = np.sort(x[x > np.float32(thr)])
        assert kept.shape == ref.shape, f"frame {frame}"
        np.testing.assert_array_equal(np.sort(kept), ref)
    # the asynchronous count arrives without any explicit synchronize from the engine
    ab = engine.append_buffer(f, "Kept")
    engine.synchronize()
    engine.update()
    engine.synchronize()
    engine.update()
    assert ab.count == ref.size and not ab.overflowed and ab.age is not None and ab.age <= 2
    assert f.debug.append["Kept"] is ab


def test_append_overflow_is_flagged_and_never_written_past_capacity(engine: Engine, rng: np.random.Generator) -> None:
    n, cap = 10_000, 100
    x = np.abs(_rand(rng, n)) + 1.0  # every element passes
    f = engine.add(AppendFilter(name="keep", Capacity=cap, Threshold=0.0))
    engine.bind(f, "In", x)
    engine.update()
    out = engine.output(f, "Kept")
    assert out.count == cap
    kept = engine.read(f, "Kept")
    assert kept.shape == (cap,) and np.isin(kept, x).all()
    engine.update()
    engine.synchronize()
    engine.update()
    ab = engine.append_buffer(f, "Kept")
    assert ab.overflowed and ab.raw_count == n and ab.count == cap


def test_failing_rebuild_keeps_the_old_graph_running(engine: Engine, rng: np.random.Generator, tmp_path: Path) -> None:
    x = _rand(rng, 512)
    s = engine.add(Scale(name="s", Factor=2.0))
    engine.bind(s, "In", x)
    engine.update()
    good = engine.graph
    # a PTX whose signature matches the sidecar but whose body the driver rejects
    src = bundled_kernel("scale")
    ptx = src.ptx_path.read_text().replace("ret;", "this_is_not_ptx;")
    (tmp_path / "bad.ptx").write_text(ptx)
    (tmp_path / "bad.json").write_text(src.sidecar_path.read_text())

    class Broken(Block):
        type_name = "Broken"

        def describe(self, b: BlockBuilder) -> None:
            k = b.add_kernel(PtxFileSource(tmp_path / "bad.ptx"))
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=16)
            b.scalar("F", k.in_(2), default=1.0)
            b.scalar("O", k.in_(3), default=0.0)
            k.auto_grid(16, count_param=4)

    broken = engine.add(Broken(name="broken"))
    engine.connect(s, "Out", broken, "In")
    engine.update()  # the broken kernel does not compile: the block stays out, the rest keeps running
    assert engine.graph is good
    assert broken.debug.state is BlockState.ERROR and "bad.ptx" in broken.debug.message
    diag = next(d for d in engine.diagnostics() if d.block_id == broken.id and d.severity == "error")
    assert "this_is_not_ptx" in diag.message  # the compiler's log is on the block
    s.set("Factor", -1.0)  # Hot updates still reach the old graph
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), -x.astype(np.float64), rtol=1e-6)
    engine.remove(broken)  # fixing the patch clears the error (the plan equals the running one: no rebuild)
    s.set("Factor", 3.0)
    engine.update()
    assert not engine.diagnostics() and s.debug.state is BlockState.OK
    np.testing.assert_allclose(engine.read(s, "Out"), 3.0 * x.astype(np.float64), rtol=1e-6)


def test_update_does_not_wait_for_the_gpu(engine: Engine) -> None:
    spin = engine.add(Spin(name="spin", Cycles=1000))
    engine.update()
    engine.synchronize()
    clock_hz = 1.0e9  # conservative lower bound of an H100's SM clock (~1.7-2 GHz): >= 100 ms of work
    spin.set("Cycles", int(0.1 * clock_hz))
    engine.update()  # applies the Hot update and launches
    with StreamMark(engine) as first_frame:  # reached once the >= 100 ms frame is done
        engine.update()  # a second launch queued behind it
        assert first_frame.pending(), "update() returned only after the previous frame finished: it waited"
        engine.synchronize()
        assert not first_frame.pending()


def test_frame_path_allocates_nothing(engine: Engine, rng: np.random.Generator) -> None:
    f = engine.add(Fill(name="f", Count=1 << 16, Value=1.0))
    s = engine.add(Scale(name="s"))
    k = engine.add(AppendFilter(name="k", Threshold=0.5))
    engine.connect(f, "Out", s, "In")
    engine.connect(s, "Out", k, "In")
    engine.update()
    before = (engine.pool.driver_allocations, engine.pool.total_allocated_bytes, engine.pool.in_use_bytes)
    for i in range(10_000):
        if i % 100 == 0:
            s.set("Factor", float(i % 7))  # Hot updates allocate nothing either
        engine.update()
    engine.synchronize()
    assert (engine.pool.driver_allocations, engine.pool.total_allocated_bytes, engine.pool.in_use_bytes) == before


def test_rebuilds_return_memory_to_baseline(engine: Engine) -> None:
    f = engine.add(Fill(name="f", Count=1 << 20))
    s = engine.add(Scale(name="s"))
    tail = engine.add(AppendFilter(name="tail"))
    engine.connect(f, "Out", s, "In")

    def toggle(i: int) -> None:  # a real topology change each time: Cold
        if i % 2 == 0:
            engine.connect(s, "Out", tail, "In")
        else:
            engine.disconnect(s, "Out", tail, "In")

    for i in range(3):
        toggle(i)
        engine.update()
    engine.synchronize()
    engine.update()
    base_pool = engine.pool.total_allocated_bytes
    base_free = engine.device.mem_info()[0]
    rebuilds = engine.counters.rebuilds
    for i in range(3, 1003):
        toggle(i)
        engine.update()
    assert engine.counters.rebuilds == rebuilds + 1000
    engine.synchronize()
    engine.update()  # reaps retired graphs
    assert engine.pool.total_allocated_bytes == base_pool
    assert len(engine.resources.retired) <= 1
    assert abs(engine.device.mem_info()[0] - base_free) <= 4 << 20


def test_engine_create_close_cycles_do_not_leak(rng: np.random.Generator) -> None:
    from cuda.bindings import driver as d

    keep = Engine(wait_for_compile=True)  # holds the primary context, so each cycle does not re-create it
    try:
        x = _rand(rng, 1024)
        free0 = keep.device.mem_info()[0]
        for _ in range(1000):
            with Engine(wait_for_compile=True) as e:
                s = e.add(Scale(Factor=3.0))
                e.bind(s, "In", x)
                e.update()
        e2 = Engine(wait_for_compile=True)
        s = e2.add(Scale(Factor=3.0))
        e2.bind(s, "In", x)
        e2.update()
        np.testing.assert_allclose(e2.read(s, "Out"), x * 3.0, rtol=1e-6)
        e2.close()
        assert abs(keep.device.mem_info()[0] - free0) <= 8 << 20
        assert d.cuCtxGetCurrent()[0] == d.CUresult.CUDA_SUCCESS
    finally:
        keep.close()


def test_close_is_idempotent_and_blocks_can_move_to_another_engine() -> None:
    e1 = Engine()
    s = e1.add(Scale(name="s"))
    e1.close()
    e1.close()
    assert s.context is None
    with Engine() as e2:
        e2.add(s)
        assert s.context is e2.context


def test_output_pointers_survive_a_cold_rebuild(engine: Engine, rng: np.random.Generator) -> None:
    cp = pytest.importorskip("cupy")
    x = _rand(rng, 4096)
    s = engine.add(Scale(name="s", Factor=2.0))
    engine.bind(s, "In", x)
    engine.update()
    view = cp.asarray(engine.output(s, "Out"))  # a zero-copy view a host app might keep
    before = engine.output(s, "Out").ptr
    tail = engine.add(Scale(name="tail", Factor=10.0))
    engine.connect(s, "Out", tail, "In")  # Cold: a new graph
    s.set("Factor", 3.0)
    engine.update()
    assert engine.counters.rebuilds == 2 and engine.output(s, "Out").ptr == before
    engine.synchronize()
    np.testing.assert_allclose(cp.asnumpy(view), 3.0 * x.astype(np.float64), rtol=1e-6)
    np.testing.assert_allclose(engine.read(tail, "Out"), 30.0 * x.astype(np.float64), rtol=1e-6)


def test_compile_error_keeps_the_old_graph_running(engine: Engine, rng: np.random.Generator) -> None:
    class Morph(Block):
        """A block whose output changes type when re-described (like a hot-swapped operator)."""

        type_name = "Morph"
        as_uint = False

        def describe(self, b: BlockBuilder) -> None:
            if self.as_uint:  # now Out is an append counter (uint)
                k = b.add_kernel(bundled_kernel("append_filter"))
                b.input("In", k.in_(0))
                b.output("Out", k.out(2), size=1)
                b.output("Data", k.out(1), size=like("In"))
                b.scalar("T", k.in_(3), default=0.0)
                k.auto_grid(like("In"), count_param=4)
                k.set_count(5, like("In"))
            else:
                k = b.add_kernel(bundled_kernel("scale"))
                b.input("In", k.in_(0))
                b.output("Out", k.out(1), size=like("In"))
                b.scalar("F", k.in_(2), default=1.0)
                b.scalar("O", k.in_(3), default=0.0)
                k.auto_grid(like("In"), count_param=4)

    x = _rand(rng, 256)
    m = engine.add(Morph(name="m"))
    s = engine.add(Scale(name="s", Factor=2.0))
    engine.connect(m, "Out", s, "In")
    engine.bind(m, "In", x)
    engine.update()
    good = engine.graph
    m.as_uint = True
    m.refresh()  # the link m.Out -> s.In is now uint -> float
    engine.update()
    assert engine.graph is good and s.debug.state is BlockState.ERROR and "element types differ" in s.debug.message
    s.set("Factor", 5.0)
    engine.update()  # the old graph still runs and still takes Hot edits
    np.testing.assert_allclose(engine.read(s, "Out"), x.astype(np.float64) * 5.0, rtol=1e-6)


def test_a_bound_input_growing_twice_over_reallocates_without_a_new_graph(
    unfused_engine: Engine, rng: np.random.Generator
) -> None:
    engine = unfused_engine  # two buffers that grow: fused, s1's output would be in none
    n = 30_000
    s1 = engine.add(Scale(name="s1", Factor=2.0))
    s2 = engine.add(Scale(name="s2", Factor=-0.5, Offset=1.0))
    engine.connect(s1, "Out", s2, "In")
    engine.bind(s1, "In", _rand(rng, n))
    engine.update()
    graph, c = engine.graph, engine.counters
    instantiations, rebuilds = c.instantiations, c.rebuilds
    for m in (2 * n, 4 * n, 3 * n):  # 2x, 2x again (beyond the headroom), then smaller: fits
        x = _rand(rng, m)
        engine.bind(s1, "In", x)  # a host array of another size: uploaded into a new engine buffer
        engine.update()
        engine.output(s2, "Out").fill_bytes(0xFF)  # poison: every element must be written by the next frame
        engine.update()
        out = engine.read(s2, "Out")
        assert out.shape == (m,)
        np.testing.assert_allclose(out, x.astype(np.float64) * 2 * -0.5 + 1.0, rtol=1e-6, atol=1e-6)
    assert engine.graph is graph and graph.instantiations == 1
    assert (c.instantiations, c.rebuilds) == (instantiations, rebuilds)
    assert c.growths == 4 and c.warm_resizes == 3  # two buffers grew twice; 3n fits the 4n allocation
