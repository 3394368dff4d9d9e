"""Regions, FrameDelay and composites through the isolated engine, on the CPU: what the host sends for
``add(region=)`` and ``place``, round trips of placements into a child patch whose graph plan equals
the in-process one, ``iterations``/``stats``/``output_shape`` answered from the child's messages, and
the ``Engine`` attributes the isolated engine does not offer failing clearly."""

from __future__ import annotations

import itertools
import pickle
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from cudapatch import CustomKernel, DType, Engine, Fill, For, FrameDelay, If, KernelFile, Scale, While
from cudapatch.blocks.regions import Region
from cudapatch.blocks.shape import Shape
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.profiling import BlockStats, EngineStats, ProfilingLevel
from cudapatch.errors import CudapatchError
from cudapatch.host_plugin.plan_view import format_plan
from cudapatch.isolated import IsolatedEngine
from cudapatch.isolated.host import NotInIsolatedEngine
from cudapatch.isolated.mirror import (
    AddBlock,
    ChildPatch,
    Connect,
    Disable,
    MirrorComposite,
    MirrorRegion,
    PatchMirror,
    Place,
    RemoveBlock,
    patch_view,
)
from cudapatch.isolated.protocol import OutputHandle

from .plan_engine import PlanOnlyEngine
from .test_isolated import FakeChild, FakeHostSide, Pair, _export, fake_isolated
from .test_isolated_states import bare_server

ROOT = Path(__file__).resolve().parents[2]
JACOBI = ROOT / "examples" / "jacobi"
HALVE = """extern "C" __global__ void halve(/*inout*/ float* x, unsigned int n)
{ unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= 0.5f; }"""
ABOVE = """extern "C" __global__ void above(const float* in, int* more, float level, unsigned int n)
{ if (blockIdx.x == 0 && threadIdx.x == 0) more[0] = in[0] > level; }"""


def _jacobi(e, nx: int = 16):
    """The Jacobi While of examples/08_jacobi.py on ``e`` (anything with ``add(region=)``/``connect``)."""
    n = nx * nx
    zero = e.add(Fill(name="Zero", Count=n, Value=0.0))
    src = e.add(Fill(name="Source", Count=n, Value=1.0))
    solve = e.add(While(name="Solve", Max=500))
    a = e.add(KernelFile(JACOBI / "jacobi_a.cu", name="SweepA", h2=0.01, nx=nx), region=solve)
    b = e.add(KernelFile(JACOBI / "jacobi_b.cu", name="SweepB", h2=0.01, nx=nx), region=solve)
    d = e.add(KernelFile(JACOBI / "decide.cu", name="Decide", tol=1e-6), region=solve)
    for s, sp, t, tp in (
        (zero, "Out", a, "u"), (zero, "Out", b, "u"), (src, "Out", a, "f"), (src, "Out", b, "f"),
        (a, "half", b, "half"), (b, "u", d, "u"), (a, "half", d, "half"), (d, "more", solve, "Condition"),
    ):  # fmt: skip
        e.connect(s, sp, t, tp)
    return solve, b, d


def _steps(e):
    """The FrameDelay-in-a-For patch of docs/regions.md, plus an If after it."""
    loop = e.add(For(name="Steps", Count=10))
    state = e.add(FrameDelay(name="State", Count=4096, Fill=0.0), region=loop)
    step = e.add(Scale(name="Step", Factor=0.5, Offset=1.0), region=loop)
    e.connect(state, "Out", step, "In")
    e.connect(step, "Out", state, "In")
    check = e.add(CustomKernel(name="Check", Code=ABOVE, level=1.0))
    e.connect(step, "Out", check, "in")
    maybe = e.add(If(name="Maybe"))
    body = e.add(Scale(name="Body", Factor=3.0), region=maybe)
    e.connect(check, "more", maybe, "Condition")
    e.connect(step, "Out", body, "In")
    return loop, step


def _mirrored(build):
    """The patch ``build`` makes, compiled in process (a ``PlanOnlyEngine``) and through the mirror (edits
    pickled, applied to a ``PlanOnlyEngine`` standing for the child's engine): both plans as text."""
    direct = PlanOnlyEngine()
    build(direct)
    direct.update()
    host = PlanOnlyEngine()  # the host's side of the mirror: only its Context is read (never planned)
    build(host)
    mirror, child = PatchMirror(_export), ChildPatch(PlanOnlyEngine(), lambda h: h)
    edits = mirror.diff(patch_view(host.context))
    child.apply(pickle.loads(pickle.dumps(edits)))
    child.engine.update()
    return direct, child, edits, host, mirror


@pytest.mark.parametrize("build", [_jacobi, _steps], ids=["jacobi-while", "for-delay-if"])
def test_a_region_patch_through_the_mirror_plans_as_in_process(build):
    direct, child, edits, host, _ = _mirrored(build)
    assert direct.plan is not None and direct.plan.regions and not direct.errors
    assert format_plan(child.engine, child.engine.plan) == format_plan(direct, direct.plan)
    # the regions arrive as regions (Engine.place takes only those), then one Place per block inside
    regions = [b for b in child.engine.context.registry if isinstance(b, Region)]
    assert regions and all(isinstance(r, MirrorRegion) for r in regions)
    assert {r.name: r.kind for r in regions} == {b.name: b.kind for b in host.context.registry if isinstance(b, Region)}
    places = [e for e in edits if isinstance(e, Place)]
    assert {(p.id, p.region) for p in places} == set(host.context.parents.items())
    first_place = edits.index(places[0])
    assert all(isinstance(e, AddBlock) for e in edits[:first_place])  # every block exists before it is placed
    assert not any(isinstance(e, Connect) for e in edits[:first_place])


def test_a_while_without_max_reaches_the_child_and_is_the_same_error_there():
    """Max's default (0: not given) is below the least value ``set`` takes; the child gets it with the
    block's other values and must take it as the block's own, so the error is the build's, on the region."""
    host = Context()
    host.register_block(While(name="Solve"))
    mirror, child = PatchMirror(_export), ChildPatch(PlanOnlyEngine(), lambda h: h)
    child.apply(pickle.loads(pickle.dumps(mirror.diff(host.snapshot()))))
    (solve,) = child.engine.context.registry
    assert solve.get("Max") == 0
    child.engine.update()
    assert any(d.block_id == solve.id and d.code == "region-max" for d in child.engine.errors)


def test_the_jacobi_while_plans_the_same_unrolled_and_nested_in_a_for():
    def nested(e):
        solve, _, _ = _jacobi(e)
        solve.set("Unroll", 4)
        outer = e.add(For(name="Outer", Count=3))
        e.add(Fill(name="Inner", Count=8), region=outer)
        e.place(solve, outer)

    direct, child, *_ = _mirrored(nested)
    assert format_plan(child.engine, child.engine.plan) == format_plan(direct, direct.plan)
    assert direct.plan.regions[next(b.id for b in direct.context.registry if b.name == "Solve")].unroll == 4


def _nodes(engine) -> list[tuple]:
    """The plan's nodes by kind, kernel, owner's (qualified) name and nesting depth in region bodies."""
    plan, names = engine.plan, engine.context.snapshot().names
    out = []
    for n in plan.nodes:
        depth, p = 0, n.index
        while p in plan.scopes:
            depth, p = depth + 1, plan.scopes[p]
        out.append((type(n).__name__, getattr(n, "entry_point", None), names.get(getattr(n, "block_id", None)), depth))
    return out


def _child_parents(child: ChildPatch) -> dict[int, int]:
    to_host = child.to_host
    return {to_host[b]: to_host[r] for b, r in child.engine.context.parents.items()}


def test_placements_follow_moves_and_removals_without_ever_nesting_a_region_in_itself():
    host = Context()
    r1, r2 = host.register_block(For(name="R1")), host.register_block(For(name="R2"))
    a, b = host.register_block(Scale(name="a")), host.register_block(Scale(name="b"))
    host.place(r1, r2)
    host.place(a, r1)
    host.place(b, r2)
    mirror, child = PatchMirror(_export), ChildPatch(PlanOnlyEngine(), lambda h: h)
    child.apply(mirror.diff(host.snapshot()))
    assert _child_parents(child) == host.parents
    host.place(r1, None)  # R1 out of R2, then R2 into R1: sent as outs first, then ins
    host.place(r2, r1)
    edits = mirror.diff(host.snapshot())
    assert edits == [Place(r1.id, None), Place(r2.id, r1.id)]
    child.apply(edits)
    assert _child_parents(child) == host.parents
    host.place(a, None)
    edits = mirror.diff(host.snapshot())
    assert edits == [Place(a.id, None)]
    child.apply(edits)
    host.unregister_block(r2)  # its blocks move to the region around it (R1), on both sides alike
    edits = mirror.diff(host.snapshot())
    assert edits == [RemoveBlock(r2.id)]
    child.apply(edits)
    assert _child_parents(child) == host.parents == {b.id: r1.id}
    assert mirror.diff(host.snapshot()) == []


@pytest.mark.parametrize("child_graph", [False, True], ids=["flattened", "child-graph"])
@pytest.mark.parametrize("in_loop", [False, True], ids=["top", "in-for"])
def test_a_composite_plans_as_in_process(child_graph, in_loop):
    """The child composes the composite again from its record: its plan is the in-process one, at the
    top level and in a For's body, flattened and asking for a child-graph node."""

    def build(e):
        f = e.add(Fill(name="f", Count=64))
        loop = e.add(For(name="Loop", Count=3)) if in_loop else None
        pair = e.add(Pair(name="pair", Gain=1.5, child_graph=child_graph), region=loop)
        e.connect(f, "Out", pair, "In")

    direct, child, edits, host, _ = _mirrored(build)
    assert _nodes(child.engine) == _nodes(direct)
    assert any(depth for *_, depth in _nodes(direct)) == in_loop
    assert len(child.engine.plan.children) == len(direct.plan.children)
    assert len(direct.plan.children) == int(child_graph and not in_loop)  # a body holds no child graph
    pair = host.context.registry.by_name("pair")
    assert isinstance(child.blocks[pair.id], MirrorComposite)
    if in_loop:
        assert Place(pair.id, host.context.registry.by_name("Loop").id) in [e for e in edits if isinstance(e, Place)]


def test_a_composite_file_through_the_mirror_plans_as_in_process():
    from cudapatch.host_plugin import PluginHost

    registry = PluginHost().registry

    def build(e):
        smooth = registry.get("core.Composite").cls(
            name="smooth", Path=str(ROOT / "examples" / "composites" / "smooth.toml"), Gain=2.0
        )
        f = e.add(Fill(name="f", Count=256))
        e.add(smooth)
        e.connect(f, "Out", smooth, "In")

    direct, child, *_ = _mirrored(build)
    assert _nodes(child.engine) == _nodes(direct) and len(_nodes(direct)) >= 3
    mine = child.engine.context.registry.by_name("smooth")
    assert mine.get("Path").endswith("smooth.toml") and mine.composite_file() == mine.layout.file


def test_an_inner_blocks_diagnostic_is_on_the_composite_in_the_child_as_in_process():
    def build(e):
        e.add(Pair(name="pair"))  # its exposed input unlinked: a diagnostic of the inner block 'pair/a'

    direct, child, _, host, _ = _mirrored(build)
    pair = host.context.registry.by_name("pair")
    want = [
        (d.code, d.message) for d in direct.diagnostics() if d.block_id == direct.context.registry.by_name("pair").id
    ]
    got = [(d.code, d.message) for d in child.engine.diagnostics() if child.to_host.get(d.block_id) == pair.id]
    assert want and got == want and "'pair/a'" in want[0][1]


# -- the host side against fakes ------------------------------------------------------------------------
iso = pytest.fixture(fake_isolated, name="iso")


def _answer(child: FakeChild, value, *before) -> None:
    """The child answers the host's next request with ``value``, after the messages ``before``."""

    def wait_readable(timeout):
        rid = [m for m in child.sent if m[0] == "request"][-1][1]
        child.inbox.extend(before)
        child.inbox.append(("reply", rid, True, value))

    child.wait_readable = wait_readable


def test_add_with_a_region_and_place_reach_the_child_as_place_edits(iso):
    solve, sweep_b, decide = _jacobi(iso)
    iso.update()
    child = iso.children[0]
    first = child.sent[0][1]
    regions = [e for e in first if isinstance(e, AddBlock) and e.id == solve.id]
    assert regions and regions[0].description.kind == "while"
    assert {e for e in first if isinstance(e, Place)} == {Place(b.id, solve.id) for b in iso.blocks[3:6]}
    iso.place(decide, None)  # out of the While: a structure edit
    iso.update()
    assert Place(decide.id, None) in child.edits() and iso.counters.rebuilds == 2
    iso.place(decide, solve)
    iso.update()
    assert child.edits()[-3:].count(Place(decide.id, solve.id)) == 1
    with pytest.raises(CudapatchError, match="not a region"):
        iso.add(Scale(name="x"), region=sweep_b)
    with pytest.raises(CudapatchError, match="inside itself"):
        iso.place(solve, solve)


def test_a_new_child_gets_the_placements_again(iso):
    solve, *_ = _jacobi(iso)
    iso.update()
    iso.children[0].eof = True
    iso.children[0].exit = "killed by SIGSEGV"
    iso.update()
    second = iso.children[1]
    assert {e for e in second.edits() if isinstance(e, Place)} == {Place(b.id, solve.id) for b in iso.blocks[3:6]}


def test_iterations_asks_the_child_for_the_region(iso):
    solve, *_ = _jacobi(iso)
    iso.update()
    child = iso.children[0]
    _answer(child, 1860)
    assert iso.iterations(solve) == 1860
    assert [m for m in child.sent if m[0] == "request"][-1][2:] == ("iterations", (solve.id,))


def test_stats_reads_the_childs_frame_and_changes_no_host_block(iso):
    solve, sweep_b, decide = _jacobi(iso)
    iso.set_profiling("PerBlock")
    iso.update()
    child = iso.children[0]
    warning = ("warning", solve.id, "region-max", "While 'Solve' stopped at Max (500 iterations) before ...")
    rows = (BlockStats(solve.id, "Solve", "Warning", "", 1.25), BlockStats(decide.id, "Decide", "OK", "", None))
    stats = EngineStats(ProfilingLevel.PER_BLOCK, 7, 1, 2.5, rows, 3, 0, 0, diagnostics=(warning,))
    before = str(solve), dict(solve.debug.append_fill)
    _answer(child, (stats, {}))
    got = iso.stats()
    assert [m for m in child.sent if m[0] == "request"][-1][2:] == ("stats", ())
    assert got.diagnostics[0].code == "region-max" and got.blocks[0].gpu_ms == 1.25
    assert (str(solve), dict(solve.debug.append_fill)) == before and not iso.diagnostics(solve)


def test_show_frame_puts_times_iterations_and_the_max_warning_on_the_host_blocks(iso):
    solve, sweep_b, decide = _jacobi(iso)
    iso.set_profiling("PerBlock")
    iso.update()
    child = iso.children[0]
    warning = ("warning", solve.id, "region-max", "While 'Solve' stopped at Max (500 iterations) before ...")
    rows = (BlockStats(solve.id, "Solve", "Warning", "", 1.25), BlockStats(decide.id, "Decide", "OK", "", None))
    stats = EngineStats(ProfilingLevel.PER_BLOCK, 7, 1, 2.5, rows, 3, 0, 0, diagnostics=(warning,))
    _answer(child, (stats, {solve.id: (500, 500)}), ("diagnostics", (warning,), {solve.id: ("Warning", "")}))
    got = iso.show_frame()
    assert [m for m in child.sent if m[0] == "request"][-1][2:] == ("show_frame", ())
    assert got.diagnostics[0].code == "region-max" and got.blocks[0].gpu_ms == 1.25
    assert any(d.code == "region-max" for d in iso.diagnostics(solve))
    assert str(solve).startswith("Solve: Warning, 1.25ms") and "Iterations: 500/500" in str(solve)


def test_output_shape_and_port_sizes_come_with_the_childs_build(iso):
    f = iso.add(Fill(name="f", Count=64))
    s = iso.add(Scale(name="s"))
    iso.connect(f, "Out", s, "In")
    iso.update()
    with pytest.raises(CudapatchError, match="not running"):
        iso.output_shape(s, "Out")
    img = Shape.of(4, 16)
    child = iso.children[0]
    child.inbox.append(("outputs", {(s.id, "Out"): OutputHandle(b"x" * 64, 0, 64, DType.FLOAT32, 256, img)}, True))
    child.inbox.append(("built", {s.id: ({"Out": 64}, {"Out": img}, "f -> s"), f.id: ({"Out": 64}, {}, "")}))
    iso.update()
    assert iso.output_shape(s, "Out") == img
    assert str(s.port("Out")).startswith("Out: float") and "256 bytes" in str(s.port("Out"))
    assert "fused: f -> s" in str(s)
    child.inbox.append(("outputs", {(f.id, "Out"): OutputHandle(b"x" * 64, 0, 64, DType.FLOAT32, 256)}, True))
    iso.update()
    assert iso.output_shape(f, "Out") == Shape.flat(64)
    with pytest.raises(CudapatchError, match="no such output"):
        iso.output_shape(f, "Nope")


def test_building_holds_from_a_structure_edit_until_the_child_says_it_runs(iso):
    _jacobi(iso)
    assert iso.building  # not sent yet
    iso.update()
    assert iso.building  # sent: the child has not answered
    iso.children[0].inbox.append(("building", False))
    iso.update()
    assert not iso.building


def test_engine_attributes_that_live_in_the_engine_process_fail_clearly(iso):
    assert not hasattr(iso, "probe") and getattr(iso, "pool", None) is None
    for name in ("probe", "probes", "append_buffer", "pool", "resources", "libraries", "modules", "kernels"):
        with pytest.raises(CudapatchError, match=f"engine.{name} is not available in an isolated engine"):
            getattr(iso, name)
        with pytest.raises(AttributeError):
            getattr(iso, name)
    with pytest.raises(AttributeError) as info:
        iso.no_such_thing  # noqa: B018  (the access is the test)
    assert not isinstance(info.value, NotInIsolatedEngine)
    iso.prepare_fault_replay()  # the child does it: nothing to do here


def test_every_public_engine_attribute_is_forwarded_or_refused_with_a_reason(iso):
    """The isolated engine's API is the Engine's: a public name of Engine is either an attribute here
    or listed with a reason (``UNSUPPORTED``); a new Engine method fails this test until it is one."""
    from cudapatch.isolated.host import UNSUPPORTED

    names = {n for n in dir(Engine) if not n.startswith("_")}
    names |= {"device", "context", "counters", "last_build", "profiling", "wait_for_compile", "name"}
    names |= {"debug_launch", "background_builds", "kernels", "kernel_cache", "resources"}
    missing = sorted(n for n in names if n not in UNSUPPORTED and n not in dir(IsolatedEngine) and n not in vars(iso))
    assert missing == []


def test_engine_options_reach_the_child():
    children = []
    e = Engine(
        isolated=True,
        host_side=FakeHostSide(),
        launch=lambda cfg: children.append(FakeChild(cfg)) or children[-1],
        background_builds=False,
        debug_launch=True,
        freeze_collector=False,
        reuse_buffers=True,
    )
    e.close()
    cfg = children[0].cfg
    assert (cfg.background_builds, cfg.debug_launch, cfg.freeze_collector) == (False, True, False)
    assert e.background_builds is False and e.debug_launch is True


def test_an_exposed_parameter_goes_hot_to_the_childs_composite(iso):
    pair = iso.add(Pair(name="pair"))
    f = iso.add(Fill(name="f", Count=64))
    iso.connect(f, "Out", pair, "In")
    iso.update()
    child = iso.children[0]
    (add,) = [e for e in child.edits() if isinstance(e, AddBlock) and e.id == pair.id]
    assert [o.op for o in add.description.ops] == ["a", "b"]
    assert [o.id for o in add.description.ops] == [pair.inner("a").id, pair.inner("b").id]
    pair.set("Gain", 4.0)
    iso.update()
    assert child.sent[-1] == ("frame", 2, ((pair.id, "Gain", 4.0),))


def test_the_child_answers_iterations_and_stats_with_its_loops():
    """The child's side of the requests, over a fake engine: ids translated both ways."""
    from cudapatch.isolated import child as child_module

    host = Context()
    f = host.register_block(Fill(name="f", Count=8))
    loop = host.register_block(For(name="L", Count=5))
    mirror, patch = PatchMirror(_export), ChildPatch(PlanOnlyEngine(), lambda h: h)
    patch.apply(mirror.diff(host.snapshot()))
    mine = patch.blocks[loop.id]

    class FakeEngine:
        def iterations(self, b):
            return 5 if b is mine else None

        def stats(self):
            rows = (BlockStats(mine.id, "L", "OK", "", 0.5), BlockStats(patch.blocks[f.id].id, "f", "OK", "", None))
            return EngineStats(ProfilingLevel.PER_BLOCK, 3, 1, 1.0, rows, 1, 0, 0)

        def show_frame(self):
            mine.debug.append_fill = {"Iterations": (5, 5)}
            return self.stats()

    server = child_module._Server.__new__(child_module._Server)
    server.engine, server.patch = FakeEngine(), patch
    assert server.request("iterations", (loop.id,)) == 5
    assert server.request("iterations", (f.id,)) is None
    stats, loops = pickle.loads(pickle.dumps(server.request("stats", ())))
    assert loops == {} and not mine.debug.append_fill  # a read: no tooltip changed, none sent
    stats, loops = pickle.loads(pickle.dumps(server.request("show_frame", ())))
    assert loops == {loop.id: (5, 5)} and [b.block_id for b in stats.blocks] == [loop.id, f.id]
    assert np.isclose(stats.blocks[0].gpu_ms, 0.5)


def test_a_frame_delays_pair_is_mapped_twice_and_output_follows_the_frames_parity(iso):
    """A value in a FrameDelay's pair lives in two buffers that swap every frame (two executables): the
    host maps both and hands out the one the frame sent last writes, as ``Engine.output`` does."""
    delay = iso.add(FrameDelay(name="d", Count=64))
    step = iso.add(Scale(name="step", Factor=0.5))
    iso.connect(delay, "Out", step, "In")
    iso.connect(step, "Out", delay, "In")
    iso.update()
    iso.update()  # frame 2
    pair = OutputHandle(b"x" * 64, 128, 64, DType.FLOAT32, 256, None, (b"y" * 64, 512), 2)
    iso.children[0].inbox.append(("outputs", {(step.id, "Out"): pair}, True))
    iso.update()  # frame 3: the other buffer
    assert iso.output(step, "Out") == ("mapped", 512)
    iso.update()  # frame 4: the first again
    assert iso.output(step, "Out") == ("mapped", 128)
    assert iso.output(step, "Out") == ("mapped", 128)
    iso.update()
    assert iso.output(step, "Out") == ("mapped", 512)
    assert [c for c in iso.gpu.calls if c[0] == "import"] == [("import", 128), ("import", 512)]  # mapped once each


def test_the_child_sends_both_buffers_of_a_pair_and_one_of_anything_else():
    from types import SimpleNamespace

    from cudapatch.isolated.child import _other_of_pair

    bufs = [SimpleNamespace(ptr=p) for p in (1000, 2000, 3000)]
    plan = SimpleNamespace(outputs={(7, "Out"): 0, (8, "Out"): 2}, swaps={0: 1, 1: 0})
    g = SimpleNamespace(plan=plan, buffers=bufs, bypass=SimpleNamespace(outputs={}))
    assert _other_of_pair(g, 7, "Out", bufs[0]) is bufs[1]
    assert _other_of_pair(g, 7, "Out", bufs[1]) is bufs[0]  # phase 1: output() gave the swapped one
    assert _other_of_pair(g, 8, "Out", bufs[2]) is None  # no pair
    assert _other_of_pair(g, 9, "Out", bufs[2]) is None  # not in the plan
    g.bypass.outputs[(7, "Out")] = 2  # bypassed: what its readers read, one buffer
    assert _other_of_pair(g, 7, "Out", bufs[2]) is None


def test_a_composites_diagnostics_include_its_inner_blocks_as_in_process(iso):
    pair = iso.add(Pair(name="pair"))
    iso.update()
    a = pair.inner("a")
    why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'pair/a' (kernel scale): the block is disabled"
    iso.children[0].inbox.append(("diagnostics", (("error", a.id, "gpu-fault", why),), {pair.id: ("Error", why)}))
    iso.update()
    assert [d.message for d in iso.diagnostics(pair)] == [why] == [d.message for d in iso.diagnostics(a)]
    assert str(pair).startswith("pair: Error")


def test_a_fault_in_a_composites_inner_block_keeps_it_disabled_in_the_next_child(iso):
    pair = iso.add(Pair(name="pair"))
    f = iso.add(Fill(name="f", Count=64))
    iso.connect(f, "Out", pair, "In")
    iso.update()
    first, a = iso.children[0], pair.inner("a")
    why = "CUDA_ERROR_ILLEGAL_ADDRESS in block 'pair/a' (kernel scale): the block is disabled"
    first.inbox.append(("fault", (("error", a.id, "gpu-fault", why),), {a.id: why}))
    iso.update()
    assert Disable(a.id, why) in iso.children[1].edits()
    assert any(d.code == "gpu-fault" for d in iso.diagnostics(pair)) and str(pair).startswith("pair: Error")
    mine = ChildPatch(PlanOnlyEngine(), lambda h: h)  # the child side: the inner block is found by its host id
    disabled = []
    mine.engine.disable = lambda b, reason: disabled.append((b.name, reason))
    mine.apply([e for e in iso.children[1].edits() if isinstance(e, (AddBlock, Disable))])
    assert disabled == [("a", why)]


def _engine_of(graph, *, building: bool) -> SimpleNamespace:
    """What the engine process's server reads of its engine: the graph, whether a build runs."""
    return SimpleNamespace(
        graph=graph,
        lost=None,
        building=building,
        diagnostics=lambda: (),
        context=SimpleNamespace(dirty=SimpleNamespace(structure=False)),
    )


def test_the_child_tells_outputs_with_shapes_and_pairs_then_what_changed_and_whether_it_builds(monkeypatch):
    """The child's ``tell`` over a fake engine and graph: output handles (a delay pair with both buffers),
    the blocks' sizes only where they changed, ``building`` after every edits message and on change."""
    from types import SimpleNamespace

    from cudapatch.isolated import ipc

    monkeypatch.setattr(ipc, "export_device_memory", lambda ptr: (b"h%d" % ptr, 0))
    host = Context()
    f = host.register_block(Fill(name="f", Count=8))
    s = host.register_block(Scale(name="s"))
    host.connect(f, "Out", s, "In")
    mirror, patch = PatchMirror(_export), ChildPatch(PlanOnlyEngine(), lambda h: h)
    patch.apply(mirror.diff(host.snapshot()))
    cf, cs = patch.blocks[f.id], patch.blocks[s.id]
    bufs = [SimpleNamespace(ptr=p, count=8, dtype=DType.FLOAT32, nbytes=32) for p in (100, 200, 300)]
    plan = SimpleNamespace(
        outputs={(cf.id, "Out"): 0, (cs.id, "Out"): 1}, swaps={1: 2, 2: 1}, shapes={(cf.id, "Out"): Shape.of(2, 4)}
    )
    graph = SimpleNamespace(
        plan=plan,
        buffers=bufs,
        bypass=SimpleNamespace(outputs={}),
        output=lambda bid, port: bufs[plan.outputs[(bid, port)]] if (bid, port) in plan.outputs else None,
    )
    engine = _engine_of(None, building=True)
    sent: list = []
    server = bare_server(engine, patch, sent.append, 4)
    server.tell(edited=True)
    assert sent == [("building", True), ("diagnostics", (), {f.id: ("NotCompiled", ""), s.id: ("NotCompiled", "")})]
    sent.clear()
    cf.debug.sizes, cs.debug.sizes = {"Out": 8}, {"Out": 8}
    engine.graph, engine.building = graph, False
    server.tell()
    outputs = sent[0][1]
    assert outputs[(f.id, "Out")] == OutputHandle(b"h100", 0, 8, DType.FLOAT32, 32, Shape.of(2, 4), (), 4)
    assert outputs[(s.id, "Out")] == OutputHandle(b"h200", 0, 8, DType.FLOAT32, 32, None, (b"h300", 0), 4)
    assert sent[1] == ("built", {f.id: ({"Out": 8}, {}, ""), s.id: ({"Out": 8}, {}, "")})
    assert sent[2] == ("building", False) and len(sent) == 3
    sent.clear()
    engine.graph = SimpleNamespace(**{**vars(graph)})  # a rebuild that changed only s
    cs.debug.fused = "f -> s"
    server.tell()
    assert sent[0][0] == "outputs" and sent[1] == ("built", {s.id: ({"Out": 8}, {}, "f -> s")}) and len(sent) == 2


def test_the_child_sends_outputs_again_after_a_warm_patch_that_moved_or_resized_one(monkeypatch):
    """A Warm patch keeps the graph and gives it a new plan: the handles go again (``replaced`` False)
    when an output's buffer moved (grown from the pool), changed its count or shape, and not otherwise;
    a new graph always sends them (``replaced`` True)."""
    from types import SimpleNamespace

    from cudapatch.isolated import child as child_module
    from cudapatch.isolated import ipc

    monkeypatch.setattr(ipc, "export_device_memory", lambda ptr: (b"h%d" % ptr, 0))
    host = Context()
    f = host.register_block(Fill(name="f", Count=8))
    s = host.register_block(Scale(name="s"))
    host.connect(f, "Out", s, "In")
    mirror, patch = PatchMirror(_export), ChildPatch(PlanOnlyEngine(), lambda h: h)
    patch.apply(mirror.diff(host.snapshot()))
    cf, cs = patch.blocks[f.id], patch.blocks[s.id]
    bufs = [SimpleNamespace(ptr=p, count=8, dtype=DType.FLOAT32, nbytes=32) for p in (100, 200)]

    def plan(shapes=None):
        return SimpleNamespace(outputs={(cf.id, "Out"): 0, (cs.id, "Out"): 1}, swaps={}, shapes=shapes or {})

    graph = SimpleNamespace(
        plan=plan(),
        buffers=bufs,
        bypass=SimpleNamespace(outputs={}),
        output=lambda bid, port: bufs[graph.plan.outputs[(bid, port)]],
    )
    engine = _engine_of(graph, building=False)
    sent: list = []
    server = bare_server(engine, patch, sent.append, 4)

    def outputs_sent():
        out = [m for m in sent if m[0] == "outputs"]
        sent.clear()
        return out

    server.tell()
    ((_, first, replaced),) = outputs_sent()
    assert replaced and first[(s.id, "Out")] == OutputHandle(b"h200", 0, 8, DType.FLOAT32, 32, None, (), 4)
    graph.plan = plan()  # a Warm patch that changed no output (a grid, a scalar)
    server.tell()
    assert outputs_sent() == []
    bufs[1].ptr, bufs[1].count, bufs[1].nbytes = 900, 16, 64  # grown from the pool, as ExecutableGraph.try_patch does
    graph.plan = plan()
    server.last_frame = 9
    server.tell()
    ((_, after, replaced),) = outputs_sent()
    assert not replaced
    assert after[(s.id, "Out")] == OutputHandle(b"h900", 0, 16, DType.FLOAT32, 64, None, (), 9)
    assert after[(f.id, "Out")].handle == b"h100"
    graph.plan = plan({(cf.id, "Out"): Shape.of(2, 4)})  # the same memory, another shape
    server.tell()
    ((_, after, replaced),) = outputs_sent()
    assert not replaced and after[(f.id, "Out")].shape == Shape.of(2, 4)
    server.tell()  # a frame: nothing built, nothing sent
    assert outputs_sent() == []
    engine.graph = SimpleNamespace(**vars(graph))  # a new graph over the same buffers: sent, replaced
    server.tell()
    ((_, _, replaced),) = outputs_sent()
    assert replaced
    assert child_module.outputs_changed(False, {(1, "Out"): (1, 2)}, {(1, "Out"): (1, 2)}) is False
    assert child_module.outputs_changed(True, {(1, "Out"): (1, 2)}, {(1, "Out"): (1, 2)}) is True


class _DeviceArray:
    """Device memory as ``__cuda_array_interface__`` (the fake host side exports it by pointer)."""

    def __init__(self, ptr: int, n: int = 16) -> None:
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "<f4", "data": (ptr, False), "version": 3}


def test_unshareable_memory_is_refused_at_bind_and_update_goes_on(iso):
    from cudapatch.blocks.library.transfer import Upload
    from cudapatch.errors import BindingError
    from cudapatch.isolated.mirror import Bind

    def export(binding):
        if binding.ptr >= 1 << 40:  # stands for pinned host memory or a cudaMallocAsync pool
            raise BindingError("this memory cannot be shared with the isolated engine process (CUDA_ERROR_X)")
        return _export(binding)

    iso.gpu.export = export
    s = iso.add(Scale(name="s"))
    with pytest.raises(BindingError, match="cannot be shared") as info:
        iso.bind(s, "In", _DeviceArray(1 << 40))
    assert (info.value.block, info.value.port) == ("s", "In") and (s.id, "In") not in iso.context.bindings
    iso.bind(s, "In", _DeviceArray(4096))
    iso.update()  # never raises: the binding was checked when made
    assert [e for e in iso.children[0].edits() if isinstance(e, Bind)][0].input.offset == 4096
    iso.bind(s, "In", _DeviceArray(8192))  # Warm: another pointer of the same size
    iso.update()
    assert [e for e in iso.children[0].edits() if isinstance(e, Bind)][-1].input.offset == 8192
    assert iso._exports == {}
    up = iso.add(Upload(name="up", Count=16))
    with pytest.raises(BindingError, match=r"make the ring for this engine \(UploadRing\(engine, block\)\)"):
        iso.bind(up, "Ring", _DeviceArray(1 << 41, 64))  # a ring made for another engine


@pytest.mark.parametrize("example", ["08_jacobi.toml", "10_reaction_diffusion.toml", "composites/patch.toml"])
def test_an_example_patch_file_through_the_adapter_plans_in_the_child_as_in_process(example):
    """What ``cudapatch run --isolated`` and the TouchDesigner binding do: the host adapter applies a patch
    file (regions by ``region = ...``, delays, composites by file) to the isolated engine; the child's
    patch, made from the edits the host sends, plans as the same file applied to an in-process engine."""
    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch

    registry = PluginHost().registry
    path = ROOT / "examples" / example
    children: list[FakeChild] = []
    iso = Engine(
        isolated=True, host_side=FakeHostSide(), launch=lambda cfg: children.append(FakeChild(cfg)) or children[-1]
    )
    try:
        apply_patch(HostAdapter(iso, registry, search_paths=[path.parent]), load_patch(path, registry))
        iso.update()
        mine = ChildPatch(PlanOnlyEngine(), lambda h: h)
        mine.apply([e for m in children[0].sent if m[0] == "edits" for e in m[1]])
        mine.engine.update()
        direct = PlanOnlyEngine()
        apply_patch(HostAdapter(direct, registry, search_paths=[path.parent]), load_patch(path, registry))
        direct.update()
        assert direct.plan is not None and mine.engine.plan is not None
        assert _nodes(mine.engine) == _nodes(direct)
        assert bool(direct.plan.regions) == ("composites" not in example)
    finally:
        iso.close()


def test_a_ring_in_pages_both_processes_map_is_bound_by_name_and_mapped_once_in_the_child(monkeypatch):
    """``share_host_memory`` pages (what Upload/Download rings use for an isolated engine): the host
    exports a pointer inside them as their name and offset; the child maps them once and binds its own
    device address of the same bytes."""
    from types import SimpleNamespace

    from cudapatch.engine.bindings import DeviceArray
    from cudapatch.isolated import child as child_module
    from cudapatch.isolated import ipc
    from cudapatch.isolated.host_side import CudaHostSide

    class Pages:
        def __init__(self, device_ptr, nbytes, path="/proc/1/fd/7"):
            self.device_ptr, self.nbytes, self.path = device_ptr, nbytes, path

        def contains(self, ptr):
            return self.device_ptr <= ptr < self.device_ptr + self.nbytes

    side = CudaHostSide.__new__(CudaHostSide)
    side._shared, side._serials = weakref.WeakValueDictionary(), itertools.count(1)
    pages = Pages(1 << 30, 8192)
    side._shared[next(side._serials)] = pages
    h = side.export(ExternalBinding((1 << 30) + 4096, 16, DType.UINT64))
    assert h.shared == (1, "/proc/1/fd/7", 8192, 4096) and h.handle == b""
    attached = []

    def attach(path, nbytes):
        attached.append((path, nbytes))
        return Pages(5 << 30, nbytes)

    monkeypatch.setattr(ipc.SharedPages, "attach", staticmethod(attach))
    server = child_module._Server.__new__(child_module._Server)
    server.engine = SimpleNamespace(device=SimpleNamespace(make_current=lambda: None))
    server.shared = {}
    a, b = server.import_input(h), server.import_input(h)
    assert isinstance(a, DeviceArray) and attached == [("/proc/1/fd/7", 8192)]
    assert a.__cuda_array_interface__["data"][0] == b.__cuda_array_interface__["data"][0] == (5 << 30) + 4096


def test_shared_pages_are_the_same_bytes_through_their_name_and_release_cleanly(monkeypatch):
    """``SharedPages`` with the driver calls stubbed (the mapping is what is tested): pages made here and
    attached by their ``/proc`` name are the same memory; released pages are no longer matched."""
    import ctypes
    import os
    from types import SimpleNamespace

    from cudapatch.isolated import ipc

    calls = []
    fake = SimpleNamespace(
        cuMemHostRegister=lambda ptr, n, flags: calls.append(("register", n, flags)) or (0,),
        cuMemHostGetDevicePointer=lambda ptr, flags: (0, ptr + (1 << 40)),
        cuMemHostUnregister=lambda ptr: calls.append(("unregister",)) or (0,),
    )
    monkeypatch.setattr(ipc, "driver", lambda: fake)
    monkeypatch.setattr(ipc.ContextRef, "current", classmethod(lambda cls: None))  # no context to push
    host = ipc.SharedPages.create(100)
    assert host.nbytes == 4096 and os.path.exists(host.path) and host.path.startswith(f"/proc/{os.getpid()}/fd/")
    child = ipc.SharedPages.attach(host.path, host.nbytes)
    ctypes.memmove(host.host_ptr + 8, b"frame 42", 8)  # a store on one side ...
    assert ctypes.string_at(child.host_ptr + 8, 8) == b"frame 42"  # ... is seen on the other
    dev, seen = host.device_ptr, child.host_ptr
    assert host.contains(dev + 4095) and not host.contains(dev + 4096)
    assert host.release() == (0,) and host.release() == (0,) and not host.contains(dev)
    assert ctypes.string_at(seen + 8, 8) == b"frame 42"  # the other mapping keeps the memory
    child.release()
    assert calls == [("register", 4096, 3), ("register", 4096, 3), ("unregister",), ("unregister",)]
