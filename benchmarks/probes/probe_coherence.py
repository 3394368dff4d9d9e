#!/usr/bin/env python3
"""Probe: does GL keep seeing what CUDA writes into memory it imported (GL_EXT_memory_object_fd)?

For each variant, CUDA writes a marker word into an imported buffer, GL reads it back, three times
with three markers. Variants differ in how the memory is imported and how GL reads:

  base       as ImportedBuffer does it, read with glGetNamedBufferSubData
  dedicated  the memory object marked GL_DEDICATED_MEMORY_OBJECT_EXT before the import
  barrier    glMemoryBarrier(ALL) + glFinish before each read
  copy       GL copies the imported buffer into a plain GL buffer on the GPU and reads that
  rename     a new buffer object on the same memory object for each read
  kernel     CUDA writes with a kernel instead of cuMemsetD32
Prints one line per variant: the markers GL read, and whether each equals what CUDA wrote.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("PYOPENGL_PLATFORM", "egl")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cudapatch.engine.device import DeviceContext  # noqa: E402
from cudapatch.interop import EglContext  # noqa: E402
from cudapatch.interop._gl import gl_function  # noqa: E402
from cudapatch.kernels._driver import check, driver  # noqa: E402

NBYTES = 2 << 20  # the allocation granularity
MARKERS = (0x5A17C0DE, 0x0DDBA11, 0x600DF00D)
_DEDICATED = 0x9581


def export(device: int):
    d = driver()
    prop = d.CUmemAllocationProp()
    prop.type = d.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = d.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = device
    prop.requestedHandleTypes = d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    handle = check(d.cuMemCreate(NBYTES, prop, 0), "cuMemCreate")
    ptr = int(check(d.cuMemAddressReserve(NBYTES, 0, 0, 0), "reserve"))
    check(d.cuMemMap(ptr, NBYTES, 0, handle, 0), "map")
    access = d.CUmemAccessDesc()
    access.location = prop.location
    access.flags = d.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    check(d.cuMemSetAccess(ptr, NBYTES, [access], 1), "access")
    fd = check(
        d.cuMemExportToShareableHandle(handle, d.CUmemAllocationHandleType.CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "export",
    )
    return ptr, int(fd)


def writer_kernel():
    from cuda.bindings import nvrtc

    d = driver()
    src = b'extern "C" __global__ void w(unsigned* p, unsigned v) { p[threadIdx.x] = v; }'
    prog = nvrtc.nvrtcCreateProgram(src, b"w.cu", 0, [], [])[1]
    nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
    size = nvrtc.nvrtcGetCUBINSize(prog)[1]
    buf = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, buf)
    mod = check(d.cuModuleLoadData(buf), "load")
    return check(d.cuModuleGetFunction(mod, b"w"), "fn")


def run(variant: str, dev: DeviceContext, fn) -> str:
    from OpenGL import GL
    from OpenGL.GL.EXT.memory_object import (
        glCreateMemoryObjectsEXT,
        glMemoryObjectParameterivEXT,
        glNamedBufferStorageMemEXT,
    )
    from OpenGL.GL.EXT.memory_object_fd import GL_HANDLE_TYPE_OPAQUE_FD_EXT, glImportMemoryFdEXT

    d = driver()
    get = gl_function(
        "glGetNamedBufferSubData", None, ctypes.c_uint, ctypes.c_ssize_t, ctypes.c_ssize_t, ctypes.c_void_p
    )
    ptr, fd = export(dev.ordinal)
    names = (GL.GLuint * 1)()
    glCreateMemoryObjectsEXT(1, names)
    mem = int(names[0])
    if variant == "dedicated":
        glMemoryObjectParameterivEXT(mem, _DEDICATED, (GL.GLint * 1)(1))
    glImportMemoryFdEXT(mem, NBYTES, GL_HANDLE_TYPE_OPAQUE_FD_EXT, fd)

    def new_buffer() -> int:
        GL.glCreateBuffers(1, names)
        glNamedBufferStorageMemEXT(int(names[0]), NBYTES, mem, 0)
        return int(names[0])

    buf = new_buffer()
    plain = None
    if variant == "copy":
        GL.glCreateBuffers(1, names)
        plain = int(names[0])
        GL.glNamedBufferStorage(plain, 4, np.zeros(1, np.uint32), GL.GL_DYNAMIC_STORAGE_BIT)
    read = []
    for marker in MARKERS:
        if variant == "kernel":
            p, v = ctypes.c_uint64(ptr), ctypes.c_uint32(marker)
            args = (ctypes.c_void_p * 2)(ctypes.addressof(p), ctypes.addressof(v))
            check(d.cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(args), 0), "launch")
        else:
            check(d.cuMemsetD32(ptr, marker, 1), "memset")
        check(d.cuCtxSynchronize(), "sync")
        if variant == "barrier":
            GL.glMemoryBarrier(GL.GL_ALL_BARRIER_BITS)
            GL.glFinish()
        if variant == "rename":
            buf = new_buffer()
        source = buf
        if plain is not None:
            GL.glCopyNamedBufferSubData(buf, plain, 0, 0, 4)
            source = plain
        word = ctypes.c_uint32(0)
        get(source, 0, 4, ctypes.addressof(word))
        read.append(word.value)
    err = GL.glGetError()
    ok = [r == m for r, m in zip(read, MARKERS, strict=True)]
    return f"{variant:10s} read {[hex(r) for r in read]} fresh {ok} glError {err:#x}"


def main() -> None:
    print("vulkan loaders:", glob.glob("/usr/lib*/**/libvulkan*", recursive=True)[:5])
    print("vulkan ICDs:", glob.glob("/usr/share/vulkan/icd.d/*") + glob.glob("/etc/vulkan/icd.d/*"))
    print("nvidia libs:", sorted({Path(p).name for p in glob.glob("/usr/lib*/**/libnvidia-*", recursive=True)})[:40])
    ctx = EglContext(64, 64)
    dev = DeviceContext(0)
    dev.make_current()
    ctx.make_current()
    fn = writer_kernel()
    for variant in ("base", "dedicated", "barrier", "copy", "rename", "kernel"):
        try:
            print(run(variant, dev, fn), flush=True)
        except Exception as exc:
            print(f"{variant:10s} failed: {exc!r}", flush=True)


if __name__ == "__main__":
    main()
