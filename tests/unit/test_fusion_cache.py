"""The fusion phase's program cache (``fusion._PROGRAMS``): a group planned again takes its program
from the last plan when its members' expressions, names and bindings are the same; what the key
leaves out (Hot values, buffers) still reaches the node; and a plan is the same with the cache as
without it, over random patches."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from cudapatch import Expression, Scale
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.compiler.fusion import FusedSource

from .plan_interp import run_plan
from .test_fusion import _bind, _chain, _random_patch

_fusion = importlib.import_module("cudapatch.engine.compiler.fusion")  # the package's ``fusion`` is the phase


def _fused(plan) -> list:
    return [n for n in plan.kernel_nodes if isinstance(n.source, FusedSource)]


def _cold(snap):
    """``compile_plan`` of ``snap`` with the cache empty (restored after)."""
    saved = dict(_fusion._PROGRAMS)
    _fusion._PROGRAMS.clear()
    try:
        return compile_plan(snap)
    finally:
        _fusion._PROGRAMS.clear()
        _fusion._PROGRAMS.update(saved)


def test_a_group_planned_again_reuses_its_program_and_a_hot_value_reaches_the_node() -> None:
    ctx, blocks, _ = _chain(6)
    (first,) = _fused(compile_plan(ctx.snapshot()))
    blocks[2].set("Factor", 42.0)  # a Hot value: an argument, not part of the kernel
    (again,) = _fused(compile_plan(ctx.snapshot()))
    assert again.source.program is first.source.program and again.source is first.source
    assert again.source.key == first.source.key
    (ai,) = [i for i, a in enumerate(again.args) if a.ref == (blocks[2].id, "Factor")]
    assert again.args[ai].value == 42.0 and first.args[ai].value != 42.0


def test_a_members_code_edit_or_rename_changes_the_groups_kernel() -> None:
    ctx, externals = Context(), {}
    a = ctx.register_block(Expression(name="a", Code="x * 2.0"))
    b = ctx.register_block(Expression(name="b", Code="x + 1.0"))
    _bind(ctx, a, "x", np.ones(8, np.float32), externals)
    ctx.connect(a, "Out", b, "x")
    (first,) = _fused(compile_plan(ctx.snapshot()))
    a.set("Code", "x * 3.0")  # a Code edit of one member: another expression, another kernel
    (edited,) = _fused(compile_plan(ctx.snapshot()))
    assert edited.source.key != first.source.key and edited.source.program is not first.source.program
    assert "x * 3.0" in edited.source.program.summary()
    assert edited.source.key == _fused(_cold(ctx.snapshot()))[0].source.key
    a.set("Code", "x * 2.0")  # back: the first kernel again (an equal expression, an equal key)
    (back,) = _fused(compile_plan(ctx.snapshot()))
    assert back.source.key == first.source.key
    a.name = "renamed"  # names are the kernel's parameter names: another program
    (renamed,) = _fused(compile_plan(ctx.snapshot()))
    assert renamed.source.key != first.source.key and renamed.source.program.inputs == ("renamed_x",)


def test_the_same_kernel_of_other_blocks_gets_their_ids() -> None:
    ctx, blocks, _ = _chain(4)
    (first,) = _fused(compile_plan(ctx.snapshot()))
    ctx.unregister_block(blocks[-1])
    last = ctx.register_block(Scale(name="s3", Factor=1.3, Offset=0.5))  # same name, another block
    ctx.connect(blocks[-2], "Out", last, "In")
    (again,) = _fused(compile_plan(ctx.snapshot()))
    assert again.source.key == first.source.key and again.source.program is first.source.program
    assert again.source.members == (*(b.id for b in blocks[:-1]), last.id) != first.source.members
    assert again.block_id == last.id


def test_the_cache_keeps_a_bounded_number_of_programs() -> None:
    for i in range(_fusion._PROGRAMS_MAX + 10):
        ctx, blocks, _ = _chain(2)
        blocks[0].name = f"n{i}"
        compile_plan(ctx.snapshot())
    assert len(_fusion._PROGRAMS) <= _fusion._PROGRAMS_MAX


@pytest.mark.parametrize("seed", range(40))
def test_plans_with_the_cache_are_those_without_it_and_compute_the_same(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    ctx, externals, blocks = _random_patch(rng, 64)
    compile_plan(ctx.snapshot())  # fills the cache
    for _ in range(3):  # edits: a Hot value, a removed block, a rename; planned warm and cold
        b = blocks[int(rng.integers(len(blocks)))]
        what = rng.integers(3)
        scalars = [p.name for p in b.description.params if p.kind == "scalar"]
        if what == 0 and scalars:
            b.set(scalars[0], float(rng.normal()))
        elif what == 1 and len(ctx.registry) > 2:
            ctx.unregister_block(b)
            blocks.remove(b)
            externals = {k: v for k, v in externals.items() if k[0] != b.id}
        else:
            b.name = f"{b.name}_r"
        snap = ctx.snapshot()
        try:
            warm = compile_plan(snap)
        except Exception as exc:  # a removed block left an input unlinked: both plans must say so
            with pytest.raises(type(exc)):
                _cold(snap)
            return
        cold = _cold(snap)
        assert [(n.source.key, n.source.members, n.args, n.grid) for n in _fused(warm)] == [
            (n.source.key, n.source.members, n.args, n.grid) for n in _fused(cold)
        ]
        descriptors = [n.source.program.descriptor for n in _fused(warm)]
        assert descriptors == [n.source.program.descriptor for n in _fused(cold)]
        got_warm, got_cold = run_plan(warm, snap, externals), run_plan(cold, snap, externals)
        for port, bi in warm.outputs.items():
            np.testing.assert_array_equal(got_warm[bi], got_cold[cold.outputs[port]], err_msg=str(port))
