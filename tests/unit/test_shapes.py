"""Shapes on ports: the Shape value, size rules that keep or make shapes, propagation through the
compiler, 2-D/3-D launches, and the input checks that keep short or mis-shaped inputs off the GPU."""

from __future__ import annotations

import numpy as np
import pytest

from cudapatch import (
    Block,
    BlockBuilder,
    CudaSource,
    DType,
    Fill,
    Scale,
    Shape,
    VectorAdd,
    computed,
    like,
    shape_of,
)
from cudapatch.engine import Context, ExternalBinding, KernelNodePlan
from cudapatch.engine.bindings import binding_from_cai
from cudapatch.errors import CudapatchError
from tests.unit.shape_blocks import GAIN_2D, Gain2D, NumbaGain2D, Ramp2D, Ramp3D, Transpose2D

from .unfused import compile_plan  # one node per block: these tests are about unfused plans

PTR = 0x7000_0000


def _ctx(*blocks: Block) -> Context:
    c = Context()
    for b in blocks:
        c.register_block(b)
    return c


def _kernel_nodes(plan, block: Block) -> list[KernelNodePlan]:
    return [plan.nodes[i] for i in plan.block_nodes.get(block.id, ()) if isinstance(plan.nodes[i], KernelNodePlan)]


def _bind(c: Context, block: Block, port: str, shape: Shape | None, count: int | None = None) -> None:
    n = shape.count if shape is not None else count
    c.bind_input(block, port, ExternalBinding(PTR, n, DType.FLOAT32, shape=shape))  # type: ignore[arg-type]


def _diag(plan, block: Block):
    (d,) = [d for d in plan.diagnostics if d.block_id == block.id]
    return d


# -- the Shape value --------------------------------------------------------------------------------
def test_shape_counts_axes_and_prints() -> None:
    img = Shape.of(1080, 1920)
    assert img.count == 1080 * 1920 and img.ndim == 2
    assert (img.width, img.height, img.depth) == (1920, 1080, 1)
    vol = Shape.of(4, 5, 6, channels=2)
    assert vol.count == 240 and (vol.width, vol.height, vol.depth, vol.channels) == (6, 5, 4, 2)
    assert str(img) == "1080x1920" and str(vol) == "4x5x6x2ch" and str(Shape.flat(7)) == "7"
    assert Shape.flat(7) == Shape((7,), 1) and img.axis("count") == img.count
    for bad in ((), (1, 2, 3, 4)):
        with pytest.raises(ValueError, match="1 to 3 axes"):
            Shape.of(*bad)
    with pytest.raises(ValueError, match="negative"):
        Shape.of(-1, 3)
    with pytest.raises(ValueError, match="channel"):
        Shape.of(3, channels=0)


def test_size_rules_with_axes_are_checked_when_made() -> None:
    assert shape_of("H", "W").params == ("H", "W") and not shape_of(4, 4).flat_only
    assert like("A").keeps_shape and not like("A", 2).keeps_shape and like("A", 2).flat_only
    assert str(shape_of("H", "W").at("width")) == "width of shape ('H', 'W')"
    with pytest.raises(ValueError, match="1 to 3 axes"):
        shape_of(1, 2, 3, 4)
    with pytest.raises(ValueError, match="axis"):
        shape_of(2, 2).at("colour")


# -- propagation ------------------------------------------------------------------------------------
def test_a_bound_image_shape_flows_through_like_rules_and_flat_blocks_see_counts() -> None:
    g, s = Gain2D(name="g"), Scale(name="s")
    c = _ctx(g, s)
    c.connect(g, "Out", s, "In")
    _bind(c, g, "In", Shape.of(300, 500))
    plan = compile_plan(c.snapshot())
    assert not plan.skipped and not plan.diagnostics
    assert plan.shapes[(g.id, "Out")] == Shape.of(300, 500)
    assert plan.shapes[(s.id, "Out")] == Shape.of(300, 500)  # Scale's like("In") keeps the shape
    (node,) = _kernel_nodes(plan, s)  # a 1-D kernel over the image's element count, as before shapes
    assert (node.grid, node.block, node.yz) == (-(-150_000 // 256), 256, (1, 1, 1, 1))


def test_flat_patches_record_no_shapes() -> None:
    f, s = Fill(name="f", Count=1000), Scale(name="s")
    c = _ctx(f, s)
    c.connect(f, "Out", s, "In")
    plan = compile_plan(c.snapshot())
    assert plan.shapes == {} and all(n.yz == (1, 1, 1, 1) for n in plan.kernel_nodes)


def test_a_computed_rule_can_return_axes() -> None:
    r, t = Ramp2D(name="r", Width=64, Height=32), Transpose2D(name="t", Width=64, Height=32)
    c = _ctx(r, t)
    c.connect(r, "Out", t, "In")
    plan = compile_plan(c.snapshot())
    assert not plan.diagnostics
    assert plan.shapes[(t.id, "Out")] == Shape.of(64, 32)
    assert plan.buffers[plan.outputs[(t.id, "Out")]].count == 64 * 32


# -- 2-D and 3-D launches ---------------------------------------------------------------------------
def test_a_2d_launch_takes_its_block_from_the_kernel_and_fills_width_and_height() -> None:
    g = Gain2D(name="g")
    c = _ctx(g)
    _bind(c, g, "In", Shape.of(100, 257))
    plan = compile_plan(c.snapshot())
    (node,) = _kernel_nodes(plan, g)
    assert node.descriptor.block_dims == (16, 16) and node.descriptor.block_size == 256
    assert (node.grid, node.block) == (17, 16) and node.yz == (7, 1, 16, 1)  # ceil(257/16), ceil(100/16)
    consts = [a.value for a in node.args if a.kind == "const"]
    assert consts == [257, 100]  # width, height: filled without the block binding them
    assert "grid=(17,7,1)x(16,16,1)" in plan.describe()


def test_a_numba_kernel_launches_in_2d_and_gets_width_and_height_from_the_shape() -> None:
    g = NumbaGain2D(name="g")
    c = _ctx(g)
    _bind(c, g, "In", Shape.of(100, 257))
    plan = compile_plan(c.snapshot())
    assert not plan.diagnostics, plan.diagnostics
    (node,) = _kernel_nodes(plan, g)
    assert node.descriptor.block_dims == (16, 16)
    assert (node.grid, node.block) == (17, 16) and node.yz == (7, 1, 16, 1)  # as the CUDA C++ Gain2D
    assert [p.name for p in node.descriptor.parameters][-2:] == ["width", "height"]
    # Numba passes each array as its fields (data, sizes, strides): the two scalars after Gain are last
    assert [(a.kind, a.value) for a in node.args[-2:]] == [("const", 257), ("const", 100)]
    assert [a.value for a in node.args if a.kind == "const" and a.value == 25700] == [25700] * 4  # nitems, shape
    assert plan.shapes[(g.id, "Out")] == Shape.of(100, 257)


def test_2d_and_3d_launches_without_a_per_axis_block_size_use_16x16_and_8x8x8() -> None:
    r2, r3 = Ramp2D(name="r2", Width=33, Height=17), Ramp3D(name="r3", Width=9, Height=8, Depth=17)
    plan = compile_plan(_ctx(r2, r3).snapshot())
    (n2,) = _kernel_nodes(plan, r2)
    (n3,) = _kernel_nodes(plan, r3)
    assert (n2.grid, n2.block, n2.yz) == (3, 16, (2, 1, 16, 1))
    assert (n3.grid, n3.block, n3.yz) == (2, 8, (1, 3, 8, 8))
    assert [a.value for a in n3.args if a.kind == "const"] == [9, 8, 17]
    assert plan.shapes[(r3.id, "Out")] == Shape.of(17, 8, 9)


def test_a_2d_launch_over_a_flat_input_is_an_error_on_the_block() -> None:
    f, g, after = Fill(name="f", Count=1000), Gain2D(name="g"), Scale(name="after")
    c = _ctx(f, g, after)
    c.connect(f, "Out", g, "In")
    c.connect(g, "Out", after, "In")
    plan = compile_plan(c.snapshot())
    assert set(plan.skipped) == {g.id, after.id} and not _kernel_nodes(plan, g)
    d = _diag(plan, g)
    assert d.severity == "error" and d.code == "shape-unresolved"
    assert "'gain2d' launches over 2 axes" in d.message and "(1-D)" in d.message and "'g'" in d.message
    assert _diag(plan, after).code == "input-not-running"  # the usual warning downstream


EMPTY_RAMP = r"""extern "C" __global__ void ramp(float* out, unsigned int width, unsigned int height) {}"""


def _bad_rule(count: int | None, params: dict) -> int:  # noqa: ARG001
    raise ZeroDivisionError("no size for you")


class BadSize(Block):
    type_name = "BadSize"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(CudaSource(code=EMPTY_RAMP, name="r.cu"))
        b.scalar("N", dtype=DType.UINT32, default=4)
        b.output("Out", k.out(0), size=computed(_bad_rule, "N"))
        k.auto_grid(shape_of("N", "N"), dims=2)


def test_a_rule_that_raises_is_an_unresolved_shape_not_a_crash() -> None:
    bad, ok = BadSize(name="bad"), Fill(name="ok")
    plan = compile_plan(_ctx(bad, ok).snapshot())
    assert plan.skipped == (bad.id,) and ok.id in plan.block_nodes
    d = _diag(plan, bad)
    assert d.code == "shape-unresolved" and "ZeroDivisionError: no size for you" in d.message
    assert not any(b.block_id == bad.id for b in plan.buffers)  # nothing half-made


# -- input checks before launch ---------------------------------------------------------------------
def test_a_short_input_is_an_error_and_nothing_launches() -> None:
    a, b = Fill(name="a", Count=1000), Fill(name="b", Count=999)
    add, after = VectorAdd(name="add"), Scale(name="after")
    c = _ctx(a, b, add, after)
    c.connect(a, "Out", add, "A")
    c.connect(b, "Out", add, "B")
    c.connect(add, "Sum", after, "In")
    plan = compile_plan(c.snapshot())
    assert set(plan.skipped) == {add.id, after.id}
    assert not any(getattr(n, "block_id", None) in (add.id, after.id) for n in plan.nodes)
    d = _diag(plan, add)
    assert d.severity == "error" and d.code == "input-short"
    assert "input 'B' holds 999 elements but needs 1000 (like 'A')" in d.message and "'add'" in d.message
    assert {a.id, b.id} <= set(plan.block_nodes)  # the rest of the patch runs


@pytest.mark.parametrize("n_b", [1000, 5000])
def test_inputs_at_least_as_long_as_the_launch_pass(n_b: int) -> None:
    a, b, add = Fill(name="a", Count=1000), Fill(name="b", Count=n_b), VectorAdd(name="add")
    c = _ctx(a, b, add)
    c.connect(a, "Out", add, "A")
    c.connect(b, "Out", add, "B")
    plan = compile_plan(c.snapshot())
    assert not plan.skipped and not plan.diagnostics


def test_a_short_external_binding_is_caught_too() -> None:
    add = VectorAdd(name="add")
    c = _ctx(add)
    _bind(c, add, "A", None, 4096)
    _bind(c, add, "B", None, 17)
    plan = compile_plan(c.snapshot())
    assert plan.skipped == (add.id,) and _diag(plan, add).code == "input-short"


def test_a_wrongly_shaped_image_is_an_error_even_with_enough_elements() -> None:
    t = Transpose2D(name="t", Width=64, Height=32)
    c = _ctx(t)
    _bind(c, t, "In", Shape.of(64, 32))  # 2048 elements, as many as (32, 64), but the other way round
    plan = compile_plan(c.snapshot())
    d = _diag(plan, t)
    assert plan.skipped == (t.id,) and d.code == "input-shape"
    assert "input 'In' has shape 64x32 but needs 32x64" in d.message
    _bind(c, t, "In", Shape.of(32, 64))
    assert not compile_plan(c.snapshot()).skipped
    _bind(c, t, "In", None, 4096)  # a flat buffer long enough: read as the launch's image
    assert not compile_plan(c.snapshot()).skipped
    _bind(c, t, "In", None, 2047)
    assert _diag(compile_plan(c.snapshot()), t).code == "input-short"


class Lookup(Block):
    """Reads ``Table`` by its own bounds: the block opts the input out of the launch check."""

    type_name = "Lookup"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(
            CudaSource(
                code='extern "C" __global__ void lut(const float* in, const float* table, float* out, unsigned n) {}',
                name="lut.cu",
            )
        )
        b.input("In", k.in_(0))
        b.input("Table", k.in_(1), needs=None)
        b.output("Out", k.out(2), size=like("In"))
        k.auto_grid(like("In"), count_param=3)


def test_needs_none_opts_an_input_out_and_needs_a_rule_sets_it() -> None:
    lut = Lookup(name="lut")
    assert lut.description.input("Table").needs == ()
    assert lut.description.input("In").needs == (like("In").at("count"),)  # a 1-D launch: elements only
    c = _ctx(lut)
    _bind(c, lut, "In", None, 100_000)
    _bind(c, lut, "Table", None, 16)
    assert not compile_plan(c.snapshot()).skipped


def test_plan_time_checks_follow_a_rebinding() -> None:
    # A binding that shrinks is a structural change: the next plan checks it again.
    add = VectorAdd(name="add")
    c = _ctx(add)
    _bind(c, add, "A", None, 256)
    _bind(c, add, "B", None, 256)
    assert not compile_plan(c.snapshot()).skipped
    _bind(c, add, "B", None, 255)
    assert compile_plan(c.snapshot()).skipped == (add.id,)


# -- bindings carry shapes --------------------------------------------------------------------------
class _Cai:
    """Only the ``__cuda_array_interface__`` of an array (no memory: the plan never reads it)."""

    def __init__(self, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (PTR, False), "version": 3}


def test_array_bindings_carry_their_shape() -> None:
    b = binding_from_cai(_Cai((480, 640), "<f4"), DType.FLOAT32, "blk", "In")
    assert b.count == 480 * 640 and b.shape == Shape.of(480, 640)
    b = binding_from_cai(_Cai((480, 640, 4), "<f4"), DType.FLOAT4, "blk", "In")  # the lanes are no axis
    assert b.count == 480 * 640 and b.shape == Shape.of(480, 640)
    b = binding_from_cai(_Cai((480, 640, 4), "|u1"), DType.UCHAR4, "blk", "In")
    assert b.count == 480 * 640 and b.shape == Shape.of(480, 640)
    assert binding_from_cai(_Cai((1000,), "<f4"), DType.FLOAT32, "blk", "In").shape is None
    b = binding_from_cai(_Cai((4, 8), "<i2"), DType.BFLOAT16, "blk", "In")  # bfloat16 bits viewed as int16
    assert b.dtype is DType.BFLOAT16 and b.count == 32


def test_a_new_shape_of_the_same_size_is_structural() -> None:
    g = Gain2D(name="g")
    c = _ctx(g)
    _bind(c, g, "In", Shape.of(10, 20))
    c.dirty.clear_structure()
    _bind(c, g, "In", Shape.of(10, 20))  # the same shape again: no rebuild
    assert c.dirty.tier != "structure"
    _bind(c, g, "In", Shape.of(20, 10))
    assert c.dirty.tier == "structure"
    plan = compile_plan(c.snapshot())
    (node,) = _kernel_nodes(plan, g)
    assert (node.grid, node.yz[0]) == (1, 2)  # width 10 -> 1 block, height 20 -> 2 blocks


def test_the_builder_refuses_mismatched_launch_axes() -> None:
    class Wrong(Block):
        type_name = "Wrong"

        def describe(self, b: BlockBuilder) -> None:
            k = b.add_kernel(CudaSource(code=GAIN_2D, name="g.cu"))
            b.input("In", k.in_(0))
            b.output("Out", k.out(1), size=like("In"))
            b.scalar("Gain", k.in_(2), default=1.0)
            k.auto_grid(like("In"), dims=3)

    with pytest.raises(CudapatchError, match="3-D launch, but the kernel's blockSize has 2 axes"):
        Wrong(name="w")


def test_numpy_reference_of_the_ramp_is_what_the_gpu_test_checks() -> None:
    # The GPU test compares against this; here it is pinned so both agree on the axis order.
    h, w = 3, 4
    ref = np.arange(w)[None, :] + 1000.0 * np.arange(h)[:, None]
    assert ref.shape == (h, w) and ref[2, 3] == 2003.0


# -- the image blocks -------------------------------------------------------------------------------
def test_an_image_chain_plans_with_2d_launches_and_shapes() -> None:
    from cudapatch.blocks.library import Blur, ColorMap, Mix, Pattern, Resample, Threshold

    src = Pattern(name="src", Width=1920, Height=1080)
    blur, small = Blur(name="blur", Radius=6), Resample(name="small", Width=640, Height=360)
    thr, cmap, mix = Threshold(name="thr"), ColorMap(name="cmap"), Mix(name="mix", Amount=0.25)
    c = _ctx(src, blur, small, thr, cmap, mix)
    c.connect(src, "Out", blur, "In")
    c.connect(blur, "Out", small, "In")
    c.connect(small, "Out", thr, "In")
    c.connect(small, "Out", cmap, "In")
    c.connect(thr, "Out", mix, "A")
    c.connect(cmap, "Out", mix, "B")
    plan = compile_plan(c.snapshot())
    assert not plan.diagnostics and not plan.skipped
    assert plan.shapes[(blur.id, "Out")] == Shape.of(1080, 1920)
    assert all(plan.shapes[(b.id, "Out")] == Shape.of(360, 640) for b in (small, thr, cmap, mix))
    weights, h, v = _kernel_nodes(plan, blur)
    assert (weights.grid, weights.yz) == (1, (1, 1, 1, 1))
    assert (h.grid, h.block, h.yz) == (120, 16, (68, 1, 16, 1)) and v.yz == h.yz
    assert [a.value for a in h.args if a.kind == "const"] == [1920, 1080]
    (rs,) = _kernel_nodes(plan, small)
    assert [a.value for a in rs.args if a.kind == "const"] == [1920, 1080, 640, 360]  # in, then out axes
    assert {b.label: b.dtype for b in plan.memory.values if b.block_id == blur.id} == {  # values: buffers may be shared
        "Out": DType.UCHAR4,
        "internal0": DType.UCHAR4,  # the horizontal pass
        "internal1": DType.FLOAT32,  # the weights
    }


def test_mix_refuses_images_of_other_shapes() -> None:
    from cudapatch.blocks.library import Mix, Pattern

    a, b = Pattern(name="a", Width=64, Height=32), Pattern(name="b", Width=32, Height=64)
    mix = Mix(name="mix")
    c = _ctx(a, b, mix)
    c.connect(a, "Out", mix, "A")
    c.connect(b, "Out", mix, "B")
    d = _diag(compile_plan(c.snapshot()), mix)
    assert d.code == "input-shape" and "input 'B' has shape 64x32 but needs 32x64" in d.message


def test_image_blocks_take_rgba32f_and_refuse_other_formats() -> None:
    from cudapatch.blocks.library import Blur

    assert Blur(name="f", Format="rgba32f").description.input("In").dtype is DType.FLOAT4
    with pytest.raises(CudapatchError, match="unknown pixel format 'rgb565'"):
        Blur(name="bad", Format="rgb565")


@pytest.mark.parametrize("seed", range(8))
def test_random_image_patches_keep_shapes_and_counts_consistent(seed: int) -> None:
    """Seeded random patches of 2-D and flat blocks, with random bound shapes: every running block's
    outputs have buffers of their shape's count, every launch covers its shape, and a block is
    refused exactly when an input is shorter than its launch or a 2-D launch meets flat data."""
    import random

    rng = random.Random(seed)
    c = Context()
    sources: dict[tuple[int, str], object] = {}  # (block, input) -> (src block, port) or a bound Shape
    blocks: list[Block] = []
    for i in range(24):
        kind = rng.choice(["gain", "scale", "add", "add"])
        blk: Block = {"gain": Gain2D, "scale": Scale, "add": VectorAdd}[kind](name=f"b{i}")
        c.register_block(blk)
        for port in blk.description.inputs:
            if blocks and rng.random() < 0.7:
                src = rng.choice(blocks)
                sp = src.description.outputs[0].name
                c.connect(src, sp, blk, port.name)
                sources[(blk.id, port.name)] = (src, sp)
            else:
                h, w = rng.choice([(4, 8), (8, 4), (4, 4), (16, 2)])
                shape = Shape.of(h, w) if rng.random() < 0.8 else None
                _bind(c, blk, port.name, shape, h * w)
                sources[(blk.id, port.name)] = shape or Shape.flat(h * w)
        blocks.append(blk)
    plan = compile_plan(c.snapshot())
    shapes: dict[int, Shape] = {}
    errors = {d.block_id: d.code for d in plan.diagnostics if d.severity == "error"}
    for blk in blocks:  # in registration order, which is a topological order here
        ins = {}
        for port in blk.description.inputs:
            src = sources[(blk.id, port.name)]
            ins[port.name] = src if isinstance(src, Shape) else shapes.get(src[0].id)  # type: ignore[index]
        if any(v is None for v in ins.values()):  # reads a block that is not running
            assert blk.id in plan.skipped and blk.id not in errors
            continue
        if isinstance(blk, VectorAdd):
            expect = "input-short" if ins["B"].count < ins["A"].count else None
        elif isinstance(blk, Gain2D):
            expect = "shape-unresolved" if ins["In"].ndim != 2 else None
        else:
            expect = None
        assert errors.get(blk.id) == expect, (blk.name, ins, plan.diagnostics)
        if expect is not None:
            assert blk.id in plan.skipped and not _kernel_nodes(plan, blk)
            continue
        (port,) = blk.description.outputs
        buf = plan.memory.values[plan.memory.ports[(blk.id, port.name)]]  # the value (buffers may be shared)
        shape = plan.shapes.get((blk.id, port.name), Shape.flat(buf.count))
        first = ins["A"] if "A" in ins else ins["In"]
        assert shape == first and buf.count == shape.count  # like("In") / like("A") keep the shape
        shapes[blk.id] = shape
        (node,) = _kernel_nodes(plan, blk)
        gy, _gz, by, _bz = node.yz
        if isinstance(blk, Gain2D):  # a 2-D launch covers the image's axes
            assert node.grid * node.block >= shape.width and gy * by >= shape.height
        else:
            assert node.yz == (1, 1, 1, 1) and node.grid * node.block >= shape.count


def test_a_probe_on_a_2d_output_reads_it_as_an_image_by_its_shape() -> None:
    from cudapatch.engine.plan import ProbeNodePlan

    g = Gain2D(name="g")  # no Width/Height parameters: only the planned shape says it is an image
    c = _ctx(g)
    _bind(c, g, "In", Shape.of(48, 80))
    c.add_probe(g, "Out")
    plan = compile_plan(c.snapshot())
    (probe,) = [n for n in plan.nodes if isinstance(n, ProbeNodePlan)]
    assert (probe.width, probe.height, probe.channels) == (80, 48, 1)
