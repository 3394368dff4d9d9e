"""Thin access to the CUDA driver through cuda-bindings.

cuda-bindings is imported lazily so that ``import cudapatch`` works on machines without it; the
first driver call happens when an Engine is created. ``check`` is the one place that turns the
``(CUresult, value...)`` tuples of cuda-python into values or ``CudaError``.
"""

from __future__ import annotations

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
                "cuda-bindings is not installed (pip install 'cuda-bindings>=13'); cudapatch needs it to reach the GPU"
            ) from exc
        _driver = mod
    return _driver


def error_from_code(err: Any, what: str = "", **context: Any) -> CudaError:
    """Build the ``CudaError`` subclass for a ``CUresult``, with the driver's name and text."""
    d = driver()
    code = int(err)
    try:
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
