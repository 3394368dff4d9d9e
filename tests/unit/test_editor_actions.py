"""The node editor's model, without a display or a GPU, for what the panel shows and does beyond the basic
actions: the Compiling state of a block whose kernel compiles (at its first compile, after a Code edit,
inside a composite), unlinking an input (the wire menu's Unlink, a wire dragged off a linked input), and
the block browser's search (by name and docstring words, plugins and declared categories included) with
a block created from its result."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from cudapatch.blocks.library.custom import DEFAULT_CUSTOM_CODE
from cudapatch.engine.kernels import KernelTracker
from cudapatch.engine.profiling import BlockStats, EngineStats, ProfilingLevel
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, hookimpl, load_patch, make_plugin_manager
from cudapatch.host_plugin.editor_model import EditorModel
from cudapatch.host_plugin.editor_views import COMPILING_AGAIN, COMPILING_EDIT, COMPILING_FIRST, shown_state
from cudapatch.kernels.builder import CompiledKernel
from cudapatch.kernels.source import KernelImage

from .plan_engine import PlanOnlyEngine
from .test_editor_composites import _patch as _composite_patch
from .test_editor_model import PATCH, _file_state, _open, _state
from .test_host_plugin import Doubler

# -- Compiling -------------------------------------------------------------------------------------------


class _HeldBuilder:
    """Stands in for the background compiler: every compile stays in flight until ``land()`` finishes it
    (as the builder's thread would), with a kernel image described from the source."""

    def __init__(self) -> None:
        self.held: list[tuple[Future, object]] = []

    def submit(self, source) -> Future:
        f: Future = Future()
        self.held.append((f, source))
        return f

    def land(self) -> None:
        held, self.held = self.held, []
        for f, source in held:
            image = KernelImage(source.describe(), b"", "cubin", "key", "k.cu")
            f.set_result(CompiledKernel(source, image, object(), "compiled", 0.0))

    def build_cached(self, source) -> None:
        return None

    def close(self) -> None:
        pass


class _CompilingEngine(PlanOnlyEngine):
    """Plans like ``PlanOnlyEngine`` and keeps the engine's real ``KernelTracker``: each update asks it for
    the kernels of the patch (``resolve``, as a build does), which requests the compiles of new or edited
    sources; they stay in flight until ``builder.land()``."""

    def __init__(self) -> None:
        super().__init__()
        self.builder = _HeldBuilder()
        self.kernels = KernelTracker(self.builder, watch_files=False)  # type: ignore[arg-type]

    def update(self):
        super().update()
        self.kernels.resolve(self.context.snapshot())
        self.kernels.flush()
        self.kernels.collect()


def _stats(adapter: HostAdapter, state: str) -> EngineStats:
    """Statistics in which every operator has ``state`` (what the engine's board published)."""
    rows = tuple(BlockStats(adapter.block(op).id, op, state, "", None) for op in adapter.operators())
    return EngineStats(ProfilingLevel.NONE, 1, 1, None, rows, 0, 0, 0)


FX = """\
links = ["fill.Out -> fx.in"]

[operators.fill]
type = "core.Fill"
Count = 256

[operators.fx]
type = "core.CustomKernel"
"""


def test_the_shown_state_says_compiling_where_nothing_worse_is_known():
    assert shown_state("OK", False) == ("OK", "")
    assert shown_state("NotCompiled", False) == ("NotCompiled", "")
    assert shown_state("OK", True) == ("Compiling", COMPILING_EDIT)
    assert shown_state("NotCompiled", True) == ("Compiling", COMPILING_FIRST)
    assert shown_state("Error", True) == ("Error", COMPILING_AGAIN)  # the error and its markers stay
    assert shown_state("Warning", True) == ("Warning", COMPILING_AGAIN)


def test_a_block_shows_compiling_at_its_first_compile_and_while_a_code_edit_compiles(tmp_path):
    engine = _CompilingEngine()
    _, adapter, _, model = _open(tmp_path, FX, engine=engine)
    fill, fx = adapter.block("fill"), adapter.block("fx")
    engine.update()
    assert engine.kernels.compiling() == {fill.id, fx.id}  # every kernel's first compile is in flight
    model.refresh(_stats(adapter, "NotCompiled"))  # the engine runs neither yet
    nodes = model.nodes()
    assert (nodes["fx"].state, nodes["fx"].compiling) == ("Compiling", COMPILING_FIRST)
    assert nodes["fill"].state == "Compiling"
    engine.builder.land()
    assert not engine.kernels.compiling()
    model.refresh(_stats(adapter, "OK"))
    assert [(v.state, v.compiling) for v in nodes.values()] == [("OK", ""), ("OK", "")]

    # A Code edit of the running block: the engine keeps it OK (the previous version runs); the editor
    # shows it compiling until the new version lands, and only it.
    assert model.set_param("fx", "Code", DEFAULT_CUSTOM_CODE.replace("in[i] * gain", "in[i] * gain + 1.0f"))
    engine.update()
    assert engine.kernels.compiling() == {fx.id}
    model.refresh(_stats(adapter, "OK"))
    nodes = model.nodes()
    assert (nodes["fx"].state, nodes["fx"].compiling) == ("Compiling", COMPILING_EDIT)
    assert (nodes["fill"].state, nodes["fill"].compiling) == ("OK", "")
    engine.builder.land()
    model.refresh(_stats(adapter, "OK"))
    assert (nodes["fx"].state, nodes["fx"].compiling) == ("OK", "")


def test_a_composite_shows_its_inner_blocks_compiling_closed_and_open(tmp_path):
    engine = _CompilingEngine()
    _, adapter, _, model = _open(tmp_path, _composite_patch(tmp_path), engine=engine)
    engine.update()
    two = adapter.block("two")
    assert {b.id for _, b in two.inner_blocks()} <= engine.kernels.compiling()
    model.refresh(_stats(adapter, "NotCompiled"))
    assert (model.nodes()["two"].state, model.nodes()["two"].compiling) == ("Compiling", COMPILING_FIRST)
    assert model.nodes()["two"].block_state == "NotCompiled"  # what its inner nodes follow once open
    assert model.open("two")
    model.refresh(_stats(adapter, "NotCompiled"))
    drawn = model.drawn_nodes()
    assert (drawn["two/a"].state, drawn["two/a"].compiling) == ("Compiling", COMPILING_FIRST)
    engine.builder.land()
    model.refresh(_stats(adapter, "OK"))
    drawn = model.drawn_nodes()
    assert {drawn[p].state for p in ("two", "two/a", "two/b")} == {"OK"}
    assert not any(v.compiling for v in drawn.values())


def test_an_engine_without_a_kernel_tracker_shows_no_compiling(tmp_path):
    _, adapter, _, model = _open(tmp_path)  # an engine that only plans: nothing compiles
    adapter.engine.update()
    model.refresh(_stats(adapter, "NotCompiled"))
    assert {v.state for v in model.nodes().values()} == {"NotCompiled"}
    model.refresh()  # from the diagnostics: add's inputs are unlinked (a warning), the others run
    assert {op: v.state for op, v in model.nodes().items()} == {"fill": "OK", "scale": "OK", "add": "Warning"}


# -- Unlink ----------------------------------------------------------------------------------------------


def test_unlinking_an_input_is_one_written_undoable_edit(tmp_path):
    path, adapter, reloader, model = _open(tmp_path)
    text = path.read_text()
    link = model.link_into("scale", "In")
    assert link is not None and str(link) == "fill.Out -> scale.In"
    assert model.link_into("add", "A") is None
    assert model.unlink_input("scale", "In")
    assert not adapter.links() and "fill.Out -> scale.In" not in path.read_text()
    assert _file_state(path) == _state(adapter)
    assert reloader.poll() is False and reloader.reloads == 0  # its own write: no reload
    refused = model.unlink_input("scale", "In")
    assert not refused and refused.message == "scale.In is not linked"
    assert model.undo() and path.read_text() == text
    assert [str(lk) for lk in model.links()] == ["fill.Out -> scale.In"]
    assert model.redo() and not adapter.links()


def test_a_wire_inside_an_open_composite_is_not_unlinked(tmp_path):
    path, adapter, _, model = _open(tmp_path, _composite_patch(tmp_path))
    adapter.engine.update()
    assert model.open("two")
    text = path.read_text()
    link = model.link_into("two/b", "In")
    assert link is not None and link.src == "two/a"
    refused = model.unlink_input("two/b", "In")
    assert not refused and "read-only" in refused.message and path.read_text() == text


# -- the block browser -----------------------------------------------------------------------------------


class Striper(Doubler):
    """Paints zebra stripes over its input.

    (A plugin's block type that declares its category.)"""

    type_name = "Striper"
    category = "Patterns"


class _StripesPlugin:
    @hookimpl
    def cudapatch_register_blocks(self, registry):
        registry.add(Striper, name="thirdparty.Striper")
        registry.add(Doubler, name="thirdparty.Doubler")


@pytest.fixture
def plugin_model(tmp_path):
    """An editor model over ``PATCH`` on a host with the stripes plugin: ``(path, adapter, model)``."""
    host = PluginHost(make_plugin_manager(entry_points=False, disabled=(), plugins=(("stripes", _StripesPlugin()),)))
    reg = host.registry
    path = tmp_path / "patch.toml"
    path.write_text(PATCH)
    patch = load_patch(path, reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    return path, adapter, EditorModel(adapter, patch, path=path)


def test_the_browser_lists_every_type_with_its_category_and_first_docstring_line(plugin_model):
    _, adapter, model = plugin_model
    everything = model.browse("")
    assert sorted(e.name for e in everything) == sorted(bt.name for bt in adapter.registry)
    order = [(e.category.lower(), e.label.lower()) for e in everything]
    assert order == sorted(order)  # by category, then by name
    by_name = {e.name: e for e in everything}
    scale, registered = by_name["core.Scale"], adapter.registry.get("core.Scale")
    assert (scale.category, scale.label, scale.origin) == ("core", "Scale", registered.origin)
    assert scale.summary and scale.summary == registered.doc.splitlines()[0].strip()
    striper = by_name["thirdparty.Striper"]
    assert (striper.category, striper.origin) == ("Patterns", "stripes")  # declared
    assert striper.summary == "Paints zebra stripes over its input."
    assert by_name["thirdparty.Doubler"].category == "thirdparty"  # no declared category: the package


def test_the_browser_finds_by_name_and_by_docstring_words(plugin_model):
    _, _, model = plugin_model
    found = [e.name for e in model.browse("scale")]
    assert found[0] == "core.Scale"  # the name holds the word: before types that only mention it
    assert all("scale" in (e.name + e.category + e.doc).lower() for e in model.browse("scale"))
    assert [e.name for e in model.browse("ZEBRA")] == ["thirdparty.Striper"]  # a docstring word, any case
    assert [e.name for e in model.browse("stripes paints")] == ["thirdparty.Striper"]  # every word, any order
    assert [e.name for e in model.browse("patterns")] == ["thirdparty.Striper"]  # its category
    assert model.browse("zebra nothing-like-this") == []


def test_a_type_found_in_the_browser_is_created_through_the_adapter(plugin_model):
    path, adapter, model = plugin_model
    (entry,) = model.browse("zebra")
    assert model.create(entry.name, position=(300.0, 40.0))
    assert adapter.operators()["striper1"] == "thirdparty.Striper"
    text = path.read_text()
    assert "[operators.striper1]" in text and 'type = "thirdparty.Striper"' in text
    assert model.nodes()["striper1"].position == (300.0, 40.0)
    assert model.undo() and "striper1" not in adapter.operators() and path.read_text() == PATCH
