"""The 8/16-bit, half, bfloat16 and vector element types, and per-axis block sizes, in sidecars, CUDA
C++ signatures, Numba signatures, parameter slots and bindings."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest

from cudapatch import CudaSource, DType, NumbaSource
from cudapatch.errors import KernelCompileError, KernelLoadError, SidecarError
from cudapatch.kernels import parse_sidecar, parse_type_name
from cudapatch.kernels.descriptor import descriptor_to_json
from cudapatch.kernels.signature import describe_cuda_source
from cudapatch.kernels.types import bfloat16_bits, bfloat16_values, c_half

NEW_TYPES = {
    "char": (DType.INT8, 1, np.int8),
    "uchar": (DType.UINT8, 1, np.uint8),
    "short": (DType.INT16, 2, np.int16),
    "ushort": (DType.UINT16, 2, np.uint16),
    "half": (DType.FLOAT16, 2, np.float16),
    "bfloat16": (DType.BFLOAT16, 2, np.uint16),
    "float2": (DType.FLOAT2, 8, np.float32),
    "float3": (DType.FLOAT3, 12, np.float32),
    "float4": (DType.FLOAT4, 16, np.float32),
    "uchar4": (DType.UCHAR4, 4, np.uint8),
}


@pytest.mark.parametrize("name", NEW_TYPES)
def test_each_type_has_its_size_and_numpy_lane(name: str) -> None:
    dtype, size, lane = NEW_TYPES[name]
    assert DType.from_c_name(name) is dtype and dtype.itemsize == size and dtype.base == np.dtype(lane)
    assert parse_type_name(f"const {name}*") == (dtype, True)


@pytest.mark.parametrize(
    ("alias", "dtype"),
    [
        ("signed char", DType.INT8),
        ("int8_t", DType.INT8),
        ("unsigned char", DType.UINT8),
        ("int16_t", DType.INT16),
        ("unsigned short", DType.UINT16),
        ("uint16_t", DType.UINT16),
        ("__half", DType.FLOAT16),
        ("float16", DType.FLOAT16),
        ("__nv_bfloat16", DType.BFLOAT16),
    ],
)
def test_c_and_numpy_spellings(alias: str, dtype: DType) -> None:
    assert DType.from_c_name(alias) is dtype


def test_numpy_lookups_stay_unambiguous() -> None:
    assert DType.from_numpy(np.uint16) is DType.UINT16  # not BFLOAT16, which stores its bits as uint16
    assert DType.from_numpy(np.float16) is DType.FLOAT16 and DType.from_numpy(np.int8) is DType.INT8
    assert DType.BFLOAT16.accepts(np.dtype(np.int16)) and DType.BFLOAT16.is_float
    assert not DType.UINT16.accepts(np.dtype(np.int16)) and not DType.UINT16.is_float


def test_bfloat16_bits_round_to_nearest_even() -> None:
    x = np.array([1.0, -2.5, 3.14159265, 65504.0, 1e-3], np.float32)
    back = bfloat16_values(bfloat16_bits(x))
    assert back.dtype == np.float32
    np.testing.assert_allclose(back, x, rtol=2**-8)
    assert bfloat16_bits([1.0]).tolist() == [0x3F80] and bfloat16_bits([1.0 + 2**-8]).tolist() == [0x3F80]  # tie: even


def test_a_half_parameter_slot_reads_and_writes_floats() -> None:
    raw = (ctypes.c_uint8 * 4)()
    slot = c_half.from_buffer(raw, 2)
    slot.value = 1.5
    assert slot.value == 1.5 and bytes(raw)[2:] == np.float16(1.5).tobytes()


def _sidecar(type_name: str, block_size: object = 256) -> str:
    return json.dumps(
        {
            "entryPoint": "k",
            "blockSize": block_size,
            "parameters": [
                {"name": "data", "type": f"{type_name}*", "direction": "inout"},
                {"name": "n", "type": "uint"},
            ],
        },
        indent=2,
    )


@pytest.mark.parametrize("name", NEW_TYPES)
def test_sidecars_take_the_new_types(name: str) -> None:
    desc = parse_sidecar(_sidecar(name))
    assert desc.parameters[0].dtype is NEW_TYPES[name][0]


def test_an_unknown_type_in_a_sidecar_names_file_and_line() -> None:
    with pytest.raises(SidecarError) as exc:
        parse_sidecar(_sidecar("float5"), file="k.json")
    assert exc.value.file == "k.json" and exc.value.line == 6 and "unknown type 'float5*'" in str(exc.value)


def test_a_by_value_bfloat16_is_refused_with_its_line() -> None:
    text = _sidecar("half").replace('"uint"', '"bfloat16"')
    with pytest.raises(SidecarError, match="bfloat16 is a buffer type") as exc:
        parse_sidecar(text, file="k.json")
    assert exc.value.line == 11


# -- block sizes per axis ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("given", "threads", "axes"), [(128, 128, ()), ([16, 16], 256, (16, 16)), ([8, 8, 8], 512, (8, 8, 8))]
)
def test_block_size_is_a_number_or_one_per_axis(given: object, threads: int, axes: tuple) -> None:
    desc = parse_sidecar(_sidecar("float", given))
    assert desc.block_size == threads and desc.block_dims == axes
    assert parse_sidecar(descriptor_to_json(desc)) == desc  # written back as given


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (0, "integer in 1..1024"),
        (2048, "integer in 1..1024"),
        ([0, 16], "1 to 3 integers of at least 1"),
        ([64, 32], "2048 threads: a block has at most 1024"),
        ([2, 2, 2, 2], "1 to 3 integers"),
        ([16, 16.5], "1 to 3 integers"),
    ],
)
def test_a_bad_block_size_names_file_and_line(given: object, message: str) -> None:
    with pytest.raises(SidecarError, match=message.replace("(", r"\(")) as exc:
        parse_sidecar(_sidecar("float", given), file="k.json")
    assert exc.value.file == "k.json" and exc.value.line == 3


def test_launch_blocks_for_each_axis_count() -> None:
    desc = parse_sidecar(_sidecar("float", 128))
    assert desc.launch_block(1) == (128, 1, 1)
    assert desc.launch_block(2) == (16, 16, 1) and desc.launch_block(3) == (8, 8, 8)
    assert parse_sidecar(_sidecar("float", [32, 8])).launch_block(2) == (32, 8, 1)


# -- CUDA C++ and Numba signatures ------------------------------------------------------------------
SIG = """#include <cuda_fp16.h>
#include <cuda_bf16.h>
// cudapatch: blockSize=32x8
extern "C" __global__ void mix(const signed char* a, const unsigned short* b, const __half* c,
                               const __nv_bfloat16* d, uchar4* out, __half gain, short bias, unsigned int width)
{}
"""


def test_cuda_signatures_read_the_new_types_and_a_per_axis_block() -> None:
    desc = describe_cuda_source(SIG)
    types = [(p.dtype, p.is_pointer, p.direction) for p in desc.parameters]
    assert types == [
        (DType.INT8, True, "in"),
        (DType.UINT16, True, "in"),
        (DType.FLOAT16, True, "in"),
        (DType.BFLOAT16, True, "in"),
        (DType.UCHAR4, True, "out"),
        (DType.FLOAT16, False, "in"),
        (DType.INT16, False, "in"),
        (DType.UINT32, False, "in"),
    ]
    assert desc.block_dims == (32, 8) and desc.block_size == 256
    assert [p.size for p in desc.parameters[5:]] == [2, 2, 4]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("// cudapatch: blockSize=0", "integer in 1..1024"),
        ("// cudapatch: blockSize=64x32", "2048 threads"),
        ("// cudapatch: blockSize=16x0", "at least 1"),
        ("// cudapatch: blockSize=16xx16", "is not an integer"),
    ],
)
def test_bad_block_sizes_in_cuda_source_name_file_and_line(line: str, message: str) -> None:
    code = f'\n\n{line}\nextern "C" __global__ void k(float* out) {{}}\n'
    with pytest.raises(KernelCompileError, match=message) as exc:
        describe_cuda_source(code, file="k.cu")
    assert exc.value.file == "k.cu" and exc.value.line == 3


def test_unknown_types_in_cuda_signatures_name_file_and_line() -> None:
    code = '\nextern "C" __global__ void k(const half3* in, float* out) {}\n'
    with pytest.raises(KernelCompileError, match="type 'half3'") as exc:
        describe_cuda_source(code, file="k.cu")
    assert exc.value.line == 2
    with pytest.raises(KernelCompileError, match="bfloat16 is a buffer type"):
        describe_cuda_source('extern "C" __global__ void k(float* out, __nv_bfloat16 g) {}')
    assert (
        CudaSource(code='extern "C" __global__ void k(const char* in, char* out) {}').describe().parameters[0].dtype
        is DType.INT8
    )


def _nb(src, dst, n):  # noqa: ANN001 - a Numba kernel, described only
    pass


@pytest.mark.parametrize("name", ["int8", "uint8", "int16", "uint16", "float16"])
def test_numba_signatures_take_8_and_16_bit_types(name: str) -> None:
    desc = NumbaSource(_nb, (f"{name}[:]", f"{name}[:]", "uint32"), outputs=("dst",)).describe()
    assert desc.parameters[0].dtype is DType.from_numpy(np.dtype(name)) and desc.parameters[1].direction == "out"


def test_numba_refuses_bfloat16_and_bad_block_sizes_clearly() -> None:
    with pytest.raises(KernelLoadError, match="Numba has no bfloat16"):
        NumbaSource(_nb, ("bfloat16[:]", "bfloat16[:]", "uint32")).describe()
    with pytest.raises(KernelLoadError, match="2048 threads"):
        NumbaSource(_nb, ("float32[:]", "float32[:]", "uint32"), block_size=(64, 32)).describe()
    desc = NumbaSource(_nb, ("float32[:]", "float32[:]", "uint32"), block_size=(16, 16)).describe()
    assert desc.block_dims == (16, 16) and desc.block_size == 256


@pytest.mark.parametrize(
    ("spelled", "dtype"),
    [
        ("float32x2", DType.FLOAT2),
        ("float2", DType.FLOAT2),
        ("float32x3", DType.FLOAT3),
        ("float3", DType.FLOAT3),
        ("float32x4", DType.FLOAT4),
        ("float4", DType.FLOAT4),
        ("uint8x4", DType.UCHAR4),
        ("uchar4", DType.UCHAR4),
        ("float64x2", DType.DOUBLE2),
        ("int32x4", DType.INT4),
    ],
)
def test_numba_signatures_take_arrays_of_vector_types(spelled: str, dtype: DType) -> None:
    desc = NumbaSource(_nb, (f"{spelled}[:]", f"{spelled}[::1]", "uint32"), outputs=("dst",)).describe()
    assert [p.dtype for p in desc.parameters[:2]] == [dtype, dtype] and desc.parameters[0].is_pointer
    assert len(desc.abi) == 2 * 7 + 1  # Numba's array ABI, as for scalar arrays


def test_numba_vector_type_objects_are_read_like_their_names() -> None:
    pytest.importorskip("numba.cuda")
    from numba.cuda import types
    from numba.cuda.vector_types import vector_types

    f4, rgba = vector_types["float32x4"], vector_types["uint8x4"]
    desc = NumbaSource(_nb, (types.Array(f4, 1, "C"), types.Array(rgba, 1, "C"), "uint32")).describe()
    assert [p.dtype for p in desc.parameters[:2]] == [DType.FLOAT4, DType.UCHAR4]


def test_by_value_vectors_and_a_numba_without_vector_types_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from cudapatch import Block, BlockBuilder
    from cudapatch.kernels import numba_source

    with pytest.raises(KernelLoadError, match="argument 'n' of _nb: a by-value float32x4 argument is not supported"):
        NumbaSource(_nb, ("float32x4[:]", "float32x4[:]", "float4")).describe()

    class ByValue(Block):
        type_name = "ByValueVector"

        def describe(self, b: BlockBuilder) -> None:
            b.add_kernel(NumbaSource(_nb, ("float32[:]", "float32[:]", "uint8x4")))

    with pytest.raises(KernelLoadError, match="by-value uint8x4 argument .* its 4 lanes as uint8 scalars") as err:
        ByValue(name="bv")
    assert err.value.block == "bv"  # the block is named, with the argument
    monkeypatch.setattr(numba_source, "_numba_vector_types", lambda: None)
    no_vectors = r"this Numba has no CUDA vector types \(float32x4\).*float32\[:\] with 4"
    with pytest.raises(KernelLoadError, match=no_vectors):
        NumbaSource(_nb, ("float32x4[:]", "float32[:]", "uint32"), block_size=128).describe()


def test_numba_vector_arrays_fill_the_abi_with_the_vector_itemsize() -> None:
    from cudapatch import Shape
    from cudapatch.engine import Context, ExternalBinding, KernelNodePlan
    from tests.unit.shape_blocks import NumbaLength3, NumbaRgbaInvert, NumbaSwizzle4
    from tests.unit.unfused import compile_plan

    cases = [
        (NumbaSwizzle4(name="s"), DType.FLOAT4, Shape.flat(1000), 16),
        (NumbaRgbaInvert(name="r"), DType.UCHAR4, Shape.of(90, 160), 4),
        (NumbaLength3(name="l"), DType.FLOAT3, Shape.flat(777), 12),
    ]
    for block, dtype, shape, itemsize in cases:
        c = Context()
        c.register_block(block)
        c.bind_input(block, "In", ExternalBinding(0x7000_0000, shape.count, dtype, shape=shape))
        plan = compile_plan(c.snapshot())
        assert not plan.diagnostics, plan.diagnostics
        (node,) = [n for n in plan.nodes if isinstance(n, KernelNodePlan)]
        src = node.args[:7]  # meminfo parent nitems itemsize data shape0 stride0
        assert [a.value for a in src if a.kind == "const"] == [0, 0, shape.count, itemsize, shape.count, itemsize]
        out_dtype = block.description.output("Out").dtype
        assert out_dtype is (DType.FLOAT32 if dtype is DType.FLOAT3 else dtype)
        assert plan.shapes.get((block.id, "Out"), Shape.flat(shape.count)) == shape


@pytest.mark.parametrize("cls_name", ["NumbaSwizzle4", "NumbaRgbaInvert", "NumbaLength3"])
def test_numba_kernels_over_vector_arrays_compile(cls_name: str) -> None:
    pytest.importorskip("numba.cuda")
    from tests.unit import shape_blocks

    block = getattr(shape_blocks, cls_name)(name="v")
    (kernel,) = block.description.kernels
    assert kernel.source.compile("sm_90").image  # Numba -> PTX -> nvJitLink, checked against the descriptor


# -- GL formats and the preview's choice -------------------------------------------------------------
def test_each_image_element_type_has_a_texture_texel_for_texel() -> None:
    from cudapatch.interop.formats import TEXTURE_FORMATS, texture_format_for

    expect = {
        DType.UCHAR4: "rgba8",
        DType.UINT32: "rgba8",
        DType.FLOAT4: "rgba32f",
        DType.FLOAT32: "r32f",
        DType.FLOAT16: "r16f",
        DType.UINT8: "r8",
        DType.UINT16: "r16",
        DType.FLOAT2: "rg32f",
    }
    for dtype, name in expect.items():
        fmt = texture_format_for(dtype)
        assert fmt is not None and fmt.name == name and fmt.texel_bytes == dtype.itemsize, dtype
    assert texture_format_for(DType.UINT8, 4).name == "rgba8" and texture_format_for(DType.FLOAT16, 4).name == "rgba16f"
    for dtype in (DType.FLOAT3, DType.FLOAT64, DType.BFLOAT16, DType.INT8):
        assert texture_format_for(dtype) is None  # converted: test_types_without_a_texture_are_converted...
    assert len({f.internal for f in TEXTURE_FORMATS.values()}) == len(TEXTURE_FORMATS)


def test_the_preview_sizes_an_image_from_the_output_shape() -> None:
    from cudapatch import Shape
    from cudapatch.errors import InteropError
    from cudapatch.interop.preview import _image_spec
    from tests.unit.shape_blocks import Copy, Ramp2D

    class _Engine:  # what _image_spec asks of the engine: the running graph's output shape
        def __init__(self, shape: Shape) -> None:
            self.shape = shape

        def output_shape(self, block, port):  # noqa: ANN001, ANN201
            return self.shape

    ramp = Ramp2D(name="ramp")
    assert _image_spec(_Engine(Shape.of(480, 640)), (ramp, "Out")) == (ramp, "Out", 640, 480, "r32f", 1)
    assert _image_spec(_Engine(Shape.flat(9)), (ramp, "Out", 3, 3))[2:] == (3, 3, "r32f", 1)
    with pytest.raises(InteropError, match="has shape 1000; show a 2-D output"):
        _image_spec(_Engine(Shape.flat(1000)), (ramp, "Out"))
    bf = Copy(name="bf", Type="bfloat16")  # converted into R32F, float3 into RGBA32F
    assert _image_spec(_Engine(Shape.of(4, 6)), (bf, "Out")) == (bf, "Out", 6, 4, "r32f", 1)
    f3 = Copy(name="f3", Type="float3")
    assert _image_spec(_Engine(Shape.of(4, 6)), (f3, "Out"))[4:] == ("rgba32f", 1)
    assert _image_spec(_Engine(Shape.of(4, 6, channels=3)), (bf, "Out"))[4:] == ("rgba32f", 3)
    assert _image_spec(_Engine(Shape.of(4, 6, channels=4)), (bf, "Out"))[4:] == ("rgba32f", 4)
    rgba = Copy(name="rgba", Type="uchar4")
    with pytest.raises(InteropError, match="holds uchar4 x2, which the preview does not show"):
        _image_spec(_Engine(Shape.of(4, 6, channels=2)), (rgba, "Out"))


def test_types_without_a_texture_are_converted_to_floats() -> None:
    from cudapatch.interop.formats import conversion_for

    expect = {
        (DType.INT8, 1): ("r32f", "signed char", 1),
        (DType.INT16, 1): ("r32f", "short", 1),
        (DType.BFLOAT16, 1): ("r32f", "unsigned short", 1),
        (DType.FLOAT64, 1): ("r32f", "double", 1),
        (DType.FLOAT3, 1): ("rgba32f", "float", 3),
        (DType.INT8, 4): ("rgba32f", "signed char", 4),
        (DType.BFLOAT16, 2): ("rgba32f", "unsigned short", 2),
        (DType.UINT8, 3): ("rgba32f", "unsigned char", 3),
        (DType.FLOAT32, 3): ("rgba32f", "float", 3),
        (DType.FLOAT16, 3): ("rgba32f", "unsigned short", 3),
    }
    for (dtype, channels), want in expect.items():
        conv = conversion_for(dtype, channels)
        assert conv is not None and conv[:3] == want, (dtype, channels)
    assert "/ 127.0f, -1.0f" in conversion_for(DType.INT8).to_float  # SNORM, as GL reads signed normalized data
    for dtype, channels in (
        (DType.UCHAR4, 1),
        (DType.FLOAT32, 1),
        (DType.INT32, 1),
        (DType.UINT64, 1),
        (DType.FLOAT4, 2),
    ):
        assert conversion_for(dtype, channels) is None, dtype  # a texture holds it, or nothing shows it


@pytest.mark.parametrize(
    ("type_name", "channels"),
    [("char", 1), ("short", 1), ("bfloat16", 1), ("float3", 1), ("double", 1), ("char", 4), ("half", 3), ("uchar", 3)],
)
def test_the_conversion_writer_compiles_for_each_converted_type(type_name: str, channels: int) -> None:
    from cudapatch.interop.gl_writers import GlConvertWriter

    w = GlConvertWriter(name="w", Type=type_name, Channels=str(channels))
    (port,) = w.description.inputs
    assert port.dtype is DType.from_c_name(type_name)  # takes the output's own type: links type-check
    assert [p.name for p in w.description.params if p.kind == "scalar"] == ["Surface", "Width", "Height"]
    (kernel,) = w.description.kernels
    code = kernel.source.text()
    texture = "v4.b32" if channels * DType.from_c_name(type_name).lanes > 1 else "sust.b.2d.b32"
    assert texture in code and "VALUES" not in code and "LANE" not in code
    assert kernel.source.compile("sm_90").image  # NVRTC


def test_a_type_nothing_shows_is_a_block_error_of_the_conversion_writer() -> None:
    from cudapatch.errors import CudapatchError
    from cudapatch.interop.gl_writers import GlConvertWriter

    with pytest.raises(CudapatchError, match="block 'w': no conversion shows int x1 images"):
        GlConvertWriter(name="w", Type="int")


def test_gl_writers_spell_every_element_type_for_cuda() -> None:
    from cudapatch.interop.gl_writers import ring_writer_source
    from cudapatch.kernels.types import cuda_spelling

    builtin = {"float", "double", "int", "float2", "float3", "float4", "double2", "int2", "int4", "uint4", "uchar4"}
    headers = {"__half": "#include <cuda_fp16.h>\n", "__nv_bfloat16": "#include <cuda_bf16.h>\n"}
    for dtype in DType:
        spelled, header = cuda_spelling(dtype)
        if spelled in headers:  # 16-bit floats keep their type (the writer's port takes the output's type)
            assert header == headers[spelled], dtype
        else:
            assert spelled in builtin or spelled.split()[0] in ("unsigned", "signed", "long", "short"), (dtype, spelled)
            assert header == "", dtype
        code = ring_writer_source(dtype)
        assert code.startswith(header) and f"const {spelled}* in" in code, dtype


def test_a_device_array_keeps_a_shape_for_the_isolated_child() -> None:
    from cudapatch import Shape
    from cudapatch.engine.bindings import DeviceArray, binding_from_cai

    arr = DeviceArray(0x1000, 480 * 640, DType.FLOAT4, shape=Shape.of(480, 640))
    assert arr.__cuda_array_interface__["shape"] == (480, 640, 4)
    assert binding_from_cai(arr, DType.FLOAT4, "b", "In").shape == Shape.of(480, 640)
    flat = DeviceArray(0x1000, 100, DType.FLOAT32)
    assert flat.__cuda_array_interface__["shape"] == (100,)
