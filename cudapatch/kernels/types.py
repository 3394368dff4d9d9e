"""Element types shared by kernel descriptors, ports and buffers.

The names are the ones VL.CudaGraph sidecars use (``float``, ``uint``, ``float3`` ...), so a sidecar
``type`` string maps to a ``DType`` plus a pointer flag with ``parse_type_name``.
"""

from __future__ import annotations

import ctypes
from enum import Enum

import numpy as np

_CTYPES: dict[str, type] = {
    "float32": ctypes.c_float,
    "float64": ctypes.c_double,
    "int32": ctypes.c_int32,
    "uint32": ctypes.c_uint32,
    "int64": ctypes.c_int64,
    "uint64": ctypes.c_uint64,
    "uint8": ctypes.c_uint8,
}

__all__ = ["DType", "parse_type_name"]


class DType(Enum):
    """Element type of a buffer, port or scalar parameter.

    Each value is ``(c_name, numpy base type, lanes)``: ``float3`` is three float32 lanes, 12 bytes.
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
