"""Composite blocks on a real GPU: a composite computes bit for bit what the same blocks patched flat
compute, in flattened and in child-graph mode; Hot edits of exposed parameters, Warm rebinds and Code
edits of an inner kernel file stay in their tiers; a bad edit keeps the running graph."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from cudapatch import BlockState, Composite, CompositeBuilder, Engine, KernelFile, Scale
from cudapatch.errors import PatchFileError
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch

from .conftest import run_until

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "composites"


@pytest.fixture(scope="module")
def registry():
    return PluginHost().registry


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A copy of the example composite and its kernel (tests edit them)."""
    for name in ("smooth.toml", "box3.cu"):
        shutil.copy2(EXAMPLES / name, tmp_path / name)
    return tmp_path


def _rand(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal(n).astype(np.float32)


def _box3(x: np.ndarray, weight: np.float32) -> np.ndarray:
    left, right = np.concatenate([x[:1], x[:-1]]), np.concatenate([x[1:], x[-1:]])
    return ((left + x) + right) * weight


def _flat(engine: Engine, folder: Path, weight: float, gain: float) -> tuple[KernelFile, KernelFile, Scale]:
    """The blocks of smooth.toml, patched by hand."""
    p1 = engine.add(KernelFile(folder / "box3.cu", name="flat1"))
    p2 = engine.add(KernelFile(folder / "box3.cu", name="flat2"))
    g = engine.add(Scale(name="flatgain", Factor=gain))
    p1.set("weight", weight)
    p2.set("weight", weight)
    engine.connect(p1, "out", p2, "in")
    engine.connect(p2, "out", g, "In")
    return p1, p2, g


def _smooth(registry, folder: Path, name: str, **kw):
    return registry.get("core.Composite").cls(name=name, Path=str(folder / "smooth.toml"), **kw)


@pytest.mark.parametrize("child_graph", [False, True], ids=["flattened", "child-graph"])
def test_a_composite_matches_the_same_blocks_patched_flat_bitwise(
    engine: Engine, registry, folder: Path, rng: np.random.Generator, child_graph: bool
) -> None:
    x = _rand(rng, 100_003)  # not a multiple of the block size
    comp = engine.add(_smooth(registry, folder, "smooth", child_graph=child_graph, Gain=1.75))
    p1, _, g = _flat(engine, folder, comp.get("Weight"), 1.75)
    engine.bind(comp, "In", x)
    engine.bind(p1, "in", x)
    engine.update()
    assert (len(engine.graph.plan.children) == 1) is child_graph
    engine.synchronize()
    engine.output(comp, "Out").fill_bytes(0xFF)  # poison: unwritten elements show as NaN
    engine.output(g, "Out").fill_bytes(0xFF)
    engine.update()
    got, flat = engine.read(comp, "Out"), engine.read(g, "Out")
    np.testing.assert_array_equal(got, flat)
    w = np.float32(comp.get("Weight"))
    np.testing.assert_allclose(got, _box3(_box3(x, w), w) * np.float32(1.75), rtol=1e-6, atol=1e-6)
    assert comp.debug.state is BlockState.OK and "3 blocks" in str(comp)


@pytest.mark.parametrize("child_graph", [False, True], ids=["flattened", "child-graph"])
def test_hot_edits_of_exposed_parameters_stay_hot(
    engine: Engine, registry, folder: Path, rng: np.random.Generator, child_graph: bool
) -> None:
    x = _rand(rng, 4096)
    comp = engine.add(_smooth(registry, folder, "smooth", child_graph=child_graph))
    engine.bind(comp, "In", x)
    engine.update()
    graph, rebuilds, hot = engine.graph, engine.counters.rebuilds, engine.counters.hot_updates
    for weight, gain in rng.uniform(0.1, 0.5, size=(4, 2)):
        comp.set("Weight", float(weight))  # two inner kernels
        comp.set("Gain", float(gain))
        engine.update()
        w = np.float32(weight)
        ref = _box3(_box3(x, w), w) * np.float32(gain)
        np.testing.assert_allclose(engine.read(comp, "Out"), ref, rtol=1e-6, atol=1e-6)
    assert engine.graph is graph and graph.instantiations == 1
    # Two exposed parameters per frame: two Hot updates, each patching its inner kernels in place.
    assert engine.counters.rebuilds == rebuilds and engine.counters.hot_updates == hot + 8


def test_child_graph_mode_equals_flattened_after_edits(
    engine: Engine, registry, folder: Path, rng: np.random.Generator
) -> None:
    x, y = _rand(rng, 30_000), _rand(rng, 30_000)
    flat = engine.add(_smooth(registry, folder, "flat"))
    child = engine.add(_smooth(registry, folder, "child", child_graph=True))
    engine.set_profiling("PerBlock")  # the inner blocks' end stamps go inside the child graph
    for c in (flat, child):
        engine.bind(c, "In", x)
    engine.update()
    np.testing.assert_array_equal(engine.read(flat, "Out"), engine.read(child, "Out"))
    rebuilds = engine.counters.rebuilds
    for c in (flat, child):
        c.set("Weight", 0.25)
        engine.bind(c, "In", y)  # a host array of the same size: re-uploaded, no rebuild
    engine.update()
    np.testing.assert_array_equal(engine.read(flat, "Out"), engine.read(child, "Out"))
    np.testing.assert_allclose(
        engine.read(child, "Out"), _box3(_box3(y, np.float32(0.25)), np.float32(0.25)), rtol=1e-6
    )
    assert engine.counters.rebuilds == rebuilds

    def timed() -> bool:  # the composite's span over its blocks' stamps, measured inside the child graph
        row = next(r for r in engine.stats().blocks if r.block_id == child.id)
        return row.gpu_ms is not None

    run_until(engine, timed, timeout=5)
    assert child.debug.gpu_ms is None  # stats() only reads ...
    engine.show_frame()
    assert child.debug.gpu_ms is not None  # ... show_frame() puts the frame's numbers on the blocks


class TwoScales(Composite):
    type_name = "TwoScales"

    def compose(self, c: CompositeBuilder) -> None:
        c.add("a", Scale(Factor=2.0))
        c.add("b", Scale(Factor=2.0, Offset=0.5))
        c.link("a.Out", "b.In")
        c.expose("In", "a.In")
        c.expose("Out", "b.Out")
        c.expose("Gain", "a.Factor", "b.Factor")


def test_a_python_composite_in_a_chain(engine: Engine, rng: np.random.Generator) -> None:
    x = _rand(rng, 10_000)
    head = engine.add(Scale(name="head", Factor=-1.0))
    two = engine.add(TwoScales(name="two", Gain=3.0))
    tail = engine.add(Scale(name="tail", Factor=0.5))
    engine.connect(head, "Out", two, "In")
    engine.connect(two, "Out", tail, "In")
    engine.bind(head, "In", x)
    engine.keep(two, "Out")  # read below: kept as its inner b's output (else fused into tail's kernel)
    engine.update()
    ref = (((x * np.float32(-1.0)) * np.float32(3.0)) * np.float32(3.0) + np.float32(0.5)) * np.float32(0.5)
    np.testing.assert_allclose(engine.read(tail, "Out"), ref, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(engine.read(two, "Out"), engine.read(two.inner("b"), "Out"))
    a, b = two.inner("a"), two.inner("b")
    groups = [n.source.members for n in engine.graph.plan.kernel_nodes if getattr(n.source, "members", ())]
    assert groups == [(head.id, a.id, b.id)]  # one fused kernel up to the kept output; tail on its own


def test_a_code_edit_of_an_inner_kernel_file_is_swapped_in(
    live_engine: Engine, registry, folder: Path, rng: np.random.Generator
) -> None:
    e = live_engine
    x = _rand(rng, 2048)
    comp = e.add(_smooth(registry, folder, "smooth", child_graph=True))
    e.bind(comp, "In", x)
    run_until(e, lambda: comp.debug.state is BlockState.OK)
    rebuilds, swaps = e.counters.rebuilds, e.counters.code_swaps
    cu = folder / "box3.cu"
    cu.write_text(cu.read_text().replace("* weight;", "* weight * 2.0f;"))
    w = np.float32(comp.get("Weight")) * np.float32(2.0)
    ref = _box3(_box3(x, w), w)  # both inner blocks run the edited kernel (one file, two kernels)

    def both_swapped() -> bool:
        return bool(np.allclose(e.read(comp, "Out"), ref, rtol=1e-5, atol=1e-6))

    run_until(e, both_swapped, timeout=30)
    assert e.counters.code_swaps >= swaps + 1
    assert e.counters.rebuilds == rebuilds


def test_a_broken_composite_edit_keeps_the_running_graph(
    engine: Engine, registry, folder: Path, rng: np.random.Generator
) -> None:
    text = '[operators.smooth]\ntype = "core.Composite"\nPath = "smooth.toml"\nGain = 2.0\n'
    patch = parse_patch(text, path=folder / "patch.toml", registry=registry)
    adapter = HostAdapter(engine, registry, search_paths=[folder])
    apply_patch(adapter, patch)
    x = _rand(rng, 5000)
    engine.bind(adapter.block("smooth"), "In", x)
    engine.update()
    before, graph = engine.read(adapter.block("smooth"), "Out"), engine.graph
    (folder / "smooth.toml").write_text((folder / "smooth.toml").read_text().replace('"gain.Out"', '"gain.Nope"'))
    new = parse_patch(
        text.replace("Gain = 2.0", "Gain = 4.0").replace("smooth]", "smooth2]"), path=folder / "patch.toml"
    )
    with pytest.raises(PatchFileError, match="smooth.toml"):
        apply_patch(adapter, new, patch)
    engine.update()
    assert engine.graph is graph and list(adapter.operators()) == ["smooth"]
    np.testing.assert_array_equal(engine.read(adapter.block("smooth"), "Out"), before)


def test_an_isolated_engine_runs_a_composite_as_a_normal_one_does(registry, folder: Path, rng) -> None:
    x = _rand(rng, 8192)
    results = []
    with Engine(wait_for_compile=True) as normal, Engine(isolated=True, wait_for_compile=True) as iso:
        for e in (normal, iso):
            comp = e.add(_smooth(registry, folder, "smooth", Gain=1.5))
            e.bind(comp, "In", x)
            e.wait_ready()
            e.update()
            first = e.read(comp, "Out")
            comp.set("Gain", 0.5)  # Hot: the isolated host sends the inner Scale's key to its child
            comp.set("Weight", 0.2)
            e.update()
            results.append((first, e.read(comp, "Out")))
    (n1, n2), (i1, i2) = results
    np.testing.assert_array_equal(n1, i1)
    np.testing.assert_array_equal(n2, i2)
    w = np.float32(0.2)
    np.testing.assert_allclose(n2, _box3(_box3(x, w), w) * np.float32(0.5), rtol=1e-6, atol=1e-6)


def test_the_standalone_host_applies_composite_file_edits_while_running(folder: Path) -> None:
    from cudapatch.host_plugin.hosts.standalone import StandaloneHost

    patch = folder / "patch.toml"
    patch.write_text(
        'links = ["fill.Out -> smooth.In"]\n\n[operators.fill]\ntype = "core.Fill"\nCount = 4096\nValue = 1.5\n\n'
        '[operators.smooth]\ntype = "core.Composite"\nPath = "smooth.toml"\nGain = 2.0\n'
    )
    comp_file = folder / "smooth.toml"
    original = comp_file.read_text()
    with StandaloneHost(patch) as host:
        eng = host.engine
        eng.wait_ready()
        eng.update()
        smooth = host.adapter.block("smooth")
        np.testing.assert_allclose(eng.read(smooth, "Out"), 3.0, rtol=1e-5)  # 1.5 * (3 w)^2 * 2, w = 1/3
        rebuilds = eng.counters.rebuilds
        comp_file.write_text(original.replace('type = "core.Scale"', 'type = "core.Scale"\nOffset = 1.0'))
        assert host.poll_patch(force=True)
        eng.wait_ready()
        eng.update()
        np.testing.assert_allclose(eng.read(smooth, "Out"), 4.0, rtol=1e-5)
        assert eng.counters.rebuilds > rebuilds and smooth.get("Gain") == 2.0  # the patch's value stays
        comp_file.write_text("[operators.h\n")  # broken: reported, the composite keeps running
        assert not host.poll_patch(force=True)
        assert host.reload_errors and host.reload_errors[-1].file.endswith("smooth.toml")
        eng.update()
        np.testing.assert_allclose(eng.read(smooth, "Out"), 4.0, rtol=1e-5)


def test_switching_child_graph_on_rebuilds_and_computes_the_same(
    engine: Engine, registry, folder: Path, rng: np.random.Generator
) -> None:
    x = _rand(rng, 50_000)
    comp = engine.add(_smooth(registry, folder, "smooth", Gain=0.75))
    engine.bind(comp, "In", x)
    engine.update()
    flat = engine.read(comp, "Out")
    rebuilds = engine.counters.rebuilds
    comp.set("ChildGraph", 1)
    engine.update()
    assert engine.counters.rebuilds == rebuilds + 1 and len(engine.graph.plan.children) == 1
    np.testing.assert_array_equal(engine.read(comp, "Out"), flat)
    comp.set("Gain", 1.5)  # Hot, through the child node
    engine.update()
    np.testing.assert_array_equal(engine.read(comp, "Out"), flat * np.float32(2.0))
    assert engine.counters.rebuilds == rebuilds + 1


@pytest.mark.parametrize("child_graph", [0, 1], ids=["flattened", "child-graph"])
def test_a_fused_composite_equals_the_unfused_one(rng: np.random.Generator, child_graph: int) -> None:
    x = _rand(rng, 20_000)
    out = []
    for fuse in (False, True):
        with Engine(wait_for_compile=True, fuse=fuse) as e:
            two = e.add(TwoScales(name="two", Gain=1.25, ChildGraph=child_graph))
            e.bind(two, "In", x)
            e.update()
            first = e.read(two, "Out")
            rebuilds = e.counters.rebuilds
            two.set("Gain", -0.5)  # Hot: both members' slots in the fused kernel
            e.update()
            out.append((first, e.read(two, "Out")))
            assert e.counters.rebuilds == rebuilds
    (a1, a2), (b1, b2) = out
    np.testing.assert_array_equal(a1, b1)
    np.testing.assert_array_equal(a2, b2)


@pytest.mark.parametrize("child_graph", [0, 1], ids=["flattened", "child-graph"])
def test_a_probe_on_a_composites_output(
    engine: Engine, registry, folder: Path, rng: np.random.Generator, child_graph: int
) -> None:
    x = _rand(rng, 10_000)
    comp = engine.add(_smooth(registry, folder, "smooth", Gain=1.5, ChildGraph=child_graph))
    engine.bind(comp, "In", x)
    probe = engine.probe(comp, "Out")
    engine.update()
    run_until(engine, lambda: probe.stats is not None, timeout=10)
    out = engine.read(comp, "Out")
    st = probe.stats
    assert st.values == x.size and st.nan == 0 and st.inf == 0
    assert st.minimum == pytest.approx(float(out.min()), rel=1e-6) and st.maximum == pytest.approx(
        float(out.max()), rel=1e-6
    )
