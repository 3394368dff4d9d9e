"""Code generation without a GPU: the generated PTX assembles with ``ptxas`` and matches its
descriptor, the generated CUDA C++ compiles with NVRTC, and the NumPy interpreter (the reference
GPU tests compare against) computes what the language says."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cudapatch.errors import KernelCompileError
from cudapatch.expr import (
    FUNCTIONS,
    ProgramSource,
    compile_expression,
    evaluate,
    generate_cuda,
    generate_ptx,
    single,
)
from cudapatch.expr import source as expr_source
from cudapatch.expr.program import Program, Stage
from cudapatch.kernels.ptx import check_signature, parse_ptx

# Every function and operator at least once.
EXPRESSIONS = [
    "a * sin(x * Freq) + b",
    "cos(x) + tan(x * 0.5) + exp(x) + log(abs(x) + 1) + pow(abs(x), 1.5) + sqrt(abs(x))",
    "abs(x) + floor(x) + fract(x) + min(x, 0.5) + max(x, Lo) + clamp(x, Lo, Hi) + mix(a, b, 0.25)",
    "step(0.5, x) + smoothstep(Lo, Hi, x) + where(x > 0 and not (x >= 1) or x == 2, x, -x) + fma(a, x, b)",
    "float(index % 3 + (index << 2) - (index >> 1) + (index & 5 | 2 ^ 7) + ~index) + int(x * 3) + count / 2",
    "x ** 2 + -x + +x - x / 3 + pi + min(index, 4) + max(-index, 2) + abs(-index) + clamp(index, 1, 9)",
    "where(index != 3, 1, 2) + x * 1e-3 + .5",
    "sin(index * Freq)",  # no inputs at all
]


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(21)


def _ptxas() -> str | None:
    return shutil.which("ptxas")


@pytest.mark.parametrize("text", EXPRESSIONS)
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_generated_ptx_assembles_with_ptxas(text: str, arch: str, tmp_path: Path) -> None:
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) is not installed")
    program = single(compile_expression(text))
    path = tmp_path / "e.ptx"
    path.write_text(generate_ptx(program, arch))
    done = subprocess.run([ptxas, f"-arch={arch}", str(path), "-o", str(tmp_path / "e.cubin")], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()


@pytest.mark.parametrize("text", EXPRESSIONS)
def test_generated_ptx_signature_matches_the_descriptor(text: str) -> None:
    program = single(compile_expression(text))
    info = parse_ptx(generate_ptx(program))
    assert info.version == (7, 8) and info.target == "sm_90"
    entry = check_signature(info, program.descriptor)
    assert len(entry.params) == 2 * len(program.inputs) + 1 + len(program.scalars) + 1


def test_generated_ptx_uses_no_contracting_or_approximate_arithmetic() -> None:
    ptx = generate_ptx(single(compile_expression("a * x + b - a / x")))
    body = ptx[ptx.index("{") :]
    for op in ("mul.rn.f32", "add.rn.f32", "sub.rn.f32", "div.rn.f32"):
        assert op in body
    assert "fma" not in body and "mad.f32" not in body and ".ftz" not in body and "div.approx" not in body
    assert "fma.rn.f32" in generate_ptx(single(compile_expression("fma(a, x, b)")))


def test_descriptor_layout_and_user_names() -> None:
    program = single(compile_expression("a * x + Gain"))
    desc = program.descriptor
    assert [(p.name, p.type_name, p.direction) for p in desc.parameters] == [
        ("a", "float*", "in"),
        ("a_count", "uint", "in"),
        ("x", "float*", "in"),
        ("x_count", "uint", "in"),
        ("Out", "float*", "out"),
        ("Gain", "float", "in"),
        ("n", "uint", "in"),
    ]
    clash = single(compile_expression("n * n_count + Out"), output="Out")
    assert len(set(clash.param_names)) == len(clash.param_names) == 7  # n, n_count, their counts, Out twice, n


def test_program_key_follows_the_text_and_the_descriptor_stays_across_edits() -> None:
    a = single(compile_expression("x * Gain + 1.0"))
    b = single(compile_expression("x * Gain + 2.0"))
    assert a.key != b.key and a.descriptor == b.descriptor
    assert single(compile_expression("x * Gain + 1.0")).key == a.key
    sa, sb = ProgramSource.of(a), ProgramSource.of(single(compile_expression("x * Gain + 1.0")))
    assert sa == sb and hash(sa) == hash(sb) and sa != ProgramSource.of(b)
    assert sa.cache_key("sm_90") != sa.cache_key("sm_80")
    assert ProgramSource.of(a, backend="nvrtc").cache_key("sm_90") != sa.cache_key("sm_90")


def test_ptx_source_compiles_to_ptx_text_linked_by_nvjitlink(monkeypatch) -> None:
    source = ProgramSource.of(single(compile_expression("x * Gain")))
    ptx = source.code("sm_90")
    assert ".entry expression(" in ptx
    image = source.compile("sm_90")  # a cubin: the driver never JITs it (its lock is the launches' lock)
    assert image.kind == "cubin" and image.image[:4] == b"\x7fELF" and image.descriptor.entry_point == "expression"

    def refused(*a, **kw):
        raise KernelCompileError("no nvJitLink here")

    monkeypatch.setattr(expr_source, "link_ptx", refused)  # without nvJitLink: the PTX, for the driver
    image = source.compile("sm_90")
    assert image.kind == "ptx" and image.image == ptx.encode() + b"\0"


@pytest.mark.parametrize("text", [EXPRESSIONS[0], EXPRESSIONS[3], EXPRESSIONS[4]])
def test_generated_cuda_compiles_with_nvrtc(text: str) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    source = ProgramSource.of(single(compile_expression(text)), backend="nvrtc")
    image = source.compile("sm_90")
    assert image.kind == "cubin" and image.image[:4] == b"\x7fELF"
    assert "__fmul_rn" in generate_cuda(source.program) or "*" not in text  # type: ignore[arg-type]


# -- the interpreter ------------------------------------------------------------------------------------


def _run(text: str, inputs: dict[str, np.ndarray], scalars: dict[str, float] | None = None, **kw: object) -> np.ndarray:
    program = single(compile_expression(text))
    return evaluate(program, inputs, scalars or {}, **kw)["Out"]  # type: ignore[arg-type]


def test_interpreter_matches_numpy_formulas(rng: np.random.Generator) -> None:
    a, x, b = (rng.standard_normal(257).astype(np.float32).astype(np.float64) for _ in range(3))
    got = _run("a * sin(x * Freq) + b", {"a": a, "x": x, "b": b}, {"Freq": 3.0}, dtype=np.float64)
    np.testing.assert_allclose(got, a * np.sin(x * 3.0) + b, rtol=1e-12)
    got = _run("smoothstep(-1, 1, x) + step(0, x) + mix(a, b, 0.25)", {"x": x, "a": a, "b": b}, dtype=np.float64)
    t = np.clip((x.astype(np.float64) + 1) / 2, 0, 1)
    ref = t * t * (3 - 2 * t) + (x >= 0) + a + (b.astype(np.float64) - a) * 0.25
    np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)


def test_interpreter_f32_rounds_every_operation(rng: np.random.Generator) -> None:
    a, x, b = (rng.standard_normal(1000).astype(np.float32) for _ in range(3))
    got = _run("a * x + b", {"a": a, "x": x, "b": b})
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, (a * x) + b)  # two roundings, never one (no contraction)
    fused = _run("fma(a, x, b)", {"a": a, "x": x, "b": b})
    np.testing.assert_array_equal(fused, (a.astype(np.float64) * x + b).astype(np.float32))


def test_interpreter_integer_semantics() -> None:
    n = 16
    x = np.linspace(-3.75, 3.75, n).astype(np.float32)
    got = _run("float(index % 3) + int(x) * 100", {"x": x})
    np.testing.assert_array_equal(got, (np.arange(n) % 3) + np.trunc(x) * 100)
    got = _run("float((index - 8) % 3)", {}, n=n)  # C remainder: the dividend's sign
    np.testing.assert_array_equal(got, np.fmod(np.arange(n) - 8, 3))
    got = _run("float(1 << index) + float(-16 >> 2)", {}, n=n)
    np.testing.assert_array_equal(got, (1 << np.arange(n)) - 4)
    got = _run("count / 2", {}, n=n)
    np.testing.assert_array_equal(got, np.full(n, 8.0))


def test_broadcasting_reads_element_min_i_len_minus_one() -> None:
    x = np.arange(6, dtype=np.float32)
    one = np.array([10.0], dtype=np.float32)
    short = np.array([100.0, 200.0], dtype=np.float32)
    np.testing.assert_array_equal(_run("x + c", {"x": x, "c": one}), x + 10)
    np.testing.assert_array_equal(_run("x + c", {"x": x, "c": short}), x + [100, 200, 200, 200, 200, 200])


def test_multi_stage_program_matches_the_stages_run_apart(rng: np.random.Generator) -> None:
    # What fusion relies on: a stage's value is a stored float, so chaining stages equals running them apart.
    first = compile_expression("x * Gain + index")
    second = compile_expression("sqrt(abs(y)) - y / Div")
    program = Program(
        inputs=("x",),
        scalars=("Gain", "Div"),
        outputs=(("Out", 1),),
        stages=(
            Stage(first, {"x": ("input", 0), "Gain": ("scalar", 0)}),
            Stage(second, {"y": ("stage", 0), "Div": ("scalar", 1)}),
        ),
    )
    x = rng.standard_normal(300).astype(np.float32)
    fused = evaluate(program, [x], [1.5, 3.0])["Out"]
    mid = evaluate(single(first), [x], [1.5])["Out"]
    apart = evaluate(single(second), [mid], [3.0])["Out"]
    np.testing.assert_array_equal(fused, apart)
    for arch in ("sm_90",):
        info = parse_ptx(generate_ptx(program, arch))
        check_signature(info, program.descriptor)


def test_every_function_is_generated() -> None:
    covered = set()
    for text in EXPRESSIONS:
        covered |= {f for f in FUNCTIONS if f + "(" in text}
    assert covered == set(FUNCTIONS)


@pytest.mark.parametrize("per_thread", [2, 4])
def test_several_elements_per_thread_keep_the_signature_and_assemble(per_thread: int, tmp_path: Path) -> None:
    program = single(compile_expression("a * sin(x * Freq) + b + float(index) + where(x > b, a, b)"))
    one = generate_ptx(program)
    assert generate_ptx(program, per_thread=1) == one
    text = generate_ptx(program, per_thread=per_thread)
    assert parse_ptx(text).entries["expression"].params == parse_ptx(one).entries["expression"].params
    assert text.count("st.global.f32") == per_thread and text.count("@%p") >= per_thread  # guarded stores
    assert text.count("ld.param.f32") == one.count("ld.param.f32")  # each scalar loaded once per thread
    ptxas = _ptxas()
    if ptxas is None:
        pytest.skip("ptxas (CUDA toolkit) is not installed")
    path = tmp_path / "k.ptx"
    path.write_text(text)
    done = subprocess.run([ptxas, "-arch=sm_90", str(path), "-o", str(tmp_path / "k.cubin")], capture_output=True)
    assert done.returncode == 0, done.stderr.decode()
    with pytest.raises(ValueError):
        generate_ptx(program, per_thread=0)


def test_ptx_source_falls_back_to_the_ptx_where_the_nvjitlink_library_is_missing(monkeypatch) -> None:
    # cuda-bindings imports its nvjitlink module without the library; the first call then raises
    # pathfinder's DynamicLibNotFoundError (a RuntimeError), which link_ptx must report as the
    # KernelCompileError its callers fall back on.
    nvjitlink = pytest.importorskip("cuda.bindings.nvjitlink")
    pathfinder = pytest.importorskip("cuda.pathfinder")

    def missing(*a, **kw):
        raise pathfinder.DynamicLibNotFoundError("Failure finding libnvJitLink.so")

    monkeypatch.setattr(nvjitlink, "create", missing)
    source = ProgramSource.of(single(compile_expression("x * Gain")))
    image = source.compile("sm_90")
    assert image.kind == "ptx" and image.image == source.code("sm_90").encode() + b"\0"


def test_a_ptx_image_cached_without_nvjitlink_is_not_loaded_where_nvjitlink_links(monkeypatch, tmp_path) -> None:
    # The optimised PTX source's image is the PTX where nvJitLink is missing and a cubin where it links:
    # under one key, a disk cache filled without it (or before sources were linked) kept handing the
    # PTX to the driver's JIT, whose lock the frames' launches wait for.
    nvjitlink = pytest.importorskip("cuda.bindings.nvjitlink")
    pathfinder = pytest.importorskip("cuda.pathfinder")
    from cudapatch.kernels import _toolchain
    from cudapatch.kernels.cache import CubinCache

    def missing(*a, **kw):
        raise pathfinder.DynamicLibNotFoundError("Failure finding libnvJitLink.so")

    def forget() -> None:
        clear = getattr(getattr(_toolchain, "linker_version", None), "cache_clear", None)
        if clear is not None:
            clear()

    source = ProgramSource.of(single(compile_expression("x * Gain")))
    cache = CubinCache(tmp_path)
    with monkeypatch.context() as m:
        m.setattr(nvjitlink, "create", missing)
        m.setattr(nvjitlink, "version", missing)
        forget()
        image = source.compile("sm_90")
        assert image.kind == "ptx"
        cache.put(source.cache_key("sm_90"), image.image, {})
    forget()
    assert source.compile("sm_90").kind == "cubin"
    assert cache.get(source.cache_key("sm_90")) is None
