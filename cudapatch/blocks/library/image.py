"""Built-in image blocks: 2-D launches over RGBA8 (``uchar4``) or RGBA32F (``float4``) images.

``Pattern`` makes an animated test image (a camera stand-in), ``Blur`` is a separable Gaussian (a
weights kernel, a horizontal pass into an internal image, a vertical pass), ``Resample`` resizes
bilinearly, ``Threshold`` and ``ColorMap`` map each pixel's luminance, ``Mix`` blends two images.
The pixel format is the ``Format`` text parameter (``rgba8`` or ``rgba32f``); every kernel works in
float and converts on load and store (RGBA8: divided by 255, rounded and clamped on store). Each
kernel's ``width`` and ``height`` come from its launch's shape; edges clamp, like
``scipy.ndimage``'s ``mode="nearest"``.
"""

from __future__ import annotations

from ...kernels.cuda_source import CudaSource
from ...kernels.types import DType
from ..block import Block
from ..builder import BlockBuilder
from ..description import like, shape_of

__all__ = ["IMAGE_BLOCKS", "MAX_BLUR_RADIUS", "Blur", "ColorMap", "Mix", "Pattern", "Resample", "Threshold"]

#: The largest Blur radius (taps each side of a pixel).
MAX_BLUR_RADIUS = 64

_FORMATS = {"rgba8": "uchar4", "rgba32f": "float4"}

# Loads give float4 in 0..1 (RGBA8) or as stored (RGBA32F); stores round and clamp RGBA8.
_PIXEL = {
    "uchar4": r"""
typedef uchar4 pixel;
__device__ __forceinline__ float4 load_px(const pixel* p, unsigned int i)
{
    uchar4 v = p[i];
    const float s = 1.0f / 255.0f;
    return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}
__device__ __forceinline__ unsigned char to_u8(float v)
{
    return (unsigned char)fminf(fmaxf(v * 255.0f + 0.5f, 0.0f), 255.0f);
}
__device__ __forceinline__ void store_px(pixel* p, unsigned int i, float4 c)
{
    p[i] = make_uchar4(to_u8(c.x), to_u8(c.y), to_u8(c.z), to_u8(c.w));
}
""",
    "float4": r"""
typedef float4 pixel;
__device__ __forceinline__ float4 load_px(const pixel* p, unsigned int i) { return p[i]; }
__device__ __forceinline__ void store_px(pixel* p, unsigned int i, float4 c) { p[i] = c; }
""",
}

_COMMON = r"""
__device__ __forceinline__ float4 madd(float4 acc, float4 v, float w)
{
    return make_float4(acc.x + v.x * w, acc.y + v.y * w, acc.z + v.z * w, acc.w + v.w * w);
}
__device__ __forceinline__ float luma(float4 c) { return 0.2126f * c.x + 0.7152f * c.y + 0.0722f * c.z; }
#define PIXEL_XY                                                \
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;     \
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;     \
    if (x >= width || y >= height) return;                      \
    unsigned int i = y * width + x;
"""

_PATTERN = r"""
extern "C" __global__ void image_pattern(pixel* out, float time, unsigned int width, unsigned int height)
{
    PIXEL_XY
    float u = (float)x / (float)width, v = (float)y / (float)height;
    float r = 0.5f + 0.5f * __sinf(12.0f * u + time);
    float g = 0.5f + 0.5f * __sinf(9.0f * v - 1.3f * time);
    float b = 0.5f + 0.5f * __sinf(7.0f * (u + v) + 0.7f * time);
    float cx = u - 0.5f - 0.25f * __cosf(0.9f * time), cy = v - 0.5f - 0.25f * __sinf(1.1f * time);
    float spot = __expf(-(cx * cx + cy * cy) * 60.0f);
    store_px(out, i, make_float4(fminf(r + spot, 1.0f), fminf(g + spot, 1.0f), fminf(b + spot, 1.0f), 1.0f));
}
"""

_BLUR = r"""
// Normalised Gaussian weights w[0..radius] (symmetric): one block, recomputed each frame (a few
// hundred nanoseconds), so Radius and Sigma are Hot.
extern "C" __global__ void blur_weights(float* weights, unsigned int radius, float sigma)
{
    __shared__ float w[MAX_RADIUS + 1];
    __shared__ float total;
    unsigned int k = threadIdx.x;
    float s = fmaxf(sigma, 1e-3f);
    if (k <= radius) w[k] = __expf(-0.5f * (float)(k * k) / (s * s));
    __syncthreads();
    if (k == 0) {
        float sum = w[0];
        for (unsigned int j = 1; j <= radius; ++j) sum += 2.0f * w[j];
        total = sum;
    }
    __syncthreads();
    if (k <= radius) weights[k] = w[k] / total;
}

extern "C" __global__ void blur_h(const pixel* in, pixel* tmp, const float* weights, unsigned int radius,
                                  unsigned int width, unsigned int height)
{
    PIXEL_XY
    unsigned int row = y * width;
    float4 acc = madd(make_float4(0.0f, 0.0f, 0.0f, 0.0f), load_px(in, i), weights[0]);
    for (unsigned int k = 1; k <= radius; ++k) {
        unsigned int l = x >= k ? x - k : 0, r = min(x + k, width - 1);
        acc = madd(madd(acc, load_px(in, row + l), weights[k]), load_px(in, row + r), weights[k]);
    }
    store_px(tmp, i, acc);
}

extern "C" __global__ void blur_v(const pixel* tmp, pixel* out, const float* weights, unsigned int radius,
                                  unsigned int width, unsigned int height)
{
    PIXEL_XY
    float4 acc = madd(make_float4(0.0f, 0.0f, 0.0f, 0.0f), load_px(tmp, i), weights[0]);
    for (unsigned int k = 1; k <= radius; ++k) {
        unsigned int u = y >= k ? y - k : 0, d = min(y + k, height - 1);
        acc = madd(madd(acc, load_px(tmp, u * width + x), weights[k]), load_px(tmp, d * width + x), weights[k]);
    }
    store_px(out, i, acc);
}
"""

_RESAMPLE = r"""
// Bilinear, pixel centres aligned (like OpenCV's INTER_LINEAR and cupyx's zoom with grid_mode=True).
extern "C" __global__ void image_resample(const pixel* in, pixel* out, unsigned int in_width,
                                          unsigned int in_height, unsigned int width, unsigned int height)
{
    PIXEL_XY
    float sx = fmaxf(((float)x + 0.5f) * (float)in_width / (float)width - 0.5f, 0.0f);
    float sy = fmaxf(((float)y + 0.5f) * (float)in_height / (float)height - 0.5f, 0.0f);
    unsigned int x0 = min((unsigned int)sx, in_width - 1), y0 = min((unsigned int)sy, in_height - 1);
    unsigned int x1 = min(x0 + 1, in_width - 1), y1 = min(y0 + 1, in_height - 1);
    float fx = sx - (float)x0, fy = sy - (float)y0;
    float4 a = load_px(in, y0 * in_width + x0), b = load_px(in, y0 * in_width + x1);
    float4 c = load_px(in, y1 * in_width + x0), d = load_px(in, y1 * in_width + x1);
    float4 top = madd(madd(make_float4(0.0f, 0.0f, 0.0f, 0.0f), a, 1.0f - fx), b, fx);
    float4 bottom = madd(madd(make_float4(0.0f, 0.0f, 0.0f, 0.0f), c, 1.0f - fx), d, fx);
    store_px(out, i, madd(madd(make_float4(0.0f, 0.0f, 0.0f, 0.0f), top, 1.0f - fy), bottom, fy));
}
"""

_THRESHOLD = r"""
extern "C" __global__ void image_threshold(const pixel* in, pixel* out, float level, unsigned int width,
                                           unsigned int height)
{
    PIXEL_XY
    float4 c = load_px(in, i);
    float v = luma(c) > level ? 1.0f : 0.0f;
    store_px(out, i, make_float4(v, v, v, c.w));
}
"""

_COLORMAP = r"""
// Luminance between Low and High through a "turbo"-like map (Mikhailov's polynomial fit).
extern "C" __global__ void image_colormap(const pixel* in, pixel* out, float low, float high,
                                          unsigned int width, unsigned int height)
{
    PIXEL_XY
    float4 c = load_px(in, i);
    float t = fminf(fmaxf((luma(c) - low) / fmaxf(high - low, 1e-6f), 0.0f), 1.0f);
    float r = 0.13572138f + t * (4.61539260f + t * (-42.66032258f + t * (132.13108234f
              + t * (-152.94239396f + t * 59.28637943f))));
    float g = 0.09140261f + t * (2.19418839f + t * (4.84296658f + t * (-14.18503333f
              + t * (4.27729857f + t * 2.82956604f))));
    float b = 0.10667330f + t * (12.64194608f + t * (-60.58204836f + t * (110.36276771f
              + t * (-89.90310912f + t * 27.34824973f))));
    store_px(out, i, make_float4(__saturatef(r), __saturatef(g), __saturatef(b), c.w));
}
"""

_MIX = r"""
extern "C" __global__ void image_mix(const pixel* a, const pixel* b, pixel* out, float amount,
                                     unsigned int width, unsigned int height)
{
    PIXEL_XY
    float t = fminf(fmaxf(amount, 0.0f), 1.0f);
    store_px(out, i, madd(madd(make_float4(0.0f, 0.0f, 0.0f, 0.0f), load_px(a, i), 1.0f - t), load_px(b, i), t));
}
"""


def _format(b: BlockBuilder) -> str:
    """The pixel type named by the block's ``Format`` text parameter."""
    fmt = b.text(
        "Format",
        default="rgba8",
        description="pixel format: rgba8 (uchar4) or rgba32f (float4)",
        choices=tuple(_FORMATS),
    )
    return _FORMATS[fmt]


def image_source(body: str, pixel: str) -> str:
    """The CUDA C++ of an image kernel ``body`` for pixels of ``pixel`` (``uchar4`` or ``float4``)."""
    defines = f"#define MAX_RADIUS {MAX_BLUR_RADIUS}\n"
    # Signatures name the type itself: cudapatch reads ports from them, and knows no typedefs.
    return defines + _PIXEL[pixel] + _COMMON + body.replace("pixel*", f"{pixel}*")


def _kernel(b: BlockBuilder, body: str, entry: str, pixel: str) -> object:
    return b.add_kernel(CudaSource(code=image_source(body, pixel), entry=entry, name=f"{entry}_{pixel}.cu"))


class Pattern(Block):
    """An animated ``Width`` x ``Height`` test image (moving colour waves and a bright spot): a
    camera stand-in. ``Time`` (seconds) is Hot."""

    type_name = "Pattern"

    def describe(self, b: BlockBuilder) -> None:
        pixel = _format(b)
        k = _kernel(b, _PATTERN, "image_pattern", pixel)
        b.scalar("Width", dtype=DType.UINT32, default=640, range=(1, 16384))
        b.scalar("Height", dtype=DType.UINT32, default=360, range=(1, 16384))
        b.scalar("Time", k.in_("time"), default=0.0)
        size = shape_of("Height", "Width")
        b.output("Out", k.out("out"), size=size)
        k.auto_grid(size, dims=2)


class Blur(Block):
    """Separable Gaussian blur of ``In``: ``Radius`` taps each side (0..64), standard deviation
    ``Sigma`` pixels; both Hot. Edges clamp."""

    type_name = "Blur"

    def describe(self, b: BlockBuilder) -> None:
        pixel = _format(b)
        weights = _kernel(b, _BLUR, "blur_weights", pixel)
        h = _kernel(b, _BLUR, "blur_h", pixel)
        v = _kernel(b, _BLUR, "blur_v", pixel)
        b.input("In", h.in_("in"))
        b.connect(h.out("tmp"), v.in_("tmp"), size=like("In"))
        b.connect(weights.out("weights"), h.in_("weights"), v.in_("weights"), size=MAX_BLUR_RADIUS + 1)
        b.output("Out", v.out("out"), size=like("In"))
        radius = (weights.in_("radius"), h.in_("radius"), v.in_("radius"))
        b.scalar("Radius", *radius, default=4, range=(0, MAX_BLUR_RADIUS))
        b.scalar("Sigma", weights.in_("sigma"), default=2.0, range=(0.01, None))
        weights.auto_grid(MAX_BLUR_RADIUS + 1)
        h.auto_grid(like("In"), dims=2)
        v.auto_grid(like("In"), dims=2)


class Resample(Block):
    """``In`` resized bilinearly to ``Width`` x ``Height`` (pixel centres aligned)."""

    type_name = "Resample"

    def describe(self, b: BlockBuilder) -> None:
        pixel = _format(b)
        k = _kernel(b, _RESAMPLE, "image_resample", pixel)
        b.input("In", k.in_("in"), needs=None)  # read by its own axes: the kernel's in_width, in_height
        k.set_shape_params(like("In"), width="in_width", height="in_height")
        b.scalar("Width", dtype=DType.UINT32, default=640, range=(1, 16384))
        b.scalar("Height", dtype=DType.UINT32, default=360, range=(1, 16384))
        size = shape_of("Height", "Width")
        b.output("Out", k.out("out"), size=size)
        k.auto_grid(size, dims=2)


class Threshold(Block):
    """White where a pixel's luminance is above ``Level`` (Hot), black elsewhere; alpha kept."""

    type_name = "Threshold"

    def describe(self, b: BlockBuilder) -> None:
        k = _kernel(b, _THRESHOLD, "image_threshold", _format(b))
        b.input("In", k.in_("in"))
        b.output("Out", k.out("out"), size=like("In"))
        b.scalar("Level", k.in_("level"), default=0.5)
        k.auto_grid(like("In"), dims=2)


class ColorMap(Block):
    """Each pixel's luminance between ``Low`` and ``High`` (Hot) through a turbo-like colour map."""

    type_name = "ColorMap"

    def describe(self, b: BlockBuilder) -> None:
        k = _kernel(b, _COLORMAP, "image_colormap", _format(b))
        b.input("In", k.in_("in"))
        b.output("Out", k.out("out"), size=like("In"))
        b.scalar("Low", k.in_("low"), default=0.0)
        b.scalar("High", k.in_("high"), default=1.0)
        k.auto_grid(like("In"), dims=2)


class Mix(Block):
    """``A * (1 - Amount) + B * Amount`` (``Amount`` Hot, clamped to 0..1); B must have A's shape."""

    type_name = "Mix"

    def describe(self, b: BlockBuilder) -> None:
        k = _kernel(b, _MIX, "image_mix", _format(b))
        b.input("A", k.in_("a"))
        b.input("B", k.in_("b"))
        b.output("Out", k.out("out"), size=like("A"))
        b.scalar("Amount", k.in_("amount"), default=0.5)
        k.auto_grid(like("A"), dims=2)


IMAGE_BLOCKS = (Pattern, Blur, Resample, Threshold, ColorMap, Mix)
