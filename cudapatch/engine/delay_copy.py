"""The copy that carries a FrameDelay's value in a patch with regions.

Outside regions a delay costs no copy: its two buffers swap roles between two executable graphs
(``phases.py``). Inside a ``For``/``While`` body the value must pass from one iteration to the next,
and the iterations are decided on the device, so the host cannot pick a phase per iteration. There
the delay's ``Out`` buffer is the state its readers read and its ``In`` buffer is what the body
writes; one copy kernel, last in the delay's scope (after every writer of ``In`` and every reader
of ``Out``; ``compiler/regions.py`` places it), copies ``In`` into ``Out`` at the end of each
iteration. A delay at the top level of a patch with regions is carried the same way, once a frame.
The price is one read and one write of the buffer per iteration; copy-free ping-pong (the body
unrolled by two with the pointers swapped) is not done.

A kernel, not a memcpy node: its pointers are ordinary kernel arguments, so Warm patches and both
graph kinds (top level, conditional bodies) treat it like any other kernel node.
"""

from __future__ import annotations

from functools import cache

from ..kernels.cuda_source import CudaSource
from ..kernels.descriptor import KernelDescriptor

__all__ = ["COPY_ENTRIES", "COPY_SOURCE", "copy_entry", "copy_grid", "copy_kernel"]

COPY_SOURCE = r"""
extern "C" __global__ void delay_copy4(const unsigned int* src, unsigned int* dst, unsigned int n)
{
    const unsigned int step = gridDim.x * blockDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = src[i];
}

extern "C" __global__ void delay_copy1(const unsigned char* src, unsigned char* dst, unsigned int n)
{
    const unsigned int step = gridDim.x * blockDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = src[i];
}
"""

#: Entry point -> the kernel index of a copy node in ``(block_id, kernel)`` keys (the delay's own
#: kernel is 0; negative indices never meet a block's kernels; -1..-7 are fusion's and the regions').
COPY_ENTRIES = {"delay_copy4": -8, "delay_copy1": -9}

BLOCK = 256  # threads per block
MAX_GRID = 8192  # blocks at most: the loop strides over the rest


def copy_entry(nbytes: int) -> tuple[str, int]:
    """The copy kernel for a buffer of ``nbytes`` bytes and the element count it is launched with:
    32-bit words when the size allows, else bytes."""
    if nbytes % 4 == 0:
        return "delay_copy4", nbytes // 4
    return "delay_copy1", nbytes


def copy_grid(n: int) -> int:
    """Thread blocks of a copy of ``n`` elements."""
    return max(1, min(-(-n // BLOCK), MAX_GRID))


@cache
def copy_kernel(entry: str) -> tuple[CudaSource, KernelDescriptor]:
    """The source and descriptor of one copy kernel (parsed once; no compile here)."""
    source = CudaSource(code=COPY_SOURCE, entry=entry, name="delay_copy.cu")
    return source, source.describe()
