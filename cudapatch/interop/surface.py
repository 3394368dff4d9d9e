"""Linear image -> GL texture through surface stores, for textures registered with ``surface_ldst``.

A GL texture is a CUDA array in a block-linear layout. ``cuMemcpy2DAsync`` into it runs on the
copy engine at a fraction of device bandwidth: a 4K RGBA8 image took 82.6 µs on the H100 beside
26.2 µs for a device-to-device copy of the same bytes. A kernel of ``sust`` surface stores
(one thread per texel) took 34.2 µs, 1.3x the plain copy. So textures registered with
``flags="surface_ldst"`` are written by that kernel.
"""

from __future__ import annotations

import ctypes
from typing import Any

from .._lifecycle import ContextRef, HandleOwner, Releases
from ..errors import InteropError
from ..kernels._driver import check, driver

__all__ = ["SurfaceWriter", "SURFACE_SOURCE"]

#: One kernel per texel size: 4 bytes (rgba8, r32f) and 16 bytes (rgba32f). ``x`` of a surface
#: store is in bytes. ``pitch`` is in texels.
SURFACE_SOURCE = r"""
extern "C" __global__ void linear_to_surface4(const unsigned int* __restrict__ src, unsigned long long surf,
                                              unsigned int width, unsigned int height, unsigned int pitch)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) {
        unsigned int v = src[y * pitch + x];
        asm volatile("sust.b.2d.b32.trap [%0, {%1, %2}], {%3};" :: "l"(surf), "r"(x * 4), "r"(y), "r"(v) : "memory");
    }
}

extern "C" __global__ void linear_to_surface16(const uint4* __restrict__ src, unsigned long long surf,
                                               unsigned int width, unsigned int height, unsigned int pitch)
{
    unsigned int x = blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int y = blockIdx.y * blockDim.y + threadIdx.y;
    if (x < width && y < height) {
        uint4 v = src[y * pitch + x];
        asm volatile("sust.b.2d.v4.b32.trap [%0, {%1, %2}], {%3, %4, %5, %6};"
                     :: "l"(surf), "r"(x * 16), "r"(y), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
    }
}
"""
_BLOCK = (64, 4)  # measured best of 32x8, 64x4, 16x16, 128x2 on the H100 (all within 4 %)
_IMAGES: dict[tuple[str, int], Any] = {}  # (arch, texel bytes) -> compiled cubin: bytes, safe across contexts


def _current_arch() -> str:
    d = driver()
    dev = check(d.cuCtxGetDevice(), "cuCtxGetDevice")
    attr = d.CUdevice_attribute
    major = check(
        d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev), "cuDeviceGetAttribute"
    )
    minor = check(
        d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev), "cuDeviceGetAttribute"
    )
    return f"sm_{major}{minor}"


def _image(texel_bytes: int) -> Any:
    from ..kernels.cuda_source import CudaSource

    arch = _current_arch()
    key = (arch, texel_bytes)
    image = _IMAGES.get(key)
    if image is None:
        entry = f"linear_to_surface{texel_bytes}"
        image = _IMAGES[key] = CudaSource(code=SURFACE_SOURCE, entry=entry, name="surface.cu").compile(arch)
    return image


class SurfaceWriter(HandleOwner):
    """Writes linear images into one texture through surface stores. Made once per texture (it
    compiles the kernel on first use in the process, about 30 ms, and loads its module); the CUDA
    context of the texture's registration must be current.

    A ``HandleOwner`` (``cudapatch._lifecycle``): its ``SharedTexture2D`` closes it; one nobody
    closed is released by its finalizer (driver handles only), with a ``ResourceWarning``.

    Raises:
        KernelCompileError: NVRTC failed; CudaError: loading the module failed.
    """

    _closed_error = InteropError

    def __init__(self, width: int, height: int, texel_bytes: int) -> None:
        if texel_bytes not in (4, 16):
            raise ValueError(f"surface writes support 4- and 16-byte texels, not {texel_bytes}")
        d = driver()
        image = _image(texel_bytes)
        self.width, self.height = width, height
        self._surfaces: dict[int, Any] = {}  # CUarray handle -> surface object
        self._module = check(d.cuModuleLoadData(image.image), "cuModuleLoadData")
        self._releases = Releases()
        self._releases.push(d.cuModuleUnload, self._module, what="cuModuleUnload")
        self._arm(f"SurfaceWriter {width}x{height}", releases=self._releases, context=ContextRef.current())
        try:
            self._function = check(
                d.cuModuleGetFunction(self._module, image.entry_symbol.encode()), "cuModuleGetFunction"
            )
        except BaseException:
            self.close()
            raise
        self._grid = (-(-width // _BLOCK[0]), -(-height // _BLOCK[1]))
        self._args = (ctypes.c_uint64(0), ctypes.c_uint64(0), ctypes.c_uint32(width), ctypes.c_uint32(height))
        self._pitch = ctypes.c_uint32(width)
        values = (*self._args, self._pitch)
        self._keep = values
        self._params = (ctypes.c_void_p * 5)(*[ctypes.addressof(v) for v in values])

    def _surface(self, array: Any) -> int:
        key = int(array)
        surf = self._surfaces.get(key)
        if surf is None:
            d = driver()
            desc = d.CUDA_RESOURCE_DESC()
            desc.resType = d.CUresourcetype.CU_RESOURCE_TYPE_ARRAY
            desc.res.array.hArray = array
            surf = self._surfaces[key] = check(d.cuSurfObjectCreate(desc), "cuSurfObjectCreate")
            self._releases.push(d.cuSurfObjectDestroy, surf, what="cuSurfObjectDestroy")  # before the module's unload
        return int(surf)

    def surface(self, array: Any) -> int:
        """The ``CUsurfObject`` of ``array`` (a mapped level of this writer's texture), made once
        per array and destroyed with the writer.

        Raises:
            InteropError: the writer is closed.
            CudaError: cuSurfObjectCreate failed.
        """
        self._check_open("SurfaceWriter.surface")
        return self._surface(array)

    def write(self, array: Any, ptr: int, pitch_texels: int, stream: Any) -> None:
        """Enqueue the copy of the linear image at ``ptr`` into the mapped ``array`` on ``stream``.

        Raises:
            InteropError: the writer is closed.
            CudaError: the launch failed.
        """
        self._check_open("SurfaceWriter.write")
        self._args[0].value = ptr
        self._args[1].value = self._surface(array)
        self._pitch.value = pitch_texels
        d = driver()
        gx, gy = self._grid
        (err,) = d.cuLaunchKernel(
            self._function, gx, gy, 1, _BLOCK[0], _BLOCK[1], 1, 0, stream, ctypes.addressof(self._params), 0
        )
        if err:
            check((err,), "cuLaunchKernel(linear_to_surface)")

    def _release(self) -> None:
        """Destroy the surface objects and unload the module (``close``).

        Raises:
            CudaError: a driver call failed.
        """
        self._surfaces.clear()
        self._releases.release()

    def _forget(self) -> None:
        self._surfaces.clear()
        self._releases.forget()

    def __repr__(self) -> str:
        return f"<SurfaceWriter {self.width}x{self.height} surfaces={len(self._surfaces)} closed={self._closed}>"
