"""Fusion in patches with regions on a real GPU: For and While patches with fused chains inside and
outside their bodies give the unfused results bit for bit, frame after frame (the same blocks with the
per-block opt-out run beside them in the same graph); Hot and Code edits of a fused member inside an
unrolled body, and a Warm rebind of a group's input, reach every copy without a rebuild; a bypassed
top-level member leaves its group as in a patch without regions. (Which blocks fuse is unit-tested:
tests/unit/test_fusion_regions.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import CustomKernel, Engine, Expression, For, FrameDelay, Scale, VectorAdd, While
from cudapatch.engine.compiler.fusion import FUSED_KERNEL

from .conftest import ABOVE

pytestmark = pytest.mark.gpu  # the conftest's ``engine`` fuses: fusion is the default


def _fused_nodes(e: Engine, sink) -> list:
    plan = e.graph.plan
    return [plan.nodes[i] for i in plan.block_nodes[sink.id] if plan.nodes[i].kernel == FUSED_KERNEL]


def _for_patch(e: Engine, x: np.ndarray, x0: np.ndarray, *, fuse: bool, unroll: int) -> dict:
    """s1 -> ex (top level) -> For { delay -> e1 (+ ex) -> e2 -> delay.In } -> s3 -> add (+ x)."""
    s1 = e.add(Scale(Factor=1.7, Offset=-0.3, fuse=fuse))
    ex = e.add(Expression(Code="sin(a * Freq) * 0.5 + a", Freq=2.5, fuse=fuse))
    loop = e.add(For(Count=5, Unroll=unroll))
    d = e.add(FrameDelay(), region=loop)
    e1 = e.add(Expression(Code="a * Gain + b * 0.125", Gain=0.5, fuse=fuse), region=loop)
    e2 = e.add(Scale(Factor=0.75, Offset=0.25, fuse=fuse), region=loop)
    s3 = e.add(Scale(Factor=2.0, Offset=1.0, fuse=fuse))
    add = e.add(VectorAdd(fuse=fuse))
    e.bind(s1, "In", x)
    e.bind(d, "Init", x0)
    e.bind(add, "B", x)
    e.connect(s1, "Out", ex, "a")
    e.connect(d, "Out", e1, "a")
    e.connect(ex, "Out", e1, "b")  # a value of the top level, read in the body: stored
    e.connect(e1, "Out", e2, "In")
    e.connect(e2, "Out", d, "In")
    e.connect(e2, "Out", s3, "In")  # after the loop
    e.connect(s3, "Out", add, "A")
    return {"loop": loop, "d": d, "e2": e2, "ex": ex, "add": add}


@pytest.mark.parametrize("unroll", [1, 4])
def test_a_for_patch_fused_inside_and_outside_its_body_equals_unfused_bitwise(
    engine: Engine, rng: np.random.Generator, unroll: int
) -> None:
    e = engine
    n = 100_000
    x, x0 = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    fused = _for_patch(e, x, x0, fuse=True, unroll=unroll)
    plain = _for_patch(e, x, x0, fuse=False, unroll=unroll)
    e.update()
    plan = e.graph.plan
    body = _fused_nodes(e, fused["e2"])
    assert body and all(nd.index in plan.scopes for nd in body)  # the body's group: in the body, every copy
    assert len(_fused_nodes(e, fused["ex"])) == len(_fused_nodes(e, fused["add"])) == 1  # the top level's two
    assert not _fused_nodes(e, plain["e2"]) and not _fused_nodes(e, plain["add"])
    graph = e.graph
    for frame, count in enumerate((5, 5, 8, 3, 0, 7)):  # the state goes on; Count is Hot
        fused["loop"].set("Count", count)
        plain["loop"].set("Count", count)
        if frame:
            e.update()
        for name, port in (("d", "Out"), ("e2", "Out"), ("add", "Sum")):
            got, want = e.read(fused[name], port), e.read(plain[name], port)
            assert np.isfinite(want).all()
            np.testing.assert_array_equal(got, want, err_msg=f"{name} frame {frame} Count {count}")
    assert e.graph is graph


def _while_patch(e: Engine, *, fuse: bool, unroll: int, n: int) -> dict:
    """While(Max) { delay -> g -> delay.In; g -> c1 -> c2 -> check -> Condition } -> after -> after2."""
    loop = e.add(While(Max=40, Unroll=unroll))
    d = e.add(FrameDelay(Count=n, Fill=1.0), region=loop)
    g = e.add(Scale(Factor=1.5, Offset=0.25, fuse=fuse), region=loop)
    c1 = e.add(Expression(Code="a * 0.5 - Gain", Gain=1.0, fuse=fuse), region=loop)
    c2 = e.add(Scale(Factor=-1.0, fuse=fuse), region=loop)
    chk = e.add(CustomKernel(Code=ABOVE, level=-1000.0), region=loop)  # goes on while g * 0.5 - 1 < 1000
    after = e.add(Scale(Factor=0.5, fuse=fuse))
    after2 = e.add(Expression(Code="sqrt(a) + 1", fuse=fuse))
    e.connect(d, "Out", g, "In")
    e.connect(g, "Out", d, "In")
    e.connect(g, "Out", c1, "a")
    e.connect(c1, "Out", c2, "In")
    e.connect(c2, "Out", chk, "in")
    e.connect(chk, "more", loop, "Condition")
    e.connect(g, "Out", after, "In")
    e.connect(after, "Out", after2, "a")
    return {"loop": loop, "d": d, "g": g, "c2": c2, "after2": after2}


@pytest.mark.parametrize("unroll", [1, 4])
def test_a_while_patch_fused_inside_and_outside_its_body_equals_unfused_bitwise(engine: Engine, unroll: int) -> None:
    """The condition's chain fuses inside the body (unrolled: made in the last copy of each pass only, as
    unfused); the iterations and every stored value match the unfused twin."""
    e = engine
    n = 4096
    fused = _while_patch(e, fuse=True, unroll=unroll, n=n)
    plain = _while_patch(e, fuse=False, unroll=unroll, n=n)
    e.update()
    plan = e.graph.plan
    assert _fused_nodes(e, fused["c2"]) and all(nd.index in plan.scopes for nd in _fused_nodes(e, fused["c2"]))
    assert len(_fused_nodes(e, fused["after2"])) == 1
    for frame in range(4):
        if frame:
            e.update()
        for name, port in (("d", "Out"), ("g", "Out"), ("c2", "Out"), ("after2", "Out")):
            got, want = e.read(fused[name], port), e.read(plain[name], port)
            assert np.isfinite(want).all()
            np.testing.assert_array_equal(got, want, err_msg=f"{name} frame {frame}")
        assert e.iterations(fused["loop"]) == e.iterations(plain["loop"]) > 0


def test_hot_and_code_edits_of_a_fused_member_in_an_unrolled_body_need_no_rebuild(
    engine: Engine, rng: np.random.Generator
) -> None:
    """For(Count 6, Unroll 4) { delay -> ex (a * Gain + 0.25) -> s (x 2) -> delay.In }: one fused node in
    each of the 4 + 2 + 1 copies; Hot edits of both members and a Code edit of ex patch them all. Every
    step is exact or one rounding in float32, so NumPy gives the GPU's bits."""
    e = engine
    x0 = (rng.standard_normal(10_000) * 100).astype(np.float32)
    loop = e.add(For(name="Loop", Count=6, Unroll=4))
    d = e.add(FrameDelay(name="d"), region=loop)
    ex = e.add(Expression(name="ex", Code="a * Gain + 0.25", Gain=0.5), region=loop)
    s = e.add(Scale(name="s", Factor=2.0, Offset=0.0), region=loop)
    e.bind(d, "Init", x0)
    e.connect(d, "Out", ex, "a")
    e.connect(ex, "Out", s, "In")
    e.connect(s, "Out", d, "In")
    e.update()
    nodes = _fused_nodes(e, s)
    assert len(nodes) == 4 + 2 + 1 and e.graph.plan.block_nodes[ex.id] == e.graph.plan.block_nodes[s.id]
    assert ex.debug.fused == s.debug.fused == "ex -> s"

    def steps(x: np.ndarray, gain: float, offset: float, sign: float) -> np.ndarray:
        for _ in range(6):
            x = (x * np.float32(gain) + np.float32(sign * 0.25)) * np.float32(2.0) + np.float32(offset)
        return x

    state = steps(x0, 0.5, 0.0, 1.0)
    np.testing.assert_array_equal(e.read(d, "Out"), state)
    graph, rebuilds, hot = e.graph, e.counters.rebuilds, e.counters.hot_updates
    ex.set("Gain", 0.25)  # Hot: its slot in all seven fused nodes
    s.set("Offset", 1.0)
    e.update()
    state = steps(state, 0.25, 1.0, 1.0)
    np.testing.assert_array_equal(e.read(d, "Out"), state)
    assert e.counters.hot_updates >= hot + 2
    swaps = e.counters.code_swaps
    ex.set("Code", "a * Gain - 0.25")  # the same names: the group's kernel regenerated, swapped into every copy
    e.update()  # the waiting engine runs the edit in this frame
    state = steps(state, 0.25, 1.0, -1.0)
    np.testing.assert_array_equal(e.read(d, "Out"), state)
    assert e.counters.code_swaps == swaps + 1
    assert e.graph is graph and e.counters.rebuilds == rebuilds


def test_a_warm_rebind_of_a_fused_groups_input_reaches_every_copy_of_a_body(
    engine: Engine, rng: np.random.Generator
) -> None:
    from cudapatch import GpuBuffer

    e = engine
    loop = e.add(For(name="Loop", Count=3, Unroll=2))  # two copies in the main body, one in the tail
    a = e.add(Scale(name="a", Factor=2.0), region=loop)
    b = e.add(Scale(name="b", Offset=1.0), region=loop)
    x, y = rng.standard_normal(512).astype(np.float32), rng.standard_normal(512).astype(np.float32)
    e.bind(a, "In", x)
    e.connect(a, "Out", b, "In")
    e.update()
    assert len(_fused_nodes(e, b)) == 3
    np.testing.assert_array_equal(e.read(b, "Out"), x * np.float32(2) + np.float32(1))
    graph, rebuilds = e.graph, e.counters.rebuilds
    other = GpuBuffer(e.pool, a.description.input("In").dtype, 512, stream=e.stream)
    try:
        other.upload(y)
        e.bind(a, "In", other)  # Warm: another pointer of the same size, patched into all three fused nodes
        e.update()
        np.testing.assert_array_equal(e.read(b, "Out"), y * np.float32(2) + np.float32(1))
        assert e.graph is graph and e.counters.rebuilds == rebuilds
    finally:
        e.remove(b)
        e.remove(a)
        e.update()
        e.synchronize()
        other.close()


def test_bypassing_a_top_level_fused_member_beside_a_region(engine: Engine, rng: np.random.Generator) -> None:
    e = engine
    x = rng.standard_normal(4096).astype(np.float32)
    s1, s2, s3 = (e.add(Scale(name=f"s{i}", Factor=float(i + 2))) for i in range(3))
    loop = e.add(For(name="Loop", Count=2))
    p = e.add(Scale(name="p", Factor=0.5), region=loop)
    q = e.add(Scale(name="q", Offset=1.0), region=loop)
    e.bind(s1, "In", x)
    e.connect(s1, "Out", s2, "In")
    e.connect(s2, "Out", s3, "In")
    e.connect(s3, "Out", p, "In")
    e.connect(p, "Out", q, "In")
    e.update()
    assert s1.debug.fused == "s0 -> s1 -> s2" and p.debug.fused == "p -> q"
    want = (((x * np.float32(2)) * np.float32(3)) * np.float32(4)) * np.float32(0.5) + np.float32(1)
    np.testing.assert_array_equal(e.read(q, "Out"), want)
    s2.enabled = False  # rebuilt with s2 on its own node, turned off: s3 reads s1's output
    e.update()
    np.testing.assert_array_equal(e.read(q, "Out"), ((x * np.float32(2)) * np.float32(4)) * np.float32(0.5) + 1)
    assert not s2.debug.fused and s1.debug.fused == "" and p.debug.fused == "p -> q"
    s2.enabled = True
    e.update()
    np.testing.assert_array_equal(e.read(q, "Out"), want)
