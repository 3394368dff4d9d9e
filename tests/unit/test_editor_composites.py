"""Open composites in the node editor's model, without a display or a GPU: opening one shows its inner
blocks as nodes in a group with its node (inner links as wires, exposed names marked, exposed values as
they run), inner nodes take their states from the composite's diagnostics and their GPU times from the
engine's statistics, only open composites are refreshed, inner edits are refused with the reason (an
exposed parameter sets the composite's), and opening, moving inner nodes, renaming and re-reading the
composite file keep the views right."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudapatch.engine.diagnostics import Diagnostic
from cudapatch.engine.profiling import BlockStats, EngineStats, ProfilingLevel
from cudapatch.host_plugin.editor_layout import group_rects

from .plan_engine import PlanOnlyEngine
from .test_editor_model import _open

TWO = """\
# Two scales and one left unlinked (a warning at run time).
links = ["a.Out -> b.In"]

[composite]
name = "Two"

[operators.a]
type = "core.Scale"
Factor = 0.5

[operators.b]
type = "core.Scale"
Offset = 1.0

[operators.loose]
type = "core.Scale"

[expose]
In = "a.In"
Out = "b.Out"
Gain = "a.Factor"
"""

OUTER = """\
links = ["sub.Out -> c.In"]

[operators.sub]
type = "core.Composite"
Path = "two.toml"

[operators.c]
type = "core.Scale"

[expose]
In = "sub.In"
Out = "c.Out"
"""


def _patch(tmp_path: Path, *, region: bool = False) -> str:
    (tmp_path / "two.toml").write_text(TWO)
    (tmp_path / "outer.toml").write_text(OUTER)
    text = '# the patch\nlinks = ["fill.Out -> two.In", "two.Out -> after.In"]\n\n'
    text += '[operators.fill]\ntype = "core.Fill"\nCount = 64\n\n'
    if region:
        text += '[operators.loop]\ntype = "core.For"\nCount = 3\n\n'
    text += f'[operators.two]\ntype = "core.Composite"\nPath = "{tmp_path / "two.toml"}"\nGain = 3.0\n'
    text += 'region = "loop"\n\n' if region else "\n"
    text += '[operators.after]\ntype = "core.Scale"\n'
    return text


def _model(tmp_path, text=None, engine=None):
    path, adapter, reloader, model = _open(tmp_path, text or _patch(tmp_path), engine=engine)
    adapter.engine.update()
    return path, adapter, reloader, model


class _Diagnosing(PlanOnlyEngine):
    """Diagnostics as the engine's board gives them: a composite's include those on its inner blocks'
    ids (a kernel compile error stays on the inner block), and the test adds some of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.extra: list[Diagnostic] = []
        self.asked = 0

    def diagnostics(self, block=None):
        self.asked += block is not None
        diags = super().diagnostics() + tuple(self.extra)
        if block is None:
            return diags
        ids = {block.id} | {b.id for _, b in block.inner_blocks()} if hasattr(block, "inner_blocks") else {block.id}
        return tuple(d for d in diags if d.block_id in ids)


def test_opening_a_composite_draws_its_inside_as_a_group(tmp_path):
    path, adapter, _, model = _model(tmp_path, engine=PlanOnlyEngine(fuse=False))  # every wire a buffer
    text = path.read_text()
    assert model.nodes()["two"].inner == 3 and not model.groups()
    assert model.open("two") and model.opened == {"two"}
    assert list(model.nodes()) == ["fill", "two", "after"]  # the operators stay the operators
    drawn = model.drawn_nodes()
    assert list(drawn) == ["fill", "two", "after", "two/a", "two/b", "two/loose"]
    assert model.nodes()["two"].opened
    a, b = drawn["two/a"], drawn["two/b"]
    assert (a.type, a.composite) == ("core.Scale", "two")
    assert a.exposed == {"In": "two.In", "Factor": "two.Gain"} and b.exposed == {"Out": "two.Out"}
    # An exposed parameter shows the value that runs (the composite's Gain), the others the file's.
    assert next(p.value for p in a.params if p.name == "Factor") == 3.0
    assert next(p.value for p in b.params if p.name == "Offset") == 1.0
    # Laid out as a region's body is: the composite's node first, its inside in columns by their links
    # (a below it, b right of a), and the operators after it moved aside to make room.
    top = drawn["two"].position
    assert all(v.position[0] >= top[0] and v.position[1] >= top[1] for v in (a, b, drawn["two/loose"]))
    assert a.position == (top[0], top[1] + 220.0) and b.position[0] > a.position[0]
    assert drawn["after"].position[0] > b.position[0] + 200
    assert [str(lk) for lk in model.drawn_links()][-1] == "two/a.Out -> two/b.In"
    assert model.drawn_links()[-1].count == 64  # sizes from the plan, as any wire's
    assert model.groups()["two"].kind == "composite" and model.groups()["two"].members == (
        "two/a",
        "two/b",
        "two/loose",
    )
    rects = {op: (v.position[0], v.position[1], v.position[0] + 200, v.position[1] + 100) for op, v in drawn.items()}
    r = group_rects(model.groups(), rects)["two"]
    assert r[0] < top[0] and r[1] < top[1] and r[3] > a.position[1] + 100  # around the node and its inside
    assert "fed by two.In" in model.port_text("two/a", "In", "in")
    out = model.port_text("two/a", "Out", "out")
    assert "64 elements" in out and "exposed" not in out
    assert "exposed as two.Out" in model.port_text("two/b", "Out", "out")
    # A view: nothing written, nothing to undo.
    assert path.read_text() == text and not model.can_undo
    assert model.close("two") and list(model.drawn_nodes()) == ["fill", "two", "after"] and not model.groups()
    assert model.drawn_nodes() is model.nodes()  # nothing open: no second dict
    assert not model.open("fill") and "not a composite" in model.status
    assert not model.open("nope") and not model.close("two")


def test_inner_edits_are_refused_with_the_reason_and_change_nothing(tmp_path):
    path, adapter, _, model = _model(tmp_path)
    model.open("two")
    text, version = path.read_text(), adapter.engine.updates
    refusals = [
        model.delete("two/a"),
        model.rename("two/a", "x"),
        model.bypass("two/b"),
        model.connect("fill", "Out", "two/loose", "In"),
        model.disconnect("two/a", "Out", "two/b", "In"),
        model.place("two/a", None),
        model.set_param("two/b", "Offset", 4.0),
    ]
    for r in refusals:
        assert not r and "inside composite 'two'" in r.message and "two.toml" in r.message, r
    assert "edit that file" in refusals[0].message
    assert model.link_problem("two/a", "Out", "after", "In") is not None
    assert path.read_text() == text and not model.can_undo and adapter.engine.updates == version
    assert adapter.block("two").inner("b").params["Offset"].value == 1.0
    # An inner parameter the composite exposes sets the composite's: one edit of the patch, undone as one.
    assert model.set_param("two/a", "Factor", 5.0)
    assert adapter.block("two").params["Gain"].value == 5.0 and "Gain = 5.0" in path.read_text()
    assert next(p.value for p in model.drawn_nodes()["two/a"].params if p.name == "Factor") == 5.0
    assert model.undo() and adapter.block("two").params["Gain"].value == 3.0 and path.read_text() == text


def test_inner_nodes_show_the_diagnostics_about_them_and_their_gpu_times(tmp_path):
    engine = _Diagnosing()
    _, adapter, _, model = _model(tmp_path, engine=engine)
    two = adapter.block("two")
    inner_a = two.inner("a")
    model.refresh()
    # Closed: the composite's node shows what its inner blocks have (the plan names the inner block).
    assert model.nodes()["two"].state == "Warning" and "two/loose" in model.nodes()["two"].message
    model.open("two")
    model.refresh()
    drawn = model.drawn_nodes()
    assert drawn["two/loose"].state == "Warning" and "required input 'In'" in drawn["two/loose"].message
    assert drawn["two/a"].state == drawn["two/b"].state == "OK" and drawn["two/a"].message == ""
    # An error kept on the inner block's own id (a kernel that does not compile).
    engine.extra.append(Diagnostic("error", inner_a.id, "kernel-compile", "two/a: fx.cu(3): error: oops"))
    model.refresh()
    assert drawn["two/a"].state == "Error" and "oops" in drawn["two/a"].message
    assert model.nodes()["two"].state == "Error"
    model.close("two")
    model.refresh()
    assert model.nodes()["two"].state == "Error" and "oops" in model.nodes()["two"].message
    # GPU times: the composite's row from the stats, its inner blocks' from ``block_ms``.
    model.open("two")
    rows = (BlockStats(two.id, "two", "Error", "two/a: fx.cu(3): error: oops", 0.5),)
    stats = EngineStats(ProfilingLevel.PER_BLOCK, 9, 1, 1.0, rows, 0, 0, 0, block_ms={inner_a.id: 0.2, two.id: 0.5})
    model.refresh(stats)
    drawn = model.drawn_nodes()
    assert model.nodes()["two"].gpu_ms == 0.5 and drawn["two/a"].gpu_ms == 0.2 and drawn["two/b"].gpu_ms is None
    assert drawn["two/a"].state == "Error"


def test_only_open_composites_are_refreshed_each_frame(tmp_path):
    engine = _Diagnosing()
    _, adapter, _, model = _model(tmp_path, engine=engine)
    rows = tuple(BlockStats(adapter.block(op).id, op, "OK", "", None) for op in ("fill", "two", "after"))
    stats = EngineStats(ProfilingLevel.NONE, 9, 1, None, rows, 0, 0, 0)
    asked = engine.asked
    for _ in range(5):
        model.refresh(stats)
    assert engine.asked == asked  # closed: its inside is never looked at
    model.open("two")
    for _ in range(5):
        model.refresh(stats)
    assert engine.asked == asked + 5  # open: its diagnostics once a frame


def test_nested_composites_open_inside_each_other(tmp_path):
    _patch(tmp_path)
    text = 'links = ["fill.Out -> o.In"]\n\n[operators.fill]\ntype = "core.Fill"\n\n'
    text += f'[operators.o]\ntype = "core.Composite"\nPath = "{tmp_path / "outer.toml"}"\n'
    engine = _Diagnosing()
    _, adapter, _, model = _model(tmp_path, text, engine)
    model.open("o")
    model.refresh()
    drawn = model.drawn_nodes()
    assert {"o/sub", "o/c"} <= set(drawn) and "o/sub/a" not in drawn
    assert drawn["o/sub"].inner == 3 and drawn["o/sub"].source == "two.toml"
    # A closed composite inside shows what its inner blocks have.
    assert drawn["o/sub"].state == "Warning" and "o/sub/loose" in drawn["o/sub"].message
    assert model.open("o/sub")
    drawn = model.drawn_nodes()
    assert {"o/sub/a", "o/sub/b", "o/sub/loose"} <= set(drawn) and drawn["o/sub"].opened
    groups = model.groups()
    assert list(groups) == ["o", "o/sub"] and groups["o/sub"].parent == "o" and groups["o/sub"].depth == 1
    assert "o/sub" in groups["o"].members and drawn["o/sub/a"].composite == "o/sub"
    assert drawn["o/sub/a"].exposed == {"In": "sub.In", "Factor": "sub.Gain"}
    assert "o/sub/a.Out -> o/sub/b.In" in [str(lk) for lk in model.drawn_links()]
    model.refresh()
    assert drawn["o/sub/loose"].state == "Warning" and drawn["o/sub/a"].state == "OK"
    # A parameter exposed by the inner composite only is not the patch's to set.
    assert not model.set_param("o/sub/a", "Factor", 2.0)
    assert model.close("o") and model.opened == frozenset()
    assert model.open("o") and "o/sub/a" not in model.drawn_nodes()  # closing the outer closed the inner


def test_a_composite_in_a_region_is_a_group_inside_its_group(tmp_path):
    _, _, _, model = _model(tmp_path, _patch(tmp_path, region=True))
    model.open("two")
    groups = model.groups()
    assert list(groups) == ["loop", "two"] and groups["two"].parent == "loop" and groups["two"].depth == 1
    assert not model.is_region("two")  # nothing can be placed into a composite
    drawn = model.drawn_nodes()
    rects = {op: (v.position[0], v.position[1], v.position[0] + 200, v.position[1] + 100) for op, v in drawn.items()}
    r = group_rects(groups, rects)
    assert r["loop"][0] < r["two"][0] and r["loop"][3] > r["two"][3]  # the region's frame holds the composite's


def test_inner_places_stay_for_the_session_and_follow_the_composite(tmp_path):
    path, _, _, model = _model(tmp_path)
    model.open("two")
    text = path.read_text()
    assert model.move_many({"two/b": (900.0, 700.0)})
    assert model.drawn_nodes()["two/b"].position == (900.0, 700.0) and path.read_text() == text
    x, y = model.nodes()["two"].position
    # The composite's group dragged: its node and inside move together; only the node is written.
    moved = {op: (v.position[0] + 50, v.position[1] + 20) for op, v in model.drawn_nodes().items() if "two" in op}
    assert model.move_many(moved)
    assert model.nodes()["two"].position == (x + 50, y + 20)
    assert model.drawn_nodes()["two/b"].position == (950.0, 720.0)
    assert "two/" not in path.read_text()
    assert model.rename("two", "pair") and model.opened == {"pair"}
    assert model.drawn_nodes()["pair/b"].position == (950.0, 720.0)
    assert model.delete("pair") and model.opened == frozenset() and not model.groups()


def test_a_composite_file_read_again_makes_the_inside_again(tmp_path):
    _, adapter, _, model = _model(tmp_path)
    model.open("two")
    model.refresh()
    (tmp_path / "two.toml").write_text(TWO.replace("[operators.loose]", "[operators.extra]"))
    adapter.block("two").refresh()  # what the standalone host's CompositeReloader does
    model.refresh()
    assert "two/extra" in model.drawn_nodes() and "two/loose" not in model.drawn_nodes()


@pytest.mark.parametrize("op", ["two/a", "two/nope"])
def test_an_inner_node_of_a_closed_composite_is_no_node(tmp_path, op):
    _, _, _, model = _model(tmp_path)
    assert model.inner_problem(op) == f"no node '{op}' (its composite is not open)"
    assert not model.move_many({op: (1.0, 2.0)})


def test_an_inner_wire_can_be_probed_while_its_composite_is_open(tmp_path):
    _, adapter, _, model = _model(tmp_path, engine=PlanOnlyEngine(fuse=False))
    engine = adapter.engine
    a = adapter.block("two").inner("a")
    assert not model.probe("two/a", "Out")  # closed: no such node
    model.open("two")
    assert model.probe("two/a", "Out") and ("two/a", "Out") in model.probes
    assert engine.context.probes == {(a.id, "Out"): None}
    engine.update()
    assert (a.id, "Out") in engine.plan.probes  # a probe node on the inner block's output
    assert model.close("two") and not model.probes and not engine.context.probes
    # A composite deleted with a probe inside takes it along; a file read again drops the old block's.
    model.open("two")
    assert model.probe("two/a", "Out")
    assert model.delete("two") and not engine.context.probes
    assert model.nodes() and not model.probes
    assert model.undo()
    model.open("two")
    assert model.probe("two/b", "Out")
    (tmp_path / "two.toml").write_text(TWO.replace("Offset = 1.0", "Offset = 2.0"))
    adapter.block("two").refresh()
    model.refresh()  # sees the new inside: the views are made again, without the old block's probe
    assert model.nodes() and not model.probes and not engine.context.probes


def _random_edit(model, rng) -> None:
    """An edit of the patch, or a look inside its composite (open, close, an inner edit: set through an
    exposed parameter, or refused)."""
    kind = rng.choice(["open", "close", "gain", "inner", "refused", "move", "param"])
    ops = list(model.adapter.operators())
    comps = [op for op in ops if model.nodes()[op].inner]
    if kind == "open" and comps:
        model.open(rng.choice(comps))
    elif kind == "close" and model.opened:
        model.close(rng.choice(sorted(model.opened)))
    elif kind == "gain" and comps:
        model.set_param(rng.choice(comps), "Gain", rng.uniform(0.1, 4.0))
    elif kind == "inner" and model.opened:
        model.set_param(f"{sorted(model.opened)[0]}/a", "Factor", rng.uniform(0.1, 4.0))
    elif kind == "refused" and model.opened:
        top = sorted(model.opened)[0]
        assert not rng.choice([model.delete, model.bypass])(f"{top}/b")
    elif kind == "move":
        op = rng.choice(ops)
        model.move(op, rng.uniform(0, 900), rng.uniform(0, 600))
    else:
        model.set_param("fill", "Count", rng.randrange(1, 200))


@pytest.mark.parametrize("seed", [5, 6])
def test_undo_redo_with_composites_opened_and_closed_between_edits(tmp_path, seed):
    import random

    from .test_editor_model import _file_state, _state, undo_redo_round_trip

    text = _patch(tmp_path)
    path, _, reloader, model = _model(tmp_path, text)
    rng = random.Random(seed)
    undo_redo_round_trip(model, reloader, path, lambda m: _random_edit(m, rng), 60, _state, _file_state, text)


def test_the_engines_statistics_carry_the_inner_blocks_gpu_times(tmp_path):
    """``EngineStats.block_ms`` holds every timed block, the composite's inner ones among them, while
    ``blocks`` keeps one row per registered block (the composite's: the span of its inner blocks)."""
    from types import SimpleNamespace

    import numpy as np

    from cudapatch.engine import compile_plan
    from cudapatch.engine.stats import FrameReading, collect_stats

    _, adapter, _, _ = _model(tmp_path, engine=PlanOnlyEngine(fuse=False))
    engine = adapter.engine
    plan = compile_plan(engine.context.snapshot(), level=ProfilingLevel.PER_BLOCK, fuse=False)
    slots = max(max(p.start, p.end) for p in plan.timings) + 1
    stamps = np.arange(slots, dtype=np.uint64) * 1_000_000  # 1 ms between slots, in order
    graph = SimpleNamespace(plan=plan, readback=None, occupancy={}, kernel_count=0)
    pool = SimpleNamespace(in_use_bytes=0, total_allocated_bytes=0)
    stats = collect_stats(
        level=plan.level,
        blocks=engine.context.registry,
        graph=graph,
        reading=FrameReading(3, 1, stamps),
        pool=pool,
        diagnostics=(),
    )
    two = adapter.block("two")
    a, b = two.inner("a"), two.inner("b")
    assert {a.id, b.id, two.id} <= set(stats.block_ms)
    row = next(r for r in stats.blocks if r.block_id == two.id)
    assert row.gpu_ms == stats.block_ms[two.id] >= max(stats.block_ms[a.id], stats.block_ms[b.id]) > 0
    assert {r.block_id for r in stats.blocks} == {adapter.block(op).id for op in ("fill", "two", "after")}
