"""Reading a DLPack tensor's address, shape and element type, for bindings that
``__cuda_array_interface__`` cannot carry.

PyTorch refuses ``__cuda_array_interface__`` for ``torch.bfloat16`` tensors (the interface has no
typestr for it), while DLPack has a bfloat16 type code. ``read_dlpack`` asks the producer for a
(legacy, unversioned) ``dltensor`` capsule and reads its ``DLTensor`` with ctypes: no consumer
library needed. The capsule is not consumed, so the producer's capsule destructor frees what it
allocated for it; the memory itself stays alive through the producer object, which the binding
keeps as its owner.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["DLPACK_CPU", "DLPACK_CUDA", "DLPACK_CUDA_HOST", "DlpackView", "dlpack_device", "read_dlpack"]

DLPACK_CPU, DLPACK_CUDA, DLPACK_CUDA_HOST, DLPACK_CUDA_MANAGED = 1, 2, 3, 13
_DEVICE_MEMORY = (DLPACK_CUDA, DLPACK_CUDA_MANAGED)  # kernels read these directly

_INT, _UINT, _FLOAT, _BFLOAT = 0, 1, 2, 4


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", _DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


# A prototype of our own: setting restype on ctypes.pythonapi's shared function object would change it
# for every other user in the process.
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


@dataclass(frozen=True)
class DlpackView:
    """What a DLPack tensor holds: ``ptr`` (data plus byte offset), ``shape``, ``strides`` in elements
    (None: C-contiguous), ``type_name`` (``bfloat16``, ``float32`` ...), ``numpy`` (the NumPy dtype of
    one value, None for bfloat16) and the DLPack ``device`` type (``DLPACK_CPU``, ``DLPACK_CUDA`` ...)."""

    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...] | None
    type_name: str
    numpy: np.dtype | None
    device: int

    @property
    def on_device(self) -> bool:
        """Whether kernels can read the memory (CUDA device or managed memory)."""
        return self.device in _DEVICE_MEMORY

    @property
    def contiguous(self) -> bool:
        """Whether the values are C-contiguous (axes of length 1 may have any stride)."""
        if self.strides is None:
            return True
        acc = 1
        for n, st in zip(reversed(self.shape), reversed(self.strides), strict=True):
            if n > 1 and st != acc:
                return False
            acc *= n
        return True


def dlpack_device(array: Any) -> int | None:
    """The DLPack device type of ``array`` (``__dlpack_device__()[0]``), or None when it has no DLPack
    export or the export refuses."""
    probe = getattr(array, "__dlpack_device__", None)
    if probe is None or not hasattr(array, "__dlpack__"):
        return None
    try:
        return int(probe()[0])
    except Exception:  # noqa: BLE001 - any refusal means: not a DLPack source
        return None


def _type_of(dt: _DLDataType) -> tuple[str, np.dtype | None]:
    if dt.lanes != 1:
        raise TypeError(f"DLPack vector lanes ({dt.lanes}) are not supported")
    if dt.code == _BFLOAT and dt.bits == 16:
        return "bfloat16", None
    kind = {_INT: "int", _UINT: "uint", _FLOAT: "float"}.get(dt.code)
    if kind is None:
        raise TypeError(f"DLPack type code {dt.code} ({dt.bits} bits) has no cudapatch element type")
    name = f"{kind}{dt.bits}"
    try:
        return name, np.dtype(name)
    except TypeError:
        raise TypeError(f"DLPack type {name} has no cudapatch element type") from None


def read_dlpack(array: Any, *, stream: int | None = None) -> DlpackView:
    """Export ``array`` through ``__dlpack__`` and read its address, shape and type.

    Args:
        array: A DLPack producer (a PyTorch tensor, a CuPy or NumPy array ...).
        stream: The consumer's CUDA stream handle for the producer to order its pending writes
            before (DLPack's ``stream`` argument; -1: no ordering). Ignored for host memory.

    Raises:
        TypeError: the export failed or holds a type with no element type here (bool, complex).
    """
    device = dlpack_device(array)
    kwargs = {"stream": stream} if stream is not None and device in _DEVICE_MEMORY else {}
    try:
        capsule = array.__dlpack__(**kwargs)
    except TypeError:
        if not kwargs:
            raise
        capsule = array.__dlpack__()  # an older producer without the stream argument
    try:
        address = _capsule_pointer(capsule, b"dltensor")
    except ValueError as exc:  # a used or versioned capsule
        raise TypeError(f"not a DLPack 'dltensor' capsule: {exc}") from None
    t = _DLManagedTensor.from_address(address).dl_tensor
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    strides = tuple(int(t.strides[i]) for i in range(t.ndim)) if t.strides else None
    name, np_dtype = _type_of(t.dtype)
    view = DlpackView(
        ptr=int(t.data or 0) + int(t.byte_offset),
        shape=shape,
        strides=strides,
        type_name=name,
        numpy=np_dtype,
        device=int(t.device.device_type),
    )
    del capsule  # not consumed: its destructor hands the DLManagedTensor back to the producer
    return view
