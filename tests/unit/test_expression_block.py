"""The Expression block without a GPU: ports from names, sizes, edits that go to the Code tier,
edits that re-describe, and bad input that keeps the running kernel."""

from __future__ import annotations

import pytest

from cudapatch import Expression
from cudapatch.blocks.library import BUILTIN_BLOCKS, Fill
from cudapatch.engine import Context, compile_plan
from cudapatch.errors import ParameterError
from cudapatch.expr import ExpressionError, ProgramSource
from cudapatch.kernels.types import DType


def test_names_make_ports_and_hot_scalars() -> None:
    e = Expression(Code="a * sin(x * Freq) + b", Freq=2.5)
    assert [p.name for p in e.inputs] == ["a", "x", "b"]
    assert [p.name for p in e.outputs] == ["Out"] and e.outputs[0].dtype is DType.FLOAT32
    assert e.get("Freq") == 2.5 and e.description.param("Freq").kind == "scalar"  # type: ignore[union-attr]
    assert not e.description.param("Freq").structural  # type: ignore[union-attr]
    assert Expression in BUILTIN_BLOCKS


def test_no_input_means_a_count_parameter() -> None:
    e = Expression(Code="sin(index * Step)", Count=64)
    assert e.inputs == () and e.get("Count") == 64
    assert e.description.param("Count").structural  # type: ignore[union-attr]


def test_generated_code_and_tooltip_show_the_kernel() -> None:
    e = Expression(name="wave", Code="x * Gain + 1")
    assert ".entry expression(" in e.generated_code and "wave: x * Gain + 1" in e.generated_code
    lines = len(e.generated_code.splitlines())
    assert "Out = x * Gain + 1" in e.tooltip() and f"generated PTX: {lines} lines" in e.tooltip()
    ref = Expression(Code="x * Gain + 1", Compiler="nvrtc")
    assert 'extern "C" __global__ void expression(' in ref.generated_code
    assert f"generated NVRTC: {len(ref.generated_code.splitlines())} lines" in ref.tooltip()
    e.set("Code", "a * sin(x * Freq) + b")  # an edit: the count follows the new code
    assert f"generated PTX: {len(e.generated_code.splitlines())} lines" in e.tooltip()
    assert len(e.generated_code.splitlines()) != lines


@pytest.mark.parametrize(
    ("code", "column", "words"),
    [
        ("x * (Gain +", 12, "ends too early"),
        ("x * sinn(Gain)", 5, "unknown function"),
        ("x % 2", 1, "takes integers"),
        ("x + Out", 5, "output port"),
        ("Code * x", 1, "Code parameter"),
    ],
)
def test_bad_code_at_construction_raises_with_the_column(code: str, column: int, words: str) -> None:
    with pytest.raises(ExpressionError) as info:
        Expression(name="e", Code=code)
    assert info.value.column == column and words in info.value.message
    assert info.value.block == "e" and info.value.param == "Code"


def test_bad_compiler_is_refused() -> None:
    with pytest.raises(ParameterError, match="parameter 'Compiler': 'clang' is not one of its choices: ptx, nvrtc"):
        Expression(Compiler="clang")
    e = Expression(Compiler="NVRTC")  # the choice's name, in any case
    assert e.params["Compiler"].value == "nvrtc"
    with pytest.raises(ParameterError, match="is not one of its choices: ptx, nvrtc"):
        e.set("Compiler", "clang")
    assert e.params["Compiler"].value == "nvrtc" and e.description.param("Compiler").choices == ("ptx", "nvrtc")


def _registered(code: str) -> tuple[Context, Expression, list[tuple[int, int]]]:
    swaps: list[tuple[int, int]] = []

    def listener(key: tuple[int, int]) -> bool:
        swaps.append(key)
        return True

    ctx = Context(code_listener=listener)
    src = ctx.register_block(Fill(name="src", Count=100))
    e = ctx.register_block(Expression(name="e", Code=code))
    ctx.connect(src, "Out", e, "x")
    ctx.dirty.structure = False
    return ctx, e, swaps  # type: ignore[return-value]


def test_an_edit_with_the_same_names_goes_to_the_code_tier() -> None:
    ctx, e, swaps = _registered("x * Gain")
    before = e.description
    e.set("Code", "x * Gain + 0.5")
    assert swaps == [(e.id, 0)] and not ctx.dirty.structure
    src = e.description.kernels[0].source
    assert isinstance(src, ProgramSource) and src.program is not None
    assert "x * Gain + 0.5" in src.program.summary()
    assert e.description.inputs == before.inputs and e.get("Code") == "x * Gain + 0.5"


def test_an_edit_with_new_names_re_describes_and_rebuilds() -> None:
    ctx, e, swaps = _registered("x * Gain")
    e.set("Code", "x * Gain + y * Bias")
    assert swaps == [] and ctx.dirty.structure
    assert [p.name for p in e.inputs] == ["x", "y"] and "Bias" in e.params


def test_a_bad_live_edit_becomes_a_compile_error_and_the_old_kernel_stays_described() -> None:
    ctx, e, swaps = _registered("x * Gain")
    good = e.description.kernels[0].descriptor
    e.set("Code", "x * (Gain +")  # a keystroke in the middle of typing
    assert swaps == [(e.id, 0)] and not ctx.dirty.structure  # to the builder, which fails it
    src = e.description.kernels[0].source
    assert isinstance(src, ProgramSource) and src.program is None
    assert src.describe() == good
    with pytest.raises(ExpressionError) as info:
        src.compile("sm_90")
    assert info.value.column == 12 and info.value.block == "e"
    assert "ends too early" in str(info.value)
    e.set("Code", "x * (Gain + 1)")  # fixed: a good kernel goes in by the Code tier again
    assert swaps[-1] == (e.id, 0) and e.description.kernels[0].source.program is not None  # type: ignore[union-attr]


def test_the_plan_sizes_the_output_like_the_first_input_and_fills_the_counts() -> None:
    ctx = Context()
    src = ctx.register_block(Fill(name="src", Count=100))
    one = ctx.register_block(Fill(name="one", Count=1))
    e = ctx.register_block(Expression(name="e", Code="x * c + Gain"))
    ctx.connect(src, "Out", e, "x")
    ctx.connect(one, "Out", e, "c")
    plan = compile_plan(ctx.snapshot())
    (node,) = [n for n in plan.kernel_nodes if n.block_id == e.id]
    assert node.grid * node.block >= 100
    (out,) = [v for v in plan.buffers if v.block_id == e.id]
    assert out.count == 100
    program = e.source.program
    assert program is not None
    x_count, c_count = node.args[program.input_param(0) + 1], node.args[program.input_param(1) + 1]
    assert (x_count.kind, x_count.value) == ("const", 100) and (c_count.kind, c_count.value) == ("const", 1)
    assert node.args[program.count_param].value == 100
    assert node.args[program.scalar_param(0)].kind == "scalar"


def test_inputs_of_other_lengths_are_an_error_with_the_column() -> None:
    ctx = Context()
    src = ctx.register_block(Fill(name="src", Count=100))
    odd = ctx.register_block(Fill(name="odd", Count=10))
    e = ctx.register_block(Expression(name="e", Code="x * 2 + sin(b)"))
    after = ctx.register_block(Expression(name="after", Code="v + 1"))
    ctx.connect(src, "Out", e, "x")
    ctx.connect(odd, "Out", e, "b")
    ctx.connect(e, "Out", after, "v")
    plan = compile_plan(ctx.snapshot())
    assert e.id in plan.skipped and after.id in plan.skipped  # and what reads it
    (diag,) = [d for d in plan.diagnostics if d.block_id == e.id]
    assert diag.severity == "error" and diag.code == "input-size"
    assert "input 'b' has 10 elements but 'x'" in diag.message and "(column 13)" in diag.message
    ctx.disconnect(odd, "Out", e, "b")
    one = ctx.register_block(Fill(name="one", Count=1))
    ctx.connect(one, "Out", e, "b")  # one element: broadcast
    plan = compile_plan(ctx.snapshot())
    assert e.id in plan.block_order and after.id in plan.block_order


def test_descriptions_survive_a_pickle_as_an_isolated_engine_sends_them() -> None:
    import pickle

    from cudapatch import Scale
    from cudapatch.engine.compiler.fusion import FusedSource

    e = Expression(name="e", Code="a * sin(x * Freq) + where(index % 2 == 0, b, -b)")
    again = pickle.loads(pickle.dumps(e.description))
    assert again == e.description
    src = again.kernels[0].source
    assert src.code() == e.generated_code and src.describe() == e.source.describe()
    ctx = Context()
    ctx.register_block(e)
    s = ctx.register_block(Scale(name="s"))
    for port in ("a", "x", "b"):
        ctx.connect(ctx.register_block(Fill(name=f"f{port}", Count=16)), "Out", e, port)
    ctx.connect(e, "Out", s, "In")
    fused = [
        n.source for n in compile_plan(ctx.snapshot(), fuse=True).kernel_nodes if isinstance(n.source, FusedSource)
    ]
    (one,) = fused
    assert pickle.loads(pickle.dumps(one)).code() == one.code()


# -- declared names (Inputs, Scalars) ----------------------------------------------------------------


def test_declared_names_override_the_case_rule_and_come_first() -> None:
    e = Expression(Code="a * X + gain * Bias", Inputs="X, b, a", Scalars="gain, Bias", gain=2.0)
    assert [p.name for p in e.inputs] == ["X", "b", "a"]  # in the order declared, not of first use
    assert e.description.param("gain").kind == "scalar" and e.get("gain") == 2.0  # type: ignore[union-attr]
    assert e.description.param("Bias").kind == "scalar"  # type: ignore[union-attr]
    program = e.source.program
    assert program is not None and program.inputs == ("X", "b", "a") and program.scalars == ("gain", "Bias")
    assert program.stages[0].expr.unused == ("b",)
    plain = Expression(Code="a * X + gain * Bias")  # undeclared: every name by its case, as always
    assert [p.name for p in plain.inputs] == ["a", "gain"] and plain.get("Inputs") == plain.get("Scalars") == ""


def test_a_kind_with_nothing_declared_keeps_the_case_rule() -> None:
    vec = Expression(Code="c * mask + Lift", Inputs="c: float4, mask")  # the scalars go by case
    assert [p.name for p in vec.inputs] == ["c", "mask"] and vec.description.param("Lift").kind == "scalar"  # type: ignore[union-attr]
    e = Expression(Code="y * gain + x", Scalars="gain")  # the inputs go by case, in order of first use
    assert [p.name for p in e.inputs] == ["y", "x"] and e.source.program.scalars == ("gain",)  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("code", "inputs", "scalars", "column", "words"),
    [
        ("x * Freqq + y", "x", "Freq", 5, "unknown name 'Freqq', did you mean 'Freq'? (known: Freq, "),
        ("x * Freq + yy", "x, y", "Freq", 12, "unknown name 'yy', did you mean 'y'? (known: y, "),
        ("x * Freq + y", "x", "Freq", 12, "unknown name 'y' (known: Freq, count, index, pi, x; inputs are declared"),
        ("x * gain * Gain", "", "gain", 12, "unknown name 'Gain', did you mean 'gain'? (known: gain, "),
        ("c * Lift + d", "c: float4", "", 12, "unknown name 'd' (known: Lift, c, count, index, pi; inputs"),
    ],
)
def test_declaring_a_kind_makes_an_undeclared_name_of_it_an_error_listing_the_known_ones(
    code: str, inputs: str, scalars: str, column: int, words: str
) -> None:
    with pytest.raises(ExpressionError) as info:
        Expression(name="e", Code=code, Inputs=inputs, Scalars=scalars)
    assert info.value.column == column and words in info.value.message, info.value.message
    assert (info.value.block, info.value.param) == ("e", "Code")


def test_a_declared_input_sets_the_length_and_an_unused_one_keeps_its_port_with_a_warning() -> None:
    ctx = Context()
    short = ctx.register_block(Fill(name="short", Count=1))
    long = ctx.register_block(Fill(name="long", Count=100))
    odd = ctx.register_block(Fill(name="odd", Count=7))
    e = ctx.register_block(Expression(name="e", Code="c * x + index", Inputs="x, spare, c", Scalars="Unused"))
    ctx.connect(short, "Out", e, "c")
    ctx.connect(long, "Out", e, "x")  # declared first: x sets the length, c (one element) is broadcast
    ctx.connect(odd, "Out", e, "spare")  # nothing reads it: its length is no error
    plan = compile_plan(ctx.snapshot(), fuse=False)
    assert e.id in plan.block_order
    (out,) = [v for v in plan.buffers if v.block_id == e.id]
    assert out.count == 100
    (warn,) = [d for d in plan.diagnostics if d.block_id == e.id]
    assert (warn.severity, warn.code) == ("warning", "expression-declaration")
    assert warn.message == (
        "block 'e': the expression does not use its declared input 'spare', scalar 'Unused' "
        "(kept, and nothing reads them)"
    )
    ctx.disconnect(odd, "Out", e, "spare")  # still a port, and required as every input
    plan = compile_plan(ctx.snapshot(), fuse=False)
    assert e.id in plan.skipped


@pytest.mark.parametrize(
    ("inputs", "scalars", "param", "words"),
    [
        ("x, gain", "gain", "Scalars", "'gain' is declared both an input and a scalar"),
        ("x y", "", "Inputs", "'x y' is not a name"),
        ("sin", "", "Inputs", "'sin' is a function: it cannot be declared an input"),
        ("", "index", "Scalars", "'index' is a built-in name: it cannot be declared a scalar"),
        ("Out", "", "Inputs", "the name 'Out' is taken by the output port"),
        ("", "Inputs", "Scalars", "the name 'Inputs' is taken by the Inputs parameter"),
    ],
)
def test_bad_declarations_are_errors_naming_the_parameter(inputs: str, scalars: str, param: str, words: str) -> None:
    with pytest.raises(ExpressionError) as info:
        Expression(name="e", Code="x * 2", Inputs=inputs, Scalars=scalars)
    assert words in info.value.message and info.value.block == "e" and info.value.param == param


def test_an_edit_that_stops_using_a_declared_input_keeps_the_port_and_its_link() -> None:
    swaps: list[tuple[int, int]] = []
    ctx = Context(code_listener=lambda key: swaps.append(key) or True)
    src = ctx.register_block(Fill(name="src", Count=100))
    e = ctx.register_block(Expression(name="e", Code="x * Gain + y", Inputs="x, y"))
    ctx.connect(src, "Out", e, "x")
    ctx.connect(src, "Out", e, "y")
    ctx.dirty.structure = False
    e.set("Code", "x * Gain + y * 2")  # the same names used: the Code tier
    assert swaps == [(e.id, 0)] and not ctx.dirty.structure
    e.set("Code", "x * Gain")  # y no longer used: declared, so the port and its link stay ...
    assert [p.name for p in e.inputs] == ["x", "y"] and e.source.program.stages[0].expr.unused == ("y",)  # type: ignore[union-attr]
    assert "y" in {lk.dst_port for lk in ctx.snapshot().links if lk.dst == e.id}
    assert swaps == [(e.id, 0)] and ctx.dirty.structure  # ... and a rebuild gives the warning on y
    plan = compile_plan(ctx.snapshot())
    assert [d.code for d in plan.diagnostics if d.block_id == e.id] == ["expression-declaration"]
    ctx.dirty.structure = False
    e.set("Code", "x * Gain * 2")  # still not using y: the Code tier again
    assert swaps == [(e.id, 0), (e.id, 0)] and not ctx.dirty.structure
    e.set("Inputs", "x")  # a declaration edit re-describes: y's port goes
    assert ctx.dirty.structure and [p.name for p in e.inputs] == ["x"]


def test_declarations_survive_a_pickle() -> None:
    import pickle

    e = Expression(name="e", Code="X * gain", Inputs="X, spare", Scalars="gain, Extra")
    again = pickle.loads(pickle.dumps(e.description))
    assert again == e.description
    src = again.kernels[0].source
    assert src.code() == e.generated_code and src.describe() == e.source.describe()
    assert src.warning == e.source.warning and "input 'spare', scalar 'Extra'" in src.warning


def test_a_patch_file_declares_names_as_parameters(tmp_path) -> None:
    from cudapatch.host_plugin.plan_view import plan_patch

    path = tmp_path / "p.toml"
    path.write_text(
        'links = ["src.Out -> wave.X", "wave.Out -> gain.In"]\n'
        '[operators.src]\ntype = "core.Fill"\nCount = 64\n'
        '[operators.wave]\ntype = "core.Expression"\nCode = "X * amp"\nInputs = "X"\nScalars = "amp"\namp = 3.0\n'
        '[operators.gain]\ntype = "core.Scale"\n'
    )
    engine, plan = plan_patch(path)
    assert plan is not None and not plan.diagnostics
    (fused,) = [n for n in plan.kernel_nodes if getattr(n.source, "members", ())]
    assert "wave: X * amp" in fused.source.program.summary()
    wave = next(b for b in engine.context.snapshot().blocks if b.name == "wave")
    assert [p.name for p in wave.description.inputs] == ["X"] and wave.values["amp"] == 3.0
    ((ni, ai),) = plan.scalar_slots[(wave.id, "amp")]  # a Hot scalar of the fused node
    assert plan.kernel_nodes[ni] is fused and fused.args[ai].value == 3.0


def test_a_bad_declaration_in_a_patch_file_names_its_line(tmp_path) -> None:
    from cudapatch.errors import PatchFileError
    from cudapatch.host_plugin.plan_view import plan_patch

    path = tmp_path / "bad.toml"
    path.write_text('[operators.wave]\ntype = "core.Expression"\nCode = "x * g"\nInputs = "x, g"\nScalars = "g"\n')
    with pytest.raises(PatchFileError) as info:
        plan_patch(path)
    assert "'g' is declared both an input and a scalar" in str(info.value) and "bad.toml:" in str(info.value)
