"""Liveness and buffer reuse (no GPU): the assignment over abstract DAGs, and the memory phase on real
patches, property-tested over many seeded random DAGs.

The properties: no two values whose lifetimes overlap under the graph's partial order share a buffer
(checked against the finished plan's node dependencies, not against the algorithm's own bookkeeping);
reuse adds no ordering between nodes that the plan without reuse does not already have (independent
branches stay independent); pinned values keep a buffer of their own; every buffer holds its values.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from cudapatch import (
    AppendFilter,
    Block,
    BlockBuilder,
    DType,
    Fill,
    Scale,
    VectorAdd,
    from_param,
    like,
)
from cudapatch.blocks.library import Emitter, Forces, ToPoints
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.compiler.liveness import Lifetime, ancestors, assign_buffers, conflicts
from cudapatch.engine.compiler.memory import SHARED_BLOCK
from cudapatch.engine.memory_plan import PinReason
from cudapatch.engine.plan import GraphPlan
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.engine.warm import Refusal, WarmPatch, WarmRefusal, decide_warm_patch
from cudapatch.kernels.source import bundled_kernel
from tests.unit.test_compiler import OptionalAdd, TwoStage
from tests.unit.test_warm import Axpy

from .unfused import compile_plan  # one node per block: these tests are about unfused plans


# -- the assignment over abstract DAGs -------------------------------------------------------------
def _random_problem(rng: random.Random, n: int) -> tuple[list[Lifetime], list[int]]:
    """Nodes 0..n-1 in topological order, each writing 1-2 values that 0-3 later nodes read; some pinned."""
    values: list[Lifetime] = []
    reads: list[list[int]] = [[] for _ in range(n)]
    made: list[tuple[int, int]] = []  # (value, writer)
    for w in range(n):
        for _ in range(rng.choice((1, 1, 2))):
            made.append((len(made), w))
    readers: dict[int, list[int]] = {}
    for vi, w in made:
        later = list(range(w + 1, n))
        for r in rng.sample(later, min(len(later), rng.choice((0, 1, 1, 2, 3)))):
            readers.setdefault(vi, []).append(r)
            reads[r].append(w)
    for vi, w in made:
        rs = tuple(sorted(readers.get(vi, ())))
        values.append(Lifetime((w, *rs), rng.choice((4, 256, 1000, 4096)), rng.random() < 0.1))
    return values, ancestors([sorted(set(p)) for p in reads])


@pytest.mark.parametrize("seed", range(300))
def test_no_two_values_with_overlapping_lifetimes_share_on_random_dags(seed: int) -> None:
    rng = random.Random(seed)
    values, anc = _random_problem(rng, rng.randint(2, 40))
    value_buffer, sizes = assign_buffers(values, anc)
    assert conflicts(values, value_buffer, anc) == []
    for vi, v in enumerate(values):
        assert sizes[value_buffer[vi]] >= v.nbytes
        if v.pinned:
            assert value_buffer.count(value_buffer[vi]) == 1
    assert sorted(set(value_buffer)) == list(range(len(sizes)))  # numbered densely


def test_the_checker_finds_a_planted_overlap() -> None:
    # 0 -> 1 -> 2 and 0 -> 3: the value of 1 (read by 2) and the value of 3 run side by side.
    anc = ancestors([[], [0], [1], [0]])
    values = [Lifetime((0, 1, 3), 4), Lifetime((1, 2), 4), Lifetime((2,), 4), Lifetime((3,), 4)]
    assert conflicts(values, [0, 1, 2, 1], anc) == [(1, 3)]
    assert conflicts(values, [0, 1, 2, 3], anc) == []


def test_a_chain_ping_pongs_between_two_buffers() -> None:
    n = 20
    anc = ancestors([[i - 1] if i else [] for i in range(n)])
    values = [Lifetime((i, i + 1) if i + 1 < n else (i,), 133_000_000, i == n - 1) for i in range(n)]
    value_buffer, sizes = assign_buffers(values, anc)
    assert value_buffer == [i % 2 for i in range(n - 1)] + [2]
    assert len(sizes) == 3


def test_parallel_branches_never_share() -> None:
    # a -> b, a -> c, b -> d, c -> d: b's and c's values may be written at the same time
    anc = ancestors([[], [0], [0], [1, 2]])
    values = [Lifetime((0, 1, 2), 64), Lifetime((1, 3), 64), Lifetime((2, 3), 64), Lifetime((3,), 64, True)]
    value_buffer, _ = assign_buffers(values, anc)
    assert len(set(value_buffer)) == 4


def test_best_fit_takes_the_smallest_buffer_that_holds_the_value() -> None:
    # two big and one small value released at once, then a small one: it takes the small buffer
    anc = ancestors([[], [], [], [0, 1, 2], [3]])
    values = [
        Lifetime((0, 3), 1000),
        Lifetime((1, 3), 10),
        Lifetime((2, 3), 1000),
        Lifetime((3, 4), 1),
        Lifetime((4,), 8),
    ]
    value_buffer, sizes = assign_buffers(values, anc)
    assert value_buffer[4] == value_buffer[1] and sizes[value_buffer[1]] == 10


# -- the memory phase on real patches ----------------------------------------------------------------
class InPlace(Block):
    """Reads and rewrites its input in place without a ``through`` port (an inout pin)."""

    type_name = "InPlace"

    def describe(self, b: BlockBuilder) -> None:
        from cudapatch.blocks.library.particles import _kernel

        k = b.add_kernel(_kernel("particles_forces"))
        b.input("Particles", k.in_(0))
        k.set_count(1, like("Particles", divide=4))
        for i, name in enumerate(("Gravity", "Curl", "CurlScale", "Attractor", "Attraction", "Drag", "Dt"), start=2):
            b.scalar(name, k.in_(i), default=(0.0, 0.0, 0.0) if name in ("Gravity", "Attractor") else 0.5)
        k.auto_grid(like("Particles", divide=4))


class KeptScale(Block):
    """A Scale whose output is pinned by the block (``keep=True``), as a frame delay's state is."""

    type_name = "KeptScale"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("scale"))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"), keep=True)
        b.scalar("Factor", k.in_(2), default=1.0)
        b.scalar("Offset", k.in_(3), default=0.0)
        k.auto_grid(like("In"), count_param=4)


def _random_patch(seed: int, n: int = 30) -> Context:
    rng = random.Random(seed)
    c = Context()
    outs: list[tuple[Block, str]] = []
    for i in range(n):
        kind = rng.choice(["fill", "scale", "scale", "scale", "add", "add", "append", "opt", "two", "kept", "axpy"])
        name = f"n{i}"
        blk: Block
        if kind == "fill":
            blk = Fill(name=name, Count=rng.choice([100, 256, 1000]))
        elif kind == "append":
            blk = AppendFilter(name=name, Capacity=rng.choice([8, 100]))
        else:
            cls = {
                "scale": Scale,
                "add": VectorAdd,
                "opt": OptionalAdd,
                "two": TwoStage,
                "kept": KeptScale,
                "axpy": Axpy,
            }[kind]
            blk = cls(name=name)
        c.register_block(blk)
        for port in blk.description.inputs:
            if outs and rng.random() < 0.9:
                src, sp = rng.choice(outs[-8:] if rng.random() < 0.7 else outs)
                c.connect(src, sp, blk, port.name)
            else:
                c.bind_input(blk, port.name, ExternalBinding(0x7000_0000, 256, DType.FLOAT32))
        outs.extend((blk, p.name) for p in blk.description.outputs if p.kind != "through")
        if rng.random() < 0.05:
            c.keep(blk, blk.description.outputs[0].name)
    if rng.random() < 0.3:  # particles: a through chain and an inout state
        e, f, t = Emitter(name="pe"), Forces(name="pf"), ToPoints(name="pt")
        for b in (e, f, t):
            c.register_block(b)
        e.set("Capacity", 100)
        c.connect(e, "Particles", f, "Particles")
        c.connect(f, "Particles", t, "Particles")
    return c


def _closure(plan: GraphPlan) -> list[int]:
    """Ancestor bitset of every node, from the plan's dependencies."""
    return ancestors([list(n.deps) for n in plan.nodes])


def _value_nodes(plain: GraphPlan) -> dict[int, set[int]]:
    """Value index -> the nodes reading or writing it, from a plan without reuse (buffer = value)."""
    out: dict[int, set[int]] = {}
    for n in plain.nodes:
        for a in getattr(n, "args", ()):
            if a.kind == "buffer":
                out.setdefault(a.ref, set()).add(n.index)
        if getattr(n, "buffer", None) is not None:
            out.setdefault(n.buffer, set()).add(n.index)
    return out


@pytest.mark.parametrize("seed", range(120))
def test_random_patches_share_only_ordered_values_and_add_no_ordering(seed: int) -> None:
    snap = _random_patch(seed).snapshot()
    level = random.Random(seed).choice(list(ProfilingLevel))
    plain = compile_plan(snap, level=level, reuse=False)
    plan = compile_plan(snap, level=level)
    mem = plan.memory
    assert mem is not None and plain.memory is not None and not plain.memory.buffer_values()
    assert len(plan.nodes) == len(plain.nodes)
    # 1. values sharing a buffer: every node touching one reaches every node touching the other
    anc = _closure(plan)
    touch = _value_nodes(plain)
    for members in mem.buffer_values().values():
        for i, u in enumerate(members):
            for v in members[i + 1 :]:
                nu, nv = touch.get(u, set()), touch.get(v, set())
                assert all(anc[b] >> a & 1 for a in nu for b in nv), f"values {u} and {v} overlap (seed {seed})"
    # 2. no new ordering: the dependency closure is the one the plan without reuse has
    assert anc == _closure(plain), f"reuse serialised independent nodes (seed {seed})"
    # 3. the plans agree apart from buffer numbers
    for n, p in zip(plan.nodes, plain.nodes, strict=True):
        for a, b in zip(getattr(n, "args", ()), getattr(p, "args", ()), strict=True):
            if a.kind == "buffer":
                assert b.kind == "buffer" and mem.value_buffer[b.ref] == a.ref
            else:
                assert a == b
    # 4. pinned values alone; buffers large enough; outputs and appends point at their values' buffers
    for vi, _why in mem.pinned:
        assert not mem.shared(mem.value_buffer[vi])
    for vi, v in enumerate(mem.values):
        buf = plan.buffers[mem.value_buffer[vi]]
        assert buf.count * buf.dtype.itemsize >= v.count * v.dtype.itemsize
    for port, bi in plan.outputs.items():
        assert mem.value_buffer[mem.ports[port]] == bi
    for (bid, port), (bi, _) in plan.appends.items():
        assert plan.buffers[bi].label == port and plan.buffers[bi].block_id == bid


def _chain(n: int, count: int = 1000, *, keep: tuple[int, ...] = ()) -> tuple[Context, list[Block]]:
    c = Context()
    blocks: list[Block] = [c.register_block(Fill(name="head", Count=count))]
    for i in range(n):
        s = c.register_block(Scale(name=f"s{i}"))
        c.connect(blocks[-1], "Out", s, "In")
        if i in keep:
            c.keep(s, "Out")
        blocks.append(s)
    return c, blocks


def test_a_chain_of_twenty_holds_three_buffers_worth() -> None:
    c, blocks = _chain(19, count=3840 * 2160 * 4)
    plan = compile_plan(c.snapshot())
    mem = plan.memory
    assert mem is not None and len(plan.buffers) == 3
    assert plan.total_buffer_bytes == 3 * 3840 * 2160 * 4 * 4
    assert mem.logical_bytes == 20 * 3840 * 2160 * 4 * 4
    assert [b.label for b in plan.buffers] == ["shared0", "shared1", "Out"]
    assert plan.buffers[0].block_id == SHARED_BLOCK and plan.buffers[0].dtype is DType.UINT8
    assert dict(mem.pinned) == {19: PinReason.SINK}
    assert "s17.Out" in mem.describe({b.id: b.name for b in blocks})
    # the last value of each shared buffer is readable after the frame, the others are overwritten
    assert [mem.overwritten(v) for v in range(20)] == [True] * 17 + [False, False, False]
    # without reuse: one buffer per value, the plan of old
    plain = compile_plan(c.snapshot(), reuse=False)
    assert len(plain.buffers) == 20 and plain.buffers == plain.memory.values and not plain.memory.reuse


def test_kept_ports_keep_their_own_buffer() -> None:
    c, blocks = _chain(10, keep=(4,))
    mem = compile_plan(c.snapshot()).memory
    kept = mem.ports[(blocks[5].id, "Out")]
    assert (kept, PinReason.KEEP) in mem.pinned and not mem.shared(mem.value_buffer[kept])
    assert c.keep(blocks[5], "Out", False) and not c.keep(blocks[5], "Out", False)
    mem = compile_plan(c.snapshot()).memory
    assert mem.shared(mem.value_buffer[kept])


def test_pins_by_rule() -> None:
    c = Context()
    f, s, a, e, fo, pt, ip = (
        Fill(name="f", Count=1000),
        Scale(name="s"),
        AppendFilter(name="a", Capacity=10),
        Emitter(name="e"),
        Forces(name="fo"),
        ToPoints(name="pt"),
        InPlace(name="ip"),
    )
    ks, ax, s2, s3 = KeptScale(name="ks"), Axpy(name="ax"), Scale(name="s2"), Scale(name="s3")
    for b in (f, s, a, e, fo, pt, ip, ks, ax, s2, s3):
        c.register_block(b)
    e.set("Capacity", 100)
    c.connect(f, "Out", s, "In")
    c.connect(s, "Out", a, "In")
    c.connect(e, "Particles", fo, "Particles")
    c.connect(fo, "Particles", pt, "Particles")
    c.connect(pt, "Points", ip, "Particles")  # read and rewritten in place by an inout pin
    c.connect(f, "Out", ks, "In")
    c.connect(ks, "Out", ax, "X")
    c.connect(ax, "Y", s2, "In")
    c.connect(s2, "Out", s3, "In")
    plan = compile_plan(c.snapshot())
    mem = plan.memory
    why = {(mem.values[vi].block_id, mem.values[vi].label): r for vi, r in mem.pinned}
    assert why == {
        (a.id, "Kept"): PinReason.APPEND,
        (e.id, "Particles"): PinReason.IN_PLACE,  # inout pins, and a through port carries it on
        (pt.id, "Points"): PinReason.IN_PLACE,
        (ks.id, "Out"): PinReason.KEEP,
        (ax.id, "Y"): PinReason.LIBRARY,
        (s3.id, "Out"): PinReason.SINK,
    }
    assert mem.ports[(fo.id, "Particles")] == mem.ports[(e.id, "Particles")]


def test_a_faulted_block_reads_nothing_and_its_zeroed_outputs_share_safely() -> None:
    c, blocks = _chain(6)
    snap = c.snapshot()
    plain = compile_plan(snap, faulted={blocks[3].id: "boom"}, reuse=False)
    plan = compile_plan(snap, faulted={blocks[3].id: "boom"})
    anc = _closure(plan)
    assert anc == _closure(plain)
    touch = _value_nodes(plain)
    for members in plan.memory.buffer_values().values():
        for i, u in enumerate(members):
            for v in members[i + 1 :]:
                assert all(anc[b] >> a & 1 for a in touch[u] for b in touch[v])


# -- Warm resizes with shared buffers ------------------------------------------------------------------
def _capacities(plan: GraphPlan) -> list[int]:
    from cudapatch.engine.buffers import size_class

    return [size_class(b.count * b.dtype.itemsize) for b in plan.buffers]


def test_a_resize_that_keeps_the_sharing_is_warm() -> None:
    c, blocks = _chain(6, count=1000)
    old = compile_plan(c.snapshot())
    blocks[0].set("Count", 900)
    new = compile_plan(c.snapshot())
    assert old.memory.value_buffer == new.memory.value_buffer
    patch = decide_warm_patch(old, new, {}, capacities=_capacities(old))
    assert isinstance(patch, WarmPatch)
    assert patch.counts[0] == 900 * 4  # a shared buffer's count is its bytes
    blocks[0].set("Count", 4000)  # outgrows the shared buffers: they grow in place (new allocations)
    grown = compile_plan(c.snapshot())
    patch = decide_warm_patch(old, grown, {}, capacities=_capacities(old))
    assert isinstance(patch, WarmPatch) and {bi for bi, _ in patch.grow} == {0, 1, 2}


class Take(Block):
    """A Scale writing ``Count`` elements whatever its input holds (a size that is not its input's)."""

    type_name = "Take"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("scale"))
        b.input("In", k.in_(0), needs=None)
        b.scalar("Count", dtype=DType.UINT32, default=1000)
        b.output("Out", k.out(1), size=from_param("Count"))
        b.scalar("Factor", k.in_(2), default=1.0)
        b.scalar("Offset", k.in_(3), default=0.0)
        k.auto_grid(from_param("Count"), count_param=4)


def test_a_resize_that_changes_the_sharing_is_cold() -> None:
    # x and y are both released when t writes: best fit puts t's 1000 floats in x's 5000 while y holds
    # 200; once y holds 2000, y's buffer fits t better: another sharing, so a Cold rebuild.
    c = Context()
    x, y = c.register_block(Fill(name="x", Count=5000)), c.register_block(Fill(name="y", Count=200))
    jx, jy = c.register_block(Take(name="jx", Count=10)), c.register_block(Take(name="jy", Count=10))
    j, t = c.register_block(VectorAdd(name="j")), c.register_block(Take(name="t"))
    t2 = c.register_block(Scale(name="t2"))
    c.connect(x, "Out", jx, "In")
    c.connect(y, "Out", jy, "In")
    c.connect(jx, "Out", j, "A")
    c.connect(jy, "Out", j, "B")
    c.connect(j, "Sum", t, "In")
    c.connect(t, "Out", t2, "In")
    c.keep(j, "Sum")  # j takes no released buffer: t chooses between x's and y's
    old = compile_plan(c.snapshot())
    assert not old.diagnostics
    vx, vt = old.memory.ports[(x.id, "Out")], old.memory.ports[(t.id, "Out")]
    assert old.memory.value_buffer[vx] == old.memory.value_buffer[vt]
    y.set("Count", 2000)
    new = compile_plan(c.snapshot())
    vy = new.memory.ports[(y.id, "Out")]
    assert new.memory.value_buffer[vy] == new.memory.value_buffer[vt]
    refusal = decide_warm_patch(old, new, {}, capacities=_capacities(old))
    assert isinstance(refusal, WarmRefusal) and refusal.reason is Refusal.SHARING


def test_the_refusal_for_another_sharing_is_checked_before_the_nodes() -> None:
    c, _ = _chain(6)
    old = compile_plan(c.snapshot())
    mem = dataclasses.replace(old.memory, value_buffer=tuple(reversed(old.memory.value_buffer)))
    new = dataclasses.replace(old, memory=mem)
    refusal = decide_warm_patch(old, new, {}, capacities=_capacities(old))
    assert isinstance(refusal, WarmRefusal) and refusal.reason is Refusal.SHARING


# -- what the plans compute, run by the NumPy plan interpreter -----------------------------------------
@pytest.mark.parametrize("seed", range(40))
def test_shared_buffers_compute_what_separate_buffers_compute(seed: int) -> None:
    """Random elementwise patches (fused too), run node by node in launch order: every output that
    reuse leaves readable holds what it holds without reuse, bit for bit."""
    import numpy as np

    from tests.unit.plan_interp import run_plan
    from tests.unit.test_fusion import _random_patch as _elementwise_patch

    rng = np.random.default_rng(seed)
    count = int(rng.choice([1, 7, 256, 1000]))
    ctx, externals, _ = _elementwise_patch(rng, count)
    snap = ctx.snapshot()
    for fuse in (False, True):
        plain = compile_plan(snap, fuse=fuse, reuse=False)
        plan = compile_plan(snap, fuse=fuse)
        got_plain, got = run_plan(plain, snap, externals), run_plan(plan, snap, externals)
        mem = plan.memory
        for port, bi in plan.outputs.items():
            vi = mem.ports[port]
            n = mem.values[vi].count
            if mem.overwritten(vi):
                continue
            np.testing.assert_array_equal(got[bi][:n], got_plain[plain.outputs[port]][:n], err_msg=str(port))


def test_a_long_chain_and_diamonds_compute_the_same_with_reuse() -> None:
    import numpy as np

    from tests.unit.plan_interp import run_plan

    rng = np.random.default_rng(7)
    x = rng.standard_normal(500).astype(np.float32)
    c = Context()
    top = c.register_block(Scale(name="src", Factor=1.5))
    c.bind_input(top, "In", ExternalBinding(0x1000, 500, DType.FLOAT32))
    port = "Out"
    for d in range(6):  # a diamond, then a short chain, six times
        left, right = c.register_block(Scale(name=f"l{d}", Factor=0.5 + d)), c.register_block(Scale(name=f"r{d}"))
        join = c.register_block(VectorAdd(name=f"j{d}"))
        c.connect(top, port, left, "In")
        c.connect(top, port, right, "In")
        c.connect(left, "Out", join, "A")
        c.connect(right, "Out", join, "B")
        tail = c.register_block(Scale(name=f"t{d}", Factor=-0.75))
        c.connect(join, "Sum", tail, "In")
        top, port = tail, "Out"
    snap = c.snapshot()
    externals = {(snap.blocks[0].id, "In"): x}
    plain, plan = compile_plan(snap, reuse=False), compile_plan(snap)
    assert len(plan.buffers) < len(plain.buffers) // 3
    got = run_plan(plan, snap, externals)[plan.outputs[(top.id, "Out")]][:500]
    np.testing.assert_array_equal(got, run_plan(plain, snap, externals)[plain.outputs[(top.id, "Out")]])


def test_stats_and_the_engine_line_show_what_reuse_saves() -> None:
    from types import SimpleNamespace

    from cudapatch.engine.engine import Engine
    from cudapatch.engine.stats import FrameReading, collect_stats

    c, _ = _chain(9, count=1000)
    plan = compile_plan(c.snapshot())
    graph = SimpleNamespace(plan=plan, occupancy={}, kernel_count=10)
    pool = SimpleNamespace(in_use_bytes=0, total_allocated_bytes=0)
    stats = collect_stats(
        level=ProfilingLevel.NONE, blocks=c.registry, graph=graph, reading=FrameReading(), pool=pool, diagnostics=()
    )
    assert (stats.buffer_bytes, stats.value_bytes) == (3 * 4000, 10 * 4000)
    assert Engine._reuse_line(graph, 1 / 2**20) == "\n  Buffers: 0.0 MB for 0.0 MB of outputs"  # type: ignore[arg-type]
    plain = SimpleNamespace(plan=compile_plan(c.snapshot(), reuse=False))
    assert Engine._reuse_line(plain, 1.0) == ""  # type: ignore[arg-type]


# -- the patch file: [engine] keep and reuse_buffers ---------------------------------------------------
_CHAIN_PATCH = """
links = ["a.Out -> b.In", "b.Out -> c.In", "c.Out -> d.In", "d.Out -> e.In"]

[engine]
keep = ["b.Out"]
reuse_buffers = true

[operators.a]
type = "core.Fill"
Count = 1000
[operators.b]
type = "core.Scale"
[operators.c]
type = "core.Scale"
[operators.d]
type = "core.Scale"
[operators.e]
type = "core.Scale"
"""


def test_the_patch_file_keeps_ports_and_lets_them_go() -> None:
    from cudapatch.host_plugin.adapter import HostAdapter
    from cudapatch.host_plugin.patch import apply_patch, parse_patch
    from tests.unit.plan_engine import PlanOnlyEngine
    from tests.unit.test_patch_file import REG

    engine = PlanOnlyEngine(fuse=False)  # buffer reuse alone (with fusion: test_fusion.py)
    adapter = HostAdapter(engine, REG)
    first = parse_patch(_CHAIN_PATCH, registry=REG)
    apply_patch(adapter, first)
    engine.update()
    b = adapter.block("b")
    mem = engine.plan.memory
    assert (mem.ports[(b.id, "Out")], PinReason.KEEP) in mem.pinned
    second = parse_patch(_CHAIN_PATCH.replace('keep = ["b.Out"]', "keep = []"), registry=REG)
    apply_patch(adapter, second, first)
    engine.update()
    assert engine.plan.memory.shared(engine.plan.outputs[(b.id, "Out")])


@pytest.mark.parametrize(
    ("old", "new", "line", "words"),
    [
        ('keep = ["b.Out"]', 'keep = "b.Out"', 5, 'a list of "operator.Port" strings'),
        ('keep = ["b.Out"]', 'keep = ["b"]', 5, 'a list of "operator.Port" strings'),
        ("reuse_buffers = true", "reuse_buffers = 1", 6, "write true or false"),
    ],
)
def test_bad_engine_keep_settings_name_the_line(old: str, new: str, line: int, words: str) -> None:
    from cudapatch.errors import PatchFileError
    from cudapatch.host_plugin.patch import parse_patch
    from tests.unit.test_patch_file import REG

    with pytest.raises(PatchFileError) as err:
        parse_patch(_CHAIN_PATCH.replace(old, new), path="p.toml", registry=REG)
    assert err.value.line == line and words in err.value.message


def test_keeping_an_unknown_operator_is_an_error_on_the_line() -> None:
    from cudapatch.errors import PatchFileError
    from cudapatch.host_plugin.adapter import HostAdapter
    from cudapatch.host_plugin.patch import apply_patch, parse_patch
    from tests.unit.plan_engine import PlanOnlyEngine
    from tests.unit.test_patch_file import REG

    patch = parse_patch(_CHAIN_PATCH.replace('"b.Out"', '"zz.Out"'), path="p.toml", registry=REG)
    with pytest.raises(PatchFileError, match="no operator 'zz'") as err:
        apply_patch(HostAdapter(PlanOnlyEngine(), REG), patch)
    assert err.value.line == 5


def test_inner_blocks_of_composites_and_strangers() -> None:
    from cudapatch.engine import Context as Ctx

    c, blocks = _chain(3)
    loose = Scale(name="loose")  # not registered (as the inner blocks of a composite): kept by its id
    assert c.keep(loose, "Out") and (loose.id, "Out") in c.snapshot().kept
    other = Ctx()
    stranger = other.register_block(Scale(name="stranger"))
    with pytest.raises(Exception, match="another engine"):
        c.keep(stranger, "Out")
    with pytest.raises(Exception, match="no such port"):
        c.keep(blocks[0], "Nope")


def test_a_kept_composite_port_keeps_the_inner_output_and_reads_as_the_composite() -> None:
    from tests.unit.composite_blocks import TwoScales

    c = Context()
    head = c.register_block(Fill(name="head", Count=1000))
    s0 = c.register_block(Scale(name="s0"))
    two = c.register_block(TwoScales(name="two"))
    tail = c.register_block(Scale(name="tail"))
    t2 = c.register_block(Scale(name="t2"))
    c.connect(head, "Out", s0, "In")
    c.connect(s0, "Out", two, "In")
    c.connect(two, "Out", tail, "In")
    c.connect(tail, "Out", t2, "In")
    plan = compile_plan(c.snapshot())
    assert (two.id, "Out") in plan.memory.ports  # the composite's key reaches the memory plan
    assert plan.memory.shared(plan.outputs[(two.id, "Out")])
    c.keep(two, "Out")
    plan = compile_plan(c.snapshot())
    vi = plan.memory.ports[(two.id, "Out")]
    assert (vi, PinReason.KEEP) in plan.memory.pinned and not plan.memory.shared(plan.outputs[(two.id, "Out")])


def test_a_patch_with_regions_keeps_a_buffer_per_value() -> None:
    from pathlib import Path

    from cudapatch.host_plugin.adapter import HostAdapter
    from cudapatch.host_plugin.patch import apply_patch, load_patch
    from tests.unit.plan_engine import PlanOnlyEngine
    from tests.unit.test_patch_file import REG

    example = Path(__file__).resolve().parents[2] / "examples" / "08_jacobi.toml"
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    adapter.search_paths.append(example.parent)
    apply_patch(adapter, load_patch(example, registry=REG))
    engine.update()
    mem = engine.plan.memory
    assert engine.errors == () and mem is not None
    assert mem.value_buffer == tuple(range(len(mem.values))) and engine.plan.buffers == mem.values


def test_the_plan_listing_shows_the_sharing() -> None:
    c, _ = _chain(5, count=1024)
    text = compile_plan(c.snapshot()).describe()
    assert "buffers: 0.0 MB for 0.0 MB of values (3 buffers, 6 values)" in text
    assert "  buffer 0: " in text and ".Out" in text
    assert "buffers:" not in compile_plan(c.snapshot(), reuse=False).describe()


def test_a_frame_delays_pair_is_pinned_and_the_loop_around_it_may_share() -> None:
    from cudapatch import FrameDelay

    d = FrameDelay(name="d", Count=256)
    f, a, s1, s2, s3 = (
        Fill(name="f", Count=256),
        VectorAdd(name="a"),
        Scale(name="s1"),
        Scale(name="s2"),
        Scale(name="s3"),
    )
    c = Context()
    for b in (d, f, a, s1, s2, s3):
        c.register_block(b)
    c.connect(d, "Out", a, "A")
    c.connect(f, "Out", a, "B")
    c.connect(a, "Sum", s1, "In")
    c.connect(s1, "Out", s2, "In")
    c.connect(s2, "Out", s3, "In")
    c.connect(s3, "Out", d, "In")
    plan = compile_plan(c.snapshot())
    mem = plan.memory
    why = dict(mem.pinned)
    (dp,) = plan.delays
    assert why[mem.ports[(d.id, "Out")]] == PinReason.DELAY and why[mem.ports[(s3.id, "Out")]] == PinReason.DELAY
    assert not mem.shared(dp.previous) and not mem.shared(dp.current)
    assert mem.buffer_values()  # the values inside the loop take turns in shared buffers
    assert plan.buffers[dp.previous].label == "Out" and plan.buffers[dp.previous].block_id == d.id


def test_a_bypassed_block_keeps_its_values_out_of_shared_buffers() -> None:
    from cudapatch.engine.memory_plan import shares_with_others

    c, blocks = _chain(8)
    plan = compile_plan(c.snapshot())
    mid = blocks[4]
    assert shares_with_others(plan, {mid.id}) == {mid.id}  # bypassing it now would read other data
    c.bypassed.add(mid.id)  # as Context does when a block's enabled flag goes off
    plan = compile_plan(c.snapshot())
    why = dict(plan.memory.pinned)
    assert why[plan.memory.ports[(mid.id, "Out")]] == PinReason.BYPASS
    assert why[plan.memory.ports[(blocks[3].id, "Out")]] == PinReason.BYPASS  # its input
    assert shares_with_others(plan, {mid.id}) == set() and plan.memory.buffer_values()  # the rest still shares
