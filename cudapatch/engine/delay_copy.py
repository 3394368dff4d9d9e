"""The kernels that carry a FrameDelay's value in a patch with regions.

Outside regions a delay costs no copy: its two buffers swap roles between two executable graphs
(``phases.py``). Inside a ``For``/``While`` body the value must pass from one iteration to the next,
and the iterations are decided on the device, so the host cannot pick a phase per iteration.

- **Ping-pong** (a loop with ``Unroll`` >= 2, ``compiler/region_delays.py``): the copies of the body
  alternate the delay's two buffers, so no iteration copies anything. After the loop one sync kernel
  (``delay_sync4``/``1``) reads the loop's iteration counter: after an odd count the newest value is
  in the ``In`` buffer and is copied into ``Out``; after an even one it is in ``Out`` and is copied
  into ``In``; so both hold it, as a frame without ping-pong leaves them. One copy a frame, not one an
  iteration.
- **Copy** (``Unroll`` 1, or a delay ping-pong cannot carry): the delay's ``Out`` buffer is the state
  its readers read and its ``In`` buffer is what the body writes; one copy kernel (``delay_copy4``/
  ``1``), last in the delay's scope (after every writer of ``In`` and every reader of ``Out``;
  ``compiler/regions.py`` places it), copies ``In`` into ``Out`` at the end of each iteration. A
  delay at the top level of a patch with regions is carried the same way, once a frame.

Kernels, not memcpy nodes: their pointers are ordinary kernel arguments, so Warm patches and both
graph kinds (top level, conditional bodies) treat them like any other kernel node.
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

// After a loop whose copies of the body alternate the pair: make both buffers hold the newest value.
// Iteration k (0-based) of the loop reads previous and writes current when k is even, the other way
// round when it is odd; so after `iterations` of them the newest is in current when the count is odd.
extern "C" __global__ void delay_sync4(unsigned int* previous, unsigned int* current, unsigned int n,
                                       const unsigned int* iterations)
{
    const unsigned int k = *iterations;
    if (k == 0u) return;  // the body did not run: previous still holds the state
    const unsigned int* src = (k & 1u) ? current : previous;
    unsigned int* dst = (k & 1u) ? previous : current;
    const unsigned int step = gridDim.x * blockDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = src[i];
}

extern "C" __global__ void delay_sync1(unsigned char* previous, unsigned char* current, unsigned int n,
                                       const unsigned int* iterations)
{
    const unsigned int k = *iterations;
    if (k == 0u) return;
    const unsigned char* src = (k & 1u) ? current : previous;
    unsigned char* dst = (k & 1u) ? previous : current;
    const unsigned int step = gridDim.x * blockDim.x;
    for (unsigned int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step)
        dst[i] = src[i];
}
"""

#: Entry point -> the kernel index of a copy node in ``(block_id, kernel)`` keys (the delay's own
#: kernel is 0; negative indices never meet a block's kernels; -1..-7 are fusion's and the regions').
COPY_ENTRIES = {"delay_copy4": -8, "delay_copy1": -9, "delay_sync4": -10, "delay_sync1": -11}

BLOCK = 256  # threads per block
MAX_GRID = 8192  # blocks at most: the loop strides over the rest


def copy_entry(nbytes: int, kind: str = "copy") -> tuple[str, int]:
    """The copy kernel (``kind`` ``copy``, or ``sync`` after a ping-pong loop) for a buffer of
    ``nbytes`` bytes and the element count it is launched with: 32-bit words when the size allows,
    else bytes."""
    if nbytes % 4 == 0:
        return f"delay_{kind}4", nbytes // 4
    return f"delay_{kind}1", nbytes


def copy_grid(n: int) -> int:
    """Thread blocks of a copy of ``n`` elements."""
    return max(1, min(-(-n // BLOCK), MAX_GRID))


@cache
def copy_kernel(entry: str) -> tuple[CudaSource, KernelDescriptor]:
    """The source and descriptor of one copy or sync kernel (parsed once; no compile here)."""
    source = CudaSource(code=COPY_SOURCE, entry=entry, name="delay_copy.cu")
    return source, source.describe()
