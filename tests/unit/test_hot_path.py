"""The Hot/Warm path of an edit frame without a GPU: ``CompiledGraph`` patches one change of one
top-level node with one slot write and one driver call (a ``BlockParameter``, an ``ExternalBinding``
or a plain value; a fused member's scalar lands in the fused node's slot), falls back to the general
path for several changes, and names the kernel when the driver refuses (through the held calls on
plain values as through the ones on handles); ``ParamTier`` hands the
dirty tracker back the dicts it took (an edit frame makes none). The recording driver stands in for
the ``cu*`` functions; the GPU suite checks the values a device computes."""

from __future__ import annotations

import pytest
from cuda.bindings import driver as real

from cudapatch import DType, Scale
from cudapatch.engine import Context, ExternalBinding, compile_plan
from cudapatch.engine.buffers import BufferPool
from cudapatch.engine.compiler.fusion import FUSED_KERNEL
from cudapatch.engine.dirty import DirtyTracker
from cudapatch.engine.stats import EngineCounters
from cudapatch.engine.tiers import ParamTier
from cudapatch.errors import CudaError

from .recording_driver import plain_value_calls, realize_recorded


def _chain(n: int) -> tuple[Context, list]:
    ctx = Context()
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=float(i + 2), Offset=0.5)) for i in range(n)]
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    ctx.bind_input(blocks[0], "In", ExternalBinding(0xA000, 1000, DType.FLOAT32))
    return ctx, blocks


@pytest.mark.parametrize("plain", [False, True], ids=["handles", "plain values"])
def test_one_change_of_one_node_is_one_slot_write_and_one_driver_call(rec, plain: bool) -> None:
    ctx, (s0, s1, s2) = _chain(3)
    plan = compile_plan(ctx.snapshot(), fuse=False)
    g = realize_recorded(ctx, plan, BufferPool())
    g.adopt(None)
    made = plain_value_calls(g, rec) if plain else None
    node = {c[3]: c[1] for c in rec.calls if c[0] == "add_kernel"}  # function -> node handle
    rec.calls.clear()
    s1.set("Factor", 7.5)  # the parameter object itself, as the dirty tracker hands it over
    assert g.update_scalars({(s1.id, "Factor"): s1.params["Factor"]}) == 1
    assert rec.calls == [("set_params", node[100 + s1.id], 4)]
    assert g.node_arg(plan.block_nodes[s1.id][0], 2) == 7.5
    rec.calls.clear()
    assert g.update_bindings({(s0.id, "In"): ExternalBinding(0xB000, 1000, DType.FLOAT32)}) == 1
    assert rec.calls == [("set_params", node[100 + s0.id], 4)]
    assert g.node_arg(plan.block_nodes[s0.id][0], 0) == 0xB000
    rec.calls.clear()
    assert g.update_scalars({(s1.id, "Factor"): 8.5}) == 1  # (the key's second update: the one-change path)
    assert rec.calls == [("set_params", node[100 + s1.id], 4)]
    assert g.node_arg(plan.block_nodes[s1.id][0], 2) == 8.5
    assert made is None or made["set_params"] == 1  # the one-change path calls the ones on plain values
    rec.calls.clear()
    assert g.update_scalars({(99, "Factor"): 1.0}) == 0 and rec.calls == []  # not in this graph
    # Two changes of one node: the general path, still one driver call for it.
    assert g.update_scalars({(s2.id, "Factor"): 1.5, (s2.id, "Offset"): -1.0}) == 1
    assert rec.calls == [("set_params", node[100 + s2.id], 4)]
    assert g.node_arg(plan.block_nodes[s2.id][0], 3) == -1.0
    g.close()


def test_a_fused_members_scalar_patches_the_fused_nodes_slot(rec) -> None:
    ctx, blocks = _chain(5)
    plan = compile_plan(ctx.snapshot(), fuse=True)
    (fused,) = plan.kernel_nodes
    assert fused.kernel == FUSED_KERNEL
    g = realize_recorded(ctx, plan, BufferPool(), functions={(blocks[-1].id, FUSED_KERNEL): 7})
    g.adopt(None)
    (handle,) = [c[1] for c in rec.calls if c[0] == "add_kernel"]
    rec.calls.clear()
    assert g.update_scalars({(blocks[2].id, "Offset"): 0.25}) == 1
    assert rec.calls == [("set_params", handle, fused.grid)]
    offsets = [plan.scalar_slots[(b.id, "Offset")] for b in blocks]  # one (node, arg) slot each
    assert [g.node_arg(ni, ai) for ((ni, ai),) in offsets] == [0.5, 0.5, 0.25, 0.5, 0.5]
    g.close()


@pytest.mark.parametrize("plain", [False, True], ids=["handles", "plain values"])
def test_a_refused_patch_names_the_kernel(rec, monkeypatch, plain: bool) -> None:
    ctx, (s0, _, _) = _chain(3)
    g = realize_recorded(ctx, compile_plan(ctx.snapshot(), fuse=False), BufferPool())
    g.adopt(None)
    refused = real.CUresult.CUDA_ERROR_INVALID_VALUE
    monkeypatch.setattr(g, "_set_params", lambda *a: (refused,))
    with pytest.raises(CudaError, match="cuGraphExecKernelNodeSetParams") as info:
        g.update_scalars({(s0.id, "Factor"): 3.0})  # (the key's first update: the general path)
    assert info.value.kernel  # the kernel's entry point: the error lands on the right block
    if plain:  # a plain int back, as the held entry point returns it (the call on handles would pass)
        plain_value_calls(g, rec)
        monkeypatch.setattr(g, "_raw", g._raw._replace(set_params=lambda *a: int(refused)))
        monkeypatch.setattr(g, "_set_params", lambda *a: (0,))
    with pytest.raises(CudaError, match="cuGraphExecKernelNodeSetParams") as info:
        g.update_scalars({(s0.id, "Factor"): 4.0})  # (then the one-change path)
    assert info.value.kernel
    g.close()


class _Graph:
    """What ParamTier reads of a graph: one node per change, no captured calls."""

    has_calls = False

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def update_scalars(self, changes: dict) -> int:
        self.seen.append(dict(changes))
        return len(changes)

    def update_bindings(self, changes: dict) -> int:
        self.seen.append(dict(changes))
        return len(changes)


def test_the_param_tier_hands_the_dirty_tracker_back_the_dicts_it_took() -> None:
    dirty, counters, g = DirtyTracker(), EngineCounters(), _Graph()
    dirty.clear_structure()
    tier = ParamTier(dirty=dirty, board=None, counters=counters)  # type: ignore[arg-type]  # no re-capture here
    made: list[int] = []
    for i in range(4):
        dirty.mark_param(1, "Factor", float(i))
        made.append(id(dirty.params))
        assert dirty.any and tier.apply(g) is False  # type: ignore[arg-type]
        assert not dirty.any and dirty.params == {} and dirty.bindings == {}
    assert len(set(made)) == 2  # two pairs of dicts take turns: none is made per frame
    assert g.seen == [{(1, "Factor"): float(i)} for i in range(4)]
    assert counters.hot_updates == counters.nodes_patched == 4
    # A change carried across a build on the build thread is a copy: clearing the taken dict keeps it.
    tier.begin_carry()
    dirty.mark_binding(1, "In", 0xB000)
    tier.apply(g)  # type: ignore[arg-type]
    assert tier._carried == ({}, {(1, "In"): 0xB000}) and counters.warm_updates == 1
