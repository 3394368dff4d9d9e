"""Regions and composites in the node editor's model, without a display or a GPU: groups and their
geometry from the members' rectangles, the region-aware auto layout, moving operators into and out of
regions (written back as ``region = "..."`` keeping the file's comments, with undo/redo), moving a
group with what it holds, renaming and deleting a region, loop iterations, and a composite's inside."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest

from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch
from cudapatch.host_plugin.editor_layout import auto_layout, group_rects
from cudapatch.host_plugin.editor_model import EditorModel
from cudapatch.host_plugin.editor_views import GroupView
from cudapatch.host_plugin.patch_writer import PatchDocument

from .plan_engine import PlanOnlyEngine
from .test_editor_model import _open as _open_editor
from .test_editor_model import undo_redo_round_trip

REG = PluginHost().registry
ROOT = Path(__file__).resolve().parents[2]

PATCH = """\
# A loop in a patch: the editor must keep these comments.
links = [
    "fill.Out -> a.In",
    "a.Out -> b.In",   # through the loop
    "b.Out -> after.In",
]

[operators.fill]
type = "core.Fill"
Count = 64

[operators.loop]   # the For region
type = "core.For"
Count = 4

[operators.a]
type = "core.Scale"
region = "loop"    # in the loop's body
Factor = 2.0

[operators.b]
type = "core.Scale"
region = "loop"

[operators.after]
type = "core.Scale"

[operators.check]
type = "core.If"
"""


def _open(tmp_path, text=PATCH, engine=None):
    return _open_editor(tmp_path, text, engine=engine)


def _state(adapter: HostAdapter) -> tuple:
    """What runs: operators with their types and values, the links and which region holds what."""
    ops = []
    for op, type_name in sorted(adapter.operators().items()):
        block = adapter.block(op)
        ops.append((op, type_name, tuple(sorted((n, p.value) for n, p in block.params.items()))))
    links = tuple(sorted((lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()))
    return tuple(ops), links, tuple(sorted(adapter.regions().items()))


def _file_state(path) -> tuple:
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    apply_patch(adapter, load_patch(path, REG))
    return _state(adapter)


def test_groups_say_what_each_region_holds_outer_ones_first(tmp_path):
    _, adapter, _, model = _open(tmp_path)
    nodes = model.nodes()
    assert nodes["a"].region == "loop" and nodes["fill"].region is None
    assert nodes["loop"].kind == "for" and nodes["check"].kind == "if" and nodes["a"].kind == ""
    groups = model.groups()
    assert groups["loop"] == GroupView("loop", "for", ("a", "b"), None, 0)
    assert groups["check"] == GroupView("check", "if", (), None, 0)  # an empty region is a group too
    assert model.place("check", "loop") and model.place("b", "check")
    groups = model.groups()
    assert list(groups) == ["loop", "check"]  # outer first
    assert groups["check"] == GroupView("check", "if", ("b",), "loop", 1)
    assert groups["loop"].members == ("a", "check")
    assert model.holds("loop", "b") and not model.holds("check", "a") and model.region_of("b") == "check"
    assert adapter.regions() == {"a": "loop", "check": "loop", "b": "check"}


def test_group_rects_go_around_the_region_node_and_what_it_holds():
    groups = {
        "outer": GroupView("outer", "while", ("x", "inner"), None, 0),
        "inner": GroupView("inner", "for", ("y",), "outer", 1),
        "empty": GroupView("empty", "if", (), None, 0),
    }
    rects = {
        "outer": (100.0, 100.0, 300.0, 200.0),
        "x": (100.0, 300.0, 300.0, 400.0),
        "inner": (400.0, 120.0, 600.0, 220.0),
        "y": (650.0, 300.0, 850.0, 420.0),
        "empty": (1000.0, 0.0, 1200.0, 90.0),
        "elsewhere": (-500.0, -500.0, -400.0, -400.0),
    }
    frame = (8.0, 40.0, 8.0, 8.0)
    out = group_rects(groups, rects, margin=16.0, frame=frame)
    # The inner group: around its node and y, a margin inside, its frame (title strip on top) around that.
    assert out["inner"] == (400.0 - 24, 120.0 - 56, 850.0 + 24, 420.0 + 24)
    # The outer one holds the inner group whole (imgui-node-editor drags what lies wholly inside).
    assert out["outer"] == (100.0 - 24, out["inner"][1] - 56, out["inner"][2] + 24, 420.0 + 24 + 24)
    ox0, oy0, ox1, oy1 = out["outer"]
    for op in ("outer", "x", "y"):
        x0, y0, x1, y1 = rects[op]
        assert ox0 < x0 and oy0 < y0 and x1 < ox1 and y1 < oy1
    assert out["empty"] == (1000.0 - 24, -56.0, 1200.0 + 24, 90.0 + 24)
    # A title wider than what the group holds widens it; a group with nothing to go around is left out.
    assert group_rects(groups, rects, frame=frame, widths={"empty": 900.0})["empty"][2] == 976.0 + 900.0
    assert group_rects(groups, {}) == {}


def test_auto_layout_puts_a_region_body_inside_its_block():
    links = [
        ("seed", "s", "field", "Init"),
        ("field", "Out", "step", "s"),
        ("step", "next", "field", "In"),  # the FrameDelay's feedback: a cycle the engine allows
        ("step", "next", "paint", "s"),
    ]
    held = {"field": "Steps", "step": "Steps"}
    pos = auto_layout(["seed", "Steps", "field", "step", "paint"], links, held, {"Steps"})
    # The region's node first in its block, its body to the right of it and below it, the block right of
    # what feeds it, what reads the body right of the whole block.
    assert pos["seed"][0] < pos["Steps"][0] <= pos["field"][0] < pos["step"][0] < pos["paint"][0]
    assert pos["Steps"][1] < pos["field"][1]
    assert pos["paint"][0] >= pos["step"][0] + 300.0
    # Without regions it is the plain column layout.
    assert auto_layout(["a", "b"], [("a", "o", "b", "i")]) == {"a": (40.0, 40.0), "b": (340.0, 40.0)}
    # Nested: a region in a region is a block in its block.
    nested = auto_layout(["W", "F", "x", "y"], [("x", "o", "y", "i")], {"F": "W", "x": "F", "y": "W"}, {"W", "F"})
    assert nested["W"][0] < nested["F"][0] <= nested["x"][0] < nested["y"][0]


def test_storing_one_position_leaves_the_others_where_they_were(tmp_path):
    _, _, _, model = _open(tmp_path)
    before = {op: v.position for op, v in model.nodes().items()}
    assert model.move("a", 900.0, 700.0)
    after = {op: v.position for op, v in model.nodes().items()}
    assert after["a"] == (900.0, 700.0)
    assert {op: p for op, p in after.items() if op != "a"} == {op: p for op, p in before.items() if op != "a"}


def test_place_writes_region_keeping_comments_and_undoes(tmp_path):
    path, adapter, reloader, model = _open(tmp_path)
    assert model.place("after", "loop", position=(700.0, 200.0))
    text = path.read_text()
    assert text.count('region = "loop"') == 3 and '[operators.after]\ntype = "core.Scale"\nregion = "loop"\n' in text
    assert "# through the loop" in text and 'region = "loop"    # in the loop\'s body' in text
    assert PatchDocument(text).positions()["after"] == (700.0, 200.0)
    assert adapter.regions()["after"] == "loop" and model.nodes()["after"].region == "loop"
    assert model.place("a", None)  # out of the loop: the key goes, the rest of the table stays
    text = path.read_text()
    assert '[operators.a]\ntype = "core.Scale"\nFactor = 2.0\n' in text and "a" not in adapter.regions()
    assert _file_state(path) == _state(adapter)
    assert reloader.poll() is False and reloader.reloads == 0  # the watcher takes the writes as no change
    assert model.place("b", "loop").message == "unchanged" and len(model._undo) == 2
    model.undo()
    model.undo()
    assert path.read_text() == PATCH and adapter.regions() == {"a": "loop", "b": "loop"}
    model.redo()
    assert adapter.regions()["after"] == "loop" and _file_state(path) == _state(adapter)


def test_place_refusals_give_the_reason_and_change_nothing(tmp_path):
    path, adapter, _, model = _open(tmp_path)
    before = (_state(adapter), path.read_text())
    r = model.place("a", "fill")
    assert not r and "not an If, While or For" in r.message
    assert not model.place("a", "nope") and "no such operator" in model.status
    assert not model.place("nope", "loop") and "unknown operator" in model.status
    assert not model.place("loop", "loop") and "cannot hold itself" in model.status
    assert model.place("check", "loop")
    r = model.place("loop", "check")  # loop holds check: check cannot hold loop
    assert not r and "cannot hold itself" in r.message
    assert not model.create("core.Scale", "s", region="fill") and "not an If, While or For" in model.status
    model.undo()
    assert (_state(adapter), path.read_text()) == before


def test_create_in_a_region_and_rename_and_delete_a_region(tmp_path):
    path, adapter, _, model = _open(tmp_path)
    assert model.create("core.For", "inner", region="loop", position=(500.0, 300.0))
    assert model.create("core.Scale", "c", region="inner")
    text = path.read_text()
    assert '[operators.inner]\ntype = "core.For"\nregion = "loop"\n\n' in text
    assert adapter.regions() == {"a": "loop", "b": "loop", "inner": "loop", "c": "inner"}
    assert model.rename("loop", "outer")  # the operators it holds name it by its new name
    assert adapter.regions() == {"a": "outer", "b": "outer", "inner": "outer", "c": "inner"}
    assert 'region = "loop"' not in path.read_text() and _file_state(path) == _state(adapter)
    assert model.delete("inner")  # what it held moves to the region around it, in the file as in the adapter
    assert adapter.regions() == {"a": "outer", "b": "outer", "c": "outer"}
    assert _file_state(path) == _state(adapter)
    assert model.delete("outer")
    assert adapter.regions() == {} and "region" not in path.read_text() and _file_state(path) == _state(adapter)
    while model.can_undo:
        assert model.undo()
    assert path.read_text() == PATCH and adapter.regions() == {"a": "loop", "b": "loop"}


def test_move_group_moves_what_it_holds_as_one_edit(tmp_path):
    path, _, _, model = _open(tmp_path)
    assert model.create("core.For", "inner", region="loop") and model.place("b", "inner")
    before = {op: v.position for op, v in model.nodes().items()}
    edits = len(model._undo)
    assert model.move_group("loop", 100.0, -20.0)
    assert len(model._undo) == edits + 1
    after = {op: v.position for op, v in model.nodes().items()}
    for op in ("loop", "a", "inner", "b"):
        assert after[op] == pytest.approx((before[op][0] + 100.0, before[op][1] - 20.0)), op
    for op in ("fill", "after", "check"):
        assert after[op] == before[op], op
    assert set(PatchDocument(path.read_text()).positions()) == {"loop", "a", "inner", "b"}
    model.undo()
    assert {op: v.position for op, v in model.nodes().items()} == before
    assert not model.move_group("fill", 1.0, 1.0) and "not a region" in model.status


def test_a_loops_iterations_come_from_the_engine_each_refresh(tmp_path):
    class Counting(PlanOnlyEngine):
        """The engine's iterations API: what the readback ring says a loop ran (here: set by the test)."""

        def __init__(self) -> None:
            super().__init__()
            self.ran: dict[str, int] = {}

        def iterations(self, block):
            return self.ran.get(block.name)

    engine = Counting()
    _, _, _, model = _open(tmp_path, PATCH + '\n[operators.solve]\ntype = "core.While"\nMax = 50\n', engine)
    model.refresh()
    assert model.nodes()["loop"].iterations is None  # no frame read yet
    engine.ran.update(loop=4, solve=50)
    model.refresh()
    assert model.nodes()["loop"].iterations == (4, 4) and model.nodes()["solve"].iterations == (50, 50)
    assert model.nodes()["check"].iterations is None and model.nodes()["fill"].iterations is None
    assert model.set_param("loop", "Count", 9)
    assert model.nodes()["loop"].iterations == (4, 4)  # kept across the rebuild of the views
    model.refresh()
    assert model.nodes()["loop"].iterations == (4, 9)


def test_a_composite_is_one_node_whose_inside_can_be_read(tmp_path):
    for name in ("smooth.toml", "box3.cu", "box3.json"):
        src = ROOT / "examples" / "composites" / name
        if src.exists():
            shutil.copy(src, tmp_path / name)
    text = 'links = ["fill.Out -> smooth.In"]\n\n[operators.fill]\ntype = "core.Fill"\n\n'
    text += f'[operators.smooth]\ntype = "core.Composite"\nPath = "{tmp_path / "smooth.toml"}"\nGain = 2.0\n'
    _, _, _, model = _open(tmp_path, text)
    smooth = model.nodes()["smooth"]
    assert smooth.inner == 3 and smooth.kind == "" and not model.groups()
    inside = model.inside("smooth")
    assert [name for name, _ in inside.blocks] == ["pass1", "pass2", "gain"]
    assert "pass1.out -> pass2.in" in inside.links
    assert ("Gain", "param", "gain.Factor") in inside.exposed
    assert model.inside("fill") is None and model.inside("nope") is None


def _random_region_edit(model: EditorModel, rng: random.Random) -> None:
    ops = list(model.adapter.operators())
    regions = [op for op in ops if model.is_region(op)]
    kind = rng.choice(["create", "region", "place", "place", "out", "move_group", "rename", "delete", "param"])
    if kind == "create" or not ops:
        where = rng.choice([None, *regions]) if regions else None
        model.create(rng.choice(["core.Fill", "core.Scale"]), region=where)
    elif kind == "region":
        model.create(rng.choice(["core.For", "core.If"]), region=rng.choice([None, *regions]) if regions else None)
    elif kind == "place" and regions:
        model.place(rng.choice(ops), rng.choice(regions))  # may be refused (holds itself): fine
    elif kind == "out":
        held = [op for op in ops if model.region_of(op) is not None]
        if held:
            op = rng.choice(held)
            model.place(op, model.region_of(model.region_of(op)))  # type: ignore[arg-type]
    elif kind == "move_group" and regions:
        model.move_group(rng.choice(regions), rng.uniform(-50, 50), rng.uniform(-50, 50))
    elif kind == "rename":
        model.rename(rng.choice(ops), f"n{rng.randrange(10_000)}")
    elif kind == "delete":
        model.delete(rng.choice(ops))
    elif kind == "param":
        op = rng.choice(ops)
        if "Count" in model.adapter.block(op).params:
            model.set_param(op, "Count", rng.randrange(1, 50))


@pytest.mark.parametrize("seed", [3, 4])
def test_undo_redo_over_random_region_edits(tmp_path, seed):
    path, adapter, reloader, model = _open(tmp_path)
    rng = random.Random(seed)
    edit = lambda m: _random_region_edit(m, rng)  # noqa: E731
    undo_redo_round_trip(model, reloader, path, edit, 100, _state, _file_state, PATCH)


def test_a_region_edited_outside_shows_in_the_groups(tmp_path):
    path, adapter, reloader, model = _open(tmp_path)
    assert model.groups()["loop"].members == ("a", "b")
    path.write_text(
        path.read_text().replace(
            '[operators.after]\ntype = "core.Scale"',
            '[operators.after]\ntype = "core.Scale"\nregion = "loop"  # by hand',
        )
    )
    assert reloader.poll(force=True)
    assert model.groups()["loop"].members == ("a", "b", "after") and model.nodes()["after"].region == "loop"
    assert model.place("a", None)  # the editor's next edit keeps the hand-written line
    assert 'region = "loop"  # by hand' in path.read_text() and adapter.regions() == {"b": "loop", "after": "loop"}


def test_a_block_in_a_body_shows_how_often_it_ran(tmp_path):
    from cudapatch.engine.profiling import BlockStats, EngineStats, ProfilingLevel

    _, adapter, _, model = _open(tmp_path)
    rows = (
        BlockStats(adapter.block("a").id, "a", "OK", "", 0.4, runs=4, min_ms=0.09, max_ms=0.11),
        BlockStats(adapter.block("fill").id, "fill", "OK", "", 0.1),
    )
    model.refresh(EngineStats(ProfilingLevel.PER_BLOCK, 7, 1, 1.0, rows, 0, 0, 0))
    assert model.nodes()["a"].runs == 4 and model.nodes()["a"].gpu_ms == 0.4
    assert model.nodes()["fill"].runs is None
