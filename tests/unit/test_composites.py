"""Composite blocks without a GPU: flattening into the plan, exposure, Hot slots filed under the
composite, diagnostics on it, child-graph groups, and every way a composite can be wrong."""

from __future__ import annotations

import pytest

from cudapatch import Composite, CompositeBuilder, Fill, Scale, VectorAdd
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.connections import Link
from cudapatch.engine.plan import KernelNodePlan, StampNodePlan
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.errors import CudapatchError, LinkError
from cudapatch.kernels.types import DType

from .composite_blocks import TwoScales
from .plan_engine import PlanOnlyEngine
from .unfused import compile_plan  # one node per block: these tests are about unfused plans


class Outer(Composite):
    """A composite holding a composite: its Level reaches the inner composite's Gain."""

    type_name = "Outer"

    def compose(self, c: CompositeBuilder) -> None:
        c.add("pre", Scale(Factor=0.5))
        c.add("two", TwoScales())
        c.link("pre.Out", "two.In")
        c.expose("In", "pre.In")
        c.expose("Out", "two.Out")
        c.expose("Level", "two.Gain")


def _chain(comp: Composite, *, fuse: bool = False) -> tuple[PlanOnlyEngine, Fill, Composite, Scale]:
    e = PlanOnlyEngine(fuse=fuse)  # unfused: these tests look at each inner block's own node
    fill = e.add(Fill(name="fill", Count=100, Value=1.0))
    e.add(comp)
    tail = e.add(Scale(name="tail"))
    e.connect(fill, "Out", comp, "In")
    e.connect(comp, "Out", tail, "In")
    return e, fill, comp, tail


def test_a_composite_is_one_block_with_what_it_exposes() -> None:
    t = TwoScales(name="t")
    d = t.description
    assert [p.name for p in d.inputs] == ["In"] and [p.name for p in d.outputs] == ["Out"]
    assert [p.name for p in d.params] == ["Gain", "ChildGraph"] and d.params[0].default == 2.0  # the first target's
    assert d.params[1].structural and t.get("ChildGraph") == 0
    assert d.kernels == () and [n for n, _ in t.inner_blocks()] == ["a", "b"]
    assert "2 blocks" in str(t)


def test_the_compiler_sees_the_inner_blocks_under_qualified_names() -> None:
    e, fill, t, tail = _chain(TwoScales(name="blur1"))
    snap = e.context.snapshot()
    assert [b.name for b in snap.blocks] == ["fill", "blur1/a", "blur1/b", "tail"]
    e.update()
    assert e.errors == ()
    plan = e.plan
    kernels = [n for n in plan.nodes if isinstance(n, KernelNodePlan)]
    assert [n.block_id for n in kernels] == [fill.id, t.inner("a").id, t.inner("b").id, tail.id]
    assert [n.deps for n in kernels] == [(), (0,), (1,), (2,)]  # the chain runs through the composite
    # The exposed value reaches both inner blocks; unexposed values stay the composite's own.
    assert [n.args[2].value for n in kernels[1:3]] == [2.0, 2.0] and kernels[2].args[3].value == 1.0
    # Outputs and the Hot slots of Gain are filed under the composite.
    assert plan.outputs[(t.id, "Out")] == plan.outputs[(t.inner("b").id, "Out")]
    assert plan.scalar_slots[(t.id, "Gain")] == ((1, 2), (2, 2))
    assert t.id in plan.block_order


def test_a_hot_edit_of_an_exposed_parameter_is_a_param_change_of_the_composite() -> None:
    e, _, t, _ = _chain(TwoScales(name="t"))
    e.update()
    e.context.dirty.clear_structure()
    t.set("Gain", 5.0)
    dirty = e.context.dirty
    assert not dirty.structure and (t.id, "Gain") in dirty.params  # Hot: patched through the slots above
    e.update()
    values = [
        n.args[2].value
        for n in e.plan.nodes
        if isinstance(n, KernelNodePlan) and n.block_id != e.plan.nodes[0].block_id
    ]
    assert values[:2] == [5.0, 5.0]


def test_nested_composites_flatten_with_values_from_the_outside_in() -> None:
    e, _, o, _ = _chain(Outer(name="o"))
    o.set("Level", 7.0)
    e.update()
    assert e.errors == ()
    names = [b.name for b in e.context.snapshot().blocks]
    assert names == ["fill", "o/pre", "o/two/a", "o/two/b", "tail"]
    two = o.inner("two")
    assert e.plan.scalar_slots[(o.id, "Level")] == e.plan.scalar_slots[(two.id, "Gain")]
    slots = e.plan.scalar_slots[(o.id, "Level")]
    assert [e.plan.nodes[ni].args[ai].value for ni, ai in slots] == [7.0, 7.0]
    assert e.plan.outputs[(o.id, "Out")] == e.plan.outputs[(o.inner("two/b").id, "Out")]


def test_an_exposed_input_feeds_several_inner_inputs_and_bindings_follow() -> None:
    class Square(Composite):
        def compose(self, c: CompositeBuilder) -> None:
            c.add("add", VectorAdd())
            c.expose("In", "add.A", "add.B")
            c.expose("Out", "add.Sum")

    ctx = Context()
    sq = ctx.register_block(Square(name="sq"))
    ctx.bind_input(sq, "In", ExternalBinding(0xA000, 64, DType.FLOAT32))
    snap = ctx.snapshot()
    add = sq.inner("add")
    assert set(snap.bindings) == {(add.id, "A"), (add.id, "B")}
    plan = compile_plan(snap)
    assert set(plan.binding_slots[(sq.id, "In")]) == set(
        plan.binding_slots[(add.id, "A")] + plan.binding_slots[(add.id, "B")]
    )
    assert plan.binding_counts[(sq.id, "In")] == 64


def test_inner_diagnostics_land_on_the_composite_naming_the_inner_block() -> None:
    e = PlanOnlyEngine()
    t = e.add(TwoScales(name="t"))  # In is not linked: the inner 'a' cannot run
    e.update()
    (d, *_) = [d for d in e.plan.diagnostics if d.code == "input-unlinked"]
    assert d.block_id == t.id and "'t/a'" in d.message
    assert t.id not in e.plan.block_order


@pytest.mark.parametrize(
    ("compose", "message"),
    [
        (lambda c: (c.add("a", Scale()), c.expose("X", "a.Nope")), "operator 'a' has no port or parameter 'Nope'"),
        (lambda c: (c.add("a", Scale()), c.expose("X", "b.In")), "no inner operator 'b'"),
        (lambda c: (c.add("a", Scale()), c.expose("In", "a.In"), c.expose("In", "a.Factor")), "'In' is exposed twice"),
        (lambda c: (c.add("a", Scale()), c.expose("X", "a.In", "a.Factor")), "names input and param targets"),
        (
            lambda c: (c.add("a", Scale()), c.add("b", Scale()), c.expose("O", "a.Out", "b.Out")),
            "must name exactly one inner output",
        ),
        (
            lambda c: (c.add("a", Scale()), c.add("b", Scale()), c.link("a.Out", "b.In"), c.expose("I", "b.In")),
            "already linked inside",
        ),
        (
            lambda c: (c.add("a", Scale()), c.add("b", Scale()), c.link("a.Out", "b.In"), c.link("b.Out", "a.In")),
            "closes a cycle",
        ),
        (lambda c: (c.add("a", Scale()), c.link("a.Out", "a.Nope")), "no input 'Nope'"),
        (lambda c: (c.add("a", Scale()), c.add("a", Scale())), "defined twice"),
        (lambda c: (c.add("a", Scale()), c.expose("X", "a")), 'as "operator.Name"'),
    ],
)
def test_a_wrong_composition_names_the_composite_and_the_inner_operator(compose, message) -> None:
    class Bad(Composite):
        def compose(self, c: CompositeBuilder) -> None:
            compose(c)

    with pytest.raises(CudapatchError, match="composite 'bad'") as info:
        Bad(name="bad")
    assert message in str(info.value) and info.value.block == "bad"


def test_a_registered_composites_inner_blocks_are_found_by_id() -> None:
    ctx = Context()
    t = ctx.register_block(TwoScales(name="t"))
    a = t.inner("a")
    assert ctx.registry.get(a.id) is a and a not in ctx.registry
    assert ctx.registry.owner(a.id) == (t, "t/a", a) and ctx.registry.owner(t.id) is None


def test_links_to_an_unknown_composite_port_are_refused_at_the_edit() -> None:
    e = PlanOnlyEngine()
    t = e.add(TwoScales(name="t"))
    s = e.add(Scale(name="s"))
    with pytest.raises(LinkError, match="unknown input port"):
        e.connect(s, "Out", t, "Gain")


# -- child graphs -----------------------------------------------------------------------------------


def test_a_child_graph_composite_groups_its_nodes() -> None:
    e, _, t, _ = _chain(TwoScales(name="t", child_graph=True))
    e.update()
    (group,) = e.plan.children
    a, b = e.plan.block_nodes[t.inner("a").id], e.plan.block_nodes[t.inner("b").id]
    assert group.block_id == t.id and group.nodes == a + b
    assert t.is_child_graph and not TwoScales(name="u").is_child_graph


def test_the_inner_blocks_end_stamps_go_inside_the_child_graph() -> None:
    e, fill, t, _ = _chain(TwoScales(name="t", child_graph=True))
    e.set_profiling("PerBlock")
    e.update()
    plan = e.plan
    (group,) = plan.children
    members = set(plan.block_nodes[t.inner("a").id] + plan.block_nodes[t.inner("b").id])
    stamps = {n.index for n in plan.nodes if isinstance(n, StampNodePlan) and n.deps and set(n.deps) <= members}
    assert len(stamps) == 2 and set(group.nodes) == members | stamps
    # The stamp after 'fill' and the publish node stay outside.
    assert all(plan.nodes[i].deps and set(plan.nodes[i].deps) <= set(group.nodes) for i in group.nodes if i in stamps)


def test_a_block_between_two_inner_paths_makes_the_composite_run_flattened() -> None:
    class Pair(Composite):
        child_graph = True

        def compose(self, c: CompositeBuilder) -> None:
            c.add("a", Scale())
            c.add("b", Scale())
            c.expose("In1", "a.In")
            c.expose("Out1", "a.Out")
            c.expose("In2", "b.In")
            c.expose("Out2", "b.Out")

    e = PlanOnlyEngine()
    fill = e.add(Fill(name="fill", Count=16))
    p = e.add(Pair(name="p"))
    mid = e.add(Scale(name="mid"))
    e.connect(fill, "Out", p, "In1")
    e.connect(p, "Out1", mid, "In")
    # To the Context a composite is one block, so this link is refused at the edit as a cycle ...
    with pytest.raises(LinkError, match="cycle"):
        e.connect(mid, "Out", p, "In2")
    # ... but a snapshot may hold it (a hand-edited patch): flattened, the patch has no cycle.
    e.context.connections.add(Link(mid.id, "Out", p.id, "In2"))
    e.update()
    assert e.errors == ()
    assert e.plan.children == ()
    (w,) = [d for d in e.plan.diagnostics if d.code == "child-graph"]
    assert w.block_id == p.id and "'mid'" in w.message and "flattened" in w.message


def test_plans_without_composites_have_no_children() -> None:
    ctx = Context()
    s = ctx.register_block(Scale(name="s"))
    ctx.bind_input(s, "In", ExternalBinding(0xA000, 8, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot(), level=ProfilingLevel.PER_BLOCK)
    assert plan.children == () and ctx.snapshot().composites == ()


def test_a_composite_gets_a_gpu_time_span_over_its_blocks() -> None:
    e, _, t, _ = _chain(TwoScales(name="t"))
    e.set_profiling("PerBlock")
    e.update()
    pairs = {p.key: p for p in e.plan.timings if p.kind == "block"}
    a, b = pairs[t.inner("a").id], pairs[t.inner("b").id]
    assert (pairs[t.id].start, pairs[t.id].end) == (a.start, b.end)


def test_an_inner_block_cannot_be_registered_on_its_own() -> None:
    ctx = Context()
    t = ctx.register_block(TwoScales(name="t"))
    with pytest.raises(CudapatchError, match="inside composite 't'"):
        ctx.register_block(t.inner("a"))
    with pytest.raises(CudapatchError, match="must not be registered"):

        class Wraps(Composite):
            def compose(self, c: CompositeBuilder) -> None:
                c.add("s", ctx.registry.by_name("s"))

        ctx.register_block(Scale(name="s"))
        Wraps(name="w")


def test_a_composite_is_composed_once_when_made() -> None:
    made = []

    class Counted(TwoScales):
        def compose(self, c: CompositeBuilder) -> None:
            made.append(c.text("Path"))
            super().compose(c)

    Counted(name="c", Path="x")
    assert made == ["x"]


def test_the_child_graph_parameter_switches_the_mode_with_a_rebuild() -> None:
    e, _, t, _ = _chain(TwoScales(name="t"))
    e.update()
    assert e.plan.children == () and not t.is_child_graph
    e.context.dirty.clear_structure()
    t.set("ChildGraph", 1)
    assert e.context.dirty.structure  # structural: the next build groups the nodes
    e.update()
    assert t.is_child_graph and [c.block_id for c in e.plan.children] == [t.id]
    with pytest.raises(CudapatchError, match="ChildGraph"):

        class Clash(Composite):
            def compose(self, c: CompositeBuilder) -> None:
                c.add("a", Scale())
                c.expose("ChildGraph", "a.Factor")

        Clash(name="clash")


def test_switching_child_graph_is_never_patched_in_place() -> None:
    from cudapatch.engine.warm import Refusal, WarmRefusal, decide_warm_patch

    ctx = Context()
    t = ctx.register_block(TwoScales(name="t"))
    ctx.bind_input(t, "In", ExternalBinding(0xA000, 64, DType.FLOAT32))
    flat = compile_plan(ctx.snapshot())
    t.set("ChildGraph", 1)
    grouped = compile_plan(ctx.snapshot())
    assert grouped.nodes == flat.nodes and grouped.children and not flat.children
    capacities = [b.count * b.dtype.itemsize for b in flat.buffers]
    result = decide_warm_patch(flat, grouped, ctx.snapshot().bindings, capacities=capacities)
    assert isinstance(result, WarmRefusal) and result.reason is Refusal.CHILD_GRAPHS
    assert not isinstance(decide_warm_patch(flat, flat, ctx.snapshot().bindings, capacities=capacities), WarmRefusal)


def test_fused_inner_blocks_keep_the_exposed_parameter_hot() -> None:
    ctx = Context()
    t = ctx.register_block(TwoScales(name="t"))
    ctx.bind_input(t, "In", ExternalBinding(0xA000, 64, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot(), fuse=True)
    kernels = [n for n in plan.nodes if isinstance(n, KernelNodePlan)]
    assert len(kernels) == 1  # a.Out feeds only b: the two Scales are one generated kernel
    slots = plan.scalar_slots[(t.id, "Gain")]
    assert len(slots) == 2 and {ni for ni, _ in slots} == {kernels[0].index}
    assert plan.outputs[(t.id, "Out")] == plan.outputs[(t.inner("b").id, "Out")]


def test_a_probe_on_a_composites_output_reads_as_the_composites() -> None:
    ctx = Context()
    t = ctx.register_block(TwoScales(name="t"))
    ctx.bind_input(t, "In", ExternalBinding(0xA000, 64, DType.FLOAT32))
    key = ctx.add_probe(t, "Out")
    assert key == (t.id, "Out")
    snap = ctx.snapshot()
    assert [k for k, _ in snap.probes] == [(t.inner("b").id, "Out")]  # the compiler probes the inner output
    plan = compile_plan(snap)
    assert plan.probes == ((t.id, "Out"),)  # ... and the host reads it under the composite's key
