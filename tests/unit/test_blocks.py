"""Block, BlockBuilder, BlockParameter and structural equality of descriptions (no GPU)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from cudapatch import AppendFilter, Block, BlockBuilder, DType, Fill, Scale, VectorAdd, bundled_kernel, from_param, like
from cudapatch.blocks import BlockParameter, BlockState, ParamSpec, PinRef
from cudapatch.errors import CudapatchError, KernelLoadError, ParameterError

from .conftest import write_kernel


def test_builtin_descriptions() -> None:
    add = VectorAdd()
    d = add.description
    assert [p.name for p in d.inputs] == ["A", "B"] and [p.name for p in d.outputs] == ["Sum"]
    assert d.outputs[0].size == like("A") and d.outputs[0].pins == (PinRef(0, 2),)
    assert d.kernels[0].grid == like("A") and d.kernels[0].counts == ((3, like("A")),)
    f = AppendFilter()
    kept = f.description.output("Kept")
    assert kept.kind == "append" and kept.counter == (PinRef(0, 2),) and kept.size == from_param("Capacity")
    assert str(kept.pin_type) == "append float[]" and str(d.inputs[0].pin_type) == "float[]"
    assert f.params["Capacity"].spec.structural and not f.params["Threshold"].spec.structural
    assert str(add) == f"{add.name}: NotCompiled"


def test_structural_equality_ignores_identity() -> None:
    a, b = Scale(name="a"), Scale(name="b", Factor=3.0)
    assert a.description == b.description  # values are not structure
    assert a.description != VectorAdd().description
    assert hash(a.description.kernels[0].source) == hash(b.description.kernels[0].source)


class Custom(Block):
    type_name = "Custom"
    wiring = "ok"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(bundled_kernel("scale"))
        w = self.wiring
        if w == "unbound":
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=like("In"))
            b.scalar("F", k.in_(2))
            k.auto_grid(like("In"), count_param=4)
            return
        if w == "double":
            b.input("In", k.in_(0))
            b.input("In2", k.in_(0))
        if w == "out-as-in":
            b.input("In", k.in_(1))
        if w == "in-as-out":
            b.output("Out", k.out(0), size=4)
        if w == "range":
            k.in_(9)
        if w == "unknown-like":
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=like("Nope"))
        if w == "unknown-param":
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=from_param("Nope"))
        if w == "float-size":
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=from_param("F"))
            b.scalar("F", k.in_(2))
        if w == "dup-name":
            b.input("X", k.in_(0))
            b.output("X", k.out(1), size=4)
        if w == "bad-default":
            b.scalar("F", k.in_(2), default="fast")
        if w == "scalar-on-pointer":
            b.scalar("F", k.in_(0))
        b.commit()


@pytest.mark.parametrize(
    ("wiring", "message"),
    [
        ("unbound", "parameter 3 ('offset') of kernel 'scale' is not bound"),
        ("double", "parameter 0 ('in') of kernel 'scale' is already bound to input 'In'"),
        ("out-as-in", "is an output; use out()"),
        ("in-as-out", "is an input (float*, in); use in_()"),
        ("range", "has 5 parameters; there is no parameter 9"),
        ("unknown-like", "unknown input 'Nope'"),
        ("unknown-param", "unknown parameter 'Nope'"),
        ("float-size", "size parameter 'F' must be an integer"),
        ("dup-name", "the name 'X' is used twice"),
        ("bad-default", "must be a number"),
        ("scalar-on-pointer", "is a pointer"),
    ],
)
def test_builder_errors_name_block_kernel_and_parameter(wiring: str, message: str) -> None:
    cls = type(f"Custom_{wiring}", (Custom,), {"wiring": wiring})
    with pytest.raises(CudapatchError) as info:
        cls(name="my")
    assert message in str(info.value) and info.value.block == "my"


def test_missing_kernel_file_names_block_and_file(tmp_path: Path) -> None:
    class FromFile(Block):
        type_name = "FromFile"
        kernel_dir = tmp_path

        def describe(self, b: BlockBuilder) -> None:
            b.add_kernel("missing.ptx")

    with pytest.raises(KernelLoadError) as info:
        FromFile(name="ff")
    assert info.value.block == "ff" and "missing.json" in str(info.value)


def test_kernel_from_relative_path_and_refresh(tmp_path: Path) -> None:
    write_kernel(
        tmp_path,
        "k",
        [".u64", ".u32"],
        {
            "entryPoint": "k",
            "parameters": [{"name": "out", "type": "float*", "direction": "out"}, {"name": "n", "type": "uint"}],
        },
    )

    class FromFile(Block):
        type_name = "FromFile"
        kernel_dir = tmp_path
        count = 16

        def describe(self, b: BlockBuilder) -> None:
            k = b.add_kernel("k.ptx")
            b.output("Out", k.out(0), size=self.count)
            k.auto_grid(self.count, count_param=1)

    blk = FromFile()
    assert blk.refresh() is False  # nothing changed
    blk.count = 32
    assert blk.refresh() is True and blk.description.outputs[0].size.fixed == 32


def test_parameters_validate_and_keep_old_value() -> None:
    s = Scale(name="s", Factor=2.0)
    seen: list[float] = []
    s.params["Factor"].subscribe(lambda p: seen.append(p.value))
    s.set("Factor", 3)  # ints are fine for float parameters
    s.set("Factor", 3.0)  # unchanged: no event
    assert seen == [3.0] and s.get("Factor") == 3.0
    for bad in ("3", None, True, float("nan"), [1.0]):
        with pytest.raises(ParameterError) as info:
            s.set("Factor", bad)
        assert info.value.block == "s" and info.value.param == "Factor"
    assert s.get("Factor") == 3.0
    with pytest.raises(ParameterError, match="unknown parameter .*Factor, Offset"):
        s.set("Gain", 1.0)
    f = Fill(name="f")
    with pytest.raises(ParameterError, match="out of range"):
        f.set("Count", 0)
    with pytest.raises(ParameterError, match="must be an integer"):
        f.set("Count", 2.5)
    with pytest.raises(ParameterError, match="does not fit a uint"):
        f.set("Count", -1)
    f.set("Count", 7.0)
    assert f.get("Count") == 7 and isinstance(f.get("Count"), int)
    assert math.isinf(s.params["Factor"].validate(float("inf")))


def test_vector_parameters() -> None:
    p = BlockParameter(ParamSpec("Origin", DType.FLOAT3, (0, 0, 0), minimum=-10, maximum=10), "emit")
    p.set((1, 2.5, -3))
    assert p.value == (1.0, 2.5, -3.0)
    with pytest.raises(ParameterError, match="3 components"):
        p.set((1, 2))
    with pytest.raises(ParameterError, match="out of range"):
        p.set((0, 0, 11))
    with pytest.raises(ParameterError, match="sequence of 3"):
        p.set(1.0)


def test_block_state_and_close_without_engine() -> None:
    s = Scale()
    assert s.debug.state is BlockState.NOT_COMPILED and s.context is None
    s.close()
    s.close()


def test_texts_given_at_construction_are_described_once_and_held_as_their_parameters_say() -> None:
    calls: list[tuple[str, str]] = []

    class Texts(Block):
        type_name = "Texts"

        def describe(self, b: BlockBuilder) -> None:
            note = b.text("Note", default="none")
            kind = b.text("Kind", default="float", choices=("float", "double"))
            calls.append((note, kind))
            b.scalar("Gain", dtype=DType.FLOAT32, default=1.0)

    t = Texts(name="t", Note="hello", Kind="Double ", Gain=2.5)
    assert calls == [("hello", "double")]  # one description, from the texts given
    assert t.params["Note"].value == "hello" and t.params["Kind"].value == "double" and t.params["Gain"].value == 2.5
    assert t._texts == {"Note": "hello", "Kind": "double"}  # as the parameter spells it
    t.set("Kind", "float")  # a later edit re-describes, as before
    assert calls[-1] == ("hello", "float") and len(calls) == 2
    with pytest.raises(ParameterError, match="choices"):
        Texts(name="u", Kind="half")
    assert len(calls) == 2  # refused while describing
    assert Texts(name="v").params["Note"].value == "none" and len(calls) == 3
