"""The fusion phase without a GPU: which blocks fuse, what the fused node holds (Hot slots, inputs,
one output), and, over random chains and trees, that the fused plan computes bit for bit what the
unfused plan computes (NumPy interpreter of both plans)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from cudapatch import Expression, Scale, VectorAdd
from cudapatch.blocks.library import AppendFilter
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.compiler.fusion import FUSED_KERNEL, FusedSource, elementwise_member
from cudapatch.engine.context import ExternalBinding
from cudapatch.engine.diagnostics import DiagnosticCode
from cudapatch.engine.profiling import ProfilingLevel
from cudapatch.kernels.types import DType

from .plan_interp import run_plan

_ptr = iter(range(0x10000, 1 << 40, 0x10000))


def _bind(ctx: Context, block, port: str, data: np.ndarray, externals: dict) -> None:
    ctx.bind_input(block, port, ExternalBinding(next(_ptr), data.size, DType.FLOAT32))
    externals[(block.id, port)] = data


def _chain(n_blocks: int, count: int = 1000) -> tuple[Context, list, dict]:
    ctx, externals = Context(), {}
    blocks = [ctx.register_block(Scale(name=f"s{i}", Factor=1.0 + i / 10, Offset=0.5)) for i in range(n_blocks)]
    _bind(ctx, blocks[0], "In", np.linspace(-1, 1, count, dtype=np.float32), externals)
    for a, b in zip(blocks, blocks[1:], strict=False):
        ctx.connect(a, "Out", b, "In")
    return ctx, blocks, externals


def test_a_chain_becomes_one_node_with_a_slot_per_scalar() -> None:
    ctx, blocks, _ = _chain(6)
    plan = compile_plan(ctx.snapshot(), fuse=True)
    (node,) = plan.kernel_nodes
    assert node.kernel == FUSED_KERNEL and node.block_id == blocks[-1].id
    assert isinstance(node.source, FusedSource) and node.source.members == tuple(b.id for b in blocks)
    assert all(plan.block_nodes[b.id] == (0,) for b in blocks)
    for b in blocks:
        for name in ("Factor", "Offset"):
            ((ni, ai),) = plan.scalar_slots[(b.id, name)]
            assert ni == 0 and node.args[ai].kind == "scalar" and node.args[ai].ref == (b.id, name)
    assert (blocks[-1].id, "Out") in plan.outputs and (blocks[0].id, "Out") not in plan.outputs
    assert sum(buf.count for buf in plan.buffers) == 1000 + 5  # the sink's output, five placeholders
    assert "fused" in plan.buffers[0].label
    assert len(compile_plan(ctx.snapshot(), fuse=False).kernel_nodes) == 6  # as before fusion


def test_an_output_with_two_readers_ends_a_group() -> None:
    ctx, blocks, _ = _chain(4)
    extra = ctx.register_block(Scale(name="tap"))
    ctx.connect(blocks[1], "Out", extra, "In")  # s1's output is read twice: it must be stored
    plan = compile_plan(ctx.snapshot(), fuse=True)
    groups = [n.source.members for n in plan.kernel_nodes if isinstance(n.source, FusedSource)]
    ids = [b.id for b in blocks]
    assert sorted(groups) == sorted([tuple(ids[:2]), tuple(ids[2:])])
    assert (ids[1], "Out") in plan.outputs and len(plan.kernel_nodes) == 3


def test_non_elementwise_blocks_opt_outs_and_profiling_stop_fusion() -> None:
    ctx, blocks, _ = _chain(3)
    keep = ctx.register_block(AppendFilter(name="keep"))
    ctx.connect(blocks[-1], "Out", keep, "In")
    plan = compile_plan(ctx.snapshot(), fuse=True)
    assert len(plan.kernel_nodes) == 2  # the chain fused, the append filter apart
    assert len(compile_plan(ctx.snapshot(), level=ProfilingLevel.PER_BLOCK, fuse=True).kernel_nodes) == 4
    ctx2, _, _ = _chain(1)
    solo = ctx2.register_block(Scale(name="solo", fuse=False))
    first = next(b for b in ctx2.registry if b.name == "s0")
    ctx2.connect(first, "Out", solo, "In")
    assert len(compile_plan(ctx2.snapshot(), fuse=True).kernel_nodes) == 2
    assert elementwise_member(next(b for b in ctx2.snapshot().blocks if b.name == "solo")) is None


def test_different_counts_do_not_fuse() -> None:
    ctx, externals = Context(), {}
    e = ctx.register_block(Expression(name="e", Code="x * 2"))
    add = ctx.register_block(VectorAdd(name="add"))
    _bind(ctx, e, "x", np.ones(30, np.float32), externals)
    _bind(ctx, add, "A", np.ones(20, np.float32), externals)  # the launch is 20, e makes 30 (fewer: input-short)
    ctx.connect(e, "Out", add, "B")
    assert len(compile_plan(ctx.snapshot(), fuse=True).kernel_nodes) == 2


_UNARY = [
    "{a} * {S} + 0.25",
    "sin({a}) * {S}",
    "fma({a}, {S}, {S2})",
    "abs({a}) - {S}",
    "sqrt(abs({a}))",
    "{a} / (1 + {S} * {S})",
]
_BINARY = [
    "{a} + {b}",
    "{a} * {b} - {S}",
    "min({a}, {b}) + max({a}, {S})",
    "mix({a}, {b}, 0.3)",
    "where({a} > {b}, {a}, {b} * {S})",
]


def _random_patch(rng: np.random.Generator, count: int) -> tuple[Context, dict, list]:
    """Random trees and chains of Scale, VectorAdd and Expression blocks over a few bound inputs;
    some outputs read twice (they must stay stored)."""
    ctx, externals = Context(), {}
    produced: list[tuple[object, str]] = []  # (block, output port) that later blocks may read
    blocks = []
    for i in range(int(rng.integers(2, 14))):
        kind = rng.choice(["scale", "add", "expr1", "expr2"])
        if kind == "scale":
            b = ctx.register_block(Scale(name=f"b{i}", Factor=float(rng.normal()), Offset=float(rng.normal())))
            ports = ["In"]
        elif kind == "add":
            b = ctx.register_block(VectorAdd(name=f"b{i}"))
            ports = ["A", "B"]
        else:
            template = rng.choice(_UNARY if kind == "expr1" else _BINARY)
            code = template.format(a="x", b="y", S="Gain", S2="Bias")
            b = ctx.register_block(Expression(name=f"b{i}", Code=code))
            for s in b.source.program.scalars:  # type: ignore[union-attr]
                b.set(s, float(rng.normal()))
            ports = [p.name for p in b.inputs]
        for port in ports:
            if produced and rng.random() < 0.8:
                src, out = produced[int(rng.integers(len(produced)))]
                ctx.connect(src, out, b, port)
            else:
                _bind(ctx, b, port, rng.standard_normal(count).astype(np.float32), externals)
        produced.append((b, b.outputs[0].name))
        blocks.append(b)
    return ctx, externals, blocks


@pytest.mark.parametrize("seed", range(60))
def test_fused_plans_compute_what_unfused_plans_compute(seed: int) -> None:
    rng = np.random.default_rng(seed)
    count = int(rng.choice([1, 7, 256, 1000]))
    ctx, externals, blocks = _random_patch(rng, count)
    snap = ctx.snapshot()
    plain = compile_plan(snap, fuse=False, reuse=False)  # every intermediate is compared: none may be overwritten
    fused = compile_plan(snap, fuse=True, reuse=False)
    assert len(fused.kernel_nodes) <= len(plain.kernel_nodes)
    got_plain = run_plan(plain, snap, externals)
    got_fused = run_plan(fused, snap, externals)
    for port, bi in fused.outputs.items():  # every output that still has a buffer: bit for bit
        np.testing.assert_array_equal(got_fused[bi], got_plain[plain.outputs[port]], err_msg=str(port))
    for port in plain.outputs.keys() - fused.outputs.keys():  # fused away: read by exactly one fused block
        assert sum(1 for lk in ctx.connections if (lk.src, lk.src_port) == port) == 1
    sinks = {b.id for b in blocks if not any(lk.src == b.id for lk in ctx.connections)}
    assert {bid for bid, _ in fused.outputs} >= sinks


def test_random_fused_kernels_assemble_with_ptxas(tmp_path) -> None:
    import shutil
    import subprocess

    ptxas = shutil.which("ptxas")
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) is not installed")
    for seed in range(8):
        rng = np.random.default_rng(100 + seed)
        ctx, _, _ = _random_patch(rng, 64)
        plan = compile_plan(ctx.snapshot(), fuse=True)
        for node in plan.kernel_nodes:
            if not isinstance(node.source, FusedSource):
                continue
            for loads in ("prefetched", "param"):  # a small group's choice, and a large group's
                path = tmp_path / f"f{seed}_{node.index}_{loads}.ptx"
                path.write_text(dataclasses.replace(node.source, scalar_loads=loads).code("sm_90"))
                done = subprocess.run(
                    [ptxas, "-arch=sm_90", str(path), "-o", str(path.with_suffix(".cubin"))], capture_output=True
                )
                assert done.returncode == 0, done.stderr.decode()


def test_declared_expressions_do_what_the_bundled_kernels_do() -> None:
    # The interpreter runs the declaration for both plans, so this is where a declaration that does not
    # match its kernel would show: the one arithmetic instruction of each bundled kernel.
    from cudapatch.kernels.source import bundled_kernel

    scale = bundled_kernel("scale").ptx_path.read_text()
    add = bundled_kernel("vector_add").ptx_path.read_text()
    assert scale.count("fma.rn.f32") == 1 and "mul.f32" not in scale and "add.f32" not in scale
    assert add.count("add.f32") == 1 and "fma" not in add
    s, a = Scale(), VectorAdd()
    assert s.description.kernels[0].expression == "fma(In, Factor, Offset)"
    assert a.description.kernels[0].expression == "A + B"


def test_tooltips_show_the_fused_group() -> None:
    from cudapatch.engine.built_view import BuiltShower, built_view

    ctx, blocks, _ = _chain(3)
    shower = BuiltShower(ctx.registry)
    names = {b.id: b.name for b in blocks}
    shower.apply(built_view(compile_plan(ctx.snapshot(), fuse=True), names, shower.shown), {})
    for b in blocks:
        assert b.debug.fused == "s0 -> s1 -> s2" and "fused: s0 -> s1 -> s2" in b.tooltip()
    shower.apply(built_view(compile_plan(ctx.snapshot(), fuse=False), names, shower.shown), {})
    assert all(b.debug.fused == "" and "fused" not in b.tooltip() for b in blocks)


def test_regenerate_takes_a_members_new_code_with_the_same_descriptor() -> None:
    from cudapatch.engine.compiler.fusion import regenerate

    ctx, externals = Context(), {}
    e = ctx.register_block(Expression(name="e", Code="x * Gain"))
    s = ctx.register_block(Scale(name="s", Factor=2.0))
    _bind(ctx, e, "x", np.arange(8, dtype=np.float32), externals)
    ctx.connect(e, "Out", s, "In")
    plan = compile_plan(ctx.snapshot(), fuse=True)
    (node,) = plan.kernel_nodes
    old = node.source
    assert isinstance(old, FusedSource)
    e.set("Code", "x * Gain + 1")  # same names
    new = regenerate(old, {e.id: e, s.id: s})
    assert new is not None and new.members == old.members and new.program.descriptor == old.program.descriptor
    assert new != old and "x * Gain + 1" in new.program.summary()
    # what the regenerated kernel computes is what a fresh plan of the edited patch computes
    snap = ctx.snapshot()
    fresh = compile_plan(snap, fuse=True)
    # the regenerated kernel goes live at a quick JIT level; its upgrade is what a build would make
    assert new.jit == "quick" and fresh.kernel_nodes[0].source == new.upgrade()
    e.set("Code", "x * Gain + y")  # a new input: no in-place swap
    assert regenerate(old, {e.id: e, s.id: s}) is None
    assert regenerate(old, {s.id: s}) is None  # a member removed


def test_a_large_group_computes_several_elements_per_thread_on_a_smaller_grid() -> None:
    from cudapatch.engine.compiler.fusion import FUSED_PER_THREAD, FUSED_PER_THREAD_FROM, regenerate

    small = compile_plan(_chain(3, count=FUSED_PER_THREAD_FROM - 1)[0].snapshot(), fuse=True).kernel_nodes[0]
    assert small.source.per_thread == 1 and small.grid == -(-(FUSED_PER_THREAD_FROM - 1) // small.block)
    n = FUSED_PER_THREAD_FROM + 37
    ctx, blocks, _ = _chain(3, count=n)
    (node,) = compile_plan(ctx.snapshot(), fuse=True).kernel_nodes
    assert node.source.per_thread == FUSED_PER_THREAD > 1
    assert node.grid == -(-n // (node.block * FUSED_PER_THREAD))  # every element has one thread
    assert (node.grid - 1) * node.block * FUSED_PER_THREAD < n <= node.grid * node.block * FUSED_PER_THREAD
    assert f"mul.lo.s32 %r5, %r2, {FUSED_PER_THREAD}" in node.source.code()
    blocks[1].set("Factor", 3.0)  # a regenerated kernel keeps the layout the node was launched with
    again = regenerate(node.source, {b.id: b for b in blocks})
    assert again is not None and again.per_thread == FUSED_PER_THREAD


def test_a_small_group_launches_128_threads_a_block_and_can_prefetch_its_scalars(monkeypatch) -> None:
    import sys

    from cudapatch.engine.compiler.fusion import FUSED_PER_THREAD_FROM, FUSED_SMALL_BLOCK, regenerate
    from cudapatch.expr.ptx_gen import generate_ptx

    ctx, blocks, _ = _chain(40, count=1024)  # 80 scalars: three 128-byte lines
    (node,) = compile_plan(ctx.snapshot(), fuse=True).kernel_nodes
    # Parameter loads by default (prefetching was slower on the H100), 128 threads a block.
    assert (node.block, node.source.scalar_loads) == (FUSED_SMALL_BLOCK, "param")
    assert "prefetch" not in node.source.code("sm_90")
    monkeypatch.setattr(sys.modules["cudapatch.engine.compiler.fusion"], "FUSED_SMALL_SCALAR_LOADS", "prefetched")
    ctx, blocks, _ = _chain(40, count=1024)
    (node,) = compile_plan(ctx.snapshot(), fuse=True).kernel_nodes
    assert (node.block, node.grid, node.source.scalar_loads) == (
        FUSED_SMALL_BLOCK,
        1024 // FUSED_SMALL_BLOCK,
        "prefetched",
    )
    ptx = node.source.code("sm_90")
    assert ptx.count("cvta.param.u64") == ptx.count("ld.f32") == 80 and "ld.param.f32" not in ptx
    assert ptx.count("prefetch.L1") == 4  # scalars 0, 32, 64 and the last
    assert ptx.index("prefetch.L1") < ptx.index("ld.global.f32")  # asked for before the input's load
    # The same program reading its scalars with ld.param: the rest of the kernel is the same text.
    plain = generate_ptx(node.source.program, "sm_90")
    assert plain.count("ld.param.f32") == 80 and "prefetch" not in plain
    assert [ln for ln in ptx.splitlines() if "fma" in ln] == [ln for ln in plain.splitlines() if "fma" in ln]
    assert "cvta.param" not in generate_ptx(node.source.program, "sm_60", scalar_loads="prefetched")  # sm_70+
    blocks[3].set("Factor", 0.5)
    again = regenerate(node.source, {b.id: b for b in blocks})
    assert again is not None and again.scalar_loads == "prefetched"
    big = compile_plan(_chain(3, count=FUSED_PER_THREAD_FROM)[0].snapshot(), fuse=True).kernel_nodes[0]
    assert big.source.scalar_loads == "param" and big.block == big.descriptor.block_size


# -- fusion by default: what it must not break --------------------------------------------------------
def _groups(plan) -> list[tuple[int, ...]]:
    return [n.source.members for n in plan.kernel_nodes if isinstance(n.source, FusedSource)]


def test_fusion_is_on_by_default_and_fuse_false_turns_it_off() -> None:
    ctx, blocks, _ = _chain(4)
    assert _groups(compile_plan(ctx.snapshot())) == [tuple(b.id for b in blocks)]
    assert _groups(compile_plan(ctx.snapshot(), fuse=False)) == []


def test_an_output_the_host_keeps_ends_its_group_there() -> None:
    ctx, blocks, _ = _chain(5)
    ids = [b.id for b in blocks]
    ctx.keep(blocks[1], "Out")  # Engine.keep / output / read, a GL bridge, a patch file's keep
    plan = compile_plan(ctx.snapshot())
    assert sorted(_groups(plan)) == sorted([tuple(ids[:2]), tuple(ids[2:])])
    assert (ids[1], "Out") in plan.outputs
    ctx.keep(blocks[1], "Out", False)
    ctx.keep(blocks[3], "In")  # a kept input keeps the value it reads: s2's output
    plan = compile_plan(ctx.snapshot())
    assert sorted(_groups(plan)) == sorted([tuple(ids[:3]), tuple(ids[3:])]) and (ids[2], "Out") in plan.outputs


def test_a_port_declared_keep_is_never_fused_away() -> None:
    ctx, blocks, _ = _chain(3)
    kept = ctx.register_block(Scale(name="kept"))
    ctx.connect(blocks[-1], "Out", kept, "In")
    snap = ctx.snapshot()
    out = kept.description.outputs[0]
    desc = dataclasses.replace(kept.description, outputs=(dataclasses.replace(out, keep=True),))
    blocks_ = tuple(dataclasses.replace(b, description=desc) if b.id == kept.id else b for b in snap.blocks)
    plan = compile_plan(dataclasses.replace(snap, blocks=blocks_))
    assert _groups(plan) == [tuple(b.id for b in blocks) + (kept.id,)]  # a sink's kept output: still the sink
    desc2 = dataclasses.replace(
        blocks[1].description, outputs=(dataclasses.replace(blocks[1].description.outputs[0], keep=True),)
    )
    blocks_ = tuple(dataclasses.replace(b, description=desc2) if b.id == blocks[1].id else b for b in snap.blocks)
    plan = compile_plan(dataclasses.replace(snap, blocks=blocks_))
    ids = [b.id for b in blocks]
    assert sorted(_groups(plan)) == sorted([tuple(ids[:2]), (ids[2], kept.id)])


def test_a_bypassed_block_runs_on_its_own_node_and_its_neighbours_still_fuse() -> None:
    from cudapatch.engine.bypass import BypassIndex, plan_bypass

    ctx, blocks, _ = _chain(5)
    ids = [b.id for b in blocks]
    plan = compile_plan(ctx.snapshot())
    index = BypassIndex(plan)
    assert index.fused == set(ids)  # any bypass here needs the rebuild that splits the group
    blocks[2].enabled = False
    plan = compile_plan(ctx.snapshot())
    assert sorted(_groups(plan)) == sorted([tuple(ids[:2]), tuple(ids[3:])])
    index = BypassIndex(plan)
    assert ids[2] not in index.fused
    bp = plan_bypass(index, {ids[2]})
    (own,) = plan.block_nodes[ids[2]]
    assert bp.disabled == {own} and not bp.refused
    # its reader (the fused s3 -> s4) reads s2's input instead: the output of the fused s0 -> s1
    assert set(bp.redirects.values()) == {plan.outputs[(ids[1], "Out")]}
    assert {ni for ni, _ in bp.redirects} == set(plan.block_nodes[ids[4]])


def test_a_faulted_block_is_left_out_and_the_blocks_around_it_fuse() -> None:
    ctx, blocks, _ = _chain(5)
    ids = [b.id for b in blocks]
    plan = compile_plan(ctx.snapshot(), faulted={ids[2]: "illegal address"})
    assert sorted(_groups(plan)) == sorted([tuple(ids[:2]), tuple(ids[3:])])


def test_a_group_stays_on_one_side_of_a_child_graph_composite() -> None:
    from tests.unit.composite_blocks import TwoScales

    ctx, externals = Context(), {}
    pair = ctx.register_block(TwoScales(name="pair", child_graph=True))
    t1, t2 = ctx.register_block(Scale(name="t1")), ctx.register_block(Scale(name="t2"))
    ctx.connect(pair, "Out", t1, "In")
    ctx.connect(t1, "Out", t2, "In")
    _bind(ctx, pair, "In", np.ones(100, np.float32), externals)
    plan = compile_plan(ctx.snapshot())
    a, b = pair.inner("a"), pair.inner("b")
    assert sorted(_groups(plan)) == sorted([(a.id, b.id), (t1.id, t2.id)])
    (child,) = plan.children
    assert set(child.nodes) >= set(plan.block_nodes[b.id]) and not set(child.nodes) & set(plan.block_nodes[t1.id])


def test_a_flattened_composite_fuses_with_its_neighbours_and_its_exposed_scalar_patches_the_fused_node() -> None:
    from tests.unit.composite_blocks import TwoScales

    ctx, externals = Context(), {}
    pair = ctx.register_block(TwoScales(name="pair"))
    tail = ctx.register_block(Scale(name="tail"))
    ctx.connect(pair, "Out", tail, "In")
    _bind(ctx, pair, "In", np.ones(100, np.float32), externals)
    plan = compile_plan(ctx.snapshot())
    a, b = pair.inner("a"), pair.inner("b")
    (node,) = plan.kernel_nodes
    assert node.source.members == (a.id, b.id, tail.id)
    slots = plan.scalar_slots[(pair.id, "Gain")]  # a Hot edit of the composite patches both members' slots
    assert {ni for ni, _ in slots} == {node.index} and {node.args[ai].ref for _, ai in slots} == {
        (a.id, "Factor"),
        (b.id, "Factor"),
    }
    assert (pair.id, "Out") not in plan.outputs  # fused away: the composite's output is b's
    ctx.keep(pair, "Out")  # the host reads the composite's output: kept as b's
    plan = compile_plan(ctx.snapshot())
    assert _groups(plan) == [(a.id, b.id)] and plan.outputs[(pair.id, "Out")] == plan.outputs[(b.id, "Out")]


def test_a_fused_group_inside_a_frame_delay_loop_reads_and_writes_the_delays_pair() -> None:
    from cudapatch import FrameDelay
    from cudapatch.blocks.library import Fill

    ctx = Context()
    d = ctx.register_block(FrameDelay(name="d", Count=64))
    f = ctx.register_block(Fill(name="f", Count=64))
    a = ctx.register_block(VectorAdd(name="a"))
    s = ctx.register_block(Scale(name="s"))
    ctx.connect(d, "Out", a, "A")
    ctx.connect(f, "Out", a, "B")
    ctx.connect(a, "Sum", s, "In")
    ctx.connect(s, "Out", d, "In")
    plan = compile_plan(ctx.snapshot())
    (dp,) = plan.delays
    (node,) = [n for n in plan.kernel_nodes if isinstance(n.source, FusedSource)]
    assert node.source.members == (a.id, s.id)
    refs = [arg.ref for arg in node.args if arg.kind == "buffer"]
    assert dp.previous in refs[:-1] and refs[-1] == dp.current  # the phases swap these two in the fused node
    assert dp.node in node.deps


def test_the_fault_replay_plans_every_block_on_its_own_nodes() -> None:
    from cudapatch.engine.compiler.fusion import in_fused_node
    from cudapatch.engine.replay import replay_plan

    ctx, blocks, _ = _chain(4)
    fused = compile_plan(ctx.snapshot())
    assert all(in_fused_node(fused, b.id) for b in blocks)
    plan = replay_plan(ctx.snapshot())
    assert not any(in_fused_node(plan, b.id) for b in blocks)
    assert [n.block_id for n in plan.kernel_nodes] == [b.id for b in blocks]


def test_a_members_broken_code_edit_leaves_the_group_kernel_as_it_was() -> None:
    from cudapatch.engine.compiler.fusion import regenerate

    ctx, externals = Context(), {}
    e = ctx.register_block(Expression(name="e", Code="x * Gain"))
    s = ctx.register_block(Scale(name="s", Factor=2.0))
    _bind(ctx, e, "x", np.arange(8, dtype=np.float32), externals)
    ctx.connect(e, "Out", s, "In")
    (node,) = compile_plan(ctx.snapshot()).kernel_nodes
    e.set("Code", "x * (Gain + ")  # half-typed: the error goes on e (its own compile), nothing is swapped
    assert regenerate(node.source, {e.id: e, s.id: s}) is None


def test_a_chain_too_long_for_one_launch_runs_as_several_fused_kernels_in_order() -> None:
    from cudapatch.engine.compiler.fusion import MAX_PARAM_BYTES, _param_bytes

    ctx, blocks, externals = _chain(1000, count=64)  # 2,000 scalars: 8 KB of arguments
    plan = compile_plan(ctx.snapshot())
    groups = _groups(plan)
    assert len(plan.kernel_nodes) == len(groups) >= 2  # fused, in pieces: no block runs alone
    assert [b for g in groups for b in g] == [b.id for b in blocks]  # contiguous pieces, in order
    for node in plan.kernel_nodes:
        inputs = sum(1 for a in node.args if a.kind == "buffer") - 1
        assert _param_bytes(inputs, len(node.source.members) * 2) <= MAX_PARAM_BYTES
    snap = ctx.snapshot()
    plain = compile_plan(snap, fuse=False)
    key = (blocks[-1].id, "Out")
    ref = run_plan(plain, snap, externals)[plain.outputs[key]]
    np.testing.assert_array_equal(run_plan(plan, snap, externals)[plan.outputs[key]], ref)


_GAIN_CU = """extern "C" __global__ void gain(const float* In, float* Out, float Gain, unsigned int n) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) Out[i] = In[i] * Gain;
}"""


def _plugin_gain(declaration: str) -> type:
    """A plugin's block type: its own CUDA C++ kernel, declared elementwise with ``declaration``."""
    from cudapatch import Block, CudaSource
    from cudapatch.blocks.builder import BlockBuilder
    from cudapatch.blocks.description import like

    class PluginGain(Block):
        type_name = "PluginGain"

        def describe(self, b: BlockBuilder) -> None:
            k = b.add_kernel(CudaSource(code=_GAIN_CU, name="gain.cu"))
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=like("In"))
            b.scalar("Gain", k.in_(2), default=2.0)
            k.auto_grid(like("In"), count_param=3)
            k.elementwise(declaration)

    return PluginGain


def _scale_then(block_type: type) -> tuple[Context, list, dict]:
    ctx, externals = Context(), {}
    s = ctx.register_block(Scale(name="s", Factor=1.5, Offset=0.25))
    g = ctx.register_block(block_type(name="g", Gain=3.0))
    _bind(ctx, s, "In", np.linspace(-1, 1, 500, dtype=np.float32), externals)
    ctx.connect(s, "Out", g, "In")
    return ctx, [s, g], externals


def test_a_plugin_block_that_declares_its_expression_fuses_and_computes_what_it_computes_unfused() -> None:
    ctx, (s, g), externals = _scale_then(_plugin_gain("In * Gain"))
    snap = ctx.snapshot()
    fused = compile_plan(snap, fuse=True, reuse=False)
    (node,) = fused.kernel_nodes
    assert node.kernel == FUSED_KERNEL and node.source.members == (s.id, g.id)
    ((ni, ai),) = fused.scalar_slots[(g.id, "Gain")]  # its scalar stays Hot: a slot of the fused node
    assert ni == 0 and node.args[ai].ref == (g.id, "Gain")
    plain = compile_plan(snap, fuse=False, reuse=False)
    assert len(plain.kernel_nodes) == 2
    out = (g.id, "Out")
    got_fused, got_plain = run_plan(fused, snap, externals), run_plan(plain, snap, externals)
    np.testing.assert_array_equal(got_fused[fused.outputs[out]], got_plain[plain.outputs[out]])
    x = externals[(s.id, "In")].astype(np.float64)
    np.testing.assert_allclose(got_fused[fused.outputs[out]], (x * 1.5 + 0.25) * 3.0, rtol=1e-6)


@pytest.mark.parametrize(
    ("declaration", "words"),
    [
        ("In * Nope", "does not fit its ports and scalars: unknown name 'Nope' (known: Gain, In, count, index, pi)"),
        ("In * (Gain", "does not parse: expected ')', found the end of the expression (column 11)"),
    ],
)
def test_a_plugin_declaration_that_does_not_fit_its_ports_runs_unfused(declaration: str, words: str) -> None:
    ctx, (s, g), _ = _scale_then(_plugin_gain(declaration))  # no port or scalar named Nope; a missing )
    plan = compile_plan(ctx.snapshot(), fuse=True)
    assert [n.block_id for n in plan.kernel_nodes] == [s.id, g.id]
    assert all(n.kernel != FUSED_KERNEL for n in plan.kernel_nodes)
    (warn,) = plan.diagnostics  # a warning on the block, naming it, its declaration and the column
    assert (warn.severity, warn.block_id, warn.code) == ("warning", g.id, DiagnosticCode.EXPRESSION_DECLARATION)
    assert warn.message.startswith(f"block 'g' runs unfused: its declaration k.elementwise({declaration!r}) ")
    assert words in warn.message and warn.message.endswith(")") and "(column " in warn.message
    assert compile_plan(ctx.snapshot(), fuse=True).diagnostics == (warn,)  # once per build, every build
    assert compile_plan(ctx.snapshot(), fuse=False).diagnostics == ()  # nothing fuses: nothing to warn of


def test_a_plugin_declaration_warning_stays_when_a_later_edit_resumes_the_plan() -> None:
    from cudapatch.engine.compiler import NodeCache

    ctx, (s, g), externals = _scale_then(_plugin_gain("In * Nope"))
    chain = [g]
    for i in range(4):
        chain.append(ctx.register_block(Scale(name=f"t{i}")))
        ctx.connect(chain[-2], "Out", chain[-1], "In")
    cache = NodeCache()
    first = compile_plan(ctx.snapshot(), fuse=True, cache=cache)
    tail = ctx.register_block(Scale(name="tail"))
    ctx.connect(chain[-1], "Out", tail, "In")  # an edit after the plugin block: planned from later on
    plan = compile_plan(ctx.snapshot(), fuse=True, cache=cache)
    assert cache.resumed == 1 and plan == compile_plan(ctx.snapshot(), fuse=True)
    assert [d.block_id for d in first.diagnostics] == [d.block_id for d in plan.diagnostics] == [g.id]


def test_an_expression_with_a_declared_input_it_does_not_use_fuses_and_computes_what_it_computes_unfused() -> None:
    ctx, externals = Context(), {}
    a = ctx.register_block(Scale(name="a", Factor=1.5))
    b = ctx.register_block(Scale(name="b", Factor=-2.0))
    e = ctx.register_block(Expression(name="e", Code="x * gain + 1", Inputs="x, spare", Scalars="gain", gain=0.75))
    after = ctx.register_block(Scale(name="after", Offset=0.5))
    _bind(ctx, a, "In", np.linspace(-1, 1, 300, dtype=np.float32), externals)
    _bind(ctx, b, "In", np.linspace(0, 1, 300, dtype=np.float32), externals)
    ctx.connect(a, "Out", e, "x")
    ctx.connect(b, "Out", e, "spare")
    ctx.connect(e, "Out", after, "In")
    snap = ctx.snapshot()
    fused = compile_plan(snap, fuse=True, reuse=False)
    (node,) = fused.kernel_nodes
    assert set(node.source.members) == {a.id, b.id, e.id, after.id}
    assert [d.code for d in fused.diagnostics] == ["expression-declaration"]  # spare: declared, not used
    plain = compile_plan(snap, fuse=False, reuse=False)
    out = (after.id, "Out")
    got = run_plan(fused, snap, externals)[fused.outputs[out]]
    np.testing.assert_array_equal(got, run_plan(plain, snap, externals)[plain.outputs[out]])
    x = externals[(a.id, "In")]
    np.testing.assert_allclose(got, (x * 1.5 * 0.75 + 1) + 0.5, rtol=1e-6)
