"""Parameters with choices (enums): declared through the builder, refused outside them with the
choices named and the old value kept, named in any case by hosts (patch files, menus), shown by the
editor as an enum and listed by ``cudapatch blocks``; the built-in blocks whose text parameters are
really choices declare them."""

from __future__ import annotations

import pytest

from cudapatch import Block, BlockBuilder, DType
from cudapatch.blocks.description import ParamSpec
from cudapatch.blocks.library import FFT, GEMM, Blur, FrameDelay, Pattern, Random
from cudapatch.blocks.library.transfer import ELEMENT_TYPES, Download, Upload
from cudapatch.blocks.parameter import BlockParameter
from cudapatch.cli import main
from cudapatch.errors import ParameterError
from cudapatch.expr import BACKENDS
from cudapatch.host_plugin import HostAdapter, PluginHost, apply_patch, load_patch
from cudapatch.host_plugin.coerce import coerce_host_value
from cudapatch.host_plugin.editor_model import EditorModel
from cudapatch.host_plugin.editor_views import param_view
from cudapatch.interop.gl_writers import GlBufferWriter, GlSurfaceWriter

from .plan_engine import PlanOnlyEngine

REG = PluginHost().registry


class Picky(Block):
    """A block with a text choice (re-describes) and an integer choice (a size: structural)."""

    type_name = "Picky"

    def describe(self, b: BlockBuilder) -> None:
        self.mode_seen = b.text("Mode", default="fast", choices=("fast", "exact", "Both Ways"))
        b.scalar("Lanes", dtype=DType.UINT32, default=4, choices=(1, 4, 16), description="lanes per item")


# -- ParamSpec.choice ---------------------------------------------------------------------------------
def test_a_choice_is_found_by_itself_or_by_its_name_in_any_case_and_spacing() -> None:
    text = ParamSpec("Mode", None, "fast", kind="text", choices=("fast", "exact", "Both Ways"))
    assert text.choice("exact") == "exact" and text.choice(" EXACT ") == "exact"
    assert text.choice("both  ways") == "Both Ways" and text.choice("slow") is None and text.choice(1) is None
    lanes = ParamSpec("Lanes", DType.UINT32, 4, choices=(1, 4, 16))
    assert lanes.choice(16) == 16 and lanes.choice(16.0) == 16 and lanes.choice(" 16") == 16
    assert lanes.choice(8) is None and lanes.choice("sixteen") is None
    assert lanes.choice(True) is None  # True == 1, but a toggle is not a menu entry
    assert ParamSpec("Gain", DType.FLOAT32, 1.0).choice(1.0) is None  # no choices: nothing is one


# -- BlockParameter -----------------------------------------------------------------------------------
def test_a_value_outside_the_choices_is_refused_naming_block_parameter_and_choices() -> None:
    p = BlockParameter(ParamSpec("Lanes", DType.UINT32, 4, choices=(1, 4, 16)), "picky")
    seen = []
    p.subscribe(seen.append)
    for bad, words in ((8, "8 is not one of its choices: 1, 4, 16"), ("8", "'8' is not one of its choices")):
        with pytest.raises(ParameterError, match=words) as err:
            p.set(bad)
        assert err.value.block == "picky" and err.value.param == "Lanes" and p.value == 4
    with pytest.raises(ParameterError, match="must be an integer"):  # a wrong type still says so
        p.set(2.5)
    with pytest.raises(ParameterError, match="must be a number"):
        p.set(True)
    assert p.value == 4 and not seen
    p.set(16.0)
    assert p.value == 16 and type(p.value) is int and seen == [p]
    p.set("1")  # the choice's name
    assert p.value == 1


def test_a_text_choice_is_stored_as_declared() -> None:
    p = BlockParameter(ParamSpec("Mode", None, "fast", kind="text", choices=("fast", "exact")), "picky")
    p.set(" Exact")
    assert p.value == "exact"
    with pytest.raises(ParameterError, match="block 'picky', parameter 'Mode': 'slow' is not one of its choices: "):
        p.set("slow")
    with pytest.raises(ParameterError, match="must be text"):
        p.set(1)
    assert p.value == "exact"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        (ParamSpec("Gain", DType.FLOAT32, 1.0, choices=(1, 2)), "only text and integer parameters take choices"),
        (ParamSpec("Pos", DType.INT2, (0, 0), choices=(0, 1)), "only text and integer parameters take choices"),
        (ParamSpec("Lanes", DType.UINT32, 5, choices=(1, 4)), "the default 5 is not one of its choices: 1, 4"),
        (ParamSpec("Lanes", DType.UINT32, 1, choices=(1, -4)), "does not fit a uint"),
        (ParamSpec("Lanes", DType.UINT32, 1, 0, 8, choices=(1, 16)), r"out of range \[0, 8\]"),
        (ParamSpec("Lanes", DType.UINT32, 1, choices=(1, "4")), "the choices of an integer parameter are integers"),
        (ParamSpec("Mode", None, "a", kind="text", choices=("a", 1)), "the choices of a text parameter are strings"),
        (ParamSpec("Mode", None, "a", kind="text", choices=("a", " A")), "differ in more than case and spacing"),
        (ParamSpec("Mode", None, "c", kind="text", choices=("a", "b")), "the default 'c' is not one of its choices"),
    ],
)
def test_bad_choices_are_refused_when_declared(spec: ParamSpec, words: str) -> None:
    with pytest.raises(ParameterError, match=words) as err:
        BlockParameter(spec, "picky")
    assert err.value.block == "picky" and err.value.param == spec.name


# -- the builder and Block.set ------------------------------------------------------------------------
def test_the_builder_declares_choices_and_describe_sees_only_a_choice() -> None:
    b = Picky(name="p", Mode="BOTH WAYS", Lanes=16)
    assert b.mode_seen == "Both Ways" and b.params["Mode"].value == "Both Ways" and b.params["Lanes"].value == 16
    d = b.description
    assert d.param("Mode").choices == ("fast", "exact", "Both Ways") and d.param("Lanes").choices == (1, 4, 16)
    assert Picky(name="q").description == Picky(name="r").description  # choices compare by value
    with pytest.raises(ParameterError, match="parameter 'Mode': 'slow' is not one of its choices: fast, exact, Both"):
        Picky(name="bad", Mode="slow")
    with pytest.raises(ParameterError, match="parameter 'Lanes': 8 is not one of its choices: 1, 4, 16"):
        Picky(name="bad", Lanes=8)


def test_block_set_refuses_a_value_outside_the_choices_and_keeps_the_old_one() -> None:
    b = Picky(name="p")
    before = b.description
    with pytest.raises(ParameterError, match="block 'p', parameter 'Mode': 'slow' is not one of its choices") as err:
        b.set("Mode", "slow")
    assert err.value.block == "p" and err.value.param == "Mode"
    with pytest.raises(ParameterError, match="block 'p', parameter 'Lanes': 3 is not one of its choices"):
        b.set("Lanes", 3)
    assert b.params["Mode"].value == "fast" and b.params["Lanes"].value == 4 and b.description is before
    b.set("Mode", "Exact")  # re-describes with the declared spelling
    assert b.mode_seen == "exact" and b.params["Mode"].value == "exact"


def test_builder_choices_for_a_float_scalar_are_refused() -> None:
    class Wrong(Block):
        type_name = "Wrong"

        def describe(self, b: BlockBuilder) -> None:
            b.scalar("Gain", dtype=DType.FLOAT32, default=1.0, choices=(1, 2))

    with pytest.raises(ParameterError, match="only text and integer parameters take choices"):
        Wrong(name="w")


# -- the built-in library -----------------------------------------------------------------------------
def test_builtin_text_parameters_that_are_choices_declare_them() -> None:
    from cudapatch import Expression

    declared = {
        (Expression, "Compiler"): BACKENDS,
        (FFT, "Kind"): ("C2C", "R2C", "C2R"),
        (FFT, "Precision"): ("float", "double"),
        (Random, "Precision"): ("float", "double"),
        (GEMM, "Precision"): ("float", "double"),
        (Pattern, "Format"): ("rgba8", "rgba32f"),
        (Blur, "Format"): ("rgba8", "rgba32f"),
        (FrameDelay, "Type"): ELEMENT_TYPES,
        (Upload, "Type"): ELEMENT_TYPES,
        (Download, "Type"): ELEMENT_TYPES,
        (GlBufferWriter, "Type"): ELEMENT_TYPES,
        (GlSurfaceWriter, "Texel"): ("4", "16"),
    }
    for (cls, name), choices in declared.items():
        assert cls().description.param(name).choices == choices, (cls.type_name, name)
    assert set(ELEMENT_TYPES) == {d.c_name for d in DType}


def test_builtin_choices_keep_their_behaviour() -> None:
    # the spellings the hand-written checks accepted (other case, spacing) still work
    assert FFT(Kind="c2r ", Precision="Double").description.output("Out").dtype is DType.FLOAT64
    assert Random(Precision=" DOUBLE").description.output("Out").dtype is DType.FLOAT64
    assert Blur(Format="RGBA32F").description.input("In").dtype is DType.FLOAT4
    assert FrameDelay(Type="float4").description.output("Out").dtype is DType.FLOAT4
    assert GlSurfaceWriter(Type="float", Texel="16").params["Texel"].value == "16"
    g = GEMM(name="g")
    with pytest.raises(ParameterError, match="parameter 'Precision': 'half' is not one of its choices: float, double"):
        g.set("Precision", "half")
    assert g.params["Precision"].value == "float" and g.description.output("C").dtype is DType.FLOAT32


# -- hosts --------------------------------------------------------------------------------------------
def test_host_values_name_a_choice() -> None:
    mode = ParamSpec("Mode", None, "fast", kind="text", choices=("fast", "exact"))
    lanes = ParamSpec("Lanes", DType.UINT32, 4, choices=(1, 4, 16))
    texel = ParamSpec("Texel", None, "4", kind="text", choices=("4", "16"))
    assert coerce_host_value(mode, "EXACT") == "exact"  # a menu entry, in any case
    assert coerce_host_value(lanes, "16") == 16 and coerce_host_value(lanes, " 1 ") == 1
    assert coerce_host_value(lanes, 16.0) == 16
    assert coerce_host_value(texel, 16) == "16"  # a TOML integer for a text choice
    assert coerce_host_value(mode, "slow") == "slow"  # left for the parameter's precise error
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    adapter.create("fft", "signal.FFT")
    adapter.set_param("fft", "Kind", "r2c")
    assert adapter.block("fft").params["Kind"].value == "R2C"
    with pytest.raises(ParameterError, match="'R2R' is not one of its choices: C2C, R2C, C2R"):
        adapter.set_param("fft", "Kind", "R2R")
    assert adapter.block("fft").params["Kind"].value == "R2C"


def test_a_patch_file_names_choices_in_any_case(tmp_path) -> None:
    path = tmp_path / "patch.toml"
    path.write_text('[operators.noise]\ntype = "signal.Random"\nPrecision = "Double"\nCount = 64\n')
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    apply_patch(adapter, load_patch(path, REG))
    assert adapter.block("noise").params["Precision"].value == "double"


# -- the editor ---------------------------------------------------------------------------------------
def test_the_editor_shows_choices_as_an_enum() -> None:
    view = param_view(ParamSpec("Compiler", None, "ptx", kind="text", choices=BACKENDS), "ptx")
    assert view.widget == "enum" and view.choices == BACKENDS and view.value == "ptx"
    view = param_view(ParamSpec("Lanes", DType.UINT32, 4, choices=(1, 4, 16)), 4)
    assert view.widget == "enum" and view.choices == (1, 4, 16) and view.integer
    assert param_view(ParamSpec("Code", None, "", kind="text"), "").widget == "code"  # no choices: as before


def test_the_editor_sets_a_choice_and_refuses_others_with_the_reason(tmp_path) -> None:
    path = tmp_path / "patch.toml"
    path.write_text('[operators.fft]\ntype = "signal.FFT"\nNx = 64\n')
    patch = load_patch(path, REG)
    adapter = HostAdapter(PlanOnlyEngine(), REG)
    apply_patch(adapter, patch)
    model = EditorModel(adapter, patch, path=path)
    (kind,) = [p for p in model.nodes()["fft"].params if p.name == "Kind"]
    assert kind.widget == "enum" and kind.choices == ("C2C", "R2C", "C2R") and kind.value == "C2C"
    assert model.set_param("fft", "Kind", "C2R")
    assert adapter.block("fft").params["Kind"].value == "C2R" and 'Kind = "C2R"' in path.read_text()
    text = path.read_text()
    r = model.set_param("fft", "Kind", "R2R")
    assert not r and "is not one of its choices: C2C, R2C, C2R" in r.message
    assert adapter.block("fft").params["Kind"].value == "C2R" and path.read_text() == text


# -- cudapatch blocks ---------------------------------------------------------------------------------
def test_cudapatch_blocks_lists_the_choices(capsys) -> None:
    assert main(["blocks"]) == 0
    out = capsys.readouterr().out
    assert "par Compiler: text = 'ptx'  (one of: ptx, nvrtc)" in out
    assert "par Kind: text = 'C2C'  (one of: C2C, R2C, C2R)" in out
    assert dict(REG.get("signal.FFT").choices)["Precision"] == ("float", "double")
    assert not REG.get("core.Scale").choices


# -- TouchDesigner --------------------------------------------------------------------------------------
def test_touchdesigner_shows_choices_as_a_menu() -> None:
    from cudapatch.host_plugin.hosts.touchdesigner import BlockOperatorExt, TouchDesignerHost

    from ..td_double import COMP

    td = TouchDesignerHost(engine=PlanOnlyEngine(), plugins=PluginHost())
    comp = COMP("/project1/fft")
    ext = BlockOperatorExt(comp, td, "signal.FFT")
    kind, precision, nx = comp.par.Kind, comp.par.Precision, comp.par.Nx
    assert kind.style == "Menu" and kind.menuNames == ["C2C", "R2C", "C2R"] and kind.menuLabels == kind.menuNames
    assert kind.val == kind.default == "C2C" and precision.menuNames == ["float", "double"]
    assert nx.style == "Int"  # no choices: as before
    kind.val = "C2R"  # a menu's eval() is the entry's name
    ext.OnParValueChange(kind, "C2C")
    assert ext.block.params["Kind"].value == "C2R" and not comp.errors
    kind.val = "R2R"  # not an entry (a script set it): an error on the COMP, the block keeps its value
    ext.OnParValueChange(kind, "C2R")
    assert ext.block.params["Kind"].value == "C2R" and kind.val == "C2R"
    assert "is not one of its choices: C2C, R2C, C2R" in comp.errors[-1]
    ext.SyncPage()  # a page rebuilt keeps the menu and shows the block's choice
    assert comp.par.Kind is kind and kind.val == "C2R" and kind.menuNames == ["C2C", "R2C", "C2R"]


def test_a_composite_exposing_a_parameter_with_choices_keeps_them() -> None:
    from cudapatch import Composite, CompositeBuilder

    class Spectrum(Composite):
        type_name = "Spectrum"

        def compose(self, c: CompositeBuilder) -> None:
            c.add("f", FFT(Nx=64))
            c.expose("In", "f.In")
            c.expose("Out", "f.Out")
            c.expose("Kind", "f.Kind")

    s = Spectrum(name="s", Kind="r2c")
    assert s.description.param("Kind").choices == ("C2C", "R2C", "C2R") and s.params["Kind"].value == "R2C"
    assert s.description.output("Out").dtype is DType.FLOAT2  # the inner FFT took it
    with pytest.raises(ParameterError, match="block 's', parameter 'Kind': 'R2R' is not one of its choices"):
        s.set("Kind", "R2R")
    assert s.params["Kind"].value == "R2C"
    assert param_view(s.description.param("Kind"), "R2C").widget == "enum"
