#!/usr/bin/env python3
"""Probe: can this driver continue after an illegal-address fault, and which reset sequence works?

Usage: python benchmarks/probes/probe_reset.py [variant]   variant: current | cleared | twice | release | create
"""

from __future__ import annotations

import sys
import threading

from cuda.bindings import driver as d
from cuda.bindings import nvrtc

SRC = b'extern "C" __global__ void k(float v) { *((volatile float*)(size_t)8) = v; }'


def kernel():
    prog = nvrtc.nvrtcCreateProgram(SRC, b"k.cu", 0, [], [])[1]
    nvrtc.nvrtcCompileProgram(prog, 1, [b"-arch=sm_90"])
    size = nvrtc.nvrtcGetCUBINSize(prog)[1]
    buf = b" " * size
    nvrtc.nvrtcGetCUBIN(prog, buf)
    mod = d.cuModuleLoadData(buf)[1]
    return d.cuModuleGetFunction(mod, b"k")[1]


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "cleared"
    d.cuInit(0)
    dev = d.cuDeviceGet(0)[1]
    ctx = d.cuDevicePrimaryCtxRetain(dev)[1]
    d.cuCtxSetCurrent(ctx)
    # another thread makes the context current too, like a background module loader
    t = threading.Thread(target=lambda: d.cuCtxSetCurrent(ctx))
    t.start()
    t.join()
    f = kernel()
    import ctypes

    v = ctypes.c_float(1.0)
    arg = (ctypes.c_void_p * 1)(ctypes.addressof(v))
    print("launch", d.cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(arg), 0)[0])
    print("sync", d.cuCtxSynchronize()[0])
    if variant == "cleared":
        print("set 0", d.cuCtxSetCurrent(0)[0])
    if variant == "release":
        print("release", d.cuDevicePrimaryCtxRelease(dev)[0])
    if variant == "create":  # a new, non-primary context instead of resetting the primary one
        try:
            r = d.cuCtxCreate(None, 0, dev)
        except TypeError:  # older bindings: cuCtxCreate(flags, dev)
            r = d.cuCtxCreate(0, dev)
        print("create", r[0])
        if not r[0]:
            print("alloc", d.cuMemAlloc(1024)[0])
            print("sync", d.cuCtxSynchronize()[0])
        return
    print("reset", d.cuDevicePrimaryCtxReset(dev)[0])
    if variant == "twice":
        print("reset2", d.cuDevicePrimaryCtxReset(dev)[0])
    r = d.cuDevicePrimaryCtxRetain(dev)
    print("retain", r[0])
    if not r[0]:
        print("set", d.cuCtxSetCurrent(r[1])[0])
        print("alloc", d.cuMemAlloc(1024)[0])
        print("sync", d.cuCtxSynchronize()[0])


if __name__ == "__main__":
    main()
