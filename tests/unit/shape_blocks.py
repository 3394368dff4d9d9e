"""Blocks with 2-D and 3-D shapes and launches, and copies of every element type, for the shape tests
(plans here, results on the GPU in ``tests/gpu/test_shapes_gpu.py``)."""

from __future__ import annotations

from cudapatch import Block, BlockBuilder, CudaSource, DType, NumbaSource, like, shape_of

try:  # the kernel below needs it only when it is compiled (GPU tests); plans are made without it
    from numba import cuda
except ImportError:  # pragma: no cover - numba-cuda is a test dependency
    cuda = None

GAIN_2D = r"""
// cudapatch: blockSize=16x16
extern "C" __global__ void gain2d(const float* in, float* out, float gain, unsigned int width, unsigned int height)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) out[y * width + x] = in[y * width + x] * gain;
}
"""

RAMP_2D = r"""
extern "C" __global__ void ramp2d(float* out, unsigned int width, unsigned int height)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) out[y * width + x] = (float)x + 1000.0f * (float)y;
}
"""

RAMP_3D = r"""
extern "C" __global__ void ramp3d(float* out, unsigned int width, unsigned int height, unsigned int depth)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    unsigned int z = blockIdx.z * blockDim.z + threadIdx.z;
    if (x < width && y < height && z < depth)
        out[(z * height + y) * width + x] = (float)x + 100.0f * (float)y + 10000.0f * (float)z;
}
"""

TRANSPOSE_2D = r"""
extern "C" __global__ void transpose2d(const float* in, float* out, unsigned int width, unsigned int height)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) out[x * height + y] = in[y * width + x];
}
"""


class Gain2D(Block):
    """``Out = In * Gain`` over a 2-D image: a 16x16 launch from the kernel's ``blockSize``; the
    kernel's ``width`` and ``height`` are filled from the input's shape."""

    type_name = "Gain2D"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(CudaSource(code=GAIN_2D, name="gain2d.cu"))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        b.scalar("Gain", k.in_(2), default=2.0)
        k.auto_grid(like("In"))  # 2-D: the kernel's blockSize has two axes


class Ramp2D(Block):
    """A ``Height`` x ``Width`` image with ``x + 1000 y`` at each pixel (default 16x16 threads)."""

    type_name = "Ramp2D"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(CudaSource(code=RAMP_2D, name="ramp2d.cu"))
        b.scalar("Width", dtype=DType.UINT32, default=640, range=(0, 1 << 15))
        b.scalar("Height", dtype=DType.UINT32, default=480, range=(0, 1 << 15))
        b.output("Out", k.out(0), size=shape_of("Height", "Width"))
        k.auto_grid(shape_of("Height", "Width"), dims=2)


class Ramp3D(Block):
    """A ``Depth`` x ``Height`` x ``Width`` volume with ``x + 100 y + 10000 z`` (default 8x8x8 threads)."""

    type_name = "Ramp3D"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(CudaSource(code=RAMP_3D, name="ramp3d.cu"))
        for name, default in (("Width", 40), ("Height", 30), ("Depth", 20)):
            b.scalar(name, dtype=DType.UINT32, default=default, range=(0, 1 << 12))
        size = shape_of("Depth", "Height", "Width")
        b.output("Out", k.out(0), size=size)
        k.auto_grid(size, dims=3)


def _swap_axes(count: int | None, params: dict) -> tuple[int, int]:  # noqa: ARG001
    return params["Width"], params["Height"]


class Transpose2D(Block):
    """``Out[x, y] = In[y, x]`` for a ``Height`` x ``Width`` input: the output's shape is computed
    (``(Width, Height)``), and the input is checked against the launch's ``(Height, Width)``."""

    type_name = "Transpose2D"

    def describe(self, b: BlockBuilder) -> None:
        from cudapatch import computed

        k = b.add_kernel(CudaSource(code=TRANSPOSE_2D, name="transpose2d.cu"))
        b.scalar("Width", dtype=DType.UINT32, default=64, range=(0, 1 << 15))
        b.scalar("Height", dtype=DType.UINT32, default=32, range=(0, 1 << 15))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=computed(_swap_axes, "Width", "Height"))
        k.auto_grid(shape_of("Height", "Width"), dims=2)


#: CUDA C++ spelling, header and NumPy storage of each element type the copy test round-trips.
COPY_TYPES: dict[str, tuple[str, str]] = {
    "char": ("signed char", ""),
    "uchar": ("unsigned char", ""),
    "short": ("short", ""),
    "ushort": ("unsigned short", ""),
    "half": ("__half", "#include <cuda_fp16.h>\n"),
    "bfloat16": ("__nv_bfloat16", "#include <cuda_bf16.h>\n"),
    "float2": ("float2", ""),
    "float3": ("float3", ""),
    "float4": ("float4", ""),
    "uchar4": ("uchar4", ""),
    "double": ("double", ""),
}


def copy_code(type_name: str) -> str:
    """A kernel copying ``n`` elements of ``type_name`` (a key of ``COPY_TYPES``)."""
    ctype, header = COPY_TYPES[type_name]
    return (
        f'{header}extern "C" __global__ void copy_{type_name}(const {ctype}* in, {ctype}* out, unsigned int n)\n'
        "{\n    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;\n    if (i < n) out[i] = in[i];\n}\n"
    )


class Copy(Block):
    """Copies ``In`` to ``Out``; the element type is the ``Type`` text parameter (a ``COPY_TYPES`` key)."""

    type_name = "ShapeTestCopy"

    def describe(self, b: BlockBuilder) -> None:
        t = b.text("Type", default="half")
        k = b.add_kernel(CudaSource(code=copy_code(t), name=f"copy_{t}.cu"))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        k.auto_grid(like("In"), count_param=2)


def _numba_copy(src, dst, n):  # noqa: ANN001 - a Numba kernel: ``cuda`` is read when Numba compiles it
    i = cuda.grid(1)
    if i < n:
        dst[i] = src[i]


class NumbaCopy(Block):
    """A Numba copy of ``In`` to ``Out`` for the element type named by ``Type`` (int8 ... float16)."""

    type_name = "ShapeTestNumbaCopy"

    def describe(self, b: BlockBuilder) -> None:
        t = b.text("Type", default="float16")
        k = b.add_kernel(NumbaSource(_numba_copy, (f"{t}[:]", f"{t}[:]", "uint32"), outputs=("dst",)))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        k.auto_grid(like("In"), count_param=2)


def _numba_gain2d(src, dst, gain, width, height):  # noqa: ANN001 - a Numba kernel over a 2-D launch
    x, y = cuda.grid(2)
    if x < width and y < height:
        dst[y * width + x] = src[y * width + x] * gain


class NumbaGain2D(Block):
    """``Out = In * Gain`` over a 2-D image, in Numba: a 16x16 launch (``block_size``), its ``width`` and
    ``height`` filled from the input's shape as for CUDA C++."""

    type_name = "ShapeTestNumbaGain2D"

    def describe(self, b: BlockBuilder) -> None:
        sig = ("float32[:]", "float32[:]", "float32", "uint32", "uint32")
        k = b.add_kernel(NumbaSource(_numba_gain2d, sig, outputs=("dst",), block_size=(16, 16)))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        b.scalar("Gain", k.in_(2), default=2.0)
        k.auto_grid(like("In"))  # 2-D: the block size has two axes


def _numba_swizzle4(src, dst, gain, n):  # noqa: ANN001 - a Numba kernel over float32x4 (float4) elements
    i = cuda.grid(1)
    if i < n:
        v = src[i]
        dst[i] = cuda.float32x4(v.w * gain, v.z, v.y + v.x, v.x)


def _numba_rgba_invert(src, dst, width, height):  # noqa: ANN001 - a 2-D Numba kernel over uint8x4 (uchar4) pixels
    x, y = cuda.grid(2)
    if x < width and y < height:
        p = src[y * width + x]
        dst[y * width + x] = cuda.uint8x4(255 - p.x, 255 - p.y, 255 - p.z, p.w)


def _numba_length3(src, dst, n):  # noqa: ANN001 - float32x3 (float3) elements in, float out
    i = cuda.grid(1)
    if i < n:
        v = src[i]
        dst[i] = (v.x * v.x + v.y * v.y + v.z * v.z) ** 0.5


class NumbaSwizzle4(Block):
    """``Out[i] = (In.w * Gain, In.z, In.y + In.x, In.x)`` over ``float4`` elements, in Numba
    (``float32x4[:]`` arrays)."""

    type_name = "ShapeTestNumbaSwizzle4"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(
            NumbaSource(_numba_swizzle4, ("float32x4[:]", "float4[:]", "float32", "uint32"), outputs=("dst",))
        )
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        b.scalar("Gain", k.in_(2), default=2.0)
        k.auto_grid(like("In"), count_param=3)


class NumbaRgbaInvert(Block):
    """Inverts an RGBA8 (``uchar4``) image's colour, alpha kept: a 2-D Numba kernel over ``uint8x4``."""

    type_name = "ShapeTestNumbaRgbaInvert"

    def describe(self, b: BlockBuilder) -> None:
        sig = ("uint8x4[:]", "uchar4[:]", "uint32", "uint32")
        k = b.add_kernel(NumbaSource(_numba_rgba_invert, sig, outputs=("dst",), block_size=(16, 16)))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        k.auto_grid(like("In"))


class NumbaLength3(Block):
    """``Out[i] = |In[i]|`` for ``float3`` elements, in Numba (``float32x3[:]`` in, ``float32[:]`` out)."""

    type_name = "ShapeTestNumbaLength3"

    def describe(self, b: BlockBuilder) -> None:
        k = b.add_kernel(NumbaSource(_numba_length3, ("float32x3[:]", "float32[:]", "uint32"), outputs=("dst",)))
        b.input("In", k.in_(0))
        b.output("Out", k.out(1), size=like("In"))
        k.auto_grid(like("In"), count_param=2)
