"""Element types shared by kernel descriptors, ports and buffers.

The names are the ones VL.CudaGraph sidecars use (``float``, ``uint``, ``float3`` ...), so a sidecar
``type`` string maps to a ``DType`` plus a pointer flag with ``parse_type_name``.
"""

from __future__ import annotations

import ctypes
from enum import Enum

import numpy as np


class c_half(ctypes.Structure):  # noqa: N801 - named like the ctypes types it sits beside
    """A float16 parameter slot: 16 bits, read and written as a Python float (``.value``)."""

    _fields_ = [("bits", ctypes.c_uint16)]

    @property
    def value(self) -> float:
        return float(np.array(self.bits, np.uint16).view(np.float16))

    @value.setter
    def value(self, v: float) -> None:
        self.bits = int(np.array(v, np.float16).view(np.uint16))


def bfloat16_bits(values: object) -> np.ndarray:
    """Float values as bfloat16 bit patterns (uint16), rounded to nearest even: what to upload to a
    ``bfloat16`` port from NumPy, which has no bfloat16 type."""
    f = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = f + (0x7FFF + ((f >> 16) & 1))
    return (rounded >> 16).astype(np.uint16)


def bfloat16_values(bits: object) -> np.ndarray:
    """bfloat16 bit patterns (uint16) as float32 values (exact)."""
    return (np.ascontiguousarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


_CTYPES: dict[str, type] = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "int32": ctypes.c_int32,
    "uint32": ctypes.c_uint32,
    "int64": ctypes.c_int64,
    "uint64": ctypes.c_uint64,
    "uint8": ctypes.c_uint8,
    "int8": ctypes.c_int8,
    "int16": ctypes.c_int16,
    "uint16": ctypes.c_uint16,
    "float16": c_half,
}

__all__ = ["DType", "bfloat16_bits", "bfloat16_values", "c_half", "cuda_spelling", "parse_type_name"]


class DType(Enum):
    """Element type of a buffer, port or scalar parameter.

    Each value is ``(c_name, numpy base type, lanes)``: ``float3`` is three float32 lanes, 12 bytes.
    ``bfloat16`` has no NumPy type: its lanes are stored, bound and read back as uint16 bit patterns
    (``bfloat16_bits`` / ``bfloat16_values`` convert; int16 arrays, e.g. a PyTorch bfloat16 tensor
    viewed as int16, bind too). It is a buffer type only: no by-value bfloat16 kernel parameters.
    """

    FLOAT32 = ("float", "float32", 1)
    FLOAT64 = ("double", "float64", 1)
    INT32 = ("int", "int32", 1)
    UINT32 = ("uint", "uint32", 1)
    INT64 = ("long", "int64", 1)
    UINT64 = ("ulong", "uint64", 1)
    UINT8 = ("uchar", "uint8", 1)
    FLOAT2 = ("float2", "float32", 2)
    FLOAT3 = ("float3", "float32", 3)
    FLOAT4 = ("float4", "float32", 4)
    DOUBLE2 = ("double2", "float64", 2)  # also a complex double (cuFFT Z2Z)
    INT2 = ("int2", "int32", 2)
    INT4 = ("int4", "int32", 4)
    UINT4 = ("uint4", "uint32", 4)
    INT8 = ("char", "int8", 1)
    INT16 = ("short", "int16", 1)
    UINT16 = ("ushort", "uint16", 1)
    FLOAT16 = ("half", "float16", 1)
    BFLOAT16 = ("bfloat16", "uint16", 1)  # after UINT16: from_numpy(uint16) is UINT16
    UCHAR4 = ("uchar4", "uint8", 4)

    # Members carry plain attributes, set once here: Enum properties cost ~1 µs per access, and a
    # Cold rebuild reads them thousands of times.
    def __init__(self, c_name: str, base: str, lanes: int) -> None:
        self.c_name: str = c_name  #: The C / sidecar spelling: ``float``, ``uint``, ``float4``.
        self.base: np.dtype = np.dtype(base)  #: NumPy dtype of one lane.
        self.lanes: int = lanes  #: Number of lanes (1 for scalars, 2-4 for vector types).
        self.itemsize: int = self.base.itemsize * lanes  #: Size of one element in bytes.
        # CUDA aligns float3 like float (4), float4 to 16, float2 to 8.
        self.alignment: int = self.base.itemsize if lanes == 3 else self.itemsize
        self.ctype: type = _CTYPES[base]  #: ctypes type of one lane.
        #: NumPy dtypes besides ``base`` that bind to this type (raw bits of bfloat16 as int16).
        self.also: tuple[np.dtype, ...] = (np.dtype("int16"),) if c_name == "bfloat16" else ()
        #: Whether the lanes are floating point (``base.kind`` says uint16 for bfloat16's bits).
        self.is_float: bool = self.base.kind == "f" or c_name == "bfloat16"

    def accepts(self, dtype: np.dtype) -> bool:
        """Whether an array of NumPy ``dtype`` binds to a port of this type (lane type match)."""
        return dtype == self.base or dtype in self.also

    @property
    def numpy(self) -> np.dtype:
        """NumPy dtype of one element (a subarray dtype for vector types)."""
        if self.lanes == 1:
            return self.base
        return np.dtype((self.base, (self.lanes,)))

    @classmethod
    def from_c_name(cls, name: str) -> DType:
        """Look up by C name, accepting common aliases (``unsigned int``, ``uint32``, ``float32`` ...).

        Raises:
            KeyError: unknown type name.
        """
        key = " ".join(name.strip().split())
        if key in _ALIASES:
            return _ALIASES[key]
        raise KeyError(key)

    @classmethod
    def from_numpy(cls, dtype: object) -> DType:
        """The scalar DType of a NumPy dtype (``float32`` → FLOAT32).

        Raises:
            KeyError: no matching DType.
        """
        dt = np.dtype(dtype)  # type: ignore[call-overload]
        for member in cls:
            if member.lanes == 1 and member.base == dt:
                return member
        raise KeyError(str(dt))


_ALIASES: dict[str, DType] = {m.c_name: m for m in DType}
_ALIASES.update(
    {
        "float32": DType.FLOAT32,
        "f32": DType.FLOAT32,
        "float64": DType.FLOAT64,
        "f64": DType.FLOAT64,
        "int32": DType.INT32,
        "int32_t": DType.INT32,
        "unsigned int": DType.UINT32,
        "unsigned": DType.UINT32,
        "uint32": DType.UINT32,
        "uint32_t": DType.UINT32,
        "long long": DType.INT64,
        "int64": DType.INT64,
        "int64_t": DType.INT64,
        "unsigned long long": DType.UINT64,
        "uint64": DType.UINT64,
        "uint64_t": DType.UINT64,
        "unsigned char": DType.UINT8,
        "uint8": DType.UINT8,
        "uint8_t": DType.UINT8,
        "byte": DType.UINT8,
        "uint4": DType.UINT4,
        "int8": DType.INT8,
        "int8_t": DType.INT8,
        "signed char": DType.INT8,
        "schar": DType.INT8,
        "int16": DType.INT16,
        "int16_t": DType.INT16,
        "short int": DType.INT16,
        "signed short": DType.INT16,
        "uint16": DType.UINT16,
        "uint16_t": DType.UINT16,
        "unsigned short": DType.UINT16,
        "unsigned short int": DType.UINT16,
        "float16": DType.FLOAT16,
        "f16": DType.FLOAT16,
        "__half": DType.FLOAT16,
        "bf16": DType.BFLOAT16,
        "__nv_bfloat16": DType.BFLOAT16,
        "nv_bfloat16": DType.BFLOAT16,
        "cufftComplex": DType.FLOAT2,
        "cuComplex": DType.FLOAT2,
        "cufftDoubleComplex": DType.DOUBLE2,
        "cuDoubleComplex": DType.DOUBLE2,
    }
)


def parse_type_name(text: str) -> tuple[DType, bool]:
    """Parse a sidecar type like ``float*``, ``const uint *``, ``float3`` into ``(dtype, is_pointer)``.

    Raises:
        KeyError: the element type is unknown.
    """
    t = text.strip()
    if t.startswith("const "):
        t = t[6:]
    is_pointer = t.endswith("*")
    if is_pointer:
        t = t[:-1].strip()
    return DType.from_c_name(t), is_pointer


# Spellings NVRTC knows for the types whose sidecar names are not C (uint, ushort, half ...), each
# one the signature parser reads back as the same DType, with the header it needs.
_CUDA_SPELLING: dict[DType, tuple[str, str]] = {
    DType.UINT32: ("unsigned int", ""),
    DType.INT64: ("long long", ""),
    DType.UINT64: ("unsigned long long", ""),
    DType.UINT8: ("unsigned char", ""),
    DType.INT8: ("signed char", ""),
    DType.UINT16: ("unsigned short", ""),
    DType.FLOAT16: ("__half", "#include <cuda_fp16.h>\n"),
    DType.BFLOAT16: ("__nv_bfloat16", "#include <cuda_bf16.h>\n"),
}


def cuda_spelling(dtype: DType) -> tuple[str, str]:
    """How generated CUDA C++ writes an element of ``dtype``: ``(type, header)``, e.g.
    ``("unsigned int", "")`` or ``("__half", "#include <cuda_fp16.h>\\n")``. Put ``header`` before
    the code; the kernel's parameters then parse back to ``dtype`` (``signature.py``)."""
    return _CUDA_SPELLING.get(dtype, (dtype.c_name, ""))
