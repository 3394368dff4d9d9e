"""NVIDIA library wheels where ``pip install --target`` put them: in a folder on ``sys.path``.

cuda-bindings (NVRTC, nvJitLink) and nvmath-python (cuBLAS, cuFFT, ...) find the libraries through
cuda-pathfinder, which looks in the interpreter's site-packages directories (and conda, ``CUDA_PATH``,
the loader's search path), not in the folders on ``sys.path``. A host that takes its modules from a
folder of its own (TouchDesigner's module path, filled with ``pip install --target``) has the wheels'
libraries there, so pathfinder does not find them: every compile failed with ``Failure finding
"libnvrtc.so.13 or libnvrtc.so.12"``. When pathfinder cannot find a library, it is loaded here by
its full path from a ``sys.path`` entry, and pathfinder then finds it already loaded. Libraries
pathfinder finds are left to it.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import sys
from pathlib import Path

__all__ = ["load_compiler_libs", "load_wheel_libs", "wheel_lib_paths"]

log = logging.getLogger("cudapatch.kernels")

# pathfinder's name -> the file's name pattern (Linux, Windows). The CUDA 13 wheels share
# nvidia/cu13/lib (bin on Windows); the CUDA 12 ones have nvidia/<package>/lib each.
_FILES = {
    "nvrtc": ("libnvrtc.so.*", "nvrtc64_*.dll"),
    "nvJitLink": ("libnvJitLink.so.*", "nvJitLink_*.dll"),
    "cublasLt": ("libcublasLt.so.*", "cublasLt64_*.dll"),
    "cublas": ("libcublas.so.*", "cublas64_*.dll"),
    "cufft": ("libcufft.so.*", "cufft64_*.dll"),
    "curand": ("libcurand.so.*", "curand64_*.dll"),
    "cusparse": ("libcusparse.so.*", "cusparse64_*.dll"),
    "cusolver": ("libcusolver.so.*", "cusolver64_*.dll"),
}
_FOLDERS = (
    ("nvidia/cu13/bin/x86_64", "nvidia/cu13/bin", "nvidia/*/bin")
    if sys.platform == "win32"
    else (
        "nvidia/cu13/lib",
        "nvidia/*/lib",
    )
)
# nvmath-python's binding module -> the libraries it loads, each after those it depends on.
NVMATH_LIBS = {
    "cublas": ("cublasLt", "cublas"),
    "cufft": ("cufft",),
    "curand": ("curand",),
    "cusparse": ("nvJitLink", "cusparse"),
    "cusolverDn": ("nvJitLink", "cublasLt", "cublas", "cusparse", "cusolver"),
}


def wheel_lib_paths(name: str, entries: list[str] | None = None) -> list[Path]:
    """The files of library ``name`` (pathfinder's name: ``nvrtc``, ``cublas`` ...) in the NVIDIA wheel
    folders under the ``sys.path`` entries (or ``entries``), in search order."""
    pattern = _FILES[name][1 if sys.platform == "win32" else 0]
    found: list[Path] = []
    for entry in sys.path if entries is None else entries:
        if not isinstance(entry, str) or not entry or not Path(entry, "nvidia").is_dir():
            continue
        for folder in _FOLDERS:
            for path in sorted(Path(entry).glob(f"{folder}/{pattern}")):
                if ".alt." not in path.name and path.is_file() and path not in found:
                    found.append(path)
    return found


def _load_from_sys_path(name: str) -> None:
    from cuda.pathfinder import load_nvidia_dynamic_lib

    try:
        load_nvidia_dynamic_lib(name)
        return  # pathfinder found it: nothing to do
    except Exception:  # not found (or not loadable from where it was found): look on sys.path
        pass
    for path in wheel_lib_paths(name):
        try:
            if sys.platform == "win32":  # the DLLs it needs sit beside it
                os.add_dll_directory(str(path.parent))  # type: ignore[attr-defined]
                ctypes.WinDLL(str(path))  # type: ignore[attr-defined]
            else:
                ctypes.CDLL(str(path), mode=os.RTLD_GLOBAL)
        except OSError as exc:
            log.debug("could not load %s: %s", path, exc)
            continue
        log.info("%s: loaded from %s (a sys.path folder pathfinder does not search)", name, path)
        return


@functools.cache
def load_wheel_libs(names: tuple[str, ...]) -> None:
    """Make these libraries loadable through pathfinder where only ``sys.path`` holds them, in order.
    Once per tuple and process; what cannot be found stays for the caller's own error."""
    try:
        import cuda.pathfinder  # noqa: F401
    except ImportError:  # an older cuda-bindings: its own search, nothing to add
        return
    for name in names:
        _load_from_sys_path(name)


def load_compiler_libs() -> None:
    """NVRTC and nvJitLink (see ``load_wheel_libs``)."""
    load_wheel_libs(("nvJitLink", "nvrtc"))
