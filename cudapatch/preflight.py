"""``cudapatch check``: what this machine has for cudapatch, and what to fix."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

__all__ = ["CheckItem", "preflight"]


@dataclass(frozen=True)
class CheckItem:
    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def _import(name: str) -> tuple[bool, str]:
    try:
        importlib.import_module(name)
        return True, ""
    except Exception as exc:  # ImportError, or a library that fails while loading
        return False, f"{type(exc).__name__}: {exc}"


def _library_items() -> list[CheckItem]:
    """Whether each CUDA math library of the library blocks (GEMM, FFT, Random, LUSolve, SpMV) loads."""
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError as exc:
        return [CheckItem("math libraries", False, str(exc), "pip install 'cudapatch[libs]'", True)]
    items = []
    for label, lib in (("cuBLAS", "cublas"), ("cuFFT", "cufft"), ("cuRAND", "curand"), ("cuSOLVER", "cusolver"),
                       ("cuSPARSE", "cusparse")):  # fmt: skip
        try:
            path = load_nvidia_dynamic_lib(lib).abs_path
            items.append(CheckItem(label, True, path or "loaded"))
        except Exception as exc:  # DynamicLibNotFoundError and loader errors alike: report, never raise
            items.append(CheckItem(label, False, str(exc).split(":")[0], "pip install 'cudapatch[libs]'", True))
    return items


def preflight() -> list[CheckItem]:
    """Check the driver, GPU, Python packages, NVRTC and GL. Never raises."""
    items: list[CheckItem] = [
        CheckItem("python", sys.version_info >= (3, 10), sys.version.split()[0], "use Python 3.10+")
    ]
    ok, err = _import("cuda.bindings.driver")
    items.append(
        CheckItem("cuda-bindings", ok, _version("cuda-bindings") or err, "pip install 'cuda-bindings[all]>=13,<14'")
    )
    if ok:
        from cuda.bindings import driver as d

        try:
            (res,) = d.cuInit(0)
            if res:
                items.append(
                    CheckItem("driver", False, f"cuInit: {res!r}", "install the NVIDIA driver (580+ for CUDA 13)")
                )
            else:
                _, ver = d.cuDriverGetVersion()
                _, n = d.cuDeviceGetCount()
                items.append(CheckItem("driver", True, f"CUDA {ver // 1000}.{ver % 1000 // 10}"))
                for i in range(n):
                    _, dev = d.cuDeviceGet(i)
                    _, name = d.cuDeviceGetName(100, dev)
                    _, major = d.cuDeviceGetAttribute(
                        d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev
                    )
                    _, minor = d.cuDeviceGetAttribute(
                        d.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev
                    )
                    label = name.split(b"\0")[0].decode()
                    items.append(CheckItem(f"gpu {i}", True, f"{label} (sm_{major}{minor})"))
                if n == 0:
                    items.append(CheckItem("gpu", False, "no CUDA device", "this machine needs an NVIDIA GPU"))
        except RuntimeError as exc:  # libcuda.so missing
            items.append(CheckItem("driver", False, str(exc), "install the NVIDIA driver (580+ for CUDA 13)"))
    ok, err = _import("cuda.bindings.nvrtc")
    if ok:
        from cuda.bindings import nvrtc

        res, major, minor = nvrtc.nvrtcVersion()
        items.append(
            CheckItem(
                "nvrtc", not res, f"{major}.{minor}" if not res else repr(res), "pip install 'cuda-bindings[all]'"
            )
        )
    else:
        items.append(CheckItem("nvrtc", False, err, "pip install 'cuda-bindings[all]'"))
    for name, module, fix, optional in (
        ("cupy", "cupy", "pip install cupy-cuda13x", False),
        ("numba-cuda", "numba.cuda", "pip install 'cudapatch[numba]' (Python kernels)", True),
        ("nvmath-python", "nvmath", "pip install nvmath-python (library calls)", True),
        ("pyopengl", "OpenGL", "pip install 'cudapatch[gl]' (preview)", True),
        ("glfw", "glfw", "pip install 'cudapatch[gl]' (preview window)", True),
        ("imgui-bundle", "imgui_bundle", "pip install 'cudapatch[gl]' (overlay)", True),
    ):
        ok, err = _import(module)
        items.append(CheckItem(name, ok, _version(name) or ("importable" if ok else err), fix, optional))
    items.extend(_library_items())
    display = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) or sys.platform != "linux"
    items.append(
        CheckItem("display", display, "available" if display else "none (DISPLAY unset)", "use --headless", True)
    )
    if sys.platform.startswith("linux"):
        import ctypes.util

        egl = ctypes.util.find_library("EGL")
        items.append(CheckItem("egl", egl is not None, egl or "libEGL not found", "apt-get install libegl1", True))
    return items
