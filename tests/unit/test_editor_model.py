"""The node editor's model and actions, driven without a mouse: write-back that keeps the file's
comments and order (and that the file watcher takes as no change), refusals with reasons, a read-only
file, an edit made outside, and undo/redo over seeded random edit sequences."""

from __future__ import annotations

import random
import stat

import pytest

from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch, parse_patch
from cudapatch.host_plugin.editor_layout import auto_layout
from cudapatch.host_plugin.editor_model import EditorModel
from cudapatch.host_plugin.hosts.live_reload import PatchReloader
from cudapatch.host_plugin.patch_writer import PatchDocument

from .plan_engine import PlanOnlyEngine
from .test_patch_bypass import _Calls as _BypassCalls

REG = PluginHost().registry

PATCH = """\
# A small chain, with comments the editor must keep.
links = [
    "fill.Out -> scale.In",  # the first wire
]

[engine]
profiling = "None"

# The source.
[operators.fill]
type = "core.Fill"
Count = 128    # elements
Value = 0.5

[operators.scale]
type = "core.Scale"
Factor = 2.0

[operators.add]
type = "core.VectorAdd"
"""


class _Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0  # every poll is past the poll interval
        return self.t


def _open(tmp_path, text=PATCH, adapter_cls=HostAdapter, engine=None):
    """``text`` saved and applied (to ``engine``, by default one that only plans), reloaded from its file,
    and the editor's model of it: ``(path, adapter, reloader, model)``."""
    path = tmp_path / "patch.toml"
    path.write_text(text)
    patch = load_patch(path, REG)
    adapter = adapter_cls(engine or PlanOnlyEngine(), REG)
    apply_patch(adapter, patch)
    reloader = PatchReloader(
        path, patch, load=lambda p: load_patch(p, REG), apply=lambda n, o: apply_patch(adapter, n, o), clock=_Clock()
    )
    model = EditorModel(adapter, patch, path=path, adopt=reloader.adopt, current=lambda: reloader.patch)
    return path, adapter, reloader, model


def _state(adapter: HostAdapter) -> tuple:
    """What runs: operators with their types and values, and the links."""
    ops = []
    for op, type_name in sorted(adapter.operators().items()):
        block = adapter.block(op)
        ops.append((op, type_name, tuple(sorted((n, p.value) for n, p in block.params.items()))))
    links = tuple(sorted((lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()))
    return tuple(ops), links


def _file_state(path) -> tuple:
    """What the file says, applied to a fresh adapter: it must equal what runs."""
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    apply_patch(adapter, load_patch(path, REG))
    return _state(adapter)


def test_views_carry_pins_params_ranges_and_wire_sizes(tmp_path):
    _, adapter, _, model = _open(tmp_path)
    adapter.engine.update()
    nodes = model.nodes()
    assert list(nodes) == ["fill", "scale", "add"]
    fill = nodes["fill"]
    assert fill.type == "core.Fill" and "Count" in fill.doc
    assert [p.name for p in fill.outputs] == ["Out"] and fill.outputs[0].type == "float[]"
    count = next(p for p in fill.params if p.name == "Count")
    assert count.integer and count.value == 128 and count.structural
    assert [p.name for p in nodes["add"].inputs] == ["A", "B"]
    # Unplaced nodes are laid out by depth: fill left of scale.
    assert fill.position[0] < nodes["scale"].position[0]
    (link,) = model.links()
    assert str(link) == "fill.Out -> scale.In" and link.type == "float[]"
    model.version += 1  # the plan exists now: wire sizes come from it
    (link,) = model.links()
    assert link.count == 128 and link.nbytes == 512
    model.refresh()
    assert nodes["fill"].state == "OK" or model.nodes()["fill"].state == "OK"


def test_param_widgets_follow_the_declared_types():
    from cudapatch.blocks.description import ParamSpec
    from cudapatch.host_plugin.editor_views import param_view
    from cudapatch.kernels.types import DType

    assert param_view(ParamSpec("Spread", DType.FLOAT32, 0.3, 0.0, 1.0), 0.3).widget == "slider"
    assert param_view(ParamSpec("Curl", DType.FLOAT32, 1.0), 1.0).widget == "drag"
    assert param_view(ParamSpec("Young", DType.FLOAT3, (1, 1, 1)), (1, 1, 1)).widget == "color"
    assert param_view(ParamSpec("Gravity", DType.FLOAT3, (0, 0, 0)), (0, 0, 0)).widget == "vector"
    assert param_view(ParamSpec("TransA", DType.INT32, 0, 0, 1), 0).widget == "checkbox"
    assert param_view(ParamSpec("Code", None, "", kind="text"), "").widget == "code"


def test_write_back_keeps_comments_and_order_and_the_watcher_sees_no_change(tmp_path):
    path, adapter, reloader, model = _open(tmp_path)
    assert model.set_param("scale", "Factor", 3.5)
    text = path.read_text()
    assert text == PATCH.replace("Factor = 2.0", "Factor = 3.5")  # only that line changed
    assert adapter.block("scale").params["Factor"].value == 3.5
    assert model.connect("fill", "Out", "add", "A") and model.connect("scale", "Out", "add", "B")
    assert model.move("fill", 12.0, 34.5)
    assert model.create("core.Scale", "gain", position=(400.0, 80.0), params={"Factor": 0.25})
    assert model.rename("scale", "double")
    text = path.read_text()
    for line in (
        "# A small chain, with comments the editor must keep.",
        "# the first wire",
        "# The source.",
        "Count = 128    # elements",
        '"fill.Out -> double.In"',
        "[operators.double]",
    ):
        assert line in text
    assert text.index("[operators.fill]") < text.index("[operators.double]") < text.index("[operators.add]")
    assert text.index("[operators.add]") < text.index("[operators.gain]")
    assert PatchDocument(text).positions() == {"fill": (12.0, 34.5), "gain": (400.0, 80.0)}
    assert _file_state(path) == _state(adapter)
    # The watcher takes the editor's writes as no change.
    assert reloader.poll() is False and reloader.poll(force=False) is False and reloader.reloads == 0
    assert model.nodes()["fill"].position == (12.0, 34.5)


def test_live_drag_is_one_edit_written_at_the_end(tmp_path):
    path, adapter, _, model = _open(tmp_path)
    for v in (2.1, 2.2, 2.3):
        assert model.set_param("scale", "Factor", v, live=True)
    assert adapter.block("scale").params["Factor"].value == 2.3
    assert "Factor = 2.0" in path.read_text()  # nothing written during the drag
    model.end_live()
    assert "Factor = 2.3" in path.read_text()
    model.undo()
    assert adapter.block("scale").params["Factor"].value == 2.0 and "Factor = 2.0" in path.read_text()


def test_refusals_give_the_reason_and_change_nothing(tmp_path):
    path, adapter, _, model = _open(tmp_path)
    model.create("linalg.LUSolve", "lu")
    before, text = _state(adapter), path.read_text()
    r = model.connect("lu", "Info", "add", "A")
    assert not r and "int[]" in r.message and "float[]" in r.message
    r = model.connect("fill", "Out", "scale", "In")
    assert not r and "already linked" in r.message
    assert not model.connect("add", "Sum", "add", "A")
    assert not model.rename("fill", "scale") and "exists" in model.status
    assert not model.rename("fill", "bad name")
    assert not model.create("core.Nope")
    r = model.set_param("fill", "Count", -3)
    assert not r and "Count" in r.message
    assert not model.bypass("nope") and "unknown operator" in model.status
    assert _state(adapter) == before and path.read_text() == text


def test_a_refused_link_marks_its_target_pin_until_the_next_edit(tmp_path):
    path, adapter, _, model = _open(tmp_path)
    model.create("linalg.LUSolve", "lu")
    assert model.refusals() == {}
    r = model.connect("lu", "Info", "add", "A")  # int[] into float[]
    assert not r and model.refusals() == {("add", "A"): r.message} and "int[]" in r.message
    already = model.connect("add", "Sum", "scale", "In")
    assert model.refusals()[("scale", "In")] == already.message and "already linked" in already.message
    # A cycle passes the editor's own checks: the engine refuses it, and the reason still lands at the pin.
    assert model.create("core.Scale", "s2") and model.refusals() == {}  # an edit clears the marks
    assert model.connect("add", "Sum", "s2", "In")
    before, text = _state(adapter), path.read_text()
    cycle = model.connect("s2", "Out", "add", "A")
    assert not cycle and "cycle" in cycle.message and model.refusals() == {("add", "A"): cycle.message}
    assert _state(adapter) == before and path.read_text() == text
    model.refusals().clear()  # a copy: the caller cannot unmark a pin
    assert ("add", "A") in model.refusals()
    assert model.set_param("fill", "Value", 0.25) and model.refusals() == {}


def test_read_only_file_keeps_the_edit_in_memory(tmp_path):
    path, adapter, reloader, model = _open(tmp_path)
    path.chmod(stat.S_IRUSR | stat.S_IRGRP)
    try:
        assert model.set_param("fill", "Value", 0.75)
        assert adapter.block("fill").params["Value"].value == 0.75
        assert model.unsaved and "kept in memory" in model.status and "Value = 0.5" in path.read_text()
        assert reloader.poll() is False  # nothing changed on disk
    finally:
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)
    assert model.set_param("scale", "Factor", 4.0)
    assert not model.unsaved and "Value = 0.75" in path.read_text() and "Factor = 4.0" in path.read_text()


def test_an_edit_made_outside_merges_and_clears_the_history(tmp_path):
    path, adapter, reloader, model = _open(tmp_path)
    model.set_param("fill", "Value", 0.25)
    path.write_text(path.read_text().replace("Factor = 2.0", "Factor = 9.0  # by hand"))
    assert reloader.poll(force=True)
    assert adapter.block("scale").params["Factor"].value == 9.0
    model.nodes()
    assert "edited outside" in model.status and not model.can_undo
    assert model.set_param("fill", "Count", 64)
    text = path.read_text()
    assert "Factor = 9.0  # by hand" in text and "Count = 64" in text and "Value = 0.25" in text


def test_bypass_goes_through_the_adapter_and_is_stored(tmp_path):
    path, adapter, _, model = _open(tmp_path, adapter_cls=_BypassCalls)
    assert model.bypass("scale") and adapter.flags() == {"scale"}
    assert PatchDocument(path.read_text()).bypassed() == ["scale"] and model.nodes()["scale"].bypassed
    model.undo()
    assert adapter.flags() == set() and PatchDocument(path.read_text()).bypassed() == []
    model.redo()
    assert adapter.flags() == {"scale"}
    assert adapter.calls == [("scale", True), ("scale", False), ("scale", True)]  # each change once


def test_a_bypass_in_the_file_is_applied_once_on_load_and_an_outside_edit_toggles_it(tmp_path):
    text = PATCH + '\n[editor]\nbypassed = ["scale"]\n'
    path, adapter, reloader, model = _open(tmp_path, text=text, adapter_cls=_BypassCalls)
    # apply_patch bypassed it on load; the editor opening on it sets nothing again
    assert adapter.flags() == {"scale"} and adapter.calls == [("scale", True)] and model.nodes()["scale"].bypassed
    path.write_text(path.read_text().replace('bypassed = ["scale"]', 'bypassed = ["fill"]'))
    assert reloader.poll(force=True)
    assert adapter.flags() == {"fill"} and adapter.calls[1:] == [("fill", True), ("scale", False)]
    views = model.nodes()
    assert views["fill"].bypassed and not views["scale"].bypassed and len(adapter.calls) == 3


def _random_edit(model: EditorModel, rng: random.Random) -> None:
    ops = list(model.adapter.operators())
    kind = rng.choice(["create", "create", "delete", "connect", "connect", "disconnect", "rename", "param", "move"])
    if kind == "create" or not ops:
        model.create(rng.choice(["core.Fill", "core.Scale", "core.VectorAdd"]))
    elif kind == "delete":
        model.delete(rng.choice(ops))
    elif kind == "connect":
        views = model.nodes()
        outs = [(v.name, p.name) for v in views.values() for p in v.outputs]
        ins = [(v.name, p.name) for v in views.values() for p in v.inputs]
        if outs and ins:
            model.connect(*rng.choice(outs), *rng.choice(ins))  # may be refused (a cycle, linked): fine
    elif kind == "disconnect":
        links = model.adapter.links()
        if links:
            lk = rng.choice(links)
            model.disconnect(lk.src, lk.src_port, lk.dst, lk.dst_port)
    elif kind == "rename":
        model.rename(rng.choice(ops), f"n{rng.randrange(10_000)}")
    elif kind == "param":
        op = rng.choice(ops)
        params = [n for n, p in model.adapter.block(op).params.items() if p.spec.kind != "text"]
        if params:
            name = rng.choice(params)
            model.set_param(op, name, rng.randrange(1, 500) if name == "Count" else round(rng.uniform(-4, 4), 3))
    else:
        model.move(rng.choice(ops), rng.uniform(0, 900), rng.uniform(0, 900))


def undo_redo_round_trip(model, reloader, path, edit, edits: int, state, file_state, original: str) -> None:
    """Make ``edits`` undoable edits with ``edit(model)`` (the file on disk matching the model after
    each), undo them all back to ``original``, redo them all: every step must show the state and
    file text it had, and the file watcher must see none of the editor's own writes."""
    adapter = model.adapter
    history = [(state(adapter), path.read_text())]
    while len(model._undo) < edits:
        depth = len(model._undo)
        edit(model)
        if len(model._undo) > depth:
            history.append((state(adapter), path.read_text()))
            assert file_state(path) == state(adapter)
    for expected in reversed(history[:-1]):
        assert model.undo()
        assert (state(adapter), path.read_text()) == expected
    assert not model.undo()
    assert path.read_text() == original
    for expected in history[1:]:
        assert model.redo()
        assert (state(adapter), path.read_text()) == expected
    assert reloader.poll() is False and reloader.reloads == 0


@pytest.mark.parametrize("seed", [1, 2])
def test_undo_redo_over_random_edit_sequences(tmp_path, seed):
    path, adapter, reloader, model = _open(tmp_path)
    rng = random.Random(seed)
    undo_redo_round_trip(model, reloader, path, lambda m: _random_edit(m, rng), 120, _state, _file_state, PATCH)


def test_undo_and_redo_say_what_they_undid_and_redid(tmp_path):
    _, _, _, model = _open(tmp_path)
    assert model.set_param("fill", "Value", 2.0) and model.set_param("fill", "Value", 3.0)
    assert [model.undo().message for _ in range(2)] == ["undone: set fill.Value"] * 2
    assert model.redo().message == "redone: set fill.Value" == model.status
    assert model.undo() and not model.undo() and model.undo().message == "nothing to undo"


def test_history_is_bounded(tmp_path):
    _, _, _, model = _open(tmp_path)
    model.max_history = 150
    for i in range(160):
        model.set_param("fill", "Value", float(i))
    assert len(model._undo) == 150


def test_auto_layout_columns_follow_the_links():
    pos = auto_layout(["a", "b", "c", "d"], [("a", "o", "b", "i"), ("b", "o", "c", "i"), ("a", "o", "c", "j")])
    assert pos["a"][0] < pos["b"][0] < pos["c"][0] and pos["d"][0] == pos["a"][0] and pos["d"][1] > pos["a"][1]


def test_the_patch_loader_accepts_the_editor_table():
    p = parse_patch(PATCH + '\n[editor]\nbypassed = ["fill"]\n\n[editor.positions]\nfill = [1.0, 2.0]\n', registry=REG)
    assert set(p.operators) == {"fill", "scale", "add"}


def test_wire_and_pin_tooltips_show_type_shape_and_bytes(tmp_path):
    from cudapatch.host_plugin.editor_views import LinkView

    _, adapter, _, model = _open(tmp_path)
    adapter.engine.update()
    model.version += 1
    (link,) = model.links()
    assert link.shape == "" and link.size_text == "float[]  128 elements, 512 bytes"
    assert model.port_text("fill", "Out", "out").startswith("fill.Out\nfloat[]  128 elements, 512 bytes")
    assert model.port_text("scale", "In", "in").startswith("scale.In\nfloat[]  128 elements, 512 bytes")
    assert model.port_text("add", "A", "in").startswith("float[]  not linked")
    image = LinkView("cam", "Out", "blur", "In", "uchar4[]", 1080 * 1920, 1080 * 1920 * 4, "1080x1920")
    assert image.size_text == "uchar4[] 1080x1920  2,073,600 elements, 8,294,400 bytes"
    assert LinkView("a", "b", "c", "d", "float[]").size_text == "float[]  not built yet"
