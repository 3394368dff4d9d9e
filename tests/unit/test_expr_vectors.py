"""Vector inputs of expressions without a GPU: declarations and their type rules, the generated PTX
(assembled by ``ptxas``) and CUDA C++ (compiled by NVRTC) of float2/float3/float4 programs, the
NumPy interpreter lane by lane, the Expression block's ports and errors, and plans of vector
Expression blocks (run by the tests' plan interpreter), which stay unfused."""

from __future__ import annotations

import pickle
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cudapatch import Expression, Scale
from cudapatch.engine import Context, compile_plan
from cudapatch.engine.compiler.fusion import FusedSource, elementwise_member
from cudapatch.engine.context import ExternalBinding
from cudapatch.expr import ExpressionError, ProgramSource, compile_expression, evaluate, generate_cuda, generate_ptx
from cudapatch.expr.bytecode import INTERPRETERS, assemble, interpreter_cuda, patch_program
from cudapatch.expr.program import Program, single
from cudapatch.expr.vectors import parse_declarations
from cudapatch.kernels.ptx import check_signature, parse_ptx
from cudapatch.kernels.types import DType

from .plan_interp import run_plan
from .test_expr_bytecode import run

VEC = {2: DType.FLOAT2, 3: DType.FLOAT3, 4: DType.FLOAT4}
CODE = "c * mask + sin(index * Freq) * d - where(mask > 0.5, 1.0, Bias)"


def _program(lanes: int, code: str = CODE) -> Program:
    e = compile_expression(code, declared={"c": "input", "mask": "input"}, lanes={"c": lanes, "d": lanes})
    return single(e)


# -- declarations and type rules --------------------------------------------------------------------


def test_declarations_give_lanes_and_columns() -> None:
    assert parse_declarations("c: float4, mask") == [("c", 4, 1), ("mask", 1, 12)]
    assert parse_declarations(" a , b:float3,, c: float") == [("a", 1, 2), ("b", 3, 6), ("c", 1, 17)]
    assert parse_declarations("") == []


@pytest.mark.parametrize(
    ("text", "column", "words"),
    [
        ("c: float4, d: float2", 12, "input 'd' is float2 but 'c' is float4: every vector input"),
        ("c: uchar4", 4, "input 'c' cannot be uchar4: expressions compute in float"),
        ("c: half", 4, "input 'c' cannot be half"),
        ("c: floaty", 4, "unknown type 'floaty' for input 'c' (known: float, float2, float3, float4)"),
        ("c:", 3, "a type is missing"),
    ],
)
def test_bad_declarations_name_the_column(text: str, column: int, words: str) -> None:
    with pytest.raises(ExpressionError) as info:
        parse_declarations(text)
    assert info.value.column == column and words in info.value.message


def test_hot_scalars_are_floats() -> None:
    assert parse_declarations("Gain: float", what="scalar", vectors=False) == [("Gain", 1, 1)]
    with pytest.raises(ExpressionError, match="scalar 'Tint' cannot be float4: Hot scalars are floats"):
        parse_declarations("Tint: float4", what="scalar", vectors=False)


def test_the_checker_refuses_mixed_lanes_at_the_first_use_and_vectors_that_are_no_inputs() -> None:
    with pytest.raises(ExpressionError) as info:
        compile_expression("a + b * 2", lanes={"a": 4, "b": 2})
    assert info.value.column == 5 and "input 'b' has 2 lanes but 'a' has 4" in info.value.message
    with pytest.raises(ExpressionError, match="'G' is declared a vector, but it is no input"):
        compile_expression("a * G", lanes={"G": 4})
    with pytest.raises(ExpressionError, match="vector inputs have 2, 3 or 4"):
        compile_expression("a", lanes={"a": 5})
    e = compile_expression("a * m", lanes={"a": 3})
    assert e.lanes == {"a": 3} and e.out_lanes == 3 and compile_expression("a * m").out_lanes == 1
    again = pickle.loads(pickle.dumps(e))
    assert again.lanes == {"a": 3} and again.inputs == e.inputs


# -- programs and generated code ------------------------------------------------------------------------


@pytest.mark.parametrize("lanes", [2, 3, 4])
def test_a_vector_program_types_its_pointers_and_keys_apart(lanes: int) -> None:
    p = _program(lanes)
    assert p.inputs == ("c", "mask", "d") and p.input_lanes == (lanes, 1, lanes) and p.lanes == lanes
    types = [(q.name, q.dtype) for q in p.descriptor.parameters if q.is_pointer]
    assert types == [("c", VEC[lanes]), ("mask", DType.FLOAT32), ("d", VEC[lanes]), ("Out", VEC[lanes])]
    flat = single(compile_expression(CODE, declared={"c": "input", "mask": "input"}))
    assert flat.key != p.key and flat.descriptor != p.descriptor
    # a float program's key is what it always was: lanes of 1 add nothing to it
    ones = Program(flat.inputs, flat.scalars, flat.outputs, flat.stages, (1, 1, 1))
    assert ones.key == flat.key and ones.descriptor == flat.descriptor


def _ptxas() -> str | None:
    return shutil.which("ptxas")


@pytest.mark.parametrize("lanes", [2, 3, 4])
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_vector_ptx_assembles_and_matches_its_descriptor(lanes: int, arch: str, tmp_path: Path) -> None:
    program = _program(lanes)
    ptx = generate_ptx(program, arch)
    check_signature(parse_ptx(ptx), program.descriptor)
    body = ptx[ptx.index("{") :]
    if lanes in (2, 4):  # one vector load per vector input, one vector store
        assert body.count(f"ld.global.v{lanes}.f32") == 2 and body.count(f"st.global.v{lanes}.f32") == 1
    else:  # float3 is aligned to 4 bytes only: three loads and three stores each
        assert "v3" not in body and body.count("st.global.f32") == 3
    assert body.count("sin.approx.f32") == lanes and f"lane by lane over float{lanes}" in ptx
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) is not installed")
    path = tmp_path / "e.ptx"
    path.write_text(ptx)
    done = subprocess.run([ptxas, f"-arch={arch}", str(path), "-o", str(tmp_path / "e.cubin")], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.parametrize("lanes", [2, 3, 4])
def test_the_interpreter_runs_a_vector_program_lane_by_lane(lanes: int) -> None:
    """The bytecode of a vector program is its float program's; the interpreter kernel runs it once per
    lane (a vector input gives its lane, a float input its one value): emulated here as that kernel's
    C does, against the NumPy interpreter bit for bit (no approximations in the code)."""
    code_text = "c * mask + d * Gain - where(mask > 0.5, 1.0, Bias) + float(index % 3) + fma(c, mask, d)"
    program = _program(lanes, code_text)
    code = assemble(program)
    assert code is not None
    rng = np.random.default_rng(3)
    n = 50
    c = rng.standard_normal((n, lanes)).astype(np.float32)
    mask = rng.random(n).astype(np.float32)
    d = rng.standard_normal((1, lanes)).astype(np.float32)
    scalars = [0.75, -2.0]
    got = np.stack([run(code.words, [c[:, k].copy(), mask, d[:, k].copy()], scalars, n) for k in range(lanes)], axis=1)
    np.testing.assert_array_equal(got, evaluate(program, [c, mask, d], scalars)["Out"])
    cuda = interpreter_cuda(3, 2, program.input_lanes)
    assert f"const float{lanes}* in0" in cuda and "const float* in1" in cuda and f"make_float{lanes}(res[0]" in cuda
    assert interpreter_cuda(3, 2) == interpreter_cuda(3, 2, (1, 1, 1))  # float programs: the kernel as it was


def test_a_vector_edit_runs_on_its_interpreter_or_else_on_ptx_jitted_quickly(monkeypatch) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    program = _program(4)
    found = INTERPRETERS.get(3, 2, "sm_90", wait=True, lanes=program.input_lanes)
    if found is None:
        pytest.skip("NVRTC could not compile here")
    assert INTERPRETERS.get(3, 2, "sm_90", wait=True) != found  # float programs have their own interpreter
    image = ProgramSource.of(program, jit="quick").compile("sm_90")
    assert image.kind == "cubin" and image.jit_level is None
    assert image.image == patch_program(found[0], assemble(program))  # type: ignore[arg-type]
    monkeypatch.setattr(INTERPRETERS, "get", lambda *a, **k: None)  # still compiling: the PTX, JITted quickly
    image = ProgramSource.of(program, jit="quick").compile("sm_90")
    assert image.kind == "ptx" and image.jit_level == 0
    with pytest.raises(ValueError, match="one element"):
        generate_ptx(program, per_thread=4)


@pytest.mark.parametrize("lanes", [2, 3, 4])
def test_vector_cuda_compiles_with_nvrtc(lanes: int) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    program = _program(lanes)
    code = generate_cuda(program)
    assert f"const float{lanes}* v_c" in code and "const float* v_mask" in code and f"float{lanes}* v_Out" in code
    assert f"v_Out[i] = make_float{lanes}(" in code and "in0.x" in code
    image = ProgramSource.of(program, backend="nvrtc").compile("sm_90")
    assert image.kind == "cubin" and image.image[:4] == b"\x7fELF"


# -- the interpreter -------------------------------------------------------------------------------------


@pytest.mark.parametrize("lanes", [2, 3, 4])
def test_the_interpreter_computes_lane_by_lane_and_broadcasts(lanes: int) -> None:
    rng = np.random.default_rng(21)
    n = 37
    c = rng.standard_normal((n, lanes)).astype(np.float32)
    d = rng.standard_normal((1, lanes)).astype(np.float32)  # one element: every element reads it
    mask = rng.random(n).astype(np.float32)
    program = _program(lanes)
    got = evaluate(program, {"c": c, "mask": mask, "d": d}, {"Freq": 0.5, "Bias": -2.0})["Out"]
    assert got.shape == (n, lanes) and got.dtype == np.float32
    f = np.float32
    idx = np.arange(n, dtype=np.float32)[:, None]
    m = mask[:, None]
    sin = np.sin((idx * f(0.5)).astype(np.float64)).astype(np.float32)
    want = (c * m + sin * d) - np.where(m > 0.5, f(1.0), f(-2.0))
    np.testing.assert_array_equal(got, want)
    flat = evaluate(program, {"c": c.reshape(-1), "mask": mask, "d": d.reshape(-1)}, {"Freq": 0.5, "Bias": -2.0})
    np.testing.assert_array_equal(flat["Out"], got)  # flat vector inputs read the same


# -- the Expression block ----------------------------------------------------------------------------------


def test_a_declared_vector_input_types_the_ports() -> None:
    e = Expression(name="e", Code="c * mask + Gain", Inputs="c: float4, mask")
    assert [(p.name, p.dtype) for p in e.inputs] == [("c", DType.FLOAT4), ("mask", DType.FLOAT32)]
    assert e.outputs[0].dtype is DType.FLOAT4 and e.description.param("Gain").dtype is DType.FLOAT32  # type: ignore[union-attr]
    assert "float4: computed lane by lane" in e.inputs[0].description
    assert "lane by lane over float4" in e.generated_code and "ld.global.v4.f32" in e.generated_code
    assert "Out (float4, lane by lane) = c * mask + Gain  (generated PTX:" in e.tooltip()
    assert elementwise_member(e) is None  # fusion fuses floats: a vector Expression keeps its own node
    assert not e.description.kernels[0].expression
    nvrtc = Expression(Code="c * 2", Inputs="c: float2", Compiler="nvrtc")
    assert "make_float2(" in nvrtc.generated_code and nvrtc.outputs[0].dtype is DType.FLOAT2
    again = pickle.loads(pickle.dumps(e.description))
    assert again == e.description and again.kernels[0].source.code() == e.generated_code


@pytest.mark.parametrize(
    ("inputs", "scalars", "param", "column", "words"),
    [
        ("c: float4, d: float2", "", "Inputs", 12, "input 'd' is float2 but 'c' is float4"),
        ("c: uchar4", "", "Inputs", 4, "input 'c' cannot be uchar4"),
        ("c: vec4", "", "Inputs", 4, "unknown type 'vec4'"),
        ("c: float4", "Tint: float4", "Scalars", 7, "Hot scalars are floats"),
        ("c: float4, sin: float4", "", "Inputs", None, "'sin' is a function"),
    ],
)
def test_bad_vector_declarations_name_the_parameter_and_column(
    inputs: str, scalars: str, param: str, column: int | None, words: str
) -> None:
    with pytest.raises(ExpressionError) as info:
        Expression(name="e", Code="c * 2", Inputs=inputs, Scalars=scalars)
    assert words in info.value.message and info.value.block == "e" and info.value.param == param
    assert info.value.column == column


def test_a_code_edit_of_a_vector_expression_goes_to_the_code_tier() -> None:
    swaps: list[tuple[int, int]] = []
    ctx = Context(code_listener=lambda key: swaps.append(key) or True)
    e = ctx.register_block(Expression(name="e", Code="c * Gain", Inputs="c: float4"))
    ctx.dirty.structure = False
    before = e.description.kernels[0].descriptor
    e.set("Code", "c * Gain + 1")
    assert swaps == [(e.id, 0)] and not ctx.dirty.structure
    src = e.description.kernels[0].source
    assert src.describe() == before and src.program.lanes == 4  # type: ignore[union-attr]
    e.set("Code", "c * (Gain +")  # a typo: a compile error on the block, the running kernel stays
    assert swaps[-1] == (e.id, 0) and e.description.kernels[0].source.program is None  # type: ignore[union-attr]
    e.set("Code", "c * Gain")
    ctx.dirty.structure = False
    described = e.description
    with pytest.raises(ExpressionError) as info:  # a live edit mixing lanes: refused, the block as it was
        e.set("Inputs", "c: float4, d: float2")
    assert (info.value.param, info.value.column) == ("Inputs", 12) and "every vector input" in info.value.message
    assert e.get("Inputs") == "c: float4" and e.description is described and not ctx.dirty.structure
    e.set("Inputs", "c: float2")  # a new type re-describes the block (ports of another type)
    assert ctx.dirty.structure and e.inputs[0].dtype is DType.FLOAT2


# -- plans --------------------------------------------------------------------------------------------------

_ptr = iter(range(0x10000, 1 << 40, 0x10000))


def _bind(ctx: Context, block, port: str, data: np.ndarray, dtype: DType, externals: dict) -> None:
    ctx.bind_input(block, port, ExternalBinding(next(_ptr), data.size // dtype.lanes, dtype))
    externals[(block.id, port)] = data


def test_a_plan_of_vector_expressions_runs_unfused_and_computes_lane_by_lane() -> None:
    rng = np.random.default_rng(5)
    n = 64
    ctx, externals = Context(), {}
    gain = ctx.register_block(Scale(name="gain", Factor=2.0))  # would fuse into a float reader
    tint = ctx.register_block(Expression(name="tint", Code="c * mask + Lift", Inputs="c: float4, mask", Lift=0.25))
    again = ctx.register_block(Expression(name="again", Code="v * v - w", Inputs="v: float4, w: float4"))
    ctx.connect(gain, "Out", tint, "mask")
    ctx.connect(tint, "Out", again, "v")
    c = rng.standard_normal((n, 4)).astype(np.float32)
    mask = rng.random(n).astype(np.float32)
    w = rng.standard_normal((1, 4)).astype(np.float32)  # one element: broadcast
    _bind(ctx, tint, "c", c, DType.FLOAT4, externals)
    _bind(ctx, gain, "In", mask, DType.FLOAT32, externals)
    _bind(ctx, again, "w", w, DType.FLOAT4, externals)
    snap = ctx.snapshot()
    plan = compile_plan(snap, fuse=True)
    assert not plan.diagnostics  # nothing fuses, and no warning says so
    assert not any(isinstance(k.source, FusedSource) for k in plan.kernel_nodes)
    assert {k.block_id for k in plan.kernel_nodes} == {gain.id, tint.id, again.id}
    for b in (tint, again):
        buf = plan.buffers[plan.outputs[(b.id, "Out")]]
        assert (buf.dtype, buf.count) == (DType.FLOAT4, n)
    (node,) = [k for k in plan.kernel_nodes if k.block_id == tint.id]
    program = tint.source.program
    assert node.args[program.count_param].value == n and node.grid * node.block >= n  # one thread per element
    got = run_plan(plan, snap, externals)
    f = np.float32
    m = (mask * f(2.0))[:, None]
    want_tint = c * m + f(0.25)
    np.testing.assert_array_equal(got[plan.outputs[(tint.id, "Out")]][: 4 * n].reshape(n, 4), want_tint)
    np.testing.assert_array_equal(
        got[plan.outputs[(again.id, "Out")]][: 4 * n].reshape(n, 4), want_tint * want_tint - w
    )


def test_a_vector_input_of_another_length_is_an_input_size_error() -> None:
    ctx, externals = Context(), {}
    e = ctx.register_block(Expression(name="e", Code="c * mask", Inputs="c: float4, mask"))
    _bind(ctx, e, "c", np.zeros((10, 4), np.float32), DType.FLOAT4, externals)
    _bind(ctx, e, "mask", np.zeros(7, np.float32), DType.FLOAT32, externals)
    plan = compile_plan(ctx.snapshot())
    assert e.id in plan.skipped
    (diag,) = [d for d in plan.diagnostics if d.block_id == e.id]
    assert diag.code == "input-size" and "input 'mask' has 7 elements but 'c'" in diag.message
    assert "(column 5)" in diag.message


def test_a_float4_image_keeps_its_shape_through_a_vector_expression_in_a_patch_file(tmp_path) -> None:
    from cudapatch.host_plugin.plan_view import plan_patch

    path = tmp_path / "p.toml"
    path.write_text(
        'links = ["cam.Out -> dim.c", "dim.Out -> blur.In"]\n'
        '[operators.cam]\ntype = "image.Pattern"\nFormat = "rgba32f"\nWidth = 64\nHeight = 48\n'
        '[operators.dim]\ntype = "core.Expression"\nCode = "c * Amount"\nInputs = "c: float4"\nAmount = 0.5\n'
        '[operators.blur]\ntype = "image.Blur"\nFormat = "rgba32f"\n'
    )
    engine, plan = plan_patch(path)
    assert plan is not None and not plan.diagnostics
    dim = next(b for b in engine.context.snapshot().blocks if b.name == "dim")
    buf = plan.buffers[plan.outputs[(dim.id, "Out")]]
    assert (buf.dtype, buf.count) == (DType.FLOAT4, 48 * 64)
    assert plan.shapes[(dim.id, "Out")].dims == (48, 64)  # an image stays an image: Blur takes it
    (node,) = [k for k in plan.kernel_nodes if k.block_id == dim.id]
    assert node.args[dim.description.kernels[0].source.program.count_param].value == 48 * 64


def test_a_vector_type_that_does_not_fit_a_link_is_refused_by_the_link() -> None:
    from cudapatch.blocks.library import Fill
    from cudapatch.blocks.library.image import Pattern
    from cudapatch.errors import GraphCompileError, LinkError

    ctx = Context()
    src = ctx.register_block(Fill(name="src", Count=10))  # floats
    e = ctx.register_block(Expression(name="e", Code="c * 2", Inputs="c: float4"))
    with pytest.raises(LinkError, match=r"cannot link src.Out \(float\) to e.c \(float4\)"):
        ctx.connect(src, "Out", e, "c")
    cam = ctx.register_block(Pattern(name="cam", Format="rgba32f", Width=8, Height=4))
    ctx.connect(cam, "Out", e, "c")
    assert not compile_plan(ctx.snapshot()).diagnostics
    e.set("Inputs", "c: float2")  # a live edit of the type: the link no longer fits (the engine keeps its graph)
    with pytest.raises(GraphCompileError, match=r"link cam.Out \(float4\) -> e.c \(float2\): element types differ"):
        compile_plan(ctx.snapshot())
