"""The set-condition kernels of regions: one-thread kernels that decide on the device whether a
conditional node runs its body (again), so a region costs the host nothing per iteration.

A conditional node reads its handle's value when it is reached (``If``, and a ``While`` before its
first iteration) and after every iteration of its body (``While``). The value is set by a kernel
calling the device runtime's ``cudaGraphSetConditional``. NVRTC compiles such a call when the
function is declared (it is a ``__cudart_builtin__`` the driver resolves when the module loads); the
runtime headers do not declare it for NVRTC, so the source declares it itself.

Which kernel goes where (``compiler/regions.py`` places them):

- before an ``If``: ``region_if4``/``region_if1`` read the one-element condition (4- or 1-byte);
- before a ``For``/``While``: ``region_begin`` zeroes the iteration counter and runs the body when
  its limit (``Count``/``Max``) is not zero;
- last in a ``For`` body: ``region_for_step`` counts the iteration and goes on while it is below
  ``Count``;
- last in a ``While`` body: ``region_while_step4``/``1`` count the iteration and go on while the
  condition holds and the count is below ``Max``.

The iteration counter is one of the graph's append counters, published through the readback ring, so
the host reads iteration counts without a stall (a nested loop's is that of its last run).
The limits are ordinary scalar arguments: a Hot edit of ``Count`` or ``Max`` patches them in place.
"""

from __future__ import annotations

from functools import cache

from ..kernels.cuda_source import CudaSource
from ..kernels.descriptor import KernelDescriptor

__all__ = ["REGION_SOURCE", "region_kernel", "REGION_ENTRIES"]

REGION_SOURCE = r"""
typedef unsigned long long cudaGraphConditionalHandle;
extern "C" __device__ __cudart_builtin__ void cudaGraphSetConditional(cudaGraphConditionalHandle handle,
                                                                      unsigned int value);

extern "C" __global__ void region_if4(unsigned long long handle, const unsigned int* condition)
{
    cudaGraphSetConditional(handle, *condition != 0u);
}

extern "C" __global__ void region_if1(unsigned long long handle, const unsigned char* condition)
{
    cudaGraphSetConditional(handle, *condition != 0u);
}

extern "C" __global__ void region_begin(unsigned long long handle, unsigned int* counter, unsigned int limit)
{
    *counter = 0u;  // a loop nested in another starts counting again each time it is reached
    cudaGraphSetConditional(handle, limit != 0u);
}

extern "C" __global__ void region_for_step(unsigned long long handle, unsigned int* counter, unsigned int count)
{
    const unsigned int n = *counter + 1u;
    *counter = n;
    cudaGraphSetConditional(handle, n < count);
}

extern "C" __global__ void region_while_step4(unsigned long long handle, const unsigned int* condition,
                                              unsigned int* counter, unsigned int max)
{
    const unsigned int n = *counter + 1u;
    *counter = n;
    cudaGraphSetConditional(handle, *condition != 0u && n < max);
}

extern "C" __global__ void region_while_step1(unsigned long long handle, const unsigned char* condition,
                                              unsigned int* counter, unsigned int max)
{
    const unsigned int n = *counter + 1u;
    *counter = n;
    cudaGraphSetConditional(handle, *condition != 0u && n < max);
}
"""

#: Entry point -> the kernel index region nodes use in ``(block_id, kernel)`` keys: negative, so they
#: never meet a block's own kernels (the region block has none) in the functions map.
REGION_ENTRIES = {
    "region_if4": -2,
    "region_if1": -3,
    "region_begin": -4,
    "region_for_step": -5,
    "region_while_step4": -6,
    "region_while_step1": -7,
}


@cache
def region_kernel(entry: str) -> tuple[CudaSource, KernelDescriptor]:
    """The source and descriptor of one set-condition kernel (parsed once; no compile here)."""
    source = CudaSource(code=REGION_SOURCE, entry=entry, name="regions.cu")
    return source, source.describe()
