"""``CompiledGraph.set_bypass`` over random sequences of bypassed sets (toggles repeat, so its cached
steps are taken again), with Warm growths between them that move the buffers: after every step each
kernel node is on exactly when the bypass leaves it on, each slot holds the pointer the plan or the
redirect names, resolved against where the buffers are now, and each node changed goes to the driver
once, every one of them; through the held calls on plain values (``RawCalls``) as through the ones on
handles."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cudapatch import DType, Scale
from cudapatch.engine import Context, ExternalBinding
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.bypass import BypassIndex, BypassPlan
from cudapatch.engine.executable import CompiledGraph
from cudapatch.engine.nodes import KernelNode, arg_value
from cudapatch.engine.warm import WarmPatch, decide_warm_patch

from .recording_driver import plain_value_calls, realize_recorded
from .unfused import compile_plan


def _expected_pointers(g: CompiledGraph, bp: BypassPlan, binding_ptr: int) -> dict[tuple[int, int], int]:
    """(node, argument) -> the pointer it must hold: the resource ``bp`` redirects it to, else the plan's."""
    out = {}
    for ni, kn in enumerate(g._nodes):
        if not isinstance(kn, KernelNode):
            continue
        for ai, a in enumerate(kn.plan.args):
            if not a.is_pointer or a.kind not in ("buffer", "external"):
                continue
            res = bp.redirects.get((ni, ai))
            if res is None:
                out[(ni, ai)] = arg_value(a, g.buffers, {}, None) if a.kind == "buffer" else binding_ptr
            else:
                out[(ni, ai)] = g.buffers[res].ptr if isinstance(res, int) else binding_ptr
    return out


def _pointers_now(g: CompiledGraph) -> dict[tuple[int, int], int]:
    return {
        (ni, ai): kn.slots[ai].value
        for ni, kn in enumerate(g._nodes)
        if isinstance(kn, KernelNode)
        for ai, a in enumerate(kn.plan.args)
        if a.is_pointer and a.kind in ("buffer", "external")
    }


@pytest.mark.parametrize("plain", [False, True], ids=["handles", "plain values"])
@pytest.mark.parametrize("seed", range(8))
def test_cached_bypass_steps_leave_the_graph_as_the_bypass_says(rec, seed: int, plain: bool) -> None:
    rng = random.Random(seed)
    n = rng.randint(3, 10)
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}")) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    count, binding = 1000, 0xA000
    ctx.bind_input(blocks[0], "In", ExternalBinding(binding, count, DType.FLOAT32))
    g = realize_recorded(ctx, compile_plan(ctx.snapshot(), reuse=False), BufferPool())
    g.adopt(None)
    made = plain_value_calls(g, rec) if plain else Counter()
    handles = {kn.handle: ni for ni, kn in enumerate(g._nodes) if isinstance(kn, KernelNode)}
    enabled = dict.fromkeys(handles.values(), 1)
    index = BypassIndex(g.plan)
    sets = [frozenset(rng.sample([b.id for b in blocks], rng.randint(0, 2))) for _ in range(3)]
    for step in range(30):
        if rng.random() < 0.15:  # a Warm growth: the buffers move, the bypass stays
            count *= 2
            ctx.bind_input(blocks[0], "In", ExternalBinding(binding, count, DType.FLOAT32))
            snap = ctx.snapshot()
            new = compile_plan(snap, reuse=False)
            d = decide_warm_patch(g.plan, new, snap.bindings, capacities=[b.capacity_bytes for b in g.buffers])
            assert isinstance(d, WarmPatch)
            assert g.try_patch(new, snap.bindings, decided=d) is not None
            index = BypassIndex(g.plan)
        _, bp = index.decide(rng.choice(sets))
        before = _pointers_now(g)
        rec.calls.clear()
        g.set_bypass(bp)
        for call in rec.calls:
            if call[0] == "set_enabled":
                enabled[handles[call[2]]] = call[3]
        assert {ni for ni, on in enabled.items() if not on} == set(bp.disabled), f"step {step}"
        sent = Counter(handles[c[1]] for c in rec.calls if c[0] == "set_params")
        assert all(v == 1 for v in sent.values()), "a node went to the driver twice in one step"
        changed = {ni for (ni, _), ptr in _pointers_now(g).items() if before[(ni, _)] != ptr}
        assert changed <= set(sent), f"step {step}: nodes {sorted(changed - set(sent))} changed but not sent"
        for (ni, ai), ptr in _expected_pointers(g, bp, binding).items():
            assert g._nodes[ni].slots[ai].value == ptr, f"step {step}: node {ni} argument {ai}"
    assert not plain or made["set_enabled"] > 0, "the toggles called the held calls on plain values"
    g.close()
