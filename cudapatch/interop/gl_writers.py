"""Blocks that copy an engine output into GL memory from inside the graph, so a frame's host work
for GL interop is its driver calls for mapping (register/map path) or one word (zero-map path).

``GlBufferWriter`` copies into a mapped GL buffer and ``GlSurfaceWriter`` into a mapped GL texture
through surface stores (``GlBridge.show_buffer`` / ``show_texture``): the mapped address or surface
object is a Hot scalar, set again only when a mapping moves. ``GlConvertWriter`` stores images no
texture holds texel for texel (signed 8/16-bit, bfloat16, float3 ...) as floats in an R32F or RGBA32F
texture (``formats.conversion_for``).

``GlRingWriter`` feeds the zero-map path: CUDA memory shared with GL through a ring of three
buffers (see ``imported.py``). Which buffer a frame may write is decided on the host (GL may be
drawing one, CUDA may not have finished another), and the host passes each launch its buffer
through mapped pinned memory: before a launch it writes a *request* ``(tag << 2) | slot`` into a
64-entry table; the block's first kernel takes the request whose tag equals its launch count (kept
in device memory), its second copies into that slot, and the copy's last thread block publishes
the new count into the host's ``done`` word. A launch without a matching request (the host dropped
the frame) copies nothing and counts nothing. The host reads ``done`` with a plain load: no driver
call per frame.
"""

from __future__ import annotations

from ..blocks.block import Block
from ..blocks.builder import BlockBuilder, KernelHandle
from ..blocks.description import like
from ..blocks.library.transfer import ELEMENT_TYPES
from ..kernels.cuda_source import CudaSource
from ..kernels.types import DType, cuda_spelling
from .formats import conversion_for

__all__ = [
    "GlBufferWriter",
    "GlConvertWriter",
    "GlRingWriter",
    "GlSurfaceWriter",
    "REQUESTS",
    "convert_writer_source",
    "ring_writer_source",
]

#: Entries of the request table: how many launches the host may be ahead of the GPU's copies.
REQUESTS = 64

# Two kernels: ``gl_ring_pick`` (one thread) reads this launch's request from mapped host memory into
# device memory; ``gl_ring_copy`` reads it from there. (Measured: with every thread block of the
# copy reading the request from host memory, copying 1M points took 11 ms instead of microseconds.)
_SOURCE = r"""
extern "C" __global__ void gl_ring_pick(unsigned long long* pick, unsigned long long state,
                                        unsigned long long requests)
{
    // state (device memory): [0] launches copied so far, [1] low half: blocks finished this launch
    unsigned long long tag = ((volatile unsigned long long*)state)[0];
    unsigned long long e = ((volatile unsigned long long*)requests)[tag % REQUESTS];
    pick[0] = (e >> 2) == tag ? (e & 3) : 3;  // 3: no request for this launch
    pick[1] = tag;
}

extern "C" __global__ void gl_ring_copy(const ELEMENT* in, unsigned int n, const unsigned long long* pick,
                                        unsigned long long capacity, unsigned long long dst0,
                                        unsigned long long dst1, unsigned long long dst2,
                                        unsigned long long state, unsigned long long host_done)
{
    unsigned long long slot = pick[0], tag = pick[1];
    if (slot > 2) return;  // no request for this launch: every block returns here
    ELEMENT* dst = (ELEMENT*)(slot == 0 ? dst0 : slot == 1 ? dst1 : dst2);
    unsigned long long fit = capacity / sizeof(ELEMENT);
    unsigned long long count = n < fit ? n : fit;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x)
        dst[i] = in[i];
    __threadfence();  // this block's copies are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned long long* st = (unsigned long long*)state;
        unsigned int* finished = (unsigned int*)(st + 1);
        if (atomicAdd(finished, 1u) == gridDim.x - 1) {  // the last block: the whole copy is done
            *finished = 0;
            st[0] = tag + 1;
            asm volatile("fence.acq_rel.sys;" ::: "memory");  // the copy before the host sees it done
            *(volatile unsigned long long*)host_done = tag + 1;
        }
    }
}
"""


def _typed(source: str, dtype: DType) -> str:
    """``source`` with ``ELEMENT`` spelled for ``dtype``, after the header that spelling needs."""
    t, header = cuda_spelling(dtype)
    return header + source.replace("ELEMENT", t)


def ring_writer_source(dtype: DType) -> str:
    """The ring writer kernel's CUDA C++ for elements of ``dtype``."""
    return _typed(_SOURCE, dtype).replace("REQUESTS", str(REQUESTS))


def _element_type(b: BlockBuilder) -> DType:
    element = b.text("Type", default="float", description="C type of the elements copied", choices=ELEMENT_TYPES)
    return DType.from_c_name(element)


class GlRingWriter(Block):
    """Copies input ``In`` (elements of the ``Type`` text parameter) into the ``ImportedRing`` slot
    the host requested for this launch. The ring's addresses are ``UINT64`` scalars set by
    ``ImportedRing.attach``; ``GlBridge.show_buffer_ring`` adds, wires and removes this block."""

    type_name = "GlRingWriter"
    internal = True  # only GlBridge adds it: overlays show it dimmed under the output it copies

    def describe(self, b: BlockBuilder) -> None:
        dtype = _element_type(b)
        code = ring_writer_source(dtype)
        pick = b.add_kernel(CudaSource(code=code, entry="gl_ring_pick", name=f"{self.name}.cu"))
        copy = b.add_kernel(CudaSource(code=code, entry="gl_ring_copy", name=f"{self.name}.cu"))
        b.connect(pick.out(0), copy.in_(2), size=2)  # (slot, tag) in device memory; orders the two
        b.input("In", copy.in_(0))
        copy.set_count(1, like("In"))
        b.scalar("Capacity", copy.in_(3), default=0)
        for i, name in enumerate(("Dst0", "Dst1", "Dst2"), start=4):
            b.scalar(name, copy.in_(i), default=0)
        b.scalar("State", pick.in_(1), copy.in_(7), default=0)
        b.scalar("Requests", pick.in_(2), default=0)
        b.scalar("HostDone", copy.in_(8), default=0)
        pick.auto_grid(1)
        copy.auto_grid(like("In"))


_BUFFER_SOURCE = r"""
extern "C" __global__ void gl_buffer_write(const ELEMENT* in, unsigned int n, unsigned long long capacity,
                                           unsigned long long dst)
{
    unsigned long long fit = capacity / sizeof(ELEMENT);
    unsigned long long count = n < fit ? n : fit;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x)
        ((ELEMENT*)dst)[i] = in[i];
}
"""


class GlBufferWriter(Block):
    """Copies input ``In`` into a mapped GL buffer: ``Dst`` is its mapped address (set by
    ``GlBridge`` whenever a map returns a new one), ``Capacity`` its size in bytes."""

    type_name = "GlBufferWriter"
    internal = True

    def describe(self, b: BlockBuilder) -> None:
        dtype = _element_type(b)
        code = _typed(_BUFFER_SOURCE, dtype)
        k = b.add_kernel(CudaSource(code=code, name=f"{self.name}.cu"))
        b.input("In", k.in_(0))
        k.set_count(1, like("In"))
        b.scalar("Capacity", k.in_(2), default=0)
        b.scalar("Dst", k.in_(3), default=0)
        k.auto_grid(like("In"))


# Texels are 4 bytes (rgba8, r32f) or 16 (rgba32f); x of a surface store is in bytes.
_SURFACE_SOURCE = r"""
extern "C" __global__ void gl_surface_write(const ELEMENT* in, unsigned int n, unsigned long long surf,
                                            unsigned int width, unsigned int height)
{
    unsigned long long have = (unsigned long long)n * sizeof(ELEMENT) / TEXEL;
    unsigned long long texels = (unsigned long long)width * height;
    unsigned long long count = have < texels ? have : texels;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int x = (unsigned int)(i % width), y = (unsigned int)(i / width);
        STORE
    }
}
"""
_STORES = {
    4: "unsigned int v = ((const unsigned int*)in)[i];\n"
    '        asm volatile("sust.b.2d.b32.trap [%0, {%1, %2}], {%3};" '
    ':: "l"(surf), "r"(x * 4), "r"(y), "r"(v) : "memory");',
    16: "uint4 v = ((const uint4*)in)[i];\n"
    '        asm volatile("sust.b.2d.v4.b32.trap [%0, {%1, %2}], {%3, %4, %5, %6};" '
    ':: "l"(surf), "r"(x * 16), "r"(y), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");',
}


class GlSurfaceWriter(Block):
    """Writes input ``In`` (a linear image, rows of ``Width`` texels) into a mapped GL texture
    registered with ``surface_ldst``, through surface stores: ``Surface`` is the surface object of
    the mapped array (set by ``GlBridge`` when a map returns a new array), ``Texel`` the texel size
    in bytes (4 or 16)."""

    type_name = "GlSurfaceWriter"
    internal = True

    def describe(self, b: BlockBuilder) -> None:
        dtype = _element_type(b)
        texel = b.text("Texel", default="4", description="bytes per texel: 4 or 16", choices=("4", "16"))
        code = _typed(_SURFACE_SOURCE, dtype).replace("TEXEL", texel)
        k = b.add_kernel(CudaSource(code=code.replace("STORE", _STORES[int(texel)]), name=f"{self.name}.cu"))
        _surface_ports(b, k)


# One thread per texel: read the pixel's VALUES lanes, make each a float (formats._LANE_FLOATS), store
# them with one surface store (x in bytes). Missing blue is 0 and missing alpha 1.
_CONVERT_SOURCE = r"""
__device__ __forceinline__ float half_bits_to_float(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

extern "C" __global__ void gl_convert_write(const ELEMENT* elements, unsigned int n, unsigned long long surf,
                                            unsigned int width, unsigned int height)
{
    const LANE* in = (const LANE*)elements;
    unsigned long long have = (unsigned long long)n * ELEMENT_LANES / VALUES;
    unsigned long long texels = (unsigned long long)width * height;
    unsigned long long count = have < texels ? have : texels;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        unsigned int x = (unsigned int)(i % width), y = (unsigned int)(i / width);
        float c[4] = {0.0f, 0.0f, 0.0f, 1.0f};
        for (int k = 0; k < VALUES; ++k) {
            LANE v = in[i * VALUES + k];
            c[k] = TO_FLOAT;
        }
        STORE
    }
}
"""
_CONVERT_STORES = {
    "r32f": 'asm volatile("sust.b.2d.b32.trap [%0, {%1, %2}], {%3};" '
    ':: "l"(surf), "r"(x * 4), "r"(y), "r"(__float_as_uint(c[0])) : "memory");',
    "rgba32f": 'asm volatile("sust.b.2d.v4.b32.trap [%0, {%1, %2}], {%3, %4, %5, %6};" '
    ':: "l"(surf), "r"(x * 16), "r"(y), "r"(__float_as_uint(c[0])), "r"(__float_as_uint(c[1])), '
    '"r"(__float_as_uint(c[2])), "r"(__float_as_uint(c[3])) : "memory");',
}


def convert_writer_source(dtype: DType, channels: int = 1) -> str:
    """The conversion writer's CUDA C++ for an image of ``dtype`` with ``channels`` per pixel.

    Raises:
        ValueError: no conversion shows that image (``formats.conversion_for`` is None).
    """
    conv = conversion_for(dtype, channels)
    if conv is None:
        raise ValueError(f"no conversion shows {dtype.c_name} x{channels} images")
    code = _typed(_CONVERT_SOURCE.replace("ELEMENT_LANES", str(dtype.lanes)), dtype)
    for key, value in (
        ("VALUES", str(conv.values)),
        ("TO_FLOAT", conv.to_float),
        ("STORE", _CONVERT_STORES[conv.texture]),
        ("LANE", conv.lane),
    ):
        code = code.replace(key, value)
    return code


class GlConvertWriter(Block):
    """Writes input ``In`` (a linear image of ``Type`` elements, ``Channels`` per pixel, rows of
    ``Width`` pixels) into a mapped R32F or RGBA32F texture as floats, through surface stores: the
    preview's way to show types no texture holds texel for texel. ``Surface`` is the mapped array's
    surface object (set by ``GlBridge``)."""

    type_name = "GlConvertWriter"
    internal = True

    def describe(self, b: BlockBuilder) -> None:
        dtype = _element_type(b)
        channels = b.text("Channels", default="1", description="values per pixel", choices=("1", "2", "3", "4"))
        try:
            code = convert_writer_source(dtype, int(channels))
        except ValueError as exc:
            raise b.error(str(exc)) from None
        k = b.add_kernel(CudaSource(code=code, name=f"{self.name}.cu"))
        _surface_ports(b, k)


def _surface_ports(b: BlockBuilder, k: KernelHandle) -> None:
    """The ports of a kernel ``(In, count, surface, width, height)`` that stores ``In`` into a surface:
    one thread per element of ``In``."""
    b.input("In", k.in_(0))
    k.set_count(1, like("In"))
    b.scalar("Surface", k.in_(2), default=0)
    b.scalar("Width", k.in_(3), default=1)
    b.scalar("Height", k.in_(4), default=1)
    k.auto_grid(like("In"))
