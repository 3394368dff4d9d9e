"""A live edit of a patch file is all or nothing: an edit the engine would refuse at a link, a region or
a kept output is refused before the running patch is touched, and one that fails part way is undone.
The real ``HostAdapter``, ``apply_patch`` and ``Context`` (``PlanOnlyEngine``), and the real
``PatchReloader`` of the standalone host; a refused loop names its blocks, its file and its line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cudapatch import Engine
from cudapatch.blocks.block import Block
from cudapatch.blocks.description import like
from cudapatch.engine import build as build_module
from cudapatch.engine import engine as engine_module
from cudapatch.engine import resources as resources_module
from cudapatch.errors import KernelLoadError, PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch, parse_patch
from cudapatch.host_plugin.hosts.live_reload import PatchReloader
from cudapatch.kernels.source import bundled_kernel

from .plan_engine import PlanOnlyEngine
from .test_engine_orchestration import FakeBuilder, FakeDevice, FakeGraph, FakeModules

REG = PluginHost().registry

BASE = """\
links = ["f.Out -> a.In", "a.Out -> b.In", "b.Out -> d.In"]

[operators.f]
type = "core.Fill"
Count = 64

[operators.a]
type = "core.Scale"
Factor = 2.0

[operators.b]
type = "core.Scale"
Factor = 3.0

[operators.d]
type = "core.Scale"

[editor]
bypassed = ["d"]
"""

# The audit's reproduction: adds c, sets b.Factor = 5, and closes a -> b -> a (b.Out replaces f.Out into a.In).
LOOP_EDIT = """\
links = ["a.Out -> b.In", "b.Out -> d.In", "b.Out -> a.In", "b.Out -> c.In"]

[operators.f]
type = "core.Fill"
Count = 64

[operators.a]
type = "core.Scale"
Factor = 2.0

[operators.b]
type = "core.Scale"
Factor = 5.0

[operators.c]
type = "core.Scale"

[operators.d]
type = "core.Scale"

[editor]
bypassed = ["d"]
"""


def _state(adapter: HostAdapter) -> dict:
    """Everything a failed edit must leave as it was: operators (by block object), links, regions,
    values and bypass flags."""
    ops = adapter.operators()
    return {
        "ops": ops,
        "blocks": {op: adapter.block(op) for op in ops},
        "links": set(adapter.links()),
        "regions": adapter.regions(),
        "values": {op: {k: p.value for k, p in adapter.block(op).params.items()} for op in ops},
        "bypassed": {op: adapter.bypassed(op) for op in ops},
    }


def _running(text: str, registry=REG) -> tuple[PlanOnlyEngine, HostAdapter, object]:
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry)
    patch = parse_patch(text, path="p.toml", registry=registry)
    apply_patch(adapter, patch)
    engine.update()
    assert engine.errors == ()
    engine.context.dirty.clear_structure()
    return engine, adapter, patch


def test_a_loop_closed_by_a_reload_is_refused_before_anything_changes() -> None:
    engine, adapter, base = _running(BASE)
    before = _state(adapter)
    edit = parse_patch(LOOP_EDIT, path="p.toml", registry=REG)
    with pytest.raises(PatchFileError) as info:
        apply_patch(adapter, edit, base)
    err = info.value
    assert err.file == "p.toml" and err.line == 1 and err.block == "a" and err.port == "In"
    assert err.message.startswith("link b.Out -> a.In: linking b.Out to a.In would make a cycle")
    assert err.message.endswith("(loop: b -> a -> b)")
    assert "c" not in adapter.operators() and adapter.block("b").get("Factor") == 3.0
    assert _state(adapter) == before  # the same blocks, links, values and flags
    assert not engine.context.dirty.structure and not engine.context.dirty.params  # nothing to rebuild
    engine.update()
    assert engine.errors == () and {b.name for b in engine.context.registry} == {"f", "a", "b", "d"}


def test_a_loop_through_three_blocks_names_each_of_them() -> None:
    text = BASE.replace('"b.Out -> d.In"]', '"b.Out -> d.In", "d.Out -> a.In"]')  # a -> b -> d -> a
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    with pytest.raises(PatchFileError, match=r"\(loop: d -> a -> b -> d\)$") as info:
        apply_patch(adapter, parse_patch(text, path="loop.toml", registry=REG))
    assert info.value.file == "loop.toml" and info.value.line == 1
    assert adapter.operators() == {}  # a first load that fails builds nothing either


def test_a_loop_through_a_frame_delay_is_no_loop_to_refuse() -> None:
    engine, adapter, base = _running(BASE)
    text = BASE.replace('"b.Out -> d.In"]', '"b.Out -> d.In", "b.Out -> z.In", "z.Out -> a.In"]')
    text += '\n[operators.z]\ntype = "core.FrameDelay"\nCount = 64\n'
    counts = apply_patch(adapter, parse_patch(text, path="p.toml", registry=REG), base)
    assert (
        counts["created"] == 1
        and counts["links"] == 2
        and ("z", "Out", "a", "In") in {(lk.src, lk.src_port, lk.dst, lk.dst_port) for lk in adapter.links()}
    )
    engine.update()
    assert engine.errors == ()


def test_a_reload_that_deletes_an_operator_and_closes_a_loop_keeps_the_operator() -> None:
    engine, adapter, base = _running(BASE)
    before = _state(adapter)
    text = LOOP_EDIT.replace('[operators.d]\ntype = "core.Scale"\n', "").replace(', "b.Out -> d.In"', "")
    with pytest.raises(PatchFileError, match="would make a cycle"):
        apply_patch(adapter, parse_patch(text.replace('bypassed = ["d"]', ""), path="p.toml", registry=REG), base)
    assert _state(adapter) == before and adapter.bypassed("d")


def test_a_feedback_type_mismatch_in_a_file_is_refused_before_anything_changes() -> None:
    engine, adapter, base = _running(BASE)
    before = _state(adapter)
    text = BASE.replace('"b.Out -> d.In"]', '"b.Out -> d.In", "b.Out -> z.In"]')
    text += '\n[operators.z]\ntype = "core.FrameDelay"\nType = "int"\nCount = 64\n'
    with pytest.raises(PatchFileError) as info:
        apply_patch(adapter, parse_patch(text, path="p.toml", registry=REG), base)
    assert "element types differ" in info.value.message and info.value.line == 1 and info.value.block == "z"
    assert _state(adapter) == before and not engine.context.dirty.structure


def test_a_kept_output_that_does_not_exist_is_refused_before_anything_changes() -> None:
    engine, adapter, base = _running(BASE)
    before = _state(adapter)
    text = BASE.replace("Factor = 3.0", "Factor = 4.0") + '\n[engine]\nkeep = ["b.Nope"]\n'
    with pytest.raises(PatchFileError, match="keep: no such port 'Nope' on 'b'") as info:
        apply_patch(adapter, parse_patch(text, path="p.toml", registry=REG), base)
    assert info.value.line == len(text.splitlines()) and _state(adapter) == before


# -- an edit that fails part way ---------------------------------------------------------------------
class _ReadOnce(Block):
    """A plugin block described from a source that is gone once read (a kernel file deleted between
    ``apply_patch``'s check and its build): the check passes, the build fails."""

    type_name = "ReadOnce"
    reads = 0

    def describe(self, b) -> None:
        type(self).reads += 1
        if type(self).reads > 1:
            raise KernelLoadError("its source is gone", block=self.name)
        k = b.add_kernel(bundled_kernel("scale"))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        b.scalar("Factor", k.in_(2), default=1.0)
        b.scalar("Offset", k.in_(3), default=0.0)
        k.auto_grid(like("In"), count_param=4)


def test_an_edit_that_fails_part_way_is_undone(tmp_path: Path) -> None:
    registry = PluginHost().registry
    registry.add(_ReadOnce, name="test.ReadOnce")
    engine, adapter, base = _running(BASE, registry)
    before = _state(adapter)
    _ReadOnce.reads = 0
    # Deletes d, changes f, swaps b to an Expression, adds c, relinks, and fails at the last operator.
    edit = """\
links = ["f.Out -> a.In", "a.Out -> c.In", "c.Out -> b.In", "b.Out -> r.In"]

[operators.f]
type = "core.Fill"
Count = 128

[operators.a]
type = "core.Scale"
Factor = 2.0

[operators.b]
type = "core.Expression"
Code = "In * 4.0"
Inputs = "In"

[operators.c]
type = "core.Scale"
Factor = 5.0

[operators.r]
type = "test.ReadOnce"
"""
    with pytest.raises(PatchFileError, match="its source is gone") as info:
        apply_patch(adapter, parse_patch(edit, path="p.toml", registry=registry), base)
    assert info.value.block == "r" and info.value.line == edit.splitlines().index("[operators.r]") + 1
    after = _state(adapter)
    assert after["ops"] == before["ops"]  # c and r gone, d back, b a Scale again
    for op in ("f", "a", "d"):  # untouched or changed in place: the same blocks
        assert after["blocks"][op] is before["blocks"][op]
    assert after["blocks"]["b"] is not before["blocks"]["b"]  # swapped back: a new block of the old type
    assert after["links"] == before["links"] and after["values"] == before["values"]
    assert after["bypassed"] == before["bypassed"] and after["regions"] == before["regions"]
    engine.update()
    assert engine.errors == () and {b.name for b in engine.context.registry} == {"f", "a", "b", "d"}
    ids = {adapter.block(op).id: op for op in adapter.operators()}
    assert {(ids[lk.src], ids[lk.dst]) for lk in engine.context.connections} == {("f", "a"), ("a", "b"), ("b", "d")}


# -- the standalone host's reloader, with the real apply ---------------------------------------------
def test_a_refused_reload_keeps_the_last_good_patch_running(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text(BASE)
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, REG)
    good = load_patch(path, REG)
    apply_patch(adapter, good)
    reloader = PatchReloader(
        path, good, load=lambda p: load_patch(p, REG), apply=lambda new, old: apply_patch(adapter, new, old)
    )
    before = _state(adapter)
    path.write_text(LOOP_EDIT)
    os.utime(path, ns=(1_000_000_000,) * 2)
    assert not reloader.poll(force=True)
    assert reloader.patch is good and "the last good patch keeps running" in reloader.status
    err = reloader.errors[-1]
    assert err.file == str(path) and err.line == 1 and "(loop: b -> a -> b)" in err.message
    assert _state(adapter) == before
    engine.update()
    assert engine.errors == () and "c" not in adapter.operators()
    path.write_text(LOOP_EDIT.replace('"b.Out -> a.In", ', ""))  # the loop taken out: it applies
    os.utime(path, ns=(2_000_000_000,) * 2)
    assert reloader.poll(force=True) and adapter.block("b").get("Factor") == 5.0 and "c" in adapter.operators()


# -- the real Engine (the unit tests' stand-in device, kernel builder and graph) ---------------------
@pytest.fixture
def real_engine(monkeypatch: pytest.MonkeyPatch):
    """The real Engine on the stand-in device, kernel builder and graph of ``test_engine_orchestration``."""
    monkeypatch.setattr(resources_module, "DeviceContext", FakeDevice)
    monkeypatch.setattr(resources_module, "ModuleCache", FakeModules)
    monkeypatch.setattr(engine_module, "KernelBuilder", FakeBuilder)
    monkeypatch.setattr(build_module, "realize", FakeGraph)
    monkeypatch.setattr(FakeDevice, "refuse_reset", False)
    monkeypatch.setattr(FakeGraph, "fault", False)
    e = Engine(cache_dir=False, watch_files=False, background_builds=False)
    yield e
    e.close()


def test_on_the_engine_a_refused_edit_keeps_the_built_graph_and_an_undone_one_builds_the_same_patch(
    real_engine: Engine,
) -> None:
    engine = real_engine
    registry = PluginHost().registry
    registry.add(_ReadOnce, name="test.ReadOnce")
    adapter = HostAdapter(engine, registry)
    base = parse_patch(BASE, path="p.toml", registry=registry)
    apply_patch(adapter, base)
    for _ in range(3):  # built, then its kernels compiled in: the graph a quiet frame keeps
        engine.update()
    graph = engine.resources.graph
    engine.update()
    assert engine.resources.graph is graph
    assert graph is not None and _errors(engine) == []
    before = _state(adapter)
    with pytest.raises(PatchFileError, match=r"\(loop: b -> a -> b\)"):
        apply_patch(adapter, parse_patch(LOOP_EDIT, path="p.toml", registry=registry), base)
    engine.update()
    assert engine.resources.graph is graph and _state(adapter) == before  # nothing to rebuild
    _ReadOnce.reads = 0
    edit = BASE.replace("Factor = 3.0", "Factor = 4.0") + '\n[operators.r]\ntype = "test.ReadOnce"\n'
    with pytest.raises(PatchFileError, match="its source is gone"):
        apply_patch(adapter, parse_patch(edit.replace('"b.Out -> d.In"]', '"b.Out -> r.In"]'), registry=registry), base)
    assert _state(adapter) == before
    engine.update()
    assert _errors(engine) == [] and {b.name for b in engine.context.registry} == {"f", "a", "b", "d"}
    assert engine.resources.graph.plan.scalar_slots.keys() == graph.plan.scalar_slots.keys()


def _errors(engine: Engine) -> list:
    return [d for d in engine.diagnostics() if d.severity == "error"]
