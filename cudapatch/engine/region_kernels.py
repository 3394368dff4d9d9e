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

With ``Unroll`` U > 1 a loop is a main WHILE over U copies of its body (``region_begin_n``,
``region_*_step_n``: the count goes up by U a pass) and a tail WHILE of one copy for the rest
(``region_*_tail`` sets its handle between the two, then the one-step kernels above): see
``compiler/regions.py``.

The iteration counter is one of the graph's append counters, published through the readback ring, so
the host reads iteration counts without a stall (a nested loop's is that of its last run).
The limits are ordinary scalar arguments: a Hot edit of ``Count`` or ``Max`` patches them in place.

The same module holds the body timers (``body_tick``, ``body_tock``): at ``PerBlock`` and up, the
blocks inside bodies are timed on the device, every iteration, into records that come back with the
counters (``compiler/body_timers.py`` places them, ``region_stats.body_times`` reads them).
"""

from __future__ import annotations

from functools import cache

from ..kernels.cuda_source import CudaSource
from ..kernels.descriptor import KernelDescriptor

__all__ = ["REGION_SOURCE", "TIMER_SOURCE", "region_kernel", "REGION_ENTRIES", "TIMER_RECORD_WORDS", "TIMER_SLOT_WORDS"]

#: Counter words (uint32) of one body timer's record, and of one time slot (see ``body_tock``).
TIMER_RECORD_WORDS = 8
TIMER_SLOT_WORDS = 2

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

#: Unrolled loops (``Unroll`` U > 1, ``compiler/regions.py``): a main WHILE whose body holds U copies
#: of the region's blocks, then a tail WHILE of one copy for what is left, each with its own handle.
#: A kernel sets only the handle of a conditional node in its own graph (before the node) or of the
#: node whose body it is in (the canonical loop), never a sibling's from inside another body: so the
#: tail's handle is set by ``region_*_tail``, between the two conditional nodes.
REGION_SOURCE += r"""
extern "C" __global__ void region_begin_n(unsigned long long handle, unsigned int* counter, unsigned int limit,
                                          unsigned int unroll)
{
    *counter = 0u;
    cudaGraphSetConditional(handle, limit >= unroll);  // a whole pass of U copies fits below the limit
}

extern "C" __global__ void region_for_step_n(unsigned long long handle, unsigned int* counter, unsigned int count,
                                             unsigned int unroll)
{
    const unsigned int n = *counter + unroll;
    *counter = n;
    cudaGraphSetConditional(handle, n <= count && count - n >= unroll);
}

extern "C" __global__ void region_for_tail(unsigned long long handle, const unsigned int* counter, unsigned int count)
{
    cudaGraphSetConditional(handle, *counter < count);
}

extern "C" __global__ void region_while_step_n4(unsigned long long handle, const unsigned int* condition,
                                                unsigned int* counter, unsigned int max, unsigned int unroll)
{
    const unsigned int n = *counter + unroll;
    *counter = n;
    cudaGraphSetConditional(handle, *condition != 0u && n <= max && max - n >= unroll);
}

extern "C" __global__ void region_while_step_n1(unsigned long long handle, const unsigned char* condition,
                                                unsigned int* counter, unsigned int max, unsigned int unroll)
{
    const unsigned int n = *counter + unroll;
    *counter = n;
    cudaGraphSetConditional(handle, *condition != 0u && n <= max && max - n >= unroll);
}

// After the main loop: the tail runs while iterations are left below Max and the condition holds;
// with no iteration run yet (Max below U) it runs once regardless, as a While always does.
extern "C" __global__ void region_while_tail4(unsigned long long handle, const unsigned int* condition,
                                              const unsigned int* counter, unsigned int max)
{
    const unsigned int n = *counter;
    cudaGraphSetConditional(handle, n < max && (n == 0u || *condition != 0u));
}

extern "C" __global__ void region_while_tail1(unsigned long long handle, const unsigned char* condition,
                                              const unsigned int* counter, unsigned int max)
{
    const unsigned int n = *counter;
    cudaGraphSetConditional(handle, n < max && (n == 0u || *condition != 0u));
}
"""

#: A loop whose body holds FrameDelays carried by ping-pong (``compiler/region_delays.py``) runs what
#: its main loop leaves in two tails: one of pairs (two copies of the body, the second with the delays'
#: buffers swapped) while at least two iterations are left, then one of one copy. The pairs' tail is
#: entered by these (then stepped by ``region_*_step_n`` with an unroll of 2).
REGION_SOURCE += r"""
extern "C" __global__ void region_for_tail_n(unsigned long long handle, const unsigned int* counter,
                                             unsigned int count, unsigned int unroll)
{
    const unsigned int n = *counter;
    cudaGraphSetConditional(handle, n <= count && count - n >= unroll);
}

extern "C" __global__ void region_while_tail_n4(unsigned long long handle, const unsigned int* condition,
                                                const unsigned int* counter, unsigned int max, unsigned int unroll)
{
    const unsigned int n = *counter;
    cudaGraphSetConditional(handle, n <= max && max - n >= unroll && (n == 0u || *condition != 0u));
}

extern "C" __global__ void region_while_tail_n1(unsigned long long handle, const unsigned char* condition,
                                                const unsigned int* counter, unsigned int max, unsigned int unroll)
{
    const unsigned int n = *counter;
    cudaGraphSetConditional(handle, n <= max && max - n >= unroll && (n == 0u || *condition != 0u));
}
"""

#: Body timers (profiling at ``PerBlock`` and up, ``compiler/body_timers.py``). Event-record nodes are not
#: allowed in a conditional node's body (kernel, empty, child-graph, memset, memcpy and conditional nodes
#: are), and a timestamp slot written in a loop would keep only the last iteration; so a body block is
#: timed by two one-thread kernels reading the GPU's nanosecond timer (``%globaltimer``) that accumulate
#: into a record among the graph's counters, zeroed by the counters' memset at the start of each frame.
#: ``body_tick`` writes the start time into a slot; ``body_tock``, after the block's last nodes, adds
#: ``now - start`` to the record and writes its own time into another slot, which the next block in
#: the body takes as its start (then it needs no tick of its own on its path). A record is 8 counter
#: words, 8-byte aligned: the sum of the durations (u64, ns), their maximum (u64), the complement of
#: their minimum (u64: zeroed means "none yet", so one atomicMax keeps the minimum) and the count
#: (u32). Atomics: the copies of an unrolled body time the same block into one record. (A source of
#: its own, compiled in one module with the set-condition kernels, so those build for the host too.)
TIMER_SOURCE = r"""
extern "C" __global__ void body_tick(unsigned int* start)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    *reinterpret_cast<unsigned long long*>(start) = t;
}

extern "C" __global__ void body_tock(const unsigned int* start, unsigned int* end, unsigned int* record)
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    const unsigned long long s = *reinterpret_cast<const unsigned long long*>(start);
    *reinterpret_cast<unsigned long long*>(end) = t;
    const unsigned long long d = t > s ? t - s : 0ull;
    unsigned long long* r = reinterpret_cast<unsigned long long*>(record);
    atomicAdd(r, d);
    atomicMax(r + 1, d);
    atomicMax(r + 2, ~d);
    atomicAdd(record + 6, 1u);
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
    "region_begin_n": -8,
    "region_for_step_n": -9,
    "region_for_tail": -10,
    "region_while_step_n4": -11,
    "region_while_step_n1": -12,
    "region_while_tail4": -13,
    "region_while_tail1": -14,
    "region_for_tail_n": -15,
    "region_while_tail_n4": -16,
    "region_while_tail_n1": -17,
    "body_tick": -18,
    "body_tock": -19,
}


@cache
def region_kernel(entry: str) -> tuple[CudaSource, KernelDescriptor]:
    """The source and descriptor of one set-condition kernel (parsed once; no compile here)."""
    source = CudaSource(code=REGION_SOURCE + TIMER_SOURCE, entry=entry, name="regions.cu")
    return source, source.describe()
