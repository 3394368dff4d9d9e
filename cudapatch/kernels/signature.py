"""Kernel descriptors read from CUDA C++ source: the ``__global__`` signature is the contract.

``const T*`` parameters are inputs, ``T*`` outputs, ``/*inout*/ T*`` both, by-value parameters are
inputs. ``// cudapatch: key=value`` comment lines set ``blockSize``, ``sharedMemoryBytes`` and
``description``. Used for NVRTC sources, the custom kernel block and the bundled-kernel build script.
"""

from __future__ import annotations

import re
from functools import lru_cache

from ..errors import KernelCompileError
from .descriptor import KernelDescriptor, KernelParamDescriptor
from .types import parse_type_name

__all__ = ["describe_cuda_source", "find_entry_points"]

_SIG = re.compile(r"__global__\s+(?:__launch_bounds__\s*\([^)]*\)\s+)?void\s+([A-Za-z_]\w*)\s*\(([^)]*)\)", re.DOTALL)
_META = re.compile(r"^\s*//\s*cudapatch:\s*(\w+)\s*=\s*(.*?)\s*$", re.MULTILINE)
_PARAM = re.compile(
    r"(const\s+)?((?:unsigned\s+|signed\s+)?(?:long\s+long|[A-Za-z_]\w*))\s*(\*?)\s*(?:const\s+)?([A-Za-z_]\w*)"
)

_BARE_UNSIGNED = re.compile(r"\bunsigned\s+(?!(?:int|long|char|short)\b)")


def _strip_comments_keep_inout(text: str) -> str:
    text = text.replace("/*inout*/", " __cudapatch_inout__ ")
    text = re.sub(r"/\*.*?\*/", lambda m: " " + "\n" * m.group(0).count("\n"), text, flags=re.DOTALL)
    return re.sub(r"//[^\n]*", "", text)


def find_entry_points(text: str) -> list[str]:
    """Names of the ``__global__`` functions in ``text`` (comments ignored)."""
    return [m.group(1) for m in _SIG.finditer(_strip_comments_keep_inout(text))]


@lru_cache(maxsize=64)  # an edit describes new code twice: to decide its tier, and to swap it
def describe_cuda_source(text: str, entry: str | None = None, *, file: str = "<source>") -> KernelDescriptor:
    """The descriptor of kernel ``entry`` (or the only kernel) in CUDA C++ ``text``.

    Raises:
        KernelCompileError: no such kernel, several kernels and no entry named, or a parameter whose
            type is not a cudapatch type (names the file and line).
    """
    meta = {k: v for k, v in _META.findall(text)}
    clean = _strip_comments_keep_inout(text)
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
    line = clean.count("\n", 0, m.start()) + 1
    params = []
    body = m.group(2).replace("__restrict__", " ").strip()
    if body and body != "void":
        for raw in body.split(","):
            inout = "__cudapatch_inout__" in raw
            decl = " ".join(raw.replace("__cudapatch_inout__", " ").split())
            decl = _BARE_UNSIGNED.sub("unsigned int ", decl)  # `unsigned n` means `unsigned int n`
            pm = _PARAM.fullmatch(decl)
            if pm is None:
                raise KernelCompileError(f"cannot read parameter '{decl}'", file=file, line=line, kernel=name)
            const, ctype, star, pname = pm.groups()
            try:
                dtype, _ = parse_type_name(ctype)
            except KeyError:
                raise KernelCompileError(
                    f"parameter '{pname}' has type '{ctype}', which cudapatch cannot bind "
                    "(use float/double/int/uint/long/ulong/uchar or float2/3/4, int2/4, uint4, or pointers to them)",
                    file=file,
                    line=line,
                    kernel=name,
                ) from None
            is_ptr = bool(star)
            direction = "in" if (not is_ptr or const) else ("inout" if inout else "out")
            params.append(KernelParamDescriptor(name=pname, dtype=dtype, is_pointer=is_ptr, direction=direction))
    try:
        block_size = int(meta.get("blockSize", 256))
        shared = int(meta.get("sharedMemoryBytes", 0))
    except ValueError as exc:
        raise KernelCompileError(f"bad '// cudapatch:' setting: {exc}", file=file, kernel=name) from None
    return KernelDescriptor(
        entry_point=name,
        parameters=tuple(params),
        block_size=block_size,
        shared_memory_bytes=shared,
        description=meta.get("description", ""),
    )
