"""FrameDelay feedback without a GPU: the block's description, links that close a loop through a
delay (and those that may not), the delays phase's pairs and errors, the plan's phase-1 swaps, the
lending keys that carry a delay's state across a rebuild, the Warm decision, and the alternation's
bookkeeping."""

from __future__ import annotations

import dataclasses

import pytest

from cudapatch import FrameDelay, LinkError, Scale, VectorAdd
from cudapatch.blocks.library import FFT, Fill
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.compiler.order import find_loops
from cudapatch.engine.connections import Link
from cudapatch.engine.phases import Phases, lending_keys
from cudapatch.engine.plan import KernelNodePlan
from cudapatch.engine.warm import Refusal, WarmRefusal, decide_warm_patch
from cudapatch.errors import GraphCompileError
from cudapatch.kernels.types import DType

from .unfused import compile_plan  # one node per block: these tests are about unfused plans


def _ctx(*blocks) -> Context:
    c = Context()
    for b in blocks:
        c.register_block(b)
    return c


def _loop(count: int = 64):
    """F (Fill) + D.Out -> A (VectorAdd) -> S (Scale) -> D.In: a loop through the delay."""
    d = FrameDelay(name="d", Count=count)
    f, a, s = Fill(name="f", Count=count), VectorAdd(name="a"), Scale(name="s")
    c = _ctx(d, f, a, s)
    c.connect(d, "Out", a, "A")
    c.connect(f, "Out", a, "B")
    c.connect(a, "Sum", s, "In")
    c.connect(s, "Out", d, "In")
    return c, d, f, a, s


def _errors(c: Context, **kw) -> list[tuple[int | None, str, str]]:
    with pytest.raises(GraphCompileError) as info:
        compile_plan(c.snapshot(), **kw)
    return [(d.block_id, str(d.code), d.message) for d in info.value.diagnostics if d.severity == "error"]


# -- the block ----------------------------------------------------------------------------------------
def test_a_frame_delay_describes_in_init_out_and_its_feedback_pair() -> None:
    d = FrameDelay(name="d", Type="float4")
    desc = d.description
    assert [p.name for p in desc.inputs] == ["Init", "In"] and [p.name for p in desc.outputs] == ["Out"]
    assert desc.feedback == (("In", "Out"),) and desc.feedback_inputs == {"In"}
    assert {p.dtype for p in (*desc.inputs, *desc.outputs)} == {DType.FLOAT4}
    assert desc.input("In").pins == () and not desc.input("Init").required
    assert d.get("Fill") == (0.0, 0.0, 0.0, 0.0) and d.get("Reset") == 0
    assert "frame_delay_init" in desc.kernels[0].source.text() and "float4" in desc.kernels[0].source.text()


def test_frame_delay_element_types_compile_to_their_c_names() -> None:
    text = FrameDelay(Type="uint").description.kernels[0].source.text()
    assert "const unsigned int* init, unsigned int* out, unsigned int fill" in text
    with pytest.raises(Exception, match="'quaternion' is not one of its choices: float, double"):
        FrameDelay(Type="quaternion")


def test_reset_is_a_hot_edit_of_the_reset_parameter() -> None:
    c, d, *_ = _loop()
    c.dirty.clear_structure()
    d.reset()
    d.reset()
    assert d.get("Reset") == 2
    assert not c.dirty.structure and (d.id, "Reset") in c.dirty.params


# -- links ------------------------------------------------------------------------------------------------
def test_a_link_may_close_a_loop_only_through_a_delay() -> None:
    c, d, f, a, s = _loop()  # the last link closed the loop through d.In: no error
    s2 = Scale(name="s2")
    c.register_block(s2)
    c.connect(s, "Out", s2, "In")
    with pytest.raises(LinkError, match="would make a cycle; a loop must pass through a FrameDelay") as info:
        c.connect(s2, "Out", a, "B")  # a -> s -> s2 -> a
    assert info.value.message.endswith(f"(loop: s2 -> {a.name} -> s -> s2)")  # every block of the loop, s too
    with pytest.raises(LinkError, match="would make a cycle") as info:
        c.connect(s2, "Out", d, "Init")  # Init is read this frame: d -> a -> s -> s2 -> d
    assert info.value.message.endswith(f"(loop: s2 -> {d.name} -> {a.name} -> s -> s2)")
    with pytest.raises(LinkError, match=r"\(loop: s2 -> s2\)"):
        c.connect(s2, "Out", s2, "In")  # into its own block


def test_a_same_frame_loop_in_a_snapshot_is_an_error_naming_the_loop() -> None:
    c, d, f, a, s = _loop()
    snap = c.snapshot()  # a hand-edited patch file can hold what connect refuses
    snap = dataclasses.replace(snap, links=(*snap.links, Link(s.id, "Out", d.id, "Init")))
    with pytest.raises(GraphCompileError) as info:
        compile_plan(snap)
    errors = [x for x in info.value.diagnostics if x.severity == "error"]
    assert {x.block_id for x in errors} == {d.id, a.id, s.id}
    assert all("('d' -> 'a' -> 's' -> 'd')" in x.message for x in errors)


def test_cycle_errors_name_the_loop_and_warn_the_blocks_behind_it() -> None:
    s1, s2, s3 = Scale(name="s1"), Scale(name="s2"), Scale(name="s3")
    c = _ctx(s1, s2, s3)
    c.connect(s1, "Out", s2, "In")
    c.connect(s2, "Out", s3, "In")
    snap = dataclasses.replace(c.snapshot(), links=(*c.snapshot().links, Link(s2.id, "Out", s1.id, "In")))
    with pytest.raises(GraphCompileError) as info:
        compile_plan(snap)
    msgs = {d.block_id: d.message for d in info.value.diagnostics}
    assert "part of a cycle ('s1' -> 's2' -> 's1')" in msgs[s1.id] and "FrameDelay" in msgs[s1.id]
    assert "runs after a cycle" in msgs[s3.id]


def test_find_loops_returns_each_loop_in_link_order() -> None:
    links = [
        Link(1, "o", 2, "i"),
        Link(2, "o", 3, "i"),
        Link(3, "o", 1, "i"),
        Link(3, "o", 4, "i"),
        Link(5, "o", 5, "i"),
    ]
    assert find_loops([1, 2, 3, 4, 5], links) == [[1, 2, 3], [5]]


# -- the delays phase and the plan -----------------------------------------------------------------------
def test_a_loop_through_a_delay_plans_a_pair_its_init_node_and_the_phase_one_swaps() -> None:
    c, d, f, a, s = _loop()
    plan = compile_plan(c.snapshot())
    assert plan.block_order == (d.id, f.id, a.id, s.id)  # the delay first: its Out is last frame's value
    (dp,) = plan.delays
    assert dp.block_id == d.id and plan.nodes[dp.node].entry_point == "frame_delay_init"
    assert dp.previous == plan.outputs[(d.id, "Out")] and dp.current == plan.outputs[(s.id, "Out")]
    assert plan.swaps == {dp.previous: dp.current, dp.current: dp.previous}
    add = next(n for n in plan.nodes if isinstance(n, KernelNodePlan) and n.block_id == a.id)
    assert dp.node in add.deps  # readers of Out wait for the (mostly disabled) init node
    scale = next(n for n in plan.nodes if isinstance(n, KernelNodePlan) and n.block_id == s.id)
    assert scale.args[1].ref == dp.current and add.args[0].ref == dp.previous


def test_init_sets_the_delay_size_and_count_is_used_without_it() -> None:
    c, d, *_ = _loop(count=64)
    c.bind_input(d, "Init", ExternalBinding(0x7000_0000, 64, DType.FLOAT32))
    plan = compile_plan(c.snapshot())
    assert plan.buffers[plan.delays[0].previous].count == 64
    init = plan.nodes[plan.delays[0].node]
    assert init.args[0].kind == "external" and init.args[3].value == 64


def test_feedback_with_another_size_is_an_error_on_the_delay() -> None:
    d, f, a, s = FrameDelay(name="d"), Fill(name="f", Count=32), VectorAdd(name="a"), Scale(name="s")
    c = _ctx(d, f, a, s)
    c.bind_input(d, "Init", ExternalBinding(0x7000_0000, 64, DType.FLOAT32))  # Out holds 64
    c.connect(f, "Out", a, "A")  # Sum is sized like A: 32
    c.connect(d, "Out", a, "B")
    c.connect(a, "Sum", s, "In")
    c.connect(s, "Out", d, "In")
    assert _errors(c) == [
        (
            d.id,
            "delay-mismatch",
            "FrameDelay 'd': feedback size mismatch: 'In' gets 32 elements from 's.Out', 'Out' holds 64 "
            "(Init's count, or Count)",
        )
    ]


def test_feedback_with_another_type_is_an_error_on_the_delay() -> None:
    d, s = FrameDelay(name="d", Type="int"), Scale(name="s")
    c = _ctx(d, s)
    snap = c.snapshot()
    # connect refuses the link; a patch file may hold it
    snap = dataclasses.replace(snap, links=(Link(s.id, "Out", d.id, "In"),))
    with pytest.raises(GraphCompileError) as info:
        compile_plan(snap)
    (diag,) = [x for x in info.value.diagnostics if x.severity == "error"]
    assert diag.block_id == d.id and diag.code == "type-mismatch"
    with pytest.raises(LinkError, match="element types differ"):
        c.connect(s, "Out", d, "In")


def test_a_delay_whose_in_is_open_keeps_its_start_value_with_a_warning() -> None:
    d, s = FrameDelay(name="d", Count=8), Scale(name="s")
    c = _ctx(d, s)
    c.connect(d, "Out", s, "In")
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    assert dp.current is None and plan.swaps == {}
    assert any(x.block_id == d.id and "'In' is not linked" in x.message for x in plan.diagnostics)


def test_a_delay_fed_by_a_block_that_is_not_running_keeps_its_start_value() -> None:
    c, d, f, a, s = _loop()
    plan = compile_plan(c.snapshot(), kernel_status={(s.id, 0): ("info", "kernel-compiling", "compiling")})
    (dp,) = plan.delays
    assert dp.current is None
    assert any("'s', which feeds 'In', is not running" in x.message for x in plan.diagnostics)


def test_in_straight_from_a_delay_or_from_an_output_feeding_two_delays_is_an_error() -> None:
    d1, d2, s = FrameDelay(name="d1", Count=8), FrameDelay(name="d2", Count=8), Scale(name="s")
    c = _ctx(d1, d2, s)
    c.connect(d1, "Out", d2, "In")
    c.connect(d2, "Out", s, "In")
    c.connect(s, "Out", d1, "In")
    (err,) = _errors(c)
    assert err[0] == d2.id and "comes straight from FrameDelay 'd1'" in err[2]
    c.disconnect(d1, "Out", d2, "In")
    c.connect(s, "Out", d2, "In")
    (err,) = _errors(c)
    assert err[0] == d2.id and "'s.Out' already feeds FrameDelay 'd1'" in err[2]


def test_a_library_call_touching_a_delay_pair_is_an_error_on_its_block() -> None:
    d = FrameDelay(name="d", Type="float2", Count=64)
    fft = FFT(name="fft", Kind="C2C", Nx=64)
    c = _ctx(d, fft)
    c.connect(d, "Out", fft, "In")
    c.connect(fft, "Out", d, "In")
    errors = _errors(c)
    assert [(e[0], e[1]) for e in errors] == [(fft.id, "delay-captured")]
    assert "alternate every frame" in errors[0][2]


# -- across rebuilds and edits -------------------------------------------------------------------------------
def test_a_delays_pair_is_lent_under_the_delays_own_keys() -> None:
    c, d, f, a, s = _loop()
    plan = compile_plan(c.snapshot())
    keys = lending_keys(plan)
    dp = plan.delays[0]
    assert keys[dp.previous][0] == d.id and keys[dp.current][0] == d.id and keys[dp.previous] != keys[dp.current]
    assert keys[plan.outputs[(a.id, "Sum")]] == (a.id, "Sum")
    s2 = Scale(name="s2")  # the block computing In replaced: the pair is found under the same keys
    c.unregister_block(s)
    c.register_block(s2)
    c.connect(a, "Sum", s2, "In")
    c.connect(s2, "Out", d, "In")
    plan2 = compile_plan(c.snapshot())
    k2 = lending_keys(plan2)
    assert {k2[plan2.delays[0].previous], k2[plan2.delays[0].current]} == {keys[dp.previous], keys[dp.current]}


def test_the_warm_decision_refuses_changed_delays() -> None:
    c, d, *_ = _loop(count=64)
    old = compile_plan(c.snapshot())
    caps = [b.count * 4 for b in old.buffers]
    assert not isinstance(decide_warm_patch(old, compile_plan(c.snapshot()), {}, capacities=caps), WarmRefusal)
    d.set("Count", 32)  # fits the allocations, but the delay's state must start again
    refusal = decide_warm_patch(old, compile_plan(c.snapshot()), {}, capacities=caps)
    assert isinstance(refusal, WarmRefusal) and refusal.reason is Refusal.DELAYS


def test_phases_alternate_and_arm_init_nodes_only_when_asked() -> None:
    c, d, *_ = _loop()
    plan = compile_plan(c.snapshot())
    launched = []
    ph = Phases(plan, ("exec0", "exec1"), [None], fresh={0})  # no init handle: nothing to arm
    assert ph.pending == set()
    for _ in range(3):
        assert ph.launch(lambda ex, stream: launched.append(ex) or (0,), None) == 0
    assert launched == ["exec0", "exec1", "exec0"] and ph.phase == 1
    assert ph.launch(lambda ex, stream: (7,), None) == 7 and ph.phase == 1  # a refused launch does not flip
    dp = plan.delays[0]
    assert ph.physical(dp.previous) == dp.previous  # phase 0 ran last
    ph.phase = 0
    assert ph.physical(dp.previous) == dp.current and ph.physical(dp.current) == dp.previous
    ph2 = Phases(plan, ("e0", "e1"), ["init-node"], fresh=set())
    ph2.reset({(d.id, "Fill"): None})
    assert ph2.pending == set()
    ph2.reset({(d.id, "Reset"): None})
    assert ph2.pending == {0}
    ph3 = Phases(plan, ("e0", "e1"), ["init-node"], fresh=set())
    ph3.continue_from(ph)
    assert ph3.phase == ph.phase


def test_a_fused_chain_inside_a_loop_reads_and_writes_the_pair() -> None:
    c, d, f, a, s = _loop()
    plan = compile_plan(c.snapshot(), fuse=True)  # a (VectorAdd) fuses into s (Scale): one kernel
    (dp,) = plan.delays
    (fused,) = [n for n in plan.nodes if isinstance(n, KernelNodePlan) and n.block_id == s.id]
    refs = {arg.ref for arg in fused.args if arg.kind == "buffer"}
    assert {dp.previous, dp.current} <= refs and dp.current == plan.outputs[(s.id, "Out")]
    assert not [n for n in plan.nodes if isinstance(n, KernelNodePlan) and n.block_id == a.id]


def test_a_composite_holding_a_delay_loop_runs_flattened_even_when_asked_for_a_child_graph() -> None:
    from cudapatch import Composite, CompositeBuilder

    class Echo(Composite):
        type_name = "Echo"

        def compose(self, c: CompositeBuilder) -> None:
            c.add("delay", FrameDelay(Count=64, Fill=1.0))
            c.add("decay", Scale(Factor=0.5))
            c.link("delay.Out", "decay.In")
            c.link("decay.Out", "delay.In")
            c.expose("Out", "decay.Out")

    for child_graph in (False, True):
        echo = Echo(name="echo", child_graph=child_graph)
        c = _ctx(echo)
        plan = compile_plan(c.snapshot())
        (dp,) = plan.delays
        assert dp.current is not None and plan.children == ()
        if child_graph:
            assert any("FrameDelay" in d.message and "flattened" in d.message for d in plan.diagnostics)


def test_a_delay_in_a_patch_with_regions_is_carried_by_a_copy_node() -> None:
    from cudapatch import For

    c, d, f, a, s = _loop()
    steps = c.register_block(For(name="Steps", Count=4))
    other = c.register_block(Scale(name="other"))
    c.place(other, steps)
    c.connect(f, "Out", other, "In")
    plan = compile_plan(c.snapshot())
    (dp,) = plan.delays
    assert dp.copy is not None and plan.swaps == {}  # one executable; see test_region_delays_plan.py
