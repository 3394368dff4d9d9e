#!/usr/bin/env python3
"""Diagnostic: what does each way of timestamping a 100-kernel chain cost on the GPU?

Builds raw CUDA graphs (no engine) of a chain of 100 ``scale`` kernels over 1M floats and adds, in
turn: nothing; an empty end kernel; a one-thread end stamp; the publish kernel with and without its
system fences; a start stamp beside the root; per-kernel stamp kernels as side branches (joined at
the end, or chained to each other), on the path; and event record nodes as side branches. Prints
the GPU time per frame of each (100 back-to-back launches between events, median of 7) and its
overhead over the bare chain.
"""

from __future__ import annotations

import ctypes
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from cuda.bindings import driver as d  # noqa: E402

from cudapatch.engine.device import DeviceContext  # noqa: E402
from cudapatch.kernels._driver import check  # noqa: E402
from cudapatch.kernels._toolchain import nvrtc_compile  # noqa: E402

SRC = r"""
extern "C" __global__ void scale(const float* in, float* out, float g, unsigned n)
{ unsigned i = blockIdx.x*blockDim.x+threadIdx.x; if (i<n) out[i]=in[i]*g; }
extern "C" __global__ void empty() {}
extern "C" __global__ void stamp(unsigned long long* s, unsigned int k)
{ unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); s[k] = t; }
extern "C" __global__ void stamp_wait(unsigned long long* s, unsigned int k)
{
    asm volatile("griddepcontrol.wait;" ::: "memory");  // a programmatic dependent: its primary is done
    unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); s[k] = t;
}
__device__ unsigned long long g_stamps[256];
extern "C" __global__ void stamp_np()
{ unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (threadIdx.x == 0) g_stamps[blockDim.x - 1] = t; }
extern "C" __global__ void publish_rel(unsigned long long* src, unsigned int words,
                                   unsigned long long* ring, unsigned int slot_words,
                                   unsigned long long* frames, unsigned int end_stamp, int fences)
{
    __shared__ unsigned long long frame;
    if (fences & 4) asm volatile("griddepcontrol.wait;" ::: "memory");
    if (threadIdx.x == 0) {
        unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (end_stamp) src[end_stamp] = t;
        frame = *frames + 1;
    }
    if (threadIdx.x == 0 && (fences & 1)) asm volatile("fence.acq_rel.sys;" ::: "memory");
    __syncthreads();
    volatile unsigned long long* slot = ring + (frame % 3) * slot_words;
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) slot[2 + i] = src[i];
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        slot[1] = frame; *frames = frame;
        ring[((frame + 1) % 3) * slot_words + 1] = 0;
    }
}
extern "C" __global__ void publish(unsigned long long* src, unsigned int words,
                                   unsigned long long* ring, unsigned int slot_words,
                                   unsigned long long* frames, unsigned int end_stamp, int fences)
{
    __shared__ unsigned long long frame;
    if (threadIdx.x == 0) {
        unsigned long long t; asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (end_stamp) src[end_stamp] = t;
        frame = *frames + 1;
    }
    __syncthreads();
    volatile unsigned long long* slot = ring + (frame % 3) * slot_words;
    if (threadIdx.x == 0) { slot[0] = frame; if (fences & 1) __threadfence_system(); }
    __syncthreads();
    for (unsigned int i = threadIdx.x; i < words; i += blockDim.x) slot[2 + i] = src[i];
    if (fences & 2) __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0) { slot[1] = frame; *frames = frame; }
}
"""
N = 1 << 20
CHAIN = 100


def args_of(*vals):
    """Kernel params: (value, ctype) pairs -> the void** array cuda-python takes (kept alive)."""
    holders = [ctype(v) for v, ctype in vals]
    arr = (ctypes.c_void_p * len(holders))(*[ctypes.addressof(h) for h in holders])
    return arr, holders


class Builder:
    def __init__(self, funcs):
        self.f = funcs
        self.graph = check(d.cuGraphCreate(0))
        self.keep = []

    def kernel(self, name, grid, block, vals, deps):
        p = d.CUDA_KERNEL_NODE_PARAMS()
        p.func = self.f[name]
        p.gridDimX, p.gridDimY, p.gridDimZ = grid, 1, 1
        p.blockDimX, p.blockDimY, p.blockDimZ = block, 1, 1
        p.sharedMemBytes = 0
        arr, holders = args_of(*vals)
        self.keep.append((arr, holders))
        p.kernelParams = ctypes.addressof(arr)
        return check(d.cuGraphAddKernelNode(self.graph, deps, len(deps), p))

    def programmatic(self, src, dst, port):
        e = d.CUgraphEdgeData()
        e.type = d.CUgraphDependencyType.CU_GRAPH_DEPENDENCY_TYPE_PROGRAMMATIC
        e.from_port = port
        check(d.cuGraphAddDependencies(self.graph, [src], [dst], [e], 1))

    def event(self, ev, deps):
        return check(d.cuGraphAddEventRecordNode(self.graph, deps, len(deps), ev))


def main() -> None:
    dev = DeviceContext(0)
    dev.make_current()
    s = dev.stream
    img = nvrtc_compile(SRC, name="probe_stamps.cu", entry="scale", arch=dev.arch)[0]
    mod = check(d.cuModuleLoadData(img))
    funcs = {
        n: check(d.cuModuleGetFunction(mod, n.encode()))
        for n in ("scale", "empty", "stamp", "publish", "stamp_np", "publish_rel", "stamp_wait")
    }
    a = check(d.cuMemAlloc(N * 4))
    b = check(d.cuMemAlloc(N * 4))
    check(d.cuMemsetD32(a, 0, N))
    stamps = check(d.cuMemAlloc(8 * 256))
    frames = check(d.cuMemAlloc(8))
    check(d.cuMemsetD32(frames, 0, 2))
    ring_host = check(d.cuMemHostAlloc(8 * 3 * 260, 2))  # DEVICEMAP
    ring = check(d.cuMemHostGetDevicePointer(ring_host, 0))
    events = [check(d.cuEventCreate(0)) for _ in range(CHAIN + 2)]
    P, U, F = ctypes.c_void_p, ctypes.c_uint, ctypes.c_float

    def build(name: str):
        variant = name.split()
        g = Builder(funcs)
        prev = []
        chain = []
        side = []
        start = None
        if "start" in variant:
            if "onpath" in variant:
                prev = [g.kernel("stamp", 1, 1, [(int(stamps), P), (0, U)], [])]
            elif "pdlstart" in variant:
                start = g.kernel("stamp", 1, 1, [(int(stamps), P), (0, U)], [])
            else:
                side.append(g.kernel("stamp", 1, 1, [(int(stamps), P), (0, U)], []))
        for i in range(CHAIN):
            src, dst = (a, b) if i % 2 == 0 else (b, a)
            node = g.kernel("scale", N // 256, 256, [(int(src), P), (int(dst), P), (1.0, F), (N, U)], prev)
            if i == 0 and start is not None:  # the chain may launch once the stamp kernel has begun
                g.programmatic(start, node, d.CU_GRAPH_KERNEL_NODE_PORT_LAUNCH_ORDER)
            chain.append(node)
            prev = [node]
            if "late" in variant:
                pass
            elif "pdlside" in variant:
                side.append(g.kernel("stamp_wait", 1, 1, [(int(stamps), P), (i + 2, U)], []))
                g.programmatic(node, side[-1], d.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC)
            elif "nparam" in variant:
                side.append(g.kernel("stamp_np", 1, i + 2, [], [node]))
            elif "prio" in variant:
                side.append(g.kernel("stamp", 1, 1, [(int(stamps), P), (i + 2, U)], [node]))
                attr = d.CUkernelNodeAttrValue()
                attr.priority = -5 if "high" in variant else 0
                check(
                    d.cuGraphKernelNodeSetAttribute(side[-1], d.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PRIORITY, attr)
                )
            elif "half" in variant:
                if i % 2:
                    side.append(g.kernel("stamp", 1, 1, [(int(stamps), P), (i + 2, U)], [node]))
            elif "sidestamps" in variant:
                deps = [node] + ([side[-1]] if "chained" in variant and side else [])
                side.append(g.kernel("stamp", 1, 1, [(int(stamps), P), (i + 2, U)], deps))
            elif "pathstamps" in variant:
                prev = [g.kernel("stamp", 1, 1, [(int(stamps), P), (i + 2, U)], [node])]
            elif "sideevents" in variant:
                side.append(g.event(events[i], [node]))
        if "late" in variant:
            side = [g.kernel("stamp", 1, 1, [(int(stamps), P), (i + 2, U)], [n]) for i, n in enumerate(chain)]
        if "startlate" in variant:
            side.append(g.kernel("stamp", 1, 1, [(int(stamps), P), (0, U)], []))
        end_deps = prev + (side if "chained" not in variant else side[-1:])
        if "empty" in variant:
            g.kernel("empty", 1, 1, [], end_deps)
        elif "endstamp" in variant:
            g.kernel("stamp", 1, 1, [(int(stamps), P), (1, U)], end_deps)
        elif "relpub" in variant:
            pdl = "pdlpub" in variant
            flags = (1 if "fence2" in variant else 0) | (4 if pdl else 0)
            pub = g.kernel(
                "publish_rel",
                1,
                128,
                [(int(stamps), P), (CHAIN + 2, U), (int(ring), P), (CHAIN + 4, U)]
                + [(int(frames), P), (1, U), (flags, ctypes.c_int)],
                [n for n in end_deps if not (pdl and n is chain[-1])],
            )
            if pdl:  # launched while the last kernel finishes; waits for it inside (griddepcontrol.wait)
                g.programmatic(chain[-1], pub, d.CU_GRAPH_KERNEL_NODE_PORT_PROGRAMMATIC)
        elif "publish" in variant:
            fences = 0 if "nofence" in variant else (2 if "onefence" in variant else 3)
            g.kernel(
                "publish",
                1,
                128,
                [
                    (int(stamps), P),
                    (CHAIN + 2, U),
                    (int(ring), P),
                    (CHAIN + 4, U),
                    (int(frames), P),
                    (1, U),
                    (fences, ctypes.c_int),
                ],
                end_deps,
            )
        return check(d.cuGraphInstantiate(g.graph, 0)), g

    def time_graph(exe, frames_n=100, reps=7):
        e0, e1 = check(d.cuEventCreate(0)), check(d.cuEventCreate(0))
        for _ in range(20):
            check(d.cuGraphLaunch(exe, s))
        check(d.cuStreamSynchronize(s))
        out = []
        for _ in range(reps):
            check(d.cuEventRecord(e0, s))
            for _ in range(frames_n):
                check(d.cuGraphLaunch(exe, s))
            check(d.cuEventRecord(e1, s))
            check(d.cuEventSynchronize(e1))
            out.append(check(d.cuEventElapsedTime(e0, e1)) * 1e3 / frames_n)
        return statistics.median(out)

    variants = [
        "bare",
        "start onpath relpub",
        "start pdlstart relpub",
        "start onpath pdlpub relpub",
        "start pdlstart pdlpub relpub",
        "sidestamps relpub",
        "pdlside relpub",
        "start pdlstart pdlside pdlpub relpub",
        "bare",
    ]
    base = None
    print(f"{CHAIN} x scale({N}) chain; GPU µs per frame, back-to-back launches")
    for rnd in range(2):
        for v in variants:
            exe, keep = build(v)
            t = time_graph(exe)
            if v == "bare" and (base is None or rnd):
                base = t if base is None else min(base, t)
            print(f"round {rnd} {v:32s} {t:9.2f} µs  {100 * (t / base - 1):+6.2f} %", flush=True)
            if "side" in v and rnd == 0:  # do the stamps measure the kernels? one frame, read them back
                check(d.cuMemsetD32(stamps, 0, 2 * 256))
                check(d.cuStreamSynchronize(s))
                check(d.cuGraphLaunch(exe, s))
                check(d.cuStreamSynchronize(s))
                host = (ctypes.c_uint64 * 256)()
                check(d.cuMemcpyDtoH(host, stamps, 8 * 256))
                ts = [host[i + 2] for i in range(CHAIN)]
                diffs = [(b - a) / 1e3 for a, b in zip(ts, ts[1:], strict=False)]
                print(
                    f"   per-kernel spans from the stamps: median {statistics.median(diffs):.2f} µs, "
                    f"min {min(diffs):.2f}, max {max(diffs):.2f}; first to last {(ts[-1] - ts[0]) / 1e3:.1f} µs",
                    flush=True,
                )
            check(d.cuGraphExecDestroy(exe))
            check(d.cuGraphDestroy(keep.graph))


if __name__ == "__main__":
    main()
