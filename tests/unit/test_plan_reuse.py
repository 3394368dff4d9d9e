"""Incremental planning without a GPU: a plan made with the ``NodeCache`` (the node drafts of blocks an
edit did not touch, taken from the last plan) equals a full re-plan, over random edit sequences."""

from __future__ import annotations

import random

import pytest

from cudapatch import AppendFilter, DType, Fill, FrameDelay, If, Scale, VectorAdd
from cudapatch.blocks.library import FFT
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.built_view import built_view
from cudapatch.engine.bypass import BypassIndex, plan_bypass
from cudapatch.engine.compiler import NodeCache, liveness
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import CudapatchError, GraphCompileError

from .unfused import compile_plan  # one node per block: these tests are about unfused plans

DICTS = ("outputs", "appends", "scalar_slots", "binding_slots", "binding_counts", "block_nodes")


def _same(a, b) -> None:
    assert a == b  # nodes, buffers, counters, order, skipped, diagnostics, level, timings
    for name in DICTS:  # the fields a GraphPlan does not compare
        assert getattr(a, name) == getattr(b, name), name


def _chain(n: int) -> tuple[Context, list[Scale]]:
    c = Context()
    blocks = [c.register_block(Scale(name=f"s{i}", Factor=1.0 + i)) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        c.connect(a, "Out", b, "In")
    c.bind_input(blocks[0], "In", ExternalBinding(0x1000, 1024, DType.FLOAT32))
    return c, blocks


def test_an_edit_at_the_end_of_a_chain_replans_one_block() -> None:
    c, blocks = _chain(50)
    cache = NodeCache()
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert (cache.hits, cache.misses) == (0, 50)
    tail = c.register_block(Scale(name="tail"))
    c.connect(blocks[-1], "Out", tail, "In")
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert (cache.hits, cache.misses) == (50, 51)
    blocks[10].set("Factor", 9.0)  # a Hot value lives in the plan's arguments: that block is made anew
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert (cache.hits, cache.misses) == (100, 52)


def test_an_edit_in_the_middle_replans_the_blocks_whose_nodes_moved() -> None:
    c, blocks = _chain(20)
    cache = NodeCache()
    compile_plan(c.snapshot(), cache=cache)
    c.unregister_block(blocks[5])  # the rest of the chain no longer runs; then it runs again
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    c.connect(blocks[4], "Out", blocks[6], "In")
    hits = cache.hits
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert cache.hits - hits == 5  # s0..s4 kept their nodes


def _random_edit(c: Context, rng: random.Random, made: list) -> None:
    blocks = list(c.registry)
    kind = rng.choice(["add", "add", "connect", "connect", "disconnect", "remove", "hot", "size", "bind", "bind"])
    if kind == "add" or not blocks:
        cls = rng.choice([Scale, Scale, Fill, VectorAdd, AppendFilter])
        b = cls(name=f"b{len(made)}")
        made.append(b)
        c.register_block(b)
    elif kind == "connect":
        src, dst = rng.choice(blocks), rng.choice(blocks)
        outs, ins = src.description.outputs, dst.description.inputs
        if outs and ins:
            try:
                c.connect(src, rng.choice(outs).name, dst, rng.choice(ins).name)
            except CudapatchError:
                pass  # a cycle, a linked input, other element types: refused, nothing changed
    elif kind == "disconnect":
        links = list(c.connections)
        if links:
            lk = rng.choice(links)
            c.disconnect(c.registry.get(lk.src), lk.src_port, c.registry.get(lk.dst), lk.dst_port)
    elif kind == "remove":
        c.unregister_block(rng.choice(blocks))
    elif kind == "hot":
        b = rng.choice(blocks)
        scalars = [p for p in b.params.values() if p.spec.kind == "scalar" and not p.spec.structural]
        if scalars:
            p = rng.choice(scalars)
            if p.spec.dtype.lanes == 1 and p.spec.dtype.base.kind == "f":
                b.set(p.name, rng.uniform(0.0, 1.0))
    elif kind == "size":
        fills = [b for b in blocks if isinstance(b, Fill)]
        if fills:
            rng.choice(fills).set("Count", rng.choice([64, 128, 1000]))
    else:
        b = rng.choice(blocks)
        ins = [p for p in b.description.inputs if p.dtype == DType.FLOAT32]
        if ins:
            try:
                c.bind_input(
                    b,
                    rng.choice(ins).name,
                    ExternalBinding(0x2000 * rng.randint(1, 4), rng.choice([64, 100, 1000]), DType.FLOAT32),
                )
            except CudapatchError:
                pass  # a linked input


@pytest.mark.parametrize("seed", range(12))
def test_a_plan_with_reuse_equals_a_full_replan_over_random_edits(seed: int) -> None:
    rng = random.Random(seed)
    c, made, cache = Context(), [], NodeCache()
    faulted: dict[int, str] = {}
    for step in range(60):
        _random_edit(c, rng, made)
        if step % 17 == 16 and c.registry:  # now and then a block faulted on the GPU, or a profiling level
            faulted = {rng.choice(list(c.registry)).id: "faulted"}
        level = ProfilingLevel.PER_BLOCK if step % 13 == 12 else ProfilingLevel.NONE
        snap = c.snapshot()
        _same(compile_plan(snap, None, level, faulted, cache=cache), compile_plan(snap, None, level, faulted))
    assert cache.hits > 0


def test_library_calls_are_reused_too() -> None:
    c = Context()
    fft = c.register_block(FFT(name="fft", Nx=8))
    c.bind_input(fft, "In", ExternalBinding(0x3000, 16, fft.description.input("In").dtype))
    cache = NodeCache()
    compile_plan(c.snapshot(), cache=cache)
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert cache.hits == 1


def _edit_chain(c: Context, rng: random.Random, made: list, tail: list) -> dict:
    """One edit of a long patch, most of them near its end (where resuming saves most), with the
    ones that change pins, lifetimes and node counts: keep, bypass, delays, probes, regions, faults
    and kernels still compiling. Returns the extra arguments of ``compile_plan`` for this step."""
    blocks = list(c.registry)
    tail[:] = [b for b in tail if b in c.registry]  # a random edit may have removed one of them
    for key in list(c.probes):  # probes and regions are planned whole: most go again at the next edit
        if rng.random() < 0.7:
            c.remove_probe(key)
    for r in [b for b in blocks if isinstance(b, If)]:
        if rng.random() < 0.7:
            c.unregister_block(r)
            blocks.remove(r)
    kind = rng.choice(
        ["tail", "tail", "untail", "link", "unlink", "remove", "hot", "size", "keep", "bypass", "delay", "probe"]
        + ["region", "status", "fault", "bind", "add"]
    )
    if kind == "tail" or not blocks:
        b = c.register_block(Scale(name=f"t{len(made)}"))
        made.append(b)
        if tail:
            c.connect(tail[-1], "Out", b, "In")
        tail.append(b)
    elif kind == "untail" and tail:
        c.unregister_block(tail.pop())
    elif kind == "add":
        cls = rng.choice([Scale, Fill, VectorAdd, AppendFilter])
        b = cls(name=f"b{len(made)}")
        made.append(b)
        c.register_block(b)
    elif kind in ("link", "unlink"):
        _random_edit(c, rng, made) if kind == "link" else None
        links = list(c.connections)
        if kind == "unlink" and links:
            lk = rng.choice(links[-8:])
            c.disconnect(c.registry.get(lk.src), lk.src_port, c.registry.get(lk.dst), lk.dst_port)
        elif links:
            lk = rng.choice(links)
            src, dst = c.registry.get(lk.src), rng.choice(blocks[-6:])
            ins = [p.name for p in dst.description.inputs if p.dtype == DType.FLOAT32]
            if src is not dst and ins and src.description.output(lk.src_port).dtype == DType.FLOAT32:
                try:
                    c.connect(src, lk.src_port, dst, rng.choice(ins))
                except CudapatchError:
                    pass
    elif kind == "remove":
        b = rng.choice(blocks)
        if b in tail:
            tail.remove(b)
        c.unregister_block(b)
    elif kind == "hot":  # a slider moved: the blocks after it are not planned again
        for b in rng.sample(blocks, min(3, len(blocks))):
            if isinstance(b, Scale):
                b.set("Factor", rng.uniform(0.5, 2.0))
        if tail and rng.random() < 0.5:  # and a structure edit in the same build
            b = c.register_block(Scale(name=f"h{len(made)}"))
            made.append(b)
            c.connect(tail[-1], "Out", b, "In")
            tail.append(b)
    elif kind == "keep":
        b = rng.choice(blocks)
        outs = b.description.outputs
        if outs:
            c.keep(b, outs[0].name, rng.random() < 0.7)
    elif kind == "bypass":
        b = rng.choice(blocks)
        b.enabled = not b.enabled
    elif kind == "delay":
        d = c.register_block(FrameDelay(name=f"d{len(made)}", Count=1024))
        made.append(d)
        src = rng.choice(tail) if tail else None
        if src is not None and src.context is c:
            c.connect(src, "Out", d, "In")
            tail.append(c.register_block(Scale(name=f"r{len(made)}")))
            made.append(tail[-1])
            c.connect(d, "Out", tail[-1], "In")
    elif kind == "probe":
        b = rng.choice(blocks)
        outs = b.description.outputs
        if outs:
            key = (b.id, outs[0].name)
            if key in c.probes:
                c.remove_probe(key)
            else:
                c.add_probe(b, outs[0].name)
    elif kind == "region":
        ifs = [b for b in blocks if isinstance(b, If)]
        if ifs:
            c.unregister_block(ifs[0])
        elif tail:
            r = c.register_block(If(name=f"if{len(made)}"))
            made.append(r)
            c.place(rng.choice(tail), r)
    elif kind == "status":
        return {"kernel_status": {(rng.choice(blocks).id, 0): ("warning", "kernel-compiling", "compiling")}}
    elif kind == "fault":
        return {"faulted": {rng.choice(blocks).id: "faulted"}}
    else:
        _random_edit(c, rng, made)
    return {}


INDEX = ("readers", "writers", "captured_readers", "inputs", "captured_blocks", "fused", "outputs", "ports", "nested")


def _both(snap, cache: NodeCache, last: tuple = (None, None), **kw) -> tuple:
    """A plan made with ``cache`` equals one made whole, or both raise the same errors. What the
    build makes of it after planning from what it made of the plan before (``last``: its
    ``built_view`` and ``BypassIndex``) equals what it makes of the plan whole. Returns the new ones."""
    try:
        full = compile_plan(snap, **kw)
    except GraphCompileError as exc:
        with pytest.raises(GraphCompileError) as info:
            compile_plan(snap, cache=cache, **kw)
        assert info.value.diagnostics == exc.diagnostics
        return last
    plan = compile_plan(snap, cache=cache, **kw)
    _same(plan, full)
    view, index = last
    whole = built_view(plan, snap.names, view)
    resumed = built_view(plan, snap.names, view, cache.delta)
    assert (resumed.sizes, resumed.shapes, resumed.groups) == (whole.sizes, whole.shapes, whole.groups)
    assert (resumed.changed, resumed.base) == (whole.changed, whole.base)
    index_whole, index_resumed = BypassIndex(plan), BypassIndex(plan, index, cache.delta)
    for name in INDEX:
        assert getattr(index_resumed, name) == getattr(index_whole, name), name
    assert index_resumed.position == index_whole.position
    assert plan_bypass(index_resumed, snap.bypassed) == plan_bypass(index_whole, snap.bypassed)
    for b in snap.blocks[-3:]:  # carried decisions too (``bypass.Carry``: from ``ports``)
        assert index_resumed.decide({b.id}, True) == index_whole.decide({b.id}, True)
    return resumed, index_resumed


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("seed", range(24))
def test_a_resumed_plan_equals_a_full_replan_over_random_edits_of_a_long_chain(
    seed: int, fuse: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(liveness, "CHECKPOINT_EVERY", 4)  # the buffer assignment resumes mid-way too
    rng = random.Random(seed)
    c, blocks = _chain(40)
    made, tail, cache = list(blocks), list(blocks), NodeCache()
    for b in blocks[::7]:
        c.keep(b, "Out")  # pinned values among shared ones
    reuse = seed % 4 != 3
    last: tuple = (None, None)
    for step in range(70):
        kw = _edit_chain(c, rng, made, tail)
        level = ProfilingLevel.PER_BLOCK if step % 23 == 22 else ProfilingLevel.NONE
        last = _both(c.snapshot(), cache, last, level=level, fuse=fuse, reuse=reuse, **kw)
    assert cache.resumed > 10 and cache.resumed_blocks > 200  # fused too: each chain of Scale blocks here fuses


def test_an_edit_at_the_end_of_a_long_chain_resumes_after_the_blocks_before_it() -> None:
    c, blocks = _chain(300)
    cache = NodeCache()
    compile_plan(c.snapshot(), cache=cache)
    tail = c.register_block(Scale(name="tail"))
    c.connect(blocks[-1], "Out", tail, "In")
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert (cache.resumed, cache.resumed_blocks, cache.misses) == (1, 300, 301)
    c.disconnect(blocks[-1], "Out", tail, "In")  # the tail stops running, then the link is back
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    c.connect(blocks[-1], "Out", tail, "In")
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    c.unregister_block(tail)
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert cache.resumed == 4
    c.bind_input(blocks[0], "In", ExternalBinding(0x9000, 1024, DType.FLOAT32))  # a new pointer (a Warm rebind)
    c.register_block(tail)  # then a structure edit: the first block is not planned again
    c.connect(blocks[-1], "Out", tail, "In")
    _same(compile_plan(c.snapshot(), cache=cache), compile_plan(c.snapshot()))
    assert (cache.resumed, cache.resumed_blocks) == (5, 1500)


def test_a_plan_leaves_its_drafts_in_the_cache_for_the_caller_to_free() -> None:
    """Freed at ``compile_plan``'s return, a large draft was one long cascade of deallocations: the
    cache keeps a plan's drafts (a resumed plan's two), and the state and plan it replaced, until its
    caller takes them."""
    from cudapatch.engine.compiler.draft import PlanDraft

    c, blocks = _chain(40)
    cache = NodeCache()
    compile_plan(c.snapshot(), cache=cache)

    def drafts() -> int:
        return sum(type(d) is PlanDraft for d in cache.spent)

    first = drafts()
    assert first >= 1
    state, plan = cache.state, cache.plan
    tail = c.register_block(Scale(name="tail"))
    c.connect(blocks[-1], "Out", tail, "In")
    compile_plan(c.snapshot(), cache=cache)
    assert cache.resumed == 1 and drafts() == first + 2
    assert any(x is state for x in cache.spent) and any(x is plan for x in cache.spent)  # what it replaced
    n = len(cache.spent)
    compile_plan(c.snapshot())  # no cache: nothing kept
    assert len(cache.spent) == n
