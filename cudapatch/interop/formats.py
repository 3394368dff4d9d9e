"""GL texture formats for element types: which texture shows a 2-D output of each dtype.

Pure data (no GL import): ``shared.SharedTexture2D`` creates and registers the textures, the preview
picks one here for the output it shows. One element of the output is one texel (a vector type's
lanes are the texel's channels), so the image needs no conversion kernel: ``uchar4`` is RGBA8,
``float4`` RGBA32F, ``half`` R16F. Single-channel textures are shown grey (the preview swizzles
red into green and blue).

Types no GL texture holds texel for texel (signed 8/16-bit, bfloat16, float3, double, or 2 to 4
interleaved channels of a scalar type without a format) are shown through a conversion
(``conversion_for``): a writer kernel in the graph turns each pixel into floats and stores them in an
R32F texture (one value) or an RGBA32F one (2 to 4 values; missing blue is 0, missing alpha 1). GL has
SNORM formats for signed data, but CUDA cannot register them (``cuGraphicsGLRegisterImage`` takes
8/16-bit UNORM, 16F/32F and integer formats), so signed values convert like SNORM: ``v / 127`` or
``v / 32767``, at least -1 (negative values show black, as an SNORM texture would).
"""

from __future__ import annotations

from typing import NamedTuple

from ..kernels.types import DType

__all__ = ["Conversion", "TextureFormat", "TEXTURE_FORMATS", "conversion_for", "texture_format_for"]


class TextureFormat(NamedTuple):
    """A GL texture format: ``name``, bytes per texel, internal format, and the GL format and type
    of its pixel data."""

    name: str
    texel_bytes: int
    internal: int
    gl_format: int
    gl_type: int
    channels: int


_RED, _RG, _RGBA = 0x1903, 0x8227, 0x1908
_UBYTE, _USHORT, _FLOAT, _HALF = 0x1401, 0x1403, 0x1406, 0x140B

#: Every texture format the interop creates and registers, by name.
TEXTURE_FORMATS: dict[str, TextureFormat] = {
    f.name: f
    for f in (
        TextureFormat("rgba8", 4, 0x8058, _RGBA, _UBYTE, 4),  # GL_RGBA8
        TextureFormat("rgba32f", 16, 0x8814, _RGBA, _FLOAT, 4),  # GL_RGBA32F
        TextureFormat("r32f", 4, 0x822E, _RED, _FLOAT, 1),  # GL_R32F
        TextureFormat("r8", 1, 0x8229, _RED, _UBYTE, 1),  # GL_R8
        TextureFormat("r16", 2, 0x822A, _RED, _USHORT, 1),  # GL_R16
        TextureFormat("r16f", 2, 0x822D, _RED, _HALF, 1),  # GL_R16F
        TextureFormat("rg32f", 8, 0x8230, _RG, _FLOAT, 2),  # GL_RG32F
        TextureFormat("rgba16f", 8, 0x881A, _RGBA, _HALF, 4),  # GL_RGBA16F
    )
}

# One texel per element: the element's bytes and lanes must be the texel's.
_BY_DTYPE: dict[DType, str] = {
    DType.UCHAR4: "rgba8",
    DType.UINT32: "rgba8",  # packed RGBA8 (the bundled image kernels' pixels)
    DType.FLOAT4: "rgba32f",
    DType.FLOAT32: "r32f",
    DType.UINT8: "r8",
    DType.UINT16: "r16",
    DType.FLOAT16: "r16f",
    DType.FLOAT2: "rg32f",
}


def texture_format_for(dtype: DType, channels: int = 1) -> TextureFormat | None:
    """The texture that shows an image of ``dtype`` elements (``channels`` interleaved per pixel),
    or None when no GL format holds it texel for texel (float3, double, signed types, bfloat16)."""
    if channels == 4 and dtype is DType.UINT8:
        return TEXTURE_FORMATS["rgba8"]
    if channels == 4 and dtype is DType.FLOAT32:
        return TEXTURE_FORMATS["rgba32f"]
    if channels == 4 and dtype is DType.FLOAT16:
        return TEXTURE_FORMATS["rgba16f"]
    if channels != 1:
        return None
    name = _BY_DTYPE.get(dtype)
    return TEXTURE_FORMATS[name] if name is not None else None


class Conversion(NamedTuple):
    """How a conversion writer shows an image no texture holds texel for texel: ``texture`` (``r32f``
    or ``rgba32f``), ``lane`` (the CUDA C type it reads each value as), ``values`` per pixel and
    ``to_float`` (a C expression of ``v``, one value, giving the float shown)."""

    texture: str
    lane: str
    values: int
    to_float: str


# The lane types a conversion reads, by the lane's NumPy name ("bfloat16" for its bits), and how each
# value becomes the float a texel holds: UNORM / SNORM scaling for integers (as GL's normalized
# formats read them), the bits widened for bfloat16 and half (no fp16 header needed).
_LANE_FLOATS: dict[str, tuple[str, str]] = {
    "int8": ("signed char", "fmaxf((float)v / 127.0f, -1.0f)"),
    "uint8": ("unsigned char", "(float)v / 255.0f"),
    "int16": ("short", "fmaxf((float)v / 32767.0f, -1.0f)"),
    "uint16": ("unsigned short", "(float)v / 65535.0f"),
    "float16": ("unsigned short", "half_bits_to_float(v)"),
    "bfloat16": ("unsigned short", "__uint_as_float((unsigned int)v << 16)"),
    "float32": ("float", "v"),
    "float64": ("double", "(float)v"),
}


def conversion_for(dtype: DType, channels: int = 1) -> Conversion | None:
    """The conversion that shows an image of ``dtype`` elements (``channels`` interleaved per pixel)
    when ``texture_format_for`` has no texture for it, or None: a texture holds it as it is, or it is
    not shown (32/64-bit integers, more than 4 values per pixel)."""
    if texture_format_for(dtype, channels) is not None:
        return None
    lane = "bfloat16" if dtype is DType.BFLOAT16 else dtype.base.name
    known = _LANE_FLOATS.get(lane)
    values = dtype.lanes * channels
    if known is None or values > 4:
        return None
    return Conversion("r32f" if values == 1 else "rgba32f", known[0], values, known[1])
