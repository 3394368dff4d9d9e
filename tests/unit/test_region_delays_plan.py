"""FrameDelays in a patch with regions, without a GPU: a delay inside a For body is carried by a copy
node last in the body (after every writer of In and every reader of Out), its init kernel runs before
the loop in the top-level graph, nothing alternates (one executable), and a top-level delay beside a
region gets its copy last in the top-level graph."""

from __future__ import annotations

import pytest

from cudapatch import For, FrameDelay, Scale, VectorAdd
from cudapatch.blocks.library import Fill
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.delay_copy import COPY_ENTRIES, copy_entry, copy_grid
from cudapatch.engine.plan import ConditionalNodePlan, KernelNodePlan
from cudapatch.errors import GraphCompileError


def _body(count: int = 64, steps: int = 8, unroll: int = 1):
    """For(Count=steps) holding d (FrameDelay) -> s (Scale) -> d.In; r (Scale) after the loop reads s."""
    c = Context()
    loop = c.register_block(For(name="Steps", Count=steps, Unroll=unroll))
    d = c.register_block(FrameDelay(name="d", Count=count, Fill=0.0))
    s = c.register_block(Scale(name="s", Factor=0.5, Offset=1.0))
    r = c.register_block(Scale(name="r"))
    c.place(d, loop)
    c.place(s, loop)
    c.connect(d, "Out", s, "In")
    c.connect(s, "Out", d, "In")
    c.connect(s, "Out", r, "In")
    return c, loop, d, s, r


def _nodes(plan, block_id: int) -> list:
    return [plan.nodes[i] for i in plan.block_nodes[block_id]]


def test_a_delay_in_a_for_body_is_carried_by_a_copy_node_last_in_the_body() -> None:
    c, loop, d, s, r = _body()
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    cond = plan.regions[loop.id].node
    init, copy = _nodes(plan, d.id)
    assert dp.node == init.index and dp.copy == copy.index
    assert plan.swaps == {}  # nothing alternates: one executable graph
    # The init kernel writes Out's buffer once, before the loop, in the top-level graph.
    assert init.index not in plan.scopes and init.index < cond
    assert init.args[1].ref == dp.previous
    assert init.index in plan.nodes[cond].deps
    # The copy is in the body, after the writer of In and every reader of Out, and copies In -> Out.
    assert plan.scopes[copy.index] == cond
    assert copy.entry_point == "delay_copy4" and copy.kernel == COPY_ENTRIES["delay_copy4"]
    assert (copy.args[0].ref, copy.args[1].ref, copy.args[2].value) == (dp.current, dp.previous, 64)
    (scale,) = _nodes(plan, s.id)
    assert plan.scopes[scale.index] == cond
    assert scale.args[0].ref == dp.previous and scale.args[1].ref == dp.current
    assert copy.deps == (scale.index,)  # s writes In (RAW) and reads Out (WAR)
    body = sorted(i for i, p in plan.scopes.items() if p == cond)
    assert body == list(range(cond + 1, cond + 1 + len(body)))
    step = plan.nodes[body[-1]]
    assert step.entry_point == "region_for_step" and copy.index == body[-2]
    # The block after the loop waits for the loop.
    (after,) = _nodes(plan, r.id)
    assert cond in after.deps and after.index not in plan.scopes


def test_the_copy_waits_for_every_reader_of_out_and_writer_of_in_in_its_body() -> None:
    c, loop, d, s, r = _body()
    extra = c.register_block(VectorAdd(name="extra"))  # a second reader of Out, inside the body
    c.place(extra, loop)
    c.connect(d, "Out", extra, "A")
    c.connect(s, "Out", extra, "B")
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    copy = plan.nodes[dp.copy]
    assert set(copy.deps) == {_nodes(plan, s.id)[0].index, _nodes(plan, extra.id)[0].index}


def test_count_is_hot_and_the_copy_takes_bytes_for_odd_sizes() -> None:
    c, loop, *_ = _body(steps=3)
    plan = compile_plan(c.snapshot())
    (ni, ai), *_ = plan.scalar_slots[(loop.id, "Count")]
    assert plan.nodes[ni].args[ai].value == 3
    assert copy_entry(4096) == ("delay_copy4", 1024) and copy_entry(6) == ("delay_copy1", 6)
    assert copy_grid(1) == 1 and copy_grid(2**30) == 8192


def test_a_top_level_delay_beside_a_region_gets_its_copy_last_in_the_top_level_graph() -> None:
    c = Context()
    d = c.register_block(FrameDelay(name="d", Count=32))
    f = c.register_block(Fill(name="f", Count=32))
    a = c.register_block(VectorAdd(name="a"))
    loop = c.register_block(For(name="Steps", Count=2, Unroll=1))
    s = c.register_block(Scale(name="s"))
    c.place(s, loop)
    c.connect(d, "Out", a, "A")
    c.connect(f, "Out", a, "B")
    c.connect(a, "Sum", s, "In")
    c.connect(s, "Out", d, "In")  # In is made inside the loop
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    copy = plan.nodes[dp.copy]
    cond = plan.regions[loop.id].node
    assert dp.copy not in plan.scopes and plan.swaps == {}
    assert cond in copy.deps and _nodes(plan, a.id)[0].index in copy.deps  # after the loop and Out's reader


def test_an_init_made_inside_the_loop_is_an_error_on_the_delay() -> None:
    c, loop, d, s, _ = _body()
    f = c.register_block(Fill(name="f", Count=64))
    c.place(f, loop)
    c.connect(f, "Out", d, "Init")
    with pytest.raises(GraphCompileError) as info:
        compile_plan(c.snapshot())
    errs = [(e.block_id, str(e.code)) for e in info.value.diagnostics if e.severity == "error"]
    assert (d.id, "delay-region") in errs


def test_a_delay_in_a_nested_for_carries_per_inner_iteration() -> None:
    c, loop, d, s, r = _body()
    outer = c.register_block(For(name="Outer", Count=2, Unroll=1))
    c.place(loop, outer)
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    inner, outer_node = plan.regions[loop.id].node, plan.regions[outer.id].node
    assert plan.scopes[dp.copy] == inner and plan.scopes[inner] == outer_node
    assert dp.node not in plan.scopes and dp.node < outer_node  # init before the outermost loop
    assert isinstance(plan.nodes[outer_node], ConditionalNodePlan)
    assert isinstance(plan.nodes[dp.copy], KernelNodePlan)


def test_realize_instantiates_once_and_arms_the_init_node_for_the_first_launch(monkeypatch) -> None:
    from cudapatch.engine.buffers import BufferPool

    from .recording_driver import RegionDriver, install, realize_regions

    class Driver(RegionDriver):
        def cuGraphNodeSetEnabled(self, exec_, node, on):  # noqa: N802
            self._rec("enabled", exec_, node, on)
            return (0,)

    rec = install(monkeypatch, Driver())
    c, loop, d, s, r = _body()
    plan = compile_plan(c.snapshot())
    g = realize_regions(c, plan, BufferPool())
    assert rec.names().count("instantiate") == 1 and g._exec1 is None
    (dp,) = plan.delays
    init, copy = g._nodes[dp.node], g._nodes[dp.copy]
    assert copy.handle in rec.body_nodes and init.handle not in rec.body_nodes
    assert g.node_arg(dp.copy, 0) == g.buffers[dp.current].ptr and g.node_arg(dp.copy, 1) == g.buffers[dp.previous].ptr
    assert [c[1:] for c in rec.calls if c[0] == "enabled"] == [(g.handle, init.handle, 0)]
    g.adopt(None)
    rec.calls.clear()
    g.launch(0)
    g.launch(0)
    assert rec.calls == [
        ("enabled", g.handle, init.handle, 1),
        ("launch", g.handle),
        ("enabled", g.handle, init.handle, 0),
        ("launch", g.handle),
    ]
    assert g.output(d.id, "Out").ptr == g.buffers[dp.previous].ptr  # no phase: Out is always its own buffer
    rec.calls.clear()
    g.update_scalars({(loop.id, "Count"): 5})
    assert [c[0] for c in rec.calls if c[0].startswith("set_params")] == ["set_params"] * len(
        plan.scalar_slots[(loop.id, "Count")]
    )
    g.update_scalars({(d.id, "Reset"): 1})  # reset(): the init node runs before the next launch's loop
    rec.calls.clear()
    g.launch(0)
    assert rec.calls[0] == ("enabled", g.handle, init.handle, 1)
    g.close()


def test_the_reaction_diffusion_patch_file_plans_its_delay_inside_the_for() -> None:
    from pathlib import Path

    from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch

    from .plan_engine import PlanOnlyEngine

    registry = PluginHost().registry
    path = Path(__file__).resolve().parents[2] / "examples" / "10_reaction_diffusion.toml"
    engine = PlanOnlyEngine()
    adapter = HostAdapter(engine, registry)
    apply_patch(adapter, load_patch(path, registry=registry))
    engine.update()
    assert engine.errors == ()
    plan = engine.plan
    (dp,) = plan.delays
    loop, step = adapter.block("Steps"), adapter.block("step")
    rp = plan.regions[loop.id]
    # unrolled (For's default 8): ping-pong, no copy per iteration; one sync after the loop
    assert rp.unroll == 8 and rp.pairs is not None
    assert dp.copy not in plan.scopes and dp.node not in plan.scopes
    assert dp.current == plan.outputs[(step.id, "next")]
    assert plan.buffers[dp.previous].count == 1024 * 1024
    sync = plan.nodes[dp.copy]
    assert sync.entry_point == "delay_sync4" and sync.args[2].value == 2 * 1024 * 1024  # float2: two words
    assert not [n for n in plan.nodes if getattr(n, "entry_point", "").startswith("delay_copy")]
    paint = adapter.block("paint")
    assert plan.buffers[plan.outputs[(paint.id, "rgba")]].count == 1024 * 1024


@pytest.mark.parametrize("level", ["PerBlock", "PerKernel"])
def test_profiling_stamps_keep_the_copy_and_init_nodes_where_they_belong(level: str) -> None:
    from cudapatch.engine.profiling import ProfilingLevel

    c, loop, d, s, r = _body()
    top = c.register_block(FrameDelay(name="top", Count=64))  # a top-level delay beside the loop
    twice = c.register_block(Scale(name="twice", Factor=2.0))
    c.connect(top, "Out", twice, "In")
    c.connect(twice, "Out", top, "In")
    plan = compile_plan(c.snapshot(), level=ProfilingLevel.parse(level))
    cond = plan.regions[loop.id].node
    inner, outer = sorted(plan.delays, key=lambda dp: dp.block_id != d.id)
    for dp in (inner, outer):
        assert plan.nodes[dp.copy].entry_point == "delay_copy4"
        assert plan.nodes[dp.node].entry_point == "frame_delay_init" and dp.node not in plan.scopes
    assert plan.scopes[inner.copy] == cond and outer.copy not in plan.scopes
    assert _nodes(plan, twice.id)[0].index in plan.nodes[outer.copy].deps


def test_a_library_call_may_touch_a_delay_carried_by_a_copy() -> None:
    from cudapatch.blocks.library import FFT

    c = Context()
    loop = c.register_block(For(name="Steps", Count=3, Unroll=1))
    d = c.register_block(FrameDelay(name="d", Type="float2", Count=64))
    fft = c.register_block(FFT(name="fft", Kind="C2C", Nx=64))
    c.place(d, loop)
    c.place(fft, loop)
    c.connect(d, "Out", fft, "In")
    c.connect(fft, "Out", d, "In")  # an error outside regions (delay-captured): the pointers alternate there
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    assert plan.scopes[dp.copy] == plan.regions[loop.id].node
    assert plan.nodes[dp.copy].entry_point == "delay_copy4" and plan.nodes[dp.copy].args[2].value == 128


def test_the_reaction_diffusion_example_patch_plans_and_its_numpy_reference_runs() -> None:
    """The Python example's patch, as it builds it (planned here, no GPU), and its reference step."""
    import importlib.util
    from pathlib import Path

    import numpy as np

    from cudapatch import CustomKernel
    from cudapatch.engine import ExternalBinding
    from cudapatch.kernels.types import DType

    path = Path(__file__).resolve().parents[2] / "examples" / "10_reaction_diffusion.py"
    spec = importlib.util.spec_from_file_location("rd_example", path)
    ex = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(ex)  # type: ignore[union-attr]
    h = w = 64
    c = Context()
    loop = c.register_block(For(name="Steps", Count=10, Unroll=1))
    field = c.register_block(FrameDelay(name="field", Type="float2"))
    step = c.register_block(CustomKernel(name="step", Code=ex.GRAY_SCOTT, width=w, height=h, **ex.PARAMS))
    paint = c.register_block(CustomKernel(name="paint", Code=ex.PAINT))
    c.place(field, loop)
    c.place(step, loop)
    c.bind_input(field, "Init", ExternalBinding(0x7000_0000, h * w, DType.FLOAT2))
    c.connect(field, "Out", step, "s")
    c.connect(step, "next", field, "In")
    c.connect(step, "next", paint, "s")
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    assert plan.scopes[dp.copy] == plan.regions[loop.id].node and plan.buffers[dp.previous].count == h * w
    assert plan.nodes[dp.copy].args[2].value == 2 * h * w
    (k,) = _nodes(plan, step.id)
    assert k.grid * k.block >= h * w
    # The reference: a uniform field stays uniform; the seed reacts where the square is.
    seed = ex.seed_field(h, w)
    assert seed.shape == (h * w, 2) and seed.dtype == np.float32
    out = ex.gray_scott(seed, h, w, 3)
    assert out.shape == seed.shape and out.dtype == np.float32 and np.isfinite(out).all()
    flat = np.tile(np.float32([1.0, 0.0]), (h * w, 1))
    np.testing.assert_array_equal(ex.gray_scott(flat, h, w, 5), flat)


def test_an_unrolled_body_alternates_the_buffers_instead_of_copying() -> None:
    """(The buffers of each copy, the tails and the sync: ``test_region_pingpong.py``.)"""
    c, loop, d, s, r = _body(unroll=4)
    plan = compile_plan(c.snapshot())
    rp = plan.regions[loop.id]
    assert rp.unroll == 4 and rp.tail is not None and rp.pairs is not None
    (dp,) = plan.delays
    init, sync = _nodes(plan, d.id)
    scales = _nodes(plan, s.id)
    assert init.index == dp.node and sync.index == dp.copy and sync.entry_point == "delay_sync4"
    assert len(scales) == 4 + 2 + 1  # 4 in the main body, a pair, one in the tail
    assert [plan.scopes[k.index] for k in scales] == [rp.node] * 4 + [rp.pairs] * 2 + [rp.tail]
    for a, b in zip(scales[:3], scales[1:4], strict=True):  # each copy reads what the one before wrote
        assert a.index in b.deps and b.args[0].ref == a.args[1].ref
