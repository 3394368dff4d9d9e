"""Compilers behind the kernel sources: NVRTC (CUDA C++ → cubin, or PTX for the bundled kernels) and
nvJitLink (PTX → cubin).

Both come from CPU-installable wheels (``cuda-bindings[all]``), so kernels compile on machines
without a GPU. Failures raise ``KernelCompileError`` carrying the full log and, where the log
names one, the file and line of the first error.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from ..errors import KernelCompileError
from ._wheel_libs import load_compiler_libs

__all__ = ["nvrtc_compile", "nvrtc_ptx", "link_ptx", "linker_version", "toolchain_version", "first_error_location"]

_LOG_LOCATION = re.compile(r"^(?P<file>[^\n(]+?)\((?P<line>\d+)\): (?:catastrophic )?error", re.MULTILINE)


def first_error_location(log: str) -> tuple[str | None, int | None]:
    """``(file, line)`` of the first error in an NVRTC-style log (``k.cu(12): error: ...``)."""
    m = _LOG_LOCATION.search(log)
    return (m.group("file").strip(), int(m.group("line"))) if m else (None, None)


def _nvrtc() -> Any:
    load_compiler_libs()  # where pip --target put the wheels, pathfinder does not look
    from cuda.bindings import nvrtc

    return nvrtc


@functools.lru_cache(maxsize=1)
def toolchain_version() -> str:
    """The versions of NVRTC and nvJitLink, part of every cubin cache key."""
    nvrtc = _nvrtc()
    err, major, minor = nvrtc.nvrtcVersion()
    try:
        from cuda.bindings import nvjitlink

        jl = ".".join(str(x) for x in nvjitlink.version())
    except Exception:  # nvJitLink missing: PTX sources fail with a clear error at link time
        jl = "none"
    return f"nvrtc{major}.{minor}-nvjitlink{jl}-inc{':'.join(cuda_include_dirs())}"


@functools.lru_cache(maxsize=1)
def linker_version() -> str:
    """nvJitLink's version, "none" where it cannot be called: part of the cache key of a source whose
    image is its PTX linked to a cubin there and the PTX itself where nvJitLink is missing."""
    load_compiler_libs()
    try:
        from cuda.bindings import nvjitlink

        return ".".join(str(x) for x in nvjitlink.version())
    except Exception:  # not installed, or the module without its library
        return "none"


@functools.lru_cache(maxsize=1)
def cuda_include_dirs() -> tuple[str, ...]:
    """The CUDA headers (``cuda_fp16.h``, ``cuda_runtime.h`` ...) for NVRTC, found by cuda-pathfinder in
    the installed wheels or toolkit; empty when there are none (plain kernels need no headers)."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
    except Exception:  # pathfinder missing or nothing installed: kernels without includes still compile
        return ()
    return (str(found),) if found else ()


def _check_nvrtc(result: tuple, what: str, **context: Any) -> Any:
    nvrtc = _nvrtc()
    err = result[0]
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        msg = nvrtc.nvrtcGetErrorString(err)[1].decode()
        raise KernelCompileError(f"{what} failed: {msg}", **context)
    return result[1] if len(result) == 2 else result[1:]


def nvrtc_compile(
    text: str,
    *,
    name: str,
    entry: str,
    arch: str,
    options: tuple[str, ...] = (),
    minimal: bool = True,
) -> tuple[bytes, str, str]:
    """Compile CUDA C++ to a cubin for ``arch`` (``sm_90``).

    Args:
        text: The source.
        name: File name for messages (what the log's ``file(line)`` refer to).
        entry: The ``__global__`` function to export.
        arch: The device architecture.
        options: Further NVRTC options (``-I...``, ``-D...``, ``-std=c++17``).
        minimal: Try ``-minimal`` first (about 20 % faster for small kernels: no textures, surfaces
            or device-side runtime API); if that fails, compile again without it, so every kernel
            that compiles at all still does and errors come from the full compiler.

    Returns:
        ``(cubin, lowered entry-point name, log)``.

    Raises:
        KernelCompileError: the program does not compile (``.log`` holds the compiler's log,
            ``.file``/``.line`` the first error).
    """
    if minimal and "-minimal" not in options:
        try:
            return nvrtc_compile(text, name=name, entry=entry, arch=arch, options=(*options, "-minimal"), minimal=False)
        except KernelCompileError:
            pass
    nvrtc = _nvrtc()
    prog = _check_nvrtc(nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        _check_nvrtc(nvrtc.nvrtcAddNameExpression(prog, entry.encode()), "nvrtcAddNameExpression", kernel=entry)
        log = _compile(prog, name=name, arch=arch, options=options, kernel=entry)
        lowered = _check_nvrtc(nvrtc.nvrtcGetLoweredName(prog, entry.encode()), "nvrtcGetLoweredName")
        size = _check_nvrtc(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        cubin = bytes(size)
        _check_nvrtc(nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        return cubin, lowered.decode() if isinstance(lowered, bytes) else str(lowered), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def nvrtc_ptx(text: str, *, name: str, arch: str = "compute_75") -> bytes:
    """Compile CUDA C++ to PTX for the virtual architecture ``arch`` (every ``extern "C"`` kernel of
    ``text``; NVRTC optimizes as ``nvcc -O3`` does). ``tools/build_kernels.py`` makes the bundled
    kernels' PTX with it.

    Raises:
        KernelCompileError: the program does not compile (``.log``, ``.file``/``.line`` as for
            ``nvrtc_compile``).
    """
    nvrtc = _nvrtc()
    prog = _check_nvrtc(nvrtc.nvrtcCreateProgram(text.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        _compile(prog, name=name, arch=arch, options=(), kernel=None)
        size = _check_nvrtc(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = bytes(size)
        _check_nvrtc(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.rstrip(b"\0")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile(prog: Any, *, name: str, arch: str, options: tuple[str, ...], kernel: str | None) -> str:
    """Compile the NVRTC program ``prog``; its log (raises ``KernelCompileError`` with it on failure)."""
    nvrtc = _nvrtc()
    includes = [f"-I{d}" for d in cuda_include_dirs()]
    opts = [f"-arch={arch}".encode(), b"-std=c++17", *(o.encode() for o in (*options, *includes))]
    (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
    size = _check_nvrtc(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
    # bytes(size), never b" " * size: for an empty log (size 1) that is CPython's cached one-byte b" ",
    # and NVRTC's NUL written into it turned every later b" " of the process into b"\0" (seen on 3.12).
    buf = bytes(size)
    _check_nvrtc(nvrtc.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
    log = buf.rstrip(b"\0 ").decode(errors="replace")
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        file, line = first_error_location(log)
        first = next((ln for ln in log.splitlines() if "error" in ln), log.strip().splitlines()[0] if log else "")
        summary = re.split(r"\berror\s*:\s*", first, maxsplit=1)[-1].strip() or "see the log"
        raise KernelCompileError(
            f"CUDA C++ does not compile: {summary}",
            log=log,
            file=file or name,
            line=line,
            kernel=kernel,
        )
    return log


def link_ptx(ptx: bytes, *, name: str, arch: str, kernel: str | None = None) -> bytes:
    """Compile PTX to a cubin for ``arch`` with nvJitLink (so the driver never JITs, and PTX newer
    than the driver still loads).

    Raises:
        KernelCompileError: nvJitLink is missing or rejects the PTX (``.log`` holds its error log).
    """
    load_compiler_libs()
    try:
        from cuda.bindings import nvjitlink
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise KernelCompileError(f"nvJitLink is not installed: {exc}", file=name, kernel=kernel) from None
    data = ptx.rstrip(b"\0")
    try:
        handle = nvjitlink.create(1, [f"-arch={arch}"])
    except Exception as exc:  # the module imports without its library: the first call says so (a RuntimeError)
        raise KernelCompileError(f"nvJitLink is not available: {exc}", file=name, kernel=kernel) from None
    try:
        try:
            nvjitlink.add_data(handle, nvjitlink.InputType.PTX, data, len(data), name)
            nvjitlink.complete(handle)
        except Exception as exc:
            try:
                size = nvjitlink.get_error_log_size(handle)
                buf = bytearray(size)
                nvjitlink.get_error_log(handle, buf)
                log = bytes(buf).rstrip(b"\0").decode(errors="replace")
            except Exception:
                log = ""
            m = re.search(r"ptx input, line (\d+)", log)
            raise KernelCompileError(
                f"PTX does not compile for {arch}: {log.strip().splitlines()[0] if log.strip() else exc}",
                log=log,
                file=name,
                line=int(m.group(1)) if m else None,
                kernel=kernel,
            ) from None
        size = nvjitlink.get_linked_cubin_size(handle)
        out = bytearray(size)
        nvjitlink.get_linked_cubin(handle, out)
        return bytes(out)
    finally:
        nvjitlink.destroy(handle)
