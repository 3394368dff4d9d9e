"""Composite files: parsed and checked like patch files, used by patches through ``core.Composite``
with a ``Path``, handled by the host adapter like any operator; every way they can be wrong names the
file and line, and a bad edit leaves the running patch alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from cudapatch.engine import ExternalBinding
from cudapatch.errors import CudapatchError, PatchFileError, PluginError
from cudapatch.host_plugin import (
    HostAdapter,
    PluginHost,
    apply_patch,
    hookimpl,
    load_patch,
    make_plugin_manager,
    parse_composite,
    parse_patch,
)
from cudapatch.host_plugin.registry import BlockTypeRegistry
from cudapatch.kernels.types import DType

from .plan_engine import PlanOnlyEngine

BLUR = """\
# Two Scales in a chain: Out = (In * Gain) * Gain
links = ["h.Out -> v.In"]

[composite]
name = "Blur"
description = "two passes"

[operators.h]
type = "core.Scale"
Factor = 0.5

[operators.v]
type = "core.Scale"
Offset = 1.0

[expose]
In = "h.In"
Out = "v.Out"
Gain = ["h.Factor", "v.Factor"]
"""

PATCH = """\
links = ["fill.Out -> blur1.In", "blur1.Out -> tail.In"]

[operators.fill]
type = "core.Fill"
Count = 64
Value = 2.0

[operators.blur1]
type = "core.Composite"
Path = "blur.toml"
Gain = 3.0

[operators.tail]
type = "core.Scale"
"""


@pytest.fixture(scope="module")
def registry() -> BlockTypeRegistry:
    return PluginHost().registry


def _write(folder: Path, **files: str) -> Path:
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


def _load(folder: Path, registry) -> tuple[PlanOnlyEngine, HostAdapter]:
    patch = load_patch(folder / "patch.toml", registry=registry)
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry, search_paths=[folder])
    apply_patch(adapter, patch)
    return engine, adapter


def test_a_composite_file_parses_with_its_exposures(registry) -> None:
    spec = parse_composite(BLUR, path="blur.toml", registry=registry)
    assert spec.name == "Blur" and not spec.child_graph and spec.description == "two passes"
    assert [(n, t) for n, t, _ in spec.expose] == [
        ("In", ("h.In",)),
        ("Out", ("v.Out",)),
        ("Gain", ("h.Factor", "v.Factor")),
    ]
    assert [line for *_, line in spec.expose] == [17, 18, 19]
    assert list(spec.patch.operators) == ["h", "v"]


def test_a_patch_uses_a_composite_by_file(tmp_path, registry) -> None:
    engine, adapter = _load(_write(tmp_path, **{"blur.toml": BLUR, "patch.toml": PATCH}), registry)
    blur = adapter.block("blur1")
    assert adapter.operators()["blur1"] == "core.Composite"
    assert blur.description.type_name == "Blur" and blur.get("Gain") == 3.0
    engine.update()
    assert engine.errors == ()
    names = [b.name for b in engine.context.snapshot().blocks]
    assert names == ["fill", "blur1/h", "blur1/v", "tail"]
    slots = engine.plan.scalar_slots[(blur.id, "Gain")]
    assert [engine.plan.nodes[n].args[a].value for n, a in slots] == [3.0, 3.0]
    # The adapter routes the inner blocks' results to the composite's operator.
    by_block = adapter.operators_by_block()
    assert by_block[blur.inner("h").id] == "blur1" and by_block[blur.inner("v").id] == "blur1"


def test_the_patch_checks_the_exposed_names_before_anything_is_built(tmp_path, registry) -> None:
    _write(tmp_path, **{"blur.toml": BLUR})
    text = PATCH.replace("Gain = 3.0", "Gian = 3.0")
    with pytest.raises(PatchFileError, match=r"has no parameter 'Gian' \(it has: Gain, ChildGraph, Path\)") as info:
        parse_patch(text, path=tmp_path / "patch.toml", registry=registry)
    assert info.value.line == 11
    text = PATCH.replace("blur1.Out -> tail.In", "blur1.Output -> tail.In")
    with pytest.raises(PatchFileError, match="has no output 'Output'"):
        parse_patch(text, path=tmp_path / "patch.toml", registry=registry)


def test_the_adapter_creates_links_sets_and_deletes_a_composite(tmp_path, registry) -> None:
    _write(tmp_path, **{"blur.toml": BLUR})
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry, search_paths=[tmp_path])
    fill = adapter.create("fill", "core.Fill", {"Count": 32})
    blur = adapter.create("b", "core.Composite", {"Path": "blur.toml", "Gain": "0.25"})  # host values coerce
    adapter.connect("fill", "Out", "b", "In")
    adapter.set_param("b", "Gain", 4)
    assert blur.get("Gain") == 4.0 and fill.id in {lk.src for lk in engine.context.connections}
    engine.update()
    assert engine.errors == () and (blur.id, "Out") in engine.plan.outputs
    adapter.delete("b")
    engine.update()
    assert "b" not in adapter.operators() and all(n.block_id == fill.id for n in engine.plan.nodes)


def test_an_error_inside_a_composite_names_the_composite_file_and_line(tmp_path, registry) -> None:
    bad = BLUR.replace('type = "core.Scale"\nOffset', 'type = "core.Scael"\nOffset')
    folder = _write(tmp_path, **{"blur.toml": bad, "patch.toml": PATCH})
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry, search_paths=[folder])
    with pytest.raises(CudapatchError, match="unknown block type 'core.Scael'") as info:
        adapter.create("blur1", "core.Composite", {"Path": "blur.toml"})
    assert info.value.file.endswith("blur.toml") and info.value.line == 13
    # Through a patch file: the patch's operator line, the composite's file and line in the message.
    patch = parse_patch(PATCH, path=folder / "patch.toml")
    with pytest.raises(PatchFileError, match=r"blur\.toml:13") as info:
        apply_patch(HostAdapter(PlanOnlyEngine(), registry, search_paths=[folder]), patch)
    assert info.value.line == 8 and info.value.block == "blur1"


@pytest.mark.parametrize(
    ("broken", "message", "line"),
    [
        (BLUR.replace("[expose]", "[expose"), "TOML syntax error", 16),
        (BLUR.replace('Out = "v.Out"', 'Out = "v.Output"'), "operator 'v' has no port or parameter 'Output'", 18),
        (BLUR.replace('Out = "v.Out"', 'Out = "w.Out"'), "no operator 'w' in this composite", 18),
        (BLUR.replace('Out = "v.Out"', "Out = 3"), 'write "op.Name" or a list of them', 18),
        (BLUR.replace('name = "Blur"', "nmae = 1"), "unknown composite setting 'nmae'", 5),
        (BLUR.replace('name = "Blur"', 'child_graph = "yes"'), "child_graph = 'yes': write true or false", 5),
        (BLUR + "\n[engine]\ndevice = 0\n", "a composite file has no [engine]", 21),
        (BLUR.replace("Factor = 0.5", "Factor = 0.5\nRadius = 2"), "has no parameter 'Radius'", 11),
    ],
)
def test_a_broken_composite_file_is_reported_with_its_line(tmp_path, registry, broken, message, line) -> None:
    folder = _write(tmp_path, **{"blur.toml": broken})
    with pytest.raises(PatchFileError) as info:
        HostAdapter(PlanOnlyEngine(), registry, search_paths=[folder]).create(
            "b", "core.Composite", {"Path": "blur.toml"}
        )
    assert message in info.value.message and info.value.line == line and info.value.file.endswith("blur.toml")


def test_a_composite_that_includes_itself_is_refused(tmp_path, registry) -> None:
    me = 'links = []\n[operators.me]\ntype = "core.Composite"\nPath = "a.toml"\n'
    other_a = 'links = []\n[operators.b]\ntype = "core.Composite"\nPath = "b.toml"\n'
    other_b = 'links = []\n\n[operators.a]\ntype = "core.Composite"\nPath = "a.toml"\n'
    folder = _write(tmp_path, **{"a.toml": me})
    adapter = HostAdapter(PlanOnlyEngine(), registry, search_paths=[folder])
    with pytest.raises(PatchFileError, match=r"includes itself \(a\.toml -> a\.toml\)") as info:
        adapter.create("x", "core.Composite", {"Path": "a.toml"})
    assert info.value.file.endswith("a.toml") and info.value.line == 2
    _write(tmp_path, **{"a.toml": other_a, "b.toml": other_b})
    with pytest.raises(PatchFileError, match=r"includes itself \(a\.toml -> b\.toml -> a\.toml\)") as info:
        adapter.create("y", "core.Composite", {"Path": "a.toml"})
    assert info.value.file.endswith("a.toml") and info.value.line == 2 and "b.toml:3" in info.value.message
    assert adapter.operators() == {}


def test_a_bad_edit_of_the_patch_keeps_the_running_composite(tmp_path, registry) -> None:
    folder = _write(tmp_path, **{"blur.toml": BLUR, "patch.toml": PATCH})
    engine, adapter = _load(folder, registry)
    engine.update()
    good = engine.plan
    old = load_patch(folder / "patch.toml", registry=registry)
    _write(folder, **{"blur.toml": BLUR.replace('"v.Out"', '"v.Nope"')})
    new = parse_patch(
        PATCH.replace("Gain = 3.0", "Gain = 5.0").replace("Count = 64", "Count = 65"), path=folder / "patch.toml"
    )
    with pytest.raises(PatchFileError, match="blur.toml:18"):
        apply_patch(adapter, new, old)
    assert adapter.block("blur1").get("Gain") == 3.0 and adapter.block("fill").get("Count") == 64
    engine.update()
    assert engine.plan.nodes == good.nodes


def test_inner_kernel_files_are_found_next_to_the_composite(tmp_path, registry) -> None:
    sub = tmp_path / "lib"
    sub.mkdir()
    kernel = (
        'extern "C" __global__ void twice(const float* in, float* out, unsigned int n) {\n'
        "    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
        "    if (i < n) out[i] = 2.0f * in[i];\n}\n"
    )
    comp = '[operators.k]\ntype = "core.KernelFile"\nPath = "twice.cu"\n\n[expose]\nIn = "k.in"\nOut = "k.out"\n'
    _write(sub, **{"twice.cu": kernel, "double.toml": comp})
    adapter = HostAdapter(PlanOnlyEngine(), registry, search_paths=[tmp_path])
    block = adapter.create("d", "core.Composite", {"Path": "lib/double.toml"})
    assert [p.name for p in block.inputs] == ["In"] and [p.name for p in block.outputs] == ["Out"]


class _ShipsComposites:
    """A plugin shipping composite files (registered directly, as an app's own plugin is)."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    @hookimpl
    def cudapatch_register_blocks(self, registry) -> None:
        for name, path in self.files.items():
            registry.add_composite(path, name=name, version="2.0")


def test_a_plugin_composite_that_does_not_load_is_reported_and_left_out(tmp_path) -> None:
    _write(tmp_path, **{"blur.toml": BLUR, "broken.toml": BLUR.replace('"v.Out"', '"v.Nope"')})
    plugin = _ShipsComposites({"mine.Blur": tmp_path / "blur.toml", "mine.Broken": tmp_path / "broken.toml"})
    host = PluginHost(make_plugin_manager(entry_points=False, plugins=(("mine", plugin),)))
    assert host.registry.get("mine.Blur").params[0] == ("Gain", "float", 0.5)
    assert "mine.Broken" not in host.registry
    (err,) = host.errors
    assert (
        "plugin 'mine': composite type 'mine.Broken' does not load" in err.message and "broken.toml:18" in err.message
    )


def test_a_plugin_composite_needs_a_real_file_and_a_qualified_name(tmp_path) -> None:
    registry = BlockTypeRegistry()
    with pytest.raises(PluginError, match="does not exist"):
        registry.add_composite(tmp_path / "nope.toml", name="mine.Nope")
    _write(tmp_path, **{"blur.toml": BLUR})
    with pytest.raises(PluginError, match="must look like 'package.Type'"):
        registry.add_composite(tmp_path / "blur.toml", name="Blur")


EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "composites"


def test_the_example_composite_and_its_patch_load(registry) -> None:
    patch = load_patch(EXAMPLES / "patch.toml", registry=registry)
    assert patch.operators["smooth"].type == "core.Composite"
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry, search_paths=[EXAMPLES])
    smooth = adapter.create("smooth", "core.Composite", {"Path": "smooth.toml", "Gain": 2.0})
    assert [p.name for p in smooth.description.params] == ["Weight", "Gain", "ChildGraph", "Path"]
    assert smooth.get("Weight") == pytest.approx(1 / 3) and not smooth.is_child_graph
    engine.context.bind_input(smooth, "In", ExternalBinding(0xA000, 1000, DType.FLOAT32))
    engine.update()
    assert engine.errors == ()
    assert [b.name for b in engine.context.snapshot().blocks] == ["smooth/pass1", "smooth/pass2", "smooth/gain"]
    assert len(engine.plan.scalar_slots[(smooth.id, "Weight")]) == 2


def test_an_edited_composite_file_is_re_read_and_a_broken_one_keeps_running(tmp_path, registry) -> None:
    from cudapatch.host_plugin.hosts.composite_reload import CompositeReloader

    _write(tmp_path, **{"blur.toml": BLUR})
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry, search_paths=[tmp_path])
    blur = adapter.create("b", "core.Composite", {"Path": "blur.toml", "Gain": 3.0})
    engine.context.bind_input(blur, "In", ExternalBinding(0xA000, 100, DType.FLOAT32))
    reloader = CompositeReloader(adapter, clock=lambda: 0.0)
    assert reloader.poll(force=True) == 0  # the baseline
    engine.update()
    engine.context.dirty.clear_structure()
    _write(
        tmp_path,
        **{"blur.toml": BLUR.replace('Gain = ["h.Factor", "v.Factor"]', 'Gain = "v.Factor"\nBias = "h.Offset"')},
    )
    assert reloader.poll(force=True) == 1 and reloader.reloads == 1
    assert [p.name for p in blur.description.params] == ["Gain", "Bias", "ChildGraph", "Path"] and blur.get(
        "Gain"
    ) == 3.0
    assert engine.context.dirty.structure  # the engine rebuilds with the new inner blocks
    engine.update()
    assert engine.errors == () and len(engine.plan.scalar_slots[(blur.id, "Gain")]) == 1
    _write(tmp_path, **{"blur.toml": "[operators.h\n"})
    assert reloader.poll(force=True) == 0
    (err,) = reloader.errors
    assert "TOML syntax error" in err.message and err.file.endswith("blur.toml")
    assert [p.name for p in blur.description.params] == ["Gain", "Bias", "ChildGraph", "Path"]  # as it was
    assert reloader.poll(force=True) == 0 and len(reloader.errors) == 1  # reported once


def test_a_bug_in_a_composite_re_read_is_refused_naming_the_file_and_the_composite_keeps_running(
    tmp_path, registry, monkeypatch, caplog
) -> None:
    """Not only cudapatch errors: anything a re-read raises (a loader bug) is kept as a file error naming
    the composite file, with its traceback in the log; the composite runs on, and a later edit applies."""
    from cudapatch.host_plugin import composite_file
    from cudapatch.host_plugin.hosts.composite_reload import CompositeReloader

    _write(tmp_path, **{"blur.toml": BLUR})
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry, search_paths=[tmp_path])
    blur = adapter.create("b", "core.Composite", {"Path": "blur.toml", "Gain": 3.0})
    engine.context.bind_input(blur, "In", ExternalBinding(0xA000, 100, DType.FLOAT32))
    reloader = CompositeReloader(adapter, clock=lambda: 0.0)
    reloader.poll(force=True)
    engine.update()
    engine.context.dirty.clear_structure()
    before = blur.description

    def buggy_loader(path, registry=None):
        raise ValueError("a loader bug")

    monkeypatch.setattr(composite_file, "load_composite_file", buggy_loader)
    _write(tmp_path, **{"blur.toml": BLUR.replace('Gain = ["h.Factor", "v.Factor"]', 'Gain = "v.Factor"')})
    with caplog.at_level("ERROR", logger="cudapatch.host"):
        assert reloader.poll(force=True) == 0
    (err,) = reloader.errors
    assert isinstance(err, PatchFileError) and err.file == str(tmp_path / "blur.toml")
    assert err.message == "ValueError: a loader bug" and str(err).startswith(f"{tmp_path / 'blur.toml'}: block 'b'")
    assert any(r.exc_info and r.exc_info[0] is ValueError for r in caplog.records)  # the traceback, for the report
    assert blur.description is before and not engine.context.dirty.structure  # the old composite runs on
    engine.update()
    assert engine.errors == () and len(engine.plan.scalar_slots[(blur.id, "Gain")]) == 2
    assert reloader.poll(force=True) == 0 and len(reloader.errors) == 1  # reported once
    monkeypatch.undo()  # the bug fixed: the next save applies
    _write(tmp_path, **{"blur.toml": BLUR.replace('Gain = ["h.Factor", "v.Factor"]', 'Gain = "h.Factor"\n')})
    assert reloader.poll(force=True) == 1 and blur.get("Gain") == 3.0


def test_a_bug_while_a_standalone_run_re_reads_a_nested_composite_names_that_file(
    tmp_path, registry, monkeypatch
) -> None:
    """``StandaloneHost.poll_patch`` never raises for a composite edit: a non-cudapatch exception from
    ``refresh`` lands in ``reload_errors`` naming the nested file that changed, and the run goes on."""
    from cudapatch.engine import engine as engine_module
    from cudapatch.host_plugin.composite_file import FileComposite
    from cudapatch.host_plugin.hosts.standalone import StandaloneHost

    class DevicelessEngine(PlanOnlyEngine):  # the engine's editing API on the real compiler, no device
        def __init__(self, device: int = 0, *, name: str = "", isolated: bool = False, **options: bool) -> None:
            super().__init__(fuse=options.get("fuse", True))

    monkeypatch.setattr(engine_module, "Engine", DevicelessEngine)
    outer = '[operators.inner]\ntype = "core.Composite"\nPath = "blur.toml"\n\n[expose]\nOut = "inner.Out"\n'
    patch = '[operators.fill]\ntype = "core.Fill"\nCount = 64\n\n[operators.o]\ntype = "core.Composite"\n'
    patch += 'Path = "outer.toml"\n'
    _write(tmp_path, **{"blur.toml": BLUR, "outer.toml": outer, "patch.toml": patch})
    host = StandaloneHost(tmp_path / "patch.toml")
    host.engine.update()
    o = host.adapter.block("o")
    before = o.description

    def boom(self):
        raise RuntimeError("refresh bug")

    monkeypatch.setattr(FileComposite, "refresh", boom)
    _write(tmp_path, **{"blur.toml": BLUR.replace("Factor = 0.5", "Factor = 0.25")})
    host.poll_patch(force=True)  # does not raise
    (err,) = host.reload_errors
    assert (err.file, err.block, err.message) == (str(tmp_path / "blur.toml"), "o", "RuntimeError: refresh bug")
    assert host.adapter.block("o") is o and o.description is before
    (tmp_path / "patch.toml").write_text(patch + '\n[operators.more]\ntype = "core.Fill"\nCount = 8\n')
    assert host.poll_patch(force=True) is True and "more" in host.adapter.operators()  # the run goes on
    host.engine.update()
    assert len(host.reload_errors) == 1


def test_a_patch_asks_for_a_child_graph_per_operator_and_a_file_sets_the_default(tmp_path, registry) -> None:
    text = PATCH.replace("Gain = 3.0", "Gain = 3.0\nChildGraph = 1")
    engine, adapter = _load(_write(tmp_path, **{"blur.toml": BLUR, "patch.toml": text}), registry)
    engine.update()
    blur = adapter.block("blur1")
    assert blur.is_child_graph and [c.name for c in engine.plan.children] == ["blur1"]
    child_file = BLUR.replace('name = "Blur"', 'name = "Blur"\nchild_graph = true')
    _write(tmp_path, **{"blur.toml": child_file})
    other = adapter.create("b2", "core.Composite", {"Path": "blur.toml"})
    assert other.get("ChildGraph") == 1 and other.is_child_graph
    adapter.set_param("b2", "ChildGraph", "0")  # a host's text for the switch
    assert not other.is_child_graph
