"""The cudapatch error hierarchy.

Every error can carry context: the block, port, parameter, kernel, file and line involved, so a
host can show it on the operator that caused it. ``str(error)`` always includes that context.
"""

from __future__ import annotations

__all__ = [
    "CudapatchError",
    "CudaUnavailableError",
    "CudaError",
    "CudaOutOfMemoryError",
    "CudaLaunchError",
    "KernelLoadError",
    "SidecarError",
    "PtxSignatureError",
    "KernelCompileError",
    "GraphCompileError",
    "ParameterError",
    "LinkError",
    "BindingError",
    "PluginError",
    "InteropError",
    "PatchFileError",
    "LibraryCallError",
]


class CudapatchError(Exception):
    """Base class of every error cudapatch raises.

    Args:
        message: What went wrong, in words a patcher understands.
        block: Name (or id) of the block involved, if any.
        port: Port name involved, if any.
        param: Parameter name involved, if any.
        kernel: Kernel entry point involved, if any.
        file: File involved (kernel, sidecar, patch), if any.
        line: 1-based line in ``file``, if known.
    """

    def __init__(
        self,
        message: str,
        *,
        block: str | None = None,
        port: str | None = None,
        param: str | None = None,
        kernel: str | None = None,
        file: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.block = block
        self.port = port
        self.param = param
        self.kernel = kernel
        self.file = str(file) if file is not None else None
        self.line = line

    def context(self) -> str:
        """The location part of the message: ``file:line: block 'X', port 'Y'``."""
        parts = []
        if self.block is not None:
            parts.append(f"block '{self.block}'")
        if self.port is not None:
            parts.append(f"port '{self.port}'")
        if self.param is not None:
            parts.append(f"parameter '{self.param}'")
        if self.kernel is not None:
            parts.append(f"kernel '{self.kernel}'")
        where = ", ".join(parts)
        if self.file is not None:
            loc = self.file if self.line is None else f"{self.file}:{self.line}"
            where = f"{loc}: {where}" if where else loc
        return where

    def __str__(self) -> str:
        where = self.context()
        return f"{where}: {self.message}" if where else self.message


class CudaUnavailableError(CudapatchError):
    """No usable CUDA: cuda-bindings missing, no driver, no device, or device ordinal out of range."""


class CudaError(CudapatchError):
    """A CUDA driver call failed. ``name`` is the driver's error name (``CUDA_ERROR_X``), ``code`` its value."""

    def __init__(self, message: str, *, code: int = -1, name: str = "CUDA_ERROR_UNKNOWN", **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.code = code
        self.name = name


class CudaOutOfMemoryError(CudaError):
    """CUDA_ERROR_OUT_OF_MEMORY."""


class CudaLaunchError(CudaError):
    """A sticky fault from a launch (illegal address, launch failure, ...): the context is unusable."""


class KernelLoadError(CudapatchError):
    """A kernel could not be loaded: missing file, unreadable module, entry point not found."""


class SidecarError(KernelLoadError):
    """A kernel's JSON sidecar is malformed or inconsistent (names file and line)."""


class PtxSignatureError(KernelLoadError):
    """The PTX ``.entry`` signature disagrees with the sidecar, or the PTX cannot be parsed."""


class KernelCompileError(KernelLoadError):
    """A kernel failed to compile; ``log`` holds the compiler's full log."""

    def __init__(self, message: str, *, log: str = "", **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.log = log


class GraphCompileError(CudapatchError):
    """The patch could not be compiled into a graph; ``diagnostics`` lists every problem found."""

    def __init__(self, message: str, diagnostics: tuple = (), **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.diagnostics = tuple(diagnostics)


class ParameterError(CudapatchError):
    """A parameter value of the wrong type or out of range; the old value stays."""


class LinkError(CudapatchError):
    """A link that cannot exist: unknown port, incompatible pins, a cycle, blocks of another engine."""


class BindingError(CudapatchError):
    """An external buffer bound to a port does not fit it (dtype, size, not device memory)."""


class PluginError(CudapatchError):
    """A plugin failed to load or register its block types."""


class InteropError(CudapatchError):
    """A GL context, window or shared GL/CUDA resource failed (no display, no GL, a missing
    extension, a GL object of the wrong format, mapping twice, use after close). The message names
    the resource."""


class PatchFileError(CudapatchError):
    """A patch file cannot be used: a TOML syntax error, an unknown key, operator or port. Carries
    ``file`` and ``line``."""


class LibraryCallError(CudapatchError):
    """A library call (cuBLAS, cuFFT, cuRAND, cuSOLVER, cuSPARSE) of a captured block failed: the
    library returned an error status (``status``: its name, ``CUBLAS_STATUS_INVALID_VALUE``), the
    capture holds nodes a child graph cannot (memory allocation), or the call raised. ``kernel``
    names the call."""

    def __init__(self, message: str, *, status: str | None = None, **context: object) -> None:
        super().__init__(message, **context)  # type: ignore[arg-type]
        self.status = status
