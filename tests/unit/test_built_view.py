"""The build view (engine/built_view.py): worked out from the plan alone, applied as differences, it
leaves every block showing what ``built_reference.show_built`` shows (sizes, shapes, fused group, append
outputs, GPU numbers cleared), through a sequence of edits."""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import pytest

from cudapatch import AppendFilter, Fill, ProfilingLevel, Scale, compile_plan
from cudapatch.engine import Context
from cudapatch.engine.built_view import BuiltShower, built_view
from cudapatch.engine.stats import show_on_blocks

from .built_reference import built_rows, show_built


def _shown(c: Context, extra: list[Any]) -> dict[int, tuple]:
    blocks = {b.id: b for b in [*c.registry, *extra]}
    return {
        bid: (b.debug.sizes, b.debug.shapes, b.debug.fused, b.debug.append, b.debug.gpu_ms, b.debug.append_fill)
        for bid, b in blocks.items()
    }


def _both(
    c: Context, shower: BuiltShower, appends: dict, *, fuse: bool = False, extra: list[Any] = (), write: bool = False
) -> None:
    """Apply the next build both ways and compare: the view (diff) first, then the reference. By
    default the reference is ``built_rows``, which writes nothing, so the blocks stay pointed at the
    shower's views across builds, as in an engine; ``write``: ``show_built`` writes every block (each
    then keeps its own values until a view it changes in points it at the shower again)."""
    snap = c.snapshot()
    plan = compile_plan(snap, fuse=fuse)
    view = built_view(plan, {b.id: b.name for b in snap.blocks}, shower.shown)
    shower.apply(view, appends)
    mine = _shown(c, list(extra))
    if write:
        show_built(plan, appends, c.registry)
        assert mine == _shown(c, list(extra))
    else:
        rows = built_rows(plan, appends, c.registry)
        assert {bid: row for bid, row in mine.items() if bid in rows} == rows
    assert len(view.changed) <= len(c.registry) + len(extra)


def _show(c: Context, shower: BuiltShower) -> None:
    """Apply the next build's view, as an engine's swap does (nothing compared)."""
    snap = c.snapshot()
    shower.apply(built_view(compile_plan(snap), {b.id: b.name for b in snap.blocks}, shower.shown), {})


def _fill_to_scale(c: Context, count: int) -> tuple[Fill, Scale]:
    f = c.register_block(Fill(name="f", Count=count))
    s = c.register_block(Scale(name="s"))
    c.connect(f, "Out", s, "In")
    return f, s


@pytest.mark.parametrize("write", [False, True])
def test_a_view_applied_as_differences_shows_what_show_built_shows(write: bool) -> None:
    both = functools.partial(_both, write=write)
    c = Context()
    shower = BuiltShower(c.registry)
    f = c.register_block(Fill(name="f", Count=100))
    chain = [c.register_block(Scale(name=f"s{i}")) for i in range(4)]
    prev = f
    for s in chain:
        c.connect(prev, "Out", s, "In")
        prev = s
    k = c.register_block(AppendFilter(name="k", Capacity=50))
    c.connect(prev, "Out", k, "In")
    ab = object()
    both(c, shower, {(k.id, "Kept"): ab})
    assert chain[0].debug.sizes == {"Out": 100} and k.debug.append == {"Kept": ab}
    first = shower.shown
    both(c, shower, {(k.id, "Kept"): ab})  # nothing changed: nothing written
    assert shower.shown is not None and shower.shown.changed == frozenset() and shower.shown.base == first.serial
    f.set("Count", 200)
    row = SimpleNamespace(
        block_id=chain[2].id, gpu_ms=1.5, runs=None, append={"x": SimpleNamespace(count=1, capacity=2)}
    )
    show_on_blocks(SimpleNamespace(level=ProfilingLevel.DEEP_ASYNC, blocks=(row,)), c.registry)  # a reading since
    assert chain[2].debug.gpu_ms == 1.5 and chain[2].debug.append_fill == {"x": (1, 2)}
    both(c, shower, {})
    assert shower.shown.changed >= {f.id, chain[0].id} and k.debug.append == {}
    both(c, shower, {}, fuse=True)  # fused groups, then gone again
    assert chain[1].debug.fused
    chain[1].name = "renamed"
    both(c, shower, {}, fuse=True)
    both(c, shower, {})
    gone = chain[3]
    c.unregister_block(gone)
    c.connect(chain[2], "Out", k, "In")
    both(c, shower, {})
    c.register_block(gone)  # back, but not wired: not in the build
    both(c, shower, {})
    c.connect(chain[2], "Out", gone, "In")
    both(c, shower, {(k.id, "Kept"): ab})


def test_a_view_compared_with_another_than_the_one_shown_writes_every_block() -> None:
    c = Context()
    shower = BuiltShower(c.registry)
    f, s = _fill_to_scale(c, 10)
    stale = built_view(compile_plan(c.snapshot()), {}, None)
    _both(c, shower, {})
    f.set("Count", 20)
    s.debug.sizes = {"Out": -1}
    view = built_view(compile_plan(c.snapshot()), {}, stale)  # not the view shown
    shower.apply(view, {})
    assert s.debug.sizes == {"Out": 20} and f.debug.sizes == {"Out": 20}


def test_a_block_moved_to_another_engine_and_back_shows_the_first_engines_view() -> None:
    # A block read from engine A's shower, then B's, then A's again: A must attach it again (it still
    # counted the block as its own from the first time, so the block went on reading B's view).
    a, b = Context(), Context()
    shower_a, shower_b = BuiltShower(a.registry), BuiltShower(b.registry)
    f = a.register_block(Fill(name="f", Count=100))
    a.register_block(Fill(name="other", Count=5))
    _show(a, shower_a)
    assert f.debug.sizes == {"Out": 100}
    a.unregister_block(f)
    _show(a, shower_a)
    b.register_block(f)
    f.set("Count", 200)
    _show(b, shower_b)
    assert f.debug.sizes == {"Out": 200}
    b.unregister_block(f)
    _show(b, shower_b)
    a.register_block(f)
    f.set("Count", 300)
    _show(a, shower_a)
    assert f.debug.sizes == {"Out": 300}


def test_an_unregistered_block_keeps_what_it_showed_and_lets_the_engines_view_go() -> None:
    # A block outlives its engine: it must not keep the closed engine's shower (and through its view, the
    # last plan) alive, and it still shows its last sizes, as it did when they were written on it.
    import gc
    import weakref

    c = Context()
    shower = BuiltShower(c.registry)
    f, s = _fill_to_scale(c, 100)
    _show(c, shower)
    assert s.debug.sizes == {"Out": 100}
    gone = weakref.ref(shower)
    for b in list(c.registry):  # what Engine.close does
        c.unregister_block(b)
    del shower, c
    gc.collect()
    assert gone() is None
    assert s.debug.sizes == {"Out": 100} and f.debug.sizes == {"Out": 100}
