"""Quoted ``#include``s are found as NVRTC finds them, and one that names a FIFO, a device or a socket
is refused before NVRTC opens it (NVRTC blocked for good reading a FIFO it took for a header). The
compiles here are real NVRTC on the CPU; every refusal runs on a thread with a bound, so a
regression fails the test instead of hanging it."""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

import pytest

from cudapatch.blocks.library.custom import CustomKernel, KernelFile
from cudapatch.errors import KernelLoadError
from cudapatch.kernels import CubinCache, CudaSource, KernelBuilder, ModuleCache
from cudapatch.kernels.source import KernelImage

KERNEL = 'extern "C" __global__ void k(const float* in, float* out, unsigned int n) { out[0] = in[0] * V; }\n'

posix_only = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, devices and UNIX sockets")


def _refusal(fn) -> KernelLoadError:
    """Run ``fn`` on a thread: it must raise a ``KernelLoadError`` within 30 s, not block on the include."""
    box: list[BaseException | None] = []

    def target() -> None:
        try:
            fn()
            box.append(None)
        except BaseException as exc:  # noqa: BLE001 - which one it is, is the point
            box.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(30.0)
    assert not thread.is_alive(), "the include was handed to NVRTC, which blocks on it"
    (err,) = box
    assert isinstance(err, KernelLoadError), err
    return err


class _Loader(ModuleCache):
    """Loads nothing: returns the image's key (a GPU-less stand-in for cuModuleLoadData)."""

    def function(self, image: KernelImage) -> str:
        return f"fn:{image.key}"


@posix_only
def test_a_fifo_include_in_a_cu_file_names_the_include_the_file_and_the_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.cuh")
    (tmp_path / "ok.cuh").write_text("#define V 2.0f\n")
    cu = tmp_path / "k.cu"
    cu.write_text('// a kernel\n#include "ok.cuh"\n#include "pipe.cuh"\n' + KERNEL)
    source = CudaSource(path=cu)
    for step in (source.includes, lambda: source.cache_key("sm_90"), lambda: source.compile("sm_90")):
        err = _refusal(step)
        assert err.file == str(cu) and err.line == 3, err
        assert '#include "pipe.cuh"' in err.message and "a FIFO (named pipe)" in err.message, err
        assert str(tmp_path / "pipe.cuh") in err.message
    assert source.watched_files() == (cu,)  # the build reports the include; the file is still watched
    assert KernelFile(path=cu, name="kf").name == "kf"  # describing reads the signature only, not includes


@posix_only
def test_the_key_and_the_compile_walk_the_includes_of_the_text_they_read(tmp_path: Path) -> None:
    # The .cu saved again right after it was read: a second read for the walk would miss the FIFO include
    # of the text that is hashed and handed to NVRTC.
    os.mkfifo(tmp_path / "pipe.cuh")
    cu = tmp_path / "k.cu"
    clean = "#define V 2.0f\n" + KERNEL

    class SavedAfterRead(CudaSource):
        def text(self) -> str:
            read = super().text()
            cu.write_text(clean)
            return read

    source = SavedAfterRead(path=cu)
    for step in (lambda: source.cache_key("sm_90"), lambda: source.compile("sm_90")):
        cu.write_text('#include "pipe.cuh"\n' + clean)
        err = _refusal(step)
        assert err.file == str(cu) and err.line == 1 and "FIFO" in err.message, err


@posix_only
def test_a_fifo_include_fails_the_build_not_the_builder(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.cuh")
    cu = tmp_path / "k.cu"
    cu.write_text('#include "pipe.cuh"\n#define V 2.0f\n' + KERNEL)
    builder = KernelBuilder(
        arch="sm_90", cache=CubinCache(False), modules=_Loader(device_key="t"), make_current=lambda: None
    )
    try:
        err = _refusal(lambda: builder.submit(CudaSource(path=cu)).result(timeout=20))
        assert err.file == str(cu) and err.line == 1 and "FIFO" in err.message
        good = builder.submit(CudaSource(code="#define V 3.0f\n" + KERNEL)).result(timeout=120)
        assert good.image.image.startswith(b"\x7fELF")
    finally:
        builder.close()


@posix_only
def test_includes_are_resolved_as_nvrtc_resolves_them(tmp_path: Path) -> None:
    # Beside the including file first, then the -I directories in order; a directory of that name is
    # passed over (NVRTC searches on), so a FIFO later on the path is what it would open.
    inc, lib, other = tmp_path / "inc", tmp_path / "lib", tmp_path / "other"
    for d in (inc, lib, other):
        d.mkdir()
    (inc / "nested.cuh").mkdir()
    os.mkfifo(lib / "nested.cuh")
    (other / "nested.cuh").write_text("#define V 2.0f\n")
    (inc / "top.cuh").write_text('\n\n#include "nested.cuh"\n')
    cu = tmp_path / "k.cu"
    cu.write_text('#include "top.cuh"\n' + KERNEL)
    err = _refusal(CudaSource(path=cu, include_paths=(inc, lib, other)).includes)
    assert err.file == str(inc / "top.cuh") and err.line == 3 and str(lib / "nested.cuh") in err.message
    err = _refusal(CudaSource(path=cu, include_paths=(inc,), options=(f"--include-path={lib}",)).includes)
    assert err.file == str(inc / "top.cuh")
    # With the regular file first on the path, the FIFO behind it is never opened: it compiles.
    ok = CudaSource(path=cu, include_paths=(inc, other, lib))
    assert ok.includes() == (inc / "top.cuh", other / "nested.cuh")
    assert ok.compile("sm_90").image.startswith(b"\x7fELF")


@posix_only
def test_an_absolute_include_in_custom_kernel_code_and_other_non_regular_targets(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "pipe.cuh")
    code = f'#include "{tmp_path / "pipe.cuh"}"\n#define V 2.0f\n' + KERNEL
    err = _refusal(lambda: CudaSource(code=code, name="ck.cu").compile("sm_90"))
    assert err.file == "ck.cu" and err.line == 1 and "FIFO" in err.message
    picked = CustomKernel(name="ck", Code=code).text_source("Code", code)
    assert picked is not None
    err = _refusal(lambda: picked[1].cache_key("sm_90"))
    assert err.file == "ck.cu" and err.line == 1
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tmp_path / "sock.cuh"))
        for target, kind in ((tmp_path / "sock.cuh", "a socket"), ("/dev/zero", "a character device")):
            err = _refusal(CudaSource(code=f'\n#include "{target}"\n' + KERNEL, name="k.cu").includes)
            assert err.line == 2 and kind in err.message, err
