"""Incremental planning of fused patches without a GPU: a plan resumed at the first fused group an edit
may change equals a full re-plan, and so do the ``built_view`` and ``BypassIndex`` made from its delta,
over chains and trees whose members are added and removed inside and at the ends of groups, gain a
second reader (their group splits), are bypassed, renamed, kept, or get a new Hot value."""

from __future__ import annotations

import importlib
import random

import pytest

from cudapatch import DType, Engine, Expression, Scale, VectorAdd
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.built_view import built_view
from cudapatch.engine.bypass import BypassIndex
from cudapatch.engine.compiler import NodeCache, liveness
from cudapatch.errors import CudapatchError

from .test_live_builds import Realizer, _landed, engine, realizer  # noqa: F401 (fixtures: the build thread over fakes)
from .test_plan_reuse import INDEX, _both, _chain

_fusion = importlib.import_module("cudapatch.engine.compiler.fusion")  # the package's ``fusion`` is the phase
_UNARY = ("x * Gain + 0.25", "fma(x, Gain, Bias)", "abs(x) - Gain")
_BINARY = ("x + y", "x * y - Gain", "mix(x, y, 0.3)")


def _groups(plan) -> list[tuple[int, ...]]:
    return [n.source.members for n in plan.kernel_nodes if getattr(n.source, "members", ())]


def test_an_edit_after_the_groups_plans_only_the_last_group() -> None:
    c, blocks = _chain(1200)  # groups of about 500 Scale blocks (the arguments of one launch)
    cache, last = NodeCache(), (None, None)
    last = _both(c.snapshot(), cache, last, fuse=True)
    first, *_, end = _groups(cache.plan)
    assert len(_groups(cache.plan)) == 3 and first[0] == blocks[0].id and end[-1] == blocks[-1].id
    tail = c.register_block(Scale(name="tail"))
    c.connect(blocks[-1], "Out", tail, "In")
    last = _both(c.snapshot(), cache, last, fuse=True)
    kept = len(blocks) - len(end)  # the blocks before the last group, as they were
    assert (cache.resumed, cache.resumed_blocks) == (1, kept)
    assert _groups(cache.plan)[-1] == (*end, tail.id)
    assert cache.delta is not None and cache.delta.nodes == 2  # the other groups' nodes are the last plan's
    c.unregister_block(tail)
    last = _both(c.snapshot(), cache, last, fuse=True)
    assert (cache.resumed, cache.resumed_blocks) == (2, 2 * kept)


def test_a_member_that_gains_a_second_reader_splits_its_group_and_one_restored_joins_it_again() -> None:
    c, blocks = _chain(1200)
    cache, last = NodeCache(), (None, None)
    last = _both(c.snapshot(), cache, last, fuse=True)
    reader = c.register_block(Scale(name="reader"))
    c.connect(blocks[700], "Out", reader, "In")  # inside the second group: its intermediate is read twice
    last = _both(c.snapshot(), cache, last, fuse=True)
    assert any(g[-1] == blocks[700].id for g in _groups(cache.plan))
    assert cache.resumed == 1 and cache.resumed_blocks == len(_groups(cache.plan)[0])
    c.unregister_block(reader)
    last = _both(c.snapshot(), cache, last, fuse=True)
    assert not any(g[-1] == blocks[700].id for g in _groups(cache.plan))


def test_bypass_hot_values_keep_and_renames_of_members() -> None:
    c, blocks = _chain(1200)
    cache, last = NodeCache(), (None, None)
    last = _both(c.snapshot(), cache, last, fuse=True)
    blocks[100].set("Factor", 0.5)  # a Hot value in the first group, with an edit after the groups
    tail = c.register_block(Scale(name="tail"))
    c.connect(blocks[-1], "Out", tail, "In")
    last = _both(c.snapshot(), cache, last, fuse=True)
    assert cache.resumed_blocks > 600  # the first group's node was made again in place
    for edit in (
        lambda: setattr(blocks[900], "enabled", False),  # a fused member leaves its group: its node is its own
        lambda: setattr(blocks[900], "enabled", True),
        lambda: c.keep(blocks[1000], "Out"),  # a kept output is stored: the group ends there
        lambda: c.keep(blocks[1000], "Out", False),
        lambda: setattr(blocks[1100], "name", "renamed"),
        lambda: c.unregister_block(blocks[800]),  # a member removed inside a group
        lambda: c.connect(blocks[799], "Out", blocks[801], "In"),
    ):
        edit()
        last = _both(c.snapshot(), cache, last, fuse=True)
    assert cache.resumed == 8


def test_a_block_before_the_resume_point_that_fuses_into_one_after_it_moves_the_point_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A sum of two chains too big for one launch reads both from buffers; when the second chain's end gets
    another reader, the first chain fuses into the sum: a group the edit did not touch grows."""
    monkeypatch.setattr(_fusion, "MAX_PARAM_BYTES", 162)  # a chain of 10 Scale blocks fits, two do not
    c = Context()
    chains = []
    for name in ("c", "a", "b"):  # ``c`` first: planned before the others, untouched
        chain = [c.register_block(Scale(name=f"{name}{i}", Factor=1.5)) for i in range(10)]
        c.bind_input(chain[0], "In", ExternalBinding(0x6000, 256, DType.FLOAT32))
        for x, y in zip(chain, chain[1:], strict=False):
            c.connect(x, "Out", y, "In")
        chains.append(chain)
    _, a, b = chains
    total = c.register_block(VectorAdd(name="sum"))
    c.connect(a[-1], "Out", total, "A")
    c.connect(b[-1], "Out", total, "B")
    cache, last = NodeCache(), (None, None)
    last = _both(c.snapshot(), cache, last, fuse=True)
    assert sorted(map(len, _groups(cache.plan))) == [10, 10, 10]  # the sum runs alone
    c.connect(b[-1], "Out", c.register_block(Scale(name="reader")), "In")
    last = _both(c.snapshot(), cache, last, fuse=True)
    assert (*(x.id for x in a), total.id) in _groups(cache.plan)
    assert (cache.resumed, cache.resumed_blocks) == (1, 10)  # from the first block of ``a``, not of ``b``


def _output(b) -> str:
    return b.description.outputs[0].name


def _inputs(b) -> list[str]:
    return [p.name for p in b.description.inputs]


def _new_member(c: Context, rng: random.Random, made: list, unary: bool = True):
    i = len(made)
    kind = rng.randrange(3)
    if kind == 0 and unary:
        b = Scale(name=f"s{i}", Factor=rng.uniform(0.5, 2.0), Offset=rng.uniform(-1, 1))
    elif kind == 1 and not unary:
        b = VectorAdd(name=f"a{i}")
    else:
        b = Expression(name=f"e{i}", Code=rng.choice(_UNARY if unary else _BINARY))
    made.append(b)
    c.register_block(b)
    for name in b.params:
        spec = b.params[name].spec
        if spec.kind == "scalar" and not spec.structural and spec.dtype == DType.FLOAT32 and name not in ("Code",):
            b.set(name, rng.uniform(-1, 1))
    return b


def _incoming(c: Context, b, port: str):
    return next((lk for lk in c.connections if lk.dst == b.id and lk.dst_port == port), None)


def _readers(c: Context, b) -> list:
    return [lk for lk in c.connections if lk.src == b.id]


def _fused_edit(c: Context, rng: random.Random, made: list) -> None:
    """One edit of a patch of fused chains and trees: most of them where groups start, end and split."""
    blocks = list(c.registry)
    kind = rng.choice(
        ["end", "end", "insert", "insert", "cut_out", "reader", "tree", "remove", "unlink", "relink"]
        + ["bypass", "bypass", "hot", "keep", "rename", "rename"]
    )
    if kind == "end" or len(blocks) < 3:  # a member at the end of a chain, or a second reader of any block
        src = rng.choice(blocks) if blocks else None
        b = _new_member(c, rng, made)
        if src is not None and src.context is c:
            c.connect(src, _output(src), b, "In" if isinstance(b, Scale) else _inputs(b)[0])
        else:
            c.bind_input(b, _inputs(b)[0], ExternalBinding(0x4000, 512, DType.FLOAT32))
    elif kind == "insert":  # a member inside a chain: a -> new -> b
        links = list(c.connections)
        if links:
            lk = rng.choice(links)
            src, dst = c.registry.get(lk.src), c.registry.get(lk.dst)
            c.disconnect(src, lk.src_port, dst, lk.dst_port)
            b = _new_member(c, rng, made)
            c.connect(src, lk.src_port, b, _inputs(b)[0])
            c.connect(b, _output(b), dst, lk.dst_port)
    elif kind == "cut_out":  # a one-input member removed, its reader linked to what it read
        one = [b for b in blocks if len(_inputs(b)) == 1 and _incoming(c, b, _inputs(b)[0]) is not None]
        if one:
            b = rng.choice(one)
            lk_in = _incoming(c, b, _inputs(b)[0])
            outs = _readers(c, b)
            src = c.registry.get(lk_in.src)
            c.unregister_block(b)
            for lk in outs:
                try:
                    c.connect(src, lk_in.src_port, c.registry.get(lk.dst), lk.dst_port)
                except CudapatchError:
                    pass
    elif kind == "reader":  # a second reader: the group splits at the block read
        src = rng.choice(blocks)
        b = _new_member(c, rng, made)
        c.connect(src, _output(src), b, _inputs(b)[0])
    elif kind == "tree":
        a, b2 = rng.sample(blocks, 2)
        b = _new_member(c, rng, made, unary=False)
        ins = _inputs(b)
        c.connect(a, _output(a), b, ins[0])
        c.connect(b2, _output(b2), b, ins[1])
    elif kind == "remove":
        c.unregister_block(rng.choice(blocks))
    elif kind == "unlink":
        links = list(c.connections)
        if links:
            lk = rng.choice(links)
            c.disconnect(c.registry.get(lk.src), lk.src_port, c.registry.get(lk.dst), lk.dst_port)
    elif kind == "relink":  # an unlinked input linked again, or bound
        free = [(b, p) for b in blocks for p in _inputs(b) if _incoming(c, b, p) is None]
        if free:
            b, p = rng.choice(free)
            src = rng.choice(blocks)
            try:
                c.connect(src, _output(src), b, p)
            except CudapatchError:
                c.bind_input(b, p, ExternalBinding(0x5000, 512, DType.FLOAT32))
    elif kind == "bypass":
        b = rng.choice(blocks)
        b.enabled = not b.enabled
    elif kind == "hot":
        for b in rng.sample(blocks, min(3, len(blocks))):
            scalars = [n for n, p in b.params.items() if p.spec.kind == "scalar" and not p.spec.structural]
            if scalars:
                b.set(rng.choice(scalars), rng.uniform(-1, 1))
    elif kind == "keep":
        b = rng.choice(blocks)
        c.keep(b, _output(b), rng.random() < 0.7)
    else:  # a rename, or a member's expression edited (the same names: a Code edit re-describes it)
        b = rng.choice(blocks)
        unary = isinstance(b, Expression) and _inputs(b) == ["x"]
        if unary and rng.random() < 0.5:
            b.set("Code", rng.choice(_UNARY))
        else:
            b.name = f"{b.name}_r"


@pytest.mark.parametrize("seed", range(10))
def test_a_resumed_fused_plan_equals_a_full_replan_over_random_edits(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(liveness, "CHECKPOINT_EVERY", 4)  # the buffer assignment resumes mid-way too
    monkeypatch.setattr(_fusion, "MAX_PARAM_BYTES", 160 + 40 * (seed % 3))  # groups of a few members: many cuts
    rng = random.Random(seed)
    c = Context()
    made: list = []
    for _ in range(3):  # three chains, each from a bound input
        prev = None
        for _ in range(rng.randrange(8, 20)):
            b = _new_member(c, rng, made)
            if prev is None:
                c.bind_input(b, _inputs(b)[0], ExternalBinding(0x3000, 512, DType.FLOAT32))
            else:
                c.connect(prev, _output(prev), b, _inputs(b)[0])
            prev = b
    cache, last = NodeCache(), (None, None)
    reuse = seed % 4 != 3
    for _ in range(60):
        _fused_edit(c, rng, made)
        last = _both(c.snapshot(), cache, last, fuse=True, reuse=reuse)
    assert cache.resumed > 10


def test_the_build_thread_makes_the_index_and_view_of_a_resumed_fused_plan_from_its_delta(
    engine: Engine,  # noqa: F811 (the fixture imported above)
    realizer: Realizer,  # noqa: F811
) -> None:
    from .test_engine_orchestration import DeviceArray

    blocks = [engine.add(Scale(name=f"s{i}", Factor=1.0 + i / 1000)) for i in range(1200)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        engine.connect(a, "Out", b, "In")
    engine.bind(blocks[0], "In", DeviceArray(4099))
    _landed(engine)
    builds = engine._builds
    plans = builds._plans
    tail = engine.add(Scale(name="tail"))  # not running yet: its input is not linked
    _landed(engine)
    edits = (
        lambda: engine.connect(blocks[-1], "Out", tail, "In"),  # the last group grows
        lambda: engine.connect(blocks[700], "Out", engine.add(Scale(name="reader")), "In"),  # a group splits
        lambda: setattr(blocks[900], "enabled", False),  # a member leaves its group
        lambda: engine.remove(tail),
    )
    for edit in edits:
        resumed = plans.resumed
        edit()
        engine.update()  # a bypass is only marked until an update decides it needs a build
        _landed(engine)
        plan = engine.graph.plan
        assert plans.resumed > resumed and plans.delta is not None and plans.delta.plan is plan
        index, whole = builds._index, BypassIndex(plan)
        assert index.plan is plan
        for name in INDEX:
            assert getattr(index, name) == getattr(whole, name), name
        names = {b.id: b.name for b in engine.blocks}
        shown, view = builds._shower.shown, built_view(plan, names, None)
        assert (shown.sizes, shown.shapes, shown.groups) == (view.sizes, view.shapes, view.groups)
    assert str(blocks[701]).count("->") > 100 and "fused" not in str(blocks[900])  # what the blocks show
