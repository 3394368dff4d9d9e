"""Bad live edits of a running Expression, other than syntax errors: an unknown function, an
``int``-only operator on floats, a name taken by a port, an undeclared name. Each goes to the Code
tier (no new ports, no rebuild), fails on the engine's real ``KernelTracker`` as an error on the
block with its column, and the previous kernel stays the one that runs; the next plan still gives
the block its node with the same arguments. The builder is a stand-in whose compiles the test
finishes (compiling for real: PTX generation is CPU work); the driver side runs on the GPU
(tests/gpu/test_expression_gpu.py)."""

from __future__ import annotations

import pytest

from cudapatch import Expression
from cudapatch.blocks.library import Fill
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.kernels import KernelTracker
from cudapatch.expr import ExpressionError, ProgramSource
from cudapatch.kernels.builder import CompiledKernel

from .test_expression_upgrade import HeldBuilder

# (edit of "x * Gain", its column, words of the error)
BAD_EDITS = [
    ("x * sinn(Gain)", 5, "unknown function 'sinn'"),
    ("x * Gain + x % 2", 12, "'%' takes integers, and this is a float"),
    ("x * Gain + Out", 12, "the name 'Out' is taken by the output port"),
    ("Count * x", 1, "the name 'Count' is taken by the Count parameter"),
    ("x * Gainn", 5, "unknown name 'Gainn', did you mean 'Gain'?"),  # Scalars="Gain" declares the scalars
]


@pytest.fixture(autouse=True)
def _upgrade_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimised build is asked for when the quick one lands (in the engine, once edits settle)."""
    from cudapatch.engine import kernels as kernels_module

    monkeypatch.setattr(kernels_module, "UPGRADE_AFTER_S", 0)


def _finish_expression(b: HeldBuilder) -> CompiledKernel:
    """Finish the newest request for the Expression's kernel (the Fill's compile is left pending)."""
    i = max(i for i, (source, _) in enumerate(b.requests) if isinstance(source, ProgramSource))
    return b.finish(i)


def _running() -> tuple[Context, Expression, HeldBuilder, KernelTracker, CompiledKernel, list[tuple[int, int]]]:
    """``src (Fill) → e = x * Gain`` (names declared) with its optimised build running in the tracker."""
    swaps: list[tuple[int, int]] = []
    ctx = Context(code_listener=lambda key: swaps.append(key) or True)
    src = ctx.register_block(Fill(name="src", Count=100))
    e = ctx.register_block(Expression(name="e", Code="x * Gain", Inputs="x", Scalars="Gain", Gain=2.0))
    ctx.connect(src, "Out", e, "x")
    ctx.dirty.structure = False
    b = HeldBuilder()
    t = KernelTracker(b, watch_files=False)  # type: ignore[arg-type]
    t.resolve(ctx.snapshot())
    t.flush()
    _finish_expression(b)  # the quick build
    assert [o.action for o in t.collect()] == ["rebuild"]
    better = _finish_expression(b)  # its optimised build, asked for when it landed
    assert [o.action for o in t.collect()] == ["upgrade"]
    return ctx, e, b, t, better, swaps


def _expression_args(ctx: Context, e: Expression) -> list[tuple]:
    plan = compile_plan(ctx.snapshot(), fuse=False)
    assert e.id in plan.block_order and not [d for d in plan.diagnostics if d.block_id == e.id]
    return [tuple((a.kind, a.value) for a in n.args) for n in plan.kernel_nodes if n.block_id == e.id]


@pytest.mark.parametrize(("code", "column", "words"), BAD_EDITS)
def test_a_bad_live_edit_is_an_error_on_the_block_at_its_column_and_the_previous_kernel_runs_on(
    code: str, column: int, words: str
) -> None:
    ctx, e, b, t, better, swaps = _running()
    key = (e.id, 0)
    args = _expression_args(ctx, e)
    assert len(args) == 1
    e.set("Code", code)
    assert swaps == [key] and not ctx.dirty.structure  # the Code tier: the same ports, no rebuild
    assert [p.name for p in e.inputs] == ["x"] and "Gainn" not in e.params and e.get("Code") == code
    source = e.description.kernels[0].source
    assert isinstance(source, ProgramSource) and source.program is None
    t.source_changed(key, source, e.name)
    t.flush()
    asked, fut = b.requests[-1]
    assert asked is source
    with pytest.raises(ExpressionError) as info:  # what the builder's compile raises
        asked.compile("sm_90")
    assert (info.value.block, info.value.param, info.value.column) == ("e", "Code", column)
    fut.set_exception(info.value)
    assert [o.action for o in t.collect()] == ["rebuild"]  # so the build puts the error on the block
    (diag,) = t.diagnostics()
    assert (diag.severity, diag.block_id, diag.code) == ("error", e.id, "kernel-compile")
    assert words in diag.message and f"(column {column})" in diag.message, diag.message
    assert "block 'e'" in diag.message and "(the previous version keeps running)" in diag.message
    functions, _ = t.resolve(ctx.snapshot())
    assert functions[key] is better.function and t.running(key) is better  # the previous kernel runs on
    assert _expression_args(ctx, e) == args  # and the next plan gives its node the same arguments

    e.set("Code", "x * Gain + 1")  # fixed: the Code tier again, and the error goes
    t.source_changed(key, e.description.kernels[0].source, e.name)
    t.flush()
    fixed = _finish_expression(b)
    assert [o.action for o in t.collect()] == ["swap"] and not t.diagnostics()
    functions, _ = t.resolve(ctx.snapshot())
    assert functions[key] is fixed.function and "x * Gain + 1" in fixed.source.program.summary()


def test_without_declarations_a_new_name_in_a_live_edit_is_a_new_port_not_an_error() -> None:
    swaps: list[tuple[int, int]] = []
    ctx = Context(code_listener=lambda key: swaps.append(key) or True)
    src = ctx.register_block(Fill(name="src", Count=100))
    e = ctx.register_block(Expression(name="e", Code="x * Gain"))
    ctx.connect(src, "Out", e, "x")
    ctx.dirty.structure = False
    e.set("Code", "x * Gainn")  # the case rule: a new Hot scalar, re-described and rebuilt
    assert swaps == [] and ctx.dirty.structure and "Gainn" in e.params
    assert e.source.program is not None and e.source.program.scalars == ("Gainn",)
