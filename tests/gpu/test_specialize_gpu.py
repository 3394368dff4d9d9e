"""Fused kernels specialised on their resting scalars (``engine/specialize.py``) on a real GPU: the
specialised kernel gives the generic one's results bit for bit (math functions included), a Hot edit
puts the generic kernel back in the same frame (the new value is what the next frame computes with),
the group is specialised again once the values rest, and the graph a structure edit elsewhere builds
runs it specialised from its first frame."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cudapatch import Engine, Expression, Scale
from cudapatch.engine.compiler.fusion import FUSED_KERNEL

from .conftest import run_until

pytestmark = pytest.mark.gpu


def _chain(e: Engine, x: np.ndarray, *, fuse: bool) -> tuple[list, object]:
    blocks = [e.add(Scale(Factor=1.0 + i / 7, Offset=0.25 - i / 11, fuse=fuse)) for i in range(6)]
    code = "sin(a * Freq) * Gain + exp(-a * a) + pow(abs(a), Power)"
    ex = e.add(Expression(Code=code, Freq=2.5, Gain=0.75, Power=1.5, fuse=fuse))
    tail = e.add(Scale(Factor=-0.5, Offset=0.125, fuse=fuse))
    e.bind(blocks[0], "In", x)
    for a, b in zip(blocks, blocks[1:], strict=False):
        e.connect(a, "Out", b, "In")
    e.connect(blocks[-1], "Out", ex, "a")
    e.connect(ex, "Out", tail, "In")
    return [*blocks, ex, tail], tail


def _until_specialized(e: Engine, count: int, limit_s: float = 10.0) -> None:
    end = time.perf_counter() + limit_s
    while e.counters.specializations < count:
        assert time.perf_counter() < end, f"not specialised in {limit_s} s ({e.counters.specializations} of {count})"
        e.update()
        time.sleep(0.01)


def test_a_resting_group_runs_specialised_bitwise_and_a_hot_edit_takes_effect_at_once(
    rng: np.random.Generator,
) -> None:
    x = rng.standard_normal(100_000).astype(np.float32)
    with Engine(wait_for_compile=True) as e:
        fused, sink = _chain(e, x, fuse=True)
        plain, plain_sink = _chain(e, x, fuse=False)
        e.update()
        rebuilds = e.counters.rebuilds
        key = (sink.id, FUSED_KERNEL)
        assert e.graph.plan.block_nodes[fused[0].id] == e.graph.plan.block_nodes[sink.id]
        generic = e.read(sink, "Out")
        np.testing.assert_array_equal(generic, e.read(plain_sink, "Out"))
        assert not e.graph.specialized(key)
        _until_specialized(e, 1)
        assert e.graph.specialized(key)
        e.update()
        np.testing.assert_array_equal(e.read(sink, "Out"), generic)  # the constants compute what the arguments did
        for i, (factor, freq) in enumerate([(3.25, 1.5), (-0.75, 4.0)]):
            for blocks in (fused, plain):
                blocks[2].set("Factor", factor)
                blocks[6].set("Freq", freq)
            e.update()  # the same frame: generic kernel, new values
            assert not e.graph.specialized(key)
            moved = e.read(sink, "Out")
            np.testing.assert_array_equal(moved, e.read(plain_sink, "Out"))
            assert not np.array_equal(moved, generic)
            _until_specialized(e, 2 + i)  # resting again: specialised on the new values
            e.update()
            np.testing.assert_array_equal(e.read(sink, "Out"), moved)
        assert e.graph.generalized == 2 and e.counters.rebuilds == rebuilds


@pytest.mark.parametrize("live", [False, True], ids=["built on the frame thread", "built on the build thread"])
def test_a_structure_edit_elsewhere_keeps_the_group_specialised_in_the_new_graph(
    rng: np.random.Generator, live: bool
) -> None:
    x = rng.standard_normal(100_000).astype(np.float32)
    with Engine(wait_for_compile=not live) as e:
        fused, sink = _chain(e, x, fuse=True)
        plain, plain_sink = _chain(e, x, fuse=False)
        e.wait_ready()
        e.update()
        key = (sink.id, FUSED_KERNEL)
        _until_specialized(e, 1)
        g = e.graph
        assert g.specialized(key)
        function, swaps = int(g._by_kernel[key][0].params.func), e.counters.specializations
        extra = e.add(Scale(Factor=2.0, fuse=False))  # a structure edit in the other chain: a new graph
        e.connect(plain_sink, "Out", extra, "In")
        run_until(e, lambda: e.graph is not g and not e.building)
        new = e.graph
        assert new.specialized(key) and new.runs_function(key, function)  # kept, from its first frame
        e.output(sink, "Out").fill_bytes(0xFF)  # poison: the frame must write every element
        e.update()
        np.testing.assert_array_equal(e.read(sink, "Out"), e.read(plain_sink, "Out"))
        np.testing.assert_allclose(e.read(extra, "Out"), e.read(plain_sink, "Out").astype(np.float64) * 2, rtol=1e-6)
        end = time.perf_counter() + 0.8  # the specialiser's two looks and more: nothing to build for it
        while time.perf_counter() < end:
            e.update()
            time.sleep(0.01)
        assert e.counters.specializations == swaps and e.graph is new and new.runs_function(key, function)
        for blocks in (fused, plain):  # a Hot edit of the new graph: its generic kernel, the new value, at once
            blocks[2].set("Factor", 3.25)
        e.update()
        assert not new.specialized(key)
        np.testing.assert_array_equal(e.read(sink, "Out"), e.read(plain_sink, "Out"))


def test_an_engine_without_fusion_specialises_nothing(rng: np.random.Generator) -> None:
    x = rng.standard_normal(1000).astype(np.float32)
    with Engine(wait_for_compile=True, fuse=False) as e:
        _, sink = _chain(e, x, fuse=True)
        for _ in range(40):
            e.update()
            time.sleep(0.02)
        assert e.counters.specializations == 0 and all(n.kernel != FUSED_KERNEL for n in e.graph.plan.kernel_nodes)


def test_a_member_code_edit_runs_at_once_and_its_new_code_is_specialised_in_turn(rng: np.random.Generator) -> None:
    """A member's Code edit swaps the group's regenerated kernel in (a specialisation of the old code,
    in flight or made later, never comes back: ``CompiledGraph.kernel_source``), and the new code is
    specialised once its values rest; results bit for bit those of the unfused twin throughout."""
    x = rng.standard_normal(50_000).astype(np.float32)
    with Engine(wait_for_compile=True) as e:

        def chain(fuse: bool) -> tuple:
            ex = e.add(Expression(Code="a * Gain + 1.0", Gain=2.0, fuse=fuse))
            s = e.add(Scale(Factor=0.5, Offset=0.25, fuse=fuse))
            e.bind(ex, "a", x)
            e.connect(ex, "Out", s, "In")
            return ex, s

        (ex, sink), (plain_ex, plain_sink) = chain(True), chain(False)
        e.update()
        key, graph = (sink.id, FUSED_KERNEL), e.graph
        assert key in {(n.block_id, n.kernel) for n in graph.plan.kernel_nodes}
        _until_specialized(e, 1)
        for code in ("a * Gain - 1.0", "a * Gain * Gain"):  # same names: the Code tier, no rebuild
            for block in (ex, plain_ex):
                block.set("Code", code)
            e.update()  # waits for the regenerated group kernel: the edit runs in this frame
            assert not e.graph.specialized(key)
            np.testing.assert_array_equal(e.read(sink, "Out"), e.read(plain_sink, "Out"))
            done = e.counters.specializations
            _until_specialized(e, done + 1)  # the new code, specialised (its optimised build may follow)
            for _ in range(3):
                e.update()
                time.sleep(0.05)
            np.testing.assert_array_equal(e.read(sink, "Out"), e.read(plain_sink, "Out"))
        assert e.graph is graph
