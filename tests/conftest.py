"""Test configuration: the one GPU probe.

``gpu`` tests are skipped only when there is no CUDA driver or no device; any other failure of
the probe is an error, so a broken installation never hides as a skip.
"""

from __future__ import annotations

import functools
import os
import sys

import pytest

# Tests are an entry point: they choose PyOpenGL's platform before anything imports OpenGL. EGL
# serves both the headless contexts and (through GLFW's EGL context API) the windows under Xvfb.
if sys.platform.startswith("linux"):
    os.environ.setdefault("PYOPENGL_PLATFORM", "egl")


@functools.lru_cache(maxsize=1)
def gpu_unavailable_reason() -> str | None:
    """None if a CUDA device is usable, else why not (no cuda-bindings, no driver, no device)."""
    try:
        from cuda.bindings import driver as d
    except ImportError:
        return "cuda-bindings is not installed"
    try:
        (err,) = d.cuInit(0)
    except RuntimeError as exc:  # libcuda.so cannot be loaded: no driver
        return f"no CUDA driver ({exc})"
    if err == d.CUresult.CUDA_ERROR_NO_DEVICE:
        return "no CUDA device"
    if err:
        raise RuntimeError(f"cuInit failed unexpectedly: {err!r}")
    err, count = d.cuDeviceGetCount()
    if err:
        raise RuntimeError(f"cuDeviceGetCount failed: {err!r}")
    return None if count > 0 else "no CUDA device"


@functools.lru_cache(maxsize=1)
def gl_unavailable_reason() -> str | None:
    """None if a headless GL context can be made, else why not (no PyOpenGL, no EGL library)."""
    try:
        import OpenGL  # noqa: F401
    except ImportError:
        return "PyOpenGL is not installed"
    if not sys.platform.startswith("linux"):
        return None  # windows are used there; a failure to open one is a test failure
    try:
        from OpenGL import EGL  # noqa: F401
    except (ImportError, AttributeError, OSError) as exc:  # libEGL.so is missing
        return f"no EGL library ({exc})"
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("gpu") is not None:
        reason = gpu_unavailable_reason()
        if reason is not None:
            pytest.skip(f"gpu test: {reason}")
    if item.get_closest_marker("gl") is not None:
        reason = gl_unavailable_reason()
        if reason is not None:
            pytest.skip(f"gl test: {reason}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests marked ``gpu_fault`` run last, whatever their file. Measured on the H100 machine
    (driver 580): once any process there has hit an illegal address, previews in every later
    process draw nothing and run at ~66 fps, although CUDA results, plain GL draws and the interop
    round trips stay correct (benchmarks/probes/probe_after_fault.py); only a fresh machine recovers."""
    items.sort(key=lambda item: item.get_closest_marker("gpu_fault") is not None)  # stable: order kept otherwise
