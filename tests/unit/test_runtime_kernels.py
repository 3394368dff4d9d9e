"""Runtime kernels without a GPU: NVRTC, nvJitLink and Numba compile to cubins on the CPU."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cudapatch import CudaSource, CustomKernel, KernelFile, NumbaSource, PtxFileSource, Scale, bundled_kernel
from cudapatch.engine import Context
from cudapatch.errors import CudapatchError, KernelCompileError, KernelLoadError
from cudapatch.kernels import CubinCache, DType, FileWatcher, describe_cuda_source
from cudapatch.kernels import cuda_source as cuda_source_module
from cudapatch.kernels.cache import cache_key, default_cache_dir

ELF = b"\x7fELF"
GAIN = """// cudapatch: blockSize=128
// cudapatch: description=Scales.
extern "C" __global__ void k(const float* __restrict__ in, float* out, /*inout*/ unsigned int* hits,
                             float gain, float3 axis, unsigned int n)
{
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) { out[i] = in[i] * gain; atomicAdd(hits, 1u); }
}
"""


def test_signature_parser() -> None:
    d = describe_cuda_source(GAIN)
    assert d.entry_point == "k" and d.block_size == 128 and d.description == "Scales."
    assert [(p.name, p.dtype, p.is_pointer, p.direction) for p in d.parameters] == [
        ("in", DType.FLOAT32, True, "in"),
        ("out", DType.FLOAT32, True, "out"),
        ("hits", DType.UINT32, True, "inout"),
        ("gain", DType.FLOAT32, False, "in"),
        ("axis", DType.FLOAT3, False, "in"),
        ("n", DType.UINT32, False, "in"),
    ]
    two = GAIN + '\nextern "C" __global__ void other(float* o) { }\n'
    with pytest.raises(KernelCompileError, match=r"found 2 __global__ kernels \(k, other\)"):
        describe_cuda_source(two)
    assert describe_cuda_source(two, "other").parameters[0].name == "o"
    with pytest.raises(KernelCompileError, match="no __global__ kernel 'nope'"):
        describe_cuda_source(two, "nope")
    with pytest.raises(KernelCompileError, match="type 'MyStruct'") as info:
        describe_cuda_source("\n\n__global__ void k(MyStruct s) {}", file="m.cu")
    assert info.value.file == "m.cu" and info.value.line == 3


def test_nvrtc_compiles_to_a_cubin_for_the_arch() -> None:
    img = CudaSource(code=GAIN, name="gain.cu").compile("sm_90")
    assert img.kind == "cubin" and img.image.startswith(ELF) and img.symbol == "k"
    assert img.descriptor.entry_point == "k"
    assert CudaSource(code=GAIN).compile("sm_80").image != img.image


def test_an_empty_compiler_log_leaves_the_interpreters_bytes_alone() -> None:
    # An empty NVRTC log is one NUL byte. Read into b" " * 1 (CPython's cached one-byte b" "), it
    # turned every later b" " of the process into b"\\0": printed spaces vanished in later tests (3.12).
    from cudapatch.kernels._toolchain import nvrtc_compile

    code = 'extern "C" __global__ void quiet(float* x) { x[0] = 1.0f; }'
    cubin, _, log = nvrtc_compile(code, name="quiet.cu", entry="quiet", arch="sm_90", minimal=False)
    assert log == "" and cubin
    one = len(log) + 1  # computed: a literal b" " * 1 is folded into a constant of its own
    assert (b" " * one)[0] == 0x20
    assert " ".encode() == bytes([0x20])  # noqa: UP012 - the encoder hands out the cached one-byte objects


def test_nvrtc_errors_carry_the_log_file_and_line() -> None:
    bad = GAIN.replace("in[i] * gain", "in[i] * gane")
    with pytest.raises(KernelCompileError) as info:
        CudaSource(code=bad, name="gain.cu").compile("sm_90")
    err = info.value
    assert err.file == "gain.cu" and err.line == 7 and 'identifier "gane" is undefined' in err.message
    assert "gane" in err.log and "1 error detected" in err.log


def test_nvrtc_ptx_builds_the_bundled_kernels_ptx() -> None:
    # tools/build_kernels.py --nvrtc: PTX for compute_75 that nvJitLink links like the shipped file.
    from cudapatch.kernels._toolchain import link_ptx, nvrtc_ptx

    src = bundled_kernel("scale")
    ptx = nvrtc_ptx(src.ptx_path.with_suffix(".cu").read_text(), name="scale.cu")
    assert b".target sm_75" in ptx and b".entry scale" in ptx and not ptx.endswith(b"\0")
    assert link_ptx(ptx, name="scale.ptx", arch="sm_90", kernel="scale").startswith(ELF)
    with pytest.raises(KernelCompileError) as info:
        nvrtc_ptx(GAIN.replace("in[i] * gain", "in[i] * gane"), name="gain.cu")
    assert info.value.file == "gain.cu" and info.value.line == 7 and "gane" in info.value.log


def test_ptx_files_compile_through_nvjitlink() -> None:
    img = bundled_kernel("scale").compile("sm_90")
    assert img.kind == "cubin" and img.image.startswith(ELF)


def test_bad_ptx_reports_the_line(tmp_path: Path) -> None:
    src = bundled_kernel("fill")
    (tmp_path / "k.json").write_text(src.sidecar_path.read_text())
    (tmp_path / "k.ptx").write_text(src.ptx_path.read_text().replace("ret;", "bogus_instruction;"))
    with pytest.raises(KernelCompileError, match="bogus_instruction") as info:
        PtxFileSource(tmp_path / "k.ptx").compile("sm_90")
    assert info.value.line is not None and "bogus_instruction" in info.value.log


def _saxpy(out, x, y, a, n):  # noqa: ANN001 - a Numba kernel
    from numba import cuda

    i = cuda.grid(1)
    if i < n:
        out[i] = a * x[i] + y[i]


def test_numba_descriptor_expands_arrays() -> None:
    src = NumbaSource(_saxpy, ("float32[:]", "float32[:]", "float32[:]", "float32", "int32"), outputs=("out",))
    d = src.describe()
    assert [p.name for p in d.parameters] == ["out", "x", "y", "a", "n"]
    assert d.parameters[0].direction == "out" and d.parameters[1].direction == "in"
    assert len(d.slots) == 3 * 7 + 2
    assert d.groups[0] == ("meminfo", "parent", "nitems", "itemsize", "data", "shape0", "stride0")
    assert d.groups[3] == ("value",) and d.layout()[-2:] == ((4, 4), (4, 4))
    assert src == NumbaSource(_saxpy, ("float32[:]", "float32[:]", "float32[:]", "float32", "int32"), outputs=("out",))


def test_numba_compiles_and_checks_the_expansion_against_the_ptx() -> None:
    pytest.importorskip("numba.cuda")
    cuda_global = _numba_kernel()
    src = NumbaSource(cuda_global, ("float32[:]", "float32[:]", "float32", "int32"), outputs=("out",))
    img = src.compile("sm_90")
    assert img.kind == "cubin" and img.image.startswith(ELF) and "scale_kernel" in img.symbol


def _numba_kernel():
    from numba import cuda

    def scale_kernel(out, x, a, n):  # noqa: ANN001
        i = cuda.grid(1)
        if i < n:
            out[i] = a * x[i]

    return scale_kernel


def test_numba_errors() -> None:
    pytest.importorskip("numba.cuda")

    def bad(out, n):  # noqa: ANN001
        out[0] = not_defined_anywhere  # noqa: F821

    with pytest.raises(KernelCompileError, match="Numba cannot compile") as info:
        NumbaSource(bad, ("float32[:]", "int32")).compile("sm_90")
    assert "not_defined_anywhere" in info.value.log
    with pytest.raises(KernelLoadError, match="takes 2 arguments but 1 argtypes"):
        NumbaSource(bad, ("float32[:]",)).describe()
    with pytest.raises(KernelLoadError, match=r"unsupported type 'complex64\[:\]'"):
        NumbaSource(bad, ("complex64[:]", "int32")).describe()
    with pytest.raises(KernelLoadError, match="scalar and cannot be an output"):
        NumbaSource(bad, ("float32[:]", "int32"), outputs=("n",)).describe()
    from numba import types

    with pytest.raises(KernelLoadError, match="only 1-D arrays"):
        NumbaSource(bad, (types.float32[:, :], "int32")).describe()


def test_cuda_source_includes_and_cache_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "inc").mkdir()
    (tmp_path / "inc" / "deep.h").write_text("#define DEEP 2.0f\n")
    (tmp_path / "op.h").write_text('#include "inc/deep.h"\n__device__ float op(float v) { return v * DEEP; }\n')
    cu = tmp_path / "k.cu"
    cu.write_text('#include "op.h"\n#include <cuda_fp16.h>\n' + GAIN.replace("in[i] * gain", "op(in[i]) * gain"))
    src = CudaSource(path=cu)
    assert src.includes() == ((tmp_path / "op.h").resolve(), (tmp_path / "inc" / "deep.h").resolve())
    assert src.watched_files()[0] == cu
    k = src.cache_key("sm_90")
    assert k == CudaSource(path=cu).cache_key("sm_90")
    assert k != src.cache_key("sm_89")
    assert k != CudaSource(path=cu, options=("-lineinfo",)).cache_key("sm_90")
    assert k != CudaSource(path=cu, defines={"X": "1"}).cache_key("sm_90")
    (tmp_path / "inc" / "deep.h").write_text("#define DEEP 3.0f\n")  # an include's content is part of the key
    k2 = src.cache_key("sm_90")
    assert k2 != k
    monkeypatch.setattr(cuda_source_module, "toolchain_version", lambda: "nvrtc99.9-nvjitlink99.9")
    assert src.cache_key("sm_90") != k2
    assert src.compile("sm_90").image.startswith(ELF)
    with pytest.raises(ValueError, match="exactly one of code= and path="):
        CudaSource()
    with pytest.raises(KernelLoadError, match="not found"):
        CudaSource(path=tmp_path / "missing.cu").describe()


def test_cubin_cache_round_trip_and_corruption(tmp_path: Path) -> None:
    cache = CubinCache(tmp_path)
    key = cache_key("x", b"y")
    assert cache.get(key) is None and cache.misses == 1
    cache.put(key, b"\x7fELF payload", {"symbol": "k"})
    assert cache.get(key) == (b"\x7fELF payload", {"symbol": "k"}, "memory")
    fresh = CubinCache(tmp_path)
    assert fresh.get(key) == (b"\x7fELF payload", {"symbol": "k"}, "disk") and fresh.disk_hits == 1
    path = tmp_path / f"{key}.cubin"
    for corrupt in (path.read_bytes()[:-3], path.read_bytes()[:10], b"garbage", path.read_bytes()[:-1] + b"X"):
        cache.put(key, b"\x7fELF payload", {"symbol": "k"})
        path.write_bytes(corrupt)
        c = CubinCache(tmp_path)
        assert c.get(key) is None and c.corrupt == 1 and not path.exists()
    memory_only = CubinCache(False)
    memory_only.put(key, b"abc")
    assert memory_only.get(key).level == "memory" and memory_only.directory is None
    small = CubinCache(False, memory_items=2)
    for i in range(3):
        small.put(str(i), b"v")
    assert small.get("0") is None and small.get("2") is not None
    assert cache_key("ab", "c") != cache_key("a", "bc")


def test_default_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("CUDAPATCH_CACHE_DIR", str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("CUDAPATCH_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "cudapatch" / "kernels"


def _settle(w: FileWatcher, seconds: float) -> list:
    end = time.monotonic() + seconds
    events: list = []
    while time.monotonic() < end:
        w.poll()
        events += w.events()
        time.sleep(0.01)
    return events


def test_watcher_debounces_real_edits(tmp_path: Path) -> None:
    a, b = tmp_path / "a.cu", tmp_path / "b.h"
    a.write_text("one")
    b.write_text("x")
    w = FileWatcher(interval=3600, debounce=0.2)  # the test drives poll() itself
    try:
        w.watch("k", [a, b])
        w.watch("other", [tmp_path / "c.cu"])
        assert _settle(w, 0.3) == []
        for i in range(5):  # a burst of writes (an editor saving in pieces) is one event
            a.write_text("two" * (i + 1))
            os.utime(a, ns=(time.time_ns() + i * 1000, time.time_ns() + i * 1000))
            w.poll()
            time.sleep(0.02)
        assert w.events() == []  # still inside the debounce window
        assert _settle(w, 0.5) == ["k"]
        b.write_text("y changed")  # an include changes
        assert _settle(w, 0.5) == ["k"]
        a.unlink()  # deletion is a change too
        assert _settle(w, 0.5) == ["k"]
        (tmp_path / "c.cu").write_text("new")  # a file that appears
        assert _settle(w, 0.5) == ["other"]
        w.unwatch("k")
        a.write_text("back")
        assert _settle(w, 0.4) == [] and w.keys() == {"other"}
    finally:
        w.close()
        w.close()


def test_watcher_thread_sleeps_while_nothing_is_watched(tmp_path: Path) -> None:
    w = FileWatcher(interval=0.005, debounce=0.01)
    polls: list[float] = []
    poll = w.poll
    w.poll = lambda: (polls.append(time.monotonic()), poll())[1]  # type: ignore[method-assign]
    try:
        time.sleep(0.1)
        assert polls == []  # no wake-ups (each would take the GIL from a frame)
        f = tmp_path / "k.cu"
        f.write_text("one")
        w.watch("k", [f])
        time.sleep(0.1)
        assert len(polls) >= 3  # watching: the thread polls again
        f.write_text("two, longer")
        end = time.monotonic() + 2
        while not w.ready and time.monotonic() < end:
            time.sleep(0.01)
        assert w.events() == ["k"]  # found by the thread's own polls
        w.unwatch("k")
        time.sleep(0.05)
        count = len(polls)
        time.sleep(0.1)
        assert len(polls) <= count + 1  # asleep again once nothing is watched
    finally:
        w.close()
    assert not w._thread.is_alive()


def _registered(*blocks):
    c = Context()
    for b in blocks:
        c.register_block(b)
    c.dirty.clear_structure()
    return c


def test_code_edit_with_same_signature_is_code_tier() -> None:
    ck = CustomKernel(name="ck", Code=GAIN)
    c = _registered(ck)
    ck.set("Code", GAIN.replace("in[i] * gain", "in[i] * gain * 2.0f"))
    assert not c.dirty.structure and c.dirty.code == {(ck.id, 0)} and c.dirty.tier == "code"
    c.dirty.code.clear()
    ck.set("Code", GAIN.replace("float gain,", "float gain, float bias,"))  # a new parameter: new ports
    assert c.dirty.structure and "bias" in ck.params
    with pytest.raises(CudapatchError, match="found 0 __global__ kernels"):
        ck.set("Code", "int main() {}")
    assert "bias" in ck.get("Code")  # the last good code stays


def test_a_same_signature_edit_swaps_the_source_without_re_describing_the_block() -> None:
    ck = CustomKernel(name="ck", Code=GAIN)
    c = _registered(ck)
    ck.set("gain", 3.0)
    c.dirty.params.clear()
    params = ck.params
    new = GAIN.replace("in[i] * gain", "in[i] * gain + 1.0f")
    ck.set("Code", new)
    assert ck.params is params and ck.get("gain") == 3.0 and ck.get("Code") == new  # no re-description
    assert ck.description == ck._describe()  # yet the same state a re-description would give
    assert c.dirty.code == {(ck.id, 0)} and not c.dirty.structure
    c.dirty.code.clear()
    renamed = new.replace("gain", "g")  # the same layout, another port name: the block re-describes
    ck.set("Code", renamed)
    assert c.dirty.structure and "g" in ck.params and "gain" not in ck.params
    assert ck.description.kernels[0].source.code == renamed


def test_on_code_changed_swaps_sources_of_the_same_signature(tmp_path: Path) -> None:
    s = Scale(name="s")
    c = _registered(s)
    same = CudaSource(path=bundled_kernel("scale").ptx_path.with_suffix(".cu"))
    c.on_code_changed(s, 0, same)
    assert s.description.kernels[0].source == same and c.dirty.code == {(s.id, 0)} and not c.dirty.structure
    with pytest.raises(CudapatchError, match="another signature"):
        c.on_code_changed(s, 0, CudaSource(path=bundled_kernel("fill").ptx_path.with_suffix(".cu")))
    with pytest.raises(CudapatchError, match="no kernel 3"):
        c.on_code_changed(s, 3)
    c.dirty.code.clear()
    c.on_code_changed(s, 0)  # the same source, new content (what the file watcher reports)
    assert c.dirty.code == {(s.id, 0)}


def test_kernel_file_block(tmp_path: Path) -> None:
    cu = tmp_path / "k.cu"
    cu.write_text(GAIN)
    kf = KernelFile(cu, name="kf")
    assert [p.name for p in kf.inputs] == ["in", "hits"] and [p.name for p in kf.outputs] == ["out", "hits"]
    assert kf.description.output("hits").kind == "through"  # inout: bound or linked by the user, in place
    assert set(kf.params) == {"Path", "gain", "axis"} and kf.get("axis") == (1.0, 1.0, 1.0)
    with pytest.raises(KernelLoadError, match="set Path"):
        KernelFile()


class _PidSource(CudaSource):
    """Compiles like CudaSource and records the process that compiled it."""

    def compile(self, arch: str):  # noqa: ANN201
        from dataclasses import replace

        return replace(super().compile(arch), debug_name=f"pid:{os.getpid()}")


class _CrashingSource(CudaSource):
    """A compiler that dies (what a buggy toolchain does to its process)."""

    def compile(self, arch: str):  # noqa: ANN201
        os._exit(3)


def _builder():
    from cudapatch.kernels import KernelBuilder, ModuleCache

    return KernelBuilder(
        arch="sm_90", cache=CubinCache(False), modules=ModuleCache(device_key="t"), make_current=lambda: None
    )


def test_portable_sources_compile_in_the_compiler_process() -> None:
    b = _builder()
    try:
        img = b._compile(_PidSource(code=GAIN))
        assert img.image.startswith(ELF) and img.debug_name != f"pid:{os.getpid()}"
        local = NumbaSource(lambda out, n: None, ("float32[:]", "int32"))
        assert not local.portable and _saxpy.__module__ != "__main__"
        assert NumbaSource(_saxpy, ("float32[:]",) * 3 + ("float32", "int32")).portable
    finally:
        b.close()


def test_a_crashing_compiler_is_an_error_not_a_crash() -> None:
    b = _builder()
    try:
        with pytest.raises(KernelCompileError, match="compiler process crashed"):
            b._compile(_CrashingSource(code=GAIN))
        assert b._compile(CudaSource(code=GAIN)).image.startswith(ELF)  # a new process takes over
    finally:
        b.close()
