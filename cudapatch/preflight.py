"""``cudapatch check``: what this machine has for cudapatch, and what to fix.

Also the one line a command or an example prints when CUDA cannot be used at all
(``explain_unavailable``, ``cuda_unavailable_line``): it names what is missing, the driver cudapatch
needs, and points to ``cudapatch check`` for the rest, instead of a traceback ending in the driver
bindings' own text. The words for the driver (``driver_needed``, ``no_driver_message``) live in
``kernels/_driver.py``, which the engine's own errors use too, so every message names the same version.

Every probe goes through a small loader function (``_load_driver``, ``_load_library``), so the
tests simulate a machine without a driver or without a library by replacing the loader.
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Literal

from .kernels._driver import (
    DRIVER_TOO_OLD,
    LIBCUDA,
    bindings_install,
    bindings_major,
    driver_needed,
    driver_too_old_message,
    no_driver_message,
)

__all__ = ["CheckItem", "cuda_unavailable_line", "explain_unavailable", "preflight"]


@dataclass(frozen=True)
class CheckItem:
    """One line of ``cudapatch check``.

    Attributes:
        name: What was checked (``driver``, ``cuSOLVER``, ...).
        ok: Whether it is usable.
        detail: What was found, or what is missing.
        fix: What to do when it is not ok.
        optional: cudapatch runs without it (only some blocks or the preview need it).
    """

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


def _cuda_major() -> int:
    """The CUDA major version of the installed cuda-bindings (13 when unknown): picks the wheels a fix names."""
    return bindings_major()


# -- the driver -----------------------------------------------------------------------------------
DriverState = Literal["no-bindings", "no-driver", "too-old", "init-failed", "no-device", "ok"]


def _load_driver() -> Any:
    """``cuda.bindings.driver`` (the tests replace this loader to simulate a machine)."""
    from cuda.bindings import driver

    return driver


def _driver_state() -> tuple[DriverState, str, Any]:
    """Probe the driver once: its state, a short detail, and the bindings module (None without one)."""
    try:
        d = _load_driver()
    except Exception as exc:  # ImportError, or bindings that fail while loading
        return "no-bindings", f"{type(exc).__name__}: {exc}", None
    try:
        (res,) = d.cuInit(0)
    except RuntimeError:  # cuda-bindings raises this when libcuda cannot be loaded: no driver at all
        return "no-driver", f"{LIBCUDA} could not be loaded", d
    if res == d.CUresult.CUDA_ERROR_NO_DEVICE:
        return "no-device", "the driver reports no CUDA device", d
    if getattr(res, "name", None) in DRIVER_TOO_OLD:
        return "too-old", res.name, d
    if res:
        return "init-failed", f"cuInit failed: {getattr(res, 'name', res)}", d
    return "ok", "", d


def _driver_items() -> list[CheckItem]:
    state, detail, d = _driver_state()
    major = _cuda_major()
    bindings = _version("cuda-bindings") or detail
    items = [CheckItem("cuda-bindings", state != "no-bindings", bindings, bindings_install(major))]
    if state == "no-bindings":
        return items
    if state == "no-driver":
        return [*items, CheckItem("driver", False, f"not found ({detail})", f"install {driver_needed(major)}")]
    # A driver for CUDA 12 runs the CUDA 12 builds of the wheels: name them as the other way out.
    update = f"update to {driver_needed(major)}" + (", or use the CUDA 12 wheels (docs/setup.md)" if major > 12 else "")
    if state == "too-old":
        return [*items, CheckItem("driver", False, f"too old for cuda-bindings {major} (cuInit: {detail})", update)]
    if state in ("no-device", "init-failed"):
        fix = "this machine needs an NVIDIA GPU" if state == "no-device" else "see `nvidia-smi`; reboot after updates"
        return [*items, CheckItem("driver", False, detail, fix)]
    _, ver = d.cuDriverGetVersion()
    version = f"CUDA {ver // 1000}.{ver % 1000 // 10}"
    if ver < 1000 * major:  # the bindings' major version needs a driver of that CUDA major
        items.append(CheckItem("driver", False, f"{version}: cuda-bindings {major} needs a newer one", update))
    else:
        items.append(CheckItem("driver", True, version))
    _, n = d.cuDeviceGetCount()
    attr = d.CUdevice_attribute
    for i in range(n):
        _, dev = d.cuDeviceGet(i)
        _, name = d.cuDeviceGetName(100, dev)
        _, cc_major = d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev)
        _, cc_minor = d.cuDeviceGetAttribute(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev)
        label = name.split(b"\0")[0].decode()
        items.append(CheckItem(f"gpu {i}", True, f"{label} (sm_{cc_major}{cc_minor})"))
    if n == 0:
        items.append(CheckItem("gpu", False, "no CUDA device", "this machine needs an NVIDIA GPU"))
    return items


def cuda_unavailable_line() -> str | None:
    """Why CUDA cannot be used on this machine, in one line; None when a driver and a device answer.

    Probes the driver (cheap: ``cuInit``), so the line does not depend on the wording of whatever
    error stopped the program. It names what is missing, the driver cudapatch needs, and points to
    ``cudapatch check``.
    """
    state, detail, _ = _driver_state()
    major = _cuda_major()
    if state == "no-bindings":
        return f"cuda-bindings cannot be imported ({detail}); run `{bindings_install(major)}`, then `cudapatch check`"
    if state == "no-driver":
        return no_driver_message(detail, major)
    if state == "too-old":
        return driver_too_old_message(detail, major)
    if state in ("no-device", "init-failed"):
        return f"{detail}; cudapatch needs an NVIDIA GPU with {driver_needed(major)}. See `cudapatch check`"
    return None


def explain_unavailable(exc: BaseException) -> str:
    """The one line to print when ``exc`` (a ``CudaUnavailableError``) stops a command or script.

    ``cuda_unavailable_line`` when the probe finds CUDA unusable, else the error's own text (a device
    ordinal out of range, say) with a pointer to ``cudapatch check``.

    Args:
        exc: The error that stopped the program.

    Returns:
        One line, without the program's name.
    """
    return cuda_unavailable_line() or f"{exc}. See `cudapatch check`"


# -- the math libraries ---------------------------------------------------------------------------
# (label, cuda.pathfinder name, the libraries it needs loaded first, in the order pathfinder loads them)
_LIBRARIES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("cuBLAS", "cublas", ("cublasLt",)),
    ("cuFFT", "cufft", ()),
    ("cuRAND", "curand", ()),
    ("cuSOLVER", "cusolver", ("nvJitLink", "cusparse", "cublasLt", "cublas")),
    ("cuSPARSE", "cusparse", ("nvJitLink",)),
)
_LABELS = {"cublasLt": "cuBLASLt", "nvJitLink": "nvJitLink", **{lib: label for label, lib, _ in _LIBRARIES}}
# The extra of NVIDIA's ``cuda-toolkit`` package whose wheel ships each library.
_COMPONENTS = {"cublas": "cublas", "cublasLt": "cublas", "cufft": "cufft", "curand": "curand",
               "cusolver": "cusolver", "cusparse": "cusparse", "nvJitLink": "nvjitlink"}  # fmt: skip
_MISSING_FILE = re.compile(r'Failure finding "([^"]+)"')


def _load_library(name: str) -> str:
    """Load one NVIDIA library through cuda.pathfinder (as nvmath does); its path. The tests replace this loader.

    Raises:
        ImportError: cuda.pathfinder is missing.
        Exception: the library was not found or failed to load (pathfinder's errors).
    """
    from cuda.pathfinder import load_nvidia_dynamic_lib

    return load_nvidia_dynamic_lib(name).abs_path or "loaded"


def _why(exc: Exception, name: str) -> str:
    """``libcusparse.so.12 not found`` from pathfinder's long message (a directory listing follows it)."""
    found = _MISSING_FILE.search(str(exc))
    if found:
        return f"{found.group(1)} not found"
    if type(exc).__name__ == "DynamicLibNotFoundError":
        return f"lib{name} not found"
    return f"lib{name} failed to load: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"


def _library_fix(*names: str) -> str:
    """The pip command for the ``cuda-toolkit`` wheels that ship ``names`` (and how to get all five)."""
    major = _cuda_major()
    components = ",".join(dict.fromkeys(_COMPONENTS[n] for n in names))
    command = f'pip install "cuda-toolkit[{components}]=={major}.*"'
    if major >= 13:
        return f"{command} (all five libraries: the 'libs' extra)"
    # CUDA 12: no extra does it (pip installs an extra only with the package's CUDA 13 dependencies), so
    # the command for all five is the one docs/setup.md's CUDA 12 recipe runs (a unit test keeps them in step).
    every = ",".join(dict.fromkeys(_COMPONENTS[lib] for _, lib, _ in _LIBRARIES))
    return f'{command} (all five libraries: pip install "cuda-toolkit[{every}]=={major}.*", see docs/setup.md)'


def _library_item(label: str, name: str, needs: tuple[str, ...]) -> CheckItem:
    try:
        return CheckItem(label, True, _load_library(name), optional=True)
    except Exception as exc:  # DynamicLibNotFoundError and loader errors alike: report, never raise
        failure = exc
    for dep in needs:  # a library it depends on is the usual culprit (cuSOLVER without cuSPARSE)
        try:
            _load_library(dep)
        except Exception as dep_exc:
            detail = f"{_LABELS[dep]}, a library {label} depends on, is missing: {_why(dep_exc, dep)}"
            # pathfinder loads the dependency first, so whether the library itself is there is unknown:
            # the fix installs both (one that is there already costs pip nothing)
            return CheckItem(label, False, detail, _library_fix(name, dep), optional=True)
    return CheckItem(label, False, _why(failure, name), _library_fix(name), optional=True)


def _library_items() -> list[CheckItem]:
    """Whether each CUDA math library of the library blocks (GEMM, FFT, Random, LUSolve, SpMV) loads."""
    if not _import("cuda.pathfinder")[0]:
        fix = "pip install cuda-pathfinder (it comes with cuda-bindings 13)"
        return [CheckItem("math libraries", False, "cuda.pathfinder cannot be imported", fix, True)]
    return [_library_item(label, name, needs) for label, name, needs in _LIBRARIES]


# -- everything -----------------------------------------------------------------------------------
def preflight() -> list[CheckItem]:
    """Check the driver, GPU, Python packages, NVRTC, the math libraries and GL. Never raises."""
    items: list[CheckItem] = [
        CheckItem("python", sys.version_info >= (3, 11), sys.version.split()[0], "use Python 3.11 or newer")
    ]
    items.extend(_driver_items())
    ok, err = _import("cuda.bindings.nvrtc")
    nvrtc_fix = f"{bindings_install(_cuda_major())} (the NVRTC wheel)"
    if ok:
        from cuda.bindings import nvrtc

        res, major, minor = nvrtc.nvrtcVersion()
        items.append(CheckItem("nvrtc", not res, f"{major}.{minor}" if not res else repr(res), nvrtc_fix))
    else:
        items.append(CheckItem("nvrtc", False, err, nvrtc_fix))
    for name, module, fix, optional in (
        ("cupy", "cupy", f"pip install cupy-cuda{_cuda_major()}x", False),
        ("numba-cuda", "numba.cuda", "pip install numba-cuda (Python kernels; the 'numba' extra)", True),
        ("nvmath-python", "nvmath", "pip install nvmath-python (library calls)", True),
        ("pyopengl", "OpenGL", "pip install PyOpenGL (the preview; the 'gl' extra)", True),
        ("glfw", "glfw", "pip install glfw (the preview window; the 'gl' extra)", True),
        ("imgui-bundle", "imgui_bundle", "pip install imgui-bundle (the overlay; the 'gl' extra)", True),
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
