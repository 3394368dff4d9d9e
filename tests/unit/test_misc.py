"""Errors, pool size classes, import isolation, and what happens without a GPU."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cudapatch import CudaUnavailableError, Engine
from cudapatch.engine import DirtyTracker, size_class
from cudapatch.engine.diagnostics import Diagnostic, DiagnosticLog
from cudapatch.errors import CudaError, CudapatchError, SidecarError
from cudapatch.kernels._driver import check

from ..conftest import gpu_unavailable_reason


def test_error_context_in_message() -> None:
    e = SidecarError("unknown type 'x'", file="k.json", line=7, block="emit", kernel="k")
    assert str(e) == "k.json:7: block 'emit', kernel 'k': unknown type 'x'"
    assert str(CudapatchError("plain")) == "plain"
    assert isinstance(CudaError("x", code=1, name="CUDA_ERROR_INVALID_VALUE"), CudapatchError)


def test_check_unwraps_results() -> None:
    from cuda.bindings import driver as d

    ok = d.CUresult.CUDA_SUCCESS
    assert check((ok,)) is None and check((ok, 5)) == 5 and check((ok, 1, 2)) == (1, 2)
    with pytest.raises(CudaError) as info:
        check((d.CUresult.CUDA_ERROR_INVALID_VALUE,), "cuSomething", block="b")
    assert info.value.code == int(d.CUresult.CUDA_ERROR_INVALID_VALUE) and info.value.block == "b"
    assert "cuSomething" in str(info.value) and info.value.name.startswith("CUDA_ERROR_")


def test_size_classes() -> None:
    assert size_class(1) == 256 and size_class(256) == 256 and size_class(257) == 512 and size_class(5000) == 5120
    prev = 0
    for n in [1, 300, 1000, 4096, 4097, 10**6, 4 * 2**20, 3 * 10**8]:
        c = size_class(n)
        assert c >= n and c <= max(256, n * 1.25 + 256) and c % 256 == 0 and c >= prev
        assert size_class(c) == c  # classes are fixed points
        prev = c


def test_diagnostics_are_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    log = DiagnosticLog(logging.getLogger("cudapatch.test"))
    d = Diagnostic("warning", 1, "input-unlinked", "block 's' is not running")
    with caplog.at_level(logging.INFO, logger="cudapatch.test"):
        for _ in range(5):
            log.emit([d])
        log.forget(set())
        log.emit([d])
    assert [r.getMessage() for r in caplog.records] == ["block 's' is not running"] * 2


def test_import_never_touches_cuda_or_gl() -> None:
    code = (
        "import sys, cudapatch\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('glfw', 'OpenGL', 'imgui_bundle', 'cupy', 'numba')"
        " or m.startswith('cuda.bindings')]\n"
        "assert not bad, bad\n"
        "print(cudapatch.__version__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip()


@pytest.mark.skipif(gpu_unavailable_reason() is None, reason="a GPU is present")
def test_engine_without_gpu_raises_one_clear_error() -> None:
    with pytest.raises(CudaUnavailableError) as info:
        Engine()
    assert "driver" in str(info.value) or "device" in str(info.value)


def test_dirty_tracker_starts_structure_dirty() -> None:
    assert DirtyTracker().tier == "structure"


def test_device_array_binds_raw_pointers_with_their_element_type():
    from cudapatch.engine.bindings import DeviceArray, binding_from_cai
    from cudapatch.kernels.types import DType

    for dtype in (DType.FLOAT32, DType.FLOAT4, DType.INT32, DType.UINT32):
        b = binding_from_cai(DeviceArray(0x7F00_0000_0000, 1000, dtype), dtype, "blk", "In")
        assert (b.ptr, b.count, b.dtype) == (0x7F00_0000_0000, 1000, dtype)
