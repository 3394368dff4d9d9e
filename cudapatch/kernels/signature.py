"""Kernel descriptors read from CUDA C++ source: the ``__global__`` signature is the contract.

``const T*`` parameters are inputs, ``T*`` outputs, ``/*inout*/ T*`` both, by-value parameters are
inputs. ``// cudapatch: key=value`` comment lines set ``blockSize`` (threads, or per axis:
``16x16``, ``8x8x8``), ``sharedMemoryBytes`` and ``description``. Used for NVRTC sources, the custom
kernel block and the bundled-kernel build script.

The text comes from a user (a ``.cu`` file, a CustomKernel's Code field, edited on the frame
thread), so reading it is linear whatever it holds: comments are stripped in one pass, no pattern
can scan past a ``(`` or a line end, and the settings get the sidecar's checks (``blockSize`` in
1..1024, ``sharedMemoryBytes`` in 0..227 KiB, at most ``MAX_KERNEL_PARAMETERS`` parameters).
"""

from __future__ import annotations

import re
from functools import lru_cache
from math import prod

from ..errors import KernelCompileError
from ._text import MAX_KERNEL_PARAMETERS, LineIndex, short_repr, strip_c_comments
from .descriptor import (
    MAX_BLOCK_SIZE,
    MAX_SHARED_MEMORY_BYTES,
    KernelDescriptor,
    KernelParamDescriptor,
    check_launch_settings,
)
from .types import DType, parse_type_name

__all__ = ["describe_cuda_source", "find_entry_points"]

# [^()]* rather than [^)]*: a parameter list that never closes then ends at the next "(", so a text
# of many unclosed signatures is read once, not once per signature.
_SIG = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^()]*\)\s+)?void\s+([A-Za-z_]\w*)\s*\(([^()]*)\)")
# [ \t] rather than \s (which spans lines, quadratic on blank lines); the value is stripped in Python
# (a lazy ".*?" before "\s*$" is quadratic on a line of spaces).
_META = re.compile(r"^[ \t]*//[ \t]*cudapatch:[ \t]*(\w+)[ \t]*=([^\n]*)", re.MULTILINE)
_INT_SETTING = re.compile(r"[+-]?\d{1,9}")
_AXES_SETTING = re.compile(r"[+-]?\d{1,9}(?:[ \t]*[x,][ \t]*[+-]?\d{1,9}){1,2}")  # 16x16, 8,8,8
# The same shapes with any number of digits: a value of 10 or more digits is out of range, not "not an integer".
_LONG_SETTING = re.compile(r"[+-]?\d+(?:[ \t]*[x,][ \t]*[+-]?\d+){0,2}")
_SETTINGS = {"blockSize", "sharedMemoryBytes", "description"}
_MAX_DECL = 4096  # characters in one parameter declaration (a bound on any pattern's work)
# The type and the name are separated by a "*" or by spaces, never by nothing: a pattern where both
# can be empty tries every split of a long word (0.2 s for 4,000 letters, quadratic).
_PARAM = re.compile(
    r"(const\s+)?((?:unsigned\s+|signed\s+)?(?:long\s+long|[A-Za-z_]\w*))(?:\s*(\*)\s*|\s+)(?:const\s+)?"
    r"([A-Za-z_]\w*)"
)

_BARE_UNSIGNED = re.compile(r"\bunsigned\s+(?!(?:int|long|char|short)\b)")


def _strip_comments_keep_inout(text: str) -> tuple[str, int | None]:
    return strip_c_comments(text.replace("/*inout*/", " __cudapatch_inout__ "))


def find_entry_points(text: str) -> list[str]:
    """Names of the ``__global__`` functions in ``text`` (comments ignored)."""
    return [m.group(1) for m in _SIG.finditer(_strip_comments_keep_inout(text)[0])]


def _not_a_setting(key: str, value: str) -> str:
    """Why ``value`` (neither an integer of at most 9 digits nor ``blockSize`` axes) is no ``key`` setting."""
    if not _LONG_SETTING.fullmatch(value):
        return f"{key}={short_repr(value)} is not an integer"
    if key == "sharedMemoryBytes":
        allowed = f"0..{MAX_SHARED_MEMORY_BYTES} (227 KiB, the most a GPU grants a block)"
    else:
        allowed = f"1..{MAX_BLOCK_SIZE} threads"
    return f"{key}={short_repr(value)} is {'out of range' if '-' in value else 'too large'}: it must be in {allowed}"


def _settings(text: str, file: str) -> tuple[int | list[int], int, str]:
    """``blockSize``, ``sharedMemoryBytes`` and ``description`` from ``// cudapatch:`` lines, checked
    as a sidecar's are."""
    lines: LineIndex | None = None
    values: dict[str, tuple[str, int]] = {}
    for m in _META.finditer(text):
        values[m.group(1)] = (m.group(2).strip(), m.start())

    def fail(message: str, pos: int) -> KernelCompileError:
        nonlocal lines
        lines = lines or LineIndex(text)
        return KernelCompileError(f"bad '// cudapatch:' setting: {message}", file=file, line=lines.line(pos))

    for key, (_value, pos) in values.items():
        if key not in _SETTINGS:
            raise fail(f"unknown key '{key}' (use: {', '.join(sorted(_SETTINGS))})", pos)
    numbers: dict[str, int | list[int]] = {}
    for key, default in (("blockSize", 256), ("sharedMemoryBytes", 0)):
        value, pos = values.get(key, (str(default), 0))
        if key == "blockSize" and _AXES_SETTING.fullmatch(value):  # per axis, x first: 16x16 or 8,8,8
            numbers[key] = [int(v) for v in re.split(r"[x,]", value.replace(" ", "").replace("\t", ""))]
            continue
        if not _INT_SETTING.fullmatch(value):
            raise fail(_not_a_setting(key, value), pos)
        numbers[key] = int(value)
    launch = check_launch_settings(numbers["blockSize"], numbers["sharedMemoryBytes"])
    if launch is not None:
        raise fail(launch[1], values[launch[0]][1])
    return numbers["blockSize"], numbers["sharedMemoryBytes"], values.get("description", ("", 0))[0]  # type: ignore


@lru_cache(maxsize=64)  # an edit describes new code twice: to decide its tier, and to swap it
def describe_cuda_source(text: str, entry: str | None = None, *, file: str = "<source>") -> KernelDescriptor:
    """The descriptor of kernel ``entry`` (or the only kernel) in CUDA C++ ``text``.

    Raises:
        KernelCompileError: no such kernel, several kernels and no entry named, or a parameter whose
            type is not a cudapatch type (names the file and line).
    """
    clean, unclosed = _strip_comments_keep_inout(text)
    if unclosed is not None:
        raise KernelCompileError("a /* comment is never closed", file=file, line=LineIndex(text).line(unclosed))
    matches = list(_SIG.finditer(clean))
    if entry is None:
        if len(matches) != 1:
            names = ", ".join(m.group(1) for m in matches) or "none"
            raise KernelCompileError(
                f"name the entry point: found {len(matches)} __global__ kernels ({names})", file=file
            )
        m = matches[0]
    else:
        m = next((m for m in matches if m.group(1) == entry), None)
        if m is None:
            names = ", ".join(x.group(1) for x in matches) or "none"
            raise KernelCompileError(
                f"no __global__ kernel '{entry}' (kernels found: {names})", file=file, kernel=entry
            )
    name = m.group(1)
    line = LineIndex(clean).line(m.start())
    params = []
    body = m.group(2).replace("__restrict__", " ").strip()
    if body and body != "void":
        decls = body.split(",")
        if len(decls) > MAX_KERNEL_PARAMETERS:
            raise KernelCompileError(
                f"{len(decls)} parameters: a kernel may have at most {MAX_KERNEL_PARAMETERS}",
                file=file,
                line=line,
                kernel=name,
            )
        for raw in decls:
            inout = "__cudapatch_inout__" in raw
            decl = " ".join(raw.replace("__cudapatch_inout__", " ").split())
            decl = _BARE_UNSIGNED.sub("unsigned int ", decl)  # `unsigned n` means `unsigned int n`
            pm = _PARAM.fullmatch(decl) if len(decl) <= _MAX_DECL else None
            if pm is None:
                shown = decl if len(decl) <= 80 else decl[:70] + "…"
                raise KernelCompileError(f"cannot read parameter '{shown}'", file=file, line=line, kernel=name)
            const, ctype, star, pname = pm.groups()
            try:
                dtype, _ = parse_type_name(ctype)
            except KeyError:
                raise KernelCompileError(
                    f"parameter '{pname}' has type '{ctype}', which cudapatch cannot bind "
                    "(use float/double/half/int/uint/long/ulong/char/uchar/short/ushort, float2/3/4, int2/4, "
                    "uint4, uchar4, or pointers to them; __nv_bfloat16 pointers)",
                    file=file,
                    line=line,
                    kernel=name,
                ) from None
            is_ptr = bool(star)
            if dtype is DType.BFLOAT16 and not is_ptr:
                raise KernelCompileError(
                    f"parameter '{pname}': bfloat16 is a buffer type; pass a by-value scalar as float",
                    file=file,
                    line=line,
                    kernel=name,
                )
            direction = "in" if (not is_ptr or const) else ("inout" if inout else "out")
            params.append(KernelParamDescriptor(name=pname, dtype=dtype, is_pointer=is_ptr, direction=direction))
    block_size, shared, description = _settings(text, file)
    dims = tuple(block_size) if isinstance(block_size, list) else ()
    return KernelDescriptor(
        entry_point=name,
        parameters=tuple(params),
        block_size=prod(dims) if dims else block_size,  # type: ignore[arg-type]
        block_dims=dims,
        shared_memory_bytes=shared,
        description=description,
    )
