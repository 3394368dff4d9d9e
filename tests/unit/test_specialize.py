"""Fused kernels specialised on their resting scalar values (``engine/specialize.py``), on the CPU: the
generated PTX, the executable graph's swap and its way back on a Hot patch (recording driver), and the
Specializer's looks. The GPU suite checks the results bit for bit (``tests/gpu/test_specialize_gpu.py``)."""

from __future__ import annotations

import dataclasses
import gc
import struct
import threading
import weakref
from collections import deque
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from cudapatch import DType, Expression, Scale
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.compiler import compile_plan
from cudapatch.engine.compiler.fusion import FUSED_KERNEL, FusedSource, regenerate
from cudapatch.engine.executable import ArgumentBits
from cudapatch.engine.kernels import KernelOutcome
from cudapatch.engine.specialize import Specializer
from cudapatch.engine.stats import EngineCounters
from cudapatch.engine.tiers import SPECIALIZED_PER_FRAME, CodeTier
from cudapatch.engine.warm import WarmPatch, decide_warm_patch
from cudapatch.expr.program import STAGES_PER_PICKLE
from cudapatch.expr.ptx_gen import generate_ptx

from .recording_driver import OK, RecordingDriver, install, realize_recorded


@pytest.fixture(autouse=True)
def _looks_by_hand(monkeypatch) -> None:
    """A Specializer's thread, once armed, would look on its own while a test makes its looks by hand."""
    from cudapatch.engine import specialize as specialize_module

    monkeypatch.setattr(specialize_module, "SPECIALIZE_AFTER_S", 3600.0)


def _bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def _fused_chain(n: int = 4):
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=1.0 + i / 8, Offset=-0.25 * i)) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 1024, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot(), fuse=True)
    (node,) = plan.kernel_nodes
    assert node.kernel == FUSED_KERNEL and isinstance(node.source, FusedSource)
    return ctx, blocks, plan, node


def test_a_specialized_kernel_moves_the_exact_bits_in_place_of_each_scalar_load() -> None:
    _, blocks, _, node = _fused_chain()
    program = node.source.program
    values = [1.0 + i / 8 if s % 2 == 0 else -0.25 * i for i in range(len(blocks)) for s in (0, 1)]
    constants = tuple((s, _bits(v)) for s, v in enumerate(values))
    special = node.source.specialized(constants)
    ptx, plain = special.code("sm_90"), node.source.code("sm_90")
    assert plain.count("ld.param.f32") == len(values) and "ld.param.f32" not in ptx
    assert ptx.count("mov.f32") - plain.count("mov.f32") == len(values)
    for v in values:
        assert f"0f{_bits(v):08X}" in ptx
    # Nothing else changes: the same parameters (a launch keeps its arguments), the same arithmetic.
    assert [ln for ln in ptx.splitlines() if ".param" in ln and "ld." not in ln] == [
        ln for ln in plain.splitlines() if ".param" in ln and "ld." not in ln
    ]
    assert [ln for ln in ptx.splitlines() if "fma" in ln] == [ln for ln in plain.splitlines() if "fma" in ln]
    assert special.jit == "full" and special.members == node.source.members
    assert special != node.source and special.cache_key("sm_90") != node.source.cache_key("sm_90")
    other = node.source.specialized(((0, _bits(2.0)),) + constants[1:])
    assert other.cache_key("sm_90") != special.cache_key("sm_90")
    # Only the scalars given: a partial specialisation loads the rest.
    assert generate_ptx(program, "sm_90", constants={0: _bits(3.0)}).count("ld.param.f32") == len(values) - 1


class FuncDriver(RecordingDriver):
    """Also records the function each node patch hands the driver."""

    def cuGraphExecKernelNodeSetParams(self, exec_, node, kp):  # noqa: N802
        self._rec("set_params", node, int(kp.func))
        return (OK,)


@pytest.fixture
def rec(monkeypatch) -> FuncDriver:
    return install(monkeypatch, FuncDriver())


def test_a_specialized_node_goes_back_to_its_generic_kernel_in_the_patch_that_changes_a_value(rec) -> None:
    ctx, blocks, plan, node = _fused_chain()
    key = (node.block_id, FUSED_KERNEL)
    armed = []
    g = realize_recorded(ctx, plan, BufferPool(), functions={key: 500}, on_generalize=lambda: armed.append(1))
    program = node.source.program
    args = [program.scalar_param(s) for s in range(len(program.scalars))]
    now = g.argument_bits(key, args)
    assert [bits for _, bits in now] == [_bits(a.value) for a in (node.args[i] for i in args)]
    stale = ((args[0], now[0][1] ^ 1),) + now[1:]
    rec.calls.clear()
    assert g.kernel_source(key) is node.source
    assert not g.specialize(key, 600, stale, node.source) and rec.calls == [] and not g.specialized(key)
    assert armed == [1]  # refused: the specializer looks again
    armed.clear()
    assert g.specialize(key, 600, now, node.source) and g.specialized(key)
    assert [c for c in rec.calls if c[0] == "set_params"] == [("set_params", g._nodes[0].handle, 600)]
    assert g.runs_function(key, 600)
    rec.calls.clear()
    g.update_scalar(blocks[1].id, "Factor", 7.5)  # the one-change path: generic kernel, new value, one call
    assert rec.calls == [("set_params", g._nodes[0].handle, 500)] and armed == [1] and not g.specialized(key)
    assert g.argument_bits(key, [args[2]]) == ((args[2], _bits(7.5)),)
    assert g.specialize(key, 601, g.argument_bits(key, args), node.source)
    rec.calls.clear()
    g.update_scalars({(blocks[0].id, "Offset"): 0.125, (blocks[2].id, "Factor"): 2.0})  # the general path
    assert [c[2] for c in rec.calls if c[0] == "set_params"] == [500] and armed == [1, 1]
    assert g.specialize(key, 602, g.argument_bits(key, args), node.source)
    assert g.swap_function(key, 700, node.descriptor) and not g.specialized(key)  # a Code edit: its kernel
    assert armed == [1, 1, 1]  # new code: specialised once its values rest
    rec.calls.clear()
    g.update_scalar(blocks[1].id, "Factor", 1.0)
    assert rec.calls == [("set_params", g._nodes[0].handle, 700)] and armed == [1, 1, 1]  # nothing to put back
    g.close()


class FakeGraph:
    def __init__(self, plan, key) -> None:
        self.plan, self.key = plan, key
        self.values = ((3, 1), (4, 2))
        self.special = False
        self.is_closed = False

    def argument_bits(self, key, indices):
        return self.values if key == self.key else None

    def kernel_source(self, key):
        (node,) = (n for n in self.plan.kernel_nodes if (n.block_id, n.kernel) == key)
        return node.source

    def specialized(self, key) -> bool:
        return self.special


class FakeBuilder:
    def __init__(self) -> None:
        self.submitted: list[tuple[object, Future]] = []

    def submit(self, source) -> Future:
        f: Future = Future()
        self.submitted.append((source, f))
        return f


def test_the_specializer_asks_once_the_values_rest_and_again_after_they_moved() -> None:
    _, _, plan, node = _fused_chain(2)
    key = (node.block_id, FUSED_KERNEL)
    g, builder, ready = FakeGraph(plan, key), FakeBuilder(), []
    sp = Specializer(lambda: g, builder, ready)
    program = node.source.program
    g.values = tuple((program.scalar_param(s), 100 + s) for s in range(len(program.scalars)))
    assert sp.look() and builder.submitted == []  # first look: values seen, not yet resting
    assert not sp.look() and len(builder.submitted) == 1  # the same values a look later: one build
    source, fut = builder.submitted[0]
    assert source.constants == tuple((s, 100 + s) for s in range(len(program.scalars)))
    assert not sp.look() and len(builder.submitted) == 1  # asked already
    fut.set_result("compiled")
    assert ready == [KernelOutcome("specialize", key, "compiled", g.values, node.source)]
    g.special = True
    assert not sp.look() and len(builder.submitted) == 1
    g.special = False  # a Hot patch put the generic kernel back and armed the specializer
    g.values = g.values[:1] + ((g.values[1][0], 7),)
    sp.arm()
    assert sp.look() and len(builder.submitted) == 1  # moved: wait for them to rest
    assert not sp.look() and len(builder.submitted) == 2
    failed = builder.submitted[1][1]
    failed.set_exception(RuntimeError("no"))
    assert len(ready) == 1  # a failed build changes nothing
    sp.close()
    sp.close()
    g.values = tuple((i, b + 1) for i, b in g.values)
    assert sp.look()  # (a closed specializer's thread is gone; a look by hand still reads)


def test_a_specializer_with_no_graph_or_no_fused_kernel_has_nothing_to_do() -> None:
    ctx = Context()
    s = ctx.register_block(Scale(name="s", Factor=2.0))
    ctx.bind_input(s, "In", ExternalBinding(0xA000, 64, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot(), fuse=True)
    builder, ready = FakeBuilder(), []
    assert not Specializer(lambda: None, builder, ready).look()
    g = FakeGraph(plan, (s.id, FUSED_KERNEL))
    sp = Specializer(lambda: g, builder, ready)
    assert [n.kernel for n in plan.kernel_nodes] == [0]  # a block alone runs its own kernel: nothing fused
    assert not sp.look() and not sp.look() and builder.submitted == []


def _expression_chain():
    """A Scale fused with an Expression whose code a test edits (same names: the Code tier's swap)."""
    ctx = Context()
    s = ctx.register_block(Scale(name="s", Factor=2.0, Offset=0.5))
    e = ctx.register_block(Expression(name="e", Code="a * F + 1.0", F=3.0))
    ctx.connect(s, "Out", e, "a")
    ctx.bind_input(s, "In", ExternalBinding(0xA000, 1024, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot(), fuse=True)
    (node,) = plan.kernel_nodes
    assert node.kernel == FUSED_KERNEL and node.source.members == (s.id, e.id)
    return ctx, s, e, plan, node


def _code_tier(g) -> CodeTier:
    """The Code tier over ``g`` alone: what it does with swaps and specialisations."""
    return CodeTier(
        resources=SimpleNamespace(graph=g),
        context=SimpleNamespace(dirty=None),
        kernels=None,
        faults=None,
        board=SimpleNamespace(refresh=lambda: None),
        counters=EngineCounters(),
        graph_lock=threading.Lock(),
    )


def test_a_member_code_edit_voids_a_specialisation_of_the_old_code_and_the_new_code_is_specialised(rec) -> None:
    ctx, _, e, plan, node = _expression_chain()
    key = (node.block_id, FUSED_KERNEL)
    armed = []
    g = realize_recorded(ctx, plan, BufferPool(), functions={key: 500}, on_generalize=lambda: armed.append(1))
    builder, ready = FakeBuilder(), []
    sp, tier = Specializer(lambda: g, builder, ready), _code_tier(g)
    assert sp.look() and not sp.look()  # the values rest: the group's kernel is built with them
    ((old, old_build),) = builder.submitted
    assert old.program == node.source.program
    e.set("Code", "a * F - 1.0")  # a member's Code edit while that build runs: the group's kernel is regenerated
    edited = regenerate(node.source, {m: ctx.registry.get(m) for m in node.source.members})
    assert edited is not None and edited.program != node.source.program
    tier.apply([KernelOutcome("swap", key, SimpleNamespace(function=700, descriptor=node.descriptor, source=edited))])
    assert g.runs_function(key, 700) and g.kernel_source(key) is edited and armed == [1]
    old_build.set_result(SimpleNamespace(function=800))  # the old code's specialisation lands after the edit
    tier.apply(ready[:])
    assert g.runs_function(key, 700) and not g.specialized(key)  # the edit runs on, not the old expression
    assert tier._counters.specializations == 0 and armed == [1, 1]  # refused: looked at again
    sp.arm()
    assert not sp.look()  # the same values, the new code: built now
    new, new_build = builder.submitted[-1]
    assert new.program == edited.program and new.constants and new.jit == "full"
    assert dataclasses.replace(new, constants=(), jit=edited.jit) == edited
    new_build.set_result(SimpleNamespace(function=801))
    tier.apply(ready[1:])
    assert g.runs_function(key, 801) and g.specialized(key) and tier._counters.specializations == 1
    g.close()


def test_values_read_for_a_specialisation_are_checked_again_with_the_reader_they_were_read_with(rec) -> None:
    ctx, blocks, plan, node = _fused_chain(6)
    key = (node.block_id, FUSED_KERNEL)
    g = realize_recorded(ctx, plan, BufferPool(), functions={key: 500})
    program = node.source.program
    args = [program.scalar_param(s) for s in range(len(program.scalars))]
    read = g.argument_bits(key, args)
    assert isinstance(read, ArgumentBits) and read == tuple(zip(args, read.bits, strict=True))
    assert read.indices == tuple(args) and read.descriptor is g._nodes[0].store.descriptor
    assert hash(read) == hash(tuple(read))  # the specializer keys its sets and dicts by the pairs
    g.update_scalar(blocks[3].id, "Offset", 0.375)  # a Hot patch after the read: the read is stale
    assert not g.specialize(key, 600, read, node.source) and not g.specialized(key)
    fresh = g.argument_bits(key, args)
    assert fresh != read and g.specialize(key, 600, fresh, node.source) and g.runs_function(key, 600)
    g.update_scalar(blocks[3].id, "Offset", 0.5)
    plain = tuple(g.argument_bits(key, args))  # pairs alone (no reader kept): read by the node's layout
    assert type(plain) is tuple and g.specialize(key, 601, plain, node.source) and g.runs_function(key, 601)
    g.update_scalar(blocks[3].id, "Offset", 0.625)
    assert not g.specialize(key, 602, plain, node.source)
    # The node's layout changed since the read (a Code swap with another descriptor): its own is used.
    again = g.argument_bits(key, args)
    kn = g._nodes[0]
    kn.store.descriptor = dataclasses.replace(kn.store.descriptor)
    assert kn.store.descriptor is not again.descriptor
    assert g.specialize(key, 603, again, node.source) and g.runs_function(key, 603)
    g.close()


def test_at_most_a_few_specialisations_land_in_one_frame_and_the_rest_in_the_next_frames_in_order(monkeypatch) -> None:
    from cudapatch.engine import tiers

    monkeypatch.setattr(tiers, "_now", lambda: 0.0)  # (free: the cap alone decides here)
    landed: list[int] = []
    g = SimpleNamespace(specialize=lambda key, function, constants, generic: landed.append(function) or True)
    ready: deque = deque()
    tier = _code_tier(g)
    tier._kernels = SimpleNamespace(ready=ready)
    n = SPECIALIZED_PER_FRAME + 3
    outcomes = [KernelOutcome("specialize", (7, i), SimpleNamespace(function=i), (), None) for i in range(n)]
    tier.apply(outcomes)
    assert landed == list(range(SPECIALIZED_PER_FRAME))
    assert [o.compiled.function for o in ready] == list(range(SPECIALIZED_PER_FRAME, n))
    ready.append(KernelOutcome("specialize", (7, 9), SimpleNamespace(function=9), (), None))  # came meanwhile
    tier.apply([ready.popleft() for _ in range(len(ready))])
    assert landed == [*range(n), 9] and not ready
    assert tier._counters.specializations == n + 1
    # A swap the driver refuses later in the same frame raises; the specialisations held back still land.
    tier.swap = lambda o: (_ for _ in ()).throw(RuntimeError("refused"))  # type: ignore[method-assign]
    refused = KernelOutcome("swap", (8, 0), SimpleNamespace(function=99), (), None)
    with pytest.raises(RuntimeError, match="refused"):
        tier.apply([*outcomes, refused])
    assert [o.compiled.function for o in ready] == list(range(SPECIALIZED_PER_FRAME, n))


def test_specialisations_that_cost_the_frame_their_budget_leave_the_rest_to_the_next_frames(monkeypatch) -> None:
    """A frame takes one specialisation, then more only while they have cost less than
    ``SPECIALIZE_BUDGET_S`` of its host time (a clock the fake graph advances)."""
    from cudapatch.engine import tiers

    clock = [0.0]
    monkeypatch.setattr(tiers, "_now", lambda: clock[0])
    landed: list[int] = []
    cost = {0: 0.1, 1: 0.1, 2: 0.1, 3: 3.0, 4: 0.1, 5: 0.1}  # in budgets

    def specialize(key, function, constants, generic) -> bool:
        clock[0] += cost[function] * tiers.SPECIALIZE_BUDGET_S
        landed.append(function)
        return True

    ready: deque = deque()
    tier = _code_tier(SimpleNamespace(specialize=specialize))
    tier._kernels = SimpleNamespace(ready=ready)
    tier.apply([KernelOutcome("specialize", (7, i), SimpleNamespace(function=i), (), None) for i in range(6)])
    assert landed == [0, 1, 2, 3]  # (the fourth is the cap as well)
    tier.apply([ready.popleft() for _ in range(len(ready))])
    assert landed == [0, 1, 2, 3, 4, 5]
    cost[0] = 2.0
    landed.clear()
    tier.apply([KernelOutcome("specialize", (7, i), SimpleNamespace(function=i), (), None) for i in range(3)])
    assert landed == [0] and [o.compiled.function for o in ready] == [1, 2]  # one over the budget: the rest wait
    # A frame a build lands in takes none: they wait, in order, for the next.
    tier.apply([ready.popleft() for _ in range(len(ready))], specialize=False)
    assert landed == [0] and [o.compiled.function for o in ready] == [1, 2]


def test_a_specialisation_made_for_a_graph_is_refused_by_the_graph_built_after_it(rec) -> None:
    ctx, _, e, plan, node = _expression_chain()
    key = (node.block_id, FUSED_KERNEL)
    old = realize_recorded(ctx, plan, BufferPool(), functions={key: 500})
    graph = [old]
    builder, ready = FakeBuilder(), []
    sp = Specializer(lambda: graph[0], builder, ready)
    assert sp.look() and not sp.look()
    e.set("Code", "a * F - 1.0")  # an edit that rebuilds (a new graph, the group under the same key)
    plan2 = compile_plan(ctx.snapshot(), fuse=True)
    (node2,) = plan2.kernel_nodes
    assert (node2.block_id, node2.kernel) == key and node2.source.program != node.source.program
    graph[0] = new = realize_recorded(ctx, plan2, BufferPool(), functions={key: 510})
    # The replaced graph is not kept alive by the specializer: the engine frees it a piece at a time,
    # and a last reference dropped at the specializer's next look would free it there all at once.
    old.close()
    gone = weakref.ref(old)
    del old
    gc.collect()
    assert gone() is None
    builder.submitted[0][1].set_result(SimpleNamespace(function=800))
    (o,) = ready
    assert new.argument_bits(key, [i for i, _ in o.constants]) == o.constants  # the same values
    tier = _code_tier(new)
    tier.apply([o])
    assert new.runs_function(key, 510) and not new.specialized(key) and tier._counters.specializations == 0
    assert sp.look() and not sp.look()  # the new graph's code, once its values rest
    assert builder.submitted[-1][0].program == node2.source.program
    new.close()


def _specialised(rec):
    """A fused chain's group realized (generic kernel 500), specialised on its values (600), with the
    calls of ``on_generalize`` counted."""
    ctx, blocks, plan, node = _fused_chain()
    key = (node.block_id, FUSED_KERNEL)
    armed: list[int] = []
    g = realize_recorded(ctx, plan, BufferPool(), functions={key: 500}, on_generalize=lambda: armed.append(1))
    program = node.source.program
    args = [program.scalar_param(s) for s in range(len(program.scalars))]
    assert g.specialize(key, 600, g.argument_bits(key, args), node.source)
    return ctx, blocks, node, key, g, armed


def _warm_patch(ctx, g, key, prepared: bool):
    """Build the patch as it is now and patch ``g`` with it in place (prepared on the side, or not)."""
    snap = ctx.snapshot()
    plan2 = compile_plan(snap, fuse=True)
    capacities = [b.capacity_bytes for b in g.buffers]
    decision = decide_warm_patch(g.plan, plan2, snap.bindings, capacities=capacities, functions={key: 500})
    assert isinstance(decision, WarmPatch)
    if prepared:
        ready_patch = g.prepare_patch(g.trim_patch(decision), snap.bindings)
        assert ready_patch is not None and g.apply_prepared(ready_patch, plan2) == 1
    else:
        assert g.try_patch(plan2, snap.bindings, {key: 500}, decided=g.trim_patch(decision)) == 1
    return plan2


def test_a_rebind_leaves_a_node_specialised_and_a_warm_patch_puts_the_generic_kernel_back(rec) -> None:
    for prepared in (False, True):
        ctx, blocks, node, key, g, armed = _specialised(rec)
        rec.calls.clear()
        g.update_pointer(blocks[0].id, "In", 0xB000)  # a pointer: the specialised kernel reads it as before
        assert rec.calls == [("set_params", g._nodes[0].handle, 600)] and g.specialized(key) and armed == []
        blocks[1].set("Factor", 9.0)  # with a build (a Warm patch of the running graph)
        plan2 = _warm_patch(ctx, g, key, prepared)
        assert g.runs_function(key, 500) and not g.specialized(key) and g.generalized == 1
        assert armed == [1] and g.kernel_source(key) is plan2.kernel_nodes[0].source
        g.close()


def test_a_growth_keeps_a_node_specialised_and_a_later_value_change_puts_the_generic_kernel_back(rec) -> None:
    # A Warm patch that writes new pointers, counts and grids (a 2x growth of the bound input) leaves
    # the scalars the specialised kernel was made with: it stays, with its arguments patched.
    for prepared in (False, True):
        ctx, blocks, node, key, g, armed = _specialised(rec)
        grid = g._nodes[0].params.gridDimX
        for count, factor in ((2048, None), (4096, 9.0)):
            ctx.bind_input(blocks[0], "In", ExternalBinding(0xC000 + count, count, DType.FLOAT32))
            if factor is not None:  # a value changes too: the generic kernel, in the same patch
                blocks[1].set("Factor", factor)
            rec.calls.clear()
            _warm_patch(ctx, g, key, prepared)
            assert g._nodes[0].params.gridDimX > grid  # the node's launch follows the growth
            grid = g._nodes[0].params.gridDimX
            if factor is None:
                assert g.runs_function(key, 600) and g.specialized(key) and armed == [] and g.generalized == 0
                assert [c[2] for c in rec.calls if c[0] == "set_params"] == [600]
            else:
                assert g.runs_function(key, 500) and not g.specialized(key) and armed == [1]
                assert g.generalized == 1 and [c[2] for c in rec.calls if c[0] == "set_params"] == [500]
        g.close()


def _replaced(ctx, g, plan, functions, how: str, **kw):
    """The graph built after ``g`` from ``plan``, as a build makes it: ``how`` is ``"own"`` (the build
    thread's: storages of its own), ``"borrowed"`` (the frame thread's: ``g``'s storages, loaded with
    ``plan``'s values) or ``"updated"`` (borrowed, and ``g``'s executable updated to run it)."""
    return realize_recorded(
        ctx,
        plan,
        BufferPool(),
        functions=functions,
        previous=g,
        lend_stores=how != "own",
        update_previous=how == "updated",
        **kw,
    )


@pytest.mark.parametrize("how", ["own", "borrowed", "updated"])
def test_the_graph_built_after_keeps_the_specialised_kernels_of_the_groups_an_edit_left_alone(rec, how) -> None:
    ctx, blocks, node, key, g, armed = _specialised(rec)
    plan = g.plan
    # The next graph runs the group's same generic code (its plan node: an edit elsewhere left it alone).
    rec.calls.clear()
    g2 = _replaced(ctx, g, plan, {key: 500}, how, on_generalize=lambda: armed.append(2))
    assert g2.specialized(key) and g2.runs_function(key, 600) and armed == []
    # Made with it: no patch of the executable, no look asked for.
    assert [c[3] for c in rec.calls if c[0] == "add_kernel"] == [600] and "set_params" not in rec.names()
    assert g2.specializations().keys() == {key}  # and it hands it on in turn
    if how == "own":
        assert g.runs_function(key, 600) and g.specialized(key)  # the running graph is left as it is
    g2.update_scalar(blocks[1].id, "Factor", 7.5)  # a Hot patch of the new graph: its generic kernel back
    assert g2.runs_function(key, 500) and not g2.specialized(key) and armed == [2]
    assert rec.calls[-1] == ("set_params", g2._nodes[0].handle, 500)
    g2.close()
    g.close()


def test_a_new_graph_does_not_keep_a_specialised_kernel_of_other_values_or_other_code(rec) -> None:
    ctx, blocks, node, key, g, armed = _specialised(rec)
    plan = g.plan
    # Other values (a Hot edit made before the build's snapshot): the generic kernel, looked at again.
    blocks[2].set("Offset", 3.0)
    plan2 = compile_plan(ctx.snapshot(), fuse=True)
    assert plan2.kernel_nodes[0].source is node.source  # (the same code: its values are arguments)
    g2 = _replaced(ctx, g, plan2, {key: 500}, "own")
    assert g2.runs_function(key, 500) and not g2.specialized(key) and not g2.specializations()
    g2.close()
    # A graph whose group runs its generic kernel again hands nothing on.
    g.update_scalar(blocks[3].id, "Factor", 2.0)
    assert not g.specializations()
    g3 = _replaced(ctx, g, plan, {key: 500}, "own")
    assert g3.runs_function(key, 500) and not g3.specialized(key)
    g3.close()
    g.close()
    # Other code under the same key (a member's code edit): the new source's generic kernel.
    ctx, _, e, plan, node = _expression_chain()
    key = (node.block_id, FUSED_KERNEL)
    old = realize_recorded(ctx, plan, BufferPool(), functions={key: 500})
    program = node.source.program
    args = [program.scalar_param(i) for i in range(len(program.scalars))]
    assert old.specialize(key, 600, old.argument_bits(key, args), node.source)
    e.set("Code", "a * F - 1.0")
    plan2 = compile_plan(ctx.snapshot(), fuse=True)
    assert (plan2.kernel_nodes[0].block_id, FUSED_KERNEL) == key and plan2.kernel_nodes[0].source is not node.source
    new = _replaced(ctx, old, plan2, {key: 510}, "own")
    assert new.runs_function(key, 510) and not new.specialized(key)
    new.close()
    old.close()


def test_a_specialisation_that_lands_after_the_engine_closed_its_specializer_is_dropped() -> None:
    _, _, plan, node = _fused_chain(2)
    key = (node.block_id, FUSED_KERNEL)
    g, builder, ready = FakeGraph(plan, key), FakeBuilder(), []
    sp = Specializer(lambda: g, builder, ready)
    assert sp.look() and not sp.look()
    sp.arm()  # the thread runs (it looks on its own)
    sp.close()  # ``Engine.close``: the build in flight lands afterwards
    assert sp._thread is not None and not sp._thread.is_alive()
    builder.submitted[0][1].set_result("compiled")
    assert ready == []
    sp.arm()  # armed after close (a patch of the last frame): nothing starts again
    assert not sp._thread.is_alive()


def test_specialised_builds_stay_out_of_the_disk_cache_and_their_number_is_bounded(monkeypatch, tmp_path) -> None:
    """Every value a slider rests on is a kernel of its own: none goes to the disk cache (it would grow
    for good), and past ``MAX_SPECIALIZED`` distinct ones an engine builds no more (the generic kernel
    runs on; values specialised before are still asked for: they are cached)."""
    from cudapatch.engine import specialize as specialize_module
    from cudapatch.kernels.cache import CubinCache

    _, _, plan, node = _fused_chain(2)
    special = node.source.specialized(((0, _bits(1.5)),))
    assert node.source.disk_cached and not special.disk_cached
    cache = CubinCache(tmp_path)
    cache.put("generic", b"cubin", {})
    cache.put("special", b"cubin", {}, disk=special.disk_cached)
    assert sorted(p.stem for p in tmp_path.iterdir()) == ["generic"] and cache.get("special") is not None

    monkeypatch.setattr(specialize_module, "MAX_SPECIALIZED", 2)
    key = (node.block_id, FUSED_KERNEL)
    g, builder, ready = FakeGraph(plan, key), FakeBuilder(), []
    sp = Specializer(lambda: g, builder, ready)
    program = node.source.program
    slots = [program.scalar_param(s) for s in range(len(program.scalars))]

    def rest_on(v: int) -> None:
        g.values = tuple((i, v + k) for k, i in enumerate(slots))
        sp.arm()  # (as a Hot patch does; no thread runs here: the looks are made by hand)
        sp.look()
        sp.look()

    for v in (10, 20, 30, 40):
        rest_on(v)
    assert len(builder.submitted) == 2  # 10 and 20; 30 and 40 run the generic kernel
    rest_on(10)
    assert len(builder.submitted) == 3 and builder.submitted[-1][0].constants[0] == (0, 10)
    sp.close()


def test_a_specialised_kernel_is_built_in_the_compiler_process() -> None:
    """Nobody waits for a specialised build: it goes to the compiler process (its nvJitLink link takes
    no CPU or GIL from the host's frames), pickled with its program, and comes back the kernel the
    host would have built (the same PTX linked, or the PTX itself where nvJitLink is missing)."""
    import pickle

    from cudapatch.kernels import CubinCache, KernelBuilder, ModuleCache

    _, _, _, node = _fused_chain(3)
    special = node.source.specialized(((0, _bits(1.25)), (1, _bits(-0.5))))
    assert special.portable and not node.source.portable  # (the generic one: built here, at once)
    again = pickle.loads(pickle.dumps(special))
    assert again == special and again.code("sm_90") == special.code("sm_90")
    modules = ModuleCache(device_key="t")
    b = KernelBuilder(arch="sm_90", cache=CubinCache(False), modules=modules, make_current=lambda: None)
    try:
        there, here = b._compile(special), special.compile("sm_90")
        assert (there.kind, there.image) == (here.kind, here.image) and there.descriptor == node.descriptor
    finally:
        b.close()


def test_a_program_is_pickled_without_what_its_cached_properties_hold() -> None:
    """The compiler process gets a program's fields and works its descriptor out again: pickling the
    descriptor of a large fused group was most of the one C call that held the frames' interpreter."""
    import pickle

    _, _, _, node = _fused_chain(40)
    program = node.source.program
    assert program.descriptor and program.key and program.param_names  # (cached now)
    data = pickle.dumps(program)
    assert b"KernelParamDescriptor" not in data and program.key.encode() not in data
    again = pickle.loads(data)
    assert "descriptor" not in again.__dict__
    assert again.descriptor == program.descriptor and again.key == program.key
    assert again.param_names == program.param_names and again.stages[39].bind == program.stages[39].bind
    # the stages in pieces (each ``pickle.dumps`` a short C call), back as one tuple
    pieces = program.__getstate__()["stages"]
    assert isinstance(pieces, list) and len(pieces) == -(-40 // STAGES_PER_PICKLE) >= 2
    assert type(again.stages) is tuple and len(again.stages) == 40
    assert [s.label for s in again.stages] == [s.label for s in program.stages]
    assert dataclasses.replace(node.source, program=again).code("sm_90") == node.source.code("sm_90")
    small = _fused_chain(3)[3].source.program
    assert type(small.__getstate__()["stages"]) is tuple and pickle.loads(pickle.dumps(small)).key == small.key


def test_argument_bits_read_every_scalar_of_a_large_fused_kernel_as_its_storage_holds_it(rec) -> None:
    import random

    from cudapatch.engine.params import argument_offsets

    rng = random.Random(7)
    ctx = Context()
    blocks = [
        ctx.register_block(Scale(name=f"s{i}", Factor=rng.uniform(-4, 4), Offset=rng.uniform(-1, 1)))
        for i in range(300)
    ]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 1024, DType.FLOAT32))
    plan = compile_plan(ctx.snapshot(), fuse=True)
    (node,) = [n for n in plan.kernel_nodes if n.kernel == FUSED_KERNEL]
    key = (node.block_id, FUSED_KERNEL)
    g = realize_recorded(ctx, plan, BufferPool(), functions={key: 500})
    program = node.source.program
    args = [program.scalar_param(s) for s in range(len(program.scalars))]
    assert len(args) >= 600
    storage = g._nodes[0].store.storage
    offsets = argument_offsets(node.descriptor)

    def reference(indices):
        return tuple((i, struct.unpack_from("<I", storage, offsets[i])[0]) for i in indices)

    shuffled = rng.sample(args, len(args))
    for indices in (args, shuffled, shuffled[:1], []):
        assert g.argument_bits(key, indices) == reference(indices)
    assert [bits for _, bits in g.argument_bits(key, args)] == [_bits(node.args[i].value) for i in args]
    g.close()


def test_argument_bits_at_any_offsets_in_any_order_are_the_words_there(monkeypatch) -> None:
    from cudapatch.engine import executable

    raw = bytes(range(40))
    desc = object()
    monkeypatch.setattr(executable, "argument_offsets", lambda d: [0, 5, 12, 3, 12])
    for indices in ([1, 2], [2, 1, 0], [3], [], [2, 4]):  # unaligned, out of order, one, none, one twice
        read = executable._bits_reader(desc, indices)
        offsets = [[0, 5, 12, 3, 12][i] for i in indices]
        assert read(raw) == tuple(struct.unpack_from("<I", raw, o)[0] for o in offsets)
        assert read(bytearray(raw)) == read(raw)


def test_one_unpack_reads_the_words_at_random_offsets_in_the_order_asked_as_unpack_from_each() -> None:
    # Property: for any offsets (aligned or not, in any order, repeated, overlapping, adjacent or far
    # apart), the one-struct reader gives what one ``unpack_from('<I', raw, off)`` per word gives.
    import ctypes
    import random

    from cudapatch.engine.executable import _one_unpack

    rng = random.Random(20261127)
    raw = bytes(rng.randrange(256) for _ in range(512))
    for trial in range(3000):
        n = rng.choice((0, 1, 2, 3, rng.randrange(4, 40)))
        span = rng.choice((8, 64, len(raw) - 3))  # dense (many overlaps) or sparse
        if trial % 3 == 0:  # aligned, distinct: the one-struct path
            at = [4 * k for k in rng.sample(range(span // 4), min(n, span // 4))]
        else:
            at = [rng.randrange(span) for _ in range(n)]
        if at and rng.random() < 0.2:  # an offset asked twice
            at.insert(rng.randrange(len(at) + 1), rng.choice(at))
        read = _one_unpack(list(at))
        expected = tuple(struct.unpack_from("<I", raw, o)[0] for o in at)
        for storage in (raw, bytearray(raw), (ctypes.c_ubyte * len(raw)).from_buffer_copy(raw)):  # (a ParamStorage's)
            assert read(storage) == expected, (trial, at)


def test_a_programs_scalar_arguments_are_one_tuple_made_once() -> None:
    from cudapatch.expr.check import compile_expression
    from cudapatch.expr.program import single

    program = single(compile_expression("x * Gain + Offset + y"))
    assert program.scalars == ("Gain", "Offset")
    assert program.scalar_params == tuple(program.scalar_param(s) for s in range(len(program.scalars)))
    assert program.scalar_params is program.scalar_params  # (a look reads a group's 500 every time)
