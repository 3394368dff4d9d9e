"""NumbaSource: a Python function compiled by Numba to PTX, then by nvJitLink to a cubin.

Each 1-D array argument expands to Numba's array ABI in the PTX (meminfo, parent, nitems,
itemsize, data, shape, strides: 7 slots of 8 bytes). The descriptor records that expansion as
ABI slots, so ports keep the user's parameter indices and binding a buffer fills every slot.

Arrays may hold numba-cuda's vector types (``"float32x4[:]"`` or ``"float4[:]"``: ``float4`` ports,
16-byte elements): the ABI is the same, with the vector's itemsize. By-value vectors are refused.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from math import prod
from typing import Any

from ..errors import KernelCompileError, KernelLoadError
from ._toolchain import link_ptx, toolchain_version
from .cache import cache_key
from .descriptor import NUMBA_ARRAY_ROLES, AbiSlot, KernelDescriptor, KernelParamDescriptor, check_launch_settings
from .ptx import check_signature, parse_ptx
from .source import KernelImage, KernelSource
from .types import DType

__all__ = ["NumbaSource"]

_SCALARS = {
    "float32": DType.FLOAT32,
    "float64": DType.FLOAT64,
    "int32": DType.INT32,
    "uint32": DType.UINT32,
    "int64": DType.INT64,
    "uint64": DType.UINT64,
    "uint8": DType.UINT8,
    "int8": DType.INT8,
    "int16": DType.INT16,
    "uint16": DType.UINT16,
    "float16": DType.FLOAT16,
}
#: Numba's CUDA vector types (``numba.cuda.float32x4`` ...) that have an element type here. Arrays of
#: them index to a vector value with ``.x .y .z .w`` (build one with ``cuda.float32x4(x, y, z, w)``).
_VECTORS = {
    "float32x2": DType.FLOAT2,
    "float32x3": DType.FLOAT3,
    "float32x4": DType.FLOAT4,
    "float64x2": DType.DOUBLE2,
    "int32x2": DType.INT2,
    "int32x4": DType.INT4,
    "uint32x4": DType.UINT4,
    "uint8x4": DType.UCHAR4,
}
_VECTOR_NAMES = {dtype: name for name, dtype in _VECTORS.items()}
# The CUDA C spellings Numba also accepts (``cuda.float4`` is ``cuda.float32x4``): float2 ... uchar4.
_VECTOR_ALIASES = {dtype.c_name: name for name, dtype in _VECTORS.items()}
_ARRAY_TEXT = re.compile(r"^\s*(\w+)\s*\[\s*:\s*(?:(?::\s*1)|)\s*\]\s*$")
_NUMBA_LOCATION = re.compile(r'File "([^"]+)", line (\d+)')


def _numba_vector_types() -> dict[str, Any] | None:
    """numba-cuda's vector types by name, or None where this Numba has no ``numba.cuda.vector_types``."""
    try:
        from numba.cuda.vector_types import vector_types
    except ImportError:
        return None
    return vector_types


def _parse_argtype(t: Any, where: str) -> tuple[DType, bool]:
    """``(dtype, is_array)`` of a Numba type or a string like ``"float32[:]"`` / ``"int32"`` /
    ``"float32x4[:]"`` (a vector type: also ``numba.cuda.float32x4`` or its alias ``float4``)."""
    if isinstance(t, str):
        m = _ARRAY_TEXT.match(t)
        base, is_array = (m.group(1), True) if m else (t.strip(), False)
    elif isinstance(t, type):  # a stub class such as numba.cuda.float32x4
        base, is_array = t.__name__, False
    else:
        ndim = getattr(t, "ndim", None)
        if ndim is not None:
            if ndim != 1:
                raise KernelLoadError(f"{where}: only 1-D arrays are supported, got {ndim}-D")
            base, is_array = str(t.dtype), True
        else:
            base, is_array = str(t), False
    base = _VECTOR_ALIASES.get(base, base)
    vector = _VECTORS.get(base)
    if vector is not None:
        if not is_array:
            raise KernelLoadError(
                f"{where}: a by-value {base} argument is not supported; pass a {base}[:] array "
                f"or its {vector.lanes} lanes as {vector.base.name} scalars"
            )
        if _numba_vector_types() is None:
            raise KernelLoadError(
                f"{where}: this Numba has no CUDA vector types ({base}); install numba-cuda, or pass the "
                f"array as {vector.base.name}[:] with {vector.lanes} values per element"
            )
        return vector, True
    dtype = _SCALARS.get(base)
    if dtype is None:
        hint = " (Numba has no bfloat16: pass the bits as uint16)" if "bfloat16" in base else ""
        raise KernelLoadError(
            f"{where}: unsupported type '{t}'{hint} (use {', '.join(_SCALARS)} or 1-D arrays of them, "
            f"or 1-D arrays of {', '.join(_VECTORS)})"
        )
    return dtype, is_array


def _fingerprint(code: Any) -> bytes:
    """A stable digest of a code object and the code objects nested in it (reprs hold addresses)."""
    h = hashlib.sha256()
    h.update(code.co_code)
    h.update(
        repr(
            (
                code.co_names,
                code.co_varnames,
                code.co_filename,
                code.co_qualname if hasattr(code, "co_qualname") else code.co_name,
            )
        ).encode()
    )
    for c in code.co_consts:
        h.update(_fingerprint(c) if hasattr(c, "co_code") else repr(c).encode())
    return h.digest()


@functools.lru_cache(maxsize=256)
def _describe_cached(source: NumbaSource) -> KernelDescriptor:
    return source._describe()


@dataclass(frozen=True)
class NumbaSource(KernelSource):
    """A Numba CUDA kernel given as a plain Python function and its argument types.

    Args:
        func: The kernel body (``numba.cuda.grid(1)`` and friends inside), not yet ``@cuda.jit``-ed.
        argtypes: One type per argument: Numba types or strings (``"float32[:]"``, ``"int32"``).
        outputs: Names of array arguments the kernel writes (the others are inputs).
        block_size: Threads per block for auto grids, or one number per axis (``(16, 16)``, x first)
            for 2-D and 3-D launches.
    """

    func: Callable[..., Any]
    argtypes: tuple[Any, ...]
    outputs: tuple[str, ...] = ()
    block_size: int | tuple[int, ...] = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "argtypes", tuple(self.argtypes))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        if isinstance(self.block_size, list):
            object.__setattr__(self, "block_size", tuple(self.block_size))

    @property
    def debug_name(self) -> str:
        return f"{getattr(self.func, '__qualname__', self.func)!s}"

    def _file(self) -> str:
        try:
            return inspect.getsourcefile(self.func) or self.debug_name
        except TypeError:
            return self.debug_name

    @property
    def portable(self) -> bool:
        """Importable by module and name (not defined in ``__main__`` or inside another function)."""
        module = getattr(self.func, "__module__", "") or ""
        qual = getattr(self.func, "__qualname__", "")
        return module not in ("__main__", "__mp_main__", "") and "<locals>" not in qual

    def describe(self) -> KernelDescriptor:
        return _describe_cached(self)

    def _describe(self) -> KernelDescriptor:
        try:
            names = list(inspect.signature(self.func).parameters)
        except (TypeError, ValueError) as exc:
            raise KernelLoadError(f"cannot read the signature of {self.debug_name}: {exc}") from None
        if len(names) != len(self.argtypes):
            raise KernelLoadError(
                f"{self.debug_name} takes {len(names)} arguments but {len(self.argtypes)} argtypes were given",
                file=self._file(),
            )
        unknown = set(self.outputs) - set(names)
        if unknown:
            raise KernelLoadError(f"outputs name unknown arguments: {', '.join(sorted(unknown))}", file=self._file())
        params, slots = [], []
        for i, (name, t) in enumerate(zip(names, self.argtypes, strict=True)):
            dtype, is_array = _parse_argtype(t, f"argument '{name}' of {self.debug_name}")
            direction = "out" if name in self.outputs else "in"
            if not is_array and direction == "out":
                raise KernelLoadError(f"argument '{name}' is a scalar and cannot be an output", file=self._file())
            params.append(KernelParamDescriptor(name=name, dtype=dtype, is_pointer=is_array, direction=direction))
            if is_array:
                slots.extend(AbiSlot(i, role, 8, 8) for role in NUMBA_ARRAY_ROLES)
            else:
                slots.append(AbiSlot(i, "value", dtype.itemsize, dtype.alignment))
        launch = check_launch_settings(self.block_size, 0)
        if launch is not None:
            raise KernelLoadError(f"{self.debug_name}: {launch[1]}", file=self._file())
        dims = tuple(self.block_size) if isinstance(self.block_size, tuple) else ()
        return KernelDescriptor(
            entry_point=getattr(self.func, "__name__", "kernel"),
            parameters=tuple(params),
            block_size=prod(dims) if dims else self.block_size,  # type: ignore[arg-type]
            block_dims=dims,
            abi=tuple(slots),
        )

    def _numba_types(self) -> tuple[Any, ...]:
        from numba import types

        out = []
        for p in self.describe().parameters:
            vector = _VECTOR_NAMES.get(p.dtype)
            if vector is not None:  # describe checked that this Numba has them
                t = _numba_vector_types()[vector]  # type: ignore[index]
            else:
                t = getattr(types, p.dtype.base.name)
            out.append(types.Array(t, 1, "C") if p.is_pointer else t)
        return tuple(out)

    def cache_key(self, arch: str) -> str:
        code = _fingerprint(self.func.__code__) if hasattr(self.func, "__code__") else repr(self.func).encode()
        import numba

        return cache_key(
            "numba",
            self.debug_name,
            code,
            repr(self.argtypes),
            repr(self.outputs),
            numba.__version__,
            arch,
            toolchain_version(),
        )

    def compile(self, arch: str) -> KernelImage:
        desc = self.describe()
        digits = arch.removeprefix("sm_").rstrip("a")
        cc = (int(digits[:-1]), int(digits[-1]))
        try:
            from numba import cuda
        except ImportError as exc:
            raise KernelCompileError(f"Numba is not installed ({exc}): pip install numba-cuda") from None
        try:
            ptx, _ = cuda.compile_ptx(self.func, self._numba_types(), device=False, cc=cc)
        except Exception as exc:  # numba raises TypingError, LoweringError, ...: all are compile errors here
            text = str(exc)
            loc = _NUMBA_LOCATION.findall(text)
            file, line = (loc[-1][0], int(loc[-1][1])) if loc else (self._file(), None)
            lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("Failed in")]
            first = lines[0] if lines else type(exc).__name__
            raise KernelCompileError(
                f"Numba cannot compile {self.debug_name}: {first}",
                log=text,
                file=file,
                line=line,
                kernel=desc.entry_point,
            ) from None
        info = parse_ptx(ptx, file=self.debug_name)
        if len(info.entries) != 1:
            raise KernelCompileError(f"expected one kernel in Numba's PTX, found {len(info.entries)}")
        symbol = next(iter(info.entries))
        from dataclasses import replace

        check_signature(info, replace(desc, entry_point=symbol), file=self.debug_name)
        cubin = link_ptx(ptx.encode(), name=self.debug_name, arch=arch, kernel=desc.entry_point)
        return KernelImage(desc, cubin, "cubin", hashlib.sha256(cubin).hexdigest(), self._file(), symbol=symbol)
