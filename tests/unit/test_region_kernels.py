"""The set-condition kernels of regions and the FrameDelay copy and sync kernels, without a GPU: each
compiles with NVRTC to a cubin, and their CUDA source, built for the host with the CUDA keywords
defined away, computes what the plan interpreter (``plan_interp.py``) mirrors, over a grid of
counters, limits, unrolls and conditions, so the interpreter's proofs hold for the real kernels."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from cudapatch.engine.delay_copy import COPY_ENTRIES, COPY_SOURCE, copy_kernel
from cudapatch.engine.region_kernels import REGION_ENTRIES, REGION_SOURCE, region_kernel

from .plan_interp import _region


@pytest.mark.parametrize("entry", [*REGION_ENTRIES, *COPY_ENTRIES])
def test_every_region_and_delay_kernel_compiles_to_a_cubin(entry: str) -> None:
    source, desc = (region_kernel if entry in REGION_ENTRIES else copy_kernel)(entry)
    img = source.compile("sm_90")
    assert img.kind == "cubin" and desc.entry_point == entry


_PRELUDE = r"""
#define __global__
#define __device__
#define __cudart_builtin__
struct Dim3 { unsigned int x; };
static Dim3 blockIdx = {0}, threadIdx = {0}, blockDim = {1}, gridDim = {1};
"""
_AFTER = r"""
static unsigned long long g_handle;
static unsigned int g_value;
extern "C" void cudaGraphSetConditional(unsigned long long handle, unsigned int value)
{
    g_handle = handle;
    g_value = value;
}
extern "C" unsigned int last_value(void) { return g_value; }
extern "C" unsigned long long last_handle(void) { return g_handle; }
"""


@pytest.fixture(scope="module")
def host_kernels(tmp_path_factory: pytest.TempPathFactory) -> ctypes.CDLL:
    """The kernels' source built as a host library (one thread: the grid-stride loops cover every element)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler to run the kernels' logic on the CPU")
    folder: Path = tmp_path_factory.mktemp("region_kernels")
    src = folder / "kernels.cpp"
    src.write_text(_PRELUDE + REGION_SOURCE + COPY_SOURCE + _AFTER)
    lib = folder / "kernels.so"
    subprocess.run([cxx, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True, capture_output=True)
    out = ctypes.CDLL(str(lib))
    out.last_value.restype = ctypes.c_uint
    out.last_handle.restype = ctypes.c_ulonglong
    return out


def _call(lib: ctypes.CDLL, entry: str, c: int, limit: int, u: int, cond: int) -> tuple[int, bool]:
    """Run one set-condition kernel on the host: (the counter after it, the handle's value)."""
    _, desc = region_kernel(entry)
    counter = (ctypes.c_uint * 1)(c)
    condition = (ctypes.c_ubyte * 1)(cond) if entry.endswith("1") else (ctypes.c_uint * 1)(cond)
    args: list = []
    for p in desc.parameters:
        if p.name == "handle":
            args.append(ctypes.c_ulonglong(4242))
        elif p.name == "condition":
            args.append(condition)
        elif p.name == "counter":
            args.append(counter)
        elif p.name == "unroll":
            args.append(ctypes.c_uint(u))
        else:  # limit, count, max
            args.append(ctypes.c_uint(limit))
    getattr(lib, entry)(*args)
    return counter[0], bool(lib.last_value())


@pytest.mark.parametrize("entry", [e for e in REGION_ENTRIES if e.startswith("region_")])  # timers: test_body_timers
def test_the_interpreter_mirrors_each_set_condition_kernel(host_kernels: ctypes.CDLL, entry: str) -> None:
    unrolls = range(1, 5) if "unroll" in {p.name for p in region_kernel(entry)[1].parameters} else (1,)
    for c in range(7):
        for limit in range(7):
            for u in unrolls:
                for cond in (0, 1):
                    counter, value = _call(host_kernels, entry, c, limit, u, cond)
                    assert host_kernels.last_handle() == 4242
                    new, go = _region(entry, c, limit, u, bool(cond))
                    want = c if new is None else new
                    assert (counter, value) == (want, go), (entry, c, limit, u, cond)


@pytest.mark.parametrize("entry", ["delay_sync4", "delay_sync1"])
def test_the_sync_kernel_copies_the_newest_buffer_into_the_other(host_kernels: ctypes.CDLL, entry: str) -> None:
    word = np.uint32 if entry.endswith("4") else np.uint8
    rng = np.random.default_rng(3)
    for k in range(5):
        prev = rng.integers(0, 200, 37).astype(word)
        cur = rng.integers(0, 200, 37).astype(word)
        want_prev, want_cur = prev.copy(), cur.copy()
        if k:  # odd: the last iteration wrote current; even: previous
            (want_prev if k & 1 else want_cur)[:] = cur if k & 1 else prev
        iterations = np.array([k], np.uint32)
        getattr(host_kernels, entry)(
            prev.ctypes.data_as(ctypes.c_void_p),
            cur.ctypes.data_as(ctypes.c_void_p),
            ctypes.c_uint(37),
            iterations.ctypes.data_as(ctypes.c_void_p),
        )
        np.testing.assert_array_equal(prev, want_prev, err_msg=f"k={k}")
        np.testing.assert_array_equal(cur, want_cur, err_msg=f"k={k}")


def test_the_copy_kernel_copies_in_into_out(host_kernels: ctypes.CDLL) -> None:
    src = np.arange(10, dtype=np.uint32)
    dst = np.zeros(10, np.uint32)
    host_kernels.delay_copy4(
        src.ctypes.data_as(ctypes.c_void_p), dst.ctypes.data_as(ctypes.c_void_p), ctypes.c_uint(10)
    )
    np.testing.assert_array_equal(dst, src)
    assert set(COPY_ENTRIES) <= {
        line.split("void ")[1].split("(")[0] for line in COPY_SOURCE.splitlines() if "__global__" in line
    }
