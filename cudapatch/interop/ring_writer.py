"""``GlRingWriter``: the block that copies an engine output into an ``ImportedRing`` inside the graph.

The zero-map path shares CUDA memory with GL through a ring of three buffers (see
``imported.py``). Which buffer a frame may write is decided on the host (GL may be drawing one,
CUDA may not have finished another), but issuing that copy from the host costs a frame two driver
calls. Instead this block's kernel is part of the graph, and the host passes each launch its
buffer through mapped pinned memory: before a launch it writes a *request* ``(tag << 2) | slot``
into a 64-entry table; the kernel takes the request whose tag equals its own launch count (kept in
device memory), copies into that slot, and its last thread block publishes the new count into the
host's ``done`` word. A launch without a matching request (the host dropped the frame) copies
nothing and counts nothing. The host reads ``done`` with a plain load: no driver call per frame.
"""

from __future__ import annotations

from ..blocks.block import Block
from ..blocks.builder import BlockBuilder
from ..blocks.description import like
from ..kernels.cuda_source import CudaSource
from ..kernels.types import DType

__all__ = ["GlRingWriter", "REQUESTS", "ring_writer_source"]

#: Entries of the request table: how many launches the host may be ahead of the GPU's copies.
REQUESTS = 64

_SOURCE = r"""
extern "C" __global__ void gl_ring_write(const ELEMENT* in, unsigned int n, unsigned long long capacity,
                                         unsigned long long dst0, unsigned long long dst1,
                                         unsigned long long dst2, unsigned long long state,
                                         unsigned long long requests, unsigned long long host_done)
{
    // state (device memory): [0] launches copied so far, [1] low half: blocks finished this launch
    unsigned long long* st = (unsigned long long*)state;
    __shared__ unsigned long long tag;
    __shared__ int slot;
    if (threadIdx.x == 0) {
        tag = st[0];
        unsigned long long e = ((volatile unsigned long long*)requests)[tag % REQUESTS];
        slot = (e >> 2) == tag ? (int)(e & 3) : -1;
    }
    __syncthreads();
    if (slot < 0 || slot > 2) return;  // no request for this launch: every block returns here
    ELEMENT* dst = (ELEMENT*)(slot == 0 ? dst0 : slot == 1 ? dst1 : dst2);
    unsigned long long fit = capacity / sizeof(ELEMENT);
    unsigned long long count = n < fit ? n : fit;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < count;
         i += (unsigned long long)gridDim.x * blockDim.x)
        dst[i] = in[i];
    __threadfence();  // this block's copies are visible device-wide before it is counted
    __syncthreads();
    if (threadIdx.x == 0) {
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


_CUDA_SPELLING = {"uint": "unsigned int", "long": "long long", "ulong": "unsigned long long", "uchar": "unsigned char"}


def ring_writer_source(dtype: DType) -> str:
    """The writer kernel's CUDA C++ for elements of ``dtype``."""
    element = _CUDA_SPELLING.get(dtype.c_name, dtype.c_name)
    return _SOURCE.replace("ELEMENT", element).replace("REQUESTS", str(REQUESTS))


class GlRingWriter(Block):
    """Copies input ``In`` (elements of the ``Type`` text parameter) into the ``ImportedRing`` slot
    the host requested for this launch. The ring's addresses are ``UINT64`` scalars set by
    ``ImportedRing.attach``; ``GlBridge.show_buffer_ring`` adds, wires and removes this block."""

    type_name = "GlRingWriter"

    def describe(self, b: BlockBuilder) -> None:
        element = b.text("Type", default="float", description="C type of the elements copied")
        try:
            dtype = DType.from_c_name(element)
        except KeyError:
            raise b._error(f"Type: unknown element type '{element}'") from None
        k = b.add_kernel(CudaSource(code=ring_writer_source(dtype), name=f"{self.name}.cu"))
        b.input("In", k.in_(0))
        k.set_count(1, like("In"))
        for i, name in enumerate(("Capacity", "Dst0", "Dst1", "Dst2", "State", "Requests", "HostDone"), start=2):
            b.scalar(name, k.in_(i), default=0)
        k.auto_grid(like("In"))
