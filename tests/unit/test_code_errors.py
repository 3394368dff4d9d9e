"""The Code editor's error markers: compile errors parsed from real messages of each compiler path
(NVRTC, ptxas through nvJitLink, Numba, the Expression compiler) as (line, column, message), and the
editor model that puts them on its nodes and shows an Expression's generated code."""

from __future__ import annotations

import pytest

from cudapatch.engine.diagnostics import Diagnostic
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, parse_patch
from cudapatch.host_plugin.code_errors import CodeError, code_errors
from cudapatch.host_plugin.editor_model import EditorModel

from .plan_engine import PlanOnlyEngine

CUDA = """\
extern "C" __global__ void k(float* out, unsigned n) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = undefined_thing * 2.0f
    out[0] = 1;
}
"""
# What a block carries for CUDA above (engine/kernels.py _message of nvrtc_compile's error, as printed).
NVRTC = (
    "fx.cu:3: block 'fx', kernel 'k': CUDA C++ does not compile: identifier \"undefined_thing\" is undefined\n"
    'fx.cu(3): error: identifier "undefined_thing" is undefined\n'
    "      if (i < n) out[i] = undefined_thing * 2.0f\n"
    "                          ^\n"
    "\n"
    'fx.cu(4): error: expected a ";"\n'
    "      out[0] = 1;"
)
# link_ptx's error for PTX with a bad instruction at lines 6 and 7.
PTXAS = (
    "k.ptx:6: kernel 'k': PTX does not compile for sm_90: ptxas application ptx input, line 6; error   : "
    "Arguments mismatch for instruction 'ld'\n"
    "ptxas application ptx input, line 6; error   : Arguments mismatch for instruction 'ld'\n"
    "ptxas application ptx input, line 7; error   : Unknown modifier '.op'\n"
    "ptxas fatal   : Ptx assembly aborted due to errors"
)
# NumbaSource.compile's error for an unknown attribute at line 3 (Numba colours it).
NUMBA = (
    "../../../tmp/nb_kernel2.py:3: block 'nb', kernel 'bad2': Numba cannot compile bad2: \x1b[1m\x1b[1m"
    "Unknown attribute 'no_such_attribute' of type array(float32, 1d, C)\n"
    "Failed in cuda mode pipeline (step: nopython frontend)\n"
    "\x1b[1m\x1b[1mUnknown attribute 'no_such_attribute' of type array(float32, 1d, C)\n"
    '\x1b[1m\nFile "../../../tmp/nb_kernel2.py", line 3:\x1b[0m\n\x1b[1mdef bad2(out, n):\n    <source elided>'
)


def test_nvrtc_errors_at_their_lines_with_the_caret_column() -> None:
    errors = code_errors(NVRTC, CUDA, ("fx.cu",))
    assert errors == (
        CodeError(3, 25, 'error: identifier "undefined_thing" is undefined'),
        CodeError(4, None, 'error: expected a ";"'),  # its caret is past the log's excerpt
    )
    assert CUDA.splitlines()[2][24:].startswith("undefined_thing")  # column 25, 1-based
    # Without the Code, no column; an error in another file (an included header) is not the Code's.
    assert [e.column for e in code_errors(NVRTC)] == [None, None]
    assert code_errors(NVRTC, CUDA, ("other.cu",)) == ()
    header = 'util.cuh(7): error: expected a ";"\n' + NVRTC
    assert [e.line for e in code_errors(header, CUDA, ("fx.cu",))] == [3, 4]


def test_nvrtc_warnings_and_the_first_line_alone() -> None:
    log = 'fx.cu(2): warning #177-D: variable "j" was declared but never referenced\n'
    assert code_errors(log, CUDA, ("fx.cu",)) == (
        CodeError(2, None, 'warning: variable "j" was declared but never referenced'),
    )
    # A message without the compiler's log still has its location on its first line.
    first = NVRTC.splitlines()[0]
    assert code_errors(first, CUDA, ("fx.cu",)) == (
        CodeError(3, None, 'CUDA C++ does not compile: identifier "undefined_thing" is undefined'),
    )


def test_ptxas_errors_at_their_lines() -> None:
    errors = code_errors(PTXAS, "", ("k.ptx",))
    assert errors == (
        CodeError(6, None, "error: Arguments mismatch for instruction 'ld'"),
        CodeError(7, None, "error: Unknown modifier '.op'"),
    )
    assert code_errors(PTXAS, "", ("fx.cu",)) == ()  # generated PTX's lines are not a CUDA C++ Code's


def test_numba_error_at_its_line_without_colours() -> None:
    (error,) = code_errors(NUMBA, "", ("nb_kernel2.py",))
    assert error.line == 3 and error.column is None
    assert (
        error.message
        == "Numba cannot compile bad2: Unknown attribute 'no_such_attribute' of type array(float32, 1d, C)"
    )
    assert "\x1b" not in error.message


def test_expression_errors_from_the_compiler_give_line_and_column() -> None:
    from cudapatch.blocks.library.expression import Expression
    from cudapatch.expr import ExpressionError

    for code, where, words in (
        ("a +* b", (1, 4), "expected a value, found '*'"),
        ("x * 2 + foo(x)", (1, 9), "unknown function 'foo'"),
        ("a * sin(x\n + q", (1, 10), "an expression is one line"),
    ):
        with pytest.raises(ExpressionError) as info:
            Expression(name="e", Code=code)
        message = str(info.value) + " (the previous version keeps running)"  # as the engine's diagnostic has it
        (error,) = code_errors(message, code, ())
        assert (error.line, error.column) == where and error.message.startswith(words), (error, message)
        assert "block 'e'" not in error.message and "column" not in error.message


def test_live_nvrtc_log_parses_as_the_sample(tmp_path) -> None:
    """The sample above is NVRTC's: the installed NVRTC (no GPU needed) says the same."""
    from cudapatch.engine.kernels import _message
    from cudapatch.errors import KernelCompileError

    try:
        from cudapatch.kernels._toolchain import nvrtc_compile

        nvrtc_compile(CUDA, name="fx.cu", entry="k", arch="sm_90")
    except KernelCompileError as exc:
        exc.block = "fx"
        message = _message(exc)
    except Exception as exc:  # no NVRTC in this install
        pytest.skip(f"NVRTC is not available: {exc}")
    assert [(e.line, e.column) for e in code_errors(message, CUDA, ("fx.cu",))][:2] == [(3, 25), (4, None)]


def test_engine_message_keeps_every_later_error_line() -> None:
    from cudapatch.engine.kernels import _message
    from cudapatch.errors import KernelCompileError

    log = "\n".join(f"fx.cu({n}): error: bad {n}\n    x\n    ^\n" for n in range(1, 6))
    message = _message(KernelCompileError("does not compile", log=log, file="fx.cu", line=1))
    assert [e.line for e in code_errors(message, "", ("fx.cu",))] == [1, 2, 3, 4, 5]


FX_PATCH = f'''\
[operators.fx]
type = "core.CustomKernel"
Code = """
{CUDA}"""
'''
WAVE_PATCH = """\
[operators.wave]
type = "core.Expression"
Code = "x * 2 + 1"
Inputs = "x"
"""
PATCH = f"{FX_PATCH}\n{WAVE_PATCH}"


def _model() -> tuple[EditorModel, HostAdapter]:
    reg = PluginHost().registry
    patch = parse_patch(PATCH, registry=reg)
    adapter = HostAdapter(PlanOnlyEngine(), reg)
    apply_patch(adapter, patch)
    adapter.engine.update()
    return EditorModel(adapter, patch), adapter


def test_model_puts_code_errors_on_the_node_of_the_code() -> None:
    model, adapter = _model()
    code = adapter.block("fx").get("Code")
    line = next(i for i, ln in enumerate(code.splitlines(), 1) if "undefined_thing" in ln)
    message = NVRTC.replace("fx.cu(3)", f"fx.cu({line})").replace("fx.cu(4)", f"fx.cu({line + 1})")
    fx = adapter.block("fx")
    adapter.engine.errors = (Diagnostic("error", fx.id, "kernel-compile", message),)
    model.refresh()
    view = model.nodes()["fx"]
    assert view.state == "Error"
    assert [(e.line, e.column) for e in view.code_errors] == [(line, 25), (line + 1, None)]
    assert model.nodes()["wave"].code_errors == ()
    adapter.engine.errors = ()
    model.refresh()
    assert view.code_errors == ()


def test_model_reads_whole_diagnostics_when_stats_carry_a_first_line() -> None:
    """``engine.stats()`` gives each block its first diagnostic line only (NVRTC's caret is further
    down): the markers still get the column, from the engine's whole diagnostic."""
    from types import SimpleNamespace

    model, adapter = _model()
    fx = adapter.block("fx")
    code = fx.get("Code")
    line = next(i for i, ln in enumerate(code.splitlines(), 1) if "undefined_thing" in ln)
    message = f"fx.cu:{line}: block 'fx': CUDA C++ does not compile\n" + NVRTC.replace("fx.cu(3)", f"fx.cu({line})")
    adapter.engine.errors = (Diagnostic("error", fx.id, "kernel-compile", message),)

    def stats(text: str) -> SimpleNamespace:
        row = SimpleNamespace(block_id=fx.id, state="Error" if text else "OK", message=text, gpu_ms=None, append={})
        return SimpleNamespace(blocks=[row])

    model.refresh(stats(message.splitlines()[0]))
    assert [(e.line, e.column) for e in model.nodes()["fx"].code_errors][:1] == [(line, 25)]
    adapter.engine.errors = ()
    model.refresh(stats(""))
    assert model.nodes()["fx"].code_errors == ()


def test_model_shows_generated_code_once_per_code() -> None:
    model, adapter = _model()
    assert model.nodes()["wave"].generates and not model.nodes()["fx"].generates
    assert model.generated_code("fx") is None
    wave = adapter.block("wave")
    text = model.generated_code("wave")
    assert text == wave.generated_code and text.count("\n") > 5
    # Cached: the same Code gives the very same text object, not a new generation.
    assert model.generated_code("wave") is text
    assert model.set_param("wave", "Code", "x * 3 + 1")
    new = model.generated_code("wave")
    assert new != text and "x * 3 + 1" in new and model.generated_code("wave") is new
    assert model.set_param("wave", "Code", "x * * 1")  # broken: no code, the error is the node's
    assert model.generated_code("wave") is None


def test_overlay_tooltip_of_a_standalone_hosts_expression(tmp_path, monkeypatch) -> None:
    """The preview's overlay asks the host for a block's generated code by block id (its tooltip on
    the block's name): an Expression's, inside a composite too; none for other blocks."""
    from cudapatch.engine import engine as engine_module
    from cudapatch.host_plugin.generated_code import code_tooltip
    from cudapatch.host_plugin.hosts.standalone import StandaloneHost

    class NoDeviceEngine(PlanOnlyEngine):
        def __init__(self, device: int = 0, *, name: str = "", isolated: bool = False, **options: bool) -> None:
            super().__init__(fuse=options.get("fuse", True))

    monkeypatch.setattr(engine_module, "Engine", NoDeviceEngine)
    (tmp_path / "inner.toml").write_text(WAVE_PATCH.replace("wave", "deep") + '\n[expose]\nx = "deep.x"\n')
    patch = FX_PATCH + "\n" + WAVE_PATCH + '\n[operators.box]\ntype = "core.Composite"\nPath = "inner.toml"\n'
    (tmp_path / "patch.toml").write_text(patch)
    host = StandaloneHost(tmp_path / "patch.toml")
    host.engine.update()
    wave = host.adapter.block("wave")
    code = host.generated_code(wave.id)
    assert code == wave.generated_code and host.generated_code(wave.id) is code  # generated once
    assert host.generated_code(host.adapter.block("fx").id) is None
    (deep,) = [b for _, b in host.adapter.block("box").inner_blocks()]
    assert "deep: x * 2 + 1" in host.generated_code(deep.id)
    assert host.generated_code(10**9) is None
    tip = code_tooltip(code, limit=5)
    n = len(code.splitlines())
    assert tip.startswith(f"generated code: {n} lines\n// Generated by cudapatch.expr")
    assert tip.endswith(f"... {n - 5} more lines") and len(tip.splitlines()) == 7
