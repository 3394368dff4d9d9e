"""Blocks that generate their kernel for an element type (FrameDelay, Upload, Download, the GL
writers) spell every type so NVRTC compiles it and the signature parser reads it back as the same
type: a ``half`` FrameDelay has ``half`` ports, and its kernel compiles."""

from __future__ import annotations

import pytest

from cudapatch.blocks.library.feedback import FrameDelay
from cudapatch.blocks.library.transfer import Download, Upload
from cudapatch.blocks.parameter import coerce_scalar
from cudapatch.errors import ParameterError
from cudapatch.interop.gl_writers import GlBufferWriter, GlRingWriter, GlSurfaceWriter
from cudapatch.kernels.types import DType, cuda_spelling

# bfloat16 is a buffer type only: FrameDelay's by-value Fill cannot take one
TYPED = [(FrameDelay, d) for d in DType if d is not DType.BFLOAT16]
TYPED += [(cls, d) for cls in (Upload, Download, GlBufferWriter, GlRingWriter) for d in DType]


def _block(cls: type, dtype: DType):  # noqa: ANN202 - any of the blocks above
    return cls(Type=dtype.c_name)


@pytest.mark.parametrize(("cls", "dtype"), TYPED, ids=lambda v: getattr(v, "__name__", None) or v.c_name)
def test_ports_carry_the_type_named(cls: type, dtype: DType) -> None:
    d = _block(cls, dtype).description
    ports = [p for p in (*d.inputs, *d.outputs) if p.name in ("In", "Out")]
    assert ports and all(p.dtype is dtype for p in ports)


@pytest.mark.parametrize("dtype", [DType.UINT16, DType.FLOAT16, DType.INT8, DType.UCHAR4, DType.BFLOAT16])
def test_generated_kernels_compile_with_nvrtc(dtype: DType) -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    from cudapatch.kernels._toolchain import nvrtc_compile

    blocks = [_block(cls, dtype) for cls in (Upload, Download, GlBufferWriter, GlRingWriter)]
    if dtype is not DType.BFLOAT16:
        blocks.append(_block(FrameDelay, dtype))
    if dtype.itemsize == 4:
        blocks.append(GlSurfaceWriter(Type=dtype.c_name, Texel="4"))
    for block in blocks:
        for kernel in block.description.kernels:
            source = kernel.source
            cubin, _symbol, _log = nvrtc_compile(
                source.code, name=source.debug_name, entry=source.describe().entry_point, arch="sm_90"
            )
            assert cubin[:4] == b"\x7fELF", block


def test_spelling_names_its_header() -> None:
    assert cuda_spelling(DType.FLOAT16) == ("__half", "#include <cuda_fp16.h>\n")
    assert cuda_spelling(DType.UINT32) == ("unsigned int", "")
    assert cuda_spelling(DType.FLOAT4) == ("float4", "")


@pytest.mark.parametrize(
    ("dtype", "lo", "hi"), [(DType.INT8, -128, 127), (DType.UINT16, 0, 65535), (DType.INT16, -32768, 32767)]
)
def test_small_integer_scalars_are_range_checked(dtype: DType, lo: int, hi: int) -> None:
    assert coerce_scalar(lo, dtype) == lo and coerce_scalar(hi, dtype) == hi
    with pytest.raises(ParameterError, match="does not fit"):
        coerce_scalar(hi + 1, dtype)
    assert coerce_scalar((1, 2, 3, 255), DType.UCHAR4) == (1, 2, 3, 255)
