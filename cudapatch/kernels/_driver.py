"""Thin access to the CUDA driver through cuda-bindings.

cuda-bindings is imported lazily so that ``import cudapatch`` works on machines without it; the
first driver call happens when an Engine is created. ``check`` is the one place that turns the
``(CUresult, value...)`` tuples of cuda-python into values or ``CudaError``.

It also says which driver cudapatch needs (``driver_needed``) and how to say it is missing
(``no_driver_message``): the engine's errors, ``cudapatch run``, the examples and ``cudapatch check``
all word it from here, so the version they name cannot drift apart.
"""

from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any

from ..errors import CudaError, CudaLaunchError, CudaOutOfMemoryError, CudaUnavailableError

_driver: ModuleType | None = None

# Errors after which the context is unusable ("sticky"): every later call fails the same way.
_STICKY = frozenset(
    {
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "CUDA_ERROR_LAUNCH_FAILED",
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "CUDA_ERROR_INVALID_PC",
        "CUDA_ERROR_ASSERT",
        "CUDA_ERROR_LAUNCH_TIMEOUT",
    }
)

# The oldest driver branch each CUDA major version runs on (NVIDIA's CUDA toolkit release notes,
# minor version compatibility: CUDA 12.x needs R525+, 13.x R580+). cuda-bindings N reaches the driver
# through CUDA N's API, so the installed bindings decide which one applies.
MIN_DRIVER_BRANCH = {12: 525, 13: 580}
LIBCUDA = "nvcuda.dll" if sys.platform == "win32" else "libcuda.so.1"
# cuInit's answers when a driver is there but too old for the bindings (or the GPU for the driver).
DRIVER_TOO_OLD = frozenset(
    {"CUDA_ERROR_INSUFFICIENT_DRIVER", "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"}
)


@functools.cache
def bindings_major() -> int:
    """The CUDA major version of the installed cuda-bindings; 13 (the default wheels) when unknown.
    Looked up once (a metadata scan of the installed packages: about a millisecond, and the held
    calls ask again with each graph where the driver did not give them)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("cuda-bindings").split(".")[0])
    except (PackageNotFoundError, ValueError):
        return 13


def driver_needed(major: int | None = None) -> str:
    """The driver cudapatch needs, in words: ``an NVIDIA driver for CUDA 13 (R580 or newer)``.

    Args:
        major: The CUDA major version; the installed cuda-bindings' when None.
    """
    major = bindings_major() if major is None else major
    branch = MIN_DRIVER_BRANCH.get(major)
    return f"an NVIDIA driver for CUDA {major}" + (f" (R{branch} or newer)" if branch else "")


def bindings_install(major: int | None = None) -> str:
    """The pip command that installs cuda-bindings of CUDA ``major`` with its NVRTC/nvJitLink wheels."""
    major = bindings_major() if major is None else major
    return f"pip install 'cuda-bindings[all]>={major},<{major + 1}'"


def no_driver_message(detail: str = f"{LIBCUDA} could not be loaded", major: int | None = None) -> str:
    """The one line for a machine without an NVIDIA driver: what failed, the driver to install, and
    ``cudapatch check`` for the rest. Says "install" once (the bindings' own text says it again)."""
    return f"no NVIDIA driver ({detail}): install {driver_needed(major)}, then run `cudapatch check`"


def driver_too_old_message(name: str, major: int | None = None) -> str:
    """The one line for a driver cuInit refuses as too old (``DRIVER_TOO_OLD``)."""
    needed = driver_needed(major)
    return f"the NVIDIA driver is too old (cuInit: {name}): update to {needed}, then run `cudapatch check`"


def driver() -> ModuleType:
    """Return ``cuda.bindings.driver``, importing it on first use.

    Raises:
        CudaUnavailableError: cuda-bindings is not installed.
    """
    global _driver
    if _driver is None:
        try:
            from cuda.bindings import driver as mod
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise CudaUnavailableError(
                f"cuda-bindings is not installed ({bindings_install()}); cudapatch needs it to reach the GPU"
            ) from exc
        _driver = mod
    return _driver


def error_from_code(err: Any, what: str = "", **context: Any) -> CudaError:
    """Build the ``CudaError`` subclass for a ``CUresult``, with the driver's name and text."""
    d = driver()
    code = int(err)
    try:
        if type(err) is int:  # the frame path's held calls return a plain int (``held_calls``)
            err = d.CUresult(code)
        name_res = d.cuGetErrorName(err)
        text_res = d.cuGetErrorString(err)
        name = name_res[1].decode() if not name_res[0] else f"CUDA_ERROR_{code}"
        text = text_res[1].decode() if not text_res[0] else "unknown error"
    except Exception:  # the driver may be unusable when the error is reported
        name, text = f"CUDA_ERROR_{code}", "unknown error"
    message = f"{name}: {text}" + (f" (in {what})" if what else "")
    if name == "CUDA_ERROR_OUT_OF_MEMORY":
        cls: type[CudaError] = CudaOutOfMemoryError
    elif name in _STICKY:
        cls = CudaLaunchError
    else:
        cls = CudaError
    return cls(message, code=code, name=name, **context)


def check(result: Any, what: str = "", **context: Any) -> Any:
    """Unwrap a cuda-python result tuple.

    ``(err,)`` returns None, ``(err, x)`` returns ``x``, ``(err, x, y)`` returns ``(x, y)``.

    Args:
        result: What a ``cuda.bindings.driver`` function returned.
        what: The call's name, for the message.
        **context: Block/port/kernel context attached to the error.

    Raises:
        CudaError: The call failed (``CudaOutOfMemoryError`` / ``CudaLaunchError`` by kind).
    """
    err = result[0]
    if err:  # CUresult is an int enum; CUDA_SUCCESS == 0
        raise error_from_code(err, what, **context)
    n = len(result)
    if n == 1:
        return None
    if n == 2:
        return result[1]
    return result[1:]
