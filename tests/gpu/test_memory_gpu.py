"""Buffer reuse and the memory check on a real GPU (chains unfused, ``fuse=False``: fused, a chain is one
kernel with no intermediate buffers to share): shared buffers give the results separate buffers
give, on random inputs through chains and diamonds; reading an overwritten output is refused once and
then kept; a Warm resize keeps shared buffers; a patch larger than the device is refused before
anything is allocated and the running graph keeps running."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import Block, BlockBuilder, DiagnosticCode, Engine, Scale, VectorAdd
from cudapatch.blocks import fixed
from cudapatch.errors import CudapatchError
from cudapatch.kernels import bundled_kernel

pytestmark = pytest.mark.gpu


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _chain(e: Engine, x: np.ndarray, factors: list[float]) -> list[Block]:
    blocks: list[Block] = []
    for i, f in enumerate(factors):
        s = e.add(Scale(name=f"s{i}", Factor=f, Offset=0.5 * i))
        if blocks:
            e.connect(blocks[-1], "Out", s, "In")
        else:
            e.bind(s, "In", x)
        blocks.append(s)
    return blocks


def _chain_ref(x: np.ndarray, factors: list[float]) -> np.ndarray:
    y = x.astype(np.float32)
    for i, f in enumerate(factors):
        y = (y * np.float32(f) + np.float32(0.5 * i)).astype(np.float32)
    return y


def _diamonds(e: Engine, x: np.ndarray, depth: int) -> Block:
    """``depth`` diamonds in a row: each splits into two Scales and joins them with a VectorAdd."""
    src = e.add(Scale(name="src", Factor=1.0))
    e.bind(src, "In", x)
    top: Block = src
    for d in range(depth):
        left = e.add(Scale(name=f"l{d}", Factor=0.5 + d))
        right = e.add(Scale(name=f"r{d}", Factor=-1.0 - d, Offset=0.25))
        join = e.add(VectorAdd(name=f"j{d}"))
        e.connect(top, "Out" if d == 0 else "Sum", left, "In")
        e.connect(top, "Out" if d == 0 else "Sum", right, "In")
        e.connect(left, "Out", join, "A")
        e.connect(right, "Out", join, "B")
        top = join
    return top


def _diamonds_ref(x: np.ndarray, depth: int) -> np.ndarray:
    y = x.astype(np.float32)
    for d in range(depth):
        left = (y * np.float32(0.5 + d)).astype(np.float32)
        right = (y * np.float32(-1.0 - d) + np.float32(0.25)).astype(np.float32)
        y = (left + right).astype(np.float32)
    return y


@pytest.mark.parametrize("n", [1000, 100_003])
def test_reuse_gives_the_results_of_separate_buffers_on_chains(rng: np.random.Generator, n: int) -> None:
    factors = [float(f) for f in rng.uniform(-1.5, 1.5, 12)]
    x = _rand(rng, n)
    results = {}
    for reuse in (True, False):
        with Engine(wait_for_compile=True, reuse_buffers=reuse, fuse=False) as e:  # fused, a chain shares nothing
            blocks = _chain(e, x, factors)
            e.update()
            mem = e.graph.plan.memory
            assert bool(mem.buffer_values()) is reuse  # the chain shares only with reuse
            if reuse:
                assert len(e.graph.plan.buffers) == 3  # two ping-pong buffers and the result
            for _ in range(3):  # several frames: each rewrites the shared buffers
                e.update()
            results[reuse] = e.read(blocks[-1], "Out")
    np.testing.assert_array_equal(results[True], results[False])
    np.testing.assert_allclose(results[True], _chain_ref(x, factors), rtol=1e-5, atol=1e-5)


def test_reuse_gives_the_results_of_separate_buffers_on_diamonds(rng: np.random.Generator) -> None:
    x = _rand(rng, 50_000)
    results = {}
    for reuse in (True, False):
        with Engine(wait_for_compile=True, reuse_buffers=reuse, fuse=False) as e:  # fused, a chain shares nothing
            out = _diamonds(e, x, depth=5)
            for _ in range(3):
                e.update()
            if reuse:
                assert e.graph.plan.memory.buffer_values()
            results[reuse] = e.read(out, "Sum")
    np.testing.assert_array_equal(results[True], results[False])
    np.testing.assert_allclose(results[True], _diamonds_ref(x, 5), rtol=1e-4, atol=1e-4)


def test_an_overwritten_output_is_refused_once_then_kept(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine  # buffer reuse along a chain of blocks (fused, the chain would be one kernel)
    x = _rand(rng, 4096)
    factors = [2.0, 3.0, 0.5, -1.0, 4.0]
    blocks = _chain(engine, x, factors)
    engine.update()
    assert engine.graph.overwritten(blocks[0].id, "Out")
    with pytest.raises(CudapatchError, match="shares its buffer"):
        engine.read(blocks[0], "Out")
    engine.update()  # the read kept it: a Cold rebuild gives it its own buffer
    np.testing.assert_allclose(engine.read(blocks[0], "Out"), _chain_ref(x, factors[:1]), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(engine.read(blocks[-1], "Out"), _chain_ref(x, factors), rtol=1e-5, atol=1e-5)


def test_a_port_kept_before_the_first_update_reads_at_once(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine  # buffer reuse along a chain of blocks (fused, the chain would be one kernel)
    x = _rand(rng, 4096)
    factors = [2.0, 3.0, 0.5, -1.0, 4.0]
    blocks = _chain(engine, x, factors)
    engine.keep(blocks[1], "Out")
    engine.update()
    np.testing.assert_allclose(engine.read(blocks[1], "Out"), _chain_ref(x, factors[:2]), rtol=1e-5, atol=1e-6)
    # the last value of a shared buffer still holds its data: read through a typed view
    mem = engine.graph.plan.memory
    last = next(b for b in blocks[:-1] if not engine.graph.overwritten(b.id, "Out") and b is not blocks[1])
    vi = mem.ports[(last.id, "Out")]
    if mem.shared(mem.value_buffer[vi]):
        view = engine.graph.output(last.id, "Out")
        assert view.count == 4096 and view.dtype.c_name == "float"
        k = blocks.index(last) + 1
        np.testing.assert_allclose(view.download(), _chain_ref(x, factors[:k]), rtol=1e-5, atol=1e-5)


def test_a_smaller_input_resizes_shared_buffers_warm(unfused_engine: Engine, rng: np.random.Generator) -> None:
    engine = unfused_engine  # buffer reuse along a chain of blocks (fused, the chain would be one kernel)
    factors = [1.5, -2.0, 0.25, 3.0, 1.0, -0.5]
    x = _rand(rng, 20_000)
    blocks = _chain(engine, x, factors)
    engine.update()
    assert engine.graph.plan.memory.buffer_values()
    graph, rebuilds = engine.graph, engine.counters.rebuilds
    x2 = _rand(rng, 15_000)
    engine.bind(blocks[0], "In", x2)  # another size: planned again, and the running graph takes it in place
    engine.update()
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds and engine.counters.warm_resizes >= 1
    np.testing.assert_allclose(engine.read(blocks[-1], "Out"), _chain_ref(x2, factors), rtol=1e-5, atol=1e-5)
    x3 = _rand(rng, 40_000)  # outgrows the shared buffers: they grow in place (Warm: larger allocations)
    engine.bind(blocks[0], "In", x3)
    engine.update()
    assert engine.graph is graph and engine.counters.rebuilds == rebuilds and engine.counters.growths >= 2
    np.testing.assert_allclose(engine.read(blocks[-1], "Out"), _chain_ref(x3, factors), rtol=1e-5, atol=1e-5)


class Huge(Block):
    """A fill of 50 Gi floats (200 GiB): more than any GPU here has."""

    type_name = "Huge"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("fill"))
        b.scalar("Value", k.in_(1), default=1.0)
        b.output("Out", k.out(0), size=fixed(50 * 2**30))
        k.auto_grid(fixed(1), count_param=2)


def test_a_patch_larger_than_the_device_is_refused_and_the_old_graph_runs(
    engine: Engine, rng: np.random.Generator
) -> None:
    x = _rand(rng, 4096)
    s = engine.add(Scale(name="s", Factor=2.0))
    engine.bind(s, "In", x)
    engine.update()
    graph = engine.graph
    allocations, in_use = engine.pool.driver_allocations, engine.pool.in_use_bytes
    huge = engine.add(Huge(name="huge"))
    engine.update()
    errors = [d for d in engine.diagnostics(huge) if d.code == DiagnosticCode.OUT_OF_MEMORY]
    assert errors and "'huge.Out' 200.0 GB" in errors[0].message and "nothing was allocated" in errors[0].message
    assert engine.graph is graph  # the running graph keeps running
    assert engine.pool.driver_allocations == allocations and engine.pool.in_use_bytes == in_use
    s.set("Factor", 3.0)  # Hot edits still reach it
    engine.update()
    np.testing.assert_allclose(engine.read(s, "Out"), 3.0 * x.astype(np.float64), rtol=1e-5)
    engine.remove(huge)  # and the patch builds again without it
    engine.update()
    assert not [d for d in engine.diagnostics() if d.code == DiagnosticCode.OUT_OF_MEMORY]
    np.testing.assert_allclose(engine.read(s, "Out"), 3.0 * x.astype(np.float64), rtol=1e-5)
